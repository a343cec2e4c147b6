"""The stopping rule of --until-confident: group-sequential tests with linear alpha spending (Lan-DeMets).

The chance of a false verdict stays at alpha however many times the comparison is looked at before the cap.
Equivalence stops the run too, from the same spending of its own one-sided alpha.
Why linear spending, measured against O'Brien-Fleming and Pocock: docs/compare.md."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from gpuvs.store.records import LookSchedule

PATHS = 200_000  # simulated A/A runs that set the boundaries (fixed seed: the same levels every time)


def spent(t: float, alpha: float) -> float:
    """Alpha spent by information fraction t: linear (docs/compare.md says why)."""
    return alpha * min(max(t, 0.0), 1.0)


@lru_cache(maxsize=64)
def nominal_levels(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """Two-sided nominal level of each look (trials per arm at each look, increasing; the last is the
    cap) for a total two-sided alpha.

    The boundaries are set on the paired t of the per-round log ratios by simulating PATHS runs with no
    difference: at each look, the |t| that the runs still going cross as often as the spending allows.
    A look whose allowance is below what the simulation can resolve does not stop."""
    # Not the textbook z boundaries: they assume a known variance, and the t of successive looks share an
    # estimated one; with a GPU comparison's few trials they let about 5.4% through at 5%.
    from scipy import special

    cap = looks[-1]
    rng = np.random.default_rng(20261123)
    alive = np.ones(PATHS, dtype=bool)
    sums = np.zeros(PATHS)
    squares = np.zeros(PATHS)
    done = 0
    levels = []
    prev_spent = 0.0
    for n in looks:
        z = rng.standard_normal((PATHS, n - done))
        sums += z.sum(axis=1)
        squares += (z * z).sum(axis=1)
        done = n
        mean = sums / n
        sd = np.sqrt(np.maximum(squares - n * mean * mean, 0.0) / (n - 1))
        t = np.abs(mean) / (sd / math.sqrt(n))
        allowed = spent(n / cap, alpha) - prev_spent
        crossing = int(allowed * PATHS)
        live_t = np.sort(t[alive])[::-1]
        if crossing < 1 or n < 2:
            levels.append(0.0)
            continue
        c = float(live_t[min(crossing, live_t.size) - 1])
        levels.append(float(2 * special.stdtr(n - 1, -c)))
        hit = alive & (t >= c)
        alive &= ~hit
        prev_spent += hit.sum() / PATHS
    return tuple(levels)


def levels(plan: LookSchedule, rounds: int, alpha: float) -> tuple[float, float]:
    """(two-sided level of the difference test, one-sided level of each equivalence test) at the look of `plan`
    where `rounds` trials per arm have run, for a comparison given total alpha."""
    looks = tuple(plan.looks())
    k = plan.look(rounds)
    return nominal_levels(looks, alpha)[k], nominal_levels(looks, 2 * alpha)[k] / 2
