"""The bare host: the worker is a child process of gpuvs, in its own process group."""

from __future__ import annotations

import os
import sys
import time

from gpuvs.environments.base import Environment, Launched, package_root
from gpuvs.spec import RunSpec


def worker_env(spec: RunSpec, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["GPUVS_SPEC"] = spec.to_json()
    env.update(extra or {})
    return env


class HostEnvironment(Environment):
    kind = "host"

    def launch(self, spec: RunSpec) -> Launched:
        spec.launched_at = time.time()
        python = self.options.get("python") or sys.executable
        extra = dict(item.split("=", 1) for item in self.options.get("env_var") or [])
        return Launched([python, "-m", "gpuvs.worker"], env=worker_env(spec, extra))
