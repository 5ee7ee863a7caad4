/*
 * bench_util.h - what the bench programs measure with: a monotonic clock
 * and the comparison qsort needs for medians. Header only (each bench is
 * one program).
 */
#ifndef WNA16_BENCH_UTIL_H
#define WNA16_BENCH_UTIL_H

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

#endif
