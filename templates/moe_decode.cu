// moe_decode.cu - the whole fused-MoE layer of a decode step (M <= 8
// tokens, at most MAX_SLOTS routed slots) in one persistent kernel:
// routing, GEMM 1 and the activation, GEMM 2, the top-k weights and the
// sum over top-k, with device-side dependencies and no host round trip.
// The chain of kernels (routing, GEMM 1, GEMM 2, finalize: moe_aux.cu,
// moe_marlin_gemm.cu) pays, at these sizes, a kernel's ramp and drain at
// every boundary and its routing's dependent loads before any weight
// moves; here every CTA starts streaming weights as soon as it has routed.
// One translation unit is the prelude gen/moe_cuda.c writes (namespace
// w16cfg: every compile-time parameter, W16_KERNEL), moe_pdl.cu,
// moe_quant.cu, then this text.
//
// The grid is persistent: CTAS CTAs an SM (the launch bounds, and the
// host sizes the shared memory so that they fit), so every CTA is
// resident and a CTA may wait for another. Each CTA:
//   1. routes (every CTA the same, in shared memory): slot s = m * topk + j
//      goes to local expert e (expert_map) or nowhere; the slots of an
//      expert, in slot order, make units of at most 8 rows (a token
//      routes to distinct experts, so at M <= 8 an expert is one unit);
//   2. runs its share of GEMM 1: the U x T1 tiles (unit, 64 outputs of the
//      intermediate size: the gate and up columns) x K in chunks of KC,
//      cut evenly over the CTAs (stream-K, "work" below); a tile cut into
//      fragments adds their float32 sums (slabs) in fragment order in the
//      fragment that finishes last, which applies the channelwise scale,
//      the bias, the optional rounding and the activation, writes a2
//      [slots][IP] and counts the tile on its unit's counter (done1);
//   3. runs its share of GEMM 2 the same way (U x T2 tiles of 64 columns
//      of H, K = the intermediate size): a fragment prefetches its codes
//      to L2 and loads its first chunks, then waits until done1 of its
//      unit counts T1 tiles, then reads a2; its float32 sums go to y
//      [fragment][slots][H];
//   4. the CTA that finishes the last fragment of a column tile (count on
//      cnt_out) writes out[m][n] = R(sum_j w[m][j] * R'(y[slot][n])) for
//      every token m, in the order j = 0, 1, ... (the fragments summed in
//      order, then scale, bias and the optional rounding R' as GEMM 2's
//      epilogue does, R the activation dtype). Every sum has a fixed order
//      and the counters are integers: the result is the same bits from run
//      to run, whichever CTA finishes when. Each counter is set back to
//      zero by the CTA that reads it last (done1 by the last column
//      tile's, cnt_fin), so the next run finds zeros.
//
// A fragment: 8 warps; K in chunks of KC = 256, staged in windows of at
// most the host's max_chunks chunks (the unit's activation rows, padding
// rows zero, and the window's group scales and zero points, in shared
// memory); warp w takes each chunk's k16 steps 2w and 2w + 1, so a warp's
// two steps lie in one quantization group (group sizes are multiples of
// 32). Codes come from global memory straight into a ring of D chunks of
// registers (the next fragment's first ones while this one's epilogue
// runs): each lane's 16 bytes of a 16 x 64 Marlin tile are, register for
// register, two A fragments of mma.m16n8k16 over 16 columns each (as
// moe_marlin_gemm.cu uses them at block_m 8), the 8 rows of activations
// the n8 operand. The mma takes the exact (q - z) (exponent trick) and
// each warp scales its float32 sums once per chunk (deferred group
// scales, as the chain's small-M GEMMs do). The 8 warps' sums are added
// in shared memory in the order w = 0, 1, ... .
//
// Measured slower than the chain at every decode size so far (docs/
// design-notes.md, "The one-kernel decode layer"): the runtime runs it
// only with WNA16_CUDA_DECODE=1.

namespace w16 {

constexpr int THREADS = 256, WARPS = 8;
constexpr int KC = 256;                // k of a chunk: 16 k16 steps
constexpr int ROWS = 8;                // rows of a unit (the n8 operand)
constexpr int TILE_VECS = 8 * BITS;    // 16-byte vectors of a 16 x 64 tile
constexpr int LANE_VECS = BITS / 4;    // of a lane
constexpr u32 MAGIC2 = MAGIC_BITS | (MAGIC_BITS << 16);
// the symmetric zero point under the exponent, both lanes
constexpr u32 ZSYM2 = MAGIC2 | ((1u << (BITS - 1)) * 0x00010001u);
static_assert(MAX_SLOTS <= THREADS, "a thread a slot when routing");
static_assert(!GROUPED || GS % 32 == 0, "a warp's two k16 steps in a group");

// D chunks of codes in flight a warp (a ring of registers): with CTAS
// CTAs of 8 warps an SM, 32 KB in flight an SM (4-bit), what HBM's
// latency needs. Two CTAs an SM, not one with a deeper ring: at one the
// dequantizing warps (two a scheduler) issued an instruction every 9.9
// cycles (ncu, Qwen3-30B-A3B M = 1: 0.20 issued a scheduler and cycle,
// 8% of DRAM bandwidth), the products of a chunk waiting on their own
// latencies, not on memory.
constexpr int D = BITS == 4 ? 2 : 1;
static_assert(CTAS >= 1 && CTAS <= 2, "CTAs an SM");

// static shared memory: the routing (every CTA computes the same)
struct route_t {
    int se[MAX_SLOTS];           // local expert of a slot, -1: none
    int rank[MAX_SLOTS];         // rank among earlier slots of its expert
    int unit_of[MAX_SLOTS];      // unit of a slot (-1: none)
    int ue[MAX_SLOTS];           // expert of a unit
    int un[MAX_SLOTS];           // rows of a unit
    int urow[MAX_SLOTS][ROWS];   // slot of each row of a unit
    int su[MAX_SLOTS];           // unit of a slot
    int flag;
};
// dynamic shared memory (the host's size: max_chunks chunks of K): a
// window's activation rows, its groups' scales and zero points, then
// (after the chunks) the warps' float32 sums, [WARPS][ROWS][128]
constexpr int RED_FLOATS = WARPS * ROWS * 128;

// ---- PTX wrappers ---------------------------------------------------------

__device__ __forceinline__ u32 smem_u32(const void *p)
{
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
// codes: read once, never written by the kernel
__device__ __forceinline__ int4 ld_codes(const int4 *p)
{
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
__device__ __forceinline__ int ld_acquire(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n"
                 : "=r"(v) : "l"(p) : "memory");
    return v;
}
// D = A * B + D (zc: + 0), m16n8k16, float32 accumulate (moe_quant.cu)
__device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0,
                                    u32 b1, bool zc)
{
    if (zc)
        mma16816_c(d, a, b0, b1, 0.0f, 0.0f, 0.0f, 0.0f);
    else
        mma16816_c(d, a, b0, b1, d[0], d[1], d[2], d[3]);
}

// (q - z) of a pair of codes in 16-bit lanes (v: the codes, zb: MAGIC + z
// of both lanes under the exponent), exact
__device__ __forceinline__ u32 pair_minus_zero(u32 v, u32 zb)
{
    if constexpr (USE_MAGIC) {
        return as_u32(__hsub2(from_u32<act2_t>(v | MAGIC2),
                              from_u32<act2_t>(zb)));
    } else { // bf16 8-bit: 128 + q needs 9 bits; |q - z| <= 255 does not
        const float z = (float)(int)((zb & 0xffffu) - MAGIC_BITS);
        return as_u32(act::pair(act::from_f((float)(int)(v & 0xffffu) - z),
                                act::from_f((float)(int)(v >> 16) - z)));
    }
}

// The scales of a lane's 8 columns 8j + gid of one 64-column tile (its
// first scale at `tile`, in shared memory, permutation L), as floats.
template <int L>
__device__ __forceinline__ void lane_scales(const scale_t *tile, int gid,
                                            float (&out)[8])
{
    if constexpr (L == 0) { // scale_pos(8j + gid) = 8 gid + j
        int4 x = *reinterpret_cast<const int4 *>(tile + 8 * gid);
        const scale_t *v = reinterpret_cast<const scale_t *>(&x);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[j] = sca::to_f(v[j]);
    } else { // 32 (j / 4) + 8 (gid / 2) + 2 (j % 4) + gid % 2
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int4 x = *reinterpret_cast<const int4 *>(tile + 32 * h +
                                                      8 * (gid / 2));
            const scale_t *v = reinterpret_cast<const scale_t *>(&x);
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                out[4 * h + jj] = sca::to_f(v[2 * jj + gid % 2]);
        }
    }
}

// ---- work: stream-K over chunks ---------------------------------------------

// Each phase's work is U x T tiles x nch chunks of K, "chunk units" in
// tile-major order (a tile's chunks adjacent); CTA b takes the units
// [W b / G, W (b + 1) / G), so that every CTA streams the same bytes
// whatever U, T and the device's SM count (a whole-item split leaves
// waves: Qwen3-30B-A3B's 96 GEMM 1 tiles on 264 CTAs). A CTA's range
// cuts it into fragments, one per tile it touches; a tile cut into nf > 1
// fragments adds their float32 sums (slabs) in fragment order, in the
// fragment that finishes last (an integer counter a tile): the same bits
// whichever finishes when.
struct plan_t {
    long long W1, W2; // chunk units of each phase
    int T1, T2, nch1, nch2, G;
};

__device__ __forceinline__ long long sk_start(long long W, int G, int b)
{
    return W * b / G;
}
// the CTA whose range holds unit x (the last of equal starts: CTAs with
// empty ranges, where W < G, own nothing)
__device__ __forceinline__ int sk_owner(long long W, int G, long long x)
{
    return (int)(((x + 1) * G - 1) / W);
}
// The fragments of the tile whose units are [x0, x0 + nch) (CTAs with
// empty ranges between two owners count none), and *f the index of the
// one holding unit x (null: not wanted).
__device__ __forceinline__ int tile_frags(long long W, int G, long long x0,
                                          int nch, long long x, int *f)
{
    int nf = 1, at = 0, prev = sk_owner(W, G, x0);
    for (long long y = x0 + 1; y < x0 + nch; y++) {
        const int ow = sk_owner(W, G, y);
        if (ow != prev) {
            nf++;
            if (y <= x)
                at++;
            prev = ow;
        }
    }
    if (f)
        *f = at;
    return nf;
}

struct work_t {
    int phase;       // 1, 2; 0: none
    int u, t;        // unit, column tile (64 outputs)
    int c0, c1;      // chunks of K
    int f, nf;       // fragment f of the tile's nf
    long long x1;    // the unit after the fragment
};

// The fragment of phase `phase` at unit x of CTA b (range end e).
__device__ __forceinline__ work_t fragment(const plan_t &pl, int phase,
                                          long long x, long long e, int b)
{
    work_t w;
    const long long W = phase == 1 ? pl.W1 : pl.W2;
    const int T = phase == 1 ? pl.T1 : pl.T2;
    const int nch = phase == 1 ? pl.nch1 : pl.nch2;
    const long long tau = x / nch; // the tile
    w.phase = phase;
    w.u = (int)(tau / T);
    w.t = (int)(tau % T);
    w.c0 = (int)(x % nch);
    const long long left = e - x;
    w.c1 = left < nch - w.c0 ? w.c0 + (int)left : nch;
    (void)b;
    w.nf = tile_frags(W, pl.G, tau * nch, nch, x, &w.f);
    w.x1 = x + (w.c1 - w.c0);
    return w;
}

// CTA b's first fragment (phase 1, else 2, else none) from `phase` on.
__device__ __forceinline__ work_t first_work(const plan_t &pl, int phase,
                                            int b)
{
    for (; phase <= 2; phase++) {
        const long long W = phase == 1 ? pl.W1 : pl.W2;
        const long long s = sk_start(W, pl.G, b), e = sk_start(W, pl.G, b + 1);
        if (s < e)
            return fragment(pl, phase, s, e, b);
    }
    work_t w;
    w.phase = 0;
    w.u = w.t = w.c0 = w.c1 = w.f = w.nf = 0;
    w.x1 = 0;
    return w;
}

__device__ __forceinline__ work_t next_work(const plan_t &pl, const work_t &w,
                                           int b)
{
    const long long W = w.phase == 1 ? pl.W1 : pl.W2;
    const long long e = sk_start(W, pl.G, b + 1);
    if (w.x1 < e)
        return fragment(pl, w.phase, w.x1, e, b);
    return first_work(pl, w.phase + 1, b);
}

// The operands of a fragment: its expert's codes, scales and zero points.
struct operand_t {
    const int4 *qw;       // the expert's codes
    const scale_t *sc;    // its scales [G][N]
    const u32 *zp;        // its zero points [G][N / 8], or null
    int N, K;             // N: 2 IP (w13) or H (w2)
    int tcol0, tcol1;     // the fragment's tiles (w13: gate, up; w2: one)
};

// The codes of chunk c of a fragment into ring slot r: a warp's two k16
// steps (2 warp, 2 warp + 1 of the chunk), each tile's 16 bytes a lane
// (8-bit: 32). Chunks past the fragment, and steps past K, load nothing.
template <int TN>
__device__ __forceinline__ void load_chunk(const operand_t &o, int c, int c1,
                                           int4 (&r)[2][2][LANE_VECS],
                                           int warp, int lane)
{
    if (c >= c1)
        return;
    const int tiles_n = o.N / 64;
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const int ks = c * (KC / 16) + 2 * warp + s;
        if (ks * 16 >= o.K)
            continue;
#pragma unroll
        for (int tt = 0; tt < TN; tt++) {
            const int4 *p = o.qw + ((size_t)ks * tiles_n +
                                    (tt ? o.tcol1 : o.tcol0)) * TILE_VECS +
                            lane * LANE_VECS;
#pragma unroll
            for (int v = 0; v < LANE_VECS; v++)
                r[s][tt][v] = ld_codes(p + v);
        }
    }
}

// acc += the products of chunk c (this warp's two steps; codes in r,
// activations at sa: row r at sa + r * lds, k relative to the window's
// first chunk c0) for TN tiles, group scales deferred to the chunk's end.
template <int TN, int SL>
__device__ __forceinline__ void compute_chunk(const operand_t &o, int c,
                                              int c0, const act_t *sa,
                                              int lds, const scale_t *ss,
                                              const u32 *sz,
                                              const int4 (&r)[2][2][LANE_VECS],
                                              float (&acc)[2][4][4], int warp,
                                              int lane)
{
    const int gid = lane / 4, tig = lane % 4;
    const int kw = c * KC + 32 * warp; // the warp's first k
    if (kw >= o.K)
        return;
    // the group's row among the window's staged ones
    const int grp = GROUPED ? (kw - c0 * KC) / GS : 0;
    u32 bf[2][2]; // the n8 operand of each step: rows gid, k pairs
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const act_t *ar = sa + gid * lds + (c - c0) * KC + 32 * warp +
                          16 * s + 2 * tig;
        bf[s][0] = *reinterpret_cast<const u32 *>(ar);
        bf[s][1] = *reinterpret_cast<const u32 *>(ar + 8);
    }
#pragma unroll
    for (int tt = 0; tt < TN; tt++) {
        u32 zb[8]; // MAGIC + z of both lanes, per 8-column block j
        u32 zw = 0;
        if constexpr (ZP)
            zw = sz[(grp * TN + tt) * 8 + gid];
#pragma unroll
        for (int j = 0; j < 8; j++)
            zb[j] = ZP ? MAGIC2 | (((zw >> (4 * ((j % 2) * 4 + j / 2))) & 15u) *
                                   0x00010001u)
                       : ZSYM2;
        float pacc[4][4];
#pragma unroll
        for (int s = 0; s < 2; s++) {
            u32 w[4 * LANE_VECS];
#pragma unroll
            for (int v = 0; v < LANE_VECS; v++) {
                w[4 * v + 0] = (u32)r[s][tt][v].x;
                w[4 * v + 1] = (u32)r[s][tt][v].y;
                w[4 * v + 2] = (u32)r[s][tt][v].z;
                w[4 * v + 3] = (u32)r[s][tt][v].w;
            }
#pragma unroll
            for (int jp = 0; jp < 4; jp++) {
                u32 d[2][2]; // [block 2jp + h][b0, b1]
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int j = 2 * jp + h;
                    u32 x0, x1;
                    if constexpr (BITS == 4) {
                        const int p = 2 * (j % 2);
                        x0 = (w[j / 2] >> (4 * p)) & 0x000f000fu;
                        x1 = (w[j / 2] >> (4 * p + 4)) & 0x000f000fu;
                    } else {
                        x0 = w[j] & 0x00ff00ffu;
                        x1 = (w[j] >> 8) & 0x00ff00ffu;
                    }
                    d[h][0] = pair_minus_zero(x0, zb[j]);
                    d[h][1] = pair_minus_zero(x1, zb[j]);
                }
                const u32 a[4] = {d[0][0], d[1][0], d[0][1], d[1][1]};
                mma(GROUPED ? pacc[jp] : acc[tt][jp], a, bf[s][0], bf[s][1],
                    GROUPED && s == 0);
            }
        }
        if constexpr (GROUPED) { // acc += s * pacc, the group's scales
            float sc[8];
            lane_scales<SL>(ss + (grp * TN + tt) * 64, gid, sc);
#pragma unroll
            for (int jp = 0; jp < 4; jp++)
#pragma unroll
                for (int cc = 0; cc < 4; cc++)
                    acc[tt][jp][cc] = fmaf(sc[2 * jp + cc / 2], pacc[jp][cc],
                                           acc[tt][jp][cc]);
        }
    }
}

} // namespace w16

using namespace w16;

// The launch contract with runtime/cuda/cuda_moe.c (run_decode).
extern "C" __global__ void __launch_bounds__(THREADS, CTAS)
W16_KERNEL(const act_t *__restrict__ a, int M, int topk,
           const int *__restrict__ ids, const int *__restrict__ expert_map,
           int n_ids, const float *__restrict__ topk_w,
           const int4 *__restrict__ qw1, const scale_t *__restrict__ s1,
           const u32 *__restrict__ z1, const bias_t *__restrict__ b1,
           const int4 *__restrict__ qw2, const scale_t *__restrict__ s2,
           const u32 *__restrict__ z2, const bias_t *__restrict__ b2, int H,
           int ip, int G1, int G2, float limit, float alpha, float beta,
           int round_out, int max_chunks, act_t *a2, float *part1, float *y,
           int *sem, int *err, act_t *__restrict__ out)
{
    __shared__ route_t sm;
    extern __shared__ int4 dsm4[];
    act_t *sa = reinterpret_cast<act_t *>(dsm4);
    float *red = reinterpret_cast<float *>(dsm4);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int G = gridDim.x, b = blockIdx.x;
    const int S = M * topk;
    const int T1 = ip / 64, T2 = H / 64;
    int *cnt1 = sem;               // [S][T1]: GEMM 1 fragments of a tile
    int *done1 = cnt1 + S * T1;    // [S]: GEMM 1 tiles of a unit done
    int *cnt_out = done1 + S;      // [T2]: GEMM 2 fragments of a column
    int *cnt_fin = cnt_out + T2;   // [1]: column tiles written out

    w16_pdl_enter(); // the routing and the input come from earlier kernels

    // ---- routing (every CTA the same) ----
    if (tid < S) {
        const int id = ids[tid];
        int e = -1;
        if (id < 0 || id >= n_ids) {
            if (b == 0)
                atomicMin(err + ERR_ID, tid);
        } else {
            e = expert_map ? expert_map[id] : id;
        }
        sm.se[tid] = e;
    }
    __syncthreads();
    bool lead = false;
    if (tid < S) {
        const int e = sm.se[tid];
        int r = 0;
        for (int j = 0; j < tid; j++)
            r += sm.se[j] == e;
        sm.rank[tid] = r;
        lead = e >= 0 && r % ROWS == 0;
    }
    __syncthreads();
    if (tid < S) { // a leader's unit: the leaders before it
        int u = -1;
        if (lead) {
            u = 0;
            for (int j = 0; j < tid; j++)
                u += sm.se[j] >= 0 && sm.rank[j] % ROWS == 0;
            sm.ue[u] = sm.se[tid];
            sm.un[u] = 0;
        }
        sm.unit_of[tid] = u;
    }
    const int U = __syncthreads_count(lead);
    if (tid < S && sm.se[tid] >= 0) {
        const int e = sm.se[tid], r = sm.rank[tid];
        int u = sm.unit_of[tid];
        if (!lead) { // the leader of this slot's unit: rank 8 (r / 8)
            for (int j = 0; j < tid; j++)
                if (sm.se[j] == e && sm.rank[j] == r - r % ROWS)
                    u = sm.unit_of[j];
        }
        sm.urow[u][r % ROWS] = tid;
        atomicMax(&sm.un[u], r % ROWS + 1);
        sm.su[tid] = u;
    }
    __syncthreads();

    if (U == 0) { // nothing routed here: the output is zeros
        for (int i = b * THREADS + tid; i < M * H; i += G * THREADS)
            out[i] = act::from_f(0.0f);
        return;
    }

    plan_t pl;
    pl.T1 = T1;
    pl.T2 = T2;
    pl.nch1 = (H + KC - 1) / KC;
    pl.nch2 = (ip + KC - 1) / KC;
    pl.W1 = (long long)U * T1 * pl.nch1;
    pl.W2 = (long long)U * T2 * pl.nch2;
    pl.G = G;
    const size_t tiles1 = (size_t)(H / 16) * (2 * ip / 64);
    const size_t tiles2 = (size_t)(ip / 16) * (H / 64);
    auto operand = [&](const work_t &w) {
        operand_t o;
        const int e = sm.ue[w.u];
        if (w.phase == 1) {
            o.qw = qw1 + (size_t)e * tiles1 * TILE_VECS;
            o.sc = s1 + (size_t)e * G1 * 2 * ip;
            o.zp = ZP ? z1 + (size_t)e * G1 * (2 * ip / 8) : nullptr;
            o.N = 2 * ip;
            o.K = H;
            o.tcol0 = w.t;
            o.tcol1 = ip / 64 + w.t;
        } else {
            o.qw = qw2 + (size_t)e * tiles2 * TILE_VECS;
            o.sc = s2 + (size_t)e * G2 * H;
            o.zp = ZP ? z2 + (size_t)e * G2 * (H / 8) : nullptr;
            o.N = H;
            o.K = ip;
            o.tcol0 = o.tcol1 = w.t;
        }
        return o;
    };
    // the ring: chunk c0 + d of the current fragment in slot d (mod D)
    int4 ring[D][2][2][LANE_VECS];
    auto prefetch = [&](const work_t &w) { // the fragment's first D chunks
        if (w.phase == 0)
            return;
        const operand_t o = operand(w);
#pragma unroll
        for (int d = 0; d < D; d++) {
            if (w.phase == 1)
                load_chunk<2>(o, w.c0 + d, w.c1, ring[d], warp, lane);
            else
                load_chunk<1>(o, w.c0 + d, w.c1, ring[d], warp, lane);
        }
    };
    // The activation rows of chunks [c, c + n) of the fragment (rows of
    // padding: zeros), then its groups' scales [groups][TN][64] and zero
    // points [groups][TN][8 words], into shared memory (a window: at most
    // max_chunks chunks, the host's size).
    auto stage = [&](const work_t &w, const operand_t &o, int c, int n,
                     const int *rows, int nrows, int lds, scale_t *ss,
                     u32 *sz) {
        const act_t *A = w.phase == 1 ? a : a2;
        const int lda = w.phase == 1 ? H : ip;
        const int div = w.phase == 1 ? topk : 1;
        const int k0 = c * KC, klen = n * KC;
        for (int q = tid; q < ROWS * (klen / 8); q += THREADS) {
            const int r = q / (klen / 8), v = q % (klen / 8);
            act_t *dst = sa + r * lds + 8 * v;
            if (r < nrows && k0 + 8 * v < o.K)
                cp_async16(dst, A + (size_t)(rows[r] / div) * lda + k0 + 8 * v);
            else
                *reinterpret_cast<int4 *>(dst) = make_int4(0, 0, 0, 0);
        }
        const int kend = k0 + klen < o.K ? k0 + klen : o.K;
        const int g0 = GROUPED ? k0 / GS : 0;
        const int ng = GROUPED ? (kend - k0) / GS : 1;
        const int tn = w.phase == 1 ? 2 : 1;
        if constexpr (GROUPED)
            for (int q = tid; q < ng * tn * 8; q += THREADS) {
                const int gi = q / (tn * 8), tt = (q / 8) % tn, v = q % 8;
                const int col = 64 * (tt ? o.tcol1 : o.tcol0) + 8 * v;
                cp_async16(ss + (gi * tn + tt) * 64 + 8 * v,
                           o.sc + (size_t)(g0 + gi) * o.N + col);
            }
        if constexpr (ZP) // (channelwise: the one row of zero points)
            for (int q = tid; q < ng * tn * 8; q += THREADS) {
                const int gi = q / (tn * 8), tt = (q / 8) % tn;
                sz[q] = __ldg(o.zp + (size_t)(g0 + gi) * (o.N / 8) +
                              8 * (tt ? o.tcol1 : o.tcol0) + q % 8);
            }
        cp_async_commit();
        cp_async_wait_all();
    };

    work_t w = first_work(pl, 1, b);
    prefetch(w);
    while (w.phase != 0) {
        const operand_t o = operand(w);
        const int u = w.u, t = w.t, e = sm.ue[u], n = sm.un[u];
        const int *rows = sm.urow[u];
        // GEMM 2: the unit's a2 rows are complete once GEMM 1 counted all
        // its T1 tiles; meanwhile the fragment's first codes are on their
        // way (and the rest of them toward L2)
        if (w.phase == 2) {
            const int kend = w.c1 * KC < o.K ? w.c1 * KC : o.K;
            const int lines = (kend / 16 - w.c0 * (KC / 16)) * (TILE_VECS / 8);
            for (int l = tid; l < lines; l += THREADS)
                prefetch_l2(o.qw + ((size_t)(w.c0 * (KC / 16) +
                                             l / (TILE_VECS / 8)) *
                                        (o.N / 64) + o.tcol0) * TILE_VECS +
                            (l % (TILE_VECS / 8)) * 8);
            if (tid == 0) {
                while (ld_acquire(done1 + u) < T1)
                    __nanosleep(64);
                __threadfence();
            }
        }

        float acc[2][4][4];
#pragma unroll
        for (int tt = 0; tt < 2; tt++)
#pragma unroll
            for (int jp = 0; jp < 4; jp++)
#pragma unroll
                for (int cc = 0; cc < 4; cc++)
                    acc[tt][jp][cc] = 0.0f;
        // windows of at most max_chunks chunks: the activations, scales
        // and zero points staged, then the chunks (the ring runs on)
        // (a whole number of ring turns, so that a turn stays in one)
        const int win = w.c1 - w.c0 <= max_chunks ? w.c1 - w.c0
                                                  : max_chunks / D * D;
        const int lds = win * KC + 8;
        scale_t *ss = reinterpret_cast<scale_t *>(sa + ROWS * lds);
        u32 *sz = reinterpret_cast<u32 *>(
            ss + (GROUPED ? win * KC / GS : 0) * 128);
        for (int base = w.c0, ws = w.c0, we = w.c0; base < w.c1; base += D) {
            if (base >= we) { // the next window
                const int nw = w.c1 - base < win ? w.c1 - base : win;
                __syncthreads(); // the shared memory is free
                stage(w, o, base, nw, rows, n, lds, ss, sz);
                __syncthreads();
                ws = base;
                we = base + nw;
            }
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int c = base + d;
                if (c < w.c1) {
                    if (w.phase == 1) {
                        compute_chunk<2, SL1>(o, c, ws, sa, lds, ss, sz,
                                              ring[d], acc, warp, lane);
                        load_chunk<2>(o, c + D, w.c1, ring[d], warp, lane);
                    } else {
                        compute_chunk<1, SL2>(o, c, ws, sa, lds, ss, sz,
                                              ring[d], acc, warp, lane);
                        load_chunk<1>(o, c + D, w.c1, ring[d], warp, lane);
                    }
                }
            }
        }
        // the next fragment's first codes go out before this one's epilogue
        const work_t next = next_work(pl, w, b);
        prefetch(next);
        __syncthreads(); // every warp done with the activations

        // the warps' sums, then their sum in the order w = 0, 1, ...
        // C^T fragment: c 0, 1 -> column 16 jp + gid, rows 2 tig,
        // 2 tig + 1; c 2, 3 -> column 16 jp + 8 + gid
        const int TW = w.phase == 1 ? 128 : 64;
        {
            const int gid = lane / 4, tig = lane % 4;
#pragma unroll
            for (int tt = 0; tt < 2; tt++)
#pragma unroll
                for (int jp = 0; jp < 4; jp++)
#pragma unroll
                    for (int cc = 0; cc < 4; cc++) {
                        const int row = 2 * tig + cc % 2;
                        const int col = tt * 64 + 16 * jp + 8 * (cc / 2) + gid;
                        if (col < TW)
                            red[(warp * ROWS + row) * TW + col] =
                                acc[tt][jp][cc];
                    }
        }
        __syncthreads();
        for (int q = tid; q < ROWS * TW; q += THREADS) {
            float v = red[q];
#pragma unroll
            for (int ww = 1; ww < WARPS; ww++)
                v += red[ww * ROWS * TW + q];
            red[q] = v; // warp 0's slot: read only by this thread
        }
        __syncthreads();

        if (w.phase == 1) {
            bool last = true;
            if (w.nf > 1) { // this fragment's slab, then who adds them
                for (int q = tid; q < n * 128; q += THREADS) {
                    const int r = q / 128, c = q % 128;
                    const int col = c < 64 ? 64 * t + c : ip + 64 * t + c - 64;
                    part1[((size_t)w.f * S + rows[r]) * 2 * ip + col] =
                        red[r * 128 + c];
                }
                __threadfence();
                __syncthreads();
                if (tid == 0) {
                    const int prev = atomicAdd(cnt1 + u * T1 + t, 1);
                    sm.flag = prev == w.nf - 1;
                    if (prev == w.nf - 1)
                        cnt1[u * T1 + t] = 0;
                }
                __syncthreads();
                last = sm.flag;
                if (last)
                    __threadfence();
            }
            if (last) {
                const bias_t *be = b1 ? b1 + (size_t)e * 2 * ip : nullptr;
                for (int q = tid; q < n * 64; q += THREADS) {
                    const int r = q / 64, c = q % 64, nn = 64 * t + c;
                    const int slot = rows[r];
                    float hg, hu;
                    if (w.nf > 1) {
                        hg = hu = 0.0f;
                        for (int f = 0; f < w.nf; f++) {
                            const float *pp =
                                part1 + ((size_t)f * S + slot) * 2 * ip;
                            hg += __ldcg(pp + nn);
                            hu += __ldcg(pp + ip + nn);
                        }
                    } else {
                        hg = red[r * 128 + c];
                        hu = red[r * 128 + 64 + c];
                    }
                    if constexpr (!GROUPED) {
                        const scale_t *se = s1 + (size_t)e * 2 * ip;
                        hg *= sca::to_f(se[scale_pos_in<SL1>(nn)]);
                        hu *= sca::to_f(se[scale_pos_in<SL1>(ip + nn)]);
                    }
                    if (be) {
                        hg += bia::to_f(be[bias_pos(nn)]);
                        hu += bia::to_f(be[bias_pos(ip + nn)]);
                    }
                    if (round_out) {
                        hg = round_act(hg);
                        hu = round_act(hu);
                    }
                    a2[(size_t)slot * ip + nn] =
                        act::from_f(activation(hg, hu, limit, alpha, beta));
                }
                __threadfence();
                __syncthreads();
                if (tid == 0)
                    atomicAdd(done1 + u, 1);
            }
        } else {
            for (int q = tid; q < n * 64; q += THREADS) {
                const int r = q / 64, c = q % 64;
                y[((size_t)w.f * S + rows[r]) * H + 64 * t + c] =
                    red[r * 64 + c];
            }
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                // the fragments of column tile t: nf of each unit's tile
                int want = 0;
                for (int uu = 0; uu < U; uu++)
                    want += tile_frags(pl.W2, G,
                                       ((long long)uu * T2 + t) * pl.nch2,
                                       pl.nch2, 0, nullptr);
                const int prev = atomicAdd(cnt_out + t, 1);
                sm.flag = prev == want - 1;
                if (prev == want - 1)
                    cnt_out[t] = 0;
            }
            __syncthreads();
            if (sm.flag) { // the last fragment of column tile t: the output
                __threadfence();
                for (int q = tid; q < M * 64; q += THREADS) {
                    const int m = q / 64, nn = 64 * t + q % 64;
                    float v = 0.0f;
                    for (int j = 0; j < topk; j++) {
                        const int slot = m * topk + j, ee = sm.se[slot];
                        if (ee < 0)
                            continue;
                        // the slot's unit's fragments of this tile
                        const int nf = tile_frags(
                            pl.W2, G, ((long long)sm.su[slot] * T2 + t) * pl.nch2,
                            pl.nch2, 0, nullptr);
                        float xs = 0.0f;
                        for (int f = 0; f < nf; f++)
                            xs += __ldcg(y + ((size_t)f * S + slot) * H + nn);
                        if constexpr (!GROUPED)
                            xs *= sca::to_f(
                                s2[(size_t)ee * H + scale_pos_in<SL2>(nn)]);
                        if (b2)
                            xs += bia::to_f(b2[(size_t)ee * H + bias_pos(nn)]);
                        if (round_out)
                            xs = round_act(xs);
                        v += topk_w[slot] * xs;
                    }
                    out[(size_t)m * H + nn] = act::from_f(v);
                }
                __syncthreads();
                // the last column tile: every GEMM 2 fragment has passed
                // its wait, so the units' GEMM 1 counters go back to zero
                if (tid == 0 && atomicAdd(cnt_fin, 1) == T2 - 1) {
                    for (int uu = 0; uu < U; uu++)
                        done1[uu] = 0;
                    *cnt_fin = 0;
                }
            }
        }
        w = next;
    }
}
