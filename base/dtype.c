/*
 * dtype.c - the status and dtype tables (generated from the X-macro lists in
 * wna16.h) and exact float16/bfloat16 conversions.
 */
#include "base/base.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

const char *wna16_version(void) { return WNA16_VERSION_STRING; }

const char *wna16_status_name(wna16_status_t status)
{
    switch (status) {
#define X(name, value, text) case WNA16_##name: return #name;
        WNA16_STATUS_LIST(X)
#undef X
    }
    return "unknown";
}

const char *wna16_status_text(wna16_status_t status)
{
    switch (status) {
#define X(name, value, text) case WNA16_##name: return text;
        WNA16_STATUS_LIST(X)
#undef X
    }
    return "unknown status";
}

static const struct {
    const char *name;
    int bits;
} dtype_table[WNA16_DTYPE_COUNT_] = {
    [WNA16_DTYPE_INVALID] = {NULL, 0},
#define X(name, st, bits, isf) [WNA16_DTYPE_##name] = {st, bits},
    WNA16_DTYPE_LIST(X)
#undef X
};

const char *wna16_dtype_name(wna16_dtype_t d)
{
    if ((int)d <= 0 || d >= WNA16_DTYPE_COUNT_)
        return NULL;
    return dtype_table[d].name;
}

int wna16_dtype_bits(wna16_dtype_t d)
{
    if ((int)d <= 0 || d >= WNA16_DTYPE_COUNT_)
        return 0;
    return dtype_table[d].bits;
}

size_t wna16_dtype_size(wna16_dtype_t d)
{
    int bits = wna16_dtype_bits(d);
    return bits % 8 ? 0 : (size_t)bits / 8;
}

bool wna16_dtype_nbytes(wna16_dtype_t d, uint64_t numel, size_t *out)
{
    uint64_t bits = (uint64_t)wna16_dtype_bits(d);
    if (!bits || (numel && bits > UINT64_MAX / numel))
        return false;
    uint64_t total = numel * bits;
    if (total % 8 || total / 8 > SIZE_MAX)
        return false;
    *out = (size_t)(total / 8);
    return true;
}

wna16_dtype_t wna16_dtype_from_name(const char *name, size_t len)
{
    for (int d = 1; d < WNA16_DTYPE_COUNT_; d++) {
        const char *n = dtype_table[d].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0)
            return (wna16_dtype_t)d;
    }
    return WNA16_DTYPE_INVALID;
}

int64_t wna16_tensor_numel(const wna16_tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ---- float16 / bfloat16 -------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float wna16_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man * 2^-24 is exact in float */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t wna16_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf or nan: keep a quiet nan payload bit */
        return sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0);
    if (a >= 0x477ff000u) /* rounds to >= 65536: overflow to inf */
        return sign | 0x7c00;
    if (a < 0x38800000u) { /* below the smallest normal 2^-14 */
        /* Round a * 2^24 to an integer, ties to even. */
        float v = bits_f32(a) * 0x1p24f;
        return sign | (uint16_t)nearbyintf(v);
    }
    /* normal: round the 13 dropped mantissa bits to nearest even */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float wna16_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t wna16_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* nan stays a quiet nan */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
