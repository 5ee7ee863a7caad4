#!/usr/bin/env python3
"""tiling_sweep.py - measures candidate rows of the Marlin spec's CUDA
fused-MoE tiling table on the GPU: the block_m 16 rows that serve M <= 64
on the bench's target shapes (Mixtral-8x7B, DeepSeek-V3/EP8), with
--block-m 8 rows for up to 4 routed rows an expert (M = 1 and 16 on the
three models, M = 64 on DeepSeek-V3/EP8 and Qwen3-30B-A3B), with
--block-m 24 rows for 9-18 routed rows an expert (Mixtral-8x7B M = 64,
Qwen3-30B-A3B M = 256; pass --models), with --block-m 32 those of Mixtral-8x7B at M = 64 (16 routed rows an expert), or
with --block-m 64 the rows of the large-M cases (M = 256 and 4096).

Each candidate is a copy of specs/backends/marlin.json whose "tiling"
table starts with one w13 and one w2 row for that block_m; one GEMM's row is
varied while the other keeps the table's own, so a change in the layer's
time is that GEMM's. bench_moe_cuda --specs runs every candidate on the
same device tensors (CUDA graphs, >= 512 MB of rotated weight copies) and
this script prints, per GEMM, the candidates ranked by their summed time
over the models and token counts.

    python3 bench/tiling_sweep.py BENCH_BINARY [--block-m 8|16|24|32|64]
                                  [--tokens 1,16,64] [--models A,B] [--out DIR]
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
#  min_ctas); per block_m, the first of each list is the base row
CANDIDATES = {
    # block_m 8 (the codes as the mma's A operand; --block-m 8 routes
    # tokens_per_expert 1-4 to it, as the table does): 8 A rows a stage, so
    # that 256 columns and three stages fit four CTAs an SM (56.8 KB)
    8: {
        "w13": {
            # the table's row below N 16384 (the base), then its row from
            # 16384 (split-K aimed at four CTAs an SM, bounds for four)
            "n256k128w4x1p3s16c2o3": (256, 128, 4, 1, 3, 16, 2, 3),
            "n256k128w4x1p3s16c4o4": (256, 128, 4, 1, 3, 16, 4, 4),
            "n256k128w4x1p3s16c2o4": (256, 128, 4, 1, 3, 16, 2, 4),
            "n256k128w4x1p3s16c3o3": (256, 128, 4, 1, 3, 16, 3, 3),
            "n256k128w4x1p3s16c4o3": (256, 128, 4, 1, 3, 16, 4, 3),
            "n256k128w4x1p3s16c8o4": (256, 128, 4, 1, 3, 16, 8, 4),
            # two stages: six CTAs an SM (37.9 KB; 80 registers, the scales
            # in B; five spill)
            "n256k128w4x1p2s16c6o6": (256, 128, 4, 1, 2, 16, 6, 6),
            # 128 columns (one gate and one up tile): twice the CTAs of
            # half the width, for the layers whose grids fill few SMs at
            # M = 1-16 (DeepSeek-V3/EP8's 16-column-tile GEMM 1)
            "n128k128w2x2p3s16c4o4": (128, 128, 2, 2, 3, 16, 4, 4),
            "n128k128w2x1p4s16c4o6": (128, 128, 2, 1, 4, 16, 4, 6),
            "n128k128w2x1p3s16c6o6": (128, 128, 2, 1, 3, 16, 6, 6),
        },
        "w2": {
            "n256k128w4x1p3s8c2o3": (256, 128, 4, 1, 3, 8, 2, 3),
            "n256k128w4x1p3s8c2o4": (256, 128, 4, 1, 3, 8, 2, 4),
            "n256k128w4x1p3s8c4o4": (256, 128, 4, 1, 3, 8, 4, 4),
            "n256k128w4x1p3s16c4o4": (256, 128, 4, 1, 3, 16, 4, 4),
            "n256k128w4x1p3s8c3o3": (256, 128, 4, 1, 3, 8, 3, 3),
            # split 16 aimed at four CTAs an SM under bounds for three (127
            # registers, no spill; not measured yet)
            "n256k128w4x1p3s16c4o3": (256, 128, 4, 1, 3, 16, 4, 3),
            "n256k128w4x1p2s16c6o6": (256, 128, 4, 1, 2, 16, 6, 6),
            "n128k128w2x2p3s8c4o4": (128, 128, 2, 2, 3, 8, 4, 4),
            "n128k128w2x1p4s8c4o6": (128, 128, 2, 1, 4, 8, 4, 6),
            "n128k128w2x1p3s16c6o6": (128, 128, 2, 1, 3, 16, 6, 6),
        },
    },
    # the deferred-scale inner loop (templates/moe_marlin_gemm.cu, DEFER)
    # needs 64 * MB * NT + 64 registers under the launch bounds (128 threads
    # at min_ctas 5 leave 102 and keep the scales in B); a ninth value True
    # sets the row's scales_in_b (the same tile with the scales in B)
    16: {
        "w13": {
            # the table's row, the base (the other GEMM's candidates run
            # with it): a whole stage a warp (one flush a stage for twice
            # the codes), three CTAs of four warps an SM
            # (split-K aimed at two)
            "n256k128w4x1p3s16c2o3": (256, 128, 4, 1, 3, 16, 2, 3),
            "n256k128w4x1p3s16c1o3": (256, 128, 4, 1, 3, 16, 1, 3),
            "n256k128w4x1p3s16c3o3": (256, 128, 4, 1, 3, 16, 3, 3),
            # more CTAs than fit at once (Mixtral-8x7B M = 1: 448 of 396 fit
            # at split 2, the last 52 stream alone): 2.3 or 4.5 waves
            "n256k128w4x1p3s16c4o3": (256, 128, 4, 1, 3, 16, 4, 3),
            "n256k128w4x1p3s16c8o3": (256, 128, 4, 1, 3, 16, 8, 3),
            "n256k128w4x1p3s32c4o3": (256, 128, 4, 1, 3, 32, 4, 3),
            "n256k128w4x2p4s16c2o2": (256, 128, 4, 2, 4, 16, 2, 2),
            "n256k128w4x2p4s16c2o2sb": (256, 128, 4, 2, 4, 16, 2, 2, True),
            "n256k128w4x1p4s16c4o2": (256, 128, 4, 1, 4, 16, 4, 2),
            "n256k128w4x1p4s16c4o2sb": (256, 128, 4, 1, 4, 16, 4, 2, True),
            "n256k128w4x1p4s8c4o2": (256, 128, 4, 1, 4, 8, 4, 2),
            "n256k128w4x1p4s4c4o2": (256, 128, 4, 1, 4, 4, 4, 2),
            # a group (128) a warp and stage: half the deferred-scale
            # flushes, but two stages: 4-11% slower on the H200 (fewer
            # bytes in flight cost more than the flushes saved)
            "n256k256w4x2p2s16c2o2": (256, 256, 4, 2, 2, 16, 2, 2),
            "n128k128w2x2p4s16c4o4": (128, 128, 2, 2, 4, 16, 4, 4),
            # 64-thread CTAs (a gate and an up tile), six an SM
            "n128k128w2x1p3s16c6o6": (128, 128, 2, 1, 3, 16, 6, 6),
        },
        "w2": {
            # the table's row, the base: w13's shape (a whole stage a warp,
            # one flush a stage), three CTAs
            "n256k128w4x1p3s8c2o3": (256, 128, 4, 1, 3, 8, 2, 3),
            # split-K aimed at one or three CTAs an SM under the same
            # launch bounds
            "n256k128w4x1p3s8c1o3": (256, 128, 4, 1, 3, 8, 1, 3),
            "n256k128w4x1p3s8c3o3": (256, 128, 4, 1, 3, 8, 3, 3),
            "n256k128w4x1p3s16c4o3": (256, 128, 4, 1, 3, 16, 4, 3),
            "n256k128w4x1p3s16c8o3": (256, 128, 4, 1, 3, 16, 8, 3),
            "n128k128w2x2p3s8c4o4": (128, 128, 2, 2, 3, 8, 4, 4),
            "n128k128w2x2p3s8c4o5": (128, 128, 2, 2, 3, 8, 4, 5),
            "n128k128w2x2p3s16c4o5": (128, 128, 2, 2, 3, 16, 4, 5),
            "n128k128w2x2p4s16c4o3": (128, 128, 2, 2, 4, 16, 4, 3),
            "n128k128w2x2p4s16c4o3sb": (128, 128, 2, 2, 4, 16, 4, 3, True),
            "n128k128w2x2p3s4c4o5": (128, 128, 2, 2, 3, 4, 4, 5),
            "n128k256w2x2p2s8c4o4": (128, 256, 2, 2, 2, 8, 4, 4),
            # launch bounds for 4 CTAs leave the deferred scales room
            "n128k128w2x2p4s8c4o4": (128, 128, 2, 2, 4, 8, 4, 4),
            "n128k128w2x1p3s8c5o5": (128, 128, 2, 1, 3, 8, 5, 5),
            "n256k128w4x2p3s8c2o2": (256, 128, 4, 2, 3, 8, 2, 2),
            "n256k128w4x1p3s16c3o3": (256, 128, 4, 1, 3, 16, 3, 3),
            # a whole stage a warp, 64-thread CTAs, six an SM
            "n128k128w2x1p3s8c6o6": (128, 128, 2, 1, 3, 8, 6, 6),
            "n128k128w2x1p3s16c6o6": (128, 128, 2, 1, 3, 16, 6, 6),
        },
    },
    32: {
        "w13": {
            "n256k128w4x1p4s16c2o2": (256, 128, 4, 1, 4, 16, 2, 2),
            "n256k128w4x1p4s16c2o2sb": (256, 128, 4, 1, 4, 16, 2, 2, True),
            "n256k128w4x2p4s16c2o2": (256, 128, 4, 2, 4, 16, 2, 2),
            "n128k128w2x2p4s16c4o3": (128, 128, 2, 2, 4, 16, 4, 3),
            # scales in B free the deferred sums' 64 registers: launch
            # bounds for three or four CTAs an SM instead of two
            "n256k128w4x1p3s16c3o3sb": (256, 128, 4, 1, 3, 16, 3, 3, True),
            "n256k128w4x1p4s16c3o3sb": (256, 128, 4, 1, 4, 16, 3, 3, True),
            "n256k128w4x1p3s16c4o4sb": (256, 128, 4, 1, 3, 16, 4, 4, True),
            "n256k128w4x1p3s16c2o2": (256, 128, 4, 1, 3, 16, 2, 2),
            "n128k128w2x1p3s16c6o6sb": (128, 128, 2, 1, 3, 16, 6, 6, True),
            # block_k 64 halves a stage's shared memory (four stages of
            # 14 KB), so three or four CTAs fit beside their registers
            "n256k64w4x1p4s16c3o3sb": (256, 64, 4, 1, 4, 16, 3, 3, True),
            "n256k64w4x1p3s16c4o4sb": (256, 64, 4, 1, 3, 16, 4, 4, True),
            "n256k64w4x1p3s16c3o3sb": (256, 64, 4, 1, 3, 16, 3, 3, True),
            "n256k128w4x1p2s16c3o3sb": (256, 128, 4, 1, 2, 16, 3, 3, True),
            "n256k64w4x1p4s16c2o2": (256, 64, 4, 1, 4, 16, 2, 2),
        },
        "w2": {
            # the table's row, the base: w13's shape (256 columns, four N
            # warps, three stages), 309 against 321 us for the generic row
            # at Mixtral-8x7B M = 64 on the H200
            "n256k128w4x1p3s16c2o2": (256, 128, 4, 1, 3, 16, 2, 2),
            # the generic row it replaced
            "n128k128w2x2p4s16c2o1": (128, 128, 2, 2, 4, 16, 2, 1),
            "n128k128w2x2p3s16c3o3sb": (128, 128, 2, 2, 3, 16, 3, 3, True),
            "n128k128w2x2p3s16c4o4sb": (128, 128, 2, 2, 3, 16, 4, 4, True),
            "n128k128w2x1p3s16c6o6sb": (128, 128, 2, 1, 3, 16, 6, 6, True),
            "n128k128w2x2p4s16c2o1sb": (128, 128, 2, 2, 4, 16, 2, 1, True),
            "n128k128w2x2p4s16c2o2": (128, 128, 2, 2, 4, 16, 2, 2),
            "n128k128w2x2p4s16c3o3": (128, 128, 2, 2, 4, 16, 3, 3),
            "n128k64w2x2p4s16c4o4sb": (128, 64, 2, 2, 4, 16, 4, 4, True),
            "n128k128w2x2p2s16c4o4sb": (128, 128, 2, 2, 2, 16, 4, 4, True),
            "n128k64w2x2p3s16c5o5sb": (128, 64, 2, 2, 3, 16, 5, 5, True),
            # w13's block_m 32 shape with four stages, split-K aimed at 4
            "n256k128w4x1p4s16c2o2": (256, 128, 4, 1, 4, 16, 2, 2),
            "n256k128w4x1p4s16c4o2": (256, 128, 4, 1, 4, 16, 4, 2),
        },
    },
    # block_m 24 (three n8 blocks of rows on the swapped mma; --block-m 24
    # routes tokens_per_expert 9-18 to it: Mixtral-8x7B M = 64, Qwen3 M =
    # 256): 48 accumulators a thread for a 64-column tile, 96 with the
    # deferred scales, so two CTAs of four warps an SM unless the scales
    # go in B
    24: {
        "w13": {
            # the table's row first (the base), then the others
            "n256k128w4x1p3s16c2o3": (256, 128, 4, 1, 3, 16, 2, 3),
            "n256k128w4x1p4s16c2o2": (256, 128, 4, 1, 4, 16, 2, 2),
            "n256k128w4x2p4s16c2o1": (256, 128, 4, 2, 4, 16, 2, 1),
            "n256k64w4x2p6s16c2o1": (256, 64, 4, 2, 6, 16, 2, 1),
            "n128k128w2x1p3s16c5o5": (128, 128, 2, 1, 3, 16, 5, 5),
            "n256k128w4x1p2s16c4o4sb": (256, 128, 4, 1, 2, 16, 4, 4, True),
            "n256k64w4x1p4s16c4o4sb": (256, 64, 4, 1, 4, 16, 4, 4, True),
            "n256k128w4x1p4s16c4o2": (256, 128, 4, 1, 4, 16, 4, 2),
        },
        "w2": {
            "n256k128w4x1p4s16c2o2": (256, 128, 4, 1, 4, 16, 2, 2),
            "n256k128w4x2p4s16c2o1": (256, 128, 4, 2, 4, 16, 2, 1),
            "n256k64w4x2p6s16c2o1": (256, 64, 4, 2, 6, 16, 2, 1),
            "n128k128w2x1p3s16c5o5": (128, 128, 2, 1, 3, 16, 5, 5),
            "n256k128w4x1p2s16c4o4sb": (256, 128, 4, 1, 2, 16, 4, 4, True),
            "n256k64w4x1p4s16c4o4sb": (256, 64, 4, 1, 4, 16, 4, 4, True),
            "n256k128w4x1p4s16c4o2": (256, 128, 4, 1, 4, 16, 4, 2),
        },
    },
    64: {
        "w13": {
            "n256k64w4x2p3s1o1": (256, 64, 4, 2, 3, 1, 2, 1),
            "n256k64w4x1p4s1o2": (256, 64, 4, 1, 4, 1, 2, 2),
            "n256k128w4x2p3s1o1": (256, 128, 4, 2, 3, 1, 2, 1),
            "n128k64w2x2p4s1o2": (128, 64, 2, 2, 4, 1, 2, 2),
            "n256k64w4x4p3s1o1": (256, 64, 4, 4, 3, 1, 2, 1),
        },
        "w2": {
            "n256k64w4x2p3s1o1": (256, 64, 4, 2, 3, 1, 2, 1),
            "n256k64w4x1p4s1o2": (256, 64, 4, 1, 4, 1, 2, 2),
            "n256k128w4x2p3s1o1": (256, 128, 4, 2, 3, 1, 2, 1),
            "n128k64w2x2p4s1o2": (128, 64, 2, 2, 4, 1, 2, 2),
            "n256k64w4x4p3s1o1": (256, 64, 4, 4, 3, 1, 2, 1),
        },
    },
}


def row(gemm, v, bm):
    bn, bk, wn, wk, st, sk, cps, occ = v[:8]
    r = {"gemm": gemm, "block_m": [bm, bm], "block_n": bn, "block_k": bk,
         "warps_n": wn, "warps_k": wk, "stages": st, "max_split_k": sk,
         "ctas_per_sm": cps, "min_ctas": occ}
    if len(v) > 8 and v[8]:
        r["scales_in_b"] = True
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--tokens", default=None,
                    help="default: 1,16,64 (block_m 16), 256,4096 (64)")
    ap.add_argument("--block-m", type=int, default=16, choices=[8, 16, 24, 32, 64])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default="/tmp/tiling_sweep")
    ap.add_argument("--only", default=None,
                    help="a regex: only the candidates it matches (and the "
                         "base rows)")
    args = ap.parse_args()
    bm = args.block_m
    if not args.tokens:
        args.tokens = {8: "1,16,64", 16: "1,16,64", 24: "64,256",
                       32: "64"}.get(bm, "256,4096")
    models = args.models.split(",")
    W13, W2 = CANDIDATES[bm]["w13"], CANDIDATES[bm]["w2"]
    BASE_W13, BASE_W2 = next(iter(W13)), next(iter(W2))
    if args.only:
        keep = re.compile(args.only)
        W13 = {k: v for k, v in W13.items()
               if k == BASE_W13 or keep.search(k)}
        W2 = {k: v for k, v in W2.items() if k == BASE_W2 or keep.search(k)}
    os.makedirs(args.out, exist_ok=True)
    base = json.load(open(SPEC))
    files = []
    cands = [("w13", k, W13[k], BASE_W2) for k in W13] + \
            [("w2", k, W2[k], BASE_W13) for k in W2 if k != BASE_W2]
    for gemm, name, v, other in cands:
        d = copy.deepcopy(base)
        if gemm == "w13":
            rows = [row("w13", v, bm), row("w2", W2[other], bm)]
        else:
            rows = [row("w13", W13[other], bm), row("w2", v, bm)]
        d["tiling"]["gemm"] = rows + d["tiling"]["gemm"]
        if bm == 8 and d["tiling"]["block_m"][0]["block_m"] != 8:
            d["tiling"]["block_m"].insert(  # as the table: 1-4 rows
                0, {"tokens_per_expert": [1, 4], "block_m": 8})
        if bm == 24 and d["tiling"]["block_m"][0]["block_m"] != 24:
            d["tiling"]["block_m"].insert(  # 9-18 rows, before block_m 32
                0, {"tokens_per_expert": [9, 18], "block_m": 24})
        f = os.path.join(args.out, f"m{bm}-{gemm}-{name}.json")
        json.dump(d, open(f, "w"), indent=2)
        files.append(f)
    times = {}  # (file tag, model, M) -> us
    pat = re.compile(r"^\[(\S+)\] (\S+)\s+b4\s+(\d+) tok .*?([\d.]+) us ")
    for model in models:
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
        print(f"\nblock_m {bm}, {gemm} candidates (the other GEMM at its "
              f"base row), us per layer run:")
        names = W13 if gemm == "w13" else W2
        ranked = []
        for name in names:
            tag = f"m{bm}-{gemm}-{name}.json"
            if gemm == "w2" and name == BASE_W2:
                tag = f"m{bm}-w13-{BASE_W13}.json"
            cols = [times.get((tag, mo, t)) for mo in models for t in toks]
            if None in cols:
                continue
            ranked.append((sum(cols), name, cols))
        ranked.sort()
        hdr = "  ".join(f"{mo[:8]}:{t}" for mo in models for t in toks)
        print(f"  {'candidate':<22s} {'sum':>8s}  {hdr}")
        for tot, name, cols in ranked:
            print(f"  {name:<22s} {tot:8.1f}  " +
                  "  ".join(f"{c:10.1f}" for c in cols))


if __name__ == "__main__":
    main()
