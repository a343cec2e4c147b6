"""How long advise-mps measures each window, calibrated as pyperf calibrates its loops (docs/sharing.md).

N steps read a rate to about c / sqrt(N), c the steps' variation: so N = max(MIN_STEPS, (c / TARGET)^2).
A pair's window takes each job's steps as PAIR_SLOWDOWN times longer, and is the longer of the two.
Statistics only: no worker runs here, and a reason's text is the one line the command prints."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

MIN_STEPS = 50
TARGET = 0.01  # relative standard error of a window's rate
PAIR_SLOWDOWN = 2.0  # a job's steps together, taking turns, against alone
SLACK = 1.1  # a window needed within 10% of --duration is --duration


@dataclass(frozen=True)
class StepTimes:
    """A job's steps in its solo window: how many, their mean (s) and coefficient of variation."""

    job: str
    n: int
    mean_s: float
    cv: float

    def error(self, window_s: float, slowdown: float = 1.0) -> float:
        """The relative standard error of this job's rate over a window of window_s seconds."""
        steps = max(1.0, window_s / (self.mean_s * slowdown))
        return self.cv / math.sqrt(steps)

    def needed_s(self, min_steps: int = MIN_STEPS, target: float = TARGET, slowdown: float = 1.0) -> float:
        """The window that gives this job at least min_steps steps and its rate an error within target."""
        steps = max(min_steps, math.ceil((self.cv / target) ** 2))
        return steps * self.mean_s * slowdown


def step_times(job: str, seconds: Sequence[float | None]) -> StepTimes | None:
    """A job's step times (s) from its solo window; None where it timed no step."""
    secs = [float(s) for s in seconds if s is not None and s > 0]
    if not secs:
        return None
    mean = sum(secs) / len(secs)
    sd = math.sqrt(sum((s - mean) ** 2 for s in secs) / (len(secs) - 1)) if len(secs) > 1 else 0.0
    return StepTimes(job, len(secs), mean, sd / mean)


@dataclass(frozen=True)
class Window:
    """The window a pair (or one job alone) got, and why, in one line."""

    seconds: float
    reason: str
    error: float | None = None  # the deciding job's relative error over this window
    deciding: str | None = None  # the job whose steps decided it

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "reason": self.reason, "error": self.error, "deciding": self.deciding}


def _ms(s: float) -> str:
    return f"{1e3 * s:.3g} ms"


def _s(s: float) -> str:
    return f"{s:.3g} s"


def choose(jobs: Sequence[StepTimes | None], floor_s: float, cap_s: float, slowdown: float = 1.0,
           min_steps: int = MIN_STEPS, target: float = TARGET) -> Window:
    """The window for jobs measured together (one job: its solo window): the longest any of them needs,
    within [floor_s, cap_s]; a need within SLACK of the floor is the floor (not worth a window of its own).
    The reason names the job that decided it and the rule that did (too few steps, or too uneven)."""
    known = [j for j in jobs if j is not None]
    if not known:
        return Window(floor_s, f"window {_s(floor_s)} (--duration): no step times to calibrate on")
    need = {j: j.needed_s(min_steps, target, slowdown) for j in known}
    top = max(known, key=lambda j: need[j])
    seconds = floor_s if need[top] <= SLACK * floor_s else min(cap_s, need[top])
    err = top.error(seconds, slowdown)
    steps = f"{top.job}: steps of {_ms(top.mean_s)} vary {100 * top.cv:.0f}%"
    together = " (taken as twice as long together)" if slowdown > 1 else ""
    if seconds == floor_s:
        return Window(seconds, f"window {_s(seconds)} (--duration): {steps}{together}; it holds "
                      f"{floor_s / (top.mean_s * slowdown):.0f} steps, a {100 * err:.2g}% error", err, top.job)
    few = floor_s / (top.mean_s * slowdown)
    short = (f"{_s(floor_s)} would hold {few:.0f} steps (at least {min_steps} wanted)" if few < min_steps
             else f"{_s(floor_s)} would give a {100 * top.error(floor_s, slowdown):.2g}% error "
                  f"({100 * target:g}% wanted)")
    capped = f", capped by --max-duration (it needs {_s(need[top])})" if need[top] > cap_s else ""
    return Window(seconds, f"window {_s(seconds)}{capped}: {steps}{together}; {short}; {_s(seconds)} gives "
                  f"{seconds / (top.mean_s * slowdown):.0f} steps, a {100 * err:.2g}% error", err, top.job)
