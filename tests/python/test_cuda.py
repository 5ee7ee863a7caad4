"""test_cuda.py - the Python binding on a CUDA GPU (test python_cuda; run
on the GPU machine by scripts/gpu_python.sh, skipped elsewhere): CudaMoe
over the golden layer in Marlin's layout with host arrays (synchronous),
with device arrays from the CUDA driver (ctypes, __cuda_array_interface__)
on a stream of its own, the batched format, bad device ids reported by
sync(), and WNA16Experts on torch CUDA tensors run on the current
(non-default) torch stream, all against ref.py."""
import numpy as np
import pytest

import ref
import wna16

if wna16.probe_device()["platform"] != "cuda":
    pytest.skip("no CUDA GPU: " + wna16.probe_device()["notes"],
                allow_module_level=True)


@pytest.fixture(scope="module")
def marlin(ctx, layer):
    # created without the model's dtype (the checkpoint is a float16
    # model), so that it takes the bfloat16 activations below too
    packed = ctx.repack_layer(layer, "marlin", target="cuda")
    moe = ctx.cuda_moe("marlin", packed, layer.prefix, layer.E, layer.H,
                       layer.I, dict(layer.quant, model_dtype=None))
    return packed, moe


@pytest.fixture(scope="module")
def drv():
    from cuda_driver import Driver
    return Driver()


def _routing(M, topk, E, seed):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:topk] for _ in range(M)]).astype(
        np.int32)
    w = rng.random((M, topk)).astype(np.float32)
    return ids, w / w.sum(1, keepdims=True)


@pytest.mark.parametrize("M", [1, 16, 64])
def test_host_arrays(layer, weights, marlin, M):
    _, moe = marlin
    rng = np.random.default_rng(M)
    x = (rng.standard_normal((M, layer.H)) * 0.5).astype(np.float16)
    ids, w = _routing(M, 2, layer.E, M)
    got = moe.run(x, ids, w)
    want = ref.moe(x.astype(np.float64), ids, w, *weights, "F16")
    ref.close(got.astype(np.float64), want, f"host M={M}")


@pytest.mark.parametrize("M", [3, 40])
def test_device_arrays_on_a_stream(layer, weights, marlin, drv, M):
    _, moe = marlin
    rng = np.random.default_rng(100 + M)
    xf = rng.standard_normal((M, layer.H)) * 0.5
    x = ref.from_float(xf, "BF16")
    ids, w = _routing(M, 2, layer.E, M)
    s = drv.stream()
    dx, dids, dw = drv.to_device(x), drv.to_device(ids), drv.to_device(w)
    dout = drv.empty((M, layer.H), np.uint16)
    moe.run(dx, dids, dw, out=dout, act_dtype="BF16", stream=s.value)
    moe.sync(stream=s.value)
    got = ref.to_float(dout.get(), "BF16")
    want = ref.moe(ref.to_float(x, "BF16"), ids, w, *weights, "BF16")
    ref.close(got, want, f"device bf16 M={M}")
    bad = ids.copy()
    bad[M - 1, 1] = 9
    moe.run(dx, drv.to_device(bad), dw, out=dout, act_dtype="BF16",
            stream=s.value)
    with pytest.raises(wna16.Error, match=rf"topk_ids\[{M - 1}\]\[1\]"):
        moe.sync(stream=s.value)


def test_batched(layer, weights, ctx):
    packed = ctx.repack_layer(layer, "batched_marlin", target="cuda")
    moe = ctx.cuda_moe("batched_marlin", packed, layer.prefix, layer.E,
                       layer.H, layer.I, layer.quant)
    T = 8
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((layer.E, T, layer.H)) * 0.5).astype(np.float16)
    counts = np.array([5, 2], np.int32)
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


def test_wna16_experts_on_torch_cuda(ctx, layer, weights):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA (Debian's python3-torch is CPU-only)")
    from wna16.torch import WNA16Experts
    experts = WNA16Experts.from_checkpoint_layer(ctx, layer, device="cuda")
    assert experts.backend == "marlin"
    # without the model's dtype: takes bfloat16 on the float16 model
    any_dtype = WNA16Experts.from_packed(
        ctx, ctx.repack_layer(layer, "marlin", target="cuda"), layer.prefix,
        layer.E, layer.H, layer.I, dict(layer.quant, model_dtype=None),
        "marlin", "cuda")
    s = torch.cuda.Stream()
    for M, dtype in ((1, torch.float16), (33, torch.bfloat16)):
        g = torch.Generator().manual_seed(M)
        x = (torch.randn(M, layer.H, generator=g) * 0.5).to(dtype)
        logits = torch.randn(M, layer.E, generator=g)
        w, ids = torch.topk(torch.softmax(logits, -1), 2)
        run = experts
        if dtype == torch.bfloat16:
            with pytest.raises(wna16.Error, match="model dtype is F16"):
                experts(x.cuda(), w.cuda(), ids.cuda())
            run = any_dtype
        with torch.cuda.stream(s):
            out = run(x.cuda(), w.cuda(), ids.cuda())
        s.synchronize()
        assert out.is_cuda and out.dtype == dtype
        dt = "F16" if dtype == torch.float16 else "BF16"
        want = ref.moe(x.float().numpy().astype(np.float64), ids.numpy(),
                       w.numpy().astype(np.float64), *weights, dt)
        ref.close(out.float().cpu().numpy().astype(np.float64), want,
                  f"torch cuda M={M} {dtype}")
    emap = torch.tensor([1, -1, 0, -1], dtype=torch.int32, device="cuda")
    x = (torch.randn(4, layer.H) * 0.5).half().cuda()
    ids = torch.tensor([[0], [1], [2], [3]], dtype=torch.int32, device="cuda")
    w = torch.rand(4, 1, device="cuda")
    out = experts(x, w, ids, global_num_experts=4, expert_map=emap,
                  apply_router_weight_on_input=True)
    torch.cuda.synchronize()
    want = ref.moe(x.float().cpu().numpy().astype(np.float64),
                   ids.cpu().numpy(), w.cpu().numpy().astype(np.float64),
                   *weights, "F16", expert_map=emap.cpu().numpy(),
                   on_input=True)
    ref.close(out.float().cpu().numpy().astype(np.float64), want,
              "torch cuda map on-input")
