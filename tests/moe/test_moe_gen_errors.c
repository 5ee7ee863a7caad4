/*
 * test_moe_gen_errors.c - bad arguments to the generated fused MoE:
 *  - wna16_moe_layer_create refuses, with a message naming the culprit,
 *    NULL arguments, targets other than the CPU, per-expert layouts,
 *    layouts without codes, act-order where the layout has no g_idx, what
 *    the layout cannot hold, and
 *    missing, misshapen or mistyped tensors;
 *  - wna16_moe_layer_run and _run_batched refuse exactly what the
 *    reference refuses, with the same status and message (they share the
 *    rules), leave `out` untouched when they do, and refuse an activation
 *    whose gating does not match the layer's w13;
 *  - M = 0 and max_tokens = 0 do nothing;
 *  - the model's dtype (quant->model_dtype): a layer created for a bf16
 *    model refuses f16 scales in a model-dtype layout (triton) and f16
 *    activations, naming both, and runs bf16 ones; the CPU layout's F32
 *    scales are not the model's dtype and are taken; a dtype other than
 *    F16/BF16 is refused; without one, either activation dtype runs;
 *  - act order on the Marlin layout (sorted K): a layer whose g_idx holds
 *    a value outside the layer's groups, or whose sort indices are not a
 *    permutation, is refused naming the tensor and the position (the
 *    kernels index with them unchecked).
 * Skips (77) without LLVM.
 */
#include "moe_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E = 4, H = 64, I = 32, M = 3, TOPK = 2 };

static wna16_context_t *ctx;
static tu_rng_t rng;

/* A gated 4-bit group-32 layer with zero points, encoded for `backend`. */
static wna16_tensor_set_t *encode(const char *backend, bool zp, bool gated,
                                  wna16_qlayer_t *L)
{
    wna16_error_t err;
    *L = (wna16_qlayer_t){.E = E, .H = H, .I = I};
    TU_OK(wna16_qweight_alloc(&L->w13, E, gated ? 2 * I : I, H, 4, 32, zp,
                              false, false, &err), &err);
    TU_OK(wna16_qweight_alloc(&L->w2, E, H, I, 4, 32, zp, false, false, &err),
          &err);
    wna16_qweight_t *q[2] = {&L->w13, &L->w2};
    for (int o = 0; o < 2; o++) {
        for (size_t i = 0; i < (size_t)q[o]->E * q[o]->N * q[o]->K; i++)
            q[o]->codes[i] = (uint8_t)tu_rng_below(&rng, 16);
        for (size_t i = 0; i < (size_t)q[o]->E * q[o]->G * q[o]->N; i++) {
            q[o]->scales[i] = 0.0625f;
            if (q[o]->zeros)
                q[o]->zeros[i] = (uint8_t)tu_rng_below(&rng, 16);
        }
    }
    wna16_tensor_set_t *set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    TU_OK(wna16_ref_encode(ctx, wna16_spec_find(ctx, WNA16_SPEC_BACKEND, backend),
                           L, "m", set, &err), &err);
    return set;
}

static void expect(wna16_status_t got, wna16_status_t want,
                   const wna16_error_t *err, const char *needle,
                   const char *what)
{
    TU_CHECK_MSG(got == want, "%s: %s (%s), expected %s", what,
                 wna16_status_name(got), err->message, wna16_status_name(want));
    TU_CHECK_MSG(strstr(err->message, needle) != NULL, "%s: message \"%s\" "
                 "lacks \"%s\"", what, err->message, needle);
}

static void create_errors(void)
{
    wna16_qlayer_t L;
    wna16_tensor_set_t *set = encode("triton", true, true, &L);
    const wna16_spec_t *triton = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
    wna16_quant_desc_t q = {.bits = 4, .group_size = 32, .zero_point = true};
    wna16_moe_layer_t *layer = (wna16_moe_layer_t *)&q; /* must be reset */
    wna16_error_t err;
#define CREATE(spec, ts, prefix, qd, target)                                  \
    wna16_moe_layer_create(ctx, spec, ts, prefix, E, H, I, qd, target,     \
                           &layer, &err)
    expect(wna16_moe_layer_create(ctx, triton, set, "m", E, H, I, &q,
                                  WNA16_TARGET_CPU, NULL, &err),
           WNA16_EINVAL, &err, "out is NULL", "NULL out");
    expect(CREATE(NULL, set, "m", &q, WNA16_TARGET_CPU), WNA16_EINVAL, &err,
           "backend is NULL", "NULL backend");
    TU_CHECK(layer == NULL);
    expect(CREATE(triton, NULL, "m", &q, WNA16_TARGET_CPU), WNA16_EINVAL, &err,
           "tensors is NULL", "NULL tensors");
    expect(CREATE(triton, set, "m", NULL, WNA16_TARGET_CPU), WNA16_EINVAL, &err,
           "quant is NULL", "NULL quant");
    expect(CREATE(triton, set, "m", &q, WNA16_TARGET_CUDA), WNA16_EUNAVAILABLE,
           &err, "cuda target unavailable", "CUDA target");
    expect(CREATE(triton, set, "m", &q, WNA16_TARGET_REFERENCE),
           WNA16_EUNAVAILABLE, &err, "reference target unavailable",
           "reference target");
    expect(CREATE(wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq"), set, "m", &q,
                  WNA16_TARGET_CPU), WNA16_EUNSUPPORTED, &err,
           "gptq stores one tensor per expert", "per-expert format");
    expect(CREATE(wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "emulation"), set,
                  "m", &q, WNA16_TARGET_CPU), WNA16_EUNSUPPORTED, &err,
           "emulation stores no quantized codes", "no codes");
    wna16_quant_desc_t ao = q;
    ao.act_order = true;
    expect(CREATE(triton, set, "m", &ao, WNA16_TARGET_CPU), WNA16_EUNSUPPORTED,
           &err, "triton cannot hold act-order", "act-order");
    expect(CREATE(wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "xpu"), set, "m", &q,
                  WNA16_TARGET_CPU), WNA16_EUNSUPPORTED, &err,
           "xpu has no zero points", "zero points on xpu");
    expect(CREATE(triton, set, "nope", &q, WNA16_TARGET_CPU), WNA16_ENOTFOUND,
           &err, "tensor 'nope.w13_qweight' not found", "missing tensor");
    /* a layer of 8 bits does not fit the 4-bit tensors' shapes */
    wna16_quant_desc_t b8 = q;
    b8.bits = 8;
    expect(CREATE(triton, set, "m", &b8, WNA16_TARGET_CPU), WNA16_EFORMAT, &err,
           "tensor 'm.w13_qweight': the triton layout needs shape [4, 64, 64] "
           "(gate and up) or [4, 32, 64]", "shape");
    /* the scales as F32, which the triton layout does not store */
    wna16_tensor_set_t *bad = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &bad, &err), &err);
    for (size_t i = 0; i < wna16_tensor_set_count(set); i++) {
        wna16_tensor_t t = *wna16_tensor_set_at(set, i);
        if (strcmp(t.name, "m.w2_scales") == 0)
            t.dtype = WNA16_DTYPE_F32;
        TU_OK(wna16_tensor_set_add_view(bad, &t, &err), &err);
    }
    expect(CREATE(triton, bad, "m", &q, WNA16_TARGET_CPU), WNA16_EFORMAT, &err,
           "tensor 'm.w2_scales': dtype F32 is not what the scales layout "
           "stores", "dtype");
    wna16_tensor_set_destroy(bad);
#undef CREATE
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

/* A bad call must fail in the layer exactly as in the reference. */
typedef struct call {
    wna16_moe_params_t p;
    const uint16_t *hidden;
    int32_t m, topk;
    const int32_t *ids;
    const float *w;
} call_t;

static void same_refusal(const wna16_qlayer_t *L, wna16_moe_layer_t *layer,
                         const call_t *c, const char *what)
{
    uint16_t out_ref[M * H], out_gen[M * H];
    memset(out_ref, 0x5a, sizeof out_ref);
    memset(out_gen, 0x5a, sizeof out_gen);
    wna16_error_t e1, e2;
    wna16_status_t r1 = wna16_ref_moe(L, &c->p, c->hidden, c->m, c->ids, c->w,
                                      c->topk, out_ref, &e1);
    wna16_status_t r2 = wna16_moe_layer_run(layer, &c->p, c->hidden, c->m,
                                            c->ids, c->w, c->topk, out_gen, &e2);
    TU_CHECK_MSG(r1 != WNA16_OK, "%s: the reference accepts it", what);
    TU_CHECK_MSG(r1 == r2 && strcmp(e1.message, e2.message) == 0,
                 "%s: reference %s \"%s\", generated %s \"%s\"", what,
                 wna16_status_name(r1), e1.message, wna16_status_name(r2),
                 e2.message);
    bool untouched = true;
    for (int i = 0; i < M * H; i++)
        untouched = untouched && out_gen[i] == 0x5a5a;
    TU_CHECK_MSG(untouched, "%s: out written on error", what);
}

static void run_errors(void)
{
    wna16_qlayer_t L;
    wna16_tensor_set_t *set = encode("triton", true, true, &L);
    wna16_quant_desc_t q = {.bits = 4, .group_size = 32, .zero_point = true};
    wna16_moe_layer_t *layer = NULL;
    wna16_error_t err;
    TU_OK(wna16_moe_layer_create(ctx, wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                      "triton"),
                                 set, "m", E, H, I, &q, WNA16_TARGET_CPU,
                                 &layer, &err), &err);
    if (!layer)
        return;
    uint16_t hidden[M * H];
    mt_random_act(&rng, WNA16_DTYPE_BF16, hidden, M * H, -1.0, 1.0);
    int32_t ids[M * TOPK] = {0, 1, 2, 3, 1, 2};
    float w[M * TOPK] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f};
    call_t good = {.hidden = hidden, .m = M, .topk = TOPK, .ids = ids, .w = w};
    wna16_moe_params_init(&good.p);
    call_t c;

    c = good; c.p.activation = (wna16_activation_t)99;
    same_refusal(&L, layer, &c, "invalid activation");
    c = good; c.p.act_dtype = WNA16_DTYPE_F32;
    same_refusal(&L, layer, &c, "F32 activations");
    c = good; c.p.activation = WNA16_ACT_SWIGLUOAI; c.p.swiglu_limit = 0.0f;
    same_refusal(&L, layer, &c, "swiglu limit 0");
    c = good; c.p.activation = WNA16_ACT_SWIGLUOAI; c.p.swiglu_alpha = NAN;
    same_refusal(&L, layer, &c, "swiglu alpha NaN");
    c = good; c.m = -1;
    same_refusal(&L, layer, &c, "M < 0");
    c = good; c.hidden = NULL;
    same_refusal(&L, layer, &c, "NULL hidden");
    c = good; c.ids = NULL;
    same_refusal(&L, layer, &c, "NULL ids");
    c = good; c.w = NULL;
    same_refusal(&L, layer, &c, "NULL weights");
    c = good; c.topk = 0;
    same_refusal(&L, layer, &c, "topk 0");
    c = good; c.topk = E + 1;
    same_refusal(&L, layer, &c, "topk > E");
    int32_t bad_ids[M * TOPK] = {0, 1, 2, E, 1, 2};
    c = good; c.ids = bad_ids;
    same_refusal(&L, layer, &c, "id out of range");
    c = good; c.p.global_num_experts = E + 1;
    same_refusal(&L, layer, &c, "global experts without a map");
    int32_t map[6] = {0, -1, 1, 2, 3, E};
    c = good; c.p.expert_map = map; c.p.global_num_experts = 6;
    same_refusal(&L, layer, &c, "map entry out of range");
    c = good; c.p.expert_map = map; c.p.global_num_experts = 0;
    same_refusal(&L, layer, &c, "map without global experts");

    /* gating: a non-gated activation on [gate; up] weights */
    uint16_t out[M * H];
    c = good; c.p.activation = WNA16_ACT_SILU_NO_MUL;
    expect(wna16_moe_layer_run(layer, &c.p, hidden, M, ids, w, TOPK, out, &err),
           WNA16_EINVAL, &err, "activation silu_no_mul is not gated, but the "
           "layer's w13 holds gate and up", "gating");
    expect(wna16_moe_layer_run(NULL, &good.p, hidden, M, ids, w, TOPK, out, &err),
           WNA16_EINVAL, &err, "layer is NULL", "NULL layer");
    /* M = 0 does nothing, with NULL buffers */
    TU_OK(wna16_moe_layer_run(layer, &good.p, NULL, 0, NULL, NULL, TOPK, NULL,
                              &err), &err);

    /* batched */
    enum { MAXT = 3 };
    uint16_t bh[E * MAXT * H], bo[E * MAXT * H];
    mt_random_act(&rng, WNA16_DTYPE_BF16, bh, E * MAXT * H, -1.0, 1.0);
    int32_t counts[E] = {1, 0, MAXT + 1, 2};
    wna16_error_t e1, e2;
    wna16_status_t r1 = wna16_ref_moe_batched(&L, &good.p, bh, MAXT, counts,
                                              NULL, bo, &e1);
    wna16_status_t r2 = wna16_moe_layer_run_batched(layer, &good.p, bh, MAXT,
                                                    counts, NULL, bo, &e2);
    TU_CHECK_MSG(r1 == WNA16_EINVAL && r1 == r2 &&
                 strcmp(e1.message, e2.message) == 0, "count > max_tokens: "
                 "\"%s\" vs \"%s\"", e1.message, e2.message);
    r1 = wna16_ref_moe_batched(&L, &good.p, bh, -1, counts, NULL, bo, &e1);
    r2 = wna16_moe_layer_run_batched(layer, &good.p, bh, -1, counts, NULL, bo,
                                     &e2);
    TU_CHECK_MSG(r1 == WNA16_EINVAL && r1 == r2 &&
                 strcmp(e1.message, e2.message) == 0, "max_tokens < 0: \"%s\" "
                 "vs \"%s\"", e1.message, e2.message);
    r1 = wna16_ref_moe_batched(&L, &good.p, bh, MAXT, NULL, NULL, bo, &e1);
    r2 = wna16_moe_layer_run_batched(layer, &good.p, bh, MAXT, NULL, NULL, bo,
                                     &e2);
    TU_CHECK_MSG(r1 == WNA16_EINVAL && r1 == r2 &&
                 strcmp(e1.message, e2.message) == 0, "NULL counts: \"%s\" vs "
                 "\"%s\"", e1.message, e2.message);
    int32_t none[E] = {0};
    TU_OK(wna16_moe_layer_run_batched(layer, &good.p, NULL, 0, none, NULL,
                                      NULL, &err), &err);
    wna16_moe_layer_destroy(layer);
    wna16_moe_layer_destroy(NULL);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

/* A non-gated layer runs the *_no_mul activations and refuses gated ones. */
static void ungated(void)
{
    wna16_qlayer_t L;
    wna16_tensor_set_t *set = encode("xpu", false, false, &L);
    wna16_quant_desc_t q = {.bits = 4, .group_size = 32};
    wna16_moe_layer_t *layer = NULL;
    wna16_error_t err;
    TU_OK(wna16_moe_layer_create(ctx, wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                      "xpu"),
                                 set, "m", E, H, I, &q, WNA16_TARGET_CPU,
                                 &layer, &err), &err);
    if (!layer)
        return;
    uint16_t hidden[M * H], out[M * H];
    mt_random_act(&rng, WNA16_DTYPE_BF16, hidden, M * H, -1.0, 1.0);
    int32_t ids[M * TOPK] = {0, 1, 2, 3, 1, 2};
    float w[M * TOPK] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f};
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    expect(wna16_moe_layer_run(layer, &p, hidden, M, ids, w, TOPK, out, &err),
           WNA16_EINVAL, &err, "activation silu is gated, but the layer's w13 "
           "holds one projection (N = I)", "gated activation, ungated layer");
    p.activation = WNA16_ACT_RELU2_NO_MUL;
    TU_OK(wna16_moe_layer_run(layer, &p, hidden, M, ids, w, TOPK, out, &err),
          &err);
    wna16_moe_layer_destroy(layer);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

static void model_dtype(void)
{
    wna16_qlayer_t L;
    wna16_tensor_set_t *set = encode("triton", true, true, &L); /* F16 */
    const wna16_spec_t *triton = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                 "triton");
    wna16_quant_desc_t q = {.bits = 4, .group_size = 32, .zero_point = true,
                            .model_dtype = WNA16_DTYPE_BF16};
    wna16_moe_layer_t *layer = NULL;
    wna16_error_t err;
    expect(wna16_moe_layer_create(ctx, triton, set, "m", E, H, I, &q,
                                  WNA16_TARGET_CPU, &layer, &err),
           WNA16_EINVAL, &err, "tensor 'm.w13_scales' is F16, but the layer's "
           "model dtype is BF16", "f16 scales, bf16 model");
    TU_CHECK(layer == NULL);
    wna16_quant_desc_t bad = q;
    bad.model_dtype = WNA16_DTYPE_F32;
    expect(wna16_moe_layer_create(ctx, triton, set, "m", E, H, I, &bad,
                                  WNA16_TARGET_CPU, &layer, &err),
           WNA16_EINVAL, &err, "model_dtype F32", "F32 model dtype");
    /* an f16 model's layer: bf16 activations are refused, f16 ones run */
    q.model_dtype = WNA16_DTYPE_F16;
    TU_OK(wna16_moe_layer_create(ctx, triton, set, "m", E, H, I, &q,
                                 WNA16_TARGET_CPU, &layer, &err), &err);
    uint16_t x[M * H], out[M * H];
    for (int i = 0; i < M * H; i++)
        x[i] = wna16_f32_to_f16(0.25f);
    int32_t ids[M * TOPK] = {0, 1, 1, 2, 3, 0};
    float w[M * TOPK] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    wna16_moe_params_t p;
    wna16_moe_params_init(&p); /* BF16 */
    memset(out, 0xab, sizeof out);
    expect(wna16_moe_layer_run(layer, &p, x, M, ids, w, TOPK, out, &err),
           WNA16_EINVAL, &err, "activation dtype BF16, but the layer's model "
           "dtype is F16", "bf16 activations, f16 model");
    TU_CHECK(out[0] == 0xabab);
    p.act_dtype = WNA16_DTYPE_F16;
    TU_OK(wna16_moe_layer_run(layer, &p, x, M, ids, w, TOPK, out, &err), &err);
    TU_CHECK(out[0] != 0xabab);
    wna16_moe_layer_destroy(layer);
    /* no model dtype: either runs */
    q.model_dtype = WNA16_DTYPE_INVALID;
    TU_OK(wna16_moe_layer_create(ctx, triton, set, "m", E, H, I, &q,
                                 WNA16_TARGET_CPU, &layer, &err), &err);
    p.act_dtype = WNA16_DTYPE_BF16;
    TU_OK(wna16_moe_layer_run(layer, &p, x, M, ids, w, TOPK, out, &err), &err);
    wna16_moe_layer_destroy(layer);
    wna16_tensor_set_destroy(set);
    /* the CPU layout's F32 scales do not follow the model: a bf16 layer */
    set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    TU_OK(wna16_ref_encode(ctx, wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "cpu"),
                           &L, "m", set, &err), &err);
    q.model_dtype = WNA16_DTYPE_BF16;
    TU_OK(wna16_moe_layer_create(ctx, wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                      "cpu"),
                                 set, "m", E, H, I, &q, WNA16_TARGET_CPU,
                                 &layer, &err), &err);
    wna16_moe_layer_destroy(layer);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

/* Act order on the Marlin layout (K sorted by group): the layer reads
 * g_idx and the sort indices without bounds checks, so creating it checks
 * their values: a group past the layer's and a row of sort indices that
 * is not a permutation are refused naming the tensor and the position. */
static void act_order_values(void)
{
    enum { AE = 2, AH = 128, AI = 64 }; /* I that Marlin does not pad */
    wna16_error_t err;
    wna16_qlayer_t L = {.E = AE, .H = AH, .I = AI};
    TU_OK(wna16_qweight_alloc(&L.w13, AE, 2 * AI, AH, 4, 32, false, true,
                              false, &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, AE, AH, AI, 4, 32, false, true, false,
                              &err), &err);
    wna16_qweight_t *q[2] = {&L.w13, &L.w2};
    for (int o = 0; o < 2; o++) {
        for (size_t i = 0; i < (size_t)q[o]->E * q[o]->N * q[o]->K; i++)
            q[o]->codes[i] = (uint8_t)tu_rng_below(&rng, 16);
        for (size_t i = 0; i < (size_t)q[o]->E * q[o]->G * q[o]->N; i++)
            q[o]->scales[i] = 0.0625f;
        /* a shuffled assignment of channels to groups, gs per group */
        for (int32_t e = 0; e < q[o]->E; e++) {
            int32_t *gi = q[o]->g_idx + (size_t)e * q[o]->K;
            for (int32_t k = 0; k < q[o]->K; k++)
                gi[k] = k / 32;
            for (int32_t k = q[o]->K - 1; k > 0; k--) {
                int32_t j = (int32_t)tu_rng_below(&rng, (uint32_t)k + 1);
                int32_t t = gi[k];
                gi[k] = gi[j];
                gi[j] = t;
            }
        }
        q[o]->g_idx_stored = true;
    }
    const wna16_spec_t *marlin = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                 "marlin");
    wna16_tensor_set_t *set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    TU_OK(wna16_ref_encode(ctx, marlin, &L, "m", set, &err), &err);
    wna16_quant_desc_t qd = {.bits = 4, .group_size = 32, .act_order = true,
                             .g_idx_stored = true};
    wna16_moe_layer_t *layer = NULL;
    TU_OK(wna16_moe_layer_create(ctx, marlin, set, "m", AE, AH, AI, &qd,
                                 WNA16_TARGET_CPU, &layer, &err), &err);
    wna16_moe_layer_destroy(layer);
    /* the same tensors with one value damaged */
    static const struct {
        const char *tensor;
        size_t at;
        int32_t value;
        const char *needle;
    } bad[] = {
        {"m.w13_g_idx", 5, AH / 32, "w13 g_idx[0][5] = 4 is not a group of "
                                    "the layer (0..3)"},
        {"m.w2_g_idx", 70, -1, "w2 g_idx[1][6] = -1 is not a group"},
        {"m.w13_g_idx_sort_indices", 3, 0, "w13 g_idx_sort_indices[0] is not "
                                           "a permutation of 0..127"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        wna16_tensor_set_t *copy = NULL;
        int32_t *data = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &copy, &err), &err);
        for (size_t i = 0; i < wna16_tensor_set_count(set); i++) {
            wna16_tensor_t t = *wna16_tensor_set_at(set, i);
            if (strcmp(t.name, bad[b].tensor) == 0) {
                data = malloc(t.nbytes);
                TU_CHECK(data != NULL);
                memcpy(data, t.data, t.nbytes);
                data[bad[b].at] = bad[b].value;
                t.data = data;
            }
            TU_OK(wna16_tensor_set_add_view(copy, &t, &err), &err);
        }
        TU_CHECK_MSG(data != NULL, "no tensor %s", bad[b].tensor);
        expect(wna16_moe_layer_create(ctx, marlin, copy, "m", AE, AH, AI, &qd,
                                      WNA16_TARGET_CPU, &layer, &err),
               WNA16_EFORMAT, &err, bad[b].needle, bad[b].tensor);
        wna16_tensor_set_destroy(copy);
        free(data);
    }
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

int main(void)
{
#ifndef WNA16_HAVE_LLVM
    tu_skip("the CPU target needs LLVM 19 (install llvm-19-dev)");
#endif
    tu_rng_seed(&rng, 0xe7);
    ctx = tu_context();
    create_errors();
    run_errors();
    ungated();
    model_dtype();
    act_order_values();
    wna16_context_destroy(ctx);
    return tu_finish("test_moe_gen_errors");
}
