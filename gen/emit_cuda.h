/*
 * emit_cuda.h - lowers a kernel IR kernel to CUDA C: one `extern "C"
 * __global__` function, readable, with every value's type spelled out,
 * compiled by NVRTC at run time (nvcc compiles the same text too).
 *
 * Launch model: a workgroup is a thread block of `lanes` threads
 * (blockIdx.x is the group, threadIdx.x the lane); parameters are passed in
 * kernel-parameter order (buffers as pointers, tables as pointers to device
 * arrays of device pointers, scalars by value).
 */
#ifndef W16_EMIT_CUDA_H
#define W16_EMIT_CUDA_H

#include "gen/kir.h"

/* Appends the kernel to out. With `with_prelude`, the text starts with the
 * includes and type names it needs, so it is a whole translation unit;
 * several kernels can share one unit by emitting the prelude once
 * (w16_emit_cuda_prelude). */
wna16_status_t w16_emit_cuda(const kir_kernel_t *k, bool with_prelude,
                             w16_buf_t *out, wna16_error_t *err);
void w16_emit_cuda_prelude(w16_buf_t *out);

#endif
