/*
 * kir.h - the kernel IR: a small typed tree IR in which wna16 builds every
 * generated kernel, and which each target's emitter lowers (CUDA C, LLVM IR,
 * SPIR-V words).
 *
 *   kernel    = name, parameters, launch shape, body (a statement list)
 *   statement = let VAR = expr | VAR = expr | store BUF[expr] = expr
 *             | if expr { ... } else { ... } | for VAR in [lo, hi) step s
 *             | barrier | return
 *   expr      = const | VAR | PARAM | builtin (group id, lane id, ...)
 *             | unary | binary | compare | select | convert | load BUF[expr]
 *             | table-load BUFTABLE[slot] BUF[expr]
 *
 * The launch model is a 1-D grid of workgroups of `lanes` lanes; every lane
 * runs the body. Expressions are trees (no sharing across statements; a
 * value used twice is a `let`), types are explicit on every node and
 * checked by kir_verify, integer arithmetic wraps, integer division is
 * unsigned or signed-truncating as the operator says (the builders lower the
 * spec language's floor division with ranges they know). Everything is
 * allocated in the kernel's arena and freed with it.
 */
#ifndef W16_KIR_H
#define W16_KIR_H

#include "base/base.h"

/* Scalar types. X(ENUM, name, bits, is_float). ORDER KTYPE. */
#define KIR_TYPE_LIST(X)                                                     \
    X(VOID, "void", 0, 0)                                                    \
    X(I1, "i1", 1, 0)                                                        \
    X(I8, "i8", 8, 0)                                                        \
    X(I16, "i16", 16, 0)                                                     \
    X(I32, "i32", 32, 0)                                                     \
    X(I64, "i64", 64, 0)                                                     \
    X(F16, "f16", 16, 1)                                                     \
    X(BF16, "bf16", 16, 1)                                                   \
    X(F32, "f32", 32, 1)

typedef enum kir_type {
#define X(e, name, bits, f) KIR_##e,
    KIR_TYPE_LIST(X)
#undef X
    KIR_TYPE_COUNT
} kir_type_t;

const char *kir_type_name(kir_type_t t);
int kir_type_bits(kir_type_t t);
bool kir_type_is_float(kir_type_t t);
bool kir_type_is_int(kir_type_t t); /* I8..I64 (not I1) */

/* Expression operators. X(ENUM, name, arity). ORDER KOP: every emitter has
 * a table indexed by these. */
#define KIR_OP_LIST(X)                                                       \
    X(CONST, "const", 0)                                                     \
    X(VAR, "var", 0)                                                         \
    X(PARAM, "param", 0)                                                     \
    X(GROUP_ID, "group_id", 0)   /* workgroup index, i64 */                  \
    X(LANE_ID, "lane_id", 0)     /* lane within the workgroup, i32 */       \
    X(NUM_GROUPS, "num_groups", 0)                                           \
    X(NEG, "neg", 1)                                                         \
    X(NOT, "not", 1)             /* bitwise; logical on i1 */                \
    X(ADD, "add", 2)                                                         \
    X(SUB, "sub", 2)                                                         \
    X(MUL, "mul", 2)                                                         \
    X(UDIV, "udiv", 2)                                                       \
    X(SDIV, "sdiv", 2)           /* truncating */                            \
    X(UREM, "urem", 2)                                                       \
    X(SREM, "srem", 2)                                                       \
    X(SHL, "shl", 2)                                                         \
    X(LSHR, "lshr", 2)                                                       \
    X(ASHR, "ashr", 2)                                                       \
    X(AND, "and", 2)                                                         \
    X(OR, "or", 2)                                                           \
    X(XOR, "xor", 2)                                                         \
    X(SMIN, "smin", 2)                                                       \
    X(SMAX, "smax", 2)                                                       \
    X(FADD, "fadd", 2)                                                       \
    X(FSUB, "fsub", 2)                                                       \
    X(FMUL, "fmul", 2)                                                       \
    X(FDIV, "fdiv", 2)                                                       \
    X(FMAX, "fmax", 2)                                                       \
    X(FMIN, "fmin", 2)                                                       \
    X(EQ, "eq", 2)                                                           \
    X(NE, "ne", 2)                                                           \
    X(SLT, "slt", 2)                                                         \
    X(SLE, "sle", 2)                                                         \
    X(ULT, "ult", 2)                                                         \
    X(ULE, "ule", 2)                                                         \
    X(FLT, "flt", 2)                                                         \
    X(FLE, "fle", 2)                                                         \
    X(SELECT, "select", 3)       /* a ? b : c, a is i1 */                    \
    X(ZEXT, "zext", 1)           /* int to wider int */                      \
    X(SEXT, "sext", 1)                                                       \
    X(TRUNC, "trunc", 1)         /* int to narrower int */                   \
    X(SITOF, "sitof", 1)         /* signed int to float */                   \
    X(FTOSI, "ftosi", 1)         /* float to signed int, toward zero */      \
    X(FCONV, "fconv", 1)         /* float to float, round to nearest even */ \
    X(BITCAST, "bitcast", 1)     /* same width */                            \
    X(LOAD, "load", 1)           /* a = element index into buffer param */   \
    X(TLOAD, "tload", 2)         /* a = slot in a buffer table, b = index */ \
    X(SHARED_LOAD, "shared_load", 1)                                         \
    X(CTLOAD, "ctload", 1)       /* a = index into a constant table */       \
    X(FEXP, "fexp", 1)           /* e^a, f32 (libm accuracy) */              \
    X(FTANH, "ftanh", 1)         /* tanh(a), f32 */                          \
    X(FERF, "ferf", 1)           /* erf(a), f32 */

typedef enum kir_op {
#define X(e, name, arity) KIR_OP_##e,
    KIR_OP_LIST(X)
#undef X
    KIR_OP_COUNT
} kir_op_t;

const char *kir_op_name(kir_op_t op);
int kir_op_arity(kir_op_t op);

typedef struct kir_var kir_var_t;
typedef struct kir_param kir_param_t;
typedef struct kir_shared kir_shared_t;
typedef struct kir_ctable kir_ctable_t;

typedef struct kir_expr {
    kir_op_t op;
    kir_type_t type;
    const struct kir_expr *a, *b, *c;
    int64_t ival;              /* CONST (integers, as two's complement) */
    double fval;               /* CONST (floats) */
    const kir_var_t *var;      /* VAR */
    const kir_param_t *param;  /* PARAM, LOAD, TLOAD */
    const kir_shared_t *shared; /* SHARED_LOAD */
    const kir_ctable_t *ctable; /* CTLOAD */
} kir_expr_t;

/* Parameters: scalars, buffers (a pointer to elements of `type`) and buffer
 * tables (a pointer to an array of buffer pointers, for sources split into
 * many tensors, e.g. one per expert and projection). */
typedef enum kir_param_kind {
    KIR_PARAM_SCALAR,
    KIR_PARAM_BUFFER,
    KIR_PARAM_BUFFER_TABLE,
} kir_param_kind_t;

struct kir_param {
    const char *name; /* identifier, generated by wna16 (never from a spec) */
    kir_param_kind_t kind;
    kir_type_t type;  /* scalar type, or element type of the buffer(s) */
    bool written;     /* buffer is stored to */
    int index;
};

struct kir_var {
    const char *name;
    kir_type_t type;
    int index;
};

/* Workgroup-shared memory: `count` elements of `type`. */
struct kir_shared {
    const char *name;
    kir_type_t type;
    int64_t count;
    int index;
};

/* A read-only table of integer constants (spec tables such as Marlin's
 * nibble order), indexed with an i64 that the builder keeps in range. */
struct kir_ctable {
    const char *name;
    kir_type_t type;
    const int64_t *values;
    int count;
    int index;
};

typedef enum kir_stmt_kind {
    KIR_S_LET,     /* declare var = a (first definition) */
    KIR_S_ASSIGN,  /* var = a */
    KIR_S_STORE,   /* param[a] = b */
    KIR_S_SHARED_STORE, /* shared[a] = b */
    KIR_S_IF,      /* if a { body } else { else_body } */
    KIR_S_FOR,     /* for var = a; var < b; var += step { body } (i64/i32) */
    KIR_S_BARRIER, /* workgroup barrier */
    KIR_S_RETURN,  /* this lane is done */
} kir_stmt_kind_t;

typedef struct kir_block {
    struct kir_stmt **items;
    int count, cap;
} kir_block_t;

typedef struct kir_stmt {
    kir_stmt_kind_t kind;
    const kir_var_t *var;
    const kir_param_t *param;
    const kir_shared_t *shared;
    const kir_expr_t *a, *b;
    int64_t step;
    bool unroll; /* FOR: a hint; the trip count is a small constant */
    kir_block_t body, else_body;
} kir_stmt_t;

/* A kernel whose code a dedicated generator writes in a target's own IR
 * (gen/moe_cpu.c: x86 vector intrinsics through the LLVM C API) rather
 * than in this IR; it travels through the targets, the kernel cache and
 * its keys as a kernel of this IR with parameters and no body. `text`
 * states everything that decides the code (kir_print prints it, so it is
 * in every cache key); `emit_llvm` adds the entry point `symbol` (the CPU
 * calling convention of gen/emit_llvm.h) to an LLVMModuleRef for code
 * allowed the LLVM feature string `features` (NULL: the host's). Both live
 * as long as the kernel (its arena). Emitters for other targets refuse it. */
typedef struct kir_native {
    const char *text;
    wna16_status_t (*emit_llvm)(const void *data, void *module,
                                const char *symbol, const char *features,
                                wna16_error_t *err);
    const void *data;
} kir_native_t;

typedef struct kir_kernel {
    w16_arena_t arena;
    const char *name; /* stable and readable: wna16_repack_gptq_to_triton_... */
    kir_param_t **params;
    int n_params, cap_params;
    kir_var_t **vars;
    int n_vars, cap_vars;
    kir_shared_t **shared;
    int n_shared, cap_shared;
    kir_ctable_t **ctables;
    int n_ctables, cap_ctables;
    kir_block_t body;
    int lanes;             /* workgroup size */
    /* Float additions and multiplications may be reassociated and
     * contracted (never NaN/inf assumptions): what lets a CPU emitter
     * vectorize float reductions. Results then depend on the order the
     * target picks, within floating-point rounding. */
    bool fp_reassoc;
    /* Documentation carried to every emitter's output. */
    const char *comment;
    /* The first construction failure (an ill-typed or NULL operand, out of
     * memory); kir_verify reports it. Builders may construct freely and
     * check once at the end. */
    const char *broken;
    /* NULL, or the dedicated generator that writes this kernel's code
     * (the body then stays empty). */
    const kir_native_t *native;
} kir_kernel_t;

/* ---- building ------------------------------------------------------------ */

/* Creates an empty kernel; NULL when out of memory. `name` must be a C
 * identifier (checked). */
kir_kernel_t *kir_kernel_new(wna16_context_t *ctx, const char *name,
                             int lanes);
void kir_kernel_free(kir_kernel_t *k);

const kir_param_t *kir_param(kir_kernel_t *k, const char *name,
                             kir_param_kind_t kind, kir_type_t type,
                             bool written);
const kir_var_t *kir_var(kir_kernel_t *k, const char *name, kir_type_t type);
const kir_shared_t *kir_shared(kir_kernel_t *k, const char *name,
                               kir_type_t type, int64_t count);
/* Copies the values; returns NULL if a value does not fit the type. */
const kir_ctable_t *kir_ctable(kir_kernel_t *k, const char *name,
                               kir_type_t type, const int64_t *values,
                               int count);

/* Expression constructors (NULL propagates: a NULL operand gives NULL, so a
 * builder checks once at the end; out-of-memory shows up as NULL). */
const kir_expr_t *kir_const(kir_kernel_t *k, kir_type_t t, int64_t v);
const kir_expr_t *kir_fconst(kir_kernel_t *k, kir_type_t t, double v);
const kir_expr_t *kir_ref(kir_kernel_t *k, const kir_var_t *v);
const kir_expr_t *kir_pref(kir_kernel_t *k, const kir_param_t *p);
const kir_expr_t *kir_builtin(kir_kernel_t *k, kir_op_t op);
const kir_expr_t *kir_un(kir_kernel_t *k, kir_op_t op, const kir_expr_t *a);
const kir_expr_t *kir_bin(kir_kernel_t *k, kir_op_t op, const kir_expr_t *a,
                          const kir_expr_t *b);
const kir_expr_t *kir_select(kir_kernel_t *k, const kir_expr_t *c,
                             const kir_expr_t *a, const kir_expr_t *b);
const kir_expr_t *kir_convert(kir_kernel_t *k, kir_op_t op, kir_type_t to,
                              const kir_expr_t *a);
/* Integer resize with the right op (zext/sext/trunc/none). */
const kir_expr_t *kir_int_cast(kir_kernel_t *k, kir_type_t to,
                               const kir_expr_t *a, bool is_signed);
const kir_expr_t *kir_load(kir_kernel_t *k, const kir_param_t *buf,
                           const kir_expr_t *index);
const kir_expr_t *kir_tload(kir_kernel_t *k, const kir_param_t *table,
                            const kir_expr_t *slot, const kir_expr_t *index);
const kir_expr_t *kir_shared_load(kir_kernel_t *k, const kir_shared_t *s,
                                  const kir_expr_t *index);
const kir_expr_t *kir_ctload(kir_kernel_t *k, const kir_ctable_t *t,
                             const kir_expr_t *index);

/* Statements are appended to `b` (the kernel body or a nested block). */
kir_stmt_t *kir_let(kir_kernel_t *k, kir_block_t *b, const kir_var_t *v,
                    const kir_expr_t *e);
kir_stmt_t *kir_assign(kir_kernel_t *k, kir_block_t *b, const kir_var_t *v,
                       const kir_expr_t *e);
kir_stmt_t *kir_store(kir_kernel_t *k, kir_block_t *b, const kir_param_t *buf,
                      const kir_expr_t *index, const kir_expr_t *value);
kir_stmt_t *kir_shared_store(kir_kernel_t *k, kir_block_t *b,
                             const kir_shared_t *s, const kir_expr_t *index,
                             const kir_expr_t *value);
kir_stmt_t *kir_if(kir_kernel_t *k, kir_block_t *b, const kir_expr_t *cond);
kir_stmt_t *kir_for(kir_kernel_t *k, kir_block_t *b, const kir_var_t *v,
                    const kir_expr_t *lo, const kir_expr_t *hi, int64_t step);
kir_stmt_t *kir_barrier(kir_kernel_t *k, kir_block_t *b);
kir_stmt_t *kir_return(kir_kernel_t *k, kir_block_t *b);

/* Checks types, operand kinds, variable definitions before use, buffer
 * writes only to written buffers. Messages name the kernel and the node. */
wna16_status_t kir_verify(const kir_kernel_t *k, wna16_error_t *err);

/* Prints the IR as text (`wna16 gen --target ir`). */
void kir_print(w16_buf_t *out, const kir_kernel_t *k);

#endif /* W16_KIR_H */
