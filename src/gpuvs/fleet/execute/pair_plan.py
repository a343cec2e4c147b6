"""The pair fleet's plan and run: which pairs of nodes are measured, in which rounds, and the second pass.

The first pass is a random circulant graph of `partners` each; the second pairs each suspect with good nodes.
The measuring is a callable (pair -> its trials' figures); docs/fleet.md says why the plan is so."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from gpuvs.fleet.assess import pair_verdicts
from gpuvs.params import Param
from gpuvs.fleet.assess.pair_verdicts import Pair, PairOutcome

Measure = Callable[[Pair], Sequence[float]]


class PlanError(ValueError):
    """A pair plan that cannot be made (one line: what was wrong, what is allowed)."""


def pair(a: str, b: str) -> Pair:
    """The pair of a and b, in one order whatever the call's."""
    if a == b:
        raise PlanError(f"a node cannot be paired with itself ({a})")
    return (a, b) if a < b else (b, a)


def first_pass(nodes: Sequence[str], partners: int, seed: int = 0) -> list[Pair]:
    """Pairs such that every node has min(partners, n - 1) partners (a random circulant graph from `seed`)."""
    names = list(dict.fromkeys(nodes))
    n = len(names)
    if n != len(nodes):
        raise PlanError("each node may be named once")
    if n < 3:
        raise PlanError(f"a pair fleet needs at least 3 nodes (got {n}): with 2, which node is slow cannot be told")
    if partners < 3:
        raise PlanError(f"partners must be at least 3 (got {partners}): with 2, a slow link and a slow node look alike")
    if partners >= n - 1:
        return sorted(pair(a, b) for i, a in enumerate(names) for b in names[i + 1:])
    rng = random.Random(seed)
    order = names[:]
    rng.shuffle(order)
    half = (n - 1) // 2  # offsets 1..half give distinct pairs; n/2 (even n) gives n/2 pairs
    for attempt in range(64):
        # a draw that is not connected, or is bipartite (all offsets odd on an even fleet), is drawn again: on
        # such a design a node's effect cannot be told apart from its partners' (last, consecutive offsets)
        offsets = rng.sample(range(1, half + 1), partners // 2) if attempt < 63 else list(range(1, partners // 2 + 1))
        out = {pair(order[i], order[(i + s) % n]) for s in offsets for i in range(n)}
        if partners % 2:
            if n % 2:  # an odd degree on an odd count cannot be regular: one more offset, so each has d + 1
                rest = [s for s in range(1, half + 1) if s not in offsets]
                out |= {pair(order[i], order[(i + rest[0]) % n]) for i in range(n)}
            else:
                out |= {pair(order[i], order[i + n // 2]) for i in range(n // 2)}
        if sound(names, out):
            break
    return sorted(out)


def sound(nodes: Sequence[str], pairs: Sequence[Pair] | set[Pair]) -> bool:
    """Connected and not bipartite (an odd cycle): what the sum model needs to tell each node's effect."""
    side: dict[str, int] = {nodes[0]: 0}
    todo = [nodes[0]]
    odd = False
    nbrs: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in pairs:
        nbrs[a].append(b)
        nbrs[b].append(a)
    while todo:
        x = todo.pop()
        for y in nbrs[x]:
            if y not in side:
                side[y] = 1 - side[x]
                todo.append(y)
            elif side[y] == side[x]:
                odd = True
    return odd and len(side) == len(nodes)


def suspects_of(verdicts: Sequence[pair_verdicts.PairVerdict]) -> set[str]:
    """The members of every pair whose verdict is not 'equivalent'."""
    return {m for v in verdicts if v.verdict != "equivalent" for m in v.pair}


def second_pass(nodes: Sequence[str], measured: Sequence[Pair], suspects: set[str], second: int,
                seed: int = 0) -> list[Pair]:
    """Each suspect with up to `second` good nodes (nodes not suspect) it has not been paired with yet."""
    good = [n for n in nodes if n not in suspects]
    met = set(measured)
    load = {g: 0 for g in good}
    rng = random.Random(seed * 7919 + 1)
    out: list[Pair] = []
    for s in sorted(suspects):
        free = [g for g in good if pair(s, g) not in met]
        rng.shuffle(free)
        free.sort(key=lambda g: load[g])  # stable: the shuffle breaks ties
        for g in free[:second]:
            out.append(pair(s, g))
            met.add(pair(s, g))
            load[g] += 1
    return out


def rounds(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """The pairs in rounds of pairs that share no node (greedy: at most 2d - 1 rounds for d partners), so
    each round's trials can run at once."""
    out: list[tuple[set[str], list[Pair]]] = []
    for p in pairs:
        for busy, members in out:
            if p[0] not in busy and p[1] not in busy:
                busy.update(p)
                members.append(p)
                break
        else:
            out.append((set(p), [p]))
    return [members for _, members in out]


WORKLOADS = ("collective",)  # a figure between two nodes: all-reduce bus bandwidth, higher is better


def workload_refused(name: str) -> str | None:
    """Why a workload cannot be a pair's figure (the end of the one line `gpuvs fleet --pairs` and the agent's
    pairs=true say), or None."""
    if name in WORKLOADS:
        return None
    return f"measures the link between two nodes: workload {name} is not allowed (use {' or '.join(WORKLOADS)})"


PARAMS = (  # `gpuvs fleet`'s pair options; the agent's `--workload collective:pairs=true,...` too
    Param("pairs", bool, False, "which node or link is slow: pairs of nodes, each a trial across the two "
          "(--num-nodes 2 pinned to them), of the collective workload; a verdict per node and per pair "
          "(docs/fleet.md)"),
    Param("partners", int, 4, "with --pairs: partners of each node in the first pass (every pair where the fleet is "
          "smaller)", min=3, max=100),
    Param("second_pass", int, 2, "with --pairs: good nodes each suspect is paired with in the second pass", min=0,
          max=100),
)


@dataclass
class PairPlan:
    partners: int = 4  # d: partners of each node in the first pass
    second: int = 2  # good partners of each suspect in the second pass
    seed: int = 0


@dataclass
class PairRun:
    """What a pair fleet run measured and found: the first pass's pairs, the suspects and the second
    pass's pairs, each pair's figures, and the verdicts over all of them."""

    first: list[Pair]
    suspects: list[str]
    second: list[Pair]
    values: dict[Pair, list[float]]
    outcome: PairOutcome
    failed: list[Pair] = field(default_factory=list)  # pairs whose measuring gave no figure


def run_pairs(nodes: Sequence[str], measure: Measure, plan: PairPlan | None = None, *, margin: float = 0.05,
              confidence: float = 0.95, correction: bool = True,
              values: dict[Pair, list[float]] | None = None) -> PairRun:
    """Measure the first pass, judge, measure each suspect with good nodes, judge again over everything.
    Two looks at the data: each look's verdicts are made at alpha / 2 (pair_verdicts.judge), so the chance of
    any false call over the run stays at most alpha whichever look's verdict is kept.
    values: filled as each pair is measured, so a caller whose run is stopped (Ctrl-C raised from `measure`)
    keeps every pair measured so far. correction=False drops the family-wise correction (the tests show
    what it holds)."""
    plan = plan or PairPlan()
    if plan.second < 0:
        raise PlanError(f"second must be 0 or more good partners per suspect (got {plan.second})")
    first = first_pass(nodes, plan.partners, plan.seed)
    values = {} if values is None else values
    failed: list[Pair] = []

    def take(pairs: Sequence[Pair]) -> None:
        for p in pairs:
            got = [float(x) for x in measure(p) if x is not None and x > 0]
            if got:
                values[p] = got
            else:
                failed.append(p)

    take(first)
    looks = 2
    early = pair_verdicts.judge(list(nodes), values, margin=margin, confidence=confidence, looks=looks,
                                correction=correction)
    suspects = suspects_of(early.pairs)
    second = second_pass(list(nodes), list(values) + failed, suspects, plan.second, plan.seed)
    take(second)
    final = pair_verdicts.judge(list(nodes), values, margin=margin, confidence=confidence, looks=looks,
                                correction=correction) if second else early
    return PairRun(first, sorted(suspects), second, values, final, failed)
