/*
 * test_ref_a8.c - Marlin with 8-bit activations (facts sheet 5.4 last
 * paragraph, 5.6 step 2, 5.8) through the spec and the reference: the
 * 32x32 tiles of 4- and 8-bit codes (the sheet's word 0 and words computed
 * from vLLM's get_weight_perm/marlin_weights recipe for is_a_8bit), the fp8
 * code remap with and without zero points, zero points without the
 * interleave, scales in the single permutation, times 512 (fp8) or as int16
 * codes with the fp32 input_global_scale (int8), and what is refused.
 */
#include "ref_util.h"

#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;

#define CODE(o, n, k) (o).qw.codes[((size_t)(n)) * (o).qw.K + (k)]

/* A Marlin w13 operand with K = H = 32 and N = 2 * 64 (one row of 32x32
 * tiles, four of them). */
static w16_problem_t a8_problem(int bits, int a8)
{
    return (w16_problem_t){1, 32, 64, bits, -1, false, false, false, false,
                           false, a8};
}

static void check_words(const wna16_tensor_t *t, const char *what,
                        const size_t *at, const uint32_t *want, int n)
{
    for (int i = 0; t && i < n; i++)
        TU_CHECK_MSG(ru_word(t, at[i]) == want[i], "%s: word %zu is %08x, "
                     "want %08x", what, at[i], ru_word(t, at[i]), want[i]);
}

static void tiles_4bit(void)
{
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, a8_problem(4, 1));
    TU_CHECK(o.vars[W16_VAR_K] == 32 && o.vars[W16_VAR_N] == 128);
    /* "Word 0 holds (0,0) (16,0) (1,0) (17,0) (2,0) (18,0) (3,0) (19,0)":
     * codes 0..7 there make the word 0x76543210. */
    static const int rows[8] = {0, 16, 1, 17, 2, 18, 3, 19};
    for (int i = 0; i < 8; i++)
        CODE(o, 0, rows[i]) = (uint8_t)i;
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t) {
        TU_CHECK(t->ndim == 3 && t->shape[1] == 2 && t->shape[2] == 256);
        TU_CHECK_MSG(ru_word(t, 0) == 0x76543210u, "word 0: %08x",
                     ru_word(t, 0));
    }
    const w16_layout_t *l = o.spec->layouts[W16_ROLE_QWEIGHT];
    for (int i = 0; i < 8; i++) {
        int64_t c[3] = {0, 0, rows[i]}, idx[3], bit;
        w16_eval_error_t e;
        TU_CHECK(w16_layout_locate(l, o.vars, c, idx, &bit, &e));
        TU_CHECK_MSG(idx[1] == 0 && idx[2] == 0 && bit == 4 * i,
                     "(%d,0) -> [%lld][%lld] bit %lld", rows[i],
                     (long long)idx[1], (long long)idx[2], (long long)bit);
    }
    /* Words computed from vLLM's is_a_8bit recipe (get_weight_perm with the
     * [0,4,1,5,2,6,3,7] interleave over (K/32, 32, N/16, 16) sub-tiles). */
    static const size_t at[7] = {0, 1, 2, 3, 4, 127, 128};
    for (int n = 0; n < 128; n++)
        for (int k = 0; k < 32; k++)
            CODE(o, n, k) = (uint8_t)((k + n / 8) % 16);
    static const uint32_t want1[7] = {0x33221100u, 0x44332211u, 0x55443322u,
                                      0x66554433u, 0x77665544u, 0x221100ffu,
                                      0x77665544u};
    check_words(ru_encode(&o, W16_ROLE_QWEIGHT), "(k + n/8) % 16", at, want1, 7);
    for (int n = 0; n < 128; n++)
        for (int k = 0; k < 32; k++)
            CODE(o, n, k) = (uint8_t)((k + n) % 16);
    static const uint32_t want2[5] = {0x33221100u, 0xbbaa9988u, 0x33221100u,
                                      0xbbaa9988u, 0x77665544u};
    check_words(ru_encode(&o, W16_ROLE_QWEIGHT), "(k + n) % 16", at, want2, 5);
    ru_operand_free(&o);
}

static void tiles_8bit(void)
{
    /* 8-bit codes: no kernel takes them with 8-bit activations (the spec's
     * rule refuses the layer), but vLLM's repack defines their tiles. */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, a8_problem(8, 1));
    for (int n = 0; n < 128; n++)
        for (int k = 0; k < 32; k++)
            CODE(o, n, k) = (uint8_t)((7 * k + n) % 256);
    static const size_t at[7] = {0, 1, 2, 3, 4, 255, 256};
    static const uint32_t want[7] = {0x150e0700u, 0x857e7770u, 0x1d160f08u,
                                     0x8d867f78u, 0x251e1710u, 0xf8f1eae3u,
                                     0x352e2720u};
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    check_words(t, "(7k + n) % 256", at, want, 7);
    /* "Word 0 holds rows 0..3 and word 1 holds rows 16..19 of column 0." */
    const w16_layout_t *l = o.spec->layouts[W16_ROLE_QWEIGHT];
    for (int r = 0; r < 8; r++) {
        int k = r < 4 ? r : 12 + r;
        int64_t c[3] = {0, 0, k}, idx[3], bit;
        w16_eval_error_t e;
        TU_CHECK(w16_layout_locate(l, o.vars, c, idx, &bit, &e));
        TU_CHECK_MSG(idx[2] == r / 4 && bit == 8 * (r % 4),
                     "(%d,0) -> word %lld byte %lld", k, (long long)idx[2],
                     (long long)bit / 8);
    }
    ru_operand_free(&o);
}

/* The sample check never sees 8-bit a8 tiles (the rule refuses them):
 * prove them a bijection here, forward then back, on a 64x64 operand. */
static void tiles_bijective(int bits)
{
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W2,
                    (w16_problem_t){1, 64, 64, bits, -1, false, false, false,
                                    false, false, 1});
    const w16_layout_t *l = o.spec->layouts[W16_ROLE_QWEIGHT];
    int64_t shape[3];
    wna16_error_t err;
    TU_OK(w16_layout_shape(l, o.vars, shape, &err), &err);
    int slots = 32 / bits, K = 64, N = 64, bad = 0;
    size_t places = (size_t)shape[1] * (size_t)shape[2] * (size_t)slots;
    uint8_t *seen = calloc(places, 1);
    for (int n = 0; n < N && seen; n++)
        for (int k = 0; k < K; k++) {
            int64_t c[3] = {0, n, k}, idx[3], bit, back[3];
            w16_eval_error_t e;
            bool ok = w16_layout_locate(l, o.vars, c, idx, &bit, &e) &&
                      idx[1] >= 0 && idx[1] < shape[1] && idx[2] >= 0 &&
                      idx[2] < shape[2] && bit % bits == 0 && bit < 32;
            size_t place = ok ? ((size_t)idx[1] * (size_t)shape[2] +
                                 (size_t)idx[2]) * (size_t)slots +
                                    (size_t)(bit / bits)
                              : 0;
            ok = ok && !seen[place]++ &&
                 w16_layout_coord(l, o.vars, idx, bit / bits, back, &e) &&
                 back[1] == n && back[2] == k;
            bad += !ok;
        }
    TU_CHECK_MSG(seen && bad == 0, "%d-bit a8 tiles: %d of %d places wrong",
                 bits, bad, K * N);
    free(seen);
    ru_operand_free(&o);
}

static void fp8_codes(void)
{
    /* Symmetric: c -> c - 8 if c >= 8 else 15 - c, so the word 0x76543210
     * becomes 0x89abcdef (facts sheet 5.8). */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, a8_problem(4, 2));
    static const int rows[8] = {0, 16, 1, 17, 2, 18, 3, 19};
    for (int i = 0; i < 8; i++)
        CODE(o, 0, rows[i]) = (uint8_t)i;
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t)
        TU_CHECK_MSG(ru_word(t, 0) == 0x89abcdefu, "fp8 word 0: %08x",
                     ru_word(t, 0));
    ru_operand_free(&o);
    /* With zero points (AWQ's form), z = 5: c -> c - 5 if c >= 5 else
     * 15 - c; codes 0..7 become f e d c b 0 1 2. */
    w16_problem_t p = a8_problem(4, 2);
    p.zp = true;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, p);
    for (int i = 0; i < 8; i++)
        CODE(o, 0, rows[i]) = (uint8_t)i;
    o.qw.zeros[0] = 5;
    t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t)
        TU_CHECK_MSG(ru_word(t, 0) == 0x210bcdefu, "fp8 zp word 0: %08x",
                     ru_word(t, 0));
    ru_operand_free(&o);
}

static void zero_points(void)
{
    /* z[n] = n % 16: the SP transpose without the interleave, so word
     * (8c + a) nibble i holds z[64c + a + 8i]. */
    w16_problem_t p = {1, 128, 64, 4, 64, true, false, false, false, false, 1};
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, p);
    for (int g = 0; g < o.qw.G; g++)
        for (int n = 0; n < o.qw.N; n++)
            o.qw.zeros[(size_t)g * o.qw.N + n] = (uint8_t)(n % 16);
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QZEROS);
    static const size_t at[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const uint32_t want[8] = {0x80808080u, 0x91919191u, 0xa2a2a2a2u,
                                     0xb3b3b3b3u, 0xc4c4c4c4u, 0xd5d5d5d5u,
                                     0xe6e6e6e6u, 0xf7f7f7f7u};
    check_words(t, "a8 zero points", at, want, 8);
    ru_operand_free(&o);
}

static uint16_t half_at(const wna16_tensor_t *t, size_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
    return h;
}

static void fp8_scales(void)
{
    /* Grouped (H = 256, gs = 128: G = 2) yet the single permutation, and
     * every scale times 512 in fp16: s = n / 1024 is stored as n / 2. */
    w16_problem_t p = {1, 256, 256, 4, 128, false, false, false, false, false,
                       2};
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, p);
    for (int g = 0; g < o.qw.G; g++)
        for (int n = 0; n < o.qw.N; n++)
            o.qw.scales[(size_t)g * o.qw.N + n] = (float)n / 1024.0f;
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_SCALES);
    static const int sps[8] = {0, 1, 8, 9, 16, 17, 24, 25};
    for (int i = 0; t && i < 8; i++)
        TU_CHECK_MSG(wna16_f16_to_f32(half_at(t, (size_t)i)) ==
                         (float)sps[i] / 2.0f,
                     "scale %d: %g", i, wna16_f16_to_f32(half_at(t, (size_t)i)));
    /* 200 * 512 overflows fp16: refused, not stored as infinity. */
    o.qw.scales[3] = 200.0f;
    const w16_layout_t *l = o.spec->layouts[W16_ROLE_SCALES];
    wna16_tensor_t *bad;
    int64_t shape[3];
    wna16_error_t err;
    TU_OK(w16_layout_shape(l, o.vars, shape, &err), &err);
    TU_OK(wna16_tensor_set_add_new(o.set, "overflow", WNA16_DTYPE_F16, 3,
                                   shape, &bad, &err), &err);
    wna16_status_t st = w16_layout_encode(o.spec, l, o.vars, &o.qw, bad,
                                          (w16_place_t){0, 0}, &err);
    TU_CHECK(st == WNA16_EUNSUPPORTED && strstr(err.message, "overflows F16"));
    ru_operand_free(&o);
}

static void int16_codes(void)
{
    /* torch's (s / s.max() * 4096).round().to(int16), each step rounded to
     * the scale dtype: with max 3, s = 2 gives 2/3 -> fp16 0.66650390625
     * -> 2730 (2731 in exact arithmetic), bf16 0.66796875 -> 2736. */
    int32_t c = 0;
    TU_CHECK(w16_scale_int16_code(WNA16_DTYPE_F16, 2.0f, 3.0f, 4096, &c) &&
             c == 2730);
    TU_CHECK(w16_scale_int16_code(WNA16_DTYPE_BF16, 2.0f, 3.0f, 4096, &c) &&
             c == 2736);
    TU_CHECK(w16_scale_int16_code(WNA16_DTYPE_F16, 3.0f, 3.0f, 4096, &c) &&
             c == 4096);
    /* -25/3*4096 rounds to -34144 in fp16: no int16 holds it */
    TU_CHECK(!w16_scale_int16_code(WNA16_DTYPE_F16, -25.0f, 3.0f, 4096, &c));
    TU_CHECK(w16_scale_global(3.0f, 4096) == 3.0f / 4096.0f);

    /* A layer: w13 has H / gs = 2 groups, so int16 codes and a global
     * scale; w2 has I / gs = 1 group of its unpadded K (I = 32 is padded to
     * 64), so vLLM keeps its fp16 scales and makes no global scale. */
    wna16_qlayer_t L = {.E = 1, .H = 64, .I = 32};
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(&L.w13, 1, 64, 64, 4, 32, false, false, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 1, 64, 32, 4, 32, false, false, false,
                              &err), &err);
    L.w13.scale_dtype = L.w2.scale_dtype = WNA16_DTYPE_F16;
    for (int i = 0; i < 2 * 64; i++)
        L.w13.scales[i] = 1.0f;
    L.w13.scales[0] = 3.0f;   /* stored at 0 */
    L.w13.scales[1] = 2.0f;   /* stored at 1 */
    L.w13.scales[8] = -0.25f; /* stored at 2 (SPS[2] = 8) */
    for (int i = 0; i < 64; i++)
        L.w2.scales[i] = 0.5f;
    const wna16_spec_t *marlin = wna16_spec_find(ctx, 0, "marlin");
    wna16_tensor_set_t *out = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
    TU_OK(wna16_ref_encode_input(ctx, marlin, &L, WNA16_INPUT_INT8, "m", out,
                                 &err), &err);
    const wna16_tensor_t *s13 = wna16_tensor_set_find(out, "m.w13_scales");
    const wna16_tensor_t *g13 = wna16_tensor_set_find(out,
                                                      "m.w13_input_global_scale");
    const wna16_tensor_t *s2 = wna16_tensor_set_find(out, "m.w2_scales");
    TU_CHECK(s13 && s13->dtype == WNA16_DTYPE_F16);
    if (s13) {
        TU_CHECK_MSG(half_at(s13, 0) == 0x1000 && half_at(s13, 1) == 0x0aaa &&
                         half_at(s13, 2) == 0xfeab && half_at(s13, 3) == 0x0555,
                     "int16 codes %04x %04x %04x %04x", half_at(s13, 0),
                     half_at(s13, 1), half_at(s13, 2), half_at(s13, 3));
    }
    TU_CHECK(g13 && g13->dtype == WNA16_DTYPE_F32 && g13->ndim == 0 &&
             g13->nbytes == 4);
    if (g13) {
        uint32_t bits;
        memcpy(&bits, g13->data, 4);
        TU_CHECK_MSG(bits == 0x3a400000u, "global scale bits %08x", bits);
    }
    TU_CHECK(!wna16_tensor_set_find(out, "m.w2_input_global_scale"));
    TU_CHECK(s2 && s2->shape[1] == 2); /* padded to 2 groups of 32 */
    if (s2) /* fp16 0.5 and the padding's 0 */
        TU_CHECK(half_at(s2, 0) == 0x3800 &&
                 half_at(s2, (size_t)s2->shape[2]) == 0);
    wna16_tensor_set_destroy(out);

    /* Refusals: no positive maximum; a code below int16. */
    for (int i = 0; i < 2 * 64; i++)
        L.w13.scales[i] = -1.0f;
    TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
    wna16_status_t st = wna16_ref_encode_input(ctx, marlin, &L,
                                               WNA16_INPUT_INT8, "m", out, &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED &&
                     strstr(err.message, "w13 scales as int16 codes"),
                 "%s", err.message);
    L.w13.scales[0] = 3.0f;
    L.w13.scales[5] = -25.0f;
    wna16_tensor_set_destroy(out); /* holds what came before the refusal */
    TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
    st = wna16_ref_encode_input(ctx, marlin, &L, WNA16_INPUT_INT8, "m", out,
                                &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED &&
                     strstr(err.message, "w13 scale -25 is too far below"),
                 "%s", err.message);
    wna16_tensor_set_destroy(out);
    wna16_qlayer_free(&L);
}

/* Encode with fp8 activations, decode with the same: the layer comes back
 * (codes through their zero points, scales divided by 512); int8 cannot be
 * decoded (its scales are int16 codes). */
static void round_trip(bool zp)
{
    wna16_qlayer_t L = {.E = 2, .H = 128, .I = 96};
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(&L.w13, 2, 192, 128, 4, 32, zp, false, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 2, 128, 96, 4, 32, zp, false, false,
                              &err), &err);
    tu_rng_t rng;
    tu_rng_seed(&rng, zp ? 81 : 82);
    wna16_qweight_t *ops[2] = {&L.w13, &L.w2};
    for (int g = 0; g < 2; g++) {
        wna16_qweight_t *q = ops[g];
        q->scale_dtype = WNA16_DTYPE_F16;
        for (size_t i = 0; i < (size_t)q->E * q->N * q->K; i++)
            q->codes[i] = (uint8_t)tu_rng_below(&rng, 16);
        for (size_t i = 0; i < (size_t)q->E * q->G * q->N; i++) {
            q->scales[i] = (float)(1 + tu_rng_below(&rng, 200)) / 64.0f;
            if (q->zeros)
                q->zeros[i] = (uint8_t)tu_rng_below(&rng, 16);
        }
    }
    const wna16_spec_t *marlin = wna16_spec_find(ctx, 0, "marlin");
    wna16_tensor_set_t *set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    TU_OK(wna16_ref_encode_input(ctx, marlin, &L, WNA16_INPUT_FP8, "m", set,
                                 &err), &err);
    wna16_quant_desc_t q = {.bits = 4, .group_size = 32, .zero_point = zp,
                            .input_dtype = WNA16_INPUT_FP8};
    wna16_qlayer_t back;
    TU_OK(wna16_ref_decode(ctx, marlin, set, "m", 2, 128, 96, &q, &back, &err),
          &err);
    for (int g = 0; g < 2; g++) {
        const wna16_qweight_t *a = ops[g], *b = g ? &back.w2 : &back.w13;
        TU_CHECK_MSG(memcmp(a->codes, b->codes, (size_t)a->E * a->N * a->K) == 0,
                     "fp8 zp=%d: %s codes differ", zp, g ? "w2" : "w13");
        TU_CHECK(memcmp(a->scales, b->scales,
                        sizeof(float) * (size_t)a->E * a->G * a->N) == 0);
        if (zp)
            TU_CHECK(memcmp(a->zeros, b->zeros,
                            (size_t)a->E * a->G * a->N) == 0);
    }
    wna16_qlayer_free(&back);
    q.input_dtype = WNA16_INPUT_INT8;
    wna16_status_t st = wna16_ref_decode(ctx, marlin, set, "m", 2, 128, 96, &q,
                                         &back, &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED &&
                     strstr(err.message, "cannot be recovered"),
                 "%s", err.message);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

static void expect_refused(const char *spec, wna16_qlayer_t *L,
                           wna16_input_dtype_t in, const char *needle)
{
    wna16_error_t err;
    wna16_tensor_set_t *out = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
    wna16_status_t st = wna16_ref_encode_input(
        ctx, wna16_spec_find(ctx, 0, spec), L, in, "m", out, &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED && strstr(err.message, needle),
                 "%s with %s activations: %s", spec,
                 wna16_input_dtype_name(in), st ? err.message : "accepted");
    wna16_tensor_set_destroy(out);
}

static void refusals(void)
{
    wna16_qlayer_t L = {.E = 1, .H = 128, .I = 64};
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(&L.w13, 1, 128, 128, 8, 64, false, false, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 1, 128, 64, 8, 64, false, false, false,
                              &err), &err);
    for (int i = 0; i < 2 * 128; i++)
        L.w13.scales[i] = 1.0f;
    for (int i = 0; i < 128; i++)
        L.w2.scales[i] = 1.0f;
    expect_refused("marlin", &L, WNA16_INPUT_INT8,
                   "8-bit weights with 8-bit activations");
    expect_refused("triton", &L, WNA16_INPUT_INT8,
                   "triton has no layout for int8 activations");
    wna16_qlayer_free(&L);
    TU_OK(wna16_qweight_alloc(&L.w13, 1, 128, 128, 4, 64, false, true, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 1, 128, 64, 4, 64, false, true, false,
                              &err), &err);
    for (int k = 0; k < 128; k++)
        L.w13.g_idx[k] = k % 2;
    for (int k = 0; k < 64; k++)
        L.w2.g_idx[k] = 0;
    expect_refused("batched_marlin", &L, WNA16_INPUT_FP8,
                   "act-order with 8-bit activations");
    wna16_qlayer_free(&L);
    TU_CHECK(wna16_input_dtype_from_name("fp8") == WNA16_INPUT_FP8);
    TU_CHECK((int)wna16_input_dtype_from_name("fp16") == -1);
    TU_CHECK(strcmp(wna16_input_dtype_name(WNA16_INPUT_16BIT), "16bit") == 0);
}

int main(void)
{
    ctx = tu_context();
    tiles_4bit();
    tiles_8bit();
    tiles_bijective(4);
    tiles_bijective(8);
    fp8_codes();
    zero_points();
    fp8_scales();
    int16_codes();
    round_trip(false);
    round_trip(true);
    refusals();
    wna16_context_destroy(ctx);
    return tu_finish("test_ref_a8");
}
