"""The figure a person quotes for a run of several series (shapes, apps).

The whole set's work over its whole time, repeat by repeat: total work / total time, never a mean of rates."""

from __future__ import annotations


class Totals:
    """Work, time and the number of series that reached each repeat, summed over series."""

    def __init__(self) -> None:
        self.work: list[float] = []
        self.seconds: list[float] = []
        self.count: list[int] = []

    def add(self, repeat: int, work: float, seconds: float) -> None:
        """One sample (repeat counts from 1) of one series."""
        while len(self.seconds) < repeat:
            self.work.append(0.0)
            self.seconds.append(0.0)
            self.count.append(0)
        self.work[repeat - 1] += work
        self.seconds[repeat - 1] += seconds
        self.count[repeat - 1] += 1

    def complete(self, series: int) -> list[tuple[int, float, float]]:
        """(repeat, work, seconds) of the repeats that all `series` series reached."""
        return [(i, w, s) for i, (w, s, c) in enumerate(zip(self.work, self.seconds, self.count), 1) if c == series]
