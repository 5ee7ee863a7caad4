/*
 * context.c - wna16_context_create and _destroy: the one object that owns
 * the allocator, the log sink (base/log.c), the spec registry and, created
 * on first use, the targets and the kernel caches (the kernel cache with
 * the context when the options configure it). It sits at the top of
 * runtime/ because destroying a context tears down every layer below.
 */
#include "base/base.h"
#include "spec/spec.h"
#include "runtime/cache/cache.h"
#include "runtime/cache/pack.h"
#include "runtime/targets.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The CPU target's thread count: the option, else $WNA16_NUM_THREADS,
 * else 0 (the pool takes the online CPUs). A bad value is an error. */
static wna16_status_t cpu_threads_option(const wna16_context_options_t *o,
                                         int32_t *out, wna16_error_t *err)
{
    *out = 0;
    if (o->cpu_threads < 0 || o->cpu_threads > WNA16_MAX_CPU_THREADS)
        return w16_err(err, WNA16_EINVAL, "wna16_context_create: "
                       "cpu_threads %d is outside [0, %d]", o->cpu_threads,
                       WNA16_MAX_CPU_THREADS);
    if (o->cpu_threads) {
        *out = o->cpu_threads;
        return WNA16_OK;
    }
    const char *env = getenv("WNA16_NUM_THREADS");
    if (!env || !*env)
        return WNA16_OK;
    char *end = NULL;
    errno = 0;
    long v = strtol(env, &end, 10);
    if (errno || *end || v < 1 || v > WNA16_MAX_CPU_THREADS)
        return w16_err(err, WNA16_EINVAL, "WNA16_NUM_THREADS='%s': expected "
                       "a thread count in [1, %d]", env,
                       WNA16_MAX_CPU_THREADS);
    *out = (int32_t)v;
    return WNA16_OK;
}

wna16_status_t wna16_context_create(const wna16_context_options_t *opts,
                                    wna16_context_t **out, wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "wna16_context_create: out is NULL");
    *out = NULL;
    wna16_context_options_t o = {0};
    if (opts)
        o = *opts;
    if (o.allocator && !(o.allocator->alloc && o.allocator->realloc &&
                         o.allocator->free))
        return w16_err(err, WNA16_EINVAL,
                       "wna16_context_create: allocator must set alloc, "
                       "realloc and free");
    wna16_context_t tmp = {0};
    wna16_status_t tst = cpu_threads_option(&o, &tmp.cpu_threads, err);
    if (tst != WNA16_OK)
        return tst;
    if (o.allocator) {
        tmp.allocator = *o.allocator;
        tmp.custom_allocator = true;
    }
    wna16_context_t *ctx = w16_calloc(&tmp, 1, sizeof *ctx);
    if (!ctx)
        return w16_err_nomem(err, "creating a context");
    *ctx = tmp;
    ctx->log = o.log ? o.log : w16_log_default;
    ctx->log_user = o.log_user;
    ctx->log_level = (o.log_level_set || o.log_level) ? o.log_level
                                                      : w16_log_env_level();
    const char *jit = getenv("WNA16_JIT");
    ctx->no_jit = o.no_jit || (jit && strcmp(jit, "0") == 0);
    const char *dir = o.spec_dir ? o.spec_dir : getenv("WNA16_SPEC_DIR");
    if (dir && !*dir)
        dir = NULL;
    wna16_status_t st = w16_specs_init(ctx, !o.no_builtin_specs, dir, err);
    if (st != WNA16_OK) {
        wna16_context_destroy(ctx);
        return st;
    }
    /* The host's cache options live in the cache, made now; its directory
     * is chosen, created and checked at the first compile. */
    if ((o.cache_dir && *o.cache_dir) || o.cache_max_bytes) {
        w16_cache_options_t co = {.dir = o.cache_dir,
                                  .max_bytes = o.cache_max_bytes,
                                  .lazy_disk = true};
        if (!(ctx->cache = w16_cache_create(ctx, &co, err))) {
            wna16_context_destroy(ctx);
            return err ? err->status : WNA16_ENOMEM;
        }
    }
    *out = ctx;
    return WNA16_OK;
}

void wna16_context_destroy(wna16_context_t *ctx)
{
    if (!ctx)
        return;
    /* the cache holds handles into the targets (JIT code, device modules):
     * it goes first (the plans, which point at those handles, before it) */
    w16_cache_destroy(ctx->plans);
    w16_cache_destroy(ctx->cache);
    w16_packs_free(ctx); /* kernels loaded from packs, then the mappings */
    w16_targets_release(ctx);
    w16_specs_fini(ctx);
    w16_log_once_free(ctx);
    wna16_context_t copy = *ctx;
    w16_free(&copy, ctx, sizeof *ctx);
}
