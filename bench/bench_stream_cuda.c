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
#define _POSIX_C_SOURCE 200809L
#include "bench/bench_cuda.h"

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
    "  int st = a.kt / a.rows;\n"
    "  k0 = st * split / a.splits * a.rows;\n"
    "  k1 = st * (split + 1) / a.splits * a.rows;\n"
    "}\n"
    "__device__ __forceinline__ const char *src(const args &a, int e, int col,\n"
    "  int kt, int c)\n"
    "{\n"
    "  return a.w + e * a.expert_bytes + kt * a.row_bytes + c * a.chunk_stride\n"
    "    + (u64)col * a.chunk;\n"
    "}\n"
    // cp.async: every thread copies 16-byte pieces of the stage
    "extern \"C\" __global__ void __launch_bounds__(512)\n"
    "stream_cpasync(args a)\n"
    "{\n"
    "  extern __shared__ int4 sm[];\n"
    "  int e, col, k0, k1; place(a, e, col, k0, k1);\n"
    "  const int per_chunk = a.chunk / 16, per_row = per_chunk * a.nchunk;\n"
    "  const int vecs = per_row * a.rows, nv = vecs / blockDim.x;\n"
    "  const int nst = (k1 - k0) / a.rows;\n"
    // the GEMM computes its copies' offsets once (no divisions a stage)
    "  u64 off[16]; u32 dst[16];\n"
    "  #pragma unroll\n"
    "  for (int q = 0; q < 16; q++) {\n"
    "    int v = threadIdx.x + q * blockDim.x, r = v / per_row, x = v % per_row;\n"
    "    off[q] = r * a.row_bytes + (x / per_chunk) * a.chunk_stride\n"
    "      + (x % per_chunk) * 16;\n"
    "    dst[q] = sa(sm + v);\n"
    "  }\n"
    "  const char *base = a.w + e * a.expert_bytes + k0 * a.row_bytes\n"
    "    + (u64)col * a.chunk;\n"
    "  const u64 step = a.rows * a.row_bytes;\n"
    "  u32 acc = 0;\n"
    "  for (int s = 0; s < nst + a.stages - 1; s++) {\n"
    "    if (s < nst) {\n"
    "      const char *p = base + s * step;\n"
    "      u32 d = (s % a.stages) * vecs * 16;\n"
    "      #pragma unroll\n"
    "      for (int q = 0; q < 16; q++)\n"
    "        if (q < nv)\n"
    "          asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\\n\"\n"
    "            :: \"r\"(dst[q] + d), \"l\"(p + off[q]));\n"
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
    "      #pragma unroll\n"
    "      for (int q = 0; q < 16; q++)\n"
    "        if (q < nv) {\n"
    "          int4 x = st[threadIdx.x + q * blockDim.x];\n"
    "          acc ^= x.x ^ x.y ^ x.z ^ x.w;\n"
    "        }\n"
    "      __syncthreads();\n"
    "    }\n"
    "  }\n"
    "  if (acc == 0x9e3779b9u) a.sink[0] = acc;\n"
    "}\n"
    // bulk copies (sm_90): thread 0 copies whole chunks onto the stage's
    // mbarrier; everyone waits on its phase
    "#if __CUDA_ARCH__ >= 900\n"
    "extern \"C\" __global__ void __launch_bounds__(512)\n"
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
    "      for (int v = threadIdx.x; v < vecs; v += blockDim.x) {\n"
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
    int ctas;           /* CTAs an SM: sets the dynamic shared memory */
    int threads;        /* a CTA's (the GEMM's: 32 x warps_n x warps_k) */
} stream_case_t;

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
    /* an SM's 228 KiB shared memory over the CTAs, less the 1 KiB each
     * CTA reserves and the bulk kernel's static barriers */
    unsigned smem = (unsigned)((228 * 1024 / c->ctas - 1024 - 128) / 128 * 128);
    unsigned need = (unsigned)(c->stages * c->block_k / 16 * c->N * 8 /
                               (c->N / c->block_n));
    if (smem < need) {
        fprintf(stderr, "%s: %u stages' bytes do not fit %d CTAs an SM\n",
                c->name, need, c->ctas);
        exit(1);
    }
    void *argv[1] = {&a};
    w16_cuda_event_t *e0, *e1;
    CHECK(w16_cuda_event_create(cuda, &e0, &err));
    CHECK(w16_cuda_event_create(cuda, &e1, &err));
    enum { REPS = 5, RUNS = 32 };
    double t[REPS];
    for (int r = -1; r < REPS; r++) {  /* r = -1: warm-up */
        CHECK(w16_cuda_event_record(cuda, e0, NULL, &err));
        for (int i = 0; i < RUNS; i++) {
            a.w = buf + (uint64_t)((i % copies) * bytes);
            CHECK(w16_cuda_launch(cuda, fn, grid, (unsigned)c->threads, smem,
                                  NULL, argv, &err));
        }
        CHECK(w16_cuda_event_record(cuda, e1, NULL, &err));
        CHECK(w16_cuda_event_sync(cuda, e1, &err));
        float ms = 0.0f;
        CHECK(w16_cuda_event_elapsed_ms(cuda, e0, e1, &ms, &err));
        if (r >= 0)
            t[r] = ms;
    }
    qsort(t, REPS, sizeof *t, bench_cmp_double);
    w16_cuda_event_destroy(cuda, e0);
    w16_cuda_event_destroy(cuda, e1);
    return (double)t[REPS / 2] * 1e3 / RUNS;
}

int main(int argc, char **argv)
{
    if (argc > 1) { /* no options: the cases are the table below */
        fprintf(argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
                "usage: bench_stream_cuda\n"
                "  times the fused MoE GEMM's weight reads with no arithmetic "
                "(cp.async and\n  bulk copies) against a same-run D2D copy; "
                "prints SKIP without a GPU\n");
        return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    wna16_context_t *ctx;
    int status;
    if (!bench_open_cuda("bench_stream_cuda", &ctx, &cuda, &status))
        return status;
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

    double copy = 0.0;
    CHECK(bench_copy_gbs(cuda, &copy, &err));
    printf("%s, sm_%d%d, %d SMs; D2D copy %.0f GB/s (read + write)\n",
           w16_cuda_device_name(cuda), major, minor, w16_cuda_sm_count(cuda),
           copy);

    /* the GEMM's rows for the bench's small-M cases (specs/backends/
     * marlin.json, block_m 16: n256 k128, 3 stages, 3 CTAs an SM, split-K
     * as bench_moe_cuda prints it), then variants: the CTAs an SM, the
     * stages, the split */
    const stream_case_t cases[] = {
        {"Mixtral w13 M=1  n256 s2 p3 c3 t128 (GEMM)", 2, 28672, 4096, 1, 256, 128, 3, 2, 3, 128},
        {"Mixtral w13 M=1  n256 s2 p3 c4 t128", 2, 28672, 4096, 1, 256, 128, 3, 2, 4, 128},
        {"Mixtral w13 M=1  n256 s4 p3 c4 t128", 2, 28672, 4096, 1, 256, 128, 3, 4, 4, 128},
        {"Mixtral w13 M=1  n256 s2 p3 c2 t256", 2, 28672, 4096, 1, 256, 128, 3, 2, 2, 256},
        {"Mixtral w13 M=1  n256 s4 p3 c2 t256", 2, 28672, 4096, 1, 256, 128, 3, 4, 2, 256},
        {"Mixtral w13 M=1  n128 s1 p3 c6 t64", 2, 28672, 4096, 1, 128, 128, 3, 1, 6, 64},
        {"Mixtral w13 M=1  n128 s2 p3 c6 t64", 2, 28672, 4096, 1, 128, 128, 3, 2, 6, 64},
        {"Mixtral w13 M=1  n128 s2 p3 c8 t64", 2, 28672, 4096, 1, 128, 128, 3, 2, 8, 64},
        {"Mixtral w13 M=1  n128 s1 p3 c4 t128", 2, 28672, 4096, 1, 128, 128, 3, 1, 4, 128},
        {"Mixtral w13 M=1  n128 s2 p3 c4 t128", 2, 28672, 4096, 1, 128, 128, 3, 2, 4, 128},
        {"Mixtral w13 M=16 n256 s1 p3 c3 t128 (GEMM)", 8, 28672, 4096, 1, 256, 128, 3, 1, 3, 128},
        {"Mixtral w13 M=16 n256 s1 p3 c4 t128", 8, 28672, 4096, 1, 256, 128, 3, 1, 4, 128},
        {"Mixtral w13 M=16 n256 s1 p2 c4 t128", 8, 28672, 4096, 1, 256, 128, 2, 1, 4, 128},
        {"Mixtral w13 M=16 n256 s1 p3 c2 t256", 8, 28672, 4096, 1, 256, 128, 3, 1, 2, 256},
        {"Mixtral w13 M=16 n256 s1 p2 c3 t256", 8, 28672, 4096, 1, 256, 128, 2, 1, 3, 256},
        {"Mixtral w13 M=16 n256 s1 p3 c1 t512", 8, 28672, 4096, 1, 256, 128, 3, 1, 1, 512},
        {"Mixtral w13 M=16 n256 s1 p3 c3 t64", 8, 28672, 4096, 1, 256, 128, 3, 1, 3, 64},
        {"Mixtral w13 M=16 n128 s1 p3 c6 t64", 8, 28672, 4096, 1, 128, 128, 3, 1, 6, 64},
        {"Mixtral w13 M=16 n128 s1 p3 c8 t64", 8, 28672, 4096, 1, 128, 128, 3, 1, 8, 64},
        {"Mixtral w13 M=16 n128 s1 p3 c4 t128", 8, 28672, 4096, 1, 128, 128, 3, 1, 4, 128},
        {"Mixtral w13 M=16 n128 s1 p3 c6 t128", 8, 28672, 4096, 1, 128, 128, 3, 1, 6, 128},
        {"Mixtral w2  M=1  n256 s8 p3 c3 t128 (GEMM)", 2, 4096, 14336, 0, 256, 128, 3, 8, 3, 128},
        {"Mixtral w2  M=1  n256 s16 p3 c4 t128", 2, 4096, 14336, 0, 256, 128, 3, 16, 4, 128},
        {"Mixtral w2  M=16 n256 s4 p3 c3 t128 (GEMM)", 8, 4096, 14336, 0, 256, 128, 3, 4, 3, 128},
        {"Mixtral w2  M=16 n256 s4 p3 c4 t128", 8, 4096, 14336, 0, 256, 128, 3, 4, 4, 128},
        {"Mixtral w2  M=16 n256 s4 p3 c2 t256", 8, 4096, 14336, 0, 256, 128, 3, 4, 2, 256},
        {"DeepSeek w13 M=1 n256 s16 p3 c3 t128 (GEMM)", 1, 4096, 7168, 1, 256, 128, 3, 16, 3, 128},
        {"DeepSeek w13 M=1 n256 s16 p3 c4 t128", 1, 4096, 7168, 1, 256, 128, 3, 16, 4, 128},
        {"DeepSeek w2  M=1 n256 s8 p3 c3 t128 (GEMM)", 1, 7168, 2048, 0, 256, 128, 3, 8, 3, 128},
        {"linear, 396 CTAs p3 c3 t128", 396, 256, 4096, 0, 256, 128, 3, 1, 3, 128},
        {"linear, 528 CTAs p3 c4 t128", 528, 256, 4096, 0, 256, 128, 3, 1, 4, 128},
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

    printf("%-42s %6s %9s %8s %6s | %9s %8s %6s\n", "case", "CTAs", "cp.async",
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
        printf("%-42s %6u %7.1f us %8.0f %5.1f%%", c->name, grid, us, gbs,
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
