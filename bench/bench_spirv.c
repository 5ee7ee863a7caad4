/*
 * bench_spirv.c - what a SPIR-V kernel costs before it runs (issue 22,
 * point 7): the emit + validation time of every repack and fused-MoE
 * module (gen/emit_spirv.c: the words, then SPIRV-Tools' validator), the
 * aim being at most 20 ms each; then, where the ocl target runs, its
 * route's cost per module: llvm-spirv-15's reverse translation (a spawned
 * process) and PoCL's clBuildProgram, cold (a fresh POCL_CACHE_DIR) and
 * warm (PoCL's cache). PoCL generates and compiles each kernel's
 * work-group function at its first launch, which this program does not
 * do (it would need each kernel's data): tests/ocl's fuzz figures hold it.
 *
 * Repack: every source format or stacked layout -> every stacked layout,
 * both GEMMs, every destination tensor, in the GPU kernel shape the xpu and
 * ocl targets build (staged tiles), 4-bit group 128 and 8-bit channelwise,
 * on the Qwen3-30B-A3B layer (E experts, H 2048, I 768). Fused MoE: every
 * stacked layout that serves it x silu, gelu, swigluoai x block sizes
 * 1, 2, 4, bf16, top-8. A program, not a test: it prints the count,
 * median, 90th percentile and maximum of each kind and the slowest
 * modules; the figures go to bench/README.md.
 *
 *   bench_spirv [reps [experts [ocl_modules]]]   (3; 8; 12)
 */
#define _POSIX_C_SOURCE 200809L
#include "wna16.h"
#include "bench/bench_util.h"
#include "gen/build_moe.h"
#include "gen/build_repack.h"
#include "gen/emit_spirv.h"
#include "runtime/ref/ref.h" /* w16_check_holds */
#ifdef WNA16_HAVE_OPENCL
#include "runtime/ocl/ocl.h"
#include "runtime/targets.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_REPS = 15, MAX_ROWS = 4096, MAX_KEEP = 64 };

typedef struct row {
    char name[160];
    double ms;
    size_t words;
} row_t;

typedef struct run {
    wna16_context_t *ctx;
    int reps;
    row_t *rows;
    int n;
    int refused;
    /* modules kept for the OpenCL route (words, name), up to MAX_KEEP */
    uint32_t *keep_words[MAX_KEEP];
    size_t keep_len[MAX_KEEP];
    char keep_name[MAX_KEEP][160];
    int n_keep, want_keep;
} run_t;

static int cmp_row(const void *a, const void *b)
{
    double x = ((const row_t *)a)->ms, y = ((const row_t *)b)->ms;
    return (x < y) - (x > y); /* slowest first */
}

/* Median of reps emits (each validated) of k; keeps the module for the
 * OpenCL route when asked. */
static void measure(run_t *R, const kir_kernel_t *k, bool keep)
{
    double t[MAX_REPS];
    w16_words_t w;
    w16_words_init(&w, R->ctx);
    wna16_error_t err;
    for (int r = 0; r < R->reps; r++) {
        w16_words_reset(&w);
        double t0 = bench_seconds();
        if (w16_emit_spirv(k, &w, &err) != WNA16_OK) {
            fprintf(stderr, "bench_spirv: %s\n", err.message);
            w16_words_free(&w);
            exit(1);
        }
        t[r] = (bench_seconds() - t0) * 1e3;
    }
    qsort(t, (size_t)R->reps, sizeof t[0], bench_cmp_double);
    if (R->n < MAX_ROWS) {
        row_t *row = &R->rows[R->n++];
        snprintf(row->name, sizeof row->name, "%s", k->name);
        row->ms = t[R->reps / 2];
        row->words = w.len;
    }
    if (keep && R->n_keep < R->want_keep && R->n_keep < MAX_KEEP) {
        R->keep_words[R->n_keep] = malloc(w.len * 4);
        if (R->keep_words[R->n_keep]) {
            memcpy(R->keep_words[R->n_keep], w.data, w.len * 4);
            R->keep_len[R->n_keep] = w.len;
            snprintf(R->keep_name[R->n_keep], 160, "%s", k->name);
            R->n_keep++;
        }
    }
    w16_words_free(&w);
}

static void report(const char *kind, row_t *rows, int n)
{
    if (n == 0) {
        printf("%s: no modules\n", kind);
        return;
    }
    qsort(rows, (size_t)n, sizeof *rows, cmp_row);
    int over = 0;
    for (int i = 0; i < n; i++)
        over += rows[i].ms > 20.0;
    printf("%s: %d modules; emit + validate median %.2f ms, p90 %.2f ms, "
           "max %.2f ms (%s, %zu words); %d over 20 ms\n", kind, n,
           rows[n / 2].ms, rows[n / 10].ms, rows[0].ms, rows[0].name,
           rows[0].words, over);
    for (int i = 0; i < n && i < 5; i++)
        printf("  %7.2f ms  %6zu words  %s\n", rows[i].ms, rows[i].words,
               rows[i].name);
}

/* ---- repack modules ------------------------------------------------------ */

static wna16_dtype_t source_dtype(const w16_layout_t *l, wna16_dtype_t fd)
{
    for (int i = 0; i < l->n_dtypes; i++)
        if (l->dtypes[i] == fd)
            return fd;
    return l->dtypes[0];
}

static void repack_pair(run_t *R, const wna16_spec_t *src,
                        const wna16_spec_t *dst, w16_problem_t p)
{
    wna16_error_t err;
    int64_t sv[W16_VAR_COUNT], dv[W16_VAR_COUNT];
    if (w16_spec_bind(src, &p, WNA16_GEMM_W13, sv, &err) ||
        w16_check_holds(src, &p, (int32_t)sv[W16_VAR_IP], &err)) {
        R->refused++;
        return;
    }
    p.zeros_stored = !p.zp &&
                     w16_layout_present(src->layouts[W16_ROLE_QZEROS], sv);
    p.g_idx_stored = w16_layout_present(src->layouts[W16_ROLE_G_IDX], sv);
    if (w16_spec_bind(dst, &p, WNA16_GEMM_W13, dv, &err) ||
        w16_check_holds(dst, &p, (int32_t)dv[W16_VAR_IP], &err)) {
        R->refused++;
        return;
    }
    for (int g = 0; g < 2; g++) {
        wna16_gemm_t gemm = g ? WNA16_GEMM_W2 : WNA16_GEMM_W13;
        if (w16_spec_bind(dst, &p, gemm, dv, &err))
            continue;
        for (int r = 0; r < W16_ROLE_COUNT; r++) {
            const w16_layout_t *l = dst->layouts[r];
            if (!w16_layout_present(l, dv))
                continue;
            w16_repack_request_t req = {.src = src, .dst = dst, .problem = p,
                                        .gemm = gemm, .role = (w16_role_t)r,
                                        .staged_tiles = true};
            w16_role_t need[W16_REPACK_MAX_SOURCES];
            int nn = w16_repack_source_roles((w16_role_t)r, &p, need);
            bool ok = true;
            for (int i = 0; i < nn; i++) {
                const w16_layout_t *sl = src->layouts[need[i]];
                if (!sl)
                    ok = false;
                else
                    req.src_dtype[need[i]] = source_dtype(sl,
                                                          WNA16_DTYPE_F16);
            }
            if (!ok)
                continue;
            req.dst_dtype = w16_repack_dst_dtype(
                l, nn ? req.src_dtype[need[0]] : WNA16_DTYPE_INVALID);
            w16_repack_kernel_t rk;
            if (w16_build_repack(R->ctx, &req, &rk, &err) != WNA16_OK) {
                R->refused++;
                continue;
            }
            measure(R, rk.kernel, r == W16_ROLE_QWEIGHT);
            w16_repack_kernel_free(&rk);
        }
    }
}

static void repack_modules(run_t *R, int32_t E)
{
    static const int32_t bits[] = {4, 8}, gss[] = {128, -1};
    size_t n = wna16_spec_count(R->ctx);
    for (size_t a = 0; a < n; a++) {
        const wna16_spec_t *src = wna16_spec_at(R->ctx, a);
        const w16_layout_t *q = src->layouts[W16_ROLE_QWEIGHT];
        if (!(src->kind == WNA16_SPEC_FORMAT ||
              (src->stacked && q && !q->sums_block_k)))
            continue;
        for (size_t b = 0; b < n; b++) {
            const wna16_spec_t *dst = wna16_spec_at(R->ctx, b);
            if (!dst->stacked)
                continue;
            for (int i = 0; i < 2; i++)
                repack_pair(R, src, dst,
                            (w16_problem_t){E, 2048, 768, bits[i], gss[i]});
        }
    }
}

/* ---- fused-MoE modules ----------------------------------------------------- */

static void moe_modules(run_t *R, int32_t E)
{
    static const wna16_activation_t acts[] = {
        WNA16_ACT_SILU, WNA16_ACT_GELU, WNA16_ACT_SWIGLUOAI};
    for (size_t i = 0; i < wna16_spec_count(R->ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(R->ctx, i);
        if (!s->stacked)
            continue;
        for (int a = 0; a < 3; a++)
            for (int bm = 1; bm <= 4; bm *= 2) {
                w16_moe_request_t req = {
                    .backend = s, .topk = 8, .block_m = bm,
                    .qweight_align = 4,
                    .problem = {.E = E, .H = 2048, .I = 768, .BITS = 4,
                                .GS = 128}};
                wna16_moe_params_init(&req.params);
                req.params.activation = acts[a];
                req.params.act_dtype = WNA16_DTYPE_BF16;
                wna16_error_t err;
                if (w16_moe_check(&req, &err) != WNA16_OK) {
                    R->refused++;
                    break;
                }
                for (int st = 0; st < W16_MOE_STAGE_COUNT; st++) {
                    /* input and combine do not depend on the block size */
                    bool gemm = st == W16_MOE_GEMM1 || st == W16_MOE_GEMM2;
                    if (!gemm && bm > 1)
                        continue;
                    w16_moe_kernel_t mk;
                    if (w16_build_moe(R->ctx, &req, (w16_moe_stage_t)st, &mk,
                                      &err) != WNA16_OK) {
                        fprintf(stderr, "bench_spirv: %s\n", err.message);
                        exit(1);
                    }
                    measure(R, mk.kernel, gemm && bm == 2 && a == 0);
                    w16_moe_kernel_free(&mk);
                }
            }
    }
}

/* ---- the OpenCL route ---------------------------------------------------- */

#ifdef WNA16_HAVE_OPENCL
static void ocl_route(run_t *R, int first, int count, const char *kind)
{
    void *inst = NULL;
    wna16_error_t err;
    if (w16_target_probe(R->ctx, WNA16_TARGET_OCL, NULL, &inst, &err)) {
        printf("OpenCL route: SKIP (%s)\n", err.message);
        return;
    }
    double tr[MAX_KEEP], cold[MAX_KEEP], warm[MAX_KEEP];
    int n = 0;
    for (int i = first; i < first + count && i < R->n_keep; i++) {
        void *bc = NULL;
        size_t bc_size = 0;
        double t0 = bench_seconds();
        if (w16_ocl_translate(inst, R->keep_words[i], R->keep_len[i],
                              R->keep_name[i], &bc, &bc_size, &err)) {
            printf("  %s: %s\n", R->keep_name[i], err.message);
            continue;
        }
        double t1 = bench_seconds();
        /* clBuildProgram needs the argument kinds only to launch */
        uint8_t kinds[32] = {0};
        w16_ocl_kernel_t *k = NULL;
        wna16_status_t st = w16_ocl_kernel_load(inst, bc, bc_size,
                                                R->keep_name[i], kinds, 0, &k,
                                                &err);
        double t2 = bench_seconds();
        w16_ocl_kernel_free(k);
        w16_ocl_kernel_t *k2 = NULL;
        if (st == WNA16_OK)
            st = w16_ocl_kernel_load(inst, bc, bc_size, R->keep_name[i],
                                     kinds, 0, &k2, &err);
        double t3 = bench_seconds();
        w16_ocl_kernel_free(k2);
        free(bc);
        if (st != WNA16_OK) {
            printf("  %s: %s\n", R->keep_name[i], err.message);
            continue;
        }
        tr[n] = (t1 - t0) * 1e3;
        cold[n] = (t2 - t1) * 1e3;
        warm[n] = (t3 - t2) * 1e3;
        printf("  %-72s translate %6.1f ms, build cold %6.1f ms, warm %5.1f "
               "ms\n", R->keep_name[i], tr[n], cold[n], warm[n]);
        n++;
    }
    if (!n)
        return;
    qsort(tr, (size_t)n, sizeof tr[0], bench_cmp_double);
    qsort(cold, (size_t)n, sizeof cold[0], bench_cmp_double);
    qsort(warm, (size_t)n, sizeof warm[0], bench_cmp_double);
    printf("OpenCL route, %s (%d modules): llvm-spirv-15 -r median %.1f ms "
           "(max %.1f), clBuildProgram cold median %.1f ms (max %.1f), warm "
           "median %.1f ms\n", kind, n, tr[n / 2], tr[n - 1], cold[n / 2],
           cold[n - 1], warm[n / 2]);
}
#endif

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    int E = argc > 2 ? atoi(argv[2]) : 8;
    int n_ocl = argc > 3 ? atoi(argv[3]) : 12;
    if (reps < 1 || reps > MAX_REPS || E < 1 || E > 256 || n_ocl < 0 ||
        n_ocl > MAX_KEEP / 2) {
        fprintf(stderr, "usage: bench_spirv [reps 1..%d [experts 1..256 "
                "[ocl_modules 0..%d]]]\n", MAX_REPS, MAX_KEEP / 2);
        return 2;
    }
#ifdef WNA16_HAVE_OPENCL
    /* a cold PoCL cache of this run's own (unless the caller set one) */
    char pocl_dir[] = "/tmp/bench_spirv_pocl_XXXXXX";
    if (!getenv("POCL_CACHE_DIR") && mkdtemp(pocl_dir))
        setenv("POCL_CACHE_DIR", pocl_dir, 1);
#endif
    wna16_context_t *ctx;
    wna16_error_t err;
    if (wna16_context_create(NULL, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "bench_spirv: %s\n", err.message);
        return 1;
    }
    run_t R = {.ctx = ctx, .reps = reps, .want_keep = n_ocl};
    R.rows = calloc(MAX_ROWS, sizeof *R.rows);
    if (!R.rows)
        return 1;
    printf("bench_spirv: E=%d H=2048 I=768, median of %d emits a module\n", E,
           reps);
    repack_modules(&R, E);
    int n_repack = R.n, keep_repack = R.n_keep;
    report("repack", R.rows, n_repack);
    R.want_keep = keep_repack + n_ocl;
    moe_modules(&R, E);
    report("fused MoE", R.rows + n_repack, R.n - n_repack);
    printf("(%d pairs or configurations the layouts refuse)\n", R.refused);
#ifdef WNA16_HAVE_OPENCL
    ocl_route(&R, 0, keep_repack, "repack");
    ocl_route(&R, keep_repack, R.n_keep - keep_repack, "fused MoE");
#else
    printf("OpenCL route: SKIP (built without the ocl target)\n");
#endif
    for (int i = 0; i < R.n_keep; i++)
        free(R.keep_words[i]);
    free(R.rows);
    wna16_context_destroy(ctx);
    return 0;
}
