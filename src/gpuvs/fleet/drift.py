"""Drift: each node's latest run against its own earlier runs, with the error rate held across the fleet.

What is compared. A node's speed against the fleet band of its peers at each run (history.py), on the
log scale: y_t = log(node / band). A change of the whole fleet moves the band as much as the node and
cancels; what is left is the node's own movement. Drift = y_latest - mean(y over the node's last
`window` earlier runs, at least `min_history`), shown as a ratio (0.94: 6% slower than its past).
The runs compared were taken at different times, days apart: they are not interleaved, so the
verdict says that the node moved relative to its peers, not why. In a small fleet the band is one or
two peers, and a node that moves (within the fleet's margin, so that it stays in its peers' band)
moves their ratios the other way by up to half as much: read a small fleet's drift verdicts together.

Run-to-run variance. One run's standard error (from its trials) understates how much a node's ratio
moves from one run to the next: each run is another day, other pods and neighbours, another thermal
state. The variance used is that of the ratios themselves, from each node's `window` earlier runs by
successive differences (sum (y_t - y_{t-1})^2 / 2(K - 1): a node that stepped or slid inside its window
inflates it little), with Satterthwaite's df (2 (K-1)^2 / (3K - 4) per node). It holds both parts, the
trials' sampling error and the between-run component; the split is reported (between_sd).
A node's own estimate from 5-10 runs has 3-6 degrees of freedom, and Student's t at a level split over
8-32 nodes is then 1.4-3.5 times what it is with 60: so the nodes' estimates are pooled, and
each node's own is moderated towards the pool as far as the nodes' estimates are seen to differ
(empirical Bayes, Smyth 2004, limma's squeezeVar: prior df d0 from the spread of their logs beyond
chance; d0 = inf, the pooled variance for all, when they differ no more than chance allows). A node
much noisier than its peers is then tested with more of its own variance, though not all of it
(BENCHMARKS.md measures what that costs). A latest run measured less precisely than the history's
runs (fewer trials) adds the excess of its own variance; a more precise one never narrows it.

The test. t = drift / (sigma sqrt(1 + 1/K) [+ excess]), df as above; p of "no drift" (two-sided)
and the TOST p of "within +/-margin" (stats.p_values). Across the tested nodes, Holm's step-down at
alpha = 1 - confidence, once for "different" and once for "equivalent" (as gpuvs fleet does), so the
chance that any stable node of the fleet is called slower or faster than its past in one check is
at most alpha; the interval shown is simultaneous (Bonferroni, 1 - alpha/m). Each check is a new
test: over many checks a stable fleet still sees a false alarm about once every 1/alpha checks."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import special

from gpuvs import stats
from gpuvs.fleet import verdicts
from gpuvs.fleet.history import HistoryPoint, NodeHistory, t_quantile

WINDOW = 10
MIN_HISTORY = 3


@dataclass(frozen=True)
class RunSpread:
    """How much a node's log speed ratio moves from run to run (see the module): pooled over the fleet's
    nodes, and each node's own estimate moderated towards the fleet's (`nodes`: {node: (sd, df)})."""

    sd: float  # pooled run-to-run standard deviation of log speed (both parts)
    df: float
    within_sd: float  # the part one run's trials account for (root mean of their se^2)
    between_sd: float  # the rest: sqrt(max(0, sd^2 - within_sd^2)), estimated without bias
    differences: int  # successive differences used
    prior_df: float  # how far the nodes' own spreads agree (inf: as far as chance allows; the pooled sd)
    nodes: dict[str, tuple[float, float]]  # node -> its moderated (sd, df), used for its tests

    def of(self, node: str) -> tuple[float, float]:
        return self.nodes.get(node, (self.sd, self.df))


def _mssd(y: np.ndarray) -> tuple[float, float]:
    """Variance from successive differences and its Satterthwaite df (2 (K-1)^2 / (3 K - 4))."""
    k = y.size
    return float(np.sum(np.diff(y) ** 2)) / (2 * (k - 1)), 2.0 * (k - 1) ** 2 / (3 * k - 4)


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (Newton's method, as limma's trigammaInverse)."""
    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def _prior(own: list[tuple[float, float]]) -> tuple[float, float]:
    """(d0, s0^2): the scaled inverse chi-square that the nodes' own variances (var, df) are drawn
    around, by moments of their logs (Smyth 2004, limma's fitFDist); d0 = inf when they vary no more
    than chance does."""
    own = [(v, d) for v, d in own if v > 0]
    if len(own) < 2:
        return math.inf, own[0][0] if own else 0.0
    half = np.array([d for _, d in own]) / 2
    e = np.log([v for v, _ in own]) - special.digamma(half) + np.log(half)
    excess = float(np.var(e, ddof=1) - np.mean(special.polygamma(1, half)))
    if excess <= 0:
        return math.inf, float(math.exp(e.mean()))
    d0 = 2 * _trigamma_inverse(excess)
    return d0, float(math.exp(e.mean() + special.digamma(d0 / 2) - math.log(d0 / 2)))


def run_spread(series: Mapping[str, Sequence[tuple[float, float]]]) -> RunSpread | None:
    """The run-to-run spread of the nodes' series of (log_speed, se), each in time order: pooled, and
    per node its own (successive differences) moderated towards the pooled one by how much the nodes'
    own spreads are seen to differ. None when no series has two points."""
    q = s = dens = 0.0
    d = 0
    own: dict[str, tuple[float, float]] = {}
    for node, pts in series.items():
        if len(pts) < 2:
            continue
        y = np.array([p[0] for p in pts])
        se2 = np.array([p[1] for p in pts]) ** 2
        own[node] = _mssd(y)
        q += float(np.sum(np.diff(y) ** 2))
        s += float(np.sum(se2[1:] + se2[:-1]))
        d += len(pts) - 1
        dens += 6 * len(pts) - 8
    if not d:
        return None
    var, within2, df = q / (2 * d), s / (2 * d), 4.0 * d * d / dens
    d0, s02 = _prior(list(own.values()))
    if math.isinf(d0):
        nodes = {n: (math.sqrt(var), df) for n in series}
    else:
        nodes = {n: (math.sqrt((d0 * s02 + dn * vn) / (d0 + dn)), min(d0 + dn, df)) for n, (vn, dn) in own.items()}
        nodes.update({n: (math.sqrt(s02), min(d0, df)) for n in series if n not in own})
    return RunSpread(math.sqrt(var), df, math.sqrt(within2), math.sqrt(max(0.0, var - within2)), d, d0, nodes)


@dataclass
class DriftVerdict:
    """A node's latest run against its own earlier runs (speed against its peers, both)."""

    node: str
    workload: str
    verdict: str  # slower | faster | equivalent | inconclusive (than its own past)
    reason: str = ""
    run_id: str | None = None  # the latest run
    time: float | None = None
    baseline: list[str] = field(default_factory=list)  # the earlier runs compared with, oldest first
    baseline_from: float | None = None  # time of the first of them
    speed: float | None = None  # the latest speed vs fleet
    baseline_speed: float | None = None  # exp(mean log speed of the earlier runs)
    ratio: float | None = None  # speed / baseline_speed: below 1, slower than its past
    ci_low: float | None = None  # simultaneous over the tested nodes
    ci_high: float | None = None
    log_ratio: float | None = None
    se: float | None = None
    df: float | None = None
    p_different: float | None = None
    p_equivalent: float | None = None
    p_different_adj: float | None = None  # Holm-adjusted (compare with 1 - confidence)
    p_equivalent_adj: float | None = None
    interleaved: bool = False  # never: the runs compared were taken at different times

    @property
    def checks(self) -> int:
        return len(self.baseline)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DriftResult:
    """One check: every node's latest run against its past, for one workload."""

    workload: str
    run_id: str | None  # the latest run of the fleet
    confidence: float
    margin: float
    window: int
    min_history: int
    spread: RunSpread | None
    verdicts: list[DriftVerdict]
    tested: int = 0  # nodes that took part in Holm (m)
    method: str = ("latest run vs the mean of up to `window` earlier runs, log speed vs the fleet band; run-to-run "
                   "variance from successive differences, pooled and moderated per node; Holm over nodes; "
                   "not interleaved")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def interval_confidence(self) -> float:
        return 1.0 - self.alpha / max(1, self.tested)

    def verdict(self, node: str) -> DriftVerdict | None:
        return next((v for v in self.verdicts if v.node == node), None)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "alpha": self.alpha, "interval_confidence": self.interval_confidence}


def assess(hists: Sequence[NodeHistory], *, window: int = WINDOW, min_history: int = MIN_HISTORY,
           margin: float = 0.05, confidence: float = 0.95, latest: str | None = None) -> DriftResult:
    """Drift verdicts of one workload's node histories at the fleet's latest run (`latest`: that run's
    id; default the run of the newest point)."""
    if window < min_history or min_history < 2:
        raise ValueError(f"need 2 <= min_history <= window (got {min_history}, {window})")
    workloads = {h.workload for h in hists}
    if len(workloads) > 1:
        raise ValueError(f"one workload at a time (got {', '.join(sorted(workloads))})")
    workload = next(iter(workloads), "")
    newest = max((h.latest for h in hists if h.latest), key=lambda p: (p.time, p.run_id), default=None)
    latest = latest if latest is not None else (newest.run_id if newest else None)
    alpha = 1.0 - confidence
    out: list[DriftVerdict] = []
    earlier: dict[str, list[HistoryPoint]] = {}  # each node's runs before the latest (the last `window`)
    last: dict[str, HistoryPoint] = {}
    at = next((p.time for h in hists for p in h.points if p.run_id == latest), math.inf)
    for h in hists:
        v = DriftVerdict(h.node, h.workload, "inconclusive")
        out.append(v)
        earlier[h.node] = [p for p in h.points if p.time < at and p.run_id != latest][-window:]
        now = next((p for p in h.points if p.run_id == latest), None)
        if now is None:
            before = earlier[h.node]
            v.reason = "not measured in the latest run" + (f" (last in {before[-1].run_id})" if before else "")
            continue
        last[h.node], past = now, earlier[h.node]
        v.run_id, v.time, v.speed = now.run_id, now.time, now.speed
        v.baseline = [p.run_id for p in past]
        if past:
            v.baseline_from = past[0].time
            v.baseline_speed = math.exp(float(np.mean([p.log_speed for p in past])))
        if len(past) < min_history:
            v.reason = f"too few earlier runs: {len(past)} of the {min_history} needed"
    spread = run_spread({n: [(p.log_speed, p.se) for p in pts] for n, pts in earlier.items()})
    result = DriftResult(workload, latest, confidence, margin, window, min_history, spread, out)
    testable = [v for v in out if not v.reason]
    if spread is None or not spread.sd > 0:
        for v in testable:
            v.reason = "no run-to-run spread in the earlier runs: the interval cannot be bounded"
        return result
    result.tested = m = len(testable)
    for v in testable:
        now, past = last[v.node], earlier[v.node]
        sd, df = spread.of(v.node)
        d = now.log_speed - float(np.mean([p.log_speed for p in past]))
        se = math.sqrt(sd ** 2 * (1 + 1 / len(past)) + max(0.0, now.se ** 2 - spread.within_sd ** 2))
        q = t_quantile(1 - alpha / (2 * m), df)
        v.log_ratio, v.se, v.df, v.ratio = d, se, df, math.exp(d)
        v.ci_low, v.ci_high = math.exp(d - q * se), math.exp(d + q * se)
        v.p_different, v.p_equivalent = stats.p_values(d, se, df, margin)
    different, diff_adj = verdicts.holm({v.node: v.p_different for v in testable}, alpha)
    equivalent, eq_adj = verdicts.holm({v.node: v.p_equivalent for v in testable}, alpha) if margin > 0 else (set(), {})
    for v in testable:
        v.p_different_adj, v.p_equivalent_adj = diff_adj[v.node], eq_adj.get(v.node)
        if v.node in equivalent:
            v.verdict = "equivalent"
        elif v.node in different:
            v.verdict = "slower" if v.log_ratio < 0 else "faster"
        else:
            v.reason = "the interval holds both 1 and a ratio outside the margin"
    return result
