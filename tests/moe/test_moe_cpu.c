/*
 * test_moe_cpu.c - the dedicated CPU kernels (gen/moe_cpu.c) and the
 * int8-dynamic contract, besides test_moe_gen's random configurations
 * (registered again as test_moe_gen_cpu, drawing only the cpu layout):
 *
 *   1. which builder runs: a layer in the cpu layout reports int8-dynamic on
 *      a host with AVX512-VNNI (skips, 77, without it), $WNA16_NUMERICS=f32
 *      gives the portable kernels, and a layer in triton's layout (whose
 *      maps have no VNNI blocks) runs f32;
 *   2. the probe reads the maps, not the name: the cpu layout's blocks are
 *      found with their strides, triton's refused with the reason;
 *   3. the layer's output equals the int8-dynamic reference (bit for bit
 *      but for the activation's rounding, as test_moe_gen bounds it) on
 *      the Qwen3-30B-A3B shape scaled down (H 512, I 256, 16 experts,
 *      top-8, group 128) at M = 1, 16 and 64, symmetric and with zero
 *      points;
 *   4. the contract differs from f32 by what 8-bit inputs imply: the
 *      int8-dynamic reference is not the f32 one, and within 2^-5 of its
 *      largest output;
 *   5. bf16-exact ($WNA16_NUMERICS=bf16-exact, vdpbf16ps): the same
 *      against its reference, within 2^-6 of f32;
 *   6. the thread pool the kernels run on (runtime/cpu/pool.c), whose
 *      caller does not wait for workers to wake: every index of every run
 *      is computed exactly once, on 2 and 5 threads, runs of 1 to 3000
 *      indices back to back and after pauses that let the workers sleep
 *      (run before the skip: it needs no VNNI).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "moe_util.h"
#include "gen/moe_cpu.h"
#include "runtime/cpu/pool.h"
#include "spec/spec.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static wna16_context_t *ctx;
static tu_rng_t rng;

/* A symmetric (zp false) or asymmetric layer of `bits`-bit codes in
 * groups of `group`, E experts. */
static void make_layer_q(wna16_qlayer_t *L, int32_t E, int32_t H, int32_t I,
                         bool zp, int bits, int group)
{
    wna16_error_t err;
    *L = (wna16_qlayer_t){.E = E, .H = H, .I = I};
    wna16_qweight_t *ops[2] = {&L->w13, &L->w2};
    int32_t N[2] = {2 * I, H}, K[2] = {H, I};
    for (int o = 0; o < 2; o++) {
        wna16_qweight_t *q = ops[o];
        TU_OK(wna16_qweight_alloc(q, E, N[o], K[o], bits, group, zp, false,
                                  false, &err), &err);
        q->scale_dtype = WNA16_DTYPE_BF16;
        for (size_t i = 0; i < (size_t)E * N[o] * K[o]; i++)
            q->codes[i] = (uint8_t)tu_rng_below(&rng, 1u << bits);
        for (size_t i = 0; i < (size_t)E * q->G * N[o]; i++) {
            q->scales[i] = mt_round_act(WNA16_DTYPE_BF16,
                                        (float)(mt_uniform(&rng, 0.02, 0.06) *
                                                16.0 / (1u << bits)));
            if (zp)
                q->zeros[i] = (uint8_t)tu_rng_below(&rng, 1u << bits);
        }
    }
}

/* The int4 layers of the cpu layout: group 128. */
static void make_layer(wna16_qlayer_t *L, int32_t E, int32_t H, int32_t I,
                       bool zp)
{
    make_layer_q(L, E, H, I, zp, 4, 128);
}

static wna16_moe_layer_t *make_moe_q(const char *backend,
                                     const wna16_qlayer_t *L, bool zp, int bits,
                                     int group, wna16_tensor_set_t **set)
{
    wna16_error_t err;
    const wna16_spec_t *s = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, backend);
    TU_OK(wna16_tensor_set_create(ctx, set, &err), &err);
    TU_OK(wna16_ref_encode(ctx, s, L, "m", *set, &err), &err);
    wna16_quant_desc_t q = {.bits = bits, .group_size = group,
                            .zero_point = zp, .model_dtype = WNA16_DTYPE_BF16};
    wna16_moe_layer_t *layer = NULL;
    TU_OK(wna16_moe_layer_create(ctx, s, *set, "m", L->E, L->H, L->I, &q,
                                 WNA16_TARGET_CPU, &layer, &err), &err);
    return layer;
}

static wna16_moe_layer_t *make_moe(const char *backend, const wna16_qlayer_t *L,
                                   bool zp, wna16_tensor_set_t **set)
{
    return make_moe_q(backend, L, zp, 4, 128, set);
}

/* 1 and 2: which kernels, and the probe. */
static void test_choice(void)
{
    wna16_qlayer_t L;
    make_layer(&L, 4, 256, 128, true);
    wna16_tensor_set_t *set;
    wna16_moe_layer_t *m = make_moe("cpu", &L, true, &set);
    TU_CHECK_MSG(wna16_moe_layer_numerics(m) == WNA16_NUMERICS_INT8_DYNAMIC,
                 "cpu layout on a VNNI host runs %s",
                 wna16_numerics_name(wna16_moe_layer_numerics(m)));
    wna16_moe_layer_destroy(m);
    wna16_tensor_set_destroy(set);
    setenv("WNA16_NUMERICS", "f32", 1);
    m = make_moe("cpu", &L, true, &set);
    TU_CHECK(wna16_moe_layer_numerics(m) == WNA16_NUMERICS_F32);
    wna16_moe_layer_destroy(m);
    wna16_tensor_set_destroy(set);
    unsetenv("WNA16_NUMERICS");
    m = make_moe("triton", &L, true, &set);
    TU_CHECK(wna16_moe_layer_numerics(m) == WNA16_NUMERICS_F32);
    wna16_moe_layer_destroy(m);
    wna16_tensor_set_destroy(set);

    /* the probe: the cpu layout's strides, triton's refusal */
    w16_moe_request_t req = {
        .backend = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "cpu"),
        .problem = {4, 256, 128, 4, 128, true}, .topk = 2, .block_m = 1};
    wna16_moe_params_init(&req.params);
    unsigned isa = W16_CPU_ISA_AVX512 | W16_CPU_ISA_AVX512_VNNI;
    w16_moe_cpu_layout_t lay;
    wna16_error_t err;
    TU_OK(w16_moe_cpu_probe(&req, WNA16_NUMERICS_INT8_DYNAMIC, isa, &lay, &err),
          &err);
    /* w13: N = 256, K = 256, bk = 128: blocks of 128 * 16 + 128 bytes, two
     * k blocks a column block, 8 column blocks an expert */
    TU_CHECK(lay.op[0].bk == 128 && lay.op[0].q_kc == 2176 &&
             lay.op[0].q_nb == 2 * 2176 && lay.op[0].q_e == 8 * 2 * 2176);
    TU_CHECK(lay.op[1].NB == 8 && lay.op[1].KC == 1 && lay.op[1].s_nb == 32);
    TU_CHECK(w16_moe_cpu_probe(&req, WNA16_NUMERICS_INT8_DYNAMIC, 0, NULL,
                               &err) == WNA16_EUNSUPPORTED &&
             strstr(err.message, "AVX512-VNNI"));
    req.backend = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
    TU_CHECK_MSG(w16_moe_cpu_probe(&req, WNA16_NUMERICS_INT8_DYNAMIC, isa,
                                   NULL, &err) == WNA16_EUNSUPPORTED &&
                 strstr(err.message, "maps") &&
                 strstr(err.message, "K-contiguous columns: its codes are "
                        "not 8-bit"), "triton 4-bit: %s", err.message);
    wna16_qlayer_free(&L);

    /* triton's 8-bit layout: each column's K codes contiguous, found with
     * its strides (w13: N = 256, K = 256, group 64: 4 groups; w2: K = 128,
     * 2 groups), under both contracts */
    req.problem = (w16_problem_t){4, 256, 128, 8, 64, true};
    isa |= W16_CPU_ISA_AVX512_BF16;
    TU_OK(w16_moe_cpu_probe(&req, WNA16_NUMERICS_INT8_DYNAMIC, isa, &lay, &err),
          &err);
    TU_CHECK(lay.op[0].shape == W16_MOE_CPU_COLS && lay.op[0].bk == 64 &&
             lay.op[0].q_n == 256 && lay.op[0].q_e == 256 * 256 &&
             lay.op[0].s_n == 4 && lay.op[0].s_g == 1 && lay.op[0].z_n == 4 &&
             lay.op[0].zero == 128);
    TU_CHECK(lay.op[1].shape == W16_MOE_CPU_COLS && lay.op[1].q_n == 128 &&
             lay.op[1].s_n == 2 && lay.op[1].KC == 2);
    /* bf16-exact on this shape: refused with the reason (the portable
     * kernels run it, faster; test_moe_bf16) */
    TU_CHECK_MSG(w16_moe_cpu_probe(&req, WNA16_NUMERICS_BF16_EXACT, isa, NULL,
                                   &err) == WNA16_EUNSUPPORTED &&
                 strstr(err.message, "int8-dynamic only"), "triton 8-bit "
                 "bf16-exact: %s", err.message);
    /* blocks of 32 channels are half a zmm of one column: refused */
    req.problem.GS = 32;
    TU_CHECK_MSG(w16_moe_cpu_probe(&req, WNA16_NUMERICS_INT8_DYNAMIC, isa,
                                   NULL, &err) == WNA16_EUNSUPPORTED &&
                 strstr(err.message, "multiple of 64"), "group 32: %s",
                 err.message);

    /* a bf16 layer of triton 8-bit runs the dedicated kernels by default:
     * int8-dynamic, the first the spec lists */
    make_layer_q(&L, 4, 256, 128, false, 8, 128);
    m = make_moe_q("triton", &L, false, 8, 128, &set);
    wna16_numerics_t nu = wna16_moe_layer_numerics(m);
    TU_CHECK_MSG(nu == WNA16_NUMERICS_INT8_DYNAMIC, "triton 8-bit runs %s",
                 wna16_numerics_name(nu));
    wna16_moe_layer_destroy(m);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

/* 3 and 4 at M tokens, under numerics nu (asked through
 * $WNA16_NUMERICS), a layer of `bits`-bit codes in groups of `group`
 * stored in `backend`'s layout, which the dedicated kernels must read
 * (the probe accepts it: bf16-exact could also run on the portable
 * kernels). */
static void test_outputs_on(const char *backend, int bits, int group,
                            int32_t M, bool zp, wna16_numerics_t nu)
{
    const int32_t E = 16, H = 512, I = 256, topk = 8;
    wna16_qlayer_t L;
    make_layer_q(&L, E, H, I, zp, bits, group);
    wna16_tensor_set_t *set;
    setenv("WNA16_NUMERICS", wna16_numerics_name(nu), 1);
    wna16_moe_layer_t *m = make_moe_q(backend, &L, zp, bits, group, &set);
    unsetenv("WNA16_NUMERICS");
    TU_CHECK_MSG(wna16_moe_layer_numerics(m) == nu, "asked %s, runs %s",
                 wna16_numerics_name(nu),
                 wna16_numerics_name(wna16_moe_layer_numerics(m)));
    w16_moe_request_t req = {
        .backend = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, backend),
        .problem = {E, H, I, bits, group, zp}, .topk = topk, .block_m = 1};
    wna16_moe_params_init(&req.params);
    req.params.act_dtype = WNA16_DTYPE_BF16;
    wna16_error_t perr;
    TU_CHECK_MSG(w16_moe_cpu_probe(&req, nu, W16_CPU_ISA_AVX512 |
                                   W16_CPU_ISA_AVX512_VNNI |
                                   W16_CPU_ISA_AVX512_BF16, NULL, &perr) ==
                 WNA16_OK, "%s %d-bit: %s", backend, bits, perr.message);
    size_t n = (size_t)M * H;
    uint16_t *hid = malloc(2 * n), *got = malloc(2 * n), *want = malloc(2 * n),
             *f32 = malloc(2 * n);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)M * topk);
    float *w = malloc(sizeof(float) * (size_t)M * topk);
    mt_random_act(&rng, WNA16_DTYPE_BF16, hid, n, -1.0, 1.0);
    for (int32_t t = 0; t < M; t++) /* top-k distinct experts a token */
        for (int32_t j = 0; j < topk; j++) {
            ids[t * topk + j] = (t + j) % E;
            w[t * topk + j] = (float)mt_uniform(&rng, 0.05, 0.3);
        }
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    wna16_error_t err;
    TU_OK(wna16_moe_layer_run(m, &p, hid, M, ids, w, topk, got, &err), &err);
    TU_OK(wna16_ref_moe_numerics(&L, &p, nu, hid, M, ids, w, topk, want, &err),
          &err);
    TU_OK(wna16_ref_moe(&L, &p, hid, M, ids, w, topk, f32, &err), &err);
    double max_ref = 0, max_d = 0, max_q = 0;
    size_t exact = 0;
    for (size_t i = 0; i < n; i++) {
        double g = mt_from_act(WNA16_DTYPE_BF16, got[i]);
        double r = mt_from_act(WNA16_DTYPE_BF16, want[i]);
        double f = mt_from_act(WNA16_DTYPE_BF16, f32[i]);
        max_ref = fmax(max_ref, fabs(r));
        max_d = fmax(max_d, fabs(g - r));
        max_q = fmax(max_q, fabs(r - f));
        exact += got[i] == want[i];
    }
    const char *name = wna16_numerics_name(nu);
    printf("%s %d-bit group %d, M %d %s: %zu of %zu bit-identical to the "
           "%s reference (max diff %.3g); %s vs f32 reference: max diff %.3g "
           "of max |out| %.3g\n", backend, bits, group, M,
           zp ? "zero points" : "symmetric", exact, n, name, max_d, name,
           max_q, max_ref);
    TU_CHECK_MSG(exact >= 0.99 * (double)n && max_d <= 0x1p-6 * max_ref,
                 "%s %d-bit, M %d: kernels vs %s reference", backend, bits, M,
                 name);
    /* 8-bit inputs: about 2^-7 relative; bf16 weights and inputs: a few
     * 2^-9, plus the sums' order */
    TU_CHECK_MSG(max_q > 0 && max_q <= (nu == WNA16_NUMERICS_INT8_DYNAMIC
                                            ? 0x1p-5 : 0x1p-6) * max_ref,
                 "M %d: %s vs f32: %.3g of %.3g", M, name, max_q, max_ref);
    free(hid);
    free(got);
    free(want);
    free(f32);
    free(ids);
    free(w);
    wna16_moe_layer_destroy(m);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

/* ---- 6. the pool ---- */

typedef struct pool_job {
    atomic_int *seen;
    int64_t n;
    atomic_int bad;
} pool_job_t;

static void pool_fn(void *user, int64_t b, int64_t e)
{
    pool_job_t *j = user;
    if (b < 0 || e > j->n || b >= e) {
        atomic_store(&j->bad, 1);
        return;
    }
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&j->seen[i], 1);
}

static void test_pool(void)
{
    static const int threads[] = {2, 5};
    for (int t = 0; t < 2; t++) {
        w16_pool_t *p = w16_pool_create(threads[t]);
        TU_CHECK(p != NULL);
        if (!p)
            return;
        TU_CHECK(w16_pool_threads(p) == threads[t]);
        int wrong = 0;
        for (int r = 0; r < 400; r++) {
            pool_job_t j = {.n = r % 9 == 0 ? 1 : 1 + tu_rng_below(&rng, 3000)};
            atomic_init(&j.bad, 0);
            j.seen = calloc((size_t)j.n, sizeof *j.seen);
            for (int64_t i = 0; i < j.n; i++)
                atomic_init(&j.seen[i], 0);
            w16_pool_run(p, j.n, pool_fn, &j);
            int64_t ok = 0;
            for (int64_t i = 0; i < j.n; i++)
                ok += atomic_load(&j.seen[i]) == 1;
            if (ok != j.n || atomic_load(&j.bad))
                wrong++;
            free(j.seen);
            /* back to back, or a pause past the workers' spin (20 us) */
            uint32_t pause = tu_rng_below(&rng, 4);
            if (pause) {
                struct timespec ts = {0, pause == 3 ? 400000 : 30000 * pause};
                nanosleep(&ts, NULL);
            }
        }
        TU_CHECK_MSG(wrong == 0, "pool of %d threads: %d of 400 runs did not "
                     "compute every index exactly once", threads[t], wrong);
        w16_pool_destroy(p);
    }
}

int main(void)
{
#ifndef WNA16_HAVE_LLVM
    tu_skip("the CPU target needs LLVM 19 (install llvm-19-dev)");
#endif
    tu_rng_seed(&rng, 0xc0de);
    ctx = tu_context();
    test_pool();
    {
        /* skip where the host has no AVX512-VNNI: only the portable
         * kernels run there (test_moe_gen covers them) */
        wna16_qlayer_t L;
        make_layer(&L, 1, 128, 128, false);
        wna16_tensor_set_t *set;
        wna16_moe_layer_t *m = make_moe("cpu", &L, false, &set);
        bool native = wna16_moe_layer_numerics(m) != WNA16_NUMERICS_F32;
        wna16_moe_layer_destroy(m);
        wna16_tensor_set_destroy(set);
        wna16_qlayer_free(&L);
        if (!native)
            tu_skip("the host CPU has no AVX512-VNNI: the cpu layout runs "
                    "the portable f32 kernels");
    }
    test_choice();
    const wna16_numerics_t i8 = WNA16_NUMERICS_INT8_DYNAMIC,
                           bf = WNA16_NUMERICS_BF16_EXACT;
    test_outputs_on("cpu", 4, 128, 1, false, i8);
    test_outputs_on("cpu", 4, 128, 16, true, i8);
    test_outputs_on("cpu", 4, 128, 64, false, i8);
    test_outputs_on("cpu", 4, 128, 1, true, bf);
    test_outputs_on("cpu", 4, 128, 33, false, bf);
    /* 8-bit codes, K-contiguous columns (gen/moe_cpu_cols.c, int8-dynamic
     * only); group 64: blocks of 64 channels, one line a column */
    test_outputs_on("triton", 8, 128, 1, false, i8);
    test_outputs_on("triton", 8, 64, 16, true, i8);
    return tu_finish("test_moe_cpu");
}
