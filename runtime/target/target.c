/*
 * target.c - kernel IR kernels through the kernel cache on any target (see
 * target.h). The cache sees only keys, blobs and handles; this file turns a
 * target's descriptor into the cache's loader, so that no target writes
 * its own cache plumbing.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "runtime/target/target.h"
#include "runtime/cache/cache.h"
#include "runtime/cache/pack.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct target_job {
    wna16_context_t *ctx;
    const w16_target_t *T;
    void *inst;
    const kir_kernel_t *k;
    const char *source;
    char symbol[300];
    double compile_ms; /* when this call compiled, else 0 */
} target_job_t;

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static wna16_status_t job_compile(void *user, w16_key_t key, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    (void)key;
    target_job_t *j = user;
    if (j->ctx->no_jit)
        return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s (%s): in no kernel "
                       "pack of this context (WNA16_PACK_PATH, "
                       "wna16_context_add_pack) and JIT compilation is "
                       "disabled (WNA16_JIT=0 or the context's no_jit)",
                       j->k->name, j->T->name);
    double t0 = ms_now();
    wna16_status_t st = j->T->compile(j->inst, j->ctx, j->k, j->source,
                                      j->symbol, blob, size, err);
    j->compile_ms = ms_now() - t0;
    return st;
}

static wna16_status_t job_load(void *user, const void *blob, size_t size,
                               void **handle, wna16_error_t *err)
{
    target_job_t *j = user;
    return j->T->load(j->inst, blob, size, j->symbol, handle, err);
}

/* Handles outlive the job that loaded them: unload gets the (static)
 * descriptor as its user pointer, and each target's unload takes the
 * handle alone. */
static void job_unload(void *user, void *handle)
{
    const w16_target_t *T = user;
    if (T->unload)
        T->unload(handle);
}

/* The kernel's text and key; *text is the caller's to free. */
static wna16_status_t text_and_key(wna16_context_t *ctx, const w16_target_t *T,
                                   void *inst, const char *kind,
                                   const kir_kernel_t *k, w16_buf_t *text,
                                   w16_key_t *key, wna16_error_t *err)
{
    w16_buf_init(text, ctx);
    wna16_status_t st = T->source(inst, k, text, err);
    if (st == WNA16_OK && text->failed)
        st = w16_err_nomem(err, "printing a kernel");
    if (st != WNA16_OK) {
        w16_buf_free(text);
        return st;
    }
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, kind);
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    T->key(inst, &kr);
    w16_keyer_bytes(&kr, text->data, text->len);
    *key = w16_keyer_done(&kr);
    return WNA16_OK;
}

wna16_status_t w16_target_kernel_key(wna16_context_t *ctx,
                                     const w16_target_t *T, const char *kind,
                                     const kir_kernel_t *k, w16_key_t *key,
                                     wna16_error_t *err)
{
    void *inst;
    wna16_status_t st = T->probe(ctx, &inst, err);
    w16_buf_t text;
    if (st == WNA16_OK)
        st = text_and_key(ctx, T, inst, kind, k, &text, key, err);
    if (st == WNA16_OK)
        w16_buf_free(&text);
    return st;
}

wna16_status_t w16_target_kernel(wna16_context_t *ctx, const w16_target_t *T,
                                 const char *kind, const kir_kernel_t *k,
                                 void **fn, double *compile_ms,
                                 wna16_error_t *err)
{
    if (compile_ms)
        *compile_ms = 0;
    void *inst;
    w16_cache_t *cache;
    wna16_status_t st = T->probe(ctx, &inst, err);
    if (st == WNA16_OK)
        st = w16_context_cache(ctx, &cache, err);
    if (st != WNA16_OK)
        return st;
    w16_buf_t text;
    w16_key_t key;
    if ((st = text_and_key(ctx, T, inst, kind, k, &text, &key, err)) != WNA16_OK)
        return st;
    target_job_t job = {.ctx = ctx, .T = T, .inst = inst, .k = k,
                        .source = text.data};
    if (T->key_symbols) {
        char hex[W16_KEY_HEX_SIZE];
        w16_key_hex(key, hex);
        snprintf(job.symbol, sizeof job.symbol, "wna16k_%s", hex);
    } else {
        snprintf(job.symbol, sizeof job.symbol, "%s", k->name);
    }
    w16_cache_loader_t loader = {.compile = job_compile, .load = job_load,
                                 .unload = job_unload, .user = &job,
                                 .unload_user = (void *)(uintptr_t)T};
    void *h = NULL;
    st = w16_cache_get(cache, key, &loader, &h, err);
    w16_buf_free(&text);
    if (st != WNA16_OK)
        return st;
    *fn = h;
    if (compile_ms)
        *compile_ms = job.compile_ms;
    return WNA16_OK;
}

/* ---- kernels from packs ------------------------------------------------- */

typedef struct pack_job {
    wna16_context_t *ctx;
    const w16_target_t *T;
    void *inst;
    const w16_pack_hit_t *hit;
} pack_job_t;

/* The "compile" of the packs' memory table: check the entry's bytes and
 * hand the table the hit itself. */
static wna16_status_t pack_fetch(void *user, w16_key_t key, void **blob,
                                 size_t *size, wna16_error_t *err)
{
    (void)key;
    pack_job_t *j = user;
    return w16_pack_hit_fetch(j->ctx, j->hit, blob, size, err);
}

static wna16_status_t pack_load(void *user, const void *blob, size_t size,
                                void **handle, wna16_error_t *err)
{
    (void)size;
    pack_job_t *j = user;
    const w16_pack_hit_t *h = blob;
    wna16_status_t st = j->T->load(j->inst, h->entry.data,
                                   (size_t)h->entry.size, h->entry.symbol,
                                   handle, err);
    if (st != WNA16_OK)
        w16_err_prefix(err, "kernel pack %s: entry %s (%s %s)", h->pack_path,
                       h->entry.name, h->entry.target, h->entry.arch);
    return st;
}

void w16_target_pack_symbol(const w16_target_t *T, w16_key_t request,
                            const kir_kernel_t *k, char *out, size_t n)
{
    if (T->key_symbols) {
        char hex[W16_KEY_HEX_SIZE];
        w16_key_hex(request, hex);
        snprintf(out, n, "wna16p_%s", hex);
    } else {
        snprintf(out, n, "%s", k->name);
    }
}

enum { MAX_ARCHES = 16 };

wna16_status_t w16_target_kernel_req(wna16_context_t *ctx,
                                     const w16_target_t *T, const char *kind,
                                     w16_key_t request, const kir_kernel_t *k,
                                     void **fn, double *compile_ms,
                                     wna16_error_t *err)
{
    if (compile_ms)
        *compile_ms = 0;
    if (!T->pack_arches)
        return w16_target_kernel(ctx, T, kind, k, fn, compile_ms, err);
    void *inst;
    wna16_status_t st = T->probe(ctx, &inst, err);
    if (st != WNA16_OK)
        return st;
    const char *arches[MAX_ARCHES];
    int n = T->pack_arches(inst, arches, MAX_ARCHES);
    w16_pack_hit_t hit;
    bool found = false;
    if ((st = w16_packs_find(ctx, request, T->name, arches, n, &hit, &found,
                             err)) != WNA16_OK)
        return st;
    if (found) {
        w16_cache_t *mem;
        if ((st = w16_packs_loaded(ctx, &mem, err)) != WNA16_OK)
            return st;
        pack_job_t job = {.ctx = ctx, .T = T, .inst = inst, .hit = &hit};
        w16_cache_loader_t loader = {.compile = pack_fetch, .load = pack_load,
                                     .unload = job_unload, .user = &job,
                                     .unload_user = (void *)(uintptr_t)T};
        wna16_error_t perr;
        void *h = NULL;
        st = w16_cache_get(mem, hit.entry.key, &loader, &h, &perr);
        if (st == WNA16_OK) {
            *fn = h;
            return WNA16_OK;
        }
        if (st == WNA16_ENOMEM)
            return w16_err(err, st, "%s", perr.message);
        /* a damaged entry, or one that does not load: refused, named once,
         * and the kernel compiled as if no pack held it */
        char key[W16_KEY_HEX_SIZE + 64], hex[W16_KEY_HEX_SIZE];
        w16_key_hex(hit.entry.key, hex);
        snprintf(key, sizeof key, "pack_refused:%s", hex);
        w16_log_once(ctx, WNA16_LOG_WARN, key, "%s; %s", perr.message,
                     ctx->no_jit ? "JIT compilation is disabled, so the "
                                   "kernel fails"
                                 : "compiling the kernel instead");
    }
    return w16_target_kernel(ctx, T, kind, k, fn, compile_ms, err);
}
