/*
 * moe_gen.c - the generated fused MoE (wna16_moe_layer_*): binds a layer's
 * stacked backend tensors, routes each call (wna16_moe_align with a block
 * size picked from the routing), builds the four kernels of the
 * configuration (gen/build_moe.c) on first use, compiles them through the
 * context's kernel cache and launches them on the CPU target's threads:
 *
 *   check args -> route (slot experts, block size, align) -> scratch
 *   -> kernels of the configuration (memo, else build + cache)
 *   -> input, gemm1, gemm2, combine
 *
 * Arguments are checked exactly as the reference checks them (same
 * messages), before any work.
 */
#include "gen/build_moe.h"
#include "runtime/cpu/cpu.h"
#include "runtime/moe.h"
#include "runtime/ref/ref.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bump when the CPU lowering of the same kernel IR changes (as
 * W16_CPU_EMITTER_VERSION for the repack kernels in repack_gen.c). */
#define W16_MOE_CPU_EMITTER_VERSION 1

/* Elements up to which the input and combine stages run on the calling
 * thread rather than the pool. */
#define SMALL_STAGE (INT64_C(1) << 16)

/* Everything a call's kernels depend on besides the layer. Filled after a
 * memset so that keys compare with memcmp. */
typedef struct variant_key {
    int32_t activation, act_dtype, topk, block_m;
    float limit, alpha, beta; /* swiglu constants, 0 for the others */
    uint8_t on_input, round, batched, batched_weights;
} variant_key_t;

typedef struct stage_fn {
    w16_cpu_fn fn;
    int64_t tiles;
    int param[W16_MOE_ARG_COUNT];
    int n_params;
} stage_fn_t;

typedef struct variant {
    variant_key_t key;
    stage_fn_t stage[W16_MOE_STAGE_COUNT];
} variant_t;

struct wna16_moe_layer {
    wna16_context_t *ctx;
    const wna16_spec_t *backend;
    w16_problem_t problem; /* `ungated` from the w13 tensor's shape */
    wna16_dtype_t dtype[2][W16_ROLE_COUNT];
    const void *data[2][W16_ROLE_COUNT];
    pthread_mutex_t mu; /* one run at a time: the scratch and the memo */
    variant_t *variants;
    int n_variants, cap_variants;
    /* scratch, grown as needed */
    float *x, *a, *y;
    size_t x_cap, a_cap, y_cap; /* elements */
    int32_t *slot_expert;
    size_t se_cap;
    int32_t *runs; /* first block of each expert's run of blocks, then the end */
    size_t runs_cap;
};

static const w16_role_t roles[4] = {W16_ROLE_QWEIGHT, W16_ROLE_SCALES,
                                    W16_ROLE_QZEROS, W16_ROLE_BIAS};

static bool layer_reads(const w16_problem_t *p, w16_role_t r)
{
    return r == W16_ROLE_QWEIGHT || r == W16_ROLE_SCALES ||
           (r == W16_ROLE_QZEROS && p->zp) || (r == W16_ROLE_BIAS && p->bias);
}

/* ---- binding the tensors -------------------------------------------------- */

static void tensor_name(char *out, size_t n, const char *prefix, int g,
                        const w16_layout_t *l)
{
    const char *op = g == WNA16_GEMM_W13 ? "w13" : "w2";
    if (prefix && *prefix)
        snprintf(out, n, "%s.%s_%s", prefix, op, l->name);
    else
        snprintf(out, n, "%s_%s", op, l->name);
}

static bool same_shape(const wna16_tensor_t *t, const w16_layout_t *l,
                       const int64_t *shape)
{
    if (t->ndim != l->ndim)
        return false;
    for (int d = 0; d < l->ndim; d++)
        if (t->shape[d] != shape[d])
            return false;
    return true;
}

static void shape_text(char *out, size_t n, const w16_layout_t *l,
                       const int64_t *shape)
{
    out[0] = 0;
    for (int d = 0; d < l->ndim; d++)
        snprintf(out + strlen(out), n - strlen(out), "%s%lld", d ? ", " : "",
                 (long long)shape[d]);
}

/* Gated or not, from the w13 qweight tensor's shape. */
static wna16_status_t find_gating(wna16_moe_layer_t *L,
                                  const wna16_tensor_set_t *ts,
                                  const char *prefix, wna16_error_t *err)
{
    const w16_layout_t *l = L->backend->layouts[W16_ROLE_QWEIGHT];
    char name[600];
    tensor_name(name, sizeof name, prefix, WNA16_GEMM_W13, l);
    const wna16_tensor_t *t = wna16_tensor_set_find(ts, name);
    if (!t)
        return w16_err(err, WNA16_ENOTFOUND, "tensor '%s' not found", name);
    int64_t shape[2][W16_MAX_STORE_DIMS];
    for (int ungated = 0; ungated < 2; ungated++) {
        w16_problem_t p = L->problem;
        p.ungated = ungated;
        int64_t v[W16_VAR_COUNT];
        wna16_status_t st = w16_spec_bind(L->backend, &p, WNA16_GEMM_W13, v, err);
        if (st == WNA16_OK)
            st = w16_layout_shape(l, v, shape[ungated], err);
        if (st != WNA16_OK)
            return st;
        if (same_shape(t, l, shape[ungated])) {
            L->problem.ungated = ungated;
            return WNA16_OK;
        }
    }
    char a[128], b[128];
    shape_text(a, sizeof a, l, shape[0]);
    shape_text(b, sizeof b, l, shape[1]);
    return w16_err(err, WNA16_EFORMAT, "tensor '%s': the %s layout needs "
                   "shape [%s] (gate and up) or [%s] (a non-gated layer)",
                   name, L->backend->name, a, b);
}

static wna16_status_t bind_tensor(wna16_moe_layer_t *L,
                                  const wna16_tensor_set_t *ts,
                                  const char *prefix, int g, w16_role_t r,
                                  wna16_error_t *err)
{
    const w16_layout_t *l = L->backend->layouts[r];
    int64_t v[W16_VAR_COUNT], shape[W16_MAX_STORE_DIMS];
    wna16_status_t st = w16_spec_bind(L->backend, &L->problem, (wna16_gemm_t)g,
                                      v, err);
    if (st != WNA16_OK)
        return st;
    if (!w16_layout_present(l, v))
        return w16_err(err, WNA16_EUNSUPPORTED, "%s has no %s layout for this "
                       "layer", L->backend->name, w16_role_key(r));
    if ((st = w16_layout_shape(l, v, shape, err)) != WNA16_OK)
        return st;
    char name[600];
    tensor_name(name, sizeof name, prefix, g, l);
    const wna16_tensor_t *t = wna16_tensor_set_find(ts, name);
    if (!t)
        return w16_err(err, WNA16_ENOTFOUND, "tensor '%s' not found", name);
    bool listed = false;
    for (int i = 0; i < l->n_dtypes; i++)
        listed = listed || l->dtypes[i] == t->dtype;
    if (!listed)
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': dtype %s is not what "
                       "the %s layout stores", name, wna16_dtype_name(t->dtype),
                       w16_role_key(r));
    size_t bytes = wna16_dtype_size(t->dtype);
    for (int d = 0; d < l->ndim; d++)
        bytes *= (size_t)shape[d];
    if (!same_shape(t, l, shape) || t->nbytes < bytes || !t->data) {
        char want[128];
        shape_text(want, sizeof want, l, shape);
        return w16_err(err, WNA16_EFORMAT, "tensor '%s': the %s layout needs "
                       "shape [%s]", name, w16_role_key(r), want);
    }
    L->dtype[g][r] = t->dtype;
    L->data[g][r] = t->data;
    return WNA16_OK;
}

/* A request for the layer with default run parameters (for the checks). */
static w16_moe_request_t base_request(const wna16_moe_layer_t *L)
{
    w16_moe_request_t req = {.backend = L->backend, .problem = L->problem,
                             .topk = 1, .block_m = 1};
    memcpy(req.dtype, L->dtype, sizeof req.dtype);
    wna16_moe_params_init(&req.params);
    req.params.activation = L->problem.ungated ? WNA16_ACT_SILU_NO_MUL
                                               : WNA16_ACT_SILU;
    return req;
}

wna16_status_t wna16_moe_layer_create(wna16_context_t *ctx,
                                      const wna16_spec_t *backend,
                                      const wna16_tensor_set_t *tensors,
                                      const char *prefix, int32_t E,
                                      int32_t H, int32_t I,
                                      const wna16_quant_desc_t *quant,
                                      wna16_target_t target,
                                      wna16_moe_layer_t **out,
                                      wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "moe layer: out is NULL");
    *out = NULL;
    if (!ctx || !backend || !tensors || !quant)
        return w16_err(err, WNA16_EINVAL, "moe layer: %s is NULL",
                       !ctx ? "ctx" : !backend ? "backend" : !tensors
                           ? "tensors" : "quant");
    if (!backend->stacked)
        return w16_err(err, WNA16_EUNSUPPORTED, "%s stores one tensor per "
                       "expert and projection; the generated fused MoE reads "
                       "stacked layouts", backend->name);
    if (target != WNA16_TARGET_CPU)
        return w16_err(err, WNA16_EUNAVAILABLE, "%s target unavailable: the "
                       "generated fused MoE runs on the cpu target (its CUDA "
                       "kernels are compile-checked only)",
                       wna16_target_name(target));
    w16_cpu_t *cpu;
    wna16_status_t st = w16_cpu_get(ctx, &cpu, err);
    if (st != WNA16_OK)
        return st;
    wna16_moe_layer_t *L = calloc(1, sizeof *L);
    if (!L)
        return w16_err_nomem(err, "creating a MoE layer");
    L->ctx = ctx;
    L->backend = backend;
    L->problem = (w16_problem_t){E, H, I, quant->bits, quant->group_size,
                                 quant->zero_point, quant->act_order,
                                 quant->bias};
    pthread_mutex_init(&L->mu, NULL);
    int64_t v13[W16_VAR_COUNT];
    st = w16_spec_bind(backend, &L->problem, WNA16_GEMM_W13, v13, err);
    if (st == WNA16_OK)
        st = w16_check_holds(backend, &L->problem, (int32_t)v13[W16_VAR_IP], err);
    if (st == WNA16_OK && (!backend->layouts[W16_ROLE_QWEIGHT] ||
                           !backend->layouts[W16_ROLE_SCALES]))
        st = w16_err(err, WNA16_EUNSUPPORTED, "%s stores no quantized codes "
                     "and scales (qweight, scales) for the generated fused "
                     "MoE to read", backend->name);
    if (st == WNA16_OK)
        st = find_gating(L, tensors, prefix, err);
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        for (int i = 0; i < 4 && st == WNA16_OK; i++)
            if (layer_reads(&L->problem, roles[i]))
                st = bind_tensor(L, tensors, prefix, g, roles[i], err);
    if (st == WNA16_OK) {
        w16_moe_request_t req = base_request(L);
        st = w16_moe_check(&req, err);
    }
    if (st != WNA16_OK) {
        wna16_moe_layer_destroy(L);
        return st;
    }
    *out = L;
    return WNA16_OK;
}

void wna16_moe_layer_destroy(wna16_moe_layer_t *L)
{
    if (!L)
        return;
    pthread_mutex_destroy(&L->mu);
    free(L->variants);
    free(L->x);
    free(L->a);
    free(L->y);
    free(L->slot_expert);
    free(L->runs);
    free(L);
}

/* ---- kernels ------------------------------------------------------------- */

/* The identity of a compiled kernel: its IR as printed (everything the
 * builder decided), the emitter's version and the CPU target's identity. */
static wna16_status_t kernel_key(wna16_context_t *ctx, const kir_kernel_t *k,
                                 w16_key_t *key, wna16_error_t *err)
{
    w16_cpu_t *cpu;
    wna16_status_t st = w16_cpu_get(ctx, &cpu, err);
    if (st != WNA16_OK)
        return st;
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    kir_print(&b, k);
    if (b.failed) {
        w16_buf_free(&b);
        return w16_err_nomem(err, "keying a kernel");
    }
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 moe kernel");
    w16_keyer_str(&kr, WNA16_VERSION_STRING);
    w16_keyer_u64(&kr, W16_MOE_CPU_EMITTER_VERSION);
    w16_cpu_key(&kr, cpu);
    w16_keyer_bytes(&kr, b.data, b.len);
    *key = w16_keyer_done(&kr);
    w16_buf_free(&b);
    return WNA16_OK;
}

static wna16_status_t compile_stage(wna16_moe_layer_t *L,
                                    const w16_moe_request_t *req,
                                    w16_moe_stage_t s, stage_fn_t *out,
                                    wna16_error_t *err)
{
    w16_moe_kernel_t mk;
    wna16_status_t st = w16_build_moe(L->ctx, req, s, &mk, err);
    if (st != WNA16_OK)
        return st;
    w16_key_t key;
    st = kernel_key(L->ctx, mk.kernel, &key, err);
    if (st == WNA16_OK)
        st = w16_cpu_kernel(L->ctx, key, mk.kernel, &out->fn, err);
    if (st == WNA16_OK) {
        out->tiles = mk.tiles;
        memcpy(out->param, mk.param, sizeof out->param);
        out->n_params = mk.kernel->n_params;
    }
    w16_moe_kernel_free(&mk);
    return st;
}

static variant_key_t make_key(const wna16_moe_params_t *p, bool batched,
                              bool batched_weights, int32_t topk, int block_m)
{
    variant_key_t k;
    memset(&k, 0, sizeof k);
    k.activation = p->activation;
    k.act_dtype = p->act_dtype;
    k.topk = batched ? 0 : topk;
    k.block_m = block_m;
    if (p->activation == WNA16_ACT_SWIGLUOAI ||
        p->activation == WNA16_ACT_SWIGLUSTEP) {
        k.limit = p->swiglu_limit;
        if (p->activation == WNA16_ACT_SWIGLUOAI) {
            k.alpha = p->swiglu_alpha;
            k.beta = p->swiglu_beta;
        }
    }
    k.on_input = p->apply_router_weight_on_input;
    k.round = p->round_gemm_outputs;
    k.batched = batched;
    k.batched_weights = batched && batched_weights;
    return k;
}

/* The configuration's kernels: from the layer's memo, else built and
 * compiled (or found in the kernel cache). */
static wna16_status_t get_variant(wna16_moe_layer_t *L,
                                  const wna16_moe_params_t *p,
                                  const variant_key_t *key,
                                  const variant_t **out, wna16_error_t *err)
{
    for (int i = 0; i < L->n_variants; i++)
        if (memcmp(&L->variants[i].key, key, sizeof *key) == 0) {
            *out = &L->variants[i];
            return WNA16_OK;
        }
    if (L->n_variants == L->cap_variants) {
        int nc = L->cap_variants ? 2 * L->cap_variants : 4;
        variant_t *nv = realloc(L->variants, sizeof *nv * (size_t)nc);
        if (!nv)
            return w16_err_nomem(err, "keeping compiled MoE kernels");
        L->variants = nv;
        L->cap_variants = nc;
    }
    variant_t *v = &L->variants[L->n_variants];
    memset(v, 0, sizeof *v);
    v->key = *key;
    w16_moe_request_t req = base_request(L);
    req.params = *p;
    req.params.expert_map = NULL;
    req.params.global_num_experts = 0;
    req.batched = key->batched;
    req.batched_weights = key->batched_weights;
    req.topk = key->batched ? 1 : key->topk;
    req.block_m = key->block_m;
    for (int s = 0; s < W16_MOE_STAGE_COUNT; s++) {
        wna16_status_t st = compile_stage(L, &req, (w16_moe_stage_t)s,
                                          &v->stage[s], err);
        if (st != WNA16_OK)
            return st;
    }
    L->n_variants++;
    *out = v;
    return WNA16_OK;
}

/* ---- one call -------------------------------------------------------------- */

/* What the kernels of one call read and write. */
typedef struct call {
    const uint16_t *hidden;
    const float *weights;
    uint16_t *out;
    const int32_t *counts;
    int64_t x_rows, out_rows, num_slots, max_tokens;
    wna16_moe_alignment_t al;
} call_t;

static void launch(wna16_moe_layer_t *L, const variant_t *v, w16_moe_stage_t s,
                   const call_t *c, int64_t major)
{
    const stage_fn_t *f = &v->stage[s];
    if (major <= 0)
        return;
    uint64_t args[W16_MOE_ARG_COUNT] = {0};
    uint64_t value[W16_MOE_ARG_COUNT] = {0};
#define PTR(p) ((uint64_t)(uintptr_t)(p))
    value[W16_MOE_ARG_HIDDEN] = PTR(c->hidden);
    value[W16_MOE_ARG_TOPK_WEIGHTS] = PTR(c->weights);
    value[W16_MOE_ARG_X] = PTR(L->x);
    value[W16_MOE_ARG_RUNS] = PTR(L->runs);
    value[W16_MOE_ARG_SORTED] = PTR(c->al.sorted_token_ids);
    value[W16_MOE_ARG_EXPERTS] = PTR(c->al.expert_ids);
    value[W16_MOE_ARG_A] = PTR(L->a);
    value[W16_MOE_ARG_Y] = PTR(L->y);
    value[W16_MOE_ARG_SLOT_EXPERT] = PTR(L->slot_expert);
    value[W16_MOE_ARG_COUNTS] = PTR(c->counts);
    value[W16_MOE_ARG_OUT] = PTR(c->out);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 4; i++)
            value[w16_moe_weight_arg((wna16_gemm_t)g, roles[i])] =
                PTR(L->data[g][roles[i]]);
    value[W16_MOE_ARG_NUM_SLOTS] = (uint64_t)c->num_slots;
    value[W16_MOE_ARG_MAX_TOKENS] = (uint64_t)c->max_tokens;
#undef PTR
    for (int a = 0; a < W16_MOE_ARG_COUNT; a++)
        if (f->param[a] >= 0)
            args[f->param[a]] = value[a];
    int64_t groups = major * f->tiles;
    /* The element-wise stages of small calls run on the calling thread:
     * waking the pool costs more than they do. */
    bool small = (s == W16_MOE_INPUT || s == W16_MOE_COMBINE) &&
                 major * L->problem.H <= SMALL_STAGE;
    w16_cpu_t *cpu;
    if (small)
        f->fn(args, 0, groups, groups);
    else if (w16_cpu_get(L->ctx, &cpu, NULL) == WNA16_OK)
        w16_cpu_launch(cpu, f->fn, args, groups);
}

/* Grows a scratch array to n elements of `size` bytes. */
static bool reserve(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap)
        return true;
    size_t bytes;
    if (!w16_mul_size(n, size, &bytes))
        return false;
    void *np = realloc(*p, bytes);
    if (!np)
        return false;
    *p = np;
    *cap = n;
    return true;
}

static wna16_status_t reserve_scratch(wna16_moe_layer_t *L, int64_t x_rows,
                                      int64_t slots, wna16_error_t *err)
{
    size_t H = (size_t)L->problem.H, I = (size_t)L->problem.I, nx, na, ny;
    size_t xr = x_rows > 0 ? (size_t)x_rows : 1, sl = slots > 0 ? (size_t)slots : 1;
    if (!w16_mul_size(xr, H, &nx) || !w16_mul_size(sl, I, &na) ||
        !w16_mul_size(sl, H, &ny) ||
        !reserve((void **)&L->x, &L->x_cap, nx, sizeof(float)) ||
        !reserve((void **)&L->a, &L->a_cap, na, sizeof(float)) ||
        !reserve((void **)&L->y, &L->y_cap, ny, sizeof(float)))
        return w16_err_nomem(err, "the fused MoE's scratch buffers");
    return WNA16_OK;
}

/* Slots per block: the block size with the least GEMM work, counted as
 * the blocks the routing needs (sum over experts of ceil(slots / BM))
 * times the cost of one block relative to a block of one slot. Every
 * expert's weights are read once whatever BM is (its blocks run
 * together), so the choice trades padded slots against the per-weight
 * work that a bigger block shares: a block of 2 slots costs about 1.4
 * blocks of 1, a block of 4 about 2.4 (gemm1 and gemm2 on znver4). */
static int pick_block_m(const int64_t *per_expert, int32_t E)
{
    static const struct {
        int bm;
        double cost;
    } sizes[] = {{1, 1.0}, {2, 1.4}, {4, 2.4}};
    int best = 1;
    double best_cost = 0;
    for (size_t i = 0; i < W16_ARRAY_LEN(sizes); i++) {
        int64_t blocks = 0;
        for (int32_t e = 0; e < E; e++)
            blocks += (per_expert[e] + sizes[i].bm - 1) / sizes[i].bm;
        double cost = (double)blocks * sizes[i].cost;
        if (i == 0 || cost < best_cost) {
            best = sizes[i].bm;
            best_cost = cost;
        }
    }
    return best;
}

static wna16_status_t run_call(wna16_moe_layer_t *L, const wna16_moe_params_t *p,
                               call_t *c, bool batched, bool batched_weights,
                               int32_t topk, int block_m, wna16_error_t *err)
{
    const variant_t *v = NULL;
    variant_key_t key = make_key(p, batched, batched_weights, topk, block_m);
    wna16_status_t st = reserve_scratch(L, c->x_rows, c->num_slots, err);
    if (st == WNA16_OK)
        st = get_variant(L, p, &key, &v, err);
    if (st != WNA16_OK)
        return st;
    /* the blocks of one expert are consecutive: one run per expert */
    int64_t blocks = c->al.num_tokens_post_padded / block_m, runs = 0;
    if (!reserve((void **)&L->runs, &L->runs_cap, (size_t)blocks + 1,
                 sizeof(int32_t)))
        return w16_err_nomem(err, "the fused MoE's expert runs");
    for (int64_t b = 0; b < blocks; b++)
        if (b == 0 || c->al.expert_ids[b] != c->al.expert_ids[b - 1])
            L->runs[runs++] = (int32_t)b;
    L->runs[runs] = (int32_t)blocks;
    launch(L, v, W16_MOE_INPUT, c, c->x_rows);
    launch(L, v, W16_MOE_GEMM1, c, runs);
    launch(L, v, W16_MOE_GEMM2, c, runs);
    launch(L, v, W16_MOE_COMBINE, c, c->out_rows);
    return WNA16_OK;
}

/* ---- argument checks (the reference's rules and messages) ---------------- */

static wna16_status_t check_gating(const wna16_moe_layer_t *L,
                                   const wna16_moe_params_t *p,
                                   wna16_error_t *err)
{
    if (wna16_activation_is_gated(p->activation) != !L->problem.ungated)
        return w16_err(err, WNA16_EINVAL, "moe: activation %s %s, but the "
                       "layer's w13 holds %s", wna16_activation_name(p->activation),
                       L->problem.ungated ? "is gated" : "is not gated",
                       L->problem.ungated ? "one projection (N = I)"
                                          : "gate and up (N = 2I)");
    return WNA16_OK;
}

/* Local expert of every slot (-1: absent), validating ids and the map. */
static wna16_status_t route_slots(wna16_moe_layer_t *L,
                                  const wna16_moe_params_t *p,
                                  const int32_t *ids, int32_t M, int32_t topk,
                                  int64_t *per_expert, wna16_error_t *err)
{
    int32_t E = (int32_t)L->problem.E, n_ids = E;
    if (!p->expert_map) {
        if (p->global_num_experts != 0 && p->global_num_experts != E)
            return w16_err(err, WNA16_EINVAL, "moe: global_num_experts = %d "
                           "without an expert_map (must be 0 or E = %d)",
                           p->global_num_experts, E);
    } else {
        if (p->global_num_experts < 1)
            return w16_err(err, WNA16_EINVAL, "moe: expert_map needs "
                           "global_num_experts >= 1 (got %d)",
                           p->global_num_experts);
        for (int32_t g = 0; g < p->global_num_experts; g++)
            if (p->expert_map[g] < -1 || p->expert_map[g] >= E)
                return w16_err(err, WNA16_EINVAL, "moe: expert_map[%d] = %d is "
                               "neither -1 nor a local expert in [0, %d)", g,
                               p->expert_map[g], E);
        n_ids = p->global_num_experts;
    }
    if (topk < 1)
        return w16_err(err, WNA16_EINVAL, "moe: topk = %d (must be >= 1)", topk);
    if (topk > n_ids)
        return w16_err(err, WNA16_EINVAL, "moe: topk = %d exceeds the %d "
                       "experts", topk, n_ids);
    size_t slots = (size_t)M * (size_t)topk;
    if (!reserve((void **)&L->slot_expert, &L->se_cap, slots ? slots : 1,
                 sizeof(int32_t)))
        return w16_err_nomem(err, "routing the fused MoE");
    for (size_t s = 0; s < slots; s++) {
        int32_t g = ids[s];
        if (g < 0 || g >= n_ids)
            return w16_err(err, WNA16_EINVAL, "moe: topk_ids[%d][%d] = %d is "
                           "not an expert id in [0, %d)", (int32_t)(s / topk),
                           (int32_t)(s % topk), g, n_ids);
        int32_t e = p->expert_map ? p->expert_map[g] : g;
        L->slot_expert[s] = e;
        if (e >= 0)
            per_expert[e]++;
    }
    return WNA16_OK;
}

static wna16_status_t check_common(wna16_moe_layer_t *L,
                                   const wna16_moe_params_t *p,
                                   wna16_error_t *err)
{
    if (!L)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    wna16_status_t st = w16_moe_check_params(p, err);
    if (st == WNA16_OK)
        st = check_gating(L, p, err);
    return st;
}

wna16_status_t wna16_moe_layer_run(wna16_moe_layer_t *L,
                                   const wna16_moe_params_t *p,
                                   const void *hidden, int32_t M,
                                   const int32_t *topk_ids,
                                   const float *topk_weights, int32_t topk,
                                   void *out, wna16_error_t *err)
{
    wna16_status_t st = check_common(L, p, err);
    if (st != WNA16_OK)
        return st;
    if (M < 0)
        return w16_err(err, WNA16_EINVAL, "moe: M = %d tokens (must be >= "
                       "0)", M);
    if (M > 0 && (!hidden || !topk_ids || !topk_weights || !out))
        return w16_err(err, WNA16_EINVAL, "moe: %s is NULL",
                       !hidden ? "hidden" : !topk_ids ? "topk_ids" :
                       !topk_weights ? "topk_weights" : "out");
    int32_t E = (int32_t)L->problem.E;
    int64_t *per_expert = calloc((size_t)E, sizeof *per_expert);
    if (!per_expert)
        return w16_err_nomem(err, "routing the fused MoE");
    pthread_mutex_lock(&L->mu);
    st = route_slots(L, p, topk_ids, M, topk, per_expert, err);
    if (st == WNA16_OK && M > 0) {
        int bm = pick_block_m(per_expert, E);
        call_t c = {.hidden = hidden, .weights = topk_weights, .out = out,
                    .num_slots = (int64_t)M * topk, .out_rows = M};
        c.x_rows = p->apply_router_weight_on_input ? c.num_slots : M;
        st = wna16_moe_align(topk_ids, M, topk, p->expert_map
                                 ? p->global_num_experts : E,
                             p->expert_map, bm, &c.al, err);
        if (st == WNA16_OK)
            st = run_call(L, p, &c, false, false, topk, bm, err);
        wna16_moe_alignment_free(&c.al);
    }
    pthread_mutex_unlock(&L->mu);
    free(per_expert);
    return st;
}

wna16_status_t wna16_moe_layer_run_batched(wna16_moe_layer_t *L,
                                           const wna16_moe_params_t *p,
                                           const void *hidden,
                                           int32_t max_tokens,
                                           const int32_t *expert_num_tokens,
                                           const float *weights, void *out,
                                           wna16_error_t *err)
{
    wna16_status_t st = check_common(L, p, err);
    if (st != WNA16_OK)
        return st;
    int32_t E = (int32_t)L->problem.E;
    if (max_tokens < 0)
        return w16_err(err, WNA16_EINVAL, "moe batched: max_tokens = %d "
                       "(must be >= 0)", max_tokens);
    if (!expert_num_tokens)
        return w16_err(err, WNA16_EINVAL, "moe batched: expert_num_tokens "
                       "is NULL");
    if (max_tokens > 0 && (!hidden || !out))
        return w16_err(err, WNA16_EINVAL, "moe batched: %s is NULL",
                       !hidden ? "hidden" : "out");
    int64_t *per_expert = calloc((size_t)E, sizeof *per_expert);
    if (!per_expert)
        return w16_err_nomem(err, "routing the fused MoE");
    for (int32_t e = 0; e < E; e++) {
        int32_t n = expert_num_tokens[e];
        if (n < 0 || n > max_tokens) {
            free(per_expert);
            return w16_err(err, WNA16_EINVAL, "moe batched: "
                           "expert_num_tokens[%d] = %d is outside [0, "
                           "max_tokens = %d]", e, n, max_tokens);
        }
        per_expert[e] = n;
    }
    if (max_tokens == 0) {
        free(per_expert);
        return WNA16_OK;
    }
    pthread_mutex_lock(&L->mu);
    int bm = pick_block_m(per_expert, E);
    int64_t rows = (int64_t)E * max_tokens;
    call_t c = {.hidden = hidden, .weights = weights, .out = out,
                .counts = expert_num_tokens, .x_rows = rows, .out_rows = rows,
                .num_slots = rows, .max_tokens = max_tokens};
    st = wna16_moe_align_batched(expert_num_tokens, E, max_tokens, bm, &c.al,
                                 err);
    if (st == WNA16_OK)
        st = run_call(L, p, &c, true, weights != NULL, 1, bm, err);
    wna16_moe_alignment_free(&c.al);
    pthread_mutex_unlock(&L->mu);
    free(per_expert);
    return st;
}
