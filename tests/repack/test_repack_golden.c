/*
 * test_repack_golden.c - wna16_repack_checkpoint against vLLM's own
 * tensors: every case in ../shared/golden is repacked, as a checkpoint
 * directory, into each backend it has an expected file for, and the output
 * file's tensors must equal the expected ones byte for byte by name
 * (Triton, emulation and Marlin: every tensor, and nothing else, including
 * Marlin's act-order sort indices, sorted g_idx and the zero words vLLM
 * keeps for symmetric GPTQ; the 4-bit Triton file also for XPU, whose
 * conversion vLLM makes identical). The act-order case must be refused for
 * Triton with an act-order reason and leave no file. The metadata keys must be there, and the CPU target,
 * when this build has it, must give the reference's bytes.
 */
#include "repack_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static wna16_context_t *ctx;
static char *outdir;

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
        "num_experts", "wna16_version", "zero_point", "act_order", "bias"};
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
            if (v && strcmp(backend, "marlin") == 0)
                TU_CHECK_MSG(m && strcmp(v, m) == 0, "%s: %s = %s, vLLM "
                             "says %s", what, same[i], m ? m : "(none)", v);
        }
        wna16_safetensors_close(ex);
    }
    wna16_safetensors_close(st);
}

static wna16_status_t repack(const char *dir, const char *backend,
                             wna16_target_t target, const char *out,
                             wna16_error_t *err)
{
    wna16_repack_options_t o = {.backend = backend, .target = target};
    unlink(out);
    return wna16_repack_checkpoint(ctx, dir, out, &o, NULL, err);
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

static void check_case(const char *name)
{
    char dir[1024], file[1200];
    snprintf(dir, sizeof dir, "%s/%s", WNA16_GOLDEN_DIR, name);
    wna16_checkpoint_t *ck = NULL;
    wna16_error_t err;
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    wna16_quant_desc_t q = {0};
    if (ck)
        TU_OK(wna16_model_config_quant(wna16_checkpoint_config(ck), &q, &err),
              &err);
    wna16_checkpoint_close(ck);
    int n = 0;
    snprintf(file, sizeof file, "%s/expected_triton.safetensors", dir);
    if (tu_exists(file)) {
        n += check_backend(name, dir, "triton", file, NULL, true);
        if (q.bits == 4)
            n += check_backend(name, dir, "xpu", file, xpu_names, false);
        if (strcmp(name, "gptq_b4_g128") == 0)
            check_cpu_target(name, dir);
    }
    snprintf(file, sizeof file, "%s/expected_emulation.safetensors", dir);
    if (tu_exists(file))
        n += check_backend(name, dir, "emulation", file, NULL, true);
    snprintf(file, sizeof file, "%s/expected_marlin.safetensors", dir);
    if (tu_exists(file)) /* every tensor, nothing else */
        n += check_backend(name, dir, "marlin", file, NULL, true);
    if (q.act_order)
        check_refused(name, dir, "triton", "act-order");
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
        "awq_b4_g32_pad", "gptq_b4_g128_actorder"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cases[i]);
    TU_CHECK(rt_count_tmp(outdir) == 0);
    rt_rmtree(outdir);
    free(outdir);
    wna16_context_destroy(ctx);
    return tu_finish("test_repack_golden");
}
