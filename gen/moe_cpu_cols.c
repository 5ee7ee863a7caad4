/*
 * moe_cpu_cols.c - the dedicated CPU generator's second kernel shape (see
 * moe_cpu.h): GEMM blocks for layouts whose qweight keeps each column's K
 * codes contiguous, one byte a k (triton's 8-bit layout, or any layout
 * whose maps evaluate so), beside moe_cpu.c's VNNI blocks. The input
 * stage, the row quantization, the epilogue (bias, activation, rounding,
 * store) and the stages' skeleton are moe_cpu.c's; this file adds the
 * probe of the codes and the column block's dot products.
 *
 * A zmm of 64 code bytes is 64 k of ONE column; one column block is 32
 * columns, two halves of 16 (lane i of a result is column 16 h + i):
 *
 *   int8-dynamic, s[r] = q[r] ^ 0x80 (s8: q - 128) once a pass; per half
 *   h, each column n over all of K (its bytes in storage order), per k
 *   block kc of bk = min(group, 128) channels:
 *     acc[r][kc][n] = sum_l vpdpbusd(codes(n, line l) as u8, s[r][l])
 *   (16 lanes, to a stack buffer); then per k block:
 *     C[r]      = tree(acc[r][kc][16 h .. 16 h + 15]) (16 column sums)
 *                 - zero * (sum_q[r][kc] - 128 bk)   (exact int32)
 *     facc[r][h] += float(C) * scale_x[r] * scale_w[g]
 *   bf16-exact is not built for this shape: a version (w = bf16((code -
 *   zero) * scale) of 64 k of a column by vcvtne2ps2bf16, vdpbf16ps over
 *   the block's pairs, a float tree per k block) took 3.9 ms at M = 1 and
 *   43.6 ms at M = 16 on the 8-bit Qwen3-30B-A3B layer against the
 *   portable bf16-exact kernels' 2.7 and 29.0 ms in the same minutes, so
 *   bf16-exact on these layouts runs the portable kernels
 *   (docs/design-notes.md).
 *
 * tree: a transposing add tree, 15 shuffle pairs and adds, turning 16
 * vectors into one whose lane i sums vector i's lanes. Scales and zero
 * points (e, n, g) are gathered for 16 columns at once (vpgatherdd of
 * the aligned 32-bit words holding them: a 16- or 8-bit element's word
 * never leaves its page).
 */
#include "gen/moe_cpu_priv.h"

/* ---- the probe ------------------------------------------------------------ */

const char *w16_moe_cpu_probe_cols(const w16_moe_request_t *req,
                                   const w16_problem_t *p, int g,
                                   const int64_t *v, w16_moe_cpu_op_t *o)
{
    const w16_layout_t *l = req->backend->layouts[W16_ROLE_QWEIGHT];
    wna16_dtype_t d = w16_moe_cpu_dtype_of(req, g, W16_ROLE_QWEIGHT);
    if (p->BITS != 8 || wna16_dtype_size(d) != 1 ||
        w16_layout_code_bits(l, d, v) != 8 || l->decode)
        return "its codes are not 8-bit codes in whole bytes";
    if (o->bk % 64)
        return "its blocks of min(group size, 128) channels are not a "
               "multiple of 64 (a zmm of one column's codes)";
    int64_t shape[W16_MAX_STORE_DIMS], f, bit;
    if (w16_layout_shape(l, v, shape, NULL) != WNA16_OK)
        return "its qweight shape does not evaluate";
    if (!w16_moe_cpu_locate(l, v, shape, 0, 0, 0, 0, &o->q0, NULL))
        return "an element outside its shape";
    o->q_e = 0;
    if (p->E > 1 && w16_moe_cpu_locate(l, v, shape, 1, 0, 0, 0, &f, NULL))
        o->q_e = f - o->q0;
    o->q_n = w16_moe_cpu_locate(l, v, shape, 0, 1, 0, 0, &f, NULL)
                 ? f - o->q0 : 0;
    if (o->q_n < o->K)
        return "its columns overlap (less than K bytes apart)";
    if (o->KC > 256)
        return "it has more than 256 blocks of K (the kernels keep 1 KiB "
               "a block and row on the stack)";
    int64_t es[3];
    int ne = w16_moe_cpu_probe_experts(p->E, es);
    for (int i = 0; i < ne; i++) {
        int64_t e = es[i], base = o->q0 + e * o->q_e;
        /* every column's first code (the first expert), every code of the
         * first and the last column */
        for (int64_t n = 0; n < o->N && i == 0; n++)
            if (!w16_moe_cpu_locate(l, v, shape, e, n, 0, 0, &f, &bit) ||
                f != base + n * o->q_n || bit != 0)
                return "its columns are not at a regular stride";
        int64_t ns[2] = {0, o->N - 1};
        for (int a = 0; a < 2; a++)
            for (int64_t k = 0; k < o->K; k++)
                if (!w16_moe_cpu_locate(l, v, shape, e, ns[a], k, 0, &f, &bit) ||
                    f != base + ns[a] * o->q_n + k || bit != 0)
                    return "a column's K codes are not consecutive bytes";
    }
    return NULL;
}

/* ---- LLVM emission -------------------------------------------------------- */

#ifdef WNA16_HAVE_LLVM

/* 16 elements of `size` bytes at base + i * stride elements, i = 0..15,
 * zero-extended to i32: one gather of the aligned words holding them. */
static LLVMValueRef gather16(cg_t *G, LLVMValueRef base, int64_t stride,
                             int size)
{
    int lane[16];
    for (int i = 0; i < 16; i++)
        lane[i] = (int)(i * stride * size); /* the probe bounds stride */
    LLVMValueRef ab = base, off = mask(G, lane, 16), word = off;
    if (size < 4) {
        LLVMValueRef bi = LLVMBuildPtrToInt(G->b, base, G->i64, "");
        ab = LLVMBuildIntToPtr(G->b, LLVMBuildAnd(G->b, bi, ci64(G, ~(int64_t)3), ""),
                               G->ptr, "");
        LLVMValueRef delta = LLVMBuildTrunc(G->b, LLVMBuildAnd(G->b, bi, ci64(G, 3), ""),
                                            G->i32, "");
        off = add(G, off, splat(G, delta, 16));
        word = LLVMBuildAnd(G->b, off, vi32(G, ~3), "");
    }
    LLVMValueRef ptrs = LLVMBuildGEP2(G->b, G->i8, ab, &word, 1, "");
    LLVMTypeRef over[2] = {G->v16i32, LLVMTypeOf(ptrs)};
    LLVMValueRef ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = LLVMConstInt(G->i1, 1, 0);
    LLVMValueRef ga[4] = {ptrs, ci32(G, 4), LLVMConstVector(ones, 16),
                          LLVMGetPoison(G->v16i32)};
    LLVMValueRef w = intrinsic(G, "llvm.masked.gather", over, 2, ga, 4);
    if (size == 4)
        return w;
    LLVMValueRef sh = LLVMBuildShl(G->b, LLVMBuildAnd(G->b, off, vi32(G, 3), ""),
                                   vi32(G, 3), "");
    return LLVMBuildAnd(G->b, LLVMBuildLShr(G->b, w, sh, ""),
                        vi32(G, size == 1 ? 0xff : 0xffff), "");
}

/* The scales (float32) and zero points (int32) of columns 32 nb + 16 h +
 * 0..15 of operand g for the group of input channel qoff. */
static void cols_params(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb, int h,
                        LLVMValueRef qoff, LLVMValueRef *scale,
                        LLVMValueRef *zero)
{
    const mc_op_t *o = &G->P->op[g];
    LLVMValueRef grp = LLVMBuildUDiv(G->b, qoff, ci64(G, o->GSE), "");
    LLVMValueRef sw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_SCALES));
    int ss = (int)wna16_dtype_size(o->scale_dtype);
    LLVMValueRef so = add(G, ci64(G, o->s0 + 16 * h * o->s_n),
                          add(G, add(G, mul(G, e, ci64(G, o->s_e)),
                                     mul(G, nb, ci64(G, o->s_nb))),
                              mul(G, grp, ci64(G, o->s_g))));
    LLVMValueRef bits = gather16(G, at(G, sw, mul(G, so, ci64(G, ss))), o->s_n, ss);
    if (o->scale_dtype == WNA16_DTYPE_F16) {
        LLVMValueRef hv = LLVMBuildBitCast(G->b, LLVMBuildTrunc(G->b, bits, G->v16i16, ""),
                                           G->v16f16, "");
        *scale = LLVMBuildFPExt(G->b, hv, G->v16f32, "");
    } else {
        if (o->scale_dtype == WNA16_DTYPE_BF16)
            bits = LLVMBuildShl(G->b, bits, vi32(G, 16), "");
        *scale = LLVMBuildBitCast(G->b, bits, G->v16f32, "");
    }
    if (!o->zp) {
        *zero = vi32(G, o->zero);
        return;
    }
    LLVMValueRef zw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)g, W16_ROLE_QZEROS));
    LLVMValueRef zo = add(G, ci64(G, o->z0 + 16 * h * o->z_n),
                          add(G, add(G, mul(G, e, ci64(G, o->z_e)),
                                     mul(G, nb, ci64(G, o->z_nb))),
                              mul(G, grp, ci64(G, o->z_g))));
    *zero = gather16(G, at(G, zw, zo), o->z_n, 1);
}

/* ---- the transposing add tree ---- */

/* Slot s of the tree (leaves in slot order, pairs (2m, 2m + 1) at every
 * level) ends in lane lane_of[s]: the caller puts column L in the slot
 * whose lane is L. The level of width w (16, 8, 4, 2) makes, from X and
 * Y holding 16 / w columns of w lanes each, Z holding twice the columns:
 *   Z[i w + u] = X[i w + u] + X[i w + w/2 + u]          u < w/2
 *              = Y[i w + u - w/2] + Y[i w + u]          u >= w/2 */
typedef struct tree {
    LLVMValueRef p[4], q[4]; /* masks of the levels */
    int slot_of[16];         /* column -> slot */
    LLVMValueRef stack[8];   /* pending partial trees, their levels */
    int level[8], depth;
} tree_t;

static void tree_init(cg_t *G, tree_t *T)
{
    memset(T, 0, sizeof *T);
    int lab[16][16]; /* labels (slots) of each lane, per pending vector */
    for (int s = 0; s < 16; s++)
        for (int i = 0; i < 16; i++)
            lab[s][i] = s;
    for (int lv = 0, w = 16; lv < 4; lv++, w /= 2) {
        int mp[16], mq[16];
        for (int i = 0; i < 16 / w; i++)
            for (int u = 0; u < w; u++) {
                bool lo = u < w / 2;
                mp[i * w + u] = lo ? i * w + u : 16 + i * w + u - w / 2;
                mq[i * w + u] = lo ? i * w + w / 2 + u : 16 + i * w + u;
            }
        T->p[lv] = mask(G, mp, 16);
        T->q[lv] = mask(G, mq, 16);
        int n = 16 >> lv; /* vectors at this level */
        for (int m = 0; m < n / 2; m++) {
            int z[16];
            for (int i = 0; i < 16 / w; i++)
                for (int u = 0; u < w; u++)
                    z[i * w + u] = u < w / 2 ? lab[2 * m][i * w] : lab[2 * m + 1][i * w];
            memcpy(lab[m], z, sizeof z);
        }
    }
    for (int L = 0; L < 16; L++)
        T->slot_of[L] = lab[0][L];
}

/* Pushes the next slot's vector; combines while the two on top are of one
 * level. */
static void tree_push(cg_t *G, tree_t *T, LLVMValueRef v)
{
    T->stack[T->depth] = v;
    T->level[T->depth++] = 0;
    while (T->depth >= 2 && T->level[T->depth - 1] == T->level[T->depth - 2]) {
        int lv = T->level[T->depth - 1];
        LLVMValueRef x = T->stack[T->depth - 2], y = T->stack[T->depth - 1];
        LLVMValueRef a = shuf(G, x, y, T->p[lv]), b = shuf(G, x, y, T->q[lv]);
        T->depth--;
        T->stack[T->depth - 1] = add(G, a, b);
        T->level[T->depth - 1] = lv + 1;
    }
}

/* ---- the GEMM blocks ---- */

/* The loop over the K blocks of column block nb; per block, per half, the
 * 16 columns in the tree's slot order. */
typedef struct cols_ctx {
    int g, BM, lines; /* lines: 64-byte lines of a column in a block */
    LLVMValueRef e, nb, col0, qoff, kc;
    const prow_t *rows;
    tree_t T;
} cols_ctx_t;

/* int8-dynamic: one column at a time over all of K (the column block's
 * bytes read in storage order, one stream), the 16 lanes of each (row,
 * k block, column) kept in a stack buffer; then, per k block, the trees
 * and the exact int32 epilogue. The rows' s = q ^ 0x80 go to a stack
 * buffer once a pass. */
static void gemm_cols_i8_seq(cg_t *G, cols_ctx_t *C, LLVMValueRef facc[][2])
{
    const mc_op_t *o = &G->P->op[C->g];
    int BM = C->BM;
    LLVMValueRef sb = array(G, G->i8, BM * o->K, 64);
    LLVMValueRef pb = array(G, G->i8, BM * o->KC * 16 * 64, 64);
    for (int t = 0; t < BM; t++) {
        loop_t J;
        LLVMValueRef j = loop_open(G, &J, ci64(G, 0), ci64(G, o->K / 64), 1);
        LLVMValueRef q = ld(G, G->v16i32, at(G, C->rows[t].q, mul(G, j, ci64(G, 64))), 1);
        st(G, LLVMBuildXor(G->b, q, vi32(G, (int32_t)0x80808080u), ""),
           at(G, sb, add(G, ci64(G, (int64_t)t * o->K), mul(G, j, ci64(G, 64)))), 64);
        loop_close(G, &J);
    }
    LLVMValueRef qw = arg_ptr(G, w16_moe_weight_arg((wna16_gemm_t)C->g, W16_ROLE_QWEIGHT));
    for (int h = 0; h < 2; h++) {
        loop_t Cl, Kl;
        LLVMValueRef c = loop_open(G, &Cl, ci64(G, 0), ci64(G, 16), 1);
        LLVMValueRef colp = at(G, qw, add(G, C->col0, mul(G, add(G, c, ci64(G, 16 * h)),
                                                            ci64(G, o->q_n))));
        LLVMValueRef kc = loop_open(G, &Kl, ci64(G, 0), ci64(G, o->KC), 1);
        LLVMValueRef qoff = mul(G, kc, ci64(G, o->bk));
        LLVMValueRef acc[4] = {NULL, NULL, NULL, NULL};
        for (int l = 0; l < C->lines; l++) {
            LLVMValueRef lp = at(G, colp, add(G, qoff, ci64(G, 64 * l)));
            prefetch(G, lp);
            LLVMValueRef w = ld(G, G->v16i32, lp, 1);
            for (int t = 0; t < BM; t++) {
                LLVMValueRef s = ld(G, G->v16i32, at(G, sb, add(G, qoff,
                                    ci64(G, (int64_t)t * o->K + 64 * l))), 64);
                LLVMValueRef ops[3] = {acc[t] ? acc[t] : vi32(G, 0), w, s};
                acc[t] = LLVMBuildCall2(G->b, G->dpbusd_t, G->dpbusd, ops, 3, "");
            }
        }
        for (int t = 0; t < BM; t++) {
            LLVMValueRef ix = add(G, mul(G, add(G, ci64(G, (int64_t)t * o->KC), kc),
                                         ci64(G, 16)), c);
            st(G, acc[t], at(G, pb, mul(G, ix, ci64(G, 64))), 64);
        }
        loop_close(G, &Kl);
        loop_close(G, &Cl);
        kc = loop_open(G, &Kl, ci64(G, 0), ci64(G, o->KC), 1);
        qoff = mul(G, kc, ci64(G, o->bk));
        LLVMValueRef scale, zero;
        cols_params(G, C->g, C->e, C->nb, h, qoff, &scale, &zero);
        for (int t = 0; t < BM; t++) {
            tree_t T = C->T;
            LLVMValueRef row = mul(G, add(G, ci64(G, (int64_t)t * o->KC), kc),
                                   ci64(G, 16 * 64));
            for (int slot = 0; slot < 16; slot++) {
                int cc = 0;
                while (C->T.slot_of[cc] != slot)
                    cc++;
                tree_push(G, &T, ld(G, G->v16i32, at(G, pb, add(G, row,
                                                               ci64(G, 64 * cc))), 64));
            }
            LLVMValueRef qs = ld(G, G->i32, at(G, C->rows[t].sums,
                                               mul(G, kc, ci64(G, 4))), 4);
            qs = LLVMBuildSub(G->b, qs, ci32(G, (int32_t)(128 * o->bk)), "");
            LLVMValueRef v = LLVMBuildSub(G->b, T.stack[0],
                                          mul(G, zero, splat(G, qs, 16)), "");
            LLVMValueRef f = fmul(G, fmul(G, LLVMBuildSIToFP(G->b, v, G->v16f32, ""),
                                          splat(G, C->rows[t].scale, 16)), scale);
            st(G, fadd(G, ld(G, G->v16f32, facc[t][h], 64), f), facc[t][h], 64);
        }
        loop_close(G, &Kl);
    }
}

void w16_moe_cpu_gemm_cols(cg_t *G, int g, LLVMValueRef e, LLVMValueRef nb,
                           const prow_t *rows, int BM, LLVMValueRef facc[][2])
{
    const mc_op_t *o = &G->P->op[g];
    cols_ctx_t C = {.g = g, .BM = BM, .lines = (int)(o->bk / 64), .e = e,
                    .nb = nb, .rows = rows};
    tree_init(G, &C.T);
    for (int t = 0; t < BM; t++)
        for (int h = 0; h < 2; h++)
            st(G, vf32(G, 0.0), facc[t][h], 64);
    C.col0 = add(G, ci64(G, o->q0), add(G, mul(G, e, ci64(G, o->q_e)),
                                        mul(G, nb, ci64(G, 32 * o->q_n))));
    gemm_cols_i8_seq(G, &C, facc);
}
#endif
