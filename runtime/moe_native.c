/*
 * moe_native.c - the public doors of the tensor-core fused MoE
 * (wna16_cuda_moe_*, include/wna16.h). Each finds the CUDA target in the
 * target list and calls its descriptor's native_moe operations
 * (runtime/cuda/cuda_moe.c), which check their arguments and do the work.
 * A build without the CUDA target (no CUDA headers at configure time) has
 * no such operations: creating a layer then reports the target
 * unavailable, and no other door can receive a layer.
 */
#include "runtime/targets.h"

#include <string.h>

static const w16_native_moe_t *cuda_moe(void)
{
    const w16_target_t *T = w16_target_find(WNA16_TARGET_CUDA);
    return T ? T->native_moe : NULL;
}

static wna16_status_t unavailable(const char *fn, wna16_error_t *err)
{
    return w16_err(err, WNA16_EUNAVAILABLE, "%s: cuda target unavailable: "
                   "built without CUDA headers", fn);
}

wna16_status_t wna16_cuda_moe_create(wna16_context_t *ctx,
                                     const wna16_spec_t *backend,
                                     const wna16_tensor_set_t *tensors,
                                     const char *prefix, int32_t E, int32_t H,
                                     int32_t I,
                                     const wna16_quant_desc_t *quant,
                                     bool device_tensors,
                                     wna16_cuda_moe_t **out,
                                     wna16_error_t *err)
{
    const w16_native_moe_t *m = cuda_moe();
    if (!m) {
        if (out)
            *out = NULL;
        return unavailable("wna16_cuda_moe_create", err);
    }
    return m->create(ctx, backend, tensors, prefix, E, H, I, quant,
                     device_tensors, out, err);
}

void wna16_cuda_moe_destroy(wna16_cuda_moe_t *moe)
{
    const w16_native_moe_t *m = cuda_moe();
    if (m)
        m->destroy(moe);
}

wna16_status_t wna16_cuda_moe_run(wna16_cuda_moe_t *moe,
                                  const wna16_moe_params_t *p,
                                  const void *hidden, int32_t M,
                                  const int32_t *topk_ids,
                                  const float *topk_weights, int32_t topk,
                                  void *out, wna16_error_t *err)
{
    const w16_native_moe_t *m = cuda_moe();
    return m ? m->run(moe, p, hidden, M, topk_ids, topk_weights, topk, out,
                      err)
             : unavailable("wna16_cuda_moe_run", err);
}

wna16_status_t wna16_cuda_moe_run_batched(wna16_cuda_moe_t *moe,
                                          const wna16_moe_params_t *p,
                                          const void *hidden,
                                          int32_t max_tokens,
                                          const int32_t *expert_num_tokens,
                                          const float *weights, void *out,
                                          wna16_error_t *err)
{
    const w16_native_moe_t *m = cuda_moe();
    return m ? m->run_batched(moe, p, hidden, max_tokens, expert_num_tokens,
                              weights, out, err)
             : unavailable("wna16_cuda_moe_run_batched", err);
}

wna16_status_t wna16_cuda_moe_run_device(wna16_cuda_moe_t *moe,
                                         const wna16_moe_params_t *p,
                                         uint64_t hidden, int32_t M,
                                         uint64_t topk_ids,
                                         uint64_t topk_weights, int32_t topk,
                                         uint64_t out, void *stream,
                                         wna16_error_t *err)
{
    const w16_native_moe_t *m = cuda_moe();
    return m ? m->run_device(moe, p, hidden, M, topk_ids, topk_weights, topk,
                             out, stream, err)
             : unavailable("wna16_cuda_moe_run_device", err);
}

wna16_status_t wna16_cuda_moe_run_batched_device(
    wna16_cuda_moe_t *moe, const wna16_moe_params_t *p, uint64_t hidden,
    int32_t max_tokens, uint64_t expert_num_tokens, uint64_t weights,
    uint64_t out, void *stream, wna16_error_t *err)
{
    const w16_native_moe_t *m = cuda_moe();
    return m ? m->run_batched_device(moe, p, hidden, max_tokens,
                                     expert_num_tokens, weights, out, stream,
                                     err)
             : unavailable("wna16_cuda_moe_run_batched_device", err);
}

wna16_status_t wna16_cuda_moe_sync(wna16_cuda_moe_t *moe, void *stream,
                                   wna16_error_t *err)
{
    const w16_native_moe_t *m = cuda_moe();
    return m ? m->sync(moe, stream, err)
             : unavailable("wna16_cuda_moe_sync", err);
}

void wna16_cuda_moe_last_report(const wna16_cuda_moe_t *moe,
                                wna16_cuda_moe_report_t *out)
{
    const w16_native_moe_t *m = cuda_moe();
    if (m)
        m->last_report(moe, out);
    else if (out) /* no layer can exist: report nothing */
        memset(out, 0, sizeof *out);
}
