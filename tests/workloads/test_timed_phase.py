"""The timed phase (workloads/_timed.py): how long it runs, and how it reads a device's step events.

It runs fixed --steps, or adaptively (--target-se, --seconds, --min-steps, --max-steps), and never waits inside.
The device is a fake whose marks complete a few steps behind, as a GPU's queue does; the loop is production's.
Then the real thing on the CPU, end to end."""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest

from gpuvs.errors import UsageError
from gpuvs.store.records import SampleRecord
from gpuvs.store.summary import perf_timing, summarize_samples
from gpuvs.workloads import _timed
from gpuvs.workloads._timed import PhaseLength, RateStats, TimedPhase


class FakeMark:
    def __init__(self, dev: "FakeDevice", index: int, t: float):
        self.dev, self.index, self.t = dev, index, t

    def query(self) -> bool:
        self.dev.log.append(("query", self.index))
        return self.index <= self.dev.completed()

    def seconds_since(self, earlier: "FakeMark") -> float:
        assert self.index <= self.dev.completed() and earlier.index <= self.dev.completed(), \
            "an event was read before it had completed (reading it would have waited for the device)"
        return self.t - earlier.t

    def __getattr__(self, name):  # synchronize(), wait(), elapsed_time()...: anything that could block
        raise AssertionError(f"the timed phase called {name}() on a step's mark")


class FakeDevice:
    """A device whose clock advances by `durations[i]` for step i and whose marks complete `lag` marks
    behind the last one recorded (the queue the host keeps ahead), all of them after synchronize()."""

    def __init__(self, durations, lag: int = 3):
        self.durations = list(durations)
        self.lag = lag
        self.marks: list[FakeMark] = []
        self.log: list = []
        self.steps = 0
        self.synced = False
        self.captures: dict[int, float] = {}

    def step(self, loss: float | None = 1.0):
        self.steps += 1
        self.log.append(("step", self.steps))
        return None if loss is None else loss / self.steps

    def completed(self) -> int:
        return len(self.marks) - 1 if self.synced else len(self.marks) - 1 - self.lag

    def mark(self) -> FakeMark:
        t = sum(self.durations[:self.steps])
        m = FakeMark(self, len(self.marks), t)
        self.marks.append(m)
        self.log.append(("mark", m.index))
        return m

    def capture(self, value):
        self.log.append(("capture", self.steps))
        return (len(self.marks), value)  # ready once the next mark (this step's) has completed

    def read(self, captured) -> float:
        index, value = captured
        assert index <= self.completed(), "a loss was read before its step had completed"
        return value

    def synchronize(self) -> None:
        self.log.append(("sync",))
        self.synced = True


def _phase(dev: FakeDevice, plan: PhaseLength, display: int = 10, loss: bool = True, clock=None) -> TimedPhase:
    kw = {"clock": clock} if clock else {}
    return TimedPhase(plan, lambda: dev.step(1.0 if loss else None), items=256, unit="images/sec",
                      display=display, device=dev, **kw)


def test_a_device_phase_never_waits_inside_and_reads_every_step_once():
    rng = np.random.default_rng(1)
    durations = list(0.065 * (1 + 0.01 * rng.standard_normal(40)))
    dev = FakeDevice(durations, lag=3)
    phase = _phase(dev, PhaseLength(steps=30), display=10)
    out = list(phase.run())
    syncs = [i for i, e in enumerate(dev.log) if e[0] == "sync"]
    last_step = max(i for i, e in enumerate(dev.log) if e[0] == "step")
    assert len(syncs) == 1 and syncs[0] > last_step  # one synchronise, after the last step was queued
    assert dev.steps == 30
    assert [e["step"] for e in out] == list(range(1, 31))  # every step once, in order
    assert [e["seconds"] for e in out] == pytest.approx(durations[:30])
    assert [e["value"] for e in out] == pytest.approx([256 / d for d in durations[:30]])
    # at display steps 10 and 20 only what had completed was emitted (the rest after the synchronise)
    emitted_before_sync = [e for e in out if e["step"] <= 30 - 1 - 3]
    assert emitted_before_sync  # something was read without waiting
    # the log's lines: display steps and the last carry the loss of their own step
    lines = {e["step"]: e["extra"]["loss"] for e in out if "loss" in e["extra"]}
    assert lines == pytest.approx({10: 1 / 10, 20: 1 / 20, 30: 1 / 30})
    # the figures keep their meaning: total items over total time, +/- over per-step rates
    summary = summarize_samples([SampleRecord.from_event(e) for e in out])["main"]
    assert summary.value == pytest.approx(256 * 30 / sum(durations[:30]))
    assert summary.pm == pytest.approx(np.std([256 / d for d in durations[:30]]) / math.sqrt(30))
    assert phase.durations == pytest.approx(durations[:30])


def test_the_first_mark_is_the_phase_start_and_marks_follow_each_step():
    dev = FakeDevice([0.01] * 5, lag=1)
    phase = _phase(dev, PhaseLength(steps=5), display=2, loss=False)
    list(phase.run())
    kinds = [e for e in dev.log if e[0] in ("step", "mark", "sync")]
    assert kinds[0] == ("mark", 0) and phase.start_mark is dev.marks[0]
    assert kinds[1:11] == [x for i in range(1, 6) for x in (("step", i), ("mark", i))]
    assert ("capture", 2) not in dev.log  # inference: no loss, nothing copied


def test_an_adaptive_phase_stops_at_its_target_and_never_waits():
    rng = np.random.default_rng(7)
    cv = 0.02
    durations = list(0.05 * (1 + cv * rng.standard_normal(5000)))
    dev = FakeDevice(durations, lag=2)
    target = 0.002
    phase = _phase(dev, PhaseLength(steps=100, target_se=target, min_steps=10, max_steps=5000), display=10)
    out = list(phase.run())
    n = len(out)
    assert [e["step"] for e in out] == list(range(1, n + 1)) and dev.steps == n
    assert sum(1 for e in dev.log if e[0] == "sync") == 1
    rates = [256 / d for d in durations[:n]]
    rel = np.std(rates) / math.sqrt(n) / (256 * n / sum(durations[:n]))
    assert rel <= target  # it ran until the rate's +/- was at most 0.2% of the figure...
    expected = (cv / target) ** 2  # ...about (CV / target)^2 steps, not the fixed 100
    assert 0.6 * expected < n < 1.6 * expected + 2 + 3  # (+ the steps still queued when it decided)


def test_an_adaptive_phase_keeps_its_floor_cap_and_time_budget():
    steady = [0.01] * 100
    dev = FakeDevice(steady, lag=0)
    out = list(_phase(dev, PhaseLength(steps=50, target_se=0.5, min_steps=12, max_steps=100)).run())
    assert len(out) == 13  # no spread at all: the floor decides (on the 12 steps read by then, +1 queued)
    ticks = iter([0.01 * k for k in range(200)])
    out = list(TimedPhase(PhaseLength(steps=50, target_se=0.5, min_steps=12, max_steps=100), lambda: 1.0, items=1,
                          unit="x", display=5, clock=lambda: next(ticks)).run())
    assert len(out) == 12  # on the host every step is read as it ends: exactly the floor
    dev = FakeDevice(list(0.01 * (1 + 0.5 * np.random.default_rng(0).standard_normal(100)) + 0.02), lag=0)
    out = list(_phase(dev, PhaseLength(steps=50, target_se=1e-9, min_steps=2, max_steps=37)).run())
    assert len(out) == 37  # an unreachable target: the cap decides
    ticks = iter(range(1000))
    clock = lambda: float(next(ticks))  # one "second" per reading of the clock
    dev = FakeDevice([0.01] * 1000, lag=0)
    out = list(_phase(dev, PhaseLength(steps=50, seconds=20, min_steps=5, max_steps=1000), clock=clock).run())
    assert 15 <= len(out) <= 25  # --seconds 20 with the clock read once per step


def test_a_host_phase_is_as_before():
    """On the CPU (no device): a host clock per step, samples at display steps and at the end, the loss of
    the display step, nothing else."""
    ticks = iter([0.0] + [0.1 * k for k in range(1, 100)])
    calls = []

    def step():
        calls.append(1)
        return 2.0

    phase = TimedPhase(PhaseLength(steps=7), step, items=8, unit="images/sec", display=3, clock=lambda: next(ticks))
    out = list(phase.run())
    assert [e["step"] for e in out] == list(range(1, 8)) and len(calls) == 7
    assert [e["seconds"] for e in out] == pytest.approx([0.1] * 7)
    assert {e["step"] for e in out if "loss" in e["extra"]} == {3, 6, 7}


def test_window_closing_ends_the_phase():
    opened = iter([True, True, True, False, True])
    dev = FakeDevice([0.01] * 10, lag=1)
    phase = TimedPhase(PhaseLength(steps=10), lambda: dev.step(), items=1, unit="x", display=5, device=dev,
                       window_open=lambda: next(opened))
    out = list(phase.run())
    assert [e["step"] for e in out] == [1, 2, 3, 4] and out[-1]["extra"]["loss"] == pytest.approx(1 / 4)


def test_rate_stats_match_the_summary():
    rng = np.random.default_rng(3)
    secs = list(0.1 + 0.01 * rng.random(50))
    r = RateStats()
    for s in secs:
        r.add(4.0, s)
    rate, pm, _ = perf_timing([4.0] * 50, secs)
    assert r.rate() == pytest.approx(rate) and r.pm() == pytest.approx(pm)
    assert r.relative_se() == pytest.approx(pm / rate)


def test_plan_from_params_and_bad_values():
    p = {"steps": 30, "target_se": 0.005, "seconds": 0.0, "min_steps": 10, "max_steps": 500}
    assert PhaseLength.from_params(p).adaptive and PhaseLength.from_params(p).cap == 500
    assert not PhaseLength.from_params(p, windowed=True).adaptive  # a shared window decides under gpuvs share
    assert PhaseLength.from_params({**p, "target_se": 0.0}).cap == 30
    assert "adaptive" in PhaseLength.from_params(p).describe()
    with pytest.raises(UsageError, match="--min-steps 20 is above --max-steps 10"):
        _timed.check({"min_steps": 20, "max_steps": 10})


def test_warm_up_runs_into_the_timed_phase_with_no_synchronise_between(monkeypatch):
    """cnn's GPU path (timed_on_device) with the fake device: the first step's synchronise, then the
    warm-up's mark, the warm-up's steps, the phase's start mark while they are still queued, the timed
    steps, and one synchronise at the very end; warm-up and launch-to-timed come from the device's clock."""
    from gpuvs.spec import RunSpec
    from gpuvs.workloads import cnn
    from gpuvs.workloads.workload import RunContext

    durations = [0.05] * 100
    dev = FakeDevice(durations, lag=3)
    dev.prepare = lambda out: dev.log.append(("prepare",))
    monkeypatch.setattr(cnn._timed, "CudaDevice", lambda torch: dev)
    wl = cnn.CnnTrain()
    params = wl.validate({"steps": 20, "warmup_steps": 5, "display_every": 10}, "cpu")
    ctx = RunContext(spec=RunSpec(workload="cnn-train", params=params, launched_at=None), params=params)
    data = iter(range(1000))
    out = list(wl.timed_on_device(ctx, PhaseLength.from_params(params), lambda batch: dev.step(1.0), data, None, first=2.0))
    log = [e for e in dev.log if e[0] in ("step", "mark", "sync")]
    assert log[0] == ("mark", 0)  # the warm-up's start, right after the first step (done by the caller)
    assert log[1:5] == [("step", i) for i in range(1, 5)]  # warm-up steps 2..5: no synchronise, no mark
    assert log[5] == ("mark", 1)  # the timed phase's start, queued behind them
    assert [e for e in log if e[0] == "sync"] == [("sync",)] and log[-1] == ("sync",)
    samples = [e for e in out if e["type"] == "sample"]
    startup = {e["name"]: e["seconds"] for e in out if e["type"] == "startup"}
    assert [e["step"] for e in samples] == list(range(1, 21))
    assert startup["warmup_s"] == pytest.approx(2.0 + 4 * 0.05)  # first step + warm-up steps on the device


@pytest.mark.parametrize("workload", ["cnn-train", "cnn-infer"])
def test_adaptive_cnn_on_the_cpu_end_to_end(cli, tmp_path, workload):
    r = cli("run", workload, "--device", "cpu", "--model", "resnet18", "--batch-size", "2", "--image-size", "32",
            "--warmup-steps", "1", "--target-se", "0.5", "--min-steps", "4", "--max-steps", "9",
            "--display-every", "2")
    assert r.returncode == 0, r.stderr
    assert "adaptive: until +/- at most 50% of the rate, 4 to 9 steps" in r.stdout
    con = sqlite3.connect(tmp_path / "gpuvs.db")
    steps = [s for (s,) in con.execute("SELECT step FROM samples ORDER BY rowid")]
    summary = json.loads(con.execute("SELECT summary FROM trials").fetchone()[0])["main"]
    assert 4 <= len(steps) <= 9 and steps == list(range(1, len(steps) + 1))
    assert summary["n"] == len(steps) and summary["pm"] / summary["value"] <= 0.5 or len(steps) == 9


@pytest.mark.parametrize("args, message", [
    (["--min-steps", "30", "--max-steps", "10"], "--min-steps 30 is above --max-steps 10"),
    (["--target-se", "-1"], "--target-se: '-1' is not allowed; expected a number from 0 to 1"),
    (["--target-se", "0.01", "--num-gpus", "2"], "every rank must run the same steps"),
])
def test_bad_timed_phase_options_are_one_line_exit_2(cli, args, message):
    r = cli("run", "cnn-train", "--device", "cpu", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
