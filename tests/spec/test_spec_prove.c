/*
 * test_spec_prove.c - the structure proof of a layout (spec/spec_prove.c)
 * against the exhaustive walk (spec/spec_map.c), which checks every
 * element and every place. (i) On every built-in spec, at many random
 * problems small enough to walk, and on mutants of their layouts (one map
 * expression edited), the proof never accepts what the walk refuses, and
 * a counterexample it reports is one the walk reports too; it proves the
 * built-in layouts outright. (ii) At real sizes (Mixtral-8x7B,
 * DeepSeek-V3, Qwen3-30B-A3B; every bits, group size, zero point and
 * input dtype a backend holds) every built-in layout is proved, not
 * probed, within a bounded number of evaluations, and the second check of
 * a problem is a memo hit.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "spec/spec_prove.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool in_list(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return n == 0;
}

/* Walks and proves every present layout of spec for p; counts agreement. */
typedef struct tally {
    long layouts, proved, walk_fail, prove_fail, mismatch;
} tally_t;

static void cross_check(const wna16_spec_t *spec, const w16_problem_t *p,
                        tally_t *t, bool verbose)
{
    for (int g = 0; g < 2; g++) {
        int64_t vars[W16_VAR_COUNT];
        wna16_error_t err = {0};
        if (w16_spec_bind(spec, p, (wna16_gemm_t)g, vars, &err) != WNA16_OK)
            return;
        for (int r = 0; r < W16_ROLE_COUNT; r++) {
            const w16_layout_t *l = spec->layouts[r];
            if (!l || !w16_layout_present(l, vars))
                continue;
            w16_arena_t arena;
            w16_arena_init(&arena, spec->ctx);
            w16_bound_t b;
            bool empty = false;
            if (w16_bound_init(&b, spec, l, vars, "x", &arena, &empty,
                               &err) != WNA16_OK || empty ||
                w16_bound_walk_cost(&b) > (1 << 19)) {
                w16_arena_free(&arena);
                continue;
            }
            wna16_error_t ew = {0}, ep = {0};
            wna16_status_t sw = w16_bound_walk(&b, NULL, &ew);
            bool proved = false;
            const char *why = NULL;
            wna16_status_t sp = w16_bound_prove(&b, INT64_C(1) << 24, &proved,
                                                &why, NULL, &ep);
            t->layouts++;
            t->proved += proved;
            t->walk_fail += sw != WNA16_OK;
            t->prove_fail += sp != WNA16_OK;
            /* sound: never proved where the walk fails; a reported failure
             * is a real one */
            bool bad = (sw != WNA16_OK && sp == WNA16_OK && proved) ||
                       (sp != WNA16_OK && sw == WNA16_OK);
            t->mismatch += bad;
            TU_CHECK_MSG(!bad, "%s %s E=%lld H=%lld I=%lld BITS=%lld GS=%lld "
                         "%s: walk says \"%s\", proof says \"%s\" (proved %d)",
                         spec->name, l->json_path, (long long)p->E,
                         (long long)p->H, (long long)p->I, (long long)p->BITS,
                         (long long)p->GS, g ? "w2" : "w13",
                         sw ? ew.message : "ok", sp ? ep.message : "ok",
                         proved);
            if (verbose && sw == WNA16_OK && !proved)
                printf("  not proved: %s %s (E=%lld H=%lld I=%lld GS=%lld): "
                       "%s\n", spec->name, l->json_path, (long long)p->E,
                       (long long)p->H, (long long)p->I, (long long)p->GS,
                       why);
            w16_arena_free(&arena);
        }
    }
}

static const int64_t hs[] = {32, 64, 96, 128, 192, 256, 384, 512};
static const int64_t is[] = {16, 32, 48, 64, 96, 128, 160, 192, 256, 320};
static const int64_t gss[] = {-1, 16, 32, 64, 128};

static void test_builtin_cross_check(void)
{
    wna16_context_t *ctx = tu_context();
    tu_rng_t rng;
    tu_rng_seed(&rng, 11);
    tally_t t = {0};
    bool verbose = getenv("WNA16_TEST_VERBOSE") != NULL;
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        for (int k = 0; k < 30; k++) {
            w16_problem_t p = {
                .E = 1 + tu_rng_below(&rng, 3),
                .H = hs[tu_rng_below(&rng, 6)],
                .I = is[tu_rng_below(&rng, 9)],
                .BITS = tu_rng_below(&rng, 2) ? 4 : 8,
                .GS = gss[tu_rng_below(&rng, 5)],
                .zp = tu_rng_below(&rng, 2),
                .bias = tu_rng_below(&rng, 2),
                .act_order = tu_rng_below(&rng, 4) == 0,
                .zeros_stored = tu_rng_below(&rng, 4) == 0,
                .g_idx_stored = tu_rng_below(&rng, 4) == 0,
                .a8 = (int)tu_rng_below(&rng, 3),
            };
            if (!s->caps.input_dtypes[p.a8])
                p.a8 = 0;
            cross_check(s, &p, &t, verbose);
        }
        for (int k = 0; k < s->n_samples; k++) {
            const struct w16_sample *sm = &s->samples[k];
            w16_problem_t p = {sm->E, sm->H, sm->I, sm->BITS, sm->GS,
                               sm->ZP != 0, sm->ACT_ORDER != 0,
                               sm->HAS_BIAS != 0, sm->ZEROS_STORED != 0,
                               sm->G_IDX_STORED != 0, (int)sm->A8};
            cross_check(s, &p, &t, verbose);
        }
    }
    printf("built-in layouts at random small problems: %ld bound, %ld "
           "proved, %ld refused by the walk, %ld by the proof, %ld "
           "disagreements\n", t.layouts, t.proved, t.walk_fail, t.prove_fail,
           t.mismatch);
    TU_CHECK(t.layouts > 800 && t.mismatch == 0);
    /* the structure proof covers the built-in layouts where they are
     * consistent */
    TU_CHECK_MSG(t.proved >= t.layouts - t.walk_fail - t.layouts / 50,
                 "only %ld of %ld proved", t.proved, t.layouts);
    wna16_context_destroy(ctx);
}

/* ---- mutants ---------------------------------------------------------------- */

/* One edit inside the layouts of a spec's text: a number changed, an
 * operator swapped or a coordinate renamed, in a map expression. NULL when
 * the text offers nothing to edit there. */
static char *mutate(const char *text, tu_rng_t *r)
{
    const char *from = strstr(text, "\"layouts\"");
    const char *to = from ? strstr(from, "\"selection\"") : NULL;
    if (!from || !to)
        return NULL;
    /* edit only inside expressions of index, bit, coord and the lets:
     * candidate characters are digits, operators and single-letter
     * coordinates inside a quoted string */
    size_t n = strlen(text), cand[4096];
    int nc = 0;
    bool in_str = false;
    for (const char *p = from; p < to && nc < 4096; p++) {
        if (*p == '"') {
            in_str = !in_str;
            continue;
        }
        if (!in_str)
            continue;
        char c = *p;
        bool lone = (c == 'n' || c == 'k' || c == 'e' || c == 'g') &&
                    !((p[-1] >= 'a' && p[-1] <= 'z') || p[-1] == '_') &&
                    !((p[1] >= 'a' && p[1] <= 'z') || p[1] == '_' ||
                      (p[1] >= '0' && p[1] <= '9'));
        if ((c >= '0' && c <= '9') || c == '%' || c == '/' || c == '+' ||
            c == '*' || lone)
            cand[nc++] = (size_t)(p - text);
    }
    if (!nc)
        return NULL;
    size_t at = cand[tu_rng_below(r, (uint32_t)nc)];
    char *out = malloc(n + 8);
    memcpy(out, text, n + 1);
    char c = text[at];
    static const char ops[] = "%/+*-";
    static const char vars[] = "nkeg";
    if (c >= '0' && c <= '9') {
        static const char *const repl[] = {"1", "2", "3", "7", "9", "0"};
        const char *rp = repl[tu_rng_below(r, 6)];
        out[at] = rp[0];
    } else if (strchr(ops, c)) {
        out[at] = ops[tu_rng_below(r, 5)];
    } else {
        out[at] = vars[tu_rng_below(r, 4)];
    }
    return out;
}

static void test_mutants(void)
{
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .no_builtin_specs = true};
    wna16_context_t *ctx = NULL;
    wna16_error_t err = {0};
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return;
    tu_rng_t rng;
    tu_rng_seed(&rng, getenv("WNA16_TEST_SEED")
                          ? strtoull(getenv("WNA16_TEST_SEED"), NULL, 10) : 23);
    int n_specs = 0;
    while (w16_embedded_specs[n_specs].origin)
        n_specs++;
    tally_t t = {0};
    long tried = 0, accepted = 0, caught = 0;
    int iterations = getenv("WNA16_TEST_MUTANTS")
                         ? atoi(getenv("WNA16_TEST_MUTANTS")) : 200;
    for (int it = 0; it < iterations; it++) {
        const w16_embedded_spec_t *e = &w16_embedded_specs[tu_rng_below(
            &rng, (uint32_t)n_specs)];
        char *text = mutate(e->text, &rng);
        if (!text)
            continue;
        tried++;
        wna16_spec_t *s = NULL;
        wna16_error_t pe = {0};
        /* a mutant its first sample accepts: the case the real-size check
         * is for */
        if (w16_spec_parse(ctx, "mutant", text, strlen(text), &s, &pe) ==
            WNA16_OK) {
            accepted++;
            long before = t.walk_fail;
            for (int k = 0; k < 5; k++) {
                w16_problem_t p = {
                    .E = 1 + tu_rng_below(&rng, 2),
                    .H = hs[tu_rng_below(&rng, 5)],
                    .I = is[tu_rng_below(&rng, 7)],
                    .BITS = tu_rng_below(&rng, 2) ? 4 : 8,
                    .GS = gss[tu_rng_below(&rng, 5)],
                    .zp = tu_rng_below(&rng, 2),
                    .bias = tu_rng_below(&rng, 2),
                    .a8 = (int)tu_rng_below(&rng, 3),
                };
                if (!s->caps.input_dtypes[p.a8])
                    p.a8 = 0;
                cross_check(s, &p, &t, false);
            }
            caught += t.walk_fail > before;
            w16_spec_free(s);
        }
        free(text);
    }
    printf("mutants: %ld edited, %ld pass their first sample, %ld of those "
           "fail at other sizes; %ld layouts bound, %ld proved, %ld refused "
           "by the walk, %ld by the proof, %ld disagreements\n", tried,
           accepted, caught, t.layouts, t.proved, t.walk_fail, t.prove_fail,
           t.mismatch);
    TU_CHECK(t.mismatch == 0 && accepted > 20 && caught > 0);
    wna16_context_destroy(ctx);
}

/* ---- real sizes ------------------------------------------------------------ */

static void test_real_sizes(void)
{
    wna16_context_t *ctx = tu_context();
    static const struct { const char *name; int64_t E, H, I; } models[] = {
        {"Mixtral-8x7B", 8, 4096, 14336},
        {"DeepSeek-V3", 256, 7168, 2048},
        {"Qwen3-30B-A3B", 128, 2048, 768},
        {"odd", 3, 4096, 1000},
    };
    static const int gs_try[] = {-1, 32, 64, 128};
    long problems = 0, refused = 0;
    w16_check_stats_t total = {0};
    double worst = 0;
    const char *worst_what = "";
    char worst_buf[160];
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        for (size_t m = 0; m < sizeof models / sizeof models[0]; m++)
            for (int bi = 0; bi < s->caps.n_bits; bi++)
                for (int gi = 0; gi < 4; gi++)
                    for (int zp = 0; zp < 2; zp++)
                        for (int a8 = 0; a8 < WNA16_INPUT_COUNT_; a8++) {
                            if (!s->caps.input_dtypes[a8] ||
                                !in_list(s->caps.group_sizes,
                                         s->caps.n_group_sizes, gs_try[gi]))
                                continue;
                            w16_problem_t p = {models[m].E, models[m].H,
                                               models[m].I, s->caps.bits[bi],
                                               gs_try[gi], zp, false, zp,
                                               .a8 = a8};
                            w16_check_stats_t st = {0};
                            wna16_error_t err = {0};
                            double t0 = now_s();
                            wna16_status_t rc =
                                w16_spec_check_problem(s, &p, &st, &err);
                            double dt = now_s() - t0;
                            TU_OK(rc, &err);
                            problems++;
                            refused += rc != WNA16_OK;
                            TU_CHECK_MSG(st.sampled == 0, "%s at %s bits %lld "
                                         "gs %lld zp %d a8 %d: %d layouts "
                                         "only probed", s->name,
                                         models[m].name, (long long)p.BITS,
                                         (long long)p.GS, zp, a8, st.sampled);
                            total.evaluated += st.evaluated;
                            total.proved += st.proved;
                            total.exhaustive += st.exhaustive;
                            total.sampled += st.sampled;
                            if (st.most > total.most)
                                total.most = st.most;
                            if (dt > worst) {
                                worst = dt;
                                snprintf(worst_buf, sizeof worst_buf,
                                         "%s at %s, %lld-bit, group %lld",
                                         s->name, models[m].name,
                                         (long long)p.BITS, (long long)p.GS);
                                worst_what = worst_buf;
                            }
                            if (getenv("WNA16_TEST_VERBOSE") &&
                                (dt > 0.02 || st.sampled))
                                printf("  %s at %s, %lld-bit, group %lld, zp "
                                       "%d, a8 %d: %.1f ms, %lld evaluated, "
                                       "%d probed\n", s->name,
                                       models[m].name, (long long)p.BITS,
                                       (long long)p.GS, zp, a8, dt * 1e3,
                                       (long long)st.evaluated, st.sampled);
                            /* the second time is a memo hit (problems the
                             * spec holds; the others pass untouched) */
                            w16_check_stats_t again = {0};
                            TU_OK(w16_spec_check_problem(s, &p, &again, &err),
                                  &err);
                            TU_CHECK(st.evaluated == 0 ||
                                     (again.memo_hits == 1 &&
                                      again.evaluated == 0));
                        }
    }
    printf("real sizes: %ld problems of the built-in specs, %d layouts "
           "proved, %d walked, %d probed; %lld evaluations in all, at most "
           "%lld for one problem; slowest %.1f ms (%s)\n", problems,
           total.proved, total.exhaustive, total.sampled,
           (long long)total.evaluated, (long long)total.most, worst * 1e3,
           worst_what);
    TU_CHECK(problems > 100 && refused == 0 && total.sampled == 0);
    TU_CHECK(total.most <= (INT64_C(1) << 20));
    wna16_context_destroy(ctx);
}

int main(void)
{
    if (!getenv("WNA16_TEST_REAL_ONLY")) {
        test_builtin_cross_check();
        test_mutants();
    }
    test_real_sizes();
    return tu_finish("test_spec_prove");
}
