"""The zygote: one process per launch configuration that pays a trial's start-up once and forks a child per trial.

`python -m gpuvs.trial.zygote --connect SOCKET [--import MODULE]... [--entry worker|inside]`.
Before every fork it checks it is single-threaded and CUDA is not initialised, else refuses with the reason.
What a child holds of its own and what it shares: docs/trials.md; the channel's messages are below."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

from gpuvs import spawn
from gpuvs.trial import bytecode
from gpuvs.trial.forksafe import cuda_state, fork_problem, threads

MAX_PACKET = 1 << 20
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
TRIAL_NAME = b"gpuvs-trial"  # a child's name (comm: what ps -e and top show), apart from its zygote's
ENTRIES = ("worker", "inside")
# What the worker itself imports before it reads its spec: paid once here too.
OWN = ("gpuvs.trial.worker", "gpuvs.events", "gpuvs.probes.failures", "gpuvs.probes.fingerprint", "gpuvs.analysis.stats", "gpuvs.probes.telemetry",
       "gpuvs.workloads")


# -- the channel ------------------------------------------------------------------------------------
# A Unix SOCK_SEQPACKET socket that gpuvs listens on, one JSON object per packet:
#   gpuvs -> zygote  {"op": "fork", "id", "spec"} with 2 descriptors (SCM_RIGHTS: the child's stdout and stderr)
#                    {"op": "signal", "id", "sig"}   signal the child's process group (even once it is reaped)
#                    {"op": "exit"}
#   zygote -> gpuvs  {"op": "ready", "pid", "import_s", "python", "imports", "bytecode", "threads", "cuda"}
#                    {"op": "forked", "id", "pid", "threads", "cuda"} | {"op": "refused", "id", "error"}
#                    {"op": "exit", "id", "pid", "code"}   (exit status, or minus the signal that ended it)
# At the channel's end (gpuvs gone, even killed), at "exit" and at SIGTERM or SIGHUP, every child's group is killed.

def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    data = json.dumps(message, default=str).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One packet: (message, descriptors it carried); (None, []) at the end of the channel."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, 8)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)


# -- what makes a fork safe: forksafe.py (the worker asks the same before it forks its ranks) -----------------


def _die_with_parent(sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(TRIAL_NAME), 0, 0, 0)


def _noop(signum, frame) -> None:
    pass


# -- the zygote -------------------------------------------------------------------------------------

class Zygote:
    def __init__(self, sock: socket.socket, entry: str):
        self.sock = sock
        self.entry = entry
        self.pid = os.getpid()
        self.children: dict[int, str] = {}  # live child pid -> request id
        self.groups: dict[str, int] = {}  # request id -> its process group (kept after the child is reaped)
        self.stop = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)  # a signal wakes the select below at once
        signal.signal(signal.SIGCHLD, _noop)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._stop)

    def _stop(self, signum, frame) -> None:
        self.stop = True

    def serve(self) -> None:
        try:
            while not self.stop:
                ready, _, _ = select.select([self.sock, self.wake_r], [], [], 0.5)
                if self.wake_r in ready:
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                self.reap()
                if self.sock in ready:
                    try:
                        message, fds = receive(self.sock)
                    except (OSError, ValueError):
                        break
                    if message is None:
                        break  # gpuvs is gone
                    self.handle(message, fds)
        finally:
            self.shutdown()

    def handle(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "fork":
            self.fork(message, fds)
            return
        for fd in fds:
            os.close(fd)
        if op == "signal":
            group = self.groups.get(str(message.get("id")))
            if group:
                spawn.signal_group(group, int(message["sig"]))
        elif op == "exit":
            self.stop = True

    def reply(self, message: dict[str, Any]) -> None:
        try:
            send(self.sock, message)
        except OSError:
            self.stop = True

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.children.pop(pid, None)  # else an orphan this zygote reaps as a container's PID 1
            if rid is not None:
                self.reply({"op": "exit", "id": rid, "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def fork(self, message: dict[str, Any], fds: list[int]) -> None:
        rid = str(message.get("id"))
        problem = fork_problem() if len(fds) == 2 else f"a fork request carries 2 descriptors, not {len(fds)}"
        if problem:
            for fd in fds:
                os.close(fd)
            self.reply({"op": "refused", "id": rid, "error": problem})
            return
        state = cuda_state()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            self.child(message, fds)  # never returns
        for fd in fds:
            os.close(fd)
        try:
            os.setpgid(pid, pid)  # as the child does: no window in which its group does not exist yet
        except OSError:
            pass
        self.children[pid] = rid
        self.groups[rid] = pid
        self.reply({"op": "forked", "id": rid, "pid": pid, "threads": 1, "cuda": state})

    def child(self, message: dict[str, Any], fds: list[int]) -> None:
        """The new trial's process: detach from the zygote, take the request's pipes as stdout and stderr,
        run the worker, and end without returning into the zygote's loop."""
        code = 70
        try:
            forked_at = time.time()
            os.setpgid(0, 0)
            _die_with_parent(signal.SIGKILL)
            if os.getppid() != self.pid:  # the zygote died before the line above
                os._exit(code)
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.environ["GPUVS_SPEC"] = str(message.get("spec") or "")
            os.environ["GPUVS_PARENT_PID"] = str(self.pid)  # the worker's watch: its group ends with the zygote
            numpy = sys.modules.get("numpy")
            if numpy is not None:
                numpy.random.seed()  # a new process draws numpy's global state from the OS; a fork copies it
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.default_generator.seed()  # likewise torch's CPU generator (its CUDA ones start with CUDA)
            from gpuvs.trial import worker

            worker.T_START = forked_at
            worker.FORKED = True
            if self.entry == "inside":
                from gpuvs.trial import inside

                code = inside.main([])
            else:
                code = worker.main([])
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            os._exit(code)

    def shutdown(self) -> None:
        """Every child's process group ends with the zygote (stragglers of finished trials too)."""
        for group in set(self.groups.values()):
            spawn.kill_group(group)
        deadline = time.monotonic() + 5
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)
        try:
            self.sock.close()
        except OSError:
            pass


def _options(argv: list[str]) -> tuple[str, list[str], str]:
    connect, imports, entry = None, [], "worker"
    it = iter(argv)
    for arg in it:
        value = next(it, None)
        if value is None:
            raise SystemExit(f"gpuvs.trial.zygote: {arg} needs a value")
        if arg == "--connect":
            connect = value
        elif arg == "--import":
            imports.append(value)
        elif arg == "--entry" and value in ENTRIES:
            entry = value
        else:
            raise SystemExit(f"gpuvs.trial.zygote: unexpected argument {arg} {value}")
    if not connect:
        raise SystemExit("gpuvs.trial.zygote: --connect SOCKET is required")
    return connect, imports, entry


def main(argv: list[str] | None = None) -> int:
    connect, imports, entry = _options(list(sys.argv[1:] if argv is None else argv))
    t0 = time.perf_counter()
    kept = bytecode.keep(imports)
    errors: dict[str, str | None] = {}
    # the framework first, as the worker does; an import that fails here fails again in the child,
    # which reports it as the worker would
    order = sorted(imports, key=lambda m: m != "torch") + list(OWN) + (["gpuvs.trial.inside"] if entry == "inside" else [])
    for module in order:
        try:
            importlib.import_module(module)
            errors[module] = None
        except BaseException as exc:  # noqa: BLE001 - whatever an import raises, the child says it again
            errors[module] = f"{type(exc).__name__}: {exc}"
    try:
        from gpuvs import workloads

        workloads.names()  # every workload module
    except BaseException as exc:  # noqa: BLE001
        errors["gpuvs.workloads"] = f"{type(exc).__name__}: {exc}"
    import_s = time.perf_counter() - t0
    pid = os.fork()  # an empty fork: pools that shut themselves down at fork (OpenBLAS's) do so now
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(connect)
    send(sock, {"op": "ready", "pid": os.getpid(), "import_s": import_s, "python": sys.version.split()[0],
                "imports": errors, "bytecode": kept, "threads": threads(), "cuda": cuda_state(), "problem": fork_problem()})
    Zygote(sock, entry).serve()
    return 0


if __name__ == "__main__":
    # without the interpreter's teardown, as a worker ends
    from gpuvs.trial.worker import exit_now

    exit_now(main())
