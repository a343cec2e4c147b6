"""Adaptive trials: a node whose verdict is not settled gets `step` more trials, up to `max_trials`.

Its reference gets them too where it has fewer, so the time goes where a verdict is ambiguous.
The number of looks is fixed before the first trial, 1 + ceil((max_trials - trials) / step).
So verdicts.ErrorControl can split the error rate over them."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from gpuvs.fleet.execute import trial_order as schedule
from gpuvs.fleet.assess import node_verdicts as verdicts
from gpuvs.fleet.execute.trial_order import Item


@dataclass
class AdaptiveTrials:
    trials: int = 3
    max_trials: int = 9
    step: int = 3

    @property
    def looks(self) -> int:
        if self.max_trials <= self.trials:
            return 1
        return 1 + math.ceil((self.max_trials - self.trials) / self.step)


@dataclass
class Outcome:
    values: dict[str, list[float]]  # successful trials' figures per node
    attempted: dict[str, int]
    verdicts: list[verdicts.NodeVerdict]
    control: verdicts.ErrorControl
    looks_used: int
    dead: list[str] = field(default_factory=list)  # nodes whose every trial failed


# execute(items in order) -> {node: [figure of each successful trial]}; it may stop early (Ctrl-C) by raising.
Execute = Callable[[list[Item]], dict[str, list[float]]]


def extra_trials(found: list[verdicts.NodeVerdict], attempted: dict[str, int], plan: AdaptiveTrials,
                 dead: set[str]) -> dict[str, int]:
    """Trials to add per node: unsettled nodes, and those of their reference nodes that have had fewer
    trials than they, `step` each, up to the cap."""
    want: set[str] = set()
    if len([v for v in found if v.node not in dead]) < 2:
        return {}  # no peer left to compare with: more trials would settle nothing
    for v in found:
        if v.node in dead or v.settled or (not v.reference and v.n >= 2):
            continue  # settled, or nothing to compare with (a named reference that failed, say)
        want.add(v.node)
        want |= {r for r in v.reference if attempted.get(r, 0) < attempted.get(v.node, 0)}
    out = {}
    for node in sorted(want - dead):
        add = min(plan.step, plan.max_trials - attempted.get(node, 0))
        if add > 0:
            out[node] = add
    return out


def run(nodes: list[str], execute: Execute, plan: AdaptiveTrials, *, higher_is_better: bool, margin: float,
        confidence: float, reference: str | None = None, seed: int | None = None) -> Outcome:
    rng = random.Random(seed)
    values: dict[str, list[float]] = {n: [] for n in nodes}
    attempted = {n: 0 for n in nodes}
    control = verdicts.ErrorControl(confidence=confidence, looks=plan.looks)
    batch = {n: plan.trials for n in nodes}
    dead: set[str] = set()
    found: list[verdicts.NodeVerdict] = []
    look = 0
    while batch:
        items = [(n, attempted[n] + i) for n, k in batch.items() for i in range(k)]
        for n, k in batch.items():
            attempted[n] += k
        got = execute(schedule.order(items, rng))
        for n, vals in got.items():
            values[n].extend(vals)
        dead |= {n for n in batch if not values[n]}
        look += 1
        found = verdicts.assess(values, higher_is_better=higher_is_better, margin=margin, control=control,
                                reference=reference)
        if look >= plan.looks:
            break
        batch = extra_trials(found, attempted, plan, dead)
    return Outcome(values, attempted, found, control, look, sorted(dead))
