/*
 * test_cache_limit.c - the kernel cache's size limit. Sizes as
 * $WNA16_CACHE_MAX_SIZE spells them; where a cache's limit comes from (its
 * option, the variable, the default; a bad variable warns once and the
 * default applies), for a cache and for a context's (cache_dir and
 * cache_max_bytes, which touch no file before the first compile). Then
 * eviction on real files: a write that takes the directory over the limit
 * removes the least recently used entries (by mtime, which a disk hit sets)
 * down to 90% of it, so an old entry loaded just before survives and the
 * one just written survives even alone over the limit; stale temporary
 * files go and fresh ones stay; without a limit nothing goes. One info
 * message per trim.
 */
#define _POSIX_C_SOURCE 200809L
#include "cache_test.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t entry_bytes(w16_key_t key) { return 64 + fake_blob_size(key); }

static w16_cache_t *limited(wna16_context_t *ctx, const char *dir,
                            uint64_t max_bytes)
{
    w16_cache_options_t o = {.dir = dir, .max_bytes = max_bytes};
    wna16_error_t err;
    w16_cache_t *c = w16_cache_create(ctx, &o, &err);
    if (!c) {
        fprintf(stderr, "cache: %s\n", err.message);
        exit(1);
    }
    return c;
}

/* Sets a file's access and modification times to `ago` seconds back. */
static void used_ago(const char *path, time_t ago)
{
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= ago;
    t[1] = t[0];
    TU_CHECK(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW) == 0);
}

static bool entry_exists(const char *dir, w16_key_t key)
{
    char path[4300];
    ct_entry_path(dir, key, path, sizeof path);
    return tu_exists(path);
}

static uint64_t trim_target(uint64_t limit)
{
    return limit / 100 * W16_CACHE_TRIM_TO_PERCENT +
           limit % 100 * W16_CACHE_TRIM_TO_PERCENT / 100;
}

static void set_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* ---- sizes and sources ------------------------------------------------------------ */

static void test_parse(void)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"0", 0},
        {"1536", 1536},
        {"2K", 2048},
        {"2k", 2048},
        {"512M", 512ull << 20},
        {"512MiB", 512ull << 20},
        {"1G", 1ull << 30},
        {"3gb", 3ull << 30},
        {"1T", 1ull << 40},
        {"18446744073709551615", UINT64_MAX},
        {"16777215T", 16777215ull << 40},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        TU_CHECK_MSG(w16_cache_parse_size(ok[i].s, &v) && v == ok[i].v,
                     "'%s' -> %llu", ok[i].s, (unsigned long long)v);
    }
    static const char *bad[] = {"",   "abc", "-1",   "1X",  "1KK", "1.5G",
                                " 1", "1 ",  "K",    "1iB", "1Ki",
                                "18446744073709551616", "16777216T"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 7;
        TU_CHECK_MSG(!w16_cache_parse_size(bad[i], &v) && v == 7,
                     "'%s' accepted", bad[i]);
    }
    TU_CHECK(!w16_cache_parse_size(NULL, NULL));
}

static void expect_limit(uint64_t option, wna16_status_t status,
                         uint64_t bytes, w16_cache_limit_source_t source)
{
    uint64_t b = 0;
    w16_cache_limit_source_t s = W16_CACHE_LIMIT_OPTION;
    wna16_error_t err;
    wna16_error_clear(&err);
    TU_CHECK(w16_cache_limit(option, &b, &s, &err) == status);
    TU_CHECK_MSG(b == bytes && s == source, "option %llu: %llu from %s",
                 (unsigned long long)option, (unsigned long long)b,
                 w16_cache_limit_source_name(s));
}

static void test_sources(const char *tmp)
{
    const uint64_t def = WNA16_CACHE_DEFAULT_MAX_BYTES;
    TU_CHECK(def == 2ull << 30);
    set_env("WNA16_CACHE_MAX_SIZE", NULL);
    expect_limit(0, WNA16_OK, def, W16_CACHE_LIMIT_DEFAULT);
    expect_limit(4096, WNA16_OK, 4096, W16_CACHE_LIMIT_OPTION);
    expect_limit(WNA16_CACHE_UNLIMITED, WNA16_OK, WNA16_CACHE_UNLIMITED,
                 W16_CACHE_LIMIT_OPTION);
    set_env("WNA16_CACHE_MAX_SIZE", "");
    expect_limit(0, WNA16_OK, def, W16_CACHE_LIMIT_DEFAULT);
    set_env("WNA16_CACHE_MAX_SIZE", "1K");
    expect_limit(0, WNA16_OK, 1024, W16_CACHE_LIMIT_ENV);
    expect_limit(4096, WNA16_OK, 4096, W16_CACHE_LIMIT_OPTION);
    set_env("WNA16_CACHE_MAX_SIZE", "0");
    expect_limit(0, WNA16_OK, WNA16_CACHE_UNLIMITED, W16_CACHE_LIMIT_ENV);
    set_env("WNA16_CACHE_MAX_SIZE", "lots");
    expect_limit(0, WNA16_EINVAL, def, W16_CACHE_LIMIT_DEFAULT);
    wna16_error_t err;
    uint64_t b;
    w16_cache_limit_source_t s;
    w16_cache_limit(0, &b, &s, &err);
    TU_CHECK_MSG(strstr(err.message, "WNA16_CACHE_MAX_SIZE='lots'"), "'%s'",
                 err.message);
    TU_CHECK(strcmp(w16_cache_limit_source_name(W16_CACHE_LIMIT_DEFAULT),
                    "default") == 0 &&
             strcmp(w16_cache_limit_source_name(W16_CACHE_LIMIT_ENV), "env") ==
                 0 &&
             strcmp(w16_cache_limit_source_name(W16_CACHE_LIMIT_OPTION),
                    "option") == 0);

    /* A cache with a bad variable: one warning at creation, the default. */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/sources", tmp);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    w16_cache_t *c = limited(ctx, dir, 0);
    w16_cache_stats_t st;
    w16_cache_get_stats(c, &st);
    char last[2048];
    ct_last(&cap, last, sizeof last);
    TU_CHECK(st.max_bytes == def && st.max_source == W16_CACHE_LIMIT_DEFAULT);
    TU_CHECK_MSG(ct_warnings(&cap) == 1 && strstr(last, "'lots'") &&
                     strstr(last, "default limit"),
                 "%d warnings, last '%s'", ct_warnings(&cap), last);
    w16_cache_destroy(c);

    /* The variable, then the option over it. */
    set_env("WNA16_CACHE_MAX_SIZE", "3K");
    c = limited(ctx, dir, 0);
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_bytes == 3072 && st.max_source == W16_CACHE_LIMIT_ENV);
    w16_cache_destroy(c);
    c = limited(ctx, dir, 5000);
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_bytes == 5000 && st.max_source == W16_CACHE_LIMIT_OPTION);
    w16_cache_destroy(c);
    /* A memory-only cache has nothing to limit (and does not warn). */
    set_env("WNA16_CACHE_MAX_SIZE", "lots");
    w16_cache_options_t mo = {.memory_only = true};
    c = w16_cache_create(ctx, &mo, NULL);
    w16_cache_get_stats(c, &st);
    TU_CHECK(c && st.max_bytes == WNA16_CACHE_UNLIMITED);
    TU_CHECK(ct_warnings(&cap) == 1);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
    set_env("WNA16_CACHE_MAX_SIZE", NULL);
}

/* The context's options: the cache exists with the context, its directory
 * only after the first compile. */
static void test_context_options(const char *tmp)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/context/cache", tmp);
    set_env("WNA16_CACHE_MAX_SIZE", "1K"); /* the option wins */
    logcap_t cap;
    wna16_context_t *ctx = ct_context_cache(&cap, dir, 1 << 20);
    w16_cache_t *c = NULL;
    wna16_error_t err;
    TU_OK(w16_context_cache(ctx, &c, &err), &err);
    w16_cache_stats_t st;
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_bytes == 1 << 20 &&
             st.max_source == W16_CACHE_LIMIT_OPTION);
    TU_CHECK(w16_cache_dir(c) == NULL && !tu_exists(dir) &&
             !st.disk_readable);
    fake_t f;
    fake_init(&f, ctx);
    TU_CHECK(ct_get(c, &f, ct_key(1)) != NULL);
    TU_CHECK(w16_cache_dir(c) && strcmp(w16_cache_dir(c), dir) == 0);
    TU_CHECK(entry_exists(dir, ct_key(1)));
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.disk_writes == 1 && st.disk_bytes == entry_bytes(ct_key(1)));
    TU_CHECK(ct_warnings(&cap) == 0);
    wna16_context_destroy(ctx);

    /* No limit by option; the directory from the environment. */
    char envdir[4200];
    snprintf(envdir, sizeof envdir, "%s/context/env", tmp);
    char *saved = getenv("WNA16_CACHE_DIR") ? strdup(getenv("WNA16_CACHE_DIR"))
                                            : NULL;
    set_env("WNA16_CACHE_DIR", envdir);
    ctx = ct_context_cache(&cap, NULL, WNA16_CACHE_UNLIMITED);
    TU_OK(w16_context_cache(ctx, &c, &err), &err);
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_bytes == WNA16_CACHE_UNLIMITED &&
             st.max_source == W16_CACHE_LIMIT_OPTION);
    fake_init(&f, ctx);
    TU_CHECK(ct_get(c, &f, ct_key(2)) != NULL);
    TU_CHECK(entry_exists(envdir, ct_key(2)));
    wna16_context_destroy(ctx);

    /* No cache options: made at first use, the variable's limit. */
    ctx = ct_context(&cap);
    TU_OK(w16_context_cache(ctx, &c, &err), &err);
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_bytes == 1024 && st.max_source == W16_CACHE_LIMIT_ENV);
    wna16_context_destroy(ctx);
    set_env("WNA16_CACHE_DIR", saved);
    free(saved);
    set_env("WNA16_CACHE_MAX_SIZE", NULL);
}

/* ---- eviction -------------------------------------------------------------------- */

enum { N_OLD = 10 };

/* Writes N_OLD entries (keys base..) to dir without a limit; entry i is
 * made last used (N_OLD - i) * 100 seconds ago, so entry 0 is the oldest.
 * Returns their total size. */
static uint64_t old_entries(wna16_context_t *ctx, const char *dir,
                            uint64_t base)
{
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = limited(ctx, dir, WNA16_CACHE_UNLIMITED);
    uint64_t total = 0;
    for (uint64_t i = 0; i < N_OLD; i++) {
        TU_CHECK(ct_get(c, &f, ct_key(base + i)) != NULL);
        total += entry_bytes(ct_key(base + i));
    }
    w16_cache_destroy(c);
    for (uint64_t i = 0; i < N_OLD; i++) {
        char path[4300];
        ct_entry_path(dir, ct_key(base + i), path, sizeof path);
        used_ago(path, (time_t)(N_OLD - i) * 100);
    }
    return total;
}

static void test_lru(const char *tmp)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/lru", tmp);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    const uint64_t base = 200;
    uint64_t total = old_entries(ctx, dir, base);

    /* Temporary files: a stale one goes with the trim, a fresh one stays. */
    char stale[4400], fresh_tmp[4400], path[4300];
    ct_entry_path(dir, ct_key(base + 3), path, sizeof path);
    snprintf(stale, sizeof stale, "%s.tmp.1.stale", path);
    snprintf(fresh_tmp, sizeof fresh_tmp, "%s.tmp.2.busy", path);
    TU_CHECK(tu_write_file(stale, "x", 1) == 0 &&
             tu_write_file(fresh_tmp, "y", 1) == 0);
    used_ago(stale, W16_CACHE_STALE_TMP_S + 60);

    /* One new entry takes the directory one byte over the limit. */
    w16_key_t fresh = ct_key(300);
    uint64_t limit = total + entry_bytes(fresh) - 1;
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = limited(ctx, dir, limit);
    TU_CHECK(ct_get(c, &f, ct_key(base)) != NULL); /* the oldest, used now */
    TU_CHECK(atomic_load(&f.compiles) == 0);
    TU_CHECK(ct_get(c, &f, fresh) != NULL);
    TU_CHECK(atomic_load(&f.compiles) == 1);

    /* What must go: entries 1, 2, ... until at most 90% of the limit. */
    uint64_t left = total + entry_bytes(fresh);
    bool gone[N_OLD] = {false};
    uint64_t evicted = 0;
    for (uint64_t i = 1; i < N_OLD && left > trim_target(limit); i++) {
        gone[i] = true;
        left -= entry_bytes(ct_key(base + i));
        evicted++;
    }
    TU_CHECK(evicted >= 1 && evicted < N_OLD - 1);
    w16_cache_stats_t st;
    w16_cache_get_stats(c, &st);
    TU_CHECK_MSG(st.evictions == evicted && st.disk_bytes == left,
                 "%llu evictions (expected %llu), %llu bytes (expected %llu)",
                 (unsigned long long)st.evictions, (unsigned long long)evicted,
                 (unsigned long long)st.disk_bytes, (unsigned long long)left);
    for (uint64_t i = 0; i < N_OLD; i++)
        TU_CHECK_MSG(entry_exists(dir, ct_key(base + i)) == !gone[i],
                     "entry %llu: %s", (unsigned long long)i,
                     gone[i] ? "kept" : "evicted");
    TU_CHECK(entry_exists(dir, fresh));
    TU_CHECK(!tu_exists(stale) && tu_exists(fresh_tmp));
    size_t files = 0;
    uint64_t bytes = 0;
    wna16_error_t err;
    TU_OK(w16_cache_dir_stats(dir, &files, &bytes, &err), &err);
    TU_CHECK(bytes == left && files == N_OLD + 1 - evicted);
    TU_CHECK(bytes <= trim_target(limit));
    char info[2048];
    pthread_mutex_lock(&cap.lock);
    snprintf(info, sizeof info, "%s", cap.last_info);
    int infos = cap.infos;
    pthread_mutex_unlock(&cap.lock);
    TU_CHECK_MSG(infos == 1 && strstr(info, dir) &&
                     strstr(info, "least recently used") &&
                     strstr(info, "(option)"),
                 "%d infos, last '%s'", infos, info);
    TU_CHECK(ct_warnings(&cap) == 0);

    /* Under the limit again: the next write does not trim. */
    TU_CHECK(ct_get(c, &f, ct_key(301)) != NULL);
    w16_cache_get_stats(c, &st);
    if (left + entry_bytes(ct_key(301)) <= limit)
        TU_CHECK(st.evictions == evicted);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* A limit below one entry: everything else goes, the new entry stays. */
static void test_alone_over(const char *tmp)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tiny", tmp);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    old_entries(ctx, dir, 400);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = limited(ctx, dir, 10);
    TU_CHECK(ct_get(c, &f, ct_key(500)) != NULL);
    w16_cache_stats_t st;
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.evictions == N_OLD && st.disk_bytes == entry_bytes(ct_key(500)));
    for (uint64_t i = 0; i < N_OLD; i++)
        TU_CHECK(!entry_exists(dir, ct_key(400 + i)));
    TU_CHECK(entry_exists(dir, ct_key(500)));
    /* The next one pushes it out. */
    TU_CHECK(ct_get(c, &f, ct_key(501)) != NULL);
    TU_CHECK(!entry_exists(dir, ct_key(500)) && entry_exists(dir, ct_key(501)));
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* The limit from the environment, and none. */
static void test_env_and_unlimited(const char *tmp)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/env", tmp);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    uint64_t total = old_entries(ctx, dir, 600);
    char limit[32];
    snprintf(limit, sizeof limit, "%llu", (unsigned long long)(total / 2));
    set_env("WNA16_CACHE_MAX_SIZE", limit);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = limited(ctx, dir, 0);
    TU_CHECK(ct_get(c, &f, ct_key(700)) != NULL);
    w16_cache_stats_t st;
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_source == W16_CACHE_LIMIT_ENV && st.evictions > 0 &&
             st.disk_bytes <= trim_target(total / 2));
    TU_CHECK(!entry_exists(dir, ct_key(600)) && entry_exists(dir, ct_key(700)));
    w16_cache_destroy(c);

    /* "0": no limit, nothing goes, however far over. */
    snprintf(dir, sizeof dir, "%s/unlimited", tmp);
    old_entries(ctx, dir, 800);
    set_env("WNA16_CACHE_MAX_SIZE", "0");
    c = limited(ctx, dir, 0);
    fake_init(&f, ctx);
    TU_CHECK(ct_get(c, &f, ct_key(900)) != NULL);
    w16_cache_get_stats(c, &st);
    TU_CHECK(st.max_bytes == WNA16_CACHE_UNLIMITED && st.evictions == 0);
    for (uint64_t i = 0; i < N_OLD; i++)
        TU_CHECK(entry_exists(dir, ct_key(800 + i)));
    w16_cache_destroy(c);
    set_env("WNA16_CACHE_MAX_SIZE", NULL);
    wna16_context_destroy(ctx);
}

int main(void)
{
    const char *tmp0 = tu_tempdir("cache-limit");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", tmp0);
    test_parse();
    test_sources(tmp);
    test_context_options(tmp);
    test_lru(tmp);
    test_alone_over(tmp);
    test_env_and_unlimited(tmp);
    if (!tu_failures)
        ct_rmtree(tmp);
    return tu_finish("test_cache_limit");
}
