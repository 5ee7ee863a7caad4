/*
 * moe_cpu.h - the dedicated CPU generator of the fused MoE's input and GEMM
 * stages (gen/moe_cpu.c): LLVM IR written directly through the LLVM C API
 * with explicit vector types and x86 intrinsics (vpdpbusd), beside the
 * portable kernel-IR builder (gen/build_moe.c), as gen/moe_cuda.c is for
 * the CUDA tensor cores. It serves a layout only when evaluating the
 * layout's maps shows a code structure its kernels read (vLLM's `cpu`
 * VNNI blocks: 64-byte lines holding, per 32-bit lane L, four consecutive
 * k of column n_lo(L) in low nibbles and n_lo(L) + 8 in high nibbles, then
 * 32 int32 compensation sums per block; or 8-bit codes with each column's
 * K codes in consecutive bytes, as triton's 8-bit layout:
 * gen/moe_cpu_cols.c); the spec's name plays no part.
 *
 * The stages keep the portable kernels' interface (build_moe.h: arguments,
 * the expert runs and sorted positions of runtime/moe_gen.c, the combine
 * stage) with their own formats in the scratch buffers between them: the
 * input stage writes each x row quantized (u8 codes, the row's scale and
 * per-block code sums in the row's 4H bytes), gemm1 writes a in float32 in
 * natural order, gemm2 quantizes the a rows it reads and writes y as the
 * combine stage reads it. The three come from this generator together or
 * not at all.
 */
#ifndef W16_MOE_CPU_H
#define W16_MOE_CPU_H

#include "gen/build_moe.h"

/* The x86 vector features the generator's contracts use, parsed from an
 * LLVM feature string ("+avx512f,+avx512bw,+avx512vnni,..."). */
enum {
    W16_CPU_ISA_AVX512 = 1u << 0,      /* avx512f + avx512bw */
    W16_CPU_ISA_AVX512_VNNI = 1u << 1, /* vpdpbusd on zmm */
    W16_CPU_ISA_AVX512_BF16 = 1u << 2, /* vdpbf16ps on zmm */
};
unsigned w16_moe_cpu_isa(const char *llvm_features);

/* Bump when the generated code changes (it is in every kernel's text). */
#define W16_MOE_CPU_VERSION 5

/* The code structures the generator reads (one kernel shape each). */
typedef enum w16_moe_cpu_shape {
    /* vLLM's `cpu` VNNI blocks (above): 4-bit codes, compensation sums */
    W16_MOE_CPU_VNNI = 0,
    /* each column's K codes contiguous in whole bytes, one byte a k
     * (triton's 8-bit layout): code (n, k) at q0 + e q_e + n q_n + k */
    W16_MOE_CPU_COLS = 1,
} w16_moe_cpu_shape_t;

/* One operand's code blocks, found by evaluating its layouts' maps.
 * Offsets are in storage elements (bytes for codes and zeros, scale_dtype
 * elements for scales, floats for bias) from the tensor's start. */
typedef struct w16_moe_cpu_op {
    w16_moe_cpu_shape_t shape;
    int64_t N, K, G, GSE, bk, KC, NB; /* NB = N / 32 column blocks */
    int64_t q0, q_e, q_nb, q_kc;      /* VNNI block (e, nb, kc) at q0 + ... */
    int64_t q_n;                      /* COLS: bytes from column n to n + 1 */
    /* scales and zeros (e, n, g) at x0 + e x_e + (n / 32) x_nb + (n % 32)
     * x_n + g x_g (VNNI: x_n = 1) */
    int64_t s0, s_e, s_nb, s_n, s_g;
    int64_t z0, z_e, z_nb, z_n, z_g;
    int64_t b0, b_e;                  /* bias (e, n) */
    wna16_dtype_t scale_dtype;        /* F32 (VNNI); F32, BF16 or F16 */
    bool zp, bias;
    int zero; /* the zero point without zero-point tensors */
} w16_moe_cpu_op_t;

/* What probing found for both operands (w13, w2). */
typedef struct w16_moe_cpu_layout {
    w16_moe_cpu_op_t op[2];
} w16_moe_cpu_layout_t;

/* Can the generator build req's input and GEMM kernels under `numerics`
 * on a CPU with `isa`? WNA16_OK with the probed blocks in *out (may be
 * NULL), else EUNSUPPORTED with the reason (the host lacks an
 * instruction, the layout's maps do not have the block structure, ...),
 * for the log. The probe evaluates the maps at every block's base and
 * at every code of the first and the last block (tens of milliseconds on
 * a large layer): keep its result for the builds. */
wna16_status_t w16_moe_cpu_probe(const w16_moe_request_t *req,
                                 wna16_numerics_t numerics, unsigned isa,
                                 w16_moe_cpu_layout_t *out,
                                 wna16_error_t *err);

/* Builds `stage` (INPUT, GEMM1 or GEMM2; COMBINE is build_moe.c's) as a
 * kernel-IR kernel whose code is written by this generator
 * (kir_kernel_t.native): parameters, tiles and argument map as
 * w16_build_moe gives them. `layout`: what w16_moe_cpu_probe found for a
 * request of the same layer (problem, backend, dtypes and gating), or
 * NULL to probe again. */
wna16_status_t w16_build_moe_cpu(wna16_context_t *ctx,
                                 const w16_moe_request_t *req,
                                 wna16_numerics_t numerics, unsigned isa,
                                 const w16_moe_cpu_layout_t *layout,
                                 w16_moe_stage_t stage, w16_moe_kernel_t *out,
                                 wna16_error_t *err);

#endif
