/*
 * layout_io.c - reads and writes one layout's tensor, place by place.
 *
 * Both directions walk the storage: every element and every code slot in
 * it, the inverse map ("coord") names the logical value held there, or a
 * coordinate outside the logical domain for padding. Decoding copies the
 * value out of the slot; encoding puts it in (padding stays zero). That one
 * loop, driven only by the spec, is the whole reference for every layout.
 */
#include "runtime/ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; wna16 assumes a "
               "little-endian host");

static uint64_t load_elem(const uint8_t *p, size_t size)
{
    uint64_t v = 0;
    memcpy(&v, p, size);
    return v;
}

static void store_elem(uint8_t *p, size_t size, uint64_t v)
{
    memcpy(p, &v, size);
}

static float to_float(wna16_dtype_t d, uint64_t raw)
{
    switch (d) {
    case WNA16_DTYPE_F16: return wna16_f16_to_f32((uint16_t)raw);
    case WNA16_DTYPE_BF16: return wna16_bf16_to_f32((uint16_t)raw);
    case WNA16_DTYPE_F32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return 0.0f;
    }
}

static uint64_t from_float(wna16_dtype_t d, float f)
{
    switch (d) {
    case WNA16_DTYPE_F16: return wna16_f32_to_f16(f);
    case WNA16_DTYPE_BF16: return wna16_f32_to_bf16(f);
    case WNA16_DTYPE_F32: {
        uint32_t u;
        memcpy(&u, &f, 4);
        return u;
    }
    default: return 0;
    }
}

/* Sign-extends integer storage so g_idx read from I64/I32 is exact. */
static int64_t to_int(wna16_dtype_t d, uint64_t raw)
{
    switch (d) {
    case WNA16_DTYPE_I32: return (int32_t)(uint32_t)raw;
    case WNA16_DTYPE_I64: return (int64_t)raw;
    case WNA16_DTYPE_I16: return (int16_t)(uint16_t)raw;
    case WNA16_DTYPE_I8: return (int8_t)(uint8_t)raw;
    default: return (int64_t)raw;
    }
}

/* Everything one walk over a tensor needs. `l` is the layout specialized
 * for the bound dimensions (folded expressions in `arena`). */
typedef struct walk {
    const wna16_spec_t *spec;
    const w16_layout_t *l;
    w16_layout_t folded;
    w16_arena_t arena;
    int64_t *vars;
    wna16_dtype_t dtype;
    size_t esize;
    int code_bits, slots;
    int64_t shape[W16_MAX_STORE_DIMS];
    int64_t elems;
    int64_t ext[W16_MAX_COORDS];
    int nc;
    w16_role_t role;
    /* scales and input_global_scale: the scale transform of the operand
     * and its largest stored scale */
    w16_scale_xform_t sx;
    float smax;
    bool codes_use_z; /* the code transforms read z (qweight) */
} walk_t;

static wna16_status_t walk_init(walk_t *w, const wna16_spec_t *spec,
                                const w16_layout_t *l, int64_t *vars,
                                wna16_dtype_t dtype, wna16_error_t *err)
{
    memset(w, 0, sizeof *w);
    w->spec = spec;
    w->vars = vars;
    /* Fold the dims into every map once: the walk evaluates them per slot. */
    w16_arena_init(&w->arena, NULL);
    w->folded = *l;
    w16_layout_t *f = &w->folded;
    bool ok = true;
    for (int d = 0; d < l->ndim; d++) {
        ok = ok && (f->index[d] = w16_expr_fold(&w->arena, l->index[d], vars));
        if (l->sums_index[d])
            ok = ok && (f->sums_index[d] = w16_expr_fold(&w->arena,
                                                         l->sums_index[d], vars));
    }
    for (int i = 0; i < l->n_coords; i++)
        if (l->coord[i])
            ok = ok && (f->coord[i] = w16_expr_fold(&w->arena, l->coord[i], vars));
    if (l->bit)
        ok = ok && (f->bit = w16_expr_fold(&w->arena, l->bit, vars));
    if (l->encode)
        ok = ok && (f->encode = w16_expr_fold(&w->arena, l->encode, vars));
    if (l->decode)
        ok = ok && (f->decode = w16_expr_fold(&w->arena, l->decode, vars));
    if (!ok)
        return w16_err_nomem(err, "specializing a layout");
    w->l = l = f;
    w->dtype = dtype;
    w->role = l->role;
    w->esize = wna16_dtype_size(dtype);
    w->code_bits = w16_layout_code_bits(l, dtype, vars);
    if (w->code_bits <= 0 || (int)w->esize * 8 % w->code_bits != 0)
        return w16_err(err, WNA16_ESPEC, "%s: %d-bit values do not fill %s "
                       "elements", l->json_path, w->code_bits,
                       wna16_dtype_name(dtype));
    w->slots = (int)w->esize * 8 / w->code_bits;
    wna16_status_t st = w16_layout_shape(l, vars, w->shape, err);
    if (st != WNA16_OK)
        return st;
    w->elems = 1;
    for (int d = 0; d < l->ndim; d++) {
        if (w->shape[d] && w->elems > (INT64_C(1) << 40) / w->shape[d])
            return w16_err(err, WNA16_ELIMIT, "%s: the tensor has more than "
                           "2^40 elements", l->json_path);
        w->elems *= w->shape[d];
    }
    w->nc = w16_role_extent(l->role, vars, w->ext);
    if (!spec->stacked && w->nc)
        w->ext[0] = 1;
    w->codes_use_z = l->role == W16_ROLE_QWEIGHT &&
                     (w16_expr_uses(l->encode, W16_VAR_z) ||
                      w16_expr_uses(l->decode, W16_VAR_z));
    if (l->role == W16_ROLE_SCALES || l->role == W16_ROLE_GSCALE)
        return w16_scale_xform(spec, vars, &w->sx, err);
    return WNA16_OK;
}

/* What z reads for code (e, n, k) (absolute logical coordinates): the zero
 * point of its group, or the implicit 2^(bits-1). */
static int64_t group_zero(const wna16_qweight_t *qw, int64_t e, int64_t n,
                          int64_t k)
{
    if (!qw->zeros)
        return INT64_C(1) << (qw->bits - 1);
    int32_t g = wna16_qweight_group(qw, (int32_t)e, (int32_t)k);
    return qw->zeros[((size_t)e * qw->G + (size_t)g) * qw->N + (size_t)n];
}

/* Index of logical element `c` (role order) in the qweight array of the
 * role, after moving it by `at`; -1 when outside the logical domain. */
static int64_t logical_index(const walk_t *w, const wna16_qweight_t *qw,
                             const int64_t *c, w16_place_t at)
{
    for (int i = 0; i < w->nc; i++)
        if (c[i] < 0 || c[i] >= w->ext[i])
            return -1;
    int64_t e = w->nc ? c[0] + at.e_off : 0;
    switch (w->role) {
    case W16_ROLE_QWEIGHT:
    case W16_ROLE_WEIGHT:
        return (e * qw->N + c[1] + at.n_off) * qw->K + c[2];
    case W16_ROLE_SCALES:
    case W16_ROLE_QZEROS:
        return (e * qw->G + c[1]) * qw->N + c[2] + at.n_off;
    case W16_ROLE_G_IDX:
    case W16_ROLE_SORT_IDX:
        return e * qw->K + c[1];
    case W16_ROLE_BIAS:
        return e * qw->N + c[1] + at.n_off;
    case W16_ROLE_GSCALE: /* one value per operand */
        return 0;
    default:
        return -1;
    }
}

static void unflatten(const walk_t *w, int64_t flat, int64_t *idx)
{
    for (int d = w->l->ndim - 1; d >= 0; d--) {
        idx[d] = flat % w->shape[d];
        flat /= w->shape[d];
    }
}

static wna16_status_t eval_fail(const walk_t *w, const char *what,
                                w16_eval_error_t *e, wna16_error_t *err)
{
    return w16_err(err, WNA16_ESPEC, "%s: %s: %s", w->spec->origin,
                   w->l->json_path, e->what ? e->what : what);
}

static wna16_status_t check_tensor(const walk_t *w, const wna16_tensor_t *t,
                                   wna16_error_t *err)
{
    bool shape_ok = t->ndim == w->l->ndim;
    for (int d = 0; shape_ok && d < t->ndim; d++)
        shape_ok = t->shape[d] == w->shape[d];
    if (!shape_ok) {
        char want[128] = "", got[128] = "";
        for (int d = 0; d < w->l->ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld",
                     d ? ", " : "", (long long)w->shape[d]);
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld",
                     d ? ", " : "", (long long)t->shape[d]);
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': shape [%s], but the "
                       "%s layout of %s needs [%s]", t->name, got,
                       w16_role_key(w->l->role), w->spec->name, want);
    }
    if (t->nbytes < (size_t)w->elems * w->esize)
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': %zu bytes, need %lld",
                       t->name, t->nbytes, (long long)(w->elems * (int64_t)w->esize));
    return WNA16_OK;
}

static wna16_status_t decode_walk(walk_t *wp, const wna16_tensor_t *t,
                                  wna16_qweight_t *qw, w16_place_t at,
                                  wna16_error_t *err)
{
    walk_t w = *wp;
    const wna16_spec_t *spec = w.spec;
    const w16_layout_t *l = w.l;
    int64_t *vars = w.vars;
    wna16_status_t st = check_tensor(&w, t, err);
    if (st != WNA16_OK)
        return st;
    if (l->role == W16_ROLE_WEIGHT)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s holds dequantized values; "
                       "the codes cannot be recovered from it", spec->name);
    bool dtype_ok = false;
    for (int i = 0; i < l->n_dtypes; i++)
        dtype_ok = dtype_ok || l->dtypes[i] == t->dtype;
    if (!dtype_ok)
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': dtype %s, but the %s "
                       "layout of %s stores %s", t->name,
                       wna16_dtype_name(t->dtype), w16_role_key(l->role),
                       spec->name, wna16_dtype_name(l->dtypes[0]));
    if (l->role == W16_ROLE_SCALES)
        qw->scale_dtype = t->dtype;
    if (l->role == W16_ROLE_BIAS)
        qw->bias_dtype = t->dtype;
    const uint8_t *data = t->data;
    uint64_t mask = w.code_bits >= 64 ? ~0ull : (1ull << w.code_bits) - 1;
    int64_t idx[W16_MAX_STORE_DIMS], c[W16_MAX_COORDS];
    w16_eval_error_t e;
    for (int64_t flat = 0; flat < w.elems; flat++) {
        unflatten(&w, flat, idx);
        uint64_t raw = load_elem(data + (size_t)flat * w.esize, w.esize);
        for (int s = 0; s < w.slots; s++) {
            if (!w16_layout_coord(l, vars, idx, s, c, &e))
                return eval_fail(&w, "inverse map", &e, err);
            int64_t li = logical_index(&w, qw, c, at);
            if (li < 0)
                continue;
            uint64_t v = (raw >> (s * w.code_bits)) & mask;
            switch (l->role) {
            case W16_ROLE_QWEIGHT:
            case W16_ROLE_QZEROS: {
                int64_t code = (int64_t)v;
                if (l->decode && !at.raw) {
                    vars[W16_VAR_c] = code;
                    if (w.codes_use_z)
                        vars[W16_VAR_z] = group_zero(qw, c[0] + at.e_off,
                                                     c[1] + at.n_off, c[2]);
                    if (!w16_expr_eval(l->decode, vars, &code, &e))
                        return eval_fail(&w, "decode", &e, err);
                }
                if (!at.raw && (code < 0 || code > (1 << qw->bits) - 1))
                    return w16_err(err, WNA16_EFORMAT, "tensor '%s': code %lld "
                                   "outside [0, %d]", t->name, (long long)code,
                                   (1 << qw->bits) - 1);
                if (l->role == W16_ROLE_QWEIGHT)
                    qw->codes[li] = (uint8_t)code;
                else if (qw->zeros)
                    qw->zeros[li] = (uint8_t)code;
                break;
            }
            case W16_ROLE_SCALES:
                if (w.sx.int16_range)
                    return w16_err(err, WNA16_EUNSUPPORTED, "tensor '%s': "
                                   "int16 scale codes cannot be decoded",
                                   t->name);
                qw->scales[li] = to_float(t->dtype, v) / (float)w.sx.multiply;
                break;
            case W16_ROLE_BIAS:
                if (qw->bias)
                    qw->bias[li] = to_float(t->dtype, v);
                break;
            case W16_ROLE_G_IDX: {
                int64_t g = to_int(t->dtype, v);
                if (g < 0 || g >= qw->G)
                    return w16_err(err, WNA16_EFORMAT, "tensor '%s': group "
                                   "index %lld outside [0, %d)", t->name,
                                   (long long)g, qw->G);
                if (qw->g_idx)
                    qw->g_idx[li] = (int32_t)g;
                break;
            }
            case W16_ROLE_SORT_IDX:
                if (at.perm_out)
                    at.perm_out[li] = (int32_t)to_int(t->dtype, v);
                break;
            default:
                break;
            }
        }
    }
    return WNA16_OK;
}

/* The emulation value: dtype(dtype(s) * (q - z)), group k / group size. */
static float dequant_rounded(const w16_layout_t *l, const wna16_qweight_t *qw,
                             int64_t li, int64_t e, int64_t n, int64_t k)
{
    int32_t g = qw->group_size > 0 ? (int32_t)(k / qw->group_size) : 0;
    size_t gi = ((size_t)e * qw->G + (size_t)g) * qw->N + (size_t)n;
    int32_t z = qw->zeros ? qw->zeros[gi] : (1 << (qw->bits - 1));
    float s = qw->scales[gi];
    if (l->dequant_scale_dtype)
        s = to_float(l->dequant_scale_dtype, from_float(l->dequant_scale_dtype, s));
    return (float)((int32_t)qw->codes[li] - z) * s;
}

/* Is code slot c (role order, qweight or qzeros) intermediate padding?
 * vLLM pads the stored words after converting them (Marlin's fp8 remap
 * comes first), so padding holds raw zeros, never an encoded 0. */
static bool padding_code(const walk_t *w, const int64_t *c, w16_place_t at)
{
    const int64_t *v = w->vars;
    int64_t I = v[W16_VAR_I], IP = v[W16_VAR_IP], gs = v[W16_VAR_GS];
    if (IP == I || !w->spec->stacked)
        return false;
    bool codes = w->role == W16_ROLE_QWEIGHT;
    if (v[W16_VAR_W13]) /* n: gate at [0, IP), up at [IP, 2 IP) */
        return (c[codes ? 1 : 2] + at.n_off) % IP >= I;
    return codes ? c[2] >= I : gs > 0 && c[1] * gs >= I;
}

/* The value of slot (role, li) as raw bits for the layout's storage. */
static bool encode_value(const walk_t *w, const wna16_qweight_t *qw,
                         int64_t li, const int64_t *c, w16_place_t at,
                         uint64_t *out, w16_eval_error_t *e)
{
    const w16_layout_t *l = w->l;
    int64_t code;
    if ((l->role == W16_ROLE_QWEIGHT || l->role == W16_ROLE_QZEROS) &&
        padding_code(w, c, at)) {
        *out = 0;
        return true;
    }
    switch (l->role) {
    case W16_ROLE_QWEIGHT:
        code = qw->codes[li];
        break;
    case W16_ROLE_QZEROS:
        if (!qw->zeros && qw->stored_zeros) {
            /* unused zero words travel as the checkpoint stored them */
            *out = (uint64_t)qw->stored_zeros[li] & ((1ull << w->code_bits) - 1);
            return true;
        }
        code = qw->zeros ? qw->zeros[li] : (1 << (qw->bits - 1));
        break;
    case W16_ROLE_SCALES:
        *out = w16_scale_store(&w->sx, w->dtype, qw->scales[li], w->smax);
        return true;
    case W16_ROLE_GSCALE:
        *out = from_float(w->dtype, w16_scale_global(w->smax,
                                                     w->sx.int16_range));
        return true;
    case W16_ROLE_BIAS:
        *out = from_float(w->dtype, qw->bias ? qw->bias[li] : 0.0f);
        return true;
    case W16_ROLE_G_IDX:
        *out = (uint64_t)(int64_t)(qw->g_idx ? qw->g_idx[li]
                                   : (qw->group_size > 0
                                          ? (int32_t)(c[1] / qw->group_size)
                                          : 0));
        return true;
    case W16_ROLE_SORT_IDX:
        *out = (uint64_t)(int64_t)(at.perm ? at.perm[li] : c[1]);
        return true;
    case W16_ROLE_WEIGHT:
        *out = from_float(w->dtype, dequant_rounded(l, qw, li, c[0] + at.e_off,
                                                    c[1] + at.n_off, c[2]));
        return true;
    default:
        return false;
    }
    if (l->encode) {
        w->vars[W16_VAR_c] = code;
        if (w->codes_use_z)
            w->vars[W16_VAR_z] = group_zero(qw, c[0] + at.e_off,
                                            c[1] + at.n_off, c[2]);
        if (!w16_expr_eval(l->encode, w->vars, &code, e))
            return false;
    }
    *out = (uint64_t)code & ((1ull << w->code_bits) - 1);
    return true;
}

/* Derived block sums of (q - z) (CPU VNNI compensation), int32 LE. */
static wna16_status_t encode_sums(const walk_t *w, const wna16_qweight_t *qw,
                                  w16_place_t at, uint8_t *data,
                                  wna16_error_t *err)
{
    const w16_layout_t *l = w->l;
    int64_t *v = w->vars;
    w16_eval_error_t e;
    int64_t bk;
    if (!w16_expr_eval(l->sums_block_k, v, &bk, &e) || bk <= 0)
        return eval_fail(w, "sums.block_k", &e, err);
    int64_t E = w->ext[0], N = v[W16_VAR_N], K = v[W16_VAR_K];
    int64_t idx[W16_MAX_STORE_DIMS];
    for (int64_t ee = 0; ee < E; ee++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t kb = 0; kb < K / bk; kb++) {
                int32_t sum = 0;
                for (int64_t k = kb * bk; k < (kb + 1) * bk; k++) {
                    int64_t e_abs = ee + at.e_off, n_abs = n + at.n_off;
                    int32_t g = wna16_qweight_group(qw, (int32_t)e_abs,
                                                    (int32_t)k);
                    size_t gi = ((size_t)e_abs * qw->G + (size_t)g) * qw->N +
                                (size_t)n_abs;
                    int32_t z = qw->zeros ? qw->zeros[gi]
                                          : (1 << (qw->bits - 1));
                    sum += (int32_t)qw->codes[((size_t)e_abs * qw->N + n_abs) *
                                                  qw->K + k] - z;
                }
                v[W16_VAR_e] = ee;
                v[W16_VAR_n] = n;
                v[W16_VAR_g] = kb;
                int64_t flat = 0;
                for (int d = 0; d < l->ndim; d++) {
                    if (!w16_expr_eval(l->sums_index[d], v, &idx[d], &e))
                        return eval_fail(w, "sums.index", &e, err);
                    flat = flat * w->shape[d] + idx[d];
                }
                memcpy(data + flat * (int64_t)w->esize, &sum, 4);
            }
    return WNA16_OK;
}

static wna16_status_t encode_walk(walk_t *wp, const wna16_qweight_t *qw,
                                  wna16_tensor_t *t, w16_place_t at,
                                  wna16_error_t *err)
{
    walk_t w = *wp;
    const w16_layout_t *l = w.l;
    int64_t *vars = w.vars;
    wna16_status_t st = check_tensor(&w, t, err);
    if (st != WNA16_OK)
        return st;
    uint8_t *data = t->data;
    int64_t idx[W16_MAX_STORE_DIMS], c[W16_MAX_COORDS];
    w16_eval_error_t e;
    for (int64_t flat = 0; flat < w.elems; flat++) {
        unflatten(&w, flat, idx);
        uint64_t raw = 0;
        bool any = false;
        for (int s = 0; s < w.slots; s++) {
            if (!w16_layout_coord(l, vars, idx, s, c, &e))
                return eval_fail(&w, "inverse map", &e, err);
            int64_t li = logical_index(&w, qw, c, at);
            if (li < 0)
                continue;
            uint64_t v;
            if (!encode_value(&w, qw, li, c, at, &v, &e))
                return eval_fail(&w, "encode", &e, err);
            raw |= v << (s * w.code_bits);
            any = true;
        }
        if (any)
            store_elem(data + (size_t)flat * w.esize, w.esize, raw);
    }
    if (l->sums_block_k)
        return encode_sums(&w, qw, at, data, err);
    return WNA16_OK;
}

wna16_status_t w16_layout_decode(const wna16_spec_t *spec,
                                 const w16_layout_t *l, int64_t *vars,
                                 const wna16_tensor_t *t,
                                 wna16_qweight_t *qw, w16_place_t at,
                                 wna16_error_t *err)
{
    walk_t w;
    wna16_status_t st = walk_init(&w, spec, l, vars, t->dtype, err);
    if (st == WNA16_OK)
        st = decode_walk(&w, t, qw, at, err);
    w16_arena_free(&w.arena);
    return st;
}

wna16_status_t w16_layout_encode(const wna16_spec_t *spec,
                                 const w16_layout_t *l, int64_t *vars,
                                 const wna16_qweight_t *qw,
                                 wna16_tensor_t *t, w16_place_t at,
                                 wna16_error_t *err)
{
    walk_t w;
    wna16_status_t st = walk_init(&w, spec, l, vars, t->dtype, err);
    if (st == WNA16_OK && (l->role == W16_ROLE_SCALES ||
                           l->role == W16_ROLE_GSCALE)) {
        /* the operand's scales as stored (qw is the whole padded operand) */
        wna16_dtype_t sd = l->role == W16_ROLE_SCALES
                               ? t->dtype
                               : w16_layout_float_dtype(
                                     spec->layouts[W16_ROLE_SCALES],
                                     qw->scale_dtype);
        st = w16_scale_prepare(spec, &w.sx, sd,
                               vars[W16_VAR_W13] ? WNA16_GEMM_W13
                                                 : WNA16_GEMM_W2,
                               qw->scales, (size_t)qw->E * qw->G * qw->N,
                               false, &w.smax, err);
    }
    if (st == WNA16_OK)
        st = encode_walk(&w, qw, t, at, err);
    w16_arena_free(&w.arena);
    return st;
}

wna16_dtype_t w16_layout_float_dtype(const w16_layout_t *l, wna16_dtype_t have)
{
    for (int i = 0; i < l->n_dtypes; i++)
        if (have != WNA16_DTYPE_INVALID && l->dtypes[i] == have)
            return have;
    return l->dtypes[0];
}
