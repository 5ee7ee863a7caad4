/*
 * select.c - backend selection as vLLM's select_wna16_moe_backend does it,
 * driven entirely by the "selection" sections of the specs: this file holds
 * no backend or format names. A query is validated and turned into the
 * selection variables (PLATFORM, CC, BITS, GS, ...); the format spec then
 * rejects configurations its vLLM integration refuses, derives what the
 * integration tells the oracle (MAY_ZP, MAY_BIAS, TILE_PADDING and the
 * weight key) and may fall back to another format. Each candidate backend
 * (an explicit by_name request, or every backend listed for the platform in
 * priority order) must then pass its gate rules, have one kernel class whose
 * rules all pass, and be one wna16 can generate kernels for on this
 * platform and in this build. Reasons are spec templates with {placeholders}
 * expanded into bounded buffers.
 */
#include "spec/spec.h"
#include "runtime/targets.h"
#include "base/base.h"

#include <stdio.h>
#include <string.h>

/* Everything one selection needs; lives on the caller's stack. */
typedef struct sel {
    wna16_context_t *ctx;
    const wna16_select_query_t *q;
    const char *activation;     /* query's, or "silu" */
    const wna16_spec_t *format; /* effective format (after a fallback) */
    uint32_t kmask;             /* platforms this build has targets for */
    int64_t vars[W16_VAR_COUNT];
    wna16_error_t *err;
} sel_t;

/* ---- bounded text ---------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t cap, len; /* cap > 0; p[len] == '\0' always */
} sbuf_t;

static void sb_init(sbuf_t *b, char *p, size_t cap)
{
    b->p = p;
    b->cap = cap;
    b->len = 0;
    p[0] = '\0';
}

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    size_t room = b->cap - 1 - b->len;
    if (n > room)
        n = room;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf_t *b, const char *fmt, ...) W16_PRINTF(2, 3);
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static bool in_list(const char *const *list, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], s) == 0)
            return true;
    return false;
}

/* ---- reason templates ------------------------------------------------------ */

/* vLLM's weight-key name: kInt4Static, kInt4Static32Asym, kInt8Static... */
static void put_scheme(const sel_t *s, sbuf_t *b)
{
    sb_printf(b, "kInt%lldStatic%s%s", (long long)s->vars[W16_VAR_WK_BITS],
              s->vars[W16_VAR_WK_G32] ? "32" : "",
              s->vars[W16_VAR_WK_ASYM] ? "Asym" : "");
}

static void put_device(const sel_t *s, sbuf_t *b)
{
    wna16_platform_t p = s->q->platform;
    sb_puts(b, wna16_platform_name(p));
    if (p == WNA16_PLATFORM_CUDA || p == WNA16_PLATFORM_ROCM)
        sb_printf(b, " with compute capability %d.%d", (int)s->q->cc_major,
                  (int)s->q->cc_minor);
}

/* Expands placeholder `name` (len bytes); false if it is not one. */
static bool put_placeholder(const sel_t *s, const char *name, size_t len,
                            sbuf_t *b)
{
#define IS(k) (len == sizeof(k) - 1 && memcmp(name, k, len) == 0)
    const wna16_select_query_t *q = s->q;
    if (IS("platform"))
        sb_puts(b, wna16_platform_name(q->platform));
    else if (IS("device"))
        put_device(s, b);
    else if (IS("activation"))
        sb_puts(b, s->activation);
    else if (IS("act_format"))
        sb_puts(b, q->activation_format == WNA16_ACT_FORMAT_BATCHED
                       ? "batched" : "standard");
    else if (IS("scheme"))
        put_scheme(s, b);
    else if (IS("format"))
        sb_puts(b, wna16_spec_name(s->format));
    else if (IS("bits"))
        sb_printf(b, "%d", (int)q->quant.bits);
    else if (IS("group_size"))
        sb_printf(b, "%d", (int)q->quant.group_size);
    else if (IS("hidden"))
        sb_printf(b, "%d", (int)q->hidden_size);
    else if (IS("input_dtype"))
        sb_puts(b, wna16_input_dtype_name(q->quant.input_dtype));
    else
        return false;
    return true;
#undef IS
}

/* Writes `tmpl` with placeholders expanded into out[size]; unknown or
 * unterminated placeholders are copied literally. */
static void format_reason(const sel_t *s, const char *tmpl, char *out,
                          size_t size)
{
    sbuf_t b;
    sb_init(&b, out, size);
    for (const char *p = tmpl; *p;) {
        const char *close = *p == '{' ? strchr(p + 1, '}') : NULL;
        if (close && put_placeholder(s, p + 1, (size_t)(close - p - 1), &b)) {
            p = close + 1;
            continue;
        }
        const char *next = strchr(p + 1, '{');
        size_t n = next ? (size_t)(next - p) : strlen(p);
        sb_put(&b, p, n);
        p += n;
    }
}

/* ---- rules ------------------------------------------------------------------- */

static wna16_status_t eval_expr(const sel_t *s, const wna16_spec_t *spec,
                                const w16_expr_t *x, const char *path,
                                int64_t *out)
{
    w16_eval_error_t e = {0};
    if (w16_expr_eval(x, s->vars, out, &e))
        return WNA16_OK;
    return w16_err(s->err, WNA16_ESPEC, "%s: %s: cannot evaluate: %s",
                   wna16_spec_origin(spec), path,
                   e.what ? e.what : "evaluation error");
}

/* Does `r` fire (all of its parts hold) for this query? */
static wna16_status_t rule_fires(const sel_t *s, const wna16_spec_t *spec,
                                 const w16_rule_t *r, bool *fires)
{
    *fires = false;
    if (r->cond) {
        char path[160];
        int64_t v;
        snprintf(path, sizeof path, "%s.if", r->json_path);
        wna16_status_t st = eval_expr(s, spec, r->cond, path, &v);
        if (st != WNA16_OK || v == 0)
            return st;
    }
    if (r->n_formats > 0 &&
        !in_list(r->formats, r->n_formats, wna16_spec_name(s->format)))
        return WNA16_OK;
    if (r->n_actorders > 0 &&
        (!s->q->actorder || !in_list(r->actorders, r->n_actorders,
                                     s->q->actorder)))
        return WNA16_OK;
    if (r->n_act_not_in > 0 &&
        in_list(r->act_not_in, r->n_act_not_in, s->activation))
        return WNA16_OK;
    *fires = true;
    return WNA16_OK;
}

/* The first rule of rules[n] that fires, or NULL in *hit. */
static wna16_status_t first_firing(const sel_t *s, const wna16_spec_t *spec,
                                   const w16_rule_t *rules, int n,
                                   const w16_rule_t **hit)
{
    *hit = NULL;
    for (int i = 0; i < n; i++) {
        bool fires;
        wna16_status_t st = rule_fires(s, spec, &rules[i], &fires);
        if (st != WNA16_OK)
            return st;
        if (fires) {
            *hit = &rules[i];
            return WNA16_OK;
        }
    }
    return WNA16_OK;
}

/* ---- query -------------------------------------------------------------------- */

/* Comma-separated names of the registered format specs. */
static void list_formats(const wna16_context_t *ctx, char *out, size_t size)
{
    sbuf_t b;
    sb_init(&b, out, size);
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *sp = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(sp) != WNA16_SPEC_FORMAT)
            continue;
        sb_puts(&b, b.len ? ", " : "");
        sb_puts(&b, wna16_spec_name(sp));
    }
}

static wna16_status_t check_sizes(const wna16_select_query_t *q,
                                  wna16_error_t *err)
{
    const struct { const char *name; int32_t v; } sz[] = {
        {"hidden_size", q->hidden_size},
        {"intermediate_size", q->intermediate_size},
        {"num_experts", q->num_experts},
        {"top_k", q->top_k},
    };
    for (size_t i = 0; i < W16_ARRAY_LEN(sz); i++)
        if (sz[i].v <= 0)
            return w16_err(err, WNA16_EINVAL, "wna16_select: %s must be "
                           "positive (got %d)", sz[i].name, (int)sz[i].v);
    if (q->top_k > q->num_experts)
        return w16_err(err, WNA16_EINVAL, "wna16_select: top_k (%d) exceeds "
                       "num_experts (%d)", (int)q->top_k, (int)q->num_experts);
    if (q->intermediate_size_full &&
        q->intermediate_size_full < q->intermediate_size)
        return w16_err(err, WNA16_EINVAL, "wna16_select: "
                       "intermediate_size_full (%d) is smaller than "
                       "intermediate_size (%d)", (int)q->intermediate_size_full,
                       (int)q->intermediate_size);
    return WNA16_OK;
}

static wna16_status_t check_quant(const wna16_select_query_t *q,
                                  wna16_error_t *err)
{
    if (q->quant.bits != 4 && q->quant.bits != 8)
        return w16_err(err, WNA16_EINVAL, "wna16_select: bits must be 4 or 8 "
                       "(got %d)", (int)q->quant.bits);
    if (q->quant.group_size != -1 && q->quant.group_size <= 0)
        return w16_err(err, WNA16_EINVAL, "wna16_select: group_size must be "
                       "-1 or positive (got %d)", (int)q->quant.group_size);
    if ((unsigned)q->quant.input_dtype >= WNA16_INPUT_COUNT_)
        return w16_err(err, WNA16_EINVAL, "wna16_select: input_dtype %d is "
                       "out of range", (int)q->quant.input_dtype);
    return WNA16_OK;
}

static wna16_status_t check_device(const wna16_select_query_t *q,
                                   wna16_error_t *err)
{
    if ((unsigned)q->platform >= WNA16_PLATFORM_COUNT_)
        return w16_err(err, WNA16_EINVAL, "wna16_select: platform %d is out "
                       "of range", (int)q->platform);
    if (q->cc_major < 0 || q->cc_minor < 0 || q->cc_minor > 9)
        return w16_err(err, WNA16_EINVAL, "wna16_select: compute capability "
                       "%d.%d is invalid", (int)q->cc_major, (int)q->cc_minor);
    if (q->activation_format != WNA16_ACT_FORMAT_STANDARD &&
        q->activation_format != WNA16_ACT_FORMAT_BATCHED)
        return w16_err(err, WNA16_EINVAL, "wna16_select: activation_format %d "
                       "is out of range", (int)q->activation_format);
    if (q->activation && !w16_activation_known(q->activation))
        return w16_err(err, WNA16_EINVAL, "wna16_select: unknown activation "
                       "'%s'", q->activation);
    return WNA16_OK;
}

static wna16_status_t resolve_format(sel_t *s)
{
    const char *name = s->q->format;
    if (name)
        s->format = wna16_spec_find(s->ctx, WNA16_SPEC_FORMAT, name);
    if (s->format)
        return WNA16_OK;
    char known[512];
    list_formats(s->ctx, known, sizeof known);
    if (!name)
        return w16_err(s->err, WNA16_EINVAL, "wna16_select: format is "
                       "required; known formats: %s", known);
    return w16_err(s->err, WNA16_EINVAL, "wna16_select: unknown format '%s'; "
                   "known formats: %s", name, known);
}

static void set_vars(sel_t *s)
{
    const wna16_select_query_t *q = s->q;
    int64_t *v = s->vars;
    memset(s->vars, 0, sizeof s->vars);
    v[W16_VAR_PLATFORM] = q->platform;
    v[W16_VAR_CC] = 10 * (int64_t)q->cc_major + q->cc_minor;
    v[W16_VAR_BITS] = q->quant.bits;
    v[W16_VAR_GS] = q->quant.group_size;
    v[W16_VAR_ZP] = q->quant.zero_point;
    v[W16_VAR_ACT_ORDER] = q->quant.act_order;
    v[W16_VAR_HAS_BIAS] = q->quant.bias;
    v[W16_VAR_A8] = q->quant.input_dtype;
    v[W16_VAR_H] = q->hidden_size;
    v[W16_VAR_I] = q->intermediate_size;
    v[W16_VAR_E] = q->num_experts;
    v[W16_VAR_TOPK] = q->top_k;
    v[W16_VAR_BATCHED] = q->activation_format == WNA16_ACT_FORMAT_BATCHED;
    v[W16_VAR_CUDA] = WNA16_PLATFORM_CUDA;
    v[W16_VAR_ROCM] = WNA16_PLATFORM_ROCM;
    v[W16_VAR_CPU] = WNA16_PLATFORM_CPU;
    v[W16_VAR_XPU] = WNA16_PLATFORM_XPU;
}

static wna16_status_t sel_init(sel_t *s, wna16_context_t *ctx,
                               const wna16_select_query_t *q,
                               wna16_error_t *err)
{
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->q = q;
    s->err = err;
    wna16_status_t st = check_device(q, err);
    if (st == WNA16_OK)
        st = check_quant(q, err);
    if (st == WNA16_OK)
        st = check_sizes(q, err);
    if (st == WNA16_OK)
        st = resolve_format(s);
    if (st != WNA16_OK)
        return st;
    s->activation = q->activation ? q->activation : "silu";
    s->kmask = q->kernel_platforms ? q->kernel_platforms
                                   : wna16_build_kernel_platforms();
    set_vars(s);
    return WNA16_OK;
}

/* ---- format stage ------------------------------------------------------------ */

static wna16_status_t format_errors(const sel_t *s, const wna16_spec_t *f)
{
    const w16_rule_t *hit;
    wna16_status_t st = first_firing(s, f, f->fsel.errors, f->fsel.n_errors,
                                     &hit);
    if (st == WNA16_OK && !hit &&
        !f->caps.input_dtypes[s->q->quant.input_dtype])
        /* wna16's own stage: vLLM reads VLLM_MARLIN_INPUT_DTYPE only where
         * the format spec says its integration does, and silently keeps
         * 16-bit activations elsewhere; a query that asks for 8-bit
         * activations is told so instead */
        return w16_err(s->err, WNA16_EUNSUPPORTED, "%s: %s activations are "
                       "not supported (the integration keeps 16-bit "
                       "activations)", f->fsel.integration,
                       wna16_input_dtype_name(s->q->quant.input_dtype));
    if (st != WNA16_OK || !hit)
        return st;
    char reason[WNA16_SELECT_REASON_MAX];
    format_reason(s, hit->reason, reason, sizeof reason);
    return w16_err(s->err, WNA16_EUNSUPPORTED, "%s: %s", f->fsel.integration,
                   reason);
}

/* MAY_ZP, MAY_BIAS, TILE_PADDING and the weight key of format f. */
static wna16_status_t format_derive(sel_t *s, const wna16_spec_t *f)
{
    const w16_format_select_t *fs = &f->fsel;
    const struct {
        const w16_expr_t *x; w16_var_t var; const char *path; bool boolean;
    } d[] = {
        {fs->may_have_zp, W16_VAR_MAY_ZP, "$.selection.may_have_zp", true},
        {fs->may_have_bias, W16_VAR_MAY_BIAS, "$.selection.may_have_bias",
         true},
        {fs->allow_tile_padding, W16_VAR_TILE_PADDING,
         "$.selection.allow_tile_padding", true},
        {fs->wk_bits, W16_VAR_WK_BITS, "$.selection.weight_key.bits", false},
        {fs->wk_group32, W16_VAR_WK_G32, "$.selection.weight_key.group32",
         true},
        {fs->wk_asym, W16_VAR_WK_ASYM, "$.selection.weight_key.asym", true},
    };
    for (size_t i = 0; i < W16_ARRAY_LEN(d); i++)
        s->vars[d[i].var] = 0;
    for (size_t i = 0; i < W16_ARRAY_LEN(d); i++) {
        int64_t v = 0;
        if (d[i].x) {
            wna16_status_t st = eval_expr(s, f, d[i].x, d[i].path, &v);
            if (st != WNA16_OK)
                return st;
        }
        s->vars[d[i].var] = d[i].boolean ? v != 0 : v;
    }
    /* A checkpoint that carries bias may have bias. */
    s->vars[W16_VAR_MAY_BIAS] |= s->vars[W16_VAR_HAS_BIAS] != 0;
    return WNA16_OK;
}

static wna16_status_t format_prepare(sel_t *s, const wna16_spec_t *f)
{
    wna16_status_t st = format_errors(s, f);
    return st != WNA16_OK ? st : format_derive(s, f);
}

/* Switches to the format's fallback when its condition holds. */
static wna16_status_t format_fallback(sel_t *s, wna16_select_result_t *res)
{
    const wna16_spec_t *f = s->format;
    const w16_format_select_t *fs = &f->fsel;
    int64_t v = 0;
    if (!fs->fallback_format || !fs->fallback_if)
        return WNA16_OK;
    wna16_status_t st = eval_expr(s, f, fs->fallback_if,
                                  "$.selection.fallback.if", &v);
    if (st != WNA16_OK || !v)
        return st;
    const wna16_spec_t *to =
        wna16_spec_find(s->ctx, WNA16_SPEC_FORMAT, fs->fallback_format);
    if (!to)
        return w16_err(s->err, WNA16_ESPEC, "%s: $.selection.fallback.format: "
                       "fallback format '%s' is not registered",
                       wna16_spec_origin(f), fs->fallback_format);
    char reason[WNA16_SELECT_REASON_MAX];
    format_reason(s, fs->fallback_reason ? fs->fallback_reason : "", reason,
                  sizeof reason);
    snprintf(res->note, sizeof res->note, "format '%s' falls back to '%s': %s",
             wna16_spec_name(f), wna16_spec_name(to), reason);
    wna16_log(s->ctx, WNA16_LOG_INFO, "%s", res->note);
    s->format = to;
    res->format = to;
    return format_prepare(s, to);
}

static wna16_status_t format_stage(sel_t *s, wna16_select_result_t *res)
{
    res->format = s->format;
    wna16_status_t st = format_prepare(s, s->format);
    return st != WNA16_OK ? st : format_fallback(s, res);
}

/* ---- backends ------------------------------------------------------------------- */

/* The reason template of the last class tried when no kernel class passes,
 * or NULL in *tmpl when one does. */
static wna16_status_t kernel_classes(const sel_t *s, const wna16_spec_t *b,
                                     const char **tmpl)
{
    const w16_backend_select_t *bs = &b->bsel;
    *tmpl = bs->n_classes > 0 ? NULL : "the backend spec lists no kernel class";
    for (int i = 0; i < bs->n_classes; i++) {
        const w16_rule_t *hit;
        wna16_status_t st = first_firing(s, b, bs->classes[i].rules,
                                         bs->classes[i].n_rules, &hit);
        if (st != WNA16_OK)
            return st;
        if (!hit) {
            *tmpl = NULL;
            return WNA16_OK;
        }
        *tmpl = hit->reason;
    }
    return WNA16_OK;
}

/* Can backend b serve the query? If not, reason[] says why. */
static wna16_status_t backend_check(const sel_t *s, const wna16_spec_t *b,
                                    bool *serves, char *reason, size_t size)
{
    const w16_backend_select_t *bs = &b->bsel;
    wna16_platform_t p = s->q->platform;
    const w16_rule_t *hit;
    const char *tmpl = NULL;
    *serves = false;
    reason[0] = '\0';
    wna16_status_t st = first_firing(s, b, bs->gate, bs->n_gate, &hit);
    if (st != WNA16_OK)
        return st;
    if (hit)
        tmpl = hit->reason;
    else if (!b->caps.input_dtypes[s->q->quant.input_dtype])
        /* wna16's addition, as for formats: 8-bit activations are asked
         * for, and only backends whose layouts hold them can give them */
        tmpl = "the backend has no kernels for {input_dtype} activations";
    else if ((st = kernel_classes(s, b, &tmpl)) != WNA16_OK)
        return st;
    if (!tmpl && !bs->kernel_platforms[p])
        tmpl = "wna16 generates no {platform} kernels for this backend";
    else if (!tmpl && !(s->kmask & (1u << p)))
        tmpl = "this wna16 build has no {platform} kernel target";
    if (tmpl)
        format_reason(s, tmpl, reason, size);
    else
        *serves = true;
    return WNA16_OK;
}

static void pass_over(const sel_t *s, wna16_select_result_t *res,
                      const wna16_spec_t *b, const char *reason)
{
    wna16_log(s->ctx, WNA16_LOG_DEBUG, "WNA16 MoE backend '%s' passed over: "
              "%s", b->bsel.vllm_name, reason);
    if (res->n_passed_over >= WNA16_SELECT_MAX_REASONS)
        return;
    res->passed_over[res->n_passed_over].backend = b;
    snprintf(res->passed_over[res->n_passed_over].reason,
             sizeof res->passed_over[0].reason, "%s", reason);
    res->n_passed_over++;
}

static void choose(const sel_t *s, wna16_select_result_t *res,
                   const wna16_spec_t *b)
{
    res->backend = b;
    wna16_log(s->ctx, WNA16_LOG_INFO, "Using '%s' WNA16 MoE backend.",
              b->bsel.vllm_name);
}

/* The backend spec accepted under `name` for an explicit request. */
static const wna16_spec_t *find_by_name(const wna16_context_t *ctx,
                                        const char *name)
{
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *b = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(b) == WNA16_SPEC_BACKEND && b->bsel.by_name &&
            strcmp(b->bsel.by_name, name) == 0)
            return b;
    }
    return NULL;
}

/* "'triton', 'marlin', ..." : every by_name of the registered backends. */
static void list_by_names(const wna16_context_t *ctx, char *out, size_t size)
{
    sbuf_t b;
    sb_init(&b, out, size);
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *sp = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(sp) != WNA16_SPEC_BACKEND || !sp->bsel.by_name)
            continue;
        sb_puts(&b, b.len ? ", '" : "'");
        sb_puts(&b, sp->bsel.by_name);
        sb_puts(&b, "'");
    }
}

static wna16_status_t select_explicit(const sel_t *s,
                                      wna16_select_result_t *res)
{
    const char *name = s->q->backend;
    const wna16_spec_t *b = find_by_name(s->ctx, name);
    if (!b) {
        char names[512];
        list_by_names(s->ctx, names, sizeof names);
        return w16_err(s->err, WNA16_EINVAL, "moe_backend='%s' is not "
                       "supported for WNA16 MoE. Expected one of [%s].", name,
                       names);
    }
    bool serves;
    char reason[WNA16_SELECT_REASON_MAX];
    wna16_status_t st = backend_check(s, b, &serves, reason, sizeof reason);
    if (st != WNA16_OK)
        return st;
    if (serves) {
        choose(s, res, b);
        return WNA16_OK;
    }
    pass_over(s, res, b, reason);
    return w16_err(s->err, WNA16_EUNSUPPORTED, "WNA16 MoE backend '%s' does "
                   "not support the deployment configuration since %s.",
                   b->bsel.vllm_name, reason);
}

/* The backend after (*prio, *idx) in (priority, registry index) order
 * among those listed for platform p; NULL when none is left. */
static const wna16_spec_t *next_candidate(const wna16_context_t *ctx,
                                          wna16_platform_t p, int *prio,
                                          size_t *idx)
{
    const wna16_spec_t *best = NULL;
    int best_prio = 0;
    size_t best_idx = 0;
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *b = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(b) != WNA16_SPEC_BACKEND)
            continue;
        int pr = b->bsel.priority[p];
        if (pr <= 0 || pr < *prio || (pr == *prio && i <= *idx))
            continue;
        if (!best || pr < best_prio || (pr == best_prio && i < best_idx)) {
            best = b;
            best_prio = pr;
            best_idx = i;
        }
    }
    *prio = best_prio;
    *idx = best_idx;
    return best;
}

static wna16_status_t select_auto(const sel_t *s, wna16_select_result_t *res)
{
    int prio = 0;
    size_t idx = 0;
    const wna16_spec_t *b;
    while ((b = next_candidate(s->ctx, s->q->platform, &prio, &idx))) {
        bool serves;
        char reason[WNA16_SELECT_REASON_MAX];
        wna16_status_t st = backend_check(s, b, &serves, reason,
                                          sizeof reason);
        if (st != WNA16_OK)
            return st;
        if (serves) {
            choose(s, res, b);
            return WNA16_OK;
        }
        pass_over(s, res, b, reason);
    }
    return w16_err(s->err, WNA16_EUNSUPPORTED, "No WNA16 MoE backend supports "
                   "the deployment configuration.");
}

/* ---- public ---------------------------------------------------------------------- */

wna16_status_t wna16_select(wna16_context_t *ctx,
                            const wna16_select_query_t *query,
                            wna16_select_result_t *res, wna16_error_t *err)
{
    if (!res)
        return w16_err(err, WNA16_EINVAL, "wna16_select: res is required");
    memset(res, 0, sizeof *res);
    if (!ctx || !query)
        return w16_err(err, WNA16_EINVAL, "wna16_select: ctx and query are "
                       "required");
    sel_t s;
    wna16_status_t st = sel_init(&s, ctx, query, err);
    if (st == WNA16_OK)
        st = format_stage(&s, res);
    if (st != WNA16_OK)
        return st;
    /* vLLM's marlin_is_k_full: act-order over a tensor-parallel shard of
     * w2's K (the layer's I is one rank's part of I_full) */
    res->is_k_full = !query->quant.act_order ||
                     !query->intermediate_size_full ||
                     query->intermediate_size_full == query->intermediate_size;
    const char *name = query->backend;
    if (name && strcmp(name, "auto") != 0)
        return select_explicit(&s, res);
    return select_auto(&s, res);
}

/* The platforms of the targets this build has (runtime/targets.c). */
uint32_t wna16_build_kernel_platforms(void)
{
    uint32_t mask = 0;
    for (int i = 0; i < w16_target_count(); i++)
        mask |= 1u << w16_target_at(i)->platform;
    return mask;
}
