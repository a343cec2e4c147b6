"""Every statistic the sharing commands print, built on analysis/stats.py's public functions.

A figure over repeated groups, a ratio of two arms in compare's words, and the MPS verdict.
With repeats added, the MPS verdict is compare --until-confident's sequential rule (analysis/sequential.py).
Statistics only: their text is report/sharing.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from gpuvs.analysis import sequential, stats
from gpuvs.store.records import LookSchedule, SampleRecord, SeriesSummary
from gpuvs.store.summary import summarize_series

_PER_SECOND = {"s": 1.0, "sec": 1.0, "seconds": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}


def as_rate(summary: SeriesSummary | None) -> tuple[float, str]:
    """A series summary's headline as a rate: itself, or for a duration (ms per run) runs per second, so
    that workers' figures can be added up."""
    summary = summary or SeriesSummary()
    unit = summary.unit or ""
    value = summary.value or 0.0
    if summary.better != "lower":  # the workload declared it; only a time is turned into a rate
        return value, summary.unit
    return (_PER_SECOND.get(unit.strip().lower(), 1.0) / value if value else 0.0), "runs/sec"


def window_rate(samples: list[SampleRecord], declared) -> tuple[float, str] | None:
    """The rate of the samples of one worker that arrived within one window (its first series);
    `declared` is its workload's Workload.declared (which way is better)."""
    if not samples:
        return None
    series = samples[0].series
    decl = declared(series)
    return as_rate(summarize_series([s for s in samples if s.series == series], decl.better if decl else None))


@dataclass
class Latency:
    """Per-step times (ms) of one worker: median, 99th percentile, how many steps."""

    p50: float
    p99: float
    n: int


def latency_ms(samples: list[SampleRecord]) -> Latency | None:
    """p50 and p99 of the per-step time (ms) of samples that carry their seconds (one batch each)."""
    secs = [1e3 * s.seconds for s in samples if s.seconds]
    if not secs:
        return None
    s = summarize_series([SampleRecord(None, "main", i, v, "ms") for i, v in enumerate(secs, 1)])
    return Latency(s.p50, s.p99, s.n)


@dataclass
class Figure:
    """One figure over repeated groups: mean and its confidence interval (None bounds under 2 values)."""

    values: list[float]
    mean: float | None
    low: float | None
    high: float | None


def figure(values: Sequence[float | None], confidence: float = 0.95) -> Figure:
    vals = [float(v) for v in values if v is not None]
    s = stats.summarize_trials(vals, confidence)
    if not s.n:
        return Figure([], None, None, None)
    two = s.n >= 2
    return Figure(vals, s.mean, s.ci_low if two else None, s.ci_high if two else None)


def compare(base: Sequence[float | None], other: Sequence[float | None], margin: float) -> stats.Comparison:
    """other against base over repeated groups: compare's ratio, interval and verdict words. Every figure
    compared here is a rate (throughput, work done): higher is faster."""
    return stats.compare_arms([v for v in base if v is not None], [v for v in other if v is not None],
                              better="higher", words=("faster", "slower"), margin=margin)


MPS_WORDS = {"faster": "mps helps", "slower": "mps hurts", "equivalent": "no difference",
             "faster-within-margin": "mps helps, within the margin",
             "slower-within-margin": "mps hurts, within the margin", "inconclusive": "inconclusive"}


@dataclass
class MpsVerdict:
    """MPS against time-slicing on the work done: the comparison, and its verdict in the advisor's words."""

    comparison: stats.Comparison
    words: str  # mps helps | mps hurts | no difference | inconclusive
    plan: LookSchedule | None = None  # the looks of a sequential measurement (None: a fixed count, unpaired)

    @property
    def settled(self) -> bool:
        return self.ratio is not None and self.words != "inconclusive"

    @property
    def cv(self) -> float | None:
        """The pair's noise: the spread between repeats of the per-repeat MPS / time-sliced work ratio, as a
        coefficient of variation (sqrt(exp(sd^2) - 1) of the log ratios' sd)."""
        sd = self.comparison.unit_sd
        return math.sqrt(math.expm1(sd * sd)) if sd else None

    @property
    def ratio(self) -> float | None:
        return self.comparison.ratio

    @property
    def ci_low(self) -> float | None:
        return self.comparison.ci_low

    @property
    def ci_high(self) -> float | None:
        return self.comparison.ci_high

    @property
    def verdict(self) -> str:
        return self.comparison.verdict

    @property
    def reason(self) -> str:
        return self.comparison.reason

    @property
    def more_trials(self) -> int | None:
        return self.comparison.more_trials


def mps_verdict(sliced_work: Sequence[float | None], mps_work: Sequence[float | None],
                margin: float, plan: LookSchedule | None = None, confidence: float = 0.95) -> MpsVerdict:
    """MPS against time-slicing on the work done (sum over jobs of together/alone): the comparison with
    its verdict in the advisor's words (helps / hurts / no difference within ±margin / inconclusive).

    plan: the looks of a measurement that adds repeats until it settles (first = the repeats planned, step
    1, cap = --max-repeats): the repeats are paired (both groups of a repeat are divided by that repeat's
    solo rates) and tested at the nominal levels of the look reached, so that looking after every repeat
    keeps a false verdict at 1 - confidence (benchmarks/verdicts.py, the advisor's table)."""
    if plan is None:
        out = compare(sliced_work, mps_work, margin)
        return MpsVerdict(out, MPS_WORDS[out.verdict])
    rounds = max(len(sliced_work), len(mps_work))
    level, level_eq = sequential.levels(plan, rounds, round(1 - confidence, 12))
    out = stats.compare_arms(list(sliced_work), list(mps_work), better="higher", words=("faster", "slower"),
                             margin=margin, confidence=confidence, level=level, level_eq=level_eq, paired=True)
    return MpsVerdict(out, MPS_WORDS[out.verdict], plan)


def repeats_plan(repeats: int, max_repeats: int) -> LookSchedule | None:
    """The looks of advise-mps's measurement: after the planned repeats (at least 3, the fewest the paired
    test takes), after every added repeat, up to the cap; None where the cap is not above the repeats
    planned (a fixed count, judged as before: unpaired, at 1 - confidence)."""
    if max_repeats <= repeats:
        return None
    first = max(stats.PAIRED_MIN, repeats)
    return LookSchedule(first=first, cap=max(first, max_repeats), step=1)
