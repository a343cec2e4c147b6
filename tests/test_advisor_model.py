"""The MPS advisor's prediction (sharing/advice.py) replayed on recorded H100 pairs (issue 37): each job's
solo readings and the measured work per repeat, in tests/data/advisor-pairs-h100.json. Role "fit": issue
15's eight pairs, which MPS_GAIN was fitted on; role "held-out": thirteen pairs measured for issue 37 that
took no part in the fit. The counts asserted are BENCHMARKS.md's ("the advisor's prediction, part 3")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpuvs.sharing import advice

ROOT = Path(__file__).resolve().parent.parent


def _fit_module():
    spec = importlib.util.spec_from_file_location("advisor_fit_benchmark", ROOT / "benchmarks" / "advisor_fit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fit():
    return _fit_module()


@pytest.fixture(scope="module")
def pairs(fit):
    data = fit.load()
    assert [p["role"] for p in data].count("fit") == 8 and [p["role"] for p in data].count("held-out") == 13
    return data


def test_gain_is_the_fit_pairs_geometric_mean(fit, pairs):
    # MPS_GAIN comes from the fit pairs only: the five whose GPM busy times add up to more than the GPU
    contending = [p for p in pairs if p["role"] == "fit" and fit.busy_sum(p) > 1.0]
    assert len(contending) == 5
    assert advice.MPS_GAIN == pytest.approx(fit.fitted_gain(pairs), abs=5e-4)
    held = [fit.measured(p, 0.05).ratio for p in pairs if p["role"] == "held-out" and fit.busy_sum(p) > 1.0]
    # the held-out contending pairs: 1.211, 1.105, 1.154, 1.123 and 0.935 (ResNet-18 training beside a copy)
    assert sorted(round(r, 3) for r in held) == [0.935, 1.105, 1.123, 1.154, 1.211]


def test_prediction_within_15_percent_on_fit_and_held_out_pairs(fit, pairs):
    s = fit.score(pairs, 0.05)
    # now: 7 of 8 fit pairs and 11 of 13 held-out pairs (85%) within ±15% of the measured ratio; the rule
    # before issue 37 (2 / max of the GPM fill sums): 5 of 8 and 9 of 13
    assert (s["fit"]["new_within"], s["fit"]["old_within"]) == (7, 5)
    assert (s["held-out"]["new_within"], s["held-out"]["old_within"]) == (11, 9)
    # the right side of the ±5% margin (against the point ratio): 5 of 8 and 8 of 13 (62%: short of the
    # issue's 80%), the same as before; 4 of the 5 settled held-out verdicts called right
    assert (s["fit"]["new_side"], s["held-out"]["new_side"]) == (5, 8)
    assert (s["held-out"]["settled"], s["held-out"]["new_settled_right"]) == (5, 4)
    # the ±15% test is weak here: the measured ratios lie within 0.80-1.27, and never advising MPS (always
    # 1.00) is within ±15% on 11 of 13 held-out pairs too; it is on the right side of the margin on 4 only
    assert (s["held-out"]["one_within"], s["held-out"]["one_side"]) == (11, 4)


def test_low_occupancy_gemm_is_no_longer_credited_with_a_second_gpu(fit, pairs):
    # two fp32 4096^3 GEMMs: 94% SM activity and 12% occupancy each; the old rule read 12% + 12% as room
    # for both (2.07), the measured MPS gain was 1.154 [1.141, 1.166] over three repeats
    pair = next(p for p in pairs if p["role"] == "held-out" and p["a"] == p["b"] and "fp32" in p["a"])
    a = advice.predict(fit.solo(pair), fit.TOTAL_MIB, 0.05)
    v = fit.measured(pair, 0.05)
    assert fit.old_ratio(pair) == pytest.approx(2.07, abs=0.01)
    assert a.ratio == pytest.approx(advice.MPS_GAIN) and a.prediction == "mps helps" == v.words
    assert abs(a.ratio / v.ratio - 1) < 0.03
    assert any("reported, not used" in r for r in a.reasons)


def test_where_the_model_is_still_wrong(fit, pairs):
    # two ResNet-18 training jobs, each busy 42% of the time: predicted 1.00, measured 1.270 [1.211, 1.331]
    # (time-slicing packs them badly); MPS hurting: pathfinder + hotspot3D (0.80) and ResNet-18 training
    # beside a copy (0.935 [0.870, 1.004], predicted 1.13): no term for either
    misses = {(fit.short(p["a"]), fit.short(p["b"])) for p in pairs
              if not fit.within(advice.predict(fit.solo(p), fit.TOTAL_MIB, 0.05).ratio, fit.measured(p, 0.05).ratio)}
    assert misses == {("kernels pathfinder", "kernels hotspot3D"),
                      ("cnn-train resnet18 bs 64 bf16 NHWC", "membw d2d 256MiB"),
                      ("cnn-train resnet18 bs 64 bf16 NHWC", "cnn-train resnet18 bs 64 bf16 NHWC")}
