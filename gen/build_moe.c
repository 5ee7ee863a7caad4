/*
 * build_moe.c - the fused-MoE kernel builder (see build_moe.h).
 *
 *   gemm workgroup: one expert e's run of blocks, one tile of channels
 *   gemm lane: two weight rows n (gate c and up IP + c, or two channels)
 *     for each block of the run:
 *       for each of its BM slots: row of x (or a), real or padding?
 *       for kc in [0, K / S):          S = code slots per storage element
 *         for s < S (unrolled): k = kc*S + s
 *           w = (decode(code(e, n, k)) - zero(e, g, n)) * scale(e, g, n)
 *               (rounded to bf16 under bf16-exact: request numerics)
 *           acc[slot][row] += x[slot][k] * w    (f32; x slot-major)
 *       epilogue per real slot: + bias, rounding, activation, store
 *   (where the layout keeps rows of codes in order, the K loop reads
 *   32-bit words instead: per word, p = sum of x * (code - zero) over its
 *   codes, acc += p * scale; k_loop_words)
 *
 * Layout expressions are lowered with every coordinate bound to an IR
 * value and its range, so floor divisions by powers of two become shifts
 * and a code slot's bit offset folds to a constant once LLVM sees that
 * k = kc*S + s. Values used more than once are `let`s (the IR is a tree).
 *
 * The file runs past the 1,200-line guide and stays one: it is one builder
 * of one call's four stages, and every section (the weight reads through
 * the layout, the activations, the K loops) works on the builder state mb_t
 * through the small IR helpers below, which a split would have to export
 * in a private header for a second file with no other user.
 */
#include "gen/build_moe.h"
#include "gen/lower_expr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const stage_names[W16_MOE_STAGE_COUNT] = {
#define X(e, name) name,
    W16_MOE_STAGE_LIST(X)
#undef X
};

static const char *const arg_names[W16_MOE_ARG_COUNT] = {
#define X(e, name) name,
    W16_MOE_ARG_LIST(X)
#undef X
};

const char *w16_moe_stage_name(w16_moe_stage_t s) { return stage_names[s]; }

w16_moe_arg_t w16_moe_weight_arg(wna16_gemm_t g, w16_role_t r)
{
    bool w13 = g == WNA16_GEMM_W13;
    switch (r) {
    case W16_ROLE_QWEIGHT: return w13 ? W16_MOE_ARG_W13_QWEIGHT : W16_MOE_ARG_W2_QWEIGHT;
    case W16_ROLE_SCALES: return w13 ? W16_MOE_ARG_W13_SCALES : W16_MOE_ARG_W2_SCALES;
    case W16_ROLE_QZEROS: return w13 ? W16_MOE_ARG_W13_QZEROS : W16_MOE_ARG_W2_QZEROS;
    case W16_ROLE_G_IDX: return w13 ? W16_MOE_ARG_W13_G_IDX : W16_MOE_ARG_W2_G_IDX;
    case W16_ROLE_SORT_IDX:
        return w13 ? W16_MOE_ARG_W13_SORT_IDX : W16_MOE_ARG_W2_SORT_IDX;
    default: return w13 ? W16_MOE_ARG_W13_BIAS : W16_MOE_ARG_W2_BIAS;
    }
}

/* The roles a fused MoE reads, in argument order. */
#define N_WEIGHT_ROLES 6
static const w16_role_t weight_roles[N_WEIGHT_ROLES] = {
    W16_ROLE_QWEIGHT, W16_ROLE_SCALES, W16_ROLE_QZEROS, W16_ROLE_BIAS,
    W16_ROLE_G_IDX, W16_ROLE_SORT_IDX};

typedef struct mb {
    const w16_moe_request_t *req;
    w16_problem_t p;  /* the request's, with `ungated` from the activation */
    bool gated;
    int64_t v[2][W16_VAR_COUNT];        /* bound dims per operand */
    w16_layout_t lay[2][W16_ROLE_COUNT]; /* folded layouts */
    bool reads[2][W16_ROLE_COUNT];      /* roles this problem reads */
    int64_t shape[2][W16_ROLE_COUNT][W16_MAX_STORE_DIMS];
    wna16_dtype_t dtype[2][W16_ROLE_COUNT];
    /* Per operand: storage elements per 32-bit word when the K loop reads
     * qweight as words (word_elems), else 0; codes per such word. */
    int word_elems[2], word_codes[2];
    w16_moe_kernel_t *out;
    kir_kernel_t *k;
    kir_block_t *body; /* where statements go */
    w16_lower_t L;
    const kir_param_t *param[W16_MOE_ARG_COUNT];
    const char *fail;
} mb_t;

/* ---- checks and naming --------------------------------------------------- */

/* Act order: each K row's group from the g_idx layout; where the spec
 * stores K sorted by group (act_order_sort, Marlin), row j of the codes is
 * input channel perm[j] of the g_idx_sort_indices layout. */
static bool reads_role(const wna16_spec_t *s, const w16_problem_t *p,
                       w16_role_t r)
{
    switch (r) {
    case W16_ROLE_QWEIGHT: case W16_ROLE_SCALES: return true;
    case W16_ROLE_QZEROS: return p->zp;
    case W16_ROLE_BIAS: return p->bias;
    case W16_ROLE_G_IDX: return p->act_order;
    case W16_ROLE_SORT_IDX: return p->act_order && s->act_order_sort;
    default: return false;
    }
}

static w16_problem_t moe_problem(const w16_moe_request_t *req)
{
    w16_problem_t p = req->problem;
    p.ungated = !wna16_activation_is_gated(req->params.activation);
    return p;
}

wna16_status_t w16_moe_check(const w16_moe_request_t *req, wna16_error_t *err)
{
    const wna16_spec_t *s = req->backend;
    w16_problem_t p = moe_problem(req);
    const wna16_moe_params_t *mp = &req->params;
    if (!s->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s stores one tensor per "
                       "expert and projection; the generated fused MoE reads "
                       "stacked layouts", s->name);
    if (p.act_order && !s->layouts[W16_ROLE_G_IDX])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s stores no g_idx layout: "
                       "the generated fused MoE cannot read act-order weights "
                       "in it", s->name);
    if (p.act_order && s->act_order_sort && !s->layouts[W16_ROLE_SORT_IDX])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s stores act-order K "
                       "sorted (act_order_sort) but no g_idx_sort_indices "
                       "layout", s->name);
    if (!wna16_activation_name(mp->activation))
        return w16_err(err, WNA16_EINVAL, "moe: invalid activation %d",
                       (int)mp->activation);
    if (mp->act_dtype != WNA16_DTYPE_F16 && mp->act_dtype != WNA16_DTYPE_BF16)
        return w16_err(err, WNA16_EINVAL, "moe: activation dtype must be F16 "
                       "or BF16");
    if (req->numerics != WNA16_NUMERICS_F32 &&
        req->numerics != WNA16_NUMERICS_BF16_EXACT)
        return w16_err(err, WNA16_EUNSUPPORTED, "moe: the generated portable "
                       "kernels compute f32 or bf16-exact, not %s (the "
                       "dedicated CPU kernels' contract)",
                       wna16_numerics_name(req->numerics)
                           ? wna16_numerics_name(req->numerics) : "?");
    if (req->numerics == WNA16_NUMERICS_BF16_EXACT &&
        mp->act_dtype != WNA16_DTYPE_BF16)
        return w16_err(err, WNA16_EUNSUPPORTED, "moe: bf16-exact multiplies "
                       "bf16 activations; the activation dtype is %s",
                       wna16_dtype_name(mp->act_dtype));
    if (req->block_m < 1 || req->block_m > 16)
        return w16_err(err, WNA16_EINVAL, "moe: block size %d outside [1, 16]",
                       req->block_m);
    if (!req->batched && (req->topk < 1 || req->topk > 1024))
        return w16_err(err, WNA16_EUNSUPPORTED, "moe: topk = %d is outside "
                       "[1, 1024], what the generated kernels take", req->topk);
    for (int g = 0; g < 2; g++) {
        int64_t v[W16_VAR_COUNT];
        wna16_status_t st = w16_spec_bind(s, &p, (wna16_gemm_t)g, v, err);
        if (st != WNA16_OK)
            return st;
        for (int i = 0; i < N_WEIGHT_ROLES; i++) {
            w16_role_t r = weight_roles[i];
            if (!reads_role(s, &p, r))
                continue;
            const w16_layout_t *l = s->layouts[r];
            if (!w16_layout_present(l, v))
                return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout "
                               "for this layer (the layer has %s)", s->name,
                               w16_role_key(r), w16_role_doc(r));
            wna16_dtype_t d = req->dtype[g][r] ? req->dtype[g][r] : l->dtypes[0];
            bool listed = false;
            for (int j = 0; j < l->n_dtypes; j++)
                listed = listed || l->dtypes[j] == d;
            if (!listed)
                return w16_err(err, WNA16_EUNSUPPORTED, "%s: the %s layout does "
                               "not store %s", s->name, w16_role_key(r),
                               wna16_dtype_name(d));
            if ((r == W16_ROLE_QWEIGHT || r == W16_ROLE_QZEROS) &&
                w16_layout_code_bits(l, d, v) > 32)
                return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s codes wider "
                               "than 32 bits", s->name, w16_role_key(r));
            if ((r == W16_ROLE_SCALES || r == W16_ROLE_BIAS) &&
                d != WNA16_DTYPE_F16 && d != WNA16_DTYPE_BF16 &&
                d != WNA16_DTYPE_F32)
                return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s stored as %s",
                               s->name, w16_role_key(r), wna16_dtype_name(d));
        }
    }
    return WNA16_OK;
}

void w16_moe_kernel_name(char *out, size_t n, const w16_moe_request_t *req,
                         w16_moe_stage_t stage)
{
    const w16_problem_t *p = &req->problem;
    char gs[24];
    if (p->GS > 0)
        snprintf(gs, sizeof gs, "g%lld", (long long)p->GS);
    else
        snprintf(gs, sizeof gs, "gm1");
    bool bf16w = req->numerics == WNA16_NUMERICS_BF16_EXACT &&
                 (stage == W16_MOE_GEMM1 || stage == W16_MOE_GEMM2);
    snprintf(out, n, "wna16_moe_%s_%s_b%lld_%s_zp%d%s_%s_%s_bm%d%s%s%s",
             stage_names[stage], req->backend->name, (long long)p->BITS, gs,
             p->zp ? 1 : 0, p->bias ? "_bias" : "",
             wna16_activation_name(req->params.activation),
             req->params.act_dtype == WNA16_DTYPE_F16 ? "f16" : "bf16",
             req->block_m, req->batched ? "_batched" : "",
             req->device_route ? "_dev" : "", bf16w ? "_bf16x" : "");
}

/* ---- small IR helpers ---------------------------------------------------- */

static const kir_expr_t *mfail(mb_t *B, const char *why)
{
    if (!B->fail)
        B->fail = why;
    return NULL;
}

static const kir_expr_t *ik(mb_t *B, int64_t v) { return w16_ir_const(B->k, v); }
static const kir_expr_t *fk(mb_t *B, double v) { return kir_fconst(B->k, KIR_F32, v); }

static const kir_expr_t *bin(mb_t *B, kir_op_t op, const kir_expr_t *a,
                             const kir_expr_t *b)
{
    return kir_bin(B->k, op, a, b);
}

/* let a fresh variable = e in the current block; a reference to it. */
static const kir_expr_t *let(mb_t *B, const char *name, const kir_expr_t *e)
{
    if (!e)
        return mfail(B, B->k->broken ? B->k->broken : "missing value");
    if (e->op == KIR_OP_CONST || e->op == KIR_OP_VAR)
        return e;
    const kir_var_t *v = kir_var(B->k, name, e->type);
    if (!kir_let(B->k, B->body, v, e))
        return mfail(B, "out of memory");
    return kir_ref(B->k, v);
}

static const kir_param_t *arg(mb_t *B, w16_moe_arg_t a, kir_param_kind_t kind,
                              kir_type_t t, bool written)
{
    const kir_param_t *p = kir_param(B->k, arg_names[a], kind, t, written);
    if (!p) {
        mfail(B, "out of memory (parameters)");
        return NULL;
    }
    B->param[a] = p;
    B->out->param[a] = p->index;
    return p;
}

static const kir_expr_t *sarg(mb_t *B, w16_moe_arg_t a)
{
    return kir_pref(B->k, B->param[a]);
}

static const kir_expr_t *load(mb_t *B, w16_moe_arg_t a, const kir_expr_t *i)
{
    return kir_load(B->k, B->param[a], i);
}

static void store(mb_t *B, w16_moe_arg_t a, const kir_expr_t *i,
                  const kir_expr_t *v)
{
    if (!kir_store(B->k, B->body, B->param[a], i, v))
        mfail(B, B->k->broken ? B->k->broken : "ill-typed store");
}

/* i32 index array element -> i64 (sign-extended: -1 stays -1). */
static const kir_expr_t *load_i32(mb_t *B, w16_moe_arg_t a, const kir_expr_t *i)
{
    return kir_int_cast(B->k, KIR_I64, load(B, a, i), true);
}

static kir_type_t int_type_of(wna16_dtype_t d)
{
    switch (wna16_dtype_size(d)) {
    case 1: return KIR_I8;
    case 2: return KIR_I16;
    case 4: return KIR_I32;
    case 8: return KIR_I64;
    default: return KIR_VOID;
    }
}

/* ---- float formats ------------------------------------------------------- */

/* Stored float bits (an integer of the dtype's width) -> f32. bf16 is the
 * high half of an f32; both emitters convert f16 natively. */
static const kir_expr_t *to_f32(mb_t *B, wna16_dtype_t d, const kir_expr_t *bits)
{
    kir_kernel_t *k = B->k;
    switch (d) {
    case WNA16_DTYPE_F32:
        return kir_convert(k, KIR_OP_BITCAST, KIR_F32, bits);
    case WNA16_DTYPE_F16:
        return kir_convert(k, KIR_OP_FCONV, KIR_F32,
                           kir_convert(k, KIR_OP_BITCAST, KIR_F16, bits));
    case WNA16_DTYPE_BF16:
        return kir_convert(k, KIR_OP_BITCAST, KIR_F32,
                           bin(B, KIR_OP_SHL, kir_int_cast(k, KIR_I32, bits, false),
                               kir_const(k, KIR_I32, 16)));
    default:
        return mfail(B, "not a float dtype");
    }
}

/* f32 -> bf16 bits (i16), nearest even; a NaN stays a quiet NaN
 * (wna16_f32_to_bf16's rule). */
static const kir_expr_t *bf16_bits(mb_t *B, const kir_expr_t *f)
{
    kir_kernel_t *k = B->k;
    const kir_expr_t *u = let(B, "f32bits", kir_convert(k, KIR_OP_BITCAST,
                                                         KIR_I32, f));
#define I32(v) kir_const(k, KIR_I32, (v))
    const kir_expr_t *lsb = bin(B, KIR_OP_AND, bin(B, KIR_OP_LSHR, u, I32(16)),
                                I32(1));
    const kir_expr_t *rounded = bin(B, KIR_OP_LSHR,
        bin(B, KIR_OP_ADD, bin(B, KIR_OP_ADD, u, I32(0x7fff)), lsb), I32(16));
    const kir_expr_t *nan = bin(B, KIR_OP_ULT, I32(0x7f800000),
                                bin(B, KIR_OP_AND, u, I32(0x7fffffff)));
    const kir_expr_t *qnan = bin(B, KIR_OP_OR, bin(B, KIR_OP_LSHR, u, I32(16)),
                                 I32(0x40));
#undef I32
    return kir_int_cast(k, KIR_I16, kir_select(k, nan, qnan, rounded), false);
}

/* f32 -> bits (i16) of the activation dtype, nearest even. */
static const kir_expr_t *act_bits(mb_t *B, const kir_expr_t *f)
{
    if (B->req->params.act_dtype == WNA16_DTYPE_F16)
        return kir_convert(B->k, KIR_OP_BITCAST, KIR_I16,
                           kir_convert(B->k, KIR_OP_FCONV, KIR_F16, f));
    return bf16_bits(B, f);
}

/* R(f): f rounded to the activation dtype, as f32. */
static const kir_expr_t *round_act(mb_t *B, const kir_expr_t *f)
{
    return to_f32(B, B->req->params.act_dtype, act_bits(B, f));
}

/* ---- weights through the layout ------------------------------------------ */

static bool fold_layout(mb_t *B, const w16_layout_t *l, const int64_t *v,
                        w16_layout_t *f)
{
    w16_arena_t *a = &B->k->arena;
    *f = *l;
    bool ok = true;
    for (int d = 0; d < l->ndim; d++)
        ok = ok && (f->index[d] = w16_expr_fold(a, l->index[d], v));
    if (l->bit)
        ok = ok && (f->bit = w16_expr_fold(a, l->bit, v));
    if (l->decode)
        ok = ok && (f->decode = w16_expr_fold(a, l->decode, v));
    return ok;
}

static const kir_expr_t *lower(mb_t *B, const w16_expr_t *x, w16_range_t *r)
{
    const kir_expr_t *e = w16_lower(&B->L, x, r);
    return e ? e : mfail(B, B->L.failure);
}

/* Storage elements per 32-bit word in which operand g's K loop may read
 * its codes, or 0. Words need 4-byte aligned qweight buffers, codes that
 * fill their element, and a layout whose dimensions other than the last
 * do not depend on k while the last one and the bit offset depend on k
 * alone: then one pass over k in [0, KL) checks every row's order, namely
 * that read as little-endian 32-bit words (R elements each) code k sits
 * in word k / WS at bit (k % WS) * bits, WS = 32 / bits codes per word
 * (rows start on whole words). The CPU and CUDA targets are
 * little-endian. */
static int word_elems(mb_t *B, int g)
{
    const w16_layout_t *l = &B->lay[g][W16_ROLE_QWEIGHT];
    wna16_dtype_t d = B->dtype[g][W16_ROLE_QWEIGHT];
    const int64_t *v = B->v[g];
    int eb = (int)wna16_dtype_size(d) * 8;
    int cb = w16_layout_code_bits(l, d, v);
    int64_t KL = g == WNA16_GEMM_W13 ? B->p.H : B->p.I;
    if (B->req->qweight_align < 4 || l->ndim < 1 || eb < 8 || eb >= 32 ||
        32 % eb || cb < 1 || 32 % cb || w16_layout_slots(l, d, v) * cb != eb)
        return 0;
    int R = 32 / eb, WS = 32 / cb, last = l->ndim - 1;
    if (KL % WS || B->shape[g][W16_ROLE_QWEIGHT][last] % R)
        return 0;
    for (int i = 0; i < last; i++)
        if (w16_expr_uses(l->index[i], W16_VAR_k))
            return 0;
    const w16_expr_t *place[2] = {l->index[last], l->bit};
    for (int i = 0; i < 2; i++)
        if (place[i] && (w16_expr_uses(place[i], W16_VAR_e) ||
                         w16_expr_uses(place[i], W16_VAR_n)))
            return 0;
    int64_t vars[W16_VAR_COUNT];
    memcpy(vars, v, sizeof vars);
    vars[W16_VAR_e] = vars[W16_VAR_n] = 0;
    for (int64_t k = 0; k < KL; k++) {
        vars[W16_VAR_k] = k;
        int64_t ix, bit = 0;
        w16_eval_error_t ee = {0};
        if (!w16_expr_eval(place[0], vars, &ix, &ee) ||
            (place[1] && !w16_expr_eval(place[1], vars, &bit, &ee)) ||
            ix < 0 || ix / R != k / WS ||
            (ix % R) * eb + bit != (k % WS) * cb)
            return 0;
    }
    return R;
}

/* A logical coordinate: its IR value and largest value. */
typedef struct coord {
    const kir_expr_t *v;
    int64_t hi;
} coord_t;

/* The storage element of role r of operand g at coordinates c (the role's
 * order), widened to i64 without sign; *bit receives the code's bit offset
 * (i64) for packed codes. */
static const kir_expr_t *element(mb_t *B, int g, w16_role_t r,
                                 const coord_t *c, const kir_expr_t **bit)
{
    const w16_layout_t *l = &B->lay[g][r];
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(r, cv);
    w16_lower_clear_vars(&B->L);
    for (int i = 0; i < nc; i++)
        w16_lower_bind(&B->L, cv[i], c[i].v, 0, c[i].hi);
    const kir_expr_t *flat = ik(B, 0);
    for (int d = 0; d < l->ndim; d++) {
        const kir_expr_t *ix = lower(B, l->index[d], NULL);
        if (!ix)
            return NULL;
        flat = w16_ir_add(B->k, w16_ir_mul(B->k, flat,
                                           ik(B, B->shape[g][r][d])), ix);
    }
    if (bit)
        *bit = l->bit ? lower(B, l->bit, NULL) : ik(B, 0);
    w16_moe_arg_t a = w16_moe_weight_arg((wna16_gemm_t)g, r);
    return kir_int_cast(B->k, KIR_I64, load(B, a, flat), false);
}

/* The code of role r (qweight or qzeros) at c: extracted and decoded. The
 * decode may use the group's zero point z (NULL when not known). */
static const kir_expr_t *code(mb_t *B, int g, w16_role_t r, const coord_t *c,
                              const kir_expr_t *z)
{
    const w16_layout_t *l = &B->lay[g][r];
    const kir_expr_t *bit = NULL;
    const kir_expr_t *v = element(B, g, r, c, &bit);
    if (!v || !bit)
        return NULL;
    if (!(bit->op == KIR_OP_CONST && bit->ival == 0))
        v = bin(B, KIR_OP_LSHR, v, bit);
    int cb = w16_layout_code_bits(l, B->dtype[g][r], B->v[g]);
    if (cb < 64)
        v = bin(B, KIR_OP_AND, v, ik(B, (INT64_C(1) << cb) - 1));
    if (l->decode) {
        w16_lower_clear_vars(&B->L);
        w16_lower_bind(&B->L, W16_VAR_c, v, 0, (INT64_C(1) << cb) - 1);
        if (w16_expr_uses(l->decode, W16_VAR_z)) {
            if (!z)
                return mfail(B, "a zero-point decode needs the zero point");
            w16_lower_bind(&B->L, W16_VAR_z, z, 0,
                           (INT64_C(1) << B->p.BITS) - 1);
        }
        v = lower(B, l->decode, NULL);
    }
    return v;
}

/* Scale or bias at c, as f32. */
static const kir_expr_t *float_at(mb_t *B, int g, w16_role_t r,
                                  const coord_t *c)
{
    const kir_expr_t *v = element(B, g, r, c, NULL);
    if (!v)
        return NULL;
    wna16_dtype_t d = B->dtype[g][r];
    return to_f32(B, d, kir_int_cast(B->k, int_type_of(d), v, false));
}

/* Per-group factors of one weight row: zero point (i64), scale (f32) and
 * -zero * scale (f32). */
typedef struct group_q {
    const kir_expr_t *zero, *scale, *neg_zs;
} group_q_t;

static group_q_t group_at(mb_t *B, int g, const coord_t *e, const coord_t *n,
                          const kir_expr_t *grp, const char *tag)
{
    group_q_t q = {0};
    coord_t c[3] = {*e, {grp, B->v[g][W16_VAR_G] - 1}, *n};
    char name[32];
    snprintf(name, sizeof name, "z_%s", tag);
    q.zero = B->p.zp ? let(B, name, code(B, g, W16_ROLE_QZEROS, c, NULL))
                     : ik(B, INT64_C(1) << (B->p.BITS - 1));
    snprintf(name, sizeof name, "s_%s", tag);
    q.scale = let(B, name, float_at(B, g, W16_ROLE_SCALES, c));
    snprintf(name, sizeof name, "nzs_%s", tag);
    const kir_expr_t *zf = kir_convert(B->k, KIR_OP_SITOF, KIR_F32,
                                       kir_int_cast(B->k, KIR_I32, q.zero, false));
    q.neg_zs = let(B, name, bin(B, KIR_OP_FSUB, fk(B, 0.0),
                                bin(B, KIR_OP_FMUL, zf, q.scale)));
    return q;
}

/* (code - zero) * scale from the code as f32 (see weight), rounded to
 * bf16 under bf16-exact: the weight Marlin's dequantization hands its
 * tensor cores. */
static const kir_expr_t *dequant(mb_t *B, const kir_expr_t *cf, group_q_t q)
{
    const kir_expr_t *w = bin(B, KIR_OP_FADD, bin(B, KIR_OP_FMUL, cf, q.scale),
                              q.neg_zs);
    if (B->req->numerics != WNA16_NUMERICS_BF16_EXACT)
        return w;
    return to_f32(B, WNA16_DTYPE_BF16, bf16_bits(B, w));
}

/* (code - zero) * scale at (e, n, k), f32, computed as code * scale +
 * (-zero * scale): one fused multiply-add per weight after the int-to-float
 * conversion instead of a subtraction, a conversion and a product. Equal
 * to the reference's value: code * scale and zero * scale are exact in
 * float32 (8-bit codes times a 16-bit float's 11 significant bits), so the
 * sum rounds once, as (code - zero) * scale does (f32 scales: within one
 * rounding). */
static const kir_expr_t *weight(mb_t *B, int g, const coord_t *e,
                                const coord_t *n, const kir_expr_t *k,
                                group_q_t q)
{
    coord_t c[3] = {*e, *n, {k, B->v[g][W16_VAR_K] - 1}};
    const kir_expr_t *qc = code(B, g, W16_ROLE_QWEIGHT, c, q.zero);
    const kir_expr_t *qf = kir_convert(B->k, KIR_OP_SITOF, KIR_F32,
                                       kir_int_cast(B->k, KIR_I32, qc, false));
    return dequant(B, qf, q);
}

/* Word kw (i32) of the codes of row (e, n) of operand g, when the K loop
 * reads words (word_elems): the row's first element, from the layout's
 * dimensions but the last, in words, plus kw. */
static const kir_expr_t *word_at(mb_t *B, int g, const coord_t *e,
                                 const coord_t *n, const kir_expr_t *kw)
{
    const w16_layout_t *l = &B->lay[g][W16_ROLE_QWEIGHT];
    int last = l->ndim - 1;
    w16_lower_clear_vars(&B->L);
    w16_lower_bind(&B->L, W16_VAR_e, e->v, 0, e->hi);
    w16_lower_bind(&B->L, W16_VAR_n, n->v, 0, n->hi);
    w16_lower_bind(&B->L, W16_VAR_k, ik(B, 0), 0, 0);
    const kir_expr_t *row = ik(B, 0);
    for (int d = 0; d < last; d++) {
        const kir_expr_t *ix = lower(B, l->index[d], NULL);
        if (!ix)
            return NULL;
        row = w16_ir_add(B->k, w16_ir_mul(B->k, row,
                                          ik(B, B->shape[g][W16_ROLE_QWEIGHT][d])),
                         ix);
    }
    int64_t words = B->shape[g][W16_ROLE_QWEIGHT][last] / B->word_elems[g];
    w16_moe_arg_t a = w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QWEIGHT);
    return load(B, a, w16_ir_add(B->k, w16_ir_mul(B->k, row, ik(B, words)), kw));
}

/* Code j of a word (i32, bits j*cb and up), decoded, as i32. The mask is
 * kept on the top code too: the CPU emitter turns `sitof((w & 15) - c)`
 * into a table lookup, which reads only the low four bits. */
static const kir_expr_t *word_code(mb_t *B, int g, const kir_expr_t *word,
                                   int j, const kir_expr_t *z)
{
    const w16_layout_t *l = &B->lay[g][W16_ROLE_QWEIGHT];
    int cb = 32 / B->word_codes[g];
    kir_kernel_t *k = B->k;
    const kir_expr_t *v = word;
    if (j)
        v = bin(B, KIR_OP_LSHR, v, kir_const(k, KIR_I32, j * cb));
    v = bin(B, KIR_OP_AND, v, kir_const(k, KIR_I32, (INT64_C(1) << cb) - 1));
    if (!l->decode)
        return v;
    w16_lower_clear_vars(&B->L);
    w16_lower_bind(&B->L, W16_VAR_c, kir_int_cast(k, KIR_I64, v, false), 0,
                   (INT64_C(1) << cb) - 1);
    if (w16_expr_uses(l->decode, W16_VAR_z)) {
        if (!z)
            return mfail(B, "a zero-point decode needs the zero point");
        w16_lower_bind(&B->L, W16_VAR_z, z, 0, (INT64_C(1) << B->p.BITS) - 1);
    }
    return kir_int_cast(k, KIR_I32, lower(B, l->decode, NULL), false);
}

/* ---- activations --------------------------------------------------------- */

/* min(x, hi), NaN-preserving (x > hi ? hi : x). */
static const kir_expr_t *clamp_max(mb_t *B, const kir_expr_t *x, double hi)
{
    if (isinf(hi))
        return x;
    return kir_select(B->k, bin(B, KIR_OP_FLT, fk(B, hi), x), fk(B, hi), x);
}

/* clamp(x, -lim, lim), NaN-preserving. */
static const kir_expr_t *clamp_sym(mb_t *B, const kir_expr_t *x, double lim)
{
    if (isinf(lim))
        return x;
    x = let(B, "clamped", clamp_max(B, x, lim));
    return kir_select(B->k, bin(B, KIR_OP_FLT, x, fk(B, -lim)), fk(B, -lim), x);
}

/* 1 / (1 + exp(-x)) */
static const kir_expr_t *sigmoid(mb_t *B, const kir_expr_t *x)
{
    const kir_expr_t *ex = kir_un(B->k, KIR_OP_FEXP,
                                  bin(B, KIR_OP_FSUB, fk(B, 0.0), x));
    return bin(B, KIR_OP_FDIV, fk(B, 1.0), bin(B, KIR_OP_FADD, fk(B, 1.0), ex));
}

static const kir_expr_t *silu(mb_t *B, const kir_expr_t *x)
{
    x = let(B, "silu_x", x);
    return bin(B, KIR_OP_FMUL, x, sigmoid(B, x));
}

static const kir_expr_t *gelu(mb_t *B, const kir_expr_t *x)
{
    x = let(B, "gelu_x", x);
    const kir_expr_t *erf = kir_un(B->k, KIR_OP_FERF,
                                   bin(B, KIR_OP_FMUL, x, fk(B, 0.70710678118654752440)));
    return bin(B, KIR_OP_FMUL, bin(B, KIR_OP_FMUL, fk(B, 0.5), x),
               bin(B, KIR_OP_FADD, fk(B, 1.0), erf));
}

static const kir_expr_t *gelu_tanh(mb_t *B, const kir_expr_t *x)
{
    x = let(B, "gelu_x", x);
    const kir_expr_t *x3 = bin(B, KIR_OP_FMUL, x, bin(B, KIR_OP_FMUL, x, x));
    const kir_expr_t *in = bin(B, KIR_OP_FMUL, fk(B, 0.79788456080286535588),
                               bin(B, KIR_OP_FADD, x,
                                   bin(B, KIR_OP_FMUL, fk(B, 0.044715), x3)));
    return bin(B, KIR_OP_FMUL, bin(B, KIR_OP_FMUL, fk(B, 0.5), x),
               bin(B, KIR_OP_FADD, fk(B, 1.0), kir_un(B->k, KIR_OP_FTANH, in)));
}

/* act(g, u) in f32 as include/wna16.h defines it (u unused when not
 * gated). */
static const kir_expr_t *activation(mb_t *B, const kir_expr_t *g,
                                    const kir_expr_t *u)
{
    const wna16_moe_params_t *p = &B->req->params;
    double lim = p->swiglu_limit;
    switch (p->activation) {
    case WNA16_ACT_SILU: return bin(B, KIR_OP_FMUL, silu(B, g), u);
    case WNA16_ACT_GELU: return bin(B, KIR_OP_FMUL, gelu(B, g), u);
    case WNA16_ACT_GELU_TANH: return bin(B, KIR_OP_FMUL, gelu_tanh(B, g), u);
    case WNA16_ACT_SWIGLUOAI: {
        const kir_expr_t *gc = let(B, "gc", clamp_max(B, g, lim));
        const kir_expr_t *uc = clamp_sym(B, u, lim);
        const kir_expr_t *sg = sigmoid(B, bin(B, KIR_OP_FMUL,
                                              fk(B, p->swiglu_alpha), gc));
        return bin(B, KIR_OP_FMUL,
                   bin(B, KIR_OP_FMUL,
                       bin(B, KIR_OP_FADD, uc, fk(B, p->swiglu_beta)), gc), sg);
    }
    case WNA16_ACT_SWIGLUSTEP:
        return bin(B, KIR_OP_FMUL, clamp_max(B, silu(B, g), lim),
                   clamp_sym(B, u, lim));
    case WNA16_ACT_SILU_NO_MUL: return silu(B, g);
    case WNA16_ACT_GELU_NO_MUL: return gelu(B, g);
    case WNA16_ACT_RELU2_NO_MUL: {
        /* x > 0 ? x * x : (x <= 0 ? 0 : x), so a NaN stays NaN */
        const kir_expr_t *x = let(B, "relu_x", g);
        return kir_select(B->k, bin(B, KIR_OP_FLT, fk(B, 0.0), x),
                          bin(B, KIR_OP_FMUL, x, x),
                          kir_select(B->k, bin(B, KIR_OP_FLE, x, fk(B, 0.0)),
                                     fk(B, 0.0), x));
    }
    default:
        return mfail(B, "unknown activation");
    }
}

/* ---- kernel skeleton ----------------------------------------------------- */

/* Splits the workgroup id into (major, tile) and the lane's channel in
 * the tile; returns when the channel is past `extent`. */
static const kir_expr_t *tile_channel(mb_t *B, int64_t extent,
                                      const kir_expr_t **major)
{
    kir_kernel_t *k = B->k;
    int64_t tiles = (extent + k->lanes - 1) / k->lanes;
    B->out->tiles = tiles;
    const kir_expr_t *gid = let(B, "gid", kir_builtin(k, KIR_OP_GROUP_ID));
    w16_range_t rg = {0, INT64_MAX / 2};
    *major = let(B, "major", w16_ir_floordiv(&B->L, gid, tiles, rg));
    const kir_expr_t *tile = w16_ir_floormod(&B->L, gid, tiles, rg);
    const kir_expr_t *ch = let(B, "ch", w16_ir_add(k,
        w16_ir_mul(k, tile, ik(B, k->lanes)),
        kir_int_cast(k, KIR_I64, kir_builtin(k, KIR_OP_LANE_ID), false)));
    if (extent % k->lanes) {
        kir_stmt_t *s = kir_if(k, B->body, bin(B, KIR_OP_SLE, ik(B, extent), ch));
        if (!s || !kir_return(k, &s->body))
            return mfail(B, "out of memory");
    }
    return ch;
}

static wna16_status_t setup(mb_t *B, wna16_context_t *ctx,
                            const w16_moe_request_t *req, w16_moe_stage_t stage,
                            w16_moe_kernel_t *out, wna16_error_t *err)
{
    memset(B, 0, sizeof *B);
    memset(out, 0, sizeof *out);
    for (int a = 0; a < W16_MOE_ARG_COUNT; a++)
        out->param[a] = -1;
    out->stage = stage;
    B->req = req;
    B->out = out;
    wna16_status_t st = w16_moe_check(req, err);
    if (st != WNA16_OK)
        return st;
    B->p = moe_problem(req);
    B->gated = !B->p.ungated;
    char name[200];
    w16_moe_kernel_name(name, sizeof name, req, stage);
    bool gemm = stage == W16_MOE_GEMM1 || stage == W16_MOE_GEMM2;
    int lanes = gemm ? (req->lanes > 0 ? req->lanes : 16) : 64;
    B->k = out->kernel = kir_kernel_new(ctx, name, lanes);
    if (!B->k)
        return w16_err_nomem(err, "creating a fused-MoE kernel");
    B->k->fp_reassoc = true;
    B->body = &B->k->body;
    w16_lower_init(&B->L, B->k);
    for (int g = 0; g < 2; g++) {
        if ((st = w16_spec_bind(req->backend, &B->p, (wna16_gemm_t)g, B->v[g],
                                err)) != WNA16_OK)
            return st;
        for (int i = 0; i < N_WEIGHT_ROLES; i++) {
            w16_role_t r = weight_roles[i];
            if (!(B->reads[g][r] = reads_role(req->backend, &B->p, r)))
                continue;
            const w16_layout_t *l = req->backend->layouts[r];
            B->dtype[g][r] = req->dtype[g][r] ? req->dtype[g][r] : l->dtypes[0];
            if (!fold_layout(B, l, B->v[g], &B->lay[g][r]))
                return w16_err_nomem(err, "specializing a layout");
            if ((st = w16_layout_shape(l, B->v[g], B->shape[g][r], err)) !=
                WNA16_OK)
                return st;
        }
        /* act order reads K rows one by one (their groups and inputs
         * through g_idx and the permutation), never as words */
        if (!B->p.act_order && (B->word_elems[g] = word_elems(B, g)))
            B->word_codes[g] = 32 / w16_layout_code_bits(
                &B->lay[g][W16_ROLE_QWEIGHT], B->dtype[g][W16_ROLE_QWEIGHT],
                B->v[g]);
    }
    return WNA16_OK;
}

static wna16_status_t finish(mb_t *B, const char *comment, wna16_error_t *err)
{
    B->k->comment = comment;
    if (B->fail || B->k->broken)
        return w16_err(err, WNA16_EUNSUPPORTED, "cannot generate %s: %s",
                       B->k->name, B->fail ? B->fail : B->k->broken);
    return kir_verify(B->k, err);
}

static void declare_weights(mb_t *B, int g)
{
    for (int i = 0; i < N_WEIGHT_ROLES; i++) {
        w16_role_t r = weight_roles[i];
        if (B->reads[g][r])
            arg(B, w16_moe_weight_arg((wna16_gemm_t)g, r), KIR_PARAM_BUFFER,
                r == W16_ROLE_QWEIGHT && B->word_elems[g]
                    ? KIR_I32 : int_type_of(B->dtype[g][r]), false);
    }
}

/* The K step of operand g's GEMM: the codes of one 32-bit word when the
 * K loop reads words, else the code slots of one storage element (two
 * 4-bit codes per byte) when they divide the logical K (else 1); unrolled
 * in the K loop. */
static int k_step(mb_t *B, int g)
{
    if (B->word_elems[g])
        return B->word_codes[g];
    int64_t KL = g == WNA16_GEMM_W13 ? B->p.H : B->p.I;
    int S = w16_layout_slots(&B->lay[g][W16_ROLE_QWEIGHT],
                             B->dtype[g][W16_ROLE_QWEIGHT], B->v[g]);
    return S >= 1 && KL % S == 0 ? S : 1;
}

/* Where input channel k of a row of x (or a) is kept: slot-major for a K
 * step of S, k = kc*S + s at s*(KL/S) + kc, so that the GEMM reads each
 * slot's inputs with consecutive loads (no deinterleaving shuffles). */
static const kir_expr_t *slot_major(mb_t *B, const kir_expr_t *k, int S,
                                    int64_t KL)
{
    if (S == 1)
        return k;
    w16_range_t rk = {0, KL - 1};
    return w16_ir_add(B->k, w16_ir_mul(B->k, w16_ir_floormod(&B->L, k, S, rk),
                                       ik(B, KL / S)),
                      w16_ir_floordiv(&B->L, k, S, rk));
}

/* Does the router weight scale the input (x = R(x * R(w)))? */
static bool weight_on_input(const w16_moe_request_t *r)
{
    return r->params.apply_router_weight_on_input &&
           (!r->batched || r->batched_weights);
}

/* ---- input --------------------------------------------------------------- */

static void build_input(mb_t *B)
{
    const w16_moe_request_t *r = B->req;
    kir_kernel_t *k = B->k;
    int64_t H = B->p.H;
    int S = k_step(B, WNA16_GEMM_W13);
    bool on_input = weight_on_input(r);
    arg(B, W16_MOE_ARG_HIDDEN, KIR_PARAM_BUFFER, KIR_I16, false);
    if (on_input)
        arg(B, W16_MOE_ARG_TOPK_WEIGHTS, KIR_PARAM_BUFFER, KIR_F32, false);
    arg(B, W16_MOE_ARG_X, KIR_PARAM_BUFFER, KIR_F32, true);
    if (B->fail)
        return;
    /* a lane converts the S inputs of one K step and stores them
     * slot-major: consecutive lanes store consecutive floats */
    const kir_expr_t *row;
    const kir_expr_t *kc = tile_channel(B, H / S, &row);
    if (!kc)
        return;
    /* per-slot rows (weight on the input, standard format) read their
     * token's hidden row */
    const kir_expr_t *src = row;
    if (on_input && !r->batched)
        src = w16_ir_floordiv(&B->L, row, r->topk, (w16_range_t){0, INT64_MAX / 2});
    const kir_expr_t *in = let(B, "in", w16_ir_mul(k, src, ik(B, H)));
    const kir_expr_t *at = let(B, "at", w16_ir_mul(k, row, ik(B, H)));
    const kir_expr_t *w = on_input
        ? let(B, "w", round_act(B, load(B, W16_MOE_ARG_TOPK_WEIGHTS, row))) : NULL;
    for (int s = 0; s < S && !B->fail; s++) {
        const kir_expr_t *kk = w16_ir_add(k, w16_ir_mul(k, kc, ik(B, S)), ik(B, s));
        const kir_expr_t *x = to_f32(B, r->params.act_dtype,
                                     load(B, W16_MOE_ARG_HIDDEN, w16_ir_add(k, in, kk)));
        if (on_input)
            x = round_act(B, bin(B, KIR_OP_FMUL, x, w));
        store(B, W16_MOE_ARG_X, w16_ir_add(k, at, w16_ir_add(k, ik(B, s * (H / S)), kc)),
              x);
    }
}

/* ---- the GEMMs ----------------------------------------------------------- */

/* One slot of a block: its id, whether it is a real slot, and where its
 * input row starts. */
typedef struct slot {
    const kir_expr_t *id, *valid, *base;
} slot_t;

/* Most weight rows one lane takes (channels times gate/up). */
#define MAX_LANE_ROWS 2

/* One lane's work: up to MAX_LANE_ROWS weight rows of one expert. */
typedef struct lane_rows {
    coord_t n[MAX_LANE_ROWS];
    int count;
} lane_rows_t;

/* The K loop of one block reading 32-bit words of codes (word_elems):
 * per word and weight row j, d = code - zero as an exact small integer
 * converted to float, p[t][j] = sum over the word's WS codes of
 * x[t][k] * d, then acc[t][j] += p[t][j] * scale, one multiplication by
 * the scale per word instead of one per code. The word's codes share
 * their group when WS divides the group size; otherwise each code is
 * dequantized with its own group as in k_loop, and so is every code
 * under bf16-exact (each weight rounded to bf16). The inputs are
 * slot-major for WS (slot_major): each slot's are consecutive. */
static void k_loop_words(mb_t *B, int g, const coord_t *e,
                         const lane_rows_t *lr, const slot_t *s, int BM,
                         const kir_var_t *acc[][MAX_LANE_ROWS],
                         w16_moe_arg_t in, int64_t KL)
{
    kir_kernel_t *k = B->k;
    int rows = lr->count, WS = B->word_codes[g];
    int64_t GSE = B->v[g][W16_VAR_GSE], KW = KL / WS;
    const kir_var_t *kw = kir_var(k, "kw", KIR_I64);
    kir_stmt_t *loop = kir_for(k, B->body, kw, ik(B, 0), ik(B, KW), 1);
    if (!loop) {
        mfail(B, "out of memory");
        return;
    }
    kir_block_t *outer = B->body;
    B->body = &loop->body;
    const kir_expr_t *k0 = w16_ir_mul(k, kir_ref(k, kw), ik(B, WS));
    w16_range_t rk = {0, KL - 1};
    bool shared = GSE % WS == 0;
    /* the scale applied once a word: not under bf16-exact, where every
     * weight is rounded on its own */
    bool fold = shared && B->req->numerics != WNA16_NUMERICS_BF16_EXACT;
    group_q_t q[MAX_LANE_ROWS] = {{0}};
    const kir_expr_t *word[MAX_LANE_ROWS];
    const kir_var_t *p[16][MAX_LANE_ROWS];
    char name[32];
    for (int j = 0; j < rows; j++) {
        snprintf(name, sizeof name, "r%d", j);
        if (shared)
            q[j] = group_at(B, g, e, &lr->n[j],
                            w16_ir_floordiv(&B->L, k0, GSE, rk), name);
        snprintf(name, sizeof name, "word%d", j);
        word[j] = let(B, name, word_at(B, g, e, &lr->n[j], kir_ref(k, kw)));
        for (int t = 0; fold && t < BM; t++) {
            snprintf(name, sizeof name, "p%d_%d", t, j);
            p[t][j] = kir_var(k, name, KIR_F32);
        }
    }
    for (int sl = 0; sl < WS && !B->fail; sl++) {
        const kir_expr_t *kk = w16_ir_add(k, k0, ik(B, sl));
        const kir_expr_t *w[MAX_LANE_ROWS];
        for (int j = 0; j < rows; j++) {
            snprintf(name, sizeof name, "r%d", j);
            if (!shared)
                q[j] = group_at(B, g, e, &lr->n[j],
                                w16_ir_floordiv(&B->L, kk, GSE, rk), name);
            const kir_expr_t *c = word_code(B, g, word[j], sl, q[j].zero);
            snprintf(name, sizeof name, "w%d_%d", sl, j);
            if (fold) {
                /* code - zero: small integers, exact in float */
                w[j] = let(B, name, kir_convert(k, KIR_OP_SITOF, KIR_F32,
                    bin(B, KIR_OP_SUB, c, kir_int_cast(k, KIR_I32, q[j].zero,
                                                       false))));
            } else {
                const kir_expr_t *cf = kir_convert(k, KIR_OP_SITOF, KIR_F32, c);
                w[j] = let(B, name, dequant(B, cf, q[j]));
            }
        }
        for (int t = 0; t < BM; t++) {
            snprintf(name, sizeof name, "x%d_%d", sl, t);
            const kir_expr_t *xv = let(B, name, load(B, in, w16_ir_add(k, s[t].base,
                w16_ir_add(k, kir_ref(k, kw), ik(B, sl * KW)))));
            for (int j = 0; j < rows; j++) {
                const kir_expr_t *prod = bin(B, KIR_OP_FMUL, xv, w[j]);
                if (!fold)
                    kir_assign(k, B->body, acc[t][j],
                               bin(B, KIR_OP_FADD, kir_ref(k, acc[t][j]), prod));
                else if (sl == 0)
                    kir_let(k, B->body, p[t][j], prod);
                else
                    kir_assign(k, B->body, p[t][j],
                               bin(B, KIR_OP_FADD, kir_ref(k, p[t][j]), prod));
            }
        }
    }
    for (int t = 0; fold && t < BM; t++)
        for (int j = 0; j < rows; j++)
            kir_assign(k, B->body, acc[t][j],
                       bin(B, KIR_OP_FADD, kir_ref(k, acc[t][j]),
                           bin(B, KIR_OP_FMUL, kir_ref(k, p[t][j]), q[j].scale)));
    B->body = outer;
}

/* The K loop of one block: acc[t][j] += x[t][k] * w[j][k] over the
 * block's slots t and the lane's weight rows j. Each weight is dequantized
 * once for all slots; each input once for all rows. */
static void k_loop(mb_t *B, int g, const coord_t *e, const lane_rows_t *lr,
                   const slot_t *s, int BM,
                   const kir_var_t *acc[][MAX_LANE_ROWS], w16_moe_arg_t in,
                   int64_t KL)
{
    kir_kernel_t *k = B->k;
    int rows = lr->count;
    if (B->word_elems[g]) {
        k_loop_words(B, g, e, lr, s, BM, acc, in, KL);
        return;
    }
    /* K in whole storage elements: S code slots unrolled per step */
    int S = k_step(B, g);
    int64_t GSE = B->v[g][W16_VAR_GSE];
    const kir_var_t *kc = kir_var(k, "kc", KIR_I64);
    kir_stmt_t *loop = kir_for(k, B->body, kc, ik(B, 0), ik(B, KL / S), 1);
    if (!loop) {
        mfail(B, "out of memory");
        return;
    }
    kir_block_t *outer = B->body;
    B->body = &loop->body;
    const kir_expr_t *k0 = w16_ir_mul(k, kir_ref(k, kc), ik(B, S));
    w16_range_t rk = {0, KL - 1};
    /* one zero/scale load per storage element when its codes share a group
     * (never under act order: each K row has its own from g_idx) */
    group_q_t q[MAX_LANE_ROWS] = {{0}};
    bool act = B->p.act_order, sorted = B->reads[g][W16_ROLE_SORT_IDX];
    bool shared = GSE % S == 0 && !act;
    char tag[16];
    for (int j = 0; shared && j < rows; j++) {
        snprintf(tag, sizeof tag, "r%d", j);
        q[j] = group_at(B, g, e, &lr->n[j], w16_ir_floordiv(&B->L, k0, GSE, rk), tag);
    }
    for (int sl = 0; sl < S && !B->fail; sl++) {
        const kir_expr_t *kk = w16_ir_add(k, k0, ik(B, sl));
        const kir_expr_t *w[MAX_LANE_ROWS];
        /* act order: row kk's group (g_idx), and its input channel when K
         * is stored sorted (the permutation; checked to be one, and g_idx
         * to hold groups, when the layer was created) */
        const kir_expr_t *grp = NULL, *xat = NULL;
        coord_t ck[2] = {*e, {kk, KL - 1}};
        if (act) {
            snprintf(tag, sizeof tag, "gi%d", sl);
            grp = let(B, tag, element(B, g, W16_ROLE_G_IDX, ck, NULL));
        }
        if (act && sorted) {
            snprintf(tag, sizeof tag, "pk%d", sl);
            xat = let(B, tag, slot_major(B, element(B, g, W16_ROLE_SORT_IDX,
                                                    ck, NULL), S, KL));
        }
        for (int j = 0; j < rows; j++) {
            snprintf(tag, sizeof tag, "r%d", j);
            if (!shared)
                q[j] = group_at(B, g, e, &lr->n[j],
                                grp ? grp : w16_ir_floordiv(&B->L, kk, GSE, rk),
                                tag);
            char name[24];
            snprintf(name, sizeof name, "w%d_%d", sl, j);
            w[j] = let(B, name, weight(B, g, e, &lr->n[j], kk, q[j]));
        }
        /* the inputs are slot-major (slot_major): consecutive loads */
        for (int t = 0; t < BM; t++) {
            char name[24];
            snprintf(name, sizeof name, "x%d_%d", sl, t);
            const kir_expr_t *xo = xat ? xat
                : w16_ir_add(k, kir_ref(k, kc), ik(B, sl * (KL / S)));
            const kir_expr_t *xv = let(B, name, load(B, in,
                                                     w16_ir_add(k, s[t].base, xo)));
            for (int j = 0; j < rows; j++)
                kir_assign(k, B->body, acc[t][j],
                           bin(B, KIR_OP_FADD, kir_ref(k, acc[t][j]),
                               bin(B, KIR_OP_FMUL, xv, w[j])));
        }
    }
    B->body = outer;
}

/* Output channels per lane: enough for two weight rows (gate and up of
 * one channel, or two channels of gemm2), when they divide the channel
 * count. Two rows share each input load between two rows of weights;
 * measured on znver4 (AVX-512), more rows per lane lose: the extra weight
 * streams and the dequantization temporaries cost more than the input
 * loads they save. */
static int lane_channels(int64_t NC, int per_channel)
{
    int c = per_channel >= 2 ? 1 : 2;
    return NC % c == 0 ? c : 1;
}

/* A workgroup takes one expert's run of blocks (every block of its routed
 * slots) and a tile of output channels; a lane walks the run block by
 * block, so the expert's weights come from memory once per call and from
 * the lane's cache for the run's further blocks. */
static void build_gemm(mb_t *B, bool first)
{
    const w16_moe_request_t *r = B->req;
    kir_kernel_t *k = B->k;
    int g = first ? WNA16_GEMM_W13 : WNA16_GEMM_W2;
    int64_t H = B->p.H, I = B->p.I, IP = B->v[g][W16_VAR_IP];
    /* logical sizes: channels this kernel writes, K it reduces over (the
     * row length of its input) */
    int64_t NC = first ? I : H, KL = first ? H : I;
    int BM = r->block_m;
    int per_channel = first && B->gated ? 2 : 1; /* gate and up rows */
    int CH = lane_channels(NC, per_channel);
    arg(B, W16_MOE_ARG_RUNS, KIR_PARAM_BUFFER, KIR_I32, false);
    arg(B, W16_MOE_ARG_SORTED, KIR_PARAM_BUFFER, KIR_I32, false);
    w16_moe_arg_t in = first ? W16_MOE_ARG_X : W16_MOE_ARG_A;
    w16_moe_arg_t outa = first ? W16_MOE_ARG_A : W16_MOE_ARG_Y;
    arg(B, in, KIR_PARAM_BUFFER, KIR_F32, false);
    declare_weights(B, g);
    arg(B, outa, KIR_PARAM_BUFFER, KIR_F32, true);
    if (B->fail)
        return;
    const kir_expr_t *run;
    const kir_expr_t *cg = tile_channel(B, NC / CH, &run);
    if (!cg)
        return;
    if (r->device_route) { /* device routing: past its block count, exit */
        arg(B, W16_MOE_ARG_ROUTE_INFO, KIR_PARAM_BUFFER, KIR_I32, false);
        kir_stmt_t *past = kir_if(k, B->body, bin(B, KIR_OP_SLE,
            load_i32(B, W16_MOE_ARG_ROUTE_INFO, ik(B, 1)), run));
        if (!past || !kir_return(k, &past->body))
            mfail(B, "out of memory");
    }
    /* the run: sorted positions [p0, p1), all of expert e */
    const kir_expr_t *r3 = let(B, "r3", w16_ir_mul(k, run, ik(B, 3)));
    const kir_expr_t *p0 = let(B, "p0", load_i32(B, W16_MOE_ARG_RUNS, r3));
    const kir_expr_t *p1 = let(B, "p1", load_i32(B, W16_MOE_ARG_RUNS,
                                                 w16_ir_add(k, r3, ik(B, 1))));
    coord_t e = {let(B, "e", load_i32(B, W16_MOE_ARG_RUNS,
                                      w16_ir_add(k, r3, ik(B, 2)))),
                 B->p.E - 1};
    /* the lane's channels c and rows: c (gate or down) and IP + c (up) */
    const kir_expr_t *ch[4];
    lane_rows_t lr = {.count = 0};
    for (int c = 0; c < CH; c++) {
        char name[16];
        snprintf(name, sizeof name, "ch%d", c);
        ch[c] = let(B, name, w16_ir_add(k, w16_ir_mul(k, cg, ik(B, CH)), ik(B, c)));
        for (int j = 0; j < per_channel; j++)
            lr.n[lr.count++] = j ? (coord_t){w16_ir_add(k, ch[c], ik(B, IP)), 2 * IP - 1}
                                 : (coord_t){ch[c], NC - 1};
    }
    const kir_expr_t *bias[MAX_LANE_ROWS] = {NULL};
    for (int j = 0; B->p.bias && j < lr.count; j++) {
        coord_t c[2] = {e, lr.n[j]};
        bias[j] = let(B, "bias", float_at(B, g, W16_ROLE_BIAS, c));
    }
    /* where each channel goes in its output row: gemm2 reads a slot-major
     * for its own K step */
    const kir_expr_t *at[4];
    for (int c = 0; c < CH; c++)
        at[c] = first ? let(B, "at", slot_major(B, ch[c], k_step(B, WNA16_GEMM_W2), I))
                      : ch[c];
    const kir_var_t *pos = kir_var(k, "pos", KIR_I64);
    kir_stmt_t *bloop = kir_for(k, B->body, pos, p0, p1, BM);
    if (!bloop) {
        mfail(B, "out of memory");
        return;
    }
    kir_block_t *top = B->body;
    B->body = &bloop->body;
    /* the input row of a slot: x rows are tokens unless the router weight
     * made them per slot (or the format is batched) */
    int64_t xdiv = first && !r->batched && !weight_on_input(r) ? r->topk : 1;
    slot_t s[16];
    const kir_var_t *acc[16][MAX_LANE_ROWS];
    for (int t = 0; t < BM; t++) {
        char name[16];
        const kir_expr_t *at_t = w16_ir_add(k, kir_ref(k, pos), ik(B, t));
        snprintf(name, sizeof name, "valid%d", t);
        s[t].valid = let(B, name, bin(B, KIR_OP_SLT, at_t, p1));
        /* past the run's end a slot repeats the run's last one (computed,
         * never stored) */
        snprintf(name, sizeof name, "slot%d", t);
        s[t].id = let(B, name, load_i32(B, W16_MOE_ARG_SORTED,
                                        bin(B, KIR_OP_SMIN, at_t,
                                            bin(B, KIR_OP_SUB, p1, ik(B, 1)))));
        const kir_expr_t *xrow = xdiv > 1 ? kir_bin(k, KIR_OP_UDIV, s[t].id,
                                                    ik(B, xdiv))
                                          : s[t].id;
        snprintf(name, sizeof name, "base%d", t);
        s[t].base = let(B, name, w16_ir_mul(k, xrow, ik(B, KL)));
        for (int j = 0; j < lr.count; j++) {
            snprintf(name, sizeof name, "acc%d_%d", t, j);
            acc[t][j] = kir_var(k, name, KIR_F32);
            kir_let(k, B->body, acc[t][j], fk(B, 0.0));
        }
    }
    k_loop(B, g, &e, &lr, s, BM, acc, in, KL);
    /* epilogue per real slot and channel */
    kir_block_t *blk_body = B->body;
    bool round = r->params.round_gemm_outputs;
    for (int t = 0; t < BM && !B->fail; t++) {
        kir_stmt_t *st = kir_if(k, B->body, s[t].valid);
        if (!st) {
            mfail(B, "out of memory");
            return;
        }
        B->body = &st->body;
        const kir_expr_t *orow = let(B, "orow", w16_ir_mul(k, s[t].id, ik(B, NC)));
        for (int c = 0; c < CH; c++) {
            const kir_expr_t *h[2] = {NULL, NULL};
            for (int j = 0; j < per_channel; j++) {
                int row = c * per_channel + j;
                const kir_expr_t *v = kir_ref(k, acc[t][row]);
                if (bias[row])
                    v = bin(B, KIR_OP_FADD, v, bias[row]);
                if (round)
                    v = round_act(B, v);
                h[j] = let(B, j ? "h_up" : "h", v);
            }
            const kir_expr_t *v = first ? round_act(B, activation(B, h[0], h[1]))
                                        : h[0];
            store(B, outa, w16_ir_add(k, orow, at[c]), v);
        }
        B->body = blk_body;
    }
    B->body = top;
}

/* ---- combine ------------------------------------------------------------- */

static void build_combine(mb_t *B)
{
    const w16_moe_request_t *r = B->req;
    kir_kernel_t *k = B->k;
    int64_t H = B->p.H;
    bool weighted = !r->params.apply_router_weight_on_input &&
                    (!r->batched || r->batched_weights);
    arg(B, W16_MOE_ARG_Y, KIR_PARAM_BUFFER, KIR_F32, false);
    if (weighted)
        arg(B, W16_MOE_ARG_TOPK_WEIGHTS, KIR_PARAM_BUFFER, KIR_F32, false);
    if (r->batched) {
        arg(B, W16_MOE_ARG_COUNTS, KIR_PARAM_BUFFER, KIR_I32, false);
        arg(B, W16_MOE_ARG_MAX_TOKENS, KIR_PARAM_SCALAR, KIR_I64, false);
    } else {
        arg(B, W16_MOE_ARG_SLOT_EXPERT, KIR_PARAM_BUFFER, KIR_I32, false);
    }
    arg(B, W16_MOE_ARG_OUT, KIR_PARAM_BUFFER, KIR_I16, true);
    if (B->fail)
        return;
    const kir_expr_t *row;
    const kir_expr_t *n = tile_channel(B, H, &row);
    if (!n)
        return;
    const kir_expr_t *at = let(B, "at", w16_ir_add(k, w16_ir_mul(k, row, ik(B, H)), n));
    if (r->batched) {
        /* row = e * max_tokens + r: a real row when r < count[e] */
        const kir_expr_t *mt = sarg(B, W16_MOE_ARG_MAX_TOKENS);
        const kir_expr_t *e = let(B, "e", bin(B, KIR_OP_UDIV, row, mt));
        const kir_expr_t *rr = bin(B, KIR_OP_SUB, row, bin(B, KIR_OP_MUL, e, mt));
        kir_stmt_t *st = kir_if(k, B->body, bin(B, KIR_OP_SLT, rr,
                                                load_i32(B, W16_MOE_ARG_COUNTS, e)));
        if (!st) {
            mfail(B, "out of memory");
            return;
        }
        kir_block_t *outer = B->body;
        B->body = &st->body;
        const kir_expr_t *y = load(B, W16_MOE_ARG_Y, at);
        if (weighted)
            y = bin(B, KIR_OP_FMUL, load(B, W16_MOE_ARG_TOPK_WEIGHTS, row), y);
        store(B, W16_MOE_ARG_OUT, at, act_bits(B, y));
        B->body = &st->else_body;
        store(B, W16_MOE_ARG_OUT, at, kir_const(k, KIR_I16, 0));
        B->body = outer;
        return;
    }
    /* out[m] = R(sum over present slots j of c_j y_j), slot order */
    int64_t topk = r->topk;
    const kir_var_t *acc = kir_var(k, "acc", KIR_F32);
    kir_let(k, B->body, acc, fk(B, 0.0));
    const kir_var_t *j = kir_var(k, "j", KIR_I64);
    kir_stmt_t *loop = kir_for(k, B->body, j, ik(B, 0), ik(B, topk), 1);
    if (!loop) {
        mfail(B, "out of memory");
        return;
    }
    loop->unroll = topk <= 16;
    kir_block_t *outer = B->body;
    B->body = &loop->body;
    const kir_expr_t *t = let(B, "t", w16_ir_add(k, w16_ir_mul(k, row, ik(B, topk)),
                                                kir_ref(k, j)));
    kir_stmt_t *st = kir_if(k, B->body, bin(B, KIR_OP_SLE, ik(B, 0),
                                            load_i32(B, W16_MOE_ARG_SLOT_EXPERT, t)));
    if (!st) {
        mfail(B, "out of memory");
        return;
    }
    B->body = &st->body;
    const kir_expr_t *y = load(B, W16_MOE_ARG_Y,
                               w16_ir_add(k, w16_ir_mul(k, t, ik(B, H)), n));
    if (weighted)
        y = bin(B, KIR_OP_FMUL, load(B, W16_MOE_ARG_TOPK_WEIGHTS, t), y);
    kir_assign(k, B->body, acc, bin(B, KIR_OP_FADD, kir_ref(k, acc), y));
    B->body = outer;
    store(B, W16_MOE_ARG_OUT, at, act_bits(B, kir_ref(k, acc)));
}

/* ---- entry --------------------------------------------------------------- */

wna16_status_t w16_build_moe(wna16_context_t *ctx,
                             const w16_moe_request_t *req,
                             w16_moe_stage_t stage, w16_moe_kernel_t *out,
                             wna16_error_t *err)
{
    mb_t B;
    wna16_status_t st = setup(&B, ctx, req, stage, out, err);
    if (st == WNA16_OK) {
        const char *comment = NULL;
        switch (stage) {
        case W16_MOE_INPUT:
            build_input(&B);
            comment = "fused MoE input: x = f32(hidden) (router weight on "
                      "the input applied), one lane per element";
            break;
        case W16_MOE_GEMM1:
            build_gemm(&B, true);
            comment = "fused MoE gemm1: a = R(act(x W13^T + b13)) for the "
                      "slots of one expert, BM at a time, one lane per "
                      "intermediate channel, weights dequantized once per "
                      "block of BM slots";
            break;
        case W16_MOE_GEMM2:
            build_gemm(&B, false);
            comment = "fused MoE gemm2: y = a W2^T + b2 for the slots of "
                      "one expert, BM at a time, one lane per hidden channel";
            break;
        case W16_MOE_COMBINE:
            build_combine(&B);
            comment = req->batched
                          ? "fused MoE combine (batched): out = R(c y), rows "
                            "past the expert's count 0"
                          : "fused MoE combine: out = R(sum_j c_j y_j) over "
                            "the token's present slots, in slot order";
            break;
        default:
            st = w16_err(err, WNA16_EINVAL, "moe: unknown stage %d", (int)stage);
            break;
        }
        if (st == WNA16_OK)
            st = finish(&B, comment, err);
    }
    if (st != WNA16_OK)
        w16_moe_kernel_free(out);
    return st;
}

void w16_moe_kernel_free(w16_moe_kernel_t *k)
{
    if (k && k->kernel) {
        kir_kernel_free(k->kernel);
        k->kernel = NULL;
    }
}
