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

/* ---- kernel packs (cuda_kernels.c; w16_cuda_pack_unit: cuda_desc.c) -----
 * A pack entry for sm_XY holds a blob without PTX, one for compute_XY a
 * blob without CUBIN. */

/* The pack architectures a device of compute capability major.minor runs,
 * best first, into out[0 .. max): the CUBINs of its major version at or
 * below its minor ("sm_90a", "sm_90"), then PTX at or below it
 * ("compute_90", ..., "compute_70"). Returns how many. No device needed. */
int w16_cuda_pack_arches_cc(int major, int minor, const char **out, int max);

/* Compiles a whole translation unit for the pack architecture `arch`
 * ("sm_80", "sm_90a", "compute_80") into a pack entry's blob (*blob,
 * w16_alloc on ctx). `unit` names it in messages. NVRTC without a device;
 * one kernel at a time (no --split-compile), so that the same source
 * gives the same bytes. Thread safe. */
wna16_status_t w16_cuda_pack_unit(wna16_context_t *ctx, const char *source,
                                  const char *unit, const char *arch,
                                  void **blob, size_t *size,
                                  wna16_error_t *err);

/* The functions fn_names[0 .. n_fns) of the CUDA unit whose request key
 * (gen/request_key.h) is `request`, from the context's kernel packs: the
 * entry for the best architecture this device runs (entries for others
 * are skipped, said once per pack), checked against its checksum and
 * loaded once per context (kept with the packs' kernels: a later call is
 * a binary search and a table lookup). *found is false when no pack holds
 * it, and when its entry is damaged or does not load: that is said once,
 * naming the pack and the entry, and the caller compiles the unit
 * (w16_cuda_module_get, which refuses to with JIT disabled). Errors: no
 * device, out of memory, $WNA16_PACK_PATH naming a file that is not a
 * pack. */
wna16_status_t w16_cuda_unit_packed(wna16_context_t *ctx, w16_key_t request,
                                    const char *unit,
                                    const char *const *fn_names, int n_fns,
                                    w16_cuda_function_t **fns, bool *found,
                                    wna16_error_t *err);

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
