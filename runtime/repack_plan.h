/*
 * repack_plan.h - the compiled repack kernel for a request, found by the
 * request itself.
 *
 * The kernel cache is keyed by a kernel's printed IR, which is right for
 * its identity but means building and printing the IR on every call: for
 * the blocked CPU kernels (Marlin's w13 qweight prints 72 KB) that cost
 * milliseconds per tensor per layer. A plan keeps what a launch needs (the
 * kernel's launch shape and parameter slots, and the compiled function),
 * built once per context and request, then found by hashing the request's
 * fields and the specs' content hashes.
 */
#ifndef W16_REPACK_PLAN_H
#define W16_REPACK_PLAN_H

#include "gen/build_repack.h"
#include "runtime/target/target.h"

typedef struct w16_repack_plan {
    w16_repack_kernel_t rk; /* the builder's answer; rk.kernel is NULL */
    char name[192];         /* the kernel's name, for messages */
    int lanes;              /* workgroup size */
    int n_params;           /* kernel parameters */
    const w16_target_t *target; /* where fn runs */
    void *fn;               /* the loaded kernel (the kernel cache's) */
    double compile_ms;      /* time this plan took to build and compile */
    wna16_context_t *ctx;   /* owner (frees the plan) */
} w16_repack_plan_t;

/* The plan for `req` (the block-sums kernel when `sums`) on target T.
 * Plans stay valid until the context is destroyed. *built is set when this
 * call built it (may be NULL). */
wna16_status_t w16_repack_plan_get(wna16_context_t *ctx, const w16_target_t *T,
                                   const w16_repack_request_t *req, bool sums,
                                   const w16_repack_plan_t **out, bool *built,
                                   wna16_error_t *err);

#endif
