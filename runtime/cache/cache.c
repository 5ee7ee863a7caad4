/*
 * cache.c - the kernel cache (see cache.h): the sharded in-memory
 * table with one producer per key, and the on-disk store. A get locks one
 * of 64 shards (chosen by the key's top bits), and on a hit returns the
 * handle without allocating. On a miss it inserts a BUSY entry, drops the
 * lock and produces the handle (disk, else compile + publish); threads that
 * find the BUSY entry wait on the shard's condition variable. A failure
 * unlinks the entry before waking the waiters, so it reaches all of them and
 * the next get retries. The disk level never fails a get: a corrupt entry
 * is recompiled (one warning per cache), an unwritable directory turns
 * writes off (one warning per cache). The once-only warnings are flags in
 * the cache rather than w16_log_once, which remembers keys per context (a
 * second cache would stay silent).
 *
 * Trust: entries become native code, so whatever is loaded must be the
 * user's alone. The directory is checked once (owner = euid, no group or
 * other write bit; a symbolic link to it is fine, what it points at is
 * checked); each "<dir>/xx" is opened with O_NOFOLLOW and checked through
 * its descriptor, and entries are opened relative to it, again O_NOFOLLOW,
 * and checked with fstat. New directories are 0700 and files 0600,
 * whatever the umask.
 *
 * Size: every disk hit sets the entry's mtime (futimens), so mtimes order
 * the entries by last use across processes. A cache counts the bytes it
 * writes on top of the directory's size as last scanned; past the limit (or
 * every W16_CACHE_RESCAN_WRITES writes, or at its first write) one thread
 * rescans the two-level directory and removes the least recently used
 * entries down to W16_CACHE_TRIM_TO_PERCENT of the limit, never the one it
 * has just written nor a temporary file younger than W16_CACHE_STALE_TMP_S.
 * Removing an entry that another process is reading is harmless on POSIX
 * (its open descriptor keeps the data).
 */
#define _POSIX_C_SOURCE 200809L
#include "runtime/cache/cache.h"
#include "base/base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the disk format ----------------------------------------------------------
 *
 *   <dir>/<hex[0:2]>/<hex>.wk, all integers little-endian:
 *
 *    0               8       12      16              24              32
 *   +---------------+-------+-------+---------------+---------------+
 *   | "WNA16KC\0"   | ver=1 | hsz=64| key.lo        | key.hi        |
 *   +---------------+-------+-------+---------------+---------------+
 *   32              40              48      52      56      60      64
 *   +---------------+---------------+-------+-------+-------+-------+
 *   | payload size  | payload hash  | algo  | 0     | 0     | hcsum |
 *   +---------------+---------------+-------+-------+-------+-------+
 *   64: payload (payload size bytes, exactly to the end of the file)
 *
 * payload hash = XXH3-64 (algo 1) or the built-in hash's low half (algo 2);
 * hcsum = low 32 bits of the same hash over bytes 0..59. Anything else is
 * "corrupt or foreign": recompiled, never trusted.
 * ----------------------------------------------------------------------------- */

static const unsigned char DISK_MAGIC[8] = {'W', 'N', 'A', '1', '6', 'K', 'C', 0};
enum { DISK_VERSION = 1, DISK_HEADER = 64, DISK_HCSUM_AT = 60 };

/* Longest directory accepted; paths inside it fit in PATH_BUF. */
enum { DIR_MAX = 3900, PATH_BUF = 4096 };

typedef struct disk_header {
    w16_key_t key;
    uint64_t size, hash;
} disk_header_t;

static void header_encode(unsigned char h[DISK_HEADER], const disk_header_t *d)
{
    memset(h, 0, DISK_HEADER);
    memcpy(h, DISK_MAGIC, sizeof DISK_MAGIC);
    w16_put_le32(h + 8, DISK_VERSION);
    w16_put_le32(h + 12, DISK_HEADER);
    w16_put_le64(h + 16, d->key.lo);
    w16_put_le64(h + 24, d->key.hi);
    w16_put_le64(h + 32, d->size);
    w16_put_le64(h + 40, d->hash);
    w16_put_le32(h + 48, (uint32_t)w16_hash_algo());
    w16_put_le32(h + DISK_HCSUM_AT, (uint32_t)w16_hash64(h, DISK_HCSUM_AT));
}

/* Checks everything the header alone can tell; fills d. */
static wna16_status_t header_decode(const unsigned char h[DISK_HEADER],
                                    const char *path, disk_header_t *d,
                                    wna16_error_t *err)
{
    /* Version and size first: another version may checksum differently. */
    const char *why = NULL;
    if (memcmp(h, DISK_MAGIC, sizeof DISK_MAGIC) != 0)
        why = "bad magic";
    else if (w16_get_le32(h + 8) != DISK_VERSION)
        why = "unknown format version";
    else if (w16_get_le32(h + 12) != DISK_HEADER)
        why = "unexpected header size";
    else if (w16_get_le32(h + DISK_HCSUM_AT) != (uint32_t)w16_hash64(h, DISK_HCSUM_AT))
        why = "header checksum mismatch";
    else if (w16_get_le32(h + 48) != (uint32_t)w16_hash_algo())
        why = "written with another hash algorithm";
    else if (w16_get_le32(h + 52) != 0 || w16_get_le32(h + 56) != 0)
        why = "reserved fields set";
    if (why)
        return w16_err(err, WNA16_EFORMAT, "%s: corrupt or foreign entry: %s",
                       path, why);
    d->key.lo = w16_get_le64(h + 16);
    d->key.hi = w16_get_le64(h + 24);
    d->size = w16_get_le64(h + 32);
    d->hash = w16_get_le64(h + 40);
    return WNA16_OK;
}

/* ---- the cache object -------------------------------------------------------------- */

enum { SHARD_BITS = 6, SHARDS = 1 << SHARD_BITS, FIRST_BUCKETS = 8 };

typedef enum { E_BUSY, E_READY, E_FAILED } entry_state_t;

typedef struct entry {
    struct entry *next;
    w16_key_t key;
    entry_state_t state;
    unsigned refs; /* producer + waiters still to read a FAILED entry */
    void *handle;
    void (*unload)(void *user, void *handle);
    void *user;
    wna16_status_t status;  /* E_FAILED */
    wna16_error_t *error;   /* E_FAILED: a copy for the waiters, or NULL */
} entry_t;

typedef struct shard {
    pthread_mutex_t lock;
    pthread_cond_t done; /* some BUSY entry of this shard finished */
    entry_t **buckets;   /* NULL until the first insert */
    size_t mask, count, ready;
    uint64_t hits;
    /* Keeps neighbouring shards' locks off one cache line. */
    char pad_[64];
} shard_t;

struct w16_cache {
    wna16_context_t *ctx;
    char *dir; /* NULL: no disk level (yet, for a lazy one) */
    bool want_disk;       /* not memory_only */
    atomic_bool disk_set; /* setup_disk has run (release: dir is final) */
    atomic_bool disk_read, disk_write;
    atomic_bool warned_corrupt, warned_disk, warned_untrusted, warned_trim;
    atomic_uint_fast64_t disk_hits, compiles, writes, corrupt, untrusted,
        evictions, errors;
    atomic_uint tmp_serial;
    /* The size limit (WNA16_CACHE_UNLIMITED: none) and the directory's
     * size as this cache believes it; scanned: at least one scan done. */
    uint64_t limit;
    w16_cache_limit_source_t limit_source;
    atomic_uint_fast64_t disk_bytes;
    atomic_uint writes_since_scan;
    atomic_bool scanned;
    pthread_mutex_t setup_mu; /* a lazy cache's setup_disk */
    pthread_mutex_t trim_mu;  /* one trim at a time (others skip theirs) */
    bool locks_ready;
    size_t shards_ready; /* initialised shards, for a partial destroy */
    shard_t shards[SHARDS];
};

static void bump(atomic_uint_fast64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* The top bits pick the shard, the low bits the bucket: both are uniform. */
static shard_t *shard_of(w16_cache_t *c, w16_key_t key)
{
    return &c->shards[key.hi >> (64 - SHARD_BITS)];
}

static entry_t *shard_find(const shard_t *s, w16_key_t key)
{
    if (!s->buckets)
        return NULL;
    for (entry_t *e = s->buckets[key.lo & s->mask]; e; e = e->next)
        if (e->key.lo == key.lo && e->key.hi == key.hi)
            return e;
    return NULL;
}

/* Doubles the bucket array (or creates it); false when out of memory. */
static bool shard_grow(w16_cache_t *c, shard_t *s)
{
    size_t old_n = s->buckets ? s->mask + 1 : 0;
    size_t n = old_n ? old_n * 2 : FIRST_BUCKETS;
    entry_t **b = w16_calloc(c->ctx, n, sizeof *b);
    if (!b)
        return false;
    for (size_t i = 0; i < old_n; i++) {
        for (entry_t *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->key.lo & (n - 1)];
            b[e->key.lo & (n - 1)] = e;
        }
    }
    w16_free(c->ctx, s->buckets, old_n * sizeof *b);
    s->buckets = b;
    s->mask = n - 1;
    return true;
}

static bool shard_insert(w16_cache_t *c, shard_t *s, entry_t *e)
{
    if ((!s->buckets || s->count > s->mask) && !shard_grow(c, s) &&
        !s->buckets)
        return false; /* a failed grow of a non-empty table only slows it */
    entry_t **head = &s->buckets[e->key.lo & s->mask];
    e->next = *head;
    *head = e;
    s->count++;
    return true;
}

static void shard_unlink(shard_t *s, entry_t *e)
{
    entry_t **p = &s->buckets[e->key.lo & s->mask];
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    s->count--;
}

static void entry_free(w16_cache_t *c, entry_t *e)
{
    w16_free(c->ctx, e->error, sizeof *e->error);
    w16_free(c->ctx, e, sizeof *e);
}

/* ---- warnings and degradation -------------------------------------------------------- */

static bool first_time(atomic_bool *flag)
{
    return !atomic_exchange(flag, true);
}

/* A corrupt or foreign entry (message names the file): counted, and the
 * first one per cache is reported. */
static void note_corrupt(w16_cache_t *c, const wna16_error_t *why)
{
    bump(&c->corrupt);
    if (first_time(&c->warned_corrupt))
        wna16_log(c->ctx, WNA16_LOG_WARN,
                  "kernel cache: %s; recompiling it (further corrupt entries "
                  "are recompiled without a warning)", why->message);
}

/* An entry not loaded because it, or its subdirectory, is not the user's
 * alone (`what`: "<path>: not trusted: <why>"): counted, and the first one
 * per cache is reported. */
static void note_untrusted(w16_cache_t *c, const char *what)
{
    bump(&c->untrusted);
    if (first_time(&c->warned_untrusted))
        wna16_log(c->ctx, WNA16_LOG_WARN,
                  "kernel cache: %s; recompiling it instead of loading it "
                  "(further untrusted entries are recompiled without a "
                  "warning)", what);
}

/* The directory is not the user's alone: no disk level, one warning. */
static void disk_refuse(w16_cache_t *c, const char *why)
{
    atomic_store(&c->disk_write, false);
    atomic_store(&c->disk_read, false);
    if (first_time(&c->warned_disk))
        wna16_log(c->ctx, WNA16_LOG_WARN,
                  "kernel cache: %s: not trusted: %s; caching in memory only "
                  "(the directory must belong to you and be writable by you "
                  "alone)", c->dir, why);
}

/* The directory cannot be written: stop writing (and reading too when
 * `reads` is false), once, with one warning. */
static void disk_degrade(w16_cache_t *c, int errnum, bool reads)
{
    atomic_store(&c->disk_write, false);
    if (!reads)
        atomic_store(&c->disk_read, false);
    if (first_time(&c->warned_disk))
        wna16_log(c->ctx, WNA16_LOG_WARN,
                  "kernel cache: %s: %s; caching in memory only", c->dir,
                  strerror(errnum));
}

/* ---- file helpers ---------------------------------------------------------------- */

/* Full read: bytes read (< n at end of file), or -1 with errno. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int write_full(int fd, const void *buf, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = write(fd, (const char *)buf + put, n - put);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        put += (size_t)w;
    }
    return 0;
}

/* mkdir -p with mode 0700 for what it creates; 0 or -1 with errno. An
 * existing directory is fine, an existing file is ENOTDIR. */
static int mkdir_p(const char *dir)
{
    char p[PATH_BUF];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0700) == 0)
            (void)chmod(p, 0700); /* see distrust */
        else if (errno != EEXIST)
            return -1;
        p[i] = saved;
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* ---- trust ------------------------------------------------------------------------ */

enum { WHY_MAX = 96 };

/* NULL when a directory or entry with these attributes is the user's
 * alone; else why not, written to why. The umask cannot make the cache's
 * own files fail this: it only removes bits from 0700 and 0600, and what
 * the cache creates is chmod'ed to exactly those (a tighter umask would
 * otherwise lock the cache out of its own directory). */
static const char *distrust(const struct stat *st, char why[WHY_MAX])
{
    unsigned long me = (unsigned long)geteuid();
    unsigned mode = (unsigned)(st->st_mode & 07777);
    if ((unsigned long)st->st_uid != me)
        snprintf(why, WHY_MAX, "owned by uid %lu, not you (%lu)",
                 (unsigned long)st->st_uid, me);
    else if (st->st_mode & S_IWOTH)
        snprintf(why, WHY_MAX, "writable by others (mode %04o)", mode);
    else if (st->st_mode & S_IWGRP)
        snprintf(why, WHY_MAX, "writable by its group (mode %04o)", mode);
    else
        return NULL;
    return why;
}

/* Did an O_NOFOLLOW open fail on a symbolic link? (ELOOP on Linux and
 * macOS, EMLINK on FreeBSD.) */
static bool is_link_errno(int e) { return e == ELOOP || e == EMLINK; }

/* The cache directory itself, followed if it is a symbolic link: what it
 * leads to must be the user's alone. NULL when it is; else why not. An
 * error to open or stat it is left to the first write to report. */
static const char *distrust_dir(const char *dir, char why[WHY_MAX])
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    const char *r = fstat(fd, &st) == 0 ? distrust(&st, why) : NULL;
    close(fd);
    return r;
}

typedef enum { SUB_OK, SUB_MISSING, SUB_UNTRUSTED, SUB_ERROR } sub_status_t;

/* Opens "<dir>/xx" without following a symbolic link and checks it through
 * the descriptor: SUB_OK with *fd; SUB_MISSING when it does not exist (or
 * is not a directory) and `create` is false; SUB_UNTRUSTED with why (a
 * symbolic link, someone else's, writable by others); SUB_ERROR with errno.
 * With `create`, a missing one is made, and <dir> too if it vanished. */
static sub_status_t open_sub(const char *sub, bool create, int *fd,
                             char why[WHY_MAX])
{
    for (int attempt = 0;; attempt++) {
        int d = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d >= 0) {
            struct stat st;
            if (fstat(d, &st) != 0) {
                int e = errno;
                close(d);
                errno = e;
                return SUB_ERROR;
            }
            if (distrust(&st, why)) {
                close(d);
                return SUB_UNTRUSTED;
            }
            *fd = d;
            return SUB_OK;
        }
        int e = errno;
        struct stat lst;
        if ((is_link_errno(e) || e == ENOTDIR) && lstat(sub, &lst) == 0 &&
            S_ISLNK(lst.st_mode)) {
            snprintf(why, WHY_MAX, "a symbolic link");
            return SUB_UNTRUSTED;
        }
        if (!create || attempt > 0 || e != ENOENT) {
            errno = e;
            return (e == ENOENT || e == ENOTDIR) && !create ? SUB_MISSING
                                                            : SUB_ERROR;
        }
        if (mkdir(sub, 0700) == 0)
            (void)chmod(sub, 0700); /* see distrust */
        else if (errno == ENOENT ? mkdir_p(sub) != 0 : errno != EEXIST)
            return SUB_ERROR;
    }
}

/* "<dir>/ab" in sub and "<dir>/ab/<hex>.wk" in path; returns the entry's
 * name (inside path). The directory's length was bounded at setup. */
static const char *entry_paths(const w16_cache_t *c, w16_key_t key,
                               char sub[PATH_BUF], char path[PATH_BUF])
{
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    int n = snprintf(sub, PATH_BUF, "%s/%.2s", c->dir, hex);
    snprintf(path, PATH_BUF, "%s/%.2s/%s.wk", c->dir, hex, hex);
    return path + n + 1;
}

/* ---- reading an entry ------------------------------------------------------------ */

static wna16_status_t read_fd(w16_cache_t *c, int fd, const char *path,
                              w16_key_t key, void **payload, size_t *size,
                              wna16_error_t *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return w16_err(err, WNA16_EFORMAT, "%s: not a regular file", path);
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize > W16_CACHE_MAX_PAYLOAD + DISK_HEADER)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: corrupt or foreign entry: larger than 1 GiB", path);
    unsigned char h[DISK_HEADER];
    ssize_t r = read_full(fd, h, sizeof h);
    if (r < 0)
        return w16_err(err, WNA16_EFORMAT, "%s: %s", path, strerror(errno));
    if (r < DISK_HEADER)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: corrupt or foreign entry: truncated (%zd bytes)",
                       path, r);
    disk_header_t d = {0};
    wna16_status_t st2 = header_decode(h, path, &d, err);
    if (st2 != WNA16_OK)
        return st2;
    if (!w16_key_equal(d.key, key))
        return w16_err(err, WNA16_EFORMAT,
                       "%s: corrupt or foreign entry: holds another key", path);
    if (d.size != fsize - DISK_HEADER)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: corrupt or foreign entry: payload of %llu bytes in "
                       "a file of %llu", path, (unsigned long long)d.size,
                       (unsigned long long)fsize);
    size_t n = (size_t)d.size;
    void *p = w16_alloc(c->ctx, n);
    if (!p)
        return w16_err_nomem(err, "reading a kernel cache entry");
    r = read_full(fd, p, n);
    if (r != (ssize_t)n || w16_hash64(p, n) != d.hash) {
        w16_free(c->ctx, p, n);
        return w16_err(err, WNA16_EFORMAT,
                       "%s: corrupt or foreign entry: %s", path,
                       r != (ssize_t)n ? "truncated payload"
                                       : "payload checksum mismatch");
    }
    *payload = p;
    *size = n;
    return WNA16_OK;
}

/* Reads and verifies the entry at `path` (named `name` in `sub`), and marks
 * it used (its mtime, the eviction order). WNA16_OK with the payload
 * (w16_alloc'd, *size bytes); WNA16_ENOTFOUND when there is no entry;
 * WNA16_ENOMEM; WNA16_EFORMAT when it is corrupt, foreign or unreadable,
 * with *untrusted set when it, or its subdirectory, is not the user's alone
 * (err names the file and says why). The entry is opened with O_NONBLOCK
 * so that a FIFO in its place cannot hang the open. */
static wna16_status_t disk_read(w16_cache_t *c, const char *sub,
                                const char *path, const char *name,
                                w16_key_t key, void **payload, size_t *size,
                                bool *untrusted, wna16_error_t *err)
{
    char why[WHY_MAX];
    int sfd;
    switch (open_sub(sub, false, &sfd, why)) {
    case SUB_OK:
        break;
    case SUB_MISSING:
        return WNA16_ENOTFOUND;
    case SUB_UNTRUSTED:
        *untrusted = true;
        return w16_err(err, WNA16_EFORMAT, "%s: not trusted: %s", sub, why);
    case SUB_ERROR:
        return w16_err(err, WNA16_EFORMAT, "%s: %s", sub, strerror(errno));
    }
    int fd = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int e = errno;
    close(sfd);
    if (fd < 0) {
        if (e == ENOENT)
            return WNA16_ENOTFOUND;
        *untrusted = is_link_errno(e);
        return w16_err(err, WNA16_EFORMAT, "%s: %s", path,
                       *untrusted ? "not trusted: a symbolic link"
                                  : strerror(e));
    }
    struct stat st;
    wna16_status_t r;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && distrust(&st, why)) {
        *untrusted = true;
        r = w16_err(err, WNA16_EFORMAT, "%s: not trusted: %s", path, why);
    } else {
        r = read_fd(c, fd, path, key, payload, size, err);
    }
    /* The eviction clock. It fails only on a read-only file system, where
     * nothing is written and so nothing is evicted either. */
    if (r == WNA16_OK)
        (void)futimens(fd, NULL);
    close(fd);
    return r;
}

/* ---- writing an entry ------------------------------------------------------------ */

/* A name no other writer (thread or process) picks: pid, a per-cache
 * serial number, the clock and an address, hashed. */
static uint64_t tmp_nonce(w16_cache_t *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v[5] = {(uint64_t)getpid(),
                     atomic_fetch_add(&c->tmp_serial, 1),
                     (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec,
                     (uint64_t)(uintptr_t)c};
    return w16_hash_builtin128(v, sizeof v).lo;
}

enum { TMP_NAME = 128 };

/* Opens "<name>.tmp.<pid>.<random>" in sfd exclusively, mode exactly 0600;
 * fd or -1 with errno. */
static int open_tmp(w16_cache_t *c, int sfd, const char *name,
                    char tmp[TMP_NAME])
{
    for (int attempt = 0; attempt < 16; attempt++) {
        snprintf(tmp, TMP_NAME, "%s.tmp.%ld.%016llx", name, (long)getpid(),
                 (unsigned long long)tmp_nonce(c));
        int fd = openat(sfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                        0600);
        if (fd >= 0 && fchmod(fd, 0600) != 0) { /* see distrust */
            int e = errno;
            close(fd);
            unlinkat(sfd, tmp, 0);
            errno = e;
            return -1;
        }
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Writes the entry atomically: temporary file, fsync, rename, all inside
 * the checked subdirectory's descriptor. Readers see the old file or the
 * whole new one; concurrent writers of one key both succeed and the last
 * rename wins (the contents are the same). 0, an errno value, or -1 when
 * the subdirectory is not trusted (nothing written: the read before the
 * compile counted it). */
static int disk_write(w16_cache_t *c, w16_key_t key, const void *blob,
                      size_t size)
{
    char sub[PATH_BUF], path[PATH_BUF], why[WHY_MAX], tmp[TMP_NAME];
    const char *name = entry_paths(c, key, sub, path);
    int sfd;
    sub_status_t ss = open_sub(sub, true, &sfd, why);
    if (ss == SUB_UNTRUSTED)
        return -1;
    if (ss != SUB_OK)
        return errno ? errno : EIO;
    int fd = open_tmp(c, sfd, name, tmp);
    if (fd < 0) {
        int e = errno;
        close(sfd);
        return e;
    }
    unsigned char h[DISK_HEADER];
    disk_header_t d = {.key = key, .size = size, .hash = w16_hash64(blob, size)};
    header_encode(h, &d);
    int rc = write_full(fd, h, sizeof h) == 0 &&
                     write_full(fd, blob, size) == 0 && fsync(fd) == 0
                 ? 0
                 : errno;
    if (close(fd) != 0 && rc == 0)
        rc = errno;
    if (rc == 0 && renameat(sfd, tmp, sfd, name) != 0)
        rc = errno;
    if (rc != 0)
        unlinkat(sfd, tmp, 0);
    close(sfd);
    return rc;
}

/* ---- producing a handle -------------------------------------------------------------- */

/* A disk hit: WNA16_OK with *handle. Anything else means "compile it";
 * a corrupt or untrusted entry, or one the loader refuses, has been
 * noted. */
static wna16_status_t disk_fetch(w16_cache_t *c, w16_key_t key,
                                 const w16_cache_loader_t *loader,
                                 void **handle)
{
    char sub[PATH_BUF], path[PATH_BUF];
    const char *name = entry_paths(c, key, sub, path);
    void *payload = NULL;
    size_t size = 0;
    bool untrusted = false;
    wna16_error_t why;
    wna16_status_t st = disk_read(c, sub, path, name, key, &payload, &size,
                                  &untrusted, &why);
    if (st == WNA16_ENOTFOUND || st == WNA16_ENOMEM)
        return st;
    if (st != WNA16_OK) {
        if (untrusted)
            note_untrusted(c, why.message);
        else
            note_corrupt(c, &why);
        return st;
    }
    wna16_error_clear(&why);
    st = loader->load(loader->user, payload, size, handle, &why);
    w16_free(c->ctx, payload, size);
    if (st != WNA16_OK) {
        w16_err_prefix(&why, "%s: the loader refused it", path);
        note_corrupt(c, &why);
    }
    return st;
}

/* Fills a message for a loader that failed without saying why. */
static wna16_status_t loader_failed(wna16_status_t st, const char *what,
                                    w16_key_t key, wna16_error_t *err)
{
    if (err->message[0]) {
        err->status = st;
        return st;
    }
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    return w16_err(err, st, "%s kernel %s failed: %s", what, hex,
                   wna16_status_text(st));
}

static void after_write(w16_cache_t *c, uint64_t bytes, w16_key_t key);

/* Compiles, loads, and publishes a blob the loader accepted. */
static wna16_status_t compile_and_publish(w16_cache_t *c, w16_key_t key,
                                          const w16_cache_loader_t *loader,
                                          void **handle, wna16_error_t *err)
{
    void *blob = NULL;
    size_t size = 0;
    bump(&c->compiles);
    wna16_status_t st = loader->compile(loader->user, key, &blob, &size, err);
    if (st == WNA16_OK && !blob && size)
        st = w16_err(err, WNA16_EINTERNAL, "compile returned no blob");
    if (st != WNA16_OK) {
        bump(&c->errors);
        return loader_failed(st, "compiling", key, err);
    }
    st = loader->load(loader->user, blob, size, handle, err);
    /* Only blobs the loader accepted, and that a reader would accept. */
    if (st == WNA16_OK && size <= W16_CACHE_MAX_PAYLOAD &&
        atomic_load(&c->disk_write)) {
        int rc = disk_write(c, key, blob, size);
        if (rc == 0) {
            bump(&c->writes);
            after_write(c, DISK_HEADER + (uint64_t)size, key);
        } else if (rc > 0) {
            disk_degrade(c, rc, true);
        }
    }
    w16_free(c->ctx, blob, size);
    if (st != WNA16_OK) {
        bump(&c->errors);
        return loader_failed(st, "loading", key, err);
    }
    return WNA16_OK;
}

static void ensure_disk(w16_cache_t *c);

static wna16_status_t produce(w16_cache_t *c, w16_key_t key,
                              const w16_cache_loader_t *loader, void **handle,
                              wna16_error_t *err)
{
    ensure_disk(c);
    if (atomic_load(&c->disk_read) &&
        disk_fetch(c, key, loader, handle) == WNA16_OK) {
        bump(&c->disk_hits);
        return WNA16_OK;
    }
    return compile_and_publish(c, key, loader, handle, err);
}

/* ---- get ---------------------------------------------------------------------------- */

/* Called with s->lock held on a BUSY entry; waits for its producer and
 * returns what it got. Unlocks. */
static wna16_status_t wait_for(w16_cache_t *c, shard_t *s, entry_t *e,
                               void **handle, wna16_error_t *err)
{
    e->refs++;
    while (e->state == E_BUSY)
        pthread_cond_wait(&s->done, &s->lock);
    e->refs--;
    if (e->state == E_READY) {
        *handle = e->handle;
        s->hits++;
        pthread_mutex_unlock(&s->lock);
        return WNA16_OK;
    }
    wna16_status_t st = e->status;
    if (err && e->error)
        *err = *e->error;
    else
        w16_err(err, st, "compiling a kernel failed: %s",
                wna16_status_text(st));
    bool last = e->refs == 0; /* FAILED entries are already unlinked */
    pthread_mutex_unlock(&s->lock);
    if (last)
        entry_free(c, e);
    return st;
}

/* Publishes the producer's result to the entry and wakes the waiters. */
static void finish(w16_cache_t *c, shard_t *s, entry_t *e, wna16_status_t st,
                   void *handle, const wna16_error_t *why)
{
    wna16_error_t *copy = NULL;
    if (st != WNA16_OK && (copy = w16_alloc(c->ctx, sizeof *copy)))
        *copy = *why; /* allocated outside the lock */
    pthread_mutex_lock(&s->lock);
    e->refs--;
    if (st == WNA16_OK) {
        e->state = E_READY;
        e->handle = handle;
        s->ready++;
    } else {
        e->state = E_FAILED;
        e->status = st;
        e->error = copy;
        shard_unlink(s, e); /* not cached: the next get retries */
    }
    bool free_now = st != WNA16_OK && e->refs == 0;
    pthread_cond_broadcast(&s->done);
    pthread_mutex_unlock(&s->lock);
    if (free_now)
        entry_free(c, e);
}

/* Called with s->lock held and no entry for key: becomes its producer.
 * Unlocks. */
static wna16_status_t produce_entry(w16_cache_t *c, shard_t *s, w16_key_t key,
                                    const w16_cache_loader_t *loader,
                                    void **handle, wna16_error_t *err)
{
    entry_t *e = w16_calloc(c->ctx, 1, sizeof *e);
    if (e) {
        e->key = key; /* before the insert: it picks the bucket */
        e->state = E_BUSY;
        e->refs = 1;
        e->unload = loader->unload;
        e->user = loader->unload_user ? loader->unload_user : loader->user;
    }
    if (!e || !shard_insert(c, s, e)) {
        pthread_mutex_unlock(&s->lock);
        w16_free(c->ctx, e, sizeof *e);
        return w16_err_nomem(err, "adding a kernel cache entry");
    }
    pthread_mutex_unlock(&s->lock);

    wna16_error_t why;
    wna16_error_clear(&why);
    void *h = NULL;
    wna16_status_t st = produce(c, key, loader, &h, &why);
    finish(c, s, e, st, h, &why);
    if (st == WNA16_OK)
        *handle = h;
    else if (err)
        *err = why;
    return st;
}

wna16_status_t w16_cache_get(w16_cache_t *c, w16_key_t key,
                             const w16_cache_loader_t *loader, void **handle,
                             wna16_error_t *err)
{
    if (!c || !loader || !loader->compile || !loader->load || !handle)
        return w16_err(err, WNA16_EINVAL,
                       "w16_cache_get: cache, loader (compile, load) and "
                       "handle are required");
    shard_t *s = shard_of(c, key);
    pthread_mutex_lock(&s->lock);
    entry_t *e = shard_find(s, key);
    if (e && e->state == E_READY) { /* the fast path */
        *handle = e->handle;
        s->hits++;
        pthread_mutex_unlock(&s->lock);
        return WNA16_OK;
    }
    if (e)
        return wait_for(c, s, e, handle, err);
    return produce_entry(c, s, key, loader, handle, err);
}

/* ---- create, destroy, stats ------------------------------------------------------ */

/* Picks, creates and checks the directory. Only running out of memory
 * fails; every other problem leaves the cache in memory with one warning.
 * Nothing is created inside a directory that is refused. */
static wna16_status_t setup_disk(w16_cache_t *c, wna16_error_t *err)
{
    char def[PATH_BUF];
    if (!c->dir) {
        if (w16_cache_default_dir(def, sizeof def) != WNA16_OK) {
            wna16_log(c->ctx, WNA16_LOG_WARN,
                      "kernel cache: no directory ($WNA16_CACHE_DIR, "
                      "$XDG_CACHE_HOME and $HOME are unset or too long); "
                      "caching in memory only");
            return WNA16_OK;
        }
        c->dir = w16_strdup(c->ctx, def);
        if (!c->dir)
            return w16_err_nomem(err, "creating the kernel cache");
    }
    if (strlen(c->dir) > DIR_MAX) {
        disk_degrade(c, ENAMETOOLONG, false);
        return WNA16_OK;
    }
    if (mkdir_p(c->dir) != 0) {
        disk_degrade(c, errno, false);
        return WNA16_OK;
    }
    char why[WHY_MAX];
    if (distrust_dir(c->dir, why)) {
        disk_refuse(c, why);
        return WNA16_OK;
    }
    atomic_store(&c->disk_read, true);
    atomic_store(&c->disk_write, true);
    return WNA16_OK;
}

/* A lazy cache's setup_disk, at its first miss; a no-op afterwards. Out of
 * memory here cannot fail the get: memory only, with a warning. */
static void ensure_disk(w16_cache_t *c)
{
    if (atomic_load_explicit(&c->disk_set, memory_order_acquire))
        return;
    pthread_mutex_lock(&c->setup_mu);
    if (!atomic_load_explicit(&c->disk_set, memory_order_relaxed)) {
        wna16_error_t err;
        if (setup_disk(c, &err) != WNA16_OK)
            wna16_log(c->ctx, WNA16_LOG_WARN, "kernel cache: %s; caching in "
                      "memory only", err.message);
        atomic_store_explicit(&c->disk_set, true, memory_order_release);
    }
    pthread_mutex_unlock(&c->setup_mu);
}

/* The size limit, with one warning for a $WNA16_CACHE_MAX_SIZE that is not
 * a size (the default then applies). */
static void setup_limit(w16_cache_t *c, uint64_t option)
{
    wna16_error_t err;
    if (w16_cache_limit(option, &c->limit, &c->limit_source, &err) !=
        WNA16_OK)
        wna16_log(c->ctx, WNA16_LOG_WARN,
                  "kernel cache: %s; using the default limit of %llu bytes",
                  err.message, (unsigned long long)c->limit);
}

static bool shard_init(shard_t *s)
{
    memset(s, 0, sizeof *s);
    if (pthread_mutex_init(&s->lock, NULL) != 0)
        return false;
    if (pthread_cond_init(&s->done, NULL) != 0) {
        pthread_mutex_destroy(&s->lock);
        return false;
    }
    return true;
}

static bool locks_init(w16_cache_t *c)
{
    if (pthread_mutex_init(&c->setup_mu, NULL) != 0)
        return false;
    if (pthread_mutex_init(&c->trim_mu, NULL) != 0) {
        pthread_mutex_destroy(&c->setup_mu);
        return false;
    }
    return c->locks_ready = true;
}

w16_cache_t *w16_cache_create(wna16_context_t *ctx,
                              const w16_cache_options_t *opts,
                              wna16_error_t *err)
{
    if (!ctx) {
        w16_err(err, WNA16_EINVAL, "w16_cache_create: context is NULL");
        return NULL;
    }
    w16_cache_t *c = w16_calloc(ctx, 1, sizeof *c);
    if (!c) {
        w16_err_nomem(err, "creating the kernel cache");
        return NULL;
    }
    c->ctx = ctx;
    atomic_init(&c->disk_set, false);
    atomic_init(&c->disk_read, false);
    atomic_init(&c->disk_write, false);
    atomic_init(&c->warned_corrupt, false);
    atomic_init(&c->warned_disk, false);
    atomic_init(&c->warned_untrusted, false);
    atomic_init(&c->warned_trim, false);
    atomic_init(&c->disk_hits, 0);
    atomic_init(&c->compiles, 0);
    atomic_init(&c->writes, 0);
    atomic_init(&c->corrupt, 0);
    atomic_init(&c->untrusted, 0);
    atomic_init(&c->evictions, 0);
    atomic_init(&c->errors, 0);
    atomic_init(&c->tmp_serial, 0);
    atomic_init(&c->disk_bytes, 0);
    atomic_init(&c->writes_since_scan, 0);
    atomic_init(&c->scanned, false);
    if (!locks_init(c)) {
        w16_err(err, WNA16_EINTERNAL, "kernel cache: cannot create a lock");
        w16_cache_destroy(c);
        return NULL;
    }
    for (; c->shards_ready < SHARDS; c->shards_ready++) {
        if (!shard_init(&c->shards[c->shards_ready])) {
            w16_err(err, WNA16_EINTERNAL, "kernel cache: cannot create a lock");
            w16_cache_destroy(c);
            return NULL;
        }
    }
    c->want_disk = !opts || !opts->memory_only;
    const char *dir = opts ? opts->dir : NULL;
    if (c->want_disk && dir && *dir && !(c->dir = w16_strdup(ctx, dir))) {
        w16_err_nomem(err, "creating the kernel cache");
        w16_cache_destroy(c);
        return NULL;
    }
    c->limit = WNA16_CACHE_UNLIMITED; /* memory only: nothing to limit */
    if (c->want_disk)
        setup_limit(c, opts ? opts->max_bytes : 0);
    if (!c->want_disk || (opts && opts->lazy_disk))
        atomic_store(&c->disk_set, !c->want_disk);
    else if (setup_disk(c, err) != WNA16_OK) {
        w16_cache_destroy(c);
        return NULL;
    } else
        atomic_store(&c->disk_set, true);
    return c;
}

static void shard_fini(w16_cache_t *c, shard_t *s)
{
    size_t n = s->buckets ? s->mask + 1 : 0;
    for (size_t i = 0; i < n; i++) {
        for (entry_t *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            if (e->state == E_READY && e->unload)
                e->unload(e->user, e->handle);
            entry_free(c, e);
        }
    }
    w16_free(c->ctx, s->buckets, n * sizeof *s->buckets);
    pthread_cond_destroy(&s->done);
    pthread_mutex_destroy(&s->lock);
}

void w16_cache_destroy(w16_cache_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->shards_ready; i++)
        shard_fini(c, &c->shards[i]);
    if (c->locks_ready) {
        pthread_mutex_destroy(&c->trim_mu);
        pthread_mutex_destroy(&c->setup_mu);
    }
    w16_strfree(c->ctx, c->dir);
    w16_free(c->ctx, c, sizeof *c);
}

void w16_cache_get_stats(w16_cache_t *c, w16_cache_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    for (size_t i = 0; i < SHARDS; i++) {
        shard_t *s = &c->shards[i];
        pthread_mutex_lock(&s->lock);
        out->memory_hits += s->hits;
        out->entries += s->ready;
        pthread_mutex_unlock(&s->lock);
    }
    out->disk_hits = atomic_load(&c->disk_hits);
    out->compiles = atomic_load(&c->compiles);
    out->disk_writes = atomic_load(&c->writes);
    out->corrupt = atomic_load(&c->corrupt);
    out->untrusted = atomic_load(&c->untrusted);
    out->evictions = atomic_load(&c->evictions);
    out->errors = atomic_load(&c->errors);
    out->disk_readable = atomic_load(&c->disk_read);
    out->disk_writable = atomic_load(&c->disk_write);
    out->max_bytes = c->limit;
    out->max_source = c->limit_source;
    out->disk_bytes = atomic_load(&c->disk_bytes);
}

const char *w16_cache_dir(const w16_cache_t *c)
{
    /* disk_set's release orders a lazy setup's write of dir before it. */
    return c && atomic_load_explicit(&c->disk_set, memory_order_acquire)
               ? c->dir
               : NULL;
}

const char *w16_cache_dir_setup(w16_cache_t *c)
{
    if (c && c->want_disk)
        ensure_disk(c);
    return w16_cache_dir(c);
}

/* ---- the directory ------------------------------------------------------------------ */

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

wna16_status_t w16_cache_default_dir(char *out, size_t n)
{
    const char *v;
    int len;
    if ((v = env("WNA16_CACHE_DIR")))
        len = snprintf(out, n, "%s", v);
    else if ((v = env("XDG_CACHE_HOME")) && v[0] == '/')
        len = snprintf(out, n, "%s/wna16", v);
    else if ((v = env("HOME")))
        len = snprintf(out, n, "%s/.cache/wna16", v);
    else
        return WNA16_ENOTFOUND;
    return len < 0 || (size_t)len >= n ? WNA16_ELIMIT : WNA16_OK;
}

bool w16_cache_dir_refused(const char *dir, char *why, size_t n)
{
    char w[WHY_MAX];
    if (!dir || !*dir || !distrust_dir(dir, w))
        return false;
    snprintf(why, n, "%s", w);
    return true;
}

typedef enum { NAME_OTHER, NAME_ENTRY, NAME_TMP } name_kind_t;

static bool is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* Only names the cache itself writes count: "<32 hex>.wk" in the directory
 * named by its first two digits, and "<that>.tmp.<anything>". */
static name_kind_t name_kind(const char *sub, const char *name)
{
    if (strlen(name) < 35 || !is_hex(name, 32) || memcmp(name, sub, 2) != 0 ||
        memcmp(name + 32, ".wk", 3) != 0)
        return NAME_OTHER;
    if (name[35] == '\0')
        return NAME_ENTRY;
    return strncmp(name + 35, ".tmp.", 5) == 0 ? NAME_TMP : NAME_OTHER;
}

/* One entry as a trim sees it: when it was last used, its size, its name
 * ("<32 hex>.wk"; the subdirectory is its first two characters). */
typedef struct lru_item {
    struct timespec used;
    uint64_t bytes;
    char name[36];
} lru_item_t;

/* What a walk does: count the entries; clear them; or collect them for a
 * trim. Clear and collect also remove stale temporary files. */
typedef enum { WALK_COUNT, WALK_CLEAR, WALK_COLLECT } walk_mode_t;

typedef struct walk {
    walk_mode_t mode;
    time_t now;
    size_t files, removed;
    uint64_t bytes;
    /* WALK_COLLECT: the entries, in ctx's memory; nomem when some did not
     * fit (the trim is then skipped) */
    wna16_context_t *ctx;
    lru_item_t *items;
    size_t n, cap;
    bool nomem;
} walk_t;

static void collect(walk_t *w, const char *name, const struct stat *st)
{
    if (w->n == w->cap && !w->nomem) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        lru_item_t *p = w16_realloc(w->ctx, w->items, w->cap * sizeof *p,
                                    cap * sizeof *p);
        if (p) {
            w->items = p;
            w->cap = cap;
        } else {
            w->nomem = true;
        }
    }
    if (w->nomem)
        return;
    lru_item_t *it = &w->items[w->n++];
    it->used = st->st_mtim;
    it->bytes = (uint64_t)st->st_size;
    snprintf(it->name, sizeof it->name, "%s", name);
}

static wna16_status_t walk_file(int dfd, const char *dir, const char *sub,
                                const char *name, walk_t *w,
                                wna16_error_t *err)
{
    name_kind_t kind = name_kind(sub, name);
    struct stat st;
    if (kind == NAME_OTHER ||
        fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode))
        return WNA16_OK;
    if (kind == NAME_ENTRY) {
        w->files++;
        w->bytes += (uint64_t)st.st_size;
        if (w->mode == WALK_COLLECT)
            collect(w, name, &st);
    } else if (w->now - st.st_mtime < W16_CACHE_STALE_TMP_S) {
        return WNA16_OK; /* a writer may still be busy with it */
    }
    if (w->mode == WALK_COUNT || (w->mode == WALK_COLLECT && kind == NAME_ENTRY))
        return WNA16_OK;
    if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT)
        return w16_err(err, WNA16_EIO, "%s/%s/%s: cannot remove: %s", dir,
                       sub, name, strerror(errno));
    w->removed += kind == NAME_ENTRY;
    return WNA16_OK;
}

/* One "<dir>/xx" directory; symlinks are not followed. */
static wna16_status_t walk_sub(int top, const char *dir, const char *sub,
                               walk_t *w, wna16_error_t *err)
{
    int fd = openat(top, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR || is_link_errno(errno)
                   ? WNA16_OK
                   : w16_err(err, WNA16_EIO, "%s/%s: %s", dir, sub,
                             strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return w16_err(err, WNA16_EIO, "%s/%s: %s", dir, sub, strerror(errno));
    }
    wna16_status_t st = WNA16_OK;
    struct dirent *de;
    while (st == WNA16_OK && (de = readdir(d)))
        st = walk_file(dirfd(d), dir, sub, de->d_name, w, err);
    closedir(d);
    return st;
}

static wna16_status_t walk_dir(const char *dir, walk_t *w, wna16_error_t *err)
{
    if (!dir || !*dir)
        return w16_err(err, WNA16_EINVAL, "kernel cache: no directory given");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? WNA16_OK
                               : w16_err(err, WNA16_EIO, "%s: %s", dir,
                                         strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return w16_err(err, WNA16_EIO, "%s: %s", dir, strerror(errno));
    }
    wna16_status_t st = WNA16_OK;
    struct dirent *de;
    while (st == WNA16_OK && (de = readdir(d)))
        if (strlen(de->d_name) == 2 && is_hex(de->d_name, 2))
            st = walk_sub(dirfd(d), dir, de->d_name, w, err);
    closedir(d);
    return st;
}

wna16_status_t w16_cache_dir_stats(const char *dir, size_t *files,
                                   uint64_t *bytes, wna16_error_t *err)
{
    walk_t w = {.mode = WALK_COUNT, .now = time(NULL)};
    wna16_status_t st = walk_dir(dir, &w, err);
    if (files)
        *files = w.files;
    if (bytes)
        *bytes = w.bytes;
    return st;
}

wna16_status_t w16_cache_clear(const char *dir, size_t *removed,
                               wna16_error_t *err)
{
    walk_t w = {.mode = WALK_CLEAR, .now = time(NULL)};
    wna16_status_t st = walk_dir(dir, &w, err);
    if (removed)
        *removed = w.removed;
    return st;
}

/* ---- the size limit ------------------------------------------------------------------ */

/* ORDER LIMIT_SOURCE */
static const char *const LIMIT_SOURCE_NAMES[] = {"default", "env", "option"};

const char *w16_cache_limit_source_name(w16_cache_limit_source_t s)
{
    return (unsigned)s < sizeof LIMIT_SOURCE_NAMES / sizeof *LIMIT_SOURCE_NAMES
               ? LIMIT_SOURCE_NAMES[s]
               : "unknown";
}

bool w16_cache_parse_size(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    static const char units[] = "KMGT";
    const char *u = *s ? strchr(units, *s & ~0x20) : NULL;
    if (u && *u) { /* not the terminator: ' ' & ~0x20 is 0 */
        unsigned shift = 10 * (unsigned)(u - units + 1);
        if (v > UINT64_MAX >> shift)
            return false;
        v <<= shift;
        s++;
        if ((*s == 'i' || *s == 'I') && (s[1] == 'B' || s[1] == 'b'))
            s += 2;
        else if (*s == 'B' || *s == 'b')
            s++;
    }
    if (*s)
        return false;
    *out = v;
    return true;
}

wna16_status_t w16_cache_limit(uint64_t option, uint64_t *bytes,
                               w16_cache_limit_source_t *source,
                               wna16_error_t *err)
{
    *bytes = WNA16_CACHE_DEFAULT_MAX_BYTES;
    *source = W16_CACHE_LIMIT_DEFAULT;
    if (option) {
        *bytes = option;
        *source = W16_CACHE_LIMIT_OPTION;
        return WNA16_OK;
    }
    const char *v = env("WNA16_CACHE_MAX_SIZE");
    if (!v)
        return WNA16_OK;
    uint64_t n;
    if (!w16_cache_parse_size(v, &n))
        return w16_err(err, WNA16_EINVAL,
                       "WNA16_CACHE_MAX_SIZE='%s' is not a size (bytes, or "
                       "with a K, M, G or T suffix; 0 for no limit)", v);
    *bytes = n ? n : WNA16_CACHE_UNLIMITED;
    *source = W16_CACHE_LIMIT_ENV;
    return WNA16_OK;
}

/* Least recently used first; the name breaks ties, so that every process
 * picks the same order. */
static int lru_cmp(const void *a, const void *b)
{
    const lru_item_t *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec)
        return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    if (x->used.tv_nsec != y->used.tv_nsec)
        return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Rescans the directory and removes least recently used entries until it
 * holds at most W16_CACHE_TRIM_TO_PERCENT of the limit; `keep` (the entry
 * just written) stays. One thread of a cache at a time: another that
 * finds the trim under way skips its own. */
static void trim(w16_cache_t *c, w16_key_t keep)
{
    if (pthread_mutex_trylock(&c->trim_mu) != 0)
        return;
    walk_t w = {.mode = WALK_COLLECT, .now = time(NULL), .ctx = c->ctx};
    wna16_error_t err;
    wna16_status_t st = walk_dir(c->dir, &w, &err);
    atomic_store(&c->scanned, true);
    atomic_store(&c->writes_since_scan, 0);
    atomic_store(&c->disk_bytes, w.bytes);
    if (st != WNA16_OK || w.nomem) {
        if (w.nomem)
            w16_err_nomem(&err, "listing the kernel cache's entries");
        if (first_time(&c->warned_trim))
            wna16_log(c->ctx, WNA16_LOG_WARN,
                      "kernel cache: %s; its size limit is not enforced "
                      "this time", err.message);
    } else if (w.bytes > c->limit) {
        uint64_t target = c->limit / 100 * W16_CACHE_TRIM_TO_PERCENT +
                          c->limit % 100 * W16_CACHE_TRIM_TO_PERCENT / 100;
        char hex[W16_KEY_HEX_SIZE], path[PATH_BUF];
        w16_key_hex(keep, hex);
        qsort(w.items, w.n, sizeof *w.items, lru_cmp);
        uint64_t left = w.bytes, freed = 0;
        size_t removed = 0;
        for (size_t i = 0; i < w.n && left > target; i++) {
            if (strncmp(w.items[i].name, hex, 32) == 0)
                continue;
            snprintf(path, sizeof path, "%s/%.2s/%s", c->dir,
                     w.items[i].name, w.items[i].name);
            /* ENOENT: another process removed or is replacing it. */
            if (unlink(path) != 0 && errno != ENOENT)
                continue;
            left -= w.items[i].bytes;
            freed += w.items[i].bytes;
            removed++;
        }
        atomic_store(&c->disk_bytes, left);
        atomic_fetch_add(&c->evictions, removed);
        wna16_log(c->ctx, WNA16_LOG_INFO,
                  "kernel cache: %s held %llu bytes, over its limit of %llu "
                  "(%s); removed the %zu least recently used entr%s (%llu "
                  "bytes)", c->dir, (unsigned long long)w.bytes,
                  (unsigned long long)c->limit,
                  w16_cache_limit_source_name(c->limit_source), removed,
                  removed == 1 ? "y" : "ies", (unsigned long long)freed);
    }
    w16_free(c->ctx, w.items, w.cap * sizeof *w.items);
    pthread_mutex_unlock(&c->trim_mu);
}

/* After this cache wrote an entry of `bytes`: trims when its count goes
 * over the limit, at its first write (the directory's size is unknown
 * until then) and every W16_CACHE_RESCAN_WRITES writes. */
static void after_write(w16_cache_t *c, uint64_t bytes, w16_key_t key)
{
    if (c->limit == WNA16_CACHE_UNLIMITED)
        return;
    uint64_t size = atomic_fetch_add(&c->disk_bytes, bytes) + bytes;
    unsigned since = atomic_fetch_add(&c->writes_since_scan, 1) + 1;
    if (size > c->limit || since >= W16_CACHE_RESCAN_WRITES ||
        !atomic_load(&c->scanned))
        trim(c, key);
}

/* ---- the context's caches ------------------------------------------------------ */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

wna16_status_t w16_context_cache(wna16_context_t *ctx, struct w16_cache **out,
                                 wna16_error_t *err)
{
    pthread_mutex_lock(&cache_mu);
    if (!ctx->cache) {
        /* no dir: the default, or memory only with a warning */
        w16_cache_options_t o = {0};
        ctx->cache = w16_cache_create(ctx, &o, err);
    }
    pthread_mutex_unlock(&cache_mu);
    *out = ctx->cache;
    return ctx->cache ? WNA16_OK : (err ? err->status : WNA16_ENOMEM);
}

wna16_status_t w16_context_plans(wna16_context_t *ctx, struct w16_cache **out,
                                 wna16_error_t *err)
{
    pthread_mutex_lock(&cache_mu);
    if (!ctx->plans) {
        w16_cache_options_t o = {.memory_only = true};
        ctx->plans = w16_cache_create(ctx, &o, err);
    }
    pthread_mutex_unlock(&cache_mu);
    *out = ctx->plans;
    return ctx->plans ? WNA16_OK : (err ? err->status : WNA16_ENOMEM);
}
