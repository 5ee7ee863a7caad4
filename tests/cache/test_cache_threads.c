/*
 * test_cache_threads.c - the kernel cache under concurrency: 8 threads
 * asking for one key at once compile it once and share one handle; 8
 * threads over 64 keys (each in its own order) compile each key once; a
 * compile error reaches every waiter and the next request retries; two
 * cache objects and then two forked processes compile the same keys into
 * one directory at the same time, and every file left is valid. Checks run
 * on the main thread (the check counters are not atomic).
 */
#define _POSIX_C_SOURCE 200809L
#include "cache_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { THREADS = 8, KEYS = 64 };

typedef struct job {
    w16_cache_t *cache;
    fake_t *fake;
    pthread_barrier_t *start;
    int index;
    uint64_t first_key, nkeys;
    void *handles[KEYS];
    wna16_status_t status[KEYS];
    char message[256];
} job_t;

static void *worker(void *arg)
{
    job_t *j = arg;
    w16_cache_loader_t l = fake_loader(j->fake);
    pthread_barrier_wait(j->start);
    for (uint64_t n = 0; n < j->nkeys; n++) {
        uint64_t i = (n + (uint64_t)j->index * 7) % j->nkeys; /* own order */
        wna16_error_t err;
        err.message[0] = '\0';
        j->status[i] = w16_cache_get(j->cache, ct_key(j->first_key + i), &l,
                                     &j->handles[i], &err);
        if (j->status[i] != WNA16_OK)
            snprintf(j->message, sizeof j->message, "%s", err.message);
    }
    return NULL;
}

/* Runs THREADS workers over keys [first, first + nkeys); caches[t % 2]. */
static void run_jobs(w16_cache_t *caches[2], fake_t *fakes[2], job_t *jobs,
                     uint64_t first, uint64_t nkeys)
{
    pthread_t tid[THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    for (int t = 0; t < THREADS; t++) {
        memset(&jobs[t], 0, sizeof jobs[t]);
        jobs[t] = (job_t){.cache = caches[t % 2], .fake = fakes[t % 2],
                          .start = &start, .index = t, .first_key = first,
                          .nkeys = nkeys};
        pthread_create(&tid[t], NULL, worker, &jobs[t]);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&start);
}

static void test_one_key(const char *dir)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    f.compile_delay_ms = 50; /* everyone arrives while it compiles */
    w16_cache_t *c = ct_cache(ctx, dir);
    static job_t jobs[THREADS];
    run_jobs((w16_cache_t *[2]){c, c}, (fake_t *[2]){&f, &f}, jobs, 100, 1);
    for (int t = 0; t < THREADS; t++) {
        TU_CHECK(jobs[t].status[0] == WNA16_OK);
        TU_CHECK(jobs[t].handles[0] == jobs[0].handles[0]);
    }
    TU_CHECK(fake_handle_ok(jobs[0].handles[0], ct_key(100)));
    TU_CHECK(atomic_load(&f.compiles) == 1 && atomic_load(&f.loads) == 1);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.compiles == 1 && s.memory_hits == THREADS - 1);
    TU_CHECK(s.entries == 1 && s.disk_writes == 1);
    w16_cache_destroy(c);
    TU_CHECK(atomic_load(&f.unloads) == 1);
    wna16_context_destroy(ctx);
}

static void test_many_keys(const char *dir)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    f.compile_delay_ms = 1;
    w16_cache_t *c = ct_cache(ctx, dir);
    static job_t jobs[THREADS];
    run_jobs((w16_cache_t *[2]){c, c}, (fake_t *[2]){&f, &f}, jobs, 200, KEYS);
    int bad = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < KEYS; i++)
            bad += jobs[t].status[i] != WNA16_OK ||
                   jobs[t].handles[i] != jobs[0].handles[i] ||
                   !fake_handle_ok(jobs[t].handles[i], ct_key(200 + (uint64_t)i));
    TU_CHECK(bad == 0);
    TU_CHECK(atomic_load(&f.compiles) == KEYS);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.entries == KEYS && s.compiles == KEYS);
    TU_CHECK(s.memory_hits == (uint64_t)(THREADS - 1) * KEYS);
    w16_cache_destroy(c);
    TU_CHECK(atomic_load(&f.unloads) == KEYS);
    wna16_context_destroy(ctx);
}

static void test_error_to_all_waiters(const char *dir)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    f.compile_delay_ms = 300; /* all 8 are waiting when it fails */
    atomic_store(&f.fail_compiles, 1);
    w16_cache_t *c = ct_cache(ctx, dir);
    static job_t jobs[THREADS];
    run_jobs((w16_cache_t *[2]){c, c}, (fake_t *[2]){&f, &f}, jobs, 300, 1);
    for (int t = 0; t < THREADS; t++) {
        TU_CHECK(jobs[t].status[0] == WNA16_ESPEC);
        TU_CHECK_MSG(strstr(jobs[t].message, FAKE_COMPILE_ERROR), "'%s'",
                     jobs[t].message);
    }
    TU_CHECK(atomic_load(&f.compiles) == 1);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.errors == 1 && s.entries == 0);
    /* Not cached: the next request compiles again and succeeds. */
    f.compile_delay_ms = 0;
    TU_CHECK(ct_get(c, &f, ct_key(300)) != NULL);
    TU_CHECK(atomic_load(&f.compiles) == 2);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* Every entry file in dir is valid (a fresh cache loads all keys without
 * compiling or complaining) and no temporary file is left. */
static void check_dir(const char *dir, uint64_t first, uint64_t n)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    for (uint64_t i = 0; i < n; i++)
        ct_get(c, &f, ct_key(first + i));
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK_MSG(s.disk_hits == n && s.compiles == 0 && s.corrupt == 0,
                 "disk hits %llu compiles %llu corrupt %llu",
                 (unsigned long long)s.disk_hits,
                 (unsigned long long)s.compiles, (unsigned long long)s.corrupt);
    TU_CHECK(ct_warnings(&cap) == 0);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);

    int tmps = 0;
    DIR *top = opendir(dir);
    struct dirent *de;
    while (top && (de = readdir(top))) {
        if (de->d_name[0] == '.')
            continue;
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
        DIR *d = opendir(sub);
        struct dirent *fe;
        while (d && (fe = readdir(d)))
            tmps += strstr(fe->d_name, ".tmp.") != NULL;
        if (d)
            closedir(d);
    }
    if (top)
        closedir(top);
    TU_CHECK(tmps == 0);
}

/* Two cache objects in one process race on the same files. */
static void test_two_caches(const char *dir)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f1, f2;
    fake_init(&f1, ctx);
    fake_init(&f2, ctx);
    w16_cache_t *c1 = ct_cache(ctx, dir), *c2 = ct_cache(ctx, dir);
    static job_t jobs[THREADS];
    run_jobs((w16_cache_t *[2]){c1, c2}, (fake_t *[2]){&f1, &f2}, jobs, 400,
             KEYS);
    int bad = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < KEYS; i++)
            bad += jobs[t].status[i] != WNA16_OK ||
                   !fake_handle_ok(jobs[t].handles[i], ct_key(400 + (uint64_t)i));
    TU_CHECK(bad == 0);
    TU_CHECK(ct_warnings(&cap) == 0);
    w16_cache_destroy(c1);
    w16_cache_destroy(c2);
    wna16_context_destroy(ctx);
    check_dir(dir, 400, KEYS);
}

/* A child: waits for the go byte, gets every key, exits 0 if all good. */
static int child(const char *dir, int go_fd, uint64_t first, uint64_t n)
{
    char b;
    if (read(go_fd, &b, 1) != 1)
        return 3;
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    f.compile_delay_ms = 1; /* keeps the two children overlapping */
    w16_cache_t *c = ct_cache(ctx, dir);
    w16_cache_loader_t l = fake_loader(&f);
    int bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        void *h = NULL;
        bad += w16_cache_get(c, ct_key(first + i), &l, &h, NULL) != WNA16_OK ||
               !fake_handle_ok(h, ct_key(first + i));
    }
    bad += ct_warnings(&cap) != 0;
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
    return bad ? 1 : 0;
}

static void test_two_processes(const char *dir)
{
    for (int round = 0; round < 3; round++) {
        int go[2];
        TU_CHECK(pipe(go) == 0);
        pid_t pids[2];
        for (int p = 0; p < 2; p++) {
            pids[p] = fork();
            if (pids[p] == 0) {
                close(go[1]);
                _exit(child(dir, go[0], 500, KEYS));
            }
        }
        close(go[0]);
        TU_CHECK(write(go[1], "gg", 2) == 2); /* both start together */
        close(go[1]);
        for (int p = 0; p < 2; p++) {
            int status = 0;
            TU_CHECK(pids[p] > 0 && waitpid(pids[p], &status, 0) == pids[p]);
            TU_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                         "child %d: status %d", p, status);
        }
        check_dir(dir, 500, KEYS);
        w16_cache_clear(dir, NULL, NULL);
    }
}

int main(void)
{
    const char *tmp = tu_tempdir("cache-threads");
    char dirs[5][4200];
    for (int i = 0; i < 5; i++)
        snprintf(dirs[i], sizeof dirs[i], "%s/c%d", tmp, i);
    /* Forks first, before this process has started any thread. */
    test_two_processes(dirs[0]);
    test_one_key(dirs[1]);
    test_many_keys(dirs[2]);
    test_error_to_all_waiters(dirs[3]);
    test_two_caches(dirs[4]);
    if (!tu_failures)
        ct_rmtree(tmp);
    return tu_finish("test_cache_threads");
}
