"""The candidate forms of the MPS advisor's prediction (issue 37), written down before any was scored.

Each uses only the jobs' solo GPM readings: the ratio MPS / time-sliced is 1 + sum(coef_k * feature_k).
The coefficients are least squares on (measured - 1), with no intercept; advisor_fit.py scores each by leave-one-out.
The rule is chosen by most pairs on the right side of the ±5% margin, then most within ±15%, then fewer coefficients."""

from __future__ import annotations


def _busy(g: list[dict]) -> float:
    return sum(x["sm_active"] for x in g) / 100.0


def _dram(g: list[dict]) -> list[float]:
    return [x["dram_active"] / 100.0 for x in g]


# name -> the features of a pair (the two jobs' GPM percentages); the ratio is 1 + coef . features
CANDIDATES = {
    "always 1.00": lambda g: [],  # never advise MPS: the baseline
    "constant": lambda g: [1.0],  # MPS saves the context switches and overlaps launch gaps by one factor
    "step": lambda g: [1.0 if _busy(g) > 1.0 else 0.0],  # the rule before: a gain only where busy times pass the GPU
    # the gain grows with the busy sum: jobs that leave gaps do not interleave perfectly when taking turns (a
    # context holds its slice while its launches trickle in)
    "ramp": lambda g: [min(1.0, _busy(g))],
    # less a term for two jobs that both stream memory: under MPS they thrash caches and bandwidth
    "ramp - both DRAM-heavy": lambda g: [min(1.0, _busy(g)), min(_dram(g))],
    "ramp - DRAM product": lambda g: [min(1.0, _busy(g)), _dram(g)[0] * _dram(g)[1]],  # contention grows with both
}
