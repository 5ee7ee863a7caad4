// moe_gemm_common.cu - what the fused MoE's two GEMM templates share:
// moe_marlin_gemm.cu (mma.sync) and moe_wgmma_gemm.cu (wgmma). The
// generator (gen/moe_cuda.c) writes the prelude (namespace w16cfg: every
// compile-time parameter, the kernel's name), then moe_pdl.cu and
// moe_quant.cu (element types, the Marlin family's addresses, the
// exponent trick, the activations), then this text, then one of the two
// templates. Here: the stage geometry both pipelines use, this operand's
// scale permutation, the cp.async wrappers, the dequantization of a code
// pair, the column of a CTA's tile, the epilogue that turns a CTA's C
// tile into the GEMM's output, and GEMM 1's split-K reduce kernel.

namespace w16 {

// ---- the stage geometry ----------------------------------------------------

constexpr int NTHREADS = 32 * WN * WK;
constexpr int TILES = BN / 64;            // Marlin tiles per CTA along N
constexpr int KSTEPS = BK / 16;           // k16 steps per stage
constexpr int TILE_WORDS = 32 * BITS;     // words per 16 x 64 tile
constexpr int TILE_VECS = TILE_WORDS / 4; // 16-byte vectors per tile
constexpr int LANE_VECS = BITS / 4;       // 16-byte vectors per lane
constexpr int A_CHUNKS = BK / 8;          // 16-byte chunks per A row
// rows of a stage's A tile and of the C tile: the CTA's BM, and (wgmma,
// TAIL_M) the tail rows of the expert's next block it may take
constexpr int ROWS = BM + TAIL_M;
constexpr int A_STAGE = ROWS * BK;        // activation elements per stage
constexpr int B_STAGE = KSTEPS * TILES * TILE_VECS; // vectors per stage
constexpr int C_LD = BN + 4;              // floats per row of the C tile
// Grouped scales (not act-order) travel with their stage: S_ROWS rows
// (the prelude's: the groups the stage's K range touches, at most BK/16
// as groups are multiples of 16), 64 scales (8 vectors) per tile and row.
constexpr int S_STAGE = S_ROWS * TILES * 8; // 16-byte vectors per stage
constexpr int STAGE_BYTES = A_STAGE * 2 + B_STAGE * 16 + S_STAGE * 16;
constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
constexpr int C_BYTES = ROWS * C_LD * 4;

static_assert(GEMM == 2 || GATED, "GEMM 1 fuses a gated activation");
static_assert(GEMM == 2 || GATED_ACTIVATION, "a gated activation");

// The scale permutation of this GEMM's operand (moe_quant.cu).
__device__ __forceinline__ int scale_pos(int n)
{
    return scale_pos_in<SCALE_LAYOUT>(n);
}

// ---- PTX wrappers ---------------------------------------------------------

__device__ __forceinline__ u32 smem_addr(const void *p)
{
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src,
                                           bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(n)
                 : "memory");
}
// 8 bytes (the split codes: cp.async.cg copies 16 bytes only)
__device__ __forceinline__ void cp_async8(void *dst, const void *src,
                                          bool valid)
{
    int n = valid ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// ---- dequantization --------------------------------------------------------

__device__ __forceinline__ act2_t codes_minus_zero(u32 v, act2_t zb)
{
    if constexpr (USE_MAGIC) {
        act2_t x = from_u32<act2_t>(v | (MAGIC_BITS << 16) | MAGIC_BITS);
        return __hsub2(x, zb);
    } else {
        float lo = (float)(int)(v & 0xffffu) - act::to_f(zb.x);
        float hi = (float)(int)(v >> 16) - act::to_f(zb.y);
        return act::pair(act::from_f(lo), act::from_f(hi));
    }
}

// m (codes - zero) for a 0/1 mask m, exact (the wgmma template's scales
// on the accumulators); nz = -m zb, computed once per group
__device__ __forceinline__ act2_t codes_minus_zero_masked(u32 v, act2_t m,
                                                          act2_t nz)
{
    if constexpr (USE_MAGIC) {
        act2_t x = from_u32<act2_t>(v | (MAGIC_BITS << 16) | MAGIC_BITS);
        return __hfma2(x, m, nz);
    } else {
        float lo = (float)(int)(v & 0xffffu) * act::to_f(m.x) +
                   act::to_f(nz.x);
        float hi = (float)(int)(v >> 16) * act::to_f(m.y) + act::to_f(nz.y);
        return act::pair(act::from_f(lo), act::from_f(hi));
    }
}

// (q - z) * s rounded once to the activation dtype (lo and hi: the
// scales of the pair's two codes).
template <typename S>
__device__ __forceinline__ act2_t apply_scale(act2_t d, S lo, S hi)
{
    if constexpr (SCALE_SAME) {
        return __hmul2(d, act::pair(lo, hi));
    } else {
        return act::pair(act::from_f(act::to_f(d.x) * lo),
                         act::from_f(act::to_f(d.y) * hi));
    }
}

// Column of the first code of CTA tile tt, or -1 past the end of its piece.
__device__ __forceinline__ int tile_col(int tt, int ncol, int N, int ip)
{
    if constexpr (GATED) {
        constexpr int HALF = TILES > 1 ? TILES / 2 : 1; // (GATED: TILES even)
        int local = ncol * (BN / 2) + (tt % HALF) * 64;
        return local < ip ? (tt / HALF) * ip + local : -1;
    } else {
        int c = ncol * BN + tt * 64;
        return c < N ? c : -1;
    }
}

// ---- the stage loads ------------------------------------------------------

// Grouped scales (not act-order) travel with their stage (S_STAGE).
constexpr bool SMEM_SCALES = GROUPED && !ACT_ORDER;
// The thread's share of every stage's loads, computed once per CTA
// (stage_plan), then one stage's cp.async copies (stage_copy). A: chunk
// i = tid + q * NTHREADS of the ROWS x BK tile, its 16-byte chunks
// XOR-swizzled by row % 8; rows of padding (no routed slot) are zeroed
// once in every stage buffer and never loaded. B: vector i of the stage's
// tiles, as an offset from the stage's first k16 row (-1: a tile past the
// end of N or IP). Grouped scales (not act-order): the stage's rows.
constexpr int A_PER = (ROWS * A_CHUNKS + NTHREADS - 1) / NTHREADS;
constexpr int B_PER = B_STAGE / NTHREADS;
static_assert(B_STAGE % NTHREADS == 0, "B vectors per thread");

__device__ __forceinline__ void stage_plan(
    const act_t *(&a_src)[A_PER], int (&a_dst)[A_PER], int (&b_off)[B_PER],
    const act_t *a, int a_row_div, int K, const int *s_rows, act_t *sA,
    int tid, int ncol, int N, int ip, size_t tiles_n)
{
#pragma unroll
    for (int q = 0; q < A_PER; q++) {
        int i = tid + q * NTHREADS, r = i / A_CHUNKS, c = i % A_CHUNKS;
        int t = i < ROWS * A_CHUNKS ? s_rows[r] : -1;
        a_src[q] = t >= 0 ? a + (size_t)(t / a_row_div) * K + c * 8 : nullptr;
        a_dst[q] = r * BK + ((c ^ (r % 8)) * 8);
    }
#pragma unroll
    for (int q = 0; q < B_PER; q++) {
        int i = tid + q * NTHREADS;
        int v = i % TILE_VECS, rest = i / TILE_VECS;
        int tt = rest % TILES, ks = rest / TILES;
        int col = tile_col(tt, ncol, N, ip);
        b_off[q] = col >= 0 ? (int)((ks * tiles_n + col / 64) * TILE_VECS + v)
                            : -1;
    }
    for (int i = tid; i < STAGES * ROWS * A_CHUNKS; i += NTHREADS) {
        int r = (i / A_CHUNKS) % ROWS;
        if (s_rows[r] < 0)
            reinterpret_cast<int4 *>(sA)[i] = make_int4(0, 0, 0, 0);
    }
}

// The A rows for k in [it*BK, +BK) into stage `slot` (planned rows only:
// padding rows stay zero).
__device__ __forceinline__ void stage_copy_a(int it, int slot,
                                             const act_t *const (&a_src)[A_PER],
                                             const int (&a_dst)[A_PER],
                                             act_t *sA)
{
    const int k0 = it * BK;
    act_t *dA = sA + slot * A_STAGE;
#pragma unroll
    for (int q = 0; q < A_PER; q++)
        if (a_src[q])
            cp_async16(dA + a_dst[q], a_src[q] + k0, true);
}

// A rows, B tiles (and scales) for k in [it*BK, +BK) into stage `slot`.
__device__ __forceinline__ void stage_copy(
    int it, int slot, const act_t *const (&a_src)[A_PER],
    const int (&a_dst)[A_PER], const int (&b_off)[B_PER], act_t *sA,
    int4 *sB, int4 *sS, const int4 *qw_e, const int4 *qweight,
    const scale_t *sc_e, const scale_t *scales, size_t tiles_n, int tid,
    int ncol, int N, int ip, int group_size)
{
    const int k0 = it * BK;
    stage_copy_a(it, slot, a_src, a_dst, sA);
    int4 *dB = sB + slot * B_STAGE;
    const int4 *qs = qw_e + (size_t)(k0 / 16) * tiles_n * TILE_VECS;
    if constexpr (SPLIT_CODES) {
        // 4-bit, the wgmma template's warps of half h read words 2h, 2h+1
        // of each lane's vector: half h of vector v (lane v) of step ks,
        // tile tt goes to 8-byte piece ks % 2 of vector v of block
        // (ks / 2, tt, h), so that a warp reads one whole 16-byte vector a
        // lane for two k16 steps (no bank conflict)
        int2 *dB2 = reinterpret_cast<int2 *>(dB);
#pragma unroll
        for (int q = 0; q < B_PER; q++) {
            const int i = tid + q * NTHREADS, v = i % TILE_VECS;
            const int rest = i / TILE_VECS, tt = rest % TILES,
                      ks = rest / TILES;
            const int2 *src = reinterpret_cast<const int2 *>(
                b_off[q] >= 0 ? qs + b_off[q] : qweight);
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                cp_async8(dB2 + ((((ks / 2) * TILES + tt) * 2 + hh) *
                                     TILE_VECS + v) * 2 + ks % 2,
                          src + hh, b_off[q] >= 0);
        }
    } else {
#pragma unroll
        for (int q = 0; q < B_PER; q++)
            cp_async16(dB + tid + q * NTHREADS,
                       b_off[q] >= 0 ? qs + b_off[q] : qweight,
                       b_off[q] >= 0);
    }
    if constexpr (SMEM_SCALES) { // row r = group k0/group_size + r
        int4 *dS = sS + slot * S_STAGE;
        const int g0 = k0 / group_size;
        const int rows = (k0 + BK - 1) / group_size - g0 + 1;
        for (int i = tid; i < rows * TILES * 8; i += NTHREADS) {
            int v = i % 8, rest = i / 8, tt = rest % TILES, r = rest / TILES;
            int col = tile_col(tt, ncol, N, ip);
            const int4 *src =
                col >= 0 ? reinterpret_cast<const int4 *>(
                               sc_e + (size_t)(g0 + r) * N + col) + v
                         : reinterpret_cast<const int4 *>(scales);
            cp_async16(dS + i, src, col >= 0);
        }
    }
}

// ---- the epilogue -----------------------------------------------------------

// The CTA's C tile (nrows rows, ROWS unless the wgmma template's
// persistent CTAs pass their tile in row chunks, x BN columns of float32
// in shared memory, row r = routed slot s_rows[r], -1 for padding) to the
// GEMM's output:
//   split-K (splits > 1): a float32 partial sum, scaled when channelwise,
//     with the bias in split 0 only, to this split's slab;
//   GEMM 1: the first BN/2 columns are gate, the last BN/2 the matching up
//     columns: scale, bias, optional rounding, the activation, rounded to
//     the activation dtype: out [slots][IP];
//   GEMM 2: scale, bias, optional rounding, float32: out [slots][N].
__device__ __forceinline__ void store_c_tile(
    const float *cs, const int *s_rows, int tid, int e, int ncol, int split,
    int splits, int N, int ip, int n_slots, const scale_t *sc_e,
    const bias_t *bias, void *out, int round_out, float limit, float alpha,
    float beta, int nrows = ROWS)
{
    const bias_t *bias_e = (bias && split == 0) ? bias + (size_t)e * N
                                                : nullptr;
    if (splits > 1) {
        const int W = GATED ? 2 * ip : N;
        float *o = static_cast<float *>(out) + (size_t)split * n_slots * W;
        constexpr int OUTW = GATED ? BN / 2 : BN;
        for (int i = tid; i < nrows * BN; i += NTHREADS) {
            int r = i / BN, c = i % BN, t = s_rows[r];
            int n = GATED ? ncol * OUTW + c % OUTW : ncol * BN + c;
            if (t < 0 || n >= (GATED ? ip : N))
                continue;
            int col = GATED ? (c < OUTW ? n : ip + n) : n;
            float y = cs[r * C_LD + c];
            if constexpr (!GROUPED)
                y *= sca::to_f(sc_e[scale_pos(col)]);
            if (bias_e)
                y += bia::to_f(bias_e[bias_pos(col)]);
            o[(size_t)t * W + col] = y;
        }
        return;
    }
    // The output of one C element (GEMM 1: a gate and up pair): the same
    // operations in the same order on either path below.
    auto gate_up = [&](float hg, float hu, int n) {
        if constexpr (!GROUPED) {
            hg *= sca::to_f(sc_e[scale_pos(n)]);
            hu *= sca::to_f(sc_e[scale_pos(ip + n)]);
        }
        if (bias_e) {
            hg += bia::to_f(bias_e[bias_pos(n)]);
            hu += bia::to_f(bias_e[bias_pos(ip + n)]);
        }
        if (round_out) {
            hg = round_act(hg);
            hu = round_act(hu);
        }
        return act::from_f(activation(hg, hu, limit, alpha, beta));
    };
    auto finish_y = [&](float y, int n) {
        if constexpr (!GROUPED)
            y *= sca::to_f(sc_e[scale_pos(n)]);
        if (bias_e)
            y += bia::to_f(bias_e[bias_pos(n)]);
        if (round_out)
            y = round_act(y);
        return y;
    };
    // Vectors: a thread takes 4 consecutive columns of a row, 16-byte
    // reads of the C tile and one 8-byte (GEMM 1) or 16-byte (GEMM 2)
    // store, where the row width keeps every vector whole and the output
    // is 16-byte aligned (the runtime's buffers are); the other problems
    // keep one element a thread. With one element a thread (2- or 4-byte
    // stores, one dependent chain at a time) a quarter of the wgmma GEMM
    // 1's stall samples at Qwen3-30B-A3B M = 4096 fell in this epilogue
    // (ncu); vectors took that layer from 1062 to 965 us on the H200.
    // Eight columns and 16-byte stores in GEMM 1 made ptxas spill 72
    // instead of 24 bytes in the mma.sync block_m 24 kernel (Mixtral-8x7B
    // M = 64 6% slower).
    const bool vec = (size_t)out % 16 == 0 && (GEMM == 1 ? ip : N) % 4 == 0;
    if constexpr (GEMM == 1) {
        act_t *o = static_cast<act_t *>(out);
        constexpr int OUTW = BN / 2;
        if (vec) {
            constexpr int VW = OUTW / 4; // vectors a row
            for (int i = tid; i < nrows * VW; i += NTHREADS) {
                int r = i / VW, c = (i % VW) * 4, t = s_rows[r];
                int n = ncol * OUTW + c;
                if (t < 0 || n >= ip)
                    continue;
                const float4 g =
                    *reinterpret_cast<const float4 *>(cs + r * C_LD + c);
                const float4 u = *reinterpret_cast<const float4 *>(
                    cs + r * C_LD + OUTW + c);
                const u32 w0 = as_u32(act::pair(gate_up(g.x, u.x, n),
                                                gate_up(g.y, u.y, n + 1)));
                const u32 w1 = as_u32(act::pair(gate_up(g.z, u.z, n + 2),
                                                gate_up(g.w, u.w, n + 3)));
                *reinterpret_cast<uint2 *>(o + (size_t)t * ip + n) =
                    make_uint2(w0, w1);
            }
            return;
        }
        for (int i = tid; i < nrows * OUTW; i += NTHREADS) {
            int r = i / OUTW, c = i % OUTW, t = s_rows[r];
            int n = ncol * OUTW + c;
            if (t < 0 || n >= ip)
                continue;
            o[(size_t)t * ip + n] =
                gate_up(cs[r * C_LD + c], cs[r * C_LD + OUTW + c], n);
        }
    } else {
        float *o = static_cast<float *>(out);
        if (vec) {
            constexpr int VW = BN / 4;
            for (int i = tid; i < nrows * VW; i += NTHREADS) {
                int r = i / VW, c = (i % VW) * 4, t = s_rows[r];
                int n = ncol * BN + c;
                if (t < 0 || n >= N)
                    continue;
                float4 y = *reinterpret_cast<const float4 *>(cs + r * C_LD + c);
                y.x = finish_y(y.x, n);
                y.y = finish_y(y.y, n + 1);
                y.z = finish_y(y.z, n + 2);
                y.w = finish_y(y.w, n + 3);
                *reinterpret_cast<float4 *>(o + (size_t)t * N + n) = y;
            }
            return;
        }
        for (int i = tid; i < nrows * BN; i += NTHREADS) {
            int r = i / BN, c = i % BN, t = s_rows[r];
            int n = ncol * BN + c;
            if (t < 0 || n >= N)
                continue;
            o[(size_t)t * N + n] = finish_y(cs[r * C_LD + c], n);
        }
    }
}

// The activation of GEMM 1's gate and up sums over `splits` slabs of
// partial sums (g: the gate column of the first slab; the up column is ip
// further), added in the order s = 0, 1, ... with eight splits' loads in
// flight (sixteen would take 64 registers, half the reduce kernel's CTAs
// an SM). __ldcg: the slabs were written by other CTAs of this kernel or
// by the kernel before, never read here before. Shared by the reduce
// kernel and splitk_fixup, so both give the same bits.
__device__ __forceinline__ act_t split_sums_act(const float *g, int splits,
                                                size_t slab, int ip,
                                                int round_out, float limit,
                                                float alpha, float beta)
{
    float hg = 0.0f, hu = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += 8) {
        float xg[8], xu[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (s0 + u < splits) {
                xg[u] = __ldcg(g + (size_t)(s0 + u) * slab);
                xu[u] = __ldcg(g + (size_t)(s0 + u) * slab + ip);
            }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (s0 + u < splits) {
                hg += xg[u];
                hu += xu[u];
            }
    }
    if (round_out) {
        hg = round_act(hg);
        hu = round_act(hu);
    }
    return act::from_f(activation(hg, hu, limit, alpha, beta));
}

// GEMM 1's split-K sums in the GEMM itself (the mma.sync template, when
// the host passes tile_sem): after a CTA has written its partial slab, it
// counts itself on its tile's semaphore; the CTA that counts last adds the
// tile's `splits` slabs in the order s = 0, 1, ... (the reduce kernel's
// order, so the bits are the same), rounds, activates and writes
// act_out [slots][IP], then sets the semaphore back to zero for the next
// run (nothing else touches it in this one). That saves the reduce
// kernel's launch and its wait between the GEMMs (the latency of the
// small-M chain). Integer atomics only: the sums keep a fixed order.
__device__ __forceinline__ void splitk_fixup(
    const int *s_rows, int tid, int ncol, int tile, int splits, int ip,
    int n_slots, const float *part, act_t *act_out, int *tile_sem,
    int round_out, float limit, float alpha, float beta)
{
    // the flag in the (dynamic) shared memory the epilogue is done with: a
    // static __shared__ int cost a third of the CTAs an SM their room at
    // block_m 16 (64 -> 80 bytes of static shared memory: the layer 15-20%
    // slower, Mixtral-8x7B M = 16 218.7 -> 252.8 us, also where no split
    // ran)
    extern __shared__ int4 smem4[];
    int &s_last = *reinterpret_cast<int *>(smem4);
    __threadfence(); // this CTA's partial sums, before it counts itself
    __syncthreads();
    if (tid == 0) {
        const int prev = atomicAdd(tile_sem + tile, 1);
        s_last = prev == splits - 1;
        if (prev == splits - 1)
            tile_sem[tile] = 0;
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence(); // the other splits' sums, after their counts
    const size_t slab = (size_t)n_slots * 2 * ip;
    constexpr int OUTW = BN / 2;
    for (int i = tid; i < BM * OUTW; i += NTHREADS) {
        int r = i / OUTW, c = i % OUTW, t = s_rows[r];
        int n = ncol * OUTW + c;
        if (t < 0 || n >= ip)
            continue;
        act_out[(size_t)t * ip + n] = split_sums_act(
            part + (size_t)t * 2 * ip + n, splits, slab, ip, round_out, limit,
            alpha, beta);
    }
}

} // namespace w16

// The GEMM kernel's parameters: the launch contract with
// runtime/cuda/cuda_moe.c, one list for both templates (expanded after
// `using namespace w16`).
#define W16_GEMM_PARAMS                                                      \
    const act_t *__restrict__ a, int a_row_div, int n_slots,                 \
        const int *__restrict__ sorted_ids,                                  \
        const int *__restrict__ expert_ids,                                  \
        const int *__restrict__ num_post, const int4 *__restrict__ qweight,  \
        const scale_t *__restrict__ scales, const u32 *__restrict__ qzeros,  \
        const bias_t *__restrict__ bias, const int *__restrict__ g_idx,      \
        void *__restrict__ out, int N, int K, int G, int group_size, int ip, \
        float limit, float alpha, float beta, int round_out, int splits,     \
        act_t *__restrict__ act_out, int *__restrict__ tile_sem,           \
        const int *__restrict__ topk_ids, const int *__restrict__ expert_map, \
        int n_ids, int *__restrict__ err

#ifdef W16_REDUCE
using namespace w16;
// GEMM 1 after split-K: for every routed slot (the padded order's
// sorted_ids) and output column n < IP, the gate and up sums over the
// splits in order s = 0, 1, ..., optional rounding, the activation, the
// activation-dtype result: out [slots][IP].
// The routing (num_post, sorted_ids) is two kernels back, so it is read
// before the wait (templates/moe_pdl.cu): a thread's first position and
// slot are known when GEMM 1 completes, and what is left after the wait
// is the partial sums' loads (eight splits in flight) and a store.
// Padded positions hold the sentinel n_slots, so they are skipped.
extern "C" __global__ void __launch_bounds__(256)
W16_REDUCE(const float *__restrict__ part, int n_slots, int ip, int splits,
           const int *__restrict__ sorted_ids,
           const int *__restrict__ num_post, act_t *__restrict__ out,
           int round_out, float limit, float alpha, float beta)
{
    const size_t total = (size_t)*num_post * ip;
    const size_t slab = (size_t)n_slots * 2 * ip;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int t = i < total ? sorted_ids[i / ip] : -1;
    w16_pdl_enter(); // GEMM 1 wrote part
    for (bool first = true; i < total; i += stride, first = false) {
        if (!first)
            t = sorted_ids[i / ip];
        if (t < 0 || t >= n_slots)
            continue;
        const int n = (int)(i % ip);
        out[(size_t)t * ip + n] =
            split_sums_act(part + (size_t)t * 2 * ip + n, splits, slab, ip,
                           round_out, limit, alpha, beta);
    }
}
#endif
