/*
 * cuda_desc.h - the pieces of the CUDA target's descriptor that live in
 * more than one file: loaded kernels as the kernel cache keeps them (a
 * module and its functions, built from a blob of CUBIN and PTX), and the
 * target's streams (cuda_stream.c), and its own fused MoE (cuda_moe.c).
 * The descriptor itself is
 * w16_target_cuda (cuda_desc.c), listed in runtime/targets.c.
 */
#ifndef W16_CUDA_DESC_H
#define W16_CUDA_DESC_H

#include "runtime/cuda/cuda.h"
#include "runtime/target/target.h"

/* Most parameters a kernel launched through a stream may take. */
#define W16_CUDA_MAX_ARGS 32

/* ---- compiled and loaded units (cuda_kernels.c) ----------------------------
 * A blob is the kernel cache's artifact for a CUDA unit:
 *
 *   u64 cubin_size | u64 ptx_size | cubin bytes | ptx bytes (no NUL)
 *
 * and a loaded unit is its module with the functions it exports. */
typedef struct w16_cuda_loaded w16_cuda_loaded_t;

/* Compiles a translation unit of n_fns kernels with NVRTC for the device
 * into a blob (w16_alloc on ctx). *compile_ms gets NVRTC's time. */
wna16_status_t w16_cuda_blob_compile(wna16_context_t *ctx, w16_cuda_t *cuda,
                                     const char *source, const char *unit,
                                     int n_fns, void **blob, size_t *size,
                                     double *compile_ms, wna16_error_t *err);
/* Loads a blob and looks up fn_names[0 .. n_fns). `unit` names it in
 * messages. The blob stays the caller's. */
wna16_status_t w16_cuda_blob_load(w16_cuda_t *cuda, const void *blob,
                                  size_t size, const char *unit,
                                  const char *const *fn_names, int n_fns,
                                  w16_cuda_loaded_t **out, wna16_error_t *err);
/* Function i of a loaded unit, and the number it holds. */
w16_cuda_function_t *w16_cuda_loaded_fn(const w16_cuda_loaded_t *l, int i);
int w16_cuda_loaded_count(const w16_cuda_loaded_t *l);
/* Unloads the module and frees the unit. NULL is fine. */
void w16_cuda_loaded_free(w16_cuda_loaded_t *l);

/* ---- streams (cuda_stream.c): the w16_stream_t operations -------------- */

wna16_status_t w16_cuda_stream_open(void *inst, wna16_context_t *ctx,
                                    w16_stream_t **out, wna16_error_t *err);
wna16_status_t w16_cuda_stream_put(w16_stream_t *s, const void *host,
                                   size_t bytes, uint64_t *addr,
                                   wna16_error_t *err);
wna16_status_t w16_cuda_stream_put_table(w16_stream_t *s, int n,
                                         const uint64_t *hosts,
                                         const size_t *bytes, uint64_t *table,
                                         wna16_error_t *err);
wna16_status_t w16_cuda_stream_output(w16_stream_t *s, void *host,
                                      size_t bytes, uint64_t *addr,
                                      wna16_error_t *err);
wna16_status_t w16_cuda_stream_output_done(w16_stream_t *s, uint64_t addr,
                                           wna16_error_t *err);
/* `fn` is a w16_cuda_loaded_t (its first function runs). */
wna16_status_t w16_cuda_stream_launch(w16_stream_t *s, void *fn,
                                      const uint64_t *args, int n_args,
                                      int64_t n_groups, int lanes,
                                      unsigned flags, wna16_error_t *err);
wna16_status_t w16_cuda_stream_close(w16_stream_t *s, wna16_status_t st,
                                     wna16_error_t *err);

/* ---- the tensor-core fused MoE (cuda_moe.c) ------------------------------ */

extern const w16_native_moe_t w16_cuda_native_moe;

#endif /* W16_CUDA_DESC_H */
