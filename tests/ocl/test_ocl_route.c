/*
 * test_ocl_route.c - the generated fused MoE's device orchestration on the
 * ocl target (SPIR-V through llvm-spirv-15 and PoCL), the xpu target's:
 *
 *   1. the routing kernel (gen/build_route.c) against wna16_moe_align and
 *      wna16_moe_align_batched, array for array: sorted_ids, expert_ids,
 *      the post-padding count and the block count, plus what the GEMMs
 *      read (one run per block, each slot's local expert), on random
 *      routings with experts without tokens, expert maps with absent
 *      experts, more experts than lanes, block sizes 1 to 16. The CPU
 *      target cannot run it (its emitter has no shared memory or
 *      barriers), and keeps host routing;
 *   2. a layer on ocl routes every call on the device, standard and
 *      batched (w16_moe_layer_device_calls counts them; the host path
 *      never does), within the reference's tolerance; a layer on the cpu
 *      target routes none there;
 *   3. the xpu layout's generated fused MoE refuses the batched format
 *      with vLLM's reason on every target (the Triton layout's takes it),
 *      and the xpu target is refused cleanly where Level Zero has no
 *      device (runs and is checked where it has one).
 *
 * Skips (77) with the reason where the ocl target cannot run here.
 */
#include "testutil.h"
#include "gen/build_route.h"
#include "runtime/ref/moe.h"
#include "runtime/targets.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static wna16_context_t *ctx;

/* ---- 1. the routing kernel against wna16_moe_align ----------------------- */

typedef struct rcase {
    int32_t E, bm;
    bool map, batched;
} rcase_t;

/* Runs the routing kernel once; outputs in the caller's arrays. */
static wna16_status_t run_route(const w16_target_t *T, void *inst,
                                const rcase_t *rc, void *fn,
                                const w16_route_kernel_t *rk,
                                const int32_t *ids, const int32_t *map,
                                const int32_t *counts, int64_t numel,
                                int32_t n_ids, int64_t max_tokens, int64_t cap,
                                int32_t *slot_expert, int32_t *sorted,
                                int32_t *expert_ids, int32_t *runs,
                                int32_t *info, wna16_error_t *err)
{
    int64_t blocks = (cap + rc->bm - 1) / rc->bm;
    w16_stream_t *s = NULL;
    wna16_status_t st = T->stream_open(inst, ctx, &s, err);
    if (st != WNA16_OK)
        return st;
    uint64_t v[W16_ROUTE_ARG_COUNT] = {0};
    v[W16_ROUTE_ARG_NUMEL] = (uint64_t)numel;
    v[W16_ROUTE_ARG_N_IDS] = (uint64_t)n_ids;
    v[W16_ROUTE_ARG_MAX_TOKENS] = (uint64_t)max_tokens;
    v[W16_ROUTE_ARG_CAP] = (uint64_t)cap;
    if (ids)
        st = T->put(s, ids, (size_t)numel * 4, &v[W16_ROUTE_ARG_TOPK_IDS], err);
    if (st == WNA16_OK && map)
        st = T->put(s, map, (size_t)n_ids * 4, &v[W16_ROUTE_ARG_EXPERT_MAP], err);
    if (st == WNA16_OK && counts)
        st = T->put(s, counts, (size_t)rc->E * 4, &v[W16_ROUTE_ARG_COUNTS], err);
    struct { w16_route_arg_t a; void *host; size_t bytes; } outs[5] = {
        {W16_ROUTE_ARG_SLOT_EXPERT, slot_expert, (size_t)numel * 4},
        {W16_ROUTE_ARG_SORTED, sorted, (size_t)cap * 4},
        {W16_ROUTE_ARG_EXPERT_IDS, expert_ids, (size_t)blocks * 4},
        {W16_ROUTE_ARG_RUNS, runs, (size_t)blocks * 12},
        {W16_ROUTE_ARG_INFO, info, 8}};
    for (int i = 0; i < 5 && st == WNA16_OK; i++)
        if (rk->param[outs[i].a] >= 0)
            st = T->output(s, outs[i].host, outs[i].bytes, &v[outs[i].a], err);
    uint64_t args[W16_ROUTE_ARG_COUNT] = {0};
    for (int a = 0; a < W16_ROUTE_ARG_COUNT; a++)
        if (rk->param[a] >= 0)
            args[rk->param[a]] = v[a];
    if (st == WNA16_OK)
        st = T->launch(s, fn, args, rk->kernel->n_params, 1, rk->kernel->lanes,
                       0, err);
    for (int i = 0; i < 5 && st == WNA16_OK; i++)
        if (rk->param[outs[i].a] >= 0)
            st = T->output_done(s, v[outs[i].a], err);
    return T->stream_close(s, st, err);
}

static void check_against_align(const rcase_t *rc, const char *what,
                                const wna16_moe_alignment_t *al, int64_t cap,
                                const int32_t *sorted,
                                const int32_t *expert_ids, const int32_t *runs,
                                const int32_t *info)
{
    int bm = rc->bm;
    int64_t blocks = (cap + bm - 1) / bm;
    TU_CHECK_MSG(cap <= al->max_num_tokens_padded, "%s: cap %lld > %d", what,
                 (long long)cap, al->max_num_tokens_padded);
    TU_CHECK_MSG(info[0] == al->num_tokens_post_padded, "%s: %d positions, "
                 "align %d", what, info[0], al->num_tokens_post_padded);
    TU_CHECK_MSG(info[1] == al->num_tokens_post_padded / bm, "%s: %d blocks",
                 what, info[1]);
    int bad = 0;
    for (int64_t i = 0; i < al->max_num_tokens_padded && bad < 3; i++) {
        int32_t want = al->sorted_token_ids[i];
        int32_t got = i < cap ? sorted[i] : al->sentinel;
        if (got != want) {
            bad++;
            TU_CHECK_MSG(got == want, "%s: sorted_ids[%lld] = %d, align %d",
                         what, (long long)i, got, want);
        }
    }
    for (int64_t b = 0; b < al->max_num_blocks && bad < 3; b++) {
        int32_t got = b < blocks ? expert_ids[b] : -1;
        if (got != al->expert_ids[b]) {
            bad++;
            TU_CHECK_MSG(got == al->expert_ids[b], "%s: expert_ids[%lld] = "
                         "%d, align %d", what, (long long)b, got,
                         al->expert_ids[b]);
        }
    }
    /* one run per block: its positions, its real slots first, its expert */
    for (int32_t b = 0; b < info[1] && bad < 3; b++) {
        int32_t real = 0;
        while (real < bm && sorted[b * bm + real] != al->sentinel)
            real++;
        bool ok = runs[3 * b] == b * bm && runs[3 * b + 1] == b * bm + real &&
                  runs[3 * b + 2] == expert_ids[b] && real > 0;
        if (!ok) {
            bad++;
            TU_CHECK_MSG(ok, "%s: run %d = (%d, %d, %d), want (%d, %d, %d)",
                         what, b, runs[3 * b], runs[3 * b + 1],
                         runs[3 * b + 2], b * bm, b * bm + real,
                         expert_ids[b]);
        }
    }
}

static void route_kernel_cases(const w16_target_t *T, void *inst)
{
    static const rcase_t cases[] = {
        {1, 1, false, false},  {5, 4, false, false}, {8, 16, true, false},
        {64, 4, true, false},  {300, 2, false, false}, {6, 4, false, true},
        {64, 1, false, true},  {300, 16, false, true},
    };
    tu_rng_t r;
    tu_rng_seed(&r, 2222);
    int n_run = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const rcase_t *rc = &cases[ci];
        wna16_error_t err;
        w16_route_request_t rq = {.E = rc->E, .block_m = rc->bm,
                                  .batched = rc->batched, .map = rc->map};
        w16_route_kernel_t rk;
        void *fn = NULL;
        TU_OK(w16_build_route(ctx, &rq, &rk, &err), &err);
        if (!rk.kernel)
            continue;
        wna16_status_t st = w16_target_kernel(ctx, T, "wna16 moe route test",
                                              rk.kernel, &fn, NULL, &err);
        TU_OK(st, &err);
        for (int rep = 0; st == WNA16_OK && rep < 5; rep++) {
            char what[160];
            int32_t E = rc->E, n_ids = E, topk = 1, *ids = NULL, *map = NULL;
            int32_t *counts = NULL, max_tokens = 0;
            int64_t numel, cap;
            wna16_moe_alignment_t al;
            if (rc->batched) {
                max_tokens = 1 + (int32_t)tu_rng_below(&r, rep == 0 ? 3 : 40);
                counts = calloc((size_t)E, sizeof *counts);
                for (int32_t e = 0; e < E; e++) /* a third without tokens */
                    counts[e] = tu_rng_below(&r, 3) == 0
                                    ? 0
                                    : (int32_t)tu_rng_below(&r, (uint32_t)max_tokens + 1);
                counts[tu_rng_below(&r, (uint32_t)E)] = max_tokens;
                numel = (int64_t)E * max_tokens;
                cap = w16_route_capacity_batched(E, max_tokens, rc->bm);
                TU_OK(wna16_moe_align_batched(counts, E, max_tokens, rc->bm,
                                              &al, &err), &err);
                snprintf(what, sizeof what, "batched E=%d bm=%d max_tokens=%d",
                         E, rc->bm, max_tokens);
            } else {
                if (rc->map) { /* E of n_ids global experts here */
                    n_ids = E + 1 + (int32_t)tu_rng_below(&r, (uint32_t)E + 4);
                    map = malloc((size_t)n_ids * sizeof *map);
                    for (int32_t g = 0; g < n_ids; g++)
                        map[g] = g < E ? g : -1;
                    for (int32_t g = n_ids - 1; g > 0; g--) {
                        int32_t j = (int32_t)tu_rng_below(&r, (uint32_t)g + 1);
                        int32_t t = map[g];
                        map[g] = map[j];
                        map[j] = t;
                    }
                }
                int32_t maxk = n_ids < 8 ? n_ids : 8;
                topk = 1 + (int32_t)tu_rng_below(&r, (uint32_t)maxk);
                /* tokens draw from `active` of the ids: experts without
                 * tokens when fewer than all */
                int32_t active = topk + (int32_t)tu_rng_below(
                    &r, (uint32_t)(n_ids - topk + 1));
                int32_t M = 1 + (int32_t)tu_rng_below(&r, rep == 0 ? 4 : 600);
                numel = (int64_t)M * topk;
                ids = malloc((size_t)numel * sizeof *ids);
                int32_t *pick = malloc((size_t)active * sizeof *pick);
                int32_t base = (int32_t)tu_rng_below(&r, (uint32_t)n_ids);
                for (int32_t m = 0; m < M; m++) { /* distinct ids a token */
                    for (int32_t i = 0; i < active; i++)
                        pick[i] = (base + i) % n_ids;
                    for (int32_t j = 0; j < topk; j++) {
                        int32_t i = j + (int32_t)tu_rng_below(
                            &r, (uint32_t)(active - j));
                        int32_t t = pick[i];
                        pick[i] = pick[j];
                        pick[j] = t;
                        ids[(size_t)m * topk + j] = t;
                    }
                }
                free(pick);
                cap = w16_route_capacity(numel, E, rc->bm);
                TU_OK(wna16_moe_align(ids, M, topk, n_ids, map, rc->bm, &al,
                                      &err), &err);
                snprintf(what, sizeof what, "E=%d bm=%d map=%d M=%d topk=%d "
                         "active=%d of %d", E, rc->bm, map != NULL, M, topk,
                         active, n_ids);
            }
            int64_t blocks = (cap + rc->bm - 1) / rc->bm;
            int32_t *slot_expert = malloc((size_t)(numel + 1) * 4);
            int32_t *sorted = malloc((size_t)(cap + 1) * 4);
            int32_t *expert_ids = malloc((size_t)(blocks + 1) * 4);
            int32_t *runs = malloc((size_t)(blocks + 1) * 12);
            int32_t info[2] = {-7, -7};
            st = run_route(T, inst, rc, fn, &rk, ids, map, counts, numel,
                           n_ids, max_tokens, cap, slot_expert, sorted,
                           expert_ids, runs, info, &err);
            TU_OK(st, &err);
            if (st == WNA16_OK) {
                check_against_align(rc, what, &al, cap, sorted, expert_ids,
                                    runs, info);
                for (int64_t s = 0; ids && s < numel; s++) {
                    int32_t want = map ? map[ids[s]] : ids[s];
                    if (slot_expert[s] != want) {
                        TU_CHECK_MSG(slot_expert[s] == want, "%s: "
                                     "slot_expert[%lld] = %d, want %d", what,
                                     (long long)s, slot_expert[s], want);
                        break;
                    }
                }
                n_run++;
            }
            wna16_moe_alignment_free(&al);
            free(ids);
            free(map);
            free(counts);
            free(slot_expert);
            free(sorted);
            free(expert_ids);
            free(runs);
        }
        w16_route_kernel_free(&rk);
    }
    printf("routing kernel: %d routings on the %s target equal "
           "wna16_moe_align's arrays\n", n_run, T->name);
}

/* ---- 2 and 3. layers ----------------------------------------------------- */

enum { LE = 4, LH = 64, LI = 32, LM = 9, LTOPK = 2, LMAXT = 5 };

typedef struct layer_io {
    wna16_qlayer_t q;
    wna16_tensor_set_t *set;
    wna16_quant_desc_t quant;
} layer_io_t;

static bool make_layer(const char *spec_name, layer_io_t *io)
{
    wna16_error_t err;
    tu_rng_t r;
    tu_rng_seed(&r, 77);
    memset(io, 0, sizeof *io);
    io->q = (wna16_qlayer_t){.E = LE, .H = LH, .I = LI};
    io->quant = (wna16_quant_desc_t){.bits = 4, .group_size = 32,
                                     .model_dtype = WNA16_DTYPE_BF16};
    wna16_qweight_t *w[2] = {&io->q.w13, &io->q.w2};
    int32_t N[2] = {2 * LI, LH}, K[2] = {LH, LI};
    for (int g = 0; g < 2; g++) {
        if (wna16_qweight_alloc(w[g], LE, N[g], K[g], 4, 32, false, false,
                                false, &err) != WNA16_OK)
            return false;
        w[g]->scale_dtype = WNA16_DTYPE_BF16;
        for (size_t i = 0; i < (size_t)LE * N[g] * K[g]; i++)
            w[g]->codes[i] = (uint8_t)tu_rng_below(&r, 16);
        for (size_t i = 0; i < (size_t)LE * w[g]->G * N[g]; i++)
            w[g]->scales[i] = (float)(1 + tu_rng_below(&r, 64)) / 1024.0f;
    }
    const wna16_spec_t *spec = wna16_spec_find(ctx, 0, spec_name);
    TU_CHECK_MSG(spec != NULL, "no spec %s", spec_name);
    if (!spec)
        return false;
    TU_OK(wna16_tensor_set_create(ctx, &io->set, &err), &err);
    wna16_status_t st = wna16_ref_encode(ctx, spec, &io->q, "m", io->set, &err);
    TU_OK(st, &err);
    return st == WNA16_OK;
}

static void free_layer(layer_io_t *io)
{
    wna16_tensor_set_destroy(io->set);
    wna16_qlayer_free(&io->q);
}

typedef struct inputs {
    uint16_t hidden[LE * LMAXT * LH], out[LE * LMAXT * LH], ref[LE * LMAXT * LH];
    int32_t ids[LM * LTOPK], counts[LE];
    float w[LE * LMAXT];
} inputs_t;

static void make_inputs(inputs_t *in)
{
    tu_rng_t r;
    tu_rng_seed(&r, 5);
    for (int i = 0; i < LE * LMAXT * LH; i++)
        in->hidden[i] = wna16_f32_to_bf16((float)tu_rng_below(&r, 200) / 100.0f - 1.0f);
    for (int m = 0; m < LM; m++) { /* expert 3 gets no token */
        in->ids[m * LTOPK] = m % 3;
        in->ids[m * LTOPK + 1] = (m + 1) % 3;
    }
    for (int i = 0; i < LE * LMAXT; i++)
        in->w[i] = 0.25f + (float)tu_rng_below(&r, 50) / 100.0f;
    int32_t c[LE] = {LMAXT, 0, 2, 3};
    memcpy(in->counts, c, sizeof c);
}

/* |got - ref| within 2^-5 of the reference's largest magnitude (the bound
 * `wna16 run` checks); the fuzzers check the tight bounds. */
static void check_close(const char *what, const uint16_t *got,
                        const uint16_t *ref, int n)
{
    double worst = 0, big = 0;
    for (int i = 0; i < n; i++) {
        double a = wna16_bf16_to_f32(got[i]), b = wna16_bf16_to_f32(ref[i]);
        worst = fmax(worst, isnan(a) ? INFINITY : fabs(a - b));
        big = fmax(big, fabs(b));
    }
    TU_CHECK_MSG(worst <= big / 32 + 1e-6, "%s: max |got - ref| %g of %g",
                 what, worst, big);
}

static wna16_moe_params_t params(void)
{
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = WNA16_DTYPE_BF16;
    return p;
}

/* Standard and batched calls; device_calls must rise by `per_call` each. */
static void run_layer(const char *spec_name, wna16_target_t target,
                      uint64_t per_call, bool batched_ok)
{
    layer_io_t io;
    if (!make_layer(spec_name, &io)) {
        free_layer(&io);
        return;
    }
    inputs_t *in = calloc(1, sizeof *in);
    make_inputs(in);
    wna16_error_t err;
    wna16_moe_layer_t *L = NULL;
    const wna16_spec_t *spec = wna16_spec_find(ctx, 0, spec_name);
    TU_OK(wna16_moe_layer_create(ctx, spec, io.set, "m", LE, LH, LI, &io.quant,
                                 target, &L, &err), &err);
    wna16_moe_params_t p = params();
    char what[96];
    if (L) {
        snprintf(what, sizeof what, "%s on %s, standard", spec_name,
                 wna16_target_name(target));
        TU_OK(wna16_moe_layer_run(L, &p, in->hidden, LM, in->ids, in->w, LTOPK,
                                  in->out, &err), &err);
        TU_OK(wna16_ref_moe(&io.q, &p, in->hidden, LM, in->ids, in->w, LTOPK,
                            in->ref, &err), &err);
        check_close(what, in->out, in->ref, LM * LH);
        TU_CHECK_MSG(w16_moe_layer_device_calls(L) == per_call, "%s: %llu "
                     "calls routed on the device, want %llu", what,
                     (unsigned long long)w16_moe_layer_device_calls(L),
                     (unsigned long long)per_call);
        /* an expert map: global ids 0..5, experts 1 and 4 absent */
        int32_t map[6] = {2, -1, 0, 3, -1, 1}, gids[LM * LTOPK];
        for (int i = 0; i < LM * LTOPK; i++)
            gids[i] = (in->ids[i] * 5 + 1) % 6;
        p.expert_map = map;
        p.global_num_experts = 6;
        snprintf(what, sizeof what, "%s on %s, expert map", spec_name,
                 wna16_target_name(target));
        TU_OK(wna16_moe_layer_run(L, &p, in->hidden, LM, gids, in->w, LTOPK,
                                  in->out, &err), &err);
        TU_OK(wna16_ref_moe(&io.q, &p, in->hidden, LM, gids, in->w, LTOPK,
                            in->ref, &err), &err);
        check_close(what, in->out, in->ref, LM * LH);
        TU_CHECK(w16_moe_layer_device_calls(L) == 2 * per_call);
        p = params();
        snprintf(what, sizeof what, "%s on %s, batched", spec_name,
                 wna16_target_name(target));
        wna16_status_t st = wna16_moe_layer_run_batched(
            L, &p, in->hidden, LMAXT, in->counts, in->w, in->out, &err);
        if (batched_ok) {
            TU_OK(st, &err);
            TU_OK(wna16_ref_moe_batched(&io.q, &p, in->hidden, LMAXT,
                                        in->counts, in->w, in->ref, &err), &err);
            check_close(what, in->out, in->ref, LE * LMAXT * LH);
            TU_CHECK(w16_moe_layer_device_calls(L) == 3 * per_call);
        } else { /* vLLM's XPUExpertsWNA16: Standard only */
            TU_CHECK_MSG(st == WNA16_EUNSUPPORTED && strstr(err.message,
                         "kernel does not support batched activation format"),
                         "%s: %s: %s", what, wna16_status_name(st),
                         st ? err.message : "ran");
            TU_CHECK(w16_moe_layer_device_calls(L) == 2 * per_call);
        }
        printf("%s: %s\n", what, batched_ok ? "ran" : err.message);
    }
    wna16_moe_layer_destroy(L);
    free(in);
    free_layer(&io);
}

int main(void)
{
    ctx = tu_context();
    const w16_target_t *T = NULL;
    void *inst = NULL;
    wna16_error_t err;
    if (w16_target_probe(ctx, WNA16_TARGET_OCL, &T, &inst, &err) != WNA16_OK)
        tu_skip(err.message);
    TU_CHECK(T->moe_orch == W16_MOE_ORCH_DEVICE);
    route_kernel_cases(T, inst);
    /* ocl: every call routed on the device */
    run_layer("triton", WNA16_TARGET_OCL, 1, true);
    run_layer("xpu", WNA16_TARGET_OCL, 1, false);
    /* cpu: host routing, none on the device; the xpu layout refuses the
     * batched format there too, the Triton layout takes it */
    const w16_target_t *C = NULL;
    void *cinst = NULL;
    if (w16_target_probe(ctx, WNA16_TARGET_CPU, &C, &cinst, &err) == WNA16_OK) {
        TU_CHECK(C->moe_orch == W16_MOE_ORCH_HOST);
        run_layer("triton", WNA16_TARGET_CPU, 0, true);
        run_layer("xpu", WNA16_TARGET_CPU, 0, false);
    } else {
        printf("cpu target: %s\n", err.message);
    }
    /* xpu: Level Zero; where it has a device the layer runs as on ocl */
    const w16_target_t *X = w16_target_find(WNA16_TARGET_XPU);
    if (X) {
        TU_CHECK(X->moe_orch == W16_MOE_ORCH_DEVICE && X->scratch);
        layer_io_t io;
        if (make_layer("xpu", &io)) {
            wna16_moe_layer_t *L = NULL;
            wna16_status_t st = wna16_moe_layer_create(
                ctx, wna16_spec_find(ctx, 0, "xpu"), io.set, "m", LE, LH, LI,
                &io.quant, WNA16_TARGET_XPU, &L, &err);
            wna16_moe_layer_destroy(L);
            if (st == WNA16_OK) {
                run_layer("xpu", WNA16_TARGET_XPU, 1, false);
            } else {
                TU_CHECK_MSG(st == WNA16_EUNAVAILABLE &&
                             strstr(err.message, "xpu target unavailable"),
                             "%s: %s", wna16_status_name(st), err.message);
                printf("xpu target: %s\n", err.message);
            }
        }
        free_layer(&io);
    }
    wna16_context_destroy(ctx);
    return tu_finish("test_ocl_route");
}
