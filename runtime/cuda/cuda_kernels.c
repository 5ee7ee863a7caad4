/*
 * cuda_kernels.c - generated CUDA kernels through the kernel cache. A
 * kernel IR kernel is emitted as one CUDA C translation unit; the key is
 * that text plus everything else that decides the binary (the device's
 * architecture, NVRTC's and the driver's versions), so a change in the
 * builder or the emitter changes the key by itself. The cached artifact is
 * the CUBIN and the PTX in one blob (drawn in cuda_desc.h), and the live
 * handle is the loaded module with its kernel functions. A unit the caller
 * knows by its request key (the fused MoE's, gen/request_key.h) is looked
 * up in the context's kernel packs first (w16_cuda_unit_packed), without
 * printing or hashing its text; with JIT disabled nothing is compiled.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "runtime/cuda/cuda_kernels.h"
#include "runtime/cuda/cuda_desc.h"
#include "gen/emit_cuda.h"
#include "runtime/cache/cache.h"
#include "runtime/cache/pack.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct w16_cuda_loaded {
    w16_cuda_module_t *module;
    int n_fns;
    w16_cuda_function_t *fns[W16_CUDA_MODULE_MAX_FNS];
};

typedef struct cuda_job {
    wna16_context_t *ctx;
    w16_cuda_t *cuda;
    const char *source;
    const char *name;          /* the unit, in messages */
    const char *const *fn_names;
    int n_fns;
    double compile_ms; /* NVRTC time when this call compiled, else 0 */
} cuda_job_t;

wna16_status_t w16_cuda_blob_compile(wna16_context_t *ctx, w16_cuda_t *cuda,
                                     const char *source, const char *unit,
                                     int n_fns, void **blob, size_t *size,
                                     double *compile_ms, wna16_error_t *err)
{
    w16_cuda_image_t img;
    double t0 = now_ms();
    wna16_status_t st = w16_nvrtc_compile_unit(ctx, source, unit, n_fns,
                                               w16_cuda_cc_major(cuda),
                                               w16_cuda_cc_minor(cuda),
                                               &img, err);
    if (compile_ms)
        *compile_ms = now_ms() - t0;
    if (st != WNA16_OK)
        return st;
    if (!img.cubin_size && !img.ptx_size) {
        w16_cuda_image_free(&img);
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: NVRTC produced "
                       "neither a CUBIN nor PTX", unit);
    }
    size_t n = 16 + img.cubin_size + img.ptx_size;
    unsigned char *b = w16_alloc(ctx, n);
    if (!b) {
        w16_cuda_image_free(&img);
        return w16_err_nomem(err, "keeping a compiled CUDA kernel");
    }
    uint64_t sizes[2] = {img.cubin_size, img.ptx_size};
    memcpy(b, sizes, 16);
    if (img.cubin_size)
        memcpy(b + 16, img.cubin, img.cubin_size);
    if (img.ptx_size)
        memcpy(b + 16 + img.cubin_size, img.ptx, img.ptx_size);
    w16_cuda_image_free(&img);
    *blob = b;
    *size = n;
    return WNA16_OK;
}

wna16_status_t w16_cuda_blob_load(w16_cuda_t *cuda, const void *blob,
                                  size_t size, const char *unit,
                                  const char *const *fn_names, int n_fns,
                                  w16_cuda_loaded_t **out, wna16_error_t *err)
{
    uint64_t sizes[2];
    if (n_fns < 1 || n_fns > W16_CUDA_MODULE_MAX_FNS)
        return w16_err(err, WNA16_EINVAL, "CUDA unit %s: %d kernels (1 to %d)",
                       unit, n_fns, W16_CUDA_MODULE_MAX_FNS);
    if (size < 16)
        return w16_err(err, WNA16_EFORMAT, "kernel %s: cached CUDA blob of %zu "
                       "bytes is too short", unit, size);
    memcpy(sizes, blob, 16);
    if (sizes[0] > size - 16 || sizes[1] > size - 16 - sizes[0] ||
        16 + sizes[0] + sizes[1] != size)
        return w16_err(err, WNA16_EFORMAT, "kernel %s: cached CUDA blob sizes "
                       "do not add up", unit);
    /* the PTX must be NUL-terminated for the driver's JIT: copy it out */
    w16_cuda_image_t img = {.cubin_size = sizes[0], .ptx_size = sizes[1],
                            .cc_major = w16_cuda_cc_major(cuda),
                            .cc_minor = w16_cuda_cc_minor(cuda)};
    img.cubin = sizes[0] ? (unsigned char *)blob + 16 : NULL;
    char *ptx = NULL;
    if (sizes[1]) {
        ptx = malloc(sizes[1] + 1);
        if (!ptx)
            return w16_err_nomem(err, "loading a cached CUDA kernel");
        memcpy(ptx, (const unsigned char *)blob + 16 + sizes[0], sizes[1]);
        ptx[sizes[1]] = 0;
        img.ptx = ptx;
    }
    w16_cuda_loaded_t *k = calloc(1, sizeof *k);
    wna16_status_t st = k ? w16_cuda_module_load(cuda, &img, &k->module, err)
                          : w16_err_nomem(err, "loading a CUDA kernel");
    free(ptx);
    for (int i = 0; st == WNA16_OK && i < n_fns; i++)
        st = w16_cuda_function(k->module, fn_names[i], &k->fns[i], err);
    if (k)
        k->n_fns = n_fns;
    if (st != WNA16_OK) {
        w16_cuda_loaded_free(k);
        return st;
    }
    *out = k;
    return WNA16_OK;
}

w16_cuda_function_t *w16_cuda_loaded_fn(const w16_cuda_loaded_t *l, int i)
{
    return i >= 0 && i < l->n_fns ? l->fns[i] : NULL;
}

int w16_cuda_loaded_count(const w16_cuda_loaded_t *l) { return l->n_fns; }

void w16_cuda_loaded_free(w16_cuda_loaded_t *l)
{
    if (!l)
        return;
    w16_cuda_module_unload(l->module);
    free(l);
}

static wna16_status_t job_compile(void *user, w16_key_t key, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    (void)key;
    cuda_job_t *j = user;
    if (j->ctx->no_jit)
        return w16_err(err, WNA16_EUNAVAILABLE, "CUDA unit %s: in no kernel "
                       "pack of this context (WNA16_PACK_PATH, "
                       "wna16_context_add_pack) and JIT compilation is "
                       "disabled (WNA16_JIT=0 or the context's no_jit)",
                       j->name);
    return w16_cuda_blob_compile(j->ctx, j->cuda, j->source, j->name,
                                 j->n_fns, blob, size, &j->compile_ms, err);
}

static wna16_status_t job_load(void *user, const void *blob, size_t size,
                               void **handle, wna16_error_t *err)
{
    cuda_job_t *j = user;
    w16_cuda_loaded_t *l = NULL;
    wna16_status_t st = w16_cuda_blob_load(j->cuda, blob, size, j->name,
                                           j->fn_names, j->n_fns, &l, err);
    if (st == WNA16_OK)
        *handle = l;
    return st;
}

static void job_unload(void *user, void *handle)
{
    (void)user; /* the job that loaded it is long gone */
    w16_cuda_loaded_free(handle);
}

wna16_status_t w16_cuda_kernel_source(wna16_context_t *ctx,
                                      const kir_kernel_t *k, char **out,
                                      wna16_error_t *err)
{
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    wna16_status_t st = w16_emit_cuda(k, true, &b, err);
    w16_buf_putc(&b, 0);
    if (st == WNA16_OK && b.failed)
        st = w16_err_nomem(err, "emitting CUDA C");
    if (st != WNA16_OK) {
        w16_buf_free(&b);
        return st;
    }
    *out = malloc(b.len);
    if (!*out) {
        w16_buf_free(&b);
        return w16_err_nomem(err, "emitting CUDA C");
    }
    memcpy(*out, b.data, b.len);
    w16_buf_free(&b);
    return WNA16_OK;
}

void w16_cuda_key(w16_keyer_t *kr, w16_cuda_t *cuda)
{
    w16_keyer_str(kr, "cuda");
    w16_keyer_u64(kr, (uint64_t)w16_cuda_cc_major(cuda));
    w16_keyer_u64(kr, (uint64_t)w16_cuda_cc_minor(cuda));
    w16_keyer_str(kr, w16_nvrtc_version());
    w16_keyer_str(kr, w16_cuda_driver_version(cuda));
}

wna16_status_t w16_cuda_module_get(wna16_context_t *ctx, const char *unit,
                                   const char *source,
                                   const char *const *fn_names, int n_fns,
                                   w16_cuda_function_t **fns,
                                   double *compile_ms, wna16_error_t *err)
{
    w16_cuda_t *cuda;
    w16_cache_t *cache;
    if (compile_ms)
        *compile_ms = 0;
    if (n_fns < 1 || n_fns > W16_CUDA_MODULE_MAX_FNS)
        return w16_err(err, WNA16_EINVAL, "CUDA unit %s: %d kernels (1 to %d)",
                       unit, n_fns, W16_CUDA_MODULE_MAX_FNS);
    wna16_status_t st = w16_cuda_get(ctx, &cuda, err);
    if (st == WNA16_OK)
        st = w16_context_cache(ctx, &cache, err);
    if (st != WNA16_OK)
        return st;
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 cuda kernel");
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    w16_cuda_key(&kr, cuda);
    for (int i = 0; i < n_fns; i++)
        w16_keyer_str(&kr, fn_names[i]);
    w16_keyer_str(&kr, source);
    w16_key_t key = w16_keyer_done(&kr);
    cuda_job_t job = {.ctx = ctx, .cuda = cuda, .source = source,
                      .name = unit, .fn_names = fn_names, .n_fns = n_fns};
    w16_cache_loader_t loader = {.compile = job_compile, .load = job_load,
                                 .unload = job_unload, .user = &job};
    void *h = NULL;
    st = w16_cache_get(cache, key, &loader, &h, err);
    if (st != WNA16_OK)
        return st;
    const w16_cuda_loaded_t *k = h;
    if (k->n_fns != n_fns) /* one key, one artifact: cannot happen */
        return w16_err(err, WNA16_EINTERNAL, "CUDA unit %s: cached module has "
                       "%d kernels, expected %d", unit, k->n_fns, n_fns);
    for (int i = 0; i < n_fns; i++)
        fns[i] = k->fns[i];
    if (compile_ms)
        *compile_ms = job.compile_ms;
    return WNA16_OK;
}

/* ---- units from kernel packs ------------------------------------------- */

/* Here rather than beside the descriptor (cuda_desc.c calls into this
 * file, never the other way). */
int w16_cuda_pack_arches_cc(int major, int minor, const char **out, int max)
{
    static const char *const sm[] = {
        "sm_100", "sm_90a", "sm_90", "sm_89", "sm_87", "sm_86", "sm_80",
        "sm_75", "sm_70"};
    static const int sm_cc[] = {100, 90, 90, 89, 87, 86, 80, 75, 70};
    static const char *const ptx[] = {"compute_100", "compute_90",
                                      "compute_89", "compute_86",
                                      "compute_80", "compute_75",
                                      "compute_70"};
    static const int ptx_cc[] = {100, 90, 89, 86, 80, 75, 70};
    int cc = major * 10 + minor, n = 0;
    for (size_t i = 0; i < sizeof sm / sizeof sm[0] && n < max; i++)
        if (sm_cc[i] / 10 == major && sm_cc[i] % 10 <= minor)
            out[n++] = sm[i];
    for (size_t i = 0; i < sizeof ptx / sizeof ptx[0] && n < max; i++)
        if (ptx_cc[i] <= cc)
            out[n++] = ptx[i];
    return n;
}


typedef struct packed_job {
    wna16_context_t *ctx;
    w16_cuda_t *cuda;
    const w16_pack_hit_t *hit;
    const char *const *fn_names;
    int n_fns;
} packed_job_t;

/* The packs' memory table's "compile": the entry's checksum, then the hit
 * itself as the blob (the bytes stay in the mapping). */
static wna16_status_t packed_fetch(void *user, w16_key_t key, void **blob,
                                   size_t *size, wna16_error_t *err)
{
    (void)key;
    packed_job_t *j = user;
    return w16_pack_hit_fetch(j->ctx, j->hit, blob, size, err);
}

static wna16_status_t packed_load(void *user, const void *blob, size_t size,
                                  void **handle, wna16_error_t *err)
{
    (void)size;
    packed_job_t *j = user;
    const w16_pack_hit_t *h = blob;
    w16_cuda_loaded_t *l = NULL;
    wna16_status_t st = w16_cuda_blob_load(j->cuda, h->entry.data,
                                           (size_t)h->entry.size,
                                           h->entry.name, j->fn_names,
                                           j->n_fns, &l, err);
    if (st != WNA16_OK) {
        w16_err_prefix(err, "kernel pack %s: entry %s (%s %s)", h->pack_path,
                       h->entry.name, h->entry.target, h->entry.arch);
        return st;
    }
    *handle = l;
    return WNA16_OK;
}

/* The packs' table outlives every job: its unload gets this (a static
 * object) as its user pointer, and job_unload reads none. */
static const char packed_unload_user;

enum { PACK_ARCHES_MAX = 16 };

wna16_status_t w16_cuda_unit_packed(wna16_context_t *ctx, w16_key_t request,
                                    const char *unit,
                                    const char *const *fn_names, int n_fns,
                                    w16_cuda_function_t **fns, bool *found,
                                    wna16_error_t *err)
{
    *found = false;
    if (n_fns < 1 || n_fns > W16_CUDA_MODULE_MAX_FNS)
        return w16_err(err, WNA16_EINVAL, "CUDA unit %s: %d kernels (1 to %d)",
                       unit, n_fns, W16_CUDA_MODULE_MAX_FNS);
    w16_cuda_t *cuda;
    wna16_status_t st = w16_cuda_get(ctx, &cuda, err);
    if (st != WNA16_OK)
        return st;
    const char *arches[PACK_ARCHES_MAX];
    int n = w16_cuda_pack_arches_cc(w16_cuda_cc_major(cuda),
                                    w16_cuda_cc_minor(cuda), arches,
                                    PACK_ARCHES_MAX);
    w16_pack_hit_t hit;
    bool hit_found = false;
    st = w16_packs_find(ctx, request, "cuda", arches, n, &hit, &hit_found,
                        err);
    if (st != WNA16_OK || !hit_found)
        return st;
    w16_cache_t *mem;
    if ((st = w16_packs_loaded(ctx, &mem, err)) != WNA16_OK)
        return st;
    packed_job_t job = {.ctx = ctx, .cuda = cuda, .hit = &hit,
                        .fn_names = fn_names, .n_fns = n_fns};
    w16_cache_loader_t loader = {.compile = packed_fetch, .load = packed_load,
                                 .unload = job_unload, .user = &job,
                                 .unload_user = (void *)&packed_unload_user};
    wna16_error_t perr;
    void *h = NULL;
    st = w16_cache_get(mem, hit.entry.key, &loader, &h, &perr);
    if (st == WNA16_OK) {
        const w16_cuda_loaded_t *l = h;
        if (l->n_fns != n_fns) /* one request, one unit: cannot happen */
            return w16_err(err, WNA16_EINTERNAL, "kernel pack %s: entry %s "
                           "has %d kernels, the request %d", hit.pack_path,
                           hit.entry.name, l->n_fns, n_fns);
        for (int i = 0; i < n_fns; i++)
            fns[i] = l->fns[i];
        *found = true;
        return WNA16_OK;
    }
    if (st == WNA16_ENOMEM)
        return w16_err(err, st, "%s", perr.message);
    /* a damaged entry, or one that does not load: refused, named once, and
     * the unit compiled as if no pack held it */
    char key[W16_KEY_HEX_SIZE + 64], hex[W16_KEY_HEX_SIZE];
    w16_key_hex(hit.entry.key, hex);
    snprintf(key, sizeof key, "pack_refused:%s", hex);
    w16_log_once(ctx, WNA16_LOG_WARN, key, "%s; %s", perr.message,
                 ctx->no_jit ? "JIT compilation is disabled, so the unit "
                               "fails"
                             : "compiling the unit instead");
    return WNA16_OK;
}

typedef struct unit_thread {
    wna16_context_t *ctx;
    w16_cuda_unit_req_t *req;
    wna16_status_t st;
    wna16_error_t err;
} unit_thread_t;

static void *unit_main(void *arg)
{
    unit_thread_t *t = arg;
    w16_cuda_unit_req_t *r = t->req;
    t->st = w16_cuda_module_get(t->ctx, r->unit, r->source, r->fn_names,
                                r->n_fns, r->fns, &r->compile_ms, &t->err);
    return NULL;
}

enum { UNITS_MAX = 8 };

wna16_status_t w16_cuda_modules_get(wna16_context_t *ctx,
                                    w16_cuda_unit_req_t *reqs, int n,
                                    wna16_error_t *err)
{
    if (n < 0 || n > UNITS_MAX)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_modules_get: %d units (0 "
                       "to %d)", n, UNITS_MAX);
    /* the target and the cache are made on first use: make them here,
     * before any thread can race to */
    w16_cuda_t *cuda;
    w16_cache_t *cache;
    wna16_status_t st = n ? w16_cuda_get(ctx, &cuda, err) : WNA16_OK;
    if (st == WNA16_OK && n)
        st = w16_context_cache(ctx, &cache, err);
    if (st != WNA16_OK)
        return st;
    unit_thread_t t[UNITS_MAX];
    pthread_t th[UNITS_MAX];
    bool started[UNITS_MAX] = {false};
    for (int i = 0; i < n; i++) {
        t[i] = (unit_thread_t){.ctx = ctx, .req = &reqs[i]};
        reqs[i].compile_ms = 0;
    }
    for (int i = 1; i < n; i++) {
        started[i] = pthread_create(&th[i], NULL, unit_main, &t[i]) == 0;
        if (!started[i])
            wna16_log(ctx, WNA16_LOG_WARN, "CUDA unit %s: no thread to "
                      "compile it in parallel; compiling it after the "
                      "others", reqs[i].unit);
    }
    if (n)
        unit_main(&t[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            unit_main(&t[i]);
    }
    for (int i = 0; i < n; i++)
        if (t[i].st != WNA16_OK) {
            if (err)
                *err = t[i].err;
            return t[i].st;
        }
    return WNA16_OK;
}

wna16_status_t w16_cuda_kernel_get(wna16_context_t *ctx, const kir_kernel_t *k,
                                   w16_cuda_function_t **fn,
                                   double *compile_ms, wna16_error_t *err)
{
    char *src = NULL;
    wna16_status_t st = w16_cuda_kernel_source(ctx, k, &src, err);
    if (st != WNA16_OK)
        return st;
    const char *names[1] = {k->name};
    st = w16_cuda_module_get(ctx, k->name, src, names, 1, fn, compile_ms, err);
    free(src);
    return st;
}
