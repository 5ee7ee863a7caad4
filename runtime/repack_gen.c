/*
 * repack_gen.c - repack with generated kernels: for every destination
 * tensor of the layer, build the repack kernel from the two specs
 * (gen/build_repack.c), compile it for the target, point it at the source
 * tensors (a table of per-expert/projection tensors, or the one stacked
 * tensor) and run it. The checks that refuse what a layout cannot hold are
 * the reference's own (w16_check_holds), so both paths refuse alike.
 */
#include "gen/build_repack.h"
#include "runtime/cpu/cpu.h"
#include "runtime/ref/ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

wna16_status_t w16_repack_layer_generated(wna16_context_t *ctx,
                                          const wna16_spec_t *src_format,
                                          const wna16_tensor_set_t *src,
                                          const char *prefix, int32_t E,
                                          int32_t H, int32_t I,
                                          const wna16_quant_desc_t *quant,
                                          const wna16_spec_t *dst,
                                          wna16_target_t target,
                                          wna16_tensor_set_t *out,
                                          wna16_error_t *err);

/* The source tensors of one role: their dtype and a table of addresses. */
typedef struct src_role {
    wna16_dtype_t dtype;
    uint64_t *table;
    int slots;
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
        if (!out->table)
            return w16_err_nomem(err, "building a source table");
        out->table[0] = (uint64_t)(uintptr_t)t->data;
        return WNA16_OK;
    }
    const w16_spec_proj_t *projs[2] = {&fmt->proj_gate, &fmt->proj_up};
    if (g == WNA16_GEMM_W2)
        projs[0] = &fmt->proj_down;
    int np = g == WNA16_GEMM_W13 ? 2 : 1;
    out->slots = (int)p->E * np;
    out->table = calloc((size_t)out->slots, sizeof(uint64_t));
    if (!out->table)
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
        }
    return WNA16_OK;
}

/* Which source roles a destination role reads. */
static int needed_roles(w16_role_t dst, const w16_problem_t *p, w16_role_t *r)
{
    int n = 0;
    switch (dst) {
    case W16_ROLE_WEIGHT:
        r[n++] = W16_ROLE_QWEIGHT;
        r[n++] = W16_ROLE_SCALES;
        if (p->zp)
            r[n++] = W16_ROLE_QZEROS;
        break;
    case W16_ROLE_QZEROS:
        if (p->zp || p->zeros_stored)
            r[n++] = W16_ROLE_QZEROS;
        break;
    case W16_ROLE_SORT_IDX:
        break; /* the permutation itself: a parameter, not a source */
    case W16_ROLE_G_IDX:
        if (p->act_order)
            r[n++] = W16_ROLE_G_IDX;
        break;
    case W16_ROLE_QWEIGHT: /* block sums (CPU) also need the zeros */
        r[n++] = W16_ROLE_QWEIGHT;
        if (p->zp)
            r[n++] = W16_ROLE_QZEROS;
        break;
    default:
        r[n++] = dst;
        break;
    }
    return n;
}

static wna16_dtype_t pick_dst_dtype(const w16_layout_t *l, wna16_dtype_t have)
{
    for (int i = 0; i < l->n_dtypes; i++)
        if (l->dtypes[i] == have)
            return have;
    return l->dtypes[0];
}

typedef struct job {
    wna16_context_t *ctx;
    w16_cpu_t *cpu;
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
} job_t;

/* The identity of a compiled kernel: its IR, printed (so any change in
 * what the builder generates changes the key by itself), plus the target
 * and the emitter's version (bump W16_CPU_EMITTER_VERSION when the CPU
 * lowering of the same IR changes). */
#define W16_CPU_EMITTER_VERSION 7

static wna16_status_t kernel_key(job_t *J, const kir_kernel_t *k,
                                 w16_key_t *key, wna16_error_t *err)
{
    w16_buf_t b;
    w16_buf_init(&b, J->ctx);
    kir_print(&b, k);
    if (b.failed) {
        w16_buf_free(&b);
        return w16_err_nomem(err, "keying a kernel");
    }
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 kernel");
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    w16_keyer_u64(&kr, W16_CPU_EMITTER_VERSION);
    w16_cpu_key(&kr, J->cpu);
    w16_keyer_bytes(&kr, b.data, b.len);
    *key = w16_keyer_done(&kr);
    w16_buf_free(&b);
    return WNA16_OK;
}

static wna16_status_t run_kernel(job_t *J, const w16_repack_request_t *req,
                                 bool sums, wna16_tensor_t *t,
                                 wna16_error_t *err)
{
    w16_repack_kernel_t rk;
    wna16_status_t st = sums ? w16_build_repack_sums(J->ctx, req, &rk, err)
                             : w16_build_repack(J->ctx, req, &rk, err);
    if (st != WNA16_OK)
        return st;
    w16_cpu_fn fn = NULL;
    w16_key_t key;
    st = kernel_key(J, rk.kernel, &key, err);
    if (st == WNA16_OK)
        st = w16_cpu_kernel(J->ctx, key, rk.kernel, &fn, err);
    if (st == WNA16_OK) {
        uint64_t args[2 + W16_ROLE_COUNT] = {(uint64_t)(uintptr_t)t->data};
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            if (rk.src_param[r] >= 0)
                args[rk.src_param[r]] =
                    (uint64_t)(uintptr_t)J->roles[req->gemm][r].table;
        if (rk.perm_param >= 0)
            args[rk.perm_param] = (uint64_t)(uintptr_t)(
                req->role == W16_ROLE_SORT_IDX || !J->read[req->gemm]
                    ? J->perm[req->gemm] : J->read[req->gemm]);
        w16_cpu_launch(J->cpu, fn, args, rk.num_groups);
    }
    w16_repack_kernel_free(&rk);
    return st;
}

static wna16_status_t repack_operand(job_t *J, wna16_gemm_t g,
                                     wna16_error_t *err)
{
    int64_t dv[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(J->dst, &J->p, g, dv, err);
    if (st != WNA16_OK)
        return st;
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = J->dst->layouts[r];
        if (!w16_layout_present(l, dv))
            continue;
        w16_repack_request_t req = {.src = J->src, .dst = J->dst,
                                    .problem = J->p, .gemm = g,
                                    .role = (w16_role_t)r,
                                    .sort_k = J->perm[g] != NULL};
        w16_role_t need[4];
        int nn = needed_roles((w16_role_t)r, &J->p, need);
        for (int i = 0; i < nn; i++) {
            src_role_t *sr = &J->roles[g][need[i]];
            if (!sr->table &&
                (st = gather_role(J->src, J->set, J->prefix, &J->p, g, need[i],
                                  sr, err)) != WNA16_OK)
                return st;
            req.src_dtype[need[i]] = sr->dtype;
        }
        req.dst_dtype = pick_dst_dtype(l, nn ? req.src_dtype[need[0]]
                                             : WNA16_DTYPE_INVALID);
        if (r == W16_ROLE_WEIGHT)
            req.dst_dtype = l->dtypes[0];
        int64_t shape[W16_MAX_STORE_DIMS];
        if ((st = w16_layout_shape(l, dv, shape, err)) != WNA16_OK)
            return st;
        char leaf[200], name[600];
        snprintf(leaf, sizeof leaf, "%s_%s", g == WNA16_GEMM_W13 ? "w13" : "w2",
                 l->name);
        join(name, sizeof name, J->prefix, leaf);
        wna16_tensor_t *t = NULL;
        /* every word is written by the kernel: no zero fill */
        st = w16_tensor_set_add_uninit(J->out, name, req.dst_dtype, l->ndim,
                                       shape, &t, err);
        if (st == WNA16_OK && t->nbytes == 0)
            continue; /* an empty tensor, e.g. g_idx without act-order */
        if (st == WNA16_OK)
            st = run_kernel(J, &req, false, t, err);
        if (st == WNA16_OK && l->sums_block_k)
            st = run_kernel(J, &req, true, t, err);
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
    free(probe.table);
    probe = (src_role_t){0};
    if (J->p.act_order ||
        (J->src->layouts[W16_ROLE_G_IDX] &&
         gather_role(J->src, J->set, J->prefix, &J->p, WNA16_GEMM_W13,
                     W16_ROLE_G_IDX, &probe, &e) == WNA16_OK))
        J->p.g_idx_stored = true;
    free(probe.table);
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
    if (target != WNA16_TARGET_CPU)
        return w16_err(err, WNA16_EUNAVAILABLE, "%s target unavailable: this "
                       "build generates repack kernels for the CPU only",
                       wna16_target_name(target));
    job_t J = {.ctx = ctx, .src = src_format, .dst = dst, .set = src,
               .prefix = prefix, .out = out,
               .p = {E, H, I, quant->bits, quant->group_size, quant->zero_point,
                     quant->act_order, quant->bias}};
    wna16_status_t st = w16_cpu_get(ctx, &J.cpu, err);
    int64_t v13[W16_VAR_COUNT];
    if (st == WNA16_OK)
        st = w16_spec_bind(dst, &J.p, WNA16_GEMM_W13, v13, err);
    if (st == WNA16_OK)
        detect_stored(&J);
    if (st == WNA16_OK)
        st = w16_check_holds(dst, &J.p, (int32_t)v13[W16_VAR_IP], err);
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        if (dst->act_order_sort && J.p.act_order)
            st = make_perm(&J, (wna16_gemm_t)g, err);
    if (st == WNA16_OK)
        st = repack_operand(&J, WNA16_GEMM_W13, err);
    if (st == WNA16_OK)
        st = repack_operand(&J, WNA16_GEMM_W2, err);
    for (int g = 0; g < 2; g++) {
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            free(J.roles[g][r].table);
        free(J.perm[g]);
        free(J.read[g]);
        free(J.src_perm[g]);
    }
    return st;
}
