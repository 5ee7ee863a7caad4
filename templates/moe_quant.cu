// moe_quant.cu - what every CUDA fused-MoE template that reads the Marlin
// family shares: the element types of activations, scales and biases, the
// Marlin family's addresses (scales, bias, zero points: the specializer's
// contract, gen/moe_cuda.c), the m16n8k16 tensor-core product, the
// exponent trick's constants and the exact dequantization of a code pair,
// and the gated activations. The generator
// writes the prelude (namespace w16cfg: ACT_BF16, SCALE_BF16, BIAS_BF16,
// BITS, ACTIVATION and the ACT_* numbers), then moe_pdl.cu, then this
// text, then the template: moe_gemm_common.cu with moe_marlin_gemm.cu or
// moe_wgmma_gemm.cu (the GEMMs of the chain), or moe_decode.cu (the
// one-kernel decode layer).

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace w16 {

using namespace w16cfg;
typedef unsigned int u32;
typedef unsigned long long u64;

static_assert(BITS == 4 || BITS == 8, "4- or 8-bit codes");
static_assert(!(ZP && BITS != 4), "Marlin zero points are 4-bit");
constexpr bool GATED_ACTIVATION =
    ACTIVATION == ACT_SILU || ACTIVATION == ACT_GELU ||
    ACTIVATION == ACT_GELU_TANH || ACTIVATION == ACT_SWIGLUOAI ||
    ACTIVATION == ACT_SWIGLUSTEP;

// ---- activation and scale element types -----------------------------------

template <bool BF16> struct elem;
template <> struct elem<false> {
    typedef __half t;
    typedef __half2 t2;
    static __device__ __forceinline__ float to_f(t v) { return __half2float(v); }
    static __device__ __forceinline__ t from_f(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ t2 pair(t lo, t hi) { return __halves2half2(lo, hi); }
};
template <> struct elem<true> {
    typedef __nv_bfloat16 t;
    typedef __nv_bfloat162 t2;
    static __device__ __forceinline__ float to_f(t v) { return __bfloat162float(v); }
    static __device__ __forceinline__ t from_f(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ t2 pair(t lo, t hi) { return __halves2bfloat162(lo, hi); }
};

typedef elem<ACT_BF16> act;
typedef elem<SCALE_BF16> sca;
typedef elem<BIAS_BF16> bia;
typedef bia::t bias_t;
typedef act::t act_t;
typedef act::t2 act2_t;
typedef sca::t scale_t;
constexpr bool SCALE_SAME = ACT_BF16 == SCALE_BF16;

template <bool C, typename A, typename B> struct pick { typedef A t; };
template <typename A, typename B> struct pick<false, A, B> { typedef B t; };

template <typename T> __device__ __forceinline__ u32 as_u32(T v)
{
    static_assert(sizeof(T) == 4, "32-bit");
    return *reinterpret_cast<const u32 *>(&v);
}
template <typename T> __device__ __forceinline__ T from_u32(u32 v)
{
    static_assert(sizeof(T) == 4, "32-bit");
    return *reinterpret_cast<const T *>(&v);
}

// ---- addresses of the Marlin family (the specializer's contract) ----------

template <int L> __device__ __forceinline__ int scale_pos_in(int n)
{
    if (L == 0) // 8x8 transpose inside every 64 columns
        return 64 * (n / 64) + 8 * (n % 8) + (n % 64) / 8;
    return 32 * (n / 32) + 8 * ((n % 8) / 2) + 2 * ((n % 32) / 8) + n % 2;
}

__device__ __forceinline__ int bias_pos(int n)
{
    return 32 * (n / 32) + 8 * ((n % 8) / 2) + 2 * ((n % 32) / 8) + n % 2;
}

__device__ __forceinline__ int zero_at(const u32 *row, int n)
{
    int j = (n % 64) / 8;
    int slot = (j % 2) * 4 + j / 2;
    return (int)((row[8 * (n / 64) + n % 8] >> (4 * slot)) & 15u);
}

// ---- the tensor-core product ------------------------------------------------

// D = A * B + C, m16n8k16, fp32 accumulate (C may be D itself)
__device__ __forceinline__ void mma16816_c(float (&d)[4], const u32 (&a)[4],
                                           u32 b0, u32 b1, float c0, float c1,
                                           float c2, float c3)
{
#define W16_MMA(T)                                                           \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 "     \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "                     \
                 "{%10,%11,%12,%13};\n"                                        \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),       \
                   "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3))
    if constexpr (ACT_BF16)
        W16_MMA("bf16");
    else
        W16_MMA("f16");
#undef W16_MMA
}
// ---- dequantization --------------------------------------------------------

// The exponent that turns a small code c in a 16-bit lane into a float of
// value MAGIC + c (exact while c < 2^mantissa bits).
constexpr u32 MAGIC_BITS = ACT_BF16 ? 0x4300u : 0x6400u; // 128 or 1024
constexpr float MAGIC = ACT_BF16 ? 128.0f : 1024.0f;
constexpr bool USE_MAGIC = !(ACT_BF16 && BITS == 8);

// ---- the activation (gated: act(gate, up)) --------------------------------

__device__ __forceinline__ float clamp_max(float x, float hi)
{
    return x > hi ? hi : x;
}
__device__ __forceinline__ float clamp_sym(float x, float lim)
{
    return x > lim ? lim : (x < -lim ? -lim : x);
}
__device__ __forceinline__ float silu_f(float x)
{
    return x / (1.0f + expf(-x));
}

__device__ __forceinline__ float activation(float g, float u, float limit,
                                            float alpha, float beta)
{
    if constexpr (ACTIVATION == ACT_SILU) {
        return silu_f(g) * u;
    } else if constexpr (ACTIVATION == ACT_GELU) {
        return 0.5f * g * (1.0f + erff(g * 0.70710678118654752440f)) * u;
    } else if constexpr (ACTIVATION == ACT_GELU_TANH) {
        float t = tanhf(0.79788456080286535588f * (g + 0.044715f * g * g * g));
        return 0.5f * g * (1.0f + t) * u;
    } else if constexpr (ACTIVATION == ACT_SWIGLUOAI) {
        float gc = clamp_max(g, limit), uc = clamp_sym(u, limit);
        return (uc + beta) * gc * (1.0f / (1.0f + expf(-alpha * gc)));
    } else { // ACT_SWIGLUSTEP (GATED_ACTIVATION)
        return clamp_max(silu_f(g), limit) * clamp_sym(u, limit);
    }
}

__device__ __forceinline__ float round_act(float v)
{
    return act::to_f(act::from_f(v));
}

} // namespace w16
