/*
 * cpu_target.c - the CPU target (see cpu.h): LLVM 19 through its C API.
 *
 *   kernel IR --emit_llvm--> module --O3 (host CPU and features)-->
 *   object file in memory --ORC LLJIT--> entry point --pool--> threads
 *
 * Going through an object file costs a little over adding the module to
 * the JIT directly, but it is what makes the disk cache possible: the
 * object is the cached artifact, and a cache hit links it without running
 * the optimizer or the code generator.
 */
#define _GNU_SOURCE
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/pool.h"
#include "gen/emit_llvm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

struct w16_cpu {
    wna16_context_t *ctx;
    LLVMOrcLLJITRef jit;
    LLVMTargetMachineRef tm;
    char *triple, *cpu_name, *features;
    w16_pool_t *pool;
    pthread_mutex_t mu; /* the JIT and the symbol counter */
    unsigned long symbols;
    w16_cpu_sos_t sos; /* kernels loaded from packs */
};

w16_cpu_sos_t *w16_cpu_sos(w16_cpu_t *cpu) { return &cpu->sos; }

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

static wna16_status_t llvm_err(wna16_error_t *err, LLVMErrorRef e,
                               const char *what)
{
    char *msg = LLVMGetErrorMessage(e);
    wna16_status_t st = w16_err(err, WNA16_EINTERNAL, "%s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
    return st;
}

/* The host's features, plus on x86 a preference for scalar loads over
 * gather instructions: the vectorized lane loops of repack kernels gather
 * their source words, and AVX2/AVX-512 gathers run slower than the loads
 * they replace on the CPUs measured (Zen 4: kernels 1.3x to 5x slower
 * with them; recent Intel parts under the gather data sampling mitigation
 * are known to be alike). A malloc'd string, or NULL. */
static char *host_features(const char *triple)
{
    char *f = LLVMGetHostCPUFeatures();
    const char *extra = strncmp(triple, "x86_64", 6) == 0 ? ",+prefer-no-gather" : "";
    size_t n = f ? strlen(f) : 0;
    char *g = malloc(n + strlen(extra) + 1);
    if (g) {
        memcpy(g, f ? f : "", n);
        strcpy(g + n, extra);
    }
    LLVMDisposeMessage(f);
    return g;
}

static wna16_status_t cpu_create(wna16_context_t *ctx, w16_cpu_t **out,
                                 wna16_error_t *err)
{
    if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter())
        return w16_err(err, WNA16_EUNAVAILABLE, "CPU target unavailable: LLVM "
                       "has no native target for this host");
    w16_cpu_t *c = calloc(1, sizeof *c);
    if (!c)
        return w16_err_nomem(err, "creating the CPU target");
    c->ctx = ctx;
    pthread_mutex_init(&c->mu, NULL);
    w16_cpu_sos_init(&c->sos);
    c->triple = LLVMGetDefaultTargetTriple();
    c->cpu_name = LLVMGetHostCPUName();
    c->features = host_features(c->triple);
    if (!c->features) {
        w16_cpu_destroy(c);
        return w16_err_nomem(err, "creating the CPU target");
    }
    LLVMTargetRef target;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(c->triple, &target, &msg)) {
        wna16_status_t st = w16_err(err, WNA16_EUNAVAILABLE, "CPU target "
                                    "unavailable: %s", msg);
        LLVMDisposeMessage(msg);
        w16_cpu_destroy(c);
        return st;
    }
    c->tm = LLVMCreateTargetMachine(target, c->triple, c->cpu_name, c->features,
                                    LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                    LLVMCodeModelDefault);
    LLVMOrcJITTargetMachineBuilderRef jtmb = NULL;
    LLVMErrorRef e = LLVMOrcJITTargetMachineBuilderDetectHost(&jtmb);
    if (e) {
        w16_cpu_destroy(c);
        return llvm_err(err, e, "CPU target unavailable");
    }
    LLVMOrcLLJITBuilderRef jb = LLVMOrcCreateLLJITBuilder();
    LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(jb, jtmb);
    if ((e = LLVMOrcCreateLLJIT(&c->jit, jb))) {
        c->jit = NULL;
        w16_cpu_destroy(c);
        return llvm_err(err, e, "CPU target unavailable: creating the JIT");
    }
    c->pool = w16_pool_create(ctx->cpu_threads); /* 0: online CPUs */
    if (!c->tm || !c->pool) {
        w16_cpu_destroy(c);
        return w16_err_nomem(err, "creating the CPU target");
    }
    *out = c;
    return WNA16_OK;
}

wna16_status_t w16_cpu_get(wna16_context_t *ctx, w16_cpu_t **out,
                           wna16_error_t *err)
{
    pthread_mutex_lock(&init_mu);
    wna16_status_t st = WNA16_OK;
    w16_cpu_t *c = ctx->targets[WNA16_TARGET_CPU];
    if (!c && (st = cpu_create(ctx, &c, err)) == WNA16_OK)
        ctx->targets[WNA16_TARGET_CPU] = c;
    pthread_mutex_unlock(&init_mu);
    *out = c;
    return st;
}

void w16_cpu_destroy(w16_cpu_t *c)
{
    if (!c)
        return;
    w16_cpu_sos_fini(&c->sos);
    if (c->jit)
        LLVMOrcDisposeLLJIT(c->jit);
    if (c->tm)
        LLVMDisposeTargetMachine(c->tm);
    w16_pool_destroy(c->pool);
    LLVMDisposeMessage(c->triple);
    LLVMDisposeMessage(c->cpu_name);
    free(c->features);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const char *w16_cpu_compiler_version(void)
{
    static char v[32];
    unsigned a, b, c;
    LLVMGetVersion(&a, &b, &c);
    snprintf(v, sizeof v, "LLVM %u.%u.%u", a, b, c);
    return v;
}

const char *w16_cpu_name(const w16_cpu_t *c) { return c->cpu_name; }
const char *w16_cpu_features(const w16_cpu_t *c) { return c->features; }
int w16_cpu_threads(const w16_cpu_t *c) { return w16_pool_threads(c->pool); }

/* LLVM's warnings and remarks (e.g. a vectorization hint it could not
 * follow) are not errors of ours and must not reach stderr; errors come
 * back through the calls' own results. */
static void quiet_diagnostics(LLVMDiagnosticInfoRef di, void *user)
{
    (void)di;
    (void)user;
}

wna16_status_t w16_cpu_compile_object(w16_cpu_t *c, const kir_kernel_t *k,
                                      const char *symbol, void **obj,
                                      size_t *size, wna16_error_t *err)
{
    LLVMContextRef lc = LLVMContextCreate();
    LLVMContextSetDiagnosticHandler(lc, quiet_diagnostics, NULL);
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(k->name, lc);
    LLVMSetTarget(m, c->triple);
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(c->tm);
    char *layout = LLVMCopyStringRepOfTargetData(td);
    LLVMSetDataLayout(m, layout);
    LLVMDisposeMessage(layout);
    LLVMDisposeTargetData(td);
    wna16_status_t st = w16_emit_llvm(k, m, symbol, err);
    LLVMMemoryBufferRef mb = NULL;
    if (st == WNA16_OK) {
        LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
        LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
        LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
        LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
        LLVMErrorRef e = LLVMRunPasses(m, W16_LLVM_PASSES, c->tm, po);
        LLVMDisposePassBuilderOptions(po);
        if (e)
            st = llvm_err(err, e, k->name);
    }
    if (st == WNA16_OK) {
        char *msg = NULL;
        pthread_mutex_lock(&c->mu); /* the target machine is not thread safe */
        LLVMBool bad = LLVMTargetMachineEmitToMemoryBuffer(c->tm, m,
                                                           LLVMObjectFile,
                                                           &msg, &mb);
        pthread_mutex_unlock(&c->mu);
        if (bad) {
            st = w16_err(err, WNA16_EINTERNAL, "kernel %s: code generation "
                         "failed: %s", k->name, msg ? msg : "");
            mb = NULL;
        }
        LLVMDisposeMessage(msg);
    }
    if (st == WNA16_OK) {
        *size = LLVMGetBufferSize(mb);
        *obj = malloc(*size ? *size : 1);
        if (!*obj)
            st = w16_err_nomem(err, "copying an object file");
        else
            memcpy(*obj, LLVMGetBufferStart(mb), *size);
    }
    if (mb)
        LLVMDisposeMemoryBuffer(mb);
    LLVMDisposeModule(m);
    LLVMContextDispose(lc);
    return st;
}

wna16_status_t w16_cpu_load_object(w16_cpu_t *c, const void *obj, size_t size,
                                   const char *symbol, w16_cpu_fn *fn,
                                   wna16_error_t *err)
{
    /* The JIT takes ownership of the buffer: give it a copy. */
    LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(
        obj, size, symbol);
    pthread_mutex_lock(&c->mu);
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(
        c->jit, LLVMOrcLLJITGetMainJITDylib(c->jit), mb);
    LLVMOrcExecutorAddress addr = 0;
    if (!e)
        e = LLVMOrcLLJITLookup(c->jit, &addr, symbol);
    pthread_mutex_unlock(&c->mu);
    if (e)
        return llvm_err(err, e, symbol);
    *fn = (w16_cpu_fn)(uintptr_t)addr;
    return WNA16_OK;
}

wna16_status_t w16_cpu_compile(w16_cpu_t *c, const kir_kernel_t *k,
                               w16_cpu_fn *fn, wna16_error_t *err)
{
    char symbol[300];
    pthread_mutex_lock(&c->mu);
    unsigned long n = ++c->symbols;
    pthread_mutex_unlock(&c->mu);
    snprintf(symbol, sizeof symbol, "%s__%lu", k->name, n);
    void *obj = NULL;
    size_t size = 0;
    wna16_status_t st = w16_cpu_compile_object(c, k, symbol, &obj, &size, err);
    if (st == WNA16_OK)
        st = w16_cpu_load_object(c, obj, size, symbol, fn, err);
    free(obj);
    return st;
}

typedef struct launch {
    w16_cpu_fn fn;
    const uint64_t *args;
    int64_t num_groups;
} launch_t;

static void run_range(void *user, int64_t b, int64_t e)
{
    const launch_t *l = user;
    l->fn(l->args, b, e, l->num_groups);
}

void w16_cpu_launch(w16_cpu_t *c, w16_cpu_fn fn, const uint64_t *args,
                    int64_t num_groups)
{
    launch_t l = {fn, args, num_groups};
    w16_pool_run(c->pool, num_groups, run_range, &l);
}
