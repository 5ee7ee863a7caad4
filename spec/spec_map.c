/*
 * spec_map.c - a layout bound to one operand of one problem (spec_map.h):
 * binding (shape, code width, maps folded with the dimensions), the
 * exhaustive walk that checks every element and every place, the bounded
 * probes used where a real-size layout cannot be proved, and the failure
 * messages every check shares, so that a collision reads the same whether
 * a walk, a probe or a proof found it.
 */
#include "spec/spec_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding -------------------------------------------------------------- */

static bool fold_all(w16_arena_t *a, const w16_expr_t *const *src,
                     const w16_expr_t **dst, int n, const int64_t *vars)
{
    for (int i = 0; i < n; i++) {
        dst[i] = NULL;
        if (src[i] && !(dst[i] = w16_expr_fold(a, src[i], vars)))
            return false;
    }
    return true;
}

wna16_status_t w16_bound_init(w16_bound_t *b, const wna16_spec_t *spec,
                              const w16_layout_t *l, const int64_t *vars,
                              const char *where, w16_arena_t *arena,
                              bool *empty, wna16_error_t *err)
{
    memset(b, 0, sizeof *b);
    *empty = false;
    b->spec = spec;
    b->l = l;
    snprintf(b->where, sizeof b->where, "%s", where);
    memcpy(b->vars, vars, sizeof b->vars);
    b->ndim = l->ndim;
    wna16_status_t st = w16_layout_shape(l, vars, b->shape, err);
    if (st != WNA16_OK) {
        w16_err_prefix(err, "%s", spec->origin);
        return st;
    }
    b->dtype = l->dtypes[0];
    int eb = (int)wna16_dtype_size(b->dtype) * 8;
    b->cb = w16_layout_code_bits(l, b->dtype, vars);
    if (b->cb <= 0)
        return w16_err(err, WNA16_ESPEC, "%s: %s (%s): code_bits does not "
                       "evaluate to a width in [1, 64]", spec->origin,
                       l->json_path, where);
    if (eb % b->cb != 0)
        return w16_err(err, WNA16_ESPEC, "%s: %s (%s): %d-bit codes do not "
                       "fill %s elements", spec->origin, l->json_path, where,
                       b->cb, wna16_dtype_name(b->dtype));
    b->slots = eb / b->cb;
    b->elems = 1;
    for (int d = 0; d < b->ndim; d++)
        if (b->shape[d] == 0) {
            *empty = true; /* e.g. an (E, 0) g_idx holds nothing */
            return WNA16_OK;
        }
    for (int d = 0; d < b->ndim; d++)
        if (__builtin_mul_overflow(b->elems, b->shape[d], &b->elems) ||
            b->elems > (INT64_C(1) << 56))
            return w16_err(err, WNA16_EUNSUPPORTED, "%s: %s (%s): the shape "
                           "holds more than 2^56 elements", spec->origin,
                           l->json_path, where);
    int64_t places = b->elems * b->slots;

    w16_map_t *m = &b->codes;
    m->path = l->json_path;
    w16_var_t cv[W16_MAX_COORDS];
    m->nc = w16_role_coords(l->role, cv);
    memcpy(m->cvar, cv, sizeof cv);
    w16_role_extent(l->role, vars, m->ext);
    if (!spec->stacked && m->nc > 0)
        m->ext[0] = 1; /* the expert is in the tensor name */
    int64_t total = 1;
    for (int i = 0; i < m->nc; i++)
        if (__builtin_mul_overflow(total, m->ext[i], &total))
            total = INT64_MAX;
    if (total > places)
        return w16_err(err, WNA16_ESPEC, "%s: %s (%s): %lld logical values do "
                       "not fit in %lld places", spec->origin, l->json_path,
                       where, (long long)total, (long long)places);
    m->has_coord = true;
    if (!fold_all(arena, l->index, m->index, b->ndim, vars) ||
        !fold_all(arena, &l->bit, &m->bit, 1, vars) ||
        !fold_all(arena, l->coord, m->coord, m->nc, vars))
        return w16_err_nomem(err, "binding a layout");

    if (!l->sums_block_k)
        return WNA16_OK;
    w16_eval_error_t e = {0};
    int64_t bk = 0;
    if (!w16_expr_eval(l->sums_block_k, vars, &bk, &e) || bk <= 0 ||
        vars[W16_VAR_K] % bk != 0)
        return w16_err(err, WNA16_ESPEC, "%s: %s.sums.block_k (%s): %s",
                       spec->origin, l->json_path, where,
                       e.what ? e.what : "must divide K");
    b->has_sums = true;
    b->sum_block = bk;
    m = &b->sums;
    char *path = w16_arena_alloc(arena, strlen(l->json_path) + 8);
    if (!path)
        return w16_err_nomem(err, "binding a layout");
    sprintf(path, "%s.sums", l->json_path);
    m->path = path;
    m->nc = 3;
    m->cvar[0] = W16_VAR_e;
    m->cvar[1] = W16_VAR_n;
    m->cvar[2] = W16_VAR_g;
    m->ext[0] = spec->stacked ? vars[W16_VAR_E] : 1;
    m->ext[1] = vars[W16_VAR_N];
    m->ext[2] = vars[W16_VAR_K] / bk;
    m->sums = true;
    m->has_coord = l->sums_coord[0] != NULL;
    if (!fold_all(arena, l->sums_index, m->index, b->ndim, vars) ||
        (m->has_coord && !fold_all(arena, l->sums_coord, m->coord, 3, vars)))
        return w16_err_nomem(err, "binding a layout");
    return WNA16_OK;
}

/* ---- evaluation and messages ---------------------------------------------- */

void w16_map_fmt(char *out, size_t n, const w16_map_t *m, const int64_t *c)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < m->nc && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s%s=%lld",
                                 i ? ", " : "", w16_var_name(m->cvar[i]),
                                 (long long)c[i]);
}

static const char *coord_name(const w16_map_t *m, int j)
{
    return w16_var_name(m->cvar[j]);
}

wna16_status_t w16_map_forward(const w16_bound_t *b, const w16_map_t *m,
                               int64_t *env, const int64_t *x, int64_t *idx,
                               int64_t *bit, wna16_error_t *err)
{
    w16_eval_error_t e = {0};
    for (int i = 0; i < m->nc; i++)
        env[m->cvar[i]] = x[i];
    for (int d = 0; d < b->ndim; d++)
        if (!w16_expr_eval(m->index[d], env, &idx[d], &e)) {
            char a[128];
            w16_map_fmt(a, sizeof a, m, x);
            return w16_err(err, WNA16_ESPEC, "%s: %s.index[%d] (%s): forward "
                           "map of (%s): %s", b->spec->origin, m->path, d,
                           b->where, a, e.what);
        }
    *bit = 0;
    if (m->bit && !w16_expr_eval(m->bit, env, bit, &e)) {
        char a[128];
        w16_map_fmt(a, sizeof a, m, x);
        return w16_err(err, WNA16_ESPEC, "%s: %s.bit (%s): forward map of "
                       "(%s): %s", b->spec->origin, m->path, b->where, a,
                       e.what);
    }
    return WNA16_OK;
}

static int64_t flat_of(const w16_bound_t *b, const int64_t *idx);

wna16_status_t w16_map_inverse(const w16_bound_t *b, const w16_map_t *m,
                               int64_t *env, const int64_t *idx, int64_t slot,
                               int64_t *out, const int64_t *owner,
                               wna16_error_t *err)
{
    for (int d = 0; d < b->ndim; d++)
        env[W16_VAR_i0 + d] = idx[d];
    env[W16_VAR_slot] = slot;
    for (int j = 0; j < m->nc; j++) {
        w16_eval_error_t e = {0};
        out[j] = 0;
        if (!m->coord[j] || w16_expr_eval(m->coord[j], env, &out[j], &e))
            continue;
        char what[160];
        if (owner) {
            char a[128];
            w16_map_fmt(a, sizeof a, m, owner);
            snprintf(what, sizeof what, "at the place of (%s)", a);
        } else {
            snprintf(what, sizeof what, "of a padding place (element %lld "
                     "slot %lld)", (long long)flat_of(b, idx),
                     (long long)slot);
        }
        return w16_err(err, WNA16_ESPEC, "%s: %s.coord.%s (%s): inverse map "
                       "%s: %s", b->spec->origin, m->path, coord_name(m, j),
                       b->where, what, e.what);
    }
    return WNA16_OK;
}

bool w16_map_inside(const w16_map_t *m, const int64_t *x)
{
    if (m->sums)
        return x[1] >= 0;
    for (int j = 0; j < m->nc; j++)
        if (x[j] < 0 || x[j] >= m->ext[j])
            return false;
    return true;
}

static bool in_domain(const w16_map_t *m, const int64_t *x)
{
    for (int j = 0; j < m->nc; j++)
        if (x[j] < 0 || x[j] >= m->ext[j])
            return false;
    return true;
}

static int64_t flat_of(const w16_bound_t *b, const int64_t *idx)
{
    int64_t flat = 0;
    for (int d = 0; d < b->ndim; d++)
        flat = flat * b->shape[d] + idx[d];
    return flat;
}

static int64_t lin_of(const w16_map_t *m, const int64_t *x)
{
    int64_t lin = 0;
    for (int i = 0; i < m->nc; i++)
        lin = lin * m->ext[i] + x[i];
    return lin;
}

wna16_status_t w16_map_fail_shape(const w16_bound_t *b, const w16_map_t *m,
                                  const int64_t *x, int d, int64_t at,
                                  wna16_error_t *err)
{
    char a[128];
    w16_map_fmt(a, sizeof a, m, x);
    if (m->sums)
        return w16_err(err, WNA16_ESPEC, "%s: %s.index[%d] (%s): the sum of "
                       "(%s) at index[%d] = %lld lies outside the shape "
                       "(%lld, 4 bytes a sum)", b->spec->origin, m->path, d,
                       b->where, a, d, (long long)at,
                       (long long)b->shape[d]);
    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): (%s) maps to index[%d] = "
                   "%lld outside the shape (%lld)", b->spec->origin, m->path,
                   b->where, a, d, (long long)at, (long long)b->shape[d]);
}

wna16_status_t w16_map_fail_bit(const w16_bound_t *b, const int64_t *x,
                                int64_t bit, wna16_error_t *err)
{
    char a[128];
    w16_map_fmt(a, sizeof a, &b->codes, x);
    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): (%s) maps to bit %lld, not "
                   "a %d-bit slot of a %s element", b->spec->origin,
                   b->codes.path, b->where, a, (long long)bit, b->cb,
                   wna16_dtype_name(b->dtype));
}

wna16_status_t w16_map_fail_claim(const w16_bound_t *b, const w16_map_t *m,
                                  int64_t flat, int64_t slot,
                                  const int64_t *x, wna16_error_t *err)
{
    if (m->sums)
        return w16_err(err, WNA16_ESPEC, "%s: %s.coord (%s): element %lld "
                       "reads (e=%lld, n=%lld, g=%lld), whose sum is not "
                       "stored there", b->spec->origin, m->path, b->where,
                       (long long)flat, (long long)x[0], (long long)x[1],
                       (long long)x[2]);
    char a[128];
    w16_map_fmt(a, sizeof a, m, x);
    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): the inverse map reads (%s) "
                   "at element %lld slot %lld, but (%s) is stored elsewhere",
                   b->spec->origin, m->path, b->where, a, (long long)flat,
                   (long long)slot, a);
}

wna16_status_t w16_map_fail_inverse(const w16_bound_t *b, const w16_map_t *m,
                                    int64_t *env, const int64_t *x,
                                    const int64_t *y, wna16_error_t *err)
{
    int64_t ix[W16_MAX_STORE_DIMS], iy[W16_MAX_STORE_DIMS], bx = 0, by = 0;
    wna16_error_t scratch = {0};
    bool same = false;
    if (w16_map_forward(b, m, env, x, ix, &bx, &scratch) != WNA16_OK)
        return w16_map_forward(b, m, env, x, ix, &bx, err);
    if (m->sums)
        return w16_map_fail_claim(b, m, flat_of(b, ix), 0, y, err);
    if (in_domain(m, y) &&
        w16_map_forward(b, m, env, y, iy, &by, &scratch) == WNA16_OK) {
        same = bx == by;
        for (int d = 0; d < b->ndim; d++)
            same = same && ix[d] == iy[d];
    }
    char a[128], c[128];
    w16_map_fmt(a, sizeof a, m, x);
    w16_map_fmt(c, sizeof c, m, y);
    if (same) {
        bool y_first = lin_of(m, y) < lin_of(m, x);
        return w16_err(err, WNA16_ESPEC, "%s: %s (%s): (%s) and (%s) map to "
                       "the same place", b->spec->origin, m->path, b->where,
                       y_first ? c : a, y_first ? a : c);
    }
    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): (%s) is stored where the "
                   "inverse map (coord) reads (%s)", b->spec->origin, m->path,
                   b->where, a, c);
}

wna16_status_t w16_map_fail_overlap(const w16_bound_t *b, const int64_t *x,
                                    wna16_error_t *err)
{
    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): the sum of n=%lld block "
                   "%lld overlaps other data", b->spec->origin, b->sums.path,
                   b->where, (long long)x[1], (long long)x[2]);
}

/* ---- the exhaustive walk -------------------------------------------------- */

static int64_t domain_size(const w16_map_t *m)
{
    int64_t t = 1;
    for (int i = 0; i < m->nc; i++)
        t *= m->ext[i];
    return t;
}

int64_t w16_bound_walk_cost(const w16_bound_t *b)
{
    int64_t places = b->elems * b->slots;
    int64_t cost = domain_size(&b->codes) + places;
    if (b->has_sums)
        cost += domain_size(&b->sums) + (b->sums.has_coord ? b->elems : 0);
    return cost;
}

static void unlin(const w16_map_t *m, int64_t lin, int64_t *x)
{
    for (int i = m->nc - 1; i >= 0; i--) {
        x[i] = lin % m->ext[i];
        lin /= m->ext[i];
    }
}

static void unflat(const w16_bound_t *b, int64_t flat, int64_t *idx)
{
    for (int d = b->ndim - 1; d >= 0; d--) {
        idx[d] = flat % b->shape[d];
        flat /= b->shape[d];
    }
}

/* Walks the block sums: each lies inside the shape and owns 4 bytes no
 * code and no other sum owns (owner[] marks them -1). */
static wna16_status_t walk_sums(const w16_bound_t *b, int64_t *owner,
                                int64_t *env, wna16_error_t *err)
{
    const w16_map_t *m = &b->sums;
    int64_t total = domain_size(m), x[3], idx[W16_MAX_STORE_DIMS], bit;
    for (int64_t lin = 0; lin < total; lin++) {
        unlin(m, lin, x);
        wna16_status_t st = w16_map_forward(b, m, env, x, idx, &bit, err);
        if (st != WNA16_OK)
            return st;
        for (int d = 0; d < b->ndim; d++)
            if (idx[d] < 0 || idx[d] >= b->shape[d] ||
                (d == b->ndim - 1 && idx[d] + 4 > b->shape[d]))
                return w16_map_fail_shape(b, m, x, d, idx[d], err);
        int64_t flat = flat_of(b, idx);
        for (int64_t byte = 0; byte < 4; byte++)
            for (int sl = 0; sl < b->slots; sl++) {
                int64_t place = (flat + byte) * b->slots + sl;
                if (owner[place])
                    return w16_map_fail_overlap(b, x, err);
                owner[place] = -1;
            }
    }
    return WNA16_OK;
}

/* sums.coord reads (e, n, g) exactly at the first byte of each sum and
 * n < 0 everywhere else. */
static wna16_status_t walk_sums_coord(const w16_bound_t *b, int64_t *env,
                                      wna16_error_t *err)
{
    const w16_map_t *m = &b->sums;
    int64_t found = 0, want = domain_size(m);
    int64_t idx[W16_MAX_STORE_DIMS], sc[3], at[W16_MAX_STORE_DIMS], bit;
    for (int64_t flat = 0; flat < b->elems; flat++) {
        unflat(b, flat, idx);
        wna16_status_t st = w16_map_inverse(b, m, env, idx, 0, sc, NULL,
                                            err);
        if (st != WNA16_OK)
            return st;
        if (sc[1] < 0)
            continue;
        found++;
        wna16_error_t scratch = {0};
        if (!in_domain(m, sc) ||
            w16_map_forward(b, m, env, sc, at, &bit, &scratch) != WNA16_OK ||
            flat_of(b, at) != flat)
            return w16_map_fail_claim(b, m, flat, 0, sc, err);
    }
    if (found != want)
        return w16_err(err, WNA16_ESPEC, "%s: %s.coord (%s): finds %lld sums "
                       "of %lld", b->spec->origin, m->path, b->where,
                       (long long)found, (long long)want);
    return WNA16_OK;
}

wna16_status_t w16_bound_walk(const w16_bound_t *b, w16_check_stats_t *stats,
                              wna16_error_t *err)
{
    const w16_map_t *m = &b->codes;
    int64_t places = b->elems * b->slots, total = domain_size(m);
    /* owner[place] = 1 + logical linear index, -1 for a block sum's byte */
    int64_t *owner = calloc((size_t)places + 1, sizeof *owner);
    if (!owner)
        return w16_err_nomem(err, "checking a layout");
    int64_t env[W16_VAR_COUNT];
    memcpy(env, b->vars, sizeof env);
    int64_t x[W16_MAX_COORDS] = {0}, back[W16_MAX_COORDS];
    int64_t idx[W16_MAX_STORE_DIMS], bit;
    wna16_status_t st = WNA16_OK;
    if (stats) {
        stats->evaluated += w16_bound_walk_cost(b);
        stats->exhaustive++;
    }
    for (int64_t lin = 0; lin < total && st == WNA16_OK; lin++) {
        unlin(m, lin, x);
        if ((st = w16_map_forward(b, m, env, x, idx, &bit, err)) != WNA16_OK)
            break;
        for (int d = 0; d < b->ndim && st == WNA16_OK; d++)
            if (idx[d] < 0 || idx[d] >= b->shape[d])
                st = w16_map_fail_shape(b, m, x, d, idx[d], err);
        if (st != WNA16_OK)
            break;
        if (bit < 0 || bit % b->cb != 0 || bit / b->cb >= b->slots) {
            st = w16_map_fail_bit(b, x, bit, err);
            break;
        }
        int64_t place = flat_of(b, idx) * b->slots + bit / b->cb;
        if (owner[place]) {
            int64_t prev[W16_MAX_COORDS];
            unlin(m, owner[place] - 1, prev);
            char a[128], c[128];
            w16_map_fmt(a, sizeof a, m, prev);
            w16_map_fmt(c, sizeof c, m, x);
            st = w16_err(err, WNA16_ESPEC, "%s: %s (%s): (%s) and (%s) map to "
                         "the same place", b->spec->origin, m->path, b->where,
                         a, c);
            break;
        }
        owner[place] = lin + 1;
        if ((st = w16_map_inverse(b, m, env, idx, bit / b->cb, back, x,
                                  err)) != WNA16_OK)
            break;
        for (int i = 0; i < m->nc; i++)
            if (back[i] != x[i]) {
                char a[128], c[128];
                w16_map_fmt(a, sizeof a, m, x);
                w16_map_fmt(c, sizeof c, m, back);
                st = w16_err(err, WNA16_ESPEC, "%s: %s (%s): (%s) is stored "
                             "where the inverse map (coord) reads (%s)",
                             b->spec->origin, m->path, b->where, a, c);
                break;
            }
    }
    if (st == WNA16_OK && b->has_sums)
        st = walk_sums(b, owner, env, err);
    /* Every place no code owns (a block sum's bytes too) reads as padding. */
    for (int64_t place = 0; st == WNA16_OK && place < places; place++) {
        if (owner[place] > 0)
            continue;
        int64_t flat = place / b->slots;
        unflat(b, flat, idx);
        st = w16_map_inverse(b, m, env, idx, place % b->slots, back, NULL,
                             err);
        if (st == WNA16_OK && in_domain(m, back))
            st = w16_map_fail_claim(b, m, flat, place % b->slots, back, err);
    }
    if (st == WNA16_OK && b->has_sums && b->sums.has_coord)
        st = walk_sums_coord(b, env, err);
    free(owner);
    return st;
}

/* ---- probes --------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

enum { AXIS_PICKS = 48 };

/* Values of one axis of width w that hit its boundaries: the ends, the
 * middle, and both sides of every power of two (tile edges). */
static int axis_picks(int64_t w, int64_t *out)
{
    int n = 0;
    int64_t c[AXIS_PICKS];
    int nc = 0;
    int64_t fixed[] = {0, 1, 2, 3, w - 1, w - 2, w - 3, w - 4, w / 2,
                       w / 2 - 1, w / 3};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        c[nc++] = fixed[i];
    for (int64_t p = 4; p < w && nc + 2 <= AXIS_PICKS; p *= 2) {
        c[nc++] = p - 1;
        c[nc++] = p;
    }
    for (int i = 0; i < nc; i++) {
        if (c[i] < 0 || c[i] >= w)
            continue;
        bool dup = false;
        for (int j = 0; j < n && !dup; j++)
            dup = out[j] == c[i];
        if (!dup)
            out[n++] = c[i];
    }
    return n;
}

static int64_t below(uint64_t *s, int64_t n)
{
    return n > 0 ? (int64_t)(splitmix(s) % (uint64_t)n) : 0;
}

/* Probes n logical elements of map m: in bounds, a whole slot (codes), and
 * read back by the inverse map where there is one. */
static wna16_status_t probe_elements(const w16_bound_t *b, const w16_map_t *m,
                                     int n, uint64_t *seed, int64_t *env,
                                     w16_check_stats_t *stats,
                                     wna16_error_t *err)
{
    int64_t picks[W16_MAX_COORDS][AXIS_PICKS];
    int np[W16_MAX_COORDS];
    for (int i = 0; i < m->nc; i++)
        np[i] = axis_picks(m->ext[i], picks[i]);
    int corners = 1 << m->nc;
    for (int p = 0; p < n; p++) {
        int64_t x[W16_MAX_COORDS], idx[W16_MAX_STORE_DIMS], bit,
            back[W16_MAX_COORDS];
        for (int i = 0; i < m->nc; i++) {
            if (p < corners) /* every combination of the ends first */
                x[i] = (p >> i) & 1 ? m->ext[i] - 1 : 0;
            else if (p % 2)
                x[i] = picks[i][below(seed, np[i])];
            else
                x[i] = below(seed, m->ext[i]);
        }
        wna16_status_t st = w16_map_forward(b, m, env, x, idx, &bit, err);
        if (st != WNA16_OK)
            return st;
        for (int d = 0; d < b->ndim; d++)
            if (idx[d] < 0 || idx[d] >= b->shape[d] ||
                (m->sums && d == b->ndim - 1 && idx[d] + 4 > b->shape[d]))
                return w16_map_fail_shape(b, m, x, d, idx[d], err);
        if (!m->sums && (bit < 0 || bit % b->cb != 0 ||
                         bit / b->cb >= b->slots))
            return w16_map_fail_bit(b, x, bit, err);
        if (stats)
            stats->evaluated++;
        if (!m->has_coord)
            continue;
        st = w16_map_inverse(b, m, env, idx, m->sums ? 0 : bit / b->cb, back,
                             x, err);
        if (st != WNA16_OK)
            return st;
        for (int j = 0; j < m->nc; j++)
            if (back[j] != x[j])
                return w16_map_fail_inverse(b, m, env, x, back, err);
    }
    return WNA16_OK;
}

/* Probes n places: where the inverse map claims an element, that element's
 * forward map must come back to the place. */
static wna16_status_t probe_places(const w16_bound_t *b, const w16_map_t *m,
                                   int n, uint64_t *seed, int64_t *env,
                                   w16_check_stats_t *stats,
                                   wna16_error_t *err)
{
    int slots = m->sums ? 1 : b->slots;
    for (int p = 0; p < n; p++) {
        int64_t flat = p == 0 ? 0 : p == 1 ? b->elems - 1
                                           : below(seed, b->elems);
        int64_t slot = below(seed, slots), idx[W16_MAX_STORE_DIMS],
                x[W16_MAX_COORDS], at[W16_MAX_STORE_DIMS], bit;
        unflat(b, flat, idx);
        wna16_status_t st = w16_map_inverse(b, m, env, idx, slot, x, NULL,
                                            err);
        if (st != WNA16_OK)
            return st;
        if (stats)
            stats->evaluated++;
        if (!w16_map_inside(m, x))
            continue;
        wna16_error_t scratch = {0};
        bool ok = in_domain(m, x) &&
                  w16_map_forward(b, m, env, x, at, &bit, &scratch) ==
                      WNA16_OK &&
                  flat_of(b, at) == flat &&
                  (m->sums ? bit == 0 : bit == slot * b->cb);
        for (int d = 0; ok && d < b->ndim; d++)
            ok = at[d] == idx[d];
        if (!ok)
            return w16_map_fail_claim(b, m, flat, slot, x, err);
    }
    return WNA16_OK;
}

wna16_status_t w16_bound_probe(const w16_bound_t *b, int n, uint64_t seed,
                               w16_check_stats_t *stats, wna16_error_t *err)
{
    int64_t env[W16_VAR_COUNT];
    memcpy(env, b->vars, sizeof env);
    uint64_t s = seed;
    wna16_status_t st = probe_elements(b, &b->codes, n, &s, env, stats, err);
    if (st == WNA16_OK)
        st = probe_places(b, &b->codes, n, &s, env, stats, err);
    if (st != WNA16_OK || !b->has_sums)
        return st;
    st = probe_elements(b, &b->sums, n, &s, env, stats, err);
    if (st == WNA16_OK && b->sums.has_coord)
        st = probe_places(b, &b->sums, n, &s, env, stats, err);
    /* a probed sum's bytes hold no code */
    const w16_map_t *m = &b->sums;
    for (int p = 0; st == WNA16_OK && p < n / 4; p++) {
        int64_t x[3], idx[W16_MAX_STORE_DIMS], bit, back[W16_MAX_COORDS];
        for (int i = 0; i < 3; i++)
            x[i] = below(&s, m->ext[i]);
        if ((st = w16_map_forward(b, m, env, x, idx, &bit, err)) != WNA16_OK)
            break;
        for (int byte = 0; byte < 4 && st == WNA16_OK; byte++)
            for (int sl = 0; sl < b->slots && st == WNA16_OK; sl++) {
                int64_t at[W16_MAX_STORE_DIMS];
                memcpy(at, idx, sizeof at);
                at[b->ndim - 1] += byte;
                st = w16_map_inverse(b, &b->codes, env, at, sl, back, NULL,
                                     err);
                if (st == WNA16_OK && in_domain(&b->codes, back))
                    st = w16_map_fail_overlap(b, x, err);
            }
    }
    return st;
}
