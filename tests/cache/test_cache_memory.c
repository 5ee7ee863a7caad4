/*
 * test_cache_memory.c - the kernel cache's lookups in one thread: a miss
 * compiles once and then hits memory; a second cache on the same directory
 * hits disk; compile and load errors are returned, counted, not cached and
 * retried; handles are unloaded at destroy; the memory-only option; the
 * default directory ($WNA16_CACHE_DIR, $XDG_CACHE_HOME, $HOME) and its
 * 0700 creation; argument checks; and a failing allocator swept over every
 * allocation proves each error path frees what it took.
 */
#define _POSIX_C_SOURCE 200809L
#include "cache_test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void test_miss_then_hit(const char *dir)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    w16_key_t k = ct_key(1);
    void *h1 = ct_get(c, &f, k);
    void *h2 = ct_get(c, &f, k);
    TU_CHECK(h1 && h1 == h2);
    TU_CHECK(atomic_load(&f.compiles) == 1);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.memory_hits == 1 && s.compiles == 1 && s.disk_hits == 0);
    TU_CHECK(s.disk_writes == 1 && s.entries == 1 && s.errors == 0);
    TU_CHECK(s.disk_readable && s.disk_writable);
    TU_CHECK(strcmp(w16_cache_dir(c), dir) == 0);
    char path[4200];
    ct_entry_path(dir, k, path, sizeof path);
    size_t n = 0;
    void *bytes = tu_read_file(path, &n);
    TU_CHECK(bytes && n == 64 + fake_blob_size(k));
    free(bytes);

    /* A second cache object on the same directory: disk, no compile. */
    fake_t f2;
    fake_init(&f2, ctx);
    w16_cache_t *c2 = ct_cache(ctx, dir);
    void *h3 = ct_get(c2, &f2, k);
    TU_CHECK(h3 && h3 != h1);
    TU_CHECK(atomic_load(&f2.compiles) == 0 && atomic_load(&f2.loads) == 1);
    w16_cache_get_stats(c2, &s);
    TU_CHECK(s.disk_hits == 1 && s.compiles == 0 && s.disk_writes == 0);
    TU_CHECK(ct_get(c2, &f2, k) == h3);
    w16_cache_get_stats(c2, &s);
    TU_CHECK(s.memory_hits == 1 && s.disk_hits == 1);

    w16_cache_destroy(c);
    w16_cache_destroy(c2);
    TU_CHECK(atomic_load(&f.unloads) == 1 && atomic_load(&f2.unloads) == 1);
    TU_CHECK(ct_warnings(&cap) == 0);
    wna16_context_destroy(ctx);
}

static void test_errors_not_cached(const char *dir)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    w16_cache_loader_t l = fake_loader(&f);
    w16_key_t k = ct_key(2);
    void *h = NULL;
    wna16_error_t err;

    atomic_store(&f.fail_compiles, 1);
    TU_CHECK(w16_cache_get(c, k, &l, &h, &err) == WNA16_ESPEC);
    TU_CHECK(strstr(err.message, FAKE_COMPILE_ERROR) != NULL);
    char path[4200];
    ct_entry_path(dir, k, path, sizeof path);
    TU_CHECK(!tu_exists(path));
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.errors == 1 && s.entries == 0 && s.compiles == 1);
    /* The next get retries and succeeds. */
    TU_CHECK(w16_cache_get(c, k, &l, &h, &err) == WNA16_OK);
    TU_CHECK(fake_handle_ok(h, k) && atomic_load(&f.compiles) == 2);

    /* A blob the loader refuses is an error and is not published. */
    w16_key_t k2 = ct_key(3);
    atomic_store(&f.refuse_loads, 1);
    TU_CHECK(w16_cache_get(c, k2, &l, &h, &err) == WNA16_EUNAVAILABLE);
    TU_CHECK(strstr(err.message, "no device") != NULL);
    ct_entry_path(dir, k2, path, sizeof path);
    TU_CHECK(!tu_exists(path));
    TU_CHECK(w16_cache_get(c, k2, &l, &h, &err) == WNA16_OK);
    TU_CHECK(tu_exists(path));
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.errors == 2 && s.entries == 2 && s.compiles == 4);

    w16_cache_destroy(c);
    TU_CHECK(atomic_load(&f.unloads) == 2);
    TU_CHECK(ct_warnings(&cap) == 0);
    wna16_context_destroy(ctx);
}

static wna16_status_t silent_compile(void *user, w16_key_t key, void **blob,
                                     size_t *size, wna16_error_t *err)
{
    return WNA16_EUNSUPPORTED; /* no message */
}

static void test_arguments(void)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_options_t o = {.memory_only = true};
    wna16_error_t err;
    TU_CHECK(w16_cache_create(NULL, &o, &err) == NULL &&
             err.status == WNA16_EINVAL);
    w16_cache_t *c = w16_cache_create(ctx, &o, &err);
    TU_CHECK(c && w16_cache_dir(c) == NULL);
    w16_cache_loader_t l = fake_loader(&f), bad = l;
    bad.load = NULL;
    void *h;
    TU_CHECK(w16_cache_get(NULL, ct_key(1), &l, &h, &err) == WNA16_EINVAL);
    TU_CHECK(w16_cache_get(c, ct_key(1), NULL, &h, &err) == WNA16_EINVAL);
    TU_CHECK(w16_cache_get(c, ct_key(1), &bad, &h, &err) == WNA16_EINVAL);
    TU_CHECK(w16_cache_get(c, ct_key(1), &l, NULL, &err) == WNA16_EINVAL);
    TU_CHECK(w16_cache_get(c, ct_key(1), &l, &h, NULL) == WNA16_OK);

    w16_cache_loader_t silent = {.compile = silent_compile,
                                 .load = l.load, .user = &f};
    TU_CHECK(w16_cache_get(c, ct_key(9), &silent, &h, &err) ==
             WNA16_EUNSUPPORTED);
    TU_CHECK(strstr(err.message, "compiling kernel") != NULL);
    w16_cache_destroy(c);
    w16_cache_destroy(NULL);
    wna16_context_destroy(ctx);
}

static void test_memory_only(const char *tmp)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/never", tmp);
    w16_cache_options_t o = {.dir = dir, .memory_only = true};
    w16_cache_t *c = w16_cache_create(ctx, &o, NULL);
    TU_CHECK(ct_get(c, &f, ct_key(4)) == ct_get(c, &f, ct_key(4)));
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(!s.disk_readable && !s.disk_writable && s.disk_writes == 0);
    TU_CHECK(!tu_exists(dir) && ct_warnings(&cap) == 0);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

static void set_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

static void expect_default(const char *cache, const char *xdg,
                           const char *home, const char *expect)
{
    set_env("WNA16_CACHE_DIR", cache);
    set_env("XDG_CACHE_HOME", xdg);
    set_env("HOME", home);
    char out[4096];
    wna16_status_t st = w16_cache_default_dir(out, sizeof out);
    if (!expect) {
        TU_CHECK(st == WNA16_ENOTFOUND);
        return;
    }
    TU_CHECK_MSG(st == WNA16_OK && strcmp(out, expect) == 0, "got '%s'", out);
}

/* Changes the process environment; the originals are restored. */
static void test_default_dir(const char *tmp)
{
    char *saved[3];
    const char *names[3] = {"WNA16_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    for (int i = 0; i < 3; i++)
        saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;

    expect_default("/c/w", "/x", "/h", "/c/w");
    expect_default("", "/x", "/h", "/x/wna16");
    expect_default(NULL, "/x", "/h", "/x/wna16");
    expect_default(NULL, "relative", "/h", "/h/.cache/wna16");
    expect_default(NULL, "", "/h", "/h/.cache/wna16");
    expect_default(NULL, NULL, "/h", "/h/.cache/wna16");
    expect_default(NULL, NULL, NULL, NULL);
    char small[8];
    set_env("HOME", "/a/long/home/directory");
    TU_CHECK(w16_cache_default_dir(small, sizeof small) == WNA16_ELIMIT);

    /* A cache without opts->dir creates $HOME/.cache/wna16, mode 0700. */
    set_env("HOME", tmp);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = w16_cache_create(ctx, NULL, NULL);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/.cache/wna16", tmp);
    TU_CHECK(c && strcmp(w16_cache_dir(c), dir) == 0);
    struct stat st;
    TU_CHECK(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    ct_get(c, &f, ct_key(5));
    char path[4300];
    ct_entry_path(dir, ct_key(5), path, sizeof path);
    TU_CHECK(tu_exists(path));
    w16_cache_destroy(c);

    /* No variable at all: memory only, with one warning. */
    unsetenv("HOME");
    c = w16_cache_create(ctx, NULL, NULL);
    TU_CHECK(c && w16_cache_dir(c) == NULL && ct_warnings(&cap) == 1);
    TU_CHECK(ct_get(c, &f, ct_key(6)) != NULL);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);

    for (int i = 0; i < 3; i++) {
        set_env(names[i], saved[i]);
        free(saved[i]);
    }
}

/* ---- a failing allocator -------------------------------------------------------- */

typedef struct failing {
    long allocs, fail_at; /* fail allocation number fail_at (0: never) */
    long long outstanding;
} failing_t;

static void *fa_alloc(void *user, size_t size)
{
    failing_t *fa = user;
    if (++fa->allocs == fa->fail_at)
        return NULL;
    fa->outstanding += (long long)size;
    return malloc(size);
}

static void *fa_realloc(void *user, void *p, size_t old, size_t size)
{
    failing_t *fa = user;
    if (++fa->allocs == fa->fail_at)
        return NULL;
    void *q = realloc(p, size);
    if (q)
        fa->outstanding += (long long)size - (long long)old;
    return q;
}

static void fa_free(void *user, void *p, size_t size)
{
    failing_t *fa = user;
    fa->outstanding -= (long long)size;
    free(p);
}

/* One round: create, get three keys (failures allowed), then get them
 * again with the allocator healed; returns false once no allocation
 * failed (the sweep is over). */
static bool alloc_round(const char *dir, bool cold, long fail_at)
{
    if (dir && cold)
        w16_cache_clear(dir, NULL, NULL);
    failing_t fa = {0};
    wna16_allocator_t a = {fa_alloc, fa_realloc, fa_free, &fa};
    wna16_context_options_t o = {.allocator = &a, .no_builtin_specs = true,
                                 .log_level = WNA16_LOG_ERROR};
    wna16_context_t *ctx = NULL;
    if (wna16_context_create(&o, &ctx, NULL) != WNA16_OK)
        return false;
    long long base = fa.outstanding;
    fa.fail_at = fa.allocs + fail_at;
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_loader_t l = fake_loader(&f);
    w16_cache_options_t co = {.dir = dir, .memory_only = !dir};
    w16_cache_t *c = w16_cache_create(ctx, &co, NULL);
    void *h;
    for (uint64_t i = 0; c && i < 3; i++)
        w16_cache_get(c, ct_key(100 + i), &l, &h, NULL);
    bool failed = fa.allocs >= fa.fail_at;
    fa.fail_at = 0;
    for (uint64_t i = 0; c && i < 3; i++) {
        TU_CHECK(w16_cache_get(c, ct_key(100 + i), &l, &h, NULL) == WNA16_OK);
        TU_CHECK(fake_handle_ok(h, ct_key(100 + i)));
    }
    w16_cache_destroy(c);
    TU_CHECK_MSG(fa.outstanding == base, "fail_at %ld: %lld bytes leaked",
                 fail_at, fa.outstanding - base);
    wna16_context_destroy(ctx);
    TU_CHECK(fa.outstanding == 0);
    return failed;
}

/* The fast path allocates nothing: counted with the same allocator. */
static void test_hit_allocates_nothing(const char *dir)
{
    failing_t fa = {0};
    wna16_allocator_t a = {fa_alloc, fa_realloc, fa_free, &fa};
    wna16_context_options_t o = {.allocator = &a, .no_builtin_specs = true};
    wna16_context_t *ctx = NULL;
    TU_CHECK(wna16_context_create(&o, &ctx, NULL) == WNA16_OK);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    for (uint64_t i = 0; i < 100; i++)
        ct_get(c, &f, ct_key(7000 + i));
    long before = fa.allocs;
    w16_cache_loader_t l = fake_loader(&f);
    void *h;
    int bad = 0;
    for (int round = 0; round < 100; round++)
        for (uint64_t i = 0; i < 100; i++)
            bad += w16_cache_get(c, ct_key(7000 + i), &l, &h, NULL) !=
                   WNA16_OK;
    TU_CHECK(bad == 0 && fa.allocs == before);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.memory_hits == 100 * 100 && s.entries == 100);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
    TU_CHECK(fa.outstanding == 0);
}

static void test_failing_allocator(const char *tmp)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/alloc", tmp);
    /* memory only; disk with compiles and writes; disk hits */
    const struct { const char *dir; bool cold; } sweeps[] = {
        {NULL, true}, {dir, true}, {dir, false}};
    for (size_t i = 0; i < sizeof sweeps / sizeof sweeps[0]; i++) {
        long n = 1;
        while (alloc_round(sweeps[i].dir, sweeps[i].cold, n) && n < 1000)
            n++;
        TU_CHECK(n > 5 && n < 1000);
    }
}

int main(void)
{
    const char *tmp = tu_tempdir("cache-memory");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/cache", tmp);
    test_miss_then_hit(dir);
    test_errors_not_cached(dir);
    test_arguments();
    test_memory_only(tmp);
    test_hit_allocates_nothing(dir);
    test_failing_allocator(tmp);
    test_default_dir(tmp);
    if (!tu_failures)
        ct_rmtree(tmp);
    return tu_finish("test_cache_memory");
}
