/*
 * build_repack_lanes.c - which destination words a lane of the repack
 * kernel writes: the workgroups' tiling of the word grid, the lanes'
 * direction (along the rows, or down the columns of a transpose on the
 * CPU) and the word blocks of the CPU (a lane writes a few words whose
 * source loads then run consecutively or are shared). Both are chosen by
 * probing the specs' maps on numbers (w16_rp_probe); they change the
 * kernel's speed, never the words it writes. The GPU's plans of staged
 * tiles, shared reads and rows are build_repack_tile.c's.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }

/* ---- lanes and words ------------------------------------------------------
 *
 * A lane writes one destination word: `wide` consecutive elements of the
 * last dimension (4 bytes for byte and half-word layouts), so narrow
 * layouts cost one store per word and the codes a word takes from one
 * source word are extracted from one load.
 *
 * Lanes run along the trailing dimensions of the word grid [S0 .. Sn-1]: a
 * workgroup is t consecutive values of dimension j times all of the
 * dimensions after it (L = t * Sj+1 * ... * Sn-1 lanes, t dividing Sj), so
 * the word a lane writes is group * L + lane, no lane is ever past the end,
 * and every index but the lane's part of the trailing ones depends on the
 * group alone (the CPU emitter hoists it out of the loop over lanes):
 *
 *   q  = group / (Sj / t)                    dims 0 .. j-1 from q
 *   ij = (group % (Sj / t)) * t + lane / P   P = Sj+1 * ... * Sn-1
 *   id = (lane / (Sd+1 * ... * Sn-1)) % Sd   d > j
 *
 * Shapes with no such tiling of at least MIN_LANES lanes (a large prime
 * last dimension) fall back to a plain flat index with a bounds check.
 */
enum { MIN_LANES = 32 };

/* The layout's lane (i64) the current copy of the body writes. */
static const kir_expr_t *copy_lane(builder_t *B)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *lane = kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID),
                                          false);
    if (!B->blocked)
        return lane;
    int64_t low = B->copy & ((1 << B->bp) - 1), high = B->copy >> B->bp;
    return w16_ir_add(k, w16_ir_mul(k, lane, ik(B, INT64_C(1) << B->bp)),
                      ik(B, low + (high << (B->bp + B->bv))));
}

/* flat = group * lanes + lane; return when past `total`. */
static const kir_expr_t *lane_index(builder_t *B, int64_t total)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *flat = w16_rp_let(B, "flat", w16_ir_add(k,
        w16_ir_mul(k, kir_builtin(k, KIR_OP_GROUP_ID), ik(B, k->lanes)),
        kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID), false)));
    kir_stmt_t *s = kir_if(k, B->body, kir_bin(k, KIR_OP_SLE, ik(B, total), flat));
    if (!s || !kir_return(k, &s->body))
        return w16_rp_fail(B, "out of memory");
    B->out->num_groups = (total + k->lanes - 1) / k->lanes;
    return flat;
}

/* Lanes down the columns instead: a workgroup is TA consecutive rows
 * (dimension n-2) of one column (dimension n-1) of the word grid. */
static const kir_expr_t *map_columns(builder_t *B, const int64_t *S, int n,
                                     int64_t TA)
{
    kir_kernel_t *k = B->k;
    int64_t cols = S[n - 1], rows = S[n - 2] / TA, total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    k->lanes = (int)TA;
    B->out->num_groups = total / TA;
    B->L.num_groups = B->out->num_groups;
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    const kir_expr_t *lane = copy_lane(B);
    w16_range_t rg = {0, B->out->num_groups - 1};
    const kir_expr_t *col = w16_ir_floormod(&B->L, g, cols, rg);
    const kir_expr_t *gr = w16_ir_floordiv(&B->L, g, cols, rg);
    w16_range_t rr = {0, rg.hi / cols};
    const kir_expr_t *band = w16_ir_floormod(&B->L, gr, rows, rr);
    const kir_expr_t *q = w16_ir_floordiv(&B->L, gr, rows, rr);
    w16_range_t rq = {0, rr.hi / rows};
    char name[8];
    snprintf(name, sizeof name, "i%d", n - 1);
    B->idx[n - 1] = w16_rp_let(B, name, col);
    snprintf(name, sizeof name, "i%d", n - 2);
    B->idx[n - 2] = w16_rp_let(B, name, w16_ir_add(k, w16_ir_mul(k, band, ik(B, TA)), lane));
    int64_t stride = 1;
    for (int d = n - 3; d >= 0; d--) {
        snprintf(name, sizeof name, "i%d", d);
        B->idx[d] = w16_rp_let(B, name, w16_ir_floormod(&B->L,
            w16_ir_floordiv(&B->L, q, stride, rq), S[d], (w16_range_t){0, rq.hi / stride}));
        stride *= S[d];
    }
    /* (q * S[n-2] + i(n-2)) * S[n-1] + i(n-1) */
    return w16_ir_add(k, w16_ir_mul(k, w16_ir_add(k, w16_ir_mul(k, q, ik(B, S[n - 2])),
                                                  B->idx[n - 2]),
                                    ik(B, S[n - 1])),
                      B->idx[n - 1]);
}

/* The source element that code 0 of the word at grid index w reads
 * (w16_rp_probe): the lanes' direction depends on it. */
static int64_t probe_source(builder_t *B, const int64_t *w, int n,
                            int64_t *tensor)
{
    return w16_rp_probe(B, w, n, 0, 0, tensor);
}

/* Whether the lanes should run down the columns of the destination: when
 * along a row its words come from source elements a multiple of 4 KiB
 * apart (the source rows of a transpose: every lane's load would fall in
 * the same cache set) while down a column they come from neighbouring
 * elements, and the destination rows are not themselves 4 KiB-aligned. */
static bool lanes_down_columns(builder_t *B, const int64_t *S, int n)
{
    if (n < 2 || S[n - 1] < 32 || S[n - 2] < 16)
        return false;
    w16_role_t role = B->dl.role == W16_ROLE_WEIGHT ? W16_ROLE_QWEIGHT : B->dl.role;
    int64_t w[W16_MAX_STORE_DIMS] = {0}, t0, t1, t2;
    int64_t base = probe_source(B, w, n, &t0);
    w[n - 1] = 16;
    int64_t across = probe_source(B, w, n, &t1);
    w[n - 1] = 0;
    w[n - 2] = 1;
    int64_t down = probe_source(B, w, n, &t2);
    if (base < 0 || across < 0 || down < 0 || t0 != t1 || t0 != t2)
        return false;
    int64_t esz = (int64_t)wna16_dtype_size(B->req->src_dtype[role]);
    int64_t along = (across - base) * esz / 16, step = (down - base) * esz;
    int64_t row = S[n - 1] * (int64_t)wna16_dtype_size(B->req->dst_dtype) * B->wide;
    along = along < 0 ? -along : along;
    step = step < 0 ? -step : step;
    return along >= 4096 && along % 4096 == 0 && step < 64 && row % 4096 != 0;
}

/* The tiling of the word grid S into workgroups of at most max_lanes
 * words (see "lanes and words"): t consecutive values of dimension *j
 * times all dimensions after it. Returns the words per workgroup. */
static int64_t pick_tiling(const int64_t *S, int n, int max_lanes, int *jout,
                           int64_t *tout)
{
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    int best_j = -1;
    int64_t best_t = 0, best_l = 0, inner = 1;
    for (int j = n - 1; j >= 0 && inner <= max_lanes && total > 0; j--) {
        /* a power of two if one is large enough: layouts tile by powers of
         * two, so workgroups then fall on their tile and padding
         * boundaries, and the lane's part of an index is bit operations */
        int64_t t = max_lanes / inner;
        while (t > 1 && (S[j] % t || (t & (t - 1))))
            t--;
        if (t * inner < MIN_LANES) {
            t = max_lanes / inner;
            while (t > 1 && S[j] % t)
                t--;
        }
        if (t * inner > best_l) {
            best_j = j;
            best_t = t;
            best_l = t * inner;
        }
        if (best_l >= max_lanes / 2)
            break;
        inner *= S[j];
    }
    *jout = best_j;
    *tout = best_t;
    return best_l;
}

/* Storage index (in words) of the lane: fills B->idx and returns the flat
 * word index the lane stores to. */
const kir_expr_t *w16_rp_map_lanes(builder_t *B, const int64_t *S, int n, int max_lanes)
{
    kir_kernel_t *k = B->k;
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    /* Only where the lanes are a vector loop (the CPU): on a GPU a warp
     * down a column stores 32 words a row apart, and the H200 measured
     * that slower than loads a row apart (the N-first layouts' w2 kernels:
     * 17-18% of a copy with lanes down columns, 47% along rows). */
    if (total > 0 && !B->blocked && B->req->word_blocks &&
        lanes_down_columns(B, S, n)) {
        int64_t ta = max_lanes;
        while (ta > 1 && (S[n - 2] % ta || (ta & (ta - 1))))
            ta--;
        if (ta >= MIN_LANES)
            return map_columns(B, S, n, ta);
    }
    int best_j;
    int64_t best_t, best_l = pick_tiling(S, n, max_lanes, &best_j, &best_t);
    if (B->blocked && best_l != max_lanes)
        return w16_rp_fail(B, "word blocks do not tile the destination");
    if (best_l < MIN_LANES && !B->blocked) {
        /* flat index with a bounds check; unflatten per lane */
        k->lanes = max_lanes;
        const kir_expr_t *flat = lane_index(B, total);
        int64_t stride = 1;
        for (int d = n - 1; d >= 0; d--) {
            w16_range_t rf = {0, total - 1};
            const kir_expr_t *q = w16_ir_floordiv(&B->L, flat, stride, rf);
            w16_range_t rq = {0, (total - 1) / stride};
            char name[8];
            snprintf(name, sizeof name, "i%d", d);
            B->idx[d] = w16_rp_let(B, name, w16_ir_floormod(&B->L, q, S[d], rq));
            stride *= S[d];
        }
        return flat;
    }
    k->lanes = (int)(best_l / B->unroll);
    B->out->num_groups = total / best_l;
    B->L.num_groups = B->out->num_groups;
    int j = best_j;
    int64_t per_row = S[j] / best_t, P = best_l / best_t;
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    const kir_expr_t *lane = copy_lane(B);
    w16_range_t rg = {0, B->out->num_groups - 1}, rl = {0, best_l - 1};
    char name[8];
    /* dimensions after j: from the lane alone */
    int64_t stride = 1;
    for (int d = n - 1; d > j; d--) {
        const kir_expr_t *q = w16_ir_floordiv(&B->L, lane, stride, rl);
        snprintf(name, sizeof name, "i%d", d);
        B->idx[d] = w16_rp_let(B, name, w16_ir_floormod(&B->L, q, S[d],
                                                      (w16_range_t){0, (best_l - 1) / stride}));
        stride *= S[d];
    }
    /* dimension j: the group's rows and the lane's */
    const kir_expr_t *row = w16_ir_mul(k, w16_ir_floormod(&B->L, g, per_row, rg),
                                       ik(B, best_t));
    snprintf(name, sizeof name, "i%d", j);
    B->idx[j] = w16_rp_let(B, name, w16_ir_add(k, row,
                                             w16_ir_floordiv(&B->L, lane, P, rl)));
    /* dimensions before j: from the group alone */
    const kir_expr_t *q = w16_ir_floordiv(&B->L, g, per_row, rg);
    w16_rp_unflatten(B, q, (w16_range_t){0, (B->out->num_groups - 1) / per_row},
                     S, j);
    return w16_ir_add(k, w16_ir_mul(k, g, ik(B, best_l)), lane);
}

/* ---- word blocks -----------------------------------------------------------
 *
 * On a vector CPU the loop over a workgroup's lanes is vectorized: the
 * lanes of a vector read the source where the layout puts their words'
 * codes. Where that is not a contiguous run (Marlin's 16x64 tiles, the CPU
 * backend's VNNI blocks) every lane's load is a scalar load plus an insert
 * (a gather), which is most of the kernel's time. A kernel lane can instead
 * write a block of words: the words of the layout's lanes whose index
 * differs in chosen bits (the copies, unrolled in the body, each with the
 * lane's index as constants plus the kernel's lane), so that
 *
 *   - along the kernel's lanes (the remaining bits) every code position's
 *     source element moves by 1: one vector load per position and copy,
 *     the copies' stores interleaved by the vectorizer, or
 *   - the copies read the same source words (bits that move no source
 *     element): one load serves them all.
 *
 * The bits come from probes through the specs' maps (numeric: how each
 * bit of the word index moves the source element of every code position),
 * not from the layout's name; the kernel computes the same words either
 * way (each copy is the unchanged gather of its word), so the choice only
 * decides speed. GPUs keep one word per lane (request.word_blocks). */
enum { BLOCK_MAX_COPIES = 16, BLOCK_PROBE_BITS = 8 };

/* The source element of code position q (element q / slots, slot q %
 * slots) of the word at flat word index f; false where the probe does not
 * apply. */
static bool probe_flat(builder_t *B, const int64_t *S, int n, int64_t f,
                       int q, int slots, int64_t *src, int64_t *tensor)
{
    int64_t w[W16_MAX_STORE_DIMS];
    for (int d = n - 1; d >= 0; d--) {
        w[d] = f % S[d];
        f /= S[d];
    }
    *src = w16_rp_probe(B, w, n, q / slots, q % slots, tensor);
    return *src >= 0;
}

/* How far the source element of every code position moves when bit b of
 * the flat word index f0 (clear in f0) is set: the common move in
 * elements, or INT64_MIN where the positions move differently, the tensor
 * changes or a probe does not apply. base[q], tbase[q]: the probes at f0
 * (base[q] < 0: none). */
static int64_t bit_move(builder_t *B, const int64_t *S, int n, int64_t f0,
                        int b, int np, int slots, const int64_t *base,
                        const int64_t *tbase)
{
    int64_t move = INT64_MIN;
    for (int q = 0; q < np; q++) {
        int64_t c, tc;
        if (base[q] < 0 ||
            !probe_flat(B, S, n, f0 + (INT64_C(1) << b), q, slots, &c, &tc) ||
            tbase[q] != tc || (q > 0 && c - base[q] != move))
            return INT64_MIN;
        move = c - base[q];
    }
    return move;
}

/* Chooses the word blocks (sets B->blocked, bp, bv, unroll and returns the
 * words per workgroup), or leaves one word per lane (returns max_lanes). */
int w16_rp_plan_blocks(builder_t *B, const int64_t *S, int n, int np, int slots,
                       int max_lanes)
{
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    if (!B->req->word_blocks || B->perm || total <= 0 ||
        lanes_down_columns(B, S, n))
        return max_lanes;
    /* a workgroup has at most 2^nb words, within the default tiling */
    int nb = 0, j;
    int64_t t, tile = pick_tiling(S, n, max_lanes, &j, &t);
    while (nb < BLOCK_PROBE_BITS && tile % (INT64_C(2) << nb) == 0)
        nb++;
    /* each bit's move, the same at the start and in the middle */
    int64_t mv[BLOCK_PROBE_BITS], f[2] = {0, total / 2 >> nb << nb};
    int64_t base[2][64], tbase[2][64];
    if (np > 64)
        return max_lanes;
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < np; q++)
            if (!probe_flat(B, S, n, f[i], q, slots, &base[i][q], &tbase[i][q]))
                return max_lanes;
    for (int b = 0; b < nb; b++) {
        int64_t m0 = bit_move(B, S, n, f[0], b, np, slots, base[0], tbase[0]);
        mv[b] = m0 != INT64_MIN &&
                        m0 == bit_move(B, S, n, f[1], b, np, slots, base[1], tbase[1])
                    ? m0 : INT64_MIN;
    }
    /* the longest run of bits that move every source element by 1, 2, 4 ... */
    int bp = 0, bv = 0, above = 0;
    for (int p = 0; p < nb; p++) {
        int v = 0;
        while (v < 4 && p + v < nb && mv[p + v] == INT64_C(1) << v)
            v++;
        if (v > bv) {
            bp = p;
            bv = v;
        }
    }
    if (bp == 0 && bv == 4)
        return max_lanes; /* the lanes' loads are consecutive already */
    if (bv >= 3) {
        /* the kernel's lanes are the run; the bits below it are copies,
         * and a few above it (fewer, larger workgroups) */
        if ((1 << bp) > BLOCK_MAX_COPIES)
            return max_lanes;
        while ((1 << (bp + above)) < 4 && bp + bv + above < nb)
            above++;
    } else {
        /* no run: copies over the low bits that move no source element,
         * and still a vector's worth of lanes (4: 128 bits; AWQ into the
         * CPU layout, whose 32-word workgroups have 8 copies that share
         * their words, and their block sums, see w16_rp_block_sums_shared) */
        bp = 0;
        while (bp < nb && mv[bp] == 0 && (2 << bp) <= BLOCK_MAX_COPIES)
            bp++;
        bv = nb - bp;
        if (bp == 0 || bv < 2)
            return max_lanes;
    }
    int words = 1 << (bp + bv + above);
    if (pick_tiling(S, n, words, &j, &t) != words)
        return max_lanes;
    B->blocked = true;
    B->bp = bp;
    B->bv = bv;
    B->unroll = 1 << (bp + above);
    return words;
}
