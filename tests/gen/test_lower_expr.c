/*
 * test_lower_expr.c - the index lowering's rewrites against plain integer
 * arithmetic. Expressions shaped like the repack builder's (a group-only
 * part plus a lane part, let-bound, multiplied, offset, negative) go
 * through the alignment-aware division, modulo and comparison helpers and
 * the 32-bit narrowing; a small evaluator of the kernel IR computes the
 * results for random (group, lane) pairs, which must equal the C values,
 * lie within the facts the lowering claims, and (where the rewrite is the
 * point) not depend on the lane.
 */
#include "testutil.h"
#include "gen/lower_expr.h"

#include <stdlib.h>
#include <string.h>

enum { LANES = 256, GROUPS = 12 * 128 * 32 };

/* ---- a kernel IR evaluator (integers only) ------------------------------- */

typedef struct env {
    const kir_kernel_t *k;
    uint64_t vars[256];
    int64_t group, lane;
} env_t;

static uint64_t mask(kir_type_t t, uint64_t v)
{
    int b = kir_type_bits(t);
    return b >= 64 ? v : v & ((UINT64_C(1) << b) - 1);
}

static int64_t sext(kir_type_t t, uint64_t v)
{
    int b = kir_type_bits(t);
    if (b >= 64)
        return (int64_t)v;
    uint64_t sign = UINT64_C(1) << (b - 1);
    return (int64_t)((mask(t, v) ^ sign) - sign);
}

static uint64_t eval(env_t *E, const kir_expr_t *e)
{
    uint64_t a = 0, b = 0;
    switch (e->op) {
    case KIR_OP_CONST: return mask(e->type, (uint64_t)e->ival);
    case KIR_OP_VAR: return E->vars[e->var->index];
    case KIR_OP_GROUP_ID: return (uint64_t)E->group;
    case KIR_OP_LANE_ID: return (uint64_t)E->lane;
    case KIR_OP_CTLOAD: return mask(e->type, (uint64_t)e->ctable->values[eval(E, e->a)]);
    case KIR_OP_SELECT: return eval(E, e->a) ? eval(E, e->b) : eval(E, e->c);
    default: break;
    }
    a = eval(E, e->a);
    if (kir_op_arity(e->op) == 1) {
        switch (e->op) {
        case KIR_OP_ZEXT: return mask(e->a->type, a);
        case KIR_OP_SEXT: return mask(e->type, (uint64_t)sext(e->a->type, a));
        case KIR_OP_TRUNC: return mask(e->type, a);
        case KIR_OP_NOT: return mask(e->type, ~a);
        case KIR_OP_NEG: return mask(e->type, 0 - a);
        default: break;
        }
        TU_CHECK_MSG(0, "evaluator: unary %s", kir_op_name(e->op));
        return 0;
    }
    b = eval(E, e->b);
    kir_type_t t = e->a->type;
    int64_t sa = sext(t, a), sb = sext(t, b);
    switch (e->op) {
    case KIR_OP_ADD: return mask(t, a + b);
    case KIR_OP_SUB: return mask(t, a - b);
    case KIR_OP_MUL: return mask(t, a * b);
    case KIR_OP_AND: return a & b;
    case KIR_OP_OR: return a | b;
    case KIR_OP_XOR: return a ^ b;
    case KIR_OP_SHL: return mask(t, a << b);
    case KIR_OP_LSHR: return a >> b;
    case KIR_OP_ASHR: return mask(t, (uint64_t)(sa >> b));
    case KIR_OP_UDIV: return a / b;
    case KIR_OP_UREM: return a % b;
    case KIR_OP_SDIV: return mask(t, (uint64_t)(sa / sb));
    case KIR_OP_SREM: return mask(t, (uint64_t)(sa % sb));
    case KIR_OP_SMIN: return sa < sb ? a : b;
    case KIR_OP_SMAX: return sa > sb ? a : b;
    case KIR_OP_EQ: return a == b;
    case KIR_OP_NE: return a != b;
    case KIR_OP_SLT: return sa < sb;
    case KIR_OP_SLE: return sa <= sb;
    case KIR_OP_ULT: return a < b;
    case KIR_OP_ULE: return a <= b;
    default: break;
    }
    TU_CHECK_MSG(0, "evaluator: binary %s", kir_op_name(e->op));
    return 0;
}

/* Runs the kernel's top-level lets for (group, lane). */
static void run_lets(env_t *E, int64_t group, int64_t lane)
{
    E->group = group;
    E->lane = lane;
    for (int i = 0; i < E->k->body.count; i++) {
        const kir_stmt_t *s = E->k->body.items[i];
        if (s->kind == KIR_S_LET && s->var->index < 256)
            E->vars[s->var->index] = eval(E, s->a);
    }
}

/* ---- cases --------------------------------------------------------------- */

/* What each case computes, in plain C, from the group and the lane. */
typedef int64_t (*ref_fn)(int64_t g, int64_t lane, int64_t arg);

typedef struct tcase {
    const char *what;
    const kir_expr_t *e;
    ref_fn ref;
    int64_t arg;
    w16_facts_t f; /* claimed before the checks */
} tcase_t;

static int64_t i2_of(int64_t g, int64_t lane) { return (g % 12) * 256 + lane; }
static int64_t n_of(int64_t g, int64_t lane)
{
    int64_t i2 = i2_of(g, lane);
    return 64 * (i2 / 128) + 16 * (i2 % 4) + (i2 % 128) / 16;
}
static int64_t wide_of(int64_t g, int64_t lane) { return 64 * (g % 12) + lane % 128; }

static int64_t r_div(int64_t g, int64_t l, int64_t d) { return i2_of(g, l) / d; }
static int64_t r_mod(int64_t g, int64_t l, int64_t d) { return i2_of(g, l) % d; }
static int64_t r_negdiv(int64_t g, int64_t l, int64_t d) { return w16_floordiv(i2_of(g, l) - 300, d); }
static int64_t r_negmod(int64_t g, int64_t l, int64_t d) { return w16_floormod(i2_of(g, l) - 300, d); }
static int64_t r_up(int64_t g, int64_t l, int64_t c) { return n_of(g, l) >= c; }
static int64_t r_ndiv(int64_t g, int64_t l, int64_t d) { return n_of(g, l) / d; }
static int64_t r_nmod(int64_t g, int64_t l, int64_t d) { return n_of(g, l) % d; }
static int64_t r_wdiv(int64_t g, int64_t l, int64_t d) { return wide_of(g, l) / d; }
static int64_t r_wmod(int64_t g, int64_t l, int64_t d) { return wide_of(g, l) % d; }
static int64_t r_word(int64_t g, int64_t l, int64_t c) { return (8 * i2_of(g, l) + c) / 8; }

int main(int argc, char **argv)
{
    wna16_context_t *ctx;
    wna16_error_t err;
    TU_OK(wna16_context_create(NULL, &ctx, &err), &err);
    kir_kernel_t *k = kir_kernel_new(ctx, "lowering_test", LANES);
    TU_CHECK(k != NULL);
    if (!k)
        return tu_finish("test_lower_expr");
    w16_lower_t L;
    w16_lower_init(&L, k);
    L.num_groups = GROUPS;
    w16_range_t any = {INT64_MIN, INT64_MAX};
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    const kir_expr_t *lane = kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID), false);
    /* i2 = (g % 12) * 256 + lane: a workgroup's row plus the lane */
    const kir_expr_t *row = w16_lower_let(&L, &k->body, "row",
        w16_ir_mul(k, w16_ir_floormod(&L, g, 12, any), w16_ir_const(k, 256)));
    const kir_expr_t *i2 = w16_lower_let(&L, &k->body, "i2", w16_ir_add(k, row, lane));
    TU_CHECK(!w16_ir_uses_lane(&L, row) && w16_ir_uses_lane(&L, i2));

    /* the cases: each with its value computed in C from group and lane */
    enum { MAXC = 200 };
    static tcase_t cases[MAXC];
    int n = 0;
    static const int64_t divisors[] = {2, 3, 4, 5, 7, 8, 12, 16, 24, 64, 96, 100,
                                       128, 256, 768, 1000, 3072};
    for (size_t i = 0; i < sizeof divisors / sizeof divisors[0]; i++) {
        int64_t d = divisors[i];
        cases[n++] = (tcase_t){"i2 / d", w16_ir_floordiv(&L, i2, d, any), r_div, d};
        cases[n++] = (tcase_t){"i2 % d", w16_ir_floormod(&L, i2, d, any), r_mod, d};
    }
    /* Marlin's n: 64 * (i2 / 128) + 16 * (i2 % 4) + (i2 % 128) / 16, and
     * its gate/up split at 768 (the workgroup never straddles it) */
    const kir_expr_t *nn = w16_lower_let(&L, &k->body, "n", w16_ir_add(k,
        w16_ir_add(k, w16_ir_mul(k, w16_ir_floordiv(&L, i2, 128, any), w16_ir_const(k, 64)),
                   w16_ir_mul(k, w16_ir_floormod(&L, i2, 4, any), w16_ir_const(k, 16))),
        w16_ir_floordiv(&L, w16_ir_floormod(&L, i2, 128, any), 16, any)));
    const kir_expr_t *up = w16_ir_ge(&L, nn, 768);
    TU_CHECK_MSG(!w16_ir_uses_lane(&L, up), "n >= 768 should depend on the group alone");
    const kir_expr_t *upq = w16_ir_floordiv(&L, nn, 768, any);
    TU_CHECK_MSG(!w16_ir_uses_lane(&L, upq), "n / 768 should depend on the group alone");
    const kir_expr_t *within = w16_ir_floormod(&L, nn, 768, any);
    TU_CHECK_MSG(within->op != KIR_OP_UREM, "n %% 768 should not divide per lane");
    /* 8 * i2 + c (the code slots of a word) over 8: one source word */
    const kir_expr_t *w8[8];
    for (int c = 0; c < 8; c++)
        w8[c] = w16_ir_floordiv(&L, w16_ir_add(k, w16_ir_mul(k, i2, w16_ir_const(k, 8)),
                                               w16_ir_const(k, c)), 8, any);
    for (int c = 1; c < 8; c++)
        TU_CHECK_MSG(w16_ir_uses_lane(&L, w8[c]) && w8[c]->op != KIR_OP_ASHR,
                     "(8 * i2 + %d) / 8 should be i2 itself", c);
    /* a value that can be negative */
    const kir_expr_t *neg = w16_ir_add(k, i2, w16_ir_const(k, -300));
    for (int64_t d = 3; d <= 9; d += 3) {
        cases[n++] = (tcase_t){"(i2 - 300) / d", w16_ir_floordiv(&L, neg, d, any), r_negdiv, d};
        cases[n++] = (tcase_t){"(i2 - 300) % d", w16_ir_floormod(&L, neg, d, any), r_negmod, d};
    }
    /* a rest that is not below the modulus of the aligned part: 64 * (g %
     * 12) + lane % 128 over 128 or 256 must not drop the rest */
    const kir_expr_t *wide = w16_ir_add(k, w16_ir_mul(k, w16_ir_floormod(&L, g, 12, any),
                                                      w16_ir_const(k, 64)),
                                        w16_ir_floormod(&L, lane, 128, any));
    cases[n++] = (tcase_t){"wide / 128", w16_ir_floordiv(&L, wide, 128, any), r_wdiv, 128};
    cases[n++] = (tcase_t){"wide / 256", w16_ir_floordiv(&L, wide, 256, any), r_wdiv, 256};
    cases[n++] = (tcase_t){"wide % 256", w16_ir_floormod(&L, wide, 256, any), r_wmod, 256};
    cases[n++] = (tcase_t){"n >= 768", kir_int_cast(k, KIR_I64, up, false), r_up, 768};
    cases[n++] = (tcase_t){"n / 768", upq, r_ndiv, 768};
    cases[n++] = (tcase_t){"n % 768", within, r_nmod, 768};
    for (int c = 0; c < 8; c++)
        cases[n++] = (tcase_t){"(8 * i2 + c) / 8", w8[c], r_word, c};
    for (int i = 0; i < n; i++) {
        TU_CHECK_MSG(cases[i].e != NULL && cases[i].e->type == KIR_I64, "%s: built",
                     cases[i].what);
        cases[i].f = w16_ir_facts(&L, cases[i].e);
    }
    /* every case narrowed to 32 bits, and as a 32-bit index */
    static const kir_expr_t *narrow[MAXC], *index[MAXC];
    for (int i = 0; i < n; i++) {
        narrow[i] = w16_ir_narrow32(&L, cases[i].e);
        index[i] = w16_ir_index32(&L, cases[i].e);
    }
    TU_OK(kir_verify(k, &err), &err);

    env_t E = {.k = k};
    tu_rng_t rng;
    tu_rng_seed(&rng, argc > 1 ? (uint64_t)atoll(argv[1]) : 12345);
    for (int trial = 0; trial < 20000; trial++) {
        int64_t gv = (int64_t)tu_rng_below(&rng, GROUPS);
        int64_t lv = (int64_t)tu_rng_below(&rng, LANES);
        if (trial < 4) { /* the corners */
            gv = trial & 1 ? GROUPS - 1 : 0;
            lv = trial & 2 ? LANES - 1 : 0;
        }
        run_lets(&E, gv, lv);
        for (int i = 0; i < n && tu_failures < 20; i++) {
            const tcase_t *c = &cases[i];
            int64_t want = c->ref(gv, lv, c->arg);
            int64_t got = (int64_t)eval(&E, c->e);
            TU_CHECK_MSG(got == want, "%s (arg %lld) at group %lld lane %lld: %lld, "
                         "want %lld", c->what, (long long)c->arg, (long long)gv,
                         (long long)lv, (long long)got, (long long)want);
            TU_CHECK_MSG(got >= c->f.lo && got <= c->f.hi &&
                             (c->f.align == 0 ? got == 0
                                              : (uint64_t)(got < 0 ? -got : got) %
                                                        c->f.align == 0),
                         "%s: %lld outside its facts [%lld, %lld] align %llu",
                         c->what, (long long)got, (long long)c->f.lo,
                         (long long)c->f.hi, (unsigned long long)c->f.align);
            TU_CHECK_MSG((uint32_t)eval(&E, narrow[i]) == (uint32_t)want,
                         "%s: narrowed to 32 bits", c->what);
            TU_CHECK_MSG((int64_t)eval(&E, index[i]) == want, "%s: as a 32-bit index",
                         c->what);
        }
    }
    kir_kernel_free(k);
    wna16_context_destroy(ctx);
    return tu_finish("test_lower_expr");
}
