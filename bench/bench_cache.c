/*
 * bench_cache.c - how fast the kernel cache answers, against baselines
 * measured in the same run: a memory hit (w16_cache_get on a present key)
 * against one uncontended mutex lock/unlock pair and against hashing a
 * 64-byte key, and a disk hit for a 64 KiB blob (a fresh cache object, so
 * the entry is opened, read, verified and handed to a trivial loader)
 * against open + read(2) + close of the same file. Page cache warm in both.
 * Prints a table and ratios; no pass/fail. Timings of short operations are
 * per batch of 1000 (one clock read per batch), the median over batches.
 *
 *   bench_cache [--lookups N] [--disk-reps N] [--dir DIR]
 */
#define _POSIX_C_SOURCE 200809L
#include "base/base.h"
#include "bench/bench_util.h"
#include "runtime/cache/cache.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(WNA16_HAVE_XXHASH)
#include <xxhash.h>
#endif

enum { BATCH = 1000, BLOB = 64 * 1024 };

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- a loader with a 64 KiB artifact and a trivial load -------------------- */

static wna16_status_t bench_compile(void *user, w16_key_t key, void **blob,
                                    size_t *size, wna16_error_t *err)
{
    unsigned char *b = w16_alloc(user, BLOB);
    if (!b)
        return w16_err_nomem(err, "bench compile");
    for (size_t i = 0; i < BLOB; i++)
        b[i] = (unsigned char)(i * 31 + key.lo);
    *blob = b;
    *size = BLOB;
    return WNA16_OK;
}

static wna16_status_t bench_load(void *user, const void *blob, size_t size,
                                 void **handle, wna16_error_t *err)
{
    *handle = (void *)blob; /* only identity matters; never dereferenced */
    return WNA16_OK;
}

/* ---- the measurements ------------------------------------------------------- */

static double time_hits(w16_cache_t *c, const w16_cache_loader_t *l,
                        w16_key_t key, size_t batches, double *samples)
{
    void *h;
    for (size_t b = 0; b < batches; b++) {
        double t0 = (bench_seconds() * 1e9);
        for (int i = 0; i < BATCH; i++)
            w16_cache_get(c, key, l, &h, NULL);
        samples[b] = ((bench_seconds() * 1e9) - t0) / BATCH;
    }
    return median(samples, batches);
}

static double time_mutex(size_t batches, double *samples)
{
    pthread_mutex_t m;
    pthread_mutex_init(&m, NULL);
    for (size_t b = 0; b < batches; b++) {
        double t0 = (bench_seconds() * 1e9);
        for (int i = 0; i < BATCH; i++) {
            pthread_mutex_lock(&m);
            pthread_mutex_unlock(&m);
        }
        samples[b] = ((bench_seconds() * 1e9) - t0) / BATCH;
    }
    pthread_mutex_destroy(&m);
    return median(samples, batches);
}

/* What a caller pays to build a key from 64 bytes: the keyer, and (when
 * present) a bare XXH3-128. */
static double time_keyer(size_t batches, double *samples, bool bare)
{
    unsigned char buf[64] = {1, 2, 3};
    volatile uint64_t sink = 0;
    for (size_t b = 0; b < batches; b++) {
        double t0 = (bench_seconds() * 1e9);
        for (int i = 0; i < BATCH; i++) {
            buf[0] = (unsigned char)i;
#if defined(WNA16_HAVE_XXHASH)
            if (bare) {
                sink += XXH3_128bits(buf, sizeof buf).low64;
                continue;
            }
#endif
            w16_keyer_t k;
            w16_keyer_init(&k);
            w16_keyer_bytes(&k, buf, sizeof buf);
            sink += w16_keyer_done(&k).lo;
        }
        samples[b] = ((bench_seconds() * 1e9) - t0) / BATCH;
    }
    (void)sink;
    return median(samples, batches);
}

static double time_disk_hits(wna16_context_t *ctx, const char *dir,
                             const w16_cache_loader_t *l, w16_key_t key,
                             int reps, double *samples)
{
    w16_cache_options_t o = {.dir = dir};
    for (int r = 0; r < reps; r++) {
        w16_cache_t *c = w16_cache_create(ctx, &o, NULL);
        void *h;
        double t0 = (bench_seconds() * 1e9);
        w16_cache_get(c, key, l, &h, NULL);
        samples[r] = ((bench_seconds() * 1e9) - t0) / 1e6;
        w16_cache_destroy(c);
    }
    return median(samples, (size_t)reps);
}

static double time_read(const char *path, int reps, double *samples)
{
    unsigned char *buf = malloc(BLOB + 4096);
    for (int r = 0; r < reps; r++) {
        double t0 = (bench_seconds() * 1e9);
        int fd = open(path, O_RDONLY);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0) {
            size_t got = 0;
            ssize_t n;
            while (got < (size_t)st.st_size &&
                   (n = read(fd, buf + got, (size_t)st.st_size - got)) > 0)
                got += (size_t)n;
        }
        if (fd >= 0)
            close(fd);
        samples[r] = ((bench_seconds() * 1e9) - t0) / 1e6;
    }
    free(buf);
    return median(samples, (size_t)reps);
}

/* ---- main --------------------------------------------------------------------- */

static bool parse_args(int argc, char **argv, long *lookups, long *reps,
                       const char **dir)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            return false;
        if (strcmp(a, "--lookups") == 0)
            *lookups = atol(argv[++i]);
        else if (strcmp(a, "--disk-reps") == 0)
            *reps = atol(argv[++i]);
        else if (strcmp(a, "--dir") == 0)
            *dir = argv[++i];
        else
            return false;
    }
    return *lookups >= BATCH && *reps > 0;
}

int main(int argc, char **argv)
{
    long lookups = 1000000, reps = 200;
    const char *dir = NULL;
    if (!parse_args(argc, argv, &lookups, &reps, &dir)) {
        fprintf(stderr, "usage: bench_cache [--lookups N>=%d] [--disk-reps N] "
                        "[--dir DIR]\n", BATCH);
        return 2;
    }
    char tmp[] = "/tmp/wna16-bench-cache-XXXXXX";
    if (!dir && !(dir = mkdtemp(tmp))) {
        perror("mkdtemp");
        return 1;
    }
    wna16_context_t *ctx = NULL;
    wna16_context_options_t co = {.no_builtin_specs = true};
    wna16_error_t err;
    if (wna16_context_create(&co, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    w16_cache_loader_t l = {bench_compile, bench_load, NULL, ctx};
    w16_keyer_t k;
    w16_keyer_init(&k);
    w16_keyer_str(&k, "bench_cache 64 KiB");
    w16_key_t key = w16_keyer_done(&k);

    w16_cache_options_t o = {.dir = dir};
    w16_cache_t *c = w16_cache_create(ctx, &o, &err);
    void *h;
    if (!c || w16_cache_get(c, key, &l, &h, &err) != WNA16_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    size_t batches = (size_t)(lookups / BATCH);
    size_t ns = batches > (size_t)reps ? batches : (size_t)reps;
    double *samples = malloc(ns * sizeof *samples);
    double hit = time_hits(c, &l, key, batches, samples);
    double mutex = time_mutex(batches, samples);
    double keyer = time_keyer(batches, samples, false);
    double xxh = time_keyer(batches, samples, true);
    w16_cache_destroy(c);

    char path[4200], hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    snprintf(path, sizeof path, "%s/%.2s/%s.wk", dir, hex, hex);
    double disk = time_disk_hits(ctx, dir, &l, key, (int)reps, samples);
    double rd = time_read(path, (int)reps, samples);

    printf("kernel cache (hash %s), %ld lookups in batches of %d, %ld disk "
           "reps, dir %s\n\n", w16_hash_name(), lookups, BATCH, reps,
           dir);
    printf("%-44s %12s\n", "operation", "median");
    printf("%-44s %9.1f ns\n", "memory hit: w16_cache_get", hit);
    printf("%-44s %9.1f ns\n", "  baseline: mutex lock+unlock (uncontended)",
           mutex);
#if defined(WNA16_HAVE_XXHASH)
    printf("%-44s %9.1f ns\n", "  baseline: XXH3-128 of 64 bytes", xxh);
#else
    (void)xxh;
#endif
    printf("%-44s %9.1f ns\n", "  for scale: w16_keyer of one 64-byte field",
           keyer);
    printf("%-44s %9.4f ms\n", "disk hit, 64 KiB blob (fresh cache object)",
           disk);
    printf("%-44s %9.4f ms\n", "  baseline: open+fstat+read(2)+close", rd);
    printf("\nratios: memory hit / mutex pair = %.2f", hit / mutex);
#if defined(WNA16_HAVE_XXHASH)
    printf(", memory hit / XXH3-128 = %.2f", hit / xxh);
#endif
    printf(", disk hit / read(2) = %.2f\n", disk / rd);

    free(samples);
    if (dir == tmp) { /* our own temporary directory: leave nothing */
        w16_cache_clear(dir, NULL, NULL);
        *strrchr(path, '/') = '\0';
        rmdir(path);
        rmdir(dir);
    }
    wna16_context_destroy(ctx);
    return 0;
}
