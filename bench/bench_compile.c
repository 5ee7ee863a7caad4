/*
 * bench_compile.c - the cold JIT compile time (build the kernel IR, LLVM
 * O3, codegen, JIT link) of every generated CPU repack kernel of the codes
 * (qweight, or emulation's dequantized weight): each source format x each
 * backend layout, w13 and w2, word blocks as the runtime builds them. A
 * program, not a test: it prints each pair's median of `reps` compiles and
 * then the slowest ones (the target is under 100 ms a kernel, so that a
 * layer's first repack in a process is not mostly JIT time). Pairs a layout
 * cannot hold are listed with the builder's reason, once.
 *
 *   bench_compile [reps [experts hidden intermediate]]  (3; 8 2048 768)
 */
#define _POSIX_C_SOURCE 200809L
#include "wna16.h"
#include "bench/bench_util.h"
#include "gen/build_repack.h"
#include "runtime/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_REPS = 15, MAX_ROWS = 256 };

typedef struct row {
    char what[96];
    double ms;
} row_t;

static int cmp_row(const void *a, const void *b)
{
    double x = ((const row_t *)a)->ms, y = ((const row_t *)b)->ms;
    return (x < y) - (x > y); /* slowest first */
}

/* The first dtype the source layout of `role` allows (what a checkpoint
 * in that format stores). */
static wna16_dtype_t src_dtype(const wna16_spec_t *f, w16_role_t role)
{
    const w16_layout_t *l = f->layouts[role];
    return l && l->n_dtypes > 0 ? l->dtypes[0] : WNA16_DTYPE_INVALID;
}

/* Median of `reps` cold compiles of one kernel, or a negative value with
 * err set when the builder or the JIT refuses it. */
static double cold_ms(wna16_context_t *ctx, w16_cpu_t *cpu,
                      const w16_repack_request_t *req, int reps,
                      wna16_error_t *err)
{
    double t[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = (bench_seconds() * 1e3);
        w16_repack_kernel_t rk;
        w16_cpu_fn fn;
        if (w16_build_repack(ctx, req, &rk, err))
            return -1;
        wna16_status_t st = w16_cpu_compile(cpu, rk.kernel, &fn, err);
        w16_repack_kernel_free(&rk);
        if (st)
            return -1;
        t[r] = (bench_seconds() * 1e3) - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], bench_cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    int E = argc > 2 ? atoi(argv[2]) : 8;
    int H = argc > 3 ? atoi(argv[3]) : 2048;
    int I = argc > 4 ? atoi(argv[4]) : 768;
    if (reps < 1 || reps > MAX_REPS || E < 1 || H < 64 || I < 64) {
        fprintf(stderr, "usage: bench_compile [reps 1..%d [experts hidden "
                "intermediate]]\n", MAX_REPS);
        return 2;
    }
    wna16_context_t *ctx;
    wna16_error_t err;
    w16_cpu_t *cpu;
    int status;
    if (!bench_open_cpu(&ctx, &cpu, &status))
        return status;
    printf("wna16 bench_compile: int4 group 128, E=%d H=%d I=%d, median of %d "
           "cold compiles (build IR + O3 + codegen + JIT link) a kernel\n",
           E, H, I, reps);
    row_t *rows = calloc(MAX_ROWS, sizeof *rows);
    int n = 0;
    for (size_t f = 0; f < wna16_spec_count(ctx) && rows; f++) {
        const wna16_spec_t *fmt = wna16_spec_at(ctx, f);
        if (fmt->kind != WNA16_SPEC_FORMAT)
            continue;
        for (size_t b = 0; b < wna16_spec_count(ctx); b++) {
            const wna16_spec_t *be = wna16_spec_at(ctx, b);
            if (be->kind != WNA16_SPEC_BACKEND)
                continue;
            w16_role_t role = be->layouts[W16_ROLE_QWEIGHT] ? W16_ROLE_QWEIGHT
                                                            : W16_ROLE_WEIGHT;
            for (int g = 0; g < 2; g++) {
                w16_repack_request_t req = {
                    .src = fmt, .dst = be,
                    .problem = {E, H, I, 4, 128, false, false, false},
                    .gemm = (wna16_gemm_t)g, .role = role,
                    .word_blocks = true};
                w16_role_t need[W16_REPACK_MAX_SOURCES];
                int nn = w16_repack_source_roles(role, &req.problem, need);
                for (int r = 0; r < nn; r++)
                    req.src_dtype[need[r]] = src_dtype(fmt, need[r]);
                req.dst_dtype = w16_repack_dst_dtype(be->layouts[role],
                                                     req.src_dtype[need[0]]);
                double ms = cold_ms(ctx, cpu, &req, reps, &err);
                const char *gn = g == WNA16_GEMM_W13 ? "w13" : "w2";
                if (ms < 0) {
                    printf("  %-18s -> %-18s %s: not built: %s\n", fmt->name,
                           be->name, gn, err.message);
                    continue;
                }
                printf("  %-18s -> %-18s %s %8.1f ms\n", fmt->name, be->name,
                       gn, ms);
                fflush(stdout);
                if (n < MAX_ROWS) {
                    snprintf(rows[n].what, sizeof rows[n].what, "%s -> %s %s",
                             fmt->name, be->name, gn);
                    rows[n++].ms = ms;
                }
            }
        }
    }
    if (n > 0) {
        qsort(rows, (size_t)n, sizeof *rows, cmp_row);
        int over = 0;
        for (int i = 0; i < n; i++)
            over += rows[i].ms >= 100.0;
        printf("%d kernels; %d at or over 100 ms; the slowest:\n", n, over);
        for (int i = 0; i < n && i < 5; i++)
            printf("  %-50s %8.1f ms\n", rows[i].what, rows[i].ms);
    }
    free(rows);
    wna16_context_destroy(ctx);
    return 0;
}
