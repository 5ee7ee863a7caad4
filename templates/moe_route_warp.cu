// moe_route_warp.cu - the routing of at most 32 routed slots by one warp
// (lane = slot), in one place for the two kernels that compute it:
// w16_route_small's decode path (moe_aux.cu), which writes the padded
// order for every row block, and the mma.sync GEMMs (moe_marlin_gemm.cu)
// when the host lets each CTA route its own row block from the top-k ids
// (no routing launch before GEMM 1). Both call this text, so both give
// the same order: experts ascending, each expert's slots in slot order,
// each expert padded to whole blocks of bm rows; and the one reading of a
// slot's expert from the ids (slot_expert). It comes after moe_pdl.cu in
// the routing units and after moe_quant.cu in the GEMM units (ERR_ID from
// either prelude).

namespace w16 {

// Lane `lane`'s slot, of local expert e (-1: no slot, or not routed here),
// in the padded order. peers: the lanes of e's slots; start: where e's
// group begins; padded: the group's padded size in its leader lane (the
// lowest of peers), else 0; pos: the slot's padded position (start plus
// its rank among e's slots); ord: the group's place in expert order;
// used: the padded order's length (num_post); groups: the experts with
// slots. Every lane of the warp must call it.
struct warp_route {
    unsigned peers;
    int start, padded, pos, ord, used, groups;
};

__device__ __forceinline__ warp_route route_warp(int e, int bm)
{
    const int lane = threadIdx.x % 32;
    const unsigned lt = (1u << lane) - 1u;
    warp_route r;
    r.peers = __match_any_sync(0xffffffffu, e);
    const bool lead = e >= 0 && (r.peers & lt) == 0u;
    r.padded = lead ? (__popc(r.peers) + bm - 1) / bm * bm : 0;
    // start of e's group: the padded sizes of the smaller experts, over
    // the groups' leaders only (a decode step has a few groups: a
    // shuffle pair each, not one for every lane)
    unsigned leaders = __ballot_sync(0xffffffffu, lead);
    r.groups = __popc(leaders);
    r.start = 0;
    r.ord = 0;
    r.used = 0;
    while (leaders) {
        const int j = __ffs(leaders) - 1;
        leaders &= leaders - 1u;
        const int pj = __shfl_sync(0xffffffffu, r.padded, j);
        const int ej = __shfl_sync(0xffffffffu, e, j);
        r.used += pj;
        if (ej < e) {
            r.start += pj;
            r.ord++;
        }
    }
    r.pos = r.start + __popc(r.peers & lt);
    return r;
}

// The local expert of slot t (standard format), or -1: absent from this
// rank (expert_map gives -1) or a bad id, recorded as the smallest bad
// slot in err[ERR_ID] (atomicMin: deterministic) where `record` (the
// routing kernels always; of the GEMMs' own routing, GEMM 1's first warp
// of its first CTA). The routing kernels (moe_aux.cu) and the GEMMs' own
// routing read the ids through this one function.
__device__ __forceinline__ int slot_expert(const int *ids, int t,
                                           const int *expert_map, int n_ids,
                                           int *err, bool record = true)
{
    const int id = ids[t];
    if (id < 0 || id >= n_ids) {
        if (record)
            atomicMin(err + w16cfg::ERR_ID, t);
        return -1;
    }
    return expert_map ? expert_map[id] : id;
}

} // namespace w16
