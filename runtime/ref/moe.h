/*
 * moe.h - internal pieces shared by the reference fused MoE
 * (runtime/ref/moe_ref.c), the generated one (runtime/moe_gen.c) and the
 * tensor-core one (runtime/cuda/cuda_moe.c), so they accept and refuse the same
 * arguments with the same messages.
 */
#ifndef W16_MOE_H
#define W16_MOE_H

#include "base/base.h"

struct w16_layout; /* spec/spec.h */

/* Activation, its swiglu constants and the activation dtype. */
wna16_status_t w16_moe_check_params(const wna16_moe_params_t *p,
                                    wna16_error_t *err);

/* The model's dtype a fused MoE is created with
 * (wna16_quant_desc_t.model_dtype): WNA16_DTYPE_INVALID, F16 or BF16. */
wna16_status_t w16_moe_check_model_dtype(wna16_dtype_t model,
                                         wna16_error_t *err);
/* At creation: tensor t (`name`), stored in `layout`, holds the model's
 * dtype when the layout follows it (vLLM keeps scales and biases in the
 * model's dtype); model 0: nothing to check. */
wna16_status_t w16_moe_check_tensor_dtype(const struct w16_layout *layout,
                                          wna16_dtype_t model,
                                          const char *name, wna16_dtype_t dt,
                                          wna16_error_t *err);
/* At every run: the activations are in the layer's model dtype, as vLLM's
 * kernels take them (bf16 activations with bf16 scales, fp16 with fp16);
 * a mismatch is refused, never converted. model 0: any. */
wna16_status_t w16_moe_check_act_dtype(wna16_dtype_t model,
                                       const wna16_moe_params_t *p,
                                       wna16_error_t *err);

/* The generated fused MoE's calls that were routed and run on the target
 * (moe_orch DEVICE: the routing kernel, no host routing); 0 on a target
 * that routes on the host. For tests and reports. */
uint64_t w16_moe_layer_device_calls(const wna16_moe_layer_t *L);

/* topk in [1, n_ids] and every id of ids[M][topk] in [0, n_ids). */
wna16_status_t w16_moe_check_routing(const int32_t *ids, int32_t M,
                                     int32_t topk, int32_t n_ids,
                                     wna16_error_t *err);

#endif
