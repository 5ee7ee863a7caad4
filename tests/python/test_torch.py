"""test_torch.py - wna16.torch.WNA16Experts on the CPU with vLLM's FusedMoE
experts arguments, against the float reference of ref.py (test
python_torch): float16 and bfloat16 tensors in and out without copies,
several batch sizes, int64 top-k ids (vLLM's default before int32),
expert_map with global_num_experts, router weights on the input, the
modular-kernel apply() signature, and refusals."""
import numpy as np
import pytest
import torch

import ref
import wna16
from wna16.torch import WNA16Experts


@pytest.fixture(scope="module")
def experts(ctx, layer, cpu_ok):
    return WNA16Experts.from_checkpoint_layer(ctx, layer, device="cpu")


@pytest.fixture(scope="module")
def experts_any(ctx, layer, cpu_ok):
    """The same experts created without the model's dtype: they take
    float16 and bfloat16 activations (the layer's scales stay float16)."""
    packed = ctx.repack_layer(layer, "triton", target="cpu")
    return WNA16Experts.from_packed(ctx, packed, layer.prefix, layer.E,
                                    layer.H, layer.I,
                                    dict(layer.quant, model_dtype=None),
                                    "triton", "cpu")


def _ref(x, ids, w, weights, dt, **kw):
    xf = x.float().numpy().astype(np.float64)
    return ref.moe(xf, ids.numpy(), w.numpy().astype(np.float64), *weights,
                   dt, **kw)


@pytest.mark.parametrize("M", [1, 4, 40])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward(experts, experts_any, layer, weights, M, dtype):
    g = torch.Generator().manual_seed(M)
    x = (torch.randn(M, layer.H, generator=g) * 0.5).to(dtype)
    logits = torch.randn(M, layer.E, generator=g)
    w, ids = torch.topk(torch.softmax(logits, -1), 2)  # int64 ids
    if dtype == torch.bfloat16:
        # a float16 model's experts refuse bfloat16 activations
        with pytest.raises(wna16.Error, match="model dtype is F16"):
            experts(x, w, ids)
        out = experts_any(x, w, ids)
    else:
        out = experts(x, w, ids)
    assert out.dtype == dtype and out.shape == (M, layer.H)
    dt = "F16" if dtype == torch.float16 else "BF16"
    ref.close(out.float().numpy().astype(np.float64),
              _ref(x, ids, w, weights, dt), f"M={M} {dtype}")


def test_expert_map_on_input_and_apply(experts, layer, weights):
    M = 6
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(M, layer.H, generator=g) * 0.5).half()
    ids = torch.tensor([[0], [3], [2], [1], [3], [0]], dtype=torch.int32)
    w = torch.rand(M, 1, generator=g)
    emap = torch.tensor([1, -1, 0, -1], dtype=torch.int32)  # EP rank
    out = torch.empty_like(x)
    res = experts.apply(out, x, experts.w13_qweight, experts.w2_qweight, w,
                        ids, "silu", 4, emap, None, None, None, None, None,
                        True)
    assert res.data_ptr() == out.data_ptr()  # written in place
    want = _ref(x, ids, w, weights, "F16", expert_map=emap.numpy(),
                on_input=True)
    ref.close(out.float().numpy().astype(np.float64), want, "map on-input")
    assert torch.all(out[1] == 0) and torch.all(out[4] == 0)


def test_moved_module_refused(ctx, layer, cpu_ok):
    e = WNA16Experts.from_checkpoint_layer(ctx, layer, device="cpu")
    x = torch.zeros(1, layer.H, dtype=torch.float16)
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    e(x, torch.ones(1, 2), ids)
    e.w13_scales = e.w13_scales.clone()  # what .to()/.half() do to buffers
    with pytest.raises(RuntimeError, match="w13_scales is no longer"):
        e(x, torch.ones(1, 2), ids)


def test_refusals(experts, layer):
    x = torch.zeros(2, layer.H, dtype=torch.float16)
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    w = torch.ones(2, 2)
    with pytest.raises(ValueError, match="w1"):
        experts.apply(torch.empty_like(x), x, torch.zeros(1),
                      experts.w2_qweight, w, ids, "silu", 2, None)
    with pytest.raises(ValueError, match="global_num_experts 8"):
        experts(x, w, ids, global_num_experts=8)
    with pytest.raises(wna16.Error, match="expert_map"):
        experts(x, w, ids, expert_map=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="not contiguous"):
        experts._moe.run(x.t().contiguous().t(), ids, w)
