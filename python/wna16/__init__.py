"""wna16 - Python binding of libwna16 (ctypes over the C API; no compiled
extension). Arrays pass in and out without copies: numpy arrays, torch
tensors (CPU, and CUDA on the caller's current stream), DLPack producers
and buffer-protocol objects. Library errors raise wna16.Error carrying
the library's message.

    import wna16
    ctx = wna16.Context(cache_dir="/tmp/wna16-cache", cpu_threads=8)
    ck = ctx.open_checkpoint("Qwen3-30B-A3B-GPTQ-Int4")
    layer = ck.layer(ck.moe_layers()[0])
    sel = ctx.select_for(layer)                 # vLLM's choice for here
    packed = ctx.repack_layer(layer, "triton", target="cpu")
    moe = ctx.moe_layer("triton", packed, layer.prefix, layer.E, layer.H,
                        layer.I, layer.quant)
    out = moe.run(hidden, topk_ids, topk_weights)   # [M, H]

The library: $WNA16_LIBRARY, else next to the package (an install tree's
lib/, a source checkout's build/), else the loader's search path
(docs/api.md, "Python"). wna16.torch.WNA16Experts is the drop-in experts
class for PyTorch engines; wna16.ep.ExpertParallelMoE runs a layer's
experts spread over the ranks of a torch.distributed group.
"""
from ._lib import Error, library_path
from .core import (Checkpoint,
                   Context, CudaMoe, Layer, MoeLayer, Selection, TensorSet,
                   kernel_platforms, moe_params, probe_device, version)

__all__ = ["Error", "Context", "Checkpoint", "Layer", "TensorSet",
           "Selection", "MoeLayer", "CudaMoe", "probe_device", "version",
           "moe_params", "kernel_platforms", "library_path"]
__version__ = version()
