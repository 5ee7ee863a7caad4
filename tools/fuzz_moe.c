/*
 * fuzz_moe.c - `wna16 fuzz --kind moe`: the fused MoE of a target against
 * the reference MoE (wna16_ref_moe, wna16_ref_moe_batched) on random
 * problems drawn from the specs. A case is a backend (on the cpu target
 * any stacked layout that holds codes and scales, run by the generated
 * fused MoE, wna16_moe_layer_*; on the cuda target the Marlin family, run
 * by wna16_cuda_moe_*), a layer shape, a quantization, an activation with
 * its constants, the activation format (standard or batched), the routing
 * (top-k, an expert map with absent experts, experts left without
 * tokens), at most one bad argument, and the seed of every value. Each
 * case writes a random layer in logical form, encodes it into the
 * backend's layout with the reference encoder, runs the same call on the
 * kernel path and on the reference, and requires the same refusal (status
 * and message) or outputs within a bound carried through both GEMMs from
 * the numerics each target documents; the reference runs under the
 * numeric contract the layer reports (wna16_moe_layer_numerics:
 * int8-dynamic or bf16-exact where the dedicated CPU kernels serve the
 * layout). A failing case is shrunk (fewer
 * experts, tokens and slots, smaller shapes, fewer options) while it
 * still fails and printed as a one-line reproducer for --case.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"
#include "runtime/targets.h"
#include "spec/spec.h"
#include "runtime/ref/moe_bound.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMD "fuzz"

/* ---- cases ----------------------------------------------------------------- */

/* At most one bad argument a case (ORDER BAD: names below). */
typedef enum fm_bad {
    FM_BAD_NONE,   /* every argument valid */
    FM_BAD_ID,     /* a top-k id outside the (global) experts */
    FM_BAD_MAP,    /* an expert_map entry outside [-1, E) */
    FM_BAD_TOPK,   /* top-k above the number of experts */
    FM_BAD_COUNT,  /* batched: a count above max_tokens */
    FM_BAD_DTYPE,  /* an activation dtype that is not F16/BF16 */
    FM_BAD_LIMIT,  /* swiglu: a limit <= 0 */
    FM_BAD_GATING, /* an activation of the other gating than the layer */
    FM_BAD_COUNT_
} fm_bad_t;

static const char *const bad_names[FM_BAD_COUNT_] = {
    "none", "id", "map", "topk", "count", "dtype", "limit", "gating"};

typedef struct fm_case {
    const wna16_spec_t *spec; /* the backend layout */
    int32_t E, H, I;
    int32_t M;    /* tokens (standard) or max_tokens (batched) */
    int32_t topk; /* standard only (1 when batched) */
    wna16_quant_desc_t q;      /* bits, group size, zp, act-order, bias */
    wna16_activation_t act;    /* decides the layer's gating too */
    float limit, alpha, beta;  /* swiglu constants */
    wna16_dtype_t dtype;       /* activations */
    wna16_dtype_t scales;      /* scale and bias dtype */
    bool round, on_input;      /* round_gemm_outputs, weights on input */
    int32_t map;               /* global experts of an expert map; 0: none */
    int32_t active;            /* experts (global ids) that get tokens */
    bool batched, weights;     /* batched format; with router weights */
    fm_bad_t bad;
    uint64_t data;             /* seed of every value */
} fm_case_t;

static void case_text(const fm_case_t *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s E=%" PRId32 " H=%" PRId32 " I=%" PRId32 " M=%" PRId32
             " topk=%" PRId32 " bits=%" PRId32 " group=%" PRId32 " zp=%d "
             "actorder=%d bias=%d act=%s swiglu=%g/%g/%g dtype=%s scales=%s "
             "round=%d oninput=%d map=%" PRId32 " active=%" PRId32
             " batched=%d weights=%d bad=%s data=%#" PRIx64,
             wna16_spec_name(c->spec), c->E, c->H, c->I, c->M, c->topk,
             c->q.bits, c->q.group_size, c->q.zero_point, c->q.act_order,
             c->q.bias, wna16_activation_name(c->act), (double)c->limit,
             (double)c->alpha, (double)c->beta, wna16_dtype_name(c->dtype),
             wna16_dtype_name(c->scales), c->round, c->on_input, c->map,
             c->active, c->batched, c->weights, bad_names[c->bad], c->data);
}

/* The number of expert ids the routing draws from. */
static int32_t n_ids(const fm_case_t *c)
{
    return c->batched ? c->E : c->map ? c->map : c->E;
}

/* Whether a backend is one the target's fused MoE runs: the CPU's
 * generated fused MoE reads any stacked layout with codes and scales; the
 * CUDA tensor-core kernels read the Marlin layouts. */
static bool runs_on(const wna16_spec_t *s, wna16_target_t target)
{
    if (target == WNA16_TARGET_CUDA)
        return strcmp(s->name, "marlin") == 0 ||
               strcmp(s->name, "batched_marlin") == 0;
    return s->stacked && s->layouts[W16_ROLE_QWEIGHT] &&
           s->layouts[W16_ROLE_SCALES];
}

/* The bad arguments that apply to a case. */
static bool bad_applies(const fm_case_t *c, fm_bad_t b)
{
    switch (b) {
    case FM_BAD_ID:
    case FM_BAD_TOPK: return !c->batched;
    case FM_BAD_MAP: return !c->batched && c->map > 0;
    case FM_BAD_COUNT: return c->batched;
    case FM_BAD_LIMIT: return c->act == WNA16_ACT_SWIGLUOAI ||
                              c->act == WNA16_ACT_SWIGLUSTEP;
    default: return true;
    }
}

/* A case the kernel path and the reference can be asked (else the case
 * text is inconsistent: --case reports it, the shrinker skips it). */
static bool case_valid(const fm_case_t *c)
{
    int32_t g = c->q.group_size;
    if (c->E < 1 || c->H < 1 || c->I < 1 || c->M < 1 || c->topk < 1)
        return false;
    if (g > 0 && (c->H % g || c->I % g))
        return false;
    if (c->q.act_order && g <= 0)
        return false;
    if (c->batched && (c->map || c->topk != 1))
        return false;
    /* the layout's generated fused MoE refuses the batched format (xpu:
     * vLLM's XPUExpertsWNA16; test_moe_batched_refusal checks that) */
    if (c->batched && !w16_spec_moe_takes_batched(c->spec))
        return false;
    if (!c->batched && (!c->weights || (c->map && c->map <= c->E) ||
                        c->topk > n_ids(c) || c->active < c->topk))
        return false;
    return c->active >= 0 && c->active <= n_ids(c) && bad_applies(c, c->bad);
}

/* Makes a case consistent after a change (draws and shrinking). */
static void case_fix(fm_case_t *c)
{
    if (c->q.group_size <= 0)
        c->q.act_order = false;
    if (c->batched) {
        c->map = 0;
        c->topk = 1;
    } else {
        c->weights = true;
        if (c->map && c->map <= c->E)
            c->map = c->E + 1;
        if (c->topk > n_ids(c))
            c->topk = n_ids(c);
        if (c->active < c->topk)
            c->active = c->topk;
    }
    if (c->active > n_ids(c))
        c->active = n_ids(c);
}

/* ---- drawing a case ------------------------------------------------------- */

typedef struct fm_limits {
    int32_t max_hi;    /* H and I at most */
    double max_work;   /* routed rows x H x I at most */
    double max_layer;  /* E x H x I at most (encoding, the bound) */
} fm_limits_t;

/* The CPU cases stay small (300 of them run in about a minute on two
 * cores, most of it JIT compilation); the GPU's are larger. */
static fm_limits_t limits_of(wna16_target_t target)
{
    if (target == WNA16_TARGET_CUDA)
        return (fm_limits_t){1024, 6e7, 8e6};
    return (fm_limits_t){256, 3e6, 2e6};
}

static const wna16_spec_t *pick_backend(wna16_context_t *ctx, fz_rng_t *r,
                                        wna16_target_t target)
{
    const wna16_spec_t *ok[64];
    int n = 0;
    for (size_t i = 0; i < wna16_spec_count(ctx) && n < 64; i++)
        if (runs_on(wna16_spec_at(ctx, i), target))
            ok[n++] = wna16_spec_at(ctx, i);
    return n ? ok[fz_below(r, (uint32_t)n)] : NULL;
}

static void draw(wna16_context_t *ctx, fz_rng_t *r, const wna16_spec_t *fixed,
                 wna16_target_t target, fm_case_t *c)
{
    static const int32_t gss[] = {-1, 32, 64, 128};
    static const int32_t cpu_E[] = {1, 2, 3, 4, 6, 8, 16};
    static const int32_t gpu_E[] = {1, 2, 4, 8, 16, 32, 64};
    static const float lims[] = {7.0f, 0.5f, INFINITY};
    static const float alphas[] = {1.702f, 1.0f, 0.5f, 2.5f};
    static const float betas[] = {1.0f, 0.0f, 0.5f, -0.25f};
    bool gpu = target == WNA16_TARGET_CUDA;
    fm_limits_t lim = limits_of(target);
    memset(c, 0, sizeof *c);
    c->spec = fixed ? fixed : pick_backend(ctx, r, target);
    /* every activation on the CPU; the CUDA kernels run the gated ones */
    c->act = (wna16_activation_t)fz_below(r, gpu ? 5 : WNA16_ACT_COUNT_);
    c->limit = lims[fz_below(r, 3)];
    c->alpha = WNA16_SWIGLU_ALPHA_DEFAULT;
    c->beta = WNA16_SWIGLU_BETA_DEFAULT;
    if (fz_below(r, 2)) {
        c->alpha = alphas[fz_below(r, 4)];
        c->beta = betas[fz_below(r, 4)];
    }
    c->q.bits = fz_below(r, 3) ? 4 : 8;
    c->q.group_size = gss[fz_below(r, 4)];
    /* the CUDA kernels hold 4-bit zero points only */
    c->q.zero_point = fz_below(r, 2) && (!gpu || c->q.bits == 4);
    /* act order where the layout holds it (Marlin's sorted K and g_idx:
     * the CUDA kernels, and the CPU's generated kernels code by code) */
    c->q.act_order = c->q.group_size > 0 && fz_below(r, 5) == 0 &&
                     (gpu || (c->spec && c->spec->caps.act_order));
    c->q.bias = fz_below(r, 3) == 0;
    c->dtype = fz_below(r, 2) ? WNA16_DTYPE_BF16 : WNA16_DTYPE_F16;
    c->scales = fz_below(r, 3) ? c->dtype
                               : fz_below(r, 2) ? WNA16_DTYPE_BF16
                                                : WNA16_DTYPE_F16;
    c->round = fz_below(r, 4) == 0;
    c->on_input = fz_below(r, 5) == 0;
    /* H and I multiples of the group (of 16 and 8 channelwise; then a
     * quarter of the I's are ragged: not a multiple of 64) */
    int32_t g = c->q.group_size;
    int32_t uh = g > 0 ? g : 16, ui = g > 0 ? g : 8;
    c->H = uh * (1 + (int32_t)fz_below(r, (uint32_t)(lim.max_hi / uh)));
    c->I = ui * (1 + (int32_t)fz_below(r, (uint32_t)(lim.max_hi / ui)));
    if (g <= 0 && fz_below(r, 4) == 0)
        c->I = 4 * (1 + (int32_t)fz_below(r, (uint32_t)(lim.max_hi / 4)));
    /* the CPU's JIT compiles per expert count as any other: its cases
     * keep few experts to stay fast; the other targets reach vLLM's 64 */
    const int32_t *Es = target == WNA16_TARGET_CPU ? cpu_E : gpu_E;
    c->E = Es[fz_below(r, 7)];
    while (c->E > 1 && (double)c->E * c->H * c->I > lim.max_layer)
        c->E /= 2;
    c->batched = fz_below(r, 4) == 0 && w16_spec_moe_takes_batched(c->spec);
    /* M: one token, a few, dozens, hundreds */
    uint32_t mb = fz_below(r, 6);
    c->M = mb == 0 ? 1 : mb < 3 ? 2 + (int32_t)fz_below(r, 15)
         : mb < 5 ? 17 + (int32_t)fz_below(r, 48)
                  : 65 + (int32_t)fz_below(r, gpu ? 900 : 236);
    if (c->batched) {
        c->M = 1 + (int32_t)fz_below(r, gpu ? 160 : 48);
        c->weights = fz_below(r, 2);
        c->topk = 1;
        c->active = c->E;
        if (fz_below(r, 3) == 0) /* experts with no tokens */
            c->active = (int32_t)fz_below(r, (uint32_t)c->E + 1);
    } else {
        c->weights = true;
        if (fz_below(r, 4) == 0)
            c->map = c->E + 1 + (int32_t)fz_below(r, (uint32_t)c->E + 1);
        int32_t n = n_ids(c);
        c->topk = 1 + (int32_t)fz_below(r, (uint32_t)(n < 8 ? n : 8));
        c->active = n;
        if (fz_below(r, 3) == 0) /* experts with no tokens */
            c->active = c->topk +
                        (int32_t)fz_below(r, (uint32_t)(n - c->topk + 1));
    }
    /* the work: the reference's and the bound's */
    double rows = c->batched ? (double)c->E * c->M : (double)c->M * c->topk;
    while (c->M > 1 && rows * c->H * c->I > lim.max_work) {
        c->M = (c->M + 1) / 2;
        rows = c->batched ? (double)c->E * c->M : (double)c->M * c->topk;
    }
    c->bad = FM_BAD_NONE;
    if (fz_below(r, 16) == 0) {
        fm_bad_t b = (fm_bad_t)(1 + fz_below(r, FM_BAD_COUNT_ - 1));
        if (bad_applies(c, b))
            c->bad = b;
    }
    c->data = fz_next(r);
    case_fix(c);
}

/* ---- one case's values ------------------------------------------------------ */

/* m / 128 * 2^-sh with 0 < m < 128: exact in fp16 (sh <= 17) and bf16. */
static float exact7(fz_rng_t *r, int sh)
{
    return ldexpf((float)(1 + fz_below(r, 127)) / 128.0f, -sh);
}

static float to_act(wna16_dtype_t dt, float v)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f16_to_f32(wna16_f32_to_f16(v))
                                 : wna16_bf16_to_f32(wna16_f32_to_bf16(v));
}

static uint16_t act_bits(wna16_dtype_t dt, float v)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v) : wna16_f32_to_bf16(v);
}

static float act_value(wna16_dtype_t dt, uint16_t b)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f16_to_f32(b) : wna16_bf16_to_f32(b);
}

/* A random operand whose terms keep h, a and y about 1 (no fp16
 * overflow): scales about 2^-bits / sqrt(K). */
static bool operand(fz_rng_t *r, const fm_case_t *c, wna16_qweight_t *w,
                    int32_t N, int32_t K)
{
    wna16_error_t err;
    const wna16_quant_desc_t *q = &c->q;
    if (wna16_qweight_alloc(w, c->E, N, K, q->bits, q->group_size,
                            q->zero_point, q->act_order, q->bias, &err))
        return false;
    w->scale_dtype = w->bias_dtype = c->scales;
    size_t nc = (size_t)c->E * N * K, ng = (size_t)c->E * w->G * N;
    for (size_t i = 0; i < nc; i++)
        w->codes[i] = (uint8_t)fz_below(r, 1u << q->bits);
    int sh = q->bits - 1;
    for (int32_t k = K; k > 1; k /= 4)
        sh++;
    for (size_t i = 0; i < ng; i++) {
        w->scales[i] = exact7(r, sh);
        if (w->zeros)
            w->zeros[i] = (uint8_t)fz_below(r, 1u << q->bits);
    }
    if (w->bias)
        for (size_t i = 0; i < (size_t)c->E * N; i++)
            w->bias[i] = fz_below(r, 2) ? exact7(r, 1) : -exact7(r, 1);
    if (w->g_idx) /* every group used, the rest at random */
        for (int32_t e = 0; e < c->E; e++)
            for (int32_t k = 0; k < K; k++)
                w->g_idx[(size_t)e * K + k] =
                    k < w->G ? k : (int32_t)fz_below(r, (uint32_t)w->G);
    return true;
}

static void shuffle(fz_rng_t *r, int32_t *v, int32_t n)
{
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)fz_below(r, (uint32_t)i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* The inputs of one call, drawn from the case's seed after the layer. */
typedef struct fm_inputs {
    wna16_moe_params_t p;
    int32_t rows;       /* rows of hidden and out */
    int32_t topk;       /* what the call is given (FM_BAD_TOPK: too many) */
    uint16_t *hidden, *ref, *got;
    int32_t *ids;       /* [M][topk] */
    float *w;           /* [M][topk], or [E][max_tokens] batched */
    int32_t *map;       /* [map] */
    int32_t *counts;    /* [E] batched */
} fm_inputs_t;

static void inputs_free(fm_inputs_t *in)
{
    free(in->hidden);
    free(in->ref);
    free(in->got);
    free(in->ids);
    free(in->w);
    free(in->map);
    free(in->counts);
}

static bool make_inputs(fz_rng_t *r, const fm_case_t *c, fm_inputs_t *in)
{
    memset(in, 0, sizeof *in);
    wna16_moe_params_init(&in->p);
    in->p.activation = c->act;
    in->p.swiglu_limit = c->limit;
    in->p.swiglu_alpha = c->alpha;
    in->p.swiglu_beta = c->beta;
    in->p.act_dtype = c->dtype;
    in->p.round_gemm_outputs = c->round;
    in->p.apply_router_weight_on_input = c->on_input;
    in->rows = c->batched ? c->E * c->M : c->M;
    in->topk = c->bad == FM_BAD_TOPK ? n_ids(c) + 1 : c->topk;
    size_t nout = (size_t)in->rows * c->H;
    size_t slots = c->batched ? (size_t)in->rows : (size_t)c->M * in->topk;
    in->hidden = malloc(nout * 2);
    in->ref = malloc(nout * 2);
    in->got = malloc(nout * 2);
    in->w = malloc((slots ? slots : 1) * sizeof(float));
    if (!in->hidden || !in->ref || !in->got || !in->w)
        return false;
    for (size_t i = 0; i < nout; i++)
        in->hidden[i] = act_bits(c->dtype, (float)(2.0 * fz_unit(r) - 1.0));
    for (size_t i = 0; i < slots; i++)
        in->w[i] = (float)(0.05 + 0.95 * fz_unit(r));
    if (c->batched) {
        in->counts = calloc((size_t)c->E, sizeof(int32_t));
        int32_t *perm = malloc((size_t)c->E * sizeof(int32_t));
        if (!in->counts || !perm) {
            free(perm);
            return false;
        }
        for (int32_t e = 0; e < c->E; e++)
            perm[e] = e;
        shuffle(r, perm, c->E);
        for (int32_t i = 0; i < c->active; i++) /* the first one full */
            in->counts[perm[i]] =
                i == 0 ? c->M : (int32_t)fz_below(r, (uint32_t)c->M + 1);
        free(perm);
        if (c->bad == FM_BAD_COUNT)
            in->counts[fz_below(r, (uint32_t)c->E)] = c->M + 1;
        return true;
    }
    int32_t n = n_ids(c);
    if (c->map) { /* E of the global experts are here, at random places */
        in->map = malloc((size_t)n * sizeof(int32_t));
        int32_t *perm = malloc((size_t)n * sizeof(int32_t));
        if (!in->map || !perm) {
            free(perm);
            return false;
        }
        for (int32_t gl = 0; gl < n; gl++) {
            perm[gl] = gl;
            in->map[gl] = -1;
        }
        shuffle(r, perm, n);
        for (int32_t e = 0; e < c->E; e++)
            in->map[perm[e]] = e;
        free(perm);
        in->p.expert_map = in->map;
        in->p.global_num_experts = n;
        if (c->bad == FM_BAD_MAP)
            in->map[fz_below(r, (uint32_t)n)] = fz_below(r, 2) ? c->E : -2;
    }
    /* distinct ids a token from a pool of `active` of the ids */
    size_t nid = (size_t)c->M * in->topk;
    in->ids = malloc(nid * sizeof(int32_t));
    int32_t *pool = malloc((size_t)n * sizeof(int32_t));
    if (!in->ids || !pool) {
        free(pool);
        return false;
    }
    for (int32_t gl = 0; gl < n; gl++)
        pool[gl] = gl;
    shuffle(r, pool, n);
    for (int32_t m = 0; m < c->M; m++) {
        /* a partial shuffle of the pool's first `active` */
        for (int32_t j = 0; j < c->topk; j++) {
            int32_t k = j + (int32_t)fz_below(r, (uint32_t)(c->active - j));
            int32_t t = pool[j];
            pool[j] = pool[k];
            pool[k] = t;
            in->ids[(size_t)m * in->topk + j] = pool[j];
        }
        for (int32_t j = c->topk; j < in->topk; j++)
            in->ids[(size_t)m * in->topk + j] = j % n;
    }
    free(pool);
    if (c->bad == FM_BAD_ID)
        in->ids[fz_below(r, (uint32_t)nid)] = fz_below(r, 2) ? n : -1;
    return true;
}

/* The bad arguments that live in the parameters. */
static void spoil_params(const fm_case_t *c, wna16_moe_params_t *p)
{
    if (c->bad == FM_BAD_DTYPE)
        p->act_dtype = WNA16_DTYPE_F32;
    else if (c->bad == FM_BAD_LIMIT)
        p->swiglu_limit = 0.0f;
    else if (c->bad == FM_BAD_GATING)
        p->activation = wna16_activation_is_gated(c->act)
                            ? WNA16_ACT_SILU_NO_MUL : WNA16_ACT_SILU;
}

/* ---- the tolerance ------------------------------------------------------------ */

/* The intermediate size after Marlin's padding (lcm(64, group size)). */
static int32_t marlin_padded(int32_t I, int32_t gs)
{
    int32_t l = gs > 0 ? (64 % gs == 0 ? 64 : (gs % 64 == 0 ? gs : 64 * gs))
                       : 64;
    return (I + l - 1) / l * l;
}

/* The bound on |kernel - reference| of every output element
 * (runtime/ref/moe_bound.h): the CUDA kernels round (q - z) * s to the
 * activation dtype before the product with grouped scales, the CPU's are
 * exact in float32; the float32 sums over K; int8-dynamic adds a code
 * step of a (below). It holds the CPU's kernels (tests/moe/test_moe_gen.c:
 * 2 ulps + 2 eps mag) too. */

/* One routed row m of expert e with router weight wr: its input as the
 * reference reads it (scaled on input when the call says so) and its
 * coefficient in the sum. */
static void add_row(w16_moe_bound_t *b, const fm_case_t *c,
                    const fm_inputs_t *in, int32_t e, int32_t m, float wr,
                    bool scale_in, double cw, float *x, double *bound)
{
    const uint16_t *xr = in->hidden + (size_t)m * c->H;
    float rw = to_act(c->dtype, wr);
    for (int32_t k = 0; k < c->H; k++) {
        float v = act_value(c->dtype, xr[k]);
        x[k] = scale_in ? to_act(c->dtype, v * rw) : v;
    }
    w16_moe_bound_row(b, e, x, cw, bound + (size_t)m * c->H);
}

/* bound[rows][H]; false when out of memory. */
static bool compute_bound(const fm_case_t *c, const wna16_qlayer_t *L,
                          const fm_inputs_t *in, wna16_target_t target,
                          wna16_numerics_t nu, double *bound)
{
    w16_moe_bound_t b = {.L = L, .p = &in->p, .act_dtype = c->dtype,
                         .round = c->round,
                         .gated = wna16_activation_is_gated(c->act)};
    if (target == WNA16_TARGET_CUDA) {
        int pbits = c->dtype == WNA16_DTYPE_F16 ? 11 : 8;
        int32_t gs = c->q.group_size, ip = marlin_padded(c->I, gs);
        b.eps_w13 = gs > 0 && gs < c->H ? ldexp(1.0, -pbits) : 0.0;
        b.eps_w2 = gs > 0 && gs < ip ? ldexp(1.0, -pbits) : 0.0;
        b.eps2 = ip * 0x1p-23;
    } else {
        b.eps2 = c->I * 0x1p-23;
    }
    b.eps13 = c->H * 0x1p-23;
    /* int8-dynamic against its own reference: the same int32 sums and
     * float order (h bit-identical); a flip of a's rounding (the kernels'
     * vector exp and erf) can move that row's 8-bit code of a by one:
     * at most max|a| / 127 times |W2| (tests/moe/test_moe_gen.c) */
    if (nu == WNA16_NUMERICS_INT8_DYNAMIC)
        b.eps2 += 0x1p-6;
    float *x = malloc((size_t)c->H * sizeof(float));
    bool ok = x && w16_moe_bound_init(&b);
    if (ok) {
        bool on_in = c->on_input;
        for (int32_t e = 0; e < c->E; e++) {
            bool loaded = false;
            if (c->batched) {
                for (int32_t rr = 0; rr < in->counts[e]; rr++) {
                    int32_t m = e * c->M + rr;
                    if (!loaded)
                        w16_moe_bound_expert(&b, e);
                    loaded = true;
                    float wr = c->weights ? in->w[m] : 1.0f;
                    add_row(&b, c, in, e, m, wr, on_in && c->weights,
                            c->weights && !on_in ? wr : 1.0, x, bound);
                }
                continue;
            }
            for (int32_t s = 0; s < c->M * in->topk; s++) {
                int32_t gl = in->ids[s];
                if ((in->map ? in->map[gl] : gl) != e)
                    continue;
                if (!loaded)
                    w16_moe_bound_expert(&b, e);
                loaded = true;
                add_row(&b, c, in, e, s / in->topk, in->w[s], on_in,
                        on_in ? 1.0 : in->w[s], x, bound);
            }
        }
    }
    w16_moe_bound_free(&b);
    free(x);
    return ok;
}

/* ---- one case ---------------------------------------------------------------- */

/* The kernel path of a target: a layer bound once, then one call. */
typedef struct fm_kernel {
    wna16_target_t target;
    wna16_moe_layer_t *layer;  /* cpu */
    wna16_cuda_moe_t *cuda;    /* cuda */
} fm_kernel_t;

static wna16_status_t kernel_create(wna16_context_t *ctx, const fm_case_t *c,
                                    const wna16_tensor_set_t *set,
                                    fm_kernel_t *k, wna16_error_t *err)
{
    if (k->target == WNA16_TARGET_CUDA)
        return wna16_cuda_moe_create(ctx, c->spec, set, "m.experts", c->E,
                                     c->H, c->I, &c->q, false, &k->cuda, err);
    return wna16_moe_layer_create(ctx, c->spec, set, "m.experts", c->E, c->H,
                                  c->I, &c->q, k->target, &k->layer, err);
}

static void kernel_destroy(fm_kernel_t *k)
{
    wna16_moe_layer_destroy(k->layer);
    wna16_cuda_moe_destroy(k->cuda);
}

static wna16_status_t kernel_run(fm_kernel_t *k, const fm_case_t *c,
                                 const fm_inputs_t *in,
                                 const wna16_moe_params_t *p,
                                 wna16_error_t *err)
{
    const float *bw = c->weights ? in->w : NULL;
    if (k->cuda)
        return c->batched
            ? wna16_cuda_moe_run_batched(k->cuda, p, in->hidden, c->M,
                                         in->counts, bw, in->got, err)
            : wna16_cuda_moe_run(k->cuda, p, in->hidden, c->M, in->ids, in->w,
                                 in->topk, in->got, err);
    return c->batched
        ? wna16_moe_layer_run_batched(k->layer, p, in->hidden, c->M,
                                      in->counts, bw, in->got, err)
        : wna16_moe_layer_run(k->layer, p, in->hidden, c->M, in->ids, in->w,
                              in->topk, in->got, err);
}

/* The numeric contract the kernel path computes (the CPU layer says;
 * the CUDA kernels' rounding is in the bound). */
static wna16_numerics_t kernel_numerics(const fm_kernel_t *k)
{
    return k->layer ? wna16_moe_layer_numerics(k->layer) : WNA16_NUMERICS_F32;
}

static wna16_status_t ref_run(const wna16_qlayer_t *L, const fm_case_t *c,
                              const fm_inputs_t *in,
                              const wna16_moe_params_t *p,
                              wna16_numerics_t nu, wna16_error_t *err)
{
    return c->batched
        ? wna16_ref_moe_batched_numerics(L, p, nu, in->hidden, c->M,
                                         in->counts, c->weights ? in->w : NULL,
                                         in->ref, err)
        : wna16_ref_moe_numerics(L, p, nu, in->hidden, c->M, in->ids, in->w,
                                 in->topk, in->ref, err);
}

/* --inject-fault: one output element made wrong in every case of two
 * tokens (rows a batched expert) or more, after the kernel wrote it */
static bool inject_fault;

/* What a case measured (for --verbose and --case). */
typedef struct fm_stats {
    size_t total, exact; /* outputs compared, bit-identical */
    double worst;        /* largest |kernel - reference| / allowed */
} fm_stats_t;

/* Compares got with ref within the bound; msg names the first element
 * outside it. */
static bool check_outputs(const fm_case_t *c, const fm_inputs_t *in,
                          const double *bound, fm_stats_t *st, char *msg,
                          size_t n)
{
    size_t nout = (size_t)in->rows * c->H, bad = 0;
    for (size_t i = 0; i < nout; i++) {
        double g = act_value(c->dtype, in->got[i]);
        double w = act_value(c->dtype, in->ref[i]);
        st->total++;
        if (in->got[i] == in->ref[i] || g == w) {
            st->exact++;
            continue;
        }
        double allowed = 2.0 * (bound[i] + w16_act_ulp(c->dtype, w)) + 1e-30;
        double d = fabs(g - w), ratio = d / allowed;
        if (isnan(ratio) || ratio > st->worst)
            st->worst = isnan(ratio) ? INFINITY : ratio;
        if (!(d <= allowed) && bad++ == 0)
            snprintf(msg, n, "out[%zu][%zu] = %.9g, reference %.9g, allowed "
                     "%.3g", i / (size_t)c->H, i % (size_t)c->H, g, w,
                     allowed);
    }
    if (bad) {
        size_t len = strlen(msg);
        snprintf(msg + len, n - len, " (%zu of %zu outputs outside the "
                 "tolerance)", bad, nout);
    }
    return bad == 0;
}

static fz_outcome_t run_case(wna16_context_t *ctx, const fm_case_t *c,
                             wna16_target_t target, fm_stats_t *stats,
                             char *msg, size_t n)
{
    *msg = '\0';
    fm_stats_t st = {0};
    if (!case_valid(c))
        return FZ_INVALID;
    fz_rng_t r = {c->data};
    bool gated = wna16_activation_is_gated(c->act);
    wna16_qlayer_t L = {.E = c->E, .H = c->H, .I = c->I};
    wna16_tensor_set_t *set = NULL;
    fm_kernel_t k = {.target = target};
    fm_inputs_t in = {0};
    double *bound = NULL;
    wna16_error_t err, e1, e2;
    fz_outcome_t out = FZ_FAILED;
    if (!operand(&r, c, &L.w13, gated ? 2 * c->I : c->I, c->H) ||
        !operand(&r, c, &L.w2, c->H, c->I)) {
        snprintf(msg, n, "out of memory (the layer)");
        goto done;
    }
    if (wna16_tensor_set_create(ctx, &set, &err)) {
        snprintf(msg, n, "%s", err.message);
        goto done;
    }
    if (wna16_ref_encode(ctx, c->spec, &L, "m.experts", set, &err)) {
        out = FZ_INVALID; /* the layout cannot hold this layer */
        snprintf(msg, n, "%s", err.message);
        goto done;
    }
    wna16_status_t s = kernel_create(ctx, c, set, &k, &err);
    if (s != WNA16_OK) {
        out = s == WNA16_EUNSUPPORTED ? FZ_UNSUPPORTED : FZ_FAILED;
        snprintf(msg, n, "%s: %s", target == WNA16_TARGET_CUDA
                 ? "wna16_cuda_moe_create" : "wna16_moe_layer_create",
                 err.message);
        goto done;
    }
    if (!make_inputs(&r, c, &in)) {
        snprintf(msg, n, "out of memory (the inputs)");
        goto done;
    }
    size_t nout = (size_t)in.rows * c->H;
    memset(in.got, 0xa5, nout * 2); /* every element must be written */
    wna16_moe_params_t p = in.p;
    spoil_params(c, &p);
    e1.message[0] = e2.message[0] = '\0';
    wna16_status_t r1 = ref_run(&L, c, &in, &p, kernel_numerics(&k), &e1);
    wna16_status_t r2 = kernel_run(&k, c, &in, &p, &e2);
    if (r1 != r2) {
        snprintf(msg, n, "reference %s%s%s, kernel %s%s%s",
                 wna16_status_name(r1), r1 ? ": " : "", r1 ? e1.message : "",
                 wna16_status_name(r2), r2 ? ": " : "", r2 ? e2.message : "");
        goto done;
    }
    if (r1 != WNA16_OK) {
        /* the same message, except where the kernel path documents its
         * own (a gating mismatch: the reference sees a w13 of the wrong
         * shape); `out` untouched */
        bool same = c->bad == FM_BAD_GATING ||
                    strcmp(e1.message, e2.message) == 0;
        bool untouched = true;
        for (size_t i = 0; i < nout && untouched; i++)
            untouched = in.got[i] == 0xa5a5;
        if (!same)
            snprintf(msg, n, "refusals differ: reference \"%s\", kernel "
                     "\"%s\"", e1.message, e2.message);
        else if (untouched)
            snprintf(msg, n, "%s", e2.message);
        else
            snprintf(msg, n, "the kernel refused (\"%s\") but wrote out",
                     e2.message);
        out = same && untouched ? FZ_REFUSED : FZ_FAILED;
        goto done;
    }
    if (inject_fault && c->M >= 2 && nout) {
        float v = act_value(c->dtype, in.got[nout / 2]);
        in.got[nout / 2] = act_bits(c->dtype, v >= 0 ? v - 512.0f : v + 512.0f);
    }
    bound = calloc(nout ? nout : 1, sizeof *bound);
    if (!bound || !compute_bound(c, &L, &in, target, kernel_numerics(&k), bound)) {
        snprintf(msg, n, "out of memory (the bound)");
        goto done;
    }
    out = check_outputs(c, &in, bound, &st, msg, n) ? FZ_SAME : FZ_FAILED;
done:
    if (stats)
        *stats = st;
    free(bound);
    inputs_free(&in);
    kernel_destroy(&k);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
    return out;
}

/* ---- shrinking ------------------------------------------------------------- */

enum { MAX_CANDIDATES = 48, MAX_SHRINK_STEPS = 96 };
_Static_assert((int)MAX_CANDIDATES <= (int)FZ_MAX_CANDIDATES, "candidates");

static bool same_case(const fm_case_t *a, const fm_case_t *b)
{
    return a->spec == b->spec && a->E == b->E && a->H == b->H &&
           a->I == b->I && a->M == b->M && a->topk == b->topk &&
           a->q.bits == b->q.bits && a->q.group_size == b->q.group_size &&
           a->q.zero_point == b->q.zero_point &&
           a->q.act_order == b->q.act_order && a->q.bias == b->q.bias &&
           a->act == b->act && a->limit == b->limit && a->alpha == b->alpha &&
           a->beta == b->beta && a->dtype == b->dtype &&
           a->scales == b->scales && a->round == b->round &&
           a->on_input == b->on_input && a->map == b->map &&
           a->active == b->active && a->batched == b->batched &&
           a->weights == b->weights && a->bad == b->bad && a->data == b->data;
}

/* Smaller versions of c, the biggest cuts first: fewer experts, tokens
 * and slots, smaller H and I, each option off. */
static int candidates(const fm_case_t *c, fm_case_t *out)
{
    int n = 0;
#define CAND(stmt)                                                           \
    do {                                                                     \
        fm_case_t t = *c;                                                    \
        stmt;                                                                \
        case_fix(&t);                                                        \
        if (case_valid(&t) && !same_case(&t, c) && n < MAX_CANDIDATES)       \
            out[n++] = t;                                                    \
    } while (0)
    CAND(t.E = 1);
    CAND(t.E = c->E / 2);
    CAND(t.E = c->E - 1);
    CAND(t.M = 1);
    CAND(t.M = c->M / 2);
    CAND(t.M = c->M - 1);
    CAND(t.topk = 1);
    CAND(t.topk = c->topk - 1);
    int32_t g = c->q.group_size, uh = g > 0 ? g : 16, ui = g > 0 ? g : 4;
    static const int32_t cuts[] = {4, 2};
    for (int i = 0; i < 2; i++) {
        if (c->H % cuts[i] == 0 && (c->H / cuts[i]) % uh == 0)
            CAND(t.H = c->H / cuts[i]);
        if (c->I % cuts[i] == 0 && (c->I / cuts[i]) % ui == 0)
            CAND(t.I = c->I / cuts[i]);
    }
    CAND(t.map = 0);
    CAND(t.active = n_ids(c));
    CAND(t.batched = false; t.topk = 1; t.active = c->E);
    CAND(t.weights = true);
    CAND(t.q.bias = false);
    CAND(t.q.act_order = false);
    CAND(t.q.zero_point = false);
    CAND(t.q.bits = 4);
    CAND(t.q.group_size = -1);
    CAND(t.round = false);
    CAND(t.on_input = false);
    CAND(t.act = wna16_activation_is_gated(c->act) ? WNA16_ACT_SILU
                                                   : WNA16_ACT_SILU_NO_MUL);
    CAND(t.limit = 7.0f; t.alpha = WNA16_SWIGLU_ALPHA_DEFAULT;
         t.beta = WNA16_SWIGLU_BETA_DEFAULT);
    CAND(t.dtype = WNA16_DTYPE_BF16);
    CAND(t.scales = t.dtype);
#undef CAND
    return n;
}

/* ---- the case text ------------------------------------------------------ */

static bool parse_float(const char *v, const char **end, float *out)
{
    char *e = NULL;
    *out = strtof(v, &e);
    *end = e;
    return e != v;
}

/* "LIMIT/ALPHA/BETA": limit > 0 (inf: no clamp), alpha and beta finite. */
static bool parse_swiglu(const char *v, fm_case_t *c)
{
    const char *e;
    if (!parse_float(v, &e, &c->limit) || *e != '/' ||
        !parse_float(e + 1, &e, &c->alpha) || *e != '/' ||
        !parse_float(e + 1, &e, &c->beta) || *e)
        return false;
    return c->limit > 0 && isfinite(c->alpha) && isfinite(c->beta);
}

static bool parse_dtype(const char *v, wna16_dtype_t *out)
{
    *out = wna16_dtype_from_name(v, strlen(v));
    return *out == WNA16_DTYPE_F16 || *out == WNA16_DTYPE_BF16;
}

/* keys[k] of a case's text into the case (fz_parse_fields). */
static bool set_field(void *user, int k, const char *v)
{
    fm_case_t *c = user;
    long x = 0;
    bool ok = true;
    switch (k) {
    case 0: ok = cli_parse_int(v, 1, 4096, &x); c->E = (int32_t)x; break;
    case 1: ok = cli_parse_int(v, 1, 65536, &x); c->H = (int32_t)x; break;
    case 2: ok = cli_parse_int(v, 1, 65536, &x); c->I = (int32_t)x; break;
    case 3: ok = cli_parse_int(v, 1, 1000000, &x); c->M = (int32_t)x; break;
    case 4: ok = cli_parse_int(v, 1, 4096, &x); c->topk = (int32_t)x; break;
    case 5: ok = cli_parse_int(v, 4, 8, &x) && (x == 4 || x == 8);
            c->q.bits = (int32_t)x; break;
    case 6: /* -1: channelwise */
            if (strcmp(v, "-1") == 0)
                x = -1;
            else
                ok = cli_parse_int(v, 1, 65536, &x);
            c->q.group_size = (int32_t)x; break;
    case 7: ok = fz_parse_bool(v, &c->q.zero_point); break;
    case 8: ok = fz_parse_bool(v, &c->q.act_order); break;
    case 9: ok = fz_parse_bool(v, &c->q.bias); break;
    case 10: c->act = wna16_activation_from_name(v);
             ok = c->act != WNA16_ACT_INVALID; break;
    case 11: ok = parse_swiglu(v, c); break;
    case 12: ok = parse_dtype(v, &c->dtype); break;
    case 13: ok = parse_dtype(v, &c->scales); break;
    case 14: ok = fz_parse_bool(v, &c->round); break;
    case 15: ok = fz_parse_bool(v, &c->on_input); break;
    case 16: ok = cli_parse_int(v, 0, 65536, &x); c->map = (int32_t)x;
             break;
    case 17: ok = cli_parse_int(v, 0, 65536, &x); c->active = (int32_t)x;
             break;
    case 18: ok = fz_parse_bool(v, &c->batched); break;
    case 19: ok = fz_parse_bool(v, &c->weights); break;
    case 20: {
        int b = 0;
        while (b < FM_BAD_COUNT_ && strcmp(v, bad_names[b]))
            b++;
        ok = b < FM_BAD_COUNT_;
        c->bad = (fm_bad_t)b;
        break;
    }
    default: {
        char *end = NULL;
        c->data = strtoull(v, &end, 0);
        ok = *v && end && *end == '\0';
    }
    }
    return ok;
}

/* Reads what case_text writes; every key must be present. Returns NULL or
 * the reason, naming the token. */
static const char *parse_case(wna16_context_t *ctx, wna16_target_t target,
                              const char *text, fm_case_t *c, char *why,
                              size_t n)
{
    static const char *const keys[] = {
        "E", "H", "I", "M", "topk", "bits", "group", "zp", "actorder",
        "bias", "act", "swiglu", "dtype", "scales", "round", "oninput", "map",
        "active", "batched", "weights", "bad", "data"};
    char buf[1024];
    if (strlen(text) >= sizeof buf)
        return "too long";
    snprintf(buf, sizeof buf, "%s", text);
    memset(c, 0, sizeof *c);
    char *save = NULL;
    char *tok = strtok_r(buf, " \t\n", &save);
    c->spec = tok ? wna16_spec_find(ctx, (wna16_spec_kind_t)0, tok) : NULL;
    if (!c->spec || !runs_on(c->spec, target)) {
        snprintf(why, n, "expected a backend whose fused MoE the %s target "
                 "runs first, found '%s'", wna16_target_name(target),
                 tok ? tok : "");
        return why;
    }
    return fz_parse_fields(&save, keys, (int)(sizeof keys / sizeof keys[0]),
                           set_field, c, why, n);
}

/* ---- the command ------------------------------------------------------------ */

/* The fused-MoE kind for the shared pieces (fuzz_case.c). */
static void kind_text(const void *c, char *buf, size_t n)
{
    case_text(c, buf, n);
}
static fz_outcome_t kind_run(wna16_context_t *ctx, const void *c,
                             wna16_target_t target, char *msg, size_t n)
{
    return run_case(ctx, c, target, NULL, msg, n);
}
static int kind_candidates(const void *c, void *out)
{
    return candidates(c, out);
}
static const fz_cases_t moe_kind = {
    .case_size = sizeof(fm_case_t), .max_steps = MAX_SHRINK_STEPS,
    .options = " --kind moe", .text = kind_text, .run = kind_run,
    .candidates = kind_candidates};

int fuzz_moe_one(wna16_context_t *ctx, const fz_opts_t *o, fz_report_t *rep)
{
    fm_case_t c;
    char why[512], msg[1024], text[FZ_TEXT];
    inject_fault = o->inject_fault;
    if (parse_case(ctx, o->target, o->one, &c, why, sizeof why))
        return cli_usage_error(CMD, "--case: %s", why);
    case_text(&c, text, sizeof text);
    fm_stats_t st;
    fz_outcome_t out = run_case(ctx, &c, o->target, &st, msg, sizeof msg);
    rep->tally[out]++;
    switch (out) {
    case FZ_SAME:
        fprintf(o->out, "ok   %s: within the tolerance (%zu of %zu outputs "
               "bit-identical, worst %.3f of the allowed)\n", text, st.exact,
               st.total, st.worst);
        return CLI_OK;
    case FZ_REFUSED:
        fprintf(o->out, "ok   %s: refused alike (%s)\n", text, msg);
        return CLI_OK;
    case FZ_UNSUPPORTED:
        fprintf(o->out, "ok   %s: unsupported by the %s target (%s)\n", text,
               wna16_target_name(o->target), msg);
        return CLI_OK;
    case FZ_INVALID:
        fprintf(stderr, "wna16 fuzz: %s: not a problem the layout and the "
                "routing can hold%s%s\n", text, *msg ? ": " : "", msg);
        return CLI_FAIL;
    case FZ_FAILED:
        break;
    }
    return fz_report_failure(&moe_kind, ctx, o, &c, msg, sizeof msg, rep);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int fuzz_moe_many(wna16_context_t *ctx, const fz_opts_t *o, fz_report_t *rep)
{
    const wna16_spec_t *fixed = NULL;
    inject_fault = o->inject_fault;
    if (o->backend && !((fixed = wna16_spec_find(ctx, (wna16_spec_kind_t)0,
                                                    o->backend)) &&
                        runs_on(fixed, o->target)))
        return cli_usage_error(CMD, "--backend: the %s target's fused MoE "
                               "does not run '%s' (%s)",
                               wna16_target_name(o->target), o->backend,
                               o->target == WNA16_TARGET_CUDA
                               ? "marlin or batched_marlin"
                               : "a stacked layout with codes and scales");
    fz_rng_t r = {o->seed};
    long *tally = rep->tally, tries = 0;
    bool tty = isatty(STDERR_FILENO);
    char msg[1024];
    double t0 = now_s();
    for (long done = 0; done < o->count;) {
        fm_case_t c;
        draw(ctx, &r, fixed, o->target, &c);
        tries++;
        fm_stats_t st;
        double t1 = now_s();
        fz_outcome_t out = run_case(ctx, &c, o->target, &st, msg, sizeof msg);
        if (out == FZ_INVALID && tries < 50 * o->count)
            continue; /* not a problem: draw again */
        tally[out]++;
        done++;
        if (o->verbose) {
            char text[FZ_TEXT];
            case_text(&c, text, sizeof text);
            static const char *const what[] = {"within the tolerance",
                                               "refused alike", "skipped",
                                               "FAILED", "unsupported"};
            fprintf(stderr, "[%ld/%ld] %s: %s", done, o->count, text,
                    what[out]);
            if (out == FZ_SAME)
                fprintf(stderr, " (worst %.3f)", st.worst);
            fprintf(stderr, ", %.0f ms\n", 1e3 * (now_s() - t1));
        } else {
            fz_progress(o, done, tty);
        }
        if (out == FZ_FAILED) {
            if (tty && !o->verbose)
                fputc('\n', stderr);
            fz_report_failure(&moe_kind, ctx, o, &c, msg, sizeof msg, rep);
            break;
        }
    }
    fprintf(o->out, "wna16 fuzz: %ld moe cases (seed %#" PRIx64 ", target %s, "
           "%.1f s):"
           " %ld within the tolerance, %ld refused alike, %ld unsupported, "
           "%ld skipped, %ld failed%s\n",
           tally[FZ_SAME] + tally[FZ_REFUSED] + tally[FZ_INVALID] +
               tally[FZ_FAILED] + tally[FZ_UNSUPPORTED],
           o->seed, wna16_target_name(o->target), now_s() - t0, tally[FZ_SAME],
           tally[FZ_REFUSED], tally[FZ_UNSUPPORTED], tally[FZ_INVALID],
           tally[FZ_FAILED],
           tally[FZ_FAILED] ? " (stopped at the first failure)" : "");
    return tally[FZ_FAILED] ? CLI_FAIL : CLI_OK;
}
