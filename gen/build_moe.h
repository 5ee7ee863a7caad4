/*
 * build_moe.h - builds the portable fused-MoE kernels in the kernel IR from
 * a backend's layout spec.
 *
 * A fused MoE call runs four kernels over the routing of wna16_moe_align
 * with blocks of one slot (slots sorted by expert, no padding), cut into
 * runs: the sorted positions [begin, end) of one expert.
 *
 *   input    per (row, tile of H):   x = f32(hidden), scaled by the router
 *                                    weight when it applies on the input
 *   gemm1    per (run, tile of I):   h = x W13^T + b13 for the run's slots,
 *                                    a = R(act(h_gate, h_up))
 *   gemm2    per (run, tile of H):   y = a W2^T + b2
 *   combine  per (token, tile of H): out = R(sum_j c_j y_j) in slot order
 *            (batched: per row, out = R(c y), rows past the count 0)
 *
 * The GEMM lanes own two weight rows; a lane walks K once per BM slots of
 * its run, dequantizing each weight once for those slots ((code - zero) *
 * scale in float32, fp32 accumulators, one per slot and row, held in
 * registers), so each expert's weights come from memory once per launch
 * and from the lane's cache for the run's further slots. Weights are found
 * only through the layout's forward maps (qweight, scales, qzeros, bias:
 * index, bit, decode), folded for the problem and lowered with
 * gen/lower_expr.c: nothing here names a backend. The K loop steps over
 * whole storage elements with their code slots unrolled, so that after
 * LLVM's simplification consecutive k read consecutive elements and the
 * loop vectorizes (fp_reassoc lets the float reductions vectorize); where
 * the layout allows (qweight_align), over whole 32-bit words of codes,
 * each word's codes summed as x * (code - zero) before one multiplication
 * by the group's scale. Every
 * dimension, the activation and its constants, the top-k and BM are
 * constants of the kernels; the token count and the routing are arguments.
 */
#ifndef W16_BUILD_MOE_H
#define W16_BUILD_MOE_H

#include "gen/kir.h"
#include "spec/spec.h"

/* The four kernels, in launch order. ORDER MOESTAGE. */
#define W16_MOE_STAGE_LIST(X)                                                \
    X(INPUT, "input")                                                        \
    X(GEMM1, "gemm1")                                                        \
    X(GEMM2, "gemm2")                                                        \
    X(COMBINE, "combine")

typedef enum w16_moe_stage {
#define X(e, name) W16_MOE_##e,
    W16_MOE_STAGE_LIST(X)
#undef X
    W16_MOE_STAGE_COUNT
} w16_moe_stage_t;

const char *w16_moe_stage_name(w16_moe_stage_t s);

/* Kernel arguments by meaning; a kernel takes a subset. Buffers hold the
 * element type given; scalars are i64. ORDER MOEARG. */
#define W16_MOE_ARG_LIST(X)                                                  \
    X(HIDDEN, "hidden")        /* act dtype bits: [M][H] or [E][maxt][H] */  \
    X(TOPK_WEIGHTS, "topk_weights") /* f32 per slot (or batched row) */      \
    X(X, "x")                  /* f32 [rows][H], the input as float */       \
    X(RUNS, "expert_runs")     /* i32 [runs][3]: sorted positions         \
                                  [begin, end) of one expert, the expert */   \
    X(SORTED, "sorted_ids")    /* i32: slot of each sorted position */       \
    X(A, "act")                /* f32 [slots][I]: R(act(h)) */               \
    X(Y, "y")                  /* f32 [slots][H]: expert outputs */          \
    X(SLOT_EXPERT, "slot_expert") /* i32 [M*topk]: local expert or -1 */     \
    X(COUNTS, "expert_num_tokens") /* i32 [E] (batched) */                   \
    X(OUT, "out")              /* act dtype bits, the result */              \
    X(W13_QWEIGHT, "w13_qweight")                                            \
    X(W13_SCALES, "w13_scales")                                              \
    X(W13_QZEROS, "w13_qzeros")                                              \
    X(W13_BIAS, "w13_bias")                                                  \
    X(W2_QWEIGHT, "w2_qweight")                                              \
    X(W2_SCALES, "w2_scales")                                                \
    X(W2_QZEROS, "w2_qzeros")                                                \
    X(W2_BIAS, "w2_bias")                                                    \
    X(MAX_TOKENS, "max_tokens") /* scalar (batched) */                      \
    X(W13_G_IDX, "w13_g_idx")   /* act order: group of each K row */         \
    X(W13_SORT_IDX, "w13_g_idx_sort_indices") /* act order, sorted K */     \
    X(W2_G_IDX, "w2_g_idx")                                                  \
    X(W2_SORT_IDX, "w2_g_idx_sort_indices")                                  \
    X(ROUTE_INFO, "route_info") /* i32 {positions, blocks} (device_route) */

typedef enum w16_moe_arg {
#define X(e, name) W16_MOE_ARG_##e,
    W16_MOE_ARG_LIST(X)
#undef X
    W16_MOE_ARG_COUNT
} w16_moe_arg_t;

/* The weight tensor of role r (qweight, scales, qzeros, bias, g_idx,
 * g_idx_sort_indices) of operand g. */
w16_moe_arg_t w16_moe_weight_arg(wna16_gemm_t g, w16_role_t r);

/* One fused-MoE configuration. */
typedef struct w16_moe_request {
    const wna16_spec_t *backend; /* stacked layout the weights are in */
    /* E, H, I, BITS, GS, zp, bias; `ungated` follows the activation and
     * act_order needs the backend's g_idx layout (and its sort indices
     * where the spec stores K sorted: act_order_sort) */
    w16_problem_t problem;
    /* Storage dtypes of the weight tensors, per operand and role (the
     * layout's first dtype when 0). */
    wna16_dtype_t dtype[2][W16_ROLE_COUNT];
    /* activation and its constants, act_dtype, router weight on the input,
     * round_gemm_outputs (expert_map is the runtime's business) */
    wna16_moe_params_t params;
    bool batched;        /* batched activation format */
    bool batched_weights; /* batched: router weights are given */
    int32_t topk;        /* standard format: experts per token */
    int block_m;         /* BM: slots per K pass of a GEMM lane, 1 .. 16 */
    int lanes;           /* GEMM workgroup size; 0: 16 */
    /* Bytes every qweight buffer's address is a multiple of (0: unknown).
     * At 4 or more, a GEMM whose layout keeps a row's codes in order along
     * its last dimension reads them as 32-bit words (w16_build_moe checks
     * the layout for every k). */
    int qweight_align;
    /* The GEMMs take their runs from the device routing kernel
     * (gen/build_route.h): one run per block of block_m positions, a grid
     * of the blocks' upper bound, workgroups past route_info's block count
     * exiting first. Else from the host (one run per expert). */
    bool device_route;
    /* The GEMMs' numeric contract (include/wna16.h, wna16_numerics_t):
     * WNA16_NUMERICS_F32 (0), or WNA16_NUMERICS_BF16_EXACT, where each
     * dequantized weight is rounded to bf16 before its product with the
     * (bf16) input, as Marlin computes. Int8-dynamic is the dedicated CPU
     * generator's (gen/moe_cpu.h), never this builder's. */
    wna16_numerics_t numerics;
} w16_moe_request_t;

typedef struct w16_moe_kernel {
    kir_kernel_t *kernel;
    w16_moe_stage_t stage;
    /* Workgroups per expert run (GEMMs) or per row (input, combine): the
     * launch is runs (rows) x tiles workgroups, row-major. */
    int64_t tiles;
    /* Parameter index of each argument the kernel takes, else -1. */
    int param[W16_MOE_ARG_COUNT];
} w16_moe_kernel_t;

/* Checks that the backend's layouts can serve the request (stacked,
 * qweight and scales present, zero points and bias when the layer has
 * them, no act-order, code widths that fit); the reason names the spec. */
wna16_status_t w16_moe_check(const w16_moe_request_t *req, wna16_error_t *err);

/* Readable stable kernel name, e.g.
 * wna16_moe_gemm1_triton_b4_g128_zp0_silu_bf16_bm8. */
void w16_moe_kernel_name(char *out, size_t n, const w16_moe_request_t *req,
                         w16_moe_stage_t stage);

/* Builds one stage's kernel. */
wna16_status_t w16_build_moe(wna16_context_t *ctx,
                             const w16_moe_request_t *req,
                             w16_moe_stage_t stage, w16_moe_kernel_t *out,
                             wna16_error_t *err);

void w16_moe_kernel_free(w16_moe_kernel_t *k);

#endif
