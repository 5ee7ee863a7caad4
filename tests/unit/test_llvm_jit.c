/*
 * test_llvm_jit.c - the CPU target's toolchain works here: build a small
 * function with the LLVM 19 C API, optimize it with the new pass manager at
 * O3, JIT it with ORC LLJIT for the host and call it. Skips (77) when the
 * build found no LLVM 19.
 */
#include "testutil.h"

#ifndef WNA16_HAVE_LLVM
int main(void) { tu_skip("LLVM 19 was not found at configure time (install llvm-19-dev)"); }
#else
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <stdlib.h>

/* sum(int32* a, n) = a[0] + ... + a[n-1] */
static LLVMModuleRef build(LLVMContextRef c)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("t", c);
    LLVMTypeRef i32 = LLVMInt32TypeInContext(c), i64 = LLVMInt64TypeInContext(c);
    LLVMTypeRef ptr = LLVMPointerTypeInContext(c, 0);
    LLVMTypeRef params[2] = {ptr, i64};
    LLVMValueRef f = LLVMAddFunction(m, "sum", LLVMFunctionType(i32, params, 2, 0));
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c, f, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(c, f, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, f, "done");
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef empty = LLVMBuildICmp(b, LLVMIntEQ, LLVMGetParam(f, 1),
                                       LLVMConstInt(i64, 0, 0), "empty");
    LLVMBuildCondBr(b, empty, done, loop);
    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef i = LLVMBuildPhi(b, i64, "i"), acc = LLVMBuildPhi(b, i32, "acc");
    LLVMValueRef p = LLVMBuildGEP2(b, i32, LLVMGetParam(f, 0), &i, 1, "p");
    LLVMValueRef acc2 = LLVMBuildAdd(b, acc, LLVMBuildLoad2(b, i32, p, "x"), "acc2");
    LLVMValueRef i2 = LLVMBuildAdd(b, i, LLVMConstInt(i64, 1, 0), "i2");
    LLVMValueRef more = LLVMBuildICmp(b, LLVMIntULT, i2, LLVMGetParam(f, 1), "more");
    LLVMBuildCondBr(b, more, loop, done);
    LLVMValueRef zero64 = LLVMConstInt(i64, 0, 0), zero32 = LLVMConstInt(i32, 0, 0);
    LLVMBasicBlockRef from_entry[1] = {entry}, from_loop[1] = {loop};
    LLVMAddIncoming(i, &zero64, from_entry, 1);
    LLVMAddIncoming(i, &i2, from_loop, 1);
    LLVMAddIncoming(acc, &zero32, from_entry, 1);
    LLVMAddIncoming(acc, &acc2, from_loop, 1);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMValueRef r = LLVMBuildPhi(b, i32, "r");
    LLVMAddIncoming(r, &zero32, from_entry, 1);
    LLVMAddIncoming(r, &acc2, from_loop, 1);
    LLVMBuildRet(b, r);
    LLVMDisposeBuilder(b);
    return m;
}

int main(void)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMContextRef c = LLVMOrcThreadSafeContextGetContext(tsc);
    LLVMModuleRef m = build(c);
    char *msg = NULL;
    TU_CHECK(!LLVMVerifyModule(m, LLVMReturnStatusAction, &msg));
    LLVMDisposeMessage(msg);

    char *triple = LLVMGetDefaultTargetTriple();
    LLVMTargetRef target;
    TU_CHECK(!LLVMGetTargetFromTriple(triple, &target, &msg));
    char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
    LLVMTargetMachineRef tm = LLVMCreateTargetMachine(
        target, triple, cpu, features, LLVMCodeGenLevelAggressive,
        LLVMRelocDefault, LLVMCodeModelJITDefault);
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
    LLVMErrorRef e = LLVMRunPasses(m, "default<O3>", tm, po);
    TU_CHECK(e == NULL);
    if (e)
        LLVMConsumeError(e);
    LLVMDisposePassBuilderOptions(po);
    LLVMDisposeTargetMachine(tm);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(features);

    LLVMOrcLLJITRef jit;
    TU_CHECK((e = LLVMOrcCreateLLJIT(&jit, NULL)) == NULL);
    if (e) {
        LLVMConsumeError(e);
        return tu_finish("test_llvm_jit");
    }
    LLVMSetDataLayout(m, LLVMOrcLLJITGetDataLayoutStr(jit));
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m, tsc);
    TU_CHECK(LLVMOrcLLJITAddLLVMIRModule(jit, LLVMOrcLLJITGetMainJITDylib(jit),
                                         tsm) == NULL);
    LLVMOrcExecutorAddress addr = 0;
    TU_CHECK(LLVMOrcLLJITLookup(jit, &addr, "sum") == NULL && addr);
    if (addr) {
        int32_t (*sum)(const int32_t *, int64_t) =
            (int32_t (*)(const int32_t *, int64_t))(uintptr_t)addr;
        int32_t v[1000];
        int64_t want = 0;
        for (int k = 0; k < 1000; k++) {
            v[k] = k * 3 - 7;
            want += v[k];
        }
        TU_CHECK(sum(v, 1000) == (int32_t)want);
        TU_CHECK(sum(v, 0) == 0);
    }
    LLVMOrcDisposeLLJIT(jit);
    LLVMOrcDisposeThreadSafeContext(tsc);
    LLVMShutdown();
    return tu_finish("test_llvm_jit");
}
#endif
