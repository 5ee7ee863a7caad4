/*
 * tensor_set.c - a small ordered set of named tensors: views over memory the
 * caller keeps alive, or storage the set owns (zero-filled, or left as
 * allocated for producers that write every byte).
 */
#include "base/base.h"

#include <string.h>

typedef struct entry {
    wna16_tensor_t t;
    char *name;  /* owned copy */
    bool owned;  /* t.data owned by the set */
} entry_t;

/* Entries in insertion order, plus an open-addressing index of names
 * (power-of-two table of entry index + 1, 0 = empty) so lookups stay O(1)
 * for checkpoints with hundreds of thousands of tensors. */
struct wna16_tensor_set {
    wna16_context_t *ctx;
    entry_t **items; /* each entry allocated alone: pointers to it stay valid */
    size_t count, cap;
    uint32_t *index;
    size_t index_cap;
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static bool index_rebuild(wna16_tensor_set_t *set, size_t cap)
{
    uint32_t *ix = w16_calloc(set->ctx, cap, sizeof *ix);
    if (!ix)
        return false;
    for (size_t i = 0; i < set->count; i++) {
        size_t h = (size_t)name_hash(set->items[i]->name) & (cap - 1);
        while (ix[h])
            h = (h + 1) & (cap - 1);
        ix[h] = (uint32_t)(i + 1);
    }
    w16_free(set->ctx, set->index, set->index_cap * sizeof *set->index);
    set->index = ix;
    set->index_cap = cap;
    return true;
}

wna16_status_t wna16_tensor_set_create(wna16_context_t *ctx,
                                       wna16_tensor_set_t **out,
                                       wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "wna16_tensor_set_create: out is NULL");
    *out = w16_calloc(ctx, 1, sizeof **out);
    if (!*out)
        return w16_err_nomem(err, "creating a tensor set");
    (*out)->ctx = ctx;
    return WNA16_OK;
}

void wna16_tensor_set_destroy(wna16_tensor_set_t *set)
{
    if (!set)
        return;
    for (size_t i = 0; i < set->count; i++) {
        entry_t *e = set->items[i];
        if (e->owned)
            w16_free_bulk(set->ctx, e->t.data, e->t.nbytes);
        w16_strfree(set->ctx, e->name);
        w16_free(set->ctx, e, sizeof *e);
    }
    w16_free(set->ctx, set->items, set->cap * sizeof(entry_t *));
    w16_free(set->ctx, set->index, set->index_cap * sizeof *set->index);
    w16_free(set->ctx, set, sizeof *set);
}

static wna16_status_t push(wna16_tensor_set_t *set, const wna16_tensor_t *t,
                           bool owned, wna16_tensor_t **out,
                           wna16_error_t *err)
{
    if (!t->name || !*t->name)
        return w16_err(err, WNA16_EINVAL, "tensor set: tensor without a name");
    if (wna16_tensor_set_find(set, t->name))
        return w16_err(err, WNA16_EINVAL, "tensor set: duplicate tensor '%s'",
                       t->name);
    if (set->count >= UINT32_MAX - 1)
        return w16_err(err, WNA16_ELIMIT, "tensor set: too many tensors");
    /* keep the index at most half full */
    if ((set->count + 1) * 2 > set->index_cap &&
        !index_rebuild(set, set->index_cap ? set->index_cap * 2 : 64))
        return w16_err_nomem(err, "growing a tensor set");
    if (set->count == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 16;
        entry_t **n = w16_realloc(set->ctx, set->items,
                                  set->cap * sizeof(entry_t *),
                                  cap * sizeof(entry_t *));
        if (!n)
            return w16_err_nomem(err, "growing a tensor set");
        set->items = n;
        set->cap = cap;
    }
    entry_t *e = w16_calloc(set->ctx, 1, sizeof *e);
    if (!e)
        return w16_err_nomem(err, "growing a tensor set");
    e->name = w16_strdup(set->ctx, t->name);
    if (!e->name) {
        w16_free(set->ctx, e, sizeof *e);
        return w16_err_nomem(err, "growing a tensor set");
    }
    set->items[set->count] = e;
    e->t = *t;
    e->t.name = e->name;
    e->owned = owned;
    size_t h = (size_t)name_hash(e->name) & (set->index_cap - 1);
    while (set->index[h])
        h = (h + 1) & (set->index_cap - 1);
    set->index[h] = (uint32_t)(set->count + 1);
    set->count++;
    if (out)
        *out = &e->t;
    return WNA16_OK;
}

wna16_status_t wna16_tensor_set_add_view(wna16_tensor_set_t *set,
                                         const wna16_tensor_t *t,
                                         wna16_error_t *err)
{
    return push(set, t, false, NULL, err);
}

static wna16_status_t add_owned(wna16_tensor_set_t *set, const char *name,
                                wna16_dtype_t dtype, int ndim,
                                const int64_t *shape, bool zero,
                                wna16_tensor_t **out, wna16_error_t *err)
{
    if (ndim < 0 || ndim > WNA16_MAX_DIMS)
        return w16_err(err, WNA16_EINVAL, "tensor '%s': %d dimensions (max %d)",
                       name, ndim, WNA16_MAX_DIMS);
    if (!wna16_dtype_bits(dtype))
        return w16_err(err, WNA16_EINVAL, "tensor '%s': invalid dtype", name);
    wna16_tensor_t t = {.name = name, .dtype = dtype, .ndim = ndim};
    size_t numel = 1, bytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return w16_err(err, WNA16_EINVAL, "tensor '%s': negative dimension",
                           name);
        t.shape[i] = shape[i];
        if (!w16_mul_size(numel, (size_t)shape[i], &numel))
            return w16_err(err, WNA16_ELIMIT, "tensor '%s': size overflows",
                           name);
    }
    if (!wna16_dtype_nbytes(dtype, numel, &bytes))
        return w16_err(err, WNA16_ELIMIT, "tensor '%s': %zu elements of %s "
                       "are not a whole number of bytes below 2^64", name,
                       numel, wna16_dtype_name(dtype));
    t.nbytes = bytes;
    t.data = w16_alloc_bulk(set->ctx, bytes ? bytes : 1, zero);
    if (!t.data)
        return w16_err(err, WNA16_ENOMEM, "out of memory allocating tensor '%s' "
                       "(%zu bytes)", name, bytes);
    wna16_status_t st = push(set, &t, true, out, err);
    if (st != WNA16_OK)
        w16_free_bulk(set->ctx, t.data, bytes);
    return st;
}

wna16_status_t wna16_tensor_set_add_new(wna16_tensor_set_t *set,
                                        const char *name, wna16_dtype_t dtype,
                                        int ndim, const int64_t *shape,
                                        wna16_tensor_t **out,
                                        wna16_error_t *err)
{
    return add_owned(set, name, dtype, ndim, shape, true, out, err);
}

wna16_status_t w16_tensor_set_add_uninit(wna16_tensor_set_t *set,
                                         const char *name, wna16_dtype_t dtype,
                                         int ndim, const int64_t *shape,
                                         wna16_tensor_t **out,
                                         wna16_error_t *err)
{
    return add_owned(set, name, dtype, ndim, shape, false, out, err);
}

const wna16_tensor_t *wna16_tensor_set_find(const wna16_tensor_set_t *set,
                                            const char *name)
{
    if (!set->index_cap)
        return NULL;
    size_t h = (size_t)name_hash(name) & (set->index_cap - 1);
    for (uint32_t i; (i = set->index[h]) != 0; h = (h + 1) & (set->index_cap - 1))
        if (strcmp(set->items[i - 1]->name, name) == 0)
            return &set->items[i - 1]->t;
    return NULL;
}

size_t wna16_tensor_set_count(const wna16_tensor_set_t *set) { return set->count; }

const wna16_tensor_t *wna16_tensor_set_at(const wna16_tensor_set_t *set,
                                          size_t index)
{
    return index < set->count ? &set->items[index]->t : NULL;
}
