/*
 * bench_pack.c - time to a kernel from an ahead-of-time pack against a
 * cold JIT compile and the disk cache, and the cost of a hit by request.
 *
 *   bench_pack MANIFEST PACK [TARGET]
 *
 * MANIFEST is what PACK was built from (wna16 pack build); its requests for
 * TARGET (default cpu) are expanded as the builder does (tools/
 * pack_manifest.c is compiled in). For each kernel, in fresh contexts:
 *   jit     build the kernel IR, compile and load it (no pack, an empty
 *           disk cache: the first use of a kernel today);
 *   disk    the same with the disk cache warm (IR built, printed, hashed,
 *           the object read and linked);
 *   pack    open the pack (mmap, index check), build the IR and take the
 *           kernel from it by request (find, checksum, load: dlopen of a
 *           memory file on the CPU);
 * (each context's target is made before the clock starts: a JIT, a thread
 * pool or a device context is once per process, not per kernel);
 * then, on one context, the cost of a repeated request: by request key
 * (what a repack plan or fused-MoE stage miss does after building) and by
 * content (w16_target_kernel: print and hash the IR). Prints one line per
 * kernel family and the totals; medians over the kernels.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_util.h"
#include "gen/request_key.h"
#include "runtime/cache/pack.h"
#include "runtime/targets.h"
#include "../tools/pack.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The kernel IR of job j (the repack codes kernel or the MoE stage). */
static wna16_status_t build(wna16_context_t *ctx, const pack_job_t *j,
                            kir_kernel_t **k, w16_key_t *req,
                            w16_repack_kernel_t *rk, w16_moe_kernel_t *mk,
                            wna16_error_t *err)
{
    if (j->kind == PACK_MOE) {
        wna16_status_t st = w16_build_moe(ctx, &j->moe, j->stage, mk, err);
        *k = st == WNA16_OK ? mk->kernel : NULL;
        *req = w16_moe_request_key(&j->moe, j->stage);
        return st;
    }
    wna16_status_t st = w16_build_repack(ctx, &j->repack, rk, err);
    *k = st == WNA16_OK ? rk->kernel : NULL;
    *req = w16_repack_request_key(&j->repack, false);
    return st;
}

static void unbuild(const pack_job_t *j, w16_repack_kernel_t *rk,
                    w16_moe_kernel_t *mk)
{
    if (j->kind == PACK_MOE)
        w16_moe_kernel_free(mk);
    else
        w16_repack_kernel_free(rk);
}

static wna16_context_t *fresh(const char *cache_dir, bool no_jit)
{
    wna16_context_options_t o = {.cache_dir = cache_dir, .no_jit = no_jit,
                                 .log_level = WNA16_LOG_ERROR};
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    if (wna16_context_create(&o, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "bench_pack: %s\n", err.message);
        return NULL;
    }
    return ctx;
}

/* The target made on ctx before anything is timed: creating it (a JIT,
 * a thread pool, a device context) is once per context, not per kernel. */
static bool warm(wna16_context_t *ctx, const w16_target_t *T)
{
    void *inst;
    wna16_error_t err;
    if (!ctx || T->probe(ctx, &inst, &err) != WNA16_OK) {
        fprintf(stderr, "bench_pack: %s\n", ctx ? err.message : "no context");
        return false;
    }
    return true;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_pack MANIFEST PACK [TARGET]\n");
        return 2;
    }
    const char *manifest = argv[1], *pack_path = argv[2];
    const char *target = argc > 3 ? argv[3] : "cpu";
    wna16_context_t *mctx = fresh(NULL, false);
    if (!mctx)
        return 1;
    pack_manifest_t m;
    wna16_error_t err;
    if (pack_manifest_load(mctx, manifest, &m, &err) != WNA16_OK) {
        fprintf(stderr, "bench_pack: %s\n", err.message);
        return 1;
    }
    const w16_target_t *T = w16_target_by_name(target);
    void *inst = NULL;
    if (!T || T->probe(mctx, &inst, &err) != WNA16_OK) {
        printf("SKIP: target %s: %s\n", target, T ? err.message : "not built");
        return 0;
    }
    char dir[] = "/tmp/wna16-bench-pack-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* the pack's open, alone */
    double t0 = bench_seconds();
    w16_pack_t *p = NULL;
    if (w16_pack_open(pack_path, &p, &err) != WNA16_OK) {
        fprintf(stderr, "bench_pack: %s\n", err.message);
        return 1;
    }
    double open_ms = (bench_seconds() - t0) * 1e3;
    w16_pack_info_t info;
    w16_pack_get_info(p, &info);
    w16_pack_close(p);

    /* kernel IR kernels only: the CUDA fused MoE's units (PACK_CUDA_UNIT)
     * are not built from IR */
    size_t n = 0;
    for (size_t i = 0; i < m.n_jobs; i++)
        n += m.jobs[i].target->T == T && m.jobs[i].kind != PACK_CUDA_UNIT;
    double *jit = calloc(n + 1, sizeof *jit), *disk = calloc(n + 1, sizeof *disk),
           *pk = calloc(n + 1, sizeof *pk), *ir = calloc(n + 1, sizeof *ir);
    int k = 0;
    const char *fam = NULL;
    printf("bench_pack: %s (%u entries, %.1f MB; opened and checked in %.3f "
           "ms), target %s, %zu kernels\n", pack_path, info.entries,
           (double)info.file_size / 1e6, open_ms, target, n);
    printf("%-24s %8s %10s %10s %10s %10s\n", "family", "kernels",
           "IR ms", "jit ms", "disk ms", "pack ms");
    int fam_start = 0;
    for (size_t i = 0; i <= m.n_jobs; i++) {
        const pack_job_t *j = i < m.n_jobs ? &m.jobs[i] : NULL;
        if (j && (j->target->T != T || j->kind == PACK_CUDA_UNIT))
            continue;
        if (!j || (fam && strcmp(fam, j->family) != 0)) {
            int c = k - fam_start;
            if (c) {
                double a[4] = {0};
                double *cols[4] = {ir, jit, disk, pk};
                for (int q = 0; q < 4; q++) {
                    double *tmp = malloc(sizeof *tmp * (size_t)c);
                    memcpy(tmp, cols[q] + fam_start, sizeof *tmp * (size_t)c);
                    a[q] = median(tmp, c);
                    free(tmp);
                }
                printf("%-24s %8d %10.2f %10.2f %10.2f %10.3f  (medians)\n",
                       fam, c, a[0], a[1], a[2], a[3]);
            }
            fam_start = k;
            if (!j)
                break;
        }
        fam = j->family;
        char cache[600];
        snprintf(cache, sizeof cache, "%s/c%zu", dir, i);
        /* cold JIT: an empty cache directory, no pack */
        wna16_context_t *c1 = fresh(cache, false);
        if (!warm(c1, T))
            return 1;
        w16_repack_kernel_t rk;
        w16_moe_kernel_t mk;
        kir_kernel_t *kk;
        w16_key_t req;
        void *fn;
        double a = bench_seconds();
        if (!c1 || build(c1, j, &kk, &req, &rk, &mk, &err) != WNA16_OK) {
            fprintf(stderr, "bench_pack: %s\n", err.message);
            return 1;
        }
        double b = bench_seconds();
        if (w16_target_kernel(c1, T, j->kind == PACK_MOE ? "wna16 moe kernel"
                                                         : "wna16 kernel",
                              kk, &fn, NULL, &err) != WNA16_OK) {
            fprintf(stderr, "bench_pack: %s\n", err.message);
            return 1;
        }
        ir[k] = (b - a) * 1e3;
        jit[k] = (bench_seconds() - a) * 1e3;
        unbuild(j, &rk, &mk);
        wna16_context_destroy(c1);
        /* the disk cache, warm */
        wna16_context_t *c2 = fresh(cache, false);
        if (!warm(c2, T))
            return 1;
        a = bench_seconds();
        if (!c2 || build(c2, j, &kk, &req, &rk, &mk, &err) != WNA16_OK ||
            w16_target_kernel(c2, T, j->kind == PACK_MOE ? "wna16 moe kernel"
                                                         : "wna16 kernel",
                              kk, &fn, NULL, &err) != WNA16_OK) {
            fprintf(stderr, "bench_pack: %s\n", err.message);
            return 1;
        }
        disk[k] = (bench_seconds() - a) * 1e3;
        unbuild(j, &rk, &mk);
        wna16_context_destroy(c2);
        /* the pack: JIT off, so a miss would fail */
        wna16_context_t *c3 = fresh(cache, true);
        if (!warm(c3, T))
            return 1;
        a = bench_seconds(); /* the pack's open is per kernel here */
        if (wna16_context_add_pack(c3, pack_path, &err) != WNA16_OK) {
            fprintf(stderr, "bench_pack: %s\n", err.message);
            return 1;
        }
        if (build(c3, j, &kk, &req, &rk, &mk, &err) != WNA16_OK ||
            w16_target_kernel_req(c3, T, "bench", req, kk, &fn, NULL,
                                  &err) != WNA16_OK) {
            fprintf(stderr, "bench_pack: %s\n", err.message);
            return 1;
        }
        pk[k] = (bench_seconds() - a) * 1e3;
        unbuild(j, &rk, &mk);
        wna16_context_destroy(c3);
        k++;
    }
    double t_ir = median(ir, k), t_jit = median(jit, k), t_disk = median(disk, k),
           t_pack = median(pk, k);
    printf("%-24s %8d %10.2f %10.2f %10.2f %10.3f  (medians)\n", "all", k,
           t_ir, t_jit, t_disk, t_pack);
    printf("pack vs cold JIT: %.0fx faster; vs the disk cache: %.1fx; of the "
           "pack time, building the IR is %.3f ms and the load %.3f ms\n",
           t_jit / t_pack, t_disk / t_pack, t_ir, t_pack - t_ir);

    /* repeated requests on one context: by request key, by content */
    const pack_job_t *j = NULL;
    for (size_t i = 0; i < m.n_jobs && !j; i++)
        if (m.jobs[i].target->T == T && m.jobs[i].kind != PACK_CUDA_UNIT)
            j = &m.jobs[i];
    wna16_context_t *c = fresh(dir, true);
    w16_repack_kernel_t rk;
    w16_moe_kernel_t mk;
    kir_kernel_t *kk;
    w16_key_t req;
    void *fn;
    if (!c || wna16_context_add_pack(c, pack_path, &err) != WNA16_OK ||
        build(c, j, &kk, &req, &rk, &mk, &err) != WNA16_OK ||
        w16_target_kernel_req(c, T, "bench", req, kk, &fn, NULL, &err) !=
            WNA16_OK) {
        fprintf(stderr, "bench_pack: %s\n", err.message);
        return 1;
    }
    enum { REPS = 200000 };
    double a = bench_seconds();
    for (int r = 0; r < REPS; r++) {
        w16_key_t q = j->kind == PACK_MOE ? w16_moe_request_key(&j->moe, j->stage)
                                          : w16_repack_request_key(&j->repack, false);
        w16_target_kernel_req(c, T, "bench", q, kk, &fn, NULL, &err);
    }
    double by_req = (bench_seconds() - a) / REPS * 1e6;
    /* a key alone, for the split of that time */
    a = bench_seconds();
    uint64_t sink = 0;
    for (int r = 0; r < REPS; r++)
        sink ^= (j->kind == PACK_MOE ? w16_moe_request_key(&j->moe, j->stage)
                                     : w16_repack_request_key(&j->repack, false)).lo;
    double key_us = (bench_seconds() - a) / REPS * 1e6;
    unbuild(j, &rk, &mk); /* built on this context */
    wna16_context_destroy(c);
    c = fresh(dir, false);
    if (!c || build(c, j, &kk, &req, &rk, &mk, &err) != WNA16_OK) {
        fprintf(stderr, "bench_pack: %s\n", err.message);
        return 1;
    }
    w16_target_kernel(c, T, "bench", kk, &fn, NULL, &err); /* compile once */
    int reps = 2000;
    a = bench_seconds();
    for (int r = 0; r < reps; r++)
        w16_target_kernel(c, T, "bench", kk, &fn, NULL, &err);
    double by_content = (bench_seconds() - a) / reps * 1e6;
    printf("a repeated request (%s): by request key (key + pack index + "
           "memory table) %.3f us, of which the key %.3f us; by content "
           "(print and hash the IR) %.1f us%s\n", kk->name, by_req, key_us,
           by_content, sink == 1 ? " " : "");
    unbuild(j, &rk, &mk);
    wna16_context_destroy(c);
    pack_manifest_free(&m);
    wna16_context_destroy(mctx);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_pack: could not remove %s\n", dir);
    return 0;
}
