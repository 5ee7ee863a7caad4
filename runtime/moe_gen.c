/*
 * moe_gen.c - the generated fused MoE (wna16_moe_layer_*): binds a layer's
 * stacked backend tensors, routes each call (wna16_moe_align: slots sorted
 * by expert, cut into one run per expert, each run with the block size
 * that costs it least), builds the kernels of the configuration
 * (gen/build_moe.c) on first use, compiles them through the context's
 * kernel cache and launches them. How a call runs is the target's
 * moe_orch (runtime/target/target.h):
 *
 *   HOST (the CPU: the orchestration here reads and writes the buffers
 *   the kernels do, between launches)
 *     check args -> route (slot experts, align, runs by block size)
 *     -> scratch -> kernels of the configuration (memo, else build + cache)
 *     -> input, gemm1 per block size, gemm2 per block size, combine
 *
 *   DEVICE (xpu, ocl: the weights put on the target once, at create)
 *     check args -> one block size for the call -> kernels (route too)
 *     -> a stream: inputs put, scratch, output
 *     -> route, input, gemm1, gemm2, combine: grids from upper bounds
 *        (the GEMMs' workgroups past the routed block count exit), no host
 *        read between launches -> output back
 *
 * Arguments are checked exactly as the reference checks them (same
 * messages), before any work.
 */
#include "gen/build_moe.h"
#include "gen/build_route.h"
#include "gen/moe_cpu.h"
#include "gen/request_key.h"
#include "runtime/cache/cache.h"
#include "runtime/ref/moe.h"
#include "runtime/ref/ref.h"
#include "runtime/targets.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Elements up to which the input and combine stages run on the calling
 * thread rather than the pool. */
#define SMALL_STAGE (INT64_C(1) << 16)

/* GEMM kernels are built for these slots per K pass; each expert's run
 * takes the one with the least work (pick_block). */
static const int block_sizes[] = {1, 2, 4};
#define N_BLOCK_SIZES 3

/* Everything a call's kernels depend on besides the layer and the block
 * size. Filled after a memset so that keys compare with memcmp. */
typedef struct variant_key {
    int32_t activation, act_dtype, topk;
    float limit, alpha, beta; /* swiglu constants, 0 for the others */
    uint8_t on_input, round, batched, batched_weights;
} variant_key_t;

typedef struct stage_fn {
    void *fn; /* the loaded kernel; NULL until built */
    int lanes, n_params;
    int64_t tiles;
    int param[W16_MOE_ARG_COUNT];
} stage_fn_t;

/* A configuration's kernels: input and combine, and the GEMMs for each
 * block size, built when first needed. */
typedef struct variant {
    variant_key_t key;
    stage_fn_t input, combine;
    stage_fn_t gemm[2][N_BLOCK_SIZES]; /* [gemm1, gemm2][block size] */
} variant_t;

/* The routing kernel of one shape (device orchestration). */
typedef struct route_fn {
    void *fn; /* NULL until built */
    int lanes, n_params;
    int param[W16_ROUTE_ARG_COUNT];
} route_fn_t;

struct wna16_moe_layer {
    wna16_context_t *ctx;
    const w16_target_t *T;  /* where the kernels run */
    void *inst;             /* T's instance */
    w16_stream_t *stream;   /* their launches */
    const wna16_spec_t *backend;
    w16_problem_t problem; /* `ungated` from the w13 tensor's shape */
    /* quant->model_dtype: every run's activations must be in it (0: any;
     * said once per context) */
    wna16_dtype_t model_dtype;
    wna16_dtype_t dtype[2][W16_ROLE_COUNT];
    const void *data[2][W16_ROLE_COUNT];
    pthread_mutex_t mu; /* one run at a time: the scratch and the memo */
    /* The GEMMs' numeric contract (choose_numerics). `native`: the input
     * and GEMM stages come from the dedicated CPU generator (gen/moe_cpu.h)
     * for the host's vector features `isa`; else every stage is
     * build_moe.c's, computing F32 or BF16_EXACT. */
    wna16_numerics_t numerics;
    bool native;
    unsigned isa;
    w16_moe_cpu_layout_t cpu_layout; /* what the probe found */
    variant_t *variants;
    int n_variants, cap_variants;
    /* scratch, grown as needed */
    float *x, *a, *y;
    size_t x_cap, a_cap, y_cap; /* elements */
    int32_t *slot_expert;
    size_t se_cap;
    /* expert runs (begin, end, expert), one list per block size */
    int32_t *runs[N_BLOCK_SIZES];
    size_t runs_cap[N_BLOCK_SIZES];
    /* ---- device orchestration (T->moe_orch DEVICE) ---- */
    size_t nbytes[2][W16_ROLE_COUNT];  /* the weight tensors' bytes */
    uint64_t dev[2][W16_ROLE_COUNT];   /* where kernels read them (put on
                                          `stream` at create) */
    w16_stream_t *scratch_stream;      /* holds `scratch`; reopened to grow */
    uint64_t scratch;
    size_t scratch_cap;
    route_fn_t route[2][2][N_BLOCK_SIZES]; /* [batched][map][block size] */
    uint64_t device_calls; /* calls routed on the device (w16_moe_layer_device_calls) */
};

#define N_ROLES 6
static const w16_role_t roles[N_ROLES] = {
    W16_ROLE_QWEIGHT, W16_ROLE_SCALES, W16_ROLE_QZEROS, W16_ROLE_BIAS,
    W16_ROLE_G_IDX, W16_ROLE_SORT_IDX};

/* The roles a layer's kernels read: act order adds g_idx, and the sort
 * indices where the backend stores K sorted (act_order_sort). */
static bool layer_reads(const wna16_moe_layer_t *L, w16_role_t r)
{
    const w16_problem_t *p = &L->problem;
    return r == W16_ROLE_QWEIGHT || r == W16_ROLE_SCALES ||
           (r == W16_ROLE_QZEROS && p->zp) || (r == W16_ROLE_BIAS && p->bias) ||
           (r == W16_ROLE_G_IDX && p->act_order) ||
           (r == W16_ROLE_SORT_IDX && p->act_order &&
            L->backend->act_order_sort);
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
    L->nbytes[g][r] = bytes;
    return w16_moe_check_tensor_dtype(l, L->model_dtype, name, t->dtype, err);
}

/* Act order: the kernels index scales by g_idx and inputs by the sort
 * indices without bounds checks, so the values are checked once here:
 * every g_idx a group of the layer, every row of sort indices a
 * permutation (the tensors must not change while the layer lives). */
static wna16_status_t check_act_order(const wna16_moe_layer_t *L,
                                      const char *prefix, wna16_error_t *err)
{
    for (int g = 0; g < 2; g++) {
        int64_t v[W16_VAR_COUNT];
        wna16_status_t st = w16_spec_bind(L->backend, &L->problem,
                                          (wna16_gemm_t)g, v, err);
        if (st != WNA16_OK)
            return st;
        int64_t E = v[W16_VAR_E], K = v[W16_VAR_K], G = v[W16_VAR_G];
        const int32_t *gi = L->data[g][W16_ROLE_G_IDX];
        const int32_t *pm = L->data[g][W16_ROLE_SORT_IDX];
        if ((size_t)(E * K) * 4 > L->nbytes[g][W16_ROLE_G_IDX] ||
            (pm && (size_t)(E * K) * 4 > L->nbytes[g][W16_ROLE_SORT_IDX]))
            return w16_err(err, WNA16_EFORMAT, "%s.%s: act-order tensors "
                           "hold fewer than E x K = %lld x %lld values",
                           prefix, g ? "w2" : "w13", (long long)E,
                           (long long)K);
        uint8_t *seen = pm ? calloc((size_t)K, 1) : NULL;
        if (pm && !seen)
            return w16_err_nomem(err, "checking act-order sort indices");
        for (int64_t e = 0; e < E; e++) {
            if (seen)
                memset(seen, 0, (size_t)K);
            for (int64_t k = 0; k < K; k++) {
                int32_t a = gi[e * K + k];
                if (a < 0 || a >= G) {
                    free(seen);
                    return w16_err(err, WNA16_EFORMAT, "%s: %s g_idx[%lld][%lld]"
                                   " = %d is not a group of the layer (0..%lld)",
                                   prefix, g ? "w2" : "w13", (long long)e,
                                   (long long)k, a, (long long)(G - 1));
                }
                if (!pm)
                    continue;
                int32_t b = pm[e * K + k];
                if (b < 0 || b >= K || seen[b]++) {
                    free(seen);
                    return w16_err(err, WNA16_EFORMAT, "%s: %s "
                                   "g_idx_sort_indices[%lld] is not a "
                                   "permutation of 0..%lld (at %lld: %d)",
                                   prefix, g ? "w2" : "w13", (long long)e,
                                   (long long)(K - 1), (long long)k, b);
                }
            }
        }
        free(seen);
    }
    return WNA16_OK;
}

/* A request for the layer with default run parameters (for the checks). */
static w16_moe_request_t base_request(const wna16_moe_layer_t *L)
{
    w16_moe_request_t req = {.backend = L->backend, .problem = L->problem,
                             .topk = 1, .block_m = 1};
    memcpy(req.dtype, L->dtype, sizeof req.dtype);
    /* the qweight buffers' common alignment, up to a 32-bit word: words
     * let the K loops read whole words of codes */
    uintptr_t addr = 0;
    for (int g = 0; g < 2; g++)
        addr |= (uintptr_t)L->data[g][W16_ROLE_QWEIGHT];
    req.qweight_align = addr % 4 == 0 ? 4 : addr % 2 == 0 ? 2 : 1;
    wna16_moe_params_init(&req.params);
    req.params.activation = L->problem.ungated ? WNA16_ACT_SILU_NO_MUL
                                               : WNA16_ACT_SILU;
    req.numerics = L->native ? WNA16_NUMERICS_F32 : L->numerics;
    return req;
}

/* Device orchestration: every weight tensor where the kernels read it, on
 * the layer's stream until it is destroyed (a copy in device memory; the
 * host address itself on a host-memory target). */
static wna16_status_t put_weights(wna16_moe_layer_t *L, wna16_error_t *err)
{
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < N_ROLES; i++)
            if (layer_reads(L, roles[i])) {
                w16_role_t r = roles[i];
                wna16_status_t st = L->T->put(L->stream, L->data[g][r],
                                              L->nbytes[g][r], &L->dev[g][r],
                                              err);
                if (st != WNA16_OK)
                    return st;
            }
    return WNA16_OK;
}

/* The GEMMs' numeric contract. By default the first of the spec's
 * contracts that the dedicated CPU generator builds for this layer on this
 * host (its layout's maps probed), else the portable kernels' f32.
 * $WNA16_NUMERICS names one to prefer; asked for bf16-exact where the
 * dedicated kernels cannot run it, the portable kernels compute it (every
 * layout, every target). Logged once per reason, naming what ran and why. */
static void choose_numerics(wna16_moe_layer_t *L, void *inst)
{
    L->numerics = WNA16_NUMERICS_F32;
    L->native = false;
    w16_target_device_t dev = {0};
    if (L->T->describe)
        L->T->describe(inst, &dev);
    L->isa = w16_moe_cpu_isa(dev.cpu_features);
    const char *env = getenv("WNA16_NUMERICS");
    wna16_numerics_t want = env && *env ? wna16_numerics_from_name(env)
                                        : WNA16_NUMERICS_INVALID;
    if (env && *env && want == WNA16_NUMERICS_INVALID)
        w16_log_once(L->ctx, WNA16_LOG_WARN, "moe_numerics_env", "moe layer: "
                     "WNA16_NUMERICS=%s names no numeric contract (f32, "
                     "int8-dynamic, bf16-exact); ignored", env);
    const wna16_spec_t *s = L->backend;
    char why[512] = "";
    for (int i = -1; i < s->caps.n_numerics; i++) {
        wna16_numerics_t n = i < 0 ? want : s->caps.numerics[i];
        if (n == WNA16_NUMERICS_INVALID || n == WNA16_NUMERICS_F32)
            continue;
        if (i >= 0 && want == WNA16_NUMERICS_F32)
            break;
        bool listed = false;
        for (int j = 0; j < s->caps.n_numerics; j++)
            listed = listed || s->caps.numerics[j] == n;
        if (!listed) {
            snprintf(why, sizeof why, "the %s spec does not list %s",
                     s->name, wna16_numerics_name(n));
            continue;
        }
        if (n == WNA16_NUMERICS_BF16_EXACT &&
            L->model_dtype != WNA16_DTYPE_BF16) {
            snprintf(why, sizeof why, "bf16-exact multiplies bf16 "
                     "activations: the layer's model dtype (quant->"
                     "model_dtype) must be bfloat16");
            continue;
        }
        w16_moe_request_t req = base_request(L);
        req.params.act_dtype = WNA16_DTYPE_BF16;
        wna16_error_t e = {0};
        if (L->ctx->no_jit) {
            snprintf(why, sizeof why, "JIT compilation is disabled "
                     "(WNA16_JIT=0): kernel packs hold the portable f32 "
                     "kernels only");
            break;
        }
        if (!dev.cpu_features)
            snprintf(why, sizeof why, "the %s target runs the portable "
                     "kernels only", L->T->name);
        else if (w16_moe_cpu_probe(&req, n, L->isa, &L->cpu_layout, &e) ==
                 WNA16_OK) {
            L->numerics = n;
            L->native = true;
            break;
        } else
            snprintf(why, sizeof why, "%s", e.message);
        /* asked for bf16-exact: the portable kernels round each weight */
        if (i < 0 && n == WNA16_NUMERICS_BF16_EXACT) {
            L->numerics = n;
            break;
        }
        if (!dev.cpu_features)
            break;
    }
    if (L->native)
        w16_log_once(L->ctx, WNA16_LOG_INFO, "moe_numerics_native", "moe "
                     "layer: %s GEMMs run the dedicated CPU kernels "
                     "(%s: AVX-512 dot products)", s->name,
                     wna16_numerics_name(L->numerics));
    else if (L->numerics == WNA16_NUMERICS_BF16_EXACT)
        w16_log_once(L->ctx, WNA16_LOG_INFO, "moe_numerics_bf16_portable",
                     "moe layer: %s GEMMs run the portable kernels under "
                     "bf16-exact (each weight rounded to bf16; the dedicated "
                     "ones do not apply: %s)", s->name, why);
    else if (why[0])
        w16_log_once(L->ctx, WNA16_LOG_INFO, "moe_numerics_f32", "moe layer: "
                     "%s GEMMs run the portable f32 kernels: %s", s->name,
                     why);
}

wna16_numerics_t wna16_moe_layer_numerics(const wna16_moe_layer_t *L)
{
    return L ? L->numerics : WNA16_NUMERICS_INVALID;
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
    /* what the target can do decides before whether it is here */
    const w16_target_t *T = w16_target_find(target);
    if (T && T->moe_orch == W16_MOE_ORCH_NONE)
        return w16_err(err, WNA16_EUNAVAILABLE, "%s target unavailable: the "
                       "generated fused MoE does not run there (its %s "
                       "kernels are compile-checked only; the tensor-core "
                       "fused MoE is wna16_cuda_moe_*)", T->name, T->name);
    void *inst = NULL;
    wna16_status_t st = w16_target_probe(ctx, target, &T, &inst, err);
    if (st != WNA16_OK)
        return st;
    wna16_moe_layer_t *L = calloc(1, sizeof *L);
    if (!L)
        return w16_err_nomem(err, "creating a MoE layer");
    L->ctx = ctx;
    L->T = T;
    L->inst = inst;
    pthread_mutex_init(&L->mu, NULL);
    st = T->stream_open(inst, ctx, &L->stream, err);
    if (st != WNA16_OK) {
        pthread_mutex_destroy(&L->mu);
        free(L);
        return st;
    }
    L->backend = backend;
    L->problem = (w16_problem_t){E, H, I, quant->bits, quant->group_size,
                                 quant->zero_point, quant->act_order,
                                 quant->bias};
    L->model_dtype = quant->model_dtype;
    int64_t v13[W16_VAR_COUNT];
    st = w16_moe_check_model_dtype(quant->model_dtype, err);
    if (st == WNA16_OK)
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
        for (int i = 0; i < N_ROLES && st == WNA16_OK; i++)
            if (layer_reads(L, roles[i]))
                st = bind_tensor(L, tensors, prefix, g, roles[i], err);
    if (st == WNA16_OK && L->problem.act_order)
        st = check_act_order(L, prefix, err);
    if (st == WNA16_OK) {
        w16_moe_request_t req = base_request(L);
        st = w16_moe_check(&req, err);
    }
    if (st == WNA16_OK && T->moe_orch == W16_MOE_ORCH_DEVICE)
        st = put_weights(L, err);
    if (st != WNA16_OK) {
        wna16_moe_layer_destroy(L);
        return st;
    }
    choose_numerics(L, inst);
    if (!L->model_dtype)
        w16_log_once(ctx, WNA16_LOG_INFO, "moe_no_model_dtype", "moe layer: "
                     "created without a model dtype (quant->model_dtype 0): "
                     "activations of either 16-bit dtype are taken against "
                     "its scales; vLLM's kernels take the model's dtype for "
                     "both");
    if (base_request(L).qweight_align < 4)
        w16_log_once(ctx, WNA16_LOG_INFO, "moe_qweight_unaligned", "moe "
                     "layer: a qweight tensor is not 4-byte aligned; the "
                     "GEMM kernels read its codes element by element rather "
                     "than by 32-bit words (slower)");
    *out = L;
    return WNA16_OK;
}

void wna16_moe_layer_destroy(wna16_moe_layer_t *L)
{
    if (!L)
        return;
    if (L->scratch_stream)
        L->T->stream_close(L->scratch_stream, WNA16_OK, NULL);
    if (L->stream)
        L->T->stream_close(L->stream, WNA16_OK, NULL);
    pthread_mutex_destroy(&L->mu);
    free(L->variants);
    free(L->x);
    free(L->a);
    free(L->y);
    free(L->slot_expert);
    for (int i = 0; i < N_BLOCK_SIZES; i++)
        free(L->runs[i]);
    free(L);
}

/* ---- kernels ------------------------------------------------------------- */

/* Does stage s come from the dedicated CPU generator? (combine is always
 * build_moe.c's) */
static bool native_stage(const wna16_moe_layer_t *L, w16_moe_stage_t s)
{
    return L->native && s != W16_MOE_COMBINE;
}

/* The request key of stage s: a dedicated CPU kernel's differs from the
 * portable one's (a kernel pack holds portable kernels by request). */
static w16_key_t stage_key(const wna16_moe_layer_t *L,
                           const w16_moe_request_t *req, w16_moe_stage_t s)
{
    w16_key_t rk = w16_moe_request_key(req, s);
    if (!native_stage(L, s))
        return rk;
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 moe_cpu stage");
    w16_keyer_u64(&kr, rk.hi);
    w16_keyer_u64(&kr, rk.lo);
    w16_keyer_u64(&kr, (uint64_t)L->numerics);
    w16_keyer_u64(&kr, W16_MOE_CPU_VERSION);
    return w16_keyer_done(&kr);
}

/* A stage's kernel with its launch shape, kept in the context's plans
 * (runtime/repack_plan.c keeps repack plans there too) by request key, so
 * that every layer of one configuration finds it without building the
 * kernel again; a miss builds it and looks it up by request in the kernel
 * packs, then by content in the kernel cache. */
typedef struct stage_plan {
    stage_fn_t f;
    wna16_context_t *ctx; /* owner (frees the plan) */
} stage_plan_t;

typedef struct stage_job {
    wna16_moe_layer_t *L;
    const w16_moe_request_t *req;
    w16_moe_stage_t stage;
} stage_job_t;

static wna16_status_t stage_build(void *user, w16_key_t key, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    (void)key;
    stage_job_t *J = user;
    w16_moe_kernel_t mk;
    wna16_status_t st = native_stage(J->L, J->stage)
        ? w16_build_moe_cpu(J->L->ctx, J->req, J->L->numerics, J->L->isa,
                            &J->L->cpu_layout, J->stage, &mk, err)
        : w16_build_moe(J->L->ctx, J->req, J->stage, &mk, err);
    if (st != WNA16_OK)
        return st;
    stage_plan_t *p = w16_calloc(J->L->ctx, 1, sizeof *p);
    if (!p)
        st = w16_err_nomem(err, "keeping a compiled MoE kernel");
    if (st == WNA16_OK)
        st = w16_target_kernel_req(J->L->ctx, J->L->T, "wna16 moe kernel",
                                   stage_key(J->L, J->req, J->stage),
                                   mk.kernel, &p->f.fn, NULL, err);
    if (st == WNA16_OK) {
        p->ctx = J->L->ctx;
        p->f.lanes = mk.kernel->lanes;
        p->f.n_params = mk.kernel->n_params;
        p->f.tiles = mk.tiles;
        memcpy(p->f.param, mk.param, sizeof p->f.param);
        *blob = p;
        *size = sizeof *p;
    } else if (p) {
        w16_free(J->L->ctx, p, sizeof *p);
    }
    w16_moe_kernel_free(&mk);
    return st;
}

static wna16_status_t stage_load(void *user, const void *blob, size_t size,
                                 void **handle, wna16_error_t *err)
{
    stage_job_t *J = user;
    if (size != sizeof(stage_plan_t))
        return w16_err(err, WNA16_EINTERNAL, "MoE stage plan of %zu bytes",
                       size);
    stage_plan_t *p = w16_alloc(J->L->ctx, sizeof *p);
    if (!p)
        return w16_err_nomem(err, "loading a MoE stage plan");
    memcpy(p, blob, sizeof *p);
    *handle = p;
    return WNA16_OK;
}

static void stage_unload(void *user, void *handle)
{
    (void)user;
    stage_plan_t *p = handle;
    w16_free(p->ctx, p, sizeof *p);
}

static wna16_status_t compile_stage(wna16_moe_layer_t *L,
                                    const w16_moe_request_t *req,
                                    w16_moe_stage_t s, stage_fn_t *out,
                                    wna16_error_t *err)
{
    w16_cache_t *plans;
    wna16_status_t st = w16_context_plans(L->ctx, &plans, err);
    if (st != WNA16_OK)
        return st;
    w16_key_t rk = stage_key(L, req, s);
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 moe stage plan");
    w16_keyer_u64(&kr, rk.hi);
    w16_keyer_u64(&kr, rk.lo);
    w16_keyer_u64(&kr, (uint64_t)L->T->id);
    stage_job_t J = {.L = L, .req = req, .stage = s};
    w16_cache_loader_t loader = {stage_build, stage_load, stage_unload, &J};
    void *h = NULL;
    st = w16_cache_get(plans, w16_keyer_done(&kr), &loader, &h, err);
    if (st == WNA16_OK)
        *out = ((const stage_plan_t *)h)->f;
    return st;
}

static variant_key_t make_key(const wna16_moe_params_t *p, bool batched,
                              bool batched_weights, int32_t topk)
{
    variant_key_t k;
    memset(&k, 0, sizeof k);
    k.activation = p->activation;
    k.act_dtype = p->act_dtype;
    k.topk = batched ? 0 : topk;
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

/* The request that builds a configuration's kernels. */
static w16_moe_request_t variant_request(const wna16_moe_layer_t *L,
                                         const wna16_moe_params_t *p,
                                         const variant_key_t *key, int block_m)
{
    w16_moe_request_t req = base_request(L);
    req.params = *p;
    req.params.expert_map = NULL;
    req.params.global_num_experts = 0;
    req.batched = key->batched;
    req.batched_weights = key->batched_weights;
    req.topk = key->batched ? 1 : key->topk;
    req.block_m = block_m;
    req.device_route = L->T->moe_orch == W16_MOE_ORCH_DEVICE;
    /* the spec's workgroup for this block size (its tiling table holds
     * one per value of rows), else the builder's default */
    const w16_ptiling_t *t = L->backend->portable_tiling;
    for (int i = 0; t && i < t->n_row; i++)
        if (t->row[i].rows == block_m)
            req.lanes = t->row[i].workgroup;
    return req;
}

/* The configuration's entry in the layer's memo, with its input and
 * combine kernels (built, or found in the kernel cache, when new). */
static wna16_status_t get_variant(wna16_moe_layer_t *L,
                                  const wna16_moe_params_t *p,
                                  const variant_key_t *key, variant_t **out,
                                  wna16_error_t *err)
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
    w16_moe_request_t req = variant_request(L, p, key, 1);
    wna16_status_t st = compile_stage(L, &req, W16_MOE_INPUT, &v->input, err);
    if (st == WNA16_OK)
        st = compile_stage(L, &req, W16_MOE_COMBINE, &v->combine, err);
    if (st != WNA16_OK)
        return st;
    L->n_variants++;
    *out = v;
    return WNA16_OK;
}

/* The GEMM kernel of `stage` for block size index b, built if needed. */
static wna16_status_t get_gemm(wna16_moe_layer_t *L, const wna16_moe_params_t *p,
                               variant_t *v, w16_moe_stage_t stage, int b,
                               const stage_fn_t **out, wna16_error_t *err)
{
    stage_fn_t *f = &v->gemm[stage == W16_MOE_GEMM1 ? 0 : 1][b];
    if (!f->fn) {
        w16_moe_request_t req = variant_request(L, p, &v->key, block_sizes[b]);
        wna16_status_t st = compile_stage(L, &req, stage, f, err);
        if (st != WNA16_OK) {
            f->fn = NULL;
            return st;
        }
    }
    *out = f;
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
    wna16_moe_alignment_t al; /* block size 1: positions sorted by expert */
} call_t;

/* Runs `major` x f->tiles workgroups of kernel f; `runs` is the GEMMs'
 * run list. */
static wna16_status_t launch(wna16_moe_layer_t *L, const stage_fn_t *f,
                             w16_moe_stage_t s, const call_t *c,
                             const int32_t *runs, int64_t major,
                             wna16_error_t *err)
{
    if (major <= 0)
        return WNA16_OK;
    uint64_t args[W16_MOE_ARG_COUNT] = {0};
    uint64_t value[W16_MOE_ARG_COUNT] = {0};
#define PTR(p) ((uint64_t)(uintptr_t)(p))
    value[W16_MOE_ARG_HIDDEN] = PTR(c->hidden);
    value[W16_MOE_ARG_TOPK_WEIGHTS] = PTR(c->weights);
    value[W16_MOE_ARG_X] = PTR(L->x);
    value[W16_MOE_ARG_RUNS] = PTR(runs);
    value[W16_MOE_ARG_SORTED] = PTR(c->al.sorted_token_ids);
    value[W16_MOE_ARG_A] = PTR(L->a);
    value[W16_MOE_ARG_Y] = PTR(L->y);
    value[W16_MOE_ARG_SLOT_EXPERT] = PTR(L->slot_expert);
    value[W16_MOE_ARG_COUNTS] = PTR(c->counts);
    value[W16_MOE_ARG_OUT] = PTR(c->out);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < N_ROLES; i++)
            value[w16_moe_weight_arg((wna16_gemm_t)g, roles[i])] =
                PTR(L->data[g][roles[i]]);
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
    return L->T->launch(L->stream, f->fn, args, f->n_params, groups, f->lanes,
                        small ? W16_LAUNCH_SMALL : 0, err);
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

/* The block size (index into block_sizes) for an expert's run of n
 * slots: the spec's portable tiling table where it has one (the xpu
 * layout), else the least GEMM work, counted as the K passes the run needs,
 * ceil(n / BM), times the cost of a pass relative to a pass of one slot.
 * The run's weights are read from memory once whatever BM is, so the
 * choice trades computed padding slots against the dequantization that a
 * bigger block shares: a pass of 2 slots costs about 1.4 passes of 1, a
 * pass of 4 about 2.4 (gemm1 and gemm2 on znver4). */
static int pick_block(const wna16_moe_layer_t *L, int64_t n)
{
    static const double cost[N_BLOCK_SIZES] = {1.0, 1.4, 2.4};
    const w16_ptiling_t *t = L->backend->portable_tiling;
    if (t) { /* the spec's table: its rows are 1, 2 or 4 (spec_tiling.c) */
        int rows = w16_ptiling_pick(t, n)->rows;
        for (int b = 0; b < N_BLOCK_SIZES; b++)
            if (block_sizes[b] == rows)
                return b;
    }
    int best = 0;
    for (int b = 1; b < N_BLOCK_SIZES; b++) {
        int64_t bm = block_sizes[b], bb = block_sizes[best];
        if ((double)((n + bm - 1) / bm) * cost[b] <
            (double)((n + bb - 1) / bb) * cost[best])
            best = b;
    }
    return best;
}

static wna16_status_t run_call(wna16_moe_layer_t *L, const wna16_moe_params_t *p,
                               call_t *c, bool batched, bool batched_weights,
                               int32_t topk, wna16_error_t *err)
{
    variant_t *v = NULL;
    variant_key_t key = make_key(p, batched, batched_weights, topk);
    wna16_status_t st = reserve_scratch(L, c->x_rows, c->num_slots, err);
    if (st == WNA16_OK)
        st = get_variant(L, p, &key, &v, err);
    if (st != WNA16_OK)
        return st;
    /* cut the sorted positions into one run per expert, listed by the
     * block size each run takes */
    int64_t n_pos = c->al.num_tokens_post_padded, n_runs[N_BLOCK_SIZES] = {0};
    for (int b = 0; b < N_BLOCK_SIZES; b++)
        if (!reserve((void **)&L->runs[b], &L->runs_cap[b],
                     3 * (size_t)(n_pos > 0 ? n_pos : 1), sizeof(int32_t)))
            return w16_err_nomem(err, "the fused MoE's expert runs");
    for (int64_t p0 = 0, p1; p0 < n_pos; p0 = p1) {
        int32_t e = c->al.expert_ids[p0];
        for (p1 = p0 + 1; p1 < n_pos && c->al.expert_ids[p1] == e; p1++)
            ;
        int b = pick_block(L, p1 - p0);
        int32_t *r = L->runs[b] + 3 * n_runs[b]++;
        r[0] = (int32_t)p0;
        r[1] = (int32_t)p1;
        r[2] = e;
    }
    const stage_fn_t *gemm[2][N_BLOCK_SIZES] = {{NULL}};
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < N_BLOCK_SIZES && st == WNA16_OK; b++)
            if (n_runs[b])
                st = get_gemm(L, p, v, s ? W16_MOE_GEMM2 : W16_MOE_GEMM1, b,
                              &gemm[s][b], err);
    if (st != WNA16_OK)
        return st;
    st = launch(L, &v->input, W16_MOE_INPUT, c, NULL, c->x_rows, err);
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < N_BLOCK_SIZES && st == WNA16_OK; b++)
            if (n_runs[b])
                st = launch(L, gemm[s][b], s ? W16_MOE_GEMM2 : W16_MOE_GEMM1,
                            c, L->runs[b], n_runs[b], err);
    if (st == WNA16_OK)
        st = launch(L, &v->combine, W16_MOE_COMBINE, c, NULL, c->out_rows,
                    err);
    return st;
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

/* The expert map and top-k against the layer; *n_ids: the ids a slot may
 * hold (the global experts with a map, else E). */
static wna16_status_t check_map(const wna16_moe_layer_t *L,
                                const wna16_moe_params_t *p, int32_t topk,
                                int32_t *n_ids_out, wna16_error_t *err)
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
    *n_ids_out = n_ids;
    return WNA16_OK;
}

static wna16_status_t bad_id(const int32_t *ids, size_t s, int32_t topk,
                             int32_t n_ids, wna16_error_t *err)
{
    return w16_err(err, WNA16_EINVAL, "moe: topk_ids[%d][%d] = %d is not an "
                   "expert id in [0, %d)", (int32_t)(s / topk),
                   (int32_t)(s % topk), ids[s], n_ids);
}

/* Local expert of every slot (-1: absent), validating ids and the map. */
static wna16_status_t route_slots(wna16_moe_layer_t *L,
                                  const wna16_moe_params_t *p,
                                  const int32_t *ids, int32_t M, int32_t topk,
                                  wna16_error_t *err)
{
    int32_t n_ids = 0;
    wna16_status_t st = check_map(L, p, topk, &n_ids, err);
    if (st != WNA16_OK)
        return st;
    size_t slots = (size_t)M * (size_t)topk;
    if (!reserve((void **)&L->slot_expert, &L->se_cap, slots ? slots : 1,
                 sizeof(int32_t)))
        return w16_err_nomem(err, "routing the fused MoE");
    for (size_t s = 0; s < slots; s++) {
        int32_t g = ids[s];
        if (g < 0 || g >= n_ids)
            return bad_id(ids, s, topk, n_ids, err);
        L->slot_expert[s] = p->expert_map ? p->expert_map[g] : g;
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
        st = w16_moe_check_act_dtype(L->model_dtype, p, err);
    if (st == WNA16_OK)
        st = check_gating(L, p, err);
    return st;
}

/* ---- device orchestration (moe_orch DEVICE) -------------------------------- */

/* One device call's shape and host buffers. */
typedef struct dcall {
    bool batched, batched_weights;
    const void *hidden;
    const int32_t *ids;     /* standard */
    const float *weights;   /* per slot (standard) or row (batched), or NULL */
    const int32_t *map;     /* standard, or NULL */
    const int32_t *counts;  /* batched */
    void *out;
    int32_t topk, n_ids;
    int64_t in_rows;        /* rows of hidden (M, or E * max_tokens) */
    int64_t slots;          /* routed slots, or batched rows */
    int64_t x_rows;         /* rows of x */
    int64_t max_tokens;     /* batched */
} dcall_t;

/* The routing kernel for (batched, map, block size index b), built and
 * compiled on first use. */
static wna16_status_t get_route(wna16_moe_layer_t *L, bool batched, bool map,
                                int b, const route_fn_t **out,
                                wna16_error_t *err)
{
    route_fn_t *f = &L->route[batched][map][b];
    if (!f->fn) {
        w16_route_request_t rq = {.E = (int32_t)L->problem.E,
                                  .block_m = block_sizes[b],
                                  .batched = batched, .map = map};
        w16_route_kernel_t rk;
        wna16_status_t st = w16_build_route(L->ctx, &rq, &rk, err);
        if (st == WNA16_OK)
            st = w16_target_kernel(L->ctx, L->T, "wna16 moe route", rk.kernel,
                                   &f->fn, NULL, err);
        if (st == WNA16_OK) {
            f->lanes = rk.kernel->lanes;
            f->n_params = rk.kernel->n_params;
            memcpy(f->param, rk.param, sizeof f->param);
        } else {
            f->fn = NULL;
        }
        w16_route_kernel_free(&rk);
        if (st != WNA16_OK)
            return st;
    }
    *out = f;
    return WNA16_OK;
}

/* The scratch buffer of at least `bytes`, on a stream of its own that is
 * closed and reopened to grow it (its memory goes with it). */
static wna16_status_t reserve_device_scratch(wna16_moe_layer_t *L,
                                             size_t bytes, wna16_error_t *err)
{
    if (L->scratch_stream && bytes <= L->scratch_cap)
        return WNA16_OK;
    if (L->scratch_stream)
        L->T->stream_close(L->scratch_stream, WNA16_OK, NULL);
    L->scratch_stream = NULL;
    L->scratch = 0;
    L->scratch_cap = 0;
    size_t cap = bytes < (size_t)1 << 16 ? (size_t)1 << 16 : bytes + bytes / 4;
    wna16_status_t st = L->T->stream_open(L->inst, L->ctx, &L->scratch_stream,
                                          err);
    if (st == WNA16_OK)
        st = L->T->scratch(L->scratch_stream, cap, &L->scratch, err);
    if (st == WNA16_OK)
        L->scratch_cap = cap;
    return st;
}

/* Runs f with the arguments of `value` (indexed by meaning). */
static wna16_status_t launch_values(wna16_moe_layer_t *L, w16_stream_t *cs,
                                    void *fn, int n_params, const int *param,
                                    int n_meanings, const uint64_t *value,
                                    int64_t groups, int lanes,
                                    wna16_error_t *err)
{
    uint64_t args[64] = {0};
    for (int a = 0; a < n_meanings; a++)
        if (param[a] >= 0)
            args[param[a]] = value[a];
    return L->T->launch(cs, fn, args, n_params, groups, lanes, 0, err);
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* One call routed and run on the target: a fixed list of launches whose
 * grids come from upper bounds (the block count the GEMMs see is the
 * routing kernel's, read on the device), no host read between them. */
static wna16_status_t run_device(wna16_moe_layer_t *L,
                                 const wna16_moe_params_t *p, const dcall_t *c,
                                 wna16_error_t *err)
{
    const w16_target_t *T = L->T;
    int32_t E = (int32_t)L->problem.E;
    size_t H = (size_t)L->problem.H, I = (size_t)L->problem.I;
    variant_t *v = NULL;
    variant_key_t key = make_key(p, c->batched, c->batched_weights, c->topk);
    wna16_status_t st = get_variant(L, p, &key, &v, err);
    /* one block size for the call, from the slots an expert gets on
     * average (the spec's table where it has one) */
    int b = pick_block(L, (c->slots + E - 1) / E);
    int bm = block_sizes[b];
    const stage_fn_t *g1 = NULL, *g2 = NULL;
    const route_fn_t *rf = NULL;
    if (st == WNA16_OK)
        st = get_gemm(L, p, v, W16_MOE_GEMM1, b, &g1, err);
    if (st == WNA16_OK)
        st = get_gemm(L, p, v, W16_MOE_GEMM2, b, &g2, err);
    if (st == WNA16_OK)
        st = get_route(L, c->batched, c->map != NULL, b, &rf, err);
    if (st != WNA16_OK)
        return st;
    int64_t cap = c->batched
        ? w16_route_capacity_batched(E, c->max_tokens, bm)
        : w16_route_capacity(c->slots, E, bm);
    if (cap > INT32_MAX || c->slots > INT32_MAX)
        return w16_err(err, WNA16_EINVAL, "moe: %lld routed rows with %d "
                       "experts and block size %d need %lld positions (more "
                       "than INT32_MAX)", (long long)c->slots, (int)E, bm,
                       (long long)cap);
    int64_t blocks = (cap + bm - 1) / bm;
    /* scratch: x, act, y, slot_expert, sorted, expert_ids, runs, info */
    size_t sz[8] = {(size_t)c->x_rows * H * 4, (size_t)c->slots * I * 4,
                    (size_t)c->slots * H * 4,
                    c->batched ? 0 : (size_t)c->slots * 4, (size_t)cap * 4,
                    (size_t)blocks * 4, (size_t)blocks * 12, 8};
    size_t off[8], total = 0;
    for (int i = 0; i < 8; i++) {
        off[i] = total;
        total += align256(sz[i]);
    }
    st = reserve_device_scratch(L, total, err);
    w16_stream_t *cs = NULL;
    if (st == WNA16_OK)
        st = T->stream_open(L->inst, L->ctx, &cs, err);
    if (st != WNA16_OK)
        return st;
    uint64_t hidden = 0, ids = 0, weights = 0, map = 0, counts = 0, out = 0;
    size_t out_bytes = (size_t)(c->batched ? c->in_rows : c->slots / c->topk) *
                       H * 2;
    st = T->put(cs, c->hidden, (size_t)c->in_rows * H * 2, &hidden, err);
    if (st == WNA16_OK && c->ids)
        st = T->put(cs, c->ids, (size_t)c->slots * 4, &ids, err);
    if (st == WNA16_OK && c->weights)
        st = T->put(cs, c->weights, (size_t)c->slots * 4, &weights, err);
    if (st == WNA16_OK && c->map)
        st = T->put(cs, c->map, (size_t)c->n_ids * 4, &map, err);
    if (st == WNA16_OK && c->counts)
        st = T->put(cs, c->counts, (size_t)E * 4, &counts, err);
    if (st == WNA16_OK)
        st = T->output(cs, c->out, out_bytes, &out, err);
    if (st != WNA16_OK)
        return T->stream_close(cs, st, err);
    uint64_t at[8];
    for (int i = 0; i < 8; i++)
        at[i] = L->scratch + off[i];
    /* the routing kernel */
    uint64_t rv[W16_ROUTE_ARG_COUNT] = {0};
    rv[W16_ROUTE_ARG_TOPK_IDS] = ids;
    rv[W16_ROUTE_ARG_EXPERT_MAP] = map;
    rv[W16_ROUTE_ARG_COUNTS] = counts;
    rv[W16_ROUTE_ARG_NUMEL] = (uint64_t)c->slots;
    rv[W16_ROUTE_ARG_N_IDS] = (uint64_t)c->n_ids;
    rv[W16_ROUTE_ARG_MAX_TOKENS] = (uint64_t)c->max_tokens;
    rv[W16_ROUTE_ARG_CAP] = (uint64_t)cap;
    rv[W16_ROUTE_ARG_SLOT_EXPERT] = at[3];
    rv[W16_ROUTE_ARG_SORTED] = at[4];
    rv[W16_ROUTE_ARG_EXPERT_IDS] = at[5];
    rv[W16_ROUTE_ARG_RUNS] = at[6];
    rv[W16_ROUTE_ARG_INFO] = at[7];
    st = launch_values(L, cs, rf->fn, rf->n_params, rf->param,
                       W16_ROUTE_ARG_COUNT, rv, 1, rf->lanes, err);
    /* the stages */
    uint64_t mv[W16_MOE_ARG_COUNT] = {0};
    mv[W16_MOE_ARG_HIDDEN] = hidden;
    mv[W16_MOE_ARG_TOPK_WEIGHTS] = weights;
    mv[W16_MOE_ARG_X] = at[0];
    mv[W16_MOE_ARG_A] = at[1];
    mv[W16_MOE_ARG_Y] = at[2];
    mv[W16_MOE_ARG_SLOT_EXPERT] = at[3];
    mv[W16_MOE_ARG_SORTED] = at[4];
    mv[W16_MOE_ARG_RUNS] = at[6];
    mv[W16_MOE_ARG_ROUTE_INFO] = at[7];
    mv[W16_MOE_ARG_COUNTS] = counts;
    mv[W16_MOE_ARG_OUT] = out;
    mv[W16_MOE_ARG_MAX_TOKENS] = (uint64_t)c->max_tokens;
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < N_ROLES; i++)
            mv[w16_moe_weight_arg((wna16_gemm_t)g, roles[i])] = L->dev[g][roles[i]];
    const struct {
        const stage_fn_t *f;
        int64_t major;
    } stages[4] = {{&v->input, c->x_rows}, {g1, blocks}, {g2, blocks},
                   {&v->combine, c->batched ? c->in_rows : c->slots / c->topk}};
    for (int i = 0; i < 4 && st == WNA16_OK; i++)
        st = launch_values(L, cs, stages[i].f->fn, stages[i].f->n_params,
                           stages[i].f->param, W16_MOE_ARG_COUNT, mv,
                           stages[i].major * stages[i].f->tiles,
                           stages[i].f->lanes, err);
    if (st == WNA16_OK)
        st = T->output_done(cs, out, err);
    st = T->stream_close(cs, st, err);
    if (st == WNA16_OK) {
        L->device_calls++;
        wna16_log(L->ctx, WNA16_LOG_DEBUG, "moe layer: %s target: routed on "
                  "the device, 5 launches (route, input, gemm1, gemm2, "
                  "combine; blocks of %d, grids for %lld blocks), no host "
                  "read between them", T->name, bm, (long long)blocks);
    }
    return st;
}

uint64_t w16_moe_layer_device_calls(const wna16_moe_layer_t *L)
{
    return L ? L->device_calls : 0;
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
    pthread_mutex_lock(&L->mu);
    if (L->T->moe_orch == W16_MOE_ORCH_DEVICE) {
        /* the checks of route_slots, then the device routes */
        int32_t n_ids = 0;
        st = check_map(L, p, topk, &n_ids, err);
        size_t slots = (size_t)M * (size_t)(topk > 0 ? topk : 0);
        for (size_t s = 0; st == WNA16_OK && s < slots; s++)
            if (topk_ids[s] < 0 || topk_ids[s] >= n_ids)
                st = bad_id(topk_ids, s, topk, n_ids, err);
        if (st == WNA16_OK && M > 0) {
            dcall_t c = {.hidden = hidden, .ids = topk_ids,
                         .weights = topk_weights, .map = p->expert_map,
                         .out = out, .topk = topk, .n_ids = n_ids,
                         .in_rows = M, .slots = (int64_t)M * topk};
            c.x_rows = p->apply_router_weight_on_input ? c.slots : M;
            st = run_device(L, p, &c, err);
        }
        pthread_mutex_unlock(&L->mu);
        return st;
    }
    st = route_slots(L, p, topk_ids, M, topk, err);
    if (st == WNA16_OK && M > 0) {
        call_t c = {.hidden = hidden, .weights = topk_weights, .out = out,
                    .num_slots = (int64_t)M * topk, .out_rows = M};
        c.x_rows = p->apply_router_weight_on_input ? c.num_slots : M;
        st = wna16_moe_align(topk_ids, M, topk, p->expert_map
                                 ? p->global_num_experts : E,
                             p->expert_map, 1, &c.al, err);
        if (st == WNA16_OK)
            st = run_call(L, p, &c, false, false, topk, err);
        wna16_moe_alignment_free(&c.al);
    }
    pthread_mutex_unlock(&L->mu);
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
    /* vLLM's XPUExpertsWNA16 (vllm-project/vllm 5ba49bef,
     * vllm/model_executor/layers/fused_moe/experts/xpu_moe.py) inherits
     * XPUExperts.activation_format() = Standard, and
     * FusedMoEExperts.is_supported_config (modular_kernel.py) refuses any
     * other format with _make_reason(f"{activation_format.value}
     * activation format"): "kernel does not support ... activation
     * format" (vLLM prints the enum's value, the tuple
     * ('batched_experts',); wna16 says "batched", as `wna16 select`
     * does). No batched XPU experts class consumes that layout, so the
     * generated fused MoE that stands for it refuses the format too,
     * whatever the target; the spec decides (w16_spec_moe_takes_batched). */
    if (L && !w16_spec_moe_takes_batched(L->backend))
        return w16_err(err, WNA16_EUNSUPPORTED, "moe batched: %s layout (%s): "
                       "kernel does not support batched activation format",
                       L->backend->name,
                       L->backend->bsel.n_classes
                           ? L->backend->bsel.classes[0].name
                           : L->backend->title);
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
    for (int32_t e = 0; e < E; e++)
        if (expert_num_tokens[e] < 0 || expert_num_tokens[e] > max_tokens)
            return w16_err(err, WNA16_EINVAL, "moe batched: "
                           "expert_num_tokens[%d] = %d is outside [0, "
                           "max_tokens = %d]", e, expert_num_tokens[e],
                           max_tokens);
    if (max_tokens == 0)
        return WNA16_OK;
    pthread_mutex_lock(&L->mu);
    int64_t rows = (int64_t)E * max_tokens;
    if (L->T->moe_orch == W16_MOE_ORCH_DEVICE) {
        dcall_t d = {.batched = true, .batched_weights = weights != NULL,
                     .hidden = hidden, .weights = weights,
                     .counts = expert_num_tokens, .out = out, .topk = 1,
                     .in_rows = rows, .slots = rows, .x_rows = rows,
                     .max_tokens = max_tokens};
        st = run_device(L, p, &d, err);
        pthread_mutex_unlock(&L->mu);
        return st;
    }
    call_t c = {.hidden = hidden, .weights = weights, .out = out,
                .counts = expert_num_tokens, .x_rows = rows, .out_rows = rows,
                .num_slots = rows, .max_tokens = max_tokens};
    st = wna16_moe_align_batched(expert_num_tokens, E, max_tokens, 1, &c.al,
                                 err);
    if (st == WNA16_OK)
        st = run_call(L, p, &c, true, weights != NULL, 1, err);
    wna16_moe_alignment_free(&c.al);
    pthread_mutex_unlock(&L->mu);
    return st;
}
