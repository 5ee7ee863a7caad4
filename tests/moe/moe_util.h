/*
 * moe_util.h - helpers shared by the MoE tests: activation-dtype
 * conversions, uniform random numbers and a random quantized MoE layer in
 * logical form (random bits, group sizes, zero points, act-order g_idx and
 * biases) whose dequantized values are exact in float, so that the tests'
 * own double-precision arithmetic sees the same weights as the library.
 */
#ifndef MOE_UTIL_H
#define MOE_UTIL_H

#include "testutil.h"
#include "wna16.h"

#include <stdbool.h>
#include <stdint.h>

/* Activation dtype <-> float (round to nearest even). */
uint16_t mt_to_act(wna16_dtype_t dt, float v);
float mt_from_act(wna16_dtype_t dt, uint16_t bits);
float mt_round_act(wna16_dtype_t dt, float v);

/* Uniform in [lo, hi). */
double mt_uniform(tu_rng_t *r, double lo, double hi);

/* What mt_random_layer builds. */
typedef struct mt_layer_opts {
    int32_t E, H, I;
    bool gated;     /* w13 N = 2I, else I */
    bool bias;      /* w13 and w2 biases */
} mt_layer_opts_t;

/* A random layer: per operand random bits (4/8), group size (-1 or a
 * divisor of K), zero points or not, g_idx or not; scales are fp16 values
 * about 2^-bits so |W| stays below 1; biases are bf16 values in [-1, 1).
 * Returns 0, or -1 (after printing why) if allocation fails. */
int mt_random_layer(tu_rng_t *r, const mt_layer_opts_t *o,
                    wna16_qlayer_t *L);

/* Random act-dtype values in [lo, hi). */
void mt_random_act(tu_rng_t *r, wna16_dtype_t dt, uint16_t *dst, size_t n,
                   double lo, double hi);

#endif
