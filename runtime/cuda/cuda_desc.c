/*
 * cuda_desc.c - the CUDA target's descriptor (see
 * runtime/target/target.h): kernel IR emitted as CUDA C (gen/emit_cuda.c),
 * compiled by NVRTC for the device's architecture into a blob of CUBIN and
 * PTX (cuda_kernels.c), loaded by the driver; streams in cuda_stream.c.
 * Probing needs both halves: the driver with a GPU and NVRTC.
 */
#include "runtime/cuda/cuda_desc.h"
#include "runtime/cuda/cuda_kernels.h"
#include "gen/emit_cuda.h"

#include <stdio.h>

static wna16_status_t cuda_probe(wna16_context_t *ctx, void **inst,
                                 wna16_error_t *err)
{
    w16_cuda_t *cuda = NULL;
    wna16_status_t st = w16_cuda_get(ctx, &cuda, err);
    if (st == WNA16_OK && !w16_nvrtc_available(ctx, err))
        st = err ? err->status : WNA16_EUNAVAILABLE;
    *inst = st == WNA16_OK ? cuda : NULL;
    return st;
}

static void cuda_describe(void *inst, w16_target_device_t *out)
{
    *out = (w16_target_device_t){.cc_major = w16_cuda_cc_major(inst),
                                 .cc_minor = w16_cuda_cc_minor(inst)};
    snprintf(out->text, sizeof out->text, "%s (compute capability %d.%d)",
             w16_cuda_device_name(inst), out->cc_major, out->cc_minor);
}

static void cuda_release(wna16_context_t *ctx)
{
    w16_cuda_destroy(ctx->targets[WNA16_TARGET_CUDA]);
    ctx->targets[WNA16_TARGET_CUDA] = NULL;
}

static void cuda_key(void *inst, w16_keyer_t *kr) { w16_cuda_key(kr, inst); }

/* The whole translation unit NVRTC compiles. */
static wna16_status_t cuda_source(void *inst, const kir_kernel_t *k,
                                  w16_buf_t *out, wna16_error_t *err)
{
    (void)inst;
    return w16_emit_cuda(k, true, out, err);
}

static wna16_status_t cuda_compile(void *inst, wna16_context_t *ctx,
                                   const kir_kernel_t *k, const char *source,
                                   const char *symbol, void **blob,
                                   size_t *size, wna16_error_t *err)
{
    (void)k;
    return w16_cuda_blob_compile(ctx, inst, source, symbol, 1, blob, size,
                                 NULL, err);
}

static wna16_status_t cuda_load(void *inst, const void *blob, size_t size,
                                const char *symbol, void **fn,
                                wna16_error_t *err)
{
    const char *names[1] = {symbol};
    w16_cuda_loaded_t *l = NULL;
    wna16_status_t st = w16_cuda_blob_load(inst, blob, size, symbol, names, 1,
                                           &l, err);
    if (st == WNA16_OK)
        *fn = l;
    return st;
}

static void cuda_unload(void *fn) { w16_cuda_loaded_free(fn); }

const w16_target_t w16_target_cuda = {
    .id = WNA16_TARGET_CUDA,
    .name = "cuda",
    .compiler = "NVRTC",
    .platform = WNA16_PLATFORM_CUDA,
    .host_memory = false,
    .staged_tiles = true,
    .key_symbols = false,
    .probe = cuda_probe,
    .describe = cuda_describe,
    .release = cuda_release,
    .key = cuda_key,
    .source = cuda_source,
    .compile = cuda_compile,
    .load = cuda_load,
    .unload = cuda_unload,
    .stream_open = w16_cuda_stream_open,
    .put = w16_cuda_stream_put,
    .put_table = w16_cuda_stream_put_table,
    .output = w16_cuda_stream_output,
    .output_done = w16_cuda_stream_output_done,
    .launch = w16_cuda_stream_launch,
    .stream_close = w16_cuda_stream_close,
    .native_moe = &w16_cuda_native_moe,
};
