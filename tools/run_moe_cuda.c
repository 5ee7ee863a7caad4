/*
 * run_moe_cuda.c - the GPU part of `wna16 run --target cuda`: the layer
 * is repacked into the Marlin layout by the generated CUDA repack kernels,
 * put on the GPU, and run through the fused-MoE kernels (templates/
 * specialized from the spec, through the kernel cache) for a decode and a
 * prefill batch, each checked against the reference fused MoE. Reports the
 * kernels, the tiling rows that chose them, the cold NVRTC compile time of
 * each and the time of a warm run.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* One batch of M tokens: GPU against the reference. The check is a sanity
 * bound for a demo (the element-wise error model lives in
 * tests/cuda/test_moe_cuda.c): max |gpu - ref| <= 2^-5 * max |ref|. */
static int run_batch(wna16_cuda_moe_t *moe, const wna16_qlayer_t *L,
                     int32_t M, int32_t topk, uint64_t seed)
{
    wna16_error_t err;
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = WNA16_DTYPE_BF16;
    size_t n = (size_t)M * L->H, P = (size_t)M * topk;
    uint16_t *x = malloc(n * 2), *ref = malloc(n * 2), *got = malloc(n * 2);
    int32_t *ids = malloc(P * sizeof *ids);
    float *w = malloc(P * sizeof *w);
    int rc = CLI_FAIL;
    if (!x || !ref || !got || !ids || !w) {
        fprintf(stderr, "wna16: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        x[i] = wna16_f32_to_bf16((float)((int)(rng_next(&seed) % 2001) - 1000) /
                                 1000.0f);
    for (int32_t m = 0; m < M; m++)
        for (int32_t j = 0; j < topk; j++) {
            int32_t id;
            bool dup;
            do {
                id = (int32_t)(rng_next(&seed) % (uint64_t)L->E);
                dup = false;
                for (int32_t j2 = 0; j2 < j; j2++)
                    dup |= ids[(size_t)m * topk + j2] == id;
            } while (dup);
            ids[(size_t)m * topk + j] = id;
            w[(size_t)m * topk + j] = 1.0f / (float)topk;
        }
    double t0 = now_s();
    if (wna16_cuda_moe_run(moe, &p, x, M, ids, w, topk, got, &err) != WNA16_OK) {
        cli_fail(&err);
        goto out;
    }
    double cold = now_s() - t0;
    wna16_cuda_moe_report_t rep;
    wna16_cuda_moe_last_report(moe, &rep);
    t0 = now_s();
    if (wna16_cuda_moe_run(moe, &p, x, M, ids, w, topk, got, &err) != WNA16_OK) {
        cli_fail(&err);
        goto out;
    }
    double warm = now_s() - t0;
    if (wna16_ref_moe(L, &p, x, M, ids, w, topk, ref, &err) != WNA16_OK) {
        cli_fail(&err);
        goto out;
    }
    double dmax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double g = wna16_bf16_to_f32(got[i]), r = wna16_bf16_to_f32(ref[i]);
        dmax = fmax(dmax, fabs(g - r));
        rmax = fmax(rmax, fabs(r));
    }
    bool ok = dmax <= rmax / 32.0;
    printf("     M = %d, top-%d: block_m %d; %s (%s), %s (%s)\n", M, topk,
           rep.block_m, rep.kernel[0], rep.tile_rule[0], rep.kernel[1],
           rep.tile_rule[1]);
    printf("       NVRTC %.0f + %.0f + %.0f ms (0: from the kernel cache); "
           "first run %.1f ms, warm run %.2f ms with host copies; max |gpu - "
           "ref| %.3g of max |ref| %.3g: %s\n", rep.compile_ms[0],
           rep.compile_ms[1], rep.compile_ms[2], cold * 1e3, warm * 1e3, dmax,
           rmax, ok ? "ok" : "MISMATCH");
    rc = ok ? CLI_OK : CLI_FAIL;
out:
    free(x);
    free(ref);
    free(got);
    free(ids);
    free(w);
    return rc;
}

int cli_run_moe_cuda(wna16_context_t *ctx, const wna16_spec_t *fmt,
                     const wna16_tensor_set_t *src, const char *prefix,
                     const wna16_qlayer_t *L, const wna16_quant_desc_t *q,
                     int32_t topk, int step)
{
    wna16_error_t err;
    const wna16_spec_t *marlin = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                 "marlin");
    wna16_tensor_set_t *out = NULL;
    wna16_cuda_moe_t *moe = NULL;
    printf("  %d. the fused MoE on the GPU (templates/ specialized from "
           "marlin.json and its tiling table)\n", step);
    double t0 = now_s();
    wna16_status_t st = marlin ? wna16_tensor_set_create(ctx, &out, &err)
                               : WNA16_ENOTFOUND;
    if (!marlin)
        snprintf(err.message, sizeof err.message, "no marlin backend spec");
    if (st == WNA16_OK)
        st = wna16_repack_layer(ctx, fmt, src, prefix, L->E, L->H, L->I, q,
                                marlin, WNA16_TARGET_CUDA, out, &err);
    if (st == WNA16_OK) {
        printf("     repacked into marlin by the generated CUDA kernels in "
               "%.2f s\n", now_s() - t0);
        t0 = now_s();
        st = wna16_cuda_moe_create(ctx, marlin, out, prefix, L->E, L->H, L->I,
                                   q, false, &moe, &err);
    }
    int rc = CLI_OK;
    if (st != WNA16_OK) {
        rc = cli_fail(&err);
    } else {
        printf("     on the GPU in %.2f s (layout contract checked)\n",
               now_s() - t0);
        if (run_batch(moe, L, 1, topk, 1) != CLI_OK ||
            run_batch(moe, L, 64, topk, 2) != CLI_OK)
            rc = CLI_FAIL;
    }
    wna16_cuda_moe_destroy(moe);
    wna16_tensor_set_destroy(out);
    return rc;
}
