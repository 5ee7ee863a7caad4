/*
 * cmd_run.c - `wna16 run`: the main job, end to end on what exists today.
 *
 * With no checkpoint it builds the embedded default: a slice of the
 * Qwen3-30B-A3B MoE layer shape with random int4 group-128 GPTQ weights,
 * writes it as a real Hugging Face checkpoint (config.json +
 * model.safetensors), reads it back through the checkpoint reader and the
 * gptq format spec, selects the backend for the best device present (and
 * for an H200, to show the CUDA decision), repacks the layer into the
 * selected layout and into Marlin with the reference, decodes the results
 * and checks that every code, scale and dequantized value survived. It says
 * what it did and what is not built yet (generated kernels).
 */
#define _GNU_SOURCE
#include "cli.h"
#include "gen/spec.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 run [CHECKPOINT] [--layer PREFIX] [--backend NAME]\n"
        "                 [--platform cuda|rocm|cpu|xpu] [--cc 9.0] [--experts N]\n"
        "                 [--keep DIR] [--seed N] [--target cuda]\n\n"
        "Without CHECKPOINT: the embedded default, a slice of the Qwen3-30B-A3B\n"
        "MoE layer (hidden 2048, intermediate 768, top-8; --experts of its 128\n"
        "experts, default 4) with random int4 group-128 GPTQ weights, written\n"
        "as a real checkpoint (to --keep DIR, else a temporary directory).\n"
        "With CHECKPOINT (a Hugging Face directory): its first MoE layer, or\n"
        "--layer PREFIX (e.g. model.layers.3.mlp.experts).\n\n"
        "Steps: read the checkpoint through its format spec; select the\n"
        "backend for the best device present (--platform/--cc override, and\n"
        "--backend asks for one by name); repack with the reference into the\n"
        "selected layout; decode it back and check every code, scale and\n"
        "dequantized value. --target cuda then repacks into Marlin with the\n"
        "generated CUDA kernels and runs the layer through the fused-MoE\n"
        "kernels on the GPU for 1 and 64 tokens, each checked against the\n"
        "reference fused MoE (kernels, tiling rows, NVRTC times reported).\n");
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct run_opts {
    const char *checkpoint, *layer, *backend, *keep;
    wna16_platform_t platform;
    bool platform_set;
    long cc_major, cc_minor, experts, seed;
    bool target_cuda; /* --target cuda: repack and run on the GPU too */
} run_opts_t;

/* ---- the embedded default ------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* Random int4 group-128 weights, scales of fp16 magnitude ~1e-2. */
static wna16_status_t make_layer(wna16_qlayer_t *L, int32_t E, int32_t H,
                                 int32_t I, uint64_t seed, wna16_error_t *err)
{
    memset(L, 0, sizeof *L);
    L->E = E;
    L->H = H;
    L->I = I;
    wna16_status_t st = wna16_qweight_alloc(&L->w13, E, 2 * I, H, 4, 128,
                                            false, false, false, err);
    if (st == WNA16_OK)
        st = wna16_qweight_alloc(&L->w2, E, H, I, 4, 128, false, false, false,
                                 err);
    if (st != WNA16_OK)
        return st;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    wna16_qweight_t *q[2] = {&L->w13, &L->w2};
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)q[i]->E * q[i]->N * q[i]->K;
        for (size_t j = 0; j < n; j++)
            q[i]->codes[j] = (uint8_t)(rng_next(&s) >> 60);
        size_t ng = (size_t)q[i]->E * q[i]->G * q[i]->N;
        for (size_t j = 0; j < ng; j++) {
            float v = 0.005f + (float)(rng_next(&s) >> 40) / (float)(1 << 24) * 0.02f;
            q[i]->scales[j] = wna16_f16_to_f32(wna16_f32_to_f16(v));
        }
    }
    return WNA16_OK;
}

static bool write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

static const char *const default_prefix = "model.layers.0.mlp.experts";

/* Writes the default layer as a GPTQ checkpoint directory. */
static int write_default(wna16_context_t *ctx, const char *dir,
                         const wna16_qlayer_t *L)
{
    wna16_error_t err;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "wna16: %s: %s\n", dir, strerror(errno));
        return CLI_FAIL;
    }
    char path[4200], cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
             "  \"model_type\": \"qwen3_moe\",\n  \"hidden_size\": %d,\n"
             "  \"moe_intermediate_size\": %d,\n  \"num_experts\": %d,\n"
             "  \"num_experts_per_tok\": 8,\n  \"num_hidden_layers\": 1,\n"
             "  \"torch_dtype\": \"float16\",\n"
             "  \"quantization_config\": {\"quant_method\": \"gptq\", "
             "\"bits\": 4, \"group_size\": 128, \"desc_act\": false, "
             "\"sym\": true}\n}\n", L->H, L->I, L->E);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!write_text(path, cfg)) {
        fprintf(stderr, "wna16: cannot write %s: %s\n", path, strerror(errno));
        return CLI_FAIL;
    }
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    wna16_tensor_set_t *set = NULL;
    wna16_status_t st = wna16_tensor_set_create(ctx, &set, &err);
    if (st == WNA16_OK)
        st = wna16_ref_encode(ctx, gptq, L, default_prefix, set, &err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static const char *const keys[] = {"format", "generator"};
    static const char *const vals[] = {"pt", "wna16 run (embedded default)"};
    if (st == WNA16_OK)
        st = wna16_safetensors_write_set(ctx, path, set, 2, keys, vals, &err);
    wna16_tensor_set_destroy(set);
    return st == WNA16_OK ? CLI_OK : cli_fail(&err);
}

/* ---- reading a checkpoint's layer ---------------------------------------- */

/* The first MoE layer of the checkpoint (natural order), found through the
 * format spec's names by the library. */
static bool find_layer(wna16_context_t *ctx, const wna16_checkpoint_t *ck,
                       const wna16_spec_t *fmt, char *prefix, size_t n)
{
    wna16_moe_layers_t layers;
    wna16_error_t err;
    bool found = wna16_checkpoint_moe_layers(ctx, ck, fmt, &layers, &err) ==
                     WNA16_OK && layers.count > 0 &&
                 strlen(layers.prefixes[0]) < n;
    if (found)
        snprintf(prefix, n, "%s", layers.prefixes[0]);
    wna16_moe_layers_free(&layers);
    return found;
}

/* ---- selection and the reference repack check ---------------------------- */

static void print_selection(const char *label, const wna16_select_result_t *r,
                            wna16_status_t st, const wna16_error_t *err)
{
    if (st == WNA16_OK)
        printf("     %s -> %s (%s)\n", label, wna16_spec_name(r->backend),
               r->backend->bsel.vllm_name);
    else
        printf("     %s -> refused: %s\n", label, err->message);
    if (r->note[0])
        printf("       note: %s\n", r->note);
    for (size_t i = 0; i < r->n_passed_over; i++)
        printf("       passed over %s: %s\n",
               wna16_spec_name(r->passed_over[i].backend),
               r->passed_over[i].reason);
}

static wna16_status_t select_for(wna16_context_t *ctx, const char *format,
                                 const wna16_quant_desc_t *q,
                                 const wna16_qlayer_t *L, int32_t topk,
                                 wna16_platform_t p, int ccM, int ccm,
                                 const char *backend, uint32_t kernels,
                                 wna16_select_result_t *r, wna16_error_t *err)
{
    wna16_select_query_t sq = {
        .platform = p, .cc_major = ccM, .cc_minor = ccm, .format = format,
        .quant = *q, .hidden_size = L->H, .intermediate_size = L->I,
        .num_experts = L->E, .top_k = topk, .backend = backend,
        .kernel_platforms = kernels};
    memset(r, 0, sizeof *r);
    return wna16_select(ctx, &sq, r, err);
}

/* Repacks into `backend` with the reference, decodes back, compares. */
static int check_repack(wna16_context_t *ctx, const wna16_spec_t *backend,
                        const wna16_qlayer_t *L, const wna16_quant_desc_t *q)
{
    wna16_error_t err;
    wna16_tensor_set_t *set = NULL;
    double t0 = now_s();
    wna16_status_t st = wna16_tensor_set_create(ctx, &set, &err);
    if (st == WNA16_OK)
        st = wna16_ref_encode(ctx, backend, L, default_prefix, set, &err);
    if (st != WNA16_OK) {
        printf("     %s: cannot hold this layer: %s\n", backend->name,
               err.message);
        wna16_tensor_set_destroy(set);
        return st == WNA16_EUNSUPPORTED ? CLI_OK : CLI_FAIL;
    }
    double t1 = now_s();
    size_t bytes = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(set); i++)
        bytes += wna16_tensor_set_at(set, i)->nbytes;
    int rc = CLI_OK;
    if (backend->layouts[W16_ROLE_QWEIGHT]) {
        wna16_qlayer_t back;
        st = wna16_ref_decode(ctx, backend, set, default_prefix, L->E, L->H,
                              L->I, q, &back, &err);
        if (st != WNA16_OK) {
            printf("     %s: decode failed: %s\n", backend->name, err.message);
            rc = CLI_FAIL;
        } else {
            const wna16_qweight_t *a[2] = {&L->w13, &L->w2};
            const wna16_qweight_t *b[2] = {&back.w13, &back.w2};
            size_t values = 0, wrong = 0;
            for (int i = 0; i < 2; i++)
                for (int32_t e = 0; e < a[i]->E; e++)
                    for (int32_t n = 0; n < a[i]->N; n++)
                        for (int32_t k = 0; k < a[i]->K; k++, values++)
                            wrong += wna16_ref_dequant(a[i], e, n, k) !=
                                     wna16_ref_dequant(b[i], e, n, k);
            printf("     %s: %zu tensors, %.1f MB, repacked in %.2f s; decoded "
                   "back: %zu of %zu dequantized values identical\n",
                   backend->name, wna16_tensor_set_count(set), bytes / 1e6,
                   t1 - t0, values - wrong, values);
            if (wrong)
                rc = CLI_FAIL;
            wna16_qlayer_free(&back);
        }
    } else {
        printf("     %s: %zu tensors, %.1f MB of dequantized weights, written "
               "in %.2f s\n", backend->name, wna16_tensor_set_count(set),
               bytes / 1e6, t1 - t0);
    }
    wna16_tensor_set_destroy(set);
    return rc;
}

static int parse(int argc, char **argv, run_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->experts = 4;
    o->seed = 1;
    o->cc_major = 9;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (cli_opt_value(argc, argv, &i, "--layer", &v)) {
            if (!(o->layer = v))
                return cli_usage_error("run", "--layer needs a prefix");
        } else if (cli_opt_value(argc, argv, &i, "--backend", &v)) {
            if (!(o->backend = v))
                return cli_usage_error("run", "--backend needs a name");
        } else if (cli_opt_value(argc, argv, &i, "--keep", &v)) {
            if (!(o->keep = v))
                return cli_usage_error("run", "--keep needs a directory");
        } else if (cli_opt_value(argc, argv, &i, "--platform", &v)) {
            int p = v ? w16_platform_from_name(v) : -1;
            if (p < 0)
                return cli_usage_error("run", "--platform: cuda, rocm, cpu or "
                                       "xpu");
            o->platform = (wna16_platform_t)p;
            o->platform_set = true;
        } else if (cli_opt_value(argc, argv, &i, "--cc", &v)) {
            if (!v || sscanf(v, "%ld.%ld", &o->cc_major, &o->cc_minor) != 2)
                return cli_usage_error("run", "--cc wants MAJOR.MINOR, e.g. "
                                       "9.0");
        } else if (cli_opt_value(argc, argv, &i, "--experts", &v)) {
            if (!cli_parse_int(v, 1, 128, &o->experts))
                return cli_usage_error("run", "--experts wants 1 to 128");
        } else if (cli_opt_value(argc, argv, &i, "--target", &v)) {
            if (!v || strcmp(v, "cuda") != 0)
                return cli_usage_error("run", "--target: cuda (the GPU "
                                       "repack and fused MoE)");
            o->target_cuda = true;
        } else if (cli_opt_value(argc, argv, &i, "--seed", &v)) {
            if (!cli_parse_int(v, 0, 1L << 30, &o->seed))
                return cli_usage_error("run", "--seed wants a number");
        } else if (argv[i][0] == '-') {
            return cli_usage_error("run", "unknown option '%s'", argv[i]);
        } else if (!o->checkpoint) {
            o->checkpoint = argv[i];
        } else {
            return cli_usage_error("run", "one checkpoint, please");
        }
    }
    return CLI_OK;
}

int cmd_run(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    run_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc != CLI_OK)
        return rc;
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    wna16_error_t err;
    char dir[4096], tmpdir[64] = "";
    int step = 1;
    double t0 = now_s();

    if (!o.checkpoint) {
        printf("wna16 run: the embedded default\n"
               "  layer: Qwen3-30B-A3B MoE shape (hidden 2048, intermediate 768,"
               " top-8), %ld of its 128 experts, int4 GPTQ group 128, random "
               "weights (seed %ld)\n", o.experts, o.seed);
        if (o.keep) {
            snprintf(dir, sizeof dir, "%s", o.keep);
        } else {
            const char *base = getenv("TMPDIR");
            snprintf(tmpdir, sizeof tmpdir, "%s/wna16-run-XXXXXX",
                     base && strlen(base) < 40 ? base : "/tmp");
            if (!mkdtemp(tmpdir)) {
                fprintf(stderr, "wna16: cannot create a temporary directory: "
                        "%s\n", strerror(errno));
                wna16_context_destroy(ctx);
                return CLI_FAIL;
            }
            snprintf(dir, sizeof dir, "%s", tmpdir);
        }
        wna16_qlayer_t L;
        if (make_layer(&L, (int32_t)o.experts, 2048, 768, (uint64_t)o.seed,
                       &err) != WNA16_OK) {
            wna16_context_destroy(ctx);
            return cli_fail(&err);
        }
        rc = write_default(ctx, dir, &L);
        wna16_qlayer_free(&L);
        if (rc != CLI_OK) {
            wna16_context_destroy(ctx);
            return rc;
        }
        printf("  %d. wrote a GPTQ checkpoint to %s (config.json + "
               "model.safetensors) in %.2f s\n", step++, dir, now_s() - t0);
    } else {
        snprintf(dir, sizeof dir, "%s", o.checkpoint);
        printf("wna16 run: %s\n", dir);
    }

    /* Read it back like any checkpoint. */
    double t1 = now_s();
    wna16_checkpoint_t *ck = NULL;
    wna16_tensor_set_t *set = NULL;
    wna16_qlayer_t L = {0};
    char prefix[512];
    wna16_quant_desc_t q;
    const wna16_model_config_t *cfg;
    const wna16_spec_t *fmt = NULL;
    wna16_status_t st = wna16_checkpoint_open(ctx, dir, &ck, &err);
    if (st == WNA16_OK && !(cfg = wna16_checkpoint_config(ck)))
        st = w16_err(&err, WNA16_EFORMAT, "%s: no config.json", dir);
    if (st == WNA16_OK)
        st = wna16_model_config_quant(cfg, &q, &err);
    if (st == WNA16_OK &&
        !(fmt = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, cfg->format_name)))
        st = w16_err(&err, WNA16_EUNSUPPORTED, "no format spec '%s'",
                     cfg->format_name);
    if (st == WNA16_OK) {
        if (o.layer)
            snprintf(prefix, sizeof prefix, "%s", o.layer);
        else if (!find_layer(ctx, ck, fmt, prefix, sizeof prefix))
            st = w16_err(&err, WNA16_ENOTFOUND, "%s: no MoE expert tensors "
                         "(<prefix>.0.gate_proj.%s) found", dir,
                         fmt->layouts[W16_ROLE_QWEIGHT]->name);
    }
    if (st == WNA16_OK) {
        q.bias = wna16_checkpoint_layer_has_bias(ck, fmt, prefix);
        st = wna16_tensor_set_create(ctx, &set, &err);
    }
    for (size_t i = 0; st == WNA16_OK && i < wna16_checkpoint_tensor_count(ck);
         i++)
        st = wna16_tensor_set_add_view(set, wna16_checkpoint_tensor_at(ck, i),
                                       &err);
    if (st == WNA16_OK)
        st = wna16_ref_decode(ctx, fmt, set, prefix, cfg->num_experts,
                              cfg->hidden_size, cfg->moe_intermediate_size, &q,
                              &L, &err);
    if (st != WNA16_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    printf("  %d. read layer %s through the %s format spec: %d experts, "
           "hidden %d, intermediate %d, %d-bit, group %d%s%s%s (%.2f s)\n",
           step++, prefix, fmt->name, L.E, L.H, L.I, q.bits, q.group_size,
           q.zero_point ? ", zero points" : "", q.act_order ? ", act-order" : "",
           q.bias ? ", bias" : "", now_s() - t1);

    /* Select. */
    wna16_device_info_t dev;
    wna16_probe_device(&dev);
    wna16_platform_t plat = o.platform_set ? o.platform : dev.platform;
    int ccM = o.platform_set ? (int)o.cc_major : dev.cc_major;
    int ccm = o.platform_set ? (int)o.cc_minor : dev.cc_minor;
    printf("  %d. selection (as vLLM's select_wna16_moe_backend, from the "
           "specs)\n     device: %s (%s)%s%s\n", step++, dev.name,
           wna16_platform_name(dev.platform), dev.notes[0] ? "; " : "",
           dev.notes);
    int32_t topk = cfg->num_experts_per_tok > 0 ? cfg->num_experts_per_tok : 8;
    if (topk > L.E)
        topk = L.E;
    wna16_select_result_t res;
    char label[96];
    snprintf(label, sizeof label, "%s%s", wna16_platform_name(plat),
             plat == WNA16_PLATFORM_CUDA || plat == WNA16_PLATFORM_ROCM ? " cc" : "");
    if (plat == WNA16_PLATFORM_CUDA || plat == WNA16_PLATFORM_ROCM)
        snprintf(label + strlen(label), sizeof label - strlen(label), " %d.%d",
                 ccM, ccm);
    st = select_for(ctx, cfg->format_name, &q, &L, topk, plat, ccM, ccm,
                    o.backend, 0, &res, &err);
    print_selection(label, &res, st, &err);
    const wna16_spec_t *chosen = st == WNA16_OK ? res.backend : NULL;
    if (plat != WNA16_PLATFORM_CUDA) {
        wna16_select_result_t h200;
        wna16_status_t hs = select_for(ctx, cfg->format_name, &q, &L, topk,
                                       WNA16_PLATFORM_CUDA, 9, 0, o.backend,
                                       1u << WNA16_PLATFORM_CUDA, &h200, &err);
        print_selection("an H200 (cuda cc 9.0)", &h200, hs, &err);
    }

    /* Repack with the reference and check. */
    printf("  %d. reference repack (scalar C through the layout specs) and "
           "decode back\n", step++);
    const char *targets[3] = {chosen ? wna16_spec_name(chosen) : NULL, "marlin",
                              "triton"};
    for (int i = 0; i < 3; i++) {
        if (!targets[i] || (i > 0 && targets[0] && !strcmp(targets[i], targets[0])))
            continue;
        const wna16_spec_t *b = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                targets[i]);
        if (b && check_repack(ctx, b, &L, &q) != CLI_OK)
            rc = CLI_FAIL;
    }
    if (o.target_cuda &&
        cli_run_moe_cuda(ctx, fmt, set, prefix, &L, &q, topk, step++) != CLI_OK)
        rc = CLI_FAIL;
    if (!o.target_cuda)
        printf("  %d. not in this build yet: generated repack kernels (LLVM "
               "JIT, NVRTC), the fused-MoE kernels and running the layer; "
               "this run checked the checkpoint, selection and layout path "
               "with the reference only.\n", step++);
    printf("  result: %s in %.2f s\n", rc == CLI_OK ? "OK" : "FAILED",
           now_s() - t0);
done:
    wna16_qlayer_free(&L);
    wna16_tensor_set_destroy(set);
    wna16_checkpoint_close(ck);
    if (tmpdir[0]) { /* remove what we wrote */
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", tmpdir);
        unlink(path);
        snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
        unlink(path);
        rmdir(tmpdir);
    }
    wna16_context_destroy(ctx);
    return rc;
}
