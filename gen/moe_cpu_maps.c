/*
 * moe_cpu_maps.c - what the dedicated CPU generator's two kernel shapes
 * (moe_cpu.c's VNNI blocks, moe_cpu_cols.c's K-contiguous columns) ask of
 * a layout's maps when they probe it: an element's flat offset and bit,
 * a role's storage dtype, the experts a probe walks (moe_cpu_priv.h). One
 * file below both, so neither calls into the other for them.
 */
#include "gen/moe_cpu_priv.h"

#include <string.h>

/* The flat element offset and bit of role r's element at (e, n, k, g). */
bool w16_moe_cpu_locate(const w16_layout_t *l, const int64_t *v,
                        const int64_t *shape, int64_t e, int64_t n, int64_t k,
                        int64_t g, int64_t *flat, int64_t *bit)
{
    int64_t vars[W16_VAR_COUNT], coord[W16_MAX_COORDS], ix[W16_MAX_STORE_DIMS];
    memcpy(vars, v, sizeof vars);
    w16_var_t cv[W16_MAX_COORDS];
    int nc = w16_role_coords(l->role, cv);
    for (int i = 0; i < nc; i++)
        coord[i] = cv[i] == W16_VAR_e ? e : cv[i] == W16_VAR_n ? n
                 : cv[i] == W16_VAR_k ? k : g;
    w16_eval_error_t ee = {0};
    int64_t b = 0;
    if (!w16_layout_locate(l, vars, coord, ix, &b, &ee))
        return false;
    int64_t f = 0;
    for (int d = 0; d < l->ndim; d++) {
        if (ix[d] < 0 || ix[d] >= shape[d])
            return false;
        f = f * shape[d] + ix[d];
    }
    *flat = f;
    if (bit)
        *bit = b;
    return true;
}

wna16_dtype_t w16_moe_cpu_dtype_of(const w16_moe_request_t *req, int g,
                                   w16_role_t r)
{
    const w16_layout_t *l = req->backend->layouts[r];
    return req->dtype[g][r] ? req->dtype[g][r] : l->dtypes[0];
}

/* The e values a probe walks: the first and the last (the strides come
 * from the first two). */
int w16_moe_cpu_probe_experts(int64_t E, int64_t *out)
{
    out[0] = 0;
    out[1] = E - 1;
    return E > 1 ? 2 : 1;
}
