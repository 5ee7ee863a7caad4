// moe_marlin_gemm.cu - the tensor-core GEMM of the fused MoE over Marlin
// layouts (mma.sync m16n8k16, sm_80 and later). One translation unit is
// this text preceded by the prelude that gen/moe_cuda.c writes: the
// namespace w16cfg with every compile-time parameter and the kernel's
// name, W16_KERNEL. Nothing here is pasted from a spec: the specializer
// proves, on the bound problem, that the spec's layouts are the ones the
// address functions below read (see gen/moe_cuda.c, "contract").
//
// What one launch computes: rows are routed slots (token t routed to
// expert e), sorted and padded per expert into blocks of BM rows by the
// routing kernels (or, SELF_ROUTE at most 32 slots, by each CTA for its
// own block: moe_route_warp.cu); block b of rows belongs to expert
// expert_ids[b]. Each
// CTA computes BM rows x BN columns of  A[rows] . W_e^T  over all of K, in
// fp32 on tensor cores, then runs the epilogue:
//   GEMM 1 (w13): gate and up columns of the same output i sit in one CTA
//     (the CTA's first BN/2 columns are gate, the last BN/2 the matching
//     up columns); it applies the channelwise scale, the bias, optional
//     rounding, the activation, and writes act(h_i, h_{IP+i}) rounded to
//     the activation dtype: out [slots][IP];
//   GEMM 2 (w2): scale, bias, optional rounding; writes y in float32:
//     out [slots][N]. The top-k weighting and the sum over top-k happen
//     in the finalize kernel (moe_aux.cu), in a fixed order: no atomics.
//
// Split-K (splits > 1, for small M, where row blocks x column tiles are
// too few CTAs to keep every SM's loads in flight): CTA split s of a tile
// computes the K stages [s*iters/splits, (s+1)*iters/splits) and writes
// its float32 partial sum, scaled (channelwise) and with the bias in
// split 0 only, to its own slab: out + s * slots * (N or 2*IP). Nothing
// is rounded or activated there; the sums over splits happen in a fixed
// order (deterministic, no float atomics): GEMM 1's in the GEMM's last
// split of each tile when the host passes tile_sem (splitk_fixup,
// moe_gemm_common.cu), else in W16_REDUCE (then rounding and the
// activation); GEMM 2's in the finalize kernel.
//
// Weights. Each expert is (K/16) x (N/64) Marlin tiles of 16(k) x 64(n)
// codes, TILE_WORDS = 32*BITS int32 words per tile, tile rows contiguous.
// Lane l of a warp owns words [l*BITS/4 .. ) of a tile: one 16-byte load
// (4-bit) or two (8-bit). With g = l/4 and q = l%4, those words hold the
// codes of rows 2q, 2q+1, 2q+8, 2q+9 and columns 8j + g, j = 0..7, which
// is exactly the B operand of mma.m16n8k16 for the tile's eight n8 blocks:
//   b0 = (k = 2q, 2q+1), b1 = (k = 2q+8, 2q+9), n = g of block j.
//   4-bit: word j/2; nibbles (p, p+4) are the pair p, p = 2*(j%2) for b0
//          and p+1 for b1: nibble p is at bits 4p, nibble p+4 at 16+4p,
//          so (w >> 4p) & 0x000f000f puts both codes in one 16-bit lane
//          each (low lane = the even k, as the mma fragment wants).
//   8-bit: word j; bytes 0,2 are b0 (rows 2q, 2q+1), bytes 1,3 are b1.
// A code pair becomes two exact values (q - z) in the activation dtype by
// the exponent trick (fp16: 0x6400 | q = 1024 + q; bf16: 0x4300 | q =
// 128 + q, exact for q < 128; bf16 8-bit codes go through float), then a
// correctly rounded product with the scale when grouped. Small-M tiles
// defer grouped scales instead (DEFER below): the mma takes (q - z), and
// each group's float32 sum is scaled once. Channelwise scales (one group)
// multiply the float32 accumulator in the epilogue.
//
// Activations. The A tile (BM rows x BK) is copied to shared memory with
// cp.async (16 bytes per thread; padding rows are zeroed once per stage
// buffer and never loaded), its 16-byte chunks XOR-swizzled by row so that
// ldmatrix.x4 reads are conflict-free. A pipeline of STAGES such A and B
// tiles (and, for grouped scales, the stage's rows of scales) hides the
// loads; every thread computes its load addresses once per CTA, so a
// stage costs one add per 16-byte copy (the dequantizing loop is
// instruction-bound at small M: under ncu, Mixtral-8x7B M = 16, issue
// slots 58.5% busy, the ALU pipe 48.6%, 3% of the stalls on memory).
//
// Warps. WN x WK warps: warp (wn, wk) computes tiles [wn*NT, wn*NT + NT)
// of the CTA over the k16 steps [wk*KS, wk*KS + KS) of every stage; the
// WK partial sums are added in shared memory in the order wk = 0, 1, ...
// (deterministic), then the epilogue reads them back row-major so that
// stores are coalesced.

// moe_gemm_common.cu precedes this text: the stage geometry (NTHREADS,
// TILES, KSTEPS, ..., C_BYTES), element types, addresses, cp.async,
// dequantization, activations, the epilogue and the split-K reduce.

namespace w16 {

// ---- derived constants and the checks the specializer relies on ----------

// block_m 8 and 24 swap the mma's operands (below): their row blocks are
// n8 blocks of the mma; the others' are m16 blocks
constexpr bool SWAP = BM % 16 == 8;
constexpr int MB = SWAP ? BM / 8 : (BM + 15) / 16; // row blocks per CTA
constexpr int NT = TILES / WN;            // tiles per warp
constexpr int KS = KSTEPS / WK;           // k16 steps per warp and stage
constexpr int NEED_BYTES = PIPE_BYTES > C_BYTES ? PIPE_BYTES : C_BYTES;
// block_m 8 (up to 4 routed rows an expert on average, 8 a block)
// swaps the mma's operands: the B fragments of n8 blocks 2jp and 2jp+1
// are, register for register, the A fragment of their 16 columns of W^T
// (a0 = b0(2jp), a1 = b0(2jp+1), a2 = b1(2jp), a3 = b1(2jp+1)), and the 8
// rows' activations are the n8 operand (ldmatrix.x2: b0, b1), so an mma
// computes C^T, 16 columns x 8 rows: half the mma and accumulators of an
// m16 tile with 8 rows of zeros, the codes read as before. A stage holds
// 8 A rows, so three stages of 256 columns fit four CTAs an SM (56.8 KB;
// bench/bench_stream_cuda.c: the read pattern alone streams 15-30% faster
// at four CTAs an SM than at three). block_m 24 is three such n8 blocks
// of rows: three mma a pair of n8 code blocks where block_m 32's two m16
// blocks take four, for the experts of 9-24 rows that would otherwise pad
// to 32 (at two CTAs an SM the GEMM is latency-bound there and the tensor
// pipe its busiest, 47.6% at block_m 32: Mixtral-8x7B M = 64 went from
// 310.9 to 280.6 us).
constexpr int JN = SWAP ? 4 : 8; // accumulator tiles per 64-column tile
constexpr int ACC_REGS = MB * NT * JN * 4; // floats of acc a thread
// Rows of per-k-row scale caches: act-order gives each of a thread's four
// k rows (2q, 2q+1, 2q+8, 2q+9) its own group; otherwise a k16 step lies
// in one group (group sizes are multiples of 16).
constexpr int SROWS = (ACT_ORDER && GROUPED) ? 4 : 1;

static_assert(BM == 8 || BM == 24 || (BM % 16 == 0 && BM >= 16 && BM <= 64),
              "block_m");
static_assert(BN % 64 == 0 && TILES % WN == 0, "block_n and warps_n");
static_assert(BK % 64 == 0 && KSTEPS % WK == 0, "block_k and warps_k");
static_assert(!GATED || (TILES % 2 == 0 && NT <= TILES / 2 &&
                         (TILES / 2) % NT == 0), "gated: gate and up tiles");
static_assert(ACC_REGS <= 128, "accumulators: at most 128 floats a thread");
static_assert(STAGES >= 2 && STAGES <= 8, "pipeline depth");
static_assert(NTHREADS <= 512, "threads per CTA");
static_assert(SMEM_BYTES == NEED_BYTES, "shared memory size (prelude)");

// ---- PTX wrappers ---------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x2(u32 &r0, u32 &r1, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(smem_addr(p))
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, "
                 "[%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// D = A * B + D
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4],
                                         u32 b0, u32 b1)
{
    mma16816_c(d, a, b0, b1, d[0], d[1], d[2], d[3]);
}
// D = A * B (a zero C operand)
__device__ __forceinline__ void mma16816_zc(float (&d)[4], const u32 (&a)[4],
                                            u32 b0, u32 b1)
{
    mma16816_c(d, a, b0, b1, 0.0f, 0.0f, 0.0f, 0.0f);
}

// ---- dequantization (codes_minus_zero, apply_scale: common) ---------------

// (a & b) | c in one instruction: a 16-bit lane's code under the exponent
// (b the code mask, c the MAGIC bits of both lanes).
template <u32 B, u32 C> __device__ __forceinline__ u32 lop3_and_or(u32 a)
{
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(B), "n"(C));
    return d;
}

// Deferred scales (DEFER, the small-M kernels): the B operand is the exact
// (q - z) alone, so the inner loop per code pair is one shift (often
// none), one lop3 and one subtraction (fp16 4-bit: one shift per word);
// the products of a group are summed in float32 (pacc) and multiplied by
// the group's scales once per group and column when the group ends. The
// result is the exact scaled product summed in float32 (no rounding of
// (q - z) * s to the activation dtype in between). It needs a second set of
// accumulators (ACC_REGS more registers), so it is for the tiles
// whose launch bounds leave room for them (small M: 64 floats), grouped
// scales staged with the pipeline (not act-order) and the exponent trick;
// the other kernels multiply the scale into B as before.
constexpr int REG_CAP = 65536 / (NTHREADS * MIN_CTAS) < 255
                            ? 65536 / (NTHREADS * MIN_CTAS) : 255;
// (zero points keep 8 more words a tile for the group: without room for
// them ptxas spills, so those tiles keep the scales in B)
constexpr bool DEFER = !SCALES_IN_B && SMEM_SCALES && USE_MAGIC &&
                       ACC_REGS <= 64 &&
                       2 * ACC_REGS + 64 + (ZP ? 16 * NT : 0) <= REG_CAP;
constexpr u32 MAGIC2 = MAGIC_BITS | (MAGIC_BITS << 16);
// the symmetric zero point 2^(BITS-1) under the exponent, both lanes
constexpr u32 ZSYM2 = MAGIC2 | ((1u << (BITS - 1)) * 0x00010001u);
// fp16 4-bit: the pair of codes at bits 4-7 lands as 1024 + 16 q, and
// (1024 + 16 q) / 16 - (64 + z) = q - z exactly in one fma, so a word
// needs one shift (by 8) for its four pairs; bf16 has no mantissa bit for
// 16 q and shifts each pair down.
constexpr bool FP16_HI = DEFER && !ACT_BF16 && BITS == 4 && !ZP;
// GEMM 2 issues its first stages' weight loads before griddepcontrol.wait
// (templates/moe_pdl.cu), so that under programmatic dependent launch they
// overlap the tail of the kernel ahead of it (GEMM 1 or its split-K
// reduce): at small M a CTA's K range is a few stages, mostly this
// prologue. The routing it reads first was written before that kernel.
constexpr bool EARLY_B = GEMM == 2;
// The group size is a constant of the unit (GS, the generator's
// cfg.group_size) where grouped scales travel with the stages: a stage then
// holds BK / GS whole groups or lies inside one group, so its rows of
// scales and every group check are shifts and constants. (A run-time
// group size cost three divisions a stage, then a multiply-high each, in
// every thread right after the barrier, in a loop bound by what it
// issues: Mixtral-8x7B M = 16's w13 kernel ran 29.4 instructions a word of
// codes, 23.5 with this, the in-place sources and the cheaper flush.)
static_assert(!SMEM_SCALES || (GS >= 16 && GS % 16 == 0 &&
                               (GS % BK == 0 || BK % GS == 0)),
              "grouped scales: the unit's group size divides BK or BK it");
constexpr int GSZ = SMEM_SCALES ? GS : BK;
constexpr bool STAGE_GROUPS = SMEM_SCALES && GSZ % BK == 0; // whole stages
constexpr int SGROUPS = STAGE_GROUPS ? 1 : BK / GSZ; // scale rows a stage
static_assert(S_ROWS == (SMEM_SCALES ? SGROUPS : 0),
              "the stage's rows of scales (the host's S_ROWS)");
// the group of a stage's first k, of k itself
__device__ __forceinline__ int stage_group(int it)
{
    return STAGE_GROUPS ? it / (GSZ / BK) : it * (BK / GSZ);
}
__device__ __forceinline__ int group_of(int k) { return k / GSZ; }
// Deferred scales with one group a stage: each warp's first k16 step of a
// stage starts its partial sums with a zero C operand, so a group's flush
// does not zero them (16 instructions a warp and stage).
constexpr bool ZERO_C = DEFER && STAGE_GROUPS && GSZ == BK;
// Deferred scales, bf16, symmetric: the mma takes the codes as they come
// out of the exponent trick, 128 + q, exact, and the group's offset is
// taken out once, in float32, when the group is flushed:
//   sum_k a_k (q_k - 8) = sum_k a_k (128 + q_k) - 136 sum_k a_k,
// with sum_k a_k, the A rows' sums over the warp's k16 steps of the group,
// from one more mma a step against a B of ones (columns all equal). That
// trades four subtractions a word (16 a step and tile) for one mma a step
// and an fma per accumulator a group. The products are exact either way;
// the float32 sums carry about 17 times the magnitude before the
// subtraction, about 4 of float32's 24 bits. One block of rows only: at
// two m16 blocks (block_m 32, 254 registers) the extra mma and sums
// measured 1.6% slower, and at three n8 blocks (block_m 24: three more
// mma a step on twelve) 4.5-7% slower, the mma pipe being the busiest
// there; at block_m 8 (one more on four) it is even with the subtractions.
constexpr bool FOLD = DEFER && ACT_BF16 && !ZP && MB == 1;
constexpr float FOLD_ZB = MAGIC + (float)(1 << (BITS - 1)); // 136: 4-bit

// The 16 scales of a thread's accumulator columns in one 64-column tile
// (`tile`: the tile's 64 scales of one group in shared memory, in the
// spec's order): out[j][c] is the scale of column 8j + 2*tig + c, c = 0, 1,
// read as two 16-byte vectors (the order puts them in 8-element runs)
// instead of 16 two-byte loads.
__device__ __forceinline__ void acc_scales(const scale_t *tile, int tig,
                                           float (&out)[8][2])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        // SCALE_LAYOUT 0: scale_pos(8j + 2tig + c) = 8 (2tig + c) + j;
        // 1: 32 (j / 4) + 8 tig + 2 (j % 4) + c
        const int off = SCALE_LAYOUT == 0 ? 8 * (2 * tig + h) : 32 * h + 8 * tig;
        int4 x = *reinterpret_cast<const int4 *>(tile + off);
        const scale_t *v = reinterpret_cast<const scale_t *>(&x);
        const u32 xw[4] = {(u32)x.x, (u32)x.y, (u32)x.z, (u32)x.w};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            // bf16 is the high half of a float: one shift or mask a scale
            float f = SCALE_BF16 ? __uint_as_float(e % 2 ? xw[e / 2] & 0xffff0000u
                                                         : xw[e / 2] << 16)
                                 : sca::to_f(v[e]);
            if (SCALE_LAYOUT == 0)
                out[e][h] = f;
            else
                out[4 * h + e / 2][e % 2] = f;
        }
    }
}

// The 8 scales of a thread's B columns 8j + gid in one tile (the scales
// multiplied into B): scale_pos(8j + gid) = 8 gid + j (layout 0), or
// 32 (j / 4) + 8 (gid / 2) + 2 (j % 4) + gid % 2 (layout 1).
__device__ __forceinline__ void b_scales(const scale_t *tile, int gid,
                                         scale_t (&out)[8])
{
    if constexpr (SCALE_LAYOUT == 0) {
        int4 x = *reinterpret_cast<const int4 *>(tile + 8 * gid);
        const scale_t *v = reinterpret_cast<const scale_t *>(&x);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[j] = v[j];
    } else {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int4 x = *reinterpret_cast<const int4 *>(tile + 32 * h +
                                                      8 * (gid / 2));
            const scale_t *v = reinterpret_cast<const scale_t *>(&x);
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                out[4 * h + jj] = v[2 * jj + gid % 2];
        }
    }
}

} // namespace w16

using namespace w16;

// MIN_CTAS: the tiling row's min_ctas, so that registers leave room for
// that many CTAs per SM (occupancy hides the shared-memory and tensor-core
// latencies of the dequantizing inner loop).
extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_CTAS)
W16_KERNEL(W16_GEMM_PARAMS)
{
    extern __shared__ int4 smem4[];
    __shared__ int s_rows[BM];

    // CTA -> (row block, column tile); columns vary fastest so that CTAs
    // running together share the row block's activations.
    // Split-K parts of one tile are adjacent, then the column tiles.
    const int ncta = GATED ? (ip + BN / 2 - 1) / (BN / 2) : (N + BN - 1) / BN;
    const int split = blockIdx.x % splits, tile = blockIdx.x / splits;
    const int mblk = tile / ncta, ncol = tile % ncta;
    // GEMM 1 follows the routing: it waits before reading it. GEMM 2 reads
    // the routing and its weights before its wait (EARLY_B, moe_pdl.cu):
    // the routing kernels finished before the kernel ahead of it started.
    if constexpr (!EARLY_B)
        w16_pdl_enter(); // routing wrote num_post, expert_ids, sorted_ids
    // A CTA without rows returns; in GEMM 2 at once, but CTA 0 only
    // after the wait, so that GEMM 2 cannot complete, and let the
    // finalize and the next run's routing go, while the kernel ahead of
    // it still reads the routing (moe_pdl.cu). The host's grid covers the
    // most row blocks any routing fills, most of them empty at small M,
    // and an empty CTA that waited held its SM slot until GEMM 1 ended.
    int e;
    if constexpr (SELF_ROUTE) {
        // The CTA's own routing of the top-k ids (the host's choice at
        // most 32 routed slots, and then it launches no routing kernel):
        // route_small's order (moe_route_warp.cu). Every warp routes (the
        // ids and map entries are L1 hits after the first), so every
        // thread holds the block's expert and the order's length without
        // a barrier; warp 0 writes the block's rows. GEMM 1's CTA 0
        // records a bad id as the routing kernel would; GEMM 2 reads the
        // ids before its wait (the layer's input, written before GEMM 1
        // started: moe_pdl.cu).
        const int lane = threadIdx.x % 32;
        const int le = lane < n_slots
            ? slot_expert(topk_ids, lane, expert_map, n_ids, err,
                          GEMM == 1 && blockIdx.x == 0 && threadIdx.x < 32)
            : -1;
        const warp_route r = route_warp(le, BM);
        const int b0 = mblk * BM;
        const unsigned hit = __ballot_sync(
            0xffffffffu,
            r.padded > 0 && r.start <= b0 && b0 < r.start + r.padded);
        e = hit ? __shfl_sync(0xffffffffu, le, __ffs(hit) - 1) : -1;
        if (threadIdx.x < 32) {
            for (int q = threadIdx.x; q < BM; q += 32)
                s_rows[q] = -1;
            __syncwarp();
            if (le >= 0 && r.pos / BM == mblk)
                s_rows[r.pos % BM] = threadIdx.x;
        }
        if (b0 >= r.used || e < 0) {
            if (EARLY_B && blockIdx.x == 0)
                w16_pdl_wait();
            return;
        }
    } else {
        if (mblk * BM >= *num_post || expert_ids[mblk] < 0) {
            if (EARLY_B && blockIdx.x == 0)
                w16_pdl_wait();
            return;
        }
        e = expert_ids[mblk];
    }

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wn = warp % WN, wk = warp / WN;
    const int gid = lane / 4, tig = lane % 4;

    if constexpr (!SELF_ROUTE)
        for (int r = tid; r < BM; r += NTHREADS) {
            int t = sorted_ids[mblk * BM + r];
            s_rows[r] = (t >= 0 && t < n_slots) ? t : -1;
        }
    __syncthreads();

    const size_t tiles_n = (size_t)(N / 64);
    const int4 *qw_e = qweight + (size_t)e * (size_t)(K / 16) * tiles_n * TILE_VECS;
    const scale_t *sc_e = scales + (size_t)e * G * N;
    const u32 *zp_e = ZP ? qzeros + (size_t)e * G * (N / 8) : nullptr;
    const int *gi_e = ACT_ORDER ? g_idx + (size_t)e * K : nullptr;

    act_t *sA = reinterpret_cast<act_t *>(smem4);
    int4 *sB = smem4 + STAGES * A_STAGE / 8;
    int4 *sS = sB + STAGES * B_STAGE;

    // ---- the stage loads, planned once ----------------------------------
    // The plan of moe_gemm_common.cu (stage_plan), then what stage_copy
    // would compute again for every stage, once: the B vectors' offsets (a
    // vector of a tile past N or IP copies the stage's first vector: its
    // columns' sums are never stored and their scales are zero-filled, so
    // what they hold does not matter, and an unpredicated copy saves a
    // predicate a copy on the ALU pipe), the K stride of a stage, each
    // scale vector's row and column (the group rows are constants: GSZ).
    // A stage is then, per 16-byte copy, an address add and the cp.async:
    // the stage loop executed about 230 instructions per warp and stage in
    // these copies' address arithmetic and three run-time divisions (in the
    // SASS), about as many as the products of the stage's four k16 steps;
    // planning once made Mixtral-8x7B's M <= 256 layers 1.13-1.18x faster
    // (DeepSeek-V3/EP8 1.05-1.16x).
    const act_t *a_src[A_PER];
    int a_dst[A_PER], b_off[B_PER];
    stage_plan(a_src, a_dst, b_off, a, a_row_div, K, s_rows, sA, tid, ncol, N,
               ip, tiles_n);
#pragma unroll
    for (int q = 0; q < B_PER; q++)
        b_off[q] = b_off[q] >= 0 ? b_off[q] : 0;
    const size_t b_kstride = (size_t)(BK / 16) * tiles_n * TILE_VECS;
    // this split's K stages
    const int iters_all = K / BK;
    const int it0 = (int)((long long)split * iters_all / splits);
    const int iters = (int)((long long)(split + 1) * iters_all / splits) - it0;
    // Every source below advances in place: the stages are loaded in order
    // (it0, it0 + 1, ...), so a stage costs a 64-bit add a source instead
    // of a multiply, and validity is a bit a copy.
    // A: the planned rows (padding rows stay zero)
    u32 a_ok = 0;
#pragma unroll
    for (int q = 0; q < A_PER; q++) {
        if (a_src[q])
            a_ok |= 1u << q;
        a_src[q] = a_src[q] ? a_src[q] + it0 * BK : a;
    }
    auto load_stage_a = [&](int slot) {
        act_t *dA = sA + slot * A_STAGE;
#pragma unroll
        for (int q = 0; q < A_PER; q++) {
            if ((a_ok >> q) & 1u) {
                cp_async16(dA + a_dst[q], a_src[q], true);
                a_src[q] += BK;
            }
        }
    };
    // Scales: the stage's SGROUPS rows of TILES x 64 (8 vectors a tile)
    constexpr int S_USED = SMEM_SCALES ? SGROUPS * TILES * 8 : 0;
    constexpr int S_PER = (S_USED + NTHREADS - 1) / NTHREADS;
    const scale_t *s_src[S_PER > 0 ? S_PER : 1];
    u32 s_ok = 0, s_mine = 0; // a column past N copies zeros
#pragma unroll
    for (int q = 0; q < S_PER; q++) {
        int i = tid + q * NTHREADS, v = i % 8, rest = i / 8;
        int col = i < S_USED ? tile_col(rest % TILES, ncol, N, ip) : -1;
        if (i < S_USED)
            s_mine |= 1u << q;
        if (col >= 0)
            s_ok |= 1u << q;
        s_src[q] = sc_e + (col >= 0 ? (size_t)(stage_group(it0) + rest / TILES) * N +
                                          col + 8 * v
                                    : 0);
    }
    // B: the stages are loaded in order, so the codes' source advances by
    // one stage a load (a 64-bit add, not a multiply a stage)
    const int4 *b_next = qw_e + (size_t)it0 * b_kstride;
    auto load_stage_b = [&](int it, int slot) { // the codes and scales
        int4 *dB = sB + slot * B_STAGE;
#pragma unroll
        for (int q = 0; q < B_PER; q++)
            cp_async16(dB + tid + q * NTHREADS, b_next + b_off[q], true);
        b_next += b_kstride;
        if constexpr (SMEM_SCALES) { // row r = group stage_group(it) + r
            int4 *dS = sS + slot * S_STAGE;
            // the next stage's first group, SGROUPS rows or none further
            const int adv = (stage_group(it + 1) - stage_group(it)) * N;
#pragma unroll
            for (int q = 0; q < S_PER; q++) {
                const bool ok = (s_ok >> q) & 1u;
                if ((s_mine >> q) & 1u)
                    cp_async16(dS + tid + q * NTHREADS, s_src[q], ok);
                if (ok)
                    s_src[q] += adv;
            }
        }
    };
    auto load_stage = [&](int it, int slot) {
        load_stage_a(slot);
        load_stage_b(it, slot);
    };

    // ---- per-thread scale and zero caches --------------------------------
    // For CTA-local tile wn*NT + t and n8 block j the thread's column is
    // tile_col + 8j + gid.
    int colbase[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        colbase[t] = tile_col(wn * NT + t, ncol, N, ip);

    typedef typename pick<SCALE_SAME, act_t, float>::t reg_scale_t;
    reg_scale_t s_reg[SROWS][NT][8];
    act_t z_reg[SROWS][NT][8]; // MAGIC + z (or z), per the dequantization
    int cur_g[SROWS];

    auto load_group = [&](int row, int g) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int n = colbase[t] + 8 * j + gid;
                float z = ZP ? 0.0f : (float)(1 << (BITS - 1));
                if constexpr (GROUPED)
                    s_reg[row][t][j] = 0; // columns past N stay finite
                if (colbase[t] >= 0) {
                    if constexpr (GROUPED) {
                        scale_t s = sc_e[(size_t)g * N + scale_pos(n)];
                        if constexpr (SCALE_SAME)
                            s_reg[row][t][j] = s;
                        else
                            s_reg[row][t][j] = sca::to_f(s);
                    }
                    if constexpr (ZP)
                        z = (float)zero_at(zp_e + (size_t)g * (N / 8), n);
                }
                z_reg[row][t][j] = act::from_f(USE_MAGIC ? MAGIC + z : z);
            }
        }
        cur_g[row] = g;
    };
    if constexpr (DEFER) {
        cur_g[0] = -1; // the first stage enters its group from shared memory
    } else {
#pragma unroll
        for (int r = 0; r < SROWS; r++)
            load_group(r, SMEM_SCALES ? stage_group(it0) : 0);
    }

    // The scales of group g from the stage in `slot` (its row g - the
    // stage's first group); zero points, if any, from global memory.
    auto load_group_smem = [&](int slot, int row, int g) {
        const scale_t *ss =
            reinterpret_cast<const scale_t *>(sS + slot * S_STAGE) +
            row * TILES * 64;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            // a tile is 64-aligned: its scales' order stays inside it
            scale_t sv8[8];
            b_scales(ss + (wn * NT + t) * 64, gid, sv8);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                scale_t sv = sv8[j];
                if constexpr (SCALE_SAME)
                    s_reg[0][t][j] = sv;
                else
                    s_reg[0][t][j] = sca::to_f(sv);
                if constexpr (ZP) {
                    float z = 0.0f;
                    if (colbase[t] >= 0)
                        z = (float)zero_at(zp_e + (size_t)g * (N / 8),
                                           colbase[t] + 8 * j + gid);
                    z_reg[0][t][j] = act::from_f(USE_MAGIC ? MAGIC + z : z);
                }
            }
        }
        cur_g[0] = g;
    };

    float acc[MB][NT][JN][4];
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int j = 0; j < JN; j++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[mb][t][j][c] = 0.0f;

    // ---- deferred scales (DEFER): the group's partial sums ---------------
    // pacc: the current group's sum of (q - z) * a. A warp adds it, times
    // the group's scales of the thread's accumulator columns (8j + 2*tig +
    // c, c = 0, 1: the mma's C fragment, not the B fragment's 8j + gid),
    // into acc after its last k16 step in the group, while that step's
    // stage (and so the group's row of scales) is still in shared memory:
    // no scale lives in a register. z2: (MAGIC + z) of both lanes per B
    // column, zero points only (read when a group begins).
    constexpr int DM = DEFER ? MB : 1, DN = DEFER ? NT : 1;
    float pacc[DM][DN][JN][4];
    // FOLD: the A rows' sums over the group (c 0, 1: row gid; 2, 3: + 8;
    // SWAP: c 0, 2: row 2 tig; 1, 3: row 2 tig + 1)
    float rsum[FOLD ? MB : 1][4] = {};
    u32 z2[ZP && DEFER ? NT : 1][8];
#pragma unroll
    for (int t = 0; t < DN; t++) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            z2[ZP && DEFER ? t : 0][j] = ZSYM2;
#pragma unroll
        for (int j = 0; j < JN; j++)
#pragma unroll
            for (int mb = 0; mb < DM; mb++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    pacc[mb][t][j][c] = 0.0f;
    }
    // acc += s * pacc, pacc = 0, with the scales of the stage in `slot`,
    // row `row` (the group - the stage's first group)
    auto flush_group = [&](int slot, int row) {
        const scale_t *ss =
            reinterpret_cast<const scale_t *>(sS + slot * S_STAGE) +
            row * TILES * 64;
#pragma unroll
        for (int t = 0; t < DN; t++) {
            float sc[8][2];
            if constexpr (SWAP) { // C^T: the thread's columns are 8j + gid
                scale_t sv8[8];
                b_scales(ss + (wn * NT + t) * 64, gid, sv8);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    sc[j][0] = sc[j][1] = sca::to_f(sv8[j]);
            } else {
                acc_scales(ss + (wn * NT + t) * 64, tig, sc);
            }
#pragma unroll
            for (int j = 0; j < JN; j++)
#pragma unroll
                for (int mb = 0; mb < DM; mb++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        // SWAP: c 0, 1 in block 2j's column, 2, 3 in 2j+1's
                        const float sv = SWAP ? sc[2 * j + c / 2][0]
                                              : sc[j][c & 1];
                        float p = pacc[mb][t][j][c];
                        if constexpr (FOLD)
                            p = fmaf(-FOLD_ZB, rsum[mb][c], p);
                        acc[mb][t][j][c] = fmaf(sv, p, acc[mb][t][j][c]);
                        if constexpr (!ZERO_C)
                            pacc[mb][t][j][c] = 0.0f;
                    }
        }
        if constexpr (FOLD && !ZERO_C)
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    rsum[mb][c] = 0.0f;
    };
    // group g begins: its zero points, if any, from global memory
    auto enter_group = [&](int g) {
        if constexpr (ZP) {
#pragma unroll
            for (int t = 0; t < DN; t++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    u32 z = 0;
                    if (colbase[t] >= 0)
                        z = (u32)zero_at(zp_e + (size_t)g * (N / 8),
                                         colbase[t] + 8 * j + gid);
                    z2[ZP && DEFER ? t : 0][j] = MAGIC2 | (z * 0x00010001u);
                }
        }
        cur_g[0] = g;
    };

    // ---- compute one stage ---------------------------------------------
    // groups that are whole stages (STAGE_GROUPS): one scale check per
    // stage instead of one per k16 step
    auto compute_stage = [&](int it, int slot, bool last) {
        const act_t *cA = sA + slot * A_STAGE;
        const int4 *cB = sB + slot * B_STAGE;
        if constexpr (STAGE_GROUPS) {
            int g = stage_group(it);
            if (g != cur_g[0]) {
                if constexpr (DEFER)
                    enter_group(g);
                else
                    load_group_smem(slot, 0, g);
            }
        }
        // Act-order reloads scales for four k rows per step: unrolling the
        // steps too would multiply that code (compile time) for nothing.
#pragma unroll(ACT_ORDER ? 1 : KS)
        for (int s = 0; s < KS; s++) {
            const int kk = wk * KS + s;
            const int kg = it * BK + kk * 16; // first k of this step
            u32 af[MB][4];
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                if constexpr (SWAP) { // the n8 operand: b0, b1 in 0, 2
                    int row = mb * 8 + lane % 8; // lanes 0-15: addresses
                    int chunk = (2 * kk + (lane / 8) % 2) ^ (row % 8);
                    ldmatrix_x2(af[mb][0], af[mb][2],
                                cA + row * BK + chunk * 8);
                } else {
                    int row = mb * 16 + lane % 16;
                    int chunk = (2 * kk + lane / 16) ^ (row % 8);
                    ldmatrix_x4(af[mb], cA + row * BK + chunk * 8);
                }
            }
            if constexpr (FOLD) { // the rows' sums: B = ones (bf16 1.0)
                constexpr u32 ONES = 0x3f803f80u;
#pragma unroll
                for (int mb = 0; mb < MB; mb++) {
                    if constexpr (SWAP) { // A = ones, B = the activations
                        const u32 ones[4] = {ONES, ONES, ONES, ONES};
                        if (ZERO_C && s == 0)
                            mma16816_zc(rsum[mb], ones, af[mb][0],
                                        af[mb][2]);
                        else
                            mma16816(rsum[mb], ones, af[mb][0], af[mb][2]);
                    } else if (ZERO_C && s == 0) {
                        mma16816_zc(rsum[FOLD ? mb : 0], af[mb], ONES, ONES);
                    } else {
                        mma16816(rsum[FOLD ? mb : 0], af[mb], ONES, ONES);
                    }
                }
            }
            if constexpr (GROUPED) {
                if constexpr (ACT_ORDER) {
                    const int rk[4] = {2 * tig, 2 * tig + 1, 2 * tig + 8,
                                       2 * tig + 9};
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int g = gi_e[kg + rk[r]];
                        if (g != cur_g[r])
                            load_group(r, g);
                    }
                } else if constexpr (!STAGE_GROUPS) {
                    int g = group_of(kg);
                    if (g != cur_g[0]) {
                        if constexpr (DEFER)
                            enter_group(g);
                        else
                            load_group_smem(slot, g - stage_group(it), g);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int4 *bp = cB + (kk * TILES + wn * NT + t) * TILE_VECS +
                                 lane * LANE_VECS;
                u32 w[LANE_VECS * 4];
#pragma unroll
                for (int v = 0; v < LANE_VECS; v++) {
                    int4 x = bp[v];
                    w[4 * v + 0] = (u32)x.x;
                    w[4 * v + 1] = (u32)x.y;
                    w[4 * v + 2] = (u32)x.z;
                    w[4 * v + 3] = (u32)x.w;
                }
                // The products of n8 block j's B fragment (b0, b1) into
                // the accumulators at(mb, j) (zc: a zero C operand). SWAP
                // holds block 2jp's pair for block 2jp+1's mma of both.
                u32 pb0 = 0u, pb1 = 0u;
                auto products = [&](auto &&at, int j, u32 b0, u32 b1,
                                    bool zc) {
                    if constexpr (SWAP) {
                        if (j % 2 == 0) {
                            pb0 = b0;
                            pb1 = b1;
                            return;
                        }
                        const u32 aw[4] = {pb0, b0, pb1, b1};
#pragma unroll
                        for (int mb = 0; mb < MB; mb++) {
                            if (zc)
                                mma16816_zc(at(mb, j / 2), aw, af[mb][0],
                                            af[mb][2]);
                            else
                                mma16816(at(mb, j / 2), aw, af[mb][0],
                                         af[mb][2]);
                        }
                    } else {
#pragma unroll
                        for (int mb = 0; mb < MB; mb++) {
                            if (zc)
                                mma16816_zc(at(mb, j), af[mb], b0, b1);
                            else
                                mma16816(at(mb, j), af[mb], b0, b1);
                        }
                    }
                };
                if constexpr (DEFER) {
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const u32 zb = z2[ZP && DEFER ? t : 0][j];
                        u32 x0, x1; // MAGIC + q of b0 (k 2q, 2q+1), b1 (+8)
                        act2_t d0, d1;
                        if constexpr (FP16_HI) { // pairs 0, 1 of w, 2, 3 of w>>8
                            u32 src = (j % 2) ? (w[j / 2] >> 8) : w[j / 2];
                            x0 = lop3_and_or<0x000f000fu, MAGIC2>(src);
                            x1 = lop3_and_or<0x00f000f0u, MAGIC2>(src);
                            d0 = __hsub2(from_u32<act2_t>(x0),
                                         from_u32<act2_t>(zb));
                            // (1024 + 16 q) / 16 - (64 + 8)
                            d1 = __hfma2(from_u32<act2_t>(x1),
                                         from_u32<act2_t>(0x2c002c00u),
                                         from_u32<act2_t>(0xd480d480u));
                        } else {
                            if constexpr (BITS == 4) {
                                u32 word = w[j / 2];
                                int p = 2 * (j % 2);
                                x0 = lop3_and_or<0x000f000fu, MAGIC2>(
                                    word >> (4 * p));
                                x1 = lop3_and_or<0x000f000fu, MAGIC2>(
                                    word >> (4 * p + 4));
                            } else {
                                u32 word = w[j];
                                x0 = lop3_and_or<0x00ff00ffu, MAGIC2>(word);
                                x1 = lop3_and_or<0x00ff00ffu, MAGIC2>(word >> 8);
                            }
                            if constexpr (FOLD) { // 128 + q as it is
                                d0 = from_u32<act2_t>(x0);
                                d1 = from_u32<act2_t>(x1);
                            } else {
                                d0 = __hsub2(from_u32<act2_t>(x0),
                                             from_u32<act2_t>(zb));
                                d1 = __hsub2(from_u32<act2_t>(x1),
                                             from_u32<act2_t>(zb));
                            }
                        }
                        products(
                            [&](int mb, int jj) -> float (&)[4] {
                                return pacc[DEFER ? mb : 0][DEFER ? t : 0]
                                           [jj % JN];
                            },
                            j, as_u32(d0), as_u32(d1), ZERO_C && s == 0);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        u32 v0, v1; // code pairs of b0 (k 2q, 2q+1), b1 (+8)
                        if constexpr (BITS == 4) {
                            u32 word = w[j / 2];
                            int p = 2 * (j % 2);
                            v0 = (word >> (4 * p)) & 0x000f000fu;
                            v1 = (word >> (4 * p + 4)) & 0x000f000fu;
                        } else {
                            u32 word = w[j];
                            v0 = word & 0x00ff00ffu;
                            v1 = (word >> 8) & 0x00ff00ffu;
                        }
                        // rows: b0 = (k0, k0+1) -> cache rows 0, 1; b1 = 2, 3
                        constexpr int R1 = SROWS > 1 ? 1 : 0;
                        constexpr int R2 = SROWS > 1 ? 2 : 0;
                        constexpr int R3 = SROWS > 1 ? 3 : 0;
                        act2_t d0 = codes_minus_zero(
                            v0, act::pair(z_reg[0][t][j], z_reg[R1][t][j]));
                        act2_t d1 = codes_minus_zero(
                            v1, act::pair(z_reg[R2][t][j], z_reg[R3][t][j]));
                        if constexpr (GROUPED) {
                            d0 = apply_scale(d0, s_reg[0][t][j],
                                             s_reg[R1][t][j]);
                            d1 = apply_scale(d1, s_reg[R2][t][j],
                                             s_reg[R3][t][j]);
                        }
                        products(
                            [&](int mb, int jj) -> float (&)[4] {
                                return acc[mb][t][jj % JN];
                            },
                            j, as_u32(d0), as_u32(d1), false);
                    }
                }
            }
            if constexpr (DEFER) {
                // the warp's last step in its group: the next step it runs
                // (the next of this stage, or its first of the next stage)
                // is in another group, or there is none. Whole-stage groups
                // decide once per stage, without a division.
                if constexpr (STAGE_GROUPS) {
                    if (s + 1 == KS &&
                        (last || stage_group(it + 1) != stage_group(it)))
                        flush_group(slot, 0);
                } else {
                    const int g = group_of(kg);
                    const int next = s + 1 < KS ? kg + 16
                                                : (it + 1) * BK + wk * KS * 16;
                    if (last && s + 1 == KS ? true : group_of(next) != g)
                        flush_group(slot, g - stage_group(it));
                }
            }
        }
    };

    // ---- the pipeline: STAGES-1 loads in flight ahead of the compute ----
    // EARLY_B: the first STAGES-1 stages' codes and scales (one cp.async
    // group each) go out before the wait, their activations after it (one
    // more group), so the first stage waits for every group.
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < iters) {
            if constexpr (EARLY_B)
                load_stage_b(it0 + s, s);
            else
                load_stage(it0 + s, s);
        }
        cp_async_commit();
    }
    if constexpr (EARLY_B) {
        w16_pdl_enter(); // GEMM 1 (or its reduce) wrote the activations
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++)
            if (s < iters)
                load_stage_a(s);
        cp_async_commit();
    }
    // the slots of the next stage to load and of the stage to compute
    int ld_slot = STAGES - 1, cp_slot = 0;
    for (int it = 0; it < iters; it++) {
        if (EARLY_B && it == 0)
            cp_async_wait<0>();
        else
            cp_async_wait<STAGES - 2>();
        __syncthreads(); // stage `it` visible; stage it-1 fully consumed
        int next = it + STAGES - 1;
        if (next < iters)
            load_stage(it0 + next, ld_slot);
        cp_async_commit();
        compute_stage(it0 + it, cp_slot, it + 1 == iters);
        ld_slot = ld_slot + 1 == STAGES ? 0 : ld_slot + 1;
        cp_slot = cp_slot + 1 == STAGES ? 0 : cp_slot + 1;
    }
    cp_async_wait<0>();
    __syncthreads();

    // ---- reduce the WK partial sums in shared memory, in order ----------
    float *cs = reinterpret_cast<float *>(smem4);
    for (int w = 0; w < WK; w++) {
        if (wk == w) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int j = 0; j < JN; j++) {
                        // v[0], v[1] go to p0[0], p0[o1]; v[2], v[3] to p1
                        const float *v = acc[mb][t][j];
                        const int c0 = (wn * NT + t) * 64;
                        float *p0, *p1;
                        int o1;
                        if constexpr (SWAP) { // C^T: rows 2 tig, 2 tig + 1
                            p0 = cs + (mb * 8 + 2 * tig) * C_LD + c0 +
                                 16 * j + gid;
                            p1 = p0 + 8; // block 2j + 1
                            o1 = C_LD;
                        } else {
                            p0 = cs + (mb * 16 + gid) * C_LD + c0 + 8 * j +
                                 2 * tig;
                            p1 = p0 + 8 * C_LD; // rows 8-15 of the m16
                            o1 = 1;
                        }
                        if (w == 0) {
                            p0[0] = v[0]; p0[o1] = v[1];
                            p1[0] = v[2]; p1[o1] = v[3];
                        } else {
                            p0[0] += v[0]; p0[o1] += v[1];
                            p1[0] += v[2]; p1[o1] += v[3];
                        }
                    }
        }
        __syncthreads();
    }

    // ---- epilogue (moe_gemm_common.cu) -----------------------------------
    store_c_tile(cs, s_rows, tid, e, ncol, split, splits, N, ip, n_slots, sc_e,
                 bias, out, round_out, limit, alpha, beta);
    // SPLIT_SUMS: a unit of its own (the host's choice for the run), so
    // that the kernels without it carry none of this code (with it in every
    // GEMM 1, Qwen3-30B-A3B M = 16 measured 3.5% slower without a split)
    if constexpr (GEMM == 1 && SPLIT_SUMS)
        if (splits > 1 && tile_sem)
            splitk_fixup(s_rows, tid, ncol, tile, splits, ip, n_slots,
                         static_cast<const float *>(out), act_out, tile_sem,
                         round_out, limit, alpha, beta);
}
