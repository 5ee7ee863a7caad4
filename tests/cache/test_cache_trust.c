/*
 * test_cache_trust.c - the kernel cache loads only what is the user's
 * alone, since its entries become native code. A cache directory writable
 * by its group or by others is refused (memory only, one warning naming it
 * and why, nothing created inside); a symbolic link to a directory of ours
 * is fine. An entry that is group- or other-writable, a symbolic link (even
 * to a valid entry of ours), or in a subdirectory that is a symbolic link or
 * writable by others, is not loaded: recompiled, counted as untrusted, one
 * warning per cache; an entry is then replaced by ours, a subdirectory is
 * left alone. A FIFO where an entry should be must not hang the open. What
 * the cache creates is 0700/0600 under any umask. With the argument
 * "owner", the cases that need a file of another user (chown to 65534),
 * which only root can make: exit 77 for anyone else.
 */
#define _POSIX_C_SOURCE 200809L
#include "cache_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { NOBODY = 65534 };

/* A fresh cache on dir compiles key: its entry is on disk afterwards. */
static void put_entry(const char *dir, w16_key_t key)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    TU_CHECK(ct_get(c, &f, key) != NULL);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
    char path[4200];
    ct_entry_path(dir, key, path, sizeof path);
    TU_CHECK_MSG(tu_exists(path), "%s not written", path);
}

/* Names in dir besides . and ..; -1 when it cannot be read. */
static int count_names(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

static unsigned mode_of(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? (unsigned)(st.st_mode & 07777) : 0u;
}

static void sub_of(const char *dir, w16_key_t key, char *out, size_t n)
{
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    snprintf(out, n, "%s/%.2s", dir, hex);
}

/* A cache refuses dir: three keys got twice are compiled once each and
 * served from memory, one warning naming dir and holding `why`, nothing
 * created in dir, and w16_cache_dir_refused agrees. */
static void expect_refused(const char *dir, const char *why)
{
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    for (int round = 0; round < 2; round++)
        for (uint64_t i = 0; i < 3; i++)
            TU_CHECK(ct_get(c, &f, ct_key(100 + i)) != NULL);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(atomic_load(&f.compiles) == 3 && s.memory_hits == 3);
    TU_CHECK(!s.disk_readable && !s.disk_writable && s.disk_writes == 0);
    char last[2048];
    ct_last(&cap, last, sizeof last);
    TU_CHECK_MSG(ct_warnings(&cap) == 1 && strstr(last, dir) &&
                     strstr(last, why) &&
                     strstr(last, "caching in memory only"),
                 "%s: %d warnings, last '%s'", dir, ct_warnings(&cap), last);
    TU_CHECK_MSG(count_names(dir) == 0, "%s: %d names written", dir,
                 count_names(dir));
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
    char got[256] = "";
    TU_CHECK_MSG(w16_cache_dir_refused(dir, got, sizeof got) &&
                     strcmp(got, why) == 0,
                 "refused: '%s'", got);
}

/* A fresh cache on dir does not load key's entry: one compile, one
 * untrusted, no disk hit, one warning naming `name` with `why`. Then
 * another cache: a disk hit when the entry was `replaced` by ours,
 * untrusted again otherwise. */
static void expect_untrusted(const char *dir, w16_key_t key, const char *name,
                             const char *why, bool replaced)
{
    for (int pass = 0; pass < 2; pass++) {
        logcap_t cap;
        wna16_context_t *ctx = ct_context(&cap);
        fake_t f;
        fake_init(&f, ctx);
        w16_cache_t *c = ct_cache(ctx, dir);
        TU_CHECK(ct_get(c, &f, key) != NULL);
        w16_cache_stats_t s;
        w16_cache_get_stats(c, &s);
        char last[2048];
        ct_last(&cap, last, sizeof last);
        if (pass == 1 && replaced) {
            TU_CHECK_MSG(atomic_load(&f.compiles) == 0 && s.disk_hits == 1 &&
                             ct_warnings(&cap) == 0,
                         "%s: not replaced (%d compiles)", name,
                         atomic_load(&f.compiles));
        } else {
            TU_CHECK_MSG(atomic_load(&f.compiles) == 1 && s.untrusted == 1 &&
                             s.corrupt == 0 && s.disk_hits == 0,
                         "%s (%s): %d compiles, %llu untrusted, %llu corrupt",
                         name, why, atomic_load(&f.compiles),
                         (unsigned long long)s.untrusted,
                         (unsigned long long)s.corrupt);
            TU_CHECK_MSG(ct_warnings(&cap) == 1 && strstr(last, name) &&
                             strstr(last, why),
                         "%d warnings, last '%s'", ct_warnings(&cap), last);
            TU_CHECK(s.disk_writes == (replaced ? 1u : 0u));
        }
        w16_cache_destroy(c);
        wna16_context_destroy(ctx);
    }
}

/* ---- directories ------------------------------------------------------------------ */

static void test_dir_modes(const char *tmp)
{
    static const struct {
        unsigned mode;
        const char *why;
    } bad[] = {
        {0777, "writable by others (mode 0777)"},
        {0770, "writable by its group (mode 0770)"},
        {0702, "writable by others (mode 0702)"},
        {01777, "writable by others (mode 1777)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/dir%04o", tmp, bad[i].mode);
        TU_CHECK(mkdir(dir, 0700) == 0 && chmod(dir, bad[i].mode) == 0);
        expect_refused(dir, bad[i].why);
    }
    /* Readable by others is fine (a umask of 022 makes such directories). */
    char dir[4200], why[128];
    snprintf(dir, sizeof dir, "%s/dir0755", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0 && chmod(dir, 0755) == 0);
    TU_CHECK(!w16_cache_dir_refused(dir, why, sizeof why));
    put_entry(dir, ct_key(1));
    /* A missing directory is not refused: the cache will make it. */
    snprintf(dir, sizeof dir, "%s/missing", tmp);
    TU_CHECK(!w16_cache_dir_refused(dir, why, sizeof why));
}

/* A symbolic link to a directory is followed: what it leads to counts. */
static void test_dir_symlink(const char *tmp)
{
    char real[4200], link[4200];
    snprintf(real, sizeof real, "%s/real", tmp);
    snprintf(link, sizeof link, "%s/link", tmp);
    TU_CHECK(mkdir(real, 0700) == 0 && symlink(real, link) == 0);
    put_entry(link, ct_key(2));
    char path[4300];
    ct_entry_path(real, ct_key(2), path, sizeof path);
    TU_CHECK(tu_exists(path));

    snprintf(real, sizeof real, "%s/real-open", tmp);
    snprintf(link, sizeof link, "%s/link-open", tmp);
    TU_CHECK(mkdir(real, 0700) == 0 && chmod(real, 0777) == 0 &&
             symlink(real, link) == 0);
    expect_refused(link, "writable by others (mode 0777)");
}

/* ---- entries ---------------------------------------------------------------------- */

static void test_entry_modes(const char *tmp)
{
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/entries", tmp);
    static const struct {
        unsigned mode;
        const char *why;
    } bad[] = {
        {0666, "writable by others (mode 0666)"},
        {0620, "writable by its group (mode 0620)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        w16_key_t key = ct_key(10 + i);
        put_entry(dir, key);
        ct_entry_path(dir, key, path, sizeof path);
        TU_CHECK(chmod(path, bad[i].mode) == 0);
        expect_untrusted(dir, key, path, bad[i].why, true);
        TU_CHECK_MSG(mode_of(path) == 0600, "replaced with mode %04o",
                     mode_of(path));
    }
}

/* A symbolic link, even to a valid entry of ours, is not followed: the
 * link is replaced by a file, what it pointed at stays as it was. */
static void test_entry_symlink(const char *tmp)
{
    char dir[4200], path[4300], outside[4200];
    snprintf(dir, sizeof dir, "%s/entry-link", tmp);
    w16_key_t key = ct_key(20);
    put_entry(dir, key);
    ct_entry_path(dir, key, path, sizeof path);
    size_t n;
    unsigned char *bytes = tu_read_file(path, &n);
    snprintf(outside, sizeof outside, "%s/elsewhere.wk", tmp);
    TU_CHECK(bytes && tu_write_file(outside, bytes, n) == 0);
    TU_CHECK(chmod(outside, 0600) == 0);
    TU_CHECK(unlink(path) == 0 && symlink(outside, path) == 0);
    expect_untrusted(dir, key, path, "a symbolic link", true);
    struct stat st;
    TU_CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    size_t m;
    unsigned char *after = tu_read_file(outside, &m);
    TU_CHECK(after && m == n && memcmp(after, bytes, n) == 0);
    free(after);
    free(bytes);

    /* A dangling one too. */
    key = ct_key(21);
    ct_entry_path(dir, key, path, sizeof path);
    char sub[4300];
    sub_of(dir, key, sub, sizeof sub);
    mkdir(sub, 0700);
    TU_CHECK(symlink("/nonexistent/wna16-entry", path) == 0);
    expect_untrusted(dir, key, path, "a symbolic link", true);
}

/* A subdirectory that is a symbolic link (to a directory of ours holding a
 * valid entry) or writable by others: the entry is not loaded, nothing is
 * written into it. */
static void test_sub_untrusted(const char *tmp)
{
    char dir[4200], sub[4300], path[4300], away[4200];
    snprintf(dir, sizeof dir, "%s/sub-link", tmp);
    w16_key_t key = ct_key(30);
    put_entry(dir, key);
    sub_of(dir, key, sub, sizeof sub);
    snprintf(away, sizeof away, "%s/sub-away", tmp);
    TU_CHECK(rename(sub, away) == 0 && symlink(away, sub) == 0);
    ct_entry_path(dir, key, path, sizeof path);
    expect_untrusted(dir, key, sub, "a symbolic link", false);
    TU_CHECK_MSG(count_names(away) == 1, "%d names in %s", count_names(away),
                 away);

    snprintf(dir, sizeof dir, "%s/sub-open", tmp);
    key = ct_key(31);
    put_entry(dir, key);
    sub_of(dir, key, sub, sizeof sub);
    TU_CHECK(chmod(sub, 0777) == 0);
    expect_untrusted(dir, key, sub, "writable by others (mode 0777)", false);
    TU_CHECK(count_names(sub) == 1);
}

/* Several untrusted entries: counted each, one warning per cache. */
static void test_one_warning(const char *tmp)
{
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/several", tmp);
    for (uint64_t i = 0; i < 3; i++) {
        put_entry(dir, ct_key(40 + i));
        ct_entry_path(dir, ct_key(40 + i), path, sizeof path);
        TU_CHECK(chmod(path, 0646) == 0);
    }
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    for (uint64_t i = 0; i < 3; i++)
        ct_get(c, &f, ct_key(40 + i));
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.untrusted == 3 && s.compiles == 3 && ct_warnings(&cap) == 1);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* A FIFO named like an entry: refused as corrupt without blocking. */
static void test_fifo(const char *tmp)
{
    char dir[4200], sub[4300], path[4300];
    snprintf(dir, sizeof dir, "%s/fifo", tmp);
    w16_key_t key = ct_key(50);
    sub_of(dir, key, sub, sizeof sub);
    ct_entry_path(dir, key, path, sizeof path);
    TU_CHECK(mkdir(dir, 0700) == 0 && mkdir(sub, 0700) == 0);
    TU_CHECK(mkfifo(path, 0600) == 0);
    logcap_t cap;
    wna16_context_t *ctx = ct_context(&cap);
    fake_t f;
    fake_init(&f, ctx);
    w16_cache_t *c = ct_cache(ctx, dir);
    TU_CHECK(ct_get(c, &f, key) != NULL);
    w16_cache_stats_t s;
    w16_cache_get_stats(c, &s);
    TU_CHECK(s.corrupt == 1 && s.untrusted == 0 && s.disk_writes == 1);
    w16_cache_destroy(c);
    wna16_context_destroy(ctx);
}

/* What the cache creates is 0700 and 0600 whatever the umask: a loose one
 * must not open it to others, a tight one must not lock it out. */
static void test_umask(const char *tmp)
{
    static const mode_t masks[] = {0, 0277, 0777};
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        char dir[4200], sub[4300], path[4300];
        snprintf(dir, sizeof dir, "%s/umask%03o/cache", tmp,
                 (unsigned)masks[i]);
        w16_key_t key = ct_key(60);
        mode_t old = umask(masks[i]);
        put_entry(dir, key);
        umask(old);
        sub_of(dir, key, sub, sizeof sub);
        ct_entry_path(dir, key, path, sizeof path);
        char parent[4200];
        snprintf(parent, sizeof parent, "%s/umask%03o", tmp,
                 (unsigned)masks[i]);
        TU_CHECK_MSG(mode_of(parent) == 0700 && mode_of(dir) == 0700 &&
                         mode_of(sub) == 0700 && mode_of(path) == 0600,
                     "umask %03o: %04o %04o %04o %04o", (unsigned)masks[i],
                     mode_of(parent), mode_of(dir), mode_of(sub),
                     mode_of(path));
    }
}

/* ---- another user's files (root only) ------------------------------------------------ */

static int owner_tests(const char *tmp)
{
    if (geteuid() != 0) {
        printf("skipped: making files of another user needs root\n");
        return 77;
    }
    char why[128];
    snprintf(why, sizeof why, "owned by uid %d, not you (0)", NOBODY);

    char dir[4200], sub[4300], path[4300];
    snprintf(dir, sizeof dir, "%s/theirs", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0 && chown(dir, NOBODY, NOBODY) == 0);
    expect_refused(dir, why);

    /* Through a symbolic link of ours: still theirs. */
    char link[4200];
    snprintf(link, sizeof link, "%s/link-to-theirs", tmp);
    TU_CHECK(symlink(dir, link) == 0);
    expect_refused(link, why);

    snprintf(dir, sizeof dir, "%s/their-entry", tmp);
    w16_key_t key = ct_key(70);
    put_entry(dir, key);
    ct_entry_path(dir, key, path, sizeof path);
    TU_CHECK(chown(path, NOBODY, NOBODY) == 0);
    expect_untrusted(dir, key, path, why, true);
    struct stat st;
    TU_CHECK(stat(path, &st) == 0 && st.st_uid == 0);

    snprintf(dir, sizeof dir, "%s/their-sub", tmp);
    key = ct_key(71);
    put_entry(dir, key);
    sub_of(dir, key, sub, sizeof sub);
    TU_CHECK(chown(sub, NOBODY, NOBODY) == 0);
    expect_untrusted(dir, key, sub, why, false);
    TU_CHECK(count_names(sub) == 1);
    return tu_finish("test_cache_trust owner");
}

int main(int argc, char **argv)
{
    const char *tmp0 = tu_tempdir("cache-trust");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", tmp0);
    if (argc > 1 && strcmp(argv[1], "owner") == 0) {
        int rc = owner_tests(tmp);
        if (!tu_failures)
            ct_rmtree(tmp);
        return rc;
    }
    test_dir_modes(tmp);
    test_dir_symlink(tmp);
    test_entry_modes(tmp);
    test_entry_symlink(tmp);
    test_sub_untrusted(tmp);
    test_one_warning(tmp);
    test_fifo(tmp);
    test_umask(tmp);
    if (!tu_failures)
        ct_rmtree(tmp);
    return tu_finish("test_cache_trust");
}
