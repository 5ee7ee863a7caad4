/*
 * repack_gen.c - the generated-kernel repack path (being written: the
 * kernel IR, the repack builder and the CPU target land here next).
 */
#include "runtime/base/base.h"
#include "gen/spec.h"

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

wna16_status_t w16_repack_layer_generated(wna16_context_t *ctx,
                                          const wna16_spec_t *src_format,
                                          const wna16_tensor_set_t *src,
                                          const char *prefix, int32_t E,
                                          int32_t H, int32_t I,
                                          const wna16_quant_desc_t *quant,
                                          const wna16_spec_t *dst,
                                          wna16_target_t target,
                                          wna16_tensor_set_t *out,
                                          wna16_error_t *err)
{
    (void)ctx; (void)src_format; (void)src; (void)prefix; (void)E; (void)H;
    (void)I; (void)quant; (void)dst; (void)out;
    return w16_err(err, WNA16_EUNAVAILABLE, "%s target unavailable: generated "
                   "repack kernels are not built yet",
                   wna16_target_name(target));
}
