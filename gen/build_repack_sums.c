/*
 * build_repack_sums.c - the block sums of a layout with "sums" (the CPU's
 * VNNI compensation: the sum of (q - z) over each block of bk codes of a
 * column): a block's sum code by code, a source element at a time where
 * the layout allows it (block_sum_words), or for all the copies of a lane
 * at once where they read the same source elements
 * (w16_rp_block_sums_shared);
 * and the test of whether the codes kernel can write the sums in the same
 * pass ("sums in the codes' pass"). build_repack.c's two entry points
 * store what these return: the separate sums kernel and the codes kernel
 * with its sums fused.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }

/* The bits of the qweight source element a table load returns (source
 * words: build_repack.c). */
static int source_bits(const builder_t *B)
{
    return B->words32 ? 32
                      : (int)wna16_dtype_size(B->req->src_dtype[W16_ROLE_QWEIGHT]) * 8;
}

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
    return w16_rp_src_value(B, W16_ROLE_QWEIGHT, &at, false);
}

/* z of the code at (e, n, k) (block sums). */
static const kir_expr_t *block_zero(builder_t *B, const kir_expr_t *e,
                                    const kir_expr_t *n, const kir_expr_t *kval)
{
    const w16_repack_request_t *req = B->req;
    int64_t E = B->dv[W16_VAR_E], N = B->dv[W16_VAR_N], K = B->dv[W16_VAR_K];
    if (!req->problem.zp)
        return ik(B, INT64_C(1) << (req->problem.BITS - 1));
    int64_t gse = B->dv[W16_VAR_GSE];
    lcoord_t g = {.n = 3};
    g.c[0] = e; g.ext[0] = E;
    g.c[1] = w16_ir_floordiv(&B->L, kval, gse, (w16_range_t){0, K - 1});
    g.ext[1] = K / gse;
    g.c[2] = n; g.ext[2] = N;
    return w16_rp_src_value(B, W16_ROLE_QZEROS, &g, false);
}

/* q - z of the code at (e, n, k) (block sums). */
static const kir_expr_t *block_term(builder_t *B, const kir_expr_t *e,
                                    const kir_expr_t *n, const kir_expr_t *kval)
{
    const kir_expr_t *q = block_code(B, e, n, kval);
    const kir_expr_t *z = q ? block_zero(B, e, n, kval) : NULL;
    return q && z ? kir_bin(B->k, KIR_OP_SUB, q, z) : NULL;
}

/* e, seen through the lets that name it (the copies bind their own
 * coordinates: equal definitions, different variables) and through integer
 * casts (a let's recorded definition is its 64-bit form, a use may be the
 * narrowed one): the values compared here are in-range indices and their
 * parts, which no cast changes. */
static const kir_expr_t *let_value(const builder_t *B, const kir_expr_t *e)
{
    for (;;) {
        if ((e->op == KIR_OP_ZEXT || e->op == KIR_OP_SEXT || e->op == KIR_OP_TRUNC) &&
            !kir_type_is_float(e->type) && !kir_type_is_float(e->a->type)) {
            e = e->a;
            continue;
        }
        if (e->op != KIR_OP_VAR || e->var->index >= B->L.n_vfacts ||
            !B->L.vdef[e->var->index])
            return e;
        e = B->L.vdef[e->var->index];
    }
}

/* Equality of two integer IR expressions' values, structurally, through
 * lets and casts (let_value; w16_rp_same_value sees through fewer
 * casts). */
static bool same_value(const builder_t *B, const kir_expr_t *a, const kir_expr_t *b)
{
    a = a ? let_value(B, a) : a;
    b = b ? let_value(B, b) : b;
    if (a == b)
        return true;
    if (!a || !b || a->op != b->op || a->ival != b->ival ||
        kir_type_is_float(a->type) != kir_type_is_float(b->type) ||
        (kir_type_is_float(a->type) && !w16_rp_same_node(a, b)) || a->var != b->var ||
        a->param != b->param || a->shared != b->shared || a->ctable != b->ctable)
        return false;
    return same_value(B, a->a, b->a) && same_value(B, a->b, b->b) &&
           same_value(B, a->c, b->c);
}

/* An integer expression as a linear form: the sum of coefficients times
 * atoms (subexpressions that are not sums, constant multiples or shifts)
 * plus a constant, seen through lets. The indices the builder compares
 * are values the kernel computes without wrapping (in-range indices, in
 * 32 bits only where they fit), so the form's value is the expression's. */
enum { MAX_LINEAR = 24 };
typedef struct linear {
    const kir_expr_t *atom[MAX_LINEAR];
    int64_t coef[MAX_LINEAR];
    int n;
    int64_t konst;
} linear_t;

static bool add_linear(const builder_t *B, const kir_expr_t *e, int64_t c, linear_t *f)
{
    e = let_value(B, e);
    int64_t x;
    switch (e->op) {
    case KIR_OP_CONST:
        return !__builtin_mul_overflow(e->ival, c, &x) &&
               !__builtin_add_overflow(f->konst, x, &f->konst);
    case KIR_OP_ADD:
        return add_linear(B, e->a, c, f) && add_linear(B, e->b, c, f);
    case KIR_OP_SUB:
        return !__builtin_mul_overflow(c, -1, &x) && add_linear(B, e->a, c, f) &&
               add_linear(B, e->b, x, f);
    case KIR_OP_MUL:
    case KIR_OP_SHL:
        if (e->b->op == KIR_OP_CONST) {
            int64_t m = e->b->ival;
            if (e->op == KIR_OP_SHL && (m < 0 || m > 40))
                break;
            if (e->op == KIR_OP_SHL)
                m = INT64_C(1) << m;
            return !__builtin_mul_overflow(c, m, &x) && add_linear(B, e->a, x, f);
        }
        break;
    default:
        break;
    }
    for (int i = 0; i < f->n; i++)
        if (same_value(B, f->atom[i], e))
            return !__builtin_add_overflow(f->coef[i], c, &f->coef[i]);
    if (f->n == MAX_LINEAR)
        return false;
    f->atom[f->n] = e;
    f->coef[f->n++] = c;
    return true;
}

/* *d = a - b where the two integer expressions differ by a constant (the
 * same linear form but for the constant). */
static bool const_diff(const builder_t *B, const kir_expr_t *a,
                       const kir_expr_t *b, int64_t *d)
{
    if (same_value(B, a, b)) {
        *d = 0;
        return true;
    }
    linear_t f = {.n = 0};
    if (!add_linear(B, a, 1, &f) || !add_linear(B, b, -1, &f))
        return false;
    for (int i = 0; i < f.n; i++)
        if (f.coef[i])
            return false;
    *d = f.konst;
    return true;
}

/* Two table loads of the same element: one table slot, indices equal as
 * linear forms (the lowering may build one index in two shapes). */
static bool same_load(const builder_t *B, const kir_expr_t *a, const kir_expr_t *b)
{
    int64_t d;
    return w16_rp_same_expr(a, b) ||
           (a->op == KIR_OP_TLOAD && b->op == KIR_OP_TLOAD && a->param == b->param &&
            same_value(B, a->a, b->a) && const_diff(B, a->b, b->b, &d) && d == 0);
}

/* Rebuilds the loads x[0..n) (table loads of one table slot whose indices
 * differ by constants, where const_diff shows it) as loads at one base
 * index, a let, plus constants: LLVM then sees one address and constant
 * offsets instead of n index computations to simplify and analyze (the
 * compile time), and combines loads of neighbouring bytes into one.
 * Returns false (nothing emitted) where the loads do not qualify. */
static bool rebase_loads(builder_t *B, const kir_expr_t **x, int n)
{
    int64_t off[MAX_UNROLLED_SUM];
    if (n < 2 || n > MAX_UNROLLED_SUM || x[0]->op != KIR_OP_TLOAD)
        return false;
    for (int j = 1; j < n; j++)
        if (x[j]->op != KIR_OP_TLOAD || x[j]->param != x[0]->param ||
            !same_value(B, x[j]->a, x[0]->a) ||
            !const_diff(B, x[j]->b, x[0]->b, &off[j]))
            return false;
    const kir_expr_t *base = w16_rp_let(B, "row", x[0]->b), *slot = x[0]->a;
    if (slot->op != KIR_OP_CONST)
        slot = w16_rp_let(B, "tensor", slot);
    for (int j = 0; j < n && base && slot; j++)
        x[j] = kir_tload(B->k, x[0]->param, slot,
                         j ? kir_bin(B->k, KIR_OP_ADD, base, ik(B, off[j])) : base);
    return true;
}

/* The loaded source element a code expression extracts its bits from, and
 * the bit it starts at: q = and(lshr(zext(X), bit), mask) or and(zext(X),
 * mask), as w16_rp_src_value builds it. NULL where q has another form. */
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
 * quarter of the instructions LLVM optimizes and selects (GPTQ into the
 * cpu layout, w13: 19,859 LLVM instructions before O3 summed code by
 * code, 6,751 with this and the unroll hint of emit_llvm.c; its cold
 * compile 188 -> 62 ms). NULL (nothing emitted) where the layout does
 * not qualify. */
static const kir_expr_t *block_sum_words(builder_t *B, const kir_expr_t *e,
                                         const kir_expr_t *n, const kir_expr_t *kb,
                                         int64_t bk)
{
    kir_kernel_t *k = B->k;
    const w16_layout_t *l = &B->sl[W16_ROLE_QWEIGHT];
    int cb = w16_layout_code_bits(l, B->req->src_dtype[W16_ROLE_QWEIGHT], B->sv);
    int wb = source_bits(B);
    if (l->decode || B->perm || cb <= 0 || wb > 32 || wb % cb || wb / cb < 2 ||
        (wb / cb & (wb / cb - 1)) || bk % (wb / cb) || bk / (wb / cb) > MAX_UNROLLED_SUM ||
        bk * ((INT64_C(1) << cb) - 1) > INT32_MAX)
        return NULL;
    int per = wb / cb, nw = (int)(bk / per);
    int64_t mask = (INT64_C(1) << cb) - 1;
    const kir_expr_t *word[MAX_UNROLLED_SUM], *raw[MAX_UNROLLED_SUM];
    const kir_expr_t *k0 = w16_ir_mul(k, kb, ik(B, bk));
    for (int j = 0; j < nw; j++) {
        uint64_t seen = 0;
        for (int i = 0; i < per; i++) {
            int64_t bit = -1;
            const kir_expr_t *x = code_field(
                block_code(B, e, n, w16_ir_add(k, k0, ik(B, (int64_t)j * per + i))),
                mask, &bit);
            if (!x || bit < 0 || bit >= wb || bit % cb ||
                (seen >> (bit / cb) & 1) || (i && !same_load(B, x, word[j])))
                return NULL;
            seen |= UINT64_C(1) << (bit / cb);
            word[j] = x;
        }
        raw[j] = word[j];
    }
    /* in 32 bits: the last field grows into the zero bits above a
     * narrower element */
    kir_type_t t = KIR_I32;
    for (int j = 0; j < nw; j++)
        word[j] = kir_int_cast(k, t, word[j], false);
    /* Narrower elements side by side in one 32-bit value (any grouping
     * keeps every field once, so the sum): at one base plus constants, the
     * neighbouring bytes of a row (MoeWNA16) become one 32-bit load in
     * LLVM, a quarter of the loads a lane gathers. */
    if (wb < 32 && nw % (32 / wb) == 0 && rebase_loads(B, raw, nw)) {
        int r = 32 / wb;
        for (int j = 0; j < nw / r; j++) {
            const kir_expr_t *w = kir_int_cast(k, t, raw[j * r], false);
            for (int i = 1; i < r; i++)
                w = kir_bin(k, KIR_OP_OR, w,
                            kir_bin(k, KIR_OP_SHL, kir_int_cast(k, t, raw[j * r + i], false),
                                    kir_const(k, t, (int64_t)i * wb)));
            word[j] = w;
        }
        nw /= r;
        wb = 32;
    } else if (wb == 32 && rebase_loads(B, raw, nw)) {
        for (int j = 0; j < nw; j++)
            word[j] = kir_int_cast(k, t, raw[j], false);
    }
    int64_t top = mask; /* the largest value a field holds */
    for (int f = cb; f < wb; f *= 2) {
        int64_t m = 0; /* the low f bits of every 2f */
        for (int b = 0; b < wb; b += 2 * f)
            m |= ((INT64_C(1) << f) - 1) << b;
        const kir_expr_t *mk = kir_const(k, t, m), *sh = kir_const(k, t, f);
        for (int j = 0; j < nw; j++) {
            const kir_expr_t *w = w16_rp_let(B, "word", word[j]);
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
const kir_expr_t *w16_rp_block_sum(builder_t *B, const kir_expr_t *e,
                                   const kir_expr_t *n, const kir_expr_t *kb,
                                   int64_t bk, int tag)
{
    kir_kernel_t *k = B->k;
    int64_t gse = B->dv[W16_VAR_GSE];
    bool one_z = !B->req->problem.zp || gse % bk == 0;
    if (bk <= MAX_UNROLLED_SUM) {
        const kir_expr_t *k0 = w16_ir_mul(k, kb, ik(B, bk));
        const kir_expr_t *z = NULL, *q = NULL;
        if (one_z && !(z = block_zero(B, e, n, k0)))
            return NULL;
        if (one_z && z->op != KIR_OP_CONST)
            z = w16_rp_let(B, "zero", z);
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
                    terms[i] = w16_rp_let(B, "sum", terms[i]);
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
        return w16_rp_fail(B, "out of memory");
    kir_stmt_t *loop = kir_for(k, B->body, kk, ik(B, 0), ik(B, bk), 1);
    if (!loop)
        return w16_rp_fail(B, "out of memory");
    kir_block_t *outer = B->body;
    B->body = &loop->body;
    const kir_expr_t *kval = w16_rp_let(B, "k", w16_ir_add(k,
        w16_ir_mul(k, kb, ik(B, bk)), kir_ref(k, kk)));
    const kir_expr_t *term = block_term(B, e, n, kval);
    if (!term || !kir_assign(k, B->body, acc, w16_ir_add(k, kir_ref(k, acc), term)))
        w16_rp_fail(B, "out of memory");
    B->body = outer;
    return B->fail ? NULL : kir_ref(k, acc);
}

/* ---- sums of copies that share their source words ------------------------
 *
 * Where the codes run along n inside a source element (AWQ: the 8 codes of
 * an int32 are 8 columns), the word blocks' copies over the bits that move
 * no source element are neighbouring columns whose codes sit in the same
 * elements: at every k of the block, copy t's code is field f_t of one
 * element X_k that all copies read. Their block sums are then the per-field
 * sums of the bk elements, computed once for all copies in place (SWAR):
 * the fields are split into the even and the odd ones, each in a slot of
 * twice the width, the elements are added while a slot cannot overflow, and
 * the sums split again into wider slots where bk elements would overflow
 * (4-bit fields: 8-bit slots, groups of 17 elements, then 16-bit slots).
 * About 6 operations per element for all copies at once, instead of 3 per
 * copy and element (a code's shift, mask and add): an eighth of the
 * instructions LLVM optimizes and selects for AWQ's 8 copies (AWQ into
 * the cpu layout: w13 and w2 compiled in 119 and 134 ms before these
 * sums and its word blocks, 91 and 83 ms after). The sums are the same
 * integers. */

/* A set of slots: terms whose slots of `width` bits hold sums of the
 * fields listed in `field` (slot s of every term: field[s]), each slot of a
 * term at most `top`. */
typedef struct plane {
    const kir_expr_t **term;
    int n, width;
    int64_t top;
    int field[32];
} plane_t;

/* Adds the terms of *p (in place) into planes of one term each whose
 * slots hold the sums of all its terms; returns the number of planes
 * written to out[], or -1. wb: the element's bits (at most 32). */
static int sum_planes(builder_t *B, plane_t *p, int wb, plane_t *out, int nout)
{
    kir_kernel_t *k = B->k;
    int64_t cap = p->width >= wb ? INT32_MAX : (INT64_C(1) << p->width) - 1;
    if (p->n * p->top <= cap || p->width >= wb) {
        /* one term holds every sum */
        if (p->n * p->top > cap || nout < 1)
            return -1;
        const kir_expr_t *acc = p->term[0];
        for (int i = 1; i < p->n; i++)
            acc = kir_bin(k, KIR_OP_ADD, acc, p->term[i]);
        out[0] = *p;
        out[0].term = w16_arena_alloc(&k->arena, sizeof *out[0].term);
        if (!out[0].term)
            return -1;
        out[0].term[0] = w16_rp_let(B, "fsum", acc);
        out[0].n = 1;
        out[0].top = p->n * p->top;
        return 1;
    }
    /* add groups while a slot cannot overflow, then split each sum into its
     * even and its odd slots, twice as wide */
    int64_t g = cap / p->top;
    int m = 0;
    for (int i = 0; i < p->n; i += (int)g) {
        const kir_expr_t *acc = p->term[i];
        for (int j = i + 1; j < p->n && j < i + g; j++)
            acc = kir_bin(k, KIR_OP_ADD, acc, p->term[j]);
        p->term[m++] = g > 1 ? w16_rp_let(B, "fpart", acc) : acc;
    }
    int64_t mask = 0;
    for (int b = 0; b < wb; b += 2 * p->width)
        mask |= ((INT64_C(1) << p->width) - 1) << b;
    plane_t half[2];
    for (int h = 0; h < 2; h++) {
        half[h].term = w16_arena_alloc(&k->arena, sizeof *half[h].term * (size_t)m);
        if (!half[h].term)
            return -1;
        half[h].n = m;
        half[h].width = 2 * p->width;
        half[h].top = g * p->top;
        for (int s = 0; 2 * s + h < wb / p->width; s++)
            half[h].field[s] = p->field[2 * s + h];
    }
    const kir_expr_t *mk = kir_const(k, KIR_I32, mask);
    const kir_expr_t *sh = kir_const(k, KIR_I32, p->width);
    for (int i = 0; i < m; i++) {
        const kir_expr_t *t = p->term[i];
        if (t->op != KIR_OP_VAR)
            t = w16_rp_let(B, "fword", t);
        half[0].term[i] = kir_bin(k, KIR_OP_AND, t, mk);
        half[1].term[i] = kir_bin(k, KIR_OP_AND, kir_bin(k, KIR_OP_LSHR, t, sh), mk);
    }
    int n0 = sum_planes(B, &half[0], wb, out, nout);
    if (n0 < 0)
        return -1;
    int n1 = sum_planes(B, &half[1], wb, out + n0, nout - n0);
    return n1 < 0 ? -1 : n0 + n1;
}

/* The terms of plane p (one term) in slots of `width` bits, split into
 * planes of twice the width until `width`; appended to out[*n]. */
static bool widen_plane(builder_t *B, const plane_t *p, int width, int wb,
                        plane_t *out, int *n, int nout)
{
    if (p->width >= width) {
        if (*n == nout)
            return false;
        out[(*n)++] = *p;
        return true;
    }
    kir_kernel_t *k = B->k;
    int64_t mask = 0;
    for (int b = 0; b < wb; b += 2 * p->width)
        mask |= ((INT64_C(1) << p->width) - 1) << b;
    const kir_expr_t *t = p->term[0];
    if (t->op != KIR_OP_VAR)
        t = w16_rp_let(B, "fword", t);
    for (int h = 0; h < 2; h++) {
        plane_t q = {.n = 1, .width = 2 * p->width, .top = p->top};
        q.term = w16_arena_alloc(&k->arena, sizeof *q.term);
        if (!q.term)
            return false;
        const kir_expr_t *x = h ? kir_bin(k, KIR_OP_LSHR, t, kir_const(k, KIR_I32, p->width)) : t;
        q.term[0] = kir_bin(k, KIR_OP_AND, x, kir_const(k, KIR_I32, mask));
        for (int s = 0; 2 * s + h < wb / p->width; s++)
            q.field[s] = p->field[2 * s + h];
        if (!widen_plane(B, &q, width, wb, out, n, nout))
            return false;
    }
    return true;
}

/* sum_planes over chunks of the terms, one after the other: each chunk's
 * planes widened to the slots the whole sum needs and added to running
 * sums, so that a chunk's elements are used right after they are loaded
 * (all of them first would keep bk vectors live: spills, and the
 * instruction selector and register allocator's time). */
static int chunked_sums(builder_t *B, plane_t *p, int wb, plane_t *out, int nout)
{
    kir_kernel_t *k = B->k;
    int64_t cap2 = 2 * p->width >= wb ? INT32_MAX : (INT64_C(1) << (2 * p->width)) - 1;
    int64_t g = cap2 / p->top;
    if (g < 2 || p->n <= g)
        return sum_planes(B, p, wb, out, nout);
    /* the slots the whole sum needs */
    int width = p->width;
    while (width < wb && p->n * p->top > (INT64_C(1) << width) - 1)
        width *= 2;
    if (width > wb || (width >= wb && p->n * p->top > INT32_MAX))
        return -1;
    int n_acc = 0;
    for (int c = 0; c < p->n; c += (int)g) {
        plane_t chunk = *p;
        chunk.term = p->term + c;
        chunk.n = p->n - c < g ? p->n - c : (int)g;
        plane_t part[32], wide[32];
        int np = sum_planes(B, &chunk, wb, part, 32), nw = 0;
        if (np < 0)
            return -1;
        for (int i = 0; i < np; i++)
            if (!widen_plane(B, &part[i], width, wb, wide, &nw, 32))
                return -1;
        if (c == 0) {
            if (nw > nout)
                return -1;
            for (int i = 0; i < nw; i++) {
                out[i] = wide[i];
                out[i].term = w16_arena_alloc(&k->arena, sizeof *out[i].term);
                if (!out[i].term)
                    return -1;
                out[i].term[0] = w16_rp_let(B, "facc", wide[i].term[0]);
            }
            n_acc = nw;
            continue;
        }
        /* the same planes in the same order as the first chunk's: the
         * procedure is the same, the field of slot 0 names a plane */
        for (int i = 0; i < nw; i++) {
            int a = 0;
            while (a < n_acc && out[a].field[0] != wide[i].field[0])
                a++;
            if (a == n_acc || out[a].width != wide[i].width)
                return -1;
            out[a].term[0] = w16_rp_let(B, "facc", kir_bin(k, KIR_OP_ADD, out[a].term[0],
                                                         wide[i].term[0]));
        }
    }
    for (int i = 0; i < n_acc; i++)
        out[i].top = p->n * p->top;
    return n_acc;
}

/* The block sums of the T copies of the lane (sums of (q - z) over block
 * sc[t][2] of column sc[t][1] of expert sc[t][0]) into sum[t], where the
 * copies read their codes from the same source elements at different
 * fields (true); false, with nothing emitted, where they do not. */
bool w16_rp_block_sums_shared(builder_t *B, const kir_expr_t *(*sc)[3], int T,
                              int64_t bk, const kir_expr_t **sum)
{
    kir_kernel_t *k = B->k;
    const w16_layout_t *l = &B->sl[W16_ROLE_QWEIGHT];
    int cb = w16_layout_code_bits(l, B->req->src_dtype[W16_ROLE_QWEIGHT], B->sv);
    int wb = source_bits(B);
    int64_t gse = B->dv[W16_VAR_GSE];
    if (T < 2 || T > 32 || l->decode || B->perm || cb <= 0 || wb > 32 ||
        wb % cb || wb / cb < 2 || (wb / cb & (wb / cb - 1)) ||
        bk > MAX_UNROLLED_SUM || (B->req->problem.zp && gse % bk) ||
        bk * ((INT64_C(1) << cb) - 1) > INT32_MAX)
        return false;
    int64_t mask = (INT64_C(1) << cb) - 1;
    int field[32];
    const kir_expr_t *word[MAX_UNROLLED_SUM], *first = NULL;
    /* the copies read one expert's block: their e and block the same */
    for (int t = 1; t < T; t++)
        if (!same_value(B, sc[t][0], sc[0][0]) || !same_value(B, sc[t][2], sc[0][2]))
            return false;
    const kir_expr_t *k0 = w16_ir_mul(k, sc[0][2], ik(B, bk));
    /* a quick refusal first (copies in different elements: GPTQ's) */
    for (int t = 0; t < 2; t++) {
        int64_t bit = -1;
        const kir_expr_t *x = code_field(block_code(B, sc[0][0], sc[t][1], k0), mask, &bit);
        if (!x || (t && !same_load(B, x, first)))
            return false;
        first = x;
    }
    /* Every copy at a k the lowering cannot see through (a variable with
     * no value, which the source map takes as any k of the layer): where
     * copy t's code there is a constant field of the element copy 0's is
     * in, the same expression of k, it is so at every k of the block. One
     * lowering a copy instead of one a code and copy. */
    const kir_var_t *kv = kir_var(k, "kany", KIR_I64);
    if (!kv)
        return w16_rp_fail(B, "out of memory"), true;
    const kir_expr_t *kany = kir_ref(k, kv);
    uint64_t seen = 0;
    for (int t = 0; t < T; t++) {
        int64_t bit = -1;
        const kir_expr_t *x = code_field(block_code(B, sc[0][0], sc[t][1], kany), mask, &bit);
        if (!x || bit < 0 || bit >= wb || bit % cb || (seen >> (bit / cb) & 1) ||
            (t && !same_load(B, x, first)))
            return false;
        seen |= UINT64_C(1) << (bit / cb);
        field[t] = (int)(bit / cb);
        first = x;
    }
    /* copy 0's element and field at each k of the block */
    for (int64_t kk = 0; kk < bk; kk++) {
        int64_t bit = -1;
        word[kk] = code_field(block_code(B, sc[0][0], sc[0][1], w16_ir_add(k, k0, ik(B, kk))),
                              mask, &bit);
        if (!word[kk] || bit != (int64_t)field[0] * cb)
            return false;
    }
    /* from here on the branch holds the sums: a failure is an error */
    plane_t p = {.n = (int)bk, .width = cb, .top = mask};
    p.term = w16_arena_alloc(&k->arena, sizeof *p.term * (size_t)bk);
    if (!p.term)
        return w16_rp_fail(B, "out of memory"), true;
    rebase_loads(B, word, (int)bk);
    for (int64_t kk = 0; kk < bk; kk++)
        p.term[kk] = kir_int_cast(k, KIR_I32, word[kk], false);
    for (int f = 0; f < wb / cb; f++)
        p.field[f] = f;
    plane_t out[32];
    int np = chunked_sums(B, &p, wb, out, 32);
    if (np < 0 || B->fail)
        return w16_rp_fail(B, "out of memory"), true;
    for (int t = 0; t < T; t++) {
        /* the plane and slot of copy t's field */
        const kir_expr_t *v = NULL;
        for (int i = 0; i < np && !v; i++)
            for (int s = 0; s < wb / out[i].width && !v; s++)
                if (out[i].field[s] == field[t]) {
                    v = out[i].term[0];
                    if (s)
                        v = kir_bin(k, KIR_OP_LSHR, v, kir_const(k, KIR_I32, s * out[i].width));
                    if (out[i].width < wb)
                        v = kir_bin(k, KIR_OP_AND, v, kir_const(k, KIR_I32,
                                    (INT64_C(1) << out[i].width) - 1));
                }
        const kir_expr_t *z = block_zero(B, sc[t][0], sc[t][1],
                                         w16_ir_mul(k, sc[t][2], ik(B, bk)));
        if (!v || !z)
            return w16_rp_fail(B, "a copy's field has no sum"), true;
        if (z->op != KIR_OP_CONST)
            z = w16_rp_let(B, "zero", z);
        sum[t] = kir_bin(k, KIR_OP_SUB, kir_int_cast(k, KIR_I64, v, false),
                         w16_ir_mul(k, z, ik(B, bk)));
    }
    return true;
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
 * kernel's (w16_rp_block_sum), byte for byte. */

/* Whether the i1 `all` holds wherever the i1 `sums` does not, as their
 * structure shows: `sums` is not(P or false ...), and `all` a conjunction
 * of copies of P (the CPU layout: a word is a sum's or else every slot of
 * it is a code's). Then the codes' branch needs no padded body, which
 * LLVM would otherwise optimize before it finds it dead. */
bool w16_rp_valid_without_sums(const builder_t *B, const kir_expr_t *sums,
                               const kir_expr_t *all)
{
    if (sums->op == KIR_OP_VAR)
        sums = let_value(B, sums);
    if (sums->op != KIR_OP_NOT)
        return false;
    const kir_expr_t *p = sums->a; /* true where no sum is */
    while (p->op == KIR_OP_OR && (p->b->op == KIR_OP_CONST || p->b->op == KIR_OP_NE)) {
        /* or(P, const false) and or(P, ne(c, c)) */
        const kir_expr_t *q = p->b;
        bool is_false = q->op == KIR_OP_CONST ? q->ival == 0
                                              : q->a->op == KIR_OP_CONST &&
                                                    q->b->op == KIR_OP_CONST &&
                                                    q->a->ival == q->b->ival;
        if (!is_false)
            return false;
        p = p->a;
    }
    /* every conjunct of all is P (or true) */
    const kir_expr_t *stack[256];
    int n = 0;
    stack[n++] = all;
    while (n > 0) {
        const kir_expr_t *e = let_value(B, stack[--n]);
        if (e->op == KIR_OP_CONST && e->ival)
            continue;
        if (e->op == KIR_OP_AND && e->type == KIR_I1) {
            if (n + 2 > 256)
                return false;
            stack[n++] = e->a;
            stack[n++] = e->b;
            continue;
        }
        if (!same_value(B, e, p))
            return false;
    }
    return true;
}

/* Whether the layout's sums can be written by the codes kernel: words of 4
 * bytes, each sum starting at a word (its index aligned to 4). */
bool w16_rp_sums_fusable(builder_t *B)
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
    const kir_expr_t *last = w16_rp_lower(B, l->sums_index[l->ndim - 1], NULL);
    if (!last || w16_ir_facts(&B->L, last).align % 4)
        return false;
    return true;
}

/* The sum's coordinates (e, n, g) of the word at storage index B->idx
 * (last dimension in words) and the i1 "a sum starts there". */
const kir_expr_t *w16_rp_sum_slot(builder_t *B, const kir_expr_t *c[3])
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
        const kir_expr_t *v = w16_rp_lower(B, l->sums_coord[i], &rc);
        if (!v)
            return NULL;
        valid = w16_ir_and1(k, valid, w16_ir_in_range(&B->L, v, rc, 0, ext[i]));
        c[i] = w16_ir_assume_in_range(&B->L, v, 0, ext[i]);
    }
    return valid;
}
