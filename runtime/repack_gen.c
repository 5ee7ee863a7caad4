/*
 * repack_gen.c - repack with generated kernels: for every destination
 * tensor of the layer, build the repack kernel from the two specs
 * (gen/build_repack.c), compile it for the target, point it at the source
 * tensors (a table of per-expert/projection tensors, or the one stacked
 * tensor) and run it. The checks that refuse what a layout cannot hold are
 * the reference's own (w16_check_holds), so both paths refuse alike.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "gen/build_repack.h"
#include "runtime/ref/ref.h"
#include "runtime/repack_gen.h"
#include "runtime/repack_plan.h"
#include "runtime/targets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The source tensors of one role: their dtype and a table of addresses.
 * The target gets them once per layer (put_table: copies on a GPU, the
 * host's own memory on the CPU) and the kernels read the table at addr. */
typedef struct src_role {
    wna16_dtype_t dtype;
    uint64_t *table;  /* host address of each tensor */
    size_t *bytes;    /* and its size */
    int slots;
    uint64_t addr;    /* the table on the target; 0 until put */
} src_role_t;

static void join(char *out, size_t n, const char *prefix, const char *rest)
{
    if (prefix && *prefix)
        snprintf(out, n, "%s.%s", prefix, rest);
    else
        snprintf(out, n, "%s", rest);
}

static const wna16_tensor_t *find_expert(const wna16_tensor_set_t *set,
                                         const char *prefix, int64_t e,
                                         const w16_spec_proj_t *proj,
                                         const w16_layout_t *l, char *name,
                                         size_t n)
{
    const wna16_tensor_t *t = NULL;
    for (int a = 0; a < proj->n_names && !t; a++) {
        char leaf[256];
        snprintf(leaf, sizeof leaf, "%lld.%s.%s", (long long)e,
                 proj->names[a], l->name);
        join(name, n, prefix, leaf);
        t = wna16_tensor_set_find(set, name);
    }
    if (!t) {
        char leaf[256];
        snprintf(leaf, sizeof leaf, "%lld.%s.%s", (long long)e,
                 proj->names[0], l->name);
        join(name, n, prefix, leaf);
    }
    return t;
}

/* Checks a source tensor against what the layout says it must be. */
static wna16_status_t check_source(const w16_layout_t *l, const int64_t *vars,
                                   const wna16_tensor_t *t, wna16_dtype_t want,
                                   wna16_error_t *err)
{
    bool dtype_ok = false;
    for (int i = 0; i < l->n_dtypes; i++)
        dtype_ok = dtype_ok || l->dtypes[i] == t->dtype;
    if (!dtype_ok || (want && t->dtype != want))
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': dtype %s is not what "
                       "the %s layout stores here", t->name,
                       wna16_dtype_name(t->dtype), w16_role_key(l->role));
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_status_t st = w16_layout_shape(l, vars, shape, err);
    if (st != WNA16_OK)
        return st;
    bool ok = t->ndim == l->ndim;
    size_t bytes = wna16_dtype_size(t->dtype);
    for (int d = 0; ok && d < l->ndim; d++) {
        ok = t->shape[d] == shape[d];
        bytes *= (size_t)shape[d];
    }
    if (!ok || t->nbytes < bytes) {
        char want_s[128] = "";
        for (int d = 0; d < l->ndim; d++)
            snprintf(want_s + strlen(want_s), sizeof want_s - strlen(want_s),
                     "%s%lld", d ? ", " : "", (long long)shape[d]);
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': the %s layout needs "
                       "shape [%s]", t->name, w16_role_key(l->role), want_s);
    }
    return WNA16_OK;
}

/* Finds every tensor of `role` for operand g and builds its table. */
static wna16_status_t gather_role(const wna16_spec_t *fmt,
                                  const wna16_tensor_set_t *set,
                                  const char *prefix, const w16_problem_t *p,
                                  wna16_gemm_t g, w16_role_t role,
                                  src_role_t *out, wna16_error_t *err)
{
    const w16_layout_t *l = fmt->layouts[role];
    if (!l)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout",
                       fmt->name, w16_role_key(role));
    int64_t vars[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(fmt, p, g, vars, err);
    if (st != WNA16_OK)
        return st;
    char name[600];
    if (fmt->stacked) {
        char leaf[200];
        snprintf(leaf, sizeof leaf, "%s_%s", g == WNA16_GEMM_W13 ? "w13" : "w2",
                 l->name);
        join(name, sizeof name, prefix, leaf);
        const wna16_tensor_t *t = wna16_tensor_set_find(set, name);
        if (!t)
            return w16_err(err, WNA16_ENOTFOUND, "tensor '%s' not found", name);
        if ((st = check_source(l, vars, t, 0, err)) != WNA16_OK)
            return st;
        out->dtype = t->dtype;
        out->slots = 1;
        out->table = malloc(sizeof(uint64_t));
        out->bytes = malloc(sizeof(size_t));
        if (!out->table || !out->bytes)
            return w16_err_nomem(err, "building a source table");
        out->table[0] = (uint64_t)(uintptr_t)t->data;
        out->bytes[0] = t->nbytes;
        return WNA16_OK;
    }
    const w16_spec_proj_t *projs[2] = {&fmt->proj_gate, &fmt->proj_up};
    if (g == WNA16_GEMM_W2)
        projs[0] = &fmt->proj_down;
    int np = g == WNA16_GEMM_W13 ? 2 : 1;
    out->slots = (int)p->E * np;
    out->table = calloc((size_t)out->slots, sizeof(uint64_t));
    out->bytes = calloc((size_t)out->slots, sizeof(size_t));
    if (!out->table || !out->bytes)
        return w16_err_nomem(err, "building a source table");
    for (int64_t e = 0; e < p->E; e++)
        for (int i = 0; i < np; i++) {
            const wna16_tensor_t *t = find_expert(set, prefix, e, projs[i], l,
                                                  name, sizeof name);
            if (!t)
                return w16_err(err, WNA16_ENOTFOUND, "tensor '%s' not found",
                               name);
            if ((st = check_source(l, vars, t, out->dtype, err)) != WNA16_OK)
                return st;
            out->dtype = t->dtype;
            out->table[e * np + i] = (uint64_t)(uintptr_t)t->data;
            out->bytes[e * np + i] = t->nbytes;
        }
    return WNA16_OK;
}

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct job {
    wna16_context_t *ctx;
    const w16_target_t *T;
    w16_stream_t *stream; /* the job's data and launches on T */
    const wna16_spec_t *src, *dst;
    const wna16_tensor_set_t *set;
    const char *prefix;
    w16_problem_t p;
    wna16_tensor_set_t *out;
    src_role_t roles[2][W16_ROLE_COUNT]; /* per operand */
    int32_t *perm[2]; /* act-order permutation per operand, or NULL */
    int32_t *read[2]; /* source row of each sorted row (differs from perm
                         when the source is itself sorted), or NULL */
    int32_t *src_perm[2]; /* a sorted source's own permutation */
    int32_t perm_k[2];    /* K of each permutation (E rows of K) */
    uint64_t aperm[2], aread[2]; /* perm and read on the target, or 0 */
    float scale_max[2]; /* largest stored scale (int16 scale codes) */
    /* host time (ms) to build and look up plans and to make the output
     * tensors, and the kernels launched: logged at info level */
    double t_build, t_out;
    int kernels;
} job_t;

static void src_role_free(src_role_t *sr)
{
    free(sr->table);
    free(sr->bytes);
    *sr = (src_role_t){0};
}

/* The permutation a kernel reads for operand g (see make_perm). */
static const int32_t *perm_for(const job_t *J, const w16_repack_request_t *req)
{
    return req->role == W16_ROLE_SORT_IDX || !J->read[req->gemm]
               ? J->perm[req->gemm] : J->read[req->gemm];
}

/* Runs the kernel of `req` (its block sums when `sums`) writing the
 * output at `dst` on the target. */
static wna16_status_t run_kernel(job_t *J, const w16_repack_request_t *req,
                                 bool sums, uint64_t dst, bool *sums_done,
                                 wna16_error_t *err)
{
    const w16_repack_plan_t *plan;
    double t0 = ms_now();
    wna16_status_t st = w16_repack_plan_get(J->ctx, J->T, req, sums, &plan,
                                            NULL, err);
    J->t_build += ms_now() - t0;
    if (st != WNA16_OK)
        return st;
    /* a codes kernel that writes the block sums in its own pass */
    *sums_done = plan->rk.sums_fused;
    const w16_repack_kernel_t *rk = &plan->rk;
    const w16_target_t *T = J->T;
    uint64_t args[3 + W16_ROLE_COUNT] = {dst};
    for (int r = 0; r < W16_ROLE_COUNT && st == WNA16_OK; r++) {
        if (rk->src_param[r] < 0)
            continue;
        src_role_t *sr = &J->roles[req->gemm][r];
        if (!sr->addr)
            st = T->put_table(J->stream, sr->slots, sr->table, sr->bytes,
                              &sr->addr, err);
        args[rk->src_param[r]] = sr->addr;
    }
    if (st == WNA16_OK && rk->perm_param >= 0) {
        const int32_t *perm = perm_for(J, req);
        uint64_t *a = perm == J->perm[req->gemm] ? &J->aperm[req->gemm]
                                                 : &J->aread[req->gemm];
        if (!*a)
            st = T->put(J->stream, perm, sizeof(int32_t) * (size_t)J->p.E *
                                             (size_t)J->perm_k[req->gemm],
                        a, err);
        args[rk->perm_param] = *a;
    }
    if (rk->scale_max_param >= 0) { /* an f32 scalar: its bits */
        uint32_t bits;
        memcpy(&bits, &J->scale_max[req->gemm], sizeof bits);
        args[rk->scale_max_param] = bits;
    }
    if (st != WNA16_OK)
        return st;
    J->kernels++;
    return T->launch(J->stream, plan->fn, args, plan->n_params,
                     rk->num_groups, plan->lanes, 0, err);
}

static wna16_status_t repack_operand(job_t *J, wna16_gemm_t g,
                                     wna16_error_t *err)
{
    int64_t dv[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(J->dst, &J->p, g, dv, err);
    if (st == WNA16_OK) /* the host takes the max: see the function */
        st = w16_scale_prepare_source(J->src, J->dst, J->set, J->prefix,
                                      &J->p, g, &J->scale_max[g], err);
    if (st != WNA16_OK)
        return st;
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = J->dst->layouts[r];
        if (!w16_layout_present(l, dv))
            continue;
        w16_repack_request_t req = {.src = J->src, .dst = J->dst,
                                    .problem = J->p, .gemm = g,
                                    .role = (w16_role_t)r,
                                    .sort_k = J->perm[g] != NULL,
                                    .word_blocks = J->T->word_blocks,
                                    .staged_tiles = J->T->staged_tiles};
        w16_role_t need[W16_REPACK_MAX_SOURCES];
        int nn = w16_repack_source_roles((w16_role_t)r, &J->p, need);
        for (int i = 0; i < nn; i++) {
            src_role_t *sr = &J->roles[g][need[i]];
            if (!sr->table &&
                (st = gather_role(J->src, J->set, J->prefix, &J->p, g, need[i],
                                  sr, err)) != WNA16_OK)
                return st;
            req.src_dtype[need[i]] = sr->dtype;
        }
        /* float values are the model's dtype after the loader's cast */
        bool cast = J->p.model_dtype && (r == W16_ROLE_SCALES ||
                                         r == W16_ROLE_BIAS);
        req.dst_dtype = w16_repack_dst_dtype(
            l, cast ? J->p.model_dtype
               : nn ? req.src_dtype[need[0]] : WNA16_DTYPE_INVALID);
        int64_t shape[W16_MAX_STORE_DIMS];
        if ((st = w16_layout_shape(l, dv, shape, err)) != WNA16_OK)
            return st;
        char leaf[200], name[600];
        snprintf(leaf, sizeof leaf, "%s_%s", g == WNA16_GEMM_W13 ? "w13" : "w2",
                 l->name);
        join(name, sizeof name, J->prefix, leaf);
        wna16_tensor_t *t = NULL;
        /* every word is written by the kernel: no zero fill */
        double t_out = ms_now();
        st = w16_tensor_set_add_uninit(J->out, name, req.dst_dtype, l->ndim,
                                       shape, &t, err);
        J->t_out += ms_now() - t_out;
        if (st == WNA16_OK && t->nbytes == 0)
            continue; /* an empty tensor, e.g. g_idx without act-order */
        uint64_t dst = 0;
        if (st == WNA16_OK)
            st = J->T->output(J->stream, t->data, t->nbytes, &dst, err);
        bool sums_done = false;
        if (st == WNA16_OK)
            st = run_kernel(J, &req, false, dst, &sums_done, err);
        if (st == WNA16_OK && l->sums_block_k && !sums_done)
            st = run_kernel(J, &req, true, dst, &sums_done, err);
        if (st == WNA16_OK)
            st = J->T->output_done(J->stream, dst, err);
        if (st != WNA16_OK) {
            if (t && t->data) /* never hand out unwritten memory */
                memset(t->data, 0, t->nbytes);
            return st;
        }
    }
    return WNA16_OK;
}

/* Whether the checkpoint carries zero points it does not use and g_idx
 * without act-order, from its tensors (as the reference decoder finds). */
static void detect_stored(job_t *J)
{
    src_role_t probe = {0};
    wna16_error_t e;
    if (!J->p.zp && J->src->layouts[W16_ROLE_QZEROS] &&
        gather_role(J->src, J->set, J->prefix, &J->p, WNA16_GEMM_W13,
                    W16_ROLE_QZEROS, &probe, &e) == WNA16_OK)
        J->p.zeros_stored = true;
    src_role_free(&probe);
    if (J->p.act_order || J->src->g_idx_params ||
        (J->src->layouts[W16_ROLE_G_IDX] &&
         gather_role(J->src, J->set, J->prefix, &J->p, WNA16_GEMM_W13,
                     W16_ROLE_G_IDX, &probe, &e) == WNA16_OK))
        J->p.g_idx_stored = true;
    src_role_free(&probe);
}

/* A sorted source (Marlin) stores g_idx sorted with its permutation: read
 * it and put q's g_idx back in checkpoint order. */
static wna16_status_t unsort_source(job_t *J, wna16_gemm_t g,
                                    wna16_qweight_t *q, wna16_error_t *err)
{
    size_t ek = (size_t)q->E * (size_t)q->K;
    J->src_perm[g] = malloc(sizeof(int32_t) * ek);
    int32_t *orig = malloc(sizeof(int32_t) * ek);
    if (!J->src_perm[g] || !orig) {
        free(orig);
        return w16_err_nomem(err, "reading the source's sort indices");
    }
    for (size_t i = 0; i < ek; i++)
        J->src_perm[g][i] = -1;
    wna16_status_t st = w16_decode_sort_indices(J->src, J->set, J->prefix,
                                                &J->p, g, J->src_perm[g], err);
    for (size_t i = 0; st == WNA16_OK && i < ek; i++) {
        int32_t k = J->src_perm[g][i];
        if (k < 0 || k >= q->K)
            st = w16_err(err, WNA16_EFORMAT, "%s: the source's act-order sort "
                         "indices are not a permutation", J->src->name);
        else
            orig[(i / (size_t)q->K) * (size_t)q->K + (size_t)k] = q->g_idx[i];
    }
    if (st == WNA16_OK)
        memcpy(q->g_idx, orig, sizeof(int32_t) * ek);
    free(orig);
    return st;
}

/* The act-order permutation of operand g: stable argsort of its g_idx. */
static wna16_status_t make_perm(job_t *J, wna16_gemm_t g, wna16_error_t *err)
{
    int64_t v[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(J->src, &J->p, g, v, err);
    if (st != WNA16_OK)
        return st;
    int32_t E = (int32_t)J->p.E, K = (int32_t)v[W16_VAR_K];
    J->perm_k[g] = K;
    wna16_qweight_t q = {.E = E, .N = (int32_t)(g == WNA16_GEMM_W13 ? 2 * J->p.I
                                                                  : J->p.H),
                         .K = K, .G = (int32_t)v[W16_VAR_G],
                         .bits = (int32_t)J->p.BITS,
                         .group_size = (int32_t)J->p.GS};
    q.g_idx = malloc(sizeof(int32_t) * (size_t)E * (size_t)K);
    J->perm[g] = malloc(sizeof(int32_t) * (size_t)E * (size_t)K);
    if (!q.g_idx || !J->perm[g]) {
        free(q.g_idx);
        return w16_err_nomem(err, "computing the act-order permutation");
    }
    st = w16_decode_role(J->src, J->set, J->prefix, &J->p, g, W16_ROLE_G_IDX,
                         false, &q, err);
    if (st == WNA16_OK && J->src->act_order_sort)
        st = unsort_source(J, g, &q, err);
    if (st == WNA16_OK)
        w16_sort_g_idx(q.g_idx, E, K, q.G, J->perm[g]);
    if (st == WNA16_OK && J->src->act_order_sort) {
        /* sorted row j reads source row inv(src_perm)[perm[j]] */
        size_t ek = (size_t)E * (size_t)K;
        int32_t *inv = malloc(sizeof(int32_t) * ek);
        J->read[g] = malloc(sizeof(int32_t) * ek);
        if (!inv || !J->read[g]) {
            free(inv);
            st = w16_err_nomem(err, "composing act-order permutations");
        } else {
            for (int32_t e = 0; e < E; e++)
                for (int32_t i = 0; i < K; i++)
                    inv[(size_t)e * K + J->src_perm[g][(size_t)e * K + i]] = i;
            for (size_t i = 0; i < ek; i++)
                J->read[g][i] = inv[(i / (size_t)K) * (size_t)K +
                                    (size_t)J->perm[g][i]];
            free(inv);
        }
    }
    free(q.g_idx);
    return st;
}

wna16_status_t w16_repack_layer_generated(wna16_context_t *ctx,
                                          const wna16_spec_t *src_format,
                                          const wna16_tensor_set_t *src,
                                          const char *prefix, int32_t E,
                                          int32_t H, int32_t I,
                                          const wna16_quant_desc_t *quant,
                                          const wna16_spec_t *dst,
                                          wna16_target_t target,
                                          wna16_tensor_set_t *out,
                                          wna16_error_t *err)
{
    const w16_target_t *T = NULL;
    void *inst = NULL;
    wna16_status_t st = w16_target_probe(ctx, target, &T, &inst, err);
    if (st != WNA16_OK)
        return st;
    job_t J = {.ctx = ctx, .T = T, .src = src_format, .dst = dst,
               .set = src, .prefix = prefix, .out = out,
               .p = {E, H, I, quant->bits, quant->group_size, quant->zero_point,
                     quant->act_order, quant->bias,
                     .a8 = (int)quant->input_dtype,
                     .model_dtype = quant->model_dtype}};
    st = T->stream_open(inst, ctx, &J.stream, err);
    int64_t v13[W16_VAR_COUNT];
    if (st == WNA16_OK)
        st = w16_spec_bind(dst, &J.p, WNA16_GEMM_W13, v13, err);
    if (st == WNA16_OK)
        detect_stored(&J);
    if (st == WNA16_OK)
        st = w16_check_decodable(src_format, &J.p, err);
    if (st == WNA16_OK)
        st = w16_check_holds(dst, &J.p, (int32_t)v13[W16_VAR_IP], err);
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        if (dst->act_order_sort && J.p.act_order)
            st = make_perm(&J, (wna16_gemm_t)g, err);
    if (st == WNA16_OK)
        st = repack_operand(&J, WNA16_GEMM_W13, err);
    if (st == WNA16_OK)
        st = repack_operand(&J, WNA16_GEMM_W2, err);
    if (J.stream)
        st = T->stream_close(J.stream, st, err);
    if (st == WNA16_OK)
        wna16_log(ctx, WNA16_LOG_INFO, "repack %s on %s: %d kernels; host "
                  "time: build and look up %.1f ms, output tensors %.1f ms",
                  prefix ? prefix : "", T->name, J.kernels, J.t_build,
                  J.t_out);
    for (int g = 0; g < 2; g++) {
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            src_role_free(&J.roles[g][r]);
        free(J.perm[g]);
        free(J.read[g]);
        free(J.src_perm[g]);
    }
    return st;
}
