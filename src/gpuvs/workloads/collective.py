"""collective: a collective operation over a sweep of sizes across ranks, as NVIDIA's nccl-tests measure it.

One process per GPU (NCCL) or CPU rank (gloo), started by trial/multiproc.py (`--num-gpus N`, N >= 2).
Time per operation is the slowest rank's; algbw and busbw follow nccl-tests' doc/PERFORMANCE.md (docs/hardware.md).
Every size's result is checked once with known values: a wrong element fails the trial."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from gpuvs import events
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.workloads._sizes import parse_bytes
from gpuvs.params import Param
from gpuvs.workloads import register
from gpuvs.workloads.workload import MetricDecl, RunContext, Workload, duration, rate

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "send-recv")
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MAX_BYTES = 16 << 30


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth (doc/PERFORMANCE.md, src/*.cu GetBw)."""
    return {"all-reduce": 2.0 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1) / n,
            "broadcast": 1.0, "send-recv": 1.0}[op]


def parse_size(name: str, value: Any) -> int:
    """Bytes from a number or one with K, M or G (1024-based, as nccl-tests' -b and -e; workloads/_sizes.py)."""
    return parse_bytes(f"--{name.replace('_', '-')}", value, MAX_BYTES, "16G")


def sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests' -b/-e/-f: min, min x f, min x f^2, ... up to max (max itself only where the steps land on it)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


@dataclass(frozen=True)
class Shape:
    """One size of the sweep for one operation and rank count: nccl-tests' GetCollByteCount."""

    op: str
    n: int
    elt: int
    send: int  # elements each rank sends
    recv: int  # elements each rank receives
    count: int  # nccl-tests' count column (the per-rank count for all-gather and reduce-scatter)

    @classmethod
    def of(cls, op: str, size: int, n: int, elt: int) -> "Shape":
        count = size // elt
        if op in ("all-gather", "reduce-scatter"):
            base = (count // n) & ~(16 // elt - 1)  # per rank, aligned to 16 bytes as nccl-tests
            send, recv = (base, base * n) if op == "all-gather" else (base * n, base)
            return cls(op, n, elt, send, recv, base)
        return cls(op, n, elt, count, count, count)

    @property
    def nbytes(self) -> int:
        """S: the size nccl-tests' bandwidths divide (its size column)."""
        return max(self.send, self.recv) * self.elt

    def algbw(self, seconds: float) -> float:
        return self.nbytes / 1e9 / seconds

    def busbw(self, seconds: float) -> float:
        return self.algbw(seconds) * bus_factor(self.op, self.n)


def expected(op: str, rank: int, n: int, recv: int) -> list[tuple[int, int, float]]:
    """What rank `rank` must hold after the operation when every rank r filled its input with r + 1: runs of
    (start, stop, value) over its output's elements."""
    if op in ("all-reduce", "reduce-scatter"):
        return [(0, recv, n * (n + 1) / 2)]
    if op == "all-gather":
        per = recv // n
        return [(r * per, (r + 1) * per, r + 1.0) for r in range(n)]
    if op == "broadcast":
        return [(0, recv, 1.0)]  # the root, rank 0, filled 1
    return [(0, recv, (rank - 1) % n + 1.0)]  # send-recv: from the rank before, as nccl-tests' ring


def wrong_elements(op: str, out, rank: int, n: int) -> tuple[int, str]:
    """How many of `out`'s elements differ from what they must be, and the first one in words ('' when none)."""
    flat = out.reshape(-1).float().cpu()
    wrong, first = 0, ""
    for start, stop, value in expected(op, rank, n, flat.numel()):
        bad = (flat[start:stop] != value).nonzero()
        if bad.numel() and not first:
            i = start + int(bad[0])
            first = f"rank {rank} element {i} is {float(flat[i]):g}, expected {value:g}"
        wrong += int(bad.numel())
    return wrong, first


def label(size: int) -> str:
    return f"{size} B"


@register
class Collective(Workload):
    name = "collective"
    summary = "collective communication across ranks (nccl-tests): bus bandwidth over a sweep of sizes"
    unit = "GB/s"
    multi_gpu = True
    scales_with_devices = False  # bus bandwidth is per rank's link already (nccl-tests' point of busbw)
    requires = ("torch",)
    metrics = (MetricDecl("*/time_us", "lower", "slower", "faster", tested=False),
               MetricDecl("*/algbw", "higher", "faster", "slower", tested=False),
               MetricDecl("*/count", "neither", "more", "fewer", tested=False),
               duration("latency_us"), rate("*", headline=True))
    params = (
        Param("op", str, "all-reduce", "the collective: all-reduce (sum), all-gather, reduce-scatter (sum), "
              "broadcast (from rank 0), send-recv (each rank to the next, in a ring)", choices=OPS),
        Param("min_bytes", str, "8", "smallest size (nccl-tests -b): bytes, or with K, M, G (1024-based) or "
              "KB, MB, GB"),
        Param("max_bytes", str, "128M", "largest size (nccl-tests -e): bytes, or with K, M, G (1024-based) or "
              "KB, MB, GB"),
        Param("factor", int, 2, "each size is the one before times this (nccl-tests -f)", min=2, max=1024),
        Param("precision", str, "fp32", "element type: fp32 (float32), fp16 (float16) or bf16 (bfloat16)",
              choices=tuple(PRECISIONS), aliases=("dtype",)),
        Param("warmup", int, 5, "untimed operations per size before timing (nccl-tests -w)", min=0, max=100000),
        Param("iters", int, 20, "operations in one timed sample (nccl-tests -n)", min=1, max=1_000_000),
        Param("repeats", int, 5, "timed samples per size", min=1, max=10000),
    )
    cpu_defaults = {"max_bytes": "1M", "warmup": 2, "iters": 5, "repeats": 3}
    cpu_note = "sizes up to 1M, 5 operations per sample: a sweep takes seconds on an idle 2-core CPU"

    def check(self, params: dict[str, Any]) -> None:
        low, high = parse_size("min_bytes", params["min_bytes"]), parse_size("max_bytes", params["max_bytes"])
        if high < low:
            raise UsageError(f"--max-bytes {high} is below --min-bytes {low}: the sweep goes from the smaller up")
        elt = ELEMENT_BYTES[params["precision"]]
        if low < elt:
            raise UsageError(f"--min-bytes {low} is less than one {PRECISIONS[params['precision']]} element "
                             f"({elt} bytes)")
        params["min_bytes"], params["max_bytes"] = str(low), str(high)

    def check_spec(self, spec, params: dict[str, Any]) -> None:
        from gpuvs.spec import ranks_asked

        if ranks_asked(spec) < 2:
            raise UsageError(f"{params['op']} is a collective: it needs at least 2 ranks; give --num-gpus N with "
                             "N >= 2 (one process per GPU, or N gloo processes with --device cpu), or --num-nodes "
                             "N >= 2 with --env pod")

    def sizes(self, params: dict[str, Any]) -> list[int]:
        return sweep(int(params["min_bytes"]), int(params["max_bytes"]), params["factor"])

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized() or ctx.world_size < 2:
            raise WorkloadError("input", "collective needs at least 2 ranks (--num-gpus N, N >= 2)")
        p, n, rank = ctx.params, ctx.world_size, ctx.rank
        cuda = ctx.device.startswith("cuda")
        device = torch.device(ctx.device)
        dtype = getattr(torch, PRECISIONS[p["precision"]])
        elt = ELEMENT_BYTES[p["precision"]]
        shapes = []
        for size in self.sizes(p):
            shape = Shape.of(p["op"], size, n, elt)
            if shape.send and shape.recv:
                shapes.append(shape)
            elif rank == 0:
                yield events.log(f"{size} B: skipped: below {16 * n} bytes, {p['op']} has no 16-byte block "
                                 f"for each of {n} ranks (nccl-tests' alignment)")
        if not shapes:
            raise WorkloadError("input", f"no size from {p['min_bytes']} to {p['max_bytes']} bytes can be split "
                                f"over {n} ranks for {p['op']}: raise --max-bytes")
        yield events.config(workload="collective", op=p["op"], ranks=n, backend=dist.get_backend(),
                            type=PRECISIONS[p["precision"]], sizes=len(shapes),
                            min_bytes=shapes[0].nbytes, max_bytes=shapes[-1].nbytes, factor=p["factor"],
                            warmup=p["warmup"], iters=p["iters"], repeats=p["repeats"],
                            timing="host clock after a barrier to the device's completion, the slowest rank's",
                            busbw_factor=f"{bus_factor(p['op'], n):g} (nccl-tests doc/PERFORMANCE.md)")
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        yield events.log(f"{'size':>12} {'count':>12} {'type':>9} {'time':>10} {'algbw':>8} {'busbw':>8} "
                         f"{'#wrong':>6}")
        yield events.log(f"{'(B)':>12} {'(elements)':>12} {'':>9} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
        t_warm = 0.0
        rows = []
        for shape in shapes:
            src = torch.zeros(shape.send, dtype=dtype, device=device)
            dst = torch.zeros(shape.recv, dtype=dtype, device=device)
            op = self.operation(dist, shape, rank, src, dst)
            t0 = time.perf_counter()
            for _ in range(p["warmup"]):
                op()
            sync()
            t_warm += time.perf_counter() - t0
            self.check_values(dist, torch, shape, rank, src, dst, op, sync, device)
            src.zero_(), dst.zero_()  # timed on zeros: sums stay finite however many operations
            secs = [self.timed(dist, torch, op, p["iters"], sync, device) for _ in range(p["repeats"])]
            rows.append((shape, secs))
            per_op = sum(secs) / (len(secs) * p["iters"])
            if rank == 0:
                yield events.log(f"{shape.nbytes:>12} {shape.count:>12} {PRECISIONS[p['precision']]:>9} "
                                 f"{per_op * 1e6:>10.2f} {shape.algbw(per_op):>8.3f} {shape.busbw(per_op):>8.3f} "
                                 f"{0:>6}")
        if rank != 0:
            return
        yield events.startup("warmup_s", t_warm)
        # every size's timed repeats, not the headline size's alone, are what "where the time went" counts as measured
        yield events.startup(events.TIMED_S, sum(sum(secs) for _, secs in rows))
        # the largest size first: the trial's headline is its bus bandwidth (worker.headline_first keeps the order)
        for shape, secs in reversed(rows):
            yield from self.size_events(shape, secs, p["iters"])
        smallest, secs = rows[0]
        yield events.metric("latency_us", sum(secs) / (len(secs) * p["iters"]) * 1e6, "us")

    def size_events(self, shape: Shape, secs: list[float], iters: int) -> Iterator[dict[str, Any]]:
        series = label(shape.nbytes)
        bus_gb = shape.nbytes * bus_factor(shape.op, shape.n) / 1e9 * iters
        for i, sec in enumerate(secs, 1):
            yield events.sample(i, bus_gb / sec, self.unit, series=series, seconds=sec, items=bus_gb,
                                us_per_op=sec / iters * 1e6, algbw=shape.algbw(sec / iters), display=False)
        per_op = sum(secs) / (len(secs) * iters)
        yield events.metric(f"{series}/count", shape.count)
        yield events.metric(f"{series}/time_us", per_op * 1e6, "us")
        yield events.metric(f"{series}/algbw", shape.algbw(per_op), "GB/s")

    @staticmethod
    def operation(dist, shape: Shape, rank: int, src, dst) -> Callable[[], None]:
        n = shape.n
        if shape.op == "all-reduce":
            return lambda: dist.all_reduce(dst)
        if shape.op == "all-gather":
            return lambda: dist.all_gather_into_tensor(dst, src)
        if shape.op == "reduce-scatter":
            return lambda: dist.reduce_scatter_tensor(dst, src)
        if shape.op == "broadcast":
            return lambda: dist.broadcast(dst, 0)

        def send_recv() -> None:
            ops = [dist.P2POp(dist.isend, src, (rank + 1) % n), dist.P2POp(dist.irecv, dst, (rank - 1) % n)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return send_recv

    @staticmethod
    def check_values(dist, torch, shape: Shape, rank: int, src, dst, op, sync, device) -> None:
        """One operation on known values (rank r fills r + 1; in-place operations fill their output), checked on
        every rank; every rank learns the total of wrong elements, so that all of them stop together."""
        src.fill_(rank + 1)
        if shape.op in ("all-reduce", "broadcast"):
            dst.fill_(rank + 1)
        else:
            dst.fill_(-1)
        op()
        sync()
        wrong, first = wrong_elements(shape.op, dst, rank, shape.n)
        total = torch.tensor([wrong], dtype=torch.float64, device=device)
        dist.all_reduce(total)
        if total.item():
            raise WorkloadError("crash", f"{shape.op} gave wrong values at {shape.nbytes} bytes: "
                                f"{int(total.item())} wrong element(s) over {shape.n} ranks; "
                                f"{first or f'none on rank {rank}'} (rank r filled r + 1)")

    @staticmethod
    def timed(dist, torch, op, iters: int, sync, device) -> float:
        """Seconds of `iters` operations, the slowest rank's: each rank starts after a barrier and stops once its
        device has finished; the times are reduced with MAX."""
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        sync()
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item())
