/*
 * bench_repack_cuda.c - GPU repack with the generated CUDA kernels:
 *   1. each destination's weight kernel alone, on device-resident sources,
 *      against a device-to-device copy of the same bytes in the same run;
 *   2. the whole layer through wna16_repack_layer (uploads, kernels, copies
 *      back, overlapped) against plain host<->device copies of its bytes;
 *   3. the cold NVRTC compile time per kernel, the memory-cache hit and the
 *      disk-cache load.
 * A program, not a test: it prints a table and ratios; without a GPU it
 * says so and exits 0.
 *
 *   bench_repack_cuda [EXPERTS [HIDDEN [INTERMEDIATE]]]   (default 128 2048 768)
 */
#define _GNU_SOURCE
#include "wna16.h"
#include "bench/bench_cuda.h"
#include "gen/build_repack.h"
#include "spec/spec.h"
#include "runtime/cuda/cuda_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

#define CHECK(call)                                                          \
    do {                                                                     \
        if ((call) != WNA16_OK) {                                            \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, err.message); \
            return 1;                                                        \
        }                                                                    \
    } while (0)

static wna16_error_t err;
static w16_cuda_t *cuda;
static w16_cuda_event_t *ev0, *ev1;

/* Median milliseconds of `reps` runs of one launch or copy, by events. */
typedef wna16_status_t (*op_fn)(void *user);

static double time_op(op_fn op, void *user, int reps)
{
    double t[32];
    op(user); /* warm up */
    for (int r = 0; r < reps; r++) {
        float ms = 0;
        w16_cuda_event_record(cuda, ev0, NULL, &err);
        op(user);
        w16_cuda_event_record(cuda, ev1, NULL, &err);
        w16_cuda_event_sync(cuda, ev1, &err);
        w16_cuda_event_elapsed_ms(cuda, ev0, ev1, &ms, &err);
        t[r] = ms;
    }
    return median(t, reps);
}

typedef struct launch {
    w16_cuda_function_t *fn;
    unsigned groups, lanes;
    uint64_t vals[4];
    void *args[4];
} launch_t;

static wna16_status_t do_launch(void *u)
{
    launch_t *l = u;
    return w16_cuda_launch(cuda, l->fn, l->groups, l->lanes, 0, NULL, l->args,
                           &err);
}

typedef struct copy {
    uint64_t dst, src;
    size_t bytes;
} copy_t;

static wna16_status_t do_copy(void *u)
{
    copy_t *c = u;
    return w16_cuda_copy_d2d(cuda, c->dst, c->src, c->bytes, &err);
}

/* Uploads every per-expert source tensor of `leaf` (GPTQ naming) and a
 * device table of their addresses; returns the table. */
static uint64_t upload_table(const wna16_tensor_set_t *src, int E, bool w13,
                             const char *leaf, uint64_t *bufs, int *nbufs)
{
    int np = w13 ? 2 : 1;
    uint64_t *tab = calloc((size_t)E * np, sizeof(uint64_t));
    for (int e = 0; e < E; e++)
        for (int p = 0; p < np; p++) {
            char nm[96];
            snprintf(nm, sizeof nm, "m.%d.%s.%s", e,
                     !w13 ? "down_proj" : p ? "up_proj" : "gate_proj", leaf);
            const wna16_tensor_t *t = wna16_tensor_set_find(src, nm);
            if (!t || w16_cuda_alloc(cuda, t->nbytes, &tab[e * np + p], &err) ||
                w16_cuda_copy_h2d(cuda, tab[e * np + p], t->data, t->nbytes,
                                  &err)) {
                fprintf(stderr, "uploading %s: %s\n", nm,
                        t ? err.message : "not found");
                exit(1);
            }
            bufs[(*nbufs)++] = tab[e * np + p];
        }
    uint64_t d = 0;
    w16_cuda_alloc(cuda, sizeof(uint64_t) * (size_t)E * np, &d, &err);
    w16_cuda_copy_h2d(cuda, d, tab, sizeof(uint64_t) * (size_t)E * np, &err);
    bufs[(*nbufs)++] = d;
    free(tab);
    return d;
}

int main(int argc, char **argv)
{
    int E = argc > 1 ? atoi(argv[1]) : 128;
    int H = argc > 2 ? atoi(argv[2]) : 2048;
    int I = argc > 3 ? atoi(argv[3]) : 768;
    wna16_context_t *ctx;
    int status;
    if (!bench_open_cuda("bench_repack_cuda", &ctx, &cuda, &status))
        return status;
    CHECK(w16_cuda_event_create(cuda, &ev0, &err));
    CHECK(w16_cuda_event_create(cuda, &ev1, &err));

    /* A random int4 group-128 GPTQ layer, written as checkpoint tensors. */
    wna16_qlayer_t L = {.E = E, .H = H, .I = I};
    CHECK(wna16_qweight_alloc(&L.w13, E, 2 * I, H, 4, 128, false, false, false,
                              &err));
    CHECK(wna16_qweight_alloc(&L.w2, E, H, I, 4, 128, false, false, false, &err));
    uint64_t s = 88172645463325252ull;
    wna16_qweight_t *q[2] = {&L.w13, &L.w2};
    for (int i = 0; i < 2; i++) {
        for (size_t j = 0; j < (size_t)q[i]->E * q[i]->N * q[i]->K; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            q[i]->codes[j] = (uint8_t)(s & 15);
        }
        for (size_t j = 0; j < (size_t)q[i]->E * q[i]->G * q[i]->N; j++)
            q[i]->scales[j] = 0.01f;
    }
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    wna16_tensor_set_t *src;
    CHECK(wna16_tensor_set_create(ctx, &src, &err));
    CHECK(wna16_ref_encode(ctx, gptq, &L, "m", src, &err));
    size_t src_bytes = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(src); i++)
        src_bytes += wna16_tensor_set_at(src, i)->nbytes;
    printf("wna16 bench_repack_cuda: GPTQ int4 g128, E=%d H=%d I=%d, %.1f MB "
           "of checkpoint tensors, %s, %s, %s\n", E, H, I, src_bytes / 1e6,
           w16_cuda_device_name(cuda), w16_cuda_driver_version(cuda),
           w16_nvrtc_version());

    /* 1. Weight kernels alone against a device copy of their bytes. */
    static const char *const dsts[] = {"triton", "xpu", "humming", "marlin",
                                       "batched_marlin", "cpu", "moe_wna16",
                                       "flashinfer_trtllm"};
    /* variants: the runtime's kernels (staged tiles where the builder finds
     * them) and the plain gather of one word per lane (the kernels before
     * the staged tiles, measured in the same run); 128 and 512 lanes (other
     * tile shapes) were no faster than 256 on the H200 (51-56% and 50-55%
     * of a copy against 52-58%), so only the runtime's shape is timed */
    static const struct { bool tiles; int lanes; const char *name; } var[] = {
        {true, 0, "runtime"}, {false, 0, "gather"}};
    printf("\n  weight kernels alone (sources on the device), median of 15:\n");
    printf("  %-18s %-4s %-8s %9s %9s %10s %10s %9s  %s\n", "destination",
           "gemm", "variant", "MB", "kernel", "GB/s r+w", "d2d copy",
           "vs copy", "kernel name");
    double cold_ms[64];
    int n_cold = 0;
    for (size_t vi = 0; vi < sizeof var / sizeof var[0]; vi++)
    for (size_t d = 0; d < sizeof dsts / sizeof dsts[0]; d++) {
        const wna16_spec_t *dst = wna16_spec_find(ctx, 0, dsts[d]);
        if (!dst || !dst->layouts[W16_ROLE_QWEIGHT])
            continue;
        for (int g = 0; g < 2; g++) {
            w16_repack_request_t req = {
                .src = gptq, .dst = dst,
                .problem = {E, H, I, 4, 128, false, false, false},
                .gemm = g ? WNA16_GEMM_W2 : WNA16_GEMM_W13,
                .role = W16_ROLE_QWEIGHT,
                .dst_dtype = dst->layouts[W16_ROLE_QWEIGHT]->dtypes[0],
                .lanes = var[vi].lanes, .staged_tiles = var[vi].tiles};
            req.src_dtype[W16_ROLE_QWEIGHT] = WNA16_DTYPE_I32;
            w16_repack_kernel_t rk;
            if (w16_build_repack(ctx, &req, &rk, &err)) {
                printf("  %-18s %-4s %-8s %s\n", dsts[d], g ? "w2" : "w13",
                       var[vi].name, err.message);
                continue;
            }
            /* cold NVRTC compile of this kernel's translation unit */
            char *text = NULL;
            w16_cuda_image_t img;
            double t0 = bench_seconds();
            if (vi == 0 && n_cold < 64 &&
                !w16_cuda_kernel_source(ctx, rk.kernel, &text, &err) &&
                !w16_nvrtc_compile(ctx, text, rk.kernel->name,
                                   w16_cuda_cc_major(cuda),
                                   w16_cuda_cc_minor(cuda), &img, &err)) {
                cold_ms[n_cold++] = (bench_seconds() - t0) * 1e3;
                w16_cuda_image_free(&img);
            }
            free(text);
            launch_t l = {.groups = (unsigned)rk.num_groups,
                          .lanes = (unsigned)rk.kernel->lanes};
            CHECK(w16_cuda_kernel_get(ctx, rk.kernel, &l.fn, NULL, &err));
            size_t bytes = (size_t)rk.elems *
                           wna16_dtype_size(req.dst_dtype);
            uint64_t bufs[600];
            int nb = 0;
            CHECK(w16_cuda_alloc(cuda, bytes, &l.vals[0], &err));
            bufs[nb++] = l.vals[0];
            l.vals[rk.src_param[W16_ROLE_QWEIGHT]] =
                upload_table(src, E, g == 0, "qweight", bufs, &nb);
            for (int i = 0; i < rk.kernel->n_params; i++)
                l.args[i] = &l.vals[i];
            double kt = time_op(do_launch, &l, 15);
            copy_t c = {.src = bufs[1], .bytes = bytes};
            CHECK(w16_cuda_alloc(cuda, bytes, &c.dst, &err));
            /* the copy reads one expert's tensor repeatedly: copy between
             * two whole-size buffers instead */
            copy_t c2 = {.dst = c.dst, .src = l.vals[0], .bytes = bytes};
            double ct = time_op(do_copy, &c2, 15);
            /* a layout with block sums whose codes kernel leaves them to
             * the separate sums kernel: say that this time is not all */
            bool sums_apart = dst->layouts[W16_ROLE_QWEIGHT]->sums_block_k &&
                              !rk.sums_fused;
            printf("  %-18s %-4s %-8s %9.1f %7.3f ms %10.1f %7.3f ms %8.0f%%  %s%s\n",
                   dsts[d], g ? "w2" : "w13", var[vi].name, bytes / 1e6, kt,
                   2 * bytes / kt / 1e6, ct, 100 * ct / kt, rk.kernel->name,
                   sums_apart ? " (+ the sums kernel, not timed)" : "");
            w16_cuda_free(cuda, c.dst);
            for (int i = 0; i < nb; i++)
                w16_cuda_free(cuda, bufs[i]);
            w16_repack_kernel_free(&rk);
        }
    }
    double cold_med = n_cold ? median(cold_ms, n_cold) : 0.0; /* sorts */
    printf("  cold NVRTC compile per kernel (emit + compile, sm_%d%d): median "
           "%.0f ms of %d, max %.0f ms\n", w16_cuda_cc_major(cuda),
           w16_cuda_cc_minor(cuda), cold_med, n_cold,
           n_cold ? cold_ms[n_cold - 1] : 0.0);

    /* 2. Whole layers from host memory: uploads + kernels + copies back. */
    printf("\n  whole layer from host memory (wna16_repack_layer, target cuda),"
           " median of 5:\n");
    wna16_quant_desc_t qd = {4, 128, false, false, false};
    {
        /* baseline: the same bytes up and down with plain copies */
        uint64_t d;
        CHECK(w16_cuda_alloc(cuda, src_bytes, &d, &err));
        char *h = malloc(src_bytes);
        memset(h, 1, src_bytes);
        double t[5];
        for (int r = 0; r < 5; r++) {
            double t0 = bench_seconds();
            w16_cuda_copy_h2d(cuda, d, h, src_bytes, &err);
            w16_cuda_copy_d2h(cuda, h, d, src_bytes, &err);
            t[r] = bench_seconds() - t0;
        }
        double base = median(t, 5);
        printf("  %-18s %9.1f ms  (%.1f MB up, then down, pageable)\n",
               "copies only", base * 1e3, src_bytes / 1e6);
        w16_cuda_free(cuda, d);
        free(h);
        for (size_t di = 0; di < sizeof dsts / sizeof dsts[0]; di++) {
            const wna16_spec_t *dst = wna16_spec_find(ctx, 0, dsts[di]);
            for (int r = 0; r < 6; r++) {
                wna16_tensor_set_t *out;
                wna16_tensor_set_create(ctx, &out, &err);
                double t0 = bench_seconds();
                wna16_status_t st = wna16_repack_layer(ctx, gptq, src, "m", E,
                                                       H, I, &qd, dst,
                                                       WNA16_TARGET_CUDA, out,
                                                       &err);
                double dt = bench_seconds() - t0;
                wna16_tensor_set_destroy(out);
                if (st) {
                    printf("  %-18s %s\n", dsts[di], err.message);
                    break;
                }
                if (r)
                    t[r - 1] = dt;
                if (r == 5) {
                    double m = median(t, 5);
                    printf("  %-18s %9.1f ms  %5.0f%% of the copies-only time\n",
                           dsts[di], m * 1e3, 100 * base / m);
                }
            }
        }
    }

    /* 3. Cache: memory hit and disk load of one kernel. */
    {
        w16_repack_request_t req = {
            .src = gptq, .dst = wna16_spec_find(ctx, 0, "marlin"),
            .problem = {E, H, I, 4, 128, false, false, false},
            .gemm = WNA16_GEMM_W13, .role = W16_ROLE_QWEIGHT,
            .dst_dtype = WNA16_DTYPE_I32, .staged_tiles = true};
        req.src_dtype[W16_ROLE_QWEIGHT] = WNA16_DTYPE_I32;
        w16_repack_kernel_t rk;
        CHECK(w16_build_repack(ctx, &req, &rk, &err));
        w16_cuda_function_t *fn;
        double t[32];
        for (int r = 0; r < 31; r++) {
            double t0 = bench_seconds();
            CHECK(w16_cuda_kernel_get(ctx, rk.kernel, &fn, NULL, &err));
            t[r] = bench_seconds() - t0;
        }
        printf("\n  memory-cache hit (emit the CUDA C, hash it, look up): "
               "%.1f us median of 31\n", median(t, 31) * 1e6);
        for (int r = 0; r < 5; r++) {
            wna16_context_t *c2;
            w16_cuda_t *c2cuda; /* starting the GPU is not the cache's cost */
            wna16_context_create(NULL, &c2, &err);
            CHECK(w16_cuda_get(c2, &c2cuda, &err));
            double t0 = bench_seconds(), ms = 0;
            wna16_status_t st = w16_cuda_kernel_get(c2, rk.kernel, &fn, &ms,
                                                    &err);
            t[r] = bench_seconds() - t0;
            wna16_context_destroy(c2);
            if (st) {
                printf("  disk load: %s\n", err.message);
                break;
            }
            if (ms > 0)
                printf("  (the disk level compiled: %.0f ms; is the cache "
                       "directory writable?)\n", ms);
        }
        printf("  fresh context (disk-cache load + module load): %.2f ms "
               "median of 5\n", median(t, 5) * 1e3);
        w16_repack_kernel_free(&rk);
    }
    w16_cuda_event_destroy(cuda, ev0);
    w16_cuda_event_destroy(cuda, ev1);
    wna16_tensor_set_destroy(src);
    wna16_qlayer_free(&L);
    wna16_context_destroy(ctx);
    return 0;
}
