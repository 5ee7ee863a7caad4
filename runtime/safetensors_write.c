/*
 * safetensors_write.c - the streaming safetensors writer and
 * wna16_safetensors_write_set. Repacking a real checkpoint produces
 * gigabytes, so tensors are declared first (which fixes the header and
 * every data offset) and their bytes are then streamed in declaration order
 * without ever holding the whole file, front to back: nothing is ever
 * sought, so a pipe serves as well as a file. runtime/output.c decides
 * what the path gets: a regular file (or a symbolic link's target) is
 * written to "<path>.tmp.<pid>.<n>" beside it and renamed over it only
 * after an fsync, so a crash, an error or an abort never leaves a partial
 * file there; "-", a FIFO or a character device is streamed to. Any error
 * poisons the writer: the temporary file is removed at once and only
 * finish() (which reports the failure) or abort() remain meaningful. The
 * header is emitted by hand through w16_buf_t in declaration order, compact
 * like the reference implementation's, "__metadata__" first, padded with
 * spaces to a multiple of 8 bytes so tensor data stays 8-byte aligned.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/base.h"
#include "runtime/output.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Offsets must survive readers that parse JSON numbers as doubles. */
#define SW_MAX_JSON_INT ((uint64_t)9007199254740991) /* 2^53 - 1 */
/* Small writes are coalesced into one write(2) per this many bytes. */
#define SW_BUFFER_SIZE ((size_t)256 * 1024)

typedef struct sw_decl {
    const char *name; /* in the arena */
    wna16_dtype_t dtype;
    int ndim;
    int64_t shape[WNA16_MAX_DIMS];
    uint64_t begin, nbytes;
} sw_decl_t;

typedef struct sw_meta {
    const char *key, *value; /* in the arena */
} sw_meta_t;

struct wna16_safetensors_writer {
    wna16_context_t *ctx;
    w16_arena_t arena;     /* paths, names, metadata strings */
    const char *path;
    w16_output_t out;      /* the file, temporary or stream written */
    sw_decl_t *decls;
    size_t ndecl, decl_cap;
    size_t *slots;         /* open-addressing set of decl index + 1 */
    size_t slot_cap;
    sw_meta_t *meta;
    size_t nmeta, meta_cap;
    uint64_t data_size;    /* sum of declared sizes */
    bool started;          /* header written: the declarations are frozen */
    size_t cur;            /* first incomplete tensor */
    uint64_t cur_written;  /* bytes of it written so far */
    unsigned char *buf;    /* SW_BUFFER_SIZE bytes, allocated on start */
    size_t buf_len;
    wna16_status_t failed; /* sticky first error (WNA16_OK while healthy) */
};

/* ---- failure and cleanup ------------------------------------------------- */

/* Closes the output and removes its temporary file (idempotent). */
static void drop_tmp(wna16_safetensors_writer_t *w)
{
    w16_output_discard(&w->out);
}

/* Records an error that has already been written to err and poisons w. */
static wna16_status_t fail(wna16_safetensors_writer_t *w, wna16_status_t s)
{
    if (w->failed == WNA16_OK)
        w->failed = s;
    drop_tmp(w);
    return s;
}

static void writer_free(wna16_safetensors_writer_t *w)
{
    wna16_context_t *ctx = w->ctx;
    drop_tmp(w);
    w16_free(ctx, w->buf, SW_BUFFER_SIZE);
    w16_free(ctx, w->decls, w->decl_cap * sizeof *w->decls);
    w16_free(ctx, w->slots, w->slot_cap * sizeof *w->slots);
    w16_free(ctx, w->meta, w->meta_cap * sizeof *w->meta);
    w16_arena_free(&w->arena);
    w16_free(ctx, w, sizeof *w);
}

/* Guards every call after create: a poisoned writer refuses work. */
static wna16_status_t check_usable(wna16_safetensors_writer_t *w,
                                   const char *fn, wna16_error_t *err)
{
    if (!w)
        return w16_err(err, WNA16_EINVAL, "%s: writer is NULL", fn);
    if (w->failed != WNA16_OK)
        return w16_err(err, w->failed,
                       "%s: %s: an earlier call failed; nothing was written",
                       w->path, fn);
    return WNA16_OK;
}

/* ---- names --------------------------------------------------------------- */

/* Names must be valid UTF-8: the reader (like every safetensors reader)
 * refuses a header that is not. Control characters are fine; they are
 * escaped in the JSON. */
static bool utf8_valid(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s, n, min, cp;
        if (c < 0x80) {
            s++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, min = 0x80, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, min = 0x800, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, min = 0x10000, cp = c & 0x07;
        else
            return false;
        for (unsigned k = 1; k <= n; k++) {
            if ((s[k] & 0xC0) != 0x80) /* also stops at the NUL */
                return false;
            cp = (cp << 6) | (s[k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        s += n + 1;
    }
    return true;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Slot holding `name`, or the empty slot where it would go. */
static size_t slot_of(const wna16_safetensors_writer_t *w, const char *name)
{
    size_t mask = w->slot_cap - 1, i = (size_t)hash_name(name) & mask;
    while (w->slots[i] && strcmp(w->decls[w->slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

static bool name_declared(const wna16_safetensors_writer_t *w,
                          const char *name)
{
    return w->slot_cap && w->slots[slot_of(w, name)];
}

/* Keeps the set at most half full so probes stay short. */
static bool slots_grow(wna16_safetensors_writer_t *w)
{
    if (w->slot_cap && (w->ndecl + 1) * 2 <= w->slot_cap)
        return true;
    size_t cap = w->slot_cap ? w->slot_cap * 2 : 64;
    size_t *slots = w16_calloc(w->ctx, cap, sizeof *slots);
    if (!slots)
        return false;
    size_t *old = w->slots, old_cap = w->slot_cap;
    w->slots = slots;
    w->slot_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            w->slots[slot_of(w, w->decls[old[i] - 1].name)] = old[i];
    w16_free(w->ctx, old, old_cap * sizeof *old);
    return true;
}

/* Grows an array of `elem`-sized items to hold one more. */
static bool grow(wna16_context_t *ctx, void **items, size_t *cap, size_t n,
                 size_t elem)
{
    if (n < *cap)
        return true;
    size_t new_cap = *cap ? *cap * 2 : 16, bytes;
    if (!w16_mul_size(new_cap, elem, &bytes))
        return false;
    void *p = w16_realloc(ctx, *items, *cap * elem, bytes);
    if (!p)
        return false;
    *items = p;
    *cap = new_cap;
    return true;
}

/* ---- create -------------------------------------------------------------- */

wna16_status_t wna16_safetensors_writer_create(wna16_context_t *ctx,
                                               const char *path,
                                               wna16_safetensors_writer_t **out,
                                               wna16_error_t *err)
{
    if (!out || !path || !*path)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_safetensors_writer_create: path and out are "
                       "required");
    *out = NULL;
    wna16_safetensors_writer_t *w = w16_calloc(ctx, 1, sizeof *w);
    if (!w)
        return w16_err_nomem(err, "creating a safetensors writer");
    w->ctx = ctx;
    w->out = (w16_output_t){.fd = -1, .slot = -1};
    w16_arena_init(&w->arena, ctx);
    w->path = w16_arena_strdup(&w->arena, path);
    wna16_status_t s = w->path ? w16_output_open(ctx, &w->arena, path,
                                                 &w->out, err)
                               : w16_err_nomem(err, "creating a writer");
    if (s != WNA16_OK) {
        writer_free(w);
        return s;
    }
    *out = w;
    return WNA16_OK;
}

/* ---- declarations -------------------------------------------------------- */

static wna16_status_t check_declarable(wna16_safetensors_writer_t *w,
                                       const char *fn, wna16_error_t *err)
{
    wna16_status_t s = check_usable(w, fn, err);
    if (s != WNA16_OK)
        return s;
    if (w->started)
        return fail(w, w16_err(err, WNA16_EINVAL,
                               "%s: %s after tensor data was written",
                               w->path, fn));
    return WNA16_OK;
}

wna16_status_t wna16_safetensors_writer_metadata(
    wna16_safetensors_writer_t *w, const char *key, const char *value,
    wna16_error_t *err)
{
    const char *fn = "wna16_safetensors_writer_metadata";
    wna16_status_t s = check_declarable(w, fn, err);
    if (s != WNA16_OK)
        return s;
    if (!key || !value)
        return fail(w, w16_err(err, WNA16_EINVAL, "%s: %s: key and value "
                               "are required", w->path, fn));
    if (!utf8_valid(key) || !utf8_valid(value))
        return fail(w, w16_err(err, WNA16_EINVAL, "%s: metadata '%s' is not "
                               "valid UTF-8", w->path, key));
    for (size_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[i].key, key) == 0)
            return fail(w, w16_err(err, WNA16_EINVAL,
                                   "%s: duplicate metadata key '%s'",
                                   w->path, key));
    if (!grow(w->ctx, (void **)&w->meta, &w->meta_cap, w->nmeta,
              sizeof *w->meta))
        return fail(w, w16_err_nomem(err, "adding safetensors metadata"));
    sw_meta_t *m = &w->meta[w->nmeta];
    m->key = w16_arena_strdup(&w->arena, key);
    m->value = w16_arena_strdup(&w->arena, value);
    if (!m->key || !m->value)
        return fail(w, w16_err_nomem(err, "adding safetensors metadata"));
    w->nmeta++;
    return WNA16_OK;
}

/* Checks dtype and shape and computes the byte size; same limits as the
 * reader so everything written can be read back. */
static wna16_status_t check_tensor(const wna16_safetensors_writer_t *w,
                                   sw_decl_t *d, const int64_t *shape,
                                   wna16_error_t *err)
{
    if (!wna16_dtype_bits(d->dtype))
        return w16_err(err, WNA16_EINVAL, "%s: tensor '%s': invalid dtype %d",
                       w->path, d->name, (int)d->dtype);
    if (d->ndim < 0 || d->ndim > WNA16_MAX_DIMS || (d->ndim && !shape))
        return w16_err(err, WNA16_EINVAL, "%s: tensor '%s': %d dimensions "
                       "(0 to %d, with a shape)", w->path, d->name, d->ndim,
                       WNA16_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < d->ndim; i++) {
        int64_t v = shape[i];
        if (v < 0 || (uint64_t)v > SW_MAX_JSON_INT)
            return w16_err(err, WNA16_EINVAL, "%s: tensor '%s': dimension "
                           "%d is %lld", w->path, d->name, i, (long long)v);
        if (v && numel > (uint64_t)INT64_MAX / (uint64_t)v)
            return w16_err(err, WNA16_ELIMIT, "%s: tensor '%s': element "
                           "count overflows", w->path, d->name);
        numel *= (uint64_t)v;
        d->shape[i] = v;
    }
    size_t bytes;
    if (!wna16_dtype_nbytes(d->dtype, numel, &bytes))
        return w16_err(err, wna16_dtype_size(d->dtype) ? WNA16_ELIMIT
                                                        : WNA16_EINVAL,
                       "%s: tensor '%s': %llu elements of %s are not a whole "
                       "number of bytes below 2^64", w->path, d->name,
                       (unsigned long long)numel, wna16_dtype_name(d->dtype));
    if (bytes > SW_MAX_JSON_INT || bytes > SW_MAX_JSON_INT - w->data_size)
        return w16_err(err, WNA16_ELIMIT, "%s: tensor '%s': the file would "
                       "exceed 2^53 bytes", w->path, d->name);
    d->nbytes = bytes;
    return WNA16_OK;
}

static wna16_status_t check_name(wna16_safetensors_writer_t *w,
                                 const char *name, wna16_error_t *err)
{
    if (!name || !*name)
        return w16_err(err, WNA16_EINVAL, "%s: tensor without a name",
                       w->path);
    if (strcmp(name, "__metadata__") == 0)
        return w16_err(err, WNA16_EINVAL, "%s: '__metadata__' is reserved "
                       "and cannot name a tensor", w->path);
    if (!utf8_valid(name))
        return w16_err(err, WNA16_EINVAL, "%s: tensor name '%s' is not "
                       "valid UTF-8", w->path, name);
    if (name_declared(w, name))
        return w16_err(err, WNA16_EINVAL, "%s: duplicate tensor '%s'",
                       w->path, name);
    return WNA16_OK;
}

wna16_status_t wna16_safetensors_writer_declare(wna16_safetensors_writer_t *w,
                                                const char *name,
                                                wna16_dtype_t dtype, int ndim,
                                                const int64_t *shape,
                                                wna16_error_t *err)
{
    wna16_status_t s =
        check_declarable(w, "wna16_safetensors_writer_declare", err);
    if (s != WNA16_OK)
        return s;
    if ((s = check_name(w, name, err)) != WNA16_OK)
        return fail(w, s);
    sw_decl_t d = {.name = name, .dtype = dtype, .ndim = ndim};
    if ((s = check_tensor(w, &d, shape, err)) != WNA16_OK)
        return fail(w, s);
    if (!grow(w->ctx, (void **)&w->decls, &w->decl_cap, w->ndecl,
              sizeof *w->decls) || !slots_grow(w) ||
        !(d.name = w16_arena_strdup(&w->arena, name)))
        return fail(w, w16_err_nomem(err, "declaring a tensor"));
    d.begin = w->data_size;
    w->data_size += d.nbytes;
    w->decls[w->ndecl] = d;
    w->slots[slot_of(w, d.name)] = ++w->ndecl;
    return WNA16_OK;
}

/* ---- data ---------------------------------------------------------------- */

static wna16_status_t write_fd(wna16_safetensors_writer_t *w, const void *p,
                               size_t n, wna16_error_t *err)
{
    const unsigned char *c = p;
    while (n) {
        ssize_t k = write(w->out.fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return fail(w, w16_err(err, WNA16_EIO, "%s: write failed: %s",
                                   w16_output_name(&w->out),
                                   k < 0 ? strerror(errno) : "no progress"));
        c += k;
        n -= (size_t)k;
    }
    return WNA16_OK;
}

static wna16_status_t flush(wna16_safetensors_writer_t *w, wna16_error_t *err)
{
    wna16_status_t s = write_fd(w, w->buf, w->buf_len, err);
    w->buf_len = 0;
    return s;
}

/* Buffered output: small pieces are gathered, large ones go straight out. */
static wna16_status_t emit(wna16_safetensors_writer_t *w, const void *p,
                           size_t n, wna16_error_t *err)
{
    if (n <= SW_BUFFER_SIZE - w->buf_len) {
        if (n)
            memcpy(w->buf + w->buf_len, p, n);
        w->buf_len += n;
        return WNA16_OK;
    }
    wna16_status_t s = flush(w, err);
    if (s != WNA16_OK)
        return s;
    if (n >= SW_BUFFER_SIZE)
        return write_fd(w, p, n, err);
    memcpy(w->buf, p, n);
    w->buf_len = n;
    return WNA16_OK;
}

static void json_int_array(w16_buf_t *b, const uint64_t *v, int n)
{
    w16_buf_putc(b, '[');
    for (int i = 0; i < n; i++)
        w16_buf_printf(b, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
    w16_buf_putc(b, ']');
}

/* {"__metadata__":{...},"name":{"dtype":..,"shape":[..],
 * "data_offsets":[b,e]},...} then spaces up to a multiple of 8. */
static void build_header(const wna16_safetensors_writer_t *w, w16_buf_t *b)
{
    w16_buf_putc(b, '{');
    if (w->nmeta) {
        w16_buf_puts(b, "\"__metadata__\":{");
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i)
                w16_buf_putc(b, ',');
            w16_buf_json_string(b, w->meta[i].key);
            w16_buf_putc(b, ':');
            w16_buf_json_string(b, w->meta[i].value);
        }
        w16_buf_putc(b, '}');
    }
    for (size_t i = 0; i < w->ndecl; i++) {
        const sw_decl_t *d = &w->decls[i];
        uint64_t dims[WNA16_MAX_DIMS];
        for (int k = 0; k < d->ndim; k++)
            dims[k] = (uint64_t)d->shape[k];
        uint64_t offs[2] = {d->begin, d->begin + d->nbytes};
        if (i || w->nmeta)
            w16_buf_putc(b, ',');
        w16_buf_json_string(b, d->name);
        w16_buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":",
                       wna16_dtype_name(d->dtype));
        json_int_array(b, dims, d->ndim);
        w16_buf_puts(b, ",\"data_offsets\":");
        json_int_array(b, offs, 2);
        w16_buf_putc(b, '}');
    }
    w16_buf_putc(b, '}');
    while (b->len % 8 && !b->failed)
        w16_buf_putc(b, ' ');
}

/* Freezes the declarations and writes the length and the header. */
static wna16_status_t start(wna16_safetensors_writer_t *w, wna16_error_t *err)
{
    w->buf = w16_alloc(w->ctx, SW_BUFFER_SIZE);
    if (!w->buf)
        return fail(w, w16_err_nomem(err, "buffering a safetensors file"));
    w16_buf_t b;
    w16_buf_init(&b, w->ctx);
    build_header(w, &b);
    wna16_status_t s = WNA16_OK;
    if (b.failed)
        s = fail(w, w16_err_nomem(err, "building a safetensors header"));
    else if (b.len > WNA16_SAFETENSORS_MAX_HEADER)
        s = fail(w, w16_err(err, WNA16_ELIMIT, "%s: header of %zu bytes "
                            "exceeds the limit of %u", w->path, b.len,
                            WNA16_SAFETENSORS_MAX_HEADER));
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    if (s == WNA16_OK)
        s = emit(w, len8, 8, err);
    if (s == WNA16_OK)
        s = emit(w, b.data, b.len, err);
    w16_buf_free(&b);
    w->started = true;
    return s;
}

/* Moves past complete tensors (zero-size ones are complete at once). */
static void advance(wna16_safetensors_writer_t *w)
{
    while (w->cur < w->ndecl && w->cur_written == w->decls[w->cur].nbytes) {
        w->cur++;
        w->cur_written = 0;
    }
}

wna16_status_t wna16_safetensors_writer_write(wna16_safetensors_writer_t *w,
                                              const void *data, size_t size,
                                              wna16_error_t *err)
{
    wna16_status_t s = check_usable(w, "wna16_safetensors_writer_write", err);
    if (s != WNA16_OK)
        return s;
    if (!data && size)
        return fail(w, w16_err(err, WNA16_EINVAL, "%s: write of %zu bytes "
                               "from NULL", w->path, size));
    if (!w->started && (s = start(w, err)) != WNA16_OK)
        return s;
    advance(w);
    if (size == 0)
        return WNA16_OK;
    if (w->cur == w->ndecl)
        return fail(w, w16_err(err, WNA16_EINVAL, "%s: write of %zu bytes "
                               "after every tensor is complete", w->path,
                               size));
    const sw_decl_t *d = &w->decls[w->cur];
    uint64_t left = d->nbytes - w->cur_written;
    if ((uint64_t)size > left)
        return fail(w, w16_err(err, WNA16_EINVAL, "%s: tensor '%s': write "
                               "of %zu bytes but only %llu of its %llu bytes "
                               "are left", w->path, d->name, size,
                               (unsigned long long)left,
                               (unsigned long long)d->nbytes));
    if ((s = emit(w, data, size, err)) != WNA16_OK)
        return s;
    w->cur_written += size;
    advance(w);
    return WNA16_OK;
}

/* ---- finish / abort ------------------------------------------------------ */

/* Everything but the commit: header, data, the last flush. */
static wna16_status_t complete_data(wna16_safetensors_writer_t *w,
                                    wna16_error_t *err)
{
    wna16_status_t s = WNA16_OK;
    if (!w->started)
        s = start(w, err);
    if (s != WNA16_OK)
        return s;
    advance(w);
    if (w->cur < w->ndecl) {
        const sw_decl_t *d = &w->decls[w->cur];
        return fail(w, w16_err(err, WNA16_EINVAL, "%s: tensor '%s' is "
                               "incomplete: %llu of %llu bytes written",
                               w->path, d->name,
                               (unsigned long long)w->cur_written,
                               (unsigned long long)d->nbytes));
    }
    return flush(w, err);
}

static wna16_status_t complete(wna16_safetensors_writer_t *w,
                               wna16_error_t *err)
{
    wna16_status_t s = complete_data(w, err);
    if (s != WNA16_OK)
        return s;
    if ((s = w16_output_commit(&w->out, err)) != WNA16_OK)
        return fail(w, s);
    return WNA16_OK;
}

wna16_status_t w16_safetensors_writer_complete(wna16_safetensors_writer_t *w,
                                               wna16_error_t *err)
{
    wna16_status_t s = check_usable(w, "w16_safetensors_writer_complete",
                                    err);
    if (s == WNA16_OK)
        s = complete_data(w, err);
    if (s == WNA16_OK) { /* written: the buffer is not needed any more */
        w16_free(w->ctx, w->buf, SW_BUFFER_SIZE);
        w->buf = NULL;
    }
    return s;
}

wna16_status_t w16_safetensors_writer_commit(wna16_safetensors_writer_t *w,
                                             wna16_error_t *err)
{
    wna16_status_t s = check_usable(w, "w16_safetensors_writer_commit", err);
    if (s == WNA16_OK)
        s = w16_output_commit(&w->out, err);
    if (w)
        writer_free(w);
    return s;
}

wna16_status_t wna16_safetensors_writer_finish(wna16_safetensors_writer_t *w,
                                               wna16_error_t *err)
{
    wna16_status_t s = check_usable(w, "wna16_safetensors_writer_finish", err);
    if (s == WNA16_OK)
        s = complete(w, err);
    if (w)
        writer_free(w);
    return s;
}

void wna16_safetensors_writer_abort(wna16_safetensors_writer_t *w)
{
    if (w)
        writer_free(w);
}

/* ---- whole tensor sets --------------------------------------------------- */

static wna16_status_t declare_set(wna16_safetensors_writer_t *w,
                                  const wna16_tensor_set_t *set,
                                  size_t n_meta, const char *const *keys,
                                  const char *const *values,
                                  wna16_error_t *err)
{
    wna16_status_t s = WNA16_OK;
    for (size_t i = 0; i < n_meta && s == WNA16_OK; i++)
        s = wna16_safetensors_writer_metadata(w, keys[i], values[i], err);
    for (size_t i = 0; i < wna16_tensor_set_count(set) && s == WNA16_OK;
         i++) {
        const wna16_tensor_t *t = wna16_tensor_set_at(set, i);
        s = wna16_safetensors_writer_declare(w, t->name, t->dtype, t->ndim,
                                             t->shape, err);
        if (s == WNA16_OK && w->decls[i].nbytes != t->nbytes)
            s = fail(w, w16_err(err, WNA16_EINVAL, "%s: tensor '%s' has "
                                "%zu bytes but its shape needs %llu",
                                w->path, t->name, t->nbytes,
                                (unsigned long long)w->decls[i].nbytes));
    }
    return s;
}

wna16_status_t wna16_safetensors_write_set(wna16_context_t *ctx,
                                           const char *path,
                                           const wna16_tensor_set_t *set,
                                           size_t n_meta,
                                           const char *const *keys,
                                           const char *const *values,
                                           wna16_error_t *err)
{
    if (!set || (n_meta && (!keys || !values)))
        return w16_err(err, WNA16_EINVAL, "wna16_safetensors_write_set: "
                       "set (and keys/values when n_meta > 0) required");
    wna16_safetensors_writer_t *w;
    wna16_status_t s = wna16_safetensors_writer_create(ctx, path, &w, err);
    if (s != WNA16_OK)
        return s;
    s = declare_set(w, set, n_meta, keys, values, err);
    for (size_t i = 0; i < wna16_tensor_set_count(set) && s == WNA16_OK;
         i++) {
        const wna16_tensor_t *t = wna16_tensor_set_at(set, i);
        s = wna16_safetensors_writer_write(w, t->data, t->nbytes, err);
    }
    if (s != WNA16_OK) {
        wna16_safetensors_writer_abort(w);
        return s;
    }
    return wna16_safetensors_writer_finish(w, err);
}
