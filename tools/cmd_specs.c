/*
 * cmd_specs.c - `wna16 specs list | validate | explain`: what specs exist,
 * whether spec files are valid (including the layout bijection check on
 * every sample), and a layout in words with a worked example.
 */
#include "cli.h"
#include "spec/spec.h"
#include "runtime/targets.h"

#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 specs list [--json]\n"
        "       wna16 specs validate [FILE...]\n"
        "       wna16 specs explain NAME [--bits B] [--group-size G] [--hidden H]\n"
        "                                [--intermediate I] [--experts E] [--zero-point]\n"
        "                                [--bias]\n\n"
        "list      every registered spec (built in, or from $WNA16_SPEC_DIR)\n"
        "validate  load and check spec files; without FILE, every registered\n"
        "          spec. The check proves each layout's forward and inverse\n"
        "          maps agree on all of the spec's sample problems.\n"
        "explain   a spec in words: capabilities, selection rules, padding and\n"
        "          each tensor's layout, with a worked example on one problem\n"
        "          (by default the spec's first sample).\n");
}

static const char *kind_name(wna16_spec_kind_t k)
{
    return k == WNA16_SPEC_FORMAT ? "format" : "backend";
}

static int specs_list(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else
            return cli_usage_error("specs list", "unknown option '%s'", argv[i]);
    }
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    if (json)
        printf("[");
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        if (json) {
            printf("%s{\"name\": \"%s\", \"kind\": \"%s\", \"origin\": \"%s\"}",
                   i ? ", " : "", s->name, kind_name(s->kind), s->origin);
            continue;
        }
        printf("%-8s %-20s %s\n", kind_name(s->kind), s->name, s->title);
    }
    if (json)
        printf("]\n");
    wna16_context_destroy(ctx);
    return CLI_OK;
}

static int specs_validate(int argc, char **argv)
{
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    int bad = 0, n = 0;
    wna16_error_t err;
    if (argc <= 1) {
        for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
            const wna16_spec_t *s = wna16_spec_at(ctx, i);
            n++;
            if (w16_spec_check_layouts(s, true, &err) != WNA16_OK) {
                fprintf(stderr, "FAIL %s\n", err.message);
                bad++;
            } else {
                printf("ok   %s (%d samples)\n", s->origin, s->n_samples);
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') {
            wna16_context_destroy(ctx);
            return cli_usage_error("specs validate", "unknown option '%s'",
                                   argv[i]);
        }
        n++;
        if (wna16_spec_validate_file(ctx, argv[i], &err) != WNA16_OK) {
            fprintf(stderr, "FAIL %s\n", err.message);
            bad++;
        } else {
            printf("ok   %s\n", argv[i]);
        }
    }
    printf("%d of %d specs valid\n", n - bad, n);
    wna16_context_destroy(ctx);
    return bad ? CLI_FAIL : CLI_OK;
}

/* ---- explain ------------------------------------------------------------- */

static void print_expr(const char *label, const w16_expr_t *x)
{
    if (!x)
        return;
    w16_buf_t b;
    w16_buf_init(&b, NULL);
    w16_expr_print(&b, x);
    printf("      %-8s %s\n", label, b.data ? b.data : "");
    w16_buf_free(&b);
}

static void print_rules(const char *title, const w16_rule_t *r, int n)
{
    for (int i = 0; i < n; i++) {
        printf("    %s: \"%s\"", title, r[i].reason);
        if (r[i].cond) {
            w16_buf_t b;
            w16_buf_init(&b, NULL);
            w16_expr_print(&b, r[i].cond);
            printf(" when %s", b.data ? b.data : "");
            w16_buf_free(&b);
        }
        for (int k = 0; k < r[i].n_formats; k++)
            printf("%s%s", k ? "," : " for format ", r[i].formats[k]);
        for (int k = 0; k < r[i].n_actorders; k++)
            printf("%s%s", k ? "," : " with actorder ", r[i].actorders[k]);
        if (r[i].n_act_not_in)
            printf(" unless the activation is one of the kernel's");
        printf("\n");
    }
}

static void print_caps(const wna16_spec_t *s)
{
    const w16_capabilities_t *c = &s->caps;
    printf("  capabilities:\n    bits:");
    for (int i = 0; i < c->n_bits; i++)
        printf(" %d", c->bits[i]);
    printf("\n    group sizes:");
    if (!c->n_group_sizes)
        printf(" any");
    for (int i = 0; i < c->n_group_sizes; i++)
        printf(" %d", c->group_sizes[i]);
    printf("\n    zero points: %s, bias: %s, act-order: %s\n",
           c->zero_points ? "yes" : "no", c->bias ? "yes" : "no",
           c->act_order ? "yes" : "no");
    if (c->n_platforms) {
        printf("    platforms:");
        for (int i = 0; i < c->n_platforms; i++)
            printf(" %s", c->platforms[i]);
        if (c->min_cc)
            printf(" (compute capability >= %d.%d)", c->min_cc / 10,
                   c->min_cc % 10);
        printf("\n");
    }
    if (c->n_activations) {
        printf("    activations:");
        for (int i = 0; i < c->n_activations; i++)
            printf(" %s", c->activations[i]);
        printf("\n");
    }
    if (s->kind == WNA16_SPEC_BACKEND)
        printf("    activation formats:%s%s\n",
               c->standard_format ? " standard" : "",
               c->batched_format ? " batched" : "");
    printf("    input dtypes:");
    for (int d = 0; d < WNA16_INPUT_COUNT_; d++)
        if (c->input_dtypes[d])
            printf(" %s", wna16_input_dtype_name((wna16_input_dtype_t)d));
    printf("\n");
    if (s->kind == WNA16_SPEC_BACKEND || s->stacked) {
        printf("    numeric contracts:");
        for (int i = 0; i < c->n_numerics; i++)
            printf(" %s", wna16_numerics_name(c->numerics[i]));
        printf("\n");
    }
    print_rules("layout rule", c->shape_rules, c->n_shape_rules);
}

static void print_selection(const wna16_spec_t *s)
{
    if (s->kind == WNA16_SPEC_FORMAT) {
        const w16_format_select_t *f = &s->fsel;
        printf("  selection (as vLLM's %s integration):\n", f->integration);
        print_rules("rejects the config", f->errors, f->n_errors);
        if (f->fallback_format)
            printf("    falls back to %s: %s\n", f->fallback_format,
                   f->fallback_reason);
        return;
    }
    const w16_backend_select_t *b = &s->bsel;
    printf("  selection (vLLM %s):\n    by name: %s\n    priority:",
           b->vllm_name, b->by_name ? b->by_name : "(cannot be requested)");
    for (int p = 0; p < WNA16_PLATFORM_COUNT_; p++)
        if (b->priority[p])
            printf(" %s #%d", wna16_platform_name((wna16_platform_t)p),
                   b->priority[p]);
    printf("\n");
    print_rules("refused", b->gate, b->n_gate);
    for (int i = 0; i < b->n_classes; i++) {
        printf("    kernel class %s\n", b->classes[i].name);
        print_rules("  refused", b->classes[i].rules, b->classes[i].n_rules);
    }
    /* each platform with the targets of this build that run its kernels
     * (xpu: Level Zero on an Intel GPU, else OpenCL on the CPU) */
    printf("    wna16 kernels on:");
    for (int p = 0; p < WNA16_PLATFORM_COUNT_; p++) {
        if (!b->kernel_platforms[p])
            continue;
        printf(" %s (", wna16_platform_name((wna16_platform_t)p));
        int n = 0;
        for (int i = 0; i < w16_target_count(); i++) {
            const w16_target_t *T = w16_target_at(i);
            if ((int)T->platform == p)
                printf("%s%s target: %s", n++ ? "; " : "", T->name,
                       T->compiler);
        }
        printf("%s)", n ? "" : "no target in this build");
    }
    printf("\n");
}

static void coord_text(char *out, size_t n, const w16_layout_t *l,
                       const int64_t *c, bool stacked)
{
    w16_var_t v[W16_MAX_COORDS];
    int k = w16_role_coords(l->role, v);
    size_t used = 0;
    out[0] = '\0';
    for (int i = stacked ? 0 : 1; i < k && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s%s=%lld",
                                 used ? " " : "", w16_var_name(v[i]),
                                 (long long)c[i]);
}

/* The first storage element(s) of a layout and the values they hold. */
static void print_example(const wna16_spec_t *s, const w16_layout_t *l,
                          int64_t *vars)
{
    wna16_dtype_t dt = l->dtypes[0];
    int slots = w16_layout_slots(l, dt, vars);
    int shown = 0;
    int64_t shape[W16_MAX_STORE_DIMS], idx[W16_MAX_STORE_DIMS] = {0};
    wna16_error_t err;
    if (w16_layout_shape(l, vars, shape, &err) != WNA16_OK)
        return;
    int64_t last = shape[l->ndim - 1];
    for (int64_t j = 0; j < last && shown < 3; j++, shown++) {
        idx[l->ndim - 1] = j;
        printf("      [");
        for (int d = 0; d < l->ndim; d++)
            printf("%s%lld", d ? ", " : "", (long long)idx[d]);
        printf("] holds");
        for (int sl = 0; sl < slots; sl++) {
            int64_t c[W16_MAX_COORDS];
            w16_eval_error_t e;
            char txt[96];
            if (!w16_layout_coord(l, vars, idx, sl, c, &e)) {
                printf(" (error: %s)", e.what);
                break;
            }
            int64_t ext[W16_MAX_COORDS];
            int nc = w16_role_extent(l->role, vars, ext);
            if (!s->stacked)
                ext[0] = 1;
            bool pad = false;
            for (int i = 0; i < nc; i++)
                pad = pad || c[i] < 0 || c[i] >= ext[i];
            coord_text(txt, sizeof txt, l, c, s->stacked);
            printf(" %s(%s)", slots > 1 ? (sl ? "" : "") : "",
                   pad ? "padding" : txt);
        }
        printf("\n");
    }
}

static void print_layout(const wna16_spec_t *s, const w16_layout_t *l,
                         int64_t *vars, const char *gemm)
{
    if (!w16_layout_present(l, vars))
        return;
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_error_t err;
    if (w16_layout_shape(l, vars, shape, &err) != WNA16_OK) {
        printf("    %s: %s\n", l->name, err.message);
        return;
    }
    wna16_dtype_t dt = l->dtypes[0];
    printf("    %s%s%s: %s [", s->stacked ? gemm : "", s->stacked ? "_" : "",
           l->name, wna16_dtype_name(dt));
    for (int d = 0; d < l->ndim; d++)
        printf("%s%lld", d ? ", " : "", (long long)shape[d]);
    printf("]  %s", w16_role_doc(l->role));
    int slots = w16_layout_slots(l, dt, vars);
    if (slots > 1)
        printf(", %d per element", slots);
    if (l->model_dtype) /* spec key "model_dtype" */
        printf("; held in the model's dtype (F16 or BF16, vLLM's "
               "params_dtype)");
    printf("\n");
    for (int d = 0; d < l->ndim; d++) {
        char label[16];
        snprintf(label, sizeof label, "index%d", d);
        print_expr(label, l->index[d]);
    }
    print_expr("bit", l->bit);
    w16_var_t v[W16_MAX_COORDS];
    int nc = w16_role_coords(l->role, v);
    for (int i = 0; i < nc; i++)
        if (l->coord[i]) {
            char label[16];
            snprintf(label, sizeof label, "%s <-", w16_var_name(v[i]));
            print_expr(label, l->coord[i]);
        }
    print_expr("encode", l->encode);
    print_expr("decode", l->decode);
    print_example(s, l, vars);
}

static int specs_explain(int argc, char **argv)
{
    const char *name = NULL;
    long bits = 0, gs = 0, hidden = 0, inter = 0, experts = 0;
    bool zp = false, bias = false, gs_set = false;
    for (int i = 1; i < argc; i++) {
        const char *v, *opt = argv[i];
        long *dst = NULL;
        long lo = 1, hi = 1 << 20;
        if (cli_opt_value(argc, argv, &i, "--bits", &v)) {
            dst = &bits; lo = 4; hi = 8;
        } else if (cli_opt_value(argc, argv, &i, "--group-size", &v)) {
            dst = &gs; lo = -1; gs_set = true;
        } else if (cli_opt_value(argc, argv, &i, "--hidden", &v)) {
            dst = &hidden;
        } else if (cli_opt_value(argc, argv, &i, "--intermediate", &v)) {
            dst = &inter;
        } else if (cli_opt_value(argc, argv, &i, "--experts", &v)) {
            dst = &experts; hi = 16;
        } else if (strcmp(argv[i], "--zero-point") == 0) {
            zp = true;
            continue;
        } else if (strcmp(argv[i], "--bias") == 0) {
            bias = true;
            continue;
        } else if (argv[i][0] == '-') {
            return cli_usage_error("specs explain", "unknown option '%s'",
                                   argv[i]);
        } else if (!name) {
            name = argv[i];
            continue;
        } else {
            return cli_usage_error("specs explain", "one spec name, please");
        }
        if (!v || !cli_parse_int(v, lo, hi, dst) ||
            (dst == &bits && bits != 4 && bits != 8) || (dst == &gs && gs == 0))
            return cli_usage_error("specs explain", "%s needs %s", opt,
                                   dst == &bits ? "4 or 8"
                                   : dst == &gs ? "-1 or a group size"
                                                : "a positive integer");
    }
    if (!name)
        return cli_usage_error("specs explain", "which spec? (see 'wna16 specs "
                               "list')");
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    const wna16_spec_t *s = wna16_spec_find(ctx, 0, name);
    if (!s) {
        fprintf(stderr, "wna16: no spec named '%s' (see 'wna16 specs list')\n",
                name);
        wna16_context_destroy(ctx);
        return CLI_FAIL;
    }
    printf("%s %s: %s\n  origin: %s\n\n  %s\n\n", kind_name(s->kind), s->name,
           s->title, s->origin, s->description);
    print_caps(s);
    if (s->zero_convention)
        printf("  zero points: %s\n", s->zero_convention);
    if (s->pad_intermediate) {
        w16_buf_t b;
        w16_buf_init(&b, NULL);
        w16_expr_print(&b, s->pad_intermediate);
        printf("  padding: the intermediate size I becomes %s%s%s\n",
               b.data ? b.data : "", s->pad_forbidden_with_act_order ? "; " : "",
               s->pad_forbidden_with_act_order ? s->pad_forbidden_with_act_order
                                               : "");
        w16_buf_free(&b);
    }
    print_selection(s);

    const struct w16_sample *sm = &s->samples[0];
    w16_problem_t p = {experts ? experts : sm->E, hidden ? hidden : sm->H,
                       inter ? inter : sm->I, bits ? bits : sm->BITS,
                       gs_set ? gs : sm->GS, zp || sm->ZP, false,
                       bias || sm->HAS_BIAS};
    printf("\n  layouts for E=%lld H=%lld I=%lld, %lld-bit, group size %lld%s%s "
           "(per expert and projection: %s):\n", (long long)p.E, (long long)p.H,
           (long long)p.I, (long long)p.BITS, (long long)p.GS,
           p.zp ? ", zero points" : "", p.bias ? ", bias" : "",
           s->stacked ? "no, stacked w13/w2" : "yes");
    int rc = CLI_OK;
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        wna16_error_t err;
        const char *gemm = g ? "w2" : "w13";
        if (w16_spec_bind(s, &p, (wna16_gemm_t)g, vars, &err) != WNA16_OK) {
            fprintf(stderr, "wna16: %s\n", err.message);
            rc = CLI_FAIL;
            break;
        }
        printf("  %s%s: K=%lld N=%lld G=%lld%s\n", gemm,
               s->stacked ? "" : (g ? " (down_proj)" : " (gate_proj, up_proj)"),
               (long long)vars[W16_VAR_K], (long long)vars[W16_VAR_N],
               (long long)vars[W16_VAR_G],
               vars[W16_VAR_IP] != p.I ? " (padded)" : "");
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            if (s->layouts[r])
                print_layout(s, s->layouts[r], vars, gemm);
    }
    wna16_context_destroy(ctx);
    return rc;
}

int cmd_specs(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
    if (strcmp(argv[1], "list") == 0)
        return specs_list(argc - 1, argv + 1);
    if (strcmp(argv[1], "validate") == 0)
        return specs_validate(argc - 1, argv + 1);
    if (strcmp(argv[1], "explain") == 0)
        return specs_explain(argc - 1, argv + 1);
    return cli_usage_error("specs", "unknown subcommand '%s' (list, validate, "
                           "explain)", argv[1]);
}
