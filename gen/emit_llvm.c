/*
 * emit_llvm.c - kernel IR to LLVM IR (see emit_llvm.h). A straight
 * recursive lowering: variables are allocas in the lane function's entry
 * block (mem2reg makes them SSA), structured statements become blocks, and
 * the lane function is always-inlined into the loop over lanes:
 *
 *   NAME(args, g0, g1, ng)           reads the buffers from args
 *     NAME.groups(..., bufs noalias) for g: for lane: NAME.lane(...)
 *
 * The loop over lanes asks to be vectorized (16 lanes) and is declared
 * parallel: the lanes' buffer accesses form one access group, since the
 * IR's lanes are unordered. Those are facts of the launch model that
 * LLVM's own analyses cannot see (see emit_loops).
 */
#include "gen/emit_llvm.h"

#ifdef WNA16_HAVE_LLVM
#include <llvm-c/Analysis.h>
#include <llvm-c/DebugInfo.h>
#include <llvm-c/IRReader.h>
#include <llvm-c/TargetMachine.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct emitter {
    const kir_kernel_t *k;
    LLVMContextRef c;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    LLVMValueRef *vars;    /* allocas, by var index */
    LLVMValueRef *params;  /* loaded parameter values, by param index */
    LLVMValueRef *ctables; /* globals, by table index */
    LLVMValueRef group, lane, num_groups;
    LLVMTypeRef ptr;
    LLVMMetadataRef access_group; /* the lanes' buffer accesses */
    bool lut;                     /* small codes to float by table (lut_call) */
    const char *fail;
} emitter_t;

static LLVMTypeRef ltype(emitter_t *E, kir_type_t t)
{
    switch (t) {
    case KIR_I1: return LLVMInt1TypeInContext(E->c);
    case KIR_I8: return LLVMInt8TypeInContext(E->c);
    case KIR_I16: return LLVMInt16TypeInContext(E->c);
    case KIR_I32: return LLVMInt32TypeInContext(E->c);
    case KIR_I64: return LLVMInt64TypeInContext(E->c);
    case KIR_F16: return LLVMHalfTypeInContext(E->c);
    case KIR_BF16: return LLVMBFloatTypeInContext(E->c);
    case KIR_F32: return LLVMFloatTypeInContext(E->c);
    default: return LLVMVoidTypeInContext(E->c);
    }
}

static LLVMValueRef efail(emitter_t *E, const char *why)
{
    if (!E->fail)
        E->fail = why;
    return NULL;
}

static LLVMValueRef emit_expr(emitter_t *E, const kir_expr_t *e);

/* Kernels that allow it (fp_reassoc) mark float arithmetic reassociable
 * and contractible, which is what the loop vectorizer needs to vectorize
 * a float reduction; never nnan/ninf, so NaN and infinity propagate. */
static LLVMValueRef fp_flags(emitter_t *E, LLVMValueRef v)
{
    if (E->k->fp_reassoc && v && LLVMCanValueUseFastMathFlags(v))
        LLVMSetFastMathFlags(v, LLVMFastMathAllowReassoc |
                                    LLVMFastMathAllowContract);
    return v;
}

/* exp is LLVM's intrinsic; tanh and erf (no intrinsic in LLVM 19) call
 * the C library's tanhf/erff, which the JIT resolves in the process. All
 * three are pure, so LLVM may hoist and combine them. */
static LLVMValueRef emit_math(emitter_t *E, const kir_expr_t *e,
                              LLVMValueRef a)
{
    const char *name = e->op == KIR_OP_FEXP ? "llvm.exp.f32"
                       : e->op == KIR_OP_FTANH ? "tanhf" : "erff";
    LLVMTypeRef f32 = LLVMFloatTypeInContext(E->c);
    LLVMTypeRef ft = LLVMFunctionType(f32, &f32, 1, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(E->m, name);
    if (!fn) {
        fn = LLVMAddFunction(E->m, name, ft);
        const char *attrs[] = {"nounwind", "willreturn", "nosync"};
        for (size_t i = 0; i < W16_ARRAY_LEN(attrs); i++) {
            unsigned kind = LLVMGetEnumAttributeKindForName(attrs[i],
                                                            strlen(attrs[i]));
            LLVMAddAttributeAtIndex(fn, (unsigned)LLVMAttributeFunctionIndex,
                                    LLVMCreateEnumAttribute(E->c, kind, 0));
        }
        unsigned mem = LLVMGetEnumAttributeKindForName("memory", 6);
        LLVMAddAttributeAtIndex(fn, (unsigned)LLVMAttributeFunctionIndex,
                                LLVMCreateEnumAttribute(E->c, mem, 0));
    }
    return LLVMBuildCall2(E->b, ft, fn, &a, 1, "");
}

/* ---- small codes to float by a table lookup ------------------------------ *
 *
 * sitof((x & m) - c), m in [0, 15] (the `- c` optional), is how the
 * builders convert a 4-bit weight code minus a constant zero point; LLVM
 * vectorizes it as a mask, a subtraction and an integer-to-float
 * conversion. The value depends on x's low four bits alone, so on x86 with
 * AVX-512 one vpermps does it: 16 lanes index a register holding the 16
 * possible results. LLVM's loop vectorizer cannot invent that, but it
 * replaces calls by the vector variants a call site names: the emitter
 * calls a scalar function (never inlined, readnone) whose call sites name
 * a 16-lane variant made of the permute, and the pipeline ends with
 * always-inline (W16_LLVM_PASSES), which puts the permute in the
 * vectorized loop. Exact: the table holds the converted integers. */

/* The operands of the pattern above, or false. */
static bool lut_operands(const kir_expr_t *e, const kir_expr_t **x,
                         int64_t *m, int64_t *c)
{
    if (e->op != KIR_OP_SITOF || e->type != KIR_F32 || e->a->type != KIR_I32)
        return false;
    const kir_expr_t *a = e->a;
    *c = 0;
    if (a->op == KIR_OP_SUB && a->b->op == KIR_OP_CONST &&
        a->b->ival >= -(INT64_C(1) << 20) && a->b->ival <= (INT64_C(1) << 20)) {
        *c = a->b->ival;
        a = a->a;
    }
    if (a->op != KIR_OP_AND || a->b->op != KIR_OP_CONST || a->b->ival < 0 ||
        a->b->ival > 15)
        return false;
    *x = a->a;
    *m = a->b->ival;
    return true;
}

static void add_attr(emitter_t *E, LLVMValueRef fn, const char *name);

/* Keeps fn until the end of the pipeline (llvm.compiler.used): the vector
 * variant has no caller before vectorization. */
static void keep_function(emitter_t *E, LLVMValueRef fn)
{
    static const char name[] = "llvm.compiler.used";
    LLVMValueRef old = LLVMGetNamedGlobal(E->m, name);
    LLVMValueRef items[64];
    unsigned n = 0;
    if (old) {
        LLVMValueRef init = LLVMGetInitializer(old);
        int count = init ? LLVMGetNumOperands(init) : 0;
        for (int i = 0; i < count && n < 63; i++)
            items[n++] = LLVMGetOperand(init, (unsigned)i);
        LLVMDeleteGlobal(old);
    }
    items[n++] = fn;
    LLVMValueRef arr = LLVMConstArray2(E->ptr, items, n);
    LLVMValueRef g = LLVMAddGlobal(E->m, LLVMTypeOf(arr), name);
    LLVMSetInitializer(g, arr);
    LLVMSetLinkage(g, LLVMAppendingLinkage);
    LLVMSetSection(g, "llvm.metadata");
}

/* The scalar function of table (m, c) and its 16-lane variant (created
 * once per module); returns the scalar one, *abi the call sites'
 * attribute value. */
static LLVMValueRef lut_function(emitter_t *E, int64_t m, int64_t c,
                                 char *abi, size_t abi_size)
{
    LLVMContextRef ctx = E->c;
    LLVMTypeRef i32 = LLVMInt32TypeInContext(ctx), f32 = LLVMFloatTypeInContext(ctx);
    char name[64], vname[80];
    snprintf(name, sizeof name, "w16.lut4.m%lld.c%s%lld", (long long)m,
             c < 0 ? "n" : "", (long long)(c < 0 ? -c : c));
    snprintf(vname, sizeof vname, "%s.v16", name);
    snprintf(abi, abi_size, "_ZGV_LLVM_N16v_%s(%s)", name, vname);
    LLVMValueRef fn = LLVMGetNamedFunction(E->m, name);
    if (fn)
        return fn;
    LLVMBuilderRef B = LLVMCreateBuilderInContext(ctx);
    /* scalar: sitofp((x & m) - c) */
    fn = LLVMAddFunction(E->m, name, LLVMFunctionType(f32, &i32, 1, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    add_attr(E, fn, "noinline");
    add_attr(E, fn, "nounwind");
    add_attr(E, fn, "willreturn");
    unsigned mem = LLVMGetEnumAttributeKindForName("memory", 6);
    LLVMAddAttributeAtIndex(fn, (unsigned)LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(ctx, mem, 0));
    LLVMPositionBuilderAtEnd(B, LLVMAppendBasicBlockInContext(ctx, fn, "entry"));
    LLVMValueRef v = LLVMBuildAnd(B, LLVMGetParam(fn, 0),
                                  LLVMConstInt(i32, (unsigned long long)m, 0), "");
    v = LLVMBuildSub(B, v, LLVMConstInt(i32, (unsigned long long)c, 1), "");
    LLVMBuildRet(B, LLVMBuildSIToFP(B, v, f32, ""));
    /* 16 lanes: vpermps from the table of the 16 results */
    LLVMTypeRef vi = LLVMVectorType(i32, 16), vf = LLVMVectorType(f32, 16);
    LLVMValueRef vfn = LLVMAddFunction(E->m, vname, LLVMFunctionType(vf, &vi, 1, 0));
    LLVMSetLinkage(vfn, LLVMInternalLinkage);
    add_attr(E, vfn, "alwaysinline");
    add_attr(E, vfn, "nounwind");
    LLVMPositionBuilderAtEnd(B, LLVMAppendBasicBlockInContext(ctx, vfn, "entry"));
    LLVMValueRef tv[16];
    for (int i = 0; i < 16; i++)
        tv[i] = LLVMConstReal(f32, (double)((i & m) - c));
    static const char perm[] = "llvm.x86.avx512.permvar.sf.512";
    unsigned id = LLVMLookupIntrinsicID(perm, sizeof perm - 1);
    LLVMValueRef pf = LLVMGetIntrinsicDeclaration(E->m, id, NULL, 0);
    LLVMValueRef args[2] = {LLVMConstVector(tv, 16), LLVMGetParam(vfn, 0)};
    LLVMBuildRet(B, LLVMBuildCall2(B, LLVMIntrinsicGetType(ctx, id, NULL, 0),
                                   pf, args, 2, ""));
    LLVMDisposeBuilder(B);
    keep_function(E, vfn);
    return fn;
}

/* sitof((x & m) - c) through lut_function; NULL when e is not that. */
static LLVMValueRef lut_call(emitter_t *E, const kir_expr_t *e)
{
    const kir_expr_t *x;
    int64_t m, c;
    if (!E->lut || !lut_operands(e, &x, &m, &c))
        return NULL;
    LLVMValueRef xv = emit_expr(E, x);
    if (!xv)
        return NULL;
    char abi[200];
    LLVMValueRef fn = lut_function(E, m, c, abi, sizeof abi);
    LLVMValueRef call = LLVMBuildCall2(E->b, LLVMGlobalGetValueType(fn), fn,
                                       &xv, 1, "");
    static const char key[] = "vector-function-abi-variant";
    LLVMAddCallSiteAttribute(call, (unsigned)LLVMAttributeFunctionIndex,
                             LLVMCreateStringAttribute(E->c, key, sizeof key - 1,
                                                       abi, (unsigned)strlen(abi)));
    return call;
}

/* Whether the module's code runs on x86-64 with AVX-512: `features` is
 * the LLVM feature string it is compiled with, NULL for the host's (the
 * JIT compiles for the host; kernel packs for named x86-64 levels). */
static bool has_avx512(LLVMModuleRef m, const char *features)
{
    const char *triple = LLVMGetTarget(m);
    if (!triple || strncmp(triple, "x86_64", 6) != 0)
        return false;
    char *host = features ? NULL : LLVMGetHostCPUFeatures();
    const char *f = features ? features : host;
    bool yes = false;
    for (const char *p = f; p && *p && !yes; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
        yes = strncmp(p, "+avx512f", 8) == 0 && (p[8] == ',' || p[8] == '\0');
    if (host)
        LLVMDisposeMessage(host);
    return yes;
}

static LLVMValueRef emit_binary(emitter_t *E, const kir_expr_t *e,
                                LLVMValueRef a, LLVMValueRef b)
{
    LLVMBuilderRef B = E->b;
    switch (e->op) {
    case KIR_OP_ADD: return LLVMBuildAdd(B, a, b, "");
    case KIR_OP_SUB: return LLVMBuildSub(B, a, b, "");
    case KIR_OP_MUL: return LLVMBuildMul(B, a, b, "");
    case KIR_OP_UDIV: return LLVMBuildUDiv(B, a, b, "");
    case KIR_OP_SDIV: return LLVMBuildSDiv(B, a, b, "");
    case KIR_OP_UREM: return LLVMBuildURem(B, a, b, "");
    case KIR_OP_SREM: return LLVMBuildSRem(B, a, b, "");
    case KIR_OP_SHL: return LLVMBuildShl(B, a, b, "");
    case KIR_OP_LSHR: return LLVMBuildLShr(B, a, b, "");
    case KIR_OP_ASHR: return LLVMBuildAShr(B, a, b, "");
    case KIR_OP_AND: return LLVMBuildAnd(B, a, b, "");
    case KIR_OP_OR: return LLVMBuildOr(B, a, b, "");
    case KIR_OP_XOR: return LLVMBuildXor(B, a, b, "");
    case KIR_OP_SMIN:
        return LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, a, b, ""), a, b, "");
    case KIR_OP_SMAX:
        return LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSGT, a, b, ""), a, b, "");
    case KIR_OP_FADD: return fp_flags(E, LLVMBuildFAdd(B, a, b, ""));
    case KIR_OP_FSUB: return fp_flags(E, LLVMBuildFSub(B, a, b, ""));
    case KIR_OP_FMUL: return fp_flags(E, LLVMBuildFMul(B, a, b, ""));
    case KIR_OP_FDIV: return LLVMBuildFDiv(B, a, b, "");
    case KIR_OP_FMAX:
        return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, a, b, ""), a, b, "");
    case KIR_OP_FMIN:
        return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, a, b, ""), a, b, "");
    case KIR_OP_EQ: return LLVMBuildICmp(B, LLVMIntEQ, a, b, "");
    case KIR_OP_NE: return LLVMBuildICmp(B, LLVMIntNE, a, b, "");
    case KIR_OP_SLT: return LLVMBuildICmp(B, LLVMIntSLT, a, b, "");
    case KIR_OP_SLE: return LLVMBuildICmp(B, LLVMIntSLE, a, b, "");
    case KIR_OP_ULT: return LLVMBuildICmp(B, LLVMIntULT, a, b, "");
    case KIR_OP_ULE: return LLVMBuildICmp(B, LLVMIntULE, a, b, "");
    case KIR_OP_FLT: return LLVMBuildFCmp(B, LLVMRealOLT, a, b, "");
    case KIR_OP_FLE: return LLVMBuildFCmp(B, LLVMRealOLE, a, b, "");
    default: return efail(E, "internal: not a binary operator");
    }
}

static LLVMValueRef emit_convert(emitter_t *E, const kir_expr_t *e,
                                 LLVMValueRef a)
{
    LLVMBuilderRef B = E->b;
    LLVMTypeRef to = ltype(E, e->type);
    switch (e->op) {
    case KIR_OP_ZEXT: return LLVMBuildZExt(B, a, to, "");
    case KIR_OP_SEXT: return LLVMBuildSExt(B, a, to, "");
    case KIR_OP_TRUNC: return LLVMBuildTrunc(B, a, to, "");
    case KIR_OP_SITOF: return LLVMBuildSIToFP(B, a, to, "");
    case KIR_OP_FTOSI: return LLVMBuildFPToSI(B, a, to, "");
    case KIR_OP_BITCAST: return LLVMBuildBitCast(B, a, to, "");
    case KIR_OP_FCONV:
        if (e->a->type == KIR_BF16 || e->type == KIR_BF16)
            /* bf16 conversions need runtime helpers on most CPUs; the
             * builders lower them with integer ops instead */
            return efail(E, "bf16 float conversions must be lowered by the "
                            "builder");
        return kir_type_bits(e->type) > kir_type_bits(e->a->type)
                   ? LLVMBuildFPExt(B, a, to, "")
                   : LLVMBuildFPTrunc(B, a, to, "");
    default: return efail(E, "internal: not a conversion");
    }
}

/* Buffer accesses of the lanes join one access group, which the lane loop
 * declares parallel: lanes are unordered by the IR's launch model (no lane
 * reads what another writes), so the vectorizer needs no dependence or
 * bounds checks between them, e.g. for stores through computed indices. */
static LLVMValueRef in_group(emitter_t *E, LLVMValueRef access)
{
    static const char kind[] = "llvm.access.group";
    if (E->access_group)
        LLVMSetMetadata(access, LLVMGetMDKindIDInContext(E->c, kind, sizeof kind - 1),
                        LLVMMetadataAsValue(E->c, E->access_group));
    return access;
}

/* A new access group: a distinct metadata node without operands. The C
 * API builds only uniqued nodes, so one is read from a line of IR (in the
 * same context: metadata belongs to the context, not to the scratch
 * module). NULL if that fails; the kernel is then only less optimized. */
static LLVMMetadataRef new_access_group(LLVMContextRef c)
{
    static const char ir[] =
        "define void @g(ptr %p) {\n"
        "  %v = load i8, ptr %p, align 1, !llvm.access.group !0\n"
        "  ret void\n"
        "}\n"
        "!0 = distinct !{}\n";
    static const char kind[] = "llvm.access.group";
    LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(
        ir, sizeof ir - 1, "access_group");
    LLVMModuleRef m = NULL;
    char *msg = NULL;
    if (LLVMParseIRInContext(c, mb, &m, &msg)) { /* takes mb */
        LLVMDisposeMessage(msg);
        return NULL;
    }
    LLVMMetadataRef node = NULL;
    LLVMValueRef f = LLVMGetNamedFunction(m, "g");
    LLVMValueRef load = f ? LLVMGetFirstInstruction(LLVMGetFirstBasicBlock(f)) : NULL;
    LLVMValueRef md = load ? LLVMGetMetadata(load, LLVMGetMDKindIDInContext(
                                                       c, kind, sizeof kind - 1))
                           : NULL;
    if (md)
        node = LLVMValueAsMetadata(md);
    LLVMDisposeModule(m);
    return node;
}

static LLVMValueRef gep_load(emitter_t *E, LLVMTypeRef elem, LLVMValueRef base,
                             LLVMValueRef index)
{
    LLVMValueRef p = LLVMBuildInBoundsGEP2(E->b, elem, base, &index, 1, "");
    return LLVMBuildLoad2(E->b, elem, p, "");
}

static LLVMValueRef emit_expr(emitter_t *E, const kir_expr_t *e)
{
    if (E->fail)
        return NULL;
    LLVMBuilderRef B = E->b;
    switch (e->op) {
    case KIR_OP_CONST:
        if (kir_type_is_float(e->type))
            return LLVMConstReal(ltype(E, e->type), e->fval);
        return LLVMConstInt(ltype(E, e->type), (unsigned long long)e->ival, 1);
    case KIR_OP_VAR:
        return LLVMBuildLoad2(B, ltype(E, e->type), E->vars[e->var->index], "");
    case KIR_OP_PARAM:
        return E->params[e->param->index];
    case KIR_OP_GROUP_ID: return E->group;
    case KIR_OP_LANE_ID: return E->lane;
    case KIR_OP_NUM_GROUPS: return E->num_groups;
    case KIR_OP_LOAD: {
        /* buf[a + b] as (buf + a) + b: a pointer recurrence the loop
         * vectorizer recognizes as consecutive even where instcombine
         * would turn the integer a + b into an `or` it cannot analyze
         * (a row base whose low bits are known zero). Neither step is
         * inbounds: only the sum is known to be in bounds. */
        const kir_expr_t *ix = e->a;
        if (ix->op == KIR_OP_ADD) {
            LLVMValueRef a = emit_expr(E, ix->a), b = emit_expr(E, ix->b);
            if (!a || !b)
                return NULL;
            LLVMTypeRef t = ltype(E, e->type);
            LLVMValueRef p = LLVMBuildGEP2(B, t, E->params[e->param->index],
                                           &a, 1, "");
            return in_group(E, LLVMBuildLoad2(B, t,
                                              LLVMBuildGEP2(B, t, p, &b, 1, ""),
                                              ""));
        }
        LLVMValueRef i = emit_expr(E, ix);
        return i ? in_group(E, gep_load(E, ltype(E, e->type),
                                        E->params[e->param->index], i))
                 : NULL;
    }
    case KIR_OP_TLOAD: {
        LLVMValueRef s = emit_expr(E, e->a), i = emit_expr(E, e->b);
        if (!s || !i)
            return NULL;
        LLVMValueRef base = in_group(E, gep_load(E, E->ptr,
                                                 E->params[e->param->index], s));
        return in_group(E, gep_load(E, ltype(E, e->type), base, i));
    }
    case KIR_OP_CTLOAD: {
        LLVMValueRef i = emit_expr(E, e->a);
        if (!i)
            return NULL;
        LLVMTypeRef at = LLVMArrayType2(ltype(E, e->type),
                                        (uint64_t)e->ctable->count);
        LLVMValueRef idx[2] = {LLVMConstInt(LLVMInt64TypeInContext(E->c), 0, 0), i};
        LLVMValueRef p = LLVMBuildInBoundsGEP2(B, at, E->ctables[e->ctable->index],
                                               idx, 2, "");
        return LLVMBuildLoad2(B, ltype(E, e->type), p, "");
    }
    case KIR_OP_SHARED_LOAD:
        return efail(E, "workgroup-shared memory is not supported by the CPU "
                        "emitter yet");
    case KIR_OP_NEG: {
        LLVMValueRef a = emit_expr(E, e->a);
        return a ? LLVMBuildNeg(B, a, "") : NULL;
    }
    case KIR_OP_NOT: {
        LLVMValueRef a = emit_expr(E, e->a);
        return a ? LLVMBuildNot(B, a, "") : NULL;
    }
    case KIR_OP_SELECT: {
        LLVMValueRef c = emit_expr(E, e->a), a = emit_expr(E, e->b),
                     b = emit_expr(E, e->c);
        return c && a && b ? LLVMBuildSelect(B, c, a, b, "") : NULL;
    }
    case KIR_OP_FEXP:
    case KIR_OP_FTANH:
    case KIR_OP_FERF: {
        LLVMValueRef a = emit_expr(E, e->a);
        return a ? emit_math(E, e, a) : NULL;
    }
    case KIR_OP_SITOF: {
        LLVMValueRef v = lut_call(E, e);
        if (v || E->fail)
            return v;
        break;
    }
    default:
        break;
    }
    if (kir_op_arity(e->op) == 1) {
        LLVMValueRef a = emit_expr(E, e->a);
        return a ? emit_convert(E, e, a) : NULL;
    }
    LLVMValueRef a = emit_expr(E, e->a), b = emit_expr(E, e->b);
    return a && b ? emit_binary(E, e, a, b) : NULL;
}

static void emit_block(emitter_t *E, const kir_block_t *blk);

/* After a terminator, later statements go to a fresh (unreachable) block. */
static void fresh_block(emitter_t *E)
{
    LLVMBasicBlockRef bb = LLVMAppendBasicBlockInContext(E->c, E->fn, "dead");
    LLVMPositionBuilderAtEnd(E->b, bb);
}

static bool terminated(emitter_t *E)
{
    return LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(E->b)) != NULL;
}

static void emit_stmt(emitter_t *E, const kir_stmt_t *s)
{
    LLVMBuilderRef B = E->b;
    switch (s->kind) {
    case KIR_S_LET:
    case KIR_S_ASSIGN: {
        LLVMValueRef v = emit_expr(E, s->a);
        if (v)
            LLVMBuildStore(B, v, E->vars[s->var->index]);
        return;
    }
    case KIR_S_STORE: {
        LLVMValueRef v = emit_expr(E, s->b);
        LLVMTypeRef t = ltype(E, s->param->type);
        LLVMValueRef p = E->params[s->param->index];
        if (s->a->op == KIR_OP_ADD) {
            /* buf[a + b] as (buf + a) + b, as for loads (KIR_OP_LOAD):
             * the repack builder stores to group's part + lane's part */
            LLVMValueRef a = emit_expr(E, s->a->a), b = emit_expr(E, s->a->b);
            if (!a || !b || !v)
                return;
            p = LLVMBuildGEP2(B, t, LLVMBuildGEP2(B, t, p, &a, 1, ""), &b, 1, "");
        } else {
            LLVMValueRef i = emit_expr(E, s->a);
            if (!i || !v)
                return;
            p = LLVMBuildInBoundsGEP2(B, t, p, &i, 1, "");
        }
        in_group(E, LLVMBuildStore(B, v, p));
        return;
    }
    case KIR_S_SHARED_STORE:
        efail(E, "workgroup-shared memory is not supported by the CPU emitter "
                 "yet");
        return;
    case KIR_S_BARRIER:
        efail(E, "barriers are not supported by the CPU emitter yet");
        return;
    case KIR_S_RETURN:
        LLVMBuildRetVoid(B);
        fresh_block(E);
        return;
    case KIR_S_IF: {
        LLVMValueRef c = emit_expr(E, s->a);
        if (!c)
            return;
        LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(E->c, E->fn, "then");
        LLVMBasicBlockRef els = LLVMAppendBasicBlockInContext(E->c, E->fn, "else");
        LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(E->c, E->fn, "join");
        LLVMBuildCondBr(B, c, then, els);
        LLVMPositionBuilderAtEnd(B, then);
        emit_block(E, &s->body);
        if (!terminated(E))
            LLVMBuildBr(B, join);
        LLVMPositionBuilderAtEnd(B, els);
        emit_block(E, &s->else_body);
        if (!terminated(E))
            LLVMBuildBr(B, join);
        LLVMPositionBuilderAtEnd(B, join);
        return;
    }
    case KIR_S_FOR: {
        LLVMValueRef lo = emit_expr(E, s->a);
        if (!lo)
            return;
        LLVMValueRef slot = E->vars[s->var->index];
        LLVMBuildStore(B, lo, slot);
        LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(E->c, E->fn, "for");
        LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(E->c, E->fn, "body");
        LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(E->c, E->fn, "done");
        LLVMBuildBr(B, head);
        LLVMPositionBuilderAtEnd(B, head);
        LLVMTypeRef t = ltype(E, s->var->type);
        LLVMValueRef i = LLVMBuildLoad2(B, t, slot, "");
        LLVMValueRef hi = emit_expr(E, s->b);
        if (!hi)
            return;
        LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSLT, i, hi, ""), body, done);
        LLVMPositionBuilderAtEnd(B, body);
        emit_block(E, &s->body);
        if (!terminated(E)) {
            LLVMValueRef cur = LLVMBuildLoad2(B, t, slot, "");
            LLVMBuildStore(B, LLVMBuildAdd(B, cur, LLVMConstInt(t,
                           (unsigned long long)s->step, 0), ""), slot);
            LLVMBuildBr(B, head);
        }
        LLVMPositionBuilderAtEnd(B, done);
        return;
    }
    }
}

static void emit_block(emitter_t *E, const kir_block_t *blk)
{
    for (int i = 0; i < blk->count && !E->fail; i++)
        emit_stmt(E, blk->items[i]);
}

static void add_attr(emitter_t *E, LLVMValueRef fn, const char *name)
{
    unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
    LLVMAddAttributeAtIndex(fn, (unsigned)LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(E->c, kind, 0));
}

/* The lane function: (args, group, lane, num_groups, buffers...), inlined
 * into the loop over lanes. The buffers are `noalias` arguments of the
 * function holding the loops (emit_loops), not of this one: on an inlined
 * callee they would become scope declarations inside the loop, which are
 * memory operations outside the lanes' access group and would cancel the
 * loop's parallel annotation. */
static LLVMTypeRef lane_fn_type(emitter_t *E)
{
    LLVMContextRef c = E->c;
    LLVMTypeRef i64 = LLVMInt64TypeInContext(c), i32 = LLVMInt32TypeInContext(c);
    LLVMTypeRef ps[4 + 64] = {E->ptr, i64, i32, i64};
    for (int i = 0; i < E->k->n_params && i < 64; i++)
        ps[4 + i] = E->ptr;
    return LLVMFunctionType(LLVMVoidTypeInContext(c), ps,
                            (unsigned)(4 + E->k->n_params), 0);
}

static LLVMValueRef emit_lane_fn(emitter_t *E, const char *symbol)
{
    LLVMContextRef c = E->c;
    LLVMTypeRef i64 = LLVMInt64TypeInContext(c);
    char name[300];
    snprintf(name, sizeof name, "%s.lane", symbol);
    LLVMValueRef fn = LLVMAddFunction(E->m, name, lane_fn_type(E));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    add_attr(E, fn, "alwaysinline");
    add_attr(E, fn, "nounwind");
    E->fn = fn;
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c, fn, "entry");
    LLVMPositionBuilderAtEnd(E->b, entry);
    const kir_kernel_t *k = E->k;
    E->group = LLVMGetParam(fn, 1);
    E->lane = LLVMGetParam(fn, 2);
    E->num_groups = LLVMGetParam(fn, 3);
    for (int i = 0; i < k->n_vars; i++)
        E->vars[i] = LLVMBuildAlloca(E->b, ltype(E, k->vars[i]->type),
                                     k->vars[i]->name);
    for (int i = 0; i < k->n_params; i++) {
        const kir_param_t *p = k->params[i];
        if (p->kind != KIR_PARAM_SCALAR) {
            E->params[i] = LLVMGetParam(fn, (unsigned)(4 + i));
            continue;
        }
        LLVMValueRef idx = LLVMConstInt(i64, (unsigned long long)i, 0);
        LLVMValueRef raw = gep_load(E, i64, LLVMGetParam(fn, 0), idx);
        if (kir_type_is_float(p->type)) {
            LLVMTypeRef it = LLVMIntTypeInContext(c, (unsigned)kir_type_bits(p->type));
            E->params[i] = LLVMBuildBitCast(E->b, LLVMBuildTrunc(E->b, raw, it, ""),
                                            ltype(E, p->type), p->name);
        } else {
            E->params[i] = p->type == KIR_I64
                               ? raw
                               : LLVMBuildTrunc(E->b, raw, ltype(E, p->type), p->name);
        }
    }
    emit_block(E, &k->body);
    if (!terminated(E))
        LLVMBuildRetVoid(E->b);
    return fn;
}

/* Lanes per vector the lane loop is vectorized with: 16 x 32 bits, one
 * AVX-512 register (two AVX2 ones). */
enum { VECTOR_LANES = 16 };

/* Loop metadata asking for vectorization of the lane loop at
 * VECTOR_LANES. The lanes of a workgroup are independent by the IR's
 * launch model and the buffers do not alias, so it is always legal (the
 * vectorizer still checks); LLVM's cost model alone refuses most repack
 * kernels because it prices their gathers as scalar loads, while the
 * vectorized loops measure 1.2x to 6x faster (on a Zen 4 host).
 *
 * A lane loop of at most UNROLL_ANALYZED_LANES iterations (the word
 * blocks' 8 lanes) is also kept from unrolling until it is vectorized:
 * LLVM's full unroller otherwise simulates such a loop iteration by
 * iteration before it gives up, a third of the O3 time of the CPU
 * layout's repack kernel (about 30 of 107 ms; its cold compile 172 ->
 * 141 ms with this alone). The vectorized loop gets
 * plain metadata back (followup_vectorized: what the vectorizer would
 * have set). Longer lane loops keep LLVM's defaults (a copy that is not
 * vectorized, e.g. after unswitching, is still unrolled). */
enum { UNROLL_ANALYZED_LANES = 10 }; /* LLVM's unroll-max-iteration-count-to-analyze */

static LLVMValueRef vectorize_hint(emitter_t *E)
{
    LLVMContextRef c = E->c;
    LLVMTypeRef i1 = LLVMInt1TypeInContext(c), i32 = LLVMInt32TypeInContext(c);
    /* a workgroup of fewer lanes (word blocks, build_repack_lanes.c) is one
     * vector of its own size: one iteration, no remainder */
    unsigned width_lanes = E->k->lanes < VECTOR_LANES ? (unsigned)E->k->lanes
                                                      : VECTOR_LANES;
    static const char enable[] = "llvm.loop.vectorize.enable";
    static const char width[] = "llvm.loop.vectorize.width";
    LLVMMetadataRef on[2] = {LLVMMDStringInContext2(c, enable, sizeof enable - 1),
                             LLVMValueAsMetadata(LLVMConstInt(i1, 1, 0))};
    LLVMMetadataRef w[2] = {LLVMMDStringInContext2(c, width, sizeof width - 1),
                            LLVMValueAsMetadata(LLVMConstInt(i32, width_lanes, 0))};
    static const char par[] = "llvm.loop.parallel_accesses";
    LLVMMetadataRef pa[2] = {LLVMMDStringInContext2(c, par, sizeof par - 1),
                             E->access_group};
    static const char nou[] = "llvm.loop.unroll.disable";
    static const char isv[] = "llvm.loop.isvectorized";
    static const char fol[] = "llvm.loop.vectorize.followup_vectorized";
    LLVMMetadataRef no_unroll = LLVMMDStringInContext2(c, nou, sizeof nou - 1);
    LLVMMetadataRef done[2] = {LLVMMDStringInContext2(c, isv, sizeof isv - 1),
                               LLVMValueAsMetadata(LLVMConstInt(i32, 1, 0))};
    LLVMMetadataRef pa_node = E->access_group ? LLVMMDNodeInContext2(c, pa, 2) : NULL;
    LLVMMetadataRef after[3] = {LLVMMDStringInContext2(c, fol, sizeof fol - 1),
                                LLVMMDNodeInContext2(c, done, 2), pa_node};
    /* a loop id refers to itself: build it around a placeholder */
    LLVMMetadataRef self = LLVMTemporaryMDNode(c, NULL, 0);
    LLVMMetadataRef ops[6] = {self, LLVMMDNodeInContext2(c, on, 2),
                              LLVMMDNodeInContext2(c, w, 2)};
    unsigned n = 3;
    if (pa_node)
        ops[n++] = pa_node;
    if (E->k->lanes <= UNROLL_ANALYZED_LANES) {
        ops[n++] = LLVMMDNodeInContext2(c, &no_unroll, 1);
        ops[n++] = LLVMMDNodeInContext2(c, after, pa_node ? 3 : 2);
    }
    LLVMMetadataRef id = LLVMMDNodeInContext2(c, ops, n);
    LLVMMetadataReplaceAllUsesWith(self, id);
    return LLVMMetadataAsValue(c, id);
}

/* Whether a lane body has neither loops nor early returns: the loop
 * vectorizer takes only such bodies (innermost loops with one exit). */
static bool straight_line(const kir_block_t *b)
{
    for (int i = 0; i < b->count; i++) {
        const kir_stmt_t *s = b->items[i];
        if (s->kind == KIR_S_FOR || s->kind == KIR_S_RETURN ||
            !straight_line(&s->body) || !straight_line(&s->else_body))
            return false;
    }
    return true;
}

/* The loops, in a function of their own whose buffers are `noalias`
 * arguments (not inlined into the entry point: there they would become
 * loads from args, and the loop vectorizer cannot bound accesses through
 * pointers loaded in the loop, such as a source table's entries, unless
 * it knows they cannot reach the destination):
 *
 *   for g in [g0, g1): for lane in [0, lanes): lane_fn(args, g, lane, ng) */
static LLVMValueRef emit_loops(emitter_t *E, const char *symbol,
                               LLVMValueRef lane_fn)
{
    LLVMContextRef c = E->c;
    LLVMBuilderRef B = E->b;
    LLVMTypeRef i64 = LLVMInt64TypeInContext(c), i32 = LLVMInt32TypeInContext(c);
    int np = E->k->n_params;
    LLVMTypeRef ps[4 + 64] = {E->ptr, i64, i64, i64};
    for (int i = 0; i < np; i++)
        ps[4 + i] = E->ptr;
    LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(c), ps,
                                      (unsigned)(4 + np), 0);
    char name[300];
    snprintf(name, sizeof name, "%s.groups", symbol);
    LLVMValueRef fn = LLVMAddFunction(E->m, name, ft);
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    add_attr(E, fn, "nounwind");
    add_attr(E, fn, "noinline");
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    for (int i = 0; i < np; i++)
        if (E->k->params[i]->kind != KIR_PARAM_SCALAR)
            LLVMAddAttributeAtIndex(fn, (unsigned)(5 + i),
                                    LLVMCreateEnumAttribute(c, noalias, 0));
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c, fn, "entry");
    LLVMBasicBlockRef ghead = LLVMAppendBasicBlockInContext(c, fn, "groups");
    LLVMBasicBlockRef lhead = LLVMAppendBasicBlockInContext(c, fn, "lanes");
    LLVMBasicBlockRef gnext = LLVMAppendBasicBlockInContext(c, fn, "next_group");
    LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(c, fn, "exit");
    LLVMPositionBuilderAtEnd(B, entry);
    LLVMValueRef g0 = LLVMGetParam(fn, 1), g1 = LLVMGetParam(fn, 2);
    LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSLT, g0, g1, ""), ghead, exit);
    /* group loop */
    LLVMPositionBuilderAtEnd(B, ghead);
    LLVMValueRef g = LLVMBuildPhi(B, i64, "g");
    LLVMBuildBr(B, lhead);
    /* lane loop */
    LLVMPositionBuilderAtEnd(B, lhead);
    LLVMValueRef lane = LLVMBuildPhi(B, i32, "lane");
    LLVMValueRef args[4 + 64] = {LLVMGetParam(fn, 0), g, lane, LLVMGetParam(fn, 3)};
    for (int i = 0; i < np; i++)
        args[4 + i] = LLVMGetParam(fn, (unsigned)(4 + i));
    LLVMBuildCall2(B, lane_fn_type(E), lane_fn, args, (unsigned)(4 + np), "");
    LLVMValueRef lane1 = LLVMBuildAdd(B, lane, LLVMConstInt(i32, 1, 0), "");
    LLVMValueRef more = LLVMBuildICmp(B, LLVMIntSLT, lane1,
                                      LLVMConstInt(i32, (unsigned)E->k->lanes, 0), "");
    LLVMValueRef back = LLVMBuildCondBr(B, more, lhead, gnext);
    if (straight_line(&E->k->body)) {
        static const char loop[] = "llvm.loop";
        LLVMSetMetadata(back, LLVMGetMDKindIDInContext(c, loop, sizeof loop - 1),
                        vectorize_hint(E));
    }
    LLVMValueRef zero32 = LLVMConstInt(i32, 0, 0);
    LLVMBasicBlockRef lfrom[2] = {ghead, lhead};
    LLVMValueRef lvals[2] = {zero32, lane1};
    LLVMAddIncoming(lane, lvals, lfrom, 2);
    LLVMPositionBuilderAtEnd(B, gnext);
    LLVMValueRef g1n = LLVMBuildAdd(B, g, LLVMConstInt(i64, 1, 0), "");
    LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSLT, g1n, g1, ""), ghead, exit);
    LLVMBasicBlockRef gfrom[2] = {entry, gnext};
    LLVMValueRef gvals[2] = {g0, g1n};
    LLVMAddIncoming(g, gvals, gfrom, 2);
    LLVMPositionBuilderAtEnd(B, exit);
    LLVMBuildRetVoid(B);
    return fn;
}

/* The entry point: reads the buffers from args and runs the loops. */
static void emit_entry(emitter_t *E, const char *symbol, LLVMValueRef loops)
{
    LLVMContextRef c = E->c;
    LLVMBuilderRef B = E->b;
    LLVMTypeRef i64 = LLVMInt64TypeInContext(c);
    LLVMTypeRef ps[4] = {E->ptr, i64, i64, i64};
    LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(c), ps, 4, 0);
    LLVMValueRef fn = LLVMAddFunction(E->m, symbol, ft);
    add_attr(E, fn, "nounwind");
    LLVMPositionBuilderAtEnd(B, LLVMAppendBasicBlockInContext(c, fn, "entry"));
    int np = E->k->n_params;
    LLVMValueRef args[4 + 64];
    for (int i = 0; i < 4; i++)
        args[i] = LLVMGetParam(fn, (unsigned)i);
    for (int i = 0; i < np; i++) {
        LLVMValueRef idx = LLVMConstInt(i64, (unsigned long long)i, 0);
        LLVMValueRef raw = gep_load(E, i64, LLVMGetParam(fn, 0), idx);
        args[4 + i] = LLVMBuildIntToPtr(B, raw, E->ptr, "");
    }
    LLVMBuildCall2(B, LLVMGlobalGetValueType(loops), loops, args,
                   (unsigned)(4 + np), "");
    LLVMBuildRetVoid(B);
}

wna16_status_t w16_emit_llvm(const kir_kernel_t *k, LLVMModuleRef m,
                             const char *symbol, wna16_error_t *err)
{
    return w16_emit_llvm_for(k, m, symbol, NULL, err);
}

wna16_status_t w16_emit_llvm_for(const kir_kernel_t *k, LLVMModuleRef m,
                                 const char *symbol, const char *features,
                                 wna16_error_t *err)
{
    if (k->n_params > 64)
        return w16_err(err, WNA16_EUNSUPPORTED, "kernel %s: more than 64 "
                       "parameters", k->name);
    if (k->native)
        return k->native->emit_llvm(k->native->data, m, symbol, features,
                                    err);
    emitter_t E = {.k = k, .m = m, .c = LLVMGetModuleContext(m)};
    E.b = LLVMCreateBuilderInContext(E.c);
    E.ptr = LLVMPointerTypeInContext(E.c, 0);
    E.vars = calloc((size_t)k->n_vars + 1, sizeof *E.vars);
    E.params = calloc((size_t)k->n_params + 1, sizeof *E.params);
    E.ctables = calloc((size_t)k->n_ctables + 1, sizeof *E.ctables);
    if (!E.vars || !E.params || !E.ctables) {
        E.fail = "out of memory";
    } else {
        LLVMTypeRef i64 = LLVMInt64TypeInContext(E.c);
        for (int i = 0; i < k->n_ctables; i++) {
            const kir_ctable_t *t = k->ctables[i];
            LLVMTypeRef et = ltype(&E, t->type);
            LLVMValueRef *vals = calloc((size_t)t->count, sizeof *vals);
            if (!vals) {
                E.fail = "out of memory";
                break;
            }
            for (int j = 0; j < t->count; j++)
                vals[j] = LLVMConstInt(et, (unsigned long long)t->values[j], 1);
            char name[300];
            snprintf(name, sizeof name, "%s.%s", symbol, t->name);
            LLVMValueRef g = LLVMAddGlobal(m, LLVMArrayType2(et, (uint64_t)t->count),
                                           name);
            LLVMSetInitializer(g, LLVMConstArray2(et, vals, (uint64_t)t->count));
            LLVMSetGlobalConstant(g, 1);
            LLVMSetLinkage(g, LLVMPrivateLinkage);
            LLVMSetUnnamedAddress(g, LLVMGlobalUnnamedAddr);
            E.ctables[i] = g;
            free(vals);
        }
        (void)i64;
        if (!E.fail) {
            E.lut = has_avx512(m, features);
            E.access_group = new_access_group(E.c);
            LLVMValueRef lane = emit_lane_fn(&E, symbol);
            if (!E.fail)
                emit_entry(&E, symbol, emit_loops(&E, symbol, lane));
        }
    }
    LLVMDisposeBuilder(E.b);
    free(E.vars);
    free(E.params);
    free(E.ctables);
    if (E.fail)
        return w16_err(err, WNA16_EUNSUPPORTED, "kernel %s: %s", k->name, E.fail);
    char *msg = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &msg)) {
        wna16_status_t st = w16_err(err, WNA16_EINTERNAL, "kernel %s: LLVM "
                                    "rejects the generated IR: %s", k->name,
                                    msg ? msg : "");
        LLVMDisposeMessage(msg);
        return st;
    }
    LLVMDisposeMessage(msg);
    return WNA16_OK;
}

wna16_status_t w16_emit_llvm_text(const kir_kernel_t *k, w16_buf_t *out,
                                  wna16_error_t *err)
{
    LLVMContextRef c = LLVMContextCreate();
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(k->name, c);
    wna16_status_t st = w16_emit_llvm(k, m, k->name, err);
    if (st == WNA16_OK) {
        char *text = LLVMPrintModuleToString(m);
        w16_buf_puts(out, text);
        LLVMDisposeMessage(text);
    }
    LLVMDisposeModule(m);
    LLVMContextDispose(c);
    return st;
}

#else /* no LLVM */

wna16_status_t w16_emit_llvm_text(const kir_kernel_t *k, w16_buf_t *out,
                                  wna16_error_t *err)
{
    (void)out;
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: this build has no "
                   "LLVM 19 (install llvm-19-dev and reconfigure)", k->name);
}

#endif
