/*
 * test_repack_gen.c - generated repack kernels against the reference: for
 * random layers and random (source, destination) pairs of specs, the CPU
 * target's generated kernels must produce exactly the bytes the reference
 * produces, tensor by tensor, and refuse exactly what it refuses. Bit
 * widths, group sizes (including -1), zero points, act-order, bias, padding,
 * ragged sizes and the 8-bit activation variants (int8, fp8; mostly into
 * the Marlin layouts that hold them) all vary within each pair's rules.
 * Skips (77) without LLVM. Usage: test_repack_gen [CONFIGS [SEED
 * [cpu|cuda]]]: with `cuda` the kernels run on the GPU (skips without one).
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;
static tu_rng_t rng;
static wna16_target_t target = WNA16_TARGET_CPU;
/* compared configurations per input dtype */
static int compared_by_input[WNA16_INPUT_COUNT_];

/* Scales int16 codes can hold (int8 activations): mostly positive ones,
 * since one below -32768/4096 of the largest is refused. */
static bool positive_scales;

static float exact_scale(void)
{
    int m = 1 + (int)tu_rng_below(&rng, 127);
    float v = (float)m;
    for (int i = (int)tu_rng_below(&rng, 10); i > 0; i--)
        v *= 0.5f;
    return !positive_scales && tu_rng_below(&rng, 4) == 0 ? -v : v;
}

static void fill(wna16_qweight_t *q)
{
    size_t n = (size_t)q->E * q->N * q->K;
    for (size_t i = 0; i < n; i++)
        q->codes[i] = (uint8_t)tu_rng_below(&rng, 1u << q->bits);
    size_t ng = (size_t)q->E * q->G * q->N;
    for (size_t i = 0; i < ng; i++) {
        /* fp16 values that bf16 cannot hold too, to exercise rounding */
        q->scales[i] = tu_rng_below(&rng, 3) ? exact_scale()
                                             : wna16_f16_to_f32((uint16_t)(
                                                   0x2000 + tu_rng_below(&rng, 0x3000)));
        if (q->zeros)
            q->zeros[i] = (uint8_t)tu_rng_below(&rng, 1u << q->bits);
    }
    if (q->bias)
        for (size_t i = 0; i < (size_t)q->E * q->N; i++)
            q->bias[i] = exact_scale();
    if (q->g_idx)
        for (int32_t e = 0; e < q->E; e++)
            for (int32_t k = 0; k < q->K; k++)
                q->g_idx[(size_t)e * q->K + k] =
                    k < q->G ? k : (int32_t)tu_rng_below(&rng, (uint32_t)q->G);
}

static const wna16_spec_t *pick_spec(bool source)
{
    for (;;) {
        const wna16_spec_t *s = wna16_spec_at(
            ctx, tu_rng_below(&rng, (uint32_t)wna16_spec_count(ctx)));
        const char *n = wna16_spec_name(s);
        if (source) {
            /* checkpoint formats, and stacked layouts that hold codes */
            if (strcmp(n, "emulation") && strcmp(n, "cpu") &&
                strcmp(n, "flashinfer_trtllm"))
                return s;
        } else if (wna16_spec_kind(s) == WNA16_SPEC_BACKEND ||
                   strcmp(n, "moe_wna16") == 0) {
            return s;
        }
    }
}

static int compare_sets(const wna16_tensor_set_t *a, const wna16_tensor_set_t *b,
                        const char *what)
{
    TU_CHECK_MSG(wna16_tensor_set_count(a) == wna16_tensor_set_count(b),
                 "%s: %zu tensors from the reference, %zu generated", what,
                 wna16_tensor_set_count(a), wna16_tensor_set_count(b));
    int same = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(a); i++) {
        const wna16_tensor_t *x = wna16_tensor_set_at(a, i);
        const wna16_tensor_t *y = wna16_tensor_set_find(b, x->name);
        TU_CHECK_MSG(y != NULL, "%s: %s not generated", what, x->name);
        if (!y)
            continue;
        bool ok = x->dtype == y->dtype && x->ndim == y->ndim &&
                  x->nbytes == y->nbytes;
        for (int d = 0; ok && d < x->ndim; d++)
            ok = x->shape[d] == y->shape[d];
        TU_CHECK_MSG(ok, "%s: %s: dtype/shape differ", what, x->name);
        if (!ok)
            continue;
        size_t diff = 0;
        const uint8_t *p = x->data, *q = y->data;
        while (diff < x->nbytes && p[diff] == q[diff])
            diff++;
        TU_CHECK_MSG(diff == x->nbytes, "%s: %s differs at byte %zu of %zu "
                     "(reference %02x, generated %02x)", what, x->name, diff,
                     x->nbytes, diff < x->nbytes ? p[diff] : 0,
                     diff < x->nbytes ? q[diff] : 0);
        same += diff == x->nbytes;
    }
    return same;
}

/* One random configuration: 1 if compared, 0 if both refused. */
static int one(void)
{
    static const int gss[] = {-1, 32, 64, 128};
    static const int sizes[] = {32, 64, 96, 128, 160, 192, 256};
    const wna16_spec_t *src = pick_spec(true), *dst = pick_spec(false);
    wna16_quant_desc_t q = {0};
    /* 8-bit activations: mostly into the Marlin layouts that hold them (a
     * quarter of the draws go there; then mostly W4A8 without act-order,
     * what they hold), a few elsewhere (both paths must refuse alike) */
    if (tu_rng_below(&rng, 4) == 0)
        dst = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, tu_rng_below(&rng, 2)
                                                           ? "marlin"
                                                           : "batched_marlin");
    bool marlin = strstr(wna16_spec_name(dst), "marlin") != NULL;
    if (marlin ? tu_rng_below(&rng, 4) != 0 : tu_rng_below(&rng, 20) == 0)
        q.input_dtype = tu_rng_below(&rng, 2) ? WNA16_INPUT_INT8
                                              : WNA16_INPUT_FP8;
    bool a8 = q.input_dtype != WNA16_INPUT_16BIT;
    q.bits = tu_rng_below(&rng, a8 ? 8 : 3) ? 4 : 8;
    q.group_size = gss[tu_rng_below(&rng, 4)];
    q.zero_point = tu_rng_below(&rng, 2);
    q.act_order = q.group_size > 0 && tu_rng_below(&rng, a8 ? 12 : 6) == 0;
    q.bias = tu_rng_below(&rng, 5) == 0;
    positive_scales = q.input_dtype == WNA16_INPUT_INT8 &&
                      tu_rng_below(&rng, 5) != 0;
    int32_t E = 1 + (int32_t)tu_rng_below(&rng, 3);
    int32_t H = sizes[tu_rng_below(&rng, 7)], I = sizes[tu_rng_below(&rng, 7)];
    if (tu_rng_below(&rng, 4) == 0)
        I = 8 * (1 + (int32_t)tu_rng_below(&rng, 40));
    if (tu_rng_below(&rng, 4) == 0) {
        H = 256;
        I = 256;
    }
    if (q.group_size > 0 && (H % q.group_size || I % q.group_size))
        return 0;
    wna16_qlayer_t L = {.E = E, .H = H, .I = I};
    wna16_error_t err;
    if (wna16_qweight_alloc(&L.w13, E, 2 * I, H, q.bits, q.group_size,
                            q.zero_point, q.act_order, q.bias, &err) ||
        wna16_qweight_alloc(&L.w2, E, H, I, q.bits, q.group_size, q.zero_point,
                            q.act_order, q.bias, &err)) {
        wna16_qlayer_free(&L);
        return 0;
    }
    wna16_dtype_t sd = tu_rng_below(&rng, 2) ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
    L.w13.scale_dtype = L.w2.scale_dtype = L.w13.bias_dtype = L.w2.bias_dtype = sd;
    fill(&L.w13);
    fill(&L.w2);
    char what[256];
    snprintf(what, sizeof what, "%s -> %s E=%d H=%d I=%d b%d g%d zp%d ao%d "
             "bias%d %s", wna16_spec_name(src), wna16_spec_name(dst), E, H, I,
             q.bits, q.group_size, q.zero_point, q.act_order, q.bias,
             wna16_input_dtype_name(q.input_dtype));
    wna16_tensor_set_t *s = NULL, *ref = NULL, *gen = NULL;
    wna16_tensor_set_create(ctx, &s, &err);
    wna16_tensor_set_create(ctx, &ref, &err);
    wna16_tensor_set_create(ctx, &gen, &err);
    int compared = 0;
    /* the source checkpoint, written by the reference: a stacked layout
     * that holds the 8-bit variant is written in it (a Marlin source for
     * those activations), every other one as it always is */
    wna16_status_t enc = wna16_ref_encode_input(ctx, src, &L, q.input_dtype,
                                                "m.experts", s, &err);
    if (enc == WNA16_EUNSUPPORTED && q.input_dtype != WNA16_INPUT_16BIT) {
        wna16_tensor_set_destroy(s);
        wna16_tensor_set_create(ctx, &s, &err);
        enc = wna16_ref_encode(ctx, src, &L, "m.experts", s, &err);
    }
    if (enc == WNA16_OK) {
        wna16_error_t e1, e2;
        wna16_status_t r1 = wna16_repack_layer(ctx, src, s, "m.experts", E, H, I,
                                               &q, dst, WNA16_TARGET_REFERENCE,
                                               ref, &e1);
        wna16_status_t r2 = wna16_repack_layer(ctx, src, s, "m.experts", E, H, I,
                                               &q, dst, target, gen, &e2);
        TU_CHECK_MSG(r1 == r2, "%s: reference %s (%s), generated %s (%s)", what,
                     wna16_status_name(r1), r1 ? e1.message : "",
                     wna16_status_name(r2), r2 ? e2.message : "");
        if (r1 == WNA16_OK && r2 == WNA16_OK) {
            compare_sets(ref, gen, what);
            compared = 1;
            compared_by_input[q.input_dtype]++;
        } else if (r1 == r2) {
            TU_CHECK_MSG(strcmp(e1.message, e2.message) == 0,
                         "%s: refusals differ: \"%s\" vs \"%s\"", what,
                         e1.message, e2.message);
        }
    }
    wna16_tensor_set_destroy(s);
    wna16_tensor_set_destroy(ref);
    wna16_tensor_set_destroy(gen);
    wna16_qlayer_free(&L);
    return compared;
}

int main(int argc, char **argv)
{
    long want = argc > 1 ? strtol(argv[1], NULL, 10) : 200;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 0x9e11;
    if (argc > 3 && strcmp(argv[3], "cuda") == 0)
        target = WNA16_TARGET_CUDA;
#ifndef WNA16_HAVE_LLVM
    if (target == WNA16_TARGET_CPU)
        tu_skip("the CPU target needs LLVM 19 (install llvm-19-dev)");
#endif
    tu_rng_seed(&rng, seed);
    ctx = tu_context();
    if (target == WNA16_TARGET_CUDA) {
        wna16_device_info_t dev;
        wna16_probe_device(&dev);
        if (dev.platform != WNA16_PLATFORM_CUDA)
            tu_skip(dev.notes);
        printf("running the kernels on %s\n", dev.name);
    }
    int compared = 0, tries = 0;
    while (compared < want && tries < want * 20) {
        compared += one();
        tries++;
        if (tu_failures > 20)
            break;
    }
    printf("%d configurations compared byte for byte (%d tried, seed %#llx): "
           "%d with 16-bit, %d with int8, %d with fp8 activations\n",
           compared, tries, (unsigned long long)seed,
           compared_by_input[WNA16_INPUT_16BIT],
           compared_by_input[WNA16_INPUT_INT8],
           compared_by_input[WNA16_INPUT_FP8]);
    TU_CHECK(compared >= want);
    /* the 8-bit variants get a fair share of a full run */
    TU_CHECK(want < 100 || (compared_by_input[WNA16_INPUT_INT8] >= want / 20 &&
                            compared_by_input[WNA16_INPUT_FP8] >= want / 20));
    wna16_context_destroy(ctx);
    return tu_finish("test_repack_gen");
}
