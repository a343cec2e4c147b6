"""When the next run is due: --every after the start of the last one, the first --first-after the start, or on demand.

While the cluster cannot be reached, runs back off: doubling from 5 s up to --backoff-max, reset once one reaches it.
Plain arithmetic on the caller's clock: tested alone."""

from __future__ import annotations

from dataclasses import dataclass

BACKOFF_FIRST_S = 5.0


@dataclass
class Schedule:
    every_s: float
    first_after_s: float
    backoff_max_s: float = 300.0
    next_at: float = 0.0
    failures: int = 0  # consecutive runs that could not reach the cluster

    def start(self, now: float) -> None:
        self.next_at = now + self.first_after_s

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def wait_s(self, now: float) -> float:
        return max(0.0, self.next_at - now)

    def ran(self, started: float, reached: bool) -> float:
        """A run started at `started` ended; reached: it reached the cluster. The next run's time."""
        if reached:
            self.failures = 0
            self.next_at = started + self.every_s
        else:
            self.failures += 1
            self.next_at = started + min(self.backoff(), self.every_s)
        return self.next_at

    def backoff(self) -> float:
        """5, 10, 20, ... seconds after the n-th failure in a row, at most backoff_max_s."""
        return min(self.backoff_max_s, BACKOFF_FIRST_S * 2 ** max(0, self.failures - 1))
