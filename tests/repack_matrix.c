/*
 * repack_matrix.c - see repack_matrix.h: the (source, destination,
 * quantization) walk the repack kernel tests share.
 */
#include "repack_matrix.h"
#include "testutil.h"
#include "runtime/ref/ref.h"

#include <stdio.h>

/* Checkpoint formats, and stacked layouts of codes a layer is repacked
 * from (not the dequantized emulation layout, not the CPU's, whose qweight
 * carries block sums). */
static bool is_source(const wna16_spec_t *s)
{
    const w16_layout_t *q = s->layouts[W16_ROLE_QWEIGHT];
    return s->kind == WNA16_SPEC_FORMAT || (s->stacked && q && !q->sums_block_k);
}

/* One combination: refused as the reference refuses, else each operand. */
static void combination(rm_walk_t *w, const wna16_spec_t *src,
                        const wna16_spec_t *dst, const w16_problem_t *base,
                        wna16_dtype_t fd)
{
    char what[200];
    snprintf(what, sizeof what, "%s -> %s E%lld H%lld I%lld b%lld g%lld "
             "zp%d ao%d bias%d a8=%d %s", src->name, dst->name,
             (long long)base->E, (long long)base->H, (long long)base->I,
             (long long)base->BITS, (long long)base->GS, base->zp,
             base->act_order, base->bias, base->a8, wna16_dtype_name(fd));
    w->combos++;
    w16_problem_t p = *base;
    wna16_error_t err;
    int64_t sv[W16_VAR_COUNT], dv[W16_VAR_COUNT];
    /* the source checkpoint must exist (the reference writes it), the
     * destination must hold it */
    wna16_status_t st = w16_spec_bind(src, &p, WNA16_GEMM_W13, sv, &err);
    if (st == WNA16_OK)
        st = w16_check_holds(src, &p, (int32_t)sv[W16_VAR_IP], &err);
    if (st == WNA16_OK) {
        /* what the checkpoint carries unused, as the runtime detects it */
        p.zeros_stored = !p.zp &&
                         w16_layout_present(src->layouts[W16_ROLE_QZEROS], sv);
        p.g_idx_stored = p.act_order ||
                         w16_layout_present(src->layouts[W16_ROLE_G_IDX], sv);
        st = w16_spec_bind(dst, &p, WNA16_GEMM_W13, dv, &err);
    }
    if (st == WNA16_OK)
        st = w16_check_holds(dst, &p, (int32_t)dv[W16_VAR_IP], &err);
    if (st != WNA16_OK) {
        TU_CHECK_MSG(st == WNA16_EUNSUPPORTED || st == WNA16_EINVAL ||
                     st == WNA16_EFORMAT, "%s: %s: %s", what,
                     wna16_status_name(st), err.message);
        w->refused++;
        if (w->verbose)
            printf("refused: %s: %s\n", what, err.message);
        return;
    }
    w->operand(w->user, src, dst, &p, WNA16_GEMM_W13, fd, what);
    w->operand(w->user, src, dst, &p, WNA16_GEMM_W2, fd, what);
}

void rm_walk(rm_walk_t *w)
{
    static const int bits[] = {4, 8};
    size_t n = wna16_spec_count(w->ctx);
    for (size_t a = 0; a < n; a++) {
        const wna16_spec_t *src = wna16_spec_at(w->ctx, a);
        if (!is_source(src))
            continue;
        const w16_layout_t *sl = src->layouts[W16_ROLE_SCALES];
        for (size_t b = 0; b < n; b++) {
            const wna16_spec_t *dst = wna16_spec_at(w->ctx, b);
            if (!dst->stacked) /* the backends, and MoeWNA16 */
                continue;
            for (size_t i = 0; i < W16_ARRAY_LEN(bits); i++)
                for (int j = 0; j < w->n_group_sizes; j++)
                    for (int m = 0; m < 8 * WNA16_INPUT_COUNT_; m++) {
                        /* zp, act-order, bias, then the input dtype */
                        w16_problem_t p = {w->E, w->H, w->I, bits[i],
                                           w->group_sizes[j], m & 1,
                                           (m >> 1) & 1, (m >> 2) & 1,
                                           .a8 = m >> 3};
                        for (int d = 0; d < (sl ? sl->n_dtypes : 1); d++)
                            combination(w, src, dst, &p,
                                        sl ? sl->dtypes[d] : WNA16_DTYPE_F16);
                    }
        }
    }
}
