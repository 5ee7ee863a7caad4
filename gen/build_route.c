/*
 * build_route.c - the device routing kernel of the generated fused MoE
 * (see build_route.h for what it computes and how). Every barrier is
 * reached by every lane: loops around barriers have bounds that are the
 * same for the whole workgroup, and no lane returns early.
 */
#include "gen/build_route.h"
#include "gen/lower_expr.h"

#include <stdio.h>
#include <string.h>

enum { DEFAULT_LANES = 256, MAX_E = 4096, MAX_BM = 256 };

static const char *const arg_names[W16_ROUTE_ARG_COUNT] = {
#define X(e, name) name,
    W16_ROUTE_ARG_LIST(X)
#undef X
};

int64_t w16_route_capacity(int64_t numel, int32_t E, int block_m)
{
    int64_t c = numel + (int64_t)E * (block_m - 1);
    /* at most numel experts have slots, each padded to at most its count
     * times BM (moe_route.c's align_capacity) */
    if (numel < E && numel * block_m < c)
        c = numel * block_m;
    return c;
}

int64_t w16_route_capacity_batched(int32_t E, int64_t max_tokens, int block_m)
{
    return (int64_t)E * ((max_tokens + block_m - 1) / block_m * block_m);
}

void w16_route_kernel_name(char *out, size_t n, const w16_route_request_t *r)
{
    snprintf(out, n, "wna16_moe_route_e%d_bm%d%s", (int)r->E, r->block_m,
             r->batched ? "_batched" : r->map ? "_map" : "");
}

/* ---- builder state and small helpers -------------------------------------- */

typedef struct rb {
    const w16_route_request_t *req;
    kir_kernel_t *k;
    kir_block_t *body;
    w16_route_kernel_t *out;
    const kir_param_t *param[W16_ROUTE_ARG_COUNT];
    const kir_shared_t *sx, *cnt, *psum;
    const kir_expr_t *lane;   /* i32 */
    const kir_expr_t *lane64; /* i64 */
    int lanes, per_lane;      /* lanes; experts a lane owns (C) */
    int n_vars;               /* for unique names */
    const char *fail;
} rb_t;

static void rfail(rb_t *R, const char *why)
{
    if (!R->fail)
        R->fail = why;
}

static const kir_expr_t *c32(rb_t *R, int64_t v) { return kir_const(R->k, KIR_I32, v); }
static const kir_expr_t *c64(rb_t *R, int64_t v) { return w16_ir_const(R->k, v); }

static const kir_expr_t *bin(rb_t *R, kir_op_t op, const kir_expr_t *a,
                             const kir_expr_t *b)
{
    return kir_bin(R->k, op, a, b);
}

static const kir_expr_t *sext(rb_t *R, const kir_expr_t *a)
{
    return kir_int_cast(R->k, KIR_I64, a, true);
}

static const kir_var_t *var(rb_t *R, const char *base, kir_type_t t)
{
    char name[48];
    snprintf(name, sizeof name, "%s%d", base, R->n_vars++);
    return kir_var(R->k, name, t);
}

/* let a fresh variable = e; a reference to it */
static const kir_expr_t *let(rb_t *R, const char *base, const kir_expr_t *e)
{
    if (!e) {
        rfail(R, R->k->broken ? R->k->broken : "missing value");
        return NULL;
    }
    const kir_var_t *v = var(R, base, e->type);
    if (!kir_let(R->k, R->body, v, e)) {
        rfail(R, "out of memory");
        return NULL;
    }
    return kir_ref(R->k, v);
}

/* a mutable variable with its initial value */
static const kir_var_t *mut(rb_t *R, const char *base, const kir_expr_t *init)
{
    const kir_var_t *v = init ? var(R, base, init->type) : NULL;
    if (!v || !kir_let(R->k, R->body, v, init))
        rfail(R, "out of memory");
    return v;
}

static void assign(rb_t *R, const kir_var_t *v, const kir_expr_t *e)
{
    if (!kir_assign(R->k, R->body, v, e))
        rfail(R, R->k->broken ? R->k->broken : "ill-typed assignment");
}

static void store(rb_t *R, w16_route_arg_t a, const kir_expr_t *i64,
                  const kir_expr_t *v)
{
    if (!kir_store(R->k, R->body, R->param[a], i64, v))
        rfail(R, R->k->broken ? R->k->broken : "ill-typed store");
}

static const kir_expr_t *load(rb_t *R, w16_route_arg_t a, const kir_expr_t *i64)
{
    return kir_load(R->k, R->param[a], i64);
}

static void sstore(rb_t *R, const kir_shared_t *s, const kir_expr_t *i32,
                   const kir_expr_t *v)
{
    if (!kir_shared_store(R->k, R->body, s, i32, v))
        rfail(R, R->k->broken ? R->k->broken : "ill-typed shared store");
}

static const kir_expr_t *sload(rb_t *R, const kir_shared_t *s,
                               const kir_expr_t *i32)
{
    return kir_shared_load(R->k, s, i32);
}

static void barrier(rb_t *R)
{
    if (!kir_barrier(R->k, R->body))
        rfail(R, "out of memory");
}

/* Opens `if c { ... }`; close with `leave`. Returns the enclosing block. */
static kir_block_t *enter_if(rb_t *R, const kir_expr_t *c)
{
    kir_block_t *outer = R->body;
    kir_stmt_t *s = kir_if(R->k, R->body, c);
    if (!s) {
        rfail(R, R->k->broken ? R->k->broken : "out of memory");
        return outer;
    }
    R->body = &s->body;
    return outer;
}

/* Opens `for v in [lo, hi) step`; *v receives the loop variable. */
static kir_block_t *enter_for(rb_t *R, const char *base, const kir_expr_t *lo,
                              const kir_expr_t *hi, int64_t step,
                              const kir_expr_t **v)
{
    kir_block_t *outer = R->body;
    const kir_var_t *iv = lo ? var(R, base, lo->type) : NULL;
    kir_stmt_t *s = iv ? kir_for(R->k, R->body, iv, lo, hi, step) : NULL;
    if (!s) {
        rfail(R, R->k->broken ? R->k->broken : "out of memory");
        *v = NULL;
        return outer;
    }
    R->body = &s->body;
    *v = kir_ref(R->k, iv);
    return outer;
}

static void leave(rb_t *R, kir_block_t *outer) { R->body = outer; }

/* Opens the loop over the experts this lane owns: `for j < C: e = l*C + j;
 * if e < E { ... }`; *e (i32) is the expert. Close with leave_owner. */
typedef struct owner {
    kir_block_t *outer;
} owner_t;

static owner_t enter_owner(rb_t *R, const kir_expr_t **e)
{
    owner_t o;
    const kir_expr_t *j;
    o.outer = enter_for(R, "j", c32(R, 0), c32(R, R->per_lane), 1, &j);
    *e = let(R, "e", bin(R, KIR_OP_ADD, bin(R, KIR_OP_MUL, R->lane,
                                             c32(R, R->per_lane)), j));
    enter_if(R, bin(R, KIR_OP_SLT, *e, c32(R, R->req->E)));
    return o;
}

static void leave_owner(rb_t *R, owner_t o) { R->body = o.outer; }

/* round_up(n, BM), n >= 0 (i32) */
static const kir_expr_t *padded(rb_t *R, const kir_expr_t *n)
{
    int bm = R->req->block_m;
    if (bm == 1)
        return n;
    return bin(R, KIR_OP_MUL,
               bin(R, KIR_OP_UDIV, bin(R, KIR_OP_ADD, n, c32(R, bm - 1)),
                   c32(R, bm)),
               c32(R, bm));
}

/* The number of the tile's lanes [0, hi) whose expert in sx is e (i32). */
static const kir_expr_t *tile_count(rb_t *R, const kir_expr_t *e,
                                    const kir_expr_t *hi)
{
    const kir_var_t *c = mut(R, "c", c32(R, 0));
    const kir_expr_t *i;
    kir_block_t *o = enter_for(R, "i", c32(R, 0), hi, 1, &i);
    assign(R, c, bin(R, KIR_OP_ADD, kir_ref(R->k, c),
                     kir_select(R->k, bin(R, KIR_OP_EQ, sload(R, R->sx, i), e),
                                c32(R, 1), c32(R, 0))));
    leave(R, o);
    return kir_ref(R->k, c);
}

/* ---- the phases ----------------------------------------------------------- */

/* The local expert (i32, -1: absent) of slot s (i64, s < numel). */
static const kir_expr_t *slot_expert(rb_t *R, const kir_expr_t *s)
{
    int32_t E = R->req->E;
    const kir_var_t *ge = mut(R, "ge", c32(R, -1));
    const kir_expr_t *g = let(R, "g", load(R, W16_ROUTE_ARG_TOPK_IDS, s));
    const kir_expr_t *ok = bin(R, KIR_OP_AND, bin(R, KIR_OP_SLE, c32(R, 0), g),
                               bin(R, KIR_OP_SLT, sext(R, g),
                                   kir_pref(R->k, R->param[W16_ROUTE_ARG_N_IDS])));
    kir_block_t *o = enter_if(R, ok);
    const kir_expr_t *m = R->req->map
        ? let(R, "m", load(R, W16_ROUTE_ARG_EXPERT_MAP, sext(R, g))) : g;
    /* the host checked the map and the ids; a value out of range is
     * absent rather than an access out of bounds */
    assign(R, ge, kir_select(R->k, bin(R, KIR_OP_AND,
                                       bin(R, KIR_OP_SLE, c32(R, 0), m),
                                       bin(R, KIR_OP_SLT, m, c32(R, E))),
                             m, c32(R, -1)));
    leave(R, o);
    return kir_ref(R->k, ge);
}

/* Tiles of `lanes` slots: count (scatter false) or place (true). */
static void slot_pass(rb_t *R, const kir_expr_t *numel, bool scatter)
{
    kir_kernel_t *k = R->k;
    int lanes = R->lanes;
    const kir_expr_t *tiles = let(R, "tiles", bin(R, KIR_OP_UDIV,
        bin(R, KIR_OP_ADD, numel, c64(R, lanes - 1)), c64(R, lanes)));
    const kir_expr_t *t;
    kir_block_t *o = enter_for(R, "t", c64(R, 0), tiles, 1, &t);
    const kir_expr_t *s = let(R, "s", bin(R, KIR_OP_ADD,
                                          bin(R, KIR_OP_MUL, t, c64(R, lanes)),
                                          R->lane64));
    const kir_var_t *ge = mut(R, "se", c32(R, -1));
    kir_block_t *o2 = enter_if(R, bin(R, KIR_OP_SLT, s, numel));
    if (scatter) { /* the count pass stored it */
        assign(R, ge, load(R, W16_ROUTE_ARG_SLOT_EXPERT, s));
    } else {
        const kir_expr_t *v = slot_expert(R, s);
        assign(R, ge, v);
        store(R, W16_ROUTE_ARG_SLOT_EXPERT, s, v);
    }
    leave(R, o2);
    sstore(R, R->sx, R->lane, kir_ref(k, ge));
    barrier(R);
    if (scatter) {
        /* position: the expert's cursor plus the earlier lanes of the
         * tile routed to it */
        o2 = enter_if(R, bin(R, KIR_OP_SLE, c32(R, 0), kir_ref(k, ge)));
        const kir_expr_t *rank = tile_count(R, kir_ref(k, ge), R->lane);
        const kir_expr_t *at = bin(R, KIR_OP_ADD,
                                   sload(R, R->cnt, kir_ref(k, ge)), rank);
        store(R, W16_ROUTE_ARG_SORTED, sext(R, at),
              kir_int_cast(k, KIR_I32, s, false));
        leave(R, o2);
        barrier(R);
    }
    const kir_expr_t *e;
    owner_t ow = enter_owner(R, &e);
    const kir_expr_t *n = tile_count(R, e, c32(R, lanes));
    sstore(R, R->cnt, e, bin(R, KIR_OP_ADD, sload(R, R->cnt, e), n));
    leave_owner(R, ow);
    barrier(R);
    leave(R, o);
}

/* The owners' padded sums scanned over the lanes: each expert's first
 * position, its padding, blocks and runs (batched: its rows too); then
 * the tail past the total and route_info. cnt[e] holds the counts on
 * entry and, for the scatter, each expert's first position on exit. */
static void place(rb_t *R, const kir_expr_t *sentinel)
{
    kir_kernel_t *k = R->k;
    int lanes = R->lanes, bm = R->req->block_m;
    const kir_expr_t *e;
    const kir_var_t *lsum = mut(R, "lsum", c32(R, 0));
    owner_t ow = enter_owner(R, &e);
    assign(R, lsum, bin(R, KIR_OP_ADD, kir_ref(k, lsum),
                        padded(R, sload(R, R->cnt, e))));
    leave_owner(R, ow);
    sstore(R, R->psum, R->lane, kir_ref(k, lsum));
    barrier(R);
    /* Hillis-Steele: after the step of distance d, psum[l] sums the lanes
     * (l - 2d, l] */
    for (int d = 1; d < lanes; d *= 2) {
        const kir_expr_t *prev = kir_select(
            k, bin(R, KIR_OP_SLE, c32(R, d), R->lane),
            sload(R, R->psum, bin(R, KIR_OP_SMAX, bin(R, KIR_OP_SUB, R->lane,
                                                       c32(R, d)), c32(R, 0))),
            c32(R, 0));
        const kir_expr_t *v = let(R, "scan", bin(R, KIR_OP_ADD,
                                                 sload(R, R->psum, R->lane), prev));
        barrier(R);
        sstore(R, R->psum, R->lane, v);
        barrier(R);
    }
    const kir_expr_t *total = let(R, "total", sload(R, R->psum, c32(R, lanes - 1)));
    const kir_var_t *pos = mut(R, "pos", bin(R, KIR_OP_SUB,
                                             sload(R, R->psum, R->lane),
                                             kir_ref(k, lsum)));
    ow = enter_owner(R, &e);
    const kir_expr_t *n = let(R, "n", sload(R, R->cnt, e));
    const kir_expr_t *pad = let(R, "pad", padded(R, n));
    const kir_expr_t *p = let(R, "p", kir_ref(k, pos));
    sstore(R, R->cnt, e, p);
    const kir_expr_t *i;
    if (R->req->batched) { /* row r of expert e is e * max_tokens + r */
        const kir_expr_t *mt = kir_int_cast(k, KIR_I32,
            kir_pref(k, R->param[W16_ROUTE_ARG_MAX_TOKENS]), false);
        kir_block_t *o = enter_for(R, "r", c32(R, 0), n, 1, &i);
        store(R, W16_ROUTE_ARG_SORTED, sext(R, bin(R, KIR_OP_ADD, p, i)),
              bin(R, KIR_OP_ADD, bin(R, KIR_OP_MUL, e, mt), i));
        leave(R, o);
    }
    kir_block_t *o = enter_for(R, "q", n, pad, 1, &i);
    store(R, W16_ROUTE_ARG_SORTED, sext(R, bin(R, KIR_OP_ADD, p, i)), sentinel);
    leave(R, o);
    const kir_expr_t *b0 = let(R, "b0", bin(R, KIR_OP_UDIV, p, c32(R, bm)));
    const kir_expr_t *b;
    o = enter_for(R, "b", b0, bin(R, KIR_OP_ADD, b0,
                                  bin(R, KIR_OP_UDIV, pad, c32(R, bm))), 1, &b);
    const kir_expr_t *b64 = let(R, "b64", sext(R, b));
    store(R, W16_ROUTE_ARG_EXPERT_IDS, b64, e);
    const kir_expr_t *start = let(R, "start", bin(R, KIR_OP_MUL, b, c32(R, bm)));
    const kir_expr_t *r3 = let(R, "r3", bin(R, KIR_OP_MUL, b64, c64(R, 3)));
    const kir_expr_t *end = bin(R, KIR_OP_ADD, start,
        bin(R, KIR_OP_SMIN, c32(R, bm),
            bin(R, KIR_OP_SUB, bin(R, KIR_OP_ADD, p, n), start)));
    store(R, W16_ROUTE_ARG_RUNS, r3, start);
    store(R, W16_ROUTE_ARG_RUNS, bin(R, KIR_OP_ADD, r3, c64(R, 1)), end);
    store(R, W16_ROUTE_ARG_RUNS, bin(R, KIR_OP_ADD, r3, c64(R, 2)), e);
    leave(R, o);
    assign(R, pos, bin(R, KIR_OP_ADD, kir_ref(k, pos), pad));
    leave_owner(R, ow);
    /* past the total: the sentinel and no expert, spread over the lanes */
    const kir_expr_t *cap = kir_pref(k, R->param[W16_ROUTE_ARG_CAP]);
    o = enter_for(R, "tail", bin(R, KIR_OP_ADD, sext(R, total), R->lane64), cap,
                  lanes, &i);
    store(R, W16_ROUTE_ARG_SORTED, i, sentinel);
    leave(R, o);
    const kir_expr_t *blocks = let(R, "blocks", bin(R, KIR_OP_UDIV, total, c32(R, bm)));
    const kir_expr_t *maxb = bin(R, KIR_OP_UDIV,
                                 bin(R, KIR_OP_ADD, cap, c64(R, bm - 1)), c64(R, bm));
    o = enter_for(R, "tailb", bin(R, KIR_OP_ADD, sext(R, blocks), R->lane64),
                  maxb, lanes, &i);
    store(R, W16_ROUTE_ARG_EXPERT_IDS, i, c32(R, -1));
    leave(R, o);
    o = enter_if(R, bin(R, KIR_OP_EQ, R->lane, c32(R, 0)));
    store(R, W16_ROUTE_ARG_INFO, c64(R, 0), total);
    store(R, W16_ROUTE_ARG_INFO, c64(R, 1), blocks);
    leave(R, o);
    barrier(R);
}

static const kir_param_t *arg(rb_t *R, w16_route_arg_t a, kir_param_kind_t kind,
                              bool written)
{
    const kir_param_t *p = kir_param(R->k, arg_names[a], kind,
                                     kind == KIR_PARAM_SCALAR ? KIR_I64 : KIR_I32,
                                     written);
    if (!p) {
        rfail(R, "out of memory (parameters)");
        return NULL;
    }
    R->param[a] = p;
    R->out->param[a] = p->index;
    return p;
}

static void build(rb_t *R)
{
    const w16_route_request_t *q = R->req;
    kir_kernel_t *k = R->k;
    bool std = !q->batched;
    if (std) {
        arg(R, W16_ROUTE_ARG_TOPK_IDS, KIR_PARAM_BUFFER, false);
        if (q->map)
            arg(R, W16_ROUTE_ARG_EXPERT_MAP, KIR_PARAM_BUFFER, false);
        arg(R, W16_ROUTE_ARG_NUMEL, KIR_PARAM_SCALAR, false);
        arg(R, W16_ROUTE_ARG_N_IDS, KIR_PARAM_SCALAR, false);
    } else {
        arg(R, W16_ROUTE_ARG_COUNTS, KIR_PARAM_BUFFER, false);
        arg(R, W16_ROUTE_ARG_MAX_TOKENS, KIR_PARAM_SCALAR, false);
    }
    arg(R, W16_ROUTE_ARG_CAP, KIR_PARAM_SCALAR, false);
    if (std)
        arg(R, W16_ROUTE_ARG_SLOT_EXPERT, KIR_PARAM_BUFFER, true);
    arg(R, W16_ROUTE_ARG_SORTED, KIR_PARAM_BUFFER, true);
    arg(R, W16_ROUTE_ARG_EXPERT_IDS, KIR_PARAM_BUFFER, true);
    arg(R, W16_ROUTE_ARG_RUNS, KIR_PARAM_BUFFER, true);
    arg(R, W16_ROUTE_ARG_INFO, KIR_PARAM_BUFFER, true);
    /* each tile's slot experts: the standard format's counts and scatter
     * (the batched format's counts are given) */
    R->sx = std ? kir_shared(k, "tile_expert", KIR_I32, R->lanes) : NULL;
    R->cnt = kir_shared(k, "expert_count", KIR_I32, q->E);
    R->psum = kir_shared(k, "lane_sum", KIR_I32, R->lanes);
    if (R->fail || (std && !R->sx) || !R->cnt || !R->psum) {
        rfail(R, "out of memory (shared memory)");
        return;
    }
    R->lane = let(R, "lane", kir_builtin(k, KIR_OP_LANE_ID));
    R->lane64 = let(R, "lane64", kir_int_cast(k, KIR_I64, R->lane, false));
    const kir_expr_t *e;
    const kir_expr_t *sentinel;
    owner_t ow = enter_owner(R, &e);
    if (std) {
        sstore(R, R->cnt, e, c32(R, 0));
    } else { /* the given count, within [0, max_tokens] */
        const kir_expr_t *mt = kir_int_cast(k, KIR_I32,
            kir_pref(k, R->param[W16_ROUTE_ARG_MAX_TOKENS]), false);
        sstore(R, R->cnt, e, bin(R, KIR_OP_SMAX, c32(R, 0),
                                 bin(R, KIR_OP_SMIN, mt,
                                     load(R, W16_ROUTE_ARG_COUNTS, sext(R, e)))));
    }
    leave_owner(R, ow);
    barrier(R);
    if (std) {
        const kir_expr_t *numel = kir_pref(k, R->param[W16_ROUTE_ARG_NUMEL]);
        sentinel = let(R, "sentinel", kir_int_cast(k, KIR_I32, numel, false));
        slot_pass(R, numel, false);
        place(R, sentinel);
        slot_pass(R, numel, true);
    } else {
        sentinel = let(R, "sentinel", kir_int_cast(k, KIR_I32,
            bin(R, KIR_OP_MUL, c64(R, q->E),
                kir_pref(k, R->param[W16_ROUTE_ARG_MAX_TOKENS])), false));
        place(R, sentinel);
    }
}

wna16_status_t w16_build_route(wna16_context_t *ctx,
                               const w16_route_request_t *req,
                               w16_route_kernel_t *out, wna16_error_t *err)
{
    memset(out, 0, sizeof *out);
    for (int a = 0; a < W16_ROUTE_ARG_COUNT; a++)
        out->param[a] = -1;
    int lanes = req->lanes ? req->lanes : DEFAULT_LANES;
    if (req->E < 1 || req->E > MAX_E || req->block_m < 1 ||
        req->block_m > MAX_BM || lanes < 1 || lanes > 1024 ||
        (lanes & (lanes - 1)) || (req->batched && req->map))
        return w16_err(err, WNA16_EINVAL, "moe route kernel: E = %d, block "
                       "size %d, %d lanes%s (need E in [1, %d], a block size "
                       "in [1, %d], a power of two of lanes up to 1024, no "
                       "expert map with the batched format)", (int)req->E,
                       req->block_m, lanes, req->batched && req->map
                           ? ", batched with a map" : "", MAX_E, MAX_BM);
    char name[96];
    w16_route_kernel_name(name, sizeof name, req);
    rb_t R = {.req = req, .out = out, .lanes = lanes,
              .per_lane = (req->E + lanes - 1) / lanes};
    R.k = out->kernel = kir_kernel_new(ctx, name, lanes);
    if (!R.k)
        return w16_err_nomem(err, "creating the MoE routing kernel");
    R.k->comment = req->batched
        ? "fused MoE routing (batched): each expert's rows in order, padded "
          "to the block size; blocks, runs and their count (one workgroup)"
        : "fused MoE routing: slots sorted by expert (stable), padded to the "
          "block size; blocks, runs, each slot's expert and the block count "
          "(one workgroup: counts per tile, a scan in shared memory, a "
          "stable scatter)";
    R.body = &R.k->body;
    build(&R);
    wna16_status_t st = WNA16_OK;
    if (R.fail)
        st = w16_err(err, WNA16_EINTERNAL, "building %s: %s", name, R.fail);
    else
        st = kir_verify(R.k, err);
    if (st != WNA16_OK)
        w16_route_kernel_free(out);
    return st;
}

void w16_route_kernel_free(w16_route_kernel_t *k)
{
    if (k && k->kernel) {
        kir_kernel_free(k->kernel);
        k->kernel = NULL;
    }
}
