"""The bare host: the worker is a child process of gpuvs, in its own process group."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from gpuvs.environments import register
from gpuvs.environments.environment import Environment, Launched, check_local_gpus, package_root
from gpuvs.params import Param
from gpuvs.spec import RunSpec

ENV_VAR = Param("env_var", str, None, "environment variable KEY=VALUE for the worker", multiple=True)


def worker_env(spec: RunSpec, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["GPUVS_SPEC"] = spec.to_json()
    env["GPUVS_PARENT_PID"] = str(os.getpid())  # the worker's group dies with gpuvs, even a SIGKILLed one
    env.update(extra or {})
    return env


def env_vars(items: list[str] | None, option: str = "--env-var") -> dict[str, str]:
    """KEY=VALUE items as a dict; UsageError for an item without a key."""
    from gpuvs.errors import UsageError

    out = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise UsageError(f"{option} wants KEY=VALUE, got {item!r}")
        if key == "GPUVS_SPEC":
            raise UsageError(f"{option} GPUVS_SPEC: gpuvs sets the run spec itself")
        out[key] = value
    return out


@dataclass(frozen=True)
class HostSettings:
    """The host's options, checked: the interpreter that runs the worker and the worker's extra variables."""

    python: str
    env_vars: dict[str, str]


@register
class HostEnvironment(Environment):
    kind = "host"
    summary = "a child process of gpuvs on this machine"
    noun = "the host"
    rank = 0
    params = (ENV_VAR,)
    internal_keys = ("mps",)  # gpuvs share: its MPS daemon's pipe folder (the client env is in env_var)
    runs_bare = True
    forks = True
    forks_by_default = True

    @classmethod
    def parse_settings(cls, options: dict[str, Any]) -> HostSettings:
        return HostSettings(python=options.get("python") or sys.executable, env_vars=env_vars(options.get("env_var")))

    def check(self, spec: RunSpec) -> None:
        self.settings  # noqa: B018  (refuses a bad --env-var before anything starts)
        check_local_gpus(spec)

    def launch(self, spec: RunSpec) -> Launched:
        spec.launched_at = time.time()
        return Launched([self.settings.python, "-m", "gpuvs.trial.worker"], env=worker_env(spec, self.settings.env_vars))

    def start_bare(self, spec: RunSpec, argv: list[str], workdir: str | None):
        """The command as gpuvs's own child, in its own process group (bare mode on the host: the same machine)."""
        from gpuvs.environments.rawjob import HostJob

        return HostJob(argv, workdir, self.settings.env_vars)

    def missing_executable(self, spec: RunSpec, name: str, workdir: str | None) -> str | None:
        path = self.settings.env_vars.get("PATH", os.environ.get("PATH", ""))
        if os.sep in name:
            full = os.path.join(workdir or os.getcwd(), name)
            if not (os.path.isfile(full) and os.access(full, os.X_OK)):
                return f"the command's executable {name} is not an executable file here (from {workdir or os.getcwd()})"
            return None
        if shutil.which(name, path=path) is None:
            return f"the command's executable {name!r} is not on this host's PATH ({path})"
        return None

    def start_zygote(self, spec: RunSpec, args: list[str], folder: str) -> Launched:
        env = worker_env(spec, self.settings.env_vars)
        env.pop("GPUVS_SPEC")  # each child gets its own with its fork request
        return Launched([self.settings.python, "-m", "gpuvs.trial.zygote", *args, "--entry", "worker"], env=env)

    def doctor(self, spec: RunSpec, report, timeout: float) -> dict[str, Any] | None:
        probe_spec = RunSpec(workload="selftest")
        try:
            r = subprocess.run([sys.executable, "-m", "gpuvs.trial.inside", "--probe"], capture_output=True, text=True,
                               timeout=timeout, env=worker_env(probe_spec))
            probe = json.loads(r.stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            report.add("start a process", "FAIL", f"{sys.executable} -m gpuvs.trial.inside --probe: {exc}")
            return None
        report.add("start a process", "ok", f"Python {probe['python']} at {probe['executable']}")
        return probe
