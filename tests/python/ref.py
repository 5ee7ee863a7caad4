"""ref.py - an independent float reference for the Python tests: GPTQ
weights dequantized with numpy straight from the checkpoint's tensors
(4-bit, symmetric: zero point 8, as the format defines it), and the fused
MoE computed in float64 with the activation rounded to the activation
dtype before the second GEMM (as wna16's reference and vLLM's kernels
do). Nothing here calls wna16."""
import numpy as np


def bf16_round(x):
    """float64 -> the nearest bfloat16 value (ties to even), as float64."""
    f = np.asarray(x, dtype=np.float32)
    b = f.view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) & \
        np.uint64(0xFFFF0000)
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def rnd(x, dtype):
    if dtype == "F16":
        return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)
    return bf16_round(x)


def to_float(arr, dtype):
    """An activation array (float16, or uint16 bfloat16 bits) as float64."""
    if dtype == "F16":
        return np.asarray(arr).astype(np.float64)
    u = np.asarray(arr).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return u.view(np.float32).astype(np.float64)


def from_float(x, dtype):
    if dtype == "F16":
        return np.asarray(x).astype(np.float16)
    return (bf16_round(x).astype(np.float32).view(np.uint32) >>
            np.uint32(16)).astype(np.uint16)


def gptq_dequant(ck, prefix, e, proj, group_size):
    """Expert e's projection as a dense [N, K] float64 matrix."""
    qw = ck.tensor(f"{prefix}.{e}.{proj}.qweight").astype(np.int64)
    sc = ck.tensor(f"{prefix}.{e}.{proj}.scales").astype(np.float64)
    k8, n = qw.shape
    shifts = 4 * np.arange(8)
    q = ((qw[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(k8 * 8, n)
    g = np.arange(k8 * 8) // group_size
    return ((q - 8) * sc[g, :]).T


def layer_weights(ck, layer):
    """W13 [E, 2I, H] (gate rows then up rows) and W2 [E, H, I]."""
    gs = layer.quant["group_size"]
    w13 = np.stack([np.concatenate(
        [gptq_dequant(ck, layer.prefix, e, "gate_proj", gs),
         gptq_dequant(ck, layer.prefix, e, "up_proj", gs)]) for e in
        range(layer.E)])
    w2 = np.stack([gptq_dequant(ck, layer.prefix, e, "down_proj", gs)
                   for e in range(layer.E)])
    return w13, w2


def act_fn(name, g, u):
    if name == "silu":
        return g / (1 + np.exp(-g)) * u
    if name == "gelu":
        from math import erf
        v = np.vectorize(erf)
        return g / 2 * (1 + v(g / np.sqrt(2))) * u
    raise ValueError(name)


def moe(x, ids, w, W13, W2, dtype, activation="silu", expert_map=None,
        on_input=False, b13=None, b2=None):
    """out [M, H] float64 (before the final rounding)."""
    M, H = x.shape
    I = W2.shape[2]
    out = np.zeros((M, H))
    for m in range(M):
        for j in range(ids.shape[1]):
            g = int(ids[m, j])
            e = int(expert_map[g]) if expert_map is not None else g
            if e < 0:
                continue
            xin = x[m]
            c = w[m, j]
            if on_input:
                xin = rnd(xin * rnd(w[m, j], dtype), dtype)
                c = 1.0
            h = W13[e] @ xin + (b13[e] if b13 is not None else 0)
            a = rnd(act_fn(activation, h[:I], h[I:]), dtype)
            y = W2[e] @ a + (b2[e] if b2 is not None else 0)
            out[m] += c * y
    return out


def close(got, want, what):
    """Within the rounding of float32 sums and one 16-bit ulp: a wrong
    expert, weight, bias or activation is off by far more."""
    err = np.max(np.abs(got - want)) if got.size else 0.0
    scale = max(np.max(np.abs(want)) if want.size else 0.0, 1e-6)
    assert err <= 2 ** -6 * scale + 1e-3, \
        f"{what}: max error {err:.3g} against max |ref| {scale:.3g}"
