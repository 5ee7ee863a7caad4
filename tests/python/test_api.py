"""test_api.py - the wna16 Python package over the C library (test
python_api): errors, specs, selection, checkpoints and zero-copy arrays
(numpy, buffer protocol, DLPack), repack of a layer and of a checkpoint,
and the CPU fused MoE in both activation formats with expert maps, router
weights on the input, activations and biases, against ref.py."""
import ctypes
import os

import numpy as np
import pytest

import wna16
import ref


def test_version_and_library():
    assert wna16.version() == wna16.__version__
    assert os.path.exists(wna16.library_path) or \
        wna16.library_path == "libwna16.so.0"


def test_error_carries_the_message(tmp_path):
    with pytest.raises(wna16.Error) as e:
        wna16.Context(cpu_threads=-3)
    assert e.value.name == "EINVAL" and e.value.status == -1
    assert "cpu_threads -3" in str(e.value)
    with wna16.Context() as c:
        with pytest.raises(wna16.Error) as e:
            c.open_checkpoint(tmp_path / "missing")
        assert "missing" in e.value.message


def test_log_callback_cache_and_specs(golden, tmp_path, cpu_ok):
    seen = []
    cache = tmp_path / "kernels"
    c = wna16.Context(log=lambda level, msg: seen.append((level, msg)),
                      log_level="debug", cpu_threads=1, cache_dir=cache)
    names = [n for _, n in c.specs("backend")]
    assert {"marlin", "triton", "cpu"} <= set(names)
    assert ("format", "gptq") in c.specs()
    ck = c.open_checkpoint(golden)
    lay = ck.layer(ck.moe_layers()[0])
    packed = c.repack_layer(lay, "triton", target="cpu")
    assert seen and all(lv in ("debug", "info", "warn", "error")
                        for lv, _ in seen)
    assert any(cache.iterdir())  # the kernels went to the context's cache
    info = c.cache_info()
    assert info["dir"] == str(cache) and info["compiles"] > 0
    assert info["files"] == info["disk_writes"] and info["bytes"] > 0
    assert c.cache_clear() == info["files"]
    assert c.cache_info()["files"] == 0
    # closing the context closes what was made from it, newest first
    c.close()
    assert packed._ptr is None and ck._ptr is None
    with pytest.raises(ValueError, match="closed"):
        ck.moe_layers()


def test_select(ctx, layer):
    # kernel_platforms: as if this build generated CUDA and CPU kernels,
    # so the answer does not depend on how the library was built
    every = (1 << 0) | (1 << 2)
    sel = ctx.select_for(layer, device={"platform": "cuda", "cc": (9, 0)},
                         kernel_platforms=every)
    assert sel.backend == "marlin" and sel.format == "gptq"
    with pytest.raises(wna16.Error) as e:
        ctx.select_for(layer, device={"platform": "cpu", "cc": (0, 0)},
                       backend="marlin", kernel_platforms=every)
    assert e.value.name == "EUNSUPPORTED" and "MARLIN" in e.value.message
    with pytest.raises(wna16.Error) as e:
        ctx.select_for(layer, device={"platform": "cuda", "cc": (9, 0)},
                       activation="nonsense", kernel_platforms=every)
    assert e.value.name == "EINVAL" and "nonsense" in e.value.message


def test_select_cpu(ctx, layer, cpu_ok):
    cpu = ctx.select_for(layer, device={"platform": "cpu", "cc": (0, 0)})
    assert cpu.backend == "cpu"


def test_checkpoint_views_are_zero_copy(ck, layer):
    assert layer.E == 2 and layer.H == 256 and layer.I == 256
    assert layer.quant["bits"] == 4 and layer.quant["bias"] is False
    name = f"{layer.prefix}.0.gate_proj.qweight"
    a = ck.tensor(name)
    assert a.dtype == np.int32 and a.shape == (32, 256)
    assert not a.flags.writeable  # the mapped file
    c = wna16.core._lib.lib.wna16_checkpoint_find(ck.ptr, name.encode())
    assert a.__array_interface__["data"][0] == c.contents.data
    assert name in layer.names()


def test_tensor_set_views(ctx):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = bytearray(np.arange(6, dtype=np.int32).tobytes())
    ts = wna16.TensorSet(ctx, {"a": a})
    ts.add("b", memoryview(b).cast("i"))
    a[1, 1] = 42.0  # the set sees the caller's memory
    assert ts["a"][1, 1] == 42.0
    assert ts["a"].__array_interface__["data"][0] == \
        a.__array_interface__["data"][0]
    assert list(ts["b"]) == list(range(6)) and set(ts.names()) == {"a", "b"}
    with pytest.raises(ValueError, match="not C-contiguous"):
        ts.add("c", a.T)
    with pytest.raises(wna16.Error):  # the library refuses a second "a"
        ts.add("a", a)


def test_cuda_array_interface_view(layer, triton):
    class Device:  # a CUDA array (Numba/CuPy protocol); never dereferenced
        __cuda_array_interface__ = {"version": 3, "shape": (2, 256),
                                    "typestr": "<f2", "data": (4096, False),
                                    "strides": None}
    v = wna16.core._tensor.view(Device(), "x")
    assert v.device == "cuda" and v.dtype == "F16" and v.ptr == 4096
    _, moe = triton
    with pytest.raises(ValueError, match="CudaMoe"):
        moe.run(Device(), np.zeros((2, 2), np.int32),
                np.zeros((2, 2), np.float32), out=np.empty((2, 256),
                                                           np.float16))


def test_dlpack_view():
    class Producer:  # a DLPack producer that is not numpy or torch
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, stream=None):
            return self.arr.__dlpack__()
    if not hasattr(np.ndarray, "__dlpack__"):
        pytest.skip("numpy without DLPack")
    arr = np.arange(8, dtype=np.float16).reshape(2, 4)
    v = wna16.core._tensor.view(Producer(arr), "x")
    assert v.dtype == "F16" and v.shape == (2, 4) and v.device == "cpu"
    assert v.ptr == arr.__array_interface__["data"][0]


def test_repack_layer_and_checkpoint(ctx, ck, layer, tmp_path, cpu_ok):
    cpu = ctx.repack_layer(layer, "marlin", target="cpu")
    refp = ctx.repack_layer(layer, "marlin", target="reference")
    assert cpu.names() == refp.names()
    for n in cpu.names():
        assert np.array_equal(cpu[n], refp[n]), n
    out = tmp_path / "marlin.safetensors"
    s = ctx.repack_checkpoint(ck.path, out, "marlin", target="cpu")
    assert s["backend"] == "marlin" and s["layers"] == 1
    whole = ctx.open_checkpoint(out)
    for n in cpu.names():
        assert np.array_equal(whole.tensor(n), cpu[n]), n
    # the model's dtype (config.json: float16), and a checkpoint directory
    # of small shards that reads back as the same tensors
    assert s["dtype"] == "F16" and "torch_dtype float16" in s["dtype_reason"]
    d = ctx.repack_checkpoint(ck.path, str(tmp_path / "dir") + "/", "marlin",
                              target="cpu", max_shard_size=65536)
    assert d["shards"] > 1
    shards = ctx.open_checkpoint(tmp_path / "dir")
    for n in cpu.names():
        assert np.array_equal(shards.tensor(n), cpu[n]), n
    b = ctx.repack_checkpoint(ck.path, tmp_path / "bf16.safetensors",
                              "marlin", target="cpu", dtype="bfloat16")
    assert b["dtype"] == "BF16" and "requested" in b["dtype_reason"]
    # from arrays in memory (a dict of the checkpoint's tensors)
    arrays = {n: ck.tensor(n) for n in layer.names()}
    mem = ctx.repack_layer(None, "marlin", format="gptq", tensors=arrays,
                           prefix=layer.prefix, E=layer.E, H=layer.H,
                           I=layer.I, quant=layer.quant)
    for n in cpu.names():
        assert np.array_equal(mem[n], cpu[n]), n


def _routing(M, topk, E, seed):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:topk] for _ in range(M)]).astype(
        np.int32)
    w = rng.random((M, topk)).astype(np.float32)
    return ids, w / w.sum(1, keepdims=True)


@pytest.mark.parametrize("M", [1, 7, 33])
def test_fused_moe_standard(layer, weights, triton, M):
    _, moe = triton
    rng = np.random.default_rng(M)
    x = (rng.standard_normal((M, layer.H)) * 0.5).astype(np.float16)
    ids, w = _routing(M, 2, layer.E, M)
    out = np.empty((M, layer.H), np.float16)
    got = moe.run(x, ids, w, out=out)
    assert got is out  # written in place
    want = ref.moe(x.astype(np.float64), ids, w, *weights, "F16")
    ref.close(out.astype(np.float64), want, f"M={M}")


def test_fused_moe_bf16_gelu_expert_map_on_input(ctx, layer, weights, triton):
    packed, f16_moe = triton
    # the checkpoint is a float16 model: its layer (quant carries the
    # model's dtype) refuses bfloat16 activations, as vLLM's kernels would;
    # a layer created without a model dtype takes either
    assert layer.quant["model_dtype"] == "float16"
    with pytest.raises(wna16.Error) as e:
        f16_moe.run(np.zeros((1, layer.H), np.uint16),
                    np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32),
                    act_dtype="BF16")
    assert e.value.name == "EINVAL" and "model dtype is F16" in e.value.message
    moe = ctx.moe_layer("triton", packed, layer.prefix, layer.E, layer.H,
                        layer.I, dict(layer.quant, model_dtype=None))
    M = 9
    rng = np.random.default_rng(5)
    xf = rng.standard_normal((M, layer.H)) * 0.5
    x = ref.from_float(xf, "BF16")  # uint16 bits
    emap = np.array([-1, 1, -1, 0], np.int32)  # 4 global, 2 here
    ids = rng.integers(0, 4, (M, 1)).astype(np.int32)
    w = rng.random((M, 1)).astype(np.float32)
    got = moe.run(x, ids, w, activation="gelu", expert_map=emap,
                  apply_router_weight_on_input=True, act_dtype="BF16")
    want = ref.moe(ref.to_float(x, "BF16"), ids, w, *weights, "BF16",
                   activation="gelu", expert_map=emap, on_input=True)
    ref.close(ref.to_float(got, "BF16"), want, "bf16 gelu map on-input")
    assert np.all(ref.to_float(got, "BF16")[
        [emap[i] < 0 for i in ids[:, 0]]] == 0)


def test_fused_moe_batched(layer, weights, triton):
    _, moe = triton
    T = 6
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((layer.E, T, layer.H)) * 0.5).astype(np.float16)
    counts = np.array([4, 0], np.int32)
    got = moe.run_batched(x, counts)
    W13, W2 = weights
    for e in range(layer.E):
        for r in range(T):
            if r >= counts[e]:
                assert np.all(got[e, r] == 0)
                continue
            want = ref.moe(x[e, r][None].astype(np.float64),
                           np.array([[e]]), np.ones((1, 1)), W13, W2, "F16")
            ref.close(got[e, r][None].astype(np.float64), want,
                      f"batched e={e} r={r}")


def test_fused_moe_bias(ctx, layer, weights, cpu_ok):
    # the CPU backend's layout holds expert biases (float32): the layer's
    # tensors plus bias arrays from numpy
    packed = ctx.repack_layer(layer, "cpu", target="cpu")
    rng = np.random.default_rng(11)
    b13 = (rng.standard_normal((layer.E, 2 * layer.I)) * 0.1).astype(
        np.float32)
    b2 = (rng.standard_normal((layer.E, layer.H)) * 0.1).astype(np.float32)
    arrays = {n: packed[n] for n in packed.names()}
    arrays[f"{layer.prefix}.w13_bias"] = b13
    arrays[f"{layer.prefix}.w2_bias"] = b2
    q = dict(layer.quant, bias=True)
    moe = ctx.moe_layer("cpu", arrays, layer.prefix, layer.E, layer.H,
                        layer.I, q)
    M = 5
    x = (rng.standard_normal((M, layer.H)) * 0.5).astype(np.float16)
    ids, w = _routing(M, 2, layer.E, 1)
    got = moe.run(x, ids, w)
    want = ref.moe(x.astype(np.float64), ids, w, *weights, "F16",
                   b13=b13.astype(np.float64), b2=b2.astype(np.float64))
    ref.close(got.astype(np.float64), want, "bias")
    nobias = ref.moe(x.astype(np.float64), ids, w, *weights, "F16")
    assert np.max(np.abs(want - nobias)) > 0.05  # the bias matters


def test_fused_moe_numerics(ctx, layer, cpu_ok):
    # the layer says which numeric contract its kernels compute: triton's
    # layout runs the portable float32 kernels; the cpu layout the int8
    # dot products where the CPU has AVX512-VNNI, else float32 too
    packed = ctx.repack_layer(layer, "triton", target="cpu")
    moe = ctx.moe_layer("triton", packed, layer.prefix, layer.E, layer.H,
                        layer.I, dict(layer.quant, model_dtype=None))
    assert moe.numerics == "f32"
    packed = ctx.repack_layer(layer, "cpu", target="cpu")
    moe = ctx.moe_layer("cpu", packed, layer.prefix, layer.E, layer.H,
                        layer.I, dict(layer.quant, model_dtype=None))
    flags = open("/proc/cpuinfo").read().split()
    assert moe.numerics == ("int8-dynamic" if "avx512_vnni" in flags
                            else "f32"), moe.numerics


def test_fused_moe_refusals(layer, triton):
    _, moe = triton
    x = np.zeros((2, layer.H), np.float16)
    ids = np.array([[0, 1], [1, 7]], np.int32)
    w = np.ones((2, 2), np.float32)
    with pytest.raises(wna16.Error, match=r"topk_ids\[1\]\[1\] = 7"):
        moe.run(x, ids, w)
    with pytest.raises(ValueError, match="int32"):
        moe.run(x, ids.astype(np.int64), w)
    with pytest.raises(ValueError, match="act_dtype"):
        moe.run(x.view(np.uint16), ids % 2, w)
    with pytest.raises(ValueError, match="unknown"):
        moe.run(x, ids % 2, w, activation="nope")
