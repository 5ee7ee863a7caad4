/*
 * qweight.c - the dense logical form of a quantized operand: allocation,
 * the group of an input channel, the reference dequantization and the
 * padding vLLM applies to the intermediate size.
 */
#include "runtime/ref/ref.h"

#include <stdlib.h>
#include <string.h>

static void *zalloc(size_t n, size_t size)
{
    return n ? calloc(n, size) : calloc(1, 1);
}

wna16_status_t wna16_qweight_alloc(wna16_qweight_t *qw, int32_t E, int32_t N,
                                   int32_t K, int32_t bits, int32_t group_size,
                                   bool has_zeros, bool has_g_idx,
                                   bool has_bias, wna16_error_t *err)
{
    memset(qw, 0, sizeof *qw);
    if (E < 1 || N < 1 || K < 1)
        return w16_err(err, WNA16_EINVAL, "qweight: E, N and K must be "
                       "positive (got %d, %d, %d)", E, N, K);
    if (bits != 4 && bits != 8)
        return w16_err(err, WNA16_EINVAL, "qweight: %d-bit codes (4 or 8)",
                       bits);
    if (group_size == 0 || group_size < -1 ||
        (group_size > 0 && K % group_size != 0))
        return w16_err(err, WNA16_EINVAL, "qweight: group size %d does not "
                       "divide K = %d", group_size, K);
    int32_t G = group_size > 0 ? K / group_size : 1;
    size_t enk = (size_t)E * (size_t)N * (size_t)K;
    size_t egn = (size_t)E * (size_t)G * (size_t)N;
    *qw = (wna16_qweight_t){.E = E, .N = N, .K = K, .G = G, .bits = bits,
                            .group_size = group_size,
                            .scale_dtype = WNA16_DTYPE_F16,
                            .bias_dtype = WNA16_DTYPE_F16};
    qw->codes = zalloc(enk, 1);
    qw->scales = zalloc(egn, sizeof(float));
    if (has_zeros)
        qw->zeros = zalloc(egn, 1);
    if (has_g_idx)
        qw->g_idx = zalloc((size_t)E * (size_t)K, sizeof(int32_t));
    if (has_bias)
        qw->bias = zalloc((size_t)E * (size_t)N, sizeof(float));
    if (!qw->codes || !qw->scales || (has_zeros && !qw->zeros) ||
        (has_g_idx && !qw->g_idx) || (has_bias && !qw->bias)) {
        wna16_qweight_free(qw);
        return w16_err(err, WNA16_ENOMEM, "out of memory allocating a "
                       "%dx%dx%d operand", E, N, K);
    }
    if (qw->g_idx)
        for (int32_t e = 0; e < E; e++)
            for (int32_t k = 0; k < K; k++)
                qw->g_idx[(size_t)e * K + k] = group_size > 0 ? k / group_size : 0;
    return WNA16_OK;
}

void wna16_qweight_free(wna16_qweight_t *qw)
{
    if (!qw)
        return;
    free(qw->codes);
    free(qw->scales);
    free(qw->zeros);
    free(qw->g_idx);
    free(qw->bias);
    free(qw->stored_zeros);
    memset(qw, 0, sizeof *qw);
}

void wna16_qlayer_free(wna16_qlayer_t *layer)
{
    if (!layer)
        return;
    wna16_qweight_free(&layer->w13);
    wna16_qweight_free(&layer->w2);
}

int32_t wna16_qweight_group(const wna16_qweight_t *qw, int32_t e, int32_t k)
{
    if (qw->g_idx)
        return qw->g_idx[(size_t)e * qw->K + k];
    return qw->group_size > 0 ? k / qw->group_size : 0;
}

float wna16_ref_dequant(const wna16_qweight_t *qw, int32_t e, int32_t n,
                        int32_t k)
{
    int32_t g = wna16_qweight_group(qw, e, k);
    size_t gi = ((size_t)e * qw->G + (size_t)g) * qw->N + (size_t)n;
    int32_t q = qw->codes[((size_t)e * qw->N + n) * qw->K + k];
    int32_t z = qw->zeros ? qw->zeros[gi] : (1 << (qw->bits - 1));
    return (float)(q - z) * qw->scales[gi];
}

/* ---- padding ------------------------------------------------------------- */

/* Maps an unpadded index to its padded position: w13 rows are two shards
 * of width I placed at multiples of IP; w2 keeps indices (pads at the end). */
static int32_t padded_n(wna16_gemm_t gemm, int32_t n, int32_t I, int32_t IP)
{
    return gemm == WNA16_GEMM_W13 ? (n / I) * IP + n % I : n;
}

static wna16_status_t pad_copy(wna16_context_t *ctx, const wna16_qweight_t *s,
                               wna16_gemm_t gemm, int32_t I, int32_t IP,
                               bool to_padded, wna16_qweight_t *d,
                               wna16_error_t *err)
{
    (void)ctx;
    bool w13 = gemm == WNA16_GEMM_W13;
    int32_t N = w13 ? (to_padded ? s->N / I * IP : s->N / IP * I) : s->N;
    int32_t K = w13 ? s->K : (to_padded ? IP : I);
    if ((w13 && s->N % (to_padded ? I : IP) != 0) ||
        (!w13 && s->K != (to_padded ? I : IP)))
        return w16_err(err, WNA16_EINVAL, "padding: operand %dx%d does not "
                       "match I = %d, IP = %d", s->N, s->K, I, IP);
    if (s->group_size > 0 && K % s->group_size != 0)
        return w16_err(err, WNA16_EUNSUPPORTED, "padding: group size %d does "
                       "not divide the padded size %d", s->group_size, K);
    wna16_status_t st = wna16_qweight_alloc(d, s->E, N, K, s->bits,
                                            s->group_size, s->zeros != NULL,
                                            s->g_idx != NULL, s->bias != NULL,
                                            err);
    if (st != WNA16_OK)
        return st;
    d->g_idx_stored = s->g_idx_stored;
    if (s->stored_zeros) {
        d->stored_zeros = calloc((size_t)d->E * d->G * d->N, 1);
        if (!d->stored_zeros) {
            wna16_qweight_free(d);
            return w16_err(err, WNA16_ENOMEM, "out of memory padding zeros");
        }
    }
    d->scale_dtype = s->scale_dtype;
    d->bias_dtype = s->bias_dtype;
    memset(d->scales, 0, sizeof(float) * (size_t)d->E * d->G * d->N);
    /* Iterate over the unpadded operand and copy to / from the padded one. */
    const wna16_qweight_t *un = to_padded ? s : d;
    const wna16_qweight_t *pd = to_padded ? d : s;
    for (int32_t e = 0; e < un->E; e++) {
        for (int32_t n = 0; n < un->N; n++) {
            int32_t pn = padded_n(gemm, n, I, IP);
            for (int32_t k = 0; k < un->K; k++) {
                size_t ui = ((size_t)e * un->N + n) * un->K + k;
                size_t pi = ((size_t)e * pd->N + pn) * pd->K + k;
                if (to_padded)
                    d->codes[pi] = s->codes[ui];
                else
                    d->codes[ui] = s->codes[pi];
            }
            for (int32_t g = 0; g < un->G; g++) {
                size_t ui = ((size_t)e * un->G + g) * un->N + n;
                size_t pi = ((size_t)e * pd->G + g) * pd->N + pn;
                if (to_padded) {
                    d->scales[pi] = s->scales[ui];
                    if (s->zeros)
                        d->zeros[pi] = s->zeros[ui];
                    if (s->stored_zeros)
                        d->stored_zeros[pi] = s->stored_zeros[ui];
                } else {
                    d->scales[ui] = s->scales[pi];
                    if (s->zeros)
                        d->zeros[ui] = s->zeros[pi];
                    if (s->stored_zeros)
                        d->stored_zeros[ui] = s->stored_zeros[pi];
                }
            }
            if (s->bias) {
                size_t ui = (size_t)e * un->N + n, pi = (size_t)e * pd->N + pn;
                if (to_padded)
                    d->bias[pi] = s->bias[ui];
                else
                    d->bias[ui] = s->bias[pi];
            }
        }
        if (s->g_idx)
            for (int32_t k = 0; k < un->K; k++) {
                size_t ui = (size_t)e * un->K + k, pi = (size_t)e * pd->K + k;
                if (to_padded)
                    d->g_idx[pi] = s->g_idx[ui];
                else
                    d->g_idx[ui] = s->g_idx[pi];
            }
    }
    return WNA16_OK;
}

wna16_status_t w16_qweight_pad(wna16_context_t *ctx, const wna16_qweight_t *src,
                               wna16_gemm_t gemm, int32_t I, int32_t IP,
                               wna16_qweight_t *dst, wna16_error_t *err)
{
    return pad_copy(ctx, src, gemm, I, IP, true, dst, err);
}

wna16_status_t w16_qweight_unpad(wna16_context_t *ctx,
                                 const wna16_qweight_t *src, wna16_gemm_t gemm,
                                 int32_t I, int32_t IP, wna16_qweight_t *dst,
                                 wna16_error_t *err)
{
    return pad_copy(ctx, src, gemm, I, IP, false, dst, err);
}

/* ---- act-order ----------------------------------------------------------- */

void w16_sort_g_idx(const int32_t *g_idx, int32_t E, int32_t K, int32_t G,
                    int32_t *perm)
{
    for (int32_t e = 0; e < E; e++) {
        const int32_t *g = g_idx + (size_t)e * K;
        int32_t *p = perm + (size_t)e * K;
        int32_t n = 0;
        /* counting sort by group: stable, and g_idx values are < G */
        for (int32_t grp = 0; grp < G; grp++)
            for (int32_t k = 0; k < K; k++)
                if (g[k] == grp)
                    p[n++] = k;
        for (int32_t k = 0; k < K && n < K; k++) /* out-of-range groups last */
            if (g[k] < 0 || g[k] >= G)
                p[n++] = k;
    }
}

wna16_status_t w16_qweight_sorted(const wna16_qweight_t *s, wna16_qweight_t *d,
                                  int32_t **perm, wna16_error_t *err)
{
    *perm = NULL;
    wna16_status_t st = wna16_qweight_alloc(d, s->E, s->N, s->K, s->bits,
                                            s->group_size, s->zeros != NULL,
                                            true, s->bias != NULL, err);
    if (st != WNA16_OK)
        return st;
    size_t ek = (size_t)s->E * s->K, egn = (size_t)s->E * s->G * s->N;
    int32_t *p = malloc(sizeof(int32_t) * (ek ? ek : 1));
    if (s->stored_zeros)
        d->stored_zeros = malloc(egn);
    if (!p || (s->stored_zeros && !d->stored_zeros)) {
        free(p);
        wna16_qweight_free(d);
        return w16_err(err, WNA16_ENOMEM, "out of memory sorting act-order");
    }
    d->scale_dtype = s->scale_dtype;
    d->bias_dtype = s->bias_dtype;
    d->g_idx_stored = s->g_idx_stored;
    w16_sort_g_idx(s->g_idx, s->E, s->K, s->G, p);
    for (int32_t e = 0; e < s->E; e++) {
        const int32_t *pe = p + (size_t)e * s->K;
        for (int32_t k = 0; k < s->K; k++)
            d->g_idx[(size_t)e * s->K + k] = s->g_idx[(size_t)e * s->K + pe[k]];
        for (int32_t n = 0; n < s->N; n++) {
            const uint8_t *from = s->codes + ((size_t)e * s->N + n) * s->K;
            uint8_t *to = d->codes + ((size_t)e * s->N + n) * s->K;
            for (int32_t k = 0; k < s->K; k++)
                to[k] = from[pe[k]];
        }
    }
    memcpy(d->scales, s->scales, sizeof(float) * egn);
    if (s->zeros)
        memcpy(d->zeros, s->zeros, egn);
    if (s->stored_zeros)
        memcpy(d->stored_zeros, s->stored_zeros, egn);
    if (s->bias)
        memcpy(d->bias, s->bias, sizeof(float) * (size_t)s->E * s->N);
    *perm = p;
    return WNA16_OK;
}

wna16_status_t w16_qweight_unsort(wna16_qweight_t *qw, const int32_t *perm,
                                  wna16_error_t *err)
{
    int32_t K = qw->K;
    uint8_t *row = malloc((size_t)K ? (size_t)K : 1);
    int32_t *g = malloc(sizeof(int32_t) * ((size_t)K ? (size_t)K : 1));
    if (!row || !g) {
        free(row);
        free(g);
        return w16_err(err, WNA16_ENOMEM, "out of memory undoing act-order");
    }
    for (int32_t e = 0; e < qw->E; e++) {
        const int32_t *pe = perm + (size_t)e * K;
        if (qw->g_idx) {
            for (int32_t k = 0; k < K; k++)
                g[pe[k]] = qw->g_idx[(size_t)e * K + k];
            memcpy(qw->g_idx + (size_t)e * K, g, sizeof(int32_t) * (size_t)K);
        }
        for (int32_t n = 0; n < qw->N; n++) {
            uint8_t *c = qw->codes + ((size_t)e * qw->N + n) * K;
            for (int32_t k = 0; k < K; k++)
                row[pe[k]] = c[k];
            memcpy(c, row, (size_t)K);
        }
    }
    free(row);
    free(g);
    return WNA16_OK;
}

float w16_model_round(wna16_dtype_t model, float v)
{
    return model == WNA16_DTYPE_F16    ? wna16_f16_to_f32(wna16_f32_to_f16(v))
           : model == WNA16_DTYPE_BF16 ? wna16_bf16_to_f32(wna16_f32_to_bf16(v))
                                       : v;
}

void w16_qweight_cast(wna16_qweight_t *qw, wna16_dtype_t model)
{
    if (model != WNA16_DTYPE_F16 && model != WNA16_DTYPE_BF16)
        return;
    size_t ns = (size_t)qw->E * (size_t)qw->G * (size_t)qw->N;
    for (size_t i = 0; qw->scales && i < ns; i++)
        qw->scales[i] = w16_model_round(model, qw->scales[i]);
    size_t nb = (size_t)qw->E * (size_t)qw->N;
    for (size_t i = 0; qw->bias && i < nb; i++)
        qw->bias[i] = w16_model_round(model, qw->bias[i]);
    qw->scale_dtype = model;
    if (qw->bias)
        qw->bias_dtype = model;
}
