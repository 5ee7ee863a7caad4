// moe_wgmma_gemm.cu - the fused MoE's GEMM over Marlin layouts on Hopper's
// warpgroup MMA (wgmma.mma_async, sm_90a). Same launch, arguments, CTA
// semantics and epilogue as moe_marlin_gemm.cu (read its header first):
// a CTA computes BM routed rows x BN columns of A[rows] . W_e^T over its
// K range, then the epilogue. What differs is the product:
//
// Operands are swapped: the tensor cores compute C^T = W . A^T, so the
// dequantized weights are wgmma's A operand, in registers (only A may come
// from registers; that is what lets the dequantization stay in the
// registers, as in the mma.sync kernel), and the activation tile is B,
// read by the tensor cores from shared memory through a descriptor. The
// routed rows are wgmma's N (BM: a multiple of 16 up to 256), the weight
// columns its M. At BM 16 and 32 (up to 24 rows an expert: the small-M
// decode) the products are m64n16k16 and m64n32k16, 8 and 16
// accumulators a slice; measured 1.2-1.5x slower than the mma.sync
// kernel there (it issues about 35% more instructions per weight, and
// the tensor cores were not the limit: under ncu both kernels are bound
// by issuing the dequantization with few warps), so the built-in tables
// keep those problems on mma.sync. From 25 rows an expert (BM 48, 64,
// 128) the tensor cores' share grows and this kernel is 1.0-1.6x faster
// (Mixtral-8x7B M = 256: 973 -> 601 us).
//
// Warpgroups. WN = 4 * WGS warps form WGS warpgroups; warpgroup wg owns
// the CTA's Marlin tiles 2wg and 2wg+1 (128 columns; for w13 that is one
// gate and one up tile: TILES = 2 * WGS, the first half gate). Warp w of
// a warpgroup holds rows 16w .. 16w+15 of each m64 operand; warp w reads
// tile 2wg + w/2 and, of each lane's words, the n8 blocks j = 4h .. 4h+3
// (h = w % 2). Per k16 step the warpgroup issues two m64nBMk16 products,
// slice s = 0, 1: warp w's rows of slice s are the n8 blocks
// j0 = 4h + 2s and j1 = j0 + 1 of its tile. The m16 x k16 A fragment of a
// warp has the mma.m16n8k16 layout, which is the Marlin tile's B fragment
// transposed: a0 = b0(j0), a1 = b0(j1), a2 = b1(j0), a3 = b1(j1) (rows g
// and g + 8 are columns 8 j0 + g and 8 j1 + g). So an m64 row r of warp w,
// slice s, is the column 16 (4h + 2s) / 2 + r = 16 (2h + s) + r of tile
// 2wg + w/2: the slices cover each tile's 64 columns in order.
// With one slice (SLICES = 1: BM above 128, or four consumer
// warpgroups, WN 16) warpgroup wg owns tile wg alone (64 columns, BN = 64 * WGS) with one
// m64nBMk16 product a step: warp w takes n8 blocks 2w and 2w + 1, the
// lane's word w (4-bit; words 2w, 2w + 1 for 8-bit).
//
// Activations. BK is 64: a row of a stage's A tile is 128 bytes, its
// 16-byte chunks XOR-swizzled by row % 8, which is exactly wgmma's 128-byte
// swizzle of a K-major operand (8-row atoms of 1024 bytes, stage buffers
// 1024-byte aligned). Step kk's B descriptor starts 32 kk bytes into it.
//
// Pipeline: STAGES cp.async stage buffers, STAGES - 2 loads in flight
// (a buffer is refilled two stages after its compute, so that the last
// products of a stage may still run while the next one starts); the
// warpgroup dequantizes step kk + 1 into the second register set while
// the tensor cores run step kk (wgmma.wait_group 1).
// The cp.async writes reach wgmma's async proxy through
// fence.proxy.async before the barrier that publishes a stage.
//
// Warp-specialized variant (WS, the tiling row's "warp_specialized"):
// one more warpgroup, the producer, issues every stage's cp.async copies
// (the same stage layout, planned for its 128 threads) into
// a ring of STAGES buffers; each copy's completion arrives on the stage's
// "full" mbarrier (cp.async.mbarrier.arrive.noinc), and each consumer
// thread arrives on the stage's "empty" mbarrier once its products that
// read the stage are done (after the next stage's first wgmma.wait_group
// 1).
// The consumers never meet at a CTA-wide barrier in the main loop and
// never issue a copy; they wait for the stage's full barrier, then
// fence.proxy.async (the copies are generic-proxy writes that wgmma reads
// through the async proxy). setmaxnreg moves registers from the producer
// (PRODUCER_REGS) to the consumers (CONSUMER_REGS).
//
// Tail rows (TAIL_M, the row's "tail_m", warp-specialized with two
// consumer warpgroups): where an expert's last block holds at most TAIL_M
// routed slots, the CTA of the expert's block before it also computes
// those rows, a second m64nTAIL_Mk16 product a slice on the same A
// fragments over rows BM .. BM + TAIL_M - 1 of the stage's activation
// tile, and the last block's own CTA returns. The main loop is compiled
// with and without those products; a CTA without a tail runs the latter.
//
// Persistent CTAs (PERSIST, the row's "persistent", warp-specialized):
// one CTA an SM runs item after item (row block, column tile, split) of
// the row blocks the routing filled. The producer draws items from an
// integer counter (tile_sem; items without tail rows first, then those
// with, each kind a loop of its own in the consumers: one loop with both
// made ptxas serialize every wgmma, C7512), writes the item's entry and
// routed rows into a ring of two (mbarriers s_ifull / s_iempty), and
// streams its stages through the same stage ring without a break, so
// that the next item's first stages are copied while the consumers store
// this item's C tile. That tile has shared memory of its own (C_ROWS
// rows, in chunks where the CTA's memory runs out).
//
// Not here: act-order (per-k-row groups would reload scales per row; the
// tiling table sends those problems to the mma.sync kernel) and split
// warps along K (the warpgroup's products accumulate in its registers).

// moe_gemm_common.cu precedes this text: the stage geometry, element
// types, addresses, cp.async, dequantization, activations, the epilogue.

// wgmma and setmaxnreg exist in sm_90a's arch-specific PTX only. nvcc's
// -arch=sm_90a also embeds portable compute_90 PTX, which cannot hold
// them: say which flags build this unit rather than let ptxas list every
// instruction it refuses.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "a wgmma unit compiles for sm_90a only: NVRTC --gpu-architecture=sm_90a, or nvcc -gencode arch=compute_90a,code=sm_90a"
#endif

namespace w16 {

// ---- derived constants and the checks the specializer relies on ----------

constexpr int WGS = WN / 4; // warpgroups: NTHREADS = 128 * WGS
// WS: the producer warpgroup follows the consumers (tid >= NTHREADS), so
// the consumers' thread ids are the ones the shared epilogue expects
constexpr int CTA_THREADS = WS ? NTHREADS + 128 : NTHREADS;
// setmaxnreg only moves the registers the launch gave the CTA: 128 *
// PRODUCER_REGS + NTHREADS * CONSUMER_REGS stays within CTA_THREADS times
// the launch's registers a thread (168 for 384 threads, 96 for 640).
// Two consumer warpgroups (two slices each) fit in about 160 registers;
// the producer keeps its copy plan in 104 (40 or 72 spilled the earlier
// plan of two plan threads: ptxas -v). Four consumer warpgroups of one
// slice hold half
// the accumulators, but at 104 registers ptxas serialized their wgmmas
// (C7512), so they take 112 and leave the producer 32, at which it spills
// its copy plan (about 200-350 bytes, ptxas -v).
// Tail rows (TAIL_M) add their accumulators and a second copy of the
// main loop: at 200 ptxas serialized every wgmma (C7512), so those units
// give the consumers 208 and the producer 88 (no spill, ptxas -v).
// Persistent CTAs with tail rows (PERSIST, TAIL_M; in no built-in table)
// take 216 and 72, the split they were measured and tested with: their
// first version (one loop over both kinds of items) had ptxas serialize
// every wgmma (C7512) at 208. The final loops compile at 208 / 88 too
// (20 bytes of producer spill against 52 at 72, ptxas -v); not measured.
constexpr int PRODUCER_REGS =
    WGS == 4 ? 32 : TAIL_M ? (PERSIST ? 72 : 88) : 104;
constexpr int CONSUMER_REGS =
    WGS == 4 ? 112 : TAIL_M ? (PERSIST ? 216 : 208) : 200;
// + 1024: the dynamic shared memory is aligned up to the swizzle atom.
// The C tile shares the stages' memory, except in persistent CTAs
// (PERSIST), whose producer fills the stages with the next item's while
// the consumers store this item's tile: C_ROWS rows of it at a time (the
// prelude's, ROWS where the CTA's shared memory allows)
constexpr int NEED_BYTES =
    (PERSIST ? PIPE_BYTES + C_ROWS * C_LD * 4
             : (PIPE_BYTES > C_BYTES ? PIPE_BYTES : C_BYTES)) +
    1024;
constexpr int ACC = BM / 2; // accumulator floats per slice (m64 x BM / 128)
// m64 slices a warpgroup computes (BN = 64 * SLICES * WGS): two (128
// columns, two Marlin tiles) for BM 16 to 128 with one or two warpgroups;
// one (64 columns, one tile) above BM 128, whose m64nBMk16 products reuse
// each dequantized fragment for more rows, and for four consumer
// warpgroups (WN 16, warp-specialized), which keep twice the warps
// dequantizing beside the same products
constexpr int SLICES = BN / (16 * WN);
// SOA (the row's "scales_on_acc", grouped layers; measured 11% slower
// than the scales in the dequantization, unused by the built-in tables):
// the A fragments are the exact codes minus zero, and the group scales
// act on the float32 accumulators, kept in units of the current group's
// scale of their row:
// at a group change acc *= old / new (after wgmma.wait_group 0), at the
// end acc *= the last scale. A row whose scale is zero keeps its unit and
// gets zero fragments for that group (a 0/1 mask in the subtraction).
constexpr bool SOA = ACC_SCALES && GROUPED;
// wgmma groups a consumer warpgroup keeps in flight (the row's
// "wgmma_groups"). Two need groups of whole stages (GROUP_STAGES): a
// group change between k16 steps made ptxas serialize every wgmma
// (C7513), so layers with smaller groups keep one.
constexpr int DEPTH = GROUPED && !GROUP_STAGES ? 1 : WGMMA_GROUPS;

static_assert(!ACT_ORDER, "act-order runs on the mma.sync kernel");
static_assert(BM % 16 == 0 && BM >= 16 && BM <= 256,
              "block_m (wgmma N) is a multiple of 16 from 16 to 256");
static_assert(WN == 4 || WN == 8 || (WN == 16 && WS),
              "one or two warpgroups, or four warp-specialized ones");
static_assert(WK == 1, "no K split between warps");
static_assert((SLICES == 1 || SLICES == 2) && BN == 64 * SLICES * WGS,
              "one or two Marlin tiles a warpgroup");
static_assert(BM <= 128 || SLICES == 1, "above block_m 128: one slice");
static_assert(WGS != 4 || (SLICES == 1 && BM <= 128 &&
                           128 * PRODUCER_REGS + NTHREADS * CONSUMER_REGS <=
                               CTA_THREADS * 96),
              "four consumer warpgroups: one slice, block_m <= 128, the "
              "registers of a 640-thread launch");
static_assert(BK == 64, "a stage's A rows are one 128-byte swizzle row");
static_assert(STAGES >= 3 && STAGES <= 8, "pipeline depth (STAGES - 2 "
              "loads in flight)");
static_assert((A_STAGE * 2) % 1024 == 0, "stage buffers stay 1024-aligned");
static_assert(SMEM_BYTES == NEED_BYTES, "shared memory size (prelude)");
static_assert(!WS || NTHREADS == 256 || NTHREADS == 512,
              "warp-specialized: two or four consumer warpgroups (the "
              "register split is sized for them)");
static_assert(!WS || NTHREADS % 128 == 0, "plan threads per producer "
              "thread");
static_assert(DEPTH == 1 || DEPTH == 2, "one or two wgmma groups in flight");
static_assert(TAIL_M == 0 || ((TAIL_M == 16 || TAIL_M == 32) && WS &&
                              WGS == 2 && SLICES == 2 && !SOA),
              "tail rows: 16 or 32, two warp-specialized consumer "
              "warpgroups of two slices, scales in the dequantization");
static_assert(!PERSIST || (WS && !SPLIT_CODES),
              "persistent CTAs: warp-specialized, codes not split");
// (at namespace scope: NVCC lost a constexpr local of the generic lambda
// that stores the C tile inside its unrolled loop)
constexpr int C_CHUNKS = (ROWS + C_ROWS - 1) / C_ROWS;
static_assert(C_ROWS % 16 == 0 && C_ROWS >= 16 &&
                  (PERSIST ? C_ROWS <= ROWS : C_ROWS == ROWS),
              "the C tile's chunks: whole 16-row groups (ROWS: one)");
// accumulator floats per slice of the tail rows (1: none, unused)
constexpr int TAIL_ACC = TAIL_M > 0 ? TAIL_M / 2 : 1;
static_assert(!SPLIT_CODES || (WS && BITS == 4 && SLICES == 2 &&
                               KSTEPS % 2 == 0),
              "split codes: warp-specialized, 4-bit, two slices");
static_assert(DEPTH == 1 || (WS && KSTEPS > DEPTH), "two wgmma groups in "
              "flight: warp-specialized rows (the ring's release) only");

// ---- PTX wrappers ---------------------------------------------------------

// Shared-memory writes of this thread (cp.async, stores) become visible
// to the async proxy, which is where wgmma reads its B operand.
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// mbarriers (the warp-specialized pipeline). A wait spins on try_wait,
// which itself suspends the thread for a while.
__device__ __forceinline__ void mbar_init(u64 *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(
                     smem_addr(bar)),
                 "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64 *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(
                     smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u64 *bar, int parity)
{
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
// The barrier's pending count drops by one when every cp.async this
// thread issued so far has completed (noinc: counted in the init count).
__device__ __forceinline__ void cp_async_arrive(u64 *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::
                     "r"(smem_addr(bar))
                 : "memory");
}
// named barriers: 1 the consumers (epilogue), 2 the whole CTA (start)
template <int ID, int COUNT> __device__ __forceinline__ void bar_sync()
{
    asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(COUNT) : "memory");
}
template <int ID, int COUNT> __device__ __forceinline__ void bar_arrive()
{
    asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(COUNT) : "memory");
}
template <int R> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

// (a & b) | c in one instruction
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c)
{
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// The descriptor of a K-major operand in 128-byte swizzled atoms of 8 rows
// (1024 bytes apart: the stride byte offset); the leading byte offset is
// unused for this layout (1 by convention).
__device__ __forceinline__ u64 smem_desc(u32 addr)
{
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)1 << 16) |
           ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// D (m64 x BM, f32) += A (m64 x k16, registers) . B (k16 x BM, shared);
// scale_d 0: D = A . B (the first product of a tile). wgmma takes every
// accumulator register as an operand, so the instruction and its operand
// list come from the prelude, written for this unit's BM (gen/moe_cuda.c,
// def_wgmma: W16_WGMMA_ASM, W16_WGMMA_D).
__device__ __forceinline__ void wgmma_step(float (&d)[ACC], const u32 (&a)[4],
                                           u64 desc, int scale_d)
{
    static_assert(W16_WGMMA_ACC == ACC, "the prelude's product is m64nBMk16");
    asm volatile(W16_WGMMA_ASM
                 : W16_WGMMA_D
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc),
                   "r"(scale_d));
}

// The producer's source of an A chunk: its address, or (PERSIST, whose
// producer has 72 registers) its row, the address formed at each copy
__device__ __forceinline__ void set_a_src(const act_t *&d, const act_t *a,
                                          int row, int K, int c8)
{
    d = a + (size_t)row * K + c8 * 8;
}
__device__ __forceinline__ void set_a_src(int &d, const act_t *, int row, int,
                                          int)
{
    d = row;
}
__device__ __forceinline__ const act_t *a_src_at(const act_t *p,
                                                 const act_t *, int, int)
{
    return p;
}
__device__ __forceinline__ const act_t *a_src_at(int row, const act_t *a,
                                                 int K, int c8)
{
    return a + (size_t)row * K + c8 * 8;
}

// a compile-time bool as a value (a generic lambda's template argument)
template <bool B> struct bool_c {
    static constexpr bool value = B;
};

#ifdef W16_WGMMA_TAIL_ASM
// D (m64 x TAIL_M) += A . B (the tail rows: TAIL_M rows of B from row BM)
__device__ __forceinline__ void wgmma_tail_step(float (&d)[TAIL_ACC],
                                                const u32 (&a)[4], u64 desc,
                                                int scale_d)
{
    static_assert(W16_WGMMA_TAIL_ACC == TAIL_ACC, "the tail's m64nTAIL_Mk16");
    asm volatile(W16_WGMMA_TAIL_ASM
                 : W16_WGMMA_TAIL_D
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc),
                   "r"(scale_d));
}
#endif

} // namespace w16

using namespace w16;

extern "C" __global__ void __launch_bounds__(CTA_THREADS, MIN_CTAS)
W16_KERNEL(W16_GEMM_PARAMS)
{
    (void)g_idx; // act-order is the mma.sync kernel's
    extern __shared__ int4 smem_raw[];
    // the routed rows of the CTA's block (PERSIST: of two items, a ring
    // the producer fills ahead of the consumers)
    __shared__ int s_rows[PERSIST ? 2 : 1][ROWS];
    // WS: stage s is loaded (full) / consumed (empty)
    __shared__ alignas(8) u64 s_full[WS ? STAGES : 1];
    __shared__ alignas(8) u64 s_empty[WS ? STAGES : 1];
    // PERSIST: item b of the ring (mblk, ncol, split, expert, tail; expert
    // -1: no item left) is written (s_ifull) / done with (s_iempty)
    __shared__ int s_item[PERSIST ? 2 : 1][5];
    __shared__ alignas(8) u64 s_ifull[PERSIST ? 2 : 1];
    __shared__ alignas(8) u64 s_iempty[PERSIST ? 2 : 1];
    // wgmma's swizzle is a function of the address: align to the atom
    int4 *smem4 = reinterpret_cast<int4 *>(
        reinterpret_cast<char *>(smem_raw) +
        ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u));

    const int ncta = GATED ? (ip + BN / 2 - 1) / (BN / 2) : (N + BN - 1) / BN;
    w16_pdl_enter(); // routing wrote num_post, expert_ids, sorted_ids
    // Items: (row block, column tile, split). A CTA computes item
    // blockIdx.x of a grid of them, or (PERSIST, one CTA an SM) the items
    // of the row blocks the routing filled that its producer draws from
    // the counters tile_sem[0, 1] (tile_sem[2] counts the CTAs done).
    const int n_items = PERSIST ? (*num_post + BM - 1) / BM * ncta * splits
                                : (int)gridDim.x;
    int mblk = 0, ncol = 0, split = 0, e = -1;
    bool tail = false;
    // the item's block, columns and split; false: nothing to compute
    auto item_at = [&](int item) -> bool {
        split = item % splits;
        const int tile = item / splits;
        // Raster: CTAs run in groups of RG row blocks x CG column tiles,
        // row blocks fastest, so that a wave reads a group's weights and
        // activations from HBM about once (at large M an expert has
        // several row blocks, and the mma.sync kernel's order, columns
        // fastest, reads an expert's weights once per row block). A
        // bijection on the tiles. Measured neutral on the H200 today (the
        // GEMM is not memory-bound at 380 TFLOP/s); it cuts Mixtral's
        // M = 4096 weight traffic about 3x, which a faster main loop will
        // need.
        constexpr int RG = 8, CG = 16;
        const int nblk = n_items / splits / ncta;
        const int rg = tile / (RG * ncta), rem = tile % (RG * ncta);
        const int rows_in = nblk - rg * RG < RG ? nblk - rg * RG : RG;
        const int cg = rem / (rows_in * CG), rem2 = rem % (rows_in * CG);
        mblk = rg * RG + rem2 % rows_in;
        ncol = cg * CG + rem2 / rows_in;
        if (mblk * BM >= *num_post)
            return false;
        e = expert_ids[mblk];
        if (e < 0)
            return false;
        // Tail rows (TAIL_M): an expert's last block whose rows from
        // TAIL_M on are padding is computed by the CTA of the expert's
        // block before it, beside that block's BM rows: the weights are
        // streamed and dequantized once for both, and the tail's own CTA
        // returns. (An expert's blocks are consecutive and only its last
        // is partial.)
        tail = false;
        if constexpr (TAIL_M > 0) {
            auto tail_only = [&](int b) {
                const int t = sorted_ids[b * BM + TAIL_M];
                return t < 0 || t >= n_slots;
            };
            if (mblk > 0 && expert_ids[mblk - 1] == e && tail_only(mblk))
                return false;
            tail = (mblk + 1) * BM < *num_post &&
                   expert_ids[mblk + 1] == e && tail_only(mblk + 1);
        }
        return true;
    };
    if (!PERSIST && !item_at(blockIdx.x))
        return;
    // row r's routed slot (-1: padding) of the item
    auto row_at = [&](int r) {
        const int t = r < BM ? sorted_ids[mblk * BM + r]
                             : (tail ? sorted_ids[(mblk + 1) * BM + r - BM]
                                     : -1);
        return (t >= 0 && t < n_slots) ? t : -1;
    };

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wg = warp / 4, w = warp % 4, h = w % 2;
    const int gid = lane / 4, tig = lane % 4;
    // CTA-local tile this warp reads, and its 16-column group of slice s
    // (q: also the word of the lane's codes that holds those columns)
    const int my_tile = SLICES == 2 ? 2 * wg + w / 2 : wg;
    auto colq = [&](int s) { return SLICES == 2 ? 2 * h + s : w; };

    if constexpr (!PERSIST)
        for (int r = tid; r < ROWS; r += NTHREADS)
            s_rows[0][r] = row_at(r);
    if constexpr (WS) {
        if (tid == 0) {
            for (int s = 0; s < STAGES; s++) {
                mbar_init(&s_full[s], 128);  // the producer's threads
                mbar_init(&s_empty[s], NTHREADS); // the consumers
            }
            if constexpr (PERSIST)
                for (int b = 0; b < 2; b++) {
                    mbar_init(&s_ifull[b], 128);
                    mbar_init(&s_iempty[b], NTHREADS);
                }
        }
    }
    __syncthreads();

    const size_t tiles_n = (size_t)(N / 64);
    const int iters_all = K / BK;
    // the item's expert's operands and K range
    const int4 *qw_e = nullptr;
    const scale_t *sc_e = nullptr;
    const u32 *zp_e = nullptr;
    int it0 = 0, iters = 0;
    auto item_operands = [&]() {
        qw_e = qweight + (size_t)e * (size_t)(K / 16) * tiles_n * TILE_VECS;
        sc_e = scales + (size_t)e * G * N;
        zp_e = ZP ? qzeros + (size_t)e * G * (N / 8) : nullptr;
        it0 = (int)((long long)split * iters_all / splits);
        iters = (int)((long long)(split + 1) * iters_all / splits) - it0;
    };
    if constexpr (!PERSIST)
        item_operands();

    act_t *sA = reinterpret_cast<act_t *>(smem4);
    int4 *sB = smem4 + STAGES * A_STAGE / 8;
    int4 *sS = sB + STAGES * B_STAGE;

    // ---- WS: the producer warpgroup ------------------------------------------
    // The copies are planned for the producer's 128 threads, once an item:
    // a stage is then, per 16-byte copy, an address add and the cp.async,
    // and the groups of a stage follow from the last stage's without a
    // division. (Before, the producer ran the consumers' plan, NTHREADS /
    // 128 plan threads a producer thread, and moe_gemm_common.cu's
    // stage_copy with two run-time divisions each a stage: with four
    // consumer warpgroups the consumers waited on the full barrier about
    // half of their time, ncu's source view.) The split codes keep that
    // plan and stage_copy; its zeroed padding rows reach the consumers
    // through barrier 2.
    if constexpr (WS) {
        if (warp >= WN) {
            constexpr int V = NTHREADS / 128;
            const int ptid = tid - NTHREADS;
            act_t *pA = reinterpret_cast<act_t *>(smem4);
            int4 *pB = smem4 + STAGES * A_STAGE / 8;
            int4 *pS = pB + STAGES * B_STAGE;
            if constexpr (SPLIT_CODES) {
                // the split codes' copies are stage_copy's (two consumer
                // warpgroups: two plan threads' addresses kept)
                const act_t *p_src[V][A_PER];
                int p_dst[V][A_PER], p_off[V][B_PER];
#pragma unroll
                for (int v = 0; v < V; v++)
                    stage_plan(p_src[v], p_dst[v], p_off[v], a, a_row_div,
                               K, s_rows[0], pA, ptid + 128 * v, ncol, N,
                               ip, tiles_n);
                fence_proxy_async();
                bar_arrive<2, CTA_THREADS>();
                setmaxnreg_dec<PRODUCER_REGS>();
                for (int it = 0; it < iters; it++) {
                    const int slot = it % STAGES;
                    if (it >= STAGES) // consumed STAGES stages ago
                        mbar_wait(&s_empty[slot], (it / STAGES - 1) & 1);
#pragma unroll
                    for (int v = 0; v < V; v++)
                        stage_copy(it0 + it, slot, p_src[v], p_dst[v],
                                   p_off[v], pA, pB, pS, qw_e, qweight, sc_e,
                                   scales, tiles_n, ptid + 128 * v, ncol, N,
                                   ip, group_size);
                    cp_async_arrive(&s_full[slot]);
                }
                cp_async_wait<0>();
                return;
            }
            // A: chunk ptid + 128 q is row r0 + 16 q, 16-byte chunk c8 of
            // the row (rows 16 apart share their swizzle, r % 8); a padding
            // row (no routed slot) is copied with size 0 from row 0, which
            // writes its zeros
            constexpr int PA = ROWS * A_CHUNKS / 128;
            constexpr int PB = B_STAGE / 128;
            static_assert(A_CHUNKS == 8 && (ROWS * A_CHUNKS) % 128 == 0 &&
                              B_STAGE % 128 == 0 && S_STAGE <= 128,
                          "the producer's copies: whole rounds of 128");
            const int r0 = ptid / A_CHUNKS, c8 = ptid % A_CHUNKS;
            const int a_dst0 = r0 * BK + ((c8 ^ (r0 % 8)) * 8);
            typedef typename pick<PERSIST, int, const act_t *>::t a_src_t;
            a_src_t p_a[PA];
            u32 a_ok = 0;
            // B: vector ptid + 128 q of the stage (stage_plan's formula;
            // a tile past N or IP: copied with size 0)
            int p_b[PB];
            u32 b_ok = 0;
            // grouped scales: vector ptid of the stage, row s_row (of the
            // stage's groups), columns s_col .. + 7 (-1: past N or IP)
            int s_row = BK, s_col = -1; // BK: never a row
            // the groups of the stage's first and last k: g0, g1, and the
            // first k of the group after each
            int g0 = 0, g1 = 0, n0 = 0, n1 = 0;
            auto plan = [&](const int *rows) {
                a_ok = 0;
#pragma unroll
                for (int q = 0; q < PA; q++) {
                    const int t = rows[r0 + 16 * q];
                    set_a_src(p_a[q], a, t >= 0 ? t / a_row_div : 0, K, c8);
                    a_ok |= (t >= 0 ? 1u : 0u) << q;
                }
                b_ok = 0;
#pragma unroll
                for (int q = 0; q < PB; q++) {
                    const int i = ptid + 128 * q, v = i % TILE_VECS;
                    const int rest = i / TILE_VECS, tt = rest % TILES,
                              ks = rest / TILES;
                    const int col = tile_col(tt, ncol, N, ip);
                    p_b[q] = col >= 0 ? (int)((ks * tiles_n + col / 64) *
                                                  TILE_VECS + v)
                                      : 0;
                    b_ok |= (col >= 0 ? 1u : 0u) << q;
                }
                if (SMEM_SCALES && ptid < S_STAGE) {
                    const int v = ptid % 8, rest = ptid / 8;
                    const int col = tile_col(rest % TILES, ncol, N, ip);
                    s_row = rest / TILES;
                    s_col = col >= 0 ? col + 8 * v : -1;
                }
                if constexpr (SMEM_SCALES) {
                    const int k0 = it0 * BK;
                    g0 = k0 / group_size;
                    g1 = (k0 + BK - 1) / group_size;
                    n0 = (g0 + 1) * group_size;
                    n1 = (g1 + 1) * group_size;
                }
            };
            const size_t b_kstride = (size_t)(BK / 16) * tiles_n * TILE_VECS;
            int gst = 0; // stages issued: the ring's position
            auto produce = [&]() {
                for (int it = 0; it < iters; it++, gst++) {
                    const int slot = gst % STAGES;
                    if (gst >= STAGES) // consumed STAGES stages ago
                        mbar_wait(&s_empty[slot], (gst / STAGES - 1) & 1);
                    const int k0 = (it0 + it) * BK;
                    act_t *dA = pA + slot * A_STAGE + a_dst0;
                    // (the tail rows, q from BM / 16, only where the CTA
                    // has a tail: otherwise no product reads them)
#pragma unroll
                    for (int q = 0; q < PA; q++) {
                        if (q < BM / 16 || tail)
                            cp_async16(dA + q * 16 * BK,
                                       a_src_at(p_a[q], a, K, c8) + k0,
                                       (a_ok >> q) & 1u);
                    }
                    int4 *dB = pB + slot * B_STAGE + ptid;
                    const int4 *qs = qw_e + (size_t)(it0 + it) * b_kstride;
#pragma unroll
                    for (int q = 0; q < PB; q++)
                        cp_async16(dB + 128 * q, qs + p_b[q],
                                   (b_ok >> q) & 1u);
                    if constexpr (SMEM_SCALES) { // row r = group g0 + r
                        while (n0 <= k0)
                            g0++, n0 += group_size;
                        while (n1 <= k0 + BK - 1)
                            g1++, n1 += group_size;
                        if (s_row <= g1 - g0) {
                            const bool ok = s_col >= 0;
                            cp_async16(pS + slot * S_STAGE + ptid,
                                       sc_e + (ok ? (size_t)(g0 + s_row) *
                                                            N +
                                                        s_col
                                                  : 0),
                                       ok);
                        }
                    }
                    cp_async_arrive(&s_full[slot]);
                }
            };
            if constexpr (!PERSIST) {
                plan(s_rows[0]);
                fence_proxy_async();
                bar_arrive<2, CTA_THREADS>();
                setmaxnreg_dec<PRODUCER_REGS>();
                produce();
            } else {
                fence_proxy_async();
                bar_arrive<2, CTA_THREADS>();
                setmaxnreg_dec<PRODUCER_REGS>();
                // The items' ring: the producer decodes item n (its block,
                // columns, routed rows) into entry n % 2 once the
                // consumers are done with item n - 2, then streams its
                // stages, so that item n + 1's first stages are copied
                // while the consumers run item n's epilogue. Items are
                // taken from a counter (tile_sem[pass]), in the raster's
                // order: a CTA that drew short items draws more (a static
                // share, item blockIdx.x + k gridDim.x, left the CTAs with
                // 0.75-1.4x the mean work where experts end in tail rows,
                // and the layer 15-35% slower). Items without tail rows
                // come first (pass 0), then (TAIL_M) those with: the
                // consumers run each kind in a loop of its own.
                __shared__ int s_draw;
                auto draw = [&](int pass) {
                    if (ptid == 0)
                        s_draw = atomicAdd(&tile_sem[pass], 1);
                    bar_sync<3, 128>();
                    const int v = s_draw;
                    bar_sync<3, 128>(); // (read before the next draw)
                    return v;
                };
                int pass = 0;
                for (int n = 0;; n++) {
                    int item;
                    for (;;) {
                        item = draw(pass);
                        if (item < n_items) {
                            if (item_at(item) && (int)tail == pass)
                                break;
                        } else if (pass == (TAIL_M > 0 ? 1 : 0)) {
                            break;
                        } else {
                            pass++;
                        }
                    }
                    const bool done = item >= n_items;
                    const int b = n % 2;
                    if (n >= 2)
                        mbar_wait(&s_iempty[b], (n / 2 - 1) & 1);
                    if (ptid == 0) {
                        s_item[b][0] = mblk;
                        s_item[b][1] = ncol;
                        s_item[b][2] = split;
                        s_item[b][3] = done ? -1 : e;
                        s_item[b][4] = tail;
                    }
                    if (!done)
                        for (int r = ptid; r < ROWS; r += 128)
                            s_rows[b][r] = row_at(r);
                    mbar_arrive(&s_ifull[b]); // (release: the writes)
                    if (done) {
                        // the last CTA to finish drawing resets the
                        // counters for the next launch
                        if (ptid == 0) {
                            __threadfence();
                            if (atomicAdd(&tile_sem[2], 1) ==
                                (int)gridDim.x - 1) {
                                tile_sem[0] = tile_sem[1] = 0;
                                tile_sem[2] = 0;
                                __threadfence();
                            }
                        }
                        break;
                    }
                    bar_sync<3, 128>(); // the producer's rows, to its plan
                    item_operands();
                    plan(s_rows[b]);
                    produce();
                }
            }
            cp_async_wait<0>();
            return;
        }
        setmaxnreg_inc<CONSUMER_REGS>();
    }

    // ---- the stage loads (moe_gemm_common.cu), planned once ----------------
    const act_t *a_src[A_PER];
    int a_dst[A_PER], b_off[B_PER];
    if constexpr (!WS)
        stage_plan(a_src, a_dst, b_off, a, a_row_div, K, s_rows[0], sA, tid,
                   ncol, N, ip, tiles_n);
    auto load_stage = [&](int it, int slot) {
        stage_copy(it, slot, a_src, a_dst, b_off, sA, sB, sS, qw_e, qweight,
                   sc_e, scales, tiles_n, tid, ncol, N, ip, group_size);
    };

    // ---- the thread's columns: slice s, rows gid (lo) and gid + 8 (hi) ---
    // column (CTA-local tile my_tile) 16 (2h + s) + gid (+ 8)
    // (PERSIST: set for each item, as are the group state and zeros below)
    int colbase = tile_col(my_tile, ncol, N, ip);
    // The accumulators are not cleared: the tile's first products ignore
    // them (scale_d 0). Clearing them with moves would put non-wgmma
    // definitions of the accumulators inside ptxas's view of the wgmma
    // pipeline (products stay in flight across stages), and ptxas would
    // then serialize every wgmma. The empty asm only tells the compiler
    // the registers have a value; it emits nothing.
    float acc[SLICES][ACC];
    float acc_t[SLICES][TAIL_ACC]; // the tail rows' (TAIL_M)
#pragma unroll
    for (int s = 0; s < SLICES; s++) {
#pragma unroll
        for (int i = 0; i < ACC; i++)
            asm volatile("" : "=f"(acc[s][i]));
#pragma unroll
        for (int i = 0; i < TAIL_ACC; i++)
            asm volatile("" : "=f"(acc_t[s][i]));
    }

    typedef typename pick<SCALE_SAME, act_t, float>::t reg_scale_t;
    reg_scale_t s_reg[2][2]; // [slice][lo, hi]
    act_t z_reg[2][2];       // MAGIC + z (or z)
    // SOA: the unit of the rows' accumulators (the scale of their group,
    // or an earlier one where it is zero) and the 0/1 fragment masks
    float u_reg[2][2];
    act_t m_reg[2][2];
    int cur_g = -1;
    int it0_group = GROUPED ? it0 * BK / group_size : 0;

    auto set_zero = [&](int g) {
#pragma unroll
        for (int s = 0; s < SLICES; s++)
#pragma unroll
            for (int x = 0; x < 2; x++) {
                float z = ZP ? 0.0f : (float)(1 << (BITS - 1));
                if constexpr (ZP)
                    if (colbase >= 0)
                        z = (float)zero_at(zp_e + (size_t)g * (N / 8),
                                           colbase + 16 * colq(s) + 8 * x +
                                               gid);
                z_reg[s][x] = act::from_f(USE_MAGIC ? MAGIC + z : z);
            }
    };
    // the scales of group g from the stage in `slot` (row g - its first)
    auto load_group_smem = [&](int slot, int row, int g) {
        const scale_t *ss =
            reinterpret_cast<const scale_t *>(sS + slot * S_STAGE) +
            row * TILES * 64;
        if constexpr (SOA) {
            // the products of the old group must be in the accumulators
            // before they change unit (the first group: nothing in flight,
            // the accumulators unset and multiplied by 1; the wait and the
            // multiply are unconditional: ptxas serializes every wgmma
            // (C7515) when a path may skip the wait)
            const bool first = cur_g < 0;
            wgmma_wait<0>();
            float ratio[2][2];
#pragma unroll
            for (int s = 0; s < SLICES; s++)
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    float sv = sca::to_f(ss[my_tile * 64 +
                                            scale_pos(16 * colq(s) + 8 * x +
                                                      gid)]);
                    float u = sv != 0.0f ? sv : (first ? 1.0f : u_reg[s][x]);
                    ratio[s][x] = first ? 1.0f : __fdiv_rn(u_reg[s][x], u);
                    u_reg[s][x] = u;
                    m_reg[s][x] = act::from_f(sv != 0.0f ? 1.0f : 0.0f);
                }
#pragma unroll
            for (int s = 0; s < SLICES; s++)
#pragma unroll
                for (int i = 0; i < ACC; i += 4) {
                    acc[s][i + 0] *= ratio[s][0];
                    acc[s][i + 1] *= ratio[s][0];
                    acc[s][i + 2] *= ratio[s][1];
                    acc[s][i + 3] *= ratio[s][1];
                }
        } else {
#pragma unroll
            for (int s = 0; s < SLICES; s++)
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    scale_t sv = ss[my_tile * 64 +
                                    scale_pos(16 * colq(s) + 8 * x + gid)];
                    if constexpr (SCALE_SAME)
                        s_reg[s][x] = sv;
                    else
                        s_reg[s][x] = sca::to_f(sv);
                }
        }
        if constexpr (ZP)
            set_zero(g);
        cur_g = g;
    };
    // grouped scales arrive with their stage (load_group_smem, which also
    // reloads zero points); the zero points of a channelwise or symmetric
    // layer are set once here (PERSIST: once an item, below)
    if constexpr (!PERSIST)
        set_zero(GROUPED ? it0_group : 0);

    // A fragments of step kk, slice s (see the header): 4-bit, one word of
    // the lane's vector (2h + s) gives the four code pairs at shifts 0
    // (b0 j0), 8 (b0 j1), 4 (b1 j0), 12 (b1 j1); 8-bit, words j0 and j1 of
    // vector h, low bytes b0, high bytes b1.
    // wd: [slice][j0, j1] (4-bit: the same word twice)
    auto fetch_codes = [&](const int4 *cB, int kk, u32 (&wd)[SLICES][2]) {
        const int4 *bp = cB + (kk * TILES + my_tile) * TILE_VECS +
                         lane * LANE_VECS;
        if constexpr (SLICES == 1) { // word w (4-bit), words 2w, 2w+1 (8)
            if constexpr (BITS == 4) {
                wd[0][0] = wd[0][1] = reinterpret_cast<const u32 *>(bp)[w];
            } else {
                int2 x = reinterpret_cast<const int2 *>(bp)[w];
                wd[0][0] = (u32)x.x;
                wd[0][1] = (u32)x.y;
            }
        } else if constexpr (BITS == 4) {
            int2 x = reinterpret_cast<const int2 *>(bp)[h];
            wd[0][0] = wd[0][1] = (u32)x.x;
            wd[SLICES - 1][0] = wd[SLICES - 1][1] = (u32)x.y;
        } else {
            int4 x = bp[h];
            wd[0][0] = (u32)x.x;
            wd[0][1] = (u32)x.y;
            wd[SLICES - 1][0] = (u32)x.z;
            wd[SLICES - 1][1] = (u32)x.w;
        }
    };
    auto convert_codes = [&](const u32 (&wd)[SLICES][2],
                             u32 (&af)[SLICES][4]) {
#pragma unroll
        for (int s = 0; s < SLICES; s++) {
#pragma unroll
            for (int x = 0; x < 2; x++) { // x = 0: column j0 (lo), 1: j1 (hi)
                u32 v0, v1; // b0 (k 2q, 2q+1), b1 (+8)
                if constexpr (BITS == 4) {
                    v0 = (wd[s][x] >> (8 * x)) & 0x000f000fu;
                    v1 = (wd[s][x] >> (8 * x + 4)) & 0x000f000fu;
                } else {
                    v0 = wd[s][x] & 0x00ff00ffu;
                    v1 = (wd[s][x] >> 8) & 0x00ff00ffu;
                }
                act2_t zb = act::pair(z_reg[s][x], z_reg[s][x]);
                act2_t d0, d1;
                if constexpr (BITS == 4 && USE_MAGIC && !SOA) {
                    // the mask and the exponent in one lop3 ((a & b) | c:
                    // ptxas kept an AND and an OR), then the exact
                    // subtraction of codes_minus_zero
                    d0 = __hsub2(from_u32<act2_t>(and_or(
                                     wd[s][x] >> (8 * x), 0x000f000fu,
                                     MAGIC_BITS * 0x00010001u)),
                                 zb);
                    d1 = __hsub2(from_u32<act2_t>(and_or(
                                     wd[s][x] >> (8 * x + 4), 0x000f000fu,
                                     MAGIC_BITS * 0x00010001u)),
                                 zb);
                } else if constexpr (SOA) {
                    // m (c + MAGIC) - m (z + MAGIC), m = 0 or 1: exact
                    act2_t mb = act::pair(m_reg[s][x], m_reg[s][x]);
                    act2_t nz = __hneg2(__hmul2(zb, mb));
                    d0 = codes_minus_zero_masked(v0, mb, nz);
                    d1 = codes_minus_zero_masked(v1, mb, nz);
                } else {
                    d0 = codes_minus_zero(v0, zb);
                    d1 = codes_minus_zero(v1, zb);
                }
                if constexpr (GROUPED && !SOA) {
                    d0 = apply_scale(d0, s_reg[s][x], s_reg[s][x]);
                    d1 = apply_scale(d1, s_reg[s][x], s_reg[s][x]);
                }
                af[s][x] = as_u32(d0);     // a0 (j0) / a1 (j1)
                af[s][2 + x] = as_u32(d1); // a2 (j0) / a3 (j1)
            }
        }
    };
    auto dequant = [&](const int4 *cB, int kk, u32 (&af)[SLICES][4]) {
        u32 wd[SLICES][2];
        fetch_codes(cB, kk, wd);
        convert_codes(wd, af);
    };

    // A fragments, two register sets: step kk fills set kk % 2, which
    // wgmma.wait_group 1 after step kk - 1 freed (one group in flight;
    // ptxas serializes the wgmmas when more sets rotate: measured)
    // (DEPTH 2: four sets, wgmma.wait_group 2; KSTEPS is a multiple of
    // both, so the set of a step is known from the unrolled kk)
    constexpr int NSETS = DEPTH == 1 ? 2 : 4;
    static_assert(KSTEPS % NSETS == 0, "register sets rotate per stage");
    u32 af[NSETS][SLICES][4];
    // GROUP_STAGES (groups of whole stages, known when the unit is
    // generated): the per-step group check below is compiled out of the
    // unrolled product loop, which alone took Mixtral-8x7B at M = 4096
    // from 6740 to 6417 us on the H200
    const bool stage_groups =
        GROUPED && (GROUP_STAGES || group_size % BK == 0);
    // the group of the stage (stage_groups), followed from stage to stage
    // (stages come in order) without a run-time division: sg_next is the
    // first k of the next group
    int sg = it0_group, sg_next = GROUPED ? (it0_group + 1) * group_size : 0;
    // release (WS): the ring slot of the previous stage, whose products
    // are done after this stage's first wgmma.wait_group 1 (-1: none)
    // with_tail (bool_c): the tail rows' products too; the main loop is
    // compiled once with and once without them, so that a CTA without a
    // tail runs the loop of a unit without TAIL_M (a run-time test beside
    // each product made ptxas inject warpgroup.arrive fences, C7519, and
    // cost Mixtral-8x7B M = 4096 6%)
    auto compute_stage = [&](int it, int slot, int release, auto with_tail) {
        const int4 *cB = sB + slot * B_STAGE;
        const u32 a_base = smem_addr(sA + slot * A_STAGE);
        const u64 desc0 = smem_desc(a_base);
        if constexpr (GROUPED) {
            if (stage_groups) {
                while (sg_next <= it * BK)
                    sg++, sg_next += group_size;
                if (sg != cur_g)
                    load_group_smem(slot, 0, sg);
            }
        }
        // WS: the codes of step kk + 1 are read from shared memory before
        // step kk's products and wait, so their latency hides behind them
        u32 wd_next[SLICES][2];
        // SPLIT_CODES: the vector of pair p holds steps 2p, 2p + 1 (the
        // warp's words of each, moe_gemm_common.cu's stage_copy); pair
        // p + 1 is read at step 2p
        int4 pairs[KSTEPS / 2];
        auto fetch_pair = [&](int p) {
            pairs[p] = cB[((p * TILES + my_tile) * 2 + h) * TILE_VECS + lane];
        };
        if constexpr (SPLIT_CODES)
            fetch_pair(0);
        else if constexpr (WS)
            fetch_codes(cB, 0, wd_next);
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            if constexpr (GROUPED && !GROUP_STAGES) {
                if (!stage_groups) {
                    int g = (it * BK + kk * 16) / group_size;
                    if (g != cur_g)
                        load_group_smem(slot, g - it * BK / group_size, g);
                }
            }
            if constexpr (SPLIT_CODES) {
                if (kk % 2 == 0 && kk + 2 < KSTEPS)
                    fetch_pair(kk / 2 + 1);
                const int4 x = pairs[kk / 2];
                u32 wd[SLICES][2];
                wd[0][0] = wd[0][1] = (u32)(kk % 2 ? x.z : x.x);
                wd[1][0] = wd[1][1] = (u32)(kk % 2 ? x.w : x.y);
                convert_codes(wd, af[kk % NSETS]);
            } else if constexpr (WS) {
                u32 wd[SLICES][2];
#pragma unroll
                for (int s = 0; s < SLICES; s++)
                    wd[s][0] = wd_next[s][0], wd[s][1] = wd_next[s][1];
                if (kk + 1 < KSTEPS)
                    fetch_codes(cB, kk + 1, wd_next);
                convert_codes(wd, af[kk % NSETS]);
            } else {
                dequant(cB, kk, af[kk % NSETS]);
            }
            // (the stage's descriptor plus 32 kk bytes, 2 kk in the
            // address field: a_base is 1024-aligned, the field does not
            // carry; before, ptxas rebuilt the descriptor every step)
            const u64 desc = desc0 + 2u * (u32)kk;
            const int scale_d = it > it0 || kk > 0;
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < SLICES; s++)
                wgmma_step(acc[s], af[kk % NSETS][s], desc, scale_d);
#ifdef W16_WGMMA_TAIL_ASM
            // the tail rows start BM rows (BM 128-byte rows, BM * 8 in
            // the descriptor's address field) into the stage's A tile
            if constexpr (decltype(with_tail)::value) {
#pragma unroll
                for (int s = 0; s < SLICES; s++)
                    wgmma_tail_step(acc_t[s], af[kk % NSETS][s],
                                    desc + (u64)(BM * 8), scale_d);
            }
#endif
            wgmma_commit();
            // step kk - DEPTH done: its registers are free
            wgmma_wait<DEPTH>();
            if constexpr (WS) {
                // every consumer thread arrives for its own reads (a
                // __syncwarp and one lane's arrive made ptxas serialize
                // the wgmmas of channelwise layers: C7513)
                if (kk == DEPTH - 1 && release >= 0)
                    mbar_arrive(&s_empty[release]);
            }
        }
        // the stage's last products stay in flight into the next stage
    };

    // ---- an item: the pipeline, then the epilogue ---------------------------
    // A stage's buffer is refilled two iterations after it was computed:
    // by then every warpgroup has waited for all but its latest products
    // (wgmma.wait_group 1), which read the stage in between, so the
    // tensor cores never drain at a stage boundary. (Non-WS: LOOKAHEAD =
    // STAGES - 2 loads in flight.)
    int gst = 0; // WS: stages consumed, the ring's position
    // the C tile (see the epilogue below)
    float *const c_tile = reinterpret_cast<float *>(
        reinterpret_cast<char *>(smem4) + (PERSIST ? PIPE_BYTES : 0));
    // PERSIST: the consumers' item, from entry b of the ring
    auto load_item = [&](int b) {
        mblk = s_item[b][0];
        ncol = s_item[b][1];
        split = s_item[b][2];
        e = s_item[b][3];
        tail = s_item[b][4] != 0;
    };
    // with_tail (bool_c, PERSIST): the item's kind, known to the loop
    auto run_item = [&](int b, auto with_tail_kind) {
        if constexpr (WS) {
            // WS: the producer's ring; the padding rows are zero
            auto consume = [&](auto with_tail) {
                for (int it = 0; it < iters; it++, gst++) {
                    const int slot = gst % STAGES;
                    mbar_wait(&s_full[slot], (gst / STAGES) & 1);
                    fence_proxy_async(); // the copies, to wgmma's async proxy
                    compute_stage(it0 + it, slot,
                                  it > 0 ? (gst - 1) % STAGES : -1,
                                  with_tail);
                }
            };
            if constexpr (PERSIST)
                consume(with_tail_kind);
            else if (TAIL_M > 0 && tail)
                consume(bool_c<true>{});
            else
                consume(bool_c<false>{});
        } else {
            constexpr int LOOKAHEAD = STAGES - 2;
#pragma unroll
            for (int s = 0; s < LOOKAHEAD; s++) {
                if (s < iters)
                    load_stage(it0 + s, s);
                cp_async_commit();
            }
            for (int it = 0; it < iters; it++) {
                cp_async_wait<LOOKAHEAD - 1>();
                fence_proxy_async();
                __syncthreads(); // stage `it` visible; stage it-2 consumed
                int next = it + LOOKAHEAD;
                if (next < iters)
                    load_stage(it0 + next, next % STAGES);
                cp_async_commit();
                compute_stage(it0 + it, it % STAGES, -1, bool_c<false>{});
            }
        }
        wgmma_wait<0>();
        // PERSIST: the item's last stage, free for the next item's copies
        if (PERSIST && iters > 0)
            mbar_arrive(&s_empty[(gst - 1) % STAGES]);
        // (braces around each #pragma below: in a generic lambda NVCC
        // misreads a #pragma that is an if's whole statement)
        if constexpr (SOA) {
#pragma unroll
            for (int s = 0; s < SLICES; s++) {
#pragma unroll
                for (int i = 0; i < ACC; i += 4) {
                    acc[s][i + 0] *= u_reg[s][0];
                    acc[s][i + 1] *= u_reg[s][0];
                    acc[s][i + 2] *= u_reg[s][1];
                    acc[s][i + 3] *= u_reg[s][1];
                }
            }
        }
        if (iters == 0) { // a split without K stages (not chosen by the runtime)
#pragma unroll
            for (int s = 0; s < SLICES; s++) {
#pragma unroll
                for (int i = 0; i < ACC; i++)
                    acc[s][i] = 0.0f;
#pragma unroll
                for (int i = 0; i < TAIL_ACC; i++)
                    acc_t[s][i] = 0.0f;
            }
        }
        // every stage consumed (WS: the producer has no copy left in
        // flight; PERSIST: every consumer is done with the C chunk of the
        // item before)
        if constexpr (WS) {
            bar_sync<1, NTHREADS>();
        } else {
            cp_async_wait<0>();
            __syncthreads();
        }

        // ---- the accumulators to the C tile (rows: routed rows) ---------
        // d[4i + 0..3] of slice s: (m row gid, rows 8i + 2 tig, +1), then
        // (m row gid + 8, the same two rows). The C tile shares the
        // stages' memory; PERSIST: it has its own, C_ROWS rows, and the
        // tile goes out in chunks of C_ROWS rows while the producer fills
        // the stages with the next item's.
        // (PERSIST: the item again from its entry, which the consumers
        // release after the epilogue: fewer registers live in the loop)
        if constexpr (PERSIST) {
            load_item(b);
            item_operands();
        }
#pragma unroll
        for (int ch = 0; ch < C_CHUNKS; ch++) {
            const int c0 = ch * C_ROWS;
            if (c0 >= BM && !tail) // no tail rows to store
                break;
            if (ch > 0) // the chunk before is out
                bar_sync<1, NTHREADS>();
            // rows 8 i .. 8 i + 7 (i: a compile-time group) of the chunk
            auto put = [&](const float *d, int i, int c) {
                if (8 * i >= c0 && 8 * i < c0 + C_ROWS) {
                    const int r = 8 * i - c0 + 2 * tig;
                    c_tile[r * C_LD + c] = d[0];
                    c_tile[(r + 1) * C_LD + c] = d[1];
                    c_tile[r * C_LD + c + 8] = d[2];
                    c_tile[(r + 1) * C_LD + c + 8] = d[3];
                }
            };
#pragma unroll
            for (int s = 0; s < SLICES; s++) {
                const int c = my_tile * 64 + 16 * colq(s) + gid;
#pragma unroll
                for (int i = 0; i < BM / 8; i++)
                    put(&acc[s][4 * i], i, c);
                // rows BM .. (PERSIST: only where the item has a tail,
                // so that the tail's sums are live in its items only)
                if (TAIL_M > 0 && (!PERSIST || tail)) {
#pragma unroll
                    for (int i = 0; i < TAIL_M / 8; i++)
                        put(&acc_t[s][4 * i], BM / 8 + i, c);
                }
            }
            if constexpr (WS)
                bar_sync<1, NTHREADS>();
            else
                __syncthreads();
            store_c_tile(c_tile, s_rows[b] + c0, tid, e, ncol, split, splits, N,
                         ip, n_slots, sc_e, bias, out, round_out, limit,
                         alpha, beta,
                         ROWS - c0 < C_ROWS ? ROWS - c0 : C_ROWS);
        }
    };

    if constexpr (!PERSIST) {
        if constexpr (WS)
            bar_sync<2, CTA_THREADS>(); // the split codes' zero rows
        run_item(0, bool_c<false>{});
    } else {
        bar_sync<2, CTA_THREADS>();
        // The items come without tail rows, then with (the producer's
        // order): a loop for each kind, so that no loop holds both kinds
        // of products (with both, ptxas serialized every wgmma below 224
        // consumer registers, C7512, and the producer then spilled). A
        // pass stops at an entry of the other kind, which stays for the
        // next (its full barrier's phase is complete: the wait returns).
        int n = 0;
        auto items = [&](auto with_tail) {
            for (;; n++) {
                const int b = n % 2;
                mbar_wait(&s_ifull[b], (n / 2) & 1);
                load_item(b);
                if (e < 0 || tail != decltype(with_tail)::value)
                    return;
                item_operands();
                colbase = tile_col(my_tile, ncol, N, ip);
                cur_g = -1;
                it0_group = GROUPED ? it0 * BK / group_size : 0;
                sg = it0_group;
                sg_next = GROUPED ? (it0_group + 1) * group_size : 0;
                set_zero(GROUPED ? it0_group : 0);
                run_item(b, with_tail);
                mbar_arrive(&s_iempty[b]); // the item's rows and entry: read
            }
        };
        items(bool_c<false>{});
        if constexpr (TAIL_M > 0)
            items(bool_c<true>{});
    }
}
