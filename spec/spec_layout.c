/*
 * spec_layout.c - the roles a layout fills (JSON key, default tensor name,
 * logical coordinates); binds a spec to a problem (the dimension variables
 * of one GEMM operand) and evaluates a layout's maps: shape, forward map
 * (coordinates -> storage index + bit) and inverse map (storage index + slot
 * -> coordinates). Shared by the loader, the consistency check, the
 * reference and the generator.
 */
#include "spec/spec.h"

#include <string.h>

/* ---- roles --------------------------------------------------------------- */

static const struct {
    const char *key, *name, *doc;
} role_table[W16_ROLE_COUNT] = {
#define X(e, key, name, doc) {key, name, doc},
    W16_ROLE_LIST(X)
#undef X
};

const char *w16_role_key(w16_role_t r) { return role_table[r].key; }
const char *w16_role_doc(w16_role_t r) { return role_table[r].doc; }
const char *w16_role_name(w16_role_t r) { return role_table[r].name; }

/* Logical coordinates per role, in the order of wna16_qweight_t arrays. */
static const w16_var_t role_coords[W16_ROLE_COUNT][W16_MAX_COORDS] = {
    [W16_ROLE_QWEIGHT] = {W16_VAR_e, W16_VAR_n, W16_VAR_k},
    [W16_ROLE_SCALES] = {W16_VAR_e, W16_VAR_g, W16_VAR_n},
    [W16_ROLE_QZEROS] = {W16_VAR_e, W16_VAR_g, W16_VAR_n},
    [W16_ROLE_G_IDX] = {W16_VAR_e, W16_VAR_k, W16_VAR_COUNT},
    [W16_ROLE_SORT_IDX] = {W16_VAR_e, W16_VAR_k, W16_VAR_COUNT},
    [W16_ROLE_BIAS] = {W16_VAR_e, W16_VAR_n, W16_VAR_COUNT},
    [W16_ROLE_WEIGHT] = {W16_VAR_e, W16_VAR_n, W16_VAR_k},
    /* one value per operand: no coordinates, a 0-dimensional tensor */
    [W16_ROLE_GSCALE] = {W16_VAR_COUNT, W16_VAR_COUNT, W16_VAR_COUNT},
};

int w16_role_coords(w16_role_t r, w16_var_t *out)
{
    int n = 0;
    for (int i = 0; i < W16_MAX_COORDS; i++)
        if (role_coords[r][i] != W16_VAR_COUNT)
            out[n++] = role_coords[r][i];
    return n;
}

/* ---- binding and maps ---------------------------------------------------- */

wna16_status_t w16_spec_bind(const wna16_spec_t *spec,
                             const w16_problem_t *p, wna16_gemm_t gemm,
                             int64_t *v, wna16_error_t *err)
{
    memset(v, 0, sizeof(int64_t) * W16_VAR_COUNT);
    if (p->BITS != 4 && p->BITS != 8)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: %lld-bit weights: wna16 "
                       "handles 4 and 8 bits", spec->name, (long long)p->BITS);
    if (p->E < 1 || p->H < 1 || p->I < 1)
        return w16_err(err, WNA16_EINVAL, "%s: experts, hidden and "
                       "intermediate sizes must be positive", spec->name);
    if (p->GS == 0 || p->GS < -1)
        return w16_err(err, WNA16_EINVAL, "%s: group size %lld: expected -1 "
                       "or a positive size", spec->name, (long long)p->GS);
    v[W16_VAR_E] = p->E;
    v[W16_VAR_H] = p->H;
    v[W16_VAR_I] = p->I;
    v[W16_VAR_BITS] = p->BITS;
    v[W16_VAR_MASK] = (1 << p->BITS) - 1;
    v[W16_VAR_PF] = 32 / p->BITS;
    v[W16_VAR_GS] = p->GS;
    v[W16_VAR_ZP] = p->zp;
    v[W16_VAR_ACT_ORDER] = p->act_order;
    v[W16_VAR_HAS_BIAS] = p->bias;
    v[W16_VAR_W13] = gemm == WNA16_GEMM_W13;
    v[W16_VAR_ZEROS_STORED] = p->zeros_stored || p->zp;
    v[W16_VAR_G_IDX_STORED] = p->g_idx_stored || p->act_order;
    v[W16_VAR_A8] = p->a8;
    v[W16_VAR_CUDA] = WNA16_PLATFORM_CUDA;
    v[W16_VAR_ROCM] = WNA16_PLATFORM_ROCM;
    v[W16_VAR_CPU] = WNA16_PLATFORM_CPU;
    v[W16_VAR_XPU] = WNA16_PLATFORM_XPU;
    int64_t ip = p->I;
    if (spec->pad_intermediate) {
        w16_eval_error_t e;
        if (!w16_expr_eval(spec->pad_intermediate, v, &ip, &e))
            return w16_err(err, WNA16_ESPEC, "%s: $.pad.intermediate: %s",
                           spec->name, e.what);
        if (ip < p->I || ip > 4 * p->I + 4096)
            return w16_err(err, WNA16_ESPEC, "%s: $.pad.intermediate gives %lld "
                           "for I = %lld", spec->name, (long long)ip,
                           (long long)p->I);
    }
    v[W16_VAR_IP] = ip;
    bool per_proj = !spec->stacked;
    if (gemm == WNA16_GEMM_W13) {
        v[W16_VAR_K] = p->H;
        v[W16_VAR_N] = per_proj || p->ungated ? ip : 2 * ip;
    } else {
        v[W16_VAR_K] = ip;
        v[W16_VAR_N] = p->H;
    }
    int64_t K = v[W16_VAR_K];
    if (p->GS > 0 && K % p->GS != 0)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: group size %lld does not "
                       "divide the %s input size %lld", spec->name,
                       (long long)p->GS, gemm == WNA16_GEMM_W13 ? "w13" : "w2",
                       (long long)K);
    v[W16_VAR_G] = p->GS > 0 ? K / p->GS : 1;
    v[W16_VAR_GSE] = p->GS > 0 ? p->GS : K;
    return WNA16_OK;
}

bool w16_layout_present(const w16_layout_t *l, const int64_t *vars)
{
    if (!l)
        return false;
    if (!l->when)
        return true;
    int64_t r = 0;
    return w16_expr_eval(l->when, vars, &r, NULL) && r != 0;
}

wna16_status_t w16_layout_shape(const w16_layout_t *l, const int64_t *vars,
                                int64_t *shape, wna16_error_t *err)
{
    for (int d = 0; d < l->ndim; d++) {
        w16_eval_error_t e;
        if (!w16_expr_eval(l->shape[d], vars, &shape[d], &e))
            return w16_err(err, WNA16_ESPEC, "%s.shape[%d]: %s", l->json_path,
                           d, e.what);
        if (shape[d] < 0 || shape[d] > (INT64_C(1) << 40))
            return w16_err(err, WNA16_ESPEC, "%s.shape[%d] evaluates to %lld",
                           l->json_path, d, (long long)shape[d]);
    }
    return WNA16_OK;
}

int w16_layout_code_bits(const w16_layout_t *l, wna16_dtype_t dtype,
                         const int64_t *vars)
{
    if (l->role == W16_ROLE_QWEIGHT || l->role == W16_ROLE_QZEROS) {
        int64_t cb = vars[W16_VAR_BITS];
        if (l->code_bits && !w16_expr_eval(l->code_bits, vars, &cb, NULL))
            return 0;
        return cb > 0 && cb <= 64 ? (int)cb : 0;
    }
    return (int)wna16_dtype_size(dtype) * 8;
}

int w16_layout_slots(const w16_layout_t *l, wna16_dtype_t dtype,
                     const int64_t *vars)
{
    int cb = w16_layout_code_bits(l, dtype, vars);
    int eb = (int)wna16_dtype_size(dtype) * 8;
    return cb > 0 && eb >= cb ? eb / cb : 1;
}

int w16_role_extent(w16_role_t r, const int64_t *v, int64_t *ext)
{
    w16_var_t c[W16_MAX_COORDS];
    int n = w16_role_coords(r, c);
    for (int i = 0; i < n; i++) {
        switch (c[i]) {
        case W16_VAR_e: ext[i] = v[W16_VAR_E]; break;
        case W16_VAR_n: ext[i] = v[W16_VAR_N]; break;
        case W16_VAR_k: ext[i] = v[W16_VAR_K]; break;
        case W16_VAR_g: ext[i] = v[W16_VAR_G]; break;
        default: ext[i] = 0; break;
        }
    }
    return n;
}

bool w16_layout_locate(const w16_layout_t *l, int64_t *vars,
                       const int64_t *coord, int64_t *index, int64_t *bit,
                       w16_eval_error_t *e)
{
    w16_var_t c[W16_MAX_COORDS];
    int n = w16_role_coords(l->role, c);
    for (int i = 0; i < n; i++)
        vars[c[i]] = coord[i];
    for (int d = 0; d < l->ndim; d++)
        if (!w16_expr_eval(l->index[d], vars, &index[d], e))
            return false;
    *bit = 0;
    return !l->bit || w16_expr_eval(l->bit, vars, bit, e);
}

bool w16_layout_coord(const w16_layout_t *l, int64_t *vars,
                      const int64_t *index, int64_t slot, int64_t *coord,
                      w16_eval_error_t *e)
{
    for (int d = 0; d < l->ndim; d++)
        vars[W16_VAR_i0 + d] = index[d];
    vars[W16_VAR_slot] = slot;
    for (int i = 0; i < l->n_coords; i++) {
        if (!l->coord[i]) { /* e of a per-expert layout */
            coord[i] = 0;
            continue;
        }
        if (!w16_expr_eval(l->coord[i], vars, &coord[i], e))
            return false;
    }
    return true;
}

wna16_status_t w16_scale_xform(const wna16_spec_t *spec, const int64_t *vars,
                               w16_scale_xform_t *out, wna16_error_t *err)
{
    const w16_layout_t *l = spec->layouts[W16_ROLE_SCALES];
    *out = (w16_scale_xform_t){1, 0};
    if (!l)
        return WNA16_OK;
    w16_eval_error_t e;
    if (l->scale_multiply &&
        !w16_expr_eval(l->scale_multiply, vars, &out->multiply, &e))
        return w16_err(err, WNA16_ESPEC, "%s: %s.multiply: %s", spec->origin,
                       l->json_path, e.what);
    if (l->scale_int16 &&
        !w16_expr_eval(l->scale_int16, vars, &out->int16_range, &e))
        return w16_err(err, WNA16_ESPEC, "%s: %s.int16_codes: %s",
                       spec->origin, l->json_path, e.what);
    /* A power of two keeps the product exact (round trips), 2^16 keeps it
     * inside every float format's exponent range. */
    int64_t m = out->multiply;
    if (m < 1 || m > 65536 || (m & (m - 1)))
        return w16_err(err, WNA16_ESPEC, "%s: %s.multiply is %lld: expected a "
                       "power of two up to 65536", spec->origin, l->json_path,
                       (long long)m);
    if (out->int16_range < 0 || out->int16_range > 32767)
        return w16_err(err, WNA16_ESPEC, "%s: %s.int16_codes is %lld: expected "
                       "0 to 32767", spec->origin, l->json_path,
                       (long long)out->int16_range);
    if (m != 1 && out->int16_range)
        return w16_err(err, WNA16_ESPEC, "%s: %s: multiply and int16_codes "
                       "apply together", spec->origin, l->json_path);
    /* the global scale is the codes' unit: one without the other is
     * meaningless */
    const w16_layout_t *gl = spec->layouts[W16_ROLE_GSCALE];
    if ((out->int16_range && w16_layout_present(l, vars)) !=
        w16_layout_present(gl, vars))
        return w16_err(err, WNA16_ESPEC, "%s: %s: input_global_scale must "
                       "exist exactly where the scales are int16 codes",
                       spec->origin, gl ? gl->json_path : l->json_path);
    return WNA16_OK;
}
