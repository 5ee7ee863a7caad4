/*
 * run_moe_cpu.c - the generated fused MoE of `wna16 run` on a target that
 * runs it (the CPU: LLVM JIT on all cores, routed on the host; ocl and xpu:
 * the SPIR-V through OpenCL or Level Zero, routed on the device): the
 * wna16_moe_layer_* API (kernels generated from the backend's layout spec,
 * compiled through the kernel cache), timed by run_time_calls; it says
 * where the calls were routed.
 */
#include "run.h"
#include "runtime/ref/moe.h"
#include "runtime/targets.h"

#include <stdlib.h>

typedef struct cpu_call {
    wna16_moe_layer_t *layer;
    wna16_moe_params_t p;
    const run_input_t *in;
    void *scratch; /* output of the timed calls */
} cpu_call_t;

static wna16_status_t call_cpu(void *user, void *out, double *ms,
                               wna16_error_t *err)
{
    cpu_call_t *c = user;
    double t = run_now();
    wna16_status_t st = wna16_moe_layer_run(c->layer, &c->p, c->in->hidden,
                                            c->in->M, c->in->ids,
                                            c->in->weights, c->in->topk,
                                            out ? out : c->scratch, err);
    *ms = (run_now() - t) * 1e3;
    return st;
}

int run_moe_cpu(wna16_context_t *ctx, const run_layer_t *L,
                const run_choice_t *c, const wna16_tensor_set_t *packed,
                const run_input_t *in, void *out, run_figures_t *f,
                run_log_t *log)
{
    wna16_error_t err;
    const w16_target_t *T;
    void *inst;
    w16_target_device_t d;
    cpu_call_t call = {.in = in};
    if (w16_target_probe(ctx, c->target, &T, &inst, &err) != WNA16_OK)
        return cli_fail(&err);
    T->describe(inst, &d);
    f->threads = d.threads;
    run_log_step(log, "fused MoE on the %s target: kernels generated from "
                 "%s's layout spec, %s, on %s; %d tokens, top-%d, %s, silu",
                 T->name, wna16_spec_name(c->backend), T->compiler, d.text,
                 in->M, in->topk, wna16_dtype_name(in->dtype));
    wna16_moe_params_init(&call.p);
    call.p.act_dtype = in->dtype;
    call.scratch = malloc((size_t)in->M * (size_t)L->H * 2);
    int rc = CLI_FAIL;
    if (!call.scratch) {
        fprintf(stderr, "wna16: out of memory\n");
    } else if (wna16_moe_layer_create(ctx, c->backend, packed, L->prefix, L->E,
                                      L->H, L->I, &L->quant, c->target,
                                      &call.layer, &err) != WNA16_OK) {
        cli_fail(&err);
    } else {
        f->numerics = wna16_moe_layer_numerics(call.layer);
        run_log_more(log, "GEMMs: numeric contract %s (%s)",
                     wna16_numerics_name(f->numerics),
                     f->numerics == WNA16_NUMERICS_INT8_DYNAMIC
                         ? "the dedicated CPU kernels: activations quantized "
                           "per token to 8 bits, AVX512-VNNI dot products, "
                           "vLLM's CPUExpertsInt4 arithmetic"
                     : f->numerics == WNA16_NUMERICS_BF16_EXACT
                         ? "weights dequantized and rounded to bf16, times "
                           "the bf16 activations, summed in float32: "
                           "Marlin's arithmetic (the layer's log says which "
                           "kernels)"
                         : "the portable kernels: weights dequantized to "
                           "float32, float32 FMA");
        rc = run_time_calls(ctx, call_cpu, &call, out, f);
    }
    uint64_t on_device = w16_moe_layer_device_calls(call.layer);
    wna16_moe_layer_destroy(call.layer);
    free(call.scratch);
    if (rc == CLI_OK)
        run_log_more(log, "first call %.1f ms (%s); cached %.2f ms (median of "
                     "%d calls, best %.2f)", f->first_ms,
                     f->cache_hit && f->from_packs
                         ? "kernels from kernel packs"
                     : f->cache_hit ? "kernels from the kernel cache: hit"
                                    : "kernels compiled: cache miss",
                     f->cached_ms, f->calls, f->best_ms);
    if (rc == CLI_OK && T->moe_orch == W16_MOE_ORCH_DEVICE)
        run_log_more(log, "routing on the device: %llu calls, each a routing "
                     "kernel and four stages with no host read between "
                     "launches", (unsigned long long)on_device);
    return rc;
}
