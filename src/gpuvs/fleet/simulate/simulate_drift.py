"""Drift verdicts and change points on simulated fleet histories, through the code a real history takes.

A trial's figure is 100 x fleet(t) x node_i(t) x exp(between z_it) x (1 + cv z).
fleet(t) moves every node alike and must raise no alarm; node_i(t) is 1 but for a node given a Change.
Used by the tests and by benchmarks/drift_error_rates.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuvs.fleet.assess import changepoint
from gpuvs.fleet.assess import drift
from gpuvs.fleet.assess import node_history as history

DAY = 86_400.0


@dataclass(frozen=True)
class Noise:
    cv: float = 0.025  # per trial
    trials: tuple[int, ...] = (4,)  # trials per node per run, each drawn from these (adaptive runs vary)
    between: float = 0.01  # a node's own run-to-run sd (log scale)
    fleet_trend: float = -0.10  # the whole fleet's change over the history (log scale)
    fleet_shock: float = 0.03  # the whole fleet's per-run sd (log scale)
    noisy: float = 1.0  # the last node's `between` is this many times the others' (a node noisier than its peers)


@dataclass(frozen=True)
class Change:
    """Node `node` changes by `size` (-0.05: 5% slower) from run `start` (0-based), reaching its full
    size over `runs` runs (1: a sudden step) and staying there."""

    size: float
    start: int
    runs: int = 1
    node: int = 0

    def log_factor(self, t: int) -> float:
        return math.log1p(self.size) * min(1.0, max(0.0, (t - self.start + 1) / self.runs))


def fleet_history(nodes: int, runs: int, rng: np.random.Generator, noise: Noise = Noise(),
                  change: Change | None = None, margin: float = 0.05) -> list[history.NodeHistory]:
    names = [f"node-{i + 1}" for i in range(nodes)]
    between = np.full(nodes, noise.between)
    between[-1] *= noise.noisy
    points = []
    for t in range(runs):
        fleet = noise.fleet_trend * t / max(1, runs - 1) + noise.fleet_shock * rng.standard_normal()
        level = fleet + between * rng.standard_normal(nodes)
        if change is not None:
            level[change.node] += change.log_factor(t)
        counts = rng.choice(noise.trials, size=nodes)
        values = {n: (100.0 * math.exp(level[i]) * (1.0 + noise.cv * rng.standard_normal(counts[i]))).tolist()
                  for i, n in enumerate(names)}
        points += history.points_from_run(f"run-{t + 1}", t * DAY, "sim", values, higher_is_better=True,
                                          margin=margin)
    return history.histories(points)


@dataclass
class Rates:
    fleets: int
    false_drift: int = 0  # fleets where a stable node (a changed node's peers too) was called slower or faster
    drift_found: int = 0  # fleets where the changed node was called slower (or faster, for a rise)
    stable_equivalent: int = 0  # stable nodes called equivalent to their past (summed over fleets)
    stable_nodes: int = 0
    false_change: int = 0  # fleets where a stable node got a change point
    change_found: int = 0  # fleets where the changed node got a change point
    located: int = 0  # ... one within +/-1 run of the change's start (of a slide: of its runs)
    step_covered: int = 0  # ... and the interval of that one held the true step

    def share(self, name: str) -> float:
        return getattr(self, name) / self.fleets


def simulate(nodes: int, fleets: int, runs: int = 16, *, noise: Noise = Noise(), change: Change | None = None,
             window: int = drift.WINDOW, min_history: int = drift.MIN_HISTORY, margin: float = 0.05,
             confidence: float = 0.95, min_segment: int = changepoint.MIN_SEGMENT, seed: int = 0) -> Rates:
    rng = np.random.default_rng(seed)
    changed = None if change is None else f"node-{change.node + 1}"
    word = None if change is None else ("slower" if change.size < 0 else "faster")
    r = Rates(fleets)
    for _ in range(fleets):
        hists = fleet_history(nodes, runs, rng, noise, change, margin)
        d = drift.assess(hists, window=window, min_history=min_history, margin=margin, confidence=confidence)
        stable = [v for v in d.verdicts if v.node != changed]
        r.false_drift += any(v.verdict in ("slower", "faster") for v in stable)
        r.stable_equivalent += sum(v.verdict == "equivalent" for v in stable)
        r.stable_nodes += len(stable)
        r.drift_found += changed is not None and d.verdict(changed).verdict == word
        c = changepoint.detect(hists, confidence=confidence, min_segment=min_segment)
        r.false_change += any(n.change_points for n in c.nodes if n.node != changed)
        if changed is not None and c.node(changed).change_points:
            r.change_found += 1
            near = [cp for cp in c.node(changed).change_points
                    if change.start - 1 <= cp.index <= change.start + change.runs]
            r.located += bool(near)
            truth = math.log1p(change.size)
            r.step_covered += any(math.log(cp.ci_low) <= truth <= math.log(cp.ci_high) for cp in near)
    return r
