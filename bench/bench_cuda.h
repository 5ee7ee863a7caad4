/*
 * bench_cuda.h - what the GPU bench programs share: a context with its
 * CUDA target (a program without a GPU says SKIP and exits 0, so CI runs
 * it anywhere) and the device-to-device copy bandwidth the figures are
 * compared against, measured in the same run. Header only (each bench is
 * one program).
 */
#ifndef WNA16_BENCH_CUDA_H
#define WNA16_BENCH_CUDA_H

#include "wna16.h"
#include "runtime/cuda/cuda.h"
#include "bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>

/* A context and its CUDA target: true with both set, else false with
 * nothing left to free and *status the program's exit status (1: no
 * context, the reason on stderr; 0: no GPU here, said as SKIP on stdout,
 * named by `prog`). */
static inline bool bench_open_cuda(const char *prog, wna16_context_t **ctx,
                                   w16_cuda_t **cuda, int *status)
{
    wna16_error_t err;
    if (wna16_context_create(NULL, ctx, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.message);
        *status = 1;
        return false;
    }
    if (w16_cuda_get(*ctx, cuda, &err)) {
        printf("SKIP: %s: no GPU: %s\n", prog, err.message);
        wna16_context_destroy(*ctx);
        *status = 0;
        return false;
    }
    return true;
}

/* Device-to-device copy bandwidth, GB/s, read + write counted (the copy
 * moves twice its size): the median of 5 copies of 1 GiB, by events. */
static inline wna16_status_t bench_copy_gbs(w16_cuda_t *cuda, double *gbs,
                                            wna16_error_t *err)
{
    const size_t bytes = (size_t)1 << 30;
    uint64_t a = 0, b = 0;
    w16_cuda_event_t *e0 = NULL, *e1 = NULL;
    double t[5];
    wna16_status_t st = w16_cuda_alloc(cuda, bytes, &a, err);
    if (st == WNA16_OK)
        st = w16_cuda_alloc(cuda, bytes, &b, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_create(cuda, &e0, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_create(cuda, &e1, err);
    for (int r = 0; r < 5 && st == WNA16_OK; r++) {
        float ms = 0.0f;
        st = w16_cuda_event_record(cuda, e0, NULL, err);
        if (st == WNA16_OK)
            st = w16_cuda_copy_d2d(cuda, b, a, bytes, err);
        if (st == WNA16_OK)
            st = w16_cuda_event_record(cuda, e1, NULL, err);
        if (st == WNA16_OK)
            st = w16_cuda_event_sync(cuda, e1, err);
        if (st == WNA16_OK)
            st = w16_cuda_event_elapsed_ms(cuda, e0, e1, &ms, err);
        t[r] = ms;
    }
    if (st == WNA16_OK) {
        qsort(t, 5, sizeof *t, bench_cmp_double);
        *gbs = 2.0 * (double)bytes / (t[2] * 1e-3) / 1e9;
    }
    if (e0)
        w16_cuda_event_destroy(cuda, e0);
    if (e1)
        w16_cuda_event_destroy(cuda, e1);
    w16_cuda_free(cuda, a);
    w16_cuda_free(cuda, b);
    return st;
}

#endif
