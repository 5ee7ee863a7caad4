/*
 * cmd_run.c - `wna16 run`, the main job: one MoE layer (the embedded
 * default, or a checkpoint's), activations, the best target present, the
 * backend selection picks for it, the repack into that backend's layout
 * with generated kernels, the fused MoE (cold, then cached), the reference
 * on the same tokens, and the figures. The pieces live in tools/run_*.c
 * (see run.h); this file parses the options and calls them in order.
 */
#include "run.h"
#include "runtime/cache/cache.h"
#include "runtime/cache/pack.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
"usage: wna16 run [CHECKPOINT] [--layer PREFIX] [--input X.safetensors]\n"
"                 [-o Y.safetensors] [--tokens M] [--target T]\n"
"                 [--backend NAME] [--json] [--experts N] [--seed N]\n"
"\n"
"The main job: one MoE layer repacked into a kernel backend's layout and run\n"
"through wna16's fused MoE on the best target present, checked against the\n"
"reference and timed.\n"
"\n"
"Without CHECKPOINT: the embedded default, one real layer shape\n"
"(Qwen3-30B-A3B: hidden 2048, intermediate 768, 128 experts, top-8) with\n"
"random int4 group-128 weights made in memory as GPTQ tensors (encoded\n"
"through the gptq format spec) and 16 random tokens.\n"
"With CHECKPOINT (a Hugging Face directory with config.json, sharded or\n"
"not, or a .safetensors file with the model's config.json next to it): its\n"
"first MoE layer, or --layer PREFIX (e.g. model.layers.3.mlp.experts), found\n"
"by the format spec's tensor names as `wna16 repack` finds them.\n"
"\n"
"Steps, each printed with its time: the target (a CUDA GPU when one is\n"
"usable, else the CPU); the layer; the activations; backend selection for the\n"
"target's platform (vLLM's select_wna16_moe_backend, from the specs) and the\n"
"layout the target's fused MoE runs: selection's answer when it runs it\n"
"well, else (said plainly, with the reason) the first layout in vLLM's CUDA\n"
"priority order that does: the GPU's tensor-core kernels read the Marlin\n"
"layouts; on a CPU with AVX512-VNNI the dedicated kernels read the CPU\n"
"backend's VNNI blocks (int8-dynamic, vLLM's CPUExpertsInt4 arithmetic),\n"
"and the portable kernels vectorize over k, fast on layouts that pack codes\n"
"in k order (triton's); the repack with generated kernels on the target;\n"
"the numeric contract the GEMMs compute, and the fused\n"
"MoE, a first call (kernels compiled, or loaded from the kernel cache) then\n"
"repeated calls; the scalar reference MoE on the same tokens, under that\n"
"contract.\n"
"\n"
"Options:\n"
"  --layer PREFIX         the MoE layer of CHECKPOINT (default: the first)\n"
"  --dtype D              the model's dtype (vLLM's --dtype): auto (config's\n"
"                         torch_dtype; the default job: bfloat16), float16\n"
"                         or bfloat16. The repack casts scales and biases to\n"
"                         it and the fused MoE takes activations in it only:\n"
"                         --input hidden states of another dtype are refused\n"
"  --input X.safetensors  the activations: hidden_states [M, H] (F16 or\n"
"                         BF16), topk_ids [M, topk] (I32 or I64) and\n"
"                         topk_weights [M, topk] (F32, F16 or BF16);\n"
"                         default: random ones (BF16, or F16 for fp16\n"
"                         models), top-k of the layer\n"
"  -o, --output Y.safetensors\n"
"                         write `output` [M, H] in the dtype of the hidden\n"
"                         states, when the result matches the reference: a\n"
"                         regular file (or a new one) through Y.tmp.PID.N\n"
"                         renamed over it, written whole or not at all (the\n"
"                         temporary removed on errors, SIGINT and SIGTERM);\n"
"                         a symbolic link's target the same way, the link\n"
"                         kept; a FIFO or a character device directly; a\n"
"                         directory, block device or socket refused; not -\n"
"                         (standard output carries the report)\n"
"  --tokens M             random tokens (default 16; not with --input)\n"
"  --target T             where to run (default: the best present): cpu,\n"
"                         cuda, xpu (SPIR-V through Level Zero; without a\n"
"                         Level Zero device, through OpenCL, saying so),\n"
"                         ocl (SPIR-V through llvm-spirv-15 and OpenCL)\n"
"  --backend NAME         run this backend's layout (selection's verdict on\n"
"                         it is shown, not enforced)\n"
"  --json                 print one JSON object with every figure on stdout\n"
"                         (the progress goes to stderr): max_abs_error,\n"
"                         max_rel_error, ok, cold_compile_ms (null on a\n"
"                         kernel cache hit), first_call_ms, cached_ms,\n"
"                         bandwidth_gbs, target, backend, passed_over, ...\n"
"  --experts N            the default layer with its first N experts (1 to\n"
"                         128; top-k at most N)\n"
"  --seed N               random weights of the default layer, activations\n"
"                         and routing (default 1)\n"
"\n"
"Figures: the max abs error and max rel error of the output against the\n"
"reference (relative to the largest |reference|; the run fails above 2^-5);\n"
"the cold-compile time: the first call minus the cached time when the\n"
"kernels were compiled; none when the kernel cache held them\n"
"($WNA16_CACHE_DIR, else $XDG_CACHE_HOME/wna16, else ~/.cache/wna16; an\n"
"empty one compiles them again); the cached time (median of\n"
"the repeated calls; on the GPU, CUDA events around the run); the effective\n"
"bandwidth: the bytes of the experts the routing touches (weights, scales,\n"
"zero points in the backend's layout) over the cached time.\n"
"\n"
"Exit codes: 0 the run matched the reference; 1 it failed, was refused or\n"
"did not match (the reason is printed); 2 usage error.\n");
}

/* A number option's value in [lo, hi]; false after the usage error. */
static bool number(const char *flag, const char *v, long lo, long hi,
                   long *out)
{
    if (cli_parse_int(v, lo, hi, out))
        return true;
    if (v)
        cli_usage_error("run", "%s: '%s' is not %ld to %ld", flag, v, lo, hi);
    else
        cli_usage_error("run", "%s needs a value", flag);
    return false;
}

static int parse(int argc, char **argv, run_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->tokens = 16;
    o->seed = 1;
    bool experts_set = false;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (cli_opt_value(argc, argv, &i, "--layer", &v)) {
            if (!(o->layer = v))
                return cli_usage_error("run", "--layer needs a prefix");
        } else if (cli_opt_value(argc, argv, &i, "--input", &v)) {
            if (!(o->input = v))
                return cli_usage_error("run", "--input needs a .safetensors "
                                       "file");
        } else if (cli_opt_value(argc, argv, &i, "--output", &v) ||
                   cli_opt_value(argc, argv, &i, "-o", &v)) {
            if (!(o->output = v))
                return cli_usage_error("run", "-o needs a .safetensors file");
            if (strcmp(v, "-") == 0)
                return cli_usage_error("run", "-o -: standard output carries "
                                       "the report; name a file or a FIFO");
        } else if (cli_opt_value(argc, argv, &i, "--backend", &v)) {
            if (!(o->backend = v))
                return cli_usage_error("run", "--backend needs a name");
        } else if (cli_opt_value(argc, argv, &i, "--dtype", &v)) {
            if (!v || !wna16_model_dtype_from_name(v, &o->dtype))
                return cli_usage_error("run", "--dtype: '%s' is not auto, "
                                       "float16 or bfloat16", v ? v : "");
        } else if (cli_opt_value(argc, argv, &i, "--tokens", &v)) {
            if (!number("--tokens", v, 1, 1 << 20, &o->tokens))
                return CLI_USAGE;
            o->tokens_set = true;
        } else if (cli_opt_value(argc, argv, &i, "--experts", &v)) {
            if (!number("--experts", v, 1, 128, &o->experts))
                return CLI_USAGE;
            experts_set = true;
        } else if (cli_opt_value(argc, argv, &i, "--seed", &v)) {
            if (!number("--seed", v, 0, 1L << 30, &o->seed))
                return CLI_USAGE;
        } else if (cli_opt_value(argc, argv, &i, "--target", &v)) {
            if (cli_target("run", v, false, &o->target) != CLI_OK)
                return CLI_USAGE;
            o->target_set = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
        } else if (argv[i][0] == '-') {
            return cli_usage_error("run", "unknown option '%s'", argv[i]);
        } else if (!o->checkpoint) {
            o->checkpoint = argv[i];
        } else {
            return cli_usage_error("run", "one CHECKPOINT, please ('%s' and "
                                   "'%s')", o->checkpoint, argv[i]);
        }
    }
    if (o->input && o->tokens_set)
        return cli_usage_error("run", "--tokens and --input: the input file "
                               "says how many tokens");
    if (o->checkpoint && experts_set)
        return cli_usage_error("run", "--experts is for the embedded default; "
                               "a checkpoint's layer has its own");
    if (!o->checkpoint && o->layer)
        return cli_usage_error("run", "--layer needs a CHECKPOINT");
    return CLI_OK;
}

/* --backend names a backend spec (a usage error otherwise, as `repack
 * --to`). */
static int check_backend(wna16_context_t *ctx, const char *name)
{
    if (!name || wna16_spec_find(ctx, WNA16_SPEC_BACKEND, name))
        return CLI_OK;
    char list[512] = "";
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(s) == WNA16_SPEC_BACKEND)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                     list[0] ? ", " : "", wna16_spec_name(s));
    }
    return cli_usage_error("run", "--backend: no backend spec named '%s' (%s)",
                           name, list);
}

/* The layer's fused MoE: the target's own (the CUDA target's tensor-core
 * kernels; tools/run_moe_cuda.c is compiled in builds that have that
 * target) or the generated one. */
static int run_fused_moe(wna16_context_t *ctx, const run_layer_t *L,
                         const run_choice_t *c,
                         const wna16_tensor_set_t *packed,
                         const run_input_t *in, void *out, run_figures_t *f,
                         run_log_t *log)
{
    if (!c->native_moe)
        return run_moe_cpu(ctx, L, c, packed, in, out, f, log);
#ifdef WNA16_HAVE_CUDA
    return run_moe_cuda(ctx, L, c, packed, in, out, f, log);
#else
    fprintf(stderr, "wna16: the %s target's own fused MoE is not in this "
            "build\n", wna16_target_name(c->target));
    return CLI_FAIL;
#endif
}

/* The kernel counters of the context: loaded from kernel packs, loaded
 * from the kernel cache's directory, compiled. */
typedef struct kernel_counts {
    uint64_t packs, disk, compiled;
} kernel_counts_t;

static void kernel_counts(wna16_context_t *ctx, kernel_counts_t *out)
{
    wna16_error_t err;
    w16_cache_t *cache = NULL, *packs = NULL;
    w16_cache_stats_t s = {0}, p = {0};
    if (w16_context_cache(ctx, &cache, &err) == WNA16_OK)
        w16_cache_get_stats(cache, &s);
    if (w16_packs_loaded(ctx, &packs, &err) == WNA16_OK)
        w16_cache_get_stats(packs, &p);
    *out = (kernel_counts_t){.packs = p.compiles, .disk = s.disk_hits,
                             .compiled = s.compiles};
}

/* The repack into the chosen layout, on the target. The step's line says
 * where its kernels are to come from (the context's kernel packs when
 * one holds kernels for the target, the target's compiler for the rest
 * unless JIT is off), its detail where they came from. */
static int repack(wna16_context_t *ctx, const run_layer_t *L,
                  const run_choice_t *c, wna16_tensor_set_t *packed,
                  run_figures_t *f, run_log_t *log)
{
    wna16_error_t err;
    char from[160];
    bool packs = w16_packs_have(ctx, wna16_target_name(c->target));
    if (packs && ctx->no_jit)
        snprintf(from, sizeof from, "kernel packs; JIT off");
    else if (packs)
        snprintf(from, sizeof from, "kernel packs, %s for the others",
                 c->compiler);
    else
        snprintf(from, sizeof from, "%s%s", c->compiler,
                 ctx->no_jit ? "; JIT off: the kernel cache only" : "");
    run_log_step(log, "repack: %s -> %s, generated kernels on the %s target "
                 "(%s)", wna16_spec_name(L->format), wna16_spec_name(c->backend),
                 wna16_target_name(c->target), from);
    kernel_counts_t k0, k1;
    kernel_counts(ctx, &k0);
    if (wna16_repack_layer(ctx, L->format, L->tensors, L->prefix, L->E, L->H,
                           L->I, &L->quant, c->backend, c->target, packed,
                           &err) != WNA16_OK)
        return cli_fail(&err);
    kernel_counts(ctx, &k1);
    run_log_more(log, "kernels: %llu from kernel packs, %llu from the kernel "
                 "cache, %llu compiled (%s)",
                 (unsigned long long)(k1.packs - k0.packs),
                 (unsigned long long)(k1.disk - k0.disk),
                 (unsigned long long)(k1.compiled - k0.compiled), c->compiler);
    f->repack_s = run_log_elapsed(log);
    for (size_t i = 0; i < wna16_tensor_set_count(packed); i++)
        f->packed_bytes += wna16_tensor_set_at(packed, i)->nbytes;
    f->packed_tensors = wna16_tensor_set_count(packed);
    f->bytes_per_expert = f->packed_bytes / (uint64_t)L->E;
    run_log_more(log, "%zu tensors, %.1f MB (%.2f s)", f->packed_tensors,
                 (double)f->packed_bytes / 1e6, f->repack_s);
    return CLI_OK;
}

/* The job, once the options are known. */
static int run(wna16_context_t *ctx, const run_opts_t *o)
{
    run_log_t log;
    run_layer_t L;
    run_input_t in = {0};
    run_choice_t c;
    run_figures_t f = {0};
    wna16_tensor_set_t *packed = NULL;
    wna16_error_t err;
    void *got = NULL, *ref = NULL;
    bool reported = false;
    run_log_init(&log, o->json);
    fprintf(log.f, "wna16 run: %s\n", o->checkpoint ? o->checkpoint
                                                     : "the embedded default");
    memset(&L, 0, sizeof L);
    int rc = run_choose_target(ctx, o, &c, &log);
    if (rc == CLI_OK)
        rc = o->checkpoint ? run_checkpoint_open(ctx, o, &L, &log)
                           : run_default_shape(ctx, o, &L);
    /* the activations before the default's tensors: a bad --input fails
     * at once */
    if (rc == CLI_OK)
        rc = o->input ? run_input_read(ctx, o->input, &L, &in)
                      : run_input_random(&L, (int32_t)o->tokens,
                                         (uint64_t)o->seed, &in);
    if (rc == CLI_OK && !o->checkpoint)
        rc = run_default_make(ctx, o, &L, &log);
    if (rc != CLI_OK)
        goto out;
    run_log_step(&log, "activations: %s", in.source);
    f.experts_touched = run_input_experts(&in, L.E);
    run_log_more(&log, "%d tokens, top-%d, %s; the routing reaches %d of the "
                 "%d experts", in.M, in.topk, wna16_dtype_name(in.dtype),
                 f.experts_touched, L.E);
    if ((rc = run_choose_backend(ctx, o, &L, &c, &log)) != CLI_OK)
        goto out;
    if (wna16_tensor_set_create(ctx, &packed, &err) != WNA16_OK) {
        rc = cli_fail(&err);
        goto out;
    }
    if ((rc = repack(ctx, &L, &c, packed, &f, &log)) != CLI_OK)
        goto out;
    size_t out_bytes = (size_t)in.M * (size_t)L.H * 2;
    got = malloc(out_bytes);
    ref = malloc(out_bytes);
    if (!got || !ref) {
        fprintf(stderr, "wna16: out of memory for the outputs\n");
        rc = CLI_FAIL;
        goto out;
    }
    rc = run_fused_moe(ctx, &L, &c, packed, &in, got, &f, &log);
    if (rc != CLI_OK || (rc = run_reference(ctx, &L, &in, got, ref, &f,
                                            &log)) != CLI_OK)
        goto out;
    f.bytes_touched = f.bytes_per_expert * (uint64_t)f.experts_touched;
    f.gbs = f.cached_ms > 0 ? (double)f.bytes_touched / (f.cached_ms * 1e6)
                            : 0.0;
    if (o->output && f.ok) {
        run_log_step(&log, "output: %s", o->output);
        rc = run_output_write(ctx, o->output, &in, L.H, got, wna16_spec_name(c.backend),
                              wna16_target_name(c.target));
        if (rc != CLI_OK)
            goto out;
        run_log_more(&log, "output %s [%d, %d] (%.2f s)",
                     wna16_dtype_name(in.dtype), in.M, L.H,
                     run_log_elapsed(&log));
    } else if (o->output) {
        fprintf(stderr, "wna16: not writing %s: the output does not match the "
                "reference\n", o->output);
    }
    f.total_s = run_now() - log.t0;
    if (o->json)
        run_report_json(o, &L, &in, &c, &f);
    else
        run_report_human(&L, &c, &f, &log);
    rc = f.ok ? CLI_OK : CLI_FAIL;
    reported = true;
out:
    /* --json: a failure before the report is an object too */
    if (o->json && rc != CLI_OK && !reported) {
        const wna16_error_t *e = cli_last_error();
        wna16_error_t none = {.status = WNA16_EINTERNAL};
        if (!e)
            snprintf(none.message, sizeof none.message, "the run failed: see "
                     "the messages on standard error");
        cli_json_fail(stdout, e ? e : &none);
    }
    free(got);
    free(ref);
    wna16_tensor_set_destroy(packed);
    run_input_free(&in);
    run_layer_free(&L);
    return rc;
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
    rc = check_backend(ctx, o.backend);
    if (rc == CLI_OK)
        rc = run(ctx, &o);
    wna16_context_destroy(ctx);
    return rc;
}
