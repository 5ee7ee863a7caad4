/*
 * test_moe_cuda.c - the CUDA fused MoE (wna16_cuda_moe_*) against the
 * reference (wna16_ref_moe, wna16_ref_moe_batched) on a GPU.
 *
 * 240 configurations, each a random layer in logical form encoded into
 * the Marlin layout by the reference encoder, put on the GPU (from host
 * tensors, or wrapping device copies), run, and compared element by
 * element with the reference. The list starts with the cases the issue
 * names (odd M 1, 7, 33, 123, 222, 666; experts with no tokens; E up to
 * 256; top-k up to 10; padded intermediate sizes; act-order; 8-bit; zero
 * points; every group size; the scale permutation of hazard H1; F16/BF16
 * activations and scales; every gated activation; expert maps; router
 * weights on the input; GEMM output rounding; the batched format; every
 * row of the tiling table) and is filled with random ones. Some runs are
 * repeated: the output must be bit-identical (no float atomics).
 *
 * Tolerance. The kernel and the reference share every rounding point of
 * the documented semantics; they differ in (1) the weights: with grouped
 * scales the kernel rounds (q - z) * s to the activation dtype (unit
 * roundoff u = 2^-11 for F16, 2^-8 for BF16) before the product, (2) the
 * sums: float32 on tensor cores in any order (at most K * 2^-23 of the
 * sum of |terms|: tensor cores may truncate) against the reference's
 * double, (3) the activation in float32 against double (2^-20 relative
 * plus 2^-21 (1 + |g|)(1 + |u|) absolute, for the cancellation in
 * 1 + erf and 1 + tanh), and (4) the top-k sum in float32 (2^-20 of the
 * terms). Each can flip a
 * rounding to the activation dtype (h or y with round_gemm_outputs, the
 * activation a, the output), which costs one ulp of that value. The test
 * recomputes every intermediate in double from the dequantized weights and
 * carries these bounds through both GEMMs (the activation's sensitivity is
 * measured by evaluating it at the perturbed inputs), then requires
 *     |gpu - ref| <= 2 * bound + 1e-30
 * for every output element, and prints the largest |gpu - ref| / bound.
 * Skips (exit 77) without a GPU or NVRTC.
 *
 * With WNA16_TEST_MOE_DRY=1 the reference stands in for the GPU: a check
 * of the harness itself (every case is one the encoder and the reference
 * accept, the bound is finite) that CI runs on every 8th case.
 */
#define _POSIX_C_SOURCE 200809L
#include "moe_util.h"
#include "spec/spec.h"
#include "runtime/cuda/cuda.h"
#include "runtime/ref/moe_bound.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define N_CASES 240

typedef struct tcase {
    int32_t E, H, I;
    int32_t M, topk;        /* standard format */
    int32_t max_tokens;     /* batched format */
    int bits, gs;
    bool zp, act_order, bias, batched;
    bool on_input, round, map, device_tensors, weights, repeat;
    bool odd_out; /* run on device buffers, out 2 bytes past 8-aligned */
    /* an expert map of 8 global experts a local one (8-way expert
     * parallelism), every slot routed to a local expert: eight times the
     * rows the runtime expects (its tiles and split-K come from the
     * expected rows; the grid must still cover the real ones) */
    bool ep8_local;
    wna16_dtype_t act, scale;
    wna16_activation_t fn;
    float limit;
    int32_t active;         /* experts that receive tokens (<= E) */
    uint64_t seed;
    const char *why;        /* the anchor's purpose, or "random" */
} tcase_t;

static tcase_t cases[N_CASES];
static int n_cases;

static tcase_t base_case(void)
{
    return (tcase_t){.E = 8, .H = 256, .I = 128, .M = 7, .topk = 2,
                     .max_tokens = 0, .bits = 4, .gs = 128,
                     .act = WNA16_DTYPE_BF16, .scale = WNA16_DTYPE_BF16,
                     .fn = WNA16_ACT_SILU, .limit = 7.0f, .active = 0,
                     .weights = true, .why = "base"};
}

static void add(tcase_t c)
{
    if (n_cases < N_CASES) {
        c.seed = 1000u + (uint64_t)n_cases;
        if (!c.active || c.active > c.E)
            c.active = c.E;
        cases[n_cases++] = c;
    }
}

/* The intermediate size after Marlin's padding. */
static int32_t padded(int32_t I, int gs)
{
    int32_t l = gs > 0 ? (64 % gs == 0 ? 64 : (gs % 64 == 0 ? gs : 64 * gs))
                       : 64;
    return (I + l - 1) / l * l;
}

/* Keeps a random case inside what the layout holds and the test's time. */
static bool valid(const tcase_t *c)
{
    if (c->gs > 0 && (c->I % c->gs || c->H % c->gs))
        return false;
    if (c->act_order && (c->gs <= 0 || padded(c->I, c->gs) != c->I))
        return false;
    if (c->zp && c->bits != 4)
        return false;
    if (!c->batched && c->topk > (c->map ? 2 * c->E : c->E))
        return false;
    double rows = c->batched ? (double)c->E * c->max_tokens
                             : (double)c->M * c->topk;
    return rows * c->H * c->I <= 9e7;
}

static void build_cases(void)
{
    tcase_t c;
    /* odd M, silu, both dtypes */
    static const int32_t odd_m[] = {1, 7, 33, 123, 222, 666};
    for (size_t i = 0; i < W16_ARRAY_LEN(odd_m); i++)
        for (int d = 0; d < 2; d++) {
            c = base_case();
            c.M = odd_m[i];
            c.E = odd_m[i] > 200 ? 16 : 8;
            c.topk = odd_m[i] > 200 ? 4 : 2;
            c.act = c.scale = d ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
            c.why = "odd M";
            add(c);
        }
    /* many experts, most of them idle; large top-k */
    c = base_case(); c.E = 256; c.topk = 10; c.M = 33; c.H = 128; c.I = 64;
    c.gs = 64; c.why = "E 256, top-k 10"; add(c);
    c = base_case(); c.E = 256; c.topk = 8; c.M = 1; c.H = 128; c.I = 128;
    c.why = "E 256, one token"; add(c);
    c = base_case(); c.E = 64; c.topk = 10; c.M = 123; c.H = 128; c.I = 128;
    c.gs = 32; c.why = "top-k 10"; add(c);
    c = base_case(); c.E = 32; c.active = 3; c.M = 40; c.topk = 3;
    c.why = "experts with no tokens"; add(c);
    /* padded intermediate sizes */
    static const int32_t pad_i[][2] = {{96, -1}, {96, 32}, {100, -1},
                                       {160, 32}, {176, -1}, {32, 32},
                                       {192, 64}, {320, 64}};
    for (size_t i = 0; i < W16_ARRAY_LEN(pad_i); i++) {
        c = base_case();
        c.I = pad_i[i][0];
        c.gs = pad_i[i][1];
        c.M = 33;
        c.bits = i % 3 == 2 ? 8 : 4;
        c.zp = i % 3 == 1;
        c.bias = i % 2 == 1;
        c.why = "padded I";
        add(c);
    }
    /* act-order: 4/8-bit, group sizes, zero points, big M */
    static const int ao_gs[] = {32, 64, 128};
    for (size_t i = 0; i < W16_ARRAY_LEN(ao_gs); i++)
        for (int b = 0; b < 2; b++) {
            c = base_case();
            c.act_order = true;
            c.gs = ao_gs[i];
            c.bits = b ? 8 : 4;
            c.zp = b == 0 && i == 1;
            c.M = i == 2 ? 123 : 13;
            c.act = b ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
            c.scale = c.act;
            c.why = "act-order";
            add(c);
        }
    /* every group size with 8-bit and with zero points */
    static const int all_gs[] = {-1, 32, 64, 128};
    for (size_t i = 0; i < W16_ARRAY_LEN(all_gs); i++) {
        c = base_case(); c.bits = 8; c.gs = all_gs[i]; c.M = 17;
        c.why = "8-bit"; add(c);
        c = base_case(); c.zp = true; c.gs = all_gs[i]; c.M = 5;
        c.act = c.scale = WNA16_DTYPE_F16; c.why = "zero points"; add(c);
    }
    /* hazard H1: I == group size gives w13 the 32-table scale layout
     * although it has H / 128 groups */
    c = base_case(); c.I = 128; c.gs = 128; c.H = 512; c.why = "H1"; add(c);
    c = base_case(); c.I = 64; c.gs = 64; c.H = 256; c.bits = 8;
    c.why = "H1 8-bit"; add(c);
    /* scale dtype differing from the activation dtype */
    c = base_case(); c.scale = WNA16_DTYPE_F16; c.why = "F16 scales, BF16 "
    "activations"; add(c);
    c = base_case(); c.act = WNA16_DTYPE_F16; c.gs = -1; c.bias = true;
    c.why = "BF16 scales, F16 activations"; add(c);
    /* every activation, swiglu clamps on and off */
    for (int f = WNA16_ACT_SILU; f <= WNA16_ACT_SWIGLUSTEP; f++)
        for (int lim = 0; lim < 2; lim++) {
            c = base_case();
            c.fn = (wna16_activation_t)f;
            c.limit = lim ? INFINITY : 2.0f;
            c.bias = lim == 1;
            c.M = 9;
            c.why = "activation";
            add(c);
        }
    /* expert maps, weights on the input, output rounding */
    c = base_case(); c.map = true; c.M = 31; c.topk = 3; c.why = "expert map";
    add(c);
    c = base_case(); c.map = true; c.M = 1; c.topk = 4; c.why = "expert map";
    add(c);
    /* every slot local under an EP8 map: about twice the row blocks the
     * split-K was planned for (32 row blocks of block_m 8 for 16 or 14
     * expected): GEMM 1 with a deep K (H 2048, split 16) and a wide N (I
     * 2048), GEMM 2 on the 128-column row for N >= 6144 */
    c = base_case(); c.ep8_local = true; c.E = 16; c.H = 2048; c.I = 256;
    c.topk = 8; c.M = 20; c.why = "EP8 map, every slot local: deep K";
    add(c);
    c = base_case(); c.ep8_local = true; c.E = 16; c.H = 256; c.I = 2048;
    c.topk = 8; c.M = 20; c.why = "EP8 map, every slot local: wide I";
    add(c);
    c = base_case(); c.ep8_local = true; c.E = 32; c.H = 6144; c.I = 128;
    c.topk = 8; c.M = 14; c.why = "EP8 map, every slot local: GEMM 2";
    add(c);
    c = base_case(); c.on_input = true; c.topk = 1; c.M = 21;
    c.why = "weights on input"; add(c);
    c = base_case(); c.on_input = true; c.topk = 3; c.M = 7; c.act_order = true;
    c.gs = 32; c.why = "weights on input, act-order"; add(c);
    c = base_case(); c.round = true; c.M = 19; c.bias = true;
    c.why = "round GEMM outputs"; add(c);
    /* tiling rows: block_m 16/32/48/64 (routed slots per expert 1-8,
     * 9-24, 25-40, more), w13 N >= 1024, w2 N <= 4096 */
    c = base_case(); c.M = 32; c.topk = 2; c.E = 8; c.why = "block_m 16";
    add(c);
    c = base_case(); c.M = 90; c.topk = 2; c.E = 8; c.why = "block_m 32";
    add(c);
    /* 25-48 routed slots an expert: the wgmma rows on an sm_90 device
     * (48 up to 36, 64 from 37), mma.sync elsewhere and with act order
     * (the second of each pair) */
    c = base_case(); c.M = 140; c.topk = 2; c.E = 8; c.why = "block_m 48";
    add(c);
    c.act_order = true; c.why = "block_m 48, act order (mma.sync)"; add(c);
    c = base_case(); c.M = 160; c.topk = 2; c.E = 8; c.I = 512; c.H = 128;
    c.why = "block_m 64, wide w13"; add(c);
    c.act_order = true; c.why = "block_m 64, act order (mma.sync)"; add(c);
    c = base_case(); c.M = 40; c.topk = 8; c.E = 8; c.H = 1024; c.I = 64;
    c.gs = 64; c.why = "block_m 64, wide w2"; add(c);
    c = base_case(); c.M = 3; c.topk = 2; c.E = 2; c.H = 4224; c.I = 64;
    c.gs = -1; c.why = "w2 N > 4096 at block_m 16"; add(c);
    /* GEMM 2 at block_m 8 from N 6144: the table's 128-column row */
    c = base_case(); c.M = 3; c.topk = 2; c.E = 4; c.H = 7168; c.I = 128;
    c.why = "w2 N >= 6144 at block_m 8 (128 columns)"; add(c);
    c.act_order = true; c.why = "w2 N >= 6144 at block_m 8, act order"; add(c);
    /* GEMM 1's split-K sums: in the GEMM (the small cases above, one
     * wave), or in the reduce kernel when its CTAs take more than one
     * wave (here 2 experts x 128 column tiles x 2 splits on an H200) */
    c = base_case(); c.M = 1; c.topk = 2; c.E = 2; c.H = 256; c.I = 16384;
    c.why = "split-K sums in the reduce kernel (GEMM 1 past a wave)";
    add(c);
    /* the wgmma rows (block_m 128 from 57 routed slots per expert; on
     * an sm_90 device the wgmma template runs them, elsewhere mma.sync):
     * 4/8-bit, zero points, channelwise, F16, groups of 32, bias, ragged
     * N, the batched format, an expert map */
    for (int v = 0; v < 8; v++) {
        c = base_case();
        c.M = v == 5 ? 513 : 601 + 37 * v; /* >= 512: 128 slots an expert */
        c.H = v == 5 ? 384 : 256;
        c.I = v == 5 ? 192 : 128;
        c.bits = v == 1 || v == 4 ? 8 : 4;
        c.zp = v == 2;
        /* gs 32 (v 6): groups change between the k16 steps of a stage */
        c.gs = v == 3 || v == 4 ? -1 : (v == 5 ? 64 : v == 6 ? 32 : 128);
        c.act = v == 3 || v == 6 ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
        c.scale = v == 7 ? WNA16_DTYPE_F16 : c.act;
        c.bias = v == 3 || v == 7;
        c.map = v == 7;
        c.round = v == 2;
        c.why = "wgmma rows";
        add(c);
    }
    c = base_case(); c.batched = true; c.max_tokens = 130; c.weights = true;
    c.why = "wgmma rows, batched"; add(c);
    /* the wgmma rows between 64 and 128 rows (block_m 80, 96, 112: 52, 70
     * and 85 routed slots an expert), 4-bit with zero points, 8-bit, F16 */
    static const int32_t mid[] = {208, 280, 340};
    for (size_t i = 0; i < W16_ARRAY_LEN(mid); i++) {
        c = base_case();
        c.M = mid[i];
        c.zp = i == 0;
        c.bits = i == 1 ? 8 : 4;
        c.act = c.scale = i == 2 ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
        c.why = "wgmma rows of 80-112";
        add(c);
    }
    /* 512 routed slots an expert and more (a table's block_m 256 rows:
     * one m64 slice a warpgroup, m64n256k16 products; the built-in table
     * has none, measured slower): zero points and a ragged w2 N (320 =
     * 2.5 tiles of 128), then 8-bit channelwise F16 with bias */
    c = base_case(); c.M = 1100; c.topk = 1; c.E = 2; c.H = 320; c.I = 192;
    c.gs = 64; c.zp = true; c.why = "wgmma rows, block_m 256"; add(c);
    c = base_case(); c.M = 600; c.topk = 2; c.E = 2; c.I = 256; c.bits = 8;
    c.gs = -1; c.act = WNA16_DTYPE_F16; c.scale = WNA16_DTYPE_F16;
    c.bias = true; c.why = "wgmma rows, block_m 256, 8-bit"; add(c);
    /* the batched format */
    static const int32_t bt[] = {1, 5, 37, 64, 100};
    for (size_t i = 0; i < W16_ARRAY_LEN(bt); i++) {
        c = base_case();
        c.batched = true;
        c.max_tokens = bt[i];
        c.weights = i % 2 == 0;
        c.on_input = i == 2;
        c.act_order = i == 3;
        c.gs = i == 3 ? 64 : c.gs;
        c.bits = i == 4 ? 8 : 4;
        c.why = "batched";
        add(c);
    }
    /* layers given as device tensors */
    c = base_case(); c.device_tensors = true; c.M = 12; c.zp = true;
    c.bias = true; c.why = "device tensors"; add(c);
    /* the output where the finalize cannot store four columns at once
     * (device buffers, out 2 bytes past an 8-byte boundary): without and
     * with GEMM 2 split-K sums, and the small finalize */
    c = base_case(); c.odd_out = true; c.M = 300; c.why = "odd out"; add(c);
    c = base_case(); c.odd_out = true; c.M = 150; c.E = 16; c.H = 1024;
    c.I = 256; c.why = "odd out, split-K"; add(c);
    c = base_case(); c.odd_out = true; c.M = 2; c.E = 256; c.topk = 8;
    c.why = "odd out, small finalize"; add(c);

    /* random fill */
    tu_rng_t r;
    tu_rng_seed(&r, 7);
    static const int32_t Es[] = {1, 2, 3, 4, 8, 8, 16, 32, 64, 128, 256};
    static const int32_t Ms[] = {1, 2, 3, 5, 7, 13, 33, 64, 123, 222, 666};
    static const int32_t Hs[] = {128, 256, 384, 512};
    static const int32_t Is[] = {64, 96, 128, 160, 192, 256, 320, 384};
    static const int gss[] = {-1, 32, 64, 128};
    while (n_cases < N_CASES) {
        c = base_case();
        c.why = "random";
        c.E = Es[tu_rng_below(&r, W16_ARRAY_LEN(Es))];
        c.H = Hs[tu_rng_below(&r, W16_ARRAY_LEN(Hs))];
        c.I = Is[tu_rng_below(&r, W16_ARRAY_LEN(Is))];
        c.bits = tu_rng_below(&r, 3) ? 4 : 8;
        c.gs = gss[tu_rng_below(&r, 4)];
        c.zp = c.bits == 4 && tu_rng_below(&r, 2);
        c.act_order = tu_rng_below(&r, 4) == 0;
        c.bias = tu_rng_below(&r, 3) == 0;
        c.act = tu_rng_below(&r, 2) ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
        c.scale = tu_rng_below(&r, 5) ? c.act
                  : (c.act == WNA16_DTYPE_F16 ? WNA16_DTYPE_BF16
                                               : WNA16_DTYPE_F16);
        c.fn = (wna16_activation_t)tu_rng_below(&r, 5);
        c.limit = tu_rng_below(&r, 4) ? 7.0f : INFINITY;
        c.batched = tu_rng_below(&r, 6) == 0;
        c.round = tu_rng_below(&r, 5) == 0;
        c.on_input = tu_rng_below(&r, 8) == 0;
        c.repeat = tu_rng_below(&r, 10) == 0;
        c.device_tensors = tu_rng_below(&r, 6) == 0;
        if (c.batched) {
            c.max_tokens = 1 + (int32_t)tu_rng_below(&r, 80);
            c.weights = tu_rng_below(&r, 2);
        } else {
            c.M = Ms[tu_rng_below(&r, W16_ARRAY_LEN(Ms))];
            c.map = tu_rng_below(&r, 5) == 0;
            int32_t kmax = c.E < 10 ? c.E : 10;
            c.topk = 1 + (int32_t)tu_rng_below(&r, (uint32_t)kmax);
            c.active = tu_rng_below(&r, 3) == 0
                           ? 1 + (int32_t)tu_rng_below(&r, (uint32_t)c.E) : 0;
            if (c.active && c.active < c.topk)
                c.active = c.topk;
        }
        if (valid(&c))
            add(c);
    }
    for (int i = 0; i < n_cases; i++)
        if (!valid(&cases[i])) {
            fprintf(stderr, "anchor case %d (%s) is not valid\n", i,
                    cases[i].why);
            exit(1);
        }
}

/* ---- one case --------------------------------------------------------- */

static float exact_in(wna16_dtype_t dt, double v)
{
    return mt_round_act(dt, (float)v);
}

static int make_operand(tu_rng_t *r, const tcase_t *c, wna16_qweight_t *qw,
                        int32_t N, int32_t K)
{
    wna16_error_t err;
    if (wna16_qweight_alloc(qw, c->E, N, K, c->bits, c->gs, c->zp,
                            c->act_order, c->bias, &err) != WNA16_OK) {
        fprintf(stderr, "qweight_alloc: %s\n", err.message);
        return -1;
    }
    qw->scale_dtype = c->scale;
    qw->bias_dtype = c->scale;
    size_t ncodes = (size_t)c->E * N * K, ngroups = (size_t)c->E * qw->G * N;
    for (size_t i = 0; i < ncodes; i++)
        qw->codes[i] = (uint8_t)tu_rng_below(r, 1u << c->bits);
    for (size_t i = 0; i < ngroups; i++)
        qw->scales[i] = exact_in(c->scale, mt_uniform(r, 0.25, 0.5) /
                                               (double)(1 << (c->bits - 1)));
    if (c->zp)
        for (size_t i = 0; i < ngroups; i++)
            qw->zeros[i] = (uint8_t)tu_rng_below(r, 1u << c->bits);
    if (c->act_order) {
        /* desc_act: each group holds gs channels in a shuffled order; one
         * case in four has uneven random groups */
        int32_t *perm = malloc((size_t)K * sizeof *perm);
        if (!perm)
            return -1;
        for (int32_t e = 0; e < c->E; e++) {
            bool uneven = tu_rng_below(r, 4) == 0;
            for (int32_t k = 0; k < K; k++)
                perm[k] = k;
            for (int32_t k = K - 1; k > 0; k--) {
                int32_t j = (int32_t)tu_rng_below(r, (uint32_t)k + 1);
                int32_t t = perm[k];
                perm[k] = perm[j];
                perm[j] = t;
            }
            for (int32_t k = 0; k < K; k++)
                qw->g_idx[(size_t)e * K + k] =
                    uneven ? (int32_t)tu_rng_below(r, (uint32_t)qw->G)
                           : perm[k] / c->gs;
        }
        free(perm);
    }
    if (c->bias)
        for (size_t i = 0; i < (size_t)c->E * N; i++)
            qw->bias[i] = exact_in(c->scale, mt_uniform(r, -1.0, 1.0));
    return 0;
}

/* Device copies of every tensor of a set, viewed by a second set whose
 * data are device addresses. */
typedef struct dev_set {
    wna16_tensor_set_t *set;
    uint64_t ptr[32];
    int n;
} dev_set_t;

static int upload_set(wna16_context_t *ctx, w16_cuda_t *cuda,
                      const wna16_tensor_set_t *src, dev_set_t *d)
{
    wna16_error_t err;
    memset(d, 0, sizeof *d);
    if (wna16_tensor_set_create(ctx, &d->set, &err) != WNA16_OK)
        return -1;
    for (size_t i = 0; i < wna16_tensor_set_count(src) && i < 32; i++) {
        wna16_tensor_t t = *wna16_tensor_set_at(src, i);
        uint64_t p = 0;
        if (w16_cuda_alloc(cuda, t.nbytes, &p, &err) != WNA16_OK ||
            w16_cuda_copy_h2d(cuda, p, t.data, t.nbytes, &err) != WNA16_OK)
            return -1;
        d->ptr[d->n++] = p;
        t.data = (void *)(uintptr_t)p;
        if (wna16_tensor_set_add_view(d->set, &t, &err) != WNA16_OK)
            return -1;
    }
    return 0;
}

static void free_dev_set(w16_cuda_t *cuda, dev_set_t *d)
{
    for (int i = 0; i < d->n; i++)
        w16_cuda_free(cuda, d->ptr[i]);
    wna16_tensor_set_destroy(d->set);
}

typedef struct result {
    bool ok;                 /* compared (else `msg` says what failed) */
    char msg[600];
    long bad, total;
    double worst;            /* largest |gpu - ref| / bound */
    bool deterministic;
    char kernels[2][160];
    double compile_ms[3];
} result_t;

/* Shared by the worker threads (at most MAX_THREADS: --threads). */
enum { MAX_THREADS = 32 };
static wna16_context_t *g_ctx;
static w16_cuda_t *g_cuda;
static const wna16_spec_t *g_marlin, *g_batched;

/* wna16_cuda_moe_run_device on device copies of the inputs, the output
 * 2 bytes past an 8-byte boundary (the finalize's one-column path), then
 * the output back in `got`. */
static wna16_status_t run_odd_out(wna16_cuda_moe_t *moe,
                                  const wna16_moe_params_t *p,
                                  const uint16_t *hidden, int32_t M,
                                  int32_t H, const int32_t *ids,
                                  const float *w, int32_t topk, uint16_t *got,
                                  wna16_error_t *err)
{
    size_t hb = (size_t)M * H * 2, sb = (size_t)M * topk * 4;
    size_t oh = 0, oi = (hb + 255) / 256 * 256, ow = oi + (sb + 255) / 256 * 256;
    size_t oo = ow + (sb + 255) / 256 * 256 + 2;
    uint64_t d = 0;
    wna16_status_t st = w16_cuda_alloc(g_cuda, oo + hb, &d, err);
    if (st != WNA16_OK)
        return st;
    st = w16_cuda_copy_h2d(g_cuda, d + oh, hidden, hb, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(g_cuda, d + oi, ids, sb, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(g_cuda, d + ow, w, sb, err);
    if (st == WNA16_OK)
        st = wna16_cuda_moe_run_device(moe, p, d + oh, M, d + oi, d + ow, topk,
                                       d + oo, NULL, err);
    if (st == WNA16_OK)
        st = wna16_cuda_moe_sync(moe, NULL, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_d2h(g_cuda, got, d + oo, hb, err);
    w16_cuda_free(g_cuda, d);
    return st;
}
static result_t results[N_CASES];
static int next_case;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* WNA16_TEST_MOE_DRY=1 (a harness check for machines without a GPU, not
 * a test of the kernels): the "GPU" output is the reference's own, so the
 * cases, the encoder, the reference and the bound run end to end. */
static bool dry;

static void fail(result_t *res, const char *what, const wna16_error_t *err)
{
    snprintf(res->msg, sizeof res->msg, "%s: %s", what,
             err ? err->message : "");
}

static void run_case(const tcase_t *c, result_t *res)
{
    wna16_error_t err;
    tu_rng_t r;
    tu_rng_seed(&r, c->seed);
    wna16_qlayer_t L = {.E = c->E, .H = c->H, .I = c->I};
    wna16_tensor_set_t *set = NULL;
    wna16_cuda_moe_t *moe = NULL;
    dev_set_t dev = {0};
    bool have_dev = false;
    uint16_t *hidden = NULL, *ref = NULL, *got = NULL, *got2 = NULL;
    int32_t *ids = NULL, *counts = NULL, *map = NULL;
    float *w = NULL;
    double *bound = NULL;
    w16_moe_bound_t b = {0};
    const wna16_spec_t *spec = c->batched ? g_batched : g_marlin;

    if (make_operand(&r, c, &L.w13, 2 * c->I, c->H) ||
        make_operand(&r, c, &L.w2, c->H, c->I)) {
        fail(res, "random layer", NULL);
        goto out;
    }
    if (wna16_tensor_set_create(g_ctx, &set, &err) != WNA16_OK ||
        wna16_ref_encode(g_ctx, spec, &L, "L", set, &err) != WNA16_OK) {
        fail(res, "encode", &err);
        goto out;
    }
    wna16_quant_desc_t q = {.bits = c->bits, .group_size = c->gs,
                            .zero_point = c->zp, .act_order = c->act_order,
                            .bias = c->bias};
    const wna16_tensor_set_t *src = set;
    if (c->device_tensors && !dry) {
        have_dev = true;
        if (upload_set(g_ctx, g_cuda, set, &dev)) {
            fail(res, "device copies", NULL);
            goto out;
        }
        src = dev.set;
    }
    if (!dry &&
        wna16_cuda_moe_create(g_ctx, spec, src, "L", c->E, c->H, c->I, &q,
                              c->device_tensors, &moe, &err) != WNA16_OK) {
        fail(res, "wna16_cuda_moe_create", &err);
        goto out;
    }

    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.activation = c->fn;
    p.swiglu_limit = c->limit;
    p.act_dtype = c->act;
    p.apply_router_weight_on_input = c->on_input;
    p.round_gemm_outputs = c->round;
    int32_t rows = c->batched ? c->E * c->max_tokens : c->M;
    size_t nout = (size_t)rows * c->H;
    hidden = malloc(nout * 2);
    ref = malloc(nout * 2);
    got = malloc(nout * 2);
    got2 = malloc(nout * 2);
    bound = calloc(nout, sizeof *bound);
    int32_t nslots = c->batched ? rows : c->M * c->topk;
    w = malloc((size_t)(nslots ? nslots : 1) * sizeof *w);
    if (!hidden || !ref || !got || !got2 || !bound || !w) {
        fail(res, "out of memory", NULL);
        goto out;
    }
    mt_random_act(&r, c->act, hidden, nout, -1.0, 1.0);
    for (int32_t i = 0; i < nslots; i++)
        w[i] = (float)mt_uniform(&r, 0.05, 1.0);

    wna16_status_t sg, sr;
    if (c->batched) {
        counts = malloc((size_t)c->E * sizeof *counts);
        if (!counts) {
            fail(res, "out of memory", NULL);
            goto out;
        }
        for (int32_t e = 0; e < c->E; e++)
            counts[e] = tu_rng_below(&r, 4) == 0
                            ? 0 : (int32_t)tu_rng_below(&r, (uint32_t)c->max_tokens + 1);
        counts[tu_rng_below(&r, (uint32_t)c->E)] = c->max_tokens;
        const float *wt = c->weights ? w : NULL;
        sr = wna16_ref_moe_batched(&L, &p, hidden, c->max_tokens, counts, wt,
                                   ref, &err);
        if (sr != WNA16_OK) {
            fail(res, "reference", &err);
            goto out;
        }
        sg = dry ? wna16_ref_moe_batched(&L, &p, hidden, c->max_tokens,
                                         counts, wt, got, &err)
                 : wna16_cuda_moe_run_batched(moe, &p, hidden, c->max_tokens,
                                              counts, wt, got, &err);
        if (sg == WNA16_OK && c->repeat && !dry)
            sg = wna16_cuda_moe_run_batched(moe, &p, hidden, c->max_tokens,
                                            counts, wt, got2, &err);
    } else {
        int32_t n_glob = c->E;
        if (c->map || c->ep8_local) {
            /* twice (eight times) as many global experts; one of every two
             * (eight) is local */
            int32_t every = c->ep8_local ? 8 : 2;
            n_glob = every * c->E;
            map = malloc((size_t)n_glob * sizeof *map);
            if (!map) {
                fail(res, "out of memory", NULL);
                goto out;
            }
            for (int32_t g = 0; g < n_glob; g++)
                map[g] = g % every ? -1 : g / every;
            p.expert_map = map;
            p.global_num_experts = n_glob;
        }
        ids = malloc((size_t)nslots * sizeof *ids);
        if (!ids) {
            fail(res, "out of memory", NULL);
            goto out;
        }
        int32_t pool = c->map ? n_glob : c->active;
        for (int32_t m = 0; m < c->M; m++)
            for (int32_t j = 0; j < c->topk; j++) {
                int32_t id;
                bool dup;
                do { /* distinct experts per token, as top-k gives */
                    id = (int32_t)tu_rng_below(&r, (uint32_t)pool);
                    if (c->ep8_local) /* pool: the E local experts */
                        id *= 8;
                    dup = false;
                    for (int32_t j2 = 0; j2 < j; j2++)
                        dup |= ids[(size_t)m * c->topk + j2] == id;
                } while (dup);
                ids[(size_t)m * c->topk + j] = id;
            }
        sr = wna16_ref_moe(&L, &p, hidden, c->M, ids, w, c->topk, ref, &err);
        if (sr != WNA16_OK) {
            fail(res, "reference", &err);
            goto out;
        }
        if (c->odd_out && !dry)
            sg = run_odd_out(moe, &p, hidden, c->M, c->H, ids, w, c->topk,
                             got, &err);
        else
            sg = dry ? wna16_ref_moe(&L, &p, hidden, c->M, ids, w, c->topk,
                                     got, &err)
                     : wna16_cuda_moe_run(moe, &p, hidden, c->M, ids, w,
                                          c->topk, got, &err);
        if (sg == WNA16_OK && c->repeat && !dry)
            sg = wna16_cuda_moe_run(moe, &p, hidden, c->M, ids, w, c->topk,
                                    got2, &err);
    }
    if (sg != WNA16_OK) {
        fail(res, "wna16_cuda_moe_run", &err);
        goto out;
    }
    wna16_cuda_moe_report_t rep = {0};
    if (moe)
        wna16_cuda_moe_last_report(moe, &rep);
    memcpy(res->kernels, rep.kernel, sizeof res->kernels);
    memcpy(res->compile_ms, rep.compile_ms, sizeof res->compile_ms);
    res->deterministic = dry || !c->repeat || memcmp(got, got2, nout * 2) == 0;

    /* the bound, expert by expert (runtime/ref/moe_bound.h) */
    b.L = &L;
    b.p = &p;
    b.act_dtype = c->act;
    b.round = c->round;
    b.gated = true;
    int pbits = c->act == WNA16_DTYPE_F16 ? 11 : 8;
    bool grouped13 = c->gs > 0 && c->gs < c->H, grouped2 = c->gs > 0 &&
                                                          c->gs < padded(c->I, c->gs);
    b.eps_w13 = grouped13 ? ldexp(1.0, -pbits) : 0.0;
    b.eps_w2 = grouped2 ? ldexp(1.0, -pbits) : 0.0;
    /* tensor cores may truncate when they add: 2^-23 a step */
    b.eps13 = c->H * 0x1p-23;
    b.eps2 = padded(c->I, c->gs) * 0x1p-23;
    float *x = malloc((size_t)c->H * sizeof(float));
    if (!x || !w16_moe_bound_init(&b)) {
        free(x);
        fail(res, "out of memory", NULL);
        goto out;
    }
    for (int32_t e = 0; e < c->E; e++) {
        bool loaded = false;
        for (int32_t row = 0; row < (c->batched ? c->max_tokens : nslots);
             row++) {
            int32_t m, le;
            double cw;
            if (c->batched) {
                if (row >= counts[e])
                    break;
                m = e * c->max_tokens + row;
                le = e;
                cw = c->weights && !c->on_input ? w[m] : 1.0;
            } else {
                int32_t g = ids[row];
                le = map ? map[g] : g;
                if (le != e)
                    continue;
                m = row / c->topk;
                cw = c->on_input ? 1.0 : w[row];
            }
            if (!loaded) {
                w16_moe_bound_expert(&b, e);
                loaded = true;
            }
            const uint16_t *xr = hidden + (size_t)m * c->H;
            double wr = c->batched ? (c->weights ? w[m] : 1.0) : w[row];
            bool scale_in = c->on_input && (c->batched ? c->weights : true);
            float rw = mt_round_act(c->act, (float)wr);
            for (int32_t k = 0; k < c->H; k++) {
                float v = mt_from_act(c->act, xr[k]);
                x[k] = scale_in ? mt_round_act(c->act, v * rw) : v;
            }
            w16_moe_bound_row(&b, e, x, cw, bound + (size_t)m * c->H);
        }
    }
    free(x);
    res->ok = true;
    for (size_t i = 0; i < nout; i++) {
        double gv = mt_from_act(c->act, got[i]), rv = mt_from_act(c->act, ref[i]);
        double bd = bound[i] + w16_act_ulp(c->act, rv);
        double d = fabs(gv - rv);
        res->total++;
        if (!(d <= 2.0 * bd + 1e-30)) {
            if (res->bad++ == 0)
                snprintf(res->msg, sizeof res->msg, "output %zu (row %zu, col "
                         "%zu): gpu %.9g ref %.9g bound %.3g", i,
                         i / (size_t)c->H, i % (size_t)c->H, gv, rv, bd);
        }
        double ratio = bd > 0 ? d / bd : (d > 0 ? INFINITY : 0);
        if (ratio > res->worst)
            res->worst = ratio;
    }
out:
    w16_moe_bound_free(&b);
    wna16_cuda_moe_destroy(moe);
    if (have_dev)
        free_dev_set(g_cuda, &dev);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
    free(hidden);
    free(ref);
    free(got);
    free(got2);
    free(bound);
    free(ids);
    free(counts);
    free(map);
    free(w);
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        int i = next_case++;
        pthread_mutex_unlock(&lock);
        if (i >= n_cases)
            return NULL;
        run_case(&cases[i], &results[i]);
    }
}

/* Bad device data is dropped by the kernels and reported by sync. */
static void test_device_errors(void)
{
    tcase_t c = base_case();
    tu_rng_t r;
    tu_rng_seed(&r, 99);
    wna16_qlayer_t L = {.E = c.E, .H = c.H, .I = c.I};
    wna16_tensor_set_t *set = NULL;
    wna16_cuda_moe_t *moe = NULL;
    wna16_error_t err;
    wna16_quant_desc_t q = {.bits = 4, .group_size = 128};
    TU_CHECK(make_operand(&r, &c, &L.w13, 2 * c.I, c.H) == 0 &&
             make_operand(&r, &c, &L.w2, c.H, c.I) == 0);
    TU_OK(wna16_tensor_set_create(g_ctx, &set, &err), &err);
    TU_OK(wna16_ref_encode(g_ctx, g_marlin, &L, "L", set, &err), &err);
    TU_OK(wna16_cuda_moe_create(g_ctx, g_marlin, set, "L", c.E, c.H, c.I, &q,
                                false, &moe, &err), &err);
    if (moe) {
        wna16_moe_params_t p;
        wna16_moe_params_init(&p);
        /* host run: checked before anything runs, as the reference does */
        int32_t ids[4] = {0, 1, 2, 8};
        float w[4] = {1, 1, 1, 1};
        uint16_t x[2 * 256] = {0}, y[2 * 256];
        wna16_status_t st = wna16_cuda_moe_run(moe, &p, x, 2, ids, w, 2, y,
                                               &err);
        TU_CHECK_MSG(st == WNA16_EINVAL && strstr(err.message,
                     "topk_ids[1][1] = 8"), "%s", err.message);
        /* device run: the kernels see it, sync reports the slot */
        uint64_t d = 0;
        size_t need = sizeof x + sizeof ids + sizeof w + sizeof y;
        TU_OK(w16_cuda_alloc(g_cuda, need, &d, &err), &err);
        TU_OK(w16_cuda_copy_h2d(g_cuda, d, x, sizeof x, &err), &err);
        TU_OK(w16_cuda_copy_h2d(g_cuda, d + sizeof x, ids, sizeof ids, &err),
              &err);
        TU_OK(w16_cuda_copy_h2d(g_cuda, d + sizeof x + sizeof ids, w, sizeof w,
                                &err), &err);
        TU_OK(wna16_cuda_moe_run_device(moe, &p, d, 2, d + sizeof x,
                                        d + sizeof x + sizeof ids, 2,
                                        d + sizeof x + sizeof ids + sizeof w,
                                        NULL, &err), &err);
        st = wna16_cuda_moe_sync(moe, NULL, &err);
        TU_CHECK_MSG(st == WNA16_EINVAL && strstr(err.message,
                     "topk_ids[1][1]"), "%s", err.message);
        TU_OK(wna16_cuda_moe_sync(moe, NULL, &err), &err); /* cleared */
        /* batched counts out of range */
        int32_t counts[8] = {0, 0, 0, 0, 0, 0, 0, 9};
        TU_OK(w16_cuda_copy_h2d(g_cuda, d + sizeof x, counts, sizeof counts,
                                &err), &err);
        wna16_cuda_moe_t *bm = NULL;
        wna16_tensor_set_t *bset = NULL;
        TU_OK(wna16_tensor_set_create(g_ctx, &bset, &err), &err);
        TU_OK(wna16_ref_encode(g_ctx, g_batched, &L, "L", bset, &err), &err);
        TU_OK(wna16_cuda_moe_create(g_ctx, g_batched, bset, "L", c.E, c.H,
                                    c.I, &q, false, &bm, &err), &err);
        if (bm) {
            uint64_t big = 0;
            TU_OK(w16_cuda_alloc(g_cuda, (size_t)8 * 4 * 256 * 2 * 2, &big,
                                 &err), &err);
            TU_OK(w16_cuda_memset(g_cuda, big, 0, (size_t)8 * 4 * 256 * 2 * 2,
                                  &err), &err);
            TU_OK(wna16_cuda_moe_run_batched_device(bm, &p, big, 4,
                                                    d + sizeof x, 0,
                                                    big + 8 * 4 * 256 * 2,
                                                    NULL, &err), &err);
            st = wna16_cuda_moe_sync(bm, NULL, &err);
            TU_CHECK_MSG(st == WNA16_EINVAL && strstr(err.message,
                         "expert_num_tokens[7]"), "%s", err.message);
            w16_cuda_free(g_cuda, big);
        }
        wna16_cuda_moe_destroy(bm);
        wna16_tensor_set_destroy(bset);
        /* non-gated activations have no stacked layout yet */
        p.activation = WNA16_ACT_SILU_NO_MUL;
        st = wna16_cuda_moe_run(moe, &p, x, 2, ids, w, 1, y, &err);
        TU_CHECK_MSG(st == WNA16_EUNSUPPORTED, "%s", err.message);
        w16_cuda_free(g_cuda, d);
    }
    wna16_cuda_moe_destroy(moe);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

int main(int argc, char **argv)
{
    wna16_error_t err;
    const char *dry_env = getenv("WNA16_TEST_MOE_DRY");
    dry = dry_env && strcmp(dry_env, "1") == 0;
    if (!dry && !w16_nvrtc_available(NULL, &err))
        tu_skip(err.message);
    g_ctx = tu_context();
    if (!dry && w16_cuda_get(g_ctx, &g_cuda, &err) != WNA16_OK) {
        wna16_context_destroy(g_ctx);
        tu_skip(err.message);
    }
    g_marlin = wna16_spec_find(g_ctx, WNA16_SPEC_BACKEND, "marlin");
    g_batched = wna16_spec_find(g_ctx, WNA16_SPEC_BACKEND, "batched_marlin");
    TU_CHECK(g_marlin && g_batched);
    if (dry)
        printf("dry run: the reference stands in for the GPU\n");
    else
        printf("device: %s, sm_%d%d, %s\n", w16_cuda_device_name(g_cuda),
               w16_cuda_cc_major(g_cuda), w16_cuda_cc_minor(g_cuda),
               w16_cuda_driver_version(g_cuda));
    build_cases();
    /* argv: N runs only case N (a reproducer); --stride S runs every S-th
     * case (the dry run in CI); --why TEXT only the cases whose reason
     * contains TEXT (a tiling row's cases, e.g. under a $WNA16_SPEC_DIR
     * table); --threads T runs T cases at once (default 8; the cases'
     * NVRTC compiles and CPU references are most of the time, so a
     * machine with more cores finishes sooner) */
    int only = -1, stride = 1, nt = 8;
    const char *why = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stride") == 0 && i + 1 < argc)
            stride = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            nt = atoi(argv[++i]);
        else if (strcmp(argv[i], "--why") == 0 && i + 1 < argc)
            why = argv[++i];
        else
            only = atoi(argv[i]);
    }
    nt = nt < 1 ? 1 : nt > MAX_THREADS ? MAX_THREADS : nt;
    if (only >= 0 && only < n_cases) {
        run_case(&cases[only], &results[only]);
    } else {
        only = -1;
        if (stride > 1 || why) { /* keep every stride-th case (of why) */
            int k = 0, seen = 0;
            for (int i = 0; i < n_cases; i++)
                if (!why || strstr(cases[i].why, why))
                    if (seen++ % stride == 0)
                        cases[k++] = cases[i];
            n_cases = k;
        }
        pthread_t th[MAX_THREADS];
        for (int i = 0; i < nt; i++)
            pthread_create(&th[i], NULL, worker, NULL);
        for (int i = 0; i < nt; i++)
            pthread_join(th[i], NULL);
    }
    double worst = 0, cold_ms = 0;
    int n_cold = 0;
    for (int i = 0; i < n_cases; i++) {
        if (only >= 0 && i != only)
            continue;
        const tcase_t *c = &cases[i];
        const result_t *r = &results[i];
        char desc[400];
        snprintf(desc, sizeof desc, "case %d (%s): %s E=%d H=%d I=%d %s=%d "
                 "topk=%d b%d gs=%d%s%s%s %s/%s %s%s%s%s%s", i, c->why,
                 c->batched ? "batched" : "standard", c->E, c->H, c->I,
                 c->batched ? "max_tokens" : "M",
                 c->batched ? c->max_tokens : c->M, c->topk, c->bits, c->gs,
                 c->zp ? " zp" : "", c->act_order ? " act-order" : "",
                 c->bias ? " bias" : "", wna16_dtype_name(c->act),
                 wna16_dtype_name(c->scale), wna16_activation_name(c->fn),
                 c->map ? " map" : c->ep8_local ? " ep8-local" : "",
                 c->on_input ? " on-input" : "",
                 c->round ? " round" : "",
                 c->device_tensors ? " device-tensors" : "");
        TU_CHECK_MSG(r->ok, "%s: %s", desc, r->msg);
        TU_CHECK_MSG(r->bad == 0, "%s: %ld of %ld outputs outside the "
                     "tolerance; first: %s", desc, r->bad, r->total, r->msg);
        TU_CHECK_MSG(r->deterministic, "%s: two runs differ", desc);
        if (r->worst > worst)
            worst = r->worst;
        for (int k = 0; k < 3; k++)
            if (r->compile_ms[k] > 0) {
                cold_ms += r->compile_ms[k];
                n_cold++;
            }
        if (only >= 0 || r->bad)
            printf("%s\n  kernels %s, %s; worst |gpu-ref|/bound %.3f\n", desc,
                   r->kernels[0], r->kernels[1], r->worst);
    }
    printf("%d cases; largest |gpu - ref| / bound: %.3f (limit 2)\n",
           only >= 0 ? 1 : n_cases, worst);
    if (n_cold)
        printf("%d cold NVRTC compiles, %.0f ms each on average (%d threads "
               "compiling at once)\n", n_cold, cold_ms / n_cold, nt);
    if (only < 0 && !dry)
        test_device_errors();
    wna16_context_destroy(g_ctx);
    return tu_finish("test_moe_cuda");
}
