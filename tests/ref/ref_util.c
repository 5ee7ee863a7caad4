/*
 * ref_util.c - see ref_util.h.
 */
#include "ref_util.h"

#include <stdlib.h>
#include <string.h>

void ru_operand_init(ru_operand_t *o, wna16_context_t *ctx, const char *name,
                     wna16_gemm_t gemm, w16_problem_t p)
{
    wna16_error_t err;
    memset(o, 0, sizeof *o);
    o->spec = wna16_spec_find(ctx, 0, name);
    if (!o->spec) {
        fprintf(stderr, "no spec %s\n", name);
        exit(1);
    }
    if (w16_spec_bind(o->spec, &p, gemm, o->vars, &err) != WNA16_OK ||
        wna16_qweight_alloc(&o->qw, (int32_t)p.E, (int32_t)o->vars[W16_VAR_N],
                            (int32_t)o->vars[W16_VAR_K], (int32_t)p.BITS,
                            (int32_t)p.GS, p.zp, p.act_order, p.bias,
                            &err) != WNA16_OK ||
        wna16_tensor_set_create(ctx, &o->set, &err) != WNA16_OK) {
        fprintf(stderr, "%s: %s\n", name, err.message);
        exit(1);
    }
}

void ru_operand_free(ru_operand_t *o)
{
    wna16_qweight_free(&o->qw);
    wna16_tensor_set_destroy(o->set);
}

const wna16_tensor_t *ru_encode(ru_operand_t *o, w16_role_t r)
{
    const w16_layout_t *l = o->spec->layouts[r];
    wna16_error_t err;
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_tensor_t *t;
    char name[64];
    snprintf(name, sizeof name, "t%zu", wna16_tensor_set_count(o->set));
    TU_CHECK(l != NULL);
    if (!l)
        return NULL;
    TU_OK(w16_layout_shape(l, o->vars, shape, &err), &err);
    TU_OK(wna16_tensor_set_add_new(o->set, name, l->dtypes[0], l->ndim, shape,
                                   &t, &err), &err);
    wna16_status_t st = w16_layout_encode(o->spec, l, o->vars, &o->qw, t,
                                          (w16_place_t){0, 0}, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s", err.message);
    return st == WNA16_OK ? t : NULL;
}

uint32_t ru_word(const wna16_tensor_t *t, size_t i)
{
    uint32_t w;
    memcpy(&w, (const uint8_t *)t->data + 4 * i, 4);
    return w;
}

uint8_t ru_byte(const wna16_tensor_t *t, size_t i) { return ((const uint8_t *)t->data)[i]; }
