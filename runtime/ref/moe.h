/*
 * moe.h - internal pieces shared by the reference fused MoE
 * (runtime/ref/moe_ref.c), the generated one (runtime/moe_gen.c) and the
 * tensor-core one (runtime/cuda/cuda_moe.c), so they accept and refuse the same
 * arguments with the same messages.
 */
#ifndef W16_MOE_H
#define W16_MOE_H

#include "base/base.h"

/* Activation, its swiglu constants and the activation dtype. */
wna16_status_t w16_moe_check_params(const wna16_moe_params_t *p,
                                    wna16_error_t *err);

/* topk in [1, n_ids] and every id of ids[M][topk] in [0, n_ids). */
wna16_status_t w16_moe_check_routing(const int32_t *ids, int32_t M,
                                     int32_t topk, int32_t n_ids,
                                     wna16_error_t *err);

#endif
