/*
 * test_tensor_set.c - tensor buffers: small and bulk (>= W16_BULK_MIN,
 * mapped with huge-page advice under the default allocator) are zeroed by
 * add_new, writable end to end, aligned, and freed; with a custom
 * allocator every buffer, bulk included, goes through it and comes back
 * with the size it was allocated with.
 */
#include "testutil.h"
#include "base/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct counting {
    size_t live_bytes, allocs, frees, largest;
} counting_t;

static void *c_alloc(void *user, size_t n)
{
    counting_t *c = user;
    c->live_bytes += n;
    c->allocs++;
    if (n > c->largest)
        c->largest = n;
    return malloc(n);
}

static void *c_realloc(void *user, void *p, size_t old, size_t n)
{
    counting_t *c = user;
    c->live_bytes += n - old;
    c->allocs += p == NULL; /* growing from nothing is an allocation */
    return realloc(p, n);
}

static void c_free(void *user, void *p, size_t n)
{
    counting_t *c = user;
    c->live_bytes -= n;
    c->frees++;
    free(p);
}

/* A small, a bulk zeroed and a bulk uninitialized tensor: zeroed where
 * asked, every byte writable, 64-byte aligned. */
static void exercise(wna16_context_t *ctx)
{
    wna16_error_t err;
    wna16_tensor_set_t *set;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    const int64_t small[1] = {100}, bulk[2] = {1024, 4096}; /* 16 MiB f32 */
    wna16_tensor_t *a, *b, *c;
    TU_OK(wna16_tensor_set_add_new(set, "a", WNA16_DTYPE_F32, 1, small, &a,
                                   &err), &err);
    TU_OK(wna16_tensor_set_add_new(set, "b", WNA16_DTYPE_F32, 2, bulk, &b,
                                   &err), &err);
    TU_OK(w16_tensor_set_add_uninit(set, "c", WNA16_DTYPE_I32, 2, bulk, &c,
                                    &err), &err);
    TU_CHECK(b->nbytes >= W16_BULK_MIN);
    size_t nonzero = 0;
    const unsigned char *bb = b->data;
    for (size_t i = 0; i < b->nbytes; i++)
        nonzero += bb[i] != 0;
    TU_CHECK_MSG(nonzero == 0, "%zu nonzero bytes in a zeroed bulk tensor",
                 nonzero);
    const unsigned char *ab = a->data;
    for (size_t i = 0; i < a->nbytes; i++)
        nonzero += ab[i] != 0;
    TU_CHECK(nonzero == 0);
    memset(c->data, 0x5a, c->nbytes);
    memset(b->data, 0xa5, b->nbytes);
    TU_CHECK(((const unsigned char *)c->data)[c->nbytes - 1] == 0x5a);
    TU_CHECK((uintptr_t)b->data % 64 == 0 && (uintptr_t)c->data % 16 == 0);
    TU_CHECK(wna16_tensor_set_find(set, "c") == c);
    wna16_tensor_set_destroy(set);
}

int main(void)
{
    wna16_error_t err;
    wna16_context_t *ctx;
    wna16_context_options_t o = {.no_builtin_specs = true};
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    exercise(ctx);
    wna16_context_destroy(ctx);

    counting_t cnt = {0};
    wna16_allocator_t al = {c_alloc, c_realloc, c_free, &cnt};
    o.allocator = &al;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    exercise(ctx);
    TU_CHECK_MSG(cnt.largest >= (size_t)16 << 20,
                 "bulk tensors bypassed the custom allocator (largest %zu)",
                 cnt.largest);
    wna16_context_destroy(ctx);
    TU_CHECK_MSG(cnt.live_bytes == 0 && cnt.allocs == cnt.frees,
                 "%zu bytes live, %zu allocations, %zu frees", cnt.live_bytes,
                 cnt.allocs, cnt.frees);
    return tu_finish("test_tensor_set");
}
