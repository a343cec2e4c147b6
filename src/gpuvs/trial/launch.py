"""How a trial's process starts: `--fresh exec` (a new worker process) or `--fresh fork` (a zygote's child).

The runner asks one Launcher for every trial; a zygote's child is a WorkerStream like any worker.
`--fresh auto` is decided once per experiment, for every arm alike (docs/trials.md).
Zygotes are keyed by environment and imports, started with the experiment and closed on every exit path."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any, Iterable

from gpuvs import environments, events, spawn, workloads
from gpuvs.trial import zygote
from gpuvs.environments.environment import WorkerStream
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.spec import RunSpec

MODES = ("auto", "exec", "fork")
FRESH = Param("fresh", str, "auto", "how each trial's process starts: exec (a new process, container or pod per "
              "trial), fork (a fresh child of a zygote that imported the framework once; host, and a container "
              "kept for the arm), auto (fork where every arm forks by default and the workload does not measure "
              "start-up, else exec)", choices=MODES)
REPLY_TIMEOUT_S = 60.0


class LaunchError(Exception):
    """A trial's process could not be started; `kind` as a worker's error kinds."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def check(spec: RunSpec) -> None:
    """Refuse a --fresh value that this spec's environment or workload cannot run, before anything starts."""
    mode = spec.fresh
    if mode not in MODES:
        raise UsageError(f"--fresh: {mode!r} is not allowed; expected one of {', '.join(MODES)}")
    if mode == "fork":
        cls = environments.kind(spec.env.kind)
        if not cls.forks:
            raise UsageError(f"--fresh fork: {cls.noun or cls.kind} {cls.fork_refusal}; use --fresh exec")


def resolve(specs: Iterable[RunSpec]) -> str:
    """What --fresh auto means for an experiment whose arms run these specs: one mode for every arm."""
    specs = list(specs)
    forks = all(environments.kind(s.env.kind).forks_by_default for s in specs)
    measured_start = any(not workloads.get(s.workload).fork_by_default for s in specs)
    return "fork" if specs and forks and not measured_start else "exec"


def key(spec: RunSpec) -> str:
    """What a zygote holds: the environment and the modules the workload imports."""
    wl = workloads.get(spec.workload)
    return json.dumps({"env": spec.env.kind, "options": spec.env.options, "imports": list(wl.imports(spec.params))},
                      sort_keys=True, default=str)


def exit_text(code: int | None) -> str:
    """A worker's end in words: a negative status is the signal that ended it (SIGKILL is what the
    kernel's out-of-memory killer sends, so say where to look)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's out-of-memory killer sends it: see `dmesg`)" if -code == signal.SIGKILL else ""
        return f"worker was killed by {name}{hint}"
    return f"worker exited with status {code}"


# -- one zygote, seen from gpuvs --------------------------------------------------------------------

class ZygoteHandle:
    """A zygote process (started by the spec's environment), its control socket, and the children it forked."""

    def __init__(self, spec: RunSpec):
        self.environment = environments.get(spec.env)
        self.folder = tempfile.mkdtemp(prefix="gpuvs-z-")
        path = self.path = os.path.join(self.folder, "s")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(1)
        self.listener.settimeout(0.2)
        self.spawned = time.monotonic()
        self.ready_s: float | None = None
        self.info: dict[str, Any] = {}
        self.sock: socket.socket | None = None
        self.dead = False
        self.closed = False
        self.direct = False  # its pids are this machine's: kill a child's group from here too
        self._send_lock = threading.Lock()
        self._replies: dict[str, queue.Queue] = {}
        self._workers: dict[str, ForkedWorker] = {}
        zspec = RunSpec.from_dict({**spec.to_dict(), "run_id": "z" + os.urandom(5).hex(), "launched_at": None})
        wl = workloads.get(spec.workload)
        args = ["--connect", path]
        for module in wl.imports(spec.params):
            args += ["--import", module]
        self.process = self.environment.start_zygote(zspec, args, self.folder)

    def wait_ready(self, timeout: float | None) -> None:
        """Until the zygote has imported everything and said so; LaunchError if it ends or takes too long."""
        if self.sock is not None:
            return
        if self.dead:
            raise LaunchError("crash", self.end_text())
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise LaunchError("timeout", f"the zygote did not start within {timeout:g} s")
                if not self.process.running():
                    raise LaunchError("unavailable", "the zygote ended before it was ready: " + self.end_text())
                try:
                    conn, _ = self.listener.accept()
                    break
                except socket.timeout:
                    continue
            conn.settimeout(None if deadline is None else max(1.0, deadline - time.monotonic()))
            message, fds = zygote.receive(conn)
            for fd in fds:
                os.close(fd)
            if not message or message.get("op") != "ready":
                raise LaunchError("crash", "the zygote did not say it was ready: " + self.end_text())
            conn.settimeout(None)
        except BaseException:
            self.close()
            raise
        self.info = message
        self.ready_s = time.monotonic() - self.spawned
        self.sock = conn
        self.direct = message.get("pid") == getattr(self.process, "pid", None)
        self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)  # connected: the path is no longer needed (nor left behind
        # by a gpuvs killed outright)
        threading.Thread(target=self._read, name="gpuvs-zygote", daemon=True).start()

    def end_text(self) -> str:
        """Why the zygote ended, in words: an error its environment reported, else its status and stderr."""
        for line in list(getattr(self.process.lines, "queue", [])):
            event = events.decode(line) if line else None
            if event and event["type"] == "error":
                return event["message"]
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        tail = " | ".join(list(self.process.stderr_tail)[-6:])
        return ("zygote " + exit_text(code).removeprefix("worker ") if code is not None else "the zygote stopped "
                "answering") + (f": {tail}" if tail else "")

    def _read(self) -> None:
        assert self.sock is not None
        try:
            while True:
                message, fds = zygote.receive(self.sock)
                for fd in fds:
                    os.close(fd)
                if message is None:
                    break
                rid = str(message.get("id"))
                if message.get("op") in ("forked", "refused") and rid in self._replies:
                    self._replies[rid].put(message)
                elif message.get("op") == "exit" and rid in self._workers:
                    self._workers.pop(rid)._exited(int(message["code"]))
        except (OSError, ValueError):
            pass
        finally:
            self.dead = True
            for q in list(self._replies.values()):
                q.put(None)
            for worker in list(self._workers.values()):
                worker._zygote_gone()

    def fork(self, spec: RunSpec) -> ForkedWorker:
        return ForkedWorker(self, spec)

    def request(self, worker: ForkedWorker, spec: RunSpec, fds: list[int]) -> dict[str, Any]:
        if self.dead or self.sock is None:
            raise LaunchError("crash", "the zygote is gone: " + self.end_text())
        rid = spec.run_id
        replies: queue.Queue = queue.Queue()
        self._replies[rid] = replies
        self._workers[rid] = worker
        try:
            with self._send_lock:
                zygote.send(self.sock, {"op": "fork", "id": rid, "spec": spec.to_json()}, fds)
            reply = replies.get(timeout=REPLY_TIMEOUT_S)
        except (OSError, queue.Empty):
            reply = None
        finally:
            self._replies.pop(rid, None)
        if reply is None or reply.get("op") != "forked":
            self._workers.pop(rid, None)
            raise LaunchError("crash", f"the zygote did not fork the trial: "
                                       f"{reply.get('error') if reply else self.end_text()}")
        return reply

    def signal(self, rid: str, sig: int) -> None:
        if self.sock is None or self.dead:
            return
        try:
            with self._send_lock:
                zygote.send(self.sock, {"op": "signal", "id": rid, "sig": int(sig)})
        except OSError:
            pass

    def close(self) -> None:
        """End the zygote and every child it forked; remove its socket. Safe to call more than once."""
        if self.closed:
            return
        self.closed = True
        live = [w for w in self._workers.values() if w.running()]
        if self.sock is not None:
            try:
                with self._send_lock:
                    zygote.send(self.sock, {"op": "exit"})
            except OSError:
                pass
        for worker in live:  # the zygote kills them too; from here as well where its pids are ours
            worker._signal(signal.SIGKILL)
        try:
            self.process.wait(timeout=5)
        except (subprocess.TimeoutExpired, Exception):
            pass
        self.process.stop()
        for s in (self.sock, self.listener):
            try:
                if s is not None:
                    s.close()
            except OSError:
                pass
        self.dead = True
        shutil.rmtree(self.folder, ignore_errors=True)


class ForkedWorker(WorkerStream):
    """A trial's child of a zygote, as the runner sees a worker: its stdout and stderr are pipes made here
    and handed to the zygote with the fork request; its exit status comes from the zygote, which reaps it."""

    def __init__(self, zyg: ZygoteHandle, spec: RunSpec):
        super().__init__()
        self.zygote = zyg
        self.id = spec.run_id
        self._exit = threading.Event()
        self._code: int | None = None
        self._gone = False
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        spec.launched_at = self.started_at
        try:
            reply = zyg.request(self, spec, [w_out, w_err])
        except BaseException:
            os.close(r_out)
            os.close(r_err)
            raise
        finally:
            os.close(w_out)
            os.close(w_err)
        self.pid = int(reply["pid"])
        self.fork_info = reply
        self._out = os.fdopen(r_out, "r", encoding="utf-8", errors="replace")
        self._err = os.fdopen(r_err, "r", encoding="utf-8", errors="replace")
        self._threads = [threading.Thread(target=self._pump_out, daemon=True),
                         threading.Thread(target=self._pump_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _pump_out(self) -> None:
        for line in self._out:
            self.put(line)
        self._out.close()
        self._exit.wait(30)
        if self._code is not None:
            self.put(events.encode(events.startup("launch_to_exit_s", time.time() - self.started_at)) + "\n")
        elif self._gone:
            self.put(events.encode(events.error("crash", "the zygote ended while this trial ran ("
                                                      + self.zygote.end_text() + "); the trial's process ended "
                                                      "with it")) + "\n")
        self.put(None)

    def _pump_err(self) -> None:
        for line in self._err:
            self.stderr_tail.append(line.rstrip("\n"))
        self._err.close()

    def _exited(self, code: int) -> None:
        self._code = code
        self._exit.set()

    def _zygote_gone(self) -> None:
        if not self._exit.is_set():
            self._gone = True
            self._exit.set()

    def running(self) -> bool:
        return not self._exit.is_set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._exit.wait(timeout):
            raise subprocess.TimeoutExpired(f"trial {self.id} (pid {self.pid})", timeout or 0)
        for t in self._threads:
            t.join(timeout=2)
        return self._code if self._code is not None else -signal.SIGKILL  # PR_SET_PDEATHSIG's

    def _signal(self, sig: int) -> None:
        """The child's whole process group: directly where its pids are ours, and through the zygote."""
        if self.zygote.direct:
            spawn.signal_group(self.pid, sig)
        self.zygote.signal(self.id, sig)

    def kill(self, grace_s: float = 3.0) -> None:
        if self._killed:
            return
        self._killed = True
        if self.running():
            self._signal(signal.SIGTERM)
            self._exit.wait(grace_s)
        self._signal(signal.SIGKILL)
        self._exit.wait(10)

    def close(self) -> None:
        """After a normal exit: nothing of its process group is left."""
        self._signal(signal.SIGKILL)


# -- the runner's launcher --------------------------------------------------------------------------

class Launcher:
    """Starts every trial's process: through its environment (exec) or a zygote (fork). Owns the zygotes."""

    def __init__(self) -> None:
        self.zygotes: dict[str, ZygoteHandle] = {}
        self.starts: list[float] = []  # each zygote's start, spawn to ready (seconds)
        self.forks: list[dict[str, Any]] = []  # each fork's reply: pid, threads and CUDA state at the fork
        self.zygote_info: list[dict[str, Any]] = []  # what each zygote said when ready (imports, threads, CUDA)
        self.waited_s = 0.0  # time the runner waited for zygotes to be ready

    def _zygote(self, spec: RunSpec) -> ZygoteHandle:
        k = key(spec)
        z = self.zygotes.get(k)
        if z is None or z.dead:
            if z is not None:
                z.close()
            z = self.zygotes[k] = ZygoteHandle(spec)
        return z

    def prepare(self, specs: Iterable[RunSpec]) -> None:
        """Start the zygotes these specs need, all at once (each imports in its own process)."""
        for spec in specs:
            if spec.fresh == "fork":
                try:
                    self._zygote(spec)
                except Exception:  # its trials will say why, each as it starts
                    pass

    def ready(self, spec: RunSpec, timeout: float | None) -> None:
        """Wait for the zygote of a forked spec (a zygote's start is the experiment's, not a trial's)."""
        if spec.fresh != "fork":
            return
        z = self._zygote(spec)
        if z.sock is not None:
            return
        t0 = time.monotonic()
        try:
            z.wait_ready(timeout)
            self.starts.append(z.ready_s or 0.0)
            self.zygote_info.append({k: z.info.get(k) for k in ("import_s", "bytecode", "threads", "cuda", "problem",
                                                               "python")})
        finally:
            self.waited_s += time.monotonic() - t0

    def launch(self, spec: RunSpec) -> WorkerStream:
        if spec.fresh == "fork":
            z = self._zygote(spec)
            z.wait_ready(None)
            worker = z.fork(spec)
            self.forks.append(worker.fork_info)
            return worker
        # through the workload: the command workload's bare mode runs the job itself as the environment's process
        return workloads.get(spec.workload).launch(spec, environments.get(spec.env))

    def close(self) -> None:
        for z in list(self.zygotes.values()):
            z.close()
        self.zygotes.clear()

    def timing(self) -> dict[str, Any]:
        return {"zygote_starts_s": list(self.starts), "zygote_wait_s": self.waited_s, "zygotes": list(self.zygote_info)}


__all__ = ["FRESH", "MODES", "LaunchError", "Launcher", "ForkedWorker", "ZygoteHandle", "check", "resolve", "key"]
