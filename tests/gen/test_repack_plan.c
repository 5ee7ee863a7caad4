/*
 * test_repack_plan.c - repack plans are memoized by request: the second
 * ask builds nothing and returns the same plan; a request that differs in
 * any field the builder reads gets its own plan; threads asking for one
 * new request at once build it once. Needs the CPU target (LLVM).
 */
#include "testutil.h"
#include "runtime/repack_plan.h"
#include "runtime/targets.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static wna16_context_t *ctx;
static const w16_target_t *cpu; /* the CPU target */

static w16_repack_request_t request_to(const char *dst, int gs,
                                       bool word_blocks)
{
    w16_repack_request_t r = {
        .src = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq"),
        .dst = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, dst),
        .problem = {.E = 2, .H = 256, .I = 128, .BITS = 4, .GS = gs},
        .gemm = WNA16_GEMM_W13,
        .role = W16_ROLE_QWEIGHT,
        .word_blocks = word_blocks,
    };
    w16_role_t need[W16_REPACK_MAX_SOURCES];
    int n = w16_repack_source_roles(r.role, &r.problem, need);
    for (int i = 0; i < n; i++)
        r.src_dtype[need[i]] = need[i] == W16_ROLE_SCALES ? WNA16_DTYPE_F16
                                                          : WNA16_DTYPE_I32;
    r.dst_dtype = w16_repack_dst_dtype(r.dst->layouts[r.role],
                                       n ? r.src_dtype[need[0]]
                                         : WNA16_DTYPE_INVALID);
    return r;
}

static w16_repack_request_t request(int gs, bool word_blocks)
{
    return request_to("marlin", gs, word_blocks);
}

typedef struct asker {
    w16_repack_request_t req;
    const w16_repack_plan_t *plan;
    bool built;
    wna16_status_t st;
} asker_t;

static void *ask(void *arg)
{
    asker_t *a = arg;
    wna16_error_t err;
    a->st = w16_repack_plan_get(ctx, cpu, &a->req, false,
                                &a->plan, &a->built, &err);
    return NULL;
}

int main(void)
{
    wna16_error_t err;
    TU_OK(wna16_context_create(NULL, &ctx, &err), &err);
    void *inst;
    if (w16_target_probe(ctx, WNA16_TARGET_CPU, &cpu, &inst, &err) ==
        WNA16_EUNAVAILABLE) {
        printf("SKIP: %s\n", err.message);
        wna16_context_destroy(ctx);
        return 77;
    }

    w16_repack_request_t r = request(128, true);
    TU_CHECK(r.src && r.dst);
    const w16_repack_plan_t *p1, *p2;
    bool built;
    TU_OK(w16_repack_plan_get(ctx, cpu, &r, false, &p1, &built,
                              &err), &err);
    TU_CHECK(built && p1->fn && p1->target == cpu && p1->rk.num_groups > 0);
    TU_CHECK_MSG(strstr(p1->name, "gptq_to_marlin") != NULL, "name %s",
                 p1->name);
    TU_OK(w16_repack_plan_get(ctx, cpu, &r, false, &p2, &built,
                              &err), &err);
    TU_CHECK(!built && p2 == p1);

    /* any field the builder reads makes another plan */
    w16_repack_request_t other[4] = {request(64, true), request(128, false),
                                     r, r};
    other[2].problem.E = 3;
    other[3].gemm = WNA16_GEMM_W2;
    for (int i = 0; i < 4; i++) {
        TU_OK(w16_repack_plan_get(ctx, cpu, &other[i], false,
                                  &p2, &built, &err), &err);
        TU_CHECK_MSG(built && p2 != p1, "request variant %d", i);
    }
    TU_CHECK(p2->rk.shape[0] == r.problem.E); /* w2: E x (I/16) x ... */

    /* four threads, one new request: built once, one plan */
    asker_t a[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (asker_t){.req = request(32, true)};
        TU_CHECK(pthread_create(&t[i], NULL, ask, &a[i]) == 0);
    }
    int builds = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        TU_CHECK(a[i].st == WNA16_OK && a[i].plan == a[0].plan);
        builds += a[i].built;
    }
    TU_CHECK_MSG(builds == 1, "%d builds", builds);

    /* the CPU layout's codes kernel writes its block sums (sums.coord),
     * blocked or not; a layout without sums has none to write */
    for (int wb = 0; wb < 2; wb++) {
        w16_repack_request_t c = request_to("cpu", 128, wb);
        TU_CHECK(c.dst != NULL);
        TU_OK(w16_repack_plan_get(ctx, cpu, &c, false, &p2,
                                  &built, &err), &err);
        TU_CHECK_MSG(p2->rk.sums_fused, "cpu qweight (word blocks %d): "
                     "the sums are not written by %s", wb, p2->name);
    }
    TU_CHECK(!p1->rk.sums_fused);

    wna16_context_destroy(ctx);
    return tu_finish("test_repack_plan");
}
