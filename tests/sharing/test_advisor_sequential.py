"""advise-mps's measured verdict that settles (issue 37): the advisor's own loop and statistics.

sharing/advisor.py's measure, PairRuns and verdicts, and sharing/share_stats.py's mps_verdict with a plan.
They are fed repeat figures shaped as the H100 recorded them (benchmarks/results/sharing-measured-h100.json).
Only the window itself is replayed, since MPS needs a GPU."""

import math

import numpy as np
import pytest

from gpuvs.analysis import sequential
from gpuvs.sharing import share_stats as sharestats
from gpuvs.sharing.advisor import PairRuns, measure, unsettled_why, verdicts
from gpuvs.sharing.group import Group
from gpuvs.spec import RunSpec
from gpuvs.store.records import LookSchedule, SeriesSummary
from gpuvs.trial.runner import TrialResult

SOLO = 100.0  # each job's rate alone; a group's rates are work / 2 of it per job


def _trial(rate: float) -> TrialResult:
    return TrialResult(status="ok", summary={"main": SeriesSummary(n=10, unit="items/sec", better="higher",
                                                                   value=rate)})


class Replay:
    """The coordinator's one call, group(), answered with recorded figures: per pair, the work time-sliced
    and under MPS (mean and CV between repeats, drawn with a fixed seed); every group asked for is kept."""

    def __init__(self, pairs: dict[tuple[str, str], tuple[float, float, float]], seed: int = 1):
        self.pairs = pairs
        self.rng = np.random.default_rng(seed)
        self.asked: list[str] = []

    window_s = 1.0

    def group(self, specs, label, mps, gpm_window=False, window_s=None):
        self.asked.append(label)
        g = Group(label=label, mps=mps)
        if len(specs) == 1:
            g.trials = [_trial(SOLO)]
            return g
        sliced, with_mps, cv = self.pairs[(specs[0].workload, specs[1].workload)]
        work = (with_mps if mps else sliced) * math.exp(cv * self.rng.standard_normal())
        g.trials = [_trial(SOLO * work / 2), _trial(SOLO * work / 2)]
        return g


def _run(pairs, repeats=3, max_repeats=8, margin=0.05, seed=1):
    specs = {name: RunSpec(workload=name) for pair in pairs for name in pair}
    plan = sharestats.repeats_plan(repeats, max_repeats)
    runs = [PairRuns(a, b, plan=plan, margin=margin) for a, b in pairs]
    coord = Replay(pairs, seed)
    measure(coord, specs, runs, repeats, cuda=True)
    return runs, coord


def test_a_clear_pair_settles_at_the_first_look():
    # training beside small inference on the H100: 1.53 time-sliced, 1.73 under MPS; 1% between repeats
    (pr,), coord = _run({("train", "infer"): (1.53, 1.73, 0.01)})
    v = pr.verdict()
    assert v.words == "mps helps" and v.settled and len(pr.work["A+B, MPS"]) == 3
    assert coord.asked == ["A alone", "B alone", "A+B", "A+B, MPS"] * 3
    # tested at the nominal level of look 1 of compare --until-confident's plan (looks 3, 4, ..., 8), paired
    plan = LookSchedule(3, 8, 1)
    assert v.comparison.method == "paired"
    assert v.comparison.level == pytest.approx(sequential.levels(plan, 3, 0.05)[0])
    assert v.comparison.level < 0.05 and unsettled_why(v) is None


def test_repeats_are_added_until_the_verdict_settles():
    # the ratio 1.13 with 3% noise per group: three repeats do not call it at look 1's level (this seed);
    # added repeats do
    (pr,), coord = _run({("a", "b"): (1.53, 1.73, 0.03)}, seed=2)
    n = len(pr.work["A+B, MPS"])
    v = pr.verdict()
    assert 3 < n < 8 and v.settled and v.words == "mps helps", (n, v.words, v.ci_low, v.ci_high)
    assert coord.asked.count("A+B, MPS") == n and coord.asked.count("A alone") == n
    # it stopped at the first look that settled: one repeat fewer was not settled
    earlier = sharestats.mps_verdict(pr.work["A+B"][:-1], pr.work["A+B, MPS"][:-1], 0.05, pr.plan)
    assert not earlier.settled


def test_a_pair_that_cannot_settle_stops_at_the_cap_and_says_why():
    # identical inferences on the H100: MPS within 2% of time-slicing, 25% noise between repeats
    (pr,), coord = _run({("infer", "infer2"): (1.96, 1.98, 0.25)})
    v = pr.verdict()
    assert len(pr.work["A+B, MPS"]) == 8 and not v.settled and v.words == "inconclusive"
    why = unsettled_why(v)
    assert why.startswith("not settled within the cap of 8 repeats (8 measured): the work ratio varies by ")
    cv = float(why.split("varies by ")[1].split("%")[0])
    assert 15 < cv < 50  # the replayed noise (25% on each of the pair's two groups, ~35% on their ratio)
    need = int(why.split("about ")[1].split(" repeats")[0])
    assert need > 8 and v.comparison.trials_needed == need


def test_with_several_pairs_only_the_unsettled_ones_are_measured_again():
    pairs = {("train", "infer"): (1.53, 1.73, 0.01), ("hot", "hot2"): (1.96, 1.98, 0.25)}
    (clear, noisy), coord = _run(pairs)
    assert len(clear.work["A+B, MPS"]) == 3 and len(noisy.work["A+B, MPS"]) == 8
    # the clear pair's jobs ran alone only in the three planned repeats
    assert coord.asked.count("alone: train") == 3 and coord.asked.count("alone: hot") == 8
    assert coord.asked.count("pair 1: A+B") == 3 and coord.asked.count("pair 2: A+B, MPS") == 8
    _, _, verdict = verdicts(clear, None, 0.05)
    assert verdict.words == "mps helps"


def test_a_cap_at_or_below_the_repeats_is_a_fixed_count():
    assert sharestats.repeats_plan(3, 3) is None and sharestats.repeats_plan(4, 2) is None
    (pr,), coord = _run({("infer", "infer2"): (1.96, 1.98, 0.25)}, repeats=3, max_repeats=3)
    assert len(pr.work["A+B, MPS"]) == 3 and pr.verdict().plan is None and unsettled_why(pr.verdict()) is None
    assert sharestats.repeats_plan(2, 8) == LookSchedule(3, 8, 1)  # the paired test needs 3


def test_no_repeats_are_added_on_the_cpu():
    pairs = {("infer", "infer2"): (1.96, 1.98, 0.25)}
    specs = {n: RunSpec(workload=n) for n in ("infer", "infer2")}
    pr = PairRuns("infer", "infer2", plan=sharestats.repeats_plan(2, 8))
    coord = Replay(pairs)
    measure(coord, specs, [pr], 2, cuda=False)
    assert coord.asked == ["A alone", "B alone", "A+B"] * 2 and pr.verdict() is None
