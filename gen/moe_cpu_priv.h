/*
 * moe_cpu_priv.h - what the dedicated CPU generator's two files share
 * (gen/moe_cpu.c: the plan, the probe of vLLM's `cpu` VNNI blocks, the
 * input stage, the activations and the GEMM stages' skeleton;
 * gen/moe_cpu_cols.c: the probe and the GEMM blocks of layouts whose
 * columns keep their K codes contiguous): the plan, the maps' evaluation
 * helpers, and the LLVM C API builder helpers (static inline, short
 * names: this header is private to those two files).
 */
#ifndef W16_MOE_CPU_PRIV_H
#define W16_MOE_CPU_PRIV_H

#include "gen/moe_cpu.h"

#include <string.h>

/* ---- the plan ---- */

typedef w16_moe_cpu_op_t mc_op_t;

typedef struct mc_plan {
    w16_moe_stage_t stage;
    wna16_numerics_t numerics;
    wna16_dtype_t act_dtype;
    wna16_activation_t activation;
    float limit, alpha, beta;
    bool gated, on_input, batched, round;
    int64_t topk, E, H, I, IP;
    int BM, TB; /* rows a pass; gemm2's column blocks a tile */
    int pf;     /* bytes ahead of a line the GEMMs prefetch (0: none) */
    mc_op_t op[2];
    int param[W16_MOE_ARG_COUNT];
} mc_plan_t;

/* The flat element offset and bit of role l's element at (e, n, k, g);
 * false where the maps do not evaluate or the element is outside shape. */
bool w16_moe_cpu_locate(const w16_layout_t *l, const int64_t *v,
                        const int64_t *shape, int64_t e, int64_t n, int64_t k,
                        int64_t g, int64_t *flat, int64_t *bit);
/* The storage dtype of role r of operand g. */
wna16_dtype_t w16_moe_cpu_dtype_of(const w16_moe_request_t *req, int g,
                                   w16_role_t r);
/* The experts a probe walks (the first and the last) in out; their count. */
int w16_moe_cpu_probe_experts(int64_t E, int64_t *out);

/* The K-contiguous column shape (gen/moe_cpu_cols.c): checks that the
 * qweight map of operand g stores code (n, k) in byte q0 + e q_e + n q_n
 * + k of 8-bit codes, fills those fields of o (N, K, bk, ... set), or
 * returns the reason it does not. */
const char *w16_moe_cpu_probe_cols(const w16_moe_request_t *req,
                                   const w16_problem_t *p, int g,
                                   const int64_t *v, w16_moe_cpu_op_t *o);

#ifdef WNA16_HAVE_LLVM
#include <llvm-c/Core.h>

typedef struct cg {
    const mc_plan_t *P;
    LLVMContextRef c;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMValueRef fn, args;
    LLVMBasicBlockRef entry;
    LLVMTypeRef i1, i8, i16, i32, i64, f32, f16, ptr;
    LLVMTypeRef v16i32, v16f32, v16i16, v16i8, v32i8, v16f16;
    LLVMTypeRef dpbusd_t;
    LLVMValueRef dpbusd;
    LLVMValueRef perm_lo, perm_hi; /* shuffle masks (see the top) */
} cg_t;

static inline LLVMValueRef ci64(cg_t *G, int64_t v) { return LLVMConstInt(G->i64, (unsigned long long)v, 1); }
static inline LLVMValueRef ci32(cg_t *G, int32_t v) { return LLVMConstInt(G->i32, (unsigned long long)(int64_t)v, 1); }
static inline LLVMValueRef cf32(cg_t *G, double v) { return LLVMConstReal(G->f32, v); }

static inline LLVMValueRef splat(cg_t *G, LLVMValueRef s, unsigned n)
{
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(s), n);
    LLVMValueRef v = LLVMBuildInsertElement(G->b, LLVMGetPoison(vt), s,
                                            ci32(G, 0), "");
    return LLVMBuildShuffleVector(G->b, v, LLVMGetPoison(vt),
                                  LLVMConstNull(LLVMVectorType(G->i32, n)), "");
}
static inline LLVMValueRef vi32(cg_t *G, int32_t v) { return splat(G, ci32(G, v), 16); }
static inline LLVMValueRef vf32(cg_t *G, double v) { return splat(G, cf32(G, v), 16); }

static inline LLVMValueRef mask(cg_t *G, const int *idx, int n)
{
    LLVMValueRef e[32];
    for (int i = 0; i < n; i++)
        e[i] = ci32(G, idx[i]);
    return LLVMConstVector(e, (unsigned)n);
}

static inline LLVMValueRef shuf(cg_t *G, LLVMValueRef a, LLVMValueRef b, LLVMValueRef m)
{
    return LLVMBuildShuffleVector(G->b, a, b ? b : LLVMGetPoison(LLVMTypeOf(a)),
                                  m, "");
}

/* byte address p + off */
static inline LLVMValueRef at(cg_t *G, LLVMValueRef p, LLVMValueRef off)
{
    return LLVMBuildGEP2(G->b, G->i8, p, &off, 1, "");
}

static inline LLVMValueRef ld(cg_t *G, LLVMTypeRef t, LLVMValueRef p, unsigned align)
{
    LLVMValueRef v = LLVMBuildLoad2(G->b, t, p, "");
    LLVMSetAlignment(v, align);
    return v;
}

static inline void st(cg_t *G, LLVMValueRef v, LLVMValueRef p, unsigned align)
{
    LLVMSetAlignment(LLVMBuildStore(G->b, v, p), align);
}

static inline LLVMValueRef add(cg_t *G, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAdd(G->b, a, b, ""); }
static inline LLVMValueRef mul(cg_t *G, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildMul(G->b, a, b, ""); }
static inline LLVMValueRef fmul(cg_t *G, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(G->b, a, b, ""); }
static inline LLVMValueRef fadd(cg_t *G, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(G->b, a, b, ""); }
static inline LLVMValueRef fsub(cg_t *G, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(G->b, a, b, ""); }

/* A builder at the start of the entry block, where allocas go (the
 * caller disposes of it). */
static inline LLVMBuilderRef entry_builder(cg_t *G)
{
    LLVMBuilderRef e = LLVMCreateBuilderInContext(G->c);
    LLVMValueRef first = LLVMGetFirstInstruction(G->entry);
    if (first)
        LLVMPositionBuilderBefore(e, first);
    else
        LLVMPositionBuilderAtEnd(e, G->entry);
    return e;
}

/* An alloca in the entry block (promoted to registers by O3). */
static inline LLVMValueRef var(cg_t *G, LLVMTypeRef t, LLVMValueRef init)
{
    LLVMBuilderRef e = entry_builder(G);
    LLVMValueRef a = LLVMBuildAlloca(e, t, "");
    LLVMDisposeBuilder(e);
    if (init)
        LLVMBuildStore(G->b, init, a);
    return a;
}

static inline LLVMValueRef array(cg_t *G, LLVMTypeRef t, int64_t n, unsigned align)
{
    LLVMBuilderRef e = entry_builder(G);
    LLVMValueRef a = LLVMBuildArrayAlloca(e, t, ci64(G, n), "");
    LLVMSetAlignment(a, align);
    LLVMDisposeBuilder(e);
    return a;
}

/* for (i = lo; i < hi; i += step): loop_open returns i in the body. */
typedef struct loop {
    LLVMValueRef iv, step;
    LLVMBasicBlockRef head, exit;
} loop_t;

static inline LLVMValueRef loop_open(cg_t *G, loop_t *L, LLVMValueRef lo,
                              LLVMValueRef hi, int64_t step)
{
    L->iv = var(G, G->i64, lo);
    L->step = ci64(G, step);
    L->head = LLVMAppendBasicBlockInContext(G->c, G->fn, "head");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(G->c, G->fn, "body");
    L->exit = LLVMAppendBasicBlockInContext(G->c, G->fn, "exit");
    LLVMBuildBr(G->b, L->head);
    LLVMPositionBuilderAtEnd(G->b, L->head);
    LLVMValueRef i = LLVMBuildLoad2(G->b, G->i64, L->iv, "i");
    LLVMBuildCondBr(G->b, LLVMBuildICmp(G->b, LLVMIntSLT, i, hi, ""), body,
                    L->exit);
    LLVMPositionBuilderAtEnd(G->b, body);
    return i;
}

static inline void loop_close(cg_t *G, loop_t *L)
{
    LLVMValueRef i = LLVMBuildLoad2(G->b, G->i64, L->iv, "");
    LLVMBuildStore(G->b, add(G, i, L->step), L->iv);
    LLVMBuildBr(G->b, L->head);
    LLVMPositionBuilderAtEnd(G->b, L->exit);
}

/* if (cond) { ... }: returns the join block for if_close. */
static inline LLVMBasicBlockRef if_open(cg_t *G, LLVMValueRef cond)
{
    LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(G->c, G->fn, "then");
    LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(G->c, G->fn, "join");
    LLVMBuildCondBr(G->b, cond, then, join);
    LLVMPositionBuilderAtEnd(G->b, then);
    return join;
}

static inline void if_close(cg_t *G, LLVMBasicBlockRef join)
{
    LLVMBuildBr(G->b, join);
    LLVMPositionBuilderAtEnd(G->b, join);
}

static inline LLVMValueRef intrinsic(cg_t *G, const char *name, LLVMTypeRef *over,
                              size_t n_over, LLVMValueRef *args, unsigned n)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(G->m, id, over, n_over);
    LLVMTypeRef t = LLVMIntrinsicGetType(G->c, id, over, n_over);
    return LLVMBuildCall2(G->b, t, f, args, n, "");
}

/* argument a of the kernel as a pointer (or i64 scalar) */
static inline LLVMValueRef arg_i64(cg_t *G, w16_moe_arg_t a)
{
    LLVMValueRef ix = ci64(G, G->P->param[a]);
    return ld(G, G->i64, LLVMBuildGEP2(G->b, G->i64, G->args, &ix, 1, ""), 8);
}
static inline LLVMValueRef arg_ptr(cg_t *G, w16_moe_arg_t a)
{
    return LLVMBuildIntToPtr(G->b, arg_i64(G, a), G->ptr, "");
}
/* One row of a pass: whether it is real, its slot, its codes, scale and
 * block sums. */
typedef struct prow {
    LLVMValueRef valid, slot, q, scale, sums;
} prow_t;

/* Prefetches the plan's distance ahead of the weight line at p. */
static inline void prefetch(cg_t *G, LLVMValueRef p)
{
    if (!G->P->pf)
        return;
    LLVMValueRef pa[4] = {at(G, p, ci64(G, G->P->pf)), ci32(G, 0), ci32(G, 3),
                          ci32(G, 1)};
    LLVMTypeRef pt = G->ptr;
    intrinsic(G, "llvm.prefetch", &pt, 1, pa, 4);
}
/* The GEMM blocks of the K-contiguous column shape (gen/moe_cpu_cols.c),
 * as moe_cpu.c's block_gemm for the VNNI blocks: facc[r][0|1] (columns
 * 32 nb + 0..15 | 16..31, natural order) = column block nb of operand g
 * against the pass's rows, int8-dynamic (the only contract of this
 * shape). */
void w16_moe_cpu_gemm_cols(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                           const prow_t *rows, int BM, LLVMValueRef facc[][2]);
#endif

#endif
