"""Concurrent workers on one GPU, all measuring the same window behind a start barrier.

MPS on or off, mixed pairs (interference), a capacity search (add workers until one fails), and the MPS advisor.
Every worker is an ordinary trial: stored, fingerprinted, cleaned up."""

from __future__ import annotations

import contextlib
import copy
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvs import workloads
from gpuvs.probes import telemetry
from gpuvs.sharing import gpm
from gpuvs.workloads import barrier
from gpuvs.errors import UsageError
from gpuvs.sharing.mps import MpsDaemon
from gpuvs.trial.runner import Flight, LiveTrial, Runner, TrialResult
from gpuvs.sharing.share_stats import as_rate, window_rate
from gpuvs.spec import EnvSpec, RunSpec

BIG_STEPS = 10_000_000  # the window, not the step count, ends a shared run


@dataclass
class Group:
    """One measured window: several workers at once."""

    label: str
    mps: bool
    trials: list[TrialResult] = field(default_factory=list)
    window_s: float | None = None  # the window it measured
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    clients_attached: int | None = None
    telemetry: dict[str, Any] = field(default_factory=dict)
    gpm: dict[str, float] | None = None  # NVML GPM percentages over the window (Hopper and later)
    gpm_note: str = ""  # why there are none
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


def rate(trial: TrialResult) -> tuple[float, str]:
    """A worker's throughput: its headline rate, or for a duration (ms per run) the runs per second."""
    return as_rate(trial.primary())


def check_shareable(spec: RunSpec) -> None:
    w = workloads.get(spec.workload)
    if not w.windowed:
        shareable = ", ".join(x.name for x in workloads.all_workloads() if x.windowed)
        raise UsageError(f"{w.name} cannot share a measured window yet; workloads that can: {shareable}")


def worker_spec(base: RunSpec, folder: str, name: str, window_s: float, label: str, index: int,
                mps: MpsDaemon | None, client_env: dict[str, str] | None = None) -> RunSpec:
    """A worker of a shared window; client_env: MPS client settings of this worker (its share of the SMs,
    its pinned memory limit)."""
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
        env_vars += [f"{k}={v}" for k, v in {**mps.client_env(), **(client_env or {})}.items()]
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

    def _wait_ready(self, flight: Flight, folder: str, count: int) -> LiveTrial | None:
        """Until `count` workers are ready. Returns a worker that ended before it was ready, if any."""
        lives = flight.live
        deadline = time.monotonic() + self.ready_timeout_s
        while len(barrier.ready(folder)) < count:
            flight.pump(lives)
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

    def _run_window(self, group: Group, flight: Flight, folder: str, mps: MpsDaemon | None,
                    gpm_window: bool, window_s: float) -> None:
        lives = flight.live
        sink: list[dict[str, Any]] = []
        spec = lives[0].result.spec
        sampler = self._sampler(spec, sink)
        window = None
        try:
            start = barrier.release(folder)
            if gpm_window and spec.device.startswith("cuda"):
                time.sleep(max(0.0, start - time.time()) + min(0.3, window_s / 10))
                window, group.gpm_note = gpm.start(telemetry.visible_gpu_indices(spec.device, 1)[0])
                gpm_end = time.monotonic() + window_s - min(0.5, window_s / 5)
            if mps is not None:
                time.sleep(min(1.0, window_s / 4))
                group.clients_attached = mps.clients()
            grace = time.monotonic() + window_s + 120
            while not all(lv.done for lv in lives):
                flight.pump(lives)
                if window is not None and (time.monotonic() >= gpm_end or any(lv.done for lv in lives)):
                    group.gpm, window = window.stop(), None
                if time.monotonic() > grace:
                    for lv in lives:
                        if not lv.done:
                            lv.fail("timeout", f"still running {window_s + 120:g} s after the start")
                    break
                time.sleep(0.01)
        finally:
            if window is not None:
                group.gpm = window.stop()
                group.gpm_note = group.gpm_note or window.note
            if sampler is not None:
                sampler.stop()
        if sink:
            group.telemetry = telemetry.summarize(sink)
            group.memory_used_mib = group.telemetry.get("mem_used_mib_max")

    # -- what users ask -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _workers(self, mps: bool):
        """A barrier folder, gpuvs's MPS daemon if asked, and the Flight that launches the workers; on every way
        out, each worker is stopped and stored, the daemon stopped and the folder removed."""
        folder = tempfile.mkdtemp(prefix="gpuvs-barrier-")
        daemon = MpsDaemon() if mps else None
        try:
            if daemon is not None:
                daemon.start()
            with Flight(self.runner) as flight:  # any way out: every worker is stopped and committed
                yield folder, daemon, flight
        finally:
            if daemon is not None:
                daemon.stop()
            shutil.rmtree(folder, ignore_errors=True)

    def group(self, specs: list[RunSpec], label: str, mps: bool, client_env: list[dict[str, str]] | None = None,
              gpm_window: bool = False, window_s: float | None = None) -> Group:
        """Start every spec, wait until all are warmed up at the barrier, measure one window. client_env:
        per worker, MPS client settings; gpm_window: read NVML GPM over the window (solo runs); window_s:
        this group's window (advise-mps's calibrated one), else the coordinator's."""
        window_s = window_s or self.window_s
        group = Group(label=label, mps=mps, window_s=window_s)
        with self._workers(mps) as (folder, daemon, flight):
            lives = flight.live
            ws = [worker_spec(s, folder, f"w{i}", window_s, label, i, daemon,
                              (client_env or [])[i] if client_env and i < len(client_env) else None)
                  for i, s in enumerate(specs)]
            for spec in ws:
                flight.launch(spec)
            bad = self._wait_ready(flight, folder, len(lives))
            if bad is not None:
                group.failure = f"worker {bad.result.spec.trial} failed before the start: {bad.result.error}"
                for lv in lives:
                    if not lv.done:
                        lv.fail("stopped", "stopped: another worker of its group failed before the start")
            else:
                self._run_window(group, flight, folder, daemon, gpm_window, window_s)
        group.trials = [lv.result for lv in lives]
        return group

    def capacity(self, spec: RunSpec, max_workers: int, mps: bool = False, label: str = "capacity",
                 client_env: dict[str, str] | None = None) -> CapacityRun:
        """The co-location study: add instances one at a time; each starts its timed loop as soon as it is
        warmed up and keeps running. After each one is added, measure every running instance over one
        window (GPU memory, per-instance rate, aggregate). Stop at the first instance that fails (to start
        or while running) or at max_workers; then every instance is told to stop and is stored."""
        run = CapacityRun(label=label, mps=mps)
        with self._workers(mps) as (folder, daemon, flight):
            lives = flight.live
            barrier.release(folder, delay_s=0.0)  # open-ended: each starts once ready, ends at the stop file
            for i in range(max_workers):
                flight.launch(worker_spec(spec, folder, f"w{i:03d}", 0, label, i, daemon, client_env))
                bad = self._wait_ready(flight, folder, len(lives))
                if bad is not None:
                    run.failed_at, run.failure = bad.result.spec.trial + 1, bad.result.error
                    self.say(f"instance {i + 1} failed: {bad.result.error}")
                    break
                step = self._capacity_window(flight, i + 1, daemon)
                run.steps.append(step)
                if step.failure:
                    run.failed_at, run.failure = i + 1, step.failure
                    self.say(f"with {i + 1} instances: {step.failure}")
                    break
                ms = [1e3 / r for r in step.rates if r]
                self.say(f"{i + 1} instance{'s' if i else ''}: GPU memory {step.memory_used_mib or 0:.0f} MiB, "
                         f"{sum(ms) / len(ms):.2f} ms per step per instance (mean), {step.aggregate:.4g} {step.unit} "
                         f"in all" + (f", {step.clients_attached} MPS clients" if step.clients_attached is not None else ""))
            barrier.stop(folder)
            deadline = time.monotonic() + 60
            while not all(lv.done for lv in lives) and time.monotonic() < deadline:
                flight.pump(lives)
                time.sleep(0.02)
        run.trials = [lv.result for lv in lives]
        return run

    def _capacity_window(self, flight: Flight, count: int, daemon: MpsDaemon | None) -> CapacityStep:
        lives = flight.live
        flight.pump(lives)
        time.sleep(min(0.5, self.window_s / 4))  # the newest instance's first steps are not the window's
        flight.pump(lives)
        marks = [len(lv.result.samples) for lv in lives]
        sink: list[dict[str, Any]] = []
        sampler = self._sampler(lives[0].result.spec, sink)
        end = time.monotonic() + self.window_s
        try:
            while time.monotonic() < end and not any(lv.done for lv in lives):
                flight.pump(lives)
                time.sleep(0.01)
        finally:
            if sampler is not None:
                sampler.stop()
        step = CapacityStep(count=count)
        if sink:
            step.memory_used_mib = telemetry.summarize(sink).get("mem_used_mib_max")
        if daemon is not None:
            step.clients_attached = daemon.clients()
        ended = [lv for lv in lives if lv.done]
        if ended:
            lv = ended[0]
            step.failure = f"instance {lv.result.spec.trial + 1} ended while {count} ran: {lv.result.error or lv.result.status}"
            return step
        for lv, mark in zip(lives, marks):
            got = window_rate(lv.result.samples[mark:], workloads.get(lv.result.spec.workload).declared)
            if got is None:
                step.failure = (f"instance {lv.result.spec.trial + 1} finished no step in the {self.window_s:g} s window "
                                "(make --duration longer than one step)")
                return step
            step.rates.append(got[0])
            step.unit = got[1]
        return step


@dataclass
class CapacityStep:
    """One count of a capacity sweep: every running instance measured over the same window."""

    count: int
    rates: list[float] = field(default_factory=list)
    unit: str = ""
    memory_used_mib: float | None = None
    clients_attached: int | None = None
    failure: str | None = None

    @property
    def aggregate(self) -> float | None:
        return sum(self.rates) if self.rates and not self.failure else None


@dataclass
class CapacityRun:
    label: str
    mps: bool
    steps: list[CapacityStep] = field(default_factory=list)
    failed_at: int | None = None  # the instance (1-based) that failed first, if any
    failure: str | None = None  # its cause
    trials: list[TrialResult] = field(default_factory=list)

    def measured(self) -> list[CapacityStep]:
        return [s for s in self.steps if s.failure is None]


def gpu_memory_total_mib(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    from gpuvs.probes import fingerprint

    info = fingerprint.nvml_info()
    idx = telemetry.visible_gpu_indices(device, 1)[0]
    gpu = next((g for g in info.get("gpus") or [] if g["index"] == idx), None)  # NVML's index, not a position
    return gpu["memory_mib"] if gpu else None


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
