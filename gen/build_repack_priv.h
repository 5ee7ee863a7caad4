/*
 * build_repack_priv.h - the repack builder's state and what its files
 * share. Private to gen/build_repack*.c. The files call downwards only:
 *
 *   build_repack.c        setup, the words a kernel writes, entry points
 *     build_repack_lanes.c  lanes and words, word blocks (CPU)
 *     build_repack_tile.c   staged tiles, shared reads, rows (GPU)
 *     build_repack_sums.c   block sums, and sums in the codes' pass
 *       build_repack_elem.c   a slot's element maps, source loads, values
 *
 * Each section below lists what one file provides to the files above it.
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
    /* the variables w16_spec_bind binds (K, N, G, the group extent GSE,
     * ...) for the destination (padded) and the source (unpadded; per
     * projection) */
    int64_t dv[W16_VAR_COUNT];
    int64_t sv[W16_VAR_COUNT];
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
    /* Word blocks (w16_rp_plan_blocks): a kernel lane writes `unroll` words, the
     * copies of the body; the kernel's lane is bits [bp, bp + bv) of the
     * word's index within its workgroup, copy the bits below and above */
    bool blocked;
    int bp, bv, unroll, copy;
    int pos;  /* element * slots + slot within the word, for names */
    /* The qweight source read as 32-bit words (bytes of a row side by
     * side; see "source words" in build_repack.c) */
    bool words32;
    /* The GPU's plan of staged tiles, shared reads or rows
     * (build_repack_tile.c), or NULL. */
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

/* A GPU plan (build_repack_tile.c), which the source loads
 * (build_repack_elem.c) follow: the staged box in shared memory and the
 * loads a lane's words share. W16_RP_MEMO_SIZE: the source elements a
 * block remembers. */
enum { W16_RP_MEMO_SIZE = 32 };
struct w16_rp_tile {
    w16_role_t role;
    int lanes, copies;
    /* stage: the source box goes through shared memory (else the kernel
     * reads memory directly: shared reads or rows); shared reads: the
     * copies of a lane are bits [cbit, cbit + log2(copies)) of the
     * tile-local word index (-1: copy c is lanes * c words on); rows: a
     * workgroup is R whole rows of a layout with block sums, which it
     * writes in the same pass, lane by lane */
    bool stage, rows;
    /* rows: the workgroup's R rows run over the rows of the whole grid
     * (its dimensions but the last, flattened), where R does not divide
     * the second-to-last dimension */
    bool flat_rows;
    int cbit;
    int64_t R, C;            /* destination words: rows x columns */
    int64_t a, nrows, elems; /* source tensor: row length, rows, elements */
    int64_t ns, nu, nv;      /* box: tensors x rows x columns */
    int64_t pitch;           /* shared row length (odd: no bank conflicts) */
    int64_t ds, dr, dc;      /* box corner minus the first word's element */
    const kir_shared_t *sh;
    /* the box's corner at run time */
    const kir_expr_t *bslot, *brow, *bcol;
    /* while building the first word's source element: its table slot and
     * flat index are recorded instead of staged */
    bool capture;
    const kir_expr_t *cap_slot, *cap_row, *cap_col;
    /* the source elements read so far, by block: the code slots of a word
     * share one read (source_load in build_repack_elem.c) */
    struct {
        const kir_block_t *blk;
        const kir_expr_t *slot, *flat, *val;
    } memo[W16_RP_MEMO_SIZE];
    int n_memo;
};

/* ---- build_repack_elem.c: element maps, source loads, values ------------- */

/* Records `why` as the build's failure (the first one stays); NULL. */
const kir_expr_t *w16_rp_fail(builder_t *B, const char *why);
/* Lets a fresh variable `name` = e in B->body; a reference to it, or NULL
 * (e NULL, or out of memory: failed). */
const kir_expr_t *w16_rp_let(builder_t *B, const char *name,
                             const kir_expr_t *e);
/* Lowers a spec expression with the variables bound in B->L; its range in
 * *r (r may be NULL); NULL and failed where it cannot. */
const kir_expr_t *w16_rp_lower(builder_t *B, const w16_expr_t *x,
                               w16_range_t *r);
/* Two IR nodes' own fields are equal (their operands are not compared). */
bool w16_rp_same_node(const kir_expr_t *a, const kir_expr_t *b);
/* Structural equality of two IR expressions. */
bool w16_rp_same_expr(const kir_expr_t *a, const kir_expr_t *b);
/* Structural equality of two IR expressions seen through let-bound
 * variables (their noted definitions). */
bool w16_rp_same_value(const builder_t *B, const kir_expr_t *a,
                       const kir_expr_t *b);
/* B->idx[d] for d < j: the digits of q (range rq) in the shape S[0..j),
 * the last fastest (named "i<d>"). */
void w16_rp_unflatten(builder_t *B, const kir_expr_t *q, w16_range_t rq,
                      const int64_t *S, int j);
/* The logical coordinates of code slot `slot` of the element at B->idx
 * (into *at, meaningful where the slot holds a value) and the i1 "this
 * slot holds a value", not let-bound; NULL on failure. */
const kir_expr_t *w16_rp_dst_slot(builder_t *B, int slot, lcoord_t *at);
/* Replaces the coordinates in *at by 0 where `valid` is false, so that the
 * source is never addressed out of bounds (nothing where valid is true). */
void w16_rp_clamp_slot(builder_t *B, const kir_expr_t *valid, lcoord_t *at);
/* The source value of `role` at `at`, loaded and extracted (i64): a code,
 * after the source's decode transform unless `raw`, or a float's bits. */
const kir_expr_t *w16_rp_src_value(builder_t *B, w16_role_t role,
                                   const lcoord_t *at, bool raw);
/* The destination bits (i64, before masking and shifting) of the slot at
 * `at` where `valid`, else 0. */
const kir_expr_t *w16_rp_slot_bits(builder_t *B, const kir_expr_t *valid,
                                   lcoord_t at);
/* The flat source element (within tensor *tensor) that code `slot` of
 * element `elem` of the word at grid index w reads; -1 where unknown
 * (padding, act-order, padded layouts). */
int64_t w16_rp_probe(builder_t *B, const int64_t *w, int n, int elem,
                     int slot, int64_t *tensor);

/* ---- build_repack_sums.c: block sums ------------------------------------- */

/* The sum of (q - z) (i64) over block kb (bk codes) of column n of expert
 * e; `tag` keeps the names of its loop apart. NULL and failed on failure. */
const kir_expr_t *w16_rp_block_sum(builder_t *B, const kir_expr_t *e,
                                   const kir_expr_t *n, const kir_expr_t *kb,
                                   int64_t bk, int tag);
/* The block sums of a lane's T copies (block sc[t][2] of column sc[t][1]
 * of expert sc[t][0]) into sum[t], at once where the copies read the same
 * source elements: true (B->fail set on an error), or false with nothing
 * emitted where they do not. */
bool w16_rp_block_sums_shared(builder_t *B, const kir_expr_t *(*sc)[3], int T,
                              int64_t bk, const kir_expr_t **sum);
/* Whether the codes kernel can write the layout's sums too: words of 4
 * bytes, each sum starting at a word. */
bool w16_rp_sums_fusable(builder_t *B);
/* The sum's coordinates (e, n, g) of the word at B->idx into c[] and the
 * i1 "a sum starts there" (after w16_rp_sums_fusable). */
const kir_expr_t *w16_rp_sum_slot(builder_t *B, const kir_expr_t *c[3]);
/* Whether the i1 `all` (every slot of the words is valid) holds wherever
 * the i1 `sums` does not, as their structure shows. */
bool w16_rp_valid_without_sums(const builder_t *B, const kir_expr_t *sums,
                               const kir_expr_t *all);

/* ---- build_repack_lanes.c: lanes and words, word blocks ------------------ */

/* Chooses the word blocks of the word grid S[0..n-1] (np code positions a
 * word, `slots` a element): sets B->blocked, bp, bv, unroll and returns
 * the words per workgroup, or returns max_lanes (one word per lane). */
int w16_rp_plan_blocks(builder_t *B, const int64_t *S, int n, int np,
                       int slots, int max_lanes);
/* Sets the kernel's lanes and groups for the word grid S[0..n-1], fills
 * B->idx with the storage index (in words) of the word the lane (its copy
 * B->copy) writes and returns its flat word index. */
const kir_expr_t *w16_rp_map_lanes(builder_t *B, const int64_t *S, int n,
                                   int max_lanes);

/* ---- build_repack_tile.c: the GPU's plans -------------------------------- */

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
/* The kernel's comment for the plan in B->tile. */
const char *w16_rp_tile_comment(const builder_t *B);

#endif
