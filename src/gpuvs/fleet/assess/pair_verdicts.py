"""Which node or link is slow, from trials of pairs of nodes: a verdict per node and per pair, with intervals.

The model is log y = mu + a_i + a_j + l_ij + noise, fitted by least absolute deviations.
Holm over nodes and pairs holds the chance of any false call in a run at alpha; docs/fleet.md has the method."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize, special

from gpuvs.analysis import stats
from gpuvs.fleet.assess import node_verdicts as verdicts

Pair = tuple[str, str]


@dataclass
class UnitVerdict:
    """A node's or a pair's speed against the fleet (below 1: slower), its interval and verdict."""

    verdict: str = "inconclusive"
    speed: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    log_speed: float | None = None
    se: float | None = None
    df: float | None = None
    p_different: float | None = None
    p_equivalent: float | None = None
    p_different_adj: float | None = None  # Holm-adjusted, then x looks (compare with alpha)
    p_equivalent_adj: float | None = None
    reason: str = ""


@dataclass
class PairNodeVerdict(UnitVerdict):
    node: str = ""
    partners: list[str] = field(default_factory=list)  # the nodes it was measured with


@dataclass
class PairVerdict(UnitVerdict):
    pair: Pair = ("", "")
    n: int = 0  # trials with a figure
    mean: float | None = None  # mean figure, in the workload's unit
    cause: str = ""  # a pair called slower: "node-7" (its member called slower), "node-3, node-5" or "link"


@dataclass
class PairControl:
    confidence: float
    looks: int
    nodes: int
    pairs: int
    correction: bool = True
    method: str = "holm over nodes and pairs at alpha/looks per look; Bonferroni intervals"

    @property
    def alpha(self) -> float:
        return round(1.0 - self.confidence, 12)

    @property
    def per_look(self) -> float:
        return self.alpha / max(1, self.looks) if self.correction else self.alpha

    @property
    def interval_confidence(self) -> float:
        return 1.0 - (self.per_look / max(1, self.nodes + self.pairs) if self.correction else self.alpha)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "alpha": self.alpha, "per_look": self.per_look,
                "interval_confidence": self.interval_confidence}


@dataclass
class PairOutcome:
    nodes: list[PairNodeVerdict]
    pairs: list[PairVerdict]
    control: PairControl
    level: float | None  # the fleet's figure: exp(mu), in the workload's unit

    def node(self, name: str) -> PairNodeVerdict:
        return next(v for v in self.nodes if v.node == name)

    def of_pair(self, a: str, b: str) -> PairVerdict:
        key = (a, b) if a < b else (b, a)
        return next(v for v in self.pairs if v.pair == key)

    def summary(self) -> str:
        """One sentence: "node-7's links are 0.62x the fleet's [0.58-0.66]; pairs without node-7 are
        equivalent"."""
        slow = [v for v in self.nodes if stats.direction(v.verdict) == "slower" and v.speed is not None]
        links = [v for v in self.pairs if v.cause == "link"]
        parts = [f"{v.node}'s links are {v.speed:.2f}x the fleet's [{v.ci_low:.2f}-{v.ci_high:.2f}]" for v in slow]
        parts += [f"the link {v.pair[0]}-{v.pair[1]} is {v.speed:.2f}x the fleet's [{v.ci_low:.2f}-{v.ci_high:.2f}], "
                  f"both nodes fine with others" for v in links]
        named = {v.node for v in slow}
        rest = [v for v in self.pairs if not named & set(v.pair) and v.cause != "link"]
        eq = sum(v.verdict == "equivalent" for v in rest)
        if named:
            who = ", ".join(sorted(named))
            tail = f"pairs without {who}" if not links else f"the other pairs without {who}"
        else:
            tail = "the other pairs" if links else "all pairs"
        if rest and eq == len(rest):
            parts.append(f"{tail} are equivalent")
        elif rest:
            parts.append(f"{tail}: {eq} of {len(rest)} equivalent, the others not settled")
        return "; ".join(parts) if parts else "no pair measured"


def _logs(values: Mapping[Pair, Sequence[float]]) -> dict[Pair, list[float]]:
    """Each pair's log figures, those that are positive and finite (a failed trial's None or 0 left out)."""
    out = {p: [math.log(x) for x in v if x is not None and 0 < x < math.inf] for p, v in values.items()}
    return {p: v for p, v in out.items() if v}


def fit(means: Mapping[Pair, float], nodes: Sequence[str]) -> tuple[float, dict[str, float]]:
    """mu and each node's effect a_i of the sum model, least absolute deviations (a slow node or link is a
    few large residuals, which LAD leaves where they are instead of spreading them over the fleet): fit
    mean log y_p = b_i + b_j, then mu = 2 median(b) and a = b - median(b), so the median node is the fleet.
    The design must be connected and not bipartite for b to be unique (pairs.first_pass draws it so)."""
    idx = {n: k for k, n in enumerate(nodes) if any(n in p for p in means)}
    ps = list(means)
    n, m = len(idx), len(ps)
    eq = np.zeros((m, n + 2 * m))
    for r, p in enumerate(ps):
        eq[r, idx[p[0]]] = eq[r, idx[p[1]]] = 1.0
        eq[r, n + r], eq[r, n + m + r] = 1.0, -1.0
    cost = np.concatenate([np.zeros(n), np.ones(2 * m)])
    bounds = [(None, None)] * n + [(0, None)] * (2 * m)
    res = optimize.linprog(cost, A_eq=eq, b_eq=np.array([means[p] for p in ps]), bounds=bounds, method="highs")
    b = dict(zip(idx, res.x[:n])) if res.success else {k: 0.5 * statistics.median(means.values()) for k in idx}
    c = statistics.median(b.values())
    return 2 * c, {k: b.get(k, c) - c for k in nodes}


def _partner(p: Pair, n: str) -> str:
    return p[1] if p[0] == n else p[0]


def judge(nodes: Sequence[str], values: Mapping[Pair, Sequence[float]], *, margin: float = 0.05,
          confidence: float = 0.95, looks: int = 1, correction: bool = True) -> PairOutcome:
    """A verdict per node and per pair from each measured pair's figures ({(a, b): [figure per trial]},
    higher is better)."""
    logs = _logs(values)
    names = list(dict.fromkeys([*nodes, *(m for p in values for m in p)]))  # a measured pair's nodes counted
    means = {p: sum(v) / len(v) for p, v in logs.items()}
    tested_pairs = [p for p in logs if len(logs[p]) >= 2]
    control = PairControl(confidence, looks, len(names), len(tested_pairs), correction)
    if not means:
        return PairOutcome([PairNodeVerdict(node=n, reason="no pair measured") for n in names], [], control, None)
    mu, a = fit(means, names)
    of = {n: [p for p in means if n in p] for n in names}

    def effect_without(n: str, p: Pair) -> float:
        """n's effect from its pairs other than p (0 where it has none)."""
        rest = [means[q] - mu - a[_partner(q, n)] for q in of[n] if q != p]
        return statistics.median(rest) if rest else 0.0

    # pairs: their trials' spread, pooled
    ss = sum(sum((x - means[p]) ** 2 for x in logs[p]) for p in tested_pairs)
    df_w = sum(len(logs[p]) - 1 for p in tested_pairs)
    s2 = ss / df_w if df_w else math.nan
    nbar = sum(len(logs[p]) for p in tested_pairs) / max(1, len(tested_pairs))
    # the fleet's level is a median of the pair means: its variance is pi/2 times that of their mean
    var_mu = math.pi / 2 * s2 / (nbar * max(1, len(means)))
    pair_out: dict[Pair, PairVerdict] = {}
    tests: dict[tuple[str, Any], UnitVerdict] = {}
    for p, v in logs.items():
        pv = PairVerdict(pair=p, n=len(v), mean=sum(math.exp(x) for x in v) / len(v))
        pair_out[p] = pv
        if len(v) < 2:
            pv.reason = "needs 2+ trials with a figure"
            continue
        own = sum((x - means[p]) ** 2 for x in v) / (len(v) - 1)
        _set(pv, means[p] - mu, math.sqrt(max(own, s2) / len(v) + var_mu), df_w, margin)
        tests[("pair", p)] = pv
    # nodes: each pair less its partner's effect, the pairs as units
    zs = {n: [means[p] - mu - effect_without(_partner(p, n), p) for p in of[n]] for n in names}
    spread = [(z, sum(z) / len(z)) for z in zs.values() if len(z) >= 2]
    ss_z = sum(sum((x - m) ** 2 for x in z) for z, m in spread)
    df_z = sum(len(z) - 1 for z, _ in spread)
    # the spread of the nodes' mean z across the fleet's band (nodes within the margin of their median):
    # what the within-node spread misses, as partners' effects share pairs of third nodes
    zbar = {n: sum(z) / len(z) for n, z in zs.items() if len(z) >= 2}
    mid = statistics.median(zbar.values()) if zbar else 0.0
    band = [x for x in zbar.values() if abs(x - mid) <= math.log1p(margin or 0.05)]
    v_between = statistics.variance(band) if len(band) >= 3 else 0.0
    node_out: dict[str, PairNodeVerdict] = {}
    for n in names:
        nv = PairNodeVerdict(node=n, partners=sorted(_partner(p, n) for p in of[n]))
        node_out[n] = nv
        z = zs[n]
        if len(z) < 2 or not df_z:
            nv.reason = "needs 2+ measured pairs" if len(z) < 2 else "no node has 2+ measured pairs"
            continue
        m = sum(z) / len(z)
        own = sum((x - m) ** 2 for x in z) / (len(z) - 1)
        within = max(own, ss_z / df_z) / len(z)
        var, df = (within, df_z) if within >= v_between else (v_between, len(band) - 1.0)
        _set(nv, m, math.sqrt(var + var_mu), df, margin)
        tests[("node", n)] = nv
    control.nodes = sum(1 for k in tests if k[0] == "node")
    control.pairs = sum(1 for k in tests if k[0] == "pair")
    _decide(tests, control, margin)
    slow = {n for n, v in node_out.items() if stats.direction(v.verdict) == "slower"}
    for pv in pair_out.values():
        if stats.direction(pv.verdict) == "slower":
            pv.cause = ", ".join(m for m in pv.pair if m in slow) or "link"
    pairs_sorted = sorted(pair_out.values(), key=lambda v: (v.speed if v.speed is not None else math.inf, v.pair))
    nodes_sorted = sorted(node_out.values(), key=lambda v: (v.speed if v.speed is not None else math.inf, v.node))
    return PairOutcome(nodes_sorted, pairs_sorted, control, math.exp(mu))


def _set(u: UnitVerdict, log_speed: float, se: float, df: float, margin: float) -> None:
    u.log_speed, u.se, u.df, u.speed = log_speed, se, df, math.exp(log_speed)
    if se > 0:
        u.p_different, u.p_equivalent = stats.p_values(log_speed, se, df, margin)
    else:
        u.p_different = 0.0 if log_speed else 1.0
        u.p_equivalent = 0.0 if abs(log_speed) < math.log1p(margin) else 1.0


def _t(p: float, df: float) -> float:
    return float(special.ndtri(p)) if math.isinf(df) else float(special.stdtrit(df, p))


def _decide(tests: Mapping[Any, UnitVerdict], control: PairControl, margin: float) -> None:
    level = control.per_look
    p_diff = {k: u.p_different for k, u in tests.items()}
    p_eq = {k: u.p_equivalent for k, u in tests.items()}
    if control.correction:
        different, diff_adj = verdicts.holm(p_diff, level)
        equivalent, eq_adj = verdicts.holm(p_eq, level) if margin > 0 else (set(), {})
    else:
        different, diff_adj = {k for k, p in p_diff.items() if p <= level}, p_diff
        equivalent, eq_adj = ({k for k, p in p_eq.items() if p <= level}, p_eq) if margin > 0 else (set(), {})
    for k, u in tests.items():
        half = _t(1 - (1 - control.interval_confidence) / 2, u.df) * u.se
        u.ci_low, u.ci_high = math.exp(u.log_speed - half), math.exp(u.log_speed + half)
        looks = control.looks if control.correction else 1
        u.p_different_adj = min(1.0, diff_adj[k] * looks)
        u.p_equivalent_adj = None if k not in eq_adj else min(1.0, eq_adj[k] * looks)
        word = "faster" if u.speed > 1 else "slower"
        shown = u.ci_low > 1 or u.ci_high < 1
        if k in equivalent or k in different:
            u.verdict = stats.settled_verdict(k in equivalent, k in different and (shown or k not in equivalent),
                                              word)
            u.reason = ""
        else:
            u.reason = "the interval holds both 1 and a speed outside the margin"
