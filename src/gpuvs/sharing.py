"""Concurrent workers on one GPU: a start barrier so every worker measures the same window, MPS on
or off, mixed pairs (interference), a capacity search (add workers until one fails), and the
MPS advisor. Every worker is an ordinary trial: stored, fingerprinted, cleaned up."""

from __future__ import annotations

import contextlib
import copy
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvs import barrier, telemetry, workloads
from gpuvs.errors import UsageError
from gpuvs.mps import MpsDaemon
from gpuvs.runner import LiveTrial, Runner, TrialResult
from gpuvs.spec import EnvSpec, RunSpec

BIG_STEPS = 10_000_000  # the window, not the step count, ends a shared run


@dataclass
class Group:
    """One measured window: several workers at once."""

    label: str
    mps: bool
    trials: list[TrialResult] = field(default_factory=list)
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    clients_attached: int | None = None
    telemetry: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.trials) and all(t.ok for t in self.trials) and not self.failure

    def values(self) -> list[float]:
        return [rate(t)[0] for t in self.trials if t.ok]

    def unit(self) -> str:
        return next((rate(t)[1] for t in self.trials if t.ok), "")

    @property
    def aggregate(self) -> float | None:
        return sum(self.values()) if self.ok else None

    @property
    def fairness(self) -> float | None:
        v = self.values()
        return min(v) / max(v) if self.ok and v and max(v) > 0 else None

    def value(self, index: int) -> float | None:
        """Throughput of the group's index-th worker (None if it failed)."""
        t = self.trials[index] if index < len(self.trials) else None
        return rate(t)[0] if t is not None and t.ok else None


_PER_SECOND = {"s": 1.0, "sec": 1.0, "seconds": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}


def rate(trial: TrialResult) -> tuple[float, str]:
    """A worker's throughput: its headline rate, or for a duration (ms per run) the runs per second,
    so that workers' figures can be added up."""
    main = trial.primary()
    unit = main.get("unit", "")
    value = main.get("value") or 0.0
    if main.get("higher_is_better", True):
        return value, unit
    return (_PER_SECOND.get(unit.strip().lower(), 1.0) / value if value else 0.0), "runs/sec"


def check_shareable(spec: RunSpec) -> None:
    w = workloads.get(spec.workload)
    if not w.windowed:
        shareable = ", ".join(x.name for x in workloads.all_workloads() if x.windowed)
        raise UsageError(f"{w.name} cannot share a measured window yet; workloads that can: {shareable}")


def worker_spec(base: RunSpec, folder: str, name: str, window_s: float, label: str, index: int,
                mps: MpsDaemon | None) -> RunSpec:
    spec = copy.deepcopy(base)
    workload = workloads.get(spec.workload)
    count = workload.param(workload.window_param)
    spec.params = dict(spec.params, **{count.name: int(min(BIG_STEPS, count.max or BIG_STEPS))})
    spec.barrier = {"dir": folder, "name": name, "window_s": window_s, "wait_s": 3600.0}
    spec.telemetry_interval_s = 0  # the coordinator samples the GPU once for everyone
    spec.arm, spec.trial = label, index
    spec.run_id = f"{spec.run_id[:6]}{index:02d}{name[-4:]}"[:12]
    env_vars = list(spec.env.options.get("env_var") or [])
    if mps is not None:
        env_vars += [f"{k}={v}" for k, v in mps.client_env().items()]
        spec.env = EnvSpec(spec.env.kind, {**spec.env.options, "env_var": env_vars, "mps": mps.pipe_dir})
    return spec


class Coordinator:
    """Runs groups of workers through one Runner (its store and hooks)."""

    def __init__(self, runner: Runner, window_s: float, ready_timeout_s: float = 600.0,
                 say: Callable[[str], None] = lambda s: None):
        self.runner = runner
        self.window_s = window_s
        self.ready_timeout_s = ready_timeout_s
        self.say = say

    # -- helpers ------------------------------------------------------------------------------

    def _sampler(self, spec: RunSpec, sink: list[dict[str, Any]]):
        """One NVML sampler for a group on the GPU of `spec` (None for CPU runs)."""
        if not spec.device.startswith("cuda"):
            return None
        probe = copy.deepcopy(spec)
        probe.telemetry_interval_s = 0.1
        return telemetry.start_for(probe, lambda e: sink.append(e) if e.get("type") == "telemetry" else None)

    def _pump(self, lives: list[LiveTrial]) -> None:
        for live in lives:
            if live.done:
                continue
            try:
                live.pump(block=False)
            except TimeoutError:
                live.fail("timeout", f"timed out after {live.timeout:g} s; the worker was stopped")
                live.finish()

    def _wait_ready(self, lives: list[LiveTrial], folder: str, count: int) -> LiveTrial | None:
        """Until `count` workers are ready. Returns a worker that ended before it was ready, if any."""
        deadline = time.monotonic() + self.ready_timeout_s
        while len(barrier.ready(folder)) < count:
            self._pump(lives)
            failed = [lv for lv in lives if lv.done]
            if failed:
                return failed[0]
            if time.monotonic() > deadline:
                for lv in lives:
                    if not lv.done:
                        lv.fail("timeout", f"not ready within {self.ready_timeout_s:g} s")
                        return lv
            time.sleep(0.01)
        return None

    def _run_window(self, group: Group, lives: list[LiveTrial], folder: str, mps: MpsDaemon | None) -> None:
        sink: list[dict[str, Any]] = []
        sampler = self._sampler(lives[0].result.spec, sink)
        try:
            barrier.release(folder)
            if mps is not None:
                time.sleep(min(1.0, self.window_s / 4))
                group.clients_attached = mps.clients()
            grace = time.monotonic() + self.window_s + 120
            while not all(lv.done for lv in lives):
                self._pump(lives)
                if time.monotonic() > grace:
                    for lv in lives:
                        if not lv.done:
                            lv.fail("timeout", f"still running {self.window_s + 120:g} s after the start")
                    break
                time.sleep(0.01)
        finally:
            if sampler is not None:
                sampler.stop()
        if sink:
            group.telemetry = telemetry.summarize(sink)
            group.memory_used_mib = group.telemetry.get("mem_used_mib_max")

    # -- what users ask -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _workers(self, mps: bool):
        """A barrier folder, gpuvs's MPS daemon if asked, and the list of workers to fill; on every way
        out, each worker is stopped and stored, the daemon stopped and the folder removed."""
        folder = tempfile.mkdtemp(prefix="gpuvs-barrier-")
        daemon = MpsDaemon() if mps else None
        lives: list[LiveTrial] = []
        try:
            if daemon is not None:
                daemon.start()
            yield folder, daemon, lives
        except KeyboardInterrupt:
            _interrupted(lives)
            raise
        finally:
            for lv in lives:
                lv.finish()
            if daemon is not None:
                daemon.stop()
            shutil.rmtree(folder, ignore_errors=True)

    def group(self, specs: list[RunSpec], label: str, mps: bool) -> Group:
        """Start every spec, wait until all are warmed up at the barrier, measure one window."""
        group = Group(label=label, mps=mps)
        with self._workers(mps) as (folder, daemon, lives):
            ws = [worker_spec(s, folder, f"w{i}", self.window_s, label, i, daemon) for i, s in enumerate(specs)]
            for spec in ws:
                live = LiveTrial(self.runner, spec)
                lives.append(live)
                live.start()
            bad = self._wait_ready(lives, folder, len(lives))
            if bad is not None:
                group.failure = f"worker {bad.result.spec.trial} failed before the start: {bad.result.error}"
                for lv in lives:
                    if not lv.done:
                        lv.fail("stopped", "stopped: another worker of its group failed before the start")
            else:
                self._run_window(group, lives, folder, daemon)
        group.trials = [lv.result for lv in lives]
        return group

    def capacity(self, spec: RunSpec, max_workers: int, mps: bool = False) -> tuple[Group, LiveTrial | None]:
        """Add workers one at a time, each warmed up and holding its memory at the barrier, until one
        fails or max_workers is reached; then measure all that ran in one window."""
        group = Group(label="capacity", mps=mps)
        failed: LiveTrial | None = None
        sink: list[dict[str, Any]] = []
        with self._workers(mps) as (folder, daemon, lives):
            for i in range(max_workers):
                live = LiveTrial(self.runner, worker_spec(spec, folder, f"w{i:03d}", self.window_s, "capacity", i,
                                                          daemon))
                lives.append(live)
                live.start()
                bad = self._wait_ready(lives, folder, len(lives))
                if bad is not None:
                    failed = bad
                    lives.remove(bad)
                    bad.finish()
                    self.say(f"worker {i + 1} failed: {bad.result.error}")
                    break
                self.say(f"worker {i + 1} ready")
            if lives:
                probe = self._sampler(lives[0].result.spec, sink)  # memory held by all, before the window
                if probe is not None:
                    time.sleep(0.5)
                    probe.stop()
                    if sink:
                        group.memory_used_mib = telemetry.summarize(sink).get("mem_used_mib_max")
                self._run_window(group, lives, folder, daemon)
                if sink and group.telemetry:
                    group.memory_used_mib = max(group.memory_used_mib or 0, group.telemetry.get("mem_used_mib_max") or 0)
        group.trials = [lv.result for lv in lives]
        return group, failed


def _interrupted(lives: list[LiveTrial]) -> None:
    for lv in lives:
        if not lv.done:
            lv.fail("interrupted", "interrupted by the user", status="interrupted")


def gpu_memory_total_mib(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    from gpuvs import fingerprint

    info = fingerprint.nvml_info()
    idx = telemetry.visible_gpu_indices(device, 1)[0]
    gpus = info.get("gpus") or []
    return gpus[idx]["memory_mib"] if idx < len(gpus) else None


@dataclass
class Advice:
    prediction: str  # "mps helps" | "mps hurts" | "no difference" | "will not fit"
    reasons: list[str]


def predict_mps(solo_a: Group, solo_b: Group, total_mib: float | None) -> Advice:
    """From solo runs' telemetry: MPS lets kernels of two processes run at the same time, which helps
    jobs that leave the GPU idle part of the time and hurts (or does nothing for) jobs that each keep
    the SMs or the memory system busy, where they fight for caches and bandwidth."""
    ta, tb = solo_a.telemetry, solo_b.telemetry
    reasons = []
    mem = [(g.memory_used_mib or 0) for g in (solo_a, solo_b)]
    if total_mib and sum(mem) > 0.95 * total_mib:
        return Advice("will not fit", [f"memory alone: {mem[0]:.0f} + {mem[1]:.0f} MiB of {total_mib:.0f} MiB"])
    ua, ub = ta.get("util_gpu_mean"), tb.get("util_gpu_mean")
    ma, mb = ta.get("util_mem_mean"), tb.get("util_mem_mean")
    if ua is None or ub is None:
        return Advice("no difference", ["no GPU telemetry (NVML absent or CPU run): nothing to predict from"])
    reasons.append(f"GPU busy alone: {ua:.0f}% and {ub:.0f}%")
    if ma is not None and mb is not None:
        reasons.append(f"memory-controller busy alone: {ma:.0f}% and {mb:.0f}%")
    if ua + ub <= 120:
        reasons.append("together they leave the GPU idle often enough for concurrent kernels to fill the gaps")
        return Advice("mps helps", reasons)
    if ma is not None and mb is not None and ma + mb > 100:
        reasons.append("both keep the memory system busy: concurrent kernels contend for L2 and bandwidth")
        return Advice("mps hurts", reasons)
    reasons.append("both keep the GPU busy: little idle time to win back")
    return Advice("no difference", reasons)


def normalized_sum(together: Group, alone: list[float | None]) -> float | None:
    """Sum over jobs of (throughput together / throughput alone): 1.0 is what ideal time-slicing
    gives; above 1, sharing did more work than running the jobs one after another."""
    if not together.ok:
        return None
    ratios = []
    for i, base in enumerate(alone):
        now = together.value(i)
        if not base or now is None:
            return None
        ratios.append(now / base)
    return sum(ratios)
