/*
 * bench_moe_cuda.c - the CUDA fused MoE (wna16_cuda_moe_run_device) on
 * real MoE layer shapes, against a device-to-device copy measured in the
 * same run.
 *
 * For every shape and token count: a layer in the Marlin layout with
 * random codes and scales (any bits are valid codes, so the tensors are
 * filled directly in the layout the spec declares, without the reference
 * encoder), COPIES device copies of it (wrapping device tensors) so that
 * consecutive runs read different weights and the L2 cache (60 MB on an
 * H200) does not flatter small decodes, uniform random top-k routing, and
 * REPS timed runs rotating over the copies (CUDA events around each run,
 * the median kept). Reported: microseconds per run, the bytes the run
 * must read at least (the weights, scales and zeros of the experts that
 * received tokens, plus activations), that as GB/s, and the ratio to the
 * D2D copy bandwidth (read + write counted, as the copy moves 2x its
 * size). The first run of every configuration reports the cold NVRTC
 * compile time of each kernel it needed (0 when the kernel cache had it).
 * A program, not a test: without a GPU it says so and exits 0.
 *
 *   bench_moe_cuda [quick]     (quick: the first shape, two token counts)
 */
#define _POSIX_C_SOURCE 200809L
#include "wna16.h"
#include "runtime/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COPIES 4
#define REPS 21

typedef struct shape {
    const char *model;
    int32_t E, H, I, topk;
} shape_t;

/* Real layer shapes (per tensor-parallel rank of 1). */
static const shape_t SHAPES[] = {
    {"Qwen3-30B-A3B", 128, 2048, 768, 8},
    {"DeepSeek-V2-Lite", 64, 2048, 1408, 6},
    {"Mixtral-8x7B", 8, 4096, 14336, 2},
    {"Qwen3-235B-A22B", 128, 4096, 1536, 8},
};
static const int32_t TOKENS[] = {1, 4, 16, 64, 256, 1024, 4096};

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

/* One layer's tensors on the device, COPIES times. */
typedef struct dev_layer {
    wna16_tensor_set_t *sets[COPIES];
    uint64_t bufs[COPIES][16];
    int n;
    size_t per_expert_bytes; /* codes + scales + zeros, w13 and w2 */
    size_t total_bytes;
} dev_layer_t;

static void make_layer(wna16_context_t *ctx, const wna16_spec_t *spec,
                       const shape_t *s, const wna16_quant_desc_t *q,
                       dev_layer_t *L)
{
    wna16_tensor_decl_t d[WNA16_LAYER_MAX_TENSORS];
    size_t n = 0;
    memset(L, 0, sizeof *L);
    CHECK(wna16_repack_layer_shapes(ctx, spec, "L", s->E, s->H, s->I, q,
                                    WNA16_DTYPE_BF16, WNA16_DTYPE_BF16, d, &n,
                                    &err));
    for (int c = 0; c < COPIES; c++)
        CHECK(wna16_tensor_set_create(ctx, &L->sets[c], &err));
    for (size_t i = 0; i < n; i++) {
        size_t bytes = d[i].nbytes;
        unsigned char *h = malloc(bytes ? bytes : 1);
        if (!h) {
            fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
            exit(1);
        }
        if (d[i].dtype == WNA16_DTYPE_BF16) { /* scales ~ 2^-7 */
            uint16_t *v = (uint16_t *)h;
            for (size_t k = 0; k < bytes / 2; k++)
                v[k] = wna16_f32_to_bf16((float)(64 + rnd() % 64) / 8192.0f);
        } else {
            for (size_t k = 0; k < bytes; k++)
                h[k] = (unsigned char)rnd();
        }
        L->total_bytes += bytes;
        for (int c = 0; c < COPIES; c++) {
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
    for (int c = 0; c < COPIES; c++) {
        for (int i = 0; i < L->n; i++)
            w16_cuda_free(cuda, L->bufs[c][i]);
        wna16_tensor_set_destroy(L->sets[c]);
    }
}

/* Device-to-device copy bandwidth (read + write), GB/s. */
static double copy_gbs(void)
{
    size_t bytes = (size_t)1 << 30;
    uint64_t a = 0, b = 0;
    w16_cuda_event_t *e0, *e1;
    CHECK(w16_cuda_alloc(cuda, bytes, &a, &err));
    CHECK(w16_cuda_alloc(cuda, bytes, &b, &err));
    CHECK(w16_cuda_event_create(cuda, &e0, &err));
    CHECK(w16_cuda_event_create(cuda, &e1, &err));
    float t[5];
    for (int r = 0; r < 5; r++) {
        CHECK(w16_cuda_event_record(cuda, e0, NULL, &err));
        CHECK(w16_cuda_copy_d2d(cuda, b, a, bytes, &err));
        CHECK(w16_cuda_event_record(cuda, e1, NULL, &err));
        CHECK(w16_cuda_event_sync(cuda, e1, &err));
        CHECK(w16_cuda_event_elapsed_ms(cuda, e0, e1, &t[r], &err));
    }
    qsort(t, 5, sizeof *t, cmp_f);
    w16_cuda_event_destroy(cuda, e0);
    w16_cuda_event_destroy(cuda, e1);
    w16_cuda_free(cuda, a);
    w16_cuda_free(cuda, b);
    return 2.0 * (double)bytes / (t[2] * 1e-3) / 1e9;
}

static void bench_shape(wna16_context_t *ctx, const wna16_spec_t *spec,
                        const shape_t *s, int bits, double copy_bw, int n_tok)
{
    wna16_quant_desc_t q = {.bits = bits, .group_size = 128};
    dev_layer_t L;
    make_layer(ctx, spec, s, &q, &L);
    wna16_cuda_moe_t *moe[COPIES];
    for (int c = 0; c < COPIES; c++)
        CHECK(wna16_cuda_moe_create(ctx, spec, L.sets[c], "L", s->E, s->H,
                                    s->I, &q, true, &moe[c], &err));
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = WNA16_DTYPE_BF16;
    w16_cuda_event_t *e0, *e1;
    CHECK(w16_cuda_event_create(cuda, &e0, &err));
    CHECK(w16_cuda_event_create(cuda, &e1, &err));
    for (int ti = 0; ti < n_tok; ti++) {
        int32_t M = TOKENS[ti], k = s->topk;
        size_t P = (size_t)M * k;
        int32_t *ids = malloc(P * sizeof *ids);
        float *w = malloc(P * sizeof *w);
        uint16_t *x = malloc((size_t)M * s->H * 2);
        char *hit = calloc((size_t)s->E, 1);
        for (int32_t m = 0; m < M; m++)
            for (int32_t j = 0; j < k; j++) {
                int32_t id;
                bool dup;
                do {
                    id = (int32_t)(rnd() % (uint32_t)s->E);
                    dup = false;
                    for (int32_t j2 = 0; j2 < j; j2++)
                        dup |= ids[(size_t)m * k + j2] == id;
                } while (dup);
                ids[(size_t)m * k + j] = id;
                w[(size_t)m * k + j] = 1.0f / (float)k;
                hit[id] = 1;
            }
        for (size_t i = 0; i < (size_t)M * s->H; i++)
            x[i] = wna16_f32_to_bf16((float)((int)(rnd() % 2001) - 1000) / 1000.0f);
        size_t experts = 0;
        for (int32_t e = 0; e < s->E; e++)
            experts += hit[e];
        size_t bytes = experts * L.per_expert_bytes + 2 * (size_t)M * s->H * 2;
        uint64_t d = 0;
        size_t nx = (size_t)M * s->H * 2;
        CHECK(w16_cuda_alloc(cuda, 2 * nx + 8 * P + 256, &d, &err));
        uint64_t dx = d, dout = d + nx, dids = d + 2 * nx, dw = dids + 4 * P;
        CHECK(w16_cuda_copy_h2d(cuda, dx, x, nx, &err));
        CHECK(w16_cuda_copy_h2d(cuda, dids, ids, 4 * P, &err));
        CHECK(w16_cuda_copy_h2d(cuda, dw, w, 4 * P, &err));
        /* the first run compiles (or loads from the cache) */
        CHECK(wna16_cuda_moe_run_device(moe[0], &p, dx, M, dids, dw, k, dout,
                                        NULL, &err));
        CHECK(wna16_cuda_moe_sync(moe[0], NULL, &err));
        wna16_cuda_moe_report_t rep;
        wna16_cuda_moe_last_report(moe[0], &rep);
        float t[REPS];
        for (int r = 0; r < REPS + COPIES; r++) {
            wna16_cuda_moe_t *mo = moe[r % COPIES];
            float ms = 0;
            CHECK(w16_cuda_event_record(cuda, e0, NULL, &err));
            CHECK(wna16_cuda_moe_run_device(mo, &p, dx, M, dids, dw, k, dout,
                                            NULL, &err));
            CHECK(w16_cuda_event_record(cuda, e1, NULL, &err));
            CHECK(w16_cuda_event_sync(cuda, e1, &err));
            CHECK(w16_cuda_event_elapsed_ms(cuda, e0, e1, &ms, &err));
            if (r >= COPIES) /* the first round warms every copy */
                t[r - COPIES] = ms;
        }
        for (int c = 0; c < COPIES; c++)
            CHECK(wna16_cuda_moe_sync(moe[c], NULL, &err));
        qsort(t, REPS, sizeof *t, cmp_f);
        double us = t[REPS / 2] * 1e3, gbs = (double)bytes / (us * 1e-6) / 1e9;
        printf("%-17s b%d %5d tok  %4zu/%-3d experts  %9.1f us  %7.1f MB  "
               "%7.1f GB/s  %5.1f%% of copy  bm %2d  compile %.0f+%.0f+%.0f ms"
               "  %s | %s\n",
               s->model, bits, M, experts, s->E, us, (double)bytes / 1e6, gbs,
               100.0 * gbs / copy_bw, rep.block_m, rep.compile_ms[0],
               rep.compile_ms[1], rep.compile_ms[2], rep.tile_rule[0],
               rep.tile_rule[1]);
        fflush(stdout);
        w16_cuda_free(cuda, d);
        free(ids);
        free(w);
        free(x);
        free(hit);
    }
    w16_cuda_event_destroy(cuda, e0);
    w16_cuda_event_destroy(cuda, e1);
    for (int c = 0; c < COPIES; c++)
        wna16_cuda_moe_destroy(moe[c]);
    free_layer(&L);
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    wna16_context_t *ctx;
    if (wna16_context_create(NULL, &ctx, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    if (w16_cuda_get(ctx, &cuda, &err)) {
        printf("bench_moe_cuda: no GPU: %s\n", err.message);
        wna16_context_destroy(ctx);
        return 0;
    }
    const wna16_spec_t *spec = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                               "marlin");
    double bw = copy_gbs();
    printf("%s, sm_%d%d, %s, %s; D2D copy %.0f GB/s (read + write)\n",
           w16_cuda_device_name(cuda), w16_cuda_cc_major(cuda),
           w16_cuda_cc_minor(cuda), w16_cuda_driver_version(cuda),
           w16_nvrtc_version(), bw);
    printf("bf16 activations, group size 128, random uniform top-k routing, "
           "%d weight copies rotated, median of %d runs\n", COPIES, REPS);
    size_t n_shapes = quick ? 1 : sizeof SHAPES / sizeof SHAPES[0];
    int n_tok = quick ? 2 : (int)(sizeof TOKENS / sizeof TOKENS[0]);
    for (size_t s = 0; s < n_shapes; s++)
        for (int bits = 4; bits <= 8; bits += 4) {
            if (quick && bits == 8)
                continue;
            bench_shape(ctx, spec, &SHAPES[s], bits, bw, n_tok);
        }
    wna16_context_destroy(ctx);
    return 0;
}
