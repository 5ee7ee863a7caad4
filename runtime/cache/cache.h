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
 * memory only with one warning. The file format is drawn in cache.c.
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

typedef struct w16_cache_options {
    /* NULL: w16_cache_default_dir(). */
    const char *dir;
    /* No disk level at all (no directory is created, nothing is warned). */
    bool memory_only;
} w16_cache_options_t;

typedef struct w16_cache_stats {
    uint64_t memory_hits; /* gets answered from the table (including
                             those that waited for another thread) */
    uint64_t disk_hits;   /* gets answered by loading a disk entry */
    uint64_t compiles;    /* calls to loader->compile */
    uint64_t disk_writes; /* entries published to disk */
    uint64_t corrupt;     /* disk entries rejected (and recompiled) */
    uint64_t errors;      /* failed compile or load attempts (one per
                             attempt, however many threads waited on it) */
    size_t entries;       /* handles held in memory */
    bool disk_readable;   /* the disk level is looked up */
    bool disk_writable;   /* new entries are written to disk */
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
 * stats' disk_readable), or NULL for memory_only or when no directory
 * could be determined. */
const char *w16_cache_dir(const w16_cache_t *c);

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

/* A temporary file this old (seconds) belongs to a writer that died. */
#define W16_CACHE_STALE_TMP_S 600

/* Disk entries larger than this are refused as corrupt. */
#define W16_CACHE_MAX_PAYLOAD ((uint64_t)1 << 30)

/* ---- the context's caches ----------------------------------------------------- */

/* The kernel cache: $WNA16_CACHE_DIR and friends, or memory only when no
 * directory can be named. Created on first use. */
wna16_status_t w16_context_cache(wna16_context_t *ctx, w16_cache_t **out,
                                 wna16_error_t *err);
/* Memory only, for handles that hold addresses (runtime/repack_plan.c).
 * Created on first use. */
wna16_status_t w16_context_plans(wna16_context_t *ctx, w16_cache_t **out,
                                 wna16_error_t *err);

#endif /* W16_CACHE_H */
