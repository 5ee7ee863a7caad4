/*
 * base.h - internal plumbing shared by every module: the context layout,
 * allocation through the context's allocator, error filling, a growable
 * bounds-checked text buffer and a bump arena for per-compilation data.
 * Internal names use the w16_ prefix; only include/wna16.h is public.
 */
#ifndef W16_BASE_H
#define W16_BASE_H

#include "wna16.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define W16_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define W16_PRINTF(a, b)
#endif

#define W16_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- allocation ---------------------------------------------------------- */

void *w16_alloc(wna16_context_t *ctx, size_t size);
void *w16_calloc(wna16_context_t *ctx, size_t n, size_t size);
void *w16_realloc(wna16_context_t *ctx, void *p, size_t old_size,
                  size_t new_size);
void w16_free(wna16_context_t *ctx, void *p, size_t size);
/* Tensor-sized buffers (never reallocated). With the default allocator,
 * buffers of W16_BULK_MIN bytes or more are mapped with transparent huge
 * pages where the kernel offers them: a repacked layer is hundreds of MB
 * written once, and faulting it in 4 KiB pages cost several times the
 * copy itself (314 MB faulted and filled in 156 ms in 4 KiB pages, 54 ms
 * in huge pages, 27 ms copied into warm memory). `zero` asks for zeroed
 * bytes. Free with w16_free_bulk and the same size. */
#define W16_BULK_MIN ((size_t)4 << 20)
void *w16_alloc_bulk(wna16_context_t *ctx, size_t size, bool zero);
void w16_free_bulk(wna16_context_t *ctx, void *p, size_t size);
char *w16_strdup(wna16_context_t *ctx, const char *s);
/* Frees a string from w16_strdup. */
void w16_strfree(wna16_context_t *ctx, char *s);

/* Overflow-checked size arithmetic: return false on overflow. */
bool w16_mul_size(size_t a, size_t b, size_t *out);
bool w16_add_size(size_t a, size_t b, size_t *out);

/* ---- errors -------------------------------------------------------------- */

/* Fills err (if not NULL) and returns status. Never allocates. */
wna16_status_t w16_err(wna16_error_t *err, wna16_status_t status,
                       const char *fmt, ...) W16_PRINTF(3, 4);
wna16_status_t w16_verr(wna16_error_t *err, wna16_status_t status,
                        const char *fmt, va_list ap);
/* Prepends "prefix: " to an existing message (keeps the status). */
void w16_err_prefix(wna16_error_t *err, const char *fmt, ...)
    W16_PRINTF(2, 3);
/* Out of memory while doing `what`. */
wna16_status_t w16_err_nomem(wna16_error_t *err, const char *what);

/* ---- growable text buffer (cJSON's `ensure` idea) ------------------------ */

typedef struct w16_buf {
    wna16_context_t *ctx;
    char *data; /* always NUL-terminated when cap > 0 */
    size_t len, cap;
    bool failed; /* sticky: an allocation failed; contents are truncated */
} w16_buf_t;

void w16_buf_init(w16_buf_t *b, wna16_context_t *ctx);
void w16_buf_free(w16_buf_t *b);
void w16_buf_reset(w16_buf_t *b);
void w16_buf_append(w16_buf_t *b, const char *s, size_t n);
void w16_buf_puts(w16_buf_t *b, const char *s);
void w16_buf_putc(w16_buf_t *b, char c);
void w16_buf_printf(w16_buf_t *b, const char *fmt, ...) W16_PRINTF(2, 3);
void w16_buf_vprintf(w16_buf_t *b, const char *fmt, va_list ap);
/* JSON string literal with escapes. */
void w16_buf_json_string(w16_buf_t *b, const char *s);
/* Gives up ownership of the text (allocated with the ctx allocator, size
 * cap); the buffer is reset. Returns NULL if the buffer failed. */
char *w16_buf_take(w16_buf_t *b, size_t *cap_out);

/* ---- arena --------------------------------------------------------------- */

typedef struct w16_arena_block w16_arena_block_t;
typedef struct w16_arena {
    wna16_context_t *ctx;
    w16_arena_block_t *head;
    size_t block_size;
} w16_arena_t;

void w16_arena_init(w16_arena_t *a, wna16_context_t *ctx);
/* Zero-filled, 16-byte aligned; NULL when out of memory. */
void *w16_arena_alloc(w16_arena_t *a, size_t size);
char *w16_arena_strdup(w16_arena_t *a, const char *s);
char *w16_arena_strndup(w16_arena_t *a, const char *s, size_t n);
void w16_arena_free(w16_arena_t *a);

/* ---- tensor sets ---------------------------------------------------------- */

/* wna16_tensor_set_add_new without the zero fill: for producers that write
 * every byte (the generated repack kernels), so the pages are first
 * touched by the threads that fill them. */
wna16_status_t w16_tensor_set_add_uninit(wna16_tensor_set_t *set,
                                         const char *name, wna16_dtype_t dtype,
                                         int ndim, const int64_t *shape,
                                         wna16_tensor_t **out,
                                         wna16_error_t *err);

/* ---- names (names.c) -------------------------------------------------------- */

/* "cuda" -> WNA16_PLATFORM_CUDA; -1 if unknown. */
int w16_platform_from_name(const char *s);
/* Is this an activation function name wna16 knows? */
bool w16_activation_known(const char *s);

/* ---- context internals --------------------------------------------------- */

typedef struct w16_spec_registry w16_spec_registry_t;
struct w16_cache;

struct wna16_context {
    int32_t cpu_threads; /* the CPU target's pool; 0: online CPUs */
    wna16_allocator_t allocator;
    bool custom_allocator;
    wna16_log_fn log;
    void *log_user;
    wna16_log_level_t log_level;
    w16_spec_registry_t *specs;
    struct w16_once_key *once; /* keys already logged by w16_log_once */
    struct w16_cache *cache;   /* the kernel cache, created on first use */
    struct w16_cache *plans;   /* repack plans by request (memory only) */
    /* The kernel packs searched before the cache and JIT, created on
     * first use (runtime/cache/pack_set.c); freed with the context. */
    struct w16_pack_set *packs;
    /* Compiling kernels is refused (WNA16_JIT=0 or the option no_jit):
     * only packs and the disk cache provide them. */
    bool no_jit;
    /* Each target's instance, by wna16_target_t, made on first use by its
     * descriptor's probe and freed by its release (runtime/target/). The
     * layers below runtime/ see only these opaque pointers. */
    void *targets[WNA16_TARGET_COUNT_];
};

/* ---- logging (log.c) ------------------------------------------------------ */

/* Logs a message once per context and key (used for fallbacks). */
void w16_log_once(wna16_context_t *ctx, wna16_log_level_t level,
                  const char *key, const char *fmt, ...) W16_PRINTF(4, 5);
/* The sink a context gets when its options name none: "wna16: LEVEL: msg"
 * on stderr. */
void w16_log_default(void *user, wna16_log_level_t level, const char *msg);
/* $WNA16_LOG_LEVEL: debug, info, warn or error; anything else is warn. */
wna16_log_level_t w16_log_env_level(void);
/* Frees the keys w16_log_once remembered (context teardown). */
void w16_log_once_free(wna16_context_t *ctx);

#endif /* W16_BASE_H */
