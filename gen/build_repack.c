/*
 * build_repack.c - the repack kernel builder (see build_repack.h).
 *
 *   group, lane -> destination word (see "lanes and words"; on the CPU a
 *   lane's block of words, see "word blocks") -> storage index
 *   i0..i(d-1) of each element of the word
 *     for each element of the word and each code slot (unrolled):
 *       dst inverse map  -> padded logical coordinates, valid?
 *       undo padding     -> logical coordinates of the layer
 *       source forward   -> table slot (expert, projection), element, bit
 *       load, extract, decode (source), encode (destination)
 *     or the whole element for float roles, with format conversion
 *   store the word
 *
 * Coordinates of padding slots are replaced by 0 before the source is
 * addressed (a select), so no lane ever reads out of bounds, and the
 * interval analysis of lower_expr.c knows every coordinate's range. Where
 * a workgroup has no padding (known per workgroup, not per lane), a second
 * copy of the body uses the coordinates as they are, which lets the slots
 * of a word share their source words; the CPU emitter's LLVM pipeline
 * hoists the choice out of the loop over lanes.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

static const char *gemm_name(wna16_gemm_t g) { return g == WNA16_GEMM_W13 ? "w13" : "w2"; }

static kir_type_t int_type_bytes(size_t bytes)
{
    switch (bytes) {
    case 1: return KIR_I8;
    case 2: return KIR_I16;
    case 4: return KIR_I32;
    case 8: return KIR_I64;
    default: return KIR_VOID;
    }
}

/* "_f16" for a float dtype (identifier-safe), "" otherwise. */
static const char *float_tag(wna16_dtype_t d)
{
    switch (d) {
    case WNA16_DTYPE_F16: return "_f16";
    case WNA16_DTYPE_BF16: return "_bf16";
    case WNA16_DTYPE_F32: return "_f32";
    default: return "";
    }
}
static kir_type_t int_type_of(wna16_dtype_t d) { return int_type_bytes(wna16_dtype_size(d)); }

void w16_repack_kernel_name(char *out, size_t n, const w16_repack_request_t *r)
{
    char gs[16];
    if (r->problem.GS > 0)
        snprintf(gs, sizeof gs, "g%lld", (long long)r->problem.GS);
    else
        snprintf(gs, sizeof gs, "gm1");
    /* the float source (scales or bias; a kernel reads at most one) */
    const char *src_f = "";
    for (int i = 0; i < W16_ROLE_COUNT && !*src_f; i++)
        src_f = float_tag(r->src_dtype[i]);
    const char *dst_f = float_tag(r->dst_dtype);
    static const char *const a8[] = {"", "_a8int8", "_a8fp8"};
    snprintf(out, n, "wna16_repack_%s_to_%s_%s_%s_b%lld_%s_zp%d%s%s%s%s%s",
             r->src->name, r->dst->name, gemm_name(r->gemm),
             w16_role_key(r->role), (long long)r->problem.BITS, gs,
             r->problem.zp ? 1 : 0, r->problem.act_order ? "_ao" : "",
             r->problem.bias ? "_bias" : "",
             (unsigned)r->problem.a8 < 3 ? a8[r->problem.a8] : "_a8", src_f,
             strcmp(src_f, dst_f) ? dst_f : "");
}

int w16_repack_source_roles(w16_role_t dst, const w16_problem_t *p,
                            w16_role_t out[W16_REPACK_MAX_SOURCES])
{
    int n = 0;
    switch (dst) {
    case W16_ROLE_WEIGHT: /* dequantized: (q - z) * s */
        out[n++] = W16_ROLE_QWEIGHT;
        out[n++] = W16_ROLE_SCALES;
        if (p->zp)
            out[n++] = W16_ROLE_QZEROS;
        break;
    case W16_ROLE_QZEROS: /* else the implicit midpoint */
        if (p->zp || p->zeros_stored)
            out[n++] = W16_ROLE_QZEROS;
        break;
    case W16_ROLE_SORT_IDX:
        break; /* the permutation itself: a parameter, not a source */
    case W16_ROLE_GSCALE:
        break; /* from the largest scale, a parameter */
    case W16_ROLE_G_IDX: /* else k / group size */
        if (p->act_order)
            out[n++] = W16_ROLE_G_IDX;
        break;
    case W16_ROLE_QWEIGHT: /* block sums (CPU) also need the zeros */
        out[n++] = W16_ROLE_QWEIGHT;
        if (p->zp)
            out[n++] = W16_ROLE_QZEROS;
        break;
    default:
        out[n++] = dst;
        break;
    }
    return n;
}

wna16_dtype_t w16_repack_dst_dtype(const w16_layout_t *l,
                                   wna16_dtype_t first_src)
{
    if (l->role != W16_ROLE_WEIGHT)
        for (int i = 0; i < l->n_dtypes; i++)
            if (l->dtypes[i] == first_src)
                return first_src;
    return l->dtypes[0];
}

/* ---- folding the specs for the problem ----------------------------------- */

static bool fold_layout(builder_t *B, const w16_layout_t *l, const int64_t *v,
                        w16_layout_t *f)
{
    w16_arena_t *a = &B->k->arena;
    *f = *l;
    bool ok = true;
    for (int d = 0; d < l->ndim; d++) {
        ok = ok && (f->index[d] = w16_expr_fold(a, l->index[d], v));
        if (l->sums_index[d])
            ok = ok && (f->sums_index[d] = w16_expr_fold(a, l->sums_index[d], v));
    }
    for (int i = 0; i < l->n_coords; i++)
        if (l->coord[i])
            ok = ok && (f->coord[i] = w16_expr_fold(a, l->coord[i], v));
    for (int i = 0; i < 3; i++)
        if (l->sums_coord[i])
            ok = ok && (f->sums_coord[i] = w16_expr_fold(a, l->sums_coord[i], v));
    if (l->bit)
        ok = ok && (f->bit = w16_expr_fold(a, l->bit, v));
    if (l->encode)
        ok = ok && (f->encode = w16_expr_fold(a, l->encode, v));
    if (l->decode)
        ok = ok && (f->decode = w16_expr_fold(a, l->decode, v));
    return ok;
}

static const kir_expr_t *bfail(builder_t *B, const char *why)
{
    if (!B->fail)
        B->fail = why;
    return NULL;
}

static const kir_expr_t *lower(builder_t *B, const w16_expr_t *x,
                               w16_range_t *r)
{
    const kir_expr_t *e = w16_lower(&B->L, x, r);
    if (!e)
        bfail(B, B->L.failure);
    return e;
}

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }

/* let a fresh variable = e; returns a reference to it. */
static const kir_expr_t *bind_let(builder_t *B, const char *name,
                                  const kir_expr_t *e)
{
    if (!e)
        return NULL;
    const kir_expr_t *r = w16_lower_let(&B->L, B->body, name, e);
    return r ? r : bfail(B, "out of memory");
}

/* ---- the source side ----------------------------------------------------- */

/* Loads the raw storage element holding the source value of `role` at `at`
 * and extracts it: a code (after the source's decode transform) for codes,
 * the element's bits otherwise. Result: i64. */
static const kir_expr_t *src_value_raw(builder_t *B, w16_role_t role,
                                       const lcoord_t *at, bool raw);

static const kir_expr_t *src_value(builder_t *B, w16_role_t role,
                                   const lcoord_t *at)
{
    return src_value_raw(B, role, at, false);
}

/* The k a sorted destination reads: perm[e][k]. */
static const kir_expr_t *permuted_k(builder_t *B, const lcoord_t *at,
                                    const kir_expr_t *k)
{
    kir_kernel_t *kk = B->k;
    const kir_expr_t *idx = w16_ir_add(kk, w16_ir_mul(kk, at->c[0],
                                                      ik(B, B->dv[W16_VAR_K])), k);
    return kir_int_cast(kk, KIR_I64, kir_load(kk, B->perm, w16_ir_index32(&B->L, idx)),
                        false);
}

/* What z reads for the code at `at` (e, n, k): the zero point of its group
 * from the source, or the implicit 2^(bits-1). i64. */
static const kir_expr_t *code_zero(builder_t *B, const lcoord_t *at)
{
    const w16_repack_request_t *r = B->req;
    if (!r->problem.zp)
        return ik(B, INT64_C(1) << (r->problem.BITS - 1));
    if (r->problem.act_order)
        return bfail(B, "code transforms that read z take the group k / group "
                        "size; act-order is not supported there");
    int64_t gs = r->problem.GS;
    lcoord_t g = {.n = 3};
    g.c[0] = at->c[0];
    g.ext[0] = at->ext[0];
    g.c[1] = gs > 0 ? w16_ir_floordiv(&B->L, at->c[2], gs,
                                      (w16_range_t){0, at->ext[2] - 1})
                    : ik(B, 0);
    g.ext[1] = gs > 0 ? (at->ext[2] + gs - 1) / gs : 1;
    g.c[2] = at->c[1];
    g.ext[2] = at->ext[1];
    return src_value(B, W16_ROLE_QZEROS, &g);
}

static const kir_expr_t *src_value_raw(builder_t *B, w16_role_t role,
                                       const lcoord_t *at, bool raw)
{
    kir_kernel_t *k = B->k;
    const w16_layout_t *l = &B->sl[role];
    const w16_repack_request_t *r = B->req;
    bool per_expert = !r->src->stacked;
    /* z first: reading it rebinds the lowering's variables */
    const kir_expr_t *z = NULL;
    if (role == W16_ROLE_QWEIGHT && l->decode && !raw &&
        w16_expr_uses(l->decode, W16_VAR_z) && !(z = code_zero(B, at)))
        return NULL;
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(role, cv);
    w16_lower_clear_vars(&B->L);
    const kir_expr_t *slot = ik(B, 0);
    for (int i = 0; i < nc; i++) {
        const kir_expr_t *c = at->c[i];
        int64_t ext = at->ext[i];
        if (cv[i] == W16_VAR_e && per_expert) {
            /* the expert picks the tensor; the layout sees e = 0. w13 has
             * two tensors per expert (gate, up); roles without an output
             * channel (g_idx) read the gate's, as vLLM keeps one row */
            bool has_n = false;
            for (int j = 0; j < nc; j++)
                has_n = has_n || cv[j] == W16_VAR_n;
            slot = r->gemm == WNA16_GEMM_W13 && !has_n
                       ? w16_ir_mul(k, c, ik(B, 2)) : c;
            w16_lower_bind(&B->L, W16_VAR_e, ik(B, 0), 0, 0);
            continue;
        }
        if (cv[i] == W16_VAR_k && B->perm)
            c = bind_let(B, "pk", permuted_k(B, at, c));
        if (cv[i] == W16_VAR_n && r->gemm == WNA16_GEMM_W13 &&
            B->sv[W16_VAR_IP] != r->problem.I) {
            /* a padded source (e.g. Marlin): each shard of I sits at a
             * multiple of IP; w2's padding is at the end of K */
            int64_t I = r->problem.I, IP = B->sv[W16_VAR_IP];
            w16_range_t rc = {0, ext - 1};
            c = w16_ir_add(k, w16_ir_mul(k, w16_ir_floordiv(&B->L, c, I, rc), ik(B, IP)),
                           w16_ir_floormod(&B->L, c, I, rc));
            ext = 2 * IP;
        }
        if (cv[i] == W16_VAR_n && per_expert && r->gemm == WNA16_GEMM_W13) {
            /* gate holds n in [0, I), up holds [I, 2I) */
            int64_t I = r->problem.I;
            w16_range_t rc = {0, ext - 1};
            const kir_expr_t *up = w16_ir_floordiv(&B->L, c, I, rc);
            const kir_expr_t *within = w16_ir_floormod(&B->L, c, I, rc);
            if (within->op == KIR_OP_UREM) { /* no cheaper form: compare */
                up = kir_int_cast(k, KIR_I64, w16_ir_ge(&B->L, c, I), false);
                within = kir_bin(k, KIR_OP_SUB, c, w16_ir_mul(k, up, ik(B, I)));
            }
            slot = w16_ir_add(k, w16_ir_mul(k, slot, ik(B, 2)), up);
            c = within;
            ext = I;
        }
        w16_lower_bind(&B->L, cv[i], c, 0, ext - 1);
    }
    /* rows: the index of every dimension but the last, flattened */
    const kir_expr_t *flat = ik(B, 0), *rows = ik(B, 0), *ix = NULL;
    for (int d = 0; d < l->ndim; d++) {
        w16_range_t ri;
        rows = flat;
        if (!(ix = lower(B, l->index[d], &ri)))
            return NULL;
        flat = w16_ir_add(k, w16_ir_mul(k, flat, ik(B, B->sshape[role][d])), ix);
    }
    const kir_expr_t *elem = w16_rp_source_load(B, role, slot, flat, rows, ix);
    const kir_expr_t *v = kir_int_cast(k, KIR_I64, elem, false);
    if (role != W16_ROLE_QWEIGHT && role != W16_ROLE_QZEROS)
        return v;
    int cb = w16_layout_code_bits(l, r->src_dtype[role], B->sv);
    if (l->bit) {
        w16_range_t rb;
        const kir_expr_t *bit = lower(B, l->bit, &rb);
        if (!bit)
            return NULL;
        int64_t bv;
        if (!(bit->op == KIR_OP_CONST && (bv = bit->ival) == 0))
            v = kir_bin(k, KIR_OP_LSHR, v, bit);
    }
    if (cb < 64)
        v = kir_bin(k, KIR_OP_AND, v, ik(B, (INT64_C(1) << cb) - 1));
    if (l->decode && !raw) {
        v = bind_let(B, "stored", v);
        if (z)
            z = bind_let(B, "zero", z);
        w16_lower_bind(&B->L, W16_VAR_c, v, 0, (INT64_C(1) << cb) - 1);
        if (z)
            w16_lower_bind(&B->L, W16_VAR_z, z, 0,
                           (INT64_C(1) << r->problem.BITS) - 1);
        v = lower(B, l->decode, NULL);
    }
    return v;
}

/* ---- float formats ------------------------------------------------------- */

/* Raw bits of a float of dtype d (i64 holding them) -> f32. */
static const kir_expr_t *bits_to_f32(builder_t *B, wna16_dtype_t d,
                                     const kir_expr_t *bits)
{
    kir_kernel_t *k = B->k;
    switch (d) {
    case WNA16_DTYPE_F32:
        return kir_convert(k, KIR_OP_BITCAST, KIR_F32,
                           kir_int_cast(k, KIR_I32, bits, false));
    case WNA16_DTYPE_F16:
        return kir_convert(k, KIR_OP_FCONV, KIR_F32,
                           kir_convert(k, KIR_OP_BITCAST, KIR_F16,
                                       kir_int_cast(k, KIR_I16, bits, false)));
    case WNA16_DTYPE_BF16: /* bf16 is the high half of an f32 */
        return kir_convert(k, KIR_OP_BITCAST, KIR_F32,
                           kir_bin(k, KIR_OP_SHL,
                                   kir_int_cast(k, KIR_I32, bits, false),
                                   kir_const(k, KIR_I32, 16)));
    default:
        return bfail(B, "not a float dtype");
    }
}

/* f32 -> raw bits (i64) of dtype d, rounding to nearest even. */
static const kir_expr_t *f32_to_bits(builder_t *B, wna16_dtype_t d,
                                     const kir_expr_t *f)
{
    kir_kernel_t *k = B->k;
    switch (d) {
    case WNA16_DTYPE_F32:
        return kir_int_cast(k, KIR_I64,
                            kir_convert(k, KIR_OP_BITCAST, KIR_I32, f), false);
    case WNA16_DTYPE_F16:
        return kir_int_cast(k, KIR_I64,
                            kir_convert(k, KIR_OP_BITCAST, KIR_I16,
                                        kir_convert(k, KIR_OP_FCONV, KIR_F16, f)),
                            false);
    case WNA16_DTYPE_BF16: {
        /* u + 0x7fff + ((u >> 16) & 1), >> 16; NaN keeps a quiet NaN */
        const kir_expr_t *u = bind_let(B, "f32bits",
            kir_int_cast(k, KIR_I64, kir_convert(k, KIR_OP_BITCAST, KIR_I32, f),
                         false));
        const kir_expr_t *lsb = kir_bin(k, KIR_OP_AND,
                                        kir_bin(k, KIR_OP_LSHR, u, ik(B, 16)),
                                        ik(B, 1));
        const kir_expr_t *rounded = kir_bin(k, KIR_OP_AND,
            kir_bin(k, KIR_OP_LSHR,
                    w16_ir_add(k, w16_ir_add(k, u, ik(B, 0x7fff)), lsb),
                    ik(B, 16)),
            ik(B, 0xffff));
        const kir_expr_t *nan = kir_bin(k, KIR_OP_ULT, ik(B, 0x7f800000),
                                        kir_bin(k, KIR_OP_AND, u,
                                                ik(B, 0x7fffffff)));
        const kir_expr_t *qnan = kir_bin(k, KIR_OP_OR,
                                         kir_bin(k, KIR_OP_LSHR, u, ik(B, 16)),
                                         ik(B, 0x40));
        return kir_select(k, nan, qnan, rounded);
    }
    default:
        return bfail(B, "not a float dtype");
    }
}

/* f rounded to dtype d, as f32. */
static const kir_expr_t *round_to(builder_t *B, wna16_dtype_t d,
                                  const kir_expr_t *f)
{
    return d == WNA16_DTYPE_F32 ? f : bits_to_f32(B, d, f32_to_bits(B, d, f));
}

/* Nearest integer, ties to even, of an f32 below 2^23 in magnitude: the
 * truncation plus a correction from the exact remainder. i64. */
static const kir_expr_t *rint_even(builder_t *B, const kir_expr_t *f)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *t = bind_let(B, "rint_t",
                                   kir_convert(k, KIR_OP_FTOSI, KIR_I64, f));
    const kir_expr_t *fr = bind_let(B, "rint_fr", kir_bin(k, KIR_OP_FSUB, f,
        kir_convert(k, KIR_OP_SITOF, KIR_F32, t)));
    const kir_expr_t *half = kir_fconst(k, KIR_F32, 0.5);
    const kir_expr_t *mhalf = kir_fconst(k, KIR_F32, -0.5);
    const kir_expr_t *odd = kir_bin(k, KIR_OP_NE,
                                    kir_bin(k, KIR_OP_AND, t, ik(B, 1)), ik(B, 0));
    const kir_expr_t *is_half = kir_bin(k, KIR_OP_AND,
                                        kir_bin(k, KIR_OP_FLE, half, fr),
                                        kir_bin(k, KIR_OP_FLE, fr, half));
    const kir_expr_t *is_mhalf = kir_bin(k, KIR_OP_AND,
                                         kir_bin(k, KIR_OP_FLE, mhalf, fr),
                                         kir_bin(k, KIR_OP_FLE, fr, mhalf));
    const kir_expr_t *up = kir_bin(k, KIR_OP_OR, kir_bin(k, KIR_OP_FLT, half, fr),
                                   kir_bin(k, KIR_OP_AND, is_half, odd));
    const kir_expr_t *down = kir_bin(k, KIR_OP_OR,
                                     kir_bin(k, KIR_OP_FLT, fr, mhalf),
                                     kir_bin(k, KIR_OP_AND, is_mhalf, odd));
    return kir_bin(k, KIR_OP_SUB,
                   w16_ir_add(k, t, kir_int_cast(k, KIR_I64, up, false)),
                   kir_int_cast(k, KIR_I64, down, false));
}

/* A source scale (raw bits of dtype sd) through the source's and the
 * destination's scale transforms, as raw bits of the destination dtype:
 * runtime/ref/scale_xform.c's arithmetic, step by step. */
static const kir_expr_t *scale_bits(builder_t *B, wna16_dtype_t sd,
                                    const kir_expr_t *raw)
{
    kir_kernel_t *k = B->k;
    wna16_dtype_t dd = B->req->dst_dtype;
    const kir_expr_t *f = bits_to_f32(B, sd, raw);
    if (B->ssx.multiply != 1) /* a power of two: exact */
        f = kir_bin(k, KIR_OP_FDIV, f,
                    kir_fconst(k, KIR_F32, (double)B->ssx.multiply));
    if (sd != dd || B->ssx.multiply != 1)
        f = round_to(B, dd, f);
    f = bind_let(B, "scale", f);
    if (B->dsx.int16_range) {
        if (!B->smax)
            return bfail(B, "int16 scale codes need the largest scale");
        const kir_expr_t *q = round_to(B, dd, kir_bin(k, KIR_OP_FDIV, f,
                                                      kir_pref(k, B->smax)));
        const kir_expr_t *p = bind_let(B, "scaled", round_to(B, dd,
            kir_bin(k, KIR_OP_FMUL, q,
                    kir_fconst(k, KIR_F32, (double)B->dsx.int16_range))));
        /* the int16 code's bits, bit-cast into the float element */
        return kir_bin(k, KIR_OP_AND, rint_even(B, p), ik(B, 0xffff));
    }
    if (B->dsx.multiply != 1)
        f = kir_bin(k, KIR_OP_FMUL, f,
                    kir_fconst(k, KIR_F32, (double)B->dsx.multiply));
    return f32_to_bits(B, dd, f);
}

/* ---- the destination side ------------------------------------------------ */

/* Coordinates (role order) of the destination slot: inverse map with the
 * storage index bound, then validity and padding removal. Fills `at` with
 * the logical coordinates (meaningful only where the slot holds a value:
 * see clamp_slot); returns the i1 "this slot holds a value". */
static const kir_expr_t *dst_slot(builder_t *B, int slot, lcoord_t *at)
{
    kir_kernel_t *k = B->k;
    const w16_layout_t *l = &B->dl;
    const w16_repack_request_t *r = B->req;
    w16_lower_clear_vars(&B->L);
    for (int d = 0; d < l->ndim; d++)
        w16_lower_bind(&B->L, (w16_var_t)(W16_VAR_i0 + d), B->idx[d], 0,
                       B->out->shape[d] - 1);
    w16_lower_bind(&B->L, W16_VAR_slot, ik(B, slot), slot, slot);
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(l->role, cv);
    int64_t ext[W16_MAX_COORDS];
    w16_role_extent(l->role, B->dv, ext);
    const kir_expr_t *valid = kir_const(k, KIR_I1, 1);
    int64_t I = r->problem.I, IP = B->dv[W16_VAR_IP];
    at->n = nc;
    for (int i = 0; i < nc; i++) {
        w16_range_t rc;
        const kir_expr_t *c = lower(B, l->coord[i], &rc);
        if (!c)
            return NULL;
        char name[16];
        snprintf(name, sizeof name, "c%d_%s", B->pos, w16_var_name(cv[i]));
        c = bind_let(B, name, c);
        valid = w16_ir_and1(k, valid, w16_ir_in_range(&B->L, c, rc, 0, ext[i]));
        /* where the slot holds a value, c is in range */
        c = w16_ir_assume_in_range(&B->L, c, 0, ext[i]);
        int64_t logical_ext = ext[i];
        /* Undo the intermediate padding (zero-filled places). */
        if (IP != I) {
            w16_range_t cr = {rc.lo < 0 ? 0 : rc.lo,
                              rc.hi >= ext[i] ? ext[i] - 1 : rc.hi};
            if (cv[i] == W16_VAR_n && r->gemm == WNA16_GEMM_W13) {
                const kir_expr_t *shard = w16_ir_floordiv(&B->L, c, IP, cr);
                const kir_expr_t *within = w16_ir_floormod(&B->L, c, IP, cr);
                valid = w16_ir_and1(k, valid, kir_bin(k, KIR_OP_SLT, within, ik(B, I)));
                c = w16_ir_add(k, w16_ir_mul(k, shard, ik(B, I)), within);
                logical_ext = 2 * I;
            } else if (cv[i] == W16_VAR_k && r->gemm == WNA16_GEMM_W2) {
                valid = w16_ir_and1(k, valid, kir_bin(k, KIR_OP_SLT, c, ik(B, I)));
                logical_ext = I;
            } else if (cv[i] == W16_VAR_g && r->gemm == WNA16_GEMM_W2 &&
                       r->problem.GS > 0) {
                int64_t G = I / r->problem.GS;
                valid = w16_ir_and1(k, valid, kir_bin(k, KIR_OP_SLT, c, ik(B, G)));
                logical_ext = G;
            }
        }
        at->c[i] = c;
        at->ext[i] = logical_ext;
    }
    return bind_let(B, "valid", valid);
}

/* Coordinates of a slot that may be padding replaced by 0 there, so the
 * source is never addressed out of bounds. */
static void clamp_slot(builder_t *B, const kir_expr_t *valid, lcoord_t *at)
{
    if (valid->op == KIR_OP_CONST && valid->ival)
        return;
    w16_var_t cv[W16_MAX_COORDS];
    w16_role_coords(B->dl.role, cv);
    for (int i = 0; i < at->n; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d_%s", B->pos, w16_var_name(cv[i]));
        at->c[i] = bind_let(B, name, w16_ir_select(B->k, valid, at->c[i], ik(B, 0)));
    }
}

/* The value a code slot holds: source code, or implicit zero. i64. Sets
 * *raw when the value is a stored code to pass through untransformed. */
static const kir_expr_t *code_for(builder_t *B, const lcoord_t *at, bool *raw)
{
    w16_role_t role = B->dl.role;
    *raw = false;
    if (role == W16_ROLE_QZEROS && !B->req->problem.zp) {
        if (B->req->problem.zeros_stored) {
            /* unused zero words travel as the checkpoint stored them */
            *raw = true;
            return src_value_raw(B, role, at, true);
        }
        return ik(B, INT64_C(1) << (B->req->problem.BITS - 1));
    }
    return src_value(B, role, at);
}

/* bf16(bf16(s) * (q - z)) style dequantized value, as raw dst bits. */
static const kir_expr_t *dequant_bits(builder_t *B, const lcoord_t *at)
{
    kir_kernel_t *k = B->k;
    const w16_repack_request_t *r = B->req;
    const kir_expr_t *q = src_value(B, W16_ROLE_QWEIGHT, at);
    int64_t gse = r->problem.GS > 0 ? r->problem.GS : B->dv[W16_VAR_K];
    lcoord_t g = {.n = 3};
    g.c[0] = at->c[0];
    g.ext[0] = at->ext[0];
    g.c[1] = w16_ir_floordiv(&B->L, at->c[2], gse, (w16_range_t){0, at->ext[2] - 1});
    g.ext[1] = (at->ext[2] + gse - 1) / gse;
    g.c[2] = at->c[1];
    g.ext[2] = at->ext[1];
    const kir_expr_t *s = bits_to_f32(B, r->src_dtype[W16_ROLE_SCALES],
                                      src_value(B, W16_ROLE_SCALES, &g));
    const kir_expr_t *z = r->problem.zp ? src_value(B, W16_ROLE_QZEROS, &g)
                                        : ik(B, INT64_C(1) << (r->problem.BITS - 1));
    if (B->dl.dequant_scale_dtype)
        s = bits_to_f32(B, B->dl.dequant_scale_dtype,
                        f32_to_bits(B, B->dl.dequant_scale_dtype, s));
    const kir_expr_t *qz = kir_convert(k, KIR_OP_SITOF, KIR_F32,
                                       kir_int_cast(k, KIR_I32,
                                                    kir_bin(k, KIR_OP_SUB, q, z),
                                                    true));
    return f32_to_bits(B, r->dst_dtype, kir_bin(k, KIR_OP_FMUL, qz, s));
}

/* The raw bits (i64) one slot contributes, before masking and shifting:
 * its value where `valid`, else 0. */
static const kir_expr_t *slot_bits(builder_t *B, const kir_expr_t *valid,
                                   lcoord_t at)
{
    kir_kernel_t *k = B->k;
    const w16_repack_request_t *r = B->req;
    clamp_slot(B, valid, &at);
    const kir_expr_t *v = NULL;
    switch (B->dl.role) {
    case W16_ROLE_QWEIGHT:
    case W16_ROLE_QZEROS: {
        bool raw;
        v = code_for(B, &at, &raw);
        if (v && B->dl.encode && !raw) {
            const kir_expr_t *z = NULL;
            if (B->dl.role == W16_ROLE_QWEIGHT &&
                w16_expr_uses(B->dl.encode, W16_VAR_z) &&
                !(z = code_zero(B, &at)))
                return NULL;
            v = bind_let(B, "code", v); /* the transform may read c twice */
            if (z)
                z = bind_let(B, "zero", z);
            w16_lower_clear_vars(&B->L);
            w16_lower_bind(&B->L, W16_VAR_c, v, 0,
                           (INT64_C(1) << r->problem.BITS) - 1);
            if (z)
                w16_lower_bind(&B->L, W16_VAR_z, z, 0,
                               (INT64_C(1) << r->problem.BITS) - 1);
            v = lower(B, B->dl.encode, NULL);
        }
        break;
    }
    case W16_ROLE_SCALES:
    case W16_ROLE_BIAS: {
        const kir_expr_t *raw = src_value(B, B->dl.role, &at);
        wna16_dtype_t sd = r->src_dtype[B->dl.role];
        bool xform = B->dl.role == W16_ROLE_SCALES &&
                     (B->ssx.multiply != 1 || B->dsx.multiply != 1 ||
                      B->dsx.int16_range);
        v = xform ? scale_bits(B, sd, raw)
            : sd == r->dst_dtype ? raw
                                 : f32_to_bits(B, r->dst_dtype,
                                               bits_to_f32(B, sd, raw));
        break;
    }
    case W16_ROLE_GSCALE: /* fp32(max) / range, vLLM's 1/range * max */
        if (!B->smax || !B->dsx.int16_range)
            return bfail(B, "the input_global_scale needs int16 scale codes");
        v = f32_to_bits(B, r->dst_dtype, kir_bin(k, KIR_OP_FMUL,
            kir_fconst(k, KIR_F32, (double)(float)(1.0 / (double)B->dsx.int16_range)),
            kir_pref(k, B->smax)));
        break;
    case W16_ROLE_G_IDX:
        if (r->problem.act_order)
            v = src_value(B, W16_ROLE_G_IDX, &at);
        else /* k / group size */
            v = r->problem.GS > 0
                    ? w16_ir_floordiv(&B->L, at.c[1], r->problem.GS,
                                      (w16_range_t){0, at.ext[1] - 1})
                    : ik(B, 0);
        break;
    case W16_ROLE_WEIGHT:
        v = dequant_bits(B, &at);
        break;
    case W16_ROLE_SORT_IDX:
        if (!B->perm)
            return bfail(B, "sort indices need the act-order permutation");
        v = permuted_k(B, &at, at.c[1]);
        break;
    default:
        return bfail(B, "this destination role is not generated yet");
    }
    if (!v)
        return NULL;
    return w16_ir_select(k, valid, v, ik(B, 0));
}

/* ---- the kernel ---------------------------------------------------------- */

/* ---- lanes and words ------------------------------------------------------
 *
 * A lane writes one destination word: `wide` consecutive elements of the
 * last dimension (4 bytes for byte and half-word layouts), so narrow
 * layouts cost one store per word and the codes a word takes from one
 * source word are extracted from one load.
 *
 * Lanes run along the trailing dimensions of the word grid [S0 .. Sn-1]: a
 * workgroup is t consecutive values of dimension j times all of the
 * dimensions after it (L = t * Sj+1 * ... * Sn-1 lanes, t dividing Sj), so
 * the word a lane writes is group * L + lane, no lane is ever past the end,
 * and every index but the lane's part of the trailing ones depends on the
 * group alone (the CPU emitter hoists it out of the loop over lanes):
 *
 *   q  = group / (Sj / t)                    dims 0 .. j-1 from q
 *   ij = (group % (Sj / t)) * t + lane / P   P = Sj+1 * ... * Sn-1
 *   id = (lane / (Sd+1 * ... * Sn-1)) % Sd   d > j
 *
 * Shapes with no such tiling of at least MIN_LANES lanes (a large prime
 * last dimension) fall back to a plain flat index with a bounds check.
 */
enum { MIN_LANES = 32 };

static int word_elems(const w16_repack_kernel_t *out, wna16_dtype_t dt)
{
    int es = (int)wna16_dtype_size(dt);
    int w = es >= 4 ? 1 : 4 / es;
    while (w > 1 && out->shape[out->ndim - 1] % w)
        w /= 2;
    return w;
}

static wna16_status_t setup(builder_t *B, wna16_context_t *ctx,
                            const w16_repack_request_t *req,
                            w16_repack_kernel_t *out, bool sums,
                            wna16_error_t *err)
{
    memset(B, 0, sizeof *B);
    memset(out, 0, sizeof *out);
    B->ctx = ctx;
    B->req = req;
    B->out = out;
    B->err = err;
    for (int i = 0; i < W16_ROLE_COUNT; i++)
        out->src_param[i] = -1;
    out->sums = sums;
    B->unroll = 1;
    if (!req->dst->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "generated repack writes "
                       "stacked layouts; %s stores one tensor per expert and "
                       "projection (use the reference target)", req->dst->name);
    const w16_layout_t *dl = req->dst->layouts[req->role];
    if (!dl)
        return w16_err(err, WNA16_EINVAL, "%s has no %s layout", req->dst->name,
                       w16_role_key(req->role));
    wna16_status_t st = w16_spec_bind(req->dst, &req->problem, req->gemm, B->dv, err);
    if (st == WNA16_OK)
        st = w16_spec_bind(req->src, &req->problem, req->gemm, B->sv, err);
    if (st == WNA16_OK)
        st = w16_scale_xform(req->dst, B->dv, &B->dsx, err);
    if (st == WNA16_OK)
        st = w16_scale_xform(req->src, B->sv, &B->ssx, err);
    if (st != WNA16_OK)
        return st;
    if (B->ssx.int16_range && req->src_dtype[W16_ROLE_SCALES])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: int16 scale codes cannot "
                       "be decoded", req->src->name);
    char name[200];
    w16_repack_kernel_name(name, sizeof name, req);
    if (sums)
        strncat(name, "_sums", sizeof name - strlen(name) - 1);
    int lanes = req->lanes > 0 ? req->lanes : 256;
    B->k = kir_kernel_new(ctx, name, lanes);
    if (!B->k)
        return w16_err_nomem(err, "creating a repack kernel");
    out->kernel = B->k;
    B->body = &B->k->body;
    w16_lower_init(&B->L, B->k);
    if (!fold_layout(B, dl, B->dv, &B->dl))
        return w16_err_nomem(err, "specializing a layout");
    if ((st = w16_layout_shape(dl, B->dv, out->shape, err)) != WNA16_OK)
        return st;
    out->ndim = dl->ndim;
    out->elems = 1;
    for (int d = 0; d < dl->ndim; d++) {
        /* a layout whose blocks are larger than the problem (flashinfer's
         * 256-wide K blocks for K = 128) has no room for it: refuse here,
         * where the message can say so, not with a division by zero */
        if (out->shape[d] <= 0)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s: dimension %d of "
                           "the stored shape is %lld for this problem (N = "
                           "%lld, K = %lld): the layout cannot hold it",
                           req->dst->name, dl->json_path, d,
                           (long long)out->shape[d],
                           (long long)B->dv[W16_VAR_N],
                           (long long)B->dv[W16_VAR_K]);
        out->elems *= out->shape[d];
    }
    /* Sources: every role whose dtype the request names. */
    out->per_expert_source = !req->src->stacked;
    out->table_slots = out->per_expert_source
                           ? (int)req->problem.E * (req->gemm == WNA16_GEMM_W13 ? 2 : 1)
                           : 1;
    B->wide = sums ? 1 : word_elems(out, req->dst_dtype);
    kir_type_t dt = int_type_bytes(wna16_dtype_size(req->dst_dtype) * (size_t)B->wide);
    B->dst = kir_param(B->k, "dst", KIR_PARAM_BUFFER, dt, true);
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        if (!req->src_dtype[r])
            continue;
        const w16_layout_t *s = req->src->layouts[r];
        if (!s)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout",
                           req->src->name, w16_role_key((w16_role_t)r));
        if (!fold_layout(B, s, B->sv, &B->sl[r]))
            return w16_err_nomem(err, "specializing a layout");
        if ((st = w16_layout_shape(s, B->sv, B->sshape[r], err)) != WNA16_OK)
            return st;
        char pname[40];
        snprintf(pname, sizeof pname, "src_%s", w16_role_key((w16_role_t)r));
        B->table[r] = kir_param(B->k, pname, KIR_PARAM_BUFFER_TABLE,
                                int_type_of(req->src_dtype[r]), false);
        if (!B->table[r])
            return w16_err_nomem(err, "declaring parameters");
        out->src_param[r] = B->table[r]->index;
    }
    if (!B->dst)
        return w16_err_nomem(err, "declaring parameters");
    out->perm_param = -1;
    out->scale_max_param = -1;
    if (req->role == W16_ROLE_GSCALE ||
        (req->role == W16_ROLE_SCALES && B->dsx.int16_range)) {
        B->smax = kir_param(B->k, "scale_max", KIR_PARAM_SCALAR, KIR_F32, false);
        if (!B->smax)
            return w16_err_nomem(err, "declaring parameters");
        out->scale_max_param = B->smax->index;
    }
    if (req->sort_k) {
        B->perm = kir_param(B->k, "perm", KIR_PARAM_BUFFER, KIR_I32, false);
        if (!B->perm)
            return w16_err_nomem(err, "declaring parameters");
        out->perm_param = B->perm->index;
    }
    return WNA16_OK;
}

/* The layout's lane (i64) the current copy of the body writes. */
static const kir_expr_t *copy_lane(builder_t *B)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *lane = kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID),
                                          false);
    if (!B->blocked)
        return lane;
    int64_t low = B->copy & ((1 << B->bp) - 1), high = B->copy >> B->bp;
    return w16_ir_add(k, w16_ir_mul(k, lane, ik(B, INT64_C(1) << B->bp)),
                      ik(B, low + (high << (B->bp + B->bv))));
}

/* flat = group * lanes + lane; return when past `total`. */
static const kir_expr_t *lane_index(builder_t *B, int64_t total)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *flat = bind_let(B, "flat", w16_ir_add(k,
        w16_ir_mul(k, kir_builtin(k, KIR_OP_GROUP_ID), ik(B, k->lanes)),
        kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID), false)));
    kir_stmt_t *s = kir_if(k, B->body, kir_bin(k, KIR_OP_SLE, ik(B, total), flat));
    if (!s || !kir_return(k, &s->body))
        return bfail(B, "out of memory");
    B->out->num_groups = (total + k->lanes - 1) / k->lanes;
    return flat;
}

static wna16_status_t finish(builder_t *B, wna16_error_t *err)
{
    if (B->fail)
        return w16_err(err, WNA16_EUNSUPPORTED, "cannot generate %s: %s",
                       B->k ? B->k->name : "a repack kernel", B->fail);
    return kir_verify(B->k, err);
}

/* Storage index (in words) of the lane: fills B->idx and returns the flat
 * word index the lane stores to. */
/* Lanes down the columns instead: a workgroup is TA consecutive rows
 * (dimension n-2) of one column (dimension n-1) of the word grid. */
static const kir_expr_t *map_columns(builder_t *B, const int64_t *S, int n,
                                     int64_t TA)
{
    kir_kernel_t *k = B->k;
    int64_t cols = S[n - 1], rows = S[n - 2] / TA, total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    k->lanes = (int)TA;
    B->out->num_groups = total / TA;
    B->L.num_groups = B->out->num_groups;
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    const kir_expr_t *lane = copy_lane(B);
    w16_range_t rg = {0, B->out->num_groups - 1};
    const kir_expr_t *col = w16_ir_floormod(&B->L, g, cols, rg);
    const kir_expr_t *gr = w16_ir_floordiv(&B->L, g, cols, rg);
    w16_range_t rr = {0, rg.hi / cols};
    const kir_expr_t *band = w16_ir_floormod(&B->L, gr, rows, rr);
    const kir_expr_t *q = w16_ir_floordiv(&B->L, gr, rows, rr);
    w16_range_t rq = {0, rr.hi / rows};
    char name[8];
    snprintf(name, sizeof name, "i%d", n - 1);
    B->idx[n - 1] = bind_let(B, name, col);
    snprintf(name, sizeof name, "i%d", n - 2);
    B->idx[n - 2] = bind_let(B, name, w16_ir_add(k, w16_ir_mul(k, band, ik(B, TA)), lane));
    int64_t stride = 1;
    for (int d = n - 3; d >= 0; d--) {
        snprintf(name, sizeof name, "i%d", d);
        B->idx[d] = bind_let(B, name, w16_ir_floormod(&B->L,
            w16_ir_floordiv(&B->L, q, stride, rq), S[d], (w16_range_t){0, rq.hi / stride}));
        stride *= S[d];
    }
    /* (q * S[n-2] + i(n-2)) * S[n-1] + i(n-1) */
    return w16_ir_add(k, w16_ir_mul(k, w16_ir_add(k, w16_ir_mul(k, q, ik(B, S[n - 2])),
                                                  B->idx[n - 2]),
                                    ik(B, S[n - 1])),
                      B->idx[n - 1]);
}

/* The source element (flat, within its tensor *tensor) that slot 0 of the
 * word at grid index w reads; -1 where the probe does not apply (padding,
 * act-order, padded layouts). Numeric, through the specs' own maps: only
 * the choice of lane direction depends on it. */
static int64_t probe_slot(builder_t *B, const int64_t *w, int n, int elem,
                          int slot, int64_t *tensor)
{
    const w16_layout_t *dl = &B->dl;
    const w16_repack_request_t *r = B->req;
    w16_role_t role = dl->role == W16_ROLE_WEIGHT ? W16_ROLE_QWEIGHT : dl->role;
    if (B->perm || !B->table[role] || B->dv[W16_VAR_IP] != r->problem.I ||
        B->sv[W16_VAR_IP] != r->problem.I)
        return -1;
    int64_t idx[W16_MAX_STORE_DIMS], vars[W16_VAR_COUNT], c[W16_MAX_COORDS];
    int64_t ext[W16_MAX_COORDS];
    for (int d = 0; d < n; d++)
        idx[d] = w[d] * (d == n - 1 ? B->wide : 1) + (d == n - 1 ? elem : 0);
    memcpy(vars, B->dv, sizeof vars);
    w16_eval_error_t e;
    if (!w16_layout_coord(dl, vars, idx, slot, c, &e))
        return -1;
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(dl->role, cv);
    w16_role_extent(dl->role, B->dv, ext);
    *tensor = 0;
    for (int i = 0; i < nc; i++) {
        if (c[i] < 0 || c[i] >= ext[i])
            return -1;
        if (cv[i] == W16_VAR_e && !r->src->stacked) { /* a tensor per expert */
            *tensor = c[i] * 2;
            c[i] = 0;
        }
    }
    for (int i = 0; i < nc; i++)
        if (cv[i] == W16_VAR_n && !r->src->stacked && r->gemm == WNA16_GEMM_W13 &&
            c[i] >= r->problem.I) { /* the up projection's tensor */
            *tensor += 1;
            c[i] -= r->problem.I;
        }
    int64_t index[W16_MAX_STORE_DIMS], bit, flat = 0;
    memcpy(vars, B->sv, sizeof vars);
    if (!w16_layout_locate(&B->sl[role], vars, c, index, &bit, &e))
        return -1;
    for (int d = 0; d < B->sl[role].ndim; d++)
        flat = flat * B->sshape[role][d] + index[d];
    return flat;
}

static int64_t probe_source(builder_t *B, const int64_t *w, int n,
                            int64_t *tensor)
{
    return probe_slot(B, w, n, 0, 0, tensor);
}

/* Whether the lanes should run down the columns of the destination: when
 * along a row its words come from source elements a multiple of 4 KiB
 * apart (the source rows of a transpose: every lane's load would fall in
 * the same cache set) while down a column they come from neighbouring
 * elements, and the destination rows are not themselves 4 KiB-aligned. */
static bool lanes_down_columns(builder_t *B, const int64_t *S, int n)
{
    if (n < 2 || S[n - 1] < 32 || S[n - 2] < 16)
        return false;
    w16_role_t role = B->dl.role == W16_ROLE_WEIGHT ? W16_ROLE_QWEIGHT : B->dl.role;
    int64_t w[W16_MAX_STORE_DIMS] = {0}, t0, t1, t2;
    int64_t base = probe_source(B, w, n, &t0);
    w[n - 1] = 16;
    int64_t across = probe_source(B, w, n, &t1);
    w[n - 1] = 0;
    w[n - 2] = 1;
    int64_t down = probe_source(B, w, n, &t2);
    if (base < 0 || across < 0 || down < 0 || t0 != t1 || t0 != t2)
        return false;
    int64_t esz = (int64_t)wna16_dtype_size(B->req->src_dtype[role]);
    int64_t along = (across - base) * esz / 16, step = (down - base) * esz;
    int64_t row = S[n - 1] * (int64_t)wna16_dtype_size(B->req->dst_dtype) * B->wide;
    along = along < 0 ? -along : along;
    step = step < 0 ? -step : step;
    return along >= 4096 && along % 4096 == 0 && step < 64 && row % 4096 != 0;
}

/* The tiling of the word grid S into workgroups of at most max_lanes
 * words (see "lanes and words"): t consecutive values of dimension *j
 * times all dimensions after it. Returns the words per workgroup. */
static int64_t pick_tiling(const int64_t *S, int n, int max_lanes, int *jout,
                           int64_t *tout)
{
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    int best_j = -1;
    int64_t best_t = 0, best_l = 0, inner = 1;
    for (int j = n - 1; j >= 0 && inner <= max_lanes && total > 0; j--) {
        /* a power of two if one is large enough: layouts tile by powers of
         * two, so workgroups then fall on their tile and padding
         * boundaries, and the lane's part of an index is bit operations */
        int64_t t = max_lanes / inner;
        while (t > 1 && (S[j] % t || (t & (t - 1))))
            t--;
        if (t * inner < MIN_LANES) {
            t = max_lanes / inner;
            while (t > 1 && S[j] % t)
                t--;
        }
        if (t * inner > best_l) {
            best_j = j;
            best_t = t;
            best_l = t * inner;
        }
        if (best_l >= max_lanes / 2)
            break;
        inner *= S[j];
    }
    *jout = best_j;
    *tout = best_t;
    return best_l;
}

static const kir_expr_t *map_lanes(builder_t *B, const int64_t *S, int n,
                                   int max_lanes)
{
    kir_kernel_t *k = B->k;
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    /* Only where the lanes are a vector loop (the CPU): on a GPU a warp
     * down a column stores 32 words a row apart, and the H200 measured
     * that slower than loads a row apart (bench/RESULTS.md, GPU repack:
     * w2 18% of a copy with columns, w13 30% along rows). */
    if (total > 0 && !B->blocked && B->req->word_blocks &&
        lanes_down_columns(B, S, n)) {
        int64_t ta = max_lanes;
        while (ta > 1 && (S[n - 2] % ta || (ta & (ta - 1))))
            ta--;
        if (ta >= MIN_LANES)
            return map_columns(B, S, n, ta);
    }
    int best_j;
    int64_t best_t, best_l = pick_tiling(S, n, max_lanes, &best_j, &best_t);
    if (B->blocked && best_l != max_lanes)
        return bfail(B, "word blocks do not tile the destination");
    if (best_l < MIN_LANES && !B->blocked) {
        /* flat index with a bounds check; unflatten per lane */
        k->lanes = max_lanes;
        const kir_expr_t *flat = lane_index(B, total);
        int64_t stride = 1;
        for (int d = n - 1; d >= 0; d--) {
            w16_range_t rf = {0, total - 1};
            const kir_expr_t *q = w16_ir_floordiv(&B->L, flat, stride, rf);
            w16_range_t rq = {0, (total - 1) / stride};
            char name[8];
            snprintf(name, sizeof name, "i%d", d);
            B->idx[d] = bind_let(B, name, w16_ir_floormod(&B->L, q, S[d], rq));
            stride *= S[d];
        }
        return flat;
    }
    k->lanes = (int)(best_l / B->unroll);
    B->out->num_groups = total / best_l;
    B->L.num_groups = B->out->num_groups;
    int j = best_j;
    int64_t per_row = S[j] / best_t, P = best_l / best_t;
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    const kir_expr_t *lane = copy_lane(B);
    w16_range_t rg = {0, B->out->num_groups - 1}, rl = {0, best_l - 1};
    char name[8];
    /* dimensions after j: from the lane alone */
    int64_t stride = 1;
    for (int d = n - 1; d > j; d--) {
        const kir_expr_t *q = w16_ir_floordiv(&B->L, lane, stride, rl);
        snprintf(name, sizeof name, "i%d", d);
        B->idx[d] = bind_let(B, name, w16_ir_floormod(&B->L, q, S[d],
                                                      (w16_range_t){0, (best_l - 1) / stride}));
        stride *= S[d];
    }
    /* dimension j: the group's rows and the lane's */
    const kir_expr_t *row = w16_ir_mul(k, w16_ir_floormod(&B->L, g, per_row, rg),
                                       ik(B, best_t));
    snprintf(name, sizeof name, "i%d", j);
    B->idx[j] = bind_let(B, name, w16_ir_add(k, row,
                                             w16_ir_floordiv(&B->L, lane, P, rl)));
    /* dimensions before j: from the group alone */
    const kir_expr_t *q = w16_ir_floordiv(&B->L, g, per_row, rg);
    w16_rp_unflatten(B, q, (w16_range_t){0, (B->out->num_groups - 1) / per_row},
                     S, j);
    return w16_ir_add(k, w16_ir_mul(k, g, ik(B, best_l)), lane);
}

/* ---- word blocks -----------------------------------------------------------
 *
 * On a vector CPU the loop over a workgroup's lanes is vectorized: the
 * lanes of a vector read the source where the layout puts their words'
 * codes. Where that is not a contiguous run (Marlin's 16x64 tiles, the CPU
 * backend's VNNI blocks) every lane's load is a scalar load plus an insert
 * (a gather), which is most of the kernel's time. A kernel lane can instead
 * write a block of words: the words of the layout's lanes whose index
 * differs in chosen bits (the copies, unrolled in the body, each with the
 * lane's index as constants plus the kernel's lane), so that
 *
 *   - along the kernel's lanes (the remaining bits) every code position's
 *     source element moves by 1: one vector load per position and copy,
 *     the copies' stores interleaved by the vectorizer, or
 *   - the copies read the same source words (bits that move no source
 *     element): one load serves them all.
 *
 * The bits come from probes through the specs' maps (numeric: how each
 * bit of the word index moves the source element of every code position),
 * not from the layout's name; the kernel computes the same words either
 * way (each copy is the unchanged gather of its word), so the choice only
 * decides speed. GPUs keep one word per lane (request.word_blocks). */
enum { BLOCK_MAX_COPIES = 16, BLOCK_PROBE_BITS = 8 };

/* The source element of code position q (element q / slots, slot q %
 * slots) of the word at flat word index f; false where the probe does not
 * apply. */
static bool probe_flat(builder_t *B, const int64_t *S, int n, int64_t f,
                       int q, int slots, int64_t *src, int64_t *tensor)
{
    int64_t w[W16_MAX_STORE_DIMS];
    for (int d = n - 1; d >= 0; d--) {
        w[d] = f % S[d];
        f /= S[d];
    }
    *src = probe_slot(B, w, n, q / slots, q % slots, tensor);
    return *src >= 0;
}

/* How far the source element of every code position moves when bit b of
 * the flat word index f0 (clear in f0) is set: the common move in
 * elements, or INT64_MIN where the positions move differently, the tensor
 * changes or a probe does not apply. base[q], tbase[q]: the probes at f0
 * (base[q] < 0: none). */
static int64_t bit_move(builder_t *B, const int64_t *S, int n, int64_t f0,
                        int b, int np, int slots, const int64_t *base,
                        const int64_t *tbase)
{
    int64_t move = INT64_MIN;
    for (int q = 0; q < np; q++) {
        int64_t c, tc;
        if (base[q] < 0 ||
            !probe_flat(B, S, n, f0 + (INT64_C(1) << b), q, slots, &c, &tc) ||
            tbase[q] != tc || (q > 0 && c - base[q] != move))
            return INT64_MIN;
        move = c - base[q];
    }
    return move;
}

/* Chooses the word blocks (sets B->blocked, bp, bv, unroll and returns the
 * words per workgroup), or leaves one word per lane (returns max_lanes). */
static int plan_blocks(builder_t *B, const int64_t *S, int n, int np,
                       int slots, int max_lanes)
{
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    if (!B->req->word_blocks || B->perm || total <= 0 ||
        lanes_down_columns(B, S, n))
        return max_lanes;
    /* a workgroup has at most 2^nb words, within the default tiling */
    int nb = 0, j;
    int64_t t, tile = pick_tiling(S, n, max_lanes, &j, &t);
    while (nb < BLOCK_PROBE_BITS && tile % (INT64_C(2) << nb) == 0)
        nb++;
    /* each bit's move, the same at the start and in the middle */
    int64_t mv[BLOCK_PROBE_BITS], f[2] = {0, total / 2 >> nb << nb};
    int64_t base[2][64], tbase[2][64];
    if (np > 64)
        return max_lanes;
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < np; q++)
            if (!probe_flat(B, S, n, f[i], q, slots, &base[i][q], &tbase[i][q]))
                return max_lanes;
    for (int b = 0; b < nb; b++) {
        int64_t m0 = bit_move(B, S, n, f[0], b, np, slots, base[0], tbase[0]);
        mv[b] = m0 != INT64_MIN &&
                        m0 == bit_move(B, S, n, f[1], b, np, slots, base[1], tbase[1])
                    ? m0 : INT64_MIN;
    }
    /* the longest run of bits that move every source element by 1, 2, 4 ... */
    int bp = 0, bv = 0, above = 0;
    for (int p = 0; p < nb; p++) {
        int v = 0;
        while (v < 4 && p + v < nb && mv[p + v] == INT64_C(1) << v)
            v++;
        if (v > bv) {
            bp = p;
            bv = v;
        }
    }
    if (bp == 0 && bv == 4)
        return max_lanes; /* the lanes' loads are consecutive already */
    if (bv >= 3) {
        /* the kernel's lanes are the run; the bits below it are copies,
         * and a few above it (fewer, larger workgroups) */
        if ((1 << bp) > BLOCK_MAX_COPIES)
            return max_lanes;
        while ((1 << (bp + above)) < 4 && bp + bv + above < nb)
            above++;
    } else {
        /* no run: copies over the low bits that move no source element,
         * and still a vector's worth of lanes */
        bp = 0;
        while (bp < nb && mv[bp] == 0 && (2 << bp) <= BLOCK_MAX_COPIES)
            bp++;
        bv = nb - bp;
        if (bp == 0 || bv < 3)
            return max_lanes;
    }
    int words = 1 << (bp + bv + above);
    if (pick_tiling(S, n, words, &j, &t) != words)
        return max_lanes;
    B->blocked = true;
    B->bp = bp;
    B->bv = bv;
    B->unroll = 1 << (bp + above);
    return words;
}

static void store_at(builder_t *B, const kir_expr_t *acc, const kir_expr_t *flat);

/* Blocks of at most this many codes are summed unrolled. */
enum { MAX_UNROLLED_SUM = 256 };

/* q of the code at (e, n, k) (block sums). */
static const kir_expr_t *block_code(builder_t *B, const kir_expr_t *e,
                                    const kir_expr_t *n, const kir_expr_t *kval)
{
    lcoord_t at = {.n = 3};
    at.c[0] = e; at.ext[0] = B->dv[W16_VAR_E];
    at.c[1] = n; at.ext[1] = B->dv[W16_VAR_N];
    at.c[2] = kval; at.ext[2] = B->dv[W16_VAR_K];
    return src_value(B, W16_ROLE_QWEIGHT, &at);
}

/* z of the code at (e, n, k) (block sums). */
static const kir_expr_t *block_zero(builder_t *B, const kir_expr_t *e,
                                    const kir_expr_t *n, const kir_expr_t *kval)
{
    const w16_repack_request_t *req = B->req;
    int64_t E = B->dv[W16_VAR_E], N = B->dv[W16_VAR_N], K = B->dv[W16_VAR_K];
    if (!req->problem.zp)
        return ik(B, INT64_C(1) << (req->problem.BITS - 1));
    int64_t gse = req->problem.GS > 0 ? req->problem.GS : K;
    lcoord_t g = {.n = 3};
    g.c[0] = e; g.ext[0] = E;
    g.c[1] = w16_ir_floordiv(&B->L, kval, gse, (w16_range_t){0, K - 1});
    g.ext[1] = K / gse;
    g.c[2] = n; g.ext[2] = N;
    return src_value(B, W16_ROLE_QZEROS, &g);
}

/* q - z of the code at (e, n, k) (block sums). */
static const kir_expr_t *block_term(builder_t *B, const kir_expr_t *e,
                                    const kir_expr_t *n, const kir_expr_t *kval)
{
    const kir_expr_t *q = block_code(B, e, n, kval);
    const kir_expr_t *z = q ? block_zero(B, e, n, kval) : NULL;
    return q && z ? kir_bin(B->k, KIR_OP_SUB, q, z) : NULL;
}

static bool same_expr(const kir_expr_t *a, const kir_expr_t *b);

/* The loaded source element a code expression extracts its bits from, and
 * the bit it starts at: q = and(lshr(zext(X), bit), mask) or and(zext(X),
 * mask), as src_value_raw builds it. NULL where q has another form. */
static const kir_expr_t *code_field(const kir_expr_t *q, int64_t mask,
                                    int64_t *bit)
{
    if (!q || q->op != KIR_OP_AND || q->b->op != KIR_OP_CONST || q->b->ival != mask)
        return NULL;
    const kir_expr_t *x = q->a;
    *bit = 0;
    if (x->op == KIR_OP_LSHR) {
        if (x->b->op != KIR_OP_CONST)
            return NULL;
        *bit = x->b->ival;
        x = x->a;
    }
    return x->op == KIR_OP_ZEXT && x->a->op == KIR_OP_TLOAD ? x->a : NULL;
}

/* The sum of the block's codes q, bk codes from k0 = kb * bk, a whole
 * source element at a time: where the layout puts each run of `per`
 * codes (per * code bits = the element's bits) in the fields of one
 * element, checked on the lowered loads (the same element expression for
 * every code of a run, each field once), the run's sum is the sum of the
 * element's fields, added in place (SWAR): fields of f bits are paired into
 * fields of 2f bits, and elements are added together while their fields
 * cannot overflow. For 4-bit codes in 32-bit words that is about 6
 * operations per word instead of 23 per word when summed code by code: a
 * quarter of the instructions LLVM optimizes and selects (the compile
 * time, bench/RESULTS.md). NULL (nothing emitted) where the layout does
 * not qualify. */
static const kir_expr_t *block_sum_words(builder_t *B, const kir_expr_t *e,
                                         const kir_expr_t *n, const kir_expr_t *kb,
                                         int64_t bk)
{
    kir_kernel_t *k = B->k;
    const w16_layout_t *l = &B->sl[W16_ROLE_QWEIGHT];
    int cb = w16_layout_code_bits(l, B->req->src_dtype[W16_ROLE_QWEIGHT], B->sv);
    int wb = (int)wna16_dtype_size(B->req->src_dtype[W16_ROLE_QWEIGHT]) * 8;
    if (l->decode || B->perm || cb <= 0 || wb > 32 || wb % cb || wb / cb < 2 ||
        (wb / cb & (wb / cb - 1)) || bk % (wb / cb) || bk / (wb / cb) > MAX_UNROLLED_SUM ||
        bk * ((INT64_C(1) << cb) - 1) > INT32_MAX)
        return NULL;
    int per = wb / cb, nw = (int)(bk / per);
    int64_t mask = (INT64_C(1) << cb) - 1;
    const kir_expr_t *word[MAX_UNROLLED_SUM];
    const kir_expr_t *k0 = w16_ir_mul(k, kb, ik(B, bk));
    for (int j = 0; j < nw; j++) {
        uint64_t seen = 0;
        for (int i = 0; i < per; i++) {
            int64_t bit = -1;
            const kir_expr_t *x = code_field(
                block_code(B, e, n, w16_ir_add(k, k0, ik(B, (int64_t)j * per + i))),
                mask, &bit);
            if (!x || bit < 0 || bit >= wb || bit % cb ||
                (seen >> (bit / cb) & 1) || (i && !same_expr(x, word[j])))
                return NULL;
            seen |= UINT64_C(1) << (bit / cb);
            word[j] = x;
        }
    }
    /* in 32 bits: the last field grows into the zero bits above a
     * narrower element */
    kir_type_t t = KIR_I32;
    for (int j = 0; j < nw; j++)
        word[j] = kir_int_cast(k, t, word[j], false);
    int64_t top = mask; /* the largest value a field holds */
    for (int f = cb; f < wb; f *= 2) {
        int64_t m = 0; /* the low f bits of every 2f */
        for (int b = 0; b < wb; b += 2 * f)
            m |= ((INT64_C(1) << f) - 1) << b;
        const kir_expr_t *mk = kir_const(k, t, m), *sh = kir_const(k, t, f);
        for (int j = 0; j < nw; j++) {
            const kir_expr_t *w = bind_let(B, "word", word[j]);
            word[j] = kir_bin(k, KIR_OP_ADD, kir_bin(k, KIR_OP_AND, w, mk),
                              kir_bin(k, KIR_OP_AND, kir_bin(k, KIR_OP_LSHR, w, sh), mk));
        }
        top *= 2;
        /* elements added while a field of 2f bits cannot overflow (the
         * last field has the 32 bits) */
        int64_t fits = 2 * f >= wb ? nw : ((INT64_C(1) << (2 * f)) - 1) / top;
        int m2 = 0;
        for (int j = 0; j < nw; j += (int)fits) {
            const kir_expr_t *s = word[j];
            for (int i = j + 1; i < nw && i < j + fits; i++)
                s = kir_bin(k, KIR_OP_ADD, s, word[i]);
            word[m2++] = s;
        }
        top *= nw < fits ? nw : fits;
        nw = m2;
    }
    return B->fail ? NULL : kir_int_cast(k, KIR_I64, word[0], false);
}

/* The sum of (q - z) over block kb (bk codes) of column n of expert e:
 * unrolled up to MAX_UNROLLED_SUM codes (a lane body without loops
 * vectorizes; the codes of one source word share its load), else a loop.
 * Where the block lies in one group (z is the same for every code) it is
 * the sum of q, a word at a time where the layout allows it
 * (block_sum_words), minus bk * z. `tag` keeps the loop's variables
 * apart. */
static const kir_expr_t *block_sum(builder_t *B, const kir_expr_t *e,
                                   const kir_expr_t *n, const kir_expr_t *kb,
                                   int64_t bk, int tag)
{
    kir_kernel_t *k = B->k;
    int64_t gse = B->req->problem.GS > 0 ? B->req->problem.GS : B->dv[W16_VAR_K];
    bool one_z = !B->req->problem.zp || gse % bk == 0;
    if (bk <= MAX_UNROLLED_SUM) {
        const kir_expr_t *k0 = w16_ir_mul(k, kb, ik(B, bk));
        const kir_expr_t *z = NULL, *q = NULL;
        if (one_z && !(z = block_zero(B, e, n, k0)))
            return NULL;
        if (one_z && z->op != KIR_OP_CONST)
            z = bind_let(B, "zero", z);
        if (one_z && (q = block_sum_words(B, e, n, kb, bk)))
            return kir_bin(k, KIR_OP_SUB, q, w16_ir_mul(k, z, ik(B, bk)));
        const kir_expr_t *terms[MAX_UNROLLED_SUM];
        for (int64_t t = 0; t < bk && !B->fail; t++) {
            const kir_expr_t *kv = w16_ir_add(k, k0, ik(B, t));
            terms[t] = one_z ? block_code(B, e, n, kv) : block_term(B, e, n, kv);
        }
        for (int64_t m = bk; m > 1 && !B->fail;) {
            int64_t h = m / 2;
            for (int64_t i = 0; i < h; i++) {
                terms[i] = w16_ir_add(k, terms[2 * i], terms[2 * i + 1]);
                if (m <= 16) /* the last levels get names */
                    terms[i] = bind_let(B, "sum", terms[i]);
            }
            if (m % 2)
                terms[h] = terms[m - 1];
            m = h + m % 2;
        }
        if (B->fail)
            return NULL;
        return one_z ? kir_bin(k, KIR_OP_SUB, terms[0], w16_ir_mul(k, z, ik(B, bk)))
                     : terms[0];
    }
    /* a loop over the block */
    char sn[16], kn[16];
    snprintf(sn, sizeof sn, "sum%d", tag);
    snprintf(kn, sizeof kn, "kk%d", tag);
    const kir_var_t *acc = kir_var(k, sn, KIR_I64);
    const kir_var_t *kk = kir_var(k, kn, KIR_I64);
    if (!acc || !kk || !kir_let(k, B->body, acc, ik(B, 0)))
        return bfail(B, "out of memory");
    kir_stmt_t *loop = kir_for(k, B->body, kk, ik(B, 0), ik(B, bk), 1);
    if (!loop)
        return bfail(B, "out of memory");
    kir_block_t *outer = B->body;
    B->body = &loop->body;
    const kir_expr_t *kval = bind_let(B, "k", w16_ir_add(k,
        w16_ir_mul(k, kb, ik(B, bk)), kir_ref(k, kk)));
    const kir_expr_t *term = block_term(B, e, n, kval);
    if (!term || !kir_assign(k, B->body, acc, w16_ir_add(k, kir_ref(k, acc), term)))
        bfail(B, "out of memory");
    B->body = outer;
    return B->fail ? NULL : kir_ref(k, acc);
}

/* Gathers every slot of the lane's word and stores it (flat NULL: only
 * returns it, let-bound). valid: each slot's validity, or NULL when every
 * slot is known to hold a value. */
static const kir_expr_t *store_word(builder_t *B, const lcoord_t *at,
                                    const kir_expr_t *const *valid, int np,
                                    int slots, int cb, const kir_expr_t *flat)
{
    kir_kernel_t *k = B->k;
    int eb = (int)wna16_dtype_size(B->req->dst_dtype) * 8;
    const kir_expr_t *acc = ik(B, 0), *yes = kir_const(k, KIR_I1, 1);
    for (int p = 0; p < np && !B->fail; p++) {
        B->pos = p;
        const kir_expr_t *v = slot_bits(B, valid ? valid[p] : yes, at[p]);
        if (!v)
            break;
        if (cb < 64)
            v = kir_bin(k, KIR_OP_AND, v, ik(B, (INT64_C(1) << cb) - 1));
        int shift = (p / slots) * eb + (p % slots) * cb;
        if (shift)
            v = kir_bin(k, KIR_OP_SHL, v, ik(B, shift));
        acc = p ? kir_bin(k, KIR_OP_OR, acc, v) : v;
        char name[16];
        snprintf(name, sizeof name, "acc%d", p);
        acc = bind_let(B, name, acc);
    }
    if (flat)
        store_at(B, acc, flat);
    return acc;
}

/* The words of a lane's T copies; on a GPU's direct plans every copy's
 * loads come before the first store (`late`: the compiler keeps a load
 * after a store it cannot prove apart, and a lane's words are there to
 * have their loads in flight together). */
static void store_words(builder_t *B, const lcoord_t *at,
                        const kir_expr_t *const *valid, int np, int slots,
                        int cb, const kir_expr_t *const *flat, int T)
{
    bool late = w16_rp_tile_loads_first(B);
    const kir_expr_t **acc = w16_arena_alloc(&B->k->arena, sizeof *acc * (size_t)T);
    if (!acc) {
        bfail(B, "out of memory");
        return;
    }
    for (int t = 0; t < T && !B->fail; t++)
        acc[t] = store_word(B, at + t * np, valid ? valid + t * np : NULL, np,
                            slots, cb, late ? NULL : flat[t]);
    for (int t = 0; t < T && late && !B->fail; t++)
        store_at(B, acc[t], flat[t]);
}

/* Stores the word acc (i64) at the flat word index of the lane. */
static void store_at(builder_t *B, const kir_expr_t *acc, const kir_expr_t *flat)
{
    kir_kernel_t *k = B->k;
    /* the word in 32-bit arithmetic where it has at most 32 bits */
    if (kir_type_bits(B->dst->type) <= 32)
        acc = w16_ir_narrow32(&B->L, acc);
    /* the group's part and the lane's part of the index apart, each in 32
     * bits where it fits: the emitters address the sum as (dst + group's)
     * + lane's, which the CPU's vectorizer sees as consecutive in the lane */
    const kir_expr_t *ix = flat->op == KIR_OP_ADD
        ? kir_bin(k, KIR_OP_ADD, w16_ir_index32(&B->L, flat->a),
                  w16_ir_index32(&B->L, flat->b))
        : w16_ir_index32(&B->L, flat);
    if (!B->fail && !kir_store(k, B->body, B->dst, ix,
                               kir_int_cast(k, B->dst->type, acc, false)))
        bfail(B, "ill-typed store");
}

/* ---- sums in the codes' pass ---------------------------------------------
 *
 * A layout with block sums (the CPU's VNNI compensation) used to be
 * written by two kernels: the codes, then the sums, which read the whole
 * source a second time (a third of the layer's time). Where the layout
 * gives the sums' inverse map (sums.coord) and every workgroup's words are
 * either all sums or none (the test is the lowered condition not reading
 * the lane, the same for every copy), the codes kernel writes the sums
 * too: a group of sums reads the source of its block, which the groups of
 * codes before it have just read (hot in cache). The VNNI rows of 17 x 32
 * words give whole workgroups of sums on the CPU (8 lanes x 4 copies) and
 * the GPU (32 threads) alike; where a layout's workgroups mix the two, the
 * runtime runs the separate sums kernel. The sums are the separate
 * kernel's (block_sum), byte for byte. */

bool w16_rp_same_node(const kir_expr_t *a, const kir_expr_t *b)
{
    return a->op == b->op && a->type == b->type && a->ival == b->ival &&
           !memcmp(&a->fval, &b->fval, sizeof a->fval) && a->var == b->var &&
           a->param == b->param && a->shared == b->shared &&
           a->ctable == b->ctable;
}

/* Structural equality of two IR expressions. */
static bool same_expr(const kir_expr_t *a, const kir_expr_t *b)
{
    if (a == b)
        return true;
    if (!a || !b || !w16_rp_same_node(a, b))
        return false;
    return same_expr(a->a, b->a) && same_expr(a->b, b->b) && same_expr(a->c, b->c);
}

/* Whether the layout's sums can be written by the codes kernel: words of 4
 * bytes, each sum starting at a word (its index aligned to 4). */
static bool sums_fusable(builder_t *B)
{
    const w16_layout_t *l = &B->dl;
    if (B->req->role != W16_ROLE_QWEIGHT || !l->sums_block_k ||
        !l->sums_coord[0] || wna16_dtype_size(B->req->dst_dtype) != 1 ||
        B->wide != 4)
        return false;
    int64_t bk = 0;
    if (!w16_expr_eval(l->sums_block_k, B->dv, &bk, NULL) || bk <= 0 ||
        B->dv[W16_VAR_K] % bk)
        return false;
    /* the last index of a sum, for any e, n and g: a multiple of 4? */
    const kir_expr_t *any = kir_int_cast(B->k, KIR_I64,
                                         kir_builtin(B->k, KIR_OP_GROUP_ID), false);
    w16_lower_clear_vars(&B->L);
    w16_lower_bind(&B->L, W16_VAR_e, any, 0, B->dv[W16_VAR_E] - 1);
    w16_lower_bind(&B->L, W16_VAR_n, any, 0, B->dv[W16_VAR_N] - 1);
    w16_lower_bind(&B->L, W16_VAR_g, any, 0, B->dv[W16_VAR_K] / bk - 1);
    const kir_expr_t *last = lower(B, l->sums_index[l->ndim - 1], NULL);
    if (!last || w16_ir_facts(&B->L, last).align % 4)
        return false;
    return true;
}

/* The sum's coordinates (e, n, g) of the word at storage index B->idx
 * (last dimension in words) and the i1 "a sum starts there". */
static const kir_expr_t *sum_slot(builder_t *B, const kir_expr_t *c[3])
{
    kir_kernel_t *k = B->k;
    const w16_layout_t *l = &B->dl;
    int nd = l->ndim;
    w16_lower_clear_vars(&B->L);
    for (int d = 0; d < nd; d++) {
        const kir_expr_t *ix = d < nd - 1 ? B->idx[d]
                                          : w16_ir_mul(k, B->idx[d], ik(B, B->wide));
        w16_lower_bind(&B->L, (w16_var_t)(W16_VAR_i0 + d), ix, 0,
                       B->out->shape[d] - 1);
    }
    int64_t bk = 0;
    w16_expr_eval(l->sums_block_k, B->dv, &bk, NULL); /* sums_fusable */
    int64_t ext[3] = {B->dv[W16_VAR_E], B->dv[W16_VAR_N], B->dv[W16_VAR_K] / bk};
    const kir_expr_t *valid = kir_const(k, KIR_I1, 1);
    for (int i = 0; i < 3 && valid; i++) {
        w16_range_t rc;
        const kir_expr_t *v = lower(B, l->sums_coord[i], &rc);
        if (!v)
            return NULL;
        valid = w16_ir_and1(k, valid, w16_ir_in_range(&B->L, v, rc, 0, ext[i]));
        c[i] = w16_ir_assume_in_range(&B->L, v, 0, ext[i]);
    }
    return valid;
}

wna16_status_t w16_build_repack(wna16_context_t *ctx,
                                const w16_repack_request_t *req,
                                w16_repack_kernel_t *out, wna16_error_t *err)
{
    builder_t B;
    wna16_status_t st = setup(&B, ctx, req, out, false, err);
    if (st != WNA16_OK) {
        w16_repack_kernel_free(out);
        return st;
    }
    kir_kernel_t *k = B.k;
    int n = out->ndim;
    int wide = B.wide;
    int64_t S[W16_MAX_STORE_DIMS] = {0};
    for (int d = 0; d < n; d++)
        S[d] = out->shape[d] / (d == n - 1 ? wide : 1);
    int cb = w16_layout_code_bits(&B.dl, req->dst_dtype, B.dv);
    int slots = w16_layout_slots(&B.dl, req->dst_dtype, B.dv);
    int np = wide * slots;
    if (np > 64)
        bfail(&B, "more than 64 code slots in a destination word");
    int max_lanes = plan_blocks(&B, S, n, np, slots,
                                req->lanes > 0 ? req->lanes : 256);
    if (req->staged_tiles && !B.blocked && !B.fail)
        w16_rp_tile_plan(&B, S, n, np, slots, max_lanes);
    int T = B.unroll;
    if (B.blocked) { /* one name, one kernel: blocks are another kernel */
        char name[240];
        snprintf(name, sizeof name, "%s_wb%d", k->name, T);
        if (!(k->name = w16_arena_strdup(&k->arena, name)))
            bfail(&B, "out of memory");
    }
    /* every copy's word, and every slot's coordinates and validity first */
    size_t nat = (size_t)(T * np + 1);
    lcoord_t *at = w16_arena_alloc(&k->arena, sizeof *at * nat);
    const kir_expr_t **valid = w16_arena_alloc(&k->arena, sizeof *valid * nat);
    const kir_expr_t **flat = w16_arena_alloc(&k->arena, sizeof *flat * (size_t)(T + 1));
    const kir_expr_t *all = kir_const(k, KIR_I1, 1);
    if (!at || !valid || !flat)
        bfail(&B, "out of memory");
    bool fuse = sums_fusable(&B);
    const kir_expr_t **scond = w16_arena_alloc(&k->arena, sizeof *scond * (size_t)(T + 1));
    const kir_expr_t *(*sc)[3] = w16_arena_alloc(&k->arena, sizeof *sc * (size_t)(T + 1));
    if (!scond || !sc)
        bfail(&B, "out of memory");
    if (B.tile && !B.fail)
        w16_rp_tile_stage(&B, S, n);
    for (int t = 0; t < T && !B.fail; t++) {
        B.copy = t;
        flat[t] = B.tile ? w16_rp_tile_map(&B, S, n, t)
                         : map_lanes(&B, S, n, max_lanes);
        if (fuse) {
            scond[t] = sum_slot(&B, sc[t]);
            /* one branch per workgroup: the same condition for every copy,
             * free of the lane, and not always false (a GPU's rows branch
             * by lane, and their copies bind the lane's index afresh) */
            bool gpu = w16_rp_tile_lane_branches(&B);
            fuse = scond[t] && (!w16_ir_uses_lane(&B.L, scond[t]) || gpu) &&
                   !(scond[t]->op == KIR_OP_CONST && !scond[t]->ival) &&
                   (t == 0 || same_expr(scond[t], scond[0]) ||
                    (gpu && w16_rp_same_value(&B, scond[t], scond[0])));
        }
        const kir_expr_t *word = B.idx[n - 1];
        for (int p = 0; p < np && !B.fail; p++) {
            int j = p / slots;
            B.idx[n - 1] = wide == 1 ? word
                                     : w16_ir_add(k, w16_ir_mul(k, word, ik(&B, wide)),
                                                  ik(&B, j));
            B.pos = t * np + p;
            valid[t * np + p] = dst_slot(&B, p % slots, &at[t * np + p]);
            all = valid[t * np + p] ? w16_ir_and1(k, all, valid[t * np + p]) : NULL;
            if (!all)
                bfail(&B, "out of memory");
        }
    }
    kir_block_t *top = B.body;
    if (fuse && !B.fail) {
        int64_t bk = 0;
        w16_expr_eval(B.dl.sums_block_k, B.dv, &bk, NULL); /* sums_fusable */
        kir_stmt_t *br = kir_if(k, B.body, bind_let(&B, "sums_here", scond[0]));
        if (!br) {
            bfail(&B, "out of memory");
        } else {
            B.body = &br->body;
            bool late = w16_rp_tile_loads_first(&B); /* see store_words */
            const kir_expr_t **sum = w16_arena_alloc(&k->arena, sizeof *sum * (size_t)T);
            if (!sum)
                bfail(&B, "out of memory");
            for (int t = 0; t < T && !B.fail; t++) {
                sum[t] = block_sum(&B, sc[t][0], sc[t][1], sc[t][2], bk, t);
                if (sum[t] && late)
                    sum[t] = bind_let(&B, "block_sum", sum[t]);
                else if (sum[t])
                    store_at(&B, sum[t], flat[t]);
            }
            for (int t = 0; t < T && late && !B.fail; t++)
                if (sum[t])
                    store_at(&B, sum[t], flat[t]);
            B.body = &br->else_body;
            out->sums_fused = true;
        }
    }
    if (!B.fail && !(all->op == KIR_OP_CONST && all->ival) &&
        (!w16_ir_uses_lane(&B.L, all) || w16_rp_tile_lane_branches(&B))) {
        /* Padding that is the same for every lane of a workgroup (a tail
         * of whole workgroups): a branch the CPU emitter moves out of the
         * loop over lanes, and a body for the words without padding that
         * knows every slot is valid (no clamped coordinates, so the slots
         * of a word share their source words). */
        kir_stmt_t *br = kir_if(k, B.body, bind_let(&B, "all_valid", all));
        if (!br) {
            bfail(&B, "out of memory");
        } else {
            kir_block_t *outer = B.body;
            B.body = &br->body;
            store_words(&B, at, NULL, np, slots, cb, flat, T);
            B.body = &br->else_body;
            store_words(&B, at, valid, np, slots, cb, flat, T);
            B.body = outer;
        }
    } else if (!B.fail) {
        store_words(&B, at, all->op == KIR_OP_CONST ? NULL : valid, np, slots,
                    cb, flat, T);
    }
    B.body = top;
    k->comment = T > 1 ? "repack: a lane gathers a block of destination words"
                       : "repack: one lane per destination word (gather)";
    if (B.tile)
        k->comment = w16_rp_tile_comment(&B);
    if ((st = finish(&B, err)) != WNA16_OK)
        w16_repack_kernel_free(out);
    return st;
}

wna16_status_t w16_build_repack_sums(wna16_context_t *ctx,
                                     const w16_repack_request_t *req,
                                     w16_repack_kernel_t *out,
                                     wna16_error_t *err)
{
    builder_t B;
    wna16_status_t st = setup(&B, ctx, req, out, true, err);
    if (st == WNA16_OK && (req->role != W16_ROLE_QWEIGHT ||
                           !B.dl.sums_block_k || wna16_dtype_size(req->dst_dtype) != 1))
        st = w16_err(err, WNA16_EINVAL, "%s: the qweight layout has no byte "
                     "block sums", req->dst->name);
    int64_t bk = 0;
    if (st == WNA16_OK && (!w16_expr_eval(B.dl.sums_block_k, B.dv, &bk, NULL) ||
                           bk <= 0 || B.dv[W16_VAR_K] % bk))
        st = w16_err(err, WNA16_ESPEC, "%s: sums.block_k does not divide K",
                     req->dst->name);
    if (st != WNA16_OK) {
        w16_repack_kernel_free(out);
        return st;
    }
    kir_kernel_t *k = B.k;
    int64_t E = B.dv[W16_VAR_E], N = B.dv[W16_VAR_N], K = B.dv[W16_VAR_K];
    int64_t KB = K / bk;
    /* lanes run along n: neighbouring lanes read neighbouring source
     * words of one row and write neighbouring sums */
    int64_t S[3] = {E, KB, N};
    map_lanes(&B, S, 3, req->lanes > 0 ? req->lanes : 256);
    const kir_expr_t *e = B.idx[0], *kb = B.idx[1], *n = B.idx[2];
    const kir_expr_t *sum = block_sum(&B, e, n, kb, bk, 0);
    if (!sum)
        bfail(&B, "out of memory");
    /* store the int32 little-endian at the sums index */
    w16_lower_clear_vars(&B.L);
    w16_lower_bind(&B.L, W16_VAR_e, e, 0, E - 1);
    w16_lower_bind(&B.L, W16_VAR_n, n, 0, N - 1);
    w16_lower_bind(&B.L, W16_VAR_g, kb, 0, KB - 1);
    const kir_expr_t *pos = ik(&B, 0);
    for (int d = 0; d < B.dl.ndim && !B.fail; d++) {
        const kir_expr_t *ix = lower(&B, B.dl.sums_index[d], NULL);
        if (!ix)
            break;
        pos = w16_ir_add(k, w16_ir_mul(k, pos, ik(&B, out->shape[d])), ix);
    }
    pos = bind_let(&B, "pos", pos);
    for (int byte = 0; byte < 4 && !B.fail; byte++) {
        const kir_expr_t *v = kir_int_cast(k, KIR_I8, w16_ir_narrow32(&B.L,
            kir_bin(k, KIR_OP_LSHR, sum, ik(&B, 8 * byte))), false);
        if (!kir_store(k, B.body, B.dst,
                       w16_ir_index32(&B.L, w16_ir_add(k, pos, ik(&B, byte))), v))
            bfail(&B, "ill-typed store");
    }
    k->comment = "repack: block sums of (q - z), one lane per (e, block, n)";
    if ((st = finish(&B, err)) != WNA16_OK)
        w16_repack_kernel_free(out);
    return st;
}

void w16_repack_kernel_free(w16_repack_kernel_t *k)
{
    if (k && k->kernel) {
        kir_kernel_free(k->kernel);
        k->kernel = NULL;
    }
}

/* ---- for build_repack_tile.c --------------------------------------------- */

const kir_expr_t *w16_rp_fail(builder_t *B, const char *why) { return bfail(B, why); }

const kir_expr_t *w16_rp_let(builder_t *B, const char *name, const kir_expr_t *e)
{
    return bind_let(B, name, e);
}

void w16_rp_unflatten(builder_t *B, const kir_expr_t *q, w16_range_t rq,
                      const int64_t *S, int j)
{
    int64_t stride = 1;
    for (int d = j - 1; d >= 0; d--) {
        char name[8];
        snprintf(name, sizeof name, "i%d", d);
        B->idx[d] = bind_let(B, name, w16_ir_floormod(&B->L,
            w16_ir_floordiv(&B->L, q, stride, rq), S[d],
            (w16_range_t){0, rq.hi / stride}));
        stride *= S[d];
    }
}

const kir_expr_t *w16_rp_dst_slot(builder_t *B, int slot, lcoord_t *at)
{
    return dst_slot(B, slot, at);
}

void w16_rp_clamp_slot(builder_t *B, const kir_expr_t *valid, lcoord_t *at)
{
    clamp_slot(B, valid, at);
}

const kir_expr_t *w16_rp_src_raw(builder_t *B, w16_role_t role, const lcoord_t *at)
{
    return src_value_raw(B, role, at, true);
}

int64_t w16_rp_probe(builder_t *B, const int64_t *w, int n, int elem, int slot,
                     int64_t *tensor)
{
    return probe_slot(B, w, n, elem, slot, tensor);
}
