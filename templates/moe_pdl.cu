// moe_pdl.cu - programmatic dependent launch for the fused MoE's chain of
// kernels (routing, gather, GEMM 1, its split-K reduce, GEMM 2, finalize),
// which runtime/cuda/cuda_moe.c launches with w16_cuda_launch_chained: on
// sm_90 a kernel of the chain may be resident and past its prologue while
// the previous one drains its last CTAs, instead of starting after it.
//
// The contract, for every kernel of the chain (in every CTA):
//   w16_pdl_wait()    before the first read of anything an earlier kernel
//                     of the stream wrote and the first global write
//                     (an earlier kernel may still read that memory). It
//                     returns once the previous kernel has completed and
//                     its writes are visible; since that kernel waited the
//                     same way, every earlier one has completed too.
//   w16_pdl_launch()  lets the next kernel of the stream be scheduled (it
//                     starts once every CTA of this one has called it or
//                     exited). Only where it goes affects the speed, never
//                     the results: the next kernel's wait still waits for
//                     this whole grid. Kernels call it right after their
//                     wait, so at most two grids of the chain are resident
//                     at once and the waiting one holds no SM the running
//                     one could still use for CTAs it has not started.
// Reads before the wait, of what a kernel W wrote: safe when a kernel
// between W and the reader (W excluded) calls w16_pdl_launch after its
// wait (all of them do): the reader starts after that kernel's CTAs
// returned from their wait, so W had completed and its writes are
// visible. Three kernels read before their wait:
//   GEMM 2 of the mma.sync template (EARLY_B in moe_marlin_gemm.cu) reads
//     the routing (num_post, expert_ids, sorted_ids), or in a SELF_ROUTE
//     unit the layer's top-k ids and expert map (GEMM 1, which routes the
//     same ids itself after its wait, is the kernel between), and issues
//     its first stages' weight loads, then waits for its activations;
//   GEMM 1's split-K reduce (W16_REDUCE in moe_gemm_common.cu) reads the
//     routing (num_post, sorted_ids) of its first position, then waits
//     for the partial sums;
//   the small-M finalize (w16_finalize_small in moe_aux.cu) reads the
//     layer's top-k ids and the expert map of its first row (their writers
//     finished before the routing's wait returned), then waits for y.
// (Calling w16_pdl_launch before those reads, so that they cannot delay
// the next launch, was measured and not kept: Qwen3-30B-A3B M = 1 7%
// faster, DeepSeek-V3/EP8 and Mixtral-8x7B M = 1 about 1% slower.) No
// kernel writes global memory before its wait, and in
// every grid at least CTA 0 waits, also when it has nothing to do: a grid
// completes when its last CTA returns, so one waiting CTA keeps the whole
// grid from completing before the kernel ahead of it has. GEMM 2's CTAs
// past num_post other than CTA 0 return at once (were all of them to,
// with no slot routed to this rank GEMM 2 and then the finalize could
// complete while CTAs of the kernel ahead still read num_post, which the
// next run's routing rewrites); in the other kernels every CTA waits. An
// empty CTA that waits holds its SM slot until the kernel ahead has
// completed: DeepSeek-V3/EP8 M = 1 measured 25.6 -> 24.1 us without that
// (the other layers and M within 0.5%).
// Both are no-ops before sm_90 (and on a plain launch), so sm_80 runs the
// same code serialized by the stream.

namespace w16pdl {

__device__ __forceinline__ void w16_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void w16_pdl_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The usual pair at the top of a kernel of the chain.
__device__ __forceinline__ void w16_pdl_enter()
{
    w16_pdl_wait();
    w16_pdl_launch();
}

} // namespace w16pdl

using namespace w16pdl;
