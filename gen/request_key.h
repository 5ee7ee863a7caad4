/*
 * request_key.h - a kernel's identity by its request: the key of the
 * parameters that decide the code a builder makes (the specs' content
 * hashes, the problem's dimensions and options, dtypes, the configuration)
 * and of the generator that makes it, computed without building, printing
 * or hashing the kernel itself. Kernel packs (runtime/cache/pack.h) are
 * indexed by it, and the runtime finds a packed or already loaded kernel
 * from its request in well under a microsecond; the kernel cache's content
 * keys (the printed kernel) stay the identity of JIT-compiled kernels.
 *
 * Two requests with equal keys build the same kernel IR: every field a
 * builder reads is hashed, field by field (struct padding never enters),
 * and the generator version names the code of the builders and emitters
 * (w16_generator_version: the release and a fingerprint of gen/ and
 * templates/ taken when the library was configured).
 */
#ifndef W16_REQUEST_KEY_H
#define W16_REQUEST_KEY_H

#include "base/hash.h"
#include "gen/build_moe.h"
#include "gen/build_repack.h"
#include "gen/moe_cuda.h"

/* "0.1.0+gen.<16 hex digits>": the release and the fingerprint of the
 * generator's sources. Static storage. */
const char *w16_generator_version(void);

/* The key of the repack kernel for `req` (its block-sums kernel when
 * `sums`). */
w16_key_t w16_repack_request_key(const w16_repack_request_t *req, bool sums);

/* The key of the fused-MoE kernel of `stage` for `req`. The run
 * parameters enter as the builder reads them: the activation, its swiglu
 * constants for the activations that have them, the activation dtype,
 * where the router weight applies and the GEMM output rounding (the
 * expert map is the runtime's business and never reaches a kernel). */
w16_key_t w16_moe_request_key(const w16_moe_request_t *req,
                              w16_moe_stage_t stage);

/* The keys of the CUDA fused MoE's translation units (gen/moe_cuda.h),
 * whose text is a function of what is hashed here and of the generator
 * (templates/ and gen/moe_cuda.c are in its version): a GEMM unit by every
 * field of its configuration (the unit kind w13/w2, the tiling row's
 * shape, bits, groups, zero points, act order, the activation, scale and
 * bias dtypes, the activation function), a routing/gather/finalize piece
 * by its activation dtype and piece. The activation format (standard or
 * batched), the expert map and the problem's sizes reach no unit's text:
 * they are kernel arguments, so one unit serves them all. The
 * architecture is the pack entry's (w16_pack_entry_key). */
w16_key_t w16_moe_cuda_gemm_key(const w16_moe_gemm_cfg_t *c);
w16_key_t w16_moe_cuda_aux_key(wna16_dtype_t act_dtype, int piece);
w16_key_t w16_moe_cuda_decode_key(const w16_moe_decode_cfg_t *c);

#endif /* W16_REQUEST_KEY_H */
