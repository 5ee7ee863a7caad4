/*
 * lower_expr.h - lowers spec expressions (already folded for the bound
 * dimensions) into kernel IR, with interval analysis.
 *
 * Spec arithmetic is int64 with floor division; the IR has truncating and
 * unsigned division. Knowing each value's range lets the lowering emit the
 * cheap form: a power-of-two floor division is an arithmetic shift, a
 * division of a value known non-negative is unsigned, `x % d` with x in
 * [0, d) is x itself, and a comparison whose outcome the ranges decide is a
 * constant. Tables become constant tables with the index clamped into
 * range, so padding slots (whose coordinates may leave the domain) never
 * read out of bounds.
 */
#ifndef W16_LOWER_EXPR_H
#define W16_LOWER_EXPR_H

#include "gen/expr.h"
#include "gen/kir.h"

typedef struct w16_range {
    int64_t lo, hi;
} w16_range_t;

typedef struct w16_lower {
    kir_kernel_t *k;
    /* The IR value (i64) and range of each free variable (coordinates,
     * storage indices, slot, c); dims are folded away before lowering. */
    const kir_expr_t *var[W16_VAR_COUNT];
    w16_range_t range[W16_VAR_COUNT];
    /* Constant tables made so far, one per spec table. */
    const w16_table_t *spec_tables[32];
    const kir_ctable_t *tables[32];
    int n_tables;
    const char *failure; /* why lowering failed, NULL if it did not */
    char failbuf[96];
} w16_lower_t;

void w16_lower_init(w16_lower_t *L, kir_kernel_t *k);
/* Forgets every variable binding (keeps the kernel's constant tables). */
void w16_lower_clear_vars(w16_lower_t *L);
/* Binds a free variable to an IR value of known range. */
void w16_lower_bind(w16_lower_t *L, w16_var_t v, const kir_expr_t *value,
                    int64_t lo, int64_t hi);
/* Lowers x; the result is an i64 IR expression (NULL on failure, with
 * L->failure set). `r` (may be NULL) receives the value's range. */
const kir_expr_t *w16_lower(w16_lower_t *L, const w16_expr_t *x,
                            w16_range_t *r);

/* IR helpers with constant folding and the range-aware forms above. All
 * operands and results are i64. */
const kir_expr_t *w16_ir_const(kir_kernel_t *k, int64_t v);
const kir_expr_t *w16_ir_add(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b);
const kir_expr_t *w16_ir_mul(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b);
/* Floor division / modulo by a positive constant d of a value in [lo, hi]. */
const kir_expr_t *w16_ir_floordiv(kir_kernel_t *k, const kir_expr_t *a,
                                  int64_t d, w16_range_t ra);
const kir_expr_t *w16_ir_floormod(kir_kernel_t *k, const kir_expr_t *a,
                                  int64_t d, w16_range_t ra);
/* i1: lo <= a < hi, using the range to drop tests that always hold. */
const kir_expr_t *w16_ir_in_range(kir_kernel_t *k, const kir_expr_t *a,
                                  w16_range_t ra, int64_t lo, int64_t hi);

#endif
