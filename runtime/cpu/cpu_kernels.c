/*
 * cpu_kernels.c - compiled CPU kernels through the kernel cache. The cached
 * artifact is the relocatable object file; its entry symbol is derived from
 * the key, so an object read back from disk (by this or another process)
 * links under the same name. A memory hit costs one hash-table lookup.
 */
#include "runtime/cpu/cpu.h"
#include "runtime/cache/cache.h"
#include "gen/emit_llvm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_job {
    wna16_context_t *ctx;
    w16_cpu_t *cpu;
    const kir_kernel_t *kernel;
    char symbol[64];
} cpu_job_t;

static wna16_status_t job_compile(void *user, w16_key_t key, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    (void)key;
    cpu_job_t *j = user;
    void *obj = NULL;
    size_t n = 0;
    wna16_status_t st = w16_cpu_compile_object(j->cpu, j->kernel, j->symbol,
                                               &obj, &n, err);
    if (st != WNA16_OK)
        return st;
    /* the cache frees blobs with the context's allocator */
    *blob = w16_alloc(j->ctx, n);
    if (!*blob) {
        free(obj);
        return w16_err_nomem(err, "keeping a compiled kernel");
    }
    memcpy(*blob, obj, n);
    *size = n;
    free(obj);
    return WNA16_OK;
}

static wna16_status_t job_load(void *user, const void *blob, size_t size,
                               void **handle, wna16_error_t *err)
{
    cpu_job_t *j = user;
    w16_cpu_fn fn = NULL;
    wna16_status_t st = w16_cpu_load_object(j->cpu, blob, size, j->symbol, &fn,
                                            err);
    if (st == WNA16_OK)
        *handle = (void *)(uintptr_t)fn;
    return st;
}

wna16_status_t w16_cpu_kernel(wna16_context_t *ctx, w16_key_t key,
                              const kir_kernel_t *k, w16_cpu_fn *fn,
                              wna16_error_t *err)
{
    w16_cpu_t *cpu;
    w16_cache_t *cache;
    wna16_status_t st = w16_cpu_get(ctx, &cpu, err);
    if (st == WNA16_OK)
        st = w16_context_cache(ctx, &cache, err);
    if (st != WNA16_OK)
        return st;
    cpu_job_t job = {.ctx = ctx, .cpu = cpu, .kernel = k};
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(key, hex);
    snprintf(job.symbol, sizeof job.symbol, "wna16k_%s", hex);
    w16_cache_loader_t loader = {.compile = job_compile, .load = job_load,
                                 .user = &job};
    void *h = NULL;
    st = w16_cache_get(cache, key, &loader, &h, err);
    if (st == WNA16_OK)
        *fn = (w16_cpu_fn)(uintptr_t)h;
    return st;
}

void w16_cpu_key(w16_keyer_t *kr, w16_cpu_t *cpu)
{
    w16_keyer_str(kr, "cpu");
    w16_keyer_str(kr, w16_cpu_name(cpu));
    w16_keyer_str(kr, w16_cpu_features(cpu));
    w16_keyer_str(kr, w16_cpu_compiler_version());
}

wna16_status_t w16_cpu_kernel_key(wna16_context_t *ctx, const char *kind,
                                  const kir_kernel_t *k, w16_key_t *key,
                                  wna16_error_t *err)
{
    w16_cpu_t *cpu;
    wna16_status_t st = w16_cpu_get(ctx, &cpu, err);
    if (st != WNA16_OK)
        return st;
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    kir_print(&b, k);
    if (b.failed) {
        w16_buf_free(&b);
        return w16_err_nomem(err, "keying a kernel");
    }
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, kind);
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    w16_keyer_u64(&kr, W16_LLVM_EMITTER_VERSION);
    w16_cpu_key(&kr, cpu);
    w16_keyer_bytes(&kr, b.data, b.len);
    *key = w16_keyer_done(&kr);
    w16_buf_free(&b);
    return WNA16_OK;
}
