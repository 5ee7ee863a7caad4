/*
 * test_moe_nvrtc.c - the generated fused-MoE kernels compile for the GPU:
 * for every stacked backend layout the builder serves (triton, xpu, cpu,
 * and the others) and every activation, the four kernels of a
 * configuration (varying the activation dtype, the format, bits, group
 * size, zero points, bias, the block size, GEMM output rounding, the
 * router weight's side and whether codes are read as 32-bit words) are
 * emitted as one CUDA C translation unit and compiled by NVRTC for sm_90: a CUBIN (ELF for EM_CUDA) and PTX with an
 * entry for each kernel, without a single warning. Needs no GPU; skips
 * (77) when NVRTC cannot be loaded.
 */
#include "testutil.h"
#include "gen/build_moe.h"
#include "gen/emit_cuda.h"
#include "runtime/cuda/cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EM_CUDA_MACHINE 190

static wna16_context_t *ctx;
static tu_rng_t rng;

/* The request for configuration i of a backend, or false when the layout
 * cannot serve it (e.g. xpu with zero points): drawn again. */
static bool request(const wna16_spec_t *s, int act, w16_moe_request_t *req)
{
    static const int32_t gss[] = {-1, 32, 64, 128};
    memset(req, 0, sizeof *req);
    req->backend = s;
    int32_t gs = gss[tu_rng_below(&rng, 4)];
    req->problem = (w16_problem_t){.E = 1 + tu_rng_below(&rng, 8), .H = 256,
                                   .I = 128,
                                   .BITS = tu_rng_below(&rng, 2) ? 4 : 8,
                                   .GS = gs, .zp = tu_rng_below(&rng, 2),
                                   .bias = tu_rng_below(&rng, 2)};
    wna16_moe_params_init(&req->params);
    req->params.activation = (wna16_activation_t)act;
    req->params.act_dtype = tu_rng_below(&rng, 2) ? WNA16_DTYPE_F16
                                                  : WNA16_DTYPE_BF16;
    req->params.round_gemm_outputs = tu_rng_below(&rng, 2);
    req->params.apply_router_weight_on_input = tu_rng_below(&rng, 3) == 0;
    req->params.swiglu_limit = tu_rng_below(&rng, 2) ? 7.0f : INFINITY;
    req->batched = tu_rng_below(&rng, 3) == 0;
    req->batched_weights = tu_rng_below(&rng, 2);
    req->topk = 1 + (int32_t)tu_rng_below(&rng, 8);
    req->block_m = 1 << tu_rng_below(&rng, 4);
    /* codes read as 32-bit words where the layout allows, or by element */
    req->qweight_align = tu_rng_below(&rng, 2) ? 4 : 0;
    wna16_error_t err;
    return w16_moe_check(req, &err) == WNA16_OK;
}

/* 1 when compiled (and checked), 0 when the builder refuses the layout. */
static int compile_one(const wna16_spec_t *s, int act)
{
    w16_moe_request_t req;
    int tries = 0;
    while (!request(s, act, &req))
        if (++tries == 50)
            return 0;
    wna16_error_t err;
    w16_buf_t src;
    w16_buf_init(&src, ctx);
    char names[W16_MOE_STAGE_COUNT][200];
    bool ok = true;
    for (int st = 0; st < W16_MOE_STAGE_COUNT && ok; st++) {
        w16_moe_kernel_t mk;
        wna16_status_t r = w16_build_moe(ctx, &req, (w16_moe_stage_t)st, &mk, &err);
        /* a layout the builder serves for one stage serves every stage */
        TU_CHECK_MSG(r == WNA16_OK, "%s: %s", wna16_spec_name(s), err.message);
        if (r != WNA16_OK) {
            ok = false;
            break;
        }
        snprintf(names[st], sizeof names[st], "%s", mk.kernel->name);
        TU_OK(w16_emit_cuda(mk.kernel, st == 0, &src, &err), &err);
        w16_moe_kernel_free(&mk);
    }
    if (ok && !src.failed) {
        w16_cuda_image_t img;
        wna16_status_t r = w16_nvrtc_compile(ctx, src.data, names[0], 9, 0, &img,
                                             &err);
        TU_CHECK_MSG(r == WNA16_OK, "%s: %s", names[0], err.message);
        if (r == WNA16_OK) {
            const unsigned char *p = img.cubin;
            TU_CHECK_MSG(img.cubin && img.cubin_size > 64 &&
                         memcmp(p, "\177ELF", 4) == 0 &&
                         (p[18] | p[19] << 8) == EM_CUDA_MACHINE,
                         "%s: no sm_90 CUBIN", names[0]);
            for (int st = 0; st < W16_MOE_STAGE_COUNT; st++) {
                char entry[240];
                snprintf(entry, sizeof entry, ".entry %s", names[st]);
                TU_CHECK_MSG(img.ptx && strstr(img.ptx, entry), "PTX lacks %s",
                             entry);
            }
            TU_CHECK_MSG(img.log == NULL, "%s: NVRTC warns: %s", names[0],
                         img.log ? img.log : "");
        }
        w16_cuda_image_free(&img);
    }
    w16_buf_free(&src);
    return ok;
}

int main(void)
{
    wna16_error_t err;
    if (!w16_nvrtc_available(NULL, &err))
        tu_skip(err.message);
    ctx = tu_context();
    tu_rng_seed(&rng, 0x90);
    int units = 0, backends = 0;
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        if (!s->stacked)
            continue;
        int n = 0;
        for (int act = 0; act < WNA16_ACT_COUNT_; act++)
            n += compile_one(s, act);
        const char *name = wna16_spec_name(s);
        bool required = !strcmp(name, "triton") || !strcmp(name, "xpu") ||
                        !strcmp(name, "cpu");
        TU_CHECK_MSG(!required || n == WNA16_ACT_COUNT_, "%s: %d of %d "
                     "configurations compiled", name, n, WNA16_ACT_COUNT_);
        units += n;
        backends += n > 0;
    }
    printf("%d translation units (4 kernels each) compiled for sm_90 with %s, "
           "%d backends\n", units, w16_nvrtc_version(), backends);
    TU_CHECK(backends >= 3);
    wna16_context_destroy(ctx);
    return tu_finish("test_moe_nvrtc");
}
