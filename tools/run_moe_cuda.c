/*
 * run_moe_cuda.c - the fused MoE of `wna16 run` on a CUDA GPU: the layer
 * (repacked into a Marlin-family layout) goes to the GPU, the activations
 * and routing too, and the tensor-core kernels (templates/ specialized
 * from the backend spec and its tiling table: from kernel packs where one
 * holds them, else compiled by NVRTC through the kernel cache) run on
 * device arrays. The first call is timed on the
 * host (it compiles); the cached calls with CUDA events around the run
 * (routing, both GEMMs, the top-k sum), so they measure the device.
 */
#include "run.h"
#include "runtime/cache/pack.h"
#include "runtime/cuda/cuda.h"

#include <string.h>

typedef struct cuda_call {
    w16_cuda_t *cuda;
    wna16_cuda_moe_t *moe;
    wna16_moe_params_t p;
    int32_t M, topk;
    uint64_t hidden, ids, weights, out; /* device arrays */
    size_t out_bytes;
    w16_cuda_event_t *e0, *e1;
    bool reported;                 /* the first call's report is kept */
    wna16_cuda_moe_report_t report;
} cuda_call_t;

static wna16_status_t call_cuda(void *user, void *out, double *ms,
                                wna16_error_t *err)
{
    cuda_call_t *c = user;
    float dev_ms = 0.0f;
    wna16_status_t st = w16_cuda_event_record(c->cuda, c->e0, NULL, err);
    if (st == WNA16_OK)
        st = wna16_cuda_moe_run_device(c->moe, &c->p, c->hidden, c->M, c->ids,
                                       c->weights, c->topk, c->out, NULL, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_record(c->cuda, c->e1, NULL, err);
    if (st == WNA16_OK)
        st = wna16_cuda_moe_sync(c->moe, NULL, err); /* bad ids, if any */
    if (st == WNA16_OK)
        st = w16_cuda_event_elapsed_ms(c->cuda, c->e0, c->e1, &dev_ms, err);
    if (st == WNA16_OK && out)
        st = w16_cuda_copy_d2h(c->cuda, out, c->out, c->out_bytes, err);
    if (st == WNA16_OK && !c->reported) {
        wna16_cuda_moe_last_report(c->moe, &c->report);
        c->reported = true;
    }
    *ms = dev_ms;
    return st;
}

/* Device copies of the activations and routing, and the output. */
static wna16_status_t upload(cuda_call_t *c, const run_input_t *in, int32_t H,
                             wna16_error_t *err)
{
    size_t nh = (size_t)in->M * (size_t)H * 2;
    size_t np = (size_t)in->M * (size_t)in->topk * 4;
    c->out_bytes = nh;
    wna16_status_t st = w16_cuda_alloc(c->cuda, nh, &c->hidden, err);
    if (st == WNA16_OK)
        st = w16_cuda_alloc(c->cuda, np, &c->ids, err);
    if (st == WNA16_OK)
        st = w16_cuda_alloc(c->cuda, np, &c->weights, err);
    if (st == WNA16_OK)
        st = w16_cuda_alloc(c->cuda, nh, &c->out, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(c->cuda, c->hidden, in->hidden, nh, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(c->cuda, c->ids, in->ids, np, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(c->cuda, c->weights, in->weights, np, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_create(c->cuda, &c->e0, err);
    if (st == WNA16_OK)
        st = w16_cuda_event_create(c->cuda, &c->e1, err);
    return st;
}

static void release(cuda_call_t *c)
{
    if (!c->cuda)
        return;
    w16_cuda_event_destroy(c->cuda, c->e0);
    w16_cuda_event_destroy(c->cuda, c->e1);
    w16_cuda_free(c->cuda, c->hidden);
    w16_cuda_free(c->cuda, c->ids);
    w16_cuda_free(c->cuda, c->weights);
    w16_cuda_free(c->cuda, c->out);
}

int run_moe_cuda(wna16_context_t *ctx, const run_layer_t *L,
                 const run_choice_t *c, const wna16_tensor_set_t *packed,
                 const run_input_t *in, void *out, run_figures_t *f,
                 run_log_t *log)
{
    wna16_error_t err;
    cuda_call_t call = {.M = in->M, .topk = in->topk};
    /* where the units are to come from; the first call's line says where
     * they came from */
    bool packs = w16_packs_have(ctx, "cuda");
    const char *from = packs && ctx->no_jit ? "units from kernel packs, JIT off"
                       : packs ? "units from kernel packs, NVRTC for the others"
                       : ctx->no_jit ? "JIT off: units from the kernel cache"
                                     : "NVRTC";
    run_log_step(log, "fused MoE on the GPU: tensor-core templates "
                 "specialized from %s's spec and tiling table, %s; %d "
                 "tokens, top-%d, %s, silu", wna16_spec_name(c->backend), from,
                 in->M, in->topk, wna16_dtype_name(in->dtype));
    wna16_moe_params_init(&call.p);
    call.p.act_dtype = in->dtype;
    double t = run_now();
    wna16_status_t st = w16_cuda_get(ctx, &call.cuda, &err);
    if (st == WNA16_OK)
        st = wna16_cuda_moe_create(ctx, c->backend, packed, L->prefix, L->E,
                                   L->H, L->I, &L->quant, false, &call.moe,
                                   &err);
    if (st == WNA16_OK)
        st = upload(&call, in, L->H, &err);
    int rc = st == WNA16_OK ? CLI_OK : cli_fail(&err);
    if (rc == CLI_OK) {
        run_log_more(log, "layer and activations on the GPU (layout contract "
                     "checked) in %.2f s", run_now() - t);
        rc = run_time_calls(ctx, call_cuda, &call, out, f);
    }
    if (rc == CLI_OK) {
        const wna16_cuda_moe_report_t *r = &call.report;
        for (int i = 0; i < 2; i++)
            snprintf(f->kernels[i], sizeof f->kernels[i], "%s", r->kernel[i]);
        run_log_more(log, "kernels: %s (%s), %s (%s); routing block %d",
                     r->kernel[0], r->tile_rule[0], r->kernel[1],
                     r->tile_rule[1], r->block_m);
        if (f->from_packs)
            run_log_more(log, "first call %.1f ms (units: %llu from kernel "
                         "packs, %llu from the kernel cache, %llu compiled "
                         "by NVRTC); cached %.3f ms (CUDA events, median of "
                         "%d calls, best %.3f)", f->first_ms,
                         (unsigned long long)f->from_packs,
                         (unsigned long long)f->from_disk,
                         (unsigned long long)f->compiled, f->cached_ms,
                         f->calls, f->best_ms);
        else
            run_log_more(log, "first call %.1f ms (NVRTC %.0f, %.0f and %.0f "
                         "ms in parallel threads, 0 where the kernel cache "
                         "had it: %s); cached %.3f ms "
                         "(CUDA events, median of %d calls, best %.3f)",
                         f->first_ms, r->compile_ms[0], r->compile_ms[1],
                         r->compile_ms[2],
                         f->cache_hit ? "hit" : "cache miss", f->cached_ms,
                         f->calls, f->best_ms);
    }
    release(&call);
    wna16_cuda_moe_destroy(call.moe);
    return rc;
}
