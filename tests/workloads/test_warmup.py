"""The adaptive warm-up (workloads/_warmup.py): its tests against scipy's, and its decisions on step series.

The series are shaped as GPUs' (cuDNN's autotuning, clocks ramping, noise), or recorded from real runs.
On the fake device of test_timed_phase.py it never waits; it adds no bias (benchmarks/warmup_bias.py).
End to end on the CPU: stored per trial, shown in "where the time went"."""

from __future__ import annotations

import json
import random
import sqlite3
import statistics
import sys
from pathlib import Path

import pytest
from scipy import stats

from gpuvs.analysis import timeshare
from gpuvs.store.records import SeriesSummary
from gpuvs.report import tables
from gpuvs.workloads import _warmup
from gpuvs.workloads._warmup import WINDOW, WarmupPlan

ROOT = Path(__file__).resolve().parents[2]
RECORDED = sorted((ROOT / "tests" / "data" / "warmup").glob("*.json"))
PLAN = WarmupPlan()


def replay(times, plan: WarmupPlan = PLAN) -> tuple[int, str]:
    """The steps an adaptive warm-up runs on this series, and why it stopped (the host's order: each step read
    as soon as it is done)."""
    elapsed = 0.0
    for i in range(1, len(times) + 1):
        elapsed += times[i - 1]
        why = plan.stop(i, times[:i], elapsed)
        if why:
            return i, why
    raise AssertionError(f"the series ({len(times)} steps) ended before the warm-up did")


def autotune(seed, cv=0.003):  # the first step autotunes, steps 2 and 3 are still slow, then flat
    r = random.Random(seed)
    return [4.0, 0.3, 0.2] + [0.064 * (1 + r.gauss(0, cv)) for _ in range(150)]


def clock_ramp(seed, cv=0.003):  # steps 30% slower at first, a steady decrease over 30 steps
    r = random.Random(seed)
    return [4.0] + [0.064 * (1 + 0.3 * max(0.0, 1 - i / 30)) * (1 + r.gauss(0, cv)) for i in range(1, 150)]


def noisy_flat(seed, cv=0.03):
    r = random.Random(seed)
    return [0.5] + [0.064 * (1 + r.gauss(0, cv)) for _ in range(150)]


def test_its_tests_are_scipys():
    r = random.Random(7)
    for _ in range(30):
        a = [r.random() for _ in range(WINDOW)]
        b = [r.random() + r.choice((0.0, 0.5)) for _ in range(WINDOW)]
        assert _warmup.mann_whitney_p(a, b) == pytest.approx(stats.mannwhitneyu(a, b, method="exact").pvalue)
        ys = [0.03 * i * r.choice((0, 1)) + r.random() for i in range(2 * WINDOW)]
        assert _warmup.mann_kendall_p(ys) == pytest.approx(stats.kendalltau(range(len(ys)), ys, method="exact").pvalue)
        assert _warmup.theil_sen_slope(ys) == pytest.approx(stats.theilslopes(ys).slope)


def test_an_autotune_that_ends_at_step_3_stops_soon_after():
    stops = [replay(autotune(seed)) for seed in range(200)]
    assert {why for _, why in stops} == {"steady"}
    steps = [n for n, _ in stops]
    assert PLAN.floor == 1 + 2 * WINDOW and min(steps) >= PLAN.floor
    assert statistics.median(steps) == PLAN.floor and max(steps) <= 3 + 2 * WINDOW + 3


def test_clocks_still_ramping_keep_it_going():
    stops = [replay(clock_ramp(seed)) for seed in range(200)]
    assert {why for _, why in stops} == {"steady"}
    assert min(n for n, _ in stops) >= 30  # never while the steps are still getting faster
    assert max(n for n, _ in stops) <= 30 + 3 * WINDOW  # and soon once they stop


def test_noise_alone_does_not_keep_it_going():
    steps = [replay(noisy_flat(seed))[0] for seed in range(300)]
    assert statistics.median(steps) == PLAN.floor
    assert sum(n <= PLAN.floor + 3 for n in steps) >= 0.9 * len(steps) and max(steps) < 40


def test_the_caps_and_a_fixed_count():
    growing = [0.1 * 1.02 ** i for i in range(500)]  # never steady
    assert replay(growing, WarmupPlan(max_steps=40)) == (40, "cap")
    assert replay(growing, WarmupPlan(max_steps=400, max_seconds=3.0))[1] == "cap"
    assert replay(growing, WarmupPlan(steps=5)) == (5, "fixed")
    assert WarmupPlan.from_params({"warmup_steps": 0, "warmup_max_steps": 30, "warmup_max_seconds": 9.0}) == \
        WarmupPlan(0, 30, 9.0)
    assert not WarmupPlan.from_params({"warmup_steps": 10}).adaptive


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_series(path):
    """Step series recorded from real runs (the first step's first, then every step, warm-up and timed:
    benchmarks/time_to_verdict.py part w on a GPU, a CPU run here). The rule stops inside the series, and
    where the series is long enough, the 30 steps after it run at the rate of the 30 after a 50-step warm-up
    (within 0.5% on a GPU; on a shared CPU, whose steps vary by tens of percent, within its own noise)."""
    data = json.loads(path.read_text())
    assert data["series"], path
    for s in data["series"]:
        times = s["times_s"]
        n, why = replay(times, WarmupPlan(max_steps=s.get("max_steps", 100)))
        assert why in ("steady", "cap") and n <= 100
        if "stopped" in s and s["stopped"] != "fixed":  # what the run itself decided: the rule, replayed
            assert (n, why) == (s["warmup_steps"], s["stopped"])
        if len(times) >= 80 and n + 30 <= len(times):
            adaptive, settled = sum(times[n:n + 30]), sum(times[50:80])
            tol = 0.005 if data.get("device", "cpu") != "cpu" else 3 * statistics.stdev(times[1:]) / statistics.mean(
                times[1:]) / 30 ** 0.5
            assert abs(settled / adaptive - 1) <= tol, (s.get("name"), n, settled / adaptive)


def test_no_bias_against_a_long_fixed_warm_up_and_the_aa_error_rate_is_unchanged():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import warmup_bias
    finally:
        sys.path.pop(0)
    r = warmup_bias.run(seeds=300, aa_sims=150)
    for row in r["bias"]:
        if row["slow"]:  # too slow and small for 2 x WINDOW steps to see: no worse than the fixed 10 of before
            assert abs(row["adaptive"]) <= abs(row["old_fixed"]) + 0.001, row
            continue
        assert abs(row["adaptive_minus_fixed"]) <= 0.005, row
        assert abs(row["adaptive"]) <= 0.005, row  # against the steady state the simulation knows
    aa = r["aa"]
    assert abs(aa["false_adaptive"] - aa["false_fixed"]) <= 0.02 and aa["false_adaptive"] <= 0.1, aa


class FakeMark:
    def __init__(self, dev, index, t):
        self.dev, self.index, self.t = dev, index, t

    def query(self) -> bool:
        return self.index <= self.dev.completed()

    def seconds_since(self, earlier) -> float:
        assert self.index <= self.dev.completed() and earlier.index <= self.dev.completed(), \
            "a mark was read before it had completed (reading it would have waited for the device)"
        return self.t - earlier.t

    def __getattr__(self, name):  # synchronize(), wait(): anything that could block
        raise AssertionError(f"the warm-up called {name}() on a step's mark")


class FakeDevice:
    """Step i takes durations[i] on the device's clock; marks complete `lag` marks behind the last recorded."""

    def __init__(self, durations, lag=3):
        self.durations, self.lag, self.marks, self.steps, self.synced = durations, lag, [], 0, False

    def step(self):
        self.steps += 1
        return self.steps

    def completed(self) -> int:
        return len(self.marks) - 1 if self.synced else len(self.marks) - 1 - self.lag

    def mark(self):
        m = FakeMark(self, len(self.marks), sum(self.durations[1:self.steps + 1]))
        self.marks.append(m)
        return m

    def synchronize(self):
        self.synced = True


def test_on_a_device_it_decides_on_the_steps_done_and_never_waits():
    series = autotune(3)
    dev = FakeDevice(series, lag=3)
    start = dev.mark()
    launched, why, out, all_times = _warmup.on_device(PLAN, dev.step, series[0], dev, start)
    # it decided on the steps read; the 3 still queued then were launched, and are warm-up too
    assert why == "steady" and launched == replay(series)[0] + 3 and out == launched - 1
    dev.synchronize()
    times = all_times()
    assert times == pytest.approx(series[:launched])


def test_what_it_decided_is_in_where_the_time_went():
    startup = {"launch_to_exit_s": 10.0, "launch_to_timed_s": 6.0, "warmup_s": 4.6}
    head = {"main": SeriesSummary(total_seconds=3.0)}
    t = timeshare.trial_time(startup, head, {"warmup_steps": 9, "warmup_stop": "steady"})
    assert (t.warm_up_steps, t.warm_up_stop) == (9, "steady")
    old = timeshare.trial_time(startup, head, {"warmup_steps": 10})  # a store of before: a fixed count
    assert (old.warm_up_steps, old.warm_up_stop) == (None, None)
    capped = timeshare.trial_time(startup, head, {"warmup_steps": 100, "warmup_stop": "cap"})
    ts = timeshare.shares(40.0, [t, t, capped, old])
    assert ts.warm_ups == [(9, "steady"), (9, "steady"), (100, "cap")]
    note = tables.time_shares_table(ts).note
    assert "warm-up until steady in 3 trial(s): 9 to 100 steps (median 9); cap 1, steady 2" in note
    assert ts.to_dict()["warm_ups"][2] == {"steps": 100, "stopped": "cap"}
    plain = timeshare.shares(40.0, [old])
    assert "warm_ups" not in plain.to_dict() and "warm-up until" not in tables.time_shares_table(plain).note


def test_adaptive_by_default_on_the_cpu_end_to_end(cli, tmp_path):
    """A real run (no --warmup-steps on a GPU is the same; the CPU's own default is a fixed 2, so 0 asks for it):
    what it decided is stored with the trial, the stored series replays to the same decision, and the run says it."""
    args = ("--device", "cpu", "--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--num-classes", "10",
            "--steps", "3", "--display-every", "3", "--warmup-max-seconds", "120")
    r = cli("run", "cnn-train", *args, "--warmup-steps", "0")
    assert r.returncode == 0, r.stderr
    assert f"Warm-up steps: adaptive, until steady: {PLAN.floor} to 100 steps or 120 s" in r.stdout
    con = sqlite3.connect(tmp_path / "gpuvs.db")
    config = json.loads(con.execute("SELECT config FROM trials").fetchone()[0])
    startup = json.loads(con.execute("SELECT startup FROM trials").fetchone()[0])
    n, why = config["warmup_steps"], config["warmup_stop"]
    assert why in ("steady", "cap") and n >= PLAN.floor and len(config["warmup_times_s"]) == n
    assert replay(config["warmup_times_s"], WarmupPlan(max_seconds=120)) == (n, why)
    assert startup["warmup_s"] == pytest.approx(sum(config["warmup_times_s"]), rel=0.05)
    assert f"warm-up until steady in 1 trial(s): {n} steps (median {n}); {why} 1" in " ".join(r.stdout.split())
    # a count given is a fixed count, as before: no decision stored
    r = cli("run", "cnn-train", *args, "--warmup-steps", "2")
    assert r.returncode == 0, r.stderr
    config = json.loads(con.execute("SELECT config FROM trials ORDER BY rowid DESC").fetchone()[0])
    assert config["warmup_steps"] == 2 and "warmup_stop" not in config and "warm-up until" not in r.stdout


def test_ranks_of_one_run_warm_up_alike():
    """Across several devices every rank must run the same steps (their gradients are all-reduced each step): no
    adaptive warm-up there, a fixed 10 where no count is given; a count given is kept."""
    from gpuvs.spec import RunSpec
    from gpuvs.workloads import cnn
    from gpuvs.workloads.workload import RunContext

    wl = cnn.CnnTrain()
    params = wl.validate({"warmup_steps": 0}, "cuda")
    spec = RunSpec(workload="cnn-train", params=params, device="cuda", num_gpus=2)
    assert cnn.CnnTrain.warmup_plan(RunContext(spec=spec, params=params, world_size=2)) == WarmupPlan(steps=10)
    assert cnn.CnnTrain.warmup_plan(RunContext(spec=spec, params=params)).adaptive
    given = wl.validate({"warmup_steps": 4}, "cuda")
    assert cnn.CnnTrain.warmup_plan(RunContext(spec=spec, params=given, world_size=2)) == WarmupPlan(steps=4)
    assert wl.validate({}, "cuda")["warmup_steps"] == 0  # the default a GPU user gets: adaptive
