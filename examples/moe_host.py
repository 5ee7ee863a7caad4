#!/usr/bin/env python3
"""moe_host.py - examples/moe_host.c in Python: open a Hugging Face
checkpoint (one file or sharded), find the device, let backend selection
pick the layout for it, repack every MoE layer on that device, and run the
fused MoE of each layer for several batch sizes; the first run of a size
compiles (or loads from the kernel cache), the next runs reuse it. One
line per layer with the times.

    moe_host.py CHECKPOINT [--backend NAME] [--batches 1,8,64]
                           [--threads N] [--cache DIR] [--repeat R]

The backend is vLLM's choice for the device; on the CPU, --backend triton
is the layout the generated kernels read fast.

Needs numpy, and the wna16 package on PYTHONPATH (an install puts it in
<prefix>/share/wna16/python; it finds <prefix>/lib/libwna16.so.0 itself,
or $WNA16_LIBRARY). On a CUDA GPU, with torch, arrays are CUDA tensors
run on torch's current stream.
"""
import argparse
import time

import numpy as np

import wna16


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--backend")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cache")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    # 1. a context: the kernel cache and the CPU threads are the host's
    ctx = wna16.Context(cache_dir=a.cache, cpu_threads=a.threads)
    # 2. the checkpoint and its MoE layers
    ck = ctx.open_checkpoint(a.checkpoint)
    prefixes = ck.moe_layers()
    if not prefixes:
        raise SystemExit(f"{a.checkpoint} has no MoE layer")
    # 3. the device, and the backend selection picks for it
    dev = wna16.probe_device()
    gpu = dev["platform"] == "cuda"
    first = ck.layer(prefixes[0])
    sel = ctx.select_for(first, device=dev, backend=a.backend)
    cfg = ck.config
    print(f"device: {dev['name']} ({dev['platform']}); backend: "
          f"{sel.backend}; {len(prefixes)} MoE layers, {first.E} experts, "
          f"hidden {first.H}, intermediate {first.I}, top-{first.topk}, "
          f"{cfg['bits']}-bit")
    first.close()

    # 4. every layer: repack on the device, then the fused MoE per batch
    batches = [int(m) for m in a.batches.split(",")]
    for prefix in prefixes:
        L = ck.layer(prefix)
        t0 = time.perf_counter()
        packed = ctx.repack_layer(L, sel.backend,
                                  target="cuda" if gpu else "cpu")
        line = f"{prefix}: repack {(time.perf_counter() - t0) * 1e3:.1f} ms"
        if gpu:
            moe = ctx.cuda_moe(sel.backend, packed, L.prefix, L.E, L.H, L.I,
                               L.quant)
        else:
            moe = ctx.moe_layer(sel.backend, packed, L.prefix, L.E, L.H,
                                L.I, L.quant)
        topk = max(L.topk, 1)
        for M in batches:
            i = np.arange(M * L.H)
            x = (((i * 7919) % 2001 - 1000) / 1000.0).reshape(M, L.H)
            x = x.astype(np.float16) if L.act_dtype == "F16" else \
                (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            m = np.arange(M)[:, None]
            ids = ((m * 31 + np.arange(topk)[None, :]) % L.E).astype(np.int32)
            w = np.full((M, topk), 1.0 / topk, np.float32)
            out = np.empty((M, L.H), x.dtype)
            times = []
            for _ in range(a.repeat + 1):
                t0 = time.perf_counter()
                moe.run(x, ids, w, out=out, act_dtype=L.act_dtype)
                times.append((time.perf_counter() - t0) * 1e3)
            line += (f"; M={M} first {times[0]:.2f} ms, cached "
                     f"{min(times[1:]):.3f} ms")
        print(line)
        moe.close()
        packed.close()
        L.close()


if __name__ == "__main__":
    main()
