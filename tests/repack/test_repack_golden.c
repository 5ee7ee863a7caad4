/*
 * test_repack_golden.c - wna16_repack_checkpoint against vLLM's own
 * tensors: every case in ../shared/golden is repacked, as a checkpoint
 * directory, into each backend it has an expected file for, and the output
 * file's tensors must equal the expected ones byte for byte by name
 * (Triton, emulation and Marlin: every tensor, and nothing else, including
 * Marlin's act-order sort indices, sorted g_idx and the zero words vLLM
 * keeps for symmetric GPTQ; the 4-bit Triton file also for XPU, whose
 * conversion vLLM makes identical; the Marlin file also for BATCHED_MARLIN,
 * which vLLM prepares alike). The act-order case must be refused for
 * Triton with an act-order reason and leave no file. The metadata keys must
 * be there, and the CPU target, when this build has it, must give the
 * reference's bytes.
 *
 * compressed-tensors: each GPTQ case is rewritten as the compressed-tensors
 * checkpoint of the same layer (no zero-point tensors, g_idx only under
 * actorder "group"), repacked to Marlin and batched Marlin, and must give
 * vLLM's codes, scales and act-order tensors (padded shapes included), and
 * the empty (E, 0) g_idx vLLM's compressed-tensors method keeps without
 * act-order (its spec's g_idx_parameters; ct_b4_g32 is vLLM's own).
 *
 * 8-bit activations: the fp8 Marlin output of a GPTQ case decodes (codes
 * through their zero points, scales / 512) to the layer vLLM's 16-bit
 * Marlin file decodes to; int8 is refused for AWQ checkpoints.
 *
 * The model's dtype: the bf16 models' cases (config.json torch_dtype
 * bfloat16, float16 checkpoint scales) hold vLLM's tensors with every
 * scale cast to bfloat16 by its weight loader; the repack must give them
 * byte for byte (marlin, batched marlin, triton, xpu from vLLM's own xpu
 * file, emulation; reference and CPU target), and say so in the metadata
 * ("dtype": "bfloat16"); expected_moe_wna16 (vLLM's MoeWNA16 loader, then
 * TRITON: AWQ's zero points too) equals the Triton repack. --dtype float16
 * on a bf16 model gives the float16
 * model's bytes (the same checkpoint: the scales are the checkpoint's),
 * and the CPU layout's F32 scales hold the bf16-rounded values.
 */
#include "repack_test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static wna16_context_t *ctx;
static char *outdir;

static const char *const xpu_names[] = {"w13_qweight", "w2_qweight",
                                        "w13_scales", "w2_scales", NULL};
/* (the XPU conversion of 4-bit Triton files: codes and scales) */

static bool name_in(const char *name, const char *const *only)
{
    if (!only)
        return true;
    for (; *only; only++) {
        size_t n = strlen(name), m = strlen(*only);
        if (n > m && name[n - m - 1] == '.' && !strcmp(name + n - m, *only))
            return true;
    }
    return false;
}

/* The expected tensors (those named in `only`, or all) equal the output's;
 * with `exact`, the output holds nothing else. Returns how many matched. */
static int compare(const char *what, const char *expected, const char *got,
                   const char *const *only, bool exact)
{
    wna16_error_t err;
    wna16_safetensors_t *want = NULL, *have = NULL;
    TU_OK(wna16_safetensors_open(ctx, expected, &want, &err), &err);
    TU_OK(wna16_safetensors_open(ctx, got, &have, &err), &err);
    int n = 0, listed = 0;
    for (size_t i = 0; want && have && i < wna16_safetensors_count(want);
         i++) {
        const wna16_tensor_t *w = wna16_safetensors_at(want, i);
        if (!name_in(w->name, only))
            continue;
        listed++;
        n += rt_same_tensor(what, w, wna16_safetensors_find(have, w->name));
    }
    TU_CHECK_MSG(listed > 0 && n == listed, "%s: %d of %d tensors equal", what,
                 n, listed);
    if (exact && want && have)
        TU_CHECK_MSG(wna16_safetensors_count(have) ==
                         wna16_safetensors_count(want),
                     "%s: %zu tensors written, vLLM has %zu", what,
                     wna16_safetensors_count(have),
                     wna16_safetensors_count(want));
    wna16_safetensors_close(want);
    wna16_safetensors_close(have);
    return n;
}

/* The metadata every output carries, and a few values. */
static void check_metadata(const char *what, const char *file,
                           const char *backend, const char *expected,
                           const char *target)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL, *ex = NULL;
    TU_OK(wna16_safetensors_open(ctx, file, &st, &err), &err);
    if (!st)
        return;
    static const char *const keys[] = {
        "backend", "target", "source_format", "num_bits", "group_size",
        "intermediate_size", "intermediate_size_padded", "hidden_size",
        "num_experts", "wna16_version", "zero_point", "act_order", "bias",
        "input_dtype", "is_k_full"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        TU_CHECK_MSG(wna16_safetensors_metadata_get(st, keys[i]) != NULL,
                     "%s: no metadata '%s'", what, keys[i]);
    const char *b = wna16_safetensors_metadata_get(st, "backend");
    TU_CHECK(b && strcmp(b, backend) == 0);
    const char *t = wna16_safetensors_metadata_get(st, "target");
    TU_CHECK(t && strcmp(t, target) == 0);
    /* vLLM's own record of the sizes agrees with ours. */
    if (wna16_safetensors_open(ctx, expected, &ex, &err) == WNA16_OK) {
        static const char *const same[] = {"num_bits", "group_size",
                                           "intermediate_size_padded"};
        for (size_t i = 0; i < 3; i++) {
            const char *v = wna16_safetensors_metadata_get(ex, same[i]);
            const char *m = wna16_safetensors_metadata_get(st, same[i]);
            if (v && strstr(backend, "marlin"))
                TU_CHECK_MSG(m && strcmp(v, m) == 0, "%s: %s = %s, vLLM "
                             "says %s", what, same[i], m ? m : "(none)", v);
        }
        wna16_safetensors_close(ex);
    }
    wna16_safetensors_close(st);
}

/* --dtype for the repacks of a rewritten checkpoint whose config.json
 * (rt_write_config: float16) is not the case's; 0: auto. */
static wna16_dtype_t force_dtype;

static wna16_status_t repack_input(const char *dir, const char *backend,
                                   wna16_target_t target,
                                   wna16_input_dtype_t input, const char *out,
                                   wna16_error_t *err)
{
    wna16_repack_options_t o = {.backend = backend, .target = target,
                                .input_dtype = input, .dtype = force_dtype};
    unlink(out);
    return wna16_repack_checkpoint(ctx, dir, out, &o, NULL, err);
}

static wna16_status_t repack(const char *dir, const char *backend,
                             wna16_target_t target, const char *out,
                             wna16_error_t *err)
{
    return repack_input(dir, backend, target, WNA16_INPUT_16BIT, out, err);
}

/* Repacks `dir` to `backend` and compares with `expected`: the
 * reference, the generated CPU kernels (when this build has them) and the
 * generated CUDA kernels (when there is a GPU) must all give vLLM's bytes. */
static int check_backend(const char *name, const char *dir,
                         const char *backend, const char *expected,
                         const char *const *only, bool exact)
{
    int n = 0;
    for (int t = WNA16_TARGET_REFERENCE; t <= WNA16_TARGET_CUDA; t++) {
        char what[160], out[1024];
        wna16_error_t err;
        const char *tn = wna16_target_name((wna16_target_t)t);
        snprintf(what, sizeof what, "%s -> %s (%s)", name, backend, tn);
        snprintf(out, sizeof out, "%s/%s.%s.%s.safetensors", outdir, name,
                 backend, tn);
        wna16_status_t st = repack(dir, backend, (wna16_target_t)t, out, &err);
        if (t != WNA16_TARGET_REFERENCE && st == WNA16_EUNAVAILABLE) {
            static bool said[3];
            if (!said[t])
                printf("%s: %s (skipped)\n", what, err.message);
            said[t] = true;
            continue;
        }
        TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
        if (st != WNA16_OK)
            continue;
        n += compare(what, expected, out, only, exact);
        check_metadata(what, out, backend, expected, tn);
    }
    return n;
}

/* Act-order cannot go to Marlin in this build: refused, no file left. */
static void check_refused(const char *name, const char *dir,
                          const char *backend, const char *needle)
{
    char out[1024];
    wna16_error_t err;
    snprintf(out, sizeof out, "%s/%s.%s.safetensors", outdir, name, backend);
    wna16_status_t st = repack(dir, backend, WNA16_TARGET_REFERENCE, out, &err);
    RT_EXPECT_ERR(st, &err, WNA16_EUNSUPPORTED, needle);
    TU_CHECK(!tu_exists(out));
    TU_CHECK(rt_count_tmp(outdir) == 0);
}

/* The CPU target gives the reference's bytes, or says it is unavailable. */
static void check_cpu_target(const char *name, const char *dir)
{
    char ref[1024], cpu[1024];
    wna16_error_t err;
    snprintf(ref, sizeof ref, "%s/%s.triton.reference.safetensors", outdir, name);
    snprintf(cpu, sizeof cpu, "%s/%s.triton-cpu.safetensors", outdir, name);
    wna16_status_t st = repack(dir, "triton", WNA16_TARGET_CPU, cpu, &err);
    if (st == WNA16_EUNAVAILABLE) {
        printf("%s: cpu target unavailable (%s)\n", name, err.message);
        RT_EXPECT_ERR(st, &err, WNA16_EUNAVAILABLE, "unavailable");
        TU_CHECK(!tu_exists(cpu));
        return;
    }
    TU_CHECK_MSG(st == WNA16_OK, "%s: cpu target: %s", name, err.message);
    if (st == WNA16_OK)
        compare("cpu target vs reference", ref, cpu, NULL, true);
}

/* The checkpoint's tensors as one set of views (the file stays open). */
static wna16_tensor_set_t *file_set(const char *path, wna16_safetensors_t **st)
{
    wna16_error_t err;
    wna16_tensor_set_t *set = NULL;
    *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, path, st, &err), &err);
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    for (size_t i = 0; *st && set && i < wna16_safetensors_count(*st); i++)
        TU_OK(wna16_tensor_set_add_view(set, wna16_safetensors_at(*st, i),
                                        &err), &err);
    return set;
}

/* The golden GPTQ layer decoded to logical form. */
static bool decode_case(const char *dir, const wna16_quant_desc_t *q,
                        const wna16_model_config_t *cfg, wna16_qlayer_t *L)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    wna16_safetensors_t *st;
    wna16_tensor_set_t *set = file_set(path, &st);
    wna16_error_t err;
    wna16_status_t s = set ? wna16_ref_decode(ctx, wna16_spec_find(ctx, 0, "gptq"),
                                              set, "model.layers.0.mlp.experts",
                                              cfg->num_experts, cfg->hidden_size,
                                              cfg->moe_intermediate_size, q, L,
                                              &err)
                           : WNA16_EIO;
    TU_CHECK_MSG(s == WNA16_OK, "%s: %s", dir, err.message);
    wna16_tensor_set_destroy(set);
    wna16_safetensors_close(st);
    return s == WNA16_OK;
}

/* The GPTQ case as the compressed-tensors checkpoint of the same layer:
 * symmetric, so no zero-point tensors; g_idx only under actorder "group". */
static void check_compressed_tensors(const char *name, const char *dir,
                                     const wna16_model_config_t *cfg,
                                     const wna16_quant_desc_t *q)
{
    wna16_qlayer_t L;
    if (!decode_case(dir, q, cfg, &L))
        return;
    for (int g = 0; g < 2; g++) { /* what only GPTQ checkpoints carry */
        wna16_qweight_t *w = g ? &L.w2 : &L.w13;
        free(w->stored_zeros);
        w->stored_zeros = NULL;
        w->g_idx_stored = false;
    }
    char ck[1200], quant[512], expected[1200];
    snprintf(ck, sizeof ck, "%s/%s-ct", outdir, name);
    TU_CHECK(mkdir(ck, 0755) == 0);
    snprintf(quant, sizeof quant,
             "{\"quant_method\": \"compressed-tensors\", \"format\": "
             "\"pack-quantized\", \"config_groups\": {\"group_0\": "
             "{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": %d, "
             "\"type\": \"int\", \"strategy\": \"%s\", \"group_size\": %d, "
             "\"symmetric\": true, \"actorder\": %s}}}}",
             q->bits, q->group_size > 0 ? "group" : "channel",
             q->group_size > 0 ? q->group_size : 0,
             q->act_order ? "\"group\"" : "null");
    const char *prefix = "model.layers.0.mlp.experts";
    wna16_tensor_set_t *set = rt_encode(ctx, "compressed_tensors", &L, prefix);
    rt_ckpt_t c;
    rt_ckpt_init(&c, ctx, 1);
    if (set)
        rt_ckpt_add_set(&c, 0, set, NULL, NULL, 0, NULL);
    rt_ckpt_write(&c, ck);
    rt_write_config(ck, L.E, L.H, L.I, 1, quant);
    rt_ckpt_free(&c);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
    static const char *const plain[] = {
        "w13_qweight", "w2_qweight", "w13_scales", "w2_scales",
        "w13_g_idx_sort_indices", "w2_g_idx_sort_indices", "w13_g_idx",
        "w2_g_idx", NULL};
    static const char *const actorder[] = {
        "w13_qweight", "w2_qweight", "w13_scales", "w2_scales",
        "w13_g_idx_sort_indices", "w2_g_idx_sort_indices", "w13_g_idx",
        "w2_g_idx", NULL};
    const char *const *only = q->act_order ? actorder : plain;
    /* the case's model dtype (the rewritten config says float16) */
    force_dtype = strcmp(cfg->torch_dtype, "bfloat16") == 0 ? WNA16_DTYPE_BF16
                                                            : WNA16_DTYPE_F16;
    size_t want = 8;
    snprintf(expected, sizeof expected, "%s/expected_marlin.safetensors", dir);
    static const char *const backends[] = {"marlin", "batched_marlin"};
    for (int b = 0; b < 2; b++)
        for (int t = WNA16_TARGET_REFERENCE; t <= WNA16_TARGET_CPU; t++) {
            char what[200], out[1300];
            wna16_error_t err;
            const char *tn = wna16_target_name((wna16_target_t)t);
            snprintf(what, sizeof what, "%s as compressed-tensors -> %s (%s)",
                     name, backends[b], tn);
            snprintf(out, sizeof out, "%s.%s.%s.safetensors", ck, backends[b],
                     tn);
            wna16_status_t st = repack(ck, backends[b], (wna16_target_t)t, out,
                                       &err);
            if (t == WNA16_TARGET_CPU && st == WNA16_EUNAVAILABLE)
                continue;
            TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
            if (st != WNA16_OK)
                continue;
            compare(what, expected, out, only, false);
            wna16_safetensors_t *have = NULL;
            TU_OK(wna16_safetensors_open(ctx, out, &have, &err), &err);
            if (have) /* and nothing else: no zero points */
                TU_CHECK_MSG(wna16_safetensors_count(have) == want,
                             "%s: %zu tensors, want %zu", what,
                             wna16_safetensors_count(have), want);
            wna16_safetensors_close(have);
        }
    force_dtype = WNA16_DTYPE_INVALID;
}

/* fp8 activations: the output decodes to what vLLM's 16-bit Marlin file
 * decodes to (the same layer), on both targets. */
static void check_fp8(const char *name, const char *dir,
                      const wna16_model_config_t *cfg, wna16_quant_desc_t q)
{
    char expected[1200];
    snprintf(expected, sizeof expected, "%s/expected_marlin.safetensors", dir);
    wna16_safetensors_t *est;
    wna16_tensor_set_t *eset = file_set(expected, &est);
    const wna16_spec_t *marlin = wna16_spec_find(ctx, 0, "marlin");
    const char *prefix = "model.layers.0.mlp.experts";
    int32_t E = cfg->num_experts, H = cfg->hidden_size,
            I = cfg->moe_intermediate_size;
    wna16_error_t err;
    wna16_qlayer_t want, got;
    q.zeros_stored = true; /* symmetric GPTQ's words, kept by Marlin */
    q.g_idx_stored = true;
    TU_OK(wna16_ref_decode(ctx, marlin, eset, prefix, E, H, I, &q, &want, &err),
          &err);
    for (int t = WNA16_TARGET_REFERENCE; t <= WNA16_TARGET_CPU; t++) {
        char what[200], out[1300];
        const char *tn = wna16_target_name((wna16_target_t)t);
        snprintf(what, sizeof what, "%s -> marlin fp8 (%s)", name, tn);
        snprintf(out, sizeof out, "%s/%s.fp8.%s.safetensors", outdir, name, tn);
        wna16_status_t st = repack_input(dir, "marlin", (wna16_target_t)t,
                                         WNA16_INPUT_FP8, out, &err);
        if (t == WNA16_TARGET_CPU && st == WNA16_EUNAVAILABLE)
            continue;
        TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
        wna16_safetensors_t *ost = NULL;
        wna16_tensor_set_t *oset = st == WNA16_OK ? file_set(out, &ost) : NULL;
        wna16_quant_desc_t q8 = q;
        q8.input_dtype = WNA16_INPUT_FP8;
        if (oset && wna16_ref_decode(ctx, marlin, oset, prefix, E, H, I, &q8,
                                     &got, &err) == WNA16_OK) {
            for (int g = 0; g < 2; g++) {
                const wna16_qweight_t *a = g ? &want.w2 : &want.w13;
                const wna16_qweight_t *b = g ? &got.w2 : &got.w13;
                TU_CHECK_MSG(!memcmp(a->codes, b->codes,
                                     (size_t)a->E * a->N * a->K) &&
                                 !memcmp(a->scales, b->scales, sizeof(float) *
                                         (size_t)a->E * a->G * a->N),
                             "%s: %s decodes to another layer", what,
                             g ? "w2" : "w13");
            }
            wna16_qlayer_free(&got);
        } else if (oset) {
            TU_CHECK_MSG(false, "%s: decoding: %s", what, err.message);
        }
        wna16_tensor_set_destroy(oset);
        wna16_safetensors_close(ost);
    }
    wna16_qlayer_free(&want);
    wna16_tensor_set_destroy(eset);
    wna16_safetensors_close(est);
}

/* The value of metadata key `key` of `file` is `want`. */
static void expect_meta(const char *file, const char *key, const char *want)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, file, &st, &err), &err);
    const char *v = st ? wna16_safetensors_metadata_get(st, key) : NULL;
    TU_CHECK_MSG(v && strcmp(v, want) == 0, "%s: %s = %s, want %s", file, key,
                 v ? v : "(none)", want);
    wna16_safetensors_close(st);
}

/* Every scale of `file`'s tensor `name` (F32, the CPU layout) is a bf16
 * value, and some would differ in f16: the loader's cast happened. */
static void expect_bf16_values(const char *file, const char *name)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, file, &st, &err), &err);
    const wna16_tensor_t *t = st ? wna16_safetensors_find(st, name) : NULL;
    TU_CHECK_MSG(t && t->dtype == WNA16_DTYPE_F32, "%s: %s F32", file, name);
    size_t bad = 0, nonzero = 0;
    for (size_t i = 0; t && i < t->nbytes / 4; i++) {
        uint32_t u;
        memcpy(&u, (const char *)t->data + 4 * i, 4);
        bad += (u & 0xffffu) != 0;
        nonzero += u != 0;
    }
    TU_CHECK_MSG(t && bad == 0 && nonzero > 0, "%s: %s: %zu of %zu scales "
                 "are not bf16 values", file, name, bad, nonzero);
    wna16_safetensors_close(st);
}

/* A bf16 model's case: the output says its dtype; --dtype float16 gives
 * the float16 model's scales (those of the checkpoint, which are F16); the
 * CPU layout holds the bf16 values in F32. */
static void check_model_dtype(const char *name, const char *dir)
{
    char out[1300], f16[1300];
    wna16_error_t err;
    snprintf(out, sizeof out, "%s/%s.marlin.reference.safetensors", outdir,
             name);
    expect_meta(out, "dtype", "bfloat16");
    snprintf(f16, sizeof f16, "%s/%s.marlin-f16.safetensors", outdir, name);
    wna16_repack_options_t o = {.backend = "marlin",
                                .target = WNA16_TARGET_REFERENCE,
                                .dtype = WNA16_DTYPE_F16};
    wna16_repack_summary_t sum;
    TU_OK(wna16_repack_checkpoint(ctx, dir, f16, &o, &sum, &err), &err);
    TU_CHECK(sum.model_dtype == WNA16_DTYPE_F16);
    TU_CHECK_MSG(strstr(sum.model_dtype_reason, "requested") != NULL, "%s",
                 sum.model_dtype_reason);
    expect_meta(f16, "dtype", "float16");
    wna16_safetensors_t *a = NULL, *b = NULL, *ck = NULL;
    char model[1200];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    TU_OK(wna16_safetensors_open(ctx, f16, &a, &err), &err);
    TU_OK(wna16_safetensors_open(ctx, out, &b, &err), &err);
    TU_OK(wna16_safetensors_open(ctx, model, &ck, &err), &err);
    for (size_t i = 0; a && b && i < wna16_safetensors_count(a); i++) {
        const wna16_tensor_t *x = wna16_safetensors_at(a, i);
        const wna16_tensor_t *y = wna16_safetensors_find(b, x->name);
        size_t len = strlen(x->name);
        bool scales = len > 7 && strcmp(x->name + len - 7, "_scales") == 0 &&
                      x->nbytes > 0;
        if (scales) /* F16 here, BF16 there: vLLM's two models */
            TU_CHECK_MSG(x->dtype == WNA16_DTYPE_F16 &&
                             y->dtype == WNA16_DTYPE_BF16,
                         "%s: %s: %s / %s", name, x->name,
                         wna16_dtype_name(x->dtype), wna16_dtype_name(y->dtype));
        else /* everything else is what a float16 model gets */
            TU_CHECK_MSG(y && y->nbytes == x->nbytes &&
                             !memcmp(x->data, y->data, x->nbytes),
                         "%s: %s differs between the two dtypes", name,
                         x->name);
        if (scales) { /* the bf16 scales are the f16 ones rounded (RNE) */
            size_t bad = 0;
            for (size_t k = 0; k < x->nbytes / 2; k++) {
                uint16_t h, bb;
                memcpy(&h, (const char *)x->data + 2 * k, 2);
                memcpy(&bb, (const char *)y->data + 2 * k, 2);
                bad += wna16_f32_to_bf16(wna16_f16_to_f32(h)) != bb;
            }
            TU_CHECK_MSG(bad == 0, "%s: %s: %zu scales are not the rounded "
                         "f16 ones", name, x->name, bad);
        }
    }
    wna16_safetensors_close(a);
    wna16_safetensors_close(b);
    wna16_safetensors_close(ck);
    /* the CPU layout: F32 scales of the bf16 values, on both targets */
    for (int t = WNA16_TARGET_REFERENCE; t <= WNA16_TARGET_CPU; t++) {
        snprintf(out, sizeof out, "%s/%s.cpu.%d.safetensors", outdir, name, t);
        wna16_repack_options_t c = {.backend = "cpu",
                                    .target = (wna16_target_t)t};
        wna16_status_t st = wna16_repack_checkpoint(ctx, dir, out, &c, NULL,
                                                    &err);
        if (t == WNA16_TARGET_CPU && st == WNA16_EUNAVAILABLE)
            continue;
        TU_CHECK_MSG(st == WNA16_OK, "%s -> cpu: %s", name, err.message);
        if (st == WNA16_OK)
            expect_bf16_values(out, "model.layers.0.mlp.experts.w13_scales");
    }
    char ref[1300];
    snprintf(ref, sizeof ref, "%s/%s.cpu.0.safetensors", outdir, name);
    snprintf(out, sizeof out, "%s/%s.cpu.1.safetensors", outdir, name);
    if (tu_exists(out))
        compare("cpu layout, cpu target vs reference", ref, out, NULL, true);
}

static void check_case(const char *name)
{
    char dir[1024], file[1200];
    snprintf(dir, sizeof dir, "%s/%s", WNA16_GOLDEN_DIR, name);
    wna16_checkpoint_t *ck = NULL;
    wna16_error_t err;
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    wna16_quant_desc_t q = {0};
    wna16_model_config_t cfg = {0};
    if (ck) {
        cfg = *wna16_checkpoint_config(ck);
        TU_OK(wna16_model_config_quant(&cfg, &q, &err), &err);
    }
    wna16_checkpoint_close(ck);
    int n = 0;
    snprintf(file, sizeof file, "%s/expected_xpu.safetensors", dir);
    bool own_xpu = tu_exists(file);
    if (own_xpu) /* every tensor: the (0,) g_idx placeholders too */
        n += check_backend(name, dir, "xpu", file, NULL, true);
    snprintf(file, sizeof file, "%s/expected_triton.safetensors", dir);
    if (tu_exists(file)) {
        n += check_backend(name, dir, "triton", file, NULL, true);
        if (q.bits == 4 && !own_xpu)
            n += check_backend(name, dir, "xpu", file, xpu_names, false);
        if (strcmp(name, "gptq_b4_g128") == 0)
            check_cpu_target(name, dir);
    }
    snprintf(file, sizeof file, "%s/expected_emulation.safetensors", dir);
    if (tu_exists(file))
        n += check_backend(name, dir, "emulation", file, NULL, true);
    /* what the Triton kernel gets when vLLM loads the layer through
     * MoeWNA16 (AWQ too: its zero points), in the model's dtype */
    snprintf(file, sizeof file, "%s/expected_moe_wna16.safetensors", dir);
    if (tu_exists(file))
        n += check_backend(name, dir, "triton", file, NULL, true);
    snprintf(file, sizeof file, "%s/expected_marlin.safetensors", dir);
    if (tu_exists(file)) { /* every tensor, nothing else */
        n += check_backend(name, dir, "marlin", file, NULL, true);
        n += check_backend(name, dir, "batched_marlin", file, NULL, true);
    }
    if (cfg.torch_dtype[0] && strcmp(cfg.torch_dtype, "bfloat16") == 0)
        check_model_dtype(name, dir);
    if (q.act_order)
        check_refused(name, dir, "triton", "act-order");
    bool gptq = strncmp(name, "gptq", 4) == 0;
    if (gptq && tu_exists(file))
        check_compressed_tensors(name, dir, &cfg, &q);
    if (gptq && q.bits == 4 && !q.act_order)
        check_fp8(name, dir, &cfg, q);
    if (strncmp(name, "awq", 3) == 0) {
        char out[1300];
        snprintf(out, sizeof out, "%s/%s.int8.safetensors", outdir, name);
        wna16_status_t st = repack_input(dir, "marlin", WNA16_TARGET_REFERENCE,
                                         WNA16_INPUT_INT8, out, &err);
        RT_EXPECT_ERR(st, &err, WNA16_EUNSUPPORTED,
                      "awq checkpoints do not run with int8 activations");
        TU_CHECK(!tu_exists(out));
    }
    printf("%s: %d repacked tensors equal vLLM's\n", name, n);
    TU_CHECK(n > 0 || q.act_order);
}

int main(void)
{
    char probe[1024];
    snprintf(probe, sizeof probe, "%s/index.json", WNA16_GOLDEN_DIR);
    if (!tu_exists(probe))
        tu_skip("golden files not found at " WNA16_GOLDEN_DIR
                " (../shared/golden beside the checkout)");
    ctx = tu_context();
    outdir = rt_tempdir("repack-golden");
    static const char *const cases[] = {
        "gptq_b4_g128",   "gptq_b4_gm1",     "gptq_b8_g128",
        "awq_b4_g128",    "gptq_b4_g32_pad", "gptq_b4_gm1_pad",
        "awq_b4_g32_pad", "gptq_b4_g128_actorder",
        /* the second set: bf16 models, XPU, compressed-tensors */
        "gptq_b4_g128_bf16", "awq_b4_g128_bf16", "gptq_b4_g32_xpu",
        "ct_b4_g32"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cases[i]);
    TU_CHECK(rt_count_tmp(outdir) == 0);
    rt_rmtree(outdir);
    free(outdir);
    wna16_context_destroy(ctx);
    return tu_finish("test_repack_golden");
}
