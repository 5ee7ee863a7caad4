/*
 * lower_expr.c - spec expressions to kernel IR (see lower_expr.h). Every
 * node is lowered together with its value range; the ranges only ever pick
 * a cheaper but equivalent form, so a wrong range could cost speed but the
 * forms chosen are exact for every value inside it. The IR it emits goes
 * through the folding, fact-aware helpers of lower_arith.c, which never
 * call back into this file.
 */
#include "gen/lower_expr.h"

#include <stdio.h>
#include <string.h>

/* ---- ranges -------------------------------------------------------------- */

static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return a > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return ((a < 0) != (b < 0)) ? INT64_MIN : INT64_MAX;
    return r;
}

static w16_range_t rng(int64_t lo, int64_t hi) { return (w16_range_t){lo, hi}; }
static const w16_range_t full = {INT64_MIN, INT64_MAX};

static w16_range_t range_mul(w16_range_t a, w16_range_t b)
{
    int64_t c[4] = {sat_mul(a.lo, b.lo), sat_mul(a.lo, b.hi),
                    sat_mul(a.hi, b.lo), sat_mul(a.hi, b.hi)};
    w16_range_t r = {c[0], c[0]};
    for (int i = 1; i < 4; i++) {
        if (c[i] < r.lo) r.lo = c[i];
        if (c[i] > r.hi) r.hi = c[i];
    }
    return r;
}

/* ---- lowering ------------------------------------------------------------ */

void w16_lower_init(w16_lower_t *L, kir_kernel_t *k)
{
    memset(L, 0, sizeof *L);
    L->k = k;
    for (int i = 0; i < W16_VAR_COUNT; i++)
        L->range[i] = full;
}

void w16_lower_clear_vars(w16_lower_t *L)
{
    for (int i = 0; i < W16_VAR_COUNT; i++) {
        L->var[i] = NULL;
        L->range[i] = full;
    }
}

void w16_lower_bind(w16_lower_t *L, w16_var_t v, const kir_expr_t *value,
                    int64_t lo, int64_t hi)
{
    L->var[v] = value;
    L->range[v] = rng(lo, hi);
}

static const kir_expr_t *lfail(w16_lower_t *L, const char *why)
{
    if (!L->failure)
        L->failure = why;
    return NULL;
}

static const kir_ctable_t *table_for(w16_lower_t *L, const w16_table_t *t,
                                     w16_range_t *vals)
{
    vals->lo = vals->hi = t->values[0];
    for (int i = 1; i < t->len; i++) {
        if (t->values[i] < vals->lo) vals->lo = t->values[i];
        if (t->values[i] > vals->hi) vals->hi = t->values[i];
    }
    for (int i = 0; i < L->n_tables; i++)
        if (L->spec_tables[i] == t)
            return L->tables[i];
    if (L->n_tables == 32)
        return NULL;
    char name[80];
    snprintf(name, sizeof name, "table%d", L->n_tables);
    const kir_ctable_t *c = kir_ctable(L->k, name, KIR_I64, t->values, t->len);
    if (c) {
        L->spec_tables[L->n_tables] = t;
        L->tables[L->n_tables++] = c;
    }
    return c;
}

static const kir_expr_t *bool_to_i64(kir_kernel_t *k, const kir_expr_t *b)
{
    int64_t v;
    if (b && b->op == KIR_OP_CONST && b->type == KIR_I1) {
        v = b->ival;
        return w16_ir_const(k, v);
    }
    return kir_int_cast(k, KIR_I64, b, false);
}

static const kir_expr_t *nonzero(kir_kernel_t *k, const kir_expr_t *a,
                                 w16_range_t ra)
{
    if (ra.lo > 0 || ra.hi < 0)
        return kir_const(k, KIR_I1, 1);
    if (ra.lo == 0 && ra.hi == 0)
        return kir_const(k, KIR_I1, 0);
    /* comparisons lowered earlier come back as zext(i1): look through */
    if (a->op == KIR_OP_ZEXT && a->a->type == KIR_I1)
        return a->a;
    return kir_bin(k, KIR_OP_NE, a, w16_ir_const(k, 0));
}

/* Comparison with range-decided outcomes folded. */
static const kir_expr_t *compare(w16_lower_t *L, w16_op_t op,
                                 const kir_expr_t *a, w16_range_t ra,
                                 const kir_expr_t *b, w16_range_t rb,
                                 w16_range_t *r)
{
    kir_kernel_t *k = L->k;
    int decided = -1; /* 0 false, 1 true */
    switch (op) {
    case W16_OP_LT:
        if (ra.hi < rb.lo) decided = 1;
        else if (ra.lo >= rb.hi) decided = 0;
        break;
    case W16_OP_LE:
        if (ra.hi <= rb.lo) decided = 1;
        else if (ra.lo > rb.hi) decided = 0;
        break;
    case W16_OP_GT:
        if (ra.lo > rb.hi) decided = 1;
        else if (ra.hi <= rb.lo) decided = 0;
        break;
    case W16_OP_GE:
        if (ra.lo >= rb.hi) decided = 1;
        else if (ra.hi < rb.lo) decided = 0;
        break;
    case W16_OP_EQ:
    case W16_OP_NE:
        if (ra.hi < rb.lo || rb.hi < ra.lo)
            decided = op == W16_OP_NE;
        else if (ra.lo == ra.hi && rb.lo == rb.hi)
            decided = (ra.lo == rb.lo) == (op == W16_OP_EQ);
        break;
    default:
        break;
    }
    *r = rng(0, 1);
    if (decided >= 0) {
        *r = rng(decided, decided);
        return w16_ir_const(k, decided);
    }
    /* an ordering against a constant: as a >= c, which sees alignments */
    bool ka = ra.lo == ra.hi, kb = rb.lo == rb.hi;
    if ((ka != kb) && op != W16_OP_EQ && op != W16_OP_NE) {
        const kir_expr_t *x = kb ? a : b;
        int64_t c = kb ? rb.lo : ra.lo;
        /* x OP c or c OP x as "x >= t", negated or not */
        bool up = kb ? (op == W16_OP_GT || op == W16_OP_LE)
                     : (op == W16_OP_LT || op == W16_OP_GE);
        bool neg = kb ? (op == W16_OP_LT || op == W16_OP_LE)
                      : (op == W16_OP_GT || op == W16_OP_GE);
        if (!(up && c == INT64_MAX)) {
            const kir_expr_t *ge = w16_ir_ge(L, x, up ? c + 1 : c);
            if (ge && ge->op == KIR_OP_CONST) {
                int64_t v = neg ? !ge->ival : ge->ival;
                *r = rng(v, v);
                return w16_ir_const(k, v);
            }
            return bool_to_i64(k, neg ? kir_un(k, KIR_OP_NOT, ge) : ge);
        }
    }
    static const struct { w16_op_t s; kir_op_t k; bool swap; } map[] = {
        {W16_OP_LT, KIR_OP_SLT, false}, {W16_OP_LE, KIR_OP_SLE, false},
        {W16_OP_GT, KIR_OP_SLT, true},  {W16_OP_GE, KIR_OP_SLE, true},
        {W16_OP_EQ, KIR_OP_EQ, false},  {W16_OP_NE, KIR_OP_NE, false}};
    for (size_t i = 0; i < W16_ARRAY_LEN(map); i++)
        if (map[i].s == op)
            return bool_to_i64(k, map[i].swap ? kir_bin(k, map[i].k, b, a)
                                              : kir_bin(k, map[i].k, a, b));
    return lfail(L, "internal: unknown comparison");
}

static const kir_expr_t *lower(w16_lower_t *L, const w16_expr_t *x,
                               w16_range_t *r);

static const kir_expr_t *lower_div(w16_lower_t *L, const w16_expr_t *x,
                                   const kir_expr_t *a, w16_range_t ra,
                                   const kir_expr_t *b, w16_range_t rb,
                                   w16_range_t *r)
{
    kir_kernel_t *k = L->k;
    int64_t d;
    if (!w16_ir_is_const(b, &d) || d <= 0)
        return lfail(L, "division by a value that is not a positive constant "
                        "after specialization");
    switch (x->op) {
    case W16_OP_DIV:
        *r = rng(w16_floordiv(ra.lo, d), w16_floordiv(ra.hi, d));
        return w16_ir_floordiv(L, a, d, ra);
    case W16_OP_MOD:
        *r = (ra.lo >= 0 && ra.hi < d) ? ra : rng(0, d - 1);
        return w16_ir_floormod(L, a, d, ra);
    case W16_OP_CDIV:
    case W16_OP_ROUND_UP: {
        w16_range_t ra2 = rng(sat_add(ra.lo, d - 1), sat_add(ra.hi, d - 1));
        const kir_expr_t *q = w16_ir_floordiv(
            L, w16_ir_add(k, a, w16_ir_const(k, d - 1)), d, ra2);
        *r = rng(w16_floordiv(ra2.lo, d), w16_floordiv(ra2.hi, d));
        if (x->op == W16_OP_CDIV)
            return q;
        *r = range_mul(*r, rng(d, d));
        return w16_ir_mul(k, q, w16_ir_const(k, d));
    }
    default:
        (void)rb;
        return lfail(L, "internal: not a division");
    }
}

/* For a condition "v OP c" (v a bound variable, c a constant): v's range
 * where it holds (*rt) and where it does not (*rf). */
static bool cond_ranges(const w16_lower_t *L, const w16_expr_t *x,
                        w16_var_t *v, w16_range_t *rt, w16_range_t *rf)
{
    if (x->op < W16_OP_LT || x->op > W16_OP_GE)
        return false;
    w16_op_t op = x->op;
    const w16_expr_t *var = x->a, *con = x->b;
    if (var->op == W16_OP_CONST && con->op == W16_OP_VAR) {
        var = x->b; /* c OP v  is  v OP' c */
        con = x->a;
        static const w16_op_t mirror[] = {W16_OP_GT, W16_OP_GE, W16_OP_LT, W16_OP_LE};
        op = mirror[op - W16_OP_LT];
    }
    if (var->op != W16_OP_VAR || con->op != W16_OP_CONST || !L->var[var->var])
        return false;
    int64_t c = con->value;
    w16_range_t r = L->range[var->var];
    /* as "v >= t" true or false */
    int64_t t;
    bool ge = op == W16_OP_GE || op == W16_OP_GT;
    if (op == W16_OP_GT || op == W16_OP_LE) {
        if (c == INT64_MAX)
            return false;
        t = c + 1;
    } else {
        t = c;
    }
    w16_range_t hi = {r.lo > t ? r.lo : t, r.hi}, lo = {r.lo, r.hi < t - 1 ? r.hi : t - 1};
    if (hi.lo > hi.hi || lo.lo > lo.hi)
        return false; /* decided: the lowering folds it */
    *v = var->var;
    *rt = ge ? hi : lo;
    *rf = ge ? lo : hi;
    return true;
}

/* a ? b : c, each arm lowered knowing the outcome of a simple condition.
 * Both arms are evaluated (a select); table lookups in them clamp. */
static const kir_expr_t *lower_cond(w16_lower_t *L, const w16_expr_t *x,
                                    w16_range_t *r)
{
    w16_range_t ra, rb, rc;
    const kir_expr_t *a = lower(L, x->a, &ra);
    if (!a)
        return NULL;
    const kir_expr_t *p = nonzero(L->k, a, ra);
    if (p && p->op == KIR_OP_CONST)
        return lower(L, p->ival ? x->b : x->c, r);
    w16_var_t v = W16_VAR_COUNT;
    w16_range_t rt, rf, saved = full;
    bool refine = cond_ranges(L, x->a, &v, &rt, &rf);
    if (refine)
        saved = L->range[v];
    L->arms++;
    if (refine)
        L->range[v] = rt;
    const kir_expr_t *b = lower(L, x->b, &rb);
    if (refine)
        L->range[v] = rf;
    const kir_expr_t *c = b ? lower(L, x->c, &rc) : NULL;
    if (refine)
        L->range[v] = saved;
    L->arms--;
    if (!c)
        return NULL;
    *r = rng(rb.lo < rc.lo ? rb.lo : rc.lo, rb.hi > rc.hi ? rb.hi : rc.hi);
    return kir_select(L->k, p, b, c);
}

static const kir_expr_t *lower(w16_lower_t *L, const w16_expr_t *x,
                               w16_range_t *r)
{
    kir_kernel_t *k = L->k;
    w16_range_t ra = full, rb = full, rc = full;
    const kir_expr_t *a = NULL, *b = NULL, *c = NULL;
    switch (x->op) {
    case W16_OP_CONST:
        *r = rng(x->value, x->value);
        return w16_ir_const(k, x->value);
    case W16_OP_VAR:
        if (!L->var[x->var]) {
            snprintf(L->failbuf, sizeof L->failbuf, "variable %s is not "
                     "available here", w16_var_name(x->var));
            return lfail(L, L->failbuf);
        }
        *r = L->range[x->var];
        return L->var[x->var];
    case W16_OP_COND:
        return lower_cond(L, x, r);
    default:
        break;
    }
    if (x->a && !(a = lower(L, x->a, &ra)))
        return NULL;
    if (x->b && !(b = lower(L, x->b, &rb)))
        return NULL;
    if (x->c && !(c = lower(L, x->c, &rc)))
        return NULL;
    *r = full;
    switch (x->op) {
    case W16_OP_TABLE: {
        w16_range_t vals;
        const kir_ctable_t *t = table_for(L, x->table, &vals);
        if (!t)
            return lfail(L, "too many tables in one kernel");
        int64_t i;
        if (w16_ir_is_const(a, &i)) {
            if (i < 0 || i >= t->count)
                return lfail(L, "constant table index out of range");
            *r = rng(t->values[i], t->values[i]);
            return w16_ir_const(k, t->values[i]);
        }
        *r = vals;
        /* Padding slots may compute indices outside the table, and so may
         * the arm of a condition that is not taken (its ranges assume it
         * is): clamp. */
        if (ra.lo < 0 || L->arms)
            a = kir_bin(k, KIR_OP_SMAX, a, w16_ir_const(k, 0));
        if (ra.hi >= t->count || L->arms)
            a = kir_bin(k, KIR_OP_SMIN, a, w16_ir_const(k, t->count - 1));
        return kir_ctload(k, t, a);
    }
    case W16_OP_NEG:
        *r = rng(ra.hi == INT64_MIN ? INT64_MAX : -ra.hi,
                 ra.lo == INT64_MIN ? INT64_MAX : -ra.lo);
        return w16_ir_sub(k, w16_ir_const(k, 0), a);
    case W16_OP_NOT:
        *r = rng(0, 1);
        return bool_to_i64(k, kir_un(k, KIR_OP_NOT, nonzero(k, a, ra)));
    case W16_OP_BNOT:
        *r = rng(~ra.hi, ~ra.lo);
        return kir_bin(k, KIR_OP_XOR, a, w16_ir_const(k, -1));
    case W16_OP_ADD:
        *r = rng(sat_add(ra.lo, rb.lo), sat_add(ra.hi, rb.hi));
        return w16_ir_add(k, a, b);
    case W16_OP_SUB:
        *r = rng(ra.lo == INT64_MIN || rb.hi == INT64_MAX ? INT64_MIN
                                                         : sat_add(ra.lo, -rb.hi),
                 rb.lo == INT64_MIN ? INT64_MAX : sat_add(ra.hi, -rb.lo));
        return w16_ir_sub(k, a, b);
    case W16_OP_MUL:
        *r = range_mul(ra, rb);
        return w16_ir_mul(k, a, b);
    case W16_OP_DIV: case W16_OP_MOD: case W16_OP_CDIV: case W16_OP_ROUND_UP:
        return lower_div(L, x, a, ra, b, rb, r);
    case W16_OP_SHL: case W16_OP_SHR: {
        int64_t s;
        if (!w16_ir_is_const(b, &s) || s < 0 || s > 63)
            return lfail(L, "shift by a value that is not a constant in "
                            "[0, 63] after specialization");
        if (s == 0) {
            *r = ra;
            return a;
        }
        if (x->op == W16_OP_SHL) {
            *r = range_mul(ra, rng(INT64_C(1) << s, INT64_C(1) << s));
            return kir_bin(k, KIR_OP_SHL, a, b);
        }
        *r = rng(ra.lo >> s, ra.hi >> s);
        return kir_bin(k, KIR_OP_ASHR, a, b);
    }
    case W16_OP_AND:
        if (ra.lo >= 0 || rb.lo >= 0)
            *r = rng(0, ra.lo >= 0 && rb.lo >= 0 ? (ra.hi < rb.hi ? ra.hi : rb.hi)
                                                 : (ra.lo >= 0 ? ra.hi : rb.hi));
        return kir_bin(k, KIR_OP_AND, a, b);
    case W16_OP_OR:
    case W16_OP_XOR:
        if (ra.lo >= 0 && rb.lo >= 0) {
            int64_t m = ra.hi > rb.hi ? ra.hi : rb.hi;
            int bits = m ? 64 - __builtin_clzll((uint64_t)m) : 0;
            *r = rng(0, bits >= 63 ? INT64_MAX : (INT64_C(1) << bits) - 1);
        }
        return kir_bin(k, x->op == W16_OP_OR ? KIR_OP_OR : KIR_OP_XOR, a, b);
    case W16_OP_EQ: case W16_OP_NE: case W16_OP_LT: case W16_OP_LE:
    case W16_OP_GT: case W16_OP_GE:
        return compare(L, x->op, a, ra, b, rb, r);
    case W16_OP_LAND:
    case W16_OP_LOR: {
        const kir_expr_t *p = nonzero(k, a, ra), *q = nonzero(k, b, rb);
        *r = rng(0, 1);
        return bool_to_i64(k, kir_bin(k, x->op == W16_OP_LAND ? KIR_OP_AND
                                                                : KIR_OP_OR,
                                      p, q));
    }
    case W16_OP_MIN:
        *r = rng(ra.lo < rb.lo ? ra.lo : rb.lo, ra.hi < rb.hi ? ra.hi : rb.hi);
        if (ra.hi <= rb.lo)
            return a;
        if (rb.hi <= ra.lo)
            return b;
        return kir_bin(k, KIR_OP_SMIN, a, b);
    case W16_OP_MAX:
        *r = rng(ra.lo > rb.lo ? ra.lo : rb.lo, ra.hi > rb.hi ? ra.hi : rb.hi);
        if (ra.lo >= rb.hi)
            return a;
        if (rb.lo >= ra.hi)
            return b;
        return kir_bin(k, KIR_OP_SMAX, a, b);
    case W16_OP_GCD:
    case W16_OP_LCM:
        return lfail(L, "gcd/lcm of values that are not constants after "
                        "specialization");
    default:
        return lfail(L, "internal: unknown operator");
    }
}

const kir_expr_t *w16_lower(w16_lower_t *L, const w16_expr_t *x,
                            w16_range_t *r)
{
    w16_range_t dummy;
    const kir_expr_t *e = lower(L, x, r ? r : &dummy);
    if (!e && !L->failure)
        L->failure = "out of memory";
    return e;
}
