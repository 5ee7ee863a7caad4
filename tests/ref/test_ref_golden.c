/*
 * test_ref_golden.c - the reference against vLLM's own tensors: every case
 * in ../shared/golden is decoded from its checkpoint through the format
 * spec and encoded through the backend specs; the result must equal, byte
 * for byte, what vLLM's conversion produced (expected_triton,
 * expected_emulation, and every tensor of expected_marlin: codes, scales,
 * zero words, sorted g_idx and sort indices, act-order included;
 * expected_xpu with its empty (0,) g_idx placeholders).
 *
 * bf16 models (config.json torch_dtype bfloat16): vLLM's weight loader
 * copies the checkpoint's float16 scales into bfloat16 parameters. The
 * test restates that cast on the decoded layer (float16 -> bfloat16, round
 * to nearest even, as torch's copy_ does) before encoding, and re-encoding
 * into the checkpoint's own format is then skipped for those cases.
 */
#include "ref_util.h"

#include <string.h>

static wna16_context_t *ctx;
static const char *const prefix = "model.layers.0.mlp.experts";

typedef struct golden {
    wna16_checkpoint_t *ck;
    wna16_tensor_set_t *set;
    const wna16_model_config_t *cfg;
    wna16_quant_desc_t quant;
    wna16_qlayer_t layer;
    char dir[1024];
} golden_t;

static bool open_case(golden_t *g, const char *name)
{
    wna16_error_t err;
    memset(g, 0, sizeof *g);
    snprintf(g->dir, sizeof g->dir, "%s/%s", WNA16_GOLDEN_DIR, name);
    wna16_status_t st = wna16_checkpoint_open(ctx, g->dir, &g->ck, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s: %s", name, err.message);
    if (st != WNA16_OK)
        return false;
    g->cfg = wna16_checkpoint_config(g->ck);
    TU_CHECK(g->cfg != NULL);
    TU_OK(wna16_model_config_quant(g->cfg, &g->quant, &err), &err);
    TU_OK(wna16_tensor_set_create(ctx, &g->set, &err), &err);
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(g->ck); i++)
        TU_OK(wna16_tensor_set_add_view(g->set,
                                        wna16_checkpoint_tensor_at(g->ck, i),
                                        &err), &err);
    const wna16_spec_t *fmt = wna16_spec_find(ctx, WNA16_SPEC_FORMAT,
                                              g->cfg->format_name);
    TU_CHECK(fmt != NULL);
    st = wna16_ref_decode(ctx, fmt, g->set, prefix, g->cfg->num_experts,
                          g->cfg->hidden_size, g->cfg->moe_intermediate_size,
                          &g->quant, &g->layer, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s: decode: %s", name, err.message);
    return st == WNA16_OK;
}

static void close_case(golden_t *g)
{
    wna16_qlayer_free(&g->layer);
    wna16_tensor_set_destroy(g->set);
    wna16_checkpoint_close(g->ck);
}

static bool name_in(const char *name, const char *const *only)
{
    if (!only)
        return true;
    for (; *only; only++) {
        size_t n = strlen(name), m = strlen(*only);
        if (n >= m && strcmp(name + n - m, *only) == 0)
            return true;
    }
    return false;
}

/* Compares the tensors of `file` (those ending in a name of `only`, or all)
 * with the tensors of the same names in `got`. */
static int compare_file(const char *case_name, const char *file,
                        const wna16_tensor_set_t *got,
                        const char *const *only)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    if (wna16_safetensors_open(ctx, file, &st, &err) != WNA16_OK) {
        TU_CHECK_MSG(false, "%s: %s", file, err.message);
        return 0;
    }
    int compared = 0;
    for (size_t i = 0; i < wna16_safetensors_count(st); i++) {
        const wna16_tensor_t *want = wna16_safetensors_at(st, i);
        if (!name_in(want->name, only))
            continue;
        const wna16_tensor_t *t = wna16_tensor_set_find(got, want->name);
        TU_CHECK_MSG(t != NULL, "%s: %s missing from the repack", case_name,
                     want->name);
        if (!t)
            continue;
        bool same_shape = t->ndim == want->ndim && t->dtype == want->dtype;
        for (int d = 0; same_shape && d < t->ndim; d++)
            same_shape = t->shape[d] == want->shape[d];
        TU_CHECK_MSG(same_shape, "%s: %s: dtype/shape differ", case_name,
                     want->name);
        if (!same_shape)
            continue;
        const uint8_t *a = t->data, *b = want->data;
        size_t diff = 0;
        while (diff < want->nbytes && a[diff] == b[diff])
            diff++;
        TU_CHECK_MSG(diff == want->nbytes, "%s: %s: first difference at byte "
                     "%zu of %zu (got %02x, vLLM %02x)", case_name, want->name,
                     diff, want->nbytes, diff < want->nbytes ? a[diff] : 0,
                     diff < want->nbytes ? b[diff] : 0);
        compared++;
    }
    wna16_safetensors_close(st);
    return compared;
}

static wna16_tensor_set_t *encode(golden_t *g, const char *backend)
{
    wna16_error_t err;
    wna16_tensor_set_t *out = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
    const wna16_spec_t *s = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, backend);
    wna16_status_t st = wna16_ref_encode(ctx, s, &g->layer, prefix, out, &err);
    TU_CHECK_MSG(st == WNA16_OK, "encode %s: %s", backend, err.message);
    return out;
}

/* torch's copy_ of a float tensor into a bfloat16 parameter. */
static void to_bf16(wna16_qweight_t *w)
{
    size_t n = (size_t)w->E * (size_t)w->G * (size_t)w->N;
    for (size_t i = 0; i < n; i++)
        w->scales[i] = wna16_bf16_to_f32(wna16_f32_to_bf16(w->scales[i]));
    w->scale_dtype = WNA16_DTYPE_BF16;
}

static void check_case(const char *name)
{
    golden_t g;
    if (!open_case(&g, name)) {
        close_case(&g);
        return;
    }
    bool bf16 = strcmp(g.cfg->torch_dtype, "bfloat16") == 0;
    if (bf16) { /* the loader's cast (the layer decoded, kept to compare) */
        to_bf16(&g.layer.w13);
        to_bf16(&g.layer.w2);
    }
    char file[1200];
    int n = 0;
    snprintf(file, sizeof file, "%s/expected_triton.safetensors", g.dir);
    if (tu_exists(file)) {
        wna16_tensor_set_t *t = encode(&g, "triton");
        n += compare_file(name, file, t, NULL);
        /* The XPU conversion of 4-bit weights is byte-identical. */
        char xfile[1200];
        snprintf(xfile, sizeof xfile, "%s/expected_xpu.safetensors", g.dir);
        if (tu_exists(xfile)) { /* vLLM's own: every tensor */
            wna16_tensor_set_t *x = encode(&g, "xpu");
            int m = compare_file(name, xfile, x, NULL);
            TU_CHECK_MSG((size_t)m == wna16_tensor_set_count(x), "%s: xpu: "
                         "%d of %zu tensors compared", name, m,
                         wna16_tensor_set_count(x));
            n += m;
            wna16_tensor_set_destroy(x);
        } else if (g.quant.bits == 4) {
            wna16_tensor_set_t *x = encode(&g, "xpu");
            static const char *const xpu_names[] = {"w13_qweight", "w2_qweight",
                                                    "w13_scales", "w2_scales",
                                                    NULL};
            n += compare_file(name, file, x, xpu_names);
            wna16_tensor_set_destroy(x);
        }
        /* And it decodes back to the checkpoint's values. */
        wna16_qlayer_t back;
        wna16_error_t err;
        const wna16_spec_t *ts = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
        TU_OK(wna16_ref_decode(ctx, ts, t, prefix, g.layer.E, g.layer.H,
                               g.layer.I, &g.quant, &back, &err), &err);
        TU_CHECK(memcmp(back.w13.codes, g.layer.w13.codes,
                        (size_t)g.layer.E * g.layer.w13.N * g.layer.w13.K) == 0);
        TU_CHECK(memcmp(back.w2.scales, g.layer.w2.scales,
                        sizeof(float) * (size_t)g.layer.E * g.layer.w2.G *
                            g.layer.w2.N) == 0);
        wna16_qlayer_free(&back);
        wna16_tensor_set_destroy(t);
    }
    snprintf(file, sizeof file, "%s/expected_emulation.safetensors", g.dir);
    if (tu_exists(file)) {
        wna16_tensor_set_t *t = encode(&g, "emulation");
        n += compare_file(name, file, t, NULL);
        wna16_tensor_set_destroy(t);
    }
    snprintf(file, sizeof file, "%s/expected_marlin.safetensors", g.dir);
    if (tu_exists(file)) {
        wna16_tensor_set_t *t = encode(&g, "marlin");
        int m = compare_file(name, file, t, NULL);
        TU_CHECK_MSG((size_t)m == wna16_tensor_set_count(t), "%s: marlin: %d "
                     "of %zu tensors compared", name, m,
                     wna16_tensor_set_count(t));
        n += m;
        /* and Marlin decodes back to the checkpoint's layer */
        wna16_qlayer_t back;
        wna16_error_t err;
        const wna16_spec_t *ms = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "marlin");
        wna16_quant_desc_t q = g.quant;
        TU_OK(wna16_ref_decode(ctx, ms, t, prefix, g.layer.E, g.layer.H,
                               g.layer.I, &q, &back, &err), &err);
        TU_CHECK(memcmp(back.w13.codes, g.layer.w13.codes,
                        (size_t)g.layer.E * g.layer.w13.N * g.layer.w13.K) == 0);
        if (q.act_order)
            TU_CHECK(memcmp(back.w2.g_idx, g.layer.w2.g_idx,
                            sizeof(int32_t) * (size_t)g.layer.E * g.layer.w2.K) == 0);
        wna16_qlayer_free(&back);
        wna16_tensor_set_destroy(t);
    }
    /* Encoding back into the checkpoint's own format gives the file back
     * (not after the bf16 cast: the checkpoint holds float16 scales). */
    snprintf(file, sizeof file, "%s/model.safetensors", g.dir);
    if (!bf16) {
        wna16_error_t err;
        wna16_tensor_set_t *t = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &t, &err), &err);
        const wna16_spec_t *fs = wna16_spec_find(ctx, WNA16_SPEC_FORMAT,
                                                 g.cfg->format_name);
        TU_OK(wna16_ref_encode(ctx, fs, &g.layer, prefix, t, &err), &err);
        int m = compare_file(name, file, t, NULL);
        TU_CHECK_MSG(m == (int)wna16_checkpoint_tensor_count(g.ck),
                     "%s: %d of %zu checkpoint tensors rebuilt", name, m,
                     wna16_checkpoint_tensor_count(g.ck));
        n += m;
        wna16_tensor_set_destroy(t);
    }
    printf("%s: %d tensors equal vLLM's\n", name, n);
    TU_CHECK(n > 0);
    close_case(&g);
}

int main(void)
{
    char probe[1024];
    snprintf(probe, sizeof probe, "%s/index.json", WNA16_GOLDEN_DIR);
    if (!tu_exists(probe))
        tu_skip("golden files not found at " WNA16_GOLDEN_DIR
                " (../shared/golden beside the checkout)");
    ctx = tu_context();
    static const char *const cases[] = {
        "gptq_b4_g128", "gptq_b4_gm1",     "gptq_b8_g128",
        "awq_b4_g128",  "gptq_b4_g32_pad", "gptq_b4_gm1_pad",
        "awq_b4_g32_pad", "gptq_b4_g128_actorder",
        "gptq_b4_g128_bf16", "awq_b4_g128_bf16", "gptq_b4_g32_xpu",
        "ct_b4_g32"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cases[i]);
    wna16_context_destroy(ctx);
    return tu_finish("test_ref_golden");
}
