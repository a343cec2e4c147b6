"""The CUDA driver API through ctypes on libcuda.so.1, which device plugins put in every GPU container.

One device's primary context, device and pinned host memory, a stream, events, and modules compiled from PTX text.
Every call's status is checked: a failure is a DriverError naming the call and the driver's name for the error.
Standard library only."""

from __future__ import annotations

import ctypes
from typing import Any

LIBRARY = "libcuda.so.1"

_u32, _i32, _u64, _sz, _vp, _f32 = ctypes.c_uint, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, \
    ctypes.c_float
_P = ctypes.POINTER
# name -> argument types (every function returns a CUresult, an int); the _v2 names are the ABI since CUDA 3.2/11
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuInit": (_u32,),
    "cuDriverGetVersion": (_P(_i32),),
    "cuDeviceGetCount": (_P(_i32),),
    "cuDeviceGet": (_P(_i32), _i32),
    "cuDeviceGetName": (ctypes.c_char_p, _i32, _i32),
    "cuDeviceGetAttribute": (_P(_i32), _i32, _i32),
    "cuDeviceTotalMem_v2": (_P(_sz), _i32),
    "cuDevicePrimaryCtxRetain": (_P(_vp), _i32),
    "cuDevicePrimaryCtxRelease_v2": (_i32,),
    "cuCtxSetCurrent": (_vp,),
    "cuCtxSynchronize": (),
    "cuModuleLoadDataEx": (_P(_vp), ctypes.c_char_p, _u32, _P(_i32), _P(_vp)),
    "cuModuleGetFunction": (_P(_vp), _vp, ctypes.c_char_p),
    "cuModuleUnload": (_vp,),
    "cuMemAlloc_v2": (_P(_u64), _sz),
    "cuMemFree_v2": (_u64,),
    "cuMemAllocHost_v2": (_P(_vp), _sz),
    "cuMemFreeHost": (_vp,),
    "cuMemcpyHtoD_v2": (_u64, _vp, _sz),
    "cuMemcpyDtoH_v2": (_vp, _u64, _sz),
    "cuMemcpyHtoDAsync_v2": (_u64, _vp, _sz, _vp),
    "cuMemcpyDtoHAsync_v2": (_vp, _u64, _sz, _vp),
    "cuMemsetD8_v2": (_u64, ctypes.c_ubyte, _sz),
    "cuStreamCreate": (_P(_vp), _u32),
    "cuStreamDestroy_v2": (_vp,),
    "cuStreamSynchronize": (_vp,),
    "cuEventCreate": (_P(_vp), _u32),
    "cuEventDestroy_v2": (_vp,),
    "cuEventRecord": (_vp, _vp),
    "cuEventSynchronize": (_vp,),
    "cuEventElapsedTime": (_P(_f32), _vp, _vp),
    "cuLaunchKernel": (_vp, _u32, _u32, _u32, _u32, _u32, _u32, _u32, _vp, _P(_vp), _P(_vp)),
    "cuGetErrorName": (_i32, _P(ctypes.c_char_p)),
}
# CUdevice_attribute values (cuda.h)
ATTRIBUTES = {"clock_khz": 13, "sm_count": 16, "memory_clock_khz": 36, "memory_bus_bits": 37, "cc_major": 75,
              "cc_minor": 76}
# CUjit_option values (cuda.h)
_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


class DriverMissing(Exception):
    """libcuda.so.1 could not be loaded here (no NVIDIA driver, or its files not handed to this container)."""


class DriverError(Exception):
    """A driver call returned an error: the call, the status and the driver's name for it."""

    def __init__(self, call: str, status: int, name: str, detail: str = ""):
        self.call, self.status, self.name = call, status, name
        super().__init__(f"{call} failed: {name} ({status})" + (f": {detail}" if detail else ""))


def load() -> ctypes.CDLL:
    """libcuda.so.1 with every signature set; DriverMissing (the loader's own words) where it cannot be loaded."""
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as exc:
        raise DriverMissing(str(exc)) from None
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None and name.endswith("_v2"):  # a driver older than the _v2 name (primary context: CUDA < 11)
            fn = getattr(lib, name[:-3], None)
        if fn is None:
            raise DriverMissing(f"{LIBRARY} has no {name} (a driver too old for gpu-check)")
        fn.argtypes, fn.restype = list(args), ctypes.c_int
        setattr(lib, "gpuvs_" + name, fn)
    return lib


class Gpu:
    """One device's primary context, made current in this thread, and one stream; everything allocated through
    it is freed by close() (also on an exception: use it as a context manager)."""

    def __init__(self, ordinal: int = 0, lib: ctypes.CDLL | None = None):
        self.lib = lib or load()
        self._freers: list[tuple[str, Any]] = []
        self.call("cuInit", 0)
        version = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(version))
        self.driver_version = f"{version.value // 1000}.{version.value % 1000 // 10}"
        count = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(count))
        if not 0 <= ordinal < count.value:
            raise DriverError("cuDeviceGet", 101, "CUDA_ERROR_INVALID_DEVICE",
                              f"device {ordinal} asked for, the driver sees {count.value}")
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        self.device = dev.value
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, 256, self.device)
        self.name = name.value.decode(errors="replace")
        self.attrs = {key: self.attribute(code) for key, code in ATTRIBUTES.items()}
        self.cc = (self.attrs["cc_major"] or 0, self.attrs["cc_minor"] or 0)
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.device)
        self._freers.append(("cuDevicePrimaryCtxRelease_v2", self.device))
        self.call("cuCtxSetCurrent", ctx)
        stream = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(stream), 0)
        self.stream = stream
        self._freers.append(("cuStreamDestroy_v2", stream))

    # -- calls -----------------------------------------------------------------------------------------------------
    def call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, "gpuvs_" + name)(*args)
        if status:
            raise DriverError(name, status, self.error_name(status))

    def error_name(self, status: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.gpuvs_cuGetErrorName(status, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode(errors="replace")
        return f"CUresult {status}"

    def attribute(self, code: int) -> int | None:
        value = ctypes.c_int()
        ok = self.lib.gpuvs_cuDeviceGetAttribute(ctypes.byref(value), code, self.device) == 0
        return value.value if ok else None

    # -- memory ----------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        """Device memory (a CUdeviceptr), freed by close()."""
        ptr = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(ptr), nbytes)
        self._freers.append(("cuMemFree_v2", ptr.value))
        return ptr.value

    def alloc_host(self, nbytes: int) -> int:
        """Pinned (page-locked) host memory, freed by close()."""
        ptr = ctypes.c_void_p()
        self.call("cuMemAllocHost_v2", ctypes.byref(ptr), nbytes)
        self._freers.append(("cuMemFreeHost", ptr.value))
        return ptr.value

    def to_device(self, dst: int, data: bytes | int, nbytes: int | None = None) -> None:
        """Synchronous copy of `data` (bytes, or a host address with nbytes) to device address dst."""
        if isinstance(data, (bytes, bytearray)):
            buf = ctypes.c_char_p(bytes(data)) if isinstance(data, bytearray) else ctypes.c_char_p(data)
            self.call("cuMemcpyHtoD_v2", dst, ctypes.cast(buf, ctypes.c_void_p), len(data))
        else:
            self.call("cuMemcpyHtoD_v2", dst, data, nbytes)

    def from_device(self, src: int, nbytes: int) -> bytes:
        """Synchronous copy of nbytes at device address src into a new bytes object (after the stream's work)."""
        self.sync()
        out = ctypes.create_string_buffer(nbytes)
        self.call("cuMemcpyDtoH_v2", ctypes.cast(out, ctypes.c_void_p), src, nbytes)
        return out.raw

    def zero(self, dst: int, nbytes: int) -> None:
        self.sync()
        self.call("cuMemsetD8_v2", dst, 0, nbytes)

    def copy_h2d_async(self, dst: int, src_host: int, nbytes: int) -> None:
        self.call("cuMemcpyHtoDAsync_v2", dst, src_host, nbytes, self.stream)

    def copy_d2h_async(self, dst_host: int, src: int, nbytes: int) -> None:
        self.call("cuMemcpyDtoHAsync_v2", dst_host, src, nbytes, self.stream)

    # -- modules, kernels, events ------------------------------------------------------------------------------------
    def module(self, ptx: str) -> ctypes.c_void_p:
        """PTX text compiled by the driver's JIT for this device; DriverError with the JIT's own log on failure."""
        log = ctypes.create_string_buffer(8192)
        opts = (ctypes.c_int * 2)(_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p).value, ctypes.c_void_p(len(log)).value)
        mod = ctypes.c_void_p()
        status = self.lib.gpuvs_cuModuleLoadDataEx(ctypes.byref(mod), ptx.encode() + b"\0", 2, opts, vals)
        if status:
            raise DriverError("cuModuleLoadDataEx", status, self.error_name(status),
                              log.value.decode(errors="replace").strip()[:500])
        self._freers.append(("cuModuleUnload", mod))
        return mod

    def function(self, module: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
        fn = ctypes.c_void_p()
        self.call("cuModuleGetFunction", ctypes.byref(fn), module, name.encode())
        return fn

    def launch(self, fn: ctypes.c_void_p, grid: int, block: int, args: tuple = ()) -> None:
        """fn<<<grid, block, 0, stream>>>(args): each argument a ctypes value (c_uint64 for a device address)."""
        params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
        self.call("cuLaunchKernel", fn, grid, 1, 1, block, 1, 1, 0, self.stream, params, None)

    def launcher(self, fn: ctypes.c_void_p, grid: int, block: int, args: tuple = ()):
        """A function of no arguments that launches fn as launch() does, its argument array built once (the launch
        latency measured is the driver's, not the building of ctypes arrays)."""
        params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
        # the function without argtypes, called with its arguments made once as ctypes values: ctypes converts
        # nothing per call (with argtypes, the conversions cost microseconds a launch)
        raw = self.lib._FuncPtr(("cuLaunchKernel", self.lib))
        raw.restype = ctypes.c_int
        one, zero = ctypes.c_uint(1), ctypes.c_uint(0)
        argv = (fn, ctypes.c_uint(grid), one, one, ctypes.c_uint(block), one, one, zero, self.stream, params, None)

        def go() -> None:
            status = raw(*argv)
            if status:
                raise DriverError("cuLaunchKernel", status, self.error_name(status))

        go.keep = (params, args)  # type: ignore[attr-defined]
        return go

    def event(self) -> Event:
        return Event(self)

    def sync(self) -> None:
        self.call("cuStreamSynchronize", self.stream)

    def close(self) -> None:
        """Free everything, newest first; errors while freeing are not raised (the first error is what matters)."""
        try:
            self.lib.gpuvs_cuCtxSynchronize()
        finally:
            while self._freers:
                name, handle = self._freers.pop()
                getattr(self.lib, "gpuvs_" + name)(handle)

    def __enter__(self) -> Gpu:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Event:
    """A CUDA event with timing on the Gpu's stream (destroyed by the Gpu's close())."""

    def __init__(self, gpu: Gpu):
        self.gpu = gpu
        handle = ctypes.c_void_p()
        gpu.call("cuEventCreate", ctypes.byref(handle), 0)
        self.handle = handle
        gpu._freers.append(("cuEventDestroy_v2", handle))

    def record(self) -> None:
        self.gpu.call("cuEventRecord", self.handle, self.gpu.stream)

    def synchronize(self) -> None:
        self.gpu.call("cuEventSynchronize", self.handle)

    def seconds_to(self, later: Event) -> float:
        ms = ctypes.c_float()
        self.gpu.call("cuEventElapsedTime", ctypes.byref(ms), self.handle, later.handle)
        return ms.value / 1e3
