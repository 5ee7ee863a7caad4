/*
 * base.c - allocation, errors, the text buffer and the arena (see base.h).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* ---- allocation ---------------------------------------------------------- */

void *w16_alloc(wna16_context_t *ctx, size_t size)
{
    if (size == 0)
        size = 1;
    if (ctx && ctx->custom_allocator)
        return ctx->allocator.alloc(ctx->allocator.user, size);
    return malloc(size);
}

void *w16_calloc(wna16_context_t *ctx, size_t n, size_t size)
{
    size_t total;
    if (!w16_mul_size(n, size, &total))
        return NULL;
    void *p = w16_alloc(ctx, total);
    if (p)
        memset(p, 0, total ? total : 1);
    return p;
}

void *w16_realloc(wna16_context_t *ctx, void *p, size_t old_size,
                  size_t new_size)
{
    if (new_size == 0)
        new_size = 1;
    if (ctx && ctx->custom_allocator)
        return ctx->allocator.realloc(ctx->allocator.user, p, old_size,
                                      new_size);
    return realloc(p, new_size);
}

void w16_free(wna16_context_t *ctx, void *p, size_t size)
{
    if (!p)
        return;
    if (ctx && ctx->custom_allocator)
        ctx->allocator.free(ctx->allocator.user, p, size ? size : 1);
    else
        free(p);
}

/* Bulk buffers come from mmap only with the default allocator, so the
 * size alone tells w16_free_bulk how a buffer was made. */
static bool bulk_mapped(const wna16_context_t *ctx, size_t size)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    return !(ctx && ctx->custom_allocator) && size >= W16_BULK_MIN;
#else
    (void)ctx;
    (void)size;
    return false;
#endif
}

void *w16_alloc_bulk(wna16_context_t *ctx, size_t size, bool zero)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bulk_mapped(ctx, size)) {
        /* anonymous mappings are zero-filled, so `zero` costs nothing;
         * the advice is a hint and its failure changes nothing */
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        (void)madvise(p, size, MADV_HUGEPAGE);
        return p;
    }
#endif
    return zero ? w16_calloc(ctx, 1, size) : w16_alloc(ctx, size);
}

void w16_free_bulk(wna16_context_t *ctx, void *p, size_t size)
{
    if (!p)
        return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bulk_mapped(ctx, size)) {
        munmap(p, size);
        return;
    }
#endif
    w16_free(ctx, p, size);
}

char *w16_strdup(wna16_context_t *ctx, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = w16_alloc(ctx, n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void w16_strfree(wna16_context_t *ctx, char *s)
{
    if (s)
        w16_free(ctx, s, strlen(s) + 1);
}

bool w16_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return false;
    *out = a * b;
    return true;
}

bool w16_add_size(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return false;
    *out = a + b;
    return true;
}

/* ---- errors -------------------------------------------------------------- */

static void mark_truncated(char *msg, size_t cap)
{
    /* vsnprintf truncated: end with "..." so readers know. */
    if (cap >= 4)
        memcpy(msg + cap - 4, "...", 4);
}

wna16_status_t w16_verr(wna16_error_t *err, wna16_status_t status,
                        const char *fmt, va_list ap)
{
    if (!err)
        return status;
    err->status = status;
    int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
    if (n < 0)
        err->message[0] = '\0';
    else if ((size_t)n >= sizeof err->message)
        mark_truncated(err->message, sizeof err->message);
    return status;
}

wna16_status_t w16_err(wna16_error_t *err, wna16_status_t status,
                       const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    w16_verr(err, status, fmt, ap);
    va_end(ap);
    return status;
}

void w16_err_prefix(wna16_error_t *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[WNA16_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    char old[WNA16_ERROR_MESSAGE_MAX];
    memcpy(old, err->message, sizeof old);
    n = snprintf(err->message, sizeof err->message, "%s: %s", prefix, old);
    if (n >= 0 && (size_t)n >= sizeof err->message)
        mark_truncated(err->message, sizeof err->message);
}

wna16_status_t w16_err_nomem(wna16_error_t *err, const char *what)
{
    return w16_err(err, WNA16_ENOMEM, "out of memory while %s", what);
}

void wna16_error_clear(wna16_error_t *err)
{
    if (err) {
        err->status = WNA16_OK;
        err->message[0] = '\0';
    }
}

/* ---- text buffer --------------------------------------------------------- */

void w16_buf_init(w16_buf_t *b, wna16_context_t *ctx)
{
    memset(b, 0, sizeof *b);
    b->ctx = ctx;
}

void w16_buf_free(w16_buf_t *b)
{
    w16_free(b->ctx, b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

void w16_buf_reset(w16_buf_t *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data)
        b->data[0] = '\0';
}

static bool buf_ensure(w16_buf_t *b, size_t extra)
{
    if (b->failed)
        return false;
    size_t need;
    if (!w16_add_size(b->len, extra + 1, &need)) {
        b->failed = true;
        return false;
    }
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            b->failed = true;
            return false;
        }
        cap *= 2;
    }
    char *d = w16_realloc(b->ctx, b->data, b->cap, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void w16_buf_append(w16_buf_t *b, const char *s, size_t n)
{
    if (!buf_ensure(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void w16_buf_puts(w16_buf_t *b, const char *s) { w16_buf_append(b, s, strlen(s)); }

void w16_buf_putc(w16_buf_t *b, char c) { w16_buf_append(b, &c, 1); }

void w16_buf_vprintf(w16_buf_t *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if (!buf_ensure(b, (size_t)n))
        return;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void w16_buf_printf(w16_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    w16_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void w16_buf_json_string(w16_buf_t *b, const char *s)
{
    w16_buf_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': w16_buf_puts(b, "\\\""); break;
        case '\\': w16_buf_puts(b, "\\\\"); break;
        case '\n': w16_buf_puts(b, "\\n"); break;
        case '\r': w16_buf_puts(b, "\\r"); break;
        case '\t': w16_buf_puts(b, "\\t"); break;
        default:
            if (*p < 0x20)
                w16_buf_printf(b, "\\u%04x", *p);
            else
                w16_buf_putc(b, (char)*p);
        }
    }
    w16_buf_putc(b, '"');
}

char *w16_buf_take(w16_buf_t *b, size_t *cap_out)
{
    if (b->failed || !buf_ensure(b, 0)) {
        w16_buf_free(b);
        return NULL;
    }
    char *d = b->data;
    if (cap_out)
        *cap_out = b->cap;
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

/* ---- arena --------------------------------------------------------------- */

struct w16_arena_block {
    w16_arena_block_t *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void w16_arena_init(w16_arena_t *a, wna16_context_t *ctx)
{
    a->ctx = ctx;
    a->head = NULL;
    a->block_size = 16384;
}

void *w16_arena_alloc(w16_arena_t *a, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (size == 0)
        size = 16;
    w16_arena_block_t *h = a->head;
    if (!h || h->size - h->used < size) {
        size_t bs = a->block_size > size ? a->block_size : size;
        size_t total;
        if (!w16_add_size(sizeof(w16_arena_block_t), bs, &total))
            return NULL;
        h = w16_alloc(a->ctx, total);
        if (!h)
            return NULL;
        h->size = bs;
        h->used = 0;
        h->next = a->head;
        a->head = h;
        if (a->block_size < (1u << 20))
            a->block_size *= 2;
    }
    void *p = h->data + h->used;
    h->used += size;
    memset(p, 0, size);
    return p;
}

char *w16_arena_strndup(w16_arena_t *a, const char *s, size_t n)
{
    char *d = w16_arena_alloc(a, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

char *w16_arena_strdup(w16_arena_t *a, const char *s)
{
    return w16_arena_strndup(a, s, strlen(s));
}

void w16_arena_free(w16_arena_t *a)
{
    w16_arena_block_t *b = a->head;
    while (b) {
        w16_arena_block_t *n = b->next;
        w16_free(a->ctx, b, sizeof *b + b->size);
        b = n;
    }
    a->head = NULL;
}
