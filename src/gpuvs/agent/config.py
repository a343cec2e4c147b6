"""The agent's settings, checked before anything starts (bad input: one line, exit 2)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gpuvs.errors import UsageError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
MAX_DURATION_S = 365 * 86400.0  # the longest duration an agent setting takes
_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")


def duration(option: str, text: str | float) -> float:
    """'90', '90s', '15m', '6h', '1d' as seconds, at most a year: 400 digits read as inf (a --min-interval of inf
    made every POST /runs fail), and no agent setting means more than a year."""
    shown = str(text).strip()
    shown = repr(shown if len(shown) <= 40 else shown[:40] + "...")
    m = _DURATION.match(str(text).strip())
    if not m:
        raise UsageError(f"--{option} {shown}: expected a duration like 90s, 15m, 6h or 1d (seconds if no unit)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise UsageError(f"--{option} {shown}: at most 365d (a year); expected a duration like 90s, 15m, 6h or 1d "
                         "(seconds if no unit)")
    return seconds


@dataclass(frozen=True)
class WorkloadSpec:
    """One --workload: a gpuvs workload and the options its fleet is run with (KEY=VALUE → --KEY VALUE)."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> WorkloadSpec:
        from gpuvs import workloads

        name, _, rest = str(text).partition(":")
        name = name.strip()
        try:
            workloads.get(name)
        except UsageError as exc:
            raise UsageError(f"--workload {text!r}: {exc}") from None
        options = []
        for item in [i for i in rest.split(",") if i.strip()]:
            key, eq, value = item.strip().partition("=")
            if not eq or not _KEY.match(key):
                raise UsageError(f"--workload {text!r}: expected NAME[:KEY=VALUE,...] (KEY a fleet option without "
                                 f"its dashes, e.g. spin:steps=10,ops=3000000), got {item.strip()!r}")
            options.append((key, value))
        spec = cls(name, tuple(options))
        spec.pair_plan()  # pairs=true and its options checked here: bad input is one line at start
        return spec

    def pair_plan(self) -> Any:
        """With pairs=true (`gpuvs fleet collective --pairs`): the pair fleet's plan (fleet.pairs.PairPlan) from
        partners= and second-pass=; None for a fleet of nodes. A pair option without pairs=true, or pairs of
        another workload than the collective, is one line."""
        from gpuvs.fleet.execute import pair_plan as pairs

        params = {p.name: p for p in pairs.PARAMS}
        given = {}
        for key, value in self.options:
            k = key.replace("-", "_")
            if k in params:
                try:
                    given[k] = params[k].coerce(value)
                except UsageError as exc:
                    raise UsageError(f"--workload {self}: {exc}") from None
        if not given.get("pairs"):
            if set(given) - {"pairs"}:
                raise UsageError(f"--workload {self}: {', '.join(sorted(set(given) - {'pairs'}))} applies with "
                                 "pairs=true")
            return None
        why = pairs.workload_refused(self.name)
        if why:
            raise UsageError(f"--workload {self}: pairs=true {why}")
        return pairs.PairPlan(partners=given.get("partners", params["partners"].default),
                              second=given.get("second_pass", params["second_pass"].default))

    def argv(self) -> list[str]:
        return [a for k, v in self.options for a in (f"--{k}", v)]

    def __str__(self) -> str:
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in self.options) if self.options else "")


# What the agent runs where no --workload is given: the driver-only GPU check where the nodes advertise GPUs (it needs
# nothing but the driver's libcuda.so.1, so it runs in gpuvs's own image), CPU arithmetic where none do
GPU_DEFAULT = WorkloadSpec("gpu-check", (("device", "cuda"),))
CPU_DEFAULT = WorkloadSpec("spin")


@dataclass
class AgentConfig:
    store: str = "gpuvs.db"
    host: str = "0.0.0.0"
    port: int = 8080
    every_s: float = 6 * 3600.0
    first_after_s: float = 300.0
    workloads: list[WorkloadSpec] = field(default_factory=list)  # none: the default by node (workloads_for)
    device: str = "cpu"
    image: str | None = None  # None: the agent's own image (read from its own pod)
    pull_policy: str = "IfNotPresent"
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    priority_class: str = "gpuvs-trial"
    pod_security: str = "restricted"  # the agent's own image runs as uid 10001
    package: str = "configmap"
    python: str = "python3"
    trials: int = 4
    max_trials: int | None = None
    margin: float = 0.05
    parallel: int = 4
    validate: bool = True
    hold_timeout_s: float = 20.0
    run_timeout_s: float = 3600.0
    stale_after_s: float | None = None  # None: twice --every
    backoff_max_s: float = 300.0
    token_file: str | None = None  # the bearer token POST /runs needs (auth.py); None: POST /runs is refused
    min_interval_s: float = 120.0  # a run asked for through the API starts at least this long after the last ended
    http_timeout_s: float = 10.0  # the most one HTTP connection may take, from accept to close
    condition: bool = False  # the NodeCondition GpuvsPerformance and Events on the nodes (deploy --condition)
    taint: bool = False  # gpuvs.io/slow on the nodes found slower, with the circuit breaker (fleet/cluster/taints.py)
    taint_effect: str = "NoSchedule"
    taint_max_share: float = 0.1

    def workloads_for(self, has_gpus: bool) -> list[WorkloadSpec]:
        """The --workload list, or where none was given the default: gpu-check on the GPU where the nodes advertise
        GPUs (--gpu-resource allocatable), spin on the CPU where none do."""
        return list(self.workloads) or [GPU_DEFAULT if has_gpus else CPU_DEFAULT]

    def describe_workloads(self) -> str:
        return ", ".join(map(str, self.workloads)) or (f"{GPU_DEFAULT.name} where nodes advertise {self.gpu_resource}, "
                                                       f"else {CPU_DEFAULT.name}")

    def stale_after(self) -> float:
        return self.stale_after_s if self.stale_after_s is not None else 2 * self.every_s

    def check(self) -> None:
        if self.every_s < 10:
            raise UsageError(f"--every {self.every_s:g} s: at least 10 s")
        if not 0 < self.port < 65536:
            raise UsageError(f"--listen port {self.port}: expected 1-65535")
        if self.max_trials is not None and self.max_trials < self.trials:
            raise UsageError(f"--max-trials {self.max_trials} is below --trials {self.trials}")
        if self.min_interval_s < 10:
            raise UsageError(f"--min-interval {self.min_interval_s:g} s: at least 10 s")
        if not 1 <= self.http_timeout_s <= 300:
            raise UsageError(f"--http-timeout {self.http_timeout_s:g}: expected 1 to 300 seconds")
        if not 0 < self.taint_max_share <= 1:
            raise UsageError(f"--taint-max-share {self.taint_max_share:g}: expected a share above 0 and at most 1 "
                             "(leave --taint out to taint nothing)")


def listen(text: str) -> tuple[str, int]:
    """HOST:PORT or :PORT or PORT."""
    host, sep, port = str(text).rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, :PORT or PORT") from None
    return (host or "0.0.0.0") if sep else "0.0.0.0", number
