/*
 * bench_moe_cuda.c - the CUDA fused MoE (wna16_cuda_moe_run_device) on
 * real MoE layer shapes, against a device-to-device copy measured in the
 * same run.
 *
 * For every shape, activation dtype and token count: a layer in the
 * Marlin layout with random codes and scales (any bits are valid codes,
 * so the tensors are filled directly in the layout the spec declares,
 * without the reference encoder), with scales in the activations' dtype
 * (bf16 and fp16 rows); uniform random top-k routing over the model's
 * global experts (with expert parallelism, an expert map gives this rank
 * its local experts and drops the rest, as a real EP rank sees every token
 * of the batch). The runs rotate over enough device copies of the layer
 * that between two uses of the same copy the runs in between touch more
 * than twice the L2 cache (60 MB on an H200): every run reads its experts
 * from HBM, even the 19 MB of Qwen3-30B-A3B's eight experts at M = 1. The
 * copy count follows from the smallest number of bytes one run of the
 * token list touches (at least 2, at most MAX_COPIES and MAX_COPY_BYTES);
 * a row where the cap keeps it under 2x L2 says so. The runs rotating over
 * the copies are captured into one CUDA graph, as a serving system
 * replays a layer; the graph is replayed REPS times (CUDA events around
 * each replay) and the median time per run is reported.
 * Reported: microseconds per run, the bytes the run must read at least
 * (the weights, scales and zeros of the local experts that received
 * tokens, plus activations), the bytes the other runs touch between two
 * uses of the same copy ("reuse"), that as GB/s, the ratio to the D2D copy
 * bandwidth (read + write counted, as the copy moves 2x its size), and
 * TFLOP/s (2 * local routed rows * (H * 2I + I * H) per run). The first
 * run of every configuration reports the cold NVRTC compile time of each
 * kernel it needed (0 when the kernel cache had it); "out" is a hash of
 * the last run's output (the inputs are seeded: two source trees that
 * mean to give the same bits must print the same hash). A program, not a
 * test: without a GPU it says so and exits 0.
 *
 *   bench_moe_cuda [quick|all] [--model NAME] [--tokens 1,16,...]
 *                  [--dtype bf16|fp16|both] [--routing-out DIR]
 *                  [--specs a.json,b.json,...]
 *
 * default: the three layers, Mixtral-8x7B, Qwen3-30B-A3B and
 * DeepSeek-V3/EP8, int4; quick:
 * Mixtral at M = 1 and 16; all: every shape, 4 and 8 bit. --specs runs
 * every configuration once per backend spec file (each replaces the
 * built-in "marlin" spec in turn: a tiling table sweep, see
 * bench/tiling_sweep.py), reusing the layer's device tensors.
 * --routing-out DIR writes each shape's routing per M (DIR/MODEL_M.ids:
 * int32 top-k ids, M x top-k, little-endian; '/' in the model's name
 * becomes '-') so that bench_moe_torch.py --routing DIR runs the bf16
 * torch layer on exactly the same routing. --dtype (default both) picks
 * the activation dtypes.
 */
#define _POSIX_C_SOURCE 200809L
#include "wna16.h"
#include "bench/bench_cuda.h"
#include "runtime/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COPIES 32
#define MAX_COPY_BYTES ((size_t)48 << 30) /* all copies of one layer */
#define MAX_TOKENS 16
#define REPS 7

typedef struct shape {
    const char *model;
    int32_t E, H, I, topk;
    int32_t n_global; /* global experts routed over (0: E, no EP) */
    bool benched;     /* in the default run: the benchmark */
} shape_t;

/* Real layer shapes. DeepSeek-V3: the routed experts one GPU of 8-way
 * expert parallelism holds (256 / 8 = 32), top-8 over all 256. */
static const shape_t SHAPES[] = {
    {"Mixtral-8x7B", 8, 4096, 14336, 2, 0, true},
    {"Qwen3-30B-A3B", 128, 2048, 768, 8, 0, true},
    {"DeepSeek-V3/EP8", 32, 7168, 2048, 8, 256, true},
    {"DeepSeek-V2-Lite", 64, 2048, 1408, 6, 0, false},
    {"Qwen3-235B-A22B", 128, 4096, 1536, 8, 0, false},
};
static const int32_t TOKENS[] = {1, 16, 64, 256, 4096};

static wna16_error_t err;
static w16_cuda_t *cuda;

#define CHECK(call)                                                          \
    do {                                                                     \
        if ((call) != WNA16_OK) {                                            \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, err.message); \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* One layer's tensors on the device, n_copies times. */
typedef struct dev_layer {
    wna16_tensor_set_t *sets[MAX_COPIES];
    uint64_t bufs[MAX_COPIES][16];
    int n, n_copies;
    size_t per_expert_bytes; /* codes + scales + zeros, w13 and w2 */
    size_t total_bytes;      /* one copy */
} dev_layer_t;

/* The bytes of one copy of the layer (codes, scales, zeros of every
 * expert) in the Marlin layout with scales in dtype. */
static size_t layer_bytes(wna16_context_t *ctx, const wna16_spec_t *spec,
                          const shape_t *s, const wna16_quant_desc_t *q,
                          wna16_dtype_t dtype)
{
    wna16_tensor_decl_t d[WNA16_LAYER_MAX_TENSORS];
    size_t n = 0, one = 0;
    CHECK(wna16_repack_layer_shapes(ctx, spec, "L", s->E, s->H, s->I, q,
                                    dtype, dtype, d, &n, &err));
    for (size_t i = 0; i < n; i++)
        one += d[i].nbytes;
    return one;
}

/* One layer, `copies` times, scales (and the model) in dtype. */
static void make_layer(wna16_context_t *ctx, const wna16_spec_t *spec,
                       const shape_t *s, const wna16_quant_desc_t *q,
                       wna16_dtype_t dtype, int copies, dev_layer_t *L)
{
    wna16_tensor_decl_t d[WNA16_LAYER_MAX_TENSORS];
    size_t n = 0;
    memset(L, 0, sizeof *L);
    rng = 0x243F6A8885A308D3ull ^ (uint64_t)dtype ^ (uint64_t)s->H * 131u;
    CHECK(wna16_repack_layer_shapes(ctx, spec, "L", s->E, s->H, s->I, q,
                                    dtype, dtype, d, &n, &err));
    L->n_copies = copies;
    for (int c = 0; c < copies; c++)
        CHECK(wna16_tensor_set_create(ctx, &L->sets[c], &err));
    for (size_t i = 0; i < n; i++) {
        size_t bytes = d[i].nbytes;
        unsigned char *h = malloc(bytes ? bytes : 1);
        if (!h) {
            fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
            exit(1);
        }
        if (d[i].dtype == WNA16_DTYPE_BF16 || d[i].dtype == WNA16_DTYPE_F16) {
            uint16_t *v = (uint16_t *)h; /* scales ~ 2^-7 */
            for (size_t k = 0; k < bytes / 2; k++) {
                float f = (float)(64 + rnd() % 64) / 8192.0f;
                v[k] = d[i].dtype == WNA16_DTYPE_BF16 ? wna16_f32_to_bf16(f)
                                                      : wna16_f32_to_f16(f);
            }
        } else {
            uint32_t *v = (uint32_t *)h; /* codes: any bits */
            for (size_t k = 0; k < bytes / 4; k++)
                v[k] = rnd();
            for (size_t k = bytes / 4 * 4; k < bytes; k++)
                h[k] = (unsigned char)rnd();
        }
        L->total_bytes += bytes;
        for (int c = 0; c < copies; c++) {
            uint64_t p = 0;
            CHECK(w16_cuda_alloc(cuda, bytes, &p, &err));
            CHECK(w16_cuda_copy_h2d(cuda, p, h, bytes, &err));
            L->bufs[c][L->n] = p;
            wna16_tensor_t t = {.name = d[i].name, .dtype = d[i].dtype,
                                .ndim = d[i].ndim, .data = (void *)(uintptr_t)p,
                                .nbytes = bytes};
            memcpy(t.shape, d[i].shape, sizeof t.shape);
            CHECK(wna16_tensor_set_add_view(L->sets[c], &t, &err));
        }
        L->n++;
        free(h);
    }
    L->per_expert_bytes = L->total_bytes / (size_t)s->E;
}

static void free_layer(dev_layer_t *L)
{
    for (int c = 0; c < L->n_copies; c++) {
        for (int i = 0; i < L->n; i++)
            w16_cuda_free(cuda, L->bufs[c][i]);
        wna16_tensor_set_destroy(L->sets[c]);
    }
}

/* Uniform random top-k over n_global experts (distinct per token); the
 * local expert of global id g is g when g < E (this rank holds the first
 * E global experts; with uniform routing which E does not matter). */
typedef struct routing {
    int32_t *ids, *map;
    float *w;
    size_t local_slots, experts;
} routing_t;

static void make_routing(const shape_t *s, int32_t M, routing_t *r)
{
    /* the same routing for a shape and M whatever ran before (a sweep
     * compares specs on identical problems) */
    rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)M * 0x100000001B3ull) ^
          (uint64_t)s->H * 31u ^ (uint64_t)s->E;
    int32_t k = s->topk, ng = s->n_global ? s->n_global : s->E;
    size_t P = (size_t)M * k;
    r->ids = malloc(P * sizeof *r->ids);
    r->w = malloc(P * sizeof *r->w);
    r->map = malloc((size_t)ng * sizeof *r->map);
    char *hit = calloc((size_t)s->E, 1);
    for (int32_t g = 0; g < ng; g++)
        r->map[g] = g < s->E ? g : -1;
    r->local_slots = 0;
    for (int32_t m = 0; m < M; m++)
        for (int32_t j = 0; j < k; j++) {
            int32_t id;
            bool dup;
            do {
                id = (int32_t)(rnd() % (uint32_t)ng);
                dup = false;
                for (int32_t j2 = 0; j2 < j; j2++)
                    dup |= r->ids[(size_t)m * k + j2] == id;
            } while (dup);
            r->ids[(size_t)m * k + j] = id;
            r->w[(size_t)m * k + j] = 1.0f / (float)k;
            if (r->map[id] >= 0) {
                hit[r->map[id]] = 1;
                r->local_slots++;
            }
        }
    r->experts = 0;
    for (int32_t e = 0; e < s->E; e++)
        r->experts += hit[e];
    free(hit);
}

static void free_routing(routing_t *r)
{
    free(r->ids);
    free(r->w);
    free(r->map);
}

/* The bytes a run touches at least: the weights of the local experts
 * that received tokens, plus the activations in and out. */
static size_t run_bytes(const shape_t *s, const dev_layer_t *L,
                        const routing_t *R, int32_t M)
{
    return R->experts * L->per_expert_bytes + 2 * (size_t)M * s->H * 2;
}

static void bench_spec(wna16_context_t *ctx, const wna16_spec_t *spec,
                       const char *tag, const shape_t *s, int bits,
                       wna16_dtype_t dtype, const dev_layer_t *Lp,
                       double copy_bw, const int32_t *tokens,
                       const routing_t *routes, int n_tok)
{
    wna16_quant_desc_t q = {.bits = bits, .group_size = 128,
                            .model_dtype = dtype};
    dev_layer_t L = *Lp;
    int nc = L.n_copies;
    size_t l2 = w16_cuda_l2_bytes(cuda);
    wna16_cuda_moe_t *moe[MAX_COPIES];
    for (int c = 0; c < nc; c++)
        CHECK(wna16_cuda_moe_create(ctx, spec, L.sets[c], "L", s->E, s->H,
                                    s->I, &q, true, &moe[c], &err));
    w16_cuda_stream_t *st;
    CHECK(w16_cuda_stream_create_async(cuda, &st, &err));
    w16_cuda_event_t *e0, *e1;
    CHECK(w16_cuda_event_create(cuda, &e0, &err));
    CHECK(w16_cuda_event_create(cuda, &e1, &err));
    /* runs per graph: every copy, at least 8 runs */
    int runs = (8 + nc - 1) / nc * nc;
    for (int ti = 0; ti < n_tok; ti++) {
        int32_t M = tokens[ti], k = s->topk;
        size_t P = (size_t)M * k;
        const routing_t *rp = &routes[ti];
        wna16_moe_params_t p;
        wna16_moe_params_init(&p);
        p.act_dtype = dtype;
        if (s->n_global) {
            p.expert_map = rp->map;
            p.global_num_experts = s->n_global;
        }
        rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)M * 0x9E37u;
        uint16_t *x = malloc((size_t)M * s->H * 2);
        for (size_t i = 0; i < (size_t)M * s->H; i++) {
            float f = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
            x[i] = dtype == WNA16_DTYPE_BF16 ? wna16_f32_to_bf16(f)
                                             : wna16_f32_to_f16(f);
        }
        size_t bytes = run_bytes(s, &L, rp, M);
        /* what the other runs touch between two uses of one copy */
        size_t reuse = (size_t)(nc - 1) * bytes;
        double flops = 2.0 * (double)rp->local_slots *
                       (3.0 * (double)s->H * (double)s->I);
        uint64_t d = 0;
        size_t nx = (size_t)M * s->H * 2;
        CHECK(w16_cuda_alloc(cuda, 2 * nx + 8 * P + 256, &d, &err));
        uint64_t dx = d, dout = d + nx, dids = d + 2 * nx, dw = dids + 4 * P;
        CHECK(w16_cuda_copy_h2d(cuda, dx, x, nx, &err));
        CHECK(w16_cuda_copy_h2d(cuda, dids, rp->ids, 4 * P, &err));
        CHECK(w16_cuda_copy_h2d(cuda, dw, rp->w, 4 * P, &err));
        /* the first run compiles (or loads from the cache); one run of
         * every copy then sizes each workspace before the capture */
        wna16_cuda_moe_report_t rep;
        for (int c = 0; c < nc; c++) {
            CHECK(wna16_cuda_moe_run_device(moe[c], &p, dx, M, dids, dw, k,
                                            dout, st, &err));
            CHECK(wna16_cuda_moe_sync(moe[c], st, &err));
            if (c == 0)
                wna16_cuda_moe_last_report(moe[0], &rep);
        }
        w16_cuda_graph_t *graph;
        CHECK(w16_cuda_capture_begin(cuda, st, &err));
        for (int r = 0; r < runs; r++)
            CHECK(wna16_cuda_moe_run_device(moe[r % nc], &p, dx, M, dids, dw,
                                            k, dout, st, &err));
        CHECK(w16_cuda_capture_end(cuda, st, &graph, &err));
        CHECK(w16_cuda_graph_launch(cuda, graph, st, &err)); /* warm */
        float t[REPS];
        for (int r = 0; r < REPS; r++) {
            CHECK(w16_cuda_event_record(cuda, e0, st, &err));
            CHECK(w16_cuda_graph_launch(cuda, graph, st, &err));
            CHECK(w16_cuda_event_record(cuda, e1, st, &err));
            CHECK(w16_cuda_event_sync(cuda, e1, &err));
            CHECK(w16_cuda_event_elapsed_ms(cuda, e0, e1, &t[r], &err));
            t[r] /= (float)runs;
        }
        for (int c = 0; c < nc; c++)
            CHECK(wna16_cuda_moe_sync(moe[c], st, &err));
        w16_cuda_graph_destroy(cuda, graph);
        /* the last run's output, hashed: two trees' lines with the same
         * tiling must show the same hash (bench/ab.sh: a change that is
         * meant to keep the results bit for bit) */
        unsigned char *o = malloc(nx);
        CHECK(w16_cuda_copy_d2h(cuda, o, dout, nx, &err));
        uint64_t hash = 0xcbf29ce484222325ull; /* FNV-1a */
        for (size_t i = 0; i < nx; i++)
            hash = (hash ^ o[i]) * 0x100000001b3ull;
        free(o);
        qsort(t, REPS, sizeof *t, cmp_f);
        double us = t[REPS / 2] * 1e3, gbs = (double)bytes / (us * 1e-6) / 1e9;
        if (*tag)
            printf("[%s] ", tag);
        printf("%-16s b%d %s %5d tok %6zu rows %3zu/%-3d exp %9.1f us %7.1f MB "
               "reuse %5.0f MB%s %7.1f GB/s %5.1f%% copy %6.1f TFLOP/s  bm %2d "
               "split %d/%d  compile %.0f+%.0f+%.0f ms  %s | %s  out %016llx\n",
               s->model, bits, dtype == WNA16_DTYPE_BF16 ? "bf16" : "fp16", M,
               rp->local_slots, rp->experts, s->E, us, (double)bytes / 1e6,
               (double)reuse / 1e6, reuse > 2 * l2 ? "" : " (<2xL2!)", gbs,
               100.0 * gbs / copy_bw, flops / (us * 1e-6) / 1e12, rep.block_m,
               rep.split_k[0], rep.split_k[1], rep.compile_ms[0],
               rep.compile_ms[1], rep.compile_ms[2], rep.tile_rule[0],
               rep.tile_rule[1], (unsigned long long)hash);
        fflush(stdout);
        w16_cuda_free(cuda, d);
        free(x);
    }
    w16_cuda_event_destroy(cuda, e0);
    w16_cuda_event_destroy(cuda, e1);
    w16_cuda_stream_destroy(cuda, st);
    for (int c = 0; c < nc; c++)
        wna16_cuda_moe_destroy(moe[c]);
}

/* Writes routing R of shape s at M for bench_moe_torch.py --routing. */
static void write_routing(const char *dir, const shape_t *s, int32_t M,
                          const routing_t *R)
{
    char path[1024], model[64];
    snprintf(model, sizeof model, "%s", s->model);
    for (char *c = model; *c; c++)
        if (*c == '/')
            *c = '-';
    snprintf(path, sizeof path, "%s/%s_%d.ids", dir, model, (int)M);
    FILE *f = fopen(path, "wb");
    size_t n = (size_t)M * (size_t)s->topk;
    if (!f || fwrite(R->ids, sizeof *R->ids, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "bench_moe_cuda: cannot write %s\n", path);
        exit(1);
    }
}

/* One shape: the routing of every M, then per activation dtype its layer
 * (enough copies that the runs between two uses of one copy touch more
 * than 2x the L2), then every spec (none given: the built-in one). */
static void bench_shape(wna16_context_t *ctx, const shape_t *s, int bits,
                        double copy_bw, const int32_t *tokens, int n_tok,
                        const wna16_dtype_t *dtypes, int n_dtypes,
                        const char *routing_dir, char **specs, int n_specs)
{
    const wna16_spec_t *spec = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                               "marlin");
    routing_t R[MAX_TOKENS];
    for (int ti = 0; ti < n_tok; ti++) {
        make_routing(s, tokens[ti], &R[ti]);
        if (routing_dir)
            write_routing(routing_dir, s, tokens[ti], &R[ti]);
    }
    size_t l2 = w16_cuda_l2_bytes(cuda);
    for (int di = 0; di < n_dtypes; di++) {
        wna16_quant_desc_t q = {.bits = bits, .group_size = 128,
                                .model_dtype = dtypes[di]};
        size_t one = layer_bytes(ctx, spec, s, &q, dtypes[di]);
        dev_layer_t probe = {.per_expert_bytes = one / (size_t)s->E};
        /* copies: 1 + 2 L2 / (bytes of the lightest run), capped */
        int copies = 2;
        for (int ti = 0; ti < n_tok; ti++) {
            size_t b = run_bytes(s, &probe, &R[ti], tokens[ti]);
            int c = 2 + (int)(2 * l2 / (b ? b : 1));
            copies = c > copies ? c : copies;
        }
        int cap = (int)(MAX_COPY_BYTES / (one ? one : 1));
        cap = cap > MAX_COPIES ? MAX_COPIES : cap < 2 ? 2 : cap;
        copies = copies > cap ? cap : copies;
        dev_layer_t L;
        make_layer(ctx, spec, s, &q, dtypes[di], copies, &L);
        if (n_specs == 0)
            bench_spec(ctx, spec, "", s, bits, dtypes[di], &L, copy_bw,
                       tokens, R, n_tok);
        for (int i = 0; i < n_specs; i++) {
            const wna16_spec_t *v = NULL;
            CHECK(wna16_spec_load_file(ctx, specs[i], &v, &err));
            const char *tag = strrchr(specs[i], '/');
            bench_spec(ctx, v, tag ? tag + 1 : specs[i], s, bits, dtypes[di],
                       &L, copy_bw, tokens, R, n_tok);
        }
        free_layer(&L);
    }
    for (int ti = 0; ti < n_tok; ti++)
        free_routing(&R[ti]);
}

/* Splits a comma-separated list in place. */
static int split_list(char *text, char **items, int max)
{
    int n = 0;
    for (char *t = strtok(text, ","); t && n < max; t = strtok(NULL, ","))
        items[n++] = t;
    return n;
}

int main(int argc, char **argv)
{
    bool quick = false, all = false;
    const char *model = NULL;
    int32_t tokens[MAX_TOKENS];
    wna16_dtype_t dtypes[2] = {WNA16_DTYPE_BF16, WNA16_DTYPE_F16};
    int n_dtypes = 2;
    const char *routing_dir = NULL;
    int n_tok = (int)(sizeof TOKENS / sizeof TOKENS[0]);
    memcpy(tokens, TOKENS, sizeof TOKENS);
    char *specs[64];
    int n_specs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "quick") == 0) {
            quick = true;
            n_tok = 2;
        } else if (strcmp(argv[i], "all") == 0) {
            all = true;
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            char *items[MAX_TOKENS];
            n_tok = split_list(argv[++i], items, MAX_TOKENS);
            for (int k = 0; k < n_tok; k++)
                tokens[k] = (int32_t)atoi(items[k]);
        } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "bf16") == 0 || strcmp(v, "fp16") == 0) {
                dtypes[0] = v[0] == 'b' ? WNA16_DTYPE_BF16 : WNA16_DTYPE_F16;
                n_dtypes = 1;
            } else if (strcmp(v, "both") != 0) {
                fprintf(stderr, "bench_moe_cuda: --dtype takes bf16, fp16 "
                        "or both, not '%s'\n", v);
                return 2;
            }
        } else if (strcmp(argv[i], "--routing-out") == 0 && i + 1 < argc) {
            routing_dir = argv[++i];
        } else if (strcmp(argv[i], "--specs") == 0 && i + 1 < argc) {
            n_specs = split_list(argv[++i], specs, 64);
        } else {
            fprintf(stderr, "usage: bench_moe_cuda [quick|all] [--model NAME] "
                    "[--tokens 1,16,...] [--dtype bf16|fp16|both] "
                    "[--routing-out DIR] [--specs a.json,...]\n");
            return 2;
        }
    }
    wna16_context_t *ctx;
    int status;
    if (!bench_open_cuda("bench_moe_cuda", &ctx, &cuda, &status))
        return status;
    double bw = 0.0;
    CHECK(bench_copy_gbs(cuda, &bw, &err));
    printf("%s, sm_%d%d, %d SMs, %s, %s; D2D copy %.0f GB/s (read + write)\n",
           w16_cuda_device_name(cuda), w16_cuda_cc_major(cuda),
           w16_cuda_cc_minor(cuda), w16_cuda_sm_count(cuda),
           w16_cuda_driver_version(cuda), w16_nvrtc_version(), bw);
    printf("L2 %.1f MB; group size 128, uniform random top-k routing "
           "(EP: expert map), weight copies rotated so that > 2x L2 is "
           "touched between two uses of a copy (\"reuse\"), CUDA graph of "
           ">= 8 runs, median of %d replays\n",
           (double)w16_cuda_l2_bytes(cuda) / 1e6, REPS);
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        if (model ? strcmp(model, SHAPES[i].model) != 0
                  : (quick && i > 0) || (!all && !SHAPES[i].benched))
            continue;
        for (int bits = 4; bits <= (all ? 8 : 4); bits += 4)
            bench_shape(ctx, &SHAPES[i], bits, bw, tokens, n_tok, dtypes,
                        n_dtypes, routing_dir, specs, n_specs);
    }
    wna16_context_destroy(ctx);
    return 0;
}
