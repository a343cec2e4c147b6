"""Each node against the fleet, with the error rate controlled across the whole fleet.

A node is compared with the fleet band of the other nodes through stats.compare_arms.
Holm at alpha / L per look and Bonferroni intervals hold any false call at alpha (docs/fleet.md)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from gpuvs.analysis import stats

SETTLED = ("slower", "faster", "equivalent", "slower-within-margin", "faster-within-margin")


@dataclass
class ErrorControl:
    """How the fleet's error rate is held: alpha over `looks` looks and `nodes` nodes (Holm)."""

    confidence: float
    looks: int
    nodes: int = 0
    method: str = "holm over nodes at alpha/looks per look; Bonferroni intervals"

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def per_look(self) -> float:
        return self.alpha / max(1, self.looks)

    @property
    def interval_confidence(self) -> float:
        return 1.0 - self.per_look / max(1, self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "alpha": self.alpha, "per_look": self.per_look,
                "interval_confidence": self.interval_confidence}


@dataclass
class NodeVerdict:
    node: str
    n: int
    mean: float | None
    reference: list[str]  # the nodes compared with (their trials pooled); [] for the named reference or no data
    verdict: str  # slower | faster | equivalent | inconclusive | reference
    ratio: float | None = None  # node / reference (of the metric, as measured)
    ci_low: float | None = None
    ci_high: float | None = None
    speed: float | None = None  # relative speed: ratio for rates, 1/ratio for times (below 1: slower)
    p_different: float | None = None
    p_equivalent: float | None = None
    p_different_adj: float | None = None  # Holm-adjusted, then x looks (compare with alpha)
    p_equivalent_adj: float | None = None
    trials_needed: int | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    log_ratio: float | None = None  # log(node / reference), its standard error and (Welch) df
    se: float | None = None
    df: float | None = None

    @property
    def settled(self) -> bool:
        return self.verdict in SETTLED or self.verdict == "reference"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def reference_for(node: str, means: Mapping[str, float], named: str | None = None,
                  margin: float = 0.0) -> list[str]:
    """The nodes `node` is compared with: [`named`], else the fleet band: the other nodes whose mean
    lies within +/-margin of the median of the other nodes' means. Where none does (peers spread
    wider than the margin), the median node of the others; with an even count, of the two middle
    nodes the one nearest `node`. [] where no other node has figures."""
    if named is not None:
        return [named] if named != node and named in means else []
    others = sorted((m, n) for n, m in means.items() if n != node and m > 0)
    k = len(others)
    if not k:
        return []
    mid = others[k // 2][0] if k % 2 else math.sqrt(others[k // 2 - 1][0] * others[k // 2][0])
    band = [n for m, n in others if abs(math.log(m / mid)) <= math.log1p(margin) + 1e-12] if margin > 0 else []
    if band:
        return sorted(band)
    if k % 2:
        return [others[k // 2][1]]
    own = means.get(node)
    pair = (others[k // 2 - 1], others[k // 2])
    if own is None or own <= 0:
        return [pair[0][1]]
    return [min(pair, key=lambda mn: abs(math.log(mn[0] / own)))[1]]


@dataclass(frozen=True)
class BandSpeed:
    """A node's speed against the fleet band of its peers in one run, on the log scale (positive: faster,
    whatever the unit): the ratio assess compares, with its standard error and (Welch) df."""

    node: str
    reference: tuple[str, ...]
    log_speed: float
    se: float
    df: float
    n: int  # the node's successful trials
    mean: float  # the node's mean figure, in the workload's unit


def band_speeds(values: Mapping[str, Sequence[float]], *, higher_is_better: bool, margin: float,
                reference: str | None = None) -> dict[str, BandSpeed]:
    """Each node with 2+ trials against the same reference as assess (reference_for), by the same
    unpaired ratio (stats.log_ratio, as compare_arms uses it): {node: BandSpeed}. Nodes without a
    reference (or the named reference itself) are left out."""
    means = {n: _mean(v) for n, v in values.items() if len(v) >= 2}
    out: dict[str, BandSpeed] = {}
    for node, vals in values.items():
        if node not in means or node == reference or means[node] <= 0:
            continue
        ref = reference_for(node, means, reference, margin)
        if not ref:
            continue
        p = stats.log_ratio([x for r in ref for x in values[r]], list(vals))
        sign = 1.0 if higher_is_better else -1.0
        out[node] = BandSpeed(node, tuple(ref), sign * p.log_r, p.se, p.df, len(vals), means[node])
    return out


def holm(pvalues: Mapping[str, float], alpha: float) -> tuple[set[str], dict[str, float]]:
    """Holm's step-down procedure: (the names rejected at level alpha, adjusted p-values)."""
    ordered = sorted(pvalues.items(), key=lambda kv: kv[1])
    m = len(ordered)
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[name] = running
    rejected = set()
    for i, (name, p) in enumerate(ordered):
        if p > alpha / (m - i):
            break
        rejected.add(name)
    return rejected, adjusted


def assess(values: Mapping[str, Sequence[float]], *, higher_is_better: bool, margin: float, control: ErrorControl,
           reference: str | None = None) -> list[NodeVerdict]:
    """A verdict per node from its successful trials' figures ({node: [figure per trial]})."""
    means = {n: _mean(v) for n, v in values.items() if v}
    comparable = {n for n, v in values.items() if len(v) >= 2}
    out: dict[str, NodeVerdict] = {}
    tested: dict[str, stats.Comparison] = {}
    candidates = {n: means[n] for n in comparable}
    control.nodes = max(1, sum(1 for n in values if n != reference))
    for node, vals in values.items():
        mean = means.get(node)
        if node == reference:
            out[node] = NodeVerdict(node, len(vals), mean, [], "reference", reason="the named reference node")
            continue
        if node not in comparable:
            out[node] = NodeVerdict(node, len(vals), mean, [], "inconclusive",
                                    reason="needs 2+ successful trials", trials_needed=2)
            continue
        ref = reference_for(node, candidates, reference, margin)
        if not ref:
            why = (f"reference node {reference} has fewer than 2 successful trials" if reference
                   else "no other node has 2+ successful trials")
            out[node] = NodeVerdict(node, len(vals), mean, [], "inconclusive", reason=why)
            continue
        pooled = [x for r in ref for x in values[r]]
        c = stats.compare_arms(pooled, list(vals), better="higher" if higher_is_better else "lower",
                               words=("faster", "slower") if higher_is_better else ("slower", "faster"),
                               margin=margin, confidence=control.interval_confidence)
        tested[node] = c
        ratio = c.ratio
        speed = None if ratio is None else (ratio if higher_is_better else 1.0 / ratio)
        out[node] = NodeVerdict(node, len(vals), mean, ref, "inconclusive", ratio=ratio, ci_low=c.ci_low,
                                ci_high=c.ci_high, speed=speed, p_different=c.p_different,
                                p_equivalent=c.p_equivalent, trials_needed=c.trials_needed, reason=c.reason,
                                log_ratio=c.log_r, se=c.se_log, df=c.df)
    level = control.per_look
    p_diff = {n: c.p_different for n, c in tested.items() if c.p_different is not None}
    p_eq = {n: c.p_equivalent for n, c in tested.items() if c.p_equivalent is not None}
    different, diff_adj = holm(p_diff, level)
    equivalent, eq_adj = holm(p_eq, level) if margin > 0 else (set(), {})
    for node in tested:
        v = out[node]
        v.p_different_adj = None if node not in diff_adj else min(1.0, diff_adj[node] * control.looks)
        v.p_equivalent_adj = None if node not in eq_adj else min(1.0, eq_adj[node] * control.looks)
        word = "faster" if v.speed is not None and v.speed > 1 else "slower"
        # within the margin, the difference is named where the interval shown excludes 1 (Bonferroni at
        # alpha/(L m), stricter than Holm's step): what the label says, the interval shows
        shown = v.ci_low is not None and v.ci_high is not None and (v.ci_low > 1 or v.ci_high < 1)
        if node in equivalent or node in different:
            v.verdict = stats.settled_verdict(node in equivalent, node in different and
                                              (shown or node not in equivalent), word)
            v.reason = ""
        elif not v.reason:
            v.reason = "the interval holds both 1 and a ratio outside the margin"
    return [out[n] for n in values]
