"""Change points: where in its history a node's speed against its peers changed ("since when?").

A max-|Z| test over the splits of peers.py's contrasts, its null drawn by Monte Carlo, blamed by peers.blame.
A node found changed is split again (binary segmentation). The method, and why no library: docs/history.md."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import special

from gpuvs.fleet.assess import drift
from gpuvs.fleet.assess import peers
from gpuvs.fleet.assess.node_history import NodeHistory, t_quantile

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


@dataclass(frozen=True)
class RelativePoint:
    """A node's speed against its peers in one run (the series change points are found in)."""

    run_id: str
    time: float
    speed: float  # exp(log speed vs the mean of the peers measured in that run)
    se: float  # of log speed, from the run's trials (the run-to-run spread is the RunSpread's)


@dataclass
class NodeChanges:
    node: str
    workload: str
    runs: int  # points analysed
    tested: bool
    reason: str = ""  # why it was not tested
    p_value: float | None = None  # of its whole-history test against `reference`
    p_adjusted: float | None = None  # of the closed test over the fleet's nodes (peers.blame)
    reference: list[str] = field(default_factory=list)  # the peers it was held against (not found changed)
    series: list[RelativePoint] = field(default_factory=list)  # its speed against them, run by run
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
    method: str = ("max |Z| over splits of log speed vs the mean of the peers in each run, pooled run-to-run sigma "
                   "(successive differences), Monte Carlo null; a node is found changed when Holm over the fleet and "
                   "over the fleet without each other node agree (closed test), then binary segmentation at alpha/m")

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


@functools.lru_cache(maxsize=4096)
def _sigma_grid(df: float) -> np.ndarray:
    """sqrt(chi2_df / df) at _GRID evenly spaced quantiles: how an estimated sigma scales the statistic."""
    if math.isinf(df) or df > 1e6:
        return np.ones(_GRID)
    return np.sqrt(special.chdtri(df, 1 - (np.arange(_GRID) + 0.5) / _GRID) / df)


def p_values(t: np.ndarray, n: int, min_segment: int, df: np.ndarray) -> np.ndarray:
    """P(max |Z| >= t) for n runs without change, sigma estimated with `df` degrees of freedom (arrays
    of the same shape: one p per statistic); observed = known-sigma statistic / sqrt(chi2_df / df),
    integrated over df's grid."""
    null = null_distribution(n, min_segment)
    t = np.atleast_1d(np.asarray(t, float)).ravel()
    df = np.broadcast_to(np.asarray(df, float), t.shape)
    scale = np.stack([_sigma_grid(float(d)) for d in df]) if t.size else np.ones((0, _GRID))
    above = null.size - np.searchsorted(null, (t[:, None] * scale).ravel(), side="left").reshape(scale.shape)
    return np.mean((above + 1) / (null.size + 1), axis=1)


def p_value(t: float, n: int, min_segment: int, df: float) -> float:
    """P(max |Z| >= t) for n runs without change, sigma estimated with `df` degrees of freedom."""
    return float(p_values(np.array([t]), n, min_segment, np.array([df]))[0])


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


def _scaled(t: peers.Table, c: peers.Contrasts, i: int, spread: drift.RunSpread, base_peers: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Node i's series against the contrast's peers: (its columns, y / sd, sd, df), sd grown with a
    smaller reference (peers.variance_scale)."""
    cols, y, _ = c.series(i)
    sd, df = spread.of(t.nodes[i])
    sd *= math.sqrt(float(peers.variance_scale(c.peers[i], base_peers[i])))
    return cols, y / sd, sd, df


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
    nodes = [NodeChanges(h.node, h.workload, len(points[h.node]), False) for h in hists]
    result = ChangeResult(next(iter(workloads), ""), confidence, min_segment, None, nodes)
    for nc in nodes:
        if nc.runs < 2 * min_segment:
            nc.reason = f"too few runs: {nc.runs} of the {2 * min_segment} needed"
    members = [nc for nc in nodes if not nc.reason]
    while True:  # members whose runs have too few peers measured alongside are left out, and the rest again
        if len(members) < 2:
            for nc in members:
                nc.reason = "no peer with enough runs to hold it against"
            return result
        t = peers.table({nc.node: points[nc.node] for nc in members})
        everyone = np.ones(len(t.nodes), bool)
        base = peers.contrasts(t, everyone)
        for i, nc in enumerate(members):
            if (got := base.series(i)[1].size) < 2 * min_segment:
                nc.reason = f"too few runs with a peer measured in the same run: {got} of the {2 * min_segment} needed"
        if all(not nc.reason for nc in members):
            break
        members = [nc for nc in members if not nc.reason]
    spread = drift.run_spread({n: list(zip(*base.series(i)[1:])) for i, n in enumerate(t.nodes)}, contrasts=True)
    result.spread = spread
    if spread is None or not spread.sd > 0:
        for nc in members:
            nc.reason = "no run-to-run spread: the step cannot be scaled"
        return result
    result.tested = m = len(members)

    sd0 = np.array([spread.of(n)[0] for n in t.nodes])
    df0 = np.array([spread.of(n)[1] for n in t.nodes])

    def p_of(reference: np.ndarray) -> dict[int, float]:
        c = peers.contrasts(t, reference)
        idx = np.flatnonzero(reference)
        y = c.y[idx] / (sd0[idx] * np.sqrt(peers.variance_scale(c.peers[idx], base.peers[idx])))[:, None]
        whole = ~np.isnan(y).any(axis=1)
        out: dict[int, float] = {}
        if whole.any() and y.shape[1] >= 2 * min_segment:  # the nodes measured with peers in every run: at once
            z, _ = max_z(y[whole], min_segment)
            out.update(zip(idx[whole].tolist(), p_values(z, y.shape[1], min_segment, df0[idx[whole]]).tolist()))
        for i, row in zip(idx[~whole], y[~whole]):
            row = row[~np.isnan(row)]
            if row.size >= 2 * min_segment:
                out[int(i)] = _test(row, min_segment, float(df0[i]))[0]
        return out

    found = peers.blame(p_of, everyone, alpha)
    keep = everyone.copy()
    keep[list(found.moved)] = False
    if keep.sum() < 2:
        keep = everyone
    final = peers.contrasts(t, keep)
    q_cache: dict[float, float] = {}
    for i, nc in enumerate(members):
        cols, series, sd, df = _scaled(t, final, i, spread, base.peers)
        nc.tested, nc.reference = True, [n for j, n in enumerate(t.nodes) if keep[j] and j != i]
        nc.series = [RelativePoint(t.runs[c], t.times[c], math.exp(y * sd), float(final.se[i, c]))
                     for c, y in zip(cols, series)]
        nc.p_value, k = _test(series, min_segment, df)
        nc.p_adjusted = found.adjusted.get(i, 1.0)
        if i not in found.moved:
            continue
        found_at = {k: nc.p_value}
        _split(series, 0, k, min_segment, df, alpha / m, found_at)
        _split(series, k, series.size, min_segment, df, alpha / m, found_at)
        cuts = _refine(series, sorted(found_at), min_segment)
        found_at = dict(zip(cuts, (found_at[c] for c in sorted(found_at))))
        bounds = [0, *cuts, series.size]
        q = q_cache.setdefault(df, t_quantile(1 - alpha / (2 * m), df))
        pts = nc.series
        for j, c in enumerate(cuts):
            a, b = bounds[j], bounds[j + 2]
            step = float(series[c:b].mean() - series[a:c].mean()) * sd
            se = sd * math.sqrt(1 / (c - a) + 1 / (b - c))
            nc.change_points.append(ChangePoint(
                nc.node, nc.workload, pts[c].run_id, pts[c].time, pts[c - 1].run_id, pts[c - 1].time, c, c - a, b - c,
                math.exp(step), math.exp(step - q * se), math.exp(step + q * se), step, se, df, found_at[c]))
    return result
