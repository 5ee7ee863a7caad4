/*
 * pack.h - kernel packs at the top of the runtime: writing a pack file
 * (the format is runtime/cache/pack.h) through runtime/output.c, so that a
 * pack is never left half written, and the public door that adds a pack
 * to a context (wna16_context_add_pack, include/wna16.h).
 */
#ifndef W16_RUNTIME_PACK_H
#define W16_RUNTIME_PACK_H

#include "runtime/cache/pack.h"

/* Serializes `items` (w16_pack_serialize) and writes them to `path` as
 * runtime/output.c decides (a temporary renamed into place for a regular
 * file; "-" and FIFOs streamed). *bytes (may be NULL) gets the file's
 * size. The items stay the caller's. */
wna16_status_t w16_pack_write(wna16_context_t *ctx, const char *path,
                              const char *pack_name, const char *generator,
                              const char *compilers,
                              const w16_pack_item_t *items, size_t n,
                              uint64_t *bytes, wna16_error_t *err);

#endif /* W16_RUNTIME_PACK_H */
