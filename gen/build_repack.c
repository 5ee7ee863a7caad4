/*
 * build_repack.c - the repack kernel builder (see build_repack.h): the
 * entry points, the kernel's setup from the two specs, and the store of
 * each word. The parts:
 *
 *   build_repack.c        setup, the words a kernel writes, entry points
 *     build_repack_lanes.c  lanes and words, word blocks (CPU)
 *     build_repack_tile.c   staged tiles, shared reads, rows (GPU)
 *     build_repack_sums.c   block sums, and sums in the codes' pass
 *       build_repack_elem.c   a slot's element maps, source loads, values
 *
 * each calling only the ones below it. A kernel:
 *
 *   group, lane -> destination word (see "lanes and words"; on the CPU a
 *   lane's block of words, see "word blocks") -> storage index
 *   i0..i(d-1) of each element of the word
 *     for each element of the word and each code slot (unrolled):
 *       dst inverse map  -> padded logical coordinates, valid?
 *       undo padding     -> logical coordinates of the layer
 *       source forward   -> table slot (expert, projection), element, bit
 *       load, extract, decode (source), encode (destination)
 *     or the whole element for float roles, with format conversion
 *   store the word
 *
 * Coordinates of padding slots are replaced by 0 before the source is
 * addressed (a select), so no lane ever reads out of bounds, and the
 * interval analysis of lower_expr.c knows every coordinate's range. Where
 * a workgroup has no padding (known per workgroup, not per lane), a second
 * copy of the body uses the coordinates as they are, which lets the slots
 * of a word share their source words; the CPU emitter's LLVM pipeline
 * hoists the choice out of the loop over lanes.
 */
#include "gen/build_repack_priv.h"

#include <stdio.h>
#include <string.h>

static const char *gemm_name(wna16_gemm_t g) { return g == WNA16_GEMM_W13 ? "w13" : "w2"; }

static kir_type_t int_type_bytes(size_t bytes)
{
    switch (bytes) {
    case 1: return KIR_I8;
    case 2: return KIR_I16;
    case 4: return KIR_I32;
    case 8: return KIR_I64;
    default: return KIR_VOID;
    }
}

/* "_f16" for a float dtype (identifier-safe), "" otherwise. */
static const char *float_tag(wna16_dtype_t d)
{
    switch (d) {
    case WNA16_DTYPE_F16: return "_f16";
    case WNA16_DTYPE_BF16: return "_bf16";
    case WNA16_DTYPE_F32: return "_f32";
    default: return "";
    }
}
static kir_type_t int_type_of(wna16_dtype_t d) { return int_type_bytes(wna16_dtype_size(d)); }

void w16_repack_kernel_name(char *out, size_t n, const w16_repack_request_t *r)
{
    char gs[16];
    if (r->problem.GS > 0)
        snprintf(gs, sizeof gs, "g%lld", (long long)r->problem.GS);
    else
        snprintf(gs, sizeof gs, "gm1");
    /* the float source (scales or bias; a kernel reads at most one) */
    const char *src_f = "";
    for (int i = 0; i < W16_ROLE_COUNT && !*src_f; i++)
        src_f = float_tag(r->src_dtype[i]);
    const char *dst_f = float_tag(r->dst_dtype);
    static const char *const a8[] = {"", "_a8int8", "_a8fp8"};
    /* a float source cast to the model's dtype on the way (the loader) */
    const char *m_f = float_tag(r->problem.model_dtype);
    char cast[16] = "";
    if (*src_f && *m_f && strcmp(src_f, m_f))
        snprintf(cast, sizeof cast, "_m%s", m_f + 1);
    snprintf(out, n, "wna16_repack_%s_to_%s_%s_%s_b%lld_%s_zp%d%s%s%s%s%s%s",
             r->src->name, r->dst->name, gemm_name(r->gemm),
             w16_role_key(r->role), (long long)r->problem.BITS, gs,
             r->problem.zp ? 1 : 0, r->problem.act_order ? "_ao" : "",
             r->problem.bias ? "_bias" : "",
             (unsigned)r->problem.a8 < 3 ? a8[r->problem.a8] : "_a8", src_f,
             cast, strcmp(src_f, dst_f) ? dst_f : "");
}

int w16_repack_source_roles(w16_role_t dst, const w16_problem_t *p,
                            w16_role_t out[W16_REPACK_MAX_SOURCES])
{
    int n = 0;
    switch (dst) {
    case W16_ROLE_WEIGHT: /* dequantized: (q - z) * s */
        out[n++] = W16_ROLE_QWEIGHT;
        out[n++] = W16_ROLE_SCALES;
        if (p->zp)
            out[n++] = W16_ROLE_QZEROS;
        break;
    case W16_ROLE_QZEROS: /* else the implicit midpoint */
        if (p->zp || p->zeros_stored)
            out[n++] = W16_ROLE_QZEROS;
        break;
    case W16_ROLE_SORT_IDX:
        break; /* the permutation itself: a parameter, not a source */
    case W16_ROLE_GSCALE:
        break; /* from the largest scale, a parameter */
    case W16_ROLE_G_IDX: /* else k / group size */
        if (p->act_order)
            out[n++] = W16_ROLE_G_IDX;
        break;
    case W16_ROLE_QWEIGHT: /* block sums (CPU) also need the zeros */
        out[n++] = W16_ROLE_QWEIGHT;
        if (p->zp)
            out[n++] = W16_ROLE_QZEROS;
        break;
    default:
        out[n++] = dst;
        break;
    }
    return n;
}

wna16_dtype_t w16_repack_dst_dtype(const w16_layout_t *l,
                                   wna16_dtype_t first_src)
{
    if (l->role != W16_ROLE_WEIGHT)
        for (int i = 0; i < l->n_dtypes; i++)
            if (l->dtypes[i] == first_src)
                return first_src;
    return l->dtypes[0];
}

/* ---- folding the specs for the problem ----------------------------------- */

static bool fold_layout(builder_t *B, const w16_layout_t *l, const int64_t *v,
                        w16_layout_t *f)
{
    w16_arena_t *a = &B->k->arena;
    *f = *l;
    bool ok = true;
    for (int d = 0; d < l->ndim; d++) {
        ok = ok && (f->index[d] = w16_expr_fold(a, l->index[d], v));
        if (l->sums_index[d])
            ok = ok && (f->sums_index[d] = w16_expr_fold(a, l->sums_index[d], v));
    }
    for (int i = 0; i < l->n_coords; i++)
        if (l->coord[i])
            ok = ok && (f->coord[i] = w16_expr_fold(a, l->coord[i], v));
    for (int i = 0; i < 3; i++)
        if (l->sums_coord[i])
            ok = ok && (f->sums_coord[i] = w16_expr_fold(a, l->sums_coord[i], v));
    if (l->bit)
        ok = ok && (f->bit = w16_expr_fold(a, l->bit, v));
    if (l->encode)
        ok = ok && (f->encode = w16_expr_fold(a, l->encode, v));
    if (l->decode)
        ok = ok && (f->decode = w16_expr_fold(a, l->decode, v));
    return ok;
}

static const kir_expr_t *ik(builder_t *B, int64_t v) { return w16_ir_const(B->k, v); }

/* ---- the kernel ---------------------------------------------------------- */

/* Destination elements per word (see "lanes and words" in
 * build_repack_lanes.c). */
static int word_elems(const w16_repack_kernel_t *out, wna16_dtype_t dt)
{
    int es = (int)wna16_dtype_size(dt);
    int w = es >= 4 ? 1 : 4 / es;
    while (w > 1 && out->shape[out->ndim - 1] % w)
        w /= 2;
    return w;
}

/* ---- source words ----------------------------------------------------------
 *
 * A source of bytes whose rows run along k (MoeWNA16: two codes a byte) is
 * read as 32-bit words by the kernels that write block sums (the CPU
 * layout's codes kernel and its sums kernel): a lane's codes of one row
 * come from a few neighbouring bytes, which are then one load, and the
 * block sums add words of 8 codes (block_sum_words). The lanes of a vector
 * read different rows (a gather each), and LLVM compiled the byte gathers
 * slowly (a block sum of 128 codes: 64 byte loads a lane, each gathered
 * over 16 lanes) and ran them slowly too (MoeWNA16 into the cpu layout:
 * the kernels compiled in 188-209 ms, 64-77 ms as words with the block
 * sums' loads at one base, and the layer ran in 81-147 ms, 37 ms
 * after). Each byte is
 * the word at byte / 4 shifted right by 8 * (byte % 4) (little-endian, as
 * every CPU target is); rows of whole words keep every read inside the
 * tensor. Only on the CPU (word blocks): a GPU lane reads its bytes with
 * no gather, and 32-bit loads would need 4-byte aligned tensors there. */
static bool source_words(const builder_t *B, const w16_layout_t *s)
{
    const w16_repack_request_t *r = B->req;
    size_t es = wna16_dtype_size(r->src_dtype[W16_ROLE_QWEIGHT]);
    if (!r->word_blocks || r->staged_tiles || r->sort_k || es >= 4 ||
        4 % es || !B->dl.sums_block_k || s->ndim < 1)
        return false;
    /* whole words in every row (the layout's last dimension) */
    return B->sshape[W16_ROLE_QWEIGHT][s->ndim - 1] * (int64_t)es % 4 == 0;
}


static wna16_status_t setup(builder_t *B, wna16_context_t *ctx,
                            const w16_repack_request_t *req,
                            w16_repack_kernel_t *out, bool sums,
                            wna16_error_t *err)
{
    memset(B, 0, sizeof *B);
    memset(out, 0, sizeof *out);
    B->ctx = ctx;
    B->req = req;
    B->out = out;
    B->err = err;
    for (int i = 0; i < W16_ROLE_COUNT; i++)
        out->src_param[i] = -1;
    out->sums = sums;
    B->unroll = 1;
    if (!req->dst->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "generated repack writes "
                       "stacked layouts; %s stores one tensor per expert and "
                       "projection (use the reference target)", req->dst->name);
    const w16_layout_t *dl = req->dst->layouts[req->role];
    if (!dl)
        return w16_err(err, WNA16_EINVAL, "%s has no %s layout", req->dst->name,
                       w16_role_key(req->role));
    wna16_status_t st = w16_spec_bind(req->dst, &req->problem, req->gemm, B->dv, err);
    if (st == WNA16_OK)
        st = w16_spec_bind(req->src, &req->problem, req->gemm, B->sv, err);
    if (st == WNA16_OK)
        st = w16_scale_xform(req->dst, B->dv, &B->dsx, err);
    if (st == WNA16_OK)
        st = w16_scale_xform(req->src, B->sv, &B->ssx, err);
    if (st != WNA16_OK)
        return st;
    if (B->ssx.int16_range && req->src_dtype[W16_ROLE_SCALES])
        return w16_err(err, WNA16_EUNSUPPORTED, "%s: int16 scale codes cannot "
                       "be decoded", req->src->name);
    char name[200];
    w16_repack_kernel_name(name, sizeof name, req);
    if (sums)
        strncat(name, "_sums", sizeof name - strlen(name) - 1);
    int lanes = req->lanes > 0 ? req->lanes : 256;
    B->k = kir_kernel_new(ctx, name, lanes);
    if (!B->k)
        return w16_err_nomem(err, "creating a repack kernel");
    out->kernel = B->k;
    B->body = &B->k->body;
    w16_lower_init(&B->L, B->k);
    if (!fold_layout(B, dl, B->dv, &B->dl))
        return w16_err_nomem(err, "specializing a layout");
    if ((st = w16_layout_shape(dl, B->dv, out->shape, err)) != WNA16_OK)
        return st;
    out->ndim = dl->ndim;
    out->elems = 1;
    for (int d = 0; d < dl->ndim; d++) {
        /* a layout whose blocks are larger than the problem (flashinfer's
         * 256-wide K blocks for K = 128) has no room for it: refuse here,
         * where the message can say so, not with a division by zero */
        if (out->shape[d] <= 0)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s: dimension %d of "
                           "the stored shape is %lld for this problem (N = "
                           "%lld, K = %lld): the layout cannot hold it",
                           req->dst->name, dl->json_path, d,
                           (long long)out->shape[d],
                           (long long)B->dv[W16_VAR_N],
                           (long long)B->dv[W16_VAR_K]);
        out->elems *= out->shape[d];
    }
    /* Sources: every role whose dtype the request names. */
    out->per_expert_source = !req->src->stacked;
    out->table_slots = out->per_expert_source
                           ? (int)req->problem.E * (req->gemm == WNA16_GEMM_W13 ? 2 : 1)
                           : 1;
    B->wide = sums ? 1 : word_elems(out, req->dst_dtype);
    kir_type_t dt = int_type_bytes(wna16_dtype_size(req->dst_dtype) * (size_t)B->wide);
    B->dst = kir_param(B->k, "dst", KIR_PARAM_BUFFER, dt, true);
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        if (!req->src_dtype[r])
            continue;
        const w16_layout_t *s = req->src->layouts[r];
        if (!s)
            return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout",
                           req->src->name, w16_role_key((w16_role_t)r));
        if (!fold_layout(B, s, B->sv, &B->sl[r]))
            return w16_err_nomem(err, "specializing a layout");
        if ((st = w16_layout_shape(s, B->sv, B->sshape[r], err)) != WNA16_OK)
            return st;
        char pname[40];
        snprintf(pname, sizeof pname, "src_%s", w16_role_key((w16_role_t)r));
        kir_type_t st_type = int_type_of(req->src_dtype[r]);
        if (r == W16_ROLE_QWEIGHT && source_words(B, s)) {
            B->words32 = true;
            st_type = KIR_I32;
        }
        B->table[r] = kir_param(B->k, pname, KIR_PARAM_BUFFER_TABLE, st_type, false);
        if (!B->table[r])
            return w16_err_nomem(err, "declaring parameters");
        out->src_param[r] = B->table[r]->index;
    }
    if (!B->dst)
        return w16_err_nomem(err, "declaring parameters");
    out->perm_param = -1;
    out->scale_max_param = -1;
    if (req->role == W16_ROLE_GSCALE ||
        (req->role == W16_ROLE_SCALES && B->dsx.int16_range)) {
        B->smax = kir_param(B->k, "scale_max", KIR_PARAM_SCALAR, KIR_F32, false);
        if (!B->smax)
            return w16_err_nomem(err, "declaring parameters");
        out->scale_max_param = B->smax->index;
    }
    if (req->sort_k) {
        B->perm = kir_param(B->k, "perm", KIR_PARAM_BUFFER, KIR_I32, false);
        if (!B->perm)
            return w16_err_nomem(err, "declaring parameters");
        out->perm_param = B->perm->index;
    }
    return WNA16_OK;
}

static wna16_status_t finish(builder_t *B, wna16_error_t *err)
{
    if (B->fail)
        return w16_err(err, WNA16_EUNSUPPORTED, "cannot generate %s: %s",
                       B->k ? B->k->name : "a repack kernel", B->fail);
    return kir_verify(B->k, err);
}

/* Stores the word acc (i64) at the flat word index of the lane. */
static void store_at(builder_t *B, const kir_expr_t *acc, const kir_expr_t *flat)
{
    kir_kernel_t *k = B->k;
    /* the word in 32-bit arithmetic where it has at most 32 bits */
    if (kir_type_bits(B->dst->type) <= 32)
        acc = w16_ir_narrow32(&B->L, acc);
    /* the group's part and the lane's part of the index apart, each in 32
     * bits where it fits: the emitters address the sum as (dst + group's)
     * + lane's, which the CPU's vectorizer sees as consecutive in the lane */
    const kir_expr_t *ix = flat->op == KIR_OP_ADD
        ? kir_bin(k, KIR_OP_ADD, w16_ir_index32(&B->L, flat->a),
                  w16_ir_index32(&B->L, flat->b))
        : w16_ir_index32(&B->L, flat);
    if (!B->fail && !kir_store(k, B->body, B->dst, ix,
                               kir_int_cast(k, B->dst->type, acc, false)))
        w16_rp_fail(B, "ill-typed store");
}

/* Gathers every slot of the lane's word and stores it (flat NULL: only
 * returns it, let-bound). valid: each slot's validity, or NULL when every
 * slot is known to hold a value. */
static const kir_expr_t *store_word(builder_t *B, const lcoord_t *at,
                                    const kir_expr_t *const *valid, int np,
                                    int slots, int cb, const kir_expr_t *flat)
{
    kir_kernel_t *k = B->k;
    int eb = (int)wna16_dtype_size(B->req->dst_dtype) * 8;
    const kir_expr_t *acc = ik(B, 0), *yes = kir_const(k, KIR_I1, 1);
    for (int p = 0; p < np && !B->fail; p++) {
        B->pos = p;
        const kir_expr_t *v = w16_rp_slot_bits(B, valid ? valid[p] : yes, at[p]);
        if (!v)
            break;
        if (cb < 64)
            v = kir_bin(k, KIR_OP_AND, v, ik(B, (INT64_C(1) << cb) - 1));
        int shift = (p / slots) * eb + (p % slots) * cb;
        if (shift)
            v = kir_bin(k, KIR_OP_SHL, v, ik(B, shift));
        acc = p ? kir_bin(k, KIR_OP_OR, acc, v) : v;
        char name[16];
        snprintf(name, sizeof name, "acc%d", p);
        acc = w16_rp_let(B, name, acc);
    }
    if (flat)
        store_at(B, acc, flat);
    return acc;
}

/* The words of a lane's T copies; on a GPU's direct plans every copy's
 * loads come before the first store (`late`: the compiler keeps a load
 * after a store it cannot prove apart, and a lane's words are there to
 * have their loads in flight together). */
static void store_words(builder_t *B, const lcoord_t *at,
                        const kir_expr_t *const *valid, int np, int slots,
                        int cb, const kir_expr_t *const *flat, int T)
{
    bool late = w16_rp_tile_loads_first(B);
    const kir_expr_t **acc = w16_arena_alloc(&B->k->arena, sizeof *acc * (size_t)T);
    if (!acc) {
        w16_rp_fail(B, "out of memory");
        return;
    }
    for (int t = 0; t < T && !B->fail; t++)
        acc[t] = store_word(B, at + t * np, valid ? valid + t * np : NULL, np,
                            slots, cb, late ? NULL : flat[t]);
    for (int t = 0; t < T && late && !B->fail; t++)
        store_at(B, acc[t], flat[t]);
}

wna16_status_t w16_build_repack(wna16_context_t *ctx,
                                const w16_repack_request_t *req,
                                w16_repack_kernel_t *out, wna16_error_t *err)
{
    builder_t B;
    wna16_status_t st = setup(&B, ctx, req, out, false, err);
    if (st != WNA16_OK) {
        w16_repack_kernel_free(out);
        return st;
    }
    kir_kernel_t *k = B.k;
    int n = out->ndim;
    int wide = B.wide;
    int64_t S[W16_MAX_STORE_DIMS] = {0};
    for (int d = 0; d < n; d++)
        S[d] = out->shape[d] / (d == n - 1 ? wide : 1);
    int cb = w16_layout_code_bits(&B.dl, req->dst_dtype, B.dv);
    int slots = w16_layout_slots(&B.dl, req->dst_dtype, B.dv);
    int np = wide * slots;
    if (np > 64)
        w16_rp_fail(&B, "more than 64 code slots in a destination word");
    int max_lanes = w16_rp_plan_blocks(&B, S, n, np, slots,
                                       req->lanes > 0 ? req->lanes : 256);
    if (req->staged_tiles && !B.blocked && !B.fail)
        w16_rp_tile_plan(&B, S, n, np, slots, max_lanes);
    int T = B.unroll;
    if (B.blocked) { /* one name, one kernel: blocks are another kernel */
        char name[240];
        snprintf(name, sizeof name, "%s_wb%d", k->name, T);
        if (!(k->name = w16_arena_strdup(&k->arena, name)))
            w16_rp_fail(&B, "out of memory");
    }
    /* every copy's word, and every slot's coordinates and validity first */
    size_t nat = (size_t)(T * np + 1);
    lcoord_t *at = w16_arena_alloc(&k->arena, sizeof *at * nat);
    const kir_expr_t **valid = w16_arena_alloc(&k->arena, sizeof *valid * nat);
    const kir_expr_t **flat = w16_arena_alloc(&k->arena, sizeof *flat * (size_t)(T + 1));
    const kir_expr_t *all = kir_const(k, KIR_I1, 1);
    if (!at || !valid || !flat)
        w16_rp_fail(&B, "out of memory");
    bool fuse = w16_rp_sums_fusable(&B);
    const kir_expr_t **scond = w16_arena_alloc(&k->arena, sizeof *scond * (size_t)(T + 1));
    const kir_expr_t *(*sc)[3] = w16_arena_alloc(&k->arena, sizeof *sc * (size_t)(T + 1));
    if (!scond || !sc)
        w16_rp_fail(&B, "out of memory");
    if (B.tile && !B.fail)
        w16_rp_tile_stage(&B, S, n);
    for (int t = 0; t < T && !B.fail; t++) {
        B.copy = t;
        flat[t] = B.tile ? w16_rp_tile_map(&B, S, n, t)
                         : w16_rp_map_lanes(&B, S, n, max_lanes);
        if (fuse) {
            scond[t] = w16_rp_sum_slot(&B, sc[t]);
            /* one branch per workgroup: the same condition for every copy,
             * free of the lane, and not always false (a GPU's rows branch
             * by lane, and their copies bind the lane's index afresh) */
            bool gpu = w16_rp_tile_lane_branches(&B);
            fuse = scond[t] && (!w16_ir_uses_lane(&B.L, scond[t]) || gpu) &&
                   !(scond[t]->op == KIR_OP_CONST && !scond[t]->ival) &&
                   (t == 0 || w16_rp_same_expr(scond[t], scond[0]) ||
                    (gpu && w16_rp_same_value(&B, scond[t], scond[0])));
        }
        /* a 0-dim destination (input_global_scale) has no last index to
         * widen: one element, one word */
        const kir_expr_t *word = n > 0 ? B.idx[n - 1] : NULL;
        for (int p = 0; p < np && !B.fail; p++) {
            int j = p / slots;
            if (n > 0)
                B.idx[n - 1] =
                    wide == 1 ? word
                              : w16_ir_add(k, w16_ir_mul(k, word, ik(&B, wide)),
                                           ik(&B, j));
            B.pos = t * np + p;
            valid[t * np + p] = w16_rp_dst_slot(&B, p % slots, &at[t * np + p]);
            all = valid[t * np + p] ? w16_ir_and1(k, all, valid[t * np + p]) : NULL;
            if (!all)
                w16_rp_fail(&B, "out of memory");
        }
    }
    kir_block_t *top = B.body;
    if (fuse && !B.fail) {
        int64_t bk = 0;
        w16_expr_eval(B.dl.sums_block_k, B.dv, &bk, NULL); /* sums_fusable */
        kir_stmt_t *br = kir_if(k, B.body, w16_rp_let(&B, "sums_here", scond[0]));
        if (!br) {
            w16_rp_fail(&B, "out of memory");
        } else {
            B.body = &br->body;
            bool late = w16_rp_tile_loads_first(&B); /* see store_words */
            const kir_expr_t **sum = w16_arena_alloc(&k->arena, sizeof *sum * (size_t)T);
            if (!sum) {
                w16_rp_fail(&B, "out of memory");
            } else if (w16_rp_block_sums_shared(&B, sc, T, bk, sum)) {
                for (int t = 0; t < T && !B.fail; t++)
                    store_at(&B, sum[t], flat[t]);
            } else {
                for (int t = 0; t < T && !B.fail; t++) {
                    sum[t] = w16_rp_block_sum(&B, sc[t][0], sc[t][1], sc[t][2], bk, t);
                    if (sum[t] && late)
                        sum[t] = w16_rp_let(&B, "block_sum", sum[t]);
                    else if (sum[t])
                        store_at(&B, sum[t], flat[t]);
                }
                for (int t = 0; t < T && late && !B.fail; t++)
                    if (sum[t])
                        store_at(&B, sum[t], flat[t]);
            }
            B.body = &br->else_body;
            out->sums_fused = true;
        }
    }
    /* the codes' branch of fused sums ("sums in the codes' pass",
     * build_repack_sums.c): no padding where no sum is (the
     * sums' words are the only ones the codes' inverse map leaves out) */
    bool no_padding = !B.fail && out->sums_fused &&
                      w16_rp_valid_without_sums(&B, scond[0], all);
    if (!B.fail && !no_padding) {
        /* the slots' validity as lets, for the bodies that read it */
        all = kir_const(k, KIR_I1, 1);
        for (int i = 0; i < T * np && all; i++) {
            valid[i] = w16_rp_let(&B, "valid", valid[i]);
            all = valid[i] ? w16_ir_and1(k, all, valid[i]) : NULL;
        }
        if (!all)
            w16_rp_fail(&B, "out of memory");
    }
    if (B.fail) {
        /* nothing more */
    } else if (no_padding) {
        store_words(&B, at, NULL, np, slots, cb, flat, T);
    } else if (!(all->op == KIR_OP_CONST && all->ival) &&
               (!w16_ir_uses_lane(&B.L, all) || w16_rp_tile_lane_branches(&B))) {
        /* Padding that is the same for every lane of a workgroup (a tail
         * of whole workgroups): a branch the CPU emitter moves out of the
         * loop over lanes, and a body for the words without padding that
         * knows every slot is valid (no clamped coordinates, so the slots
         * of a word share their source words). */
        kir_stmt_t *br = kir_if(k, B.body, w16_rp_let(&B, "all_valid", all));
        if (!br) {
            w16_rp_fail(&B, "out of memory");
        } else {
            kir_block_t *outer = B.body;
            B.body = &br->body;
            store_words(&B, at, NULL, np, slots, cb, flat, T);
            B.body = &br->else_body;
            store_words(&B, at, valid, np, slots, cb, flat, T);
            B.body = outer;
        }
    } else {
        store_words(&B, at, all->op == KIR_OP_CONST ? NULL : valid, np, slots,
                    cb, flat, T);
    }
    B.body = top;
    k->comment = T > 1 ? "repack: a lane gathers a block of destination words"
                       : "repack: one lane per destination word (gather)";
    if (B.tile)
        k->comment = w16_rp_tile_comment(&B);
    if ((st = finish(&B, err)) != WNA16_OK)
        w16_repack_kernel_free(out);
    return st;
}

wna16_status_t w16_build_repack_sums(wna16_context_t *ctx,
                                     const w16_repack_request_t *req,
                                     w16_repack_kernel_t *out,
                                     wna16_error_t *err)
{
    builder_t B;
    wna16_status_t st = setup(&B, ctx, req, out, true, err);
    if (st == WNA16_OK && (req->role != W16_ROLE_QWEIGHT ||
                           !B.dl.sums_block_k || wna16_dtype_size(req->dst_dtype) != 1))
        st = w16_err(err, WNA16_EINVAL, "%s: the qweight layout has no byte "
                     "block sums", req->dst->name);
    int64_t bk = 0;
    if (st == WNA16_OK && (!w16_expr_eval(B.dl.sums_block_k, B.dv, &bk, NULL) ||
                           bk <= 0 || B.dv[W16_VAR_K] % bk))
        st = w16_err(err, WNA16_ESPEC, "%s: sums.block_k does not divide K",
                     req->dst->name);
    if (st != WNA16_OK) {
        w16_repack_kernel_free(out);
        return st;
    }
    kir_kernel_t *k = B.k;
    int64_t E = B.dv[W16_VAR_E], N = B.dv[W16_VAR_N], K = B.dv[W16_VAR_K];
    int64_t KB = K / bk;
    /* lanes run along n: neighbouring lanes read neighbouring source
     * words of one row and write neighbouring sums */
    int64_t S[3] = {E, KB, N};
    w16_rp_map_lanes(&B, S, 3, req->lanes > 0 ? req->lanes : 256);
    const kir_expr_t *e = B.idx[0], *kb = B.idx[1], *n = B.idx[2];
    const kir_expr_t *sum = w16_rp_block_sum(&B, e, n, kb, bk, 0);
    if (!sum)
        w16_rp_fail(&B, "out of memory");
    /* store the int32 little-endian at the sums index */
    w16_lower_clear_vars(&B.L);
    w16_lower_bind(&B.L, W16_VAR_e, e, 0, E - 1);
    w16_lower_bind(&B.L, W16_VAR_n, n, 0, N - 1);
    w16_lower_bind(&B.L, W16_VAR_g, kb, 0, KB - 1);
    const kir_expr_t *pos = ik(&B, 0);
    for (int d = 0; d < B.dl.ndim && !B.fail; d++) {
        const kir_expr_t *ix = w16_rp_lower(&B, B.dl.sums_index[d], NULL);
        if (!ix)
            break;
        pos = w16_ir_add(k, w16_ir_mul(k, pos, ik(&B, out->shape[d])), ix);
    }
    pos = w16_rp_let(&B, "pos", pos);
    for (int byte = 0; byte < 4 && !B.fail; byte++) {
        const kir_expr_t *v = kir_int_cast(k, KIR_I8, w16_ir_narrow32(&B.L,
            kir_bin(k, KIR_OP_LSHR, sum, ik(&B, 8 * byte))), false);
        if (!kir_store(k, B.body, B.dst,
                       w16_ir_index32(&B.L, w16_ir_add(k, pos, ik(&B, byte))), v))
            w16_rp_fail(&B, "ill-typed store");
    }
    k->comment = "repack: block sums of (q - z), one lane per (e, block, n)";
    if ((st = finish(&B, err)) != WNA16_OK)
        w16_repack_kernel_free(out);
    return st;
}

void w16_repack_kernel_free(w16_repack_kernel_t *k)
{
    if (k && k->kernel) {
        kir_kernel_free(k->kernel);
        k->kernel = NULL;
    }
}
