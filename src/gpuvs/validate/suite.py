"""A validation run: its settings, one result row per check, and the suite that runs the checks one by one.

Each check has its own timeout; each row goes to `record` as soon as it is known (the store keeps it).
Everything the run started is deleted, whatever happens: a failed check, a timeout, Ctrl-C, SIGTERM."""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpuvs.kube.client import Cluster, api_message
from gpuvs.validate.probe import Pods, Timeout

PASS, FAIL, NOT_RUN = "pass", "FAIL", "not run"
# a finding, not a failure: pods share physical GPUs because the node advertises more GPUs than it has (a device
# plugin's replicas: time-slicing, MPS); under --exclusive the same rows FAIL
SHARED = "shared"
STATUSES = (PASS, SHARED, FAIL, NOT_RUN)

# Figures a row may carry, and which way is better (every one is a duration here).
FIGURES = {"seconds": ("s", "lower"), "recovery_s": ("s", "lower")}


@dataclass
class Settings:
    image: str
    pull: str = "IfNotPresent"
    resource: str = "nvidia.com/gpu"
    node: str | None = None
    timeout: float = 120.0  # per check
    disruptive: bool = False
    restart_plugin_cmd: str | None = None
    restart_kubelet_cmd: str | None = None
    stop_apiserver_cmd: str | None = None
    start_apiserver_cmd: str | None = None
    outage_s: float = 10.0
    command_timeout: float = 120.0
    exclusive: bool = False  # GPUs must not be shared between pods: sharing FAILs instead of being a finding
    max_gpu_pods: int = 8  # the most one-GPU pods run at once on a node ("several GPU pods")
    job_workload: str = "spin"  # what the GPU job beside the CPU service runs (gpuvs's worker)
    job_params: dict[str, str] = field(default_factory=dict)
    pod_security: str = "baseline"  # the pods' security context: baseline or restricted (runAsNonRoot too)


@dataclass
class Row:
    """One check's result. seconds: how long the check took; recovery_s (availability): from the disruption's
    command to the cluster back as before (lower is better for both)."""

    suite: str
    check: str
    status: str  # pass | shared | FAIL | not run
    detail: str
    seconds: float | None = None
    recovery_s: float | None = None
    observed: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        return cls(**{k: d.get(k) for k in ("suite", "check", "status", "detail", "seconds", "recovery_s")},
                   observed=d.get("observed") or {})


@dataclass
class Outcome:
    """What a check's body may return when its row is not a plain pass (status SHARED: a finding)."""

    detail: str
    observed: dict[str, Any] = field(default_factory=dict)
    status: str = PASS


class CheckFailed(Exception):
    """A check saw something wrong: the message is the row's detail."""


class CommandFailed(CheckFailed):
    pass


def run_command(what: str, command: str, timeout: float) -> float:
    """A user-given command (split like a shell would, run without one); its duration in seconds."""
    t0 = time.monotonic()
    try:
        r = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CommandFailed(f"{what} command ran past {timeout:g} s: {command}") from None
    except OSError as exc:
        raise CommandFailed(f"{what} command could not start ({exc.strerror}): {command}") from None
    if r.returncode != 0:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or [""]
        raise CommandFailed(f"{what} command exited {r.returncode}: {command}: {last[0][:300]}")
    return time.monotonic() - t0


@dataclass
class Suite:
    cluster: Cluster
    settings: Settings
    pods: Pods
    record: Callable[[Row], None]
    rows: list[Row] = field(default_factory=list)
    # commands that must run before the run ends whatever happens (an API server stopped by a check)
    restore: list[tuple[str, str]] = field(default_factory=list)
    package_used: bool = False  # a pod ran gpuvs's worker from the package ConfigMap: released at clean-up

    def check(self, suite: str, name: str, body: Callable[[], Outcome | tuple[str, dict[str, Any]] | str],
              timeout: float | None = None) -> Row:
        """Run one check: body() returns its detail (and what it observed), or an Outcome with its status, or
        raises CheckFailed / Timeout."""
        t0 = time.monotonic()
        observed: dict[str, Any] = {}
        try:
            got = body()
            if isinstance(got, Outcome):
                detail, observed, status = got.detail, dict(got.observed), got.status
            else:
                detail, observed = got if isinstance(got, tuple) else (got, {})
                status = PASS
        except (CheckFailed, Timeout) as exc:
            status, detail = FAIL, str(exc)
        except Exception as exc:  # an API error mid-check is that check's failure, not the run's end
            status, detail = FAIL, f"{type(exc).__name__}: {api_message(exc)}"
        row = Row(suite, name, status, detail, round(time.monotonic() - t0, 3),
                  observed.pop("recovery_s", None), observed)
        return self.add(row)

    def skip(self, suite: str, name: str, why: str) -> Row:
        return self.add(Row(suite, name, NOT_RUN, why))

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        self.record(row)
        return row

    def clean_up(self) -> list[str]:
        """Run the pending restore commands, then delete every pod of this run and wait until none is left;
        release gpuvs's package ConfigMap if a pod used it (deleted unless another run still marks it)."""
        problems = []
        while self.restore:
            what, command = self.restore.pop()
            try:
                run_command(what, command, self.settings.command_timeout)
            except CommandFailed as exc:
                problems.append(str(exc))
        left = self.pods.delete_all(max(30.0, self.settings.timeout))
        if left:
            problems.append(f"pods left behind: {', '.join(left)}")
        if self.package_used:
            from gpuvs.kube import package

            package.release()
        return problems


def checked(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)

