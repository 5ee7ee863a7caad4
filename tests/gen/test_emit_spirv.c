/*
 * test_emit_spirv.c - every kernel the builders make is emitted as SPIR-V
 * and passes SPIRV-Tools' validator (OpenCL 2.2 environment, SPIR-V 1.2),
 * which w16_emit_spirv runs on each module before it returns it.
 *
 * The repack kernels are the enumeration of test_nvrtc_repack_all.c: every
 * checkpoint format and every stacked layout of codes, into every stacked
 * destination, x bits {4, 8} x group size {-1, 32, 128} x zero point x
 * act order x bias x input dtype (16-bit, int8, fp8) x the source's scale
 * dtypes, on one layer every layout accepts and one with a ragged I; each
 * kernel in both of the builder's shapes (the GPU's staged tiles, which
 * use workgroup memory and barriers, and the CPU's word blocks). What a
 * layout cannot hold is refused by the reference's checks or the builder
 * and counted. A repack kernel's name is one module: the same name with
 * other words fails the test. The fused-MoE kernels are test_moe_nvrtc.c's
 * (their names leave out parts of the configuration, e.g. E and topk):
 * every stacked backend x every activation x several drawn configurations
 * (activation dtype, bits, group size, zero points, bias, block size,
 * batched format, GEMM output rounding, router weight side, 32-bit code
 * reads), all four stages. A hand-built kernel uses every IR operator and
 * statement; an FCONV to bf16 is refused naming the kernel; a module with
 * a flipped word is refused by the validator naming the kernel.
 *
 * Usage: test_emit_spirv [-v] [--dump DIR] (DIR/NAME.spv for every module,
 * e.g. for spirv-val or llvm-spirv by hand). Skips (77) in builds without
 * SPIRV-Tools.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "repack_matrix.h"
#include "gen/build_moe.h"
#include "gen/build_repack.h"
#include "gen/emit_spirv.h"
#include "gen/spirv_validate.h"
#include "runtime/ref/ref.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The layers (E, H, I) of test_nvrtc_repack_all.c: the first fits every
 * layout's tiles with every group size, the second has a ragged I. */
static const int32_t LAYERS[][3] = {{2, 256, 256}, {2, 256, 96}};

/* Fused-MoE configurations drawn per backend and activation. */
enum { MOE_DRAWS = 6 };

typedef struct seen {
    char *name;
    uint64_t hash;
    struct seen *next;
} seen_t;

typedef struct run {
    wna16_context_t *ctx;
    bool verbose;
    const char *dump;
    seen_t *buckets[8192];
    w16_words_t words;
    long combos, refused, builder_refused;
    long modules, repeated, words_total;
    long moe_configs;
} run_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t fnv64(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static seen_t **bucket(run_t *R, const char *name)
{
    return &R->buckets[fnv64(name, strlen(name)) % W16_ARRAY_LEN(R->buckets)];
}

static void forget_names(run_t *R)
{
    for (size_t b = 0; b < W16_ARRAY_LEN(R->buckets); b++) {
        for (seen_t *s = R->buckets[b], *next; s; s = next) {
            next = s->next;
            free(s->name);
            free(s);
        }
        R->buckets[b] = NULL;
    }
}

static void dump_module(run_t *R, const char *name, const w16_words_t *w)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.spv", R->dump, name);
    TU_CHECK_MSG(tu_write_file(path, w->data, w->len * sizeof *w->data) == 0,
                 "--dump: cannot write %s", path);
}

/* Emits (and so validates) one kernel; with `unique`, a name met before
 * must come with the same words and counts once. */
static void add_kernel(run_t *R, const kir_kernel_t *k, const char *origin,
                       bool unique)
{
    wna16_error_t err;
    w16_words_reset(&R->words);
    wna16_status_t st = w16_emit_spirv(k, &R->words, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s: %s", origin, err.message);
    if (st != WNA16_OK)
        return;
    uint64_t h = fnv64(R->words.data, R->words.len * sizeof *R->words.data);
    seen_t **b = bucket(R, k->name);
    for (seen_t *s = unique ? *b : NULL; s; s = s->next)
        if (strcmp(s->name, k->name) == 0) {
            TU_CHECK_MSG(s->hash == h, "kernel %s (%s): two different modules "
                         "under one name", k->name, origin);
            R->repeated++;
            return;
        }
    seen_t *s = malloc(sizeof *s);
    size_t n = strlen(k->name) + 1;
    char *copy = malloc(n);
    if (!s || !copy) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    *s = (seen_t){memcpy(copy, k->name, n), h, *b};
    *b = s;
    R->modules++;
    R->words_total += (long)R->words.len;
    if (R->verbose)
        printf("%s: %zu words (%s)\n", k->name, R->words.len, origin);
    if (R->dump)
        dump_module(R, k->name, &R->words);
}

/* ---- repack kernels (test_nvrtc_repack_all.c's enumeration) -------------- */

static wna16_dtype_t source_dtype(const w16_layout_t *l, wna16_dtype_t fd)
{
    for (int i = 0; i < l->n_dtypes; i++)
        if (l->dtypes[i] == fd)
            return fd;
    return l->dtypes[0];
}

static void build_operand(void *user, const wna16_spec_t *src,
                          const wna16_spec_t *dst, const w16_problem_t *p,
                          wna16_gemm_t g, wna16_dtype_t fd, const char *what)
{
    run_t *R = user;
    wna16_error_t err;
    int64_t dv[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(dst, p, g, dv, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
    if (st != WNA16_OK)
        return;
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = dst->layouts[r];
        if (!w16_layout_present(l, dv))
            continue;
        int64_t shape[W16_MAX_STORE_DIMS], elems = 1;
        st = w16_layout_shape(l, dv, shape, &err);
        TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
        for (int d = 0; st == WNA16_OK && d < l->ndim; d++)
            elems *= shape[d];
        if (st != WNA16_OK || elems == 0)
            continue;
        w16_repack_request_t req = {.src = src, .dst = dst, .problem = *p,
                                    .gemm = g, .role = (w16_role_t)r,
                                    .sort_k = dst->act_order_sort &&
                                              p->act_order};
        char origin[300];
        snprintf(origin, sizeof origin, "%s %s_%s", what,
                 g == WNA16_GEMM_W13 ? "w13" : "w2", l->name);
        w16_role_t need[W16_REPACK_MAX_SOURCES];
        int nn = w16_repack_source_roles((w16_role_t)r, p, need);
        const char *missing = NULL;
        for (int i = 0; i < nn; i++) {
            const w16_layout_t *sl = src->layouts[need[i]];
            if (!sl)
                missing = w16_role_key(need[i]);
            else
                req.src_dtype[need[i]] = source_dtype(sl, fd);
        }
        if (missing) {
            R->builder_refused++;
            continue;
        }
        req.dst_dtype = w16_repack_dst_dtype(l, nn ? req.src_dtype[need[0]]
                                                   : WNA16_DTYPE_INVALID);
        /* the GPU shape (codes, then sums), then the CPU's word blocks */
        for (int pass = 0; pass < (l->sums_block_k ? 2 : 1) + 1; pass++) {
            w16_repack_kernel_t rk;
            bool blocks = pass == (l->sums_block_k ? 2 : 1);
            req.word_blocks = blocks;
            req.staged_tiles = !blocks;
            st = pass && !blocks ? w16_build_repack_sums(R->ctx, &req, &rk, &err)
                                 : w16_build_repack(R->ctx, &req, &rk, &err);
            if (blocks && st == WNA16_OK && !strstr(rk.kernel->name, "_wb")) {
                w16_repack_kernel_free(&rk);
                continue;
            }
            if (st != WNA16_OK) {
                if (!blocks)
                    R->builder_refused++;
                if (R->verbose && !blocks)
                    printf("refused by the builder: %s: %s\n", origin,
                           err.message);
                continue;
            }
            add_kernel(R, rk.kernel, origin, true);
            w16_repack_kernel_free(&rk);
        }
    }
}

/* Every combination of the walk (tests/repack_matrix.h), on one layer. */
static void repack_kernels(run_t *R, const int32_t *layer)
{
    static const int gss[] = {-1, 32, 128};
    rm_walk_t w = {.ctx = R->ctx, .E = layer[0], .H = layer[1],
                   .I = layer[2], .group_sizes = gss,
                   .n_group_sizes = (int)W16_ARRAY_LEN(gss),
                   .verbose = R->verbose, .operand = build_operand,
                   .user = R};
    rm_walk(&w);
    R->combos += w.combos;
    R->refused += w.refused;
}

/* ---- fused-MoE kernels (test_moe_nvrtc.c's draws) ------------------------ */

static bool moe_request(tu_rng_t *rng, const wna16_spec_t *s, int act,
                        w16_moe_request_t *req)
{
    static const int32_t gss[] = {-1, 32, 64, 128};
    memset(req, 0, sizeof *req);
    req->backend = s;
    req->problem = (w16_problem_t){.E = 1 + tu_rng_below(rng, 8), .H = 256,
                                   .I = 128,
                                   .BITS = tu_rng_below(rng, 2) ? 4 : 8,
                                   .GS = gss[tu_rng_below(rng, 4)],
                                   .zp = tu_rng_below(rng, 2),
                                   .bias = tu_rng_below(rng, 2)};
    wna16_moe_params_init(&req->params);
    req->params.activation = (wna16_activation_t)act;
    req->params.act_dtype = tu_rng_below(rng, 2) ? WNA16_DTYPE_F16
                                                 : WNA16_DTYPE_BF16;
    req->params.round_gemm_outputs = tu_rng_below(rng, 2);
    req->params.apply_router_weight_on_input = tu_rng_below(rng, 3) == 0;
    req->params.swiglu_limit = tu_rng_below(rng, 2) ? 7.0f : INFINITY;
    req->batched = tu_rng_below(rng, 3) == 0;
    req->batched_weights = tu_rng_below(rng, 2);
    req->topk = 1 + (int32_t)tu_rng_below(rng, 8);
    req->block_m = 1 << tu_rng_below(rng, 4);
    req->qweight_align = tu_rng_below(rng, 2) ? 4 : 0;
    wna16_error_t err;
    return w16_moe_check(req, &err) == WNA16_OK;
}

/* The four kernels of one drawn configuration; false when the layout
 * serves none in 50 draws. */
static bool moe_config(run_t *R, tu_rng_t *rng, const wna16_spec_t *s, int act)
{
    w16_moe_request_t req;
    for (int tries = 0; !moe_request(rng, s, act, &req); tries++)
        if (tries == 50)
            return false;
    R->moe_configs++;
    for (int st = 0; st < W16_MOE_STAGE_COUNT; st++) {
        wna16_error_t err;
        w16_moe_kernel_t mk;
        wna16_status_t r = w16_build_moe(R->ctx, &req, (w16_moe_stage_t)st,
                                         &mk, &err);
        TU_CHECK_MSG(r == WNA16_OK, "%s: %s", wna16_spec_name(s), err.message);
        if (r != WNA16_OK)
            return true;
        add_kernel(R, mk.kernel, wna16_spec_name(s), false);
        w16_moe_kernel_free(&mk);
    }
    return true;
}

static void moe_kernels(run_t *R)
{
    tu_rng_t rng;
    tu_rng_seed(&rng, 0x5b1f);
    for (size_t i = 0; i < wna16_spec_count(R->ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(R->ctx, i);
        if (!s->stacked)
            continue;
        int n = 0;
        for (int act = 0; act < WNA16_ACT_COUNT_; act++)
            for (int d = 0; d < MOE_DRAWS; d++)
                n += moe_config(R, &rng, s, act);
        const char *name = wna16_spec_name(s);
        bool required = !strcmp(name, "triton") || !strcmp(name, "xpu") ||
                        !strcmp(name, "cpu");
        TU_CHECK_MSG(!required || n == WNA16_ACT_COUNT_ * MOE_DRAWS,
                     "%s: %d of %d configurations built", name, n,
                     WNA16_ACT_COUNT_ * MOE_DRAWS);
    }
}

/* ---- every operator and statement ---------------------------------------- */

/* A kernel that is nonsense as a computation but uses every IR operator,
 * every statement, every parameter kind, workgroup memory, a constant
 * table and every type the IR has. */
static kir_kernel_t *every_op(wna16_context_t *ctx)
{
    kir_kernel_t *k = kir_kernel_new(ctx, "spirv_every_op", 64);
    if (!k)
        return NULL;
    const kir_param_t *oi = kir_param(k, "out_i32", KIR_PARAM_BUFFER, KIR_I32, true);
    const kir_param_t *of = kir_param(k, "out_f32", KIR_PARAM_BUFFER, KIR_F32, true);
    const kir_param_t *oh = kir_param(k, "out_f16", KIR_PARAM_BUFFER, KIR_F16, true);
    const kir_param_t *ob = kir_param(k, "out_bf16", KIR_PARAM_BUFFER, KIR_BF16, true);
    const kir_param_t *i8 = kir_param(k, "in_i8", KIR_PARAM_BUFFER, KIR_I8, false);
    const kir_param_t *tb = kir_param(k, "in_table", KIR_PARAM_BUFFER_TABLE,
                                      KIR_I16, false);
    const kir_param_t *n = kir_param(k, "n", KIR_PARAM_SCALAR, KIR_I64, false);
    const kir_param_t *sc = kir_param(k, "scale", KIR_PARAM_SCALAR, KIR_F32, false);
    const kir_param_t *hs = kir_param(k, "half_scale", KIR_PARAM_SCALAR, KIR_F16,
                                      false);
    const kir_shared_t *sh = kir_shared(k, "tile", KIR_I32, 64);
    static const int64_t tv[] = {1, -2, 3, -4};
    const kir_ctable_t *ct = kir_ctable(k, "order", KIR_I8, tv, 4);
    kir_block_t *b = &k->body;
#define C32(v) kir_const(k, KIR_I32, v)
#define C64(v) kir_const(k, KIR_I64, v)
#define F32(v) kir_fconst(k, KIR_F32, v)
#define BIN(op, x, y) kir_bin(k, KIR_OP_##op, x, y)
    const kir_var_t *lane = kir_var(k, "lane", KIR_I32);
    const kir_var_t *idx = kir_var(k, "idx", KIR_I64);
    kir_let(k, b, lane, kir_builtin(k, KIR_OP_LANE_ID));
    kir_let(k, b, idx, BIN(ADD, BIN(MUL, kir_builtin(k, KIR_OP_GROUP_ID), C64(64)),
                           kir_int_cast(k, KIR_I64, kir_ref(k, lane), false)));
    /* if !(idx < n * num_groups) return */
    kir_stmt_t *early = kir_if(k, b, kir_un(k, KIR_OP_NOT,
        BIN(SLT, kir_ref(k, idx), BIN(MUL, kir_pref(k, n),
                                      kir_builtin(k, KIR_OP_NUM_GROUPS)))));
    if (early)
        kir_return(k, &early->body);
    kir_shared_store(k, b, sh, kir_ref(k, lane),
                     kir_int_cast(k, KIR_I32, kir_ref(k, idx), false));
    kir_barrier(k, b);
    const kir_var_t *x = kir_var(k, "x", KIR_I32);
    kir_let(k, b, x, kir_shared_load(k, sh, BIN(UREM, BIN(ADD, kir_ref(k, lane),
                                                          C32(1)), C32(64))));
    /* integer operators, folded into an accumulator */
    const kir_var_t *acc = kir_var(k, "acc", KIR_I32);
    kir_let(k, b, acc, kir_un(k, KIR_OP_NEG, kir_ref(k, x)));
    static const kir_op_t iops[] = {
        KIR_OP_ADD, KIR_OP_SUB, KIR_OP_MUL, KIR_OP_UDIV, KIR_OP_SDIV,
        KIR_OP_UREM, KIR_OP_SREM, KIR_OP_SHL, KIR_OP_LSHR, KIR_OP_ASHR,
        KIR_OP_AND, KIR_OP_OR, KIR_OP_XOR, KIR_OP_SMIN, KIR_OP_SMAX};
    for (size_t i = 0; i < W16_ARRAY_LEN(iops); i++)
        kir_assign(k, b, acc, kir_bin(k, iops[i], kir_ref(k, acc),
                                      BIN(OR, kir_un(k, KIR_OP_NOT, kir_ref(k, x)),
                                          C32(1 + (int64_t)i % 7))));
    /* comparisons and i1 logic */
    const kir_var_t *c = kir_var(k, "c", KIR_I1);
    kir_let(k, b, c, BIN(EQ, kir_ref(k, acc), kir_ref(k, x)));
    static const kir_op_t cops[] = {KIR_OP_NE, KIR_OP_SLT, KIR_OP_SLE,
                                    KIR_OP_ULT, KIR_OP_ULE};
    static const kir_op_t lops[] = {KIR_OP_AND, KIR_OP_OR, KIR_OP_XOR,
                                    KIR_OP_EQ, KIR_OP_NE};
    for (size_t i = 0; i < W16_ARRAY_LEN(cops); i++)
        kir_assign(k, b, c, kir_bin(k, lops[i], kir_ref(k, c),
                                    kir_bin(k, cops[i], kir_ref(k, acc),
                                            C32((int64_t)i))));
    kir_assign(k, b, acc, BIN(ADD, kir_ref(k, acc),
                              kir_convert(k, KIR_OP_ZEXT, KIR_I32, kir_ref(k, c))));
    const kir_var_t *wide = kir_var(k, "wide", KIR_I64);
    kir_let(k, b, wide, BIN(ADD, kir_convert(k, KIR_OP_SEXT, KIR_I64, kir_ref(k, c)),
                            kir_convert(k, KIR_OP_SEXT, KIR_I64, kir_ref(k, acc))));
    /* loads: a buffer of i8, a table of i16 buffers, a constant table */
    const kir_expr_t *byte = kir_load(k, i8, kir_ref(k, idx));
    const kir_expr_t *half = kir_tload(k, tb, BIN(AND, kir_ref(k, wide), C64(1)),
                                       kir_ref(k, idx));
    const kir_expr_t *ord = kir_ctload(k, ct, BIN(AND, kir_ref(k, idx), C64(3)));
    kir_assign(k, b, acc, BIN(ADD, kir_ref(k, acc),
        BIN(ADD, kir_convert(k, KIR_OP_SEXT, KIR_I32, byte),
            BIN(ADD, kir_convert(k, KIR_OP_ZEXT, KIR_I32, half),
                kir_convert(k, KIR_OP_SEXT, KIR_I32, ord)))));
    kir_assign(k, b, acc, kir_select(k, kir_convert(k, KIR_OP_TRUNC, KIR_I1,
                                                    kir_ref(k, acc)),
                                     kir_convert(k, KIR_OP_ZEXT, KIR_I32,
                                         kir_convert(k, KIR_OP_TRUNC, KIR_I8,
                                                     kir_ref(k, wide))),
                                     kir_ref(k, acc)));
    /* float operators */
    const kir_var_t *f = kir_var(k, "f", KIR_F32);
    kir_let(k, b, f, BIN(FMUL, kir_convert(k, KIR_OP_SITOF, KIR_F32, kir_ref(k, acc)),
                         kir_pref(k, sc)));
    static const kir_op_t fops[] = {KIR_OP_FADD, KIR_OP_FSUB, KIR_OP_FMUL,
                                    KIR_OP_FDIV, KIR_OP_FMAX, KIR_OP_FMIN};
    for (size_t i = 0; i < W16_ARRAY_LEN(fops); i++)
        kir_assign(k, b, f, kir_bin(k, fops[i], kir_ref(k, f), F32(0.5 + (double)i)));
    static const kir_op_t mops[] = {KIR_OP_FEXP, KIR_OP_FTANH, KIR_OP_FERF};
    for (size_t i = 0; i < W16_ARRAY_LEN(mops); i++)
        kir_assign(k, b, f, kir_un(k, mops[i], kir_ref(k, f)));
    kir_assign(k, b, f, kir_select(k, BIN(OR, BIN(FLT, kir_ref(k, f), F32(0.25)),
                                          BIN(FLE, F32(INFINITY), kir_ref(k, f))),
                                   F32(NAN), kir_ref(k, f)));
    kir_assign(k, b, f, BIN(FADD, kir_ref(k, f),
                            kir_convert(k, KIR_OP_FCONV, KIR_F32, kir_pref(k, hs))));
    /* a loop with an early return, an unrolled one */
    const kir_var_t *i = kir_var(k, "i", KIR_I32);
    kir_stmt_t *loop = kir_for(k, b, i, C32(0), kir_ref(k, x), 2);
    if (loop) {
        kir_assign(k, &loop->body, acc, BIN(ADD, kir_ref(k, acc), kir_ref(k, i)));
        kir_stmt_t *out = kir_if(k, &loop->body, BIN(EQ, kir_ref(k, acc), C32(77)));
        if (out) {
            kir_store(k, &out->body, oi, kir_ref(k, idx), kir_ref(k, acc));
            kir_return(k, &out->body);
            kir_store(k, &out->body, oi, kir_ref(k, idx), C32(0)); /* dead */
            kir_assign(k, &out->else_body, f, BIN(FADD, kir_ref(k, f), F32(1)));
        }
    }
    const kir_var_t *j = kir_var(k, "j", KIR_I64);
    kir_stmt_t *unrolled = kir_for(k, b, j, C64(0), C64(4), 1);
    if (unrolled) {
        unrolled->unroll = true;
        kir_assign(k, &unrolled->body, acc,
                   BIN(XOR, kir_ref(k, acc), kir_int_cast(k, KIR_I32, kir_ref(k, j),
                                                          false)));
    }
    kir_barrier(k, b);
    /* conversions and stores of every element type */
    kir_store(k, b, oi, kir_ref(k, idx),
              BIN(ADD, kir_ref(k, acc),
                  BIN(ADD, kir_convert(k, KIR_OP_FTOSI, KIR_I32, kir_ref(k, f)),
                      kir_convert(k, KIR_OP_BITCAST, KIR_I32, kir_ref(k, f)))));
    kir_store(k, b, of, kir_ref(k, idx),
              kir_convert(k, KIR_OP_BITCAST, KIR_F32, kir_ref(k, acc)));
    const kir_expr_t *h = kir_convert(k, KIR_OP_FCONV, KIR_F16, kir_ref(k, f));
    kir_store(k, b, oh, kir_ref(k, idx),
              kir_convert(k, KIR_OP_BITCAST, KIR_F16,
                          BIN(XOR, kir_convert(k, KIR_OP_BITCAST, KIR_I16, h),
                              kir_const(k, KIR_I16, 0x8000))));
    kir_store(k, b, ob, kir_ref(k, idx),
              kir_convert(k, KIR_OP_BITCAST, KIR_BF16,
                          kir_convert(k, KIR_OP_TRUNC, KIR_I16,
                                      BIN(LSHR, kir_convert(k, KIR_OP_BITCAST,
                                                            KIR_I32, kir_ref(k, f)),
                                          C32(16)))));
#undef C32
#undef C64
#undef F32
#undef BIN
    return k;
}

static void every_op_kernel(run_t *R)
{
    kir_kernel_t *k = every_op(R->ctx);
    wna16_error_t err;
    TU_CHECK(k != NULL);
    if (!k)
        return;
    TU_OK(kir_verify(k, &err), &err);
    add_kernel(R, k, "every operator", true);
    /* the text of `wna16 gen --target spirv` */
    w16_buf_t text;
    w16_buf_init(&text, R->ctx);
    TU_OK(w16_emit_spirv_text(k, &text, &err), &err);
    static const char *const expect[] = {
        "OpCapability Kernel", "OpCapability Int8", "OpCapability Int16",
        "OpCapability Int64", "OpCapability Float16Buffer",
        "OpEntryPoint Kernel %spirv_every_op \"spirv_every_op\"",
        "OpExecutionMode %spirv_every_op LocalSize 64 1 1",
        "OpExecutionMode %spirv_every_op ContractionOff",
        "OpMemoryModel Physical64 OpenCL", "OpenCL.std", "OpControlBarrier",
        "OpLoopMerge", "OpSelectionMerge", "vstore_half_r", "RTE", "vload_half",
        "OpConvertUToPtr", "OpFOrdGreaterThan", "tanh", "erf", "s_min",
        "OpDecorate %__spirv_BuiltInWorkgroupId BuiltIn WorkgroupId",
        "%tile = OpVariable", "Workgroup", "UniformConstant"};
    for (size_t i = 0; i < W16_ARRAY_LEN(expect); i++)
        TU_CHECK_MSG(text.data && strstr(text.data, expect[i]), "disassembly "
                     "lacks '%s':\n%s", expect[i], text.data ? text.data : "");
    w16_buf_free(&text);
    kir_kernel_free(k);
}

/* An FCONV to bf16 (the builders lower those with integer operations) is
 * refused, naming the kernel. */
static void refused_kernel(run_t *R)
{
    kir_kernel_t *k = kir_kernel_new(R->ctx, "spirv_refused_bf16", 32);
    TU_CHECK(k != NULL);
    if (!k)
        return;
    const kir_param_t *o = kir_param(k, "out", KIR_PARAM_BUFFER, KIR_BF16, true);
    kir_store(k, &k->body, o, kir_const(k, KIR_I64, 0),
              kir_convert(k, KIR_OP_FCONV, KIR_BF16, kir_fconst(k, KIR_F32, 1.5)));
    wna16_error_t err;
    TU_OK(kir_verify(k, &err), &err);
    w16_words_t w;
    w16_words_init(&w, R->ctx);
    wna16_status_t st = w16_emit_spirv(k, &w, &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED && strstr(err.message,
                                                    "spirv_refused_bf16") &&
                 strstr(err.message, "bf16") && w.len == 0,
                 "%s: %s", wna16_status_name(st), err.message);
    w16_words_free(&w);
    kir_kernel_free(k);
}

/* A module with a flipped word fails validation, naming the kernel and
 * the validator's finding. */
static void corrupted_module(run_t *R)
{
    kir_kernel_t *k = every_op(R->ctx);
    TU_CHECK(k != NULL);
    if (!k)
        return;
    wna16_error_t err;
    w16_words_t w;
    w16_words_init(&w, R->ctx);
    TU_OK(w16_emit_spirv(k, &w, &err), &err);
    if (w.len > 40) {
        /* the header's magic, an id operand deep in the function, the word
         * count of the first instruction */
        const size_t at[] = {0, w.len - 6, 5};
        for (size_t i = 0; i < W16_ARRAY_LEN(at); i++) {
            uint32_t saved = w.data[at[i]];
            w.data[at[i]] = i == 2 ? saved ^ 0x00ff0000u : 0xdeadbeefu;
            wna16_status_t st = w16_spirv_validate(w.data, w.len, k->name, &err);
            TU_CHECK_MSG(st == WNA16_EINTERNAL &&
                         strstr(err.message, "kernel spirv_every_op: SPIR-V "
                                "validation failed"),
                         "word %zu: %s: %s", at[i], wna16_status_name(st),
                         err.message);
            if (R->verbose || i == 1)
                printf("flipped word %zu: %s\n", at[i], err.message);
            w.data[at[i]] = saved;
        }
        TU_OK(w16_spirv_validate(w.data, w.len, k->name, &err), &err);
    }
    w16_words_free(&w);
    kir_kernel_free(k);
}

int main(int argc, char **argv)
{
    static run_t R;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0)
            R.verbose = true;
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            R.dump = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-v] [--dump DIR]\n", argv[0]);
            return 2;
        }
    }
    if (R.dump && mkdir(R.dump, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "--dump: cannot create %s: %s\n", R.dump, strerror(errno));
        return 1;
    }
    R.ctx = tu_context();
    w16_words_init(&R.words, R.ctx);
    /* a build without SPIRV-Tools emits nothing */
    kir_kernel_t *probe = kir_kernel_new(R.ctx, "spirv_probe", 1);
    wna16_error_t err;
    wna16_status_t st = probe ? w16_emit_spirv(probe, &R.words, &err)
                              : WNA16_ENOMEM;
    kir_kernel_free(probe);
    if (st == WNA16_EUNAVAILABLE) {
        w16_words_free(&R.words);
        wna16_context_destroy(R.ctx);
        tu_skip(err.message);
    }
    TU_OK(st, &err);
    printf("%s\n", w16_spirv_tools_version());

    every_op_kernel(&R);
    refused_kernel(&R);
    corrupted_module(&R);

    double t0 = now_s();
    for (size_t i = 0; i < W16_ARRAY_LEN(LAYERS); i++) {
        repack_kernels(&R, LAYERS[i]);
        forget_names(&R); /* names are unique within a layer */
    }
    long repack_modules = R.modules;
    printf("repack: %ld combinations, %ld refused by the reference's checks, "
           "%ld kernels refused by the builder or for want of a source; "
           "%ld modules validated (%ld more built again with the same words) "
           "in %.1f s\n", R.combos, R.refused, R.builder_refused,
           repack_modules, R.repeated, now_s() - t0);
    t0 = now_s();
    moe_kernels(&R);
    forget_names(&R);
    printf("fused MoE: %ld configurations, %ld modules validated in %.1f s\n",
           R.moe_configs, R.modules - repack_modules, now_s() - t0);
    printf("%ld SPIR-V modules validated in all, %.1f MB of words\n",
           R.modules, (double)R.words_total * 4 / 1e6);
    TU_CHECK(repack_modules > 1000 && R.modules > repack_modules);
    w16_words_free(&R.words);
    wna16_context_destroy(R.ctx);
    return tu_finish("test_emit_spirv");
}
