"""cuda_driver.py - just enough of the CUDA driver API through ctypes for
the GPU tests to make device arrays without torch or CuPy: the primary
context of device 0 (the one libwna16 uses), memory, copies and streams.
A DeviceArray exposes __cuda_array_interface__, which the wna16 package
reads as a device address. None of it is loaded unless a test asks."""
import ctypes

import numpy as np


class Driver:
    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._check(self.cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._check(self.cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx),
                                                     dev), "retain")
        self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    @staticmethod
    def _check(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUDA error {r}")

    def stream(self):
        s = ctypes.c_void_p()
        self._check(self.cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        return s

    def sync(self, stream=None):
        self.cu.cuCtxSetCurrent(self.ctx)
        if stream is not None:
            self._check(self.cu.cuStreamSynchronize(stream), "sync")
        else:
            self._check(self.cu.cuCtxSynchronize(), "sync")

    def to_device(self, arr):
        return DeviceArray(self, np.ascontiguousarray(arr))

    def empty(self, shape, dtype):
        return DeviceArray(self, np.empty(shape, dtype), copy=False)


class DeviceArray:
    def __init__(self, drv, host, copy=True):
        self.drv, self.shape, self.dtype = drv, host.shape, host.dtype
        self.nbytes = host.nbytes
        self.ptr = ctypes.c_uint64()
        drv.cu.cuCtxSetCurrent(drv.ctx)
        drv._check(drv.cu.cuMemAlloc_v2(ctypes.byref(self.ptr),
                                        ctypes.c_size_t(max(host.nbytes, 1))),
                   "cuMemAlloc")
        if copy and host.nbytes:
            drv._check(drv.cu.cuMemcpyHtoD_v2(
                self.ptr, host.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_size_t(host.nbytes)), "HtoD")

    @property
    def __cuda_array_interface__(self):
        return {"version": 3, "shape": self.shape, "typestr": self.dtype.str,
                "data": (self.ptr.value, False), "strides": None}

    def get(self):
        out = np.empty(self.shape, self.dtype)
        self.drv.cu.cuCtxSetCurrent(self.drv.ctx)
        self.drv._check(self.drv.cu.cuMemcpyDtoH_v2(
            out.ctypes.data_as(ctypes.c_void_p), self.ptr,
            ctypes.c_size_t(self.nbytes)), "DtoH")
        return out

    def __del__(self):
        try:
            self.drv.cu.cuMemFree_v2(self.ptr)
        except Exception:
            pass
