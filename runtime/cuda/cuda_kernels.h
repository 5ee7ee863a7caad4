/*
 * cuda_kernels.h - kernel IR kernels compiled for the context's GPU through
 * the kernel cache (memory, then disk, then NVRTC).
 */
#ifndef W16_CUDA_KERNELS_H
#define W16_CUDA_KERNELS_H

#include "gen/kir.h"
#include "runtime/cache.h"
#include "runtime/cuda/cuda.h"

/* The kernel's function on the context's GPU, compiled on first use (the
 * CUDA C text is part of the key, with the architecture and the NVRTC and
 * driver versions). The function stays valid until the context is
 * destroyed. *compile_ms (may be NULL) receives NVRTC's time when this call
 * compiled the kernel, 0 for a cache hit. */
wna16_status_t w16_cuda_kernel_get(wna16_context_t *ctx, const kir_kernel_t *k,
                                   w16_cuda_function_t **fn,
                                   double *compile_ms, wna16_error_t *err);

/* The kernel as a whole translation unit (malloc'd, NUL-terminated). */
wna16_status_t w16_cuda_kernel_source(wna16_context_t *ctx,
                                      const kir_kernel_t *k, char **out,
                                      wna16_error_t *err);

/* Adds the device's identity to a key: architecture, NVRTC, driver. */
void w16_cuda_key(w16_keyer_t *kr, w16_cuda_t *cuda);

#endif
