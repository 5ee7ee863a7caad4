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
 *      the box holds it and from memory otherwise (the source loads of
 *      build_repack_elem.c read the plan in B->tile), and stores them,
 *      lanes along the destination row (the stores of a warp are
 *      consecutive).
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
 *
 * The same file holds the GPU's two plans without staging, which use the
 * same tile map: shared reads (a lane writes the few words that read the
 * same source elements, one load for all of them: Marlin int4, where the
 * plain gather is bound by instructions, not by its loads) and rows (a
 * layout with block sums: whole rows a workgroup, codes and sums branch
 * by lane). See plan_shared_reads and plan_rows.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

/* Shared memory per workgroup at most (8 workgroups of 256 lanes fill an
 * SM's 2048 threads in 128 KiB), words per lane at most. */
enum { TILE_MAX_BYTES = 16384, TILE_MAX_COPIES = 4 };
/* A plain gather whose warp loads touch at most this many sectors is
 * left alone (twice the 4 of 32 consecutive words). */
enum { PLAIN_SECTORS_OK = 8 };
/* Rows of a layout with sums: lanes per workgroup at most (CUDA's limit)
 * and, where rows are short, at least (rows are added up to it). */
enum { ROWS_MAX_LANES = 1024, ROWS_MIN_LANES = 256 };
/* Rows of a layout with sums: words a lane at most (one per row) where
 * the block sums go a word at a time, and elsewhere (their sums code by
 * code: each copy is several times the text, and so the cold NVRTC
 * compile). On the H200, in one run, 2, 3 and 4 rows a lane ran the
 * GPTQ w13 kernel at 64%, 72% and 84% of a copy (w2 71%, 82%, 87%), with
 * the same 30-32 registers. Not 8 code by code
 * on the CPU either: with eight copies of a Marlin-source kernel, LLVM
 * 19.1's SLP vectorizer alone (opt -passes=slp-vectorizer on the IR just
 * before it, x86-64-v3/v4 and znver4 cost models, vectors of 8) changes
 * copies 4 and 5's zero-point terms; its IR is wrong for every codegen
 * CPU and without any poison flag, right with at most 4 lanes (docs/
 * design-notes.md, "Rows of sums: copies a lane"). */
enum { ROWS_COPIES = 4, ROWS_COPIES_BY_CODE = 2 };

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

/* Whether setting bit b of the flat word index f (clear in f) leaves the
 * source element and tensor of every code position where they are. */
static bool bit_stays(builder_t *B, const int64_t *S, int n, int np,
                      int slots, int64_t f, int b)
{
    for (int p = 0; p < np; p++) {
        int64_t w0[W16_MAX_STORE_DIMS], w1[W16_MAX_STORE_DIMS], t0, t1;
        int64_t f0 = f, f1 = f | (INT64_C(1) << b);
        for (int d = n - 1; d >= 0; d--) {
            w0[d] = f0 % S[d];
            f0 /= S[d];
            w1[d] = f1 % S[d];
            f1 /= S[d];
        }
        int64_t e0 = w16_rp_probe(B, w0, n, p / slots, p % slots, &t0);
        int64_t e1 = w16_rp_probe(B, w1, n, p / slots, p % slots, &t1);
        if (e0 < 0 || e0 != e1 || t0 != t1)
            return false;
    }
    return true;
}

/* The lowest run of ub bits below 2^top of a workgroup's word index that
 * move no source element, probed at the words f[0] and f[1] (multiples
 * of 2^top); -1 where there is none. */
static int copy_bits(builder_t *B, const int64_t *S, int n, int np, int slots,
                     const int64_t f[2], int top, int ub)
{
    int run = 0;
    for (int b = 0; b < top; b++) {
        bool stays = bit_stays(B, S, n, np, slots, f[0], b) &&
                     bit_stays(B, S, n, np, slots, f[1], b);
        run = stays ? run + 1 : 0;
        if (run == ub)
            return b - ub + 1;
    }
    return -1;
}

/* Sets B->tile to a plan (staged tiles, shared reads or rows) and names
 * the kernel with the plan's `tag`. */
static bool install_plan(builder_t *B, struct w16_rp_tile plan, const char *tag)
{
    kir_kernel_t *k = B->k;
    struct w16_rp_tile *T = w16_arena_alloc(&k->arena, sizeof *T);
    char name[240];
    snprintf(name, sizeof name, "%s_%s", k->name, tag);
    const char *nm = w16_arena_strdup(&k->arena, name);
    if (!T || !nm) {
        w16_rp_fail(B, "out of memory");
        return false;
    }
    *T = plan;
    k->name = nm;
    B->tile = T;
    B->unroll = T->copies;
    return true;
}

/* Shared reads, for a plain gather that reads well already: where the
 * words whose index differs in a few bits read the same source elements
 * (Marlin int4: the four words of a thread's k pairs take their nibbles
 * from the same four checkpoint words), a lane writes those words (the
 * copies, bits [cbit, cbit + log2 U) of the word index) and each source
 * element is loaded once for all of them (w16_rp_source_load), instead of
 * once per word. The bits come from probes through the specs' maps; each
 * copy is still the plain gather of its own word, so they decide speed,
 * never bytes. A workgroup is one run of lanes * U words of a row of the
 * word grid. */
static bool plan_shared_reads(builder_t *B, const int64_t *S, int n, int np,
                              int slots, int lanes, w16_role_t role,
                              int64_t total)
{
    static const int copies[] = {4, 2};
    for (size_t ui = 0; ui < sizeof copies / sizeof copies[0]; ui++)
        for (int L = lanes; L >= 32; L /= 2) {
            int U = copies[ui], ub = ui == 0 ? 2 : 1, top = 0;
            int64_t C = (int64_t)L * U;
            if (S[n - 1] % C)
                continue;
            while ((INT64_C(2) << top) <= C)
                top++; /* C = 2^top */
            int64_t f[2] = {0, total / 2 / C * C};
            int cbit = copy_bits(B, S, n, np, slots, f, top, ub);
            if (cbit < 0)
                break; /* fewer lanes move the same bits */
            char tag[16];
            snprintf(tag, sizeof tag, "sr%d", U);
            return install_plan(B, (struct w16_rp_tile){
                .role = role, .lanes = L, .copies = U, .cbit = cbit, .R = 1,
                .C = C}, tag);
        }
    return false;
}

/* Rows, for a layout with block sums (the cpu layout: rows of 17 x 32
 * words, 16 of codes and one of sums): a workgroup is whole rows of the
 * word grid, so the sums (a branch by lane, whole warps where the sums
 * are whole warps) and the codes share workgroups of hundreds of lanes;
 * workgroups of sums alone or codes alone would be one warp each (32
 * lanes), and the H200 ran 1.7 million of those at 11% of a copy. With
 * one word a lane it ran them at 40-45%: too few bytes in flight a
 * multiprocessor (three workgroups of 544 lanes, two loads a lane). So a
 * lane writes its word of U rows (the copies: the same place in each row,
 * so a lane's words are all sums or all codes and a warp of sums adds 32
 * blocks a row), where a word's codes come from at most two source
 * elements; up to ROWS_COPIES where the block sums go a word at a time
 * (GPTQ's, compressed-tensors' and humming's words: sums_by_word), up to
 * ROWS_COPIES_BY_CODE where they go code by code (Marlin's words: each
 * copy is several times the text). Elsewhere (AWQ and moe_wna16: a
 * word's codes from more than two source elements) one: the cold NVRTC
 * compile would pass 300 ms. (Two words a lane within a row, as shared reads, would pair
 * sums in half-empty warps.) U is the most copies up to that bound that
 * divide the grid's rows; where they do not divide the second-to-last
 * dimension (GPTQ w2 at K = 768: 6 rows of blocks a column, and four
 * rows a workgroup), the workgroup's rows run over the flattened grid
 * (flat_rows; tag suffix "f"). */
/* Whether a column's consecutive codes lie side by side in one source
 * element, the first at its lowest field (K-packed words: GPTQ,
 * compressed-tensors, humming), probed at k = 0 .. slots - 1 of column 0 of
 * expert 0: there a block's sum goes a word at a time (a few operations
 * a word); elsewhere (Marlin's permuted words) code by code. */
static bool sums_by_word(builder_t *B)
{
    const w16_layout_t *l = &B->sl[W16_ROLE_QWEIGHT];
    wna16_dtype_t dt = B->req->src_dtype[W16_ROLE_QWEIGHT];
    int cb = w16_layout_code_bits(l, dt, B->sv);
    int per = w16_layout_slots(l, dt, B->sv);
    if (l->decode || B->perm || cb <= 0 || per < 2)
        return false;
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(W16_ROLE_QWEIGHT, cv);
    int64_t first[W16_MAX_STORE_DIMS] = {0};
    for (int j = 0; j < per; j++) {
        int64_t c[W16_MAX_COORDS] = {0}, at[W16_MAX_STORE_DIMS] = {0}, bit = -1;
        int64_t vars[W16_VAR_COUNT];
        for (int i = 0; i < nc; i++)
            if (cv[i] == W16_VAR_k)
                c[i] = j;
        memcpy(vars, B->sv, sizeof vars);
        w16_eval_error_t e;
        if (!w16_layout_locate(l, vars, c, at, &bit, &e) || bit != (int64_t)j * cb ||
            (j && memcmp(at, first, sizeof at)))
            return false;
        if (!j)
            memcpy(first, at, sizeof first);
    }
    return true;
}

static bool plan_rows(builder_t *B, const int64_t *S, int n, int np,
                      int slots, w16_role_t role)
{
    int64_t cap = B->req->lanes > 0 ? B->req->lanes : ROWS_MAX_LANES;
    int64_t C = S[n - 1], R = 1;
    if (C % 32 || C > cap)
        return false;
    while (2 * R * C <= cap && S[n - 2] % (2 * R) == 0 && R * C < ROWS_MIN_LANES)
        R *= 2;
    /* the source elements (tensor, element) of the first word's codes */
    int64_t w[W16_MAX_STORE_DIMS] = {0}, se[3] = {0}, st[3] = {0};
    int ns = 0;
    for (int p = 0; p < np && ns <= 2; p++) {
        int64_t t = 0, e = w16_rp_probe(B, w, n, p / slots, p % slots, &t);
        bool old = false;
        for (int i = 0; i < ns; i++)
            old = old || (se[i] == e && st[i] == t);
        if (e < 0)
            ns = 3; /* unknown: one word a lane */
        else if (!old) {
            se[ns] = e;
            st[ns++] = t;
        }
    }
    int64_t grid_rows = 1;
    for (int d = 0; d < n - 1; d++)
        grid_rows *= S[d];
    int U = ns > 2 ? 1 : sums_by_word(B) ? ROWS_COPIES : ROWS_COPIES_BY_CODE;
    while (U > 1 && grid_rows % (R * U))
        U--;
    bool flat = S[n - 2] % (R * U) != 0;
    char tag[24];
    snprintf(tag, sizeof tag, "rows%lldx%d%s", (long long)R, U, flat ? "f" : "");
    return install_plan(B, (struct w16_rp_tile){
        .role = role, .lanes = (int)(R * C), .copies = U, .rows = true,
        .flat_rows = flat, .cbit = -1, .R = R * U, .C = C}, tag);
}

bool w16_rp_tile_loads_first(const builder_t *B)
{
    return B->tile && !B->tile->stage;
}

bool w16_rp_tile_lane_branches(const builder_t *B)
{
    return B->tile && B->tile->rows;
}

const char *w16_rp_tile_comment(const builder_t *B)
{
    const struct w16_rp_tile *T = B->tile;
    return T->stage ? "repack: a workgroup stages its source tile in shared "
                      "memory, then each lane gathers a few destination words"
         : T->rows ? "repack: a workgroup writes whole rows, codes and block "
                     "sums, a lane its word of each of a few rows"
                   : "repack: a lane gathers the words that read the same "
                     "source elements, one load for all of them";
}

bool w16_rp_tile_plan(builder_t *B, const int64_t *S, int n, int np,
                      int slots, int lanes)
{
    const w16_repack_request_t *req = B->req;
    w16_role_t role = B->dl.role == W16_ROLE_WEIGHT ? W16_ROLE_QWEIGHT : B->dl.role;
    if (n < 2 || B->blocked || B->perm || !B->table[role] ||
        lanes < 32 || (lanes & (lanes - 1)))
        return false;
    if (B->dl.sums_block_k)
        return plan_rows(B, S, n, np, slots, role);
    int64_t total = 1;
    for (int d = 0; d < n; d++)
        total *= S[d];
    const w16_layout_t *sl = &B->sl[role];
    int64_t a = B->sshape[role][sl->ndim - 1], elems = 1;
    for (int d = 0; d < sl->ndim; d++)
        elems *= B->sshape[role][d];
    int64_t esz = (int64_t)wna16_dtype_size(req->src_dtype[role]);
    int64_t wbytes = (int64_t)wna16_dtype_size(req->dst_dtype) * B->wide;
    if (a <= 0 || elems >= (INT64_C(1) << 31))
        return false;
    int64_t best_score = 0;
    /* the plain gather's warp loads are coalesced enough (Marlin's tiles,
     * at most 8 sectors a warp load, measured slower staged: 42% / 49% of
     * a copy against 55% / 61% for the gather) */
    int64_t mid = total / 2 / 32 * 32;
    if (plain_sectors(B, S, n, np, slots, esz, 0, total) <= PLAIN_SECTORS_OK ||
        plain_sectors(B, S, n, np, slots, esz, mid, total) <= PLAIN_SECTORS_OK)
        return plan_shared_reads(B, S, n, np, slots, lanes, role, total);
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
                .role = role, .lanes = lanes, .copies = U, .stage = true, .cbit = -1,
                .R = R, .C = C,
                .a = a, .nrows = elems / a, .elems = elems, .ns = ns,
                .nu = nu, .nv = nv, .pitch = pitch, .ds = bx[0].lo[0],
                .dr = bx[0].lo[1], .dc = bx[0].lo[2]};
        }
    if (!best_score)
        return false;
    char tag[48];
    snprintf(tag, sizeof tag, "st%lldx%lld", (long long)best.R, (long long)best.C);
    if (!install_plan(B, best, tag))
        return false;
    struct w16_rp_tile *T = B->tile;
    T->sh = kir_shared(B->k, "tile", B->table[role]->type, T->ns * T->nu * T->pitch);
    if (!T->sh) {
        w16_rp_fail(B, "out of memory");
        return false;
    }
    return true;
}

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }
static const kir_expr_t *i32(builder_t *B, int64_t v) { return kir_const(B->k, KIR_I32, v); }

/* Sets B->idx to the word at row r, column c (NULL: the first word) of
 * the workgroup's tile and returns its flat index as (the group's part) +
 * (the lane's part). */
static const kir_expr_t *tile_index_rc(builder_t *B, const int64_t *S, int n,
                                       const kir_expr_t *r, const kir_expr_t *c)
{
    kir_kernel_t *k = B->k;
    const struct w16_rp_tile *T = B->tile;
    int64_t TC = S[n - 1] / T->C, TR = T->flat_rows ? 1 : S[n - 2] / T->R,
            G = B->out->num_groups;
    w16_range_t rg = {0, G - 1};
    const kir_expr_t *g = kir_builtin(k, KIR_OP_GROUP_ID);
    bool first = !r;
    r = r ? r : ik(B, 0);
    c = c ? c : ik(B, 0);
    const kir_expr_t *col0 = w16_ir_mul(k, w16_ir_floormod(&B->L, g, TC, rg), ik(B, T->C));
    const kir_expr_t *gr = w16_ir_floordiv(&B->L, g, TC, rg);
    w16_range_t rr = {0, (G - 1) / TC};
    char name[8];
    snprintf(name, sizeof name, "i%d", n - 1);
    B->idx[n - 1] = w16_rp_let(B, name, w16_ir_add(k, col0, c));
    snprintf(name, sizeof name, "i%d", n - 2);
    if (T->flat_rows) { /* the row of the whole grid, then its coordinates */
        int64_t rows = G / TC * T->R;
        w16_range_t rf = {0, rows - 1};
        const kir_expr_t *fr = w16_rp_let(B, "grid_row",
            w16_ir_add(k, w16_ir_mul(k, gr, ik(B, T->R)), r));
        B->idx[n - 2] = w16_rp_let(B, name, w16_ir_floormod(&B->L, fr, S[n - 2], rf));
        w16_rp_unflatten(B, w16_ir_floordiv(&B->L, fr, S[n - 2], rf),
                         (w16_range_t){0, (rows - 1) / S[n - 2]}, S, n - 2);
        const kir_expr_t *frow = w16_ir_mul(k, fr, ik(B, S[n - 1]));
        return w16_ir_add(k, frow, w16_ir_add(k, col0, c));
    }
    const kir_expr_t *row0 = w16_ir_mul(k, w16_ir_floormod(&B->L, gr, TR, rr), ik(B, T->R));
    const kir_expr_t *q = w16_ir_floordiv(&B->L, gr, TR, rr);
    w16_range_t rq = {0, rr.hi / TR};
    /* rows: the row as an or of the group's rows and the lane's (disjoint
     * bits; R a power of two), which the lowering does not take apart into
     * the group id's terms: a sum would be, and then the codes of one
     * block read through different forms of one address, which the block
     * sums' word-at-a-time check (build_repack_sums.c) does not see as one */
    bool disjoint = T->rows && !(T->R & (T->R - 1));
    B->idx[n - 2] = w16_rp_let(B, name, disjoint ? kir_bin(k, KIR_OP_OR, row0, r)
                                                 : w16_ir_add(k, row0, r));
    w16_rp_unflatten(B, q, rq, S, n - 2);
    /* (q * S[n-2] + row0) * S[n-1] + col0, then + r * S[n-1] + c */
    const kir_expr_t *gpart = w16_ir_add(k, w16_ir_mul(k, w16_ir_add(k,
        w16_ir_mul(k, q, ik(B, S[n - 2])), row0), ik(B, S[n - 1])), col0);
    if (first)
        return gpart;
    return kir_bin(k, KIR_OP_ADD, gpart,
                   w16_ir_add(k, w16_ir_mul(k, r, ik(B, S[n - 1])), c));
}

/* The same from the tile-local word index wl (NULL: the first word). */
static const kir_expr_t *tile_index(builder_t *B, const int64_t *S, int n,
                                    const kir_expr_t *wl)
{
    const struct w16_rp_tile *T = B->tile;
    w16_range_t rw = {0, T->R * T->C - 1};
    return tile_index_rc(B, S, n, wl ? w16_ir_floordiv(&B->L, wl, T->C, rw) : NULL,
                         wl ? w16_ir_floormod(&B->L, wl, T->C, rw) : NULL);
}

const kir_expr_t *w16_rp_tile_map(builder_t *B, const int64_t *S, int n,
                                  int copy)
{
    kir_kernel_t *k = B->k;
    const struct w16_rp_tile *T = B->tile;
    const kir_expr_t *lane = kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID),
                                          false);
    if (T->rows) { /* the lane's word in row copy * (lanes / C) on */
        w16_range_t rl = {0, T->lanes - 1};
        return tile_index_rc(B, S, n,
            w16_ir_add(k, w16_ir_floordiv(&B->L, lane, T->C, rl),
                       ik(B, (int64_t)copy * (T->lanes / T->C))),
            w16_ir_floormod(&B->L, lane, T->C, rl));
    }
    if (T->cbit < 0)
        return tile_index(B, S, n, w16_ir_add(k, lane, ik(B, (int64_t)copy * T->lanes)));
    /* shared reads: the lane's bits around the copy's, as a sum of a
     * multiple of 2^(cbit + ub) and a part below it (the lowering then
     * sees the copy's bits as the constant they are) */
    int64_t lo = INT64_C(1) << T->cbit, hi = lo * T->copies;
    w16_range_t rl = {0, T->lanes - 1};
    const kir_expr_t *below = w16_ir_add(k, ik(B, copy * lo),
                                         w16_ir_floormod(&B->L, lane, lo, rl));
    const kir_expr_t *above = w16_ir_mul(k, w16_ir_floordiv(&B->L, lane, lo, rl),
                                         ik(B, hi));
    return tile_index(B, S, n, w16_ir_add(k, above, below));
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
    if (!T->stage)
        return; /* shared reads, rows: nothing is staged */
    /* the source element of code 0 of the tile's first word (coordinates
     * of padding are clamped, which only misplaces that tile's box) */
    tile_index(B, S, n, NULL);
    B->idx[n - 1] = w16_ir_mul(k, B->idx[n - 1], ik(B, B->wide));
    B->pos = 0;
    lcoord_t at;
    const kir_expr_t *valid = w16_rp_let(B, "valid", w16_rp_dst_slot(B, 0, &at));
    if (!valid)
        return;
    w16_rp_clamp_slot(B, valid, &at);
    T->capture = true;
    w16_rp_src_value(B, T->role, &at, true);
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
