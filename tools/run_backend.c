/*
 * run_backend.c - where `wna16 run` runs the layer and in which layout.
 *
 * The target is the best present: the first in the target list
 * (runtime/targets.c: a GPU first) that serves the device found and
 * probes, else the CPU (LLVM JIT). --target xpu where Level Zero has no
 * device runs the same SPIR-V on the ocl target (OpenCL on the CPU:
 * runtime/ocl/), and the report says so and why. Selection (vLLM's
 * select_wna16_moe_backend, from the specs) then picks the backend for
 * the target's platform, and the target's fused MoE runs that backend's
 * layout when it can run it well:
 *   - CUDA: the tensor-core templates read the layouts whose spec has a
 *     tiling table (the Marlin family) in the standard activation format;
 *   - CPU: the dedicated CPU kernels (gen/moe_cpu.h: AVX512-VNNI dot
 *     products) read the layouts whose maps have vLLM's VNNI block
 *     structure (the CPU backend's own) under the contracts the spec lists;
 *     the portable generated kernels read any stacked layout through its
 *     maps but vectorize the dot products over k, so they are fast only on
 *     layouts that pack each row's codes in k order ("K-major", e.g. the
 *     N-first Triton layout) and read the others code by code (the VNNI
 *     blocks on a host without AVX512-VNNI: an order of magnitude slower,
 *     Qwen3-30B-A3B at M = 1, 35 ms against 1.2 ms in Triton's layout).
 * When selection's answer is not such a layout (or selection finds none),
 * the run says so and uses the first layout, in vLLM's CUDA priority
 * order, that the target runs well and that holds the layer. --backend
 * NAME runs that layout (selection's verdict on it is shown, not
 * enforced: the question is wna16's kernels, not vLLM's).
 */
#include "run.h"
#include "gen/build_moe.h"
#include "gen/moe_cpu.h"
#include "spec/spec.h"
#include "runtime/ref/ref.h"
#include "runtime/targets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the target -------------------------------------------------------------- */

/* The first target in the list's order (a GPU first) that serves the
 * device found or the host and probes successfully; a target that serves
 * the device but cannot run is noted with its reason. */
static const w16_target_t *best_target(wna16_context_t *ctx,
                                       const wna16_device_info_t *dev,
                                       void **inst, char *note, size_t n)
{
    bool served = dev->platform == WNA16_PLATFORM_CPU;
    for (int i = 0; i < w16_target_count(); i++) {
        const w16_target_t *T = w16_target_at(i);
        if (T->platform != WNA16_PLATFORM_CPU && T->platform != dev->platform)
            continue;
        served = served || T->platform == dev->platform;
        wna16_error_t err;
        if (w16_target_probe(ctx, T->id, NULL, inst, &err) == WNA16_OK)
            return T;
        if (T->platform != WNA16_PLATFORM_CPU)
            snprintf(note, n, "; a %s device is present but the %s",
                     wna16_platform_name(T->platform), err.message);
    }
    if (!served)
        snprintf(note, n, "; %s found, but this build has no target for %s",
                 dev->name, wna16_platform_name(dev->platform));
    return NULL;
}

int run_choose_target(wna16_context_t *ctx, const run_opts_t *o,
                      run_choice_t *c, run_log_t *log)
{
    wna16_error_t err;
    memset(c, 0, sizeof *c);
    wna16_probe_device(&c->dev);
    char note[768] = "";
    const w16_target_t *T = NULL;
    void *inst = NULL;
    if (o->target_set) {
        wna16_status_t st = w16_target_probe(ctx, o->target, &T, &inst, &err);
        /* the xpu target's SPIR-V runs on the CPU through OpenCL where
         * Level Zero has no device: said, never silent */
        if (st == WNA16_EUNAVAILABLE && o->target == WNA16_TARGET_XPU) {
            wna16_error_t eo;
            if (w16_target_probe(ctx, WNA16_TARGET_OCL, &T, &inst, &eo) ==
                WNA16_OK) {
                snprintf(note, sizeof note, "; --target xpu: %s; its SPIR-V "
                         "kernels run through the OpenCL route instead "
                         "(llvm-spirv-15, then the OpenCL device)",
                         err.message);
                st = WNA16_OK;
            } else {
                snprintf(err.message + strlen(err.message),
                         sizeof err.message - strlen(err.message),
                         "; nor can its SPIR-V run through OpenCL: %s",
                         eo.message);
            }
        }
        if (st != WNA16_OK)
            return cli_fail(&err);
    } else {
        T = best_target(ctx, &c->dev, &inst, note, sizeof note);
        if (!T) { /* the host CPU's own reason */
            if (w16_target_probe(ctx, WNA16_TARGET_CPU, &T, &inst, &err) !=
                WNA16_OK)
                return cli_fail(&err);
        } else if (note[0] && T->platform == WNA16_PLATFORM_CPU) {
            size_t n = strlen(note);
            snprintf(note + n, sizeof note - n, " (the %s runs it)",
                     T->name);
        }
    }
    w16_target_device_t d;
    T->describe(inst, &d);
    c->target = T->id;
    c->native_moe = T->native_moe != NULL;
    c->platform = T->platform;
    c->cc_major = d.cc_major;
    c->cc_minor = d.cc_minor;
    snprintf(c->device, sizeof c->device, "%s, %s", d.text, T->compiler);
    c->compiler = T->compiler;
    size_t nn = strlen(c->dev.notes);
    while (nn && c->dev.notes[nn - 1] == ' ')
        c->dev.notes[--nn] = '\0';
    bool host = T->platform == WNA16_PLATFORM_CPU;
    run_log_step(log, "target: %s, %s%s%s%s%s", T->name, c->device,
                 o->target_set ? " (--target)" : "", note,
                 nn && host ? "; " : "", host ? c->dev.notes : "");
    return CLI_OK;
}

/* ---- can the target run a layout well ----------------------------------------- */

static w16_problem_t problem_of(const run_layer_t *L)
{
    const wna16_quant_desc_t *q = &L->quant;
    return (w16_problem_t){.E = L->E, .H = L->H, .I = L->I, .BITS = q->bits,
                           .GS = q->group_size, .zp = q->zero_point,
                           .act_order = q->act_order, .bias = q->bias,
                           .zeros_stored = q->zeros_stored,
                           .g_idx_stored = q->g_idx_stored,
                           .a8 = (int)q->input_dtype};
}

/* Flat element index of a storage index. */
static int64_t flat(const w16_layout_t *l, const int64_t *shape,
                    const int64_t *idx)
{
    int64_t f = 0;
    for (int d = 0; d < l->ndim; d++)
        f = f * shape[d] + idx[d];
    return f;
}

/* Does operand g keep each row's codes packed in k order: code k at
 * element base + k / slots, bit (k % slots) * bits? Checked on the first
 * two rows of the first expert and the last row of the last one; the
 * first code that breaks it goes into `why`. */
static bool k_major(const wna16_spec_t *b, const w16_problem_t *p,
                    wna16_gemm_t g, char *why, size_t n)
{
    int64_t vars[W16_VAR_COUNT], shape[W16_MAX_STORE_DIMS], ext[W16_MAX_COORDS];
    wna16_error_t err;
    const w16_layout_t *l = b->layouts[W16_ROLE_QWEIGHT];
    if (w16_spec_bind(b, p, g, vars, &err) != WNA16_OK) {
        snprintf(why, n, "%s", err.message);
        return false;
    }
    if (!l || !w16_layout_present(l, vars)) {
        snprintf(why, n, "%s holds no packed codes", b->name);
        return false;
    }
    if (w16_layout_shape(l, vars, shape, &err) != WNA16_OK) {
        snprintf(why, n, "%s", err.message);
        return false;
    }
    int slots = w16_layout_slots(l, l->dtypes[0], vars);
    int bits = w16_layout_code_bits(l, l->dtypes[0], vars);
    w16_role_extent(W16_ROLE_QWEIGHT, vars, ext);
    const int64_t rows[3][2] = {{0, 0}, {0, 1}, {ext[0] - 1, ext[1] - 1}};
    for (int r = 0; r < 3; r++) {
        int64_t base = 0;
        for (int64_t k = 0; k < ext[2]; k++) {
            int64_t coord[3] = {rows[r][0], rows[r][1] % ext[1], k};
            int64_t idx[W16_MAX_STORE_DIMS], bit = 0;
            w16_eval_error_t ee;
            if (!w16_layout_locate(l, vars, coord, idx, &bit, &ee)) {
                snprintf(why, n, "%s: its map fails for code (e %lld, n %lld, "
                         "k %lld)", l->json_path, (long long)coord[0],
                         (long long)coord[1], (long long)k);
                return false;
            }
            int64_t at = flat(l, shape, idx);
            if (k == 0)
                base = at;
            int64_t want = base + k / slots, want_bit = (k % slots) * bits;
            if (at != want || bit != want_bit) {
                snprintf(why, n, "its %s codes are not packed in k order "
                         "(row %lld: k = %lld is at %s +%lld bit %lld, where k "
                         "order puts it at +%lld bit %lld)",
                         g == WNA16_GEMM_W13 ? "w13" : "w2",
                         (long long)coord[1], (long long)k,
                         wna16_dtype_name(l->dtypes[0]), (long long)(at - base),
                         (long long)bit, (long long)(want - base),
                         (long long)want_bit);
                return false;
            }
        }
    }
    return true;
}

/* How well the target's fused MoE runs backend b on this layer. */
typedef struct fit {
    bool runs;          /* the layout holds the layer, the target reads it */
    bool fast;          /* CPU: both operands' codes are K-major */
    char why_not[512];  /* why it does not run */
    char why_slow[512]; /* why it is slow */
} fit_t;

/* Do the dedicated CPU kernels run this layout here, under one of the
 * numeric contracts its spec lists (what wna16_moe_layer_create decides)? */
static bool dedicated(const run_choice_t *c, const wna16_spec_t *b,
                      const w16_moe_request_t *req)
{
    for (int i = 0; !c->native_moe && c->cpu_isa && i < b->caps.n_numerics; i++)
        if (b->caps.numerics[i] != WNA16_NUMERICS_F32 &&
            w16_moe_cpu_probe(req, b->caps.numerics[i], c->cpu_isa, NULL, NULL) ==
                WNA16_OK)
            return true;
    return false;
}

static void fit(const run_choice_t *c, const wna16_spec_t *b,
                const run_layer_t *L, fit_t *f)
{
    w16_problem_t p = problem_of(L);
    int64_t vars[W16_VAR_COUNT];
    wna16_error_t err;
    memset(f, 0, sizeof *f);
    /* the CPU kernels' own refusals first: they hold for every layout */
    w16_moe_request_t req = {.backend = b, .problem = p, .topk = L->topk,
                             .block_m = 1};
    wna16_moe_params_init(&req.params);
    if (!b->stacked) {
        snprintf(f->why_not, sizeof f->why_not, "%s stores experts as "
                 "separate tensors", b->name);
    } else if (!c->native_moe && w16_moe_check(&req, &err) != WNA16_OK) {
        snprintf(f->why_not, sizeof f->why_not, "%s", err.message);
    } else if (w16_spec_bind(b, &p, WNA16_GEMM_W13, vars, &err) != WNA16_OK ||
               w16_check_holds(b, &p, (int32_t)vars[W16_VAR_IP], &err) !=
                   WNA16_OK) {
        snprintf(f->why_not, sizeof f->why_not, "%s", err.message);
    } else if (c->native_moe && (!b->tiling || !b->caps.standard_format)) {
        snprintf(f->why_not, sizeof f->why_not, "the CUDA fused MoE "
                 "(tensor-core templates) reads the layouts with a tiling "
                 "table in the standard activation format; %s is not one",
                 b->name);
    } else {
        f->runs = true;
    }
    f->fast = c->native_moe || (f->runs && dedicated(c, b, &req)) ||
              (b->stacked &&
               k_major(b, &p, WNA16_GEMM_W13, f->why_slow, sizeof f->why_slow) &&
               k_major(b, &p, WNA16_GEMM_W2, f->why_slow, sizeof f->why_slow));
}

/* Backends in vLLM's CUDA priority order (those without one after, in
 * registry order). */
typedef struct cand {
    int prio;
    size_t index;
    const wna16_spec_t *b;
} cand_t;

static int cmp_cand(const void *x, const void *y)
{
    const cand_t *a = x, *b = y;
    if (a->prio != b->prio)
        return a->prio < b->prio ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* The first backend in that order that the target runs well; each one
 * before it goes into c->skipped with its reason. Without one, `why` says
 * why the first that would be fast cannot run ("name: reason"), and
 * *slow_ok is the first that runs at all (act-order layers on the CPU:
 * only the Marlin layouts hold them, read code by code), else NULL. */
static const wna16_spec_t *first_good(wna16_context_t *ctx, run_choice_t *c,
                                      const run_layer_t *L, char *why,
                                      size_t n, const wna16_spec_t **slow_ok)
{
    *slow_ok = NULL;
    cand_t cands[64];
    size_t nc = 0;
    for (size_t i = 0; i < wna16_spec_count(ctx) && nc < 64; i++) {
        const wna16_spec_t *b = wna16_spec_at(ctx, i);
        if (b->kind != WNA16_SPEC_BACKEND)
            continue;
        int prio = b->bsel.priority[WNA16_PLATFORM_CUDA];
        cands[nc++] = (cand_t){prio > 0 ? prio : 1000, i, b};
    }
    qsort(cands, nc, sizeof *cands, cmp_cand);
    c->n_skipped = 0;
    fit_t f;
    for (size_t i = 0; i < nc; i++) {
        const wna16_spec_t *b = cands[i].b;
        fit(c, b, L, &f);
        if (f.runs && f.fast)
            return b;
        if (f.runs && !*slow_ok)
            *slow_ok = b;
        if (f.fast && !why[0])
            snprintf(why, n, "%s: %s", b->name, f.why_not);
        if (c->n_skipped < RUN_MAX_SKIPPED) {
            c->skipped[c->n_skipped].backend = b;
            snprintf(c->skipped[c->n_skipped].reason,
                     sizeof c->skipped[0].reason, "%s",
                     !f.runs ? f.why_not : f.why_slow);
            c->n_skipped++;
        }
    }
    return NULL;
}

/* ---- selection and the choice -------------------------------------------------- */

int run_choose_backend(wna16_context_t *ctx, const run_opts_t *o,
                       const run_layer_t *L, run_choice_t *c, run_log_t *log)
{
    wna16_error_t err;
    wna16_select_query_t q = {
        .platform = c->platform, .cc_major = c->cc_major,
        .cc_minor = c->cc_minor, .format = L->format->name, .quant = L->quant,
        .hidden_size = L->H, .intermediate_size = L->I, .num_experts = L->E,
        .top_k = L->topk, .backend = o->backend};
    c->sel_status = wna16_select(ctx, &q, &c->sel, &err);
    if (c->sel_status != WNA16_OK) {
        /* without vLLM's closing period: the message is quoted inside ours */
        size_t n = strlen(err.message);
        snprintf(c->sel_error, sizeof c->sel_error, "%.*s",
                 (int)(n && err.message[n - 1] == '.' ? n - 1 : n),
                 err.message);
    }
    const wna16_spec_t *sel = c->sel_status == WNA16_OK ? c->sel.backend : NULL;
    /* the host CPU's features, for `dedicated`; with JIT off the layer
     * keeps to the portable kernels (kernel packs hold those), so none */
    if (!c->native_moe && !ctx->no_jit) {
        const w16_target_t *T;
        void *inst;
        w16_target_device_t d = {0};
        if (w16_target_probe(ctx, c->target, &T, &inst, &err) == WNA16_OK &&
            T->describe) {
            T->describe(inst, &d);
            c->cpu_isa = w16_moe_cpu_isa(d.cpu_features);
        }
    }
    char plat[48];
    snprintf(plat, sizeof plat, "%s", wna16_platform_name(c->platform));
    if (c->platform == WNA16_PLATFORM_CUDA)
        snprintf(plat + strlen(plat), sizeof plat - strlen(plat), " %d.%d",
                 c->cc_major, c->cc_minor);
    if (sel)
        run_log_step(log, "selection for %s (vLLM's select_wna16_moe_backend, "
                     "from the specs): %s (%s)", plat, sel->name,
                     sel->bsel.vllm_name);
    else
        run_log_step(log, "selection for %s (vLLM's select_wna16_moe_backend, "
                     "from the specs): none: %s", plat, c->sel_error);
    /* every backend tried before the answer, and why it was refused */
    for (size_t i = 0; i < c->sel.n_passed_over; i++)
        run_log_more(log, "passed over %s: %s",
                     wna16_spec_name(c->sel.passed_over[i].backend),
                     c->sel.passed_over[i].reason);
    if (c->sel.note[0])
        run_log_more(log, "note: %s", c->sel.note);

    fit_t f;
    if (o->backend) {
        const wna16_spec_t *b = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                                o->backend);
        /* cmd_run checked the name */
        fit(c, b, L, &f);
        if (!f.runs) {
            fprintf(stderr, "wna16: --backend %s: the %s target cannot run "
                    "it: %s\n", b->name, wna16_target_name(c->target),
                    f.why_not);
            return CLI_FAIL;
        }
        c->backend = b;
        c->substituted = sel != b;
        snprintf(c->why, sizeof c->why, "--backend %s%s%s%s%s", b->name,
                 sel ? "" : "; vLLM's selection refuses it: ",
                 sel ? "" : c->sel_error,
                 f.fast ? "" : "; slow on the CPU (the generated kernels "
                               "vectorize over k): ",
                 f.fast ? "" : f.why_slow);
        run_log_more(log, "running %s", c->why);
        return CLI_OK;
    }
    if (sel) {
        fit(c, sel, L, &f);
        if (f.runs && f.fast) {
            c->backend = sel;
            return CLI_OK;
        }
    }
    char why[512] = "";
    const wna16_spec_t *slow_ok = NULL;
    c->backend = first_good(ctx, c, L, why, sizeof why, &slow_ok);
    if (!c->backend && slow_ok) {
        /* no fast layout holds the layer: the first that runs, said so */
        c->backend = slow_ok;
        c->substituted = sel != slow_ok;
        snprintf(c->why, sizeof c->why, "no layout the %s target reads fast "
                 "holds this layer (%s%s%s); running %s's layout, the first in "
                 "vLLM's CUDA priority order that the target runs, read code "
                 "by code (slow)", wna16_target_name(c->target),
                 sel ? sel->name : "", sel ? ": " : "", sel ? f.why_not : why,
                 slow_ok->name);
        run_log_more(log, "%s", c->why);
        return CLI_OK;
    }
    if (!c->backend) {
        /* selection's reason, and the first fast layout's when it differs
         * (the target's own refusals are the same for every layout) */
        const char *w = strchr(why, ':');
        bool same = sel && w && strcmp(w + 2, f.why_not) == 0;
        fprintf(stderr, "wna16: the %s target's fused MoE has no layout for "
                "this layer%s%s%s%s%s%s\n", wna16_target_name(c->target),
                sel ? ": " : "", sel ? sel->name : "", sel ? ": " : "",
                sel ? f.why_not : "", why[0] && !same ? "; " : "",
                why[0] && !same ? why : "");
        return CLI_FAIL;
    }
    c->substituted = true;
    const char *how = c->native_moe
        ? "the first layout in vLLM's CUDA priority order with tensor-core "
          "kernels that holds this layer"
        : "the first K-major layout in vLLM's CUDA priority order that holds "
          "this layer";
    if (sel && f.runs) /* runs, but slowly: the CPU and a non-K-major layout */
        snprintf(c->why, sizeof c->why, "%s's layout is slow on the CPU: the "
                 "generated kernels vectorize over k, and %s, so they would "
                 "read it with scalar loads (an order of magnitude slower: "
                 "code-by-code reads defeat the vector loop). Running %s's layout instead (%s)",
                 sel->name, f.why_slow, c->backend->name, how);
    else if (sel)
        snprintf(c->why, sizeof c->why, "the %s target cannot run %s's "
                 "layout: %s. Running %s's layout instead (%s)",
                 wna16_target_name(c->target), sel->name, f.why_not,
                 c->backend->name, how);
    else
        snprintf(c->why, sizeof c->why, "selection found no backend for %s. "
                 "Running %s's layout (%s)", plat, c->backend->name, how);
    run_log_more(log, "%s", c->why);
    for (size_t i = 0; i < c->n_skipped; i++)
        run_log_more(log, "  %s's layout passed over: %s",
                     wna16_spec_name(c->skipped[i].backend),
                     c->skipped[i].reason);
    return CLI_OK;
}
