/*
 * safetensors.c - the safetensors reader. A file is an 8-byte little-endian
 * header length N, N bytes of JSON describing every tensor (dtype, shape,
 * [begin, end) offsets into the data section) and the data section itself.
 * The file is memory-mapped read-only and its header validated strictly
 * before anything is handed out: checkpoints are untrusted input, and every
 * consumer (the reference decoder, repackers, kernels) indexes tensor data
 * by shape, so a header that lies about sizes or overlaps tensors must never
 * get past this file. Tensor data pointers point into the map (or the
 * caller's buffer for open_memory); they may be unaligned if the writer did
 * not pad the header, so readers copy with memcpy. Everything parsed (names,
 * metadata, the tensor table) lives in one arena freed by close().
 */
#define _POSIX_C_SOURCE 200809L
#include "base/base.h"
#include "base/json_text.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* JSON integers above this may have been rounded by the double parser. */
#define ST_MAX_JSON_INT 9007199254740991.0 /* 2^53 - 1 */

typedef struct st_meta {
    const char *key, *value;
} st_meta_t;

struct wna16_safetensors {
    wna16_context_t *ctx;
    const char *origin;     /* path or caller's name for the buffer */
    void *map;              /* mmap'ed file; NULL for open_memory */
    size_t map_size;
    wna16_tensor_t *tensors; /* in data-offset order */
    size_t count;
    size_t *by_name;        /* tensor indices sorted by name (for find) */
    st_meta_t *meta;        /* in header order */
    size_t nmeta;
    w16_arena_t arena;      /* owns everything above except the map */
};

/* A tensor while parsing: its header position breaks offset ties so the
 * order of zero-size tensors is deterministic. */
typedef struct st_raw {
    wna16_tensor_t t;
    uint64_t begin, end;
    size_t header_index;
} st_raw_t;

typedef struct st_name_ref {
    const char *name;
    size_t index;
} st_name_ref_t;

/* Everything the per-tensor checks need to name the file in messages. */
typedef struct st_parse {
    const char *origin;
    const unsigned char *data; /* data section */
    uint64_t data_size;
    wna16_error_t *err;
} st_parse_t;

/* ---- small helpers ------------------------------------------------------- */

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A JSON number holding an integer in [0, 2^53): cJSON only keeps a double,
 * so fractions, negatives and values that may have been rounded are
 * refused here. */
static bool json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > ST_MAX_JSON_INT)
        return false;
    uint64_t u = (uint64_t)v;
    if ((double)u != v)
        return false;
    *out = u;
    return true;
}

/* "[4, 4]" into buf (fixed size is fine: at most 8 dims of 20 digits). */
static const char *shape_str(char *buf, size_t cap, const int64_t *shape,
                             int ndim)
{
    size_t n = 0;
    buf[n++] = '[';
    for (int i = 0; i < ndim && n < cap; i++) {
        int w = snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "",
                         (long long)shape[i]);
        if (w < 0)
            break;
        n += (size_t)w;
    }
    if (n + 2 <= cap) {
        buf[n++] = ']';
        buf[n] = '\0';
    } else {
        buf[cap - 1] = '\0';
    }
    return buf;
}

static int cmp_name_ref(const void *a, const void *b)
{
    const st_name_ref_t *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    return (x->index > y->index) - (x->index < y->index);
}

static int cmp_raw_offsets(const void *a, const void *b)
{
    const st_raw_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->header_index > y->header_index) -
           (x->header_index < y->header_index);
}

/* ---- one tensor entry ---------------------------------------------------- */

static wna16_status_t terr(const st_parse_t *p, const char *name,
                           const char *what)
{
    return w16_err(p->err, WNA16_EFORMAT, "%s: tensor '%s': %s", p->origin,
                   name, what);
}

/* Picks dtype/shape/data_offsets out of the entry, refusing any other key
 * and any key given twice (cJSON keeps duplicates). */
static wna16_status_t entry_fields(const st_parse_t *p, const char *name,
                                   const cJSON *entry, const cJSON **dtype,
                                   const cJSON **shape, const cJSON **offsets)
{
    *dtype = *shape = *offsets = NULL;
    if (!cJSON_IsObject(entry))
        return terr(p, name, "expected an object with dtype, shape and "
                             "data_offsets");
    for (const cJSON *f = entry->child; f; f = f->next) {
        const cJSON **slot = NULL;
        const char *k = f->string ? f->string : "";
        if (strcmp(k, "dtype") == 0)
            slot = dtype;
        else if (strcmp(k, "shape") == 0)
            slot = shape;
        else if (strcmp(k, "data_offsets") == 0)
            slot = offsets;
        if (!slot)
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: tensor '%s': unknown key '%s' (expected "
                           "dtype, shape, data_offsets)", p->origin, name, k);
        if (*slot)
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: tensor '%s': duplicate key '%s'", p->origin,
                           name, k);
        *slot = f;
    }
    if (!*dtype)
        return terr(p, name, "missing key 'dtype'");
    if (!*shape)
        return terr(p, name, "missing key 'shape'");
    if (!*offsets)
        return terr(p, name, "missing key 'data_offsets'");
    return WNA16_OK;
}

/* " F16 BF16 ..." from the dtype table, for messages. */
#define ST_DTYPE_NAME_(name, st, bits, isf) " " st
static const char known_dtypes[] = WNA16_DTYPE_LIST(ST_DTYPE_NAME_);
#undef ST_DTYPE_NAME_

static wna16_status_t parse_dtype(const st_parse_t *p, const char *name,
                                  const cJSON *j, wna16_dtype_t *out)
{
    if (!cJSON_IsString(j) || !j->valuestring)
        return terr(p, name, "dtype: expected a string");
    const char *s = j->valuestring;
    *out = wna16_dtype_from_name(s, strlen(s));
    if (*out == WNA16_DTYPE_INVALID)
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: tensor '%s': unsupported dtype '%s' (expected "
                       "one of%s)", p->origin, name, s, known_dtypes);
    return WNA16_OK;
}

/* Shape: non-negative integers, at most WNA16_MAX_DIMS of them, whose
 * running product fits int64 (so wna16_tensor_numel never overflows) and
 * whose byte size fits size_t. */
static wna16_status_t parse_shape(const st_parse_t *p, const char *name,
                                  const cJSON *j, wna16_tensor_t *t)
{
    if (!cJSON_IsArray(j))
        return terr(p, name, "shape: expected an array of integers");
    int ndim = 0;
    uint64_t numel = 1;
    for (const cJSON *d = j->child; d; d = d->next) {
        uint64_t v;
        if (ndim == WNA16_MAX_DIMS)
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: tensor '%s': shape has more than %d "
                           "dimensions", p->origin, name, WNA16_MAX_DIMS);
        if (!json_uint(d, &v))
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: tensor '%s': shape[%d]: expected a "
                           "non-negative integer below 2^53", p->origin, name,
                           ndim);
        if (v != 0 && numel > (uint64_t)INT64_MAX / v)
            return terr(p, name, "shape: element count overflows");
        numel *= v;
        t->shape[ndim++] = (int64_t)v;
    }
    t->ndim = ndim;
    size_t bytes;
    if (!wna16_dtype_nbytes(t->dtype, numel, &bytes))
        return terr(p, name, wna16_dtype_size(t->dtype)
                                 ? "shape: byte size overflows"
                                 : "shape: the elements of a sub-byte dtype "
                                   "are not a whole number of bytes");
    t->nbytes = bytes;
    return WNA16_OK;
}

static wna16_status_t parse_offsets(const st_parse_t *p, const char *name,
                                    const cJSON *j, st_raw_t *r)
{
    const cJSON *b = cJSON_IsArray(j) ? j->child : NULL;
    const cJSON *e = b ? b->next : NULL;
    if (!b || !e || e->next)
        return terr(p, name, "data_offsets: expected [begin, end]");
    if (!json_uint(b, &r->begin) || !json_uint(e, &r->end))
        return terr(p, name, "data_offsets: expected two non-negative "
                             "integers below 2^53");
    if (r->begin > r->end)
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] end "
                       "before they begin", p->origin, name,
                       (unsigned long long)r->begin,
                       (unsigned long long)r->end);
    if (r->end > p->data_size)
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past "
                       "the data section (%llu bytes)", p->origin, name,
                       (unsigned long long)r->begin,
                       (unsigned long long)r->end,
                       (unsigned long long)p->data_size);
    uint64_t held = r->end - r->begin;
    if (held != (uint64_t)r->t.nbytes) {
        char sb[256];
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu "
                       "bytes but shape %s of %s needs %zu", p->origin, name,
                       (unsigned long long)r->begin,
                       (unsigned long long)r->end, (unsigned long long)held,
                       shape_str(sb, sizeof sb, r->t.shape, r->t.ndim),
                       wna16_dtype_name(r->t.dtype), r->t.nbytes);
    }
    return WNA16_OK;
}

static wna16_status_t parse_entry(const st_parse_t *p, const char *name,
                                  const cJSON *entry, st_raw_t *r)
{
    const cJSON *dt, *sh, *off;
    wna16_status_t s = entry_fields(p, name, entry, &dt, &sh, &off);
    if (s == WNA16_OK)
        s = parse_dtype(p, name, dt, &r->t.dtype);
    if (s == WNA16_OK)
        s = parse_shape(p, name, sh, &r->t);
    if (s == WNA16_OK)
        s = parse_offsets(p, name, off, r);
    if (s == WNA16_OK)
        r->t.data = (void *)(p->data + r->begin);
    return s;
}

/* ---- the whole header ---------------------------------------------------- */

/* Sorts n names (with their indices) and returns the first name that
 * appears twice, or NULL. refs is scratch of n entries. */
static const char *sort_find_duplicate(st_name_ref_t *refs, size_t n)
{
    qsort(refs, n, sizeof *refs, cmp_name_ref);
    for (size_t i = 1; i < n; i++)
        if (strcmp(refs[i - 1].name, refs[i].name) == 0)
            return refs[i].name;
    return NULL;
}

static wna16_status_t copy_metadata(wna16_safetensors_t *st,
                                    const st_parse_t *p, const cJSON *m,
                                    st_name_ref_t *refs)
{
    for (const cJSON *v = m->child; v; v = v->next) {
        const char *k = v->string ? v->string : "";
        if (!cJSON_IsString(v) || !v->valuestring)
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: __metadata__: key '%s': expected a string "
                           "value", p->origin, k);
        st_meta_t *e = &st->meta[st->nmeta];
        e->key = w16_arena_strdup(&st->arena, k);
        e->value = w16_arena_strdup(&st->arena, v->valuestring);
        if (!e->key || !e->value)
            return w16_err_nomem(p->err, "reading safetensors metadata");
        refs[st->nmeta] = (st_name_ref_t){e->key, st->nmeta};
        st->nmeta++;
    }
    const char *dup = sort_find_duplicate(refs, st->nmeta);
    if (dup)
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: __metadata__: duplicate key '%s'", p->origin, dup);
    return WNA16_OK;
}

static wna16_status_t parse_metadata(wna16_safetensors_t *st,
                                     const st_parse_t *p, const cJSON *m)
{
    if (!cJSON_IsObject(m))
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: __metadata__: expected an object of strings",
                       p->origin);
    size_t n = 0;
    for (const cJSON *v = m->child; v; v = v->next)
        n++;
    st->meta = w16_arena_alloc(&st->arena, n * sizeof *st->meta);
    st_name_ref_t *refs = w16_calloc(st->ctx, n, sizeof *refs);
    wna16_status_t s;
    if (!st->meta || !refs)
        s = w16_err_nomem(p->err, "reading safetensors metadata");
    else
        s = copy_metadata(st, p, m, refs);
    w16_free(st->ctx, refs, n * sizeof *refs);
    return s;
}

/* Sorted by offset, each tensor must start where the previous one ended and
 * the last must end at the data section's end: no overlap, no gap, no
 * trailing bytes (the same rule as the reference implementation). */
static wna16_status_t check_coverage(const st_parse_t *p, const st_raw_t *raw,
                                     size_t n)
{
    uint64_t cursor = 0;
    for (size_t i = 0; i < n; i++) {
        const st_raw_t *r = &raw[i];
        if (r->begin < cursor)
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] "
                           "overlap tensor '%s'", p->origin, r->t.name,
                           (unsigned long long)r->begin,
                           (unsigned long long)r->end, raw[i - 1].t.name);
        if (r->begin > cursor)
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] leave "
                           "a gap of %llu unused bytes before it", p->origin,
                           r->t.name, (unsigned long long)r->begin,
                           (unsigned long long)r->end,
                           (unsigned long long)(r->begin - cursor));
        cursor = r->end;
    }
    if (cursor != p->data_size)
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: %llu bytes of the data section (%llu bytes) "
                       "belong to no tensor", p->origin,
                       (unsigned long long)(p->data_size - cursor),
                       (unsigned long long)p->data_size);
    return WNA16_OK;
}

/* Refuses duplicate tensor names (cJSON keeps both entries). Done before
 * the offset checks so two copies of one entry are reported as what they
 * are rather than as an overlap. */
static wna16_status_t check_duplicates(wna16_safetensors_t *st,
                                       const st_parse_t *p,
                                       const st_raw_t *raw, size_t n)
{
    st_name_ref_t *refs = w16_calloc(st->ctx, n, sizeof *refs);
    if (!refs)
        return w16_err_nomem(p->err, "indexing safetensors names");
    for (size_t i = 0; i < n; i++)
        refs[i] = (st_name_ref_t){raw[i].t.name, i};
    const char *dup = sort_find_duplicate(refs, n);
    wna16_status_t s = WNA16_OK;
    if (dup)
        s = w16_err(p->err, WNA16_EFORMAT, "%s: duplicate tensor '%s'",
                    p->origin, dup);
    w16_free(st->ctx, refs, n * sizeof *refs);
    return s;
}

/* Builds the name index used by find() over the final tensor order. */
static wna16_status_t index_names(wna16_safetensors_t *st, const st_parse_t *p)
{
    size_t n = st->count;
    st_name_ref_t *refs = w16_calloc(st->ctx, n, sizeof *refs);
    st->by_name = w16_arena_alloc(&st->arena, n * sizeof(size_t));
    if (!refs || !st->by_name) {
        w16_free(st->ctx, refs, n * sizeof *refs);
        return w16_err_nomem(p->err, "indexing safetensors names");
    }
    for (size_t i = 0; i < n; i++)
        refs[i] = (st_name_ref_t){st->tensors[i].name, i};
    qsort(refs, n, sizeof *refs, cmp_name_ref);
    for (size_t i = 0; i < n; i++)
        st->by_name[i] = refs[i].index;
    w16_free(st->ctx, refs, n * sizeof *refs);
    return WNA16_OK;
}

/* Parses every entry of the root object into raw (one slot per entry). */
static wna16_status_t parse_entries(wna16_safetensors_t *st,
                                    const st_parse_t *p, const cJSON *root,
                                    st_raw_t *raw, size_t *count)
{
    size_t meta_seen = 0;
    *count = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        const char *name = c->string ? c->string : "";
        wna16_status_t s;
        if (strcmp(name, "__metadata__") == 0) {
            if (meta_seen++)
                return w16_err(p->err, WNA16_EFORMAT,
                               "%s: duplicate key '__metadata__'", p->origin);
            s = parse_metadata(st, p, c);
        } else {
            st_raw_t *r = &raw[*count];
            r->header_index = *count;
            s = parse_entry(p, name, c, r);
            if (s == WNA16_OK && !(r->t.name = w16_arena_strdup(&st->arena,
                                                                 name)))
                s = w16_err_nomem(p->err, "reading a safetensors header");
            (*count)++;
        }
        if (s != WNA16_OK)
            return s;
    }
    return WNA16_OK;
}

/* Parses every tensor entry, then orders them by data offset and checks
 * they tile the data section. */
static wna16_status_t parse_tensors(wna16_safetensors_t *st,
                                    const st_parse_t *p, const cJSON *root)
{
    size_t n = 0, raw_bytes, tensor_bytes, count = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        n++;
    if (!w16_mul_size(n, sizeof(st_raw_t), &raw_bytes) ||
        !w16_mul_size(n, sizeof(wna16_tensor_t), &tensor_bytes))
        return w16_err_nomem(p->err, "reading a safetensors header");
    st_raw_t *raw = w16_calloc(st->ctx, 1, raw_bytes);
    st->tensors = w16_arena_alloc(&st->arena, tensor_bytes);
    wna16_status_t s = WNA16_OK;
    if (!raw || !st->tensors)
        s = w16_err_nomem(p->err, "reading a safetensors header");
    if (s == WNA16_OK)
        s = parse_entries(st, p, root, raw, &count);
    if (s == WNA16_OK)
        s = check_duplicates(st, p, raw, count);
    if (s == WNA16_OK) {
        qsort(raw, count, sizeof *raw, cmp_raw_offsets);
        s = check_coverage(p, raw, count);
    }
    if (s == WNA16_OK) {
        for (size_t i = 0; i < count; i++)
            st->tensors[i] = raw[i].t;
        st->count = count;
        s = index_names(st, p);
    }
    w16_free(st->ctx, raw, raw_bytes);
    return s;
}

/* Parses the JSON text of the header; only spaces may follow the object. */
static wna16_status_t parse_json(const st_parse_t *p, const char *hdr,
                                 size_t len, cJSON **out)
{
    *out = NULL;
    if (hdr[0] != '{')
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: header does not start with '{'", p->origin);
    size_t at = 0;
    switch (w16_json_text_check(hdr, len, &at)) {
    case W16_JSON_OK:
        break;
    case W16_JSON_BYTE:
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: header byte %zu (0x%02x) is not valid in JSON "
                       "text", p->origin, at, (unsigned char)hdr[at]);
    case W16_JSON_NUMBER:
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: header byte %zu: malformed JSON number",
                       p->origin, at);
    case W16_JSON_NUL:
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: header byte %zu: \\u0000 is not allowed in "
                       "names", p->origin, at);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, len, &end, 0);
    if (!root)
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: header is not valid JSON", p->origin);
    if (!cJSON_IsObject(root) || !end || end < hdr || end > hdr + len) {
        cJSON_Delete(root);
        return w16_err(p->err, WNA16_EFORMAT,
                       "%s: header is not a JSON object", p->origin);
    }
    for (const char *q = end; q < hdr + len; q++) {
        if (*q != ' ') {
            cJSON_Delete(root);
            return w16_err(p->err, WNA16_EFORMAT,
                           "%s: header has trailing bytes after the JSON "
                           "object (at byte %zu; only space padding is "
                           "allowed)", p->origin, (size_t)(q - hdr));
        }
    }
    *out = root;
    return WNA16_OK;
}

/* Validates the layout of the whole buffer and fills st. */
static wna16_status_t parse_file(wna16_safetensors_t *st,
                                 const unsigned char *bytes, size_t size,
                                 wna16_error_t *err)
{
    const char *origin = st->origin;
    if (size < 8)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: %zu bytes is too short for a safetensors file "
                       "(at least the 8-byte header length is needed)",
                       origin, size);
    uint64_t n = read_le64(bytes);
    uint64_t room = (uint64_t)(size - 8);
    if (n < 2)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: header length %llu is too small", origin,
                       (unsigned long long)n);
    if (n > WNA16_SAFETENSORS_MAX_HEADER)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: header length %llu exceeds the limit of %u bytes",
                       origin, (unsigned long long)n,
                       WNA16_SAFETENSORS_MAX_HEADER);
    if (n > room)
        return w16_err(err, WNA16_EFORMAT,
                       "%s: header length %llu runs past the end of the file "
                       "(%llu bytes after the length)", origin,
                       (unsigned long long)n, (unsigned long long)room);
    st_parse_t p = {.origin = origin, .data = bytes + 8 + n,
                    .data_size = room - n, .err = err};
    cJSON *root;
    wna16_status_t s = parse_json(&p, (const char *)bytes + 8, (size_t)n,
                                  &root);
    if (s != WNA16_OK)
        return s;
    s = parse_tensors(st, &p, root);
    cJSON_Delete(root);
    return s;
}

/* ---- open / close -------------------------------------------------------- */

static wna16_status_t st_new(wna16_context_t *ctx, const char *origin,
                             wna16_safetensors_t **out, wna16_error_t *err)
{
    wna16_safetensors_t *st = w16_calloc(ctx, 1, sizeof *st);
    if (!st)
        return w16_err_nomem(err, "opening a safetensors file");
    st->ctx = ctx;
    w16_arena_init(&st->arena, ctx);
    st->origin = w16_arena_strdup(&st->arena, origin);
    if (!st->origin) {
        wna16_safetensors_close(st);
        return w16_err_nomem(err, "opening a safetensors file");
    }
    *out = st;
    return WNA16_OK;
}

wna16_status_t wna16_safetensors_open_memory(wna16_context_t *ctx,
                                             const char *origin,
                                             const void *data, size_t size,
                                             wna16_safetensors_t **out,
                                             wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_safetensors_open_memory: out is NULL");
    *out = NULL;
    if (!data && size)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_safetensors_open_memory: data is NULL");
    wna16_safetensors_t *st = NULL;
    wna16_status_t s = st_new(ctx, origin ? origin : "<memory>", &st, err);
    if (s != WNA16_OK)
        return s;
    s = parse_file(st, data, size, err);
    if (s != WNA16_OK) {
        wna16_safetensors_close(st);
        return s;
    }
    *out = st;
    return WNA16_OK;
}

/* Opens a regular file and maps it. O_NONBLOCK keeps a FIFO from hanging
 * the open; it has no effect on regular files. */
static wna16_status_t map_file(const char *path, void **map, size_t *size,
                               wna16_error_t *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return w16_err(err, WNA16_EIO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat sb;
    wna16_status_t s = WNA16_OK;
    if (fstat(fd, &sb) != 0)
        s = w16_err(err, WNA16_EIO, "%s: cannot stat: %s", path,
                    strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        s = w16_err(err, WNA16_EIO, "%s: is a directory, not a safetensors "
                    "file", path);
    else if (!S_ISREG(sb.st_mode))
        s = w16_err(err, WNA16_EIO, "%s: not a regular file", path);
    else if (sb.st_size < 8)
        s = w16_err(err, WNA16_EFORMAT,
                    "%s: %lld bytes is too short for a safetensors file "
                    "(at least the 8-byte header length is needed)", path,
                    (long long)sb.st_size);
    else if ((uint64_t)sb.st_size > SIZE_MAX)
        s = w16_err(err, WNA16_ELIMIT, "%s: too large to map", path);
    if (s == WNA16_OK) {
        *size = (size_t)sb.st_size;
        *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            s = w16_err(err, WNA16_EIO, "%s: cannot map: %s", path,
                        strerror(errno));
        }
    }
    close(fd);
    return s;
}

wna16_status_t wna16_safetensors_open(wna16_context_t *ctx, const char *path,
                                      wna16_safetensors_t **out,
                                      wna16_error_t *err)
{
    if (!out || !path)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_safetensors_open: path and out are required");
    *out = NULL;
    wna16_safetensors_t *st = NULL;
    wna16_status_t s = st_new(ctx, path, &st, err);
    if (s != WNA16_OK)
        return s;
    s = map_file(path, &st->map, &st->map_size, err);
    if (s == WNA16_OK)
        s = parse_file(st, st->map, st->map_size, err);
    if (s != WNA16_OK) {
        wna16_safetensors_close(st);
        return s;
    }
    *out = st;
    return WNA16_OK;
}

void wna16_safetensors_close(wna16_safetensors_t *st)
{
    if (!st)
        return;
    if (st->map)
        munmap(st->map, st->map_size);
    w16_arena_free(&st->arena);
    w16_free(st->ctx, st, sizeof *st);
}

/* ---- getters ------------------------------------------------------------- */

const char *wna16_safetensors_path(const wna16_safetensors_t *st)
{
    return st ? st->origin : NULL;
}

size_t wna16_safetensors_count(const wna16_safetensors_t *st)
{
    return st ? st->count : 0;
}

const wna16_tensor_t *wna16_safetensors_at(const wna16_safetensors_t *st,
                                           size_t index)
{
    return st && index < st->count ? &st->tensors[index] : NULL;
}

const wna16_tensor_t *wna16_safetensors_find(const wna16_safetensors_t *st,
                                             const char *name)
{
    if (!st || !name)
        return NULL;
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const wna16_tensor_t *t = &st->tensors[st->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t wna16_safetensors_metadata_count(const wna16_safetensors_t *st)
{
    return st ? st->nmeta : 0;
}

const char *wna16_safetensors_metadata_key(const wna16_safetensors_t *st,
                                           size_t index)
{
    return st && index < st->nmeta ? st->meta[index].key : NULL;
}

const char *wna16_safetensors_metadata_get(const wna16_safetensors_t *st,
                                           const char *key)
{
    if (!st || !key)
        return NULL;
    for (size_t i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[i].key, key) == 0)
            return st->meta[i].value;
    return NULL;
}
