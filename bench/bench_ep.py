#!/usr/bin/env python3
"""bench_ep.py - wna16.ep (expert parallelism over torch.distributed): the
dispatch, compute and combine time of one MoE layer at every world size
asked, beside the single-rank layer (WNA16Experts over every expert on
one device) running the same global batch.

The layer is DeepSeek-V3's shape by default (256 experts, top-8, H 7168,
I 2048, int4 group 128, bf16): on CUDA (NCCL) that size, on the CPU (gloo)
H and I scaled down (--H/--I) since 256 such experts on one CPU are
minutes a call. Each rank holds its experts of expert_partition (wna16.ep)
in the backend's layout (marlin on CUDA, triton on the CPU) with random
codes written straight into the layout (scales, zero points and index
tensors from wna16's repack of one real expert, repeated): the time does
not depend on the codes' values, and a repack of 256 DeepSeek-sized
experts is not what this measures.

Every rank routes its own M tokens (uniform random top-k over the global
experts, renormalized weights), so N ranks run N * M tokens; the
single-rank layer runs those N * M tokens on one device. Times are
medians over --repeat calls after --warmup, each stage the slowest rank's
(ExpertParallelMoE(timing=True): a CUDA device is synchronized between
stages); "total" is the median of the slowest rank's whole call.

    python3 bench/bench_ep.py                      # CPU: gloo, N = 1, 2, 4
    python3 bench/bench_ep.py --backend nccl --procs 1 \\
        --tokens 1,16,64,256,1024,4096             # one GPU: world size 1

The processes are this file run --procs' largest N times (init_method
file://); smaller N are groups of the first N ranks (new_group). With
NCCL rank r uses cuda:r. On a CPU of few cores the N processes share
them: the figures then show the cost of dispatch and combine, not the
speed-up of more devices.
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--procs", default=None,
                    help="world sizes, e.g. 1,2,4 (default: 1,2,4 on gloo, "
                    "1..the GPUs on nccl)")
    ap.add_argument("--tokens", default=None,
                    help="tokens per rank (default 1,16,64 on gloo; "
                    "1,16,64,256,1024,4096 on nccl)")
    ap.add_argument("--E", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--H", type=int, default=None,
                    help="hidden size (default 7168 on nccl, 1024 on gloo)")
    ap.add_argument("--I", type=int, default=None,
                    help="intermediate size (default 2048 on nccl, 256 on "
                    "gloo)")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--dispatch", default="batched,expert_map")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cpu-threads", type=int, default=1,
                    help="wna16 CPU threads per process")
    ap.add_argument("--worker", nargs=3, metavar=("RANK", "WORLD", "DIR"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    gpu = a.backend == "nccl"
    a.H = a.H or (7168 if gpu else 1024)
    a.I = a.I or (2048 if gpu else 256)
    a.tokens = [int(t) for t in (a.tokens or ("1,16,64,256,1024,4096" if gpu
                                              else "1,16,64")).split(",")]
    a.dispatch = a.dispatch.split(",")
    return a


# ---- the layer's tensors ---------------------------------------------------

def gptq_expert(H, I, gs, rng):
    """One expert's GPTQ tensors (symmetric int4) under "bench.experts"."""
    import numpy as np
    zeros = np.int32(np.uint32(0x88888888).view(np.int32))
    t = {}
    for proj, (K, N) in (("gate_proj", (H, I)), ("up_proj", (H, I)),
                         ("down_proj", (I, H))):
        p = f"bench.experts.0.{proj}."
        t[p + "qweight"] = rng.integers(0, 2 ** 32, (K // 8, N),
                                        dtype=np.uint32).view(np.int32)
        t[p + "scales"] = (rng.random((K // gs, N)) * 0.02 +
                           0.01).astype(np.float16)
        t[p + "qzeros"] = np.full((K // gs, N // 8), zeros, np.int32)
        t[p + "g_idx"] = (np.arange(K) // gs).astype(np.int32)
    return t


def experts_of(ctx, a, n, backend, device, seed):
    """WNA16Experts of n experts in `backend`'s layout on `device`: one
    expert repacked by wna16, its codes ("qweight") replaced by random
    words for n experts, every other tensor repeated."""
    import numpy as np
    import torch
    from wna16.torch import WNA16Experts
    quant = {"bits": 4, "group_size": a.group_size, "zeros_stored": True,
             "g_idx_stored": True}
    one = ctx.repack_layer(None, backend, format="gptq",
                           tensors=gptq_expert(a.H, a.I, a.group_size,
                                               np.random.default_rng(seed)),
                           prefix="bench.experts", E=1, H=a.H, I=a.I,
                           quant=quant,
                           target="cuda" if device.type == "cuda" else "cpu")
    proto = WNA16Experts.from_packed(ctx, one, "bench.experts", 1, a.H, a.I,
                                     quant, backend, device)
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for role in proto.names.values():
        t = getattr(proto, role)
        if t.shape[0] != 1:
            raise SystemExit(f"{role}: shape {tuple(t.shape)}, not stacked "
                             "over the experts")
        shape = (n,) + tuple(t.shape[1:])
        if "qweight" in role:
            r = torch.randint(0, 256, shape + (t.element_size(),),
                              dtype=torch.uint8, device=device, generator=g)
            tensors[role] = r.view(t.dtype).reshape(shape)
        else:
            tensors[role] = t.expand(shape).contiguous()
    return WNA16Experts(tensors, n, a.H, a.I, quant, backend, ctx,
                        prefix="bench.experts")


def routing(a, M, rank, device, dtype):
    import torch
    g = torch.Generator().manual_seed(1000 + 7 * M + rank)
    x = (torch.randn(M, a.H, generator=g) * 0.5).to(dtype)
    w, ids = torch.topk(torch.softmax(torch.randn(M, a.E, generator=g), -1),
                        a.topk)
    w = w / w.sum(1, keepdim=True)
    return x.to(device), w.to(device), ids.to(torch.int32).to(device)


def timed(fn, a, device):
    import torch
    for _ in range(a.warmup):
        fn()
    ts = []
    for _ in range(a.repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ts.append(time.perf_counter() - t0)
    return ts


# ---- one rank ----------------------------------------------------------------

def worker(a, rank, world_size, d):
    import torch
    import torch.distributed as dist
    import wna16
    from wna16 import ep
    gpu = a.backend == "nccl"
    if gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    dist.init_process_group(a.backend, init_method="file://" +
                            os.path.join(d, "init"), rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    ctx = wna16.Context(cpu_threads=a.cpu_threads)
    backend = "marlin" if gpu else "triton"
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    procs = sorted({int(n) for n in a.procs.split(",")})
    lines = []
    say = lines.append if rank == 0 else (lambda s: None)
    for n in procs:
        group = None if n == world_size else dist.new_group(list(range(n)))
        if rank >= n:
            continue
        _, count = ep.expert_partition(a.E, n)[rank]
        moe = ep.ExpertParallelMoE(
            experts_of(ctx, a, count, backend, device, seed=10 + rank),
            a.E, group=group, timing=True)
        for mode in a.dispatch:
            for M in a.tokens:
                x, w, ids = routing(a, M, rank, device, dtype)
                stages = {"dispatch": [], "compute": [], "combine": []}

                def call():
                    moe(x, w, ids, dispatch=mode)
                    for k in stages:
                        stages[k].append(moe.times[k])
                ts = timed(call, a, device)
                med = [statistics.median(stages[k][a.warmup:])
                       for k in ("dispatch", "compute", "combine")]
                med.append(statistics.median(ts))
                t = torch.tensor(med, dtype=torch.float64,
                                 device=device if gpu else "cpu")
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
                say(f"ep {n} {mode} {M} " +
                    " ".join(f"{v * 1e3:.4f}" for v in t.tolist()))
        del moe
        if gpu:
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(d, "rank0.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


def single_times(a, procs):
    """{(N, M): ms} of WNA16Experts over every expert on one device (cuda:0
    or the CPU) on the N * M tokens that N ranks of M tokens route."""
    import torch
    import wna16
    gpu = a.backend == "nccl"
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    ctx = wna16.Context(cpu_threads=a.cpu_threads)
    layer = experts_of(ctx, a, a.E, "marlin" if gpu else "triton", device,
                       seed=1)
    out = {}
    for n in procs:
        for M in a.tokens:
            x, w, ids = routing(a, n * M, 99, device, dtype)
            ts = timed(lambda: layer(x, w, ids), a, device)
            out[(n, M)] = statistics.median(ts) * 1e3
    del layer
    ctx.close()
    if gpu:
        torch.cuda.empty_cache()
    return out


# ---- the launcher --------------------------------------------------------------

def machine(gpu):
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f
                       if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    s = f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs"
    if gpu:
        import torch
        s += ", " + ", ".join(torch.cuda.get_device_name(i)
                              for i in range(torch.cuda.device_count()))
    return s


def main():
    a = parse()
    gpu = a.backend == "nccl"
    if a.worker:
        r, n, d = a.worker
        a.procs = os.environ["BENCH_EP_PROCS"]
        worker(a, int(r), int(n), d)
        return
    import torch
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--backend nccl: torch sees no CUDA device")
    if a.procs is None:
        a.procs = ",".join(str(n) for n in (
            range(1, torch.cuda.device_count() + 1) if gpu else (1, 2, 4)))
    procs = sorted({int(n) for n in a.procs.split(",")})
    world = max(procs)
    if gpu and world > torch.cuda.device_count():
        raise SystemExit(f"--procs {world}: {torch.cuda.device_count()} GPUs")
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short",
                             "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    print(f"# bench_ep {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, "
          f"commit {commit}, {machine(gpu)}")
    print(f"# {' '.join(sys.argv)}")
    print(f"# E {a.E}, top-{a.topk}, H {a.H}, I {a.I}, int4 g{a.group_size}, "
          f"{a.dtype}, {'marlin on CUDA' if gpu else 'triton on the CPU'}, "
          f"{a.backend}; medians of {a.repeat} after {a.warmup}, ms; "
          "each stage the slowest rank's")
    # the single-rank layer first, alone on the machine (the workers would
    # share the CPUs or the GPU with it)
    single = single_times(a, procs)
    with tempfile.TemporaryDirectory(prefix="bench-ep-") as d:
        env = dict(os.environ, BENCH_EP_PROCS=",".join(map(str, procs)))
        args = [a for a in sys.argv[1:]]
        ps = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] +
                               args + ["--worker", str(r), str(world), d],
                               env=env) for r in range(world)]
        rcs = [p.wait() for p in ps]
        if any(rcs):
            raise SystemExit(f"bench_ep: workers exited {rcs}")
        with open(os.path.join(d, "rank0.txt")) as f:
            rows = [l.split() for l in f if l.strip()]
    print(f"{'N':>2} {'dispatch':>10} {'M/rank':>6} {'tokens':>6} "
          f"{'dispatch':>9} {'compute':>9} {'combine':>9} {'total':>9} "
          f"{'single':>9} {'tot/sgl':>7}")
    for r in rows:
        if r[0] != "ep":
            continue
        n, mode, M = int(r[1]), r[2], int(r[3])
        dsp, cmp_, cmb, tot = (float(v) for v in r[4:8])
        s = single[(n, M)]
        print(f"{n:>2} {mode:>10} {M:>6} {n * M:>6} {dsp:>9.3f} "
              f"{cmp_:>9.3f} {cmb:>9.3f} {tot:>9.3f} {s:>9.3f} "
              f"{tot / s:>7.2f}")


if __name__ == "__main__":
    main()
