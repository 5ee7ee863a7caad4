"""wna16.torch - WNA16Experts, the experts stage of a fused MoE for PyTorch
engines, with vLLM's FusedMoE experts arguments.

The weights are a layer already in a backend's stacked layout (what
wna16's repack writes: w13/w2 qweight and scales, and qzeros, bias,
g_idx... when the layout has them), as torch tensors. On a CUDA device
the tensor-core kernels read them in place (Marlin layouts) and run on
the caller's current torch stream; on the CPU the generated kernels read
them in place (any stacked layout; Triton's is the fast one there).

    experts = WNA16Experts.from_checkpoint_layer(ctx, layer, device="cpu")
    out = experts(hidden_states, topk_weights, topk_ids)

    # vLLM's modular-kernel call (FusedMoEPermuteExpertsUnpermute.apply):
    experts.apply(output, hidden_states, w1, w2, topk_weights, topk_ids,
                  activation, global_num_experts, expert_map, None, None,
                  None, None, None, apply_router_weight_on_input)

hidden_states [M, H] float16/bfloat16, topk_weights [M, k] float32,
topk_ids [M, k] int32 (int64 is converted), global ids when expert_map
([global_num_experts] int32: local id or -1) is given. activation: vLLM's
names (silu, gelu, swigluoai, ...; the MoEActivation enum's value or
name). The output has hidden_states' dtype and device.
"""
import torch

from . import core

__all__ = ["WNA16Experts"]


def _act_name(activation):
    if activation is None:
        return "silu"
    v = getattr(activation, "value", activation)  # vLLM's MoEActivation
    v = getattr(v, "name", v) if not isinstance(v, str) else v
    return str(v).lower()


class WNA16Experts(torch.nn.Module):
    """tensors: dict of the stacked layer's tensors by role name without
    the prefix ("w13_qweight", "w13_scales", "w2_qweight", "w2_scales",
    optional "w13_qzeros", "w13_bias", "w13_g_idx", ...), all on one
    device. E, H, I: experts, hidden and unpadded intermediate size;
    quant: {"bits", "group_size", "zero_point", "act_order", "bias"}.
    backend: the layout's spec name (default: "marlin" on CUDA, "triton"
    on the CPU). ctx: a wna16.Context (default: one shared per process).
    The layer reads the tensors in place: moving or casting the module
    afterwards is refused at the next call (build one per device)."""

    _default_ctx = None

    def __init__(self, tensors, E, H, I, quant, backend=None, ctx=None,
                 prefix="experts"):
        super().__init__()
        devs = {t.device.type for t in tensors.values()}
        if len(devs) != 1:
            raise ValueError(f"WNA16Experts: tensors on {sorted(devs)}; all "
                             "on one device")
        self.device_type = devs.pop()
        self.backend = backend or ("marlin" if self.device_type == "cuda"
                                   else "triton")
        self.E, self.H, self.I = E, H, I
        self.quant = dict(quant)
        self.prefix = prefix
        self.ctx = ctx or WNA16Experts._context()
        self.names = {}
        for role, t in tensors.items():
            t = t.contiguous()
            self.register_buffer(role, t, persistent=False)
            self.names[f"{prefix}.{role}"] = role
        bufs = {name: getattr(self, role) for name, role in self.names.items()}
        # the library reads these addresses: a module moved or cast after
        # construction (.to(), .half()) would leave it reading freed memory
        self._bound = {role: getattr(self, role).data_ptr()
                       for role in self.names.values()}
        if self.device_type == "cuda":
            self._moe = self.ctx.cuda_moe(self.backend, bufs, prefix, E, H, I,
                                          self.quant)
        elif self.device_type == "cpu":
            self._moe = self.ctx.moe_layer(self.backend, bufs, prefix, E, H,
                                           I, self.quant, target="cpu")
        else:
            raise ValueError(f"WNA16Experts: no wna16 target for "
                             f"{self.device_type} tensors")

    @classmethod
    def _context(cls):
        if cls._default_ctx is None:
            cls._default_ctx = core.Context()
        return cls._default_ctx

    @classmethod
    def from_checkpoint_layer(cls, ctx, layer, backend=None, device="cpu"):
        """Repacks a wna16.Layer of a checkpoint (with generated kernels on
        the CPU, or on the GPU for a CUDA device) into `backend`'s layout and builds the experts on
        `device` (the tensors are moved there once)."""
        dev = torch.device(device)
        backend = backend or ("marlin" if dev.type == "cuda" else "triton")
        packed = ctx.repack_layer(layer, backend, target=dev.type
                                  if dev.type == "cuda" else "cpu")
        return cls.from_packed(ctx, packed, layer.prefix, layer.E, layer.H,
                               layer.I, layer.quant, backend, dev)

    @classmethod
    def from_packed(cls, ctx, packed, prefix, E, H, I, quant, backend,
                    device="cpu"):
        """The experts over a TensorSet that repack_layer returned (the
        stacked tensors under `prefix`), copied into torch tensors on
        `device`; `packed` is closed."""
        dev = torch.device(device)
        pre = prefix + "."
        tensors = {}
        for name in packed.names():
            arr = packed[name]
            dt = packed.dtype(name)
            if dt in ("BF16", "U16"):  # torch 1.13 has no uint16
                arr = arr.view("int16")
            t = torch.from_numpy(arr.copy())  # the set is freed below
            if dt == "BF16":
                t = t.view(torch.bfloat16)
            tensors[name[len(pre):]] = t.to(dev)
        packed.close()
        return cls(tensors, E, H, I, quant, backend, ctx)

    def _check_bound(self):
        for role, ptr in self._bound.items():
            if getattr(self, role).data_ptr() != ptr:
                raise RuntimeError(f"WNA16Experts: {role} is no longer the "
                                   "tensor the layer was built on (the "
                                   "module was moved or cast); build one "
                                   "per device")

    def forward(self, hidden_states, topk_weights, topk_ids,
                activation="silu", global_num_experts=-1, expert_map=None,
                apply_router_weight_on_input=False, out=None):
        self._check_bound()
        if topk_ids.dtype != torch.int32:
            topk_ids = topk_ids.to(torch.int32)
        if topk_weights.dtype != torch.float32:
            topk_weights = topk_weights.to(torch.float32)
        topk_ids = topk_ids.contiguous()
        topk_weights = topk_weights.contiguous()
        hidden_states = hidden_states.contiguous()
        if expert_map is not None and expert_map.dtype != torch.int32:
            expert_map = expert_map.to(torch.int32)
        gne = global_num_experts if global_num_experts and \
            global_num_experts > 0 else 0
        if expert_map is None and gne and gne != self.E:
            raise ValueError(f"global_num_experts {gne} without an "
                             f"expert_map, but the layer has {self.E} experts")
        if expert_map is not None and not gne:
            gne = expert_map.numel()
        return self._moe.run(hidden_states, topk_ids, topk_weights,
                             activation=_act_name(activation),
                             expert_map=expert_map, global_num_experts=gne,
                             apply_router_weight_on_input=bool(
                                 apply_router_weight_on_input),
                             out=out)

    def forward_batched(self, hidden_states, expert_num_tokens,
                        weights=None, activation="silu",
                        apply_router_weight_on_input=False, out=None):
        """The batched (expert-major) format: hidden_states [E, max_tokens,
        H], rows [0, expert_num_tokens[e]) of expert e are its tokens;
        weights [E, max_tokens] float32 or None (each row's router weight,
        applied to the output or, with apply_router_weight_on_input, the
        input). Returns [E, max_tokens, H] (rows past a count are 0), on
        hidden_states' device (expert_num_tokens and weights there too)."""
        self._check_bound()
        if expert_num_tokens.dtype != torch.int32:
            expert_num_tokens = expert_num_tokens.to(torch.int32)
        if weights is not None:
            weights = weights.to(torch.float32).contiguous()
        return self._moe.run_batched(
            hidden_states.contiguous(), expert_num_tokens.contiguous(),
            weights, activation=_act_name(activation),
            apply_router_weight_on_input=bool(apply_router_weight_on_input),
            out=out)

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids,
              activation, global_num_experts, expert_map, a1q_scale=None,
              a2_scale=None, workspace13=None, workspace2=None,
              expert_tokens_meta=None, apply_router_weight_on_input=False):
        """vLLM's FusedMoEPermuteExpertsUnpermute.apply: writes `output`.
        w1/w2 must be this object's w13/w2 qweights (the layer is bound at
        construction); activation quantization scales are refused (WNA16
        runs 16-bit activations)."""
        for name, w in (("w1", w1), ("w2", w2)):
            mine = getattr(self, "w13_qweight" if name == "w1"
                           else "w2_qweight")
            if w is not None and w.data_ptr() != mine.data_ptr():
                raise ValueError(f"{name}: not the qweight this "
                                 "WNA16Experts was built with")
        if a1q_scale is not None or a2_scale is not None:
            raise ValueError("a1q_scale/a2_scale: WNA16Experts runs 16-bit "
                             "activations")
        return self.forward(hidden_states, topk_weights, topk_ids,
                            activation, global_num_experts, expert_map,
                            apply_router_weight_on_input, out=output)
