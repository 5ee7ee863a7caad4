/*
 * test_moe_gen.c - the generated fused MoE (wna16_moe_layer_*) against the
 * reference (wna16_ref_moe, wna16_ref_moe_batched) on random
 * configurations: a random layer in logical form is encoded into a random
 * backend's stacked layout by the reference encoder (the N-first uint8
 * layouts of triton and xpu and the CPU's VNNI blocks every time, the
 * other stacked layouts in between), bound to a layer, run on the CPU
 * target and compared element by element with the reference on the same
 * logical layer.
 *
 * Each configuration draws: M from 1 to 300 (odd sizes), E up to 64,
 * top-k 1 to 8, group size -1/32/64/128, 4 or 8 bits, zero points, biases,
 * every activation in turn (gated and not), swiglu limits (none, 7, 0.5),
 * both activation dtypes, GEMM output rounding, router weights on the
 * input or the output, expert maps with absent experts, skewed routings
 * that leave experts without tokens, and the batched format (zero counts,
 * with and without weights). The tolerance is at check_close. Skips (77)
 * without LLVM.
 *
 * The reference runs under the numeric contract the layer reports
 * (wna16_moe_layer_numerics: int8-dynamic for the CPU layout on hosts with
 * AVX512-VNNI, else f32; with $WNA16_NUMERICS=bf16-exact, test_moe_gen_bf16,
 * bf16-exact on every layout for bf16 activations, checked).
 *
 * Usage: test_moe_gen [CONFIGS [SEED [-v|-q [BACKEND]]]]   (default 100,
 * seed 0x30e; -v prints each configuration; BACKEND draws only that one)
 */
#include "moe_util.h"
#include "runtime/ref/moe_bound.h" /* w16_act_ulp */
#include "spec/spec.h" /* w16_spec_moe_takes_batched */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;
static tu_rng_t rng;
static bool verbose; /* one line per configuration */

typedef struct tcase {
    const wna16_spec_t *spec;
    wna16_qlayer_t L;
    wna16_quant_desc_t q;
    wna16_moe_params_t p;
    int32_t *map;
    bool batched;
    /* standard */
    int32_t M, topk, n_ids;
    int32_t *ids;
    float *w;
    /* batched */
    int32_t max_tokens;
    int32_t *counts;
    bool with_weights;
    uint16_t *hidden;
    size_t n_out;
} tcase_t;

static void tcase_free(tcase_t *c)
{
    wna16_qlayer_free(&c->L);
    free(c->map);
    free(c->ids);
    free(c->w);
    free(c->counts);
    free(c->hidden);
}

static int32_t pick(const int32_t *v, size_t n)
{
    return v[tu_rng_below(&rng, (uint32_t)n)];
}

/* ---- random layers -------------------------------------------------------- */

/* A value m / 128 * 2^-sh with m < 128: exact in fp16 and bf16 alike, so
 * every layout holds it whatever float dtype it stores. */
static float exact7(int sh)
{
    float v = (float)(1 + tu_rng_below(&rng, 127)) / 128.0f;
    return ldexpf(v, -sh);
}

static int operand(wna16_qweight_t *qw, int32_t E, int32_t N, int32_t K,
                   const wna16_quant_desc_t *q, wna16_dtype_t sd)
{
    wna16_error_t err;
    if (wna16_qweight_alloc(qw, E, N, K, q->bits, q->group_size,
                            q->zero_point, false, q->bias, &err) != WNA16_OK) {
        fprintf(stderr, "qweight_alloc: %s\n", err.message);
        return -1;
    }
    qw->scale_dtype = sd;
    qw->bias_dtype = sd;
    size_t nc = (size_t)E * N * K, ng = (size_t)E * qw->G * N;
    for (size_t i = 0; i < nc; i++)
        qw->codes[i] = (uint8_t)tu_rng_below(&rng, 1u << q->bits);
    /* |W| <~ 1/sqrt(K) keeps h, a and y about 1 (no f16 overflow) */
    int sh = q->bits - 1;
    for (int32_t k = K; k > 1; k /= 4)
        sh++;
    for (size_t i = 0; i < ng; i++)
        qw->scales[i] = exact7(sh);
    if (qw->zeros)
        for (size_t i = 0; i < ng; i++)
            qw->zeros[i] = (uint8_t)tu_rng_below(&rng, 1u << q->bits);
    if (qw->bias)
        for (size_t i = 0; i < (size_t)E * N; i++)
            qw->bias[i] = tu_rng_below(&rng, 2) ? exact7(1) : -exact7(1);
    return 0;
}

/* Backends the test draws from: the (triton, xpu, cpu) by turns,
 * then any other stacked layout (those that hold no codes, such as the
 * dequantized emulation layout, are refused by the layer and drawn
 * again). */
static const char *only_backend; /* argv[4]: draw only this one */

static const wna16_spec_t *pick_backend(int b)
{
    static const char *const main_ones[] = {"triton", "xpu", "cpu"};
    if (only_backend)
        return wna16_spec_find(ctx, WNA16_SPEC_BACKEND, only_backend);
    if (b < 3)
        return wna16_spec_find(ctx, WNA16_SPEC_BACKEND, main_ones[b]);
    for (;;) {
        const wna16_spec_t *s = wna16_spec_at(
            ctx, tu_rng_below(&rng, (uint32_t)wna16_spec_count(ctx)));
        if (wna16_spec_kind(s) == WNA16_SPEC_BACKEND ||
            strcmp(wna16_spec_name(s), "moe_wna16") == 0)
            return s;
    }
}

/* ---- random routings ------------------------------------------------------ */

static void shuffle(int32_t *v, int32_t n)
{
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)tu_rng_below(&rng, (uint32_t)i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* Expert parallelism: E of n_ids global experts live here. */
static void random_map(tcase_t *c)
{
    int32_t E = c->L.E;
    c->n_ids = E + 1 + (int32_t)tu_rng_below(&rng, (uint32_t)E + 1);
    c->map = malloc(sizeof(int32_t) * (size_t)c->n_ids);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)c->n_ids);
    for (int32_t g = 0; g < c->n_ids; g++)
        perm[g] = g;
    shuffle(perm, c->n_ids);
    for (int32_t g = 0; g < c->n_ids; g++)
        c->map[g] = -1;
    for (int32_t e = 0; e < E; e++)
        c->map[perm[e]] = e;
    free(perm);
    c->p.expert_map = c->map;
    c->p.global_num_experts = c->n_ids;
}

/* top-k distinct ids per token, from a subset of the experts when skewed
 * (so that some experts get no tokens). */
static void random_ids(tcase_t *c)
{
    int32_t pool = c->n_ids;
    if (tu_rng_below(&rng, 3) == 0 && pool > c->topk)
        pool = c->topk + (int32_t)tu_rng_below(&rng, (uint32_t)(pool - c->topk));
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)c->n_ids);
    for (int32_t g = 0; g < c->n_ids; g++)
        cand[g] = g;
    shuffle(cand, c->n_ids); /* the subset: the first `pool` */
    size_t slots = (size_t)c->M * c->topk;
    c->ids = malloc(sizeof(int32_t) * (slots ? slots : 1));
    c->w = malloc(sizeof(float) * (slots ? slots : 1));
    int32_t *row = malloc(sizeof(int32_t) * (size_t)pool);
    for (int32_t m = 0; m < c->M; m++) {
        memcpy(row, cand, sizeof(int32_t) * (size_t)pool);
        shuffle(row, pool);
        for (int32_t j = 0; j < c->topk; j++) {
            c->ids[(size_t)m * c->topk + j] = row[j];
            c->w[(size_t)m * c->topk + j] = (float)mt_uniform(&rng, 0.05, 1.0);
        }
    }
    free(row);
    free(cand);
}

/* ---- one configuration ----------------------------------------------------- */

/* Configuration i: activation i % 8 with backend class (i / 8) % 4 (so
 * every backend meets every activation), the rest drawn. */
static int backend_class(int i) { return (i / WNA16_ACT_COUNT_) % 4; }

/* Draws configuration i; false when allocation fails. */
static bool make_case(int i, tcase_t *c)
{
    static const int32_t gss[] = {-1, 32, 64, 128};
    static const int32_t Es[] = {1, 2, 3, 4, 7, 8, 16, 31, 64};
    static const int32_t Ms[] = {1, 2, 3, 5, 7, 13, 16, 31, 33, 64, 97, 127,
                                 128, 199, 255, 300};
    static const float limits[] = {7.0f, 0.5f, INFINITY};
    memset(c, 0, sizeof *c);
    c->spec = pick_backend(backend_class(i));
    wna16_moe_params_init(&c->p);
    c->p.activation = (wna16_activation_t)(i % WNA16_ACT_COUNT_);
    c->p.act_dtype = tu_rng_below(&rng, 2) ? WNA16_DTYPE_BF16 : WNA16_DTYPE_F16;
    c->p.round_gemm_outputs = tu_rng_below(&rng, 4) == 0;
    c->p.apply_router_weight_on_input = tu_rng_below(&rng, 5) == 0;
    c->p.swiglu_limit = limits[tu_rng_below(&rng, 3)];
    if (tu_rng_below(&rng, 2)) {
        c->p.swiglu_alpha = exact7(0) * 2.0f;
        c->p.swiglu_beta = exact7(0) - 0.5f;
    }
    /* the cpu layout keeps float32 scales whatever the model's dtype: a
     * layer of the activations' dtype lets it run bf16-exact when asked
     * ($WNA16_NUMERICS) */
    if (strcmp(wna16_spec_name(c->spec), "cpu") == 0)
        c->q.model_dtype = c->p.act_dtype;
    c->q.bits = tu_rng_below(&rng, 3) ? 4 : 8;
    c->q.group_size = pick(gss, 4);
    c->q.zero_point = tu_rng_below(&rng, 2);
    c->q.bias = tu_rng_below(&rng, 3) == 0;
    /* H and I multiples of the group (of 8 channelwise: ragged sizes that
     * some layouts refuse), at most 256 */
    int32_t unit = c->q.group_size > 0 ? c->q.group_size : 8;
    int32_t H = unit * (1 + (int32_t)tu_rng_below(&rng, (uint32_t)(256 / unit)));
    int32_t I = unit * (1 + (int32_t)tu_rng_below(&rng, (uint32_t)(256 / unit)));
    int32_t E = pick(Es, 9);
    c->batched = tu_rng_below(&rng, 4) == 0;
    /* keep the reference's work (M * topk * H * I) modest */
    c->M = pick(Ms, 16);
    if (E < 8 && c->M > 64)
        c->M = 1 + (int32_t)tu_rng_below(&rng, 64);
    bool gated = wna16_activation_is_gated(c->p.activation);
    c->L = (wna16_qlayer_t){.E = E, .H = H, .I = I};
    wna16_dtype_t sd = tu_rng_below(&rng, 2) ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
    /* asked for a contract ($WNA16_NUMERICS, test_moe_gen_bf16): every
     * layer is of its activations' dtype, scales too, as a model's are,
     * so bf16-exact runs wherever the activations are bf16 */
    const char *want = getenv("WNA16_NUMERICS");
    if (want && *want) {
        c->q.model_dtype = c->p.act_dtype;
        sd = c->p.act_dtype;
    }
    if (operand(&c->L.w13, E, gated ? 2 * I : I, H, &c->q, sd) ||
        operand(&c->L.w2, E, H, I, &c->q, sd))
        return false;
    if (c->batched) {
        static const int32_t mts[] = {1, 3, 8, 17, 33, 64};
        c->max_tokens = pick(mts, 6);
        c->counts = malloc(sizeof(int32_t) * (size_t)E);
        for (int32_t e = 0; e < E; e++)
            c->counts[e] = tu_rng_below(&rng, 4) == 0
                               ? 0 : (int32_t)tu_rng_below(&rng,
                                                           (uint32_t)c->max_tokens + 1);
        c->with_weights = tu_rng_below(&rng, 2);
        size_t rows = (size_t)E * c->max_tokens;
        c->w = malloc(sizeof(float) * rows);
        for (size_t r = 0; r < rows; r++)
            c->w[r] = (float)mt_uniform(&rng, 0.05, 1.0);
        c->hidden = malloc(sizeof(uint16_t) * rows * H);
        mt_random_act(&rng, c->p.act_dtype, c->hidden, rows * H, -1.0, 1.0);
        c->n_out = rows * H;
        return true;
    }
    c->n_ids = E;
    if (tu_rng_below(&rng, 4) == 0)
        random_map(c);
    c->topk = 1 + (int32_t)tu_rng_below(&rng, (uint32_t)(c->n_ids < 8 ? c->n_ids : 8));
    random_ids(c);
    c->hidden = malloc(sizeof(uint16_t) * (size_t)c->M * H);
    mt_random_act(&rng, c->p.act_dtype, c->hidden, (size_t)c->M * H, -1.0, 1.0);
    c->n_out = (size_t)c->M * H;
    return true;
}

/* ---- the size of the terms, for the tolerance ------------------------------ */

/* mag[row][n] = sum over the row's slots of |c_j| (sum_i |a_i W2[e][n][i]|
 * + |b2[e][n]|), with a computed in double from the logical layer (the
 * reference's formula). */
static void slot_mag(const tcase_t *c, int32_t e, const uint16_t *xrow,
                     float wslot, double cj, double *mag)
{
    const wna16_qlayer_t *L = &c->L;
    const wna16_moe_params_t *p = &c->p;
    wna16_dtype_t dt = p->act_dtype;
    bool gated = wna16_activation_is_gated(p->activation);
    int32_t N13 = gated ? 2 * L->I : L->I;
    double *h = malloc(sizeof(double) * (size_t)N13);
    double *a = malloc(sizeof(double) * (size_t)L->I);
    float ws = mt_round_act(dt, wslot);
    for (int32_t n = 0; n < N13; n++) {
        double s = L->w13.bias ? L->w13.bias[(size_t)e * N13 + n] : 0.0;
        for (int32_t k = 0; k < L->H; k++) {
            float v = mt_from_act(dt, xrow[k]);
            if (p->apply_router_weight_on_input)
                v = mt_round_act(dt, v * ws);
            s += (double)v * wna16_ref_dequant(&L->w13, e, n, k);
        }
        h[n] = p->round_gemm_outputs ? mt_round_act(dt, (float)s) : s;
    }
    for (int32_t i = 0; i < L->I; i++)
        a[i] = mt_round_act(dt, wna16_ref_activation(p, (float)h[i],
                                                     gated ? (float)h[L->I + i] : 0.0f));
    for (int32_t n = 0; n < L->H; n++) {
        double m = L->w2.bias ? fabs(L->w2.bias[(size_t)e * L->H + n]) : 0.0;
        for (int32_t i = 0; i < L->I; i++)
            m += fabs(a[i] * wna16_ref_dequant(&L->w2, e, n, i));
        mag[n] += fabs(cj) * m;
    }
    free(h);
    free(a);
}

static double *case_mag(const tcase_t *c)
{
    double *mag = calloc(c->n_out ? c->n_out : 1, sizeof(double));
    int32_t H = c->L.H;
    bool on_in = c->p.apply_router_weight_on_input;
    if (c->batched) {
        for (int32_t e = 0; e < c->L.E; e++)
            for (int32_t r = 0; r < c->counts[e]; r++) {
                size_t row = (size_t)e * c->max_tokens + r;
                bool wt = c->with_weights;
                slot_mag(c, e, c->hidden + row * H, wt ? c->w[row] : 1.0f,
                         wt && !on_in ? c->w[row] : 1.0, mag + row * H);
            }
        return mag;
    }
    for (int32_t m = 0; m < c->M; m++)
        for (int32_t j = 0; j < c->topk; j++) {
            size_t s = (size_t)m * c->topk + j;
            int32_t e = c->map ? c->map[c->ids[s]] : c->ids[s];
            if (e >= 0)
                slot_mag(c, e, c->hidden + (size_t)m * H, c->w[s],
                         on_in ? 1.0 : c->w[s], mag + (size_t)m * H);
        }
    return mag;
}

/* ---- comparison ------------------------------------------------------------ */

typedef struct tally {
    long exact, total, bad;
    double worst; /* largest |got - want| / tolerance */
} tally_t;

/* The kernels and the reference share every rounding point (h and y with
 * round_gemm_outputs, a, out: round to the act dtype) and differ in how
 * they sum: the kernels accumulate the H products of gemm1, the I
 * products of gemm2 and the top-k terms in float32 in the order the
 * vectorized loop takes, and evaluate the activation in float32 (libm's
 * expf/erff/tanhf); the reference sums in double and evaluates the
 * activation in double. Those differences are ~K * 2^-24 relative to the
 * size of the terms: far below an act-dtype ulp, but enough to flip a
 * rounding to the act dtype where a value sits on a boundary:
 *   - of the output itself: one act ulp of the output;
 *   - of an activation a_i (or h_i, y_j when rounded): one act ulp of that
 *     value, i.e. at most eps * |a_i W2_ni| after gemm2 (eps = 2^-7 for
 *     bf16, 2^-10 for f16, the act dtype's ulp at 1), so at most
 *     eps * mag, mag = sum_j |c_j| (sum_i |a_i W2_ni| + |b2_n|), per flip.
 * The bound allows two of each: 2 act ulps of the output + 2 eps mag
 * (mag also covers cancellation, a small output made of large terms). A
 * wrong weight, scale, zero point, group, expert, slot or activation moves
 * outputs by a sizeable fraction of mag and fails; the caller also
 * requires that 97% of the outputs are bit-identical, which a systematic
 * slip (a missed rounding point) would break. */
/* Under int8-dynamic the kernels and the reference compute the same int32
 * block sums and float32 block products in the same order (bit-identical
 * h); they differ in the activation (the kernels' vector exp and erf, the
 * reference's double libm), which can flip a's rounding as above, and a
 * flipped a can move its row's 8-bit code by one: at most max|a| / 127
 * times |W2_ni| for that code, within 2^-6 mag (q_eps) for the rows
 * drawn here. */
static void check_close(wna16_dtype_t dt, const uint16_t *got,
                        const uint16_t *want, const double *mag, size_t n,
                        tally_t *t, const char *what, double q_eps)
{
    double eps = (dt == WNA16_DTYPE_F16 ? 0x1p-10 : 0x1p-7) + q_eps;
    for (size_t i = 0; i < n; i++) {
        double g = mt_from_act(dt, got[i]), w = mt_from_act(dt, want[i]);
        t->total++;
        if (got[i] == want[i] || g == w) {
            t->exact++;
            continue;
        }
        double tol = 2.0 * w16_act_ulp(dt, w) + 2.0 * eps * mag[i];
        double r = fabs(g - w) / tol;
        if (r > t->worst || isnan(r))
            t->worst = isnan(r) ? INFINITY : r;
        if (!(fabs(g - w) <= tol)) {
            t->bad++;
            if (t->bad <= 5)
                fprintf(stderr, "%s: element %zu: got %.8g, want %.8g "
                        "(tolerance %.3g, mag %.3g)\n", what, i, g, w, tol,
                        mag[i]);
        }
    }
}

static void describe(const tcase_t *c, char *out, size_t n)
{
    snprintf(out, n, "%s E=%d H=%d I=%d b%d g%d zp%d bias%d %s %s%s%s "
             "%s M=%d topk=%d%s", wna16_spec_name(c->spec), c->L.E, c->L.H,
             c->L.I, c->q.bits, c->q.group_size, c->q.zero_point, c->q.bias,
             wna16_activation_name(c->p.activation),
             c->p.act_dtype == WNA16_DTYPE_F16 ? "f16" : "bf16",
             c->p.round_gemm_outputs ? " round" : "",
             c->p.apply_router_weight_on_input ? " on-input" : "",
             c->batched ? "batched" : "standard",
             c->batched ? c->max_tokens : c->M, c->topk,
             c->map ? " expert-map" : "");
}

/* 1 if compared, 0 if the layout refused the layer (drawn again). */
static int one(int i, tally_t *all)
{
    tcase_t c;
    if (!make_case(i, &c)) {
        tcase_free(&c);
        return 0;
    }
    char what[256];
    describe(&c, what, sizeof what);
    wna16_error_t err;
    wna16_tensor_set_t *set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    if (wna16_ref_encode(ctx, c.spec, &c.L, "m.experts", set, &err) != WNA16_OK) {
        wna16_tensor_set_destroy(set);
        tcase_free(&c);
        return 0; /* what the layout cannot hold */
    }
    int compared = 0;
    wna16_moe_layer_t *layer = NULL;
    wna16_status_t st = wna16_moe_layer_create(ctx, c.spec, set, "m.experts",
                                               c.L.E, c.L.H, c.L.I, &c.q,
                                               WNA16_TARGET_CPU, &layer, &err);
    bool main_backend = backend_class(i) < 3;
    if (st == WNA16_EUNSUPPORTED && !main_backend) {
        wna16_tensor_set_destroy(set);
        tcase_free(&c);
        return 0; /* e.g. a layout without codes */
    }
    TU_CHECK_MSG(st == WNA16_OK, "%s: layer_create: %s", what, err.message);
    uint16_t *want = malloc(sizeof(uint16_t) * (c.n_out ? c.n_out : 1));
    uint16_t *got = malloc(sizeof(uint16_t) * (c.n_out ? c.n_out : 1));
    memset(got, 0xa5, sizeof(uint16_t) * c.n_out); /* every element is written */
    if (st == WNA16_OK) {
        const float *bw = c.with_weights ? c.w : NULL;
        /* the reference under the contract the layer's kernels compute */
        wna16_numerics_t nu = wna16_moe_layer_numerics(layer);
        wna16_status_t r1 = c.batched
            ? wna16_ref_moe_batched_numerics(&c.L, &c.p, nu, c.hidden,
                                             c.max_tokens, c.counts, bw, want,
                                             &err)
            : wna16_ref_moe_numerics(&c.L, &c.p, nu, c.hidden, c.M, c.ids,
                                     c.w, c.topk, want, &err);
        size_t wl = strlen(what);
        snprintf(what + wl, sizeof what - wl, " [%s]", wna16_numerics_name(nu));
        /* asked for bf16-exact, a bf16 layer gets it on every layout (the
         * portable kernels round each weight where no dedicated kernel
         * applies) */
        const char *want_nu = getenv("WNA16_NUMERICS");
        if (want_nu && strcmp(want_nu, "bf16-exact") == 0 &&
            c.p.act_dtype == WNA16_DTYPE_BF16)
            TU_CHECK_MSG(nu == WNA16_NUMERICS_BF16_EXACT, "%s: asked "
                         "bf16-exact, runs %s", what, wna16_numerics_name(nu));
        TU_CHECK_MSG(r1 == WNA16_OK, "%s: reference: %s", what, err.message);
        wna16_status_t r2 = c.batched
            ? wna16_moe_layer_run_batched(layer, &c.p, c.hidden, c.max_tokens,
                                          c.counts, bw, got, &err)
            : wna16_moe_layer_run(layer, &c.p, c.hidden, c.M, c.ids, c.w,
                                  c.topk, got, &err);
        if (c.batched && !w16_spec_moe_takes_batched(c.spec)) {
            /* xpu: vLLM's XPUExpertsWNA16 takes the standard format only;
             * the generated MoE over its layout refuses before any work */
            TU_CHECK_MSG(r2 == WNA16_EUNSUPPORTED && strstr(err.message,
                         "kernel does not support batched activation "
                         "format") && got[0] == 0xa5a5, "%s: generated: %s "
                         "(want the batched format refused)", what,
                         r2 ? err.message : "ran");
            r2 = WNA16_EUNSUPPORTED;
        } else {
            TU_CHECK_MSG(r2 == WNA16_OK, "%s: generated: %s", what,
                         err.message);
        }
        if (r1 == WNA16_OK && r2 == WNA16_OK) {
            double *mag = case_mag(&c);
            tally_t t = {0};
            check_close(c.p.act_dtype, got, want, mag, c.n_out, &t, what,
                        nu == WNA16_NUMERICS_INT8_DYNAMIC ? 0x1p-6 : 0.0);
            TU_CHECK_MSG(t.bad == 0, "%s: %ld of %ld outside the tolerance",
                         what, t.bad, t.total);
            /* most outputs exact; a small case may miss by up to a
             * token row's worth, each within the tolerance (seed 0x7417:
             * M = 2, H = 128, 9 of 256 differ by the f32 sums' order) */
            TU_CHECK_MSG(t.exact >= 0.97 * (double)t.total ||
                             t.total - t.exact <= c.L.H,
                         "%s: only %ld of %ld bit-identical", what, t.exact,
                         t.total);
            all->exact += t.exact;
            all->total += t.total;
            all->bad += t.bad;
            if (t.worst > all->worst)
                all->worst = t.worst;
            free(mag);
            compared = 1;
            if (verbose)
                printf("%s: %ld/%ld bit-identical, worst %.3f of the "
                       "tolerance\n", what, t.exact, t.total, t.worst);
        }
    }
    wna16_moe_layer_destroy(layer);
    free(want);
    free(got);
    wna16_tensor_set_destroy(set);
    tcase_free(&c);
    return compared;
}

int main(int argc, char **argv)
{
    long want = argc > 1 ? strtol(argv[1], NULL, 10) : 100;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 0x30e;
    verbose = argc > 3 && strcmp(argv[3], "-v") == 0;
    only_backend = argc > 4 ? argv[4] : NULL;
#ifndef WNA16_HAVE_LLVM
    tu_skip("the CPU target needs LLVM 19 (install llvm-19-dev)");
#endif
    tu_rng_seed(&rng, seed);
    ctx = tu_context();
    tally_t all = {0};
    int compared = 0, tries = 0;
    /* a draw the layout refuses is drawn again with the same index */
    while (compared < want && tries < want * 20 && tu_failures <= 20) {
        compared += one(compared, &all);
        tries++;
    }
    printf("%d configurations compared (%d drawn, seed %#llx): %ld outputs, "
           "%.4f%% bit-identical, worst error %.3f of the tolerance\n",
           compared, tries, (unsigned long long)seed, all.total,
           all.total ? 100.0 * (double)all.exact / (double)all.total : 0.0,
           all.worst);
    TU_CHECK(compared >= want);
    wna16_context_destroy(ctx);
    return tu_finish("test_moe_gen");
}
