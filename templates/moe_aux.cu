// moe_aux.cu - the small kernels around the fused-MoE GEMMs: routing
// (sort and align the routed slots per expert, deterministically), the row
// gather that applies act-order permutations and router weights on the
// input, the finalize step (top-k weighted sum, or the batched output),
// and the check of act-order tensors. The prelude (gen/moe_cuda.c) defines
// namespace w16cfg { ACT_BF16, CHUNK, ROUTE_THREADS, SCAN_THREADS, ERR_* },
// the constants the host launches with, and W16_WANT_<kernel> for each
// kernel of the unit: the runtime compiles these kernels in a few units
// (gen/moe_cuda.h, W16_AUX_PIECE_*) so that no unit costs NVRTC more than
// about half a second and a layer compiles only the ones it launches.
//
// Routing, standard format. P = M * topk slots, slot t = m * topk + j.
//   count   one CTA per chunk of CHUNK slots: a histogram of the chunk's
//           experts in shared memory (integer atomics: the counts do not
//           depend on the order of the additions), stored as hist[c][e];
//   scan    one CTA: for every expert its offset inside each chunk (the
//           exclusive sum of hist over earlier chunks), its total, the
//           total padded to BM, and the exclusive scan of the padded sizes
//           over experts: start[e], start[E] = num_post;
//   fill    one thread per position of the padded order: the expert of
//           each block (expert_ids), padding slots (the sentinel P);
//   scatter one CTA per chunk: slot t goes to start[e] + (its chunk's
//           offset for e) + (its rank among earlier slots of the chunk
//           routed to e). The rank comes from __match_any_sync one warp
//           at a time, so slots keep their order inside an expert, which
//           is wna16_moe_align's order (a stable counting sort).
// Batched format: scan takes the per-expert counts directly and fill also
// writes the rows e * max_tokens + r.
// Small batches (P <= CHUNK, one chunk: M <= 128 at top-8): route_small
// does all four in one CTA and one launch, with the same results; at small
// M the chain of dependent launches, not the bytes, sets the layer's time.
//
// Bad input found on the device (a top-k id out of range, a batched count
// out of [0, max_tokens], act-order tensors that are not what the layout
// promises) is recorded in err[] as the smallest offending index (atomicMin
// on int: deterministic) and reported by the host after it synchronizes;
// offending slots are dropped, never read out of bounds.

namespace w16 {

using namespace w16cfg;

// err[] slots: ERR_ID the first slot whose top-k id is out of range,
// ERR_COUNT the first expert whose batched count is bad, ERR_GIDX the
// first e * K + k whose g_idx is not a group, ERR_PERM the first one where
// the sort indices are not a permutation.
static_assert(CHUNK % ROUTE_THREADS == 0 && ROUTE_THREADS % 32 == 0, "chunks");
// (distinct slots; also a use of each in every unit, whichever of the
// kernels it holds)
static_assert(ERR_ID != ERR_COUNT && ERR_ID != ERR_GIDX && ERR_ID != ERR_PERM &&
                  ERR_COUNT != ERR_GIDX && ERR_COUNT != ERR_PERM &&
                  ERR_GIDX != ERR_PERM, "err slots");

// The activation element: 16 bits of fp16 or bf16, moved as they are and
// converted with the single PTX instruction cuda_fp16.h / cuda_bf16.h use
// for these conversions on sm_80 and later (bf16 to float: a shift into
// the high half before sm_90): the CUBIN is the same bytes as with those
// headers, and NVRTC no longer parses them, about 11 ms of every compile
// of these kernels (an empty kernel: 22 ms, 33 ms with the two headers,
// NVRTC 13.0). The rounding float -> bf16 in one
// instruction needs sm_80, as the GEMMs do.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the fused MoE's kernels need sm_80 or later"
#endif
struct alignas(2) f16_bits { unsigned short x; };
struct alignas(2) bf16_bits { unsigned short x; };

template <bool BF16> struct elem;
template <> struct elem<false> {
    typedef f16_bits t;
    static __device__ __forceinline__ float to_f(t v)
    {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
        return f;
    }
    static __device__ __forceinline__ t from_f(float v)
    {
        t h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(v));
        return h;
    }
};
template <> struct elem<true> {
    typedef bf16_bits t;
    static __device__ __forceinline__ float to_f(t v)
    {
        float f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(v.x));
#else
        asm("mov.b32 %0, {0, %1};" : "=f"(f) : "h"(v.x));
#endif
        return f;
    }
    static __device__ __forceinline__ t from_f(float v)
    {
        t h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.x) : "f"(v));
        return h;
    }
};
typedef elem<ACT_BF16> act;
typedef act::t act_t;

__device__ __forceinline__ float round_act(float v)
{
    return act::to_f(act::from_f(v));
}

// (slot_expert, a slot's local expert: moe_route_warp.cu)

} // namespace w16

using namespace w16;

#ifdef W16_WANT_w16_route_count
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
w16_route_count(const int *__restrict__ ids, int P,
                const int *__restrict__ expert_map, int n_ids, int E,
                int *__restrict__ hist, int *__restrict__ err)
{
    extern __shared__ int s_hist[];
    for (int e = threadIdx.x; e < E; e += ROUTE_THREADS)
        s_hist[e] = 0;
    w16_pdl_enter(); // ids may come from the previous kernel
    __syncthreads();
    int c0 = blockIdx.x * CHUNK;
    for (int i = threadIdx.x; i < CHUNK && c0 + i < P; i += ROUTE_THREADS) {
        int e = slot_expert(ids, c0 + i, expert_map, n_ids, err);
        if (e >= 0)
            atomicAdd(&s_hist[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += ROUTE_THREADS)
        hist[(size_t)blockIdx.x * E + e] = s_hist[e];
}
#endif

// The exclusive scan of the experts' sizes rounded up to BM, in expert
// order, by one CTA of SCAN_THREADS threads: thread i owns experts
// e0 .. e0 + per - 1 whose padded sizes add up to `mine`; an inclusive
// scan of those sums (Hillis-Steele, in order) gives each its first slot.
// start[e] for e < E, and start[E] = *num_post = the padded total.
__device__ __forceinline__ void scan_padded(const int *size, int E, int BM,
                                            int e0, int per, int mine,
                                            int *start, int *num_post,
                                            int *s_part)
{
    s_part[threadIdx.x] = mine;
    __syncthreads();
    for (int d = 1; d < SCAN_THREADS; d *= 2) {
        int v = threadIdx.x >= d ? s_part[threadIdx.x - d] : 0;
        __syncthreads();
        s_part[threadIdx.x] += v;
        __syncthreads();
    }
    int run = s_part[threadIdx.x] - mine;
    for (int e = e0; e < e0 + per && e < E; e++) {
        start[e] = run;
        run += (size[e] + BM - 1) / BM * BM;
    }
    if (threadIdx.x == SCAN_THREADS - 1) {
        start[E] = s_part[SCAN_THREADS - 1];
        *num_post = s_part[SCAN_THREADS - 1];
    }
}

// One CTA. Standard: hist [C][E] -> hist_off [C][E] (exclusive over c) and
// total[e]. Batched (counts != NULL): total[e] = counts[e], checked.
// Then start[e] = exclusive scan of round_up(total, BM); start[E] is the
// number of slots after padding (also written to *num_post).
#ifdef W16_WANT_w16_route_scan
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
w16_route_scan(const int *__restrict__ hist, int C,
               const int *__restrict__ counts, int max_tokens, int E, int BM,
               int *__restrict__ hist_off, int *__restrict__ total,
               int *__restrict__ start, int *__restrict__ num_post,
               int *__restrict__ err)
{
    __shared__ int s_part[SCAN_THREADS];
    w16_pdl_enter(); // route_count wrote hist
    const int per = (E + SCAN_THREADS - 1) / SCAN_THREADS;
    const int e0 = threadIdx.x * per;
    int mine = 0; // padded sizes of this thread's experts
    for (int e = e0; e < e0 + per && e < E; e++) {
        int n;
        if (counts) {
            n = counts[e];
            if (n < 0 || n > max_tokens) {
                atomicMin(err + ERR_COUNT, e);
                n = 0;
            }
        } else {
            n = 0;
            for (int c = 0; c < C; c++) {
                hist_off[(size_t)c * E + e] = n;
                n += hist[(size_t)c * E + e];
            }
        }
        total[e] = n;
        mine += (n + BM - 1) / BM * BM;
    }
    scan_padded(total, E, BM, e0, per, mine, start, num_post, s_part);
}
#endif

// The fill of padded position p < cap (route_fill, route_small), from n
// groups of slots in expert order (every expert: exp null, group g is
// expert g; route_small's decode path: only those with slots, exp[g])
// starting at start[] with cnt[] slots each, start[n] = used: the block's
// expert at a block's first position (-1 past `used`), the sentinel past
// a group's slots and past `used`, and in the batched format the row
// e * max_tokens + r of the group's r-th slot (the standard format's
// slots come from the scatter).
__device__ __forceinline__ void route_fill_at(int p, const int *start,
                                              const int *cnt, const int *exp,
                                              int n, int BM, int sentinel,
                                              int batched, int max_tokens,
                                              int *__restrict__ sorted_ids,
                                              int *__restrict__ expert_ids)
{
    if (p >= start[n]) {
        sorted_ids[p] = sentinel;
        if (p % BM == 0)
            expert_ids[p / BM] = -1;
        return;
    }
    // the last group whose run starts at or before p (empty runs are
    // skipped because the next group starts at the same place)
    int g = 0, hi = n - 1;
    while (g < hi) {
        int mid = (g + hi + 1) / 2;
        if (start[mid] <= p)
            g = mid;
        else
            hi = mid - 1;
    }
    const int e = exp ? exp[g] : g, r = p - start[g];
    if (p % BM == 0)
        expert_ids[p / BM] = e;
    if (r >= cnt[g])
        sorted_ids[p] = sentinel;
    else if (batched)
        sorted_ids[p] = e * max_tokens + r;
}

// One thread per position p < cap of the padded order.
#ifdef W16_WANT_w16_route_fill
extern "C" __global__ void
w16_route_fill(const int *__restrict__ start, const int *__restrict__ total,
               int E, int BM, int cap, int sentinel, int batched,
               int max_tokens, int *__restrict__ sorted_ids,
               int *__restrict__ expert_ids)
{
    w16_pdl_enter(); // route_scan wrote start, total
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < cap)
        route_fill_at(p, start, total, nullptr, E, BM, sentinel, batched,
                      max_tokens, sorted_ids, expert_ids);
}
#endif

#ifdef W16_WANT_w16_route_scatter
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
w16_route_scatter(const int *__restrict__ ids, int P,
                  const int *__restrict__ expert_map, int n_ids, int E,
                  const int *__restrict__ start,
                  const int *__restrict__ hist_off,
                  int *__restrict__ sorted_ids, int *__restrict__ err)
{
    extern __shared__ int s_base[];
    w16_pdl_enter(); // route_scan wrote start, hist_off
    for (int e = threadIdx.x; e < E; e += ROUTE_THREADS)
        s_base[e] = start[e] + hist_off[(size_t)blockIdx.x * E + e];
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned lt = (1u << lane) - 1u;
    const int c0 = blockIdx.x * CHUNK;
    for (int r0 = 0; r0 < CHUNK; r0 += ROUTE_THREADS) {
        int t = c0 + r0 + threadIdx.x;
        int e = t < P ? slot_expert(ids, t, expert_map, n_ids, err) : -1;
        for (int w = 0; w < ROUTE_THREADS / 32; w++) {
            if (warp == w) {
                unsigned peers = __match_any_sync(0xffffffffu, e);
                int base = e >= 0 ? s_base[e] : 0;
                __syncwarp();
                if (e >= 0) {
                    sorted_ids[base + __popc(peers & lt)] = t;
                    if ((int)(__ffs(peers) - 1) == lane)
                        s_base[e] = base + __popc(peers);
                }
            }
            __syncthreads();
        }
    }
}
#endif

// The exclusive scan of v over the CTA's threads (blockDim.x, a multiple
// of 32): warp shuffles, then one warp over the warps' sums (two
// barriers, where scan_padded's Hillis-Steele over SCAN_THREADS takes
// twenty). Integer sums, so any order gives the same result. *total: the
// sum over all threads. s_warp: blockDim.x / 32 ints.
__device__ __forceinline__ int block_scan_excl(int v, int *s_warp, int *total)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int nw = blockDim.x / 32;
    int x = v;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d)
            x += y;
    }
    if (lane == 31)
        s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? s_warp[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            int y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d)
                w += y;
        }
        __syncwarp(); // every lane has read s_warp
        if (lane < nw)
            s_warp[lane] = w;
    }
    __syncthreads();
    *total = s_warp[nw - 1];
    return (warp ? s_warp[warp - 1] : 0) + x - v;
}

// The four routing steps for P <= CHUNK slots (standard format) in one
// CTA, with the results of route_count, route_scan, route_fill and
// route_scatter for one chunk (their hist_off is 0): the count in shared
// memory, the scan of the padded sizes, the fill of the padded order and
// the stable scatter. It starts the chain, so all of it follows the wait:
// the host launches about max(P, E, cap) threads (a multiple of 32, at
// most SCAN_THREADS), not SCAN_THREADS, so that each barrier waits for few
// warps; the slots' experts are read once (ids and expert_map are global
// loads, two dependent round trips) and kept in shared memory for the
// scatter. Dynamic shared memory: 2 * E + 1 + P ints (at least 97: the
// decode path, P <= 32, keeps its expert groups there).
#ifdef W16_WANT_w16_route_small
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
w16_route_small(const int *__restrict__ ids, int P,
                const int *__restrict__ expert_map, int n_ids, int E, int BM,
                int cap, int sentinel, int *__restrict__ num_post,
                int *__restrict__ sorted_ids, int *__restrict__ expert_ids,
                int *__restrict__ err)
{
    extern __shared__ int s_small[];
    int *s_cnt = s_small;              // [E]: counts, then the scatter's bases
    int *s_start = s_small + E;        // [E + 1]
    int *s_exp = s_small + 2 * E + 1;  // [P]: slot t's local expert, or -1
    __shared__ int s_warp[SCAN_THREADS / 32];
    const int T = blockDim.x;
    if (P <= 32) {
        // Decode (at most 32 slots): warp 0 computes every slot's padded
        // position with warp votes, the experts' groups in expert order go
        // to shared memory, one barrier, then the fill; the same results
        // as the general path below (five barriers fewer).
        int *g_start = s_small, *g_cnt = s_small + 33, *g_exp = s_small + 65;
        __shared__ int s_groups;
        w16_pdl_enter(); // ids may come from the previous kernel
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            int e = lane < P ? slot_expert(ids, lane, expert_map, n_ids, err)
                             : -1;
            const warp_route r = route_warp(e, BM); // moe_route_warp.cu
            if (r.padded > 0) {
                g_start[r.ord] = r.start;
                g_cnt[r.ord] = __popc(r.peers);
                g_exp[r.ord] = e;
            }
            if (e >= 0) // scatter: a slot's rank among its expert's slots
                sorted_ids[r.pos] = lane;
            if (lane == 0) {
                s_groups = r.groups;
                g_start[r.groups] = r.used;
                *num_post = r.used;
            }
        }
        __syncthreads();
        const int groups = s_groups;
        for (int p = threadIdx.x; p < cap; p += T)
            route_fill_at(p, g_start, g_cnt, g_exp, groups, BM, sentinel, 0,
                          0, sorted_ids, expert_ids);
        return;
    }
    for (int e = threadIdx.x; e < E; e += T)
        s_cnt[e] = 0;
    w16_pdl_enter(); // ids may come from the previous kernel
    __syncthreads();
    // count (integer atomics: the counts do not depend on their order)
    for (int t = threadIdx.x; t < P; t += T) {
        int e = slot_expert(ids, t, expert_map, n_ids, err);
        s_exp[t] = e;
        if (e >= 0)
            atomicAdd(&s_cnt[e], 1);
    }
    __syncthreads();
    // scan of the sizes padded to BM (as route_scan): thread i owns
    // experts e0 .. e0 + per - 1
    const int per = (E + T - 1) / T;
    const int e0 = threadIdx.x * per;
    int mine = 0;
    for (int e = e0; e < e0 + per && e < E; e++)
        mine += (s_cnt[e] + BM - 1) / BM * BM;
    int used;
    int run = block_scan_excl(mine, s_warp, &used);
    for (int e = e0; e < e0 + per && e < E; e++) {
        s_start[e] = run;
        run += (s_cnt[e] + BM - 1) / BM * BM;
    }
    if (threadIdx.x == 0) {
        s_start[E] = used;
        *num_post = used;
    }
    __syncthreads();
    // fill: block experts and padding (as route_fill, standard format);
    // every expert is a group (s_start[E] = used)
    for (int p = threadIdx.x; p < cap; p += T)
        route_fill_at(p, s_start, s_cnt, nullptr, E, BM, sentinel, 0, 0,
                      sorted_ids, expert_ids);
    // scatter: slots in order, one warp at a time (as route_scatter); the
    // bases start at s_start (s_cnt is no longer read by the fill after
    // this barrier)
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += T)
        s_cnt[e] = s_start[e];
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned lt = (1u << lane) - 1u;
    for (int r0 = 0; r0 < P; r0 += T) {
        int t = r0 + threadIdx.x;
        int e = t < P ? s_exp[t] : -1;
        // only the warps that hold slots take a turn (M = 1: one warp)
        const int rest = P - r0 < T ? P - r0 : T;
        for (int w = 0; w < (rest + 31) / 32; w++) {
            if (warp == w) {
                unsigned peers = __match_any_sync(0xffffffffu, e);
                int base = e >= 0 ? s_cnt[e] : 0;
                __syncwarp();
                if (e >= 0) {
                    sorted_ids[base + __popc(peers & lt)] = t;
                    if ((int)(__ffs(peers) - 1) == lane)
                        s_cnt[e] = base + __popc(peers);
                }
            }
            __syncthreads();
        }
    }
}
#endif

// dst[t][k] = R(src[t / row_div][perm_e[k]] * R(w[t])) for every slot t
// that reaches a local expert e (perm NULL: k; w NULL: no scaling).
// Standard format: e from ids/expert_map; batched (counts != NULL): e =
// t / max_tokens, rows r < counts[e]. One CTA per slot.
#ifdef W16_WANT_w16_gather
extern "C" __global__ void
w16_gather(const act_t *__restrict__ src, int row_div, int K,
           const int *__restrict__ ids, const int *__restrict__ expert_map,
           int n_ids, const int *__restrict__ counts, int max_tokens, int E,
           const int *__restrict__ perm, const float *__restrict__ w,
           act_t *__restrict__ dst, int *__restrict__ err)
{
    w16_pdl_enter(); // routing (or GEMM 1: a2) came before
    const int t = blockIdx.x;
    int e;
    if (counts) {
        e = t / max_tokens;
        int n = counts[e];
        if (t % max_tokens >= n || n > max_tokens)
            return;
    } else {
        e = slot_expert(ids, t, expert_map, n_ids, err);
    }
    if (e < 0 || e >= E)
        return;
    const act_t *s = src + (size_t)(t / row_div) * K;
    const int *pe = perm ? perm + (size_t)e * K : nullptr;
    const float wt = w ? round_act(w[t]) : 1.0f;
    act_t *d = dst + (size_t)t * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        act_t v = s[pe ? pe[k] : k];
        d[k] = w ? act::from_f(act::to_f(v) * wt) : v;
    }
}
#endif

// y of one slot after GEMM 2's split-K: the sum of its `splits` slabs
// (slab: elements apart), in order, then rounded when round_sum (GEMM 2
// left the rounding of its output to this sum).
__device__ __forceinline__ float y_at(const float *y, size_t i, int splits,
                                      size_t slab, int round_sum)
{
    float v = y[i];
    // eight slabs' loads in flight before their sums (in order): at small M
    // a thread's chain of dependent loads, not the bytes, is the time
    int s = 1;
    for (; s + 8 <= splits; s += 8) {
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            x[u] = y[i + (size_t)(s + u) * slab];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v += x[u];
    }
    for (; s < splits; s++)
        v += y[i + (size_t)s * slab];
    return round_sum ? round_act(v) : v;
}

// The slots j0 .. j0 + 31 (j < topk) of output row m that reach a local
// expert, as bits j - j0: the ids of eight slots in flight, then their
// expert_map entries.
__device__ __forceinline__ unsigned row_slots(const int *ids,
                                              const int *expert_map,
                                              int n_ids, int m, int topk,
                                              int j0)
{
    unsigned mask = 0;
    for (int b = 0; b < 32 && j0 + b < topk; b += 8) {
        int id[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            id[u] = j0 + b + u < topk ? ids[m * topk + j0 + b + u] : -1;
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (id[u] >= 0 && id[u] < n_ids &&
                (!expert_map || expert_map[id[u]] >= 0))
                mask |= 1u << (b + u);
    }
    return mask;
}

// out[m][n] = R(sum_j c_j y[m*topk + j][n]) over the slots that reach a
// local expert, in order j = 0, 1, ...; c_j = w[m][j], or 1 when w is NULL
// (router weights applied on the input): w16_finalize_rows, where GEMM 2
// wrote one slab (no split-K), and w16_finalize.
// A CTA takes items of one row m and a range of its columns (the whole
// row at large M; at small M the host's grid splits rows so that it
// fills the device): its threads read the row's ids, map entries and
// weights once into shared memory (dynamic: topk slots and weights),
// thread 0 lists the local slots in order, and each thread sums its
// columns, V = 4 adjacent ones at a time (16-byte loads of y, 8-byte
// stores), eight slots' loads in flight before their sums. Before, each
// thread summed one output element, reading the ids, the map and the
// weights again, each load waiting on the one before (Qwen3-30B-A3B
// M = 4096 on the H200: 162 us for 270 MB, now 78; DeepSeek-V3/EP8: 325
// us for 117 MB, now 75). The same sums, the same order.
// Launch bounds for four CTAs an SM (64 registers, 4 bytes spilled):
// against 69 registers and three, 78 against 86 us at Qwen3-30B-A3B
// M = 4096 (ncu, the H200).
#ifdef W16_WANT_w16_finalize_rows
// Thread columns groups g0, g0 + blockDim.x, ... below g1 (group g: columns
// V g .. V g + V - 1) of one row: the row's ns local slots (s_t, weights
// s_c) eight at a time, their loads in flight before the sums.
template <int V>
__device__ __forceinline__ void
finalize_cols(const float *__restrict__ y, int N, int g0, int g1, int ns,
              const int *s_t, const float *s_c, int round_sum,
              act_t *__restrict__ o)
{
    for (int g = g0; g < g1; g += blockDim.x) {
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            acc[v] = 0.0f;
        for (int s0 = 0; s0 < ns; s0 += 8) {
            float x[8][V];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (s0 + u < ns) {
                    const float *p = y + (size_t)s_t[s0 + u] * N + V * g;
                    if constexpr (V == 4) {
                        const float4 l = *reinterpret_cast<const float4 *>(p);
                        x[u][0] = l.x, x[u][1] = l.y, x[u][2] = l.z;
                        x[u][V - 1] = l.w;
                    } else {
                        x[u][0] = *p;
                    }
                }
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (s0 + u < ns)
#pragma unroll
                    for (int v = 0; v < V; v++)
                        acc[v] += s_c[s0 + u] * (round_sum ? round_act(x[u][v])
                                                           : x[u][v]);
        }
        if constexpr (V == 4) {
            uint2 q;
            q.x = (unsigned)act::from_f(acc[0]).x |
                  (unsigned)act::from_f(acc[1]).x << 16;
            q.y = (unsigned)act::from_f(acc[2]).x |
                  (unsigned)act::from_f(acc[V - 1]).x << 16;
            *reinterpret_cast<uint2 *>(o + V * g) = q;
        } else {
            o[g] = act::from_f(acc[0]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 4)
w16_finalize_rows(const float *__restrict__ y, int M, int topk, int N,
                  const int *__restrict__ ids,
                  const int *__restrict__ expert_map, int n_ids,
                  const float *__restrict__ w, act_t *__restrict__ out,
                  int splits, int round_sum)
{
    (void)splits; // one slab
    extern __shared__ int s_fin[]; // topk slots, then topk weights
    int *s_t = s_fin;
    float *s_c = reinterpret_cast<float *>(s_fin + topk);
    __shared__ int s_n;
    // 16-byte loads of y (the workspace is 256-byte aligned) and 8-byte
    // stores of out where the caller's buffer allows
    const bool vec = N % 4 == 0 &&
                     reinterpret_cast<unsigned long long>(out) % 8 == 0;
    const int groups = vec ? N / 4 : N;
    // items: rows split into `parts` column ranges of whole blocks of
    // groups, as many as the grid holds CTAs beyond one a row
    const int most = (groups + blockDim.x - 1) / blockDim.x;
    int parts = (int)(gridDim.x / (unsigned)M);
    parts = parts < 1 ? 1 : parts > most ? most : parts;
    const int per = (most + parts - 1) / parts * blockDim.x;
    const long long items = (long long)M * parts;
    w16_pdl_enter(); // GEMM 2 wrote y
    for (long long it = blockIdx.x; it < items; it += gridDim.x) {
        const int m = (int)(it / parts), part = (int)(it % parts);
        __syncthreads(); // the previous item's list is read
        for (int j = threadIdx.x; j < topk; j += blockDim.x) {
            const int t = m * topk + j, id = ids[t];
            const bool ok = id >= 0 && id < n_ids &&
                            (!expert_map || expert_map[id] >= 0);
            s_t[j] = ok ? t : -1;
            s_c[j] = w ? w[t] : 1.0f;
        }
        __syncthreads();
        if (threadIdx.x == 0) { // the local slots, ascending j, in place
            int k = 0;
            for (int j = 0; j < topk; j++)
                if (s_t[j] >= 0) {
                    s_t[k] = s_t[j];
                    s_c[k++] = s_c[j];
                }
            s_n = k;
        }
        __syncthreads();
        const int ns = s_n;
        act_t *o = out + (size_t)m * N;
        const int g0 = part * per + threadIdx.x;
        const int g1 = (part + 1) * per < groups ? (part + 1) * per : groups;
        if (vec)
            finalize_cols<4>(y, N, g0, g1, ns, s_t, s_c, round_sum, o);
        else
            finalize_cols<1>(y, N, g0, g1, ns, s_t, s_c, round_sum, o);
    }
}
#endif

// w16_finalize: the same sums with GEMM 2's split slabs, a thread an output
// element, grid-stride (y_at's eight slab loads in flight a slot: 6.9 us at
// Mixtral-8x7B M = 64, four slabs, against 11.8 for the rows' form).
#ifdef W16_WANT_w16_finalize
extern "C" __global__ void
w16_finalize(const float *__restrict__ y, int M, int topk, int N,
             const int *__restrict__ ids, const int *__restrict__ expert_map,
             int n_ids, const float *__restrict__ w, act_t *__restrict__ out,
             int splits, int round_sum)
{
    w16_pdl_enter(); // GEMM 2 wrote y
    size_t total = (size_t)M * N;
    const size_t slab = (size_t)M * topk * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int m = (int)(i / N), n = (int)(i % N);
        float acc = 0.0f;
        for (int j = 0; j < topk; j++) {
            int t = m * topk + j, id = ids[t];
            if (id < 0 || id >= n_ids || (expert_map && expert_map[id] < 0))
                continue;
            float c = w ? w[t] : 1.0f;
            acc += c * y_at(y, (size_t)t * N + n, splits, slab, round_sum);
        }
        out[i] = act::from_f(acc);
    }
}
#endif

#ifdef W16_WANT_w16_finalize_small
// Row m's output n of w16_finalize_small: the slots of cmask (then of
// row_slots past 32) in ascending j, U of them a round, their split slabs
// S at a time; each slot's splits summed in order, then c_j times it (R()
// with round_sum) added to the row's sum in slot order.
template <int U, int S>
__device__ __forceinline__ float
slot_sums(const float *__restrict__ y, int m, int topk, int N, int n,
          unsigned cmask, const int *__restrict__ ids,
          const int *__restrict__ expert_map, int n_ids,
          const float *__restrict__ w, int splits, int round_sum, size_t slab)
{
    float acc = 0.0f;
    for (int j0 = 0; j0 < topk; j0 += 32) {
        unsigned mask = j0 == 0 ? cmask
                                : row_slots(ids, expert_map, n_ids, m, topk,
                                            j0);
        while (mask) {
            // the next U slots (ascending j), -1 past the last
            int t[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                t[u] = mask ? m * topk + j0 + __ffs(mask) - 1 : -1;
                mask &= mask - 1u;
            }
            float c[U], v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                c[u] = t[u] >= 0 && w ? w[t[u]] : 1.0f;
                v[u] = 0.0f; // replaced by split 0's slab below
            }
            for (int s0 = 0; s0 < splits; s0 += S) {
                float x[U][S];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int k = 0; k < S; k++)
                        if (t[u] >= 0 && s0 + k < splits)
                            x[u][k] = y[(size_t)t[u] * N + n +
                                        (size_t)(s0 + k) * slab];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int k = 0; k < S; k++)
                        if (t[u] >= 0 && s0 + k < splits)
                            v[u] = s0 + k == 0 ? x[u][k] : v[u] + x[u][k];
            }
#pragma unroll
            for (int u = 0; u < U; u++)
                if (t[u] >= 0)
                    acc += c[u] * (round_sum ? round_act(v[u]) : v[u]);
        }
    }
    return acc;
}
#endif

// w16_finalize's results (the same sums in the same order) for few output
// elements, where the kernel is a chain of dependent loads, not bytes:
// w16_finalize's thread reads, for each j in turn, the id, then the map
// entry, then the slabs. Here the ids and map entries of a row's slots are
// read eight at a time (row_slots) and before the wait: they are the
// layer's inputs, which the routing read three kernels back (templates/
// moe_pdl.cu); after the wait, 32 slabs
// are in flight at once (eight slots of up to four splits, or four of up
// to eight). That takes up to 128 registers (launch bounds: 2 CTAs an
// SM), so the host runs it only while its grid is at most two waves
// (runtime/cuda/cuda_moe.c); larger M runs w16_finalize_rows, or
// w16_finalize with GEMM 2's split slabs.
#ifdef W16_WANT_w16_finalize_small
extern "C" __global__ void __launch_bounds__(256, 2)
w16_finalize_small(const float *__restrict__ y, int M, int topk, int N,
                   const int *__restrict__ ids,
                   const int *__restrict__ expert_map, int n_ids,
                   const float *__restrict__ w, act_t *__restrict__ out,
                   int splits, int round_sum)
{
    const size_t total = (size_t)M * N;
    const size_t slab = (size_t)M * topk * N;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    // slots 0..31 of row cm (the thread's current row)
    int cm = i < total ? (int)(i / N) : -1;
    unsigned cmask = cm >= 0 ? row_slots(ids, expert_map, n_ids, cm, topk, 0)
                             : 0u;
    w16_pdl_enter(); // GEMM 2 wrote y
    for (; i < total; i += stride) {
        const int m = (int)(i / N), n = (int)(i % N);
        if (m != cm) {
            cm = m;
            cmask = row_slots(ids, expert_map, n_ids, m, topk, 0);
        }
        // eight slots a round where at most four splits come with each
        // (32 loads in flight either way; the same sums in the same order)
        float acc = splits <= 4
            ? slot_sums<8, 4>(y, m, topk, N, n, cmask, ids, expert_map,
                              n_ids, w, splits, round_sum, slab)
            : slot_sums<4, 8>(y, m, topk, N, n, cmask, ids, expert_map,
                              n_ids, w, splits, round_sum, slab);
        out[i] = act::from_f(acc);
    }
}
#endif

// out[e][r][n] = R(c * y[e*max_tokens + r][n]) for r < counts[e], else 0;
// c = w[e][r], or 1 when w is NULL.
#ifdef W16_WANT_w16_finalize_batched
extern "C" __global__ void
w16_finalize_batched(const float *__restrict__ y, int E, int max_tokens,
                     int N, const int *__restrict__ counts,
                     const float *__restrict__ w, act_t *__restrict__ out,
                     int splits, int round_sum)
{
    w16_pdl_enter(); // GEMM 2 wrote y
    size_t total = (size_t)E * max_tokens * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / N;
        int e = (int)(row / max_tokens), r = (int)(row % max_tokens);
        int n = counts[e];
        float v = 0.0f;
        if (r < n && n <= max_tokens)
            v = (w ? w[row] : 1.0f) * y_at(y, i, splits, total, round_sum);
        out[i] = act::from_f(v);
    }
}
#endif

// Act-order tensors of one operand, [E][K] each: g_idx in [0, G), and perm
// a permutation of [0, K) in every expert. seen [E][K] must be zero.
#ifdef W16_WANT_w16_check_act_order
extern "C" __global__ void
w16_check_act_order(const int *__restrict__ g_idx,
                    const int *__restrict__ perm, int E, int K, int G,
                    int *__restrict__ seen, int *__restrict__ err)
{
    size_t total = (size_t)E * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int g = g_idx[i], k = perm[i];
        if (g < 0 || g >= G)
            atomicMin(err + ERR_GIDX, (int)i);
        if (k < 0 || k >= K)
            atomicMin(err + ERR_PERM, (int)i);
        else
            atomicAdd(seen + (i / K) * K + k, 1);
    }
}
#endif

#ifdef W16_WANT_w16_check_seen
extern "C" __global__ void
w16_check_seen(const int *__restrict__ seen, int E, int K,
               int *__restrict__ err)
{
    size_t total = (size_t)E * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        if (seen[i] != 1)
            atomicMin(err + ERR_PERM, (int)i);
}
#endif
