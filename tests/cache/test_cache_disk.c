/*
 * test_cache_disk.c - the kernel cache's disk level against damaged and
 * hostile directories: entries with a flipped payload or header byte, a
 * wrong magic, version or size, another key's file renamed into place,
 * trailing bytes, truncation at many points (0 bytes, inside the header,
 * inside the payload), a file over the 1 GiB limit, a directory where a
 * file should be. Each is recompiled and rewritten with exactly one warning
 * per cache naming the file. Unwritable directories (mode 0500 when not
 * running as root, a path under a regular file always) degrade to memory
 * with one warning. Then dir_stats and clear, which must touch only the
 * cache's own files. Runs under ASan+UBSan: the reader parses untrusted
 * bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include "cache_test.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(WNA16_HAVE_XXHASH)
#include <xxhash.h>
#endif

/* The header checksum as cache.c computes it, so tests can forge headers
 * that pass it and must be refused for another reason. */
static uint32_t header_csum(const unsigned char *h)
{
#if defined(WNA16_HAVE_XXHASH)
    if (strcmp(w16_hash_name(), "xxh3") == 0)
        return (uint32_t)XXH3_64bits(h, 60);
#endif
    return (uint32_t)w16_hash_builtin128(h, 60).lo;
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void reseal(unsigned char *h) { put32(h + 60, header_csum(h)); }

/* Compiles key into dir with a fresh cache; returns the entry's bytes. */
static unsigned char *populate(const char *dir, w16_key_t key, size_t *n)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    ct_get(c, &f, key);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
    char path[4200];
    ct_entry_path(dir, key, path, sizeof path);
    return tu_read_file(path, n);
}

/* A fresh cache must recompile key (one compile, one corrupt, exactly one
 * warning naming the file) and leave a valid entry behind. */
static void expect_recompiled(const char *dir, w16_key_t key, const char *what)
{
    char path[4200];
    ct_entry_path(dir, key, path, sizeof path);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    TU_CHECK(ct_get(c, &f, key) != NULL);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK_MSG(atomic_load(&f.compiles) == 1 && s.corrupt == 1 &&
                     s.disk_hits == 0 && s.disk_writes == 1,
                 "%s: compiles %d corrupt %llu", what,
                 atomic_load(&f.compiles), (unsigned long long)s.corrupt);
    char last[2048];
    ct_last(&cap, last, sizeof last);
    TU_CHECK_MSG(ct_warnings(&cap) == 1 && strstr(last, path),
                 "%s: %d warnings, last '%s'", what, ct_warnings(&cap), last);
    w16_cache_destroy(c);

    /* Rewritten: the next cache gets a disk hit. */
    fake_init(&f, ctx);
    c = ct_cache(ctx, dir);
    TU_CHECK(ct_get(c, &f, key) != NULL);
    TU_CHECK_MSG(atomic_load(&f.compiles) == 0, "%s: not rewritten", what);
    w16_cache_destroy(c);
    TU_CHECK(ct_warnings(&cap) == 1);
    wna16_context_destroy(ctx);
}

typedef void (*mutate_fn)(unsigned char *b, size_t *n);

static void flip_payload(unsigned char *b, size_t *n) { b[*n - 1] ^= 0x40; }
static void flip_header(unsigned char *b, size_t *n) { b[33] ^= 1; }
static void flip_csum(unsigned char *b, size_t *n) { b[61] ^= 0x80; }
static void bad_magic(unsigned char *b, size_t *n) { memcpy(b, "NOTWNA16", 8); }
static void bad_magic_sealed(unsigned char *b, size_t *n)
{
    b[7] = 'X';
    reseal(b);
}
static void bad_version(unsigned char *b, size_t *n)
{
    put32(b + 8, 2);
    reseal(b);
}
static void bad_header_size(unsigned char *b, size_t *n)
{
    put32(b + 12, 128);
    reseal(b);
}
static void bad_algo(unsigned char *b, size_t *n)
{
    put32(b + 48, 7);
    reseal(b);
}
static void bad_reserved(unsigned char *b, size_t *n)
{
    put32(b + 52, 1);
    reseal(b);
}
static void bad_size(unsigned char *b, size_t *n)
{
    b[32] ^= 4; /* payload size no longer matches the file */
    reseal(b);
}
static void trailing(unsigned char *b, size_t *n) { b[(*n)++] = 0; }

static void test_corrupt(const char *tmp)
{
    static const struct {
        const char *what;
        mutate_fn fn;
    } cases[] = {
        {"flipped payload byte", flip_payload},
        {"flipped header byte", flip_header},
        {"flipped header checksum", flip_csum},
        {"wrong magic", bad_magic},
        {"wrong magic, valid checksum", bad_magic_sealed},
        {"format version 2", bad_version},
        {"header size 128", bad_header_size},
        {"unknown hash algorithm", bad_algo},
        {"reserved field set", bad_reserved},
        {"payload size mismatch", bad_size},
        {"trailing byte", trailing},
    };
    char dir[4200], path[4200];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(dir, sizeof dir, "%s/corrupt%zu", tmp, i);
        w16_key_t key = ct_key(1000 + i);
        size_t n = 0;
        unsigned char *b = populate(dir, key, &n);
        TU_CHECK(b != NULL);
        if (!b)
            continue;
        unsigned char *m = malloc(n + 1);
        memcpy(m, b, n);
        cases[i].fn(m, &n);
        ct_entry_path(dir, key, path, sizeof path);
        TU_CHECK(tu_write_file(path, m, n) == 0);
        expect_recompiled(dir, key, cases[i].what);
        free(m);
        free(b);
    }
}

/* Another key's file under this key's name: foreign, never loaded. */
static void test_renamed(const char *tmp)
{
    char dir[4200], from[4200], to[4200];
    snprintf(dir, sizeof dir, "%s/renamed", tmp);
    w16_key_t a = ct_key(2000), b = ct_key(2001);
    size_t n;
    free(populate(dir, a, &n));
    ct_entry_path(dir, a, from, sizeof from);
    ct_entry_path(dir, b, to, sizeof to);
    char sub[4200];
    snprintf(sub, sizeof sub, "%.*s", (int)(strrchr(to, '/') - to), to);
    mkdir(sub, 0700);
    TU_CHECK(rename(from, to) == 0);
    expect_recompiled(dir, b, "renamed file");
}

static void test_truncated(const char *tmp)
{
    char dir[4200], path[4200];
    snprintf(dir, sizeof dir, "%s/truncated", tmp);
    w16_key_t key = ct_key(3000);
    size_t n = 0;
    unsigned char *b = populate(dir, key, &n);
    TU_CHECK(b && n > 100);
    if (!b)
        return;
    size_t cuts[] = {0, 1, 7, 8, 16, 32, 59, 63, 64, 65, n / 2, n - 1};
    ct_entry_path(dir, key, path, sizeof path);
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        TU_CHECK(tu_write_file(path, b, cuts[i]) == 0);
        char what[64];
        snprintf(what, sizeof what, "cut at %zu of %zu", cuts[i], n);
        expect_recompiled(dir, key, what);
    }
    free(b);
}

/* A sparse file over the limit is refused before anything is read. */
static void test_oversized(const char *tmp)
{
    char dir[4200], path[4200];
    snprintf(dir, sizeof dir, "%s/oversized", tmp);
    w16_key_t key = ct_key(3100);
    size_t n;
    free(populate(dir, key, &n));
    ct_entry_path(dir, key, path, sizeof path);
    int fd = open(path, O_WRONLY);
    TU_CHECK(fd >= 0 && ftruncate(fd, (off_t)W16_CACHE_MAX_PAYLOAD + 65) == 0);
    if (fd >= 0)
        close(fd);
    expect_recompiled(dir, key, "over 1 GiB");
}

/* A directory squatting on an entry's name: not trusted, and the cache
 * keeps answering. */
static void test_directory_entry(const char *tmp)
{
    char dir[4200], path[4200];
    snprintf(dir, sizeof dir, "%s/squat", tmp);
    w16_key_t key = ct_key(3200);
    size_t n;
    free(populate(dir, key, &n));
    ct_entry_path(dir, key, path, sizeof path);
    TU_CHECK(unlink(path) == 0 && mkdir(path, 0700) == 0);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    TU_CHECK(ct_get(c, &f, key) != NULL);
    TU_CHECK(ct_get(c, &f, ct_key(3201)) != NULL);
    TU_CHECK(atomic_load(&f.compiles) == 2);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* A valid entry whose blob the loader refuses (say, built by a driver the
 * key failed to capture) is recompiled like a corrupt one. */
static void test_loader_refuses(const char *tmp)
{
    char dir[4200], path[4200];
    snprintf(dir, sizeof dir, "%s/refused", tmp);
    w16_key_t key = ct_key(3300);
    size_t n;
    free(populate(dir, key, &n));
    ct_entry_path(dir, key, path, sizeof path);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    atomic_store(&f.refuse_loads, 1);
    w16_cache_t *c = ct_cache(ctx, dir);
    TU_CHECK(ct_get(c, &f, key) != NULL);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.corrupt == 1 && s.compiles == 1 && s.disk_hits == 0);
    TU_CHECK(s.errors == 0 && s.disk_writes == 1);
    char last[2048];
    ct_last(&cap, last, sizeof last);
    TU_CHECK_MSG(ct_warnings(&cap) == 1 && strstr(last, path) &&
                     strstr(last, "no device"), "'%s'", last);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* Two corrupt entries in one cache: two counted, one warned. */
static void test_one_warning(const char *tmp)
{
    char dir[4200], path[4200];
    snprintf(dir, sizeof dir, "%s/onewarning", tmp);
    for (uint64_t i = 0; i < 2; i++) {
        size_t n;
        free(populate(dir, ct_key(4000 + i), &n));
        ct_entry_path(dir, ct_key(4000 + i), path, sizeof path);
        TU_CHECK(tu_write_file(path, "garbage", 7) == 0);
    }
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    ct_get(c, &f, ct_key(4000));
    ct_get(c, &f, ct_key(4001));
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.corrupt == 2 && s.compiles == 2 && ct_warnings(&cap) == 1);
    w16_cache_destroy(c);
    /* A second cache on the same context warns again: once per cache. */
    for (uint64_t i = 0; i < 2; i++) {
        ct_entry_path(dir, ct_key(4000 + i), path, sizeof path);
        TU_CHECK(tu_write_file(path, "garbage", 7) == 0);
    }
    c = ct_cache(ctx, dir);
    ct_get(c, &f, ct_key(4000));
    ct_get(c, &f, ct_key(4001));
    TU_CHECK(ct_warnings(&cap) == 2);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* Gets three keys twice on a cache that cannot write `dir`: handles come
 * back, one warning naming the directory, no entry files. */
static void expect_memory_only(const char *dir, bool readable)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    for (int round = 0; round < 2; round++)
        for (uint64_t i = 0; i < 3; i++)
            TU_CHECK(ct_get(c, &f, ct_key(5000 + i)) != NULL);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(atomic_load(&f.compiles) == 3 && s.memory_hits == 3);
    TU_CHECK(!s.disk_writable && s.disk_writes == 0);
    TU_CHECK(s.disk_readable == readable);
    char last[2048];
    ct_last(&cap, last, sizeof last);
    TU_CHECK_MSG(ct_warnings(&cap) == 1 && strstr(last, dir) &&
                     strstr(last, "caching in memory only"),
                 "%d warnings, last '%s'", ct_warnings(&cap), last);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

static void test_unwritable(const char *tmp)
{
    /* A path below a regular file fails even for root. */
    char file[4200], dir[4200];
    snprintf(file, sizeof file, "%s/afile", tmp);
    TU_CHECK(tu_write_file(file, "x", 1) == 0);
    snprintf(dir, sizeof dir, "%s/sub", file);
    expect_memory_only(dir, false);
    TU_CHECK(!tu_exists(dir));

    /* A read-only directory, unless we are root (root writes anyway). */
    snprintf(dir, sizeof dir, "%s/readonly", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0 && chmod(dir, 0500) == 0);
    char probe[4300];
    snprintf(probe, sizeof probe, "%s/probe", dir);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        printf("note: running as root, the read-only directory case is "
               "skipped\n");
    } else {
        expect_memory_only(dir, true);
        size_t files = 1;
        TU_CHECK(w16_cache_dir_stats(dir, &files, NULL, NULL) == WNA16_OK &&
                 files == 0);
    }
    chmod(dir, 0700);
}

/* ---- dir_stats and clear ---------------------------------------------------------- */

static void make_file(const char *dir, const char *name, const char *text)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char sub[4300];
    snprintf(sub, sizeof sub, "%.*s", (int)(strrchr(path, '/') - path), path);
    mkdir(dir, 0700);
    mkdir(sub, 0700);
    TU_CHECK(tu_write_file(path, text, strlen(text)) == 0);
}

static void age(const char *path, time_t seconds)
{
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= seconds;
    t[1] = t[0];
    TU_CHECK(utimensat(AT_FDCWD, path, t, 0) == 0);
}

static void test_clear(const char *tmp)
{
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/clear", tmp);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    uint64_t total = 0;
    for (uint64_t i = 0; i < 5; i++) {
        ct_get(c, &f, ct_key(6000 + i));
        total += 64 + fake_blob_size(ct_key(6000 + i));
    }
    w16_cache_destroy(c);

    char hex[W16_KEY_HEX_SIZE], name[128];
    w16_key_hex(ct_key(6000), hex);
    /* Things that are not the cache's: all must survive. */
    make_file(dir, "notes.txt", "mine");
    make_file(dir, "ab/readme", "mine");
    snprintf(name, sizeof name, "zz/%s.wk", hex);
    make_file(dir, name, "not in a hex dir");
    snprintf(name, sizeof name, "%s/%s.wk", strncmp(hex, "ab", 2) ? "ab" : "cd",
             hex);
    make_file(dir, name, "wrong subdir");
    char wrong_sub[4300];
    snprintf(wrong_sub, sizeof wrong_sub, "%s/%s", dir, name);
    snprintf(name, sizeof name, "%.2s/%s.wkx", hex, hex);
    make_file(dir, name, "other suffix");
    snprintf(name, sizeof name, "%.2s/%s.wk.tmp.1.fresh", hex, hex);
    make_file(dir, name, "a writer is busy");
    /* A stale temporary file is the cache's and goes. */
    char stale[4300];
    snprintf(name, sizeof name, "%.2s/%s.wk.tmp.2.stale", hex, hex);
    make_file(dir, name, "a writer died");
    snprintf(stale, sizeof stale, "%s/%s", dir, name);
    age(stale, W16_CACHE_STALE_TMP_S + 60);
    /* A symlinked subdir is not followed. */
    char outside[4200], link[4300];
    snprintf(outside, sizeof outside, "%s/outside", tmp);
    make_file(outside, "00/00000000000000000000000000000000.wk", "x");
    snprintf(link, sizeof link, "%s/00", dir);
    TU_CHECK(symlink(outside, link) == 0 || tu_exists(link));

    size_t files = 0, removed = 0;
    uint64_t bytes = 0;
    wna16_error_t err;
    TU_OK(w16_cache_dir_stats(dir, &files, &bytes, &err), &err);
    TU_CHECK_MSG(files == 5 && bytes == total, "%zu files, %llu bytes", files,
                 (unsigned long long)bytes);
    TU_OK(w16_cache_clear(dir, &removed, &err), &err);
    TU_CHECK(removed == 5);
    TU_OK(w16_cache_dir_stats(dir, &files, &bytes, &err), &err);
    TU_CHECK(files == 0 && bytes == 0);
    TU_CHECK(!tu_exists(stale));
    snprintf(path, sizeof path, "%s/%.2s/%s.wk.tmp.1.fresh", dir, hex, hex);
    TU_CHECK(tu_exists(path));
    const char *survivors[] = {"notes.txt", "ab/readme"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, survivors[i]);
        TU_CHECK_MSG(tu_exists(path), "%s removed", path);
    }
    snprintf(path, sizeof path, "%s/zz/%s.wk", dir, hex);
    TU_CHECK(tu_exists(path));
    TU_CHECK(tu_exists(wrong_sub));
    snprintf(path, sizeof path, "%s/%.2s/%s.wkx", dir, hex, hex);
    TU_CHECK(tu_exists(path));
    snprintf(path, sizeof path, "%s/00/00000000000000000000000000000000.wk",
             outside);
    TU_CHECK(tu_exists(path));
    snprintf(path, sizeof path, "%s/%.2s", dir, hex);
    TU_CHECK(tu_exists(path)); /* directories stay */

    /* The cache still works after a clear. */
    c = ct_cache(ctx, dir);
    fake_init(&f, ctx);
    ct_get(c, &f, ct_key(6000));
    TU_CHECK(atomic_load(&f.compiles) == 1);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);

    /* A missing directory: nothing, not an error. A file: an error. */
    snprintf(path, sizeof path, "%s/missing", tmp);
    TU_OK(w16_cache_dir_stats(path, &files, &bytes, &err), &err);
    TU_CHECK(files == 0 && bytes == 0);
    TU_OK(w16_cache_clear(path, &removed, &err), &err);
    TU_CHECK(removed == 0 && !tu_exists(path));
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    TU_CHECK(w16_cache_dir_stats(path, &files, &bytes, &err) == WNA16_EIO);
    TU_CHECK(strstr(err.message, path) != NULL);
    TU_CHECK(w16_cache_clear(NULL, &removed, &err) == WNA16_EINVAL);
}

int main(void)
{
    /* Files written here by hand must not be group-writable (a umask of
     * 002 is common), or the cache refuses them as untrusted, which
     * test_cache_trust checks, instead of parsing them. */
    umask(022);
    const char *tmp0 = tu_tempdir("cache-disk");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", tmp0);
    test_corrupt(tmp);
    test_renamed(tmp);
    test_truncated(tmp);
    test_oversized(tmp);
    test_directory_entry(tmp);
    test_loader_refuses(tmp);
    test_one_warning(tmp);
    test_unwritable(tmp);
    test_clear(tmp);
    if (!tu_failures)
        ct_rmtree(tmp);
    return tu_finish("test_cache_disk");
}
