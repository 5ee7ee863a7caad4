/*
 * run_reference.c - the check of `wna16 run`: the reference fused MoE
 * (wna16_ref_moe: scalar C, sums in double, the oracle of every kernel) on
 * the layer's logical form, against what the kernels returned, under the
 * numeric contract the kernels computed (wna16_ref_moe_numerics:
 * int8-dynamic for the dedicated CPU kernels, else f32).
 *
 * The logical form is the embedded default's own (the truth its GPTQ
 * tensors encode), or, for a checkpoint, decoded from its tensors through
 * the format spec by the reference decoder: only the experts the routing
 * reaches (a layer's other experts do not change the result), one expert
 * per item on all threads, named as a layer of one; an expert map sends
 * the layer's ids to them. A stacked format is decoded whole. The
 * reference then runs on chunks of tokens in parallel.
 *
 * Errors: the largest |kernel - reference| over the output, and relative
 * to the largest |reference|. The run passes when that relative error is
 * at most RUN_REL_TOL (run.h, 2^-5): kernels and reference share every
 * rounding point but sum in a different order (an error of a few units in
 * the last place of the activation dtype), while a misread layout or
 * routing is wrong by the size of the output itself. tests/moe and tests/cuda hold the
 * element-wise error models.
 */
#include "run.h"
#include "spec/spec.h"
#include "runtime/ref/ref.h" /* the loader's cast to the model dtype */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- the routed experts of a checkpoint ---------------------------------------- */

typedef struct decode_job {
    wna16_context_t *ctx;
    const run_layer_t *L;
    wna16_tensor_set_t **views; /* [T]: expert e's tensors as expert 0 */
    wna16_qlayer_t *one;        /* [T] */
} decode_job_t;

static wna16_status_t decode_one(void *user, size_t i, wna16_error_t *err)
{
    decode_job_t *j = user;
    wna16_status_t st = wna16_ref_decode(j->ctx, j->L->format, j->views[i],
                                         j->L->prefix, 1, j->L->H, j->L->I,
                                         &j->L->quant, &j->one[i], err);
    if (st == WNA16_OK) { /* as the repack: the model's dtype (vLLM's) */
        w16_qweight_cast(&j->one[i].w13, j->L->quant.model_dtype);
        w16_qweight_cast(&j->one[i].w2, j->L->quant.model_dtype);
    }
    return st;
}

/* Expert e of "{prefix}.{e}.{rest}", or -1. */
static long expert_of(const char *name, const char *prefix, size_t pn,
                      const char **rest)
{
    if (strncmp(name, prefix, pn) != 0 || name[pn] != '.' ||
        name[pn + 1] < '0' || name[pn + 1] > '9')
        return -1;
    char *end;
    long e = strtol(name + pn + 1, &end, 10);
    if (*end != '.')
        return -1;
    *rest = end + 1;
    return e;
}

/* Views of the routed experts' tensors, expert `experts[i]` renamed to
 * expert 0 in views[i]. */
static wna16_status_t make_views(wna16_context_t *ctx, const run_layer_t *L,
                                 const int32_t *local, int32_t T,
                                 wna16_tensor_set_t **views, wna16_error_t *err)
{
    wna16_status_t st = WNA16_OK;
    for (int32_t i = 0; i < T && st == WNA16_OK; i++)
        st = wna16_tensor_set_create(ctx, &views[i], err);
    size_t pn = strlen(L->prefix);
    for (size_t i = 0; st == WNA16_OK && i < wna16_tensor_set_count(L->tensors);
         i++) {
        wna16_tensor_t t = *wna16_tensor_set_at(L->tensors, i);
        const char *rest;
        long e = expert_of(t.name, L->prefix, pn, &rest);
        if (e < 0 || e >= L->E || local[e] < 0)
            continue;
        char name[WNA16_TENSOR_NAME_MAX];
        snprintf(name, sizeof name, "%s.0.%s", L->prefix, rest);
        t.name = name;
        st = wna16_tensor_set_add_view(views[local[e]], &t, err);
    }
    return st;
}

/* Copies the one expert of a into expert `to` of b (same N, K, G). */
static void copy_expert(const wna16_qweight_t *a, wna16_qweight_t *b,
                        int32_t to)
{
    size_t nk = (size_t)a->N * a->K, gn = (size_t)a->G * a->N;
    memcpy(b->codes + to * nk, a->codes, nk);
    memcpy(b->scales + to * gn, a->scales, gn * sizeof *a->scales);
    if (a->zeros && b->zeros)
        memcpy(b->zeros + to * gn, a->zeros, gn);
    if (a->g_idx && b->g_idx)
        memcpy(b->g_idx + to * (size_t)a->K, a->g_idx,
               (size_t)a->K * sizeof *a->g_idx);
    if (a->bias && b->bias)
        memcpy(b->bias + to * (size_t)a->N, a->bias,
               (size_t)a->N * sizeof *a->bias);
}

static wna16_status_t stack(const wna16_qweight_t *one, int32_t T,
                            wna16_qweight_t *out, wna16_error_t *err)
{
    wna16_status_t st = wna16_qweight_alloc(out, T, one->N, one->K, one->bits,
                                            one->group_size, one->zeros != NULL,
                                            one->g_idx != NULL,
                                            one->bias != NULL, err);
    out->scale_dtype = one->scale_dtype;
    out->bias_dtype = one->bias_dtype;
    return st;
}

/* The routed experts of the checkpoint's layer in logical form, with
 * map[e] = their index (or -1). */
static wna16_status_t decode_routed(wna16_context_t *ctx, const run_layer_t *L,
                                    const int32_t *map, int32_t T,
                                    wna16_qlayer_t *out, wna16_error_t *err)
{
    memset(out, 0, sizeof *out);
    if (L->format->stacked) { /* experts share tensors: decode them all */
        wna16_status_t st = wna16_ref_decode(ctx, L->format, L->tensors,
                                             L->prefix, L->E, L->H, L->I,
                                             &L->quant, out, err);
        if (st == WNA16_OK) {
            w16_qweight_cast(&out->w13, L->quant.model_dtype);
            w16_qweight_cast(&out->w2, L->quant.model_dtype);
        }
        return st;
    }
    decode_job_t j = {ctx, L, calloc((size_t)T, sizeof *j.views),
                      calloc((size_t)T, sizeof *j.one)};
    wna16_status_t st = j.views && j.one
        ? make_views(ctx, L, map, T, j.views, err)
        : w16_err(err, WNA16_ENOMEM, "out of memory");
    if (st == WNA16_OK)
        st = run_parallel((size_t)T, decode_one, &j, err);
    if (st == WNA16_OK) {
        out->E = T;
        out->H = L->H;
        out->I = L->I;
        st = stack(&j.one[0].w13, T, &out->w13, err);
        if (st == WNA16_OK)
            st = stack(&j.one[0].w2, T, &out->w2, err);
        for (int32_t i = 0; st == WNA16_OK && i < T; i++) {
            copy_expert(&j.one[i].w13, &out->w13, i);
            copy_expert(&j.one[i].w2, &out->w2, i);
        }
    }
    for (int32_t i = 0; i < T; i++) {
        if (j.views)
            wna16_tensor_set_destroy(j.views[i]);
        if (j.one)
            wna16_qlayer_free(&j.one[i]);
    }
    free(j.views);
    free(j.one);
    return st;
}

/* ---- the reference MoE ------------------------------------------------------------ */

typedef struct ref_job {
    const wna16_qlayer_t *layer;
    const wna16_moe_params_t *p;
    wna16_numerics_t numerics;
    const run_input_t *in;
    int32_t H, chunk;
    uint16_t *out;
} ref_job_t;

static wna16_status_t ref_chunk(void *user, size_t i, wna16_error_t *err)
{
    ref_job_t *j = user;
    int32_t m0 = (int32_t)i * j->chunk, m1 = m0 + j->chunk;
    if (m1 > j->in->M)
        m1 = j->in->M;
    size_t h = (size_t)m0 * (size_t)j->H, r = (size_t)m0 * (size_t)j->in->topk;
    return wna16_ref_moe_numerics(j->layer, j->p, j->numerics,
                                  j->in->hidden + h, m1 - m0, j->in->ids + r,
                                  j->in->weights + r, j->in->topk, j->out + h,
                                  err);
}

static double act_value(wna16_dtype_t d, uint16_t v)
{
    return d == WNA16_DTYPE_F16 ? wna16_f16_to_f32(v) : wna16_bf16_to_f32(v);
}

/* The first NaN or infinity of the input (hidden states, then router
 * weights), in words, or "" when all are finite. The layer still runs on
 * such input and its output is written: the non-finite values propagate
 * as they would in a serving system. */
static void first_nonfinite(const run_input_t *in, int32_t H, char *out,
                            size_t n)
{
    out[0] = 0;
    size_t nh = (size_t)in->M * (size_t)H, nw = (size_t)in->M * (size_t)in->topk;
    for (size_t i = 0; i < nh; i++) {
        double v = act_value(in->dtype, in->hidden[i]);
        if (!isfinite(v)) {
            snprintf(out, n, "hidden_states[%zu][%zu] is %s", i / (size_t)H,
                     i % (size_t)H, isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
            return;
        }
    }
    for (size_t i = 0; i < nw; i++)
        if (!isfinite(in->weights[i])) {
            snprintf(out, n, "topk_weights[%zu][%zu] is %s",
                     i / (size_t)in->topk, i % (size_t)in->topk,
                     isnan(in->weights[i]) ? "NaN"
                     : in->weights[i] > 0  ? "+Inf" : "-Inf");
            return;
        }
}

int run_reference(wna16_context_t *ctx, const run_layer_t *L,
                  const run_input_t *in, const void *got, void *ref,
                  run_figures_t *f, run_log_t *log)
{
    first_nonfinite(in, L->H, f->input_nonfinite, sizeof f->input_nonfinite);
    if (f->input_nonfinite[0])
        fprintf(stderr, "wna16: warning: the input is not finite: %s (the "
                "first such value); the layer runs on it as given and the "
                "comparison leaves out the positions where the reference "
                "output is not finite\n", f->input_nonfinite);
    wna16_error_t err;
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = in->dtype;
    wna16_qlayer_t routed = {0};
    int32_t *map = NULL, T = 0;
    const wna16_qlayer_t *layer = &L->logical;
    wna16_status_t st = WNA16_OK;
    if (L->has_logical) {
        run_log_step(log, "reference: the scalar reference MoE on the "
                     "layer's logical form, %d threads", run_threads());
    } else {
        map = malloc((size_t)L->E * sizeof *map);
        if (!map) {
            fprintf(stderr, "wna16: out of memory\n");
            return CLI_FAIL;
        }
        for (int32_t e = 0; e < L->E; e++)
            map[e] = -1;
        for (size_t i = 0; i < (size_t)in->M * (size_t)in->topk; i++)
            map[in->ids[i]] = 0; /* routed */
        for (int32_t e = 0; e < L->E; e++)
            if (map[e] >= 0)
                map[e] = T++;
        run_log_step(log, "reference: %s decoded through the %s format spec "
                     "(reference decoder), then the scalar reference MoE; %d "
                     "threads", L->format->stacked ? "the layer"
                                                   : "the routed experts",
                     L->format->name, run_threads());
        st = decode_routed(ctx, L, map, T, &routed, &err);
        layer = &routed;
        if (!L->format->stacked) {
            p.expert_map = map;
            p.global_num_experts = L->E;
        }
    }
    int32_t chunk = in->M / (4 * run_threads());
    ref_job_t j = {layer, &p, f->numerics, in, L->H, chunk > 0 ? chunk : 1,
                   ref};
    if (f->numerics != WNA16_NUMERICS_F32)
        run_log_more(log, "reference under the kernels' numeric contract: %s",
                     wna16_numerics_name(f->numerics));
    if (st == WNA16_OK)
        st = run_parallel((size_t)((in->M + j.chunk - 1) / j.chunk), ref_chunk,
                          &j, &err);
    wna16_qlayer_free(&routed);
    free(map);
    if (st != WNA16_OK)
        return cli_fail(&err);
    f->reference_s = run_log_elapsed(log);

    double dmax = 0.0, rmax = 0.0;
    const uint16_t *g = got, *r = ref;
    f->ref_nonfinite = 0;
    for (size_t i = 0; i < (size_t)in->M * (size_t)L->H; i++) {
        double a = act_value(in->dtype, g[i]), b = act_value(in->dtype, r[i]);
        if (!isfinite(b)) { /* nothing to compare against */
            f->ref_nonfinite++;
            continue;
        }
        double d = fabs(a - b);
        if (!(d <= dmax)) /* NaN sticks */
            dmax = isnan(dmax) ? dmax : d;
        rmax = fmax(rmax, fabs(b));
    }
    f->max_abs = dmax;
    f->max_ref = rmax;
    f->max_rel = rmax > 0.0 ? dmax / rmax : (dmax == 0.0 ? 0.0 : INFINITY);
    f->ok = f->max_rel <= RUN_REL_TOL;
    run_log_more(log, "%s in %.2f s: max |kernel - reference| %.3g, relative "
                 "to max |reference| %.3g: %.3g (at most 2^-5): %s",
                 L->has_logical ? "ran" : "decoded and ran", f->reference_s,
                 f->max_abs, f->max_ref, f->max_rel, f->ok ? "ok" : "MISMATCH");
    if (f->ref_nonfinite)
        run_log_more(log, "%zu of %zu output values left out: the reference "
                     "itself is not finite there (%s)", f->ref_nonfinite,
                     (size_t)in->M * (size_t)L->H,
                     f->input_nonfinite[0] ? f->input_nonfinite
                                           : "the input is finite");
    return CLI_OK;
}
