"""The verdict's statistics, on synthetic per-trial figures (no processes).

They are held to scipy on fixed inputs, and to their promises over many seeded experiments.
The promises: A/A false alarms, and a known 3% difference found."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy import stats as st

from gpuvs.analysis import stats
from gpuvs.store.summary import jitter, std_error

A = [1012.0, 998.5, 1005.2, 990.1, 1001.7]
B = [1033.9, 1041.2, 1029.0, 1046.5]


def test_per_trial_helpers_match_scipy_and_numpy():
    x = np.array([101.0, 99.5, 100.2, 100.9, 98.7, 104.0, 97.1])
    assert std_error(x) == pytest.approx(st.sem(x))
    assert jitter(x) == pytest.approx(st.median_abs_deviation(x, scale="normal"), rel=1e-4)
    s = stats.summarize_trials(x)
    assert s.mean == pytest.approx(np.mean(x)) and s.std == pytest.approx(np.std(x, ddof=1))
    low, high = st.t.interval(0.95, x.size - 1, loc=x.mean(), scale=st.sem(x))
    assert (s.ci_low, s.ci_high) == (pytest.approx(low), pytest.approx(high))


def test_ratio_interval_is_welch_on_mean_scaled_values_as_scipy_computes_it():
    a, b = np.array(A), np.array(B)
    ratio, low, high = stats.ratio_interval(a, b, 0.95)
    assert ratio == pytest.approx(b.mean() / a.mean())
    # The delta-method standard error of log(mean B / mean A) is Welch's standard error of
    # B/mean(B) - A/mean(A), with the same degrees of freedom: scipy's interval gives the half-width.
    ci = st.ttest_ind(b / b.mean(), a / a.mean(), equal_var=False).confidence_interval(0.95)
    assert ci.low == pytest.approx(-ci.high)
    assert math.log(high / ratio) == pytest.approx(ci.high) and math.log(ratio / low) == pytest.approx(ci.high)
    _, low90, high90 = stats.ratio_interval(a, b, 0.90)
    ci90 = st.ttest_ind(b / b.mean(), a / a.mean(), equal_var=False).confidence_interval(0.90)
    assert math.log(high90 / ratio) == pytest.approx(ci90.high)


def test_p_values_and_tost_match_scipy_one_sided_welch_tests():
    a, b = np.array(A), np.array(B)
    log_r = math.log(b.mean() / a.mean())
    sa, sb = a / a.mean(), b / b.mean()
    r = stats.compare_arms(a, b, margin=0.05)
    assert r.p_different == pytest.approx(st.ttest_ind(sb + log_r, sa, equal_var=False).pvalue)
    p_high = st.ttest_ind(sb + log_r - math.log(1.05), sa, equal_var=False, alternative="less").pvalue
    p_low = st.ttest_ind(sb + log_r - math.log(0.95), sa, equal_var=False, alternative="greater").pvalue
    assert stats.tost_p(a, b, 0.05) == pytest.approx(max(p_low, p_high))
    assert r.p_equivalent == pytest.approx(max(p_low, p_high))


def test_verdict_words_and_direction_of_the_unit():
    a, b = np.array(A), np.array(B)  # B about 3.7% above A, tight
    assert stats.compare_arms(a, b).verdict == "faster"
    assert stats.compare_arms(b, a).verdict == "slower"
    # a time, as its workload declares it: more is slower
    assert stats.compare_arms(a, b, better="lower", words=("slower", "faster")).verdict == "slower"
    assert stats.compare_arms(a, b, better="lower", words=("worse", "better")).verdict == "worse"  # a loss
    assert stats.compare_arms(a, b, margin=0.10).verdict == "faster-within-margin"  # real, and within +/-10%
    r = stats.compare_arms([1000.0, 1100.0], [1010.0, 1090.0])
    assert r.verdict == "inconclusive" and r.more_trials >= 1 and r.trials_needed > 2


def test_edge_cases_are_inconclusive_with_a_reason():
    r = stats.compare_arms([100.0], [120.0])
    assert r.verdict == "inconclusive" and "2 successful trials" in r.reason and r.ratio == pytest.approx(1.2)
    r = stats.compare_arms([], [120.0, 121.0])
    assert r.verdict == "inconclusive" and r.ratio is None and "no successful trial" in r.reason
    # no spread and nothing known of each trial's own uncertainty: no interval, no verdict
    r = stats.compare_arms([5.0, 5.0], [5.15, 5.15])
    assert r.verdict == "inconclusive" and r.ci_low is None and "cannot be bounded" in r.reason
    r = stats.compare_arms([100.0, None, float("nan"), 101.0], [100.5, 100.7])
    assert r.n_a == 2


def _exact(n, mean, sd, seed=0):
    z = np.random.default_rng(seed).standard_normal(n)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


@pytest.mark.parametrize("mean_b, margin", [(1025.0, 0.02), (1003.0, 0.02), (1012.0, 0.01)])
def test_trials_to_settle_is_the_first_count_whose_chance_reaches_the_target(mean_b, margin):
    a, b = _exact(3, 1000.0, 20.0), _exact(3, mean_b, 20.0, seed=1)
    r = stats.compare_arms(a, b, margin=margin)
    assert r.verdict == "inconclusive"
    need = r.trials_needed
    assert need is not None and r.more_trials == need - 3
    args = (r.log_r, r.se_log, r.df, r.unit_sd, r.method, margin, 0.05, 0.05)
    assert stats.trials_to_settle(*args, target=0.5) <= need <= stats.trials_to_settle(*args, target=0.95)
    # a count short of it does not reach the target; the limit says when no count within it does
    assert stats.trials_to_settle(*args, limit=need - 1) is None
    assert stats.trials_to_settle(*args, limit=need) == need


@pytest.mark.parametrize("n, cv", [(3, 0.01), (5, 0.02), (8, 0.005)])
def test_a_a_false_faster_or_slower_at_most_about_5_percent(n, cv):
    """A/A: both arms drawn from one distribution; at 95% a 'faster' or 'slower' verdict is a false
    alarm and may happen in at most ~5% of experiments."""
    sims, alarms, covered = 2000, 0, 0
    for seed in range(sims):
        rng = np.random.default_rng(seed)
        a = 1000.0 * (1 + cv * rng.standard_normal(n))
        b = 1000.0 * (1 + cv * rng.standard_normal(n))
        r = stats.compare_arms(a, b)
        alarms += r.verdict in ("faster", "slower")
        covered += r.ci_low <= 1.0 <= r.ci_high
    assert alarms / sims <= 0.065
    assert covered / sims >= 0.93


def test_a_known_3_percent_difference_is_found_with_the_right_sign_and_covered_95_percent():
    sims, verdicts, covered = 4000, {"faster": 0, "slower": 0, "equivalent": 0, "inconclusive": 0,
                                     "faster-within-margin": 0, "slower-within-margin": 0}, 0
    for seed in range(sims):
        rng = np.random.default_rng(10_000 + seed)
        # realistic noise: trial-to-trial CV of 1% (what a quiet GPU shows), lognormal
        a = 2000.0 * np.exp(0.01 * rng.standard_normal(5))
        b = 2000.0 * 1.03 * np.exp(0.01 * rng.standard_normal(5))
        r = stats.compare_arms(a, b)
        verdicts[r.verdict] += 1
        covered += r.ci_low <= 1.03 <= r.ci_high
    assert verdicts["faster"] / sims >= 0.95
    assert verdicts["slower"] == verdicts["slower-within-margin"] == 0
    assert (verdicts["equivalent"] + verdicts["faster-within-margin"]) / sims <= 0.01
    assert 0.93 <= covered / sims <= 0.975
    # the same figures as times (ms): the same difference is 'slower'
    r = stats.compare_arms([10.0, 10.1, 9.9], [10.3, 10.4, 10.2], better="lower", words=("slower", "faster"))
    assert r.verdict == "slower" and r.ratio == pytest.approx(1.03)


figures = hs.lists(hs.floats(min_value=100.0, max_value=1000.0), min_size=2, max_size=8)


@settings(max_examples=60, deadline=None)
@given(a=figures, b=figures, scale=hs.floats(min_value=0.01, max_value=100.0))
def test_swapping_arms_inverts_the_ratio_and_scaling_changes_nothing(a, b, scale):
    ab, ba = stats.compare_arms(a, b), stats.compare_arms(b, a)
    assert ab.ratio * ba.ratio == pytest.approx(1.0)
    if ab.se_log:
        assert ab.ci_low * ba.ci_high == pytest.approx(1.0) and ab.ci_high * ba.ci_low == pytest.approx(1.0)
    swap = {"faster": "slower", "slower": "faster", "equivalent": "equivalent", "inconclusive": "inconclusive",
            "faster-within-margin": "slower-within-margin", "slower-within-margin": "faster-within-margin"}
    assert ba.verdict == swap[ab.verdict]
    scaled = stats.compare_arms([scale * x for x in a], [scale * x for x in b])
    assert scaled.ratio == pytest.approx(ab.ratio) and scaled.verdict == ab.verdict
