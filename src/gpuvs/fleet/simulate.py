"""The fleet's statistics run on simulated nodes: the same adaptive.run and verdicts.assess as a
real fleet, with each trial's figure drawn from a normal distribution (a node's speed x (1 + cv z)).
Used by the tests and by benchmarks/fleet_error_rates.py to measure the false-alarm rate (healthy
fleets: how often is any node called slower or faster) and the power (one slow node: how often is it
named, and how often is another node falsely called)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpuvs.fleet import adaptive


@dataclass
class Rates:
    runs: int
    any_false: int  # runs where a healthy node was called slower or faster
    false_slower: int  # runs where a healthy node was called slower
    slow_found: int  # runs where every slowed node was called slower
    mean_trials: float  # trials per node, on average
    inconclusive_nodes: int  # healthy nodes left inconclusive, summed over runs

    @property
    def false_alarm_rate(self) -> float:
        return self.any_false / self.runs

    @property
    def power(self) -> float:
        return self.slow_found / self.runs


def simulate(nodes: int, runs: int, *, cv: float = 0.02, slow: dict[int, float] | None = None,
             plan: adaptive.Plan | None = None, margin: float = 0.05, confidence: float = 0.95,
             seed: int = 0) -> Rates:
    """`slow`: {node index: speed factor, e.g. 0.7}; the other nodes run at 1.0."""
    plan = plan or adaptive.Plan()
    slow = slow or {}
    rng = random.Random(seed)
    names = [f"node-{i + 1}" for i in range(nodes)]
    speed = {names[i]: slow.get(i, 1.0) for i in range(nodes)}
    any_false = false_slower = found = inconclusive = 0
    trials = 0
    for r in range(runs):
        def execute(items):
            out: dict[str, list[float]] = {}
            for node, _ in items:
                out.setdefault(node, []).append(100.0 * speed[node] * (1.0 + cv * rng.gauss(0.0, 1.0)))
            return out

        outcome = adaptive.run(names, execute, plan, higher_is_better=True, margin=margin, confidence=confidence,
                               seed=seed * 100_003 + r)
        verdict = {v.node: v.verdict for v in outcome.verdicts}
        healthy = [n for n in names if speed[n] == 1.0]
        any_false += any(verdict[n] in ("slower", "faster") for n in healthy)
        false_slower += any(verdict[n] == "slower" for n in healthy)
        found += bool(slow) and all(verdict[n] == "slower" for n in names if speed[n] < 1.0)
        inconclusive += sum(verdict[n] == "inconclusive" for n in healthy)
        trials += sum(outcome.attempted.values())
    return Rates(runs, any_false, false_slower, found, trials / (runs * nodes), inconclusive)
