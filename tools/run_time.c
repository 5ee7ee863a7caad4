/*
 * run_time.c - how `wna16 run` times a fused MoE, on either target.
 *
 * The first call builds and compiles the kernels of the configuration
 * through the context's kernel cache ($WNA16_CACHE_DIR, else
 * $XDG_CACHE_HOME/wna16, else ~/.cache/wna16): its counters before and
 * after the call say whether the kernels were compiled (a miss) or loaded
 * from disk (a hit). Then the same call repeats; the cached time is their
 * median, and the cold-compile time what the first call cost on top of it.
 */
#include "run.h"
#include "runtime/cache/cache.h"
#include "runtime/cache/pack.h"

#include <stdlib.h>
#include <string.h>

/* runtime/base/context.c: the context's kernel cache. */
wna16_status_t w16_context_cache(wna16_context_t *ctx, struct w16_cache **out,
                                 wna16_error_t *err);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int run_time_calls(wna16_context_t *ctx, run_call_fn call, void *user,
                   void *out, run_figures_t *f)
{
    wna16_error_t err;
    w16_cache_t *cache = NULL;
    w16_cache_stats_t s0 = {0}, s1 = {0};
    if (w16_context_cache(ctx, &cache, &err) != WNA16_OK)
        return cli_fail(&err);
    w16_cache_get_stats(cache, &s0);
    /* kernels taken from kernel packs (their own memory table) */
    w16_cache_t *packs = NULL;
    w16_cache_stats_t p0 = {0}, p1 = {0};
    if (w16_packs_loaded(ctx, &packs, &err) != WNA16_OK)
        return cli_fail(&err);
    w16_cache_get_stats(packs, &p0);
    double ms, t = run_now();
    if (call(user, out, &ms, &err) != WNA16_OK)
        return cli_fail(&err);
    f->first_ms = (run_now() - t) * 1e3; /* with the compile: wall time */
    w16_cache_get_stats(cache, &s1);
    f->compiled = s1.compiles - s0.compiles;
    f->from_disk = s1.disk_hits - s0.disk_hits;
    w16_cache_get_stats(packs, &p1);
    f->from_packs = p1.compiles - p0.compiles;
    f->cache_hit = f->compiled == 0;
    const char *dir = w16_cache_dir(cache);
    snprintf(f->cache_dir, sizeof f->cache_dir, "%s",
             dir && s1.disk_readable ? dir : "");

    double times[RUN_MAX_CALLS], spent = 0.0;
    int n = 0;
    while (n < RUN_MAX_CALLS && (n < RUN_MIN_CALLS || spent < RUN_MIN_SECONDS)) {
        double t0 = run_now();
        if (call(user, NULL, &times[n], &err) != WNA16_OK)
            return cli_fail(&err);
        spent += run_now() - t0;
        n++;
    }
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    f->calls = n;
    f->cached_ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    f->best_ms = times[0];
    f->cold_compile_ms = f->first_ms > f->cached_ms ? f->first_ms - f->cached_ms
                                                    : 0.0;
    return CLI_OK;
}
