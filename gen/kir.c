/*
 * kir.c - construction, verification and printing of the kernel IR (see
 * kir.h). Constructors type-check as they build and return NULL on a type
 * error or out of memory; kir_verify re-checks the finished kernel (it is
 * what guards the emitters) and reports where.
 */
#include "gen/kir.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int bits;
    bool is_float;
} type_table[KIR_TYPE_COUNT] = {
#define X(e, name, bits, f) {name, bits, f},
    KIR_TYPE_LIST(X)
#undef X
};

static const struct {
    const char *name;
    int arity;
} op_table[KIR_OP_COUNT] = {
#define X(e, name, arity) {name, arity},
    KIR_OP_LIST(X)
#undef X
};

const char *kir_type_name(kir_type_t t) { return type_table[t].name; }
int kir_type_bits(kir_type_t t) { return type_table[t].bits; }
bool kir_type_is_float(kir_type_t t) { return type_table[t].is_float; }
bool kir_type_is_int(kir_type_t t) { return t >= KIR_I8 && t <= KIR_I64; }
const char *kir_op_name(kir_op_t op) { return op_table[op].name; }
int kir_op_arity(kir_op_t op) { return op_table[op].arity; }

/* ---- kernel and declarations --------------------------------------------- */

static bool is_c_identifier(const char *s)
{
    if (!s || !*s || isdigit((unsigned char)*s) || strlen(s) > 200)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return false;
    return true;
}

kir_kernel_t *kir_kernel_new(wna16_context_t *ctx, const char *name, int lanes)
{
    if (!is_c_identifier(name) || lanes < 1 || lanes > 1024)
        return NULL;
    kir_kernel_t tmp = {0};
    w16_arena_init(&tmp.arena, ctx);
    kir_kernel_t *k = w16_arena_alloc(&tmp.arena, sizeof *k);
    if (!k) {
        w16_arena_free(&tmp.arena);
        return NULL;
    }
    *k = tmp;
    /* The arena's first block now holds k itself; keep the head in k. */
    k->arena = tmp.arena;
    k->name = w16_arena_strdup(&k->arena, name);
    k->lanes = lanes;
    return k->name ? k : (w16_arena_free(&k->arena), NULL);
}

void kir_kernel_free(kir_kernel_t *k)
{
    if (!k)
        return;
    w16_arena_t a = k->arena; /* k lives in its own arena */
    w16_arena_free(&a);
}

/* Grows an arena-backed pointer array. */
static bool grow(kir_kernel_t *k, void ***items, int *n, int *cap)
{
    if (*n < *cap)
        return true;
    int nc = *cap ? *cap * 2 : 8;
    void **ni = w16_arena_alloc(&k->arena, sizeof(void *) * (size_t)nc);
    if (!ni)
        return false;
    if (*n)
        memcpy(ni, *items, sizeof(void *) * (size_t)*n);
    *items = ni;
    *cap = nc;
    return true;
}

const kir_param_t *kir_param(kir_kernel_t *k, const char *name,
                             kir_param_kind_t kind, kir_type_t type,
                             bool written)
{
    if (!k || !is_c_identifier(name) || type == KIR_VOID || type == KIR_I1)
        return NULL;
    if (!grow(k, (void ***)&k->params, &k->n_params, &k->cap_params))
        return NULL;
    kir_param_t *p = w16_arena_alloc(&k->arena, sizeof *p);
    if (!p || !(p->name = w16_arena_strdup(&k->arena, name)))
        return NULL;
    p->kind = kind;
    p->type = type;
    p->written = written && kind == KIR_PARAM_BUFFER;
    p->index = k->n_params;
    k->params[k->n_params++] = p;
    return p;
}

const kir_var_t *kir_var(kir_kernel_t *k, const char *name, kir_type_t type)
{
    if (!k || !is_c_identifier(name) || type == KIR_VOID)
        return NULL;
    if (!grow(k, (void ***)&k->vars, &k->n_vars, &k->cap_vars))
        return NULL;
    kir_var_t *v = w16_arena_alloc(&k->arena, sizeof *v);
    if (!v)
        return NULL;
    /* Names are made unique with the index: builders may reuse a name. */
    char buf[240];
    snprintf(buf, sizeof buf, "%s_%d", name, k->n_vars);
    if (!(v->name = w16_arena_strdup(&k->arena, buf)))
        return NULL;
    v->type = type;
    v->index = k->n_vars;
    k->vars[k->n_vars++] = v;
    return v;
}

const kir_shared_t *kir_shared(kir_kernel_t *k, const char *name,
                               kir_type_t type, int64_t count)
{
    if (!k || !is_c_identifier(name) || type == KIR_VOID || type == KIR_I1 ||
        count < 1 || count > (1 << 20))
        return NULL;
    if (!grow(k, (void ***)&k->shared, &k->n_shared, &k->cap_shared))
        return NULL;
    kir_shared_t *s = w16_arena_alloc(&k->arena, sizeof *s);
    if (!s || !(s->name = w16_arena_strdup(&k->arena, name)))
        return NULL;
    s->type = type;
    s->count = count;
    s->index = k->n_shared;
    k->shared[k->n_shared++] = s;
    return s;
}

const kir_ctable_t *kir_ctable(kir_kernel_t *k, const char *name,
                               kir_type_t type, const int64_t *values,
                               int count)
{
    if (!k || !is_c_identifier(name) || !kir_type_is_int(type) || count < 1 ||
        count > 65536)
        return NULL;
    int bits = kir_type_bits(type);
    for (int i = 0; i < count; i++)
        if (bits < 64 && (values[i] < -(INT64_C(1) << (bits - 1)) ||
                          values[i] >= (INT64_C(1) << (bits - 1))))
            return NULL;
    if (!grow(k, (void ***)&k->ctables, &k->n_ctables, &k->cap_ctables))
        return NULL;
    kir_ctable_t *t = w16_arena_alloc(&k->arena, sizeof *t);
    int64_t *v = w16_arena_alloc(&k->arena, sizeof(int64_t) * (size_t)count);
    if (!t || !v || !(t->name = w16_arena_strdup(&k->arena, name)))
        return NULL;
    memcpy(v, values, sizeof(int64_t) * (size_t)count);
    t->type = type;
    t->values = v;
    t->count = count;
    t->index = k->n_ctables;
    k->ctables[k->n_ctables++] = t;
    return t;
}

/* ---- expressions --------------------------------------------------------- */

/* Records the first construction failure and returns NULL. */
static void *broke(kir_kernel_t *k, const char *what)
{
    if (k && !k->broken)
        k->broken = what;
    return NULL;
}

static kir_expr_t *node(kir_kernel_t *k, kir_op_t op, kir_type_t t)
{
    kir_expr_t *e = k ? w16_arena_alloc(&k->arena, sizeof *e) : NULL;
    if (!e)
        return broke(k, "out of memory");
    e->op = op;
    e->type = t;
    return e;
}

static int64_t wrap(kir_type_t t, int64_t v)
{
    switch (t) {
    case KIR_I1: return v & 1;
    case KIR_I8: return (int8_t)v;
    case KIR_I16: return (int16_t)v;
    case KIR_I32: return (int32_t)v;
    default: return v;
    }
}

const kir_expr_t *kir_const(kir_kernel_t *k, kir_type_t t, int64_t v)
{
    if (!(kir_type_is_int(t) || t == KIR_I1))
        return broke(k, "integer constant of a non-integer type");
    kir_expr_t *e = node(k, KIR_OP_CONST, t);
    if (e)
        e->ival = wrap(t, v);
    return e;
}

const kir_expr_t *kir_fconst(kir_kernel_t *k, kir_type_t t, double v)
{
    if (!kir_type_is_float(t))
        return broke(k, "float constant of a non-float type");
    kir_expr_t *e = node(k, KIR_OP_CONST, t);
    if (e)
        e->fval = v;
    return e;
}

const kir_expr_t *kir_ref(kir_kernel_t *k, const kir_var_t *v)
{
    if (!v)
        return broke(k, "reference to a missing variable");
    kir_expr_t *e = node(k, KIR_OP_VAR, v->type);
    if (e)
        e->var = v;
    return e;
}

const kir_expr_t *kir_pref(kir_kernel_t *k, const kir_param_t *p)
{
    if (!p || p->kind != KIR_PARAM_SCALAR)
        return broke(k, "reference to a missing or non-scalar parameter");
    kir_expr_t *e = node(k, KIR_OP_PARAM, p->type);
    if (e)
        e->param = p;
    return e;
}

const kir_expr_t *kir_builtin(kir_kernel_t *k, kir_op_t op)
{
    switch (op) {
    case KIR_OP_GROUP_ID:
    case KIR_OP_NUM_GROUPS:
        return node(k, op, KIR_I64);
    case KIR_OP_LANE_ID:
        return node(k, op, KIR_I32);
    default:
        return NULL;
    }
}

/* The result type of op on operands of type a (and b), or VOID if the
 * combination is invalid. */
static kir_type_t result_type(kir_op_t op, kir_type_t a, kir_type_t b)
{
    bool ai = kir_type_is_int(a) || a == KIR_I1;
    switch (op) {
    case KIR_OP_NEG:
        return kir_type_is_int(a) ? a : KIR_VOID;
    case KIR_OP_NOT:
        return ai ? a : KIR_VOID;
    case KIR_OP_FEXP: case KIR_OP_FTANH: case KIR_OP_FERF:
        return a == KIR_F32 ? a : KIR_VOID;
    case KIR_OP_ADD: case KIR_OP_SUB: case KIR_OP_MUL: case KIR_OP_UDIV:
    case KIR_OP_SDIV: case KIR_OP_UREM: case KIR_OP_SREM: case KIR_OP_SHL:
    case KIR_OP_LSHR: case KIR_OP_ASHR: case KIR_OP_SMIN: case KIR_OP_SMAX:
        return kir_type_is_int(a) && a == b ? a : KIR_VOID;
    case KIR_OP_AND: case KIR_OP_OR: case KIR_OP_XOR:
        return ai && a == b ? a : KIR_VOID;
    case KIR_OP_FADD: case KIR_OP_FSUB: case KIR_OP_FMUL: case KIR_OP_FDIV:
    case KIR_OP_FMAX: case KIR_OP_FMIN:
        return a == KIR_F32 && b == KIR_F32 ? a : KIR_VOID;
    case KIR_OP_EQ: case KIR_OP_NE:
        return ai && a == b ? KIR_I1 : KIR_VOID;
    case KIR_OP_SLT: case KIR_OP_SLE: case KIR_OP_ULT: case KIR_OP_ULE:
        return kir_type_is_int(a) && a == b ? KIR_I1 : KIR_VOID;
    case KIR_OP_FLT: case KIR_OP_FLE:
        return a == KIR_F32 && b == KIR_F32 ? KIR_I1 : KIR_VOID;
    default:
        return KIR_VOID;
    }
}

const kir_expr_t *kir_un(kir_kernel_t *k, kir_op_t op, const kir_expr_t *a)
{
    if (!a || op_table[op].arity != 1)
        return broke(k, "unary operator without an operand");
    kir_type_t t = result_type(op, a->type, KIR_VOID);
    if (t == KIR_VOID)
        return broke(k, "ill-typed unary operator");
    kir_expr_t *e = node(k, op, t);
    if (e)
        e->a = a;
    return e;
}

const kir_expr_t *kir_bin(kir_kernel_t *k, kir_op_t op, const kir_expr_t *a,
                          const kir_expr_t *b)
{
    if (!a || !b || op_table[op].arity != 2)
        return broke(k, "binary operator without its operands");
    kir_type_t t = result_type(op, a->type, b->type);
    if (t == KIR_VOID)
        return broke(k, "ill-typed binary operator");
    kir_expr_t *e = node(k, op, t);
    if (e) {
        e->a = a;
        e->b = b;
    }
    return e;
}

const kir_expr_t *kir_select(kir_kernel_t *k, const kir_expr_t *c,
                             const kir_expr_t *a, const kir_expr_t *b)
{
    if (!c || !a || !b || c->type != KIR_I1 || a->type != b->type)
        return broke(k, "ill-typed or incomplete select");
    kir_expr_t *e = node(k, KIR_OP_SELECT, a->type);
    if (e) {
        e->a = c;
        e->b = a;
        e->c = b;
    }
    return e;
}

static bool convert_ok(kir_op_t op, kir_type_t to, kir_type_t from)
{
    int tb = kir_type_bits(to), fb = kir_type_bits(from);
    bool ti = kir_type_is_int(to) || to == KIR_I1;
    bool fi = kir_type_is_int(from) || from == KIR_I1;
    switch (op) {
    case KIR_OP_ZEXT: case KIR_OP_SEXT: return ti && fi && tb > fb;
    case KIR_OP_TRUNC: return ti && fi && tb < fb;
    case KIR_OP_SITOF: return kir_type_is_float(to) && kir_type_is_int(from);
    case KIR_OP_FTOSI: return kir_type_is_int(to) && kir_type_is_float(from);
    case KIR_OP_FCONV:
        return kir_type_is_float(to) && kir_type_is_float(from) && to != from;
    case KIR_OP_BITCAST: return to != from && tb == fb && to != KIR_I1;
    default: return false;
    }
}

const kir_expr_t *kir_convert(kir_kernel_t *k, kir_op_t op, kir_type_t to,
                              const kir_expr_t *a)
{
    if (!a || !convert_ok(op, to, a->type))
        return broke(k, "invalid conversion");
    kir_expr_t *e = node(k, op, to);
    if (e)
        e->a = a;
    return e;
}

const kir_expr_t *kir_int_cast(kir_kernel_t *k, kir_type_t to,
                               const kir_expr_t *a, bool is_signed)
{
    if (!a)
        return broke(k, "cast of a missing value");
    int tb = kir_type_bits(to), fb = kir_type_bits(a->type);
    if (tb == fb)
        return a->type == to ? a : broke(k, "int cast between different types");
    if (a->op == KIR_OP_CONST && kir_type_is_int(a->type))
        return kir_const(k, to, is_signed || fb == 64
                                    ? a->ival
                                    : (int64_t)((uint64_t)a->ival &
                                                ((1ull << fb) - 1)));
    return kir_convert(k, tb > fb ? (is_signed ? KIR_OP_SEXT : KIR_OP_ZEXT)
                                  : KIR_OP_TRUNC, to, a);
}

const kir_expr_t *kir_load(kir_kernel_t *k, const kir_param_t *buf,
                           const kir_expr_t *index)
{
    if (!buf || !index || buf->kind != KIR_PARAM_BUFFER ||
        index->type != KIR_I64)
        return broke(k, "ill-formed load");
    kir_expr_t *e = node(k, KIR_OP_LOAD, buf->type);
    if (e) {
        e->param = buf;
        e->a = index;
    }
    return e;
}

const kir_expr_t *kir_tload(kir_kernel_t *k, const kir_param_t *table,
                            const kir_expr_t *slot, const kir_expr_t *index)
{
    if (!table || !slot || !index || table->kind != KIR_PARAM_BUFFER_TABLE ||
        slot->type != KIR_I64 || index->type != KIR_I64)
        return broke(k, "ill-formed table load (missing source table?)");
    kir_expr_t *e = node(k, KIR_OP_TLOAD, table->type);
    if (e) {
        e->param = table;
        e->a = slot;
        e->b = index;
    }
    return e;
}

const kir_expr_t *kir_shared_load(kir_kernel_t *k, const kir_shared_t *s,
                                  const kir_expr_t *index)
{
    if (!s || !index || index->type != KIR_I32)
        return broke(k, "ill-formed shared load");
    kir_expr_t *e = node(k, KIR_OP_SHARED_LOAD, s->type);
    if (e) {
        e->shared = s;
        e->a = index;
    }
    return e;
}

const kir_expr_t *kir_ctload(kir_kernel_t *k, const kir_ctable_t *t,
                             const kir_expr_t *index)
{
    if (!t || !index || index->type != KIR_I64)
        return broke(k, "ill-formed constant table load");
    kir_expr_t *e = node(k, KIR_OP_CTLOAD, t->type);
    if (e) {
        e->ctable = t;
        e->a = index;
    }
    return e;
}

/* ---- statements ---------------------------------------------------------- */

static kir_stmt_t *stmt(kir_kernel_t *k, kir_block_t *b, kir_stmt_kind_t kind)
{
    if (!k || !b || !grow(k, (void ***)&b->items, &b->count, &b->cap))
        return broke(k, "out of memory (statement list)");
    kir_stmt_t *s = w16_arena_alloc(&k->arena, sizeof *s);
    if (s) {
        s->kind = kind;
        b->items[b->count++] = s;
    }
    return s;
}

kir_stmt_t *kir_let(kir_kernel_t *k, kir_block_t *b, const kir_var_t *v,
                    const kir_expr_t *e)
{
    if (!v || !e || v->type != e->type)
        return broke(k, "ill-typed or incomplete let");
    kir_stmt_t *s = stmt(k, b, KIR_S_LET);
    if (s) {
        s->var = v;
        s->a = e;
    }
    return s;
}

kir_stmt_t *kir_assign(kir_kernel_t *k, kir_block_t *b, const kir_var_t *v,
                       const kir_expr_t *e)
{
    if (!v || !e || v->type != e->type)
        return broke(k, "ill-typed or incomplete assignment");
    kir_stmt_t *s = stmt(k, b, KIR_S_ASSIGN);
    if (s) {
        s->var = v;
        s->a = e;
    }
    return s;
}

kir_stmt_t *kir_store(kir_kernel_t *k, kir_block_t *b, const kir_param_t *buf,
                      const kir_expr_t *index, const kir_expr_t *value)
{
    if (!buf || !index || !value || buf->kind != KIR_PARAM_BUFFER ||
        !buf->written || index->type != KIR_I64 || value->type != buf->type)
        return broke(k, "ill-typed or incomplete store");
    kir_stmt_t *s = stmt(k, b, KIR_S_STORE);
    if (s) {
        s->param = buf;
        s->a = index;
        s->b = value;
    }
    return s;
}

kir_stmt_t *kir_shared_store(kir_kernel_t *k, kir_block_t *b,
                             const kir_shared_t *sh, const kir_expr_t *index,
                             const kir_expr_t *value)
{
    if (!sh || !index || !value || index->type != KIR_I32 ||
        value->type != sh->type)
        return broke(k, "ill-typed or incomplete shared store");
    kir_stmt_t *s = stmt(k, b, KIR_S_SHARED_STORE);
    if (s) {
        s->shared = sh;
        s->a = index;
        s->b = value;
    }
    return s;
}

kir_stmt_t *kir_if(kir_kernel_t *k, kir_block_t *b, const kir_expr_t *cond)
{
    if (!cond || cond->type != KIR_I1)
        return broke(k, "if without an i1 condition");
    kir_stmt_t *s = stmt(k, b, KIR_S_IF);
    if (s)
        s->a = cond;
    return s;
}

kir_stmt_t *kir_for(kir_kernel_t *k, kir_block_t *b, const kir_var_t *v,
                    const kir_expr_t *lo, const kir_expr_t *hi, int64_t step)
{
    if (!v || !lo || !hi || step < 1 || !kir_type_is_int(v->type) ||
        lo->type != v->type || hi->type != v->type)
        return broke(k, "ill-formed for loop");
    kir_stmt_t *s = stmt(k, b, KIR_S_FOR);
    if (s) {
        s->var = v;
        s->a = lo;
        s->b = hi;
        s->step = step;
    }
    return s;
}

kir_stmt_t *kir_barrier(kir_kernel_t *k, kir_block_t *b)
{
    return stmt(k, b, KIR_S_BARRIER);
}

kir_stmt_t *kir_return(kir_kernel_t *k, kir_block_t *b)
{
    return stmt(k, b, KIR_S_RETURN);
}

/* ---- verification -------------------------------------------------------- */

typedef struct verifier {
    const kir_kernel_t *k;
    wna16_error_t *err;
    bool *defined; /* per var */
    bool failed;
} verifier_t;

static bool vfail(verifier_t *v, const char *what, const char *detail)
{
    if (!v->failed)
        w16_err(v->err, WNA16_EINTERNAL, "kernel %s: %s%s%s", v->k->name, what,
                detail ? ": " : "", detail ? detail : "");
    v->failed = true;
    return false;
}

static bool verify_expr(verifier_t *v, const kir_expr_t *e)
{
    if (!e)
        return vfail(v, "missing expression (a builder ran out of memory or "
                     "built an ill-typed node)", NULL);
    int ar = op_table[e->op].arity;
    if ((ar >= 1 && !verify_expr(v, e->a)) || (ar >= 2 && !verify_expr(v, e->b)) ||
        (ar >= 3 && !verify_expr(v, e->c)))
        return false;
    switch (e->op) {
    case KIR_OP_VAR:
        if (!e->var || !v->defined[e->var->index])
            return vfail(v, "variable used before its let",
                         e->var ? e->var->name : NULL);
        return true;
    case KIR_OP_PARAM:
        return e->param && e->param->kind == KIR_PARAM_SCALAR
                   ? true : vfail(v, "bad scalar parameter reference", NULL);
    case KIR_OP_LOAD:
        return e->param && e->param->kind == KIR_PARAM_BUFFER &&
                       e->a->type == KIR_I64
                   ? true : vfail(v, "bad load", NULL);
    case KIR_OP_TLOAD:
        return e->param && e->param->kind == KIR_PARAM_BUFFER_TABLE
                   ? true : vfail(v, "bad table load", NULL);
    case KIR_OP_SELECT:
        return e->a->type == KIR_I1 && e->b->type == e->c->type &&
                       e->type == e->b->type
                   ? true : vfail(v, "ill-typed select", NULL);
    default:
        break;
    }
    if (ar == 2 && e->op != KIR_OP_TLOAD &&
        result_type(e->op, e->a->type, e->b->type) != e->type)
        return vfail(v, "ill-typed operator", op_table[e->op].name);
    return true;
}

static bool verify_block(verifier_t *v, const kir_block_t *b, int depth)
{
    if (depth > 64)
        return vfail(v, "statements nested too deeply", NULL);
    for (int i = 0; i < b->count; i++) {
        const kir_stmt_t *s = b->items[i];
        switch (s->kind) {
        case KIR_S_LET:
            if (v->defined[s->var->index])
                return vfail(v, "variable defined twice", s->var->name);
            if (!verify_expr(v, s->a))
                return false;
            v->defined[s->var->index] = true;
            break;
        case KIR_S_ASSIGN:
            if (!v->defined[s->var->index])
                return vfail(v, "assignment before let", s->var->name);
            if (!verify_expr(v, s->a))
                return false;
            break;
        case KIR_S_STORE:
        case KIR_S_SHARED_STORE:
            if (!verify_expr(v, s->a) || !verify_expr(v, s->b))
                return false;
            if (s->kind == KIR_S_STORE && !s->param->written)
                return vfail(v, "store to a read-only buffer", s->param->name);
            break;
        case KIR_S_IF:
            if (!verify_expr(v, s->a) || !verify_block(v, &s->body, depth + 1) ||
                !verify_block(v, &s->else_body, depth + 1))
                return false;
            break;
        case KIR_S_FOR:
            if (v->defined[s->var->index])
                return vfail(v, "loop variable defined twice", s->var->name);
            if (!verify_expr(v, s->a) || !verify_expr(v, s->b))
                return false;
            v->defined[s->var->index] = true;
            if (!verify_block(v, &s->body, depth + 1))
                return false;
            break;
        case KIR_S_BARRIER:
        case KIR_S_RETURN:
            break;
        }
    }
    return true;
}

wna16_status_t kir_verify(const kir_kernel_t *k, wna16_error_t *err)
{
    if (!k)
        return w16_err(err, WNA16_EINTERNAL, "kernel: NULL (out of memory?)");
    if (k->broken)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: %s", k->name, k->broken);
    bool defined[4096] = {0};
    if (k->n_vars > 4096)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: too many variables",
                       k->name);
    verifier_t v = {k, err, defined, false};
    verify_block(&v, &k->body, 0);
    return v.failed ? WNA16_EINTERNAL : WNA16_OK;
}

/* ---- printing ------------------------------------------------------------ */

static void print_expr(w16_buf_t *b, const kir_expr_t *e)
{
    switch (e->op) {
    case KIR_OP_CONST:
        if (kir_type_is_float(e->type))
            w16_buf_printf(b, "%.9g:%s", e->fval, kir_type_name(e->type));
        else
            w16_buf_printf(b, "%lld:%s", (long long)e->ival,
                           kir_type_name(e->type));
        return;
    case KIR_OP_VAR: w16_buf_puts(b, e->var->name); return;
    case KIR_OP_PARAM: w16_buf_printf(b, "%%%s", e->param->name); return;
    case KIR_OP_GROUP_ID: case KIR_OP_LANE_ID: case KIR_OP_NUM_GROUPS:
        w16_buf_puts(b, op_table[e->op].name);
        return;
    case KIR_OP_LOAD:
        w16_buf_printf(b, "%%%s[", e->param->name);
        print_expr(b, e->a);
        w16_buf_putc(b, ']');
        return;
    case KIR_OP_TLOAD:
        w16_buf_printf(b, "%%%s[", e->param->name);
        print_expr(b, e->a);
        w16_buf_puts(b, "][");
        print_expr(b, e->b);
        w16_buf_putc(b, ']');
        return;
    case KIR_OP_SHARED_LOAD:
        w16_buf_printf(b, "@%s[", e->shared->name);
        print_expr(b, e->a);
        w16_buf_putc(b, ']');
        return;
    case KIR_OP_CTLOAD:
        w16_buf_printf(b, "$%s[", e->ctable->name);
        print_expr(b, e->a);
        w16_buf_putc(b, ']');
        return;
    default:
        break;
    }
    w16_buf_printf(b, "%s", op_table[e->op].name);
    if (e->op >= KIR_OP_ZEXT && e->op <= KIR_OP_BITCAST)
        w16_buf_printf(b, ".%s", kir_type_name(e->type));
    w16_buf_putc(b, '(');
    print_expr(b, e->a);
    if (e->b) {
        w16_buf_puts(b, ", ");
        print_expr(b, e->b);
    }
    if (e->c) {
        w16_buf_puts(b, ", ");
        print_expr(b, e->c);
    }
    w16_buf_putc(b, ')');
}

static void indent(w16_buf_t *b, int d)
{
    for (int i = 0; i < d; i++)
        w16_buf_puts(b, "  ");
}

static void print_block(w16_buf_t *b, const kir_block_t *blk, int d)
{
    for (int i = 0; i < blk->count; i++) {
        const kir_stmt_t *s = blk->items[i];
        indent(b, d);
        switch (s->kind) {
        case KIR_S_LET:
        case KIR_S_ASSIGN:
            w16_buf_printf(b, "%s%s:%s = ", s->kind == KIR_S_LET ? "let " : "",
                           s->var->name, kir_type_name(s->var->type));
            print_expr(b, s->a);
            break;
        case KIR_S_STORE:
        case KIR_S_SHARED_STORE:
            w16_buf_printf(b, "%s%s[", s->kind == KIR_S_STORE ? "%" : "@",
                           s->kind == KIR_S_STORE ? s->param->name
                                                  : s->shared->name);
            print_expr(b, s->a);
            w16_buf_puts(b, "] = ");
            print_expr(b, s->b);
            break;
        case KIR_S_IF:
            w16_buf_puts(b, "if ");
            print_expr(b, s->a);
            w16_buf_puts(b, " {\n");
            print_block(b, &s->body, d + 1);
            if (s->else_body.count) {
                indent(b, d);
                w16_buf_puts(b, "} else {\n");
                print_block(b, &s->else_body, d + 1);
            }
            indent(b, d);
            w16_buf_putc(b, '}');
            break;
        case KIR_S_FOR:
            w16_buf_printf(b, "for %s:%s in [", s->var->name,
                           kir_type_name(s->var->type));
            print_expr(b, s->a);
            w16_buf_puts(b, ", ");
            print_expr(b, s->b);
            w16_buf_printf(b, ") step %lld%s {\n", (long long)s->step,
                           s->unroll ? " unroll" : "");
            print_block(b, &s->body, d + 1);
            indent(b, d);
            w16_buf_putc(b, '}');
            break;
        case KIR_S_BARRIER: w16_buf_puts(b, "barrier"); break;
        case KIR_S_RETURN: w16_buf_puts(b, "return"); break;
        }
        w16_buf_putc(b, '\n');
    }
}

void kir_print(w16_buf_t *b, const kir_kernel_t *k)
{
    if (k->comment)
        w16_buf_printf(b, "; %s\n", k->comment);
    w16_buf_printf(b, "kernel %s lanes %d%s (", k->name, k->lanes,
                   k->fp_reassoc ? " fp_reassoc" : "");
    static const char *const kinds[] = {"", "*", "**"};
    for (int i = 0; i < k->n_params; i++) {
        const kir_param_t *p = k->params[i];
        w16_buf_printf(b, "%s%%%s: %s%s%s", i ? ", " : "", p->name,
                       kir_type_name(p->type), kinds[p->kind],
                       p->written ? " out" : "");
    }
    w16_buf_puts(b, ") {\n");
    for (int i = 0; i < k->n_shared; i++)
        w16_buf_printf(b, "  shared @%s: %s[%lld]\n", k->shared[i]->name,
                       kir_type_name(k->shared[i]->type),
                       (long long)k->shared[i]->count);
    for (int i = 0; i < k->n_ctables; i++) {
        const kir_ctable_t *t = k->ctables[i];
        w16_buf_printf(b, "  const $%s: %s[%d] = {", t->name,
                       kir_type_name(t->type), t->count);
        for (int j = 0; j < t->count; j++)
            w16_buf_printf(b, "%s%lld", j ? ", " : "", (long long)t->values[j]);
        w16_buf_puts(b, "}\n");
    }
    if (k->native)
        w16_buf_printf(b, "  native {\n%s\n  }\n", k->native->text);
    print_block(b, &k->body, 1);
    w16_buf_puts(b, "}\n");
}
