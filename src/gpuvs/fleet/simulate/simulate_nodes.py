"""The fleet's statistics on simulated nodes: the same adaptive.run and verdicts.assess as a real fleet.

Each trial's figure is drawn as a node's speed x (1 + cv z), z normal.
The tests and benchmarks/fleet_error_rates.py measure with it the false-alarm rate and the power."""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpuvs.fleet.execute import adaptive


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
             plan: adaptive.AdaptiveTrials | None = None, margin: float = 0.05, confidence: float = 0.95,
             seed: int = 0) -> Rates:
    """`slow`: {node index: speed factor, e.g. 0.7}; the other nodes run at 1.0."""
    plan = plan or adaptive.AdaptiveTrials()
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
