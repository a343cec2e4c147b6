"""The pair fleet in the agent and its report (issue 35, item 3's "labels, metrics and the agent as for the
single-node fleet"): the terminal report wraps at the width without losing a word; the agent's metrics of the
last pair fleet (gpuvs_node_link_*, gpuvs_link_*) from a result stored in a real SQLite store and read back as
the agent reads it at start, linted by promtool; the agent's request of a pair fleet (--workload
collective:pairs=true,...) and its refusals."""

from __future__ import annotations

import random

import pytest

from gpuvs.fleet import pair_verdicts, pairs
from gpuvs.fleet.pair_run import PairFleetResult, arm_name
from gpuvs.report import pair_fleet

LONG = [f"gpu-node-{c}-rack-{i:02d}.example.internal" for i, c in enumerate("abcde")]


def result(names=LONG, slow: str | None = LONG[2], link: tuple[str, str] | None = None, seed: int = 3,
           rid: str = "e1pairs") -> PairFleetResult:
    """A pair fleet of every pair of `names`, 4 trials each (bus bandwidth about 10 GB/s, 1% noise), `slow` at
    0.6x and the `link` pair at 0.7x: judged as pair_run judges it."""
    rng = random.Random(seed)
    every = [pairs.pair(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    values = {}
    for p in every:
        f = 10.0 * (0.6 if slow in p else 1.0) * (0.7 if link and set(p) == set(link) else 1.0)
        values[p] = [f * rng.gauss(1, 0.01) for _ in range(4)]
    outcome = pair_verdicts.judge(names, values, margin=0.05, confidence=0.95, looks=2)
    return PairFleetResult(id=rid, workload="collective", unit="GB/s", margin=0.05, confidence=0.95, partners=4,
                           second=2, trials=4, parallel=2, nodes=list(names), first=every, suspects=[slow] if slow else [],
                           second_pairs=[], failed={arm_name((names[0], "gpu-node-z-rack-99.example.internal")):
                                                    "the pod could not be placed on gpu-node-z-rack-99.example.internal "
                                                    "within its start timeout of 120 s (Unschedulable)"},
                           values={arm_name(p): v for p, v in values.items()}, outcome=outcome, seconds=412.0,
                           pod_starts=80, command="gpuvs fleet collective --pairs")


@pytest.mark.parametrize("width", [80, 60])
def test_the_terminal_report_wraps_at_the_width_and_loses_no_word(width):
    res = result()
    wide = pair_fleet.text(res, width=1000)
    summary = res.outcome.summary()
    assert len(summary) > 80 and LONG[2] in summary  # the case: the sentence alone passes 80 columns
    assert any(len(x) > 80 for x in wide.splitlines())
    out = pair_fleet.text(res, width=width)
    assert max(len(x) for x in out.splitlines()) <= width, out
    assert out.split() == wide.split()  # every word, in order: only the breaks moved
    assert out.count("\n") > wide.count("\n")
