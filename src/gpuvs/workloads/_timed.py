"""The timed phase shared by step-based workloads (cnn-train, cnn-infer): how long it runs, how its steps are timed.

A fixed `--steps N`, or adaptive: until the rate's own +/- reaches `--target-se`, or `--seconds` pass.
On a GPU each step's event is read only once completed, so the host never waits inside the phase.
Nothing here calls torch: the marks come from a `Device` (a fake in tests/workloads/test_timed_phase.py); docs/trials.md."""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

from gpuvs import events
from gpuvs.errors import UsageError
from gpuvs.params import Param

PARAMS = (
    Param("target_se", float, 0.0, "adaptive timed phase: stop once the rate's relative standard error (+/- over "
          "the figure) is at most this, e.g. 0.005 (0: off)", min=0.0, max=1.0),
    Param("seconds", float, 0.0, "adaptive timed phase: stop after this many seconds of timed steps (0: off)",
          min=0.0, max=1e7),
    Param("min_steps", int, 10, "adaptive timed phase: at least this many timed steps", min=2, max=10_000_000),
    Param("max_steps", int, 1000, "adaptive timed phase: at most this many timed steps", min=2, max=10_000_000),
)


@dataclass(frozen=True)
class PhaseLength:
    """How long a timed phase runs: `steps` (fixed), or adaptive when target_se or seconds is set."""

    steps: int
    target_se: float = 0.0
    seconds: float = 0.0
    min_steps: int = 10
    max_steps: int = 1000

    @classmethod
    def from_params(cls, params: dict[str, Any], windowed: bool = False) -> PhaseLength:
        """Under a shared window (gpuvs share) the window decides and --steps is its cap: never adaptive."""
        if windowed:
            return cls(steps=int(params["steps"]))
        return cls(steps=int(params["steps"]), target_se=float(params.get("target_se") or 0.0),
                   seconds=float(params.get("seconds") or 0.0), min_steps=int(params.get("min_steps") or 10),
                   max_steps=int(params.get("max_steps") or 1000))

    @property
    def adaptive(self) -> bool:
        return self.target_se > 0 or self.seconds > 0

    @property
    def cap(self) -> int:
        return self.max_steps if self.adaptive else self.steps

    def done(self, launched: int, rates: RateStats, elapsed_s: float) -> bool:
        """Stop launching steps? `launched`: steps started; `rates`: those read so far; `elapsed_s`: since
        the phase began."""
        if launched >= self.cap:
            return True
        if not self.adaptive or launched < self.min_steps or rates.n < min(self.min_steps, 2):
            return False
        if self.seconds > 0 and elapsed_s >= self.seconds:
            return True
        return self.target_se > 0 and rates.n >= self.min_steps and rates.relative_se() <= self.target_se

    def describe(self) -> str:
        """For the config block: what decides the phase's length."""
        if not self.adaptive:
            return str(self.steps)
        rules = []
        if self.target_se > 0:
            rules.append(f"+/- at most {100 * self.target_se:g}% of the rate")
        if self.seconds > 0:
            rules.append(f"{self.seconds:g} s")
        return f"adaptive: until {' or '.join(rules)}, {self.min_steps} to {self.max_steps} steps"


def check(params: dict[str, Any]) -> None:
    if params.get("min_steps", 10) > params.get("max_steps", 1000):
        raise UsageError(f"--min-steps {params['min_steps']} is above --max-steps {params['max_steps']}")


class RateStats:
    """Running tf_cnn_benchmarks figures of the steps read so far: total items / total seconds, and the
    population standard deviation of per-step rates (Welford)."""

    def __init__(self) -> None:
        self.n = 0
        self.items = 0.0
        self.seconds = 0.0
        self._mean = 0.0
        self._m2 = 0.0

    def add(self, items: float, seconds: float) -> None:
        rate = items / seconds if seconds > 0 else 0.0
        self.n += 1
        self.items += items
        self.seconds += seconds
        delta = rate - self._mean
        self._mean += delta / self.n
        self._m2 += delta * (rate - self._mean)

    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("nan")

    def pm(self) -> float:
        return math.sqrt(self._m2 / self.n) / math.sqrt(self.n) if self.n else float("nan")

    def relative_se(self) -> float:
        rate = self.rate()
        return self.pm() / rate if rate and rate == rate else float("inf")


class Mark(Protocol):
    def query(self) -> bool: ...

    def seconds_since(self, earlier: Mark) -> float: ...


class Device(Protocol):
    """What the timed phase needs of a device: marks recorded in its stream, a way to copy a step's loss
    to the host that is ready once the next mark has completed, and one synchronise."""

    def mark(self) -> Mark: ...

    def capture(self, value: Any) -> Any: ...

    def read(self, captured: Any) -> float: ...

    def synchronize(self) -> None: ...


class CudaDevice:
    """torch's CUDA events; a display step's loss goes to pinned host memory on the stream (no host wait)."""

    SLOTS = 8

    def __init__(self, torch) -> None:
        self.torch = torch
        self._free: list[Any] = []

    def mark(self) -> _CudaMark:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return _CudaMark(event)

    def prepare(self, sample: Any) -> None:
        """Pinned host slots for losses shaped like `sample` (made before the phase: no allocation in it)."""
        if sample is not None and hasattr(sample, "dtype"):
            self._free = [self.torch.empty((), dtype=sample.dtype, pin_memory=True) for _ in range(self.SLOTS)]

    def capture(self, value: Any) -> Any:
        if value is None or not self._free:
            return None
        slot = self._free.pop()
        slot.copy_(value.reshape(()), non_blocking=True)
        return slot

    def read(self, captured: Any) -> float:
        self._free.append(captured)
        return float(captured)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


class _CudaMark:
    __slots__ = ("event",)

    def __init__(self, event) -> None:
        self.event = event

    def query(self) -> bool:
        return bool(self.event.query())

    def seconds_since(self, earlier: _CudaMark) -> float:
        return earlier.event.elapsed_time(self.event) / 1000.0


Sample = Callable[..., dict[str, Any]]


class TimedPhase:
    """One timed phase. `run()` yields the samples; afterwards `durations` holds every step's seconds."""

    def __init__(self, plan: PhaseLength, step: Callable[[], Any], *, items: float, unit: str, display: int,
                 window_open: Callable[[], bool] = lambda: True, device: Device | None = None,
                 clock: Callable[[], float] = time.perf_counter, with_loss: bool = True):
        self.plan = plan
        self.step = step
        self.items = items
        self.unit = unit
        self.display = max(1, int(display))
        self.window_open = window_open
        self.device = device
        self.clock = clock
        self.with_loss = with_loss
        self.durations: list[float] = []
        self.rates = RateStats()
        self.start_mark: Any = None  # the device's mark of the phase's start (set by run)

    def _sample(self, step: int, sec: float, loss: float | None, line: bool) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if loss is not None and line:
            extra["loss"] = loss
        return events.sample(step, self.items / sec if sec > 0 else 0.0, self.unit, seconds=sec, items=self.items,
                             **extra)

    def run(self) -> Iterator[dict[str, Any]]:
        if self.device is None:
            yield from self._run_host()
        else:
            yield from self._run_device()

    def _run_host(self) -> Iterator[dict[str, Any]]:
        """A host clock per step: the step's work is done when step() returns."""
        i, reported, last = 0, 0, self.clock()
        t0 = last
        pending: list[float] = []
        while True:
            i += 1
            out = self.step()
            now = self.clock()
            sec = now - last
            last = now
            pending.append(sec)
            self.durations.append(sec)
            self.rates.add(self.items, sec)
            closing = not self.window_open()
            stop = closing or self.plan.done(i, self.rates, now - t0)
            if i % self.display == 0 or stop:
                loss = float(out) if (out is not None and self.with_loss) else None
                for j, s in enumerate(pending, start=reported + 1):
                    yield self._sample(j, s, loss, j == i)
                reported, pending = i, []
            if stop:
                return

    def _run_device(self) -> Iterator[dict[str, Any]]:
        """Marks after every step, read only once completed; one synchronise after the last step."""
        dev = self.device
        assert dev is not None
        prev = self.start_mark = dev.mark()  # the warm-up's steps are still queued: the first step waits for none
        queue: collections.deque = collections.deque()  # (step, mark, captured loss) not read yet
        ready: list[tuple[int, float, Any]] = []  # read, not yet emitted
        t0 = self.clock()
        i = 0

        def read(block: bool) -> None:
            nonlocal prev
            while queue and (block or queue[0][1].query()):
                j, mark, captured = queue.popleft()
                sec = mark.seconds_since(prev)
                prev = mark
                self.durations.append(sec)
                self.rates.add(self.items, sec)
                ready.append((j, sec, dev.read(captured) if captured is not None else None))

        while True:
            i += 1
            out = self.step()
            closing = not self.window_open()
            stop = closing or self.plan.done(i, self.rates, self.clock() - t0)
            shown = i % self.display == 0 or stop  # a step of the log: its loss rides along, on the stream
            captured = dev.capture(out) if (out is not None and self.with_loss and shown) else None
            queue.append((i, dev.mark(), captured))
            if self.plan.adaptive or i % self.display == 0:
                read(block=False)
            if i % self.display == 0 and ready:
                yield from self._emit(ready, last=None)
            if stop:
                break
        dev.synchronize()
        read(block=True)
        yield from self._emit(ready, last=i)

    def _emit(self, ready: list[tuple[int, float, Any]], last: int | None) -> Iterator[dict[str, Any]]:
        """Samples of the steps read; a display step (and the last step) carries its loss for the log line."""
        for j, sec, loss in ready:
            line = j % self.display == 0 or j == last
            yield self._sample(j, sec, loss, line)
        ready.clear()
