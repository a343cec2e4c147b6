"""Change points: where in its history a node's speed against its peers changed, so that "since when?"
has an answer (the first run at the new level: its id and time), with the step's size and interval.

Statistic. On a node's series of log speed ratios y_1..y_n (history.py), for each split k with at
least `min_segment` runs on each side, Z_k = (mean(y after k) - mean(y up to k)) / (sigma sqrt(1/k +
1/(n-k))); the statistic is max_k |Z_k| and the change point is its argmax. sigma is the run-to-run
spread pooled over the fleet's nodes from successive differences (drift.run_spread), which a step
inflates little; it is the same estimate the drift verdict uses.

Threshold. Under no change (the ratios independent, equal mean and spread) max |Z| with a known sigma
has a distribution that depends only on n and min_segment: it is drawn once per (n, min_segment) by
Monte Carlo (NULL_DRAWS series of normals, a fixed seed, so the same history gives the same answer),
and sigma's own uncertainty (Satterthwaite's df) is integrated over a grid of chi-square quantiles.
That gives each node a p-value; Holm's step-down across the fleet's nodes at alpha = 1 - confidence
keeps the chance of any false change point in a stable fleet, per check, at most alpha. A node found
changed is then split further (binary segmentation): each side with 2 x min_segment runs or more is
tested the same way at alpha / m (m nodes tested), so a node that changed twice shows both.

The step at a change point compares the segments on either side of it (up to the neighbouring change
points): exp(mean after - mean before), with a t interval from the same sigma, simultaneous over the
nodes (Bonferroni). Found where the difference was largest, the step is biased away from zero when it
is small (it was selected for being large); the interval does not correct for that.

Why not a change-point library (ruptures, say): they place breakpoints for a given penalty or count
but give no p-value, so the penalty would still have to be calibrated against a fleet-wide error
rate and an interval added; the max-|Z| test with its calibrated null is the few lines below."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import special

from gpuvs.fleet import drift, verdicts
from gpuvs.fleet.history import NodeHistory, t_quantile

MIN_SEGMENT = 2
NULL_DRAWS = 100_000  # p-values down to 1e-5: Holm's first step over 100 nodes is at 5e-4
_GRID = 64  # chi-square quantiles for sigma's uncertainty
_CHUNK = 20_000


@dataclass
class ChangePoint:
    """Where a node's speed against its peers changed: between `previous_run_id` and `run_id`."""

    node: str
    workload: str
    run_id: str  # the first run at the new level
    time: float
    previous_run_id: str  # the last run before it
    previous_time: float
    index: int  # position of run_id in the history analysed
    runs_before: int  # runs in the segments compared
    runs_after: int
    step: float  # speed after / speed before: below 1, slower since run_id
    ci_low: float
    ci_high: float
    log_step: float
    se: float
    df: float
    p_value: float  # of the test that found it (the node's first: before Holm; a later split's: at alpha/m)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NodeChanges:
    node: str
    workload: str
    runs: int  # points analysed
    tested: bool
    reason: str = ""  # why it was not tested
    p_value: float | None = None  # of its first (whole-history) test
    p_adjusted: float | None = None  # Holm-adjusted over the fleet's nodes
    change_points: list[ChangePoint] = field(default_factory=list)  # in time order

    @property
    def latest(self) -> ChangePoint | None:
        """The most recent change: "since when?"."""
        return self.change_points[-1] if self.change_points else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ChangeResult:
    workload: str
    confidence: float
    min_segment: int
    spread: drift.RunSpread | None
    nodes: list[NodeChanges]
    tested: int = 0
    method: str = ("max |Z| over splits, pooled run-to-run sigma (successive differences), Monte Carlo null; "
                   "Holm over nodes, then binary segmentation at alpha/m")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def node(self, name: str) -> NodeChanges | None:
        return next((n for n in self.nodes if n.node == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def max_z(y: np.ndarray, min_segment: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row of y (series of n values of unit variance): max over splits k (k values before, at
    least min_segment each side) of |Z_k|, and that k."""
    n = y.shape[-1]
    c = np.cumsum(y, axis=-1)
    k = np.arange(min_segment, n - min_segment + 1)
    z = np.abs((c[..., -1:] - c[..., k - 1]) / (n - k) - c[..., k - 1] / k) / np.sqrt(1.0 / k + 1.0 / (n - k))
    i = z.argmax(-1)
    return np.take_along_axis(z, i[..., None], -1)[..., 0], k[i]


@functools.lru_cache(maxsize=128)
def null_distribution(n: int, min_segment: int) -> np.ndarray:
    """max |Z| of NULL_DRAWS series of n independent standard normals, sorted (fixed seed)."""
    rng = np.random.default_rng([n, min_segment])
    parts, left = [], NULL_DRAWS
    while left:
        b = min(left, max(1, _CHUNK * 16 // n))
        parts.append(max_z(rng.standard_normal((b, n)), min_segment)[0])
        left -= b
    return np.sort(np.concatenate(parts))


def p_value(t: float, n: int, min_segment: int, df: float) -> float:
    """P(max |Z| >= t) for n runs without change, sigma estimated with `df` degrees of freedom."""
    null = null_distribution(n, min_segment)
    if math.isinf(df) or df > 1e6:
        scale = np.ones(1)
    else:  # observed = known-sigma statistic / sqrt(chi2_df / df)
        scale = np.sqrt(special.chdtri(df, 1 - (np.arange(_GRID) + 0.5) / _GRID) / df)
    above = null.size - np.searchsorted(null, t * scale, side="left")
    return float(np.mean((above + 1) / (null.size + 1)))


def _test(y: np.ndarray, min_segment: int, df: float) -> tuple[float, int]:
    t, k = max_z(y[None, :], min_segment)
    return p_value(float(t[0]), y.size, min_segment, df), int(k[0])


def _split(y: np.ndarray, lo: int, hi: int, min_segment: int, df: float, level: float,
           found: dict[int, float]) -> None:
    if hi - lo < 2 * min_segment:
        return
    p, k = _test(y[lo:hi], min_segment, df)
    if p <= level:
        found[lo + k] = p
        _split(y, lo, lo + k, min_segment, df, level, found)
        _split(y, lo + k, hi, min_segment, df, level, found)


def _refine(y: np.ndarray, cuts: list[int], min_segment: int, rounds: int = 3) -> list[int]:
    """Each change point placed again where max |Z| is between its neighbours: a split made first
    on the whole history lands between two steps, off by a run or more, and the neighbours fix it."""
    for _ in range(rounds):
        moved = False
        for j in range(len(cuts)):
            a = cuts[j - 1] if j else 0
            b = cuts[j + 1] if j + 1 < len(cuts) else y.size
            k = a + int(max_z(y[None, a:b], min_segment)[1][0])
            moved |= k != cuts[j]
            cuts[j] = k
        if not moved:
            break
    return cuts


def detect(hists: Sequence[NodeHistory], *, confidence: float = 0.95, min_segment: int = MIN_SEGMENT,
           max_points: int | None = None) -> ChangeResult:
    """Change points of one workload's node histories (the last `max_points` runs of each; all: None)."""
    if min_segment < 1:
        raise ValueError(f"min_segment must be at least 1 (got {min_segment})")
    workloads = {h.workload for h in hists}
    if len(workloads) > 1:
        raise ValueError(f"one workload at a time (got {', '.join(sorted(workloads))})")
    alpha = 1.0 - confidence
    points = {h.node: list(h.points[-max_points:] if max_points else h.points) for h in hists}
    spread = drift.run_spread({n: [(p.log_speed, p.se) for p in pts] for n, pts in points.items()})
    nodes = [NodeChanges(h.node, h.workload, len(points[h.node]), False) for h in hists]
    result = ChangeResult(next(iter(workloads), ""), confidence, min_segment, spread, nodes)
    for nc in nodes:
        if nc.runs < 2 * min_segment:
            nc.reason = f"too few runs: {nc.runs} of the {2 * min_segment} needed"
        elif spread is None or not spread.sd > 0:
            nc.reason = "no run-to-run spread: the step cannot be scaled"
    testable = [nc for nc in nodes if not nc.reason]
    if not testable:
        return result
    result.tested = m = len(testable)
    scale = {nc.node: spread.of(nc.node) for nc in testable}  # (sd, df) of each node
    y = {nc.node: np.array([p.log_speed for p in points[nc.node]]) / scale[nc.node][0] for nc in testable}
    first = {nc.node: _test(y[nc.node], min_segment, scale[nc.node][1]) for nc in testable}
    changed, adjusted = verdicts.holm({n: pk[0] for n, pk in first.items()}, alpha)
    for nc in testable:
        nc.tested, (nc.p_value, k) = True, first[nc.node]
        nc.p_adjusted = adjusted[nc.node]
        if nc.node not in changed:
            continue
        sd, df = scale[nc.node]
        found = {k: nc.p_value}
        series = y[nc.node]
        _split(series, 0, k, min_segment, df, alpha / m, found)
        _split(series, k, series.size, min_segment, df, alpha / m, found)
        cuts = _refine(series, sorted(found), min_segment)
        found = dict(zip(cuts, (found[c] for c in sorted(found))))
        bounds = [0, *cuts, series.size]
        pts = points[nc.node]
        q = t_quantile(1 - alpha / (2 * m), df)
        for j, c in enumerate(cuts):
            a, b = bounds[j], bounds[j + 2]
            step = float(series[c:b].mean() - series[a:c].mean()) * sd
            se = sd * math.sqrt(1 / (c - a) + 1 / (b - c))
            nc.change_points.append(ChangePoint(
                nc.node, nc.workload, pts[c].run_id, pts[c].time, pts[c - 1].run_id, pts[c - 1].time, c, c - a, b - c,
                math.exp(step), math.exp(step - q * se), math.exp(step + q * se), step, se, df, found[c]))
    return result
