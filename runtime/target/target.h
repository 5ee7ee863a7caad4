/*
 * target.h - what a target is: one const descriptor of data and function
 * pointers (QBE's struct Target), listed once in runtime/targets.c. A
 * target compiles kernel IR kernels, loads the compiled artifacts, moves a
 * job's data where its kernels can read it and launches them. Callers hold
 * a `const w16_target_t *` and never branch on which target it is; what
 * differs between targets is data here (the repack builder's kernel shape,
 * whether kernels address host memory, the compiler's name) or behind the
 * function pointers. docs/targets.md says how to add one.
 *
 * Lifetimes: the descriptor is static. A target's instance (the JIT, the
 * device and its context) belongs to the wna16 context: made by `probe` on
 * first use, kept in ctx->targets[id], freed by `release` when the context
 * is destroyed. Compiled artifacts (blobs) belong to the kernel cache;
 * loaded handles live until the cache unloads them. A stream belongs to
 * its caller from stream_open to stream_close.
 *
 * Addresses: kernels take every parameter as a 64-bit value. A buffer is
 * an address on the target (a host pointer where `host_memory`, a device
 * pointer otherwise); an f32 scalar is its bits in the low half.
 */
#ifndef W16_TARGET_H
#define W16_TARGET_H

#include "base/base.h"
#include "base/hash.h"
#include "gen/kir.h"

/* Launch hints. SMALL: little work; a target may run it on the calling
 * thread rather than wake its workers (a pool wakes in tens of us). */
enum { W16_LAUNCH_SMALL = 1u << 0 };

/* One job's work on a target: its uploads, outputs and launches, in order.
 * Opaque; each target defines it. */
typedef struct w16_stream w16_stream_t;

/* A target's own fused MoE (hand-tuned kernels rather than the portable
 * generated ones): the operations behind the public wna16_cuda_moe_*
 * doors (runtime/moe_native.c), with their signatures and contracts
 * (include/wna16.h). The doors check that the target exists; these check
 * everything else. */
typedef struct w16_native_moe {
    wna16_status_t (*create)(wna16_context_t *ctx, const wna16_spec_t *backend,
                             const wna16_tensor_set_t *tensors,
                             const char *prefix, int32_t E, int32_t H,
                             int32_t I, const wna16_quant_desc_t *quant,
                             bool device_tensors, wna16_cuda_moe_t **out,
                             wna16_error_t *err);
    void (*destroy)(wna16_cuda_moe_t *moe);
    wna16_status_t (*run)(wna16_cuda_moe_t *moe, const wna16_moe_params_t *p,
                          const void *hidden, int32_t M,
                          const int32_t *topk_ids, const float *topk_weights,
                          int32_t topk, void *out, wna16_error_t *err);
    wna16_status_t (*run_batched)(wna16_cuda_moe_t *moe,
                                  const wna16_moe_params_t *p,
                                  const void *hidden, int32_t max_tokens,
                                  const int32_t *expert_num_tokens,
                                  const float *weights, void *out,
                                  wna16_error_t *err);
    wna16_status_t (*run_device)(wna16_cuda_moe_t *moe,
                                 const wna16_moe_params_t *p, uint64_t hidden,
                                 int32_t M, uint64_t topk_ids,
                                 uint64_t topk_weights, int32_t topk,
                                 uint64_t out, void *stream,
                                 wna16_error_t *err);
    wna16_status_t (*run_batched_device)(wna16_cuda_moe_t *moe,
                                         const wna16_moe_params_t *p,
                                         uint64_t hidden, int32_t max_tokens,
                                         uint64_t expert_num_tokens,
                                         uint64_t weights, uint64_t out,
                                         void *stream, wna16_error_t *err);
    wna16_status_t (*sync)(wna16_cuda_moe_t *moe, void *stream,
                           wna16_error_t *err);
    void (*last_report)(const wna16_cuda_moe_t *moe,
                        wna16_cuda_moe_report_t *out);
} w16_native_moe_t;

/* How the generated fused MoE (runtime/moe_gen.c) runs on a target. ORDER
 * MOEORCH.
 *   NONE    it does not run there (a target with its own fused MoE, or
 *           none yet): wna16_moe_layer_create refuses the target;
 *   HOST    the host routes each call (wna16_moe_align) and reads and
 *           writes the kernels' buffers between launches: for targets
 *           whose kernels address host memory and whose launches return
 *           when done (the CPU, where host routing is the fastest);
 *   DEVICE  routing is a generated kernel too (gen/build_route.c): a call
 *           is a fixed list of launches whose grids come from upper
 *           bounds, with no host read between them, so it runs where
 *           kernels address device memory (xpu through Level Zero) and
 *           on the ocl target, whose SVM could take either (it takes this
 *           one, so that the xpu target's orchestration is tested here). */
typedef enum w16_moe_orch {
    W16_MOE_ORCH_NONE,
    W16_MOE_ORCH_HOST,
    W16_MOE_ORCH_DEVICE,
} w16_moe_orch_t;

/* What a probed target runs on, for reports and for selection. */
typedef struct w16_target_device {
    char text[200];   /* "NVIDIA H200 (compute capability 9.0)",
                         "host CPU (znver5, 2 threads)" */
    int cc_major, cc_minor; /* a CUDA device's compute capability, else 0 */
    int threads;            /* host threads that run its kernels, or 0 */
    /* The CPU's LLVM feature string ("+avx512f,+avx512vnni,..."), which
     * decides the dedicated CPU kernels (gen/moe_cpu.h); NULL elsewhere.
     * Lives as long as the target's instance. */
    const char *cpu_features;
} w16_target_device_t;

typedef struct w16_target {
    wna16_target_t id;           /* the public enum value */
    const char *name;            /* "cpu", "cuda": wna16_target_name(id) */
    const char *compiler;        /* "LLVM JIT", "NVRTC": for reports */
    wna16_platform_t platform;   /* the platform whose backends it serves */
    /* Kernels read and write host memory directly: streams copy nothing,
     * and host-side orchestration (the generated fused MoE) can run here. */
    bool host_memory;
    /* The repack builder's kernel shape for this target
     * (w16_repack_request_t): a lane writes whole blocks of destination
     * words (vector units), or workgroups stage source tiles in shared
     * memory (GPUs). */
    bool word_blocks, staged_tiles;
    /* Kernel entry points are named after their cache key (one JIT holds
     * every kernel of a process); otherwise after the kernel. */
    bool key_symbols;
    /* How the generated fused MoE runs here (w16_moe_orch_t). */
    w16_moe_orch_t moe_orch;

    /* The context's instance, made on first use; EUNAVAILABLE with the
     * reason ("CUDA target unavailable: no driver") where the target
     * cannot run here. Thread safe. */
    wna16_status_t (*probe)(wna16_context_t *ctx, void **inst,
                            wna16_error_t *err);
    /* The device or CPU the instance runs on. */
    void (*describe)(void *inst, w16_target_device_t *out);
    /* Frees the context's instance, if any (context teardown; the kernel
     * cache, which holds loaded handles, is gone by then). */
    void (*release)(wna16_context_t *ctx);
    /* What the target adds to a kernel's cache key besides the kernel's
     * text: its name, the device or CPU and its features, the compiler
     * and emitter versions. */
    void (*key)(void *inst, w16_keyer_t *kr);
    /* The kernel's text as this target compiles it (kernel IR for LLVM,
     * CUDA C for NVRTC): hashed into the key, handed to compile. */
    wna16_status_t (*source)(void *inst, const kir_kernel_t *k, w16_buf_t *out,
                             wna16_error_t *err);
    /* Compiles a kernel into an artifact (*blob allocated with w16_alloc
     * on ctx, the kernel cache's convention) whose entry point is
     * `symbol`. `source` is what `source` printed. */
    wna16_status_t (*compile)(void *inst, wna16_context_t *ctx,
                              const kir_kernel_t *k, const char *source,
                              const char *symbol, void **blob, size_t *size,
                              wna16_error_t *err);
    /* Loads an artifact (fresh or from disk) and returns its entry point;
     * the blob stays the caller's. */
    wna16_status_t (*load)(void *inst, const void *blob, size_t size,
                           const char *symbol, void **fn, wna16_error_t *err);
    /* Frees a loaded entry point. May be NULL (the JIT frees code with
     * the instance). */
    void (*unload)(void *fn);

    /* ---- a job's data and launches ---- */
    wna16_status_t (*stream_open)(void *inst, wna16_context_t *ctx,
                                  w16_stream_t **out, wna16_error_t *err);
    /* `bytes` of host memory for kernels to read at *addr (a copy, or the
     * host address itself). The host memory must stay valid until the
     * stream is closed. */
    wna16_status_t (*put)(w16_stream_t *s, const void *host, size_t bytes,
                          uint64_t *addr, wna16_error_t *err);
    /* n host buffers for kernels to read, and at *table the table of
     * their n addresses (u64 each). The buffers and the `hosts` array
     * must stay valid until the stream is closed (a host-memory target
     * hands the array itself to the kernels). */
    wna16_status_t (*put_table)(w16_stream_t *s, int n, const uint64_t *hosts,
                                const size_t *bytes, uint64_t *table,
                                wna16_error_t *err);
    /* Room for `bytes` of kernel output that ends up at `host`; *addr is
     * where kernels write it. Finish it with output_done. */
    wna16_status_t (*output)(w16_stream_t *s, void *host, size_t bytes,
                             uint64_t *addr, wna16_error_t *err);
    /* The kernels writing output `addr` are all launched: bring it to its
     * host memory (possibly while later work runs; the stream owns addr
     * now). By stream_close it has arrived. */
    wna16_status_t (*output_done)(w16_stream_t *s, uint64_t addr,
                                  wna16_error_t *err);
    /* Room for `bytes` of memory that only kernels read and write (a
     * call's intermediates: routing, activations); *addr is where they
     * find it (device memory, or host memory the stream allocated on a
     * host-memory target). Never copied; its content is undefined until a
     * kernel writes it; freed by stream_close. Needed where moe_orch is
     * DEVICE, else may be NULL. */
    wna16_status_t (*scratch)(w16_stream_t *s, size_t bytes, uint64_t *addr,
                              wna16_error_t *err);
    /* Runs n_groups workgroups of `lanes` lanes of `fn` with the kernel's
     * n_args parameters, after everything put so far. May return before
     * the kernel has run (errors then surface at stream_close). `flags`:
     * W16_LAUNCH_* hints. */
    wna16_status_t (*launch)(w16_stream_t *s, void *fn, const uint64_t *args,
                             int n_args, int64_t n_groups, int lanes,
                             unsigned flags, wna16_error_t *err);
    /* Waits for the stream's work and frees everything it made. With
     * st != WNA16_OK the pending outputs are not brought back: their host
     * memory is left as it was (the caller's `out` untouched on error;
     * the repack clears the tensors it allocated, never handing out
     * unwritten memory). Returns st, or the first error of the remaining
     * work. */
    wna16_status_t (*stream_close)(w16_stream_t *s, wna16_status_t st,
                                   wna16_error_t *err);

    /* The target's own fused MoE, or NULL. */
    const w16_native_moe_t *native_moe;

    /* ---- ahead-of-time kernel packs (runtime/cache/pack.h) ----
     * NULL where the target has no pack entries. */
    /* The pack architectures this instance runs, best first, into
     * out[0 .. max): "x86-64-v4", "x86-64-v3"; "sm_90a", "sm_90",
     * "compute_90", "compute_80". Returns how many. */
    int (*pack_arches)(void *inst, const char **out, int max);
    /* Compiles `k` for `arch` without needing the device: bytes (*blob,
     * w16_alloc on ctx) that `load` turns into the entry point `symbol` on
     * an instance whose pack_arches lists `arch`. Needs the compiler (and,
     * for the CPU, the linker); WNA16_EINVAL for an architecture the
     * target does not pack, naming the ones it does. Thread safe. */
    wna16_status_t (*pack_compile)(wna16_context_t *ctx, const kir_kernel_t *k,
                                   const char *arch, const char *symbol,
                                   void **blob, size_t *size,
                                   wna16_error_t *err);
    /* The compiler that pack_compile uses, in words, for the pack's
     * header ("LLVM 19.1.7 + GNU ld 2.40", "NVRTC 13.0"). */
    const char *(*pack_compiler)(void);
} w16_target_t;

/* The compiled kernel `k` on target T, through the context's kernel cache
 * (memory, then disk, then T->compile). The key hashes `kind` (which
 * family of kernels), the library version, T->key and T->source's text.
 * *fn stays valid until the context is destroyed. *compile_ms (may be
 * NULL) receives the compile time when this call compiled it, else 0. */
wna16_status_t w16_target_kernel(wna16_context_t *ctx, const w16_target_t *T,
                                 const char *kind, const kir_kernel_t *k,
                                 void **fn, double *compile_ms,
                                 wna16_error_t *err);

/* w16_target_kernel for a kernel whose request key (gen/request_key.h)
 * the caller knows: the context's kernel packs are searched first, by
 * `request` for this target and the architectures it runs (a loaded
 * entry is kept in memory: the next call costs a binary search and a
 * table lookup); a kernel no pack holds, or whose entry is damaged or
 * does not load (said once, naming the pack and the entry), goes through
 * w16_target_kernel. With JIT disabled (WNA16_JIT=0, or the context's
 * option) a kernel that must be compiled is an error naming it. */
wna16_status_t w16_target_kernel_req(wna16_context_t *ctx,
                                     const w16_target_t *T, const char *kind,
                                     w16_key_t request, const kir_kernel_t *k,
                                     void **fn, double *compile_ms,
                                     wna16_error_t *err);

/* The entry point name a pack entry of `request` gets on T. */
void w16_target_pack_symbol(const w16_target_t *T, w16_key_t request,
                            const kir_kernel_t *k, char *out, size_t n);

/* The key w16_target_kernel uses for `k` (for callers that memoize by
 * key). Probes the target. */
wna16_status_t w16_target_kernel_key(wna16_context_t *ctx,
                                     const w16_target_t *T, const char *kind,
                                     const kir_kernel_t *k, w16_key_t *key,
                                     wna16_error_t *err);

#endif /* W16_TARGET_H */
