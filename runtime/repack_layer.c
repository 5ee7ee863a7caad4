/*
 * repack_layer.c - one MoE layer from a checkpoint format into a backend
 * layout, on the requested target. The reference target decodes to the
 * logical form and encodes it again (runtime/ref/); the generated targets
 * run repack kernels built from the same specs (runtime/repack_gen.c) and
 * must produce the same bytes.
 */
#include "base/base.h"
#include "spec/spec.h"
#include "runtime/ref/ref.h"
#include "runtime/repack_gen.h"

#include <string.h>

wna16_status_t wna16_repack_layer(wna16_context_t *ctx,
                                  const wna16_spec_t *src_format,
                                  const wna16_tensor_set_t *src,
                                  const char *prefix, int32_t E, int32_t H,
                                  int32_t I, const wna16_quant_desc_t *quant,
                                  const wna16_spec_t *dst_backend,
                                  wna16_target_t target,
                                  wna16_tensor_set_t *out, wna16_error_t *err)
{
    if (!ctx || !src_format || !src || !quant || !dst_backend || !out)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_layer: ctx, "
                       "src_format, src, quant, dst_backend and out are "
                       "required");
    /* 8-bit activations are a deployment choice vLLM offers only through
     * some integrations: a checkpoint format's spec lists them (both targets
     * refuse alike; the destination's own refusal is w16_check_holds'). */
    if (quant->model_dtype != WNA16_DTYPE_INVALID &&
        quant->model_dtype != WNA16_DTYPE_F16 &&
        quant->model_dtype != WNA16_DTYPE_BF16)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_layer: model dtype "
                       "%s: expected F16, BF16 or none (0)",
                       wna16_dtype_name(quant->model_dtype)
                           ? wna16_dtype_name(quant->model_dtype)
                           : "(invalid)");
    if ((unsigned)quant->input_dtype >= WNA16_INPUT_COUNT_)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_layer: input dtype %d "
                       "is not a wna16_input_dtype_t", (int)quant->input_dtype);
    if (src_format->kind == WNA16_SPEC_FORMAT &&
        !src_format->caps.input_dtypes[quant->input_dtype])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s checkpoints do not run "
                       "with %s activations: vLLM's %s integration keeps "
                       "16-bit activations", src_format->name,
                       wna16_input_dtype_name(quant->input_dtype),
                       src_format->fsel.integration);
    /* Both layouts proved for this problem before any work, on every
     * target: a layout that is a bijection on its spec's samples may
     * overlap or leave its shape at this size (spec/spec_check.c). */
    w16_problem_t p = {E, H, I, quant->bits, quant->group_size,
                       quant->zero_point, quant->act_order, quant->bias,
                       quant->zeros_stored, quant->g_idx_stored,
                       (int)quant->input_dtype,
                       .model_dtype = quant->model_dtype};
    wna16_status_t st = w16_spec_check_problem(src_format, &p, NULL, err);
    if (st == WNA16_OK)
        st = w16_spec_check_problem(dst_backend, &p, NULL, err);
    if (st != WNA16_OK)
        return st;
    if (target != WNA16_TARGET_REFERENCE)
        return w16_repack_layer_generated(ctx, src_format, src, prefix, E, H,
                                          I, quant, dst_backend, target, out,
                                          err);
    wna16_qlayer_t layer;
    st = wna16_ref_decode(ctx, src_format, src, prefix, E, H, I,
                                         quant, &layer, err);
    if (st != WNA16_OK)
        return st;
    /* vLLM's loader: the parameters hold the model's dtype */
    w16_qweight_cast(&layer.w13, quant->model_dtype);
    w16_qweight_cast(&layer.w2, quant->model_dtype);
    st = wna16_ref_encode_input(ctx, dst_backend, &layer, quant->input_dtype,
                                prefix, out, err);
    wna16_qlayer_free(&layer);
    return st;
}
