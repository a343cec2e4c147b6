"""Per-trial summaries: tf_cnn_benchmarks' semantics, series kept apart, the interval against scipy, edge cases."""

import math

import numpy as np
import pytest
from scipy import stats as st

from gpuvs import events, workloads
from gpuvs.analysis import stats
from gpuvs.store.records import SampleRecord, SeriesSummary
from gpuvs.store.summary import std_error, summarize_samples, summarize_series


def sampled(*events_):
    """Worker sample events as the records a summary reads."""
    return [SampleRecord.from_event(e) for e in events_]


def test_tf_cnn_semantics_on_fixed_steps():
    # 4 steps of 32 images: 0.1 s, 0.2 s, 0.1 s, 0.1 s
    secs = [0.1, 0.2, 0.1, 0.1]
    samples = sampled(*(events.sample(i + 1, 32 / s, "images/sec", seconds=s, items=32) for i, s in enumerate(secs)))
    s = summarize_samples(samples)["main"]
    rates = np.array([320.0, 160.0, 320.0, 320.0])
    assert s.value == pytest.approx(128 / 0.5)  # total images / total time, not mean of rates
    assert s.mean == pytest.approx(rates.mean())
    assert s.pm == pytest.approx(rates.std(ddof=0) / 2)  # get_perf_timing: np.std, population
    assert s.jitter == pytest.approx(1.4826 * np.median(np.abs(rates - np.median(rates))))
    assert s.n == 4 and s.better is None  # nothing declared it: no direction
    assert s.total_seconds == pytest.approx(0.5) and s.total_items == 128.0
    assert list(s.to_dict()) == ["n", "unit", "better", "higher_is_better", "value", "total_seconds", "total_items",
                                 "mean", "pm", "jitter", "median", "min", "max", "p50", "p90", "p99"]
    assert SeriesSummary.from_dict(s.to_dict()) == s


def test_series_are_kept_apart_and_the_direction_is_the_workloads_declaration_never_the_unit():
    samples = sampled(events.sample(1, 5.0, "ms", series="lat"), events.sample(1, 2.0, "GB/s", series="bw"),
                      events.sample(2, 7.0, "ms", series="lat"))
    out = summarize_samples(samples)
    assert list(out) == ["lat", "bw"]
    assert out["lat"].value == pytest.approx(6.0) and out["lat"].better is None
    kernels = workloads.get("kernels")  # app series in ms: declared lower-is-better
    out = summarize_samples(samples, kernels.declared)
    assert out["lat"].better == "lower" and out["lat"].higher_is_better is False
    serve = workloads.get("serve-load")  # its "latency" series is a time, its "throughput" a rate
    assert serve.declared("latency").better == "lower" and serve.declared("throughput").up == "faster"


def test_trial_interval_matches_scipy():
    values = [101.0, 99.5, 100.2, 100.9, 98.7]
    s = stats.summarize_trials(values)
    low, high = st.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=st.sem(values))
    assert s.ci_low == pytest.approx(low) and s.ci_high == pytest.approx(high)
    assert s.cv == pytest.approx(np.std(values, ddof=1) / np.mean(values))


def test_edge_cases():
    assert stats.summarize_trials([5.0]).n == 1
    assert math.isnan(stats.summarize_trials([5.0]).ci_low)
    assert summarize_series([]).n == 0
    assert summarize_series([]).to_dict() == {"n": 0, "unit": "", "better": None, "higher_is_better": None}
    assert stats.summarize_trials([]).to_dict() == {"n": 0, "values": []}
    assert std_error([3.0]) == 0.0
