"""kernels: Rodinia-style applications, written once in PyTorch so the same code runs on a GPU and on the CPU.

A run copies its inputs to the device, computes, and copies the results back: wall time is all of it (host clock).
Kernel time is the computation alone (CUDA events on a GPU); footprint the run's peak device memory.
The first run is untimed and checked against a NumPy reference (docs/hardware.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

from gpuvs import events
from gpuvs.probes import precision
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.params import Param
from gpuvs.workloads import register
from gpuvs.workloads._devtime import is_cuda, sync
from gpuvs.workloads.aggregate import Totals
from gpuvs.workloads.workload import RunContext, Workload, amount, duration
from gpuvs.workloads.kernels import dynprog, graph, learn, linalg, stencil  # noqa: F401  (they register apps)
from gpuvs.workloads.kernels.app import APPS, App

ORDER = ("hotspot", "hotspot3D", "srad", "pathfinder", "nw", "lud", "gaussian", "bfs", "kmeans", "backprop")
SCALES = ("full", "small", "tiny")


@dataclass
class RunTimes:
    wall_s: float
    kernel_s: float
    footprint_bytes: int | None
    data_bytes: int
    outputs: dict[str, Any]


def app_names(values: list[str] | str | None) -> list[str]:
    """--app values (repeated or comma-separated, any case, 'all' for every app) as names in suite order."""
    lower = {name.lower(): name for name in ORDER}
    names: list[str] = []
    for value in [values] if isinstance(values, str) else values or []:
        for part in str(value).split(","):
            key = part.strip().lower()
            if key == "all":
                wanted = list(ORDER)
            elif key in lower:
                wanted = [lower[key]]
            else:
                raise UsageError(f"--app {part.strip()!r} is not allowed; expected all or one of {', '.join(ORDER)}")
            names.extend(n for n in wanted if n not in names)
    return sorted(names, key=ORDER.index)


def execute(torch, app: App, host: dict[str, Any], size: int, device: str) -> RunTimes:
    """One run: inputs to the device, compute, results back; timed as the module docstring says."""
    import numpy as np

    cuda = is_cuda(device)
    sync(torch, cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    dev = {k: torch.from_numpy(v).to(device) if cuda else torch.from_numpy(v).clone() for k, v in host.items()}
    if cuda:
        start.record()
    k0 = time.perf_counter()
    out = app.compute(torch, dev, size)
    if cuda:
        end.record()
    kernel = time.perf_counter() - k0
    results = {k: v.cpu().numpy() for k, v in out.items()}
    sync(torch, cuda)
    wall = time.perf_counter() - t0
    footprint = None
    if cuda:
        kernel = start.elapsed_time(end) / 1e3
        footprint = torch.cuda.max_memory_allocated(device) - base
    data = sum(int(np.asarray(v).nbytes) for v in host.values()) + sum(int(v.nbytes) for v in results.values())
    return RunTimes(wall, kernel, footprint, data, results)


ALL_APPS = "all apps"  # the headline series of a run of several apps: their kernel times added

@register
class Kernels(Workload):
    name = "kernels"
    summary = "Rodinia-style apps (hotspot, hotspot3D, srad, pathfinder, nw, lud, gaussian, bfs, kmeans, backprop)"
    unit = "ms"
    metrics = (duration("*/wall_ms"), amount("*/data_mb", "neither", tested=False), amount("*/footprint_mb"),
               duration("*", headline=True))
    requires = ("torch", "numpy", "scipy")
    params = (
        Param("app", str, "all", f"all, or one or more of {', '.join(ORDER)} (repeat or comma-separate)",
              multiple=True),
        Param("scale", str, "full", "problem sizes: full (GPU-sized; hotspot3D about 98 MB), small (CPU-sized), "
              "tiny (seconds on a CPU)", choices=SCALES),
        Param("size", int, 0, "the app's main dimension (docs/hardware.md lists them); 0: the --scale size; "
              "needs a single --app", min=0, max=10**9),
        Param("repeats", int, 5, "timed runs per app (after one untimed, checked run)", min=1, max=100000),
        Param("check", bool, True, "check the first run against the NumPy reference"),
        Param("seed", int, 0, "random seed of the inputs", min=0),
        Param("hold_mb", float, 0.0, "device memory held (allocated and written) beside the app for the whole run, "
              "to size an instance like a bigger job (a capacity study)", min=0.0, max=10**7),
    )
    cpu_defaults = {"scale": "small", "repeats": 3}
    windowed = True  # one app per job under gpuvs share
    window_param = "repeats"

    def check(self, params: dict[str, Any]) -> None:
        params["app"] = app_names(params["app"])
        if params["size"] and len(params["app"]) != 1:
            raise UsageError("--size needs exactly one --app (each app reads it as its own dimension); "
                             "use --scale for the whole suite")

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import numpy as np
        import torch

        p, device = ctx.params, ctx.device
        cuda = is_cuda(device)
        precision.matmul_precision("fp32")  # strict float32: no TF32 in the apps' matmuls
        apps = [APPS[name] for name in p["app"]]
        if ctx.spec.barrier and len(apps) != 1:
            raise WorkloadError("input", "gpuvs share runs one kernels app per job: give --app NAME")
        sizes = {a.name: p["size"] or a.sizes[p["scale"]] for a in apps}
        yield events.config(workload="kernels", apps=", ".join(f"{a.name} {sizes[a.name]}" for a in apps),
                            scale=p["scale"] if not p["size"] else "custom", repeats=p["repeats"],
                            device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
                            timing="kernel: CUDA events; wall: host clock" if cuda else "host clock")
        held = self.hold(torch, device, p["hold_mb"])  # noqa: F841 (kept until the run ends)
        done, why = 0, ""
        total = Totals()
        timed_s = 0.0  # every app's timed runs, host clock: what "where the time went" counts as measured
        for app in apps:
            size = sizes[app.name]
            try:
                for event in self.run_app(torch, np, app, size, device, p, ctx):
                    if event["type"] == "sample":
                        total.add(event["step"], 1.0, event["value"])
                        timed_s += event["extra"]["wall_ms"] / 1e3
                    yield event
                done += 1
            except torch.cuda.OutOfMemoryError as exc:
                torch.cuda.empty_cache()
                why = str(exc).splitlines()[0][:200]
                yield events.log(f"{app.name} {size}: skipped: out of GPU memory")
        if not done:
            raise WorkloadError("oom", "no app could be run: out of GPU memory" + (f" ({why})" if why else ""))
        yield events.startup(events.TIMED_S, timed_s)
        repeats = total.complete(done)
        if done > 1 and repeats:
            # the figure to quote for the suite: every app's kernel time added up, repeat by repeat
            for i, _, ms in repeats:
                yield events.sample(i, ms, self.unit, series=ALL_APPS, display=False)
            mean = sum(ms for _, _, ms in repeats) / len(repeats)
            yield events.log(f"{ALL_APPS:>12}  kernel {mean:10.2f} ms (every app's kernel time added)")

    def headline_series(self, params: dict[str, Any]) -> str | None:
        return ALL_APPS if len(params["app"]) > 1 else params["app"][0]

    @staticmethod
    def hold(torch, device: str, mb: float):
        if not mb:
            return None
        try:
            block = torch.empty(int(mb * 1e6), dtype=torch.uint8, device=device)
            block.fill_(1)
            return block
        except torch.cuda.OutOfMemoryError as exc:
            raise WorkloadError("oom", f"out of GPU memory holding --hold-mb {mb:g}: "
                                f"{str(exc).splitlines()[0][:200]}") from None

    def run_app(self, torch, np, app: App, size: int, device: str, p: dict[str, Any],
                ctx: RunContext) -> Iterator[dict[str, Any]]:
        host = app.inputs(size, np.random.default_rng(p["seed"]))
        first = execute(torch, app, host, size, device)
        yield events.startup(f"{app.name}_first_run_s", first.wall_s)
        if p["check"]:
            yield events.log(self.verify(torch, np, app, size, host, first, device, p["seed"]))
        runs = []
        ctx.start_window()
        for i in range(1, p["repeats"] + 1):
            if not ctx.window_open():
                break
            r = execute(torch, app, host, size, device)
            runs.append(r)
            yield events.sample(i, r.kernel_s * 1e3, self.unit, series=app.name, wall_ms=r.wall_s * 1e3,
                                footprint_mb=r.footprint_bytes / 1e6 if r.footprint_bytes is not None else None,
                                display=i == p["repeats"])
        wall = float(np.mean([r.wall_s for r in runs])) * 1e3
        kernel = float(np.mean([r.kernel_s for r in runs])) * 1e3
        yield events.metric(f"{app.name}/wall_ms", wall, "ms")
        yield events.metric(f"{app.name}/data_mb", runs[-1].data_bytes / 1e6, "MB")
        footprint = max((r.footprint_bytes or 0) for r in runs) if runs[-1].footprint_bytes is not None else None
        if footprint is not None:
            yield events.metric(f"{app.name}/footprint_mb", footprint / 1e6, "MB")
        yield events.log(f"{app.name:>12} {size:>9}  kernel {kernel:10.2f} ms  wall {wall:10.2f} ms"
                         + (f"  footprint {footprint / 1e6:8.1f} MB" if footprint is not None else "")
                         + f"  data {runs[-1].data_bytes / 1e6:8.1f} MB")

    @staticmethod
    def verify(torch, np, app: App, size: int, host, first: RunTimes, device: str, seed: int) -> str:
        """Compare the device result with the NumPy reference; WorkloadError if they disagree."""
        checked = min(size, app.check_size)
        if checked != size:
            host = app.inputs(checked, np.random.default_rng(seed))
            outputs = execute(torch, app, host, checked, device).outputs
        else:
            outputs = first.outputs
        result = app.compare(outputs, app.reference(host, checked))
        if not result.ok:
            raise WorkloadError("crash", f"{app.name} (size {checked}) disagrees with its NumPy reference: "
                                f"{result.detail}")
        return f"check: {app.name} size {checked} agrees with NumPy: {result.detail}"
