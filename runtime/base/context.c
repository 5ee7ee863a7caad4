/*
 * context.c - the wna16_context: allocator, log sink, once-only messages and
 * the spec registry's lifetime.
 */
#include "runtime/base/base.h"
#include "gen/spec.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cache.h"
#include "runtime/cuda/cuda.h"

#include <pthread.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct w16_once_key {
    struct w16_once_key *next;
    char key[];
};

static void default_log(void *user, wna16_log_level_t level, const char *msg)
{
    (void)user;
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "wna16: %s: %s\n", names[level & 3], msg);
}

/* $WNA16_LOG_LEVEL: debug, info, warn or error; anything else is warn. */
static wna16_log_level_t env_log_level(void)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    const char *v = getenv("WNA16_LOG_LEVEL");
    for (int i = 0; v && i < 4; i++)
        if (strcmp(v, names[i]) == 0)
            return (wna16_log_level_t)i;
    return WNA16_LOG_WARN;
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
    if (o.allocator) {
        tmp.allocator = *o.allocator;
        tmp.custom_allocator = true;
    }
    wna16_context_t *ctx = w16_calloc(&tmp, 1, sizeof *ctx);
    if (!ctx)
        return w16_err_nomem(err, "creating a context");
    *ctx = tmp;
    ctx->log = o.log ? o.log : default_log;
    ctx->log_user = o.log_user;
    ctx->log_level = (o.log_level_set || o.log_level) ? o.log_level
                                                      : env_log_level();
    const char *dir = o.spec_dir ? o.spec_dir : getenv("WNA16_SPEC_DIR");
    if (dir && !*dir)
        dir = NULL;
    wna16_status_t st = w16_specs_init(ctx, !o.no_builtin_specs, dir, err);
    if (st != WNA16_OK) {
        wna16_context_destroy(ctx);
        return st;
    }
    *out = ctx;
    return WNA16_OK;
}

void wna16_context_destroy(wna16_context_t *ctx)
{
    if (!ctx)
        return;
    /* the cache holds handles into the CPU target's JIT and CUDA modules
     * of the CUDA target: it goes first (the plans, which point at those
     * handles, before it) */
    w16_cache_destroy(ctx->plans);
    w16_cache_destroy(ctx->cache);
    w16_cuda_destroy(ctx->cuda);
    w16_cpu_destroy(ctx->cpu);
    w16_specs_fini(ctx);
    struct w16_once_key *k = ctx->once;
    while (k) {
        struct w16_once_key *n = k->next;
        w16_free(ctx, k, sizeof *k + strlen(k->key) + 1);
        k = n;
    }
    wna16_context_t copy = *ctx;
    w16_free(&copy, ctx, sizeof *ctx);
}

static void vlog(wna16_context_t *ctx, wna16_log_level_t level,
                 const char *fmt, va_list ap)
{
    if (!ctx || level < ctx->log_level)
        return;
    char msg[2048];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof msg)
        memcpy(msg + sizeof msg - 4, "...", 4);
    ctx->log(ctx->log_user, level, msg);
}

void wna16_log(wna16_context_t *ctx, wna16_log_level_t level, const char *fmt,
               ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(ctx, level, fmt, ap);
    va_end(ap);
}

static pthread_mutex_t once_mu = PTHREAD_MUTEX_INITIALIZER;

void w16_log_once(wna16_context_t *ctx, wna16_log_level_t level,
                  const char *key, const char *fmt, ...)
{
    if (!ctx)
        return;
    /* the list is shared by the threads that compile a run's kernel units
     * in parallel (NVRTC warnings are logged once per unit) */
    pthread_mutex_lock(&once_mu);
    for (struct w16_once_key *k = ctx->once; k; k = k->next)
        if (strcmp(k->key, key) == 0) {
            pthread_mutex_unlock(&once_mu);
            return;
        }
    size_t n = strlen(key) + 1;
    struct w16_once_key *k = w16_alloc(ctx, sizeof *k + n);
    if (k) { /* if this fails we may log twice, which is harmless */
        memcpy(k->key, key, n);
        k->next = ctx->once;
        ctx->once = k;
    }
    pthread_mutex_unlock(&once_mu);
    va_list ap;
    va_start(ap, fmt);
    vlog(ctx, level, fmt, ap);
    va_end(ap);
}

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

wna16_status_t w16_context_cache(wna16_context_t *ctx, struct w16_cache **out,
                                 wna16_error_t *err)
{
    pthread_mutex_lock(&cache_mu);
    if (!ctx->cache) {
        char dir[4096];
        w16_cache_options_t o = {0};
        if (w16_cache_default_dir(dir, sizeof dir) == WNA16_OK)
            o.dir = dir;
        else
            o.memory_only = true;
        ctx->cache = w16_cache_create(ctx, &o, err);
    }
    pthread_mutex_unlock(&cache_mu);
    *out = ctx->cache;
    return ctx->cache ? WNA16_OK : (err ? err->status : WNA16_ENOMEM);
}

wna16_status_t w16_context_plans(wna16_context_t *ctx, struct w16_cache **out,
                                 wna16_error_t *err)
{
    pthread_mutex_lock(&cache_mu);
    if (!ctx->plans) {
        w16_cache_options_t o = {.memory_only = true};
        ctx->plans = w16_cache_create(ctx, &o, err);
    }
    pthread_mutex_unlock(&cache_mu);
    *out = ctx->plans;
    return ctx->plans ? WNA16_OK : (err ? err->status : WNA16_ENOMEM);
}
