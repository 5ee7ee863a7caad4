/*
 * repack_matrix.h - the repack combinations the kernel tests walk
 * (test_nvrtc_repack_all: every kernel compiles with NVRTC;
 * test_emit_spirv: every kernel validates as SPIR-V): every checkpoint
 * format and every stacked layout of codes (not the CPU's, whose qweight
 * carries block sums) into every stacked destination, x bits {4, 8} x the
 * caller's group sizes x zero point x act order x bias x input dtype
 * (16-bit, int8, fp8) x the source's scale dtypes, on one layer. What a
 * layout cannot hold is refused by the reference's own checks on both
 * sides (w16_check_holds; any other status fails the test) and counted;
 * each accepted combination is handed over operand by operand, its
 * problem carrying what the source checkpoint stores unused, as the
 * runtime detects it.
 */
#ifndef WNA16_TESTS_REPACK_MATRIX_H
#define WNA16_TESTS_REPACK_MATRIX_H

#include "spec/spec.h"

typedef void (*rm_operand_fn)(void *user, const wna16_spec_t *src,
                              const wna16_spec_t *dst, const w16_problem_t *p,
                              wna16_gemm_t g, wna16_dtype_t scale_dtype,
                              const char *what);

typedef struct rm_walk {
    wna16_context_t *ctx;
    int32_t E, H, I;                 /* the layer */
    const int *group_sizes;          /* -1: channelwise */
    int n_group_sizes;
    bool verbose;                    /* print each refusal */
    rm_operand_fn operand;           /* each operand of an accepted one */
    void *user;
    long combos, refused;            /* out: added to */
} rm_walk_t;

void rm_walk(rm_walk_t *w);

#endif
