/*
 * spec_check.c - proves a spec's layouts consistent on its sample problems.
 *
 * For every layout and both GEMM operands of a sample: every logical
 * element maps (forward) inside the stored shape, at a bit offset that is a
 * whole code slot; no two elements share a place; the inverse map sends the
 * place back to the element; and every place nothing maps to is reported by
 * the inverse map as outside the logical domain (padding). A layout written
 * only as JSON is therefore known to be a bijection before anything uses it.
 */
#include "spec/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CHECK_MAX_PLACES = 1 << 24 };

static const char *gemm_name(wna16_gemm_t g) { return g == WNA16_GEMM_W13 ? "w13" : "w2"; }

static void fmt_coord(char *out, size_t n, const w16_layout_t *l,
                      const int64_t *c)
{
    w16_var_t v[W16_MAX_COORDS];
    int k = w16_role_coords(l->role, v);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < k && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s%s=%lld",
                                 i ? ", " : "", w16_var_name(v[i]),
                                 (long long)c[i]);
}

static wna16_status_t check_layout(const wna16_spec_t *spec,
                                   const w16_layout_t *l, int64_t *vars,
                                   const char *where, wna16_error_t *err)
{
    int64_t shape[W16_MAX_STORE_DIMS];
    wna16_status_t st = w16_layout_shape(l, vars, shape, err);
    if (st != WNA16_OK)
        return st;
    wna16_dtype_t dt = l->dtypes[0];
    int eb = (int)wna16_dtype_size(dt) * 8;
    int cb = w16_layout_code_bits(l, dt, vars);
    if (cb <= 0)
        return w16_err(err, WNA16_ESPEC, "%s (%s): code_bits does not evaluate "
                       "to a width in [1, 64]", l->json_path, where);
    if (eb % cb != 0)
        return w16_err(err, WNA16_ESPEC, "%s (%s): %d-bit codes do not fill "
                       "%s elements", l->json_path, where, cb,
                       wna16_dtype_name(dt));
    int slots = eb / cb;
    int64_t elems = 1;
    for (int d = 0; d < l->ndim; d++)
        if (shape[d] == 0)
            return WNA16_OK; /* an empty tensor (e.g. (E, 0) g_idx) holds nothing */
    for (int d = 0; d < l->ndim; d++) {
        if (shape[d] && elems > CHECK_MAX_PLACES / shape[d])
            return w16_err(err, WNA16_ESPEC, "%s (%s): sample too large to "
                           "check", l->json_path, where);
        elems *= shape[d];
    }
    if (elems * slots > CHECK_MAX_PLACES)
        return w16_err(err, WNA16_ESPEC, "%s (%s): sample too large to check "
                       "(%lld places)", l->json_path, where,
                       (long long)(elems * slots));
    int64_t ext[W16_MAX_COORDS] = {0};
    int nc = w16_role_extent(l->role, vars, ext);
    if (!spec->stacked)
        ext[0] = 1;
    int64_t total = 1;
    for (int i = 0; i < nc; i++)
        total *= ext[i];
    if (total > elems * slots)
        return w16_err(err, WNA16_ESPEC, "%s (%s): %lld logical values do not "
                       "fit in %lld places", l->json_path, where,
                       (long long)total, (long long)(elems * slots));
    /* owner[place] = 1 + logical linear index */
    int64_t *owner = calloc((size_t)(elems * slots) + 1, sizeof *owner);
    if (!owner)
        return w16_err_nomem(err, "checking a layout");
    int64_t c[W16_MAX_COORDS] = {0}, back[W16_MAX_COORDS];
    int64_t idx[W16_MAX_STORE_DIMS], bit;
    char a[128], b[128];
    w16_eval_error_t e;
    st = WNA16_OK;
    for (int64_t lin = 0; lin < total && st == WNA16_OK; lin++) {
        int64_t r = lin;
        for (int i = nc - 1; i >= 0; i--) {
            c[i] = r % ext[i];
            r /= ext[i];
        }
        fmt_coord(a, sizeof a, l, c);
        if (!w16_layout_locate(l, vars, c, idx, &bit, &e)) {
            st = w16_err(err, WNA16_ESPEC, "%s (%s): forward map of (%s): %s",
                         l->json_path, where, a, e.what);
            break;
        }
        int64_t flat = 0;
        for (int d = 0; d < l->ndim; d++) {
            if (idx[d] < 0 || idx[d] >= shape[d]) {
                st = w16_err(err, WNA16_ESPEC, "%s (%s): (%s) maps to index[%d] "
                             "= %lld outside the shape (%lld)", l->json_path,
                             where, a, d, (long long)idx[d],
                             (long long)shape[d]);
                break;
            }
            flat = flat * shape[d] + idx[d];
        }
        if (st != WNA16_OK)
            break;
        if (bit < 0 || bit % cb != 0 || bit / cb >= slots) {
            st = w16_err(err, WNA16_ESPEC, "%s (%s): (%s) maps to bit %lld, not "
                         "a %d-bit slot of a %s element", l->json_path, where,
                         a, (long long)bit, cb, wna16_dtype_name(dt));
            break;
        }
        int64_t place = flat * slots + bit / cb;
        if (owner[place]) {
            int64_t o = owner[place] - 1, oc[W16_MAX_COORDS];
            for (int i = nc - 1; i >= 0; i--) {
                oc[i] = o % ext[i];
                o /= ext[i];
            }
            fmt_coord(b, sizeof b, l, oc);
            st = w16_err(err, WNA16_ESPEC, "%s (%s): (%s) and (%s) map to the "
                         "same place", l->json_path, where, b, a);
            break;
        }
        owner[place] = lin + 1;
        if (!w16_layout_coord(l, vars, idx, bit / cb, back, &e)) {
            st = w16_err(err, WNA16_ESPEC, "%s (%s): inverse map at the place of "
                         "(%s): %s", l->json_path, where, a, e.what);
            break;
        }
        for (int i = 0; i < nc; i++) {
            if (back[i] != c[i]) {
                fmt_coord(b, sizeof b, l, back);
                st = w16_err(err, WNA16_ESPEC, "%s (%s): (%s) is stored where "
                             "the inverse map (coord) reads (%s)", l->json_path,
                             where, a, b);
                break;
            }
        }
    }
    /* Block sums own 4 bytes each (CPU VNNI compensation). */
    if (st == WNA16_OK && l->sums_block_k) {
        int64_t bk = 0;
        if (!w16_expr_eval(l->sums_block_k, vars, &bk, &e) || bk <= 0 ||
            vars[W16_VAR_K] % bk != 0)
            st = w16_err(err, WNA16_ESPEC, "%s.sums.block_k (%s): %s",
                         l->json_path, where, e.what ? e.what
                                                     : "must divide K");
        int64_t E = spec->stacked ? vars[W16_VAR_E] : 1;
        for (int64_t ee = 0; st == WNA16_OK && ee < E; ee++)
            for (int64_t nn = 0; st == WNA16_OK && nn < vars[W16_VAR_N]; nn++)
                for (int64_t kb = 0; st == WNA16_OK && kb < vars[W16_VAR_K] / bk;
                     kb++) {
                    vars[W16_VAR_e] = ee;
                    vars[W16_VAR_n] = nn;
                    vars[W16_VAR_g] = kb;
                    int64_t flat = 0;
                    for (int d = 0; d < l->ndim && st == WNA16_OK; d++) {
                        if (!w16_expr_eval(l->sums_index[d], vars, &idx[d], &e))
                            st = w16_err(err, WNA16_ESPEC, "%s.sums.index[%d] "
                                         "(%s): %s", l->json_path, d, where,
                                         e.what);
                        else if (idx[d] < 0 || idx[d] >= shape[d] ||
                                 (d == l->ndim - 1 && idx[d] + 4 > shape[d]))
                            st = w16_err(err, WNA16_ESPEC, "%s.sums.index[%d] "
                                         "(%s): outside the shape", l->json_path,
                                         d, where);
                        flat = flat * shape[d] + idx[d];
                    }
                    for (int64_t byte = 0; st == WNA16_OK && byte < 4; byte++)
                        for (int sl = 0; sl < slots; sl++) {
                            int64_t place = (flat + byte) * slots + sl;
                            if (owner[place]) {
                                st = w16_err(err, WNA16_ESPEC, "%s.sums (%s): "
                                             "the sum of n=%lld block %lld "
                                             "overlaps other data",
                                             l->json_path, where,
                                             (long long)nn, (long long)kb);
                                break;
                            }
                            owner[place] = -1;
                        }
                }
    }
    /* Places nothing maps to must decode to padding. */
    for (int64_t place = 0; st == WNA16_OK && place < elems * slots; place++) {
        if (owner[place])
            continue;
        int64_t flat = place / slots, rem = flat;
        for (int d = l->ndim - 1; d >= 0; d--) {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        if (!w16_layout_coord(l, vars, idx, place % slots, back, &e)) {
            st = w16_err(err, WNA16_ESPEC, "%s (%s): inverse map of a padding "
                         "place: %s", l->json_path, where, e.what);
            break;
        }
        bool inside = true;
        for (int i = 0; i < nc; i++)
            inside = inside && back[i] >= 0 && back[i] < ext[i];
        if (inside) {
            fmt_coord(b, sizeof b, l, back);
            st = w16_err(err, WNA16_ESPEC, "%s (%s): the inverse map reads (%s) "
                         "at element %lld slot %lld, but (%s) is stored "
                         "elsewhere", l->json_path, where, b, (long long)flat,
                         (long long)(place % slots), b);
        }
    }
    /* The sums' inverse map, where given: exactly the first byte of each
     * sum reads back that sum's (e, n, g). */
    if (st == WNA16_OK && l->sums_coord[0]) {
        int64_t bk = 0, found = 0;
        w16_expr_eval(l->sums_block_k, vars, &bk, &e); /* checked above */
        int64_t want = (spec->stacked ? vars[W16_VAR_E] : 1) * vars[W16_VAR_N] *
                       (vars[W16_VAR_K] / bk);
        for (int64_t flat = 0; st == WNA16_OK && flat < elems; flat++) {
            int64_t rem = flat, sc[3];
            for (int d = l->ndim - 1; d >= 0; d--) {
                idx[d] = rem % shape[d];
                rem /= shape[d];
                vars[W16_VAR_i0 + d] = idx[d];
            }
            for (int i = 0; i < 3 && st == WNA16_OK; i++)
                if (!w16_expr_eval(l->sums_coord[i], vars, &sc[i], &e))
                    st = w16_err(err, WNA16_ESPEC, "%s.sums.coord (%s): %s",
                                 l->json_path, where, e.what);
            if (st != WNA16_OK || sc[1] < 0)
                continue;
            found++;
            vars[W16_VAR_e] = sc[0];
            vars[W16_VAR_n] = sc[1];
            vars[W16_VAR_g] = sc[2];
            int64_t at = 0, ix;
            for (int d = 0; d < l->ndim && st == WNA16_OK; d++) {
                if (!w16_expr_eval(l->sums_index[d], vars, &ix, &e))
                    st = w16_err(err, WNA16_ESPEC, "%s.sums.index[%d] (%s): %s",
                                 l->json_path, d, where, e.what);
                at = at * shape[d] + ix;
            }
            if (st == WNA16_OK &&
                (sc[0] < 0 || sc[1] >= vars[W16_VAR_N] || sc[2] < 0 ||
                 sc[2] >= vars[W16_VAR_K] / bk || at != flat ||
                 (!spec->stacked && sc[0] != 0) ||
                 (spec->stacked && sc[0] >= vars[W16_VAR_E])))
                st = w16_err(err, WNA16_ESPEC, "%s.sums.coord (%s): element "
                             "%lld reads (e=%lld, n=%lld, g=%lld), whose sum "
                             "is not stored there", l->json_path, where,
                             (long long)flat, (long long)sc[0],
                             (long long)sc[1], (long long)sc[2]);
        }
        if (st == WNA16_OK && found != want)
            st = w16_err(err, WNA16_ESPEC, "%s.sums.coord (%s): finds %lld "
                         "sums of %lld", l->json_path, where, (long long)found,
                         (long long)want);
    }
    free(owner);
    return st;
}

/* Value transforms must be inverse: decode(encode(c)) = c for every code
 * c (and every zero point z when they read it), after the masking to the
 * stored width. */
static wna16_status_t check_transform(const wna16_spec_t *spec,
                                      const w16_layout_t *l, int64_t *vars,
                                      const char *where, wna16_error_t *err)
{
    if (!l->encode)
        return WNA16_OK;
    int cb = w16_layout_code_bits(l, l->dtypes[0], vars);
    int64_t top = (INT64_C(1) << vars[W16_VAR_BITS]) - 1;
    int64_t mask = cb >= 63 ? INT64_MAX : (INT64_C(1) << cb) - 1;
    bool uses_z = w16_expr_uses(l->encode, W16_VAR_z) ||
                  w16_expr_uses(l->decode, W16_VAR_z);
    for (int64_t z = 0; z <= (uses_z ? top : 0); z++)
        for (int64_t c = 0; c <= top; c++) {
            int64_t stored, back;
            w16_eval_error_t e;
            vars[W16_VAR_z] = z;
            vars[W16_VAR_c] = c;
            bool ok = w16_expr_eval(l->encode, vars, &stored, &e);
            vars[W16_VAR_c] = stored & mask;
            ok = ok && w16_expr_eval(l->decode, vars, &back, &e);
            if (!ok)
                return w16_err(err, WNA16_ESPEC, "%s: %s (%s): value transform "
                               "of c=%lld: %s", spec->origin, l->json_path,
                               where, (long long)c, e.what);
            if (back != c)
                return w16_err(err, WNA16_ESPEC, "%s: %s (%s): decode(encode"
                               "(%lld)) = %lld (z = %lld): the value "
                               "transforms are not inverse", spec->origin,
                               l->json_path, where, (long long)c,
                               (long long)back, (long long)z);
        }
    return WNA16_OK;
}

wna16_status_t w16_spec_check_layouts(const wna16_spec_t *spec, bool full,
                                      wna16_error_t *err)
{
    int n = full ? spec->n_samples : (spec->n_samples > 0 ? 1 : 0);
    for (int s = 0; s < n; s++) {
        const struct w16_sample *sm = &spec->samples[s];
        w16_problem_t p = {sm->E, sm->H, sm->I, sm->BITS, sm->GS, sm->ZP != 0,
                           sm->ACT_ORDER != 0, sm->HAS_BIAS != 0,
                           sm->ZEROS_STORED != 0, sm->G_IDX_STORED != 0,
                           (int)sm->A8};
        for (int g = 0; g < 2; g++) {
            int64_t vars[W16_VAR_COUNT];
            wna16_status_t st = w16_spec_bind(spec, &p, (wna16_gemm_t)g, vars,
                                              err);
            if (st != WNA16_OK) {
                w16_err_prefix(err, "%s: $.samples[%d]", spec->origin, s);
                return st == WNA16_ESPEC ? st : WNA16_ESPEC;
            }
            char where[96];
            snprintf(where, sizeof where, "sample %d, %s", s,
                     gemm_name((wna16_gemm_t)g));
            for (int r = 0; r < spec->caps.n_shape_rules; r++) {
                const w16_rule_t *rule = &spec->caps.shape_rules[r];
                int64_t hit = 0;
                w16_eval_error_t e;
                if (!w16_expr_eval(rule->cond, vars, &hit, &e))
                    return w16_err(err, WNA16_ESPEC, "%s: %s (%s): %s",
                                   spec->origin, rule->json_path, where, e.what);
                if (hit)
                    return w16_err(err, WNA16_ESPEC, "%s: $.samples[%d] breaks "
                                   "the spec's own rule %s (%s)", spec->origin,
                                   s, rule->json_path, rule->reason);
            }
            for (int r = 0; r < W16_ROLE_COUNT; r++) {
                const w16_layout_t *l = spec->layouts[r];
                int64_t present = 1;
                w16_eval_error_t e;
                if (l && l->when && !w16_expr_eval(l->when, vars, &present, &e))
                    return w16_err(err, WNA16_ESPEC, "%s: %s.when (%s): %s",
                                   spec->origin, l->json_path, where, e.what);
                if (!l || !present)
                    continue;
                st = check_layout(spec, l, vars, where, err);
                if (st != WNA16_OK) {
                    w16_err_prefix(err, "%s", spec->origin);
                    return st;
                }
                if ((st = check_transform(spec, l, vars, where, err)) !=
                    WNA16_OK)
                    return st;
            }
            /* the scale transforms evaluate, and input_global_scale exists
             * exactly where the scales are int16 codes */
            w16_scale_xform_t x;
            if ((st = w16_scale_xform(spec, vars, &x, err)) != WNA16_OK)
                return st;
        }
    }
    return WNA16_OK;
}
