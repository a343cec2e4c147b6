"""A library call in a child process of its own, so that a run that crashes or hangs can be ended.

The agent runs validate and fleet so; its HTTP server goes on answering meanwhile.
The child is spawned (a fresh interpreter, none of the agent's threads or locks).
What it says comes back over a pipe as typed values: each event, then its return value or its error."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvs.errors import GpuvsError, Stopped

POLL_S = 0.2

Emit = Callable[[Any], None]


@dataclass
class Outcome:
    """How the call ended: its return value; or the error it raised (its message, and the exit status the
    command line would have given: 2 bad input, 1 failed, 128+N stopped by signal N); or the child's death."""

    value: Any = None
    error: str | None = None
    exit_code: int = 0
    timed_out: bool = False
    events: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0


@dataclass
class Child:
    """The child process in flight, so that a stop can end it (SIGTERM: it cleans up after itself)."""

    proc: Any = None  # a multiprocessing Process
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self) -> None:
        with self.lock:
            p = self.proc
        if p is not None and p.is_alive():
            p.terminate()  # SIGTERM


def _stop(signum: int, frame) -> None:
    """The first SIGTERM stops the call like Ctrl-C; later ones are ignored, so that its clean-up runs to the end."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    raise Stopped(signum)


def _main(conn, target: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    code = 0
    try:
        value = target(lambda event: conn.send(("event", event)), **kwargs)
        conn.send(("value", value))
    except GpuvsError as exc:
        code = exc.exit_code
        conn.send(("error", str(exc), code))
    except KeyboardInterrupt as exc:
        code = exc.exit_code if isinstance(exc, Stopped) else 130
        conn.send(("error", str(exc) or "interrupted", code))
    except BaseException as exc:  # a crash: its traceback goes to the agent's log, its one line to the run
        traceback.print_exc()
        code = 1
        conn.send(("error", f"{type(exc).__name__}: {exc}", code))
    finally:
        conn.close()
    sys.exit(code)


def call(target: Callable[..., Any], kwargs: dict[str, Any], *, holder: Child, timeout_s: float,
         grace_s: float, on_event: Emit | None = None) -> Outcome:
    """target(emit, **kwargs) in a child process (target and kwargs must pickle: a module-level function and
    typed values). SIGTERM after timeout_s, SIGKILL grace_s later. An exception here (the agent stopping) ends
    the child the same way before it goes on."""
    mp = multiprocessing.get_context("spawn")
    receive, send = mp.Pipe(duplex=False)
    p = mp.Process(target=_main, args=(send, target, kwargs), name="gpuvs-agent-run")
    out = Outcome()
    p.start()
    send.close()  # the child's end: EOF here once the child has closed it
    with holder.lock:
        holder.proc = p
    deadline, kill_at = time.monotonic() + timeout_s, None
    try:
        while True:
            if receive.poll(POLL_S):
                try:
                    kind, *rest = receive.recv()
                except EOFError:
                    break
                if kind == "event":
                    out.events.append(rest[0])
                    if on_event:
                        on_event(rest[0])
                elif kind == "value":
                    out.value = rest[0]
                else:
                    out.error, out.exit_code = rest
                continue
            if not p.is_alive():
                break
            now = time.monotonic()
            if kill_at is None and now > deadline:
                out.timed_out = True
                p.terminate()
                kill_at = now + grace_s
            elif kill_at is not None and now > kill_at:
                p.kill()
        p.join()
        if out.exit_code == 0 and p.exitcode:  # died without a word (SIGKILL, a crash of the interpreter)
            out.exit_code = p.exitcode if p.exitcode > 0 else 128 - p.exitcode
            out.error = out.error or f"the child process ended with status {out.exit_code}"
        return out
    finally:
        if p.is_alive():  # an exception above (the agent stopping): the child cleans up, then goes
            p.terminate()
            p.join(grace_s)
            if p.is_alive():
                p.kill()
                p.join()
        receive.close()
        with holder.lock:
            holder.proc = None
