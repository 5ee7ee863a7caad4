/*
 * cache.h - the kernel cache: content-hash keys, a thread-safe in-memory
 * table of loaded kernel handles and an on-disk store of compiled blobs.
 * The cache is generic: it never sees LLVM, CUDA or spec structures, only
 * 128-bit keys (computed by the caller from everything that determines the
 * code, with w16_keyer_*), opaque serialized blobs and opaque handles, which
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- keys ------------------------------------------------------------------ */

/* A 128-bit content hash (XXH3-128, or the built-in fallback; see
 * w16_cache_hash_name). Printed as 32 lowercase hex digits, hi first. */
typedef struct w16_key {
    uint64_t lo, hi;
} w16_key_t;

#define W16_KEY_HEX_SIZE 33 /* 32 hex digits and the NUL */

/* Streaming key builder. Every call adds one self-delimiting field (a type
 * tag, the length, then the bytes), so field boundaries are part of the key:
 * str("ab") + str("c") differs from str("a") + str("bc"), and u64(5)
 * differs from bytes of the same 8 bytes. Lives on the stack (the storage
 * is 64-byte aligned as XXH3's state requires; do not memcpy it into
 * malloc'd memory). No allocation, no failure. */
typedef struct w16_keyer {
    _Alignas(64) unsigned char opaque_[640];
} w16_keyer_t;

void w16_keyer_init(w16_keyer_t *k);
void w16_keyer_bytes(w16_keyer_t *k, const void *data, size_t n);
/* NULL is a field of its own, distinct from "". */
void w16_keyer_str(w16_keyer_t *k, const char *s);
void w16_keyer_u64(w16_keyer_t *k, uint64_t v);
/* The key; the keyer must be re-initialized before reuse. */
w16_key_t w16_keyer_done(w16_keyer_t *k);

void w16_key_hex(w16_key_t key, char out[W16_KEY_HEX_SIZE]);
bool w16_key_equal(w16_key_t a, w16_key_t b);

/* "xxh3" when built with xxHash, "builtin" otherwise (MurmurHash3_x64_128,
 * see cache.c). Keys and disk entries of the two builds never match. */
const char *w16_cache_hash_name(void);

/* The built-in 128-bit hash (MurmurHash3_x64_128, seed 0) in one shot;
 * exported so tests check it against the reference vectors even in builds
 * that use XXH3. lo = h1, hi = h2 of the reference implementation. */
w16_key_t w16_cache_builtin_hash128(const void *data, size_t n);

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
 *   unload:  release a handle; called by w16_cache_destroy. May be NULL.
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
