"""The order of a fleet's trials: rounds across nodes, each a shuffled order and the next its reverse (A B C | C B A).

So a drift in time (another job starting, a room warming up) lands on every node alike.
Slots start trials concurrently up to `parallel`, never two at once on one node."""

from __future__ import annotations

import random
from typing import Iterable

Item = tuple[str, int]  # (node, trial number on that node)


def order(items: Iterable[Item], rng: random.Random) -> list[Item]:
    """Items in rounds: round r holds each node's r-th item of this batch, shuffled (odd rounds: the
    previous round's order reversed, for the nodes present in both)."""
    per_node: dict[str, list[Item]] = {}
    for item in sorted(items, key=lambda it: (it[0], it[1])):
        per_node.setdefault(item[0], []).append(item)
    out: list[Item] = []
    perm: list[str] = []
    for r in range(max((len(v) for v in per_node.values()), default=0)):
        present = [n for n in sorted(per_node) if len(per_node[n]) > r]
        if r % 2 == 0:
            perm = list(present)
            rng.shuffle(perm)
            round_nodes = perm
        else:
            round_nodes = [n for n in reversed(perm) if n in present] + [n for n in present if n not in perm]
        out.extend(per_node[n][r] for n in round_nodes)
    return out


class Slots:
    """Hands out items in order, at most `parallel` in flight, never two of one node at once."""

    def __init__(self, items: list[Item], parallel: int):
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.pending = list(items)
        self.parallel = parallel
        self.busy: set[str] = set()

    def take(self) -> list[Item]:
        """The items to start now (each marked busy until done() is called for it)."""
        started = []
        i = 0
        while len(self.busy) < self.parallel and i < len(self.pending):
            item = self.pending[i]
            if item[0] in self.busy:
                i += 1
                continue
            self.pending.pop(i)
            self.busy.add(item[0])
            started.append(item)
        return started

    def done(self, item: Item) -> None:
        self.busy.discard(item[0])

    def drop(self, node: str) -> list[Item]:
        """Forget a node's pending items (it cannot run them); returns them."""
        gone = [it for it in self.pending if it[0] == node]
        self.pending = [it for it in self.pending if it[0] != node]
        return gone

    @property
    def finished(self) -> bool:
        return not self.pending and not self.busy
