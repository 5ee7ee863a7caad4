/*
 * cache.h - the kernel cache: content-hash keys, a thread-safe in-memory
 * table of loaded kernel handles and an on-disk store of compiled blobs.
 * The cache is generic: it never sees LLVM, CUDA or spec structures, only
 * 128-bit keys (computed by the caller from everything that determines the
 * code, with w16_keyer_* of base/hash.h), opaque serialized blobs and opaque handles, which
 * a caller-supplied w16_cache_loader_t produces. A lookup tries memory, then
 * disk, then compiles; concurrent requests for one key compile it once.
 * Disk entries are written atomically (temporary file, fsync, rename),
 * checksummed and versioned; a corrupt or foreign entry is recompiled and
 * overwritten, never trusted; an unwritable directory degrades the cache to
 * memory only with one warning. Since the entries become native code, the
 * directory, its subdirectories and each entry must belong to the user and
 * be writable by nobody else (as ccache and pip ask): a directory that is
 * not is left alone (memory only, one warning), an entry that is not is
 * recompiled and counted as untrusted. The directory has a size limit,
 * kept by removing the least recently used entries (their mtime, touched
 * on every disk hit). The file format is drawn in cache.c.
 */
#ifndef W16_CACHE_H
#define W16_CACHE_H

#include "wna16.h"
#include "base/hash.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the cache --------------------------------------------------------------- */

typedef struct w16_cache w16_cache_t;

/* What the caller plugs in; the cache calls it outside its locks, possibly
 * from several threads at once (for different keys).
 *   compile: produce the serialized artifact for `key` in *blob, allocated
 *            with w16_alloc on the cache's context (the cache frees it with
 *            w16_free(ctx, blob, size)); on error *blob is ignored.
 *   load:    turn a blob (fresh or read back from disk) into a live handle;
 *            the blob stays owned by the cache. An error for a disk blob
 *            makes the cache recompile it.
 *   unload:  release a handle; called by w16_cache_destroy with
 *            unload_user (which must outlive the cache), or with user when
 *            unload_user is NULL. May be NULL.
 * One key must always mean one artifact: handles are shared by every caller
 * asking for that key, whichever loader they pass. The callbacks may get
 * other keys from the same cache, never the key they are producing (that
 * waits for itself). */
typedef struct w16_cache_loader {
    wna16_status_t (*compile)(void *user, w16_key_t key, void **blob,
                              size_t *blob_size, wna16_error_t *err);
    wna16_status_t (*load)(void *user, const void *blob, size_t size,
                           void **handle, wna16_error_t *err);
    void (*unload)(void *user, void *handle);
    void *user;
    void *unload_user;
} w16_cache_loader_t;

/* Where a cache's size limit came from. ORDER LIMIT_SOURCE */
typedef enum w16_cache_limit_source {
    W16_CACHE_LIMIT_DEFAULT, /* WNA16_CACHE_DEFAULT_MAX_BYTES */
    W16_CACHE_LIMIT_ENV,     /* $WNA16_CACHE_MAX_SIZE */
    W16_CACHE_LIMIT_OPTION,  /* w16_cache_options_t.max_bytes (the
                                context's cache_max_bytes) */
} w16_cache_limit_source_t;

typedef struct w16_cache_options {
    /* NULL: w16_cache_default_dir(). */
    const char *dir;
    /* No disk level at all (no directory is created, nothing is warned). */
    bool memory_only;
    /* The directory's size limit in bytes. 0: w16_cache_limit's choice
     * ($WNA16_CACHE_MAX_SIZE, else the default); WNA16_CACHE_UNLIMITED:
     * none. */
    uint64_t max_bytes;
    /* Pick, create and check the directory at the first miss instead of
     * now (a cache made with its context touches no file until used). */
    bool lazy_disk;
} w16_cache_options_t;

typedef struct w16_cache_stats {
    uint64_t memory_hits; /* gets answered from the table (including
                             those that waited for another thread) */
    uint64_t disk_hits;   /* gets answered by loading a disk entry */
    uint64_t compiles;    /* calls to loader->compile */
    uint64_t disk_writes; /* entries published to disk */
    uint64_t corrupt;     /* disk entries rejected (and recompiled) */
    uint64_t untrusted;   /* disk entries not loaded because they, or their
                             subdirectory, are someone else's or writable
                             by others, or a symbolic link (recompiled) */
    uint64_t evictions;   /* disk entries removed to keep the size limit */
    uint64_t errors;      /* failed compile or load attempts (one per
                             attempt, however many threads waited on it) */
    size_t entries;       /* handles held in memory */
    bool disk_readable;   /* the disk level is looked up */
    bool disk_writable;   /* new entries are written to disk */
    uint64_t max_bytes;   /* the size limit; WNA16_CACHE_UNLIMITED: none */
    w16_cache_limit_source_t max_source;
    uint64_t disk_bytes;  /* the directory's entries as last scanned, plus
                             what this cache wrote since (an estimate: other
                             processes write too); 0 before the first write */
} w16_cache_stats_t;

/* Creates a cache. Disk problems (no usable directory) do not fail the
 * creation: the cache warns once and works in memory. NULL on out of
 * memory or bad arguments, with `err` filled. */
w16_cache_t *w16_cache_create(wna16_context_t *ctx,
                              const w16_cache_options_t *opts,
                              wna16_error_t *err);
/* Unloads every handle and frees the cache. No get may be in flight. */
void w16_cache_destroy(w16_cache_t *c);

/* The handle for `key`: from memory (no allocation, one shard lock), else
 * from disk, else compiled (and published to disk). Exactly one thread
 * produces a given key; others asking meanwhile wait and receive the same
 * handle, or the same error. Errors are not cached: a later get retries.
 * Handles stay valid until w16_cache_destroy. */
wna16_status_t w16_cache_get(w16_cache_t *c, w16_key_t key,
                             const w16_cache_loader_t *loader, void **handle,
                             wna16_error_t *err);

void w16_cache_get_stats(w16_cache_t *c, w16_cache_stats_t *out);
/* The directory configured (even if it turned out unusable: see the
 * stats' disk_readable), or NULL for memory_only, when no directory
 * could be determined, or before a lazy_disk cache's first miss. */
const char *w16_cache_dir(const w16_cache_t *c);
/* w16_cache_dir after setting a lazy cache's disk level up now (as its
 * first miss would: the directory chosen, created and checked, one warning
 * when it cannot be used); NULL when the cache is in memory only. */
const char *w16_cache_dir_setup(w16_cache_t *c);

/* ---- the directory ------------------------------------------------------------ */

/* $WNA16_CACHE_DIR, else $XDG_CACHE_HOME/wna16 (absolute only, as the XDG
 * spec says), else $HOME/.cache/wna16; empty variables count as unset.
 * WNA16_ENOTFOUND when none is set, WNA16_ELIMIT when `out` is too small. */
wna16_status_t w16_cache_default_dir(char *out, size_t n);

/* Number and total size of the entries (<dir>/xx/<32 hex>.wk). A missing
 * directory has 0 entries. */
wna16_status_t w16_cache_dir_stats(const char *dir, size_t *files,
                                   uint64_t *bytes, wna16_error_t *err);
/* Removes the entries and stale temporary files (<entry>.tmp.*, untouched
 * for W16_CACHE_STALE_TMP_S) of the two-level layout, nothing else: no other
 * files and no directories. A missing directory removes 0. */
wna16_status_t w16_cache_clear(const char *dir, size_t *removed,
                               wna16_error_t *err);

/* Would a cache refuse `dir` (an existing directory)? true with the reason
 * in why[n] ("owned by uid 1000, not you (0)", "writable by others (mode
 * 0777)") when it is not the user's alone; false when it is, or when it
 * does not exist or cannot be examined (w16_cache_dir_stats says why). */
bool w16_cache_dir_refused(const char *dir, char *why, size_t n);

/* ---- the size limit ------------------------------------------------------------ */

/* The limit a cache gets for `option` (as w16_cache_options_t.max_bytes):
 * the option when not 0, else $WNA16_CACHE_MAX_SIZE when set and not
 * empty (0 there means no limit), else WNA16_CACHE_DEFAULT_MAX_BYTES.
 * WNA16_EINVAL when the variable is not a size: *bytes and *source are the
 * default's, err names the variable and its value. */
wna16_status_t w16_cache_limit(uint64_t option, uint64_t *bytes,
                               w16_cache_limit_source_t *source,
                               wna16_error_t *err);
/* Parses a size: decimal digits, optionally followed by K, M, G or T
 * (powers of 1024, either case) and an optional "B" or "iB" after the
 * suffix ("2G", "512MiB", "1048576"). false when malformed or over 2^64. */
bool w16_cache_parse_size(const char *s, uint64_t *out);
/* "default", "env", "option". */
const char *w16_cache_limit_source_name(w16_cache_limit_source_t s);

/* When a write takes the directory over its limit, least recently used
 * entries go until it holds at most this share of the limit (in percent),
 * so that the next writes do not trim again at once. */
#define W16_CACHE_TRIM_TO_PERCENT 90
/* The directory is rescanned after this many writes of one cache even if
 * its own count stays under the limit: other processes write too. */
#define W16_CACHE_RESCAN_WRITES 64

/* A temporary file this old (seconds) belongs to a writer that died. */
#define W16_CACHE_STALE_TMP_S 600

/* Disk entries larger than this are refused as corrupt. */
#define W16_CACHE_MAX_PAYLOAD ((uint64_t)1 << 30)

/* ---- the context's caches ----------------------------------------------------- */

/* The kernel cache: $WNA16_CACHE_DIR and friends, or memory only (one
 * warning) when no directory can be named. Created on first use, or with
 * the context when its options name cache_dir or cache_max_bytes
 * (runtime/context.c; its disk level is then set up at the first miss). */
wna16_status_t w16_context_cache(wna16_context_t *ctx, w16_cache_t **out,
                                 wna16_error_t *err);
/* Memory only, for handles that hold addresses (runtime/repack_plan.c).
 * Created on first use. */
wna16_status_t w16_context_plans(wna16_context_t *ctx, w16_cache_t **out,
                                 wna16_error_t *err);

#endif /* W16_CACHE_H */
