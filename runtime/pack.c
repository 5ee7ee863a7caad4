/*
 * pack.c - writing kernel pack files and adding packs to a context (see
 * runtime/pack.h). The bytes come from runtime/cache/pack.c, the file
 * from runtime/output.c: a regular file appears complete or not at all.
 */
#include "runtime/pack.h"
#include "runtime/output.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

wna16_status_t w16_pack_write(wna16_context_t *ctx, const char *path,
                              const char *pack_name, const char *generator,
                              const char *compilers,
                              const w16_pack_item_t *items, size_t n,
                              uint64_t *bytes, wna16_error_t *err)
{
    void *data = NULL;
    size_t size = 0;
    wna16_status_t st = w16_pack_serialize(ctx, pack_name, generator,
                                           compilers, items, n, &data, &size,
                                           err);
    if (st != WNA16_OK)
        return st;
    w16_arena_t arena;
    w16_arena_init(&arena, ctx);
    w16_output_t o = {.fd = -1, .slot = -1};
    st = w16_output_open(ctx, &arena, path, &o, err);
    for (size_t done = 0; st == WNA16_OK && done < size;) {
        ssize_t w = write(o.fd, (const char *)data + done, size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            st = w16_err(err, WNA16_EIO, "%s: writing the kernel pack: %s",
                         w16_output_name(&o), w < 0 ? strerror(errno)
                                                    : "nothing written");
        else
            done += (size_t)w;
    }
    if (st == WNA16_OK)
        st = w16_output_commit(&o, err);
    else if (o.fd >= 0)
        w16_output_discard(&o);
    w16_arena_free(&arena);
    w16_free(ctx, data, size);
    if (st == WNA16_OK && bytes)
        *bytes = size;
    return st;
}

wna16_status_t wna16_context_add_pack(wna16_context_t *ctx, const char *path,
                                      wna16_error_t *err)
{
    if (!ctx || !path)
        return w16_err(err, WNA16_EINVAL, "wna16_context_add_pack: %s is "
                       "NULL", !ctx ? "ctx" : "path");
    return w16_packs_add(ctx, path, err);
}
