/*
 * cache_test.h - shared pieces of the kernel cache tests: a fake loader
 * whose "compile" derives deterministic bytes from the key (and counts its
 * calls) and whose "load" checks those bytes and allocates a handle; a
 * context whose log callback counts warnings; and paths into a cache
 * directory. Every test passes an explicit directory, never $HOME.
 */
#ifndef WNA16_CACHE_TEST_H
#define WNA16_CACHE_TEST_H

#include "runtime/cache/cache.h"
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct fake {
    wna16_context_t *ctx;
    atomic_int compiles, loads, unloads;
    atomic_int fail_compiles; /* the next this-many compiles fail */
    atomic_int refuse_loads;  /* the next this-many loads fail */
    int compile_delay_ms;     /* widens race windows */
} fake_t;

#define FAKE_HANDLE_MAGIC 0x5eedf00du
#define FAKE_COMPILE_ERROR "fake compiler: syntax error in kernel"

typedef struct fake_handle {
    uint32_t magic;
    w16_key_t key;
} fake_handle_t;

void fake_init(fake_t *f, wna16_context_t *ctx);
w16_cache_loader_t fake_loader(fake_t *f);
/* Size of the blob the fake compiles for key (64 .. 1087 bytes). */
size_t fake_blob_size(w16_key_t key);
/* Is h a live fake handle for key? */
bool fake_handle_ok(const void *h, w16_key_t key);

/* Warnings and info messages logged through a ct_context. */
typedef struct logcap {
    pthread_mutex_t lock;
    int warnings, infos;
    char last[2048];      /* the last warning */
    char last_info[2048]; /* the last info message */
} logcap_t;

/* A context without built-in specs (fast) that logs into cap, from the
 * info level up. */
wna16_context_t *ct_context(logcap_t *cap);
/* The same with cache options (cache_dir, cache_max_bytes). */
wna16_context_t *ct_context_cache(logcap_t *cap, const char *cache_dir,
                                  uint64_t cache_max_bytes);
int ct_warnings(logcap_t *cap);
/* A copy of the last warning. */
void ct_last(logcap_t *cap, char *out, size_t n);

/* Removes a test's temporary tree (after a passing run). */
void ct_rmtree(const char *dir);

/* A key from one number (keyer: "cache test", i). */
w16_key_t ct_key(uint64_t i);
/* <dir>/<xx>/<hex>.wk */
void ct_entry_path(const char *dir, w16_key_t key, char *out, size_t n);
/* A cache on dir; exits 1 on failure. */
w16_cache_t *ct_cache(wna16_context_t *ctx, const char *dir);
/* Gets key through the fake and checks the handle; returns it (or NULL). */
void *ct_get(w16_cache_t *c, fake_t *f, w16_key_t key);

#endif
