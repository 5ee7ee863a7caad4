"""conftest.py - fixtures of the Python tests: the golden checkpoint
(WNA16_GOLDEN_DIR), a context with a kernel cache under the build tree
(WNA16_TEST_CACHE) and two CPU threads, and the first MoE layer of
gptq_b4_g128 with its dense float weights (ref.py)."""
import os

import pytest

import wna16
import ref


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
def cpu_ok(ctx, layer):
    """Skips what needs generated CPU kernels where the library cannot
    compile them (a build without LLVM 19 and no pack holding them): the
    library says why."""
    try:
        ctx.repack_layer(layer, "triton", target="cpu").close()
    except wna16.Error as e:
        if e.name == "EUNAVAILABLE":
            pytest.skip(e.message)
        raise


@pytest.fixture(scope="session")
def triton(ctx, layer, cpu_ok):
    """The layer repacked to Triton's layout on the CPU, and its fused
    MoE."""
    packed = ctx.repack_layer(layer, "triton", target="cpu")
    moe = ctx.moe_layer("triton", packed, layer.prefix, layer.E, layer.H,
                        layer.I, layer.quant)
    return packed, moe
