/*
 * test_moe_ref.c - the reference fused MoE (wna16_ref_moe and
 * wna16_ref_moe_batched):
 *  1. a tiny layer whose dequantized weights are small integers (4-bit
 *     codes, channelwise scale 1, implicit zero 8: value = q - 8), checked
 *     against outputs worked out by hand from the documented formula
 *     (plain, top-2, router weights on the input, an expert map with an
 *     absent expert, biases, both activation dtypes);
 *  2. an independent re-implementation in double written from the math in
 *     wna16.h (its own dequantization and activations; it shares only the
 *     float16/bfloat16 conversions), compared on random layers and routings
 *     (M 1..40, E 1..8, top-k 1..4, both dtypes, every activation, biases,
 *     weights on input/output, expert maps with absent experts, GEMM output
 *     rounding on/off). The tolerance is explained at check_close;
 *  3. determinism (two runs give the same bytes);
 *  4. the batched format against the standard one: tokens scattered into
 *     per-expert rows, run batched, then weighted and summed (bit-exact
 *     with GEMM output rounding, within the tolerance without), and with
 *     weights given, each row against a one-token standard run.
 */
#include "moe_util.h"
#include "runtime/ref/moe_bound.h" /* w16_act_ulp */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hand-checked layer ------------------------------------------------- */

/* Dequantized values of the tiny layer: E = 2, H = 4, I = 2. */
static const int8_t HAND_W13[2][4][4] = {
    {{1, 0, 0, 0}, {0, 1, 0, -1}, {1, 1, 0, 0}, {0, 0, 1, 0}},  /* e0 */
    {{-1, 0, 0, 1}, {0, 2, 0, 0}, {0, 0, 0, 1}, {1, 0, 1, 0}},  /* e1 */
};
static const int8_t HAND_W2[2][4][2] = {
    {{1, 0}, {0, 1}, {1, 1}, {2, -1}},
    {{1, 1}, {-1, 0}, {0, 2}, {0, 0}},
};

static void hand_operand(wna16_qweight_t *qw, int32_t N, int32_t K,
                         const int8_t *vals, bool bias)
{
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(qw, 2, N, K, 4, -1, false, false, bias, &err),
          &err);
    for (int32_t i = 0; i < 2 * N * K; i++)
        qw->codes[i] = (uint8_t)(vals[i] + 8); /* value = q - 8 */
    for (int32_t i = 0; i < 2 * N; i++)
        qw->scales[i] = 1.0f;
}

static void hand_layer(wna16_qlayer_t *L, bool bias)
{
    *L = (wna16_qlayer_t){.E = 2, .H = 4, .I = 2};
    hand_operand(&L->w13, 4, 4, &HAND_W13[0][0][0], bias);
    hand_operand(&L->w2, 4, 2, &HAND_W2[0][0][0], bias);
}

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* y = W2[e] a + b2 with a_i = R(silu(gate_i) * up_i), worked by hand: every
 * product is exact (small integers times act-dtype values). */
static void hand_y(wna16_dtype_t dt, const double gate[2], const double up[2],
                   int e, const double *b2, double y[4])
{
    double a[2];
    for (int i = 0; i < 2; i++)
        a[i] = mt_round_act(dt, (float)(silu_d(gate[i]) * up[i]));
    for (int n = 0; n < 4; n++)
        y[n] = HAND_W2[e][n][0] * a[0] + HAND_W2[e][n][1] * a[1] +
               (b2 ? b2[n] : 0.0);
}

static void set_row(wna16_dtype_t dt, uint16_t *dst, const double *v)
{
    for (int k = 0; k < 4; k++)
        dst[k] = mt_to_act(dt, (float)v[k]);
}

static void expect_row(wna16_dtype_t dt, const uint16_t *got,
                       const double *want, const char *what)
{
    for (int n = 0; n < 4; n++) {
        float w = mt_round_act(dt, (float)want[n]);
        float g = mt_from_act(dt, got[n]);
        TU_CHECK_MSG(g == w, "%s %s: out[%d] = %.8g, want %.8g", what,
                     wna16_dtype_name(dt), n, (double)g, (double)w);
    }
}

static const double X0[4] = {1, 2, 3, 4}, X1[4] = {0.5, -1, 2, 1};

/* Token 0 -> expert 0 (w 0.5): gate = [1, 2 - 4], up = [1 + 2, 3].
 * Token 1 -> expert 1 (w 0.25): gate = [-0.5 + 1, -2], up = [1, 0.5 + 2]. */
static void hand_plain(wna16_dtype_t dt, const wna16_qlayer_t *L)
{
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = dt;
    uint16_t x[8], out[8];
    set_row(dt, x, X0);
    set_row(dt, x + 4, X1);
    int32_t ids[2] = {0, 1};
    float w[2] = {0.5f, 0.25f};
    wna16_error_t err;
    TU_OK(wna16_ref_moe(L, &p, x, 2, ids, w, 1, out, &err), &err);
    double y[4], want[4];
    hand_y(dt, (double[]){1, -2}, (double[]){3, 3}, 0, NULL, y);
    for (int n = 0; n < 4; n++)
        want[n] = 0.5 * y[n];
    expect_row(dt, out, want, "hand token 0");
    hand_y(dt, (double[]){0.5, -2}, (double[]){1, 2.5}, 1, NULL, y);
    for (int n = 0; n < 4; n++)
        want[n] = 0.25 * y[n];
    expect_row(dt, out + 4, want, "hand token 1");
    if (dt == WNA16_DTYPE_BF16) {
        /* Spot values by hand: R(silu(1) * 3) = R(2.1931757) = 2.1875 and
         * R(silu(-2) * 3) = R(-0.7152175) = -0.71484375 in bf16. */
        TU_CHECK(wna16_bf16_to_f32(out[0]) == 1.09375f);
        TU_CHECK(wna16_bf16_to_f32(out[1]) == -0.357421875f);
    }
}

/* Top-2: token 0 also goes to expert 1 (w 0.25): gate = [-1 + 4, 4],
 * up = [4, 1 + 3]; the sum is over both slots. */
static void hand_top2(wna16_dtype_t dt, const wna16_qlayer_t *L)
{
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = dt;
    uint16_t x[4], out[4];
    set_row(dt, x, X0);
    int32_t ids[2] = {0, 1};
    float w[2] = {0.5f, 0.25f};
    wna16_error_t err;
    TU_OK(wna16_ref_moe(L, &p, x, 1, ids, w, 2, out, &err), &err);
    double y0[4], y1[4], want[4];
    hand_y(dt, (double[]){1, -2}, (double[]){3, 3}, 0, NULL, y0);
    hand_y(dt, (double[]){3, 4}, (double[]){4, 4}, 1, NULL, y1);
    for (int n = 0; n < 4; n++)
        want[n] = 0.5 * y0[n] + 0.25 * y1[n];
    expect_row(dt, out, want, "hand top-2");
}

/* Weights on the input: x * 0.5 is exact, so h halves and out = y. */
static void hand_on_input(wna16_dtype_t dt, const wna16_qlayer_t *L)
{
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = dt;
    p.apply_router_weight_on_input = true;
    uint16_t x[4], out[4];
    set_row(dt, x, X0);
    int32_t ids[1] = {0};
    float w[1] = {0.5f};
    wna16_error_t err;
    TU_OK(wna16_ref_moe(L, &p, x, 1, ids, w, 1, out, &err), &err);
    double y[4];
    hand_y(dt, (double[]){0.5, -1}, (double[]){1.5, 1.5}, 0, NULL, y);
    expect_row(dt, out, y, "hand on-input");
}

/* Expert map over 3 global experts: g0 -> local 1, g1 absent, g2 -> 0.
 * The absent slots contribute nothing; a token with only absent slots
 * gets 0. */
static void hand_map(wna16_dtype_t dt, const wna16_qlayer_t *L)
{
    int32_t map[3] = {1, -1, 0};
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = dt;
    p.expert_map = map;
    p.global_num_experts = 3;
    uint16_t x[12], out[12];
    set_row(dt, x, X0);
    set_row(dt, x + 4, X1);
    set_row(dt, x + 8, X1);
    int32_t ids[6] = {2, 1, 1, 0, 1, 1};
    float w[6] = {0.5f, 0.9f, 0.3f, 0.25f, 0.7f, 0.7f};
    wna16_error_t err;
    TU_OK(wna16_ref_moe(L, &p, x, 3, ids, w, 2, out, &err), &err);
    double y[4], want[4];
    hand_y(dt, (double[]){1, -2}, (double[]){3, 3}, 0, NULL, y);
    for (int n = 0; n < 4; n++)
        want[n] = 0.5 * y[n];
    expect_row(dt, out, want, "hand map token 0");
    hand_y(dt, (double[]){0.5, -2}, (double[]){1, 2.5}, 1, NULL, y);
    for (int n = 0; n < 4; n++)
        want[n] = 0.25 * y[n];
    expect_row(dt, out + 4, want, "hand map token 1");
    expect_row(dt, out + 8, (double[]){0, 0, 0, 0}, "hand map absent");
}

/* Biases: b13(e0) = [1, 0, -1, 0.5] moves gate to [2, -2] and up to
 * [2, 3.5]; b2(e0) = [0.5, 0, 0, -1] is added to y. */
static void hand_bias(wna16_dtype_t dt)
{
    wna16_qlayer_t L;
    hand_layer(&L, true);
    const float b13[4] = {1, 0, -1, 0.5f}, b2[4] = {0.5f, 0, 0, -1};
    memcpy(L.w13.bias, b13, sizeof b13);
    memcpy(L.w2.bias, b2, sizeof b2);
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = dt;
    uint16_t x[4], out[4];
    set_row(dt, x, X0);
    int32_t ids[1] = {0};
    float w[1] = {0.5f};
    wna16_error_t err;
    TU_OK(wna16_ref_moe(&L, &p, x, 1, ids, w, 1, out, &err), &err);
    double y[4], want[4];
    hand_y(dt, (double[]){2, -2}, (double[]){2, 3.5}, 0,
           (double[]){0.5, 0, 0, -1}, y);
    for (int n = 0; n < 4; n++)
        want[n] = 0.5 * y[n];
    expect_row(dt, out, want, "hand bias");
    wna16_qlayer_free(&L);
}

static void test_hand(void)
{
    wna16_qlayer_t L;
    hand_layer(&L, false);
    for (int d = 0; d < 2; d++) {
        wna16_dtype_t dt = d ? WNA16_DTYPE_BF16 : WNA16_DTYPE_F16;
        hand_plain(dt, &L);
        hand_top2(dt, &L);
        hand_on_input(dt, &L);
        hand_map(dt, &L);
        hand_bias(dt);
    }
    wna16_qlayer_free(&L);
}

/* ---- independent double-precision model --------------------------------- */

static double ind_dequant(const wna16_qweight_t *qw, int32_t e, int32_t n,
                          int32_t k)
{
    int32_t g = qw->g_idx ? qw->g_idx[(size_t)e * qw->K + k]
                          : (qw->group_size > 0 ? k / qw->group_size : 0);
    size_t gi = ((size_t)e * qw->G + g) * qw->N + n;
    int z = qw->zeros ? qw->zeros[gi] : 1 << (qw->bits - 1);
    int q = qw->codes[((size_t)e * qw->N + n) * qw->K + k];
    return (double)(q - z) * (double)qw->scales[gi];
}

static double ind_sig(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ind_gelu(double x)
{
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}
static double ind_gelu_tanh(double x)
{
    double c = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * pow(x, 3.0))));
}

static double ind_act(const wna16_moe_params_t *p, double g, double u)
{
    double L = p->swiglu_limit;
    switch (p->activation) {
    case WNA16_ACT_SILU: return g * ind_sig(g) * u;
    case WNA16_ACT_GELU: return ind_gelu(g) * u;
    case WNA16_ACT_GELU_TANH: return ind_gelu_tanh(g) * u;
    case WNA16_ACT_SWIGLUOAI: {
        double gc = g < L ? g : L;
        double uc = u < -L ? -L : (u > L ? L : u);
        return (uc + p->swiglu_beta) * gc * ind_sig(p->swiglu_alpha * gc);
    }
    case WNA16_ACT_SWIGLUSTEP: {
        double s = g * ind_sig(g);
        return (s < L ? s : L) * (u < -L ? -L : (u > L ? L : u));
    }
    case WNA16_ACT_SILU_NO_MUL: return g * ind_sig(g);
    case WNA16_ACT_GELU_NO_MUL: return ind_gelu(g);
    case WNA16_ACT_RELU2_NO_MUL: return g > 0 ? g * g : 0.0;
    default: return NAN;
    }
}

/* One routing problem. */
typedef struct problem {
    const wna16_qlayer_t *L;
    const wna16_moe_params_t *p;
    const uint16_t *hidden;
    int32_t M, topk;
    const int32_t *ids;
    const float *w;
} problem_t;

/* The expert's y[H] (and sum |a W2| + |b2| in mag_y) for input x. */
static void ind_expert(const problem_t *pr, int32_t e, const double *x,
                       bool round_act_out, double *y, double *mag_y)
{
    const wna16_qlayer_t *L = pr->L;
    const wna16_moe_params_t *p = pr->p;
    wna16_dtype_t dt = p->act_dtype;
    bool gated = wna16_activation_is_gated(p->activation);
    int32_t N13 = gated ? 2 * L->I : L->I;
    double *h = malloc((size_t)N13 * sizeof *h);
    double *a = malloc((size_t)L->I * sizeof *a);
    for (int32_t n = 0; n < N13; n++) {
        double s = L->w13.bias ? L->w13.bias[(size_t)e * N13 + n] : 0.0;
        for (int32_t k = 0; k < L->H; k++)
            s += x[k] * ind_dequant(&L->w13, e, n, k);
        h[n] = p->round_gemm_outputs ? mt_round_act(dt, (float)s) : s;
    }
    for (int32_t i = 0; i < L->I; i++) {
        double v = ind_act(p, h[i], gated ? h[L->I + i] : 0.0);
        a[i] = round_act_out ? mt_round_act(dt, (float)v) : v;
    }
    for (int32_t n = 0; n < L->H; n++) {
        double b = L->w2.bias ? L->w2.bias[(size_t)e * L->H + n] : 0.0;
        double s = b, m = fabs(b);
        for (int32_t i = 0; i < L->I; i++) {
            s += a[i] * ind_dequant(&L->w2, e, n, i);
            m += fabs(a[i] * ind_dequant(&L->w2, e, n, i));
        }
        y[n] = p->round_gemm_outputs ? mt_round_act(dt, (float)s) : s;
        mag_y[n] = m;
    }
    free(h);
    free(a);
}

/* out[M][H] and mag[M][H] = sum_j |c_j| (sum_i |a_i W2_ni| + |b2_n|).
 * round_act_out = false drops the activation rounding (the sensitivity
 * control: the comparison must notice it). */
static void ind_moe(const problem_t *pr, bool round_act_out, uint16_t *out,
                    double *mag)
{
    const wna16_qlayer_t *L = pr->L;
    const wna16_moe_params_t *p = pr->p;
    wna16_dtype_t dt = p->act_dtype;
    double *x = malloc((size_t)L->H * sizeof *x);
    double *y = malloc((size_t)L->H * sizeof *y);
    double *my = malloc((size_t)L->H * sizeof *my);
    double *acc = malloc((size_t)L->H * sizeof *acc);
    for (int32_t m = 0; m < pr->M; m++) {
        for (int32_t n = 0; n < L->H; n++)
            acc[n] = mag[(size_t)m * L->H + n] = 0.0;
        for (int32_t j = 0; j < pr->topk; j++) {
            size_t s = (size_t)m * pr->topk + j;
            int32_t e = p->expert_map ? p->expert_map[pr->ids[s]] : pr->ids[s];
            if (e < 0)
                continue;
            bool on_in = p->apply_router_weight_on_input;
            float ws = mt_round_act(dt, pr->w[s]);
            for (int32_t k = 0; k < L->H; k++) {
                float v = mt_from_act(dt, pr->hidden[(size_t)m * L->H + k]);
                x[k] = on_in ? mt_round_act(dt, v * ws) : v;
            }
            ind_expert(pr, e, x, round_act_out, y, my);
            double c = on_in ? 1.0 : pr->w[s];
            for (int32_t n = 0; n < L->H; n++) {
                acc[n] += c * y[n];
                mag[(size_t)m * L->H + n] += fabs(c) * my[n];
            }
        }
        for (int32_t n = 0; n < L->H; n++)
            out[(size_t)m * L->H + n] = mt_to_act(dt, (float)acc[n]);
    }
    free(x);
    free(y);
    free(my);
    free(acc);
}

/* ---- comparison --------------------------------------------------------- */

typedef struct tally {
    long exact, total, bad;
} tally_t;

/* Library and model share every rounding point; they differ only in that
 * the library keeps h and y in float32 (the model in double) and sums in
 * float-then-double vs double. That moves values by ~2^-24 relative, which
 * can flip a rounding to the act dtype: of the output (one act ulp) or of
 * an intermediate a_i or h/y (one ulp of that value, carried through the
 * second GEMM and the top-k sum). So the bound is two act ulps of the
 * output plus two act epsilons of `mag` = sum_j |c_j| sum_i |a_i W2_ni|
 * (the size of the terms, which covers cancellation: a small output made
 * of large terms). In practice almost every output is bit-exact, which the
 * caller also checks. */
static void check_close(wna16_dtype_t dt, const uint16_t *got,
                        const uint16_t *want, const double *mag, size_t n,
                        tally_t *t, const char *what)
{
    double eps = dt == WNA16_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    for (size_t i = 0; i < n; i++) {
        double g = mt_from_act(dt, got[i]), w = mt_from_act(dt, want[i]);
        t->total++;
        if (got[i] == want[i] || g == w) {
            t->exact++;
            continue;
        }
        double tol = 2.0 * w16_act_ulp(dt, w) + 2.0 * eps * mag[i];
        if (!(fabs(g - w) <= tol)) {
            t->bad++;
            if (t->bad <= 10)
                fprintf(stderr, "%s: element %zu: got %.8g, want %.8g "
                        "(tolerance %.3g, mag %.3g)\n", what, i, g, w, tol,
                        mag[i]);
        }
    }
}

/* ---- random problems ---------------------------------------------------- */

typedef struct rcase {
    wna16_qlayer_t L;
    wna16_moe_params_t p;
    int32_t *map;
    uint16_t *hidden;
    int32_t M, topk, n_ids;
    int32_t *ids;
    float *w;
} rcase_t;

static void random_map(tu_rng_t *r, rcase_t *c, int32_t E)
{
    int32_t G = c->n_ids;
    int32_t *perm = malloc((size_t)G * sizeof *perm);
    c->map = malloc((size_t)G * sizeof *c->map);
    for (int32_t g = 0; g < G; g++)
        perm[g] = g, c->map[g] = -1;
    for (int32_t g = G - 1; g > 0; g--) {
        int32_t o = (int32_t)tu_rng_below(r, (uint32_t)g + 1), t = perm[g];
        perm[g] = perm[o], perm[o] = t;
    }
    /* Sometimes one local expert is unreachable (E - 1 mapped). */
    int32_t mapped = E > 1 && tu_rng_below(r, 3) == 0 ? E - 1 : E;
    for (int32_t i = 0; i < mapped; i++)
        c->map[perm[i]] = (i * 5 + 3) % E; /* scrambled; may repeat */
    free(perm);
    c->p.expert_map = c->map;
    c->p.global_num_experts = G;
}

/* Distinct ids per token, as a router produces. */
static void random_routing(tu_rng_t *r, rcase_t *c)
{
    int32_t *pool = malloc((size_t)c->n_ids * sizeof *pool);
    for (int32_t m = 0; m < c->M; m++) {
        for (int32_t g = 0; g < c->n_ids; g++)
            pool[g] = g;
        for (int32_t j = 0; j < c->topk; j++) {
            int32_t o = j + (int32_t)tu_rng_below(r, (uint32_t)(c->n_ids - j));
            int32_t t = pool[j];
            pool[j] = pool[o], pool[o] = t;
            c->ids[(size_t)m * c->topk + j] = pool[j];
            c->w[(size_t)m * c->topk + j] = (float)mt_uniform(r, 0.05, 1.0);
        }
    }
    free(pool);
}

static void random_swiglu(tu_rng_t *r, wna16_moe_params_t *p)
{
    static const float limits[] = {7.0f, 1.5f, 0.75f};
    p->swiglu_limit = limits[tu_rng_below(r, 3)];
    if (tu_rng_below(r, 2)) {
        p->swiglu_alpha = 1.0f;
        p->swiglu_beta = 0.5f;
    }
}

static int make_case(tu_rng_t *r, int index, rcase_t *c)
{
    memset(c, 0, sizeof *c);
    wna16_moe_params_init(&c->p);
    c->p.act_dtype = index % 2 ? WNA16_DTYPE_BF16 : WNA16_DTYPE_F16;
    c->p.activation = (wna16_activation_t)((index / 2) % WNA16_ACT_COUNT_);
    random_swiglu(r, &c->p);
    c->p.apply_router_weight_on_input = tu_rng_below(r, 3) == 0;
    c->p.round_gemm_outputs = tu_rng_below(r, 3) == 0;
    mt_layer_opts_t o = {.E = 1 + (int32_t)tu_rng_below(r, 8),
                         .H = 1 + (int32_t)tu_rng_below(r, 48),
                         .I = 1 + (int32_t)tu_rng_below(r, 40),
                         .gated = wna16_activation_is_gated(c->p.activation),
                         .bias = tu_rng_below(r, 2)};
    if (mt_random_layer(r, &o, &c->L) != 0)
        return -1;
    bool map = tu_rng_below(r, 3) == 0;
    c->n_ids = map ? o.E + (int32_t)tu_rng_below(r, (uint32_t)o.E + 1) : o.E;
    if (map)
        random_map(r, c, o.E);
    c->M = 1 + (int32_t)tu_rng_below(r, 40);
    int32_t kmax = c->n_ids < 4 ? c->n_ids : 4;
    c->topk = 1 + (int32_t)tu_rng_below(r, (uint32_t)kmax);
    c->hidden = malloc((size_t)c->M * o.H * sizeof *c->hidden);
    c->ids = malloc((size_t)c->M * c->topk * sizeof *c->ids);
    c->w = malloc((size_t)c->M * c->topk * sizeof *c->w);
    mt_random_act(r, c->p.act_dtype, c->hidden, (size_t)c->M * o.H, -2.0,
                  2.0);
    random_routing(r, c);
    return 0;
}

static void free_case(rcase_t *c)
{
    wna16_qlayer_free(&c->L);
    free(c->map);
    free(c->hidden);
    free(c->ids);
    free(c->w);
}

static problem_t case_problem(const rcase_t *c, const wna16_moe_params_t *p)
{
    return (problem_t){.L = &c->L, .p = p, .hidden = c->hidden, .M = c->M,
                       .topk = c->topk, .ids = c->ids, .w = c->w};
}

static void describe(const rcase_t *c, char *buf, size_t n)
{
    snprintf(buf, n, "E=%d H=%d I=%d M=%d topk=%d %s %s bias=%d on_input=%d "
             "map=%d round=%d limit=%g", c->L.E, c->L.H, c->L.I, c->M,
             c->topk, wna16_dtype_name(c->p.act_dtype),
             wna16_activation_name(c->p.activation), c->L.w13.bias != NULL,
             c->p.apply_router_weight_on_input, c->map != NULL,
             c->p.round_gemm_outputs, (double)c->p.swiglu_limit);
}

/* ---- batched vs standard ------------------------------------------------ */

/* Tokens scattered into per-expert rows: slot s goes to row_of[s] of
 * expert e (or -1 if absent). */
typedef struct scatter {
    int32_t max_tokens;
    int32_t *counts;  /* [E] */
    int32_t *row_of;  /* [M*topk]: e * max_tokens + r, or -1 */
    uint16_t *x, *x_scaled; /* [E][max_tokens][H] raw / prepare-scaled */
    float *w;         /* [E][max_tokens] */
} scatter_t;

static void scatter_build(tu_rng_t *r, const rcase_t *c, scatter_t *s)
{
    int32_t E = c->L.E, H = c->L.H;
    wna16_dtype_t dt = c->p.act_dtype;
    s->counts = calloc((size_t)E, sizeof *s->counts);
    s->row_of = malloc((size_t)c->M * c->topk * sizeof *s->row_of);
    int32_t mx = 0;
    for (size_t i = 0; i < (size_t)c->M * c->topk; i++) {
        int32_t e = c->map ? c->map[c->ids[i]] : c->ids[i];
        if (e >= 0 && ++s->counts[e] > mx)
            mx = s->counts[e];
    }
    s->max_tokens = mx + 2; /* unused rows too: they must come back 0 */
    size_t rows = (size_t)E * s->max_tokens;
    s->x = malloc(rows * H * sizeof *s->x);
    s->x_scaled = malloc(rows * H * sizeof *s->x_scaled);
    s->w = calloc(rows, sizeof *s->w);
    mt_random_act(r, dt, s->x, rows * H, -9.0, 9.0); /* garbage rows */
    memcpy(s->x_scaled, s->x, rows * H * sizeof *s->x);
    int32_t *fill = calloc((size_t)E, sizeof *fill);
    for (size_t i = 0; i < (size_t)c->M * c->topk; i++) {
        int32_t e = c->map ? c->map[c->ids[i]] : c->ids[i];
        s->row_of[i] = -1;
        if (e < 0)
            continue;
        size_t row = (size_t)e * s->max_tokens + fill[e]++;
        const uint16_t *src = c->hidden + (i / c->topk) * H;
        float ws = mt_round_act(dt, c->w[i]); /* vLLM's prepare step */
        for (int32_t k = 0; k < H; k++) {
            s->x[row * H + k] = src[k];
            s->x_scaled[row * H + k] =
                mt_to_act(dt, mt_from_act(dt, src[k]) * ws);
        }
        s->w[row] = c->w[i];
        s->row_of[i] = (int32_t)row;
    }
    free(fill);
}

static void scatter_free(scatter_t *s)
{
    free(s->counts);
    free(s->row_of);
    free(s->x);
    free(s->x_scaled);
    free(s->w);
}

/* The finalize step: out[m] = R(sum_j c_j * y[row_of(m, j)]). */
static void finalize(const rcase_t *c, const scatter_t *s, const uint16_t *y,
                     uint16_t *out)
{
    wna16_dtype_t dt = c->p.act_dtype;
    int32_t H = c->L.H;
    for (int32_t m = 0; m < c->M; m++)
        for (int32_t n = 0; n < H; n++) {
            double acc = 0.0;
            for (int32_t j = 0; j < c->topk; j++) {
                int32_t row = s->row_of[(size_t)m * c->topk + j];
                if (row < 0)
                    continue;
                double cj = c->p.apply_router_weight_on_input
                                ? 1.0 : c->w[(size_t)m * c->topk + j];
                acc += cj * mt_from_act(dt, y[(size_t)row * H + n]);
            }
            out[(size_t)m * H + n] = mt_to_act(dt, (float)acc);
        }
}

static bool unused_rows_zero(const rcase_t *c, const scatter_t *s,
                             const uint16_t *y)
{
    for (int32_t e = 0; e < c->L.E; e++)
        for (int32_t r = s->counts[e]; r < s->max_tokens; r++)
            for (int32_t n = 0; n < c->L.H; n++)
                if (y[((size_t)e * s->max_tokens + r) * c->L.H + n] != 0)
                    return false;
    return true;
}

/* Batched without weights, then weighted and summed, against standard:
 * with round_gemm_outputs both round y to the act dtype at the same point,
 * so they agree bit for bit; without, within the tolerance. */
static void batched_vs_standard(const rcase_t *c, const scatter_t *s,
                                const double *mag, tally_t *t,
                                const char *what)
{
    size_t rows = (size_t)c->L.E * s->max_tokens, nout = (size_t)c->M * c->L.H;
    uint16_t *y = malloc(rows * c->L.H * sizeof *y);
    uint16_t *fin = malloc(nout * sizeof *fin);
    uint16_t *std = malloc(nout * sizeof *std);
    const uint16_t *xin =
        c->p.apply_router_weight_on_input ? s->x_scaled : s->x;
    wna16_error_t err;
    for (int round = 0; round < 2; round++) {
        wna16_moe_params_t p = c->p;
        p.round_gemm_outputs = round;
        TU_OK(wna16_ref_moe_batched(&c->L, &p, xin, s->max_tokens, s->counts,
                                    NULL, y, &err), &err);
        TU_CHECK_MSG(unused_rows_zero(c, s, y), "%s", what);
        finalize(c, s, y, fin);
        TU_OK(wna16_ref_moe(&c->L, &p, c->hidden, c->M, c->ids, c->w, c->topk,
                            std, &err), &err);
        if (round)
            TU_CHECK_MSG(memcmp(fin, std, nout * sizeof *fin) == 0,
                         "batched + finalize != standard: %s", what);
        else
            check_close(p.act_dtype, fin, std, mag, nout, t, what);
    }
    free(y);
    free(fin);
    free(std);
}

/* Batched with weights: each row equals a one-token, top-1 standard run
 * of that row through that expert with that weight. */
static void batched_weighted_rows(const rcase_t *c, const scatter_t *s,
                                  const char *what)
{
    int32_t H = c->L.H;
    size_t rows = (size_t)c->L.E * s->max_tokens;
    uint16_t *y = malloc(rows * H * sizeof *y), *one = malloc(H * sizeof *one);
    wna16_moe_params_t p = c->p, p1 = c->p;
    p1.expert_map = NULL; /* the rows' experts are local */
    p1.global_num_experts = 0;
    wna16_error_t err;
    TU_OK(wna16_ref_moe_batched(&c->L, &p, s->x, s->max_tokens, s->counts,
                                s->w, y, &err), &err);
    TU_CHECK_MSG(unused_rows_zero(c, s, y), "%s", what);
    int bad = 0;
    for (int32_t e = 0; e < c->L.E; e++)
        for (int32_t r = 0; r < s->counts[e]; r++) {
            size_t row = (size_t)e * s->max_tokens + r;
            TU_OK(wna16_ref_moe(&c->L, &p1, s->x + row * H, 1, &e, &s->w[row],
                                1, one, &err), &err);
            bad += memcmp(one, y + row * H, H * sizeof *one) != 0;
        }
    TU_CHECK_MSG(bad == 0, "%d weighted batched rows differ: %s", bad, what);
    free(y);
    free(one);
}

/* ---- the random sweep --------------------------------------------------- */

static void run_case(tu_rng_t *r, int index, tally_t *t, tally_t *control,
                     tally_t *tb)
{
    rcase_t c;
    if (make_case(r, index, &c) != 0) {
        TU_CHECK(!"layer allocation");
        return;
    }
    char what[256];
    describe(&c, what, sizeof what);
    size_t nout = (size_t)c.M * c.L.H;
    uint16_t *got = malloc(nout * sizeof *got), *again = malloc(nout * 2);
    uint16_t *want = malloc(nout * sizeof *want);
    uint16_t *loose = malloc(nout * sizeof *loose);
    double *mag = malloc(nout * sizeof *mag);
    wna16_error_t err;
    TU_OK(wna16_ref_moe(&c.L, &c.p, c.hidden, c.M, c.ids, c.w, c.topk, got,
                        &err), &err);
    problem_t pr = case_problem(&c, &c.p);
    ind_moe(&pr, true, want, mag);
    check_close(c.p.act_dtype, got, want, mag, nout, t, what);
    /* Control: without the activation rounding the model drifts away. */
    ind_moe(&pr, false, loose, mag);
    for (size_t i = 0; i < nout; i++)
        control->exact += got[i] == loose[i];
    control->total += (long)nout;
    /* Deterministic: a second run gives the same bytes. */
    TU_OK(wna16_ref_moe(&c.L, &c.p, c.hidden, c.M, c.ids, c.w, c.topk, again,
                        &err), &err);
    TU_CHECK_MSG(memcmp(got, again, nout * 2) == 0, "not deterministic: %s",
                 what);
    scatter_t s;
    scatter_build(r, &c, &s);
    ind_moe(&pr, true, want, mag);
    batched_vs_standard(&c, &s, mag, tb, what);
    batched_weighted_rows(&c, &s, what);
    scatter_free(&s);
    free(got);
    free(again);
    free(want);
    free(loose);
    free(mag);
    free_case(&c);
}

static void test_random(void)
{
    tu_rng_t r;
    tu_rng_seed(&r, 0x5eed0e0f);
    tally_t t = {0}, control = {0}, tb = {0};
    int cases = 2 * WNA16_ACT_COUNT_ * 12;
    for (int i = 0; i < cases; i++)
        run_case(&r, i, &t, &control, &tb);
    double exact = (double)t.exact / (double)t.total;
    double ctl = (double)control.exact / (double)control.total;
    printf("random: %d cases, %ld outputs, %.4f%% bit-exact, %ld outside "
           "the tolerance; control (activation not rounded): %.2f%% "
           "bit-exact\n", cases, t.total, 100.0 * exact, t.bad, 100.0 * ctl);
    printf("batched (y rounded) + finalize vs standard (y in float32): "
           "%ld outputs, %.2f%% bit-exact, %ld outside the tolerance\n",
           tb.total, 100.0 * (double)tb.exact / (double)tb.total, tb.bad);
    TU_CHECK(t.bad == 0 && tb.bad == 0);
    /* Shared rounding points: nearly everything is bit-exact. */
    TU_CHECK_MSG(exact >= 0.98, "only %.4f bit-exact", exact);
    /* And the comparison is sensitive to a missing rounding point. */
    TU_CHECK_MSG(ctl < exact - 0.1, "control %.4f vs %.4f", ctl, exact);
}

/* Many tokens on few experts: the per-expert ordering inside the library
 * must not change which token gets which output. */
static void test_big_m(void)
{
    tu_rng_t r;
    tu_rng_seed(&r, 77);
    rcase_t c;
    memset(&c, 0, sizeof c);
    wna16_moe_params_init(&c.p);
    c.p.act_dtype = WNA16_DTYPE_F16;
    mt_layer_opts_t o = {.E = 3, .H = 16, .I = 8, .gated = true};
    TU_CHECK(mt_random_layer(&r, &o, &c.L) == 0);
    c.M = 300;
    c.topk = 2;
    c.n_ids = 3;
    c.hidden = malloc((size_t)c.M * o.H * sizeof *c.hidden);
    c.ids = malloc((size_t)c.M * c.topk * sizeof *c.ids);
    c.w = malloc((size_t)c.M * c.topk * sizeof *c.w);
    mt_random_act(&r, c.p.act_dtype, c.hidden, (size_t)c.M * o.H, -2, 2);
    random_routing(&r, &c);
    size_t nout = (size_t)c.M * o.H;
    uint16_t *got = malloc(nout * 2), *want = malloc(nout * 2);
    double *mag = malloc(nout * sizeof *mag);
    wna16_error_t err;
    TU_OK(wna16_ref_moe(&c.L, &c.p, c.hidden, c.M, c.ids, c.w, c.topk, got,
                        &err), &err);
    problem_t pr = case_problem(&c, &c.p);
    ind_moe(&pr, true, want, mag);
    tally_t t = {0};
    check_close(c.p.act_dtype, got, want, mag, nout, &t, "big M");
    TU_CHECK(t.bad == 0);
    free(got);
    free(want);
    free(mag);
    free_case(&c);
}

int main(void)
{
    test_hand();
    test_random();
    test_big_m();
    return tu_finish("test_moe_ref");
}
