/*
 * ze.h - the XPU target's device half: Intel GPUs through Level Zero. The
 * loader (libze_loader.so.1) is opened with dlopen, never linked, so one
 * build runs on machines without it; where zeInit fails (no driver, no
 * Intel GPU: these machines) the target reports itself unavailable with
 * the reason and makes no further Level Zero call (a loader whose driver
 * failed to initialize may crash on the next one). The instance is per
 * wna16 context: one driver, its first GPU, a context and an immediate,
 * synchronous command list. <level_zero/ze_api.h> gives the types only.
 */
#ifndef W16_ZE_H
#define W16_ZE_H

#include "base/base.h"

typedef struct w16_ze w16_ze_t;
/* A loaded SPIR-V module with its one kernel. */
typedef struct w16_ze_kernel w16_ze_kernel_t;

/* The context's XPU instance, created on first use; EUNAVAILABLE with
 * "xpu target unavailable: <why>" where Level Zero cannot run. Nothing is
 * kept on failure, so a later call tries again. */
wna16_status_t w16_ze_get(wna16_context_t *ctx, w16_ze_t **out,
                          wna16_error_t *err);
void w16_ze_destroy(w16_ze_t *ze);

/* "Intel(R) Data Center GPU Max 1550" and "Level Zero 1.4, driver 0x..."
 * (part of every cache key). */
const char *w16_ze_device_name(const w16_ze_t *ze);
const char *w16_ze_driver_version(const w16_ze_t *ze);

/* Builds a SPIR-V module (zeModuleCreate; the build log in the error on
 * failure) and creates its kernel `name`. */
wna16_status_t w16_ze_kernel_load(w16_ze_t *ze, const uint32_t *words,
                                  size_t n_words, const char *name,
                                  w16_ze_kernel_t **out, wna16_error_t *err);
void w16_ze_kernel_free(w16_ze_kernel_t *k);

/* Device memory (zeMemAllocDevice) and synchronous copies. */
wna16_status_t w16_ze_alloc(w16_ze_t *ze, size_t bytes, uint64_t *addr,
                            wna16_error_t *err);
void w16_ze_free(w16_ze_t *ze, uint64_t addr);
wna16_status_t w16_ze_copy(w16_ze_t *ze, void *dst, const void *src,
                           size_t bytes, wna16_error_t *err);

/* Runs groups x 1 x 1 workgroups of lanes x 1 x 1 work-items; argument i
 * takes sizes[i] bytes from the low end of args[i] (little-endian).
 * Returns when the kernel has run. */
wna16_status_t w16_ze_launch(w16_ze_t *ze, w16_ze_kernel_t *k,
                             const uint64_t *args, const uint8_t *sizes,
                             int n_args, uint32_t groups, uint32_t lanes,
                             wna16_error_t *err);

#endif /* W16_ZE_H */
