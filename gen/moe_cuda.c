/*
 * moe_cuda.c - the CUDA fused-MoE generator (see moe_cuda.h): the layout
 * contract between a backend spec and templates/moe_marlin_gemm.cu (and
 * moe_wgmma_gemm.cu, which reads the same addresses), tile
 * selection from the spec's tiling table, and the translation units (a
 * prelude of typed constants written through w16_buf, then the template's
 * text unchanged).
 */
#include "gen/moe_cuda.h"
#include "gen/templates.h"

#include <stdio.h>
#include <string.h>

/* ---- what the template reads (written from the mma fragments) ----------- */

/* Where the template reads code (k, n) of one expert: qweight[e][i1][i2],
 * bits [bit, bit + BITS). Lane 4*g + q of a warp holds, for n8 block j of
 * a 16x64 tile, the B fragment of column 8j + g: b0 = rows 2q, 2q+1 and
 * b1 = rows 2q+8, 2q+9 (the even row in the low half). 4-bit: the lane's
 * word j/2 of the tile, nibble pair p = 2(j%2) + (row >= 8), nibble p for
 * the even row and p+4 for the odd one. 8-bit: word j, byte (row >= 8) +
 * 2 * (row odd). */
static void code_loc(int bits, int64_t n, int64_t k, int64_t *i1, int64_t *i2,
                     int64_t *bit)
{
    int kk = (int)(k % 16), c = (int)(n % 64), j = c / 8, g = c % 8;
    int lane = 4 * g + (kk % 8) / 2, odd = kk % 2, b1 = kk >= 8;
    *i1 = k / 16;
    if (bits == 4) {
        int p = 2 * (j % 2) + b1;
        *i2 = (n / 64) * 128 + lane * 4 + j / 2;
        *bit = 4 * (odd ? p + 4 : p);
    } else {
        *i2 = (n / 64) * 256 + lane * 8 + j;
        *bit = 8 * (b1 + 2 * odd);
    }
}

/* The template's scale_pos and bias_pos (templates/moe_marlin_gemm.cu). */
static int64_t scale_pos(w16_moe_scales_t s, int64_t n)
{
    if (s == W16_MOE_SCALES_T64)
        return 64 * (n / 64) + 8 * (n % 8) + (n % 64) / 8;
    return 32 * (n / 32) + 8 * ((n % 8) / 2) + 2 * ((n % 32) / 8) + n % 2;
}

static int64_t bias_pos(int64_t n)
{
    return scale_pos(W16_MOE_SCALES_T32, n);
}

/* The template's zero_at: word 8(n/64) + n%8, nibble (j%2)*4 + j/2 of
 * block j = (n%64)/8. */
static void zero_loc(int64_t n, int64_t *word, int64_t *bit)
{
    int j = (int)((n % 64) / 8);
    *word = 8 * (n / 64) + n % 8;
    *bit = 4 * ((j % 2) * 4 + j / 2);
}

/* ---- the contract -------------------------------------------------------- */

typedef struct contract {
    const wna16_spec_t *spec;
    const char *op;      /* "w13" / "w2" */
    int64_t *vars;
    w16_moe_operand_t *out;
    wna16_error_t *err;
} contract_t;

static wna16_status_t refuse(contract_t *c, const w16_layout_t *l,
                             const char *fmt, ...) W16_PRINTF(3, 4);

static wna16_status_t refuse(contract_t *c, const w16_layout_t *l,
                             const char *fmt, ...)
{
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return w16_err(c->err, WNA16_EUNSUPPORTED, "%s: %s %s: the CUDA fused-MoE "
                   "template (templates/moe_marlin_gemm.cu) cannot read this "
                   "layout: %s", c->spec->name, c->op,
                   l ? l->json_path : "", what);
}

/* Value transforms the template can ignore: none, or ones that leave every
 * code as it is for this problem (Marlin's fp8 remap is written as
 * "A8 == 2 ? ... : c", the identity for 16-bit activations). */
static bool identity_transforms(const w16_layout_t *l, const int64_t *vars)
{
    if (!l->encode && !l->decode)
        return true;
    int64_t v[W16_VAR_COUNT];
    memcpy(v, vars, sizeof v);
    int64_t mask = v[W16_VAR_MASK] > 0 && v[W16_VAR_MASK] < 256
                       ? v[W16_VAR_MASK] : 255;
    for (int64_t z = 0; z <= mask; z++)
        for (int64_t code = 0; code <= mask; code++) {
            const w16_expr_t *t[2] = {l->encode, l->decode};
            v[W16_VAR_c] = code;
            v[W16_VAR_z] = z;
            for (int i = 0; i < 2; i++) {
                int64_t out;
                w16_eval_error_t e;
                if (t[i] && (!w16_expr_eval(t[i], v, &out, &e) || out != code))
                    return false;
            }
        }
    return true;
}

/* The role's layout, present for the problem, of one of `dtypes` (NULL:
 * any float dtype the template reads), and its shape equal to `want`. */
static wna16_status_t expect_layout(contract_t *c, w16_role_t r,
                                    const wna16_dtype_t *dtypes, int n_dtypes,
                                    int ndim, const int64_t *want,
                                    const w16_layout_t **out)
{
    const w16_layout_t *l = c->spec->layouts[r];
    *out = l;
    if (!l || !w16_layout_present(l, c->vars))
        return refuse(c, l, "no %s layout for this problem", w16_role_key(r));
    if (!identity_transforms(l, c->vars))
        return refuse(c, l, "value transforms (encode/decode) are not read");
    for (int i = 0; i < l->n_dtypes; i++) {
        bool ok = false;
        for (int d = 0; d < n_dtypes; d++)
            ok |= l->dtypes[i] == dtypes[d];
        if (!ok)
            return refuse(c, l, "dtype %s", wna16_dtype_name(l->dtypes[i]));
    }
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_status_t st = w16_layout_shape(l, c->vars, shape, c->err);
    if (st != WNA16_OK)
        return st;
    bool same = l->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == want[d];
    if (!same)
        return refuse(c, l, "stored shape differs from the template's");
    c->out->ndim[r] = ndim;
    memcpy(c->out->shape[r], shape, sizeof(int64_t) * (size_t)ndim);
    return WNA16_OK;
}

/* Compares the spec's forward map at `coord` with the template's place. */
static wna16_status_t expect_at(contract_t *c, const w16_layout_t *l,
                                const int64_t *coord, const int64_t *want,
                                int64_t want_bit)
{
    int64_t idx[W16_MAX_STORE_DIMS], bit;
    w16_eval_error_t e = {0};
    if (!w16_layout_locate(l, c->vars, coord, idx, &bit, &e))
        return refuse(c, l, "the forward map fails: %s", e.what);
    bool same = bit == want_bit;
    for (int d = 0; same && d < l->ndim; d++)
        same = idx[d] == want[d];
    if (same)
        return WNA16_OK;
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(l->role, cv);
    char at[96] = "", sp[96] = "", tp[96] = "";
    size_t o = 0;
    for (int i = 0; i < nc; i++)
        o += (size_t)snprintf(at + o, sizeof at - o, "%s%s=%lld", i ? ", " : "",
                              w16_var_name(cv[i]), (long long)coord[i]);
    o = 0;
    for (int d = 0; d < l->ndim; d++)
        o += (size_t)snprintf(sp + o, sizeof sp - o, "[%lld]", (long long)idx[d]);
    o = 0;
    for (int d = 0; d < l->ndim; d++)
        o += (size_t)snprintf(tp + o, sizeof tp - o, "[%lld]",
                              (long long)want[d]);
    return refuse(c, l, "(%s) is stored at %s bit %lld; the template reads %s "
                  "bit %lld", at, sp, (long long)bit, tp, (long long)want_bit);
}

static wna16_status_t check_qweight(contract_t *c, int64_t E, int bits)
{
    int64_t N = c->out->N, K = c->out->K;
    const wna16_dtype_t i32[] = {WNA16_DTYPE_I32};
    const int64_t want[3] = {E, K / 16, N * bits / 2};
    const w16_layout_t *l;
    wna16_status_t st = expect_layout(c, W16_ROLE_QWEIGHT, i32, 1, 3, want, &l);
    if (st != WNA16_OK)
        return st;
    /* every code of the four corner tiles, one code of every tile, for the
     * first and the last expert */
    int64_t kt_n = K / 16, nt_n = N / 64;
    for (int64_t e = 0; e < E; e += (E > 1 ? E - 1 : 1)) {
        for (int64_t kt = 0; kt < kt_n; kt++)
            for (int64_t nt = 0; nt < nt_n; nt++) {
                bool corner = (kt == 0 || kt == kt_n - 1) &&
                              (nt == 0 || nt == nt_n - 1);
                int64_t s0 = corner ? 0 : (kt * 7 + nt * 13 + e) % 1024;
                int64_t s1 = corner ? 1024 : s0 + 1;
                for (int64_t s = s0; s < s1; s++) {
                    int64_t n = nt * 64 + s % 64, k = kt * 16 + s / 64;
                    int64_t coord[3] = {e, n, k}, w[3] = {e, 0, 0}, bit;
                    code_loc(bits, n, k, &w[1], &w[2], &bit);
                    if ((st = expect_at(c, l, coord, w, bit)) != WNA16_OK)
                        return st;
                }
            }
        if (E == 1)
            break;
    }
    return WNA16_OK;
}

/* Columns checked in a row: the first 256, the last 64 and every 7th. */
static bool column_sampled(int64_t n, int64_t N)
{
    return n < 256 || n >= N - 64 || n % 7 == 0;
}

static wna16_status_t check_scales(contract_t *c, int64_t E)
{
    int64_t N = c->out->N, G = c->out->G;
    const wna16_dtype_t fl[] = {WNA16_DTYPE_F16, WNA16_DTYPE_BF16};
    const int64_t want[3] = {E, G, N};
    const w16_layout_t *l;
    wna16_status_t st = expect_layout(c, W16_ROLE_SCALES, fl, 2, 3, want, &l);
    if (st != WNA16_OK)
        return st;
    /* which permutation: the one that matches the first 64 columns */
    c->out->scales = W16_MOE_SCALES_T64;
    for (int64_t n = 0; n < 64; n++) {
        int64_t coord[3] = {0, 0, n}, idx[3], bit;
        w16_eval_error_t e = {0};
        if (!w16_layout_locate(l, c->vars, coord, idx, &bit, &e))
            return refuse(c, l, "the forward map fails: %s", e.what);
        if (idx[2] != scale_pos(W16_MOE_SCALES_T64, n)) {
            c->out->scales = W16_MOE_SCALES_T32;
            break;
        }
    }
    for (int64_t e = 0; e < E; e += (E > 1 ? E - 1 : 1)) {
        for (int64_t g = 0; g < G; g += (G > 1 ? G - 1 : 1)) {
            for (int64_t n = 0; n < N; n++) {
                if (!column_sampled(n, N))
                    continue;
                int64_t coord[3] = {e, g, n};
                int64_t w[3] = {e, g, scale_pos(c->out->scales, n)};
                if ((st = expect_at(c, l, coord, w, 0)) != WNA16_OK)
                    return st;
            }
            if (G == 1)
                break;
        }
        if (E == 1)
            break;
    }
    return WNA16_OK;
}

static wna16_status_t check_zeros(contract_t *c, int64_t E)
{
    int64_t N = c->out->N, G = c->out->G;
    const wna16_dtype_t i32[] = {WNA16_DTYPE_I32};
    const int64_t want[3] = {E, G, N / 8};
    const w16_layout_t *l;
    wna16_status_t st = expect_layout(c, W16_ROLE_QZEROS, i32, 1, 3, want, &l);
    for (int64_t e = 0; st == WNA16_OK && e < E; e += (E > 1 ? E - 1 : 1)) {
        for (int64_t g = 0; st == WNA16_OK && g < G; g += (G > 1 ? G - 1 : 1)) {
            for (int64_t n = 0; st == WNA16_OK && n < N; n++) {
                if (!column_sampled(n, N))
                    continue;
                int64_t coord[3] = {e, g, n}, w[3] = {e, g, 0}, bit;
                zero_loc(n, &w[2], &bit);
                st = expect_at(c, l, coord, w, bit);
            }
            if (G == 1)
                break;
        }
        if (E == 1)
            break;
    }
    return st;
}

static wna16_status_t check_bias(contract_t *c, int64_t E)
{
    int64_t N = c->out->N;
    const wna16_dtype_t fl[] = {WNA16_DTYPE_F16, WNA16_DTYPE_BF16};
    const int64_t want[2] = {E, N};
    const w16_layout_t *l;
    wna16_status_t st = expect_layout(c, W16_ROLE_BIAS, fl, 2, 2, want, &l);
    for (int64_t e = 0; st == WNA16_OK && e < E; e += (E > 1 ? E - 1 : 1)) {
        for (int64_t n = 0; st == WNA16_OK && n < N; n++) {
            if (!column_sampled(n, N))
                continue;
            int64_t coord[2] = {e, n}, w[2] = {e, bias_pos(n)};
            st = expect_at(c, l, coord, w, 0);
        }
        if (E == 1)
            break;
    }
    return st;
}

/* g_idx and the sort indices: [E][K], element (e, k) at [e][k]. */
static wna16_status_t check_ek(contract_t *c, w16_role_t r, int64_t E)
{
    int64_t K = c->out->K;
    const wna16_dtype_t i32[] = {WNA16_DTYPE_I32};
    const int64_t want[2] = {E, K};
    const w16_layout_t *l;
    wna16_status_t st = expect_layout(c, r, i32, 1, 2, want, &l);
    for (int64_t e = 0; st == WNA16_OK && e < E; e += (E > 1 ? E - 1 : 1)) {
        for (int64_t k = 0; st == WNA16_OK && k < K; k++) {
            int64_t coord[2] = {e, k};
            st = expect_at(c, l, coord, coord, 0);
        }
        if (E == 1)
            break;
    }
    return st;
}

wna16_status_t w16_moe_cuda_contract(const wna16_spec_t *spec,
                                     const w16_problem_t *p,
                                     wna16_gemm_t gemm, w16_moe_operand_t *out,
                                     wna16_error_t *err)
{
    memset(out, 0, sizeof *out);
    int64_t v[W16_VAR_COUNT];
    contract_t c = {.spec = spec, .op = gemm == WNA16_GEMM_W13 ? "w13" : "w2",
                    .vars = v, .out = out, .err = err};
    if (spec->kind != WNA16_SPEC_BACKEND || !spec->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: the CUDA fused MoE runs "
                       "on stacked backend layouts", spec->name);
    if (p->a8)
        return refuse(&c, NULL, "8-bit activations are not implemented");
    if (p->zp && p->BITS != 4)
        return refuse(&c, NULL, "zero points are read for 4-bit codes only");
    if (p->act_order && !spec->act_order_sort)
        return refuse(&c, NULL, "act-order needs K stored in g_idx order "
                      "(\"act_order_sort\")");
    wna16_status_t st = w16_spec_bind(spec, p, gemm, v, err);
    if (st != WNA16_OK)
        return st;
    out->N = v[W16_VAR_N];
    out->K = v[W16_VAR_K];
    out->G = v[W16_VAR_G];
    out->IP = v[W16_VAR_IP];
    if (out->N % 64 != 0 || out->K % 64 != 0)
        return refuse(&c, NULL, "N = %lld and K = %lld must be multiples of "
                      "64", (long long)out->N, (long long)out->K);
    if (p->GS > 0 && p->GS % 16 != 0)
        return refuse(&c, NULL, "group size %lld is not a multiple of 16",
                      (long long)p->GS);
    st = check_qweight(&c, p->E, (int)p->BITS);
    if (st == WNA16_OK)
        st = check_scales(&c, p->E);
    if (st == WNA16_OK && p->zp)
        st = check_zeros(&c, p->E);
    if (st == WNA16_OK && p->bias)
        st = check_bias(&c, p->E);
    if (st == WNA16_OK && p->act_order)
        st = check_ek(&c, W16_ROLE_G_IDX, p->E);
    if (st == WNA16_OK && p->act_order)
        st = check_ek(&c, W16_ROLE_SORT_IDX, p->E);
    return st;
}

/* ---- tiles ---------------------------------------------------------------- */

wna16_status_t w16_moe_cuda_block_m(const wna16_spec_t *spec,
                                    int64_t tokens_per_expert, bool wgmma_ok,
                                    int *block_m, bool *wgmma,
                                    wna16_error_t *err)
{
    if (!spec->tiling)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: no \"tiling\" section: "
                       "the spec does not describe CUDA fused-MoE tiles",
                       spec->name);
    const w16_tile_bm_t *b = w16_tiling_block_m(spec->tiling,
                                                tokens_per_expert, wgmma_ok);
    *block_m = b->block_m;
    if (wgmma)
        *wgmma = b->wgmma;
    return WNA16_OK;
}

bool w16_moe_cuda_self_route_row(const wna16_spec_t *spec, int block_m,
                                 int64_t experts)
{
    if (!spec->tiling || experts < 1)
        return false;
    /* the runtime's slots an expert: ceil(slots / the ids' experts) */
    const int64_t most = (W16_MOE_SELF_ROUTE_SLOTS + experts - 1) / experts;
    for (int64_t tpe = 1; tpe <= most; tpe++)
        for (int ok = 0; ok < 2; ok++) {
            const w16_tile_bm_t *b =
                w16_tiling_block_m(spec->tiling, tpe, ok != 0);
            if (b->block_m == block_m && !b->wgmma)
                return true;
        }
    return false;
}

wna16_status_t w16_moe_cuda_tile(const wna16_spec_t *spec, int block_m,
                                 bool wgmma, wna16_gemm_t gemm, int64_t N,
                                 int64_t K,
                                 w16_moe_gemm_cfg_t *cfg,
                                 const char **json_path, wna16_error_t *err)
{
    if (!spec->tiling)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: no \"tiling\" section: "
                       "the spec does not describe CUDA fused-MoE tiles",
                       spec->name);
    const w16_tile_rule_t *r = w16_tiling_gemm(spec->tiling, wgmma, block_m,
                                               gemm, N, K);
    int bk = r->block_k;
    while (K % bk != 0 && bk > 64)
        bk /= 2;
    if (K % bk != 0)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s: K = %lld is not a "
                       "multiple of 64", spec->name, r->json_path,
                       (long long)K);
    cfg->gemm = gemm;
    cfg->block_m = block_m;
    cfg->block_n = r->block_n;
    cfg->block_k = bk;
    cfg->warps_n = r->warps_n;
    cfg->warps_k = r->warps_k < bk / 16 ? r->warps_k : bk / 16;
    cfg->stages = r->stages;
    cfg->min_ctas = r->min_ctas;
    cfg->wgmma = r->wgmma;
    cfg->scales_in_b = r->scales_in_b;
    cfg->ws = r->wgmma && r->warp_specialized;
    cfg->acc_scales = cfg->ws && r->scales_on_acc;
    cfg->wgmma_groups = cfg->ws ? r->wgmma_groups : 1;
    cfg->split_codes = cfg->ws && r->split_codes;
    cfg->tail_m = cfg->ws ? r->tail_m : 0;
    cfg->persistent = cfg->ws && r->persistent;
    if (json_path)
        *json_path = r->json_path;
    return WNA16_OK;
}

void w16_moe_cuda_split(const wna16_spec_t *spec, int block_m, bool wgmma,
                        wna16_gemm_t gemm, int64_t N, int64_t K,
                        int *max_split, int *ctas_per_sm)
{
    *max_split = 1;
    *ctas_per_sm = 1;
    if (!spec->tiling)
        return;
    const w16_tile_rule_t *r = w16_tiling_gemm(spec->tiling, wgmma, block_m,
                                               gemm, N, K);
    *max_split = r->max_split_k;
    *ctas_per_sm = r->ctas_per_sm;
}

wna16_status_t w16_moe_cuda_cfg(const wna16_spec_t *spec,
                                const w16_moe_operand_t *op,
                                const w16_moe_unit_quant_t *q, int block_m,
                                bool wgmma, wna16_gemm_t gemm,
                                w16_moe_gemm_cfg_t *c, const char **json_path,
                                wna16_error_t *err)
{
    memset(c, 0, sizeof *c); /* padding too: memcmp and keys see bytes */
    wna16_status_t st = w16_moe_cuda_tile(spec, block_m, wgmma, gemm, op->N,
                                          op->K, c, json_path, err);
    c->bits = q->bits;
    c->zp = q->zp;
    c->act_order = q->act_order;
    w16_moe_cfg_groups(c, op->G, q->group_size);
    c->scales = op->scales;
    c->act_dtype = q->act_dtype;
    c->scale_dtype = q->scale_dtype;
    c->bias_dtype = q->bias_dtype;
    c->activation = gemm == WNA16_GEMM_W13 ? q->activation
                                           : WNA16_ACT_INVALID;
    return st;
}

unsigned w16_moe_gemm_threads(const w16_moe_gemm_cfg_t *c)
{
    return 32u * (unsigned)(c->warps_n * c->warps_k) + (c->ws ? 128u : 0u);
}

/* Rows of 64 scales a tile that a pipeline stage carries (S_ROWS): the
 * mma.sync unit's group size is a constant, so a stage holds the groups
 * its K range touches (one when a group spans whole stages) and nothing
 * for channelwise or act-order scales; the wgmma template reserves
 * block_k / 16. Sized exactly, a block_m 8 CTA of 256 columns and three
 * stages fits four an SM (56.8 KB; 67.6 KB with block_k / 16 rows). */
static int scale_rows(const w16_moe_gemm_cfg_t *c)
{
    if (c->wgmma)
        return c->block_k / 16;
    if (!c->grouped || c->act_order)
        return 0;
    return c->group_size % c->block_k == 0 ? 1
                                           : c->block_k / c->group_size;
}

size_t w16_moe_gemm_shared(const w16_moe_gemm_cfg_t *c)
{
    return w16_tile_shared_bytes(c->block_m + c->tail_m, c->block_n,
                                 c->block_k,
                                 c->stages, c->bits, scale_rows(c),
                                 c->wgmma, c->persistent);
}

/* ---- names and sources ------------------------------------------------------ */

static const char *dt_short(wna16_dtype_t d)
{
    return d == WNA16_DTYPE_BF16 ? "bf16" : "f16";
}

void w16_moe_gemm_name(const w16_moe_gemm_cfg_t *c, char *out, size_t size)
{
    bool w13 = c->gemm == WNA16_GEMM_W13;
    const char *act = w13 ? wna16_activation_name(c->activation) : NULL;
    /* the mma.sync unit is specialized for its group size */
    char gq[16];
    if (c->grouped && !c->act_order && !c->wgmma)
        snprintf(gq, sizeof gq, "g%d", c->group_size);
    else
        snprintf(gq, sizeof gq, "%s", c->grouped ? "gq" : "gc");
    snprintf(out, size,
             "w16_moe_marlin_%s%s%s_%s_b%d_%s%s_%s_%s_s%s_b%s_m%dn%dk%d_w%dx%d_p%d",
             w13 ? "w13" : "w2", act ? "_" : "", act ? act : "",
             dt_short(c->act_dtype), c->bits, c->zp ? "zp" : "sym",
             c->act_order ? "_ao" : "", gq,
             c->scales == W16_MOE_SCALES_T64 ? "t64" : "t32",
             dt_short(c->scale_dtype), dt_short(c->bias_dtype), c->block_m,
             c->block_n, c->block_k, c->warps_n, c->warps_k, c->stages);
    /* the variant keys that change the code, in a fixed order: a suffix
     * each where it is not the default (value -1: a flag) */
    const struct { bool on; const char *tag; int value; } keys[] = {
        {c->min_ctas > 1, "_o", c->min_ctas},
        {c->scales_in_b, "_sb", -1},
        {c->wgmma, "_wg", -1},
        {c->ws, "_ws", -1},
        {c->acc_scales, "_sa", -1},
        {c->wgmma_groups > 1, "_d", c->wgmma_groups},
        {c->split_codes && c->bits == 4, "_sc", -1},
        {c->tail_m > 0, "_tm", c->tail_m},
        {c->persistent, "_ps", -1},
        {c->wgmma && c->grouped && !c->group_stages, "_gk", -1},
        {c->split_sums && !c->wgmma && w13, "_ss", -1},
        {c->self_route && !c->wgmma, "_rt", -1},
    };
    for (size_t i = 0; i < W16_ARRAY_LEN(keys); i++) {
        size_t len = strlen(out);
        if (!keys[i].on || len >= size)
            continue;
        if (keys[i].value >= 0)
            snprintf(out + len, size - len, "%s%d", keys[i].tag, keys[i].value);
        else
            snprintf(out + len, size - len, "%s", keys[i].tag);
    }
}

static bool is_f16ish(wna16_dtype_t d)
{
    return d == WNA16_DTYPE_F16 || d == WNA16_DTYPE_BF16;
}

static bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

/* templates/moe_wgmma_gemm.cu's static_asserts beyond the common ones. */
static const char *check_wgmma(const w16_moe_gemm_cfg_t *c)
{
    if (c->act_order)
        return "wgmma: act-order runs on the mma.sync template";
    if (!w16_tile_block_m_ok(c->block_m, true))
        return "wgmma: block_m is a multiple of 16 from 16 to 256";
    /* a warpgroup's columns: 128 (two m64 slices), or 64 (one slice: above
     * block_m 128, whose accumulators would not fit twice, and for four
     * warp-specialized consumer warpgroups) */
    int slices = c->warps_n > 0 ? c->block_n / (16 * c->warps_n) : 0;
    bool four = c->warps_n == 16;
    if ((c->warps_n != 4 && c->warps_n != 8 && !four) || c->warps_k != 1 ||
        (slices != 1 && slices != 2) ||
        c->block_n != 16 * slices * c->warps_n ||
        ((c->block_m > 128 || four) && slices != 1))
        return "wgmma: one warpgroup (4 warps_n) per 128 columns (64 above "
               "block_m 128), one or two warpgroups, or four of 64 columns, "
               "warps_k 1";
    if (four && c->split_codes)
        return "wgmma: split codes are for two consumer warpgroups "
               "(warps_n 8)";
    if (four && (!c->ws || c->block_m > 128))
        return "wgmma: four consumer warpgroups (warps_n 16) are "
               "warp-specialized, block_m 128 at most";
    if (c->block_k != 64)
        return "wgmma: block_k is 64";
    if (c->stages < 3 || c->stages > 8)
        return "wgmma: stages are 3 to 8 (stages - 2 loads in flight)";
    if (c->min_ctas < 0 || c->min_ctas > 8 ||
        (32 * c->warps_n + (c->ws ? 128 : 0)) * c->min_ctas > 2048)
        return "min_ctas is 0 to 8, with at most 2048 threads an SM";
    if (c->ws && ((c->warps_n != 8 && !four) || c->min_ctas > 1))
        return "wgmma warp-specialized: two or four consumer warpgroups "
               "(warps_n 8 or 16), one CTA an SM";
    if ((c->acc_scales || c->wgmma_groups > 1 || c->split_codes) && !c->ws)
        return "wgmma: scales on the accumulators, two groups in flight "
               "and split codes are for warp-specialized rows";
    if (c->wgmma_groups < 0 || c->wgmma_groups > 2)
        return "wgmma: 1 or 2 groups in flight";
    if (c->persistent && (!c->ws || c->split_codes))
        return "wgmma: persistent CTAs are for warp-specialized rows "
               "without split codes";
    if (c->tail_m != 0 &&
        ((c->tail_m != 16 && c->tail_m != 32) || !c->ws || slices != 2 ||
         c->warps_n != 8 || c->acc_scales))
        return "wgmma: tail rows (16 or 32) are for warp-specialized rows "
               "of two consumer warpgroups and two slices, without scales "
               "on the accumulators";
    return NULL;
}

/* The template's static_asserts, as errors a caller can read. */
static wna16_status_t check_cfg(const w16_moe_gemm_cfg_t *c,
                                wna16_error_t *err)
{
    const char *why = NULL;
    int tiles = c->block_n / 64, nt = c->warps_n > 0 ? tiles / c->warps_n : 0;
    if (c->gemm != WNA16_GEMM_W13 && c->gemm != WNA16_GEMM_W2)
        why = "gemm is w13 or w2";
    else if (c->bits != 4 && c->bits != 8)
        why = "bits are 4 or 8";
    else if (c->zp && c->bits != 4)
        why = "zero points are 4-bit";
    else if (!is_f16ish(c->act_dtype) || !is_f16ish(c->scale_dtype) ||
             !is_f16ish(c->bias_dtype))
        why = "activation, scale and bias dtypes are F16 or BF16";
    else if (c->gemm == WNA16_GEMM_W13 &&
             !wna16_activation_is_gated(c->activation))
        why = "the w13 GEMM fuses a gated activation";
    else if (c->wgmma)
        why = check_wgmma(c);
    else if (!w16_tile_block_m_ok(c->block_m, false))
        why = "block_m is 8, 16, 24, 32, 48 or 64";
    else if (c->grouped && !c->act_order &&
             (c->group_size < 16 || c->group_size % 16 ||
              (c->group_size % c->block_k && c->block_k % c->group_size)))
        why = "grouped scales: group_size is a multiple of 16 that divides "
              "block_k or that block_k divides";
    else if (c->block_n < 64 || c->block_n > 256 || c->block_n % 64)
        why = "block_n is a multiple of 64 up to 256";
    else if (c->block_k != 64 && c->block_k != 128 && c->block_k != 256)
        why = "block_k is 64, 128 or 256";
    else if (!pow2(c->warps_n) || tiles % c->warps_n)
        why = "warps_n is a power of two dividing block_n / 64";
    else if (!pow2(c->warps_k) || (c->block_k / 16) % c->warps_k)
        why = "warps_k is a power of two dividing block_k / 16";
    else if (c->warps_n * c->warps_k > 16)
        why = "at most 16 warps";
    else if (c->gemm == WNA16_GEMM_W13 &&
             (tiles % 2 || nt > tiles / 2 || (tiles / 2) % nt))
        why = "w13: each warp's tiles lie in the gate or the up half";
    else if (((c->block_m + 15) / 16) * nt > 4)
        why = "at most 4 m16 x 64 accumulator tiles a warp";
    else if (c->stages < 2 || c->stages > 8)
        why = "stages are 2 to 8";
    else if (c->min_ctas < 0 || c->min_ctas > 8 ||
             32 * c->warps_n * c->warps_k * c->min_ctas > 2048)
        why = "min_ctas is 0 to 8, with at most 2048 threads an SM";
    if (why)
        return w16_err(err, WNA16_EINVAL, "CUDA fused-MoE GEMM: %s", why);
    return WNA16_OK;
}

void w16_moe_cfg_groups(w16_moe_gemm_cfg_t *c, int64_t G,
                        int64_t group_size)
{
    c->grouped = G > 1;
    c->group_stages = c->grouped && group_size % 64 == 0;
    c->group_size = c->grouped && !c->act_order ? (int)group_size : 0;
}

static void def_int(w16_buf_t *b, const char *name, long long v)
{
    w16_buf_printf(b, "constexpr int %s = %lld;\n", name, v);
}

static void def_bool(w16_buf_t *b, const char *name, bool v)
{
    w16_buf_printf(b, "constexpr bool %s = %s;\n", name, v ? "true" : "false");
}

static void def_activations(w16_buf_t *b)
{
    /* the activations as the public enum numbers them */
    w16_buf_puts(b, "enum : int {");
#define X(NAME, str, gated) \
    w16_buf_printf(b, " ACT_" #NAME " = %d,", (int)WNA16_ACT_##NAME);
    WNA16_ACTIVATION_LIST(X)
#undef X
    w16_buf_puts(b, " };\n");
}

/* The wgmma template's one product, m64nBMk16 (templates/moe_wgmma_gemm.cu,
 * wgmma_step): the instruction names every accumulator register as an
 * operand, so its operand list is written here for the unit's block_m
 * (BM / 2 floats a thread) rather than once a size in the template.
 * Operands: the accumulators d[0 .. ACC), then the A fragment's four
 * registers, the B descriptor and scale-d (0: D = A . B). */
static void def_wgmma_n(w16_buf_t *b, const w16_moe_gemm_cfg_t *c,
                        const char *tag, int n)
{
    int acc = n / 2;
    w16_buf_printf(b, "#define W16_WGMMA%s_ACC %d\n", tag, acc);
    w16_buf_printf(b, "#define W16_WGMMA%s_ASM \"{\\n.reg .pred p;\\n"
                   "setp.ne.b32 p, %%%d, 0;\\nwgmma.mma_async.sync.aligned."
                   "m64n%dk16%s {", tag, acc + 5, n,
                   c->act_dtype == WNA16_DTYPE_BF16 ? ".f32.bf16.bf16"
                                                    : ".f32.f16.f16");
    for (int i = 0; i < acc; i++)
        w16_buf_printf(b, "%s%%%d", i ? "," : "", i);
    w16_buf_printf(b, "}, {%%%d,%%%d,%%%d,%%%d}, %%%d, p, 1, 1, 0;\\n}"
                   "\\n\"\n", acc, acc + 1, acc + 2, acc + 3, acc + 4);
    w16_buf_printf(b, "#define W16_WGMMA%s_D", tag);
    for (int i = 0; i < acc; i++)
        w16_buf_printf(b, "%s\"+f\"(d[%d])", i ? ", " : " ", i);
    w16_buf_puts(b, "\n");
}

/* The product's instruction and operand list for the unit's block_m
 * (W16_WGMMA_*), and for its tail rows (W16_WGMMA_TAIL_*, TAIL_M). */
static void def_wgmma(w16_buf_t *b, const w16_moe_gemm_cfg_t *c)
{
    def_wgmma_n(b, c, "", c->block_m);
    if (c->tail_m > 0)
        def_wgmma_n(b, c, "_TAIL", c->tail_m);
}

static wna16_status_t append_template(w16_buf_t *b, const char *file,
                                      wna16_error_t *err)
{
    const w16_embedded_template_t *t = w16_template_find(file);
    if (!t)
        return w16_err(err, WNA16_EINTERNAL, "template %s is not built in",
                       file);
    /* NVRTC's messages then point into the template file */
    w16_buf_printf(b, "#line 1 \"%s\"\n", file);
    w16_buf_append(b, t->text, t->len);
    if (b->failed)
        return w16_err_nomem(err, "writing a CUDA translation unit");
    return WNA16_OK;
}

wna16_status_t w16_moe_gemm_source(const w16_moe_gemm_cfg_t *c, w16_buf_t *b,
                                   wna16_error_t *err)
{
    wna16_status_t st = check_cfg(c, err);
    if (st != WNA16_OK)
        return st;
    char name[160];
    w16_moe_gemm_name(c, name, sizeof name);
    w16_buf_printf(b, "// %s\n", name);
    const char *tmpl = c->wgmma ? "moe_wgmma_gemm.cu" : "moe_marlin_gemm.cu";
    w16_buf_printf(b, "// Generated by wna16 %s from templates/%s"
                   " (gen/moe_cuda.c).\n", WNA16_VERSION_STRING, tmpl);
    w16_buf_puts(b, "namespace w16cfg {\n");
    def_activations(b);
    def_int(b, "GEMM", c->gemm == WNA16_GEMM_W13 ? 1 : 2);
    def_bool(b, "GATED", c->gemm == WNA16_GEMM_W13);
    def_int(b, "ACTIVATION", c->gemm == WNA16_GEMM_W13 ? c->activation : -1);
    def_int(b, "BITS", c->bits);
    def_bool(b, "ZP", c->zp);
    def_bool(b, "ACT_ORDER", c->act_order);
    def_bool(b, "GROUPED", c->grouped);
    def_int(b, "SCALE_LAYOUT", c->scales);
    def_bool(b, "ACT_BF16", c->act_dtype == WNA16_DTYPE_BF16);
    def_bool(b, "SCALE_BF16", c->scale_dtype == WNA16_DTYPE_BF16);
    def_bool(b, "BIAS_BF16", c->bias_dtype == WNA16_DTYPE_BF16);
    def_int(b, "BM", c->block_m);
    def_int(b, "BN", c->block_n);
    def_int(b, "BK", c->block_k);
    def_int(b, "WN", c->warps_n);
    def_int(b, "WK", c->warps_k);
    def_int(b, "STAGES", c->stages);
    def_int(b, "MIN_CTAS", c->min_ctas > 1 ? c->min_ctas : 1);
    /* moe_route_warp.cu's slot_expert (SELF_ROUTE's bad ids) */
    def_int(b, "ERR_ID", W16_AUX_ERR_ID);
    /* the stage copies (moe_gemm_common.cu) split the codes: wgmma
     * warp-specialized 4-bit tiles of two m64 slices a warpgroup only */
    def_bool(b, "SPLIT_CODES", c->wgmma && c->ws && c->split_codes &&
                                   c->bits == 4 && c->block_m <= 128 &&
                                   c->warps_n == 8);
    if (!c->wgmma) { /* the mma.sync template's choices only */
        def_bool(b, "SCALES_IN_B", c->scales_in_b);
        def_bool(b, "SELF_ROUTE", c->self_route);
        def_bool(b, "SPLIT_SUMS",
                 c->split_sums && c->gemm == WNA16_GEMM_W13);
        def_int(b, "GS", c->grouped && !c->act_order ? c->group_size : 0);
    } else { /* and the wgmma template's */
        def_bool(b, "WS", c->ws);
        def_bool(b, "ACC_SCALES", c->acc_scales);
        def_int(b, "WGMMA_GROUPS", c->wgmma_groups > 1 ? 2 : 1);
        def_bool(b, "GROUP_STAGES", c->grouped && c->group_stages);
    }
    def_int(b, "TAIL_M", c->wgmma ? c->tail_m : 0);
    if (c->wgmma) { /* the C tile's rows at a time (PERSIST: in chunks) */
        def_bool(b, "PERSIST", c->persistent);
        def_int(b, "C_ROWS",
                c->persistent ? w16_tile_c_rows(c->block_m + c->tail_m,
                                                 c->block_n, c->block_k,
                                                 c->stages, c->bits,
                                                 scale_rows(c))
                              : c->block_m + c->tail_m);
    }
    def_int(b, "S_ROWS", scale_rows(c));
    def_int(b, "SMEM_BYTES", (long long)w16_moe_gemm_shared(c));
    w16_buf_puts(b, "} // namespace w16cfg\n");
    if (c->wgmma)
        def_wgmma(b, c);
    w16_buf_printf(b, "#define W16_KERNEL %s\n", name);
    if (c->gemm == WNA16_GEMM_W13)
        w16_buf_printf(b, "#define W16_REDUCE %s_reduce\n", name);
    /* the chain's launch contract, what both GEMM templates share, then
     * the one of this tile */
    wna16_status_t cst = append_template(b, "moe_pdl.cu", err);
    if (cst == WNA16_OK)
        cst = append_template(b, "moe_quant.cu", err);
    if (cst == WNA16_OK) /* a CTA's own routing at decode sizes */
        cst = append_template(b, "moe_route_warp.cu", err);
    if (cst == WNA16_OK)
        cst = append_template(b, "moe_gemm_common.cu", err);
    if (cst != WNA16_OK)
        return cst;
    return append_template(b, tmpl, err);
}

/* ---- the one-kernel decode layer ---------------------------------------- */

wna16_status_t w16_moe_decode_cfg(const w16_moe_operand_t op[2],
                                  const w16_moe_unit_quant_t *q,
                                  w16_moe_decode_cfg_t *c,
                                  wna16_error_t *err)
{
    memset(c, 0, sizeof *c); /* padding too: keys see bytes */
    const char *why = NULL;
    if (q->act_order)
        why = "act order (the chain gathers its inputs)";
    else if (op[0].IP % 64 != 0 || op[1].N % 64 != 0)
        why = "an intermediate or hidden size not a multiple of 64";
    else if (op[0].G > 1 && (q->group_size < 32 || q->group_size % 32 != 0))
        why = "a group size not a multiple of 32";
    else if (!wna16_activation_is_gated(q->activation))
        why = "an activation that is not gated";
    if (why)
        return w16_err(err, WNA16_EUNSUPPORTED, "the one-kernel decode "
                       "layer does not take %s", why);
    c->bits = q->bits;
    c->zp = q->zp;
    c->grouped = op[0].G > 1;
    c->group_size = c->grouped ? (int)q->group_size : 0;
    c->scales[0] = op[0].scales;
    c->scales[1] = op[1].scales;
    c->act_dtype = q->act_dtype;
    c->scale_dtype = q->scale_dtype;
    c->bias_dtype = q->bias_dtype;
    c->activation = q->activation;
    return WNA16_OK;
}

void w16_moe_decode_name(const w16_moe_decode_cfg_t *c, char *out,
                         size_t size)
{
    const char *act = wna16_activation_name(c->activation);
    char grp[24];
    if (c->grouped)
        snprintf(grp, sizeof grp, "g%d", c->group_size);
    else
        snprintf(grp, sizeof grp, "gc");
    snprintf(out, size, "w16_moe_decode_%s_%s_b%d%s_%s_t%s%s_s%s_%s",
             act ? act : "invalid", dt_short(c->act_dtype), c->bits,
             c->zp ? "_zp" : "", grp,
             c->scales[0] == W16_MOE_SCALES_T64 ? "64" : "32",
             c->scales[1] == W16_MOE_SCALES_T64 ? "64" : "32",
             dt_short(c->scale_dtype), dt_short(c->bias_dtype));
}

wna16_status_t w16_moe_decode_source(const w16_moe_decode_cfg_t *c,
                                     w16_buf_t *b, wna16_error_t *err)
{
    const char *bad = NULL;
    if (c->bits != 4 && c->bits != 8)
        bad = "bits (4 or 8)";
    else if (c->zp && c->bits != 4)
        bad = "zero points (4-bit only)";
    else if (c->grouped && (c->group_size < 32 || c->group_size % 32 != 0))
        bad = "group_size (a multiple of 32)";
    else if (!is_f16ish(c->act_dtype) || !is_f16ish(c->scale_dtype) ||
             !is_f16ish(c->bias_dtype))
        bad = "dtypes (F16 or BF16)";
    else if (!wna16_activation_is_gated(c->activation))
        bad = "activation (a gated one)";
    else
        for (int g = 0; g < 2; g++)
            if (c->scales[g] != W16_MOE_SCALES_T64 &&
                c->scales[g] != W16_MOE_SCALES_T32)
                bad = "scale permutation";
    if (bad)
        return w16_err(err, WNA16_EINVAL, "CUDA decode MoE unit: %s", bad);
    char name[160];
    w16_moe_decode_name(c, name, sizeof name);
    w16_buf_printf(b, "// %s\n", name);
    w16_buf_printf(b, "// Generated by wna16 %s from templates/moe_decode.cu"
                   " (gen/moe_cuda.c).\n", WNA16_VERSION_STRING);
    w16_buf_puts(b, "namespace w16cfg {\n");
    def_activations(b);
    def_int(b, "ACTIVATION", c->activation);
    def_int(b, "BITS", c->bits);
    def_bool(b, "ZP", c->zp);
    def_bool(b, "GROUPED", c->grouped);
    def_int(b, "GS", c->grouped ? c->group_size : 0);
    def_int(b, "SL1", c->scales[0]);
    def_int(b, "SL2", c->scales[1]);
    def_bool(b, "ACT_BF16", c->act_dtype == WNA16_DTYPE_BF16);
    def_bool(b, "SCALE_BF16", c->scale_dtype == WNA16_DTYPE_BF16);
    def_bool(b, "BIAS_BF16", c->bias_dtype == WNA16_DTYPE_BF16);
    def_int(b, "MAX_SLOTS", W16_MOE_DECODE_MAX_SLOTS);
    def_int(b, "CTAS", W16_MOE_DECODE_CTAS);
    def_int(b, "ERR_ID", W16_AUX_ERR_ID);
    w16_buf_puts(b, "} // namespace w16cfg\n");
    w16_buf_printf(b, "#define W16_KERNEL %s\n", name);
    wna16_status_t st = append_template(b, "moe_pdl.cu", err);
    if (st == WNA16_OK)
        st = append_template(b, "moe_quant.cu", err);
    if (st == WNA16_OK)
        st = append_template(b, "moe_decode.cu", err);
    return st;
}

const char *const w16_moe_aux_names[W16_AUX_COUNT] = {
    [W16_AUX_ROUTE_COUNT] = "w16_route_count",
    [W16_AUX_ROUTE_SCAN] = "w16_route_scan",
    [W16_AUX_ROUTE_FILL] = "w16_route_fill",
    [W16_AUX_ROUTE_SCATTER] = "w16_route_scatter",
    [W16_AUX_ROUTE_SMALL] = "w16_route_small",
    [W16_AUX_FINALIZE_SMALL] = "w16_finalize_small",
    [W16_AUX_GATHER] = "w16_gather",
    [W16_AUX_FINALIZE] = "w16_finalize",
    [W16_AUX_FINALIZE_ROWS] = "w16_finalize_rows",
    [W16_AUX_FINALIZE_BATCHED] = "w16_finalize_batched",
    [W16_AUX_CHECK_ACT_ORDER] = "w16_check_act_order",
    [W16_AUX_CHECK_SEEN] = "w16_check_seen",
};

/* piece p: kernels [aux_first[p], aux_first[p + 1]) */
static const int aux_first[W16_AUX_PIECES + 1] = {
    [W16_AUX_PIECE_ROUTE] = W16_AUX_ROUTE_COUNT,
    [W16_AUX_PIECE_FINALIZE_SMALL] = W16_AUX_FINALIZE_SMALL,
    [W16_AUX_PIECE_GATHER_FINALIZE] = W16_AUX_GATHER,
    [W16_AUX_PIECES] = W16_AUX_COUNT,
};

static const char *const aux_units[2][W16_AUX_PIECES + 1] = {
    {"w16_moe_aux_route_f16", "w16_moe_aux_finalize_small_f16",
     "w16_moe_aux_gather_finalize_f16", "w16_moe_aux_f16"},
    {"w16_moe_aux_route_bf16", "w16_moe_aux_finalize_small_bf16",
     "w16_moe_aux_gather_finalize_bf16", "w16_moe_aux_bf16"},
};

static int aux_piece_ok(int piece)
{
    return piece >= 0 && piece <= W16_AUX_WHOLE ? piece : W16_AUX_WHOLE;
}

void w16_moe_aux_range(int piece, int *first, int *n)
{
    piece = aux_piece_ok(piece);
    *first = piece == W16_AUX_WHOLE ? 0 : aux_first[piece];
    *n = (piece == W16_AUX_WHOLE ? W16_AUX_COUNT : aux_first[piece + 1]) -
         *first;
}

const char *w16_moe_aux_unit(wna16_dtype_t act_dtype, int piece)
{
    return aux_units[act_dtype == WNA16_DTYPE_BF16][aux_piece_ok(piece)];
}

wna16_status_t w16_moe_aux_source(wna16_dtype_t act_dtype, int piece,
                                  w16_buf_t *b, wna16_error_t *err)
{
    if (!is_f16ish(act_dtype))
        return w16_err(err, WNA16_EINVAL, "CUDA fused MoE: activation dtype "
                       "%s (F16 or BF16)", wna16_dtype_name(act_dtype)
                           ? wna16_dtype_name(act_dtype) : "INVALID");
    if (piece < 0 || piece > W16_AUX_WHOLE)
        return w16_err(err, WNA16_EINVAL, "CUDA fused MoE: no routing unit "
                       "%d (0 .. %d)", piece, W16_AUX_WHOLE);
    w16_buf_printf(b, "// %s\n", w16_moe_aux_unit(act_dtype, piece));
    w16_buf_printf(b, "// Generated by wna16 %s from templates/moe_aux.cu "
                   "(gen/moe_cuda.c).\n", WNA16_VERSION_STRING);
    w16_buf_puts(b, "namespace w16cfg {\n");
    def_bool(b, "ACT_BF16", act_dtype == WNA16_DTYPE_BF16);
    def_int(b, "CHUNK", W16_AUX_CHUNK);
    def_int(b, "ROUTE_THREADS", W16_AUX_ROUTE_THREADS);
    def_int(b, "SCAN_THREADS", W16_AUX_SCAN_THREADS);
    def_int(b, "ERR_ID", W16_AUX_ERR_ID);
    def_int(b, "ERR_COUNT", W16_AUX_ERR_COUNT);
    def_int(b, "ERR_GIDX", W16_AUX_ERR_GIDX);
    def_int(b, "ERR_PERM", W16_AUX_ERR_PERM);
    w16_buf_puts(b, "} // namespace w16cfg\n");
    /* the kernels of this unit (the template defines the others away) */
    int first, n;
    w16_moe_aux_range(piece, &first, &n);
    for (int k = first; k < first + n; k++)
        w16_buf_printf(b, "#define W16_WANT_%s\n", w16_moe_aux_names[k]);
    wna16_status_t st = append_template(b, "moe_pdl.cu", err);
    if (st == WNA16_OK) /* route_small's warp path, which the GEMMs share */
        st = append_template(b, "moe_route_warp.cu", err);
    return st == WNA16_OK ? append_template(b, "moe_aux.cu", err) : st;
}
