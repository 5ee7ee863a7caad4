/*
 * moe_cpu.c - the dedicated CPU generator of the fused MoE (see moe_cpu.h).
 *
 *   request --probe the layout's maps--> plan (strides of the VNNI blocks,
 *   scales, zeros, bias) --> kernel-IR shell (parameters, tiles, the plan
 *   as text for the cache key) --emit (LLVM C API, at compile time)-->
 *   entry point  void f(const uint64_t *args, i64 gb, i64 ge, i64 ng)
 *
 * int8-dynamic (vLLM's CPUExpertsInt4 arithmetic, include/wna16.h):
 *
 *   input   per x row: q = rne(x * 127 / amax) + 128 (u8), scale amax/127,
 *           per block of bk = min(group, 128) channels the sum of q
 *   gemm    per (expert run, tile of 32-column blocks), BM rows a pass:
 *             for each k block kc:
 *               for each 64-byte line t of the block (4 k x 32 columns):
 *                 lo = line & 0x0f, hi = (line >> 4) & 0x0f
 *                 iacc[r][lo|hi] = vpdpbusd(iacc, bcast(q[r][4t..4t+3]),
 *                                           lo|hi)
 *               C = iacc - zero * sum_q[r][kc] - 128 * comp   (exact int32)
 *               facc[r] += float(C) * scale_x[r] * scale_w[g]
 *           epilogue: + bias, R(), activation (gemm1), store in natural
 *           column order
 *
 * A zmm register of int32 lanes holds the lo (or hi) columns of a block:
 * lane L is column n_lo(L) = 16 (L / 8) + L % 8 (hi: + 8); scales, zeros,
 * compensations and bias are stored in natural column order, so they are
 * loaded as two vectors and permuted (perm_lo, perm_hi), and results are
 * permuted back before the store. Sum of q (code - zero) is computed as
 * sum q code - zero sum q: the same int32 as vLLM's (code - zero) operand,
 * without a subtraction per weight byte.
 *
 * Layouts whose columns keep their K codes contiguous in whole bytes
 * (8-bit codes: triton's) get the GEMM blocks of moe_cpu_cols.c instead
 * (w16_moe_cpu_gemm_cols: one column's 64 k a zmm, lane sums); their
 * lanes are in natural column order (identity perm_lo/perm_hi). The
 * shared plan and builder helpers are in moe_cpu_priv.h.
 */
#include "gen/moe_cpu_priv.h"
#include "gen/request_key.h"
#include "spec/expr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const arg_names[W16_MOE_ARG_COUNT] = {
#define X(e, name) name,
    W16_MOE_ARG_LIST(X)
#undef X
};

unsigned w16_moe_cpu_isa(const char *f)
{
    if (!f)
        return 0;
    /* an LLVM feature string: comma-separated +name / -name */
    bool has[4] = {false};
    static const char *const names[4] = {"avx512f", "avx512bw", "avx512vnni",
                                         "avx512bf16"};
    for (const char *p = f; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        for (int i = 0; i < 4; i++)
            if (n == strlen(names[i]) + 1 && p[0] == '+' &&
                strncmp(p + 1, names[i], n - 1) == 0)
                has[i] = true;
        p += n;
        if (*p == ',')
            p++;
    }
    unsigned isa = 0;
    if (has[0] && has[1]) {
        isa |= W16_CPU_ISA_AVX512;
        if (has[2])
            isa |= W16_CPU_ISA_AVX512_VNNI;
        if (has[3])
            isa |= W16_CPU_ISA_AVX512_BF16;
    }
    return isa;
}

/* ---- the plan: what the layout's maps say ---------------------------------- */

/* The flat offset of the compensation sum of (e, n, block kc). */
static bool locate_sum(const w16_layout_t *l, const int64_t *v,
                       const int64_t *shape, int64_t e, int64_t n, int64_t kc,
                       int64_t *flat)
{
    int64_t vars[W16_VAR_COUNT];
    memcpy(vars, v, sizeof vars);
    vars[W16_VAR_e] = e;
    vars[W16_VAR_n] = n;
    vars[W16_VAR_g] = kc;
    int64_t f = 0;
    for (int d = 0; d < l->ndim; d++) {
        int64_t ix;
        w16_eval_error_t ee = {0};
        if (!l->sums_index[d] || !w16_expr_eval(l->sums_index[d], vars, &ix, &ee) ||
            ix < 0 || ix >= shape[d])
            return false;
        f = f * shape[d] + ix;
    }
    *flat = f;
    return true;
}

/* Checks that the float (or zero-point) layout of role r stores (e, n, g)
 * at base + e*se + (n / 32)*snb + (n % 32)*sn + g*sg, over every n and
 * group of the probed experts; fills the strides. The VNNI kernels load
 * a block's 32 columns as consecutive elements: sn must be 1 there. */
static const char *probe_vec(const w16_layout_t *l, const int64_t *v,
                             const int64_t *shape, const mc_op_t *o,
                             int64_t E, int64_t *b0, int64_t *se,
                             int64_t *snb, int64_t *sn, int64_t *sg)
{
    int64_t f0, f;
    if (!w16_moe_cpu_locate(l, v, shape, 0, 0, 0, 0, &f0, NULL))
        return "an element outside its shape";
    *b0 = f0;
    *se = *snb = *sg = 0;
    *sn = 1;
    if (E > 1 && w16_moe_cpu_locate(l, v, shape, 1, 0, 0, 0, &f, NULL))
        *se = f - f0;
    if (o->NB > 1 && w16_moe_cpu_locate(l, v, shape, 0, 32, 0, 0, &f, NULL))
        *snb = f - f0;
    if (o->shape == W16_MOE_CPU_COLS && o->N > 1 &&
        w16_moe_cpu_locate(l, v, shape, 0, 1, 0, 0, &f, NULL))
        *sn = f - f0;
    if (o->G > 1 && w16_moe_cpu_locate(l, v, shape, 0, 0, 0, 1, &f, NULL))
        *sg = f - f0;
    if (*sn < 1 || *sn > (INT32_MAX >> 6)) /* the gathers' 32-bit offsets */
        return "its columns are not at a positive stride below 2^25";
    int64_t es[3];
    int ne = w16_moe_cpu_probe_experts(E, es);
    int64_t gs[2] = {0, o->G - 1};
    for (int i = 0; i < ne; i++)
        for (int gi = 0; gi < (o->G > 1 ? 2 : 1); gi++)
            for (int64_t n = 0, g = gs[gi]; n < o->N; n++) {
                int64_t want = f0 + es[i] * *se + (n / 32) * *snb + g * *sg +
                               (n % 32) * *sn, bit = 0;
                if (!w16_moe_cpu_locate(l, v, shape, es[i], n, 0, g, &f, &bit) ||
                    f != want || bit != 0)
                    return o->shape == W16_MOE_CPU_COLS
                               ? "its columns are not at a regular stride"
                               : "its 32 columns of a block are not consecutive";
            }
    return NULL;
}

/* The layout's qweight map against the VNNI block structure: byte
 * q0 + e*q_e + nb*q_nb + kc*q_kc + 64 (kk / 4) + 4 L + kk % 4 holds code
 * (n, k) at bit 4 ((n % 16) / 8), L = 8 ((n % 32) / 16) + n % 8. */
static const char *probe_codes(const w16_moe_request_t *req,
                               const w16_problem_t *p, int g, const int64_t *v,
                               mc_op_t *o)
{
    const w16_layout_t *l = req->backend->layouts[W16_ROLE_QWEIGHT];
    wna16_dtype_t d = w16_moe_cpu_dtype_of(req, g, W16_ROLE_QWEIGHT);
    if (wna16_dtype_size(d) != 1 || w16_layout_code_bits(l, d, v) != 4 ||
        l->decode || !l->sums_block_k)
        return "its codes are not 4-bit fields of bytes with block sums";
    int64_t shape[W16_MAX_STORE_DIMS], f, bit, sbk;
    if (w16_layout_shape(l, v, shape, NULL) != WNA16_OK)
        return "its qweight shape does not evaluate";
    w16_eval_error_t ee = {0};
    if (!w16_expr_eval(l->sums_block_k, v, &sbk, &ee) || sbk != o->bk)
        return "its compensation blocks are not min(group size, 128)";
    if (!w16_moe_cpu_locate(l, v, shape, 0, 0, 0, 0, &o->q0, NULL))
        return "an element outside its shape";
    o->q_e = o->q_nb = o->q_kc = 0;
    if (p->E > 1 && w16_moe_cpu_locate(l, v, shape, 1, 0, 0, 0, &f, NULL))
        o->q_e = f - o->q0;
    if (o->NB > 1 && w16_moe_cpu_locate(l, v, shape, 0, 32, 0, 0, &f, NULL))
        o->q_nb = f - o->q0;
    if (o->KC > 1 && w16_moe_cpu_locate(l, v, shape, 0, 0, o->bk, 0, &f, NULL))
        o->q_kc = f - o->q0;
    int64_t es[3];
    int ne = w16_moe_cpu_probe_experts(p->E, es);
    for (int i = 0; i < ne; i++) {
        int64_t e = es[i];
        /* every block's base and compensation place (the first expert;
         * the last one's corners below) */
        for (int64_t nb = 0; nb < o->NB && i == 0; nb++)
            for (int64_t kc = 0; kc < o->KC; kc++) {
                int64_t base = o->q0 + e * o->q_e + nb * o->q_nb + kc * o->q_kc;
                if (!w16_moe_cpu_locate(l, v, shape, e, nb * 32, kc * o->bk, 0, &f, &bit) ||
                    f != base || bit != 0)
                    return "its blocks are not at regular strides";
                if (!locate_sum(l, v, shape, e, nb * 32 + 31, kc, &f) ||
                    f != base + o->bk * 16 + 4 * 31)
                    return "its compensation sums do not follow the block's codes";
            }
        /* every code of the first block (column block 0, k block 0) and
         * of the last */
        int64_t nbs[2] = {0, o->NB - 1}, kcs[2] = {0, o->KC - 1};
        for (int a = 0; a < 2; a++)
            for (int b = a; b == a; b++)
                for (int64_t nn = 0; nn < 32; nn++)
                    for (int64_t kk = 0; kk < o->bk; kk++) {
                        int64_t n = nbs[a] * 32 + nn, k = kcs[b] * o->bk + kk;
                        int64_t want = o->q0 + e * o->q_e + nbs[a] * o->q_nb +
                                       kcs[b] * o->q_kc + 64 * (kk / 4) +
                                       4 * (8 * (nn / 16) + nn % 8) + kk % 4;
                        if (!w16_moe_cpu_locate(l, v, shape, e, n, k, 0, &f, &bit) ||
                            f != want || bit != 4 * ((nn % 16) / 8))
                            return "its 64-byte lines do not hold 4 k x 32 "
                                   "columns in VNNI order";
                        int64_t blk = want - 4 * (8 * (nn / 16) + nn % 8);
                        if (kk == 0 && (!locate_sum(l, v, shape, e, n, kcs[b], &f) ||
                                        f != blk + o->bk * 16 + 4 * nn))
                            return "its compensation sums are not in column "
                                   "order";
                    }
    }
    return NULL;
}

/* The plan of operand g, or the reason its codes have neither structure
 * (VNNI blocks: the returned reason; K-contiguous columns: *why_cols, set
 * when that probe ran) or its scales, zeros or bias are not read so. */
static const char *probe_op(const w16_moe_request_t *req, const w16_problem_t *p,
                            int g, mc_op_t *o, const char **why_cols)
{
    *why_cols = NULL;
    int64_t v[W16_VAR_COUNT];
    if (w16_spec_bind(req->backend, p, (wna16_gemm_t)g, v, NULL) != WNA16_OK)
        return "the problem does not bind";
    memset(o, 0, sizeof *o);
    o->N = v[W16_VAR_N];
    o->K = v[W16_VAR_K];
    o->G = v[W16_VAR_G];
    o->GSE = v[W16_VAR_GSE];
    o->bk = o->GSE < 128 ? o->GSE : 128;
    if (p->act_order || o->N % 32 || o->bk % 16 || o->K % o->bk ||
        o->GSE % o->bk)
        return "it needs codes without act-order, N a multiple of 32 and "
               "blocks of min(group, 128) channels, a multiple of 16";
    o->KC = o->K / o->bk;
    o->NB = o->N / 32;
    o->zp = p->zp;
    o->bias = p->bias;
    o->zero = 1 << (p->BITS - 1);
    const char *why = p->BITS == 4 ? probe_codes(req, p, g, v, o)
                                   : "its codes are not 4-bit";
    if (why) {
        if ((*why_cols = w16_moe_cpu_probe_cols(req, p, g, v, o)))
            return why;
        o->shape = W16_MOE_CPU_COLS;
    }
    const w16_layout_t *ls = req->backend->layouts[W16_ROLE_SCALES];
    int64_t shape[W16_MAX_STORE_DIMS];
    o->scale_dtype = w16_moe_cpu_dtype_of(req, g, W16_ROLE_SCALES);
    if ((o->shape == W16_MOE_CPU_VNNI && o->scale_dtype != WNA16_DTYPE_F32) ||
        (o->scale_dtype != WNA16_DTYPE_F32 && o->scale_dtype != WNA16_DTYPE_BF16 &&
         o->scale_dtype != WNA16_DTYPE_F16) ||
        ls->scale_multiply || ls->scale_int16 ||
        w16_layout_shape(ls, v, shape, NULL) != WNA16_OK)
        return o->shape == W16_MOE_CPU_VNNI
                   ? "its scales are not plain float32"
                   : "its scales are not plain float32, bfloat16 or float16";
    if ((why = probe_vec(ls, v, shape, o, p->E, &o->s0, &o->s_e, &o->s_nb,
                         &o->s_n, &o->s_g)))
        return why;
    if (p->zp) {
        const w16_layout_t *lz = req->backend->layouts[W16_ROLE_QZEROS];
        wna16_dtype_t dz = w16_moe_cpu_dtype_of(req, g, W16_ROLE_QZEROS);
        if (!lz || wna16_dtype_size(dz) != 1 ||
            w16_layout_code_bits(lz, dz, v) != 8 || lz->decode ||
            w16_layout_shape(lz, v, shape, NULL) != WNA16_OK)
            return "its zero points are not whole bytes";
        if ((why = probe_vec(lz, v, shape, o, p->E, &o->z0, &o->z_e,
                             &o->z_nb, &o->z_n, &o->z_g)))
            return why;
    }
    if (p->bias) {
        const w16_layout_t *lb = req->backend->layouts[W16_ROLE_BIAS];
        int64_t f0, f;
        if (!lb || w16_moe_cpu_dtype_of(req, g, W16_ROLE_BIAS) != WNA16_DTYPE_F32 ||
            w16_layout_shape(lb, v, shape, NULL) != WNA16_OK ||
            !w16_moe_cpu_locate(lb, v, shape, 0, 0, 0, 0, &f0, NULL))
            return "its bias is not float32";
        o->b0 = f0;
        o->b_e = p->E > 1 && w16_moe_cpu_locate(lb, v, shape, 1, 0, 0, 0, &f, NULL) ? f - f0 : 0;
        int64_t es[3];
        int ne = w16_moe_cpu_probe_experts(p->E, es);
        for (int i = 0; i < ne; i++)
            for (int64_t n = 0; n < o->N; n++)
                if (!w16_moe_cpu_locate(lb, v, shape, es[i], n, 0, 0, &f, NULL) ||
                    f != f0 + es[i] * o->b_e + n)
                    return "its bias rows are not consecutive";
    }
    return NULL;
}

static bool activation_ok(wna16_activation_t a)
{
    return a > WNA16_ACT_INVALID && a < WNA16_ACT_COUNT_;
}

static wna16_status_t make_plan(const w16_moe_request_t *req,
                                wna16_numerics_t numerics, unsigned isa,
                                const w16_moe_cpu_layout_t *probed,
                                mc_plan_t *P, wna16_error_t *err)
{
    memset(P, 0, sizeof *P);
    wna16_status_t st = w16_moe_check(req, err);
    if (st != WNA16_OK)
        return st;
    if (numerics != WNA16_NUMERICS_INT8_DYNAMIC &&
        numerics != WNA16_NUMERICS_BF16_EXACT)
        return w16_err(err, WNA16_EUNSUPPORTED, "the dedicated CPU kernels "
                       "compute int8-dynamic and bf16-exact (asked: %s)",
                       wna16_numerics_name(numerics) ? wna16_numerics_name(numerics)
                                                     : "?");
    if (numerics == WNA16_NUMERICS_INT8_DYNAMIC &&
        !(isa & W16_CPU_ISA_AVX512_VNNI))
        return w16_err(err, WNA16_EUNSUPPORTED, "the host CPU has no "
                       "AVX512-VNNI (vpdpbusd on zmm)");
    if (numerics == WNA16_NUMERICS_BF16_EXACT &&
        !(isa & W16_CPU_ISA_AVX512_BF16))
        return w16_err(err, WNA16_EUNSUPPORTED, "the host CPU has no "
                       "AVX512-BF16 (vdpbf16ps on zmm)");
    if (numerics == WNA16_NUMERICS_BF16_EXACT &&
        req->params.act_dtype != WNA16_DTYPE_BF16)
        return w16_err(err, WNA16_EUNSUPPORTED, "bf16-exact multiplies bf16 "
                       "activations; these are %s",
                       wna16_dtype_name(req->params.act_dtype));
    if (!activation_ok(req->params.activation))
        return w16_err(err, WNA16_EUNSUPPORTED, "the dedicated CPU kernels do "
                       "not compute the %s activation",
                       wna16_activation_name(req->params.activation));
    w16_problem_t p = req->problem;
    p.ungated = !wna16_activation_is_gated(req->params.activation);
    P->numerics = numerics;
    P->act_dtype = req->params.act_dtype;
    P->activation = req->params.activation;
    P->limit = req->params.swiglu_limit;
    P->alpha = req->params.swiglu_alpha;
    P->beta = req->params.swiglu_beta;
    P->gated = !p.ungated;
    P->on_input = req->params.apply_router_weight_on_input &&
                  (!req->batched || req->batched_weights);
    P->batched = req->batched;
    P->round = req->params.round_gemm_outputs;
    P->topk = req->batched ? 1 : req->topk;
    P->E = p.E;
    P->H = p.H;
    P->I = p.I;
    P->BM = req->block_m < 1 ? 1 : req->block_m > 4 ? 4 : req->block_m;
    for (int g = 0; g < 2; g++) {
        if (probed) {
            P->op[g] = probed->op[g];
            continue;
        }
        const char *cols = NULL;
        const char *why = probe_op(req, &p, g, &P->op[g], &cols);
        if (why && cols)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s: the %s layout's maps "
                           "have neither code structure the CPU kernels "
                           "read (vLLM's cpu VNNI blocks: %s; K-contiguous "
                           "columns: %s)", req->backend->name,
                           g ? "w2" : "w13", why, cols);
        if (why)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s: the %s layout's maps "
                           "do not have the %s structure the CPU kernels "
                           "read: %s", req->backend->name, g ? "w2" : "w13",
                           P->op[g].shape == W16_MOE_CPU_COLS
                               ? "K-contiguous column" : "VNNI block", why);
    }
    if (numerics == WNA16_NUMERICS_BF16_EXACT &&
        P->op[0].shape == W16_MOE_CPU_COLS)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: the dedicated CPU kernels "
                       "for K-contiguous columns compute int8-dynamic only "
                       "(their bf16-exact version was slower than the "
                       "portable kernels', which run it)", req->backend->name);
    if (P->op[0].shape != P->op[1].shape)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: w13 and w2 have different "
                       "code structures; the CPU kernels take one for both",
                       req->backend->name);
    P->IP = P->op[1].K;
    if (P->IP != P->I || P->op[0].N != (P->gated ? 2 : 1) * P->IP)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s pads the intermediate "
                       "size (%lld to %lld); the CPU kernels take it unpadded",
                       req->backend->name, (long long)P->I, (long long)P->IP);
    if (P->I % 32)
        return w16_err(err, WNA16_EUNSUPPORTED, "the CPU kernels take gemm1's "
                       "output channels 32 at a time (gate and up from blocks "
                       "of the same columns); I = %lld is not a multiple of "
                       "32", (long long)P->I);
    /* gemm2's column blocks a tile: each tile quantizes its rows of a
     * again (about 600 vector operations a row of 768), so wide tiles for
     * the kernels of longer runs (1/16 of that work at 16 blocks of 32
     * columns); 4 blocks for runs of one slot (decode), where more tiles
     * split the weights' stream evenly over the threads */
    /* software prefetch 2 KiB (about one k block) ahead of the line read:
     * Qwen3-30B-A3B fresh experts, alternating runs under load (load
     * average 9-10 on 2 cores): M = 1 best 0.68/0.89 ms against
     * 0.82/0.88 ms without, M = 64 best 18.6/23.6 ms against 23.0/45.5 */
    P->pf = 2048;
    if (P->op[0].shape == W16_MOE_CPU_COLS)
        P->pf = 512; /* ahead in the same column (see moe_cpu_cols.c) */
    int64_t want = P->BM > 1 ? 16 : 4;
    P->TB = 1;
    while (P->TB * 2 <= want && P->op[1].NB % (P->TB * 2) == 0)
        P->TB *= 2;
    return WNA16_OK;
}

wna16_status_t w16_moe_cpu_probe(const w16_moe_request_t *req,
                                 wna16_numerics_t numerics, unsigned isa,
                                 w16_moe_cpu_layout_t *out,
                                 wna16_error_t *err)
{
    mc_plan_t P;
    wna16_status_t st = make_plan(req, numerics, isa, NULL, &P, err);
    if (st == WNA16_OK && out) {
        out->op[0] = P.op[0];
        out->op[1] = P.op[1];
    }
    return st;
}

/* ---- LLVM emission ------------------------------------------------------- */

#ifdef WNA16_HAVE_LLVM
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>


/* ---- float helpers (16 lanes) ---- */

static LLVMValueRef sel(cg_t *G, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(G->b, c, a, b, "");
}
static LLVMValueRef fcmp(cg_t *G, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildFCmp(G->b, p, a, b, "");
}

/* activation-dtype bits (16 x i16 as 16 x i32 zero-extended, or scalar)
 * -> f32 */
static LLVMValueRef act_to_f32(cg_t *G, LLVMValueRef bits16, unsigned n)
{
    LLVMTypeRef ft = n > 1 ? LLVMVectorType(G->f32, n) : G->f32;
    if (G->P->act_dtype == WNA16_DTYPE_F16) {
        LLVMTypeRef ht = n > 1 ? LLVMVectorType(G->f16, n) : G->f16;
        return LLVMBuildFPExt(G->b, LLVMBuildBitCast(G->b, bits16, ht, ""), ft, "");
    }
    LLVMTypeRef it = n > 1 ? LLVMVectorType(G->i32, n) : G->i32;
    LLVMValueRef w = LLVMBuildZExt(G->b, bits16, it, "");
    LLVMValueRef sh = n > 1 ? splat(G, ci32(G, 16), n) : ci32(G, 16);
    return LLVMBuildBitCast(G->b, LLVMBuildShl(G->b, w, sh, ""), ft, "");
}

/* R(f): rounded to the activation dtype (nearest even; a NaN stays a quiet
 * NaN, wna16_f32_to_bf16's rule), as f32; f is 16 lanes or a scalar. */
static LLVMValueRef round_act(cg_t *G, LLVMValueRef f)
{
    LLVMTypeRef ft = LLVMTypeOf(f);
    bool vec = LLVMGetTypeKind(ft) == LLVMVectorTypeKind;
    unsigned n = vec ? LLVMGetVectorSize(ft) : 1;
    if (G->P->act_dtype == WNA16_DTYPE_F16) {
        LLVMTypeRef ht = vec ? LLVMVectorType(G->f16, n) : G->f16;
        return LLVMBuildFPExt(G->b, LLVMBuildFPTrunc(G->b, f, ht, ""), ft, "");
    }
    LLVMTypeRef it = vec ? LLVMVectorType(G->i32, n) : G->i32;
#define K32(v) (vec ? splat(G, ci32(G, (v)), n) : ci32(G, (v)))
    LLVMValueRef u = LLVMBuildBitCast(G->b, f, it, "");
    LLVMValueRef lsb = LLVMBuildAnd(G->b, LLVMBuildLShr(G->b, u, K32(16), ""),
                                    K32(1), "");
    LLVMValueRef r = LLVMBuildLShr(G->b, add(G, add(G, u, K32(0x7fff)), lsb),
                                   K32(16), "");
    LLVMValueRef nan = LLVMBuildICmp(G->b, LLVMIntULT, K32(0x7f800000),
                                     LLVMBuildAnd(G->b, u, K32(0x7fffffff), ""), "");
    LLVMValueRef q = LLVMBuildOr(G->b, LLVMBuildLShr(G->b, u, K32(16), ""),
                                 K32(0x40), "");
    r = sel(G, nan, q, r);
    LLVMValueRef out = LLVMBuildBitCast(G->b, LLVMBuildShl(G->b, r, K32(16), ""),
                                        ft, "");
#undef K32
    return out;
}

/* exp(x), 16 lanes: Cephes' expf (range reduction by ln 2 in two parts, a
 * degree-6 polynomial), about 1 ulp over [-87, 88], inputs clamped there. */
static LLVMValueRef vexp(cg_t *G, LLVMValueRef x)
{
    x = sel(G, fcmp(G, LLVMRealOGT, x, vf32(G, 88.0)), vf32(G, 88.0), x);
    x = sel(G, fcmp(G, LLVMRealOLT, x, vf32(G, -87.0)), vf32(G, -87.0), x);
    LLVMTypeRef vt = G->v16f32;
    LLVMValueRef t = fmul(G, x, vf32(G, 1.44269504088896341));
    LLVMValueRef nf = intrinsic(G, "llvm.roundeven", &vt, 1, &t, 1);
    LLVMValueRef r = fsub(G, x, fmul(G, nf, vf32(G, 0.693359375)));
    r = fsub(G, r, fmul(G, nf, vf32(G, -2.12194440e-4)));
    static const double c[] = {1.9875691500E-4, 1.3981999507E-3,
                               8.3334519073E-3, 4.1665795894E-2,
                               1.6666665459E-1, 5.0000001201E-1};
    LLVMValueRef y = vf32(G, c[0]);
    for (int i = 1; i < 6; i++)
        y = fadd(G, fmul(G, y, r), vf32(G, c[i]));
    y = fadd(G, fadd(G, fmul(G, y, fmul(G, r, r)), r), vf32(G, 1.0));
    LLVMValueRef ni = LLVMBuildFPToSI(G->b, nf, G->v16i32, "");
    LLVMValueRef p2 = LLVMBuildBitCast(G->b,
        LLVMBuildShl(G->b, add(G, ni, vi32(G, 127)), vi32(G, 23), ""), vt, "");
    return fmul(G, y, p2);
}

static LLVMValueRef vsigmoid(cg_t *G, LLVMValueRef x)
{
    LLVMValueRef ex = vexp(G, fsub(G, vf32(G, 0.0), x));
    return LLVMBuildFDiv(G->b, vf32(G, 1.0), fadd(G, vf32(G, 1.0), ex), "");
}

static LLVMValueRef clamp_max(cg_t *G, LLVMValueRef x, double hi)
{
    return sel(G, fcmp(G, LLVMRealOGT, x, vf32(G, hi)), vf32(G, hi), x);
}

static LLVMValueRef clamp_sym(cg_t *G, LLVMValueRef x, double lim)
{
    x = clamp_max(G, x, lim);
    return sel(G, fcmp(G, LLVMRealOLT, x, vf32(G, -lim)), vf32(G, -lim), x);
}

/* erf(x): Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7),
 * odd in x. */
static LLVMValueRef verf(cg_t *G, LLVMValueRef x)
{
    LLVMTypeRef vt = G->v16f32;
    LLVMValueRef ax = intrinsic(G, "llvm.fabs", &vt, 1, &x, 1);
    LLVMValueRef t = LLVMBuildFDiv(G->b, vf32(G, 1.0),
                                   fadd(G, vf32(G, 1.0), fmul(G, vf32(G, 0.3275911), ax)), "");
    static const double a[] = {1.061405429, -1.453152027, 1.421413741,
                               -0.284496736, 0.254829592};
    LLVMValueRef y = vf32(G, a[0]);
    for (int i = 1; i < 5; i++)
        y = fadd(G, fmul(G, y, t), vf32(G, a[i]));
    y = fmul(G, y, t);
    LLVMValueRef e = vexp(G, fsub(G, vf32(G, 0.0), fmul(G, ax, ax)));
    LLVMValueRef r = fsub(G, vf32(G, 1.0), fmul(G, y, e));
    LLVMValueRef sign = LLVMBuildAnd(G->b, LLVMBuildBitCast(G->b, x, G->v16i32, ""),
                                     vi32(G, INT32_MIN), "");
    return LLVMBuildBitCast(G->b, LLVMBuildOr(G->b, LLVMBuildBitCast(G->b, r, G->v16i32, ""),
                                              sign, ""), vt, "");
}

static LLVMValueRef vgelu(cg_t *G, LLVMValueRef x)
{
    LLVMValueRef e = verf(G, fmul(G, x, vf32(G, 0.70710678118654752440)));
    return fmul(G, fmul(G, vf32(G, 0.5), x), fadd(G, vf32(G, 1.0), e));
}

/* tanh(y) = 1 - 2 / (exp(2y) + 1) */
static LLVMValueRef vgelu_tanh(cg_t *G, LLVMValueRef x)
{
    LLVMValueRef x3 = fmul(G, x, fmul(G, x, x));
    LLVMValueRef in = fmul(G, vf32(G, 0.79788456080286535588),
                           fadd(G, x, fmul(G, vf32(G, 0.044715), x3)));
    LLVMValueRef e2 = vexp(G, fmul(G, vf32(G, 2.0), in));
    LLVMValueRef th = fsub(G, vf32(G, 1.0), LLVMBuildFDiv(G->b, vf32(G, 2.0),
                                                        fadd(G, e2, vf32(G, 1.0)), ""));
    return fmul(G, fmul(G, vf32(G, 0.5), x), fadd(G, vf32(G, 1.0), th));
}

/* act(g, u) as build_moe.c's activation() computes it. */
static LLVMValueRef vact(cg_t *G, LLVMValueRef g, LLVMValueRef u)
{
    const mc_plan_t *P = G->P;
    switch (P->activation) {
    case WNA16_ACT_GELU:
        return fmul(G, vgelu(G, g), u);
    case WNA16_ACT_GELU_TANH:
        return fmul(G, vgelu_tanh(G, g), u);
    case WNA16_ACT_GELU_NO_MUL:
        return vgelu(G, g);
    case WNA16_ACT_SILU:
        return fmul(G, fmul(G, g, vsigmoid(G, g)), u);
    case WNA16_ACT_SILU_NO_MUL:
        return fmul(G, g, vsigmoid(G, g));
    case WNA16_ACT_SWIGLUSTEP:
        return fmul(G, clamp_max(G, fmul(G, g, vsigmoid(G, g)), P->limit),
                    clamp_sym(G, u, P->limit));
    case WNA16_ACT_SWIGLUOAI: {
        LLVMValueRef gc = clamp_max(G, g, P->limit);
        LLVMValueRef uc = clamp_sym(G, u, P->limit);
        LLVMValueRef sg = vsigmoid(G, fmul(G, vf32(G, P->alpha), gc));
        return fmul(G, fmul(G, fadd(G, uc, vf32(G, P->beta)), gc), sg);
    }
    default: { /* relu2_no_mul: x > 0 ? x * x : (x <= 0 ? 0 : x) */
        LLVMValueRef z = vf32(G, 0.0);
        return sel(G, fcmp(G, LLVMRealOLT, z, g), fmul(G, g, g),
                   sel(G, fcmp(G, LLVMRealOLE, g, z), z, g));
    }
    }
}

/* ---- quantizing a row (int8-dynamic) ---- */

/* Source of a row: 16 floats at chunk c. */
typedef LLVMValueRef (*row_fn)(cg_t *G, void *user, LLVMValueRef c);

typedef struct row_src {
    LLVMValueRef base;   /* hidden row (i16) or a row (f32) */
    LLVMValueRef weight; /* R(router weight) or NULL */
    bool act;            /* activation-dtype bits, else f32 */
} row_src_t;

static LLVMValueRef row_chunk(cg_t *G, const row_src_t *s, LLVMValueRef c)
{
    if (!s->act)
        return ld(G, G->v16f32, at(G, s->base, mul(G, c, ci64(G, 64))), 4);
    LLVMValueRef bits = ld(G, G->v16i16, at(G, s->base, mul(G, c, ci64(G, 32))), 2);
    LLVMValueRef x = act_to_f32(G, bits, 16);
    if (s->weight)
        x = round_act(G, fmul(G, x, splat(G, s->weight, 16)));
    return x;
}

/* Quantizes a row of n = KC * bk values into codes (u8 at q), returns its
 * scale; the code sum of each block of bk goes to sums[kc] (i32). */
static LLVMValueRef quantize_row(cg_t *G, const row_src_t *s, int64_t n,
                                 int64_t bk, LLVMValueRef q, LLVMValueRef sums)
{
    LLVMValueRef amax = var(G, G->v16f32, vf32(G, 0.0));
    loop_t L;
    LLVMValueRef c = loop_open(G, &L, ci64(G, 0), ci64(G, n / 16), 1);
    LLVMValueRef x = row_chunk(G, s, c);
    LLVMTypeRef vt = G->v16f32;
    LLVMValueRef ax = intrinsic(G, "llvm.fabs", &vt, 1, &x, 1);
    LLVMValueRef cur = ld(G, vt, amax, 64);
    /* a NaN sticks (unordered compare), as in the reference */
    st(G, sel(G, fcmp(G, LLVMRealUGT, ax, cur), ax, cur), amax, 64);
    loop_close(G, &L);
    LLVMValueRef am = ld(G, vt, amax, 64);
    LLVMValueRef m = intrinsic(G, "llvm.vector.reduce.fmaximum", &vt, 1, &am, 1);
    m = sel(G, fcmp(G, LLVMRealUGT, m, cf32(G, 1e-7f)), m, cf32(G, 1e-7f));
    LLVMValueRef inv = splat(G, LLVMBuildFDiv(G->b, cf32(G, 127.0), m, ""), 16);
    LLVMValueRef scale = LLVMBuildFDiv(G->b, m, cf32(G, 127.0), "");
    loop_t K;
    LLVMValueRef kc = loop_open(G, &K, ci64(G, 0), ci64(G, n / bk), 1);
    LLVMValueRef sum = var(G, G->v16i32, vi32(G, 0));
    loop_t C;
    LLVMValueRef j = loop_open(G, &C, ci64(G, 0), ci64(G, bk / 16), 1);
    LLVMValueRef ch = add(G, mul(G, kc, ci64(G, bk / 16)), j);
    LLVMValueRef y = fmul(G, row_chunk(G, s, ch), inv);
    y = intrinsic(G, "llvm.roundeven", &vt, 1, &y, 1);
    y = sel(G, fcmp(G, LLVMRealUNO, y, y), vf32(G, 0.0), y); /* NaN: code 128 */
    LLVMValueRef qi = add(G, LLVMBuildFPToSI(G->b, y, G->v16i32, ""), vi32(G, 128));
    st(G, add(G, ld(G, G->v16i32, sum, 64), qi), sum, 64);
    st(G, LLVMBuildTrunc(G->b, qi, G->v16i8, ""),
       at(G, q, mul(G, ch, ci64(G, 16))), 1);
    loop_close(G, &C);
    LLVMTypeRef it = G->v16i32;
    LLVMValueRef sv = ld(G, it, sum, 64);
    st(G, intrinsic(G, "llvm.vector.reduce.add", &it, 1, &sv, 1),
       at(G, sums, mul(G, kc, ci64(G, 4))), 4);
    loop_close(G, &K);
    return scale;
}

/* bf16-exact: a row of n values (activation bits, or float32 values of
 * bf16 numbers) as bf16 bits at q. */
static void to_bf16_row(cg_t *G, const row_src_t *s, int64_t n, LLVMValueRef q)
{
    loop_t C;
    LLVMValueRef c = loop_open(G, &C, ci64(G, 0), ci64(G, n / 16), 1);
    LLVMValueRef x = round_act(G, row_chunk(G, s, c)); /* exact: bf16 values */
    LLVMValueRef u = LLVMBuildLShr(G->b, LLVMBuildBitCast(G->b, x, G->v16i32, ""),
                                   vi32(G, 16), "");
    st(G, LLVMBuildTrunc(G->b, u, G->v16i16, ""), at(G, q, mul(G, c, ci64(G, 32))), 2);
    loop_close(G, &C);
}

/* ---- the stages ---- */

/* The entry point: for gid in [gb, ge): body(gid). */
static LLVMValueRef open_entry(cg_t *G, const char *symbol, loop_t *L)
{
    LLVMTypeRef pt[4] = {G->ptr, G->i64, G->i64, G->i64};
    LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(G->c), pt, 4, 0);
    G->fn = LLVMAddFunction(G->m, symbol, ft);
    G->args = LLVMGetParam(G->fn, 0);
    unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
    LLVMAddAttributeAtIndex(G->fn, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(G->c, nounwind, 0));
    G->entry = LLVMAppendBasicBlockInContext(G->c, G->fn, "entry");
    LLVMPositionBuilderAtEnd(G->b, G->entry);
    return loop_open(G, L, LLVMGetParam(G->fn, 1), LLVMGetParam(G->fn, 2), 1);
}

static void close_entry(cg_t *G, loop_t *L)
{
    loop_close(G, L);
    LLVMBuildRetVoid(G->b);
}

/* The quantized x row's parts: codes at +0, scale at +H, block sums at
 * +H + 4 (bytes), in a row of 4H bytes. */
static void emit_input(cg_t *G, const char *symbol)
{
    const mc_plan_t *P = G->P;
    loop_t L;
    LLVMValueRef row = open_entry(G, symbol, &L);
    LLVMValueRef src = P->on_input && !P->batched
                           ? LLVMBuildUDiv(G->b, row, ci64(G, P->topk), "")
                           : row;
    row_src_t s = {.act = true};
    s.base = at(G, arg_ptr(G, W16_MOE_ARG_HIDDEN), mul(G, src, ci64(G, 2 * P->H)));
    if (P->on_input) {
        LLVMValueRef wp = at(G, arg_ptr(G, W16_MOE_ARG_TOPK_WEIGHTS),
                             mul(G, row, ci64(G, 4)));
        s.weight = round_act(G, ld(G, G->f32, wp, 4));
    }
    LLVMValueRef xq = at(G, arg_ptr(G, W16_MOE_ARG_X), mul(G, row, ci64(G, 4 * P->H)));
    if (P->numerics == WNA16_NUMERICS_BF16_EXACT) {
        to_bf16_row(G, &s, P->H, xq);
    } else {
        LLVMValueRef sc = quantize_row(G, &s, P->H, P->op[0].bk, xq,
                                       at(G, xq, ci64(G, P->H + 4)));
        st(G, sc, at(G, xq, ci64(G, P->H)), 4);
    }
    close_entry(G, &L);
}


/* The scales and zero points (int32) of column block nb of operand g for
 * the group of input channel qoff, lo/hi lanes. Both GEMMs read them so. */
static void group_params(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                         LLVMValueRef qoff, LLVMValueRef scale[2],
                         LLVMValueRef zero[2])
{
    const mc_op_t *o = &G->P->op[g];
    LLVMValueRef sw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_SCALES));
    LLVMValueRef grp = LLVMBuildUDiv(G->b, qoff, ci64(G, o->GSE), "");
    LLVMValueRef so = add(G, ci64(G, o->s0), add(G, add(G, mul(G, e, ci64(G, o->s_e)),
        mul(G, nb, ci64(G, o->s_nb))), mul(G, grp, ci64(G, o->s_g))));
    LLVMValueRef sp = at(G, sw, mul(G, so, ci64(G, 4)));
    LLVMValueRef s0 = ld(G, G->v16f32, sp, 4);
    LLVMValueRef s1 = ld(G, G->v16f32, at(G, sp, ci64(G, 64)), 4);
    scale[0] = shuf(G, s0, s1, G->perm_lo);
    scale[1] = shuf(G, s0, s1, G->perm_hi);
    if (!o->zp) {
        zero[0] = zero[1] = vi32(G, o->zero);
        return;
    }
    LLVMValueRef zw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QZEROS));
    LLVMValueRef zo = add(G, ci64(G, o->z0), add(G, add(G, mul(G, e, ci64(G, o->z_e)),
        mul(G, nb, ci64(G, o->z_nb))), mul(G, grp, ci64(G, o->z_g))));
    LLVMValueRef z = ld(G, G->v32i8, at(G, zw, zo), 1);
    zero[0] = LLVMBuildSExt(G->b, shuf(G, z, NULL, G->perm_lo), G->v16i32, "");
    zero[1] = LLVMBuildSExt(G->b, shuf(G, z, NULL, G->perm_hi), G->v16i32, "");
}

/* facc[r][0|1] of column block nb of operand g for the pass's rows:
 * sum over the K blocks of float(C) * scale_x * scale_w. */
static void block_gemm(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                       const prow_t *rows, int BM, LLVMValueRef facc[][2])
{
    const mc_op_t *o = &G->P->op[g];
    w16_moe_arg_t qa = w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QWEIGHT);
    LLVMValueRef qw = arg_ptr(G, qa);
    for (int t = 0; t < BM; t++)
        for (int h = 0; h < 2; h++)
            st(G, vf32(G, 0.0), facc[t][h], 64);
    LLVMValueRef qe = add(G, ci64(G, o->q0), add(G, mul(G, e, ci64(G, o->q_e)),
                                                 mul(G, nb, ci64(G, o->q_nb))));
    LLVMValueRef iacc[4][2];
    for (int t = 0; t < BM; t++)
        for (int h = 0; h < 2; h++)
            iacc[t][h] = var(G, G->v16i32, NULL);
    loop_t K;
    LLVMValueRef kc = loop_open(G, &K, ci64(G, 0), ci64(G, o->KC), 1);
    LLVMValueRef base = at(G, qw, add(G, qe, mul(G, kc, ci64(G, o->q_kc))));
    for (int t = 0; t < BM; t++)
        for (int h = 0; h < 2; h++)
            st(G, vi32(G, 0), iacc[t][h], 64);
    LLVMValueRef qoff = mul(G, kc, ci64(G, o->bk));
    loop_t T;
    LLVMValueRef tt = loop_open(G, &T, ci64(G, 0), ci64(G, o->bk / 4), 1);
    LLVMValueRef lp = at(G, base, mul(G, tt, ci64(G, 64)));
    prefetch(G, lp);
    LLVMValueRef line = ld(G, G->v16i32, lp, 1);
    LLVMValueRef w[2];
    w[0] = LLVMBuildAnd(G->b, line, vi32(G, 0x0f0f0f0f), "");
    w[1] = LLVMBuildAnd(G->b, LLVMBuildLShr(G->b, line, vi32(G, 4), ""),
                        vi32(G, 0x0f0f0f0f), "");
    LLVMValueRef koff = add(G, qoff, mul(G, tt, ci64(G, 4)));
    for (int t = 0; t < BM; t++) {
        LLVMValueRef a = splat(G, ld(G, G->i32, at(G, rows[t].q, koff), 1), 16);
        for (int h = 0; h < 2; h++) {
            LLVMValueRef ops[3] = {ld(G, G->v16i32, iacc[t][h], 64), a, w[h]};
            st(G, LLVMBuildCall2(G->b, G->dpbusd_t, G->dpbusd, ops, 3, ""),
               iacc[t][h], 64);
        }
    }
    loop_close(G, &T);
    /* the block's compensation, group scales and zeros, lo/hi lanes */
    LLVMValueRef cbase = at(G, base, ci64(G, o->bk * 16));
    LLVMValueRef c0 = ld(G, G->v16i32, cbase, 4);
    LLVMValueRef c1 = ld(G, G->v16i32, at(G, cbase, ci64(G, 64)), 4);
    LLVMValueRef comp[2] = {shuf(G, c0, c1, G->perm_lo), shuf(G, c0, c1, G->perm_hi)};
    LLVMValueRef scale[2], zero[2];
    group_params(G, g, e, nb, qoff, scale, zero);
    for (int t = 0; t < BM; t++) {
        LLVMValueRef qs = splat(G, ld(G, G->i32, at(G, rows[t].sums,
                                                 mul(G, kc, ci64(G, 4))), 4), 16);
        LLVMValueRef xs = splat(G, rows[t].scale, 16);
        for (int h = 0; h < 2; h++) {
            LLVMValueRef C = ld(G, G->v16i32, iacc[t][h], 64);
            C = LLVMBuildSub(G->b, C, mul(G, zero[h], qs), "");
            C = LLVMBuildSub(G->b, C, LLVMBuildShl(G->b, comp[h], vi32(G, 7), ""), "");
            LLVMValueRef f = fmul(G, fmul(G, LLVMBuildSIToFP(G->b, C, G->v16f32, ""),
                                          xs), scale[h]);
            st(G, fadd(G, ld(G, G->v16f32, facc[t][h], 64), f), facc[t][h], 64);
        }
    }
    loop_close(G, &K);
}

/* bf16-exact: facc[r][0|1] += the bf16 products of column block nb over
 * K, in k order as vdpbf16ps sums a pair (odd k, then even k), each weight
 * bf16((code - zero) * scale). */
static void block_gemm_bf16(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                            const prow_t *rows, int BM, LLVMValueRef facc[][2])
{
    const mc_op_t *o = &G->P->op[g];
    LLVMValueRef qw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QWEIGHT));
    for (int t = 0; t < BM; t++)
        for (int h = 0; h < 2; h++)
            st(G, vf32(G, 0.0), facc[t][h], 64);
    LLVMValueRef qe = add(G, ci64(G, o->q0), add(G, mul(G, e, ci64(G, o->q_e)),
                                                 mul(G, nb, ci64(G, o->q_nb))));
    loop_t K;
    LLVMValueRef kc = loop_open(G, &K, ci64(G, 0), ci64(G, o->KC), 1);
    LLVMValueRef base = at(G, qw, add(G, qe, mul(G, kc, ci64(G, o->q_kc))));
    LLVMValueRef qoff = mul(G, kc, ci64(G, o->bk));
    LLVMValueRef scale[2], zero[2], zf[2];
    group_params(G, g, e, nb, qoff, scale, zero);
    for (int h = 0; h < 2; h++)
        zf[h] = LLVMBuildSIToFP(G->b, zero[h], G->v16f32, "");
    LLVMTypeRef v32bf = LLVMVectorType(LLVMBFloatTypeInContext(G->c), 32);
    int il[32];
    for (int i = 0; i < 16; i++) {
        il[2 * i] = i;
        il[2 * i + 1] = 16 + i;
    }
    LLVMValueRef inter = mask(G, il, 32);
    loop_t T;
    LLVMValueRef tt = loop_open(G, &T, ci64(G, 0), ci64(G, o->bk / 4), 1);
    LLVMValueRef lp = at(G, base, mul(G, tt, ci64(G, 64)));
    prefetch(G, lp);
    LLVMValueRef line = ld(G, G->v16i32, lp, 1);
    LLVMValueRef koff = add(G, qoff, mul(G, tt, ci64(G, 4)));
    for (int h = 0; h < 2; h++) {
        LLVMValueRef nib = LLVMBuildAnd(G->b, h ? LLVMBuildLShr(G->b, line, vi32(G, 4), "")
                                                : line, vi32(G, 0x0f0f0f0f), "");
        for (int pr = 0; pr < 2; pr++) {
            LLVMValueRef w[2];
            for (int u = 0; u < 2; u++) {
                LLVMValueRef c = LLVMBuildAnd(G->b, LLVMBuildLShr(G->b, nib,
                    vi32(G, 16 * pr + 8 * u), ""), vi32(G, 0xff), "");
                w[u] = fmul(G, fsub(G, LLVMBuildSIToFP(G->b, c, G->v16f32, ""), zf[h]),
                            scale[h]);
            }
            LLVMValueRef ops2[2] = {w[1], w[0]};
            LLVMValueRef wb = intrinsic(G, "llvm.x86.avx512bf16.cvtne2ps2bf16.512",
                                        NULL, 0, ops2, 2);
            LLVMValueRef wi = shuf(G, wb, NULL, inter);
            LLVMValueRef kp = mul(G, add(G, koff, ci64(G, 2 * pr)), ci64(G, 2));
            for (int t = 0; t < BM; t++) {
                LLVMValueRef xp = LLVMBuildBitCast(G->b,
                    splat(G, ld(G, G->i32, at(G, rows[t].q, kp), 2), 16), v32bf, "");
                LLVMValueRef ops3[3] = {ld(G, G->v16f32, facc[t][h], 64), xp, wi};
                st(G, intrinsic(G, "llvm.x86.avx512bf16.dpbf16ps.512", NULL, 0,
                                ops3, 3), facc[t][h], 64);
            }
        }
    }
    loop_close(G, &T);
    loop_close(G, &K);
}

/* h = facc (+ bias) (rounded when the outputs are), lo/hi lanes. */
static void block_out(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                      LLVMValueRef facc[2], LLVMValueRef out[2])
{
    const mc_op_t *o = &G->P->op[g];
    LLVMValueRef b[2] = {NULL, NULL};
    if (o->bias) {
        LLVMValueRef bw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_BIAS));
        LLVMValueRef bo = add(G, ci64(G, o->b0), add(G, mul(G, e, ci64(G, o->b_e)),
                                                      mul(G, nb, ci64(G, 32))));
        LLVMValueRef bp = at(G, bw, mul(G, bo, ci64(G, 4)));
        LLVMValueRef b0 = ld(G, G->v16f32, bp, 4);
        LLVMValueRef b1 = ld(G, G->v16f32, at(G, bp, ci64(G, 64)), 4);
        b[0] = shuf(G, b0, b1, G->perm_lo);
        b[1] = shuf(G, b0, b1, G->perm_hi);
    }
    for (int h = 0; h < 2; h++) {
        LLVMValueRef v = ld(G, G->v16f32, facc[h], 64);
        if (b[h])
            v = fadd(G, v, b[h]);
        if (G->P->round)
            v = round_act(G, v);
        out[h] = v;
    }
}

/* Stores lo/hi lanes in natural column order at p (32 floats). */
static void store_natural(cg_t *G, LLVMValueRef v[2], LLVMValueRef p)
{
    st(G, shuf(G, v[0], v[1], G->perm_lo), p, 4);
    st(G, shuf(G, v[0], v[1], G->perm_hi), at(G, p, ci64(G, 64)), 4);
}

static void gemm_block(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                       const prow_t *rows, int BM, LLVMValueRef facc[][2])
{
    if (G->P->op[g].shape == W16_MOE_CPU_COLS)
        w16_moe_cpu_gemm_cols(G, g, e, nb, rows, BM, facc);
    else if (G->P->numerics == WNA16_NUMERICS_BF16_EXACT)
        block_gemm_bf16(G, g, e, nb, rows, BM, facc);
    else
        block_gemm(G, g, e, nb, rows, BM, facc);
}

static void emit_gemm(cg_t *G, const char *symbol, bool first)
{
    const mc_plan_t *P = G->P;
    int g = first ? 0 : 1, BM = P->BM;
    const mc_op_t *o = &P->op[g];
    int64_t tiles = first ? P->I / 32 : P->op[1].NB / P->TB;
    loop_t L;
    LLVMValueRef gid = open_entry(G, symbol, &L);
    LLVMValueRef run = LLVMBuildUDiv(G->b, gid, ci64(G, tiles), "");
    LLVMValueRef tile = LLVMBuildURem(G->b, gid, ci64(G, tiles), "");
    LLVMValueRef runs = arg_ptr(G, W16_MOE_ARG_RUNS);
    LLVMValueRef r3 = mul(G, run, ci64(G, 12));
    LLVMValueRef p0 = LLVMBuildSExt(G->b, ld(G, G->i32, at(G, runs, r3), 4), G->i64, "");
    LLVMValueRef p1 = LLVMBuildSExt(G->b, ld(G, G->i32, at(G, runs, add(G, r3, ci64(G, 4))), 4), G->i64, "");
    LLVMValueRef e = LLVMBuildSExt(G->b, ld(G, G->i32, at(G, runs, add(G, r3, ci64(G, 8))), 4), G->i64, "");
    LLVMValueRef sorted = arg_ptr(G, W16_MOE_ARG_SORTED);
    LLVMValueRef in = arg_ptr(G, first ? W16_MOE_ARG_X : W16_MOE_ARG_A);
    LLVMValueRef outp = arg_ptr(G, first ? W16_MOE_ARG_A : W16_MOE_ARG_Y);
    /* gemm2's quantized rows, in stack buffers */
    LLVMValueRef qbuf = NULL, sbuf = NULL;
    if (!first) {
        qbuf = array(G, G->i8, 2 * BM * P->I, 64);
        sbuf = array(G, G->i32, BM * o->KC, 64);
    }
    LLVMValueRef facc[4][2], gate[4][2];
    for (int t = 0; t < BM; t++)
        for (int h = 0; h < 2; h++) {
            facc[t][h] = var(G, G->v16f32, NULL);
            gate[t][h] = var(G, G->v16f32, NULL);
        }
    loop_t Ps;
    LLVMValueRef pos = loop_open(G, &Ps, p0, p1, BM);
    prow_t rows[4];
    LLVMValueRef last = LLVMBuildSub(G->b, p1, ci64(G, 1), "");
    bool xdiv = first && !P->batched && !P->on_input && P->topk > 1;
    for (int t = 0; t < BM; t++) {
        LLVMValueRef a = add(G, pos, ci64(G, t));
        rows[t].valid = LLVMBuildICmp(G->b, LLVMIntSLT, a, p1, "");
        LLVMValueRef ac = sel(G, rows[t].valid, a, last);
        rows[t].slot = LLVMBuildSExt(G->b, ld(G, G->i32, at(G, sorted, mul(G, ac, ci64(G, 4))), 4), G->i64, "");
        bool bf16 = P->numerics == WNA16_NUMERICS_BF16_EXACT;
        if (first) {
            LLVMValueRef xr = xdiv ? LLVMBuildUDiv(G->b, rows[t].slot, ci64(G, P->topk), "")
                                   : rows[t].slot;
            rows[t].q = at(G, in, mul(G, xr, ci64(G, 4 * P->H)));
            if (!bf16) {
                rows[t].scale = ld(G, G->f32, at(G, rows[t].q, ci64(G, P->H)), 4);
                rows[t].sums = at(G, rows[t].q, ci64(G, P->H + 4));
            }
        } else if (bf16) {
            row_src_t s = {.act = false};
            s.base = at(G, in, mul(G, rows[t].slot, ci64(G, 4 * P->I)));
            rows[t].q = at(G, qbuf, ci64(G, (int64_t)t * P->I * 2));
            to_bf16_row(G, &s, P->I, rows[t].q);
        } else {
            row_src_t s = {.act = false};
            s.base = at(G, in, mul(G, rows[t].slot, ci64(G, 4 * P->I)));
            rows[t].q = at(G, qbuf, ci64(G, (int64_t)t * P->I));
            rows[t].sums = at(G, sbuf, ci64(G, (int64_t)t * o->KC * 4));
            rows[t].scale = quantize_row(G, &s, P->I, o->bk, rows[t].q, rows[t].sums);
        }
    }
    if (first) {
        LLVMValueRef nbs[2] = {tile, add(G, tile, ci64(G, P->IP / 32))};
        int nblk = P->gated ? 2 : 1;
        for (int j = 0; j < nblk; j++) {
            gemm_block(G, g, e, nbs[j], rows, BM, facc);
            for (int t = 0; t < BM; t++) {
                LLVMValueRef h[2];
                block_out(G, g, e, nbs[j], facc[t], h);
                if (P->gated && j == 0) {
                    st(G, h[0], gate[t][0], 64);
                    st(G, h[1], gate[t][1], 64);
                    continue;
                }
                LLVMValueRef a[2];
                for (int x = 0; x < 2; x++)
                    a[x] = round_act(G, P->gated ? vact(G, ld(G, G->v16f32, gate[t][x], 64), h[x])
                                                 : vact(G, h[x], NULL));
                LLVMBasicBlockRef join = if_open(G, rows[t].valid);
                LLVMValueRef off = add(G, mul(G, rows[t].slot, ci64(G, P->I)),
                                       mul(G, tile, ci64(G, 32)));
                store_natural(G, a, at(G, outp, mul(G, off, ci64(G, 4))));
                if_close(G, join);
            }
        }
    } else {
        for (int j = 0; j < P->TB; j++) {
            LLVMValueRef nb = add(G, mul(G, tile, ci64(G, P->TB)), ci64(G, j));
            gemm_block(G, g, e, nb, rows, BM, facc);
            for (int t = 0; t < BM; t++) {
                LLVMValueRef h[2];
                block_out(G, g, e, nb, facc[t], h);
                LLVMBasicBlockRef join = if_open(G, rows[t].valid);
                LLVMValueRef off = add(G, mul(G, rows[t].slot, ci64(G, P->H)),
                                       mul(G, nb, ci64(G, 32)));
                store_natural(G, h, at(G, outp, mul(G, off, ci64(G, 4))));
                if_close(G, join);
            }
        }
    }
    loop_close(G, &Ps);
    close_entry(G, &L);
}

static wna16_status_t emit(const void *data, void *module, const char *symbol,
                           const char *features, wna16_error_t *err)
{
    const mc_plan_t *P = data;
    unsigned need = P->numerics == WNA16_NUMERICS_BF16_EXACT
                        ? W16_CPU_ISA_AVX512_BF16 : W16_CPU_ISA_AVX512_VNNI;
    if (features && !(w16_moe_cpu_isa(features) & need))
        return w16_err(err, WNA16_EUNSUPPORTED, "the dedicated CPU MoE "
                       "kernels (%s) need %s, which the features %s lack",
                       wna16_numerics_name(P->numerics),
                       need == W16_CPU_ISA_AVX512_BF16 ? "AVX512-BF16"
                                                       : "AVX512-VNNI", features);
    cg_t G = {.P = P, .m = module};
    G.c = LLVMGetModuleContext(G.m);
    G.b = LLVMCreateBuilderInContext(G.c);
    G.i1 = LLVMInt1TypeInContext(G.c);
    G.i8 = LLVMInt8TypeInContext(G.c);
    G.i16 = LLVMInt16TypeInContext(G.c);
    G.i32 = LLVMInt32TypeInContext(G.c);
    G.i64 = LLVMInt64TypeInContext(G.c);
    G.f32 = LLVMFloatTypeInContext(G.c);
    G.f16 = LLVMHalfTypeInContext(G.c);
    G.ptr = LLVMPointerTypeInContext(G.c, 0);
    G.v16i32 = LLVMVectorType(G.i32, 16);
    G.v16f32 = LLVMVectorType(G.f32, 16);
    G.v16i16 = LLVMVectorType(G.i16, 16);
    G.v16i8 = LLVMVectorType(G.i8, 16);
    G.v32i8 = LLVMVectorType(G.i8, 32);
    G.v16f16 = LLVMVectorType(G.f16, 16);
    static const char dp[] = "llvm.x86.avx512.vpdpbusd.512";
    unsigned id = LLVMLookupIntrinsicID(dp, sizeof dp - 1);
    G.dpbusd = LLVMGetIntrinsicDeclaration(G.m, id, NULL, 0);
    G.dpbusd_t = LLVMIntrinsicGetType(G.c, id, NULL, 0);
    /* the VNNI blocks' lanes hold their columns interleaved (see the
     * top); the K-contiguous kernels' in natural order */
    bool cols = P->op[0].shape == W16_MOE_CPU_COLS;
    int lo[16], hi[16];
    for (int i = 0; i < 16; i++) {
        lo[i] = cols ? i : i < 8 ? i : i + 8;
        hi[i] = cols ? i + 16 : lo[i] + 8;
    }
    G.perm_lo = mask(&G, lo, 16);
    G.perm_hi = mask(&G, hi, 16);
    switch (P->stage) {
    case W16_MOE_INPUT: emit_input(&G, symbol); break;
    case W16_MOE_GEMM1: emit_gemm(&G, symbol, true); break;
    default: emit_gemm(&G, symbol, false); break;
    }
    LLVMDisposeBuilder(G.b);
    char *msg = NULL;
    if (LLVMVerifyModule(G.m, LLVMReturnStatusAction, &msg)) {
        wna16_status_t s = w16_err(err, WNA16_EINTERNAL, "kernel %s: LLVM "
                                   "rejects the generated IR: %s", symbol,
                                   msg ? msg : "");
        LLVMDisposeMessage(msg);
        return s;
    }
    LLVMDisposeMessage(msg);
    return WNA16_OK;
}
#else
static wna16_status_t emit(const void *data, void *module, const char *symbol,
                           const char *features, wna16_error_t *err)
{
    (void)data; (void)module; (void)features;
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: this build has no "
                   "LLVM 19", symbol);
}
#endif

/* ---- the kernel-IR shell ----------------------------------------------------- */

static void plan_text(w16_buf_t *b, const mc_plan_t *P)
{
    /* The text is the kernel's content key (with the LLVM emitter's
     * version), but unlike kernel IR it does not spell out the code: the
     * emitter below writes it. So the generator's fingerprint (a hash of
     * gen/'s sources) goes in too, or a disk cache would hand back objects
     * of an older emitter whenever W16_MOE_CPU_VERSION was not bumped. */
    w16_buf_printf(b, "    moe_cpu v%d gen %s %s stage %s act %s (%g %g %g) "
                   "dtype %s gated %d on_input %d batched %d round %d topk "
                   "%lld E %lld H %lld I %lld BM %d TB %d pf %d",
                   W16_MOE_CPU_VERSION, w16_generator_version(),
                   wna16_numerics_name(P->numerics),
                   w16_moe_stage_name(P->stage),
                   wna16_activation_name(P->activation), (double)P->limit,
                   (double)P->alpha, (double)P->beta,
                   wna16_dtype_name(P->act_dtype), P->gated, P->on_input,
                   P->batched, P->round, (long long)P->topk, (long long)P->E,
                   (long long)P->H, (long long)P->I, P->BM, P->TB, P->pf);
    for (int g = 0; g < 2; g++) {
        const mc_op_t *o = &P->op[g];
        w16_buf_printf(b, "\n    op%d %s N %lld K %lld G %lld GSE %lld bk %lld "
                       "q %lld %lld %lld %lld %lld s %s %lld %lld %lld %lld %lld "
                       "z %lld %lld %lld %lld %lld b %lld %lld zp %d bias %d "
                       "zero %d", g,
                       o->shape == W16_MOE_CPU_COLS ? "cols" : "vnni",
                       (long long)o->N, (long long)o->K, (long long)o->G,
                       (long long)o->GSE, (long long)o->bk, (long long)o->q0,
                       (long long)o->q_e, (long long)o->q_nb, (long long)o->q_kc,
                       (long long)o->q_n, wna16_dtype_name(o->scale_dtype),
                       (long long)o->s0, (long long)o->s_e, (long long)o->s_nb,
                       (long long)o->s_n, (long long)o->s_g, (long long)o->z0,
                       (long long)o->z_e, (long long)o->z_nb, (long long)o->z_n,
                       (long long)o->z_g, (long long)o->b0, (long long)o->b_e,
                       o->zp, o->bias, o->zero);
    }
}

static bool shell_param(kir_kernel_t *k, mc_plan_t *P, w16_moe_kernel_t *out,
                        w16_moe_arg_t a, kir_type_t t, bool written)
{
    const kir_param_t *p = kir_param(k, arg_names[a], KIR_PARAM_BUFFER, t,
                                     written);
    if (!p)
        return false;
    out->param[a] = P->param[a] = p->index;
    return true;
}

wna16_status_t w16_build_moe_cpu(wna16_context_t *ctx,
                                 const w16_moe_request_t *req,
                                 wna16_numerics_t numerics, unsigned isa,
                                 const w16_moe_cpu_layout_t *layout,
                                 w16_moe_stage_t stage, w16_moe_kernel_t *out,
                                 wna16_error_t *err)
{
    memset(out, 0, sizeof *out);
    for (int a = 0; a < W16_MOE_ARG_COUNT; a++)
        out->param[a] = -1;
    out->stage = stage;
    if (stage != W16_MOE_INPUT && stage != W16_MOE_GEMM1 &&
        stage != W16_MOE_GEMM2)
        return w16_err(err, WNA16_EINVAL, "moe_cpu: stage %s is not one of "
                       "the dedicated CPU generator's", w16_moe_stage_name(stage));
    mc_plan_t plan;
    wna16_status_t st = make_plan(req, numerics, isa, layout, &plan, err);
    if (st != WNA16_OK)
        return st;
    plan.stage = stage;
    for (int a = 0; a < W16_MOE_ARG_COUNT; a++)
        plan.param[a] = -1;
    char name[240];
    w16_moe_kernel_name(name, sizeof name - 16, req, stage);
    strcat(name, numerics == WNA16_NUMERICS_BF16_EXACT ? "_cpu_bf16" : "_cpu_i8");
    kir_kernel_t *k = out->kernel = kir_kernel_new(ctx, name, 1);
    if (!k)
        return w16_err_nomem(err, "creating a CPU MoE kernel");
    bool ok = true;
    int g = stage == W16_MOE_GEMM2 ? 1 : 0;
    if (stage == W16_MOE_INPUT) {
        ok = shell_param(k, &plan, out, W16_MOE_ARG_HIDDEN, KIR_I16, false) &&
             (!plan.on_input ||
              shell_param(k, &plan, out, W16_MOE_ARG_TOPK_WEIGHTS, KIR_F32, false)) &&
             shell_param(k, &plan, out, W16_MOE_ARG_X, KIR_I8, true);
        out->tiles = 1;
    } else {
        ok = shell_param(k, &plan, out, W16_MOE_ARG_RUNS, KIR_I32, false) &&
             shell_param(k, &plan, out, W16_MOE_ARG_SORTED, KIR_I32, false) &&
             shell_param(k, &plan, out, g ? W16_MOE_ARG_A : W16_MOE_ARG_X,
                         g ? KIR_F32 : KIR_I8, false);
        ok = ok && shell_param(k, &plan, out,
                               w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QWEIGHT),
                               KIR_I8, false) &&
             shell_param(k, &plan, out,
                         w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_SCALES),
                         KIR_F32, false);
        if (ok && plan.op[g].zp)
            ok = shell_param(k, &plan, out,
                             w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QZEROS),
                             KIR_I8, false);
        if (ok && plan.op[g].bias)
            ok = shell_param(k, &plan, out,
                             w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_BIAS),
                             KIR_F32, false);
        ok = ok && shell_param(k, &plan, out, g ? W16_MOE_ARG_Y : W16_MOE_ARG_A,
                               KIR_F32, true);
        out->tiles = g ? plan.op[1].NB / plan.TB : plan.I / 32;
    }
    mc_plan_t *kept = ok ? w16_arena_alloc(&k->arena, sizeof *kept) : NULL;
    kir_native_t *nat = kept ? w16_arena_alloc(&k->arena, sizeof *nat) : NULL;
    w16_buf_t text;
    w16_buf_init(&text, ctx);
    plan_text(&text, &plan);
    char *t = nat ? w16_arena_strdup(&k->arena, text.data ? text.data : "") : NULL;
    w16_buf_free(&text);
    if (!t) {
        w16_moe_kernel_free(out);
        return w16_err_nomem(err, "creating a CPU MoE kernel");
    }
    *kept = plan;
    *nat = (kir_native_t){.text = t, .emit_llvm = emit, .data = kept};
    k->native = nat;
    bool cols = plan.op[0].shape == W16_MOE_CPU_COLS;
    if (cols && stage != W16_MOE_INPUT)
        k->comment = numerics == WNA16_NUMERICS_BF16_EXACT
                         ? "fused MoE GEMM (bf16-exact): bf16((q - z) s) of "
                           "K-contiguous columns, vdpbf16ps, lane sums"
                         : "fused MoE GEMM (int8-dynamic): vpdpbusd of "
                           "K-contiguous 8-bit columns, lane sums, zeros";
    else if (numerics == WNA16_NUMERICS_BF16_EXACT)
        k->comment = stage == W16_MOE_INPUT
                         ? "fused MoE input (bf16-exact): x rows as bf16"
                     : stage == W16_MOE_GEMM1
                         ? "fused MoE gemm1 (bf16-exact): bf16((q - z) s) "
                           "from the VNNI blocks, vdpbf16ps, act"
                         : "fused MoE gemm2 (bf16-exact): a rows as bf16, "
                           "vdpbf16ps over the VNNI blocks";
    else
    k->comment = stage == W16_MOE_INPUT
                     ? "fused MoE input (int8-dynamic): x rows quantized to "
                       "u8 per token, scale and block code sums"
                 : stage == W16_MOE_GEMM1
                     ? "fused MoE gemm1 (int8-dynamic): vpdpbusd over the VNNI "
                       "blocks, compensation sums, act"
                     : "fused MoE gemm2 (int8-dynamic): a rows quantized, "
                       "vpdpbusd over the VNNI blocks";
    return WNA16_OK;
}
