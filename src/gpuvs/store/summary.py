"""How one trial's figures are made from its samples, with tf_cnn_benchmarks' semantics.

Throughput is total items over total time; +/- the standard deviation of per-step rates / sqrt(steps).
Jitter is 1.4826 x their median absolute deviation. The worker summarises a trial with it.
The store summarises an interrupted trial with it too; gpuvs.analysis.stats goes on from these figures."""

from __future__ import annotations

import math
from typing import Iterable, Protocol, Sequence

import numpy as np

from gpuvs.store.records import _DIRECTION, SeriesSummary

MAD_SCALE = 1.4826


class Sample(Protocol):
    """What a summary reads of a sample (records.SampleRecord; the worker's sample events, once read)."""

    series: str
    value: float | None
    unit: str | None
    seconds: float | None
    items: float | None


def perf_timing(items: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float]:
    """tf_cnn_benchmarks' get_perf_timing over the steps so far: (rate, +/-, jitter) where
    rate = total items / total time (batch size / mean step time for a fixed batch), +/- = the
    population standard deviation of per-step rates / sqrt(steps), jitter = 1.4826 x their median
    absolute deviation."""
    secs, its = np.asarray(seconds, dtype=float), np.asarray(items, dtype=float)
    if secs.size == 0 or secs.sum() <= 0:
        return float("nan"), float("nan"), float("nan")
    speeds = its / secs
    return float(its.sum() / secs.sum()), float(np.std(speeds) / math.sqrt(speeds.size)), jitter(speeds)


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


def summarize_series(samples: Iterable[Sample], better: str | None = None) -> SeriesSummary:
    """One series of one trial (samples: SampleRecords); `better` is the workload's declaration (higher,
    lower, neither; None: undeclared), never read from the unit."""
    samples = list(samples)
    values = [s.value for s in samples if s.value is not None]
    out = SeriesSummary(n=len(values), unit=samples[0].unit if samples else "", better=better,
                        higher_is_better=_DIRECTION.get(better or ""))
    if not values:
        return out
    arr = np.asarray(values, dtype=float)
    secs = [s.seconds for s in samples]
    items = [s.items for s in samples]
    timed = all(x is not None for x in secs) and all(x is not None for x in items) and sum(secs) > 0
    if timed:
        out.value, out.pm, _ = perf_timing(items, secs)  # total items over total time, as tf_cnn_benchmarks
        out.total_seconds = float(sum(secs))
        out.total_items = float(sum(items))
    else:
        out.value, out.pm = float(arr.mean()), std_error(arr)
    out.mean, out.jitter, out.median = float(arr.mean()), jitter(arr), float(np.median(arr))
    out.min, out.max = float(arr.min()), float(arr.max())
    out.p50, out.p90, out.p99 = (float(np.percentile(arr, q)) for q in (50, 90, 99))
    return out


def summarize_samples(samples: Iterable[Sample], declared=None) -> dict[str, SeriesSummary]:
    """{series: summary} in the order series first appear. `declared(name)` is the workload's
    declaration of a series (Workload.declared) or None."""
    by_series: dict[str, list[Sample]] = {}
    for s in samples:
        by_series.setdefault(s.series, []).append(s)
    out = {}
    for name, group in by_series.items():
        decl = declared(name) if declared else None
        out[name] = summarize_series(group, decl.better if decl else None)
    return out
