/*
 * repack_gen.h - repack with generated kernels on a target
 * (runtime/repack_gen.c), the path wna16_repack_layer takes for every
 * target but the reference.
 */
#ifndef W16_REPACK_GEN_H
#define W16_REPACK_GEN_H

#include "base/base.h"

/* wna16_repack_layer's work on `target` (anything but the reference):
 * the same arguments, checked by it already. */
wna16_status_t w16_repack_layer_generated(wna16_context_t *ctx,
                                          const wna16_spec_t *src_format,
                                          const wna16_tensor_set_t *src,
                                          const char *prefix, int32_t E,
                                          int32_t H, int32_t I,
                                          const wna16_quant_desc_t *quant,
                                          const wna16_spec_t *dst,
                                          wna16_target_t target,
                                          wna16_tensor_set_t *out,
                                          wna16_error_t *err);

#endif /* W16_REPACK_GEN_H */
