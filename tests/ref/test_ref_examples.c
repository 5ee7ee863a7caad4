/*
 * test_ref_examples.c - the worked examples of the facts sheet
 * (shared/reference/wna16-layouts.md), reproduced through the specs and the
 * reference encoder and decoder: GPTQ and AWQ packing, the Triton bytes,
 * Marlin tiles and zero points, the CPU VNNI block with its compensation,
 * FlashInfer's row shuffle and scale swizzle, and the dequantization rules.
 */
#include "ref_util.h"

#include <string.h>

static wna16_context_t *ctx;

#define CODE(o, n, k) (o).qw.codes[((size_t)(n)) * (o).qw.K + (k)]

static void gptq_words(void)
{
    /* q[k][n] = (k + n/8) % 16, K=16, N=64: [0][0] = 0x76543210 and
     * [1][0] = 0xFEDCBA98 (facts sheet 2.1 and 5.4). */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "gptq", WNA16_GEMM_W13,
                    (w16_problem_t){1, 16, 64, 4, -1, false, false, false});
    for (int n = 0; n < o.qw.N; n++)
        for (int k = 0; k < o.qw.K; k++)
            CODE(o, n, k) = (uint8_t)((k + n / 8) % 16);
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t) {
        TU_CHECK(t->shape[0] == 2 && t->shape[1] == 64);
        TU_CHECK(ru_word(t, 0) == 0x76543210u);
        TU_CHECK(ru_word(t, 64) == 0xFEDCBA98u);
    }
    /* Symmetric checkpoints store z - 1: implicit 8 becomes 0x77777777. */
    t = ru_encode(&o, W16_ROLE_QZEROS);
    if (t)
        TU_CHECK(ru_word(t, 0) == 0x77777777u);
    ru_operand_free(&o);

    /* 8-bit: 0x7F7F7F7F for the implicit zero 128. */
    ru_operand_init(&o, ctx, "gptq", WNA16_GEMM_W13,
                    (w16_problem_t){1, 16, 64, 8, -1, false, false, false});
    t = ru_encode(&o, W16_ROLE_QZEROS);
    if (t)
        TU_CHECK(ru_word(t, 0) == 0x7F7F7F7Fu);
    ru_operand_free(&o);
}

static void awq_words(void)
{
    /* Columns 0..7 holding 0..7 pack to 0x75316420; A,B,C,D,E,F,1,2 to
     * 0x2FDB1ECA (facts sheet 2.2). */
    static const uint8_t second[8] = {0xA, 0xB, 0xC, 0xD, 0xE, 0xF, 1, 2};
    ru_operand_t o;
    ru_operand_init(&o, ctx, "awq", WNA16_GEMM_W13,
                    (w16_problem_t){1, 8, 16, 4, -1, true, false, false});
    for (int n = 0; n < 8; n++) {
        CODE(o, n, 0) = (uint8_t)n;
        CODE(o, n + 8, 0) = second[n];
        o.qw.zeros[n] = (uint8_t)n;
    }
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t) {
        TU_CHECK_MSG(ru_word(t, 0) == 0x75316420u, "got %08x", ru_word(t, 0));
        TU_CHECK_MSG(ru_word(t, 1) == 0x2FDB1ECAu, "got %08x", ru_word(t, 1));
    }
    t = ru_encode(&o, W16_ROLE_QZEROS); /* true zeros, same packing */
    if (t)
        TU_CHECK(ru_word(t, 0) == 0x75316420u);
    ru_operand_free(&o);
}

static void triton_bytes(void)
{
    /* GPTQ word 0x76543210 becomes bytes 10 32 54 76 (facts sheet 6). */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "triton", WNA16_GEMM_W13,
                    (w16_problem_t){1, 8, 4, 4, -1, false, false, false});
    for (int k = 0; k < 8; k++)
        CODE(o, 0, k) = (uint8_t)k;
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t) {
        TU_CHECK(ru_byte(t, 0) == 0x10 && ru_byte(t, 1) == 0x32 &&
                 ru_byte(t, 2) == 0x54 && ru_byte(t, 3) == 0x76);
        TU_CHECK(ru_word(t, 0) == 0x76543210u); /* same bits as GPTQ */
    }
    ru_operand_free(&o);
}

static void marlin_tiles(void)
{
    ru_operand_t o;
    /* K=16 (H), N=128 (2*IP with I=64): the first 16x64 tile. */
    w16_problem_t p4 = {1, 16, 64, 4, -1, false, false, false};
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, p4);
    TU_CHECK(o.vars[W16_VAR_K] == 16 && o.vars[W16_VAR_N] == 128);
    for (int n = 0; n < 128; n++)
        for (int k = 0; k < 16; k++)
            CODE(o, n, k) = (uint8_t)((k + n / 8) % 16);
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    static const uint32_t want1[5] = {0xa2919180u, 0xc4b3b3a2u, 0xe6d5d5c4u,
                                      0x08f7f7e6u, 0xc4b3b3a2u};
    for (int i = 0; t && i < 5; i++)
        TU_CHECK_MSG(ru_word(t, (size_t)i) == want1[i], "word %d: %08x", i,
                     ru_word(t, (size_t)i));
    for (int n = 0; n < 128; n++)
        for (int k = 0; k < 16; k++)
            CODE(o, n, k) = (uint8_t)((k + n) % 16);
    t = ru_encode(&o, W16_ROLE_QWEIGHT);
    for (int i = 0; t && i < 4; i++)
        TU_CHECK_MSG(ru_word(t, (size_t)i) == 0x19910880u, "word %d: %08x", i,
                     ru_word(t, (size_t)i));
    if (t)
        TU_CHECK(ru_word(t, 4) == 0x3bb32aa2u);
    ru_operand_free(&o);

    /* 8-bit, q = (7k + n) % 256. */
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13,
                    (w16_problem_t){1, 16, 64, 8, -1, false, false, false});
    for (int n = 0; n < 128; n++)
        for (int k = 0; k < 16; k++)
            CODE(o, n, k) = (uint8_t)((7 * k + n) % 256);
    t = ru_encode(&o, W16_ROLE_QWEIGHT);
    static const uint32_t want8[4] = {0x3f073800u, 0x470f4008u, 0x4f174810u,
                                      0x571f5018u};
    for (int i = 0; t && i < 4; i++)
        TU_CHECK_MSG(ru_word(t, (size_t)i) == want8[i], "word %d: %08x", i,
                     ru_word(t, (size_t)i));
    ru_operand_free(&o);

    /* Zero points z[n] = n % 16 (facts sheet 5.6). */
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13,
                    (w16_problem_t){1, 128, 64, 4, 64, true, false, false});
    for (int g = 0; g < o.qw.G; g++)
        for (int n = 0; n < o.qw.N; n++)
            o.qw.zeros[(size_t)g * o.qw.N + n] = (uint8_t)(n % 16);
    t = ru_encode(&o, W16_ROLE_QZEROS);
    static const uint32_t wantz[8] = {0x88880000u, 0x99991111u, 0xaaaa2222u,
                                      0xbbbb3333u, 0xcccc4444u, 0xdddd5555u,
                                      0xeeee6666u, 0xffff7777u};
    for (int i = 0; t && i < 8; i++)
        TU_CHECK_MSG(ru_word(t, (size_t)i) == wantz[i], "zero word %d: %08x", i,
                     ru_word(t, (size_t)i));
    ru_operand_free(&o);

    /* Inverse look-ups of the 4-bit tile (facts sheet 5.4). */
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13, p4);
    const w16_layout_t *l = o.spec->layouts[W16_ROLE_QWEIGHT];
    static const struct { int k, n, word, nib; } inv[] = {
        {1, 0, 0, 4}, {0, 1, 16, 0}, {7, 9, 28, 6}, {15, 63, 127, 7}};
    for (size_t i = 0; i < sizeof inv / sizeof inv[0]; i++) {
        int64_t c[3] = {0, inv[i].n, inv[i].k}, idx[3], bit;
        w16_eval_error_t e;
        TU_CHECK(w16_layout_locate(l, o.vars, c, idx, &bit, &e));
        TU_CHECK_MSG(idx[1] * 256 + idx[2] == inv[i].word && bit == 4 * inv[i].nib,
                     "(%d,%d) -> word %lld bit %lld", inv[i].k, inv[i].n,
                     (long long)(idx[1] * 256 + idx[2]), (long long)bit);
    }
    ru_operand_free(&o);
}

static void marlin_scales(void)
{
    /* Grouped: out[g][64c+8i+j] = s[g][64c+i+8j]; single: 32-entry table. */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13,
                    (w16_problem_t){1, 256, 256, 4, 128, false, false, false});
    for (int g = 0; g < o.qw.G; g++)
        for (int n = 0; n < o.qw.N; n++)
            o.qw.scales[(size_t)g * o.qw.N + n] = (float)n;
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_SCALES);
    if (t) {
        const uint16_t *h = t->data;
        TU_CHECK(wna16_f16_to_f32(h[0]) == 0.0f);
        TU_CHECK(wna16_f16_to_f32(h[1]) == 8.0f);  /* SP[1] = 8 */
        TU_CHECK(wna16_f16_to_f32(h[8]) == 1.0f);  /* SP[8] = 1 */
        TU_CHECK(wna16_f16_to_f32(h[63]) == 63.0f);
        TU_CHECK(wna16_f16_to_f32(h[65]) == 72.0f);
    }
    ru_operand_free(&o);
    /* Hazard H1: I == group size gives the single layout for w13. */
    ru_operand_init(&o, ctx, "marlin", WNA16_GEMM_W13,
                    (w16_problem_t){1, 256, 128, 4, 128, false, false, false});
    for (int n = 0; n < o.qw.N; n++)
        o.qw.scales[n] = (float)n;
    t = ru_encode(&o, W16_ROLE_SCALES);
    if (t) {
        const uint16_t *h = t->data;
        static const int sps[8] = {0, 1, 8, 9, 16, 17, 24, 25};
        for (int p = 0; p < 8; p++)
            TU_CHECK(wna16_f16_to_f32(h[p]) == (float)sps[p]);
    }
    ru_operand_free(&o);
}

static void cpu_block(void)
{
    /* N=K=32, gs=32, W[n][k] = (n+k) % 16, Z = 8 (facts sheet 7). */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "cpu", WNA16_GEMM_W2,
                    (w16_problem_t){1, 32, 32, 4, 32, false, false, false});
    for (int n = 0; n < 32; n++)
        for (int k = 0; k < 32; k++)
            CODE(o, n, k) = (uint8_t)((n + k) % 16);
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t) {
        TU_CHECK(t->shape[3] == 32 * 16 + 128);
        static const uint8_t b0[5] = {0x80, 0x91, 0xa2, 0xb3, 0x91};
        for (int i = 0; i < 5; i++)
            TU_CHECK_MSG(ru_byte(t, (size_t)i) == b0[i], "byte %d: %02x", i,
                         ru_byte(t, (size_t)i));
        TU_CHECK(ru_byte(t, 32) == 0x80);
        TU_CHECK(ru_byte(t, 64) == 0xc4);
        int32_t comp0;
        memcpy(&comp0, (const uint8_t *)t->data + 32 * 16, 4);
        TU_CHECK_MSG(comp0 == -16, "comp[0] = %d", comp0);
    }
    t = ru_encode(&o, W16_ROLE_QZEROS); /* synthetic 8 for symmetric */
    if (t)
        TU_CHECK(ru_byte(t, 0) == 8 && ru_byte(t, 31) == 8);
    ru_operand_free(&o);
}

static void flashinfer_rows(void)
{
    /* I = 32: rows 0..7 are up0, up2, ..., up14 and rows 8..15 gate0, gate2,
     * ..., gate14 (facts sheet 9, step 4). */
    ru_operand_t o;
    ru_operand_init(&o, ctx, "flashinfer_trtllm", WNA16_GEMM_W13,
                    (w16_problem_t){1, 256, 32, 4, 32, false, false, false});
    const w16_layout_t *l = o.spec->layouts[W16_ROLE_QWEIGHT];
    for (int r = 0; r < 16; r++) {
        int64_t idx[4] = {0, 0, r, 0}, c[3];
        w16_eval_error_t e;
        TU_CHECK(w16_layout_coord(l, o.vars, idx, 0, c, &e));
        int64_t want = r < 8 ? 32 + 2 * r : 2 * (r - 8);
        TU_CHECK_MSG(c[1] == want, "row %d holds n = %lld, want %lld", r,
                     (long long)c[1], (long long)want);
    }
    /* Codes are signed: every nibble XOR 8. */
    CODE(o, 32, 0) = 0; /* up0, k = 0 -> row 0, byte 0, low nibble */
    CODE(o, 32, 1) = 9;
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t)
        TU_CHECK_MSG(ru_byte(t, 0) == 0x18, "byte 0 = %02x", ru_byte(t, 0));
    ru_operand_free(&o);

    /* Scale swizzle with 8 columns: (0,1)->1, (0,4)->512, (1,0)->16,
     * (32,0)->4, (96,3)->15, (128,0)->1024. w2 rows are only shuffled:
     * storage row m holds n = 32(m/32) + 4(m%8) + (m%32)/8. */
    ru_operand_init(&o, ctx, "flashinfer_trtllm", WNA16_GEMM_W2,
                    (w16_problem_t){1, 256, 256, 4, 32, false, false, false});
    l = o.spec->layouts[W16_ROLE_SCALES];
    static const struct { int m, k, idx; } sw[] = {
        {0, 1, 1}, {0, 4, 512}, {1, 0, 16}, {32, 0, 4}, {96, 3, 15},
        {128, 0, 1024}};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        int m = sw[i].m;
        int64_t n = 32 * (m / 32) + 4 * (m % 8) + (m % 32) / 8;
        int64_t c[3] = {0, sw[i].k, n}, idx[2], bit;
        w16_eval_error_t e;
        TU_CHECK(w16_layout_locate(l, o.vars, c, idx, &bit, &e));
        TU_CHECK_MSG(idx[1] == sw[i].idx, "(%d,%d) -> %lld, want %d", m,
                     sw[i].k, (long long)idx[1], sw[i].idx);
    }
    ru_operand_free(&o);
}

/* MoeWNA16 keeps true zeros: GPTQ's stored z-1 nibbles get their +1 on the
 * way in (0x77777777 -> zero bytes 0x88); AWQ zeros pass unchanged. */
static void moe_wna16_zeros(void)
{
    wna16_error_t err;
    wna16_tensor_set_t *in = NULL, *out = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &in, &err), &err);
    TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
    /* A one-expert GPTQ checkpoint, asymmetric, every stored zero word
     * 0x77777777 except one nibble holding 0x3 (true zero 4). */
    ru_operand_t g;
    ru_operand_init(&g, ctx, "gptq", WNA16_GEMM_W13,
                    (w16_problem_t){1, 32, 16, 4, 32, true, false, false});
    for (size_t i = 0; i < (size_t)g.qw.G * g.qw.N; i++)
        g.qw.zeros[i] = 8;
    g.qw.zeros[1] = 4;
    const wna16_tensor_t *z = ru_encode(&g, W16_ROLE_QZEROS);
    if (z)
        TU_CHECK_MSG(ru_word(z, 0) == 0x77777737u, "gptq zeros %08x",
                     ru_word(z, 0));
    ru_operand_free(&g);

    wna16_qlayer_t L = {.E = 1, .H = 32, .I = 32};
    TU_OK(wna16_qweight_alloc(&L.w13, 1, 64, 32, 4, 32, true, false, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 1, 32, 32, 4, 32, true, false, false,
                              &err), &err);
    memset(L.w13.zeros, 8, (size_t)L.w13.G * L.w13.N);
    memset(L.w2.zeros, 8, (size_t)L.w2.G * L.w2.N);
    L.w13.zeros[1] = 4;
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    const wna16_spec_t *mw = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "moe_wna16");
    TU_OK(wna16_ref_encode(ctx, gptq, &L, "m", in, &err), &err);
    wna16_qlayer_t dec;
    wna16_quant_desc_t q = {4, 32, true, false, false};
    TU_OK(wna16_ref_decode(ctx, gptq, in, "m", 1, 32, 32, &q, &dec, &err), &err);
    TU_CHECK(dec.w13.zeros && dec.w13.zeros[0] == 8 && dec.w13.zeros[1] == 4);
    TU_OK(wna16_ref_encode(ctx, mw, &dec, "m", out, &err), &err);
    const wna16_tensor_t *mz = wna16_tensor_set_find(out, "m.w13_qzeros");
    TU_CHECK(mz != NULL);
    if (mz) /* (E, N/2, G): byte [0][0][0] holds n=0 (low) and n=1 (high) */
        TU_CHECK_MSG(ru_byte(mz, 0) == 0x48, "moe_wna16 zero byte %02x",
                     ru_byte(mz, 0));
    wna16_qlayer_free(&dec);
    wna16_qlayer_free(&L);
    wna16_tensor_set_destroy(in);
    wna16_tensor_set_destroy(out);
}

/* compressed-tensors: (N, K) codes packed along K, zeros packed along N
 * with no offset; symmetric means the implicit 2^(bits-1). */
static void compressed_tensors_words(void)
{
    ru_operand_t o;
    ru_operand_init(&o, ctx, "compressed_tensors", WNA16_GEMM_W13,
                    (w16_problem_t){1, 16, 8, 4, 16, true, false, false});
    for (int k = 0; k < 16; k++)
        CODE(o, 1, k) = (uint8_t)(k % 16);
    for (int n = 0; n < 8; n++)
        o.qw.zeros[n] = (uint8_t)(15 - n);
    const wna16_tensor_t *t = ru_encode(&o, W16_ROLE_QWEIGHT);
    if (t) { /* weight_packed is (N, K/8): row 1 holds n = 1 */
        TU_CHECK(t->shape[0] == 8 && t->shape[1] == 2);
        TU_CHECK(ru_word(t, 2) == 0x76543210u && ru_word(t, 3) == 0xFEDCBA98u);
    }
    t = ru_encode(&o, W16_ROLE_QZEROS); /* (N/8, G) */
    if (t)
        TU_CHECK_MSG(ru_word(t, 0) == 0x89ABCDEFu, "ct zeros %08x",
                     ru_word(t, 0));
    ru_operand_free(&o);
}

static void dequant_rules(void)
{
    /* GPTQ symmetric: (q - 8) * s; word 0x76543210 gives (-8..-1) * s. */
    wna16_qweight_t qw;
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(&qw, 1, 1, 8, 4, -1, false, false, false, &err),
          &err);
    qw.scales[0] = 0.5f;
    for (int k = 0; k < 8; k++)
        qw.codes[k] = (uint8_t)k;
    for (int k = 0; k < 8; k++)
        TU_CHECK(wna16_ref_dequant(&qw, 0, 0, k) == (float)(k - 8) * 0.5f);
    wna16_qweight_free(&qw);
    /* 8-bit: q - 128; explicit zeros: (q - z) * s. */
    TU_OK(wna16_qweight_alloc(&qw, 1, 1, 8, 8, 4, true, false, false, &err),
          &err);
    qw.codes[0] = 200;
    qw.scales[0] = 2.0f;
    qw.zeros[0] = 100;
    TU_CHECK(wna16_ref_dequant(&qw, 0, 0, 0) == 200.0f);
    wna16_qweight_free(&qw);
}

int main(void)
{
    ctx = tu_context();
    gptq_words();
    awq_words();
    triton_bytes();
    marlin_tiles();
    marlin_scales();
    cpu_block();
    flashinfer_rows();
    moe_wna16_zeros();
    compressed_tensors_words();
    dequant_rules();
    wna16_context_destroy(ctx);
    return tu_finish("test_ref_examples");
}
