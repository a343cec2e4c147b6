"""Error rates over the whole family of comparisons of one experiment: every arm against the baseline, every metric.

The headline metric tests each of k arms at alpha / k; the others share alpha * r / k behind a gatekeeper.
So the chance of any false verdict, headline or not, stays at alpha (docs/compare.md).
Metrics declared `tested=False`, or not declared by the workload, are descriptive."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from gpuvs.analysis import stats
from gpuvs.analysis import sequential
from gpuvs.store.records import LookSchedule


@dataclass
class MetricVerdict(stats.Comparison):
    """One arm against the baseline on one metric (a row of the verdict table): the comparison, what it
    compared, and how the family tested it. declared_tested: the workload declares the figure tested;
    tested: it was given a verdict (None: a gated row that had no p-value to test); family: which family
    decided it and at what level."""

    metric: str = ""
    unit: str | None = ""
    arm: str = ""
    baseline: str = ""
    headline: bool = False
    declared_tested: bool = True
    interleaved: bool = False
    tested: bool | None = None
    family: str | None = None

    _HEAD = ("metric", "unit", "arm", "baseline", "headline", "declared_tested", "interleaved")

    def to_dict(self) -> dict[str, Any]:
        """What the row compared, the comparison, then how the family tested it (the JSON of a verdict row)."""
        out = {k: getattr(self, k) for k in self._HEAD}
        out.update(super().to_dict())
        for k in ("tested", "family"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricVerdict:
        return cls(**{**{f.name: getattr(stats.Comparison.from_dict(data), f.name) for f in fields(stats.Comparison)},
                      **{k: v for k, v in data.items() if k in cls._HEAD + ("tested", "family")}})

    @classmethod
    def of(cls, c: stats.Comparison, **what: Any) -> MetricVerdict:
        return cls(**{f.name: getattr(c, f.name) for f in fields(stats.Comparison)}, **what)


def headline_levels(alpha: float, k: int, plan: LookSchedule | None = None, rounds: int = 0) -> tuple[float, float]:
    """(difference level, equivalence level) of each arm's headline comparison."""
    share = alpha / max(1, k)
    if plan is None:
        return share, share
    return sequential.levels(plan, rounds, share)


def describe(row: MetricVerdict, alpha: float, why: str) -> MetricVerdict:
    """A comparison shown, not tested: its interval at 1 - alpha, no verdict."""
    if row.se_log:
        stats.decide(row, alpha, alpha, False)
    row.verdict, row.also, row.different, row.equivalent, row.tested = "descriptive", None, False, False, False
    row.trials_needed = row.more_trials = None
    row.reason = why
    return row


def holm(rows: list[MetricVerdict], alpha: float, estimate: bool = True) -> None:
    """Holm's step-down over the difference and equivalence hypotheses of `rows` (compare_arms
    results with p-values) at family level alpha; each row's verdict is made at the level of the
    step that decided it (so its interval agrees with its verdict)."""
    hyps = sorted(((r.p_different, i, "diff") for i, r in enumerate(rows) if r.p_different is not None),
                  key=lambda h: h[0])
    hyps += sorted(((r.p_equivalent, i, "eq") for i, r in enumerate(rows) if r.p_equivalent is not None),
                   key=lambda h: h[0])
    hyps.sort(key=lambda h: h[0])
    open_ = {i: 2 for i, r in enumerate(rows) if r.p_different is not None}
    decided: dict[int, float] = {}
    threshold = alpha / max(1, len(open_))
    for p, i, _ in hyps:
        # a comparison counts while either of its hypotheses is open: at most one of the two is true
        threshold = alpha / max(1, sum(1 for c in open_.values() if c > 0))
        if p > threshold:
            break
        open_[i] -= 1
        decided.setdefault(i, threshold)
    for i, r in enumerate(rows):
        if r.p_different is not None:
            level = decided.get(i, threshold)
            stats.decide(r, level, level, estimate)
            r.tested = True


def adjust(rows: list[MetricVerdict], alpha: float, arms: int, plan: LookSchedule | None = None, rounds: int = 0,
           estimate: bool = True) -> None:
    """Set the verdicts of one experiment's comparisons in place; arms: the number of arms compared
    with the baseline."""
    level, level_eq = headline_levels(alpha, arms, plan, rounds)
    heads = [r for r in rows if r.headline]
    for r in heads:
        if r.se_log:
            stats.decide(r, level, level_eq, estimate)
        r.tested = True
        r.family = (f"headline: {arms} arm{'s' if arms > 1 else ''} at alpha/{arms}" if arms > 1 else "headline") + (
            f", look {plan.look(rounds) + 1} of {len(plan.looks())} (alpha spending)" if plan else "")
    established = sum(1 for r in heads if r.different)
    share = alpha * established / max(1, arms)
    others = [r for r in rows if not r.headline]
    gated = []
    for r in others:
        if not r.declared_tested:
            describe(r, alpha, "descriptive: the workload does not test this figure")
            r.family = "descriptive"
        elif share <= 0:
            describe(r, alpha, "descriptive: tested only once the headline shows a difference")
            r.family = "descriptive"
        else:
            gated.append(r)
    holm(gated, share, estimate)
    for r in gated:
        r.family = f"other metrics: Holm over {len(gated)} at alpha x {established}/{arms}"


def compare_all(metrics, values: list[dict[str, dict[Any, float]]], names: list[str], *, margin: float,
                confidence: float, paired: bool, floors: list[dict[str, float]] | None = None,
                plan: LookSchedule | None = None, rounds: int = 0, estimate: bool = True) -> list[MetricVerdict]:
    """Every arm against the first on every metric, verdicts made for the family. metrics: objects
    with name, unit, better, up, down, headline, tested (comparison.Metric); values[i][metric]:
    arm i's figures by round ({round: figure}); floors[i][metric]: its per-trial floor; estimate:
    compute trials to settle (the simulations in benchmarks/verdicts.py skip it where not needed)."""
    rows = []
    for metric in metrics:
        for i in range(1, len(values)):
            fa = floors[0].get(metric.name, 0.0) if floors else 0.0
            fb = floors[i].get(metric.name, 0.0) if floors else 0.0
            result = stats.compare_arms(values[0].get(metric.name, {}), values[i].get(metric.name, {}),
                                        better=metric.better, words=(metric.up, metric.down), margin=margin,
                                        confidence=confidence, paired=paired, floor_a=fa, floor_b=fb,
                                        estimate=False)
            rows.append(MetricVerdict.of(result, metric=metric.name, unit=metric.unit, arm=names[i],
                                         baseline=names[0], headline=metric.headline, declared_tested=metric.tested,
                                         interleaved=paired))
    adjust(rows, round(1 - confidence, 12), len(values) - 1, plan, rounds, estimate)
    return rows
