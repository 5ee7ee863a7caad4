/*
 * build_repack_tile.c - staged source tiles: the repack builder's strategy
 * for GPUs where the plain gather reads the source strided.
 *
 * The N-first layouts (triton, xpu, humming, moe_wna16) are transposes of
 * the checkpoint's K-packed words: lanes along a destination row read one
 * word from each of 32 source rows, so every warp load touches 32
 * sectors; lanes along a source row would store 32 words a row apart
 * instead. Here a workgroup owns a tile of R x C destination words (the
 * last two dimensions of the word grid, U words per lane) and
 *
 *   1. finds the box of source elements the tile reads: tensors
 *      [s0, s0+NS) x rows [r0, r0+NU) x columns [c0, c0+NV) of the source
 *      role's tensors seen as rows of its last dimension;
 *   2. loads the box into shared memory, lanes along the columns (the
 *      loads of a warp are consecutive), every lane's loads issued before
 *      any store; a barrier;
 *   3. gathers its U words as the plain kernel does (same maps, same
 *      conversions), each source element read from the shared box where
 *      the box holds it and from memory otherwise, and stores them, lanes
 *      along the destination row (the stores of a warp are consecutive).
 *
 * The box comes from probes through the specs' maps (numeric, at the
 * first, a middle and the last tile: its offsets from the source element
 * of the tile's first word must be the same everywhere), and the kernel
 * places it at run time from that first word's source element. Nothing
 * depends on the probes being right for every tile: an element outside
 * the placed box is read from memory, so a wrong guess costs speed, never
 * a byte. The tile is chosen among a few shapes by how much of the box
 * the tile uses and how long the box's rows (loads) and the tile's rows
 * (stores) are. Nothing is staged where the plain gather's warp loads are
 * coalesced enough already (Marlin int4) or the layout has block sums.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

/* Shared memory per workgroup at most (8 workgroups of 256 lanes fill an
 * SM's 2048 threads in 128 KiB), words per lane at most. */
enum { TILE_MAX_BYTES = 16384, TILE_MAX_COPIES = 4 };
/* A plain gather whose warp loads touch at most this many sectors is
 * left alone (twice the 4 of 32 consecutive words). */
enum { PLAIN_SECTORS_OK = 8, MEMO_SIZE = 32 };

struct w16_rp_tile {
    w16_role_t role;
    int lanes, copies;
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
     * share one read (see w16_rp_source_load) */
    struct {
        const kir_block_t *blk;
        const kir_expr_t *slot, *flat, *val;
    } memo[MEMO_SIZE];
    int n_memo;
};

typedef struct box {
    int64_t lo[3], hi[3]; /* tensor, row, column relative to the first word */
} box_t;

/* The word grid index of word (r, c) of tile g. */
static void tile_word(const int64_t *S, int n, int64_t R, int64_t C,
                      int64_t g, int64_t r, int64_t c, int64_t *w)
{
    int64_t TC = S[n - 1] / C, TR = S[n - 2] / R;
    w[n - 1] = (g % TC) * C + c;
    w[n - 2] = (g / TC % TR) * R + r;
    int64_t q = g / TC / TR;
    for (int d = n - 3; d >= 0; d--) {
        w[d] = q % S[d];
        q /= S[d];
    }
}

/* The box that tile g reads, relative to the source element of code 0 of
 * its first word; false where a probe does not apply. Probes the first and
 * the last code of every word (the codes of a word come from at most a
 * few neighbouring elements). */
static bool probe_box(builder_t *B, const int64_t *S, int n, int np,
                      int slots, int64_t R, int64_t C, int64_t a, int64_t g,
                      box_t *bx)
{
    int64_t w[W16_MAX_STORE_DIMS], t0, t;
    tile_word(S, n, R, C, g, 0, 0, w);
    int64_t f0 = w16_rp_probe(B, w, n, 0, 0, &t0);
    if (f0 < 0)
        return false;
    int64_t base[3] = {t0, f0 / a, f0 % a};
    for (int i = 0; i < 3; i++)
        bx->lo[i] = bx->hi[i] = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            tile_word(S, n, R, C, g, r, c, w);
            for (int p = 0; p < np; p += np > 1 ? np - 1 : 1) {
                int64_t f = w16_rp_probe(B, w, n, p / slots, p % slots, &t);
                if (f < 0)
                    continue; /* padding */
                int64_t at[3] = {t - base[0], f / a - base[1], f % a - base[2]};
                for (int i = 0; i < 3; i++) {
                    bx->lo[i] = at[i] < bx->lo[i] ? at[i] : bx->lo[i];
                    bx->hi[i] = at[i] > bx->hi[i] ? at[i] : bx->hi[i];
                }
            }
        }
    return true;
}

/* The 32-byte sectors one warp-wide load of the plain gather (32
 * consecutive words from flat word index f0, one lane each) touches: the
 * most over the code positions; 4 when the words come from consecutive
 * 4-byte elements, 32 for a transpose's source rows. */
static int plain_sectors(builder_t *B, const int64_t *S, int n, int np,
                         int slots, int64_t esz, int64_t f0, int64_t total)
{
    int worst = 0;
    for (int p = 0; p < np; p++) {
        int64_t sec[32];
        int ns = 0;
        for (int64_t l = 0; l < 32 && f0 + l < total; l++) {
            int64_t w[W16_MAX_STORE_DIMS], f = f0 + l, t;
            for (int d = n - 1; d >= 0; d--) {
                w[d] = f % S[d];
                f /= S[d];
            }
            int64_t e = w16_rp_probe(B, w, n, p / slots, p % slots, &t);
            if (e < 0)
                continue;
            int64_t id = t * (INT64_C(1) << 40) + e * esz / 32;
            bool seen = false;
            for (int i = 0; i < ns && !seen; i++)
                seen = sec[i] == id;
            if (!seen)
                sec[ns++] = id;
        }
        worst = ns > worst ? ns : worst;
    }
    return worst;
}

bool w16_rp_tile_plan(builder_t *B, const int64_t *S, int n, int np,
                      int slots, int lanes)
{
    const w16_repack_request_t *req = B->req;
    w16_role_t role = B->dl.role == W16_ROLE_WEIGHT ? W16_ROLE_QWEIGHT : B->dl.role;
    if (n < 2 || B->blocked || B->perm || B->dl.sums_block_k || !B->table[role] ||
        lanes < 32 || (lanes & (lanes - 1)))
        return false;
    const w16_layout_t *sl = &B->sl[role];
    int64_t a = B->sshape[role][sl->ndim - 1], elems = 1;
    for (int d = 0; d < sl->ndim; d++)
        elems *= B->sshape[role][d];
    int64_t esz = (int64_t)wna16_dtype_size(req->src_dtype[role]);
    int64_t wbytes = (int64_t)wna16_dtype_size(req->dst_dtype) * B->wide;
    if (a <= 0 || elems >= (INT64_C(1) << 31))
        return false;
    int64_t best_score = 0, total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    /* the plain gather's warp loads are coalesced enough (Marlin's tiles
     * measured slower staged: bench/RESULTS.md) */
    int64_t mid = total / 2 / 32 * 32;
    if (plain_sectors(B, S, n, np, slots, esz, 0, total) <= PLAIN_SECTORS_OK ||
        plain_sectors(B, S, n, np, slots, esz, mid, total) <= PLAIN_SECTORS_OK)
        return false;
    static const int copies[] = {4, 2, 1};
    static const int64_t cols[] = {32, 64, 128, 16, 256, 8};
    struct w16_rp_tile best = {0};
    for (size_t ui = 0; ui < sizeof copies / sizeof copies[0]; ui++)
        for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
            int U = copies[ui];
            int64_t C = cols[ci], words = (int64_t)lanes * U;
            if (U > TILE_MAX_COPIES || words % C || S[n - 1] % C ||
                S[n - 2] % (words / C))
                continue;
            int64_t R = words / C, G = total / words;
            box_t bx[3];
            int64_t gs[3] = {0, G / 2, G - 1};
            bool same = true;
            for (int i = 0; i < 3 && same; i++) {
                same = probe_box(B, S, n, np, slots, R, C, a, gs[i], &bx[i]);
                same = same && (i == 0 || !memcmp(&bx[i], &bx[0], sizeof bx[0]));
            }
            if (!same)
                continue;
            int64_t ns = bx[0].hi[0] - bx[0].lo[0] + 1;
            int64_t nu = bx[0].hi[1] - bx[0].lo[1] + 1;
            int64_t nv = bx[0].hi[2] - bx[0].lo[2] + 1;
            int64_t pitch = nv | 1, bytes = ns * nu * pitch * esz;
            /* the tile's bytes against the box's: how much of what is
             * loaded the tile uses (ratio of bytes: repacks keep the bits) */
            int64_t use = 100 * words * wbytes / (ns * nu * nv * esz);
            /* runs of the loads (box rows) and of the stores (tile rows),
             * each worth up to a 128-byte line */
            int64_t run = nv * esz < 128 ? nv * esz : 128;
            int64_t srun = C * wbytes < 128 ? C * wbytes : 128;
            int64_t score = run * srun * (use < 100 ? use : 100);
            if (bytes > TILE_MAX_BYTES || ns * nu * nv > 16 * (int64_t)lanes ||
                use < 50 || run < 16 || score <= best_score)
                continue;
            best_score = score;
            best = (struct w16_rp_tile){
                .role = role, .lanes = lanes, .copies = U, .R = R, .C = C,
                .a = a, .nrows = elems / a, .elems = elems, .ns = ns,
                .nu = nu, .nv = nv, .pitch = pitch, .ds = bx[0].lo[0],
                .dr = bx[0].lo[1], .dc = bx[0].lo[2]};
        }
    if (!best_score)
        return false;
    kir_kernel_t *k = B->k;
    struct w16_rp_tile *T = w16_arena_alloc(&k->arena, sizeof *T);
    char name[240];
    snprintf(name, sizeof name, "%s_st%lldx%lld", k->name, (long long)best.R,
             (long long)best.C);
    const char *nm = w16_arena_strdup(&k->arena, name);
    if (!T || !nm) {
        w16_rp_fail(B, "out of memory");
        return false;
    }
    *T = best;
    T->sh = kir_shared(k, "tile", B->table[role]->type, T->ns * T->nu * T->pitch);
    if (!T->sh) {
        w16_rp_fail(B, "out of memory");
        return false;
    }
    k->name = nm;
    B->tile = T;
    B->unroll = T->copies;
    return true;
}

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }
static const kir_expr_t *i32(builder_t *B, int64_t v) { return kir_const(B->k, KIR_I32, v); }

/* Sets B->idx to word (r, c) of the workgroup's tile, where the tile-local
 * word index is wl (NULL: the first word), and returns its flat index as
 * (the group's part) + (the lane's part). */
static const kir_expr_t *tile_index(builder_t *B, const int64_t *S, int n,
                                    const kir_expr_t *wl)
{
    kir_kernel_t *k = B->k;
    const struct w16_rp_tile *T = B->tile;
    int64_t TC = S[n - 1] / T->C, TR = S[n - 2] / T->R, G = B->out->num_groups;
    w16_range_t rg = {0, G - 1}, rw = {0, T->R * T->C - 1};
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    const kir_expr_t *r = wl ? w16_ir_floordiv(&B->L, wl, T->C, rw) : ik(B, 0);
    const kir_expr_t *c = wl ? w16_ir_floormod(&B->L, wl, T->C, rw) : ik(B, 0);
    const kir_expr_t *col0 = w16_ir_mul(k, w16_ir_floormod(&B->L, g, TC, rg), ik(B, T->C));
    const kir_expr_t *gr = w16_ir_floordiv(&B->L, g, TC, rg);
    w16_range_t rr = {0, (G - 1) / TC};
    const kir_expr_t *row0 = w16_ir_mul(k, w16_ir_floormod(&B->L, gr, TR, rr), ik(B, T->R));
    const kir_expr_t *q = w16_ir_floordiv(&B->L, gr, TR, rr);
    w16_range_t rq = {0, rr.hi / TR};
    char name[8];
    snprintf(name, sizeof name, "i%d", n - 1);
    B->idx[n - 1] = w16_rp_let(B, name, w16_ir_add(k, col0, c));
    snprintf(name, sizeof name, "i%d", n - 2);
    B->idx[n - 2] = w16_rp_let(B, name, w16_ir_add(k, row0, r));
    w16_rp_unflatten(B, q, rq, S, n - 2);
    /* (q * S[n-2] + row0) * S[n-1] + col0, then + r * S[n-1] + c */
    const kir_expr_t *gpart = w16_ir_add(k, w16_ir_mul(k, w16_ir_add(k,
        w16_ir_mul(k, q, ik(B, S[n - 2])), row0), ik(B, S[n - 1])), col0);
    if (!wl)
        return gpart;
    return kir_bin(k, KIR_OP_ADD, gpart,
                   w16_ir_add(k, w16_ir_mul(k, r, ik(B, S[n - 1])), c));
}

const kir_expr_t *w16_rp_tile_map(builder_t *B, const int64_t *S, int n,
                                  int copy)
{
    kir_kernel_t *k = B->k;
    const struct w16_rp_tile *T = B->tile;
    const kir_expr_t *lane = kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID),
                                          false);
    return tile_index(B, S, n, w16_ir_add(k, lane, ik(B, (int64_t)copy * T->lanes)));
}

void w16_rp_tile_stage(builder_t *B, const int64_t *S, int n)
{
    kir_kernel_t *k = B->k;
    struct w16_rp_tile *T = B->tile;
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    k->lanes = T->lanes;
    B->out->num_groups = total / (T->R * T->C);
    B->L.num_groups = B->out->num_groups;
    /* the source element of code 0 of the tile's first word (coordinates
     * of padding are clamped, which only misplaces that tile's box) */
    tile_index(B, S, n, NULL);
    B->idx[n - 1] = w16_ir_mul(k, B->idx[n - 1], ik(B, B->wide));
    B->pos = 0;
    lcoord_t at;
    const kir_expr_t *valid = w16_rp_dst_slot(B, 0, &at);
    if (!valid)
        return;
    w16_rp_clamp_slot(B, valid, &at);
    T->capture = true;
    w16_rp_src_raw(B, T->role, &at);
    T->capture = false;
    if (!T->cap_slot || !T->cap_row || !T->cap_col) {
        w16_rp_fail(B, "the staged tile's first element has no source");
        return;
    }
    /* in 32 bits (every index of a tensor fits): the corner may lie
     * before the tensor (a negative offset), which the unsigned compares
     * below see as far past its end */
    T->bslot = w16_rp_let(B, "box_s", kir_bin(k, KIR_OP_ADD,
        w16_ir_narrow32(&B->L, T->cap_slot), i32(B, T->ds)));
    T->brow = w16_rp_let(B, "box_r", kir_bin(k, KIR_OP_ADD,
        w16_ir_narrow32(&B->L, T->cap_row), i32(B, T->dr)));
    T->bcol = w16_rp_let(B, "box_c", kir_bin(k, KIR_OP_ADD,
        w16_ir_narrow32(&B->L, T->cap_col), i32(B, T->dc)));
    /* every lane's loads first, then the stores into the box */
    const kir_param_t *tab = B->table[T->role];
    int64_t cells = T->ns * T->nu * T->nv, iters = (cells + T->lanes - 1) / T->lanes;
    int64_t slots = B->out->table_slots;
    const kir_expr_t *lane = kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID),
                                          false);
    const kir_expr_t *vals[64], *where[64], *inside[64];
    if (iters > 64) {
        w16_rp_fail(B, "a staged tile of more than 64 elements per lane");
        return;
    }
    for (int64_t j = 0; j < iters && !B->fail; j++) {
        w16_range_t re = {0, iters * T->lanes - 1};
        const kir_expr_t *e = w16_ir_add(k, lane, ik(B, j * T->lanes));
        const kir_expr_t *v = w16_ir_floormod(&B->L, e, T->nv, re);
        const kir_expr_t *ru = w16_ir_floordiv(&B->L, e, T->nv, re);
        w16_range_t rr = {0, re.hi / T->nv};
        const kir_expr_t *u = w16_ir_floormod(&B->L, ru, T->nu, rr);
        const kir_expr_t *s = w16_ir_floordiv(&B->L, ru, T->nu, rr);
        const kir_expr_t *row = kir_bin(k, KIR_OP_ADD, T->brow, w16_ir_narrow32(&B->L, u));
        const kir_expr_t *col = kir_bin(k, KIR_OP_ADD, T->bcol, w16_ir_narrow32(&B->L, v));
        const kir_expr_t *slot = kir_bin(k, KIR_OP_ADD, T->bslot, w16_ir_narrow32(&B->L, s));
        /* unsigned compares: a box corner before the tensor is outside */
        const kir_expr_t *in = kir_bin(k, KIR_OP_AND,
            kir_bin(k, KIR_OP_ULT, row, i32(B, T->nrows)),
            kir_bin(k, KIR_OP_AND, kir_bin(k, KIR_OP_ULT, col, i32(B, T->a)),
                    kir_bin(k, KIR_OP_ULT, slot, i32(B, slots))));
        in = w16_rp_let(B, "in_box", in);
        const kir_expr_t *flat = kir_bin(k, KIR_OP_ADD,
                                         kir_bin(k, KIR_OP_MUL, row, i32(B, T->a)), col);
        vals[j] = w16_rp_let(B, "staged", kir_tload(k, tab,
            kir_int_cast(k, KIR_I64, kir_select(k, in, slot, i32(B, 0)), false),
            kir_int_cast(k, KIR_I64, kir_select(k, in, flat, i32(B, 0)), false)));
        where[j] = w16_ir_narrow32(&B->L, w16_ir_add(k, w16_ir_mul(k,
            w16_ir_add(k, w16_ir_mul(k, s, ik(B, T->nu)), u), ik(B, T->pitch)), v));
        inside[j] = (j + 1) * T->lanes > cells
                        ? kir_bin(k, KIR_OP_SLT, e, ik(B, cells)) : NULL;
    }
    for (int64_t j = 0; j < iters && !B->fail; j++) {
        kir_block_t *blk = B->body;
        if (inside[j]) { /* the last round: lanes past the box store nothing */
            kir_stmt_t *br = kir_if(k, B->body, inside[j]);
            if (!br) {
                w16_rp_fail(B, "out of memory");
                return;
            }
            blk = &br->body;
        }
        if (!kir_shared_store(k, blk, T->sh, where[j], vals[j]))
            w16_rp_fail(B, "ill-typed shared store");
    }
    if (!B->fail && !kir_barrier(k, B->body))
        w16_rp_fail(B, "out of memory");
}

/* e seen through let-bound variables (their noted definitions, which
 * never change), so that a value and a variable bound to it compare
 * equal. */
static const kir_expr_t *through_lets(const builder_t *B, const kir_expr_t *e)
{
    for (int guard = 0; e && guard < 64; guard++) {
        const kir_expr_t *v = e;
        if ((v->op == KIR_OP_ZEXT || v->op == KIR_OP_SEXT) && v->type == KIR_I64 &&
            v->a->op == KIR_OP_VAR && v->a->type == KIR_I32)
            v = v->a;
        if (v->op != KIR_OP_VAR || v->var->index >= B->L.n_vfacts ||
            !B->L.vdef[v->var->index])
            return e;
        e = B->L.vdef[v->var->index];
    }
    return e;
}

static bool same_value(const builder_t *B, const kir_expr_t *a, const kir_expr_t *b)
{
    a = through_lets(B, a);
    b = through_lets(B, b);
    if (a == b)
        return true;
    if (!a || !b || !w16_rp_same_node(a, b))
        return false;
    return same_value(B, a->a, b->a) && same_value(B, a->b, b->b) &&
           same_value(B, a->c, b->c);
}

const kir_expr_t *w16_rp_source_load(builder_t *B, w16_role_t role,
                                     const kir_expr_t *slot,
                                     const kir_expr_t *flat,
                                     const kir_expr_t *row,
                                     const kir_expr_t *col)
{
    kir_kernel_t *k = B->k;
    struct w16_rp_tile *T = B->tile;
    const kir_expr_t *mem = kir_tload(k, B->table[role], w16_ir_index32(&B->L, slot),
                                      w16_ir_index32(&B->L, flat));
    if (!T || role != T->role)
        return mem;
    if (T->capture) {
        T->cap_slot = slot;
        T->cap_row = row;
        T->cap_col = col;
        return mem;
    }
    /* One read per source element and block: the slots of a word reading
     * the same element share it. The compiler does not merge the loads on
     * its own (each sits behind its own select), and without this a word
     * of eight codes made eight shared and eight fallback loads. */
    for (int i = 0; i < T->n_memo && i < MEMO_SIZE; i++)
        if (T->memo[i].blk == B->body && same_value(B, T->memo[i].slot, slot) &&
            same_value(B, T->memo[i].flat, flat))
            return T->memo[i].val;
    /* in 32 bits, as the corner */
    const kir_expr_t *du = kir_bin(k, KIR_OP_SUB, w16_ir_narrow32(&B->L, row), T->brow);
    const kir_expr_t *dv = kir_bin(k, KIR_OP_SUB, w16_ir_narrow32(&B->L, col), T->bcol);
    const kir_expr_t *ds = kir_bin(k, KIR_OP_SUB, w16_ir_narrow32(&B->L, slot), T->bslot);
    const kir_expr_t *hit = kir_bin(k, KIR_OP_AND,
        kir_bin(k, KIR_OP_ULT, du, i32(B, T->nu)),
        kir_bin(k, KIR_OP_AND, kir_bin(k, KIR_OP_ULT, dv, i32(B, T->nv)),
                kir_bin(k, KIR_OP_ULT, ds, i32(B, T->ns))));
    hit = w16_rp_let(B, "in_tile", hit);
    const kir_expr_t *at = kir_bin(k, KIR_OP_ADD, kir_bin(k, KIR_OP_MUL,
        kir_bin(k, KIR_OP_ADD, kir_bin(k, KIR_OP_MUL, ds, i32(B, T->nu)), du),
        i32(B, T->pitch)), dv);
    const kir_expr_t *cell = kir_shared_load(k, T->sh, kir_select(k, hit, at, i32(B, 0)));
    const kir_expr_t *val = w16_rp_let(B, "src_elem", w16_ir_select(k, hit, cell, mem));
    int m = T->n_memo++ % MEMO_SIZE;
    T->memo[m].blk = B->body;
    T->memo[m].slot = slot;
    T->memo[m].flat = flat;
    T->memo[m].val = val;
    return val;
}
