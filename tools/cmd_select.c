/*
 * cmd_select.c - `wna16 select`: which WNA16 MoE backend vLLM-style
 * selection picks for a deployment, and why every backend tried before it
 * was passed over. The deployment comes from a checkpoint directory or its
 * config.json (read with wna16_model_config_load) and/or from flags, which
 * override the config; the library's wna16_select does the choosing. The
 * report is human-readable, or one JSON object with --json. Exit codes
 * follow cli.h: 0 chosen, 1 refused or failed, 2 usage error.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "spec/spec.h" /* bsel.vllm_name for the report */
#include "runtime/targets.h" /* where the xpu platform's kernels run */

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define CMD "select"

/* An integer flag: set by the config or the command line. */
typedef struct opt_int {
    bool set;
    long v;
} opt_int_t;

/* Everything the command line says (flags override the config). */
typedef struct sel_opts {
    const char *path;
    bool json, batched, sym, zero_point, desc_act, bias;
    const char *platform, *cc, *backend, *activation, *format, *actorder;
    const char *kernel_platforms, *input_dtype, *dtype;
    opt_int_t bits, group_size, hidden, inter, experts, topk, inter_full;
} sel_opts_t;

/* The deployment after merging config and flags. */
typedef struct deploy {
    const char *format;
    opt_int_t bits, group_size, hidden, inter, experts, topk;
    bool zero_point, act_order, bias;
    const char *actorder;
} deploy_t;

static void usage(FILE *f)
{
    fprintf(f,
"usage: wna16 select [CHECKPOINT_DIR | config.json] [options]\n"
"\n"
"Which WNA16 MoE backend vLLM-style selection picks for a deployment, and\n"
"why every backend tried before it was passed over. Without a checkpoint the\n"
"flags describe the deployment (--format, --bits, --hidden, --intermediate,\n"
"--experts and --topk are then required); with one, flags override its\n"
"config.json.\n"
"\n"
"device:\n"
"  --platform P           cuda (default), rocm, cpu or xpu\n"
"  --cc X.Y               compute capability for cuda/rocm (default 9.0)\n"
"  --kernel-platforms L   platforms wna16 may generate kernels for, comma-\n"
"                         separated (cuda,rocm,cpu,xpu; default: this build's)\n"
"selection:\n"
"  --backend NAME         request a backend by name (default: auto)\n"
"  --batched              batched activation format (default: standard)\n"
"  --activation NAME      activation function (default: silu)\n"
"  --dtype D              the model's dtype (vLLM's --dtype): auto\n"
"                         (default: config.json's torch_dtype, float32 or\n"
"                         none meaning bfloat16; float16 on a GPU below\n"
"                         sm_80, which has no bfloat16), float16, bfloat16;\n"
"                         said (with a checkpoint or --dtype) with the rule\n"
"                         that decided it, and which of the backend's\n"
"                         tensors hold it\n"
"  --input-dtype D        int8 or fp8: 8-bit activations (vLLM's\n"
"                         VLLM_MARLIN_INPUT_DTYPE); backends and formats\n"
"                         without them are refused (default: 16-bit)\n"
"quantization:\n"
"  --format NAME          format spec (gptq, awq, compressed_tensors, ...)\n"
"  --bits N               4 or 8\n"
"  --group-size N         -1 (channelwise) or a group size (default 128)\n"
"  --sym                  symmetric (no zero points)\n"
"  --zero-point           explicit zero points (asymmetric)\n"
"  --desc-act             act-order (g_idx permutation)\n"
"  --actorder VALUE       compressed-tensors actorder: group, weight, dynamic\n"
"  --bias                 the checkpoint carries expert biases\n"
"shape:\n"
"  --hidden N             hidden size\n"
"  --intermediate N       MoE intermediate size\n"
"  --experts N            number of experts\n"
"  --topk N               experts per token\n"
"  --intermediate-full N  the unsharded intermediate size when tensor\n"
"                         parallelism splits w2's K (for is_k_full)\n"
"output:\n"
"  --json                 print {\"backend\": ..., \"passed_over\": [...],\n"
"                         \"is_k_full\": ...}\n"
"  -h, --help             this help\n"
"\n"
"Exit status: 0 a backend was chosen, 1 refused or failed, 2 usage error.\n");
}

/* ---- parsing ------------------------------------------------------------------ */

static bool set_switch(sel_opts_t *o, const char *a)
{
    const struct { const char *name; bool *dst; } sw[] = {
        {"--json", &o->json},         {"--batched", &o->batched},
        {"--sym", &o->sym},           {"--zero-point", &o->zero_point},
        {"--desc-act", &o->desc_act}, {"--bias", &o->bias},
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        if (strcmp(a, sw[i].name) == 0) {
            *sw[i].dst = true;
            return true;
        }
    return false;
}

static int set_int(opt_int_t *dst, const char *flag, const char *val, long lo)
{
    if (!cli_parse_int(val, lo, INT32_MAX, &dst->v))
        return cli_usage_error(CMD, "%s: '%s' is not an integer in [%ld, %d]",
                               flag, val, lo, INT32_MAX);
    dst->set = true;
    return CLI_OK;
}

/* Tries every flag that takes a value at argv[*i]; *matched says whether
 * one did. */
static int value_flag(sel_opts_t *o, int argc, char **argv, int *i,
                      bool *matched)
{
    const struct { const char *name; const char **s; opt_int_t *n; long lo; }
    fl[] = {
        {"--platform", &o->platform, NULL, 0},
        {"--cc", &o->cc, NULL, 0},
        {"--kernel-platforms", &o->kernel_platforms, NULL, 0},
        {"--backend", &o->backend, NULL, 0},
        {"--activation", &o->activation, NULL, 0},
        {"--format", &o->format, NULL, 0},
        {"--actorder", &o->actorder, NULL, 0},
        {"--input-dtype", &o->input_dtype, NULL, 0},
        {"--dtype", &o->dtype, NULL, 0},
        {"--bits", NULL, &o->bits, 1},
        {"--group-size", NULL, &o->group_size, INT32_MIN},
        {"--hidden", NULL, &o->hidden, 1},
        {"--intermediate", NULL, &o->inter, 1},
        {"--experts", NULL, &o->experts, 1},
        {"--topk", NULL, &o->topk, 1},
        {"--intermediate-full", NULL, &o->inter_full, 1},
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
        return set_int(fl[k].n, fl[k].name, val, fl[k].lo);
    }
    return CLI_OK;
}

static int parse_args(int argc, char **argv, sel_opts_t *o)
{
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
        if (o->path)
            return cli_usage_error(CMD, "more than one checkpoint given ('%s' "
                                   "and '%s')", o->path, a);
        o->path = a;
    }
    if (o->group_size.set && (o->group_size.v == 0 || o->group_size.v < -1))
        return cli_usage_error(CMD, "--group-size: '%ld' is not -1 or a "
                               "positive integer", (long)o->group_size.v);
    if (o->sym && o->zero_point)
        return cli_usage_error(CMD, "--sym and --zero-point contradict");
    if (o->input_dtype &&
        wna16_input_dtype_from_name(o->input_dtype) != WNA16_INPUT_INT8 &&
        wna16_input_dtype_from_name(o->input_dtype) != WNA16_INPUT_FP8)
        return cli_usage_error(CMD, "--input-dtype: '%s' is not int8 or fp8",
                               o->input_dtype);
    return CLI_OK;
}

static int parse_platform(const char *s, wna16_platform_t *out)
{
    for (int p = 0; p < WNA16_PLATFORM_COUNT_; p++)
        if (strcmp(s, wna16_platform_name((wna16_platform_t)p)) == 0) {
            *out = (wna16_platform_t)p;
            return CLI_OK;
        }
    return cli_usage_error(CMD, "unknown platform '%s' (cuda, rocm, cpu or "
                           "xpu)", s);
}

/* "9.0" or "9" -> 9, 0. */
static int parse_cc(const char *s, int32_t *major, int32_t *minor)
{
    char buf[32];
    long ma, mi = 0;
    snprintf(buf, sizeof buf, "%s", s);
    char *dot = strchr(buf, '.');
    if (dot)
        *dot = '\0';
    if (strlen(s) >= sizeof buf || !cli_parse_int(buf, 0, 99, &ma) ||
        (dot && !cli_parse_int(dot + 1, 0, 9, &mi)))
        return cli_usage_error(CMD, "--cc: '%s' is not a compute capability "
                               "such as 9.0", s);
    *major = (int32_t)ma;
    *minor = (int32_t)mi;
    return CLI_OK;
}

/* "cuda,xpu" -> bit mask. */
static int parse_kernel_platforms(const char *s, uint32_t *mask)
{
    char buf[128];
    if (strlen(s) >= sizeof buf)
        return cli_usage_error(CMD, "--kernel-platforms: list too long");
    snprintf(buf, sizeof buf, "%s", s);
    *mask = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        wna16_platform_t p = WNA16_PLATFORM_CUDA;
        int rc = parse_platform(t, &p);
        if (rc != CLI_OK)
            return rc;
        *mask |= 1u << p;
    }
    if (!*mask)
        return cli_usage_error(CMD, "--kernel-platforms: empty list");
    return CLI_OK;
}

/* ---- the deployment -------------------------------------------------------------- */

static int load_config(const char *path, wna16_model_config_t *mc)
{
    char file[4096];
    struct stat st;
    wna16_error_t err;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    if (wna16_model_config_load(file, mc, &err) != WNA16_OK)
        return cli_fail(&err);
    return CLI_OK;
}

static void set_from(opt_int_t *dst, int32_t v)
{
    if (v != 0) {
        dst->set = true;
        dst->v = v;
    }
}

/* What config.json says; the library maps each format's spelling of zero
 * points and act-order (wna16_model_config_quant). A config without a
 * quantization_config wna16 knows leaves format and bits to the flags. */
static int deploy_from_config(const wna16_model_config_t *mc, deploy_t *d)
{
    set_from(&d->hidden, mc->hidden_size);
    set_from(&d->inter, mc->moe_intermediate_size);
    set_from(&d->experts, mc->num_experts);
    set_from(&d->topk, mc->num_experts_per_tok);
    if (!mc->format_name[0])
        return CLI_OK;
    wna16_quant_desc_t qd;
    wna16_error_t err;
    if (wna16_model_config_quant(mc, &qd, &err) != WNA16_OK)
        return cli_fail(&err);
    d->format = mc->format_name;
    set_from(&d->bits, qd.bits);
    set_from(&d->group_size, qd.group_size);
    d->zero_point = qd.zero_point;
    d->act_order = qd.act_order;
    d->bias = qd.bias;
    if (mc->actorder[0])
        d->actorder = mc->actorder;
    /* vLLM forbids tile padding for actorder "dynamic" as for "group". */
    if (strcmp(mc->actorder, "dynamic") == 0)
        d->act_order = true;
    return CLI_OK;
}

static void override(opt_int_t *dst, const opt_int_t *src)
{
    if (src->set)
        *dst = *src;
}

static void deploy_from_flags(const sel_opts_t *o, deploy_t *d)
{
    if (o->format)
        d->format = o->format;
    override(&d->bits, &o->bits);
    override(&d->group_size, &o->group_size);
    override(&d->hidden, &o->hidden);
    override(&d->inter, &o->inter);
    override(&d->experts, &o->experts);
    override(&d->topk, &o->topk);
    if (o->sym)
        d->zero_point = false;
    if (o->zero_point)
        d->zero_point = true;
    if (o->actorder) {
        d->actorder = o->actorder;
        d->act_order = strcmp(o->actorder, "group") == 0 ||
                       strcmp(o->actorder, "dynamic") == 0;
    }
    if (o->desc_act)
        d->act_order = true;
    if (o->bias)
        d->bias = true;
    if (!d->group_size.set) {
        d->group_size.set = true;
        d->group_size.v = 128;
    }
}

/* Names every missing required value; CLI_OK when none is. */
static int check_missing(const deploy_t *d, const char *path)
{
    const struct { bool set; const char *flag; } req[] = {
        {d->format != NULL, "--format"}, {d->bits.set, "--bits"},
        {d->hidden.set, "--hidden"},     {d->inter.set, "--intermediate"},
        {d->experts.set, "--experts"},   {d->topk.set, "--topk"},
    };
    char list[160] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (!req[i].set && len + 20 < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                    len ? ", " : "", req[i].flag);
    if (!len)
        return CLI_OK;
    if (path)
        return cli_usage_error(CMD, "'%s' does not give everything needed; "
                               "pass %s", path, list);
    return cli_usage_error(CMD, "missing %s", list);
}

static int build_query(const sel_opts_t *o, const deploy_t *d,
                       wna16_select_query_t *q)
{
    memset(q, 0, sizeof *q);
    q->platform = WNA16_PLATFORM_CUDA;
    int rc = o->platform ? parse_platform(o->platform, &q->platform) : CLI_OK;
    bool gpu = q->platform == WNA16_PLATFORM_CUDA ||
               q->platform == WNA16_PLATFORM_ROCM;
    if (rc == CLI_OK && gpu)
        rc = parse_cc(o->cc ? o->cc : "9.0", &q->cc_major, &q->cc_minor);
    if (rc == CLI_OK && o->kernel_platforms)
        rc = parse_kernel_platforms(o->kernel_platforms, &q->kernel_platforms);
    if (rc != CLI_OK)
        return rc;
    q->format = d->format;
    q->quant = (wna16_quant_desc_t){(int32_t)d->bits.v,
                                    (int32_t)d->group_size.v, d->zero_point,
                                    d->act_order, d->bias};
    q->actorder = d->actorder;
    q->hidden_size = (int32_t)d->hidden.v;
    q->intermediate_size = (int32_t)d->inter.v;
    q->num_experts = (int32_t)d->experts.v;
    q->top_k = (int32_t)d->topk.v;
    q->activation_format = o->batched ? WNA16_ACT_FORMAT_BATCHED
                                      : WNA16_ACT_FORMAT_STANDARD;
    q->activation = o->activation;
    q->backend = o->backend;
    if (o->input_dtype)
        q->quant.input_dtype = wna16_input_dtype_from_name(o->input_dtype);
    q->intermediate_size_full = o->inter_full.set ? (int32_t)o->inter_full.v : 0;
    return CLI_OK;
}

/* ---- the model's dtype ------------------------------------------------------------ */

typedef struct sel_dtype {
    wna16_dtype_t dtype; /* INVALID: unknown (no config, auto) */
    char why[320];
    bool said; /* a config or --dtype named it: the report says it */
} sel_dtype_t;

/* vLLM's --dtype for this deployment: wna16_model_dtype, then the device
 * rule of _resolve_auto_dtype: a GPU below sm_80 supports float16 and
 * float32 only, so auto casts a bfloat16 (or float32) model to float16. */
static int resolve_dtype(const sel_opts_t *o, const wna16_model_config_t *mc,
                         const wna16_select_query_t *q, sel_dtype_t *out)
{
    wna16_dtype_t req = WNA16_DTYPE_INVALID;
    if (o->dtype && !wna16_model_dtype_from_name(o->dtype, &req))
        return cli_usage_error(CMD, "--dtype: '%s' is not auto, float16 or "
                               "bfloat16", o->dtype);
    wna16_error_t err;
    if (wna16_model_dtype(o->path ? mc : NULL, req, &out->dtype, out->why,
                          sizeof out->why, &err) != WNA16_OK)
        return cli_fail(&err);
    out->said = o->path || req;
    bool gpu = q->platform == WNA16_PLATFORM_CUDA ||
               q->platform == WNA16_PLATFORM_ROCM;
    if (!req && gpu && out->dtype == WNA16_DTYPE_BF16 &&
        q->cc_major * 10 + q->cc_minor < 80) {
        char was[320];
        snprintf(was, sizeof was, "%s", out->why);
        snprintf(out->why, sizeof out->why, "%s; but compute capability "
                 "%d.%d has no bfloat16, so vLLM's auto dtype takes float16",
                 was, q->cc_major, q->cc_minor);
        out->dtype = WNA16_DTYPE_F16;
    }
    return CLI_OK;
}

/* "scales, bias": the roles of `b` held in the model's dtype. */
static void model_dtype_roles(const wna16_spec_t *b, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; b && r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = b->layouts[r];
        if (l && l->model_dtype && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s",
                                    len ? ", " : "", l->name);
    }
}

/* ---- output --------------------------------------------------------------------- */

static void print_json(const wna16_select_result_t *r, const sel_dtype_t *dt)
{
    fputs("{\"backend\": ", stdout);
    if (r->backend)
        cli_json_string(stdout, wna16_spec_name(r->backend));
    else
        fputs("null", stdout);
    fputs(", \"passed_over\": [", stdout);
    for (size_t i = 0; i < r->n_passed_over; i++) {
        fputs(i ? ", {\"backend\": " : "{\"backend\": ", stdout);
        cli_json_string(stdout, wna16_spec_name(r->passed_over[i].backend));
        fputs(", \"reason\": ", stdout);
        cli_json_string(stdout, r->passed_over[i].reason);
        fputc('}', stdout);
    }
    fputc(']', stdout);
    if (r->note[0]) {
        fputs(", \"note\": ", stdout);
        cli_json_string(stdout, r->note);
    }
    if (r->backend)
        printf(", \"is_k_full\": %s", r->is_k_full ? "true" : "false");
    if (!dt->said) {
        fputs("}\n", stdout);
        return;
    }
    fputs(", \"dtype\": ", stdout);
    if (dt->dtype)
        cli_json_string(stdout, wna16_model_dtype_name(dt->dtype));
    else
        fputs("null", stdout);
    fputs(", \"dtype_reason\": ", stdout);
    cli_json_string(stdout, dt->why);
    if (r->backend) {
        fputs(", \"model_dtype_tensors\": [", stdout);
        for (int k = 0, first = 1; k < W16_ROLE_COUNT; k++) {
            const w16_layout_t *l = r->backend->layouts[k];
            if (!l || !l->model_dtype)
                continue;
            fputs(first ? "" : ", ", stdout);
            cli_json_string(stdout, l->name);
            first = 0;
        }
        fputc(']', stdout);
    }
    fputs("}\n", stdout);
}

/* The xpu platform's kernels have two routes in one build: said after the
 * answer (`specs explain` lists every platform's targets). */
static void print_xpu_route(void)
{
    const w16_target_t *ze = w16_target_find(WNA16_TARGET_XPU);
    const w16_target_t *ocl = w16_target_find(WNA16_TARGET_OCL);
    if (ocl)
        printf("kernels: the ocl target runs the repack and the generated "
               "fused MoE, routed on the device (SPIR-V through llvm-spirv-15 "
               "and OpenCL: PoCL on the CPU)%s\n",
               ze ? "; the xpu target (SPIR-V through Level Zero) runs both "
                    "on an Intel GPU, in its memory" : "");
    else if (ze)
        printf("kernels: the xpu target (SPIR-V through Level Zero) runs the "
               "repack and the generated fused MoE, routed on the device, on "
               "an Intel GPU; this build has no OpenCL route\n");
    else
        printf("kernels: this build has no target for xpu\n");
}

static void print_human(const wna16_select_result_t *r, bool xpu,
                        const sel_dtype_t *dt)
{
    if (r->backend)
        printf("backend: %s (%s)\n", wna16_spec_name(r->backend),
               r->backend->bsel.vllm_name);
    else
        printf("backend: none\n");
    if (r->n_passed_over)
        printf("passed over:\n");
    for (size_t i = 0; i < r->n_passed_over; i++)
        printf("  %s (%s): %s\n", wna16_spec_name(r->passed_over[i].backend),
               r->passed_over[i].backend->bsel.vllm_name,
               r->passed_over[i].reason);
    if (r->note[0])
        printf("note: %s\n", r->note);
    if (r->backend && !r->is_k_full)
        printf("is_k_full: false (act-order over a tensor-parallel shard of "
               "w2's input)\n");
    if (r->backend && xpu)
        print_xpu_route();
    if (!dt->said)
        return;
    char roles[128] = "";
    model_dtype_roles(r->backend, roles, sizeof roles);
    printf("dtype: %s: %s", dt->dtype ? wna16_model_dtype_name(dt->dtype)
                                      : "the checkpoint's", dt->why);
    if (r->backend && dt->dtype)
        printf(" (%s holds %s in it; the kernels take %s activations)",
               wna16_spec_name(r->backend), roles[0] ? roles : "no tensor",
               wna16_model_dtype_name(dt->dtype));
    printf("\n");
}

/* ---- the command ---------------------------------------------------------------- */

static int run_select(const sel_opts_t *o, const wna16_select_query_t *q,
                      const sel_dtype_t *dt)
{
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    wna16_select_result_t res;
    wna16_error_t err;
    wna16_status_t st = wna16_select(ctx, q, &res, &err);
    if (o->json)
        print_json(&res, dt);
    else if (st == WNA16_OK || st == WNA16_EUNSUPPORTED)
        print_human(&res, q->platform == WNA16_PLATFORM_XPU, dt);
    fflush(stdout);
    int rc = st == WNA16_OK ? CLI_OK : cli_fail(&err);
    wna16_context_destroy(ctx);
    return rc;
}

int cmd_select(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    sel_opts_t o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc != CLI_OK)
        return rc;
    wna16_model_config_t mc;
    deploy_t d = {0};
    memset(&mc, 0, sizeof mc);
    if (o.path) {
        if ((rc = load_config(o.path, &mc)) != CLI_OK ||
            (rc = deploy_from_config(&mc, &d)) != CLI_OK)
            return rc;
    }
    deploy_from_flags(&o, &d);
    /* a quantization_config wna16 does not read, and no --format: say
     * which method it is and which ones wna16 reads */
    if (!d.format && mc.quant_method[0]) {
        wna16_quant_desc_t qd;
        wna16_error_t err;
        if (wna16_model_config_quant(&mc, &qd, &err) != WNA16_OK)
            return cli_fail(&err);
    }
    if ((rc = check_missing(&d, o.path)) != CLI_OK)
        return rc;
    wna16_select_query_t q;
    if ((rc = build_query(&o, &d, &q)) != CLI_OK)
        return rc;
    sel_dtype_t dt = {0};
    if ((rc = resolve_dtype(&o, &mc, &q, &dt)) != CLI_OK)
        return rc;
    return run_select(&o, &q, &dt);
}
