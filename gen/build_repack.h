/*
 * build_repack.h - builds repack kernels in the kernel IR from two specs.
 *
 * One kernel fills one destination tensor (one role of one operand, e.g.
 * w13_qweight) of a stacked layout. It is a gather: every lane owns one
 * destination word (an element, or a few consecutive narrow ones), walks
 * the code slots of each element through the destination's inverse map
 * to logical coordinates, undoes the destination's padding, finds each
 * value in the source through the source's forward map (per expert and
 * projection tensors through a buffer table, stacked tensors
 * through a one-entry table), converts it (value transforms, float
 * formats, dequantization for layouts that hold dequantized weights) and
 * writes the whole word once. For the CPU (request.word_blocks) a lane may
 * own a block of such words, chosen so that the vectorized lanes load
 * consecutive source words (build_repack_lanes.c, "word blocks"); on a GPU
 * (request.staged_tiles) a workgroup may first stage the source tile its
 * words read in shared memory, a lane may write the few words that read
 * the same source elements, or a workgroup whole rows of a layout with
 * block sums (build_repack_tile.c). Nothing here
 * is specific to a format or a backend: the specs say everything, and
 * every dimension is a constant in the kernel.
 */
#ifndef W16_BUILD_REPACK_H
#define W16_BUILD_REPACK_H

#include "gen/kir.h"
#include "spec/spec.h"

typedef struct w16_repack_request {
    const wna16_spec_t *src; /* format (per expert) or stacked spec */
    const wna16_spec_t *dst; /* stacked spec (a backend, MoeWNA16) */
    w16_problem_t problem;   /* the logical layer (unpadded I) */
    wna16_gemm_t gemm;
    w16_role_t role;         /* destination role */
    /* dtypes of the source tensors per role; INVALID = not read */
    wna16_dtype_t src_dtype[W16_ROLE_COUNT];
    wna16_dtype_t dst_dtype; /* one of the destination layout's dtypes */
    int lanes;               /* largest workgroup size (0 = 256); the
                                builder picks one that tiles the tensor */
    /* act-order sorted destination: the source's K is read through a map
     * [E][K] (i32, parameter perm_param), and the g_idx_sort_indices
     * kernel writes the permutation given as parameter perm_param too (the
     * runtime passes the destination's permutation there; the two differ
     * only when the source is itself sorted) */
    bool sort_k;
    /* A lane may write a block of words where the layout's maps show that
     * this turns the lanes' gathers into consecutive or shared loads
     * (build_repack_lanes.c: word blocks): for targets that vectorize the
     * loop over lanes (the CPU); GPUs want one word per lane. */
    bool word_blocks;
    /* A workgroup may stage the source tile it reads in shared memory and
     * read it from there, or use the plans without staging (shared reads,
     * rows) (build_repack_tile.c): for targets with workgroup-shared
     * memory and barriers, whose branches by lane are cheap (CUDA). */
    bool staged_tiles;
} w16_repack_request_t;

typedef struct w16_repack_kernel {
    kir_kernel_t *kernel;
    /* destination tensor */
    int ndim;
    int64_t shape[W16_MAX_STORE_DIMS];
    int64_t elems;
    int64_t num_groups;
    /* kernel parameter 0 is the destination buffer; src_param[role] is the
     * parameter index of the source table of that role, or -1 */
    int src_param[W16_ROLE_COUNT];
    int perm_param; /* -1 unless sort_k */
    /* f32 scalar parameter: the operand's largest stored scale, which int16
     * scale codes and the input_global_scale are relative to (the runtime
     * computes it before the launch); -1 when the kernel needs none */
    int scale_max_param;
    /* entries of every source table: E * projections (per-expert source)
     * or 1 (stacked) */
    int table_slots;
    bool per_expert_source;
    /* This kernel writes block sums (CPU compensation) into an already
     * filled tensor rather than the whole tensor. */
    bool sums;
    /* This (codes) kernel writes the block sums too, in the same pass: the
     * separate sums kernel is not needed (build_repack_sums.c, "sums in
     * the codes' pass"). */
    bool sums_fused;
} w16_repack_kernel_t;

/* Readable stable name, e.g. wna16_repack_gptq_to_triton_w13_qweight_b4_g128_zp0;
 * kernels that read a float tensor end with its dtype, and the
 * destination's where it differs (..._scales_b4_g128_zp0_bf16_f32), so one
 * name means one kernel for a given problem shape (the shape is in the
 * kernel cache key, not in the name). */
void w16_repack_kernel_name(char *out, size_t n, const w16_repack_request_t *r);

/* The runtime's choices for a request, shared so tools and tests build the
 * kernels it builds. w16_repack_source_roles: the source roles the kernel
 * for destination role `dst` reads (fill src_dtype[] for exactly these);
 * returns how many (at most W16_REPACK_MAX_SOURCES). w16_repack_dst_dtype:
 * the dtype the destination tensor is written in: the first source role's
 * dtype where the layout stores it, else the layout's first dtype (always
 * the first for dequantized weights). */
enum { W16_REPACK_MAX_SOURCES = 4 };
int w16_repack_source_roles(w16_role_t dst, const w16_problem_t *p,
                            w16_role_t out[W16_REPACK_MAX_SOURCES]);
wna16_dtype_t w16_repack_dst_dtype(const w16_layout_t *l,
                                   wna16_dtype_t first_src);

/* Builds the kernel for one destination tensor. Refuses with a reason what
 * it cannot generate (e.g. a non-stacked destination). */
wna16_status_t w16_build_repack(wna16_context_t *ctx,
                                const w16_repack_request_t *req,
                                w16_repack_kernel_t *out, wna16_error_t *err);

/* Builds the block-sums kernel for a destination whose qweight layout has
 * "sums" (one lane per expert, output channel and block). */
wna16_status_t w16_build_repack_sums(wna16_context_t *ctx,
                                     const w16_repack_request_t *req,
                                     w16_repack_kernel_t *out,
                                     wna16_error_t *err);

void w16_repack_kernel_free(w16_repack_kernel_t *k);

#endif
