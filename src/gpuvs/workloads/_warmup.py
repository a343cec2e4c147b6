"""The warm-up of step-based workloads, and of each gemm or membw shape: fixed, or until the steps are steady.

Steady: the last WINDOW step times show no level change against the WINDOW before, and no trend.
A change counts only where it is both significant and beyond TOLERANCE (the rule: docs/trials.md).
Standard library only: it runs in the worker, where importing scipy would cost start-up."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from gpuvs import events
from gpuvs.params import Param

WINDOW = 5  # steps in each of the two windows compared
ALPHA = 0.05  # each test's level, two-sided
TOLERANCE = 0.01  # a change smaller than this (relative) is steady whatever its p-value

PARAMS = (
    Param("warmup_max_steps", int, 100, "adaptive warm-up (no --warmup-steps): at most this many steps",
          min=2 * WINDOW + 1, max=100_000),
    Param("warmup_max_seconds", float, 60.0, "adaptive warm-up (no --warmup-steps): at most this many seconds",
          min=0.1, max=1e6),
)


@dataclass(frozen=True)
class WarmupPlan:
    """A fixed count (`steps` > 0) or adaptive (`steps` == 0) with its caps."""

    steps: int = 0
    max_steps: int = 100
    max_seconds: float = 60.0

    @classmethod
    def from_params(cls, params: dict[str, Any], count: str = "warmup_steps") -> WarmupPlan:
        """From a run's parameters; `count` names the fixed count's (0: adaptive)."""
        return cls(steps=int(params.get(count) or 0), max_steps=int(params.get("warmup_max_steps") or 100),
                   max_seconds=float(params.get("warmup_max_seconds") or 60.0))

    @property
    def adaptive(self) -> bool:
        return self.steps <= 0

    @property
    def floor(self) -> int:
        """The fewest steps an adaptive warm-up runs: the first step and two windows."""
        return 1 + 2 * WINDOW

    def describe(self, unit: str = "steps") -> str:
        if not self.adaptive:
            return str(self.steps)
        return f"adaptive, until steady: {self.floor} to {self.max_steps} {unit} or {self.max_seconds:g} s"

    def stop(self, launched: int, times: Sequence[float], elapsed_s: float) -> str | None:
        """Stop warming up after `launched` steps? `times`: the seconds of the steps read so far, the first
        step's first; `elapsed_s`: since the warm-up began. 'fixed', 'steady', 'cap' or None (go on)."""
        if not self.adaptive:
            return "fixed" if launched >= self.steps else None
        if launched >= self.max_steps or elapsed_s >= self.max_seconds:
            return "cap"
        if launched >= self.floor and steady(times[1:]):
            return "steady"
        return None


@dataclass(frozen=True)
class WarmupDecision:
    """What a warm-up did: its steps (the first included), its seconds, and why it stopped ('fixed', 'steady',
    'cap')."""

    steps: int
    seconds: float
    stopped: str


def steady(times: Sequence[float], window: int = WINDOW, alpha: float = ALPHA, tolerance: float = TOLERANCE) -> bool:
    """Are the last `window` step times steady against the `window` before (docs/trials.md, "The warm-up")?"""
    if len(times) < 2 * window:
        return False
    last = [float(t) for t in times[-2 * window:]]
    a, b = last[:window], last[window:]
    level = abs(_median(b) / _median(a) - 1.0) > tolerance and mann_whitney_p(a, b) < alpha
    slope = theil_sen_slope(last) * (len(last) - 1) / _median(last)
    trend = abs(slope) > tolerance and mann_kendall_p(last) < alpha
    return not (level or trend)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def theil_sen_slope(ys: Sequence[float]) -> float:
    """The median of the pairwise slopes (ys at x = 0, 1, 2...)."""
    return _median([(ys[j] - ys[i]) / (j - i) for i in range(len(ys)) for j in range(i + 1, len(ys))])


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided exact p of the Mann-Whitney U of a against b (ties count a half, the null distribution is the
    one without ties)."""
    m, n = len(a), len(b)
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)
    counts = _u_counts(m, n)
    total = sum(counts)
    lo = min(u, m * n - u)
    tail = sum(c for k, c in enumerate(counts) if k <= lo + 1e-9)
    return min(1.0, 2.0 * tail / total)


def _u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings give each U = 0..m*n (the Gaussian binomial's coefficients)."""
    # f(m, n) as a polynomial in q: f(m, n) = f(m-1, n) q^n + f(m, n-1)
    table = {(0, j): [1] for j in range(n + 1)}
    for i in range(1, m + 1):
        table[(i, 0)] = [1]
        for j in range(1, n + 1):
            left, up = table[(i - 1, j)], table[(i, j - 1)]
            out = [0] * (i * j + 1)
            for k, c in enumerate(left):
                out[k + j] += c
            for k, c in enumerate(up):
                out[k] += c
            table[(i, j)] = out
    return table[(m, n)]


def mann_kendall_p(ys: Sequence[float]) -> float:
    """Two-sided exact p of the Mann-Kendall S (concordant minus discordant pairs in order; no ties assumed:
    S's null distribution is the count of inversions of a random permutation)."""
    n = len(ys)
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    pairs = n * (n - 1) // 2
    inv = [1]  # Mahonian numbers: permutations of k items by their count of inversions
    for k in range(2, n + 1):
        out = [0] * (len(inv) + k - 1)
        for i, c in enumerate(inv):
            for j in range(k):
                out[i + j] += c
        inv = out
    # S = pairs - 2 * inversions; P(|S| >= |s|)
    total = math.factorial(n)
    extreme = sum(c for i, c in enumerate(inv) if abs(pairs - 2 * i) >= abs(s))
    return min(1.0, extreme / total)


KEPT_TIMES = 200  # step times kept in the trial's config (warmup_times_s), the first's first


def config_items(decision: WarmupDecision, times: Sequence[float]) -> dict[str, Any]:
    """What an adaptive warm-up decided, as the trial's config items (stored with the trial: its steps, why it
    stopped, and the step times it decided on)."""
    return {"warmup_steps": decision.steps, "warmup_stop": decision.stopped,
            "warmup_times_s": [round(float(t), 7) for t in times[:KEPT_TIMES]]}


SHAPES_ITEM = "warmup_shapes"  # the config item of a workload that warms up each shape alone (gemm, membw)


def shape_items(decisions: dict[str, tuple[WarmupDecision, Sequence[float]]]) -> dict[str, Any]:
    """What the adaptive warm-ups of a trial's shapes decided, as one config item (stored with the trial):
    {shape: {steps, stop, times_s}}, as config_items says it for one warm-up (steps: blocks, the first's first)."""
    return {SHAPES_ITEM: {name: {"steps": d.steps, "stop": d.stopped,
                                 "times_s": [round(float(t), 7) for t in times[:KEPT_TIMES]]}
                          for name, (d, times) in decisions.items()}}


@dataclass
class Shapes:
    """What a workload that warms up and times each shape alone (gemm, membw) gathers over its shapes: each
    adaptive warm-up's decision, the warm-ups' seconds and the timed blocks' seconds; `what` names its steps
    ("GEMMs", "copies")."""
    what: str
    decided: dict[str, tuple[WarmupDecision, list[float]]] = field(default_factory=dict)
    warm_s: float = 0.0
    timed_s: float = 0.0
    count: int = 0  # the shapes measured

    def add(self, name: str, secs: Sequence[float], inner: int, warm_s: float,
             warm: tuple[WarmupDecision, list[float]] | None) -> list[dict[str, Any]]:
        """One shape warmed up and timed (warm_and_time's answer): its seconds added (now, not when the events
        are read), and its events: where its warm-up was adaptive (warm: per_shape's decision; None for a fixed
        count: none) the config item of every shape so far (shape_items) and its log line."""
        self.count += 1
        self.warm_s += warm_s
        self.timed_s += sum(secs)
        if warm is None:
            return []
        self.decided[name] = warm
        d = warm[0]
        return [events.config(**shape_items(self.decided)),
                events.log(f"{name}: warm-up {d.steps} blocks of {inner} {self.what} ({d.seconds:.2f} s), {d.stopped}")]

    def totals(self) -> list[dict[str, Any]]:
        """The trial's warm-up seconds and its timed blocks' seconds over every shape (events.TIMED_S: "where the
        time went" counts them as measured, analysis/timeshare.py)."""
        return [events.startup("warmup_s", self.warm_s), events.startup(events.TIMED_S, self.timed_s)]


def per_shape_described(params: dict[str, Any], what: str) -> str:
    """The warm-up of a workload that warms up each shape alone (its `--warmup`: a count of `what`, 0 adaptive),
    as its config item `warmup`."""
    plan = WarmupPlan.from_params(params, "warmup")
    return plan.describe("blocks") + ", per shape" if plan.adaptive else f"{plan.steps} {what} per shape"


def per_shape(plan: WarmupPlan, step: Callable[[], Any], calibrate: Callable[[], int], sync: Callable[[], None],
              clock: Callable[[], float] = time.perf_counter
              ) -> tuple[int, tuple[WarmupDecision, list[float]] | None]:
    """One shape's warm-up on the host's clock. Fixed: its count of `step`, then `calibrate` (the steps per
    block, as before). Adaptive: `calibrate` first, then blocks of that many steps (as the timed samples run
    them) until they are steady by the rule, the first block its first step. Returns the steps per block and
    what the adaptive warm-up decided with its blocks' times (None: fixed)."""
    if not plan.adaptive:
        for _ in range(plan.steps):
            step()
        sync()
        return calibrate(), None
    inner = calibrate()

    def block() -> None:
        for _ in range(inner):
            step()

    t0 = clock()
    block()
    sync()
    return inner, on_host(plan, block, clock() - t0, sync, clock)


def on_host(plan: WarmupPlan, step: Callable[[], Any], first_s: float, sync: Callable[[], None],
            clock: Callable[[], float] = time.perf_counter) -> tuple[WarmupDecision, list[float]]:
    """The steps after the first on the host's clock (a synchronise after each where adaptive: the warm-up is
    not measured). Returns the decision (its seconds: the first step's and these) and every step's time."""
    times = [first_s]
    t0 = last = clock()
    launched = 1
    while True:
        stopped = plan.stop(launched, times, first_s + last - t0)
        if stopped:
            return WarmupDecision(launched, first_s + last - t0, stopped), times
        step()
        launched += 1
        if plan.adaptive:
            sync()
            now = clock()
            times.append(now - last)
            last = now
        elif launched >= plan.steps:
            sync()
            last = clock()


def on_device(plan: WarmupPlan, step: Callable[[], Any], first_s: float, device: Any, start: Any,
              clock: Callable[[], float] = time.perf_counter) -> tuple[int, str, Any, Callable[[], list[float]]]:
    """The steps after the first on a device (workloads/_timed.py's Device), never waiting for it: a mark after
    each step, read once completed; the rule sees the steps read so far, so the steps still queued when it
    says steady are warm-up too. `start`: the mark after the first step. Returns the steps launched, why it
    stopped, the last step's output, and a function that gives every step's time once the device has
    synchronised (after the timed phase)."""
    times = [first_s]
    queue: list[Any] = []
    prev = start
    t0 = clock()
    launched, out = 1, None
    while True:
        stopped = plan.stop(launched, times, first_s + clock() - t0)
        if stopped:
            break
        out = step()
        launched += 1
        if plan.adaptive:
            queue.append(device.mark())
            while queue and queue[0].query():
                mark = queue.pop(0)
                times.append(mark.seconds_since(prev))
                prev = mark

    def all_times() -> list[float]:
        nonlocal prev
        for mark in queue:
            times.append(mark.seconds_since(prev))
            prev = mark
        queue.clear()
        return times

    return launched, stopped, out, all_times
