"""spin: a fixed amount of single-threaded CPU arithmetic per step, timed. Needs no framework.

So it runs in any image with Python, and a slower, throttled or quota-capped CPU shows as fewer operations a second.
The fleet tests use it, a node slowed by a quota on its cgroup root."""

from __future__ import annotations

import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.params import Param
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, rate


def spin(ops: int) -> int:
    """`ops` rounds of integer arithmetic that no interpreter can skip (a linear congruential sequence)."""
    x = 1
    for _ in range(ops):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


@register
class Spin(Workload):
    name = "spin"
    summary = "CPU arithmetic, one thread: operations per second (node CPU speed, quotas, throttling)"
    unit = "ops/sec"
    metrics = (rate("main", headline=True),)
    windowed = True
    params = (
        Param("steps", int, 10, "timed steps", min=1, max=1_000_000),
        Param("ops", int, 1_000_000, "arithmetic rounds per step", min=1, max=10**10),
        Param("warmup_steps", int, 2, "untimed steps first", min=0, max=1000),
    )

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        p = ctx.params
        yield events.config(steps=p["steps"], ops=p["ops"], warmup_steps=p["warmup_steps"])
        t0 = time.perf_counter()
        for _ in range(p["warmup_steps"]):
            spin(p["ops"])
        yield events.startup("warmup_s", time.perf_counter() - t0)
        ctx.start_window()
        for step in range(1, p["steps"] + 1):
            if not ctx.window_open():
                break
            t = time.perf_counter()
            spin(p["ops"])
            sec = time.perf_counter() - t
            yield events.sample(step, p["ops"] / sec if sec > 0 else 0.0, self.unit, seconds=sec,
                                items=float(p["ops"]), display=True)
