/*
 * moe_bound.c - see moe_bound.h: the error bound of a fused-MoE kernel's
 * outputs against the reference, carried through both GEMMs in double.
 */
#include "runtime/ref/moe_bound.h"
#include "runtime/ref/ref.h"

#include <math.h>
#include <stdlib.h>

double w16_act_ulp(wna16_dtype_t dt, double v)
{
    int p = dt == WNA16_DTYPE_F16 ? 11 : 8;
    double tiny = dt == WNA16_DTYPE_F16 ? 0x1p-24 : 0x1p-133;
    int ex = 0;
    frexp(fabs(v), &ex);
    double u = v == 0.0 ? tiny : ldexp(1.0, ex - p);
    return u < tiny ? tiny : u;
}

static int32_t n13(const w16_moe_bound_t *b)
{
    return b->gated ? 2 * b->L->I : b->L->I;
}

bool w16_moe_bound_init(w16_moe_bound_t *b)
{
    const int32_t H = b->L->H, I = b->L->I, N13 = n13(b);
    b->w13 = malloc((size_t)N13 * H * sizeof(float));
    b->w2 = malloc((size_t)H * I * sizeof(float));
    b->h = malloc(((size_t)N13 * 2 + (size_t)I * 2) * sizeof(double));
    if (!b->w13 || !b->w2 || !b->h) {
        w16_moe_bound_free(b);
        return false;
    }
    b->herr = b->h + N13;
    b->a = b->h + 2 * (size_t)N13;
    b->aerr = b->a + I;
    return true;
}

void w16_moe_bound_free(w16_moe_bound_t *b)
{
    free(b->w13);
    free(b->w2);
    free(b->h);
    b->w13 = b->w2 = NULL;
    b->h = b->herr = b->a = b->aerr = NULL;
}

void w16_moe_bound_expert(w16_moe_bound_t *b, int32_t e)
{
    const wna16_qlayer_t *L = b->L;
    for (int32_t n = 0; n < n13(b); n++)
        for (int32_t k = 0; k < L->H; k++)
            b->w13[(size_t)n * L->H + k] = wna16_ref_dequant(&L->w13, e, n, k);
    for (int32_t n = 0; n < L->H; n++)
        for (int32_t k = 0; k < L->I; k++)
            b->w2[(size_t)n * L->I + k] = wna16_ref_dequant(&L->w2, e, n, k);
}

static double act_d(const wna16_moe_params_t *p, double g, double u)
{
    return (double)wna16_ref_activation(p, (float)g, (float)u);
}

void w16_moe_bound_row(w16_moe_bound_t *b, int32_t e, const float *x,
                       double cw, double *bound)
{
    const int32_t H = b->L->H, I = b->L->I, N13 = n13(b);
    const wna16_dtype_t dt = b->act_dtype;
    for (int32_t n = 0; n < N13; n++) {
        const float *w = b->w13 + (size_t)n * H;
        double s = 0, m = 0;
        for (int32_t k = 0; k < H; k++) {
            s += (double)x[k] * w[k];
            m += fabs((double)x[k] * w[k]);
        }
        if (b->L->w13.bias) {
            double bb = b->L->w13.bias[(size_t)e * N13 + n];
            s += bb;
            m += fabs(bb);
        }
        b->h[n] = b->round ? w16_round_to_dtype(dt, (float)s) : s;
        b->herr[n] = (b->eps_w13 + b->eps13) * m + 0x1p-24 * fabs(s) +
                     (b->round ? w16_act_ulp(dt, s) : 0.0);
    }
    for (int32_t i = 0; i < I; i++) {
        double g = b->h[i], u = b->gated ? b->h[I + i] : 0.0;
        double eg = b->herr[i], eu = b->gated ? b->herr[I + i] : 0.0;
        double a = act_d(b->p, g, u), da = 0;
        for (int s = -1; s <= 1; s += 2) {
            double d1 = fabs(act_d(b->p, g + s * eg, u) - a);
            double d2 = fabs(act_d(b->p, g, u + s * eu) - a);
            double d3 = fabs(act_d(b->p, g + s * eg, u + s * eu) - a);
            double d4 = fabs(act_d(b->p, g + s * eg, u - s * eu) - a);
            double dm = d1 + d2 > d3 ? d1 + d2 : d3;
            dm = dm > d4 ? dm : d4;
            da = da > dm ? da : dm;
        }
        b->a[i] = w16_round_to_dtype(dt, (float)a);
        /* float32 math (expf, erff, tanhf: a few ulp, absolute near the
         * cancellations of 1 + erf / 1 + tanh) */
        b->aerr[i] = 2.0 * da + w16_act_ulp(dt, a) + 0x1p-20 * fabs(a) +
                     0x1p-21 * (1.0 + fabs(g)) * (1.0 + fabs(u));
    }
    for (int32_t n = 0; n < H; n++) {
        const float *w = b->w2 + (size_t)n * I;
        double s = 0, m = 0, prop = 0;
        for (int32_t i = 0; i < I; i++) {
            s += b->a[i] * w[i];
            m += fabs(b->a[i] * w[i]);
            prop += fabs((double)w[i]) * b->aerr[i];
        }
        if (b->L->w2.bias) {
            double bb = b->L->w2.bias[(size_t)e * H + n];
            s += bb;
            m += fabs(bb);
        }
        double ey = (b->eps_w2 + b->eps2) * m + prop + 0x1p-24 * fabs(s) +
                    (b->round ? w16_act_ulp(dt, s) : 0.0);
        /* + the float32 sum over top-k */
        bound[n] += fabs(cw) * (ey + 0x1p-20 * m);
    }
}
