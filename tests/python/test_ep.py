"""test_ep.py - wna16.ep (expert parallelism over torch.distributed) on the
CPU with the gloo backend (test python_ep): N = 1, 2, 3, 4 processes
(this file run as 4 workers, init_method file://; groups of the first 1,
2 and 3 of them through new_group, all 4 through the default group: four
imports of torch, not ten), a synthetic GPTQ layer
of 256 experts (H 256, I 256, int4 g128, top-8) placed by
expert_partition (3 ranks: 86/85/85, an uneven split), each rank's
output for its own tokens compared with the single-process layer
(WNA16Experts over all 256 experts) on the same weights and routing.

Cases, each in both dispatch formats ("batched" and "expert_map"): M = 1
on every rank; M from 1 to 256 differing by rank; skewed routing (most
slots on the low experts) in bfloat16 with a rank of no tokens; routing
only to rank 0's experts (the other ranks receive nothing); top-1 with
the router weight on the input. The workers also check that a call is
bit-for-bit repeatable, that a rank with a bad expert id makes every
rank raise (no rank left in a collective) and the group still works
after, that a layer of the wrong size is refused, and that a rank whose
kernels fail after the rows moved makes the ranks that sent it rows
raise.

On a CUDA machine (test_ep_nccl, skipped here): every GPU with NCCL
(world size 1 on one GPU: the same code), the layers in Marlin's layout,
the same cases plus 4096 tokens a rank, against the single-GPU layer;
scripts/gpu_ep.sh runs it."""
import datetime
import os
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import torch

import wna16
from wna16 import ep
from wna16.torch import WNA16Experts

E, H, I, GS, SEED = 256, 256, 256, 128, 2024
PREFIX = "model.layers.0.mlp.experts"
QUANT = {"bits": 4, "group_size": GS, "zeros_stored": True,
         "g_idx_stored": True}
# name, tokens of rank r (index r), routing, dtype, on_input, top-k
CASES = [
    ("m1", [1, 1, 1, 1], "uniform", torch.float16, False, 8),
    ("uniform", [256, 1, 37, 5], "uniform", torch.float16, False, 8),
    ("skewed", [64, 3, 0, 96], "skewed", torch.bfloat16, False, 8),
    ("rank0only", [16, 24, 0, 1], "rank0", torch.float16, False, 8),
    ("on_input", [9, 4, 11, 2], "uniform", torch.float16, True, 1),
]
# on a GPU also (the CPU takes too long): 4096 tokens a rank
LARGE = [("m4096", [4096] * 8, "uniform", torch.bfloat16, False, 8)]
MODES = ("batched", "expert_map")


def cases_for(device):
    return CASES + (LARGE if torch.device(device).type == "cuda" else [])


def gptq_layer(seed=SEED):
    """A GPTQ layer's checkpoint tensors (symmetric int4, zero point 8):
    random codes, scales in [0.01, 0.03]."""
    rng = np.random.default_rng(seed)
    zeros = np.int32(np.uint32(0x88888888).view(np.int32))
    t = {}
    for e in range(E):
        for proj, (K, N) in (("gate_proj", (H, I)), ("up_proj", (H, I)),
                             ("down_proj", (I, H))):
            p = f"{PREFIX}.{e}.{proj}."
            t[p + "qweight"] = rng.integers(0, 2 ** 32, (K // 8, N),
                                            dtype=np.uint32).view(np.int32)
            t[p + "scales"] = (rng.random((K // GS, N)) * 0.02 +
                               0.01).astype(np.float16)
            t[p + "qzeros"] = np.full((K // GS, N // 8), zeros, np.int32)
            t[p + "g_idx"] = (np.arange(K) // GS).astype(np.int32)
    return t


def inputs(case, rank, world):
    """Rank `rank`'s tokens and routing for a case (the same in the
    worker and the parent)."""
    name, ms, routing, dtype, on_input, k = case
    g = torch.Generator().manual_seed(SEED * 100 + zlib.crc32(name.encode())
                                      + rank)
    M = ms[rank]
    x = (torch.randn(M, H, generator=g) * 0.5).to(dtype)
    logits = torch.randn(M, E, generator=g)
    if routing == "skewed":
        logits += -torch.arange(E, dtype=torch.float32) / 16
    elif routing == "rank0":
        first, n = ep.expert_partition(E, world)[0]
        logits[:, first + n:] = -float("inf")
    w, ids = torch.topk(torch.softmax(logits, -1), k)
    w = w / w.sum(1, keepdim=True)  # renormalized, as DeepSeek-V3's router
    if routing == "rank0":
        assert bool((ids < ep.expert_partition(E, world)[0][1]).all())
    return x, w, ids  # int64 ids, as torch.topk gives


# ---- the worker: one rank -------------------------------------------------

def _bits(t):
    t = t.cpu()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


WORLD = 4  # gloo processes launched; groups of 1, 2, 3 ranks cut out


def worker(rank, world_size, backend, init_file, out_dir):
    """Rank `rank` of world_size processes: the layer over groups of the
    first 1, 2... ranks (new_group) and over all (the default group). With
    NCCL, rank r runs on cuda:r."""
    if backend == "nccl":
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        backend, init_method="file://" + init_file, rank=rank,
        world_size=world_size, timeout=datetime.timedelta(seconds=120))
    ctx = wna16.Context(cache_dir=os.environ.get("WNA16_TEST_CACHE"),
                        cpu_threads=1)
    tensors = gptq_layer()
    for world in range(1, world_size + 1):
        # every process creates every group, in the same order
        group = None if world == world_size else \
            torch.distributed.new_group(list(range(world)))
        if rank < world:
            run_rank(ctx, tensors, rank, world, group, out_dir)
    torch.distributed.destroy_process_group()


def run_rank(ctx, tensors, rank, world, group, out_dir):
    moe = ep.ExpertParallelMoE.from_checkpoint_tensors(
        ctx, "gptq", tensors, PREFIX, E, H, I, QUANT, group=group,
        timing=True)
    assert moe.world_size == world and moe.rank == rank
    assert moe.count == ep.expert_partition(E, world)[rank][1]
    saved = {}
    for case in cases_for(moe.device):
        x, w, ids = (t.to(moe.device) for t in inputs(case, rank, world))
        for mode in MODES:
            out = moe(x, w, ids, apply_router_weight_on_input=case[4],
                      dispatch=mode)
            assert out.dtype == x.dtype and out.shape == x.shape
            assert set(moe.times) == {"dispatch", "compute", "combine"}
            if case[2] == "rank0" and rank > 0:
                assert moe.times["compute"] == 0.0  # nothing received
            saved[f"{case[0]}_{mode}"] = _bits(out)
    # repeatable to the bit
    case = CASES[1]
    x, w, ids = (t.to(moe.device) for t in inputs(case, rank, world))
    for mode in MODES:
        again = _bits(moe(x, w, ids, dispatch=mode))
        assert np.array_equal(again, saved[f"uniform_{mode}"]), mode
    # a bad id on the last rank: every rank raises, none hangs
    if world > 1:
        bad = ids.clone()
        if rank == world - 1 and bad.numel():
            bad[0, 1] = E
        try:
            moe(x, w, bad)
            raise AssertionError("a bad expert id was not refused")
        except ValueError as e:
            assert rank == world - 1 and f"= {E} is not an expert id" in \
                str(e), str(e)
        except RuntimeError as e:
            assert rank != world - 1 and \
                f"rank(s) [{world - 1}] refused" in str(e), str(e)
        try:  # an activation only rank 0 asks for
            moe(x, w, ids, activation="nope" if rank == 0 else "silu")
            raise AssertionError("an unknown activation was not refused")
        except ValueError as e:
            assert rank == 0 and "activation 'nope'" in str(e), str(e)
        except RuntimeError as e:
            assert rank != 0 and "rank(s) [0] refused" in str(e), str(e)
        again = _bits(moe(x, w, ids))  # the group still works
        assert np.array_equal(again, saved["uniform_batched"])
    # a layer that is not this rank's share of the experts
    try:
        ep.ExpertParallelMoE(moe.experts, E + world, group=group)
        raise AssertionError("a wrong-sized layer was accepted")
    except ValueError as e:
        assert "the partition gives this rank" in str(e), str(e)
    # only the last rank disagrees (E + 1): every rank raises, none hangs
    try:
        ep.ExpertParallelMoE(moe.experts, E + (rank == world - 1),
                             group=group)
        raise AssertionError("ranks that disagree on E were accepted")
    except ValueError as e:
        assert "experts of a layer of E 25" in str(e) or \
            "the partition gives this rank 257" in str(e), str(e)
    # a rank whose kernels fail (its layer closed) after the rows moved:
    # it raises its error, the ranks that sent it rows a RuntimeError, the
    # others return; nobody is left in a collective
    if world > 1:
        last = world - 1
        sent = bool((ids >= ep.expert_partition(E, world)[last][0]).any())
        if rank == last:
            moe.experts._moe.close()
        for mode in MODES:
            try:
                moe(x, w, ids, dispatch=mode)
                assert rank != last and not sent, "a failure went unseen"
            except wna16.Error as e:
                assert rank == last, str(e)
            except RuntimeError as e:
                assert rank != last and sent and \
                    f"rank(s) [{last}] failed to run" in str(e), str(e)
    np.savez(os.path.join(out_dir, f"n{world}_rank{rank}.npz"), **saved)


# ---- the tests ------------------------------------------------------------

def _single(backend, device):
    """The single-process layer on the same weights: every expert."""
    ctx = wna16.Context(cache_dir=os.environ.get("WNA16_TEST_CACHE"),
                        cpu_threads=2)
    target = "cuda" if device == "cuda" else "cpu"
    try:
        packed = ctx.repack_layer(None, backend, format="gptq",
                                  tensors=gptq_layer(), prefix=PREFIX, E=E,
                                  H=H, I=I, quant=QUANT, target=target)
    except wna16.Error as e:
        if e.name == "EUNAVAILABLE":
            pytest.skip(e.message)
        raise
    return WNA16Experts.from_packed(ctx, packed, PREFIX, E, H, I, QUANT,
                                    backend, device)


@pytest.fixture(scope="module")
def single():
    return _single("triton", "cpu")


@pytest.fixture(scope="module")
def single_cuda():
    if not (torch.cuda.is_available() and
            torch.distributed.is_nccl_available()):
        pytest.skip("no CUDA device with NCCL in this torch")
    if wna16.probe_device()["platform"] != "cuda":
        pytest.skip("the library finds no CUDA GPU: "
                    f"{wna16.probe_device()['notes']}")
    return _single("marlin", "cuda")


def _close(got, want, what):
    """Each rank's partial result (expert_map) or each slot's (batched) is
    rounded to 16 bits before the float32 sum: a few ulps of the largest
    term; a wrong expert or weight is off by far more."""
    g, w = got.to(torch.float64), want.to(torch.float64)
    err = float((g - w).abs().max()) if g.numel() else 0.0
    scale = max(float(w.abs().max()) if w.numel() else 0.0, 1e-3)
    ulp = 2 ** -7 if want.dtype == torch.bfloat16 else 2 ** -10
    assert err <= 4 * ulp * scale, \
        f"{what}: max error {err:.3g} against max |out| {scale:.3g}"


def _launch(d, backend, world):
    """world worker processes (this file); their outputs go to d. When one
    fails the others are stopped after a few seconds (they would wait in
    a collective until gloo's timeout)."""
    init = os.path.join(d, "init")
    logs = [open(os.path.join(d, f"rank{r}.log"), "w+b")
            for r in range(world)]
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", str(r), str(world), backend,
         init, d], stdout=logs[r], stderr=subprocess.STDOUT)
        for r in range(world)]
    deadline = time.monotonic() + 300
    while any(p.poll() is None for p in procs):
        if any(p.returncode for p in procs) or time.monotonic() > deadline:
            time.sleep(5)  # the others' own errors first
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    text = []
    for r, (p, f) in enumerate(zip(procs, logs)):
        p.wait()
        f.seek(0)
        text.append(f"--- rank {r} (exit {p.returncode}):\n"
                    f"{f.read().decode(errors='replace')[-3000:]}")
        f.close()
    assert all(p.returncode == 0 for p in procs), "\n".join(text)
    return d


def _compare(d, world, single, device):
    res = [dict(np.load(os.path.join(d, f"n{world}_rank{r}.npz")))
           for r in range(world)]
    for case in cases_for(device):
        for r in range(world):
            x, w, ids = (t.to(device) for t in inputs(case, r, world))
            want = single(x, w, ids,
                          apply_router_weight_on_input=case[4]).cpu()
            for mode in MODES:
                got = torch.from_numpy(res[r][f"{case[0]}_{mode}"])
                if x.dtype == torch.bfloat16:
                    got = got.view(torch.bfloat16)
                what = f"N={world} rank {r} {case[0]} {mode} on {device}"
                assert got.shape == want.shape, what
                _close(got, want, what)
                if world == 1 and mode == "expert_map":
                    # one rank, one row per token: the layer's own bits
                    assert torch.equal(got, want), what + ": not the " \
                        "single layer's bits"
                if x.shape[0]:
                    assert float(want.abs().max()) > 0.05, what


@pytest.fixture(scope="module")
def runs(single, tmp_path_factory):
    """The WORLD gloo workers, run once: their outputs' directory."""
    return _launch(str(tmp_path_factory.mktemp("ep")), "gloo", WORLD)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ep_gloo(single, runs, world):
    _compare(runs, world, single, "cpu")


def test_ep_nccl(single_cuda, tmp_path):
    """Every GPU here (world size 1 on one GPU) with NCCL, each group of
    the first n ranks against the single-GPU layer (Marlin kernels)."""
    world = torch.cuda.device_count()
    _launch(str(tmp_path), "nccl", world)
    for n in range(1, world + 1):
        _compare(str(tmp_path), n, single_cuda, "cuda")


def test_partition():
    assert ep.expert_partition(256, 1) == [(0, 256)]
    assert ep.expert_partition(256, 3) == [(0, 86), (86, 85), (171, 85)]
    assert ep.expert_partition(8, 8) == [(e, 1) for e in range(8)]
    with pytest.raises(ValueError, match="at least one expert"):
        ep.expert_partition(4, 8)
    with pytest.raises(ValueError, match="world size 0"):
        ep.expert_partition(4, 0)


def test_local_checkpoint_tensors():
    a = {f"p.{e}.gate_proj.qweight": np.full(2, e) for e in range(6)}
    sub = ep.local_checkpoint_tensors(a, "p", 6, 2, 3)
    assert sorted(sub) == [f"p.{e}.gate_proj.qweight" for e in range(3)]
    assert [int(sub[f"p.{e}.gate_proj.qweight"][0]) for e in range(3)] == \
        [2, 3, 4]
    stacked = {"p.w13_weight": np.arange(12).reshape(6, 2), "q.x": 0}
    sub = ep.local_checkpoint_tensors(stacked, "p", 6, 4, 2)
    assert sub["p.w13_weight"].tolist() == [[8, 9], [10, 11]]
    with pytest.raises(ValueError, match="neither one expert"):
        ep.local_checkpoint_tensors({"p.g_idx": np.zeros(5)}, "p", 6, 0, 3)
    with pytest.raises(ValueError, match="expert 9 of a layer of 6"):
        ep.local_checkpoint_tensors({"p.9.a": np.zeros(1)}, "p", 6, 0, 3)


def test_needs_init(single):
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ep.ExpertParallelMoE(single, E)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
           sys.argv[6])
