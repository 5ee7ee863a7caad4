/*
 * test_moe_vectorize.c - the fused-MoE GEMM kernels' K loops vectorize:
 * each gemm1/gemm2 kernel (N-first triton layout, 4 and 8 bits, grouped
 * and channelwise, 1 and 4 slots per block) is lowered to LLVM IR and
 * optimized as the CPU target does (W16_LLVM_PASSES) for a
 * pinned CPU, znver4 (AVX-512; LLVM's generic x86-64-v4 prefers 256-bit
 * vectors), and the result must hold 16-wide float
 * multiply-adds on the accumulators and no gathers: the weights, scales
 * and inputs are all read with consecutive or uniform loads. Kernels that
 * read their codes as 32-bit words (qweight_align 4) must load 16 words
 * at a time without widening bytes, and on an AVX-512 host convert 4-bit
 * codes by inlined table lookups (vpermps). A structural check of the
 * generated code (timings belong to bench/bench_moe); skips (77) without
 * LLVM.
 */
#include "testutil.h"
#include "gen/build_moe.h"
#include "gen/emit_llvm.h"

#include <string.h>

#ifdef WNA16_HAVE_LLVM
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

static LLVMTargetMachineRef tm;
static bool host_avx512; /* the emitter's table lookups need it */

/* The optimized IR of one kernel (caller frees with LLVMDisposeMessage). */
static char *optimized(const kir_kernel_t *k)
{
    LLVMContextRef c = LLVMContextCreate();
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(k->name, c);
    LLVMSetTarget(m, "x86_64-unknown-linux-gnu");
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
    char *layout = LLVMCopyStringRepOfTargetData(td);
    LLVMSetDataLayout(m, layout);
    LLVMDisposeMessage(layout);
    LLVMDisposeTargetData(td);
    wna16_error_t err;
    char *text = NULL;
    TU_OK(w16_emit_llvm(k, m, k->name, &err), &err);
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
    LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
    LLVMErrorRef e = LLVMRunPasses(m, W16_LLVM_PASSES, tm, po);
    LLVMDisposePassBuilderOptions(po);
    TU_CHECK(e == NULL);
    if (e)
        LLVMConsumeError(e);
    else
        text = LLVMPrintModuleToString(m);
    LLVMDisposeModule(m);
    LLVMContextDispose(c);
    return text;
}

static void check(wna16_context_t *ctx, const w16_moe_request_t *req,
                  w16_moe_stage_t stage)
{
    wna16_error_t err;
    w16_moe_kernel_t mk;
    TU_OK(w16_build_moe(ctx, req, stage, &mk, &err), &err);
    if (!mk.kernel)
        return;
    char *ir = optimized(mk.kernel);
    if (ir) {
        TU_CHECK_MSG(strstr(ir, "fmul reassoc contract <16 x float>") ||
                     strstr(ir, "call reassoc contract <16 x float> @llvm.fma"),
                     "%s: no 16-wide float products", mk.kernel->name);
        TU_CHECK_MSG(strstr(ir, "fadd reassoc contract <16 x float>") ||
                     strstr(ir, "call reassoc contract <16 x float> @llvm.fma"),
                     "%s: no 16-wide float accumulation", mk.kernel->name);
        TU_CHECK_MSG(!strstr(ir, "masked.gather"), "%s: gathers in the "
                     "vectorized loop", mk.kernel->name);
        if (req->qweight_align >= 4) {
            /* whole words of codes, no byte widening */
            TU_CHECK_MSG(strstr(ir, "load <16 x i32>") &&
                         !strstr(ir, "zext <16 x i8>"), "%s: codes not read "
                         "as 16 words", mk.kernel->name);
            /* 4-bit codes to float by vpermps, inlined */
            if (host_avx512 && req->problem.BITS == 4)
                TU_CHECK_MSG(strstr(ir, "@llvm.x86.avx512.permvar.sf.512(<16 x float>") &&
                             !strstr(ir, "call <16 x float> @w16.lut4"),
                             "%s: no table lookups in the loop", mk.kernel->name);
        }
        LLVMDisposeMessage(ir);
    }
    w16_moe_kernel_free(&mk);
}

int main(void)
{
    LLVMInitializeX86TargetInfo();
    LLVMInitializeX86Target();
    LLVMInitializeX86TargetMC();
    LLVMTargetRef target;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple("x86_64-unknown-linux-gnu", &target, &msg)) {
        LLVMDisposeMessage(msg);
        tu_skip("this LLVM has no x86 target");
    }
    tm = LLVMCreateTargetMachine(target, "x86_64-unknown-linux-gnu",
                                 "znver4", "", LLVMCodeGenLevelAggressive,
                                 LLVMRelocPIC, LLVMCodeModelDefault);
    wna16_context_t *ctx = tu_context();
    const wna16_spec_t *triton = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                 "triton");
    char *features = LLVMGetHostCPUFeatures();
    host_avx512 = features && strstr(features, "+avx512f");
    LLVMDisposeMessage(features);
    /* bits, group size, BM, qweight alignment (4: codes read as words) */
    static const int cases[][4] = {{4, 128, 1, 0}, {4, 128, 4, 0}, {8, -1, 1, 0},
                                   {8, 64, 4, 0},  {4, 128, 1, 4}, {4, 32, 4, 4},
                                   {8, -1, 1, 4},  {8, 64, 2, 4}};
    for (size_t i = 0; i < W16_ARRAY_LEN(cases); i++) {
        w16_moe_request_t req = {
            .backend = triton,
            .problem = {.E = 8, .H = 2048, .I = 768, .BITS = cases[i][0],
                        .GS = cases[i][1]},
            .topk = 8, .block_m = cases[i][2], .qweight_align = cases[i][3]};
        wna16_moe_params_init(&req.params);
        check(ctx, &req, W16_MOE_GEMM1);
        check(ctx, &req, W16_MOE_GEMM2);
    }
    LLVMDisposeTargetMachine(tm);
    wna16_context_destroy(ctx);
    return tu_finish("test_moe_vectorize");
}

#else

int main(void)
{
    tu_skip("needs LLVM 19 (install llvm-19-dev)");
}

#endif
