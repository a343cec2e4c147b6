"""What a pair fleet run costs: pair trials, pod starts and wall time for n nodes with d partners each.

It is computed from the plan itself (pairs.first_pass, second_pass, rounds), so it cannot drift from it.
A pair trial starts 2 pods; rounds of pairs that share no node run in chunks of at most `parallel`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuvs.fleet.execute import pair_plan as pairs


@dataclass(frozen=True)
class PairCost:
    nodes: int
    partners: int
    trials: int
    first_pairs: int
    second_pairs: int
    pair_trials: int
    pod_starts: int
    rounds: int  # rounds of pairs that run at once (chunks of `parallel` counted)
    wall_s: float
    node_fleet_pod_starts: int  # the single-node fleet's pod starts at the same trials per node, for scale


def cost(nodes: int, partners: int = 4, *, trials: int = 4, second: int = 2, slow: int = 1, trial_s: float = 10.0,
         parallel: int | None = None, seed: int = 0) -> PairCost:
    names = [f"n{i:05d}" for i in range(nodes)]
    first = pairs.first_pass(names, partners, seed)
    sus: set[str] = set()
    for s in names[:slow]:
        sus |= {s} | {m for p in first if s in p for m in p}
    extra = pairs.second_pass(names, first, sus, second, seed)
    cap = parallel or max(1, nodes // 2)
    steps = sum(math.ceil(len(r) / cap) for part in (first, extra) for r in pairs.rounds(part))
    n_pairs = len(first) + len(extra)
    return PairCost(nodes, min(partners, nodes - 1), trials, len(first), len(extra), trials * n_pairs,
                    2 * trials * n_pairs, steps, steps * trials * trial_s, trials * nodes)


def hours(seconds: float) -> str:
    return f"{seconds:,.0f} s" + (f" ({seconds / 3600:.1f} h)" if seconds >= 3600 else
                                  f" ({seconds / 60:.0f} min)" if seconds >= 120 else "")


def table(sizes=(4, 8, 16, 1000), **kw) -> str:
    """The cost table of docs/fleet.md, as markdown (python -m gpuvs.fleet.execute.pair_cost)."""
    cs = [cost(n, **kw) for n in sizes]
    four = [cost(n, **{**kw, "parallel": 4}) for n in sizes]
    head = ["figure (one run)"] + [f"{c.nodes:,} nodes" for c in cs]
    rows = [
        ["partners per node (first pass)"] + [str(c.partners) for c in cs],
        ["pairs, first pass"] + [f"{c.first_pairs:,}" for c in cs],
        ["pairs, second pass (one slow node)"] + [f"{c.second_pairs:,}" for c in cs],
        ["pair trials"] + [f"{c.pair_trials:,}" for c in cs],
        ["pod starts (2 per pair trial)"] + [f"{c.pod_starts:,}" for c in cs],
        ["the node fleet's pod starts, same trials per node"] + [f"{c.node_fleet_pod_starts:,}" for c in cs],
        ["rounds of pairs at once"] + [str(c.rounds) for c in cs],
        ["wall time, no cap (each node in one pair at a time)"] + [hours(c.wall_s) for c in cs],
        ["wall time, 4 pairs at once"] + [hours(c.wall_s) for c in four],
    ]
    out = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(cs)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


if __name__ == "__main__":
    print(table())
