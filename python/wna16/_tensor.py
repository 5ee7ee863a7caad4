"""_tensor.py - arrays in and out of the C API without copies.

`view(obj)` describes an array as (address, dtype name, shape, device,
owner): the address is the array's own memory, handed to the library as
is. What is accepted, tried in this order:
  - torch tensors (CPU or CUDA): data_ptr(), dtype, shape; must be
    contiguous (row-major, as wna16_tensor_t is);
  - objects with __array_interface__ (numpy arrays, and anything that
    exports it): the data pointer, typestr and shape; strides must be
    row-major;
  - objects with __cuda_array_interface__ (Numba, CuPy): a CUDA device
    address, typestr and shape, row-major strides only;
  - objects with __dlpack__ (DLPack producers: jax, cupy, tensorflow,
    numpy >= 1.22, torch): the DLManagedTensor's data, dtype, shape and
    device, row-major strides only; the capsule is kept with the view;
  - objects with the buffer protocol (bytes, bytearray, memoryview,
    array.array): a memoryview's address, format and shape.
A non-contiguous array is refused (ValueError naming it): nothing is
copied behind the caller's back. numpy has no bfloat16, so BF16 data in
numpy is uint16 bit patterns, named with an explicit dtype="BF16".
"""
import ctypes

from . import _lib

# numpy typestr kind+size -> safetensors dtype
_NP = {"f2": "F16", "f4": "F32", "f8": "F64", "i4": "I32", "u1": "U8",
       "i1": "I8", "i2": "I16", "i8": "I64", "b1": "BOOL", "u2": "U16",
       "u4": "U32", "u8": "U64", "c8": "C64"}
# DLPack (code, bits) -> dtype; codes: 0 int, 1 uint, 2 float, 4 bfloat,
# 5 complex, 6 bool
_DL = {(2, 16): "F16", (4, 16): "BF16", (2, 32): "F32", (2, 64): "F64",
       (0, 8): "I8", (0, 16): "I16", (0, 32): "I32", (0, 64): "I64",
       (1, 8): "U8", (1, 16): "U16", (1, 32): "U32", (1, 64): "U64",
       (6, 8): "BOOL", (5, 64): "C64"}
_TORCH = {"float16": "F16", "bfloat16": "BF16", "float32": "F32",
          "float64": "F64", "int32": "I32", "uint8": "U8", "int8": "I8",
          "int16": "I16", "int64": "I64", "bool": "BOOL"}
_BUF = {"e": "F16", "f": "F32", "d": "F64", "b": "I8", "B": "U8",
        "h": "I16", "H": "U16", "i": "I32", "I": "U32", "q": "I64",
        "Q": "U64", "l": "I64", "L": "U64", "?": "BOOL"}


class View:
    """An array as the C API sees it. `owner` keeps what backs the memory
    alive (the array itself, a DLPack capsule) as long as the view is."""

    __slots__ = ("ptr", "dtype", "shape", "device", "owner", "readonly")

    def __init__(self, ptr, dtype, shape, device, owner, readonly=False):
        self.ptr, self.dtype, self.shape = ptr, dtype, tuple(shape)
        self.device, self.owner, self.readonly = device, owner, readonly

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self):
        return self.numel * _lib.lib.wna16_dtype_size(_lib.DTYPE[self.dtype])

    def tensor(self, name):
        """A wna16_tensor_t over this memory (no copy)."""
        if len(self.shape) > _lib.MAX_DIMS:
            raise ValueError(f"{name}: {len(self.shape)} dimensions, at most "
                             f"{_lib.MAX_DIMS}")
        t = _lib.Tensor()
        t.name = _lib.cstr(name)
        t.dtype = _lib.DTYPE[self.dtype]
        t.ndim = len(self.shape)
        for i, s in enumerate(self.shape):
            t.shape[i] = s
        t.data = self.ptr
        t.nbytes = self.nbytes
        return t


_lib.lib.wna16_dtype_size.restype = ctypes.c_size_t
_lib.lib.wna16_dtype_size.argtypes = [ctypes.c_int]


def _row_major(shape, strides, itemsize):
    want = itemsize
    for s, st in zip(reversed(shape), reversed(strides)):
        if s != 1 and st != want:
            return False
        want *= s
    return True


def is_torch(obj):
    return type(obj).__module__.startswith("torch") and \
        hasattr(obj, "data_ptr")


def _from_torch(obj, what):
    if not obj.is_contiguous():
        raise ValueError(f"{what}: the torch tensor is not contiguous "
                         "(call .contiguous() first)")
    name = str(obj.dtype).replace("torch.", "")
    if name not in _TORCH:
        raise ValueError(f"{what}: torch dtype {obj.dtype} has no wna16 "
                         "dtype")
    dev = "cuda" if obj.is_cuda else str(obj.device.type)
    return View(obj.data_ptr(), _TORCH[name], obj.shape, dev, obj)


def _from_array_interface(obj, what):
    ai = obj.__array_interface__
    ptr, readonly = ai["data"]
    typestr = ai["typestr"]
    if typestr[0] not in "<|=":
        raise ValueError(f"{what}: big-endian data ({typestr})")
    key = typestr[1:] if typestr[1] != "?" else "b1"
    if key not in _NP:
        raise ValueError(f"{what}: array type {typestr} has no wna16 dtype")
    shape = ai["shape"]
    strides = ai.get("strides")
    itemsize = int(typestr[2:])
    if strides is not None and not _row_major(shape, strides, itemsize):
        raise ValueError(f"{what}: the array is not C-contiguous (use "
                         "numpy.ascontiguousarray)")
    if ai.get("offset"):
        ptr += ai["offset"]
    return View(ptr or 0, _NP[key], shape, "cpu", obj, readonly)


def _from_cuda_array_interface(obj, what):
    """Numba/CuPy's __cuda_array_interface__: a CUDA device address."""
    ai = obj.__cuda_array_interface__
    v = _from_array_interface(_CAI(ai), what)
    return View(v.ptr, v.dtype, v.shape, "cuda", obj, v.readonly)


class _CAI:
    def __init__(self, ai):
        self.__array_interface__ = ai


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice),
                ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor),
                             ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype = ctypes.c_int
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _DLOwner:
    """Holds a consumed DLPack capsule and its producer; calls the
    tensor's deleter when the view goes (the consumer owns it once the
    capsule is renamed "used_dltensor")."""

    def __init__(self, obj, capsule, managed):
        self.obj, self.capsule, self.managed = obj, capsule, managed

    def __del__(self):
        m = self.managed
        if m and m.contents.deleter:
            m.contents.deleter(m)


def _from_dlpack(obj, what):
    capsule = obj.__dlpack__()
    ptr = _capsule_get(capsule, b"dltensor")
    managed = ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor))
    _capsule_rename(capsule, b"used_dltensor")
    owner = _DLOwner(obj, capsule, managed)
    t = managed.contents.dl_tensor
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _DL:
        raise ValueError(f"{what}: DLPack dtype code {t.dtype.code}, "
                         f"{t.dtype.bits} bits, {t.dtype.lanes} lanes has no "
                         "wna16 dtype")
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides:
        strides = [t.strides[i] * (t.dtype.bits // 8) for i in range(t.ndim)]
        if not _row_major(shape, strides, t.dtype.bits // 8):
            raise ValueError(f"{what}: the DLPack tensor is not row-major")
    dev = {1: "cpu", 2: "cuda", 3: "cpu"}.get(t.device.device_type,
                                               f"dlpack{t.device.device_type}")
    return View((t.data or 0) + t.byte_offset, _DL[key], shape, dev, owner)


def _from_buffer(obj, what):
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError(f"{what}: the buffer is not C-contiguous")
    fmt = mv.format.lstrip("@=<")
    if fmt not in _BUF:
        raise ValueError(f"{what}: buffer format '{mv.format}' has no wna16 "
                         "dtype")
    if mv.readonly:
        # ctypes cannot take the address of a read-only buffer directly;
        # Py_buffer through the C API gives it without a copy
        buf = _PyBuffer()
        if ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(mv),
                                               ctypes.byref(buf), 0) != 0:
            raise ValueError(f"{what}: cannot read the buffer")
        ptr = buf.buf
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(buf))
    else:
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) \
            if mv.nbytes else 0
    return View(ptr, _BUF[fmt], mv.shape or (), "cpu", mv, mv.readonly)


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


def view(obj, what="array", dtype=None):
    """The View of `obj` (see the module's text). `dtype` renames a 16-bit
    integer view as "F16" or "BF16" (numpy has no bfloat16) or checks it."""
    if isinstance(obj, View):
        v = obj
    elif is_torch(obj):
        v = _from_torch(obj, what)
    elif hasattr(obj, "__array_interface__"):
        v = _from_array_interface(obj, what)
    elif hasattr(obj, "__cuda_array_interface__"):
        v = _from_cuda_array_interface(obj, what)
    elif hasattr(obj, "__dlpack__"):
        v = _from_dlpack(obj, what)
    else:
        try:
            v = _from_buffer(obj, what)
        except TypeError:
            raise TypeError(f"{what}: a {type(obj).__name__} is not an array "
                            "(numpy, torch, DLPack or a buffer)") from None
    if dtype is not None and dtype != v.dtype:
        if {dtype, v.dtype} <= {"F16", "BF16", "U16", "I16"}:
            v = View(v.ptr, dtype, v.shape, v.device, v.owner, v.readonly)
        else:
            raise ValueError(f"{what}: dtype {v.dtype}, expected {dtype}")
    return v


def empty_like_kind(ref, shape, dtype):
    """A new array of `shape` and wna16 `dtype`, of the same kind (torch
    on the same device, else numpy) as `ref`. BF16 in numpy is uint16."""
    if is_torch(ref):
        import torch
        tdt = {"F16": torch.float16, "BF16": torch.bfloat16,
               "F32": torch.float32, "I32": torch.int32}[dtype]
        return torch.empty(tuple(shape), dtype=tdt, device=ref.device)
    import numpy as np
    ndt = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32,
           "I32": np.int32}[dtype]
    return np.empty(tuple(shape), dtype=ndt)


def numpy_of(t, owner, readonly=False):
    """A numpy array over a wna16_tensor_t's memory (no copy); `owner` (what
    keeps the memory: a checkpoint, a tensor set) lives as long as the
    array does. Memory-mapped checkpoint data is read-only."""
    import numpy as np
    ndt = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32,
           "F64": np.float64, "I32": np.int32, "U8": np.uint8,
           "I8": np.int8, "I16": np.int16, "I64": np.int64, "U16": np.uint16,
           "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_}
    name = _lib.DTYPES[t.dtype - 1]
    if name not in ndt:
        raise ValueError(f"{_lib.pystr(t.name)}: dtype {name} has no numpy "
                         "type")
    return np.asarray(_Holder(t, np.dtype(ndt[name]).str, owner, readonly))


class _Holder:
    """Exports a wna16_tensor_t through __array_interface__; numpy keeps
    it (and so `owner`) as the array's base."""

    def __init__(self, t, typestr, owner, readonly):
        self._owner = owner
        self.__array_interface__ = {
            "version": 3, "typestr": typestr,
            "shape": tuple(t.shape[i] for i in range(t.ndim)),
            "data": (t.data or 0, bool(readonly))}
