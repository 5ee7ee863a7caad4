/*
 * build_route.h - the routing kernel of the generated fused MoE where a
 * call runs on the device (the targets whose moe_orch is DEVICE: xpu
 * through Level Zero, ocl): vLLM's moe_align_block_size as one workgroup
 * of kernel IR, so that a call is a fixed list of launches with no host
 * read between them.
 *
 * Its outputs are wna16_moe_align's arrays, entry for entry (the routing
 * unit test compares them): sorted_ids, the routed slots sorted by local
 * expert (stable: slot order within an expert), each expert's run padded
 * to the block size BM with the sentinel (numel, or E * max_tokens
 * batched) and the sentinel up to `cap`; expert_ids, the expert of each
 * block and -1 past the last; and route_info = {num_tokens_post_padded,
 * number of blocks}. Besides them, what the GEMMs of gen/build_moe.c read
 * with device routing (w16_moe_request_t.device_route): one expert run
 * per block, (begin, end, expert) with end - begin the block's real
 * slots, and slot_expert, each slot's local expert or -1 (the combine's).
 *
 *   one workgroup of `lanes` lanes; lane l owns the experts
 *   [l*C, l*C + C), C = ceil(E / lanes)
 *   count    per tile of `lanes` slots: each lane maps its slot's id
 *            (expert_map, ids outside the experts absent) into shared
 *            memory; owners count their experts in the tile
 *   scan     owners sum their padded counts; a Hillis-Steele scan over
 *            the lanes' sums (shared memory, barriers) gives each
 *            expert's first position; owners write padding, blocks, runs
 *   scatter  the tiles again in order: a slot goes to its expert's cursor
 *            plus the number of earlier lanes of the tile with the same
 *            expert; owners advance their cursors by the tile's count
 *   (batched: counts are given; owners write each expert's rows)
 *
 * Deterministic and without atomics. E, BM and the lane count are
 * constants of the kernel; numel, the number of ids, max_tokens and cap
 * are arguments. The CPU target keeps host routing (runtime/moe_route.c):
 * its emitter has no shared memory or barriers, and host routing is the
 * faster there.
 */
#ifndef W16_BUILD_ROUTE_H
#define W16_BUILD_ROUTE_H

#include "gen/kir.h"

/* Arguments by meaning; buffers of i32, scalars i64. ORDER ROUTEARG. */
#define W16_ROUTE_ARG_LIST(X)                                                \
    X(TOPK_IDS, "topk_ids")        /* [numel] (standard) */                  \
    X(EXPERT_MAP, "expert_map")    /* [n_ids] (standard, with a map) */      \
    X(COUNTS, "expert_num_tokens") /* [E] (batched) */                       \
    X(NUMEL, "numel")              /* scalar: M * topk (standard) */         \
    X(N_IDS, "n_ids")              /* scalar: expert ids (standard) */       \
    X(MAX_TOKENS, "max_tokens")    /* scalar (batched) */                    \
    X(CAP, "cap")                  /* scalar: sorted_ids' length */          \
    X(SLOT_EXPERT, "slot_expert")  /* out [numel] (standard) */              \
    X(SORTED, "sorted_ids")        /* out [cap] */                           \
    X(EXPERT_IDS, "expert_ids")    /* out [ceil(cap / BM)] */                \
    X(RUNS, "expert_runs")         /* out [ceil(cap / BM)][3] */             \
    X(INFO, "route_info")          /* out [2] */

typedef enum w16_route_arg {
#define X(e, name) W16_ROUTE_ARG_##e,
    W16_ROUTE_ARG_LIST(X)
#undef X
    W16_ROUTE_ARG_COUNT
} w16_route_arg_t;

typedef struct w16_route_request {
    int32_t E;     /* local experts, 1 .. 4096 */
    int block_m;   /* BM, 1 .. 256 */
    bool batched;  /* counts given (batched format) */
    bool map;      /* standard: ids go through an expert map */
    int lanes;     /* the workgroup; 0: 256 */
} w16_route_request_t;

typedef struct w16_route_kernel {
    kir_kernel_t *kernel; /* one workgroup */
    int param[W16_ROUTE_ARG_COUNT]; /* parameter index, else -1 */
} w16_route_kernel_t;

/* The length of sorted_ids for numel routed slots over E experts with
 * blocks of BM (vLLM's max_num_tokens_padded, as wna16_moe_align sizes
 * it for E experts), or for the batched format's E x max_tokens rows. */
int64_t w16_route_capacity(int64_t numel, int32_t E, int block_m);
int64_t w16_route_capacity_batched(int32_t E, int64_t max_tokens,
                                   int block_m);

/* "wna16_moe_route_e8_bm4_map" */
void w16_route_kernel_name(char *out, size_t n, const w16_route_request_t *r);

wna16_status_t w16_build_route(wna16_context_t *ctx,
                               const w16_route_request_t *req,
                               w16_route_kernel_t *out, wna16_error_t *err);
void w16_route_kernel_free(w16_route_kernel_t *k);

#endif
