/*
 * test_moe_vectorize.c - the fused-MoE GEMM kernels' K loops vectorize:
 * each gemm1/gemm2 kernel (N-first triton layout, 4 and 8 bits, grouped
 * and channelwise, 1 and 4 slots per block) is lowered to LLVM IR and
 * optimized as the CPU target does (O3, loop and SLP vectorization) for a
 * pinned CPU, znver4 (AVX-512; LLVM's generic x86-64-v4 prefers 256-bit
 * vectors), and the result must hold 16-wide float
 * multiply-adds on the accumulators and no gathers: the weights, scales
 * and inputs are all read with consecutive or uniform loads. A structural
 * check of the generated code (timings belong to bench/bench_moe); skips
 * (77) without LLVM.
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
    static const int cases[][3] = {{4, 128, 1}, {4, 128, 4}, {8, -1, 1},
                                   {8, 64, 4}};
    for (size_t i = 0; i < W16_ARRAY_LEN(cases); i++) {
        w16_moe_request_t req = {
            .backend = triton,
            .problem = {.E = 8, .H = 2048, .I = 768, .BITS = cases[i][0],
                        .GS = cases[i][1]},
            .topk = 8, .block_m = cases[i][2]};
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
