/*
 * expr.h - the integer expression language of specs.
 *
 * Layout maps, shapes, padding and selection rules in specs are small
 * integer expressions ("k / PF", "(k % 2) * 4", "AWQ_ORDER[slot]",
 * "H % 128 != 0 || PLATFORM == ROCM"). They are parsed once into an AST in
 * an arena, every identifier is resolved against the variables allowed in
 * that place, and the AST is what the reference interpreter evaluates and
 * what the generator lowers to kernel IR. Spec text never reaches generated
 * source.
 *
 *   expr    := cond
 *   cond    := lor ('?' expr ':' cond)?
 *   lor     := land ('||' land)*          land := bor ('&&' bor)*
 *   bor     := bxor ('|' bxor)*           bxor := band ('^' band)*
 *   band    := cmp ('&' cmp)*             cmp  := shift (CMPOP shift)?
 *   shift   := add (('<<'|'>>') add)*     add  := mul (('+'|'-') mul)*
 *   mul     := unary (('*'|'/'|'%') unary)*
 *   unary   := ('-'|'!'|'~') unary | postfix
 *   postfix := primary ('[' expr ']')?
 *   primary := INT | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'
 *
 * Values are int64. '/' and '%' round toward negative infinity (Python's
 * // and %, which is how the facts sheet and vLLM write them); division by
 * zero, a table index out of range, shifts outside [0, 63] and a result of
 * '/', cdiv, round_up, gcd or lcm outside int64 are evaluation errors;
 * '+', '-', '*', '<<' and negation wrap. Comparisons and logic give 0 or 1.
 * Functions: min max cdiv round_up gcd lcm.
 */
#ifndef W16_EXPR_H
#define W16_EXPR_H

#include "base/base.h"

/* Every variable an expression may name. X(NAME, where, meaning).
 * `where` is a mask of W16_VW_* saying in which places it may appear.
 * ORDER VAR: the enum value is the slot in an environment array. */
#define W16_VW_DIM 1u    /* shapes, layout maps, "when", padding */
#define W16_VW_COORD 2u  /* logical coordinates: forward maps */
#define W16_VW_STORE 4u  /* storage indices: inverse maps */
#define W16_VW_VALUE 8u  /* value transforms (encode/decode) */
#define W16_VW_SELECT 16u /* selection rules */
#define W16_VW_LAYOUT (W16_VW_DIM | W16_VW_COORD | W16_VW_STORE | W16_VW_VALUE)

#define W16_VAR_LIST(X)                                                      \
    X(E, W16_VW_LAYOUT | W16_VW_SELECT, "number of experts")                 \
    X(H, W16_VW_LAYOUT | W16_VW_SELECT, "hidden size")                       \
    X(I, W16_VW_LAYOUT | W16_VW_SELECT, "intermediate size (unpadded)")      \
    X(IP, W16_VW_LAYOUT, "intermediate size after the backend's padding")   \
    X(BITS, W16_VW_LAYOUT | W16_VW_SELECT, "bits per weight code (4 or 8)")  \
    X(MASK, W16_VW_LAYOUT, "(1 << BITS) - 1")                                \
    X(GS, W16_VW_LAYOUT | W16_VW_SELECT, "group size (-1 = channelwise)")    \
    X(K, W16_VW_LAYOUT, "GEMM reduction size as stored (H or IP)")           \
    X(N, W16_VW_LAYOUT, "GEMM output size as stored (2*IP or H)")            \
    X(G, W16_VW_LAYOUT, "number of scale groups along K as stored")          \
    X(GSE, W16_VW_LAYOUT, "effective group size: GS, or K when GS is -1")    \
    X(PF, W16_VW_LAYOUT, "codes per 32-bit word: 32 / BITS")                 \
    X(ZP, W16_VW_LAYOUT | W16_VW_SELECT, "1 if explicit zero points")        \
    X(ACT_ORDER, W16_VW_LAYOUT | W16_VW_SELECT, "1 if act-order (g_idx)")    \
    X(HAS_BIAS, W16_VW_LAYOUT | W16_VW_SELECT, "1 if expert biases")         \
    X(W13, W16_VW_LAYOUT, "1 for the gate/up operand, 0 for down")          \
    X(ZEROS_STORED, W16_VW_LAYOUT,                                           \
      "1 if the checkpoint carries zero-point tensors (even unused ones)")    \
    X(G_IDX_STORED, W16_VW_LAYOUT,                                           \
      "1 if the checkpoint carries g_idx tensors (even without act-order)")  \
    X(A8, W16_VW_LAYOUT | W16_VW_SELECT,                                     \
      "8-bit activations: 0 none (16-bit), 1 int8, 2 fp8 e4m3")              \
    X(e, W16_VW_COORD, "expert index")                                       \
    X(n, W16_VW_COORD, "output channel")                                     \
    X(k, W16_VW_COORD, "input channel")                                      \
    X(g, W16_VW_COORD, "scale group")                                        \
    X(slot, W16_VW_STORE, "code position inside one storage element")        \
    X(i0, W16_VW_STORE, "storage index, dimension 0")                        \
    X(i1, W16_VW_STORE, "storage index, dimension 1")                        \
    X(i2, W16_VW_STORE, "storage index, dimension 2")                        \
    X(i3, W16_VW_STORE, "storage index, dimension 3")                        \
    X(i4, W16_VW_STORE, "storage index, dimension 4")                        \
    X(i5, W16_VW_STORE, "storage index, dimension 5")                        \
    X(c, W16_VW_VALUE, "the value being encoded or decoded")                 \
    X(z, W16_VW_VALUE, "weight codes: the zero point of the code's group")   \
    X(PLATFORM, W16_VW_SELECT, "CUDA, ROCM, CPU or XPU")                     \
    X(CC, W16_VW_SELECT, "compute capability as 10*major + minor")           \
    X(TOPK, W16_VW_SELECT, "experts per token")                              \
    X(BATCHED, W16_VW_SELECT, "1 for the batched activation format")         \
    X(MAY_ZP, W16_VW_SELECT, "the integration may carry zero points")        \
    X(MAY_BIAS, W16_VW_SELECT, "the integration may carry expert bias")      \
    X(TILE_PADDING, W16_VW_SELECT, "intermediate tile padding is allowed")   \
    X(WK_BITS, W16_VW_SELECT, "weight key: bits")                            \
    X(WK_G32, W16_VW_SELECT, "weight key: the group-32 variant (Static32)")  \
    X(WK_ASYM, W16_VW_SELECT, "weight key: asymmetric (explicit zeros)")     \
    X(CUDA, W16_VW_SELECT, "constant: PLATFORM value for CUDA")              \
    X(ROCM, W16_VW_SELECT, "constant: PLATFORM value for ROCm")              \
    X(CPU, W16_VW_SELECT, "constant: PLATFORM value for CPU")                \
    X(XPU, W16_VW_SELECT, "constant: PLATFORM value for XPU")

typedef enum w16_var {
#define X(name, where, doc) W16_VAR_##name,
    W16_VAR_LIST(X)
#undef X
    W16_VAR_COUNT
} w16_var_t;

#define W16_MAX_STORE_DIMS 6 /* i0 .. i5 */

const char *w16_var_name(w16_var_t v);
const char *w16_var_doc(w16_var_t v);
unsigned w16_var_where(w16_var_t v);

/* A named table of integers declared in a spec ("tables"). */
typedef struct w16_table {
    const char *name;
    int64_t *values;
    int32_t len;
} w16_table_t;

/* Node kinds. ORDER OPS: w16_expr_print and the evaluators switch on them. */
typedef enum w16_op {
    W16_OP_CONST, W16_OP_VAR, W16_OP_TABLE, /* table[a] */
    W16_OP_NEG, W16_OP_NOT, W16_OP_BNOT,
    W16_OP_ADD, W16_OP_SUB, W16_OP_MUL, W16_OP_DIV, W16_OP_MOD,
    W16_OP_SHL, W16_OP_SHR, W16_OP_AND, W16_OP_OR, W16_OP_XOR,
    W16_OP_EQ, W16_OP_NE, W16_OP_LT, W16_OP_LE, W16_OP_GT, W16_OP_GE,
    W16_OP_LAND, W16_OP_LOR, W16_OP_COND,
    W16_OP_MIN, W16_OP_MAX, W16_OP_CDIV, W16_OP_ROUND_UP, W16_OP_GCD,
    W16_OP_LCM,
} w16_op_t;

typedef struct w16_expr {
    w16_op_t op;
    int64_t value;            /* CONST */
    w16_var_t var;            /* VAR */
    const w16_table_t *table; /* TABLE */
    const struct w16_expr *a, *b, *c;
} w16_expr_t;

/* Names an expression may use besides variables: the spec's tables and the
 * layout's `let` definitions (each an already-parsed expression). */
typedef struct w16_scope {
    unsigned where; /* mask of W16_VW_* allowed here */
    const w16_table_t *tables;
    int n_tables;
    const char *const *let_names;
    const w16_expr_t *const *let_exprs;
    int n_lets;
} w16_scope_t;

/* Parses `text`. On error returns NULL and writes a message (with the
 * column) into msg. */
const w16_expr_t *w16_expr_parse(w16_arena_t *arena, const char *text,
                                 const w16_scope_t *scope, char *msg,
                                 size_t msg_size);

typedef struct w16_eval_error {
    const char *what; /* "division by zero", ... ; NULL when fine */
} w16_eval_error_t;

/* Evaluates with vars[W16_VAR_COUNT]. Returns false on an evaluation error
 * (err->what says which). */
bool w16_expr_eval(const w16_expr_t *x, const int64_t *vars, int64_t *out,
                   w16_eval_error_t *err);

/* Specializes x for bound dimensions: every variable that is not a
 * coordinate, storage index or value (the dims: E, H, K, BITS, ...) becomes
 * its value in vars, constant subtrees are evaluated, and conditionals
 * with a constant test keep one branch. Returns x itself when nothing
 * changes, NULL when out of memory; a subtree whose evaluation fails (e.g.
 * division by zero) is kept unfolded so the error appears at evaluation. */
const w16_expr_t *w16_expr_fold(w16_arena_t *arena, const w16_expr_t *x,
                                const int64_t *vars);

/* Does x mention variable v (after let expansion)? */
bool w16_expr_uses(const w16_expr_t *x, w16_var_t v);

/* Writes a normalized, fully parenthesized-where-needed rendering. */
void w16_expr_print(w16_buf_t *b, const w16_expr_t *x);

/* Floor division and modulo (Python semantics); b != 0. */
static inline int64_t w16_floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}
static inline int64_t w16_floormod(int64_t a, int64_t b)
{
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0)))
        r += b;
    return r;
}

#endif /* W16_EXPR_H */
