"""wna16.ep - expert parallelism over torch.distributed: one MoE layer
whose experts are spread over the ranks of a process group (NCCL on GPUs,
gloo on CPUs), each rank running wna16's kernels on its own experts.

    dist.init_process_group("nccl")          # or "gloo"; any world size
    moe = ExpertParallelMoE.from_checkpoint_layer(ctx, layer,
                                                  device="cuda")
    out = moe(hidden_states, topk_weights, topk_ids)    # this rank's tokens

Placement: rank r holds the contiguous experts [first_r, first_r + n_r)
of expert_partition(E, N): E // N each, the first E % N ranks one more
(vLLM's placement), so any world size up to E works, dividing E or not.
Each rank repacks only its experts (wna16's repack, for its device).

One call, on every rank of the group with its own tokens (M may differ
between ranks, and may be 0):

  dispatch  the header (rows for each rank, a status, the dtype, top-k)
            goes through one all_to_all_single, then the token rows through
            a second (all_to_all_single with the exchanged split sizes);
            the receiver lays its rows out for its kernels:
            "batched": one row per (token, slot) routed to this rank, in
              the batched (expert-major) format [n_r, max_tokens, H] with
              per-expert counts, the slot's router weight beside it;
            "expert_map": one row per (token, rank) pair, the token's whole
              top-k ids and weights with it, run in the standard format
              with an expert_map [E] (-1 for experts not here), so the
              kernel sums this rank's slots of the token;
  compute   wna16.torch.WNA16Experts (forward_batched / forward): the
            router weights are applied by the kernel, to the output or,
            with apply_router_weight_on_input, to the input;
  combine   the reverse all_to_all_single, then each token's rows summed
            in float32 in a fixed order (slot order, or rank order) and
            rounded once to the activation dtype.

Deterministic: the same inputs give the same bits (no atomics; the order
of every sum is fixed by the routing). A rank whose inputs are refused
(wrong shape or dtype, an expert id out of range) says so in the header:
every rank raises (that rank a ValueError naming the problem, the others
a RuntimeError naming that rank) before any row moves, so no rank is left
waiting in a collective.
"""
import time

import torch
import torch.distributed as dist

from . import _lib
from .torch import WNA16Experts, _act_name

__all__ = ["ExpertParallelMoE", "expert_partition",
           "local_checkpoint_tensors"]

_DTYPES = {torch.float16: 1, torch.bfloat16: 2}
_DISPATCH = {"batched": 1, "expert_map": 2}


def expert_partition(num_experts, world_size):
    """[(first, count)] for each rank: contiguous ranges, E // N experts
    each and one more on the first E % N ranks. Every rank needs at least
    one expert (ValueError otherwise)."""
    if world_size < 1:
        raise ValueError(f"world size {world_size}: expected >= 1")
    if num_experts < world_size:
        raise ValueError(f"{num_experts} experts over {world_size} ranks: "
                         "every rank needs at least one expert")
    base, extra = divmod(num_experts, world_size)
    out, first = [], 0
    for r in range(world_size):
        n = base + (1 if r < extra else 0)
        out.append((first, n))
        first += n
    return out


def local_checkpoint_tensors(tensors, prefix, num_experts, first, count):
    """The checkpoint tensors of experts [first, first + count) of a layer,
    renamed to local ids 0..count-1: per-expert tensors
    "{prefix}.{e}.{...}" keep their name with e - first, stacked tensors
    "{prefix}.{name}" with E rows are sliced (views, no copies). Any other
    tensor under the prefix is refused (ValueError)."""
    pre = prefix + "."
    out = {}
    for name, arr in tensors.items():
        if not name.startswith(pre):
            continue
        head, dot, rest = name[len(pre):].partition(".")
        if dot and head.isdigit():
            e = int(head)
            if e >= num_experts:
                raise ValueError(f"{name}: expert {e} of a layer of "
                                 f"{num_experts}")
            if first <= e < first + count:
                out[f"{pre}{e - first}.{rest}"] = arr
        elif len(arr.shape) >= 1 and arr.shape[0] == num_experts:
            out[name] = arr[first:first + count]
        else:
            raise ValueError(f"{name}: neither one expert's tensor nor "
                             f"stacked over the {num_experts} experts "
                             f"(shape {tuple(arr.shape)})")
    if not out:
        raise ValueError(f"no tensor of experts [{first}, {first + count}) "
                         f"under '{prefix}'")
    return out


def _zeros16(shape, dtype, device):
    """Zeros of a 16-bit dtype, filled as int16 (torch 1.13's CPU fills
    bfloat16 zeros ~50x slower)."""
    return torch.zeros(shape, dtype=torch.int16, device=device).view(dtype)


def _require_dist(group):
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("wna16.ep: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group "
                           "first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _pack(x, *meta):
    """Rows of bytes: x [R, H] (16-bit) then each int32 [R, j] array."""
    parts = [x.contiguous().view(torch.uint8)]
    parts += [m.contiguous().view(torch.uint8) for m in meta]
    return torch.cat(parts, 1) if len(parts) > 1 else parts[0]


def _unpack(rows, dtype, H, widths):
    """The inverse of _pack: x [R, H] of dtype and int32 arrays."""
    x = rows[:, :2 * H].contiguous().view(dtype)
    out, at = [x], 2 * H
    for w in widths:
        out.append(rows[:, at:at + 4 * w].contiguous().view(torch.int32))
        at += 4 * w
    return out


class ExpertParallelMoE(torch.nn.Module):
    """One MoE layer over the ranks of `group` (None: the default group).

    experts: this rank's WNA16Experts, holding the experts
      expert_partition(global_num_experts, N)[rank] as local 0..n_r-1;
    dispatch: "batched" or "expert_map" (see the module's text; forward
      may override it per call); timing: record the seconds of each stage
      of the last call in `self.times` (synchronizing a CUDA device
      between stages).
    Construction is collective (the ranks check they agree on E, H, I);
    so is every call."""

    def __init__(self, experts, global_num_experts, group=None,
                 dispatch="batched", timing=False):
        super().__init__()
        rank, N = _require_dist(group)
        if dispatch not in _DISPATCH:
            raise ValueError(f"dispatch '{dispatch}': expected one of "
                             f"{sorted(_DISPATCH)}")
        self.group, self.rank, self.world_size = group, rank, N
        self.E = global_num_experts
        self.partition = expert_partition(global_num_experts, N)
        self.first, self.count = self.partition[rank]
        self.experts = experts
        self.H, self.I = experts.H, experts.I
        self.dispatch, self.timing, self.times = dispatch, timing, {}
        role = next(iter(experts.names.values()))
        self.device = getattr(experts, role).device
        backend = str(dist.get_backend(group))
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError("the NCCL backend moves CUDA tensors: build the "
                             "experts on a CUDA device (or use gloo)")
        # tensors that travel: on the experts' device for NCCL, host for
        # gloo (which moves host tensors)
        self.comm_device = self.device if backend == "nccl" else \
            torch.device("cpu")
        owner = torch.empty(global_num_experts, dtype=torch.long)
        local = torch.empty(global_num_experts, dtype=torch.long)
        for r, (f, n) in enumerate(self.partition):
            owner[f:f + n] = r
            local[f:f + n] = torch.arange(n)
        self._owner = owner.to(self.device)
        self._local = local.to(self.device)
        emap = torch.full((global_num_experts,), -1, dtype=torch.int32)
        emap[self.first:self.first + self.count] = torch.arange(
            self.count, dtype=torch.int32)
        self.expert_map = emap  # host: the C API reads a host array
        # every rank's layer, gathered before anyone refuses (a rank that
        # raised alone would leave the others in the collective)
        mine = torch.tensor([global_num_experts, self.H, self.I, experts.E],
                            dtype=torch.long, device=self.comm_device)
        every = [torch.empty_like(mine) for _ in range(N)]
        dist.all_gather(every, mine, group=group)
        if experts.E != self.count:
            raise ValueError(
                f"rank {rank}: the local experts hold {experts.E} experts, "
                f"the partition gives this rank {self.count} (experts "
                f"[{self.first}, {self.first + self.count}) of "
                f"{global_num_experts} over {N} ranks)")
        for r, t in enumerate(every):
            E_r, H_r, I_r, n_r = t.tolist()
            if (E_r, H_r, I_r) != (global_num_experts, self.H, self.I) or \
                    n_r != self.partition[r][1]:
                raise ValueError(
                    f"rank {rank}: rank {r} holds {n_r} experts of a layer "
                    f"of E {E_r}, H {H_r}, I {I_r}; this rank E "
                    f"{global_num_experts}, H {self.H}, I {self.I}")

    # ---- construction from checkpoint tensors ------------------------------
    @classmethod
    def from_checkpoint_tensors(cls, ctx, format, tensors, prefix, E, H, I,
                                quant, group=None, backend=None, device=None,
                                dispatch="batched", timing=False):
        """Repacks this rank's experts of a layer given as checkpoint
        tensors (a dict name -> array, every expert's or only this rank's,
        in `format`) into `backend`'s layout (default: "marlin" on CUDA,
        "triton" on the CPU) on `device` (default: the current CUDA device
        with NCCL, else the CPU). Collective."""
        rank, N = _require_dist(group)
        first, count = expert_partition(E, N)[rank]
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) \
                if str(dist.get_backend(group)) == "nccl" else "cpu"
        dev = torch.device(device)
        backend = backend or ("marlin" if dev.type == "cuda" else "triton")
        sub = local_checkpoint_tensors(tensors, prefix, E, first, count)
        packed = ctx.repack_layer(None, backend, format=format, tensors=sub,
                                  prefix=prefix, E=count, H=H, I=I,
                                  quant=quant,
                                  target="cuda" if dev.type == "cuda"
                                  else "cpu")
        experts = WNA16Experts.from_packed(ctx, packed, prefix, count, H, I,
                                           quant, backend, dev)
        return cls(experts, E, group, dispatch, timing)

    @classmethod
    def from_checkpoint_layer(cls, ctx, layer, group=None, backend=None,
                              device=None, dispatch="batched", timing=False):
        """from_checkpoint_tensors for a wna16.Layer of a checkpoint (its
        tensors are views of the mapped files; only this rank's experts
        are read)."""
        ck = layer.checkpoint
        tensors = {n: ck.tensor(n) for n in layer.names()}
        return cls.from_checkpoint_tensors(
            ctx, layer.format, tensors, layer.prefix, layer.E, layer.H,
            layer.I, layer.quant, group, backend, device, dispatch, timing)

    # ---- one call -----------------------------------------------------------
    def _check(self, x, w, ids):
        """The refusal message for this rank's inputs, or None."""
        for name, t in (("hidden_states", x), ("topk_weights", w),
                        ("topk_ids", ids)):
            if not isinstance(t, torch.Tensor):
                return f"{name}: a {type(t).__name__}, expected a tensor"
            if t.device != self.device:
                return (f"{name}: on {t.device}, the experts on "
                        f"{self.device}")
        if x.dtype not in _DTYPES:
            return f"hidden_states: {x.dtype}, expected float16 or bfloat16"
        if x.dim() != 2 or x.shape[1] != self.H:
            return (f"hidden_states: shape {tuple(x.shape)}, expected [M, "
                    f"{self.H}]")
        M = x.shape[0]
        if ids.dim() != 2 or ids.shape[0] != M or \
                tuple(w.shape) != tuple(ids.shape):
            return (f"topk_ids {tuple(ids.shape)} and topk_weights "
                    f"{tuple(w.shape)}: expected [{M}, topk] each")
        if ids.dtype not in (torch.int32, torch.int64):
            return f"topk_ids: {ids.dtype}, expected int32 or int64"
        if not w.dtype.is_floating_point:
            return f"topk_weights: {w.dtype}, expected a float dtype"
        k = ids.shape[1]
        if k < 1 or k > self.E:
            return f"topk {k}: expected 1..{self.E}"
        if M:
            bad = (ids < 0) | (ids >= self.E)
            if bool(bad.any()):
                m, j = (int(v) for v in bad.nonzero()[0])
                return (f"topk_ids[{m}][{j}] = {int(ids[m, j])} is not an "
                        f"expert id in [0, {self.E})")
        return None

    def _sync(self):
        if self.timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _a2a(self, rows, send, recv):
        """all_to_all_single of byte rows: send[d] rows to rank d, recv[s]
        from rank s."""
        src = rows.to(self.comm_device)
        dst = torch.empty((sum(recv), rows.shape[1]), dtype=torch.uint8,
                          device=self.comm_device)
        dist.all_to_all_single(dst, src, output_split_sizes=list(recv),
                               input_split_sizes=list(send),
                               group=self.group)
        return dst.to(self.device)

    def forward(self, hidden_states, topk_weights, topk_ids,
                activation="silu", apply_router_weight_on_input=False,
                dispatch=None):
        """This rank's tokens through the layer: hidden_states [M, H]
        float16/bfloat16, topk_weights [M, k] (float), topk_ids [M, k]
        global expert ids (int32/int64), all on the experts' device.
        Returns [M, H] in hidden_states' dtype. Every rank of the group
        calls it (M may be 0), with the same dtype, k, activation, flags
        and dispatch."""
        mode = dispatch or self.dispatch
        if mode not in _DISPATCH:
            raise ValueError(f"dispatch '{mode}': expected one of "
                             f"{sorted(_DISPATCH)}")
        N, times = self.world_size, {}
        self._sync()
        t0 = time.perf_counter()
        x, w, ids = hidden_states, topk_weights, topk_ids
        act = _lib.lib.wna16_activation_from_name(
            _lib.cstr(_act_name(activation)))
        why = self._check(x, w, ids) if act >= 0 else \
            f"activation '{_act_name(activation)}': unknown"
        if why is None:
            x = x.contiguous()
            ids = ids.to(torch.long)
            w = w.to(torch.float32).contiguous()
            M, k = ids.shape
            if mode == "batched":
                plan = self._plan_batched(x, w, ids)
            else:
                plan = self._plan_map(x, w, ids)
            send = plan["send"]
            hdr = [[send[d], 0, _DTYPES[x.dtype], k,
                    int(bool(apply_router_weight_on_input)), _DISPATCH[mode],
                    act] for d in range(N)]
        else:
            hdr = [[0, 1, 0, 0, 0, 0, 0] for _ in range(N)]
        h = torch.tensor(hdr, dtype=torch.long, device=self.comm_device)
        got = torch.empty_like(h)
        dist.all_to_all_single(got, h, group=self.group)
        got = got.tolist()
        if why is not None:
            raise ValueError(f"wna16.ep rank {self.rank}: {why}")
        bad = [s for s in range(N) if got[s][1]]
        if bad:
            raise RuntimeError(f"wna16.ep rank {self.rank}: rank(s) {bad} "
                               "refused their inputs (see their errors); "
                               "no rank ran the layer")
        mine = hdr[0][2:]
        for s in range(N):
            if got[s][2:] != mine:
                raise RuntimeError(
                    f"wna16.ep rank {self.rank}: rank {s} called with "
                    f"(dtype, topk, on_input, dispatch, activation) codes "
                    f"{got[s][2:]}, "
                    f"this rank {mine}: every rank passes the same")
        recv = [got[s][0] for s in range(N)]
        rows = self._a2a(plan["rows"], send, recv)
        on_input = bool(apply_router_weight_on_input)
        failed = None
        try:
            if mode == "batched":
                y = self._run_batched(rows, x.dtype, activation, on_input,
                                      times)
            else:
                y = self._run_map(rows, x.dtype, k, activation, on_input,
                                  times)
        except Exception as e:  # the others wait for these rows: send 0s
            failed = e
            y = torch.zeros((rows.shape[0], self.H), dtype=x.dtype,
                            device=rows.device)
            times["compute"] = 0.0
        t2 = time.perf_counter()
        # each returned row carries this rank's status (int32) after H
        status = torch.full((y.shape[0], 1), int(failed is not None),
                            dtype=torch.int32, device=y.device)
        back = self._a2a(_pack(y, status), recv, send)
        back, status = _unpack(back, x.dtype, self.H, (1,))
        if failed is not None:
            raise failed
        if status.numel() and bool(status.any()):
            ends = torch.cumsum(torch.tensor(send), 0).tolist()
            bad = [s for s in range(N) if send[s] and
                   bool(status[ends[s] - send[s]:ends[s]].any())]
            raise RuntimeError(f"wna16.ep rank {self.rank}: rank(s) {bad} "
                               "failed to run their experts (see their "
                               "errors); this call's output is lost")
        if mode == "batched":
            out = self._combine_batched(back, plan, M, k)
        else:
            out = self._combine_map(back, plan, M, k)
        self._sync()
        t3 = time.perf_counter()
        if self.timing:
            times["combine"] = t3 - t2
            times["dispatch"] = t3 - t0 - times["combine"] - times["compute"]
            self.times = times
        return out

    # batched: one row per (token, slot) routed to the rank
    def _plan_batched(self, x, w, ids):
        M, k = ids.shape
        g = ids.reshape(-1)
        dest = self._owner[g]
        key = dest * self.E + self._local[g]  # by rank, then local expert
        order = torch.sort(key, stable=True).indices
        send = torch.bincount(dest, minlength=self.world_size).tolist()
        meta = torch.stack([self._local[g][order].to(torch.int32),
                            w.reshape(-1)[order].view(torch.int32)], 1)
        rows = _pack(x.index_select(0, order // k), meta)
        return {"send": send, "rows": rows, "order": order}

    def _run_batched(self, rows, dtype, activation, on_input, times):
        x, meta = _unpack(rows, dtype, self.H, (2,))
        R, n = x.shape[0], self.count
        self._sync()
        t1 = time.perf_counter()
        if R == 0:
            times["compute"] = 0.0
            return x
        loc = meta[:, 0].to(torch.long)
        wt = meta[:, 1].contiguous().view(torch.float32)
        counts = torch.bincount(loc, minlength=n)
        T = int(counts.max())
        order = torch.sort(loc, stable=True).indices
        ls = loc[order]
        starts = torch.cumsum(counts, 0) - counts
        slot = ls * T + (torch.arange(R, device=x.device) - starts[ls])
        hb = _zeros16((n * T, self.H), x.dtype, x.device)
        hb[slot] = x.index_select(0, order)
        wb = torch.zeros(n * T, dtype=torch.float32, device=x.device)
        wb[slot] = wt.index_select(0, order)
        self._sync()
        t1 = time.perf_counter()
        ob = self.experts.forward_batched(
            hb.view(n, T, self.H), counts.to(torch.int32), wb.view(n, T),
            activation=activation, apply_router_weight_on_input=on_input)
        self._sync()
        times["compute"] = time.perf_counter() - t1
        y = torch.empty_like(x)
        y[order] = ob.view(n * T, self.H).index_select(0, slot)
        return y

    def _combine_batched(self, back, plan, M, k):
        ys = torch.empty((M * k, self.H), dtype=back.dtype,
                         device=back.device)
        ys[plan["order"]] = back
        ys = ys.view(M, k, self.H)
        acc = ys[:, 0].to(torch.float32)
        for j in range(1, k):  # slot order: a fixed sum
            acc += ys[:, j]
        return acc.to(back.dtype)

    # expert_map: one row per (token, rank), the token's top-k with it
    def _plan_map(self, x, w, ids):
        M, k = ids.shape
        N = self.world_size
        dest = self._owner[ids]  # [M, k]
        mask = torch.zeros((M, N), dtype=torch.bool, device=x.device)
        mask.scatter_(1, dest, True)
        mt = mask.t().contiguous()  # [N, M]: rows by rank, then token
        pairs = mt.nonzero()
        send = mt.sum(1).tolist()
        m = pairs[:, 1]
        rows = _pack(x.index_select(0, m),
                     ids.index_select(0, m).to(torch.int32),
                     w.index_select(0, m).view(torch.int32))
        return {"send": send, "rows": rows, "mask": mt}

    def _run_map(self, rows, dtype, k, activation, on_input, times):
        x, ids, wi = _unpack(rows, dtype, self.H, (k, k))
        self._sync()
        t1 = time.perf_counter()
        if x.shape[0] == 0:
            times["compute"] = 0.0
            return x
        y = self.experts(x, wi.view(torch.float32), ids, activation,
                         self.E, self.expert_map, on_input)
        self._sync()
        times["compute"] = time.perf_counter() - t1
        return y

    def _combine_map(self, back, plan, M, k):
        mt, N = plan["mask"], self.world_size
        P = back.shape[0]
        rowid = torch.full((N, M), P, dtype=torch.long, device=back.device)
        rowid[mt] = torch.arange(P, device=back.device)  # (rank, token)
        rowid = rowid.t()  # [M, N]
        # each token's rows in rank order, the missing ones (P: a zero
        # row) last
        idx = torch.sort((rowid == P).to(torch.int8), dim=1,
                         stable=True).indices
        pos = torch.gather(rowid, 1, idx)[:, :min(k, N)]
        ext = torch.cat([back, _zeros16((1, self.H), back.dtype,
                                        back.device)])
        acc = ext.index_select(0, pos[:, 0]).to(torch.float32)
        for c in range(1, pos.shape[1]):  # rank order: a fixed sum
            acc += ext.index_select(0, pos[:, c])
        return acc.to(back.dtype)
