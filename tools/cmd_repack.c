/*
 * cmd_repack.c - `wna16 repack`: a quantized MoE checkpoint (a Hugging Face
 * directory, sharded or not, or a .safetensors file) into one .safetensors
 * file in a backend's layout, named as vLLM's FusedMoE parameters
 * ("{layer}.w13_qweight", ...). The work is wna16_repack_checkpoint's; this
 * file parses flags (which override config.json, and stand in for it when
 * there is none), shows progress on a terminal and reports the result.
 * Exit codes follow cli.h: 0 written, 1 refused or failed (nothing is left
 * at the output path), 2 usage error; SIGINT, SIGTERM and SIGHUP remove
 * the output's temporary file before the process dies of them.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "runtime/output.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CMD "repack"

typedef struct repack_cli {
    const char *checkpoint, *out, *to, *target, *format, *layer, *input;
    const char *dtype, *max_shard;
    wna16_dtype_t model_dtype; /* --dtype; INVALID: auto */
    uint64_t max_shard_size;   /* --max-shard-size; 0: the default */
    long bits, group_size, hidden, inter, experts;
    bool bits_set, group_size_set, hidden_set, inter_set, experts_set;
    bool zero_point, sym, desc_act, all_tensors, quiet, json;
} repack_cli_t;

static void usage(FILE *f)
{
    fprintf(f,
"usage: wna16 repack CHECKPOINT --to BACKEND -o OUT.safetensors [options]\n"
"       wna16 repack CHECKPOINT --to BACKEND -o DIR/ [options]\n"
"\n"
"Repacks every MoE layer of CHECKPOINT (a Hugging Face directory with\n"
"config.json and model.safetensors or an indexed set of shards, or a single\n"
".safetensors file) into the layout of BACKEND, as one .safetensors file\n"
"holding vLLM's FusedMoE parameters under each layer's prefix\n"
"({layer}.w13_qweight, {layer}.w2_scales, ...; emulation: w13_weight and\n"
"w2_weight in bf16). Expert tensors are found by the names of the format\n"
"spec (gate_proj/up_proj/down_proj or w1/w3/w2, qweight or weight_packed,\n"
"...), gate and up stacked into w13. Bias is read from the tensors. The\n"
"output is streamed layer by layer; a backend that cannot hold what the\n"
"tensors contain is refused with the reason, and a failure never leaves a\n"
"partial file at OUT. A temporary OUT.tmp.PID.N is removed on every error\n"
"and on SIGINT, SIGTERM and SIGHUP; one left by a process that is gone\n"
"(killed with SIGKILL) is removed by the next run writing OUT, which says\n"
"so.\n"
"\n"
"required:\n"
"  --to BACKEND           destination backend spec: triton, marlin, xpu,\n"
"                         humming, emulation, cpu, flashinfer_trtllm, ...\n"
"  -o, --output FILE      the .safetensors file to write. A regular file,\n"
"                         or a new one, is written to FILE.tmp.PID.N beside\n"
"                         it and renamed over it once complete; a symbolic\n"
"                         link is followed and its target written that way,\n"
"                         the link kept (a dangling link creates its target,\n"
"                         refused when the target's directory is missing);\n"
"                         - is standard output; a FIFO or a character device\n"
"                         (/dev/null) is written to directly, no temporary;\n"
"                         a block device or socket is refused.\n"
"                         DIR/ (ending in '/', or an existing directory):\n"
"                         a checkpoint directory: the same tensors in\n"
"                         shards model-0000K-of-0000N.safetensors of at\n"
"                         most --max-shard-size, each with the metadata\n"
"                         (backend, layout, dtype, sizes), the index\n"
"                         model.safetensors.index.json and config.json\n"
"                         copied; all written as temporaries and renamed\n"
"                         only when complete (a failure leaves none, and\n"
"                         removes a directory it made); an earlier save's\n"
"                         shards there are replaced, another .safetensors\n"
"                         file refuses the directory\n"
"options:\n"
"  --target T             where the repack runs: cpu (default: generated\n"
"                         kernels, JIT-compiled with LLVM), cuda, xpu\n"
"                         (SPIR-V, Level Zero), ocl (the same SPIR-V\n"
"                         through llvm-spirv-15 and OpenCL), or reference\n"
"                         (the scalar oracle; the default when this build\n"
"                         has no LLVM)\n"
"  --all-tensors          also copy every non-expert tensor unchanged\n"
"  --layer PREFIX         only this layer (e.g. model.layers.3.mlp.experts)\n"
"  -q, --quiet            no progress line on the terminal\n"
"  --dtype auto|float16|bfloat16\n"
"                         the model's dtype (vLLM's --dtype): scales and\n"
"                         biases are cast to it (round to nearest even) as\n"
"                         vLLM's weight loader does, and the layouts that\n"
"                         hold the model's dtype (Marlin, Triton, XPU,\n"
"                         Humming) store it; auto (default): config.json's\n"
"                         torch_dtype, float32 or none meaning bfloat16;\n"
"                         without config.json the checkpoint's dtype stays\n"
"  --max-shard-size SIZE  a directory output's largest shard: bytes, or\n"
"                         with KB MB GB (10^3...) or KiB MiB GiB (2^10...);\n"
"                         default 5GB, as Hugging Face's save_pretrained\n"
"  --input-dtype int8|fp8 the layout for 8-bit activations (vLLM's\n"
"                         VLLM_MARLIN_INPUT_DTYPE): Marlin's W4A8 tiles,\n"
"                         int16 scale codes and input_global_scale (int8)\n"
"                         or remapped codes and scales x512 (fp8); GPTQ and\n"
"                         compressed-tensors 4-bit checkpoints only\n"
"quantization (override config.json; required without one):\n"
"  --format NAME          format spec: gptq, awq, compressed_tensors, ...\n"
"  --bits N               4 or 8\n"
"  --group-size N         -1 (channelwise) or the group size\n"
"  --zero-point           explicit zero points (asymmetric; without a\n"
"                         config, AWQ has them and the others do not)\n"
"  --sym                  no zero points (symmetric)\n"
"  --desc-act             act-order (g_idx permutation)\n"
"shape (override config.json; required without one):\n"
"  --hidden N             hidden size\n"
"  --intermediate N       MoE intermediate size\n"
"  --experts N            number of experts\n"
"  --json                 report as one JSON object (the summary, or\n"
"                         {\"ok\": false, \"error\": {...}} on failure) on\n"
"                         stdout, or on stderr when stdout carries the file\n"
"  -h, --help             this help\n"
"\n"
"Exit status: 0 written, 1 refused or failed, 2 usage error; killed by a\n"
"signal, the shell's 128 + the signal's number.\n");
}

/* ---- parsing ------------------------------------------------------------- */

static bool set_switch(repack_cli_t *o, const char *a)
{
    const struct { const char *name; bool *dst; } sw[] = {
        {"--zero-point", &o->zero_point}, {"--sym", &o->sym},
        {"--desc-act", &o->desc_act},     {"--all-tensors", &o->all_tensors},
        {"--quiet", &o->quiet},           {"-q", &o->quiet},
        {"--json", &o->json},
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        if (strcmp(a, sw[i].name) == 0) {
            *sw[i].dst = true;
            return true;
        }
    return false;
}

/* Tries every flag that takes a value at argv[*i]; *matched says whether
 * one did. */
static int value_flag(repack_cli_t *o, int argc, char **argv, int *i,
                      bool *matched)
{
    const struct {
        const char *name;
        const char **s;
        long *n;
        bool *set;
        long lo;
    } fl[] = {
        {"--to", &o->to, NULL, NULL, 0},
        {"-o", &o->out, NULL, NULL, 0},
        {"--output", &o->out, NULL, NULL, 0},
        {"--target", &o->target, NULL, NULL, 0},
        {"--format", &o->format, NULL, NULL, 0},
        {"--layer", &o->layer, NULL, NULL, 0},
        {"--input-dtype", &o->input, NULL, NULL, 0},
        {"--dtype", &o->dtype, NULL, NULL, 0},
        {"--max-shard-size", &o->max_shard, NULL, NULL, 0},
        {"--bits", NULL, &o->bits, &o->bits_set, 1},
        {"--group-size", NULL, &o->group_size, &o->group_size_set, -1},
        {"--hidden", NULL, &o->hidden, &o->hidden_set, 1},
        {"--intermediate", NULL, &o->inter, &o->inter_set, 1},
        {"--experts", NULL, &o->experts, &o->experts_set, 1},
    };
    const char *val;
    *matched = false;
    for (size_t k = 0; k < sizeof fl / sizeof fl[0]; k++) {
        if (!cli_opt_value(argc, argv, i, fl[k].name, &val))
            continue;
        *matched = true;
        if (!val)
            return cli_usage_error(CMD, "%s needs a value", fl[k].name);
        if (fl[k].s) {
            *fl[k].s = val;
            return CLI_OK;
        }
        if (!cli_parse_int(val, fl[k].lo, INT32_MAX, fl[k].n) ||
            (fl[k].n == &o->group_size && *fl[k].n == 0))
            return cli_usage_error(CMD, "%s: '%s' is not %s", fl[k].name, val,
                                   fl[k].lo < 0 ? "-1 or a positive integer"
                                                : "a positive integer");
        *fl[k].set = true;
        return CLI_OK;
    }
    return CLI_OK;
}

/* "5GB", "500MiB", "123": Hugging Face's max_shard_size spellings
 * (decimal KB/MB/GB, binary KiB/MiB/GiB, case-insensitive); > 0. */
static bool parse_size(const char *s, uint64_t *out)
{
    static const struct { const char *unit; uint64_t mul; } units[] = {
        {"", 1},
        {"b", 1},
        {"kb", UINT64_C(1000)},
        {"mb", UINT64_C(1000000)},
        {"gb", UINT64_C(1000000000)},
        {"tb", UINT64_C(1000000000000)},
        {"kib", UINT64_C(1) << 10},
        {"mib", UINT64_C(1) << 20},
        {"gib", UINT64_C(1) << 30},
        {"tib", UINT64_C(1) << 40},
    };
    char *end;
    errno = 0;
    if (!s || *s < '0' || *s > '9')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || v == 0)
        return false;
    char unit[8];
    size_t n = strlen(end);
    if (n >= sizeof unit)
        return false;
    for (size_t i = 0; i <= n; i++)
        unit[i] = (char)(end[i] >= 'A' && end[i] <= 'Z' ? end[i] + 32
                                                        : end[i]);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) {
            if (v > UINT64_MAX / units[i].mul)
                return false;
            *out = (uint64_t)v * units[i].mul;
            return true;
        }
    return false;
}

static int parse_args(int argc, char **argv, repack_cli_t *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool matched;
        if (set_switch(o, a))
            continue;
        int rc = value_flag(o, argc, argv, &i, &matched);
        if (rc != CLI_OK)
            return rc;
        if (matched)
            continue;
        if (a[0] == '-' && a[1] != '\0')
            return cli_usage_error(CMD, "unknown option '%s'", a);
        if (o->checkpoint)
            return cli_usage_error(CMD, "more than one checkpoint given ('%s' "
                                   "and '%s')", o->checkpoint, a);
        o->checkpoint = a;
    }
    if (!o->checkpoint)
        return cli_usage_error(CMD, "no CHECKPOINT given");
    if (!o->to)
        return cli_usage_error(CMD, "no destination: pass --to BACKEND");
    if (!o->out)
        return cli_usage_error(CMD, "no output: pass -o OUT.safetensors");
    if (o->sym && o->zero_point)
        return cli_usage_error(CMD, "--sym and --zero-point contradict");
    if (o->input && wna16_input_dtype_from_name(o->input) != WNA16_INPUT_INT8 &&
        wna16_input_dtype_from_name(o->input) != WNA16_INPUT_FP8)
        return cli_usage_error(CMD, "--input-dtype: '%s' is not int8 or fp8",
                               o->input);
    if (o->dtype && !wna16_model_dtype_from_name(o->dtype, &o->model_dtype))
        return cli_usage_error(CMD, "--dtype: '%s' is not auto, float16 or "
                               "bfloat16", o->dtype);
    if (o->max_shard && !parse_size(o->max_shard, &o->max_shard_size))
        return cli_usage_error(CMD, "--max-shard-size: '%s' is not a size "
                               "(bytes, or a number with KB, MB, GB, KiB, "
                               "MiB, GiB)", o->max_shard);
    return CLI_OK;
}

/* A lone .safetensors file has no config.json: the flags must say it all. */
static int check_configless(const repack_cli_t *o)
{
    struct stat st;
    if (stat(o->checkpoint, &st) != 0 || S_ISDIR(st.st_mode))
        return CLI_OK; /* the library reports what is wrong */
    const struct { bool set; const char *flag; } req[] = {
        {o->format != NULL, "--format"}, {o->bits_set, "--bits"},
        {o->group_size_set, "--group-size"}, {o->hidden_set, "--hidden"},
        {o->inter_set, "--intermediate"}, {o->experts_set, "--experts"},
    };
    char list[160] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (!req[i].set && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                    len ? ", " : "", req[i].flag);
    if (!len)
        return CLI_OK;
    return cli_usage_error(CMD, "'%s' is a file without config.json; pass %s",
                           o->checkpoint, list);
}

/* Names the specs of `kind` into buf, comma-separated. */
static void spec_names(wna16_context_t *ctx, wna16_spec_kind_t kind,
                       char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < wna16_spec_count(ctx) && len < n; i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(s) == kind)
            len += (size_t)snprintf(buf + len, n - len, "%s%s",
                                    len ? ", " : "", wna16_spec_name(s));
    }
}

/* Names the context must know: the backend, the format, the target. */
static int check_names(wna16_context_t *ctx, const repack_cli_t *o,
                       wna16_target_t *target)
{
    char names[512];
    if (!wna16_spec_find(ctx, WNA16_SPEC_BACKEND, o->to)) {
        spec_names(ctx, WNA16_SPEC_BACKEND, names, sizeof names);
        return cli_usage_error(CMD, "--to: no backend spec named '%s' (%s)",
                               o->to, names);
    }
    if (o->format && !wna16_spec_find(ctx, WNA16_SPEC_FORMAT, o->format)) {
        spec_names(ctx, WNA16_SPEC_FORMAT, names, sizeof names);
        return cli_usage_error(CMD, "--format: no format spec named '%s' (%s)",
                               o->format, names);
    }
    if (!o->target) {
        /* generated kernels when this build has the CPU target */
        if (wna16_build_kernel_platforms() & (1u << WNA16_PLATFORM_CPU)) {
            *target = WNA16_TARGET_CPU;
        } else {
            *target = WNA16_TARGET_REFERENCE;
            fprintf(stderr, "wna16 repack: this build has no LLVM, so the "
                    "generated CPU kernels are unavailable; using the "
                    "reference repack\n");
        }
        return CLI_OK;
    }
    return cli_target(CMD, o->target, true, target);
}

/* ---- progress ------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* "1.2 GB" (decimal units, as disk sizes are quoted). */
static const char *human_bytes(uint64_t b, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1000.0 && u < 4) {
        v /= 1000.0;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return buf;
}

typedef struct progress {
    double last;  /* when the line was last drawn */
    bool drawn;   /* a line is on the terminal: end it before other output */
} progress_t;

/* One line, redrawn in place on stderr; copies (thousands of small
 * tensors) are throttled to ten redraws a second. */
static void on_progress(void *user, const wna16_repack_progress_t *p)
{
    progress_t *pr = user;
    double t = now_s();
    if (p->layer == 0 && pr->drawn && t - pr->last < 0.1)
        return;
    char w[32], tot[32];
    human_bytes(p->bytes_written, w, sizeof w);
    human_bytes(p->bytes_total, tot, sizeof tot);
    if (p->layer)
        fprintf(stderr, "\r\033[Klayer %zu/%zu %s %s %s of %s written",
                p->layer, p->n_layers, p->name, p->done ? "done," : "...", w,
                tot);
    else
        fprintf(stderr, "\r\033[Kcopying %s ... %s of %s written", p->name, w,
                tot);
    fflush(stderr);
    pr->last = t;
    pr->drawn = true;
}

/* ---- the command --------------------------------------------------------- */

/* Does the output go to standard output (-, /dev/stdout, /dev/fd/1)? */
static bool out_is_stdout(const char *out)
{
    struct stat a, b;
    return strcmp(out, "-") == 0 ||
           (stat(out, &a) == 0 && fstat(STDOUT_FILENO, &b) == 0 &&
            a.st_dev == b.st_dev && a.st_ino == b.st_ino);
}

/* On stdout, or on stderr when stdout carries the file. */
static void print_summary(const repack_cli_t *o, bool piped,
                          const wna16_repack_summary_t *s, double secs)
{
    char b[32], shards[48] = "";
    FILE *f = piped ? stderr : stdout;
    struct stat st;
    if (stat(o->out, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(shards, sizeof shards, " in %zu shard%s", s->n_shards,
                 s->n_shards == 1 ? "" : "s");
    fprintf(f, "wrote %s: %zu layer%s, %zu tensors, %s%s (%s, target %s) in "
            "%.2f s\n", strcmp(o->out, "-") ? o->out : "standard output",
            s->n_layers, s->n_layers == 1 ? "" : "s", s->n_tensors,
            human_bytes(s->bytes, b, sizeof b), shards,
            wna16_spec_name(s->backend), wna16_target_name(s->target), secs);
    fprintf(f, "  from %s: %d experts, hidden %d, intermediate %d",
            wna16_spec_name(s->format), s->E, s->H, s->I);
    if (s->IP != s->I)
        fprintf(f, " (padded to %d)", s->IP);
    fprintf(f, ", %d-bit, group %d%s%s%s", s->quant.bits, s->quant.group_size,
            s->quant.zero_point ? ", zero points" : "",
            s->quant.act_order ? ", act-order" : "",
            s->quant.bias ? ", bias" : "");
    if (s->quant.input_dtype != WNA16_INPUT_16BIT)
        fprintf(f, ", for %s activations",
                wna16_input_dtype_name(s->quant.input_dtype));
    if (s->n_copied)
        fprintf(f, "; %zu non-expert tensors copied", s->n_copied);
    fprintf(f, "\n");
    fprintf(f, "  dtype: %s: %s\n",
            s->model_dtype ? wna16_model_dtype_name(s->model_dtype)
                           : "the checkpoint's",
            s->model_dtype_reason);
}

/* The summary as one JSON object. */
static void print_summary_json(const repack_cli_t *o, bool piped,
                               const wna16_repack_summary_t *s, double secs)
{
    FILE *f = piped ? stderr : stdout;
    fputs("{\"ok\": true, \"output\": ", f);
    cli_json_string(f, o->out);
    fprintf(f, ", \"layers\": %zu, \"tensors\": %zu, \"bytes\": %llu, "
            "\"copied\": %zu, \"backend\": ", s->n_layers, s->n_tensors,
            (unsigned long long)s->bytes, s->n_copied);
    cli_json_string(f, wna16_spec_name(s->backend));
    fputs(", \"target\": ", f);
    cli_json_string(f, wna16_target_name(s->target));
    fputs(", \"format\": ", f);
    cli_json_string(f, wna16_spec_name(s->format));
    fprintf(f, ", \"experts\": %d, \"hidden\": %d, \"intermediate\": %d, "
            "\"intermediate_padded\": %d, \"bits\": %d, \"group_size\": %d, "
            "\"zero_point\": %s, \"act_order\": %s, \"bias\": %s, "
            "\"input_dtype\": ", s->E, s->H, s->I, s->IP, s->quant.bits,
            s->quant.group_size, s->quant.zero_point ? "true" : "false",
            s->quant.act_order ? "true" : "false",
            s->quant.bias ? "true" : "false");
    cli_json_string(f, wna16_input_dtype_name(s->quant.input_dtype));
    fputs(", \"dtype\": ", f);
    if (s->model_dtype)
        cli_json_string(f, wna16_model_dtype_name(s->model_dtype));
    else
        fputs("null", f);
    fputs(", \"dtype_reason\": ", f);
    cli_json_string(f, s->model_dtype_reason);
    fprintf(f, ", \"shards\": %zu, \"seconds\": %.3f}\n", s->n_shards,
            secs);
}

/* SIGINT, SIGTERM and SIGHUP remove the output's temporary, then end the
 * process as they would have (runtime/output.h); a signal ignored when we
 * started (nohup, a background job of a script) stays ignored. */
static void catch_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa = {.sa_handler = w16_output_on_signal,
                                    .sa_flags = SA_RESETHAND};
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    }
}

static void fill_options(const repack_cli_t *o, wna16_target_t target,
                         wna16_repack_options_t *ro)
{
    memset(ro, 0, sizeof *ro);
    ro->backend = o->to;
    ro->target = target;
    ro->format = o->format;
    ro->bits = o->bits_set ? (int32_t)o->bits : 0;
    ro->group_size = o->group_size_set ? (int32_t)o->group_size : 0;
    ro->zero_point_set = o->zero_point || o->sym;
    ro->zero_point = o->zero_point;
    ro->act_order_set = o->desc_act;
    ro->act_order = o->desc_act;
    ro->hidden = o->hidden_set ? (int32_t)o->hidden : 0;
    ro->intermediate = o->inter_set ? (int32_t)o->inter : 0;
    ro->experts = o->experts_set ? (int32_t)o->experts : 0;
    ro->all_tensors = o->all_tensors;
    ro->layer = o->layer;
    ro->input_dtype = o->input ? wna16_input_dtype_from_name(o->input)
                               : WNA16_INPUT_16BIT;
    ro->dtype = o->model_dtype;
    ro->max_shard_size = o->max_shard_size;
}

int cmd_repack(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    repack_cli_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc == CLI_OK)
        rc = check_configless(&o);
    if (rc != CLI_OK)
        return rc;
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    wna16_target_t target;
    if ((rc = check_names(ctx, &o, &target)) != CLI_OK) {
        wna16_context_destroy(ctx);
        return rc;
    }
    wna16_repack_options_t ro;
    fill_options(&o, target, &ro);
    progress_t pr = {0};
    if (!o.quiet && isatty(STDERR_FILENO)) {
        ro.progress = on_progress;
        ro.progress_user = &pr;
    }
    wna16_repack_summary_t sum;
    wna16_error_t err;
    catch_signals();
    bool piped = out_is_stdout(o.out);
    double t0 = now_s();
    wna16_status_t st = wna16_repack_checkpoint(ctx, o.checkpoint, o.out, &ro,
                                                &sum, &err);
    if (pr.drawn)
        fputc('\n', stderr);
    if (st == WNA16_OK && o.json)
        print_summary_json(&o, piped, &sum, now_s() - t0);
    else if (st == WNA16_OK)
        print_summary(&o, piped, &sum, now_s() - t0);
    else if (o.json)
        rc = cli_json_fail(piped ? stderr : stdout, &err);
    else
        rc = cli_fail(&err);
    wna16_context_destroy(ctx);
    return rc;
}
