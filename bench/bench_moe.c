/*
 * bench_moe.c - the generated fused MoE on the CPU: the Qwen3-30B-A3B MoE
 * layer (H 2048, I 768, 128 experts, top-8, int4 group 128, bf16
 * activations, silu) at M = 1, 16, 64, 256 tokens. Prints the time per
 * call, the effective weight bandwidth (bytes of the experts a call
 * touches / time) against this machine's memory read bandwidth measured
 * in the same run (reads of what an M = 1 call reads, split over the same
 * thread pool, from a buffer far larger than the caches), and GFLOP/s,
 * each as the median and the best of the calls (the best shows the code
 * when the machine's other work leaves it alone). A program, not a test.
 *
 *   bench_moe [BACKEND [CALLS [M ...]]]   (default triton, 20 calls per M,
 *                                          M = 1 16 64 256)
 *
 * Every call routes its tokens to fresh random experts, so the weights
 * come from memory, not from the caches (8 experts of this layer are about
 * 19 MB; the whole layer 300 MB).
 */
#define _GNU_SOURCE
#include "wna16.h"
#include "bench/bench_util.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { E = 128, H = 2048, I = 768, TOPK = 8, GS = 128 };

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- memory read bandwidth ------------------------------------------------ */

/* The baseline reads memory the way a call reads its weights: `chunk`
 * bytes split in pages over the same thread pool the kernels run on, from
 * a buffer far larger than the caches (a fresh part each time), repeated as
 * often as the calls. Its best and median compare with the calls' best and
 * median under the same conditions (this machine is shared: other work
 * slows both). */
typedef struct reader {
    const uint64_t *base;
    _Atomic uint64_t sink;
} reader_t;

static void read_pages(void *user, int64_t begin, int64_t end)
{
    reader_t *r = user;
    const uint64_t *p = r->base + begin * 512, *q = r->base + end * 512;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (; p + 4 <= q; p += 4) {
        a += p[0];
        b ^= p[1];
        c += p[2];
        d ^= p[3];
    }
    r->sink += a + b + c + d;
}

typedef struct bandwidth {
    double best, median; /* bytes per second */
} bandwidth_t;

static bandwidth_t read_bandwidth(w16_pool_t *pool, size_t chunk, int reps)
{
    const size_t total = (size_t)1 << 30;
    bandwidth_t bw = {0, 0};
    uint64_t *buf = malloc(total);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!buf || !t || chunk > total / 2) {
        free(buf);
        free(t);
        return bw;
    }
    for (size_t i = 0; i < total / 8; i++)
        buf[i] = i * 0x9e3779b97f4a7c15ull;
    int64_t pages = (int64_t)(chunk / 4096), span = (int64_t)(total / 4096);
    reader_t r = {.base = buf};
    for (int i = 0; i < reps; i++) {
        r.base = buf + (size_t)((int64_t)i * pages % (span - pages)) * 512;
        double t0 = bench_seconds();
        w16_pool_run(pool, pages, read_pages, &r);
        t[i] = bench_seconds() - t0;
    }
    double med = median(t, reps);
    bw.best = (double)pages * 4096 / t[0];
    bw.median = (double)pages * 4096 / med;
    if (r.sink == 42)
        printf("(sink)\n");
    free(buf);
    free(t);
    return bw;
}

/* ---- the layer -------------------------------------------------------------- */

/* Random codes, small scales, zeros of 8: the backend's tensors directly
 * (the values do not change the time). Returns the bytes of one expert. */
static size_t make_weights(wna16_context_t *ctx, const wna16_spec_t *backend,
                           const wna16_quant_desc_t *q, wna16_tensor_set_t *set)
{
    wna16_tensor_decl_t decls[WNA16_LAYER_MAX_TENSORS];
    size_t count = 0, per_expert = 0;
    wna16_error_t err;
    if (wna16_repack_layer_shapes(ctx, backend, "m", E, H, I, q,
                                  WNA16_DTYPE_F16, WNA16_DTYPE_INVALID, decls,
                                  &count, &err)) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    for (size_t i = 0; i < count; i++) {
        wna16_tensor_t *t;
        if (wna16_tensor_set_add_new(set, decls[i].name, decls[i].dtype,
                                     decls[i].ndim, decls[i].shape, &t, &err)) {
            fprintf(stderr, "%s\n", err.message);
            exit(1);
        }
        if (strstr(t->name, "qzeros")) { /* 8: int8 values or two nibbles */
            memset(t->data, t->dtype == WNA16_DTYPE_I8 ? 8 : 0x88, t->nbytes);
        } else if (strstr(t->name, "scales")) {
            size_t n = t->nbytes / wna16_dtype_size(t->dtype);
            for (size_t j = 0; j < n; j++) {
                float s = 0.002f + (float)(next() % 1000) * 1e-6f;
                if (t->dtype == WNA16_DTYPE_F32)
                    ((float *)t->data)[j] = s;
                else
                    ((uint16_t *)t->data)[j] = wna16_f32_to_f16(s);
            }
        } else {
            uint8_t *p = t->data;
            for (size_t j = 0; j < t->nbytes; j++)
                p[j] = (uint8_t)next();
        }
        per_expert += t->nbytes / E;
    }
    return per_expert;
}

int main(int argc, char **argv)
{
    const char *bname = argc > 1 ? argv[1] : "triton";
    int calls = argc > 2 ? atoi(argv[2]) : 20;
    if (calls < 3)
        calls = 3;
    wna16_context_t *ctx;
    wna16_error_t err;
    w16_cpu_t *cpu;
    int status;
    if (!bench_open_cpu(&ctx, &cpu, &status))
        return status;
    const wna16_spec_t *backend = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, bname);
    if (!backend) {
        fprintf(stderr, "no backend '%s'\n", bname);
        return 1;
    }
    int threads = w16_cpu_threads(cpu);
    wna16_quant_desc_t q = {.bits = 4, .group_size = GS};
    wna16_tensor_set_t *set;
    wna16_tensor_set_create(ctx, &set, &err);
    size_t expert_bytes = make_weights(ctx, backend, &q, set);
    wna16_moe_layer_t *layer;
    if (wna16_moe_layer_create(ctx, backend, set, "m", E, H, I, &q,
                               WNA16_TARGET_CPU, &layer, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    /* the baseline: reads of what an M = 1 call reads (top-k experts) */
    w16_pool_t *pool = w16_pool_create(threads);
    size_t chunk = (size_t)TOPK * expert_bytes;
    bandwidth_t bw = read_bandwidth(pool, chunk, calls < 30 ? 30 : calls);
    w16_pool_destroy(pool);
    printf("wna16 bench_moe: Qwen3-30B-A3B MoE layer (E=%d H=%d I=%d top-%d, "
           "int4 g%d, bf16, silu) in the %s layout, %.2f MB per expert; "
           "%d threads, CPU %s, %s\n", E, H, I, TOPK, GS, bname,
           expert_bytes / 1e6, threads, w16_cpu_name(cpu),
           w16_cpu_compiler_version());
    printf("memory read bandwidth (%.1f MB reads on %d threads from a 1 GiB "
           "buffer, %d reads): median %.2f GB/s [best %.2f]\n", chunk / 1e6,
           threads, calls < 30 ? 30 : calls, bw.median / 1e9, bw.best / 1e9);
    printf("times: median of %d calls [best]; bandwidth and GFLOP/s from the "
           "median [best]\n", calls);
    printf("%5s %19s %8s %8s %13s %13s %13s %s\n", "M", "time", "experts",
           "MB read", "weight GB/s", "of memory", "GFLOP/s", "first call");
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    int Ms[16] = {1, 16, 64, 256};
    int nM = 4;
    if (argc > 3)
        for (nM = 0; nM < 16 && nM + 3 < argc; nM++)
            if ((Ms[nM] = atoi(argv[nM + 3])) < 1 || Ms[nM] > 4096) {
                fprintf(stderr, "bad M '%s'\n", argv[nM + 3]);
                return 1;
            }
    for (int mi = 0; mi < nM; mi++) {
        int M = Ms[mi];
        uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)M * H);
        uint16_t *out = malloc(sizeof(uint16_t) * (size_t)M * H);
        for (size_t i = 0; i < (size_t)M * H; i++)
            hidden[i] = wna16_f32_to_bf16((float)((int)(next() % 2001) - 1000) * 1e-3f);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)M * TOPK * (size_t)(calls + 1));
        float *w = malloc(sizeof(float) * (size_t)M * TOPK);
        for (int i = 0; i < M * TOPK; i++)
            w[i] = 1.0f / TOPK;
        double *t = malloc(sizeof(double) * (size_t)calls);
        double experts_sum = 0, first = 0;
        for (int c = 0; c <= calls; c++) {
            int32_t *id = ids + (size_t)c * M * TOPK;
            bool used[E] = {false};
            for (int m = 0; m < M; m++)
                for (int j = 0; j < TOPK; j++) {
                    int32_t e;
                    bool dup;
                    do { /* distinct experts per token */
                        e = (int32_t)(next() % E);
                        dup = false;
                        for (int jj = 0; jj < j; jj++)
                            dup = dup || id[m * TOPK + jj] == e;
                    } while (dup);
                    id[m * TOPK + j] = e;
                    used[e] = true;
                }
            int n_used = 0;
            for (int e = 0; e < E; e++)
                n_used += used[e];
            double t0 = bench_seconds();
            if (wna16_moe_layer_run(layer, &p, hidden, M, id, w, TOPK, out, &err)) {
                fprintf(stderr, "%s\n", err.message);
                return 1;
            }
            double dt = bench_seconds() - t0;
            if (c == 0) {
                first = dt; /* builds and compiles (or loads) the kernels */
            } else {
                t[c - 1] = dt;
                experts_sum += n_used;
            }
        }
        double tm = median(t, calls), tb = t[0], experts = experts_sum / calls;
        double bytes = experts * (double)expert_bytes;
        double flops = 2.0 * M * TOPK * (3.0 * H * I);
        printf("%5d %8.3f [%6.3f] ms %8.1f %8.1f %6.2f [%5.2f] %5.0f%% [%4.0f%%] "
               "%5.1f [%5.1f] %.0f ms\n", M, tm * 1e3, tb * 1e3, experts,
               bytes / 1e6, bytes / tm / 1e9, bytes / tb / 1e9,
               100.0 * bytes / tm / bw.median, 100.0 * bytes / tb / bw.best, flops / tm / 1e9,
               flops / tb / 1e9, first * 1e3);
        free(hidden);
        free(out);
        free(ids);
        free(w);
        free(t);
    }
    wna16_moe_layer_destroy(layer);
    wna16_tensor_set_destroy(set);
    wna16_context_destroy(ctx);
    return 0;
}
