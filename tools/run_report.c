/*
 * run_report.c - what `wna16 run` prints: a numbered line per step as it
 * starts and its details with times as it ends, then the figures (errors
 * against the reference, cold-compile time, cached time, effective
 * bandwidth); or, with --json, one JSON object with every figure on
 * stdout (the progress lines then go to stderr).
 */
#define _POSIX_C_SOURCE 200809L
#include "run.h"

#include <math.h>
#include <string.h>
#include <time.h>

/* ---- progress -------------------------------------------------------------------- */

double run_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void run_log_init(run_log_t *log, bool json)
{
    log->f = json ? stderr : stdout;
    log->step = 0;
    log->t0 = log->t_step = run_now();
}

void run_log_step(run_log_t *log, const char *fmt, ...)
{
    va_list ap;
    log->t_step = run_now();
    fprintf(log->f, "  %d. ", ++log->step);
    va_start(ap, fmt);
    vfprintf(log->f, fmt, ap);
    va_end(ap);
    fputc('\n', log->f);
    fflush(log->f);
}

void run_log_more(run_log_t *log, const char *fmt, ...)
{
    va_list ap;
    fputs("     ", log->f);
    va_start(ap, fmt);
    vfprintf(log->f, fmt, ap);
    va_end(ap);
    fputc('\n', log->f);
    fflush(log->f);
}

double run_log_elapsed(const run_log_t *log)
{
    return run_now() - log->t_step;
}

/* ---- the figures ----------------------------------------------------------------- */

static void cache_text(const run_figures_t *f, char *out, size_t n)
{
    if (f->cache_hit && f->from_packs)
        snprintf(out, n, "kernel pack hit: %llu kernels loaded from kernel "
                 "packs, %llu from %s", (unsigned long long)f->from_packs,
                 (unsigned long long)f->from_disk,
                 f->cache_dir[0] ? f->cache_dir : "memory");
    else if (f->cache_hit)
        snprintf(out, n, "kernel cache hit: %llu kernels loaded from %s",
                 (unsigned long long)f->from_disk,
                 f->cache_dir[0] ? f->cache_dir : "memory");
    else
        snprintf(out, n, "kernel cache miss: %llu kernels compiled%s%s",
                 (unsigned long long)f->compiled,
                 f->cache_dir[0] ? " and stored in " : " (memory only)",
                 f->cache_dir);
}

void run_report_human(const run_layer_t *L, const run_choice_t *c,
                      const run_figures_t *f, run_log_t *log)
{
    char cache[4300];
    cache_text(f, cache, sizeof cache);
    FILE *o = stdout;
    fprintf(o, "  figures (%s target, %s layout, %s numerics):\n",
            wna16_target_name(c->target), wna16_spec_name(c->backend),
            wna16_numerics_name(f->numerics));
    fprintf(o, "     max abs error        %.4g\n", f->max_abs);
    fprintf(o, "     max rel error        %.4g (of max |reference| %.4g; "
            "passes at most 2^-5 = %.5f)\n", f->max_rel, f->max_ref,
            RUN_REL_TOL);
    if (f->cache_hit) /* nothing was compiled: no compile time to show */
        fprintf(o, "     cold-compile time    none: %s (first call %.1f ms, "
                "%.1f ms over the cached time)\n", cache, f->first_ms,
                f->cold_compile_ms);
    else
        fprintf(o, "     cold-compile time    %.1f ms (first call %.1f ms "
                "minus the cached time; %s)\n", f->cold_compile_ms,
                f->first_ms, cache);
    fprintf(o, "     cached time          %.3f ms (median of %d calls, best "
            "%.3f ms)\n", f->cached_ms, f->calls, f->best_ms);
    fprintf(o, "     effective bandwidth  %.1f GB/s (%d of %d experts "
            "touched x %.2f MB of weights, scales and zero points = %.1f MB "
            "in the cached time)\n", f->gbs, f->experts_touched, L->E,
            (double)f->bytes_per_expert / 1e6, (double)f->bytes_touched / 1e6);
    fprintf(o, "  result: %s in %.2f s\n", f->ok ? "OK" : "FAILED (MISMATCH)",
            run_now() - log->t0);
}

/* ---- JSON -------------------------------------------------------------------------- */

typedef struct json {
    FILE *f;
    bool first;
} json_t;

static void key(json_t *j, const char *k)
{
    fprintf(j->f, "%s\"%s\": ", j->first ? "{" : ", ", k);
    j->first = false;
}

static void jstr(json_t *j, const char *k, const char *v)
{
    key(j, k);
    if (v)
        cli_json_string(j->f, v);
    else
        fputs("null", j->f);
}

static void jnum(json_t *j, const char *k, double v)
{
    key(j, k);
    if (isfinite(v))
        fprintf(j->f, "%.6g", v);
    else
        fputs("null", j->f);
}

static void jint(json_t *j, const char *k, long long v)
{
    key(j, k);
    fprintf(j->f, "%lld", v);
}

static void jbool(json_t *j, const char *k, bool v)
{
    key(j, k);
    fputs(v ? "true" : "false", j->f);
}

void run_report_json(const run_opts_t *o, const run_layer_t *L,
                     const run_input_t *in, const run_choice_t *c,
                     const run_figures_t *f)
{
    json_t j = {stdout, true};
    const wna16_spec_t *sel = c->sel_status == WNA16_OK ? c->sel.backend : NULL;
    jstr(&j, "checkpoint", o->checkpoint);
    jstr(&j, "layer", L->prefix);
    jstr(&j, "format", wna16_spec_name(L->format));
    jint(&j, "experts", L->E);
    jint(&j, "hidden", L->H);
    jint(&j, "intermediate", L->I);
    jint(&j, "bits", L->quant.bits);
    jint(&j, "group_size", L->quant.group_size);
    jbool(&j, "zero_points", L->quant.zero_point);
    jbool(&j, "act_order", L->quant.act_order);
    jbool(&j, "bias", L->quant.bias);
    jstr(&j, "input", in->source);
    jint(&j, "tokens", in->M);
    jint(&j, "topk", in->topk);
    jstr(&j, "dtype", wna16_dtype_name(in->dtype));
    jstr(&j, "target", wna16_target_name(c->target));
    jstr(&j, "device", c->device);
    jstr(&j, "selected", sel ? wna16_spec_name(sel) : NULL);
    jstr(&j, "selection_error", c->sel_status == WNA16_OK ? NULL
                                                          : c->sel_error);
    key(&j, "passed_over");
    for (size_t i = 0; i < c->sel.n_passed_over; i++) {
        fputs(i ? ", {\"backend\": " : "[{\"backend\": ", j.f);
        cli_json_string(j.f, wna16_spec_name(c->sel.passed_over[i].backend));
        fputs(", \"reason\": ", j.f);
        cli_json_string(j.f, c->sel.passed_over[i].reason);
        fputc('}', j.f);
    }
    fputs(c->sel.n_passed_over ? "]" : "[]", j.f);
    jstr(&j, "backend", wna16_spec_name(c->backend));
    jstr(&j, "numerics", wna16_numerics_name(f->numerics));
    key(&j, "layouts_passed_over");
    for (size_t i = 0; i < c->n_skipped; i++) {
        fputs(i ? ", {\"backend\": " : "[{\"backend\": ", j.f);
        cli_json_string(j.f, wna16_spec_name(c->skipped[i].backend));
        fputs(", \"reason\": ", j.f);
        cli_json_string(j.f, c->skipped[i].reason);
        fputc('}', j.f);
    }
    fputs(c->n_skipped ? "]" : "[]", j.f);
    jstr(&j, "backend_reason", c->why[0] ? c->why : NULL);
    jnum(&j, "repack_s", f->repack_s);
    jint(&j, "packed_bytes", (long long)f->packed_bytes);
    jnum(&j, "first_call_ms", f->first_ms);
    jnum(&j, "cold_compile_ms", f->cache_hit ? NAN : f->cold_compile_ms);
    jbool(&j, "cache_hit", f->cache_hit);
    jnum(&j, "kernels_from_packs", (double)f->from_packs);
    jint(&j, "kernels_compiled", (long long)f->compiled);
    jint(&j, "kernels_from_disk", (long long)f->from_disk);
    jstr(&j, "cache_dir", f->cache_dir[0] ? f->cache_dir : NULL);
    jnum(&j, "cached_ms", f->cached_ms);
    jnum(&j, "best_ms", f->best_ms);
    jint(&j, "calls", f->calls);
    jint(&j, "experts_touched", f->experts_touched);
    jint(&j, "bytes_touched", (long long)f->bytes_touched);
    jnum(&j, "bandwidth_gbs", f->gbs);
    jnum(&j, "reference_s", f->reference_s);
    jnum(&j, "max_abs_error", f->max_abs);
    jnum(&j, "max_rel_error", f->max_rel);
    jnum(&j, "max_abs_reference", f->max_ref);
    jnum(&j, "reference_nonfinite", (double)f->ref_nonfinite);
    jstr(&j, "input_nonfinite", f->input_nonfinite[0] ? f->input_nonfinite
                                                      : NULL);
    jnum(&j, "rel_tolerance", RUN_REL_TOL);
    jbool(&j, "ok", f->ok);
    jstr(&j, "output", f->ok ? o->output : NULL);
    jnum(&j, "total_s", f->total_s);
    fputs("}\n", j.f);
}
