/*
 * scale_xform.c - the scale arithmetic of 8-bit activations (facts sheet
 * 5.8), shared by the reference encoder and the generated repack path so
 * that both store the same bits and refuse the same scale sets with the same
 * words.
 *
 * fp8 multiplies every scale by a power of two in the storage dtype
 * (vLLM: `scales * 512`). int8 stores each scale as an int16 code of its
 * ratio to the operand's largest scale m, computed the way torch computes
 * `(s / s.max() * 4096).round().to(torch.int16)` on an fp16/bf16 tensor:
 * every operation is done in float32 and rounded back to the storage dtype,
 * and the rounding to an integer is half-to-even. The kernel multiplies the
 * codes back by m / 4096, the operand's input_global_scale.
 */
#include "runtime/ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float w16_round_to_dtype(wna16_dtype_t d, float f)
{
    switch (d) {
    case WNA16_DTYPE_F16: return wna16_f16_to_f32(wna16_f32_to_f16(f));
    case WNA16_DTYPE_BF16: return wna16_bf16_to_f32(wna16_f32_to_bf16(f));
    default: return f;
    }
}

bool w16_scale_int16_code(wna16_dtype_t d, float s, float max, int64_t range,
                          int32_t *code)
{
    float q = w16_round_to_dtype(d, s / max);
    float p = w16_round_to_dtype(d, q * (float)range);
    if (!isfinite(p))
        return false;
    /* nearest, ties to even; torch rounds the result to d again, which
     * keeps it: a value of d at or above 2^(mantissa bits) is an integer
     * already, and below that every integer is a value of d */
    float r = rintf(p);
    if (r < -32768.0f || r > 32767.0f)
        return false;
    *code = (int32_t)r;
    return true;
}

float w16_scale_global(float max, int64_t range)
{
    /* vLLM: 1 / 4096 * s.max().float(), an fp32 product */
    return (float)(1.0 / (double)range) * max;
}

uint64_t w16_scale_store(const w16_scale_xform_t *x, wna16_dtype_t d, float s,
                         float max)
{
    float v = w16_round_to_dtype(d, s);
    if (x->int16_range) {
        int32_t code = 0;
        (void)w16_scale_int16_code(d, v, max, x->int16_range, &code);
        return (uint64_t)(uint16_t)(int16_t)code; /* bit-cast into the float */
    }
    if (x->multiply != 1)
        v = w16_round_to_dtype(d, v * (float)x->multiply);
    switch (d) {
    case WNA16_DTYPE_F16: return wna16_f32_to_f16(v);
    case WNA16_DTYPE_BF16: return wna16_f32_to_bf16(v);
    default: {
        uint32_t u;
        memcpy(&u, &v, 4);
        return u;
    }
    }
}

wna16_status_t w16_scale_prepare(const wna16_spec_t *spec,
                                 const w16_scale_xform_t *x, wna16_dtype_t d,
                                 wna16_gemm_t g, const float *scales, size_t n,
                                 bool padded_zero, float *max_out,
                                 wna16_error_t *err)
{
    const char *op = g == WNA16_GEMM_W13 ? "w13" : "w2";
    const char *dn = wna16_dtype_name(d);
    /* Rounding to the dtype is monotonic: the extremes of the stored values
     * are the rounded extremes. */
    float lo = padded_zero ? 0.0f : INFINITY, hi = padded_zero ? 0.0f : -INFINITY;
    float big = 0.0f;
    bool finite = true;
    for (size_t i = 0; i < n; i++) {
        float v = w16_round_to_dtype(d, scales[i]);
        finite = finite && isfinite(v);
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
        big = fmaxf(big, fabsf(v));
    }
    *max_out = hi;
    if (x->multiply != 1 && finite &&
        !isfinite(w16_round_to_dtype(d, big * (float)x->multiply)))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s scale %g times %lld "
                       "overflows %s", spec->name, op, big,
                       (long long)x->multiply, dn);
    if (!x->int16_range)
        return WNA16_OK;
    int32_t code;
    if (!finite || !(hi > 0.0f))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s scales as int16 codes "
                       "need finite scales with a positive maximum; the "
                       "largest is %g", spec->name, op, hi);
    if (!w16_scale_int16_code(d, lo, hi, x->int16_range, &code))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s scale %g is too far "
                       "below the largest (%g) for an int16 code", spec->name, op, lo, hi);
    return WNA16_OK;
}

