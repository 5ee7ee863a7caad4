/*
 * moe_util.c - helpers shared by the MoE tests (see moe_util.h): dtype
 * conversions, random numbers and random quantized layers.
 */
#include "moe_util.h"

#include <stdio.h>

uint16_t mt_to_act(wna16_dtype_t dt, float v)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v) : wna16_f32_to_bf16(v);
}

float mt_from_act(wna16_dtype_t dt, uint16_t bits)
{
    return dt == WNA16_DTYPE_F16 ? wna16_f16_to_f32(bits)
                                 : wna16_bf16_to_f32(bits);
}

float mt_round_act(wna16_dtype_t dt, float v)
{
    return mt_from_act(dt, mt_to_act(dt, v));
}

double mt_uniform(tu_rng_t *r, double lo, double hi)
{
    double u = (double)(tu_rng_next(r) >> 11) * 0x1p-53;
    return lo + (hi - lo) * u;
}

/* -1 or a random divisor of K (small groups so several groups exist). */
static int32_t random_group_size(tu_rng_t *r, int32_t K)
{
    static const int32_t choices[] = {1, 2, 3, 4, 8, 16};
    if (tu_rng_below(r, 3) == 0)
        return -1;
    int32_t gs = choices[tu_rng_below(r, 6)];
    return K % gs == 0 ? gs : -1;
}

static int random_operand(tu_rng_t *r, wna16_qweight_t *qw, int32_t E,
                          int32_t N, int32_t K, bool bias)
{
    int32_t bits = tu_rng_below(r, 2) ? 4 : 8;
    int32_t gs = random_group_size(r, K);
    bool zeros = tu_rng_below(r, 2), gidx = tu_rng_below(r, 3) == 0;
    wna16_error_t err;
    if (wna16_qweight_alloc(qw, E, N, K, bits, gs, zeros, gidx, bias, &err) !=
        WNA16_OK) {
        fprintf(stderr, "qweight_alloc: %s\n", err.message);
        return -1;
    }
    size_t ncodes = (size_t)E * N * K, ngroups = (size_t)E * qw->G * N;
    for (size_t i = 0; i < ncodes; i++)
        qw->codes[i] = (uint8_t)tu_rng_below(r, 1u << bits);
    /* fp16 scales times |q - z| < 2^bits: exact in float, |W| < 1. */
    for (size_t i = 0; i < ngroups; i++)
        qw->scales[i] = wna16_f16_to_f32(wna16_f32_to_f16(
            (float)mt_uniform(r, 0.25, 0.5) / (float)(1 << (bits - 1))));
    if (zeros)
        for (size_t i = 0; i < ngroups; i++)
            qw->zeros[i] = (uint8_t)tu_rng_below(r, 1u << bits);
    if (gidx)
        for (size_t i = 0; i < (size_t)E * K; i++)
            qw->g_idx[i] = (int32_t)tu_rng_below(r, (uint32_t)qw->G);
    if (bias) {
        qw->bias_dtype = WNA16_DTYPE_BF16;
        for (size_t i = 0; i < (size_t)E * N; i++)
            qw->bias[i] = mt_round_act(WNA16_DTYPE_BF16,
                                       (float)mt_uniform(r, -1.0, 1.0));
    }
    return 0;
}

int mt_random_layer(tu_rng_t *r, const mt_layer_opts_t *o, wna16_qlayer_t *L)
{
    *L = (wna16_qlayer_t){.E = o->E, .H = o->H, .I = o->I};
    int32_t N13 = o->gated ? 2 * o->I : o->I;
    if (random_operand(r, &L->w13, o->E, N13, o->H, o->bias) != 0 ||
        random_operand(r, &L->w2, o->E, o->H, o->I, o->bias) != 0) {
        wna16_qlayer_free(L);
        return -1;
    }
    return 0;
}

void mt_random_act(tu_rng_t *r, wna16_dtype_t dt, uint16_t *dst, size_t n,
                   double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mt_to_act(dt, (float)mt_uniform(r, lo, hi));
}
