/*
 * cmd_gen.c - `wna16 gen`: prints the generated kernels of one job (the
 * repack kernels of a format/backend pair, or the fused-MoE kernels of a
 * backend), as the kernel IR, LLVM IR, CUDA C or SPIR-V (disassembled),
 * for debugging and review; -o writes the SPIR-V modules' binary words.
 * --batch runs the cases of a list in one process, each case's output in a
 * file of its own (scripts/gen_snapshot.sh records 1,276 kernels so).
 */
#define _POSIX_C_SOURCE 200809L /* strdup, getpid, getline, O_CLOEXEC */
#include "cli.h"
#include "gen/build_moe.h"
#include "gen/build_repack.h"
#include "gen/build_route.h"
#include "gen/emit_llvm.h"
#include "gen/emit_cuda.h"
#include "gen/emit_spirv.h"
#include "runtime/output.h"
#include "runtime/ref/ref.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 gen --kind repack --from FORMAT --to BACKEND\n"
        "                 [--target ir|llvm|cuda|spirv] [-o PATH]\n"
        "                 --bits 4|8 --group-size G [--zero-point] [--act-order]\n"
        "                 [--bias] [--hidden H] [--intermediate I] [--experts E]\n"
        "                 [--scale-dtype F16|BF16] [--input-dtype int8|fp8]\n"
        "                 [--tensor NAME]\n"
        "       wna16 gen --kind moe --to BACKEND [--target ir|llvm|cuda|spirv]\n"
        "                 [-o PATH]\n"
        "                 --bits 4|8 --group-size G [--zero-point] [--bias]\n"
        "                 [--activation NAME] [--act-dtype F16|BF16] [--topk K]\n"
        "                 [--block-m BM] [--batched] [--stage NAME]\n"
        "                 [--expert-map] [--numerics f32|bf16-exact]\n"
        "                 [--hidden H] [--intermediate I] [--experts E]\n"
        "                 [--scale-dtype F16|BF16]\n"
        "       wna16 gen --batch LIST|- [--batch-dir DIR]\n\n"
        "--kind repack prints the repack kernels that turn a layer in FORMAT\n"
        "into BACKEND's layout: one kernel per destination tensor (w13_qweight,\n"
        "w2_scales, ...), or only --tensor NAME.\n"
        "--kind moe prints the fused-MoE kernels that run a layer stored in\n"
        "BACKEND's layout: input, gemm1 (gate/up and the activation), gemm2\n"
        "and combine, or only --stage NAME; --activation (default silu),\n"
        "--act-dtype (BF16), --topk (8), --block-m (slots per block, 4) and\n"
        "--batched (the batched activation format) select the configuration;\n"
        "--numerics bf16-exact prints the GEMMs that round each dequantized\n"
        "weight to bf16 (the portable kernels' bf16-exact; bf16 activations),\n"
        "f32 (default) those that keep it in float32.\n"
        "--stage route prints the routing kernel that targets running the\n"
        "fused MoE on the device (xpu, ocl) launch first: vLLM's\n"
        "moe_align_block_size as one workgroup, for --experts, --block-m and\n"
        "--batched (--expert-map: ids through an expert map); it uses\n"
        "workgroup memory and barriers, so --target ir, spirv or cuda.\n"
        "Every dimension is a constant in the kernels, so the shape matters:\n"
        "--hidden, --intermediate and --experts default to 256, 128 and 2.\n"
        "--target ir (default) prints the kernel IR, --target llvm the LLVM IR\n"
        "before optimization (needs LLVM 19), --target cuda the CUDA C\n"
        "translation unit NVRTC compiles (nvcc compiles it too), --target\n"
        "spirv the SPIR-V 1.2 module of each kernel (OpenCL flavour, for Level\n"
        "Zero), validated by SPIRV-Tools, disassembled.\n"
        "-o PATH (with --target spirv) writes the modules' binary words instead:\n"
        "into PATH when the job has one kernel (pick it with --tensor or\n"
        "--stage; a job of several kernels is refused), or as NAME.spv, one\n"
        "file a kernel named after it, when PATH is an existing directory.\n"
        "A regular file is replaced atomically (a temporary and a rename), a\n"
        "symbolic link's target is written, - (standard output), a FIFO or a\n"
        "character device is streamed to.\n"
        "--input-dtype picks the layout's variant for 8-bit activations.\n"
        "--kind moe --target cuda --to marlin|batched_marlin prints the\n"
        "tensor-core kernels instead (wna16 gen --kind moe --target cuda\n"
        "--to marlin --help).\n"
        "--batch LIST runs many cases in one process (LIST -: standard\n"
        "input): each line is a case's NAME, then the options of one `wna16\n"
        "gen` as above, cut at blanks (no quoting); blank lines and lines\n"
        "starting with # are skipped, and the whole list is read before any\n"
        "case runs. A case's output and messages go to DIR/NAME.txt\n"
        "(--batch-dir, default .) as `wna16 gen OPTIONS > DIR/NAME.txt 2>&1`\n"
        "writes them, and a line \"STATUS NAME\" to standard output, STATUS\n"
        "being that command's exit status (0, 1 refused or failed, 2 usage).\n"
        "A failing case does not stop the batch. Exit status: 0 when every\n"
        "case succeeded; 1 when one failed, or the list or an output file\n"
        "could not be read or created (this stops the batch).\n");
}

typedef struct gen_opts {
    const char *from, *to, *target, *tensor, *kind, *stage, *output;
    long bits, gs, hidden, inter, experts, topk, block_m;
    bool zp, act_order, bias, gs_set, batched, expert_map;
    wna16_dtype_t scale_dtype, act_dtype;
    wna16_numerics_t numerics;
    wna16_activation_t activation;
    wna16_input_dtype_t input;
} gen_opts_t;

static int parse(int argc, char **argv, gen_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->target = "ir";
    o->kind = NULL;
    o->hidden = 256;
    o->inter = 128;
    o->experts = 2;
    o->scale_dtype = WNA16_DTYPE_F16;
    o->act_dtype = WNA16_DTYPE_BF16;
    o->activation = WNA16_ACT_SILU;
    o->topk = 8;
    o->block_m = 4;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *opt = argv[i];
        long *num = NULL, lo = 1, hi = 1 << 20;
        const char **str = NULL;
        if (cli_opt_value(argc, argv, &i, "--kind", &v)) str = &o->kind;
        else if (cli_opt_value(argc, argv, &i, "--from", &v)) str = &o->from;
        else if (cli_opt_value(argc, argv, &i, "--to", &v)) str = &o->to;
        else if (cli_opt_value(argc, argv, &i, "--target", &v)) str = &o->target;
        else if (cli_opt_value(argc, argv, &i, "--tensor", &v)) str = &o->tensor;
        else if (cli_opt_value(argc, argv, &i, "-o", &v)) str = &o->output;
        else if (cli_opt_value(argc, argv, &i, "--bits", &v)) { num = &o->bits; lo = 4; hi = 8; }
        else if (cli_opt_value(argc, argv, &i, "--group-size", &v)) { num = &o->gs; lo = -1; o->gs_set = true; }
        else if (cli_opt_value(argc, argv, &i, "--hidden", &v)) num = &o->hidden;
        else if (cli_opt_value(argc, argv, &i, "--intermediate", &v)) num = &o->inter;
        else if (cli_opt_value(argc, argv, &i, "--experts", &v)) { num = &o->experts; hi = 1024; }
        else if (cli_opt_value(argc, argv, &i, "--stage", &v)) str = &o->stage;
        else if (cli_opt_value(argc, argv, &i, "--topk", &v)) { num = &o->topk; hi = 1024; }
        else if (cli_opt_value(argc, argv, &i, "--block-m", &v)) { num = &o->block_m; hi = 16; }
        else if (cli_opt_value(argc, argv, &i, "--activation", &v)) {
            o->activation = wna16_activation_from_name(v);
            if (o->activation == WNA16_ACT_INVALID)
                return cli_usage_error("gen", "--activation: unknown '%s'",
                                       v ? v : "");
            continue;
        }
        else if (cli_opt_value(argc, argv, &i, "--act-dtype", &v)) {
            o->act_dtype = v ? wna16_dtype_from_name(v, strlen(v)) : 0;
            if (o->act_dtype != WNA16_DTYPE_F16 && o->act_dtype != WNA16_DTYPE_BF16)
                return cli_usage_error("gen", "--act-dtype: F16 or BF16");
            continue;
        }
        else if (cli_opt_value(argc, argv, &i, "--numerics", &v)) {
            o->numerics = v ? wna16_numerics_from_name(v)
                            : WNA16_NUMERICS_INVALID;
            if (o->numerics != WNA16_NUMERICS_F32 &&
                o->numerics != WNA16_NUMERICS_BF16_EXACT)
                return cli_usage_error("gen", "--numerics: f32 or bf16-exact "
                                       "(int8-dynamic is the dedicated CPU "
                                       "kernels', which print no IR)");
            continue;
        }
        else if (cli_opt_value(argc, argv, &i, "--scale-dtype", &v)) {
            o->scale_dtype = v ? wna16_dtype_from_name(v, strlen(v)) : 0;
            if (o->scale_dtype != WNA16_DTYPE_F16 && o->scale_dtype != WNA16_DTYPE_BF16)
                return cli_usage_error("gen", "--scale-dtype: F16 or BF16");
            continue;
        }
        else if (cli_opt_value(argc, argv, &i, "--input-dtype", &v)) {
            o->input = wna16_input_dtype_from_name(v);
            if (o->input != WNA16_INPUT_INT8 && o->input != WNA16_INPUT_FP8)
                return cli_usage_error("gen", "--input-dtype: int8 or fp8");
            continue;
        }
        else if (strcmp(opt, "--zero-point") == 0) { o->zp = true; continue; }
        else if (strcmp(opt, "--act-order") == 0) { o->act_order = true; continue; }
        else if (strcmp(opt, "--bias") == 0) { o->bias = true; continue; }
        else if (strcmp(opt, "--batched") == 0) { o->batched = true; continue; }
        else if (strcmp(opt, "--expert-map") == 0) { o->expert_map = true; continue; }
        else return cli_usage_error("gen", "unknown option '%s'", opt);
        if (!v)
            return cli_usage_error("gen", "%s needs a value", opt);
        if (str)
            *str = v;
        else if (!cli_parse_int(v, lo, hi, num) || (num == &o->bits && *num != 4 && *num != 8) ||
                 (num == &o->gs && *num == 0))
            return cli_usage_error("gen", "%s: bad value '%s'", opt, v);
    }
    if (!o->kind || (strcmp(o->kind, "repack") && strcmp(o->kind, "moe")))
        return cli_usage_error("gen", "--kind repack or --kind moe is required");
    bool moe = strcmp(o->kind, "moe") == 0;
    if ((!moe && !o->from) || !o->to || !o->bits || !o->gs_set)
        return cli_usage_error("gen", "%s--to, --bits and --group-size are "
                               "required", moe ? "" : "--from, ");
    if (moe && (o->from || o->tensor || o->act_order))
        return cli_usage_error("gen", "--kind moe takes no --from, --tensor "
                               "or --act-order");
    if (!moe && o->numerics != WNA16_NUMERICS_F32)
        return cli_usage_error("gen", "--numerics is for --kind moe");
    if (o->expert_map && !(o->stage && strcmp(o->stage, "route") == 0))
        return cli_usage_error("gen", "--expert-map is for --stage route");
    if (!moe && (o->stage || o->batched))
        return cli_usage_error("gen", "--stage and --batched are for --kind "
                               "moe");
    if (strcmp(o->target, "ir") && strcmp(o->target, "llvm") &&
        strcmp(o->target, "cuda") && strcmp(o->target, "spirv"))
        return cli_usage_error("gen", "--target: ir, llvm, cuda or spirv");
    if (o->output && strcmp(o->target, "spirv") != 0)
        return cli_usage_error("gen", "-o writes SPIR-V modules: it needs "
                               "--target spirv (the other targets print text)");
    return CLI_OK;
}

/* The SPIR-V modules of a job run with -o, written once all are built
 * (whether PATH may take them depends on how many there are). */
typedef struct spv_files {
    char **names;
    w16_words_t *mods;
    int n, cap;
} spv_files_t;

static void spv_files_free(spv_files_t *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->names[i]);
        w16_words_free(&f->mods[i]);
    }
    free(f->names);
    free(f->mods);
}

/* Writes words to path the way every wna16 output is written
 * (runtime/output.h): a regular file through a temporary and a rename, so
 * a failure leaves no partial module; a link's target; -, a FIFO or a
 * character device streamed; a directory, block device or socket refused. */
static int write_words(wna16_context_t *ctx, const char *path,
                       const w16_words_t *w)
{
    w16_arena_t arena;
    w16_arena_init(&arena, ctx);
    w16_output_t out;
    wna16_error_t err = {0};
    wna16_status_t st = w16_output_open(ctx, &arena, path, &out, &err);
    if (st == WNA16_OK) {
        const char *p = (const char *)w->data;
        size_t left = w->len * sizeof *w->data;
        while (left > 0) {
            ssize_t n = write(out.fd, p, left);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                st = w16_err(&err, WNA16_EIO, "%s: cannot write: %s",
                                     w16_output_name(&out),
                                     n < 0 ? strerror(errno) : "no progress");
                w16_output_discard(&out);
                break;
            }
            p += n;
            left -= (size_t)n;
        }
        if (st == WNA16_OK)
            st = w16_output_commit(&out, &err);
    }
    w16_arena_free(&arena);
    return st == WNA16_OK ? CLI_OK : cli_fail(&err);
}

/* -o PATH: one module into PATH, or NAME.spv for each into a directory. */
static int write_spv_files(wna16_context_t *ctx, const char *output,
                           const spv_files_t *f)
{
    struct stat st;
    bool dir = stat(output, &st) == 0 && S_ISDIR(st.st_mode);
    if (!dir && f->n != 1)
        return cli_usage_error("gen", "-o %s: the job has %d kernels (%s, "
                               "...); pick one with --tensor or --stage, or "
                               "name an existing directory for NAME.spv files",
                               output, f->n, f->n ? f->names[0] : "");
    for (int i = 0; i < f->n; i++) {
        char *path = NULL;
        if (dir) {
            size_t n = strlen(output) + strlen(f->names[i]) + 8;
            if ((path = malloc(n)) != NULL)
                snprintf(path, n, "%s/%s.spv", output, f->names[i]);
        }
        const char *to = dir ? path : output;
        int rc = to ? write_words(ctx, to, &f->mods[i]) : CLI_FAIL;
        /* The summary goes where the module does not. */
        if (rc == CLI_OK)
            fprintf(strcmp(to, "-") == 0 ? stderr : stdout, "%s: %s, %zu "
                    "words\n", to, f->names[i], f->mods[i].len);
        free(path);
        if (rc != CLI_OK)
            return rc;
    }
    return CLI_OK;
}

/* One kernel in the chosen target's form: printed after a comment line
 * (the header), or with -o emitted into `files` for writing. */
static int put_kernel(const gen_opts_t *o, wna16_context_t *ctx,
                      const kir_kernel_t *k, const char *header, bool first,
                      spv_files_t *files)
{
    wna16_error_t err;
    if (o->output) {
        if (files->n == files->cap) {
            int cap = files->cap ? 2 * files->cap : 8;
            char **names = realloc(files->names, sizeof *names * (size_t)cap);
            if (names)
                files->names = names;
            w16_words_t *mods = realloc(files->mods, sizeof *mods * (size_t)cap);
            if (mods)
                files->mods = mods;
            if (!names || !mods) {
                fprintf(stderr, "wna16: out of memory\n");
                return CLI_FAIL;
            }
            files->cap = cap;
        }
        w16_words_t *w = &files->mods[files->n];
        w16_words_init(w, ctx);
        char *name = strdup(k->name);
        wna16_status_t st = name ? w16_emit_spirv(k, w, &err)
                                 : w16_err_nomem(&err, "naming a module");
        if (st != WNA16_OK) {
            free(name);
            w16_words_free(w);
            return cli_fail(&err);
        }
        files->names[files->n++] = name;
        return CLI_OK;
    }
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    int rc = CLI_OK;
    bool cuda = strcmp(o->target, "cuda") == 0;
    if (strcmp(o->target, "ir") == 0)
        kir_print(&b, k);
    else if (cuda) {
        if (w16_emit_cuda(k, first, &b, &err) != WNA16_OK)
            rc = cli_fail(&err);
    } else if (strcmp(o->target, "spirv") == 0) {
        if (w16_emit_spirv_text(k, &b, &err) != WNA16_OK)
            rc = cli_fail(&err);
    } else if (w16_emit_llvm_text(k, &b, &err) != WNA16_OK)
        rc = cli_fail(&err);
    if (rc == CLI_OK)
        printf("%s%s %s\n%s\n", first ? "" : "\n", cuda ? "//" : ";", header,
               b.data ? b.data : "");
    w16_buf_free(&b);
    return rc;
}

/* --kind moe: the four fused-MoE kernels (or --stage). */
static int gen_moe(const gen_opts_t *o, wna16_context_t *ctx,
                   const wna16_spec_t *dst, spv_files_t *files)
{
    w16_moe_request_t req = {.backend = dst,
                             .problem = {o->experts, o->hidden, o->inter, o->bits,
                                         o->gs, o->zp, false, o->bias},
                             .batched = o->batched, .batched_weights = o->batched,
                             .topk = (int32_t)o->topk, .block_m = (int)o->block_m,
                             /* as the runtime builds them for aligned
                             * tensors (every allocator's) */
                             .qweight_align = 4};
    wna16_moe_params_init(&req.params);
    req.params.activation = o->activation;
    req.params.act_dtype = o->act_dtype;
    req.numerics = o->numerics;
    for (int g = 0; g < 2; g++) {
        const w16_layout_t *ls = dst->layouts[W16_ROLE_SCALES];
        const w16_layout_t *lb = dst->layouts[W16_ROLE_BIAS];
        for (int i = 0; ls && i < ls->n_dtypes; i++)
            if (ls->dtypes[i] == o->scale_dtype)
                req.dtype[g][W16_ROLE_SCALES] = o->scale_dtype;
        for (int i = 0; lb && i < lb->n_dtypes; i++)
            if (lb->dtypes[i] == o->scale_dtype)
                req.dtype[g][W16_ROLE_BIAS] = o->scale_dtype;
    }
    if (o->stage && strcmp(o->stage, "route") == 0) {
        w16_route_request_t rq = {.E = (int32_t)o->experts,
                                  .block_m = (int)o->block_m,
                                  .batched = o->batched,
                                  .map = o->expert_map && !o->batched};
        wna16_error_t err;
        w16_route_kernel_t rk;
        if (w16_build_route(ctx, &rq, &rk, &err) != WNA16_OK)
            return cli_fail(&err);
        char header[160];
        snprintf(header, sizeof header, "route: per call, one workgroup of "
                 "%d lanes", rk.kernel->lanes);
        int rc = put_kernel(o, ctx, rk.kernel, header, true, files);
        w16_route_kernel_free(&rk);
        return rc;
    }
    int printed = 0;
    for (int s = 0; s < W16_MOE_STAGE_COUNT; s++) {
        const char *name = w16_moe_stage_name((w16_moe_stage_t)s);
        if (o->stage && strcmp(o->stage, name) != 0)
            continue;
        wna16_error_t err;
        w16_moe_kernel_t mk;
        if (w16_build_moe(ctx, &req, (w16_moe_stage_t)s, &mk, &err) != WNA16_OK)
            return cli_fail(&err);
        char header[160];
        snprintf(header, sizeof header, "%s: per call, %s x %lld workgroups "
                 "of %d lanes", name, s == W16_MOE_GEMM1 || s == W16_MOE_GEMM2
                 ? "blocks" : "rows", (long long)mk.tiles, mk.kernel->lanes);
        int rc = put_kernel(o, ctx, mk.kernel, header, printed == 0, files);
        w16_moe_kernel_free(&mk);
        if (rc != CLI_OK)
            return rc;
        printed++;
    }
    if (!printed) {
        fprintf(stderr, "wna16: no fused-MoE stage '%s' (input, gemm1, gemm2, "
                "combine, route)\n", o->stage);
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* Is `--name VALUE` (or --name=VALUE) among the arguments? */
static bool has_opt(int argc, char **argv, const char *name, const char *value)
{
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (cli_opt_value(argc, argv, &i, name, &v) && v &&
            strcmp(v, value) == 0)
            return true;
    }
    return false;
}

/* Is `--name` among the arguments at all? */
static bool has_any(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (cli_opt_value(argc, argv, &i, name, &v))
            return true;
    }
    return false;
}

/* One job: what `wna16 gen` does without --batch, and each case of a batch. */
static int gen_case(int argc, char **argv)
{
    /* the tensor-core fused MoE of the Marlin layouts, from templates/
     * (tools/cmd_gen_moe_cuda.c, also its --help and usage errors); other
     * layouts print the portable IR kernels as CUDA C */
    if (has_opt(argc, argv, "--kind", "moe") &&
        has_opt(argc, argv, "--target", "cuda") &&
        (has_opt(argc, argv, "--to", "marlin") ||
         has_opt(argc, argv, "--to", "batched_marlin") ||
         !has_any(argc, argv, "--to")))
        return cmd_gen_moe_cuda(argc, argv);
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    gen_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc != CLI_OK)
        return rc;
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    spv_files_t files = {0};
    if (strcmp(o.kind, "moe") == 0) {
        const wna16_spec_t *dst = wna16_spec_find(ctx, 0, o.to);
        if (!dst) {
            fprintf(stderr, "wna16: no spec named '%s' (see 'wna16 specs "
                    "list')\n", o.to);
            rc = CLI_FAIL;
        } else {
            rc = gen_moe(&o, ctx, dst, &files);
        }
        if (rc == CLI_OK && o.output)
            rc = write_spv_files(ctx, o.output, &files);
        spv_files_free(&files);
        wna16_context_destroy(ctx);
        return rc;
    }
    const wna16_spec_t *src = wna16_spec_find(ctx, 0, o.from);
    const wna16_spec_t *dst = wna16_spec_find(ctx, 0, o.to);
    if (!src || !dst) {
        fprintf(stderr, "wna16: no spec named '%s' (see 'wna16 specs list')\n",
                !src ? o.from : o.to);
        wna16_context_destroy(ctx);
        return CLI_FAIL;
    }
    /* the GPU targets' kernel shape (staged tiles) or the CPU's (word
     * blocks), as each target's descriptor asks the builder for */
    bool gpu = strcmp(o.target, "cuda") == 0 || strcmp(o.target, "spirv") == 0;
    w16_problem_t p = {o.experts, o.hidden, o.inter, o.bits, o.gs, o.zp,
                       o.act_order, o.bias, .a8 = (int)o.input};
    wna16_error_t err;
    int printed = 0;
    /* The configuration must fit both ends, as `wna16 repack` demands of a
     * real checkpoint: a source without zero points has no qzeros to read,
     * a destination without them would silently drop the checkpoint's. */
    int64_t v13[W16_VAR_COUNT];
    if (w16_check_holds(src, &p, (int32_t)p.I, &err) != WNA16_OK ||
        w16_spec_bind(dst, &p, WNA16_GEMM_W13, v13, &err) != WNA16_OK ||
        w16_check_holds(dst, &p, (int32_t)v13[W16_VAR_IP], &err) != WNA16_OK) {
        wna16_context_destroy(ctx);
        return cli_fail(&err);
    }
    rc = CLI_OK;
    for (int g = 0; g < 2 && rc == CLI_OK; g++) {
        int64_t dv[W16_VAR_COUNT];
        if (w16_spec_bind(dst, &p, (wna16_gemm_t)g, dv, &err) != WNA16_OK) {
            rc = cli_fail(&err);
            break;
        }
        for (int r = 0; r < W16_ROLE_COUNT && rc == CLI_OK; r++) {
            const w16_layout_t *l = dst->layouts[r];
            if (!w16_layout_present(l, dv))
                continue;
            char tname[128];
            snprintf(tname, sizeof tname, "%s_%s", g ? "w2" : "w13", l->name);
            if (o.tensor && strcmp(o.tensor, tname) != 0)
                continue;
            w16_repack_request_t req = {.src = src, .dst = dst, .problem = p,
                                        .gemm = (wna16_gemm_t)g,
                                        .role = (w16_role_t)r,
                                        .sort_k = o.act_order &&
                                                  dst->act_order_sort,
                                        /* the CPU's kernels (ir, llvm) */
                                        .word_blocks = !gpu,
                                        .staged_tiles = gpu};
            /* the roles the kernel reads, with checkpoint-like dtypes */
            req.src_dtype[W16_ROLE_QWEIGHT] = src->layouts[W16_ROLE_QWEIGHT]
                ? src->layouts[W16_ROLE_QWEIGHT]->dtypes[0] : 0;
            if (r == W16_ROLE_SCALES || r == W16_ROLE_WEIGHT)
                req.src_dtype[W16_ROLE_SCALES] = o.scale_dtype;
            /* codes read zeros for block sums and for transforms of z */
            if ((r == W16_ROLE_QZEROS || r == W16_ROLE_WEIGHT ||
                 (r == W16_ROLE_QWEIGHT &&
                  (l->sums_block_k || w16_expr_uses(l->encode, W16_VAR_z)))) &&
                o.zp &&
                src->layouts[W16_ROLE_QZEROS])
                req.src_dtype[W16_ROLE_QZEROS] = src->layouts[W16_ROLE_QZEROS]->dtypes[0];
            if (r == W16_ROLE_G_IDX && o.act_order && src->layouts[W16_ROLE_G_IDX])
                req.src_dtype[W16_ROLE_G_IDX] = WNA16_DTYPE_I32;
            if (r == W16_ROLE_SORT_IDX || (r == W16_ROLE_G_IDX && !o.act_order))
                continue; /* empty without act-order; no source otherwise */
            if (r == W16_ROLE_BIAS)
                req.src_dtype[W16_ROLE_BIAS] = o.scale_dtype;
            if (r != W16_ROLE_QWEIGHT && r != W16_ROLE_WEIGHT)
                req.src_dtype[W16_ROLE_QWEIGHT] = 0;
            req.dst_dtype = l->dtypes[0];
            for (int d = 0; d < l->n_dtypes; d++)
                if (l->dtypes[d] == o.scale_dtype &&
                    (r == W16_ROLE_SCALES || r == W16_ROLE_BIAS))
                    req.dst_dtype = o.scale_dtype;
            /* the sums kernel, unless the codes kernel writes the sums */
            int passes = l->sums_block_k ? 2 : 1;
            for (int pass = 0; pass < passes; pass++) {
                w16_repack_kernel_t rk;
                wna16_status_t st = pass ? w16_build_repack_sums(ctx, &req, &rk, &err)
                                         : w16_build_repack(ctx, &req, &rk, &err);
                if (st != WNA16_OK) {
                    rc = cli_fail(&err);
                    break;
                }
                char header[200];
                snprintf(header, sizeof header,
                         strcmp(o.target, "cuda") == 0 ? "%s: %lld blocks of %d threads"
                                                       : "%s: %lld workgroups of %d lanes",
                         tname, (long long)rk.num_groups, rk.kernel->lanes);
                rc = put_kernel(&o, ctx, rk.kernel, header, printed == 0, &files);
                if (rc == CLI_OK)
                    printed++;
                if (rk.sums_fused)
                    passes = 1;
                w16_repack_kernel_free(&rk);
            }
        }
    }
    if (rc == CLI_OK && !printed) {
        fprintf(stderr, "wna16: no tensor %s in %s's layout for this "
                "configuration\n", o.tensor ? o.tensor : "", dst->name);
        rc = CLI_FAIL;
    }
    if (rc == CLI_OK && o.output)
        rc = write_spv_files(ctx, o.output, &files);
    spv_files_free(&files);
    wna16_context_destroy(ctx);
    return rc;
}

/* ---- --batch: the cases of a list in one process ---------------------------
 *
 * A list line is "NAME ARGUMENTS...": the arguments of one `wna16 gen`, cut
 * at blanks (no quoting). Each case runs as gen_case with standard output
 * and standard error both on BATCH_DIR/NAME.txt, so the file holds what
 * `wna16 gen ARGUMENTS > NAME.txt 2>&1` writes, in the same order (stdout
 * fully buffered on a regular file and flushed when the case ends, as at
 * exit; stderr unbuffered), and "STATUS NAME" goes to the real standard
 * output, STATUS being the exit status that command has. The process
 * starts once: scripts/gen_snapshot.sh's 1,276 cases took 146 s of CPU as
 * a process each (most of it loading LLVM's libraries) and take 9 s so. */

typedef struct batch_case {
    long line;   /* in the list, from 1 */
    char *text;  /* the line, cut into NUL-terminated words in place */
    char **argv; /* argv[0] "gen", then the case's arguments; NULL-ended */
    int argc;
    const char *name;
} batch_case_t;

typedef struct batch {
    batch_case_t *cases;
    int n, cap;
} batch_t;

static void batch_free(batch_t *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->cases[i].text);
        free(b->cases[i].argv);
    }
    free(b->cases);
}

/* Cuts `text` (owned by the case from here) into words and adds the case;
 * a blank or # line adds nothing. Returns CLI_OK, or CLI_FAIL with the
 * message printed (`list` and the line named). */
static int batch_add(batch_t *b, const char *list, long line, char *text)
{
    static const char blanks[] = " \t\r\n\v\f";
    int words = 0;
    for (char *p = text + strspn(text, blanks); *p;
         p += strcspn(p, blanks), p += strspn(p, blanks))
        words++;
    char *first = text + strspn(text, blanks);
    if (words == 0 || *first == '#') {
        free(text);
        return CLI_OK;
    }
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        batch_case_t *c = realloc(b->cases, sizeof *c * (size_t)cap);
        if (!c) {
            free(text);
            fprintf(stderr, "wna16: out of memory reading %s\n", list);
            return CLI_FAIL;
        }
        b->cases = c;
        b->cap = cap;
    }
    /* "gen", the arguments (words - 1 of them, after NAME), NULL */
    char **argv = malloc(sizeof *argv * (size_t)(words + 1));
    if (!argv) {
        free(text);
        fprintf(stderr, "wna16: out of memory reading %s\n", list);
        return CLI_FAIL;
    }
    batch_case_t *c = &b->cases[b->n];
    *c = (batch_case_t){.line = line, .text = text, .argv = argv,
                        .argc = words};
    argv[0] = "gen";
    int w = 0;
    for (char *p = first; *p;) {
        size_t len = strcspn(p, blanks);
        char *next = p + len + (p[len] ? 1 : 0);
        p[len] = '\0';
        if (w == 0)
            c->name = p;
        else
            argv[w] = p;
        w++;
        p = next + strspn(next, blanks);
    }
    argv[words] = NULL;
    b->n++;
    if (strchr(c->name, '/') || strcmp(c->name, ".") == 0 ||
        strcmp(c->name, "..") == 0) {
        fprintf(stderr, "wna16: %s:%ld: case name '%s': the output is NAME.txt "
                "in --batch-dir, so a name has no '/' and is not . or ..\n",
                list, line, c->name);
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* Reads every case of `list` (a file, or - for standard input) before any
 * runs, so that a bad list runs nothing. */
static int batch_read(const char *list, batch_t *b)
{
    bool std_in = strcmp(list, "-") == 0;
    FILE *f = std_in ? stdin : fopen(list, "r");
    if (!f) {
        fprintf(stderr, "wna16: %s: cannot open the batch list: %s\n", list,
                strerror(errno));
        return CLI_FAIL;
    }
    const char *name = std_in ? "standard input" : list;
    int rc = CLI_OK;
    char *text = NULL;
    size_t cap = 0;
    long line = 0;
    while (rc == CLI_OK && getline(&text, &cap, f) >= 0) {
        line++;
        rc = batch_add(b, name, line, text);
        text = NULL; /* the case owns it (or it is freed) */
        cap = 0;
    }
    free(text);
    if (rc == CLI_OK && ferror(f)) {
        fprintf(stderr, "wna16: %s: cannot read the batch list: %s\n", name,
                strerror(errno));
        rc = CLI_FAIL;
    }
    if (!std_in)
        fclose(f);
    return rc;
}

/* Points standard output and standard error at fd (both, as 2>&1 does),
 * after flushing what the streams hold for the previous owner. */
static bool batch_redirect(int fd)
{
    fflush(stdout);
    fflush(stderr);
    clearerr(stdout);
    clearerr(stderr);
    return dup2(fd, STDOUT_FILENO) >= 0 && dup2(fd, STDERR_FILENO) >= 0;
}

/* Runs the cases in order; a failing case does not stop the batch. */
static int batch_run(const batch_t *b, const char *dir, FILE *status,
                     int out_fd, int err_fd)
{
    int rc = CLI_OK;
    for (int i = 0; i < b->n; i++) {
        const batch_case_t *c = &b->cases[i];
        size_t n = strlen(dir) + strlen(c->name) + 6;
        char *path = malloc(n);
        if (!path) {
            fprintf(stderr, "wna16: out of memory running case '%s'\n",
                    c->name);
            return CLI_FAIL;
        }
        snprintf(path, n, "%s/%s.txt", dir, c->name);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0) {
            fprintf(stderr, "wna16: %s: cannot create the output of case "
                    "'%s' (line %ld): %s\n", path, c->name, c->line,
                    strerror(errno));
            free(path);
            return CLI_FAIL;
        }
        int crc;
        if (!batch_redirect(fd)) {
            int e = errno;
            close(fd);
            batch_redirect(err_fd);
            dup2(out_fd, STDOUT_FILENO);
            fprintf(stderr, "wna16: %s: cannot redirect case '%s' to it: %s\n",
                    path, c->name, strerror(e));
            free(path);
            return CLI_FAIL;
        }
        close(fd);
        if (has_any(c->argc, c->argv, "--batch") ||
            has_any(c->argc, c->argv, "--batch-dir"))
            crc = cli_usage_error("gen", "--batch: a case of a batch (line %ld, "
                                  "'%s') cannot hold --batch or --batch-dir",
                                  c->line, c->name);
        else
            crc = gen_case(c->argc, c->argv);
        bool back = batch_redirect(err_fd) &&
                    dup2(out_fd, STDOUT_FILENO) >= 0;
        free(path);
        if (!back) {
            /* stderr may be the case's file still: say it on the status */
            fprintf(status, "wna16: cannot restore standard output and "
                    "error after case '%s': %s\n", c->name, strerror(errno));
            return CLI_FAIL;
        }
        fprintf(status, "%d %s\n", crc, c->name);
        if (fflush(status) != 0) {
            fprintf(stderr, "wna16: standard output: cannot write the status "
                    "of case '%s': %s\n", c->name, strerror(errno));
            return CLI_FAIL;
        }
        if (crc != CLI_OK)
            rc = CLI_FAIL;
    }
    return rc;
}

/* wna16 gen --batch LIST [--batch-dir DIR] */
static int gen_batch(int argc, char **argv)
{
    const char *list = NULL, *dir = ".";
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *opt = argv[i];
        if (cli_opt_value(argc, argv, &i, "--batch", &v))
            list = v;
        else if (cli_opt_value(argc, argv, &i, "--batch-dir", &v))
            dir = v;
        else
            return cli_usage_error("gen", "--batch: '%s' goes on the list's "
                                   "lines (each line holds one case's options)",
                                   opt);
        if (!v)
            return cli_usage_error("gen", "%s needs a value", opt);
    }
    if (!list)
        return cli_usage_error("gen", "--batch-dir needs --batch LIST");
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "wna16: --batch-dir %s: %s\n", dir,
                stat(dir, &st) != 0 ? strerror(errno) : "not a directory");
        return CLI_FAIL;
    }
    batch_t b = {0};
    int rc = batch_read(list, &b);
    if (rc != CLI_OK) {
        batch_free(&b);
        return rc;
    }
    /* the statuses go to the real standard output, through its own
     * stream: `stdout` belongs to the cases */
    fflush(stdout);
    fflush(stderr);
    int out_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    int err_fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    FILE *status = out_fd >= 0 ? fdopen(out_fd, "w") : NULL;
    if (!status || err_fd < 0) {
        fprintf(stderr, "wna16: --batch: cannot duplicate standard output "
                "and error: %s\n", strerror(errno));
        if (!status && out_fd >= 0)
            close(out_fd);
        rc = CLI_FAIL;
    } else {
        rc = batch_run(&b, dir, status, out_fd, err_fd);
    }
    if (status && fclose(status) != 0 && rc == CLI_OK) {
        fprintf(stderr, "wna16: standard output: cannot write the statuses: "
                "%s\n", strerror(errno));
        rc = CLI_FAIL;
    }
    if (err_fd >= 0)
        close(err_fd);
    batch_free(&b);
    return rc;
}

int cmd_gen(int argc, char **argv)
{
    if (has_any(argc, argv, "--batch") || has_any(argc, argv, "--batch-dir")) {
        for (int i = 1; i < argc; i++)
            if (cli_is_help(argv[i])) {
                usage(stdout);
                return CLI_OK;
            }
        return gen_batch(argc, argv);
    }
    return gen_case(argc, argv);
}
