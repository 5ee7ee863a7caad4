/*
 * spec_check.c - proves a spec's layouts consistent: on its sample problems
 * (at load and by `wna16 specs validate`) and at each concrete problem a
 * repack or a fused MoE is about to run (w16_spec_check_problem).
 *
 * For every layout and both GEMM operands: every logical element maps
 * (forward) inside the stored shape, at a bit offset that is a whole code
 * slot; the inverse map sends the place back to the element, so no two
 * elements share a place; every place nothing maps to is reported by the
 * inverse map as outside the logical domain (padding); block sums own
 * bytes nothing else uses; value and scale transforms are inverse and in
 * range. A layout small enough is walked whole (spec_map.c); a larger one
 * is proved from the structure of its maps (spec_prove.c), so a sample
 * costs at most W16_SAMPLE_BUDGET evaluations and a Mixtral-sized layer a
 * few thousand; at a real size a layout that neither fits nor proves is
 * probed on a bounded sample, with a warning. A layout written only as
 * JSON is therefore known to be a bijection before anything uses it.
 */
#define _POSIX_C_SOURCE 200809L
#include "spec/spec_prove.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A layout is walked whole when that costs at most WALK_FIRST
 * evaluations, else proved. At a real size the proof and a walk it leaves
 * may use REAL_BUDGET evaluations; beyond, REAL_PROBES probes an element
 * and a place. */
#define WALK_FIRST (INT64_C(1) << 16)
#define REAL_BUDGET (INT64_C(1) << 20)
enum { REAL_PROBES = 4096 };

static const char *gemm_name(wna16_gemm_t g) { return g == WNA16_GEMM_W13 ? "w13" : "w2"; }

/* Value transforms must be inverse: decode(encode(c)) = c for every code
 * c (and every zero point z when they read it), after the masking to the
 * stored width. */
static wna16_status_t check_transform(const wna16_spec_t *spec,
                                      const w16_layout_t *l, int64_t *vars,
                                      const char *where, wna16_error_t *err)
{
    if (!l->encode)
        return WNA16_OK;
    int cb = w16_layout_code_bits(l, l->dtypes[0], vars);
    int64_t top = (INT64_C(1) << vars[W16_VAR_BITS]) - 1;
    int64_t mask = cb >= 63 ? INT64_MAX : (INT64_C(1) << cb) - 1;
    bool uses_z = w16_expr_uses(l->encode, W16_VAR_z) ||
                  w16_expr_uses(l->decode, W16_VAR_z);
    for (int64_t z = 0; z <= (uses_z ? top : 0); z++)
        for (int64_t c = 0; c <= top; c++) {
            int64_t stored, back;
            w16_eval_error_t e;
            vars[W16_VAR_z] = z;
            vars[W16_VAR_c] = c;
            bool ok = w16_expr_eval(l->encode, vars, &stored, &e);
            vars[W16_VAR_c] = stored & mask;
            ok = ok && w16_expr_eval(l->decode, vars, &back, &e);
            if (!ok)
                return w16_err(err, WNA16_ESPEC, "%s: %s (%s): value transform "
                               "of c=%lld: %s", spec->origin, l->json_path,
                               where, (long long)c, e.what);
            if (back != c)
                return w16_err(err, WNA16_ESPEC, "%s: %s (%s): decode(encode"
                               "(%lld)) = %lld (z = %lld): the value "
                               "transforms are not inverse", spec->origin,
                               l->json_path, where, (long long)c,
                               (long long)back, (long long)z);
        }
    return WNA16_OK;
}


/* One layout bound to one operand: walked, proved or (at a real size)
 * probed. *budget_left is what the sample may still evaluate (samples), or
 * NULL for a real problem. */
static wna16_status_t check_layout(const wna16_spec_t *spec,
                                   const w16_layout_t *l, int64_t *vars,
                                   const char *where, int64_t *budget_left,
                                   w16_check_stats_t *stats,
                                   wna16_error_t *err)
{
    w16_arena_t arena;
    w16_arena_init(&arena, spec->ctx);
    w16_bound_t b;
    bool empty = false;
    w16_check_stats_t local = {0};
    wna16_status_t st = w16_bound_init(&b, spec, l, vars, where, &arena,
                                       &empty, err);
    if (st != WNA16_OK || empty)
        goto done;
    /* walk what is small; prove the rest; walk what the proof leaves if
     * the budget allows; then refuse (samples) or probe (real sizes) */
    int64_t cost = w16_bound_walk_cost(&b);
    int64_t limit = budget_left ? *budget_left : REAL_BUDGET;
    if (cost <= (limit < WALK_FIRST ? limit : WALK_FIRST)) {
        st = w16_bound_walk(&b, &local, err);
        goto done;
    }
    bool proved = false;
    const char *why = NULL;
    st = w16_bound_prove(&b, limit, &proved, &why, &local, err);
    if (st != WNA16_OK || proved)
        goto done;
    if (cost <= limit - local.evaluated) {
        st = w16_bound_walk(&b, &local, err);
        goto done;
    }
    if (budget_left) {
        st = w16_err(err, WNA16_ESPEC, "%s: %s (%s): sample too large to "
                     "check: walking it evaluates %lld elements and places, "
                     "more than the %lld a sample may use, and the proof from "
                     "its maps' structure gives up (%s); use a smaller sample",
                     spec->origin, l->json_path, where, (long long)cost,
                     (long long)W16_SAMPLE_BUDGET, why);
        goto done;
    }
    uint64_t seed = spec->content_hash[0] ^ (uint64_t)vars[W16_VAR_E] * 31 ^
                    (uint64_t)vars[W16_VAR_K] * 131 ^
                    (uint64_t)vars[W16_VAR_N] * 1031;
    st = w16_bound_probe(&b, REAL_PROBES, seed, &local, err);
    if (st == WNA16_OK) {
        local.sampled++;
        char key[200];
        snprintf(key, sizeof key, "spec_sampled:%s:%s:%s", spec->origin,
                 l->json_path, where);
        w16_log_once(spec->ctx, WNA16_LOG_WARN, key, "%s: %s (%s): not "
                     "proved at this size (%s); checked on %d probes an "
                     "element and a place", spec->origin, l->json_path, where,
                     why, REAL_PROBES);
    }
done:
    if (budget_left)
        *budget_left -= local.evaluated;
    if (stats) {
        stats->evaluated += local.evaluated;
        stats->exhaustive += local.exhaustive;
        stats->proved += local.proved;
        stats->sampled += local.sampled;
    }
    w16_arena_free(&arena);
    return st;
}

/* Every present layout of one bound operand, then the scale transforms. */
static wna16_status_t check_operand(const wna16_spec_t *spec, int64_t *vars,
                                    const char *where, int64_t *budget_left,
                                    w16_check_stats_t *stats,
                                    wna16_error_t *err)
{
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = spec->layouts[r];
        int64_t present = 1;
        w16_eval_error_t e;
        if (l && l->when && !w16_expr_eval(l->when, vars, &present, &e))
            return w16_err(err, WNA16_ESPEC, "%s: %s.when (%s): %s",
                           spec->origin, l->json_path, where, e.what);
        if (!l || !present)
            continue;
        wna16_status_t st = check_layout(spec, l, vars, where, budget_left,
                                         stats, err);
        if (st == WNA16_OK)
            st = check_transform(spec, l, vars, where, err);
        if (st != WNA16_OK)
            return st;
    }
    /* the scale transforms evaluate, and input_global_scale exists exactly
     * where the scales are int16 codes */
    w16_scale_xform_t x;
    return w16_scale_xform(spec, vars, &x, err);
}

wna16_status_t w16_spec_check_layouts_stats(const wna16_spec_t *spec,
                                            bool full,
                                            w16_check_stats_t *stats,
                                            wna16_error_t *err)
{
    int n = full ? spec->n_samples : (spec->n_samples > 0 ? 1 : 0);
    for (int s = 0; s < n; s++) {
        const struct w16_sample *sm = &spec->samples[s];
        w16_problem_t p = {sm->E, sm->H, sm->I, sm->BITS, sm->GS, sm->ZP != 0,
                           sm->ACT_ORDER != 0, sm->HAS_BIAS != 0,
                           sm->ZEROS_STORED != 0, sm->G_IDX_STORED != 0,
                           (int)sm->A8};
        int64_t budget_left = W16_SAMPLE_BUDGET;
        for (int g = 0; g < 2; g++) {
            int64_t vars[W16_VAR_COUNT];
            wna16_status_t st = w16_spec_bind(spec, &p, (wna16_gemm_t)g, vars,
                                              err);
            if (st != WNA16_OK) {
                /* A sample the spec cannot bind is the spec's fault,
                 * whatever the binder called it: the record says so too. */
                w16_err_prefix(err, "%s: $.samples[%d]", spec->origin, s);
                if (err)
                    err->status = WNA16_ESPEC;
                return WNA16_ESPEC;
            }
            char where[96];
            snprintf(where, sizeof where, "sample %d, %s", s,
                     gemm_name((wna16_gemm_t)g));
            for (int r = 0; r < spec->caps.n_shape_rules; r++) {
                const w16_rule_t *rule = &spec->caps.shape_rules[r];
                int64_t hit = 0;
                w16_eval_error_t e;
                if (!w16_expr_eval(rule->cond, vars, &hit, &e))
                    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): %s",
                                   spec->origin, rule->json_path, where, e.what);
                if (hit)
                    return w16_err(err, WNA16_ESPEC, "%s: $.samples[%d] breaks "
                                   "the spec's own rule %s (%s)", spec->origin,
                                   s, rule->json_path, rule->reason);
            }
            st = check_operand(spec, vars, where, &budget_left, stats, err);
            if (st != WNA16_OK)
                return st;
        }
        if (stats && W16_SAMPLE_BUDGET - budget_left > stats->most)
            stats->most = W16_SAMPLE_BUDGET - budget_left;
    }
    return WNA16_OK;
}

wna16_status_t w16_spec_check_layouts(const wna16_spec_t *spec, bool full,
                                      wna16_error_t *err)
{
    return w16_spec_check_layouts_stats(spec, full, NULL, err);
}

/* ---- concrete problems ------------------------------------------------------ */

enum { MEMO_SIZE = 64, KEY_LEN = 12 };

struct w16_spec_memo {
    pthread_mutex_t mu;
    int64_t keys[MEMO_SIZE][KEY_LEN];
    int n, next; /* entries, and the one a new problem replaces */
};

wna16_status_t w16_spec_memo_new(wna16_spec_t *spec, wna16_error_t *err)
{
    spec->memo = w16_calloc(spec->ctx, 1, sizeof *spec->memo);
    if (!spec->memo)
        return w16_err_nomem(err, "loading a spec");
    if (pthread_mutex_init(&spec->memo->mu, NULL) != 0) {
        w16_free(spec->ctx, spec->memo, sizeof *spec->memo);
        spec->memo = NULL;
        return w16_err(err, WNA16_ENOMEM, "loading a spec: cannot create a "
                       "mutex");
    }
    return WNA16_OK;
}

void w16_spec_memo_free(wna16_spec_t *spec)
{
    if (!spec->memo)
        return;
    pthread_mutex_destroy(&spec->memo->mu);
    w16_free(spec->ctx, spec->memo, sizeof *spec->memo);
    spec->memo = NULL;
}

static void problem_key(const w16_problem_t *p, int64_t *k)
{
    int64_t v[KEY_LEN] = {p->E, p->H, p->I, p->BITS, p->GS, p->zp,
                          p->act_order, p->bias, p->zeros_stored,
                          p->g_idx_stored, p->a8, p->ungated};
    memcpy(k, v, sizeof v);
}

static bool memo_find(struct w16_spec_memo *m, const int64_t *k)
{
    bool hit = false;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n && !hit; i++)
        hit = memcmp(m->keys[i], k, sizeof m->keys[i]) == 0;
    pthread_mutex_unlock(&m->mu);
    return hit;
}

static void memo_add(struct w16_spec_memo *m, const int64_t *k)
{
    pthread_mutex_lock(&m->mu);
    memcpy(m->keys[m->next], k, sizeof m->keys[0]);
    m->next = (m->next + 1) % MEMO_SIZE;
    if (m->n < MEMO_SIZE)
        m->n++;
    pthread_mutex_unlock(&m->mu);
}

static bool in_list(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

/* Does the spec claim to hold p? Other problems are w16_check_holds' to
 * refuse, with its reasons. */
static bool holds(const wna16_spec_t *spec, const w16_problem_t *p)
{
    const w16_capabilities_t *c = &spec->caps;
    if (!in_list(c->bits, c->n_bits, (int)p->BITS) ||
        (c->n_group_sizes &&
         !in_list(c->group_sizes, c->n_group_sizes, (int)p->GS)))
        return false;
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        wna16_error_t scratch = {0};
        if (w16_spec_bind(spec, p, (wna16_gemm_t)g, vars, &scratch) !=
            WNA16_OK)
            return false;
        for (int r = 0; r < c->n_shape_rules; r++) {
            int64_t hit = 1;
            if (!w16_expr_eval(c->shape_rules[r].cond, vars, &hit, NULL) ||
                hit)
                return false;
        }
    }
    return true;
}

wna16_status_t w16_spec_check_problem(const wna16_spec_t *spec,
                                      const w16_problem_t *p,
                                      w16_check_stats_t *stats,
                                      wna16_error_t *err)
{
    if (!spec || !p)
        return w16_err(err, WNA16_EINVAL, "w16_spec_check_problem: spec and "
                       "problem are required");
    int64_t key[KEY_LEN];
    problem_key(p, key);
    if (spec->memo && memo_find(spec->memo, key)) {
        if (stats)
            stats->memo_hits++;
        return WNA16_OK;
    }
    if (!holds(spec, p))
        return WNA16_OK;
    w16_check_stats_t local = {0};
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        wna16_status_t st = w16_spec_bind(spec, p, (wna16_gemm_t)g, vars, err);
        if (st != WNA16_OK)
            return st;
        char where[128];
        snprintf(where, sizeof where, "E=%lld H=%lld I=%lld BITS=%lld "
                 "GS=%lld%s%s%s%s, %s", (long long)p->E, (long long)p->H,
                 (long long)p->I, (long long)p->BITS, (long long)p->GS,
                 p->zp ? " ZP" : "", p->act_order ? " ACT_ORDER" : "",
                 p->bias ? " HAS_BIAS" : "",
                 p->a8 == 1 ? " A8=int8" : p->a8 == 2 ? " A8=fp8" : "",
                 gemm_name((wna16_gemm_t)g));
        st = check_operand(spec, vars, where, NULL, &local, err);
        if (st != WNA16_OK)
            return st;
    }
    if (stats) {
        stats->evaluated += local.evaluated;
        stats->exhaustive += local.exhaustive;
        stats->proved += local.proved;
        stats->sampled += local.sampled;
        if (local.evaluated > stats->most)
            stats->most = local.evaluated;
    }
    if (spec->memo)
        memo_add(spec->memo, key);
    return WNA16_OK;
}
