/*
 * cuda_xfer.h - host<->device copies of pageable memory at pinned-memory
 * speed: the bytes go through a ring of page-locked chunks, so the CPU's
 * copy into (or out of) one chunk overlaps the DMA of the others. Plain
 * copies from pageable memory make the driver stage them through its own
 * small buffers one at a time, at a fraction of the link's bandwidth.
 *
 * One ring serves one thread at a time; everything goes through the
 * stream given to each call.
 */
#ifndef W16_CUDA_XFER_H
#define W16_CUDA_XFER_H

#include "runtime/cuda/cuda.h"

typedef struct w16_cuda_xfer w16_cuda_xfer_t;

/* A ring of `chunks` page-locked chunks of `chunk_bytes` (0, 0: 4 x 4 MiB). */
wna16_status_t w16_cuda_xfer_create(w16_cuda_t *cuda, int chunks,
                                    size_t chunk_bytes, w16_cuda_xfer_t **out,
                                    wna16_error_t *err);
/* Waits for the transfers in flight and frees the ring. NULL is fine. */
void w16_cuda_xfer_destroy(w16_cuda_xfer_t *x);

/* Copies n bytes from host memory to dst, queued on `stream`. Returns once
 * `src` has been read (the caller may reuse it); the device copy completes
 * in stream order. */
wna16_status_t w16_cuda_xfer_upload(w16_cuda_xfer_t *x, uint64_t dst,
                                    const void *src, size_t n,
                                    w16_cuda_stream_t *stream,
                                    wna16_error_t *err);
/* Copies n bytes from the device to host memory after the work already
 * queued on `stream`; returns when `dst` holds them. */
wna16_status_t w16_cuda_xfer_download(w16_cuda_xfer_t *x, void *dst,
                                      uint64_t src, size_t n,
                                      w16_cuda_stream_t *stream,
                                      wna16_error_t *err);

#endif
