/*
 * bench_util.h - what the bench programs measure with: a monotonic clock,
 * the comparison qsort needs for medians, and the context with its CPU
 * target the CPU benches start from. Header only (each bench is one
 * program).
 */
#ifndef WNA16_BENCH_UTIL_H
#define WNA16_BENCH_UTIL_H

#include "wna16.h"
#include "runtime/cpu/cpu.h"

#include <stdio.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Ascending order of doubles, for qsort. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A context and its CPU target (the LLVM JIT): true with both set, else
 * false with nothing left to free and *status the program's exit status
 * (1: no context, the reason on stderr; 0: no CPU target here, said as
 * SKIP on stdout). */
static inline bool bench_open_cpu(wna16_context_t **ctx, w16_cpu_t **cpu,
                                  int *status)
{
    wna16_error_t err;
    if (wna16_context_create(NULL, ctx, &err)) {
        fprintf(stderr, "%s\n", err.message);
        *status = 1;
        return false;
    }
    if (w16_cpu_get(*ctx, cpu, &err)) {
        printf("SKIP: %s\n", err.message);
        wna16_context_destroy(*ctx);
        *status = 0;
        return false;
    }
    return true;
}

#endif
