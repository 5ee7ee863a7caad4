"""_lib.py - libwna16.so loaded with ctypes, the C structs of include/wna16.h
mirrored field by field (tests/python/test_abi.py compiles a C program that
prints every size and offset and compares), the function signatures, and
the error check that turns a status into wna16.Error.

Where the library comes from, first found wins:
  1. $WNA16_LIBRARY: a path to libwna16.so (or .so.0);
  2. next to the package: wna16/libwna16.so.0 (a copy), the install tree
     (<prefix>/share/wna16/python/wna16 -> <prefix>/lib*/libwna16.so.0) or
     a source checkout (<repo>/python/wna16 -> <repo>/build/libwna16.so.0);
  3. the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache):
     "libwna16.so.0".
"""
import ctypes
import ctypes.util
import glob
import os

MAX_DIMS = 8
ERROR_MESSAGE_MAX = 1024
TENSOR_NAME_MAX = 512
SELECT_MAX_REASONS = 16
SELECT_REASON_MAX = 256

# enums (values are the ABI; the names are wna16.h's)
STATUS = {0: "OK", -1: "EINVAL", -2: "ENOMEM", -3: "EIO", -4: "EFORMAT",
          -5: "ESPEC", -6: "EUNSUPPORTED", -7: "ENOTFOUND",
          -8: "EUNAVAILABLE", -9: "ELIMIT", -10: "EMISMATCH",
          -11: "EINTERNAL"}
DTYPES = ["F16", "BF16", "F32", "I32", "U8", "I8", "I16", "I64", "BOOL",
          "U16", "U32", "U64", "F64", "C64", "F8_E4M3", "F8_E5M2",
          "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4"]
DTYPE = {name: i + 1 for i, name in enumerate(DTYPES)}  # 0 = invalid
PLATFORM = {"cuda": 0, "rocm": 1, "cpu": 2, "xpu": 3}
TARGET = {"reference": 0, "cpu": 1, "cuda": 2, "xpu": 3, "ocl": 4}
SPEC_FORMAT, SPEC_BACKEND = 1, 2
INPUT_DTYPE = {"16bit": 0, "int8": 1, "fp8": 2}
ACT_FORMAT = {"standard": 0, "batched": 1}
LOG_LEVEL = {"debug": 0, "info": 1, "warn": 2, "error": 3}


class Error(Exception):
    """A wna16 library error: `status` (negative code), `name` ("EINVAL"...)
    and the library's message, which names the offending argument."""

    def __init__(self, status, message):
        self.status = status
        self.name = STATUS.get(status, "unknown")
        self.message = message
        super().__init__(f"{self.name}: {message}")


# ---- structs --------------------------------------------------------------------

class ErrorT(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int),
                ("message", ctypes.c_char * ERROR_MESSAGE_MAX)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                          ctypes.c_char_p)


class ContextOptions(ctypes.Structure):
    _fields_ = [("allocator", ctypes.c_void_p),
                ("log", LOG_FN),
                ("log_user", ctypes.c_void_p),
                ("log_level", ctypes.c_int),
                ("log_level_set", ctypes.c_bool),
                ("spec_dir", ctypes.c_char_p),
                ("no_builtin_specs", ctypes.c_bool),
                ("cpu_threads", ctypes.c_int32),
                ("cache_dir", ctypes.c_char_p),
                ("cache_max_bytes", ctypes.c_uint64),
                ("no_jit", ctypes.c_bool)]


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p),
                ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS),
                ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t)]


class QuantDesc(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_int32),
                ("group_size", ctypes.c_int32),
                ("zero_point", ctypes.c_bool),
                ("act_order", ctypes.c_bool),
                ("bias", ctypes.c_bool),
                ("zeros_stored", ctypes.c_bool),
                ("g_idx_stored", ctypes.c_bool),
                ("input_dtype", ctypes.c_int),
                ("model_dtype", ctypes.c_int)]


class ModelConfig(ctypes.Structure):
    _fields_ = [("model_type", ctypes.c_char * 64),
                ("hidden_size", ctypes.c_int32),
                ("moe_intermediate_size", ctypes.c_int32),
                ("num_experts", ctypes.c_int32),
                ("num_experts_per_tok", ctypes.c_int32),
                ("num_hidden_layers", ctypes.c_int32),
                ("torch_dtype", ctypes.c_char * 16),
                ("quant_method", ctypes.c_char * 32),
                ("bits", ctypes.c_int32),
                ("group_size", ctypes.c_int32),
                ("has_sym", ctypes.c_bool),
                ("sym", ctypes.c_bool),
                ("desc_act", ctypes.c_bool),
                ("has_zero_point", ctypes.c_bool),
                ("zero_point", ctypes.c_bool),
                ("actorder", ctypes.c_char * 16),
                ("format_name", ctypes.c_char * 32),
                ("version", ctypes.c_char * 16),
                ("linear_quant_method", ctypes.c_char * 16)]


class SelectQuery(ctypes.Structure):
    _fields_ = [("platform", ctypes.c_int),
                ("cc_major", ctypes.c_int32),
                ("cc_minor", ctypes.c_int32),
                ("format", ctypes.c_char_p),
                ("quant", QuantDesc),
                ("actorder", ctypes.c_char_p),
                ("hidden_size", ctypes.c_int32),
                ("intermediate_size", ctypes.c_int32),
                ("num_experts", ctypes.c_int32),
                ("top_k", ctypes.c_int32),
                ("intermediate_size_full", ctypes.c_int32),
                ("activation_format", ctypes.c_int),
                ("activation", ctypes.c_char_p),
                ("backend", ctypes.c_char_p),
                ("kernel_platforms", ctypes.c_uint32)]


class PassedOver(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_void_p),
                ("reason", ctypes.c_char * SELECT_REASON_MAX)]


class SelectResult(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_void_p),
                ("format", ctypes.c_void_p),
                ("note", ctypes.c_char * SELECT_REASON_MAX),
                ("is_k_full", ctypes.c_bool),
                ("n_passed_over", ctypes.c_size_t),
                ("passed_over", PassedOver * SELECT_MAX_REASONS)]


class MoeLayers(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t),
                ("prefixes", ctypes.POINTER(ctypes.c_char_p)),
                ("ctx_", ctypes.c_void_p),
                ("cap_", ctypes.c_size_t)]


class CheckpointLayer(ctypes.Structure):
    _fields_ = [("format", ctypes.c_void_p),
                ("prefix", ctypes.c_char * TENSOR_NAME_MAX),
                ("E", ctypes.c_int32), ("H", ctypes.c_int32),
                ("I", ctypes.c_int32), ("topk", ctypes.c_int32),
                ("act_dtype", ctypes.c_int),
                ("quant", QuantDesc),
                ("tensors", ctypes.c_void_p)]


class MoeParams(ctypes.Structure):
    _fields_ = [("activation", ctypes.c_int),
                ("swiglu_limit", ctypes.c_float),
                ("swiglu_alpha", ctypes.c_float),
                ("swiglu_beta", ctypes.c_float),
                ("apply_router_weight_on_input", ctypes.c_bool),
                ("expert_map", ctypes.c_void_p),
                ("global_num_experts", ctypes.c_int32),
                ("act_dtype", ctypes.c_int),
                ("round_gemm_outputs", ctypes.c_bool)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class RepackOptions(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_char_p),
                ("target", ctypes.c_int),
                ("format", ctypes.c_char_p),
                ("bits", ctypes.c_int32),
                ("group_size", ctypes.c_int32),
                ("zero_point_set", ctypes.c_bool),
                ("zero_point", ctypes.c_bool),
                ("act_order_set", ctypes.c_bool),
                ("act_order", ctypes.c_bool),
                ("hidden", ctypes.c_int32),
                ("intermediate", ctypes.c_int32),
                ("experts", ctypes.c_int32),
                ("all_tensors", ctypes.c_bool),
                ("input_dtype", ctypes.c_int),
                ("layer", ctypes.c_char_p),
                ("progress", PROGRESS_FN),
                ("progress_user", ctypes.c_void_p),
                ("dtype", ctypes.c_int),
                ("max_shard_size", ctypes.c_uint64)]


class RepackSummary(ctypes.Structure):
    _fields_ = [("format", ctypes.c_void_p),
                ("backend", ctypes.c_void_p),
                ("quant", QuantDesc),
                ("E", ctypes.c_int32), ("H", ctypes.c_int32),
                ("I", ctypes.c_int32), ("IP", ctypes.c_int32),
                ("n_layers", ctypes.c_size_t),
                ("n_tensors", ctypes.c_size_t),
                ("n_copied", ctypes.c_size_t),
                ("bytes", ctypes.c_uint64),
                ("target", ctypes.c_int),
                ("model_dtype", ctypes.c_int),
                ("model_dtype_reason", ctypes.c_char * 256),
                ("n_shards", ctypes.c_size_t)]


class DeviceInfo(ctypes.Structure):
    _fields_ = [("platform", ctypes.c_int),
                ("cc_major", ctypes.c_int32),
                ("cc_minor", ctypes.c_int32),
                ("name", ctypes.c_char * 128),
                ("notes", ctypes.c_char * 512)]


class CacheInfo(ctypes.Structure):
    _fields_ = [("dir", ctypes.c_char * 4096),
                ("disk_readable", ctypes.c_bool),
                ("disk_writable", ctypes.c_bool),
                ("max_bytes", ctypes.c_uint64),
                ("files", ctypes.c_size_t),
                ("bytes", ctypes.c_uint64),
                ("entries", ctypes.c_size_t),
                ("memory_hits", ctypes.c_uint64),
                ("disk_hits", ctypes.c_uint64),
                ("compiles", ctypes.c_uint64),
                ("disk_writes", ctypes.c_uint64),
                ("corrupt", ctypes.c_uint64),
                ("untrusted", ctypes.c_uint64),
                ("evictions", ctypes.c_uint64),
                ("errors", ctypes.c_uint64)]


# the structs tests/python/test_abi.py checks against the C compiler
ABI_STRUCTS = {
    "wna16_error_t": ErrorT, "wna16_context_options_t": ContextOptions,
    "wna16_tensor_t": Tensor, "wna16_quant_desc_t": QuantDesc,
    "wna16_model_config_t": ModelConfig,
    "wna16_select_query_t": SelectQuery,
    "wna16_select_result_t": SelectResult,
    "wna16_moe_layers_t": MoeLayers,
    "wna16_checkpoint_layer_t": CheckpointLayer,
    "wna16_moe_params_t": MoeParams,
    "wna16_repack_options_t": RepackOptions,
    "wna16_repack_summary_t": RepackSummary,
    "wna16_device_info_t": DeviceInfo,
    "wna16_cache_info_t": CacheInfo,
}

# ---- the library ------------------------------------------------------------------

_here = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("WNA16_LIBRARY")
    if env:
        return [env]  # named explicitly: no other is tried
    out = [os.path.join(_here, "libwna16.so.0")]
    prefix = os.path.normpath(os.path.join(_here, "..", "..", "..", ".."))
    for libdir in ("lib", "lib64", "lib/*"):
        out += sorted(glob.glob(os.path.join(prefix, libdir,
                                             "libwna16.so.0")))
    repo = os.path.normpath(os.path.join(_here, "..", ".."))
    out += [os.path.join(repo, "build", "libwna16.so.0")]
    return [p for p in out if os.path.exists(p)] + ["libwna16.so.0"]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("wna16: cannot load libwna16.so (set WNA16_LIBRARY to "
                      "its path): " + "; ".join(errors))


lib, library_path = _load()

_c = ctypes
_p = ctypes.c_void_p
_err = ctypes.POINTER(ErrorT)
_i32 = ctypes.c_int32
_SIGS = {
    "wna16_version": (_c.c_char_p, []),
    "wna16_status_name": (_c.c_char_p, [_c.c_int]),
    "wna16_context_create": (_c.c_int, [_c.POINTER(ContextOptions),
                                        _c.POINTER(_p), _err]),
    "wna16_context_destroy": (None, [_p]),
    "wna16_context_add_pack": (_c.c_int, [_p, _c.c_char_p, _err]),
    "wna16_cache_info": (_c.c_int, [_p, _c.POINTER(CacheInfo), _err]),
    "wna16_cache_clear": (_c.c_int, [_p, _c.POINTER(_c.c_size_t), _err]),
    "wna16_spec_count": (_c.c_size_t, [_p]),
    "wna16_spec_at": (_p, [_p, _c.c_size_t]),
    "wna16_spec_find": (_p, [_p, _c.c_int, _c.c_char_p]),
    "wna16_spec_kind": (_c.c_int, [_p]),
    "wna16_spec_name": (_c.c_char_p, [_p]),
    "wna16_spec_title": (_c.c_char_p, [_p]),
    "wna16_spec_load_file": (_c.c_int, [_p, _c.c_char_p, _c.POINTER(_p),
                                        _err]),
    "wna16_tensor_set_create": (_c.c_int, [_p, _c.POINTER(_p), _err]),
    "wna16_tensor_set_destroy": (None, [_p]),
    "wna16_tensor_set_add_view": (_c.c_int, [_p, _c.POINTER(Tensor), _err]),
    "wna16_tensor_set_find": (_c.POINTER(Tensor), [_p, _c.c_char_p]),
    "wna16_tensor_set_count": (_c.c_size_t, [_p]),
    "wna16_tensor_set_at": (_c.POINTER(Tensor), [_p, _c.c_size_t]),
    "wna16_checkpoint_open": (_c.c_int, [_p, _c.c_char_p, _c.POINTER(_p),
                                         _err]),
    "wna16_checkpoint_close": (None, [_p]),
    "wna16_checkpoint_config": (_c.POINTER(ModelConfig), [_p]),
    "wna16_checkpoint_tensor_count": (_c.c_size_t, [_p]),
    "wna16_checkpoint_tensor_at": (_c.POINTER(Tensor), [_p, _c.c_size_t]),
    "wna16_checkpoint_find": (_c.POINTER(Tensor), [_p, _c.c_char_p]),
    "wna16_model_config_quant": (_c.c_int, [_c.POINTER(ModelConfig),
                                            _c.POINTER(QuantDesc), _err]),
    "wna16_checkpoint_moe_layers": (_c.c_int, [_p, _p, _p,
                                               _c.POINTER(MoeLayers), _err]),
    "wna16_moe_layers_free": (None, [_c.POINTER(MoeLayers)]),
    "wna16_checkpoint_layer_open": (_c.c_int, [
        _p, _p, _c.POINTER(ModelConfig), _p, _c.c_char_p,
        _c.POINTER(CheckpointLayer), _err]),
    "wna16_checkpoint_layer_close": (None, [_c.POINTER(CheckpointLayer)]),
    "wna16_select": (_c.c_int, [_p, _c.POINTER(SelectQuery),
                                _c.POINTER(SelectResult), _err]),
    "wna16_build_kernel_platforms": (_c.c_uint32, []),
    "wna16_repack_layer": (_c.c_int, [_p, _p, _p, _c.c_char_p, _i32, _i32,
                                      _i32, _c.POINTER(QuantDesc), _p,
                                      _c.c_int, _p, _err]),
    "wna16_repack_checkpoint": (_c.c_int, [_p, _c.c_char_p, _c.c_char_p,
                                           _c.POINTER(RepackOptions),
                                           _c.POINTER(RepackSummary), _err]),
    "wna16_activation_from_name": (_c.c_int, [_c.c_char_p]),
    "wna16_moe_params_init": (None, [_c.POINTER(MoeParams)]),
    "wna16_moe_layer_create": (_c.c_int, [_p, _p, _p, _c.c_char_p, _i32,
                                          _i32, _i32, _c.POINTER(QuantDesc),
                                          _c.c_int, _c.POINTER(_p), _err]),
    "wna16_moe_layer_destroy": (None, [_p]),
    "wna16_moe_layer_numerics": (_c.c_int, [_p]),
    "wna16_numerics_name": (_c.c_char_p, [_c.c_int]),
    "wna16_moe_layer_run": (_c.c_int, [_p, _c.POINTER(MoeParams), _p, _i32,
                                       _p, _p, _i32, _p, _err]),
    "wna16_moe_layer_run_batched": (_c.c_int, [_p, _c.POINTER(MoeParams), _p,
                                               _i32, _p, _p, _p, _err]),
    "wna16_cuda_moe_create": (_c.c_int, [_p, _p, _p, _c.c_char_p, _i32, _i32,
                                         _i32, _c.POINTER(QuantDesc),
                                         _c.c_bool, _c.POINTER(_p), _err]),
    "wna16_cuda_moe_destroy": (None, [_p]),
    "wna16_cuda_moe_run": (_c.c_int, [_p, _c.POINTER(MoeParams), _p, _i32,
                                      _p, _p, _i32, _p, _err]),
    "wna16_cuda_moe_run_batched": (_c.c_int, [_p, _c.POINTER(MoeParams), _p,
                                              _i32, _p, _p, _p, _err]),
    "wna16_cuda_moe_run_device": (_c.c_int, [
        _p, _c.POINTER(MoeParams), _c.c_uint64, _i32, _c.c_uint64,
        _c.c_uint64, _i32, _c.c_uint64, _p, _err]),
    "wna16_cuda_moe_run_batched_device": (_c.c_int, [
        _p, _c.POINTER(MoeParams), _c.c_uint64, _i32, _c.c_uint64,
        _c.c_uint64, _c.c_uint64, _p, _err]),
    "wna16_cuda_moe_sync": (_c.c_int, [_p, _p, _err]),
    "wna16_probe_device": (None, [_c.POINTER(DeviceInfo)]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def call(fn, *args):
    """Calls a fallible library function with a fresh error record as its
    last argument; a status other than WNA16_OK raises Error with the
    library's message."""
    err = ErrorT()
    st = getattr(lib, fn)(*args, ctypes.byref(err))
    if st != 0:
        raise Error(st, err.message.decode("utf-8", "replace"))
    return st


def cstr(s):
    return None if s is None else s.encode() if isinstance(s, str) else s


def pystr(b):
    return None if b is None else b.decode("utf-8", "replace")
