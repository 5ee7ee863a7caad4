/*
 * wna16.h - the public C API of wna16, a code-generating kernel compiler for
 * weight-only quantized (int4/int8 weights, fp16/bf16 activations) MoE layers.
 *
 * One header, C17. Conventions:
 *   - Every fallible function returns a wna16_status_t (0 = WNA16_OK, negative
 *     = error) and takes a caller-owned `wna16_error_t *err` (may be NULL)
 *     that receives a message naming the offending file, key or argument.
 *     Filling an error never allocates.
 *   - Objects are opaque, created by the _create, _open and _load functions and released by
 *     the matching _destroy or _close. Pointers returned by getters stay owned
 *     by the object they came from and live as long as it does.
 *   - Nothing in the library calls exit() or abort(); nothing writes to
 *     stdout. Diagnostics go to the context's log callback (default: stderr,
 *     warnings and errors only).
 *
 * Threads (tests/host/test_threads.c shows it under ThreadSanitizer):
 *   - A context may be used by any number of threads at once: selection,
 *     checkpoints, repacking, creating and running layers, the kernel
 *     cache (a kernel wanted by several threads is compiled once). The
 *     exceptions change it: wna16_spec_load_file/_text and
 *     wna16_context_destroy run alone (load specs before sharing it;
 *     destroy it after every object made from it).
 *   - A compiled fused-MoE layer (wna16_moe_layer_t) may be run from
 *     several threads: the layer runs one call at a time, each spread over
 *     the context's CPU threads (options.cpu_threads); different layers run
 *     at the same time. A wna16_cuda_moe_t runs one call at a time and does
 *     not lock: use one per thread or stream, or serialize the calls.
 *   - Opened objects (checkpoints, safetensors readers, specs, tensor sets)
 *     may be read from many threads; calls that change one (adding to a
 *     tensor set, a safetensors writer) need it to themselves.
 *   - Callbacks (log, allocator, progress) may be called from the
 *     library's own threads and must be thread-safe.
 *   - A wna16_error_t belongs to one call: do not share one between
 *     threads.
 *
 * Sections: version and status codes; context; dtypes and tensors; specs;
 * the logical (dense) form of quantized MoE weights and the reference
 * semantics; safetensors; checkpoints; backend selection.
 */
#ifndef WNA16_H
#define WNA16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

#define WNA16_VERSION_MAJOR 0
#define WNA16_VERSION_MINOR 1
#define WNA16_VERSION_PATCH 0
#define WNA16_VERSION_STRING "0.1.0"

/* Version of the library actually linked; compare with the macros above. */
const char *wna16_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                   */
/* ------------------------------------------------------------------------ */

/* X(NAME, value, description). ORDER STATUS: values are part of the ABI. */
#define WNA16_STATUS_LIST(X)                                                 \
    X(OK, 0, "success")                                                      \
    X(EINVAL, -1, "invalid argument")                                        \
    X(ENOMEM, -2, "out of memory")                                           \
    X(EIO, -3, "input/output error")                                         \
    X(EFORMAT, -4, "malformed file")                                         \
    X(ESPEC, -5, "invalid spec")                                             \
    X(EUNSUPPORTED, -6, "unsupported configuration")                         \
    X(ENOTFOUND, -7, "not found")                                            \
    X(EUNAVAILABLE, -8, "target unavailable")                                \
    X(ELIMIT, -9, "limit exceeded")                                          \
    X(EMISMATCH, -10, "result mismatch")                                     \
    X(EINTERNAL, -11, "internal error")

typedef enum wna16_status {
#define WNA16_X_(name, value, text) WNA16_##name = value,
    WNA16_STATUS_LIST(WNA16_X_)
#undef WNA16_X_
} wna16_status_t;

/* "EINVAL" etc.; "unknown" for values outside the list. */
const char *wna16_status_name(wna16_status_t status);
/* "invalid argument" etc. */
const char *wna16_status_text(wna16_status_t status);

#define WNA16_ERROR_MESSAGE_MAX 1024

/* Caller-owned error record. `message` is always NUL-terminated; long
 * messages are truncated with "...". */
typedef struct wna16_error {
    wna16_status_t status;
    char message[WNA16_ERROR_MESSAGE_MAX];
} wna16_error_t;

/* Reset to WNA16_OK with an empty message. */
void wna16_error_clear(wna16_error_t *err);

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct wna16_context wna16_context_t;

typedef enum wna16_log_level {
    WNA16_LOG_DEBUG = 0,
    WNA16_LOG_INFO = 1,
    WNA16_LOG_WARN = 2,
    WNA16_LOG_ERROR = 3,
} wna16_log_level_t;

typedef void (*wna16_log_fn)(void *user, wna16_log_level_t level,
                             const char *message);

/* Pluggable allocator. All three functions must be set, or none. They
 * must be thread-safe, and so must the log function: the library calls
 * both from its own threads too (parallel kernel compiles, the CPU
 * kernels' pool), not only from the thread that called into it. */
typedef struct wna16_allocator {
    void *(*alloc)(void *user, size_t size);
    void *(*realloc)(void *user, void *ptr, size_t old_size, size_t new_size);
    void (*free)(void *user, void *ptr, size_t size);
    void *user;
} wna16_allocator_t;

typedef struct wna16_context_options {
    /* NULL: malloc/realloc/free. */
    const wna16_allocator_t *allocator;
    /* NULL: messages at `log_level` and above go to stderr. */
    wna16_log_fn log;
    void *log_user;
    /* default (0) means $WNA16_LOG_LEVEL (debug, info, warn, error) if
     * set, else WNA16_LOG_WARN */
    wna16_log_level_t log_level;
    bool log_level_set;          /* set to true to honour log_level = DEBUG */
    /* Directory holding formats/ and backends/ JSON specs that replace the
     * built-in ones with the same name. NULL: $WNA16_SPEC_DIR if set, else
     * only the specs compiled into the library. */
    const char *spec_dir;
    /* Do not load the built-in specs (tests that bring their own). */
    bool no_builtin_specs;
    /* Threads of the CPU target's kernels (the calling thread is one of
     * them), created with the target on the context's first CPU kernel.
     * 0: $WNA16_NUM_THREADS if set, else the number of online CPUs. At
     * most WNA16_MAX_CPU_THREADS; negative or larger (here or in the
     * environment) fails the creation naming the value. */
    int32_t cpu_threads;
    /* The kernel cache's directory, where compiled kernels are kept across
     * runs. NULL or "": $WNA16_CACHE_DIR, else $XDG_CACHE_HOME/wna16, else
     * $HOME/.cache/wna16. Its entries are loaded as native code, so it must
     * belong to the user and be writable by nobody else (nor its group):
     * otherwise kernels are cached in memory only, with one warning.
     * Nothing is created before the first kernel is compiled. */
    const char *cache_dir;
    /* The size limit of that directory in bytes: a write that takes it
     * over removes the least recently used entries down to 90% of it.
     * 0: $WNA16_CACHE_MAX_SIZE if set (bytes, or with a K, M, G or T
     * suffix: "512M"; "0" there means no limit), else
     * WNA16_CACHE_DEFAULT_MAX_BYTES. WNA16_CACHE_UNLIMITED: no limit.
     * `wna16 cache stats` shows the limit and where it came from. */
    uint64_t cache_max_bytes;
    /* Refuse to compile kernels: each must come from a kernel pack
     * (wna16_context_add_pack, $WNA16_PACK_PATH) or the kernel cache's
     * directory, else the call that needs it fails naming the kernel.
     * Also set by WNA16_JIT=0 in the environment. */
    bool no_jit;
} wna16_context_options_t;

/* The largest cpu_threads (and $WNA16_NUM_THREADS) accepted. */
#define WNA16_MAX_CPU_THREADS 1024

/* The kernel cache's size limit when neither cache_max_bytes nor
 * $WNA16_CACHE_MAX_SIZE names one: 2 GiB. */
#define WNA16_CACHE_DEFAULT_MAX_BYTES ((uint64_t)2 << 30)
/* cache_max_bytes for a kernel cache without a size limit. */
#define WNA16_CACHE_UNLIMITED UINT64_MAX

/* The context's kernel cache, as `wna16 cache stats` shows it: where it
 * keeps compiled kernels and what it did since the context was created. */
typedef struct wna16_cache_info {
    /* The directory in use; "" when the cache is in memory only (no
     * directory could be named, or it is not the user's alone: the log
     * said why). */
    char dir[4096];
    bool disk_readable, disk_writable;
    uint64_t max_bytes;     /* the size limit; WNA16_CACHE_UNLIMITED: none */
    size_t files;           /* entries in the directory now, all processes' */
    uint64_t bytes;         /* their size */
    size_t entries;         /* kernels this context holds in memory */
    /* This context's lookups: answered from memory, loaded from the
     * directory, compiled; entries written, refused as corrupt or as not
     * the user's alone (both recompiled), removed for the size limit;
     * failed compiles or loads. */
    uint64_t memory_hits, disk_hits, compiles, disk_writes, corrupt,
        untrusted, evictions, errors;
} wna16_cache_info_t;

/* Fills `out`. The directory is set up now if no kernel was compiled yet
 * (as the first compile would: created, checked). Errors: EINVAL for NULL
 * arguments, EIO when the directory cannot be listed, ELIMIT for a path
 * longer than `dir`. */
wna16_status_t wna16_cache_info(wna16_context_t *ctx, wna16_cache_info_t *out,
                                wna16_error_t *err);
/* Removes every kernel in the context's cache directory (those of other
 * processes too; nothing else in it) and says how many in `removed` (may
 * be NULL). Kernels already loaded stay usable; they are compiled again
 * only in processes that have not loaded them. EUNAVAILABLE when the
 * cache is in memory only. Safe while other threads and processes use the
 * cache: a kernel being written is published or not, never torn. */
wna16_status_t wna16_cache_clear(wna16_context_t *ctx, size_t *removed,
                                 wna16_error_t *err);

/* Creates a context: allocator, log sink and the spec registry. `opts` may
 * be NULL. Loading a bad spec from spec_dir fails the creation with the
 * file and JSON path in `err`. */
wna16_status_t wna16_context_create(const wna16_context_options_t *opts,
                                    wna16_context_t **out, wna16_error_t *err);
void wna16_context_destroy(wna16_context_t *ctx);

/* Adds the ahead-of-time kernel pack at `path` (built by `wna16 pack
 * build`) to the packs the context searches before its kernel cache and
 * the compilers: memory-mapped read-only until the context is destroyed.
 * Packs named by $WNA16_PACK_PATH (colon-separated) are searched first, in
 * that order, then those added here. A pack built by another generator
 * version is skipped with one warning; entries for other architectures
 * are skipped (said once); a damaged entry is refused with its name and
 * its kernel compiled instead (said once). Errors: WNA16_ENOTFOUND or
 * WNA16_EIO when `path` cannot be read, WNA16_EFORMAT when it is not a
 * pack or its index is damaged (the message names the path and what is
 * wrong). Thread safe. */
wna16_status_t wna16_context_add_pack(wna16_context_t *ctx, const char *path,
                                      wna16_error_t *err);

/* Logs through the context's sink (used by tools and the runtime). */
void wna16_log(wna16_context_t *ctx, wna16_log_level_t level, const char *fmt,
               ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ------------------------------------------------------------------------ */
/* Data types and tensors                                                    */
/* ------------------------------------------------------------------------ */

/* Every dtype of the safetensors format. X(NAME, safetensors name, bits
 * per element, is_float). ORDER DTYPE: the values of the first eight are
 * stable; new dtypes go at the end. wna16's kernels and layouts read and
 * write the first eight; every dtype can be read, passed through and
 * written (`--all-tensors`), including the sub-byte ones, whose tensors
 * must hold a whole number of bytes. */
#define WNA16_DTYPE_LIST(X)                                                  \
    X(F16, "F16", 16, 1)                                                     \
    X(BF16, "BF16", 16, 1)                                                   \
    X(F32, "F32", 32, 1)                                                     \
    X(I32, "I32", 32, 0)                                                     \
    X(U8, "U8", 8, 0)                                                        \
    X(I8, "I8", 8, 0)                                                        \
    X(I16, "I16", 16, 0)                                                     \
    X(I64, "I64", 64, 0)                                                     \
    X(BOOL, "BOOL", 8, 0)                                                    \
    X(U16, "U16", 16, 0)                                                     \
    X(U32, "U32", 32, 0)                                                     \
    X(U64, "U64", 64, 0)                                                     \
    X(F64, "F64", 64, 1)                                                     \
    X(C64, "C64", 64, 1)                                                     \
    X(F8_E4M3, "F8_E4M3", 8, 1)                                              \
    X(F8_E5M2, "F8_E5M2", 8, 1)                                              \
    X(F8_E8M0, "F8_E8M0", 8, 1)                                              \
    X(F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, 1)                                      \
    X(F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, 1)                                      \
    X(F6_E2M3, "F6_E2M3", 6, 1)                                              \
    X(F6_E3M2, "F6_E3M2", 6, 1)                                              \
    X(F4, "F4", 4, 1)

typedef enum wna16_dtype {
    WNA16_DTYPE_INVALID = 0,
#define WNA16_X_(name, st, bits, isf) WNA16_DTYPE_##name,
    WNA16_DTYPE_LIST(WNA16_X_)
#undef WNA16_X_
    WNA16_DTYPE_COUNT_
} wna16_dtype_t;

/* "F16" etc. (the safetensors spelling); NULL for an invalid value. */
const char *wna16_dtype_name(wna16_dtype_t dtype);
/* Size in bytes of one element; 0 for an invalid value and for the
 * sub-byte dtypes (F4, F6_*): see wna16_dtype_bits. */
size_t wna16_dtype_size(wna16_dtype_t dtype);
/* Bits of one element (4 for F4, 6 for F6_*, 8 for U8...); 0 for an
 * invalid value. */
int wna16_dtype_bits(wna16_dtype_t dtype);
/* Bytes of `numel` elements: false for an invalid dtype, an overflow, or
 * a sub-byte count that is not a whole number of bytes. */
bool wna16_dtype_nbytes(wna16_dtype_t dtype, uint64_t numel, size_t *out);
/* Parses a safetensors dtype name (exact, case-sensitive);
 * WNA16_DTYPE_INVALID if unknown. */
wna16_dtype_t wna16_dtype_from_name(const char *name, size_t len);

#define WNA16_MAX_DIMS 8

/* A view of a dense row-major tensor; it never owns `data`. */
typedef struct wna16_tensor {
    const char *name;
    wna16_dtype_t dtype;
    int ndim;
    int64_t shape[WNA16_MAX_DIMS];
    void *data;
    size_t nbytes;
} wna16_tensor_t;

/* Product of the shape (1 for a scalar). */
int64_t wna16_tensor_numel(const wna16_tensor_t *t);

/* Float conversions used everywhere (round to nearest even). */
float wna16_f16_to_f32(uint16_t h);
uint16_t wna16_f32_to_f16(float f);
float wna16_bf16_to_f32(uint16_t b);
uint16_t wna16_f32_to_bf16(float f);

/* ------------------------------------------------------------------------ */
/* Specs                                                                     */
/* ------------------------------------------------------------------------ */

/* A spec is one JSON file: a checkpoint format (specs/formats) or a kernel
 * backend (specs/backends). The language is documented in docs/specs.md.
 * Specs are parsed, validated (unknown keys, types, ranges, expression
 * identifiers, layout bijectivity on sample shapes) and frozen at load. */
typedef struct wna16_spec wna16_spec_t;

typedef enum wna16_spec_kind {
    WNA16_SPEC_FORMAT = 1,
    WNA16_SPEC_BACKEND = 2,
} wna16_spec_kind_t;

/* Loads and validates a spec file and registers it in the context; a spec
 * with the name of a registered one replaces it. `out` may be NULL. */
wna16_status_t wna16_spec_load_file(wna16_context_t *ctx, const char *path,
                                    const wna16_spec_t **out,
                                    wna16_error_t *err);
/* Same, from memory; `origin` names the text in messages. */
wna16_status_t wna16_spec_load_text(wna16_context_t *ctx, const char *origin,
                                    const char *text, size_t len,
                                    const wna16_spec_t **out,
                                    wna16_error_t *err);
/* Validates a spec file without registering it. */
wna16_status_t wna16_spec_validate_file(wna16_context_t *ctx, const char *path,
                                        wna16_error_t *err);

size_t wna16_spec_count(const wna16_context_t *ctx);
const wna16_spec_t *wna16_spec_at(const wna16_context_t *ctx, size_t index);
/* kind 0 matches either kind. NULL if absent. */
const wna16_spec_t *wna16_spec_find(const wna16_context_t *ctx,
                                    wna16_spec_kind_t kind, const char *name);

wna16_spec_kind_t wna16_spec_kind(const wna16_spec_t *spec);
const char *wna16_spec_name(const wna16_spec_t *spec);
const char *wna16_spec_title(const wna16_spec_t *spec);
const char *wna16_spec_description(const wna16_spec_t *spec);
/* File path or "builtin:specs/backends/marlin.json". */
const char *wna16_spec_origin(const wna16_spec_t *spec);

/* ------------------------------------------------------------------------ */
/* Logical MoE weights and the reference semantics                           */
/* ------------------------------------------------------------------------ */

/* The two GEMM operands of a gated MoE layer. w13 = [gate; up] stacked along
 * N (K = H, N = 2I); w2 = down (K = I, N = H). */
typedef enum wna16_gemm {
    WNA16_GEMM_W13 = 0,
    WNA16_GEMM_W2 = 1,
} wna16_gemm_t;

/* One quantized GEMM operand over E experts in dense logical form: the
 * meaning of the weights independent of any layout. Arrays are row-major
 * with the last index fastest:
 *   codes   [E][N][K]  unsigned codes 0 .. 2^bits-1
 *   scales  [E][G][N]  as float (fp16/bf16/fp32 values are exact in float)
 *   zeros   [E][G][N]  true unsigned zero points; NULL = implicit 2^(bits-1)
 *   g_idx   [E][K]     group of each input channel; NULL = k / group_size
 *   bias    [E][N]     NULL = no bias
 * G = K / group_size, or 1 when group_size is -1 (channelwise). */
typedef struct wna16_qweight {
    int32_t E, N, K, G;
    int32_t bits;       /* 4 or 8 */
    int32_t group_size; /* -1 or a divisor of K */
    wna16_dtype_t scale_dtype; /* F16, BF16 or F32: the values' precision */
    wna16_dtype_t bias_dtype;  /* when bias != NULL */
    uint8_t *codes;
    float *scales;
    uint8_t *zeros;
    int32_t *g_idx;
    float *bias;
    /* Zero-point codes a symmetric checkpoint carries but does not use
     * (AutoGPTQ's z-1 words), [E][G][N], kept as stored without the
     * format's decode, for layouts that pass them through as vLLM does
     * (Marlin). NULL when the checkpoint has none or when `zeros` is set. */
    uint8_t *stored_zeros;
    /* The checkpoint carries g_idx tensors (GPTQ, compressed-tensors)
     * even without act-order (vLLM then keeps empty (E, 0) tensors). */
    bool g_idx_stored;
} wna16_qweight_t;

/* Allocates the arrays for the given shape; has_* select optional arrays.
 * Free with wna16_qweight_free. */
wna16_status_t wna16_qweight_alloc(wna16_qweight_t *qw, int32_t E, int32_t N,
                                   int32_t K, int32_t bits, int32_t group_size,
                                   bool has_zeros, bool has_g_idx,
                                   bool has_bias, wna16_error_t *err);
void wna16_qweight_free(wna16_qweight_t *qw);

/* The group of input channel k of expert e. */
int32_t wna16_qweight_group(const wna16_qweight_t *qw, int32_t e, int32_t k);

/* Reference dequantization, exactly as the facts sheet defines it:
 * (q - z) * s in float32, z = zeros[e][g][n] or 2^(bits-1). */
float wna16_ref_dequant(const wna16_qweight_t *qw, int32_t e, int32_t n,
                        int32_t k);

/* A whole MoE layer in logical form. I is the real (unpadded) intermediate
 * size; padding belongs to layouts. */
typedef struct wna16_qlayer {
    int32_t E, H, I;
    wna16_qweight_t w13; /* N = 2I, K = H */
    wna16_qweight_t w2;  /* N = H,  K = I */
} wna16_qlayer_t;

void wna16_qlayer_free(wna16_qlayer_t *layer);

/* A set of named tensors, e.g. one layer of a checkpoint or a repack
 * result. Lookups are by exact name. */
typedef struct wna16_tensor_set wna16_tensor_set_t;

wna16_status_t wna16_tensor_set_create(wna16_context_t *ctx,
                                       wna16_tensor_set_t **out,
                                       wna16_error_t *err);
void wna16_tensor_set_destroy(wna16_tensor_set_t *set);
/* Adds a view (data not copied; the caller keeps it alive). */
wna16_status_t wna16_tensor_set_add_view(wna16_tensor_set_t *set,
                                         const wna16_tensor_t *t,
                                         wna16_error_t *err);
/* Adds a tensor whose zero-filled storage the set owns; returns it. */
wna16_status_t wna16_tensor_set_add_new(wna16_tensor_set_t *set,
                                        const char *name, wna16_dtype_t dtype,
                                        int ndim, const int64_t *shape,
                                        wna16_tensor_t **out,
                                        wna16_error_t *err);
const wna16_tensor_t *wna16_tensor_set_find(const wna16_tensor_set_t *set,
                                            const char *name);
size_t wna16_tensor_set_count(const wna16_tensor_set_t *set);
const wna16_tensor_t *wna16_tensor_set_at(const wna16_tensor_set_t *set,
                                          size_t index);

/* The activations a kernel reads (vLLM's VLLM_MARLIN_INPUT_DTYPE): the
 * model's 16-bit dtype, or activations quantized per token to int8 or fp8
 * e4m3 for Marlin's W4A8 kernels. The 8-bit kinds change the layout: 32x32
 * code tiles, the single scale permutation, zero points without the nibble
 * interleave; int8 stores the scales as int16 codes relative to the
 * operand's largest scale (plus an fp32 input_global_scale), fp8 remaps the
 * codes around the zero point and multiplies the scales by 512 (facts
 * sheet 5.8). Values are part of the ABI (specs read them as A8). */
typedef enum wna16_input_dtype {
    WNA16_INPUT_16BIT = 0, /* fp16/bf16 activations (the default) */
    WNA16_INPUT_INT8 = 1,
    WNA16_INPUT_FP8 = 2,   /* float8 e4m3fn */
    WNA16_INPUT_COUNT_
} wna16_input_dtype_t;

/* "16bit", "int8", "fp8"; NULL for an invalid value. */
const char *wna16_input_dtype_name(wna16_input_dtype_t d);
/* Parses one of those names (exact); -1 (cast) if unknown or NULL. */
wna16_input_dtype_t wna16_input_dtype_from_name(const char *name);

/* What a layer holds and how it is quantized; shared by decode, encode and
 * selection. */
typedef struct wna16_quant_desc {
    int32_t bits;
    int32_t group_size; /* -1 = channelwise */
    bool zero_point;    /* asymmetric (explicit zero points) */
    bool act_order;     /* g_idx permutation (desc_act / actorder=group) */
    bool bias;          /* the checkpoint carries expert biases */
    /* What the checkpoint carries without the quantization using it:
     * zero-point tensors of a symmetric checkpoint (AutoGPTQ) and g_idx
     * tensors without act-order. Layouts that keep them as vLLM does
     * (Marlin) write them; decoding finds them from the tensors. */
    bool zeros_stored;
    bool g_idx_stored;
    /* The activations the destination kernel reads; WNA16_INPUT_16BIT (0)
     * unless set. Only layouts whose capabilities list the 8-bit kind
     * (Marlin) hold it, and only formats whose vLLM integration sets it
     * (GPTQ, compressed-tensors). */
    wna16_input_dtype_t input_dtype;
    /* The model's dtype (vLLM's params_dtype, wna16_model_dtype): F16 or
     * BF16. vLLM creates the scale and bias parameters in it and its weight
     * loader casts the checkpoint's values into them (round to nearest
     * even; overflow to inf), so a repack rounds scales and biases to it
     * first and writes the layouts marked "model_dtype" in it (Marlin,
     * Triton, XPU, Humming; the CPU layout's F32 scales hold the rounded
     * values). A fused MoE created with it refuses activations of another
     * dtype. WNA16_DTYPE_INVALID (0): not given: scales and biases keep the
     * checkpoint's dtype and activations are not checked against it. */
    wna16_dtype_t model_dtype;
} wna16_quant_desc_t;

/* Reference decode of a layer stored in `spec`'s layout.
 *  - format specs: `tensors` holds the per-expert checkpoint tensors under
 *    `prefix` (e.g. "model.layers.0.mlp.experts"), named as the format says;
 *  - backend specs: `tensors` holds the stacked layer tensors under prefix.
 * Shapes are checked against the spec; the layer is allocated in `out`. */
wna16_status_t wna16_ref_decode(wna16_context_t *ctx, const wna16_spec_t *spec,
                                const wna16_tensor_set_t *tensors,
                                const char *prefix, int32_t E, int32_t H,
                                int32_t I, const wna16_quant_desc_t *quant,
                                wna16_qlayer_t *out, wna16_error_t *err);

/* Reference encode of `layer` into `spec`'s layout: adds the tensors (named
 * under prefix) to `out`. Refuses, with the reason, what the layout cannot
 * hold (bits, group size, zero points, act order, bias, shapes). A
 * non-gated layer (w13 N = I, the *_no_mul activations) goes into stacked
 * layouts only, as a w13 of I rows, and is not padded. */
wna16_status_t wna16_ref_encode(wna16_context_t *ctx, const wna16_spec_t *spec,
                                const wna16_qlayer_t *layer,
                                const char *prefix, wna16_tensor_set_t *out,
                                wna16_error_t *err);

/* wna16_ref_encode for a kernel that reads `input` activations: the 8-bit
 * kinds select the layout's 8-bit-activation variant (Marlin's W4A8) and
 * are refused, with the reason, by layouts without one.
 * WNA16_INPUT_16BIT is exactly wna16_ref_encode. */
wna16_status_t wna16_ref_encode_input(wna16_context_t *ctx,
                                      const wna16_spec_t *spec,
                                      const wna16_qlayer_t *layer,
                                      wna16_input_dtype_t input,
                                      const char *prefix,
                                      wna16_tensor_set_t *out,
                                      wna16_error_t *err);

/* ------------------------------------------------------------------------ */
/* safetensors                                                               */
/* ------------------------------------------------------------------------ */

/* Largest header accepted (bytes). */
#define WNA16_SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)

typedef struct wna16_safetensors wna16_safetensors_t;

/* Opens and memory-maps a file and validates its header strictly: header
 * length within bounds, valid JSON object, known dtypes, shapes of
 * non-negative integers, data offsets in range, not overlapping, size =
 * numel x dtype size, every data byte accounted for. */
wna16_status_t wna16_safetensors_open(wna16_context_t *ctx, const char *path,
                                      wna16_safetensors_t **out,
                                      wna16_error_t *err);
/* Same over a caller-owned buffer (kept alive by the caller); `origin`
 * names it in messages. */
wna16_status_t wna16_safetensors_open_memory(wna16_context_t *ctx,
                                             const char *origin,
                                             const void *data, size_t size,
                                             wna16_safetensors_t **out,
                                             wna16_error_t *err);
void wna16_safetensors_close(wna16_safetensors_t *st);

const char *wna16_safetensors_path(const wna16_safetensors_t *st);
size_t wna16_safetensors_count(const wna16_safetensors_t *st);
/* Tensors in file order of their data offsets. data points into the map
 * (read-only memory) and may be unaligned if the file's header length is
 * not a multiple of 8: copy with memcpy rather than casting. */
const wna16_tensor_t *wna16_safetensors_at(const wna16_safetensors_t *st,
                                           size_t index);
const wna16_tensor_t *wna16_safetensors_find(const wna16_safetensors_t *st,
                                             const char *name);
/* __metadata__ string values; NULL if absent. */
size_t wna16_safetensors_metadata_count(const wna16_safetensors_t *st);
const char *wna16_safetensors_metadata_key(const wna16_safetensors_t *st,
                                           size_t index);
const char *wna16_safetensors_metadata_get(const wna16_safetensors_t *st,
                                           const char *key);

/* Streaming writer: declare every tensor (name, dtype, shape) and the
 * metadata first, then write the data of each tensor in declaration order,
 * in as many chunks as convenient. What `path` names decides how it is
 * written: a regular file (or a new one) goes to "<path>.tmp.<pid>.<n>"
 * beside it, renamed over `path` by finish(); abort() (or an error) removes
 * it, so no partial file is ever left at `path`, and stale temporaries of
 * processes that are gone are removed first. A symbolic link's target is
 * written the same way (the link stays); "-" (standard output, not a
 * terminal), a FIFO or a character device is streamed to; a directory, a
 * block device or a socket is refused. Nothing that is not a regular file
 * is ever renamed over. */
typedef struct wna16_safetensors_writer wna16_safetensors_writer_t;

wna16_status_t wna16_safetensors_writer_create(wna16_context_t *ctx,
                                               const char *path,
                                               wna16_safetensors_writer_t **out,
                                               wna16_error_t *err);
wna16_status_t wna16_safetensors_writer_metadata(
    wna16_safetensors_writer_t *w, const char *key, const char *value,
    wna16_error_t *err);
wna16_status_t wna16_safetensors_writer_declare(wna16_safetensors_writer_t *w,
                                                const char *name,
                                                wna16_dtype_t dtype, int ndim,
                                                const int64_t *shape,
                                                wna16_error_t *err);
/* Appends bytes to the current tensor (the first declared tensor whose data
 * is not complete). Writing past a tensor's size is an error. */
wna16_status_t wna16_safetensors_writer_write(wna16_safetensors_writer_t *w,
                                              const void *data, size_t size,
                                              wna16_error_t *err);
/* Checks every tensor is complete; a file is synced and renamed into
 * place, a stream closed. Frees w. */
wna16_status_t wna16_safetensors_writer_finish(wna16_safetensors_writer_t *w,
                                               wna16_error_t *err);
/* Discards the temporary file. Frees w. */
void wna16_safetensors_writer_abort(wna16_safetensors_writer_t *w);

/* Convenience: writes every tensor of `set` (in set order) and the given
 * metadata pairs (keys[i], values[i]) to `path`. */
wna16_status_t wna16_safetensors_write_set(wna16_context_t *ctx,
                                           const char *path,
                                           const wna16_tensor_set_t *set,
                                           size_t n_meta,
                                           const char *const *keys,
                                           const char *const *values,
                                           wna16_error_t *err);

/* ------------------------------------------------------------------------ */
/* Hugging Face checkpoints                                                  */
/* ------------------------------------------------------------------------ */

typedef struct wna16_checkpoint wna16_checkpoint_t;

/* What config.json says about the model and its quantization. Fields not
 * present (or JSON null) are 0 / false / ""; keys not listed are ignored,
 * but a listed key of the wrong type or a string too long for its field is
 * an error naming the file and JSON path. quantization_config is read per
 * quant_method (case-insensitive): gptq (bits, group_size, desc_act, sym),
 * awq (bits|w_bit, group_size|q_group_size, zero_point, version),
 * compressed-tensors (first config group's weights: num_bits, group_size,
 * strategy "channel" => -1, symmetric => sym, actorder; desc_act = actorder
 * "group"), moe_wna16 (bits, group_size, has_zp => zero_point,
 * linear_quant_method). Another quant_method leaves format_name "". */
typedef struct wna16_model_config {
    char model_type[64];
    int32_t hidden_size;
    int32_t moe_intermediate_size; /* moe_intermediate_size, else
                                      intermediate_size */
    int32_t num_experts;           /* num_experts / num_local_experts /
                                      n_routed_experts */
    int32_t num_experts_per_tok;
    int32_t num_hidden_layers;
    char torch_dtype[16];
    /* quantization_config */
    char quant_method[32]; /* "gptq", "awq", "compressed-tensors", ... */
    int32_t bits;
    int32_t group_size;
    bool has_sym;
    bool sym;
    bool desc_act;
    bool has_zero_point;
    bool zero_point;
    char actorder[16]; /* compressed-tensors: "", "group", "weight", ... */
    char format_name[32]; /* the wna16 format spec this maps to */
    char version[16];     /* awq: "gemm", "gemv", ... */
    char linear_quant_method[16]; /* moe_wna16: "gptq" or "awq" */
} wna16_model_config_t;

/* Opens a checkpoint: a directory with config.json and model.safetensors or
 * sharded model-*.safetensors with model.safetensors.index.json, or a single
 * .safetensors file (no config). Every shard is validated, and the index
 * must match the shards exactly: each listed tensor is in its shard, each
 * shard tensor is listed for that shard, shard names are plain file names.
 * Tensors are listed shard by shard (shards sorted by file name), each in
 * data-offset order. */
wna16_status_t wna16_checkpoint_open(wna16_context_t *ctx, const char *path,
                                     wna16_checkpoint_t **out,
                                     wna16_error_t *err);
void wna16_checkpoint_close(wna16_checkpoint_t *ck);

/* NULL when the checkpoint has no config.json. */
const wna16_model_config_t *
wna16_checkpoint_config(const wna16_checkpoint_t *ck);
/* The model's dtype as vLLM's --dtype resolves it (vLLM's
 * _get_and_verify_dtype): `requested` F16 or BF16 wins; WNA16_DTYPE_INVALID
 * is "auto": config.json's torch_dtype (or dtype) float16 / half gives F16,
 * bfloat16 gives BF16, float32 / float or none gives BF16 (vLLM downcasts a
 * float32 model to the platform's first supported dtype: bfloat16 on GPUs
 * from sm_80, CPUs and XPUs). With no config (cfg NULL) and auto, *out is
 * WNA16_DTYPE_INVALID: the checkpoint's own scale dtype is kept. `why`
 * (may be NULL) gets one line saying which rule decided. Errors
 * (WNA16_EINVAL, naming the value): a requested dtype other than F16 and
 * BF16, a torch_dtype wna16 cannot run (float64, int8, ...). */
wna16_status_t wna16_model_dtype(const wna16_model_config_t *cfg,
                                 wna16_dtype_t requested, wna16_dtype_t *out,
                                 char *why, size_t why_len,
                                 wna16_error_t *err);
/* vLLM's --dtype spellings: "auto" (WNA16_DTYPE_INVALID), "float16" /
 * "half" / "fp16" (F16), "bfloat16" / "bf16" (BF16); false for any
 * other. */
bool wna16_model_dtype_from_name(const char *name, wna16_dtype_t *out);
/* "float16", "bfloat16", "auto" for WNA16_DTYPE_INVALID; NULL otherwise. */
const char *wna16_model_dtype_name(wna16_dtype_t dtype);

/* Parses a config.json file by itself. */
wna16_status_t wna16_model_config_load(const char *path,
                                       wna16_model_config_t *out,
                                       wna16_error_t *err);

/* The quantization a config describes, in wna16's terms: bits, group size,
 * zero points (gptq/compressed-tensors: not sym; awq: zero_point, default
 * true; moe_wna16: has_zp), act-order (gptq: desc_act unless the group size
 * is -1, as vLLM does; compressed-tensors: actorder "group"). Bias cannot be
 * told from a config: it is left false. Fails when the config has no
 * quantization_config that wna16 knows. */
wna16_status_t wna16_model_config_quant(const wna16_model_config_t *cfg,
                                        wna16_quant_desc_t *out,
                                        wna16_error_t *err);

size_t wna16_checkpoint_tensor_count(const wna16_checkpoint_t *ck);
const wna16_tensor_t *wna16_checkpoint_tensor_at(const wna16_checkpoint_t *ck,
                                                 size_t index);
const wna16_tensor_t *wna16_checkpoint_find(const wna16_checkpoint_t *ck,
                                            const char *name);

/* ------------------------------------------------------------------------ */
/* Backend selection                                                         */
/* ------------------------------------------------------------------------ */

typedef enum wna16_platform {
    WNA16_PLATFORM_CUDA = 0,
    WNA16_PLATFORM_ROCM = 1,
    WNA16_PLATFORM_CPU = 2,
    WNA16_PLATFORM_XPU = 3,
    WNA16_PLATFORM_COUNT_
} wna16_platform_t;

const char *wna16_platform_name(wna16_platform_t p);

typedef enum wna16_activation_format {
    WNA16_ACT_FORMAT_STANDARD = 0,
    WNA16_ACT_FORMAT_BATCHED = 1,
} wna16_activation_format_t;

/* Everything selection looks at. Strings name specs and activations as the
 * specs spell them ("gptq", "silu"). */
typedef struct wna16_select_query {
    wna16_platform_t platform;
    int32_t cc_major, cc_minor; /* compute capability (cuda/rocm) */
    const char *format;         /* format spec name */
    wna16_quant_desc_t quant;
    const char *actorder; /* compressed-tensors actorder: NULL, "group",
                             "weight", "dynamic" */
    int32_t hidden_size, intermediate_size, num_experts, top_k;
    /* The unsharded intermediate size when tensor parallelism splits w2's
     * input (K) over ranks and intermediate_size is one rank's part; 0:
     * intermediate_size (no sharding). Only is_k_full reads it. */
    int32_t intermediate_size_full;
    wna16_activation_format_t activation_format;
    const char *activation; /* NULL = "silu" */
    const char *backend;    /* explicit backend name; NULL or "auto" = auto */
    /* Platforms for which this wna16 build can generate and run kernels, as
     * a bit mask of (1 << wna16_platform_t). 0 = this build's own. */
    uint32_t kernel_platforms;
} wna16_select_query_t;

#define WNA16_SELECT_MAX_REASONS 16
#define WNA16_SELECT_REASON_MAX 256

typedef struct wna16_select_result {
    const wna16_spec_t *backend; /* NULL when nothing fits */
    /* The format spec selection actually used: the query's format, or the
     * format it fell back to (e.g. gptq -> moe_wna16); NULL when the query
     * was rejected before the format stage. */
    const wna16_spec_t *format;
    /* Why the format fell back, "" when it did not. */
    char note[WNA16_SELECT_REASON_MAX];
    /* The Marlin kernels' is_k_full argument (vLLM's marlin_is_k_full,
     * facts sheet 5.3): false when act-order meets a w2 whose K is a
     * tensor-parallel shard (intermediate_size < intermediate_size_full).
     * The kernel then takes each group's size from g_idx instead of K / G.
     * Set on success. */
    bool is_k_full;
    size_t n_passed_over;
    struct {
        const wna16_spec_t *backend;
        char reason[WNA16_SELECT_REASON_MAX];
    } passed_over[WNA16_SELECT_MAX_REASONS];
} wna16_select_result_t;

/* Picks the backend as vLLM's select_wna16_moe_backend does, driven by the
 * backend specs. On failure returns WNA16_EUNSUPPORTED with the vLLM message
 * in err (explicit refusals: the backend and its reason; nothing fits: "No
 * WNA16 MoE backend supports the deployment configuration."); `res` still
 * lists every backend passed over and why. */
wna16_status_t wna16_select(wna16_context_t *ctx,
                            const wna16_select_query_t *query,
                            wna16_select_result_t *res, wna16_error_t *err);

/* The platforms this build can generate kernels for (see kernel_platforms). */
uint32_t wna16_build_kernel_platforms(void);

/* ------------------------------------------------------------------------ */
/* Repacking                                                                 */
/* ------------------------------------------------------------------------ */

/* Where repack work runs: the scalar reference (the oracle), generated
 * kernels JIT-compiled for the host CPU (LLVM), on a CUDA GPU (NVRTC), or
 * on an Intel GPU (SPIR-V through Level Zero). */
typedef enum wna16_target {
    WNA16_TARGET_REFERENCE = 0,
    WNA16_TARGET_CPU = 1,
    WNA16_TARGET_CUDA = 2,
    WNA16_TARGET_XPU = 3, /* Intel GPUs: SPIR-V through Level Zero */
    WNA16_TARGET_OCL = 4, /* the same SPIR-V through llvm-spirv-15 and an
                             OpenCL 2.0 device whose kernels address host
                             memory (PoCL's CPU device) */
    WNA16_TARGET_COUNT_
} wna16_target_t;

const char *wna16_target_name(wna16_target_t t);

/* Repacks one MoE layer: the checkpoint tensors of `src_format` under
 * `prefix` in `src` (per expert and projection, or stacked) become the
 * stacked w13_/w2_ tensors of `dst_backend`, added to `out` under the same
 * prefix. Refuses, with the reason, what the destination layout cannot hold
 * (bits, group size, zero points, act order, bias, shapes). Every target
 * produces the same bytes. quant->model_dtype (F16/BF16) casts scales and
 * biases to the model's dtype first, as vLLM's weight loader does. */
wna16_status_t wna16_repack_layer(wna16_context_t *ctx,
                                  const wna16_spec_t *src_format,
                                  const wna16_tensor_set_t *src,
                                  const char *prefix, int32_t E, int32_t H,
                                  int32_t I, const wna16_quant_desc_t *quant,
                                  const wna16_spec_t *dst_backend,
                                  wna16_target_t target,
                                  wna16_tensor_set_t *out, wna16_error_t *err);

/* The MoE layers of a checkpoint, as the prefixes their expert tensors sit
 * under ("model.layers.3.mlp.experts"), in natural order (layer 2 before
 * layer 10). A layer is found by its expert 0 gate projection's codes,
 * "{prefix}.0.{gate}.{qweight}" for per-expert formats (every spelling the
 * format spec's "projections" lists: gate_proj, w1, ...; the qweight layout's
 * tensor name: qweight, weight_packed, ...), or "{prefix}.w13_{qweight}" for
 * stacked formats. Names come from the spec, never from wna16 itself. */
typedef struct wna16_moe_layers {
    size_t count;
    char **prefixes;
    wna16_context_t *ctx_; /* internal: how to free the list */
    size_t cap_;
} wna16_moe_layers_t;

/* Fills `out` (count 0 when there is none; that is not an error). Free it
 * with wna16_moe_layers_free. */
wna16_status_t wna16_checkpoint_moe_layers(wna16_context_t *ctx,
                                           const wna16_checkpoint_t *ck,
                                           const wna16_spec_t *format,
                                           wna16_moe_layers_t *out,
                                           wna16_error_t *err);
void wna16_moe_layers_free(wna16_moe_layers_t *layers);

/* Does the layer carry expert biases? Told from the tensors, not the config
 * (configs do not say): expert 0's gate projection has a tensor named as
 * the format's bias layout ("{prefix}.w13_{bias}" when stacked). */
bool wna16_checkpoint_layer_has_bias(const wna16_checkpoint_t *ck,
                                     const wna16_spec_t *format,
                                     const char *prefix);

/* One output tensor of a repack, before its data exists. */
#define WNA16_TENSOR_NAME_MAX 512
typedef struct wna16_tensor_decl {
    char name[WNA16_TENSOR_NAME_MAX];
    wna16_dtype_t dtype;
    int ndim;
    int64_t shape[WNA16_MAX_DIMS];
    size_t nbytes;
} wna16_tensor_decl_t;

/* One MoE layer of a checkpoint, collected as wna16_repack_layer (and,
 * after the repack, wna16_moe_layer_create / wna16_cuda_moe_create) take
 * it: what every host otherwise assembles by hand. */
typedef struct wna16_checkpoint_layer {
    const wna16_spec_t *format; /* the checkpoint's format spec */
    char prefix[WNA16_TENSOR_NAME_MAX]; /* "model.layers.3.mlp.experts" */
    int32_t E, H, I;  /* experts, hidden size, (unpadded) intermediate */
    int32_t topk;     /* num_experts_per_tok; 0 when the config lacks it */
    /* The model's activation dtype (wna16_model_dtype, auto): F16 when
     * torch_dtype is float16, else BF16 (a float32 model runs BF16
     * activations). quant.model_dtype is the same: the repack casts scales
     * and biases to it and the fused MoE takes only it. */
    wna16_dtype_t act_dtype;
    /* The config's quantization (wna16_model_config_quant) completed from
     * the tensors as wna16_repack_checkpoint does: bias (the format's bias
     * tensors are present), zeros_stored, g_idx_stored. */
    wna16_quant_desc_t quant;
    /* Every tensor named "{prefix}.*": views into the checkpoint's mapped
     * files (no copy). Owned by this struct; valid while both it and the
     * checkpoint are open. */
    wna16_tensor_set_t *tensors;
} wna16_checkpoint_layer_t;

/* Collects the MoE layer under `prefix` (one of
 * wna16_checkpoint_moe_layers' prefixes) of `ck`. `cfg`: the model's
 * config; NULL takes the checkpoint's config.json (a lone .safetensors
 * file has none: pass one from wna16_model_config_load). `format`: NULL
 * takes the config's (format_name). Errors: WNA16_EINVAL for NULL
 * arguments or no config; WNA16_EUNSUPPORTED for a quantization the
 * config does not describe or a format spec that is missing; WNA16_EFORMAT
 * for sizes the config lacks (naming the key); WNA16_ENOTFOUND when no
 * expert tensor is under `prefix`. `out` is zeroed on error. Free with
 * wna16_checkpoint_layer_close; then close the checkpoint. */
wna16_status_t wna16_checkpoint_layer_open(wna16_context_t *ctx,
                                           const wna16_checkpoint_t *ck,
                                           const wna16_model_config_t *cfg,
                                           const wna16_spec_t *format,
                                           const char *prefix,
                                           wna16_checkpoint_layer_t *out,
                                           wna16_error_t *err);
/* Frees the tensor set and zeroes `layer`; a zeroed struct is fine. */
void wna16_checkpoint_layer_close(wna16_checkpoint_layer_t *layer);

/* Most tensors one layer can repack into (w13 and w2, every role). */
#define WNA16_LAYER_MAX_TENSORS 16

/* The tensors wna16_repack_layer will add to `out` for one layer, in the
 * same order, computed from the backend spec alone (no data is touched):
 * for w13 then w2, every layout present for the problem, its shape from
 * the spec and the padded intermediate size. Float roles keep the source's
 * dtype when the layout accepts it: `scale_dtype` and `bias_dtype` are the
 * checkpoint's (WNA16_DTYPE_INVALID: the layout's first dtype). Fills
 * decls[0 .. *count). Fails on a destination that is not a stacked backend
 * or shapes the spec cannot bind; capability refusals (bits, zero points,
 * ...) are wna16_repack_layer's. */
wna16_status_t wna16_repack_layer_shapes(
    wna16_context_t *ctx, const wna16_spec_t *dst_backend, const char *prefix,
    int32_t E, int32_t H, int32_t I, const wna16_quant_desc_t *quant,
    wna16_dtype_t scale_dtype, wna16_dtype_t bias_dtype,
    wna16_tensor_decl_t decls[WNA16_LAYER_MAX_TENSORS], size_t *count,
    wna16_error_t *err);

/* Progress of wna16_repack_checkpoint, reported before and after each
 * layer and after each copied tensor. */
typedef struct wna16_repack_progress {
    size_t layer;        /* 1-based layer being repacked; 0 while copying */
    size_t n_layers;
    const char *name;    /* the layer prefix, or the tensor just copied */
    bool done;           /* false: the layer starts; true: it is written */
    uint64_t bytes_written, bytes_total; /* tensor data of the output */
} wna16_repack_progress_t;

/* What to repack into and how to read the checkpoint. Zero-initialize and
 * set `backend`. The quantization and dimensions come from config.json;
 * the fields below override it, and are required when there is none
 * (a lone .safetensors file): format, bits, group_size, hidden,
 * intermediate, experts. Zero points and act-order then take the format's
 * defaults as wna16_model_config_quant reads them (AWQ: zero points; the
 * others: none) unless set. Bias is never configured: it is read from the
 * tensors (wna16_checkpoint_layer_has_bias). */
typedef struct wna16_repack_options {
    const char *backend;    /* destination backend spec name (required) */
    wna16_target_t target;  /* where the work runs; default the reference */
    const char *format;     /* format spec name; NULL: config.json's */
    int32_t bits;           /* 0: config.json's */
    int32_t group_size;     /* 0: config.json's; -1 = channelwise */
    bool zero_point_set, zero_point; /* override explicit zero points */
    bool act_order_set, act_order;   /* override act-order (desc_act) */
    int32_t hidden, intermediate, experts; /* 0: config.json's */
    bool all_tensors;       /* also copy every non-expert tensor unchanged */
    /* The activations the destination kernel will read (default 16-bit):
     * int8 or fp8 writes the backend's 8-bit-activation layout (Marlin's
     * W4A8 tiles, scale codes and input_global_scale tensors). */
    wna16_input_dtype_t input_dtype;
    const char *layer;      /* only this layer prefix; NULL: every MoE layer */
    void (*progress)(void *user, const wna16_repack_progress_t *p);
    void *progress_user;
    /* The model's dtype (vLLM's --dtype): F16 or BF16; WNA16_DTYPE_INVALID
     * (0): auto, config.json's as wna16_model_dtype resolves it. Scales and
     * biases are cast to it and the backend's model-dtype layouts hold it
     * (wna16_quant_desc_t.model_dtype). */
    wna16_dtype_t dtype;
    /* A directory output (out_path ending in '/' or naming a directory):
     * the largest shard in bytes of tensor data (a tensor larger than this
     * gets a shard of its own); 0: WNA16_DEFAULT_MAX_SHARD_SIZE. Ignored for
     * a file output. */
    uint64_t max_shard_size;
} wna16_repack_options_t;

/* Hugging Face's default max_shard_size, "5GB" (5 * 10^9 bytes). */
#define WNA16_DEFAULT_MAX_SHARD_SIZE UINT64_C(5000000000)

/* What a finished repack did (for reports). */
typedef struct wna16_repack_summary {
    const wna16_spec_t *format, *backend;
    wna16_quant_desc_t quant; /* bias: whether any layer had it */
    int32_t E, H, I, IP;      /* IP: I after the backend's padding */
    size_t n_layers, n_tensors, n_copied;
    uint64_t bytes;           /* tensor data written */
    wna16_target_t target;    /* where the repack ran */
    /* The model's dtype the scales and biases were cast to (0: none known,
     * the checkpoint's kept) and why (wna16_model_dtype's line). */
    wna16_dtype_t model_dtype;
    char model_dtype_reason[256];
    /* A directory output: the shards written (1 for a file output). */
    size_t n_shards;
} wna16_repack_summary_t;

/* Repacks a whole checkpoint (a Hugging Face directory, sharded or not, or
 * a .safetensors file) into one .safetensors file at `out_path`, or, when
 * out_path ends in '/' or names a directory, into a checkpoint directory
 * there (shards "model-0000K-of-0000N.safetensors" of at most
 * opts->max_shard_size bytes of tensor data, the same tensors in the same
 * order, each shard with the metadata below; model.safetensors.index.json;
 * the checkpoint's config.json copied unchanged; every file written to a
 * temporary and renamed only when all are complete, so a failure leaves
 * none of them and removes a directory the call made; weight files of an
 * earlier save there are replaced, any other .safetensors file is refused),
 * in the layout of opts->backend: every MoE layer's expert tensors are stacked
 * into w13 (gate first, up second) and w2 through wna16_repack_layer and
 * written under the layer's prefix with the backend's names
 * ("{prefix}.w13_qweight", ...). Source tensors the backend does not use
 * are left out; non-expert tensors are copied unchanged (after the layers,
 * in the checkpoint's order) only with opts->all_tensors. __metadata__
 * records the backend, target, source format, bits, group size, sizes
 * (padded too), the input dtype, the model dtype ("dtype": float16,
 * bfloat16, or "checkpoint" when none was known), a note of the layout
 * ("layout"), is_k_full (always "true": whole layers
 * are repacked, so w2's K is never a tensor-parallel shard; see
 * wna16_select_result_t) and wna16_version.
 *
 * It streams: every output tensor is declared from the spec first
 * (wna16_repack_layer_shapes), then one layer at a time is repacked,
 * written and freed, and the source pages it read are handed back to the
 * kernel, so memory stays about one layer. The first layer is repacked
 * before the output is created: a backend that cannot hold what the
 * checkpoint's tensors contain is refused with the reason and nothing is
 * written. Any failure leaves no file at `out_path` (the writer's
 * temporary is removed). `out_path` may not be one of the checkpoint's
 * files. `summary` may be NULL. */
wna16_status_t wna16_repack_checkpoint(wna16_context_t *ctx,
                                       const char *checkpoint,
                                       const char *out_path,
                                       const wna16_repack_options_t *opts,
                                       wna16_repack_summary_t *summary,
                                       wna16_error_t *err);

/* ------------------------------------------------------------------------ */
/* Fused MoE                                                                 */
/* ------------------------------------------------------------------------ */

/* The reference fused MoE (the oracle every generated MoE kernel is checked
 * against) and the routing that sorts and aligns tokens per expert for block
 * kernels. Plain scalar C, slow and obviously correct.
 *
 * Shapes: M tokens, top-k experts per token, hidden size H, intermediate
 * size I, E local experts (the layer's). Expert weights are a
 * wna16_qlayer_t in logical form, read only through wna16_ref_dequant, so
 * every layout works once it is decoded. w13 rows [0, I) are the gate
 * projection and rows [I, 2I) the up projection (logical form, whatever
 * the storage does: gpt-oss interleaves gate/up rows on disk and vLLM's
 * swigluoai_and_mul reads the pairs interleaved; de-interleaving is the
 * layout's business, the math is the same). Non-gated activations (the
 * *_no_mul ones) use a w13 of N = I. */

/* X(NAME, vLLM name, gated). ORDER ACTIVATION: values are part of the ABI.
 * With g = gate = h[i], u = up = h[I + i] (gated) or x = h[i] (not gated),
 * i < I, computed in double:
 *   silu          silu(g) * u,           silu(x) = x / (1 + exp(-x))
 *   gelu          gelu(g) * u,           gelu(x) = x/2 (1 + erf(x / sqrt 2))
 *   gelu_tanh     gelu_tanh(g) * u,      gelu_tanh(x) =
 *                 x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   swigluoai     g' = min(g, limit), u' = min(max(u, -limit), limit),
 *                 (u' + beta) * g' * sigmoid(alpha * g')   (gpt-oss; vLLM's
 *                 swigluoai_and_mul with beta fixed to 1, FlashInfer's
 *                 TRT-LLM kernels take beta)
 *   swiglustep    min(silu(g), limit) * min(max(u, -limit), limit)
 *                 (vLLM's swiglustep_and_mul_triton)
 *   silu_no_mul   silu(x)
 *   gelu_no_mul   gelu(x) (exact, erf)
 *   relu2_no_mul  max(x, 0)^2
 * "gelu_tanh" is vLLM's GeluAndMul(approximate="tanh") (gelu_tanh_and_mul);
 * vLLM's MoEActivation enum has no member for it. Clamps propagate NaN. */
#define WNA16_ACTIVATION_LIST(X)                                             \
    X(SILU, "silu", 1)                                                       \
    X(GELU, "gelu", 1)                                                       \
    X(GELU_TANH, "gelu_tanh", 1)                                             \
    X(SWIGLUOAI, "swigluoai", 1)                                             \
    X(SWIGLUSTEP, "swiglustep", 1)                                           \
    X(SILU_NO_MUL, "silu_no_mul", 0)                                         \
    X(GELU_NO_MUL, "gelu_no_mul", 0)                                         \
    X(RELU2_NO_MUL, "relu2_no_mul", 0)

typedef enum wna16_activation {
    WNA16_ACT_INVALID = -1,
#define WNA16_X_(name, str, gated) WNA16_ACT_##name,
    WNA16_ACTIVATION_LIST(WNA16_X_)
#undef WNA16_X_
    WNA16_ACT_COUNT_
} wna16_activation_t;

/* "silu" etc. (vLLM's spelling); NULL for an invalid value. */
const char *wna16_activation_name(wna16_activation_t act);
/* Parses a name (exact, case-sensitive); WNA16_ACT_INVALID if unknown or
 * NULL. */
wna16_activation_t wna16_activation_from_name(const char *name);
/* Gated (act(gate) * up over w13 of N = 2I) or not (*_no_mul, N = I).
 * False for an invalid value. */
bool wna16_activation_is_gated(wna16_activation_t act);

/* Defaults of the gpt-oss swiglu (vLLM's SwigluOAIAndMul). */
#define WNA16_SWIGLU_LIMIT_DEFAULT 7.0f
#define WNA16_SWIGLU_ALPHA_DEFAULT 1.702f
#define WNA16_SWIGLU_BETA_DEFAULT 1.0f

/* How the reference runs a MoE layer. Start from wna16_moe_params_init. */
typedef struct wna16_moe_params {
    wna16_activation_t activation;
    /* swigluoai and swiglustep: the clamp limit, > 0 (INFINITY: no clamp).
     * swigluoai: alpha (sigmoid slope) and beta (added to the clamped up),
     * finite. Ignored by the other activations. */
    float swiglu_limit, swiglu_alpha, swiglu_beta;
    /* false (default): out += w * y (the weight scales the expert's output).
     * true: the expert's input is scaled, x = round(x * round(w)) in the
     * activation dtype as vLLM's prepare step does, and out += y. vLLM only
     * allows this with top-k 1 (Llama 4); the reference allows any top-k. */
    bool apply_router_weight_on_input;
    /* Expert parallelism: expert_map[g] is the local expert of global
     * expert g, or -1 when g is not on this rank (its slots contribute
     * nothing). Entries must be -1 or in [0, E). NULL: ids are local ids
     * in [0, E). Not used by the batched format (its experts are local). */
    const int32_t *expert_map;
    /* Length of expert_map (the number of global experts); with no map,
     * 0 or E. */
    int32_t global_num_experts;
    /* The hidden states' and the output's dtype: F16 or BF16. */
    wna16_dtype_t act_dtype;
    /* Also round the GEMM outputs h (after the w13 bias) and y (after the
     * w2 bias) to act_dtype, as kernels that write them to activation-dtype
     * buffers do (vLLM's Triton and Marlin paths and its torch reference).
     * Default false: h and y stay float32. */
    bool round_gemm_outputs;
} wna16_moe_params_t;

/* silu, limit 7, alpha 1.702, beta 1, router weights on the output, no
 * expert map, BF16, GEMM outputs kept in float32. */
void wna16_moe_params_init(wna16_moe_params_t *p);

/* The activation as the reference computes it: act(gate, up) in double
 * from float inputs, returned as float32 (before the rounding to act_dtype);
 * `up` is ignored by non-gated activations. NaN for an invalid activation. */
float wna16_ref_activation(const wna16_moe_params_t *p, float gate, float up);

/* The reference fused MoE, standard activation format.
 *   hidden       [M][H] act_dtype (uint16_t bits)
 *   topk_ids     [M][topk] int32: global expert ids in
 *                [0, global_num_experts) (no map: local ids in [0, E))
 *   topk_weights [M][topk] float32 router weights
 *   out          [M][H] act_dtype; fully written; must not overlap hidden
 * For each token m, with R() = round to act_dtype (nearest even), F() =
 * round to float32, and every dot product summed in double in increasing
 * index order (exact products; the oracle is more accurate than kernels):
 *   for j < topk: g = topk_ids[m][j], e = expert_map ? expert_map[g] : g;
 *     e = -1: slot j contributes nothing;
 *     x = hidden[m] (on-input weighting: x_k = R(x_k * R(w[m][j])));
 *     h_n = F(sum_k x_k W13[e][n][k] + b13[e][n])        (n < 2I, or I)
 *           (round_gemm_outputs: h_n = R(h_n));
 *     a_i = R(F(act(h_i, h_{I+i})))                     (i < I)
 *           vLLM's kernels round the activation to the activation dtype
 *           before the second GEMM; so does the reference;
 *     y_n = F(sum_i a_i W2[e][n][i] + b2[e][n])          (n < H)
 *           (round_gemm_outputs: y_n = R(y_n));
 *   out[m][n] = R(F(sum_j c_j y_{j,n})), summed in double in order j = 0..,
 *     c_j = w[m][j] (weights on the output) or 1 (on the input).
 * A token whose slots are all absent gets 0. W = wna16_ref_dequant; biases
 * are the qweights' `bias` arrays when not NULL. M = 0 does nothing.
 * Errors (WNA16_EINVAL, message naming the argument): NULL pointers,
 * M < 0, topk < 1, topk > the number of (global) experts, an id out of
 * range (naming the token and position), a bad expert_map entry, act_dtype
 * not F16/BF16, an invalid activation or swiglu parameter, a layer whose
 * shapes, group sizes or g_idx do not fit (w13 E x 2I x H, or E x I x H
 * when not gated; w2 E x H x I). WNA16_ENOMEM when scratch allocation
 * fails. `out` is untouched on error. */
wna16_status_t wna16_ref_moe(const wna16_qlayer_t *layer,
                             const wna16_moe_params_t *p, const void *hidden,
                             int32_t M, const int32_t *topk_ids,
                             const float *topk_weights, int32_t topk,
                             void *out, wna16_error_t *err);

/* The numeric contract of a fused MoE's GEMMs: what a kernel's result
 * equals, within float32 rounding, and what the reference computes for it
 * (docs/specs.md, "numerics"; a backend spec lists its contracts).
 *  - F32 ("f32"): weights dequantized to float32, (code - zero) * scale,
 *    float32 products and sums (the generated kernels' portable path; the
 *    reference sums in double).
 *  - INT8_DYNAMIC ("int8-dynamic"): vLLM's CPU int4 MoE (CPUExpertsInt4),
 *    extended to 8-bit codes: each GEMM input row quantized per token to
 *    u8 (scale max|x| / 127, codes rne(x * 127 / max|x|) + 128), u8 x
 *    (code - zero) products summed exactly in int32 per block of min(group
 *    size, 128) input channels, less 128 times the block's sum of (code -
 *    zero) (the cpu layout's compensation sums; for 8-bit codes the
 *    kernels compute the same integer as (u8 - 128) x code less zero times
 *    the block's sum of (u8 - 128)), each block's sum times the row's and
 *    the group's scales added in float32. 4-bit or 8-bit codes, no
 *    act-order. Its error against F32 is that of 8-bit inputs: per GEMM
 *    output, up to max|x| / 254 times the sum of |w| over K.
 *  - BF16_EXACT ("bf16-exact"): as Marlin computes: bf16((code - zero) *
 *    scale) times the bf16 input (each product exact in float32), summed
 *    in float32. The reference sums in k order (a pair of channels as
 *    vdpbf16ps takes them: k + 1, then k), as the dedicated CPU kernels
 *    for the cpu layout do. The dedicated CPU kernels for K-contiguous
 *    layouts (8-bit codes, one byte a k) sum each block of min(group
 *    size, 128) channels in 16 lanes of pairs, reduce the lanes, then add
 *    the blocks in k order; the portable kernels (every layout, every
 *    target) sum in an order of their own: the same within float32
 *    rounding. bf16 activations (a layer of model dtype bfloat16). */
typedef enum wna16_numerics {
    WNA16_NUMERICS_INVALID = -1,
    WNA16_NUMERICS_F32 = 0,
    WNA16_NUMERICS_INT8_DYNAMIC = 1,
    WNA16_NUMERICS_BF16_EXACT = 2,
    WNA16_NUMERICS_COUNT_
} wna16_numerics_t;

/* "f32", "int8-dynamic", "bf16-exact"; NULL for an invalid value. */
const char *wna16_numerics_name(wna16_numerics_t n);
/* The contract named (exactly); WNA16_NUMERICS_INVALID if none. */
wna16_numerics_t wna16_numerics_from_name(const char *name);

/* wna16_ref_moe under the given numeric contract (F32: wna16_ref_moe).
 * EUNSUPPORTED where the layer falls outside the contract (int8-dynamic:
 * codes other than 4 and 8 bits, act-order, groups not made of whole
 * blocks of min(group size, 128) channels). */
wna16_status_t wna16_ref_moe_numerics(const wna16_qlayer_t *layer,
                                      const wna16_moe_params_t *p,
                                      wna16_numerics_t numerics,
                                      const void *hidden, int32_t M,
                                      const int32_t *topk_ids,
                                      const float *topk_weights, int32_t topk,
                                      void *out, wna16_error_t *err);

/* The reference MoE, batched activation format (as expert-parallel
 * all-to-all dispatch produces; vLLM's BatchedExperts):
 *   hidden             [E][max_tokens][H] act_dtype
 *   expert_num_tokens  [E]: rows [0, count) of expert e are its tokens,
 *                      0 <= count <= max_tokens
 *   weights            [E][max_tokens] float32 router weights, or NULL
 *   out                [E][max_tokens][H] act_dtype; fully written
 * Row r < count of expert e goes through expert e's MLP exactly as in
 * wna16_ref_moe (same rounding points) and out[e][r][n] = R(F(c * y_n)):
 *   weights NULL: c = 1 and the input is not scaled. This is vLLM's
 *     BatchedExperts contract: the router weights are applied outside, in
 *     the finalize step that combines the rows back into tokens (or, on
 *     the input, by the prepare step before dispatch);
 *   weights given: apply_router_weight_on_input scales the input as in
 *     wna16_ref_moe (c = 1), else c = weights[e][r] (a kernel that fuses
 *     the weighting into its second GEMM).
 * Rows [count, max_tokens) of out are set to 0. expert_map and
 * global_num_experts are ignored. Errors as wna16_ref_moe, plus counts out
 * of [0, max_tokens] and max_tokens < 0. */
wna16_status_t wna16_ref_moe_batched(const wna16_qlayer_t *layer,
                                     const wna16_moe_params_t *p,
                                     const void *hidden, int32_t max_tokens,
                                     const int32_t *expert_num_tokens,
                                     const float *weights, void *out,
                                     wna16_error_t *err);
/* wna16_ref_moe_batched under the given numeric contract. */
wna16_status_t wna16_ref_moe_batched_numerics(
    const wna16_qlayer_t *layer, const wna16_moe_params_t *p,
    wna16_numerics_t numerics, const void *hidden, int32_t max_tokens,
    const int32_t *expert_num_tokens, const float *weights, void *out,
    wna16_error_t *err);

/* Tokens sorted and aligned per expert for a block kernel (vLLM's
 * moe_align_block_size). Owns its arrays; free with
 * wna16_moe_alignment_free. */
typedef struct wna16_moe_alignment {
    int32_t block_size;
    int32_t num_experts;
    /* The padding value in sorted_token_ids: M * topk (the number of
     * routed slots), or E * max_tokens in the batched form. */
    int32_t sentinel;
    /* Slots actually used: sum over experts of count rounded up to a
     * multiple of block_size; a multiple of block_size. */
    int32_t num_tokens_post_padded;
    /* Length of sorted_token_ids: vLLM's max_num_tokens_padded, the bound
     * over all routings: M*topk + num_experts*(block_size - 1), or
     * M*topk*block_size when that is smaller (M*topk < num_experts);
     * batched: E * round_up(max_tokens, block_size). */
    int32_t max_num_tokens_padded;
    /* Length of expert_ids: ceil(max_num_tokens_padded / block_size). */
    int32_t max_num_blocks;
    /* [max_num_tokens_padded]: flattened slot indices t = m*topk + j
     * (batched: e*max_tokens + r), grouped by expert in increasing expert
     * order, slot order kept inside an expert, each expert's run padded
     * with `sentinel` to a multiple of block_size; `sentinel` from
     * num_tokens_post_padded on. */
    int32_t *sorted_token_ids;
    /* [max_num_blocks]: the (local) expert of each block of block_size
     * slots; -1 from num_tokens_post_padded / block_size on. */
    int32_t *expert_ids;
} wna16_moe_alignment_t;

/* Sorts the M x topk routed slots by expert and pads each expert's run to
 * block_size. Deterministic (a stable counting sort; vLLM's CUDA kernel
 * orders slots inside an expert by atomics, its torch reference stably).
 * topk_ids are global ids in [0, num_experts); with expert_map (length
 * num_experts, entries -1 or in [0, num_experts)) each slot goes to expert
 * expert_map[g], slots of absent experts (-1) are dropped and expert_ids
 * hold local ids: vLLM's ignore_invalid_experts=True (its torch reference,
 * Marlin). vLLM's other mode (absent experts keep their blocks, marked -1)
 * is this function without the map followed by expert_ids[b] =
 * expert_map[expert_ids[b]] for the used blocks. Experts with no slots get
 * no blocks. `out` is overwritten (free a previous result first); on error
 * it is left zeroed. Errors: WNA16_EINVAL for NULL pointers (topk_ids may be
 * NULL when M is 0), M < 0, topk < 1, topk > num_experts, block_size < 1,
 * sizes past INT32_MAX, an id out of range (naming the token and position)
 * or a bad expert_map entry; WNA16_ENOMEM. */
wna16_status_t wna16_moe_align(const int32_t *topk_ids, int32_t M,
                               int32_t topk, int32_t num_experts,
                               const int32_t *expert_map, int32_t block_size,
                               wna16_moe_alignment_t *out, wna16_error_t *err);

/* The batched form (vLLM's batched_moe_align_block_size): expert e's rows
 * e*max_tokens + r, r < expert_num_tokens[e], in order, each expert padded
 * to block_size; sentinel E * max_tokens. Errors: NULL pointers,
 * num_experts < 1, max_tokens < 0, block_size < 1, a count outside
 * [0, max_tokens], sizes past INT32_MAX. */
wna16_status_t wna16_moe_align_batched(const int32_t *expert_num_tokens,
                                       int32_t num_experts, int32_t max_tokens,
                                       int32_t block_size,
                                       wna16_moe_alignment_t *out,
                                       wna16_error_t *err);

/* Frees the arrays and zeroes the struct; NULL and zeroed structs are
 * fine. */
void wna16_moe_alignment_free(wna16_moe_alignment_t *a);

/* The generated fused MoE: a layer whose weights sit in a backend's
 * stacked layout (what wna16_repack_layer writes), run by kernels that
 * wna16 generates from that backend's spec and compiles for the target
 * (JIT, through the context's kernel cache). The same arguments, the same
 * refusals and the same semantics as wna16_ref_moe and
 * wna16_ref_moe_batched (same rounding points: h, a, y, out), with one
 * difference: the dot products and the top-k sum accumulate in float32 in
 * an order the kernel chooses (vectorized), not in double. Results agree
 * with the reference within the rounding of float32 sums of H (then I)
 * products plus, rarely, one activation-dtype ulp where a value lands on
 * a rounding boundary (tests/moe/test_moe_gen.c states the tolerance).
 *
 * Kernels: an input conversion, gate/up GEMM + activation, down GEMM and
 * the top-k combine, over tokens sorted per expert (wna16_moe_align with
 * a block size the layer picks from the routing). Weights are dequantized
 * on the fly through the layout's maps. `wna16 gen --kind moe` prints
 * them. On the CPU the host routes each call; on the xpu and ocl targets a
 * generated routing kernel does (the same arrays), so a call is five
 * launches with no host read between them. */
typedef struct wna16_moe_layer wna16_moe_layer_t;

/* Binds a layer: `tensors` holds "{prefix}.w13_{name}" and
 * "{prefix}.w2_{name}" for every layout of `backend` the layer uses
 * (qweight, scales, qzeros with zero points, bias with quant->bias), with
 * the shapes the spec gives for E experts, hidden size H and intermediate
 * size I (unpadded; the spec's padding applies). A w13 of one projection
 * (N = I, padded) is a non-gated layer and runs the *_no_mul activations;
 * otherwise [gate; up] and the gated ones. Tensors are checked (present,
 * dtype listed by the layout, shape) but not copied: they must outlive the
 * layer (on the xpu target they are copied to the device once, here).
 * `target`: WNA16_TARGET_CPU (EUNAVAILABLE in builds without LLVM),
 * WNA16_TARGET_XPU (Level Zero; EUNAVAILABLE without a driver and an
 * Intel GPU) or WNA16_TARGET_OCL (EUNAVAILABLE without an OpenCL device
 * and llvm-spirv-15); cuda is EUNAVAILABLE (its fused MoE is
 * wna16_cuda_moe_*). Refuses act-order, per-expert layouts and
 * what the layouts cannot hold, naming the spec. With quant->model_dtype
 * (F16/BF16) the layer is that model's: scales and biases of the layouts
 * held in the model's dtype must be in it (EINVAL naming the tensor), and
 * every run refuses activations (p->act_dtype) of the other dtype (EINVAL),
 * as vLLM's kernels take bf16 activations with bf16 scales; 0 checks
 * neither. wna16_cuda_moe_create does the same. */
wna16_status_t wna16_moe_layer_create(wna16_context_t *ctx,
                                      const wna16_spec_t *backend,
                                      const wna16_tensor_set_t *tensors,
                                      const char *prefix, int32_t E,
                                      int32_t H, int32_t I,
                                      const wna16_quant_desc_t *quant,
                                      wna16_target_t target,
                                      wna16_moe_layer_t **out,
                                      wna16_error_t *err);
/* NULL is fine. */
void wna16_moe_layer_destroy(wna16_moe_layer_t *layer);

/* wna16_ref_moe with generated kernels (arguments and errors as there;
 * an activation whose gating does not match the layer's w13 is EINVAL).
 * Kernels are built and compiled on first use of each configuration
 * (activation and its constants, dtype, top-k, on-input weighting, block
 * size) and kept by the layer. Runs on one layer are serialized: the layer
 * owns the scratch buffers (float32 copies of the input, the activations
 * and the per-slot expert outputs); different layers run concurrently.
 * The work is split over the CPU target's threads. */
wna16_status_t wna16_moe_layer_run(wna16_moe_layer_t *layer,
                                   const wna16_moe_params_t *p,
                                   const void *hidden, int32_t M,
                                   const int32_t *topk_ids,
                                   const float *topk_weights, int32_t topk,
                                   void *out, wna16_error_t *err);

/* The numeric contract the layer's GEMM kernels compute (fixed at
 * creation): on a CPU with AVX512-VNNI, a layout whose block structure the
 * dedicated CPU generator recognizes (vLLM's `cpu` VNNI blocks, or 8-bit
 * codes with each column's K codes contiguous, as triton's) and a spec
 * that lists it, the first listed contract it builds; otherwise the
 * portable kernels' "f32" (the layer's creation logs which, and why,
 * once). $WNA16_NUMERICS (a contract's name) asks for another one where
 * it can run: "bf16-exact" runs on every layout whose spec lists it (all
 * backends) for a layer of model dtype bfloat16, on every target, from
 * the dedicated kernels where they apply and the portable ones (each
 * weight rounded to bf16) elsewhere; "f32" always runs. Compare the
 * layer's outputs with wna16_ref_moe_numerics under this contract. */
wna16_numerics_t wna16_moe_layer_numerics(const wna16_moe_layer_t *layer);

/* wna16_ref_moe_batched with generated kernels. Over a layout whose
 * generated fused MoE stands for the backend's own kernel and that kernel
 * is standard-only (xpu: vLLM's XPUExpertsWNA16), EUNSUPPORTED "kernel
 * does not support batched activation format", as vLLM refuses it. */
wna16_status_t wna16_moe_layer_run_batched(wna16_moe_layer_t *layer,
                                           const wna16_moe_params_t *p,
                                           const void *hidden,
                                           int32_t max_tokens,
                                           const int32_t *expert_num_tokens,
                                           const float *weights, void *out,
                                           wna16_error_t *err);

/* ------------------------------------------------------------------------ */
/* Fused MoE on a CUDA GPU                                                   */
/* ------------------------------------------------------------------------ */

/* The fused MoE of wna16_ref_moe / wna16_ref_moe_batched on an NVIDIA GPU
 * (sm_80 or later), over a layer stored in a Marlin-family backend layout
 * (specs/backends/marlin.json, batched_marlin.json). The kernels are the
 * tensor-core templates of templates/, specialized by the generator from
 * the backend spec (bits, group size, zero points, act-order, dtypes, the
 * activation) and the spec's "tiling" table (tile shape, warps, pipeline
 * depth per problem), compiled by NVRTC through the kernel cache. One run:
 * routing on the GPU (tokens sorted and padded per expert, deterministic),
 * GEMM 1 with the activation fused, GEMM 2, and the top-k weighted sum in
 * a fixed order: no float atomics, so a run's output bits depend only on
 * its inputs and on the tiles and split-K chosen for them, which follow
 * the spec's tiling table and the device's SM count (the same inputs on
 * the same kind of GPU give the same bits; another GPU may sum the K
 * slices in other groups and differ in the last bits).
 *
 * Semantics are the reference's (same arguments, same rounding points).
 * Numerics: float32 accumulation on tensor cores; with grouped scales the
 * weights (q - z) * s are rounded to the activation dtype before the
 * product (as Marlin does), channelwise scales multiply the float32 sums;
 * the activation is computed in float32. tests/cuda/test_moe_cuda.c states
 * the resulting tolerance against the reference.
 *
 * Supported: 4- and 8-bit codes, group sizes the layout holds (-1, 32, 64,
 * 128 for Marlin), 4-bit zero points, act-order, biases, F16/BF16
 * activations and scales, expert maps, both activation formats, the gated
 * activations (silu, gelu, gelu_tanh, swigluoai, swiglustep). Refused with
 * a reason: non-gated activations (no stacked layout describes a w13 of
 * N = I yet), 8-bit activations.
 *
 * A wna16_cuda_moe_t owns its workspace: one run at a time per object
 * (use one object per stream). Destroy it before its context. */
typedef struct wna16_cuda_moe wna16_cuda_moe_t;

/* Puts a layer on the GPU. `tensors` holds the stacked layer in
 * `backend`'s layout under `prefix` ("{prefix}.w13_qweight", ... as
 * wna16_repack_layer and wna16_ref_encode write them), for E experts,
 * hidden size H and (unpadded) intermediate size I quantized as `quant`
 * says. With device_tensors false the data are host memory and are copied
 * to the GPU (the object owns the copies); with device_tensors true each
 * tensor's `data` is a CUDA device address ((void *)(uintptr_t)dptr) that
 * the caller keeps alive and unchanged while the object lives (qweight
 * and scales 16-byte aligned, the rest 4-byte; cudaMalloc'd memory is
 * 256-byte aligned). Checks
 * tensor names, dtypes and shapes against the spec, that the spec's
 * layouts are the ones the kernels read (a differing layout is refused
 * with the first element stored elsewhere), and act-order tensors on the
 * GPU (g_idx in range, sort indices a permutation per expert).
 * EUNAVAILABLE without a GPU or NVRTC. */
wna16_status_t wna16_cuda_moe_create(wna16_context_t *ctx,
                                     const wna16_spec_t *backend,
                                     const wna16_tensor_set_t *tensors,
                                     const char *prefix, int32_t E, int32_t H,
                                     int32_t I,
                                     const wna16_quant_desc_t *quant,
                                     bool device_tensors,
                                     wna16_cuda_moe_t **out,
                                     wna16_error_t *err);
void wna16_cuda_moe_destroy(wna16_cuda_moe_t *moe);

/* wna16_ref_moe on the GPU, host arrays in and out (synchronous). Same
 * arguments, checks and error messages as the reference; `out` is
 * untouched on error. */
wna16_status_t wna16_cuda_moe_run(wna16_cuda_moe_t *moe,
                                  const wna16_moe_params_t *p,
                                  const void *hidden, int32_t M,
                                  const int32_t *topk_ids,
                                  const float *topk_weights, int32_t topk,
                                  void *out, wna16_error_t *err);

/* wna16_ref_moe_batched on the GPU, host arrays (synchronous). */
wna16_status_t wna16_cuda_moe_run_batched(wna16_cuda_moe_t *moe,
                                          const wna16_moe_params_t *p,
                                          const void *hidden,
                                          int32_t max_tokens,
                                          const int32_t *expert_num_tokens,
                                          const float *weights, void *out,
                                          wna16_error_t *err);

/* The same on device arrays (CUDA device addresses), queued on `stream`
 * (a CUstream; NULL: the default stream) without waiting. Shapes and
 * parameters are checked at once; the device data (top-k ids, batched
 * counts) are checked by the kernels, which drop what is out of range and
 * record it: wna16_cuda_moe_sync reports it. p->expert_map is a host
 * array (copied to the GPU when it changes). `hidden` must be 16-byte
 * aligned (cudaMalloc'd memory is). Batched: weights may be 0 (no router
 * weights, as in wna16_ref_moe_batched). */
wna16_status_t wna16_cuda_moe_run_device(wna16_cuda_moe_t *moe,
                                         const wna16_moe_params_t *p,
                                         uint64_t hidden, int32_t M,
                                         uint64_t topk_ids,
                                         uint64_t topk_weights, int32_t topk,
                                         uint64_t out, void *stream,
                                         wna16_error_t *err);
wna16_status_t wna16_cuda_moe_run_batched_device(
    wna16_cuda_moe_t *moe, const wna16_moe_params_t *p, uint64_t hidden,
    int32_t max_tokens, uint64_t expert_num_tokens, uint64_t weights,
    uint64_t out, void *stream, wna16_error_t *err);

/* Waits for `stream` and reports (EINVAL, naming the first offending
 * token slot or expert) bad device data seen by the runs since the last
 * sync; then clears the record. */
wna16_status_t wna16_cuda_moe_sync(wna16_cuda_moe_t *moe, void *stream,
                                   wna16_error_t *err);

/* What the last run used: the two GEMM kernels (readable names that spell
 * out every parameter), the tiling rows that chose them, the routing block
 * and the NVRTC compile time each kernel cost in that run (0: it came
 * from the kernel cache; units compiled in one run compile in parallel
 * threads, so the run waited for the largest, not the sum). */
typedef struct wna16_cuda_moe_report {
    int32_t block_m;
    char kernel[2][160];      /* [0] w13 + activation, [1] w2 */
    char tile_rule[2][64];    /* "$.tiling.gemm[1]" */
    double compile_ms[3];     /* w13, w2, the routing/finalize units */
    int32_t split_k[2];       /* K slices of w13, w2 (1: no split-K) */
} wna16_cuda_moe_report_t;

void wna16_cuda_moe_last_report(const wna16_cuda_moe_t *moe,
                                wna16_cuda_moe_report_t *out);

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */
/* ------------------------------------------------------------------------ */

/* The best device present: a CUDA GPU (through the driver, loaded with
 * dlopen), an Intel GPU (through the Level Zero loader), else the CPU.
 * `notes` says why each accelerator was not used ("CUDA: libcuda.so.1:
 * cannot open shared object file"). Never fails: the CPU is always there. */
typedef struct wna16_device_info {
    wna16_platform_t platform;
    int32_t cc_major, cc_minor; /* CUDA only */
    char name[128];
    char notes[512];
} wna16_device_info_t;

void wna16_probe_device(wna16_device_info_t *out);

#ifdef __cplusplus
}
#endif

#endif /* WNA16_H */
