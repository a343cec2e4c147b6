"""The candidate forms of the MPS advisor's prediction (issue 37), written down before any was scored.

Each uses only what the advisor has before it runs a pair: each job's solo GPM readings (SM activity,
occupancy, tensor and DRAM activity, as fractions). A candidate predicts the ratio work with MPS /
time-sliced as 1 + sum(coef_k * feature_k); its coefficients are fitted by least squares on (measured - 1)
(no intercept: with no feature MPS changes nothing). benchmarks/advisor_fit.py scores each by leave-one-out
over all recorded pairs; the rule is chosen by, in this order: most pairs on the right side of the ±5%
margin, then most within ±15%, then fewer coefficients.

- "always 1.00": never advise MPS (no coefficient), the baseline.
- "constant": MPS always saves the context switches and overlaps launch gaps by the same factor.
- "step" (the rule before this refit): the gain only where the busy times add up to more than the GPU.
- "ramp": the gain grows with the busy sum up to the GPU: jobs that each leave gaps do not interleave
  perfectly under time-slicing (a context holds its slice while its launches trickle in), so MPS gains
  in proportion to how much of the time the other job wants the GPU.
- "ramp - both DRAM-heavy": the ramp, less a term in min(DRAM A, DRAM B): two jobs that both stream
  memory run concurrently under MPS and thrash caches and bandwidth, which taking turns avoids.
- "ramp - DRAM product": the same with DRAM A x DRAM B (contention grows with both loads)."""

from __future__ import annotations


def _busy(g: list[dict]) -> float:
    return sum(x["sm_active"] for x in g) / 100.0


def _dram(g: list[dict]) -> list[float]:
    return [x["dram_active"] / 100.0 for x in g]


# name -> the features of a pair (the two jobs' GPM percentages); the ratio is 1 + coef . features
CANDIDATES = {
    "always 1.00": lambda g: [],
    "constant": lambda g: [1.0],
    "step": lambda g: [1.0 if _busy(g) > 1.0 else 0.0],
    "ramp": lambda g: [min(1.0, _busy(g))],
    "ramp - both DRAM-heavy": lambda g: [min(1.0, _busy(g)), min(_dram(g))],
    "ramp - DRAM product": lambda g: [min(1.0, _busy(g)), _dram(g)[0] * _dram(g)[1]],
}
