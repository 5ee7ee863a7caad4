/*
 * build_repack_elem.c - the repack builder's element maps: what one code
 * slot of a destination word holds and where its value comes from.
 *
 * For the slot of the word at B->idx: the destination's inverse map to
 * logical coordinates with its padding undone (w16_rp_dst_slot), made
 * safe to address (w16_rp_clamp_slot); the source's forward map to a
 * table slot and an element, its load (from memory, or from the staged
 * tile of build_repack_tile.c where that holds it) and the code's
 * extraction (w16_rp_src_value); the conversions (float formats, scale
 * transforms, dequantization) that give the bits the slot contributes
 * (w16_rp_slot_bits). Also the same maps on numbers (w16_rp_probe), by
 * which the other files choose their plans, the storage index's digits
 * (w16_rp_unflatten), equality of IR expressions, and the helpers every
 * part of the builder uses (w16_rp_fail, w16_rp_let, w16_rp_lower). The
 * bottom of the builder: it calls no other build_repack*.c file.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

const kir_expr_t *w16_rp_fail(builder_t *B, const char *why)
{
    if (!B->fail)
        B->fail = why;
    return NULL;
}

const kir_expr_t *w16_rp_lower(builder_t *B, const w16_expr_t *x, w16_range_t *r)
{
    const kir_expr_t *e = w16_lower(&B->L, x, r);
    if (!e)
        w16_rp_fail(B, B->L.failure);
    return e;
}

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }
static const kir_expr_t *i32(builder_t *B, int64_t v) { return kir_const(B->k, KIR_I32, v); }

const kir_expr_t *w16_rp_let(builder_t *B, const char *name, const kir_expr_t *e)
{
    if (!e)
        return NULL;
    const kir_expr_t *r = w16_lower_let(&B->L, B->body, name, e);
    return r ? r : w16_rp_fail(B, "out of memory");
}

/* ---- equality of IR expressions ------------------------------------------ */

bool w16_rp_same_node(const kir_expr_t *a, const kir_expr_t *b)
{
    return a->op == b->op && a->type == b->type && a->ival == b->ival &&
           !memcmp(&a->fval, &b->fval, sizeof a->fval) && a->var == b->var &&
           a->param == b->param && a->shared == b->shared &&
           a->ctable == b->ctable;
}

bool w16_rp_same_expr(const kir_expr_t *a, const kir_expr_t *b)
{
    if (a == b)
        return true;
    if (!a || !b || !w16_rp_same_node(a, b))
        return false;
    return w16_rp_same_expr(a->a, b->a) && w16_rp_same_expr(a->b, b->b) &&
           w16_rp_same_expr(a->c, b->c);
}

/* e seen through let-bound variables (their noted definitions, which
 * never change), so that a value and a variable bound to it compare
 * equal. */
static const kir_expr_t *through_lets(const builder_t *B, const kir_expr_t *e)
{
    for (int guard = 0; e && guard < 64; guard++) {
        const kir_expr_t *v = e;
        if ((v->op == KIR_OP_ZEXT || v->op == KIR_OP_SEXT) && v->type == KIR_I64 &&
            v->a->op == KIR_OP_VAR && v->a->type == KIR_I32)
            v = v->a;
        if (v->op != KIR_OP_VAR || v->var->index >= B->L.n_vfacts ||
            !B->L.vdef[v->var->index])
            return e;
        e = B->L.vdef[v->var->index];
    }
    return e;
}

bool w16_rp_same_value(const builder_t *B, const kir_expr_t *a, const kir_expr_t *b)
{
    a = through_lets(B, a);
    b = through_lets(B, b);
    if (a == b)
        return true;
    if (!a || !b || !w16_rp_same_node(a, b))
        return false;
    return w16_rp_same_value(B, a->a, b->a) && w16_rp_same_value(B, a->b, b->b) &&
           w16_rp_same_value(B, a->c, b->c);
}

/* ---- source loads ----------------------------------------------------------
 *
 * A source element is read from memory, or where build_repack_tile.c has
 * planned a tile (B->tile) as the plan says: from the staged box in shared
 * memory where the box holds the element, once per element and block;
 * while the tile's stage finds the box's corner (capture), the place of
 * the first word's element is recorded instead. */

/* The value read for (slot, flat) in the current block, or NULL. */
static const kir_expr_t *memo_find(const builder_t *B, const kir_expr_t *slot,
                                   const kir_expr_t *flat)
{
    const struct w16_rp_tile *T = B->tile;
    for (int i = 0; i < T->n_memo && i < W16_RP_MEMO_SIZE; i++)
        if (T->memo[i].blk == B->body && w16_rp_same_value(B, T->memo[i].slot, slot) &&
            w16_rp_same_value(B, T->memo[i].flat, flat))
            return T->memo[i].val;
    return NULL;
}

static const kir_expr_t *memo_add(builder_t *B, const kir_expr_t *slot,
                                  const kir_expr_t *flat, const kir_expr_t *val)
{
    struct w16_rp_tile *T = B->tile;
    int m = T->n_memo++ % W16_RP_MEMO_SIZE;
    T->memo[m].blk = B->body;
    T->memo[m].slot = slot;
    T->memo[m].flat = flat;
    T->memo[m].val = val;
    return val;
}

/* The source element of `role` at table slot `slot`, flat index `flat`
 * within its tensor (= row * the last dimension + col): from the staged
 * tile where it holds it, else from memory; on the plan of shared reads
 * one load per element and block. */
static const kir_expr_t *source_load(builder_t *B, w16_role_t role,
                                     const kir_expr_t *slot,
                                     const kir_expr_t *flat,
                                     const kir_expr_t *row,
                                     const kir_expr_t *col)
{
    kir_kernel_t *k = B->k;
    struct w16_rp_tile *T = B->tile;
    const kir_expr_t *mem = kir_tload(k, B->table[role], w16_ir_index32(&B->L, slot),
                                      w16_ir_index32(&B->L, flat));
    if (!T || role != T->role)
        return mem;
    if (T->rows) /* one word per lane: its slots share loads as in the
                  * plain gather (and the block sums see the loads) */
        return mem;
    if (!T->stage) { /* shared reads: one load per element and block */
        const kir_expr_t *val = memo_find(B, slot, flat);
        return val ? val : memo_add(B, slot, flat, w16_rp_let(B, "src_elem", mem));
    }
    if (T->capture) {
        T->cap_slot = slot;
        T->cap_row = row;
        T->cap_col = col;
        return mem;
    }
    /* One read per source element and block: the slots of a word reading
     * the same element share it. The compiler does not merge the loads on
     * its own (each sits behind its own select), and without this a word
     * of eight codes made eight shared and eight fallback loads. */
    const kir_expr_t *seen = memo_find(B, slot, flat);
    if (seen)
        return seen;
    /* in 32 bits, as the corner */
    const kir_expr_t *du = kir_bin(k, KIR_OP_SUB, w16_ir_narrow32(&B->L, row), T->brow);
    const kir_expr_t *dv = kir_bin(k, KIR_OP_SUB, w16_ir_narrow32(&B->L, col), T->bcol);
    const kir_expr_t *ds = kir_bin(k, KIR_OP_SUB, w16_ir_narrow32(&B->L, slot), T->bslot);
    const kir_expr_t *hit = kir_bin(k, KIR_OP_AND,
        kir_bin(k, KIR_OP_ULT, du, i32(B, T->nu)),
        kir_bin(k, KIR_OP_AND, kir_bin(k, KIR_OP_ULT, dv, i32(B, T->nv)),
                kir_bin(k, KIR_OP_ULT, ds, i32(B, T->ns))));
    hit = w16_rp_let(B, "in_tile", hit);
    const kir_expr_t *at = kir_bin(k, KIR_OP_ADD, kir_bin(k, KIR_OP_MUL,
        kir_bin(k, KIR_OP_ADD, kir_bin(k, KIR_OP_MUL, ds, i32(B, T->nu)), du),
        i32(B, T->pitch)), dv);
    const kir_expr_t *cell = kir_shared_load(k, T->sh, kir_select(k, hit, at, i32(B, 0)));
    return memo_add(B, slot, flat,
                    w16_rp_let(B, "src_elem", w16_ir_select(k, hit, cell, mem)));
}

/* ---- the source side ----------------------------------------------------- */

/* The decoded source value (w16_rp_src_value, not raw). */
static const kir_expr_t *src_value(builder_t *B, w16_role_t role,
                                   const lcoord_t *at)
{
    return w16_rp_src_value(B, role, at, false);
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
        return w16_rp_fail(B, "code transforms that read z take the group k / group "
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

/* Loads the raw storage element holding the source value of `role` at `at`
 * and extracts it: a code (after the source's decode transform, unless
 * raw) for codes, the element's bits otherwise. Result: i64. */
const kir_expr_t *w16_rp_src_value(builder_t *B, w16_role_t role, const lcoord_t *at,
                                   bool raw)
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
            c = w16_rp_let(B, "pk", permuted_k(B, at, c));
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
        if (!(ix = w16_rp_lower(B, l->index[d], &ri)))
            return NULL;
        flat = w16_ir_add(k, w16_ir_mul(k, flat, ik(B, B->sshape[role][d])), ix);
    }
    /* source words (build_repack.c): the byte's word and its bits in it */
    const kir_expr_t *shift = NULL;
    if (role == W16_ROLE_QWEIGHT && B->words32) {
        int64_t size = 1;
        for (int d = 0; d < l->ndim; d++)
            size *= B->sshape[role][d];
        int64_t es = (int64_t)wna16_dtype_size(r->src_dtype[role]);
        w16_range_t rf = {0, size - 1};
        shift = w16_ir_mul(k, w16_ir_floormod(&B->L, flat, 4 / es, rf), ik(B, 8 * es));
        flat = w16_ir_floordiv(&B->L, flat, 4 / es, rf);
    }
    const kir_expr_t *elem = source_load(B, role, slot, flat, rows, ix);
    const kir_expr_t *v = kir_int_cast(k, KIR_I64, elem, false);
    if (role != W16_ROLE_QWEIGHT && role != W16_ROLE_QZEROS)
        return v;
    int cb = w16_layout_code_bits(l, r->src_dtype[role], B->sv);
    if (l->bit) {
        w16_range_t rb;
        const kir_expr_t *bit = w16_rp_lower(B, l->bit, &rb);
        if (!bit)
            return NULL;
        shift = shift ? w16_ir_add(k, shift, bit) : bit;
    }
    if (shift && !(shift->op == KIR_OP_CONST && shift->ival == 0))
        v = kir_bin(k, KIR_OP_LSHR, v, shift);
    if (cb < 64)
        v = kir_bin(k, KIR_OP_AND, v, ik(B, (INT64_C(1) << cb) - 1));
    if (l->decode && !raw) {
        v = w16_rp_let(B, "stored", v);
        if (z)
            z = w16_rp_let(B, "zero", z);
        w16_lower_bind(&B->L, W16_VAR_c, v, 0, (INT64_C(1) << cb) - 1);
        if (z)
            w16_lower_bind(&B->L, W16_VAR_z, z, 0,
                           (INT64_C(1) << r->problem.BITS) - 1);
        v = w16_rp_lower(B, l->decode, NULL);
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
        return w16_rp_fail(B, "not a float dtype");
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
        const kir_expr_t *u = w16_rp_let(B, "f32bits",
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
        return w16_rp_fail(B, "not a float dtype");
    }
}

/* f rounded to dtype d, as f32. */
static const kir_expr_t *round_to(builder_t *B, wna16_dtype_t d,
                                  const kir_expr_t *f)
{
    return d == WNA16_DTYPE_F32 ? f : bits_to_f32(B, d, f32_to_bits(B, d, f));
}

/* vLLM's weight loader: a float value read in dtype sd (f, as f32) cast to
 * the model's dtype, as the parameter it is copied into holds it; f when
 * the problem names no model dtype or the source is already in it. */
static const kir_expr_t *loader_cast(builder_t *B, wna16_dtype_t sd,
                                     const kir_expr_t *f)
{
    wna16_dtype_t m = B->req->problem.model_dtype;
    return m && m != sd ? round_to(B, m, f) : f;
}

/* Nearest integer, ties to even, of an f32 below 2^23 in magnitude: the
 * truncation plus a correction from the exact remainder. i64. */
static const kir_expr_t *rint_even(builder_t *B, const kir_expr_t *f)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *t = w16_rp_let(B, "rint_t",
                                     kir_convert(k, KIR_OP_FTOSI, KIR_I64, f));
    const kir_expr_t *fr = w16_rp_let(B, "rint_fr", kir_bin(k, KIR_OP_FSUB, f,
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
    const kir_expr_t *f = loader_cast(B, sd, bits_to_f32(B, sd, raw));
    if (B->ssx.multiply != 1) /* a power of two: exact */
        f = kir_bin(k, KIR_OP_FDIV, f,
                    kir_fconst(k, KIR_F32, (double)B->ssx.multiply));
    if (sd != dd || B->ssx.multiply != 1)
        f = round_to(B, dd, f);
    f = w16_rp_let(B, "scale", f);
    if (B->dsx.int16_range) {
        if (!B->smax)
            return w16_rp_fail(B, "int16 scale codes need the largest scale");
        const kir_expr_t *q = round_to(B, dd, kir_bin(k, KIR_OP_FDIV, f,
                                                      kir_pref(k, B->smax)));
        const kir_expr_t *p = w16_rp_let(B, "scaled", round_to(B, dd,
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
 * see w16_rp_clamp_slot); returns the i1 "this slot holds a value". */
const kir_expr_t *w16_rp_dst_slot(builder_t *B, int slot, lcoord_t *at)
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
        const kir_expr_t *c = w16_rp_lower(B, l->coord[i], &rc);
        if (!c)
            return NULL;
        char name[16];
        snprintf(name, sizeof name, "c%d_%s", B->pos, w16_var_name(cv[i]));
        c = w16_rp_let(B, name, c);
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
    return valid; /* not yet a let: a branch with no padding never reads it */
}

/* Coordinates of a slot that may be padding replaced by 0 there, so the
 * source is never addressed out of bounds. */
void w16_rp_clamp_slot(builder_t *B, const kir_expr_t *valid, lcoord_t *at)
{
    if (valid->op == KIR_OP_CONST && valid->ival)
        return;
    w16_var_t cv[W16_MAX_COORDS];
    w16_role_coords(B->dl.role, cv);
    for (int i = 0; i < at->n; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d_%s", B->pos, w16_var_name(cv[i]));
        at->c[i] = w16_rp_let(B, name, w16_ir_select(B->k, valid, at->c[i], ik(B, 0)));
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
            return w16_rp_src_value(B, role, at, true);
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
    int64_t gse = B->dv[W16_VAR_GSE];
    lcoord_t g = {.n = 3};
    g.c[0] = at->c[0];
    g.ext[0] = at->ext[0];
    g.c[1] = w16_ir_floordiv(&B->L, at->c[2], gse, (w16_range_t){0, at->ext[2] - 1});
    g.ext[1] = (at->ext[2] + gse - 1) / gse;
    g.c[2] = at->c[1];
    g.ext[2] = at->ext[1];
    const kir_expr_t *s = loader_cast(
        B, r->src_dtype[W16_ROLE_SCALES],
        bits_to_f32(B, r->src_dtype[W16_ROLE_SCALES],
                    src_value(B, W16_ROLE_SCALES, &g)));
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
const kir_expr_t *w16_rp_slot_bits(builder_t *B, const kir_expr_t *valid, lcoord_t at)
{
    kir_kernel_t *k = B->k;
    const w16_repack_request_t *r = B->req;
    w16_rp_clamp_slot(B, valid, &at);
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
            v = w16_rp_let(B, "code", v); /* the transform may read c twice */
            if (z)
                z = w16_rp_let(B, "zero", z);
            w16_lower_clear_vars(&B->L);
            w16_lower_bind(&B->L, W16_VAR_c, v, 0,
                           (INT64_C(1) << r->problem.BITS) - 1);
            if (z)
                w16_lower_bind(&B->L, W16_VAR_z, z, 0,
                               (INT64_C(1) << r->problem.BITS) - 1);
            v = w16_rp_lower(B, B->dl.encode, NULL);
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
        wna16_dtype_t m = r->problem.model_dtype;
        v = xform ? scale_bits(B, sd, raw)
            : sd == r->dst_dtype ? raw
            /* to the model's dtype or through it (CPU: F32 of the cast) */
            : f32_to_bits(B, r->dst_dtype,
                          m == r->dst_dtype ? bits_to_f32(B, sd, raw)
                                            : loader_cast(B, sd,
                                                  bits_to_f32(B, sd, raw)));
        break;
    }
    case W16_ROLE_GSCALE: /* fp32(max) / range, vLLM's 1/range * max */
        if (!B->smax || !B->dsx.int16_range)
            return w16_rp_fail(B, "the input_global_scale needs int16 scale codes");
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
            return w16_rp_fail(B, "sort indices need the act-order permutation");
        v = permuted_k(B, &at, at.c[1]);
        break;
    default:
        return w16_rp_fail(B, "this destination role is not generated yet");
    }
    if (!v)
        return NULL;
    return w16_ir_select(k, valid, v, ik(B, 0));
}

/* The digits of q in the shape S[0..j) as the storage index B->idx[0..j). */
void w16_rp_unflatten(builder_t *B, const kir_expr_t *q, w16_range_t rq,
                      const int64_t *S, int j)
{
    int64_t stride = 1;
    for (int d = j - 1; d >= 0; d--) {
        char name[8];
        snprintf(name, sizeof name, "i%d", d);
        B->idx[d] = w16_rp_let(B, name, w16_ir_floormod(&B->L,
            w16_ir_floordiv(&B->L, q, stride, rq), S[d],
            (w16_range_t){0, rq.hi / stride}));
        stride *= S[d];
    }
}

/* ---- probes -------------------------------------------------------------- */

/* The source element (flat, within its tensor *tensor) that code `slot`
 * of element `elem` of the word at grid index w reads; -1 where the probe
 * does not apply (padding, act-order, padded layouts). Numeric, through
 * the specs' own maps: only the plans (lane direction, word blocks, tiles)
 * depend on it, never the words a kernel writes. */
int64_t w16_rp_probe(builder_t *B, const int64_t *w, int n, int elem, int slot,
                     int64_t *tensor)
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
