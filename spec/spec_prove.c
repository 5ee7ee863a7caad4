/*
 * spec_prove.c - proves a layout's maps at a real problem size (a Mixtral
 * layer holds billions of codes) by visiting a few representative elements
 * instead of all of them.
 *
 * The proof is periodic reduction. Shifting one logical coordinate x_i by
 * a period P changes a map expression by a constant when every division
 * and modulo on the way is by a divisor of the shift: for k -> k + 16,
 * k / 16 grows by 1 and k % 16 is unchanged, so Marlin's
 * index = (e, k / 16, nt * 128 + ...) shifts by (0, 1, 0) and its bit not
 * at all. An abstract interpretation of the folded expression trees (an()
 * below) computes, over a box of coordinates (a cell), each node's value
 * interval, whether it can fail, and its exact shift law "value(x + P) ==
 * value(x) + d, failing exactly where value(x) fails", or why it has none:
 * a divisor that needs a longer period (the period grows), a comparison or
 * min/max whose outcome changes inside the cell (the cell is cut in two,
 * as FlashInfer's n < I cuts w13 at the gate/up seam), or an operation with
 * no law (a table indexed by a moving value: that axis is not reduced).
 * When the forward map shifts by constants D_i and the inverse map, shifted
 * by D_i, shifts back by exactly P_i along x_i, then G(x) = coord(index(x))
 * - x is periodic, and so are the index's deviations: checking the box of
 * one period per axis at each cell proves, for every element of the cell,
 * (1) G(x) = 0, so the inverse map reads every element back and no two
 * elements share a place (injective); (2) the index lies in the shape, from
 * the exact extremes index(r) + sum_i D_i * t_i over the translates of each
 * representative r; (3) the bit is a whole slot (it does not move). The
 * storage side is reduced the same way (shifting a storage index moves the
 * coordinates read by constants, and the forward map of those moves back):
 * F(coord(p)) - p is periodic, so every place whose inverse claims an
 * element is that element's place, and a place that reads as padding at a
 * representative reads as padding at its translates, shown by the
 * coordinates' range over them; a cell whose coordinates lie outside the
 * domain by interval (CPU's compensation bytes read n = -1) is padding
 * whole. Block sums are a second map pair proved alike, plus: their starts
 * share one residue mod 4 along the last dimension (so distinct starts
 * never share a byte) and the inverse map of the codes reads padding over
 * their whole byte range (no code lies in a sum).
 *
 * Sound by construction: every law is an identity of the evaluator's
 * integer semantics (floor division, wrapping + - *; a law that depends on
 * no overflow needs a bounded interval). Not complete: a map outside these
 * laws (a table over a moving coordinate, bit tricks across tile edges)
 * leaves its axis unreduced, and when the representatives exceed the
 * budget the caller walks or probes instead. A failure found here is always
 * a concrete element, named with the walk's words.
 */
#include "spec/spec_prove.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAXD = W16_MAX_STORE_DIMS, /* cell dimensions, coordinates or storage */
    MAX_CELLS = 4096,          /* cells one map pair may be cut into */
    MAX_ENUM = 4096,           /* translates enumerated for one place */
};
#define MULT_CAP (INT64_C(1) << 40)

/* ---- the abstract interpretation ------------------------------------------ */

/* One node over a cell: its value interval, whether it may fail, and its
 * shift law (known: value(x + shift) == value(x) + d with the same
 * failures), or the hint of why it has none. */
typedef struct an {
    int64_t lo, hi;
    bool top;    /* interval unknown (overflow, or wider than 2^63) */
    bool err;    /* may fail somewhere in the cell */
    bool known;
    int64_t d;
    int64_t mult; /* !known: the shift must grow by this factor (1: none) */
    bool split;   /* !known: an outcome changes inside the cell */
} an_t;

/* Interval and shift of every variable; folded maps use only the
 * coordinates, storage indices and slot, the rest stay at their value. */
typedef struct aenv {
    int64_t lo[W16_VAR_COUNT], hi[W16_VAR_COUNT], d[W16_VAR_COUNT];
    bool top[W16_VAR_COUNT];
} aenv_t;

static an_t an_const(int64_t v)
{
    return (an_t){.lo = v, .hi = v, .known = true, .mult = 1};
}

static void set_top(an_t *r)
{
    r->lo = INT64_MIN;
    r->hi = INT64_MAX;
    r->top = true;
}

static void set_iv(an_t *r, int64_t lo, int64_t hi)
{
    int64_t w;
    r->lo = lo;
    r->hi = hi;
    r->top = __builtin_sub_overflow(hi, lo, &w);
    if (r->top)
        set_top(r);
}

static int64_t gcd64(int64_t a, int64_t b)
{
    if (a < 0)
        a = -a;
    if (b < 0)
        b = -b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int64_t lcm_cap(int64_t a, int64_t b)
{
    int64_t g = gcd64(a, b), l;
    if (!g || __builtin_mul_overflow(a / g, b, &l) || l > MULT_CAP)
        return MULT_CAP;
    return l;
}

/* r has no law because of child c (when c has none). */
static void fail_from(an_t *r, const an_t *c)
{
    if (c->known)
        return;
    r->known = false;
    r->mult = lcm_cap(r->mult, c->mult);
    r->split |= c->split;
}

static void no_law(an_t *r)
{
    r->known = false;
}

/* The shift must grow until `c` divides the node's delta d. */
static void need_multiple(an_t *r, int64_t d, int64_t c)
{
    r->known = false;
    r->mult = lcm_cap(r->mult, c / gcd64(d, c));
}

/* A node that is one value over the cell and never fails is unchanged by
 * any shift inside it. */
static void settle(an_t *r)
{
    if (!r->top && r->lo == r->hi && !r->err) {
        r->known = true;
        r->d = 0;
        r->mult = 1;
        r->split = false;
    }
}

/* Usable to decide an outcome: its failures are periodic or absent. */
static bool safe(const an_t *a) { return a->known || !a->err; }

/* Truth over the cell: 1 always non-zero, 0 always zero, -1 either. */
static int truth(const an_t *a)
{
    if (a->top)
        return -1;
    if (a->lo == 0 && a->hi == 0)
        return 0;
    if (a->lo > 0 || a->hi < 0)
        return 1;
    return -1;
}

/* Does the truth of a stay the same between x and x + shift? */
static bool truth_kept(const an_t *a)
{
    return (a->known && a->d == 0) || (truth(a) >= 0 && safe(a));
}

static bool is_const(const an_t *a)
{
    return a->known && a->d == 0 && !a->top && a->lo == a->hi;
}

/* Exact delta arithmetic: no law on overflow. */
static void law_add(an_t *r, const an_t *a, const an_t *b, int sign)
{
    int64_t d;
    if (!a->known || !b->known)
        return;
    if (sign > 0 ? __builtin_add_overflow(a->d, b->d, &d)
                 : __builtin_sub_overflow(a->d, b->d, &d))
        return no_law(r);
    r->known = true;
    r->d = d;
}

static void iv_add(an_t *r, const an_t *a, const an_t *b, int sign)
{
    int64_t lo, hi;
    if (a->top || b->top ||
        (sign > 0 ? __builtin_add_overflow(a->lo, b->lo, &lo) ||
                        __builtin_add_overflow(a->hi, b->hi, &hi)
                  : __builtin_sub_overflow(a->lo, b->hi, &lo) ||
                        __builtin_sub_overflow(a->hi, b->lo, &hi)))
        return set_top(r);
    set_iv(r, lo, hi);
}

static void iv_mul(an_t *r, const an_t *a, const an_t *b)
{
    if (a->top || b->top)
        return set_top(r);
    int64_t p[4];
    const int64_t x[2] = {a->lo, a->hi}, y[2] = {b->lo, b->hi};
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(x[i / 2], y[i % 2], &p[i]))
            return set_top(r);
    int64_t lo = p[0], hi = p[0];
    for (int i = 1; i < 4; i++) {
        lo = p[i] < lo ? p[i] : lo;
        hi = p[i] > hi ? p[i] : hi;
    }
    set_iv(r, lo, hi);
}

/* Smallest m with v < 2^m (v >= 0). */
static int bit_len(int64_t v)
{
    int m = 0;
    while (m < 63 && (INT64_C(1) << m) <= v)
        m++;
    return m;
}

/* Division-like operators by a positive constant c: / % cdiv round_up and
 * >> (c = 2^m). */
static void an_divc(an_t *r, w16_op_t op, const an_t *a, int64_t c)
{
    if (!a->top) {
        int64_t qlo = w16_floordiv(a->lo, c), qhi = w16_floordiv(a->hi, c);
        bool one_block = qlo == qhi;
        switch (op) {
        case W16_OP_DIV: case W16_OP_SHR: set_iv(r, qlo, qhi); break;
        case W16_OP_MOD:
            if (one_block)
                set_iv(r, w16_floormod(a->lo, c), w16_floormod(a->hi, c));
            else
                set_iv(r, 0, c - 1);
            break;
        default: { /* CDIV, ROUND_UP */
            int64_t l, h, pl, ph;
            if (__builtin_add_overflow(qlo, w16_floormod(a->lo, c) != 0, &l) ||
                __builtin_add_overflow(qhi, w16_floormod(a->hi, c) != 0, &h))
                set_top(r);
            else if (op == W16_OP_CDIV)
                set_iv(r, l, h);
            else if (__builtin_mul_overflow(l, c, &pl) ||
                     __builtin_mul_overflow(h, c, &ph))
                set_top(r);
            else
                set_iv(r, pl, ph);
            break;
        }
        }
    } else {
        if (op == W16_OP_MOD)
            set_iv(r, 0, c - 1);
        else
            set_top(r);
    }
    if (!a->known)
        return fail_from(r, a);
    if (a->d == 0) {
        r->known = true;
        r->d = 0;
        return;
    }
    if (a->top)
        return no_law(r); /* the law needs exact integers */
    if (a->d % c == 0) {
        r->known = true;
        r->d = op == W16_OP_MOD ? 0 : op == W16_OP_ROUND_UP ? a->d : a->d / c;
        return;
    }
    if (op == W16_OP_MOD && w16_floordiv(a->lo, c) == w16_floordiv(a->hi, c)) {
        r->known = true; /* never wraps inside the cell */
        r->d = a->d;
        return;
    }
    need_multiple(r, a->d, c);
}

static an_t an(const w16_expr_t *x, const aenv_t *v);

static an_t an_cond(const w16_expr_t *x, const aenv_t *v)
{
    an_t t = an(x->a, v);
    int tr = truth(&t);
    if (tr >= 0 && safe(&t)) { /* one branch over the whole cell */
        an_t s = an(tr ? x->b : x->c, v);
        s.err |= t.err;
        settle(&s);
        return s;
    }
    an_t b = an(x->b, v), c = an(x->c, v), r = {.mult = 1};
    if (b.top || c.top)
        set_top(&r);
    else
        set_iv(&r, b.lo < c.lo ? b.lo : c.lo, b.hi > c.hi ? b.hi : c.hi);
    r.err = t.err || b.err || c.err;
    bool kept = t.known && t.d == 0;
    if (kept && b.known && c.known && b.d == c.d) {
        r.known = true;
        r.d = b.d;
    } else {
        r.known = false;
        fail_from(&r, &t);
        fail_from(&r, &b);
        fail_from(&r, &c);
        if (!kept)
            r.split = true;
    }
    settle(&r);
    return r;
}

static an_t an_logic(const w16_expr_t *x, const aenv_t *v)
{
    an_t a = an(x->a, v), r = {.mult = 1, .known = true};
    int ta = truth(&a);
    bool land = x->op == W16_OP_LAND;
    if (safe(&a) && ta == (land ? 0 : 1)) { /* short-circuit everywhere */
        r = an_const(land ? 0 : 1);
        r.err = a.err;
        return r;
    }
    an_t b = an(x->b, v);
    int tb = truth(&b);
    r.err = a.err || b.err;
    if (ta >= 0 && safe(&a) && tb >= 0 && safe(&b))
        set_iv(&r, tb, tb);
    else
        set_iv(&r, 0, 1);
    if (!(truth_kept(&a) && truth_kept(&b))) {
        r.known = false;
        fail_from(&r, &a);
        fail_from(&r, &b);
        r.split = true;
    }
    settle(&r);
    return r;
}

/* Comparisons, min and max. */
static an_t an_order(const w16_expr_t *x, const aenv_t *v)
{
    an_t a = an(x->a, v), b = an(x->b, v), r = {.mult = 1};
    r.err = a.err || b.err;
    bool bounded = !a.top && !b.top;
    /* the same delta on both sides keeps the order (exact integers) */
    bool same = a.known && b.known && a.d == b.d && (a.d == 0 || bounded);
    bool both_safe = safe(&a) && safe(&b);
    if (x->op == W16_OP_MIN || x->op == W16_OP_MAX) {
        bool mn = x->op == W16_OP_MIN;
        if (bounded)
            set_iv(&r, mn ? (a.lo < b.lo ? a.lo : b.lo)
                          : (a.lo > b.lo ? a.lo : b.lo),
                   mn ? (a.hi < b.hi ? a.hi : b.hi)
                      : (a.hi > b.hi ? a.hi : b.hi));
        else
            set_top(&r);
        /* which side wins over the whole cell, if one does */
        const an_t *win = NULL;
        if (bounded && both_safe) {
            if (mn ? a.hi <= b.lo : a.lo >= b.hi)
                win = &a;
            else if (mn ? b.hi <= a.lo : b.lo >= a.hi)
                win = &b;
        }
        if (same) {
            r.known = true;
            r.d = a.d;
        } else if (win) {
            r.known = win->known;
            r.d = win->d;
            if (!win->known)
                fail_from(&r, win);
        } else {
            r.known = false;
            fail_from(&r, &a);
            fail_from(&r, &b);
            r.split = true;
        }
        settle(&r);
        return r;
    }
    int dec = -1;
    if (bounded) {
        switch (x->op) {
        case W16_OP_LT: dec = a.hi < b.lo ? 1 : a.lo >= b.hi ? 0 : -1; break;
        case W16_OP_LE: dec = a.hi <= b.lo ? 1 : a.lo > b.hi ? 0 : -1; break;
        case W16_OP_GT: dec = a.lo > b.hi ? 1 : a.hi <= b.lo ? 0 : -1; break;
        case W16_OP_GE: dec = a.lo >= b.hi ? 1 : a.hi < b.lo ? 0 : -1; break;
        default: { /* EQ, NE */
            int eq = a.hi < b.lo || b.hi < a.lo ? 0
                     : a.lo == a.hi && b.lo == b.hi && a.lo == b.lo ? 1 : -1;
            dec = eq < 0 ? -1 : x->op == W16_OP_EQ ? eq : !eq;
        }
        }
    }
    if (dec >= 0)
        set_iv(&r, dec, dec);
    else
        set_iv(&r, 0, 1);
    if (same || (dec >= 0 && both_safe)) {
        r.known = true;
        r.d = 0;
    } else {
        r.known = false;
        fail_from(&r, &a);
        fail_from(&r, &b);
        r.split = true;
    }
    settle(&r);
    return r;
}

static an_t an_table(const w16_expr_t *x, const aenv_t *v)
{
    an_t a = an(x->a, v), r = {.mult = 1};
    const w16_table_t *t = x->table;
    int64_t lo = 0, hi = t->len - 1;
    r.err = a.err;
    if (a.top) {
        r.err = true;
    } else {
        r.err |= a.lo < 0 || a.hi >= t->len;
        if (a.lo > lo)
            lo = a.lo;
        if (a.hi < hi)
            hi = a.hi;
        if (lo > hi) { /* always out of range */
            lo = 0;
            hi = t->len - 1;
        }
    }
    int64_t mn = t->values[lo], mx = t->values[lo];
    for (int64_t i = lo + 1; i <= hi; i++) {
        mn = t->values[i] < mn ? t->values[i] : mn;
        mx = t->values[i] > mx ? t->values[i] : mx;
    }
    set_iv(&r, mn, mx);
    if (a.known && a.d == 0) {
        r.known = true;
        r.d = 0;
    } else {
        r.known = false;
        fail_from(&r, &a); /* a known but moving: no law */
    }
    settle(&r);
    return r;
}

/* & | ^ : a moving value combined with a fixed one below 2^m moves by
 * its own delta when 2^m divides it (the low m bits do not move). */
static void an_bits(an_t *r, w16_op_t op, const an_t *a, const an_t *b)
{
    if (!a->top && !b->top && a->lo >= 0 && b->lo >= 0) {
        int64_t m = a->hi > b->hi ? a->hi : b->hi;
        if (op == W16_OP_AND)
            set_iv(r, 0, a->hi < b->hi ? a->hi : b->hi);
        else
            set_iv(r, 0, bit_len(m) >= 63 ? INT64_MAX
                                          : (INT64_C(1) << bit_len(m)) - 1);
    } else {
        set_top(r);
    }
    if (a->known && b->known && a->d == 0 && b->d == 0) {
        r->known = true;
        r->d = 0;
        return;
    }
    const an_t *fix = NULL, *mov = NULL;
    if (b->known && b->d == 0 && !b->top && b->lo >= 0) {
        fix = b;
        mov = a;
    } else if (a->known && a->d == 0 && !a->top && a->lo >= 0) {
        fix = a;
        mov = b;
    }
    if (!fix || !mov->known) {
        r->known = false;
        fail_from(r, a);
        fail_from(r, b);
        return;
    }
    int m = bit_len(fix->hi);
    if (m >= 62)
        return no_law(r);
    int64_t p = INT64_C(1) << m;
    if (mov->d % p != 0)
        return need_multiple(r, mov->d, p);
    r->known = true;
    r->d = op == W16_OP_AND ? 0 : mov->d;
}

static an_t an(const w16_expr_t *x, const aenv_t *v)
{
    an_t r = {.mult = 1, .known = true};
    switch (x->op) {
    case W16_OP_CONST: return an_const(x->value);
    case W16_OP_VAR:
        r.d = v->d[x->var];
        if (v->top[x->var])
            set_top(&r);
        else
            set_iv(&r, v->lo[x->var], v->hi[x->var]);
        return r;
    case W16_OP_COND: return an_cond(x, v);
    case W16_OP_LAND: case W16_OP_LOR: return an_logic(x, v);
    case W16_OP_EQ: case W16_OP_NE: case W16_OP_LT: case W16_OP_LE:
    case W16_OP_GT: case W16_OP_GE: case W16_OP_MIN: case W16_OP_MAX:
        return an_order(x, v);
    case W16_OP_TABLE: return an_table(x, v);
    default: break;
    }
    an_t a = an(x->a, v), b = x->b ? an(x->b, v) : an_const(0);
    r.err = a.err || b.err;
    r.known = false;
    switch (x->op) {
    case W16_OP_NEG: case W16_OP_BNOT: {
        if (a.top || a.lo == INT64_MIN)
            set_top(&r);
        else if (x->op == W16_OP_NEG)
            set_iv(&r, -a.hi, -a.lo);
        else
            set_iv(&r, ~a.hi, ~a.lo);
        if (a.known && a.d != INT64_MIN) {
            r.known = true;
            r.d = -a.d;
        }
        fail_from(&r, &a);
        break;
    }
    case W16_OP_NOT:
        if (truth(&a) >= 0 && safe(&a))
            set_iv(&r, !truth(&a), !truth(&a));
        else
            set_iv(&r, 0, 1);
        if (truth_kept(&a)) {
            r.known = true;
            r.d = 0;
        } else {
            fail_from(&r, &a);
            r.split = true;
        }
        break;
    case W16_OP_ADD: case W16_OP_SUB: {
        int sign = x->op == W16_OP_ADD ? 1 : -1;
        iv_add(&r, &a, &b, sign);
        law_add(&r, &a, &b, sign);
        fail_from(&r, &a);
        fail_from(&r, &b);
        break;
    }
    case W16_OP_MUL:
        iv_mul(&r, &a, &b);
        if (a.known && b.known) {
            int64_t d = 0;
            bool ok = true;
            if (a.d == 0 && b.d == 0)
                d = 0;
            else if (is_const(&b))
                ok = !__builtin_mul_overflow(a.d, b.lo, &d);
            else if (is_const(&a))
                ok = !__builtin_mul_overflow(b.d, a.lo, &d);
            else
                ok = false;
            r.known = ok;
            r.d = d;
        }
        fail_from(&r, &a);
        fail_from(&r, &b);
        break;
    case W16_OP_DIV: case W16_OP_MOD: case W16_OP_CDIV: case W16_OP_ROUND_UP:
        if (is_const(&b) && b.lo > 0) {
            an_divc(&r, x->op, &a, b.lo);
            break;
        }
        /* by a variable (or non-positive) divisor: only unchanged inputs */
        r.err |= b.top || (b.lo <= 0 && b.hi >= 0);
        if (x->op == W16_OP_MOD && !b.top && b.lo > 0) {
            set_iv(&r, 0, b.hi - 1);
        } else if (x->op == W16_OP_DIV && !a.top && !b.top && b.lo > 0) {
            /* floor(a / b) is monotone in each argument: the corners */
            int64_t q[4] = {w16_floordiv(a.lo, b.lo), w16_floordiv(a.lo, b.hi),
                            w16_floordiv(a.hi, b.lo), w16_floordiv(a.hi, b.hi)};
            int64_t lo = q[0], hi = q[0];
            for (int i = 1; i < 4; i++) {
                lo = q[i] < lo ? q[i] : lo;
                hi = q[i] > hi ? q[i] : hi;
            }
            set_iv(&r, lo, hi);
        } else {
            set_top(&r);
        }
        r.known = a.known && b.known && a.d == 0 && b.d == 0;
        fail_from(&r, &a);
        fail_from(&r, &b);
        break;
    case W16_OP_SHL:
        if (is_const(&b) && b.lo >= 0 && b.lo <= 62) {
            an_t c = an_const(INT64_C(1) << b.lo);
            iv_mul(&r, &a, &c);
            if (a.known) {
                int64_t d;
                r.known = !__builtin_mul_overflow(a.d, c.lo, &d);
                r.d = d;
            }
            fail_from(&r, &a);
            break;
        }
        r.err |= b.top || b.lo < 0 || b.hi > 63;
        set_top(&r);
        r.known = a.known && b.known && a.d == 0 && b.d == 0;
        fail_from(&r, &a);
        fail_from(&r, &b);
        break;
    case W16_OP_SHR:
        if (is_const(&b) && b.lo >= 0 && b.lo <= 62) {
            an_divc(&r, W16_OP_SHR, &a, INT64_C(1) << b.lo);
            break;
        }
        r.err |= b.top || b.lo < 0 || b.hi > 63;
        set_top(&r);
        r.known = a.known && b.known && a.d == 0 && b.d == 0;
        fail_from(&r, &a);
        fail_from(&r, &b);
        break;
    case W16_OP_AND: case W16_OP_OR: case W16_OP_XOR:
        an_bits(&r, x->op, &a, &b);
        break;
    default: /* GCD, LCM: only unchanged inputs */
        if (x->op == W16_OP_GCD && !a.top && !b.top) {
            int64_t ma = a.lo < 0 ? (a.lo == INT64_MIN ? INT64_MAX : -a.lo)
                                  : a.hi;
            int64_t mb = b.lo < 0 ? (b.lo == INT64_MIN ? INT64_MAX : -b.lo)
                                  : b.hi;
            int64_t mh = a.hi > ma ? a.hi : ma, nh = b.hi > mb ? b.hi : mb;
            set_iv(&r, 0, mh > nh ? mh : nh);
        } else {
            set_top(&r);
            r.err = true; /* lcm can overflow */
        }
        r.known = a.known && b.known && a.d == 0 && b.d == 0;
        fail_from(&r, &a);
        fail_from(&r, &b);
        break;
    }
    settle(&r);
    return r;
}

/* ---- cells and periods ----------------------------------------------------- */

typedef struct cell {
    int64_t lo[MAXD], hi[MAXD]; /* hi exclusive */
} cell_t;

typedef struct prover {
    const w16_bound_t *b;
    const w16_map_t *m;
    int64_t budget, used;
    const char *why;  /* set when the proof gives up */
    cell_t *stack;
    int n, made;
    int64_t env[W16_VAR_COUNT];
    /* block sums: the residue mod 4 of the last index of every start */
    int64_t residue;
    /* coord(index(x)) composed and simplified, one tree a coordinate;
     * index(coord(p)) and bit(coord(p)), one tree a storage dimension */
    const w16_expr_t *comp[W16_MAX_COORDS];
    const w16_expr_t *hcomp[MAXD], *hbit;
} prover_t;

static void env_init(const prover_t *pv, aenv_t *e)
{
    for (int i = 0; i < W16_VAR_COUNT; i++) {
        e->lo[i] = e->hi[i] = pv->b->vars[i];
        e->top[i] = false;
        e->d[i] = 0;
    }
}

static void env_set(aenv_t *e, w16_var_t v, const an_t *a)
{
    e->top[v] = a->top;
    e->lo[v] = a->lo;
    e->hi[v] = a->hi;
    e->d[v] = a->known ? a->d : 0;
}

static int slots_of(const prover_t *pv)
{
    return pv->m->sums ? 1 : pv->b->slots;
}

/* ---- coord(index(x)), composed ---------------------------------------------- */

/* The inverse map read at the forward map's place is composed into one
 * expression of the coordinates and simplified with identities of floor
 * division, so that a layout that splits a flat word index into two
 * dimensions (Marlin with 8-bit activations: i1 = aw / W, i2 = aw % W,
 * read back as i1 * W + i2) or packs a tile index next to a local offset
 * ((t * cG + g / 4) * 512 + local, read back through / 512 and % cG)
 * keeps its shift laws. The identities hold for all integers, except
 * where an interval over the domain is used, which holds on the domain. */
typedef struct rw {
    w16_arena_t *arena;
    aenv_t dom; /* the coordinates over the whole domain */
    bool nomem;
} rw_t;

static const w16_expr_t *mk(rw_t *w, w16_op_t op, const w16_expr_t *a,
                            const w16_expr_t *b, int64_t value)
{
    w16_expr_t *n = w16_arena_alloc(w->arena, sizeof *n);
    if (!n) {
        w->nomem = true;
        return NULL;
    }
    n->op = op;
    n->a = a;
    n->b = b;
    n->value = value;
    return n;
}

static bool cval(const w16_expr_t *x, int64_t *v)
{
    if (!x || x->op != W16_OP_CONST)
        return false;
    *v = x->value;
    return true;
}

static bool same_tree(const w16_expr_t *a, const w16_expr_t *b)
{
    if (a == b)
        return true;
    if (!a || !b || a->op != b->op)
        return false;
    if (a->op == W16_OP_CONST)
        return a->value == b->value;
    if (a->op == W16_OP_VAR)
        return a->var == b->var;
    return a->table == b->table && same_tree(a->a, b->a) &&
           same_tree(a->b, b->b) && same_tree(a->c, b->c);
}

/* x with each variable v that map[v] names replaced by map[v]. */
static const w16_expr_t *subst(rw_t *w, const w16_expr_t *x,
                               const w16_expr_t *const *map)
{
    if (!x || w->nomem || x->op == W16_OP_CONST)
        return x;
    if (x->op == W16_OP_VAR)
        return map[x->var] ? map[x->var] : x;
    const w16_expr_t *a = subst(w, x->a, map), *b = subst(w, x->b, map),
                     *c = subst(w, x->c, map);
    if (a == x->a && b == x->b && c == x->c)
        return x;
    w16_expr_t *n = w16_arena_alloc(w->arena, sizeof *n);
    if (!n) {
        w->nomem = true;
        return x;
    }
    *n = *x;
    n->a = a;
    n->b = b;
    n->c = c;
    return n;
}

/* The terms of a chain of additions (at most `max`; -1 if more). */
static int add_terms(const w16_expr_t *x, const w16_expr_t **out, int n,
                     int max)
{
    if (n < 0)
        return n;
    if (x->op == W16_OP_ADD)
        return add_terms(x->b, out, add_terms(x->a, out, n, max), max);
    if (n >= max)
        return -1;
    out[n] = x;
    return n + 1;
}

/* t / c when t is a constant or a product with a constant that c divides;
 * NULL otherwise. */
static const w16_expr_t *div_term(rw_t *w, const w16_expr_t *t, int64_t c)
{
    int64_t v;
    if (cval(t, &v))
        return v % c == 0 ? mk(w, W16_OP_CONST, NULL, NULL, v / c) : NULL;
    if (t->op != W16_OP_MUL)
        return NULL;
    const w16_expr_t *y = NULL;
    if (cval(t->b, &v))
        y = t->a;
    else if (cval(t->a, &v))
        y = t->b;
    if (!y || v % c != 0)
        return NULL;
    return v == c ? y : mk(w, W16_OP_MUL, y, mk(w, W16_OP_CONST, NULL, NULL,
                                                 v / c), 0);
}

static const w16_expr_t *sum_of(rw_t *w, const w16_expr_t **t, int n)
{
    const w16_expr_t *s = NULL;
    for (int i = 0; i < n; i++)
        s = s ? mk(w, W16_OP_ADD, s, t[i], 0) : t[i];
    return s ? s : mk(w, W16_OP_CONST, NULL, NULL, 0);
}

static bool clean_in(const rw_t *w, const w16_expr_t *x, int64_t lo,
                     int64_t hi)
{
    an_t a = an(x, &w->dom);
    return !a.err && !a.top && a.lo >= lo && a.hi <= hi;
}

static const w16_expr_t *simplify(rw_t *w, const w16_expr_t *x);

/* (M + L) / c = M / c + L / c and (M + L) % c = L % c, M the terms c
 * divides; then L / c = 0 and L % c = L when 0 <= L < c on the domain. */
static const w16_expr_t *simplify_div(rw_t *w, const w16_expr_t *x, int64_t c)
{
    const w16_expr_t *t[32], *q[32], *rest[32];
    int n = add_terms(x->a, t, 0, 32), nq = 0, nr = 0;
    if (n < 0)
        return x;
    for (int i = 0; i < n; i++) {
        const w16_expr_t *d = div_term(w, t[i], c);
        /* a term % drops must not hide a failure */
        if (d && (x->op == W16_OP_DIV || !an(t[i], &w->dom).err))
            q[nq++] = d;
        else
            rest[nr++] = t[i];
    }
    const w16_expr_t *l = sum_of(w, rest, nr);
    const w16_expr_t *small = NULL;
    if (clean_in(w, l, 0, c - 1))
        small = x->op == W16_OP_DIV ? mk(w, W16_OP_CONST, NULL, NULL, 0) : l;
    if (!nq && !small)
        return x;
    const w16_expr_t *cc = mk(w, W16_OP_CONST, NULL, NULL, c);
    const w16_expr_t *r = small ? small : mk(w, x->op, l, cc, 0);
    if (x->op == W16_OP_DIV && nq)
        r = mk(w, W16_OP_ADD, sum_of(w, q, nq), r, 0);
    return w->nomem ? x : simplify(w, r);
}

/* X / c * c + X % c = X, in either order of the terms and factors. */
static const w16_expr_t *match_split(const w16_expr_t *p, const w16_expr_t *r)
{
    int64_t c1, c2;
    if (p->op != W16_OP_MUL || r->op != W16_OP_MOD || !cval(r->b, &c2))
        return NULL;
    const w16_expr_t *d = NULL;
    if (cval(p->b, &c1))
        d = p->a;
    else if (cval(p->a, &c1))
        d = p->b;
    if (!d || d->op != W16_OP_DIV || c1 != c2 || c1 <= 0 ||
        !cval(d->b, &c2) || c2 != c1 || !same_tree(d->a, r->a))
        return NULL;
    return r->a;
}

static const w16_expr_t *simplify(rw_t *w, const w16_expr_t *x)
{
    if (!x || w->nomem || x->op == W16_OP_CONST || x->op == W16_OP_VAR)
        return x;
    const w16_expr_t *a = simplify(w, x->a), *b = simplify(w, x->b),
                     *c = simplify(w, x->c);
    if (a != x->a || b != x->b || c != x->c) {
        w16_expr_t *n = w16_arena_alloc(w->arena, sizeof *n);
        if (!n) {
            w->nomem = true;
            return x;
        }
        *n = *x;
        n->a = a;
        n->b = b;
        n->c = c;
        x = n;
    }
    int64_t va, vb;
    switch (x->op) {
    case W16_OP_ADD: {
        if (cval(a, &va) && va == 0)
            return b;
        if (cval(b, &vb) && vb == 0)
            return a;
        const w16_expr_t *m = match_split(a, b);
        return m ? m : (m = match_split(b, a)) ? m : x;
    }
    case W16_OP_MUL:
        if (cval(a, &va) && va == 1)
            return b;
        if (cval(b, &vb) && vb == 1)
            return a;
        return x;
    case W16_OP_DIV: case W16_OP_MOD:
        if (cval(b, &vb) && vb > 0)
            return simplify_div(w, x, vb);
        return x;
    default: return x;
    }
}

/* Builds pv->comp for the current map: coord(index(x)) of each coordinate,
 * the slot being bit / cb (0 for block sums), simplified over the logical
 * domain; and pv->hcomp / pv->hbit: index(coord(p)) and bit(coord(p)) of
 * each place, simplified over the storage. */
static bool compose(prover_t *pv, w16_arena_t *arena)
{
    const w16_map_t *m = pv->m;
    const w16_bound_t *b = pv->b;
    const w16_expr_t *map[W16_VAR_COUNT] = {0};
    rw_t w = {.arena = arena};
    env_init(pv, &w.dom);
    for (int i = 0; i < m->nc; i++) {
        w.dom.lo[m->cvar[i]] = 0;
        w.dom.hi[m->cvar[i]] = m->ext[i] - 1;
    }
    for (int d = 0; d < b->ndim; d++)
        map[W16_VAR_i0 + d] = m->index[d];
    map[W16_VAR_slot] =
        m->sums ? mk(&w, W16_OP_CONST, NULL, NULL, 0)
        : mk(&w, W16_OP_DIV,
             m->bit ? m->bit : mk(&w, W16_OP_CONST, NULL, NULL, 0),
             mk(&w, W16_OP_CONST, NULL, NULL, b->cb), 0);
    for (int j = 0; j < m->nc; j++)
        pv->comp[j] = m->has_coord && m->coord[j]
                          ? simplify(&w, subst(&w, m->coord[j], map))
                          : NULL;
    memset(map, 0, sizeof map);
    env_init(pv, &w.dom);
    for (int d = 0; d < b->ndim; d++) {
        w.dom.lo[W16_VAR_i0 + d] = 0;
        w.dom.hi[W16_VAR_i0 + d] = b->shape[d] - 1;
    }
    w.dom.lo[W16_VAR_slot] = 0;
    w.dom.hi[W16_VAR_slot] = slots_of(pv) - 1;
    for (int j = 0; j < m->nc; j++)
        map[m->cvar[j]] = m->coord[j] ? m->coord[j]
                          : mk(&w, W16_OP_CONST, NULL, NULL, 0);
    for (int d = 0; d < b->ndim && m->has_coord; d++)
        pv->hcomp[d] = simplify(&w, subst(&w, m->index[d], map));
    pv->hbit = m->bit && m->has_coord ? simplify(&w, subst(&w, m->bit, map))
                                      : NULL;
    return !w.nomem;
}

/* Collects why one map expression has no law: 0 fine, else the flags. */
typedef struct verdict {
    bool fail;
    int64_t mult;
    bool split;
} verdict_t;

static void judge(verdict_t *v, const an_t *a, int64_t want)
{
    if (!a->known) {
        v->fail = true;
        v->mult = lcm_cap(v->mult, a->mult);
        v->split |= a->split;
    } else if (a->d != want) {
        v->fail = true; /* a law, but not the one needed: no period */
    }
}

/* The forward map over the coordinate cell c, coordinates shifted by
 * dx[] (by variable): index laws in fi[], bit law in *fb. */
static void an_forward(const prover_t *pv, const cell_t *c,
                       const int64_t *ci_lo, const int64_t *ci_hi,
                       const bool *ci_top, const int64_t *dx, an_t *fi,
                       an_t *fb, aenv_t *env)
{
    const w16_map_t *m = pv->m;
    aenv_t local, *ep = env ? env : &local;
#define e (*ep)
    env_init(pv, &e);
    for (int i = 0; i < m->nc; i++) {
        w16_var_t cv = m->cvar[i];
        if (c) {
            e.lo[cv] = c->lo[i];
            e.hi[cv] = c->hi[i] - 1;
        } else {
            e.lo[cv] = ci_lo[i];
            e.hi[cv] = ci_hi[i];
            e.top[cv] = ci_top[i];
        }
        e.d[cv] = dx[i];
    }
    for (int d = 0; d < pv->b->ndim; d++)
        fi[d] = an(m->index[d], &e);
    *fb = m->bit ? an(m->bit, &e) : an_const(0);
#undef e
}

/* The inverse map over storage intervals si[] (with their shifts) and the
 * slot interval: coordinate laws in out[]. */
static void an_inverse(const prover_t *pv, const an_t *si, const an_t *slot,
                       an_t *out)
{
    const w16_map_t *m = pv->m;
    aenv_t e;
    env_init(pv, &e);
    for (int d = 0; d < pv->b->ndim; d++)
        env_set(&e, (w16_var_t)(W16_VAR_i0 + d), &si[d]);
    env_set(&e, W16_VAR_slot, slot);
    for (int j = 0; j < m->nc; j++)
        out[j] = m->coord[j] ? an(m->coord[j], &e) : an_const(0);
}

enum { PERIOD_OK, PERIOD_SPLIT };

/* The highest index dimension d may take (a block sum owns 4 bytes from
 * its index along the last dimension). */
static int64_t index_top(const prover_t *pv, int d)
{
    return pv->b->shape[d] - 1 -
           (pv->m->sums && d == pv->b->ndim - 1 ? 3 : 0);
}

/* The period of coordinate axis ax in cell c: the smallest P (growing by
 * the divisors' hints) under which the bit does not move, each index
 * dimension either shifts by a constant D[d] (law[d]) or stays inside the
 * shape over the whole cell by interval, and coord(index(x)) shifts by
 * exactly P along ax; P = the cell's width when there is none (the axis is
 * walked whole). */
static int coord_period(const prover_t *pv, const cell_t *c, int ax,
                        int64_t *P_out, int64_t *D, bool *law)
{
    const w16_map_t *m = pv->m;
    int64_t width = c->hi[ax] - c->lo[ax], P = 1;
    for (int d = 0; d < MAXD; d++) {
        D[d] = 0;
        law[d] = true;
    }
    while (width > 1 && P < width) {
        int64_t dx[W16_MAX_COORDS] = {0};
        dx[ax] = P;
        aenv_t e;
        an_t fi[MAXD], fb;
        an_forward(pv, c, NULL, NULL, NULL, dx, fi, &fb, &e);
        verdict_t v = {.mult = 1};
        judge(&v, &fb, 0);
        for (int d = 0; d < pv->b->ndim; d++) {
            law[d] = fi[d].known;
            D[d] = fi[d].known ? fi[d].d : 0;
            if (!fi[d].known && (fi[d].err || fi[d].top || fi[d].lo < 0 ||
                                 fi[d].hi > index_top(pv, d)))
                judge(&v, &fi[d], 0);
        }
        for (int j = 0; j < m->nc && m->has_coord; j++) {
            an_t g = pv->comp[j] ? an(pv->comp[j], &e) : an_const(0);
            judge(&v, &g, j == ax ? P : 0);
        }
        if (!v.fail) {
            *P_out = P;
            return PERIOD_OK;
        }
        if (v.mult > 1) {
            if (P > MULT_CAP / v.mult)
                break;
            P *= v.mult;
            continue;
        }
        if (v.split)
            return PERIOD_SPLIT;
        break;
    }
    for (int d = 0; d < MAXD; d++) {
        D[d] = 0;
        law[d] = true;
    }
    *P_out = width > 1 ? width : 1;
    return PERIOD_OK;
}

/* The period of storage axis ax in storage cell c: shifting the index by Q
 * moves the coordinates read by constants G[j] (so that a place's
 * translates can be told to read padding), and index(coord(p)) by exactly
 * Q along ax with bit(coord(p)) unmoved (so that a place holds its
 * element's code at every translate when it does at one). */
static int store_period(const prover_t *pv, const cell_t *c, int ax,
                        int64_t *Q_out, int64_t *G)
{
    const w16_map_t *m = pv->m;
    int64_t width = c->hi[ax] - c->lo[ax], Q = 1;
    for (int j = 0; j < W16_MAX_COORDS; j++)
        G[j] = 0;
    while (width > 1 && Q < width) {
        aenv_t e;
        env_init(pv, &e);
        for (int d = 0; d < pv->b->ndim; d++) {
            e.lo[W16_VAR_i0 + d] = c->lo[d];
            e.hi[W16_VAR_i0 + d] = c->hi[d] - 1;
        }
        e.d[W16_VAR_i0 + ax] = Q;
        e.lo[W16_VAR_slot] = 0;
        e.hi[W16_VAR_slot] = slots_of(pv) - 1;
        verdict_t v = {.mult = 1};
        an_t cj[W16_MAX_COORDS];
        for (int j = 0; j < m->nc; j++) {
            cj[j] = m->coord[j] ? an(m->coord[j], &e) : an_const(0);
            judge(&v, &cj[j], cj[j].known ? cj[j].d : 0);
        }
        for (int d = 0; d < pv->b->ndim; d++) {
            an_t h = an(pv->hcomp[d], &e);
            judge(&v, &h, d == ax ? Q : 0);
        }
        if (pv->hbit) {
            an_t h = an(pv->hbit, &e);
            judge(&v, &h, 0);
        }
        if (!v.fail) {
            for (int j = 0; j < m->nc; j++)
                G[j] = cj[j].d;
            *Q_out = Q;
            return PERIOD_OK;
        }
        if (v.mult > 1) {
            if (Q > MULT_CAP / v.mult)
                break;
            Q *= v.mult;
            continue;
        }
        if (v.split)
            return PERIOD_SPLIT;
        break;
    }
    *Q_out = width > 1 ? width : 1;
    return PERIOD_OK;
}

static bool push(prover_t *pv, const cell_t *c)
{
    if (pv->made >= MAX_CELLS) {
        pv->why = "the maps' outcomes change in too many places";
        return false;
    }
    pv->stack[pv->n++] = *c;
    pv->made++;
    return true;
}

/* Cuts c in two along ax. */
static bool split_cell(prover_t *pv, const cell_t *c, int ax)
{
    cell_t a = *c, b = *c;
    int64_t mid = c->lo[ax] + (c->hi[ax] - c->lo[ax]) / 2;
    a.hi[ax] = mid;
    b.lo[ax] = mid;
    return push(pv, &b) && push(pv, &a);
}

static bool spend(prover_t *pv, int64_t n)
{
    if (n > pv->budget - pv->used) {
        pv->why = "its representatives exceed the budget";
        return false;
    }
    pv->used += n;
    return true;
}

/* ---- the coordinate side --------------------------------------------------- */

/* Checks the representatives of one coordinate cell with periods P and
 * forward shifts D[d][i]. */
static wna16_status_t walk_coord_cell(prover_t *pv, const cell_t *c,
                                      const int64_t *P,
                                      int64_t D[][W16_MAX_COORDS],
                                      bool law[][W16_MAX_COORDS],
                                      wna16_error_t *err)
{
    const w16_bound_t *b = pv->b;
    const w16_map_t *m = pv->m;
    int nc = m->nc, last = b->ndim - 1;
    int64_t box[W16_MAX_COORDS], count = 1;
    for (int i = 0; i < nc; i++) {
        int64_t w = c->hi[i] - c->lo[i];
        box[i] = P[i] < w ? P[i] : w;
        count *= box[i];
    }
    if (m->sums)
        for (int i = 0; i < nc; i++)
            if (P[i] < c->hi[i] - c->lo[i] && D[last][i] % 4 != 0) {
                pv->why = "the block sums' starts move by steps that are not "
                          "multiples of 4 bytes";
                return WNA16_OK;
            }
    if (!spend(pv, count))
        return WNA16_OK;
    int64_t r[W16_MAX_COORDS] = {0}, x[W16_MAX_COORDS], t[W16_MAX_COORDS];
    int64_t idx[MAXD], bit, back[W16_MAX_COORDS];
    for (int64_t n = 0; n < count; n++) {
        for (int i = 0; i < nc; i++) {
            x[i] = c->lo[i] + r[i];
            t[i] = P[i] < c->hi[i] - c->lo[i] ? (c->hi[i] - 1 - x[i]) / P[i]
                                               : 0;
        }
        wna16_status_t st = w16_map_forward(b, m, pv->env, x, idx, &bit, err);
        if (st != WNA16_OK)
            return st;
        if (!m->sums && (bit < 0 || bit % b->cb != 0 ||
                         bit / b->cb >= b->slots))
            return w16_map_fail_bit(b, x, bit, err);
        for (int d = 0; d < b->ndim; d++) {
            __int128 lo = idx[d], hi = idx[d];
            bool bounded = false; /* inside the shape by interval */
            for (int i = 0; i < nc; i++) {
                if (!law[d][i] && t[i] > 0)
                    bounded = true;
                __int128 s = (__int128)D[d][i] * t[i];
                if (s < 0)
                    lo += s;
                else
                    hi += s;
            }
            /* a sum owns 4 bytes from its index along the last dimension */
            if ((lo >= 0 && hi <= index_top(pv, d)) ||
                (bounded && idx[d] >= 0 && idx[d] <= index_top(pv, d)))
                continue;
            /* the extreme element on the wrong side */
            bool low = lo < 0;
            int64_t y[W16_MAX_COORDS];
            for (int i = 0; i < nc; i++)
                y[i] = x[i] + ((low ? D[d][i] < 0 : D[d][i] > 0)
                                   ? t[i] * P[i] : 0);
            __int128 at = low ? lo : hi;
            return w16_map_fail_shape(b, m, y, d,
                                      at > INT64_MAX ? INT64_MAX
                                      : at < INT64_MIN ? INT64_MIN
                                                       : (int64_t)at, err);
        }
        if (m->sums) {
            int64_t res = w16_floormod(idx[last], 4);
            if (pv->residue < 0)
                pv->residue = res;
            if (res != pv->residue) {
                pv->why = "the block sums' starts do not share one 4-byte "
                          "alignment";
                return WNA16_OK;
            }
        }
        if (m->has_coord) {
            st = w16_map_inverse(b, m, pv->env, idx,
                                 m->sums ? 0 : bit / b->cb, back, x, err);
            if (st != WNA16_OK)
                return st;
            for (int j = 0; j < nc; j++)
                if (back[j] != x[j])
                    return w16_map_fail_inverse(b, m, pv->env, x, back, err);
        }
        for (int i = nc - 1; i >= 0; i--) { /* next representative */
            if (++r[i] < box[i])
                break;
            r[i] = 0;
        }
    }
    return WNA16_OK;
}

static wna16_status_t prove_coords(prover_t *pv, wna16_error_t *err)
{
    const w16_map_t *m = pv->m;
    cell_t all = {{0}, {0}};
    for (int i = 0; i < m->nc; i++)
        all.hi[i] = m->ext[i];
    pv->n = pv->made = 0;
    if (!push(pv, &all))
        return WNA16_OK;
    while (pv->n > 0 && !pv->why) {
        cell_t c = pv->stack[--pv->n];
        int64_t P[W16_MAX_COORDS], D[MAXD][W16_MAX_COORDS];
        bool law[MAXD][W16_MAX_COORDS];
        int cut = -1;
        for (int i = 0; i < m->nc && cut < 0; i++) {
            int64_t Di[MAXD];
            bool li[MAXD];
            if (coord_period(pv, &c, i, &P[i], Di, li) == PERIOD_SPLIT)
                cut = i;
            for (int d = 0; d < MAXD; d++) {
                D[d][i] = Di[d];
                law[d][i] = li[d];
            }
        }
        if (cut >= 0) {
            if (!split_cell(pv, &c, cut))
                return WNA16_OK;
            continue;
        }
        wna16_status_t st = walk_coord_cell(pv, &c, P, D, law, err);
        if (st != WNA16_OK)
            return st;
    }
    return WNA16_OK;
}

/* ---- the storage side ------------------------------------------------------ */

static int64_t flat_of(const w16_bound_t *b, const int64_t *idx)
{
    int64_t flat = 0;
    for (int d = 0; d < b->ndim; d++)
        flat = flat * b->shape[d] + idx[d];
    return flat;
}

/* Can no translate x + sum_d s_d G[.][d] (0 <= s_d <= smax_d) claim an
 * element? Decided per coordinate by its range over the translates. */
static bool never_claims(const prover_t *pv, const int64_t *x,
                         int64_t G[][MAXD], const int64_t *smax)
{
    const w16_map_t *m = pv->m;
    for (int j = 0; j < m->nc; j++) {
        if (m->sums && j != 1)
            continue;
        __int128 lo = x[j], hi = x[j];
        for (int d = 0; d < pv->b->ndim; d++) {
            __int128 s = (__int128)G[j][d] * smax[d];
            if (s < 0)
                lo += s;
            else
                hi += s;
        }
        if (hi < 0 || (!m->sums && lo >= m->ext[j]))
            return true;
    }
    return false;
}

/* The places of one storage cell: each place whose inverse claims an
 * element must be that element's place, at the representative and (by the
 * period) at its translates. */
static wna16_status_t walk_store_cell(prover_t *pv, const cell_t *c,
                                      const int64_t *Q, int64_t G[][MAXD],
                                      wna16_error_t *err)
{
    const w16_bound_t *b = pv->b;
    const w16_map_t *m = pv->m;
    int nd = b->ndim, ns = slots_of(pv);
    int64_t box[MAXD], count = ns;
    for (int d = 0; d < nd; d++) {
        int64_t w = c->hi[d] - c->lo[d];
        box[d] = Q[d] < w ? Q[d] : w;
        count *= box[d];
    }
    if (!spend(pv, count))
        return WNA16_OK;
    int64_t r[MAXD] = {0}, idx[MAXD], smax[MAXD], at[MAXD], bit;
    int64_t x[W16_MAX_COORDS];
    for (int64_t n = 0; n < count; n += ns) {
        for (int d = 0; d < nd; d++) {
            idx[d] = c->lo[d] + r[d];
            smax[d] = Q[d] < c->hi[d] - c->lo[d]
                          ? (c->hi[d] - 1 - idx[d]) / Q[d] : 0;
        }
        int64_t flat = flat_of(b, idx);
        for (int slot = 0; slot < ns; slot++) {
            wna16_status_t st = w16_map_inverse(b, m, pv->env, idx, slot, x,
                                                NULL, err);
            if (st != WNA16_OK)
                return st;
            wna16_error_t scratch = {0};
            bool back = w16_map_forward(b, m, pv->env, x, at, &bit,
                                        &scratch) == WNA16_OK &&
                        bit == (m->sums ? 0 : (int64_t)slot * b->cb);
            for (int d = 0; back && d < nd; d++)
                back = at[d] == idx[d];
            bool domain = true;
            for (int j = 0; j < m->nc; j++)
                domain = domain && x[j] >= 0 && x[j] < m->ext[j];
            if (back && domain)
                continue; /* an element's own place, at every translate */
            if (w16_map_inside(m, x))
                return w16_map_fail_claim(b, m, flat, slot, x, err);
            if (back)
                continue; /* padding, and F(coord(p)) = p at every translate */
            if (never_claims(pv, x, G, smax))
                continue;
            /* some translate may claim an element it does not hold: look */
            int64_t tr = 1, s[MAXD] = {0};
            for (int d = 0; d < nd; d++)
                tr *= smax[d] + 1;
            if (tr > MAX_ENUM || !spend(pv, tr)) {
                pv->why = "a padding place's translates cannot be told apart";
                return WNA16_OK;
            }
            for (int64_t k = 0; k < tr; k++) {
                int64_t y[W16_MAX_COORDS], p[MAXD];
                for (int j = 0; j < m->nc; j++) {
                    uint64_t u = (uint64_t)x[j]; /* wraps like the maps */
                    for (int d = 0; d < nd; d++)
                        u += (uint64_t)G[j][d] * (uint64_t)s[d];
                    y[j] = (int64_t)u;
                }
                for (int d = 0; d < nd; d++)
                    p[d] = idx[d] + s[d] * Q[d];
                if (w16_map_inside(m, y))
                    return w16_map_fail_claim(b, m, flat_of(b, p), slot, y,
                                              err);
                for (int d = nd - 1; d >= 0; d--) {
                    if (++s[d] <= smax[d])
                        break;
                    s[d] = 0;
                }
            }
        }
        for (int d = nd - 1; d >= 0; d--) {
            if (++r[d] < box[d])
                break;
            r[d] = 0;
        }
    }
    return WNA16_OK;
}

/* Does every place of storage cell c read as padding, by interval? */
static bool all_padding(const prover_t *pv, const an_t *ci)
{
    const w16_map_t *m = pv->m;
    bool out = false;
    for (int j = 0; j < m->nc; j++) {
        if (ci[j].err)
            return false;
        if (ci[j].top || (m->sums && j != 1))
            continue;
        out = out || ci[j].hi < 0 || (!m->sums && ci[j].lo >= m->ext[j]);
    }
    return out;
}

/* The coordinates' intervals over storage cell c. */
static void cell_coords(const prover_t *pv, const cell_t *c, an_t *ci)
{
    an_t si[MAXD], slot;
    for (int d = 0; d < pv->b->ndim; d++) {
        si[d] = (an_t){.mult = 1, .known = true};
        set_iv(&si[d], c->lo[d], c->hi[d] - 1);
    }
    slot = (an_t){.mult = 1, .known = true};
    set_iv(&slot, 0, slots_of(pv) - 1);
    an_inverse(pv, si, &slot, ci);
}

/* Does every place of the cell read an element, by interval? */
static bool all_inside(const prover_t *pv, const an_t *ci)
{
    for (int j = 0; j < pv->m->nc; j++)
        if (ci[j].err || ci[j].top || ci[j].lo < 0 ||
            ci[j].hi >= pv->m->ext[j])
            return false;
    return true;
}

/* 1 padding whole, 2 elements whole, 0 mixed. */
static int cell_kind(const prover_t *pv, const cell_t *c)
{
    an_t ci[W16_MAX_COORDS];
    cell_coords(pv, c, ci);
    return all_padding(pv, ci) ? 1 : all_inside(pv, ci) ? 2 : 0;
}

/* The storage side by counting (codes only): cut the storage into cells
 * that read as padding whole or as elements whole; when the latter hold
 * exactly as many places as there are elements, those places are the
 * elements' own (the coordinate side proved the elements' places
 * distinct, and no element lies where the inverse reads padding), so the
 * rest is padding. */
static bool count_places(prover_t *pv)
{
    const w16_bound_t *b = pv->b;
    int64_t elements = 1, inside = 0;
    for (int i = 0; i < pv->m->nc; i++)
        elements *= pv->m->ext[i];
    cell_t all = {{0}, {0}};
    for (int d = 0; d < b->ndim; d++)
        all.hi[d] = b->shape[d];
    pv->n = pv->made = 0;
    if (!push(pv, &all))
        return false;
    while (pv->n > 0) {
        cell_t c = pv->stack[--pv->n];
        int kind = cell_kind(pv, &c);
        if (kind) {
            if (kind == 2) {
                int64_t places = slots_of(pv);
                for (int d = 0; d < b->ndim; d++)
                    places *= c.hi[d] - c.lo[d];
                inside += places;
            }
            continue;
        }
        /* cut where a half becomes whole, else along the widest axis */
        int axis = -1;
        int64_t widest = 1;
        for (int d = 0; d < b->ndim; d++) {
            int64_t w = c.hi[d] - c.lo[d];
            if (w <= 1)
                continue;
            cell_t h = c;
            h.hi[d] = c.lo[d] + w / 2;
            cell_t k = c;
            k.lo[d] = h.hi[d];
            if (cell_kind(pv, &h) || cell_kind(pv, &k)) {
                axis = d;
                break;
            }
            if (w > widest) {
                widest = w;
                axis = d;
            }
        }
        if (axis < 0 || pv->made >= MAX_CELLS / 4 ||
            !split_cell(pv, &c, axis)) {
            pv->why = NULL; /* push() may have said why: not a failure here */
            return false;
        }
    }
    return inside == elements;
}

static wna16_status_t prove_store(prover_t *pv, wna16_error_t *err)
{
    const w16_bound_t *b = pv->b;
    cell_t all = {{0}, {0}};
    for (int d = 0; d < b->ndim; d++)
        all.hi[d] = b->shape[d];
    pv->n = pv->made = 0;
    if (!push(pv, &all))
        return WNA16_OK;
    while (pv->n > 0 && !pv->why) {
        cell_t c = pv->stack[--pv->n];
        an_t si[MAXD], slot, ci[W16_MAX_COORDS];
        for (int d = 0; d < b->ndim; d++) {
            si[d] = (an_t){.mult = 1, .known = true};
            set_iv(&si[d], c.lo[d], c.hi[d] - 1);
        }
        slot = (an_t){.mult = 1, .known = true};
        set_iv(&slot, 0, slots_of(pv) - 1);
        an_inverse(pv, si, &slot, ci);
        if (all_padding(pv, ci))
            continue;
        int64_t Q[MAXD], G[W16_MAX_COORDS][MAXD];
        int cut = -1;
        for (int d = 0; d < b->ndim && cut < 0; d++) {
            int64_t Gd[W16_MAX_COORDS];
            if (store_period(pv, &c, d, &Q[d], Gd) == PERIOD_SPLIT)
                cut = d;
            for (int j = 0; j < W16_MAX_COORDS; j++)
                G[j][d] = Gd[j];
        }
        if (cut >= 0) {
            if (!split_cell(pv, &c, cut))
                return WNA16_OK;
            continue;
        }
        wna16_status_t st = walk_store_cell(pv, &c, Q, G, err);
        if (st != WNA16_OK)
            return st;
    }
    return WNA16_OK;
}

/* ---- block sums against the codes ----------------------------------------- */

/* Every byte any sum can occupy reads as padding through the codes'
 * inverse map (the storage box the sums reach, by interval). */
static bool sums_clear_of_codes(prover_t *pv)
{
    const w16_bound_t *b = pv->b;
    prover_t sp = *pv;
    sp.m = &b->sums;
    an_t fi[MAXD], fb, si[MAXD], slot, ci[W16_MAX_COORDS];
    int64_t dx[W16_MAX_COORDS] = {0};
    cell_t all = {{0}, {0}};
    for (int i = 0; i < 3; i++)
        all.hi[i] = b->sums.ext[i];
    an_forward(&sp, &all, NULL, NULL, NULL, dx, fi, &fb, NULL);
    for (int d = 0; d < b->ndim; d++) {
        if (fi[d].top || fi[d].err)
            return false;
        si[d] = (an_t){.mult = 1, .known = true};
        set_iv(&si[d], fi[d].lo, fi[d].hi + (d == b->ndim - 1 ? 3 : 0));
    }
    slot = (an_t){.mult = 1, .known = true};
    set_iv(&slot, 0, b->slots - 1);
    prover_t cp = *pv;
    cp.m = &b->codes;
    an_inverse(&cp, si, &slot, ci);
    return all_padding(&cp, ci);
}

wna16_status_t w16_bound_prove(const w16_bound_t *b, int64_t budget,
                               bool *proved, const char **why,
                               w16_check_stats_t *stats, wna16_error_t *err)
{
    *proved = false;
    *why = NULL;
    prover_t pv = {.b = b, .m = &b->codes, .budget = budget, .residue = -1};
    pv.stack = malloc(sizeof *pv.stack * MAX_CELLS);
    if (!pv.stack)
        return w16_err_nomem(err, "proving a layout");
    memcpy(pv.env, b->vars, sizeof pv.env);
    w16_arena_t arena;
    w16_arena_init(&arena, b->spec->ctx);
    wna16_status_t st = compose(&pv, &arena) ? prove_coords(&pv, err)
                        : w16_err_nomem(err, "proving a layout");
    /* The inverse reads every element back from its place, so the
     * elements fill distinct places: when there are exactly as many places
     * as elements, every place is an element's and none is padding. */
    int64_t elements = 1;
    for (int i = 0; i < b->codes.nc; i++)
        elements *= b->codes.ext[i];
    if (st == WNA16_OK && !pv.why &&
        (elements == b->elems * b->slots || count_places(&pv)))
        goto sums;
    if (st == WNA16_OK && !pv.why)
        st = prove_store(&pv, err);
sums:
    if (st == WNA16_OK && !pv.why && b->has_sums) {
        if (!b->sums.has_coord) {
            pv.why = "block sums without sums.coord cannot be proved apart";
        } else {
            pv.m = &b->sums;
            st = compose(&pv, &arena) ? prove_coords(&pv, err)
                 : w16_err_nomem(err, "proving a layout");
            if (st == WNA16_OK && !pv.why)
                st = prove_store(&pv, err);
            if (st == WNA16_OK && !pv.why && !sums_clear_of_codes(&pv))
                pv.why = "the block sums' bytes are not shown clear of the "
                         "codes";
        }
    }
    free(pv.stack);
    w16_arena_free(&arena);
    if (stats)
        stats->evaluated += pv.used;
    if (st != WNA16_OK)
        return st;
    *proved = !pv.why;
    *why = pv.why;
    if (stats && *proved)
        stats->proved++;
    return WNA16_OK;
}
