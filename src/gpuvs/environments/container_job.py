"""Bare mode in a container: the command is the container's own process (an image with no Python).

The engine's client runs attached, in its own process group, and relays the container's output as it is printed.
The container is not started with --rm: once it exits, the engine's record gives the job's times and fate.
Then it is removed. A kill stops the client's group and removes the container (`rm -f`), whatever the client did."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timezone
from typing import Any

from gpuvs.environments.rawjob import RawProcess
from gpuvs.spec import RunSpec

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?")
_NOT_FOUND = ("executable file not found", "no such file or directory", "not found in $path", "permission denied")


def engine_time(text: str | None) -> float | None:
    """An engine's RFC 3339 time (nanoseconds, Z or an offset) as seconds since the epoch; None for the zero time
    (0001-01-01: the container never started) or anything unreadable."""
    m = _STAMP.match((text or "").strip())
    if m is None or m.group(1).startswith("0001"):
        return None
    base = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    tz = m.group(3) or "Z"
    if tz == "Z":
        base = base.replace(tzinfo=timezone.utc)
    else:
        sign = 1 if tz[0] == "+" else -1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        from datetime import timedelta

        base = base.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
    frac = m.group(2) or ""
    return base.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


class ContainerJob(RawProcess):
    """A container whose own process is the command."""

    unmeasured = ("the command is the container's own process (no Python needed in the image): no fingerprint "
                  "taken inside, no NVML telemetry during the run, no start-up breakdown inside the job; its wall "
                  "time is the engine's record of the container's start and exit, its fingerprint the image's files "
                  "read from outside")

    def __init__(self, environment: Any, spec: RunSpec, argv: list[str], env: dict[str, str]):
        self.environment = environment
        self.name = environment.container_name(spec)
        self.state: dict[str, Any] = {}
        super().__init__(argv, env=env)
        self.launched_at = spec.launched_at or self.launched_at

    def after_exit(self, code: int) -> None:
        eng = self.environment.engine()
        try:
            r = eng.call("inspect", "--type", "container", "--format", "{{json .State}}", self.name, timeout=30)
            self.state = json.loads(r.stdout or "{}") if r.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.state = {}

    def timings(self) -> dict[str, Any]:
        started = engine_time(self.state.get("StartedAt"))
        finished = engine_time(self.state.get("FinishedAt"))
        engine = self.environment.engine().name
        if started is None or finished is None or finished < started:
            return {"wall_s": None, "clock": f"{engine}'s record of the container (not available)",
                    "resolution_s": None, "startup": {}}
        return {"wall_s": finished - started, "resolution_s": 1e-6,
                "clock": f"{engine}'s record of the container: State.StartedAt to State.FinishedAt",
                "startup": {"container_started_s": max(0.0, started - self.launched_at)}}

    def facts(self) -> dict[str, Any]:
        from gpuvs.environments import image_files

        s = self.environment.settings
        fp: dict[str, Any] = {"taken_by": "gpuvs, from outside the container (bare: the image's files and the "
                                          "engine's records, nothing run inside)",
                              "in_container": True, "container_image": s.image or f"rootfs:{s.rootfs}",
                              "engine": self.environment.engine().name}
        if s.image:
            fp.update(image_files.describe(self.environment.engine(), s.image))
        if s.cpus is not None:
            fp["cgroup_cpu_limit"] = s.cpus
        return fp

    def program(self, argv: list[str]) -> dict[str, Any] | None:
        """What the command ran, read from outside once the container has ended (before it is removed): argv[0] on
        the container's own PATH from its working directory, in its root (a --rootfs folder, or the stopped
        container's files, which podman as root mounts) and its bind mounts. Its --version is not run: a bare
        image runs nothing but the job."""
        from gpuvs.probes import program

        eng = self.environment.engine()
        s = self.environment.settings
        try:
            r = eng.call("inspect", "--type", "container", "--format", "{{json .Config}}", self.name, timeout=30)
            config = json.loads(r.stdout or "{}") if r.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, ValueError):
            config = {}
        env = dict(str(i).partition("=")[::2] for i in config.get("Env") or [])
        cwd = config.get("WorkingDir") or "/"
        mounts = [(m.split(":")[1], m.split(":")[0]) for m in s.mounts]
        if s.rootfs_dir:
            return program.describe(argv, cwd, env, with_version=False, root=program.Root(s.rootfs_dir, mounts))
        if eng.name != "podman" or eng.rootless:
            return {"argv0": argv[0], "workdir": cwd, "unresolved": f"{eng.name} as this user cannot show a stopped "
                    "container's files to gpuvs: what it ran is not known"}
        try:
            r = eng.call("mount", self.name, timeout=60)
            top = r.stdout.strip() if r.returncode == 0 else ""
            if not top:
                return {"argv0": argv[0], "workdir": cwd, "unresolved": "podman could not mount the stopped container"}
            return program.describe(argv, cwd, env, with_version=False, root=program.Root(top, mounts))
        except (OSError, subprocess.TimeoutExpired):
            return None
        finally:
            try:
                eng.call("unmount", self.name, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def failure(self, code: int | None) -> tuple[str, str] | None:
        if code in (None, 0):
            return None
        err = (self.state.get("Error") or "").strip()
        if self.state.get("OOMKilled"):
            limit = self.environment.settings.memory
            return "oom", "the container was killed by the kernel's out-of-memory killer" + (
                f" (its --memory {limit})" if limit else "")
        if code in (125, 126, 127) and engine_time(self.state.get("StartedAt")) is None or (
                code in (126, 127) and any(w in err.lower() for w in _NOT_FOUND)):
            said = " ".join(" ".join(ln for ln in self.stderr_tail if ln).split())[-400:]  # the engine's message
            what = err or said or f"the engine's exit status {code}"
            return ("unavailable", f"the command could not start in the container ({self.environment.settings.where()}"
                                   f"): {what}")
        return None

    def kill(self, grace_s: float = 3.0) -> None:
        try:
            super().kill(grace_s)
        finally:
            self.environment.remove(self.name)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.environment.remove(self.name)
