"""core.py - the Python face of the C API: a Context (kernel cache, CPU
threads, log callback, specs, packs), checkpoints and their MoE layers,
backend selection, repacking (one layer, or a whole checkpoint to a
file), and the fused MoE on the CPU (generated kernels) or a CUDA GPU
(tensor-core kernels), standard and batched formats, with expert maps,
every activation and biases. Arrays go in and out without copies
(_tensor.py). Library errors raise wna16.Error with the library's message.

Lifetimes follow the C API's: a Checkpoint keeps its Context alive, a
Layer its Checkpoint (its tensors are views into the mapped files), a
TensorSet its Context and every array added to it, a MoE layer its
Context and the TensorSet it reads. close() frees early; otherwise the
garbage collector does, in a safe order.
"""
import ctypes
import sys
import threading
import weakref

from . import _lib
from . import _tensor
from ._lib import Error, call, cstr, pystr

__all__ = ["Context", "Checkpoint", "Layer", "TensorSet", "Selection",
           "MoeLayer", "CudaMoe", "probe_device", "version", "Error",
           "kernel_platforms"]


def version():
    """The linked library's version string ("0.1.0")."""
    return pystr(_lib.lib.wna16_version())


def probe_device():
    """The best device present: {"platform": "cuda"|"xpu"|"cpu", "cc":
    (major, minor), "name": ..., "notes": why an accelerator was not used}."""
    d = _lib.DeviceInfo()
    _lib.lib.wna16_probe_device(ctypes.byref(d))
    plat = {v: k for k, v in _lib.PLATFORM.items()}[d.platform]
    return {"platform": plat, "cc": (d.cc_major, d.cc_minor),
            "name": pystr(d.name), "notes": pystr(d.notes)}


def kernel_platforms():
    """The platforms this library build generates kernels for: a set of
    "cpu" (LLVM), "cuda" (NVRTC), "xpu"..."""
    m = _lib.lib.wna16_build_kernel_platforms()
    return {name for name, bit in _lib.PLATFORM.items() if m & (1 << bit)}


# The model's dtype in a quant dict: torch's names, None when not given.
_MODEL_DTYPES = {"float16": "F16", "bfloat16": "BF16"}


def _quant(q):
    md = _lib.DTYPES[q.model_dtype - 1] if q.model_dtype else None
    return {"bits": q.bits, "group_size": q.group_size,
            "zero_point": q.zero_point, "act_order": q.act_order,
            "bias": q.bias, "zeros_stored": q.zeros_stored,
            "g_idx_stored": q.g_idx_stored,
            "input_dtype": {v: k for k, v in
                            _lib.INPUT_DTYPE.items()}[q.input_dtype],
            "model_dtype": {v: k for k, v in _MODEL_DTYPES.items()}.get(md)}


def _quant_struct(d):
    """A wna16_quant_desc_t from a dict (as Layer.quant gives)."""
    if isinstance(d, _lib.QuantDesc):
        return d
    q = _lib.QuantDesc()
    unknown = set(d) - {"bits", "group_size", "zero_point", "act_order",
                        "bias", "zeros_stored", "g_idx_stored", "input_dtype",
                        "model_dtype"}
    if unknown:
        raise ValueError(f"quant: unknown keys {sorted(unknown)}")
    q.bits = d.get("bits", 4)
    q.group_size = d.get("group_size", -1)
    for k in ("zero_point", "act_order", "bias", "zeros_stored",
              "g_idx_stored"):
        setattr(q, k, bool(d.get(k, False)))
    q.input_dtype = _lib.INPUT_DTYPE[d.get("input_dtype", "16bit")]
    md = d.get("model_dtype")
    if md is not None and md not in _MODEL_DTYPES:
        raise ValueError(f"quant: model_dtype {md!r}: expected one of "
                         f"{sorted(_MODEL_DTYPES)} or None")
    q.model_dtype = _lib.DTYPE[_MODEL_DTYPES[md]] if md else 0
    return q


def _target(name):
    if name not in _lib.TARGET:
        raise ValueError(f"target '{name}': expected one of "
                         f"{sorted(_lib.TARGET)}")
    return _lib.TARGET[name]


class Context:
    """A wna16 context: specs, kernel cache, targets, CPU thread pool.

    cache_dir: the kernel cache's directory (None: $WNA16_CACHE_DIR, else
      $XDG_CACHE_HOME/wna16, else ~/.cache/wna16); cache_max_bytes: its
      size limit (0: $WNA16_CACHE_MAX_SIZE or 2 GiB); cpu_threads: the CPU
      kernels' threads (0: $WNA16_NUM_THREADS or all online CPUs);
      spec_dir: extra specs; log: a callable(level: str, message: str)
      called from any thread (None: stderr); log_level: "debug", "info",
      "warn" or "error"; no_jit: kernels only from packs and the cache.
    A context may be shared by threads (see docs/api.md)."""

    def __init__(self, cache_dir=None, cache_max_bytes=0, cpu_threads=0,
                 spec_dir=None, log=None, log_level=None, no_jit=False,
                 packs=()):
        self._ptr = None
        self._children = []  # weak references, in creation order
        o = _lib.ContextOptions()
        o.cache_dir = cstr(None if cache_dir is None else str(cache_dir))
        o.cache_max_bytes = cache_max_bytes
        o.cpu_threads = cpu_threads
        o.spec_dir = cstr(None if spec_dir is None else str(spec_dir))
        o.no_jit = no_jit
        self._log_cb = None
        if log is not None:
            names = {v: k for k, v in _lib.LOG_LEVEL.items()}

            def trampoline(user, level, msg):
                try:
                    log(names.get(level, str(level)), pystr(msg))
                except Exception:  # never unwind into C
                    pass
            self._log_cb = _lib.LOG_FN(trampoline)
            o.log = self._log_cb
        if log_level is not None:
            o.log_level = _lib.LOG_LEVEL[log_level]
            o.log_level_set = True
        ptr = ctypes.c_void_p()
        call("wna16_context_create", ctypes.byref(o), ctypes.byref(ptr))
        self._ptr = ptr
        for p in packs:
            self.add_pack(p)

    @property
    def ptr(self):
        if not self._ptr:
            raise ValueError("the context is closed")
        return self._ptr

    def _register(self, obj):
        """Records an object made from this context, so that close() can
        free it first (the C API wants every object gone before its
        context)."""
        self._children = [r for r in self._children if r() is not None]
        self._children.append(weakref.ref(obj))

    def close(self):
        """Frees the context, after every object still open that was made
        from it (newest first: a MoE layer before the tensors it reads, a
        layer before its checkpoint); those objects are closed too."""
        if self._ptr:
            for ref in reversed(self._children):
                obj = ref()
                if obj is not None:
                    obj.close()
            self._children = []
            _lib.lib.wna16_context_destroy(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- specs and packs ----
    def add_pack(self, path):
        """Adds an AOT kernel pack (`wna16 pack build`) searched before the
        kernel cache and the compilers."""
        call("wna16_context_add_pack", self.ptr, cstr(str(path)))

    def cache_info(self):
        """The kernel cache (wna16_cache_info): {"dir" ("" when in memory
        only), "disk_readable", "disk_writable", "max_bytes", "files" and
        "bytes" (the directory now), "entries" (kernels in memory), and this
        context's "memory_hits", "disk_hits", "compiles", "disk_writes",
        "corrupt", "untrusted", "evictions", "errors"}."""
        i = _lib.CacheInfo()
        call("wna16_cache_info", self.ptr, ctypes.byref(i))
        return {k: (pystr(getattr(i, k)) if k == "dir" else getattr(i, k))
                for k, _ in i._fields_}

    def cache_clear(self):
        """Removes every kernel in the cache directory; returns how many.
        Kernels already loaded stay usable. Error EUNAVAILABLE when the
        cache is in memory only."""
        n = ctypes.c_size_t()
        call("wna16_cache_clear", self.ptr, ctypes.byref(n))
        return n.value

    def load_spec(self, path):
        """Loads a spec file (replacing a built-in one of that name); not
        while other threads use the context."""
        call("wna16_spec_load_file", self.ptr, cstr(str(path)), None)

    def specs(self, kind=None):
        """Names of the registered specs: kind "format", "backend" or None
        for both, as (kind, name) pairs."""
        out = []
        for i in range(_lib.lib.wna16_spec_count(self.ptr)):
            s = _lib.lib.wna16_spec_at(self.ptr, i)
            k = "format" if _lib.lib.wna16_spec_kind(s) == 1 else "backend"
            if kind in (None, k):
                out.append((k, pystr(_lib.lib.wna16_spec_name(s))))
        return out

    def spec(self, name, kind):
        k = {"format": _lib.SPEC_FORMAT, "backend": _lib.SPEC_BACKEND}[kind]
        s = _lib.lib.wna16_spec_find(self.ptr, k, cstr(name))
        if not s:
            raise Error(-7, f"no {kind} spec '{name}' (registered: "
                        f"{[n for _, n in self.specs(kind)]})")
        return s

    # ---- checkpoints ----
    def open_checkpoint(self, path):
        """A Hugging Face checkpoint directory (sharded or not) or a
        .safetensors file."""
        return Checkpoint(self, path)

    # ---- selection ----
    def select(self, platform="cpu", cc=(0, 0), format=None, quant=None,
               hidden_size=0, intermediate_size=0, num_experts=0, top_k=0,
               activation="silu", activation_format="standard",
               backend=None, actorder=None, intermediate_size_full=0,
               kernel_platforms=0):
        """vLLM's select_wna16_moe_backend from the specs: a Selection.
        Raises Error (EUNSUPPORTED, vLLM's message) when nothing fits; the
        exception's `passed_over` lists every backend and why."""
        q = _lib.SelectQuery()
        q.platform = _lib.PLATFORM[platform]
        q.cc_major, q.cc_minor = cc
        q.format = cstr(format)
        q.quant = _quant_struct(quant or {})
        q.actorder = cstr(actorder)
        q.hidden_size, q.intermediate_size = hidden_size, intermediate_size
        q.num_experts, q.top_k = num_experts, top_k
        q.intermediate_size_full = intermediate_size_full
        q.activation_format = _lib.ACT_FORMAT[activation_format]
        q.activation = cstr(activation)
        q.backend = cstr(backend)
        q.kernel_platforms = kernel_platforms
        r = _lib.SelectResult()
        err = _lib.ErrorT()
        st = _lib.lib.wna16_select(self.ptr, ctypes.byref(q), ctypes.byref(r),
                                   ctypes.byref(err))
        sel = Selection(r)
        if st != 0:
            e = Error(st, pystr(err.message))
            e.passed_over = sel.passed_over
            raise e
        return sel

    def select_for(self, layer, device=None, backend=None, **kw):
        """select() for a Layer of a checkpoint on `device` (probe_device()
        when None)."""
        dev = device or probe_device()
        return self.select(platform=dev["platform"], cc=dev["cc"],
                           format=layer.format, quant=layer.quant,
                           hidden_size=layer.H, intermediate_size=layer.I,
                           num_experts=layer.E, top_k=layer.topk,
                           backend=backend, **kw)

    # ---- repacking ----
    def repack_layer(self, layer, backend, target="cpu", *, format=None,
                     tensors=None, prefix=None, E=None, H=None, I=None,
                     quant=None):
        """Repacks one MoE layer into `backend`'s stacked layout on
        `target` ("reference", "cpu", "cuda"...): a Layer of a checkpoint,
        or (layer=None) `tensors` (a TensorSet or a dict name -> array of
        checkpoint tensors in `format`) with prefix, E, H, I and quant.
        Returns a TensorSet of the w13_*/w2_* tensors under the prefix."""
        if layer is not None:
            fmt = layer._c.format
            src, prefix = layer._c.tensors, layer.prefix
            E, H, I = layer.E, layer.H, layer.I
            q = layer._c.quant
            keep = layer
        else:
            fmt = self.spec(format, "format")
            ts = tensors if isinstance(tensors, TensorSet) else \
                TensorSet(self, tensors)
            src, keep = ts.ptr, ts
            q = _quant_struct(quant)
        out = TensorSet(self)
        call("wna16_repack_layer", self.ptr, fmt, src, cstr(prefix), E, H, I,
             ctypes.byref(q), self.spec(backend, "backend"), _target(target),
             out.ptr)
        del keep
        return out

    def repack_checkpoint(self, checkpoint, out_path, backend, target="cpu",
                          format=None, bits=0, group_size=0, zero_point=None,
                          act_order=None, hidden=0, intermediate=0,
                          experts=0, all_tensors=False, input_dtype="16bit",
                          layer=None, progress=None, dtype="auto",
                          max_shard_size=0):
        """Repacks a whole checkpoint into one .safetensors file, or a
        checkpoint directory when out_path ends in '/' or names one (shards
        of at most max_shard_size bytes, 0: 5GB; the index; config.json),
        streaming layer by layer; returns the summary as a dict. `dtype`:
        the model's (vLLM's --dtype: "auto", "float16", "bfloat16"), which
        scales and biases are cast to. `progress`: a callable(layer,
        n_layers, name, done, bytes_written, bytes_total)."""
        o = _lib.RepackOptions()
        o.backend = cstr(backend)
        o.target = _target(target)
        o.format = cstr(format)
        o.bits, o.group_size = bits, group_size
        if zero_point is not None:
            o.zero_point_set, o.zero_point = True, zero_point
        if act_order is not None:
            o.act_order_set, o.act_order = True, act_order
        o.hidden, o.intermediate, o.experts = hidden, intermediate, experts
        o.all_tensors = all_tensors
        o.input_dtype = _lib.INPUT_DTYPE[input_dtype]
        o.layer = cstr(layer)
        model_dtypes = {"auto": 0, None: 0, "float16": _lib.DTYPE["F16"],
                        "bfloat16": _lib.DTYPE["BF16"],
                        "F16": _lib.DTYPE["F16"], "BF16": _lib.DTYPE["BF16"]}
        if dtype not in model_dtypes:
            raise ValueError("dtype %r: auto, float16 or bfloat16" % (dtype,))
        o.dtype = model_dtypes[dtype]
        o.max_shard_size = max_shard_size
        if progress is not None:
            class Progress(ctypes.Structure):
                _fields_ = [("layer", ctypes.c_size_t),
                            ("n_layers", ctypes.c_size_t),
                            ("name", ctypes.c_char_p),
                            ("done", ctypes.c_bool),
                            ("bytes_written", ctypes.c_uint64),
                            ("bytes_total", ctypes.c_uint64)]

            def cb(user, p):
                try:
                    x = ctypes.cast(p, ctypes.POINTER(Progress)).contents
                    progress(x.layer, x.n_layers, pystr(x.name), x.done,
                             x.bytes_written, x.bytes_total)
                except Exception:
                    pass
            o.progress = _lib.PROGRESS_FN(cb)
        s = _lib.RepackSummary()
        call("wna16_repack_checkpoint", self.ptr, cstr(str(checkpoint)),
             cstr(str(out_path)), ctypes.byref(o), ctypes.byref(s))
        name = _lib.lib.wna16_spec_name
        return {"format": pystr(name(s.format)),
                "backend": pystr(name(s.backend)), "quant": _quant(s.quant),
                "E": s.E, "H": s.H, "I": s.I, "IP": s.IP,
                "layers": s.n_layers, "tensors": s.n_tensors,
                "copied": s.n_copied, "bytes": s.bytes,
                "target": {v: k for k, v in _lib.TARGET.items()}[s.target],
                "dtype": _lib.DTYPES[s.model_dtype - 1]
                if s.model_dtype else None,
                "dtype_reason": pystr(s.model_dtype_reason),
                "shards": s.n_shards}

    # ---- the fused MoE ----
    def moe_layer(self, backend, tensors, prefix, E, H, I, quant,
                  target="cpu"):
        """The generated fused MoE over a layer stored in `backend`'s layout
        (what repack_layer returns, or a dict name -> array)."""
        return MoeLayer(self, backend, tensors, prefix, E, H, I, quant,
                        target)

    def cuda_moe(self, backend, tensors, prefix, E, H, I, quant):
        """The CUDA tensor-core fused MoE (Marlin layouts). Arrays on the GPU
        (torch CUDA tensors) are used in place; host arrays are copied."""
        return CudaMoe(self, backend, tensors, prefix, E, H, I, quant)


class Selection:
    """What select() chose: backend and format names, the format's
    fallback note, is_k_full and every backend passed over with why."""

    def __init__(self, r):
        name = _lib.lib.wna16_spec_name
        self.backend = pystr(name(r.backend)) if r.backend else None
        self.format = pystr(name(r.format)) if r.format else None
        self.note = pystr(r.note)
        self.is_k_full = bool(r.is_k_full)
        self.passed_over = [
            (pystr(name(r.passed_over[i].backend)),
             pystr(r.passed_over[i].reason))
            for i in range(min(r.n_passed_over, _lib.SELECT_MAX_REASONS))]

    def __repr__(self):
        return f"Selection(backend={self.backend!r}, format={self.format!r})"


class TensorSet:
    """A wna16_tensor_set_t: named tensors, either views of the caller's
    arrays (kept alive by the set) or the library's own (repack results).
    Mapping-like: names(), set[name] -> numpy array over the memory (no
    copy; valid while the set lives), len(), `in`."""

    def __init__(self, ctx, arrays=None, dtypes=None):
        self.ctx = ctx
        self._keep = []
        self._ptr = None
        ptr = ctypes.c_void_p()
        call("wna16_tensor_set_create", ctx.ptr, ctypes.byref(ptr))
        self._ptr = ptr
        ctx._register(self)
        for name, arr in (arrays or {}).items():
            self.add(name, arr, (dtypes or {}).get(name))

    @property
    def ptr(self):
        if not self._ptr:
            raise ValueError("the tensor set is closed")
        return self._ptr

    def add(self, name, array, dtype=None):
        """Adds a view of `array` (no copy; the set keeps it alive)."""
        v = _tensor.view(array, name, dtype)
        if v.device != "cpu":
            raise ValueError(f"{name}: a {v.device} array; a tensor set "
                             "holds host memory (CudaMoe takes GPU arrays)")
        t = v.tensor(name)
        self._keep.append((v, t))
        call("wna16_tensor_set_add_view", self.ptr, ctypes.byref(t))

    def names(self):
        return [pystr(_lib.lib.wna16_tensor_set_at(self.ptr, i).contents.name)
                for i in range(len(self))]

    def __len__(self):
        return _lib.lib.wna16_tensor_set_count(self.ptr)

    def __contains__(self, name):
        return bool(_lib.lib.wna16_tensor_set_find(self.ptr, cstr(name)))

    def __getitem__(self, name):
        t = _lib.lib.wna16_tensor_set_find(self.ptr, cstr(name))
        if not t:
            raise KeyError(name)
        return _tensor.numpy_of(t.contents, self)

    def dtype(self, name):
        t = _lib.lib.wna16_tensor_set_find(self.ptr, cstr(name))
        if not t:
            raise KeyError(name)
        return _lib.DTYPES[t.contents.dtype - 1]

    def close(self):
        if self._ptr:
            _lib.lib.wna16_tensor_set_destroy(self._ptr)
            self._ptr = None
        self._keep = []

    def __del__(self):
        self.close()


class Checkpoint:
    """An open checkpoint: config (a dict of config.json's fields),
    names(), tensor(name) -> read-only numpy view of the mapped file,
    moe_layers() -> prefixes, layer(prefix) -> Layer."""

    def __init__(self, ctx, path):
        self.ctx = ctx
        self._ptr = None
        ptr = ctypes.c_void_p()
        call("wna16_checkpoint_open", ctx.ptr, cstr(str(path)),
             ctypes.byref(ptr))
        self._ptr = ptr
        ctx._register(self)
        self.path = str(path)
        c = _lib.lib.wna16_checkpoint_config(ptr)
        self._cfg = c.contents if c else None

    @property
    def ptr(self):
        if not self._ptr:
            raise ValueError("the checkpoint is closed")
        return self._ptr

    @property
    def config(self):
        if self._cfg is None:
            return None
        c = self._cfg
        return {k: (pystr(getattr(c, k)) if isinstance(getattr(c, k), bytes)
                    else getattr(c, k)) for k, _ in c._fields_}

    @property
    def format(self):
        """The format spec config.json names ("gptq", "awq"...)."""
        return self.config["format_name"] if self._cfg else None

    def names(self):
        n = _lib.lib.wna16_checkpoint_tensor_count(self.ptr)
        return [pystr(_lib.lib.wna16_checkpoint_tensor_at(self.ptr, i)
                      .contents.name) for i in range(n)]

    def tensor(self, name):
        t = _lib.lib.wna16_checkpoint_find(self.ptr, cstr(name))
        if not t:
            raise KeyError(name)
        return _tensor.numpy_of(t.contents, self, readonly=True)

    def moe_layers(self, format=None):
        fmt = self.ctx.spec(format or self.format, "format")
        ls = _lib.MoeLayers()
        call("wna16_checkpoint_moe_layers", self.ctx.ptr, self.ptr, fmt,
             ctypes.byref(ls))
        try:
            return [pystr(ls.prefixes[i]) for i in range(ls.count)]
        finally:
            _lib.lib.wna16_moe_layers_free(ctypes.byref(ls))

    def layer(self, prefix, format=None):
        return Layer(self, prefix, format)

    def close(self):
        if self._ptr:
            _lib.lib.wna16_checkpoint_close(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()


class Layer:
    """One MoE layer of a checkpoint (wna16_checkpoint_layer_open): prefix,
    format, E, H, I, topk, act_dtype ("F16"/"BF16"), quant (a dict, bias
    included, from the config and the tensors), tensors (names)."""

    def __init__(self, ck, prefix, format=None):
        self.checkpoint = ck
        self._c = _lib.CheckpointLayer()
        fmt = ck.ctx.spec(format, "format") if format else None
        call("wna16_checkpoint_layer_open", ck.ctx.ptr, ck.ptr, None, fmt,
             cstr(prefix), ctypes.byref(self._c))
        ck.ctx._register(self)
        c = self._c
        self.prefix = pystr(c.prefix)
        self.format = pystr(_lib.lib.wna16_spec_name(c.format))
        self.E, self.H, self.I, self.topk = c.E, c.H, c.I, c.topk
        self.act_dtype = _lib.DTYPES[c.act_dtype - 1]
        self.quant = _quant(c.quant)

    def names(self):
        n = _lib.lib.wna16_tensor_set_count(self._c.tensors)
        return [pystr(_lib.lib.wna16_tensor_set_at(self._c.tensors, i)
                      .contents.name) for i in range(n)]

    def close(self):
        if getattr(self, "_c", None) is not None and self._c.tensors:
            _lib.lib.wna16_checkpoint_layer_close(ctypes.byref(self._c))

    def __del__(self):
        self.close()


# ---- the fused MoE -------------------------------------------------------------

def moe_params(act_dtype, activation="silu", expert_map=None,
               global_num_experts=0, apply_router_weight_on_input=False,
               swiglu_limit=None, swiglu_alpha=None, swiglu_beta=None,
               round_gemm_outputs=False):
    """A wna16_moe_params_t (and the expert map's view, to keep alive)."""
    p = _lib.MoeParams()
    _lib.lib.wna16_moe_params_init(ctypes.byref(p))
    act = _lib.lib.wna16_activation_from_name(cstr(activation))
    if act < 0:
        raise ValueError(f"activation '{activation}': unknown")
    p.activation = act
    if swiglu_limit is not None:
        p.swiglu_limit = swiglu_limit
    if swiglu_alpha is not None:
        p.swiglu_alpha = swiglu_alpha
    if swiglu_beta is not None:
        p.swiglu_beta = swiglu_beta
    p.apply_router_weight_on_input = apply_router_weight_on_input
    p.act_dtype = _lib.DTYPE[act_dtype]
    p.round_gemm_outputs = round_gemm_outputs
    keep = None
    if expert_map is not None:
        if _tensor.is_torch(expert_map) and expert_map.is_cuda:
            expert_map = expert_map.cpu()  # the C API reads a host array
        keep = _tensor.view(expert_map, "expert_map", "I32")
        p.expert_map = keep.ptr
        p.global_num_experts = global_num_experts or keep.numel
        if p.global_num_experts != keep.numel:
            raise ValueError(f"global_num_experts {global_num_experts} but "
                             f"expert_map has {keep.numel} entries")
    else:
        p.global_num_experts = global_num_experts if global_num_experts > 0 \
            else 0
    return p, keep


def _act_dtype(v, dtype):
    if dtype is not None:
        return dtype
    if v.dtype in ("F16", "BF16"):
        return v.dtype
    raise ValueError(f"hidden_states: dtype {v.dtype}; pass act_dtype "
                     "'F16' or 'BF16' (numpy has no bfloat16: uint16 bits)")


class _Moe:
    """What the CPU and CUDA layers share: argument checks and outputs."""

    def _inputs(self, hidden, topk_ids, topk_weights, act_dtype, out):
        h = _tensor.view(hidden, "hidden_states", act_dtype)
        dt = _act_dtype(h, act_dtype)
        if len(h.shape) != 2 or h.shape[1] != self.H:
            raise ValueError(f"hidden_states: shape {h.shape}, expected "
                             f"[M, {self.H}]")
        ids = _tensor.view(topk_ids, "topk_ids", None)
        if ids.dtype != "I32":
            raise ValueError(f"topk_ids: dtype {ids.dtype}, expected int32")
        w = _tensor.view(topk_weights, "topk_weights", None)
        if w.dtype != "F32":
            raise ValueError(f"topk_weights: dtype {w.dtype}, expected "
                             "float32")
        M = h.shape[0]
        if len(ids.shape) != 2 or ids.shape[0] != M or \
                tuple(w.shape) != tuple(ids.shape):
            raise ValueError(f"topk_ids {ids.shape} and topk_weights "
                             f"{w.shape}: expected [{M}, topk] each")
        if out is None:
            out = _tensor.empty_like_kind(hidden, (M, self.H), dt)
        o = _tensor.view(out, "out", dt)
        if tuple(o.shape) != (M, self.H):
            raise ValueError(f"out: shape {o.shape}, expected [{M}, "
                             f"{self.H}]")
        return h, ids, w, o, out, dt

    def _batched_inputs(self, hidden, expert_num_tokens, weights, act_dtype,
                        out):
        h = _tensor.view(hidden, "hidden_states", act_dtype)
        dt = _act_dtype(h, act_dtype)
        if len(h.shape) != 3 or h.shape[0] != self.E or h.shape[2] != self.H:
            raise ValueError(f"hidden_states: shape {h.shape}, expected "
                             f"[{self.E}, max_tokens, {self.H}]")
        n = _tensor.view(expert_num_tokens, "expert_num_tokens", None)
        if n.dtype != "I32" or tuple(n.shape) != (self.E,):
            raise ValueError(f"expert_num_tokens: {n.dtype} {n.shape}, "
                             f"expected int32 [{self.E}]")
        w = None
        if weights is not None:
            w = _tensor.view(weights, "weights", None)
            if w.dtype != "F32" or tuple(w.shape) != tuple(h.shape[:2]):
                raise ValueError(f"weights: {w.dtype} {w.shape}, expected "
                                 f"float32 {tuple(h.shape[:2])}")
        if out is None:
            out = _tensor.empty_like_kind(hidden, h.shape, dt)
        o = _tensor.view(out, "out", dt)
        if tuple(o.shape) != tuple(h.shape):
            raise ValueError(f"out: shape {o.shape}, expected {h.shape}")
        return h, n, w, o, out, dt


class MoeLayer(_Moe):
    """The generated fused MoE on the CPU (wna16_moe_layer_t). run() and
    run_batched() take numpy arrays or CPU torch tensors (or any array
    _tensor.view accepts) and write `out` (allocated like `hidden` when
    None). Runs on one layer are serialized by the library; it may be
    shared by threads."""

    def __init__(self, ctx, backend, tensors, prefix, E, H, I, quant,
                 target="cpu"):
        self._ptr = None
        self.ctx, self.E, self.H, self.I = ctx, E, H, I
        self.tensors = tensors if isinstance(tensors, TensorSet) else \
            TensorSet(ctx, tensors)
        self._q = _quant_struct(quant)
        ptr = ctypes.c_void_p()
        call("wna16_moe_layer_create", ctx.ptr, ctx.spec(backend, "backend"),
             self.tensors.ptr, cstr(prefix), E, H, I, ctypes.byref(self._q),
             _target(target), ctypes.byref(ptr))
        self._ptr = ptr
        ctx._register(self)

    @property
    def numerics(self):
        """The numeric contract the layer's kernels compute, fixed at
        creation (wna16_moe_layer_numerics): "int8-dynamic" (vLLM's CPU
        int4 MoE: activations quantized per token to 8 bits), "bf16-exact"
        (as Marlin computes; $WNA16_NUMERICS=bf16-exact asks for it) or
        "f32" (the portable kernels)."""
        return pystr(_lib.lib.wna16_numerics_name(
            _lib.lib.wna16_moe_layer_numerics(self._ptr)))

    def run(self, hidden, topk_ids, topk_weights, activation="silu",
            expert_map=None, global_num_experts=0,
            apply_router_weight_on_input=False, out=None, act_dtype=None,
            **params):
        """wna16_moe_layer_run: hidden [M, H] F16/BF16, topk_ids [M, k]
        int32 (global ids with an expert_map [global_num_experts] int32),
        topk_weights [M, k] float32. **params: swiglu_limit,
        swiglu_alpha, swiglu_beta, round_gemm_outputs. Returns out."""
        h, ids, w, o, out, dt = self._inputs(hidden, topk_ids, topk_weights,
                                             act_dtype, out)
        for v in (h, ids, w, o):
            if v.device != "cpu":
                raise ValueError("MoeLayer runs on host arrays; use CudaMoe "
                                 "for GPU tensors")
        p, keep = moe_params(dt, activation, expert_map, global_num_experts,
                             apply_router_weight_on_input, **params)
        call("wna16_moe_layer_run", self._ptr, ctypes.byref(p), h.ptr,
             h.shape[0], ids.ptr, w.ptr, ids.shape[1], o.ptr)
        del keep
        return out

    def run_batched(self, hidden, expert_num_tokens, weights=None,
                    activation="silu", apply_router_weight_on_input=False,
                    out=None, act_dtype=None, **params):
        """wna16_moe_layer_run_batched: hidden [E, max_tokens, H],
        expert_num_tokens [E] int32, weights [E, max_tokens] float32 or
        None. Returns out [E, max_tokens, H]."""
        h, n, w, o, out, dt = self._batched_inputs(hidden, expert_num_tokens,
                                                   weights, act_dtype, out)
        p, _ = moe_params(dt, activation, None, 0,
                          apply_router_weight_on_input, **params)
        call("wna16_moe_layer_run_batched", self._ptr, ctypes.byref(p),
             h.ptr, h.shape[1], n.ptr, w.ptr if w else None, o.ptr)
        return out

    def close(self):
        if getattr(self, "_ptr", None):
            _lib.lib.wna16_moe_layer_destroy(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()


class CudaMoe(_Moe):
    """The CUDA fused MoE (wna16_cuda_moe_t). With torch CUDA tensors,
    run() queues the kernels on the caller's current torch stream (no
    wait; sync() reports bad device data); with host arrays it copies in
    and out and waits. One run at a time per object: the object takes a
    lock, so threads may share it (runs are serialized)."""

    def __init__(self, ctx, backend, tensors, prefix, E, H, I, quant):
        self._ptr = None
        self.ctx, self.E, self.H, self.I = ctx, E, H, I
        self._q = _quant_struct(quant)
        self._lock = threading.Lock()
        on_gpu = isinstance(tensors, dict) and any(
            _tensor.is_torch(a) and a.is_cuda for a in tensors.values())
        if on_gpu:
            # device addresses in a set of views: the C API reads them as
            # CUDA addresses when device_tensors is true
            self.tensors = TensorSet(ctx)
            for name, a in tensors.items():
                v = _tensor.view(a, name)
                if v.device != "cuda":
                    raise ValueError(f"{name}: every tensor on the GPU, or "
                                     "none")
                t = v.tensor(name)
                self.tensors._keep.append((v, t))
                call("wna16_tensor_set_add_view", self.tensors.ptr,
                     ctypes.byref(t))
        else:
            self.tensors = tensors if isinstance(tensors, TensorSet) else \
                TensorSet(ctx, tensors)
        ptr = ctypes.c_void_p()
        call("wna16_cuda_moe_create", ctx.ptr, ctx.spec(backend, "backend"),
             self.tensors.ptr, cstr(prefix), E, H, I, ctypes.byref(self._q),
             on_gpu, ctypes.byref(ptr))
        self._ptr = ptr
        ctx._register(self)

    @staticmethod
    def _stream(stream):
        """`stream` (a torch.cuda.Stream or a CUstream handle), else torch's
        current stream when the caller uses torch, else the default
        stream (NULL)."""
        if stream is not None:
            return ctypes.c_void_p(getattr(stream, "cuda_stream", stream))
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        return ctypes.c_void_p(None)

    def run(self, hidden, topk_ids, topk_weights, activation="silu",
            expert_map=None, global_num_experts=0,
            apply_router_weight_on_input=False, out=None, act_dtype=None,
            stream=None, **params):
        h, ids, w, o, out, dt = self._inputs(hidden, topk_ids, topk_weights,
                                             act_dtype, out)
        p, keep = moe_params(dt, activation, expert_map, global_num_experts,
                             apply_router_weight_on_input, **params)
        devs = {v.device for v in (h, ids, w, o)}
        with self._lock:
            if devs == {"cuda"}:
                call("wna16_cuda_moe_run_device", self._ptr, ctypes.byref(p),
                     h.ptr, h.shape[0], ids.ptr, w.ptr, ids.shape[1], o.ptr,
                     self._stream(stream))
            elif devs == {"cpu"}:
                call("wna16_cuda_moe_run", self._ptr, ctypes.byref(p), h.ptr,
                     h.shape[0], ids.ptr, w.ptr, ids.shape[1], o.ptr)
            else:
                raise ValueError("hidden_states, topk_ids, topk_weights and "
                                 "out: all on the GPU or all on the host")
        del keep
        return out

    def run_batched(self, hidden, expert_num_tokens, weights=None,
                    activation="silu", apply_router_weight_on_input=False,
                    out=None, act_dtype=None, stream=None, **params):
        h, n, w, o, out, dt = self._batched_inputs(hidden, expert_num_tokens,
                                                   weights, act_dtype, out)
        p, _ = moe_params(dt, activation, None, 0,
                          apply_router_weight_on_input, **params)
        devs = {v.device for v in (h, n, o) + ((w,) if w else ())}
        with self._lock:
            if devs == {"cuda"}:
                call("wna16_cuda_moe_run_batched_device", self._ptr,
                     ctypes.byref(p), h.ptr, h.shape[1], n.ptr,
                     w.ptr if w else 0, o.ptr, self._stream(stream))
            elif devs == {"cpu"}:
                call("wna16_cuda_moe_run_batched", self._ptr, ctypes.byref(p),
                     h.ptr, h.shape[1], n.ptr, w.ptr if w else None, o.ptr)
            else:
                raise ValueError("all arrays on the GPU or all on the host")
        return out

    def sync(self, stream=None):
        """Waits for the stream; raises Error naming bad device data (an
        expert id out of range...) seen since the last sync."""
        with self._lock:
            call("wna16_cuda_moe_sync", self._ptr, self._stream(stream))

    def close(self):
        if getattr(self, "_ptr", None):
            _lib.lib.wna16_cuda_moe_destroy(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()
