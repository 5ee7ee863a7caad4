#!/usr/bin/env python3
"""tiling_sweep.py - measures candidate rows of the Marlin spec's CUDA
fused-MoE tiling table on the GPU, for the block_m 16 rows that serve
M <= 64 on the bench's target shapes (Mixtral-8x7B, DeepSeek-V3/EP8).

Each candidate is a copy of specs/backends/marlin.json whose "tiling"
table starts with one w13 and one w2 row for block_m 16; one GEMM's row is
varied while the other keeps the table's own, so a change in the layer's
time is that GEMM's. bench_moe_cuda --specs runs every candidate on the
same device tensors (CUDA graphs, >= 512 MB of rotated weight copies) and
this script prints, per GEMM, the candidates ranked by their summed time
over the models and token counts.

    python3 bench/tiling_sweep.py BENCH_BINARY [--tokens 1,16,64] [--out DIR]
"""
import argparse
import copy
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.path.join(HERE, "..", "specs", "backends", "marlin.json")
MODELS = ["Mixtral-8x7B", "DeepSeek-V3/EP8"]

# (block_n, block_k, warps_n, warps_k, stages, max_split_k, ctas_per_sm,
#  min_ctas)
W13 = {
    "n256k128w4x2p4s16c2o1": (256, 128, 4, 2, 4, 16, 2, 1),
    "n256k128w4x2p4s16c2o2": (256, 128, 4, 2, 4, 16, 2, 2),
    "n256k128w4x2p4s16c4o2": (256, 128, 4, 2, 4, 16, 4, 2),
    "n256k128w4x2p3s16c3o3": (256, 128, 4, 2, 3, 16, 3, 3),
    "n128k128w2x2p4s16c4o4": (128, 128, 2, 2, 4, 16, 4, 4),
    "n128k128w2x4p4s16c2o2": (128, 128, 2, 4, 4, 16, 2, 2),
    "n256k64w4x2p4s16c4o3": (256, 64, 4, 2, 4, 16, 4, 3),
    "n256k128w4x2p4s4c2o2": (256, 128, 4, 2, 4, 4, 2, 2),
}
W2 = {
    "n128k128w2x2p4s16c4o1": (128, 128, 2, 2, 4, 16, 4, 1),
    "n128k128w2x2p4s16c4o4": (128, 128, 2, 2, 4, 16, 4, 4),
    "n128k128w2x2p4s16c4o3": (128, 128, 2, 2, 4, 16, 4, 3),
    "n128k128w2x4p4s16c4o2": (128, 128, 2, 4, 4, 16, 4, 2),
    "n256k64w4x2p4s16c4o2": (256, 64, 4, 2, 4, 16, 4, 2),
    "n64k256w1x8p4s16c4o2": (64, 256, 1, 8, 4, 16, 4, 2),
    "n128k128w2x2p4s16c8o4": (128, 128, 2, 2, 4, 16, 8, 4),
    "n64k128w1x4p4s16c8o4": (64, 128, 1, 4, 4, 16, 8, 4),
}
BASE_W13 = "n256k128w4x2p4s16c2o1"
BASE_W2 = "n128k128w2x2p4s16c4o1"


def row(gemm, v):
    bn, bk, wn, wk, st, sk, cps, occ = v
    return {"gemm": gemm, "block_m": [16, 16], "block_n": bn, "block_k": bk,
            "warps_n": wn, "warps_k": wk, "stages": st, "max_split_k": sk,
            "ctas_per_sm": cps, "min_ctas": occ}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--out", default="/tmp/tiling_sweep")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    base = json.load(open(SPEC))
    files = []
    cands = [("w13", k, W13[k], BASE_W2) for k in W13] + \
            [("w2", k, W2[k], BASE_W13) for k in W2 if k != BASE_W2]
    for gemm, name, v, other in cands:
        d = copy.deepcopy(base)
        if gemm == "w13":
            rows = [row("w13", v), row("w2", W2[other])]
        else:
            rows = [row("w13", W13[other]), row("w2", v)]
        d["tiling"]["gemm"] = rows + d["tiling"]["gemm"]
        f = os.path.join(args.out, f"{gemm}-{name}.json")
        json.dump(d, open(f, "w"), indent=2)
        files.append(f)
    times = {}  # (file tag, model, M) -> us
    pat = re.compile(r"^\[(\S+)\] (\S+)\s+b4\s+(\d+) tok .*?([\d.]+) us ")
    for model in MODELS:
        cmd = [args.bench, "--model", model, "--tokens", args.tokens,
               "--specs", ",".join(files)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            sys.stdout.write(p.stderr)
            sys.exit(p.returncode)
        for line in p.stdout.splitlines():
            m = pat.match(line)
            if m:
                times[(m.group(1), m.group(2), int(m.group(3)))] = \
                    float(m.group(4))
    toks = [int(t) for t in args.tokens.split(",")]
    for gemm in ("w13", "w2"):
        print(f"\n{gemm} candidates (the other GEMM at its base row), "
              f"us per layer run:")
        names = W13 if gemm == "w13" else W2
        ranked = []
        for name in names:
            tag = f"{gemm}-{name}.json"
            if gemm == "w2" and name == BASE_W2:
                tag = f"w13-{BASE_W13}.json"
            cols = [times.get((tag, mo, t)) for mo in MODELS for t in toks]
            if None in cols:
                continue
            ranked.append((sum(cols), name, cols))
        ranked.sort()
        hdr = "  ".join(f"{mo[:8]}:{t}" for mo in MODELS for t in toks)
        print(f"  {'candidate':<22s} {'sum':>8s}  {hdr}")
        for tot, name, cols in ranked:
            print(f"  {name:<22s} {tot:8.1f}  " +
                  "  ".join(f"{c:10.1f}" for c in cols))


if __name__ == "__main__":
    main()
