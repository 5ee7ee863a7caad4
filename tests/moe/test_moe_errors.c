/*
 * test_moe_errors.c - bad inputs to the reference MoE and the routing get
 * the documented errors (WNA16_EINVAL with a message naming the argument,
 * the token and the position), never a crash, and leave the output
 * untouched; a NULL error record is fine. Built with ASan+UBSan, so an
 * out-of-bounds read while validating would fail the test too.
 */
#include "moe_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Expects status `st` == want and `needle` in the message. */
static void expect_err(wna16_status_t st, const wna16_error_t *err,
                       wna16_status_t want, const char *needle, int line)
{
    TU_CHECK_MSG(st == want, "line %d: got %s, want %s (%s)", line,
                 wna16_status_name(st), wna16_status_name(want),
                 err->message);
    TU_CHECK_MSG(strstr(err->message, needle) != NULL,
                 "line %d: message \"%s\" lacks \"%s\"", line, err->message,
                 needle);
}

#define EXPECT(call, needle)                                                  \
    do {                                                                      \
        wna16_error_clear(&err);                                              \
        wna16_status_t st_ = (call);                                          \
        expect_err(st_, &err, WNA16_EINVAL, needle, __LINE__);                \
    } while (0)

/* A valid small problem: E = 3, H = 8, I = 4, M = 2, top-2. */
typedef struct fixture {
    wna16_qlayer_t L;
    wna16_moe_params_t p;
    uint16_t x[16], out[16];
    int32_t ids[4];
    float w[4];
} fixture_t;

static void fixture_init(fixture_t *f)
{
    tu_rng_t r;
    tu_rng_seed(&r, 3);
    mt_layer_opts_t o = {.E = 3, .H = 8, .I = 4, .gated = true};
    TU_CHECK(mt_random_layer(&r, &o, &f->L) == 0);
    wna16_moe_params_init(&f->p);
    mt_random_act(&r, f->p.act_dtype, f->x, 16, -1, 1);
    const int32_t ids[4] = {0, 2, 1, 0};
    memcpy(f->ids, ids, sizeof ids);
    for (int i = 0; i < 4; i++)
        f->w[i] = 0.5f;
    memset(f->out, 0x5a, sizeof f->out);
}

static wna16_status_t run(fixture_t *f, wna16_error_t *err)
{
    return wna16_ref_moe(&f->L, &f->p, f->x, 2, f->ids, f->w, 2, f->out, err);
}

static bool out_untouched(const fixture_t *f)
{
    for (int i = 0; i < 16; i++)
        if (f->out[i] != 0x5a5a)
            return false;
    return true;
}

static void test_ref_pointers_sizes(void)
{
    fixture_t f;
    fixture_init(&f);
    wna16_error_t err;
    TU_OK(run(&f, &err), &err); /* the fixture itself is fine */
    memset(f.out, 0x5a, sizeof f.out);
    EXPECT(wna16_ref_moe(NULL, &f.p, f.x, 2, f.ids, f.w, 2, f.out, &err),
           "layer is NULL");
    EXPECT(wna16_ref_moe(&f.L, NULL, f.x, 2, f.ids, f.w, 2, f.out, &err),
           "params is NULL");
    EXPECT(wna16_ref_moe(&f.L, &f.p, NULL, 2, f.ids, f.w, 2, f.out, &err),
           "hidden is NULL");
    EXPECT(wna16_ref_moe(&f.L, &f.p, f.x, 2, NULL, f.w, 2, f.out, &err),
           "topk_ids is NULL");
    EXPECT(wna16_ref_moe(&f.L, &f.p, f.x, 2, f.ids, NULL, 2, f.out, &err),
           "topk_weights is NULL");
    EXPECT(wna16_ref_moe(&f.L, &f.p, f.x, 2, f.ids, f.w, 2, NULL, &err),
           "out is NULL");
    EXPECT(wna16_ref_moe(&f.L, &f.p, f.x, -1, f.ids, f.w, 2, f.out, &err),
           "M = -1");
    EXPECT(wna16_ref_moe(&f.L, &f.p, f.x, 2, f.ids, f.w, 0, f.out, &err),
           "topk = 0");
    EXPECT(wna16_ref_moe(&f.L, &f.p, f.x, 1, f.ids, f.w, 4, f.out, &err),
           "topk = 4 exceeds the 3 experts");
    TU_CHECK(out_untouched(&f));
    /* M = 0 is an empty batch: fine, even with NULL data. */
    TU_OK(wna16_ref_moe(&f.L, &f.p, NULL, 0, NULL, NULL, 2, NULL, &err),
          &err);
    /* A NULL error record does not crash. */
    TU_CHECK(wna16_ref_moe(NULL, NULL, NULL, 0, NULL, NULL, 0, NULL, NULL) ==
             WNA16_EINVAL);
    wna16_qlayer_free(&f.L);
}

static void test_ref_ids_map(void)
{
    fixture_t f;
    fixture_init(&f);
    wna16_error_t err;
    f.ids[3] = 3; /* token 1, position 1: E = 3 */
    EXPECT(run(&f, &err), "topk_ids[1][1] = 3 is not an expert id in [0, 3)");
    f.ids[3] = -1;
    EXPECT(run(&f, &err), "topk_ids[1][1] = -1");
    f.ids[3] = 0;
    int32_t map[5] = {0, -1, 2, 1, -1};
    f.p.expert_map = map;
    f.p.global_num_experts = 5;
    TU_OK(run(&f, &err), &err);
    memset(f.out, 0x5a, sizeof f.out);
    f.ids[2] = 5; /* global ids go to 5 with the map */
    EXPECT(run(&f, &err), "topk_ids[1][0] = 5 is not an expert id in [0, 5)");
    f.ids[2] = 4;
    map[4] = 3; /* not a local expert (E = 3) */
    EXPECT(run(&f, &err), "expert_map[4] = 3");
    map[4] = -2;
    EXPECT(run(&f, &err), "expert_map[4] = -2");
    map[4] = -1;
    f.p.global_num_experts = 0;
    EXPECT(run(&f, &err), "global_num_experts >= 1");
    f.p.expert_map = NULL;
    f.p.global_num_experts = 7; /* no map: must be 0 or E */
    f.ids[2] = 1;
    EXPECT(run(&f, &err), "global_num_experts = 7 without an expert_map");
    TU_CHECK(out_untouched(&f));
    wna16_qlayer_free(&f.L);
}

static void test_ref_params(void)
{
    fixture_t f;
    fixture_init(&f);
    wna16_error_t err;
    f.p.act_dtype = WNA16_DTYPE_F32;
    EXPECT(run(&f, &err), "activation dtype F32 is not supported");
    f.p.act_dtype = WNA16_DTYPE_INVALID;
    EXPECT(run(&f, &err), "activation dtype INVALID");
    f.p.act_dtype = (wna16_dtype_t)1000;
    EXPECT(run(&f, &err), "is not supported");
    f.p.act_dtype = WNA16_DTYPE_F16;
    f.p.activation = WNA16_ACT_INVALID;
    EXPECT(run(&f, &err), "invalid activation -1");
    f.p.activation = (wna16_activation_t)42;
    EXPECT(run(&f, &err), "invalid activation 42");
    f.p.activation = WNA16_ACT_SWIGLUOAI;
    f.p.swiglu_limit = 0.0f;
    EXPECT(run(&f, &err), "swigluoai needs swiglu_limit > 0");
    f.p.swiglu_limit = NAN;
    EXPECT(run(&f, &err), "swiglu_limit > 0");
    f.p.swiglu_limit = INFINITY; /* no clamp: valid */
    TU_OK(run(&f, &err), &err);
    memset(f.out, 0x5a, sizeof f.out);
    f.p.swiglu_alpha = NAN;
    EXPECT(run(&f, &err), "finite swiglu_alpha and swiglu_beta");
    f.p.swiglu_alpha = 1.0f;
    f.p.swiglu_beta = -INFINITY;
    EXPECT(run(&f, &err), "finite");
    f.p.activation = WNA16_ACT_SWIGLUSTEP;
    f.p.swiglu_limit = -1.0f;
    EXPECT(run(&f, &err), "swiglustep needs swiglu_limit > 0");
    /* Non-gated activations need w13 of N = I, not 2I. */
    f.p.activation = WNA16_ACT_SILU_NO_MUL;
    EXPECT(run(&f, &err), "w13 (not gated: N = I) is E x N x K = 3 x 8 x 8, "
                          "expected 3 x 4 x 8");
    TU_CHECK(out_untouched(&f));
    wna16_qlayer_free(&f.L);
}

static void test_ref_layer(void)
{
    fixture_t f;
    fixture_init(&f);
    wna16_error_t err;
    f.L.H = 9;
    EXPECT(run(&f, &err), "w13 is E x N x K = 3 x 8 x 8, expected 3 x 8 x 9");
    f.L.H = 8;
    f.L.I = 0;
    EXPECT(run(&f, &err), "layer E, H and I must be positive");
    f.L.I = 4;
    f.L.w2.K = 5;
    EXPECT(run(&f, &err), "w2 is E x N x K = 3 x 8 x 5");
    f.L.w2.K = 4;
    uint8_t *codes = f.L.w2.codes;
    f.L.w2.codes = NULL;
    EXPECT(run(&f, &err), "w2 has no codes or scales");
    f.L.w2.codes = codes;
    f.L.w13.bits = 3;
    EXPECT(run(&f, &err), "w13 has 3-bit codes");
    f.L.w13.bits = 4;
    int32_t gs = f.L.w13.group_size, G = f.L.w13.G;
    f.L.w13.group_size = 3;
    EXPECT(run(&f, &err), "w13 group size 3 does not divide K = 8");
    f.L.w13.group_size = gs;
    f.L.w13.G = G + 1;
    EXPECT(run(&f, &err), "w13 has G = ");
    f.L.w13.G = G;
    TU_CHECK(out_untouched(&f));
    wna16_qlayer_free(&f.L);

    /* Act-order g_idx out of range would read past the scales. */
    wna16_qlayer_t L;
    TU_OK(wna16_qweight_alloc(&L.w13, 1, 4, 4, 4, 2, false, true, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 1, 4, 2, 4, -1, false, true, false,
                              &err), &err);
    L.E = 1, L.H = 4, L.I = 2;
    L.w13.g_idx[3] = 2; /* G = 2 */
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    uint16_t x[4] = {0}, out[4];
    int32_t id = 0;
    float w = 1.0f;
    EXPECT(wna16_ref_moe(&L, &p, x, 1, &id, &w, 1, out, &err),
           "w13 g_idx[0][3] = 2 is not a group in [0, 2)");
    L.w13.g_idx[3] = 1;
    L.w2.g_idx[1] = -1;
    EXPECT(wna16_ref_moe(&L, &p, x, 1, &id, &w, 1, out, &err),
           "w2 g_idx[0][1] = -1");
    L.w2.g_idx[1] = 0;
    TU_OK(wna16_ref_moe(&L, &p, x, 1, &id, &w, 1, out, &err), &err);
    wna16_qlayer_free(&L);
}

static void test_batched_errors(void)
{
    fixture_t f;
    fixture_init(&f);
    wna16_error_t err;
    uint16_t x[3 * 2 * 8] = {0}, out[3 * 2 * 8];
    int32_t counts[3] = {1, 2, 0};
    TU_OK(wna16_ref_moe_batched(&f.L, &f.p, x, 2, counts, NULL, out, &err),
          &err);
    counts[1] = 3;
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, x, 2, counts, NULL, out, &err),
           "expert_num_tokens[1] = 3 is outside [0, max_tokens = 2]");
    counts[1] = -1;
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, x, 2, counts, NULL, out, &err),
           "expert_num_tokens[1] = -1");
    counts[1] = 0;
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, x, -1, counts, NULL, out, &err),
           "max_tokens = -1");
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, x, 2, NULL, NULL, out, &err),
           "expert_num_tokens is NULL");
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, NULL, 2, counts, NULL, out,
                                 &err), "hidden is NULL");
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, x, 2, counts, NULL, NULL, &err),
           "out is NULL");
    EXPECT(wna16_ref_moe_batched(NULL, &f.p, x, 2, counts, NULL, out, &err),
           "layer is NULL");
    f.p.act_dtype = WNA16_DTYPE_I32;
    EXPECT(wna16_ref_moe_batched(&f.L, &f.p, x, 2, counts, NULL, out, &err),
           "activation dtype I32");
    wna16_qlayer_free(&f.L);
}

static void test_align_errors(void)
{
    wna16_error_t err;
    wna16_moe_alignment_t a;
    int32_t ids[6] = {0, 1, 2, 3, 1, 0};
    EXPECT(wna16_moe_align(ids, 3, 2, 4, NULL, 0, &a, &err),
           "block_size = 0");
    TU_CHECK(a.sorted_token_ids == NULL && a.expert_ids == NULL);
    EXPECT(wna16_moe_align(ids, 3, 2, 0, NULL, 16, &a, &err),
           "num_experts = 0");
    EXPECT(wna16_moe_align(ids, -2, 2, 4, NULL, 16, &a, &err), "M = -2");
    EXPECT(wna16_moe_align(ids, 3, 0, 4, NULL, 16, &a, &err), "topk = 0");
    EXPECT(wna16_moe_align(ids, 1, 5, 4, NULL, 16, &a, &err),
           "topk = 5 is outside [1, num_experts = 4]");
    EXPECT(wna16_moe_align(NULL, 3, 2, 4, NULL, 16, &a, &err),
           "topk_ids is NULL");
    EXPECT(wna16_moe_align(ids, 3, 2, 4, NULL, 16, NULL, &err),
           "out is NULL");
    EXPECT(wna16_moe_align(ids, 3, 2, 3, NULL, 16, &a, &err),
           "topk_ids[1][1] = 3 is not an expert id in [0, 3)");
    ids[4] = -5;
    EXPECT(wna16_moe_align(ids, 3, 2, 4, NULL, 16, &a, &err),
           "topk_ids[2][0] = -5");
    ids[4] = 1;
    int32_t map[4] = {0, -1, 1, 4};
    EXPECT(wna16_moe_align(ids, 3, 2, 4, map, 16, &a, &err),
           "expert_map[3] = 4 is neither -1 nor an expert in [0, 4)");
    map[3] = -3;
    EXPECT(wna16_moe_align(ids, 3, 2, 4, map, 16, &a, &err),
           "expert_map[3] = -3");
    /* Sizes past int32 are refused before any id is read. */
    EXPECT(wna16_moe_align(ids, 1 << 30, 4, 8, NULL, 16, &a, &err),
           "more than INT32_MAX");
    EXPECT(wna16_moe_align(ids, 1 << 20, 1, 1 << 20, NULL, 1 << 12, &a,
                           &err), "more than INT32_MAX");
    TU_CHECK(a.sorted_token_ids == NULL && a.expert_ids == NULL);
    /* M = 0: an empty routing, no data needed. */
    TU_OK(wna16_moe_align(NULL, 0, 2, 4, NULL, 16, &a, &err), &err);
    TU_CHECK(a.num_tokens_post_padded == 0 && a.max_num_tokens_padded == 0 &&
             a.max_num_blocks == 0 && a.sentinel == 0);
    wna16_moe_alignment_free(&a);
    TU_CHECK(wna16_moe_align(NULL, 0, 0, 0, NULL, 0, NULL, NULL) ==
             WNA16_EINVAL);

    int32_t counts[3] = {1, 9, 0};
    EXPECT(wna16_moe_align_batched(counts, 3, 8, 4, &a, &err),
           "expert_num_tokens[1] = 9 is outside [0, 8]");
    EXPECT(wna16_moe_align_batched(NULL, 3, 8, 4, &a, &err),
           "expert_num_tokens is NULL");
    EXPECT(wna16_moe_align_batched(counts, 0, 8, 4, &a, &err),
           "num_experts = 0");
    EXPECT(wna16_moe_align_batched(counts, 3, 8, 0, &a, &err),
           "block_size = 0");
    EXPECT(wna16_moe_align_batched(counts, 3, 1 << 30, 4, &a, &err),
           "more than INT32_MAX");
    EXPECT(wna16_moe_align_batched(counts, 3, 8, 4, NULL, &err),
           "out is NULL");
}

int main(void)
{
    test_ref_pointers_sizes();
    test_ref_ids_map();
    test_ref_params();
    test_ref_layer();
    test_batched_errors();
    test_align_errors();
    return tu_finish("test_moe_errors");
}
