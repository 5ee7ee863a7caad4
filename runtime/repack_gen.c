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
        if (p->zp)
            r[n++] = W16_ROLE_QZEROS;
        break;
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
} job_t;

/* Bump when the generator's output changes for the same inputs: it is part
 * of every cache key. */
#define W16_REPACK_GENERATOR_VERSION 1

/* Everything that determines a repack kernel's code. */
static w16_key_t request_key(job_t *J, const w16_repack_request_t *r,
                             bool sums)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 repack kernel");
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    w16_keyer_u64(&kr, W16_REPACK_GENERATOR_VERSION);
    w16_cpu_key(&kr, J->cpu);
    const wna16_spec_t *specs[2] = {r->src, r->dst};
    for (int i = 0; i < 2; i++) {
        w16_keyer_u64(&kr, specs[i]->content_hash[0]);
        w16_keyer_u64(&kr, specs[i]->content_hash[1]);
    }
    const w16_problem_t *p = &r->problem;
    int64_t fields[] = {p->E, p->H, p->I, p->BITS, p->GS, p->zp, p->act_order,
                        p->bias, r->gemm, r->role, r->dst_dtype, r->lanes,
                        sums};
    for (size_t i = 0; i < W16_ARRAY_LEN(fields); i++)
        w16_keyer_u64(&kr, (uint64_t)fields[i]);
    for (int i = 0; i < W16_ROLE_COUNT; i++)
        w16_keyer_u64(&kr, (uint64_t)r->src_dtype[i]);
    return w16_keyer_done(&kr);
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
    st = w16_cpu_kernel(J->ctx, request_key(J, req, sums), rk.kernel, &fn, err);
    if (st == WNA16_OK) {
        uint64_t args[1 + W16_ROLE_COUNT] = {(uint64_t)(uintptr_t)t->data};
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            if (rk.src_param[r] >= 0)
                args[rk.src_param[r]] =
                    (uint64_t)(uintptr_t)J->roles[req->gemm][r].table;
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
        if (r == W16_ROLE_SORT_IDX)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s: act-order sort "
                           "indices are not generated yet", J->dst->name);
        w16_repack_request_t req = {.src = J->src, .dst = J->dst,
                                    .problem = J->p, .gemm = g,
                                    .role = (w16_role_t)r};
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
        wna16_tensor_t *t;
        st = wna16_tensor_set_add_new(J->out, name, req.dst_dtype, l->ndim,
                                      shape, &t, err);
        if (st == WNA16_OK)
            st = run_kernel(J, &req, false, t, err);
        if (st == WNA16_OK && l->sums_block_k)
            st = run_kernel(J, &req, true, t, err);
        if (st != WNA16_OK)
            return st;
    }
    return WNA16_OK;
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
        st = w16_check_holds(dst, &J.p, (int32_t)v13[W16_VAR_IP], err);
    if (st == WNA16_OK)
        st = repack_operand(&J, WNA16_GEMM_W13, err);
    if (st == WNA16_OK)
        st = repack_operand(&J, WNA16_GEMM_W2, err);
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            free(J.roles[g][r].table);
    return st;
}
