/*
 * bench_stream_cuda.c - how fast the fused MoE's GEMMs could stream their
 * weights: the GEMM's read pattern with no arithmetic, against a
 * device-to-device copy and a linear read measured in the same run.
 *
 * The mma.sync GEMM (templates/moe_marlin_gemm.cu) gives each CTA a column
 * tile of one expert and a K range (split-K); a pipeline stage is block_k /
 * 16 Marlin k-tile rows, and in each row the CTA's columns are one
 * contiguous chunk (GEMM 2: block_n * 8 bytes) or two (GEMM 1: its gate and
 * its up half, block_n * 4 bytes each, ip * 8 bytes apart). This program
 * runs that pattern with the same CTA order (split-K parts adjacent, then
 * column tiles, then experts), CTA size (128 threads), stage size and depth
 * and dynamic shared memory (so the same CTAs fit an SM), copying the
 * stages with cp.async (the GEMM's way) or, on sm_90, with bulk copies on
 * an mbarrier (one thread, one copy a chunk), and reading each stage from
 * shared memory once. Its time is a floor for the GEMM's time at that grid:
 * where the pattern alone is far from the copy, the GEMM's tiling or grid
 * is what holds it back; where the GEMM is far from the pattern, its
 * arithmetic is.
 *
 * Each case rotates over copies of its weights filling >= 512 MB (so it
 * reads HBM, not the 60 MB L2) and reports GB/s and % of the copy.
 *
 *     bench_stream_cuda            (prints SKIP and exits 0 without a GPU)
 */
#include "wna16.h"
#include "runtime/cuda/cuda.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                          \
    do {                                                                     \
        if (call) {                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, err.message); \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static wna16_error_t err;
static w16_cuda_t *cuda;

/* One stage is ROWS k-tile rows x NCHUNK chunks of CHUNK bytes; 128
 * threads. Template parameters come from the launch's case through the
 * kernel's arguments (the loops are short; what matters is the traffic). */
static const char *SOURCE =
    "typedef unsigned long long u64;\n"
    "typedef unsigned int u32;\n"
    "struct args { const char *w; u64 expert_bytes, row_bytes, chunk_stride;\n"
    "  int chunk, nchunk, rows, stages, tiles, splits, kt; u32 *sink; };\n"
    "__device__ __forceinline__ u32 sa(const void *p)\n"
    "{ return (u32)__cvta_generic_to_shared(p); }\n"
    "__device__ __forceinline__ void place(const args &a, int &e, int &col,\n"
    "  int &k0, int &k1)\n"
    "{\n"
    "  int split = blockIdx.x % a.splits, t = blockIdx.x / a.splits;\n"
    "  e = t / a.tiles; col = t % a.tiles;\n"
    "  k0 = (int)((long)a.kt * split / a.splits);\n"
    "  k1 = (int)((long)a.kt * (split + 1) / a.splits);\n"
    "}\n"
    "__device__ __forceinline__ const char *src(const args &a, int e, int col,\n"
    "  int kt, int c)\n"
    "{\n"
    "  return a.w + e * a.expert_bytes + kt * a.row_bytes + c * a.chunk_stride\n"
    "    + (u64)col * a.chunk;\n"
    "}\n"
    // cp.async: every thread copies 16-byte pieces of the stage
    "extern \"C\" __global__ void __launch_bounds__(128)\n"
    "stream_cpasync(args a)\n"
    "{\n"
    "  extern __shared__ int4 sm[];\n"
    "  int e, col, k0, k1; place(a, e, col, k0, k1);\n"
    "  const int per_chunk = a.chunk / 16, per_row = per_chunk * a.nchunk;\n"
    "  const int vecs = per_row * a.rows;\n"
    "  const int nst = (k1 - k0) / a.rows;\n"
    "  u32 acc = 0;\n"
    "  for (int s = 0; s < nst + a.stages - 1; s++) {\n"
    "    if (s < nst) {\n"
    "      int4 *dst = sm + (s % a.stages) * vecs;\n"
    "      for (int v = threadIdx.x; v < vecs; v += 128) {\n"
    "        int r = v / per_row, q = v % per_row;\n"
    "        const char *p = src(a, e, col, k0 + s * a.rows + r, q / per_chunk)\n"
    "          + (q % per_chunk) * 16;\n"
    "        asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\\n\"\n"
    "          :: \"r\"(sa(dst + v)), \"l\"(p));\n"
    "      }\n"
    "    }\n"
    "    asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\");\n"
    "    int c = s - (a.stages - 1);\n"
    "    if (c >= 0) {\n"
    // stages c .. s are in flight: leave the stages - 1 after c pending
    "      if (a.stages == 2) asm volatile(\"cp.async.wait_group 1;\\n\" ::: \"memory\");\n"
    "      else if (a.stages == 3) asm volatile(\"cp.async.wait_group 2;\\n\" ::: \"memory\");\n"
    "      else asm volatile(\"cp.async.wait_group 3;\\n\" ::: \"memory\");\n"
    "      __syncthreads();\n"
    "      const int4 *st = sm + (c % a.stages) * vecs;\n"
    "      for (int v = threadIdx.x; v < vecs; v += 128) {\n"
    "        int4 x = st[v]; acc ^= x.x ^ x.y ^ x.z ^ x.w;\n"
    "      }\n"
    "      __syncthreads();\n"
    "    }\n"
    "  }\n"
    "  if (acc == 0x9e3779b9u) a.sink[0] = acc;\n"
    "}\n"
    // bulk copies (sm_90): thread 0 copies whole chunks onto the stage's
    // mbarrier; everyone waits on its phase
    "#if __CUDA_ARCH__ >= 900\n"
    "extern \"C\" __global__ void __launch_bounds__(128)\n"
    "stream_bulk(args a)\n"
    "{\n"
    "  extern __shared__ int4 sm[];\n"
    "  __shared__ __align__(8) u64 bar[8];\n"
    "  int e, col, k0, k1; place(a, e, col, k0, k1);\n"
    "  const int per_row = a.chunk / 16 * a.nchunk, vecs = per_row * a.rows;\n"
    "  const int nst = (k1 - k0) / a.rows;\n"
    "  if (threadIdx.x == 0) {\n"
    "    for (int i = 0; i < a.stages; i++)\n"
    "      asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\\n\"\n"
    "        :: \"r\"(sa(bar + i)) : \"memory\");\n"
    "    asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n"
    "  }\n"
    "  __syncthreads();\n"
    "  u32 acc = 0;\n"
    "  for (int s = 0; s < nst + a.stages - 1; s++) {\n"
    "    if (s < nst && threadIdx.x == 0) {\n"
    "      int b = s % a.stages;\n"
    "      char *dst = (char *)(sm + b * vecs);\n"
    "      asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n\"\n"
    "        :: \"r\"(sa(bar + b)), \"r\"(vecs * 16) : \"memory\");\n"
    "      for (int r = 0; r < a.rows; r++)\n"
    "        for (int c = 0; c < a.nchunk; c++) {\n"
    "          asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::\"\n"
    "            \"complete_tx::bytes [%0], [%1], %2, [%3];\\n\"\n"
    "            :: \"r\"(sa(dst + (r * a.nchunk + c) * a.chunk)),\n"
    "               \"l\"(src(a, e, col, k0 + s * a.rows + r, c)),\n"
    "               \"r\"(a.chunk), \"r\"(sa(bar + b)) : \"memory\");\n"
    "        }\n"
    "    }\n"
    "    int c = s - (a.stages - 1);\n"
    "    if (c >= 0) {\n"
    "      int b = c % a.stages; u32 phase = (c / a.stages) & 1, done = 0;\n"
    "      while (!done)\n"
    "        asm volatile(\"{\\n.reg .pred p;\\n\"\n"
    "          \"mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n\"\n"
    "          \"selp.u32 %0, 1, 0, p;\\n}\\n\"\n"
    "          : \"=r\"(done) : \"r\"(sa(bar + b)), \"r\"(phase) : \"memory\");\n"
    "      const int4 *st = sm + b * vecs;\n"
    "      for (int v = threadIdx.x; v < vecs; v += 128) {\n"
    "        int4 x = st[v]; acc ^= x.x ^ x.y ^ x.z ^ x.w;\n"
    "      }\n"
    "      __syncthreads();\n"
    "    }\n"
    "  }\n"
    "  if (acc == 0x9e3779b9u) a.sink[0] = acc;\n"
    "}\n"
    "#endif\n";

/* Kernel arguments, laid out as the device's struct args. */
typedef struct args {
    uint64_t w, expert_bytes, row_bytes, chunk_stride;
    int32_t chunk, nchunk, rows, stages, tiles, splits, kt;
    int32_t pad;
    uint64_t sink;
} args_t;

typedef struct stream_case {
    const char *name;
    int experts;        /* experts read by one launch */
    int N, K;           /* the GEMM's output columns (both halves) and K */
    int gated;          /* two chunks a row (gate, up) */
    int block_n, block_k, stages, splits;
    int smem;           /* dynamic shared memory a CTA (sets CTAs an SM) */
} stream_case_t;

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Device-to-device copy bandwidth (read + write), GB/s: bench_moe_cuda's. */
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

/* Median microseconds of one launch of `fn` over the case, rotating over
 * the copies of its weights in `buf` (`copies` of `bytes` each). */
static double time_case(w16_cuda_function_t *fn, const stream_case_t *c,
                        uint64_t buf, int copies, uint64_t sink)
{
    size_t row_bytes = (size_t)c->N * 8;        /* one k-tile row, int4 */
    size_t expert_bytes = row_bytes * (size_t)(c->K / 16);
    int chunk = c->gated ? c->block_n * 4 : c->block_n * 8;
    int tiles = c->gated ? c->N / c->block_n : c->N / c->block_n;
    args_t a = {
        .expert_bytes = expert_bytes,
        .row_bytes = row_bytes,
        .chunk_stride = c->gated ? row_bytes / 2 : 0,
        .chunk = chunk,
        .nchunk = c->gated ? 2 : 1,
        .rows = c->block_k / 16,
        .stages = c->stages,
        .tiles = tiles,
        .splits = c->splits,
        .kt = c->K / 16,
        .sink = sink,
    };
    unsigned grid = (unsigned)(c->experts * tiles * c->splits);
    size_t bytes = expert_bytes * (size_t)c->experts;
    void *argv[1] = {&a};
    w16_cuda_event_t *e0, *e1;
    CHECK(w16_cuda_event_create(cuda, &e0, &err));
    CHECK(w16_cuda_event_create(cuda, &e1, &err));
    enum { REPS = 5, RUNS = 32 };
    float t[REPS];
    for (int r = -1; r < REPS; r++) {  /* r = -1: warm-up */
        CHECK(w16_cuda_event_record(cuda, e0, NULL, &err));
        for (int i = 0; i < RUNS; i++) {
            a.w = buf + (uint64_t)((i % copies) * bytes);
            CHECK(w16_cuda_launch(cuda, fn, grid, 128, (unsigned)c->smem,
                                  NULL, argv, &err));
        }
        CHECK(w16_cuda_event_record(cuda, e1, NULL, &err));
        CHECK(w16_cuda_event_sync(cuda, e1, &err));
        if (r >= 0)
            CHECK(w16_cuda_event_elapsed_ms(cuda, e0, e1, &t[r], &err));
    }
    qsort(t, REPS, sizeof *t, cmp_f);
    w16_cuda_event_destroy(cuda, e0);
    w16_cuda_event_destroy(cuda, e1);
    return (double)t[REPS / 2] * 1e3 / RUNS;
}

int main(void)
{
    wna16_context_t *ctx;
    if (wna16_context_create(NULL, &ctx, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    if (w16_cuda_get(ctx, &cuda, &err)) {
        printf("SKIP: %s\n", err.message);
        wna16_context_destroy(ctx);
        return 0;
    }
    int major = w16_cuda_cc_major(cuda), minor = w16_cuda_cc_minor(cuda);
    w16_cuda_image_t img;
    CHECK(w16_nvrtc_compile(ctx, SOURCE, "bench_stream", major, minor, &img,
                            &err));
    w16_cuda_module_t *mod;
    CHECK(w16_cuda_module_load(cuda, &img, &mod, &err));
    w16_cuda_image_free(&img);
    w16_cuda_function_t *fcp, *fbulk = NULL;
    CHECK(w16_cuda_function(mod, "stream_cpasync", &fcp, &err));
    if (major >= 9)
        CHECK(w16_cuda_function(mod, "stream_bulk", &fbulk, &err));

    double copy = copy_gbs();
    printf("%s, sm_%d%d, %d SMs; D2D copy %.0f GB/s (read + write)\n",
           w16_cuda_device_name(cuda), major, minor, w16_cuda_sm_count(cuda),
           copy);

    /* the GEMM rows of the bench's small-M cases (specs/backends/
     * marlin.json, block_m 16: n256 k128, 3 stages, 3 CTAs an SM) */
    const int sm3 = 3 * (16384 + 4096 + 512) + 1024; /* B + A + scales */
    const stream_case_t cases[] = {
        /* Mixtral-8x7B GEMM 1 (N = 2 x 14336, K = 4096) */
        {"Mixtral w13, 2 experts, split 2 (M = 1)", 2, 28672, 4096, 1, 256, 128, 3, 2, sm3},
        {"Mixtral w13, 2 experts, split 1", 2, 28672, 4096, 1, 256, 128, 3, 1, sm3},
        {"Mixtral w13, 2 experts, split 4", 2, 28672, 4096, 1, 256, 128, 3, 4, sm3},
        {"Mixtral w13, 2 experts, split 2, 4 stages", 2, 28672, 4096, 1, 256, 128, 4, 2, 4 * 21504 + 1024},
        {"Mixtral w13, 2 experts, split 2, 2 CTAs an SM", 2, 28672, 4096, 1, 256, 128, 3, 2, 100000},
        {"Mixtral w13, 2 experts, split 2, 4 CTAs an SM", 2, 28672, 4096, 1, 256, 128, 3, 2, 52000},
        {"Mixtral w13, 2 experts, split 4, 4 CTAs an SM", 2, 28672, 4096, 1, 256, 128, 3, 4, 52000},
        {"Mixtral w13, 2 experts, split 2, ungated", 2, 28672, 4096, 0, 256, 128, 3, 2, sm3},
        {"Mixtral w13, 8 experts, split 1 (M = 16)", 8, 28672, 4096, 1, 256, 128, 3, 1, sm3},
        /* Mixtral-8x7B GEMM 2 (N = 4096, K = 14336) */
        {"Mixtral w2, 2 experts, split 8 (M = 1)", 2, 4096, 14336, 0, 256, 128, 3, 8, sm3},
        {"Mixtral w2, 8 experts, split 4 (M = 16)", 8, 4096, 14336, 0, 256, 128, 3, 4, sm3},
        /* DeepSeek-V3/EP8 GEMM 1 (N = 2 x 2048, K = 7168), one expert */
        {"DeepSeek w13, 1 expert, split 16 (M = 1)", 1, 4096, 7168, 1, 256, 128, 3, 16, sm3},
        /* linear: one expert a CTA-range (whole rows, one chunk) */
        {"linear (2048-byte rows a CTA, 132 x 3 CTAs)", 396, 256, 4096, 0, 256, 128, 3, 1, sm3},
    };
    size_t max_bytes = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t b = (size_t)cases[i].N * 8 * (size_t)(cases[i].K / 16) *
                   (size_t)cases[i].experts;
        if (b > max_bytes)
            max_bytes = b;
    }
    /* copies filling >= 512 MB, at least 2 */
    size_t total = (size_t)1 << 30;
    if (total < 2 * max_bytes)
        total = 2 * max_bytes;
    uint64_t buf = 0, sink = 0;
    CHECK(w16_cuda_alloc(cuda, total, &buf, &err));
    CHECK(w16_cuda_alloc(cuda, 16, &sink, &err));
    CHECK(w16_cuda_memset(cuda, buf, 0x5a, total, &err));

    printf("%-48s %6s %9s %8s %6s | %9s %8s %6s\n", "case", "CTAs", "cp.async",
           "GB/s", "%copy", "bulk", "GB/s", "%copy");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const stream_case_t *c = &cases[i];
        size_t bytes = (size_t)c->N * 8 * (size_t)(c->K / 16) *
                       (size_t)c->experts;
        int copies = (int)(total / bytes);
        unsigned grid = (unsigned)(c->experts * (c->N / c->block_n) *
                                   c->splits);
        double us = time_case(fcp, c, buf, copies, sink);
        double gbs = (double)bytes / (us * 1e-6) / 1e9;
        printf("%-48s %6u %7.1f us %8.0f %5.1f%%", c->name, grid, us, gbs,
               100.0 * gbs / copy);
        if (fbulk) {
            double ub = time_case(fbulk, c, buf, copies, sink);
            double gb = (double)bytes / (ub * 1e-6) / 1e9;
            printf(" | %6.1f us %8.0f %5.1f%%", ub, gb, 100.0 * gb / copy);
        }
        printf("   (%.1f MB)\n", (double)bytes / 1e6);
    }
    w16_cuda_free(cuda, buf);
    w16_cuda_free(cuda, sink);
    w16_cuda_module_unload(mod);
    wna16_context_destroy(ctx);
    return 0;
}
