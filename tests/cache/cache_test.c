/*
 * cache_test.c - the fake loader, log capture and path helpers shared by
 * the kernel cache tests (see cache_test.h). The fake's blob starts with
 * the key and continues with a xorshift stream seeded by it, so load can
 * tell a right blob from a wrong or damaged one without any state.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "cache_test.h"
#include "base/base.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

size_t fake_blob_size(w16_key_t key) { return 64 + (size_t)(key.lo % 1024); }

static void fill_blob(unsigned char *b, size_t n, w16_key_t key)
{
    memcpy(b, &key.lo, 8);
    memcpy(b + 8, &key.hi, 8);
    uint64_t s = key.lo ^ (key.hi * 0x9E3779B97F4A7C15ull) ^ 1;
    for (size_t i = 16; i < n; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        b[i] = (unsigned char)((s * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Takes one from a "fail the next n" counter; true if this call fails. */
static bool take_one(atomic_int *n)
{
    int left = atomic_load(n);
    while (left > 0 && !atomic_compare_exchange_weak(n, &left, left - 1))
        ;
    return left > 0;
}

static wna16_status_t fake_compile(void *user, w16_key_t key, void **blob,
                                   size_t *size, wna16_error_t *err)
{
    fake_t *f = user;
    atomic_fetch_add(&f->compiles, 1);
    if (f->compile_delay_ms)
        sleep_ms(f->compile_delay_ms);
    if (take_one(&f->fail_compiles))
        return w16_err(err, WNA16_ESPEC, FAKE_COMPILE_ERROR);
    size_t n = fake_blob_size(key);
    unsigned char *b = w16_alloc(f->ctx, n);
    if (!b)
        return w16_err_nomem(err, "fake compile");
    fill_blob(b, n, key);
    *blob = b;
    *size = n;
    return WNA16_OK;
}

static wna16_status_t fake_load(void *user, const void *blob, size_t size,
                                void **handle, wna16_error_t *err)
{
    fake_t *f = user;
    if (take_one(&f->refuse_loads))
        return w16_err(err, WNA16_EUNAVAILABLE, "fake driver: no device");
    w16_key_t key;
    if (size < 16)
        return w16_err(err, WNA16_EFORMAT, "fake load: blob too small");
    memcpy(&key.lo, blob, 8);
    memcpy(&key.hi, (const char *)blob + 8, 8);
    unsigned char expect[1100];
    if (size != fake_blob_size(key))
        return w16_err(err, WNA16_EFORMAT, "fake load: wrong size");
    fill_blob(expect, size, key);
    if (memcmp(expect, blob, size) != 0)
        return w16_err(err, WNA16_EFORMAT, "fake load: wrong bytes");
    fake_handle_t *h = w16_alloc(f->ctx, sizeof *h);
    if (!h)
        return w16_err_nomem(err, "fake load");
    h->magic = FAKE_HANDLE_MAGIC;
    h->key = key;
    *handle = h;
    atomic_fetch_add(&f->loads, 1);
    return WNA16_OK;
}

static void fake_unload(void *user, void *handle)
{
    fake_t *f = user;
    fake_handle_t *h = handle;
    h->magic = 0;
    w16_free(f->ctx, h, sizeof *h);
    atomic_fetch_add(&f->unloads, 1);
}

void fake_init(fake_t *f, wna16_context_t *ctx)
{
    memset(f, 0, sizeof *f);
    f->ctx = ctx;
    atomic_init(&f->compiles, 0);
    atomic_init(&f->loads, 0);
    atomic_init(&f->unloads, 0);
    atomic_init(&f->fail_compiles, 0);
    atomic_init(&f->refuse_loads, 0);
}

w16_cache_loader_t fake_loader(fake_t *f)
{
    return (w16_cache_loader_t){.compile = fake_compile,
                                .load = fake_load,
                                .unload = fake_unload,
                                .user = f};
}

bool fake_handle_ok(const void *h, w16_key_t key)
{
    const fake_handle_t *fh = h;
    return fh && fh->magic == FAKE_HANDLE_MAGIC && w16_key_equal(fh->key, key);
}

static void capture(void *user, wna16_log_level_t level, const char *msg)
{
    logcap_t *cap = user;
    pthread_mutex_lock(&cap->lock);
    if (level == WNA16_LOG_WARN) {
        cap->warnings++;
        snprintf(cap->last, sizeof cap->last, "%s", msg);
    } else if (level == WNA16_LOG_INFO) {
        cap->infos++;
        snprintf(cap->last_info, sizeof cap->last_info, "%s", msg);
    }
    pthread_mutex_unlock(&cap->lock);
}

wna16_context_t *ct_context(logcap_t *cap)
{
    return ct_context_cache(cap, NULL, 0);
}

wna16_context_t *ct_context_cache(logcap_t *cap, const char *cache_dir,
                                  uint64_t cache_max_bytes)
{
    pthread_mutex_init(&cap->lock, NULL);
    cap->warnings = cap->infos = 0;
    cap->last[0] = cap->last_info[0] = '\0';
    wna16_context_options_t o = {.log = capture,
                                 .log_user = cap,
                                 .log_level = WNA16_LOG_INFO,
                                 .no_builtin_specs = true,
                                 .cache_dir = cache_dir,
                                 .cache_max_bytes = cache_max_bytes};
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    if (wna16_context_create(&o, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "context: %s\n", err.message);
        exit(1);
    }
    return ctx;
}

int ct_warnings(logcap_t *cap)
{
    pthread_mutex_lock(&cap->lock);
    int n = cap->warnings;
    pthread_mutex_unlock(&cap->lock);
    return n;
}

void ct_last(logcap_t *cap, char *out, size_t n)
{
    pthread_mutex_lock(&cap->lock);
    snprintf(out, n, "%s", cap->last);
    pthread_mutex_unlock(&cap->lock);
}

static int rm_one(const char *path, const struct stat *st, int type,
                  struct FTW *ftw)
{
    remove(path);
    return 0;
}

void ct_rmtree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

w16_key_t ct_key(uint64_t i)
{
    w16_keyer_t k;
    w16_keyer_init(&k);
    w16_keyer_str(&k, "cache test");
    w16_keyer_u64(&k, i);
    return w16_keyer_done(&k);
}

void ct_entry_path(const char *dir, w16_key_t key, char *out, size_t n)
{
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    snprintf(out, n, "%s/%.2s/%s.wk", dir, hex, hex);
}

w16_cache_t *ct_cache(wna16_context_t *ctx, const char *dir)
{
    w16_cache_options_t o = {.dir = dir};
    wna16_error_t err;
    w16_cache_t *c = w16_cache_create(ctx, &o, &err);
    if (!c) {
        fprintf(stderr, "w16_cache_create: %s\n", err.message);
        exit(1);
    }
    return c;
}

void *ct_get(w16_cache_t *c, fake_t *f, w16_key_t key)
{
    w16_cache_loader_t l = fake_loader(f);
    void *h = NULL;
    wna16_error_t err;
    wna16_status_t st = w16_cache_get(c, key, &l, &h, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s", err.message);
    TU_CHECK(st != WNA16_OK || fake_handle_ok(h, key));
    return st == WNA16_OK ? h : NULL;
}
