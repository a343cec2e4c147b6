"""An Environment starts a worker somewhere and streams its protocol lines back. It owns clean-up:
nothing it started outlives the run, on success, failure, timeout or Ctrl-C."""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, ClassVar, Iterator

import gpuvs
from gpuvs.spec import RunSpec


def package_root() -> str:
    """The directory that holds the gpuvs package: put it on PYTHONPATH and `python -m gpuvs.worker` works."""
    return str(Path(gpuvs.__file__).resolve().parent.parent)


class Launched:
    """A running worker: its protocol lines (through a queue, so reads can time out), its stderr
    tail, and a kill that takes every process it started with it."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None,
                 on_kill: Callable[[], None] | None = None, cwd: str | None = None):
        self.argv = argv
        self.on_kill = on_kill
        self.started_at = time.time()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, cwd=cwd, text=True, bufsize=1, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=60)
        self._threads = [threading.Thread(target=self._pump_out, daemon=True),
                         threading.Thread(target=self._pump_err, daemon=True)]
        for t in self._threads:
            t.start()
        self._killed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
            self.observe(line)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # output closed, process alive: the runner's wait reports it
            code = None
        if code is not None:
            for line in self.after_exit(code):
                self.lines.put(line)
        self.lines.put(None)

    def observe(self, line: str) -> None:
        """Called with every line of the worker's standard output (launchers may watch for events)."""

    def after_exit(self, code: int) -> list[str]:
        """Protocol lines added once the process has exited: the total wall time of the trial's process,
        launch to exit (what a user waits for a short job, start-up and teardown included)."""
        from gpuvs import events

        return [events.encode(events.startup("launch_to_exit_s", time.time() - self.started_at)) + "\n"]

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip("\n"))

    def read(self, deadline: float | None) -> Iterator[str]:
        """Protocol lines until EOF; raises TimeoutError once the deadline (time.monotonic) passes."""
        while True:
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError from None
            if line is None:
                return
            yield line

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=2)
        return code

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after a grace period, then the launcher's own
        clean-up (a container's removal, say). Safe to call more than once."""
        if self._killed:
            return
        self._killed = True
        try:
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        finally:
            if self.on_kill:
                self.on_kill()

    def close(self) -> None:
        """After a normal exit: make sure no process of the group is left."""
        _signal_group(self.proc.pid, signal.SIGKILL)
        if self.on_kill:
            self.on_kill()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Environment:
    kind: ClassVar[str]

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})

    def check(self, spec: RunSpec) -> None:
        """Refuse a spec this environment cannot run, before anything starts (raise GpuvsError)."""

    def launch(self, spec: RunSpec) -> Launched:
        raise NotImplementedError

    def describe(self) -> str:
        return self.kind
