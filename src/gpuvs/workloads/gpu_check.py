"""gpu-check: is this GPU as fast as it should be, measured with nothing but the NVIDIA driver.

Its kernels are PTX compiled by the driver's JIT, run through ctypes on libcuda.so.1 (workloads/_driver/).
So it runs in gpuvs's own image (no PyTorch, no CUDA toolkit); its figures are in docs/hardware.md.
Every kernel's result is checked before and after its timed samples: a wrong result fails the trial."""

from __future__ import annotations

import ctypes
import os
import struct
import time
from typing import Any, Callable, Iterator

from gpuvs import events
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.params import Param
from gpuvs.probes import peaks
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, duration, level, rate

FMA_ITERS, MMA_ITERS = 4096, 2048  # loop turns per thread; the checked sums stay whole numbers below 2^24 in fp32
BLOCKS_PER_SM = 8  # fma, copy: 256 threads a block, 2048 a multiprocessor; mma: 128 threads (4 warps) a block
FP16_ONES = 0x3C003C00  # two fp16 1.0 in one 32-bit register, every element of the mma's A and B
MIB = 1 << 20
# What would make "nothing but the driver" untrue: a GPU framework imported, or a GPU library mapped that is not
# the driver's own (libcuda and the libnvidia-* it loads: its JIT, NVML), such as the CUDA runtime, cuBLAS, NVRTC.
GPU_MODULES = ("torch", "cupy", "cuda", "numba", "pycuda", "jax", "jaxlib", "tensorflow", "triton")
GPU_LIBRARY_WORDS = ("cuda", "nvrtc", "cublas", "cudnn", "torch", "nvidia", "nvjitlink", "cufft", "curand", "nccl")
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-")


def gpu_code_loaded() -> tuple[list[str], list[str], list[str]]:
    """This process's own account of the GPU code in it, by file name: the driver's libraries it has mapped, any
    other GPU library it has mapped (/proc/self/maps), and the GPU Python packages it has imported (sys.modules).
    A check that needs nothing but the driver shows libraries of the first kind only and no package."""
    import sys

    try:
        with open("/proc/self/maps") as f:
            names = {line.split()[-1].rsplit("/", 1)[-1] for line in f if "/" in line}
    except OSError:  # not Linux: nothing to show, nothing claimed
        names = set()
    gpu = sorted(n for n in names if ".so" in n and any(w in n.lower() for w in GPU_LIBRARY_WORDS))
    mods = sorted({m.split(".")[0] for m in list(sys.modules) if m.split(".")[0] in GPU_MODULES})
    return ([n for n in gpu if n.startswith(DRIVER_LIBRARIES)], [n for n in gpu if not n.startswith(DRIVER_LIBRARIES)],
            mods)


def refusal(why: object) -> str:
    return f"gpu-check needs the NVIDIA driver's libcuda.so.1; none found: {why}"


def cpu_refusal(device: str) -> str:
    """Why gpu-check cannot run on `device` (not a GPU): the driver's absence where it is absent here."""
    from gpuvs.workloads._driver import libcuda

    try:
        libcuda.load()
    except libcuda.DriverMissing as exc:
        return refusal(exc)
    return f"gpu-check measures a GPU: --device {device} is not one; use --device cuda (or cuda:N)"


def ordinal(device: str) -> int:
    _, _, index = device.partition(":")
    return int(index) if index else 0


def timed(gpu, marks: list, step: Callable[[], None], inner: int, blocks: int) -> list[float]:
    """Seconds of each of `blocks` blocks of `inner` steps: an event between blocks, read once at the end, so that
    the host never waits inside the timed part."""
    marks[0].record()
    for b in range(blocks):
        for _ in range(inner):
            step()
        marks[b + 1].record()
    marks[blocks].synchronize()
    return [marks[i].seconds_to(marks[i + 1]) for i in range(blocks)]


def calibrate(gpu, marks: list, step: Callable[[], None], target_s: float, max_inner: int = 1 << 16) -> int:
    """Steps per block of about target_s (one at least): the count doubles until the median of three blocks takes
    a quarter of the target (as _devtime.inner_count does for torch's workloads)."""
    n = 1
    while True:
        block = sorted(timed(gpu, marks, step, n, 3))[1]
        if block >= target_s / 4 or n >= max_inner:
            break
        n = min(2 * n, max_inner)
    return max(1, min(max_inner, round(target_s / max(block / n, 1e-9))))


def same(got: bytes, want: bytes, what: str, size: int = 1) -> None:
    """WorkloadError (the trial fails) unless the device's result is the known one; names the first difference."""
    if got == want:
        return
    first = next(i for i in range(0, min(len(got), len(want)), size) if got[i:i + size] != want[i:i + size])
    if size == 4:
        g, w = struct.unpack_from("f", got, first)[0], struct.unpack_from("f", want, first)[0]
        detail = f"element {first // 4} is {g!r}, expected {w!r}"
    else:
        detail = f"byte {first} differs" if len(got) == len(want) else f"{len(got)} bytes, expected {len(want)}"
    raise WorkloadError("crash", f"gpu-check: {what} gave a wrong result: {detail}")


@register
class GpuCheck(Workload):
    name = "gpu-check"
    summary = ("GPU check needing only the NVIDIA driver (PTX via libcuda.so.1): fp32 FMA and tensor-core TFLOP/s, "
               "copy and pinned host<->device GB/s, launch us")
    unit = "TFLOP/s"
    metrics = (level("*/pct_of_peak", "higher", tested=False), duration("launch"), rate("fp32_fma", headline=True),
               rate("*"))
    params = (
        Param("steps", int, 10, "timed samples per figure", min=1, max=100000),
        Param("block_ms", float, 20.0, "aim for samples of about this many milliseconds (one kernel or copy at "
              "least)", min=0.0, max=60000.0),
        Param("copy_mib", int, 256, "MiB copied device to device (two buffers of this size on the GPU)",
              min=1, max=1 << 20),
        Param("transfer_mib", int, 64, "MiB copied host to device and back (pinned host buffers of this size)",
              min=1, max=1 << 20),
    )

    def validate(self, raw: dict[str, Any], device: str | None = None) -> dict[str, Any]:
        values = super().validate(raw, device)
        if device and device.split(":", 1)[0] != "cuda":
            raise UsageError(cpu_refusal(device))
        return values

    def headline_series(self, params: dict[str, Any]) -> str | None:
        return "fp32_fma"

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        from gpuvs.workloads._driver import libcuda

        t0 = time.perf_counter()
        try:
            gpu = libcuda.Gpu(ordinal(ctx.device))
        except libcuda.DriverMissing as exc:
            raise WorkloadError("unavailable", refusal(exc)) from None
        except libcuda.DriverError as exc:
            raise WorkloadError("unavailable", f"gpu-check: the NVIDIA driver could not open {ctx.device}: {exc}"
                                ) from None
        try:
            with gpu:
                yield from self.measure(gpu, ctx.params, t0)
        except libcuda.DriverError as exc:
            raise WorkloadError("oom" if exc.status == libcuda.OUT_OF_MEMORY else "crash", f"gpu-check: {exc}"
                                ) from None

    def measure(self, gpu, p: dict[str, Any], t0: float) -> Iterator[dict[str, Any]]:
        from gpuvs.workloads._driver import ptx

        sms = gpu.attrs["sm_count"] or 1
        tensor = gpu.cc >= (8, 0)
        peak = peaks.lookup(gpu.name) or peaks.Peaks("")
        basic = gpu.module(ptx.basic())
        mma = gpu.module(ptx.tensor()) if tensor else None
        yield events.startup("context_and_jit_s", time.perf_counter() - t0)
        yield events.config(
            workload="gpu-check", device_name=gpu.name, compute_capability="%d.%d" % gpu.cc, multiprocessors=sms,
            cuda_driver=gpu.driver_version, kernels="PTX compiled by the driver's JIT (libcuda.so.1 through ctypes)",
            peak_fp32_tflops=peak.tflops_for("fp32") or "unknown", peak_fp16_tflops=peak.tflops_for("fp16") or
            "unknown", peak_memory_gbps=peak.memory_gbps or "unknown", copy=f"{p['copy_mib']} MiB (read + written)",
            transfer=f"{p['transfer_mib']} MiB, pinned", steps=p["steps"], timing="CUDA events")
        marks = [gpu.event() for _ in range(max(p["steps"], 3) + 1)]
        target = p["block_ms"] / 1000.0
        warm = timed_s = 0.0

        def figure(series: str, step: Callable[[], None], amount: float, unit: str, check: Callable[[], None],
                   peak_value: float | None = None, max_inner: int = 1 << 16) -> Iterator[dict[str, Any]]:
            """Checked, calibrated (the warm-up), timed, checked again; `amount` of work per step, in `unit`'s
            numerator (TFLOP, GB)."""
            nonlocal warm, timed_s
            w0 = time.perf_counter()
            step()
            check()
            inner = calibrate(gpu, marks, step, target, max_inner)
            warm += time.perf_counter() - w0
            secs = timed(gpu, marks, step, inner, p["steps"])
            timed_s += sum(secs)
            check()
            for i, sec in enumerate(secs, 1):
                yield events.sample(i, amount * inner / sec, unit, series=series, seconds=sec, items=amount * inner,
                                    per_block=inner, display=i == len(secs))
            value = amount * inner * len(secs) / sum(secs)
            pct = peaks.percent(value, peak_value)
            if pct is not None:
                yield events.metric(f"{series}/pct_of_peak", pct, "%")
            yield events.log(f"{series:>11}  {value:9.2f} {unit}" + (f"  {pct:5.1f}% of the datasheet's peak"
                                                                     if pct is not None else ""))

        # fp32 FMA: every thread's chains end on a known whole number
        threads = sms * BLOCKS_PER_SM * 256
        out = gpu.alloc(threads * 4)
        fma = gpu.launcher(gpu.function(basic, "gpuvs_fma"), sms * BLOCKS_PER_SM, 256,
                           (ctypes.c_uint64(out), ctypes.c_float(1.0), ctypes.c_float(1.0), ctypes.c_uint32(FMA_ITERS)))
        want = struct.pack("f", ptx.fma_sum(FMA_ITERS)) * threads

        def fma_check() -> None:
            got = gpu.from_device(out, threads * 4)
            gpu.zero(out, threads * 4)
            same(got, want, "the fp32 FMA kernel", 4)

        yield from figure("fp32_fma", fma, threads * ptx.fma_flops(FMA_ITERS) / 1e12, "TFLOP/s", fma_check,
                          peak.tflops_for("fp32"))

        # tensor cores: A and B all ones, so every element of D gains 16 per instruction
        if mma is not None:
            warps = sms * BLOCKS_PER_SM * 4
            run_mma = gpu.launcher(gpu.function(mma, "gpuvs_mma"), sms * BLOCKS_PER_SM, 128,
                                   (ctypes.c_uint64(out), ctypes.c_uint32(FP16_ONES), ctypes.c_uint32(FP16_ONES),
                                    ctypes.c_uint32(MMA_ITERS)))
            want_mma = struct.pack("f", ptx.mma_sum(MMA_ITERS)) * (warps * 32)

            def mma_check() -> None:
                got = gpu.from_device(out, warps * 32 * 4)
                gpu.zero(out, warps * 32 * 4)
                same(got, want_mma, "the fp16 tensor-core MMA kernel", 4)

            yield from figure("fp16_mma", run_mma, warps * ptx.mma_flops(MMA_ITERS) / 1e12, "TFLOP/s", mma_check,
                              peak.tflops_for("fp16"))
        else:
            yield events.log("   fp16_mma  skipped: %s has compute capability %d.%d; the tensor-core MMA "
                             "(mma.sync m16n8k16) needs 8.0 or newer" % (gpu.name, *gpu.cc))

        # device memory: random bytes (never zeros) copied; the destination is cleared before each checked run
        size = p["copy_mib"] * MIB
        payload = os.urandom(size)
        src, dst = gpu.alloc(size), gpu.alloc(size)
        gpu.to_device(src, payload)
        gpu.zero(dst, size)
        copy = gpu.launcher(gpu.function(basic, "gpuvs_copy"), sms * BLOCKS_PER_SM, 256,
                            (ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_uint64(size // 16)))

        def copy_check() -> None:
            got = gpu.from_device(dst, size)
            gpu.zero(dst, size)
            same(got, payload, "the device-to-device copy")

        yield from figure("d2d_copy", copy, 2 * size / 1e9, "GB/s", copy_check, peak.memory_gbps)

        # host <-> device over pinned memory: what arrives is what was sent, both ways
        n = p["transfer_mib"] * MIB
        sent = os.urandom(n)
        up, down, dev = gpu.alloc_host(n), gpu.alloc_host(n), gpu.alloc(n)
        ctypes.memmove(up, sent, n)
        ctypes.memset(down, 0, n)

        def arrived(what: str) -> None:
            gpu.sync()
            got = ctypes.string_at(down, n)
            ctypes.memset(down, 0, n)
            same(got, sent, what)

        def h2d_check() -> None:  # the device buffer is cleared after: the next copies must write it again
            gpu.copy_d2h_async(down, dev, n)
            arrived("the host-to-device copy")
            gpu.zero(dev, n)

        yield from figure("h2d_pinned", lambda: gpu.copy_h2d_async(dev, up, n), n / 1e9, "GB/s", h2d_check)
        gpu.copy_h2d_async(dev, up, n)  # what the device-to-host copies bring back
        yield from figure("d2h_pinned", lambda: gpu.copy_d2h_async(down, dev, n), n / 1e9, "GB/s",
                          lambda: arrived("the device-to-host copy"))

        # launch latency: an empty kernel, back to back on one stream
        empty = gpu.launcher(gpu.function(basic, "gpuvs_empty"), 1, 32)
        w0 = time.perf_counter()
        for _ in range(100):
            empty()
        inner = calibrate(gpu, marks, empty, target, 1 << 17)
        warm += time.perf_counter() - w0
        secs = timed(gpu, marks, empty, inner, p["steps"])
        timed_s += sum(secs)
        for i, sec in enumerate(secs, 1):
            yield events.sample(i, sec / inner * 1e6, "us", series="launch", launches=inner, block_s=sec,
                                display=i == len(secs))
        yield events.log(f"{'launch':>11}  {sum(secs) / (inner * len(secs)) * 1e6:9.2f} us per launch of an empty "
                         "kernel")
        yield events.startup("warmup_s", warm)
        # every figure's timed blocks, not the headline's alone, are what "where the time went" counts as measured
        yield events.startup(events.TIMED_S, timed_s)
        driver, other, mods = gpu_code_loaded()
        yield events.config(driver_libraries_mapped=", ".join(driver) or "none",
                            other_gpu_libraries_mapped=", ".join(other) or "none",
                            gpu_packages_imported=", ".join(mods) or "none")
        yield events.log(f"this process mapped the driver's {', '.join(driver) or 'nothing'}; other GPU libraries: "
                         f"{', '.join(other) or 'none'}; GPU packages imported: {', '.join(mods) or 'none'}")
