/*
 * test_checkpoint_layer.c - wna16_checkpoint_layer_open/_close: one MoE
 * layer of a checkpoint collected for the repack. On the golden GPTQ
 * checkpoint: sizes, top-k, activation dtype, quantization and what the
 * tensors add (zero points and g_idx carried but unused), every tensor of
 * the layer and nothing else; a copy with expert biases added gets
 * quant.bias and its bias tensors, and its repack holds the stacked bias;
 * a lone .safetensors file needs a config passed in; refusals name the
 * argument (NULL pointers, a backend as the format, a prefix with no
 * layer) and leave the struct zeroed. Needs WNA16_GOLDEN_DIR (77 without).
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *PREFIX = "model.layers.0.mlp.experts";

static bool zeroed(const wna16_checkpoint_layer_t *L)
{
    static const wna16_checkpoint_layer_t z;
    return memcmp(L, &z, sizeof z) == 0;
}

/* Copies `src` (a golden checkpoint directory) to `dir` with a bias
 * tensor [N] F16 added to every expert's projections. */
static bool write_with_bias(wna16_context_t *ctx, const char *src,
                            const char *dir)
{
    char path[4400];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/config.json", src);
    void *cfg = tu_read_file(path, &n);
    snprintf(path, sizeof path, "%s/config.json", dir);
    bool ok = cfg && tu_write_file(path, cfg, n) == 0;
    free(cfg);
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    wna16_safetensors_writer_t *w = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ok = ok && wna16_checkpoint_open(ctx, src, &ck, &err) == WNA16_OK &&
         wna16_safetensors_writer_create(ctx, path, &w, &err) == WNA16_OK;
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    size_t count = ck ? wna16_checkpoint_tensor_count(ck) : 0;
    for (size_t i = 0; ok && i < count; i++) {
        const wna16_tensor_t *t = wna16_checkpoint_tensor_at(ck, i);
        ok = wna16_safetensors_writer_declare(w, t->name, t->dtype, t->ndim,
                                              t->shape, &err) == WNA16_OK;
    }
    char name[600];
    int64_t N[3] = {256, 256, 256}; /* gptq_b4_g128: H = I = 256 */
    for (int e = 0; ok && e < 2; e++)
        for (int p = 0; ok && p < 3; p++) {
            snprintf(name, sizeof name, "%s.%d.%s.bias", PREFIX, e, proj[p]);
            ok = wna16_safetensors_writer_declare(w, name, WNA16_DTYPE_F16, 1,
                                                  &N[p], &err) == WNA16_OK;
        }
    for (size_t i = 0; ok && i < count; i++) {
        const wna16_tensor_t *t = wna16_checkpoint_tensor_at(ck, i);
        ok = wna16_safetensors_writer_write(w, t->data, t->nbytes, &err) ==
             WNA16_OK;
    }
    uint16_t bias[256];
    for (int i = 0; i < 256; i++)
        bias[i] = wna16_f32_to_f16((float)(i % 7) * 0.125f - 0.375f);
    for (int k = 0; ok && k < 6; k++)
        ok = wna16_safetensors_writer_write(w, bias, sizeof bias, &err) ==
             WNA16_OK;
    if (ok)
        ok = wna16_safetensors_writer_finish(w, &err) == WNA16_OK;
    else if (w)
        wna16_safetensors_writer_abort(w);
    if (!ok)
        fprintf(stderr, "writing %s: %s\n", path, err.message);
    wna16_checkpoint_close(ck);
    return ok;
}

int main(void)
{
    char golden[4096];
    snprintf(golden, sizeof golden, "%s/gptq_b4_g128", WNA16_GOLDEN_DIR);
    struct stat sb;
    if (stat(golden, &sb) != 0)
        tu_skip("no golden checkpoint gptq_b4_g128 (WNA16_GOLDEN_DIR)");
    wna16_context_t *ctx = tu_context();
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    TU_OK(wna16_checkpoint_open(ctx, golden, &ck, &err), &err);
    if (!ck)
        return tu_finish("host_checkpoint_layer");

    /* the golden layer */
    wna16_checkpoint_layer_t L;
    TU_OK(wna16_checkpoint_layer_open(ctx, ck, NULL, NULL, PREFIX, &L, &err),
          &err);
    TU_CHECK(L.format && strcmp(wna16_spec_name(L.format), "gptq") == 0);
    TU_CHECK(strcmp(L.prefix, PREFIX) == 0);
    TU_CHECK(L.E == 2 && L.H == 256 && L.I == 256 && L.topk == 2);
    TU_CHECK(L.act_dtype == WNA16_DTYPE_F16); /* torch_dtype float16 */
    TU_CHECK(L.quant.bits == 4 && L.quant.group_size == 128);
    TU_CHECK(!L.quant.zero_point && !L.quant.act_order && !L.quant.bias);
    TU_CHECK(L.quant.zeros_stored && L.quant.g_idx_stored);
    /* 2 experts x 3 projections x (qweight, qzeros, scales, g_idx) */
    TU_CHECK_MSG(L.tensors && wna16_tensor_set_count(L.tensors) == 24,
                 "%zu tensors",
                 L.tensors ? wna16_tensor_set_count(L.tensors) : 0);
    const wna16_tensor_t *q = L.tensors ? wna16_tensor_set_find(
        L.tensors, "model.layers.0.mlp.experts.1.down_proj.qweight") : NULL;
    TU_CHECK(q && q->data == wna16_checkpoint_find(
                  ck, "model.layers.0.mlp.experts.1.down_proj.qweight")->data);
    wna16_checkpoint_layer_close(&L);
    TU_CHECK(zeroed(&L));
    wna16_checkpoint_layer_close(&L); /* twice is fine */

    /* refusals */
    TU_CHECK(wna16_checkpoint_layer_open(ctx, NULL, NULL, NULL, PREFIX, &L,
                                         &err) == WNA16_EINVAL);
    TU_CHECK_MSG(strstr(err.message, "ck is NULL"), "%s", err.message);
    TU_CHECK(zeroed(&L));
    TU_CHECK(wna16_checkpoint_layer_open(ctx, ck, NULL, NULL, NULL, &L,
                                         &err) == WNA16_EINVAL);
    TU_CHECK(wna16_checkpoint_layer_open(ctx, ck, NULL, NULL,
                                         "model.layers.9.mlp.experts", &L,
                                         &err) == WNA16_ENOTFOUND);
    TU_CHECK_MSG(strstr(err.message, "model.layers.9.mlp.experts"), "%s",
                 err.message);
    TU_CHECK(zeroed(&L));
    TU_CHECK(wna16_checkpoint_layer_open(
                 ctx, ck, NULL, wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                "marlin"),
                 PREFIX, &L, &err) == WNA16_EINVAL);
    TU_CHECK_MSG(strstr(err.message, "backend"), "%s", err.message);
    wna16_checkpoint_close(ck);

    /* a lone .safetensors file: the config comes from the caller */
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", golden);
    TU_OK(wna16_checkpoint_open(ctx, path, &ck, &err), &err);
    TU_CHECK(wna16_checkpoint_layer_open(ctx, ck, NULL, NULL, PREFIX, &L,
                                         &err) == WNA16_EINVAL);
    TU_CHECK_MSG(strstr(err.message, "config.json"), "%s", err.message);
    wna16_model_config_t cfg;
    snprintf(path, sizeof path, "%s/config.json", golden);
    TU_OK(wna16_model_config_load(path, &cfg, &err), &err);
    TU_OK(wna16_checkpoint_layer_open(ctx, ck, &cfg, NULL, PREFIX, &L, &err),
          &err);
    TU_CHECK(L.E == 2 && L.tensors && wna16_tensor_set_count(L.tensors) == 24);
    wna16_checkpoint_layer_close(&L);
    wna16_checkpoint_close(ck);

    /* expert biases: told from the tensors, collected with the layer and
     * carried through the repack */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", tu_tempdir("host_checkpoint_layer"));
    TU_CHECK(write_with_bias(ctx, golden, dir));
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    if (ck) {
        TU_OK(wna16_checkpoint_layer_open(ctx, ck, NULL, NULL, PREFIX, &L,
                                          &err), &err);
        TU_CHECK(L.quant.bias);
        TU_CHECK(L.tensors && wna16_tensor_set_count(L.tensors) == 30);
        TU_CHECK(L.tensors && wna16_tensor_set_find(
                     L.tensors, "model.layers.0.mlp.experts.1.up_proj.bias"));
        wna16_tensor_set_t *out = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &out, &err), &err);
        const wna16_spec_t *cpu =
            wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "cpu");
        if (L.tensors && out)
            TU_OK(wna16_repack_layer(ctx, L.format, L.tensors, L.prefix, L.E,
                                     L.H, L.I, &L.quant, cpu,
                                     WNA16_TARGET_REFERENCE, out, &err),
                  &err);
        const wna16_tensor_t *b = out ? wna16_tensor_set_find(
            out, "model.layers.0.mlp.experts.w13_bias") : NULL;
        TU_CHECK_MSG(b && b->ndim == 2 && b->shape[0] == 2 &&
                         b->shape[1] == 512,
                     "w13_bias %s", b ? "has another shape" : "is missing");
        wna16_tensor_set_destroy(out);
        wna16_checkpoint_layer_close(&L);
        wna16_checkpoint_close(ck);
    }
    wna16_context_destroy(ctx);
    return tu_finish("host_checkpoint_layer");
}
