/*
 * pack_manifest.c - the kernel pack manifest (`wna16 pack build`): read
 * strictly (unknown keys, wrong types and values outside their choices are
 * errors naming the file and JSON path, as spec/spec_load.c reports), then
 * expanded into the kernel requests the runtime makes for each family,
 * model shape and target: the repack kernels of runtime/repack_gen.c
 * (every destination tensor of a layer, with the source dtypes a
 * checkpoint in that format carries) and the fused-MoE stages of
 * runtime/moe_gen.c (input and combine, and each GEMM for the block sizes
 * it picks from), or on the cuda target the translation units of its own
 * tensor-core fused MoE (runtime/cuda/cuda_moe.c, gen/moe_cuda.h): both
 * GEMMs at every row of the backend's tiling table the device can pick
 * (mma.sync rows for every architecture, wgmma rows for sm_90a alone),
 * GEMM 1 with and without its split-K sums where its row splits K, and
 * the routing, gather and finalize pieces. A request the runtime makes
 * with the same shape and options has the same key, so the pack's kernel
 * is found.
 *
 *   {"name": "default",
 *    "targets": {"cpu": ["x86-64-v3", "x86-64-v4"],
 *                "cuda": ["sm_80", "sm_90a", "compute_80"]},
 *    "models": [{"name": "qwen3-30b-a3b", "experts": 128, "hidden": 2048,
 *                "intermediate": 768, "topk": 8, "dtype": "BF16"}],
 *    "families": [
 *      {"name": "gptq-to-marlin", "kind": "repack", "models": ["..."],
 *       "targets": ["cuda"], "from": ["gptq"], "to": ["marlin"],
 *       "bits": [4, 8], "group_size": [128], "zero_point": false,
 *       "act_order": [false, true], "bias": false, "scale_dtype": "F16",
 *       "input_dtype": "16bit"},
 *      {"name": "triton-moe", "kind": "moe", "models": ["..."],
 *       "targets": ["cpu"], "backend": "triton", "bits": [4, 8],
 *       "group_size": 128, "zero_point": false, "bias": false,
 *       "scale_dtype": "F16", "act_dtype": ["BF16", "F16"],
 *       "activation": ["silu"], "format": ["standard", "batched"]}]}
 *
 * Every family field but "name", "kind" and "models" may be one value or
 * a list (the family is their product); "targets" defaults to all of the
 * manifest's. "act_order" of a fused-MoE family is expanded for the CUDA
 * target's units and for the generated fused MoE (its kernels then read
 * g_idx and, where the backend stores K sorted, the sort indices; a
 * layout that holds no act order refuses it, counted as refused);
 * "format" does not change a CUDA unit (the batched
 * format and the expert map are kernel arguments), so one set of units
 * serves both. A model's "dtype" is the torch_dtype of the checkpoints the
 * pack serves (scales and biases are held in it, and it is part of every
 * request): a pack built for BF16 has nothing for a float16 model. Left
 * out, the kernels keep the checkpoint's scale dtype, which only a
 * checkpoint whose config names no dtype asks for.
 */
#define _POSIX_C_SOURCE 200809L
#include "pack.h"
#include "gen/request_key.h"
#include "runtime/ref/moe.h" /* the fused MoE's checks */
#include "runtime/ref/ref.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAXV 16

typedef struct ml {
    const char *file;
    wna16_error_t *err;
    wna16_status_t st;
    wna16_context_t *ctx;
} ml_t;

static bool fail(ml_t *L, const char *path, const char *fmt, ...)
    W16_PRINTF(3, 4);
static bool fail(ml_t *L, const char *path, const char *fmt, ...)
{
    if (L->st != WNA16_OK)
        return false;
    char what[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    L->st = w16_err(L->err, WNA16_ESPEC, "%s: %s: %s", L->file, path, what);
    return false;
}

static void sub(char *out, size_t n, const char *base, const char *key)
{
    snprintf(out, n, "%s.%s", base, key);
}

static void idx(char *out, size_t n, const char *base, int i)
{
    snprintf(out, n, "%s[%d]", base, i);
}

static bool check_keys(ml_t *L, const cJSON *obj, const char *path,
                       const char *const *keys)
{
    if (!cJSON_IsObject(obj))
        return fail(L, path, "expected an object");
    for (const cJSON *c = obj->child; c; c = c->next) {
        bool ok = false;
        for (int i = 0; keys[i] && !ok; i++)
            ok = strcmp(c->string, keys[i]) == 0;
        if (!ok) {
            char p[300], list[300] = "";
            sub(p, sizeof p, path, c->string);
            for (int i = 0; keys[i]; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list),
                         "%s%s", i ? ", " : "", keys[i]);
            return fail(L, p, "unknown key (expected one of: %s)", list);
        }
    }
    return true;
}

/* A field that is one value or a list of values: calls get(value, path)
 * for each, collecting up to MAXV. */
static int n_values(const cJSON *v) { return cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1; }

static const cJSON *value_at(const cJSON *v, int i, const char *path, char *p,
                             size_t n)
{
    if (!cJSON_IsArray(v)) {
        snprintf(p, n, "%s", path);
        return v;
    }
    idx(p, n, path, i);
    return cJSON_GetArrayItem(v, i);
}

static bool list_shape(ml_t *L, const cJSON *v, const char *path)
{
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0)
        return fail(L, path, "an empty list");
    if (n_values(v) > MAXV)
        return fail(L, path, "more than %d values", MAXV);
    return true;
}

static bool get_ints(ml_t *L, const cJSON *obj, const char *key,
                     const char *base, const long *choices, int n_choices,
                     long lo, long hi, long def, long *out, int *n)
{
    char path[300];
    sub(path, sizeof path, base, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        out[0] = def;
        *n = 1;
        return true;
    }
    if (!list_shape(L, v, path))
        return false;
    *n = n_values(v);
    for (int i = 0; i < *n; i++) {
        char p[320];
        const cJSON *e = value_at(v, i, path, p, sizeof p);
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(long)e->valuedouble)
            return fail(L, p, "expected an integer");
        long x = (long)e->valuedouble;
        bool ok = n_choices == 0 ? x >= lo && x <= hi : false;
        for (int c = 0; c < n_choices; c++)
            ok = ok || x == choices[c];
        if (!ok) {
            if (n_choices) {
                char list[120] = "";
                for (int c = 0; c < n_choices; c++)
                    snprintf(list + strlen(list), sizeof list - strlen(list),
                             "%s%ld", c ? ", " : "", choices[c]);
                return fail(L, p, "%ld is not one of %s", x, list);
            }
            return fail(L, p, "%ld is outside [%ld, %ld]", x, lo, hi);
        }
        out[i] = x;
    }
    return true;
}

static bool get_bools(ml_t *L, const cJSON *obj, const char *key,
                      const char *base, bool *out, int *n)
{
    char path[300];
    sub(path, sizeof path, base, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        out[0] = false;
        *n = 1;
        return true;
    }
    if (!list_shape(L, v, path))
        return false;
    *n = n_values(v);
    for (int i = 0; i < *n; i++) {
        char p[320];
        const cJSON *e = value_at(v, i, path, p, sizeof p);
        if (!cJSON_IsBool(e))
            return fail(L, p, "expected true or false");
        out[i] = cJSON_IsTrue(e);
    }
    return true;
}

/* Strings; `def` when absent (NULL: required). */
static bool get_strs(ml_t *L, const cJSON *obj, const char *key,
                     const char *base, const char *def, const char **out,
                     int *n)
{
    char path[300];
    sub(path, sizeof path, base, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        if (!def)
            return fail(L, base, "\"%s\" is required", key);
        out[0] = def;
        *n = 1;
        return true;
    }
    if (!list_shape(L, v, path))
        return false;
    *n = n_values(v);
    for (int i = 0; i < *n; i++) {
        char p[320];
        const cJSON *e = value_at(v, i, path, p, sizeof p);
        if (!cJSON_IsString(e) || !e->valuestring[0])
            return fail(L, p, "expected a non-empty string");
        out[i] = e->valuestring;
    }
    return true;
}

/* ---- targets and models ---------------------------------------------------- */

static bool load_targets(ml_t *L, const cJSON *v, pack_manifest_t *m)
{
    if (!cJSON_IsObject(v) || !v->child)
        return fail(L, "$.targets", "expected an object of target names, "
                    "each with a list of architectures");
    for (const cJSON *t = v->child; t; t = t->next) {
        char path[300];
        sub(path, sizeof path, "$.targets", t->string);
        const w16_target_t *T = w16_target_by_name(t->string);
        if (!T || !T->pack_compile) {
            char names[200];
            w16_target_names(names, sizeof names);
            return fail(L, path, "no target '%s' with kernel packs in this "
                        "build (it has %s)", t->string, names);
        }
        if (m->n_targets == (int)(sizeof m->targets / sizeof m->targets[0]))
            return fail(L, path, "too many targets");
        pack_target_t *pt = &m->targets[m->n_targets++];
        *pt = (pack_target_t){.T = T};
        const char *a[MAXV];
        int n;
        if (!get_strs(L, v, t->string, "$.targets", NULL, a, &n))
            return false;
        if (n > PACK_MAX_ARCHES)
            return fail(L, path, "more than %d architectures",
                        PACK_MAX_ARCHES);
        for (int i = 0; i < n; i++) {
            if (strlen(a[i]) >= sizeof pt->arches[0])
                return fail(L, path, "architecture '%s' is too long", a[i]);
            for (int j = 0; j < i; j++)
                if (strcmp(a[i], a[j]) == 0) {
                    char p[320];
                    idx(p, sizeof p, path, i);
                    return fail(L, p, "'%s' is listed twice", a[i]);
                }
            snprintf(pt->arches[i], sizeof pt->arches[i], "%s", a[i]);
        }
        pt->n_arches = n;
    }
    return true;
}

typedef struct model {
    const char *name;
    long E, H, I, topk;
    wna16_dtype_t dtype; /* the model's (torch_dtype); 0: none named */
} model_t;

static bool load_models(ml_t *L, const cJSON *v, model_t *out, int *n)
{
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return fail(L, "$.models", "expected a list of model shapes");
    if (cJSON_GetArraySize(v) > MAXV)
        return fail(L, "$.models", "more than %d models", MAXV);
    static const char *const keys[] = {"name", "experts", "hidden",
                                       "intermediate", "topk", "dtype", NULL};
    *n = 0;
    for (int i = 0; i < cJSON_GetArraySize(v); i++) {
        char path[64];
        idx(path, sizeof path, "$.models", i);
        const cJSON *o = cJSON_GetArrayItem(v, i);
        if (!check_keys(L, o, path, keys))
            return false;
        model_t *md = &out[(*n)++];
        const char *name[MAXV];
        int k;
        long x[MAXV];
        if (!get_strs(L, o, "name", path, NULL, name, &k))
            return false;
        if (k != 1)
            return fail(L, path, "\"name\" is one string");
        md->name = name[0];
        /* the model's dtype: scales and biases are held in it (vLLM's
         * params_dtype), as the runtime's repack does from torch_dtype */
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
        md->dtype = WNA16_DTYPE_INVALID;
        if (dt) {
            char p[128];
            sub(p, sizeof p, path, "dtype");
            if (cJSON_IsString(dt))
                md->dtype = wna16_dtype_from_name(dt->valuestring,
                                                  strlen(dt->valuestring));
            if (md->dtype != WNA16_DTYPE_F16 && md->dtype != WNA16_DTYPE_BF16)
                return fail(L, p, "expected \"F16\" or \"BF16\"");
        }
        for (int j = 0; j < i; j++)
            if (strcmp(out[j].name, md->name) == 0)
                return fail(L, path, "model '%s' is defined twice", md->name);
        const char *dims[] = {"experts", "hidden", "intermediate", "topk"};
        long *dst[] = {&md->E, &md->H, &md->I, &md->topk};
        const long hi[] = {1 << 16, 1 << 20, 1 << 20, 1024};
        for (int d = 0; d < 4; d++) {
            char p[128];
            sub(p, sizeof p, path, dims[d]);
            if (!cJSON_GetObjectItemCaseSensitive(o, dims[d]))
                return fail(L, path, "\"%s\" is required", dims[d]);
            if (!get_ints(L, o, dims[d], path, NULL, 0, 1, hi[d], 0, x, &k))
                return false;
            if (k != 1)
                return fail(L, p, "expected one integer");
            *dst[d] = x[0];
        }
    }
    return true;
}

/* ---- expansion ---------------------------------------------------------- */

static bool push(ml_t *L, pack_manifest_t *m, const pack_job_t *j)
{
    if (m->n_jobs == m->cap_jobs) {
        size_t nc = m->cap_jobs ? 2 * m->cap_jobs : 64;
        pack_job_t *nj = realloc(m->jobs, sizeof *nj * nc);
        if (!nj) {
            L->st = w16_err_nomem(L->err, "expanding the manifest");
            return false;
        }
        m->jobs = nj;
        m->cap_jobs = nc;
    }
    m->jobs[m->n_jobs++] = *j;
    return true;
}

static void refuse(pack_manifest_t *m, const char *family, const char *what,
                   const wna16_error_t *e)
{
    if (m->refused++ == 0)
        snprintf(m->first_refusal, sizeof m->first_refusal, "%s (%s): %s",
                 family, what, e->message);
}

static const wna16_spec_t *find_spec(ml_t *L, const char *name,
                                     wna16_spec_kind_t kind, const char *path)
{
    const wna16_spec_t *s = wna16_spec_find(L->ctx, kind, name);
    if (!s)
        fail(L, path, "no %s spec named '%s' (see 'wna16 specs list')",
             kind == WNA16_SPEC_FORMAT ? "format" : "backend", name);
    return s;
}

/* The repack kernels of one layer, as runtime/repack_gen.c requests them
 * for a checkpoint in `src`'s format. */
static bool expand_repack(ml_t *L, pack_manifest_t *m, const char *family,
                          const pack_target_t *t, const wna16_spec_t *src,
                          const wna16_spec_t *dst, w16_problem_t p,
                          wna16_dtype_t scale_dtype)
{
    /* what a checkpoint in the format carries besides what the math
     * reads (runtime/repack_gen.c: detect_stored); the model's dtype came
     * in p (model_dtype) */
    int64_t sv[W16_VAR_COUNT];
    wna16_error_t be;
    if (w16_spec_bind(src, &p, WNA16_GEMM_W13, sv, &be) == WNA16_OK) {
        /* a layout with a "when" the problem does not meet is absent from
         * the checkpoint (compressed-tensors' zero points without ZP) */
        p.zeros_stored = !p.zp &&
                         w16_layout_present(src->layouts[W16_ROLE_QZEROS], sv);
        p.g_idx_stored = p.act_order || src->g_idx_params ||
                         w16_layout_present(src->layouts[W16_ROLE_G_IDX], sv);
    }
    char what[200];
    snprintf(what, sizeof what, "%s to %s, %lld bits, group %lld%s%s, %s",
             src->name, dst->name, (long long)p.BITS, (long long)p.GS,
             p.zp ? ", zero points" : "", p.act_order ? ", act order" : "",
             t->T->name);
    wna16_error_t e;
    int64_t v13[W16_VAR_COUNT];
    if (w16_spec_bind(dst, &p, WNA16_GEMM_W13, v13, &e) != WNA16_OK ||
        w16_check_decodable(src, &p, &e) != WNA16_OK ||
        w16_check_holds(src, &p, (int32_t)p.I, &e) != WNA16_OK ||
        w16_check_holds(dst, &p, (int32_t)v13[W16_VAR_IP], &e) != WNA16_OK) {
        refuse(m, family, what, &e);
        return true;
    }
    for (int g = 0; g < 2; g++) {
        int64_t dv[W16_VAR_COUNT];
        if (w16_spec_bind(dst, &p, (wna16_gemm_t)g, dv, &e) != WNA16_OK) {
            refuse(m, family, what, &e);
            return true;
        }
        for (int r = 0; r < W16_ROLE_COUNT; r++) {
            const w16_layout_t *l = dst->layouts[r];
            if (!w16_layout_present(l, dv))
                continue;
            int64_t shape[W16_MAX_STORE_DIMS];
            if (w16_layout_shape(l, dv, shape, &e) != WNA16_OK) {
                refuse(m, family, what, &e);
                return true;
            }
            int64_t elems = 1;
            for (int d = 0; d < l->ndim; d++)
                elems *= shape[d];
            if (elems == 0)
                continue; /* an empty tensor: no kernel runs */
            pack_job_t j = {.target = t, .kind = PACK_REPACK,
                            .maybe_sums = l->sums_block_k != 0};
            snprintf(j.family, sizeof j.family, "%s", family);
            w16_repack_request_t *q = &j.repack;
            *q = (w16_repack_request_t){
                .src = src, .dst = dst, .problem = p, .gemm = (wna16_gemm_t)g,
                .role = (w16_role_t)r,
                .sort_k = dst->act_order_sort && p.act_order,
                .word_blocks = t->T->word_blocks,
                .staged_tiles = t->T->staged_tiles};
            w16_role_t need[W16_REPACK_MAX_SOURCES];
            int nn = w16_repack_source_roles((w16_role_t)r, &p, need);
            bool ok = true;
            for (int i = 0; i < nn; i++) {
                const w16_layout_t *sl = src->layouts[need[i]];
                if (!sl) {
                    ok = false;
                    break;
                }
                bool is_float = need[i] == W16_ROLE_SCALES ||
                                need[i] == W16_ROLE_BIAS;
                wna16_dtype_t d = sl->dtypes[0];
                for (int k = 0; is_float && k < sl->n_dtypes; k++)
                    if (sl->dtypes[k] == scale_dtype)
                        d = scale_dtype;
                q->src_dtype[need[i]] = d;
            }
            if (!ok)
                continue; /* the runtime fails alike: no such tensors */
            /* float values are the model's dtype after the loader's cast */
            bool cast = p.model_dtype && (r == W16_ROLE_SCALES ||
                                          r == W16_ROLE_BIAS);
            q->dst_dtype = w16_repack_dst_dtype(
                l, cast ? p.model_dtype
                   : nn ? q->src_dtype[need[0]] : WNA16_DTYPE_INVALID);
            if (!push(L, m, &j))
                return false;
        }
    }
    return true;
}

/* The fused-MoE kernels of runtime/moe_gen.c for one configuration. */
static bool expand_moe(ml_t *L, pack_manifest_t *m, const char *family,
                       const pack_target_t *t, const wna16_spec_t *backend,
                       w16_problem_t p, wna16_dtype_t scale_dtype,
                       wna16_dtype_t act_dtype, wna16_activation_t act,
                       bool batched, bool batched_weights, int32_t topk)
{
    char what[200];
    snprintf(what, sizeof what, "%s, %lld bits, group %lld%s, %s %s%s, %s",
             backend->name, (long long)p.BITS, (long long)p.GS,
             p.act_order ? ", act order" : "", wna16_activation_name(act),
             wna16_dtype_name(act_dtype), batched ? ", batched" : "",
             t->T->name);
    wna16_error_t e;
    if (!t->T->host_memory) {
        e = (wna16_error_t){.status = WNA16_EUNSUPPORTED};
        snprintf(e.message, sizeof e.message, "the generated fused MoE runs "
                 "where kernels address host memory (not %s)", t->T->name);
        refuse(m, family, what, &e);
        return true;
    }
    p.ungated = !wna16_activation_is_gated(act);
    w16_moe_request_t base = {.backend = backend, .problem = p,
                              .batched = batched,
                              .batched_weights = batched && batched_weights,
                              .topk = batched ? 1 : topk, .block_m = 1,
                              /* runtime/moe_gen.c: aligned tensors */
                              .qweight_align = 4};
    wna16_moe_params_init(&base.params);
    base.params.activation = act;
    base.params.act_dtype = act_dtype;
    /* the tensors the layer's kernels read (runtime/moe_gen.c,
     * layer_reads): act order adds g_idx, and the sort indices where the
     * backend stores K sorted */
    static const w16_role_t roles[6] = {W16_ROLE_QWEIGHT, W16_ROLE_SCALES,
                                        W16_ROLE_QZEROS, W16_ROLE_BIAS,
                                        W16_ROLE_G_IDX, W16_ROLE_SORT_IDX};
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 6; i++) {
            w16_role_t r = roles[i];
            const w16_layout_t *l = backend->layouts[r];
            if (!l || (r == W16_ROLE_QZEROS && !p.zp) ||
                (r == W16_ROLE_BIAS && !p.bias) ||
                (r == W16_ROLE_G_IDX && !p.act_order) ||
                (r == W16_ROLE_SORT_IDX &&
                 !(p.act_order && backend->act_order_sort)))
                continue;
            bool is_float = r == W16_ROLE_SCALES || r == W16_ROLE_BIAS;
            /* the dtype `wna16 repack` writes there */
            base.dtype[g][r] = w16_repack_dst_dtype(
                l, is_float ? scale_dtype : WNA16_DTYPE_I32);
        }
    int64_t v13[W16_VAR_COUNT];
    if (w16_spec_bind(backend, &p, WNA16_GEMM_W13, v13, &e) != WNA16_OK ||
        w16_check_holds(backend, &p, (int32_t)v13[W16_VAR_IP], &e) != WNA16_OK ||
        w16_moe_check(&base, &e) != WNA16_OK) {
        refuse(m, family, what, &e);
        return true;
    }
    /* runtime/moe_gen.c: input and combine at block size 1, each GEMM at
     * the block sizes its runs pick from */
    static const int block_sizes[] = {1, 2, 4};
    for (int s = 0; s < W16_MOE_STAGE_COUNT; s++) {
        bool gemm = s == W16_MOE_GEMM1 || s == W16_MOE_GEMM2;
        for (int b = 0; b < (gemm ? 3 : 1); b++) {
            pack_job_t j = {.target = t, .kind = PACK_MOE, .moe = base,
                            .stage = (w16_moe_stage_t)s};
            snprintf(j.family, sizeof j.family, "%s", family);
            j.moe.block_m = block_sizes[b];
            if (!push(L, m, &j))
                return false;
        }
    }
    return true;
}

/* ---- the CUDA target's own fused MoE ---------------------------------- */

/* The architectures of t a unit is not compiled for (pack_job_t's
 * skip_arches): a wgmma unit needs sm_90a's arch-specific instructions
 * (no other CUBIN or PTX can hold it); any other unit skips an sm_XYa
 * whose sm_XY is listed too (the same devices run it). */
static uint32_t unit_skip_arches(const pack_target_t *t, bool wgmma)
{
    uint32_t skip = 0;
    for (int a = 0; a < t->n_arches; a++) {
        const char *arch = t->arches[a];
        size_t len = strlen(arch);
        bool specific = len > 3 && strncmp(arch, "sm_", 3) == 0 &&
                        arch[len - 1] == 'a';
        bool keep;
        if (wgmma) {
            keep = strcmp(arch, "sm_90a") == 0;
        } else {
            keep = true;
            for (int b = 0; specific && b < t->n_arches && keep; b++)
                keep = !(strlen(t->arches[b]) == len - 1 &&
                         strncmp(t->arches[b], arch, len - 1) == 0);
        }
        if (!keep)
            skip |= 1u << a;
    }
    return skip;
}

static bool push_unit(ml_t *L, pack_manifest_t *m, const char *family,
                      const pack_target_t *t, const pack_job_t *proto)
{
    pack_job_t j = *proto;
    snprintf(j.family, sizeof j.family, "%s", family);
    j.target = t;
    j.kind = PACK_CUDA_UNIT;
    j.skip_arches = unit_skip_arches(t, !j.aux && j.cfg.wgmma);
    if (j.skip_arches == (1u << t->n_arches) - 1)
        return true; /* no listed architecture runs it (wgmma, no sm_90a) */
    return push(L, m, &j);
}

/* The units runtime/cuda/cuda_moe.c requests for one configuration: both
 * GEMMs at every block_m row of the tiling (its runs pick the row from
 * the routed slots per expert; wgmma rows only without act order), GEMM
 * 1 also with its split-K sums where the row splits K, and the routing,
 * gather and finalize pieces of the activation dtype (the act-order
 * checks at layer creation run float16's gather piece). */
static bool expand_cuda_moe(ml_t *L, pack_manifest_t *m, const char *family,
                            const pack_target_t *t,
                            const wna16_spec_t *backend, w16_problem_t p,
                            wna16_dtype_t scale_dtype,
                            wna16_dtype_t act_dtype, wna16_activation_t act)
{
    char what[200];
    snprintf(what, sizeof what, "%s, %lld bits, group %lld%s%s, %s %s, %s",
             backend->name, (long long)p.BITS, (long long)p.GS,
             p.zp ? ", zero points" : "", p.act_order ? ", act order" : "",
             wna16_activation_name(act), wna16_dtype_name(act_dtype),
             t->T->name);
    wna16_error_t e;
    /* the checks of wna16_cuda_moe_create and of a run */
    wna16_moe_params_t params;
    wna16_moe_params_init(&params);
    params.activation = act;
    params.act_dtype = act_dtype;
    w16_moe_operand_t op[2];
    int64_t v[W16_VAR_COUNT];
    wna16_status_t st = w16_moe_check_act_dtype(p.model_dtype, &params, &e);
    if (st == WNA16_OK && !wna16_activation_is_gated(act))
        st = w16_err(&e, WNA16_EUNSUPPORTED, "%s on CUDA: the tensor-core "
                     "fused MoE fuses a gated activation",
                     wna16_activation_name(act));
    if (st == WNA16_OK)
        st = w16_spec_bind(backend, &p, WNA16_GEMM_W13, v, &e);
    if (st == WNA16_OK)
        st = w16_check_holds(backend, &p, (int32_t)v[W16_VAR_IP], &e);
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        st = w16_moe_cuda_contract(backend, &p, (wna16_gemm_t)g, &op[g], &e);
    if (st == WNA16_OK && !backend->tiling)
        st = w16_err(&e, WNA16_EUNSUPPORTED, "%s: no \"tiling\" section",
                     backend->name);
    if (st != WNA16_OK) {
        refuse(m, family, what, &e);
        return true;
    }
    /* the tensors' dtypes: scales (and biases) in the model's dtype when
     * it names one (the repack casts them), else the family's */
    wna16_dtype_t sd = p.model_dtype ? p.model_dtype : scale_dtype;
    w16_moe_unit_quant_t q = {
        .bits = (int)p.BITS, .zp = p.zp, .act_order = p.act_order,
        .group_size = p.GS, .act_dtype = act_dtype, .scale_dtype = sd,
        .bias_dtype = p.bias ? sd : WNA16_DTYPE_F16, .activation = act};
    const w16_tiling_t *tl = backend->tiling;
    for (int r = 0; r < tl->n_bm; r++) {
        int bm = tl->bm[r].block_m;
        bool wgmma = tl->bm[r].wgmma;
        bool again = false; /* an earlier row of the same block_m and kind */
        for (int o = 0; o < r && !again; o++)
            again = tl->bm[o].block_m == bm && tl->bm[o].wgmma == wgmma;
        if (again || (wgmma && p.act_order))
            continue;
        /* the units that route their own row block (self_route): runs
         * of at most 32 slots, so at most 32 a local expert, without act
         * order (runtime/cuda/cuda_moe.c) */
        bool rt = !wgmma && !p.act_order && w16_moe_cuda_self_route_row(backend, bm, p.E);
        for (int g = 0; g < 2; g++) {
            pack_job_t j = {.kind = PACK_CUDA_UNIT};
            if (w16_moe_cuda_cfg(backend, &op[g], &q, bm, wgmma,
                                 (wna16_gemm_t)g, &j.cfg, NULL, &e) !=
                WNA16_OK) {
                refuse(m, family, what, &e);
                continue;
            }
            int max_split, cps;
            w16_moe_cuda_split(backend, bm, wgmma, (wna16_gemm_t)g, op[g].N,
                               op[g].K, &max_split, &cps);
            bool ss = g == WNA16_GEMM_W13 && !wgmma && max_split > 1 &&
                      op[g].K / j.cfg.block_k > 1;
            for (int k = 0; k < 4; k++) {
                j.cfg.split_sums = k & 1;
                j.cfg.self_route = k & 2;
                if ((j.cfg.split_sums && !ss) || (j.cfg.self_route && !rt))
                    continue;
                if (!push_unit(L, m, family, t, &j))
                    return false;
            }
        }
    }
    for (int piece = 0; piece < W16_AUX_PIECES; piece++) {
        pack_job_t j = {.aux = true, .piece = piece, .act_dtype = act_dtype};
        if (!push_unit(L, m, family, t, &j))
            return false;
    }
    if (p.act_order) {
        pack_job_t j = {.aux = true, .piece = W16_AUX_PIECE_GATHER_FINALIZE,
                        .act_dtype = WNA16_DTYPE_F16};
        if (!push_unit(L, m, family, t, &j))
            return false;
    }
    return true;
}

w16_key_t pack_job_key(const pack_job_t *j)
{
    switch (j->kind) {
    case PACK_MOE: return w16_moe_request_key(&j->moe, j->stage);
    case PACK_CUDA_UNIT:
        return j->aux ? w16_moe_cuda_aux_key(j->act_dtype, j->piece)
                      : w16_moe_cuda_gemm_key(&j->cfg);
    case PACK_REPACK: break;
    }
    return w16_repack_request_key(&j->repack, false);
}

wna16_status_t pack_cuda_unit_source(const pack_job_t *j, char *name,
                                     size_t name_size, char *symbol,
                                     size_t symbol_size, w16_buf_t *b,
                                     wna16_error_t *err)
{
    wna16_status_t st;
    if (j->aux) {
        int first, n;
        w16_moe_aux_range(j->piece, &first, &n);
        snprintf(name, name_size, "%s", w16_moe_aux_unit(j->act_dtype,
                                                         j->piece));
        snprintf(symbol, symbol_size, "%s", w16_moe_aux_names[first]);
        st = w16_moe_aux_source(j->act_dtype, j->piece, b, err);
    } else {
        w16_moe_gemm_name(&j->cfg, name, name_size);
        snprintf(symbol, symbol_size, "%s", name);
        st = w16_moe_gemm_source(&j->cfg, b, err);
    }
    if (st == WNA16_OK && b->failed)
        st = w16_err_nomem(err, "writing a CUDA unit");
    return st;
}

static const char *const family_keys[] = {
    "name", "kind", "models", "targets", "from", "to", "backend", "bits",
    "group_size", "zero_point", "act_order", "bias", "scale_dtype",
    "input_dtype", "act_dtype", "activation", "format", NULL};

static bool get_dtypes(ml_t *L, const cJSON *f, const char *key,
                       const char *path, const char *def, wna16_dtype_t *out,
                       int *n)
{
    const char *s[MAXV];
    if (!get_strs(L, f, key, path, def, s, n))
        return false;
    for (int i = 0; i < *n; i++) {
        out[i] = wna16_dtype_from_name(s[i], strlen(s[i]));
        if (out[i] != WNA16_DTYPE_F16 && out[i] != WNA16_DTYPE_BF16) {
            char p[320], q[300];
            sub(q, sizeof q, path, key);
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(f, key);
            value_at(v, i, q, p, sizeof p);
            return fail(L, p, "'%s' is not F16 or BF16", s[i]);
        }
    }
    return true;
}

static bool load_family(ml_t *L, const cJSON *f, const char *path,
                        pack_manifest_t *m, const model_t *models,
                        int n_models)
{
    if (!check_keys(L, f, path, family_keys))
        return false;
    const char *name[MAXV], *kind[MAXV];
    int n;
    if (!get_strs(L, f, "name", path, NULL, name, &n) ||
        !get_strs(L, f, "kind", path, NULL, kind, &n))
        return false;
    char kpath[300];
    sub(kpath, sizeof kpath, path, "kind");
    bool repack = strcmp(kind[0], "repack") == 0;
    if (n != 1 || (!repack && strcmp(kind[0], "moe") != 0))
        return fail(L, kpath, "expected \"repack\" or \"moe\"");
    /* keys of the other kind are errors, not ignored */
    static const char *const not_repack[] = {"backend", "act_dtype",
                                             "activation", "format", NULL};
    static const char *const not_moe[] = {"from", "to", "input_dtype", NULL};
    const char *const *other = repack ? not_repack : not_moe;
    for (int i = 0; other[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(f, other[i])) {
            char p[300];
            sub(p, sizeof p, path, other[i]);
            return fail(L, p, "not a key of a %s family", kind[0]);
        }
    /* models */
    const char *mn[MAXV];
    int n_m;
    if (!get_strs(L, f, "models", path, NULL, mn, &n_m))
        return false;
    const model_t *fm[MAXV];
    for (int i = 0; i < n_m; i++) {
        fm[i] = NULL;
        for (int j = 0; j < n_models && !fm[i]; j++)
            if (strcmp(models[j].name, mn[i]) == 0)
                fm[i] = &models[j];
        if (!fm[i]) {
            char p[320], q[300];
            sub(q, sizeof q, path, "models");
            value_at(cJSON_GetObjectItemCaseSensitive(f, "models"), i, q, p,
                     sizeof p);
            return fail(L, p, "no model named '%s' in $.models", mn[i]);
        }
    }
    /* targets (default: all) */
    const pack_target_t *ft[8];
    int n_t = 0;
    const cJSON *tv = cJSON_GetObjectItemCaseSensitive(f, "targets");
    if (!tv) {
        for (int i = 0; i < m->n_targets; i++)
            ft[n_t++] = &m->targets[i];
    } else {
        const char *tn[MAXV];
        if (!get_strs(L, f, "targets", path, NULL, tn, &n_t))
            return false;
        for (int i = 0; i < n_t; i++) {
            ft[i] = NULL;
            for (int j = 0; j < m->n_targets && !ft[i]; j++)
                if (strcmp(m->targets[j].T->name, tn[i]) == 0)
                    ft[i] = &m->targets[j];
            if (!ft[i]) {
                char p[320], q[300];
                sub(q, sizeof q, path, "targets");
                value_at(tv, i, q, p, sizeof p);
                return fail(L, p, "'%s' is not a target of $.targets", tn[i]);
            }
        }
    }
    static const long bit_choices[] = {4, 8};
    long bits[MAXV], gs[MAXV];
    bool zp[MAXV], ao[MAXV], bias[MAXV];
    int n_b, n_g, n_zp, n_ao = 1, n_bias;
    wna16_dtype_t sd[MAXV];
    int n_sd;
    ao[0] = false;
    if (!get_ints(L, f, "bits", path, bit_choices, 2, 0, 0, 4, bits, &n_b) ||
        !get_ints(L, f, "group_size", path, NULL, 0, -1, 1 << 20, 128, gs, &n_g) ||
        !get_bools(L, f, "zero_point", path, zp, &n_zp) ||
        !get_bools(L, f, "bias", path, bias, &n_bias) ||
        !get_dtypes(L, f, "scale_dtype", path, "F16", sd, &n_sd))
        return false;
    for (int i = 0; i < n_g; i++)
        if (gs[i] == 0) {
            char p[300];
            sub(p, sizeof p, path, "group_size");
            return fail(L, p, "0 is not -1 or a positive group size");
        }
    if (repack) {
        const char *from[MAXV], *to[MAXV], *in[MAXV];
        int n_f, n_to, n_in;
        if (!get_bools(L, f, "act_order", path, ao, &n_ao) ||
            !get_strs(L, f, "from", path, NULL, from, &n_f) ||
            !get_strs(L, f, "to", path, NULL, to, &n_to) ||
            !get_strs(L, f, "input_dtype", path, "16bit", in, &n_in))
            return false;
        const wna16_spec_t *sf[MAXV], *st[MAXV];
        int a8[MAXV];
        char q[300], p[320];
        sub(q, sizeof q, path, "from");
        for (int i = 0; i < n_f; i++) {
            value_at(cJSON_GetObjectItemCaseSensitive(f, "from"), i, q, p, sizeof p);
            if (!(sf[i] = find_spec(L, from[i], WNA16_SPEC_FORMAT, p)))
                return false;
        }
        sub(q, sizeof q, path, "to");
        for (int i = 0; i < n_to; i++) {
            value_at(cJSON_GetObjectItemCaseSensitive(f, "to"), i, q, p, sizeof p);
            if (!(st[i] = find_spec(L, to[i], WNA16_SPEC_BACKEND, p)))
                return false;
        }
        sub(q, sizeof q, path, "input_dtype");
        for (int i = 0; i < n_in; i++) {
            a8[i] = (int)wna16_input_dtype_from_name(in[i]);
            if (a8[i] < 0) {
                value_at(cJSON_GetObjectItemCaseSensitive(f, "input_dtype"), i,
                         q, p, sizeof p);
                return fail(L, p, "'%s' is not 16bit, int8 or fp8", in[i]);
            }
        }
        for (int a = 0; a < n_f; a++) for (int b = 0; b < n_to; b++)
        for (int c = 0; c < n_b; c++) for (int d = 0; d < n_g; d++)
        for (int e = 0; e < n_zp; e++) for (int g = 0; g < n_ao; g++)
        for (int h = 0; h < n_bias; h++) for (int i = 0; i < n_sd; i++)
        for (int j = 0; j < n_in; j++) for (int k = 0; k < n_m; k++)
        for (int t = 0; t < n_t; t++) {
            w16_problem_t pr = {fm[k]->E, fm[k]->H, fm[k]->I, bits[c], gs[d],
                                zp[e], ao[g], bias[h], .a8 = a8[j],
                                .model_dtype = fm[k]->dtype};
            if (!expand_repack(L, m, name[0], ft[t], sf[a], st[b], pr, sd[i]))
                return false;
        }
        return true;
    }
    const char *be[MAXV], *acts[MAXV], *fmt[MAXV];
    int n_be, n_act, n_fmt, n_ad;
    wna16_dtype_t ad[MAXV];
    if (!get_strs(L, f, "backend", path, NULL, be, &n_be) ||
        !get_dtypes(L, f, "act_dtype", path, "BF16", ad, &n_ad) ||
        !get_strs(L, f, "activation", path, "silu", acts, &n_act) ||
        !get_strs(L, f, "format", path, "standard", fmt, &n_fmt) ||
        !get_bools(L, f, "act_order", path, ao, &n_ao))
        return false;
    const wna16_spec_t *sb[MAXV];
    wna16_activation_t av[MAXV];
    bool bat[MAXV];
    char q[300], p[320];
    sub(q, sizeof q, path, "backend");
    for (int i = 0; i < n_be; i++) {
        value_at(cJSON_GetObjectItemCaseSensitive(f, "backend"), i, q, p, sizeof p);
        if (!(sb[i] = find_spec(L, be[i], WNA16_SPEC_BACKEND, p)))
            return false;
    }
    sub(q, sizeof q, path, "activation");
    for (int i = 0; i < n_act; i++) {
        av[i] = wna16_activation_from_name(acts[i]);
        if (!wna16_activation_name(av[i])) {
            value_at(cJSON_GetObjectItemCaseSensitive(f, "activation"), i, q,
                     p, sizeof p);
            return fail(L, p, "'%s' is not an activation wna16 knows", acts[i]);
        }
    }
    sub(q, sizeof q, path, "format");
    for (int i = 0; i < n_fmt; i++) {
        bat[i] = strcmp(fmt[i], "batched") == 0;
        if (!bat[i] && strcmp(fmt[i], "standard") != 0) {
            value_at(cJSON_GetObjectItemCaseSensitive(f, "format"), i, q, p,
                     sizeof p);
            return fail(L, p, "'%s' is not \"standard\" or \"batched\"", fmt[i]);
        }
    }
    for (int a = 0; a < n_be; a++) for (int c = 0; c < n_b; c++)
    for (int d = 0; d < n_g; d++) for (int e = 0; e < n_zp; e++)
    for (int o = 0; o < n_ao; o++)
    for (int h = 0; h < n_bias; h++) for (int i = 0; i < n_sd; i++)
    for (int j = 0; j < n_ad; j++) for (int x = 0; x < n_act; x++)
    for (int y = 0; y < n_fmt; y++) for (int k = 0; k < n_m; k++)
    for (int w = 0; w < (bat[y] ? 2 : 1); w++) /* batched: weights or not */
    for (int t = 0; t < n_t; t++) {
        /* the cuda target runs its own fused MoE (runtime/cuda/cuda_moe.c),
         * whose units the format and its weights do not change */
        if (ft[t]->T->id == WNA16_TARGET_CUDA) {
            if (y > 0 || w > 0)
                continue;
            w16_problem_t pr = {fm[k]->E, fm[k]->H, fm[k]->I, bits[c], gs[d],
                                zp[e], ao[o], bias[h],
                                .model_dtype = fm[k]->dtype};
            if (!expand_cuda_moe(L, m, name[0], ft[t], sb[a], pr, sd[i],
                                 ad[j], av[x]))
                return false;
            continue;
        }
        w16_problem_t pr = {fm[k]->E, fm[k]->H, fm[k]->I, bits[c], gs[d],
                            zp[e], ao[o], bias[h]};
        if (!expand_moe(L, m, name[0], ft[t], sb[a], pr, sd[i], ad[j], av[x],
                        bat[y], w == 0, (int32_t)fm[k]->topk))
            return false;
    }
    return true;
}

wna16_status_t pack_manifest_load(wna16_context_t *ctx, const char *path,
                                  pack_manifest_t *m, wna16_error_t *err)
{
    memset(m, 0, sizeof *m);
    ml_t L = {.file = path, .err = err, .ctx = ctx};
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return w16_err(err, errno == ENOENT ? WNA16_ENOTFOUND : WNA16_EIO,
                       "%s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *nt = realloc(text, cap);
            if (!nt) {
                free(text);
                fclose(fp);
                return w16_err_nomem(err, "reading the manifest");
            }
            text = nt;
        }
        size_t r = fread(text + len, 1, 4096, fp);
        len += r;
        if (r < 4096)
            break;
    }
    bool read_err = ferror(fp);
    fclose(fp);
    if (read_err) {
        free(text);
        return w16_err(err, WNA16_EIO, "%s: read error", path);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t off = end ? (size_t)(end - text) : 0, line = 1;
        for (size_t i = 0; i < off && i < len; i++)
            line += text[i] == '\n';
        free(text);
        return w16_err(err, WNA16_ESPEC, "%s: not valid JSON (near line %zu)",
                       path, line);
    }
    free(text);
    static const char *const keys[] = {"name", "targets", "models",
                                       "families", NULL};
    model_t models[MAXV];
    int n_models = 0;
    if (check_keys(&L, root, "$", keys)) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
        if (nm && (!cJSON_IsString(nm) || !nm->valuestring[0] ||
                   strlen(nm->valuestring) >= sizeof m->name))
            fail(&L, "$.name", "expected a non-empty string of at most %zu "
                 "characters", sizeof m->name - 1);
        else
            snprintf(m->name, sizeof m->name, "%s",
                     nm ? nm->valuestring : "pack");
    }
    if (L.st == WNA16_OK)
        load_targets(&L, cJSON_GetObjectItemCaseSensitive(root, "targets"), m);
    if (L.st == WNA16_OK)
        load_models(&L, cJSON_GetObjectItemCaseSensitive(root, "models"),
                    models, &n_models);
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(root, "families");
    if (L.st == WNA16_OK && (!cJSON_IsArray(fam) || !cJSON_GetArraySize(fam)))
        fail(&L, "$.families", "expected a list of kernel families");
    for (int i = 0; L.st == WNA16_OK && i < cJSON_GetArraySize(fam); i++) {
        char p[64];
        idx(p, sizeof p, "$.families", i);
        const cJSON *f = cJSON_GetArrayItem(fam, i);
        load_family(&L, f, p, m, models, n_models);
        /* family names are unique: they name the pack's kernels' origin */
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
        for (int j = 0; L.st == WNA16_OK && j < i; j++) {
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetArrayItem(fam, j), "name");
            if (strcmp(o->valuestring, fn->valuestring) == 0)
                fail(&L, p, "family '%s' is defined twice", fn->valuestring);
        }
    }
    /* the strings the jobs keep are copied; the tree can go */
    cJSON_Delete(root);
    if (L.st != WNA16_OK) {
        pack_manifest_free(m);
        return L.st;
    }
    return WNA16_OK;
}

void pack_manifest_free(pack_manifest_t *m)
{
    free(m->jobs);
    memset(m, 0, sizeof *m);
}
