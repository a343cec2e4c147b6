"""The stopping rule of --until-confident: group-sequential tests with alpha spending (Lan-DeMets),
so that the chance of a false verdict stays at alpha however many times the comparison is looked at
before the cap.

The looks are known in advance: the planned trials n_0, then every added pair of rounds (A B | B A),
up to the cap N. By look k (information fraction t_k = n_k / N) the error spent is
    alpha(t) = alpha * t                                        (linear: Kim-DeMets, rho = 1)
and the boundary c_k is set so that the chance of first crossing at look k under no difference is
alpha(t_k) - alpha(t_{k-1}) for the paired t statistic itself (nominal_levels). Each look then
tests at the nominal two-sided level of that boundary.

Why linear: GPU comparisons are usually precise (trial-to-trial CV 0.1-0.5%), and most of the wall
time of a comparison is its trials; a rule that can stop at the first looks saves most of it.
O'Brien-Fleming-type spending cannot stop before 5 trials per arm (its first looks get ~0) and
needed 6.6 trials per arm on average to settle identical arms at CV 0.5% (linear: 5.0, Pocock-type:
4.6); Pocock-type spending leaves so little for the last look that a true 3% difference at CV 2%
was called in 96% of runs (linear: 97%, O'Brien-Fleming: 98.5%). Linear sits between the two
(benchmarks/verdicts.py, 400 runs each).

Equivalence (the two one-sided tests) stops the run too; its one-sided boundaries come from the same
spending of its own alpha (one-sided), so a false "equivalent" is held at alpha as well."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from gpuvs.store.records import Plan  # noqa: F401  (the record type: the looks planned)

PATHS = 200_000  # simulated A/A runs that set the boundaries (fixed seed: the same levels every time)


def spent(t: float, alpha: float) -> float:
    """Alpha spent by information fraction t: linear (see the module's note)."""
    return alpha * min(max(t, 0.0), 1.0)


@lru_cache(maxsize=64)
def nominal_levels(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """Two-sided nominal level of each look (trials per arm at each look, increasing; the last is the
    cap) for a total two-sided alpha.

    The boundaries are set on the statistic gpuvs computes, the paired t of the per-round log
    ratios, by simulating PATHS runs with no difference: at each look, the threshold on |t| that the
    runs still going cross with the probability the spending allows at that look. (The textbook
    boundaries assume a known variance; with the few trials of a GPU comparison the t statistics of
    successive looks share an estimated variance, and the z boundaries let about 5.4% through at
    5%.) A look whose allowance is below what the simulation can resolve does not stop."""
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


def levels(plan: Plan, rounds: int, alpha: float) -> tuple[float, float]:
    """(two-sided level of the difference test, one-sided level of each equivalence test) at the look of `plan`
    where `rounds` trials per arm have run, for a comparison given total alpha."""
    looks = tuple(plan.looks())
    k = plan.look(rounds)
    return nominal_levels(looks, alpha)[k], nominal_levels(looks, 2 * alpha)[k] / 2
