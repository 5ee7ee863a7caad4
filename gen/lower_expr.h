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
 *
 * Besides ranges, the IR helpers know alignments: facts about any i64 IR
 * value (a range and a number it is always a multiple of) come from the
 * IR itself, the lane id and the let-bound variables the builder notes.
 * A value that is the sum of a multiple of m and a part in [0, m) divides,
 * takes remainders and compares against multiples of m part by part:
 *
 *   (A + B) / d = A / d + B / d   (A / d exact)   when d divides m
 *   (A + B) / d = A / d                           when m divides d
 *   (A + B) % d = B % d, or A % d + B             likewise
 *   A + B >= c  <=>  A >= c                       when m divides c
 *
 * so the part that depends on the workgroup alone stays apart from the
 * part that depends on the lane (the CPU emitter hoists the first out of
 * the loop over lanes) and the code slots of one word share their source
 * address (one load).
 *
 * Two files implement this header: lower_expr.c the lowering of spec
 * expressions (w16_lower*), lower_arith.c the IR helpers and their facts
 * (w16_ir_*, w16_lower_let, w16_lower_note_var), which the builders also
 * use directly and which know nothing of spec expressions.
 */
#ifndef W16_LOWER_EXPR_H
#define W16_LOWER_EXPR_H

#include "spec/expr.h"
#include "gen/kir.h"

typedef struct w16_range {
    int64_t lo, hi;
} w16_range_t;

/* What is known about an i64 IR value: it lies in [lo, hi] and is a
 * multiple of `align` (0: the value is 0). */
typedef struct w16_facts {
    int64_t lo, hi;
    uint64_t align;
} w16_facts_t;

typedef struct w16_lower {
    kir_kernel_t *k;
    /* Facts and definitions of let-bound variables, by variable index
     * (w16_lower_note_var); arrays in the kernel's arena. */
    w16_facts_t *vfacts;
    const kir_expr_t **vdef;
    const kir_expr_t **vnarrow; /* w16_ir_narrow32 of each variable */
    int n_vfacts;
    int64_t num_groups; /* range of the group id (0: unknown) */
    int arms;           /* depth of condition arms being lowered */
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

/* ---- lower_expr.c -------------------------------------------------------- */

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

/* ---- lower_arith.c ------------------------------------------------------- */

/* let name = e in block b, returning the value to use for it (e itself
 * for constants and variables). A value whose facts fit in 32 bits gets a
 * 32-bit variable, viewed as i64 through an extension: its arithmetic is
 * then done in 32 bits by whatever narrows (w16_ir_narrow32), while the
 * facts and the definition stay visible. NULL when out of memory. */
const kir_expr_t *w16_lower_let(w16_lower_t *L, kir_block_t *b,
                                const char *name, const kir_expr_t *e);
/* Records that variable v is let-bound to def (so its facts are def's,
 * and sums can be seen through it). Out of memory only loses the facts. */
void w16_lower_note_var(w16_lower_t *L, const kir_var_t *v,
                        const kir_expr_t *def);
/* An i32 expression equal to e's low 32 bits (so equal to e where e's
 * facts lie in [0, 2^31)): the arithmetic redone in 32 bits where the
 * facts allow it (the CPU vectorizes 32-bit lanes twice as wide, and
 * 32-bit divisions by constants are cheaper), else a truncation. */
const kir_expr_t *w16_ir_narrow32(w16_lower_t *L, const kir_expr_t *e);
/* e as an i64 index through w16_ir_narrow32 when its facts lie in
 * [0, 2^31), else e. */
const kir_expr_t *w16_ir_index32(w16_lower_t *L, const kir_expr_t *e);
/* e where it lies in [lo, hi): selects with a constant arm outside the
 * range reduced to their other arm (for values only used where they are
 * known to be in range). */
const kir_expr_t *w16_ir_assume_in_range(const w16_lower_t *L,
                                         const kir_expr_t *e, int64_t lo,
                                         int64_t hi);
/* Whether e may differ between the lanes of a workgroup (it reads the lane
 * id, a load, or a variable whose definition is not noted). */
bool w16_ir_uses_lane(const w16_lower_t *L, const kir_expr_t *e);
/* The facts about an i64 (or zero-extended) IR value. */
w16_facts_t w16_ir_facts(const w16_lower_t *L, const kir_expr_t *e);

/* IR helpers with constant folding and the range- and alignment-aware
 * forms above. All operands and results are i64 unless said otherwise. */
const kir_expr_t *w16_ir_const(kir_kernel_t *k, int64_t v);
/* Whether e is an i64 constant (its value in *v when v is not NULL). */
bool w16_ir_is_const(const kir_expr_t *e, int64_t *v);
const kir_expr_t *w16_ir_add(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b);
const kir_expr_t *w16_ir_sub(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b);
const kir_expr_t *w16_ir_mul(kir_kernel_t *k, const kir_expr_t *a,
                             const kir_expr_t *b);
/* Floor division / modulo by a positive constant d of a value known to lie
 * in ra (besides what its facts say). */
const kir_expr_t *w16_ir_floordiv(w16_lower_t *L, const kir_expr_t *a,
                                  int64_t d, w16_range_t ra);
const kir_expr_t *w16_ir_floormod(w16_lower_t *L, const kir_expr_t *a,
                                  int64_t d, w16_range_t ra);
/* i1: lo <= a < hi, using the range to drop tests that always hold. */
const kir_expr_t *w16_ir_in_range(w16_lower_t *L, const kir_expr_t *a,
                                  w16_range_t ra, int64_t lo, int64_t hi);
/* i1: a >= c (signed). */
const kir_expr_t *w16_ir_ge(w16_lower_t *L, const kir_expr_t *a, int64_t c);
/* i1 helpers that fold constant operands. */
const kir_expr_t *w16_ir_and1(kir_kernel_t *k, const kir_expr_t *a,
                              const kir_expr_t *b);
const kir_expr_t *w16_ir_select(kir_kernel_t *k, const kir_expr_t *c,
                                const kir_expr_t *a, const kir_expr_t *b);

#endif
