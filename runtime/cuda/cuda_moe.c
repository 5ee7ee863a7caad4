/*
 * cuda_moe.c - the fused MoE on a CUDA GPU (wna16_cuda_moe_*): a layer in
 * a Marlin-family layout on the device, and runs that go
 *
 *   route (count, scan, fill, scatter)   tokens sorted and padded per
 *                                        expert into blocks of block_m
 *                                        (one launch, route_small, when
 *                                        the slots fit one chunk)
 *   [gather]                             act-order permutation of the
 *                                        input, router weights on input
 *   GEMM 1 + activation                  a2 [slots][IP], activation dtype
 *     (split-K: partial sums, then      (per split, float32; the last
 *      reduce + activation)              split of a tile adds them in
 *                                        order while GEMM 1 fits one wave,
 *                                        else the reduce kernel)
 *   [gather]                             act-order permutation of a2
 *   GEMM 2                               y [splits][slots][H], float32
 *   finalize                             split and top-k sums, or the
 *                                        batched rows, in a fixed order
 *
 * Split-K: when row blocks x column tiles would leave SMs idle (small M),
 * each tile's K range is cut into the fewest power-of-two slices that give
 * the tiling row's ctas_per_sm CTAs per SM, at most its max_split_k.
 *
 * all queued on one stream, each launched chained
 * (w16_cuda_launch_chained: on sm_90 a kernel starts while the previous
 * one drains and waits for it with griddepcontrol.wait, templates/
 * moe_pdl.cu), which hides the launch gaps that set the time at small M.
 * The kernels come from gen/moe_cuda.c (the
 * templates specialized from the spec and its tiling table): from the
 * context's kernel packs by request key (the unit's configuration,
 * gen/request_key.h), else through the kernel cache (NVRTC); each object
 * memoizes the functions it used so a run only looks up or hashes when
 * its configuration changes.
 */
#define _POSIX_C_SOURCE 200809L
#include "gen/moe_cuda.h"
#include "gen/request_key.h"
#include "runtime/cuda/cuda.h"
#include "runtime/cuda/cuda_kernels.h"
#include "runtime/cuda/cuda_desc.h"
#include "runtime/ref/moe.h"
#include "runtime/ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MEMO_MAX = 16 };

struct wna16_cuda_moe {
    wna16_context_t *ctx;
    w16_cuda_t *cuda;
    const wna16_spec_t *spec;
    int32_t E, H, I, IP;
    wna16_quant_desc_t quant;
    w16_moe_operand_t op[2];
    wna16_dtype_t scale_dtype[2], bias_dtype[2];
    uint64_t t[2][W16_ROLE_COUNT]; /* device address of each role */
    bool owned;                    /* t[][] allocated by this object */
    uint64_t ws;                   /* workspace */
    size_t ws_size;
    uint64_t sem;                  /* GEMM 1's tile semaphores (int32), */
    size_t sem_size;               /* zero between runs (splitk_fixup) */
    w16_cuda_stream_t *ws_stream;  /* last stream that used it */
    uint64_t err_dev;              /* int[W16_AUX_ERR_SLOTS] */
    uint64_t io;                   /* host runs: staged inputs/outputs */
    size_t io_size;
    uint64_t map_dev;              /* expert_map copy */
    int32_t *map_host;
    int32_t map_len, map_cap;
    struct {
        w16_moe_gemm_cfg_t cfg;
        w16_cuda_function_t *fn[2]; /* the GEMM, w13's split-K reduce */
    } memo[MEMO_MAX];
    int n_memo, memo_next;
    w16_cuda_function_t *aux[2][W16_AUX_COUNT]; /* [bf16] */
    bool aux_ready[2][W16_AUX_PIECES];            /* [bf16][piece] */
    /* the one-kernel decode layer (templates/moe_decode.cu): on with
     * WNA16_CUDA_DECODE=1 only (experimental: slower than the chain so
     * far); its functions by configuration, and the grid that keeps all
     * its CTAs resident */
    bool decode_off;
    struct {
        w16_moe_decode_cfg_t cfg;
        w16_cuda_function_t *fn;
        unsigned grid;
    } dmemo[2];
    int n_dmemo;
    /* what the last device run looked like, for sync's messages */
    int32_t last_topk;
    bool last_batched;
    wna16_cuda_moe_report_t report;
};

static const char *op_name(int g) { return g == WNA16_GEMM_W13 ? "w13" : "w2"; }

/* ---- kernels ------------------------------------------------------------- */

/* The memoized GEMM of configuration c, or -1. */
static int memo_find(const wna16_cuda_moe_t *m, const w16_moe_gemm_cfg_t *c)
{
    for (int i = 0; i < m->n_memo; i++)
        if (memcmp(&m->memo[i].cfg, c, sizeof *c) == 0)
            return i;
    return -1;
}

static void memo_put(wna16_cuda_moe_t *m, const w16_moe_gemm_cfg_t *c,
                     w16_cuda_function_t *const *fn)
{
    int slot = m->n_memo < MEMO_MAX ? m->n_memo++ : m->memo_next++ % MEMO_MAX;
    memcpy(&m->memo[slot].cfg, c, sizeof *c); /* padding too: memcmp keys */
    m->memo[slot].fn[0] = fn[0];
    m->memo[slot].fn[1] = fn[1];
}

/* The request for the routing/gather/finalize piece `piece` of `act` (its
 * text in src, its functions into m->aux: the pieces are runs of the
 * kernels' enum, gen/moe_cuda.h). */
static wna16_status_t aux_request(wna16_cuda_moe_t *m, wna16_dtype_t act,
                                  int piece, w16_buf_t *src,
                                  w16_cuda_unit_req_t *req,
                                  wna16_error_t *err)
{
    wna16_status_t st = w16_moe_aux_source(act, piece, src, err);
    if (st == WNA16_OK && src->failed)
        st = w16_err_nomem(err, "writing the MoE routing kernels");
    int first, n;
    w16_moe_aux_range(piece, &first, &n);
    *req = (w16_cuda_unit_req_t){
        .unit = w16_moe_aux_unit(act, piece), .source = src->data,
        .fn_names = w16_moe_aux_names + first, .n_fns = n,
        .fns = m->aux[act == WNA16_DTYPE_BF16] + first};
    return st;
}

/* The kernels of one run: the routing/gather/finalize pieces `need` (bit
 * p: piece p) of the activation dtype into *aux, and when cfg is not
 * NULL GEMM g's kernel and (w13) its split-K reduce into fn[g][0..1].
 * A unit this object has not used yet comes from the kernel packs by its
 * request key when one holds it (no text printed); the others are
 * fetched together (w16_cuda_modules_get): on a cold cache they compile
 * in parallel threads, so the first call waits for the slowest unit, not
 * for the sum. ms (may be NULL) receives NVRTC's time of the units
 * compiled here, 0 otherwise: ms[g] for GEMM g, ms[2] the longest of the
 * routing pieces. */
static wna16_status_t get_kernels(wna16_cuda_moe_t *m, wna16_dtype_t act,
                                  unsigned need,
                                  const w16_moe_gemm_cfg_t *cfg,
                                  w16_cuda_function_t ***aux,
                                  w16_cuda_function_t *fn[2][2], double *ms,
                                  wna16_error_t *err)
{
    enum { MAX_UNITS = 2 + W16_AUX_PIECES };
    const int b = act == WNA16_DTYPE_BF16;
    w16_cuda_unit_req_t req[MAX_UNITS];
    /* which[i]: 0, 1 a GEMM, 2 + p routing piece p */
    int which[MAX_UNITS], n = 0;
    w16_buf_t src[MAX_UNITS];
    char name[2][160], rname[2][176];
    const char *names[2][2];
    wna16_status_t st = WNA16_OK;
    for (int i = 0; i < MAX_UNITS; i++)
        w16_buf_init(&src[i], m->ctx);
    for (int i = 0; ms && i < 3; i++)
        ms[i] = 0;
    /* the GEMMs first: the slowest units start first */
    for (int g = 0; cfg && g < 2 && st == WNA16_OK; g++) {
        int hit = memo_find(m, &cfg[g]);
        if (hit >= 0) {
            fn[g][0] = m->memo[hit].fn[0];
            fn[g][1] = m->memo[hit].fn[1];
            continue;
        }
        fn[g][1] = NULL;
        w16_moe_gemm_name(&cfg[g], name[g], sizeof name[g]);
        snprintf(rname[g], sizeof rname[g], "%s_reduce", name[g]);
        names[g][0] = name[g];
        names[g][1] = rname[g];
        int n_fns = cfg[g].gemm == WNA16_GEMM_W13 ? 2 : 1;
        bool packed = false;
        st = w16_cuda_unit_packed(m->ctx, w16_moe_cuda_gemm_key(&cfg[g]),
                                  name[g], names[g], n_fns, fn[g], &packed,
                                  err);
        if (st == WNA16_OK && packed) {
            memo_put(m, &cfg[g], fn[g]);
            continue;
        }
        if (st == WNA16_OK)
            st = w16_moe_gemm_source(&cfg[g], &src[n], err);
        if (st == WNA16_OK && src[n].failed)
            st = w16_err_nomem(err, "writing a fused-MoE kernel");
        req[n] = (w16_cuda_unit_req_t){
            .unit = name[g], .source = src[n].data, .fn_names = names[g],
            .n_fns = n_fns, .fns = fn[g]};
        which[n++] = g;
    }
    for (int p = 0; p < W16_AUX_PIECES && st == WNA16_OK; p++)
        if ((need >> p & 1u) && !m->aux_ready[b][p]) {
            int first, nk;
            w16_moe_aux_range(p, &first, &nk);
            bool packed = false;
            st = w16_cuda_unit_packed(m->ctx, w16_moe_cuda_aux_key(act, p),
                                      w16_moe_aux_unit(act, p),
                                      w16_moe_aux_names + first, nk,
                                      m->aux[b] + first, &packed, err);
            if (st == WNA16_OK && packed) {
                m->aux_ready[b][p] = true;
                continue;
            }
            if (st == WNA16_OK)
                st = aux_request(m, act, p, &src[n], &req[n], err);
            which[n++] = 2 + p;
        }
    if (st == WNA16_OK && n > 0)
        st = w16_cuda_modules_get(m->ctx, req, n, err);
    for (int i = 0; i < MAX_UNITS; i++)
        w16_buf_free(&src[i]);
    if (st != WNA16_OK)
        return st;
    for (int i = 0; i < n; i++) {
        int k = which[i] < 2 ? which[i] : 2;
        if (ms && req[i].compile_ms > ms[k])
            ms[k] = req[i].compile_ms;
        if (which[i] >= 2)
            m->aux_ready[b][which[i] - 2] = true;
        else
            memo_put(m, &cfg[which[i]], fn[which[i]]);
    }
    *aux = m->aux[b];
    return WNA16_OK;
}

/* ---- creation ------------------------------------------------------------ */

static bool role_used(w16_role_t r, const wna16_quant_desc_t *q)
{
    switch (r) {
    case W16_ROLE_QWEIGHT:
    case W16_ROLE_SCALES: return true;
    case W16_ROLE_QZEROS: return q->zero_point;
    case W16_ROLE_BIAS: return q->bias;
    case W16_ROLE_G_IDX:
    case W16_ROLE_SORT_IDX: return q->act_order;
    default: return false;
    }
}

static wna16_status_t find_tensor(wna16_cuda_moe_t *m,
                                  const wna16_tensor_set_t *ts,
                                  const char *prefix, int g, w16_role_t r,
                                  const wna16_tensor_t **out,
                                  wna16_error_t *err)
{
    const w16_layout_t *l = m->spec->layouts[r];
    char name[WNA16_TENSOR_NAME_MAX];
    if (prefix && *prefix)
        snprintf(name, sizeof name, "%s.%s_%s", prefix, op_name(g), l->name);
    else
        snprintf(name, sizeof name, "%s_%s", op_name(g), l->name);
    const wna16_tensor_t *t = wna16_tensor_set_find(ts, name);
    if (!t)
        return w16_err(err, WNA16_ENOTFOUND, "%s: no tensor %s (%s layout)",
                       m->spec->name, name, w16_role_key(r));
    bool dt_ok = false;
    for (int i = 0; i < l->n_dtypes; i++)
        dt_ok |= l->dtypes[i] == t->dtype;
    if (!dt_ok)
        return w16_err(err, WNA16_EINVAL, "%s: %s has dtype %s, which the "
                       "layout does not allow", m->spec->name, name,
                       wna16_dtype_name(t->dtype) ? wna16_dtype_name(t->dtype)
                                                  : "INVALID");
    /* scales and biases in the model's dtype when the layer names one */
    wna16_status_t mst = w16_moe_check_tensor_dtype(l, m->quant.model_dtype,
                                                    name, t->dtype, err);
    if (mst != WNA16_OK)
        return mst;
    const w16_moe_operand_t *o = &m->op[g];
    bool same = t->ndim == o->ndim[r];
    for (int d = 0; same && d < t->ndim; d++)
        same = t->shape[d] == o->shape[r][d];
    size_t want = (size_t)wna16_tensor_numel(t) * wna16_dtype_size(t->dtype);
    if (!same || t->nbytes != want) {
        char s[96] = "";
        size_t n = 0;
        for (int d = 0; d < o->ndim[r]; d++)
            n += (size_t)snprintf(s + n, sizeof s - n, "%s%lld", d ? ", " : "",
                                  (long long)o->shape[r][d]);
        return w16_err(err, WNA16_EINVAL, "%s: %s: expected shape (%s) for "
                       "E=%d H=%d I=%d", m->spec->name, name, s, m->E, m->H,
                       m->I);
    }
    if (!t->data && t->nbytes)
        return w16_err(err, WNA16_EINVAL, "%s: %s has no data", m->spec->name,
                       name);
    *out = t;
    return WNA16_OK;
}

/* Reads the err[] record back and turns it into a message. */
static wna16_status_t read_err(wna16_cuda_moe_t *m, const char *what,
                               wna16_error_t *err)
{
    int32_t e[W16_AUX_ERR_SLOTS];
    wna16_status_t st = w16_cuda_copy_d2h(m->cuda, e, m->err_dev, sizeof e, err);
    if (st != WNA16_OK)
        return st;
    /* the record starts at 0x7f7f7f7f: "nothing seen" */
    const int32_t none = 0x7f7f7f7f;
    st = WNA16_OK;
    if (e[W16_AUX_ERR_ID] != none) {
        int32_t t = e[W16_AUX_ERR_ID], k = m->last_topk > 0 ? m->last_topk : 1;
        st = w16_err(err, WNA16_EINVAL, "moe: topk_ids[%d][%d] is not an "
                     "expert id (seen on the GPU%s)", t / k, t % k, what);
    } else if (e[W16_AUX_ERR_COUNT] != none) {
        st = w16_err(err, WNA16_EINVAL, "moe: expert_num_tokens[%d] is not in "
                     "[0, max_tokens] (seen on the GPU%s)",
                     e[W16_AUX_ERR_COUNT], what);
    } else if (e[W16_AUX_ERR_GIDX] != none || e[W16_AUX_ERR_PERM] != none) {
        bool gi = e[W16_AUX_ERR_GIDX] != none;
        int32_t i = gi ? e[W16_AUX_ERR_GIDX] : e[W16_AUX_ERR_PERM];
        st = w16_err(err, WNA16_EINVAL, "%s at [%d]: %s", what, i,
                     gi ? "g_idx is not a scale group"
                        : "the sort indices are not a permutation of K");
    }
    if (st != WNA16_OK) {
        wna16_error_t e2;
        w16_cuda_memset(m->cuda, m->err_dev, 0x7f, sizeof e, &e2);
    }
    return st;
}

/* Act-order tensors must be in range: the GEMM reads scales through g_idx
 * and the gather reads activations through the permutation. */
static wna16_status_t check_act_order(wna16_cuda_moe_t *m, int g,
                                      wna16_error_t *err)
{
    w16_cuda_function_t **aux = NULL;
    wna16_status_t st = get_kernels(m, WNA16_DTYPE_F16,
                                    1u << W16_AUX_PIECE_GATHER_FINALIZE, NULL,
                                    &aux, NULL, NULL, err);
    int32_t E = m->E, K = (int32_t)m->op[g].K, G = (int32_t)m->op[g].G;
    uint64_t seen = 0;
    size_t n = (size_t)E * (size_t)K;
    if (st == WNA16_OK)
        st = w16_cuda_alloc(m->cuda, n * sizeof(int32_t), &seen, err);
    if (st == WNA16_OK)
        st = w16_cuda_memset(m->cuda, seen, 0, n * sizeof(int32_t), err);
    unsigned grid = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    uint64_t gi = m->t[g][W16_ROLE_G_IDX], pm = m->t[g][W16_ROLE_SORT_IDX];
    void *a1[] = {&gi, &pm, &E, &K, &G, &seen, &m->err_dev};
    void *a2[] = {&seen, &E, &K, &m->err_dev};
    if (st == WNA16_OK)
        st = w16_cuda_launch(m->cuda, aux[W16_AUX_CHECK_ACT_ORDER], grid, 256,
                             0, NULL, a1, err);
    if (st == WNA16_OK)
        st = w16_cuda_launch(m->cuda, aux[W16_AUX_CHECK_SEEN], grid, 256, 0,
                             NULL, a2, err);
    if (st == WNA16_OK)
        st = w16_cuda_stream_sync(m->cuda, NULL, err);
    w16_cuda_free(m->cuda, seen);
    if (st != WNA16_OK)
        return st;
    char what[96];
    snprintf(what, sizeof what, "%s: %s act-order tensors (e * K + k, K = %d)",
             m->spec->name, op_name(g), K);
    return read_err(m, what, err);
}

static void cm_destroy(wna16_cuda_moe_t *m)
{
    if (!m)
        return;
    if (m->cuda) {
        if (m->owned)
            for (int g = 0; g < 2; g++)
                for (int r = 0; r < W16_ROLE_COUNT; r++)
                    w16_cuda_free(m->cuda, m->t[g][r]);
        w16_cuda_free(m->cuda, m->ws);
        w16_cuda_free(m->cuda, m->sem);
        w16_cuda_free(m->cuda, m->io);
        w16_cuda_free(m->cuda, m->err_dev);
        w16_cuda_free(m->cuda, m->map_dev);
    }
    free(m->map_host);
    w16_free(m->ctx, m, sizeof *m);
}

static wna16_status_t cm_create(wna16_context_t *ctx,
                                     const wna16_spec_t *backend,
                                     const wna16_tensor_set_t *tensors,
                                     const char *prefix, int32_t E, int32_t H,
                                     int32_t I,
                                     const wna16_quant_desc_t *quant,
                                     bool device_tensors,
                                     wna16_cuda_moe_t **out,
                                     wna16_error_t *err)
{
    if (!ctx || !backend || !tensors || !quant || !out)
        return w16_err(err, WNA16_EINVAL, "wna16_cuda_moe_create: ctx, "
                       "backend, tensors, quant and out are required");
    *out = NULL;
    if (E < 1 || H < 1 || I < 1 || E > 4096)
        return w16_err(err, WNA16_EINVAL, "wna16_cuda_moe_create: E = %d, H = "
                       "%d, I = %d (positive, at most 4096 experts)", E, H, I);
    wna16_cuda_moe_t *m = w16_calloc(ctx, 1, sizeof *m);
    if (!m)
        return w16_err_nomem(err, "creating a CUDA MoE layer");
    m->ctx = ctx;
    m->spec = backend;
    m->E = E;
    m->H = H;
    m->I = I;
    m->quant = *quant;
    const char *dec = getenv("WNA16_CUDA_DECODE");
    if (dec && strcmp(dec, "0") != 0 && strcmp(dec, "1") != 0) {
        w16_free(ctx, m, sizeof *m);
        return w16_err(err, WNA16_EINVAL, "wna16_cuda_moe_create: "
                       "WNA16_CUDA_DECODE='%s' (0 or unset: the kernel chain "
                       "at every size; 1: the one-kernel decode layer where "
                       "it applies, experimental: slower than the chain so "
                       "far, docs/design-notes.md)", dec);
    }
    m->decode_off = !dec || strcmp(dec, "0") == 0;
    w16_problem_t p = {E, H, I, quant->bits, quant->group_size,
                       quant->zero_point, quant->act_order, quant->bias,
                       quant->zeros_stored, quant->g_idx_stored};
    /* what the layout cannot hold first (the reference's reasons), then
     * whether the kernels can read the layout */
    int64_t v[W16_VAR_COUNT];
    wna16_status_t st = w16_moe_check_model_dtype(quant->model_dtype, err);
    if (st == WNA16_OK)
        st = w16_spec_bind(backend, &p, WNA16_GEMM_W13, v, err);
    if (st == WNA16_OK) {
        m->IP = (int32_t)v[W16_VAR_IP];
        st = w16_check_holds(backend, &p, m->IP, err);
    }
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        st = w16_moe_cuda_contract(backend, &p, (wna16_gemm_t)g, &m->op[g],
                                   err);
    if (st == WNA16_OK && !backend->tiling)
        st = w16_err(err, WNA16_EUNSUPPORTED, "%s: no \"tiling\" section: the "
                     "spec does not describe CUDA fused-MoE tiles",
                     backend->name);
    const wna16_tensor_t *src[2][W16_ROLE_COUNT] = {{0}};
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        for (int r = 0; r < W16_ROLE_COUNT && st == WNA16_OK; r++)
            if (role_used((w16_role_t)r, quant))
                st = find_tensor(m, tensors, prefix, g, (w16_role_t)r,
                                 &src[g][r], err);
    if (st == WNA16_OK)
        st = w16_cuda_get(ctx, &m->cuda, err);
    if (st != WNA16_OK) {
        cm_destroy(m);
        return st;
    }
    m->owned = !device_tensors;
    for (int g = 0; g < 2; g++) {
        m->scale_dtype[g] = src[g][W16_ROLE_SCALES]->dtype;
        m->bias_dtype[g] = quant->bias ? src[g][W16_ROLE_BIAS]->dtype
                                       : WNA16_DTYPE_F16;
    }
    for (int g = 0; g < 2 && st == WNA16_OK; g++)
        for (int r = 0; r < W16_ROLE_COUNT && st == WNA16_OK; r++) {
            const wna16_tensor_t *t = src[g][r];
            if (!t)
                continue;
            if (device_tensors) {
                m->t[g][r] = (uint64_t)(uintptr_t)t->data;
                /* codes and scales are copied in 16-byte pieces, the rest
                 * by element */
                bool vec = r == W16_ROLE_QWEIGHT || r == W16_ROLE_SCALES;
                if (m->t[g][r] % (vec ? 16 : 4) != 0)
                    st = w16_err(err, WNA16_EINVAL, "%s: %s %s: device "
                                 "address 0x%llx is not aligned",
                                 backend->name, op_name(g), t->name,
                                 (unsigned long long)m->t[g][r]);
                continue;
            }
            st = w16_cuda_alloc(m->cuda, t->nbytes, &m->t[g][r], err);
            if (st == WNA16_OK)
                st = w16_cuda_copy_h2d(m->cuda, m->t[g][r], t->data, t->nbytes,
                                       err);
        }
    if (st == WNA16_OK)
        st = w16_cuda_alloc(m->cuda, W16_AUX_ERR_SLOTS * sizeof(int32_t),
                            &m->err_dev, err);
    if (st == WNA16_OK)
        st = w16_cuda_memset(m->cuda, m->err_dev, 0x7f,
                             W16_AUX_ERR_SLOTS * sizeof(int32_t), err);
    for (int g = 0; g < 2 && st == WNA16_OK && quant->act_order; g++)
        st = check_act_order(m, g, err);
    if (st != WNA16_OK) {
        cm_destroy(m);
        return st;
    }
    *out = m;
    return WNA16_OK;
}

/* ---- checks shared with the reference ------------------------------------ */

/* The shared checks (runtime/ref/moe.h), then what this kernel family lacks. */
static wna16_status_t check_params(const wna16_cuda_moe_t *m,
                                   const wna16_moe_params_t *p,
                                   wna16_error_t *err)
{
    wna16_status_t st = w16_moe_check_params(p, err);
    if (st == WNA16_OK) /* bf16 activations with bf16 scales, as vLLM's */
        st = w16_moe_check_act_dtype(m->quant.model_dtype, p, err);
    if (st != WNA16_OK)
        return st;
    if (!wna16_activation_is_gated(p->activation))
        return w16_err(err, WNA16_EUNSUPPORTED, "moe: %s on CUDA: the stacked "
                       "%s layout describes a gated w13 (N = 2 * IP); "
                       "non-gated layers have no layout yet",
                       wna16_activation_name(p->activation), m->spec->name);
    return WNA16_OK;
}

/* The number of ids (global experts) and the map's validity. */
static wna16_status_t check_map(const wna16_cuda_moe_t *m,
                                const wna16_moe_params_t *p, int32_t *n_ids,
                                wna16_error_t *err)
{
    if (!p->expert_map) {
        if (p->global_num_experts != 0 && p->global_num_experts != m->E)
            return w16_err(err, WNA16_EINVAL, "moe: global_num_experts = %d "
                           "without an expert_map (must be 0 or E = %d)",
                           p->global_num_experts, m->E);
        *n_ids = m->E;
        return WNA16_OK;
    }
    if (p->global_num_experts < 1)
        return w16_err(err, WNA16_EINVAL, "moe: expert_map needs "
                       "global_num_experts >= 1 (got %d)",
                       p->global_num_experts);
    for (int32_t g = 0; g < p->global_num_experts; g++) {
        int32_t e = p->expert_map[g];
        if (e < -1 || e >= m->E)
            return w16_err(err, WNA16_EINVAL, "moe: expert_map[%d] = %d is "
                           "neither -1 nor a local expert in [0, %d)", g, e,
                           m->E);
    }
    *n_ids = p->global_num_experts;
    return WNA16_OK;
}

/* Copies the expert map to the GPU when it differs from the last one. */
static wna16_status_t sync_map(wna16_cuda_moe_t *m, const wna16_moe_params_t *p,
                               uint64_t *dev, wna16_error_t *err)
{
    *dev = 0;
    if (!p->expert_map)
        return WNA16_OK;
    int32_t n = p->global_num_experts;
    if (n == m->map_len &&
        memcmp(m->map_host, p->expert_map, (size_t)n * sizeof(int32_t)) == 0) {
        *dev = m->map_dev;
        return WNA16_OK;
    }
    if (n > m->map_cap) {
        int32_t *h = realloc(m->map_host, (size_t)n * sizeof(int32_t));
        if (!h)
            return w16_err_nomem(err, "keeping the expert map");
        m->map_host = h;
        if (m->ws_stream || m->map_dev)
            w16_cuda_stream_sync(m->cuda, m->ws_stream, NULL);
        w16_cuda_free(m->cuda, m->map_dev);
        m->map_dev = 0;
        m->map_cap = 0;
        wna16_status_t st = w16_cuda_alloc(m->cuda, (size_t)n * sizeof(int32_t),
                                           &m->map_dev, err);
        if (st != WNA16_OK)
            return st;
        m->map_cap = n;
    }
    /* the previous map may still be in use by queued work */
    wna16_status_t st = w16_cuda_stream_sync(m->cuda, m->ws_stream, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(m->cuda, m->map_dev, p->expert_map,
                               (size_t)n * sizeof(int32_t), err);
    if (st != WNA16_OK) {
        m->map_len = 0;
        return st;
    }
    memcpy(m->map_host, p->expert_map, (size_t)n * sizeof(int32_t));
    m->map_len = n;
    *dev = m->map_dev;
    return WNA16_OK;
}

/* ---- a run ---------------------------------------------------------------- */

typedef struct run_args {
    bool batched;
    int32_t M, topk;       /* standard */
    int32_t max_tokens;    /* batched */
    uint64_t hidden, ids, weights, counts, out;
    w16_cuda_stream_t *stream;
} run_args_t;

/* Bump allocation inside the workspace, 256-byte aligned. */
typedef struct ws_plan {
    size_t size;
} ws_plan_t;

static size_t ws_take(ws_plan_t *w, size_t bytes)
{
    size_t at = w->size;
    w->size += (bytes + 255) / 256 * 256;
    return at;
}

/* Grows the device buffer *ptr (*size bytes) to at least `bytes`, after
 * the streams that may still use it have finished; *grown tells whether
 * it was allocated anew (its contents are then undefined). */
static wna16_status_t regrow(wna16_cuda_moe_t *m, uint64_t *ptr, size_t *size,
                             size_t bytes, w16_cuda_stream_t *stream,
                             bool *grown, wna16_error_t *err)
{
    *grown = false;
    if (bytes <= *size && *ptr)
        return WNA16_OK;
    /* queued work may still read the old buffer */
    wna16_status_t st = w16_cuda_stream_sync(m->cuda, m->ws_stream, err);
    if (st == WNA16_OK && stream != m->ws_stream)
        st = w16_cuda_stream_sync(m->cuda, stream, err);
    if (st != WNA16_OK)
        return st;
    w16_cuda_free(m->cuda, *ptr);
    *ptr = 0;
    *size = 0;
    st = w16_cuda_alloc(m->cuda, bytes, ptr, err);
    if (st == WNA16_OK) {
        *size = bytes;
        *grown = true;
    }
    return st;
}

static wna16_status_t ensure_ws(wna16_cuda_moe_t *m, size_t bytes,
                                w16_cuda_stream_t *stream, wna16_error_t *err)
{
    bool grown;
    return regrow(m, &m->ws, &m->ws_size, bytes, stream, &grown, err);
}

/* GEMM 1's tile semaphores (templates/moe_gemm_common.cu, splitk_fixup):
 * at least n, zeroed when allocated. The kernels leave every one at zero
 * (the last split of a tile resets its own), so they are zeroed only here,
 * and not in the workspace, whose layout changes from run to run. */
static wna16_status_t ensure_sem(wna16_cuda_moe_t *m, int64_t n,
                                 w16_cuda_stream_t *stream, wna16_error_t *err)
{
    bool grown;
    size_t bytes = (size_t)n * sizeof(int32_t);
    wna16_status_t st = regrow(m, &m->sem, &m->sem_size, bytes, stream,
                               &grown, err);
    if (st == WNA16_OK && grown)
        st = w16_cuda_memset(m->cuda, m->sem, 0, m->sem_size, err);
    if (st != WNA16_OK) { /* never leave counters of unknown value */
        w16_cuda_free(m->cuda, m->sem);
        m->sem = 0;
        m->sem_size = 0;
    }
    return st;
}

/* What decides GEMM g's unit besides its tile (gen/moe_cuda.h). */
static w16_moe_unit_quant_t unit_quant(const wna16_cuda_moe_t *m, int g,
                                       const wna16_moe_params_t *p)
{
    return (w16_moe_unit_quant_t){
        .bits = m->quant.bits, .zp = m->quant.zero_point,
        .act_order = m->quant.act_order, .group_size = m->quant.group_size,
        .act_dtype = p->act_dtype, .scale_dtype = m->scale_dtype[g],
        .bias_dtype = m->bias_dtype[g], .activation = p->activation};
}

static unsigned grid_stride(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 8192 ? (b ? b : 1) : 8192);
}

/* The row blocks the routing is expected to fill. Routing happens on the
 * device, so the host estimates: uniform routing puts P * E / n_ids slots
 * on this rank's experts, over min(E, slots) experts. */
static int64_t expected_blocks(const wna16_cuda_moe_t *m, const run_args_t *a,
                               int32_t n_ids, int bm)
{
    if (a->batched)
        return (int64_t)m->E * ((a->max_tokens + bm - 1) / bm);
    int64_t P = (int64_t)a->M * a->topk;
    int64_t local = (P * m->E + n_ids - 1) / n_ids;
    int64_t active = local < m->E ? local : m->E;
    if (active < 1)
        active = 1;
    return active * ((local + active * bm - 1) / (active * bm));
}

/* Split-K slices for GEMM g: the fewest (a power of two, at most the
 * tiling row's max_split_k and the K stages) that give ctas_per_sm CTAs
 * per SM over the expected row blocks. */
static int pick_split(const wna16_cuda_moe_t *m, int64_t blocks, int bm,
                      int g, const w16_moe_gemm_cfg_t *c, int64_t ncta)
{
    int max_split, cps;
    w16_moe_cuda_split(m->spec, bm, c->wgmma, (wna16_gemm_t)g, m->op[g].N,
                       m->op[g].K, &max_split, &cps);
    int64_t want = (int64_t)cps * w16_cuda_sm_count(m->cuda);
    int64_t stages = m->op[g].K / c->block_k;
    int s = 1;
    while (s * 2 <= max_split && s * 2 <= stages && blocks * ncta * s < want)
        s *= 2;
    return s;
}

/* ---- the one-kernel decode layer ------------------------------------------ */

/* Does this run take the decode kernel (templates/moe_decode.cu)? At most
 * W16_MOE_DECODE_MAX_ROWS tokens and W16_MOE_DECODE_MAX_SLOTS slots, the
 * router weights on the output, and a layer the unit can read (else the
 * reason is logged once and the chain runs). *c: its configuration. */
static bool decode_applies(wna16_cuda_moe_t *m, const wna16_moe_params_t *p,
                           const run_args_t *a, w16_moe_decode_cfg_t *c)
{
    if (m->decode_off || a->M > W16_MOE_DECODE_MAX_ROWS ||
        (int64_t)a->M * a->topk > W16_MOE_DECODE_MAX_SLOTS ||
        p->apply_router_weight_on_input)
        return false;
    w16_moe_unit_quant_t q = unit_quant(m, 0, p);
    wna16_error_t why;
    wna16_status_t st = WNA16_OK;
    if (m->scale_dtype[0] != m->scale_dtype[1] ||
        m->bias_dtype[0] != m->bias_dtype[1])
        st = w16_err(&why, WNA16_EUNSUPPORTED, "the one-kernel decode layer "
                     "takes one scale and one bias dtype for w13 and w2");
    if (st == WNA16_OK)
        st = w16_moe_decode_cfg(m->op, &q, c, &why);
    if (st != WNA16_OK) {
        w16_log_once(m->ctx, WNA16_LOG_INFO, "cuda-moe-decode",
                     "cuda moe (%s): %s; decode sizes run the kernel chain",
                     m->spec->name, why.message);
        return false;
    }
    return true;
}

/* The decode unit of c and its grid: from the memo, a kernel pack, or
 * compiled (*ms: NVRTC's time, 0 otherwise). */
static wna16_status_t get_decode(wna16_cuda_moe_t *m,
                                 const w16_moe_decode_cfg_t *c,
                                 w16_cuda_function_t **fn, unsigned *grid,
                                 double *ms, wna16_error_t *err)
{
    *ms = 0;
    for (int i = 0; i < m->n_dmemo; i++)
        if (memcmp(&m->dmemo[i].cfg, c, sizeof *c) == 0) {
            *fn = m->dmemo[i].fn;
            *grid = m->dmemo[i].grid;
            return WNA16_OK;
        }
    char name[160];
    w16_moe_decode_name(c, name, sizeof name);
    const char *names[1] = {name};
    bool packed = false;
    wna16_status_t st = w16_cuda_unit_packed(
        m->ctx, w16_moe_cuda_decode_key(c), name, names, 1, fn, &packed, err);
    if (st == WNA16_OK && !packed) {
        w16_buf_t src;
        w16_buf_init(&src, m->ctx);
        st = w16_moe_decode_source(c, &src, err);
        if (st == WNA16_OK && src.failed)
            st = w16_err_nomem(err, "writing the decode MoE kernel");
        w16_cuda_unit_req_t req = {.unit = name, .source = src.data,
                                   .fn_names = names, .n_fns = 1, .fns = fn};
        if (st == WNA16_OK)
            st = w16_cuda_modules_get(m->ctx, &req, 1, err);
        if (st == WNA16_OK)
            *ms = req.compile_ms;
        w16_buf_free(&src);
    }
    if (st != WNA16_OK)
        return st;
    /* W16_MOE_DECODE_CTAS an SM (its launch bounds, and run_decode's
     * shared memory): every CTA is resident at once, as the kernel's
     * waits need (moe_decode.cu) */
    *grid = (unsigned)(W16_MOE_DECODE_CTAS * w16_cuda_sm_count(m->cuda));
    int slot = m->n_dmemo < 2 ? m->n_dmemo++ : 1;
    memcpy(&m->dmemo[slot].cfg, c, sizeof *c);
    m->dmemo[slot].fn = *fn;
    m->dmemo[slot].grid = *grid;
    return WNA16_OK;
}

/* The whole layer in one persistent launch (templates/moe_decode.cu). Its
 * workspace: a2 [slots][IP], GEMM 1's split slabs [ks1][slots][2 IP] and
 * GEMM 2's [ks2][slots][H] (float32); its counters in m->sem (zero
 * between runs: the kernel resets each one it used). */
static wna16_status_t run_decode(wna16_cuda_moe_t *m,
                                 const wna16_moe_params_t *p,
                                 const run_args_t *a,
                                 const w16_moe_decode_cfg_t *c, int32_t n_ids,
                                 wna16_error_t *err)
{
    wna16_cuda_moe_report_t rep = {0};
    w16_cuda_function_t *fn = NULL;
    unsigned grid = 0;
    wna16_status_t st = get_decode(m, c, &fn, &grid, &rep.compile_ms[0], err);
    uint64_t map = 0;
    if (st == WNA16_OK)
        st = sync_map(m, p, &map, err);
    if (st != WNA16_OK)
        return st;
    const int64_t P = (int64_t)a->M * a->topk, H = m->H, IP = m->IP;
    const int KC = W16_MOE_DECODE_KC, R = W16_MOE_DECODE_MAX_ROWS;
    /* shared memory: an item's activation rows, group scales and zero
     * points (at most max_chunks chunks of K), at least the warps' sums
     * (8 x 8 x 128 floats) */
    const size_t budget = w16_cuda_max_shared(m->cuda) / W16_MOE_DECODE_CTAS -
                          8 * 1024;
    const size_t gpc = c->grouped ? (size_t)(KC / c->group_size) : 0;
    const size_t per_chunk = (size_t)R * KC * 2 + gpc * 128 * 2 +
                             (c->zp ? gpc * 2 * 8 * 4 : 0);
    const size_t fixed = (size_t)R * 8 * 2 + (c->zp ? 2 * 8 * 4 : 0);
    int32_t max_chunks = (int32_t)((budget - fixed) / per_chunk);
    const int32_t nch1 = (int32_t)((H + KC - 1) / KC);
    const int32_t nch2 = (int32_t)((IP + KC - 1) / KC);
    const int32_t nch = nch1 > nch2 ? nch1 : nch2;
    if (max_chunks < 2) /* a window is a whole number of ring turns */
        return w16_err(err, WNA16_ELIMIT, "the decode MoE kernel: %s has %zu "
                       "bytes of shared memory a block", w16_cuda_device_name(
                           m->cuda), w16_cuda_max_shared(m->cuda));
    max_chunks = max_chunks < nch ? max_chunks : nch;
    size_t smem = fixed + (size_t)max_chunks * per_chunk;
    smem = smem > 8 * 8 * 128 * 4 ? smem : 8 * 8 * 128 * 4;
    ws_plan_t w = {0};
    size_t o_a2 = ws_take(&w, (size_t)(P * IP) * 2);
    /* a tile's fragments: at most one a chunk of K (stream-K) */
    size_t o_part = ws_take(&w, (size_t)(nch1 * P * 2 * IP) * 4);
    size_t o_y = ws_take(&w, (size_t)(nch2 * P * H) * 4);
    const int64_t n_sem = P * (IP / 64) + P + H / 64 + 1;
    if ((st = ensure_ws(m, w.size, a->stream, err)) != WNA16_OK ||
        (st = ensure_sem(m, n_sem, a->stream, err)) != WNA16_OK)
        return st;
    m->ws_stream = a->stream;
    uint64_t d_a2 = m->ws + o_a2, d_part = m->ws + o_part, d_y = m->ws + o_y;
    uint64_t nul = 0;
    uint64_t *t1 = m->t[0], *t2 = m->t[1];
    int32_t M = a->M, topk = a->topk, iH = (int32_t)H, iIP = (int32_t)IP;
    int32_t G1 = (int32_t)m->op[0].G, G2 = (int32_t)m->op[1].G;
    float limit = p->swiglu_limit, alpha = p->swiglu_alpha;
    float beta = p->swiglu_beta;
    int32_t round = p->round_gemm_outputs;
    bool zp = m->quant.zero_point, bias = m->quant.bias;
    void *args[] = {(void *)&a->hidden, &M, &topk, (void *)&a->ids, &map,
                    &n_ids, (void *)&a->weights,
                    &t1[W16_ROLE_QWEIGHT], &t1[W16_ROLE_SCALES],
                    zp ? &t1[W16_ROLE_QZEROS] : &nul,
                    bias ? &t1[W16_ROLE_BIAS] : &nul,
                    &t2[W16_ROLE_QWEIGHT], &t2[W16_ROLE_SCALES],
                    zp ? &t2[W16_ROLE_QZEROS] : &nul,
                    bias ? &t2[W16_ROLE_BIAS] : &nul,
                    &iH, &iIP, &G1, &G2, &limit, &alpha, &beta, &round,
                    &max_chunks, &d_a2, &d_part, &d_y, &m->sem,
                    &m->err_dev, (void *)&a->out};
    st = w16_cuda_launch_chained(m->cuda, fn, grid, W16_MOE_DECODE_THREADS,
                                 (unsigned)smem, a->stream, args, err);
    if (st != WNA16_OK)
        return st;
    m->last_topk = a->topk;
    m->last_batched = false;
    w16_moe_decode_name(c, rep.kernel[0], sizeof rep.kernel[0]);
    snprintf(rep.kernel[1], sizeof rep.kernel[1], "%s", rep.kernel[0]);
    snprintf(rep.tile_rule[0], sizeof rep.tile_rule[0], "decode: %u CTAs",
             grid);
    snprintf(rep.tile_rule[1], sizeof rep.tile_rule[1], "decode");
    rep.block_m = W16_MOE_DECODE_MAX_ROWS;
    rep.split_k[0] = 0; /* stream-K: the kernel splits from the routing */
    rep.split_k[1] = 0;
    m->report = rep;
    return WNA16_OK;
}

static wna16_status_t run(wna16_cuda_moe_t *m, const wna16_moe_params_t *p,
                          const run_args_t *a, wna16_error_t *err)
{
    wna16_cuda_moe_report_t rep = {0};
    int32_t n_ids = m->E;
    wna16_status_t st = check_params(m, p, err);
    if (st == WNA16_OK && !a->batched)
        st = check_map(m, p, &n_ids, err);
    if (st != WNA16_OK)
        return st;
    int64_t E = m->E, H = m->H, IP = m->IP;
    int64_t P = a->batched ? E * a->max_tokens : (int64_t)a->M * a->topk;
    if (P == 0)
        return WNA16_OK;
    if (P > INT32_MAX / 4)
        return w16_err(err, WNA16_ELIMIT, "moe: %lld routed rows is too many "
                       "for one run", (long long)P);
    bool on_input = p->apply_router_weight_on_input;
    if (!a->batched && !a->weights)
        return w16_err(err, WNA16_EINVAL, "moe: topk_weights are required");
    if (!a->hidden || !a->out || (!a->batched && !a->ids) ||
        (a->batched && !a->counts))
        return w16_err(err, WNA16_EINVAL, "moe: hidden, out and the routing "
                       "(topk_ids or expert_num_tokens) are required");
    /* the GEMM copies activation rows in 16-byte pieces */
    if (a->hidden % 16 != 0)
        return w16_err(err, WNA16_EINVAL, "moe: hidden (device address "
                       "0x%llx) must be 16-byte aligned",
                       (unsigned long long)a->hidden);

    w16_moe_decode_cfg_t dcfg;
    if (!a->batched && decode_applies(m, p, a, &dcfg))
        return run_decode(m, p, a, &dcfg, n_ids, err);

    /* tiles: block_m from the routed slots per expert, shared by both.
     * Uniform routing over the n_ids experts of the ids puts P / n_ids
     * slots on each; with an expert map (EP) this rank's E experts get that
     * share each, not P / E (DeepSeek-V3/EP8 at M = 64: 2 rows an expert,
     * not 16), so the rows a block pads to follow the local load. */
    int64_t tpe = a->batched ? a->max_tokens : (P + n_ids - 1) / n_ids;
    int bm;
    w16_moe_gemm_cfg_t cfg[2];
    memset(cfg, 0, sizeof cfg); /* memo keys compare the bytes */
    const char *rule[2] = {"", ""};
    /* the tiling's wgmma rows: Hopper (sm_90a) only, and not act-order */
    bool wgmma_ok = w16_cuda_cc_major(m->cuda) == 9 &&
                    w16_cuda_cc_minor(m->cuda) == 0 && !m->quant.act_order;
    bool wgmma = false;
    st = w16_moe_cuda_block_m(m->spec, tpe > 0 ? tpe : 1, wgmma_ok, &bm,
                              &wgmma, err);
    for (int g = 0; g < 2 && st == WNA16_OK; g++) {
        w16_moe_unit_quant_t q = unit_quant(m, g, p);
        st = w16_moe_cuda_cfg(m->spec, &m->op[g], &q, bm, wgmma,
                              (wna16_gemm_t)g, &cfg[g], &rule[g], err);
        if (st == WNA16_OK &&
            w16_moe_gemm_shared(&cfg[g]) > w16_cuda_max_shared(m->cuda))
            st = w16_err(err, WNA16_EUNSUPPORTED, "%s: %s: a %s CTA needs %zu "
                         "bytes of shared memory; %s allows %zu", m->spec->name,
                         rule[g], op_name(g), w16_moe_gemm_shared(&cfg[g]),
                         w16_cuda_device_name(m->cuda),
                         w16_cuda_max_shared(m->cuda));
    }
    if (st != WNA16_OK)
        return st;

    /* workspace */
    int64_t C = a->batched ? 0 : (P + W16_AUX_CHUNK - 1) / W16_AUX_CHUNK;
    int64_t cap = a->batched
                      ? E * ((a->max_tokens + bm - 1) / bm * bm)
                      : (P + (P < E ? P : E) * (bm - 1) + bm - 1) / bm * bm;
    int64_t nblk = cap / bm;
    int64_t ncta[2];
    int split[2];
    const int64_t blocks = expected_blocks(m, a, n_ids, bm);
    for (int g = 0; g < 2; g++) {
        ncta[g] = g == 0 ? (IP + cfg[g].block_n / 2 - 1) / (cfg[g].block_n / 2)
                         : (m->op[g].N + cfg[g].block_n - 1) / cfg[g].block_n;
        split[g] = pick_split(m, blocks, bm, g, &cfg[g], ncta[g]);
    }
    /* GEMM 1's split-K sums: in the mma.sync GEMM (the last split of a
     * tile adds them) while its expected CTAs fit on the device at once,
     * else in the reduce kernel. Same-run A/B on the H200: DeepSeek-V3/EP8
     * M = 1 and 16 (one wave) 7% faster in the GEMM (29.9 -> 27.8 and
     * 103.3 -> 95.5 us), Mixtral-8x7B M = 1 (1.13 waves) 5% slower (79.1 ->
     * 83.1 us), as the sums then lengthen the second wave's tail. */
    const int64_t wave = (int64_t)(cfg[0].min_ctas > 1 ? cfg[0].min_ctas : 1) *
                         w16_cuda_sm_count(m->cuda);
    const bool fixup = split[0] > 1 && !cfg[0].wgmma &&
                       blocks * ncta[0] * split[0] <= wave;
    cfg[0].split_sums = fixup; /* a unit of its own (gen/moe_cuda.h) */
    bool gather1 = m->quant.act_order || (on_input && a->weights);
    bool gather2 = m->quant.act_order;
    /* few outputs with split-K sums to add: the latency-bound finalize,
     * while its CTAs (2 an SM by its launch bounds) take at most two
     * waves; otherwise the element-wise form's occupancy, or without a
     * split the rows' form (templates/moe_aux.cu, below; the small form's
     * gain is the partial sums of eight splits in flight,
     * and without a split it measured 0.6-0.8% slower at M = 16 on
     * DeepSeek-V3/EP8 and Qwen3-30B-A3B) */
    const unsigned fin_grid = grid_stride((size_t)a->M * (size_t)H);
    const bool few = !a->batched && split[1] > 1 &&
                     (int64_t)fin_grid <=
                         4 * (int64_t)w16_cuda_sm_count(m->cuda);

    /* one chunk of slots: the routing's four steps in one launch
     * (route_small); at most 32 slots, where nothing but the GEMMs reads
     * the routing (no split-K reduce kernel, no gather) and both GEMMs
     * are mma.sync units: no routing launch, each GEMM CTA routes its own
     * row block from the ids (templates/moe_route_warp.cu, the same
     * order). Not where most of the grid's row blocks stay empty (an
     * expert-parallel rank): an empty CTA then routes before it can
     * return instead of reading num_post (DeepSeek-V3/EP8 M = 1 23.6 ->
     * 26.6 us, bench/README.md). */
    const bool small = !a->batched && C == 1;
    const bool self_route = small && P <= W16_MOE_SELF_ROUTE_SLOTS &&
                            2 * blocks >= nblk && !gather1 && !gather2 &&
                            !cfg[0].wgmma && !cfg[1].wgmma &&
                            (split[0] == 1 || fixup);
    cfg[0].self_route = cfg[1].self_route = self_route; /* units of their own */

    /* the kernels: both GEMMs, the routing, and the pieces of the gather
     * and finalize this run launches (gen/moe_cuda.h) */
    unsigned need = self_route ? 0u : 1u << W16_AUX_PIECE_ROUTE;
    need |= 1u << (few ? W16_AUX_PIECE_FINALIZE_SMALL
                       : W16_AUX_PIECE_GATHER_FINALIZE);
    if (gather1 || gather2)
        need |= 1u << W16_AUX_PIECE_GATHER_FINALIZE;
    w16_cuda_function_t **aux = NULL, *fn[2][2] = {{NULL, NULL}, {NULL, NULL}};
    st = get_kernels(m, p->act_dtype, need, cfg, &aux, fn, rep.compile_ms,
                     err);
    uint64_t map = 0;
    if (st == WNA16_OK && !a->batched)
        st = sync_map(m, p, &map, err);
    if (st != WNA16_OK)
        return st;
    ws_plan_t w = {0};
    size_t o_num = ws_take(&w, sizeof(int32_t));
    size_t o_hist = ws_take(&w, (size_t)(C * E) * sizeof(int32_t));
    size_t o_hoff = ws_take(&w, (size_t)(C * E) * sizeof(int32_t));
    size_t o_start = ws_take(&w, (size_t)(E + 1) * sizeof(int32_t));
    size_t o_total = ws_take(&w, (size_t)E * sizeof(int32_t));
    size_t o_sorted = ws_take(&w, (size_t)cap * sizeof(int32_t));
    size_t o_eids = ws_take(&w, (size_t)nblk * sizeof(int32_t));
    size_t o_xs = ws_take(&w, gather1 ? (size_t)(P * H) * 2 : 0);
    size_t o_a2 = ws_take(&w, (size_t)(P * IP) * 2);
    size_t o_a2s = ws_take(&w, gather2 ? (size_t)(P * IP) * 2 : 0);
    size_t o_part = ws_take(&w, split[0] > 1 ? (size_t)(split[0] * P * 2 * IP) *
                                                   sizeof(float) : 0);
    size_t o_y = ws_take(&w, (size_t)(split[1] * P * H) * sizeof(float));
    if ((st = ensure_ws(m, w.size, a->stream, err)) != WNA16_OK)
        return st;
    /* the semaphores: GEMM 1's split-K tiles (fixup), then three counters
     * a persistent GEMM (templates/moe_wgmma_gemm.cu: two passes' next
     * items, the CTAs done; the last CTA resets them) */
    const bool persist = cfg[0].persistent || cfg[1].persistent;
    const int64_t n_fix = fixup ? nblk * ncta[0] : 0;
    if ((fixup || persist) &&
        (st = ensure_sem(m, n_fix + (persist ? 6 : 0), a->stream, err)) !=
            WNA16_OK)
        return st;
    uint64_t d_ctr[2] = {m->sem + (uint64_t)n_fix * 4u,
                         m->sem + (uint64_t)n_fix * 4u + 12u};
    m->ws_stream = a->stream;
    uint64_t ws = m->ws;
    uint64_t d_num = ws + o_num, d_hist = ws + o_hist, d_hoff = ws + o_hoff;
    uint64_t d_start = ws + o_start, d_total = ws + o_total;
    uint64_t d_sorted = ws + o_sorted, d_eids = ws + o_eids;
    uint64_t d_xs = ws + o_xs, d_a2 = ws + o_a2, d_a2s = ws + o_a2s;
    uint64_t d_y = ws + o_y, d_part = ws + o_part;
    uint64_t nul = 0;
    int32_t iE = (int32_t)E, iP = (int32_t)P, iC = (int32_t)C, ibm = bm;
    int32_t icap = (int32_t)cap, sentinel = iP, maxt = a->max_tokens;
    int32_t batched = a->batched, topk = a->topk;
    w16_cuda_stream_t *s = a->stream;

    /* ---- routing ---- */
    if (small && !self_route) {
        /* a thread a slot, expert or padded position, in whole warps: the
         * kernel is all latency (barriers, shared memory), and fewer warps
         * make each barrier shorter */
        int64_t most = P > E ? P : E;
        most = most > cap ? most : cap;
        most = (most + 31) / 32 * 32;
        unsigned threads = (unsigned)(most < W16_AUX_SCAN_THREADS
                                          ? most : W16_AUX_SCAN_THREADS);
        void *ar[] = {(void *)&a->ids, &iP, &map, &n_ids, &iE, &ibm, &icap,
                      &sentinel, &d_num, &d_sorted, &d_eids, &m->err_dev};
        /* shared memory: the general path's 2E + 1 + P ints, or the
         * decode path's 3 x 32 + 1 (P <= 32) */
        int64_t words = 2 * E + 1 + P;
        words = words > 97 ? words : 97;
        st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_ROUTE_SMALL], 1,
                                     threads, (unsigned)(words * 4), s, ar,
                                     err);
    }
    if (!small && !a->batched) {
        void *ac[] = {(void *)&a->ids, &iP, &map, &n_ids, &iE, &d_hist,
                      &m->err_dev};
        st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_ROUTE_COUNT],
                                     (unsigned)C, W16_AUX_ROUTE_THREADS,
                                     (unsigned)(E * 4), s, ac, err);
    }
    if (st == WNA16_OK && !small) {
        uint64_t cnt = a->batched ? a->counts : 0;
        void *as[] = {&d_hist, &iC, &cnt, &maxt, &iE, &ibm, &d_hoff,
                      &d_total, &d_start, &d_num, &m->err_dev};
        st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_ROUTE_SCAN], 1,
                                     W16_AUX_SCAN_THREADS, 0, s, as, err);
    }
    if (st == WNA16_OK && !small) {
        void *af[] = {&d_start, &d_total, &iE, &ibm, &icap, &sentinel,
                      &batched, &maxt, &d_sorted, &d_eids};
        st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_ROUTE_FILL],
                                     (unsigned)((cap + 255) / 256), 256, 0, s,
                                     af, err);
    }
    if (st == WNA16_OK && !small && !a->batched) {
        void *ak[] = {(void *)&a->ids, &iP, &map, &n_ids, &iE, &d_start,
                      &d_hoff, &d_sorted, &m->err_dev};
        st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_ROUTE_SCATTER],
                                     (unsigned)C, W16_AUX_ROUTE_THREADS,
                                     (unsigned)(E * 4), s, ak, err);
    }

    /* ---- GEMM 1 ---- */
    uint64_t ids = a->batched ? 0 : a->ids;
    uint64_t cnt = a->batched ? a->counts : 0;
    if (st == WNA16_OK && gather1) {
        int32_t div = a->batched ? 1 : topk, K = (int32_t)H;
        uint64_t perm = m->quant.act_order ? m->t[0][W16_ROLE_SORT_IDX] : 0;
        uint64_t wgt = on_input ? a->weights : 0;
        void *ag[] = {(void *)&a->hidden, &div, &K, &ids, &map, &n_ids, &cnt,
                      &maxt, &iE, &perm, &wgt, &d_xs, &m->err_dev};
        st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_GATHER], (unsigned)P,
                                     256, 0, s, ag, err);
    }
    float limit = p->swiglu_limit, alpha = p->swiglu_alpha;
    float beta = p->swiglu_beta;
    int32_t round = p->round_gemm_outputs, iIP = (int32_t)IP;
    for (int g = 0; g < 2 && st == WNA16_OK; g++) {
        const w16_moe_operand_t *o = &m->op[g];
        uint64_t in = g == 0 ? (gather1 ? d_xs : a->hidden)
                             : (gather2 ? d_a2s : d_a2);
        int32_t div = (g == 0 && !gather1 && !a->batched) ? topk : 1;
        uint64_t outp = g == 0 ? (split[0] > 1 ? d_part : d_a2) : d_y;
        int32_t sk = split[g];
        int32_t N = (int32_t)o->N, K = (int32_t)o->K, G = (int32_t)o->G;
        int32_t gs = m->quant.group_size > 0 ? m->quant.group_size : K;
        uint64_t *t = m->t[g];
        void *args[] = {&in, &div, &iP, &d_sorted, &d_eids, &d_num,
                        &t[W16_ROLE_QWEIGHT], &t[W16_ROLE_SCALES],
                        m->quant.zero_point ? &t[W16_ROLE_QZEROS] : &nul,
                        m->quant.bias ? &t[W16_ROLE_BIAS] : &nul,
                        m->quant.act_order ? &t[W16_ROLE_G_IDX] : &nul, &outp,
                        &N, &K, &G, &gs, &iIP, &limit, &alpha, &beta, &round,
                        &sk, g == 0 && fixup ? &d_a2 : &nul,
                        g == 0 && fixup        ? &m->sem
                        : cfg[g].persistent    ? &d_ctr[g]
                                               : &nul,
                        &ids, &map, &n_ids, &m->err_dev};
        int64_t ctas = nblk * ncta[g] * sk;
        if (ctas > INT32_MAX)
            st = w16_err(err, WNA16_ELIMIT, "moe: %lld CTAs", (long long)ctas);
        /* persistent CTAs (one an SM) loop over the items the routing
         * filled, which the grid of the capacity bounds */
        if (cfg[g].persistent && ctas > w16_cuda_sm_count(m->cuda))
            ctas = w16_cuda_sm_count(m->cuda);
        unsigned smem = (unsigned)w16_moe_gemm_shared(&cfg[g]);
        if (st == WNA16_OK)
            st = w16_cuda_launch_chained(m->cuda, fn[g][0], (unsigned)ctas,
                                         w16_moe_gemm_threads(&cfg[g]), smem,
                                         s, args, err);
        if (st == WNA16_OK && g == 0 && sk > 1 && !fixup) {
            void *ar[] = {&d_part, &iP, &iIP, &sk, &d_sorted, &d_num, &d_a2,
                          &round, &limit, &alpha, &beta};
            st = w16_cuda_launch_chained(m->cuda, fn[0][1],
                                         grid_stride((size_t)(cap * IP)), 256,
                                         0, s, ar, err);
        }
        if (st == WNA16_OK && g == 0 && gather2) {
            int32_t one = 1;
            uint64_t perm = m->t[1][W16_ROLE_SORT_IDX];
            void *ag[] = {&d_a2, &one, &iIP, &ids, &map, &n_ids, &cnt, &maxt,
                          &iE, &perm, &nul, &d_a2s, &m->err_dev};
            st = w16_cuda_launch_chained(m->cuda, aux[W16_AUX_GATHER],
                                         (unsigned)P, 256, 0, s, ag, err);
        }
    }

    /* ---- finalize ---- */
    if (st == WNA16_OK) {
        int32_t N = (int32_t)H;
        uint64_t wgt = on_input ? 0 : a->weights;
        /* GEMM 2 leaves the rounding of its split sums to the finalize */
        int32_t round_sum = round && split[1] > 1;
        if (a->batched) {
            void *af[] = {&d_y, &iE, &maxt, &N, (void *)&a->counts, &wgt,
                          (void *)&a->out, &split[1], &round_sum};
            st = w16_cuda_launch_chained(m->cuda,
                                         aux[W16_AUX_FINALIZE_BATCHED],
                                         grid_stride((size_t)(P * H)), 256, 0,
                                         s, af, err);
        } else {
            int32_t M = a->M;
            void *af[] = {&d_y, &M, &topk, &N, (void *)&a->ids, &map, &n_ids,
                          &wgt, (void *)&a->out, &split[1], &round_sum};
            if (few) {
                st = w16_cuda_launch_chained(m->cuda,
                                             aux[W16_AUX_FINALIZE_SMALL],
                                             fin_grid, 256, 0, s, af, err);
            } else {
                /* one slab: a CTA a row (w16_finalize_rows), its slots
                 * and weights in dynamic shared memory, rows split into
                 * ranges of 256 groups of columns (4 columns, 1 where out
                 * is not 8-byte aligned) where the grid allows, the kernel
                 * following the rows and ranges from its grid; GEMM 2's
                 * split slabs: a thread an element (w16_finalize) */
                int64_t groups = H % 4 == 0 && a->out % 8 == 0 ? H / 4 : H;
                int64_t ctas = (int64_t)a->M * ((groups + 255) / 256);
                ctas = ctas < 8192 ? ctas : 8192;
                bool rows = split[1] == 1;
                st = w16_cuda_launch_chained(
                    m->cuda, aux[rows ? W16_AUX_FINALIZE_ROWS
                                      : W16_AUX_FINALIZE],
                    rows ? (unsigned)ctas : fin_grid, 256,
                    rows ? (unsigned)(8 * topk) : 0u, s, af, err);
            }
        }
    }
    if (st != WNA16_OK)
        return st;
    m->last_topk = a->topk;
    m->last_batched = a->batched;
    rep.block_m = bm;
    rep.split_k[0] = split[0];
    rep.split_k[1] = split[1];
    for (int g = 0; g < 2; g++) {
        w16_moe_gemm_name(&cfg[g], rep.kernel[g], sizeof rep.kernel[g]);
        snprintf(rep.tile_rule[g], sizeof rep.tile_rule[g], "%s", rule[g]);
    }
    m->report = rep;
    return WNA16_OK;
}

/* ---- the API ---------------------------------------------------------------- */

static wna16_status_t cm_run_device(wna16_cuda_moe_t *m,
                                         const wna16_moe_params_t *p,
                                         uint64_t hidden, int32_t M,
                                         uint64_t topk_ids,
                                         uint64_t topk_weights, int32_t topk,
                                         uint64_t out, void *stream,
                                         wna16_error_t *err)
{
    if (!m)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    if (M < 0)
        return w16_err(err, WNA16_EINVAL, "moe: M = %d (must be >= 0)", M);
    if (topk < 1)
        return w16_err(err, WNA16_EINVAL, "moe: topk = %d (must be >= 1)",
                       topk);
    if (p) {
        int32_t n_ids = p->expert_map ? p->global_num_experts : m->E;
        if (topk > n_ids && n_ids > 0)
            return w16_err(err, WNA16_EINVAL, "moe: topk = %d exceeds the %d "
                           "experts", topk, n_ids);
    }
    run_args_t a = {.M = M, .topk = topk, .hidden = hidden, .ids = topk_ids,
                    .weights = topk_weights, .out = out,
                    .stream = (w16_cuda_stream_t *)stream};
    return run(m, p, &a, err);
}

static wna16_status_t cm_run_batched_device(
    wna16_cuda_moe_t *m, const wna16_moe_params_t *p, uint64_t hidden,
    int32_t max_tokens, uint64_t expert_num_tokens, uint64_t weights,
    uint64_t out, void *stream, wna16_error_t *err)
{
    if (!m)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    if (max_tokens < 0)
        return w16_err(err, WNA16_EINVAL, "moe: max_tokens = %d (must be >= "
                       "0)", max_tokens);
    run_args_t a = {.batched = true, .max_tokens = max_tokens, .topk = 1,
                    .hidden = hidden, .counts = expert_num_tokens,
                    .weights = weights, .out = out,
                    .stream = (w16_cuda_stream_t *)stream};
    return run(m, p, &a, err);
}

static wna16_status_t cm_sync(wna16_cuda_moe_t *m, void *stream,
                                   wna16_error_t *err)
{
    if (!m)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    wna16_status_t st = w16_cuda_stream_sync(m->cuda,
                                             (w16_cuda_stream_t *)stream, err);
    return st == WNA16_OK ? read_err(m, "", err) : st;
}

/* Host runs stage their arrays in m->io: [hidden | ids | weights | out]. */
static wna16_status_t ensure_io(wna16_cuda_moe_t *m, size_t bytes,
                                wna16_error_t *err)
{
    if (bytes <= m->io_size && m->io)
        return WNA16_OK;
    wna16_status_t st = w16_cuda_stream_sync(m->cuda, m->ws_stream, err);
    if (st != WNA16_OK)
        return st;
    w16_cuda_free(m->cuda, m->io);
    m->io = 0;
    m->io_size = 0;
    st = w16_cuda_alloc(m->cuda, bytes, &m->io, err);
    if (st == WNA16_OK)
        m->io_size = bytes;
    return st;
}

static wna16_status_t cm_run(wna16_cuda_moe_t *m,
                                  const wna16_moe_params_t *p,
                                  const void *hidden, int32_t M,
                                  const int32_t *topk_ids,
                                  const float *topk_weights, int32_t topk,
                                  void *out, wna16_error_t *err)
{
    if (!m)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    int32_t n_ids = m->E;
    wna16_status_t st = check_params(m, p, err);
    if (st == WNA16_OK)
        st = check_map(m, p, &n_ids, err);
    if (st != WNA16_OK)
        return st;
    if (M < 0)
        return w16_err(err, WNA16_EINVAL, "moe: M = %d (must be >= 0)", M);
    if (M == 0)
        return WNA16_OK;
    if (!hidden || !topk_ids || !topk_weights || !out)
        return w16_err(err, WNA16_EINVAL, "moe: hidden, topk_ids, "
                       "topk_weights and out are required");
    if ((st = w16_moe_check_routing(topk_ids, M, topk, n_ids, err)) !=
        WNA16_OK)
        return st;
    size_t P = (size_t)M * (size_t)topk, nh = (size_t)M * (size_t)m->H * 2;
    ws_plan_t w = {0};
    size_t o_h = ws_take(&w, nh), o_i = ws_take(&w, P * 4);
    size_t o_w = ws_take(&w, P * 4), o_o = ws_take(&w, nh);
    st = ensure_io(m, w.size, err);
    uint64_t io = m->io;
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(m->cuda, io + o_h, hidden, nh, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(m->cuda, io + o_i, topk_ids, P * 4, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(m->cuda, io + o_w, topk_weights, P * 4, err);
    if (st == WNA16_OK)
        st = cm_run_device(m, p, io + o_h, M, io + o_i, io + o_w,
                                       topk, io + o_o, NULL, err);
    if (st == WNA16_OK)
        st = cm_sync(m, NULL, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_d2h(m->cuda, out, io + o_o, nh, err);
    return st;
}

static wna16_status_t cm_run_batched(wna16_cuda_moe_t *m,
                                          const wna16_moe_params_t *p,
                                          const void *hidden,
                                          int32_t max_tokens,
                                          const int32_t *expert_num_tokens,
                                          const float *weights, void *out,
                                          wna16_error_t *err)
{
    if (!m)
        return w16_err(err, WNA16_EINVAL, "moe: layer is NULL");
    wna16_status_t st = check_params(m, p, err);
    if (st != WNA16_OK)
        return st;
    if (max_tokens < 0)
        return w16_err(err, WNA16_EINVAL, "moe: max_tokens = %d (must be >= "
                       "0)", max_tokens);
    if (!hidden || !expert_num_tokens || !out)
        return w16_err(err, WNA16_EINVAL, "moe: hidden, expert_num_tokens and "
                       "out are required");
    for (int32_t e = 0; e < m->E; e++)
        if (expert_num_tokens[e] < 0 || expert_num_tokens[e] > max_tokens)
            return w16_err(err, WNA16_EINVAL, "moe: expert_num_tokens[%d] = %d "
                           "is not in [0, %d]", e, expert_num_tokens[e],
                           max_tokens);
    size_t rows = (size_t)m->E * (size_t)max_tokens;
    size_t nh = rows * (size_t)m->H * 2;
    if (rows == 0)
        return WNA16_OK;
    ws_plan_t w = {0};
    size_t o_h = ws_take(&w, nh), o_c = ws_take(&w, (size_t)m->E * 4);
    size_t o_w = ws_take(&w, weights ? rows * 4 : 0), o_o = ws_take(&w, nh);
    st = ensure_io(m, w.size, err);
    uint64_t io = m->io;
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(m->cuda, io + o_h, hidden, nh, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_h2d(m->cuda, io + o_c, expert_num_tokens,
                               (size_t)m->E * 4, err);
    if (st == WNA16_OK && weights)
        st = w16_cuda_copy_h2d(m->cuda, io + o_w, weights, rows * 4, err);
    if (st == WNA16_OK)
        st = cm_run_batched_device(m, p, io + o_h, max_tokens,
                                               io + o_c, weights ? io + o_w : 0,
                                               io + o_o, NULL, err);
    if (st == WNA16_OK)
        st = cm_sync(m, NULL, err);
    if (st == WNA16_OK)
        st = w16_cuda_copy_d2h(m->cuda, out, io + o_o, nh, err);
    return st;
}

static void cm_last_report(const wna16_cuda_moe_t *m,
                                wna16_cuda_moe_report_t *out)
{
    if (!out)
        return;
    if (!m) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = m->report;
}

/* The public doors (runtime/moe_native.c) reach these through the CUDA
 * target's descriptor. */
const w16_native_moe_t w16_cuda_native_moe = {
    .create = cm_create,
    .destroy = cm_destroy,
    .run = cm_run,
    .run_batched = cm_run_batched,
    .run_device = cm_run_device,
    .run_batched_device = cm_run_batched_device,
    .sync = cm_sync,
    .last_report = cm_last_report,
};
