/*
 * test_ref_roundtrip.c - every spec, random layers: encode with the
 * reference, decode with the reference, and get exactly the same logical
 * layer back (codes, scales, zero points, g_idx, bias), across bit widths,
 * group sizes (including -1), zero points, act-order, bias and ragged
 * shapes within each spec's rules; refusals must name their reason. The
 * emulation layout holds dequantized values, so it is checked against
 * bf16(bf16(s) * (q - z)) instead.
 */
#include "ref_util.h"

#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;
static tu_rng_t rng;

/* Values exact in fp16 and bf16: m * 2^-j with a 7-bit m. */
static float exact_scale(void)
{
    int m = 1 + (int)tu_rng_below(&rng, 127);
    int j = (int)tu_rng_below(&rng, 10);
    float v = (float)m;
    for (int i = 0; i < j; i++)
        v *= 0.5f;
    return tu_rng_below(&rng, 4) == 0 ? -v : v;
}

static void fill(wna16_qweight_t *q, bool act_order)
{
    size_t n = (size_t)q->E * q->N * q->K;
    for (size_t i = 0; i < n; i++)
        q->codes[i] = (uint8_t)tu_rng_below(&rng, 1u << q->bits);
    size_t ng = (size_t)q->E * q->G * q->N;
    for (size_t i = 0; i < ng; i++) {
        q->scales[i] = exact_scale();
        if (q->zeros)
            q->zeros[i] = (uint8_t)tu_rng_below(&rng, 1u << q->bits);
    }
    if (q->bias)
        for (size_t i = 0; i < (size_t)q->E * q->N; i++)
            q->bias[i] = exact_scale();
    if (act_order && q->g_idx) /* a random group per channel, each used */
        for (int32_t e = 0; e < q->E; e++)
            for (int32_t k = 0; k < q->K; k++)
                q->g_idx[(size_t)e * q->K + k] =
                    k < q->G ? k : (int32_t)tu_rng_below(&rng, (uint32_t)q->G);
}

static int pick(const int *v, int n) { return v[tu_rng_below(&rng, (uint32_t)n)]; }

static bool same_layer(const wna16_qlayer_t *a, const wna16_qlayer_t *b,
                       const wna16_quant_desc_t *q, const char *what)
{
    const wna16_qweight_t *x[2] = {&a->w13, &a->w2}, *y[2] = {&b->w13, &b->w2};
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)x[i]->E * x[i]->N * x[i]->K;
        size_t ng = (size_t)x[i]->E * x[i]->G * x[i]->N;
        bool ok = memcmp(x[i]->codes, y[i]->codes, n) == 0 &&
                  memcmp(x[i]->scales, y[i]->scales, ng * sizeof(float)) == 0;
        if (q->zero_point)
            ok = ok && memcmp(x[i]->zeros, y[i]->zeros, ng) == 0;
        if (q->act_order)
            ok = ok && memcmp(x[i]->g_idx, y[i]->g_idx,
                              (size_t)x[i]->E * x[i]->K * sizeof(int32_t)) == 0;
        if (q->bias)
            ok = ok && memcmp(x[i]->bias, y[i]->bias,
                              (size_t)x[i]->E * x[i]->N * sizeof(float)) == 0;
        TU_CHECK_MSG(ok, "%s: %s differs after the round trip", what,
                     i ? "w2" : "w13");
        if (!ok)
            return false;
    }
    return true;
}

/* Emulation: each stored bf16 equals bf16(bf16(s) * (q - z)). */
static void check_emulation(const wna16_qlayer_t *L, const wna16_tensor_set_t *t,
                            const char *what)
{
    const wna16_qweight_t *qs[2] = {&L->w13, &L->w2};
    const char *names[2] = {"w13_weight", "w2_weight"};
    for (int i = 0; i < 2; i++) {
        const wna16_tensor_t *w = wna16_tensor_set_find(t, names[i]);
        TU_CHECK(w != NULL);
        if (!w)
            return;
        const wna16_qweight_t *q = qs[i];
        const uint16_t *v = w->data;
        for (int probe = 0; probe < 200; probe++) {
            int32_t e = (int32_t)tu_rng_below(&rng, (uint32_t)q->E);
            int32_t n = (int32_t)tu_rng_below(&rng, (uint32_t)q->N);
            int32_t k = (int32_t)tu_rng_below(&rng, (uint32_t)q->K);
            int32_t g = q->group_size > 0 ? k / q->group_size : 0;
            size_t gi = ((size_t)e * q->G + g) * q->N + n;
            float s = wna16_bf16_to_f32(wna16_f32_to_bf16(q->scales[gi]));
            int z = q->zeros ? q->zeros[gi] : 1 << (q->bits - 1);
            uint16_t want = wna16_f32_to_bf16(
                (float)(q->codes[((size_t)e * q->N + n) * q->K + k] - z) * s);
            uint16_t got = v[((size_t)e * q->N + n) * q->K + k];
            TU_CHECK_MSG(got == want, "%s: %s[%d][%d][%d] = %04x, want %04x",
                         what, names[i], e, n, k, got, want);
        }
    }
}

/* One random configuration of one spec; returns 1 if it round-tripped, 0 if
 * the spec refused it (with a reason). */
static int one(const wna16_spec_t *s)
{
    const w16_capabilities_t *c = &s->caps;
    static const int any_gs[] = {-1, 32, 64, 128};
    static const int sizes[] = {32, 64, 96, 128, 160, 192, 256};
    wna16_quant_desc_t q = {0};
    q.bits = pick(c->bits, c->n_bits);
    q.group_size = c->n_group_sizes ? pick(c->group_sizes, c->n_group_sizes)
                                    : pick(any_gs, 4);
    q.zero_point = c->zero_points && tu_rng_below(&rng, 2);
    q.act_order = c->act_order && q.group_size > 0 && tu_rng_below(&rng, 3) == 0;
    q.bias = c->bias && tu_rng_below(&rng, 3) == 0;
    int32_t E = 1 + (int32_t)tu_rng_below(&rng, 3);
    int32_t H = sizes[tu_rng_below(&rng, 7)];
    int32_t I = sizes[tu_rng_below(&rng, 7)];
    if (tu_rng_below(&rng, 4) == 0) /* ragged sizes for the specs allowing them */
        I = 8 * (1 + (int32_t)tu_rng_below(&rng, 40));
    if (tu_rng_below(&rng, 3) == 0) { /* large tiles (FlashInfer's 256) */
        H = 256;
        I = 256;
    }
    if (q.group_size > 0 && (H % q.group_size || I % q.group_size))
        return 0;

    wna16_qlayer_t L = {.E = E, .H = H, .I = I};
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(&L.w13, E, 2 * I, H, q.bits, q.group_size,
                              q.zero_point, q.act_order, q.bias, &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, E, H, I, q.bits, q.group_size,
                              q.zero_point, q.act_order, q.bias, &err), &err);
    wna16_dtype_t sd = tu_rng_below(&rng, 2) ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
    L.w13.scale_dtype = L.w2.scale_dtype = sd;
    L.w13.bias_dtype = L.w2.bias_dtype = sd;
    fill(&L.w13, q.act_order);
    fill(&L.w2, q.act_order);
    char what[160];
    snprintf(what, sizeof what, "%s E=%d H=%d I=%d b%d g%d zp%d ao%d bias%d",
             s->name, E, H, I, q.bits, q.group_size, q.zero_point, q.act_order,
             q.bias);

    wna16_tensor_set_t *t = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &t, &err), &err);
    int ok = 0;
    wna16_status_t st = wna16_ref_encode(ctx, s, &L, "layer", t, &err);
    if (st == WNA16_EUNSUPPORTED) {
        TU_CHECK_MSG(strlen(err.message) > 10, "%s: refusal without a reason",
                     what);
    } else if (st != WNA16_OK) {
        TU_CHECK_MSG(false, "%s: encode: %s", what, err.message);
    } else if (s->layouts[W16_ROLE_WEIGHT]) {
        wna16_tensor_set_t *t2 = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &t2, &err), &err);
        TU_OK(wna16_ref_encode(ctx, s, &L, "", t2, &err), &err);
        check_emulation(&L, t2, what);
        wna16_tensor_set_destroy(t2);
        ok = 1;
    } else {
        wna16_qlayer_t back;
        st = wna16_ref_decode(ctx, s, t, "layer", E, H, I, &q, &back, &err);
        TU_CHECK_MSG(st == WNA16_OK, "%s: decode: %s", what, err.message);
        if (st == WNA16_OK) {
            ok = same_layer(&L, &back, &q, what);
            wna16_qlayer_free(&back);
        }
    }
    wna16_tensor_set_destroy(t);
    wna16_qlayer_free(&L);
    return ok;
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x5eed;
    tu_rng_seed(&rng, seed);
    ctx = tu_context();
    int total = 0;
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        int good = 0, tries = 0;
        while (good < 25 && tries < 2000) {
            good += one(s);
            tries++;
        }
        printf("%-20s %d configurations round-tripped (%d tried)\n", s->name,
               good, tries);
        TU_CHECK_MSG(good >= 25, "%s: only %d configurations", s->name, good);
        total += good;
    }
    printf("%d configurations in all (seed %#llx)\n", total,
           (unsigned long long)seed);
    wna16_context_destroy(ctx);
    return tu_finish("test_ref_roundtrip");
}
