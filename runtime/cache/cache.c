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
    char *dir; /* NULL: no disk level */
    atomic_bool disk_read, disk_write;
    atomic_bool warned_corrupt, warned_disk;
    atomic_uint_fast64_t disk_hits, compiles, writes, corrupt, errors;
    atomic_uint tmp_serial;
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
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
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

/* "<dir>/ab/<hex>.wk"; the directory length was bounded at creation. */
static void entry_path(const w16_cache_t *c, w16_key_t key, char out[PATH_BUF])
{
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    snprintf(out, PATH_BUF, "%s/%.2s/%s.wk", c->dir, hex, hex);
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

/* Reads and verifies the entry at `path`. WNA16_OK with the payload
 * (w16_alloc'd, *size bytes); WNA16_ENOTFOUND when there is no entry;
 * WNA16_ENOMEM; WNA16_EFORMAT when it is corrupt, foreign or unreadable
 * (err names the file and says why). */
static wna16_status_t disk_read(w16_cache_t *c, const char *path,
                                w16_key_t key, void **payload, size_t *size,
                                wna16_error_t *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return WNA16_ENOTFOUND;
        return w16_err(err, WNA16_EFORMAT, "%s: %s", path, strerror(errno));
    }
    wna16_status_t st = read_fd(c, fd, path, key, payload, size, err);
    close(fd);
    return st;
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

/* Opens "<path>.tmp.<pid>.<random>" exclusively; fd or -1 with errno. */
static int open_tmp(w16_cache_t *c, const char *path, char tmp[PATH_BUF])
{
    for (int attempt = 0; attempt < 16; attempt++) {
        snprintf(tmp, PATH_BUF, "%s.tmp.%ld.%016llx", path, (long)getpid(),
                 (unsigned long long)tmp_nonce(c));
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Makes "<dir>/ab", recreating <dir> if it vanished; 0 or -1 with errno. */
static int make_subdir(const char *path)
{
    char sub[PATH_BUF];
    size_t n = (size_t)(strrchr(path, '/') - path);
    memcpy(sub, path, n);
    sub[n] = '\0';
    if (mkdir(sub, 0700) == 0 || errno == EEXIST)
        return 0;
    return errno == ENOENT ? mkdir_p(sub) : -1;
}

/* Writes the entry atomically: temporary file, fsync, rename. Readers see
 * the old file or the whole new one; concurrent writers of one key both
 * succeed and the last rename wins (the contents are the same). 0 or an
 * errno value. */
static int disk_write(w16_cache_t *c, w16_key_t key, const void *blob,
                      size_t size)
{
    char path[PATH_BUF], tmp[PATH_BUF];
    entry_path(c, key, path);
    if (make_subdir(path) != 0)
        return errno;
    int fd = open_tmp(c, path, tmp);
    if (fd < 0)
        return errno;
    unsigned char h[DISK_HEADER];
    disk_header_t d = {.key = key, .size = size, .hash = w16_hash64(blob, size)};
    header_encode(h, &d);
    int rc = write_full(fd, h, sizeof h) == 0 &&
                     write_full(fd, blob, size) == 0 && fsync(fd) == 0
                 ? 0
                 : errno;
    if (close(fd) != 0 && rc == 0)
        rc = errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = errno;
    if (rc != 0)
        unlink(tmp);
    return rc;
}

/* ---- producing a handle -------------------------------------------------------------- */

/* A disk hit: WNA16_OK with *handle. Anything else means "compile it";
 * a corrupt entry or one the loader refuses has been noted. */
static wna16_status_t disk_fetch(w16_cache_t *c, w16_key_t key,
                                 const w16_cache_loader_t *loader,
                                 void **handle)
{
    char path[PATH_BUF];
    entry_path(c, key, path);
    void *payload = NULL;
    size_t size = 0;
    wna16_error_t why;
    wna16_status_t st = disk_read(c, path, key, &payload, &size, &why);
    if (st == WNA16_ENOTFOUND || st == WNA16_ENOMEM)
        return st;
    if (st != WNA16_OK) {
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
        if (rc == 0)
            bump(&c->writes);
        else
            disk_degrade(c, rc, true);
    }
    w16_free(c->ctx, blob, size);
    if (st != WNA16_OK) {
        bump(&c->errors);
        return loader_failed(st, "loading", key, err);
    }
    return WNA16_OK;
}

static wna16_status_t produce(w16_cache_t *c, w16_key_t key,
                              const w16_cache_loader_t *loader, void **handle,
                              wna16_error_t *err)
{
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

/* Picks and creates the directory. Only running out of memory fails;
 * every other problem leaves the cache in memory with one warning. */
static wna16_status_t setup_disk(w16_cache_t *c, const char *dir,
                                 wna16_error_t *err)
{
    char def[PATH_BUF];
    if (!dir || !*dir) {
        if (w16_cache_default_dir(def, sizeof def) != WNA16_OK) {
            wna16_log(c->ctx, WNA16_LOG_WARN,
                      "kernel cache: no directory ($WNA16_CACHE_DIR, "
                      "$XDG_CACHE_HOME and $HOME are unset or too long); "
                      "caching in memory only");
            return WNA16_OK;
        }
        dir = def;
    }
    c->dir = w16_strdup(c->ctx, dir);
    if (!c->dir)
        return w16_err_nomem(err, "creating the kernel cache");
    if (strlen(dir) > DIR_MAX) {
        disk_degrade(c, ENAMETOOLONG, false);
        return WNA16_OK;
    }
    if (mkdir_p(dir) != 0) {
        disk_degrade(c, errno, false);
        return WNA16_OK;
    }
    atomic_store(&c->disk_read, true);
    atomic_store(&c->disk_write, true);
    return WNA16_OK;
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
    atomic_init(&c->disk_read, false);
    atomic_init(&c->disk_write, false);
    atomic_init(&c->warned_corrupt, false);
    atomic_init(&c->warned_disk, false);
    atomic_init(&c->disk_hits, 0);
    atomic_init(&c->compiles, 0);
    atomic_init(&c->writes, 0);
    atomic_init(&c->corrupt, 0);
    atomic_init(&c->errors, 0);
    atomic_init(&c->tmp_serial, 0);
    for (; c->shards_ready < SHARDS; c->shards_ready++) {
        if (!shard_init(&c->shards[c->shards_ready])) {
            w16_err(err, WNA16_EINTERNAL, "kernel cache: cannot create a lock");
            w16_cache_destroy(c);
            return NULL;
        }
    }
    if ((!opts || !opts->memory_only) &&
        setup_disk(c, opts ? opts->dir : NULL, err) != WNA16_OK) {
        w16_cache_destroy(c);
        return NULL;
    }
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
    out->errors = atomic_load(&c->errors);
    out->disk_readable = atomic_load(&c->disk_read);
    out->disk_writable = atomic_load(&c->disk_write);
}

const char *w16_cache_dir(const w16_cache_t *c) { return c ? c->dir : NULL; }

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

typedef struct walk {
    bool clear;
    time_t now;
    size_t files, removed;
    uint64_t bytes;
} walk_t;

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
    } else if (w->now - st.st_mtime < W16_CACHE_STALE_TMP_S) {
        return WNA16_OK; /* a writer may still be busy with it */
    }
    if (!w->clear)
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
        return errno == ENOENT || errno == ENOTDIR || errno == ELOOP
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
    walk_t w = {.clear = false, .now = time(NULL)};
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
    walk_t w = {.clear = true, .now = time(NULL)};
    wna16_status_t st = walk_dir(dir, &w, err);
    if (removed)
        *removed = w.removed;
    return st;
}

/* ---- the context's caches ------------------------------------------------------ */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

wna16_status_t w16_context_cache(wna16_context_t *ctx, struct w16_cache **out,
                                 wna16_error_t *err)
{
    pthread_mutex_lock(&cache_mu);
    if (!ctx->cache) {
        char dir[4096];
        w16_cache_options_t o = {0};
        if (w16_cache_default_dir(dir, sizeof dir) == WNA16_OK)
            o.dir = dir;
        else
            o.memory_only = true;
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
