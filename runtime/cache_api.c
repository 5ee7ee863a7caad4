/*
 * cache_api.c - wna16_cache_info and wna16_cache_clear: the context's
 * kernel cache seen and emptied from a host (what `wna16 cache stats` and
 * `wna16 cache clear` do for a directory), through runtime/cache/'s
 * statistics, directory scan and clear.
 */
#include "base/base.h"
#include "runtime/cache/cache.h"

#include <stdio.h>
#include <string.h>

/* The context's cache with its directory set up; *dir NULL: memory only. */
static wna16_status_t cache_of(wna16_context_t *ctx, const char *fn,
                               w16_cache_t **c, const char **dir,
                               wna16_error_t *err)
{
    if (!ctx)
        return w16_err(err, WNA16_EINVAL, "%s: ctx is NULL", fn);
    wna16_status_t st = w16_context_cache(ctx, c, err);
    if (st != WNA16_OK)
        return st;
    *dir = w16_cache_dir_setup(*c);
    return WNA16_OK;
}

wna16_status_t wna16_cache_info(wna16_context_t *ctx, wna16_cache_info_t *out,
                                wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "wna16_cache_info: out is NULL");
    memset(out, 0, sizeof *out);
    w16_cache_t *c = NULL;
    const char *dir = NULL;
    wna16_status_t st = cache_of(ctx, "wna16_cache_info", &c, &dir, err);
    if (st != WNA16_OK)
        return st;
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    out->disk_readable = s.disk_readable;
    out->disk_writable = s.disk_writable;
    out->max_bytes = s.max_bytes;
    out->entries = s.entries;
    out->memory_hits = s.memory_hits;
    out->disk_hits = s.disk_hits;
    out->compiles = s.compiles;
    out->disk_writes = s.disk_writes;
    out->corrupt = s.corrupt;
    out->untrusted = s.untrusted;
    out->evictions = s.evictions;
    out->errors = s.errors;
    if (!dir || !s.disk_readable)
        return WNA16_OK;
    if (strlen(dir) >= sizeof out->dir) {
        memset(out, 0, sizeof *out);
        return w16_err(err, WNA16_ELIMIT, "wna16_cache_info: the cache "
                       "directory's path is longer than %zu bytes",
                       sizeof out->dir - 1);
    }
    snprintf(out->dir, sizeof out->dir, "%s", dir);
    st = w16_cache_dir_stats(dir, &out->files, &out->bytes, err);
    if (st != WNA16_OK)
        memset(out, 0, sizeof *out);
    return st;
}

wna16_status_t wna16_cache_clear(wna16_context_t *ctx, size_t *removed,
                                 wna16_error_t *err)
{
    if (removed)
        *removed = 0;
    w16_cache_t *c = NULL;
    const char *dir = NULL;
    wna16_status_t st = cache_of(ctx, "wna16_cache_clear", &c, &dir, err);
    if (st != WNA16_OK)
        return st;
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    if (!dir || !s.disk_writable)
        return w16_err(err, WNA16_EUNAVAILABLE, "wna16_cache_clear: the "
                       "context's kernel cache has no usable directory (it "
                       "keeps kernels in memory only; the log said why)");
    size_t n = 0;
    st = w16_cache_clear(dir, &n, err);
    if (removed)
        *removed = n;
    return st;
}
