/*
 * moe_cuda.h - the CUDA fused-MoE generator: from a backend spec and a
 * bound problem to specialized CUDA C translation units of the templates
 * in templates/ (moe_marlin_gemm.cu, moe_aux.cu).
 *
 *   backend spec + problem --contract--> operand facts (N, K, G, layouts)
 *   spec "tiling" + problem --tile-----> w16_moe_gemm_cfg_t
 *   w16_moe_gemm_cfg_t --source--------> prelude (constants) + template
 *
 * The template hard-codes how it reads the Marlin family (a 16x64 tile of
 * codes feeds mma.m16n8k16 B fragments, scales in one of two column
 * permutations, 4-bit zero points interleaved, bias in the 32-entry
 * permutation). The contract check proves, on the bound problem, that the
 * spec's forward maps send every logical element exactly where the
 * template reads it, and picks the scale permutation the spec uses for
 * this operand (Marlin's choice depends on the group size and, for w13, on
 * the unpadded intermediate size: hazard H1). A spec whose layout is
 * anything else is refused with the first element that differs, never
 * read wrongly. Only constants reach the generated text: no spec string.
 */
#ifndef W16_MOE_CUDA_H
#define W16_MOE_CUDA_H

#include "spec/spec.h"

/* Column permutations of a scale row the template can read. */
typedef enum w16_moe_scales {
    W16_MOE_SCALES_T64 = 0, /* 8x8 transpose in every 64 columns (grouped) */
    W16_MOE_SCALES_T32 = 1, /* the 32-entry table (channelwise, bias) */
} w16_moe_scales_t;

/* What the contract check learns about one operand of a problem. */
typedef struct w16_moe_operand {
    int64_t N, K, G;          /* as stored (w13: N = 2*IP, K = H) */
    int64_t IP;               /* the padded intermediate size */
    w16_moe_scales_t scales;  /* the scale permutation */
    /* storage shapes, for checking tensors; ndim 0 = role absent */
    int ndim[W16_ROLE_COUNT];
    int64_t shape[W16_ROLE_COUNT][W16_MAX_STORE_DIMS];
} w16_moe_operand_t;

/* Checks that `spec`'s layouts of operand `gemm` of problem `p` are the
 * ones the template reads and fills `out`. EUNSUPPORTED with the reason
 * (and the first logical element placed elsewhere) otherwise. */
wna16_status_t w16_moe_cuda_contract(const wna16_spec_t *spec,
                                     const w16_problem_t *p,
                                     wna16_gemm_t gemm, w16_moe_operand_t *out,
                                     wna16_error_t *err);

/* Everything that decides one GEMM translation unit. */
typedef struct w16_moe_gemm_cfg {
    wna16_gemm_t gemm;       /* W13: + activation; W2: float32 output */
    int bits;                /* 4 or 8 */
    bool zp;                 /* explicit 4-bit zero points */
    bool act_order;          /* per-k groups through g_idx */
    bool grouped;            /* G > 1: scales in the main loop, else in
                                the epilogue on the float32 sums */
    w16_moe_scales_t scales;
    wna16_dtype_t act_dtype, scale_dtype, bias_dtype; /* F16 or BF16 */
    wna16_activation_t activation; /* W13 only (gated) */
    int block_m, block_n, block_k, warps_n, warps_k, stages;
    int min_ctas;            /* launch bounds: CTAs per SM; 0 or 1 = none */
    bool wgmma;              /* templates/moe_wgmma_gemm.cu (sm_90a): warp
                                groups of 4 warps_n, block_m 64 or 128 */
    bool scales_in_b;        /* no deferred group scales (the row's key) */
    bool ws;                 /* wgmma: warp-specialized, a producer
                                warpgroup beside the warps_n warps */
    bool acc_scales;         /* wgmma, grouped: group scales on the float32
                                accumulators, exact codes in the A operand */
    int wgmma_groups;        /* wgmma: groups in flight a warpgroup, 1 or
                                2 (0 reads as 1) */
    int tail_m;              /* wgmma, warp-specialized, two slices: the
                                rows of the expert's last block taken
                                beside this one (0: none) */
    bool persistent;         /* wgmma, warp-specialized: one CTA an SM
                                loops over the filled items (PERSIST) */
    bool split_codes;        /* wgmma, warp-specialized, 4-bit: the codes
                                in shared memory by warp half, two k16
                                steps a 16-byte lane vector */
    bool group_stages;       /* grouped, group_size a multiple of 64: the
                                wgmma template changes groups only at
                                stage starts (two groups in flight need
                                it) */
    bool split_sums;         /* w13, mma.sync: the GEMM adds its split-K
                                slabs itself (the last split of a tile,
                                templates/moe_gemm_common.cu splitk_fixup)
                                instead of the reduce kernel */
    bool self_route;         /* mma.sync, at most 32 routed slots (the
                                host's choice for the run): each CTA routes
                                its own row block from the top-k ids
                                (templates/moe_route_warp.cu), and the run
                                launches no routing kernel */
    int group_size;          /* grouped, not act-order: the group size, a
                                constant of the mma.sync unit (its stages'
                                group rows and checks fold to constants);
                                0 otherwise */
} w16_moe_gemm_cfg_t;

/* The quantization groups of an operand stored in G groups of
 * `group_size` rows (-1 or the operand's K when channelwise): grouped,
 * group_stages and group_size of `c` (act_order must be set first). */
void w16_moe_cfg_groups(w16_moe_gemm_cfg_t *c, int64_t G,
                        int64_t group_size);

/* The routing block (block_m) for a number of routed slots per expert;
 * EUNSUPPORTED when the spec has no tiling. `wgmma_ok`: the problem can
 * run on wgmma (an sm_90 device, no act order), so the tiling's wgmma
 * rows count; *wgmma (may be NULL) tells whether the row is one. */
wna16_status_t w16_moe_cuda_block_m(const wna16_spec_t *spec,
                                    int64_t tokens_per_expert, bool wgmma_ok,
                                    int *block_m, bool *wgmma,
                                    wna16_error_t *err);

/* The most routed slots of a run whose GEMM CTAs route their own row
 * blocks (w16_moe_gemm_cfg_t.self_route: one warp, a lane a slot). */
#define W16_MOE_SELF_ROUTE_SLOTS 32

/* Whether some run of at most W16_MOE_SELF_ROUTE_SLOTS routed slots over
 * at least `experts` experts (the layer's; an expert map's ids name more)
 * gets the mma.sync row of `block_m` on either kind of device, so that its
 * self_route units may be asked for (`wna16 pack` packs them). */
bool w16_moe_cuda_self_route_row(const wna16_spec_t *spec, int block_m,
                                 int64_t experts);

/* Fills cfg's tile fields for one GEMM of N x K from the spec's tiling:
 * the first matching row (a wgmma row when `wgmma`, the block_m row's
 * kind), with block_k halved until it divides K (K is a
 * multiple of 64 for every Marlin operand) and warps_k capped to the k16
 * steps left. `json_path` (may be NULL) receives the row's path. */
wna16_status_t w16_moe_cuda_tile(const wna16_spec_t *spec, int block_m,
                                 bool wgmma, wna16_gemm_t gemm, int64_t N,
                                 int64_t K,
                                 w16_moe_gemm_cfg_t *cfg,
                                 const char **json_path, wna16_error_t *err);

/* The split-K bounds of the row w16_moe_cuda_tile picks for the same
 * problem: at most *max_split K slices, aiming at *ctas_per_sm CTAs per
 * SM (the tiling row's "max_split_k" and "ctas_per_sm"). */
void w16_moe_cuda_split(const wna16_spec_t *spec, int block_m, bool wgmma,
                        wna16_gemm_t gemm, int64_t N, int64_t K,
                        int *max_split, int *ctas_per_sm);

/* What decides a GEMM unit besides its tile: the layer's quantization,
 * its tensors' dtypes and the run's activation (w16_moe_cuda_cfg copies
 * them into a configuration). */
typedef struct w16_moe_unit_quant {
    int bits;
    bool zp, act_order;
    int64_t group_size;            /* the layer's; -1 channelwise */
    wna16_dtype_t act_dtype;       /* the run's activations */
    wna16_dtype_t scale_dtype;     /* the scales tensor's */
    wna16_dtype_t bias_dtype;      /* the bias tensor's; F16 without one */
    wna16_activation_t activation; /* the run's (w13's epilogue) */
} w16_moe_unit_quant_t;

/* The configuration of GEMM `gemm`'s unit over operand `op` (from
 * w16_moe_cuda_contract) at routing block `block_m` of the tiling kind
 * `wgmma` (from w16_moe_cuda_block_m), as the runtime launches it: every
 * byte zeroed first (configurations are compared by their bytes and
 * hashed into request keys), the tile of w16_moe_cuda_tile, then q's
 * fields (w13 takes the activation). split_sums and self_route stay false: a
 * run sets them (split_sums: w13 on mma.sync rows, when its split-K sums
 * fit one wave; self_route: at most 32 routed slots), so the same tile has
 * a unit with and one without each. Every caller that names a
 * unit (the runtime, `wna16 pack`) goes through here, so that equal
 * problems give equal configurations and request keys. */
wna16_status_t w16_moe_cuda_cfg(const wna16_spec_t *spec,
                                const w16_moe_operand_t *op,
                                const w16_moe_unit_quant_t *q, int block_m,
                                bool wgmma, wna16_gemm_t gemm,
                                w16_moe_gemm_cfg_t *c, const char **json_path,
                                wna16_error_t *err);

/* Threads and dynamic shared memory of one CTA. */
unsigned w16_moe_gemm_threads(const w16_moe_gemm_cfg_t *c);
size_t w16_moe_gemm_shared(const w16_moe_gemm_cfg_t *c);

/* The kernel's readable name, every parameter spelled out, e.g.
 * "w16_moe_marlin_w13_silu_f16_b4_zp_ao_gq_t64_sf16_bf16_m16n128k128_w2x4_p4". */
void w16_moe_gemm_name(const w16_moe_gemm_cfg_t *c, char *out, size_t size);

/* The whole translation unit of one GEMM (NUL-terminated in b); for w13 it
 * also holds the split-K reduction kernel, named as the GEMM + "_reduce".
 * Fails
 * (EINVAL) on a configuration the template cannot take. */
wna16_status_t w16_moe_gemm_source(const w16_moe_gemm_cfg_t *c, w16_buf_t *b,
                                   wna16_error_t *err);

/* The one-kernel decode layer (templates/moe_decode.cu): routing, GEMM 1
 * and the activation, GEMM 2 and the weighted top-k sums in one
 * persistent kernel, for at most W16_MOE_DECODE_MAX_SLOTS routed slots
 * and W16_MOE_DECODE_MAX_ROWS tokens (the runtime's choice at decode
 * sizes, runtime/cuda/cuda_moe.c). What decides its unit: */
typedef struct w16_moe_decode_cfg {
    int bits;                        /* 4 or 8 */
    bool zp;                         /* 4-bit zero points */
    bool grouped;                    /* G > 1 */
    int group_size;                  /* grouped: a multiple of 32; else 0 */
    w16_moe_scales_t scales[2];      /* w13's and w2's permutations */
    wna16_dtype_t act_dtype, scale_dtype, bias_dtype; /* F16 or BF16 */
    wna16_activation_t activation;   /* gated */
} w16_moe_decode_cfg_t;

enum {
    W16_MOE_DECODE_THREADS = 256,   /* a CTA: 8 warps */
    W16_MOE_DECODE_MAX_SLOTS = 64,  /* routed slots (M x top-k) a run */
    W16_MOE_DECODE_MAX_ROWS = 8,    /* tokens a run */
    W16_MOE_DECODE_KC = 256,        /* K of a chunk, a split's unit */
    W16_MOE_DECODE_CTAS = 2,        /* CTAs an SM (its launch bounds) */
};

/* The decode unit of a layer whose operands the contract checked (op[0]
 * w13, op[1] w2) under quantization q, every byte of *c set (it is
 * hashed into request keys). EUNSUPPORTED with the reason when the layer
 * cannot run it: act order, a group size that is not a multiple of 32,
 * an intermediate or hidden size that is not a multiple of 64, an
 * activation that is not gated. */
wna16_status_t w16_moe_decode_cfg(const w16_moe_operand_t op[2],
                                  const w16_moe_unit_quant_t *q,
                                  w16_moe_decode_cfg_t *c,
                                  wna16_error_t *err);
/* "w16_moe_decode_silu_bf16_b4_g128_t64t32_sbf16_bf16": every field. */
void w16_moe_decode_name(const w16_moe_decode_cfg_t *c, char *out,
                         size_t size);
/* The unit's translation unit (NUL-terminated in b); EINVAL on a
 * configuration the template cannot take, naming the field. */
wna16_status_t w16_moe_decode_source(const w16_moe_decode_cfg_t *c,
                                     w16_buf_t *b, wna16_error_t *err);

/* The routing / gather / finalize kernels of templates/moe_aux.cu, in the
 * order of w16_moe_aux_names; specialized on the activation dtype only.
 * They compile in W16_AUX_PIECES units ("pieces"), each a run of this
 * enum: one unit of all eleven (before the rows' finalize) cost NVRTC
 * 0.6-0.8 s on a 2-core machine
 * (the optimizer and ptxas; w16_finalize_small alone 0.3 s), a piece at
 * most about 0.35 s. The pieces compile in parallel threads, and a layer
 * compiles only the pieces it launches (its first call 8-18% shorter on
 * two cores; each piece 14-25 ms on the H200's 16-core host). */
enum {
    /* W16_AUX_PIECE_ROUTE: the routing, every run */
    W16_AUX_ROUTE_COUNT,
    W16_AUX_ROUTE_SCAN,
    W16_AUX_ROUTE_FILL,
    W16_AUX_ROUTE_SCATTER,
    W16_AUX_ROUTE_SMALL,
    /* W16_AUX_PIECE_FINALIZE_SMALL: the latency-bound finalize */
    W16_AUX_FINALIZE_SMALL,
    /* W16_AUX_PIECE_GATHER_FINALIZE: the gather, the other finalizes and
     * the act-order checks (small kernels) */
    W16_AUX_GATHER,
    W16_AUX_FINALIZE,
    W16_AUX_FINALIZE_ROWS,
    W16_AUX_FINALIZE_BATCHED,
    W16_AUX_CHECK_ACT_ORDER,
    W16_AUX_CHECK_SEEN,
    W16_AUX_COUNT
};
enum {
    W16_AUX_PIECE_ROUTE,
    W16_AUX_PIECE_FINALIZE_SMALL,
    W16_AUX_PIECE_GATHER_FINALIZE,
    W16_AUX_PIECES,
    W16_AUX_WHOLE = W16_AUX_PIECES /* every kernel in one unit */
};
extern const char *const w16_moe_aux_names[W16_AUX_COUNT];
/* Routing constants the host must agree on (templates/moe_aux.cu). */
#define W16_AUX_CHUNK 1024
#define W16_AUX_ROUTE_THREADS 256
#define W16_AUX_SCAN_THREADS 1024
/* err[] slots written by the aux kernels. */
enum { W16_AUX_ERR_ID, W16_AUX_ERR_COUNT, W16_AUX_ERR_GIDX, W16_AUX_ERR_PERM,
       W16_AUX_ERR_SLOTS };

/* The kernels of piece p (W16_AUX_WHOLE: all), [*first, *first + *n) of
 * the enum above. */
void w16_moe_aux_range(int piece, int *first, int *n);
/* The piece's unit name: "w16_moe_aux_route_bf16", ... ("w16_moe_aux_f16"
 * / "w16_moe_aux_bf16" for W16_AUX_WHOLE). */
const char *w16_moe_aux_unit(wna16_dtype_t act_dtype, int piece);
/* The piece's translation unit (NUL-terminated in b): the template with
 * only the piece's kernels defined. */
wna16_status_t w16_moe_aux_source(wna16_dtype_t act_dtype, int piece,
                                  w16_buf_t *b, wna16_error_t *err);

#endif
