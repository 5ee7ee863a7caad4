/*
 * test_ocl_golden.c - repack kernels on the ocl target (SPIR-V through
 * llvm-spirv-15 and PoCL) against vLLM's golden tensors and the
 * reference. Every case of ../shared/golden is repacked, as a checkpoint
 * directory, into each backend it has an expected file for (triton, xpu,
 * marlin from the Marlin file; batched_marlin and emulation for one GPTQ
 * and one AWQ case), by the reference and by the ocl target: the two
 * output files must hold
 * the same tensors byte for byte, and the expected tensors must be there
 * byte for byte (xpu: the codes and scales of vLLM's xpu file, else of the
 * 4-bit Triton file, which vLLM makes identical). A backend the reference refuses
 * must be refused by the ocl target with the same status and message.
 *
 * The XPU layout from compressed-tensors (issue 22, point 5): symmetric
 * int4 checkpoints of random layers with group 32 and 128 (and the GPTQ
 * checkpoints of the same layers) repacked to xpu by both, byte-equal.
 *
 * Skips (77) when the golden files are missing or the ocl target cannot
 * run here (no OpenCL loader, PoCL or llvm-spirv-15), with the reason.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "../repack/repack_test.h"
#include "runtime/targets.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static wna16_context_t *ctx;
static char *outdir;
static int n_files; /* repacks compared */

static const char *const xpu_names[] = {"w13_qweight", "w2_qweight",
                                        "w13_scales", "w2_scales", NULL};

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

/* Every tensor of `want` (those named in `only`, or all) is in `got` with
 * the same bytes; with `exact`, got holds nothing else. vLLM's empty
 * placeholders (g_idx of 0 elements) that got leaves out are not data and
 * are not counted. */
static void compare(const char *what, const char *want_path,
                    const char *got_path, const char *const *only, bool exact)
{
    wna16_error_t err;
    wna16_safetensors_t *want = NULL, *have = NULL;
    TU_OK(wna16_safetensors_open(ctx, want_path, &want, &err), &err);
    TU_OK(wna16_safetensors_open(ctx, got_path, &have, &err), &err);
    int n = 0, listed = 0;
    size_t empty = 0;
    for (size_t i = 0; want && have && i < wna16_safetensors_count(want);
         i++) {
        const wna16_tensor_t *w = wna16_safetensors_at(want, i);
        if (w->nbytes == 0 && !wna16_safetensors_find(have, w->name)) {
            empty++;
            continue;
        }
        /* the bf16 models' cases too: the repack casts the scales to the
         * model's dtype as vLLM's loader does */
        if (!name_in(w->name, only))
            continue;
        listed++;
        n += rt_same_tensor(what, w, wna16_safetensors_find(have, w->name));
    }
    TU_CHECK_MSG(listed > 0 && n == listed, "%s: %d of %d tensors equal", what,
                 n, listed);
    if (exact && want && have)
        TU_CHECK_MSG(wna16_safetensors_count(have) ==
                         wna16_safetensors_count(want) - empty,
                     "%s: %zu tensors, want %zu", what,
                     wna16_safetensors_count(have),
                     wna16_safetensors_count(want) - empty);
    wna16_safetensors_close(want);
    wna16_safetensors_close(have);
}

static wna16_status_t repack(const char *dir, const char *backend,
                             wna16_target_t target, const char *out,
                             wna16_error_t *err)
{
    wna16_repack_options_t o = {.backend = backend, .target = target};
    unlink(out);
    return wna16_repack_checkpoint(ctx, dir, out, &o, NULL, err);
}

/* dir -> backend by the reference and the ocl target: the same outcome;
 * the same bytes, and `expected`'s tensors (may be NULL) in both. */
static void check(const char *name, const char *dir, const char *backend,
                  const char *expected, const char *const *only, bool exact)
{
    char what[300], ref[1300], ocl[1300];
    snprintf(what, sizeof what, "%s -> %s (ocl)", name, backend);
    snprintf(ref, sizeof ref, "%s/%s.%s.reference.safetensors", outdir, name,
             backend);
    snprintf(ocl, sizeof ocl, "%s/%s.%s.ocl.safetensors", outdir, name,
             backend);
    wna16_error_t er, eo;
    wna16_status_t sr = repack(dir, backend, WNA16_TARGET_REFERENCE, ref, &er);
    wna16_status_t so = repack(dir, backend, WNA16_TARGET_OCL, ocl, &eo);
    if (sr != WNA16_OK) {
        TU_CHECK_MSG(so == sr && strcmp(er.message, eo.message) == 0,
                     "%s: the reference refused (%s), the ocl target said %d "
                     "(%s)", what, er.message, (int)so,
                     so == WNA16_OK ? "ok" : eo.message);
        TU_CHECK_MSG(expected == NULL, "%s: refused: %s", what, er.message);
        return;
    }
    TU_CHECK_MSG(so == WNA16_OK, "%s: %s", what, eo.message);
    if (so != WNA16_OK)
        return;
    compare(what, ref, ocl, NULL, true);
    if (expected)
        compare(what, expected, ocl, only, exact);
    n_files++;
}

static void check_case(const char *name)
{
    char dir[1024], file[1200];
    snprintf(dir, sizeof dir, "%s/%s", WNA16_GOLDEN_DIR, name);
    snprintf(file, sizeof file, "%s/config.json", dir);
    if (!tu_exists(file))
        return;
    wna16_checkpoint_t *ck = NULL;
    wna16_error_t err;
    wna16_quant_desc_t q = {0};
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    if (ck) {
        wna16_model_config_t cfg = *wna16_checkpoint_config(ck);
        TU_OK(wna16_model_config_quant(&cfg, &q, &err), &err);
    }
    wna16_checkpoint_close(ck);
    int before = n_files;
    char xpu[1200];
    snprintf(xpu, sizeof xpu, "%s/expected_xpu.safetensors", dir);
    snprintf(file, sizeof file, "%s/expected_triton.safetensors", dir);
    if (tu_exists(xpu) && q.bits == 4) /* vLLM's file also keeps g_idx */
        check(name, dir, "xpu", xpu, xpu_names, false);
    else if (tu_exists(file) && q.bits == 4)
        check(name, dir, "xpu", file, xpu_names, false);
    if (tu_exists(file))
        check(name, dir, "triton", q.act_order ? NULL : file, NULL, true);
    snprintf(file, sizeof file, "%s/expected_marlin.safetensors", dir);
    if (tu_exists(file))
        check(name, dir, "marlin", file, NULL, true);
    /* kernels of their own, built once per format: enough for the CI's
     * budget (about one second of PoCL build per kernel) */
    bool first = strcmp(name, "gptq_b4_g128") == 0 ||
                 strcmp(name, "awq_b4_g128") == 0;
    if (first && tu_exists(file))
        check(name, dir, "batched_marlin", file, NULL, true);
    snprintf(file, sizeof file, "%s/expected_emulation.safetensors", dir);
    if (first && tu_exists(file))
        check(name, dir, "emulation", file, NULL, true);
    printf("%s: %d repacks byte-equal on the ocl target\n", name,
           n_files - before);
}

/* A random symmetric int4 layer as a checkpoint of `format` (gptq or
 * compressed_tensors) with group size gs, repacked to xpu by both. */
static void check_xpu_from(const char *format, int32_t gs, uint64_t seed)
{
    wna16_qlayer_t L;
    rt_make_layer(&L, 3, 256, 256, 4, gs, false, false, false, seed);
    char name[96], quant[600];
    snprintf(name, sizeof name, "%s_b4_g%d_random", format, gs);
    char *dir = rt_path(outdir, name);
    TU_CHECK(mkdir(dir, 0755) == 0);
    if (strcmp(format, "gptq") == 0)
        snprintf(quant, sizeof quant,
                 "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": "
                 "%d, \"desc_act\": false, \"sym\": true}", gs);
    else
        snprintf(quant, sizeof quant,
                 "{\"quant_method\": \"compressed-tensors\", \"format\": "
                 "\"pack-quantized\", \"config_groups\": {\"group_0\": "
                 "{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, "
                 "\"type\": \"int\", \"strategy\": \"group\", \"group_size\": "
                 "%d, \"symmetric\": true, \"actorder\": null}}}}", gs);
    wna16_tensor_set_t *set = rt_encode(ctx, format, &L,
                                        "model.layers.0.mlp.experts");
    rt_ckpt_t c;
    rt_ckpt_init(&c, ctx, 1);
    if (set)
        rt_ckpt_add_set(&c, 0, set, NULL, NULL, 0, NULL);
    rt_ckpt_write(&c, dir);
    rt_write_config(dir, L.E, L.H, L.I, 1, quant);
    check(name, dir, "xpu", NULL, NULL, false);
    rt_ckpt_free(&c);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
    free(dir);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* argv[1] (optional): only that golden case, no random layers (the
 * ASan+UBSan run of the same checks, test_ocl_golden_asan). */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    char probe[1024];
    snprintf(probe, sizeof probe, "%s/index.json", WNA16_GOLDEN_DIR);
    if (!tu_exists(probe))
        tu_skip("golden files not found at " WNA16_GOLDEN_DIR
                " (../shared/golden beside the checkout)");
    ctx = tu_context();
    wna16_error_t err;
    void *inst = NULL;
    if (w16_target_probe(ctx, WNA16_TARGET_OCL, NULL, &inst, &err) !=
        WNA16_OK) {
        wna16_context_destroy(ctx);
        tu_skip(err.message);
    }
    outdir = rt_tempdir("ocl-golden");
    DIR *d = opendir(WNA16_GOLDEN_DIR);
    char *names[64];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < 64;)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "index.json") &&
            strcmp(e->d_name, "README.md") &&
            (!only || strcmp(e->d_name, only) == 0))
            names[n++] = strdup(e->d_name);
    if (d)
        closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        check_case(names[i]);
        free(names[i]);
    }
    static const int32_t groups[] = {32, 128};
    for (int g = 0; g < 2 && !only; g++) {
        check_xpu_from("gptq", groups[g], 0x5100u + (uint64_t)g);
        check_xpu_from("compressed_tensors", groups[g], 0x5200u + (uint64_t)g);
    }
    printf("%d repacks byte-equal between the reference and the ocl target\n",
           n_files);
    TU_CHECK(n_files >= (only ? 3 : 20));
    TU_CHECK(rt_count_tmp(outdir) == 0);
    rt_rmtree(outdir);
    free(outdir);
    wna16_context_destroy(ctx);
    return tu_finish("test_ocl_golden");
}
