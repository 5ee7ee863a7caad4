"""conftest.py - fixtures of the Python tests: the golden checkpoint
(WNA16_GOLDEN_DIR), a context with a kernel cache under the build tree
(WNA16_TEST_CACHE) and two CPU threads, and the first MoE layer of
gptq_b4_g128 with its dense float weights (ref.py)."""
import os

import pytest

import wna16
import ref


# tests that run generated CPU kernels (a build without LLVM has none)
requires_cpu = pytest.mark.skipif(
    "cpu" not in wna16.kernel_platforms(),
    reason="this libwna16 has no CPU target (built without LLVM 19)")


@pytest.fixture(scope="session")
def golden():
    d = os.environ.get("WNA16_GOLDEN_DIR", "")
    path = os.path.join(d, "gptq_b4_g128")
    if not os.path.isdir(path):
        pytest.skip(f"no golden checkpoint {path} (WNA16_GOLDEN_DIR)")
    return path


@pytest.fixture(scope="session")
def ctx():
    c = wna16.Context(cache_dir=os.environ.get("WNA16_TEST_CACHE"),
                      cpu_threads=2)
    yield c
    c.close()


@pytest.fixture(scope="session")
def ck(ctx, golden):
    return ctx.open_checkpoint(golden)


@pytest.fixture(scope="session")
def layer(ck):
    return ck.layer(ck.moe_layers()[0])


@pytest.fixture(scope="session")
def weights(ck, layer):
    return ref.layer_weights(ck, layer)


@pytest.fixture(scope="session")
def triton(ctx, layer):
    """The layer repacked to Triton's layout on the CPU, and its fused
    MoE."""
    if "cpu" not in wna16.kernel_platforms():
        pytest.skip("this libwna16 has no CPU target (built without LLVM)")
    packed = ctx.repack_layer(layer, "triton", target="cpu")
    moe = ctx.moe_layer("triton", packed, layer.prefix, layer.E, layer.H,
                        layer.I, layer.quant)
    return packed, moe
