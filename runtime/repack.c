/*
 * repack.c - a whole checkpoint into one backend's layout (`wna16 repack`).
 * Layers are found by the names the format spec gives (its "projections"
 * and layout tensor names, never names wna16 knows by itself); each layer's
 * per-expert tensors are gathered into a tensor set of views and handed to
 * wna16_repack_layer, which stacks them into w13/w2 in the backend's
 * layout. A real checkpoint is far larger than memory, so the output is
 * streamed: every output tensor is first declared from the backend spec
 * alone (wna16_repack_layer_shapes binds the spec to the problem exactly as
 * the encoder does), then each layer is repacked, checked against its
 * declarations, written and freed before the next one, and the mapped
 * source pages it read are handed back to the kernel. The first layer is
 * repacked before the output file is created, so a backend that cannot hold
 * what the tensors contain is refused with the encoder's reason and nothing
 * is written; any later failure aborts the writer, whose temporary file
 * never survives.
 *
 * The output is one .safetensors file, or a checkpoint directory (a path
 * ending in '/' or naming a directory): the same tensors in the same order
 * cut into shards of at most max_shard_size bytes of tensor data
 * (model-00001-of-0000N.safetensors, each with the same metadata), the
 * index model.safetensors.index.json and the checkpoint's config.json. The
 * shards' sizes are known from the declarations, so the names are fixed
 * before anything is written. Every file is written through
 * runtime/output.c to a temporary beside it and renamed only when all of
 * them are complete (shards, config, then the index, which makes the
 * directory a checkpoint): a failure before that leaves none of them, and a
 * directory this run created is removed again.
 */
#define _DEFAULT_SOURCE /* madvise */
#include "base/base.h"
#include "base/json_text.h"
#include "spec/spec.h"
#include "runtime/output.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- names --------------------------------------------------------------- */

/* "{prefix}.{rest}", or just rest for the empty prefix (a lone layer file);
 * false when it does not fit. */
static bool join_name(char *out, size_t n, const char *prefix,
                      const char *rest)
{
    int k = prefix && *prefix ? snprintf(out, n, "%s.%s", prefix, rest)
                              : snprintf(out, n, "%s", rest);
    return k >= 0 && (size_t)k < n;
}

static const char *gemm_leaf(wna16_gemm_t g)
{
    return g == WNA16_GEMM_W13 ? "w13" : "w2";
}

/* Does `name` end in ".{tail}" (or equal tail)? *plen: the prefix length. */
static bool match_tail(const char *name, const char *tail, size_t *plen)
{
    size_t ln = strlen(name), lt = strlen(tail);
    if (ln == lt && strcmp(name, tail) == 0) {
        *plen = 0;
        return true;
    }
    if (ln > lt + 1 && name[ln - lt - 1] == '.' &&
        strcmp(name + ln - lt, tail) == 0) {
        *plen = ln - lt - 1;
        return true;
    }
    return false;
}

/* The name tails that mark a layer: expert 0's gate codes, one per spelling
 * of the gate projection, or the stacked w13 codes. Returns the count. */
static int layer_tails(const wna16_spec_t *fmt, char tails[][192], int max)
{
    const w16_layout_t *qw = fmt->layouts[W16_ROLE_QWEIGHT];
    if (!qw)
        return 0;
    if (fmt->stacked) {
        snprintf(tails[0], 192, "w13_%s", qw->name);
        return 1;
    }
    int n = 0;
    for (int a = 0; a < fmt->proj_gate.n_names && n < max; a++)
        snprintf(tails[n++], 192, "0.%s.%s", fmt->proj_gate.names[a],
                 qw->name);
    return n;
}

/* Is s (of length n) one of the format's tensor leaf names? */
static bool is_leaf_name(const wna16_spec_t *fmt, const char *s, size_t n)
{
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = fmt->layouts[r];
        if (l && strlen(l->name) == n && strncmp(l->name, s, n) == 0)
            return true;
    }
    return false;
}

static bool is_proj_name(const wna16_spec_t *fmt, const char *s, size_t n)
{
    const w16_spec_proj_t *p[3] = {&fmt->proj_gate, &fmt->proj_up,
                                   &fmt->proj_down};
    for (int i = 0; i < 3; i++)
        for (int a = 0; a < p[i]->n_names; a++)
            if (strlen(p[i]->names[a]) == n &&
                strncmp(p[i]->names[a], s, n) == 0)
                return true;
    return false;
}

/* Is `rest` (a name after "{prefix}.") one of a layer's expert tensors:
 * "{e}.{proj}.{leaf}" per expert, "w13_{leaf}"/"w2_{leaf}" stacked?
 * *expert: e, or -1 when stacked. */
static bool expert_rest(const wna16_spec_t *fmt, const char *rest,
                        long *expert)
{
    if (fmt->stacked) {
        *expert = -1;
        const char *leaf = strncmp(rest, "w13_", 4) == 0  ? rest + 4
                           : strncmp(rest, "w2_", 3) == 0 ? rest + 3
                                                          : NULL;
        return leaf && is_leaf_name(fmt, leaf, strlen(leaf));
    }
    size_t d = strspn(rest, "0123456789");
    if (d == 0 || d > 9 || rest[d] != '.')
        return false;
    const char *proj = rest + d + 1, *dot = strchr(proj, '.');
    if (!dot || !is_proj_name(fmt, proj, (size_t)(dot - proj)) ||
        !is_leaf_name(fmt, dot + 1, strlen(dot + 1)))
        return false;
    *expert = strtol(rest, NULL, 10);
    return true;
}

/* ---- layer discovery ----------------------------------------------------- */

/* Natural order: runs of digits compare as numbers, so "layers.2" comes
 * before "layers.10" and the output lists layers as a model does. */
static int natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
            while (*a == '0')
                a++;
            while (*b == '0')
                b++;
            size_t na = strspn(a, "0123456789"), nb = strspn(b, "0123456789");
            if (na != nb)
                return na < nb ? -1 : 1;
            int c = strncmp(a, b, na);
            if (c)
                return c;
            a += na;
            b += nb;
            continue;
        }
        if (*a != *b)
            return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++;
        b++;
    }
    return *a ? 1 : *b ? -1 : 0;
}

static int cmp_prefix(const void *x, const void *y)
{
    return natural_cmp(*(char *const *)x, *(char *const *)y);
}

/* Adds prefix[0..n) to the list unless it is there already. */
static wna16_status_t layers_add(wna16_moe_layers_t *L, const char *name,
                                 size_t n, wna16_error_t *err)
{
    for (size_t i = 0; i < L->count; i++)
        if (strlen(L->prefixes[i]) == n && strncmp(L->prefixes[i], name, n) == 0)
            return WNA16_OK;
    if (L->count == L->cap_) {
        size_t cap = L->cap_ ? 2 * L->cap_ : 16;
        char **p = w16_realloc(L->ctx_, L->prefixes, L->cap_ * sizeof *p,
                               cap * sizeof *p);
        if (!p)
            return w16_err_nomem(err, "listing MoE layers");
        L->prefixes = p;
        L->cap_ = cap;
    }
    char *s = w16_alloc(L->ctx_, n + 1);
    if (!s)
        return w16_err_nomem(err, "listing MoE layers");
    memcpy(s, name, n);
    s[n] = '\0';
    L->prefixes[L->count++] = s;
    return WNA16_OK;
}

wna16_status_t wna16_checkpoint_moe_layers(wna16_context_t *ctx,
                                           const wna16_checkpoint_t *ck,
                                           const wna16_spec_t *format,
                                           wna16_moe_layers_t *out,
                                           wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "wna16_checkpoint_moe_layers: out "
                       "is required");
    memset(out, 0, sizeof *out);
    out->ctx_ = ctx;
    if (!ctx || !ck || !format)
        return w16_err(err, WNA16_EINVAL, "wna16_checkpoint_moe_layers: ctx, "
                       "ck and format are required");
    char tails[8][192];
    int nt = layer_tails(format, tails, 8);
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(ck); i++) {
        const char *name = wna16_checkpoint_tensor_at(ck, i)->name;
        for (int t = 0; t < nt; t++) {
            size_t plen;
            if (!match_tail(name, tails[t], &plen))
                continue;
            wna16_status_t st = layers_add(out, name, plen, err);
            if (st != WNA16_OK) {
                wna16_moe_layers_free(out);
                return st;
            }
        }
    }
    if (out->count > 1)
        qsort(out->prefixes, out->count, sizeof *out->prefixes, cmp_prefix);
    return WNA16_OK;
}

void wna16_moe_layers_free(wna16_moe_layers_t *layers)
{
    if (!layers)
        return;
    for (size_t i = 0; i < layers->count; i++)
        w16_free(layers->ctx_, layers->prefixes[i],
                 strlen(layers->prefixes[i]) + 1);
    w16_free(layers->ctx_, layers->prefixes,
             layers->cap_ * sizeof *layers->prefixes);
    memset(layers, 0, sizeof *layers);
}

/* The checkpoint tensor holding `role` of expert 0's first projection of
 * operand g (gate for w13, down for w2), or the stacked tensor; NULL when
 * there is none. Used for bias detection and the source dtypes. */
static const wna16_tensor_t *first_tensor(const wna16_checkpoint_t *ck,
                                          const wna16_spec_t *fmt,
                                          const char *prefix, wna16_gemm_t g,
                                          w16_role_t role)
{
    const w16_layout_t *l = fmt->layouts[role];
    if (!l)
        return NULL;
    char rest[256], name[WNA16_TENSOR_NAME_MAX];
    if (fmt->stacked) {
        snprintf(rest, sizeof rest, "%s_%s", gemm_leaf(g), l->name);
        return join_name(name, sizeof name, prefix, rest)
                   ? wna16_checkpoint_find(ck, name) : NULL;
    }
    const w16_spec_proj_t *p = g == WNA16_GEMM_W13 ? &fmt->proj_gate
                                                   : &fmt->proj_down;
    for (int a = 0; a < p->n_names; a++) {
        snprintf(rest, sizeof rest, "0.%s.%s", p->names[a], l->name);
        const wna16_tensor_t *t =
            join_name(name, sizeof name, prefix, rest)
                ? wna16_checkpoint_find(ck, name) : NULL;
        if (t)
            return t;
    }
    return NULL;
}

bool wna16_checkpoint_layer_has_bias(const wna16_checkpoint_t *ck,
                                     const wna16_spec_t *format,
                                     const char *prefix)
{
    return ck && format &&
           first_tensor(ck, format, prefix, WNA16_GEMM_W13, W16_ROLE_BIAS);
}

/* ---- output shapes from the spec ----------------------------------------- */

/* The dtype the encoder writes: a float role keeps the data's own dtype
 * when the layout accepts it, else the layout's first (codec.c's rule). */
static wna16_dtype_t decl_dtype(const w16_layout_t *l, wna16_dtype_t scale,
                                wna16_dtype_t bias)
{
    wna16_dtype_t want = l->role == W16_ROLE_SCALES ? scale
                         : l->role == W16_ROLE_BIAS ? bias
                                                    : WNA16_DTYPE_INVALID;
    for (int i = 0; i < l->n_dtypes; i++)
        if (want != WNA16_DTYPE_INVALID && l->dtypes[i] == want)
            return want;
    return l->dtypes[0];
}

static wna16_status_t fill_decl(const w16_layout_t *l, const int64_t *vars,
                                const char *prefix, wna16_gemm_t g,
                                wna16_dtype_t dtype, wna16_tensor_decl_t *d,
                                wna16_error_t *err)
{
    char rest[256];
    snprintf(rest, sizeof rest, "%s_%s", gemm_leaf(g), l->name);
    if (!join_name(d->name, sizeof d->name, prefix, rest))
        return w16_err(err, WNA16_ELIMIT, "tensor name '%s.%s' is longer than "
                       "%d bytes", prefix ? prefix : "", rest,
                       WNA16_TENSOR_NAME_MAX - 1);
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_status_t st = w16_layout_shape(l, vars, shape, err);
    if (st != WNA16_OK)
        return st;
    d->dtype = dtype;
    d->ndim = l->ndim;
    size_t bytes = wna16_dtype_size(dtype);
    for (int i = 0; i < l->ndim; i++) {
        if (shape[i] < 0)
            return w16_err(err, WNA16_EINTERNAL, "tensor '%s': dimension %d "
                           "is negative (%lld)", d->name, i,
                           (long long)shape[i]);
        d->shape[i] = shape[i];
        if (!w16_mul_size(bytes, (size_t)shape[i], &bytes))
            return w16_err(err, WNA16_ELIMIT, "tensor '%s': size overflows",
                           d->name);
    }
    d->nbytes = bytes;
    return WNA16_OK;
}

wna16_status_t wna16_repack_layer_shapes(
    wna16_context_t *ctx, const wna16_spec_t *dst_backend, const char *prefix,
    int32_t E, int32_t H, int32_t I, const wna16_quant_desc_t *quant,
    wna16_dtype_t scale_dtype, wna16_dtype_t bias_dtype,
    wna16_tensor_decl_t decls[WNA16_LAYER_MAX_TENSORS], size_t *count,
    wna16_error_t *err)
{
    (void)ctx;
    if (!dst_backend || !quant || !decls || !count)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_layer_shapes: "
                       "dst_backend, quant, decls and count are required");
    *count = 0;
    if (dst_backend->kind != WNA16_SPEC_BACKEND || !dst_backend->stacked)
        return w16_err(err, WNA16_EINVAL, "%s is not a backend spec with "
                       "stacked w13/w2 tensors", dst_backend->name);
    w16_problem_t p = {E, H, I, quant->bits, quant->group_size,
                       quant->zero_point, quant->act_order, quant->bias,
                       quant->zeros_stored, quant->g_idx_stored,
                       (int)quant->input_dtype,
                       .model_dtype = quant->model_dtype};
    /* the loader's cast: float values arrive in the model's dtype */
    if (quant->model_dtype)
        scale_dtype = bias_dtype = quant->model_dtype;
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        wna16_status_t st = w16_spec_bind(dst_backend, &p, (wna16_gemm_t)g,
                                          vars, err);
        if (st != WNA16_OK)
            return st;
        for (int r = 0; r < W16_ROLE_COUNT; r++) {
            const w16_layout_t *l = dst_backend->layouts[r];
            if (!w16_layout_present(l, vars))
                continue;
            if (*count == WNA16_LAYER_MAX_TENSORS)
                return w16_err(err, WNA16_EINTERNAL, "more than %d tensors "
                               "per layer", WNA16_LAYER_MAX_TENSORS);
            st = fill_decl(l, vars, prefix, (wna16_gemm_t)g,
                           decl_dtype(l, scale_dtype, bias_dtype),
                           &decls[*count], err);
            if (st != WNA16_OK)
                return st;
            ++*count;
        }
    }
    return WNA16_OK;
}

/* ---- the job ------------------------------------------------------------- */

/* One layer's plan: what it holds and the tensors it will write. */
typedef struct rp_layer {
    const char *prefix; /* owned by job->layers */
    wna16_quant_desc_t quant;
    wna16_tensor_decl_t decls[WNA16_LAYER_MAX_TENSORS];
    size_t n_decls;
} rp_layer_t;

typedef struct rp_job {
    wna16_context_t *ctx;
    const wna16_repack_options_t *o;
    const char *ck_path, *out_path;
    wna16_checkpoint_t *ck;
    const wna16_spec_t *fmt, *backend;
    wna16_quant_desc_t quant; /* config + overrides; bias per layer */
    int32_t E, H, I, IP;
    char dtype_why[256]; /* how quant.model_dtype was decided */
    wna16_moe_layers_t layers;
    rp_layer_t *plan;
    /* Per checkpoint tensor: the layer whose expert tensor it is, or -1. */
    int32_t *owner;
    size_t n_copy;
    wna16_safetensors_writer_t *w; /* the shard being written */
    uint64_t written, total;
    size_t n_tensors;
    /* The output: one file (out_path), or a checkpoint directory. Entries
     * are the output tensors in order (every layer's decls, then the
     * copies); entry e goes to shard entry_shard[e], shard s holds entries
     * [shard_first[s], shard_first[s + 1]). */
    bool dir_mode, dir_created;
    char dir[4096];
    uint64_t max_shard;
    size_t n_entries, next_entry, n_shards, cur_shard;
    uint32_t *entry_shard;
    size_t *shard_first;
    uint64_t *shard_bytes;
    /* dir mode: completed shards waiting for the commit (NULL once
     * committed or aborted) */
    wna16_safetensors_writer_t **done;
    w16_arena_t arena; /* output paths */
} rp_job_t;

/* The quantization before the on/off overrides: config.json's, or, with
 * no quantization_config, the format's own defaults for the given bits and
 * group size (AWQ has zero points unless told otherwise), both read by
 * wna16_model_config_quant, the one place that knows each format's
 * spelling. Bits and group size overrides go in first, so that a bits
 * override can mend a config wna16 would reject. */
static wna16_status_t base_quant(const wna16_model_config_t *cfg,
                                 const wna16_repack_options_t *o,
                                 wna16_quant_desc_t *q, wna16_error_t *err)
{
    wna16_model_config_t base;
    memset(&base, 0, sizeof base);
    if (cfg && cfg->format_name[0])
        base = *cfg;
    else if (o->format)
        snprintf(base.format_name, sizeof base.format_name, "%s", o->format);
    if (o->bits)
        base.bits = o->bits;
    if (o->group_size)
        base.group_size = o->group_size;
    memset(q, 0, sizeof *q);
    if (o->bits && o->bits != 4 && o->bits != 8)
        return w16_err(err, WNA16_EUNSUPPORTED, "%d-bit weights: wna16 "
                       "handles 4 and 8 bits", o->bits);
    /* a quantization_config wna16 does not read, and no --format: name it
     * and the methods wna16 reads */
    if (!base.format_name[0] && cfg && cfg->quant_method[0])
        return wna16_model_config_quant(cfg, q, err);
    if (!base.format_name[0] || !base.bits)
        return WNA16_OK; /* reported as missing by the caller */
    return wna16_model_config_quant(&base, q, err);
}

/* Names every value neither config.json nor the options give. */
static wna16_status_t check_missing(const rp_job_t *j, const char *format,
                                    const wna16_quant_desc_t *q,
                                    bool configured, wna16_error_t *err)
{
    const struct { bool ok; const char *what; } need[] = {
        {format != NULL, "format (--format)"}, {q->bits != 0, "bits (--bits)"},
        {configured || j->o->group_size, "group size (--group-size)"},
        {j->H > 0, "hidden size (--hidden)"},
        {j->I > 0, "intermediate size (--intermediate)"},
        {j->E > 0, "number of experts (--experts)"},
    };
    char missing[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < W16_ARRAY_LEN(need); i++)
        if (!need[i].ok && len < sizeof missing)
            len += (size_t)snprintf(missing + len, sizeof missing - len,
                                    "%s%s", len ? ", " : "", need[i].what);
    if (!len)
        return WNA16_OK;
    return w16_err(err, WNA16_EINVAL, "%s: %s the %s", j->ck_path,
                   wna16_checkpoint_config(j->ck) ? "config.json does not give"
                                                  : "no config.json gives",
                   missing);
}

/* config.json, then the options' overrides. */
static wna16_status_t resolve_quant(rp_job_t *j, wna16_error_t *err)
{
    const wna16_model_config_t *cfg = wna16_checkpoint_config(j->ck);
    const wna16_repack_options_t *o = j->o;
    bool configured = cfg && cfg->format_name[0];
    const char *format = o->format ? o->format
                         : configured ? cfg->format_name : NULL;
    wna16_quant_desc_t q;
    wna16_status_t st = base_quant(cfg, o, &q, err);
    if (st != WNA16_OK)
        return st;
    if (o->zero_point_set)
        q.zero_point = o->zero_point;
    if (o->act_order_set)
        q.act_order = o->act_order;
    if ((unsigned)o->input_dtype >= WNA16_INPUT_COUNT_)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_checkpoint: input "
                       "dtype %d is not a wna16_input_dtype_t",
                       (int)o->input_dtype);
    q.input_dtype = o->input_dtype;
    st = wna16_model_dtype(cfg, o->dtype, &q.model_dtype, j->dtype_why,
                           sizeof j->dtype_why, err);
    if (st != WNA16_OK) {
        w16_err_prefix(err, "%s", j->ck_path);
        return st;
    }
    j->E = o->experts ? o->experts : cfg ? cfg->num_experts : 0;
    j->H = o->hidden ? o->hidden : cfg ? cfg->hidden_size : 0;
    j->I = o->intermediate ? o->intermediate
                           : cfg ? cfg->moe_intermediate_size : 0;
    if ((st = check_missing(j, format, &q, configured, err)) != WNA16_OK)
        return st;
    if (q.group_size < -1)
        return w16_err(err, WNA16_EINVAL, "group size %d: expected -1 or a "
                       "positive size", q.group_size);
    j->fmt = wna16_spec_find(j->ctx, WNA16_SPEC_FORMAT, format);
    if (!j->fmt)
        return w16_err(err, WNA16_ENOTFOUND, "no format spec named '%s'",
                       format);
    j->quant = q;
    return WNA16_OK;
}

/* ---- the output may not replace an input --------------------------------- */

static bool same_file(const struct stat *a, const char *path)
{
    struct stat b;
    return stat(path, &b) == 0 && a->st_dev == b.st_dev &&
           a->st_ino == b.st_ino;
}

/* Reads a whole (small) file; NULL on any failure. */
static char *slurp(wna16_context_t *ctx, const char *path, size_t *cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = w16_alloc(ctx, (size_t)n + 1)) != NULL) {
        *cap = (size_t)n + 1;
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            w16_free(ctx, buf, *cap);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

/* Is `out` one of the shards the index names (plain names, in dir)? */
static bool is_indexed_shard(wna16_context_t *ctx, const char *dir,
                             const struct stat *out)
{
    char path[4096];
    size_t cap = 0;
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >=
        (int)sizeof path)
        return false;
    char *text = slurp(ctx, path, &cap);
    size_t at = 0;
    cJSON *root = text && w16_json_text_check(text, strlen(text), &at) ==
                                  W16_JSON_OK
                      ? cJSON_Parse(text)
                      : NULL;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    bool hit = false;
    const char *last = NULL;
    for (const cJSON *c = map ? map->child : NULL; c && !hit; c = c->next) {
        if (!cJSON_IsString(c) || (last && !strcmp(last, c->valuestring)))
            continue;
        last = c->valuestring;
        hit = snprintf(path, sizeof path, "%s/%s", dir, last) <
                  (int)sizeof path && same_file(out, path);
    }
    cJSON_Delete(root);
    if (text)
        w16_free(ctx, text, cap);
    return hit;
}

static const char *const ck_files[] = {"config.json", "model.safetensors",
                                       "model.safetensors.index.json"};

/* Would the output land in the checkpoint directory under a name the
 * checkpoint reader looks for? A new model.safetensors beside the shards of
 * an indexed checkpoint would shadow them the next time it is opened. */
static bool shadows_ck_file(const char *out, const struct stat *ck_dir)
{
    const char *slash = strrchr(out, '/');
    const char *base = slash ? slash + 1 : out;
    char dir[4096];
    int n = slash ? snprintf(dir, sizeof dir, "%.*s", (int)(slash - out), out)
                  : snprintf(dir, sizeof dir, ".");
    if (n < 0 || (size_t)n >= sizeof dir)
        return false;
    if (!*dir)
        snprintf(dir, sizeof dir, "/");
    bool reserved = false;
    for (size_t i = 0; i < W16_ARRAY_LEN(ck_files); i++)
        reserved = reserved || strcmp(base, ck_files[i]) == 0;
    return reserved && same_file(ck_dir, dir);
}

/* Renaming the output over a checkpoint file would destroy the model being
 * read (the mapping keeps the old bytes alive only until we exit). */
static wna16_status_t check_out_path(const rp_job_t *j, wna16_error_t *err)
{
    struct stat os, cs;
    if (stat(j->ck_path, &cs) != 0)
        return WNA16_OK; /* opened already: it vanished meanwhile */
    if (S_ISDIR(cs.st_mode) && shadows_ck_file(j->out_path, &cs))
        return w16_err(err, WNA16_EINVAL, "%s: is a file of the checkpoint "
                       "%s (or would shadow its shards); write the output "
                       "elsewhere", j->out_path, j->ck_path);
    if (stat(j->out_path, &os) != 0)
        return WNA16_OK; /* does not exist: cannot be an input */
    if (S_ISDIR(os.st_mode))
        return w16_err(err, WNA16_EINVAL, "%s: is a directory; the output is "
                       "a .safetensors file path", j->out_path);
    bool input = !S_ISDIR(cs.st_mode) && same_file(&os, j->ck_path);
    if (!input && S_ISDIR(cs.st_mode))
        input = is_indexed_shard(j->ctx, j->ck_path, &os);
    if (input)
        return w16_err(err, WNA16_EINVAL, "%s: is a file of the checkpoint "
                       "%s; write the output elsewhere", j->out_path,
                       j->ck_path);
    return WNA16_OK;
}

/* ---- planning -------------------------------------------------------------- */

static wna16_status_t find_layers(rp_job_t *j, wna16_error_t *err)
{
    char tails[8][192];
    int nt = layer_tails(j->fmt, tails, 8);
    if (j->o->layer) {
        memset(&j->layers, 0, sizeof j->layers);
        j->layers.ctx_ = j->ctx;
        char name[WNA16_TENSOR_NAME_MAX];
        for (int t = 0; t < nt; t++)
            if (join_name(name, sizeof name, j->o->layer, tails[t]) &&
                wna16_checkpoint_find(j->ck, name))
                return layers_add(&j->layers, j->o->layer,
                                  strlen(j->o->layer), err);
        join_name(name, sizeof name, j->o->layer, nt ? tails[0] : "?");
        return w16_err(err, WNA16_ENOTFOUND, "%s: layer '%s' has no tensor "
                       "'%s'", j->ck_path, j->o->layer, name);
    }
    wna16_status_t st = wna16_checkpoint_moe_layers(j->ctx, j->ck, j->fmt,
                                                    &j->layers, err);
    if (st != WNA16_OK || j->layers.count)
        return st;
    char list[600] = "";
    size_t len = 0;
    for (int t = 0; t < nt && len < sizeof list; t++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s'*.%s'",
                                t ? " or " : "", tails[t]);
    return w16_err(err, WNA16_ENOTFOUND, "%s: no MoE expert tensors of "
                   "format %s found (looked for %s)", j->ck_path,
                   j->fmt->name, nt ? list : "a qweight layout");
}

/* Marks each checkpoint tensor with the layer it belongs to (-1: none) and
 * refuses expert indices beyond the layer's experts, which would otherwise
 * be dropped silently. */
static wna16_status_t classify(rp_job_t *j, wna16_error_t *err)
{
    size_t n = wna16_checkpoint_tensor_count(j->ck);
    j->owner = w16_calloc(j->ctx, n ? n : 1, sizeof *j->owner);
    if (!j->owner)
        return w16_err_nomem(err, "classifying checkpoint tensors");
    for (size_t i = 0; i < n; i++) {
        const char *name = wna16_checkpoint_tensor_at(j->ck, i)->name;
        j->owner[i] = -1;
        for (size_t l = 0; l < j->layers.count && j->owner[i] < 0; l++) {
            const char *p = j->layers.prefixes[l];
            size_t pl = strlen(p);
            const char *rest = !pl ? name
                               : strncmp(name, p, pl) == 0 && name[pl] == '.'
                                   ? name + pl + 1 : NULL;
            long e;
            if (!rest || !expert_rest(j->fmt, rest, &e))
                continue;
            if (e >= j->E)
                return w16_err(err, WNA16_EFORMAT, "tensor '%s': expert %ld, "
                               "but the layer has %d experts", name, e, j->E);
            j->owner[i] = (int32_t)l;
        }
        if (j->owner[i] < 0)
            j->n_copy += j->o->all_tensors;
    }
    return WNA16_OK;
}

static wna16_dtype_t dtype_of(const wna16_tensor_t *t)
{
    return t ? t->dtype : WNA16_DTYPE_INVALID;
}

/* Each layer's quantization (bias from its tensors) and output tensors. */
static wna16_status_t plan_layers(rp_job_t *j, wna16_error_t *err)
{
    j->plan = w16_calloc(j->ctx, j->layers.count, sizeof *j->plan);
    if (!j->plan)
        return w16_err_nomem(err, "planning the repack");
    for (size_t l = 0; l < j->layers.count; l++) {
        rp_layer_t *L = &j->plan[l];
        L->prefix = j->layers.prefixes[l];
        L->quant = j->quant;
        L->quant.bias = wna16_checkpoint_layer_has_bias(j->ck, j->fmt,
                                                        L->prefix);
        /* tensors carried but unused: symmetric zeros, g_idx without
         * act-order (Marlin keeps them, as vLLM does) */
        L->quant.zeros_stored = !L->quant.zero_point &&
            first_tensor(j->ck, j->fmt, L->prefix, WNA16_GEMM_W13,
                         W16_ROLE_QZEROS) != NULL;
        L->quant.g_idx_stored = L->quant.act_order || j->fmt->g_idx_params ||
            first_tensor(j->ck, j->fmt, L->prefix, WNA16_GEMM_W13,
                         W16_ROLE_G_IDX) != NULL;
        wna16_dtype_t sd = dtype_of(first_tensor(j->ck, j->fmt, L->prefix,
                                                 WNA16_GEMM_W13,
                                                 W16_ROLE_SCALES));
        wna16_dtype_t bd = dtype_of(first_tensor(j->ck, j->fmt, L->prefix,
                                                 WNA16_GEMM_W13,
                                                 W16_ROLE_BIAS));
        wna16_status_t st = wna16_repack_layer_shapes(
            j->ctx, j->backend, L->prefix, j->E, j->H, j->I, &L->quant, sd,
            bd, L->decls, &L->n_decls, err);
        if (st != WNA16_OK) {
            w16_err_prefix(err, "%s", *L->prefix ? L->prefix : "layer");
            return st;
        }
        for (size_t d = 0; d < L->n_decls; d++)
            j->total += L->decls[d].nbytes;
        j->n_tensors += L->n_decls;
    }
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(j->ck); i++)
        if (j->owner[i] < 0 && j->o->all_tensors)
            j->total += wna16_checkpoint_tensor_at(j->ck, i)->nbytes;
    j->n_tensors += j->n_copy;
    return WNA16_OK;
}

/* ---- repacking one layer --------------------------------------------------- */

/* Hands the pages of a finished source tensor back to the kernel. Mapped
 * checkpoint pages count as this process's memory until reclaimed, and a
 * streaming repack never reads them again. MADV_PAGEOUT never loses data
 * (clean file pages are re-read on access; anonymous memory would be
 * swapped, never zeroed), unlike MADV_DONTNEED; failure is harmless. */
static void release_pages(const void *data, size_t n)
{
#ifdef MADV_PAGEOUT
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || !data)
        return;
    uintptr_t a = (uintptr_t)data, b = a + n, m = (uintptr_t)pg - 1;
    a = (a + m) & ~m;
    b &= ~m;
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_PAGEOUT);
#else
    (void)data;
    (void)n;
#endif
}

static void release_layer_pages(const rp_job_t *j, size_t l)
{
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(j->ck); i++)
        if (j->owner[i] == (int32_t)l) {
            const wna16_tensor_t *t = wna16_checkpoint_tensor_at(j->ck, i);
            release_pages(t->data, t->nbytes);
        }
}

static void report(const rp_job_t *j, size_t layer, const char *name,
                   bool done)
{
    if (!j->o->progress)
        return;
    wna16_repack_progress_t p = {layer, j->layers.count, name, done,
                                 j->written, j->total};
    j->o->progress(j->o->progress_user, &p);
}

/* The repacked tensors must be exactly the declared ones: the header was
 * written from the declarations, so any drift would corrupt the file. */
static wna16_status_t check_against_plan(const rp_layer_t *L,
                                         const wna16_tensor_set_t *out,
                                         wna16_error_t *err)
{
    if (wna16_tensor_set_count(out) != L->n_decls)
        return w16_err(err, WNA16_EINTERNAL, "%s: repacked into %zu tensors, "
                       "but the backend spec declares %zu", L->prefix,
                       wna16_tensor_set_count(out), L->n_decls);
    for (size_t d = 0; d < L->n_decls; d++) {
        const wna16_tensor_decl_t *want = &L->decls[d];
        const wna16_tensor_t *t = wna16_tensor_set_find(out, want->name);
        bool same = t && t->dtype == want->dtype && t->ndim == want->ndim &&
                    t->nbytes == want->nbytes;
        for (int i = 0; same && i < t->ndim; i++)
            same = t->shape[i] == want->shape[i];
        if (!same)
            return w16_err(err, WNA16_EFORMAT, "tensor '%s': the repack %s "
                           "the declared %s tensor of %zu bytes (layers "
                           "differ in dtype or shape?)", want->name,
                           t ? "does not match" : "lacks",
                           wna16_dtype_name(want->dtype), want->nbytes);
    }
    return WNA16_OK;
}

/* Repacks layer l into a fresh set (*out, caller destroys). */
static wna16_status_t repack_one(rp_job_t *j, size_t l,
                                 wna16_tensor_set_t **out, wna16_error_t *err)
{
    const rp_layer_t *L = &j->plan[l];
    wna16_tensor_set_t *src = NULL;
    *out = NULL;
    wna16_status_t st = wna16_tensor_set_create(j->ctx, &src, err);
    for (size_t i = 0; st == WNA16_OK &&
                       i < wna16_checkpoint_tensor_count(j->ck); i++)
        if (j->owner[i] == (int32_t)l)
            st = wna16_tensor_set_add_view(
                src, wna16_checkpoint_tensor_at(j->ck, i), err);
    if (st == WNA16_OK)
        st = wna16_tensor_set_create(j->ctx, out, err);
    if (st == WNA16_OK)
        st = wna16_repack_layer(j->ctx, j->fmt, src, L->prefix, j->E, j->H,
                                j->I, &L->quant, j->backend, j->o->target,
                                *out, err);
    if (st == WNA16_OK)
        st = check_against_plan(L, *out, err);
    else
        w16_err_prefix(err, "%s", *L->prefix ? L->prefix : "layer");
    wna16_tensor_set_destroy(src);
    if (st != WNA16_OK) {
        wna16_tensor_set_destroy(*out);
        *out = NULL;
    }
    return st;
}

/* ---- the output: shards ---------------------------------------------------- */

/* Output entry e: its declaration (name, dtype, shape, size). */
static void entry_decl(const rp_job_t *j, size_t e, const char **name,
                       wna16_dtype_t *dtype, int *ndim, const int64_t **shape,
                       uint64_t *nbytes)
{
    for (size_t l = 0; l < j->layers.count; l++) {
        if (e < j->plan[l].n_decls) {
            const wna16_tensor_decl_t *D = &j->plan[l].decls[e];
            *name = D->name;
            *dtype = D->dtype;
            *ndim = D->ndim;
            *shape = D->shape;
            *nbytes = D->nbytes;
            return;
        }
        e -= j->plan[l].n_decls;
    }
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(j->ck); i++)
        if (j->owner[i] < 0 && e-- == 0) {
            const wna16_tensor_t *t = wna16_checkpoint_tensor_at(j->ck, i);
            *name = t->name;
            *dtype = t->dtype;
            *ndim = t->ndim;
            *shape = t->shape;
            *nbytes = t->nbytes;
            return;
        }
}

/* "model-00001-of-00003.safetensors" (Hugging Face's shard names). */
static void shard_name(const rp_job_t *j, size_t s, char *out, size_t n)
{
    snprintf(out, n, "model-%05zu-of-%05zu.safetensors", s + 1, j->n_shards);
}

/* The path shard s is written to: out_path, or DIR/name. */
static const char *shard_path(rp_job_t *j, size_t s, wna16_error_t *err)
{
    if (!j->dir_mode)
        return j->out_path;
    char name[64], path[4200];
    shard_name(j, s, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", j->dir, name);
    const char *p = w16_arena_strdup(&j->arena, path);
    if (!p)
        w16_err_nomem(err, "naming a shard");
    return p;
}

/* Cuts the entries into shards: in order, a new shard when the next
 * tensor would take the current one past max_shard (a tensor larger than
 * that is a shard of its own, as Hugging Face's save_pretrained does). A
 * file output is one shard. */
static wna16_status_t plan_shards(rp_job_t *j, wna16_error_t *err)
{
    j->n_entries = j->n_copy * (j->o->all_tensors ? 1 : 0);
    for (size_t l = 0; l < j->layers.count; l++)
        j->n_entries += j->plan[l].n_decls;
    size_t n = j->n_entries ? j->n_entries : 1;
    j->entry_shard = w16_calloc(j->ctx, n, sizeof *j->entry_shard);
    j->shard_first = w16_calloc(j->ctx, n + 1, sizeof *j->shard_first);
    j->shard_bytes = w16_calloc(j->ctx, n, sizeof *j->shard_bytes);
    j->done = w16_calloc(j->ctx, n, sizeof *j->done);
    if (!j->entry_shard || !j->shard_first || !j->shard_bytes || !j->done)
        return w16_err_nomem(err, "planning the output's shards");
    size_t s = 0;
    for (size_t e = 0; e < j->n_entries; e++) {
        const char *nm;
        wna16_dtype_t dt;
        int nd;
        const int64_t *sh;
        uint64_t b;
        entry_decl(j, e, &nm, &dt, &nd, &sh, &b);
        if (j->dir_mode && e > j->shard_first[s] &&
            j->shard_bytes[s] + b > j->max_shard)
            j->shard_first[++s] = e;
        j->entry_shard[e] = (uint32_t)s;
        j->shard_bytes[s] += b;
    }
    j->n_shards = s + 1;
    j->shard_first[j->n_shards] = j->n_entries;
    if (j->n_shards > 99999)
        return w16_err(err, WNA16_ELIMIT, "%s: %zu shards of at most %llu "
                       "bytes; choose a larger --max-shard-size",
                       j->out_path, j->n_shards,
                       (unsigned long long)j->max_shard);
    return WNA16_OK;
}

/* ---- the output directory ---------------------------------------------------- */

/* Is `name` one of the shards this run writes? */
static bool is_our_shard(const rp_job_t *j, const char *name)
{
    char mine[64];
    for (size_t s = 0; s < j->n_shards; s++) {
        shard_name(j, s, mine, sizeof mine);
        if (strcmp(name, mine) == 0)
            return true;
    }
    return false;
}

/* Named like a checkpoint's weights: model.safetensors or
 * model-NNNNN-of-NNNNN.safetensors. */
static bool is_shard_like(const char *name)
{
    if (strcmp(name, "model.safetensors") == 0)
        return true;
    if (strlen(name) != 32 || strncmp(name, "model-", 6) != 0 ||
        strncmp(name + 11, "-of-", 4) != 0 ||
        strcmp(name + 20, ".safetensors") != 0)
        return false;
    for (int i = 0; i < 5; i++)
        if (name[6 + i] < '0' || name[6 + i] > '9' || name[15 + i] < '0' ||
            name[15 + i] > '9')
            return false;
    return true;
}

/* After the new set is in place: the weight files of an earlier save that
 * this one does not write go, as Hugging Face's save_pretrained removes
 * them (each said once); a loader would otherwise find two sets. */
static void remove_stale_shards(rp_job_t *j)
{
    DIR *d = opendir(j->dir);
    for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
        if (!is_shard_like(de->d_name) || is_our_shard(j, de->d_name))
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", j->dir, de->d_name);
        if (unlink(path) == 0)
            w16_log_once(j->ctx, WNA16_LOG_WARN, path, "%s: removed, a weight "
                         "file of an earlier output that this one replaces "
                         "(%zu shard%s)", path, j->n_shards,
                         j->n_shards == 1 ? "" : "s");
    }
    if (d)
        closedir(d);
}

/* A directory output: not the checkpoint's own directory, and holding no
 * other .safetensors file than weight files of an earlier save (replaced
 * or removed once the new set is in place): a loader would read it beside
 * the new shards. */
static wna16_status_t check_out_dir(rp_job_t *j, wna16_error_t *err)
{
    struct stat ds, cs;
    if (stat(j->dir, &ds) != 0)
        return WNA16_OK; /* created at write time */
    if (!S_ISDIR(ds.st_mode))
        return w16_err(err, WNA16_EINVAL, "%s: is not a directory (an output "
                       "ending in '/' is a checkpoint directory)", j->out_path);
    if (stat(j->ck_path, &cs) == 0 && cs.st_dev == ds.st_dev &&
        cs.st_ino == ds.st_ino)
        return w16_err(err, WNA16_EINVAL, "%s: is the checkpoint's own "
                       "directory; write the output elsewhere", j->out_path);
    DIR *d = opendir(j->dir);
    if (!d)
        return w16_err(err, WNA16_EIO, "%s: cannot list the directory: %s",
                       j->dir, strerror(errno));
    wna16_status_t st = WNA16_OK;
    for (struct dirent *de; st == WNA16_OK && (de = readdir(d)) != NULL;) {
        size_t n = strlen(de->d_name);
        bool st_file = n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0;
        if (st_file && !is_shard_like(de->d_name))
            st = w16_err(err, WNA16_EINVAL, "%s: holds %s, which this output "
                         "does not write and a loader would read beside its "
                         "shards; remove it or choose another directory",
                         j->dir, de->d_name);
    }
    closedir(d);
    return st;
}

/* The directory exists (made here if only it is missing). */
static wna16_status_t make_out_dir(rp_job_t *j, wna16_error_t *err)
{
    if (mkdir(j->dir, 0777) == 0) {
        j->dir_created = true;
        return WNA16_OK;
    }
    struct stat st;
    if (errno == EEXIST && stat(j->dir, &st) == 0 && S_ISDIR(st.st_mode))
        return WNA16_OK;
    return w16_err(err, WNA16_EIO, "%s: cannot create the output directory: "
                   "%s", j->dir, strerror(errno));
}

/* ---- writing --------------------------------------------------------------- */

static wna16_status_t put_meta(rp_job_t *j, const char *key, const char *v,
                               wna16_error_t *err)
{
    return wna16_safetensors_writer_metadata(j->w, key, v, err);
}

static wna16_status_t put_meta_int(rp_job_t *j, const char *key, long long v,
                                   wna16_error_t *err)
{
    char s[32];
    snprintf(s, sizeof s, "%lld", v);
    return put_meta(j, key, s, err);
}

/* What a reader needs to know the tensors' meaning without the specs
 * (every shard carries it). */
static wna16_status_t write_metadata(rp_job_t *j, wna16_error_t *err)
{
    bool bias = false;
    for (size_t l = 0; l < j->layers.count; l++)
        bias = bias || j->plan[l].quant.bias;
    const wna16_quant_desc_t *q = &j->quant;
    const char *vllm = j->backend->bsel.vllm_name;
    char layout[512];
    snprintf(layout, sizeof layout, "vLLM's %s layout of the FusedMoE "
             "parameters, as wna16's %s spec (%s) describes it",
             vllm ? vllm : j->backend->name, j->backend->name,
             j->backend->origin);
    const struct { const char *k, *v; } s[] = {
        {"format", "pt"}, /* what transformers expects of .safetensors */
        {"wna16_version", wna16_version()},
        {"backend", j->backend->name},
        {"vllm_backend", vllm ? vllm : ""},
        {"layout", layout},
        {"target", wna16_target_name(j->o->target)},
        {"source_format", j->fmt->name},
        {"zero_point", q->zero_point ? "true" : "false"},
        {"act_order", q->act_order ? "true" : "false"},
        {"bias", bias ? "true" : "false"},
        {"input_dtype", wna16_input_dtype_name(q->input_dtype)},
        /* the model's dtype the scales and biases were cast to */
        {"dtype", q->model_dtype ? wna16_model_dtype_name(q->model_dtype)
                                 : "checkpoint"},
        /* Marlin's is_k_full: whole layers, never a TP shard of w2's K */
        {"is_k_full", "true"},
    };
    const struct { const char *k; long long v; } n[] = {
        {"num_bits", q->bits}, {"group_size", q->group_size},
        {"num_experts", j->E}, {"hidden_size", j->H},
        {"intermediate_size", j->I}, {"intermediate_size_padded", j->IP},
        {"num_layers", (long long)j->layers.count},
    };
    wna16_status_t st = WNA16_OK;
    for (size_t i = 0; st == WNA16_OK && i < W16_ARRAY_LEN(s); i++)
        st = put_meta(j, s[i].k, s[i].v, err);
    for (size_t i = 0; st == WNA16_OK && i < W16_ARRAY_LEN(n); i++)
        st = put_meta_int(j, n[i].k, n[i].v, err);
    return st;
}

/* Opens shard s: its writer, metadata and declarations. */
static wna16_status_t open_shard(rp_job_t *j, size_t s, wna16_error_t *err)
{
    const char *path = shard_path(j, s, err);
    if (!path)
        return WNA16_ENOMEM;
    wna16_status_t st = wna16_safetensors_writer_create(j->ctx, path, &j->w,
                                                        err);
    if (st != WNA16_OK)
        return st;
    j->cur_shard = s;
    st = write_metadata(j, err);
    for (size_t e = j->shard_first[s];
         st == WNA16_OK && e < j->shard_first[s + 1]; e++) {
        const char *nm;
        wna16_dtype_t dt;
        int nd;
        const int64_t *sh;
        uint64_t b;
        entry_decl(j, e, &nm, &dt, &nd, &sh, &b);
        st = wna16_safetensors_writer_declare(j->w, nm, dt, nd, sh, err);
    }
    return st;
}

/* Writes the next entry's bytes into its shard, moving to the next shard
 * when the entry belongs there (the finished one waits for the commit). */
static wna16_status_t put(rp_job_t *j, const void *data, size_t n,
                          wna16_error_t *err)
{
    size_t e = j->next_entry++;
    size_t s = e < j->n_entries ? j->entry_shard[e] : 0;
    wna16_status_t st = WNA16_OK;
    if (j->w && s != j->cur_shard) {
        st = w16_safetensors_writer_complete(j->w, err);
        j->done[j->cur_shard] = j->w;
        j->w = NULL;
    }
    if (st == WNA16_OK && !j->w)
        st = open_shard(j, s, err);
    if (st == WNA16_OK)
        st = wna16_safetensors_writer_write(j->w, data, n, err);
    j->written += n;
    return st;
}

/* Writes layer l's tensors (in declaration order) and frees them. */
static wna16_status_t write_layer(rp_job_t *j, size_t l,
                                  wna16_tensor_set_t *set, wna16_error_t *err)
{
    const rp_layer_t *L = &j->plan[l];
    wna16_status_t st = WNA16_OK;
    for (size_t d = 0; st == WNA16_OK && d < L->n_decls; d++) {
        const wna16_tensor_t *t = wna16_tensor_set_find(set, L->decls[d].name);
        st = put(j, t->data, t->nbytes, err);
    }
    wna16_tensor_set_destroy(set);
    release_layer_pages(j, l);
    if (st == WNA16_OK)
        report(j, l + 1, L->prefix, true);
    return st;
}

/* Non-expert tensors, unchanged, straight from the mapped checkpoint. */
static wna16_status_t copy_tensors(rp_job_t *j, wna16_error_t *err)
{
    wna16_status_t st = WNA16_OK;
    for (size_t i = 0; st == WNA16_OK && j->o->all_tensors &&
                       i < wna16_checkpoint_tensor_count(j->ck); i++) {
        if (j->owner[i] >= 0)
            continue;
        const wna16_tensor_t *t = wna16_checkpoint_tensor_at(j->ck, i);
        st = put(j, t->data, t->nbytes, err);
        release_pages(t->data, t->nbytes);
        if (st == WNA16_OK)
            report(j, 0, t->name, true);
    }
    return st;
}

/* ---- the directory's other files --------------------------------------------- */

/* A small file of the directory, written to its temporary (kept open
 * until the commit). */
static wna16_status_t small_file(rp_job_t *j, const char *leaf,
                                 const char *text, size_t n, w16_output_t *o,
                                 wna16_error_t *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", j->dir, leaf);
    wna16_status_t st = w16_output_open(j->ctx, &j->arena, path, o, err);
    for (size_t at = 0; st == WNA16_OK && at < n;) {
        ssize_t k = write(o->fd, text + at, n - at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            st = w16_err(err, WNA16_EIO, "%s: write failed: %s",
                         w16_output_name(o), k < 0 ? strerror(errno)
                                                   : "no progress");
        else
            at += (size_t)k;
    }
    return st;
}

typedef struct rp_name_shard {
    const char *name;
    size_t shard;
} rp_name_shard_t;

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const rp_name_shard_t *)a)->name,
                  ((const rp_name_shard_t *)b)->name);
}

/* model.safetensors.index.json: the total size and each tensor's shard,
 * names sorted as save_pretrained writes them. Freed with cJSON_free. */
static char *index_json(rp_job_t *j, wna16_error_t *err)
{
    size_t n = j->n_entries ? j->n_entries : 1;
    rp_name_shard_t *ns = w16_calloc(j->ctx, n, sizeof *ns);
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    cJSON *map = cJSON_CreateObject();
    char *text = NULL;
    uint64_t total = 0;
    for (size_t s = 0; s < j->n_shards; s++)
        total += j->shard_bytes[s];
    if (ns && root && meta && map) {
        for (size_t e = 0; e < j->n_entries; e++) {
            wna16_dtype_t dt;
            int nd;
            const int64_t *sh;
            uint64_t b;
            entry_decl(j, e, &ns[e].name, &dt, &nd, &sh, &b);
            ns[e].shard = j->entry_shard[e];
        }
        qsort(ns, j->n_entries, sizeof *ns, cmp_entry_name);
        bool ok = cJSON_AddNumberToObject(meta, "total_size",
                                          (double)total) != NULL;
        cJSON_AddItemToObject(root, "metadata", meta);
        meta = NULL;
        for (size_t e = 0; ok && e < j->n_entries; e++) {
            char leaf[64];
            shard_name(j, ns[e].shard, leaf, sizeof leaf);
            ok = cJSON_AddStringToObject(map, ns[e].name, leaf) != NULL;
        }
        cJSON_AddItemToObject(root, "weight_map", map);
        map = NULL;
        text = ok ? cJSON_Print(root) : NULL;
    }
    cJSON_Delete(root);
    cJSON_Delete(meta);
    cJSON_Delete(map);
    w16_free(j->ctx, ns, n * sizeof *ns);
    if (!text)
        w16_err_nomem(err, "writing model.safetensors.index.json");
    return text;
}

/* ---- the job, start to end ------------------------------------------------ */

/* The padded intermediate size the backend stores (metadata). */
static wna16_status_t padded_size(rp_job_t *j, wna16_error_t *err)
{
    w16_problem_t p = {j->E, j->H, j->I, j->quant.bits, j->quant.group_size,
                       j->quant.zero_point, j->quant.act_order, false,
                       .a8 = (int)j->quant.input_dtype};
    int64_t vars[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(j->backend, &p, WNA16_GEMM_W13, vars,
                                      err);
    j->IP = st == WNA16_OK ? (int32_t)vars[W16_VAR_IP] : 0;
    return st;
}

/* Is the output a checkpoint directory: a path ending in '/', or one that
 * names a directory (through links)? j->dir: the path without trailing
 * slashes. */
static wna16_status_t output_kind(rp_job_t *j, wna16_error_t *err)
{
    size_t n = strlen(j->out_path);
    struct stat st;
    j->dir_mode = (n && j->out_path[n - 1] == '/') ||
                  (stat(j->out_path, &st) == 0 && S_ISDIR(st.st_mode));
    if (!j->dir_mode)
        return WNA16_OK;
    while (n > 1 && j->out_path[n - 1] == '/')
        n--;
    if (n >= sizeof j->dir - 64)
        return w16_err(err, WNA16_ELIMIT, "%s: the directory's path is too "
                       "long", j->out_path);
    memcpy(j->dir, j->out_path, n);
    j->dir[n] = '\0';
    j->max_shard = j->o->max_shard_size ? j->o->max_shard_size
                                        : WNA16_DEFAULT_MAX_SHARD_SIZE;
    return WNA16_OK;
}

/* Everything up to an open checkpoint with its layers planned. */
static wna16_status_t prepare(rp_job_t *j, wna16_error_t *err)
{
    const wna16_repack_options_t *o = j->o;
    if (!o->backend)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_checkpoint: no "
                       "destination backend given");
    j->backend = wna16_spec_find(j->ctx, WNA16_SPEC_BACKEND, o->backend);
    if (!j->backend)
        return w16_err(err, WNA16_ENOTFOUND, "no backend spec named '%s'",
                       o->backend);
    wna16_status_t st = output_kind(j, err);
    if (st == WNA16_OK)
        st = wna16_checkpoint_open(j->ctx, j->ck_path, &j->ck, err);
    if (st == WNA16_OK && !j->dir_mode)
        st = check_out_path(j, err);
    if (st == WNA16_OK)
        st = resolve_quant(j, err);
    if (st == WNA16_OK)
        st = find_layers(j, err);
    if (st == WNA16_OK)
        st = classify(j, err);
    if (st == WNA16_OK)
        st = plan_layers(j, err);
    if (st == WNA16_OK)
        st = padded_size(j, err);
    if (st == WNA16_OK)
        st = plan_shards(j, err);
    if (st == WNA16_OK && j->dir_mode)
        st = check_out_dir(j, err);
    return st;
}

/* Every shard is complete in its temporary: the config and the index are
 * written to theirs, then all are renamed (shards, config, index last). A
 * failure before the first rename leaves none of them; one among the
 * renames removes the new files already renamed. */
static wna16_status_t commit_dir(rp_job_t *j, wna16_error_t *err)
{
    w16_output_t cfg = {.fd = -1, .slot = -1}, idx = {.fd = -1, .slot = -1};
    wna16_status_t st = w16_safetensors_writer_complete(j->w, err);
    j->done[j->cur_shard] = j->w;
    j->w = NULL;
    char src[4200];
    snprintf(src, sizeof src, "%s/config.json", j->ck_path);
    size_t cap = 0;
    struct stat cs;
    char *config = st == WNA16_OK && stat(j->ck_path, &cs) == 0 &&
                           S_ISDIR(cs.st_mode)
                       ? slurp(j->ctx, src, &cap) : NULL;
    if (st == WNA16_OK && config) /* carried over unchanged */
        st = small_file(j, "config.json", config, strlen(config), &cfg, err);
    char *index = st == WNA16_OK ? index_json(j, err) : NULL;
    if (st == WNA16_OK && !index)
        st = WNA16_ENOMEM;
    if (st == WNA16_OK)
        st = small_file(j, "model.safetensors.index.json", index,
                        strlen(index), &idx, err);
    size_t renamed = 0;
    for (size_t s = 0; st == WNA16_OK && s < j->n_shards; s++) {
        st = w16_safetensors_writer_commit(j->done[s], err);
        j->done[s] = NULL;
        renamed += st == WNA16_OK;
    }
    bool cfg_renamed = false;
    if (st == WNA16_OK && config)
        cfg_renamed = (st = w16_output_commit(&cfg, err)) == WNA16_OK;
    if (st == WNA16_OK)
        st = w16_output_commit(&idx, err);
    if (st != WNA16_OK) { /* the new files already in place go too */
        char path[4200], leaf[64];
        for (size_t s = 0; s < renamed; s++) {
            shard_name(j, s, leaf, sizeof leaf);
            snprintf(path, sizeof path, "%s/%s", j->dir, leaf);
            unlink(path);
        }
        snprintf(path, sizeof path, "%s/config.json", j->dir);
        if (cfg_renamed)
            unlink(path);
        w16_output_discard(&cfg);
        w16_output_discard(&idx);
    }
    if (st == WNA16_OK)
        remove_stale_shards(j);
    if (config)
        w16_free(j->ctx, config, cap);
    cJSON_free(index);
    return st;
}

/* Layer 0 is already repacked into `first`; creates the output, writes
 * everything and renames it into place. */
static wna16_status_t write_output(rp_job_t *j, wna16_tensor_set_t *first,
                                   wna16_error_t *err)
{
    wna16_status_t st = j->dir_mode ? make_out_dir(j, err) : WNA16_OK;
    if (st == WNA16_OK)
        st = write_layer(j, 0, first, err);
    else
        wna16_tensor_set_destroy(first);
    for (size_t l = 1; st == WNA16_OK && l < j->layers.count; l++) {
        wna16_tensor_set_t *set = NULL;
        report(j, l + 1, j->plan[l].prefix, false);
        st = repack_one(j, l, &set, err);
        if (st == WNA16_OK)
            st = write_layer(j, l, set, err);
    }
    if (st == WNA16_OK)
        st = copy_tensors(j, err);
    if (st == WNA16_OK && j->dir_mode)
        st = commit_dir(j, err);
    else if (st == WNA16_OK) {
        st = wna16_safetensors_writer_finish(j->w, err);
        j->w = NULL;
    }
    return st;
}

static void fill_summary(const rp_job_t *j, wna16_repack_summary_t *s)
{
    memset(s, 0, sizeof *s);
    s->format = j->fmt;
    s->backend = j->backend;
    s->quant = j->quant;
    for (size_t l = 0; l < j->layers.count; l++)
        s->quant.bias = s->quant.bias || j->plan[l].quant.bias;
    s->E = j->E;
    s->H = j->H;
    s->I = j->I;
    s->IP = j->IP;
    s->n_layers = j->layers.count;
    s->n_tensors = j->n_tensors;
    s->n_copied = j->n_copy;
    s->bytes = j->written;
    s->target = j->o->target;
    s->model_dtype = j->quant.model_dtype;
    snprintf(s->model_dtype_reason, sizeof s->model_dtype_reason, "%s",
             j->dtype_why);
    s->n_shards = j->n_shards;
}

/* Frees the job; after a failure, removes every temporary and a directory
 * this run created (rmdir: only when nothing else is in it). */
static void job_free(rp_job_t *j, bool failed)
{
    if (j->w)
        wna16_safetensors_writer_abort(j->w);
    size_t n = j->n_entries ? j->n_entries : 1;
    for (size_t s = 0; j->done && s < j->n_shards; s++)
        if (j->done[s])
            wna16_safetensors_writer_abort(j->done[s]);
    if (failed && j->dir_created)
        rmdir(j->dir);
    if (j->entry_shard) {
        w16_free(j->ctx, j->entry_shard, n * sizeof *j->entry_shard);
        w16_free(j->ctx, j->shard_first, (n + 1) * sizeof *j->shard_first);
        w16_free(j->ctx, j->shard_bytes, n * sizeof *j->shard_bytes);
        w16_free(j->ctx, j->done, n * sizeof *j->done);
    }
    w16_arena_free(&j->arena);
    w16_free(j->ctx, j->plan, j->layers.count * sizeof *j->plan);
    w16_free(j->ctx, j->owner, (wna16_checkpoint_tensor_count(j->ck)
                                    ? wna16_checkpoint_tensor_count(j->ck)
                                    : 1) * sizeof *j->owner);
    wna16_moe_layers_free(&j->layers);
    wna16_checkpoint_close(j->ck);
}

wna16_status_t wna16_repack_checkpoint(wna16_context_t *ctx,
                                       const char *checkpoint,
                                       const char *out_path,
                                       const wna16_repack_options_t *opts,
                                       wna16_repack_summary_t *summary,
                                       wna16_error_t *err)
{
    if (!ctx || !checkpoint || !out_path || !opts)
        return w16_err(err, WNA16_EINVAL, "wna16_repack_checkpoint: ctx, "
                       "checkpoint, out_path and opts are required");
    rp_job_t j = {.ctx = ctx, .o = opts, .ck_path = checkpoint,
                  .out_path = out_path};
    j.layers.ctx_ = ctx;
    w16_arena_init(&j.arena, ctx);
    wna16_status_t st = prepare(&j, err);
    wna16_tensor_set_t *first = NULL;
    if (st == WNA16_OK) {
        report(&j, 1, j.plan[0].prefix, false);
        st = repack_one(&j, 0, &first, err);
    }
    if (st == WNA16_OK)
        st = write_output(&j, first, err);
    if (st == WNA16_OK && summary)
        fill_summary(&j, summary);
    job_free(&j, st != WNA16_OK);
    return st;
}
