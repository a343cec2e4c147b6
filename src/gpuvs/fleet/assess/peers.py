"""Each node against its peers, run by run, with one node's movement blamed on that node alone.

contrasts() takes out what the whole fleet shares in a run; blame() is the closed test across nodes.
Why not each run's ratio to the fleet band, and the test's proof: docs/history.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from gpuvs.fleet.assess import node_verdicts as verdicts
from gpuvs.fleet.assess.node_history import HistoryPoint


@dataclass(frozen=True)
class Table:
    """The nodes' levels (log figure, higher is faster) and their standard errors, nodes x runs (runs in
    time order); nan where a node was not measured in a run."""

    nodes: tuple[str, ...]
    runs: tuple[str, ...]
    times: tuple[float, ...]
    level: np.ndarray
    se: np.ndarray

    def index(self, node: str) -> int:
        return self.nodes.index(node)


def table(points: Mapping[str, Sequence[HistoryPoint]]) -> Table:
    """{node: its points} as a Table over every run any of them has, in time order (then run id)."""
    runs = sorted({(p.time, p.run_id) for pts in points.values() for p in pts})
    col = {r: j for j, (_, r) in enumerate(runs)}
    nodes = tuple(points)
    level = np.full((len(nodes), len(runs)), np.nan)
    se = np.full_like(level, np.nan)
    for i, n in enumerate(nodes):
        for p in points[n]:
            level[i, col[p.run_id]], se[i, col[p.run_id]] = p.level, p.level_se
    return Table(nodes, tuple(r for _, r in runs), tuple(t for t, _ in runs), level, se)


@dataclass(frozen=True)
class Contrasts:
    """Every node (row) against the mean of the reference set minus itself, per run: y (log speed
    against those peers; nan where the node or all its peers were not measured), its standard error
    from the runs' trials, and how many peers the reference holds (`peers`: per node, all runs)."""

    y: np.ndarray
    se: np.ndarray
    peers: np.ndarray  # per node: the reference set's size without the node itself

    def series(self, i: int, columns: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Node i's measured points among `columns`: (column indices, y, se)."""
        cols = np.arange(self.y.shape[1])[columns]
        ok = ~np.isnan(self.y[i, cols])
        return cols[ok], self.y[i, cols[ok]], self.se[i, cols[ok]]


def _levels(t: Table, reference: np.ndarray, rounds: int = 200) -> np.ndarray:
    """Each reference node's level a_k in the additive fit x_kt = a_k + f_t over the reference set
    (least squares with missing runs, by alternating means); 0 for the other nodes."""
    x = np.where(reference[:, None], t.level, np.nan)
    m = ~np.isnan(x)
    a = np.zeros(len(t.nodes))
    if not m.any():
        return a
    x0 = np.where(m, x, 0.0)
    rows, cols = np.maximum(m.sum(1), 1), np.maximum(m.sum(0), 1)
    for _ in range(rounds):
        f = np.where(m, x0 - a[:, None], 0.0).sum(0) / cols
        new = np.where(m, x0 - f[None, :], 0.0).sum(1) / rows
        done = np.max(np.abs(new - a)) < 1e-13
        a = new
        if done or m.all():
            break
    return np.where(reference, a - np.mean(a[reference]), 0.0)


def contrasts(t: Table, reference: np.ndarray) -> Contrasts:
    """Each node against the mean of the nodes in `reference` (a bool mask over t.nodes) other than itself."""
    measured = ~np.isnan(t.level)
    own = _levels(t, reference)
    centred = np.where(measured, t.level - own[:, None], 0.0)
    var = np.where(measured, t.se ** 2, 0.0)
    m = reference[:, None] & measured
    s, v, k = (np.where(m, centred, 0.0).sum(0), np.where(m, var, 0.0).sum(0), m.sum(0))
    k_i = k[None, :] - m  # peers measured in each run, the node itself left out
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = (s[None, :] - np.where(m, centred, 0.0)) / k_i
        ref_var = (v[None, :] - np.where(m, var, 0.0)) / k_i ** 2
    size = reference.sum() - reference  # per node: the reference set without itself
    levels = np.where(reference, own, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        base = (levels.sum() - np.where(reference, own, 0.0)) / size  # the peers' mean level
    y = t.level - ref - base[:, None]
    bad = (k_i == 0) | ~measured | (size[:, None] == 0)
    return Contrasts(np.where(bad, np.nan, y), np.where(bad, np.nan, np.sqrt(t.se ** 2 + ref_var)), size)


@dataclass
class Blame:
    """The closed test's outcome: the nodes called moved, and per node the adjusted p-value (Holm over
    the fleet; for a node that passes that, the largest of it and of Holm over the fleet without each
    other node: compare with alpha)."""

    moved: set[int]
    adjusted: dict[int, float]
    raw: dict[int, float]  # each node against all the others (step (a))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def blame(pvalues: Callable[[np.ndarray], Mapping[int, float]], members: np.ndarray, alpha: float) -> Blame:
    """Closed test (the module's (a) and (b)). pvalues(reference mask) gives, for each node of the mask,
    the p-value of "it did not move" against the mean of the others of the mask."""
    raw = dict(pvalues(members))
    first, adjusted = verdicts.holm(raw, alpha)
    moved = set(first)
    for m in map(int, np.flatnonzero(members)):
        if not moved:
            break
        rest = members.copy()
        rest[m] = False
        p = dict(pvalues(rest)) if rest.sum() >= 2 else {}
        if len(p) == 2:  # two nodes: one contrast, seen from either side
            q = max(p.values())
            held, adj = (set(p) if q <= alpha else set()), {i: q for i in p}
        else:
            held, adj = verdicts.holm(p, alpha) if p else (set(), {})
        for i in moved - {m}:
            adjusted[i] = max(adjusted[i], adj.get(i, 1.0))
        moved = {i for i in moved if i == m or i in held}
    return Blame(moved, adjusted, raw)


def variance_scale(peers: np.ndarray | int, base: np.ndarray | int) -> np.ndarray:
    """How much a contrast's variance grows when its reference holds `peers` nodes instead of `base`
    (equal nodes: var = sigma^2 (1 + 1/peers))."""
    peers, base = np.asarray(peers, float), np.asarray(base, float)
    with np.errstate(divide="ignore"):
        return (1 + 1 / peers) / (1 + 1 / base)
