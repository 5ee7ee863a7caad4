#!/usr/bin/env python3
"""bench_moe_torch.py - the bf16 baseline of bench_moe_cuda: the same MoE
layers with bf16 weights through torch._grouped_mm, as a real layer runs
them: its own routing (sort the routed slots by local expert, pad every
expert's rows to a multiple of 16, gather the token rows), w13 grouped GEMM,
SiLU(gate) * up, w2 grouped GEMM, top-k weighted scatter-add back to the
tokens. Everything runs on static shapes so the layer is captured into a
CUDA graph (at least 8 runs per graph, median of 7 replays), like
bench_moe_cuda.
Routing: uniform random top-k over the model's global experts; with expert
parallelism (DeepSeek-V3/EP8) this rank holds the first E global experts
and drops the other slots, as bench_moe_cuda's expert map does.

Weights: bf16 copies of the layer (2.8 GB each for Mixtral-8x7B and
DeepSeek-V3/EP8, 1.2 GB for Qwen3-30B-A3B) used in turn, as many as make
the runs between two uses of one copy touch more than twice the L2 (at
least two), so even M = 1 reads its experts from HBM.

    python3 bench/bench_moe_torch.py [--tokens 1,16,64,256,4096]
                                     [--model NAME] [--cuda-bench FILE]
                                     [--routing DIR]

With --routing DIR (bench_moe_cuda --routing-out DIR from the same run),
every shape and M runs on exactly the routing wna16's run had.

With --cuda-bench (bench_moe_cuda's output from the same machine), each
line also gives wna16's time for the same shape and M and the ratio
torch / wna16 (> 1: wna16 is faster). The two programs draw their
routings from different generators, and at small M (and with expert
parallelism at any M) two draws can do different work: one token of
DeepSeek-V3/EP8 may route 0, 1 or 2 slots to this rank. So the routing
is drawn again (up to MATCH_TRIES times) until this rank's routed rows
and active experts are those of wna16's run, the closest draw kept
otherwise ("~" before the ratio: the work differs).
"""
import argparse
import re
import statistics

import numpy

import torch

SHAPES = [  # model, local E, H, I, top-k, global experts (0: E)
    ("Mixtral-8x7B", 8, 4096, 14336, 2, 0),
    ("Qwen3-30B-A3B", 128, 2048, 768, 8, 0),
    ("DeepSeek-V3/EP8", 32, 7168, 2048, 8, 256),
]
ALIGN = 16  # rows per expert are padded to this (grouped GEMM offsets)
MIN_COPIES = 2  # weight copies rotated, at least
MAX_COPY_BYTES = 40 << 30  # all copies of one layer, at most
MATCH_TRIES = 5000  # routings drawn to match wna16's run's work


def copy_gbs():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ts = []
    for _ in range(5):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return 2 * n / (statistics.median(ts) * 1e-3) / 1e9


class Layer:
    def __init__(self, E, H, I, topk, n_global, M):
        self.E, self.H, self.I, self.topk = E, H, I, topk
        self.ng = n_global or E
        dev = "cuda"
        P = M * topk
        self.P = P
        # static capacity: every slot plus the padding of every expert
        self.cap = P + E * (ALIGN - 1)
        self.cap = (self.cap + ALIGN - 1) // ALIGN * ALIGN
        self.local_map = torch.full((self.ng,), -1, dtype=torch.int64,
                                    device=dev)
        self.local_map[:E] = torch.arange(E, device=dev)

    def make_weights(self, copies, gen):
        """nn.Linear-style weights [out, in], scale ~ 1/sqrt(in); `copies`
        copies used in turn, as bench_moe_cuda rotates its copies."""
        E, H, I = self.E, self.H, self.I
        self.copies = copies
        self.w13 = [torch.randn(E, 2 * I, H, device="cuda", generator=gen,
                                dtype=torch.bfloat16) * H ** -0.5
                    for _ in range(copies)]
        self.w2 = [torch.randn(E, H, I, device="cuda", generator=gen,
                               dtype=torch.bfloat16) * I ** -0.5
                   for _ in range(copies)]


def routing(M, topk, ng, gen):
    # distinct uniform random experts per token
    r = torch.rand(M, ng, device="cuda", generator=gen)
    ids = torch.topk(r, topk, dim=1).indices.to(torch.int64)
    w = torch.full((M, topk), 1.0 / topk, device="cuda")
    return ids, w


def read_cuda_bench(path):
    """{(model, M): us} from bench_moe_cuda's output."""
    t = {}
    if not path:
        return t
    pat = re.compile(r"^(\S+)\s+b4\s+bf16\s+(\d+) tok\s+(\d+) rows\s+(\d+)/\d+\s+"
                     r"exp\s+([\d.]+) us ")
    for line in open(path):
        m = pat.match(line)
        if m:
            t[(m.group(1), int(m.group(2)))] = (
                float(m.group(5)), int(m.group(3)), int(m.group(4)))
    return t


def local_work(L, ids):
    """(routed rows, active experts) of this rank."""
    le = L.local_map[ids.reshape(-1)]
    return int((le >= 0).sum()), int(torch.unique(le[le >= 0]).numel())


def matched_routing(L, M, gen, want):
    """A routing with the (rows, experts) of want, or the closest of
    MATCH_TRIES draws; returns it and whether it matched."""
    best = None
    for _ in range(MATCH_TRIES if want else 1):
        ids, w = routing(M, L.topk, L.ng, gen)
        rows, exps = local_work(L, ids)
        if not want:
            return ids, w, True
        d = abs(rows - want[0]) + abs(exps - want[1])
        if best is None or d < best[0]:
            best = (d, ids, w)
        if d == 0:
            break
    return best[1], best[2], best[0] == 0


def read_routing(dir_, model, M, topk):
    """wna16's routing of (model, M), written by bench_moe_cuda."""
    path = f"{dir_}/{model.replace('/', '-')}_{M}.ids"
    ids = torch.from_numpy(numpy.fromfile(path, dtype="<i4").copy())
    if ids.numel() != M * topk:
        raise SystemExit(f"{path}: {ids.numel()} ids, expected {M * topk}")
    ids = ids.reshape(M, topk).to("cuda", torch.int64)
    return ids, torch.full((M, topk), 1.0 / topk, device="cuda")


def bench(shape, M, gen, copy_bw, cuda_us, routing_dir):
    model, E, H, I, topk, ng = shape
    L = Layer(E, H, I, topk, ng, M)
    x = torch.randn(M, H, device="cuda", generator=gen, dtype=torch.bfloat16)
    ref = cuda_us.get((model, M))  # wna16's (us, rows, experts)
    if routing_dir:
        ids, w = read_routing(routing_dir, model, M, topk)
        same = True
    else:
        ids, w, same = matched_routing(L, M, gen, ref[1:] if ref else None)
    rows, experts = local_work(L, ids)
    per_expert = 3 * H * I * 2
    bytes_ = experts * per_expert + 2 * M * H * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(MIN_COPIES, 2 + 2 * l2 // max(bytes_, 1))
    copies = max(MIN_COPIES, min(copies, MAX_COPY_BYTES // (per_expert * E)))
    L.make_weights(copies, gen)
    reuse = (copies - 1) * bytes_

    def step(c=0):
        return forward(L, x, ids, w, c)
    step()  # eager: fails here, not inside the capture, if it cannot run
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    runs = (8 + L.copies - 1) // L.copies * L.copies
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(runs):
            step(r % L.copies)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / runs)
    us = statistics.median(ts) * 1e3
    gbs = bytes_ / (us * 1e-6) / 1e9
    tflops = 2.0 * rows * 3 * H * I / (us * 1e-6) / 1e12
    line = (f"torch-bf16 {model:<16s} {M:5d} tok {rows:6d} rows "
            f"{experts:3d}/{E:<3d} exp {us:9.1f} us {bytes_ / 1e6:8.1f} MB "
            f"reuse {reuse / 1e6:5.0f} MB{'' if reuse > 2 * l2 else ' (<2xL2!)'} "
            f"{gbs:7.1f} GB/s {100 * gbs / copy_bw:5.1f}% copy "
            f"{tflops:6.1f} TFLOP/s")
    if ref:
        line += (f"  | wna16 {ref[0]:9.1f} us  torch/wna16 "
                 f"{'' if same else '~'}{us / ref[0]:5.2f}x")
    print(line, flush=True)


def forward(L, x, ids, w, c):
    """One layer, static shapes, no host synchronization."""
    E, H, I, k, P, cap = L.E, L.H, L.I, L.topk, L.P, L.cap
    dev = x.device
    le = L.local_map[ids.reshape(-1)]
    valid = le >= 0
    key = torch.where(valid, le, torch.full_like(le, E))
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(E + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:E]
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    pstart = torch.cumsum(padded, 0) - padded
    ustart = torch.cumsum(counts, 0) - counts
    skey = key[order]
    sk = torch.clamp(skey, max=E - 1)
    rank = torch.arange(P, device=dev) - ustart[sk]
    svalid = skey < E
    dest = torch.where(svalid, pstart[sk] + rank, torch.full_like(rank, cap))
    offs = torch.cumsum(padded, 0).to(torch.int32)
    tok = order // k
    xs = torch.zeros(cap + 1, H, dtype=x.dtype, device=dev)
    xs[dest] = x[tok]
    xs = xs[:cap]
    h = torch._grouped_mm(xs, L.w13[c].transpose(-2, -1), offs=offs)
    a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    y = torch._grouped_mm(a, L.w2[c].transpose(-2, -1), offs=offs)
    yv = y[torch.clamp(dest, max=cap - 1)]
    wf = w.reshape(-1)[order]
    wt = torch.where(svalid, wf, torch.zeros_like(wf))
    contrib = torch.where(svalid[:, None], yv.float() * wt[:, None],
                          torch.zeros((), device=dev))
    out = torch.zeros(x.shape[0], H, dtype=torch.float32, device=dev)
    out.index_add_(0, tok, contrib)
    return out.to(x.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,16,64,256,4096")
    ap.add_argument("--model", default=None)
    ap.add_argument("--cuda-bench", default=None)
    ap.add_argument("--routing", default=None,
                    help="bench_moe_cuda --routing-out DIR: same routing")
    args = ap.parse_args()
    toks = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    bw = copy_gbs()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"D2D copy {bw:.0f} GB/s (read + write); bf16 weights, "
          f"torch._grouped_mm, CUDA graph of >= 8 runs, median of 7 replays; "
          f"L2 {torch.cuda.get_device_properties(0).L2_cache_size / 1e6:.1f} MB; "
          f"routing {'from ' + args.routing if args.routing else 'drawn'}",
          flush=True)
    cuda_us = read_cuda_bench(args.cuda_bench)
    for shape in SHAPES:
        if args.model and shape[0] != args.model:
            continue
        for M in toks:
            bench(shape, M, gen, bw, cuda_us, args.routing)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
