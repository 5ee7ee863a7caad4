/*
 * test_moe_cuda_contract.c - the host side of the CUDA fused MoE, no GPU
 * needed (CI runs it):
 *  1. the "tiling" section of backend specs: the built-in tables load and
 *     pick the rows they say, and malformed tables are refused naming the
 *     JSON path (bad values, unreachable and missing catch-all rows,
 *     shapes the template cannot instantiate: accumulators, shared memory,
 *     w13 gate/up halves), tiling in a format spec;
 *  2. tile selection: block_k halved until it divides K, warps_k capped;
 *  3. the layout contract: Marlin problems over bits, group sizes, zero
 *     points, act-order, bias and padding are accepted with the expected
 *     shapes and the scale permutation Marlin uses (hazard H1: w13 scales
 *     use the 32-entry table when the group size is not below the
 *     unpadded I); specs whose scales or bias are stored elsewhere are
 *     refused with the first element the template would misread;
 *  4. wna16_cuda_moe_create's refusals that come before the GPU: missing
 *     tensors, wrong shapes and dtypes, a backend without tiles.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "gen/moe_cuda.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static char *marlin_text(void)
{
    size_t n;
    char *t = tu_read_file(WNA16_SOURCE_DIR "/specs/backends/marlin.json", &n);
    if (!t) {
        fprintf(stderr, "cannot read specs/backends/marlin.json\n");
        exit(1);
    }
    char *z = realloc(t, n + 1);
    if (!z)
        exit(1);
    z[n] = 0;
    return z;
}

/* Loads marlin.json after `edit` changed its JSON; returns the status and
 * leaves the message in err. */
static wna16_status_t load_edited(wna16_context_t *ctx,
                                  void (*edit)(cJSON *root, int arg), int arg,
                                  const wna16_spec_t **out, wna16_error_t *err)
{
    char *text = marlin_text();
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root)
        exit(1);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "name");
    cJSON_AddStringToObject(root, "name", "marlin_edit");
    edit(root, arg);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    wna16_status_t st = wna16_spec_load_text(ctx, "edit.json", s, strlen(s),
                                             out, err);
    free(s);
    return st;
}

static cJSON *tiling(cJSON *root)
{
    return cJSON_GetObjectItemCaseSensitive(root, "tiling");
}

static cJSON *row(cJSON *root, const char *list, int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tiling(root),
                                                               list), i);
}

static void set_num(cJSON *obj, const char *key, double v)
{
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddNumberToObject(obj, key, v);
}

static void set_range(cJSON *obj, const char *key, int lo, int hi)
{
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    int v[2] = {lo, hi};
    cJSON_AddItemToObject(obj, key, cJSON_CreateIntArray(v, 2));
}

/* ---- the built-in table's rows by what they are ----
 * Found once in marlin.json (find_rows), so that re-tuning the table
 * (rows added, moved, re-shaped) moves no test; a row the tests rely on
 * that is gone stops the test with its name. */
enum {
    BM_16,        /* $.tiling.block_m: the mma.sync block_m 16 row */
    BM_24,        /* block_m 24 (a middle row with a condition) */
    BM_48,        /* the mma.sync block_m 48 row */
    BM_WG128,     /* the wgmma block_m 128 row */
    BM_LAST,      /* the catch-all row */
    G_W13_8_WIDE, /* $.tiling.gemm: w13, block_m 8, an "n" range */
    G_W13_8,      /* w13, block_m 8, any n */
    G_W2_8_WIDE,  /* w2, block_m 8, an "n" range */
    G_W2_8,       /* w2, block_m 8, any n */
    G_W13_24,     /* w13, block_m 24 */
    G_W2_24,      /* w2, block_m 24 (256 columns, four warps_n) */
    G_W13_16,     /* w13, block_m 16 */
    G_W2_16,      /* w2, block_m 16 */
    G_W13_32,     /* w13, block_m 32 (block_k 128) */
    G_MMA_48_64,  /* both GEMMs, block_m 48-64, mma.sync */
    G_WGMMA,      /* the wgmma GEMM row */
    G_LAST,       /* the catch-all GEMM row */
    N_ROWS
};
static int ROW[N_ROWS];

static bool row_is(const cJSON *r, const char *gemm, int bm_lo, int bm_hi,
                   int has_n)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(r, "gemm");
    const cJSON *bm = cJSON_GetObjectItemCaseSensitive(r, "block_m");
    const cJSON *mma = cJSON_GetObjectItemCaseSensitive(r, "mma");
    if ((gemm == NULL) != (g == NULL) ||
        (gemm && (!cJSON_IsString(g) || strcmp(g->valuestring, gemm))))
        return false;
    if (mma || !cJSON_IsArray(bm) || cJSON_GetArraySize(bm) != 2 ||
        cJSON_GetArrayItem(bm, 0)->valueint != bm_lo ||
        cJSON_GetArrayItem(bm, 1)->valueint != bm_hi)
        return false;
    return has_n < 0 ||
           (cJSON_GetObjectItemCaseSensitive(r, "n") != NULL) == has_n;
}

static int find_gemm(const cJSON *list, const char *gemm, int lo, int hi,
                     int has_n)
{
    for (int i = 0; i < cJSON_GetArraySize(list); i++)
        if (row_is(cJSON_GetArrayItem(list, i), gemm, lo, hi, has_n))
            return i;
    return -1;
}

static int find_bm(const cJSON *list, int bm, bool wgmma)
{
    for (int i = 0; i < cJSON_GetArraySize(list); i++) {
        const cJSON *r = cJSON_GetArrayItem(list, i);
        if (cJSON_GetObjectItemCaseSensitive(r, "block_m")->valueint == bm &&
            (cJSON_GetObjectItemCaseSensitive(r, "mma") != NULL) == wgmma)
            return i;
    }
    return -1;
}

static void find_rows(void)
{
    char *text = marlin_text();
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root)
        exit(1);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(tiling(root), "block_m");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(tiling(root), "gemm");
    ROW[BM_16] = find_bm(b, 16, false);
    ROW[BM_24] = find_bm(b, 24, false);
    ROW[BM_48] = find_bm(b, 48, false);
    ROW[BM_WG128] = find_bm(b, 128, true);
    ROW[BM_LAST] = cJSON_GetArraySize(b) - 1;
    ROW[G_W13_8_WIDE] = find_gemm(g, "w13", 8, 8, 1);
    ROW[G_W13_8] = find_gemm(g, "w13", 8, 8, 0);
    ROW[G_W2_8_WIDE] = find_gemm(g, "w2", 8, 8, 1);
    ROW[G_W2_8] = find_gemm(g, "w2", 8, 8, 0);
    ROW[G_W13_24] = find_gemm(g, "w13", 24, 24, -1);
    ROW[G_W2_24] = find_gemm(g, "w2", 24, 24, -1);
    ROW[G_W13_16] = find_gemm(g, "w13", 16, 16, -1);
    ROW[G_W2_16] = find_gemm(g, "w2", 16, 16, -1);
    ROW[G_W13_32] = find_gemm(g, "w13", 32, 32, -1);
    ROW[G_MMA_48_64] = find_gemm(g, NULL, 48, 64, -1);
    ROW[G_WGMMA] = -1;
    for (int i = 0; i < cJSON_GetArraySize(g); i++)
        if (cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(g, i), "mma"))
            ROW[G_WGMMA] = i;
    ROW[G_LAST] = cJSON_GetArraySize(g) - 1;
    cJSON_Delete(root);
    static const char *const NAMES[N_ROWS] = {
        "BM_16", "BM_24", "BM_48", "BM_WG128", "BM_LAST", "G_W13_8_WIDE",
        "G_W13_8", "G_W2_8_WIDE", "G_W2_8", "G_W13_24", "G_W2_24",
        "G_W13_16", "G_W2_16", "G_W13_32", "G_MMA_48_64", "G_WGMMA",
        "G_LAST"};
    for (int i = 0; i < N_ROWS; i++)
        if (ROW[i] < 0) {
            fprintf(stderr, "specs/backends/marlin.json: no tiling row "
                    "matches %s (%s)\n", NAMES[i], __FILE__);
            exit(1);
        }
}

/* Whether `path` is "$.tiling.LIST[ROW[role]]". */
static bool at_row(const char *path, const char *list, int role)
{
    char want[64];
    snprintf(want, sizeof want, "$.tiling.%s[%d]", list, ROW[role]);
    return path && strcmp(path, want) == 0;
}

/* `fmt` with its first "%d" replaced by ROW[r1], the second by ROW[r2]
 * (the needles name the rows they expect in the message). */
static void fill_rows(char *out, size_t n, const char *fmt, int r1, int r2)
{
    const int rows[2] = {r1, r2};
    size_t o = 0;
    int k = 0;
    for (const char *f = fmt; *f && o + 12 < n; f++) {
        if (f[0] == '%' && f[1] == 'd' && k < 2 && rows[k] >= 0) {
            o += (size_t)snprintf(out + o, n - o, "%d", ROW[rows[k++]]);
            f++;
        } else {
            out[o++] = *f;
        }
    }
    out[o] = 0;
}

/* ---- edits, one per refusal ---- */
static void e_bm_value(cJSON *r, int a) { (void)a; set_num(row(r, "block_m", ROW[BM_16]), "block_m", 40); }
static void e_bm_last_cond(cJSON *r, int a) { (void)a; set_range(row(r, "block_m", ROW[BM_LAST]), "tokens_per_expert", 1, 9); }
static void e_bm_hides(cJSON *r, int a) { (void)a; cJSON_DeleteItemFromObjectCaseSensitive(row(r, "block_m", ROW[BM_24]), "tokens_per_expert"); }
static void e_bn(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W2_24]), "block_n", 96); }
static void e_bk(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W2_24]), "block_k", 32); }
static void e_bk192(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W13_16]), "block_k", 192); }
static void e_wn(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W2_24]), "warps_n", 3); }
static void e_wk(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_LAST]), "warps_k", 8); }
static void e_acc(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_MMA_48_64]), "warps_n", 2); }
static void e_smem(cJSON *r, int a)
{
    (void)a;
    cJSON *g = row(r, "gemm", ROW[G_W13_32]);
    set_num(g, "block_k", 256);
    set_num(g, "stages", 8);
}
static void e_key(cJSON *r, int a) { (void)a; cJSON_AddNumberToObject(row(r, "gemm", ROW[G_W13_24]), "tile", 1); }
static void e_gemm(cJSON *r, int a) { (void)a; cJSON_ReplaceItemInObjectCaseSensitive(row(r, "gemm", ROW[G_W13_24]), "gemm", cJSON_CreateString("w3")); }
static void e_halves(cJSON *r, int a)
{
    (void)a; /* a w2-only row with one warp over both of its tiles */
    cJSON_DeleteItemFromObjectCaseSensitive(row(r, "gemm", ROW[G_W2_24]), "gemm");
    set_num(row(r, "gemm", ROW[G_W2_24]), "warps_n", 1);
}
static void e_range(cJSON *r, int a) { (void)a; set_range(row(r, "gemm", ROW[G_W13_32]), "n", 9, 3); }
static void e_last(cJSON *r, int a) { (void)a; set_range(row(r, "gemm", ROW[G_LAST]), "k", 1, 64); }
static void e_wg_bm(cJSON *r, int a) { (void)a; set_num(row(r, "block_m", ROW[BM_WG128]), "block_m", 104); }
static void e_wg_shape(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_WGMMA]), "warps_n", 4); }
static void e_wg_catch(cJSON *r, int a) { (void)a; set_range(row(r, "gemm", ROW[G_WGMMA]), "n", 1, 4096); }
static void e_wg_mma(cJSON *r, int a) { (void)a; cJSON_ReplaceItemInObjectCaseSensitive(row(r, "gemm", ROW[G_WGMMA]), "mma", cJSON_CreateString("tcgen05")); }
/* warp_specialized: a wgmma row with two or four consumer warpgroups, a
 * boolean; block_m 256 needs 64 columns a warpgroup */
static void e_ws_plain(cJSON *r, int a) { (void)a; cJSON_AddBoolToObject(row(r, "gemm", ROW[G_W13_32]), "warp_specialized", 1); }
static void e_ws_bool(cJSON *r, int a) { (void)a; cJSON_ReplaceItemInObjectCaseSensitive(row(r, "gemm", ROW[G_WGMMA]), "warp_specialized", cJSON_CreateString("yes")); }
/* scales_on_acc and wgmma_groups: warp-specialized rows only */
static void e_sa_plain(cJSON *r, int a) { (void)a; cJSON_AddBoolToObject(row(r, "gemm", ROW[G_W13_32]), "scales_on_acc", 1); }
static void e_sa_bool(cJSON *r, int a) { (void)a; cJSON_AddNumberToObject(row(r, "gemm", ROW[G_WGMMA]), "wgmma_groups", 3); }
static void e_wg_256(cJSON *r, int a) { (void)a; set_num(row(r, "block_m", ROW[BM_WG128]), "block_m", 256); }
/* four consumer warpgroups (warps_n 16): warp-specialized, block_m <= 128 */
static void e_wg4_plain(cJSON *r, int a)
{
    (void)a;
    set_num(row(r, "gemm", ROW[G_WGMMA]), "warps_n", 16);
    cJSON_DeleteItemFromObjectCaseSensitive(row(r, "gemm", ROW[G_WGMMA]),
                                            "warp_specialized");
}
static void e_wg4_sc(cJSON *r, int a)
{
    (void)a;
    set_num(row(r, "gemm", ROW[G_WGMMA]), "warps_n", 16);
    cJSON_AddBoolToObject(row(r, "gemm", ROW[G_WGMMA]), "split_codes", 1);
}
static void e_wg4_256(cJSON *r, int a)
{
    e_wg_256(r, a);
    set_num(row(r, "gemm", ROW[G_WGMMA]), "warps_n", 16);
    cJSON_DeleteItemFromObjectCaseSensitive(row(r, "gemm", ROW[G_WGMMA]),
                                            "tail_m");
}
/* tail_m: 0, 16 or 32, on warp-specialized rows of two consumer
 * warpgroups */
static void e_tm_value(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_WGMMA]), "tail_m", 24); }
static void e_tm_plain(cJSON *r, int a) { (void)a; cJSON_AddNumberToObject(row(r, "gemm", ROW[G_W13_32]), "tail_m", 32); }
/* persistent: warp-specialized rows without split codes */
static void e_ps_plain(cJSON *r, int a) { (void)a; cJSON_AddBoolToObject(row(r, "gemm", ROW[G_W13_32]), "persistent", 1); }
static void e_ps_sc(cJSON *r, int a)
{
    (void)a;
    cJSON_AddBoolToObject(row(r, "gemm", ROW[G_WGMMA]), "persistent", 1);
    cJSON_AddBoolToObject(row(r, "gemm", ROW[G_WGMMA]), "split_codes", 1);
}
static void e_ps_bool(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_WGMMA]), "persistent", 1); }
static void e_wg_last(cJSON *r, int a)
{
    (void)a; /* the catch-all block_m row marked wgmma */
    cJSON_AddStringToObject(row(r, "block_m", ROW[BM_LAST]), "mma", "wgmma");
    set_num(row(r, "block_m", ROW[BM_LAST]), "block_m", 128);
}
static void e_missing(cJSON *r, int a) { (void)a; cJSON_DeleteItemFromObjectCaseSensitive(tiling(r), "gemm"); }
static void e_stages(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W2_24]), "stages", 1); }
/* past int64_t (the spec fuzzer's 1.08e130: converting it was undefined) */
static void e_huge(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W2_24]), "stages", 1.07778e130); }
static void e_split(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W13_24]), "max_split_k", 3); }
static void e_occ(cJSON *r, int a)
{
    (void)a; /* 512 threads a CTA */
    set_num(row(r, "gemm", ROW[G_W13_32]), "warps_k", 4);
    set_num(row(r, "gemm", ROW[G_W13_32]), "min_ctas", 5);
}

static void e_sb(cJSON *r, int a) { (void)a; set_num(row(r, "gemm", ROW[G_W13_24]), "scales_in_b", 1); }

static void test_tiling_refusals(wna16_context_t *ctx)
{
    static const struct {
        void (*edit)(cJSON *, int);
        const char *needle; /* "%d": ROW[r1], then ROW[r2] */
        int r1, r2;
    } cases[] = {
        {e_bm_value, "$.tiling.block_m[%d].block_m: expected 8, 16, 24, 32, "
                     "48 or 64", BM_16, -1},
        {e_bm_last_cond, "$.tiling.block_m[%d]: the last row must have no "
                         "condition", BM_LAST, -1},
        {e_bm_hides, "$.tiling.block_m[%d]: a row without a condition hides",
         BM_24, -1},
        {e_bn, "$.tiling.gemm[%d].block_n: expected a multiple of 64",
         G_W2_24, -1},
        {e_bk, "$.tiling.gemm[%d].block_k: 32 is out of range [64, 256]",
         G_W2_24, -1},
        {e_bk192, "$.tiling.gemm[%d].block_k: expected 64, 128 or 256",
         G_W13_16, -1},
        {e_wn, "$.tiling.gemm[%d].warps_n: expected a power of two dividing "
               "block_n / 64 = 4", G_W2_24, -1},
        {e_wk, "$.tiling.gemm[%d].warps_k: expected a power of two dividing "
               "block_k / 16 = 4", G_LAST, -1},
        {e_acc, "$.tiling.gemm[%d]: with block_m 48 (from "
                "$.tiling.block_m[%d]) a warp would hold 3 x 2", G_MMA_48_64,
         BM_48},
        {e_smem, "bytes of shared memory (at most 232448)", -1, -1},
        {e_key, "$.tiling.gemm[%d]: unknown key \"tile\"", G_W13_24, -1},
        {e_gemm, "$.tiling.gemm[%d].gemm: expected \"w13\" or \"w2\"",
         G_W13_24, -1},
        {e_halves, "$.tiling.gemm[%d]: a w13 shape puts the gate and up "
                   "halves", G_W2_24, -1},
        {e_range, "$.tiling.gemm[%d].n: empty range [9, 3]", G_W13_32, -1},
        {e_last, "$.tiling.gemm[%d]: the last row must have no condition",
         G_LAST, -1},
        {e_wg_bm, "$.tiling.block_m[%d].block_m: expected a multiple of 16 "
                  "from 16 to 256 (wgmma", BM_WG128, -1},
        {e_wg_shape, "$.tiling.gemm[%d]: a wgmma row has block_k 64, "
                     "warps_k 1", G_WGMMA, -1},
        {e_wg_catch, "block_m has wgmma rows, but no wgmma GEMM row without "
                     "conditions", -1, -1},
        {e_wg_mma, "$.tiling.gemm[%d].mma: expected \"mma.sync\" or "
                   "\"wgmma\"", G_WGMMA, -1},
        {e_wg_last, "$.tiling.block_m[%d]: the last row is the one every "
                    "device can run", BM_LAST, -1},
        {e_ws_plain, "$.tiling.gemm[%d].warp_specialized: only a wgmma row "
                     "with two or four consumer warpgroups", G_W13_32, -1},
        {e_ws_bool, "$.tiling.gemm[%d].warp_specialized: expected true or "
                    "false", G_WGMMA, -1},
        {e_sa_plain, "$.tiling.gemm[%d].scales_on_acc: only a "
                     "warp_specialized row", G_W13_32, -1},
        {e_sa_bool, "$.tiling.gemm[%d].wgmma_groups: expected 1 or 2",
         G_WGMMA, -1},
        {e_wg_256, "$.tiling.gemm[%d]: with block_m 256 (from "
                   "$.tiling.block_m[%d]) a wgmma warpgroup (4 warps_n) "
                   "computes 64 columns: block_n 256 needs warps_n 16",
                    G_WGMMA, BM_WG128},
        {e_wg4_plain, "$.tiling.gemm[%d].warps_n: four wgmma warpgroups "
                      "(warps_n 16) need \"warp_specialized\"", G_WGMMA, -1},
        {e_tm_value, "$.tiling.gemm[%d].tail_m: expected 0, 16 or 32",
         G_WGMMA, -1},
        {e_tm_plain, "$.tiling.gemm[%d].tail_m: tail rows are for "
                     "warp_specialized rows", G_W13_32, -1},
        {e_ps_plain, "$.tiling.gemm[%d].persistent: persistent CTAs are for "
                     "warp_specialized rows", G_W13_32, -1},
        {e_ps_sc, "$.tiling.gemm[%d].persistent: persistent CTAs are for "
                  "warp_specialized rows without split_codes", G_WGMMA, -1},
        {e_ps_bool, "$.tiling.gemm[%d].persistent: expected", G_WGMMA, -1},
        {e_wg4_sc, "$.tiling.gemm[%d].split_codes: the codes are split for "
                   "two consumer warpgroups", G_WGMMA, -1},
        {e_wg4_256, "$.tiling.gemm[%d]: with block_m 256 (from "
                    "$.tiling.block_m[%d]): four consumer warpgroups",
                     G_WGMMA, BM_WG128},
        {e_missing, "$.tiling: \"block_m\" and \"gemm\" are required", -1, -1},
        {e_stages, "$.tiling.gemm[%d].stages: 1 is out of range [2, 8]",
         G_W2_24, -1},
        {e_huge, "$.tiling.gemm[%d].stages: 1.07778e+130 is out of range "
                 "[2, 8]", G_W2_24, -1},
        {e_split, "$.tiling.gemm[%d].max_split_k: expected a power of two",
         G_W13_24, -1},
        {e_occ, "$.tiling.gemm[%d].min_ctas: 5 CTAs of 512 threads exceed",
         G_W13_32, -1},
        {e_sb, "$.tiling.gemm[%d].scales_in_b: expected true or false",
         G_W13_24, -1},
    };
    for (size_t i = 0; i < W16_ARRAY_LEN(cases); i++) {
        wna16_error_t err;
        char needle[256];
        fill_rows(needle, sizeof needle, cases[i].needle, cases[i].r1,
                  cases[i].r2);
        wna16_status_t st = load_edited(ctx, cases[i].edit, 0, NULL, &err);
        TU_CHECK_MSG(st == WNA16_ESPEC && strstr(err.message, needle),
                     "case %zu: %s: %s", i, wna16_status_name(st),
                     err.message);
        TU_CHECK_MSG(strncmp(err.message, "edit.json: ", 11) == 0, "%s",
                     err.message);
    }
    /* formats have no tiles */
    size_t n;
    char *t = tu_read_file(WNA16_SOURCE_DIR "/specs/formats/gptq.json", &n);
    TU_CHECK(t != NULL);
    if (t) {
        cJSON *root = cJSON_ParseWithLength(t, n);
        free(t);
        cJSON_DeleteItemFromObjectCaseSensitive(root, "name");
        cJSON_AddStringToObject(root, "name", "gptq_edit");
        cJSON_AddItemToObject(root, "tiling", cJSON_CreateObject());
        char *s = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        wna16_error_t err;
        wna16_status_t st = wna16_spec_load_text(ctx, "fmt.json", s, strlen(s),
                                                 NULL, &err);
        TU_CHECK_MSG(st == WNA16_ESPEC && strstr(err.message, "$.tiling: not "
                     "allowed in a format spec"), "%s", err.message);
        free(s);
    }
}

static void test_lookups(wna16_context_t *ctx)
{
    const wna16_spec_t *m = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "marlin");
    TU_CHECK(m && m->tiling);
    if (!m || !m->tiling)
        return;
    static const int64_t tpe[] = {1, 4, 5, 8, 9, 18, 19, 24, 25, 40, 41,
                                  100000};
    static const int want[] = {8, 8, 16, 16, 24, 24, 32, 32, 48, 48, 64, 64};
    wna16_error_t err;
    int bm0 = 0;
    for (size_t i = 0; i < W16_ARRAY_LEN(tpe); i++) {
        int bm = 0;
        TU_OK(w16_moe_cuda_block_m(m, tpe[i], false, &bm, NULL, &err), &err);
        TU_CHECK_MSG(bm == want[i], "tpe %lld: block_m %d", (long long)tpe[i],
                     bm);
    }
    /* block_m 8: GEMM 1 of Mixtral-8x7B's width (N >= 16384) in CTAs of
     * two warps and 128 columns, six an SM (row 0), narrower ones in four
     * warps and 256 columns, four an SM (row 1); w2 row 3, and row 2
     * (128 columns) from N 6144 */
    w16_moe_gemm_cfg_t c8;
    memset(&c8, 0, sizeof c8);
    const char *p8 = NULL;
    TU_OK(w16_moe_cuda_tile(m, 8, false, WNA16_GEMM_W13, 28672, 4096, &c8,
                            &p8, &err), &err);
    TU_CHECK(c8.block_m == 8 && c8.block_n == 128 && c8.warps_n == 2 &&
             c8.min_ctas == 6 && c8.stages == 3 &&
             at_row(p8, "gemm", G_W13_8_WIDE));
    TU_OK(w16_moe_cuda_tile(m, 8, false, WNA16_GEMM_W13, 4096, 7168, &c8,
                            &p8, &err), &err);
    TU_CHECK(c8.min_ctas == 4 && at_row(p8, "gemm", G_W13_8));
    TU_OK(w16_moe_cuda_tile(m, 8, false, WNA16_GEMM_W2, 4096, 14336, &c8,
                            &p8, &err), &err);
    TU_CHECK(c8.min_ctas == 3 && at_row(p8, "gemm", G_W2_8));
    TU_OK(w16_moe_cuda_tile(m, 8, false, WNA16_GEMM_W2, 7168, 2048, &c8,
                            &p8, &err), &err);
    TU_CHECK(c8.block_n == 128 && c8.stages == 4 && c8.min_ctas == 6 &&
             at_row(p8, "gemm", G_W2_8_WIDE));
    TU_OK(w16_moe_cuda_tile(m, 8, false, WNA16_GEMM_W2, 4096, 14336, &c8,
                            &p8, &err), &err);
    /* the shared memory of that row fits four CTAs an SM (sm_90: 228 KiB,
     * 1 KiB reserved a CTA) with group size 128 */
    c8.bits = 4;
    w16_moe_cfg_groups(&c8, 112, 128);
    TU_CHECK_MSG(4 * (w16_moe_gemm_shared(&c8) + 1024) <= 228 * 1024,
                 "block_m 8: %zu bytes", w16_moe_gemm_shared(&c8));
    /* block_m 24 (swapped, three n8 blocks of rows): w13 row 4 under
     * launch bounds for three CTAs an SM, w2 row 5 with four stages for
     * two */
    TU_OK(w16_moe_cuda_tile(m, 24, false, WNA16_GEMM_W13, 28672, 4096, &c8,
                            &p8, &err), &err);
    TU_CHECK(c8.block_m == 24 && c8.min_ctas == 3 && c8.stages == 3 &&
             at_row(p8, "gemm", G_W13_24));
    TU_OK(w16_moe_cuda_tile(m, 24, false, WNA16_GEMM_W2, 4096, 14336, &c8,
                            &p8, &err), &err);
    TU_CHECK(c8.block_m == 24 && c8.min_ctas == 2 && c8.stages == 4 &&
             at_row(p8, "gemm", G_W2_24));
    /* w2 at block_m 16: row 7 (block_n 256, block_k 128, one K warp,
     * split-K up to 8 aimed at 2 CTAs an SM, launch bounds for 3); K = 192
     * halves block_k to 64 */
    w16_moe_gemm_cfg_t c;
    const char *path = NULL;
    TU_OK(w16_moe_cuda_tile(m, 16, false, WNA16_GEMM_W2, 2048, 768, &c, &path, &err),
          &err);
    TU_CHECK(c.block_n == 256 && c.block_k == 128 && c.warps_k == 1 &&
             c.min_ctas == 3 && at_row(path, "gemm", G_W2_16));
    int max_split = 0, cps = 0;
    w16_moe_cuda_split(m, 16, false, WNA16_GEMM_W2, 2048, 768, &max_split, &cps);
    TU_CHECK_MSG(max_split == 8 && cps == 2, "split %d cps %d", max_split,
                 cps);
    TU_OK(w16_moe_cuda_tile(m, 16, false, WNA16_GEMM_W2, 2048, 192, &c, &path, &err),
          &err);
    TU_CHECK_MSG(c.block_k == 64 && c.warps_k == 1, "bk %d wk %d", c.block_k,
                 c.warps_k);
    TU_OK(w16_moe_cuda_tile(m, 16, false, WNA16_GEMM_W13, 1536, 2048, &c, &path,
                            &err), &err);
    TU_CHECK(c.block_n == 256 && at_row(path, "gemm", G_W13_16));
    TU_OK(w16_moe_cuda_tile(m, 64, false, WNA16_GEMM_W13, 1024, 128, &c, &path, &err),
          &err);
    TU_CHECK(c.block_n == 256 && at_row(path, "gemm", G_MMA_48_64));
    TU_OK(w16_moe_cuda_tile(m, 64, false, WNA16_GEMM_W13, 512, 128, &c, &path,
                            &err), &err);
    TU_CHECK(at_row(path, "gemm", G_LAST));
    TU_CHECK(w16_moe_cuda_tile(m, 16, false, WNA16_GEMM_W2, 256, 96, &c, &path,
                               &err) == WNA16_EUNSUPPORTED);
    /* where wgmma runs: block_m 48 from 25 routed slots per expert, 64
     * from 37, 80 from 49, 96 from 65, 112 from 77, 128 from 91, on the
     * wgmma GEMM row; below that, and without wgmma, the mma.sync rows */
    bool wg = false;
    static const int tpe_bm[][2] = {{25, 48}, {36, 48}, {37, 64}, {40, 64},
                                    {48, 64}, {49, 80}, {64, 80}, {65, 96},
                                    {76, 96}, {77, 112}, {90, 112},
                                    {91, 128}, {4096, 128}};
    for (size_t i = 0; i < W16_ARRAY_LEN(tpe_bm); i++) {
        TU_OK(w16_moe_cuda_block_m(m, tpe_bm[i][0], true, &bm0, &wg, &err),
              &err);
        TU_CHECK_MSG(bm0 == tpe_bm[i][1] && wg, "%d slots an expert: "
                     "block_m %d wgmma %d", tpe_bm[i][0], bm0, wg);
    }
    TU_OK(w16_moe_cuda_block_m(m, 91, false, &bm0, &wg, &err), &err);
    TU_CHECK(bm0 == 64 && !wg);
    TU_OK(w16_moe_cuda_block_m(m, 40, false, &bm0, &wg, &err), &err);
    TU_CHECK(bm0 == 48 && !wg);
    TU_OK(w16_moe_cuda_block_m(m, 24, true, &bm0, &wg, &err), &err);
    TU_CHECK(bm0 == 32 && !wg);
    TU_OK(w16_moe_cuda_block_m(m, 56, false, &bm0, &wg, &err), &err);
    TU_CHECK(bm0 == 64 && !wg);
    TU_OK(w16_moe_cuda_block_m(m, 100000, false, &bm0, &wg, &err), &err);
    TU_CHECK(bm0 == 64 && !wg);
    TU_OK(w16_moe_cuda_tile(m, 128, true, WNA16_GEMM_W13, 28672, 4096, &c,
                            &path, &err), &err);
    TU_CHECK(c.wgmma && c.block_n == 256 && c.warps_n == 8 &&
             at_row(path, "gemm", G_WGMMA));
    TU_OK(w16_moe_cuda_tile(m, 64, false, WNA16_GEMM_W13, 28672, 4096, &c,
                            &path, &err), &err);
    TU_CHECK(!c.wgmma);
    const wna16_spec_t *tr = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
    int bm;
    TU_CHECK(tr && w16_moe_cuda_block_m(tr, 1, false, &bm, NULL, &err) ==
                       WNA16_EUNSUPPORTED && strstr(err.message, "tiling"));
}

/* Small-M wgmma rows (block_m 16, 32, 48: m64n16k16 to m64n48k16
 * products; measured slower than the mma.sync rows on the H200, so not in
 * the built-in table): a table with a wgmma block_m 16 row first and a
 * warp-specialized wgmma GEMM row for block_m 16-48 loads; wgmma devices
 * take them, the others (sm_80, act order) fall back to the mma.sync
 * rows; the generator accepts the tile and refuses a block_m wgmma cannot
 * have. */
static void e_small_wgmma(cJSON *r, int a)
{
    (void)a;
    cJSON *bm = cJSON_CreateObject();
    cJSON *tpe = cJSON_CreateArray();
    cJSON_AddItemToArray(tpe, cJSON_CreateNumber(1));
    cJSON_AddItemToArray(tpe, cJSON_CreateNumber(8));
    cJSON_AddItemToObject(bm, "tokens_per_expert", tpe);
    cJSON_AddNumberToObject(bm, "block_m", 16);
    cJSON_AddStringToObject(bm, "mma", "wgmma");
    cJSON_InsertItemInArray(cJSON_GetObjectItemCaseSensitive(tiling(r),
                                                             "block_m"),
                            0, bm);
    cJSON *g = cJSON_Duplicate(row(r, "gemm", ROW[G_WGMMA]), 1);
    cJSON *range = cJSON_CreateArray();
    cJSON_AddItemToArray(range, cJSON_CreateNumber(16));
    cJSON_AddItemToArray(range, cJSON_CreateNumber(48));
    cJSON_AddItemToObject(g, "block_m", range);
    set_num(g, "stages", 6);
    cJSON_AddNumberToObject(g, "max_split_k", 16);
    cJSON_AddNumberToObject(g, "ctas_per_sm", 1);
    /* g goes before the wgmma row and the last row (detached, added
     * back after it) */
    cJSON *gemm = cJSON_GetObjectItemCaseSensitive(tiling(r), "gemm");
    cJSON *wgmma_row = cJSON_DetachItemFromArray(gemm, ROW[G_WGMMA]);
    cJSON *last = cJSON_DetachItemFromArray(gemm, ROW[G_WGMMA]);
    cJSON_AddItemToArray(gemm, g);
    cJSON_AddItemToArray(gemm, wgmma_row);
    cJSON_AddItemToArray(gemm, last);
}

static void test_small_wgmma(wna16_context_t *ctx)
{
    const wna16_spec_t *m = NULL;
    wna16_error_t err;
    TU_OK(load_edited(ctx, e_small_wgmma, 0, &m, &err), &err);
    if (!m)
        return;
    int bm = 0;
    bool wg = false;
    TU_OK(w16_moe_cuda_block_m(m, 4, true, &bm, &wg, &err), &err);
    TU_CHECK_MSG(bm == 16 && wg, "block_m %d wgmma %d", bm, wg);
    /* without wgmma, the next row that matches: the table's block_m 8 */
    TU_OK(w16_moe_cuda_block_m(m, 4, false, &bm, &wg, &err), &err);
    TU_CHECK_MSG(bm == 8 && !wg, "block_m %d wgmma %d", bm, wg);
    TU_OK(w16_moe_cuda_block_m(m, 9, true, &bm, &wg, &err), &err);
    TU_CHECK_MSG(bm == 24 && !wg, "block_m %d wgmma %d", bm, wg);
    w16_moe_gemm_cfg_t c;
    memset(&c, 0, sizeof c);
    const char *path = NULL;
    TU_OK(w16_moe_cuda_tile(m, 16, true, WNA16_GEMM_W13, 28672, 4096, &c,
                            &path, &err), &err);
    TU_CHECK_MSG(c.wgmma && c.ws && c.block_m == 16 && c.block_n == 256 &&
                 c.stages == 6 && at_row(path, "gemm", G_WGMMA),
                 "%s: wgmma %d ws %d block_m %d block_n %d stages %d", path,
                 c.wgmma, c.ws, c.block_m, c.block_n, c.stages);
    int max_split = 0, cps = 0;
    w16_moe_cuda_split(m, 16, true, WNA16_GEMM_W2, 4096, 14336, &max_split,
                       &cps);
    TU_CHECK_MSG(max_split == 16 && cps == 1, "split %d cps %d", max_split,
                 cps);
    TU_OK(w16_moe_cuda_tile(m, 128, true, WNA16_GEMM_W13, 28672, 4096, &c,
                            &path, &err), &err);
    /* the table's wgmma row, one down behind the new one */
    char wg_path[64];
    snprintf(wg_path, sizeof wg_path, "$.tiling.gemm[%d]", ROW[G_WGMMA] + 1);
    TU_CHECK(c.wgmma && strcmp(path, wg_path) == 0);
    TU_OK(w16_moe_cuda_tile(m, 16, false, WNA16_GEMM_W13, 28672, 4096, &c,
                            &path, &err), &err);
    TU_CHECK(!c.wgmma && at_row(path, "gemm", G_W13_16));
    /* the generator: block_m 16 builds, 40 is refused with the reason */
    memset(&c, 0, sizeof c);
    TU_OK(w16_moe_cuda_tile(m, 16, true, WNA16_GEMM_W2, 4096, 14336, &c,
                            &path, &err), &err);
    c.bits = 4;
    w16_moe_cfg_groups(&c, 112, 128);
    c.act_dtype = c.scale_dtype = c.bias_dtype = WNA16_DTYPE_BF16;
    c.activation = WNA16_ACT_INVALID;
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    TU_OK(w16_moe_gemm_source(&c, &b, &err), &err);
    TU_CHECK(b.data && strstr(b.data, "constexpr int BM = 16;"));
    w16_buf_free(&b);
    c.block_m = 40;
    w16_buf_init(&b, ctx);
    TU_CHECK_MSG(w16_moe_gemm_source(&c, &b, &err) == WNA16_EINVAL &&
                 strstr(err.message, "wgmma: block_m is a multiple of 16 "
                        "from 16 to 256"), "%s", err.message);
    w16_buf_free(&b);
}

static void test_contract(wna16_context_t *ctx)
{
    const wna16_spec_t *m = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "marlin");
    static const struct {
        int64_t E, H, I, bits, gs;
        bool zp, ao, bias;
        w16_moe_scales_t s13, s2;
        int64_t IP;
    } ok[] = {
        {2, 256, 128, 4, 128, false, false, false, W16_MOE_SCALES_T32,
         W16_MOE_SCALES_T32, 128}, /* H1: 128 !< 128 for both */
        {2, 256, 256, 4, 128, false, false, false, W16_MOE_SCALES_T64,
         W16_MOE_SCALES_T64, 256},
        {3, 128, 96, 4, 32, true, false, true, W16_MOE_SCALES_T64,
         W16_MOE_SCALES_T64, 128},
        {1, 384, 100, 8, -1, false, false, true, W16_MOE_SCALES_T32,
         W16_MOE_SCALES_T32, 128},
        {2, 256, 128, 4, 64, true, true, true, W16_MOE_SCALES_T64,
         W16_MOE_SCALES_T64, 128},
        {4, 128, 192, 8, 64, false, true, false, W16_MOE_SCALES_T64,
         W16_MOE_SCALES_T64, 192},
    };
    for (size_t i = 0; i < W16_ARRAY_LEN(ok); i++) {
        w16_problem_t p = {ok[i].E, ok[i].H, ok[i].I, ok[i].bits, ok[i].gs,
                           ok[i].zp, ok[i].ao, ok[i].bias};
        for (int g = 0; g < 2; g++) {
            w16_moe_operand_t op;
            wna16_error_t err;
            TU_OK(w16_moe_cuda_contract(m, &p, (wna16_gemm_t)g, &op, &err),
                  &err);
            int64_t N = g ? ok[i].H : 2 * ok[i].IP, K = g ? ok[i].IP : ok[i].H;
            TU_CHECK_MSG(op.N == N && op.K == K && op.IP == ok[i].IP,
                         "case %zu: N %lld K %lld", i, (long long)op.N,
                         (long long)op.K);
            TU_CHECK_MSG(op.scales == (g ? ok[i].s2 : ok[i].s13),
                         "case %zu g %d: scales %d", i, g, op.scales);
            TU_CHECK(op.ndim[W16_ROLE_QWEIGHT] == 3 &&
                     op.shape[W16_ROLE_QWEIGHT][2] == N * ok[i].bits / 2);
            TU_CHECK((op.ndim[W16_ROLE_QZEROS] == 3) == ok[i].zp);
            TU_CHECK((op.ndim[W16_ROLE_SORT_IDX] == 2) == ok[i].ao);
        }
    }
    /* what the template does not read */
    w16_problem_t p8zp = {2, 256, 128, 8, 128, true};
    w16_moe_operand_t op;
    wna16_error_t err;
    TU_CHECK(w16_moe_cuda_contract(m, &p8zp, WNA16_GEMM_W13, &op, &err) ==
             WNA16_EUNSUPPORTED && strstr(err.message, "4-bit codes only"));
    w16_problem_t pa8 = {2, 256, 128, 4, 128};
    pa8.a8 = 1;
    TU_CHECK(w16_moe_cuda_contract(m, &pa8, WNA16_GEMM_W13, &op, &err) ==
             WNA16_EUNSUPPORTED && strstr(err.message, "8-bit activations"));
    const wna16_spec_t *tr = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
    w16_problem_t pt = {2, 256, 128, 4, 128};
    TU_CHECK(tr && w16_moe_cuda_contract(tr, &pt, WNA16_GEMM_W13, &op, &err) ==
                       WNA16_EUNSUPPORTED);
    TU_CHECK_MSG(strstr(err.message, "cannot read this layout"), "%s",
                 err.message);
}

/* Scales (or bias) stored in plain column order: a valid layout the
 * template does not read. */
static void e_plain_scales(cJSON *r, int bias)
{
    cJSON *l = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(r, "layouts"), bias ? "bias" : "scales");
    cJSON *idx = cJSON_GetObjectItemCaseSensitive(l, "index");
    cJSON_ReplaceItemInArray(idx, bias ? 1 : 2, cJSON_CreateString("n"));
    cJSON *coord = cJSON_GetObjectItemCaseSensitive(l, "coord");
    cJSON_ReplaceItemInObjectCaseSensitive(coord, "n",
                                           cJSON_CreateString(bias ? "i1" : "i2"));
    cJSON_DeleteItemFromObjectCaseSensitive(l, "let");
}

static void test_contract_refusals(wna16_context_t *ctx)
{
    for (int bias = 0; bias < 2; bias++) {
        const wna16_spec_t *s = NULL;
        wna16_error_t err;
        TU_OK(load_edited(ctx, e_plain_scales, bias, &s, &err), &err);
        if (!s)
            continue;
        w16_problem_t p = {2, 256, 128, 4, 64, false, false, true};
        w16_moe_operand_t op;
        wna16_status_t st = w16_moe_cuda_contract(s, &p, WNA16_GEMM_W2, &op,
                                                  &err);
        const char *want = bias ? "$.layouts.bias: the CUDA fused-MoE template "
                                  "(templates/moe_marlin_gemm.cu) cannot read "
                                  "this layout: (e=0, n=2) is stored at [0][2] "
                                  "bit 0; the template reads [0][8] bit 0"
                                : "$.layouts.scales: the CUDA fused-MoE "
                                  "template (templates/moe_marlin_gemm.cu) "
                                  "cannot read this layout: (e=0, g=0, n=2) is "
                                  "stored at [0][0][2] bit 0; the template "
                                  "reads [0][0][8] bit 0";
        TU_CHECK_MSG(st == WNA16_EUNSUPPORTED && strstr(err.message, want),
                     "%s", err.message);
    }
}

/* wna16_cuda_moe_create checks everything it can before it needs a GPU. */
static void test_create_refusals(wna16_context_t *ctx)
{
    const wna16_spec_t *m = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "marlin");
    wna16_qlayer_t L = {.E = 2, .H = 128, .I = 64};
    wna16_error_t err;
    TU_OK(wna16_qweight_alloc(&L.w13, 2, 128, 128, 4, 64, false, false, false,
                              &err), &err);
    TU_OK(wna16_qweight_alloc(&L.w2, 2, 128, 64, 4, 64, false, false, false,
                              &err), &err);
    for (size_t i = 0; i < (size_t)2 * 2 * 128; i++)
        L.w13.scales[i] = 1.0f;
    for (size_t i = 0; i < (size_t)2 * 1 * 128; i++)
        L.w2.scales[i] = 1.0f;
    wna16_tensor_set_t *set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    TU_OK(wna16_ref_encode(ctx, m, &L, "L", set, &err), &err);
    wna16_quant_desc_t q = {.bits = 4, .group_size = 64};
    wna16_cuda_moe_t *moe = NULL;
    wna16_status_t st = wna16_cuda_moe_create(ctx, m, set, "X", 2, 128, 64, &q,
                                              false, &moe, &err);
    TU_CHECK_MSG(st == WNA16_ENOTFOUND && strstr(err.message, "X.w13_qweight"),
                 "%s", err.message);
    st = wna16_cuda_moe_create(ctx, m, set, "L", 2, 256, 64, &q, false, &moe,
                               &err);
    TU_CHECK_MSG(st == WNA16_EINVAL && strstr(err.message, "L.w13_qweight: "
                 "expected shape (2, 16, 256)"), "%s", err.message);
    wna16_quant_desc_t q8 = {.bits = 8, .group_size = 64};
    st = wna16_cuda_moe_create(ctx, m, set, "L", 2, 128, 64, &q8, false, &moe,
                               &err);
    TU_CHECK_MSG(st == WNA16_EINVAL && strstr(err.message, "expected shape"),
                 "%s", err.message);
    const wna16_spec_t *tr = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
    st = wna16_cuda_moe_create(ctx, tr, set, "L", 2, 128, 64, &q, false, &moe,
                               &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED, "%s", err.message);
    st = wna16_cuda_moe_create(ctx, m, set, "L", 0, 128, 64, &q, false, &moe,
                               &err);
    TU_CHECK(st == WNA16_EINVAL && moe == NULL);
    wna16_quant_desc_t q16 = {.bits = 4, .group_size = 16};
    st = wna16_cuda_moe_create(ctx, m, set, "L", 2, 128, 64, &q16, false, &moe,
                               &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED && strstr(err.message, "group size"),
                 "%s", err.message);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    find_rows();
    test_tiling_refusals(ctx);
    test_lookups(ctx);
    test_small_wgmma(ctx);
    test_contract(ctx);
    test_contract_refusals(ctx);
    test_create_refusals(ctx);
    wna16_context_destroy(ctx);
    return tu_finish("test_moe_cuda_contract");
}
