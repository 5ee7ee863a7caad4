/*
 * moe_bound.h - how far a fused-MoE kernel's output may lie from the
 * reference's (wna16_ref_moe) under the documented numerics, element by
 * element: the bound `wna16 fuzz --kind moe` (tools/fuzz_moe.c) and the
 * GPU test (tests/cuda/test_moe_cuda.c) check kernels against.
 *
 * A kernel and the reference share every rounding point of the semantics;
 * they differ in (1) the weights: eps_w13 / eps_w2, the relative rounding
 * of (q - z) * s to the activation dtype where a kernel does that (the
 * CUDA tensor-core kernels with grouped scales; 0 where the product is
 * exact), (2) the sums: eps13 / eps2, float32 in any order against the
 * reference's double (K * 2^-23 of the sum of |terms|, plus what a
 * numeric contract adds), (3) the activation in float32 (2^-20 relative
 * plus 2^-21 (1 + |g|)(1 + |u|) absolute, for the cancellations of 1 +
 * erf and 1 + tanh) and (4) the top-k sum in float32 (2^-20 of the
 * terms). Each can flip a rounding to the activation dtype (h or y with
 * round_gemm_outputs, the activation a), which costs one ulp of that
 * value. The bound recomputes every intermediate in double from the
 * dequantized weights and carries these errors through both GEMMs (the
 * activation's sensitivity measured by evaluating it at the perturbed
 * inputs); an output then passes when
 *     |kernel - reference| <= 2 (bound + w16_act_ulp(reference)).
 */
#ifndef W16_MOE_BOUND_H
#define W16_MOE_BOUND_H

#include "base/base.h"

typedef struct w16_moe_bound {
    const wna16_qlayer_t *L;       /* the layer (logical form) */
    const wna16_moe_params_t *p;   /* the activation and its constants */
    wna16_dtype_t act_dtype;       /* F16 or BF16 */
    bool round;                    /* round_gemm_outputs */
    bool gated;                    /* w13 holds gate and up (2 I rows) */
    double eps_w13, eps_w2;        /* (1) above */
    double eps13, eps2;            /* (2) above */
    /* scratch (w16_moe_bound_init / _free): one expert's dequantized
     * weights and one row's intermediates */
    float *w13, *w2;
    double *h, *herr, *a, *aerr;
} w16_moe_bound_t;

/* Allocates b's scratch for L (b->L and b->gated set first); false when
 * out of memory (b's scratch then NULL). */
bool w16_moe_bound_init(w16_moe_bound_t *b);
void w16_moe_bound_free(w16_moe_bound_t *b);

/* Expert e's weights, dequantized by the reference, into the scratch:
 * before the rows of e. */
void w16_moe_bound_expert(w16_moe_bound_t *b, int32_t e);

/* One input row x (H floats, as the reference reads it) through expert e
 * (the one w16_moe_bound_expert loaded) with coefficient cw in the top-k
 * sum: adds |cw| * (the bound on its y) to bound[0 .. H). */
void w16_moe_bound_row(w16_moe_bound_t *b, int32_t e, const float *x,
                       double cw, double *bound);

/* The spacing of activation-dtype numbers at |v| (F16 or BF16). */
double w16_act_ulp(wna16_dtype_t dt, double v);

#endif
