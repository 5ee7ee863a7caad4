/*
 * build_repack_priv.h - the repack builder's state and the few helpers
 * that build_repack.c shares with build_repack_tile.c (the GPU's staged
 * source tiles). Private to gen/build_repack*.c.
 */
#ifndef W16_BUILD_REPACK_PRIV_H
#define W16_BUILD_REPACK_PRIV_H

#include "gen/build_repack.h"
#include "gen/lower_expr.h"

typedef struct builder {
    wna16_context_t *ctx;
    const w16_repack_request_t *req;
    w16_repack_kernel_t *out;
    kir_kernel_t *k;
    kir_block_t *body;
    int64_t dv[W16_VAR_COUNT]; /* destination dims (padded) */
    int64_t sv[W16_VAR_COUNT]; /* source dims (unpadded; per projection) */
    w16_layout_t dl;           /* destination layout, folded */
    w16_layout_t sl[W16_ROLE_COUNT]; /* source layouts, folded */
    int64_t sshape[W16_ROLE_COUNT][W16_MAX_STORE_DIMS];
    const kir_param_t *dst;
    const kir_param_t *table[W16_ROLE_COUNT];
    const kir_param_t *perm; /* act-order permutation [E][K], or NULL */
    /* scale transforms of the destination and the source (8-bit
     * activations), and the operand's largest stored scale (int16 codes) */
    w16_scale_xform_t dsx, ssx;
    const kir_param_t *smax;
    const kir_expr_t *idx[W16_MAX_STORE_DIMS]; /* storage index of the lane */
    int wide; /* destination elements per word (one store of a lane) */
    /* Word blocks (plan_blocks): a kernel lane writes `unroll` words, the
     * copies of the body; the kernel's lane is bits [bp, bp + bv) of the
     * word's index within its workgroup, copy the bits below and above */
    bool blocked;
    int bp, bv, unroll, copy;
    int pos;  /* element * slots + slot within the word, for names */
    /* Staged source tiles (GPU; build_repack_tile.c), or NULL. */
    struct w16_rp_tile *tile;
    w16_lower_t L;
    wna16_error_t *err;
    const char *fail;
} builder_t;

/* A logical element of the layer, coordinates in role order (e first), each
 * a value in [0, ext). */
typedef struct lcoord {
    const kir_expr_t *c[W16_MAX_COORDS];
    int64_t ext[W16_MAX_COORDS];
    int n;
} lcoord_t;

/* build_repack.c */
const kir_expr_t *w16_rp_fail(builder_t *B, const char *why);
const kir_expr_t *w16_rp_let(builder_t *B, const char *name,
                             const kir_expr_t *e);
/* Two IR nodes' own fields are equal (their operands are not compared). */
bool w16_rp_same_node(const kir_expr_t *a, const kir_expr_t *b);
/* B->idx[d] for d < j: the digits of q (range rq) in the shape S[0..j),
 * the last fastest (named "i<d>"). */
void w16_rp_unflatten(builder_t *B, const kir_expr_t *q, w16_range_t rq,
                      const int64_t *S, int j);
/* The coordinates and validity of code slot `slot` of the element at
 * B->idx (dst_slot), and the coordinates made safe to address (clamp). */
const kir_expr_t *w16_rp_dst_slot(builder_t *B, int slot, lcoord_t *at);
void w16_rp_clamp_slot(builder_t *B, const kir_expr_t *valid, lcoord_t *at);
/* Builds the load of the stored source element of `role` at `at` (its
 * table slot and flat index go through w16_rp_source_load). */
const kir_expr_t *w16_rp_src_raw(builder_t *B, w16_role_t role,
                                 const lcoord_t *at);
/* The flat source element (within tensor *tensor) that code `slot` of
 * element `elem` of the word at grid index w reads; -1 where unknown
 * (padding, act-order, padded layouts). */
int64_t w16_rp_probe(builder_t *B, const int64_t *w, int n, int elem,
                     int slot, int64_t *tensor);

/* build_repack_tile.c: staged source tiles for GPUs (see there). */
/* Chooses a tile of the word grid S[0..n-1] whose source elements are
 * worth staging; sets B->tile and B->unroll (words per lane) and returns
 * true, or leaves both and returns false. */
bool w16_rp_tile_plan(builder_t *B, const int64_t *S, int n, int np,
                      int slots, int lanes);
/* Emits the cooperative load of the workgroup's source tile into shared
 * memory and the barrier (before any other source load). */
void w16_rp_tile_stage(builder_t *B, const int64_t *S, int n);
/* Sets B->idx to the word that copy `copy` of the lane writes and returns
 * its flat word index. */
const kir_expr_t *w16_rp_tile_map(builder_t *B, const int64_t *S, int n,
                                  int copy);
/* Whether the plan lets the block sums and the words without padding
 * branch by lane (the GPU's rows: their branches split whole warps),
 * rather than once per workgroup (which a loop vectorized over the lanes
 * needs). */
bool w16_rp_tile_lane_branches(const builder_t *B);
/* Whether a lane's copies load everything before their first store (the
 * GPU's plans without staging). */
bool w16_rp_tile_loads_first(const builder_t *B);
/* Structural equality of two IR expressions seen through let-bound
 * variables (their noted definitions). */
bool w16_rp_same_value(const builder_t *B, const kir_expr_t *a,
                       const kir_expr_t *b);
/* The kernel's comment for the plan in B->tile. */
const char *w16_rp_tile_comment(const builder_t *B);
/* The source element of `role` at table slot `slot`, flat index `flat`
 * within its tensor (= row * the last dimension + col): from the staged
 * tile where it holds it, else from memory. */
const kir_expr_t *w16_rp_source_load(builder_t *B, w16_role_t role,
                                     const kir_expr_t *slot,
                                     const kir_expr_t *flat,
                                     const kir_expr_t *row,
                                     const kir_expr_t *col);

#endif
