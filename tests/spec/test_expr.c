/*
 * test_expr.c - the spec expression language (gen/expr.h): every operator
 * and function, precedence and associativity, floor division and modulo
 * with negative operands, short-circuit evaluation of && || and ?:, tables,
 * lets, hex literals, evaluation errors, parse errors with their messages
 * and columns, the variable scopes (every variable of W16_VAR_LIST accepted
 * where its mask allows it and refused elsewhere), w16_expr_uses, and a
 * property test: several hundred random expressions, printed with
 * w16_expr_print, re-parse to expressions that print identically and
 * evaluate to the same value (or the same error) on random environments.
 * Every evaluation is checked against an independent evaluator written in
 * this file from the semantics in expr.h. Two bugs it found (a printer
 * bug for left-nested comparisons, undefined behaviour in
 * cdiv/round_up/gcd/lcm on extreme values) are fixed; their checks
 * (KNOWN_BUG) fail if they come back.
 */
#include "testutil.h"

#include "spec/expr.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;
static w16_arena_t arena;
static int64_t env[W16_VAR_COUNT];

/* Tables and lets visible in the "all" scope. */
static int64_t t_vals[] = {10, 20, 30, -5};
static int64_t perm_vals[] = {2, 0, 3, 1};
static const w16_table_t tables[] = {{"T", t_vals, 4}, {"PERM", perm_vals, 4}};
static const char *let_names[2] = {"w", "w2"};
static const w16_expr_t *let_exprs[2];
static w16_scope_t all_scope;

#define ALL_WHERE                                                             \
    (W16_VW_DIM | W16_VW_COORD | W16_VW_STORE | W16_VW_VALUE | W16_VW_SELECT)

static int known_bug_hits;

/* Regressions of bugs this suite found in gen/ (fixed): a failure. */
#define KNOWN_BUG(cond, ...)                                                  \
    do {                                                                      \
        if (cond)                                                             \
            known_bug_hits++;                                                 \
        TU_CHECK_MSG(!(cond), __VA_ARGS__);                                   \
    } while (0)

static w16_scope_t scope_of(unsigned where)
{
    w16_scope_t s = all_scope;
    s.where = where;
    return s;
}

static void set_env(void)
{
    static const struct { w16_var_t v; int64_t x; } init[] = {
        {W16_VAR_E, 8},      {W16_VAR_H, 128},     {W16_VAR_I, 64},
        {W16_VAR_IP, 64},    {W16_VAR_BITS, 4},    {W16_VAR_MASK, 15},
        {W16_VAR_GS, 32},    {W16_VAR_K, 128},     {W16_VAR_N, 128},
        {W16_VAR_G, 4},      {W16_VAR_GSE, 32},    {W16_VAR_PF, 8},
        {W16_VAR_ZP, 1},     {W16_VAR_ACT_ORDER, 0}, {W16_VAR_HAS_BIAS, 0},
        {W16_VAR_W13, 1},    {W16_VAR_e, 1},       {W16_VAR_n, 5},
        {W16_VAR_k, 17},     {W16_VAR_g, 2},       {W16_VAR_slot, 3},
        {W16_VAR_i0, 0},     {W16_VAR_i1, 1},      {W16_VAR_i2, 2},
        {W16_VAR_i3, 3},     {W16_VAR_i4, 4},      {W16_VAR_i5, 5},
        {W16_VAR_c, 200},    {W16_VAR_PLATFORM, 0}, {W16_VAR_CC, 90},
        {W16_VAR_TOPK, 2},   {W16_VAR_BATCHED, 0}, {W16_VAR_MAY_ZP, 1},
        {W16_VAR_MAY_BIAS, 0}, {W16_VAR_TILE_PADDING, 1},
        {W16_VAR_WK_BITS, 4}, {W16_VAR_WK_G32, 1}, {W16_VAR_WK_ASYM, 0},
        {W16_VAR_CUDA, 0},   {W16_VAR_ROCM, 1},    {W16_VAR_CPU, 2},
        {W16_VAR_XPU, 3},
    };
    memset(env, 0, sizeof env);
    for (size_t i = 0; i < sizeof init / sizeof init[0]; i++)
        env[init[i].v] = init[i].x;
}

static const w16_expr_t *parse_in(const char *text, unsigned where,
                                  char *msg, size_t n)
{
    w16_scope_t s = scope_of(where);
    return w16_expr_parse(&arena, text, &s, msg, n);
}

/* ---- values ---------------------------------------------------------------- */

static int n_value_cases;

static void check_value(int line, const char *text, int64_t want)
{
    char msg[512];
    n_value_cases++;
    const w16_expr_t *x = parse_in(text, ALL_WHERE, msg, sizeof msg);
    TU_CHECK_MSG(x != NULL, "line %d: \"%s\" does not parse: %s", line, text,
                 msg);
    if (!x)
        return;
    int64_t v = 0;
    w16_eval_error_t e;
    bool ok = w16_expr_eval(x, env, &v, &e);
    TU_CHECK_MSG(ok && v == want, "line %d: \"%s\" = %" PRId64 " (%s), want %"
                 PRId64, line, text, v, ok ? "ok" : e.what, want);
}
#define VAL(text, want) check_value(__LINE__, text, (int64_t)(want))

static void check_eval_error(int line, const char *text, const char *what)
{
    char msg[512];
    n_value_cases++;
    const w16_expr_t *x = parse_in(text, ALL_WHERE, msg, sizeof msg);
    TU_CHECK_MSG(x != NULL, "line %d: \"%s\" does not parse: %s", line, text,
                 msg);
    if (!x)
        return;
    int64_t v = 12345;
    w16_eval_error_t e = {0};
    bool ok = w16_expr_eval(x, env, &v, &e);
    TU_CHECK_MSG(!ok && e.what && strstr(e.what, what), "line %d: \"%s\": "
                 "expected the evaluation error \"%s\", got %s (%" PRId64 ")",
                 line, text, what, ok ? "success" : e.what, v);
    /* A NULL error pointer is allowed. */
    TU_CHECK(!w16_expr_eval(x, env, &v, NULL));
}
#define EVAL_ERR(text, what) check_eval_error(__LINE__, text, what)

static void test_operators(void)
{
    /* every operator */
    VAL("1 + 2", 3);
    VAL("5 - 7", -2);
    VAL("cdiv(0 - 9223372036854775807 - 1, 1)", INT64_MIN);
    VAL("(0 - 9223372036854775807 - 1) % -1", 0);
    VAL("round_up(0 - 9223372036854775807 - 1, -1)", INT64_MIN);
    VAL("cdiv(-7, 2)", -3);
    VAL("round_up(-7, 2)", -6);
    VAL("lcm(-4, 6)", 12);
    VAL("6 * 7", 42);
    VAL("7 / 2", 3);
    VAL("7 % 3", 1);
    VAL("1 << 4", 16);
    VAL("256 >> 4", 16);
    VAL("12 & 10", 8);
    VAL("12 | 10", 14);
    VAL("12 ^ 10", 6);
    VAL("3 == 3", 1);
    VAL("3 == 4", 0);
    VAL("3 != 3", 0);
    VAL("3 != 4", 1);
    VAL("2 < 3", 1);
    VAL("3 < 3", 0);
    VAL("3 <= 3", 1);
    VAL("4 <= 3", 0);
    VAL("4 > 3", 1);
    VAL("3 > 3", 0);
    VAL("3 >= 3", 1);
    VAL("3 >= 4", 0);
    VAL("1 && 2", 1);
    VAL("0 && 2", 0);
    VAL("2 && 0", 0);
    VAL("0 || 0", 0);
    VAL("0 || 7", 1);
    VAL("5 || 0", 1);
    VAL("!0", 1);
    VAL("!5", 0);
    VAL("!!5", 1);
    VAL("~0", -1);
    VAL("~5", -6);
    VAL("-(3)", -3);
    VAL("1 ? 2 : 3", 2);
    VAL("0 ? 2 : 3", 3);
    VAL("-3 ? 2 : 3", 2);

    /* precedence and associativity */
    VAL("1 - 2 - 3", -4);
    VAL("100 / 10 / 5", 2);
    VAL("2 * 3 % 4", 2);
    VAL("7 % 4 * 3", 9);
    VAL("1 << 2 + 1", 8);
    VAL("2 + 3 * 4", 14);
    VAL("(2 + 3) * 4", 20);
    VAL("10 - 2 * 3", 4);
    VAL("1 << 2 << 3", 32);
    VAL("256 >> 2 >> 1", 32);
    VAL("1 + 2 == 3", 1);
    VAL("1 << 1 == 2", 1);
    VAL("1 | 2 ^ 3 & 6", 1);   /* 1 | (2 ^ (3 & 6)) */
    VAL("6 & 3 == 3", 0);      /* 6 & (3 == 3) */
    VAL("5 & 3 == 3", 1);
    VAL("4 | 1 == 1", 5);      /* 4 | (1 == 1) */
    VAL("1 == 1 && 0 || 1", 1);
    VAL("0 || 1 && 0", 0);     /* && binds tighter than || */
    VAL("1 || 0 && 0", 1);
    VAL("1 | 2 && 0", 0);
    VAL("-2 * -3", 6);
    VAL("- -5", 5);
    VAL("--5", 5);
    VAL("-~0", 1);
    VAL("!0 + 1", 2);
    VAL("-1 << 2", -4);
    VAL("~0 & 0xff", 255);
    VAL("2 * -3 + 1", -5);
    VAL("1 + 1 ? 8 : 9", 8);   /* ?: binds loosest */
    VAL("0 || 0 ? 1 : 2", 2);
    VAL("1 ? 2 : 3 + 4", 2);
    VAL("0 ? 2 : 3 + 4", 7);
    VAL("(1 ? 2 : 3) + 4", 6);
    VAL("1 ? 2 : 0 ? 3 : 4", 2); /* right-associative */
    VAL("0 ? 2 : 0 ? 3 : 4", 4);
    VAL("0 ? 2 : 1 ? 3 : 4", 3);
    VAL("1 ? 0 ? 5 : 6 : 7", 6);
    VAL("0 ? 0 ? 5 : 6 : 7", 7);
    VAL("1 ? 1 ? 5 : 6 : 7", 5);
    VAL("((((1))))", 1);
    VAL(" \t1\n+\r2 ", 3);
    VAL("1+2*3", 7);
    VAL("E<H", 1);
    VAL("(E<H)+(H<E)", 1);

    /* floor division and modulo (Python semantics) */
    VAL("-7 / 2", -4);
    VAL("-7 % 2", 1);
    VAL("7 % -2", -1);
    VAL("7 / -2", -4);
    VAL("-7 / -2", 3);
    VAL("-7 % -2", -1);
    VAL("-8 / 2", -4);
    VAL("-8 % 2", 0);
    VAL("-1 / 5", -1);
    VAL("-1 % 5", 4);
    VAL("0 - 7 / 2", -3); /* unary minus binds tighter than '/': differs */
    VAL("(-7) / 2 * 2 + (-7) % 2", -7);
    VAL("17 / 8 * 8 + 17 % 8", 17);

    /* functions */
    VAL("min(3, -2)", -2);
    VAL("max(3, -2)", 3);
    VAL("min(-2, 3)", -2);
    VAL("max(-2, 3)", 3);
    VAL("cdiv(7, 2)", 4);
    VAL("cdiv(8, 2)", 4);
    VAL("cdiv(-7, 2)", -3);
    VAL("cdiv(0, 5)", 0);
    VAL("cdiv(1, 32)", 1);
    VAL("round_up(7, 4)", 8);
    VAL("round_up(8, 4)", 8);
    VAL("round_up(0, 4)", 0);
    VAL("round_up(-3, 4)", 0);
    VAL("round_up(96, 64)", 128);
    VAL("gcd(12, 18)", 6);
    VAL("gcd(-12, 18)", 6);
    VAL("gcd(0, 5)", 5);
    VAL("gcd(0, 0)", 0);
    VAL("lcm(4, 6)", 12);
    VAL("lcm(-4, 6)", 12);
    VAL("lcm(0, 5)", 0);
    VAL("lcm(64, 1)", 64);
    VAL("min(max(1, 2), 3)", 2);
    VAL("max ( 1 , 2 )", 2);
    VAL("round_up(I, lcm(64, max(GS, 1)))", 64);
    VAL("round_up(96, lcm(64, max(32, 1)))", 128);
    VAL("round_up(160, lcm(64, max(32, 1)))", 192);
    VAL("cdiv(N * BITS, 8)", 64);

    /* tables */
    VAL("T[0]", 10);
    VAL("T[3]", -5);
    VAL("T[1 + 1]", 30);
    VAL("T[T[0] / 10]", 20);
    VAL("T[k % 4]", 20);
    VAL("4 * (n / 4) + PERM[n % 4]", 4);
    VAL("T [ 2 ]", 30);

    /* variables and lets */
    VAL("PF", 8);
    VAL("K / PF", 16);
    VAL("e * N + n", 133);
    VAL("c ^ 128", 72);
    VAL("(c - 1) & MASK", 7);
    VAL("CUDA", 0);
    VAL("XPU", 3);
    VAL("PLATFORM == CUDA && CC >= 75", 1);
    VAL("w", 2);            /* let w = k / PF */
    VAL("w2 + 1", 5);       /* let w2 = w * 2 */
    VAL("i0 + i1 + i2 + i3 + i4 + i5 + slot", 18);

    /* literals */
    VAL("0x10", 16);
    VAL("0XfF", 255);
    VAL("0xAbC", 0xabc);
    VAL("0x0", 0);
    VAL("007", 7);
    VAL("0x7fffffffffffffff", INT64_MAX);
    VAL("9223372036854775807", INT64_MAX);

    /* shifts and wrapping (int64 arithmetic wraps; it is never UB) */
    VAL("1 << 0", 1);
    VAL("1 << 63", INT64_MIN);
    VAL("-8 >> 1", -4);
    VAL("5 >> 63", 0);
    VAL("-1 >> 63", -1);
    VAL("9223372036854775807 + 1", INT64_MIN);
    VAL("0x7fffffffffffffff * 2", -2);
    VAL("0 - 9223372036854775807 - 2", INT64_MAX);

    /* short circuit: the untaken side is never evaluated */
    VAL("0 && 1 / 0", 0);
    VAL("1 || 1 / 0", 1);
    VAL("0 && T[99]", 0);
    VAL("0 && 1 << 64", 0);
    VAL("0 ? 1 / 0 : 5", 5);
    VAL("1 ? 5 : 1 % 0", 5);
    VAL("k == 17 || T[k]", 1);
}

static void test_eval_errors(void)
{
    EVAL_ERR("1 / 0", "division by zero");
    EVAL_ERR("1 % 0", "division by zero");
    EVAL_ERR("cdiv(1, 0)", "division by zero");
    EVAL_ERR("round_up(1, 0)", "division by zero");
    EVAL_ERR("1 / (k - 17)", "division by zero");
    EVAL_ERR("1 && 1 / 0", "division by zero");
    EVAL_ERR("0 || 1 % 0", "division by zero");
    EVAL_ERR("1 ? 1 / 0 : 2", "division by zero");
    EVAL_ERR("(1 / 0) ? 1 : 2", "division by zero");
    EVAL_ERR("min(1, 1 / 0)", "division by zero");
    EVAL_ERR("-(1 / 0)", "division by zero");
    EVAL_ERR("1 << 64", "shift amount outside [0, 63]");
    EVAL_ERR("1 << -1", "shift amount outside [0, 63]");
    EVAL_ERR("1 >> 64", "shift amount outside [0, 63]");
    EVAL_ERR("1 >> (0 - 1)", "shift amount outside [0, 63]");
    EVAL_ERR("T[4]", "table index out of range");
    EVAL_ERR("T[-1]", "table index out of range");
    EVAL_ERR("T[0 - 1]", "table index out of range");
    EVAL_ERR("T[k]", "table index out of range");
    EVAL_ERR("T[T[0]]", "table index out of range");
    EVAL_ERR("(0 - 9223372036854775807 - 1) / -1", "arithmetic overflow");
    EVAL_ERR("cdiv(0 - 9223372036854775807 - 1, -1)", "arithmetic overflow");
    EVAL_ERR("round_up(9223372036854775807, 2)", "arithmetic overflow");
    EVAL_ERR("lcm(4294967296, 4294967297)", "arithmetic overflow");
    EVAL_ERR("gcd(0 - 9223372036854775807 - 1, 0)", "arithmetic overflow");
}

/* ---- parse errors ------------------------------------------------------------ */

static int n_parse_cases;

static void check_parse_error(int line, const char *text, unsigned where,
                              const char *want)
{
    char msg[512];
    n_parse_cases++;
    const w16_expr_t *x = parse_in(text, where, msg, sizeof msg);
    TU_CHECK_MSG(x == NULL, "line %d: \"%s\" parsed but should fail with "
                 "\"%s\"", line, text, want);
    if (x)
        return;
    TU_CHECK_MSG(strstr(msg, want) != NULL, "line %d: \"%s\": message \"%s\" "
                 "lacks \"%s\"", line, text, msg, want);
    TU_CHECK_MSG(strstr(msg, "at column ") != NULL, "line %d: \"%s\": message "
                 "\"%s\" has no column", line, text, msg);
}
#define PARSE_ERR(text, where, want)                                          \
    check_parse_error(__LINE__, text, where, want)

static char *repeat(const char *a, int n, const char *mid, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc(la * (size_t)n + lm + lb * (size_t)n + 1), *p = s;
    for (int i = 0; i < n; i++, p += la)
        memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb)
        memcpy(p, b, lb);
    *p = '\0';
    return s;
}

static void test_parse_errors(void)
{
    const unsigned A = ALL_WHERE;
    PARSE_ERR("foo", A, "unknown identifier 'foo'");
    PARSE_ERR("1 + foo", A, "unknown identifier 'foo' at column 5");
    PARSE_ERR("e2", A, "unknown identifier 'e2'");
    PARSE_ERR("_x", A, "unknown identifier '_x'");
    PARSE_ERR("i6", A, "unknown identifier 'i6'");
    PARSE_ERR("pf", A, "unknown identifier 'pf'"); /* case-sensitive */
    /* variables outside their scope */
    PARSE_ERR("i0", W16_VW_DIM, "'i0' cannot be used here");
    PARSE_ERR("K / PF + i0", W16_VW_DIM, "'i0' cannot be used here at column 10");
    PARSE_ERR("slot", W16_VW_DIM | W16_VW_COORD, "'slot' cannot be used here");
    PARSE_ERR("k", W16_VW_DIM, "'k' cannot be used here");
    PARSE_ERR("n", W16_VW_DIM | W16_VW_STORE, "'n' cannot be used here");
    PARSE_ERR("c", W16_VW_DIM | W16_VW_COORD, "'c' cannot be used here");
    PARSE_ERR("PLATFORM", W16_VW_LAYOUT, "'PLATFORM' cannot be used here");
    PARSE_ERR("CUDA", W16_VW_LAYOUT, "'CUDA' cannot be used here");
    PARSE_ERR("IP", W16_VW_SELECT, "'IP' cannot be used here");
    PARSE_ERR("K", W16_VW_SELECT, "'K' cannot be used here");
    PARSE_ERR("e", W16_VW_SELECT, "'e' cannot be used here");
    /* functions */
    PARSE_ERR("foo(1, 2)", A, "unknown function 'foo'");
    PARSE_ERR("sqrt(4)", A, "unknown function 'sqrt'");
    PARSE_ERR("E(1)", A, "unknown function 'E'");
    PARSE_ERR("min(1)", A, "min() takes two arguments");
    PARSE_ERR("gcd()", A, "unexpected character");
    PARSE_ERR("min(1, 2, 3)", A, "expected ')' after the arguments of min()");
    PARSE_ERR("max(1, 2", A, "expected ')' after the arguments of max()");
    /* parentheses, brackets, trailing text */
    PARSE_ERR("(1 + 2", A, "expected ')'");
    PARSE_ERR("((1)", A, "expected ')'");
    PARSE_ERR("1 + 2)", A, "unexpected text after the expression");
    PARSE_ERR("1 2", A, "unexpected text after the expression at column 3");
    PARSE_ERR("E[1]", A, "unexpected text after the expression");
    PARSE_ERR("1 @ 2", A, "unexpected text after the expression");
    PARSE_ERR("1 = 2", A, "unexpected text after the expression");
    PARSE_ERR("1 ? 2", A, "expected ':' in a conditional");
    PARSE_ERR("T", A, "table 'T' must be indexed");
    PARSE_ERR("T + 1", A, "table 'T' must be indexed");
    PARSE_ERR("T[1", A, "expected ']'");
    PARSE_ERR("T[]", A, "unexpected character");
    PARSE_ERR("", A, "unexpected end of expression");
    PARSE_ERR("   ", A, "unexpected end of expression");
    PARSE_ERR("1 +", A, "unexpected end of expression");
    PARSE_ERR("-", A, "unexpected end of expression");
    PARSE_ERR("$", A, "unexpected character at column 1");
    PARSE_ERR("1 + 'a'", A, "unexpected character at column 5");
    PARSE_ERR("1 + * 2", A, "unexpected character");
    /* comparisons do not chain */
    PARSE_ERR("E < H < I", A, "comparisons do not chain; use && at column 7");
    PARSE_ERR("1 == 1 == 1", A, "comparisons do not chain");
    PARSE_ERR("1 < 2 >= 0", A, "comparisons do not chain");
    PARSE_ERR("a < b < c", A, "unknown identifier 'a'"); /* names first */
    /* numbers */
    PARSE_ERR("12abc", A, "bad number");
    PARSE_ERR("0x", A, "bad hexadecimal number");
    PARSE_ERR("0xg", A, "bad hexadecimal number");
    PARSE_ERR("0x1g", A, "bad number");
    PARSE_ERR("1_000", A, "bad number");
    PARSE_ERR("99999999999999999999", A, "number too large");
    PARSE_ERR("9223372036854775808", A, "number too large");
    PARSE_ERR("0x10000000000000000", A, "number too large");
    PARSE_ERR("0x8000000000000000", A, "number too large");
    PARSE_ERR("1.5", A, "unexpected text after the expression");

    char *s = repeat("x", 70, "", "");
    PARSE_ERR(s, A, "identifier too long");
    free(s);

    /* nesting: about 64 levels (each parenthesis costs two) */
    s = repeat("(", 20, "1", ")");
    VAL(s, 1);
    free(s);
    s = repeat("(", 40, "1", ")");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("(", 5000, "1", ")");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("-", 40, "1", "");
    VAL(s, 1);
    free(s);
    s = repeat("- ", 100, "1", "");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("!", 1000, "1", "");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("min(1, ", 100, "1", ")");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("T[", 100, "0", "]");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("0 ? 1 : ", 100, "2", "");
    PARSE_ERR(s, A, "expression nested too deeply");
    free(s);
    s = repeat("0 ? 1 : ", 20, "2", "");
    VAL(s, 2);
    free(s);
    /* long flat chains are not nesting */
    s = repeat("1 + ", 500, "1", "");
    VAL(s, 501);
    free(s);
    s = repeat("1 && ", 300, "1", "");
    VAL(s, 1);
    free(s);
}

/* ---- scopes: every variable ----------------------------------------------- */

static void test_variables(void)
{
    const unsigned places[] = {W16_VW_DIM, W16_VW_COORD, W16_VW_STORE,
                               W16_VW_VALUE, W16_VW_SELECT};
    for (int v = 0; v < W16_VAR_COUNT; v++) {
        const char *name = w16_var_name((w16_var_t)v);
        TU_CHECK(name && *name && w16_var_doc((w16_var_t)v) &&
                 *w16_var_doc((w16_var_t)v));
        unsigned where = w16_var_where((w16_var_t)v);
        TU_CHECK_MSG(where != 0 && (where & ~ALL_WHERE) == 0, "%s", name);
        for (int u = 0; u < v; u++)
            TU_CHECK(strcmp(name, w16_var_name((w16_var_t)u)) != 0);
        for (size_t p = 0; p < sizeof places / sizeof places[0]; p++) {
            char msg[256];
            const w16_expr_t *x = parse_in(name, places[p], msg, sizeof msg);
            if (where & places[p]) {
                TU_CHECK_MSG(x != NULL, "%s in place %u: %s", name, places[p],
                             msg);
                int64_t val = 0;
                TU_CHECK(x && x->op == W16_OP_VAR && x->var == (w16_var_t)v &&
                         w16_expr_eval(x, env, &val, NULL) && val == env[v]);
                TU_CHECK(x && w16_expr_uses(x, (w16_var_t)v));
            } else {
                char want[96];
                snprintf(want, sizeof want, "'%s' cannot be used here", name);
                TU_CHECK_MSG(x == NULL && strstr(msg, want), "%s in place %u: "
                             "%s", name, places[p], x ? "accepted" : msg);
            }
        }
    }
    /* Where the places documented in expr.h say. */
    TU_CHECK(w16_var_where(W16_VAR_i0) == W16_VW_STORE);
    TU_CHECK(w16_var_where(W16_VAR_slot) == W16_VW_STORE);
    TU_CHECK(w16_var_where(W16_VAR_k) == W16_VW_COORD);
    TU_CHECK(w16_var_where(W16_VAR_c) == W16_VW_VALUE);
    TU_CHECK(w16_var_where(W16_VAR_PLATFORM) == W16_VW_SELECT);
    TU_CHECK((w16_var_where(W16_VAR_E) & W16_VW_LAYOUT) == W16_VW_LAYOUT);

    /* w16_expr_uses follows lets and tables */
    char msg[256];
    const w16_expr_t *x = parse_in("w2 + T[n % 4]", ALL_WHERE, msg, sizeof msg);
    TU_CHECK(x != NULL);
    TU_CHECK(x && w16_expr_uses(x, W16_VAR_k));  /* through w2 -> w */
    TU_CHECK(x && w16_expr_uses(x, W16_VAR_PF)); /* through w */
    TU_CHECK(x && w16_expr_uses(x, W16_VAR_n));
    TU_CHECK(x && !w16_expr_uses(x, W16_VAR_e));
    TU_CHECK(!w16_expr_uses(NULL, W16_VAR_e));
}

/* ---- printing -------------------------------------------------------------- */

static void check_print(int line, const char *text, const char *want)
{
    char msg[256];
    const w16_expr_t *x = parse_in(text, ALL_WHERE, msg, sizeof msg);
    TU_CHECK_MSG(x != NULL, "line %d: %s", line, msg);
    if (!x)
        return;
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    w16_expr_print(&b, x);
    TU_CHECK_MSG(b.data && strcmp(b.data, want) == 0, "line %d: \"%s\" prints "
                 "as \"%s\", want \"%s\"", line, text, b.data ? b.data : "",
                 want);
    w16_buf_free(&b);
}
#define PRINTS(text, want) check_print(__LINE__, text, want)

static void test_print(void)
{
    PRINTS("1+2", "1 + 2");
    PRINTS("(1 + 2) * 3", "(1 + 2) * 3");
    PRINTS("1 + (2 * 3)", "1 + 2 * 3");
    PRINTS("(1 - 2) - 3", "1 - 2 - 3");
    PRINTS("1 - (2 - 3)", "1 - (2 - 3)");
    PRINTS("-(1 + 2)", "-(1 + 2)");
    PRINTS("- -5", "--5");
    PRINTS("!(E < H)", "!(E < H)");
    PRINTS("0x10", "16");
    PRINTS("min(E,H)", "min(E, H)");
    PRINTS("T[k%4]", "T[k % 4]");
    PRINTS("1?1:2", "1 ? 1 : 2");
    PRINTS("(0 ? 1 : 2) ? 3 : 4", "(0 ? 1 : 2) ? 3 : 4");
    PRINTS("0 ? 1 : (2 ? 3 : 4)", "0 ? 1 : 2 ? 3 : 4");
    PRINTS("(1 ? 2 : 3) + 4", "(1 ? 2 : 3) + 4");
    PRINTS("w2", "k / PF * 2"); /* lets are expanded */
    PRINTS("E == (H < I)", "E == (H < I)");
    PRINTS("(1 || 0) && 1", "(1 || 0) && 1");

    /* A regression check (fixed in print()): a comparison that is the left
     * operand of another comparison must be printed with parentheses, or
     * the text does not re-parse (comparisons do not chain). */
    char msg[256];
    const w16_expr_t *x = parse_in("(E < H) == 1", ALL_WHERE, msg, sizeof msg);
    TU_CHECK(x != NULL);
    if (x) {
        w16_buf_t b;
        w16_buf_init(&b, ctx);
        w16_expr_print(&b, x);
        const w16_expr_t *y = parse_in(b.data, ALL_WHERE, msg, sizeof msg);
        KNOWN_BUG(y == NULL, "w16_expr_print(\"(E < H) == 1\") gives \"%s\", "
                  "which does not re-parse: %s", b.data, msg);
        w16_buf_free(&b);
    }
}

/* ---- property test: print -> parse round trip ------------------------------- */

typedef struct gen {
    tu_rng_t *r;
    char buf[8192];
    size_t len;
    bool overflow;
} gen_t;

static void put(gen_t *g, const char *s)
{
    size_t n = strlen(s);
    if (g->len + n + 1 >= sizeof g->buf) {
        g->overflow = true;
        return;
    }
    memcpy(g->buf + g->len, s, n + 1);
    g->len += n;
}

static void space(gen_t *g)
{
    static const char *const ws[] = {"", " ", " ", "  ", "\t"};
    put(g, ws[tu_rng_below(g->r, 5)]);
}

static const char *const bin_ops[] = {
    "+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "==", "!=", "<",
    "<=", ">", ">=", "&&", "||", "+", "-", "*", "/", "%"};
static const char *const fn_names[] = {"min", "max", "cdiv", "round_up",
                                       "gcd", "lcm"};

static void gen_expr(gen_t *g, int depth)
{
    tu_rng_t *r = g->r;
    uint32_t choice = depth <= 0 ? tu_rng_below(r, 3) : tu_rng_below(r, 14);
    char tmp[64];
    space(g);
    switch (choice) {
    case 0: /* number */
        switch (tu_rng_below(r, 6)) {
        case 0: snprintf(tmp, sizeof tmp, "0x%x", tu_rng_below(r, 256)); break;
        case 1:
            snprintf(tmp, sizeof tmp, "%" PRIu64,
                     tu_rng_next(r) >> (24 + tu_rng_below(r, 40)));
            break;
        default: snprintf(tmp, sizeof tmp, "%u", tu_rng_below(r, 20)); break;
        }
        put(g, tmp);
        break;
    case 1: /* variable */
        put(g, w16_var_name((w16_var_t)tu_rng_below(r, W16_VAR_COUNT)));
        break;
    case 2: /* let */
        put(g, let_names[tu_rng_below(r, 2)]);
        break;
    case 3: /* table */
        put(g, tu_rng_below(r, 2) ? "T[" : "PERM[");
        if (tu_rng_below(r, 4)) {
            put(g, "(");
            gen_expr(g, depth - 1);
            put(g, ") % 4");
        } else {
            gen_expr(g, depth - 1);
        }
        put(g, "]");
        break;
    case 4: { /* unary */
        static const char *const un[] = {"-", "!", "~"};
        put(g, un[tu_rng_below(r, 3)]);
        gen_expr(g, depth - 1);
        break;
    }
    case 5: /* parentheses */
        put(g, "(");
        gen_expr(g, depth - 1);
        space(g);
        put(g, ")");
        break;
    case 6: /* function */
        put(g, fn_names[tu_rng_below(r, 6)]);
        put(g, "(");
        gen_expr(g, depth - 1);
        put(g, ",");
        gen_expr(g, depth - 1);
        put(g, ")");
        break;
    case 7: /* conditional */
        gen_expr(g, depth - 1);
        space(g);
        put(g, "?");
        gen_expr(g, depth - 1);
        space(g);
        put(g, ":");
        gen_expr(g, depth - 1);
        break;
    default: { /* binary: the parser decides the grouping, except where
                * an operand is parenthesized (one in three) */
        bool pa = tu_rng_below(r, 3) == 0, pb = tu_rng_below(r, 3) == 0;
        put(g, pa ? "(" : "");
        gen_expr(g, depth - 1);
        put(g, pa ? ")" : "");
        space(g);
        put(g, bin_ops[tu_rng_below(r, sizeof bin_ops / sizeof bin_ops[0])]);
        put(g, pb ? "(" : "");
        gen_expr(g, depth - 1);
        put(g, pb ? ")" : "");
        break;
    }
    }
}

static bool is_cmp(const w16_expr_t *x)
{
    return x && x->op >= W16_OP_EQ && x->op <= W16_OP_GE;
}

/* Does x contain a comparison whose left operand is a comparison? */
static bool has_left_nested_cmp(const w16_expr_t *x)
{
    if (!x)
        return false;
    if (is_cmp(x) && is_cmp(x->a))
        return true;
    return has_left_nested_cmp(x->a) || has_left_nested_cmp(x->b) ||
           has_left_nested_cmp(x->c);
}

/* An independent evaluator written from the semantics in expr.h, used as
 * the oracle of the property test. It also says when the library's
 * evaluator would execute undefined behaviour (KNOWN BUG: cdiv, round_up,
 * gcd and lcm negate or multiply int64 values without overflow checks, see
 * gen/expr.c eval()); such evaluations are skipped, not run. */
typedef enum { R_OK, R_ERR, R_UB } ref_status_t;

static ref_status_t ref_eval(const w16_expr_t *x, const int64_t *v,
                             int64_t *out, const char **what)
{
    int64_t a = 0, b = 0;
    ref_status_t st;
    switch (x->op) {
    case W16_OP_CONST: *out = x->value; return R_OK;
    case W16_OP_VAR: *out = v[x->var]; return R_OK;
    case W16_OP_COND:
        if ((st = ref_eval(x->a, v, &a, what)) != R_OK)
            return st;
        return ref_eval(a ? x->b : x->c, v, out, what);
    case W16_OP_LAND:
    case W16_OP_LOR:
        if ((st = ref_eval(x->a, v, &a, what)) != R_OK)
            return st;
        if (x->op == W16_OP_LAND ? a == 0 : a != 0) {
            *out = x->op == W16_OP_LOR;
            return R_OK;
        }
        if ((st = ref_eval(x->b, v, &b, what)) != R_OK)
            return st;
        *out = b != 0;
        return R_OK;
    default: break;
    }
    if ((st = ref_eval(x->a, v, &a, what)) != R_OK)
        return st;
    if (x->b && (st = ref_eval(x->b, v, &b, what)) != R_OK)
        return st;
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
#define REF_ERR(m)                                                            \
    do {                                                                      \
        *what = m;                                                            \
        return R_ERR;                                                         \
    } while (0)
    switch (x->op) {
    case W16_OP_TABLE:
        if (a < 0 || a >= x->table->len)
            REF_ERR("table index out of range");
        *out = x->table->values[a];
        return R_OK;
    case W16_OP_NEG: *out = (int64_t)(0 - ua); return R_OK;
    case W16_OP_NOT: *out = a == 0; return R_OK;
    case W16_OP_BNOT: *out = (int64_t)~ua; return R_OK;
    case W16_OP_ADD: *out = (int64_t)(ua + ub); return R_OK;
    case W16_OP_SUB: *out = (int64_t)(ua - ub); return R_OK;
    case W16_OP_MUL: *out = (int64_t)(ua * ub); return R_OK;
    case W16_OP_DIV: case W16_OP_MOD: case W16_OP_CDIV:
    case W16_OP_ROUND_UP: {
        if (b == 0)
            REF_ERR("division by zero");
        /* exact floor and ceiling through __int128; results outside int64
         * are "arithmetic overflow" (expr.h) */
        __int128 A = a, Bv = b, q = A / Bv, m = A - q * Bv;
        if (m != 0 && ((m < 0) != (Bv < 0))) {
            q -= 1;
            m += Bv;
        }
        __int128 r = x->op == W16_OP_DIV   ? q
                     : x->op == W16_OP_MOD ? m
                     : x->op == W16_OP_CDIV ? q + (m != 0)
                                            : (q + (m != 0)) * Bv;
        if (r < INT64_MIN || r > INT64_MAX)
            REF_ERR("arithmetic overflow");
        *out = (int64_t)r;
        return R_OK;
    }
    case W16_OP_SHL: case W16_OP_SHR:
        if (b < 0 || b > 63)
            REF_ERR("shift amount outside [0, 63]");
        if (x->op == W16_OP_SHL) {
            *out = (int64_t)(ua << b);
        } else { /* arithmetic shift, written without >> on negatives */
            *out = a >= 0 ? (int64_t)(ua >> b)
                          : (int64_t)~((~ua) >> b);
        }
        return R_OK;
    case W16_OP_AND: *out = (int64_t)(ua & ub); return R_OK;
    case W16_OP_OR: *out = (int64_t)(ua | ub); return R_OK;
    case W16_OP_XOR: *out = (int64_t)(ua ^ ub); return R_OK;
    case W16_OP_EQ: *out = a == b; return R_OK;
    case W16_OP_NE: *out = a != b; return R_OK;
    case W16_OP_LT: *out = a < b; return R_OK;
    case W16_OP_LE: *out = a <= b; return R_OK;
    case W16_OP_GT: *out = a > b; return R_OK;
    case W16_OP_GE: *out = a >= b; return R_OK;
    case W16_OP_MIN: *out = a < b ? a : b; return R_OK;
    case W16_OP_MAX: *out = a > b ? a : b; return R_OK;
    case W16_OP_GCD: case W16_OP_LCM: {
        __int128 p = a < 0 ? -(__int128)a : a, q = b < 0 ? -(__int128)b : b;
        __int128 A = p, B = q;
        while (q) {
            __int128 t = p % q;
            p = q;
            q = t;
        }
        __int128 r = x->op == W16_OP_GCD ? p : (p ? A / p * B : 0);
        if (r > INT64_MAX)
            REF_ERR("arithmetic overflow");
        *out = (int64_t)r;
        return R_OK;
    }
    default: break;
    }
#undef REF_ERR
    *what = "unknown operator";
    return R_ERR;
}

static void random_env(tu_rng_t *r, int64_t *v)
{
    for (int i = 0; i < W16_VAR_COUNT; i++) {
        switch (tu_rng_below(r, 8)) {
        case 0: v[i] = (int64_t)tu_rng_next(r); break;
        case 1: v[i] = (int64_t)(tu_rng_next(r) >> 40); break;
        case 2: v[i] = 0; break;
        default: v[i] = (int64_t)tu_rng_below(r, 41) - 20; break;
        }
    }
}

static void test_print_roundtrip(void)
{
    tu_rng_t r;
    tu_rng_seed(&r, 20240611);
    int target = 600, done = 0, discarded = 0, printer_bug = 0, tries = 0;
    int evals = 0, eval_errors = 0, ub_skipped = 0;
    while (done < target && tries < 100 * target) {
        tries++;
        gen_t g = {.r = &r};
        gen_expr(&g, 1 + (int)tu_rng_below(&r, 5));
        if (g.overflow) {
            discarded++;
            continue;
        }
        char msg[512];
        const w16_expr_t *x = parse_in(g.buf, ALL_WHERE, msg, sizeof msg);
        if (!x) {
            /* The generator writes comparisons without parentheses; the
             * only texts it may produce that do not parse are chained
             * comparisons and (rarely) over-deep nesting. */
            bool expected = strstr(msg, "comparisons do not chain") ||
                            strstr(msg, "nested too deeply");
            TU_CHECK_MSG(expected, "generated \"%s\" does not parse: %s",
                         g.buf, msg);
            discarded++;
            continue;
        }
        done++;
        w16_buf_t b1, b2;
        w16_buf_init(&b1, ctx);
        w16_buf_init(&b2, ctx);
        w16_expr_print(&b1, x);
        const w16_expr_t *y = parse_in(b1.data, ALL_WHERE, msg, sizeof msg);
        if (!y) {
            bool known = has_left_nested_cmp(x) &&
                         strstr(msg, "comparisons do not chain");
            TU_CHECK_MSG(known, "\"%s\" prints as \"%s\", which does not "
                         "parse: %s", g.buf, b1.data, msg);
            printer_bug += known;
            w16_buf_free(&b1);
            w16_buf_free(&b2);
            continue;
        }
        w16_expr_print(&b2, y);
        TU_CHECK_MSG(strcmp(b1.data, b2.data) == 0, "print is not stable: "
                     "\"%s\" -> \"%s\" -> \"%s\"", g.buf, b1.data, b2.data);
        for (int t = 0; t < 8; t++) {
            int64_t v[W16_VAR_COUNT];
            random_env(&r, v);
            int64_t want = 0, want_y = 0;
            const char *want_what = NULL, *want_what_y = NULL;
            ref_status_t rs = ref_eval(x, v, &want, &want_what);
            ref_status_t rs_y = ref_eval(y, v, &want_y, &want_what_y);
            if (rs == R_UB || rs_y == R_UB) {
                ub_skipped++;
                continue;
            }
            int64_t a = 0, c = 0;
            w16_eval_error_t ea = {0}, ec = {0};
            bool oka = w16_expr_eval(x, v, &a, &ea);
            bool okc = w16_expr_eval(y, v, &c, &ec);
            evals++;
            eval_errors += !oka;
            TU_CHECK_MSG(oka == (rs == R_OK) &&
                         (oka ? a == want : strcmp(ea.what, want_what) == 0),
                         "\"%s\": the library gives %s %" PRId64 ", the "
                         "oracle %s %" PRId64, b1.data, oka ? "ok" : ea.what,
                         a, rs == R_OK ? "ok" : want_what, want);
            TU_CHECK_MSG(oka == okc && (oka ? a == c
                                            : strcmp(ea.what, ec.what) == 0),
                         "\"%s\" and its print \"%s\" disagree: %s %" PRId64
                         " vs %s %" PRId64, g.buf, b1.data,
                         oka ? "ok" : ea.what, a, okc ? "ok" : ec.what, c);
        }
        w16_buf_free(&b1);
        w16_buf_free(&b2);
    }
    TU_CHECK(done == target);
    printf("print round trip: %d expressions (%d generated texts discarded), "
           "%d evaluations checked against the oracle (%d evaluation errors, "
           "%d skipped as undefined behaviour in gen/expr.c)\n", done,
           discarded, evals, eval_errors, ub_skipped);
    KNOWN_BUG(ub_skipped > 0, "%d random evaluations would execute undefined "
              "behaviour in gen/expr.c eval() (cdiv/round_up/gcd/lcm signed "
              "overflow or negation of INT64_MIN)", ub_skipped);
    KNOWN_BUG(printer_bug > 0, "%d of %d printed expressions do not re-parse "
              "(left-nested comparison printed without parentheses, "
              "gen/expr.c print())", printer_bug, done);
}

int main(void)
{
    ctx = tu_context();
    w16_arena_init(&arena, ctx);
    set_env();
    all_scope = (w16_scope_t){.where = ALL_WHERE, .tables = tables,
                              .n_tables = 2, .let_names = let_names,
                              .let_exprs = let_exprs, .n_lets = 0};
    /* lets: w = k / PF, then w2 = w * 2 (each may use the ones before) */
    char msg[256];
    let_exprs[0] = parse_in("k / PF", ALL_WHERE, msg, sizeof msg);
    all_scope.n_lets = 1;
    let_exprs[1] = parse_in("w * 2", ALL_WHERE, msg, sizeof msg);
    all_scope.n_lets = 2;
    if (!let_exprs[0] || !let_exprs[1]) {
        fprintf(stderr, "lets do not parse: %s\n", msg);
        return 1;
    }

    test_operators();
    test_eval_errors();
    test_parse_errors();
    test_variables();
    test_print();
    test_print_roundtrip();
    printf("test_expr: %d value/evaluation-error cases, %d parse-error cases, "
           "%d variables, %d known-bug reports\n", n_value_cases,
           n_parse_cases, (int)W16_VAR_COUNT, known_bug_hits);

    w16_arena_free(&arena);
    wna16_context_destroy(ctx);
    return tu_finish("test_expr");
}
