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
    from scipy import stats as st

    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean()) if arr.size else float("nan")
    if arr.size < 2:
        return mean, float("nan"), float("nan")
    half = float(st.t.ppf((1 + confidence) / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
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
