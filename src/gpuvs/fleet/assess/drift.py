"""Drift: each node's latest run against its own earlier runs, with the error rate held across the fleet.

Each run is taken as the node against its peers (peers.py), so a change of the whole fleet cancels.
The run-to-run spread is pooled and moderated over the nodes; the method is in docs/history.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import special

from gpuvs.analysis import stats
from gpuvs.fleet.assess import peers
from gpuvs.fleet.assess import node_verdicts as verdicts
from gpuvs.fleet.assess.node_history import HistoryPoint, NodeHistory, t_quantile

WINDOW = 10
SPREAD_WINDOW = 30
MIN_HISTORY = 3
NOISY_LEVEL = 0.01  # a node's spread beyond the others' at this level (F test): tested with its own variance


@dataclass(frozen=True)
class RunSpread:
    """How much a node's log speed against its peers moves from run to run (docs/history.md): pooled over
    the fleet's nodes, and each node's own estimate moderated towards the fleet's (`nodes`: {node: (sd, df)})."""

    sd: float  # pooled run-to-run standard deviation of log speed (both parts)
    df: float
    within_sd: float  # the part one run's trials account for (root mean of their se^2)
    between_sd: float  # the rest: sqrt(max(0, sd^2 - within_sd^2)), estimated without bias
    differences: int  # successive differences used
    prior_df: float  # how far the nodes' own spreads agree (inf: as far as chance allows; the pooled sd)
    nodes: dict[str, tuple[float, float]]  # node -> its moderated (sd, df), used for its tests
    noisy: tuple[str, ...] = ()  # nodes whose own spread is beyond the others': their own (sd, df)

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


def _upper_p(ratio: float, d: float, d0: float) -> float:
    """P(F(d, d0) >= ratio); d0 = inf: the chi-square limit."""
    if math.isinf(d0):
        return float(special.chdtrc(d, ratio * d))
    return float(special.fdtrc(d, d0, ratio))


def _noisy(series: Mapping[str, np.ndarray], level: float) -> set[str]:
    """Nodes whose run-to-run spread is beyond what the other nodes' allow: each node's successive
    differences without the largest (one step is a change, not noise), against the prior fitted to
    the others' (same statistic), F test at `level`. Never half the nodes or more."""
    trimmed = {}
    for node, y in series.items():
        if y.size >= 4:
            dd = np.diff(y) ** 2
            k = y.size - 1
            trimmed[node] = (float(dd.sum() - dd.max()) / (2 * (k - 1)), 2.0 * (k - 1) ** 2 / (3 * k - 4))
    if len(trimmed) < 3:
        return set()
    out = set()
    for node, (v, d) in trimmed.items():
        d0, s02 = _prior([trimmed[k] for k in trimmed if k != node])
        if s02 > 0 and _upper_p(v / s02, d, d0) <= level:
            out.add(node)
    return out if len(out) < len(trimmed) / 2 else set()


def run_spread(series: Mapping[str, Sequence[tuple[float, float]]], *, contrasts: bool = False,
               noisy_level: float | None = None) -> RunSpread | None:
    """The run-to-run spread of the nodes' series of (log_speed, se), each in time order: pooled, and
    per node its own (successive differences) moderated towards the pooled one by how much the nodes'
    own spreads are seen to differ; a node noisier than the others allow keeps its own (and stays in
    the pool). `contrasts`:
    the series are the nodes against each other (they sum to zero in each run), so the pooled df is
    (n - 1)/n of the sum. noisy_level: of the test that gives a node its own variance (default
    NOISY_LEVEL; 0: none). None when no series has two points."""
    ys = {n: np.array([p[0] for p in pts], float) for n, pts in series.items() if len(pts) >= 2}
    if not ys:
        return None
    level = NOISY_LEVEL if noisy_level is None else noisy_level
    noisy = _noisy(ys, level) if level > 0 else set()
    q = s = dens = 0.0
    d = 0
    own: dict[str, tuple[float, float]] = {}
    for node, pts in series.items():
        if node not in ys:
            continue
        y, se2 = ys[node], np.array([p[1] for p in pts]) ** 2
        own[node] = _mssd(y)
        q += float(np.sum(np.diff(y) ** 2))
        s += float(np.sum(se2[1:] + se2[:-1]))
        d += len(pts) - 1
        dens += 6 * len(pts) - 8
    var, within2, df = q / (2 * d), s / (2 * d), 4.0 * d * d / dens
    if contrasts and len(ys) > 1:
        df *= (len(ys) - 1) / len(ys)
    d0, s02 = _prior(list(own.values()))
    if math.isinf(d0):
        nodes = {n: (math.sqrt(var), df) for n in series}
    else:
        nodes = {n: (math.sqrt((d0 * s02 + dn * vn) / (d0 + dn)), min(d0 + dn, df)) for n, (vn, dn) in own.items()}
        nodes.update({n: (math.sqrt(s02), min(d0, df)) for n in series if n not in own})
    nodes.update({n: (math.sqrt(own[n][0]), own[n][1]) for n in noisy})
    return RunSpread(math.sqrt(var), df, math.sqrt(within2), math.sqrt(max(0.0, var - within2)), d, d0, nodes,
                     tuple(sorted(noisy)))


@dataclass
class DriftVerdict:
    """A node's latest run against its own earlier runs (its speed against its peers, both)."""

    node: str
    workload: str
    verdict: str  # slower | faster | equivalent | inconclusive (than its own past)
    reason: str = ""
    run_id: str | None = None  # the latest run
    time: float | None = None
    baseline: list[str] = field(default_factory=list)  # the earlier runs compared with, oldest first
    baseline_from: float | None = None  # time of the first of them
    reference: list[str] = field(default_factory=list)  # the peers it was held against (not found drifting)
    speed: float | None = None  # the latest speed vs those peers
    baseline_speed: float | None = None  # exp(mean log speed vs those peers in the earlier runs)
    ratio: float | None = None  # speed / baseline_speed: below 1, slower than its past
    ci_low: float | None = None  # simultaneous over the tested nodes
    ci_high: float | None = None
    log_ratio: float | None = None
    se: float | None = None
    df: float | None = None
    p_different: float | None = None  # against `reference`
    p_equivalent: float | None = None
    p_different_adj: float | None = None  # of the closed test (peers.blame; compare with 1 - confidence)
    p_equivalent_adj: float | None = None  # Holm-adjusted
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
    tested: int = 0  # nodes that took part (m)
    spread_window: int = SPREAD_WINDOW  # earlier runs the run-to-run spread is estimated from
    method: str = ("latest run vs the mean of up to `window` earlier runs, log speed vs the mean of the peers in each "
                   "run; run-to-run variance from successive differences, pooled and moderated per node; a node is "
                   "called drifting when Holm over the fleet and over the fleet without each other node agree "
                   "(closed test); not interleaved")

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


@dataclass(frozen=True)
class _Drifts:
    """Every node's drift against one reference set (arrays over the table's nodes; nan: not tested)."""

    d: np.ndarray
    se: np.ndarray
    df: np.ndarray
    latest: np.ndarray  # y in the latest run
    past: np.ndarray  # mean y over the earlier runs
    peers: np.ndarray

    def p_different(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return 2 * special.stdtr(self.df, -np.abs(self.d) / self.se)


def _drifts(t: peers.Table, reference: np.ndarray, window: np.ndarray, latest: int, spread: RunSpread,
            base_peers: np.ndarray) -> _Drifts:
    c = peers.contrasts(t, reference)
    past = np.where(window, c.y, np.nan)
    k = np.sum(~np.isnan(past), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(past, axis=1) / k
        scale = peers.variance_scale(c.peers, base_peers)
        sd = np.array([spread.of(n)[0] for n in t.nodes])
        df = np.array([spread.of(n)[1] for n in t.nodes])
        now = c.y[:, latest]
        excess = np.maximum(0.0, c.se[:, latest] ** 2 - spread.within_sd ** 2 * scale)
        se = np.sqrt(sd ** 2 * scale * (1 + 1 / k) + excess)
    d = np.where(k > 0, now - mean, np.nan)
    return _Drifts(d, se, df, now, mean, c.peers)


def assess(hists: Sequence[NodeHistory], *, window: int = WINDOW, min_history: int = MIN_HISTORY,
           margin: float = 0.05, confidence: float = 0.95, latest: str | None = None,
           spread_window: int = SPREAD_WINDOW) -> DriftResult:
    """Drift verdicts of one workload's node histories at the fleet's latest run (`latest`: that run's
    id; default the run of the newest point). The drift is measured from each node's last `window`
    earlier runs, its run-to-run spread from its last `spread_window` (at least `window`)."""
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
    spread_runs: dict[str, list[HistoryPoint]] = {}  # ... the last `spread_window`, for the run-to-run spread
    last: dict[str, HistoryPoint] = {}
    at = next((p.time for h in hists for p in h.points if p.run_id == latest), math.inf)
    for h in hists:
        v = DriftVerdict(h.node, h.workload, "inconclusive")
        out.append(v)
        before_latest = [p for p in h.points if p.time < at and p.run_id != latest]
        earlier[h.node], spread_runs[h.node] = before_latest[-window:], before_latest[-max(window, spread_window):]
        now = next((p for p in h.points if p.run_id == latest), None)
        if now is None:
            before = earlier[h.node]
            v.reason = "not measured in the latest run" + (f" (last in {before[-1].run_id})" if before else "")
            continue
        last[h.node], past = now, earlier[h.node]
        v.run_id, v.time = now.run_id, now.time
        v.baseline = [p.run_id for p in past]
        if past:
            v.baseline_from = past[0].time
        if len(past) < min_history:
            v.reason = f"too few earlier runs: {len(past)} of the {min_history} needed"
    testable = [v for v in out if not v.reason]
    result = DriftResult(workload, latest, confidence, margin, window, min_history, None, out,
                         spread_window=max(window, spread_window))
    while True:  # nodes whose earlier runs have too few peers measured alongside are left out, and the rest again
        if len(testable) < 2:
            for v in testable:
                v.reason = "no peer with enough earlier runs to hold it against"
            return result
        t = peers.table({v.node: [*spread_runs[v.node], last[v.node]] for v in testable})
        col = {r: j for j, r in enumerate(t.runs)}
        now_col = col[latest]
        win = np.zeros(t.level.shape, bool)  # the runs each node's drift is measured from
        wide = np.zeros(t.level.shape, bool)  # ... and those its spread is
        for i, node in enumerate(t.nodes):
            win[i, [col[p.run_id] for p in earlier[node]]] = True
            wide[i, [col[p.run_id] for p in spread_runs[node]]] = True
        everyone = np.ones(len(t.nodes), bool)
        base = peers.contrasts(t, everyone)
        series = {node: list(zip(*base.series(i, np.flatnonzero(wide[i]))[1:])) for i, node in enumerate(t.nodes)}
        for i, v in enumerate(testable):
            if (got := int(np.sum(~np.isnan(base.y[i, win[i]])))) < min_history:
                v.reason = (f"too few earlier runs with a peer measured in the same run: {got} of the {min_history} "
                            "needed")
        if all(not v.reason for v in testable):
            break
        testable = [v for v in testable if not v.reason]
    spread = run_spread(series, contrasts=True)
    result.spread = spread
    if spread is None or not spread.sd > 0:
        for v in testable:
            v.reason = "no run-to-run spread in the earlier runs: the interval cannot be bounded"
        return result
    result.tested = m = len(testable)

    def p_of(reference: np.ndarray) -> dict[int, float]:
        p = _drifts(t, reference, win, now_col, spread, base.peers).p_different()
        return {int(i): float(p[i]) for i in np.flatnonzero(reference) if not math.isnan(p[i])}

    found = peers.blame(p_of, everyone, alpha)
    keep = everyone.copy()
    keep[list(found.moved)] = False
    if keep.sum() < 2:
        keep = everyone
    final = _drifts(t, keep, win, now_col, spread, base.peers)
    by = {v.node: v for v in testable}
    for i, node in enumerate(t.nodes):
        v = by[node]
        d, se, df = float(final.d[i]), float(final.se[i]), float(final.df[i])
        if math.isnan(d):
            v.reason = "no peer not found drifting was measured in its runs"
            continue
        q = t_quantile(1 - alpha / (2 * m), df)
        v.reference = [n for j, n in enumerate(t.nodes) if keep[j] and j != i]
        v.speed, v.baseline_speed = math.exp(final.latest[i]), math.exp(final.past[i])
        v.log_ratio, v.se, v.df, v.ratio = d, se, df, math.exp(d)
        v.ci_low, v.ci_high = math.exp(d - q * se), math.exp(d + q * se)
        v.p_different, v.p_equivalent = stats.p_values(d, se, df, margin)
        v.p_different_adj = found.adjusted.get(i, 1.0)
    equivalent, eq_adj = (verdicts.holm({v.node: v.p_equivalent for v in testable if not v.reason}, alpha)
                          if margin > 0 else (set(), {}))
    for i, node in enumerate(t.nodes):
        v = by[node]
        if v.reason:
            continue
        v.p_equivalent_adj = eq_adj.get(node)
        if node in equivalent or i in found.moved:
            v.verdict = stats.settled_verdict(node in equivalent, i in found.moved,
                                              "slower" if v.log_ratio < 0 else "faster")
        elif m == 2:
            v.reason = "one peer only: which of the two moved cannot be told"
        else:
            v.reason = "the interval holds both 1 and a ratio outside the margin"
    return result
