"""Bare mode's side of the environments: a command run as an environment's own process, without gpuvs's worker.

Each kind that can run a command bare returns a RawJob from `Environment.start_bare()`.
gpuvs.workloads.command.bare turns it into the trial's protocol events.
Everything a RawJob gives is seen from outside the job."""

from __future__ import annotations

import collections
import os
import select
import subprocess
import threading
import time
from typing import Any

from gpuvs import pipequeue, spawn

AFTER_EXIT_S = 2.0  # after the process's exit, a pipe found empty and still open this long is held by another
# process (a child it left): the output ends there, and the trial fails saying so


class RawJob:
    streams: tuple[str, ...] = ("stdout", "stderr")
    # what could not be measured, since gpuvs is not inside (said in the trial's configuration and fingerprint)
    unmeasured = ("no fingerprint taken inside (the image has no Python for gpuvs's worker), no NVML telemetry "
                  "during the run, no start-up breakdown inside the job")

    def __init__(self) -> None:
        # (stream, bytes, arrival time) as the job prints, None once its output has ended; never makes a reader wait
        self.output = pipequeue.SpillQueue()
        self.launched_at = time.time()
        self.held: list[str] = []  # streams a process the job left still held open when its output was ended

    def blocked(self) -> tuple[int, float]:
        """(reads that found a pipe full, the time the job may have waited on its pipes)."""
        return 0, 0.0

    def running(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status (-N: killed by signal N; None: unknown)."""
        raise NotImplementedError

    def timings(self) -> dict[str, Any]:
        """{"wall_s": seconds or None, "clock": where it came from, "resolution_s": its resolution,
        "startup": {stage: seconds from launch}}."""
        return {"wall_s": None, "clock": "not measured", "resolution_s": None, "startup": {}}

    def facts(self) -> dict[str, Any]:
        """What could be read about where it ran without running anything in it (a fingerprint)."""
        return {}

    def failure(self, code: int | None) -> tuple[str, str] | None:
        """The environment's own reason when the job could not run or was stopped from outside."""
        return None

    def events(self) -> list[dict[str, Any]]:
        """Protocol events the environment reports itself (a pod's start-up breakdown)."""
        return []

    def program(self, argv: list[str]) -> dict[str, Any] | None:
        """What the command ran, read from outside once it ended (probes/program.py); None where its files cannot."""
        return None

    def kill(self) -> None:
        """Stop it: nothing it started is left."""
        raise NotImplementedError

    def close(self) -> None:
        """Clean up after it: nothing it started is left."""
        raise NotImplementedError


class RawProcess(RawJob):
    """A process of this machine (the job itself on the host, or an engine's client whose output is the
    container's), in its own process group: its exit time is taken by a thread that waits for it, and a kill
    takes its whole group."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None):
        super().__init__()
        self.argv = argv
        self._killed = False
        self.proc = self.start(argv, env, cwd)
        try:  # interrupted before the caller holds this object: nobody else could stop the group
            self.started = time.perf_counter()
            self.started_at = time.time()  # the job started (a keeper's popen returns once it has)
            self.exited: float | None = None  # perf_counter at its exit
            self._open = 2
            self._lock = threading.Lock()
            self._reading: dict[str, bool] = {"stdout": True, "stderr": True}  # False once a pipe ended
            self.stderr_tail: collections.deque[str] = collections.deque(maxlen=8)  # an engine's own message
            self._waiter = threading.Thread(target=self._wait_exit, daemon=True)
            self._stderr_rest = b""
            self._waiter.start()
            self._pumps = [pipequeue.Pump(s, getattr(self.proc, s).fileno(), self.output,
                                          on_data=self._seen if s == "stderr" else None,
                                          on_end=lambda s=s: self._pipe_ended(s)) for s in ("stdout", "stderr")]
        except BaseException:
            self.kill(grace_s=0.0)
            raise

    def start(self, argv: list[str], env: dict[str, str] | None, cwd: str | None) -> Any:
        return spawn.group_popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, cwd=cwd)

    def _wait_exit(self) -> None:
        self.proc.wait()
        self.exited = time.perf_counter()
        self.after_exit(self.proc.returncode)
        quiet_since = time.monotonic()
        while True:  # read to the end of both pipes, however long the reading takes
            with self._lock:
                if self._open <= 0:
                    return
            open_pipes = {s: getattr(self.proc, s) for s in ("stdout", "stderr") if self._reading[s]}
            if any(readable(p) for p in open_pipes.values()):  # data (or its end) waits: it is being read
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= AFTER_EXIT_S:  # empty and open this long: a child left behind
                self.held = sorted(open_pipes)  # holds it; the output ends here (the child is stopped by close())
                self._end()
                return
            time.sleep(0.05)

    def after_exit(self, code: int) -> None:
        """Called once the process has exited, before its output is declared ended (read its state)."""

    def blocked(self) -> tuple[int, float]:
        return pipequeue.blocked(self._pumps, self.output)

    def _seen(self, data: bytes) -> None:
        """stderr's last lines, for an engine's own message (a line's first 4 KiB)."""
        *lines, rest = (self._stderr_rest + data).split(b"\n")
        self._stderr_rest = rest[-4096:]
        for raw in lines[-8:]:
            self.stderr_tail.append(raw[:4096].decode("utf-8", "backslashreplace").strip())

    def _pipe_ended(self, stream: str) -> None:
        if stream == "stderr" and self._stderr_rest:
            self.stderr_tail.append(self._stderr_rest.decode("utf-8", "backslashreplace").strip())
        self._reading[stream] = False
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last:
            self._waiter.join()  # the exit status first (a container's state is read then)
            self._end()

    def _end(self) -> None:
        with self._lock:
            if self._open < 0:
                return
            self._open = -1
        self.output.put(None)

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._waiter.join(timeout=10)
        return self.proc.returncode

    def wall_s(self) -> float | None:
        return None if self.exited is None else self.exited - self.started

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM to the whole group, SIGKILL after a grace period. Safe to call more than once."""
        if self._killed:
            return
        self._killed = True
        spawn.end_group(self.proc, grace_s)

    def close(self) -> None:
        """After its exit: nothing of its group is left (a child it started in the background)."""
        spawn.kill_group(self.proc.pid)


def readable(pipe) -> bool:
    """Whether a read of the pipe would return now (data, or its end); a closed file counts as ended."""
    try:
        return bool(select.select([pipe], [], [], 0)[0])
    except (ValueError, OSError):
        return True


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a job it starts itself, without gpuvs's own variables, with the user's
    (--env-var) and unbuffered Python output (so that a Python job's figures arrive as printed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUVS_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class HostJob(RawProcess):
    """Bare mode on the host: the command as gpuvs's own child (no worker between them), under a keeper
    (contain.py) that ends its whole tree, daemons included, at its exit, at a stop, and when gpuvs is gone."""

    unmeasured = ("the job ran as gpuvs's own child on this host: no worker beside it, so no NVML telemetry during "
                  "the run and no start-up breakdown; the fingerprint is this host's, taken by gpuvs")

    def __init__(self, argv: list[str], workdir: str | None, extra_env: dict[str, str]):
        from gpuvs.errors import EnvironmentUnavailable

        self.workdir = os.path.abspath(workdir or os.getcwd())
        self.env = job_env(extra_env)
        try:
            super().__init__(argv, env=self.env, cwd=workdir)
        except FileNotFoundError:
            raise EnvironmentUnavailable(f"the command's executable {argv[0]!r} is not here (or its working "
                                         f"directory {workdir} is missing)") from None
        except PermissionError as exc:
            raise EnvironmentUnavailable(f"the command's executable {argv[0]!r} cannot be run: {exc.strerror}") from None

    def start(self, argv: list[str], env: dict[str, str] | None, cwd: str | None) -> Any:
        from gpuvs import contain

        return contain.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM to the job's whole tree, SIGKILL after a grace period. Safe to call more than once."""
        if self._killed:
            return
        self._killed = True
        self.proc.stop(grace_s)

    def close(self) -> None:
        """After its exit: until what it left running has ended."""
        self.proc.close()

    def events(self) -> list[dict[str, Any]]:
        from gpuvs import events

        return [events.config(containment=self.proc.containment)]

    def program(self, argv: list[str]) -> dict[str, Any] | None:
        from gpuvs.probes import program

        return program.describe(argv, self.workdir, self.env)

    def wall_s(self) -> float | None:
        """The keeper's clock, from its fork of the job to reaping it (gpuvs's, where the keeper never said)."""
        return self.proc.wall_s if self.proc.wall_s is not None else super().wall_s()

    def timings(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s(), "clock": "the keeper's clock, from its fork of the process to its exit",
                "resolution_s": 0.001, "startup": {"job_start_s": max(0.0, self.started_at - self.launched_at)}}

    def facts(self) -> dict[str, Any]:
        from gpuvs.probes import fingerprint

        fp = fingerprint.take(import_torch=False)
        fp["taken_by"] = "gpuvs, on this host (bare: beside the job, not inside it)"
        return fp
