/*
 * test_moe_cuda_compile.c - every specialization family of the CUDA fused
 * MoE compiles with NVRTC for sm_80 and sm_90 without a warning (needs no
 * GPU; CI runs it). Covered:
 *   - every row of the tiling table of every built-in backend spec that has
 *     one, with every block_m the row serves, for both GEMMs (w13 with the
 *     activation fused, w2), plus each row with block_k halved (the runtime
 *     halves block_k until it divides K);
 *   - every value of every other parameter: 4/8 bits, zero points, act
 *     order, grouped/channelwise scales, both scale permutations, F16/BF16
 *     activations, scales and biases, the five gated activations (a list of
 *     quantization variants, cycled through the tiles and also each
 *     compiled with one fixed tile);
 *   - GEMM 1 adding its own split-K sums (split_sums) on every mma.sync
 *     w13 row's full-K tile; the CTAs routing their own row block
 *     (self_route) on every other mma.sync unit without act order;
 *   - the routing/gather/finalize kernels for both activation dtypes, in
 *     one unit and in the runtime's pieces (gen/moe_cuda.h: each piece
 *     exports its kernels and no other);
 *   - the one-kernel decode layer (moe_decode.cu): every value of each of
 *     its configuration's fields across four units.
 * Each image must hold a CUBIN and PTX naming the kernel, and an empty
 * NVRTC log. The cold compile time of each unit is printed (the aim is
 * 0.5 s a unit; this machine's figure is reported, not asserted).
 * Compiling a unit's kernels in parallel threads (--split-compile, as the
 * runtime does for units of several kernels) leaves every kernel's code
 * as the unit compiled in one piece gives it: byte for byte, or within 1%
 * of its size where ptxas numbers a kernel's registers differently (a
 * kernel without launch bounds). So does compiling the routing kernels in
 * pieces rather than in one unit, by the same measure.
 * Also checks the generator's refusals (bad configurations) and that the
 * names spell out the parameters. A text compiles once for each kernel
 * count and architecture: the routing units' images also serve the
 * exports check and the split and pieces comparisons (kept_image). Skips
 * (exit 77) without NVRTC.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "gen/moe_cuda.h"
#include "runtime/cuda/cuda.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct qvariant {
    int bits;
    bool zp, act_order, grouped;
    w16_moe_scales_t scales;
    wna16_dtype_t act, scale, bias;
    wna16_activation_t activation;
    /* groups smaller than a 64-row stage (no GROUP_STAGES) */
    bool small_groups;
} qvariant_t;

#define F16 WNA16_DTYPE_F16
#define BF16 WNA16_DTYPE_BF16

static const qvariant_t VARIANTS[] = {
    {4, false, false, true, W16_MOE_SCALES_T64, F16, F16, F16, WNA16_ACT_SILU},
    {4, true, false, true, W16_MOE_SCALES_T32, BF16, BF16, BF16,
     WNA16_ACT_GELU, true},
    {4, false, true, true, W16_MOE_SCALES_T64, BF16, F16, BF16,
     WNA16_ACT_GELU_TANH},
    {4, true, true, true, W16_MOE_SCALES_T64, F16, BF16, F16,
     WNA16_ACT_SWIGLUOAI},
    {8, false, false, false, W16_MOE_SCALES_T32, BF16, BF16, F16,
     WNA16_ACT_SWIGLUSTEP},
    {8, false, false, true, W16_MOE_SCALES_T64, F16, F16, BF16,
     WNA16_ACT_SILU},
    {8, false, true, true, W16_MOE_SCALES_T64, BF16, BF16, BF16,
     WNA16_ACT_SILU},
    {4, true, false, false, W16_MOE_SCALES_T32, F16, F16, F16,
     WNA16_ACT_GELU},
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int n_units;
static double worst_s, total_s;

/* Images kept for a check that needs the same compile again: one compile
 * a (text, kernel count, architecture), the image shared (the routing
 * units: their own check, the exports check, the split and pieces
 * comparisons). Compiles that nothing asks for twice (the GEMM units) are
 * freed at once instead: hundreds of images would not fit. */
typedef struct kept {
    char *src;
    int n_kernels, cc_major, cc_minor;
    w16_cuda_image_t img;
} kept_t;
static kept_t **kept; /* each its own allocation: the images stay put */
static int n_kept, cap_kept, n_reused;

/* Compiles `src` (n_kernels kernels, the first `name`) for
 * sm_<major><minor>, timing it; a unit compiled once counts in the
 * figures printed at the end. */
static wna16_status_t timed_compile(wna16_context_t *ctx, const char *src,
                                    const char *name, int n_kernels,
                                    int major, int minor,
                                    w16_cuda_image_t *img, wna16_error_t *err)
{
    double t0 = now_s();
    wna16_status_t st =
        n_kernels == 1
            ? w16_nvrtc_compile(ctx, src, name, major, minor, img, err)
            : w16_nvrtc_compile_unit(ctx, src, name, n_kernels, major, minor,
                                     img, err);
    double dt = now_s() - t0;
    if (st == WNA16_OK && n_kernels == 1) {
        n_units++;
        total_s += dt;
        if (dt > worst_s)
            worst_s = dt;
        printf("  sm_%d%d %6.3f s  %s\n", major, minor, dt, name);
    }
    return st;
}

/* The image of `src` compiled as a unit of n_kernels kernels for
 * sm_<major><minor>: compiled the first time, the same image after (NULL,
 * the check failed, when it does not compile). */
static const w16_cuda_image_t *kept_image(wna16_context_t *ctx,
                                          const char *src, const char *name,
                                          const char *what, int n_kernels,
                                          int major, int minor)
{
    for (int i = 0; i < n_kept; i++)
        if (kept[i]->n_kernels == n_kernels && kept[i]->cc_major == major &&
            kept[i]->cc_minor == minor && strcmp(kept[i]->src, src) == 0) {
            n_reused++;
            return &kept[i]->img;
        }
    if (n_kept == cap_kept) {
        int cap = cap_kept ? 2 * cap_kept : 32;
        kept_t **k = realloc(kept, (size_t)cap * sizeof *k);
        TU_CHECK(k != NULL);
        if (!k)
            return NULL;
        kept = k;
        cap_kept = cap;
    }
    kept_t *k = calloc(1, sizeof *k);
    TU_CHECK(k != NULL);
    if (!k)
        return NULL;
    wna16_error_t err;
    wna16_status_t st = timed_compile(ctx, src, name, n_kernels, major, minor,
                                      &k->img, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s (%s, %d kernels) for sm_%d%d: %s", name,
                 what, n_kernels, major, minor, err.message);
    k->src = st == WNA16_OK ? strdup(src) : NULL;
    if (!k->src) {
        w16_cuda_image_free(&k->img);
        free(k);
        return NULL;
    }
    k->n_kernels = n_kernels;
    k->cc_major = major;
    k->cc_minor = minor;
    kept[n_kept++] = k;
    return &k->img;
}

static void free_kept(void)
{
    for (int i = 0; i < n_kept; i++) {
        free(kept[i]->src);
        w16_cuda_image_free(&kept[i]->img);
        free(kept[i]);
    }
    free(kept);
    kept = NULL;
    n_kept = cap_kept = 0;
}

/* An image of unit `name` holds a CUBIN and PTX naming the kernel, and
 * NVRTC said nothing. */
static void check_image(const w16_cuda_image_t *img, const char *name,
                        int major, int minor)
{
    TU_CHECK_MSG(img->log == NULL, "%s for sm_%d%d: NVRTC warned:\n%s", name,
                 major, minor, img->log ? img->log : "");
    TU_CHECK(img->cubin && img->cubin_size > 0 && img->ptx);
    if (img->ptx) {
        char entry[200];
        snprintf(entry, sizeof entry, ".entry %s", name);
        TU_CHECK_MSG(strstr(img->ptx, entry) != NULL, "no %s", entry);
    }
}

static const int ARCHS[][2] = {{8, 0}, {9, 0}};

/* Compiles one unit for sm_80 and sm_90 (only sm_90, as sm_90a, for the
 * wgmma template) and checks the images, which are not kept (the GEMM
 * units). */
static void compile_unit_on(wna16_context_t *ctx, const char *src,
                            const char *name, const char *what,
                            bool hopper_only)
{
    for (size_t a = hopper_only ? 1 : 0; a < W16_ARRAY_LEN(ARCHS); a++) {
        wna16_error_t err;
        w16_cuda_image_t img;
        wna16_status_t st = timed_compile(ctx, src, name, 1, ARCHS[a][0],
                                          ARCHS[a][1], &img, &err);
        TU_CHECK_MSG(st == WNA16_OK, "%s (%s) for sm_%d%d: %s", name, what,
                     ARCHS[a][0], ARCHS[a][1], err.message);
        if (st != WNA16_OK)
            continue;
        check_image(&img, name, ARCHS[a][0], ARCHS[a][1]);
        w16_cuda_image_free(&img);
    }
}

/* Compiles one unit for sm_80 and sm_90 and checks the images, which are
 * kept (kept_image) for later checks of the same text: the sm_90 image is
 * returned (NULL if it did not compile). */
static const w16_cuda_image_t *compile_unit(wna16_context_t *ctx,
                                            const char *src, const char *name,
                                            const char *what)
{
    const w16_cuda_image_t *img = NULL;
    for (size_t a = 0; a < W16_ARRAY_LEN(ARCHS); a++) {
        img = kept_image(ctx, src, name, what, 1, ARCHS[a][0], ARCHS[a][1]);
        if (img)
            check_image(img, name, ARCHS[a][0], ARCHS[a][1]);
    }
    return img;
}

static void compile_gemm(wna16_context_t *ctx, const w16_moe_gemm_cfg_t *c,
                         const char *what)
{
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    wna16_error_t err;
    char name[160];
    w16_moe_gemm_name(c, name, sizeof name);
    TU_OK(w16_moe_gemm_source(c, &b, &err), &err);
    TU_CHECK(!b.failed);
    if (!b.failed && b.data && tu_failures == 0)
        compile_unit_on(ctx, b.data, name, what, c->wgmma);
    w16_buf_free(&b);
}

static void apply(w16_moe_gemm_cfg_t *c, const qvariant_t *v)
{
    c->bits = v->bits;
    c->zp = v->zp;
    c->act_order = v->act_order;
    /* the group size is a constant of an mma.sync unit: groups of 32
     * (several a stage, the per-step checks) or 128 (whole stages) */
    w16_moe_cfg_groups(c, v->grouped ? 2 : 1, v->small_groups ? 32 : 128);
    c->scales = v->scales;
    c->act_dtype = v->act;
    c->scale_dtype = v->scale;
    c->bias_dtype = v->bias;
    c->activation = c->gemm == WNA16_GEMM_W13 ? v->activation
                                              : WNA16_ACT_INVALID;
}

static void test_tiling_rows(wna16_context_t *ctx)
{
    size_t vi = 0;
    for (size_t s = 0; s < wna16_spec_count(ctx); s++) {
        const wna16_spec_t *spec = wna16_spec_at(ctx, s);
        const w16_tiling_t *t = spec->tiling;
        if (!t)
            continue;
        printf("%s: %d block_m rows, %d GEMM rows\n", spec->name, t->n_bm,
               t->n_gemm);
        for (int r = 0; r < t->n_gemm; r++) {
            const w16_tile_rule_t *row = &t->gemm[r];
            for (int b = 0; b < t->n_bm; b++) {
                int bm = t->bm[b].block_m;
                bool dup = false; /* one compile per block_m value */
                for (int b2 = 0; b2 < b; b2++)
                    dup |= t->bm[b2].block_m == bm &&
                           t->bm[b2].wgmma == t->bm[b].wgmma;
                /* an earlier row on block_m alone takes all of them */
                for (int r2 = 0; r2 < r; r2++) {
                    const w16_tile_rule_t *e = &t->gemm[r2];
                    dup |= e->wgmma == row->wgmma && e->gemm < 0 &&
                           bm >= e->bm_lo && bm <= e->bm_hi &&
                           e->n_lo == 0 && e->n_hi == INT64_MAX &&
                           e->k_lo == 0 && e->k_hi == INT64_MAX;
                }
                if (dup || bm < row->bm_lo || bm > row->bm_hi ||
                    t->bm[b].wgmma != row->wgmma)
                    continue;
                for (int g = 0; g < 2; g++) {
                    if (row->gemm >= 0 && row->gemm != g)
                        continue;
                    for (int halve = 0; halve < 2; halve++) {
                        if (halve && row->block_k == 64)
                            continue;
                        w16_moe_gemm_cfg_t c;
                        memset(&c, 0, sizeof c);
                        c.gemm = (wna16_gemm_t)g;
                        c.block_m = bm;
                        c.block_n = row->block_n;
                        c.block_k = halve ? 64 : row->block_k;
                        c.warps_n = row->warps_n;
                        c.warps_k = row->warps_k < c.block_k / 16
                                        ? row->warps_k : c.block_k / 16;
                        c.stages = row->stages;
                        c.min_ctas = row->min_ctas;
                        c.wgmma = row->wgmma;
                        c.ws = row->wgmma && row->warp_specialized;
                        c.acc_scales = c.ws && row->scales_on_acc;
                        c.wgmma_groups = c.ws ? row->wgmma_groups : 1;
                        c.split_codes = c.ws && row->split_codes;
                        c.tail_m = c.ws ? row->tail_m : 0;
                        c.persistent = c.ws && row->persistent;
                        /* GEMM 1 adding its own split-K sums (the
                         * runtime's choice at small M): the full-K tile
                         * of every mma.sync w13 row */
                        c.split_sums = !c.wgmma && g == 0 && !halve;
                        /* act-order never reaches a wgmma row */
                        while (row->wgmma &&
                               VARIANTS[vi % W16_ARRAY_LEN(VARIANTS)].act_order)
                            vi++;
                        apply(&c, &VARIANTS[vi++ % W16_ARRAY_LEN(VARIANTS)]);
                        /* the CTAs routing their own row block (the
                         * runtime's choice at most 32 slots, never with
                         * act order): every other mma.sync unit */
                        c.self_route = !c.wgmma && !c.act_order && vi % 2;
                        compile_gemm(ctx, &c, row->json_path);
                    }
                }
            }
        }
        break; /* the Marlin specs share one table; the next loop checks */
    }
}

/* batched_marlin and marlin read the same layout: their tables agree, so
 * one compiled family serves both (checked, not assumed). */
static void test_tables_agree(wna16_context_t *ctx)
{
    const wna16_spec_t *a = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "marlin");
    const wna16_spec_t *b = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                            "batched_marlin");
    TU_CHECK(a && b && a->tiling && b->tiling);
    if (!a || !b || !a->tiling || !b->tiling)
        return;
    TU_CHECK(a->tiling->n_bm == b->tiling->n_bm &&
             a->tiling->n_gemm == b->tiling->n_gemm);
    for (int i = 0; i < a->tiling->n_bm && i < b->tiling->n_bm; i++)
        TU_CHECK(a->tiling->bm[i].block_m == b->tiling->bm[i].block_m &&
                 a->tiling->bm[i].wgmma == b->tiling->bm[i].wgmma &&
                 a->tiling->bm[i].tpe_lo == b->tiling->bm[i].tpe_lo &&
                 a->tiling->bm[i].tpe_hi == b->tiling->bm[i].tpe_hi);
    for (int i = 0; i < a->tiling->n_gemm && i < b->tiling->n_gemm; i++) {
        const w16_tile_rule_t *x = &a->tiling->gemm[i], *y = &b->tiling->gemm[i];
        TU_CHECK(x->gemm == y->gemm && x->bm_lo == y->bm_lo &&
                 x->bm_hi == y->bm_hi && x->n_lo == y->n_lo &&
                 x->n_hi == y->n_hi && x->k_lo == y->k_lo &&
                 x->k_hi == y->k_hi && x->block_n == y->block_n &&
                 x->block_k == y->block_k && x->warps_n == y->warps_n &&
                 x->warps_k == y->warps_k && x->stages == y->stages &&
                 x->max_split_k == y->max_split_k &&
                 x->ctas_per_sm == y->ctas_per_sm &&
                 x->min_ctas == y->min_ctas && x->wgmma == y->wgmma &&
                 x->warp_specialized == y->warp_specialized &&
                 x->scales_on_acc == y->scales_on_acc &&
                 x->wgmma_groups == y->wgmma_groups &&
                 x->split_codes == y->split_codes && x->tail_m == y->tail_m &&
                 x->persistent == y->persistent);
    }
}

/* Every quantization variant with three fixed tiles, both GEMMs: one of
 * block_m 32 with two K warps, then block_m 8 and 24 (the swapped mma:
 * the codes as the A operand, one and three n8 blocks of rows) in the
 * built-in table's shape, at launch bounds for four and three CTAs an
 * SM. */
static void test_variants(wna16_context_t *ctx)
{
    static const struct {
        int bm, bn, bk, wn, wk, min_ctas;
        const char *what;
    } SHAPES[] = {
        {32, 128, 64, 2, 2, 0, "variant"},
        {8, 256, 128, 4, 1, 4, "variant (block_m 8)"},
        {24, 256, 128, 4, 1, 3, "variant (block_m 24)"},
    };
    for (size_t v = 0; v < W16_ARRAY_LEN(VARIANTS); v++)
        for (int g = 0; g < 2; g++)
            for (size_t h = 0; h < W16_ARRAY_LEN(SHAPES); h++) {
                w16_moe_gemm_cfg_t c;
                memset(&c, 0, sizeof c);
                c.gemm = (wna16_gemm_t)g;
                c.block_m = SHAPES[h].bm;
                c.block_n = SHAPES[h].bn;
                c.block_k = SHAPES[h].bk;
                c.warps_n = SHAPES[h].wn;
                c.warps_k = SHAPES[h].wk;
                c.stages = 3;
                c.min_ctas = SHAPES[h].min_ctas;
                apply(&c, &VARIANTS[v]);
                compile_gemm(ctx, &c, SHAPES[h].what);
            }
}

/* The same variants (but act order) on the wgmma template, sm_90a: the
 * plain pipeline (one warpgroup), then the warp-specialized one (two
 * consumer warpgroups and the producer), then that at block_m 256 (one
 * m64 slice a warpgroup), then the warp-specialized pipeline with the
 * group scales on the accumulators and split codes, with one and two
 * wgmma groups in flight, then two groups in flight alone; then the small
 * products (block_m 16, 32, 48: m64n16k16 to m64n48k16) on the plain
 * pipeline and on the warp-specialized one with 8 stages; then four
 * consumer warpgroups of one m64 slice (warps_n 16); then tail rows (32
 * beside block_m 128, 16 beside 64: the main loop compiled with and
 * without the tail's products); then persistent CTAs (block_m 128 with
 * 32 tail rows: a loop over items for each kind; block_m 64 without). */
static void test_variants_wgmma(wna16_context_t *ctx)
{
    for (int ws = 0; ws < 11; ws++)
        for (size_t v = 0; v < W16_ARRAY_LEN(VARIANTS); v++) {
            if (VARIANTS[v].act_order)
                continue;
            for (int g = 0; g < 2; g++) {
                bool small = ws >= 6, plain = ws == 0 || ws == 6;
                w16_moe_gemm_cfg_t c;
                memset(&c, 0, sizeof c);
                c.gemm = (wna16_gemm_t)g;
                c.block_m = small ? 16 * (1 + (int)(v + (size_t)g) % 3)
                            : ws == 2 ? 256 : v % 2 ? 64 : 128;
                c.block_n = plain || ws == 2 ? 128 : 256;
                c.block_k = 64;
                c.warps_n = plain ? 4 : ws == 8 ? 16 : 8;
                c.warps_k = 1;
                c.stages = ws == 7 ? 8 : ws ? 5 : 3;
                c.wgmma = true;
                c.ws = !plain;
                /* 3: scales on the accumulators and split codes (4-bit
                 * only, others ignore it); 4: and two groups in flight;
                 * 5: two groups in flight alone */
                c.acc_scales = ws == 3 || ws == 4;
                c.wgmma_groups = ws == 4 || ws == 5 ? 2 : 1;
                c.split_codes = ws == 3 || ws == 4;
                c.tail_m = ws == 9 ? (v % 2 ? 16 : 32)
                           : ws == 10 ? (v % 2 ? 0 : 32) : 0;
                c.persistent = ws == 10;
                apply(&c, &VARIANTS[v]);
                compile_gemm(ctx, &c, c.ws ? "variant (wgmma, "
                                             "warp-specialized)"
                                           : "variant (wgmma)");
            }
        }
}

static void test_aux(wna16_context_t *ctx)
{
    const wna16_dtype_t dts[] = {F16, BF16};
    for (size_t i = 0; i < 2; i++)
        for (int piece = 0; piece <= W16_AUX_WHOLE; piece++) {
            w16_buf_t b;
            w16_buf_init(&b, ctx);
            wna16_error_t err;
            int first, n;
            w16_moe_aux_range(piece, &first, &n);
            TU_OK(w16_moe_aux_source(dts[i], piece, &b, &err), &err);
            /* compile_unit checks the first entry; the module exports the
             * piece's kernels, and no other (its sm_90 image) */
            if (!b.data || b.failed)
                continue;
            const w16_cuda_image_t *img =
                compile_unit(ctx, b.data, w16_moe_aux_names[first],
                             w16_moe_aux_unit(dts[i], piece));
            for (int k = 0; img && k < W16_AUX_COUNT; k++) {
                char entry[96];
                snprintf(entry, sizeof entry, ".entry %s(",
                         w16_moe_aux_names[k]);
                bool want = k >= first && k < first + n;
                bool has = img->ptx && strstr(img->ptx, entry);
                TU_CHECK_MSG(want == has, "%s: %s %s",
                             w16_moe_aux_unit(dts[i], piece),
                             has ? "unexpected" : "no", entry);
            }
            w16_buf_free(&b);
        }
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    wna16_error_t err;
    TU_CHECK(w16_moe_aux_source(BF16, W16_AUX_WHOLE + 1, &b, &err) ==
             WNA16_EINVAL);
    w16_buf_free(&b);
}

/* The section of a 64-bit little-endian ELF named `name` (NULL if none). */
static const unsigned char *elf_section(const unsigned char *e, size_t n,
                                        const char *name, size_t *size)
{
    uint64_t shoff;
    uint16_t shentsize, shnum, shstrndx;
    if (n < 64 || memcmp(e, "\177ELF", 4) != 0 || e[4] != 2)
        return NULL;
    memcpy(&shoff, e + 0x28, 8);
    memcpy(&shentsize, e + 0x3a, 2);
    memcpy(&shnum, e + 0x3c, 2);
    memcpy(&shstrndx, e + 0x3e, 2);
    if (shentsize < 64 || shstrndx >= shnum ||
        shoff + (uint64_t)shnum * shentsize > n)
        return NULL;
    uint64_t stroff;
    memcpy(&stroff, e + shoff + (uint64_t)shstrndx * shentsize + 0x18, 8);
    for (uint16_t i = 0; i < shnum; i++) {
        const unsigned char *h = e + shoff + (uint64_t)i * shentsize;
        uint32_t nm;
        uint64_t off, sz;
        memcpy(&nm, h, 4);
        memcpy(&off, h + 0x18, 8);
        memcpy(&sz, h + 0x20, 8);
        if (stroff + nm >= n || off + sz > n)
            return NULL;
        const char *sn = (const char *)e + stroff + nm;
        if (memchr(sn, 0, n - (stroff + nm)) && strcmp(sn, name) == 0) {
            *size = sz;
            return e + off;
        }
    }
    return NULL;
}

/* Whether two CUBINs hold the same code for kernel `fn`: its .text
 * sections the same bytes, or within 1% of each other's size (see
 * check_same_code). */
static void check_same_section(const w16_cuda_image_t *x,
                               const w16_cuda_image_t *y, const char *fn,
                               const char *what)
{
    char sec[200];
    snprintf(sec, sizeof sec, ".text.%s", fn);
    size_t na = 0, nb = 0;
    const unsigned char *a = elf_section(x->cubin, x->cubin_size, sec, &na);
    const unsigned char *b = elf_section(y->cubin, y->cubin_size, sec, &nb);
    TU_CHECK_MSG(a && b && na > 0, "%s: no section %s", what, sec);
    bool same = a && b && na == nb && memcmp(a, b, na) == 0;
    size_t diff = na > nb ? na - nb : nb - na;
    TU_CHECK_MSG(a && b && (same || diff * 100 <= na),
                 "%s: %s differs (%zu against %zu bytes)", what, sec, na, nb);
}

/* Compiling a unit's kernels in parallel threads (w16_nvrtc_compile_unit
 * with several kernels: --split-compile) must leave every kernel's code as
 * good as it is: the .text section of each kernel in the CUBIN is compared
 * with the unit compiled as one piece. ptxas may then number the registers
 * of a kernel without launch bounds differently (the same instructions on
 * other registers, a few moves more or less), so the sections must be the
 * same bytes or within 1% of each other's size. */
static void check_same_code(wna16_context_t *ctx, const char *src,
                            const char *unit, const char *const *names,
                            int n_names)
{
    const w16_cuda_image_t *one, *split;
    one = kept_image(ctx, src, names[0], unit, 1, 9, 0);
    split = kept_image(ctx, src, names[0], unit, n_names, 9, 0);
    char what[240];
    snprintf(what, sizeof what, "%s, its compile split", unit);
    for (int i = 0; i < n_names && one && split && one->cubin && split->cubin;
         i++)
        check_same_section(one, split, names[i], what);
}

static void test_split_same_code(wna16_context_t *ctx)
{
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    wna16_error_t err;
    TU_OK(w16_moe_aux_source(WNA16_DTYPE_BF16, W16_AUX_WHOLE, &b, &err),
          &err);
    if (!b.failed && b.data)
        check_same_code(ctx, b.data, "aux", w16_moe_aux_names, W16_AUX_COUNT);
    /* GEMM 1 and its split-K reduce (GEMM 2's unit is one kernel) */
    w16_moe_gemm_cfg_t c;
    memset(&c, 0, sizeof c);
    c.gemm = WNA16_GEMM_W13;
    c.block_m = 16;
    c.block_n = 256;
    c.block_k = 128;
    c.warps_n = 4;
    c.warps_k = 2;
    c.stages = 4;
    apply(&c, &VARIANTS[0]);
    char name[160], rname[176];
    w16_moe_gemm_name(&c, name, sizeof name);
    snprintf(rname, sizeof rname, "%s_reduce", name);
    const char *names[2] = {name, rname};
    w16_buf_reset(&b);
    TU_OK(w16_moe_gemm_source(&c, &b, &err), &err);
    if (!b.failed && b.data)
        check_same_code(ctx, b.data, name, names, 2);
    w16_buf_free(&b);
}

/* The runtime's pieces of the routing kernels (each compiled as the
 * runtime does) give every kernel the code of the whole unit compiled in
 * one piece. */
static void test_aux_pieces_same_code(wna16_context_t *ctx)
{
    const wna16_dtype_t dts[] = {F16, BF16};
    for (size_t i = 0; i < 2; i++) {
        w16_buf_t b;
        w16_buf_init(&b, ctx);
        wna16_error_t err;
        const w16_cuda_image_t *whole = NULL;
        int first, n;
        w16_moe_aux_range(W16_AUX_WHOLE, &first, &n);
        TU_OK(w16_moe_aux_source(dts[i], W16_AUX_WHOLE, &b, &err), &err);
        if (!b.failed && b.data)
            whole = kept_image(ctx, b.data, w16_moe_aux_names[first],
                               w16_moe_aux_unit(dts[i], W16_AUX_WHOLE), 1, 9,
                               0);
        if (!whole || !whole->cubin) {
            TU_CHECK_MSG(false, "the whole routing unit does not compile");
            w16_buf_free(&b);
            continue;
        }
        for (int piece = 0; piece < W16_AUX_PIECES; piece++) {
            w16_moe_aux_range(piece, &first, &n);
            const char *unit = w16_moe_aux_unit(dts[i], piece);
            w16_buf_reset(&b);
            TU_OK(w16_moe_aux_source(dts[i], piece, &b, &err), &err);
            if (b.failed || !b.data)
                continue;
            const w16_cuda_image_t *img =
                kept_image(ctx, b.data, w16_moe_aux_names[first], unit, n, 9,
                           0);
            if (!img || !img->cubin)
                continue;
            for (int k = first; k < first + n; k++)
                check_same_section(whole, img, w16_moe_aux_names[k], unit);
        }
        w16_buf_free(&b);
    }
}

/* The template's static_asserts are refusals with reasons here. */
static void test_refusals(wna16_context_t *ctx)
{
    w16_moe_gemm_cfg_t good;
    memset(&good, 0, sizeof good);
    good.gemm = WNA16_GEMM_W13;
    good.block_m = 16;
    good.block_n = 128;
    good.block_k = 64;
    good.warps_n = 2;
    good.warps_k = 2;
    good.stages = 3;
    apply(&good, &VARIANTS[0]);
    w16_moe_gemm_cfg_t c;
    wna16_error_t err;
    w16_buf_t b;
    w16_buf_init(&b, ctx);
#define EXPECT_REFUSED(stmt, needle)                                        \
    do {                                                                    \
        c = good;                                                           \
        stmt;                                                               \
        w16_buf_reset(&b);                                                  \
        wna16_status_t st_ = w16_moe_gemm_source(&c, &b, &err);             \
        TU_CHECK_MSG(st_ == WNA16_EINVAL && strstr(err.message, needle),    \
                     "%s: %s", #stmt, err.message);                         \
    } while (0)
    EXPECT_REFUSED(c.bits = 3, "bits");
    EXPECT_REFUSED((c.bits = 8, c.zp = true), "zero points");
    EXPECT_REFUSED(c.block_m = 40, "block_m");
    EXPECT_REFUSED(c.block_n = 96, "block_n");
    EXPECT_REFUSED(c.block_k = 32, "block_k");
    EXPECT_REFUSED(c.warps_n = 3, "warps_n");
    EXPECT_REFUSED(c.warps_k = 8, "warps_k");
    EXPECT_REFUSED((c.block_n = 64, c.warps_n = 1), "gate or the up half");
    EXPECT_REFUSED((c.block_m = 64, c.block_n = 256, c.warps_n = 2),
                   "accumulator");
    EXPECT_REFUSED(c.stages = 1, "stages");
    /* four wgmma warpgroups (warps_n 16): warp-specialized, block_m <= 128 */
    EXPECT_REFUSED((c.wgmma = true, c.block_m = 128, c.block_n = 256,
                    c.block_k = 64, c.warps_n = 16, c.warps_k = 1),
                   "warp-specialized");
    EXPECT_REFUSED((c.wgmma = c.ws = true, c.block_m = 256, c.block_n = 256,
                    c.block_k = 64, c.warps_n = 16, c.warps_k = 1),
                   "block_m 128 at most");
    EXPECT_REFUSED((c.wgmma = c.ws = c.split_codes = true, c.block_m = 128,
                    c.block_n = 256, c.block_k = 64, c.warps_n = 16,
                    c.warps_k = 1),
                   "split codes");
    /* tail rows: 16 or 32, two warp-specialized consumer warpgroups */
    EXPECT_REFUSED((c.wgmma = c.ws = true, c.block_m = 128, c.block_n = 256,
                    c.block_k = 64, c.warps_n = 16, c.warps_k = 1,
                    c.tail_m = 32),
                   "tail rows");
    EXPECT_REFUSED((c.wgmma = c.ws = true, c.block_m = 128, c.block_n = 256,
                    c.block_k = 64, c.warps_n = 8, c.warps_k = 1,
                    c.tail_m = 24),
                   "tail rows");
    /* persistent CTAs: warp-specialized, codes not split */
    EXPECT_REFUSED((c.wgmma = true, c.block_m = 128, c.block_n = 128,
                    c.block_k = 64, c.warps_n = 4, c.warps_k = 1,
                    c.persistent = true),
                   "persistent");
    EXPECT_REFUSED((c.wgmma = c.ws = c.split_codes = c.persistent = true,
                    c.block_m = 128, c.block_n = 256, c.block_k = 64,
                    c.warps_n = 8, c.warps_k = 1),
                   "persistent");
    EXPECT_REFUSED(c.activation = WNA16_ACT_SILU_NO_MUL, "gated activation");
    EXPECT_REFUSED(c.act_dtype = WNA16_DTYPE_F32, "dtypes");
    EXPECT_REFUSED(c.group_size = 0, "group_size");
    EXPECT_REFUSED(c.group_size = 96, "group_size");
#undef EXPECT_REFUSED
    TU_OK(w16_moe_gemm_source(&good, &b, &err), &err);
    w16_buf_free(&b);

    char name[160];
    w16_moe_gemm_name(&good, name, sizeof name);
    TU_CHECK_MSG(strcmp(name, "w16_moe_marlin_w13_silu_f16_b4_sym_g128_t64_sf16_"
                        "bf16_m16n128k64_w2x2_p3") == 0, "%s", name);
}

/* The one-kernel decode layer (templates/moe_decode.cu): every value of
 * every field across four units (4/8 bits, zero points, grouped and
 * channelwise, both scale permutations of each operand, F16/BF16
 * activations, scales and biases, four gated activations), its refusals
 * and its name. */
static void test_decode(wna16_context_t *ctx)
{
    static const w16_moe_decode_cfg_t cfgs[] = {
        {4, false, true, 128, {W16_MOE_SCALES_T64, W16_MOE_SCALES_T64},
         BF16, BF16, BF16, WNA16_ACT_SILU},
        {4, true, true, 32, {W16_MOE_SCALES_T64, W16_MOE_SCALES_T32}, F16,
         F16, BF16, WNA16_ACT_GELU},
        {8, false, false, 0, {W16_MOE_SCALES_T32, W16_MOE_SCALES_T32}, F16,
         BF16, F16, WNA16_ACT_SWIGLUOAI},
        {8, false, true, 64, {W16_MOE_SCALES_T32, W16_MOE_SCALES_T64}, BF16,
         F16, F16, WNA16_ACT_SWIGLUSTEP},
    };
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    wna16_error_t err;
    char name[160];
    for (size_t i = 0; i < W16_ARRAY_LEN(cfgs); i++) {
        w16_buf_reset(&b);
        w16_moe_decode_name(&cfgs[i], name, sizeof name);
        TU_OK(w16_moe_decode_source(&cfgs[i], &b, &err), &err);
        TU_CHECK(!b.failed);
        if (!b.failed && b.data && tu_failures == 0)
            compile_unit_on(ctx, b.data, name, "decode", false);
    }
    w16_moe_decode_cfg_t c;
#define EXPECT_REFUSED(stmt, needle)                                        \
    do {                                                                    \
        c = cfgs[0];                                                        \
        stmt;                                                               \
        w16_buf_reset(&b);                                                  \
        wna16_status_t st_ = w16_moe_decode_source(&c, &b, &err);           \
        TU_CHECK_MSG(st_ == WNA16_EINVAL && strstr(err.message, needle),    \
                     "%s: %s", #stmt, err.message);                         \
    } while (0)
    EXPECT_REFUSED(c.bits = 3, "bits");
    EXPECT_REFUSED((c.bits = 8, c.zp = true), "zero points");
    EXPECT_REFUSED(c.group_size = 48, "group_size");
    EXPECT_REFUSED(c.activation = WNA16_ACT_SILU_NO_MUL, "activation");
    EXPECT_REFUSED(c.act_dtype = WNA16_DTYPE_F32, "dtypes");
#undef EXPECT_REFUSED
    w16_buf_free(&b);
    w16_moe_decode_name(&cfgs[1], name, sizeof name);
    TU_CHECK_MSG(strcmp(name, "w16_moe_decode_gelu_f16_b4_zp_g32_t6432_sf16_"
                        "bf16") == 0, "%s", name);
}

int main(void)
{
    wna16_error_t err;
    if (!w16_nvrtc_available(NULL, &err))
        tu_skip(err.message);
    wna16_context_t *ctx = tu_context();
    test_refusals(ctx);
    test_tables_agree(ctx);
    test_aux(ctx);
    test_split_same_code(ctx);
    test_aux_pieces_same_code(ctx);
    test_tiling_rows(ctx);
    test_variants(ctx);
    test_variants_wgmma(ctx);
    test_decode(ctx);
    if (n_units)
        printf("%d units compiled: %.3f s each on average, %.3f s the "
               "slowest (%s); %d compiles served again from a kept image\n",
               n_units, total_s / n_units, worst_s, w16_nvrtc_version(),
               n_reused);
    free_kept();
    wna16_context_destroy(ctx);
    return tu_finish("test_moe_cuda_compile");
}
