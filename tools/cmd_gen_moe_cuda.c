/*
 * cmd_gen_moe_cuda.c - `wna16 gen --kind moe --target cuda`: prints one
 * specialized translation unit of the CUDA fused MoE (templates/ filled in
 * by gen/moe_cuda.c from a backend spec, its tiling table and a problem),
 * exactly the text the runtime hands NVRTC. Each unit stands alone: NVRTC
 * or `nvcc -std=c++17 -arch=sm_80 -c` compiles it.
 */
#include "cli.h"
#include "gen/moe_cuda.h"

#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 gen --kind moe --target cuda --to marlin|batched_marlin\n"
        "                 --bits 4|8 --group-size G [--zero-point] [--act-order]\n"
        "                 [--bias] [--hidden H] [--intermediate I] [--experts E]\n"
        "                 [--tokens M] [--topk K] [--dtype F16|BF16]\n"
        "                 [--scale-dtype F16|BF16] [--activation NAME]\n"
        "                 [--unit w13|w2|decode|aux|aux_route|\n"
        "                  aux_finalize_small|aux_gather_finalize] [--sm 80|90]\n"
        "                 [--split-sums] [--self-route]\n\n"
        "Prints the CUDA C translation unit of one kernel of the fused MoE on\n"
        "tensor cores: --unit w13 (default; GEMM 1 with the activation fused),\n"
        "w2 (GEMM 2), decode (the whole layer in one persistent kernel, which\n"
        "the runtime runs for up to 8 tokens and 64 routed slots) or aux\n"
        "(routing, gather and finalize; the runtime\n"
        "compiles these in the three aux_* units). The layout is\n"
        "checked against what the template reads, and the tile comes from\n"
        "the spec's tiling table for the problem: --hidden, --intermediate\n"
        "and --experts default to 2048, 768 and 8, --tokens and --topk (the\n"
        "routed slots per expert) to 1 and 8. --dtype is the activation dtype\n"
        "(default BF16), --scale-dtype defaults to it, --activation to silu.\n"
        "--sm is the device's architecture (default 80): with 90 the tiling's\n"
        "wgmma rows apply (Hopper's warpgroup MMA, not for act-order), and the\n"
        "unit then needs sm_90a. The unit compiles with NVRTC or\n"
        "nvcc -std=c++17 -arch=sm_80 -c (a wgmma unit: nvcc -std=c++17\n"
        "-gencode arch=compute_90a,code=sm_90a -c).\n"
        "The runtime picks two variants of a GEMM unit per run, printed with:\n"
        "--split-sums (w13: the last split-K slice of a tile adds the\n"
        "slices and activates, instead of a reduce kernel) and --self-route\n"
        "(each CTA routes its own row block from the top-k ids, for at most\n"
        "32 routed slots, --tokens x --topk; no routing kernel runs). Both\n"
        "are for mma.sync tiles only, --self-route not with --act-order.\n");
}

/* --unit values for the routing kernels (gen/moe_cuda.h) */
static const struct {
    const char *name;
    int piece;
} aux_units[] = {
    {"aux", W16_AUX_WHOLE},
    {"aux_route", W16_AUX_PIECE_ROUTE},
    {"aux_finalize_small", W16_AUX_PIECE_FINALIZE_SMALL},
    {"aux_gather_finalize", W16_AUX_PIECE_GATHER_FINALIZE},
};

/* The routing unit --unit names, or -1 (a GEMM unit). */
static int aux_piece(const char *unit)
{
    for (size_t i = 0; i < sizeof aux_units / sizeof aux_units[0]; i++)
        if (strcmp(unit, aux_units[i].name) == 0)
            return aux_units[i].piece;
    return -1;
}

typedef struct moe_opts {
    const char *to, *unit, *activation;
    long bits, gs, hidden, inter, experts, tokens, topk, sm;
    bool zp, act_order, bias, gs_set, split_sums, self_route;
    wna16_dtype_t dtype, scale_dtype;
    wna16_activation_t act; /* from `activation` */
} moe_opts_t;

/* The problem the options describe (gen/moe_cuda.h's contract input). */
static w16_problem_t problem_of(const moe_opts_t *o)
{
    return (w16_problem_t){o->experts, o->hidden, o->inter, o->bits, o->gs,
                           o->zp, o->act_order, o->bias};
}

static bool parse_dtype(const char *v, wna16_dtype_t *out)
{
    wna16_dtype_t d = v ? wna16_dtype_from_name(v, strlen(v)) : 0;
    if (d != WNA16_DTYPE_F16 && d != WNA16_DTYPE_BF16)
        return false;
    *out = d;
    return true;
}

static int parse(int argc, char **argv, moe_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->unit = "w13";
    o->activation = "silu";
    o->hidden = 2048;
    o->inter = 768;
    o->experts = 8;
    o->tokens = 1;
    o->topk = 8;
    o->dtype = WNA16_DTYPE_BF16;
    o->sm = 80;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *opt = argv[i], *ignored;
        long *num = NULL, lo = 1, hi = 1 << 20;
        const char **str = NULL;
        if (cli_opt_value(argc, argv, &i, "--kind", &ignored) ||
            cli_opt_value(argc, argv, &i, "--target", &ignored))
            continue; /* cmd_gen matched "moe" and "cuda" */
        if (cli_opt_value(argc, argv, &i, "--to", &v)) str = &o->to;
        else if (cli_opt_value(argc, argv, &i, "--unit", &v)) str = &o->unit;
        else if (cli_opt_value(argc, argv, &i, "--activation", &v)) str = &o->activation;
        else if (cli_opt_value(argc, argv, &i, "--bits", &v)) { num = &o->bits; lo = 4; hi = 8; }
        else if (cli_opt_value(argc, argv, &i, "--group-size", &v)) { num = &o->gs; lo = -1; o->gs_set = true; }
        else if (cli_opt_value(argc, argv, &i, "--hidden", &v)) num = &o->hidden;
        else if (cli_opt_value(argc, argv, &i, "--intermediate", &v)) num = &o->inter;
        else if (cli_opt_value(argc, argv, &i, "--experts", &v)) { num = &o->experts; hi = 4096; }
        else if (cli_opt_value(argc, argv, &i, "--tokens", &v)) num = &o->tokens;
        else if (cli_opt_value(argc, argv, &i, "--sm", &v)) { num = &o->sm; lo = 80; hi = 90; }
        else if (cli_opt_value(argc, argv, &i, "--topk", &v)) { num = &o->topk; hi = 4096; }
        else if (cli_opt_value(argc, argv, &i, "--dtype", &v)) {
            if (!parse_dtype(v, &o->dtype))
                return cli_usage_error("gen", "--dtype: F16 or BF16");
            continue;
        } else if (cli_opt_value(argc, argv, &i, "--scale-dtype", &v)) {
            if (!parse_dtype(v, &o->scale_dtype))
                return cli_usage_error("gen", "--scale-dtype: F16 or BF16");
            continue;
        }
        else if (strcmp(opt, "--zero-point") == 0) { o->zp = true; continue; }
        else if (strcmp(opt, "--act-order") == 0) { o->act_order = true; continue; }
        else if (strcmp(opt, "--bias") == 0) { o->bias = true; continue; }
        else if (strcmp(opt, "--split-sums") == 0) { o->split_sums = true; continue; }
        else if (strcmp(opt, "--self-route") == 0) { o->self_route = true; continue; }
        else return cli_usage_error("gen", "unknown option '%s'", opt);
        if (!v)
            return cli_usage_error("gen", "%s needs a value", opt);
        if (str)
            *str = v;
        else if (!cli_parse_int(v, lo, hi, num) ||
                 (num == &o->bits && *num != 4 && *num != 8) ||
                 (num == &o->gs && *num == 0))
            return cli_usage_error("gen", "%s: bad value '%s'", opt, v);
    }
    bool aux = aux_piece(o->unit) >= 0;
    if (strcmp(o->unit, "w13") && strcmp(o->unit, "w2") &&
        strcmp(o->unit, "decode") && !aux)
        return cli_usage_error("gen", "--unit: w13, w2, decode, aux, aux_route, "
                               "aux_finalize_small or aux_gather_finalize");
    if (!o->to || (!aux && (!o->bits || !o->gs_set)))
        return cli_usage_error("gen", "--to, --bits and --group-size are "
                               "required (--unit aux: --to)");
    if (!o->scale_dtype)
        o->scale_dtype = o->dtype;
    o->act = wna16_activation_from_name(o->activation);
    if (o->act == WNA16_ACT_INVALID)
        return cli_usage_error("gen", "--activation: unknown '%s'",
                               o->activation);
    return CLI_OK;
}

/* The GEMM unit as the runtime would build it for this problem. */
static int gemm_unit(wna16_context_t *ctx, const moe_opts_t *o,
                     const wna16_spec_t *spec, wna16_gemm_t g, w16_buf_t *b)
{
    wna16_activation_t act = o->act;
    w16_problem_t p = problem_of(o);
    wna16_error_t err;
    w16_moe_operand_t op;
    if (w16_moe_cuda_contract(spec, &p, g, &op, &err) != WNA16_OK)
        return cli_fail(&err);
    int64_t slots = o->tokens * o->topk;
    int bm;
    bool wgmma = false;
    w16_moe_gemm_cfg_t c;
    memset(&c, 0, sizeof c);
    const char *rule = "";
    if (w16_moe_cuda_block_m(spec, (slots + o->experts - 1) / o->experts,
                             o->sm == 90 && !o->act_order, &bm, &wgmma,
                             &err) != WNA16_OK ||
        w16_moe_cuda_tile(spec, bm, wgmma, g, op.N, op.K, &c, &rule, &err) !=
            WNA16_OK)
        return cli_fail(&err);
    c.bits = (int)o->bits;
    c.zp = o->zp;
    c.act_order = o->act_order;
    w16_moe_cfg_groups(&c, op.G, p.GS);
    c.scales = op.scales;
    c.act_dtype = o->dtype;
    c.scale_dtype = o->scale_dtype;
    c.bias_dtype = o->scale_dtype;
    c.activation = g == WNA16_GEMM_W13 ? act : WNA16_ACT_INVALID;
    /* the run's variants, refused where the runtime never picks them */
    const char *why = NULL;
    if ((o->split_sums || o->self_route) && c.wgmma)
        why = "the tile is a wgmma row (these variants are mma.sync's)";
    else if (o->split_sums && g != WNA16_GEMM_W13)
        why = "--split-sums is GEMM 1's (--unit w13)";
    else if (o->self_route && o->act_order)
        why = "--self-route does not take act order (the run gathers rows)";
    if (why || (o->self_route && slots > W16_MOE_SELF_ROUTE_SLOTS)) {
        if (why)
            fprintf(stderr, "wna16: %s: %s\n", rule, why);
        else
            fprintf(stderr, "wna16: --self-route takes at most %d routed "
                    "slots (--tokens x --topk: %lld)\n",
                    W16_MOE_SELF_ROUTE_SLOTS, (long long)slots);
        return CLI_FAIL;
    }
    c.split_sums = o->split_sums;
    c.self_route = o->self_route;
    int64_t ncta = g == WNA16_GEMM_W13
                       ? (op.IP + c.block_n / 2 - 1) / (c.block_n / 2)
                       : (op.N + c.block_n - 1) / c.block_n;
    w16_buf_printf(b, "// %s: N = %lld, K = %lld, %lld groups; tile %s;\n"
                   "// %lld column CTAs per row block of %d routed rows, %u "
                   "threads, %zu bytes of dynamic shared memory\n",
                   g == WNA16_GEMM_W13 ? "w13" : "w2", (long long)op.N,
                   (long long)op.K, (long long)op.G, rule, (long long)ncta, bm,
                   w16_moe_gemm_threads(&c), w16_moe_gemm_shared(&c));
    if (w16_moe_gemm_source(&c, b, &err) != WNA16_OK)
        return cli_fail(&err);
    (void)ctx;
    return CLI_OK;
}

/* The decode unit as the runtime would build it for this problem. */
static int decode_unit(const moe_opts_t *o, const wna16_spec_t *spec,
                       w16_buf_t *b)
{
    wna16_activation_t act = o->act;
    w16_problem_t p = problem_of(o);
    wna16_error_t err;
    w16_moe_operand_t op[2];
    w16_moe_unit_quant_t q = {
        .bits = (int)o->bits, .zp = o->zp, .act_order = o->act_order,
        .group_size = o->gs, .act_dtype = o->dtype,
        .scale_dtype = o->scale_dtype, .bias_dtype = o->scale_dtype,
        .activation = act};
    w16_moe_decode_cfg_t c;
    if (w16_moe_cuda_contract(spec, &p, WNA16_GEMM_W13, &op[0], &err) !=
            WNA16_OK ||
        w16_moe_cuda_contract(spec, &p, WNA16_GEMM_W2, &op[1], &err) !=
            WNA16_OK ||
        w16_moe_decode_cfg(op, &q, &c, &err) != WNA16_OK ||
        w16_moe_decode_source(&c, b, &err) != WNA16_OK)
        return cli_fail(&err);
    return CLI_OK;
}

int cmd_gen_moe_cuda(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    moe_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc != CLI_OK)
        return rc;
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    const wna16_spec_t *spec = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, o.to);
    if (!spec) {
        fprintf(stderr, "wna16: no backend spec named '%s' (see 'wna16 specs "
                "list')\n", o.to);
        wna16_context_destroy(ctx);
        return CLI_FAIL;
    }
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    wna16_error_t err;
    if (aux_piece(o.unit) >= 0) {
        if (w16_moe_aux_source(o.dtype, aux_piece(o.unit), &b, &err) !=
            WNA16_OK)
            rc = cli_fail(&err);
    } else if (strcmp(o.unit, "decode") == 0) {
        rc = decode_unit(&o, spec, &b);
    } else {
        rc = gemm_unit(ctx, &o, spec,
                       strcmp(o.unit, "w2") == 0 ? WNA16_GEMM_W2
                                                 : WNA16_GEMM_W13, &b);
    }
    if (rc == CLI_OK && b.failed) {
        fprintf(stderr, "wna16: out of memory\n");
        rc = CLI_FAIL;
    }
    if (rc == CLI_OK)
        fputs(b.data, stdout);
    w16_buf_free(&b);
    wna16_context_destroy(ctx);
    return rc;
}
