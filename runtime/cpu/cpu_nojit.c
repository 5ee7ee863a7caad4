/*
 * cpu_nojit.c - the CPU target in a build without LLVM: it runs kernels
 * from kernel packs (shared objects, cpu_so.c) over the same thread pool,
 * and refuses to compile, naming the kernel. Compiled instead of
 * cpu_target.c when LLVM 19 was not found or WNA16_WITH_LLVM=OFF, so that
 * a deployment with packs needs no libLLVM.
 */
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct w16_cpu {
    wna16_context_t *ctx;
    w16_pool_t *pool;
    w16_cpu_sos_t sos;
    char name[32];
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

w16_cpu_sos_t *w16_cpu_sos(w16_cpu_t *cpu) { return &cpu->sos; }

wna16_status_t w16_cpu_get(wna16_context_t *ctx, w16_cpu_t **out,
                           wna16_error_t *err)
{
    pthread_mutex_lock(&init_mu);
    wna16_status_t st = WNA16_OK;
    w16_cpu_t *c = ctx->targets[WNA16_TARGET_CPU];
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c && !(c->pool = w16_pool_create(ctx->cpu_threads))) {
            free(c);
            c = NULL;
        }
        if (!c) {
            st = w16_err_nomem(err, "creating the CPU target");
        } else {
            c->ctx = ctx;
            w16_cpu_sos_init(&c->sos);
            const char *levels[4];
            int n = w16_cpu_host_arches(levels, 4);
            snprintf(c->name, sizeof c->name, "%s", n ? levels[0] : "unknown");
            ctx->targets[WNA16_TARGET_CPU] = c;
        }
    }
    pthread_mutex_unlock(&init_mu);
    *out = c;
    return st;
}

void w16_cpu_destroy(w16_cpu_t *c)
{
    if (!c)
        return;
    w16_cpu_sos_fini(&c->sos);
    w16_pool_destroy(c->pool);
    free(c);
}

static wna16_status_t no_llvm(const char *kernel, wna16_error_t *err)
{
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: this build has no "
                   "LLVM (built with WNA16_WITH_LLVM=OFF or without "
                   "llvm-19-dev): CPU kernels come from kernel packs only "
                   "(WNA16_PACK_PATH, wna16_context_add_pack)", kernel);
}

wna16_status_t w16_cpu_compile_object(w16_cpu_t *cpu, const kir_kernel_t *k,
                                      const char *symbol, void **obj,
                                      size_t *size, wna16_error_t *err)
{
    (void)cpu; (void)symbol; (void)obj; (void)size;
    return no_llvm(k->name, err);
}

wna16_status_t w16_cpu_load_object(w16_cpu_t *cpu, const void *obj,
                                   size_t size, const char *symbol,
                                   w16_cpu_fn *fn, wna16_error_t *err)
{
    (void)cpu; (void)obj; (void)size; (void)fn;
    return no_llvm(symbol, err);
}

wna16_status_t w16_cpu_compile(w16_cpu_t *cpu, const kir_kernel_t *k,
                               w16_cpu_fn *fn, wna16_error_t *err)
{
    (void)cpu; (void)fn;
    return no_llvm(k->name, err);
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

const char *w16_cpu_compiler_version(void) { return "none"; }
const char *w16_cpu_name(const w16_cpu_t *c) { return c->name; }
const char *w16_cpu_features(const w16_cpu_t *c) { (void)c; return ""; }
int w16_cpu_threads(const w16_cpu_t *c) { return w16_pool_threads(c->pool); }
