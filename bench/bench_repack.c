/*
 * bench_repack.c - CPU repack throughput of the generated kernels against
 * memcpy of the same bytes, measured in the same run, and the cold JIT
 * compile time of a repack kernel. A program, not a test: it prints a
 * table and ratios. Each layer repack is timed twice: into new tensors
 * from malloc (cold: the page faults of the output are part of the time,
 * compared with memcpy into a new buffer) and through a context whose
 * allocator recycles the outputs (warm: compared with memcpy into a mapped
 * buffer).
 *
 *   bench_repack [EXPERTS [HIDDEN [INTERMEDIATE [FORMAT [DEST]]]]]
 *                (default 32 2048 768 gptq, every destination)
 *
 * FORMAT is the checkpoint's source format (gptq, awq, compressed_tensors,
 * moe_wna16) and DEST one destination layout; with a format other than
 * gptq only the layer table is printed (the later parts time GPTQ's
 * kernels).
 */
#define _GNU_SOURCE
#include "wna16.h"
#include "bench/bench_util.h"
#include "gen/build_repack.h"
#include "runtime/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* CPU time of the process, all threads. */
static double cpu_now(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

enum { ROUNDS = 7 };

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

/* A caching allocator, as inference engines use: blocks of 1 MiB and more
 * are kept when freed and handed out again for the same size, so a repack
 * into it writes memory that is already mapped (no page faults). Smaller
 * blocks go to malloc. */
enum { POOL_MIN = 1 << 20, POOL_MAX = 256 };
typedef struct pool {
    void *p[POOL_MAX];
    size_t n[POOL_MAX];
    bool used[POOL_MAX];
    int count;
} pool_t;

static void *pool_alloc(void *user, size_t n)
{
    pool_t *P = user;
    if (n < POOL_MIN)
        return malloc(n);
    for (int i = 0; i < P->count; i++)
        if (!P->used[i] && P->n[i] == n) {
            P->used[i] = true;
            return P->p[i];
        }
    void *p = malloc(n);
    if (!p || P->count == POOL_MAX)
        return p;
    memset(p, 0, n); /* map it now */
    P->p[P->count] = p;
    P->n[P->count] = n;
    P->used[P->count++] = true;
    return p;
}

static void pool_free(void *user, void *p, size_t n)
{
    pool_t *P = user;
    for (int i = 0; i < P->count; i++)
        if (P->p[i] == p) {
            P->used[i] = false;
            return;
        }
    (void)n;
    free(p);
}

static void *pool_realloc(void *user, void *p, size_t old, size_t n)
{
    void *q = pool_alloc(user, n);
    if (q && p)
        memcpy(q, p, old < n ? old : n);
    if (q)
        pool_free(user, p, old);
    return q;
}

/* The machine's load average: the figures are wall-clock times, and a
 * machine shared with other work slows the two-thread repack more than
 * the one-thread memcpy. */
static void print_load(const char *when)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = 0;
    if (f && fscanf(f, "%lf", &l1) == 1)
        printf("  load average %s: %.2f\n", when, l1);
    if (f)
        fclose(f);
}

static size_t set_bytes(const wna16_tensor_set_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(s); i++)
        n += wna16_tensor_set_at(s, i)->nbytes;
    return n;
}

int main(int argc, char **argv)
{
    int E = argc > 1 ? atoi(argv[1]) : 32;
    int H = argc > 2 ? atoi(argv[2]) : 2048;
    int I = argc > 3 ? atoi(argv[3]) : 768;
    const char *fmt_name = argc > 4 ? argv[4] : "gptq";
    const char *only = argc > 5 ? argv[5] : NULL;
    bool gptq_only = strcmp(fmt_name, "gptq") == 0;
    wna16_context_t *ctx;
    wna16_error_t err;
    w16_cpu_t *cpu;
    int status;
    if (!bench_open_cpu(&ctx, &cpu, &status))
        return status;
    /* A random int4 group-128 layer, written as checkpoint tensors of the
     * source format (GPTQ unless told). */
    wna16_qlayer_t L = {.E = E, .H = H, .I = I};
    wna16_qweight_alloc(&L.w13, E, 2 * I, H, 4, 128, false, false, false, &err);
    wna16_qweight_alloc(&L.w2, E, H, I, 4, 128, false, false, false, &err);
    uint64_t s = 88172645463325252ull;
    wna16_qweight_t *q[2] = {&L.w13, &L.w2};
    for (int i = 0; i < 2; i++) {
        for (size_t j = 0; j < (size_t)q[i]->E * q[i]->N * q[i]->K; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            q[i]->codes[j] = (uint8_t)(s & 15);
        }
        for (size_t j = 0; j < (size_t)q[i]->E * q[i]->G * q[i]->N; j++)
            q[i]->scales[j] = 0.01f;
    }
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    const wna16_spec_t *fmt = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, fmt_name);
    if (!fmt) {
        fprintf(stderr, "bench_repack: no source format named %s\n", fmt_name);
        return 2;
    }
    wna16_tensor_set_t *src;
    wna16_tensor_set_create(ctx, &src, &err);
    if (wna16_ref_encode(ctx, fmt, &L, "m", src, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    size_t src_bytes = set_bytes(src);
    wna16_quant_desc_t qd = {4, 128, false, false, false};
    printf("wna16 bench_repack: %s int4 g128, E=%d H=%d I=%d, %.1f MB of "
           "checkpoint tensors, %d threads, CPU %s\n", fmt_name, E, H, I,
           src_bytes / 1e6,
           w16_cpu_threads(cpu), w16_cpu_name(cpu));

    /* Baselines, one thread: memcpy of the same bytes into a buffer that is
     * already mapped (warm), and into a freshly allocated one (cold: the
     * page faults included, as a repack into new tensors pays them). */
    char *a = malloc(src_bytes), *b = malloc(src_bytes);
    memset(a, 1, src_bytes);
    memset(b, 2, src_bytes);
    double t[9];
    for (int r = 0; r < 9; r++) {
        double t0 = bench_seconds();
        memcpy(b, a, src_bytes);
        t[r] = bench_seconds() - t0;
    }
    double mc = median(t, 9);
    for (int r = 0; r < 5; r++) {
        double t0 = bench_seconds();
        char *c = malloc(src_bytes);
        memcpy(c, a, src_bytes);
        t[r] = bench_seconds() - t0;
        free(c);
    }
    double mcc = median(t, 5);
    printf("  memcpy, 1 thread: warm %.2f ms (%.2f GB/s), cold %.2f ms (%.2f GB/s)\n",
           mc * 1e3, src_bytes / mc / 1e9, mcc * 1e3, src_bytes / mcc / 1e9);
    print_load("at the start");

    /* A second context whose allocator recycles the output tensors. */
    pool_t pool = {.count = 0};
    wna16_allocator_t pa = {pool_alloc, pool_realloc, pool_free, &pool};
    wna16_context_options_t wo = {.allocator = &pa};
    wna16_context_t *wctx;
    if (wna16_context_create(&wo, &wctx, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    const wna16_spec_t *wfmt = wna16_spec_find(wctx, WNA16_SPEC_FORMAT, fmt_name);

    static const char *const dsts[] = {"triton", "xpu", "humming", "marlin", "cpu",
                                       "moe_wna16", "emulation"};
    int threads = w16_cpu_threads(cpu);
    printf("  each round times a memcpy of the source bytes, then the repack;\n"
           "  vs memcpy = median over %d rounds of memcpy time / repack time;\n"
           "  cpu time = the same with CPU times, the repack's divided by its %d\n"
           "  threads (what an unshared machine's wall clock would show);\n"
           "  vs out = the warm repack against a memcpy of its OUTPUT's bytes\n"
           "  (MB out; a mapped buffer, timed in the same round): a layout that\n"
           "  writes more bytes than it reads (emulation: bf16 out of int4)\n",
           ROUNDS, threads);
    printf("  %-12s %9s %10s %10s  %9s %10s %10s %9s %8s %7s  %s\n", "destination",
           "cold", "GB/s(src)", "vs cold", "warm", "GB/s(src)", "vs warm",
           "cpu time", "MB out", "vs out", "first call (compile+run)");
    for (size_t d = 0; d < sizeof dsts / sizeof dsts[0]; d++) {
        if (only && strcmp(only, dsts[d]) != 0)
            continue;
        double m[2], ratio[2], cratio[2], first = 0, oratio = 0;
        size_t out_bytes = 0;
        char *oa = NULL, *ob = NULL; /* memcpy of the output's bytes */
        bool ok = true;
        for (int w = 0; w < 2 && ok; w++) {
            wna16_context_t *c = w ? wctx : ctx;
            const wna16_spec_t *dst = wna16_spec_find(c, 0, dsts[d]);
            double rt[ROUNDS], rr[ROUNDS], rc[ROUNDS], ro[ROUNDS];
            for (int r = -1; r < ROUNDS; r++) {
                double mo = 0;
                if (w && oa) {
                    double o0 = bench_seconds();
                    memcpy(ob, oa, out_bytes);
                    mo = bench_seconds() - o0;
                }
                /* the baseline, in the same conditions as the repack */
                double t0 = bench_seconds(), c0 = cpu_now();
                char *cb = w ? b : malloc(src_bytes);
                memcpy(cb, a, src_bytes);
                double mt = bench_seconds() - t0, mcpu = cpu_now() - c0;
                if (!w)
                    free(cb);
                wna16_tensor_set_t *out;
                wna16_tensor_set_create(c, &out, &err);
                t0 = bench_seconds();
                c0 = cpu_now();
                wna16_status_t st = wna16_repack_layer(c, w ? wfmt : fmt, src, "m",
                                                       E, H, I, &qd, dst,
                                                       WNA16_TARGET_CPU, out, &err);
                double dt = bench_seconds() - t0, dcpu = cpu_now() - c0;
                if (!st && !out_bytes) {
                    out_bytes = set_bytes(out);
                    oa = malloc(out_bytes);
                    ob = malloc(out_bytes);
                    if (oa && ob) {
                        memset(oa, 1, out_bytes);
                        memset(ob, 2, out_bytes);
                    }
                }
                wna16_tensor_set_destroy(out);
                if (st) {
                    printf("  %-12s %s\n", dsts[d], err.message);
                    ok = false;
                    break;
                }
                if (r < 0) { /* compiles or loads the kernels */
                    if (!w)
                        first = dt;
                    continue;
                }
                rt[r] = dt;
                rr[r] = mt / dt;
                /* the wall time an unshared machine would give: the
                 * repack's CPU time spread over the pool's threads */
                rc[r] = mcpu / (dcpu / threads);
                ro[r] = mo / dt;
            }
            if (w && oa && ob)
                oratio = median(ro, ROUNDS);
            m[w] = median(rt, ROUNDS);
            ratio[w] = median(rr, ROUNDS);
            cratio[w] = median(rc, ROUNDS);
        }
        if (ok)
            printf("  %-12s %6.2f ms %10.2f %9.0f%%  %6.2f ms %10.2f %9.0f%% %9.0f%% %8.1f %6.0f%%  %.1f ms\n",
                   dsts[d], m[0] * 1e3, src_bytes / m[0] / 1e9, 100 * ratio[0],
                   m[1] * 1e3, src_bytes / m[1] / 1e9, 100 * ratio[1],
                   100 * cratio[1], out_bytes / 1e6, 100 * oratio, first * 1e3);
        free(oa);
        free(ob);
    }
    wna16_context_destroy(wctx);
    for (int i = 0; i < pool.count; i++)
        free(pool.p[i]);
    print_load("after the repacks");
    printf("  (first call: the kernels come from the cache directory if an "
           "earlier run left them there, else they are compiled)\n");
    if (!gptq_only) /* the rest times GPTQ's kernels */
        goto done;

    /* Disk-cache load: a new context (empty memory cache) repacks to
     * marlin with every kernel already on disk; minus the steady time. */
    {
        const wna16_spec_t *m = wna16_spec_find(ctx, 0, "marlin");
        wna16_tensor_set_t *out;
        double steady[5];
        for (int r = 0; r < 5; r++) {
            wna16_tensor_set_create(ctx, &out, &err);
            double t0 = bench_seconds();
            wna16_repack_layer(ctx, gptq, src, "m", E, H, I, &qd, m,
                               WNA16_TARGET_CPU, out, &err);
            steady[r] = bench_seconds() - t0;
            wna16_tensor_set_destroy(out);
        }
        double st = median(steady, 5), cold[5];
        size_t n_kernels = 0;
        for (int r = 0; r < 5; r++) {
            wna16_context_t *c2;
            wna16_context_create(NULL, &c2, &err);
            wna16_tensor_set_create(c2, &out, &err);
            const wna16_spec_t *g2 = wna16_spec_find(c2, 0, "gptq");
            const wna16_spec_t *m2 = wna16_spec_find(c2, 0, "marlin");
            double t0 = bench_seconds();
            wna16_repack_layer(c2, g2, src, "m", E, H, I, &qd, m2,
                               WNA16_TARGET_CPU, out, &err);
            cold[r] = bench_seconds() - t0;
            n_kernels = wna16_tensor_set_count(out);
            wna16_tensor_set_destroy(out);
            wna16_context_destroy(c2);
        }
        double c = median(cold, 5);
        printf("  disk-cache load: a fresh context repacks to marlin in %.1f ms "
               "vs %.1f ms warm; the %d kernels cost %.2f ms each to load "
               "(includes starting the JIT)\n", c * 1e3, st * 1e3,
               (int)n_kernels, (c - st) * 1e3 / (double)(n_kernels ? n_kernels : 1));
    }

    /* Cold compile of the largest kernels: Marlin's w13 codes (16 copies
     * of the word body) and the CPU layout's w13 and w2 (the block sums
     * fused in). */
    static const struct { const char *dst; wna16_dtype_t dt; wna16_gemm_t g; } cc[] = {
        {"marlin", WNA16_DTYPE_I32, WNA16_GEMM_W13},
        {"cpu", WNA16_DTYPE_U8, WNA16_GEMM_W13},
        {"cpu", WNA16_DTYPE_U8, WNA16_GEMM_W2}};
    w16_repack_request_t req = {.src = gptq,
                                .problem = {E, H, I, 4, 128, false, false, false},
                                .gemm = WNA16_GEMM_W13, .role = W16_ROLE_QWEIGHT,
                                .word_blocks = true};
    req.src_dtype[W16_ROLE_QWEIGHT] = WNA16_DTYPE_I32;
    for (size_t c = 0; c < sizeof cc / sizeof cc[0]; c++) {
        req.dst = wna16_spec_find(ctx, 0, cc[c].dst);
        req.dst_dtype = cc[c].dt;
        req.gemm = cc[c].g;
        int done = 0;
        for (int r = 0; r < 7; r++, done++) {
            double t0 = bench_seconds();
            w16_repack_kernel_t rk;
            w16_cpu_fn fn;
            if (w16_build_repack(ctx, &req, &rk, &err) ||
                w16_cpu_compile(cpu, rk.kernel, &fn, &err)) {
                printf("compile: %s\n", err.message);
                break;
            }
            t[r] = bench_seconds() - t0;
            w16_repack_kernel_free(&rk);
        }
        if (done == 7)
            printf("  cold compile (build IR + O3 + codegen + JIT link) of %s "
                   "%s_qweight: %.1f ms median of 7\n", cc[c].dst,
                   cc[c].g == WNA16_GEMM_W13 ? "w13" : "w2", median(t, 7) * 1e3);
    }
    /* Kernels alone, one word per lane against word blocks (what the CPU
     * runtime builds), each against a memcpy of its output's bytes, in
     * interleaved rounds. */
    static const struct { const char *dst; wna16_gemm_t g; w16_role_t role; } ka[] = {
        {"marlin", WNA16_GEMM_W13, W16_ROLE_QWEIGHT},
        {"marlin", WNA16_GEMM_W2, W16_ROLE_QWEIGHT},
        {"cpu", WNA16_GEMM_W13, W16_ROLE_QWEIGHT},
        {"cpu", WNA16_GEMM_W2, W16_ROLE_QWEIGHT},
        {"emulation", WNA16_GEMM_W13, W16_ROLE_WEIGHT},
        {"emulation", WNA16_GEMM_W2, W16_ROLE_WEIGHT}};
    printf("  kernels alone (median of 9 interleaved rounds; vs memcpy of the "
           "output's bytes):\n");
    for (size_t i = 0; i < sizeof ka / sizeof ka[0]; i++) {
        w16_repack_request_t kr = {.src = gptq, .dst = wna16_spec_find(ctx, 0, ka[i].dst),
                                   .problem = req.problem, .gemm = ka[i].g,
                                   .role = ka[i].role};
        w16_role_t need[W16_REPACK_MAX_SOURCES];
        int nn = w16_repack_source_roles(kr.role, &kr.problem, need);
        for (int r = 0; r < nn; r++)
            kr.src_dtype[need[r]] = need[r] == W16_ROLE_SCALES ? WNA16_DTYPE_F16
                                                               : WNA16_DTYPE_I32;
        kr.dst_dtype = w16_repack_dst_dtype(kr.dst->layouts[kr.role],
                                            kr.src_dtype[need[0]]);
        int np = ka[i].g == WNA16_GEMM_W13 ? 2 : 1;
        w16_repack_kernel_t rk[2] = {{0}};
        w16_cpu_fn fn[2];
        uint64_t args[2][8] = {{0}}, *tables[W16_ROLE_COUNT] = {0};
        bool ok = true;
        for (int v = 0; v < 2 && ok; v++) {
            kr.word_blocks = v;
            ok = !w16_build_repack(ctx, &kr, &rk[v], &err);
            ok = ok && !w16_cpu_compile(cpu, rk[v].kernel, &fn[v], &err);
        }
        if (!ok) {
            printf("  %s: %s\n", ka[i].dst, err.message);
            for (int v = 0; v < 2; v++)
                w16_repack_kernel_free(&rk[v]);
            continue;
        }
        for (int r = 0; r < nn && ok; r++) {
            tables[need[r]] = malloc(sizeof(uint64_t) * (size_t)(np * E));
            for (int e = 0; e < E && tables[need[r]]; e++)
                for (int p = 0; p < np; p++) {
                    char nm[96];
                    snprintf(nm, sizeof nm, "m.%d.%s_proj.%s", e,
                             np == 1 ? "down" : p ? "up" : "gate",
                             need[r] == W16_ROLE_SCALES ? "scales" : "qweight");
                    const wna16_tensor_t *st = wna16_tensor_set_find(src, nm);
                    ok = ok && st;
                    tables[need[r]][e * np + p] = st ? (uint64_t)(uintptr_t)st->data : 0;
                }
        }
        size_t bytes = (size_t)rk[0].elems * wna16_dtype_size(kr.dst_dtype);
        char *from = malloc(bytes), *to[2] = {malloc(bytes), malloc(bytes)};
        if (ok && from && to[0] && to[1]) {
            memset(from, 3, bytes);
            double tk[3][9];
            for (int v = 0; v < 2; v++) {
                memset(to[v], 0, bytes);
                args[v][0] = (uint64_t)(uintptr_t)to[v];
                for (int r = 0; r < W16_ROLE_COUNT; r++)
                    if (rk[v].kernel && rk[v].src_param[r] >= 0)
                        args[v][rk[v].src_param[r]] = (uint64_t)(uintptr_t)tables[r];
            }
            for (int r = 0; r < 9; r++) {
                double t0 = bench_seconds();
                memcpy(to[0], from, bytes);
                tk[2][r] = bench_seconds() - t0;
                for (int v = 0; v < 2; v++) {
                    t0 = bench_seconds();
                    w16_cpu_launch(cpu, fn[v], args[v], rk[v].num_groups);
                    tk[v][r] = bench_seconds() - t0;
                }
            }
            double m0 = median(tk[0], 9), m1 = median(tk[1], 9), mm = median(tk[2], 9);
            printf("    %-9s %s (%5.1f MB): one word per lane %6.2f ms (%3.0f%%), "
                   "%s %6.2f ms (%3.0f%%), %.2fx, %s\n", ka[i].dst,
                   ka[i].g == WNA16_GEMM_W13 ? "w13" : "w2 ", bytes / 1e6, m0 * 1e3,
                   100 * mm / m0, strstr(rk[1].kernel->name, "_wb") ? "word blocks"
                                                                    : "(no blocks)",
                   m1 * 1e3, 100 * mm / m1, m0 / m1,
                   memcmp(to[0], to[1], bytes) ? "OUTPUTS DIFFER" : "same bytes");
        }
        free(from);
        free(to[0]);
        free(to[1]);
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            free(tables[r]);
        for (int v = 0; v < 2; v++)
            w16_repack_kernel_free(&rk[v]);
    }
done:
    free(a);
    free(b);
    wna16_tensor_set_destroy(src);
    wna16_qlayer_free(&L);
    wna16_context_destroy(ctx);
    return 0;
}
