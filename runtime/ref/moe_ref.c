/*
 * moe_ref.c - the reference fused MoE: activations (silu, gelu, gelu_tanh,
 * gpt-oss swiglu, swiglustep and the non-gated variants), and the whole
 * layer (gate/up GEMM, activation, down GEMM, top-k weighted sum) in the
 * standard format (tokens with top-k ids and weights, expert_map for expert
 * parallelism) and the batched format ([E][max_tokens][H] with per-expert
 * counts). It is the oracle every generated MoE kernel is checked against,
 * so it is plain scalar C written for obviousness, not speed: weights are
 * read only through wna16_ref_dequant (one expert at a time into a float
 * buffer), dot products are summed in double in increasing index order,
 * and the rounding points are exactly those include/wna16.h documents
 * (the activation is rounded to the activation dtype before the second
 * GEMM, as vLLM's kernels do). Every argument is validated before any
 * work, so a bad input gets an error and never an out-of-bounds access.
 *
 * Numeric contracts (wna16_numerics_t): "f32" is the above; "int8-dynamic"
 * is vLLM's CPU int4 MoE (CPUExpertsInt4 -> fused_experts_cpu INT4_W4A8,
 * csrc/cpu/sgl-kernels/moe_int4.cpp and gemm_int4.cpp): each GEMM input
 * row is quantized to u8 (amax = max(max |x|, 1e-7), q = rne(x * (127 /
 * amax)) + 128, scale amax / 127), each block of bk = min(group, 128)
 * input channels is summed exactly in int32 as sum q (code - zero) minus
 * 128 sum (code - zero) (the layout's compensation), and the block's
 * float(sum) * scale_x * scale_w is added into a float32 accumulator in
 * block order; "bf16-exact" rounds each dequantized weight (code - zero) *
 * scale and each GEMM input to bf16 and sums their products in float32,
 * a pair of input channels at a time in vdpbf16ps's order (k + 1, then k).
 */
#include "runtime/ref/moe.h"
#include "spec/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


void wna16_moe_params_init(wna16_moe_params_t *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->activation = WNA16_ACT_SILU;
    p->swiglu_limit = WNA16_SWIGLU_LIMIT_DEFAULT;
    p->swiglu_alpha = WNA16_SWIGLU_ALPHA_DEFAULT;
    p->swiglu_beta = WNA16_SWIGLU_BETA_DEFAULT;
    p->act_dtype = WNA16_DTYPE_BF16;
}

/* ---- activation math (double) ------------------------------------------- */

/* Written as comparisons, not fmin/fmax, so that a NaN input stays NaN. */
static double clamp_max(double x, double hi) { return x > hi ? hi : x; }

static double clamp_sym(double x, double lim)
{
    return x > lim ? lim : (x < -lim ? -lim : x);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double silu(double x) { return x / (1.0 + exp(-x)); }

static double gelu(double x)
{
    const double sqrt1_2 = 0.70710678118654752440; /* 1 / sqrt(2) */
    return 0.5 * x * (1.0 + erf(x * sqrt1_2));
}

static double gelu_tanh(double x)
{
    const double sqrt_2_pi = 0.79788456080286535588; /* sqrt(2 / pi) */
    return 0.5 * x * (1.0 + tanh(sqrt_2_pi * (x + 0.044715 * x * x * x)));
}

static double swigluoai(const wna16_moe_params_t *p, double g, double u)
{
    double gc = clamp_max(g, p->swiglu_limit);
    double uc = clamp_sym(u, p->swiglu_limit);
    return (uc + p->swiglu_beta) * gc * sigmoid(p->swiglu_alpha * gc);
}

/* act(g, u) for gated activations, act(g) for the others (u unused). */
static double act_eval(const wna16_moe_params_t *p, double g, double u)
{
    switch (p->activation) {
    case WNA16_ACT_SILU: return silu(g) * u;
    case WNA16_ACT_GELU: return gelu(g) * u;
    case WNA16_ACT_GELU_TANH: return gelu_tanh(g) * u;
    case WNA16_ACT_SWIGLUOAI: return swigluoai(p, g, u);
    case WNA16_ACT_SWIGLUSTEP:
        return clamp_max(silu(g), p->swiglu_limit) *
               clamp_sym(u, p->swiglu_limit);
    case WNA16_ACT_SILU_NO_MUL: return silu(g);
    case WNA16_ACT_GELU_NO_MUL: return gelu(g);
    case WNA16_ACT_RELU2_NO_MUL: return g > 0.0 ? g * g : (g == g ? 0.0 : g);
    default: return NAN;
    }
}

float wna16_ref_activation(const wna16_moe_params_t *p, float gate, float up)
{
    if (!p || !wna16_activation_name(p->activation))
        return NAN;
    return (float)act_eval(p, gate, up);
}

/* ---- activation dtype --------------------------------------------------- */

/* Round a float to the activation dtype (nearest even) and back. */
static float round_act(wna16_dtype_t dt, float v)
{
    if (dt == WNA16_DTYPE_F16)
        return wna16_f16_to_f32(wna16_f32_to_f16(v));
    return wna16_bf16_to_f32(wna16_f32_to_bf16(v));
}

static float load_act(wna16_dtype_t dt, const uint16_t *src, size_t i)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f16_to_f32(src[i])
                                 : wna16_bf16_to_f32(src[i]);
}

static void store_act(wna16_dtype_t dt, uint16_t *dst, size_t i, float v)
{
    dst[i] = dt == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v)
                                   : wna16_f32_to_bf16(v);
}

/* ---- validation --------------------------------------------------------- */

static const char *dt_name(wna16_dtype_t d)
{
    const char *n = wna16_dtype_name(d);
    return n ? n : "INVALID";
}

/* vLLM's --dtype spelling (runtime/model_dtype.c is a layer above). */
static const char *torch_name(wna16_dtype_t d)
{
    return d == WNA16_DTYPE_F16 ? "float16" : d == WNA16_DTYPE_BF16
                                                  ? "bfloat16" : "16-bit";
}

wna16_status_t w16_moe_check_model_dtype(wna16_dtype_t model,
                                         wna16_error_t *err)
{
    if (model == WNA16_DTYPE_INVALID || model == WNA16_DTYPE_F16 ||
        model == WNA16_DTYPE_BF16)
        return WNA16_OK;
    return w16_err(err, WNA16_EINVAL, "moe: quant->model_dtype %s: expected "
                   "F16, BF16 or none (0)", dt_name(model));
}

wna16_status_t w16_moe_check_tensor_dtype(const struct w16_layout *layout,
                                          wna16_dtype_t model,
                                          const char *name, wna16_dtype_t dt,
                                          wna16_error_t *err)
{
    if (!model || !layout || !layout->model_dtype || dt == model)
        return WNA16_OK;
    return w16_err(err, WNA16_EINVAL, "moe: tensor '%s' is %s, but the "
                   "layer's model dtype is %s: vLLM holds scales and biases "
                   "in the model's dtype (repack with --dtype %s, or create "
                   "the layer with quant->model_dtype %s)", name,
                   dt_name(dt), dt_name(model),
                   torch_name(model), dt_name(dt));
}

wna16_status_t w16_moe_check_act_dtype(wna16_dtype_t model,
                                       const wna16_moe_params_t *p,
                                       wna16_error_t *err)
{
    if (!model || !p || p->act_dtype == model)
        return WNA16_OK;
    return w16_err(err, WNA16_EINVAL, "moe: activation dtype %s, but the "
                   "layer's model dtype is %s: vLLM's kernels take "
                   "activations in the model's dtype, with its scales (%s "
                   "with %s); convert the activations, or repack and create "
                   "the layer for a %s model", dt_name(p->act_dtype),
                   dt_name(model), dt_name(model), dt_name(model),
                   torch_name(p->act_dtype));
}

wna16_status_t w16_moe_check_params(const wna16_moe_params_t *p,
                                    wna16_error_t *err)
{
    if (!p)
        return w16_err(err, WNA16_EINVAL, "moe: params is NULL");
    if (!wna16_activation_name(p->activation))
        return w16_err(err, WNA16_EINVAL, "moe: invalid activation %d",
                       (int)p->activation);
    if (p->act_dtype != WNA16_DTYPE_F16 && p->act_dtype != WNA16_DTYPE_BF16) {
        const char *n = wna16_dtype_name(p->act_dtype);
        return w16_err(err, WNA16_EINVAL, "moe: activation dtype %s is not "
                       "supported (F16 or BF16)", n ? n : "INVALID");
    }
    bool swiglu = p->activation == WNA16_ACT_SWIGLUOAI ||
                  p->activation == WNA16_ACT_SWIGLUSTEP;
    if (swiglu && !(p->swiglu_limit > 0.0f))
        return w16_err(err, WNA16_EINVAL, "moe: %s needs swiglu_limit > 0 "
                       "(got %g; INFINITY disables the clamp)",
                       wna16_activation_name(p->activation), (double)p->swiglu_limit);
    if (p->activation == WNA16_ACT_SWIGLUOAI &&
        (!isfinite(p->swiglu_alpha) || !isfinite(p->swiglu_beta)))
        return w16_err(err, WNA16_EINVAL, "moe: swigluoai needs finite "
                       "swiglu_alpha and swiglu_beta (got %g, %g)",
                       (double)p->swiglu_alpha, (double)p->swiglu_beta);
    return WNA16_OK;
}

static wna16_status_t check_groups(const wna16_qweight_t *qw, const char *what,
                                   wna16_error_t *err)
{
    int32_t gs = qw->group_size;
    if (gs == 0 || gs < -1 || (gs > 0 && qw->K % gs != 0))
        return w16_err(err, WNA16_EINVAL, "moe: %s group size %d does not "
                       "divide K = %d", what, gs, qw->K);
    int32_t G = gs > 0 ? qw->K / gs : 1;
    if (qw->G != G)
        return w16_err(err, WNA16_EINVAL, "moe: %s has G = %d groups, "
                       "expected %d for group size %d", what, qw->G, G, gs);
    if (!qw->g_idx)
        return WNA16_OK;
    /* Act-order: every group index must be a valid scale row, or the
     * dequantization would read out of bounds. */
    for (int32_t e = 0; e < qw->E; e++)
        for (int32_t k = 0; k < qw->K; k++) {
            int32_t g = qw->g_idx[(size_t)e * qw->K + k];
            if (g < 0 || g >= qw->G)
                return w16_err(err, WNA16_EINVAL, "moe: %s g_idx[%d][%d] = "
                               "%d is not a group in [0, %d)", what, e, k, g,
                               qw->G);
        }
    return WNA16_OK;
}

static wna16_status_t check_operand(const wna16_qweight_t *qw,
                                    const char *what, int32_t E, int32_t N,
                                    int32_t K, wna16_error_t *err)
{
    if (qw->E != E || qw->N != N || qw->K != K)
        return w16_err(err, WNA16_EINVAL, "moe: %s is E x N x K = %d x %d x "
                       "%d, expected %d x %d x %d", what, qw->E, qw->N, qw->K,
                       E, N, K);
    if (!qw->codes || !qw->scales)
        return w16_err(err, WNA16_EINVAL, "moe: %s has no codes or scales",
                       what);
    if (qw->bits != 4 && qw->bits != 8)
        return w16_err(err, WNA16_EINVAL, "moe: %s has %d-bit codes (4 or "
                       "8)", what, qw->bits);
    return check_groups(qw, what, err);
}

static wna16_status_t check_layer(const wna16_qlayer_t *layer,
                                  const wna16_moe_params_t *p,
                                  wna16_error_t *err)
{
    if (!layer)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    if (layer->E < 1 || layer->H < 1 || layer->I < 1)
        return w16_err(err, WNA16_EINVAL, "moe: layer E, H and I must be "
                       "positive (got %d, %d, %d)", layer->E, layer->H,
                       layer->I);
    bool gated = wna16_activation_is_gated(p->activation);
    int32_t N13 = gated ? 2 * layer->I : layer->I;
    if (gated && layer->I > INT32_MAX / 2)
        return w16_err(err, WNA16_EINVAL, "moe: I = %d is too large",
                       layer->I);
    wna16_status_t st = check_operand(&layer->w13, gated ? "w13" :
                                      "w13 (not gated: N = I)", layer->E,
                                      N13, layer->H, err);
    if (st == WNA16_OK)
        st = check_operand(&layer->w2, "w2", layer->E, layer->H, layer->I,
                           err);
    return st;
}

/* Input channels per int32 block: min(group size, 128). */
static int32_t int8_block(const wna16_qweight_t *qw)
{
    int32_t gse = qw->K / qw->G;
    return gse < 128 ? gse : 128;
}

/* What a contract needs of the layer: int8-dynamic is defined for 4-bit
 * and 8-bit codes without act-order, its blocks of min(group, 128)
 * channels inside one group (8-bit codes: a block's sum of s8 x (code -
 * zero) is below 127 * 255 * 128 in magnitude, exact in int32). */
static wna16_status_t check_numerics(const wna16_qlayer_t *layer,
                                     wna16_numerics_t n, wna16_error_t *err)
{
    if (!wna16_numerics_name(n))
        return w16_err(err, WNA16_EINVAL, "moe: invalid numeric contract %d",
                       (int)n);
    if (n != WNA16_NUMERICS_INT8_DYNAMIC)
        return WNA16_OK;
    const wna16_qweight_t *ops[2] = {&layer->w13, &layer->w2};
    for (int i = 0; i < 2; i++) {
        const wna16_qweight_t *qw = ops[i];
        int32_t gse = qw->K / qw->G, bk = int8_block(qw);
        if ((qw->bits != 4 && qw->bits != 8) || qw->g_idx || gse % bk)
            return w16_err(err, WNA16_EUNSUPPORTED, "moe: the int8-dynamic "
                           "contract (vLLM's CPU int4 MoE) needs 4-bit or "
                           "8-bit codes without act-order in blocks of "
                           "min(group size, 128) channels; %s has %d bits%s, "
                           "group %d",
                           i ? "w2" : "w13", qw->bits,
                           qw->g_idx ? " with g_idx" : "", gse);
    }
    return WNA16_OK;
}

/* The expert map's entries must be -1 or local experts. */
static wna16_status_t check_map(const wna16_moe_params_t *p, int32_t E,
                                int32_t *n_ids, wna16_error_t *err)
{
    if (!p->expert_map) {
        if (p->global_num_experts != 0 && p->global_num_experts != E)
            return w16_err(err, WNA16_EINVAL, "moe: global_num_experts = %d "
                           "without an expert_map (must be 0 or E = %d)",
                           p->global_num_experts, E);
        *n_ids = E;
        return WNA16_OK;
    }
    if (p->global_num_experts < 1)
        return w16_err(err, WNA16_EINVAL, "moe: expert_map needs "
                       "global_num_experts >= 1 (got %d)",
                       p->global_num_experts);
    for (int32_t g = 0; g < p->global_num_experts; g++) {
        int32_t e = p->expert_map[g];
        if (e < -1 || e >= E)
            return w16_err(err, WNA16_EINVAL, "moe: expert_map[%d] = %d is "
                           "neither -1 nor a local expert in [0, %d)", g, e,
                           E);
    }
    *n_ids = p->global_num_experts;
    return WNA16_OK;
}

wna16_status_t w16_moe_check_routing(const int32_t *ids, int32_t M,
                                     int32_t topk, int32_t n_ids,
                                     wna16_error_t *err)
{
    if (topk < 1)
        return w16_err(err, WNA16_EINVAL, "moe: topk = %d (must be >= 1)",
                       topk);
    if (topk > n_ids)
        return w16_err(err, WNA16_EINVAL, "moe: topk = %d exceeds the %d "
                       "experts", topk, n_ids);
    for (int32_t m = 0; m < M; m++)
        for (int32_t j = 0; j < topk; j++) {
            int32_t g = ids[(size_t)m * topk + j];
            if (g < 0 || g >= n_ids)
                return w16_err(err, WNA16_EINVAL, "moe: topk_ids[%d][%d] = %d "
                               "is not an expert id in [0, %d)", m, j, g,
                               n_ids);
        }
    return WNA16_OK;
}

/* ---- one expert's MLP --------------------------------------------------- */

/* Scratch for running one expert: its dequantized weights and the rows of
 * one token. */
typedef struct moe_work {
    const wna16_qlayer_t *layer;
    const wna16_moe_params_t *p;
    int32_t H, I, N13;
    bool gated;
    float *w13; /* [N13][H] expert `loaded` */
    float *w2;  /* [H][I] */
    float *x;   /* [H] the input row (after on-input weighting) */
    float *h;   /* [N13] GEMM1 output */
    float *a;   /* [I] activation, rounded to act dtype */
    int32_t loaded;
    wna16_numerics_t numerics;
    uint8_t *q; /* int8-dynamic: the quantized GEMM input row */
} moe_work_t;

static void work_free(moe_work_t *w)
{
    free(w->w13);
    free(w->w2);
    free(w->x);
    free(w->h);
    free(w->a);
    free(w->q);
    memset(w, 0, sizeof *w);
}

static wna16_status_t work_init(moe_work_t *w, const wna16_qlayer_t *layer,
                                const wna16_moe_params_t *p,
                                wna16_error_t *err)
{
    memset(w, 0, sizeof *w);
    w->layer = layer;
    w->p = p;
    w->H = layer->H;
    w->I = layer->I;
    w->gated = wna16_activation_is_gated(p->activation);
    w->N13 = w->gated ? 2 * layer->I : layer->I;
    w->loaded = -1;
    size_t n13 = 0, n2 = 0;
    if (!w16_mul_size((size_t)w->N13, (size_t)w->H, &n13) ||
        !w16_mul_size((size_t)w->H, (size_t)w->I, &n2))
        return w16_err(err, WNA16_EINVAL, "moe: layer too large");
    w->w13 = malloc(n13 * sizeof(float));
    w->w2 = malloc(n2 * sizeof(float));
    w->x = malloc((size_t)w->H * sizeof(float));
    w->h = malloc((size_t)w->N13 * sizeof(float));
    w->a = malloc((size_t)w->I * sizeof(float));
    w->q = malloc((size_t)(w->H > w->I ? w->H : w->I));
    if (!w->w13 || !w->w2 || !w->x || !w->h || !w->a || !w->q) {
        work_free(w);
        return w16_err_nomem(err, "the reference MoE's expert weights");
    }
    return WNA16_OK;
}

/* Dequantizes expert e's two operands (once per expert and chunk). */
static void load_expert(moe_work_t *w, int32_t e)
{
    if (w->loaded == e)
        return;
    for (int32_t n = 0; n < w->N13; n++)
        for (int32_t k = 0; k < w->H; k++)
            w->w13[(size_t)n * w->H + k] =
                wna16_ref_dequant(&w->layer->w13, e, n, k);
    for (int32_t n = 0; n < w->H; n++)
        for (int32_t i = 0; i < w->I; i++)
            w->w2[(size_t)n * w->I + i] =
                wna16_ref_dequant(&w->layer->w2, e, n, i);
    w->loaded = e;
}

/* Loads one input row into w->x; on-input weighting as vLLM's prepare step
 * does it: the weight and the product are rounded to the act dtype. */
static void load_input(moe_work_t *w, const uint16_t *row, const float *wt)
{
    wna16_dtype_t dt = w->p->act_dtype;
    float s = wt ? round_act(dt, *wt) : 1.0f;
    for (int32_t k = 0; k < w->H; k++) {
        float v = load_act(dt, row, (size_t)k);
        w->x[k] = wt ? round_act(dt, v * s) : v;
    }
}

/* sum_k x[k] * row[k] + bias, in double, increasing k. */
static double dot(const float *x, const float *row, int32_t n,
                  const float *bias)
{
    double acc = 0.0;
    for (int32_t k = 0; k < n; k++)
        acc += (double)x[k] * (double)row[k];
    if (bias)
        acc += (double)*bias;
    return acc;
}

/* ---- numeric contracts other than f32 --------------------------------- */

/* vLLM's quantize_row_int8: per row, u8 codes around 128 and the scale.
 * A NaN in the row makes the scale NaN (so the row's outputs are NaN, as
 * under f32; its codes are then 128), an infinity makes it infinite. */
static float quantize_row(const float *x, int32_t n, uint8_t *q)
{
    float amax = 0.0f;
    for (int32_t k = 0; k < n; k++)
        amax = fabsf(x[k]) > amax || isnan(x[k]) ? fabsf(x[k]) : amax;
    amax = amax > 1e-7f || isnan(amax) ? amax : 1e-7f;
    float inv = 127.0f / amax;
    for (int32_t k = 0; k < n; k++) {
        float v = x[k] * inv;
        q[k] = (uint8_t)((isnan(v) ? 0 : (int32_t)nearbyintf(v)) + 128);
    }
    return amax / 127.0f;
}

/* Row n of operand qw (expert e) against the quantized row q (scale sa):
 * per block, the exact int32 sum, then float(sum) * sa * scale added in
 * float32, block by block. */
static float int8_dot(const wna16_qweight_t *qw, int32_t e, int32_t n,
                      const uint8_t *q, float sa)
{
    int32_t K = qw->K, gse = K / qw->G, bk = int8_block(qw);
    float acc = 0.0f;
    for (int32_t k0 = 0; k0 < K; k0 += bk) {
        size_t gi = ((size_t)e * qw->G + (size_t)(k0 / gse)) * qw->N + n;
        int32_t z = qw->zeros ? qw->zeros[gi] : (1 << (qw->bits - 1));
        const uint8_t *codes = qw->codes + ((size_t)e * qw->N + n) * K;
        int32_t c = 0, comp = 0;
        for (int32_t k = k0; k < k0 + bk; k++) {
            int32_t d = (int32_t)codes[k] - z;
            c += (int32_t)q[k] * d;
            comp += d;
        }
        c -= 128 * comp;
        acc += ((float)c * sa) * qw->scales[gi];
    }
    return acc;
}

static float bf16_round(float v) { return round_act(WNA16_DTYPE_BF16, v); }

/* Row n (dequantized in w's buffer) against x, both rounded to bf16,
 * summed in float32 in the order vdpbf16ps takes a pair of input channels:
 * acc += x[k+1] w[k+1], then acc += x[k] w[k] (each product exact in
 * float32, each sum rounded). */
static float bf16_dot(const float *x, const float *row, int32_t K)
{
    float acc = 0.0f;
    for (int32_t k = 0; k < K; k += 2) {
        if (k + 1 < K)
            acc += bf16_round(x[k + 1]) * bf16_round(row[k + 1]);
        acc += bf16_round(x[k]) * bf16_round(row[k]);
    }
    return acc;
}

/* One GEMM output h = row n of operand g against the input row `in` (its
 * int8 codes in w->q with scale sa under int8-dynamic), plus bias, under
 * the work's contract. */
static float gemm_out(moe_work_t *w, const wna16_qweight_t *qw,
                      const float *wrows, int32_t e, int32_t n,
                      const float *in, float sa)
{
    const float *b = qw->bias ? &qw->bias[(size_t)e * qw->N + n] : NULL;
    switch (w->numerics) {
    case WNA16_NUMERICS_INT8_DYNAMIC: {
        float v = int8_dot(qw, e, n, w->q, sa);
        return b ? v + *b : v;
    }
    case WNA16_NUMERICS_BF16_EXACT: {
        float v = bf16_dot(in, &wrows[(size_t)n * qw->K], qw->K);
        return b ? v + *b : v;
    }
    default:
        return (float)dot(in, &wrows[(size_t)n * qw->K], qw->K, b);
    }
}

/* y[H] = expert e's MLP of w->x (expert e must be loaded). */
static void expert_mlp(moe_work_t *w, int32_t e, float *y)
{
    const wna16_moe_params_t *p = w->p;
    bool int8 = w->numerics == WNA16_NUMERICS_INT8_DYNAMIC;
    float sa = int8 ? quantize_row(w->x, w->H, w->q) : 0.0f;
    for (int32_t n = 0; n < w->N13; n++) {
        float v = gemm_out(w, &w->layer->w13, w->w13, e, n, w->x, sa);
        w->h[n] = p->round_gemm_outputs ? round_act(p->act_dtype, v) : v;
    }
    for (int32_t i = 0; i < w->I; i++) {
        double up = w->gated ? (double)w->h[w->I + i] : 0.0;
        float v = (float)act_eval(p, (double)w->h[i], up);
        /* vLLM's kernels hand GEMM2 the activation in the act dtype. */
        w->a[i] = round_act(p->act_dtype, v);
    }
    sa = int8 ? quantize_row(w->a, w->I, w->q) : 0.0f;
    for (int32_t n = 0; n < w->H; n++) {
        float v = gemm_out(w, &w->layer->w2, w->w2, e, n, w->a, sa);
        y[n] = p->round_gemm_outputs ? round_act(p->act_dtype, v) : v;
    }
}

/* ---- standard format ---------------------------------------------------- */

/* The arguments of one wna16_ref_moe call. */
typedef struct moe_call {
    const uint16_t *hidden;
    int32_t M, topk;
    const int32_t *ids;
    const float *weights;
    uint16_t *out;
} moe_call_t;

/* Local expert of slot (m, j), or -1. */
static int32_t slot_expert(const moe_work_t *w, const moe_call_t *c,
                           int32_t m, int32_t j)
{
    int32_t g = c->ids[(size_t)m * c->topk + j];
    return w->p->expert_map ? w->p->expert_map[g] : g;
}

/* Tokens per chunk: the per-slot outputs y of a chunk are kept (so the
 * top-k sum runs in slot order) within about 32 MiB. */
static int32_t chunk_tokens(int32_t M, int32_t topk, int32_t H)
{
    size_t per_token = (size_t)topk * (size_t)H * sizeof(float);
    size_t n = ((size_t)32 << 20) / per_token;
    if (n < 1)
        n = 1;
    return n < (size_t)M ? (int32_t)n : M;
}

/* y of every slot of tokens [m0, m0 + mc), expert by expert so each expert
 * is dequantized once per chunk. */
static void chunk_experts(moe_work_t *w, const moe_call_t *c, int32_t m0,
                          int32_t mc, float *ybuf)
{
    bool on_input = w->p->apply_router_weight_on_input;
    for (int32_t e = 0; e < w->layer->E; e++)
        for (int32_t m = m0; m < m0 + mc; m++)
            for (int32_t j = 0; j < c->topk; j++) {
                if (slot_expert(w, c, m, j) != e)
                    continue;
                size_t s = (size_t)m * c->topk + j;
                load_expert(w, e);
                load_input(w, c->hidden + (size_t)m * w->H,
                           on_input ? &c->weights[s] : NULL);
                expert_mlp(w, e, ybuf + ((size_t)(m - m0) * c->topk + j) *
                                            (size_t)w->H);
            }
}

/* out[m] = R(sum_j c_j y_j) in double, slot order. */
static void chunk_combine(const moe_work_t *w, const moe_call_t *c,
                          int32_t m0, int32_t mc, const float *ybuf)
{
    bool on_input = w->p->apply_router_weight_on_input;
    for (int32_t m = m0; m < m0 + mc; m++)
        for (int32_t n = 0; n < w->H; n++) {
            double acc = 0.0;
            for (int32_t j = 0; j < c->topk; j++) {
                if (slot_expert(w, c, m, j) < 0)
                    continue;
                size_t s = (size_t)m * c->topk + j;
                double cj = on_input ? 1.0 : (double)c->weights[s];
                acc += cj * (double)ybuf[((size_t)(m - m0) * c->topk + j) *
                                             (size_t)w->H + n];
            }
            store_act(w->p->act_dtype, c->out, (size_t)m * w->H + n,
                      (float)acc);
        }
}

static wna16_status_t run_standard(moe_work_t *w, const moe_call_t *c,
                                   wna16_error_t *err)
{
    int32_t chunk = chunk_tokens(c->M, c->topk, w->H);
    float *ybuf = malloc((size_t)chunk * c->topk * w->H * sizeof(float));
    if (!ybuf)
        return w16_err_nomem(err, "the reference MoE's expert outputs");
    for (int32_t m0 = 0; m0 < c->M; m0 += chunk) {
        int32_t mc = c->M - m0 < chunk ? c->M - m0 : chunk;
        chunk_experts(w, c, m0, mc, ybuf);
        chunk_combine(w, c, m0, mc, ybuf);
    }
    free(ybuf);
    return WNA16_OK;
}

static wna16_status_t check_moe_args(const wna16_qlayer_t *layer,
                                     const wna16_moe_params_t *p,
                                     const moe_call_t *c, wna16_error_t *err)
{
    wna16_status_t st = w16_moe_check_params(p, err);
    if (st == WNA16_OK)
        st = check_layer(layer, p, err);
    if (st != WNA16_OK)
        return st;
    if (c->M < 0)
        return w16_err(err, WNA16_EINVAL, "moe: M = %d tokens (must be >= "
                       "0)", c->M);
    if (c->M > 0 && (!c->hidden || !c->ids || !c->weights || !c->out))
        return w16_err(err, WNA16_EINVAL, "moe: %s is NULL",
                       !c->hidden ? "hidden" : !c->ids ? "topk_ids" :
                       !c->weights ? "topk_weights" : "out");
    int32_t n_ids = 0;
    st = check_map(p, layer->E, &n_ids, err);
    if (st == WNA16_OK)
        st = w16_moe_check_routing(c->ids, c->M, c->topk, n_ids, err);
    return st;
}

wna16_status_t wna16_ref_moe(const wna16_qlayer_t *layer,
                             const wna16_moe_params_t *p, const void *hidden,
                             int32_t M, const int32_t *topk_ids,
                             const float *topk_weights, int32_t topk,
                             void *out, wna16_error_t *err)
{
    return wna16_ref_moe_numerics(layer, p, WNA16_NUMERICS_F32, hidden, M,
                                  topk_ids, topk_weights, topk, out, err);
}

wna16_status_t wna16_ref_moe_numerics(const wna16_qlayer_t *layer,
                                      const wna16_moe_params_t *p,
                                      wna16_numerics_t numerics,
                                      const void *hidden, int32_t M,
                                      const int32_t *topk_ids,
                                      const float *topk_weights, int32_t topk,
                                      void *out, wna16_error_t *err)
{
    moe_call_t c = {.hidden = hidden, .M = M, .topk = topk, .ids = topk_ids,
                    .weights = topk_weights, .out = out};
    wna16_status_t st = check_moe_args(layer, p, &c, err);
    if (st == WNA16_OK)
        st = check_numerics(layer, numerics, err);
    if (st != WNA16_OK || M == 0)
        return st;
    moe_work_t w;
    st = work_init(&w, layer, p, err);
    if (st != WNA16_OK)
        return st;
    w.numerics = numerics;
    st = run_standard(&w, &c, err);
    work_free(&w);
    return st;
}

/* ---- batched format ----------------------------------------------------- */

static wna16_status_t check_batched_args(const wna16_qlayer_t *layer,
                                         const wna16_moe_params_t *p,
                                         const void *hidden,
                                         int32_t max_tokens,
                                         const int32_t *counts, void *out,
                                         wna16_error_t *err)
{
    wna16_status_t st = w16_moe_check_params(p, err);
    if (st == WNA16_OK)
        st = check_layer(layer, p, err);
    if (st != WNA16_OK)
        return st;
    if (max_tokens < 0)
        return w16_err(err, WNA16_EINVAL, "moe batched: max_tokens = %d "
                       "(must be >= 0)", max_tokens);
    if (!counts)
        return w16_err(err, WNA16_EINVAL, "moe batched: expert_num_tokens "
                       "is NULL");
    if (max_tokens > 0 && (!hidden || !out))
        return w16_err(err, WNA16_EINVAL, "moe batched: %s is NULL",
                       !hidden ? "hidden" : "out");
    for (int32_t e = 0; e < layer->E; e++)
        if (counts[e] < 0 || counts[e] > max_tokens)
            return w16_err(err, WNA16_EINVAL, "moe batched: "
                           "expert_num_tokens[%d] = %d is outside [0, "
                           "max_tokens = %d]", e, counts[e], max_tokens);
    return WNA16_OK;
}

/* Rows of expert e: its first `count` rows through its MLP, the rest 0. */
static void batched_expert(moe_work_t *w, int32_t e, const uint16_t *hidden,
                           int32_t max_tokens, int32_t count,
                           const float *weights, uint16_t *out, float *y)
{
    const wna16_moe_params_t *p = w->p;
    bool on_input = weights && p->apply_router_weight_on_input;
    bool on_output = weights && !p->apply_router_weight_on_input;
    for (int32_t r = 0; r < max_tokens; r++) {
        size_t row = (size_t)e * max_tokens + r;
        uint16_t *o = out + row * w->H;
        if (r >= count) {
            memset(o, 0, (size_t)w->H * sizeof *o);
            continue;
        }
        load_expert(w, e);
        load_input(w, hidden + row * w->H, on_input ? &weights[row] : NULL);
        expert_mlp(w, e, y);
        double c = on_output ? (double)weights[row] : 1.0;
        /* Same arithmetic as chunk_combine with one slot. */
        for (int32_t n = 0; n < w->H; n++)
            store_act(p->act_dtype, o, (size_t)n,
                      (float)(0.0 + c * (double)y[n]));
    }
}

wna16_status_t wna16_ref_moe_batched(const wna16_qlayer_t *layer,
                                     const wna16_moe_params_t *p,
                                     const void *hidden, int32_t max_tokens,
                                     const int32_t *expert_num_tokens,
                                     const float *weights, void *out,
                                     wna16_error_t *err)
{
    return wna16_ref_moe_batched_numerics(layer, p, WNA16_NUMERICS_F32,
                                          hidden, max_tokens,
                                          expert_num_tokens, weights, out,
                                          err);
}

wna16_status_t wna16_ref_moe_batched_numerics(
    const wna16_qlayer_t *layer, const wna16_moe_params_t *p,
    wna16_numerics_t numerics, const void *hidden, int32_t max_tokens,
    const int32_t *expert_num_tokens, const float *weights, void *out,
    wna16_error_t *err)
{
    wna16_status_t st = check_batched_args(layer, p, hidden, max_tokens,
                                           expert_num_tokens, out, err);
    if (st == WNA16_OK)
        st = check_numerics(layer, numerics, err);
    if (st != WNA16_OK || max_tokens == 0)
        return st;
    moe_work_t w;
    st = work_init(&w, layer, p, err);
    if (st != WNA16_OK)
        return st;
    w.numerics = numerics;
    float *y = malloc((size_t)layer->H * sizeof(float));
    if (!y) {
        work_free(&w);
        return w16_err_nomem(err, "the reference MoE's expert output");
    }
    for (int32_t e = 0; e < layer->E; e++)
        batched_expert(&w, e, hidden, max_tokens, expert_num_tokens[e],
                       weights, out, y);
    free(y);
    work_free(&w);
    return WNA16_OK;
}
