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
#include "runtime/cpu/cpu.h"
#include "runtime/cuda/cuda_kernels.h"
#include "runtime/cuda/cuda_xfer.h"
#include "runtime/ref/ref.h"
#include "runtime/repack_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* The source tensors of one role: their dtype and a table of addresses.
 * On the GPU each tensor is copied to the device once per layer and the
 * kernels read a device table of device addresses. */
typedef struct src_role {
    wna16_dtype_t dtype;
    uint64_t *table;  /* host address of each tensor */
    size_t *bytes;    /* and its size */
    int slots;
    uint64_t dbase;   /* CUDA: one allocation holding every tensor */
    uint64_t *dev;    /* CUDA: device address of each tensor in it */
    uint64_t dtable;  /* CUDA: `dev` itself on the device */
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

/* The GPU side of a job. Three streams: uploads, kernels and copies back,
 * ordered by events. The copy back of a tensor is done while the kernels
 * of the next one run, and every host<->device copy goes through a ring of
 * pinned chunks (runtime/cuda/cuda_xfer.c). */
typedef struct gpu {
    w16_cuda_t *cuda;
    w16_cuda_xfer_t *xfer;
    w16_cuda_stream_t *up, *run, *down;
    w16_cuda_event_t *uploaded, *ran[2];
    int which;
    /* the tensor whose kernels were queued last, not yet copied back */
    wna16_tensor_t *pending;
    uint64_t pending_dst;
    w16_cuda_event_t *pending_ran;
    uint64_t dperm[2], dread[2]; /* device copies of the permutations */
    /* host time per phase (ms) and bytes moved, logged at info level */
    double t_build, t_up, t_down, t_out;
    double mb_up, mb_down;
    int kernels;
} gpu_t;

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct job {
    wna16_context_t *ctx;
    wna16_target_t target;
    w16_cpu_t *cpu;
    gpu_t gpu;
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
    float scale_max[2]; /* largest stored scale (int16 scale codes) */
} job_t;

static void src_role_free(src_role_t *sr, w16_cuda_t *cuda)
{
    w16_cuda_free(cuda, sr->dbase);
    w16_cuda_free(cuda, sr->dtable);
    free(sr->dev);
    free(sr->table);
    free(sr->bytes);
    *sr = (src_role_t){0};
}

static wna16_status_t gpu_open(job_t *J, wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    wna16_status_t st = w16_cuda_get(J->ctx, &G->cuda, err);
    if (st == WNA16_OK)
        st = w16_cuda_xfer_create(G->cuda, 0, 0, &G->xfer, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_create(G->cuda, &G->up, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_create(G->cuda, &G->run, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_create(G->cuda, &G->down, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_create(G->cuda, &G->uploaded, err);
    for (int i = 0; i < 2 && st == WNA16_OK; i++)
        st = w16_cuda_event_create(G->cuda, &G->ran[i], err);
    return st;
}

/* A device copy of host memory, queued on the upload stream. */
static wna16_status_t gpu_upload(job_t *J, const void *src, size_t bytes,
                                 uint64_t *dptr, wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    double t0 = ms_now();
    wna16_status_t st = w16_cuda_alloc(G->cuda, bytes, dptr, err);
    if (st == WNA16_OK)
        st = w16_cuda_xfer_upload(G->xfer, *dptr, src, bytes, G->up, err);
    G->t_up += ms_now() - t0;
    G->mb_up += (double)bytes / 1e6;
    return st;
}

/* Every tensor of a role in one device allocation (256-byte aligned
 * pieces), and the table of their addresses. */
static wna16_status_t gpu_upload_role(job_t *J, src_role_t *sr,
                                      wna16_error_t *err)
{
    if (sr->dtable)
        return WNA16_OK;
    gpu_t *G = &J->gpu;
    sr->dev = calloc((size_t)sr->slots, sizeof(uint64_t));
    if (!sr->dev)
        return w16_err_nomem(err, "building a device source table");
    size_t total = 0;
    for (int i = 0; i < sr->slots; i++)
        total += (sr->bytes[i] + 255) & ~(size_t)255;
    double t0 = ms_now();
    wna16_status_t st = w16_cuda_alloc(G->cuda, total, &sr->dbase, err);
    size_t off = 0;
    for (int i = 0; i < sr->slots && st == WNA16_OK; i++) {
        sr->dev[i] = sr->dbase + off;
        st = w16_cuda_xfer_upload(G->xfer, sr->dev[i],
                                  (const void *)(uintptr_t)sr->table[i],
                                  sr->bytes[i], G->up, err);
        off += (sr->bytes[i] + 255) & ~(size_t)255;
        G->mb_up += (double)sr->bytes[i] / 1e6;
    }
    G->t_up += ms_now() - t0;
    if (st == WNA16_OK)
        st = gpu_upload(J, sr->dev, sizeof(uint64_t) * (size_t)sr->slots,
                        &sr->dtable, err);
    return st;
}

static wna16_status_t gpu_sources_ready(job_t *J, wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    wna16_status_t st = w16_cuda_event_record(G->cuda, G->uploaded, G->up, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_wait_event(G->cuda, G->run, G->uploaded, err);
    return st;
}

/* Copies the pending tensor back (after its kernels) and frees it on the
 * device. */
static wna16_status_t gpu_finish_pending(job_t *J, wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    if (!G->pending)
        return WNA16_OK;
    double t0 = ms_now();
    wna16_status_t st = w16_cuda_stream_wait_event(G->cuda, G->down,
                                                   G->pending_ran, err);
    if (st == WNA16_OK)
        st = w16_cuda_xfer_download(G->xfer, G->pending->data, G->pending_dst,
                                    G->pending->nbytes, G->down, err);
    G->t_down += ms_now() - t0;
    G->mb_down += (double)G->pending->nbytes / 1e6;
    w16_cuda_stream_sync(G->cuda, G->down, NULL);
    w16_cuda_free(G->cuda, G->pending_dst);
    G->pending = NULL;
    G->pending_dst = 0;
    return st;
}

/* The kernels of tensor t are queued: copy the previous tensor back while
 * they run, and leave t pending. Takes ownership of ddst. */
static wna16_status_t gpu_output(job_t *J, wna16_tensor_t *t, uint64_t ddst,
                                 wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    w16_cuda_event_t *ran = G->ran[G->which];
    G->which ^= 1;
    wna16_status_t st = w16_cuda_event_record(G->cuda, ran, G->run, err);
    if (st == WNA16_OK)
        st = gpu_finish_pending(J, err);
    if (st != WNA16_OK) {
        w16_cuda_stream_sync(G->cuda, G->run, NULL);
        w16_cuda_free(G->cuda, ddst);
        return st;
    }
    G->pending = t;
    G->pending_dst = ddst;
    G->pending_ran = ran;
    return WNA16_OK;
}

/* Copies back what is pending (only when everything went well: after an
 * error the results are not wanted) and releases every GPU resource. */
static wna16_status_t gpu_close(job_t *J, wna16_status_t st,
                                wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    if (!G->cuda)
        return st;
    if (st == WNA16_OK)
        st = gpu_finish_pending(J, err);
    else if (G->pending) /* not copied back: never hand out unwritten memory */
        memset(G->pending->data, 0, G->pending->nbytes);
    if (st == WNA16_OK)
        wna16_log(J->ctx, WNA16_LOG_INFO, "repack %s on %s: %d kernels; host "
                  "time: build and look up %.1f ms, uploads %.1f ms (%.1f MB), "
                  "copies back %.1f ms (%.1f MB), output tensors %.1f ms",
                  J->prefix ? J->prefix : "", w16_cuda_device_name(G->cuda),
                  G->kernels, G->t_build, G->t_up, G->mb_up, G->t_down,
                  G->mb_down, G->t_out);
    /* nothing may still read or write what is freed below */
    w16_cuda_stream_sync(G->cuda, G->up, NULL);
    w16_cuda_stream_sync(G->cuda, G->run, NULL);
    w16_cuda_stream_sync(G->cuda, G->down, NULL);
    w16_cuda_free(G->cuda, G->pending_dst);
    for (int i = 0; i < 2; i++) {
        w16_cuda_event_destroy(G->cuda, G->ran[i]);
        w16_cuda_free(G->cuda, G->dperm[i]);
        w16_cuda_free(G->cuda, G->dread[i]);
    }
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            src_role_free(&J->roles[g][r], G->cuda);
    w16_cuda_xfer_destroy(G->xfer);
    w16_cuda_event_destroy(G->cuda, G->uploaded);
    w16_cuda_stream_destroy(G->cuda, G->up);
    w16_cuda_stream_destroy(G->cuda, G->run);
    w16_cuda_stream_destroy(G->cuda, G->down);
    return st;
}

/* The permutation a kernel reads for operand g (see make_perm). */
static const int32_t *perm_for(const job_t *J, const w16_repack_request_t *req)
{
    return req->role == W16_ROLE_SORT_IDX || !J->read[req->gemm]
               ? J->perm[req->gemm] : J->read[req->gemm];
}

static wna16_status_t launch_cuda(job_t *J, const w16_repack_request_t *req,
                                  const w16_repack_plan_t *plan,
                                  uint64_t ddst, wna16_error_t *err)
{
    gpu_t *G = &J->gpu;
    const w16_repack_kernel_t *rk = &plan->rk;
    wna16_status_t st = WNA16_OK;
    G->kernels++;
    uint64_t vals[3 + W16_ROLE_COUNT] = {ddst};
    for (int r = 0; r < W16_ROLE_COUNT && st == WNA16_OK; r++) {
        if (rk->src_param[r] < 0)
            continue;
        src_role_t *sr = &J->roles[req->gemm][r];
        st = gpu_upload_role(J, sr, err);
        vals[rk->src_param[r]] = sr->dtable;
    }
    if (st == WNA16_OK && rk->perm_param >= 0) {
        const int32_t *perm = perm_for(J, req);
        uint64_t *d = perm == J->perm[req->gemm] ? &G->dperm[req->gemm]
                                                 : &G->dread[req->gemm];
        if (!*d)
            st = gpu_upload(J, perm, sizeof(int32_t) * (size_t)J->p.E *
                                         (size_t)J->perm_k[req->gemm], d,
                                         err);
        vals[rk->perm_param] = *d;
    }
    if (st == WNA16_OK)
        st = gpu_sources_ready(J, err);
    if (st != WNA16_OK)
        return st;
    if (rk->num_groups > 0x7fffffff)
        return w16_err(err, WNA16_ELIMIT, "kernel %s: %lld workgroups exceed "
                       "a CUDA grid", plan->name, (long long)rk->num_groups);
    void *args[3 + W16_ROLE_COUNT];
    for (int i = 0; i < plan->n_params; i++)
        args[i] = &vals[i];
    float scale_max = J->scale_max[req->gemm];
    if (rk->scale_max_param >= 0) /* an f32 scalar */
        args[rk->scale_max_param] = &scale_max;
    return w16_cuda_launch(G->cuda, plan->cuda_fn, (unsigned)rk->num_groups,
                           (unsigned)plan->lanes, 0, G->run, args, err);
}

static wna16_status_t run_kernel(job_t *J, const w16_repack_request_t *req,
                                 bool sums, wna16_tensor_t *t, uint64_t ddst,
                                 bool *sums_done, wna16_error_t *err)
{
    const w16_repack_plan_t *plan;
    double t0 = ms_now();
    wna16_status_t st = w16_repack_plan_get(J->ctx, J->target, req, sums,
                                            &plan, NULL, err);
    J->gpu.t_build += ms_now() - t0;
    if (st != WNA16_OK)
        return st;
    /* a codes kernel that writes the block sums in its own pass */
    *sums_done = plan->rk.sums_fused;
    if (J->target == WNA16_TARGET_CUDA)
        return launch_cuda(J, req, plan, ddst, err);
    const w16_repack_kernel_t *rk = &plan->rk;
    uint64_t args[3 + W16_ROLE_COUNT] = {(uint64_t)(uintptr_t)t->data};
    for (int r = 0; r < W16_ROLE_COUNT; r++)
        if (rk->src_param[r] >= 0)
            args[rk->src_param[r]] =
                (uint64_t)(uintptr_t)J->roles[req->gemm][r].table;
    if (rk->perm_param >= 0)
        args[rk->perm_param] = (uint64_t)(uintptr_t)perm_for(J, req);
    if (rk->scale_max_param >= 0) { /* an f32 scalar: its bits */
        uint32_t bits;
        memcpy(&bits, &J->scale_max[req->gemm], sizeof bits);
        args[rk->scale_max_param] = bits;
    }
    w16_cpu_launch(J->cpu, plan->cpu_fn, args, rk->num_groups);
    return WNA16_OK;
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
                                    .word_blocks = J->target == WNA16_TARGET_CPU,
                                    .staged_tiles = J->target == WNA16_TARGET_CUDA};
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
        req.dst_dtype = w16_repack_dst_dtype(l, nn ? req.src_dtype[need[0]]
                                                   : WNA16_DTYPE_INVALID);
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
        J->gpu.t_out += ms_now() - t_out;
        if (st == WNA16_OK && t->nbytes == 0)
            continue; /* an empty tensor, e.g. g_idx without act-order */
        uint64_t ddst = 0;
        if (st == WNA16_OK && J->target == WNA16_TARGET_CUDA)
            st = w16_cuda_alloc(J->gpu.cuda, t->nbytes, &ddst, err);
        bool sums_done = false;
        if (st == WNA16_OK)
            st = run_kernel(J, &req, false, t, ddst, &sums_done, err);
        if (st == WNA16_OK && l->sums_block_k && !sums_done)
            st = run_kernel(J, &req, true, t, ddst, &sums_done, err);
        if (ddst && st == WNA16_OK)
            st = gpu_output(J, t, ddst, err); /* owns ddst now */
        else if (ddst) {
            w16_cuda_stream_sync(J->gpu.cuda, J->gpu.run, NULL);
            w16_cuda_free(J->gpu.cuda, ddst);
        }
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
    src_role_free(&probe, NULL);
    if (J->p.act_order ||
        (J->src->layouts[W16_ROLE_G_IDX] &&
         gather_role(J->src, J->set, J->prefix, &J->p, WNA16_GEMM_W13,
                     W16_ROLE_G_IDX, &probe, &e) == WNA16_OK))
        J->p.g_idx_stored = true;
    src_role_free(&probe, NULL);
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
    if (target != WNA16_TARGET_CPU && target != WNA16_TARGET_CUDA)
        return w16_err(err, WNA16_EUNAVAILABLE, "%s target unavailable: "
                       "repack kernels are generated for the CPU and CUDA",
                       wna16_target_name(target));
    job_t J = {.ctx = ctx, .target = target, .src = src_format, .dst = dst,
               .set = src, .prefix = prefix, .out = out,
               .p = {E, H, I, quant->bits, quant->group_size, quant->zero_point,
                     quant->act_order, quant->bias,
                     .a8 = (int)quant->input_dtype}};
    wna16_status_t st = target == WNA16_TARGET_CUDA
                            ? gpu_open(&J, err)
                            : w16_cpu_get(ctx, &J.cpu, err);
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
    st = gpu_close(&J, st, err);
    for (int g = 0; g < 2; g++) {
        for (int r = 0; r < W16_ROLE_COUNT; r++)
            src_role_free(&J.roles[g][r], NULL);
        free(J.perm[g]);
        free(J.read[g]);
        free(J.src_perm[g]);
    }
    return st;
}
