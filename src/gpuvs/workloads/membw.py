"""membw: memory bandwidth over a sweep of sizes, in GB/s (10^9 bytes/s) and percent of a peak.

Device-to-device copies count bytes read and written (as STREAM); host copies are from pinned and pageable memory.
The peak is the datasheet's for d2d, the PCIe link NVML reports for h2d and d2h. On the CPU, h2h copies memory.
Each copy warms up alone after its checked copy: a fixed --warmup N, or (--warmup 0) blocks until steady."""

from __future__ import annotations

from typing import Any, Iterator

from gpuvs import events
from gpuvs.probes import peaks
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.workloads._sizes import parse_bytes
from gpuvs.params import Param
from gpuvs.workloads import _warmup, register
from gpuvs.workloads._devtime import is_cuda, sync, warm_and_time
from gpuvs.workloads.workload import RunContext, Workload, level, rate

KINDS = ("d2d", "h2d", "d2h")
HOST_COPY = "h2h"  # the CPU's copy: host memory to host memory, named for what it is (d2d on a CPU would say GPU)
SAME_MEMORY = ("d2d", HOST_COPY)  # a copy within one memory: bytes read + written are counted


def parse_size(text: str) -> int:
    """'64MiB' -> 67108864; '1GB' -> 10^9; a plain number is bytes (workloads/_sizes.py)."""
    return parse_bytes("--size", text, 1 << 40, "1 TiB")


def parse_sizes(values: list[str] | None) -> list[int]:
    out: list[int] = []
    for value in [values] if isinstance(values, str) else values or []:
        for part in str(value).split(","):
            size = parse_size(part)
            if size not in out:
                out.append(size)
    return out


def size_label(n: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def series_name(kind: str, mem: str, size: int) -> str:
    return f"{kind}{' ' + mem if mem else ''} {size_label(size)}"


def pcie_link(device: str) -> float | None:
    """One-direction GB/s of the GPU's PCIe link (max generation x width, from NVML); None if unknown."""
    try:
        import pynvml

        from gpuvs.probes import telemetry

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(telemetry.visible_gpu_indices(device, 1)[0])
            return peaks.pcie_gbps(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


@register
class MemBw(Workload):
    name = "membw"
    summary = "memory bandwidth: device copy (read+write), host<->device pinned and pageable (GB/s, % of peak)"
    unit = "GB/s"
    metrics = (level("*/pct_of_*", "higher", tested=False), rate("*", headline=True))
    windowed = True  # one shape (gemm) or one copy (membw) per job under gpuvs share
    window_param = "repeats"
    requires = ("torch",)
    params = (
        Param("kind", str, None, "d2d, h2d, d2h on a GPU, h2h (a host memory copy) on the CPU (repeat or "
              "comma-separate; default: all there are on the device)", multiple=True),
        Param("host_memory", str, "both", "host buffers of h2d/d2h: pinned, pageable or both",
              choices=("both", "pinned", "pageable")),
        Param("size", str, "4MiB,64MiB,256MiB,1GiB", "buffer sizes (repeat or comma-separate): 4MiB, 1GiB, 1GB...",
              multiple=True),
        Param("repeats", int, 10, "timed samples per kind and size", min=1, max=100000),
        Param("block_ms", float, 5.0, "aim for samples of about this many milliseconds (1 copy at least)",
              min=0.0, max=60000.0),
        Param("warmup", int, 0, "untimed copies per kind and size before timing (0: adaptive, blocks of about "
              "--block-ms until they are steady, per kind and size)", min=0, max=100000),
        Param("seed", int, 0, "random seed of the buffer contents", min=0),
    ) + _warmup.PARAMS
    # the largest size is beyond any CPU's last-level cache; a fixed warm-up on the CPU, as cnn-train's
    cpu_defaults = {"size": "1MiB,16MiB,256MiB", "repeats": 5, "warmup": 1}

    def validate(self, raw: dict[str, Any], device: str | None = None) -> dict[str, Any]:
        values = super().validate(raw, device)
        if device and not is_cuda(device):
            host_only = [k for k in values["kind"] if k not in SAME_MEMORY]
            if host_only:
                raise UsageError(f"--kind {host_only[0]} copies between host and GPU; on the CPU only h2h "
                                 "(a host memory copy; --kind d2d names it too) exists")
            values["kind"] = [HOST_COPY]  # the CPU's only copy, whatever named it (d2d on a CPU is h2h)
        elif device and HOST_COPY in values["kind"]:
            raise UsageError(f"--kind {HOST_COPY} is the CPU's host memory copy; on a GPU: d2d, h2d or d2h")
        return values

    def check(self, params: dict[str, Any]) -> None:
        kinds: list[str] = []
        raw = params.get("kind") or []
        for value in [raw] if isinstance(raw, str) else raw:
            for part in str(value).split(","):
                kind = part.strip().lower()
                if kind not in (*KINDS, HOST_COPY):
                    raise UsageError(f"--kind {part.strip()!r} is not allowed; expected d2d, h2d or d2h (on the "
                                     f"CPU: {HOST_COPY})")
                if kind not in kinds:
                    kinds.append(kind)
        params["kind"] = kinds
        params["size"] = [size_label(s) if s % 1024 == 0 else str(s) for s in parse_sizes(params["size"])]
        if not params["size"]:
            raise UsageError("--size needs at least one size")

    def headline_series(self, params: dict[str, Any]) -> str | None:
        """The first kind's largest size: the copy least flattered by a cache (d2d, or h2h on the CPU, unless
        --kind says)."""
        kind, mem = self.plan(params, cuda=True)[0]
        return series_name(kind, mem, max(parse_sizes(params["size"])))

    def summarize(self, samples: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each kind's sizes from the largest down: the headline (the first kind's largest) leads, and the sizes
        read in order after it (the largest first, then 1MiB, 16MiB read as no order at all)."""
        summary = super().summarize(samples, params)
        kinds = list(dict.fromkeys(name.rsplit(" ", 1)[0] for name in summary))

        def place(name: str) -> tuple[int, int]:
            kind, _, size = name.rpartition(" ")
            return kinds.index(kind), -parse_size(size)
        return dict(sorted(summary.items(), key=lambda item: place(item[0])))

    def plan(self, params: dict[str, Any], cuda: bool) -> list[tuple[str, str]]:
        """(kind, host memory) pairs in run order; host memory is '' for a copy within one memory."""
        kinds = params["kind"] or (list(KINDS) if cuda else [HOST_COPY])
        mem = ["pinned", "pageable"] if params["host_memory"] == "both" else [params["host_memory"]]
        return [(k, "") if k in SAME_MEMORY else (k, m) for k in kinds for m in ([""] if k in SAME_MEMORY else mem)]

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import torch

        p, device = ctx.params, ctx.device
        cuda = is_cuda(device)
        gpu = torch.cuda.get_device_name(device) if cuda else None
        hbm = (peaks.lookup(gpu) or peaks.Peaks("")).memory_gbps if gpu else None
        link = pcie_link(device) if cuda else None
        plan = self.plan(p, cuda)
        sizes = parse_sizes(p["size"])
        yield events.config(workload="membw", device_name=gpu or "cpu", kinds=", ".join(
            f"{k} {m}".strip() for k, m in plan), sizes=", ".join(size_label(s) for s in sizes),
            peak_memory_gbps=hbm or "unknown", pcie_link_gbps=round(link, 1) if link else "unknown",
            bytes_counted="d2d: read + written; h2d, d2h: transferred" if cuda else "h2h: read + written",
            repeats=p["repeats"],
            warmup=_warmup.per_shape_described(p, "copies"))
        gen = torch.Generator(device=device).manual_seed(p["seed"])
        if ctx.spec.barrier and len(plan) * len(sizes) != 1:
            raise WorkloadError("input", "gpuvs share runs one copy per job: give one --kind (and --host-memory) "
                                "and one --size")
        measured = _warmup.Shapes("copies")
        for kind, mem in plan:
            for size in sizes:
                series = series_name(kind, mem, size)
                try:
                    secs, inner, warm_s, warm = self.time_copy(torch, kind, mem, size, device, cuda, p, gen, ctx)
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    yield events.log(f"{series}: skipped: out of GPU memory")
                    continue
                yield from measured.add(series, secs, inner, warm_s, warm)
                moved = (2 if kind in SAME_MEMORY else 1) * size * inner / 1e9
                for i, sec in enumerate(secs, 1):
                    yield events.sample(i, moved / sec, self.unit, series=series, seconds=sec, items=moved,
                                        copies=inner, display=i == len(secs))
                rate = moved * len(secs) / sum(secs)
                peak = hbm if kind == "d2d" else link
                pct = peaks.percent(rate, peak)
                if pct is not None:
                    yield events.metric(f"{series}/pct_of_{'peak' if kind == 'd2d' else 'link'}", pct, "%")
                yield events.log(f"{series:>22}  {rate:9.1f} GB/s" + (f"  {pct:5.1f}% of "
                                 f"{'datasheet' if kind == 'd2d' else 'PCIe link'}" if pct is not None else ""))
                if cuda:
                    torch.cuda.empty_cache()
        yield from measured.totals()
        if not measured.count:
            raise WorkloadError("oom", "no size could be run (see the log lines above)")

    def time_copy(self, torch, kind: str, mem: str, size: int, device: str, cuda: bool, p: dict[str, Any], gen,
                  ctx: RunContext | None = None):
        """Random bytes (never zeros) copied src -> dst; the copy is checked once, warmed up, then timed. Returns
        the blocks' seconds, the copies per block, the warm-up's seconds (the block's calibration included) and
        what an adaptive warm-up decided (None: a fixed count)."""
        data = torch.randint(0, 256, (size,), dtype=torch.uint8, device=device, generator=gen)
        if kind in SAME_MEMORY:
            src, dst = data, torch.empty_like(data)
        elif kind == "h2d":
            src = data.cpu().pin_memory() if mem == "pinned" else data.cpu()
            dst = torch.empty_like(data)
        else:
            src, dst = data, torch.empty(size, dtype=torch.uint8, pin_memory=mem == "pinned")
        non_blocking = mem == "pinned"
        dst.copy_(src, non_blocking=non_blocking)
        sync(torch, cuda)
        if not torch.equal(dst.to(device), data):
            raise WorkloadError("crash", f"{kind} copy of {size_label(size)}: the destination differs from the source")

        def step():
            dst.copy_(src, non_blocking=non_blocking)

        return warm_and_time(torch, cuda, step, p, ctx)
