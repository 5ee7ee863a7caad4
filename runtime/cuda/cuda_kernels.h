/*
 * cuda_kernels.h - kernel IR kernels compiled for the context's GPU through
 * the kernel cache (memory, then disk, then NVRTC).
 */
#ifndef W16_CUDA_KERNELS_H
#define W16_CUDA_KERNELS_H

#include "gen/kir.h"
#include "runtime/cache/cache.h"
#include "runtime/cuda/cuda.h"

/* The kernel's function on the context's GPU, compiled on first use (the
 * CUDA C text is part of the key, with the architecture and the NVRTC and
 * driver versions). The function stays valid until the context is
 * destroyed. *compile_ms (may be NULL) receives NVRTC's time when this call
 * compiled the kernel, 0 for a cache hit. */
wna16_status_t w16_cuda_kernel_get(wna16_context_t *ctx, const kir_kernel_t *k,
                                   w16_cuda_function_t **fn,
                                   double *compile_ms, wna16_error_t *err);

/* Most kernels one module may export to w16_cuda_module_get. */
#define W16_CUDA_MODULE_MAX_FNS 16

/* The functions fn_names[0 .. n_fns) of a whole CUDA C translation unit
 * (`source`, e.g. a specialized template), compiled on first use through
 * the kernel cache exactly as w16_cuda_kernel_get does (key: the text and
 * the kernel names, the architecture, the NVRTC and driver versions).
 * `unit` names it in messages and NVRTC's log. */
wna16_status_t w16_cuda_module_get(wna16_context_t *ctx, const char *unit,
                                   const char *source,
                                   const char *const *fn_names, int n_fns,
                                   w16_cuda_function_t **fns,
                                   double *compile_ms, wna16_error_t *err);

/* One translation unit for w16_cuda_modules_get: the arguments of
 * w16_cuda_module_get, and its outputs. */
typedef struct w16_cuda_unit_req {
    const char *unit;
    const char *source;
    const char *const *fn_names;
    int n_fns;
    w16_cuda_function_t **fns; /* out: n_fns functions */
    double compile_ms;         /* out: NVRTC's time, 0 on a cache hit */
} w16_cuda_unit_req_t;

/* w16_cuda_module_get for n independent units at once, each in its own
 * thread (the first in the caller's): a first call that has to compile
 * them all waits for the slowest unit rather than for the sum (NVRTC runs
 * on the CPU; the kernel cache compiles a key once however many threads
 * ask for it). On failure, the error of the first failing unit in the
 * order given; the others' functions are still filled where they
 * succeeded (and stay in the cache). */
wna16_status_t w16_cuda_modules_get(wna16_context_t *ctx,
                                    w16_cuda_unit_req_t *reqs, int n,
                                    wna16_error_t *err);

/* The kernel as a whole translation unit (malloc'd, NUL-terminated). */
wna16_status_t w16_cuda_kernel_source(wna16_context_t *ctx,
                                      const kir_kernel_t *k, char **out,
                                      wna16_error_t *err);

/* Adds the device's identity to a key: architecture, NVRTC, driver. */
void w16_cuda_key(w16_keyer_t *kr, w16_cuda_t *cuda);

#endif
