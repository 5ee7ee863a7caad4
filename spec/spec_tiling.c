/*
 * spec_tiling.c - the "tiling" section of backend specs: the tile shape,
 * warp layout and pipeline depth of the CUDA fused-MoE GEMM chosen per
 * problem (routed slots per expert, N, K). Loading checks every row
 * against what the template (templates/moe_marlin_gemm.cu) can
 * instantiate, so a bad table is a spec error naming the JSON path, never
 * a kernel that fails to compile or to launch:
 *
 *   "tiling": {
 *     "description": "...",
 *     "block_m": [ {"tokens_per_expert": [1, 16], "block_m": 16}, ...,
 *                  {"block_m": 64} ],
 *     "gemm":    [ {"gemm": "w2", "block_m": [16, 16], "n": [1, 4096],
 *                   "k": [1, 65536], "block_n": 128, "block_k": 128,
 *                   "warps_n": 2, "warps_k": 4, "stages": 4,
 *                   "max_split_k": 8, "ctas_per_sm": 2, "min_ctas": 2},
 *                  ...,
 *                  {"block_n": 128, "block_k": 64, "warps_n": 2,
 *                   "warps_k": 2, "stages": 3} ]
 *   }
 *
 * Both lists are first-match; conditions are inclusive integer ranges;
 * the last row of each has no condition and no other row lacks one. Rows
 * marked "mma": "wgmma" form a table of their own for Hopper's warpgroup
 * MMA (templates/moe_wgmma_gemm.cu): a wgmma block_m row counts only where
 * wgmma can run, and its problems choose among the wgmma GEMM rows only.
 * "portable" (alone, or beside the CUDA tables) gives the workgroup shape
 * of the generated fused MoE per expert run: token rows a GEMM lane
 * carries (1, 2, 4) and lanes a workgroup, first match on the run's
 * routed slots:
 *
 *     "portable": [ {"tokens_per_expert": [1, 1], "rows": 1,
 *                    "workgroup": 64}, ..., {"rows": 4, "workgroup": 64} ]
 *
 * The language is documented in docs/specs.md, section 14.
 */
#include "spec/spec.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

enum { TPATH = 160 };

typedef struct tload {
    wna16_spec_t *spec;
    const char *origin;
    wna16_error_t *err;
    wna16_status_t st;
} tload_t;

static bool tfail(tload_t *L, const char *path, const char *fmt, ...)
    W16_PRINTF(3, 4);

static bool tfail(tload_t *L, const char *path, const char *fmt, ...)
{
    if (L->st != WNA16_OK)
        return false;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    L->st = w16_err(L->err, WNA16_ESPEC, "%s: %s: %s", L->origin, path, what);
    return false;
}

static bool keys_ok(tload_t *L, const cJSON *obj, const char *path,
                    const char *const *allowed)
{
    if (!cJSON_IsObject(obj))
        return tfail(L, path, "expected an object");
    for (const cJSON *c = obj->child; c; c = c->next) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok |= strcmp(*a, c->string) == 0;
        if (!ok)
            return tfail(L, path, "unknown key \"%s\"", c->string);
        for (const cJSON *d = obj->child; d != c; d = d->next)
            if (strcmp(d->string, c->string) == 0)
                return tfail(L, path, "duplicate key \"%s\"", c->string);
    }
    return true;
}

static bool int_at(tload_t *L, const cJSON *j, const char *path, int64_t lo,
                   int64_t hi, int64_t *out)
{
    *out = 0; /* defined on failure too (optimizing compilers ask) */
    /* the integer test only within int64_t: converting a double outside
     * it is undefined (the spec fuzzer's 1.08e130); the range test below
     * refuses those */
    const double v = cJSON_IsNumber(j) ? j->valuedouble : 0.0;
    const bool in64 = v >= -0x1p63 && v < 0x1p63;
    if (!cJSON_IsNumber(j) || (in64 && v != (double)(int64_t)v))
        return tfail(L, path, "expected an integer");
    if (!(j->valuedouble >= (double)lo && j->valuedouble <= (double)hi))
        return tfail(L, path, "%g is out of range [%lld, %lld]",
                     j->valuedouble, (long long)lo, (long long)hi);
    *out = (int64_t)j->valuedouble;
    return true;
}

/* An optional boolean `key` of obj (at path base), false when absent. */
static bool bool_at(tload_t *L, const cJSON *obj, const char *base,
                    const char *key, bool *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = cJSON_IsTrue(j);
    if (j && !cJSON_IsBool(j)) {
        char path[TPATH];
        snprintf(path, sizeof path, "%s.%s", base, key);
        return tfail(L, path, "expected true or false");
    }
    return true;
}

/* An optional inclusive range [lo, hi]; absent = [0, INT64_MAX]. */
static bool range_at(tload_t *L, const cJSON *obj, const char *key,
                     const char *base, int64_t min, int64_t *lo, int64_t *hi,
                     bool *present)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    *lo = 0;
    *hi = INT64_MAX;
    if (present)
        *present = j != NULL;
    if (!j)
        return true;
    char p[TPATH];
    snprintf(p, sizeof p, "%s.%s", base, key);
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2)
        return tfail(L, p, "expected [lo, hi] (inclusive)");
    if (!int_at(L, j->child, p, min, INT32_MAX, lo) ||
        !int_at(L, j->child->next, p, min, INT32_MAX, hi))
        return false;
    if (*lo > *hi)
        return tfail(L, p, "empty range [%lld, %lld]", (long long)*lo,
                     (long long)*hi);
    return true;
}

static bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

/* The optional "mma" key: "mma.sync" (the default) or "wgmma". */
static bool mma_at(tload_t *L, const cJSON *obj, const char *base,
                   bool *wgmma, bool *present)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, "mma");
    *wgmma = false;
    *present = j != NULL;
    if (!j)
        return true;
    char p[TPATH];
    snprintf(p, sizeof p, "%s.mma", base);
    if (!cJSON_IsString(j) || (strcmp(j->valuestring, "mma.sync") != 0 &&
                               strcmp(j->valuestring, "wgmma") != 0))
        return tfail(L, p, "expected \"mma.sync\" or \"wgmma\"");
    *wgmma = strcmp(j->valuestring, "wgmma") == 0;
    return true;
}

bool w16_tile_block_m_ok(int block_m, bool wgmma)
{
    if (wgmma) /* wgmma's N, the producer's copies in rounds of 16 rows */
        return block_m >= 16 && block_m <= 256 && block_m % 16 == 0;
    return block_m == 8 || block_m == 24 ||
           (block_m >= 16 && block_m <= 64 && block_m % 16 == 0);
}

static size_t pipe_bytes(int block_m, int block_n, int block_k, int stages,
                         int bits, int scale_rows)
{
    /* A rows, B tiles, and the stage's group rows of scales (64 two-byte
     * scales a tile and row) */
    size_t stage = (size_t)block_m * block_k * 2 +
                   (size_t)(block_k / 16) * (block_n / 64) * 128u * bits +
                   (size_t)scale_rows * (block_n / 64) * 128u;
    return stage * (size_t)stages;
}

int w16_tile_c_rows(int block_m, int block_n, int block_k, int stages,
                    int bits, int scale_rows)
{
    size_t pipe = pipe_bytes(block_m, block_n, block_k, stages, bits,
                             scale_rows);
    size_t room = W16_TILING_MAX_SHARED - W16_TILING_STATIC_SHARED - 1024;
    size_t rows = pipe < room ? (room - pipe) / ((size_t)(block_n + 4) * 4)
                              : 0;
    rows = rows / 16 * 16;
    if (rows > (size_t)block_m)
        rows = (size_t)block_m;
    return rows < 16 ? 16 : (int)rows;
}

size_t w16_tile_shared_bytes(int block_m, int block_n, int block_k,
                             int stages, int bits, int scale_rows,
                             bool wgmma, bool persistent)
{
    size_t pipe = pipe_bytes(block_m, block_n, block_k, stages, bits,
                             scale_rows);
    size_t c_rows = persistent ? (size_t)w16_tile_c_rows(block_m, block_n,
                                                         block_k, stages,
                                                         bits, scale_rows)
                               : (size_t)block_m;
    size_t c = c_rows * (size_t)(block_n + 4) * 4;
    /* wgmma's template aligns its buffers to the 1024-byte swizzle atom */
    if (persistent)
        return pipe + c + 1024u;
    return (pipe > c ? pipe : c) + (wgmma ? 1024u : 0u);
}

static bool load_bm(tload_t *L, const cJSON *arr, const char *base,
                    w16_tiling_t *t)
{
    static const char *const keys[] = {"tokens_per_expert", "block_m", "mma",
                                       NULL};
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n < 1 || n > 16)
        return tfail(L, base, "expected an array of 1 to 16 rows");
    t->bm = w16_arena_alloc(&L->spec->arena, sizeof *t->bm * (size_t)n);
    if (!t->bm)
        return tfail(L, base, "out of memory");
    int i = 0;
    for (const cJSON *r = arr->child; r; r = r->next, i++) {
        char p[TPATH], pk[TPATH];
        snprintf(p, sizeof p, "%s[%d]", base, i);
        snprintf(pk, sizeof pk, "%s.block_m", p);
        w16_tile_bm_t *b = &t->bm[i];
        bool cond, c_mma;
        int64_t bm;
        if (!keys_ok(L, r, p, keys) ||
            !range_at(L, r, "tokens_per_expert", p, 1, &b->tpe_lo,
                      &b->tpe_hi, &cond) ||
            !mma_at(L, r, p, &b->wgmma, &c_mma))
            return false;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "block_m");
        if (!v)
            return tfail(L, p, "\"block_m\" is required");
        if (!int_at(L, v, pk, 8, 256, &bm))
            return false;
        if (b->wgmma && !w16_tile_block_m_ok((int)bm, true))
            return tfail(L, pk, "expected a multiple of 16 from 16 to 256 "
                         "(wgmma's N)");
        if (!b->wgmma && !w16_tile_block_m_ok((int)bm, false))
            return tfail(L, pk, "expected 8, 16, 24, 32, 48 or 64");
        if (i == n - 1 && b->wgmma)
            return tfail(L, p, "the last row is the one every device can "
                         "run: it cannot be a wgmma row");
        cond = cond || c_mma;
        if (i == n - 1 && cond)
            return tfail(L, p, "the last row must have no condition (it "
                         "catches every problem)");
        if (i < n - 1 && !cond)
            return tfail(L, p, "a row without a condition hides the rows "
                         "after it");
        b->block_m = (int)bm;
        snprintf(p, sizeof p, "%s[%d]", base, i);
        b->json_path = w16_arena_strdup(&L->spec->arena, p);
        if (!b->json_path)
            return tfail(L, p, "out of memory");
    }
    t->n_bm = n;
    return true;
}

/* Whether one of the first `upto` GEMM rows, of the same mma kind and
 * conditioned on block_m alone, takes every problem of block_m bm (then a
 * later row never sees them: first match). */
static bool caught_before(const w16_tiling_t *t, int upto, bool wgmma,
                          int bm)
{
    for (int i = 0; i < upto; i++) {
        const w16_tile_rule_t *r = &t->gemm[i];
        if (r->wgmma == wgmma && r->gemm < 0 && bm >= r->bm_lo &&
            bm <= r->bm_hi && r->n_lo == 0 && r->n_hi == INT64_MAX &&
            r->k_lo == 0 && r->k_hi == INT64_MAX)
            return true;
    }
    return false;
}

/* Checks GEMM row `idx` against the template for every block_m it
 * serves. */
static bool check_rule(tload_t *L, const char *p, const w16_tile_rule_t *g,
                       const w16_tiling_t *t, int idx)
{
    int tiles = g->block_n / 64, nt = g->wgmma ? 2 : tiles / g->warps_n;
    if (!g->wgmma && g->gemm != WNA16_GEMM_W2 &&
        (tiles % 2 != 0 || nt > tiles / 2 || (tiles / 2) % nt != 0))
        return tfail(L, p, "a w13 shape puts the gate and up halves of "
                     "block_n in separate warps: block_n must be a multiple "
                     "of 128 and each warp's %d tile(s) must lie in one half "
                     "(set \"gemm\": \"w2\" to keep this shape for w2)", nt);
    for (int i = 0; i < t->n_bm; i++) {
        int bm = t->bm[i].block_m;
        if (bm < g->bm_lo || bm > g->bm_hi || t->bm[i].wgmma != g->wgmma ||
            caught_before(t, idx, g->wgmma, bm))
            continue;
        /* above block_m 128 (the accumulators fit once) and for four
         * consumer warpgroups (warps_n 16) a warpgroup computes 64 columns */
        int wg_cols = bm > 128 || g->warps_n == 16 ? 64 : 128;
        if (g->wgmma && g->warps_n != 4 * g->block_n / wg_cols)
            return tfail(L, p, "with block_m %d (from %s) a wgmma warpgroup "
                         "(4 warps_n) computes %d columns: block_n %d needs "
                         "warps_n %d", bm, t->bm[i].json_path, wg_cols,
                         g->block_n, 4 * g->block_n / wg_cols);
        if (g->tail_m && bm > 128)
            return tfail(L, p, "with block_m %d (from %s): tail rows need "
                         "two slices a warpgroup (block_m 128 at most)", bm,
                         t->bm[i].json_path);
        if (g->wgmma && g->warps_n == 16 && bm > 128)
            return tfail(L, p, "with block_m %d (from %s): four consumer "
                         "warpgroups (warps_n 16) take block_m 128 at most",
                         bm, t->bm[i].json_path);
        if (!g->wgmma && ((bm + 15) / 16) * nt > 4)
            return tfail(L, p, "with block_m %d (from %s) a warp would hold "
                         "%d x %d m16 x 64 accumulator tiles: at most 4 (128 "
                         "floats a thread)", bm, t->bm[i].json_path,
                         (bm + 15) / 16, nt);
        /* the most: 8-bit codes, a row of scales every k16 step */
        size_t sh = w16_tile_shared_bytes(bm + g->tail_m, g->block_n, g->block_k,
                                          g->stages, 8, g->block_k / 16,
                                          g->wgmma, g->persistent);
        /* persistent CTAs: their static arrays count too */
        const int max_sh = W16_TILING_MAX_SHARED -
                           (g->persistent ? W16_TILING_STATIC_SHARED : 0);
        if (sh > (size_t)max_sh)
            return tfail(L, p, "with block_m %d and 8-bit weights a CTA "
                         "needs %zu bytes of shared memory (at most %d)", bm,
                         sh, max_sh);
    }
    return true;
}

static bool load_gemm(tload_t *L, const cJSON *arr, const char *base,
                      w16_tiling_t *t)
{
    static const char *const keys[] = {"gemm", "block_m", "n", "k",
                                       "block_n", "block_k", "warps_n",
                                       "warps_k", "stages", "max_split_k",
                                       "ctas_per_sm", "min_ctas",
                                       "scales_in_b", "mma", "warp_specialized",
                                       "scales_on_acc", "wgmma_groups", "split_codes",
                                       "tail_m", "persistent", NULL};
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n < 1 || n > 32)
        return tfail(L, base, "expected an array of 1 to 32 rows");
    t->gemm = w16_arena_alloc(&L->spec->arena, sizeof *t->gemm * (size_t)n);
    if (!t->gemm)
        return tfail(L, base, "out of memory");
    int i = 0;
    for (const cJSON *r = arr->child; r; r = r->next, i++) {
        char p[TPATH];
        snprintf(p, sizeof p, "%s[%d]", base, i);
        w16_tile_rule_t *g = &t->gemm[i];
        bool c_bm, c_n, c_k, c_mma;
        if (!keys_ok(L, r, p, keys) || !mma_at(L, r, p, &g->wgmma, &c_mma) ||
            !range_at(L, r, "block_m", p, 8, &g->bm_lo, &g->bm_hi, &c_bm) ||
            !range_at(L, r, "n", p, 1, &g->n_lo, &g->n_hi, &c_n) ||
            !range_at(L, r, "k", p, 1, &g->k_lo, &g->k_hi, &c_k))
            return false;
        g->gemm = -1;
        const cJSON *gm = cJSON_GetObjectItemCaseSensitive(r, "gemm");
        if (gm) {
            char pk[TPATH];
            snprintf(pk, sizeof pk, "%s.gemm", p);
            if (!cJSON_IsString(gm) || (strcmp(gm->valuestring, "w13") != 0 &&
                                        strcmp(gm->valuestring, "w2") != 0))
                return tfail(L, pk, "expected \"w13\" or \"w2\"");
            g->gemm = strcmp(gm->valuestring, "w13") == 0 ? WNA16_GEMM_W13
                                                          : WNA16_GEMM_W2;
        }
        bool cond = c_bm || c_n || c_k || gm || c_mma;
        if (i == n - 1 && cond)
            return tfail(L, p, "the last row must have no condition (it "
                         "catches every problem)");
        if (i < n - 1 && !cond)
            return tfail(L, p, "a row without a condition hides the rows "
                         "after it");
        static const char *const num_keys[] = {"block_n", "block_k",
                                               "warps_n", "warps_k", "stages"};
        static const int64_t lo[] = {64, 64, 1, 1, 2};
        static const int64_t hi[] = {256, 256, 16, 8, 8};
        int64_t v[5];
        for (int k = 0; k < 5; k++) {
            char pk[TPATH];
            snprintf(pk, sizeof pk, "%s.%s", p, num_keys[k]);
            const cJSON *j = cJSON_GetObjectItemCaseSensitive(r, num_keys[k]);
            if (!j)
                return tfail(L, p, "\"%s\" is required", num_keys[k]);
            if (!int_at(L, j, pk, lo[k], hi[k], &v[k]))
                return false;
        }
        char pk[TPATH];
        if (v[0] % 64 != 0) {
            snprintf(pk, sizeof pk, "%s.block_n", p);
            return tfail(L, pk, "expected a multiple of 64 (Marlin tiles are "
                         "64 columns wide)");
        }
        if (v[1] != 64 && v[1] != 128 && v[1] != 256) {
            snprintf(pk, sizeof pk, "%s.block_k", p);
            return tfail(L, pk, "expected 64, 128 or 256");
        }
        /* (above block_m 128: 64 columns a warpgroup, in check_rule) */
        if (g->wgmma && (v[1] != 64 || v[3] != 1 ||
                         (v[2] != v[0] / 32 && v[2] != v[0] / 16) ||
                         (v[2] != 4 && v[2] != 8 && v[2] != 16) || v[4] < 3))
            return tfail(L, p, "a wgmma row has block_k 64, warps_k 1, "
                         "one or two warpgroups (4 warps_n each), one per "
                         "128 columns (64 above block_m 128), or four of 64 "
                         "columns (warp-specialized), and at least 3 "
                         "stages");
        if (!g->wgmma && (!is_pow2(v[2]) || (v[0] / 64) % v[2] != 0)) {
            snprintf(pk, sizeof pk, "%s.warps_n", p);
            return tfail(L, pk, "expected a power of two dividing block_n / "
                         "64 = %lld", (long long)(v[0] / 64));
        }
        if (!is_pow2(v[3]) || (v[1] / 16) % v[3] != 0) {
            snprintf(pk, sizeof pk, "%s.warps_k", p);
            return tfail(L, pk, "expected a power of two dividing block_k / "
                         "16 = %lld", (long long)(v[1] / 16));
        }
        if (v[2] * v[3] > 16)
            return tfail(L, p, "warps_n * warps_k = %lld: at most 16 warps "
                         "(512 threads)", (long long)(v[2] * v[3]));
        g->block_n = (int)v[0];
        g->block_k = (int)v[1];
        g->warps_n = (int)v[2];
        g->warps_k = (int)v[3];
        g->stages = (int)v[4];
        /* optional split-K: max_split_k (power of two, default 1 = none)
         * and the CTAs per SM it aims for (default 2) */
        /* and min_ctas (default 1): the CTAs per SM the kernel's launch
         * bounds make the compiler fit in registers */
        static const char *const sk_keys[] = {"max_split_k", "ctas_per_sm",
                                              "min_ctas"};
        static const int64_t sk_hi[] = {64, 16, 8}, sk_def[] = {1, 2, 1};
        int64_t sk[3];
        for (int k = 0; k < 3; k++) {
            snprintf(pk, sizeof pk, "%s.%s", p, sk_keys[k]);
            const cJSON *j = cJSON_GetObjectItemCaseSensitive(r, sk_keys[k]);
            sk[k] = sk_def[k];
            if (j && !int_at(L, j, pk, 1, sk_hi[k], &sk[k]))
                return false;
        }
        if (!is_pow2(sk[0])) {
            snprintf(pk, sizeof pk, "%s.max_split_k", p);
            return tfail(L, pk, "expected a power of two");
        }
        g->max_split_k = (int)sk[0];
        g->ctas_per_sm = (int)sk[1];
        g->min_ctas = (int)sk[2];
        /* optional flags, default false (scales_in_b: the old inner loop;
         * the others: variants of the warp-specialized wgmma kernel) */
        const char *why = NULL, *key = NULL;
        if (!bool_at(L, r, p, "scales_in_b", &g->scales_in_b) ||
            !bool_at(L, r, p, "warp_specialized", &g->warp_specialized) ||
            !bool_at(L, r, p, "scales_on_acc", &g->scales_on_acc) ||
            !bool_at(L, r, p, "split_codes", &g->split_codes) ||
            !bool_at(L, r, p, "persistent", &g->persistent))
            return false;
        g->wgmma_groups = 1;
        const cJSON *wgr = cJSON_GetObjectItemCaseSensitive(r, "wgmma_groups");
        if (wgr) {
            snprintf(pk, sizeof pk, "%s.wgmma_groups", p);
            if (!cJSON_IsNumber(wgr) ||
                (wgr->valuedouble != 1 && wgr->valuedouble != 2))
                return tfail(L, pk, "expected 1 or 2");
            g->wgmma_groups = (int)wgr->valuedouble;
        }
        g->tail_m = 0;
        const cJSON *tm = cJSON_GetObjectItemCaseSensitive(r, "tail_m");
        if (tm) {
            snprintf(pk, sizeof pk, "%s.tail_m", p);
            if (!cJSON_IsNumber(tm) ||
                (tm->valuedouble != 0 && tm->valuedouble != 16 &&
                 tm->valuedouble != 32))
                return tfail(L, pk, "expected 0, 16 or 32");
            g->tail_m = (int)tm->valuedouble;
        }
        if (g->warp_specialized &&
            (!g->wgmma || (v[2] != 8 && v[2] != 16) || sk[2] > 1))
            key = "warp_specialized", why = "only a wgmma row with two or "
                  "four consumer warpgroups (warps_n 8 or 16) and one CTA "
                  "an SM is warp-specialized";
        else if (g->wgmma && v[2] == 16 && !g->warp_specialized)
            key = "warps_n", why = "four wgmma warpgroups (warps_n 16) "
                  "need \"warp_specialized\"";
        else if (g->scales_on_acc && !g->warp_specialized)
            key = "scales_on_acc", why = "only a warp_specialized row "
                  "applies scales on the accumulators";
        else if (g->wgmma_groups == 2 && !g->warp_specialized)
            key = "wgmma_groups", why = "only a warp_specialized row keeps "
                  "two wgmma groups in flight";
        else if (g->split_codes && !g->warp_specialized)
            key = "split_codes", why = "only a warp_specialized row splits "
                  "the codes";
        else if (g->split_codes && v[2] == 16)
            key = "split_codes", why = "the codes are split for two "
                  "consumer warpgroups (warps_n 8) only";
        else if (g->tail_m &&
                 (!g->warp_specialized || v[2] != 8 || g->scales_on_acc))
            key = "tail_m", why = "tail rows are for warp_specialized rows "
                  "of two consumer warpgroups (warps_n 8) without "
                  "scales_on_acc";
        else if (g->persistent && (!g->warp_specialized || g->split_codes))
            key = "persistent", why = "persistent CTAs are for "
                  "warp_specialized rows without split_codes";
        if (why) {
            snprintf(pk, sizeof pk, "%s.%s", p, key);
            return tfail(L, pk, "%s", why);
        }
        if (32 * v[2] * v[3] * sk[2] > 2048) {
            snprintf(pk, sizeof pk, "%s.min_ctas", p);
            return tfail(L, pk, "%lld CTAs of %lld threads exceed an SM's "
                         "2048 threads", (long long)sk[2],
                         (long long)(32 * v[2] * v[3]));
        }
        if (!check_rule(L, p, g, t, i))
            return false;
        g->json_path = w16_arena_strdup(&L->spec->arena, p);
        if (!g->json_path)
            return tfail(L, p, "out of memory");
    }
    t->n_gemm = n;
    return true;
}

/* wgmma block_m rows choose among the wgmma GEMM rows only: one of
 * those must catch every problem ("mma" its only key besides the shape). */
static bool wgmma_complete(tload_t *L, const w16_tiling_t *t)
{
    bool any = false;
    for (int i = 0; i < t->n_bm; i++)
        any |= t->bm[i].wgmma;
    if (!any)
        return true;
    for (int i = 0; i < t->n_gemm; i++) {
        const w16_tile_rule_t *g = &t->gemm[i];
        if (g->wgmma && g->gemm < 0 && g->bm_lo == 0 &&
            g->bm_hi == INT64_MAX && g->n_lo == 0 && g->n_hi == INT64_MAX &&
            g->k_lo == 0 && g->k_hi == INT64_MAX)
            return true;
    }
    return tfail(L, "$.tiling.gemm", "block_m has wgmma rows, but no wgmma "
                 "GEMM row without conditions catches their problems");
}

/* "portable": the generated fused MoE's rows. Every row's tokens_per_expert
 * is a condition but the last's; one workgroup size per value of rows (the
 * runtime keeps one kernel per block size). */
static bool load_portable(tload_t *L, const cJSON *arr, const char *base,
                          w16_ptiling_t *t)
{
    static const char *const keys[] = {"tokens_per_expert", "rows",
                                       "workgroup", NULL};
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (n < 1 || n > 16)
        return tfail(L, base, "expected an array of 1 to 16 rows");
    t->row = w16_arena_alloc(&L->spec->arena, sizeof *t->row * (size_t)n);
    if (!t->row) {
        L->st = w16_err_nomem(L->err, "loading a spec's tiling");
        return false;
    }
    int i = 0;
    for (const cJSON *r = arr->child; r; r = r->next, i++) {
        char path[TPATH], p[TPATH];
        snprintf(path, sizeof path, "%s[%d]", base, i);
        w16_ptile_t *row = &t->row[i];
        bool cond = false;
        int64_t v = 0;
        if (!keys_ok(L, r, path, keys) ||
            !range_at(L, r, "tokens_per_expert", path, 1, &row->tpe_lo,
                      &row->tpe_hi, &cond))
            return false;
        if (cond == (i == n - 1))
            return tfail(L, path, i == n - 1
                             ? "the last row must have no condition"
                             : "only the last row may lack tokens_per_expert");
        snprintf(p, sizeof p, "%s.rows", path);
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(r, "rows");
        if (!j)
            return tfail(L, path, "\"rows\" is required");
        if (!int_at(L, j, p, 1, 4, &v))
            return false;
        if (!is_pow2(v))
            return tfail(L, p, "expected 1, 2 or 4 (the generated GEMM's "
                         "block sizes)");
        row->rows = (int)v;
        snprintf(p, sizeof p, "%s.workgroup", path);
        j = cJSON_GetObjectItemCaseSensitive(r, "workgroup");
        if (!j)
            return tfail(L, path, "\"workgroup\" is required");
        if (!int_at(L, j, p, 16, 256, &v))
            return false;
        if (!is_pow2(v))
            return tfail(L, p, "expected a power of two");
        row->workgroup = (int)v;
        for (int k = 0; k < i; k++)
            if (t->row[k].rows == row->rows &&
                t->row[k].workgroup != row->workgroup)
                return tfail(L, p, "rows %d has workgroup %d at %s[%d]: one "
                             "workgroup size per value of rows", row->rows,
                             t->row[k].workgroup, base, k);
        if (!(row->json_path = w16_arena_strdup(&L->spec->arena, path))) {
            L->st = w16_err_nomem(L->err, "loading a spec's tiling");
            return false;
        }
    }
    t->n_row = n;
    return true;
}

const w16_ptile_t *w16_ptiling_pick(const w16_ptiling_t *t, int64_t slots)
{
    for (int i = 0; i < t->n_row; i++)
        if (slots >= t->row[i].tpe_lo && slots <= t->row[i].tpe_hi)
            return &t->row[i];
    return &t->row[t->n_row - 1]; /* unreachable: the last row catches all */
}

bool w16_spec_moe_takes_batched(const wna16_spec_t *s)
{
    return !s || !s->portable_tiling || s->caps.batched_format;
}

wna16_status_t w16_spec_load_tiling(wna16_spec_t *spec, const cJSON *j,
                                    const char *origin, wna16_error_t *err)
{
    static const char *const keys[] = {"description", "block_m", "gemm",
                                       "portable", NULL};
    tload_t L = {.spec = spec, .origin = origin, .err = err,
                 .st = WNA16_OK};
    const char *base = "$.tiling";
    w16_tiling_t *t = w16_arena_alloc(&spec->arena, sizeof *t);
    if (!t)
        return w16_err_nomem(err, "loading a spec's tiling");
    if (!keys_ok(&L, j, base, keys))
        return L.st;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "description");
    t->description = "";
    if (d) {
        if (!cJSON_IsString(d) || strlen(d->valuestring) > 2000)
            return tfail(&L, "$.tiling.description", "expected a string of "
                         "at most 2000 characters"), L.st;
        if (!(t->description = w16_arena_strdup(&spec->arena, d->valuestring)))
            return w16_err_nomem(err, "loading a spec's tiling");
    }
    const cJSON *bm = cJSON_GetObjectItemCaseSensitive(j, "block_m");
    const cJSON *gm = cJSON_GetObjectItemCaseSensitive(j, "gemm");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "portable");
    if (!bm != !gm || (!bm && !pt))
        return tfail(&L, base, "\"block_m\" and \"gemm\" are required%s",
                     bm || gm ? "" : " (the CUDA tables), or \"portable\" "
                     "(the generated fused MoE's)"), L.st;
    if (pt) {
        w16_ptiling_t *p = w16_arena_alloc(&spec->arena, sizeof *p);
        if (!p)
            return w16_err_nomem(err, "loading a spec's tiling");
        if (!load_portable(&L, pt, "$.tiling.portable", p))
            return L.st;
        spec->portable_tiling = p;
    }
    if (bm && load_bm(&L, bm, "$.tiling.block_m", t) &&
        load_gemm(&L, gm, "$.tiling.gemm", t) && wgmma_complete(&L, t))
        spec->tiling = t;
    return L.st;
}

const w16_tile_bm_t *w16_tiling_block_m(const w16_tiling_t *t,
                                        int64_t tokens_per_expert,
                                        bool wgmma_ok)
{
    for (int i = 0; i < t->n_bm; i++)
        if ((wgmma_ok || !t->bm[i].wgmma) &&
            tokens_per_expert >= t->bm[i].tpe_lo &&
            tokens_per_expert <= t->bm[i].tpe_hi)
            return &t->bm[i];
    return &t->bm[t->n_bm - 1]; /* unreachable: the last row catches all */
}

const w16_tile_rule_t *w16_tiling_gemm(const w16_tiling_t *t, bool wgmma,
                                       int block_m, wna16_gemm_t gemm,
                                       int64_t N, int64_t K)
{
    for (int i = 0; i < t->n_gemm; i++) {
        const w16_tile_rule_t *g = &t->gemm[i];
        if (g->wgmma == wgmma && (g->gemm < 0 || g->gemm == (int)gemm) &&
            block_m >= g->bm_lo &&
            block_m <= g->bm_hi && N >= g->n_lo && N <= g->n_hi &&
            K >= g->k_lo && K <= g->k_hi)
            return g;
    }
    return &t->gemm[t->n_gemm - 1];
}
