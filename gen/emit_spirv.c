/*
 * emit_spirv.c - kernel IR to SPIR-V words (see emit_spirv.h). One pass
 * over the IR fills one word buffer per section of SPIR-V's logical
 * layout, in whatever order the IR needs things; the module is the header
 * and the sections in the order SPIR-V requires, and is validated before
 * the caller sees it:
 *
 *   kir_kernel_t ──► sections (ORDER SEC)                 ──► header + sections
 *                    capabilities (from the types used)        ──► spvValidate
 *                    OpenCL.std import (on first use)              (OpenCL 2.2)
 *                    memory model, entry point, modes
 *                    names, decorations
 *                    types, constants, globals (interned)
 *                    the function: header, parameters, variables
 *                    its body (statements, expressions)
 *
 * Glossary. id: a result id, from one counter (the header's bound is its
 * last value + 1). Interned: a type or constant instruction is emitted
 * once and found again by its words in a small hash table, so equal types
 * and constants share an id, as SPIR-V requires of types. Live: a variable
 * some effect reads (the CUDA emitter's liveness); only live variables and
 * the lets that feed them are emitted.
 *
 * Lowering. IR variables are Function-storage OpVariables set to zero on
 * entry, as the CUDA C declares them (a let may sit inside an if and be
 * read after it); every consumer's mem2reg makes SSA values of them. An if
 * is a selection construct (OpSelectionMerge), a for a loop construct whose
 * header tests the bound (OpLoopMerge; signed, as the other emitters), and
 * statements after a return in the same block are unreachable and left
 * out. i1 is OpTypeBool: zext/sext of an i1 is an OpSelect, trunc to i1 a
 * test of the low bit. Integers are signless (OpenCL demands signedness
 * 0) and the operator decides, as in the IR. Float math is OpenCL.std
 * (exp, tanh, erf; fmin/fmax return the other operand of a NaN, as the
 * CUDA C's fminf/fmaxf do, where the LLVM emitter's a > b ? a : b returns
 * b; no builder uses them). f16 values are their bits, converted through
 * Float16Buffer's vload_half and vstore_half_r (see "f16" below: the
 * Float16 capability fails OpenCL validation); f32 -> f16 rounds to
 * nearest even. bf16 float conversions are the builders' integer code, so
 * an FCONV to or from bf16 is refused, as the CUDA and LLVM emitters
 * refuse it. Kernels without fp_reassoc carry ContractionOff, so no
 * consumer fuses a*b+c where the CPU target does not. Division is OpFDiv:
 * a driver rounds it correctly only when the module is built with
 * -cl-fp32-correctly-rounded-divide-sqrt, which the repack kernels'
 * int16 scale codes need to match the reference bit for bit.
 *
 * Every opcode, enumerant and OpenCL.std number comes from the SPIR-V
 * headers; every word count is computed from the operands. Operands are
 * evaluated into locals one statement at a time, so ids come out in the
 * same order whatever the C compiler's evaluation order. In a build
 * without SPIRV-Tools (or the headers) the emitter is left out and its
 * entry points answer WNA16_EUNAVAILABLE: a module must pass the validator
 * before it is cached or loaded, so without one no module may leave.
 */
#include "gen/emit_spirv.h"
#include "gen/spirv_validate.h"

#include <string.h>

/* ---- the word buffer ----------------------------------------------------- */

void w16_words_init(w16_words_t *w, wna16_context_t *ctx)
{
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
}

void w16_words_free(w16_words_t *w)
{
    w16_free(w->ctx, w->data, w->cap * sizeof *w->data);
    w->data = NULL;
    w->len = w->cap = 0;
    w->failed = false;
}

void w16_words_reset(w16_words_t *w)
{
    w->len = 0;
    w->failed = false;
}

static bool words_ensure(w16_words_t *w, size_t extra)
{
    if (w->failed)
        return false;
    if (extra <= w->cap - w->len)
        return true;
    size_t need, cap = w->cap ? w->cap : 256, bytes;
    if (!w16_add_size(w->len, extra, &need)) {
        w->failed = true;
        return false;
    }
    while (cap < need)
        if (!w16_mul_size(cap, 2, &cap)) {
            w->failed = true;
            return false;
        }
    uint32_t *p = w16_mul_size(cap, sizeof *p, &bytes)
                      ? w16_realloc(w->ctx, w->data, w->cap * sizeof *p, bytes)
                      : NULL;
    if (!p) {
        w->failed = true;
        return false;
    }
    w->data = p;
    w->cap = cap;
    return true;
}

void w16_words_push(w16_words_t *w, uint32_t word)
{
    if (words_ensure(w, 1))
        w->data[w->len++] = word;
}

void w16_words_append(w16_words_t *w, const uint32_t *src, size_t n)
{
    if (n && words_ensure(w, n)) {
        memcpy(w->data + w->len, src, n * sizeof *src);
        w->len += n;
    }
}

#ifdef WNA16_HAVE_SPIRV_TOOLS
#include <spirv/unified1/OpenCL.std.h>
#include <spirv/unified1/spirv.h>

/* The module's SPIR-V version, 1.2 (the header's version word holds the
 * major number in bits 16-23 and the minor in 8-15): the newest the OpenCL
 * 2.2 environment accepts, and what Level Zero drivers take. */
#define W16_SPIRV_VERSION ((1u << 16) | (2u << 8))

/* The header's generator word: tool id 0 in the high half (wna16 has no
 * registered id), the emitter's version in the low half. */
#define W16_SPIRV_GENERATOR ((0u << 16) | W16_SPIRV_EMITTER_VERSION)

/* The logical layout of a module (SPIR-V 2.4), in order. ORDER SEC */
typedef enum section {
    SEC_CAPABILITY,
    SEC_EXT_IMPORT,
    SEC_MEMORY_MODEL,
    SEC_ENTRY_POINT,
    SEC_EXECUTION_MODE,
    SEC_NAME,
    SEC_DECORATION,
    SEC_GLOBAL,   /* types, constants, module-scope variables */
    SEC_FUNCTION, /* OpFunction, parameters, entry label, variables */
    SEC_BODY,     /* the code, to OpFunctionEnd */
    SEC_COUNT
} section_t;

/* The builtins the IR reads: each an Input variable of 3 x i64 (size_t
 * under Physical64), read at .x. ORDER BUILTIN */
typedef enum builtin {
    BI_WORKGROUP_ID,
    BI_LOCAL_ID,
    BI_NUM_WORKGROUPS,
    BI_COUNT
} builtin_t;

static const struct {
    SpvBuiltIn builtin;
    const char *name; /* the name SPIR-V translators give the variable */
} BUILTINS[BI_COUNT] = {
    [BI_WORKGROUP_ID] = {SpvBuiltInWorkgroupId, "__spirv_BuiltInWorkgroupId"},
    [BI_LOCAL_ID] = {SpvBuiltInLocalInvocationId,
                     "__spirv_BuiltInLocalInvocationId"},
    [BI_NUM_WORKGROUPS] = {SpvBuiltInNumWorkgroups,
                           "__spirv_BuiltInNumWorkgroups"},
};

/* How each IR operator with a direct SPIR-V counterpart is lowered:
 * the instruction on integers or floats, the one on i1 operands where the
 * IR allows i1, or an OpenCL.std instruction (stored + 1: 0 is "none").
 * Indexed by the IR's operators (ORDER KOP); the operators not here
 * (constants, builtins, memory, select, conversions) are lowered by
 * emit_expr and emit_convert. */
typedef struct lowering {
    SpvOp op;
    SpvOp on_bool;
    int ocl_plus_1;
} lowering_t;

#define OCL(x) (1 + (int)OpenCLstd_##x)

static const lowering_t LOWERING[KIR_OP_COUNT] = {
    [KIR_OP_NEG] = {SpvOpSNegate, SpvOpNop, 0},
    [KIR_OP_NOT] = {SpvOpNot, SpvOpLogicalNot, 0},
    [KIR_OP_ADD] = {SpvOpIAdd, SpvOpNop, 0},
    [KIR_OP_SUB] = {SpvOpISub, SpvOpNop, 0},
    [KIR_OP_MUL] = {SpvOpIMul, SpvOpNop, 0},
    [KIR_OP_UDIV] = {SpvOpUDiv, SpvOpNop, 0},
    [KIR_OP_SDIV] = {SpvOpSDiv, SpvOpNop, 0},
    [KIR_OP_UREM] = {SpvOpUMod, SpvOpNop, 0},
    [KIR_OP_SREM] = {SpvOpSRem, SpvOpNop, 0}, /* the dividend's sign, as C */
    [KIR_OP_SHL] = {SpvOpShiftLeftLogical, SpvOpNop, 0},
    [KIR_OP_LSHR] = {SpvOpShiftRightLogical, SpvOpNop, 0},
    [KIR_OP_ASHR] = {SpvOpShiftRightArithmetic, SpvOpNop, 0},
    [KIR_OP_AND] = {SpvOpBitwiseAnd, SpvOpLogicalAnd, 0},
    [KIR_OP_OR] = {SpvOpBitwiseOr, SpvOpLogicalOr, 0},
    [KIR_OP_XOR] = {SpvOpBitwiseXor, SpvOpLogicalNotEqual, 0},
    [KIR_OP_SMIN] = {SpvOpNop, SpvOpNop, OCL(SMin)},
    [KIR_OP_SMAX] = {SpvOpNop, SpvOpNop, OCL(SMax)},
    [KIR_OP_FADD] = {SpvOpFAdd, SpvOpNop, 0},
    [KIR_OP_FSUB] = {SpvOpFSub, SpvOpNop, 0},
    [KIR_OP_FMUL] = {SpvOpFMul, SpvOpNop, 0},
    [KIR_OP_FDIV] = {SpvOpFDiv, SpvOpNop, 0},
    /* selects (below), as the LLVM emitter lowers them, not OpenCL.std's
     * fmax/fmin, which return the operand that is not NaN */
    [KIR_OP_FMAX] = {SpvOpNop, SpvOpNop, 0},
    [KIR_OP_FMIN] = {SpvOpNop, SpvOpNop, 0},
    [KIR_OP_EQ] = {SpvOpIEqual, SpvOpLogicalEqual, 0},
    [KIR_OP_NE] = {SpvOpINotEqual, SpvOpLogicalNotEqual, 0},
    [KIR_OP_SLT] = {SpvOpSLessThan, SpvOpNop, 0},
    [KIR_OP_SLE] = {SpvOpSLessThanEqual, SpvOpNop, 0},
    [KIR_OP_ULT] = {SpvOpULessThan, SpvOpNop, 0},
    [KIR_OP_ULE] = {SpvOpULessThanEqual, SpvOpNop, 0},
    [KIR_OP_FLT] = {SpvOpFOrdLessThan, SpvOpNop, 0}, /* false on NaN */
    [KIR_OP_FLE] = {SpvOpFOrdLessThanEqual, SpvOpNop, 0},
    [KIR_OP_FEXP] = {SpvOpNop, SpvOpNop, OCL(Exp)},
    [KIR_OP_FTANH] = {SpvOpNop, SpvOpNop, OCL(Tanh)},
    [KIR_OP_FERF] = {SpvOpNop, SpvOpNop, OCL(Erf)},
};

/* One interned instruction: its key (opcode, result type or 0, operands)
 * lives in semit_t.keys at `key`, `len` words. */
typedef struct interned {
    uint32_t hash, id;
    size_t key, len;
} interned_t;

typedef struct semit {
    const kir_kernel_t *k;
    wna16_context_t *ctx;
    w16_words_t sec[SEC_COUNT];
    w16_words_t keys;      /* the interned instructions' keys */
    interned_t *table;     /* open addressing; id 0 marks a free slot */
    size_t table_cap, table_len;
    uint32_t next_id;
    uint32_t fn;           /* the kernel's function */
    uint32_t ocl;          /* the OpenCL.std import, 0 until used */
    uint32_t builtin[BI_COUNT]; /* Input variables, 0 until used */
    uint32_t *vars;        /* Function variables by var index (live ones) */
    uint32_t *var_version; /* stores to each so far (load numbering) */
    uint32_t *params;      /* parameters by index */
    uint32_t *shared;      /* Workgroup variables, 0 until used */
    uint32_t *ctables;     /* UniformConstant variables, 0 until used */
    bool *read;            /* live variables */
    uint32_t scratch;      /* the f16 conversions' i16 variable, 0 until used */
    bool int8, int16, int64, half; /* capabilities the types need */
    bool dead;             /* the current block has ended (a return) */
    /* Values of pure instructions already emitted where the current block
     * sees them (scoped value numbering, see pure()): entries on a stack,
     * chained per bucket, popped when a block that dominates nothing after
     * it ends. */
    uint32_t *cse_bucket;  /* CSE_BUCKETS heads: entry index + 1, 0 = none */
    struct cse_entry {
        uint32_t hash, id, key, next; /* key: offset in cse_keys */
    } *cse;
    size_t cse_len, cse_cap;
    w16_words_t cse_keys;  /* op, type, n, operands of each entry */
    const char *fail;
} semit_t;

enum { CSE_BUCKETS = 1 << 12 };

static void efail(semit_t *E, const char *why)
{
    if (!E->fail)
        E->fail = why;
}

static uint32_t new_id(semit_t *E) { return E->next_id++; }

/* ---- instructions ---------------------------------------------------------
 *
 *   word 0: | word count (16) | opcode (16) |   then the operands
 *
 * begin() writes the opcode, end() fills in the count from what was
 * pushed in between. */

static size_t begin(w16_words_t *w, SpvOp op)
{
    size_t at = w->len;
    w16_words_push(w, (uint32_t)op);
    return at;
}

static void end(semit_t *E, w16_words_t *w, size_t at)
{
    if (w->failed)
        return;
    size_t count = w->len - at;
    if (count > SpvOpCodeMask) { /* the count's 16 bits */
        efail(E, "an instruction longer than 65535 words");
        return;
    }
    w->data[at] |= (uint32_t)count << SpvWordCountShift;
}

/* A literal string: UTF-8 bytes, four a word from the low byte up, NUL
 * terminated and zero padded. */
static void push_string(w16_words_t *w, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i <= n; i += 4) {
        uint32_t word = 0;
        for (size_t j = 0; j < 4 && i + j < n; j++)
            word |= (uint32_t)(unsigned char)s[i + j] << (8 * j);
        w16_words_push(w, word);
    }
}

static void inst(semit_t *E, section_t s, SpvOp op, const uint32_t *ops,
                 size_t n)
{
    w16_words_t *w = &E->sec[s];
    size_t at = begin(w, op);
    w16_words_append(w, ops, n);
    end(E, w, at);
}

/* The operand list of inst/value: an array and its length, both from the
 * same words (sizeof does not evaluate them). */
#define OPS(...) (const uint32_t[]){__VA_ARGS__}, \
                 W16_ARRAY_LEN(((const uint32_t[]){__VA_ARGS__}))

/* An instruction of the function that defines a value: result type, a
 * new id, the operands. */
static uint32_t value(semit_t *E, SpvOp op, uint32_t type, const uint32_t *ops,
                      size_t n)
{
    uint32_t id = new_id(E);
    w16_words_t *w = &E->sec[SEC_BODY];
    size_t at = begin(w, op);
    w16_words_push(w, type);
    w16_words_push(w, id);
    w16_words_append(w, ops, n);
    end(E, w, at);
    return id;
}

static uint32_t key_hash(SpvOp op, uint32_t type, const uint32_t *ops,
                         size_t n);

/* value() for an instruction without side effects whose result depends on
 * its operands alone (arithmetic, comparisons, selects, conversions,
 * address computations, OpenCL.std math, loads of the constant builtin
 * variables; `salt`, also compared, tells apart loads of a variable
 * between stores, see load_var): the id of the same instruction emitted before in a block
 * that dominates this one, else a new one. The IR is a tree, so the
 * builders repeat subexpressions (a Marlin index formula per code of a
 * word); numbering them here is what keeps the modules small: the
 * marlin -> cpu repack went from 82,816 words to the figure in
 * bench/README.md. Memory reads are never numbered (stores may change
 * what they read), nor are the f16 conversions (they go through a
 * variable). */
static uint32_t pure_salted(semit_t *E, SpvOp op, uint32_t type,
                            const uint32_t *ops, size_t n, uint32_t salt)
{
    if (E->fail)
        return 0;
    uint32_t h = key_hash(op, type, ops, n) ^ (salt * 0x9E3779B1u);
    for (uint32_t i = E->cse_bucket[h & (CSE_BUCKETS - 1)]; i;
         i = E->cse[i - 1].next) {
        const struct cse_entry *c = &E->cse[i - 1];
        const uint32_t *key = E->cse_keys.data + c->key;
        if (c->hash == h && key[0] == (uint32_t)op && key[1] == type &&
            key[2] == n && key[3] == salt &&
            memcmp(key + 4, ops, n * sizeof *ops) == 0)
            return c->id;
    }
    uint32_t id = value(E, op, type, ops, n);
    if (E->cse_len == E->cse_cap) {
        size_t cap = E->cse_cap ? 2 * E->cse_cap : 1024;
        struct cse_entry *c = w16_alloc(E->ctx, cap * sizeof *c);
        if (!c) {
            efail(E, "out of memory");
            return 0;
        }
        if (E->cse_len)
            memcpy(c, E->cse, E->cse_len * sizeof *c);
        w16_free(E->ctx, E->cse, E->cse_cap * sizeof *E->cse);
        E->cse = c;
        E->cse_cap = cap;
    }
    uint32_t *head = &E->cse_bucket[h & (CSE_BUCKETS - 1)];
    E->cse[E->cse_len] = (struct cse_entry){h, id, (uint32_t)E->cse_keys.len,
                                            *head};
    w16_words_push(&E->cse_keys, (uint32_t)op);
    w16_words_push(&E->cse_keys, type);
    w16_words_push(&E->cse_keys, (uint32_t)n);
    w16_words_push(&E->cse_keys, salt);
    w16_words_append(&E->cse_keys, ops, n);
    *head = (uint32_t)++E->cse_len;
    return id;
}

static uint32_t pure(semit_t *E, SpvOp op, uint32_t type, const uint32_t *ops,
                     size_t n)
{
    return pure_salted(E, op, type, ops, n, 0);
}

/* Forgets the values numbered since `mark` (E->cse_len then): the block
 * they were emitted in does not dominate what follows. */
static void cse_pop(semit_t *E, size_t mark)
{
    while (E->cse_len > mark) {
        const struct cse_entry *c = &E->cse[--E->cse_len];
        E->cse_bucket[c->hash & (CSE_BUCKETS - 1)] = c->next;
        E->cse_keys.len = c->key;
    }
}

static void name(semit_t *E, uint32_t id, const char *s)
{
    w16_words_t *w = &E->sec[SEC_NAME];
    size_t at = begin(w, SpvOpName);
    w16_words_push(w, id);
    push_string(w, s);
    end(E, w, at);
}

static void decorate(semit_t *E, uint32_t id, SpvDecoration d, uint32_t arg)
{
    inst(E, SEC_DECORATION, SpvOpDecorate, OPS(id, (uint32_t)d, arg));
}

/* ---- interned types and constants ---------------------------------------- */

static uint32_t key_hash(SpvOp op, uint32_t type, const uint32_t *ops, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a over the words */
    uint32_t head[2] = {(uint32_t)op, type};
    for (size_t i = 0; i < 2 + n; i++) {
        uint32_t w = i < 2 ? head[i] : ops[i - 2];
        for (int b = 0; b < 4; b++)
            h = (h ^ ((w >> (8 * b)) & 0xffu)) * 16777619u;
    }
    return h;
}

static bool key_equal(const semit_t *E, const interned_t *t, SpvOp op,
                      uint32_t type, const uint32_t *ops, size_t n)
{
    const uint32_t *key = E->keys.data + t->key;
    return t->len == n + 2 && key[0] == (uint32_t)op && key[1] == type &&
           (n == 0 || memcmp(key + 2, ops, n * sizeof *ops) == 0);
}

/* Doubles the table (rehashing every entry); false when out of memory. */
static bool table_grow(semit_t *E)
{
    size_t cap = E->table_cap ? 2 * E->table_cap : 256;
    interned_t *t = w16_calloc(E->ctx, cap, sizeof *t);
    if (!t)
        return false;
    for (size_t i = 0; i < E->table_cap; i++) {
        const interned_t *o = &E->table[i];
        if (!o->id)
            continue;
        size_t j = o->hash & (cap - 1);
        while (t[j].id)
            j = (j + 1) & (cap - 1);
        t[j] = *o;
    }
    w16_free(E->ctx, E->table, E->table_cap * sizeof *E->table);
    E->table = t;
    E->table_cap = cap;
    return true;
}

/* The id of a type (type == 0; the id is the first operand) or constant
 * (its result type; the id is the second) with these operands, emitted
 * into the globals the first time. 0 when out of memory. */
static uint32_t intern(semit_t *E, SpvOp op, uint32_t type, const uint32_t *ops,
                       size_t n)
{
    if (E->fail)
        return 0;
    uint32_t h = key_hash(op, type, ops, n);
    if (2 * (E->table_len + 1) > E->table_cap && !table_grow(E)) {
        efail(E, "out of memory");
        return 0;
    }
    size_t i = h & (E->table_cap - 1);
    for (; E->table[i].id; i = (i + 1) & (E->table_cap - 1))
        if (E->table[i].hash == h && key_equal(E, &E->table[i], op, type, ops, n))
            return E->table[i].id;
    size_t key = E->keys.len;
    w16_words_push(&E->keys, (uint32_t)op);
    w16_words_push(&E->keys, type);
    w16_words_append(&E->keys, ops, n);
    if (E->keys.failed) {
        efail(E, "out of memory");
        return 0;
    }
    uint32_t id = new_id(E);
    E->table[i] = (interned_t){h, id, key, n + 2};
    E->table_len++;
    w16_words_t *w = &E->sec[SEC_GLOBAL];
    size_t at = begin(w, op);
    if (type)
        w16_words_push(w, type);
    w16_words_push(w, id);
    w16_words_append(w, ops, n);
    end(E, w, at);
    return id;
}

/* The SPIR-V type of an IR scalar type; f16 and bf16 are their 16 bits
 * (see half_to_f32). */
static uint32_t type_id(semit_t *E, kir_type_t t)
{
    switch (t) {
    case KIR_VOID: return intern(E, SpvOpTypeVoid, 0, NULL, 0);
    case KIR_I1: return intern(E, SpvOpTypeBool, 0, NULL, 0);
    case KIR_I8:
        E->int8 = true;
        return intern(E, SpvOpTypeInt, 0, OPS(8, 0));
    case KIR_I16:
    case KIR_F16:
    case KIR_BF16:
        E->int16 = true;
        return intern(E, SpvOpTypeInt, 0, OPS(16, 0));
    case KIR_I32: return intern(E, SpvOpTypeInt, 0, OPS(32, 0));
    case KIR_I64:
        E->int64 = true;
        return intern(E, SpvOpTypeInt, 0, OPS(64, 0));
    case KIR_F32: return intern(E, SpvOpTypeFloat, 0, OPS(32));
    default:
        efail(E, "internal: unknown type");
        return 0;
    }
}

static uint32_t ptr_type(semit_t *E, SpvStorageClass sc, uint32_t pointee)
{
    return intern(E, SpvOpTypePointer, 0, OPS((uint32_t)sc, pointee));
}

/* Bytes of an element in memory (a load's or store's alignment). */
static uint32_t elem_bytes(kir_type_t t) { return (uint32_t)kir_type_bits(t) / 8; }

static uint32_t const_int(semit_t *E, kir_type_t t, int64_t v)
{
    uint32_t ty = type_id(E, t);
    if (t == KIR_I1)
        return intern(E, v ? SpvOpConstantTrue : SpvOpConstantFalse, ty, NULL, 0);
    /* signedness 0: the bits above the width are zero */
    int bits = kir_type_bits(t);
    uint64_t u = (uint64_t)v & (bits == 64 ? ~0ull : (1ull << bits) - 1);
    if (bits == 64)
        return intern(E, SpvOpConstant, ty, OPS((uint32_t)u, (uint32_t)(u >> 32)));
    return intern(E, SpvOpConstant, ty, OPS((uint32_t)u));
}

static uint32_t const_f32(semit_t *E, double v)
{
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t ty = type_id(E, KIR_F32);
    return intern(E, SpvOpConstant, ty, OPS(bits));
}

/* ---- module-scope variables ---------------------------------------------- */

static uint32_t global_var(semit_t *E, uint32_t ptr, SpvStorageClass sc,
                           uint32_t init)
{
    uint32_t id = new_id(E);
    if (init)
        inst(E, SEC_GLOBAL, SpvOpVariable, OPS(ptr, id, (uint32_t)sc, init));
    else
        inst(E, SEC_GLOBAL, SpvOpVariable, OPS(ptr, id, (uint32_t)sc));
    return id;
}

/* builtin.x as an i64 (the variable is declared on first use). */
static uint32_t builtin_x(semit_t *E, builtin_t b)
{
    uint32_t i64 = type_id(E, KIR_I64);
    uint32_t v3 = intern(E, SpvOpTypeVector, 0, OPS(i64, 3));
    if (!E->builtin[b]) {
        uint32_t ptr = ptr_type(E, SpvStorageClassInput, v3);
        uint32_t var = global_var(E, ptr, SpvStorageClassInput, 0);
        decorate(E, var, SpvDecorationBuiltIn, (uint32_t)BUILTINS[b].builtin);
        inst(E, SEC_DECORATION, SpvOpDecorate,
             OPS(var, (uint32_t)SpvDecorationConstant));
        name(E, var, BUILTINS[b].name);
        E->builtin[b] = var;
    }
    /* the builtin variables are constant (decorated so): numbered */
    uint32_t vec = pure(E, SpvOpLoad, v3, OPS(E->builtin[b]));
    return pure(E, SpvOpCompositeExtract, i64, OPS(vec, 0));
}

/* A workgroup-shared array, declared on first use. */
static uint32_t shared_var(semit_t *E, const kir_shared_t *s)
{
    if (E->shared[s->index])
        return E->shared[s->index];
    uint32_t elem = type_id(E, s->type);
    uint32_t len = const_int(E, KIR_I32, s->count);
    uint32_t arr = intern(E, SpvOpTypeArray, 0, OPS(elem, len));
    uint32_t ptr = ptr_type(E, SpvStorageClassWorkgroup, arr);
    uint32_t var = global_var(E, ptr, SpvStorageClassWorkgroup, 0);
    name(E, var, s->name);
    return E->shared[s->index] = var;
}

/* A constant table (an initialized UniformConstant array), declared on
 * first use. */
static uint32_t ctable_var(semit_t *E, const kir_ctable_t *t)
{
    if (E->ctables[t->index])
        return E->ctables[t->index];
    uint32_t elem = type_id(E, t->type);
    uint32_t len = const_int(E, KIR_I32, t->count);
    uint32_t arr = intern(E, SpvOpTypeArray, 0, OPS(elem, len));
    uint32_t *vals = w16_alloc(E->ctx, sizeof *vals * (size_t)t->count);
    if (!vals) {
        efail(E, "out of memory");
        return 0;
    }
    for (int j = 0; j < t->count; j++)
        vals[j] = const_int(E, t->type, t->values[j]);
    uint32_t init = intern(E, SpvOpConstantComposite, arr, vals, (size_t)t->count);
    w16_free(E->ctx, vals, sizeof *vals * (size_t)t->count);
    uint32_t ptr = ptr_type(E, SpvStorageClassUniformConstant, arr);
    uint32_t var = global_var(E, ptr, SpvStorageClassUniformConstant, init);
    inst(E, SEC_DECORATION, SpvOpDecorate,
         OPS(var, (uint32_t)SpvDecorationConstant));
    name(E, var, t->name);
    return E->ctables[t->index] = var;
}

static uint32_t ocl_import(semit_t *E)
{
    if (!E->ocl) {
        E->ocl = new_id(E);
        w16_words_t *w = &E->sec[SEC_EXT_IMPORT];
        size_t at = begin(w, SpvOpExtInstImport);
        w16_words_push(w, E->ocl);
        push_string(w, "OpenCL.std");
        end(E, w, at);
    }
    return E->ocl;
}

/* ---- expressions --------------------------------------------------------- */

static uint32_t load(semit_t *E, kir_type_t t, uint32_t ptr)
{
    uint32_t ty = type_id(E, t);
    return value(E, SpvOpLoad, ty,
                 OPS(ptr, (uint32_t)SpvMemoryAccessAlignedMask, elem_bytes(t)));
}

static void store(semit_t *E, kir_type_t t, uint32_t ptr, uint32_t v)
{
    inst(E, SEC_BODY, SpvOpStore,
         OPS(ptr, v, (uint32_t)SpvMemoryAccessAlignedMask, elem_bytes(t)));
}

/* Variable i of the function (no alignment: a bool has no size). Its
 * loads are numbered (pure()) with the variable's version, which every
 * store to it changes, so a load is reused only where no store came in
 * between on the way from it; a loop first changes the versions of what
 * it stores (bump_stored), as a later iteration sees those stores. */
static uint32_t load_var(semit_t *E, kir_type_t t, int i)
{
    uint32_t ty = type_id(E, t);
    return pure_salted(E, SpvOpLoad, ty, OPS(E->vars[i]),
                       E->var_version[i] + 1);
}

static void store_var(semit_t *E, int i, uint32_t v)
{
    inst(E, SEC_BODY, SpvOpStore, OPS(E->vars[i], v));
    E->var_version[i]++;
}

/* The variables a block stores to (its loops' variables too) get new
 * versions. */
static void bump_stored(semit_t *E, const kir_block_t *blk)
{
    for (int i = 0; i < blk->count; i++) {
        const kir_stmt_t *s = blk->items[i];
        if ((s->kind == KIR_S_LET || s->kind == KIR_S_ASSIGN ||
             s->kind == KIR_S_FOR) && s->var)
            E->var_version[s->var->index]++;
        if (s->kind == KIR_S_IF || s->kind == KIR_S_FOR) {
            bump_stored(E, &s->body);
            bump_stored(E, &s->else_body);
        }
    }
}

/* &buffer[index] for a CrossWorkgroup pointer to elements of type t. */
static uint32_t element(semit_t *E, kir_type_t t, uint32_t base, uint32_t index)
{
    uint32_t elem = type_id(E, t);
    uint32_t ptr = ptr_type(E, SpvStorageClassCrossWorkgroup, elem);
    return pure(E, SpvOpInBoundsPtrAccessChain, ptr, OPS(base, index));
}

/* &array[index] for a module-scope array variable of class sc. */
static uint32_t array_element(semit_t *E, SpvStorageClass sc, kir_type_t t,
                              uint32_t var, uint32_t index)
{
    uint32_t elem = type_id(E, t);
    uint32_t ptr = ptr_type(E, sc, elem);
    return pure(E, SpvOpInBoundsAccessChain, ptr, OPS(var, index));
}

/* ---- f16 ------------------------------------------------------------------
 *
 * The OpenCL environment takes the Float16 capability (f16 values) only
 * from devices with cl_khr_fp16, which a module cannot declare and
 * SPIRV-Tools' OpenCL validation therefore refuses; every OpenCL device
 * has Float16Buffer: pointers to f16 that only OpenCL.std's vload_half and
 * vstore_half read and write. The IR has no f16 arithmetic (its f16 values
 * are loaded, stored, bit-cast and converted), so an f16 value is its 16
 * bits in an i16, and a conversion goes through a Function variable of
 * i16 seen as f16: vstore_half_r rounds to nearest even (what the CUDA C's
 * __float2half_rn does), vload_half is exact. Compilers keep the variable
 * in a register. */

/* The scratch variable (declared with the others on first use) as a
 * pointer to f16. */
static uint32_t scratch_half(semit_t *E)
{
    uint32_t i16 = type_id(E, KIR_I16);
    uint32_t pi16 = ptr_type(E, SpvStorageClassFunction, i16);
    if (!E->scratch) {
        E->scratch = new_id(E);
        inst(E, SEC_FUNCTION, SpvOpVariable,
             OPS(pi16, E->scratch, (uint32_t)SpvStorageClassFunction));
        name(E, E->scratch, "f16_bits");
    }
    E->half = true;
    uint32_t half = intern(E, SpvOpTypeFloat, 0, OPS(16));
    uint32_t phalf = ptr_type(E, SpvStorageClassFunction, half);
    return value(E, SpvOpBitcast, phalf, OPS(E->scratch));
}

static uint32_t load(semit_t *E, kir_type_t t, uint32_t ptr);
static void store(semit_t *E, kir_type_t t, uint32_t ptr, uint32_t v);

/* f16 bits (an i16) to f32: vload_half(0, scratch). */
static uint32_t half_to_f32(semit_t *E, uint32_t bits)
{
    uint32_t p = scratch_half(E);
    store(E, KIR_I16, E->scratch, bits);
    uint32_t f32 = type_id(E, KIR_F32);
    uint32_t set = ocl_import(E);
    uint32_t zero = const_int(E, KIR_I64, 0);
    return value(E, SpvOpExtInst, f32,
                 OPS(set, (uint32_t)OpenCLstd_Vload_half, zero, p));
}

/* f32 to f16 bits, rounded to nearest even: vstore_half_r(f, 0, scratch,
 * RTE). */
static uint32_t f32_to_half(semit_t *E, uint32_t f)
{
    uint32_t p = scratch_half(E);
    uint32_t void_t = type_id(E, KIR_VOID);
    uint32_t set = ocl_import(E);
    uint32_t zero = const_int(E, KIR_I64, 0);
    value(E, SpvOpExtInst, void_t,
          OPS(set, (uint32_t)OpenCLstd_Vstore_half_r, f, zero, p,
              (uint32_t)SpvFPRoundingModeRTE));
    return load(E, KIR_I16, E->scratch);
}

static uint32_t emit_expr(semit_t *E, const kir_expr_t *e);

static uint32_t emit_convert(semit_t *E, const kir_expr_t *e, uint32_t a)
{
    kir_type_t from = e->a->type, to = e->type;
    uint32_t ty = type_id(E, to);
    switch (e->op) {
    case KIR_OP_ZEXT:
    case KIR_OP_SEXT:
        if (from == KIR_I1) { /* i1 as an integer: 0 or 1 (-1) */
            uint32_t one = const_int(E, to, e->op == KIR_OP_SEXT ? -1 : 1);
            uint32_t zero = const_int(E, to, 0);
            return pure(E, SpvOpSelect, ty, OPS(a, one, zero));
        }
        return pure(E, e->op == KIR_OP_SEXT ? SpvOpSConvert : SpvOpUConvert,
                    ty, OPS(a));
    case KIR_OP_TRUNC:
        if (to == KIR_I1) { /* the low bit */
            uint32_t fty = type_id(E, from);
            uint32_t one = const_int(E, from, 1);
            uint32_t zero = const_int(E, from, 0);
            uint32_t bit = pure(E, SpvOpBitwiseAnd, fty, OPS(a, one));
            return pure(E, SpvOpINotEqual, ty, OPS(bit, zero));
        }
        return pure(E, SpvOpUConvert, ty, OPS(a));
    case KIR_OP_SITOF:
    case KIR_OP_FTOSI:
    case KIR_OP_FCONV:
        if (from == KIR_BF16 || to == KIR_BF16) {
            efail(E, "bf16 float conversions must be lowered by the builder");
            return 0;
        }
        if (from == KIR_F16) /* exact */
            a = half_to_f32(E, a);
        if (e->op == KIR_OP_SITOF) { /* to f16 through f32, as the CUDA C */
            uint32_t f32 = type_id(E, KIR_F32);
            a = value(E, SpvOpConvertSToF, f32, OPS(a));
        } else if (e->op == KIR_OP_FTOSI) { /* toward zero */
            a = value(E, SpvOpConvertFToS, ty, OPS(a));
        }
        return to == KIR_F16 ? f32_to_half(E, a) : a;
    case KIR_OP_BITCAST: {
        uint32_t fty = type_id(E, from);
        return fty == ty ? a /* bf16 <-> i16: the same bits, one type */
                         : pure(E, SpvOpBitcast, ty, OPS(a));
    }
    default:
        efail(E, "internal: not a conversion");
        return 0;
    }
}

static uint32_t emit_expr(semit_t *E, const kir_expr_t *e)
{
    if (E->fail)
        return 0;
    switch (e->op) {
    case KIR_OP_CONST:
        if (e->type == KIR_F32)
            return const_f32(E, e->fval);
        if (kir_type_is_float(e->type)) {
            efail(E, "non-f32 float constants are not emitted");
            return 0;
        }
        return const_int(E, e->type, e->ival);
    case KIR_OP_VAR: return load_var(E, e->type, e->var->index);
    case KIR_OP_PARAM: return E->params[e->param->index];
    case KIR_OP_GROUP_ID: return builtin_x(E, BI_WORKGROUP_ID);
    case KIR_OP_NUM_GROUPS: return builtin_x(E, BI_NUM_WORKGROUPS);
    case KIR_OP_LANE_ID: {
        uint32_t x = builtin_x(E, BI_LOCAL_ID);
        uint32_t i32 = type_id(E, KIR_I32);
        return pure(E, SpvOpUConvert, i32, OPS(x));
    }
    case KIR_OP_LOAD: {
        uint32_t i = emit_expr(E, e->a);
        uint32_t p = element(E, e->type, E->params[e->param->index], i);
        return load(E, e->type, p);
    }
    case KIR_OP_TLOAD: {
        /* table[slot] is a 64-bit device address of the slot's buffer */
        uint32_t slot = emit_expr(E, e->a);
        uint32_t i = emit_expr(E, e->b);
        uint32_t at = element(E, KIR_I64, E->params[e->param->index], slot);
        uint32_t addr = load(E, KIR_I64, at);
        uint32_t elem = type_id(E, e->type);
        uint32_t ptr = ptr_type(E, SpvStorageClassCrossWorkgroup, elem);
        uint32_t base = value(E, SpvOpConvertUToPtr, ptr, OPS(addr));
        uint32_t p = element(E, e->type, base, i);
        return load(E, e->type, p);
    }
    case KIR_OP_SHARED_LOAD: {
        uint32_t i = emit_expr(E, e->a);
        uint32_t var = shared_var(E, e->shared);
        uint32_t p = array_element(E, SpvStorageClassWorkgroup, e->type, var, i);
        return load(E, e->type, p);
    }
    case KIR_OP_CTLOAD: {
        uint32_t i = emit_expr(E, e->a);
        uint32_t var = ctable_var(E, e->ctable);
        uint32_t p = array_element(E, SpvStorageClassUniformConstant, e->type,
                                   var, i);
        return load(E, e->type, p);
    }
    case KIR_OP_SELECT: {
        uint32_t c = emit_expr(E, e->a);
        uint32_t a = emit_expr(E, e->b);
        uint32_t b = emit_expr(E, e->c);
        uint32_t ty = type_id(E, e->type);
        return pure(E, SpvOpSelect, ty, OPS(c, a, b));
    }
    case KIR_OP_FMAX: case KIR_OP_FMIN: {
        /* a > b ? a : b (a < b for fmin): NaN semantics of the CPU target
         * (gen/emit_llvm.c), whose kernels are checked against the
         * reference everywhere; a NaN b gives b, a NaN a gives b */
        uint32_t a = emit_expr(E, e->a);
        uint32_t b = emit_expr(E, e->b);
        uint32_t ty = type_id(E, e->type);
        uint32_t c = pure(E, e->op == KIR_OP_FMAX ? SpvOpFOrdGreaterThan
                                                  : SpvOpFOrdLessThan,
                          type_id(E, KIR_I1), OPS(a, b));
        return E->fail ? 0 : pure(E, SpvOpSelect, ty, OPS(c, a, b));
    }
    case KIR_OP_ZEXT: case KIR_OP_SEXT: case KIR_OP_TRUNC: case KIR_OP_SITOF:
    case KIR_OP_FTOSI: case KIR_OP_FCONV: case KIR_OP_BITCAST: {
        uint32_t a = emit_expr(E, e->a);
        return E->fail ? 0 : emit_convert(E, e, a);
    }
    default:
        break;
    }
    const lowering_t *L = &LOWERING[e->op];
    int arity = kir_op_arity(e->op);
    uint32_t a = emit_expr(E, e->a);
    uint32_t b = arity == 2 ? emit_expr(E, e->b) : 0;
    uint32_t ty = type_id(E, e->type);
    if (E->fail)
        return 0;
    if (L->ocl_plus_1) {
        uint32_t set = ocl_import(E);
        uint32_t fn = (uint32_t)(L->ocl_plus_1 - 1);
        return arity == 2 ? pure(E, SpvOpExtInst, ty, OPS(set, fn, a, b))
                          : pure(E, SpvOpExtInst, ty, OPS(set, fn, a));
    }
    SpvOp op = e->a->type == KIR_I1 ? L->on_bool : L->op;
    if (op == SpvOpNop) {
        efail(E, "unsupported operator");
        return 0;
    }
    return arity == 2 ? pure(E, op, ty, OPS(a, b)) : pure(E, op, ty, OPS(a));
}

/* ---- statements ---------------------------------------------------------- */

static void label(semit_t *E, uint32_t id)
{
    inst(E, SEC_BODY, SpvOpLabel, OPS(id));
    E->dead = false;
}

static void branch(semit_t *E, uint32_t to)
{
    inst(E, SEC_BODY, SpvOpBranch, OPS(to));
}

static void emit_block(semit_t *E, const kir_block_t *blk);

static void emit_if(semit_t *E, const kir_stmt_t *s)
{
    uint32_t c = emit_expr(E, s->a);
    uint32_t then = new_id(E), merge = new_id(E);
    uint32_t els = s->else_body.count ? new_id(E) : merge;
    inst(E, SEC_BODY, SpvOpSelectionMerge,
         OPS(merge, (uint32_t)SpvSelectionControlMaskNone));
    inst(E, SEC_BODY, SpvOpBranchConditional, OPS(c, then, els));
    size_t mark = E->cse_len; /* neither arm dominates the merge */
    label(E, then);
    emit_block(E, &s->body);
    cse_pop(E, mark);
    if (!E->dead)
        branch(E, merge);
    if (s->else_body.count) {
        label(E, els);
        emit_block(E, &s->else_body);
        cse_pop(E, mark);
        if (!E->dead)
            branch(E, merge);
    }
    label(E, merge);
}

/*   store var lo; br header
 *   header: i < hi ? body : merge      (OpLoopMerge merge continue)
 *   body: ...; br continue
 *   continue: var += step; br header
 *   merge: */
static void emit_for(semit_t *E, const kir_stmt_t *s)
{
    kir_type_t t = s->var->type;
    int var = s->var->index;
    uint32_t lo = emit_expr(E, s->a);
    store_var(E, var, lo);
    bump_stored(E, &s->body); /* what the body stores, the header sees */
    E->var_version[var]++;    /* and the continue block's increment */
    uint32_t header = new_id(E), body = new_id(E), cont = new_id(E),
             merge = new_id(E);
    branch(E, header);
    label(E, header);
    uint32_t i = load_var(E, t, var);
    uint32_t hi = emit_expr(E, s->b);
    uint32_t bool_t = type_id(E, KIR_I1);
    uint32_t c = value(E, SpvOpSLessThan, bool_t, OPS(i, hi));
    inst(E, SEC_BODY, SpvOpLoopMerge,
         OPS(merge, cont, (uint32_t)(s->unroll ? SpvLoopControlUnrollMask
                                               : SpvLoopControlMaskNone)));
    inst(E, SEC_BODY, SpvOpBranchConditional, OPS(c, body, merge));
    /* the header dominates body, continue and merge; the body and the
     * continue block dominate nothing after the loop */
    size_t mark = E->cse_len;
    label(E, body);
    emit_block(E, &s->body);
    cse_pop(E, mark);
    if (!E->dead)
        branch(E, cont);
    label(E, cont);
    uint32_t cur = load_var(E, t, var);
    uint32_t step = const_int(E, t, s->step);
    uint32_t ty = type_id(E, t);
    uint32_t next = value(E, SpvOpIAdd, ty, OPS(cur, step));
    store_var(E, var, next);
    branch(E, header);
    label(E, merge);
}

static void emit_stmt(semit_t *E, const kir_stmt_t *s)
{
    switch (s->kind) {
    case KIR_S_LET:
    case KIR_S_ASSIGN: {
        if (!E->read[s->var->index])
            return; /* nobody reads it (expressions have no side effects) */
        uint32_t v = emit_expr(E, s->a);
        store_var(E, s->var->index, v);
        return;
    }
    case KIR_S_STORE: {
        uint32_t i = emit_expr(E, s->a);
        uint32_t v = emit_expr(E, s->b);
        uint32_t p = element(E, s->param->type, E->params[s->param->index], i);
        store(E, s->param->type, p, v);
        return;
    }
    case KIR_S_SHARED_STORE: {
        uint32_t i = emit_expr(E, s->a);
        uint32_t v = emit_expr(E, s->b);
        uint32_t var = shared_var(E, s->shared);
        uint32_t p = array_element(E, SpvStorageClassWorkgroup, s->shared->type,
                                   var, i);
        store(E, s->shared->type, p, v);
        return;
    }
    case KIR_S_IF: emit_if(E, s); return;
    case KIR_S_FOR: emit_for(E, s); return;
    case KIR_S_BARRIER: {
        /* every lane of the workgroup, and its shared memory made visible */
        uint32_t scope = const_int(E, KIR_I32, SpvScopeWorkgroup);
        uint32_t sem = const_int(E, KIR_I32,
                                 SpvMemorySemanticsWorkgroupMemoryMask |
                                     SpvMemorySemanticsSequentiallyConsistentMask);
        inst(E, SEC_BODY, SpvOpControlBarrier, OPS(scope, scope, sem));
        return;
    }
    case KIR_S_RETURN:
        inst(E, SEC_BODY, SpvOpReturn, NULL, 0);
        E->dead = true;
        return;
    }
}

/* Statements after a return are unreachable: left out. */
static void emit_block(semit_t *E, const kir_block_t *blk)
{
    for (int i = 0; i < blk->count && !E->fail && !E->dead; i++)
        emit_stmt(E, blk->items[i]);
}

/* ---- liveness (as emit_cuda.c) ------------------------------------------- */

/* Marks the variables e reads; true if that marked anything new. */
static bool mark_expr(const kir_expr_t *e, bool *read)
{
    if (!e)
        return false;
    bool changed = false;
    if (e->op == KIR_OP_VAR && !read[e->var->index])
        changed = read[e->var->index] = true;
    changed |= mark_expr(e->a, read);
    changed |= mark_expr(e->b, read);
    changed |= mark_expr(e->c, read);
    return changed;
}

/* One pass: statements with an effect (stores, conditions, loop bounds)
 * keep what they read, a kept variable keeps what its values read. */
static bool mark_block(const kir_block_t *blk, bool *read)
{
    bool changed = false;
    for (int i = 0; i < blk->count; i++) {
        const kir_stmt_t *s = blk->items[i];
        if (s->kind == KIR_S_LET || s->kind == KIR_S_ASSIGN) {
            if (read[s->var->index])
                changed |= mark_expr(s->a, read);
            continue;
        }
        if (s->kind == KIR_S_FOR && !read[s->var->index])
            changed = read[s->var->index] = true;
        changed |= mark_expr(s->a, read);
        changed |= mark_expr(s->b, read);
        changed |= mark_block(&s->body, read);
        changed |= mark_block(&s->else_body, read);
    }
    return changed;
}

/* ---- the function and the module ----------------------------------------- */

static void emit_function(semit_t *E)
{
    const kir_kernel_t *k = E->k;
    uint32_t void_t = type_id(E, KIR_VOID);
    int np = k->n_params;
    uint32_t *sig = w16_alloc(E->ctx, sizeof *sig * (size_t)(np + 1));
    if (!sig) {
        efail(E, "out of memory");
        return;
    }
    sig[0] = void_t;
    for (int i = 0; i < np; i++) {
        const kir_param_t *p = k->params[i];
        if (p->kind == KIR_PARAM_SCALAR) {
            sig[1 + i] = type_id(E, p->type);
        } else {
            uint32_t elem = type_id(E, p->kind == KIR_PARAM_BUFFER ? p->type
                                                                  : KIR_I64);
            sig[1 + i] = ptr_type(E, SpvStorageClassCrossWorkgroup, elem);
        }
    }
    uint32_t fn_t = intern(E, SpvOpTypeFunction, 0, sig, (size_t)np + 1);
    uint32_t fn = E->fn = new_id(E);
    inst(E, SEC_FUNCTION, SpvOpFunction,
         OPS(void_t, fn, (uint32_t)SpvFunctionControlMaskNone, fn_t));
    name(E, fn, k->name);
    for (int i = 0; i < np; i++) {
        const kir_param_t *p = k->params[i];
        uint32_t id = E->params[i] = new_id(E);
        inst(E, SEC_FUNCTION, SpvOpFunctionParameter, OPS(sig[1 + i], id));
        name(E, id, p->name);
        if (p->kind == KIR_PARAM_SCALAR)
            continue;
        /* as the CUDA C's __restrict__ and const */
        decorate(E, id, SpvDecorationFuncParamAttr,
                 (uint32_t)SpvFunctionParameterAttributeNoAlias);
        if (!p->written)
            decorate(E, id, SpvDecorationFuncParamAttr,
                     (uint32_t)SpvFunctionParameterAttributeNoWrite);
    }
    w16_free(E->ctx, sig, sizeof *sig * (size_t)(np + 1));
    inst(E, SEC_FUNCTION, SpvOpLabel, OPS(new_id(E)));
    /* every variable first in the entry block, zero as in the CUDA C */
    for (int i = 0; i < k->n_vars; i++) {
        if (!E->read[i])
            continue;
        kir_type_t t = k->vars[i]->type;
        uint32_t ty = type_id(E, t);
        uint32_t ptr = ptr_type(E, SpvStorageClassFunction, ty);
        uint32_t id = E->vars[i] = new_id(E);
        inst(E, SEC_FUNCTION, SpvOpVariable,
             OPS(ptr, id, (uint32_t)SpvStorageClassFunction));
        name(E, id, k->vars[i]->name);
        /* zero by a store, not an initializer: llvm-spirv 15 turns an
         * initialized Function variable into a module-scope global (shared
         * by the work-items) and takes no scalar OpConstantNull */
        uint32_t zero = t == KIR_F32 ? const_f32(E, 0.0) : const_int(E, t, 0);
        store_var(E, i, zero);
    }
    emit_block(E, &k->body);
    if (!E->dead)
        inst(E, SEC_BODY, SpvOpReturn, NULL, 0);
    inst(E, SEC_BODY, SpvOpFunctionEnd, NULL, 0);
}

/* The sections that depend on what the function used, then the module. */
static void finish(semit_t *E, w16_words_t *mod)
{
    const kir_kernel_t *k = E->k;
    uint32_t fn = E->fn;
    static const SpvCapability always[] = {SpvCapabilityAddresses,
                                           SpvCapabilityKernel};
    for (size_t i = 0; i < W16_ARRAY_LEN(always); i++)
        inst(E, SEC_CAPABILITY, SpvOpCapability, OPS((uint32_t)always[i]));
    const struct {
        bool used;
        SpvCapability cap;
    } as_used[] = {{E->int8, SpvCapabilityInt8}, {E->int16, SpvCapabilityInt16},
                   {E->int64, SpvCapabilityInt64},
                   {E->half, SpvCapabilityFloat16Buffer}};
    for (size_t i = 0; i < W16_ARRAY_LEN(as_used); i++)
        if (as_used[i].used)
            inst(E, SEC_CAPABILITY, SpvOpCapability, OPS((uint32_t)as_used[i].cap));
    inst(E, SEC_MEMORY_MODEL, SpvOpMemoryModel,
         OPS((uint32_t)SpvAddressingModelPhysical64,
             (uint32_t)SpvMemoryModelOpenCL));
    w16_words_t *w = &E->sec[SEC_ENTRY_POINT];
    size_t at = begin(w, SpvOpEntryPoint);
    w16_words_push(w, (uint32_t)SpvExecutionModelKernel);
    w16_words_push(w, fn);
    push_string(w, k->name);
    for (int b = 0; b < BI_COUNT; b++) /* the interface: Input variables */
        if (E->builtin[b])
            w16_words_push(w, E->builtin[b]);
    end(E, w, at);
    inst(E, SEC_EXECUTION_MODE, SpvOpExecutionMode,
         OPS(fn, (uint32_t)SpvExecutionModeLocalSize, (uint32_t)k->lanes, 1, 1));
    if (!k->fp_reassoc)
        inst(E, SEC_EXECUTION_MODE, SpvOpExecutionMode,
             OPS(fn, (uint32_t)SpvExecutionModeContractionOff));
    const uint32_t header[] = {SpvMagicNumber, W16_SPIRV_VERSION,
                               W16_SPIRV_GENERATOR, E->next_id, 0 /* schema */};
    w16_words_append(mod, header, W16_ARRAY_LEN(header));
    for (int s = 0; s < SEC_COUNT; s++)
        w16_words_append(mod, E->sec[s].data, E->sec[s].len);
}

/* Emits the module into mod, unvalidated. */
static wna16_status_t emit_module(const kir_kernel_t *k, w16_words_t *mod,
                                  wna16_error_t *err)
{
    if (k->native)
        return w16_err(err, WNA16_EUNSUPPORTED, "kernel %s: its code is "
                       "written for the CPU (LLVM) only", k->name);
    wna16_context_t *ctx = k->arena.ctx;
    semit_t E = {.k = k, .ctx = ctx, .next_id = 1};
    for (int s = 0; s < SEC_COUNT; s++)
        w16_words_init(&E.sec[s], ctx);
    w16_words_init(&E.keys, ctx);
    w16_words_init(&E.cse_keys, ctx);
    E.cse_bucket = w16_calloc(ctx, CSE_BUCKETS, sizeof *E.cse_bucket);
    E.vars = w16_calloc(ctx, (size_t)k->n_vars + 1, sizeof *E.vars);
    E.var_version = w16_calloc(ctx, (size_t)k->n_vars + 1,
                               sizeof *E.var_version);
    E.params = w16_calloc(ctx, (size_t)k->n_params + 1, sizeof *E.params);
    E.shared = w16_calloc(ctx, (size_t)k->n_shared + 1, sizeof *E.shared);
    E.ctables = w16_calloc(ctx, (size_t)k->n_ctables + 1, sizeof *E.ctables);
    E.read = w16_calloc(ctx, (size_t)k->n_vars + 1, sizeof *E.read);
    if (!E.vars || !E.params || !E.shared || !E.ctables || !E.read ||
        !E.cse_bucket || !E.var_version) {
        efail(&E, "out of memory");
    } else {
        while (mark_block(&k->body, E.read))
            ;
        emit_function(&E);
        if (!E.fail)
            finish(&E, mod);
    }
    bool nomem = E.keys.failed || E.cse_keys.failed || mod->failed;
    for (int s = 0; s < SEC_COUNT; s++) {
        nomem |= E.sec[s].failed;
        w16_words_free(&E.sec[s]);
    }
    w16_words_free(&E.keys);
    w16_words_free(&E.cse_keys);
    w16_free(ctx, E.cse_bucket, CSE_BUCKETS * sizeof *E.cse_bucket);
    w16_free(ctx, E.cse, E.cse_cap * sizeof *E.cse);
    w16_free(ctx, E.table, E.table_cap * sizeof *E.table);
    w16_free(ctx, E.vars, ((size_t)k->n_vars + 1) * sizeof *E.vars);
    w16_free(ctx, E.var_version,
             ((size_t)k->n_vars + 1) * sizeof *E.var_version);
    w16_free(ctx, E.params, ((size_t)k->n_params + 1) * sizeof *E.params);
    w16_free(ctx, E.shared, ((size_t)k->n_shared + 1) * sizeof *E.shared);
    w16_free(ctx, E.ctables, ((size_t)k->n_ctables + 1) * sizeof *E.ctables);
    w16_free(ctx, E.read, ((size_t)k->n_vars + 1) * sizeof *E.read);
    if (nomem || (E.fail && strcmp(E.fail, "out of memory") == 0))
        return w16_err(err, WNA16_ENOMEM, "kernel %s: out of memory emitting "
                       "SPIR-V", k->name);
    if (E.fail)
        return w16_err(err, WNA16_EUNSUPPORTED, "kernel %s: SPIR-V emitter: %s",
                       k->name, E.fail);
    return WNA16_OK;
}

wna16_status_t w16_emit_spirv(const kir_kernel_t *k, w16_words_t *out,
                              wna16_error_t *err)
{
    w16_words_t mod;
    w16_words_init(&mod, k->arena.ctx);
    wna16_status_t st = emit_module(k, &mod, err);
    if (st == WNA16_OK)
        st = w16_spirv_validate(mod.data, mod.len, k->name, err);
    if (st == WNA16_OK) {
        size_t old = out->len;
        w16_words_append(out, mod.data, mod.len);
        if (out->failed) {
            out->len = old;
            st = w16_err(err, WNA16_ENOMEM, "kernel %s: out of memory emitting "
                         "SPIR-V", k->name);
        }
    }
    w16_words_free(&mod);
    return st;
}

wna16_status_t w16_emit_spirv_text(const kir_kernel_t *k, w16_buf_t *out,
                                   wna16_error_t *err)
{
    w16_words_t mod;
    w16_words_init(&mod, k->arena.ctx);
    wna16_status_t st = w16_emit_spirv(k, &mod, err);
    if (st == WNA16_OK) {
        if (k->comment)
            w16_buf_printf(out, "; %s: %s\n", k->name, k->comment);
        st = w16_spirv_disassemble(mod.data, mod.len, k->name, out, err);
    }
    w16_words_free(&mod);
    return st;
}

#else /* no SPIRV-Tools: nothing may leave unvalidated */

wna16_status_t w16_emit_spirv(const kir_kernel_t *k, w16_words_t *out,
                              wna16_error_t *err)
{
    (void)out;
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: this build has no "
                   "SPIR-V emitter (install spirv-tools and spirv-headers and "
                   "reconfigure)", k->name);
}

wna16_status_t w16_emit_spirv_text(const kir_kernel_t *k, w16_buf_t *out,
                                   wna16_error_t *err)
{
    (void)out;
    return w16_emit_spirv(k, NULL, err);
}

#endif
