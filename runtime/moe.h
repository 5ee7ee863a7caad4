/*
 * moe.h - internal pieces shared by the reference fused MoE
 * (runtime/moe_ref.c) and the generated one (runtime/moe_gen.c), so both
 * accept and refuse the same arguments with the same messages.
 */
#ifndef W16_MOE_H
#define W16_MOE_H

#include "runtime/base/base.h"

/* Activation, its swiglu constants and the activation dtype. */
wna16_status_t w16_moe_check_params(const wna16_moe_params_t *p,
                                    wna16_error_t *err);

#endif
