/*
 * codec.c - reference decode and encode of a whole MoE layer in any spec:
 * tensor naming (per expert and projection for checkpoint formats, stacked
 * w13_/w2_ for backends), the capability checks that refuse what a layout
 * cannot hold, intermediate padding, and the per-role walk of layout_io.c.
 */
#include "runtime/ref/ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *gemm_prefix(wna16_gemm_t g) { return g == WNA16_GEMM_W13 ? "w13" : "w2"; }

/* The projections stored for one operand of a per-expert format, and the
 * output-channel offset of each in the stacked operand. */
typedef struct proj_ref {
    const w16_spec_proj_t *proj;
    int64_t n_off;
} proj_ref_t;

static int operand_projs(const wna16_spec_t *s, wna16_gemm_t g, int32_t I,
                         proj_ref_t out[2])
{
    if (g == WNA16_GEMM_W13) {
        out[0] = (proj_ref_t){&s->proj_gate, 0};
        out[1] = (proj_ref_t){&s->proj_up, I};
        return 2;
    }
    out[0] = (proj_ref_t){&s->proj_down, 0};
    return 1;
}

static void join(char *out, size_t n, const char *prefix, const char *rest)
{
    if (prefix && *prefix)
        snprintf(out, n, "%s.%s", prefix, rest);
    else
        snprintf(out, n, "%s", rest);
}

static void stacked_name(char *out, size_t n, const char *prefix,
                         wna16_gemm_t g, const w16_layout_t *l)
{
    char leaf[160];
    snprintf(leaf, sizeof leaf, "%s_%s", gemm_prefix(g), l->name);
    join(out, n, prefix, leaf);
}

static void expert_name(char *out, size_t n, const char *prefix, int64_t e,
                        const char *proj, const w16_layout_t *l)
{
    char leaf[200];
    snprintf(leaf, sizeof leaf, "%lld.%s.%s", (long long)e, proj, l->name);
    join(out, n, prefix, leaf);
}

static w16_problem_t problem_of(int32_t E, int32_t H, int32_t I,
                                const wna16_quant_desc_t *q)
{
    return (w16_problem_t){E, H, I, q->bits, q->group_size, q->zero_point,
                           q->act_order, q->bias, q->zeros_stored,
                           q->g_idx_stored, (int)q->input_dtype};
}

/* ---- decode -------------------------------------------------------------- */

static bool want_role(w16_role_t r, const wna16_quant_desc_t *q)
{
    switch (r) {
    case W16_ROLE_QWEIGHT: case W16_ROLE_SCALES: case W16_ROLE_WEIGHT:
        return true;
    case W16_ROLE_QZEROS: return q->zero_point;
    case W16_ROLE_G_IDX: return q->act_order;
    case W16_ROLE_BIAS: return q->bias;
    default: return false;
    }
}

/* The tensor of layout l for expert e, projection i of operand g (or the
 * stacked tensor); NULL with its expected name in `name` when absent. */
static const wna16_tensor_t *find_tensor(const wna16_spec_t *spec,
                                         const wna16_tensor_set_t *ts,
                                         const char *prefix, wna16_gemm_t g,
                                         const w16_layout_t *l, int64_t e,
                                         const proj_ref_t *proj, char *name,
                                         size_t n)
{
    if (spec->stacked) {
        stacked_name(name, n, prefix, g, l);
        return wna16_tensor_set_find(ts, name);
    }
    const wna16_tensor_t *t = NULL;
    for (int a = 0; a < proj->proj->n_names && !t; a++) {
        expert_name(name, n, prefix, e, proj->proj->names[a], l);
        t = wna16_tensor_set_find(ts, name);
    }
    if (!t)
        expert_name(name, n, prefix, e, proj->proj->names[0], l);
    return t;
}

/* Decodes every tensor of role r into qw (`raw`: codes as stored). */
wna16_status_t w16_decode_role(const wna16_spec_t *spec,
                               const wna16_tensor_set_t *ts,
                               const char *prefix, const w16_problem_t *p,
                               wna16_gemm_t g, w16_role_t r, bool raw,
                               wna16_qweight_t *qw, wna16_error_t *err);

static wna16_status_t decode_role(const wna16_spec_t *spec,
                                  const wna16_tensor_set_t *ts,
                                  const char *prefix, const w16_problem_t *p,
                                  wna16_gemm_t g, w16_role_t r, int64_t *vars,
                                  bool raw, wna16_qweight_t *qw,
                                  wna16_error_t *err)
{
    const w16_layout_t *l = spec->layouts[r];
    proj_ref_t projs[2] = {{NULL, 0}, {NULL, 0}};
    int np = spec->stacked ? 1 : operand_projs(spec, g, (int32_t)p->I, projs);
    int64_t experts = spec->stacked ? 1 : p->E;
    char name[512];
    for (int64_t e = 0; e < experts; e++) {
        for (int i = 0; i < np; i++) {
            const wna16_tensor_t *t = find_tensor(spec, ts, prefix, g, l, e,
                                                  &projs[i], name, sizeof name);
            if (!t)
                return w16_err(err, WNA16_ENOTFOUND, "tensor '%s' not found",
                               name);
            /* gate and up share one g_idx row per expert in vLLM: the up
             * projection's must agree with the gate's */
            int32_t *saved = NULL;
            if (r == W16_ROLE_G_IDX && i == 1) {
                saved = malloc(sizeof(int32_t) * (size_t)qw->K);
                if (!saved)
                    return w16_err_nomem(err, "decoding g_idx");
                memcpy(saved, qw->g_idx + e * qw->K,
                       sizeof(int32_t) * (size_t)qw->K);
            }
            wna16_status_t st = w16_layout_decode(
                spec, l, vars, t, qw,
                (w16_place_t){spec->stacked ? 0 : e, projs[i].n_off, raw}, err);
            if (saved) {
                bool same = st == WNA16_OK &&
                            memcmp(saved, qw->g_idx + e * qw->K,
                                   sizeof(int32_t) * (size_t)qw->K) == 0;
                free(saved);
                if (st == WNA16_OK && !same)
                    return w16_err(err, WNA16_EFORMAT, "tensor '%s': the up "
                                   "projection's g_idx differs from the "
                                   "gate's; vLLM keeps one w13 g_idx row per "
                                   "expert", name);
            }
            if (st != WNA16_OK)
                return st;
        }
    }
    return WNA16_OK;
}

wna16_status_t w16_decode_role(const wna16_spec_t *spec,
                               const wna16_tensor_set_t *ts,
                               const char *prefix, const w16_problem_t *p,
                               wna16_gemm_t g, w16_role_t r, bool raw,
                               wna16_qweight_t *qw, wna16_error_t *err)
{
    int64_t vars[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(spec, p, g, vars, err);
    if (st != WNA16_OK)
        return st;
    if (!w16_layout_present(spec->layouts[r], vars))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout for this "
                       "configuration", spec->name, w16_role_doc(r));
    return decode_role(spec, ts, prefix, p, g, r, vars, raw, qw, err);
}

/* Does the checkpoint hold role r's tensor (for the first expert)? */
static bool role_stored(const wna16_spec_t *spec, const wna16_tensor_set_t *ts,
                        const char *prefix, const w16_problem_t *p,
                        wna16_gemm_t g, w16_role_t r, const int64_t *vars)
{
    const w16_layout_t *l = spec->layouts[r];
    if (!w16_layout_present(l, vars))
        return false;
    proj_ref_t projs[2] = {{NULL, 0}, {NULL, 0}};
    if (!spec->stacked)
        operand_projs(spec, g, (int32_t)p->I, projs);
    char name[512];
    return find_tensor(spec, ts, prefix, g, l, 0, &projs[0], name,
                       sizeof name) != NULL;
}

wna16_status_t w16_decode_sort_indices(const wna16_spec_t *spec,
                                       const wna16_tensor_set_t *ts,
                                       const char *prefix,
                                       const w16_problem_t *p, wna16_gemm_t g,
                                       int32_t *perm, wna16_error_t *err)
{
    int64_t vars[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(spec, p, g, vars, err);
    const w16_layout_t *l = spec->layouts[W16_ROLE_SORT_IDX];
    if (st != WNA16_OK)
        return st;
    if (!l || !spec->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s stores no act-order sort "
                       "indices", spec->name);
    char name[512];
    proj_ref_t none = {NULL, 0};
    const wna16_tensor_t *t = find_tensor(spec, ts, prefix, g, l, 0, &none,
                                          name, sizeof name);
    if (!t)
        return w16_err(err, WNA16_ENOTFOUND, "tensor '%s' not found", name);
    wna16_qweight_t q = {.E = (int32_t)p->E, .N = (int32_t)vars[W16_VAR_N],
                         .K = (int32_t)vars[W16_VAR_K],
                         .G = (int32_t)vars[W16_VAR_G], .bits = (int32_t)p->BITS,
                         .group_size = (int32_t)p->GS};
    return w16_layout_decode(spec, l, vars, t, &q,
                             (w16_place_t){.perm_out = perm}, err);
}

/* An act-order sorted layout: read the stored permutation, check it is
 * one, and put codes and g_idx back in checkpoint order. */
static wna16_status_t undo_sort(const wna16_spec_t *spec,
                                const wna16_tensor_set_t *ts, const char *prefix,
                                const w16_problem_t *p, wna16_gemm_t g,
                                int64_t *vars, wna16_qweight_t *qw,
                                wna16_error_t *err)
{
    const w16_layout_t *l = spec->layouts[W16_ROLE_SORT_IDX];
    size_t ek = (size_t)qw->E * qw->K;
    int32_t *perm = malloc(sizeof(int32_t) * (ek ? ek : 1));
    uint8_t *seen = calloc(ek ? ek : 1, 1);
    if (!perm || !seen) {
        free(perm);
        free(seen);
        return w16_err_nomem(err, "reading act-order sort indices");
    }
    for (size_t i = 0; i < ek; i++)
        perm[i] = -1;
    char name[512];
    proj_ref_t none = {NULL, 0};
    const wna16_tensor_t *t = l ? find_tensor(spec, ts, prefix, g, l, 0, &none,
                                              name, sizeof name) : NULL;
    wna16_status_t st = t ? w16_layout_decode(spec, l, vars, t, qw,
                                              (w16_place_t){.perm_out = perm}, err)
                          : w16_err(err, WNA16_ENOTFOUND, "%s: no act-order "
                                    "sort indices (tensor '%s')", spec->name,
                                    l ? name : "g_idx_sort_indices");
    for (size_t i = 0; st == WNA16_OK && i < ek; i++) {
        int32_t k = perm[i];
        size_t e = i / (size_t)qw->K;
        if (k < 0 || k >= qw->K || seen[e * (size_t)qw->K + (size_t)k]++)
            st = w16_err(err, WNA16_EFORMAT, "tensor '%s': expert %zu's sort "
                         "indices are not a permutation of 0..%d", name, e,
                         qw->K - 1);
    }
    if (st == WNA16_OK)
        st = w16_qweight_unsort(qw, perm, err);
    (void)p;
    free(perm);
    free(seen);
    return st;
}

static wna16_status_t decode_operand(const wna16_spec_t *spec,
                                     const wna16_tensor_set_t *ts,
                                     const char *prefix, const w16_problem_t *p,
                                     const wna16_quant_desc_t *q,
                                     wna16_gemm_t g, wna16_qweight_t *qw,
                                     wna16_error_t *err)
{
    int64_t vars[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(spec, p, g, vars, err);
    if (st != WNA16_OK)
        return st;
    /* Groups and zero points first: code transforms may read z, the zero
     * point of the code's group (fp8 activations). */
    static const w16_role_t order[] = {
        W16_ROLE_G_IDX, W16_ROLE_QZEROS, W16_ROLE_QWEIGHT, W16_ROLE_SCALES,
        W16_ROLE_SORT_IDX, W16_ROLE_BIAS, W16_ROLE_WEIGHT, W16_ROLE_GSCALE};
    _Static_assert(W16_ARRAY_LEN(order) == W16_ROLE_COUNT,
                   "every role has its place in the decode order");
    for (size_t i = 0; i < W16_ARRAY_LEN(order); i++) {
        w16_role_t r = order[i];
        const w16_layout_t *l = spec->layouts[r];
        if (!want_role((w16_role_t)r, q))
            continue;
        /* A spec holds codes + scales, or dequantized weights. */
        if (!l && (r == W16_ROLE_QWEIGHT || r == W16_ROLE_SCALES) &&
            spec->layouts[W16_ROLE_WEIGHT])
            continue;
        if (!l && r == W16_ROLE_WEIGHT && spec->layouts[W16_ROLE_QWEIGHT])
            continue;
        if (!l || !w16_layout_present(l, vars))
            return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout for "
                           "this configuration", spec->name,
                           w16_role_doc((w16_role_t)r));
        st = decode_role(spec, ts, prefix, p, g, (w16_role_t)r, vars, false,
                         qw, err);
        if (st != WNA16_OK)
            return st;
    }
    /* What the checkpoint carries without using it: symmetric zero words
     * (kept raw) and g_idx tensors without act-order. */
    if (!q->zero_point &&
        role_stored(spec, ts, prefix, p, g, W16_ROLE_QZEROS, vars)) {
        qw->stored_zeros = calloc((size_t)qw->E * qw->G * qw->N, 1);
        if (!qw->stored_zeros)
            return w16_err_nomem(err, "decoding stored zero points");
        qw->zeros = qw->stored_zeros; /* decode_role writes qw->zeros */
        st = decode_role(spec, ts, prefix, p, g, W16_ROLE_QZEROS, vars, true,
                         qw, err);
        qw->zeros = NULL;
        if (st != WNA16_OK)
            return st;
    }
    if (!q->act_order &&
        role_stored(spec, ts, prefix, p, g, W16_ROLE_G_IDX, vars))
        qw->g_idx_stored = true;
    if (q->act_order || spec->g_idx_params)
        qw->g_idx_stored = true;
    if (spec->act_order_sort && q->act_order)
        return undo_sort(spec, ts, prefix, p, g, vars, qw, err);
    return WNA16_OK;
}

static wna16_status_t check_args(const wna16_spec_t *spec, int32_t E, int32_t H,
                                 int32_t I, const wna16_quant_desc_t *q,
                                 wna16_error_t *err)
{
    if (!spec || !q)
        return w16_err(err, WNA16_EINVAL, "spec and quant are required");
    if (E < 1 || H < 1 || I < 1 || E > (1 << 16) || H > (1 << 20) ||
        I > (1 << 20))
        return w16_err(err, WNA16_EINVAL, "layer sizes E=%d H=%d I=%d out of "
                       "range", E, H, I);
    if (q->bits != 4 && q->bits != 8)
        return w16_err(err, WNA16_EINVAL, "bits = %d: expected 4 or 8", q->bits);
    if (q->group_size == 0 || q->group_size < -1)
        return w16_err(err, WNA16_EINVAL, "group size %d: expected -1 or a "
                       "positive size", q->group_size);
    return WNA16_OK;
}

wna16_status_t wna16_ref_decode(wna16_context_t *ctx, const wna16_spec_t *spec,
                                const wna16_tensor_set_t *tensors,
                                const char *prefix, int32_t E, int32_t H,
                                int32_t I, const wna16_quant_desc_t *quant,
                                wna16_qlayer_t *out, wna16_error_t *err)
{
    memset(out, 0, sizeof *out);
    wna16_status_t st = check_args(spec, E, H, I, quant, err);
    if (st != WNA16_OK)
        return st;
    if (!tensors)
        return w16_err(err, WNA16_EINVAL, "wna16_ref_decode: tensors is NULL");
    w16_problem_t p = problem_of(E, H, I, quant);
    int64_t v13[W16_VAR_COUNT];
    if ((st = w16_spec_bind(spec, &p, WNA16_GEMM_W13, v13, err)) != WNA16_OK)
        return st;
    if ((st = w16_check_decodable(spec, &p, err)) != WNA16_OK)
        return st;
    int32_t IP = (int32_t)v13[W16_VAR_IP];
    out->E = E;
    out->H = H;
    out->I = I;
    wna16_qlayer_t padded = {0};
    wna16_qweight_t *w13 = IP != I ? &padded.w13 : &out->w13;
    wna16_qweight_t *w2 = IP != I ? &padded.w2 : &out->w2;
    bool zp = quant->zero_point, gi = quant->act_order, b = quant->bias;
    st = wna16_qweight_alloc(w13, E, 2 * IP, H, quant->bits, quant->group_size,
                             zp, gi, b, err);
    if (st == WNA16_OK)
        st = wna16_qweight_alloc(w2, E, H, IP, quant->bits, quant->group_size,
                                 zp, gi, b, err);
    if (st == WNA16_OK)
        st = decode_operand(spec, tensors, prefix, &p, quant, WNA16_GEMM_W13,
                            w13, err);
    if (st == WNA16_OK)
        st = decode_operand(spec, tensors, prefix, &p, quant, WNA16_GEMM_W2,
                            w2, err);
    if (st == WNA16_OK && IP != I) {
        st = w16_qweight_unpad(ctx, w13, WNA16_GEMM_W13, I, IP, &out->w13, err);
        if (st == WNA16_OK)
            st = w16_qweight_unpad(ctx, w2, WNA16_GEMM_W2, I, IP, &out->w2, err);
    }
    wna16_qlayer_free(&padded);
    if (st != WNA16_OK)
        wna16_qlayer_free(out);
    return st;
}

/* ---- encode -------------------------------------------------------------- */

static bool in_list(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

/* Refuses, with the reason, what the spec's layouts cannot hold. */
wna16_status_t w16_check_holds(const wna16_spec_t *spec,
                               const w16_problem_t *p, int32_t IP,
                               wna16_error_t *err)
{
    const w16_capabilities_t *c = &spec->caps;
    const char *n = spec->name;
    if (!in_list(c->bits, c->n_bits, (int)p->BITS))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s cannot hold %lld-bit "
                       "weights", n, (long long)p->BITS);
    if (c->n_group_sizes && !in_list(c->group_sizes, c->n_group_sizes,
                                     (int)p->GS))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s cannot hold group size "
                       "%lld", n, (long long)p->GS);
    if (p->zp && (!c->zero_points || !spec->layouts[W16_ROLE_QZEROS]) &&
        !spec->layouts[W16_ROLE_WEIGHT])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s has no zero points, and "
                       "the checkpoint has them", n);
    if (p->act_order && (!c->act_order || !spec->layouts[W16_ROLE_G_IDX]))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s cannot hold act-order "
                       "(g_idx) weights", n);
    if (p->bias && (!c->bias || !spec->layouts[W16_ROLE_BIAS]))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s cannot hold expert bias, "
                       "and the checkpoint has it", n);
    wna16_input_dtype_t in = (wna16_input_dtype_t)p->a8;
    if ((unsigned)in >= WNA16_INPUT_COUNT_ || !c->input_dtypes[in])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s has no layout for %s "
                       "activations", n, wna16_input_dtype_name(in)
                       ? wna16_input_dtype_name(in) : "unknown");
    if (IP != p->I && p->act_order)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s (I = %lld would be "
                       "padded to %d)", n, spec->pad_forbidden_with_act_order
                       ? spec->pad_forbidden_with_act_order
                       : "padding is not allowed with act-order",
                       (long long)p->I, IP);
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        wna16_status_t st = w16_spec_bind(spec, p, (wna16_gemm_t)g, vars, err);
        if (st != WNA16_OK)
            return st;
        for (int r = 0; r < c->n_shape_rules; r++) {
            int64_t hit = 0;
            w16_eval_error_t e;
            if (!w16_expr_eval(c->shape_rules[r].cond, vars, &hit, &e))
                return w16_err(err, WNA16_ESPEC, "%s: %s: %s", spec->origin,
                               c->shape_rules[r].json_path, e.what);
            if (hit)
                return w16_err(err, WNA16_EUNSUPPORTED, "%s (%s: K=%lld, "
                               "N=%lld): %s", n, gemm_prefix((wna16_gemm_t)g),
                               (long long)vars[W16_VAR_K],
                               (long long)vars[W16_VAR_N],
                               c->shape_rules[r].reason);
        }
    }
    /* A layout proved a bijection on the spec's samples may still not be
     * one at this size: prove it here (once per problem and spec). */
    return w16_spec_check_problem(spec, p, NULL, err);
}


/* Float roles keep the data's own dtype when the layout accepts it. */
static wna16_dtype_t pick_dtype(const w16_layout_t *l, const wna16_qweight_t *qw)
{
    return w16_layout_float_dtype(l, l->role == W16_ROLE_SCALES ? qw->scale_dtype
                                     : l->role == W16_ROLE_BIAS ? qw->bias_dtype
                                                                : WNA16_DTYPE_INVALID);
}

wna16_status_t w16_check_decodable(const wna16_spec_t *spec,
                                   const w16_problem_t *p, wna16_error_t *err)
{
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        w16_scale_xform_t x;
        wna16_status_t st = w16_spec_bind(spec, p, (wna16_gemm_t)g, vars, err);
        if (st == WNA16_OK)
            st = w16_scale_xform(spec, vars, &x, err);
        if (st != WNA16_OK)
            return st;
        if (x.int16_range)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s (%s activations): the "
                           "%s scales are int16 codes relative to the "
                           "operand's largest scale; the checkpoint's scales "
                           "cannot be recovered from them", spec->name,
                           wna16_input_dtype_name((wna16_input_dtype_t)p->a8),
                           gemm_prefix((wna16_gemm_t)g));
    }
    return WNA16_OK;
}

static wna16_status_t encode_one(const wna16_spec_t *spec,
                                 const w16_layout_t *l, int64_t *vars,
                                 const wna16_qweight_t *qw, const char *name,
                                 w16_place_t at, wna16_tensor_set_t *out,
                                 wna16_error_t *err)
{
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_status_t st = w16_layout_shape(l, vars, shape, err);
    if (st != WNA16_OK)
        return st;
    wna16_tensor_t *t;
    st = wna16_tensor_set_add_new(out, name, pick_dtype(l, qw), l->ndim, shape,
                                  &t, err);
    if (st != WNA16_OK)
        return st;
    return w16_layout_encode(spec, l, vars, qw, t, at, err);
}

static wna16_status_t encode_operand(const wna16_spec_t *spec,
                                     const wna16_qweight_t *qw,
                                     const int32_t *perm,
                                     const w16_problem_t *p, wna16_gemm_t g,
                                     const char *prefix,
                                     wna16_tensor_set_t *out,
                                     wna16_error_t *err)
{
    int64_t vars[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(spec, p, g, vars, err);
    if (st != WNA16_OK)
        return st;
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = spec->layouts[r];
        if (!w16_layout_present(l, vars))
            continue;
        char name[512];
        if (spec->stacked) {
            stacked_name(name, sizeof name, prefix, g, l);
            st = encode_one(spec, l, vars, qw, name,
                            (w16_place_t){.perm = perm}, out,
                            err);
            if (st != WNA16_OK)
                return st;
            continue;
        }
        proj_ref_t projs[2];
        int np = operand_projs(spec, g, (int32_t)p->I, projs);
        for (int64_t e = 0; e < p->E; e++)
            for (int i = 0; i < np; i++) {
                expert_name(name, sizeof name, prefix, e,
                            projs[i].proj->names[0], l);
                st = encode_one(spec, l, vars, qw, name,
                                (w16_place_t){e, projs[i].n_off}, out, err);
                if (st != WNA16_OK)
                    return st;
            }
    }
    return WNA16_OK;
}

wna16_status_t wna16_ref_encode(wna16_context_t *ctx, const wna16_spec_t *spec,
                                const wna16_qlayer_t *layer,
                                const char *prefix, wna16_tensor_set_t *out,
                                wna16_error_t *err)
{
    return wna16_ref_encode_input(ctx, spec, layer, WNA16_INPUT_16BIT, prefix,
                                  out, err);
}

wna16_status_t wna16_ref_encode_input(wna16_context_t *ctx,
                                      const wna16_spec_t *spec,
                                      const wna16_qlayer_t *layer,
                                      wna16_input_dtype_t input,
                                      const char *prefix,
                                      wna16_tensor_set_t *out,
                                      wna16_error_t *err)
{
    if (!layer || !out)
        return w16_err(err, WNA16_EINVAL, "wna16_ref_encode: layer and out are "
                       "required");
    const wna16_qweight_t *a = &layer->w13, *b = &layer->w2;
    wna16_quant_desc_t q = {a->bits, a->group_size, a->zeros != NULL,
                            a->g_idx != NULL, a->bias != NULL};
    if ((unsigned)input >= WNA16_INPUT_COUNT_)
        return w16_err(err, WNA16_EINVAL, "wna16_ref_encode_input: input "
                       "dtype %d is not a wna16_input_dtype_t", (int)input);
    q.input_dtype = input;
    wna16_status_t st = check_args(spec, layer->E, layer->H, layer->I, &q, err);
    if (st != WNA16_OK)
        return st;
    /* A non-gated layer (the *_no_mul activations) has one w13 projection;
     * only stacked layouts can hold it, as N = I rows. */
    bool ungated = a->N == layer->I;
    if (ungated && !spec->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s stores gate and up "
                       "projections per expert; a non-gated layer (w13 N = "
                       "I) needs a stacked layout", spec->name);
    if (a->E != layer->E || (a->N != 2 * layer->I && !ungated) ||
        a->K != layer->H ||
        b->E != layer->E || b->N != layer->H || b->K != layer->I ||
        b->bits != a->bits || b->group_size != a->group_size ||
        !a->codes || !a->scales || !b->codes || !b->scales ||
        (b->zeros != NULL) != q.zero_point || (b->g_idx != NULL) != q.act_order)
        return w16_err(err, WNA16_EINVAL, "wna16_ref_encode: w13/w2 do not "
                       "form a layer with E=%d H=%d I=%d", layer->E, layer->H,
                       layer->I);
    q.bias = a->bias != NULL || b->bias != NULL;
    w16_problem_t p = problem_of(layer->E, layer->H, layer->I, &q);
    p.zeros_stored = a->stored_zeros != NULL;
    p.g_idx_stored = a->g_idx_stored;
    p.ungated = ungated;
    int64_t v13[W16_VAR_COUNT];
    if ((st = w16_spec_bind(spec, &p, WNA16_GEMM_W13, v13, err)) != WNA16_OK)
        return st;
    int32_t IP = (int32_t)v13[W16_VAR_IP];
    if ((st = w16_check_holds(spec, &p, IP, err)) != WNA16_OK)
        return st;
    if (ungated && IP != layer->I)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s pads I = %d to %d; "
                       "padding a non-gated layer is not implemented (vLLM's "
                       "padding helpers assume two w13 shards)", spec->name,
                       layer->I, IP);
    /* vLLM's order: pad, then act-order (never both), then the layout */
    wna16_qlayer_t work = {0};
    int32_t *perm[2] = {NULL, NULL};
    const wna16_qweight_t *ops[2] = {a, b};
    if (IP != layer->I) {
        st = w16_qweight_pad(ctx, a, WNA16_GEMM_W13, layer->I, IP, &work.w13, err);
        if (st == WNA16_OK)
            st = w16_qweight_pad(ctx, b, WNA16_GEMM_W2, layer->I, IP, &work.w2,
                                 err);
        ops[0] = &work.w13;
        ops[1] = &work.w2;
    } else if (spec->act_order_sort && q.act_order) {
        st = w16_qweight_sorted(a, &work.w13, &perm[0], err);
        if (st == WNA16_OK)
            st = w16_qweight_sorted(b, &work.w2, &perm[1], err);
        ops[0] = &work.w13;
        ops[1] = &work.w2;
    }
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        st = encode_operand(spec, ops[g], perm[g], &p, (wna16_gemm_t)g, prefix,
                            out, err);
    wna16_qlayer_free(&work);
    free(perm[0]);
    free(perm[1]);
    return st;
}

/* The operand's largest scale as the destination will store it, from the
 * source's scales (decoded through the reference): vLLM's max over the
 * destination tensor, padding zeros included. Here rather than in
 * scale_xform.c, which stays below the decoder. */
wna16_status_t w16_scale_prepare_source(const wna16_spec_t *src,
                                        const wna16_spec_t *dst,
                                        const wna16_tensor_set_t *set,
                                        const char *prefix,
                                        const w16_problem_t *p, wna16_gemm_t g,
                                        float *max_out, wna16_error_t *err)
{
    int64_t dv[W16_VAR_COUNT], sv[W16_VAR_COUNT];
    w16_scale_xform_t x;
    *max_out = 0.0f;
    wna16_status_t st = w16_spec_bind(dst, p, g, dv, err);
    if (st == WNA16_OK)
        st = w16_scale_xform(dst, dv, &x, err);
    if (st != WNA16_OK || (x.multiply == 1 && !x.int16_range) ||
        !w16_layout_present(dst->layouts[W16_ROLE_SCALES], dv))
        return st;
    if ((st = w16_spec_bind(src, p, g, sv, err)) != WNA16_OK)
        return st;
    /* The operand's scales as the source holds them: stacked N (2 IP for
     * w13), G of K, IP being the source's own padded size (I for a
     * checkpoint format). */
    bool w13 = g == WNA16_GEMM_W13;
    int64_t I = p->I, IPs = sv[W16_VAR_IP], IPd = dv[W16_VAR_IP];
    int64_t K = w13 ? p->H : IPs, N = w13 ? 2 * IPs : p->H;
    wna16_qweight_t q = {.E = (int32_t)p->E, .K = (int32_t)K, .N = (int32_t)N,
                         .G = p->GS > 0 ? (int32_t)(K / p->GS) : 1,
                         .bits = (int32_t)p->BITS,
                         .group_size = (int32_t)p->GS};
    size_t total = (size_t)q.E * (size_t)q.G * (size_t)q.N, n = 0;
    q.scales = malloc(sizeof(float) * (total ? total : 1));
    if (!q.scales)
        return w16_err_nomem(err, "reading the source scales");
    st = w16_decode_role(src, set, prefix, p, g, W16_ROLE_SCALES, false, &q,
                         err);
    /* keep the layer's own scales (drop the source's padding), in place */
    int64_t G = p->GS > 0 ? (w13 ? p->H : I) / p->GS : 1;
    for (size_t i = 0; st == WNA16_OK && i < total; i++) {
        int64_t col = (int64_t)(i % (size_t)q.N);
        int64_t row = (int64_t)(i / (size_t)q.N) % q.G;
        if (w13 ? col % IPs < I : row < G)
            q.scales[n++] = w16_model_round(p->model_dtype, q.scales[i]);
    }
    if (p->model_dtype) /* the loader's cast, as the repack applies it */
        q.scale_dtype = p->model_dtype;
    /* the destination's padding holds zeros, which vLLM's max sees */
    if (st == WNA16_OK)
        st = w16_scale_prepare(
            dst, &x,
            w16_layout_float_dtype(dst->layouts[W16_ROLE_SCALES],
                                   q.scale_dtype),
            g, q.scales, n, IPd != I && (w13 || p->GS > 0), max_out, err);
    free(q.scales);
    return st;
}
