/*
 * pack.h - ahead-of-time kernel packs: one read-only file holding many
 * compiled kernels for several targets and architectures, built once
 * (`wna16 pack build`, runtime/pack_write.c) and memory-mapped by every
 * process that uses it. It is the kernel cache's third level (memory, then
 * packs, then the disk cache and the compiler): a kernel is found by its
 * request key (gen/request_key.h) and the target and architecture it was
 * compiled for, so that no compiler is needed to load it. The format (both
 * directions: serializing a list of entries and reading a mapped file) is
 * here, beside the cache it extends; writing the file goes through
 * runtime/output.c (pack_write.c), and the context's list of packs is
 * runtime/cache/pack_set.c.
 *
 * The file, little-endian throughout:
 *
 *   +--------------------------------------------------------------------+
 *   | header (128 bytes)                                                 |
 *   |   0 magic "W16PACK\0"     8 u32 format version   12 u32 header size |
 *   |  16 u32 entry size       20 u32 entries          24 u32 hash algo   |
 *   |  28 u32 flags (0)        32 u64 index offset     40 u64 strings off |
 *   |  48 u64 strings size     56 u64 payload offset   64 u64 payload size|
 *   |  72 u64 file size        80 u32 generator (str)  84 u32 compilers   |
 *   |  88 u32 pack name (str)  92 u32 reserved         96 u64 meta sum    |
 *   | 104 .. 128 zero                                                    |
 *   +--------------------------------------------------------------------+
 *   | index: entries x 64 bytes, sorted by key (hi, then lo), no repeats |
 *   |   0 u64 key hi   8 u64 key lo   16 u64 offset (in the payload)     |
 *   |  24 u64 size    32 u64 checksum (hash64 of the entry's bytes)      |
 *   |  40 u32 name    44 u32 symbol  48 u32 target  52 u32 arch          |
 *   |  56 u32 family  60 u32 reserved (0)             (u32: string offs) |
 *   +--------------------------------------------------------------------+
 *   | strings: NUL-terminated, referenced by offset                      |
 *   +--------------------------------------------------------------------+
 *   | payload: each entry's bytes at a multiple of 64                    |
 *   +--------------------------------------------------------------------+
 *
 * The meta checksum is hash64 (base/hash.h; the algorithm numbered in the
 * header) of everything before the payload with its own 8 bytes zeroed:
 * a damaged header, index or string table refuses the whole file; a
 * damaged entry is found by its own checksum when it is used (or by
 * `wna16 pack verify`) and refused alone. An entry's key is
 * w16_pack_entry_key(request key, target, arch). Entries are sorted and
 * strings interned in order of first use, so the same entries give the
 * same bytes.
 */
#ifndef W16_PACK_H
#define W16_PACK_H

#include "base/base.h"
#include "base/hash.h"

#define W16_PACK_MAGIC "W16PACK"    /* 8 bytes with its NUL */
#define W16_PACK_FORMAT_VERSION 1
#define W16_PACK_HEADER_SIZE 128
#define W16_PACK_ENTRY_SIZE 64
#define W16_PACK_ALIGN 64           /* each entry's bytes */

/* The key an entry is indexed by: the request key XOR the key of its
 * target and architecture (w16_pack_arch_key), so that a lookup hashes
 * nothing per request once the architectures' keys are known. */
w16_key_t w16_pack_entry_key(w16_key_t request, const char *target,
                             const char *arch);
w16_key_t w16_pack_arch_key(const char *target, const char *arch);

/* ---- writing (bytes in memory) ------------------------------------------ */

/* One kernel to pack. The strings and bytes stay the caller's. */
typedef struct w16_pack_item {
    w16_key_t request;   /* gen/request_key.h */
    const char *name;    /* the kernel's readable name */
    const char *symbol;  /* its entry point in `data` */
    const char *target;  /* "cpu", "cuda" */
    const char *arch;    /* "x86-64-v3", "sm_90a", "compute_80" */
    const char *family;  /* the manifest's family it came from */
    const void *data;
    size_t size;
} w16_pack_item_t;

/* The whole file for `items` (sorted here; an item whose key repeats an
 * earlier one is dropped, as the same key means the same kernel) into
 * *out (w16_alloc on ctx, *out_size bytes; the caller frees it with
 * w16_free). `generator` and `compilers` are recorded in the header. */
wna16_status_t w16_pack_serialize(wna16_context_t *ctx, const char *pack_name,
                                  const char *generator, const char *compilers,
                                  const w16_pack_item_t *items, size_t n,
                                  void **out, size_t *out_size,
                                  wna16_error_t *err);

/* ---- reading (a mapped file) --------------------------------------------- */

typedef struct w16_pack w16_pack_t;

typedef struct w16_pack_info {
    const char *path, *name, *generator, *compilers; /* the pack's own */
    uint32_t format_version, entries;
    int hash_algo;       /* as w16_hash_algo() numbers it */
    uint64_t file_size, payload_size;
} w16_pack_info_t;

typedef struct w16_pack_entry {
    w16_key_t key;
    const char *name, *symbol, *target, *arch, *family; /* the pack's */
    const void *data;    /* in the mapping, W16_PACK_ALIGN aligned */
    uint64_t size, checksum, offset;
} w16_pack_entry_t;

/* Maps `path` read-only and checks its header, index and strings. A file
 * that is not a pack, a format version this library does not read, or a
 * damaged index is an error naming the path and what is wrong
 * (WNA16_EFORMAT; WNA16_EIO when it cannot be read). *out is malloc'd:
 * close it with w16_pack_close, which unmaps it. Thread safe once open. */
wna16_status_t w16_pack_open(const char *path, w16_pack_t **out,
                             wna16_error_t *err);
void w16_pack_close(w16_pack_t *p);

void w16_pack_get_info(const w16_pack_t *p, w16_pack_info_t *out);
uint32_t w16_pack_count(const w16_pack_t *p);
/* Entry i (0 <= i < count) in index order. */
void w16_pack_entry(const w16_pack_t *p, uint32_t i, w16_pack_entry_t *out);
/* Binary search for `key`: true and *i when present. */
bool w16_pack_find(const w16_pack_t *p, w16_key_t key, uint32_t *i);
/* Is entry i's checksum right? The hash of its bytes (about 10 GB/s). */
bool w16_pack_entry_intact(const w16_pack_t *p, uint32_t i);


/* ---- the context's packs (pack_set.c) ------------------------------------ */

/* Adds the pack at `path` to the context's list, searched in the order
 * added (the packs of $WNA16_PACK_PATH come first, read at the first
 * lookup). A pack built by another generator version or hash algorithm
 * is kept but skipped, with one warning. Errors: the path cannot be
 * opened, or it is not a pack (w16_pack_open's messages). Thread safe. */
wna16_status_t w16_packs_add(wna16_context_t *ctx, const char *path,
                             wna16_error_t *err);

/* Where a request was found. The pointers stay valid until the context
 * is destroyed. */
typedef struct w16_pack_hit {
    const w16_pack_t *pack;
    const char *pack_path;
    uint32_t index;
    w16_pack_entry_t entry;
} w16_pack_hit_t;

/* The "compile" of a memory table of packed kernels: checks the hit's
 * entry against its checksum (EFORMAT naming pack, entry, target and arch
 * when damaged) and hands over a copy of the hit as the blob (*size its
 * size; the bytes stay in the mapping). The copy is the table's, freed
 * with w16_free(ctx, blob, *size). */
wna16_status_t w16_pack_hit_fetch(wna16_context_t *ctx,
                                  const w16_pack_hit_t *hit, void **blob,
                                  size_t *size, wna16_error_t *err);

/* Looks `request` up for `target`, trying arches[0 .. n) in order (the
 * best this device runs first) in each pack. *found is false when no pack
 * holds it. The first lookup of a context reads $WNA16_PACK_PATH
 * (colon-separated pack files; empty items are ignored): a path there
 * that is not a pack fails this and every later lookup with its reason.
 * A pack holding `target` entries only for other architectures says so
 * once (WNA16_LOG_INFO). */
wna16_status_t w16_packs_find(wna16_context_t *ctx, w16_key_t request,
                              const char *target, const char *const *arches,
                              int n_arches, w16_pack_hit_t *hit, bool *found,
                              wna16_error_t *err);

/* Whether a usable pack of the context holds entries for `target` (any
 * architecture). Reads $WNA16_PACK_PATH like a lookup; false on its
 * errors. */
bool w16_packs_have(wna16_context_t *ctx, const char *target);

/* The memory table of kernels loaded from the context's packs, keyed by
 * entry key (runtime/target/target.c fills it). Created on first use. */
struct w16_cache;
wna16_status_t w16_packs_loaded(wna16_context_t *ctx, struct w16_cache **out,
                                wna16_error_t *err);

/* Unloads what was loaded from the packs, unmaps them and frees the list
 * (context teardown; no lookup may be in flight). */
void w16_packs_free(wna16_context_t *ctx);

#endif /* W16_PACK_H */
