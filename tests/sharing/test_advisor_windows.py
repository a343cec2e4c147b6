"""advise-mps's calibrated windows: sharing/windows.py's rule, its error model against a simulation, the advisor's loop.

The H100 step figures used here are those recorded in benchmarks/results/sharing-latency-h100.txt.
tests/data/advisor-pairs-h100.json holds each job's solo readings, not the steps of a window."""

import math

import numpy as np
import pytest

from gpuvs.sharing import windows
from gpuvs.sharing import share_stats as sharestats
from gpuvs.sharing.advisor import PairRuns, measure
from gpuvs.sharing.group import Group
from gpuvs.spec import RunSpec
from gpuvs.store.records import SampleRecord, SeriesSummary
from gpuvs.trial.runner import TrialResult

# the H100's ResNet-18 bs1 inference alone: 3 s / 468 steps; p99 / p50 = 24.75 / 7.78 as a lognormal spread
INFER_STEP_S = 3.0 / 468
INFER_SIGMA = math.log(24.75 / 7.78) / 2.326
TRAIN_STEP_S = 3.0 / 88


def _lognormal_steps(mean_s, sigma, n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(0.0, sigma, n)
    return list(x / x.mean() * mean_s)


def test_step_times_read_a_solo_window():
    st = windows.step_times("job", [0.01, 0.03, None, 0.02, 0.0])  # an untimed step and a zero are not steps
    assert st.n == 3 and st.mean_s == pytest.approx(0.02) and st.cv == pytest.approx(0.5)
    assert windows.step_times("job", []) is None and windows.step_times("job", [None]) is None


def test_the_error_model_matches_simulated_windows():
    # a window's rate (steps / time) over i.i.d. steps of CV c: relative error c / sqrt(steps). Simulated: 4,000
    # windows of 1.5 s of the H100 inference's spread (CV ~0.53), each counting the steps that ended inside it
    rng = np.random.default_rng(7)
    cv = math.sqrt(math.expm1(INFER_SIGMA ** 2))
    st = windows.StepTimes("infer", 468, INFER_STEP_S, cv)
    rates = []
    for _ in range(4000):
        x = rng.lognormal(0.0, INFER_SIGMA, 600) / math.exp(INFER_SIGMA ** 2 / 2) * INFER_STEP_S
        ends = np.cumsum(x)
        n = int(np.searchsorted(ends, 1.5, side="right"))
        rates.append(n / ends[n - 1])
    measured = np.std(rates) / np.mean(rates)
    assert measured == pytest.approx(st.error(1.5), rel=0.12), (measured, st.error(1.5))
    assert 0.025 < st.error(1.5) < 0.04  # about 3%: a 1.5 s window of this job is three times the 1% target


def test_small_batch_inference_gets_a_longer_window_and_says_why():
    st = windows.step_times("cnn-infer bs1", _lognormal_steps(INFER_STEP_S, INFER_SIGMA, 468))
    assert 0.45 < st.cv < 0.65
    # alone: (cv / 1%)^2 steps, about 2,800 of 6.4 ms: about 18 s, within a cap of 30 s
    need = math.ceil((st.cv / 0.01) ** 2) * st.mean_s
    w = windows.choose([st], floor_s=1.5, cap_s=30.0)
    assert w.seconds == pytest.approx(need) and 14 < w.seconds < 25
    assert w.error == pytest.approx(0.01, rel=0.01) and w.deciding == "cnn-infer bs1"
    assert w.reason.startswith(f"window {w.seconds:.3g} s: cnn-infer bs1: steps of 6.41 ms vary {100 * st.cv:.0f}%; "
                               f"1.5 s would give a {100 * st.error(1.5):.2g}% error (1% wanted)")
    # with the default cap (4 x --duration): the cap, and the error it leaves
    w = windows.choose([st], floor_s=1.5, cap_s=6.0)
    assert w.seconds == 6.0 and w.error == pytest.approx(st.cv / math.sqrt(6.0 / st.mean_s))
    assert "capped by --max-duration (it needs" in w.reason and f"6 s gives 936 steps, a {100 * w.error:.2g}% error" \
        in w.reason


def test_a_steady_job_keeps_the_duration():
    # ResNet-50 training on the H100: 34 ms steps; steady ones (CV 3%) need 50 steps, 1.7 s, under a 10 s --duration
    st = windows.StepTimes("cnn-train", 88, TRAIN_STEP_S, 0.03)
    w = windows.choose([st], floor_s=10.0, cap_s=40.0)
    assert w.seconds == 10.0 and w.reason.startswith("window 10 s (--duration): cnn-train: steps of 34.1 ms vary 3%")
    # with a 1.5 s --duration the 50 steps decide: 50 x 34 ms
    w = windows.choose([st], floor_s=1.5, cap_s=6.0)
    assert w.seconds == pytest.approx(50 * TRAIN_STEP_S) and "1.5 s would hold 44 steps (at least 50 wanted)" in w.reason
    # a need within 10% of --duration is --duration (not worth a second solo window)
    assert windows.choose([windows.StepTimes("x", 50, 0.0215, 0.0)], 1.0, 4.0).seconds == 1.0
    assert windows.choose([None], 1.0, 4.0).seconds == 1.0


def test_a_pair_gets_the_window_its_slower_job_needs_taking_turns():
    # the brief's example: steps of 3.1 ms varying 18% need (0.18 / 1%)^2 = 324 steps; alone 1.0 s, under the 1.5 s
    # floor; together, taking turns (twice as long a step), 2.01 s
    fast = windows.StepTimes("infer", 400, 0.0031, 0.18)
    slow = windows.StepTimes("train", 40, 0.015, 0.02)  # 50 steps taking turns: 1.5 s
    assert windows.choose([fast], 1.5, 15.0).seconds == 1.5
    w = windows.choose([fast, slow], 1.5, 15.0, slowdown=windows.PAIR_SLOWDOWN)
    assert w.seconds == pytest.approx(324 * 0.0031 * 2) and w.deciding == "infer"
    assert "1.5 s would give a 1.2% error (1% wanted)" in w.reason and "(taken as twice as long together)" in w.reason
    # the training job's 50 steps taking turns (3.4 s) decide once they are longer
    w = windows.choose([fast, windows.StepTimes("train", 40, 0.034, 0.02)], 1.5, 15.0, slowdown=2.0)
    assert w.seconds == pytest.approx(50 * 0.034 * 2) and w.deciding == "train"


class Recorder:
    """The coordinator's one call, group(), answered with steps of each job's own time (its --step-seconds-like
    spec param), as many as fit the window asked for; every (label, window) asked for is kept."""

    window_s = 1.5

    def __init__(self, step_s: dict[str, float]):
        self.step_s = step_s
        self.asked: list[tuple[str, float]] = []

    def group(self, specs, label, mps, gpm_window=False, window_s=None):
        window_s = window_s or self.window_s
        self.asked.append((label, window_s))
        g = Group(label=label, mps=mps, window_s=window_s)
        for spec in specs:
            step = self.step_s[spec.workload] * (2 if len(specs) > 1 else 1)
            n = int(window_s / step)
            g.trials.append(TrialResult(status="ok", summary={"main": SeriesSummary(
                n=n, unit="items/sec", better="higher", value=1 / step)},
                samples=[SampleRecord(None, "main", i, 1 / step, "items/sec", seconds=step) for i in range(n)]))
        return g


def test_the_advisor_measures_each_pair_in_its_calibrated_window():
    # a 3.2 ms job beside a 34 ms one, --duration 1.5, cap 6: the slow job's 1.5 s holds 44 steps, so it is
    # measured alone again at 1.7 s (50 steps); the pair takes 3.4 s (50 steps each of it taking turns)
    coord = Recorder({"infer": 0.0032, "train": 0.034})
    specs = {n: RunSpec(workload=n) for n in ("infer", "train")}
    pr = PairRuns("infer", "train", plan=sharestats.repeats_plan(2, 2))
    said = []
    measure(coord, specs, [pr], 2, cuda=True, max_window_s=6.0, say=said.append)
    slow = pytest.approx(50 * 0.034)
    assert coord.asked == [("A alone", 1.5), ("B alone", 1.5), ("B alone", slow), ("A+B", pytest.approx(3.4)),
                           ("A+B, MPS", pytest.approx(3.4)), ("A alone", 1.5), ("B alone", slow),
                           ("A+B", pytest.approx(3.4)), ("A+B, MPS", pytest.approx(3.4))]
    assert pr.window.seconds == pytest.approx(3.4) and pr.solo_windows["B alone"].seconds == slow
    assert [g.window_s for g in pr.runs["B alone"]] == [slow, slow]  # the calibrated one, not the short one
    assert said[1].startswith("B alone: window 1.7 s: train: steps of 34 ms") and said[1].endswith("measured alone "
                                                                                                    "again at it")
    assert said[2].startswith("A+B: window 3.4 s: train")
    # uncalibrated (the cap at the floor): every window the floor, as before
    coord = Recorder({"infer": 0.0032, "train": 0.034})
    pr = PairRuns("infer", "train", plan=None)
    measure(coord, specs, [pr], 1, cuda=True, max_window_s=1.5)
    assert coord.asked == [("A alone", 1.5), ("B alone", 1.5), ("A+B", 1.5), ("A+B, MPS", 1.5)] and pr.window is None
