/*
 * test_spec_real.c - layouts checked at the size a repack or a fused MoE
 * runs, not only on their spec's samples. (i) Three specs that pass
 * `specs validate` (tests/data/specs/bad/, the three *_at_real_size.json:
 * codes that wrap at 4096 output channels, rows that leave the shape past
 * 4096 channels, an inverse map dividing by 4096 - H) repack at a
 * sample-like size, and are refused at a size that breaks them by
 * wna16_repack_layer on the reference and the CPU target and by the
 * generated fused MoE, with the spec file, the JSON path and the elements
 * (or the expression)
 * at fault. (ii) The cost of validating samples is capped: the largest
 * sample the check used to allow (tests/data/specs/max_sample/) evaluates
 * at most W16_SAMPLE_BUDGET elements and places, and a sample whose maps
 * cannot be proved within that budget is refused as too large. (iii) A
 * spec directory that does not exist, or holds neither formats/ nor
 * backends/, fails context creation with its path.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "spec/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD WNA16_TEST_DATA "/specs/bad/"
#define PREFIX "model.layers.0.mlp.experts"

/* A random GPTQ checkpoint layer (4-bit, channelwise, symmetric). */
static wna16_tensor_set_t *gptq_layer(wna16_context_t *ctx, int32_t E,
                                      int32_t H, int32_t I)
{
    wna16_error_t err = {0};
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    TU_CHECK(gptq != NULL);
    wna16_qlayer_t L = {.E = E, .H = H, .I = I};
    TU_OK(wna16_qweight_alloc(&L.w13, E, 2 * I, H, 4, -1, false, false, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, E, H, I, 4, -1, false, false, false,
                              &err), &err);
    tu_rng_t r;
    tu_rng_seed(&r, 5);
    wna16_qweight_t *q[2] = {&L.w13, &L.w2};
    for (int g = 0; g < 2; g++) {
        size_t n = (size_t)q[g]->E * q[g]->N * q[g]->K;
        for (size_t i = 0; i < n; i++)
            q[g]->codes[i] = (uint8_t)tu_rng_below(&r, 16);
        for (int32_t i = 0; i < q[g]->E * q[g]->N; i++)
            q[g]->scales[i] = 0.5f;
        q[g]->scale_dtype = WNA16_DTYPE_F16;
    }
    wna16_tensor_set_t *ts = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &ts, &err), &err);
    TU_OK(wna16_ref_encode(ctx, gptq, &L, PREFIX, ts, &err), &err);
    wna16_qlayer_free(&L);
    return ts;
}

/* The message starts with the spec file and holds every word of want[]. */
static bool names(const wna16_error_t *e, const char *file,
                  const char *const *want, int n)
{
    if (strncmp(e->message, file, strlen(file)) != 0)
        return false;
    for (int i = 0; i < n; i++)
        if (!strstr(e->message, want[i]))
            return false;
    return true;
}

typedef struct bad_spec {
    const char *file;
    int32_t E, H, I_good, I_bad; /* a size it holds, a size it breaks */
    const char *want[3];
} bad_spec_t;

static const bad_spec_t bad_specs[] = {
    {BAD "overlap_at_real_size.json", 1, 64, 2048, 4096,
     {"$.layouts.qweight (E=1 H=64 I=4096 BITS=4 GS=-1, w13)",
      "(e=0, n=0, k=0) and (e=0, n=4096, k=0) map to the same place", NULL}},
    {BAD "outside_at_real_size.json", 1, 64, 2048, 4096,
     {"$.layouts.qweight (E=1 H=64 I=4096 BITS=4 GS=-1, w13)",
      "maps to index[1] = ", "outside the shape (4096)"}},
    /* H is the size here: good at H = 2048, divides by zero at 4096 */
    {BAD "divide_at_real_size.json", 1, 4096, 64, 64,
     {"$.layouts.qweight.coord.k (E=1 H=4096 I=64 BITS=4 GS=-1, w13)",
      "division by zero", NULL}},
};

static void test_refused_at_real_size(void)
{
    wna16_context_t *ctx = tu_context();
    wna16_error_t err = {0};
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    wna16_quant_desc_t q = {.bits = 4, .group_size = -1};
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
        const bad_spec_t *c = &bad_specs[i];
        int n_want = c->want[2] ? 3 : 2;
        /* the samples pass: what `wna16 specs validate` runs */
        TU_OK(wna16_spec_validate_file(ctx, c->file, &err), &err);
        const wna16_spec_t *spec = NULL;
        TU_OK(wna16_spec_load_file(ctx, c->file, &spec, &err), &err);
        if (!spec || !gptq)
            continue;
        bool by_h = c->I_good == c->I_bad;
        /* a size the layout holds repacks */
        int32_t H_good = by_h ? 2048 : c->H;
        wna16_tensor_set_t *src = gptq_layer(ctx, c->E, H_good, c->I_good);
        wna16_tensor_set_t *out = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
        TU_OK(wna16_repack_layer(ctx, gptq, src, PREFIX, c->E, H_good,
                                 c->I_good, &q, spec, WNA16_TARGET_REFERENCE,
                                 out, &err), &err);
        wna16_tensor_set_destroy(out);
        wna16_tensor_set_destroy(src);
        /* the size that breaks it is refused before any work, on every
         * target */
        src = gptq_layer(ctx, c->E, c->H, c->I_bad);
        static const wna16_target_t targets[] = {WNA16_TARGET_REFERENCE,
                                                 WNA16_TARGET_CPU};
        for (int t = 0; t < 2; t++) {
            wna16_error_t e = {0};
            TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
            wna16_status_t st = wna16_repack_layer(ctx, gptq, src, PREFIX,
                                                   c->E, c->H, c->I_bad, &q,
                                                   spec, targets[t], out, &e);
            TU_CHECK_MSG(st == WNA16_ESPEC && names(&e, c->file, c->want,
                                                    n_want),
                         "repack to %s on target %d: %s: %s", c->file, t,
                         wna16_status_name(st), e.message);
            TU_CHECK(wna16_tensor_set_count(out) == 0);
            wna16_tensor_set_destroy(out);
            if (t == 0)
                printf("refused: %s\n", e.message);
        }
        /* and so is the generated fused MoE, before it binds a tensor */
        wna16_moe_layer_t *L = NULL;
        wna16_error_t e = {0};
        wna16_status_t st = wna16_moe_layer_create(ctx, spec, src, PREFIX,
                                                   c->E, c->H, c->I_bad, &q,
                                                   WNA16_TARGET_CPU, &L, &e);
        if (st == WNA16_EUNAVAILABLE) {
            printf("fused MoE: %s (not checked)\n", e.message);
        } else {
            TU_CHECK_MSG(st == WNA16_ESPEC && !L &&
                             names(&e, c->file, c->want, n_want),
                         "fused MoE on %s: %s: %s", c->file,
                         wna16_status_name(st), e.message);
        }
        wna16_moe_layer_destroy(L);
        wna16_tensor_set_destroy(src);
    }
    wna16_context_destroy(ctx);
}

/* ---- the cost of samples ------------------------------------------------------ */

static void test_sample_budget(void)
{
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .no_builtin_specs = true};
    wna16_context_t *ctx = NULL;
    wna16_error_t err = {0};
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return;
    const char *path =
        WNA16_TEST_DATA "/specs/max_sample/backends/marlin_max_sample.json";
    size_t len = 0;
    char *text = tu_read_file(path, &len);
    TU_CHECK(text != NULL);
    wna16_spec_t *s = NULL;
    if (text)
        TU_OK(w16_spec_parse(ctx, path, text, len, &s, &err), &err);
    if (s) {
        w16_check_stats_t st = {0};
        TU_OK(w16_spec_check_layouts_stats(s, true, &st, &err), &err);
        printf("largest sample (marlin, E=16 H=1024 I=512): %lld elements "
               "and places evaluated (budget %lld): %d layouts walked, %d "
               "proved\n", (long long)st.evaluated,
               (long long)W16_SAMPLE_BUDGET, st.exhaustive, st.proved);
        TU_CHECK(st.most <= W16_SAMPLE_BUDGET &&
                 st.evaluated <= W16_SAMPLE_BUDGET);
        TU_CHECK(st.proved >= 1);
        w16_spec_free(s);
    }
    free(text);

    /* A layout the proof cannot reduce (its forward map mixes n and k
     * with ^) at a sample too large to walk within the budget. */
    static const char xor_spec[] =
        "{ \"wna16_spec\": 1, \"kind\": \"backend\", \"name\": \"xor\",\n"
        "  \"capabilities\": { \"bits\": [8], \"group_sizes\": \"any\",\n"
        "    \"zero_points\": false, \"bias\": false, \"act_order\": false },\n"
        "  \"layouts\": {\n"
        "    \"qweight\": { \"dtype\": \"U8\", \"shape\": [\"E\", \"N\", \"K\"],\n"
        "      \"index\": [\"e\", \"n ^ (k % N)\", \"k\"],\n"
        "      \"coord\": { \"e\": \"i0\", \"n\": \"i1 ^ (i2 % N)\", \"k\": \"i2\" } },\n"
        "    \"scales\": { \"dtype\": \"F16\", \"shape\": [\"E\", \"G\", \"N\"],\n"
        "      \"index\": [\"e\", \"g\", \"n\"],\n"
        "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" } } },\n"
        "  \"selection\": { \"vllm_name\": \"XOR\", \"kernels\": [ { \"name\": \"X\" } ],\n"
        "    \"kernel_platforms\": [\"cpu\"] },\n"
        "  \"samples\": [ { \"E\": 1, \"H\": 64, \"I\": 32, \"BITS\": 8, \"GS\": -1 },\n"
        "                { \"E\": 1, \"H\": 4096, \"I\": 2048, \"BITS\": 8, \"GS\": -1 } ] }\n";
    s = NULL;
    TU_OK(w16_spec_parse(ctx, "xor", xor_spec, strlen(xor_spec), &s, &err),
          &err);
    if (s) {
        w16_check_stats_t st = {0};
        wna16_error_t e = {0};
        TU_CHECK(w16_spec_check_layouts_stats(s, true, &st, &e) ==
                     WNA16_ESPEC &&
                 strstr(e.message, "xor: $.layouts.qweight (sample 1, w13): "
                                   "sample too large to check"));
        TU_CHECK(st.most <= W16_SAMPLE_BUDGET);
        printf("refused: %s\n", e.message);
        w16_spec_free(s);
    }
    wna16_context_destroy(ctx);
}

/* ---- spec directories ----------------------------------------------------------- */

static void test_spec_dir(void)
{
    static const struct { const char *dir, *want; wna16_status_t st; } bad[] = {
        {"/nonexistent/wna16-specs", "No such file or directory",
         WNA16_ENOTFOUND},
        {WNA16_TEST_DATA "/specs/bad", "holds neither formats/ nor backends/",
         WNA16_ENOTFOUND},
        {WNA16_TEST_DATA "/specs/bad/unknown_key.json", "not a directory",
         WNA16_EINVAL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int env = 0; env < 2; env++) {
            wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR};
            if (env)
                setenv("WNA16_SPEC_DIR", bad[i].dir, 1);
            else
                o.spec_dir = bad[i].dir;
            wna16_context_t *ctx = NULL;
            wna16_error_t e = {0};
            wna16_status_t st = wna16_context_create(&o, &ctx, &e);
            TU_CHECK_MSG(st == bad[i].st && !ctx &&
                             strstr(e.message, bad[i].dir) &&
                             strstr(e.message, bad[i].want),
                         "%s (%s): %s: %s", bad[i].dir,
                         env ? "WNA16_SPEC_DIR" : "spec_dir",
                         wna16_status_name(st), e.message);
            if (env && i == 0)
                printf("WNA16_SPEC_DIR=%s: %s\n", bad[i].dir, e.message);
            wna16_context_destroy(ctx);
            unsetenv("WNA16_SPEC_DIR");
        }
    }
    /* a directory with backends/ only is fine */
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .spec_dir = WNA16_TEST_DATA "/specs"};
    wna16_context_t *ctx = NULL;
    wna16_error_t err = {0};
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    wna16_context_destroy(ctx);
}

int main(void)
{
    test_refused_at_real_size();
    test_sample_budget();
    test_spec_dir();
    return tu_finish("test_spec_real");
}
