/*
 * spec_map.h - one layout bound to one GEMM operand of one problem, the
 * form every layout check works on (private to spec/).
 *
 * A bound map holds the layout's forward map (index, bit), inverse map
 * (coord) and, for the CPU's block sums, the second pair of maps
 * (sums.index, sums.coord), all folded with the problem's dimensions, plus
 * the extents of the logical domain and of the storage. spec_map.c binds
 * it, walks it exhaustively (the exact check, every element and every
 * place) and probes it (a bounded sample); spec_prove.c proves it at any
 * size from the maps' structure. Both report a failure the same way:
 * "<spec origin>: <JSON path> (<where>): <what>", naming the elements.
 */
#ifndef W16_SPEC_MAP_H
#define W16_SPEC_MAP_H

#include "spec/spec.h"

/* A pair of maps between a box of logical coordinates and a stored
 * tensor: the codes of a layout, or its block sums. */
typedef struct w16_map {
    const char *path;  /* "$.layouts.qweight" or "$.layouts.qweight.sums" */
    int nc;            /* logical coordinates, role order */
    w16_var_t cvar[W16_MAX_COORDS];
    int64_t ext[W16_MAX_COORDS];
    /* folded forward map: coordinates -> storage index (and bit) */
    const w16_expr_t *index[W16_MAX_STORE_DIMS];
    const w16_expr_t *bit; /* NULL: 0 */
    /* folded inverse map: storage index + slot -> coordinates; NULL
     * entries read 0 (e of a per-expert layout); `has_coord` false for
     * block sums without sums.coord */
    const w16_expr_t *coord[W16_MAX_COORDS];
    bool has_coord;
    /* Block sums: a place is an element (slot 0), each sum owns 4 bytes
     * from its index along the last dimension, and the inverse map claims
     * a place when it gives n >= 0 (the others are not sums). */
    bool sums;
} w16_map_t;

/* One layout bound to one operand. */
typedef struct w16_bound {
    const wna16_spec_t *spec;
    const w16_layout_t *l;
    char where[128];   /* "sample 0, w13" or "E=8 H=4096 I=14336 ..., w13" */
    int64_t vars[W16_VAR_COUNT];
    int ndim;
    int64_t shape[W16_MAX_STORE_DIMS];
    int64_t elems;     /* product of the shape */
    wna16_dtype_t dtype;
    int cb, slots;     /* bits per code, codes per element */
    w16_map_t codes;
    bool has_sums;
    int64_t sum_block; /* sums.block_k */
    w16_map_t sums;
} w16_bound_t;

/* Binds layout l (present, with at least one element) for the bound dims
 * `vars`, folding its maps into `arena`. Fails with the layout's path on a
 * shape, code_bits or sums.block_k that does not evaluate or does not fit.
 * *empty is set when the tensor holds nothing (a zero dimension). */
wna16_status_t w16_bound_init(w16_bound_t *b, const wna16_spec_t *spec,
                              const w16_layout_t *l, const int64_t *vars,
                              const char *where, w16_arena_t *arena,
                              bool *empty, wna16_error_t *err);

/* Places the exhaustive walk of b visits (codes: elements + places; sums:
 * sums + places), the cost w16_bound_walk would have. */
int64_t w16_bound_walk_cost(const w16_bound_t *b);

/* The exact check: every logical element maps inside the shape at a whole
 * slot, no two share a place, the inverse map reads each back, every other
 * place reads as padding (outside the domain), and each block sum owns 4
 * bytes no code and no other sum uses, read back by sums.coord where given
 * (docs/specs.md section 6). */
wna16_status_t w16_bound_walk(const w16_bound_t *b, w16_check_stats_t *stats,
                              wna16_error_t *err);

/* The same conditions on a bounded sample: up to `n` logical elements and
 * `n` places, the extremes and boundaries of every axis first, then random
 * ones from `seed`. A failure is a real counterexample; passing proves
 * nothing beyond the probes. */
wna16_status_t w16_bound_probe(const w16_bound_t *b, int n, uint64_t seed,
                               w16_check_stats_t *stats, wna16_error_t *err);

/* ---- shared by spec_map.c and spec_prove.c -------------------------------- */

/* "e=1, n=2, k=3" for the coordinates c of map m. */
void w16_map_fmt(char *out, size_t n, const w16_map_t *m, const int64_t *c);

/* Forward map of x: storage index and bit, or a message naming the
 * expression that failed. */
wna16_status_t w16_map_forward(const w16_bound_t *b, const w16_map_t *m,
                               int64_t *env, const int64_t *x, int64_t *idx,
                               int64_t *bit, wna16_error_t *err);
/* Inverse map at (idx, slot), or a message naming the expression and the
 * place: the place of element `owner`, or (owner NULL) a padding place. */
wna16_status_t w16_map_inverse(const w16_bound_t *b, const w16_map_t *m,
                               int64_t *env, const int64_t *idx, int64_t slot,
                               int64_t *out, const int64_t *owner,
                               wna16_error_t *err);
/* Is x inside map m's logical domain? For sums: does it claim a sum. */
bool w16_map_inside(const w16_map_t *m, const int64_t *x);
/* The failures, worded alike by every check. */
wna16_status_t w16_map_fail_shape(const w16_bound_t *b, const w16_map_t *m,
                                  const int64_t *x, int d, int64_t at,
                                  wna16_error_t *err);
wna16_status_t w16_map_fail_bit(const w16_bound_t *b, const int64_t *x,
                                int64_t bit, wna16_error_t *err);
/* x is stored at a place whose inverse reads y (y != x): two elements on
 * one place when y's forward map lands there too. */
wna16_status_t w16_map_fail_inverse(const w16_bound_t *b, const w16_map_t *m,
                                    int64_t *env, const int64_t *x,
                                    const int64_t *y, wna16_error_t *err);
/* The inverse map at place (flat, slot) claims x, which is not stored
 * there. */
wna16_status_t w16_map_fail_claim(const w16_bound_t *b, const w16_map_t *m,
                                  int64_t flat, int64_t slot,
                                  const int64_t *x, wna16_error_t *err);
/* Sum x's bytes overlap codes or another sum. */
wna16_status_t w16_map_fail_overlap(const w16_bound_t *b, const int64_t *x,
                                    wna16_error_t *err);

#endif /* W16_SPEC_MAP_H */
