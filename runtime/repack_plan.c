/*
 * repack_plan.c - repack plans, memoized per context by request (see
 * repack_plan.h). The plans live in the context's memory-only cache, so
 * that N threads asking for one request build it once, like kernels.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "runtime/repack_plan.h"

#include "gen/request_key.h"
#include "runtime/cache/cache.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct plan_job {
    wna16_context_t *ctx;
    const w16_target_t *T;
    const w16_repack_request_t *req;
    bool sums;
    bool built;
} plan_job_t;

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Everything the builder reads from a request, field by field (struct
 * padding would make bytes-of-the-struct keys differ for equal requests);
 * a spec by the hash of its JSON, since its address may be reused. */
static w16_key_t request_key(const w16_target_t *T,
                             const w16_repack_request_t *r, bool sums)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 repack plan");
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    w16_keyer_u64(&kr, (uint64_t)T->id);
    w16_keyer_u64(&kr, sums);
    for (int i = 0; i < 2; i++) {
        w16_keyer_u64(&kr, r->src->content_hash[i]);
        w16_keyer_u64(&kr, r->dst->content_hash[i]);
    }
    const w16_problem_t *p = &r->problem;
    const int64_t dims[] = {p->E, p->H, p->I, p->BITS, p->GS, p->zp,
                            p->act_order, p->bias, p->zeros_stored,
                            p->g_idx_stored, p->a8, p->ungated};
    for (size_t i = 0; i < W16_ARRAY_LEN(dims); i++)
        w16_keyer_u64(&kr, (uint64_t)dims[i]);
    if (p->model_dtype)
        w16_keyer_u64(&kr, 0x6d6f64656c000000u | (uint64_t)p->model_dtype);
    w16_keyer_u64(&kr, (uint64_t)r->gemm);
    w16_keyer_u64(&kr, (uint64_t)r->role);
    for (int i = 0; i < W16_ROLE_COUNT; i++)
        w16_keyer_u64(&kr, (uint64_t)r->src_dtype[i]);
    w16_keyer_u64(&kr, (uint64_t)r->dst_dtype);
    w16_keyer_u64(&kr, (uint64_t)r->lanes);
    w16_keyer_u64(&kr, r->sort_k);
    w16_keyer_u64(&kr, r->word_blocks);
    w16_keyer_u64(&kr, r->staged_tiles);
    return w16_keyer_done(&kr);
}

static wna16_status_t plan_compile(void *user, w16_key_t key, void **blob,
                                   size_t *size, wna16_error_t *err)
{
    (void)key;
    plan_job_t *J = user;
    double t0 = ms_now();
    w16_repack_kernel_t rk;
    wna16_status_t st = J->sums ? w16_build_repack_sums(J->ctx, J->req, &rk, err)
                                : w16_build_repack(J->ctx, J->req, &rk, err);
    if (st != WNA16_OK)
        return st;
    w16_repack_plan_t *p = w16_alloc(J->ctx, sizeof *p);
    if (!p) {
        w16_repack_kernel_free(&rk);
        return w16_err_nomem(err, "building a repack plan");
    }
    *p = (w16_repack_plan_t){.rk = rk, .lanes = rk.kernel->lanes,
                             .n_params = rk.kernel->n_params,
                             .ctx = J->ctx};
    p->rk.kernel = NULL;
    snprintf(p->name, sizeof p->name, "%s", rk.kernel->name);
    p->target = J->T;
    /* kernel packs by request first, then the kernel cache by content */
    st = w16_target_kernel_req(J->ctx, J->T, "wna16 kernel",
                               w16_repack_request_key(J->req, J->sums),
                               rk.kernel, &p->fn, NULL, err);
    w16_repack_kernel_free(&rk);
    if (st != WNA16_OK) {
        w16_free(J->ctx, p, sizeof *p);
        return st;
    }
    p->compile_ms = ms_now() - t0;
    J->built = true;
    *blob = p;
    *size = sizeof *p;
    return WNA16_OK;
}

static wna16_status_t plan_load(void *user, const void *blob, size_t size,
                                void **handle, wna16_error_t *err)
{
    plan_job_t *J = user;
    if (size != sizeof(w16_repack_plan_t))
        return w16_err(err, WNA16_EINTERNAL, "repack plan of %zu bytes", size);
    w16_repack_plan_t *p = w16_alloc(J->ctx, sizeof *p);
    if (!p)
        return w16_err_nomem(err, "loading a repack plan");
    memcpy(p, blob, sizeof *p);
    *handle = p;
    return WNA16_OK;
}

/* The cache keeps the loader's user pointer for this call, which by then
 * is gone: the plan knows its context. */
static void plan_unload(void *user, void *handle)
{
    (void)user;
    w16_repack_plan_t *p = handle;
    w16_free(p->ctx, p, sizeof *p);
}

wna16_status_t w16_repack_plan_get(wna16_context_t *ctx, const w16_target_t *T,
                                   const w16_repack_request_t *req, bool sums,
                                   const w16_repack_plan_t **out, bool *built,
                                   wna16_error_t *err)
{
    *out = NULL;
    if (built)
        *built = false;
    w16_cache_t *plans;
    wna16_status_t st = w16_context_plans(ctx, &plans, err);
    if (st != WNA16_OK)
        return st;
    plan_job_t J = {.ctx = ctx, .T = T, .req = req, .sums = sums};
    w16_cache_loader_t loader = {plan_compile, plan_load, plan_unload, &J};
    void *h = NULL;
    st = w16_cache_get(plans, request_key(T, req, sums), &loader, &h, err);
    if (st != WNA16_OK)
        return st;
    *out = h;
    if (built)
        *built = J.built;
    return WNA16_OK;
}
