"""The pair fleet's statistics on simulated fleets, through the same pairs.run_pairs as a real one.

A pair trial's figure is 100 x exp(min(a_i, a_j) + l_ij) x (1 + cv z), not the sum the verdicts fit.
Used by tests/fleet/test_fleet_pairs.py and benchmarks/pair_fleet.py to measure false calls and power."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpuvs.analysis import stats
from gpuvs.fleet.execute import pair_plan as pairs


@dataclass
class PairRates:
    runs: int
    any_false: int  # runs where a healthy node, or a pair of healthy nodes on a healthy link, was called slower/faster
    false_node: int  # runs where a healthy node was called slower or faster
    false_pair: int  # runs where a pair of two healthy nodes on a healthy link was called slower or faster
    found: int  # runs where every slow node was called slower and every slow link was named a link
    pair_trials: float  # pair trials per run, on average
    second_pass_pairs: float  # of which in the second pass, pairs

    @property
    def false_rate(self) -> float:
        return self.any_false / self.runs

    @property
    def power(self) -> float:
        return self.found / self.runs


def names(n: int) -> list[str]:
    return [f"node-{i + 1:0{len(str(n))}d}" for i in range(n)]


def simulate(nodes: int, runs: int, *, cv: float = 0.02, trials: int = 4, slow: dict[int, float] | None = None,
             links: int = 0, link_speed: float = 0.6, plan: pairs.PairPlan | None = None,
             margin: float = 0.05, confidence: float = 0.95, correction: bool = True, seed: int = 0) -> PairRates:
    """slow: {node index: speed, e.g. 0.62}; links: how many first-pass pairs of two healthy nodes run at
    link_speed beyond their nodes (drawn per run from its seed: a link that is never measured cannot be found)."""
    ns = names(nodes)
    effect = {ns[i]: math.log(s) for i, s in (slow or {}).items()}
    rng = random.Random(seed)
    base = plan or pairs.PairPlan()
    any_false = false_node = false_pair = found = 0
    measured = second = 0
    for r in range(runs):
        plan_r = pairs.PairPlan(base.partners, base.second, seed * 100_003 + r)
        healthy = [p for p in pairs.first_pass(ns, plan_r.partners, plan_r.seed) if not set(p) & set(effect)]
        link = {p: math.log(link_speed) for p in rng.sample(healthy, links)}

        def measure(p):
            level = min(effect.get(p[0], 0.0), effect.get(p[1], 0.0)) + link.get(p, 0.0)
            return [100.0 * math.exp(level) * (1.0 + cv * rng.gauss(0.0, 1.0)) for _ in range(trials)]

        run = pairs.run_pairs(ns, measure, plan_r,
                              margin=margin, confidence=confidence, correction=correction)
        out = run.outcome
        wrong = lambda v: stats.direction(v.verdict) in ("slower", "faster")  # noqa: E731
        bad_node = any(wrong(v) for v in out.nodes if v.node not in effect)
        bad_pair = any(wrong(v) for v in out.pairs
                       if v.pair not in link and not (set(v.pair) & set(effect)))
        any_false += bad_node or bad_pair
        false_node += bad_node
        false_pair += bad_pair
        if effect or link:
            found += (all(stats.direction(out.node(n).verdict) == "slower" for n in effect)
                      and all(any(v.pair == p and v.cause == "link" for v in out.pairs) for p in link))
        measured += len(run.values) * trials
        second += len(run.second)
    return PairRates(runs, any_false, false_node, false_pair, found, measured / runs, second / runs)
