/*
 * expr.c - parser, evaluator and printer of the spec expression language
 * (grammar in expr.h). A recursive-descent parser builds an AST in the
 * caller's arena and resolves every identifier at parse time, so an AST that
 * exists is well formed: only allowed variables, declared tables and lets.
 */
#include "spec/expr.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    unsigned where;
    const char *doc;
} var_table[W16_VAR_COUNT] = {
#define X(name, where, doc) {#name, where, doc},
    W16_VAR_LIST(X)
#undef X
};

const char *w16_var_name(w16_var_t v) { return var_table[v].name; }
const char *w16_var_doc(w16_var_t v) { return var_table[v].doc; }
unsigned w16_var_where(w16_var_t v) { return var_table[v].where; }

static const struct {
    const char *name;
    w16_op_t op;
} functions[] = {
    {"min", W16_OP_MIN},   {"max", W16_OP_MAX},
    {"cdiv", W16_OP_CDIV}, {"round_up", W16_OP_ROUND_UP},
    {"gcd", W16_OP_GCD},   {"lcm", W16_OP_LCM},
};

/* ---- parser -------------------------------------------------------------- */

typedef struct parser {
    const char *text, *p;
    w16_arena_t *arena;
    const w16_scope_t *scope;
    char *msg;
    size_t msg_size;
    bool failed;
    int depth;
} parser_t;

enum { MAX_DEPTH = 64 };

static const w16_expr_t *fail(parser_t *ps, const char *fmt, ...)
    W16_PRINTF(2, 3);

static const w16_expr_t *fail(parser_t *ps, const char *fmt, ...)
{
    if (!ps->failed) {
        ps->failed = true;
        char what[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        snprintf(ps->msg, ps->msg_size, "%s at column %d of \"%s\"", what,
                 (int)(ps->p - ps->text) + 1, ps->text);
    }
    return NULL;
}

static void skip_ws(parser_t *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

/* Consumes `tok` if next (and, for single-char operators, not the start of
 * a longer one given in `not_next`). */
static bool accept(parser_t *ps, const char *tok, const char *not_next)
{
    skip_ws(ps);
    size_t n = strlen(tok);
    if (strncmp(ps->p, tok, n) != 0)
        return false;
    if (not_next && ps->p[n] && strchr(not_next, ps->p[n]))
        return false;
    ps->p += n;
    return true;
}

static w16_expr_t *node(parser_t *ps, w16_op_t op)
{
    w16_expr_t *x = w16_arena_alloc(ps->arena, sizeof *x);
    if (!x) {
        fail(ps, "out of memory");
        return NULL;
    }
    x->op = op;
    return x;
}

static const w16_expr_t *binary(parser_t *ps, w16_op_t op,
                                const w16_expr_t *a, const w16_expr_t *b)
{
    if (!a || !b)
        return NULL;
    w16_expr_t *x = node(ps, op);
    if (x) {
        x->a = a;
        x->b = b;
    }
    return x;
}

static const w16_expr_t *parse_expr(parser_t *ps);

static const w16_expr_t *parse_ident(parser_t *ps)
{
    const char *start = ps->p;
    while (isalnum((unsigned char)*ps->p) || *ps->p == '_')
        ps->p++;
    char name[64];
    size_t len = (size_t)(ps->p - start);
    if (len >= sizeof name)
        return fail(ps, "identifier too long");
    memcpy(name, start, len);
    name[len] = '\0';

    skip_ws(ps);
    if (*ps->p == '(') { /* function call */
        for (size_t i = 0; i < W16_ARRAY_LEN(functions); i++) {
            if (strcmp(functions[i].name, name) != 0)
                continue;
            ps->p++;
            const w16_expr_t *a = parse_expr(ps);
            if (!accept(ps, ",", NULL))
                return fail(ps, "%s() takes two arguments", name);
            const w16_expr_t *b = parse_expr(ps);
            if (!accept(ps, ")", NULL))
                return fail(ps, "expected ')' after the arguments of %s()",
                            name);
            return binary(ps, functions[i].op, a, b);
        }
        ps->p = start;
        return fail(ps, "unknown function '%s' (known: min, max, cdiv, "
                        "round_up, gcd, lcm)", name);
    }
    const w16_scope_t *sc = ps->scope;
    for (int i = 0; i < sc->n_lets; i++)
        if (strcmp(sc->let_names[i], name) == 0)
            return sc->let_exprs[i];
    for (int i = 0; i < sc->n_tables; i++) {
        if (strcmp(sc->tables[i].name, name) != 0)
            continue;
        if (!accept(ps, "[", NULL))
            return fail(ps, "table '%s' must be indexed: NAME[expr]", name);
        const w16_expr_t *ix = parse_expr(ps);
        if (!accept(ps, "]", NULL))
            return fail(ps, "expected ']'");
        if (!ix)
            return NULL;
        w16_expr_t *x = node(ps, W16_OP_TABLE);
        if (x) {
            x->table = &sc->tables[i];
            x->a = ix;
        }
        return x;
    }
    for (int v = 0; v < W16_VAR_COUNT; v++) {
        if (strcmp(var_table[v].name, name) != 0)
            continue;
        if (!(var_table[v].where & sc->where)) {
            ps->p = start;
            return fail(ps, "'%s' cannot be used here", name);
        }
        w16_expr_t *x = node(ps, W16_OP_VAR);
        if (x)
            x->var = (w16_var_t)v;
        return x;
    }
    ps->p = start;
    return fail(ps, "unknown identifier '%s'", name);
}

static const w16_expr_t *parse_primary(parser_t *ps)
{
    skip_ws(ps);
    if (isdigit((unsigned char)*ps->p)) {
        int64_t v = 0;
        int base = 10;
        if (ps->p[0] == '0' && (ps->p[1] == 'x' || ps->p[1] == 'X')) {
            base = 16;
            ps->p += 2;
            if (!isxdigit((unsigned char)*ps->p))
                return fail(ps, "bad hexadecimal number");
        }
        while (base == 16 ? isxdigit((unsigned char)*ps->p)
                          : isdigit((unsigned char)*ps->p)) {
            int d = isdigit((unsigned char)*ps->p)
                        ? *ps->p - '0'
                        : tolower((unsigned char)*ps->p) - 'a' + 10;
            if (v > (INT64_MAX - d) / base)
                return fail(ps, "number too large");
            v = v * base + d;
            ps->p++;
        }
        if (isalpha((unsigned char)*ps->p) || *ps->p == '_')
            return fail(ps, "bad number");
        w16_expr_t *x = node(ps, W16_OP_CONST);
        if (x)
            x->value = v;
        return x;
    }
    if (isalpha((unsigned char)*ps->p) || *ps->p == '_')
        return parse_ident(ps);
    if (*ps->p == '(') {
        ps->p++;
        const w16_expr_t *x = parse_expr(ps);
        if (!accept(ps, ")", NULL))
            return fail(ps, "expected ')'");
        return x;
    }
    if (!*ps->p)
        return fail(ps, "unexpected end of expression");
    return fail(ps, "unexpected character");
}

static const w16_expr_t *parse_unary(parser_t *ps)
{
    static const struct { const char *tok, *not_next; w16_op_t op; } un[] = {
        {"-", NULL, W16_OP_NEG}, {"!", "=", W16_OP_NOT}, {"~", NULL, W16_OP_BNOT},
    };
    if (++ps->depth > MAX_DEPTH)
        return fail(ps, "expression nested too deeply");
    const w16_expr_t *r = NULL;
    for (size_t i = 0; i < W16_ARRAY_LEN(un); i++) {
        if (accept(ps, un[i].tok, un[i].not_next)) {
            const w16_expr_t *a = parse_unary(ps);
            w16_expr_t *x = a ? node(ps, un[i].op) : NULL;
            if (x)
                x->a = a;
            ps->depth--;
            return x;
        }
    }
    r = parse_primary(ps);
    ps->depth--;
    return r;
}

/* Binary operator levels, loosest last; each level: tokens, ops. A token's
 * not_next characters keep "<" from matching "<<" or "<=", etc. */
typedef struct binop { const char *tok, *not_next; w16_op_t op; } binop_t;
static const binop_t lv_mul[] = {{"*", NULL, W16_OP_MUL}, {"/", NULL, W16_OP_DIV},
                                 {"%", NULL, W16_OP_MOD}, {NULL, NULL, 0}};
static const binop_t lv_add[] = {{"+", NULL, W16_OP_ADD}, {"-", NULL, W16_OP_SUB},
                                 {NULL, NULL, 0}};
static const binop_t lv_shift[] = {{"<<", NULL, W16_OP_SHL}, {">>", NULL, W16_OP_SHR},
                                   {NULL, NULL, 0}};
static const binop_t lv_cmp[] = {{"==", NULL, W16_OP_EQ}, {"!=", NULL, W16_OP_NE},
                                 {"<=", NULL, W16_OP_LE}, {">=", NULL, W16_OP_GE},
                                 {"<", "<=", W16_OP_LT},  {">", ">=", W16_OP_GT},
                                 {NULL, NULL, 0}};
static const binop_t lv_band[] = {{"&", "&", W16_OP_AND}, {NULL, NULL, 0}};
static const binop_t lv_bxor[] = {{"^", NULL, W16_OP_XOR}, {NULL, NULL, 0}};
static const binop_t lv_bor[] = {{"|", "|", W16_OP_OR}, {NULL, NULL, 0}};
static const binop_t lv_land[] = {{"&&", NULL, W16_OP_LAND}, {NULL, NULL, 0}};
static const binop_t lv_lor[] = {{"||", NULL, W16_OP_LOR}, {NULL, NULL, 0}};

static const binop_t *const levels[] = {lv_lor, lv_land, lv_bor, lv_bxor,
                                        lv_band, lv_cmp, lv_shift, lv_add,
                                        lv_mul};
enum { N_LEVELS = sizeof levels / sizeof levels[0] };

static const w16_expr_t *parse_level(parser_t *ps, int level)
{
    if (level == N_LEVELS)
        return parse_unary(ps);
    const w16_expr_t *a = parse_level(ps, level + 1);
    bool chain = levels[level] != lv_cmp; /* a < b < c is an error */
    for (;;) {
        if (!a)
            return NULL;
        const binop_t *hit = NULL;
        for (const binop_t *o = levels[level]; o->tok; o++)
            if (accept(ps, o->tok, o->not_next)) {
                hit = o;
                break;
            }
        if (!hit)
            return a;
        const w16_expr_t *b = parse_level(ps, level + 1);
        a = binary(ps, hit->op, a, b);
        if (!chain) {
            for (const binop_t *o = lv_cmp; o->tok; o++) {
                skip_ws(ps);
                if (a && strncmp(ps->p, o->tok, strlen(o->tok)) == 0 &&
                    !(o->not_next && strchr(o->not_next, ps->p[1])))
                    return fail(ps, "comparisons do not chain; use &&");
            }
            return a;
        }
    }
}

static const w16_expr_t *parse_expr(parser_t *ps)
{
    if (++ps->depth > MAX_DEPTH)
        return fail(ps, "expression nested too deeply");
    const w16_expr_t *c = parse_level(ps, 0);
    if (c && accept(ps, "?", NULL)) {
        const w16_expr_t *t = parse_expr(ps);
        if (!accept(ps, ":", NULL)) {
            ps->depth--;
            return fail(ps, "expected ':' in a conditional");
        }
        const w16_expr_t *f = parse_expr(ps);
        w16_expr_t *x = (t && f) ? node(ps, W16_OP_COND) : NULL;
        if (x) {
            x->a = c;
            x->b = t;
            x->c = f;
        }
        ps->depth--;
        return x;
    }
    ps->depth--;
    return c;
}

const w16_expr_t *w16_expr_parse(w16_arena_t *arena, const char *text,
                                 const w16_scope_t *scope, char *msg,
                                 size_t msg_size)
{
    parser_t ps = {.text = text, .p = text, .arena = arena, .scope = scope,
                   .msg = msg, .msg_size = msg_size};
    if (msg_size)
        msg[0] = '\0';
    const w16_expr_t *x = parse_expr(&ps);
    if (x) {
        skip_ws(&ps);
        if (*ps.p)
            return fail(&ps, "unexpected text after the expression");
    }
    return ps.failed ? NULL : x;
}

/* ---- evaluation ---------------------------------------------------------- */

/* gcd of |a| and |b| in uint64 (|INT64_MIN| fits there). */
static uint64_t gcd64(int64_t a, int64_t b)
{
    uint64_t x = a < 0 ? 0 - (uint64_t)a : (uint64_t)a;
    uint64_t y = b < 0 ? 0 - (uint64_t)b : (uint64_t)b;
    while (y) {
        uint64_t t = x % y;
        x = y;
        y = t;
    }
    return x;
}

#define EVAL_FAIL(msg)                                                        \
    do {                                                                      \
        err->what = msg;                                                      \
        return false;                                                         \
    } while (0)

/* Arithmetic wraps in uint64 rather than trapping: overflow cannot happen
 * with the sizes specs describe, and wrapping is defined behaviour. */
static bool eval(const w16_expr_t *x, const int64_t *v, int64_t *out,
                 w16_eval_error_t *err)
{
    int64_t a = 0, b = 0;
    switch (x->op) {
    case W16_OP_CONST: *out = x->value; return true;
    case W16_OP_VAR: *out = v[x->var]; return true;
    case W16_OP_COND:
        if (!eval(x->a, v, &a, err))
            return false;
        return eval(a ? x->b : x->c, v, out, err);
    case W16_OP_LAND:
    case W16_OP_LOR:
        if (!eval(x->a, v, &a, err))
            return false;
        if ((x->op == W16_OP_LAND) ? !a : a) {
            *out = x->op == W16_OP_LOR;
            return true;
        }
        if (!eval(x->b, v, &b, err))
            return false;
        *out = b != 0;
        return true;
    default: break;
    }
    if (!eval(x->a, v, &a, err))
        return false;
    if (x->b && !eval(x->b, v, &b, err))
        return false;
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    switch (x->op) {
    case W16_OP_TABLE:
        if (a < 0 || a >= x->table->len)
            EVAL_FAIL("table index out of range");
        *out = x->table->values[a];
        return true;
    case W16_OP_NEG: *out = (int64_t)(0 - ua); return true;
    case W16_OP_NOT: *out = !a; return true;
    case W16_OP_BNOT: *out = ~a; return true;
    case W16_OP_ADD: *out = (int64_t)(ua + ub); return true;
    case W16_OP_SUB: *out = (int64_t)(ua - ub); return true;
    case W16_OP_MUL: *out = (int64_t)(ua * ub); return true;
    case W16_OP_DIV:
    case W16_OP_MOD:
    case W16_OP_CDIV:
    case W16_OP_ROUND_UP:
        if (b == 0)
            EVAL_FAIL("division by zero");
        if (b == -1) { /* the only quotient that can overflow */
            if (x->op == W16_OP_MOD || x->op == W16_OP_ROUND_UP) {
                *out = x->op == W16_OP_MOD ? 0 : a;
                return true;
            }
            if (a == INT64_MIN)
                EVAL_FAIL("arithmetic overflow");
            *out = -a;
            return true;
        }
        if (x->op == W16_OP_DIV) {
            *out = w16_floordiv(a, b);
        } else if (x->op == W16_OP_MOD) {
            *out = w16_floormod(a, b);
        } else {
            /* ceil(a / b) = floor(a / b) + (a % b != 0), no negation */
            int64_t q = w16_floordiv(a, b) + (w16_floormod(a, b) != 0);
            if (x->op == W16_OP_CDIV)
                *out = q;
            else if (__builtin_mul_overflow(q, b, out))
                EVAL_FAIL("arithmetic overflow");
        }
        return true;
    case W16_OP_SHL:
    case W16_OP_SHR:
        if (b < 0 || b > 63)
            EVAL_FAIL("shift amount outside [0, 63]");
        *out = x->op == W16_OP_SHL ? (int64_t)(ua << b) : (a >> b);
        return true;
    case W16_OP_AND: *out = a & b; return true;
    case W16_OP_OR: *out = a | b; return true;
    case W16_OP_XOR: *out = a ^ b; return true;
    case W16_OP_EQ: *out = a == b; return true;
    case W16_OP_NE: *out = a != b; return true;
    case W16_OP_LT: *out = a < b; return true;
    case W16_OP_LE: *out = a <= b; return true;
    case W16_OP_GT: *out = a > b; return true;
    case W16_OP_GE: *out = a >= b; return true;
    case W16_OP_MIN: *out = a < b ? a : b; return true;
    case W16_OP_MAX: *out = a > b ? a : b; return true;
    case W16_OP_GCD: {
        uint64_t g = gcd64(a, b);
        if (g > (uint64_t)INT64_MAX)
            EVAL_FAIL("arithmetic overflow");
        *out = (int64_t)g;
        return true;
    }
    case W16_OP_LCM: {
        uint64_t g = gcd64(a, b), l = 0;
        uint64_t ma = a < 0 ? 0 - ua : ua, mb = b < 0 ? 0 - ub : ub;
        if (g && (__builtin_mul_overflow(ma / g, mb, &l) ||
                  l > (uint64_t)INT64_MAX))
            EVAL_FAIL("arithmetic overflow");
        *out = (int64_t)l;
        return true;
    }
    default: EVAL_FAIL("internal error: unknown operator");
    }
}

bool w16_expr_eval(const w16_expr_t *x, const int64_t *vars, int64_t *out,
                   w16_eval_error_t *err)
{
    w16_eval_error_t dummy;
    if (!err)
        err = &dummy;
    err->what = NULL;
    return eval(x, vars, out, err);
}

static bool is_const(const w16_expr_t *x) { return x && x->op == W16_OP_CONST; }

const w16_expr_t *w16_expr_fold(w16_arena_t *arena, const w16_expr_t *x,
                                const int64_t *vars)
{
    if (!x)
        return NULL;
    /* The free variables are the contiguous run e .. z (ORDER VAR). */
    bool is_free = x->op == W16_OP_VAR && x->var >= W16_VAR_e &&
                   x->var <= W16_VAR_z;
    if (x->op == W16_OP_VAR && !is_free) {
        w16_expr_t *c = w16_arena_alloc(arena, sizeof *c);
        if (c) {
            c->op = W16_OP_CONST;
            c->value = vars[x->var];
        }
        return c;
    }
    if (x->op == W16_OP_CONST || x->op == W16_OP_VAR)
        return x;
    const w16_expr_t *a = w16_expr_fold(arena, x->a, vars);
    const w16_expr_t *b = x->b ? w16_expr_fold(arena, x->b, vars) : NULL;
    const w16_expr_t *c = x->c ? w16_expr_fold(arena, x->c, vars) : NULL;
    if ((x->a && !a) || (x->b && !b) || (x->c && !c))
        return NULL;
    if (x->op == W16_OP_COND && is_const(a))
        return a->value ? b : c;
    w16_expr_t *n = w16_arena_alloc(arena, sizeof *n);
    if (!n)
        return NULL;
    *n = *x;
    n->a = a;
    n->b = b;
    n->c = c;
    bool all_const = is_const(a) && (!b || is_const(b)) && (!c || is_const(c));
    if (all_const) {
        int64_t v;
        w16_eval_error_t e;
        if (w16_expr_eval(n, vars, &v, &e)) {
            n->op = W16_OP_CONST;
            n->value = v;
            n->a = n->b = n->c = NULL;
        }
    }
    return n;
}

bool w16_expr_uses(const w16_expr_t *x, w16_var_t v)
{
    if (!x)
        return false;
    if (x->op == W16_OP_VAR)
        return x->var == v;
    return w16_expr_uses(x->a, v) || w16_expr_uses(x->b, v) ||
           w16_expr_uses(x->c, v);
}

/* ---- printing ------------------------------------------------------------ */

static const struct {
    const char *text;
    int prec; /* higher binds tighter */
} op_info[] = {
    [W16_OP_LOR] = {"||", 1},  [W16_OP_LAND] = {"&&", 2},
    [W16_OP_OR] = {"|", 3},    [W16_OP_XOR] = {"^", 4},
    [W16_OP_AND] = {"&", 5},   [W16_OP_EQ] = {"==", 6},
    [W16_OP_NE] = {"!=", 6},   [W16_OP_LT] = {"<", 6},
    [W16_OP_LE] = {"<=", 6},   [W16_OP_GT] = {">", 6},
    [W16_OP_GE] = {">=", 6},   [W16_OP_SHL] = {"<<", 7},
    [W16_OP_SHR] = {">>", 7},  [W16_OP_ADD] = {"+", 8},
    [W16_OP_SUB] = {"-", 8},   [W16_OP_MUL] = {"*", 9},
    [W16_OP_DIV] = {"/", 9},   [W16_OP_MOD] = {"%", 9},
    [W16_OP_MIN] = {"min", 11}, [W16_OP_MAX] = {"max", 11},
    [W16_OP_CDIV] = {"cdiv", 11}, [W16_OP_ROUND_UP] = {"round_up", 11},
    [W16_OP_GCD] = {"gcd", 11}, [W16_OP_LCM] = {"lcm", 11},
};

static int prec_of(const w16_expr_t *x)
{
    switch (x->op) {
    case W16_OP_CONST: case W16_OP_VAR: case W16_OP_TABLE: return 12;
    case W16_OP_NEG: case W16_OP_NOT: case W16_OP_BNOT: return 10;
    case W16_OP_COND: return 0;
    default: return op_info[x->op].prec;
    }
}

static void print(w16_buf_t *b, const w16_expr_t *x, int min_prec)
{
    int p = prec_of(x);
    bool paren = p < min_prec;
    if (paren)
        w16_buf_putc(b, '(');
    switch (x->op) {
    case W16_OP_CONST: w16_buf_printf(b, "%lld", (long long)x->value); break;
    case W16_OP_VAR: w16_buf_puts(b, var_table[x->var].name); break;
    case W16_OP_TABLE:
        w16_buf_printf(b, "%s[", x->table->name);
        print(b, x->a, 0);
        w16_buf_putc(b, ']');
        break;
    case W16_OP_NEG: case W16_OP_NOT: case W16_OP_BNOT:
        w16_buf_putc(b, x->op == W16_OP_NEG ? '-' : x->op == W16_OP_NOT ? '!' : '~');
        print(b, x->a, 10);
        break;
    case W16_OP_COND:
        print(b, x->a, 1);
        w16_buf_puts(b, " ? ");
        print(b, x->b, 0);
        w16_buf_puts(b, " : ");
        print(b, x->c, 0);
        break;
    case W16_OP_MIN: case W16_OP_MAX: case W16_OP_CDIV: case W16_OP_ROUND_UP:
    case W16_OP_GCD: case W16_OP_LCM:
        w16_buf_printf(b, "%s(", op_info[x->op].text);
        print(b, x->a, 0);
        w16_buf_puts(b, ", ");
        print(b, x->b, 0);
        w16_buf_putc(b, ')');
        break;
    default:
        /* left-associative: the right operand needs one level more;
         * comparisons do not chain, so both sides do. */
        print(b, x->a, p == 6 ? p + 1 : p);
        w16_buf_printf(b, " %s ", op_info[x->op].text);
        print(b, x->b, p + 1);
        break;
    }
    if (paren)
        w16_buf_putc(b, ')');
}

void w16_expr_print(w16_buf_t *b, const w16_expr_t *x) { print(b, x, 0); }
