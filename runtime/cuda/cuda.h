/*
 * cuda.h - the CUDA target: NVRTC compiles generated CUDA C to a CUBIN (and
 * PTX), the CUDA driver loads and launches it. Neither library is linked:
 * both are opened with dlopen at run time, so one build runs on machines
 * with no CUDA at all. The two halves are independent: NVRTC works on a
 * machine without a GPU or driver (CI compiles every generated kernel
 * there), while the driver half (w16_cuda_get) reports EUNAVAILABLE with
 * the reason. Builds without the CUDA headers do not compile this target
 * at all (CMake leaves runtime/cuda/ out; runtime/targets.c does not list
 * it).
 * This header never includes <cuda.h>: driver handles are opaque pointers
 * here (a w16_cuda_stream_t * is the CUstream itself, and so on).
 */
#ifndef W16_CUDA_H
#define W16_CUDA_H

#include "base/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- NVRTC ----------------------------------------------------------------
 * NVRTC is loaded once per process (libnvrtc.so.13, then .so.12, then .so)
 * and never unloaded; the library handle, its function pointers and the
 * CUDA include directory are the target's only process-wide state. */

/* A compiled kernel module. Every buffer is malloc'd (so the kernel cache
 * can build one from disk bytes) and freed by w16_cuda_image_free. */
typedef struct w16_cuda_image {
    void *cubin;       /* ELF for sm_<cc_major><cc_minor>; NULL if absent */
    size_t cubin_size;
    char *ptx;         /* NUL-terminated PTX; NULL if absent */
    size_t ptx_size;   /* strlen(ptx) */
    char *log;         /* NVRTC's log on success (warnings); NULL if empty */
    int cc_major, cc_minor; /* the architecture the CUBIN was built for */
} w16_cuda_image_t;

/* Compiles one translation unit of CUDA C with NVRTC for sm_<major><minor>
 * with -std=c++17, -default-device and the CUDA include directory found at
 * run time ($CUDA_HOME/include, else /usr/local/cuda/include, else
 * ../include next to the NVRTC library), without --use_fast_math (results
 * must be exact). Kernels must be `extern "C"` so their names survive.
 * `kernel_name` names the unit in messages and NVRTC's log. Fills *out
 * (zeroed first) with the CUBIN and the PTX (the PTX lets newer devices JIT
 * it). Errors: EUNAVAILABLE (no NVRTC), EUNSUPPORTED (an architecture this
 * NVRTC does not know), EINTERNAL (compilation failed: the kernel name and
 * the start of NVRTC's log; the whole log goes to the context's log at
 * debug level). Warnings leave the log in out->log, so CI can fail on them.
 * `ctx` (for logging) may be NULL. Thread safe. */
wna16_status_t w16_nvrtc_compile(wna16_context_t *ctx, const char *source,
                                 const char *kernel_name, int cc_major,
                                 int cc_minor, w16_cuda_image_t *out,
                                 wna16_error_t *err);
/* w16_nvrtc_compile for a unit of `n_kernels` kernels: from 2 kernels on,
 * NVRTC optimizes them in parallel threads (--split-compile, where this
 * NVRTC has it), which leaves each kernel's code as it is (up to ptxas's
 * register numbering in kernels without launch bounds) and the unit's
 * compile time closer to its slowest kernel's. w16_nvrtc_compile is this
 * with 1. Thread safe. */
wna16_status_t w16_nvrtc_compile_unit(wna16_context_t *ctx,
                                      const char *source,
                                      const char *kernel_name, int n_kernels,
                                      int cc_major, int cc_minor,
                                      w16_cuda_image_t *out,
                                      wna16_error_t *err);
/* Frees the buffers and zeroes the image; NULL and zeroed images are fine. */
/* w16_nvrtc_compile for the architecture named as a kernel pack names it:
 * "sm_80", "sm_90a" (a CUBIN, and its PTX), or "compute_80" (PTX alone,
 * which the driver compiles for any later device). No device needed. */
wna16_status_t w16_nvrtc_compile_arch(wna16_context_t *ctx,
                                      const char *source,
                                      const char *kernel_name,
                                      const char *arch, w16_cuda_image_t *out,
                                      wna16_error_t *err);
void w16_cuda_image_free(w16_cuda_image_t *img);

/* Loads NVRTC if needed; false (with the reason in err, EUNAVAILABLE) if it
 * cannot be loaded. `ctx` may be NULL. */
bool w16_nvrtc_available(wna16_context_t *ctx, wna16_error_t *err);
/* "NVRTC 13.0", or "none" when it cannot be loaded (part of cache keys). */
const char *w16_nvrtc_version(void);
/* The include directory passed to NVRTC, or "" when none was found. */
const char *w16_nvrtc_include_dir(void);

/* ---- the driver ------------------------------------------------------------ */

typedef struct w16_cuda w16_cuda_t;
typedef struct w16_cuda_module w16_cuda_module_t;
/* Opaque driver handles: the pointer is the CUfunction / CUstream /
 * CUevent. A NULL stream is the legacy default stream. */
typedef struct w16_cuda_function w16_cuda_function_t;
typedef struct w16_cuda_stream w16_cuda_stream_t;
typedef struct w16_cuda_event w16_cuda_event_t;

/* The context's CUDA target, created on first use: libcuda.so.1 (never the
 * toolkit's stub), cuInit, device 0, its primary context retained and made
 * current. EUNAVAILABLE with "CUDA target unavailable: <why>" when there is
 * no driver or no GPU; nothing is kept then, so a later call tries again.
 * Every function below makes the target's context current on the calling
 * thread first, so any thread may use it. */
wna16_status_t w16_cuda_get(wna16_context_t *ctx, w16_cuda_t **out,
                            wna16_error_t *err);
/* Releases the primary context (called by wna16_context_destroy). Modules,
 * memory, streams and events must have been released before. */
void w16_cuda_destroy(w16_cuda_t *cuda);

int w16_cuda_cc_major(const w16_cuda_t *cuda);
int w16_cuda_cc_minor(const w16_cuda_t *cuda);
/* "NVIDIA H200" */
const char *w16_cuda_device_name(const w16_cuda_t *cuda);
/* "CUDA driver 13.0 (580.95.05)"; the kernel module's version in
 * parentheses only where /proc/driver/nvidia/version tells it. */
const char *w16_cuda_driver_version(const w16_cuda_t *cuda);
int w16_cuda_sm_count(const w16_cuda_t *cuda);
/* The device's L2 cache in bytes (60 MB on an H200). */
size_t w16_cuda_l2_bytes(const w16_cuda_t *cuda);
/* Most dynamic shared memory one block may use (after opting in). */
size_t w16_cuda_max_shared(const w16_cuda_t *cuda);

/* ---- modules and launches -------------------------------------------------- */

/* Loads an image: its CUBIN when the device can run it (same major, minor
 * not above the device's), else its PTX, JIT-compiled by the driver (the
 * fallback for devices newer than the image's architecture); a CUBIN the
 * driver rejects also falls back to the PTX. The module belongs to the
 * caller (the kernel cache keeps modules as handles). Errors name what was
 * loaded and carry the driver's JIT log. */
wna16_status_t w16_cuda_module_load(w16_cuda_t *cuda,
                                    const w16_cuda_image_t *img,
                                    w16_cuda_module_t **out,
                                    wna16_error_t *err);
/* Did the module come from the PTX (JIT) rather than the CUBIN? */
bool w16_cuda_module_from_ptx(const w16_cuda_module_t *m);
/* Unloads the module; its functions become invalid. NULL is fine. */
void w16_cuda_module_unload(w16_cuda_module_t *m);
/* The kernel `name` of a module (ENOTFOUND if absent); valid while the
 * module is loaded. */
wna16_status_t w16_cuda_function(w16_cuda_module_t *m, const char *name,
                                 w16_cuda_function_t **fn, wna16_error_t *err);

/* Launches grid_x blocks of block_x threads with `shared_bytes` of dynamic
 * shared memory on `stream` (NULL: the default stream). More than 48 KiB
 * opts the function in first (up to w16_cuda_max_shared). `args` holds one
 * pointer per kernel parameter, pointing at its value (cuLaunchKernel's
 * convention). Asynchronous: errors inside the kernel surface at the next
 * synchronizing call. */
wna16_status_t w16_cuda_launch(w16_cuda_t *cuda, w16_cuda_function_t *fn,
                               unsigned grid_x, unsigned block_x,
                               unsigned shared_bytes,
                               w16_cuda_stream_t *stream, void **args,
                               wna16_error_t *err);

/* w16_cuda_launch for a kernel of a dependent chain (the fused MoE's
 * routing, GEMMs, reduce and finalize): on sm_90 and later it is launched
 * with programmatic stream serialization, so it may start, run its
 * prologue and wait while the previous kernel on the stream finishes. The
 * kernel must execute griddepcontrol.wait (w16_pdl_wait in
 * templates/moe_pdl.cu) in every CTA before it reads what an earlier
 * kernel wrote or writes what one reads; the wait returns once the
 * previous kernel has completed and its writes are visible. Where the
 * device or driver lacks it (logged once), a plain launch. Works inside
 * stream capture (the graph gets a programmatic edge). */
wna16_status_t w16_cuda_launch_chained(w16_cuda_t *cuda,
                                       w16_cuda_function_t *fn,
                                       unsigned grid_x, unsigned block_x,
                                       unsigned shared_bytes,
                                       w16_cuda_stream_t *stream, void **args,
                                       wna16_error_t *err);
/* Do chained launches overlap (sm_90+ and cuLaunchKernelEx)? */
bool w16_cuda_chained_overlaps(w16_cuda_t *cuda);

/* ---- memory ----------------------------------------------------------------
 * Device pointers are CUdeviceptr values in a uint64_t. Allocations are
 * plain device memory (cuMemAlloc), never managed memory. Zero-byte
 * allocations give 0 and zero-byte copies do nothing. */

wna16_status_t w16_cuda_alloc(w16_cuda_t *cuda, size_t bytes, uint64_t *dptr,
                              wna16_error_t *err);
/* 0 is fine; failures are logged (there is nothing a caller could do). */
void w16_cuda_free(w16_cuda_t *cuda, uint64_t dptr);
/* Sets `bytes` bytes to `value`; returns when done. */
wna16_status_t w16_cuda_memset(w16_cuda_t *cuda, uint64_t dptr, uint8_t value,
                               size_t bytes, wna16_error_t *err);
/* Same, queued on a stream. */
wna16_status_t w16_cuda_memset_async(w16_cuda_t *cuda, uint64_t dptr,
                                     uint8_t value, size_t bytes,
                                     w16_cuda_stream_t *stream,
                                     wna16_error_t *err);

/* Synchronous copies: they return when the data has arrived, after the
 * work already queued on the default stream (and on the blocking streams
 * of w16_cuda_stream_create). */
wna16_status_t w16_cuda_copy_h2d(w16_cuda_t *cuda, uint64_t dst,
                                 const void *src, size_t bytes,
                                 wna16_error_t *err);
wna16_status_t w16_cuda_copy_d2h(w16_cuda_t *cuda, void *dst, uint64_t src,
                                 size_t bytes, wna16_error_t *err);
wna16_status_t w16_cuda_copy_d2d(w16_cuda_t *cuda, uint64_t dst, uint64_t src,
                                 size_t bytes, wna16_error_t *err);

/* Asynchronous copies queued on a stream; the host memory must stay valid
 * until the stream reaches them, and only pinned memory (w16_cuda_host_alloc)
 * overlaps with other work. */
wna16_status_t w16_cuda_copy_h2d_async(w16_cuda_t *cuda, uint64_t dst,
                                       const void *src, size_t bytes,
                                       w16_cuda_stream_t *stream,
                                       wna16_error_t *err);
wna16_status_t w16_cuda_copy_d2h_async(w16_cuda_t *cuda, void *dst,
                                       uint64_t src, size_t bytes,
                                       w16_cuda_stream_t *stream,
                                       wna16_error_t *err);

/* Page-locked host memory (cuMemAllocHost) for overlapped copies. */
wna16_status_t w16_cuda_host_alloc(w16_cuda_t *cuda, size_t bytes, void **out,
                                   wna16_error_t *err);
void w16_cuda_host_free(w16_cuda_t *cuda, void *p);

/* ---- streams and events ---------------------------------------------------- */

/* A blocking stream: it runs concurrently with other streams but orders
 * itself after the default stream, so the synchronous helpers above stay
 * safe to mix with it. */
wna16_status_t w16_cuda_stream_create(w16_cuda_t *cuda,
                                      w16_cuda_stream_t **out,
                                      wna16_error_t *err);
/* Waits for nothing: queued work still completes. NULL is fine. */
void w16_cuda_stream_destroy(w16_cuda_t *cuda, w16_cuda_stream_t *stream);
/* Waits for everything queued on the stream (NULL: the default stream). */
wna16_status_t w16_cuda_stream_sync(w16_cuda_t *cuda,
                                    w16_cuda_stream_t *stream,
                                    wna16_error_t *err);

/* Timing events. */
wna16_status_t w16_cuda_event_create(w16_cuda_t *cuda, w16_cuda_event_t **out,
                                     wna16_error_t *err);
void w16_cuda_event_destroy(w16_cuda_t *cuda, w16_cuda_event_t *ev);
wna16_status_t w16_cuda_event_record(w16_cuda_t *cuda, w16_cuda_event_t *ev,
                                     w16_cuda_stream_t *stream,
                                     wna16_error_t *err);
/* Orders later work on `stream` (NULL: the default stream) after the
 * work before the event's last record, without blocking the host. */
wna16_status_t w16_cuda_stream_wait_event(w16_cuda_t *cuda,
                                          w16_cuda_stream_t *stream,
                                          w16_cuda_event_t *ev,
                                          wna16_error_t *err);
wna16_status_t w16_cuda_event_sync(w16_cuda_t *cuda, w16_cuda_event_t *ev,
                                   wna16_error_t *err);
/* Milliseconds between two recorded, completed events. */
wna16_status_t w16_cuda_event_elapsed_ms(w16_cuda_t *cuda,
                                         w16_cuda_event_t *start,
                                         w16_cuda_event_t *end, float *ms,
                                         wna16_error_t *err);

/* ---- graphs ----------------------------------------------------------------
 * Stream capture into a CUDA graph, for timing work as a serving system
 * replays it (one launch for many kernels). Capture needs a stream that
 * does not synchronize with the default one: w16_cuda_stream_create_async.
 * Between begin and end nothing may touch the default stream. */
typedef struct w16_cuda_graph w16_cuda_graph_t;

/* A stream that does not order itself after the default stream. */
wna16_status_t w16_cuda_stream_create_async(w16_cuda_t *cuda,
                                            w16_cuda_stream_t **out,
                                            wna16_error_t *err);
wna16_status_t w16_cuda_capture_begin(w16_cuda_t *cuda,
                                      w16_cuda_stream_t *stream,
                                      wna16_error_t *err);
/* Ends the capture and instantiates the graph. */
wna16_status_t w16_cuda_capture_end(w16_cuda_t *cuda,
                                    w16_cuda_stream_t *stream,
                                    w16_cuda_graph_t **out,
                                    wna16_error_t *err);
wna16_status_t w16_cuda_graph_launch(w16_cuda_t *cuda, w16_cuda_graph_t *g,
                                     w16_cuda_stream_t *stream,
                                     wna16_error_t *err);
void w16_cuda_graph_destroy(w16_cuda_t *cuda, w16_cuda_graph_t *g);

#endif
