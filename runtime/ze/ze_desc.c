/*
 * ze_desc.c - the XPU target's descriptor (see runtime/target/target.h):
 * kernel IR emitted as SPIR-V words (gen/emit_spirv.c, validated there),
 * built by Level Zero into a module (ze_driver.c). The artifact the kernel
 * cache keeps is the SPIR-V itself with the byte size of each kernel
 * parameter (Level Zero checks argument sizes; the stream's launch passes
 * every parameter as a 64-bit value):
 *
 *   "W16Z" | u32 n_params | u8 size[n_params] (padded to 4) | SPIR-V words
 *
 * so a cache hit skips emitting and validating and only rebuilds the
 * module for the device (Level Zero keeps its own cache of native code).
 * Streams copy synchronously through device memory; scratch is device
 * memory no copy touches (the generated fused MoE's intermediates, routed
 * on the device: moe_orch DEVICE).
 */
#include "runtime/ze/ze.h"
#include "gen/emit_spirv.h"
#include "runtime/target/target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOB_MAGIC = 0x5a363157u /* "W16Z" little-endian */, MAX_ARGS = 32 };

typedef struct ze_loaded {
    w16_ze_kernel_t *kernel;
    int n_params;
    uint8_t size[MAX_ARGS];
} ze_loaded_t;

static wna16_status_t ze_probe(wna16_context_t *ctx, void **inst,
                               wna16_error_t *err)
{
    w16_ze_t *ze = NULL;
    wna16_status_t st = w16_ze_get(ctx, &ze, err);
    *inst = ze;
    return st;
}

static void ze_describe(void *inst, w16_target_device_t *out)
{
    *out = (w16_target_device_t){0};
    snprintf(out->text, sizeof out->text, "%s (%s)", w16_ze_device_name(inst),
             w16_ze_driver_version(inst));
}

static void ze_release(wna16_context_t *ctx)
{
    w16_ze_destroy(ctx->targets[WNA16_TARGET_XPU]);
    ctx->targets[WNA16_TARGET_XPU] = NULL;
}

static void ze_key(void *inst, w16_keyer_t *kr)
{
    w16_keyer_u64(kr, W16_SPIRV_EMITTER_VERSION);
    w16_keyer_str(kr, "xpu");
    w16_keyer_str(kr, w16_ze_device_name(inst));
    w16_keyer_str(kr, w16_ze_driver_version(inst));
}

/* The module's words, as bytes: what the key hashes. */
static wna16_status_t ze_source(void *inst, const kir_kernel_t *k,
                                w16_buf_t *out, wna16_error_t *err)
{
    (void)inst;
    w16_words_t w;
    w16_words_init(&w, out->ctx);
    wna16_status_t st = w16_emit_spirv(k, &w, err);
    if (st == WNA16_OK)
        w16_buf_append(out, (const char *)w.data, w.len * 4);
    w16_words_free(&w);
    return st;
}

/* Bytes of kernel parameter p as the SPIR-V module declares it. */
static int param_bytes(const kir_param_t *p)
{
    if (p->kind != KIR_PARAM_SCALAR)
        return 8; /* a 64-bit pointer */
    int bits = kir_type_bits(p->type);
    return bits < 8 ? 1 : bits / 8;
}

static wna16_status_t ze_compile(void *inst, wna16_context_t *ctx,
                                 const kir_kernel_t *k, const char *source,
                                 const char *symbol, void **blob,
                                 size_t *size, wna16_error_t *err)
{
    (void)inst; (void)source; (void)symbol;
    if (k->n_params > MAX_ARGS)
        return w16_err(err, WNA16_ELIMIT, "kernel %s: %d parameters (at most "
                       "%d on the xpu target)", k->name, k->n_params, MAX_ARGS);
    w16_words_t w;
    w16_words_init(&w, ctx);
    w16_words_push(&w, BLOB_MAGIC);
    w16_words_push(&w, (uint32_t)k->n_params);
    uint32_t packed[MAX_ARGS / 4] = {0};
    for (int i = 0; i < k->n_params; i++)
        packed[i / 4] |= (uint32_t)param_bytes(k->params[i]) << (8 * (i % 4));
    w16_words_append(&w, packed, (size_t)(k->n_params + 3) / 4);
    wna16_status_t st = w16_emit_spirv(k, &w, err);
    if (st == WNA16_OK && w.failed)
        st = w16_err_nomem(err, "emitting SPIR-V");
    if (st == WNA16_OK) {
        *blob = w16_alloc(ctx, w.len * 4);
        if (!*blob)
            st = w16_err_nomem(err, "keeping a compiled XPU kernel");
        else {
            memcpy(*blob, w.data, w.len * 4);
            *size = w.len * 4;
        }
    }
    w16_words_free(&w);
    return st;
}

static wna16_status_t ze_load(void *inst, const void *blob, size_t size,
                              const char *symbol, void **fn,
                              wna16_error_t *err)
{
    const uint32_t *w = blob;
    size_t n = size / 4;
    if (size % 4 || n < 2 || w[0] != BLOB_MAGIC || w[1] > MAX_ARGS ||
        n < 2 + (w[1] + 3) / 4 + 5)
        return w16_err(err, WNA16_EFORMAT, "kernel %s: cached XPU blob of %zu "
                       "bytes is not one", symbol, size);
    ze_loaded_t *l = calloc(1, sizeof *l);
    if (!l)
        return w16_err_nomem(err, "loading an XPU kernel");
    l->n_params = (int)w[1];
    size_t head = 2 + ((size_t)l->n_params + 3) / 4;
    for (int i = 0; i < l->n_params; i++)
        l->size[i] = (uint8_t)(w[2 + i / 4] >> (8 * (i % 4)));
    wna16_status_t st = w16_ze_kernel_load(inst, w + head, n - head, symbol,
                                           &l->kernel, err);
    if (st != WNA16_OK) {
        free(l);
        return st;
    }
    *fn = l;
    return WNA16_OK;
}

static void ze_unload(void *fn)
{
    ze_loaded_t *l = fn;
    w16_ze_kernel_free(l->kernel);
    free(l);
}

/* ---- streams: device memory, synchronous copies ---------------------------- */

struct w16_stream {
    wna16_context_t *ctx;
    w16_ze_t *ze;
    /* device memory this stream holds, and where each output goes */
    uint64_t *allocs;
    void **hosts; /* the output's host memory, or NULL for an input */
    size_t *bytes;
    int n, cap;
};

static wna16_status_t keep(w16_stream_t *s, uint64_t addr, void *host,
                           size_t bytes, wna16_error_t *err)
{
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 16;
        uint64_t *a = realloc(s->allocs, (size_t)nc * sizeof *a);
        if (a)
            s->allocs = a;
        void **h = realloc(s->hosts, (size_t)nc * sizeof *h);
        if (h)
            s->hosts = h;
        size_t *b = realloc(s->bytes, (size_t)nc * sizeof *b);
        if (b)
            s->bytes = b;
        if (!a || !h || !b) {
            w16_ze_free(s->ze, addr);
            return w16_err_nomem(err, "tracking XPU memory");
        }
        s->cap = nc;
    }
    s->allocs[s->n] = addr;
    s->hosts[s->n] = host;
    s->bytes[s->n] = bytes;
    s->n++;
    return WNA16_OK;
}

static wna16_status_t ze_stream_open(void *inst, wna16_context_t *ctx,
                                     w16_stream_t **out, wna16_error_t *err)
{
    w16_stream_t *s = w16_calloc(ctx, 1, sizeof *s);
    if (!s)
        return w16_err_nomem(err, "opening an XPU stream");
    s->ctx = ctx;
    s->ze = inst;
    *out = s;
    return WNA16_OK;
}

static wna16_status_t ze_put(w16_stream_t *s, const void *host, size_t bytes,
                             uint64_t *addr, wna16_error_t *err)
{
    wna16_status_t st = w16_ze_alloc(s->ze, bytes, addr, err);
    if (st == WNA16_OK && *addr)
        st = keep(s, *addr, NULL, bytes, err);
    if (st == WNA16_OK)
        st = w16_ze_copy(s->ze, (void *)(uintptr_t)*addr, host, bytes, err);
    return st;
}

static wna16_status_t ze_put_table(w16_stream_t *s, int n,
                                   const uint64_t *hosts, const size_t *bytes,
                                   uint64_t *table, wna16_error_t *err)
{
    uint64_t *dev = calloc((size_t)(n > 0 ? n : 1), sizeof *dev);
    if (!dev)
        return w16_err_nomem(err, "building an XPU source table");
    wna16_status_t st = WNA16_OK;
    for (int i = 0; i < n && st == WNA16_OK; i++)
        st = ze_put(s, (const void *)(uintptr_t)hosts[i], bytes[i], &dev[i],
                    err);
    if (st == WNA16_OK)
        st = ze_put(s, dev, sizeof *dev * (size_t)n, table, err);
    free(dev);
    return st;
}

static wna16_status_t ze_output(w16_stream_t *s, void *host, size_t bytes,
                                uint64_t *addr, wna16_error_t *err)
{
    wna16_status_t st = w16_ze_alloc(s->ze, bytes, addr, err);
    if (st == WNA16_OK && *addr)
        st = keep(s, *addr, host, bytes, err);
    return st;
}

/* Device memory for kernels alone (never copied), freed at close. */
static wna16_status_t ze_scratch(w16_stream_t *s, size_t bytes,
                                 uint64_t *addr, wna16_error_t *err)
{
    wna16_status_t st = w16_ze_alloc(s->ze, bytes, addr, err);
    if (st == WNA16_OK && *addr)
        st = keep(s, *addr, NULL, bytes, err);
    return st;
}

/* The launches are synchronous: the output is complete; bring it back
 * and free it. */
static wna16_status_t ze_output_done(w16_stream_t *s, uint64_t addr,
                                     wna16_error_t *err)
{
    for (int i = 0; i < s->n; i++)
        if (s->allocs[i] == addr && s->hosts[i]) {
            wna16_status_t st = w16_ze_copy(s->ze, s->hosts[i],
                                            (const void *)(uintptr_t)addr,
                                            s->bytes[i], err);
            w16_ze_free(s->ze, addr);
            s->n--;
            s->allocs[i] = s->allocs[s->n];
            s->hosts[i] = s->hosts[s->n];
            s->bytes[i] = s->bytes[s->n];
            return st;
        }
    return addr ? w16_err(err, WNA16_EINTERNAL, "XPU stream: no output at "
                          "0x%llx", (unsigned long long)addr)
                : WNA16_OK;
}

static wna16_status_t ze_launch(w16_stream_t *s, void *fn,
                                const uint64_t *args, int n_args,
                                int64_t n_groups, int lanes, unsigned flags,
                                wna16_error_t *err)
{
    (void)flags;
    ze_loaded_t *l = fn;
    if (n_args != l->n_params)
        return w16_err(err, WNA16_EINTERNAL, "XPU launch: %d arguments for %d "
                       "parameters", n_args, l->n_params);
    if (n_groups > UINT32_MAX)
        return w16_err(err, WNA16_ELIMIT, "%lld workgroups exceed a Level Zero "
                       "group count", (long long)n_groups);
    return w16_ze_launch(s->ze, l->kernel, args, l->size, n_args,
                         (uint32_t)n_groups, (uint32_t)lanes, err);
}

static wna16_status_t ze_stream_close(w16_stream_t *s, wna16_status_t st,
                                      wna16_error_t *err)
{
    (void)err;
    if (!s)
        return st;
    /* outputs never brought back (st != OK) leave their host memory as
     * it was: a fused MoE's `out` is untouched on error, as on the other
     * targets, and a repack clears the tensors it allocated itself */
    for (int i = 0; i < s->n; i++)
        w16_ze_free(s->ze, s->allocs[i]);
    free(s->allocs);
    free(s->hosts);
    free(s->bytes);
    w16_free(s->ctx, s, sizeof *s);
    return st;
}

const w16_target_t w16_target_xpu = {
    .id = WNA16_TARGET_XPU,
    .name = "xpu",
    .compiler = "SPIR-V, Level Zero",
    .platform = WNA16_PLATFORM_XPU,
    .host_memory = false,
    .staged_tiles = true,
    .key_symbols = false,
    .moe_orch = W16_MOE_ORCH_DEVICE, /* kernels address device memory */
    .probe = ze_probe,
    .describe = ze_describe,
    .release = ze_release,
    .key = ze_key,
    .source = ze_source,
    .compile = ze_compile,
    .load = ze_load,
    .unload = ze_unload,
    .stream_open = ze_stream_open,
    .put = ze_put,
    .put_table = ze_put_table,
    .output = ze_output,
    .output_done = ze_output_done,
    .scratch = ze_scratch,
    .launch = ze_launch,
    .stream_close = ze_stream_close,
    .native_moe = NULL,
};
