"""Summaries of samples (per trial) and of trials (per arm).

Per trial, tf_cnn_benchmarks semantics: throughput = total items / total time (not the mean of
per-step rates); +/- = standard deviation of per-step rates / sqrt(steps); jitter = 1.4826 x the
median absolute deviation of per-step rates."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

MAD_SCALE = 1.4826

_TIME_UNITS = {"s", "ms", "us", "µs", "ns", "sec", "seconds"}


def higher_is_better(unit: str) -> bool:
    """Rates (x/sec, GB/s, TFLOP/s) are better high; durations (s, ms, us) better low."""
    return unit.strip().lower() not in _TIME_UNITS


def jitter(values: Sequence[float]) -> float:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan")
    return float(MAD_SCALE * np.median(np.abs(arr - np.median(arr))))


def std_error(values: Sequence[float]) -> float:
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return 0.0
    return float(arr.std(ddof=1) / math.sqrt(arr.size))


def summarize_series(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One series of one trial. Samples are protocol dicts (value, seconds, items, unit)."""
    samples = list(samples)
    values = [s["value"] for s in samples if s.get("value") is not None]
    unit = samples[0].get("unit", "") if samples else ""
    out: dict[str, Any] = {"n": len(values), "unit": unit, "higher_is_better": higher_is_better(unit)}
    if not values:
        return out
    arr = np.asarray(values, dtype=float)
    secs = [s.get("seconds") for s in samples]
    items = [s.get("items") for s in samples]
    if all(x is not None for x in secs) and all(x is not None for x in items) and sum(secs) > 0:
        out["value"] = float(sum(items) / sum(secs))  # total items over total time
        out["total_seconds"] = float(sum(secs))
        out["total_items"] = float(sum(items))
    else:
        out["value"] = float(arr.mean())
    out.update(mean=float(arr.mean()), pm=std_error(arr), jitter=jitter(arr), median=float(np.median(arr)),
               min=float(arr.min()), max=float(arr.max()),
               p50=float(np.percentile(arr, 50)), p90=float(np.percentile(arr, 90)),
               p99=float(np.percentile(arr, 99)))
    return out


def summarize_samples(samples: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{series: summary} in the order series first appear."""
    by_series: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        by_series.setdefault(s.get("series", "main"), []).append(s)
    return {name: summarize_series(group) for name, group in by_series.items()}


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval of the mean: (mean, low, high)."""
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean()) if arr.size else float("nan")
    if arr.size < 2:
        return mean, float("nan"), float("nan")
    half = float(_t_quantile((1 + confidence) / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return mean, mean - half, mean + half


def summarize_trials(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Across trials of one arm: the per-trial figures, their mean, spread and CI."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    out: dict[str, Any] = {"n": int(arr.size), "values": [float(v) for v in arr]}
    if arr.size == 0:
        return out
    mean, low, high = t_interval(arr, confidence)
    out.update(mean=mean, ci_low=low, ci_high=high, confidence=confidence,
               std=float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
               cv=float(arr.std(ddof=1) / mean) if arr.size > 1 and mean else 0.0,
               min=float(arr.min()), max=float(arr.max()))
    return out


def fmt_rate(value: float) -> str:
    """tf_cnn_benchmarks prints rates with one decimal."""
    return f"{value:.1f}" if value == value else "nan"


# -- comparisons across arms ----------------------------------------------------------------------
#
# The ratio R = mean(B) / mean(A) of two arms' per-trial figures, with a confidence interval from
# Welch's t on the log scale by the delta method:
#   log R = log mean(B) - log mean(A)
#   se(log R)^2 = s_B^2 / (n_B mean(B)^2) + s_A^2 / (n_A mean(A)^2)
#   degrees of freedom: Welch-Satterthwaite on those two terms
#   CI = exp(log R -/+ t(df) se)
# The two terms are the squared standard errors of each arm's trials scaled by that arm's mean, so
# the half-width is exactly Welch's interval of (B/mean(B)) - (A/mean(A)) (tests hold it to scipy).
# Equivalence within +/-margin is two one-sided tests (TOST) at level 1 - confidence against the
# bounds log(1 - margin) and log(1 + margin).

VERDICTS = ("faster", "slower", "equivalent", "inconclusive")
MAX_TRIALS_ESTIMATE = 10_000


def _log_ratio_parts(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(log R, se(log R), Welch df) for two arms' per-trial values; df is inf with no spread."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma, mb = float(a_arr.mean()), float(b_arr.mean())
    va = float(a_arr.var(ddof=1)) / (a_arr.size * ma * ma)
    vb = float(b_arr.var(ddof=1)) / (b_arr.size * mb * mb)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return math.log(mb / ma), 0.0, math.inf
    df = (va + vb) ** 2 / (va * va / (a_arr.size - 1) + vb * vb / (b_arr.size - 1))
    return math.log(mb / ma), se, df


def _t_quantile(p: float, df: float) -> float:
    """Student t quantile (normal for infinite df); scipy.special is ~100x quicker than scipy.stats here."""
    from scipy import special

    return float(special.ndtri(p)) if math.isinf(df) else float(special.stdtrit(df, p))


def _t_cdf(x: float, df: float) -> float:
    from scipy import special

    return float(special.ndtr(x)) if math.isinf(df) else float(special.stdtr(df, x))


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Ratio of means B/A and its confidence interval: (ratio, low, high). Needs 2+ values per arm."""
    log_r, se, df = _log_ratio_parts(a, b)
    half = _t_quantile((1 + confidence) / 2, df) * se
    return math.exp(log_r), math.exp(log_r - half), math.exp(log_r + half)


def tost_p(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """p-value of the two one-sided tests that B/A lies within [1 - margin, 1 + margin]: the larger
    of the two one-sided p-values (small = equivalent)."""
    log_r, se, df = _log_ratio_parts(a, b)
    low, high = math.log(1 - margin), math.log(1 + margin)
    if se == 0.0:
        return 0.0 if low < log_r < high else 1.0
    p_low = _t_cdf(-(log_r - low) / se, df)  # H0: R <= 1 - margin
    p_high = _t_cdf((log_r - high) / se, df)  # H0: R >= 1 + margin
    return max(p_low, p_high)


def _settled(log_r: float, se: float, df: float, margin: float, confidence: float) -> str | None:
    """'different', 'equivalent' or None for a log ratio with this standard error."""
    alpha = 1 - confidence
    if se == 0.0:  # no spread at all: the observed ratio is the answer
        if margin > 0 and math.log(1 - margin) < log_r < math.log(1 + margin):
            return "equivalent"
        return "different" if log_r != 0.0 else None
    t_one = _t_quantile(1 - alpha, df)
    if math.log(1 - margin) < log_r - t_one * se and log_r + t_one * se < math.log(1 + margin):
        return "equivalent"
    if abs(log_r) > _t_quantile(1 - alpha / 2, df) * se:
        return "different"
    return None


def trials_to_settle(a: Sequence[float], b: Sequence[float], margin: float = 0.02,
                     confidence: float = 0.95, limit: int = MAX_TRIALS_ESTIMATE) -> int | None:
    """Trials per arm at which this comparison would be settled (different or equivalent) if the
    observed ratio and each arm's coefficient of variation held; None if not within `limit`."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma, mb = float(a_arr.mean()), float(b_arr.mean())
    cv2_a = float(a_arr.var(ddof=1)) / (ma * ma)
    cv2_b = float(b_arr.var(ddof=1)) / (mb * mb)
    log_r = math.log(mb / ma)

    def settled_at(n: int) -> bool:
        va, vb = cv2_a / n, cv2_b / n
        se = math.sqrt(va + vb)
        df = math.inf if se == 0.0 else (va + vb) ** 2 / ((va * va + vb * vb) / (n - 1))
        return _settled(log_r, se, df, margin, confidence) is not None

    # More trials shrink both the standard error and the t quantile, so being settled is monotone
    # in n: a binary search finds the first n.
    if not settled_at(limit):
        return None
    low, high = 2, limit
    while low < high:
        mid = (low + high) // 2
        if settled_at(mid):
            high = mid
        else:
            low = mid + 1
    return low


def compare_arms(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True, margin: float = 0.02,
                 confidence: float = 0.95) -> dict[str, Any]:
    """Arm B against baseline arm A from per-trial figures: ratio B/A with its CI, and a verdict.

    verdict: 'equivalent' when TOST puts B/A within +/-margin; else 'faster'/'slower' when the CI
    excludes 1 (the direction respects higher_is_better); else 'inconclusive'. trials_needed: trials
    per arm that would settle it at the observed ratio and spread (None: not within the estimate's
    limit); more_trials: how many more per arm that is."""
    a_vals = [float(v) for v in a if v is not None and math.isfinite(v)]
    b_vals = [float(v) for v in b if v is not None and math.isfinite(v)]
    out: dict[str, Any] = {"n_a": len(a_vals), "n_b": len(b_vals), "margin": margin, "confidence": confidence,
                           "higher_is_better": higher_is_better, "method": "welch-log-delta",
                           "mean_a": float(np.mean(a_vals)) if a_vals else None,
                           "mean_b": float(np.mean(b_vals)) if b_vals else None,
                           "ratio": None, "ci_low": None, "ci_high": None, "se_log": None, "df": None, "p_different": None, "p_equivalent": None,
                           "verdict": "inconclusive", "trials_needed": None, "more_trials": None, "reason": ""}
    if not a_vals or not b_vals or out["mean_a"] <= 0 or out["mean_b"] <= 0:
        out["reason"] = "no positive figures in one arm" if a_vals and b_vals else "an arm has no successful trial"
        return out
    out["ratio"] = out["mean_b"] / out["mean_a"]
    if len(a_vals) < 2 or len(b_vals) < 2:
        out["reason"] = "needs at least 2 successful trials per arm"
        out["trials_needed"], out["more_trials"] = 2, 2 - min(len(a_vals), len(b_vals))
        return out
    ratio, low, high = ratio_interval(a_vals, b_vals, confidence)
    log_r, se, df = _log_ratio_parts(a_vals, b_vals)
    p_diff = 0.0 if se == 0.0 else 2 * _t_cdf(-abs(log_r) / se, df)
    p_eq = tost_p(a_vals, b_vals, margin) if margin > 0 else 1.0
    out.update(ratio=ratio, ci_low=low, ci_high=high, se_log=se, df=df, p_different=p_diff, p_equivalent=p_eq)
    settled = _settled(log_r, se, df, margin, confidence)
    if settled == "equivalent":
        out["verdict"] = "equivalent"
    elif settled == "different":
        out["verdict"] = "faster" if (ratio > 1) == higher_is_better else "slower"
    if settled:
        out["trials_needed"], out["more_trials"] = min(len(a_vals), len(b_vals)), 0
    else:
        need = trials_to_settle(a_vals, b_vals, margin, confidence)
        have = min(len(a_vals), len(b_vals))
        out["trials_needed"] = need
        out["more_trials"] = None if need is None else max(1, need - have)
        out["reason"] = "the interval holds both 1 and a ratio outside the margin"
    return out
