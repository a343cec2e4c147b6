"""Summaries of samples (per trial) and of trials (per arm), and the comparison of two arms, as typed records.

SeriesSummary, TrialsSummary, LogRatio, Comparison: their to_dict() is what the protocol, the store and JSON carry.
A trial's throughput is tf_cnn_benchmarks's: total items over total time, not the mean of per-step rates."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from gpuvs.store.records import known_fields

def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval of the mean: (mean, low, high)."""
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean()) if arr.size else float("nan")
    if arr.size < 2:
        return mean, float("nan"), float("nan")
    half = float(_t_quantile((1 + confidence) / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return mean, mean - half, mean + half


@dataclass
class TrialsSummary:
    """Across trials of one arm: the per-trial figures, their mean, spread and Student-t interval (the
    figures are there once there is a value: n > 0; the interval is nan under 2)."""

    n: int = 0
    values: list[float] = field(default_factory=list)
    mean: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    std: float | None = None
    cv: float | None = None
    min: float | None = None
    max: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "values": list(self.values)}
        if self.n:
            out.update((f.name, getattr(self, f.name)) for f in fields(self)[2:])
        return out


def summarize_trials(values: Sequence[float | None], confidence: float = 0.95) -> TrialsSummary:
    """Across trials of one arm: the per-trial figures, their mean, spread and CI."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    out = TrialsSummary(n=int(arr.size), values=[float(v) for v in arr])
    if arr.size == 0:
        return out
    out.mean, out.ci_low, out.ci_high = t_interval(arr, confidence)
    out.confidence = confidence
    out.std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    out.cv = float(arr.std(ddof=1) / out.mean) if arr.size > 1 and out.mean else 0.0
    out.min, out.max = float(arr.min()), float(arr.max())
    return out


def fmt_rate(value: float) -> str:
    """tf_cnn_benchmarks prints rates with one decimal."""
    return f"{value:.1f}" if value == value else "nan"



# -- two arms -------------------------------------------------------------------------------------
#
# Arm B against baseline arm A on the log scale: log R = log(B / A).
# - Paired (the interleaved design: rounds A B | B A, one trial of each arm per round): d_t =
#   log b_t - log a_t over the rounds where both trials succeeded; log R = mean(d), se = sd(d)/sqrt(n),
#   df = n - 1. What the round shares (drift, a busy neighbour, clocks) cancels in d_t. Used when at
#   least PAIRED_MIN complete pairs exist; a round whose other trial failed drops out of the pairs.
# - Unpaired (too few pairs, or experiments not interleaved: --stored): R = mean(b) / mean(a),
#   se(log R)^2 = s_B^2 / (n_B mean(b)^2) + s_A^2 / (n_A mean(a)^2) (delta method), Welch df.
# - Floor: no trial figure is known better than its own measurement: each arm's relative variance
#   per trial is at least floor^2 (per-step spread / timer resolution, given by the caller), so two
#   identical values never give a zero-width interval. No spread and no floor: inconclusive.
# - Two hypotheses, tested at the same level (at most one of them can be true, so the chance of a
#   false verdict stays at `level`): different (two-sided t, p_different < level) and equivalent
#   within +/-margin (two one-sided tests, p_equivalent < level_eq). Both can hold: "equivalent
#   within +/-2%, and 1.5% slower".

PAIRED_MIN = 3
MAX_TRIALS_ESTIMATE = 10_000
SETTLE_TARGET = 0.9


def _t_quantile(p: float, df: float) -> float:
    """Student t quantile (normal for infinite df); scipy.special is ~100x quicker than scipy.stats here."""
    from scipy import special

    return float(special.ndtri(p)) if math.isinf(df) else float(special.stdtrit(df, p))


def _t_cdf(x: float, df: float) -> float:
    from scipy import special

    return float(special.ndtr(x)) if math.isinf(df) else float(special.stdtr(df, x))


def _clean(values) -> dict[Any, float]:
    """{key: value} of the finite figures; a list is keyed by position."""
    items = values.items() if isinstance(values, dict) else enumerate(values)
    return {k: float(v) for k, v in items if v is not None and math.isfinite(float(v))}


@dataclass
class LogRatio:
    """log R = log(B / A) with its standard error and df; method paired or unpaired, the pairs used and
    the trials left out of them (paired), the per-trial spread of the difference (unit_sd)."""

    method: str
    log_r: float
    se: float
    df: float
    n_pairs: int
    unused: int
    unit_sd: float
    why_unpaired: str = ""


def log_ratio(a, b, *, paired: bool = False, floor_a: float = 0.0, floor_b: float = 0.0) -> LogRatio:
    """log R, its standard error and df, the method used and the trials it used. a, b: lists, or
    {round: figure} dicts (pairs are the rounds both have)."""
    ca, cb = _clean(a), _clean(b)
    common = sorted(set(ca) & set(cb), key=str) if paired else []
    if len(common) >= PAIRED_MIN:
        d = np.log([cb[k] for k in common]) - np.log([ca[k] for k in common])
        n = d.size
        var = max(float(d.var(ddof=1)), floor_a ** 2 + floor_b ** 2)
        return LogRatio("paired", float(d.mean()), math.sqrt(var / n), n - 1.0, n, len(ca) + len(cb) - 2 * n,
                        math.sqrt(var))
    va_arr, vb_arr = np.array(list(ca.values())), np.array(list(cb.values()))
    ma, mb = float(va_arr.mean()), float(vb_arr.mean())
    ra = max(float(va_arr.var(ddof=1)) / (ma * ma), floor_a ** 2)
    rb = max(float(vb_arr.var(ddof=1)) / (mb * mb), floor_b ** 2)
    va, vb = ra / va_arr.size, rb / vb_arr.size
    se = math.sqrt(va + vb)
    df = math.inf if se == 0.0 else (va + vb) ** 2 / (va * va / (va_arr.size - 1) + vb * vb / (vb_arr.size - 1))
    why = "" if not paired else f"fewer than {PAIRED_MIN} complete pairs"
    return LogRatio("unpaired", math.log(mb / ma), se, df, 0, 0, math.sqrt(ra + rb), why)


def ratio_interval(a, b, confidence: float = 0.95, **kw) -> tuple[float, float, float]:
    """Ratio B/A and its confidence interval: (ratio, low, high). Needs 2+ values per arm."""
    p = log_ratio(a, b, **kw)
    half = _t_quantile((1 + confidence) / 2, p.df) * p.se
    return math.exp(p.log_r), math.exp(p.log_r - half), math.exp(p.log_r + half)


def p_values(log_r: float, se: float, df: float, margin: float) -> tuple[float, float]:
    """(p_different, p_equivalent): two-sided t; the larger of the two one-sided tests against
    log(1 - margin) and log(1 + margin) (1.0 without a margin)."""
    p_diff = 2 * _t_cdf(-abs(log_r) / se, df)
    if margin <= 0:
        return p_diff, 1.0
    p_low = _t_cdf(-(log_r - math.log(1 - margin)) / se, df)  # H0: R <= 1 - margin
    p_high = _t_cdf((log_r - math.log(1 + margin)) / se, df)  # H0: R >= 1 + margin
    return p_diff, max(p_low, p_high)


def tost_p(a, b, margin: float, **kw) -> float:
    p = log_ratio(a, b, **kw)
    return p_values(p.log_r, p.se, p.df, margin)[1]


@dataclass
class Comparison:
    """Arm B against baseline arm A (compare_arms): the ratio B/A, its interval at the level the verdict
    was made at, the two tests' p-values and the verdict ('equivalent'; WORD-within-margin, with `also`
    the word, when a difference inside the margin holds too (settled_verdict); a word of `words`; 'inconclusive'; 'descriptive' for a figure shown, not
    tested), trials per arm that would settle it. log_r, unit_sd and have are there once the ratio's
    uncertainty was estimated (2+ positive figures per arm)."""

    n_a: int
    n_b: int
    margin: float
    confidence: float
    better: str | None
    words: tuple[str, str]
    level: float
    level_eq: float
    method: str | None = None
    n_pairs: int = 0
    unused: int = 0
    mean_a: float | None = None
    mean_b: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    se_log: float | None = None
    df: float | None = None
    p_different: float | None = None
    p_equivalent: float | None = None
    different: bool = False
    equivalent: bool = False
    verdict: str = "inconclusive"
    also: str | None = None
    trials_needed: int | None = None
    more_trials: int | None = None
    reason: str = ""
    log_r: float | None = None
    unit_sd: float | None = None
    have: int | None = None

    _ESTIMATED = ("log_r", "unit_sd", "have")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(Comparison):
            if f.name not in self._ESTIMATED or self.log_r is not None:
                out[f.name] = list(self.words) if f.name == "words" else getattr(self, f.name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        known = known_fields(cls, data)
        known["words"] = tuple(known.get("words") or ("faster", "slower"))
        return cls(**known)


def compare_arms(a, b, *, better: str | None = "higher", words: tuple[str, str] = ("faster", "slower"),
                 margin: float = 0.02, confidence: float = 0.95, level: float | None = None,
                 level_eq: float | None = None, paired: bool = False, floor_a: float = 0.0,
                 floor_b: float = 0.0, estimate: bool = True) -> Comparison:
    """Arm B against baseline arm A from per-trial figures: ratio B/A, its interval and a verdict.

    level / level_eq: the two-sided level of the difference test and the one-sided level of each equivalence
    test, after any correction for looks, arms or metrics (default 1 - confidence); the interval is at 1 - level,
    so it agrees with the verdict. words: (above, below) the baseline, from the metric's declaration.
    verdict: 'equivalent', WORD-within-margin (both hold; `also` = the word), a word, or 'inconclusive'.
    trials_needed: trials per arm at which a new run settles it with probability >= SETTLE_TARGET (None: not
    within the estimate's limit; not computed without `estimate`)."""
    alpha = round(1 - confidence, 12)
    level = alpha if level is None else level
    level_eq = level if level_eq is None else level_eq
    ca, cb = _clean(a), _clean(b)
    out = Comparison(n_a=len(ca), n_b=len(cb), margin=margin, confidence=confidence, better=better,
                     words=(words[0], words[1]), level=level, level_eq=level_eq,
                     mean_a=float(np.mean(list(ca.values()))) if ca else None,
                     mean_b=float(np.mean(list(cb.values()))) if cb else None)
    if not ca or not cb or out.mean_a <= 0 or out.mean_b <= 0:
        out.reason = "no positive figures in one arm" if ca and cb else "an arm has no successful trial"
        return out
    out.ratio = out.mean_b / out.mean_a
    if len(ca) < 2 or len(cb) < 2:
        out.reason = "needs at least 2 successful trials per arm"
        out.trials_needed, out.more_trials = 2, 2 - min(len(ca), len(cb))
        return out
    p = log_ratio(ca, cb, paired=paired, floor_a=floor_a, floor_b=floor_b)
    out.method, out.n_pairs, out.unused, out.se_log, out.df = p.method, p.n_pairs, p.unused, p.se, p.df
    out.log_r, out.unit_sd, out.have = p.log_r, p.unit_sd, min(len(ca), len(cb))
    if p.method == "paired":
        out.ratio = math.exp(p.log_r)  # the geometric mean of the per-round ratios
    if p.se == 0.0:
        out.reason = ("no spread between trials and no per-trial uncertainty known: "
                      "the interval cannot be bounded")
        return out
    out.p_different, out.p_equivalent = p_values(p.log_r, p.se, p.df, margin)
    return decide(out, level, level_eq, estimate)


def equivalence_interval(c: Comparison) -> tuple[float, float] | None:
    """The interval that equivalence was decided on: two one-sided tests at level_eq each hold exactly when
    the 1 - 2 level_eq interval lies inside the margin (the interval shown is at 1 - level: wider, and may
    reach past the margin of a row found equivalent)."""
    if not c.se_log or c.log_r is None or c.df is None:
        return None
    half = min(_t_quantile(1 - c.level_eq, c.df) * c.se_log, 700.0)
    return math.exp(c.log_r - half), math.exp(min(c.log_r + half, 700.0))


WITHIN_MARGIN = "-within-margin"
# every verdict settled_verdict gives (with the words 'slower' and 'faster')
SETTLED = ("slower", "faster", "equivalent", "slower" + WITHIN_MARGIN, "faster" + WITHIN_MARGIN, "inconclusive")


def settled_verdict(equivalent: bool, different: bool, word: str) -> str:
    """The one verdict vocabulary (compare, fleet, drift; their labels and metrics): 'equivalent' when only
    equivalence within the margin holds; WORD + '-within-margin' ('slower-within-margin') when both hold: the
    interval excludes 1 yet lies inside the margin, a small but real difference that is never called
    plain 'equivalent'; WORD ('slower', 'faster') when only the difference holds; else 'inconclusive'."""
    if equivalent and different:
        return word + WITHIN_MARGIN
    if equivalent:
        return "equivalent"
    return word if different else "inconclusive"


def direction(verdict: str) -> str:
    """'slower' of 'slower' and of 'slower-within-margin'; any other verdict as it is."""
    return verdict.removesuffix(WITHIN_MARGIN)


def within_margin(verdict: str) -> bool:
    return verdict.endswith(WITHIN_MARGIN)


def decide(out: Comparison, level: float, level_eq: float, estimate: bool = True) -> Comparison:
    """(Re)make the verdict of a compare_arms result at these levels (see compare_arms); a result
    without a standard error is left as it is."""
    if not out.se_log:
        return out
    out.level, out.level_eq, out.verdict, out.also, out.reason = level, level_eq, "inconclusive", None, ""
    half = min(_t_quantile(1 - level / 2, out.df) * out.se_log, 700.0)  # an early look's level is tiny
    out.ci_low, out.ci_high = math.exp(out.log_r - half), math.exp(min(out.log_r + half, 700.0))
    out.different = out.p_different < level
    out.equivalent = out.margin > 0 and out.p_equivalent < level_eq
    word = out.words[0] if out.log_r > 0 else out.words[1]
    out.verdict = settled_verdict(out.equivalent, out.different, word)
    out.also = word if out.equivalent and out.different else None
    if out.verdict != "inconclusive":
        out.trials_needed, out.more_trials = out.have, 0
        return out
    out.reason = "the interval holds both 1 and a ratio outside the margin"
    if not estimate:
        out.trials_needed = out.more_trials = None
        return out
    need = trials_to_settle(out.log_r, out.se_log, out.df, out.unit_sd, out.method, out.margin, level, level_eq)
    out.trials_needed = need
    out.more_trials = None if need is None else max(1, need - out.have)
    return out


# -- trials to settle -----------------------------------------------------------------------------
#
# "Settled" in a new run of n trials per arm: the difference test or the equivalence test passes.
# The true log ratio and spread are not the observed ones: they are drawn from what the observed
# run allows (sigma^2 ~ s^2 df / chi2(df), then delta ~ N(observed, sigma^2 / n_observed): the
# posterior under a flat prior), on a fixed grid of quantiles (no randomness: the same figures give
# the same answer). For each draw the chance that a run of n settles is computed with the normal
# approximation to the estimate of the new run, and the answer is the smallest n whose average
# chance is at least SETTLE_TARGET. benchmarks/verdicts.py checks that re-runs at that count settle
# at least 80% of the time.

_GRID_Z = 24  # quantiles of the ratio
_GRID_S = 12  # quantiles of the spread


def _settle_chance(delta, sigma, n, method: str, margin: float, level: float, level_eq: float):
    """P(settled) of a run of n per arm for arrays of true log ratio `delta` and per-trial sd `sigma`."""
    from scipy import special

    df = (n - 1.0) if method == "paired" else (2.0 * n - 2.0)
    se = sigma / np.sqrt(n)
    t2 = special.stdtrit(df, 1 - level / 2)
    t1 = special.stdtrit(df, 1 - level_eq)
    cdf = special.ndtr
    inside = cdf((t2 * se - delta) / se) - cdf((-t2 * se - delta) / se)  # the difference test fails
    if margin > 0:
        low = np.maximum(math.log(1 - margin) + t1 * se, -t2 * se)
        high = np.minimum(math.log(1 + margin) - t1 * se, t2 * se)
        eq = np.where(high > low, cdf((high - delta) / se) - cdf((low - delta) / se), 0.0)
        inside = inside - eq  # ...but the equivalence test passes
    return 1.0 - inside


def trials_to_settle(log_r: float, se: float, df: float, unit_sd: float, method: str, margin: float = 0.02,
                     level: float = 0.05, level_eq: float | None = None, target: float = SETTLE_TARGET,
                     limit: int = MAX_TRIALS_ESTIMATE) -> int | None:
    """Trials per arm at which a new run settles this comparison with probability >= target."""
    from scipy import special

    level_eq = level if level_eq is None else level_eq
    if not (se > 0 and unit_sd > 0):
        return None
    zq = special.ndtri((np.arange(_GRID_Z) + 0.5) / _GRID_Z)
    dfs = min(df, 1e6)
    chi = special.chdtri(dfs, 1 - (np.arange(_GRID_S) + 0.5) / _GRID_S)  # chi2 quantiles
    scale = np.sqrt(dfs / chi)[:, None]  # sigma / s
    sigma = (unit_sd * scale) * np.ones((1, _GRID_Z))
    delta = log_r + se * scale * zq[None, :]

    def enough(n: int) -> bool:
        return float(_settle_chance(delta, sigma, float(n), method, margin, level, level_eq).mean()) >= target

    # the chance grows with n (both tests sharpen): a binary search finds the first n that reaches it
    return first_count(enough, 2, limit)


def first_count(ok, low: int, high: int) -> int | None:
    """The smallest n in [low, high] with ok(n), for an ok that stays true once true; None if none."""
    if not ok(high):
        return None
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if ok(mid) else (mid + 1, high)
    return low
