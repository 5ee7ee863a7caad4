/*
 * lower_arith.c - the i64 IR arithmetic that the lowering (lower_expr.c)
 * and the builders emit through (see lower_expr.h): constant folding,
 * facts (a range and an alignment) derived from the IR itself and seen
 * through let-bound variables, 32-bit narrowing, and the aligned splits of
 * sums that let divisions, remainders and comparisons keep the part that
 * depends on the workgroup apart from the part that depends on the lane.
 * Every form chosen is exact for the IR's wrapping arithmetic; it knows
 * nothing of spec expressions. tests/gen/test_lower_expr.c checks it
 * against plain arithmetic.
 */
#include "gen/lower_expr.h"

#include <string.h>

/* ---- IR helpers with folding --------------------------------------------- */

static bool is_k(const kir_expr_t *e, int64_t *v)
{
    if (e && e->op == KIR_OP_CONST && e->type == KIR_I64) {
        if (v)
            *v = e->ival;
        return true;
    }
    return false;
}

bool w16_ir_is_const(const kir_expr_t *e, int64_t *v) { return is_k(e, v); }

const kir_expr_t *w16_ir_const(kir_kernel_t *k, int64_t v)
{
    return kir_const(k, KIR_I64, v);
}

const kir_expr_t *w16_ir_add(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b)
{
    int64_t x, y;
    if (is_k(a, &x) && is_k(b, &y))
        return w16_ir_const(k, (int64_t)((uint64_t)x + (uint64_t)y));
    if (is_k(a, &x) && x == 0)
        return b;
    if (is_k(b, &y) && y == 0)
        return a;
    return kir_bin(k, KIR_OP_ADD, a, b);
}

const kir_expr_t *w16_ir_sub(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b)
{
    int64_t x, y;
    if (is_k(a, &x) && is_k(b, &y))
        return w16_ir_const(k, (int64_t)((uint64_t)x - (uint64_t)y));
    if (is_k(b, &y) && y == 0)
        return a;
    return kir_bin(k, KIR_OP_SUB, a, b);
}

const kir_expr_t *w16_ir_mul(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b)
{
    int64_t x, y;
    if (is_k(a, &x) && is_k(b, &y))
        return w16_ir_const(k, (int64_t)((uint64_t)x * (uint64_t)y));
    if (is_k(a, &x)) { /* constants on the right */
        const kir_expr_t *t = a;
        a = b;
        b = t;
    }
    if ((is_k(a, &x) && x == 0) || (is_k(b, &y) && y == 0))
        return w16_ir_const(k, 0);
    if (is_k(a, &x) && x == 1)
        return b;
    if (is_k(b, &y) && y == 1)
        return a;
    /* multiplications by powers of two are shifts; LLVM does this too, but
     * the CUDA and SPIR-V output reads better */
    if (is_k(b, &y) && y > 0 && (y & (y - 1)) == 0)
        return kir_bin(k, KIR_OP_SHL, a, w16_ir_const(k, __builtin_ctzll((uint64_t)y)));
    return kir_bin(k, KIR_OP_MUL, a, b);
}

static bool pow2(int64_t d) { return d > 0 && (d & (d - 1)) == 0; }

/* ---- facts ----------------------------------------------------------------
 *
 * Derived bottom-up from the IR. Every rule is sound for the IR's wrapping
 * arithmetic: a step that could overflow knows nothing.
 */

static const w16_facts_t no_facts = {INT64_MIN, INT64_MAX, 1};

/* The noted definition of a variable, seen through the extension that
 * views a 32-bit variable as i64 (w16_lower_let); NULL if e is neither. */
static const kir_expr_t *defn(const w16_lower_t *L, const kir_expr_t *e)
{
    if ((e->op == KIR_OP_ZEXT || e->op == KIR_OP_SEXT) && e->type == KIR_I64 &&
        e->a->op == KIR_OP_VAR && e->a->type == KIR_I32)
        e = e->a;
    if (e->op == KIR_OP_VAR && e->var->index < L->n_vfacts)
        return L->vdef[e->var->index];
    return NULL;
}

static uint64_t gcd_u(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint64_t abs_u(int64_t v) { return v < 0 ? 0 - (uint64_t)v : (uint64_t)v; }

static w16_facts_t mkfacts(int64_t lo, int64_t hi, uint64_t align)
{
    return (w16_facts_t){lo, hi, align};
}

static bool facts_full(w16_facts_t f) { return f.lo == INT64_MIN && f.hi == INT64_MAX; }

/* Facts of a value of a narrower unsigned type, zero-extended. */
static w16_facts_t zext_facts(const w16_lower_t *L, const kir_expr_t *x)
{
    if (x->op == KIR_OP_LANE_ID)
        return mkfacts(0, L->k->lanes - 1, 1);
    int bits = kir_type_bits(x->type);
    if (bits < 1 || bits > 62)
        return mkfacts(0, INT64_MAX, 1);
    return mkfacts(0, (INT64_C(1) << bits) - 1, 1);
}

w16_facts_t w16_ir_facts(const w16_lower_t *L, const kir_expr_t *e)
{
    if (!e)
        return no_facts;
    if (e->type == KIR_I1)
        return mkfacts(0, 1, 1);
    if (e->type != KIR_I64)
        return no_facts;
    w16_facts_t a = no_facts, b = no_facts, r = no_facts;
    int64_t c;
    switch (e->op) {
    case KIR_OP_CONST:
        return mkfacts(e->ival, e->ival, abs_u(e->ival));
    case KIR_OP_VAR:
        if (e->var->index < L->n_vfacts && L->vdef[e->var->index])
            return L->vfacts[e->var->index];
        return no_facts;
    case KIR_OP_SEXT:
        if (defn(L, e))
            return L->vfacts[e->a->var->index];
        return no_facts;
    case KIR_OP_GROUP_ID:
        return L->num_groups > 0 ? mkfacts(0, L->num_groups - 1, 1) : mkfacts(0, INT64_MAX, 1);
    case KIR_OP_ZEXT:
        if (defn(L, e))
            return L->vfacts[e->a->var->index];
        return zext_facts(L, e->a);
    case KIR_OP_CTLOAD: {
        const kir_ctable_t *t = e->ctable;
        r = mkfacts(t->values[0], t->values[0], 0);
        for (int i = 0; i < t->count; i++) {
            if (t->values[i] < r.lo) r.lo = t->values[i];
            if (t->values[i] > r.hi) r.hi = t->values[i];
            r.align = gcd_u(r.align, abs_u(t->values[i]));
        }
        return r;
    }
    default:
        break;
    }
    int arity = kir_op_arity(e->op);
    if (arity >= 1 && e->op != KIR_OP_SELECT)
        a = w16_ir_facts(L, e->a);
    if (arity >= 2 && e->op != KIR_OP_SELECT)
        b = w16_ir_facts(L, e->b);
    bool b_const = e->b && e->b->op == KIR_OP_CONST && e->b->type == KIR_I64;
    c = b_const ? e->b->ival : 0;
    switch (e->op) {
    case KIR_OP_ADD:
    case KIR_OP_SUB: {
        int64_t lo, hi;
        bool ovf = e->op == KIR_OP_ADD
                       ? __builtin_add_overflow(a.lo, b.lo, &lo) ||
                             __builtin_add_overflow(a.hi, b.hi, &hi)
                       : __builtin_sub_overflow(a.lo, b.hi, &lo) ||
                             __builtin_sub_overflow(a.hi, b.lo, &hi);
        return ovf ? no_facts : mkfacts(lo, hi, gcd_u(a.align, b.align));
    }
    case KIR_OP_MUL: {
        int64_t p[4];
        if (__builtin_mul_overflow(a.lo, b.lo, &p[0]) ||
            __builtin_mul_overflow(a.lo, b.hi, &p[1]) ||
            __builtin_mul_overflow(a.hi, b.lo, &p[2]) ||
            __builtin_mul_overflow(a.hi, b.hi, &p[3]))
            return no_facts;
        r = mkfacts(p[0], p[0], 1);
        for (int i = 1; i < 4; i++) {
            if (p[i] < r.lo) r.lo = p[i];
            if (p[i] > r.hi) r.hi = p[i];
        }
        uint64_t al;
        r.align = __builtin_mul_overflow(a.align, b.align, &al) ? 1 : al;
        return r;
    }
    case KIR_OP_SHL: {
        if (!b_const || c < 0 || c > 62)
            return no_facts;
        int64_t lo, hi;
        if (__builtin_mul_overflow(a.lo, INT64_C(1) << c, &lo) ||
            __builtin_mul_overflow(a.hi, INT64_C(1) << c, &hi))
            return no_facts;
        uint64_t al;
        return mkfacts(lo, hi, __builtin_mul_overflow(a.align, UINT64_C(1) << c, &al)
                                   ? UINT64_C(1) << c : al);
    }
    case KIR_OP_ASHR:
    case KIR_OP_LSHR:
        if (!b_const || c < 0 || c > 63 || (e->op == KIR_OP_LSHR && a.lo < 0))
            return e->op == KIR_OP_LSHR && b_const && c > 0 ? mkfacts(0, INT64_MAX, 1)
                                                           : no_facts;
        return mkfacts(a.lo >> c, a.hi >> c,
                       a.align % (UINT64_C(1) << c) == 0 ? a.align >> c : 1);
    case KIR_OP_UDIV:
        if (!b_const || c <= 0 || a.lo < 0)
            return mkfacts(0, INT64_MAX, 1);
        return mkfacts(a.lo / c, a.hi / c,
                       a.align % (uint64_t)c == 0 ? a.align / (uint64_t)c : 1);
    case KIR_OP_UREM:
        if (!b_const || c <= 0)
            return mkfacts(0, INT64_MAX, 1);
        if (a.lo >= 0 && a.hi < c)
            return a;
        return mkfacts(0, c - 1, gcd_u(a.align, (uint64_t)c));
    case KIR_OP_AND: {
        /* a & b clears bits only: the trailing zeros of either stay, and
         * with b = m >= 0 the result is in [0, m] */
        uint64_t pa = a.align & (0 - a.align), pb = b.align & (0 - b.align);
        uint64_t al = !pa || !pb ? 0 : (pa > pb ? pa : pb);
        if (!b_const || c < 0)
            return a.lo >= 0 && b.lo >= 0 ? mkfacts(0, a.hi < b.hi ? a.hi : b.hi, al)
                                          : mkfacts(INT64_MIN, INT64_MAX, al);
        return mkfacts(0, a.lo >= 0 && a.hi < c ? a.hi : c, al);
    }
    case KIR_OP_OR:
    case KIR_OP_XOR: {
        /* trailing zeros common to both stay */
        uint64_t pa = a.align & (0 - a.align), pb = b.align & (0 - b.align);
        uint64_t al = !pa ? pb : !pb ? pa : (pa < pb ? pa : pb);
        if (a.lo >= 0 && b.lo >= 0) {
            int64_t m = a.hi > b.hi ? a.hi : b.hi;
            int bits = m ? 64 - __builtin_clzll((uint64_t)m) : 0;
            return mkfacts(0, bits >= 63 ? INT64_MAX : (INT64_C(1) << bits) - 1,
                           al ? al : 1);
        }
        return mkfacts(INT64_MIN, INT64_MAX, al ? al : 1);
    }
    case KIR_OP_SMIN:
        return mkfacts(a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi,
                       gcd_u(a.align, b.align));
    case KIR_OP_SMAX:
        return mkfacts(a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi,
                       gcd_u(a.align, b.align));
    case KIR_OP_SELECT:
        a = w16_ir_facts(L, e->b);
        b = w16_ir_facts(L, e->c);
        if (e->a->op == KIR_OP_CONST)
            return e->a->ival ? a : b;
        return mkfacts(a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi,
                       gcd_u(a.align, b.align));
    default:
        return no_facts;
    }
}

const kir_expr_t *w16_ir_assume_in_range(const w16_lower_t *L,
                                         const kir_expr_t *e, int64_t lo,
                                         int64_t hi)
{
    const kir_expr_t *d = defn(L, e) ? defn(L, e) : e;
    if (d->op != KIR_OP_SELECT)
        return e;
    int64_t v;
    if (is_k(d->b, &v) && (v < lo || v >= hi))
        return w16_ir_assume_in_range(L, d->c, lo, hi);
    if (is_k(d->c, &v) && (v < lo || v >= hi))
        return w16_ir_assume_in_range(L, d->b, lo, hi);
    return e;
}

bool w16_ir_uses_lane(const w16_lower_t *L, const kir_expr_t *e)
{
    if (!e)
        return false;
    switch (e->op) {
    case KIR_OP_CONST:
    case KIR_OP_PARAM:
    case KIR_OP_GROUP_ID:
    case KIR_OP_NUM_GROUPS:
        return false;
    case KIR_OP_VAR:
        return !defn(L, e) || w16_ir_uses_lane(L, defn(L, e));
    case KIR_OP_LANE_ID:
    case KIR_OP_LOAD:
    case KIR_OP_TLOAD:
    case KIR_OP_SHARED_LOAD:
        return true;
    default:
        return w16_ir_uses_lane(L, e->a) || w16_ir_uses_lane(L, e->b) ||
               w16_ir_uses_lane(L, e->c);
    }
}

static w16_facts_t facts_in(const w16_lower_t *L, const kir_expr_t *e,
                            w16_range_t r)
{
    w16_facts_t f = w16_ir_facts(L, e);
    if (r.lo > f.lo) f.lo = r.lo;
    if (r.hi < f.hi) f.hi = r.hi;
    return f;
}

void w16_lower_note_var(w16_lower_t *L, const kir_var_t *v,
                        const kir_expr_t *def)
{
    if (!v || !def)
        return;
    if (v->index >= L->n_vfacts) {
        int n = L->n_vfacts ? L->n_vfacts : 16;
        while (n <= v->index)
            n *= 2;
        w16_facts_t *f = w16_arena_alloc(&L->k->arena, sizeof *f * (size_t)n);
        const kir_expr_t **d = w16_arena_alloc(&L->k->arena, sizeof *d * (size_t)n);
        const kir_expr_t **w = w16_arena_alloc(&L->k->arena, sizeof *w * (size_t)n);
        if (!f || !d || !w)
            return;
        memset(d, 0, sizeof *d * (size_t)n);
        memset(w, 0, sizeof *w * (size_t)n);
        if (L->n_vfacts) {
            memcpy(f, L->vfacts, sizeof *f * (size_t)L->n_vfacts);
            memcpy(d, L->vdef, sizeof *d * (size_t)L->n_vfacts);
            memcpy(w, L->vnarrow, sizeof *w * (size_t)L->n_vfacts);
        }
        L->vfacts = f;
        L->vdef = d;
        L->vnarrow = w;
        L->n_vfacts = n;
    }
    L->vfacts[v->index] = w16_ir_facts(L, def);
    L->vdef[v->index] = def;
}

/* ---- 32-bit arithmetic ----------------------------------------------------
 *
 * Low 32 bits of an i64 value: exact for the ring operations (add, sub,
 * mul, and, or, xor, shl); right shifts, divisions and min/max need the
 * operand's facts to fit in 32 bits. Variables are seen through (the
 * narrowed definition is rebuilt where used, once per variable: a
 * definition dominates every use of its variable, so the copy is valid
 * wherever the variable is).
 */

static bool fits_u32(w16_facts_t f) { return f.lo >= 0 && f.hi <= INT64_C(0xffffffff); }
static bool fits_s32(w16_facts_t f) { return f.lo >= INT32_MIN && f.hi <= INT32_MAX; }

static const kir_expr_t *k32(kir_kernel_t *k, int64_t v)
{
    return kir_const(k, KIR_I32, (int32_t)(uint32_t)(uint64_t)v);
}

/* A shift amount known to be in [0, 31], as i32; NULL otherwise. */
static const kir_expr_t *shift32(w16_lower_t *L, const kir_expr_t *s)
{
    w16_facts_t f = w16_ir_facts(L, s);
    return f.lo >= 0 && f.hi <= 31 ? w16_ir_narrow32(L, s) : NULL;
}

const kir_expr_t *w16_ir_narrow32(w16_lower_t *L, const kir_expr_t *e)
{
    kir_kernel_t *k = L->k;
    if (!e || e->type == KIR_I32)
        return e;
    if (e->type != KIR_I64)
        return kir_int_cast(k, KIR_I32, e, false);
    const kir_expr_t *a, *b, *s;
    w16_facts_t fa;
    int64_t c;
    switch (e->op) {
    case KIR_OP_CONST:
        return k32(k, e->ival);
    case KIR_OP_VAR: {
        int i = e->var->index;
        if (i >= L->n_vfacts || !L->vdef[i])
            break;
        if (!L->vnarrow[i])
            L->vnarrow[i] = w16_ir_narrow32(L, L->vdef[i]);
        return L->vnarrow[i];
    }
    case KIR_OP_ZEXT:
    case KIR_OP_SEXT:
        return kir_int_cast(k, KIR_I32, e->a, e->op == KIR_OP_SEXT);
    case KIR_OP_ADD: case KIR_OP_SUB: case KIR_OP_MUL:
    case KIR_OP_AND: case KIR_OP_OR: case KIR_OP_XOR:
        a = w16_ir_narrow32(L, e->a);
        b = w16_ir_narrow32(L, e->b);
        return a && b ? kir_bin(k, e->op, a, b) : NULL;
    case KIR_OP_SHL:
        if (is_k(e->b, &c) && c >= 32)
            return k32(k, 0);
        if (!(s = shift32(L, e->b)))
            break;
        return kir_bin(k, KIR_OP_SHL, w16_ir_narrow32(L, e->a), s);
    case KIR_OP_LSHR:
    case KIR_OP_ASHR:
        fa = w16_ir_facts(L, e->a);
        if (!(e->op == KIR_OP_LSHR ? fits_u32(fa) : fits_s32(fa)))
            break;
        if (is_k(e->b, &c) && c >= 32)
            return e->op == KIR_OP_LSHR || fa.lo >= 0 ? k32(k, 0)
                                                     : kir_bin(k, KIR_OP_ASHR,
                                                               w16_ir_narrow32(L, e->a),
                                                               k32(k, 31));
        if (!(s = shift32(L, e->b)))
            break;
        return kir_bin(k, e->op, w16_ir_narrow32(L, e->a), s);
    case KIR_OP_UDIV:
    case KIR_OP_UREM:
        if (!is_k(e->b, &c) || c <= 0 || !fits_u32(w16_ir_facts(L, e->a)))
            break;
        if (c > INT64_C(0xffffffff))
            return e->op == KIR_OP_UDIV ? k32(k, 0) : w16_ir_narrow32(L, e->a);
        return kir_bin(k, e->op, w16_ir_narrow32(L, e->a), k32(k, c));
    case KIR_OP_SDIV:
    case KIR_OP_SREM:
    case KIR_OP_SMIN:
    case KIR_OP_SMAX:
        if (!fits_s32(w16_ir_facts(L, e->a)) || !fits_s32(w16_ir_facts(L, e->b)) ||
            ((e->op == KIR_OP_SDIV || e->op == KIR_OP_SREM) &&
             !(is_k(e->b, &c) && c > 0)))
            break;
        return kir_bin(k, e->op, w16_ir_narrow32(L, e->a), w16_ir_narrow32(L, e->b));
    case KIR_OP_SELECT:
        return w16_ir_select(k, e->a, w16_ir_narrow32(L, e->b),
                             w16_ir_narrow32(L, e->c));
    default:
        break;
    }
    return kir_int_cast(k, KIR_I32, e, false);
}

const kir_expr_t *w16_lower_let(w16_lower_t *L, kir_block_t *b,
                                const char *name, const kir_expr_t *e)
{
    if (!e || e->op == KIR_OP_CONST || e->op == KIR_OP_VAR || defn(L, e))
        return e;
    w16_facts_t f = w16_ir_facts(L, e);
    bool zx = e->type == KIR_I64 && fits_u32(f);
    bool sx = e->type == KIR_I64 && !zx && fits_s32(f);
    const kir_var_t *v = kir_var(L->k, name, zx || sx ? KIR_I32 : e->type);
    if (!v || !kir_let(L->k, b, v, zx || sx ? w16_ir_narrow32(L, e) : e))
        return NULL;
    w16_lower_note_var(L, v, e);
    const kir_expr_t *r = kir_ref(L->k, v);
    return zx || sx ? kir_int_cast(L->k, KIR_I64, r, sx) : r;
}

const kir_expr_t *w16_ir_index32(w16_lower_t *L, const kir_expr_t *e)
{
    w16_facts_t f = w16_ir_facts(L, e);
    if (!e || e->op == KIR_OP_CONST || f.lo < 0 || f.hi > INT32_MAX)
        return e;
    return kir_int_cast(L->k, KIR_I64, w16_ir_narrow32(L, e), false);
}

/* ---- aligned splits ------------------------------------------------------
 *
 * The terms of a sum (seen through let-bound variables), and a split of
 * them into a multiple of m and a rest in [0, m).
 */

enum { MAX_TERMS = 16 };

typedef struct terms {
    const kir_expr_t *t[MAX_TERMS];
    int n;
    int64_t konst; /* the constant terms, summed */
} terms_t;

/* Adds c * e's terms to T (c = 1 at the top; constant multiplications of
 * sums are distributed, so 64 * (2 * g + l) has the terms 128 * g and
 * 64 * l). */
static bool gather_terms(w16_lower_t *L, const kir_expr_t *e, int64_t c,
                         terms_t *T)
{
    int64_t f;
    const kir_expr_t *d = defn(L, e);
    if (d && (d->op == KIR_OP_ADD || d->op == KIR_OP_MUL || d->op == KIR_OP_SHL))
        e = d;
    switch (e->op) {
    case KIR_OP_ADD:
        return gather_terms(L, e->a, c, T) && gather_terms(L, e->b, c, T);
    case KIR_OP_CONST:
        return !__builtin_mul_overflow(e->ival, c, &f) &&
               !__builtin_add_overflow(T->konst, f, &T->konst);
    case KIR_OP_SUB: /* x - constant (a spec's i3 - bk * 16) */
        if (is_k(e->b, &f) && !__builtin_mul_overflow(f, c, &f) &&
            !__builtin_sub_overflow(T->konst, f, &T->konst))
            return gather_terms(L, e->a, c, T);
        break;
    case KIR_OP_MUL:
    case KIR_OP_SHL:
        if (is_k(e->b, &f) && (e->op == KIR_OP_MUL || (f >= 0 && f < 63))) {
            if (e->op == KIR_OP_SHL)
                f = INT64_C(1) << f;
            int64_t cf;
            if (!__builtin_mul_overflow(c, f, &cf))
                return gather_terms(L, e->a, cf, T);
        }
        break;
    default:
        break;
    }
    if (T->n == MAX_TERMS)
        return false;
    T->t[T->n++] = w16_ir_mul(L->k, e, w16_ir_const(L->k, c));
    return true;
}

/* x = A + B, A a multiple of m, B in [0, m), both non-constant-zero
 * (otherwise nothing would be gained). */
static bool split_at(w16_lower_t *L, const terms_t *T, int64_t m,
                     const kir_expr_t **A, const kir_expr_t **B)
{
    kir_kernel_t *k = L->k;
    int64_t kb = w16_floormod(T->konst, m), ka = T->konst - kb;
    const kir_expr_t *a = w16_ir_const(k, ka), *b = w16_ir_const(k, kb);
    int64_t blo = kb, bhi = kb, alo = ka, ahi = ka;
    int na = 0, nb = 0;
    for (int i = 0; i < T->n; i++) {
        w16_facts_t f = w16_ir_facts(L, T->t[i]);
        if (f.align % (uint64_t)m == 0) {
            /* the IR's sums wrap: both parts must be free of overflow */
            if (facts_full(f) || __builtin_add_overflow(alo, f.lo, &alo) ||
                __builtin_add_overflow(ahi, f.hi, &ahi))
                return false;
            a = w16_ir_add(k, a, T->t[i]);
            na++;
        } else {
            if (facts_full(f) || __builtin_add_overflow(blo, f.lo, &blo) ||
                __builtin_add_overflow(bhi, f.hi, &bhi))
                return false;
            b = w16_ir_add(k, b, T->t[i]);
            nb++;
        }
    }
    if (blo < 0 || bhi >= m || (na == 0 && ka == 0) || (nb == 0 && kb == 0))
        return false;
    *A = a;
    *B = b;
    return true;
}

/* A split of x whose modulus m divides d (or, unless divisors_only, is a
 * multiple of d); the largest such m that works. */
static bool split_for(w16_lower_t *L, const kir_expr_t *x, int64_t d,
                      bool divisors_only, int64_t *m, const kir_expr_t **A,
                      const kir_expr_t **B)
{
    terms_t T = {.n = 0};
    if (facts_full(w16_ir_facts(L, x)) || !gather_terms(L, x, 1, &T) ||
        T.n + (T.konst != 0) < 2)
        return false;
    int64_t best = 0;
    for (int i = 0; i < T.n; i++) {
        uint64_t al = w16_ir_facts(L, T.t[i]).align;
        if (al == 0 || al > INT64_MAX || (int64_t)al <= best ||
            (d % (int64_t)al && (divisors_only || (int64_t)al % d)))
            continue;
        const kir_expr_t *a, *b;
        if (split_at(L, &T, (int64_t)al, &a, &b)) {
            best = (int64_t)al;
            *A = a;
            *B = b;
        }
    }
    if (!best && split_at(L, &T, d, A, B))
        best = d;
    *m = best;
    return best > 0;
}

/* a / d for a known to be a multiple of d, as a rewrite of a's structure
 * (NULL when its structure does not show it). */
static const kir_expr_t *exact_div(w16_lower_t *L, const kir_expr_t *a, int64_t d)
{
    kir_kernel_t *k = L->k;
    if (d == 1)
        return a;
    if (defn(L, a))
        a = defn(L, a);
    switch (a->op) {
    case KIR_OP_CONST:
        return a->ival % d == 0 ? w16_ir_const(k, a->ival / d) : NULL;
    case KIR_OP_ADD: {
        const kir_expr_t *x = exact_div(L, a->a, d), *y = x ? exact_div(L, a->b, d) : NULL;
        return y ? w16_ir_add(k, x, y) : NULL;
    }
    case KIR_OP_MUL:
    case KIR_OP_SHL: {
        int64_t c;
        if (!is_k(a->b, &c))
            return NULL;
        if (a->op == KIR_OP_SHL) {
            if (c < 0 || c > 62)
                return NULL;
            c = INT64_C(1) << c;
        }
        if (c % d == 0)
            return w16_ir_mul(k, a->a, w16_ir_const(k, c / d));
        if (d % c == 0) {
            const kir_expr_t *x = exact_div(L, a->a, d / c);
            return x;
        }
        return NULL;
    }
    default:
        return NULL;
    }
}

const kir_expr_t *w16_ir_floordiv(w16_lower_t *L, const kir_expr_t *a,
                                  int64_t d, w16_range_t ra)
{
    kir_kernel_t *k = L->k;
    int64_t x;
    if (d == 1)
        return a;
    if (is_k(a, &x))
        return w16_ir_const(k, w16_floordiv(x, d));
    w16_facts_t f = facts_in(L, a, ra);
    if (f.lo >= 0 && f.hi < d)
        return w16_ir_const(k, 0);
    if (f.lo >= 0 && f.hi / d == f.lo / d)
        return w16_ir_const(k, f.lo / d);
    const kir_expr_t *q;
    if (f.align % (uint64_t)d == 0 && (q = exact_div(L, a, d)))
        return q;
    int64_t m;
    const kir_expr_t *A, *B;
    if (split_for(L, a, d, false, &m, &A, &B)) {
        w16_range_t any = {INT64_MIN, INT64_MAX};
        if (m % d == 0) /* A / d exact */
            return w16_ir_add(k, w16_ir_floordiv(L, A, d, any),
                              w16_ir_floordiv(L, B, d, (w16_range_t){0, m - 1}));
        return w16_ir_floordiv(L, A, d, any);
    }
    if (pow2(d)) /* an arithmetic shift floors for negative values too */
        return kir_bin(k, KIR_OP_ASHR, a, w16_ir_const(k, __builtin_ctzll((uint64_t)d)));
    if (f.lo >= 0)
        return kir_bin(k, KIR_OP_UDIV, a, w16_ir_const(k, d));
    /* q = a / d truncated; subtract 1 when a is negative and inexact */
    q = kir_bin(k, KIR_OP_SDIV, a, w16_ir_const(k, d));
    const kir_expr_t *r = kir_bin(k, KIR_OP_SREM, a, w16_ir_const(k, d));
    const kir_expr_t *neg = kir_bin(k, KIR_OP_SLT, r, w16_ir_const(k, 0));
    return w16_ir_sub(k, q, kir_int_cast(k, KIR_I64, neg, false));
}

const kir_expr_t *w16_ir_floormod(w16_lower_t *L, const kir_expr_t *a,
                                  int64_t d, w16_range_t ra)
{
    kir_kernel_t *k = L->k;
    int64_t x;
    if (d == 1)
        return w16_ir_const(k, 0);
    if (is_k(a, &x))
        return w16_ir_const(k, w16_floormod(x, d));
    w16_facts_t f = facts_in(L, a, ra);
    if (f.lo >= 0 && f.hi < d)
        return a;
    if (f.align % (uint64_t)d == 0)
        return w16_ir_const(k, 0);
    int64_t m;
    const kir_expr_t *A, *B;
    if (split_for(L, a, d, false, &m, &A, &B)) {
        w16_range_t any = {INT64_MIN, INT64_MAX};
        if (m % d == 0)
            return w16_ir_floormod(L, B, d, (w16_range_t){0, m - 1});
        return w16_ir_add(k, w16_ir_floormod(L, A, d, any), B);
    }
    if (pow2(d)) /* two's complement: the mask is the floor modulo */
        return kir_bin(k, KIR_OP_AND, a, w16_ir_const(k, d - 1));
    if (f.lo >= 0)
        return kir_bin(k, KIR_OP_UREM, a, w16_ir_const(k, d));
    const kir_expr_t *r = kir_bin(k, KIR_OP_SREM, a, w16_ir_const(k, d));
    const kir_expr_t *neg = kir_bin(k, KIR_OP_SLT, r, w16_ir_const(k, 0));
    return kir_select(k, neg, w16_ir_add(k, r, w16_ir_const(k, d)), r);
}

const kir_expr_t *w16_ir_ge(w16_lower_t *L, const kir_expr_t *a, int64_t c)
{
    kir_kernel_t *k = L->k;
    w16_facts_t f = w16_ir_facts(L, a);
    if (f.lo >= c)
        return kir_const(k, KIR_I1, 1);
    if (f.hi < c)
        return kir_const(k, KIR_I1, 0);
    /* A + B >= c <=> A >= c when A and c are multiples of m, B in [0, m) */
    int64_t m;
    const kir_expr_t *A, *B;
    if (c != 0 && c != INT64_MIN && split_for(L, a, c < 0 ? -c : c, true, &m, &A, &B))
        return w16_ir_ge(L, A, c);
    return kir_bin(k, KIR_OP_SLE, w16_ir_const(k, c), a);
}

const kir_expr_t *w16_ir_in_range(w16_lower_t *L, const kir_expr_t *a,
                                  w16_range_t ra, int64_t lo, int64_t hi)
{
    kir_kernel_t *k = L->k;
    /* through a select whose arm decides it (a layout's "-1 here") */
    const kir_expr_t *d = defn(L, a) ? defn(L, a) : a;
    if (d->op == KIR_OP_SELECT) {
        /* an arm matters only where chosen, and there a's range holds */
        const kir_expr_t *x = w16_ir_in_range(L, d->b, ra, lo, hi);
        const kir_expr_t *y = w16_ir_in_range(L, d->c, ra, lo, hi);
        if (x->op == KIR_OP_CONST || y->op == KIR_OP_CONST)
            return w16_ir_select(k, d->a, x, y);
    }
    w16_facts_t f = facts_in(L, a, ra);
    bool lo_ok = f.lo >= lo, hi_ok = f.hi < hi;
    if (f.hi < lo || f.lo >= hi)
        return kir_const(k, KIR_I1, 0);
    if (lo_ok && hi_ok)
        return kir_const(k, KIR_I1, 1);
    if (lo_ok)
        return kir_bin(k, KIR_OP_SLT, a, w16_ir_const(k, hi));
    if (hi_ok)
        return kir_bin(k, KIR_OP_SLE, w16_ir_const(k, lo), a);
    /* unsigned trick: lo <= a < hi  <=>  (a - lo) <u (hi - lo) */
    return kir_bin(k, KIR_OP_ULT, w16_ir_sub(k, a, w16_ir_const(k, lo)),
                   w16_ir_const(k, hi - lo));
}

const kir_expr_t *w16_ir_and1(kir_kernel_t *k, const kir_expr_t *a,
                              const kir_expr_t *b)
{
    if (a && a->op == KIR_OP_CONST)
        return a->ival ? b : a;
    if (b && b->op == KIR_OP_CONST)
        return b->ival ? a : b;
    return kir_bin(k, KIR_OP_AND, a, b);
}

const kir_expr_t *w16_ir_select(kir_kernel_t *k, const kir_expr_t *c,
                                const kir_expr_t *a, const kir_expr_t *b)
{
    if (c && c->op == KIR_OP_CONST)
        return c->ival ? a : b;
    if (a && b && a->type == KIR_I1) { /* a choice of flags is logic */
        bool ka = a->op == KIR_OP_CONST, kb = b->op == KIR_OP_CONST;
        if (ka && kb)
            return a->ival == b->ival ? a : a->ival ? c : kir_un(k, KIR_OP_NOT, c);
        if (ka)
            return a->ival ? kir_bin(k, KIR_OP_OR, c, b)
                           : w16_ir_and1(k, kir_un(k, KIR_OP_NOT, c), b);
        if (kb)
            return b->ival ? kir_bin(k, KIR_OP_OR, kir_un(k, KIR_OP_NOT, c), a)
                           : w16_ir_and1(k, c, a);
    }
    return kir_select(k, c, a, b);
}
