"""selftest: timed sleeps that exercise the harness itself (timeouts, killed and crashing workers,
child processes, stray output), the way pyperf checks its own machinery. Needs no framework."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.errors import WorkloadError
from gpuvs.params import Param
from gpuvs.workloads.barrier import ready
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, rate


_RUNS = [0]  # runs of this workload in this process: a trial that shares a process with another sees it grow


def state() -> dict[str, Any]:
    """What one trial's process holds that another trial must not share."""
    _RUNS[0] += 1
    out: dict[str, Any] = {"pid": os.getpid(), "ppid": os.getppid(), "runs": _RUNS[0], "py_random": random.random()}
    numpy = sys.modules.get("numpy")
    out["np_random"] = float(numpy.random.random()) if numpy is not None else None
    torch = sys.modules.get("torch")
    out["torch_seed"] = int(torch.initial_seed()) if torch is not None else None
    out["torch_cuda_initialized"] = bool(torch.cuda.is_initialized()) if torch is not None else None
    out["threads"] = len(os.listdir("/proc/self/task"))
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    out["sockets"] = sum(link.startswith("socket:") for link in links)
    out["fds"] = len(links)
    return out


@register
class SelfTest(Workload):
    name = "selftest"
    summary = "harness self-check: timed sleeps (timeouts, kills, clean-up, stray output)"
    unit = "steps/sec"
    metrics = (rate("main", headline=True),)
    windowed = True
    params = (
        Param("steps", int, 5, "timed steps", min=1, max=10_000_000),
        Param("step_seconds", float, 0.01, "sleep per step", min=0.0, max=3600.0),
        Param("children", int, 0, "child processes to start (each sleeps until killed)", min=0, max=16),
        Param("noise", bool, False, "print junk to standard output and error on every step"),
        Param("fail_at_step", int, 0, "raise an error at this step (0: never)", min=0),
        Param("exit_at_step", int, 0, "die abruptly (exit status --exit-status) at this step (0: never)", min=0),
        Param("exit_status", int, 17, "the status of that abrupt exit", min=0, max=255),
        Param("text", str, "", "a free-text value, echoed back as a log line"),
        Param("fail_at_start", bool, False, "fail while warming up, before the timed part (and its start barrier)"),
        Param("room", int, 0, "under gpuvs share: fail like an allocation that does not fit when this many workers "
              "already wait at the start barrier (0: no limit)", min=0),
        Param("allocate_mib", int, 0, "allocate and touch this much memory before the steps (a memory limit's "
              "OOM kill)", min=0, max=1 << 20),
        Param("write_mib", int, 0, "write a file of this size in the temporary folder before the steps (a disk "
              "limit's eviction)", min=0, max=1 << 20),
        Param("imports", str, "", "modules to import first, comma-separated (a zygote imports them once)"),
        Param("state", bool, False, "log the process's state first: pid, a module-level counter this run "
              "increments, random draws (Python, numpy), torch's seed, threads, sockets held"),
    )

    def imports(self, params: dict[str, Any]) -> tuple[str, ...]:
        return tuple(m.strip() for m in str(params.get("imports") or "").split(",") if m.strip())

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        p = ctx.params
        for module in self.imports(p):
            importlib.import_module(module)
        yield events.config(steps=p["steps"], step_seconds=p["step_seconds"], pid=os.getpid())
        if p["state"]:
            yield events.log("state " + json.dumps(state()))
        kids = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
                for _ in range(p["children"])]
        if kids:
            yield events.log("children " + " ".join(str(k.pid) for k in kids))
        if p["text"]:
            yield events.log(f"text {p['text']}")
        if p["fail_at_start"]:
            raise WorkloadError("crash", "selftest failed before its timed part as asked (--fail-at-start)")
        barrier = ctx.spec.barrier or {}
        if p["room"] and barrier and len(ready(barrier["dir"])) >= p["room"]:
            raise WorkloadError("oom", f"out of room: {p['room']} selftest workers already hold the device "
                                "(--room, a deterministic stand-in for running out of memory)")
        hold = bytearray(p["allocate_mib"] << 20)
        for i in range(0, len(hold), 4096):  # touch every page, so that the memory is really used
            hold[i] = 1
        if p["write_mib"]:
            import tempfile

            with tempfile.NamedTemporaryFile(prefix="gpuvs-selftest-", delete=True) as f:
                for _ in range(p["write_mib"]):
                    f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
                yield from self._steps(ctx)
            return
        yield from self._steps(ctx)

    def _steps(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        p = ctx.params
        ctx.start_window()
        for step in range(1, p["steps"] + 1):
            if not ctx.window_open():
                break
            if p["noise"]:
                print('{"type": "sample", "not": "from gpuvs"} junk on stdout', flush=True)
                print("junk on stderr", file=sys.stderr, flush=True)
            if step == p["fail_at_step"]:
                raise WorkloadError("crash", f"selftest failed at step {step} as asked")
            if step == p["exit_at_step"]:
                os._exit(p["exit_status"])
            t0 = time.perf_counter()
            time.sleep(p["step_seconds"])
            sec = time.perf_counter() - t0
            yield events.sample(step, 1.0 / sec if sec > 0 else 0.0, self.unit, seconds=sec, items=1.0,
                                pid=os.getpid(), display=True)
