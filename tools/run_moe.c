/*
 * run_moe.c - the fused MoE of `wna16 run` on the CPU, and the timing both
 * targets share.
 *
 * The first call builds and compiles the kernels of the configuration
 * through the context's kernel cache ($WNA16_CACHE_DIR, else
 * $XDG_CACHE_HOME/wna16, else ~/.cache/wna16): its counters before and
 * after the call say whether the kernels were compiled (a miss) or loaded
 * from disk (a hit). Then the same call repeats; the cached time is their
 * median, and the cold-compile time what the first call cost on top of it.
 */
#include "run.h"
#include "runtime/cache.h"
#include "runtime/cpu/cpu.h"

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
    double ms, t = run_now();
    if (call(user, out, &ms, &err) != WNA16_OK)
        return cli_fail(&err);
    f->first_ms = (run_now() - t) * 1e3; /* with the compile: wall time */
    w16_cache_get_stats(cache, &s1);
    f->compiled = s1.compiles - s0.compiles;
    f->from_disk = s1.disk_hits - s0.disk_hits;
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

/* ---- the CPU ------------------------------------------------------------------ */

typedef struct cpu_call {
    wna16_moe_layer_t *layer;
    wna16_moe_params_t p;
    const run_input_t *in;
    void *scratch; /* output of the timed calls */
} cpu_call_t;

static wna16_status_t call_cpu(void *user, void *out, double *ms,
                               wna16_error_t *err)
{
    cpu_call_t *c = user;
    double t = run_now();
    wna16_status_t st = wna16_moe_layer_run(c->layer, &c->p, c->in->hidden,
                                            c->in->M, c->in->ids,
                                            c->in->weights, c->in->topk,
                                            out ? out : c->scratch, err);
    *ms = (run_now() - t) * 1e3;
    return st;
}

int run_moe_cpu(wna16_context_t *ctx, const run_layer_t *L,
                const run_choice_t *c, const wna16_tensor_set_t *packed,
                const run_input_t *in, void *out, run_figures_t *f,
                run_log_t *log)
{
    wna16_error_t err;
    w16_cpu_t *cpu = NULL;
    cpu_call_t call = {.in = in};
    if (w16_cpu_get(ctx, &cpu, &err) != WNA16_OK)
        return cli_fail(&err);
    f->threads = w16_cpu_threads(cpu);
    run_log_step(log, "fused MoE on the CPU: kernels generated from %s's "
                 "layout spec, LLVM JIT, %d threads; %d tokens, top-%d, %s, "
                 "silu", wna16_spec_name(c->backend), f->threads, in->M, in->topk,
                 wna16_dtype_name(in->dtype));
    wna16_moe_params_init(&call.p);
    call.p.act_dtype = in->dtype;
    call.scratch = malloc((size_t)in->M * (size_t)L->H * 2);
    int rc = CLI_FAIL;
    if (!call.scratch) {
        fprintf(stderr, "wna16: out of memory\n");
    } else if (wna16_moe_layer_create(ctx, c->backend, packed, L->prefix, L->E,
                                      L->H, L->I, &L->quant, WNA16_TARGET_CPU,
                                      &call.layer, &err) != WNA16_OK) {
        cli_fail(&err);
    } else {
        rc = run_time_calls(ctx, call_cpu, &call, out, f);
    }
    wna16_moe_layer_destroy(call.layer);
    free(call.scratch);
    if (rc == CLI_OK)
        run_log_more(log, "first call %.1f ms (%s); cached %.2f ms (median of "
                     "%d calls, best %.2f)", f->first_ms,
                     f->cache_hit ? "kernels from the kernel cache: hit"
                                  : "kernels compiled: cache miss",
                     f->cached_ms, f->calls, f->best_ms);
    return rc;
}
