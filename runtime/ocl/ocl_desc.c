/*
 * ocl_desc.c - the ocl target's descriptor (see runtime/target/target.h):
 * the same validated SPIR-V words the xpu target hands Level Zero
 * (gen/emit_spirv.c, in the GPU kernel shape: staged tiles, one word per
 * lane), run on an OpenCL device through the reverse translation of
 * ocl.h. The artifact the kernel cache keeps is the translated bitcode
 * with each parameter's kind (a pointer, or a scalar's byte size):
 *
 *   "W16O" | u32 n_params | u8 kind[n_params] (padded to 4) | bitcode
 *
 * so a cache hit skips emitting, validating and translating, and only
 * builds the program (PoCL keeps its own cache: POCL_CACHE_DIR). The
 * device addresses host memory (fine-grained system SVM, checked by the
 * probe), so streams copy nothing, as the CPU target's; their scratch is
 * host memory they allocate. The generated fused MoE runs here as on the
 * xpu target (moe_orch DEVICE: routed by a kernel, no host read between
 * launches), so that Level Zero's orchestration is what PoCL tests.
 */
#include "runtime/ocl/ocl.h"
#include "gen/emit_spirv.h"
#include "runtime/target/target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOB_MAGIC = 0x4f363157u /* "W16O" little-endian */, MAX_ARGS = 32 };

static wna16_status_t ocl_probe(wna16_context_t *ctx, void **inst,
                                wna16_error_t *err)
{
    w16_ocl_t *ocl = NULL;
    wna16_status_t st = w16_ocl_get(ctx, &ocl, err);
    *inst = ocl;
    return st;
}

static void ocl_describe(void *inst, w16_target_device_t *out)
{
    *out = (w16_target_device_t){0};
    snprintf(out->text, sizeof out->text, "%s (OpenCL, %d compute units)",
             w16_ocl_device_name(inst), w16_ocl_units(inst));
}

static void ocl_release(wna16_context_t *ctx)
{
    w16_ocl_destroy(ctx->targets[WNA16_TARGET_OCL]);
    ctx->targets[WNA16_TARGET_OCL] = NULL;
}

static void ocl_key(void *inst, w16_keyer_t *kr)
{
    w16_keyer_u64(kr, W16_SPIRV_EMITTER_VERSION);
    w16_keyer_str(kr, "ocl");
    w16_keyer_str(kr, w16_ocl_device_name(inst));
    w16_keyer_str(kr, w16_ocl_versions(inst)); /* driver and translator */
}

/* The module's words, as bytes: what the key hashes. */
static wna16_status_t ocl_source(void *inst, const kir_kernel_t *k,
                                 w16_buf_t *out, wna16_error_t *err)
{
    (void)inst;
    w16_words_t w;
    w16_words_init(&w, out->ctx);
    wna16_status_t st = w16_emit_spirv(k, &w, err);
    if (st == WNA16_OK && w.failed)
        st = w16_err_nomem(err, "emitting SPIR-V");
    if (st == WNA16_OK)
        w16_buf_append(out, (const char *)w.data, w.len * 4);
    w16_words_free(&w);
    return st;
}

/* How parameter p is passed: a pointer, or a scalar's bytes. */
static uint8_t param_kind(const kir_param_t *p)
{
    if (p->kind != KIR_PARAM_SCALAR)
        return W16_OCL_ARG_POINTER;
    int bits = kir_type_bits(p->type);
    return (uint8_t)(bits < 8 ? 1 : bits / 8);
}

static wna16_status_t ocl_compile(void *inst, wna16_context_t *ctx,
                                  const kir_kernel_t *k, const char *source,
                                  const char *symbol, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    (void)source; (void)symbol;
    if (k->n_params > MAX_ARGS)
        return w16_err(err, WNA16_ELIMIT, "kernel %s: %d parameters (at most "
                       "%d on the ocl target)", k->name, k->n_params, MAX_ARGS);
    w16_words_t w;
    w16_words_init(&w, ctx);
    wna16_status_t st = w16_emit_spirv(k, &w, err);
    if (st == WNA16_OK && w.failed)
        st = w16_err_nomem(err, "emitting SPIR-V");
    void *bc = NULL;
    size_t bc_size = 0;
    if (st == WNA16_OK)
        st = w16_ocl_translate(inst, w.data, w.len, k->name, &bc, &bc_size,
                               err);
    w16_words_free(&w);
    if (st != WNA16_OK)
        return st;
    size_t head = 8 + (size_t)(k->n_params + 3) / 4 * 4;
    uint8_t *b = w16_alloc(ctx, head + bc_size);
    if (!b) {
        free(bc);
        return w16_err_nomem(err, "keeping a compiled ocl kernel");
    }
    memset(b, 0, head);
    uint32_t magic = BLOB_MAGIC, n = (uint32_t)k->n_params;
    memcpy(b, &magic, 4);
    memcpy(b + 4, &n, 4);
    for (int i = 0; i < k->n_params; i++)
        b[8 + i] = param_kind(k->params[i]);
    memcpy(b + head, bc, bc_size);
    free(bc);
    *blob = b;
    *size = head + bc_size;
    return WNA16_OK;
}

static wna16_status_t ocl_load(void *inst, const void *blob, size_t size,
                               const char *symbol, void **fn,
                               wna16_error_t *err)
{
    const uint8_t *b = blob;
    uint32_t magic = 0, n = 0;
    if (size >= 8) {
        memcpy(&magic, b, 4);
        memcpy(&n, b + 4, 4);
    }
    size_t head = 8 + (size_t)(n + 3) / 4 * 4;
    if (size < 8 || magic != BLOB_MAGIC || n > MAX_ARGS || size <= head + 4)
        return w16_err(err, WNA16_EFORMAT, "kernel %s: cached ocl blob of %zu "
                       "bytes is not one", symbol, size);
    w16_ocl_kernel_t *k = NULL;
    wna16_status_t st = w16_ocl_kernel_load(inst, b + head, size - head, symbol,
                                            b + 8, (int)n, &k, err);
    if (st == WNA16_OK)
        *fn = k;
    return st;
}

static void ocl_unload(void *fn) { w16_ocl_kernel_free(fn); }

/* ---- streams: host memory, launches that return when done ---------------- */

struct w16_stream {
    wna16_context_t *ctx;
    w16_ocl_t *ocl;
    void **scratch; /* host blocks of ocl_scratch, freed at close */
    int n_scratch, cap_scratch;
};

static wna16_status_t ocl_stream_open(void *inst, wna16_context_t *ctx,
                                      w16_stream_t **out, wna16_error_t *err)
{
    w16_stream_t *s = w16_calloc(ctx, 1, sizeof *s);
    if (!s)
        return w16_err_nomem(err, "opening an ocl stream");
    *s = (w16_stream_t){.ctx = ctx, .ocl = inst};
    *out = s;
    return WNA16_OK;
}

static wna16_status_t ocl_put(w16_stream_t *s, const void *host, size_t bytes,
                              uint64_t *addr, wna16_error_t *err)
{
    (void)s; (void)bytes; (void)err;
    *addr = (uint64_t)(uintptr_t)host;
    return WNA16_OK;
}

/* The caller's array of host addresses is the table itself. */
static wna16_status_t ocl_put_table(w16_stream_t *s, int n,
                                    const uint64_t *hosts, const size_t *bytes,
                                    uint64_t *table, wna16_error_t *err)
{
    (void)s; (void)n; (void)bytes; (void)err;
    *table = (uint64_t)(uintptr_t)hosts;
    return WNA16_OK;
}

static wna16_status_t ocl_output(w16_stream_t *s, void *host, size_t bytes,
                                 uint64_t *addr, wna16_error_t *err)
{
    (void)s; (void)bytes; (void)err;
    *addr = (uint64_t)(uintptr_t)host;
    return WNA16_OK;
}

static wna16_status_t ocl_output_done(w16_stream_t *s, uint64_t addr,
                                      wna16_error_t *err)
{
    (void)s; (void)addr; (void)err;
    return WNA16_OK;
}

/* Host memory (the device reads and writes it through system SVM), 64-byte
 * aligned, kept until the stream closes. */
static wna16_status_t ocl_scratch(w16_stream_t *s, size_t bytes,
                                  uint64_t *addr, wna16_error_t *err)
{
    *addr = 0;
    if (s->n_scratch == s->cap_scratch) {
        int nc = s->cap_scratch ? 2 * s->cap_scratch : 4;
        void **b = realloc(s->scratch, (size_t)nc * sizeof *b);
        if (!b)
            return w16_err_nomem(err, "tracking ocl scratch memory");
        s->scratch = b;
        s->cap_scratch = nc;
    }
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p)
        return w16_err_nomem(err, "ocl scratch memory");
    s->scratch[s->n_scratch++] = p;
    *addr = (uint64_t)(uintptr_t)p;
    return WNA16_OK;
}

static wna16_status_t ocl_launch(w16_stream_t *s, void *fn,
                                 const uint64_t *args, int n_args,
                                 int64_t n_groups, int lanes, unsigned flags,
                                 wna16_error_t *err)
{
    (void)flags;
    return w16_ocl_launch(s->ocl, fn, args, n_args, n_groups, lanes, err);
}

static wna16_status_t ocl_stream_close(w16_stream_t *s, wna16_status_t st,
                                       wna16_error_t *err)
{
    (void)err;
    if (!s)
        return st;
    for (int i = 0; i < s->n_scratch; i++)
        free(s->scratch[i]);
    free(s->scratch);
    w16_free(s->ctx, s, sizeof *s);
    return st;
}

const w16_target_t w16_target_ocl = {
    .id = WNA16_TARGET_OCL,
    .name = "ocl",
    .compiler = "SPIR-V, llvm-spirv-15, OpenCL",
    .platform = WNA16_PLATFORM_XPU,
    .host_memory = true,
    .staged_tiles = true, /* the xpu target's kernels, run elsewhere */
    .key_symbols = false,
    .moe_orch = W16_MOE_ORCH_DEVICE, /* the xpu target's, tested here */
    .probe = ocl_probe,
    .describe = ocl_describe,
    .release = ocl_release,
    .key = ocl_key,
    .source = ocl_source,
    .compile = ocl_compile,
    .load = ocl_load,
    .unload = ocl_unload,
    .stream_open = ocl_stream_open,
    .put = ocl_put,
    .put_table = ocl_put_table,
    .output = ocl_output,
    .output_done = ocl_output_done,
    .scratch = ocl_scratch,
    .launch = ocl_launch,
    .stream_close = ocl_stream_close,
    .native_moe = NULL,
};
