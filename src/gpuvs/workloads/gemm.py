"""gemm: dense matrix multiply throughput on the DeepBench shapes, square and inference shapes.

MxNxK is C[M x N] = A[M x K] . B[K x N], neither transposed, 2*M*N*K flops (docs/hardware.md).
Operand sets are rotated so that the cache does not flatter small shapes; each shape warms up alone.
Before timing, a small shape is checked against a float64 NumPy reference."""

from __future__ import annotations

import itertools
import math
import re
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.probes import peaks
from gpuvs.probes.precision import dtype as precision_dtype, matmul_precision
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.params import Param
from gpuvs.workloads import _warmup, register
from gpuvs.workloads._devtime import is_cuda, sync, warm_and_time
from gpuvs.workloads.aggregate import Totals
from gpuvs.workloads.workload import RunContext, Workload, duration, level, rate

SETS: dict[str, list[str]] = {
    # DeepBench training GEMMs (M x N x K)
    "train": ["7680x48000x2560", "6144x48000x2048", "4608x48000x1536", "8448x48000x2816", "3072x48000x1024"],
    "square": ["4096x4096x4096", "8192x8192x8192", "16384x16384x16384"],
    # inference-style GEMMs: a small N (batch) against large weights
    "inference": ["5124x700x2048", "35x700x2048", "3072x128x1024", "7680x16x2560"],
    # CPU-sized
    "small": ["256x256x256", "512x512x512", "1024x1024x1024"],
}
SETS["all"] = SETS["train"] + SETS["square"] + SETS["inference"]
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
# Largest error allowed, as a fraction of the elementwise bound (|A| . |B|)_ij: input rounding of the
# precision (twice its unit roundoff), output rounding, accumulation, with a margin.
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2, "fp8": 0.25}
CHECK_SHAPE = (256, 192, 320)  # not square, so that a transposed operand cannot pass; multiples of 16 for fp8
FP8_MAX = 448.0  # largest float8_e4m3fn value
_SHAPE = re.compile(r"^\s*(\d+)\s*[x×*]\s*(\d+)\s*[x×*]\s*(\d+)\s*$", re.IGNORECASE)


def parse_shape(text: str) -> tuple[int, int, int]:
    m = _SHAPE.match(text)
    dims = tuple(int(g) for g in m.groups()) if m else ()
    if len(dims) != 3 or not all(1 <= d <= 1 << 20 for d in dims):
        raise UsageError(f"--shape {text.strip()!r} is not MxNxK with whole numbers from 1 to {1 << 20}, "
                         "e.g. 4096x4096x4096 (C[MxN] = A[MxK] . B[KxN])")
    return dims  # type: ignore[return-value]


def parse_shapes(values: list[str] | None) -> list[tuple[int, int, int]]:
    """Shapes from repeated and/or comma-separated --shape values, duplicates dropped, order kept."""
    out: list[tuple[int, int, int]] = []
    for value in values or []:
        for part in str(value).split(","):
            if not part.strip():
                raise UsageError(f"--shape {value!r} has an empty item; use e.g. 512x512x512,1024x256x512")
            dims = parse_shape(part)
            if dims not in out:
                out.append(dims)
    return out


ALL_SHAPES = "all shapes"  # the headline series of a run of several shapes


def label(dims: tuple[int, int, int]) -> str:
    return "x".join(str(d) for d in dims)


def flops(dims: tuple[int, int, int]) -> float:
    m, n, k = dims
    return 2.0 * m * n * k


def fp8_refusal(device: str) -> str | None:
    """Why fp8 cannot run on this device (None: it can, or it cannot be told here)."""
    if not is_cuda(device):
        return ("--precision fp8 needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, "
                "Blackwell: torch._scaled_mm); this run is on the CPU")
    from gpuvs.probes import fingerprint
    from gpuvs.probes import telemetry

    index = telemetry.visible_gpu_indices(device, 1)[0]
    gpus = {g["index"]: g for g in fingerprint.nvml_info().get("gpus", [])}
    cc = gpus.get(index, {}).get("compute_capability")
    if cc and tuple(int(x) for x in cc.split(".")) < (8, 9):
        return (f"--precision fp8 needs compute capability 8.9 or newer (torch._scaled_mm); "
                f"{gpus[index]['name']} has {cc}")
    return None


class GemmOp:
    """One precision's GEMM on one device: operand preparation and the multiply itself."""

    def __init__(self, torch, precision: str, device: str):
        self.torch, self.precision, self.device = torch, precision, device
        matmul_precision(precision)
        self.dtype = precision_dtype(precision)
        if precision == "fp8":
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                raise WorkloadError("unavailable", f"torch {torch.__version__} has no float8 GEMM (torch._scaled_mm)")
            self.dtype = torch.float8_e4m3fn
        self.out_dtype = torch.bfloat16 if precision == "fp8" else self.dtype

    def element_bytes(self) -> int:
        return self.torch.empty((), dtype=self.dtype).element_size()

    def random(self, rows: int, cols: int, gen):
        return self.torch.randn(rows, cols, generator=gen, device=self.device, dtype=self.torch.float32)

    def prepare(self, a32, b32) -> tuple:
        """Operands in this precision from float32 A[MxK], B[KxN]. fp8: per-tensor scales, B column-major."""
        torch = self.torch
        if self.precision != "fp8":
            return a32.to(self.dtype), b32.to(self.dtype)
        sa = (a32.abs().max() / FP8_MAX).float()
        sb = (b32.abs().max() / FP8_MAX).float()
        a8 = (a32 / sa).to(self.dtype)
        b8 = (b32.t().contiguous() / sb).to(self.dtype).t()  # column-major, as _scaled_mm wants
        return a8, b8, sa, sb

    def operands(self, dims: tuple[int, int, int], gen) -> tuple:
        m, n, k = dims
        return self.prepare(self.random(m, k, gen), self.random(k, n, gen))

    def output(self, m: int, n: int):
        return self.torch.empty(m, n, dtype=self.out_dtype, device=self.device)

    def __call__(self, ops: tuple, out):
        if self.precision == "fp8":
            a, b, sa, sb = ops
            return self.torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=self.out_dtype)
        return self.torch.matmul(ops[0], ops[1], out=out)


def error_ratio(c, a, b) -> float:
    """Largest |C - A.B| / (|A|.|B|) over the elements, with A.B in float64 (NumPy arrays in)."""
    import numpy as np

    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ref = a64 @ b64
    bound = np.maximum(np.abs(a64) @ np.abs(b64), np.finfo(np.float64).tiny)
    err = np.abs(np.asarray(c, dtype=np.float64) - ref) / bound
    worst = float(np.max(err)) if err.size else 0.0
    return worst if math.isfinite(worst) else float("inf")


def check_result(c, a, b, precision: str, where: str = "") -> float:
    """The error ratio, or WorkloadError when it is above the precision's tolerance."""
    if tuple(getattr(c, "shape", ())) != (len(a), len(b[0])):
        raise WorkloadError("crash", f"GEMM check failed{where}: result shape {tuple(c.shape)}, expected "
                            f"{(len(a), len(b[0]))}")
    worst = error_ratio(c, a, b)
    if not worst <= TOLERANCE[precision]:
        raise WorkloadError("crash", f"GEMM check failed{where}: largest error {worst:.3g} of the bound "
                            f"|A|.|B| is above the {precision} tolerance {TOLERANCE[precision]:g}")
    return worst


def check_op(op: GemmOp, gen) -> float:
    """Multiply CHECK_SHAPE with the run's own code path and compare with float64."""
    m, n, k = CHECK_SHAPE
    a32, b32 = op.random(m, k, gen), op.random(k, n, gen)
    c = op(op.prepare(a32, b32), op.output(m, n))
    return check_result(c.float().cpu().numpy(), a32.cpu().numpy(), b32.cpu().numpy(), op.precision,
                        f" ({op.precision}, {label(CHECK_SHAPE)} on {op.device})")


def buffer_sets(op: GemmOp, dims: tuple[int, int, int], cuda: bool, asked: int) -> int:
    """Operand sets to rotate: enough to exceed four times the last-level cache (2 to 64)."""
    if asked:
        return asked
    m, n, k = dims
    set_bytes = (m * k + k * n) * op.element_bytes()
    if cuda:
        props = op.torch.cuda.get_device_properties(op.device)
        target = 4 * (getattr(props, "L2_cache_size", 0) or 50 << 20)
    else:
        target = 64 << 20
    return max(2, min(64, math.ceil(target / set_bytes)))


@register
class Gemm(Workload):
    name = "gemm"
    summary = "GEMM throughput: DeepBench, square and inference shapes (us per GEMM, TFLOP/s, % of peak)"
    unit = "TFLOP/s"
    metrics = (duration("*/us_per_gemm"), level("*/pct_of_peak", "higher", tested=False),
               level("check_error_ratio", "lower", tested=False), rate("*", headline=True))
    windowed = True  # one shape (gemm) or one copy (membw) per job under gpuvs share
    window_param = "repeats"
    requires = ("torch", "numpy")
    params = (
        Param("set", str, "all", "shape set: all (train + square + inference), train (DeepBench), square, "
              "inference, small (CPU-sized)", choices=tuple(SETS)),
        Param("shape", str, None, "your own MxNxK (C[MxN] = A[MxK].B[KxN]); repeat or comma-separate; "
              "replaces --set", multiple=True),
        Param("precision", str, "fp32", "fp32 (strict), tf32, fp16, bf16, fp8 (e4m3, sm_89+ GPUs)",
              choices=PRECISIONS),
        Param("repeats", int, 10, "timed samples per shape (each a block of GEMMs of about --block-ms)",
              min=1, max=100000),
        Param("warmup", int, 0, "untimed GEMMs per shape before timing (0: adaptive, blocks of about --block-ms "
              "until they are steady, per shape)", min=0, max=100000),
        Param("block_ms", float, 5.0, "aim for samples of about this many milliseconds (1 GEMM at least)",
              min=0.0, max=60000.0),
        Param("buffers", int, 0, "operand sets rotated (0: enough to exceed 4x the last-level cache)",
              min=0, max=1024),
        Param("check", bool, True, "check a small GEMM against a float64 reference first"),
        Param("seed", int, 0, "random seed of the operands", min=0),
    ) + _warmup.PARAMS
    cpu_defaults = {"set": "small", "repeats": 5, "warmup": 1, "block_ms": 10.0}

    def validate(self, raw: dict[str, Any], device: str | None = None) -> dict[str, Any]:
        values = super().validate(raw, device)
        if values["precision"] == "fp8" and device:
            why = fp8_refusal(device)
            if why:
                raise UsageError(why)
        return values

    def check(self, params: dict[str, Any]) -> None:
        if params.get("shape"):
            params["shape"] = [label(d) for d in parse_shapes(params["shape"])]

    def shapes(self, params: dict[str, Any]) -> list[tuple[int, int, int]]:
        return parse_shapes(params["shape"]) if params.get("shape") else [parse_shape(s) for s in SETS[params["set"]]]

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import torch

        p, device = ctx.params, ctx.device
        cuda = is_cuda(device)
        precision = p["precision"]
        if precision == "fp8":
            if not cuda:
                raise WorkloadError("input", fp8_refusal(device) or "fp8 needs a GPU")
            if torch.cuda.get_device_capability(device) < (8, 9):
                raise WorkloadError("input", f"--precision fp8 needs compute capability 8.9 or newer; "
                                    f"{torch.cuda.get_device_name(device)} has "
                                    f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}")
        gpu = torch.cuda.get_device_name(device) if cuda else None
        peak_rate = (peaks.lookup(gpu) or peaks.Peaks("")).tflops_for(precision) if gpu else None
        shapes = self.shapes(p)
        yield events.config(workload="gemm", precision=precision, shapes=len(shapes),
                            convention="MxNxK: C[MxN] = A[MxK].B[KxN], NN, 2MNK flops",
                            device_name=gpu or "cpu", peak_tflops=peak_rate if peak_rate else "unknown",
                            repeats=p["repeats"], timing="CUDA events" if cuda else "host clock",
                            warmup=_warmup.per_shape_described(p, "GEMMs"))
        if precision == "tf32" and not cuda:
            yield events.log("note: tf32 has no meaning on the CPU; the multiply runs in fp32")
        op = GemmOp(torch, precision, device)
        gen = torch.Generator(device=device).manual_seed(p["seed"])
        if p["check"]:
            t0 = time.perf_counter()
            worst = check_op(op, gen)
            sync(torch, cuda)
            yield events.startup("check_s", time.perf_counter() - t0)
            yield events.metric("check_error_ratio", worst)
            yield events.log(f"check: {precision} {label(CHECK_SHAPE)} against float64: largest error "
                             f"{worst:.2g} of |A|.|B| (tolerance {TOLERANCE[precision]:g}): ok")
        if ctx.spec.barrier and len(shapes) != 1:
            raise WorkloadError("input", "gpuvs share runs one GEMM shape per job: give --shape MxNxK")
        measured = _warmup.Shapes("GEMMs")
        total = Totals()
        for dims in shapes:
            if precision == "fp8" and any(d % 16 for d in dims):
                yield events.log(f"{label(dims)}: skipped: fp8 GEMMs need every dimension a multiple of 16")
                continue
            try:
                secs, inner, nbuf, warm_s, warm = self.time_shape(torch, op, dims, cuda, p, gen, ctx)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                yield events.log(f"{label(dims)}: skipped: out of GPU memory")
                continue
            yield from measured.add(label(dims), secs, inner, warm_s, warm)
            for i, sec in enumerate(secs, 1):
                total.add(i, flops(dims) * inner / 1e12, sec)
            yield from self.shape_events(dims, secs, inner, nbuf, peak_rate)
            if cuda:
                torch.cuda.empty_cache()
        yield from measured.totals()
        if not measured.count:
            raise WorkloadError("oom" if cuda else "input", "no shape could be run (see the log lines above)")
        if measured.count > 1:
            # the figure to quote: all the shapes' work over all their time, one sample per repeat
            repeats = total.complete(measured.count)
            for i, tflop, sec in repeats:
                yield events.sample(i, tflop / sec, self.unit, series=ALL_SHAPES, seconds=sec, items=tflop,
                                    display=False)
            rate = sum(t for _, t, _ in repeats) / sum(s for _, _, s in repeats)
            yield events.log(f"{ALL_SHAPES:>20}  {rate:12.4g} TFLOP/s (every shape's work over its time)")

    def headline_series(self, params: dict[str, Any]) -> str | None:
        shapes = self.shapes(params)
        return ALL_SHAPES if len(shapes) > 1 else label(shapes[0])

    def time_shape(self, torch, op: GemmOp, dims, cuda: bool, p: dict[str, Any], gen, ctx: RunContext | None = None):
        nbuf = buffer_sets(op, dims, cuda, p["buffers"])
        sets = [op.operands(dims, gen) for _ in range(nbuf)]
        out = op.output(dims[0], dims[1])
        turn = itertools.count()

        def step():
            return op(sets[next(turn) % nbuf], out)

        secs, inner, warm_s, warm = warm_and_time(torch, cuda, step, p, ctx)
        return secs, inner, nbuf, warm_s, warm

    def shape_events(self, dims, secs: list[float], inner: int, nbuf: int, peak_rate) -> Iterator[dict[str, Any]]:
        series = label(dims)
        tflop = flops(dims) * inner / 1e12
        for i, sec in enumerate(secs, 1):
            yield events.sample(i, tflop / sec, self.unit, series=series, seconds=sec, items=tflop,
                                us_per_gemm=sec / inner * 1e6, gemms=inner, buffers=nbuf, display=i == len(secs))
        rate = tflop * len(secs) / sum(secs)
        us = sum(secs) / (inner * len(secs)) * 1e6
        yield events.metric(f"{series}/us_per_gemm", us, "us")
        pct = peaks.percent(rate, peak_rate)
        if pct is not None:
            yield events.metric(f"{series}/pct_of_peak", pct, "%")
        yield events.log(f"{series:>20}  {us:12.1f} us  {rate:9.2f} TFLOP/s"
                         + (f"  {pct:5.1f}% of peak" if pct is not None else ""))
