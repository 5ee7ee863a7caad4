/*
 * log.c - the context's log sink: wna16_log, the default sink (stderr),
 * $WNA16_LOG_LEVEL, and w16_log_once for messages that must appear once per
 * context (fallbacks, warnings of a unit compiled many times).
 */
#include "base/base.h"

#include <pthread.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct w16_once_key {
    struct w16_once_key *next;
    char key[];
};

void w16_log_default(void *user, wna16_log_level_t level, const char *msg)
{
    (void)user;
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "wna16: %s: %s\n", names[level & 3], msg);
}

/* $WNA16_LOG_LEVEL: debug, info, warn or error; anything else is warn. */
wna16_log_level_t w16_log_env_level(void)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    const char *v = getenv("WNA16_LOG_LEVEL");
    for (int i = 0; v && i < 4; i++)
        if (strcmp(v, names[i]) == 0)
            return (wna16_log_level_t)i;
    return WNA16_LOG_WARN;
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

void w16_log_once_free(wna16_context_t *ctx)
{
    struct w16_once_key *k = ctx->once;
    while (k) {
        struct w16_once_key *n = k->next;
        w16_free(ctx, k, sizeof *k + strlen(k->key) + 1);
        k = n;
    }
    ctx->once = NULL;
}
