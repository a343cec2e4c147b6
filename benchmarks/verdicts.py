"""Do the verdicts keep their promises? A pure-numpy simulation of experiments through gpuvs's own statistics.

    PYTHONPATH=src python benchmarks/verdicts.py [--quick] [--advisor] [--json FILE]
Trial figures are 1000 x exp(difference + noise), a share `rho` of the noise common to the round.
Tables: false verdicts on A/A (at most 5%), power, coverage, trials to settle, pairing and advise-mps's verdict."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from gpuvs.analysis import family
from gpuvs.analysis import stats
from gpuvs.analysis import sequential
from gpuvs.store.records import LookSchedule
from gpuvs.sharing import share_stats as sharestats
from gpuvs.sharing.advisor import PairRuns

MARGIN = 0.02
CONFIDENCE = 0.95
FIRST, CAP = 3, 20  # --until-confident defaults: 3 planned trials per arm, at most 20


@dataclass
class Fig:
    """A metric as the family sees it (the fields of comparison.Metric)."""

    name: str
    headline: bool
    unit: str = ""
    better: str = "higher"
    up: str = "faster"
    down: str = "slower"
    tested: bool = True


def figures(metrics: int) -> list[Fig]:
    return [Fig(f"m{j}", j == 0) for j in range(metrics)]


def draw(rng, arms: int, metrics: int, rounds: int, cv: float, diff: float, rho: float = 0.0):
    """values[i][metric] = {round: figure} for the baseline and `arms` other arms; every other arm
    differs from the baseline by `diff` on the headline."""
    sd = math.sqrt(math.log(1 + cv * cv))
    shared = rng.standard_normal((rounds, metrics)) * sd * math.sqrt(rho)
    values = []
    for i in range(arms + 1):
        own = rng.standard_normal((rounds, metrics)) * sd * math.sqrt(1 - rho)
        logs = shared + own - sd * sd / 2
        if i > 0:
            logs[:, 0] += math.log1p(diff)
        figs = 1000.0 * np.exp(logs)
        values.append({f"m{j}": {t: float(figs[t, j]) for t in range(rounds)} for j in range(metrics)})
    return values


def upto(values, n: int):
    return [{m: {t: v for t, v in d.items() if t < n} for m, d in arm.items()} for arm in values]


def analyse(values, figs, paired=True, plan=None, rounds=0, estimate=False):
    return family.compare_all(figs, values, [f"a{i}" for i in range(len(values))], margin=MARGIN,
                              confidence=CONFIDENCE, paired=paired, plan=plan, rounds=rounds, estimate=estimate)


def one_experiment(rng, arms, metrics, cv, diff, trials, rho=0.0, paired=True):
    """The rows of one experiment: a fixed count (trials = int) or --until-confident (trials = 'uc')."""
    figs = figures(metrics)
    if trials != "uc":
        return analyse(draw(rng, arms, metrics, trials, cv, diff, rho), figs, paired), trials
    values = draw(rng, arms, metrics, CAP, cv, diff, rho)
    plan = LookSchedule(FIRST, CAP)
    for n in plan.looks():
        heads = analyse(upto(values, n), figs[:1], paired, plan, n)
        if all(r.verdict != "inconclusive" for r in heads) or n == CAP:
            return analyse(upto(values, n), figs, paired, plan, n), n
    raise AssertionError("unreachable")


def false_verdicts(sims, cv, trials, arms, metrics, seed=0) -> dict:
    """A/A: share of experiments with any difference verdict anywhere (the family-wise error)."""
    rng = np.random.default_rng(seed)
    bad = head_bad = 0
    ns = []
    for _ in range(sims):
        rows, n = one_experiment(rng, arms, metrics, cv, 0.0, trials)
        bad += any(r.different for r in rows)
        head_bad += any(r.different for r in rows if r.headline)
        ns.append(n)
    return {"cv": cv, "trials": trials, "arms": arms, "metrics": metrics, "sims": sims, "false": bad / sims,
            "false_headline": head_bad / sims, "mean_trials": float(np.mean(ns))}


def false_others(sims, cv, trials, arms, metrics, diff=0.05, seed=5) -> dict:
    """The headline truly differs (so the gate opens) and every other metric is identical: share of
    experiments with a false verdict among the other metrics, and how often the gate opened."""
    rng = np.random.default_rng(seed)
    bad = opened = 0
    for _ in range(sims):
        rows, _ = one_experiment(rng, arms, metrics, cv, diff, trials)
        bad += any(r.different for r in rows if not r.headline)
        opened += any(r.different for r in rows if r.headline)
    return {"cv": cv, "trials": trials, "arms": arms, "metrics": metrics, "diff": diff, "sims": sims,
            "false": bad / sims, "gate_open": opened / sims}


def power(sims, cv, trials, diff, seed=1, rho=0.0) -> dict:
    rng = np.random.default_rng(seed)
    right = wrong = eq = 0
    ns = []
    for _ in range(sims):
        rows, n = one_experiment(rng, 1, 1, cv, diff, trials, rho)
        (r,) = rows
        right += r.different and r.log_r > 0
        wrong += r.different and r.log_r < 0
        eq += r.equivalent
        ns.append(n)
    return {"cv": cv, "trials": trials, "diff": diff, "sims": sims, "right": right / sims, "wrong": wrong / sims,
            "equivalent": eq / sims, "mean_trials": float(np.mean(ns))}


def coverage(sims, cv, trials, diff, paired=True, seed=2) -> dict:
    rng = np.random.default_rng(seed)
    hit = 0
    for _ in range(sims):
        (r,), _ = one_experiment(rng, 1, 1, cv, diff, trials, paired=paired)
        hit += r.ci_low <= 1 + diff <= r.ci_high
    return {"cv": cv, "trials": trials, "diff": diff, "paired": paired, "sims": sims, "coverage": hit / sims}


def calibration(sims, cv, first, diff, seed=3, cap=200) -> dict:
    """Experiments of `first` trials per arm left inconclusive: a fresh run at the suggested count
    settles how often?"""
    rng = np.random.default_rng(seed)
    asked = settled = beyond = 0
    suggested = []
    figs = figures(1)
    for _ in range(sims):
        (r,) = analyse(draw(rng, 1, 1, first, cv, diff), figs, estimate=True)
        if r.verdict != "inconclusive" or r.trials_needed is None:
            continue
        if r.trials_needed > cap:
            beyond += 1
            continue
        asked += 1
        n = r.trials_needed
        suggested.append(n)
        (again,) = analyse(draw(rng, 1, 1, n, cv, diff), figs)
        settled += again.verdict != "inconclusive"
    return {"cv": cv, "first": first, "diff": diff, "sims": sims, "inconclusive": asked + beyond, "rerun": asked,
            "beyond_cap": beyond, "settled": settled / asked if asked else float("nan"),
            "median_suggested": float(np.median(suggested)) if suggested else float("nan")}


def trials_for_power(cv, diff, rho, paired, sims, target=0.8, seed=4, top=80) -> int | None:
    """Smallest trials per arm at which a true `diff` is called with the right sign >= target."""
    def reached(n):
        rng = np.random.default_rng(seed + n)
        hits = 0
        for _ in range(sims):
            (r,), _ = one_experiment(rng, 1, 1, cv, diff, n, rho, paired)
            hits += r.different and r.log_r > 0
        return hits / sims >= target

    return stats.first_count(reached, 3, top)


def pairing(cv, rho, sims, diff=0.02) -> dict:
    p = trials_for_power(cv, diff, rho, True, sims)
    u = trials_for_power(cv, diff, rho, False, sims)
    return {"cv": cv, "rho": rho, "diff": diff, "paired": p, "unpaired": u}


ADVISOR_MARGIN, ADVISOR_REPEATS, ADVISOR_CAP = 0.05, 3, 8  # advise-mps's defaults


def advisor(sims, cv, diff, rho=0.0, seed=10, repeats=ADVISOR_REPEATS, cap=ADVISOR_CAP,
            margin=ADVISOR_MARGIN) -> dict:
    """advise-mps's sequential measurement: how often a verdict of a difference ('mps helps' / 'mps hurts',
    within the margin or not) is called, with which sign, how often 'no difference', how often the cap is
    reached unsettled, and the mean repeats measured."""
    rng = np.random.default_rng(seed)
    sd = math.sqrt(math.log(1 + cv * cv))
    plan = sharestats.repeats_plan(repeats, cap)
    right = wrong = same = capped = 0
    ns = []
    for _ in range(sims):
        shared = rng.standard_normal(cap) * sd * math.sqrt(rho)
        sliced = 1.5 * np.exp(shared + rng.standard_normal(cap) * sd * math.sqrt(1 - rho) - sd * sd / 2)
        mps = 1.5 * (1 + diff) * np.exp(shared + rng.standard_normal(cap) * sd * math.sqrt(1 - rho) - sd * sd / 2)
        pr = PairRuns("a", "b", plan=plan, margin=margin)
        for i in range(cap):
            pr.work["A+B"].append(float(sliced[i]))
            pr.work["A+B, MPS"].append(float(mps[i]))
            if i + 1 >= repeats and pr.settled():
                break
        v = pr.verdict()
        c = v.comparison
        right += bool(c.different) and (c.log_r > 0 if diff >= 0 else c.log_r < 0)
        wrong += bool(c.different) and not (c.log_r > 0 if diff >= 0 else c.log_r < 0)
        same += v.words == "no difference"
        capped += not v.settled
        ns.append(len(pr.work["A+B, MPS"]))
    return {"cv": cv, "rho": rho, "diff": diff, "sims": sims, "right": right / sims, "wrong": wrong / sims,
            "false": (right + wrong) / sims if diff == 0 else wrong / sims, "no_difference": same / sims,
            "capped": capped / sims, "mean_repeats": float(np.mean(ns))}


def advisor_levels(paths: int = 400_000, seed: int = 99) -> float:
    """The false-verdict rate of the advisor's looks (3, 4, ..., 8) themselves, on many more runs than the
    table can afford: paired t of standard normal log ratios tested at sequential.nominal_levels, with a seed
    other than the one that set the levels."""
    from scipy import special

    plan = sharestats.repeats_plan(ADVISOR_REPEATS, ADVISOR_CAP)
    levels = sequential.nominal_levels(tuple(plan.looks()), 1 - CONFIDENCE)
    z = np.random.default_rng(seed).standard_normal((paths, plan.cap))
    alive, hit = np.ones(paths, dtype=bool), np.zeros(paths, dtype=bool)
    for level, n in zip(levels, plan.looks()):
        t = np.abs(z[:, :n].mean(axis=1)) / (z[:, :n].std(axis=1, ddof=1) / math.sqrt(n))
        h = alive & (2 * special.stdtr(n - 1, -t) < level)
        hit |= h
        alive &= ~h
    return float(hit.mean())


def run_advisor(quick: bool = False) -> list[dict]:
    s = 300 if quick else 1000
    cvs = (0.05,) if quick else (0.02, 0.05, 0.10, 0.20)
    return [advisor(s, cv, d, rho, seed=seed_of(cv, d, rho, 10)) for cv in cvs for rho in (0.0, 0.5)
            for d in (0.0, 0.2)]


def seed_of(*parts) -> int:
    """A fixed seed per setting (Python's hash of a string changes from run to run)."""
    return int(sum((99 if p == "uc" else round(1000 * p) if isinstance(p, float) else p) * 7919 ** i
                   for i, p in enumerate(parts)) % 2**31)


def run(quick: bool = False, log=print) -> dict:
    t0 = time.time()
    s = 300 if quick else 1000
    cvs = (0.02,) if quick else (0.01, 0.02, 0.03)
    trial_set = (5, "uc") if quick else (5, 10, 20, "uc")
    shapes = ((1, 1), (3, 1), (1, 12), (5, 4)) if quick else ((1, 1), (3, 1), (5, 1), (1, 4), (1, 12), (5, 12))
    out: dict = {"quick": quick}
    out["aa"] = [false_verdicts(s if a * m < 20 else s // 2, cv, n, a, m, seed=seed_of(cv, n, a, m))
                 for cv in cvs for n in trial_set for a, m in shapes]
    log(f"A/A done ({time.time() - t0:.0f} s)")
    out["others"] = [false_others(s // 2, cv, n, a, m, seed=seed_of(cv, n, a, m, 5))
                     for cv in cvs for n in trial_set for a, m in ((1, 4), (1, 12), (5, 12)) if not quick or a == 1]
    log(f"other metrics done ({time.time() - t0:.0f} s)")
    diffs = (0.03,) if quick else (0.01, 0.02, 0.03, 0.05)
    out["power"] = [power(s, cv, n, d, seed=int(1e4 * d) + int(1e3 * cv)) for cv in cvs for n in trial_set
                    for d in diffs]
    log(f"power done ({time.time() - t0:.0f} s)")
    out["coverage"] = [coverage(s if quick else 2000, cv, n, d, paired, seed=int(1e3 * cv) + n)
                       for cv in cvs for n in ((5,) if quick else (5, 10, 20)) for d in (0.0, 0.03)
                       for paired in (True, False)]
    log(f"coverage done ({time.time() - t0:.0f} s)")
    out["calibration"] = [calibration(s, cv, first, d, seed=int(1e3 * cv) + first + int(1e4 * d))
                          for cv in cvs for first in ((3,) if quick else (3, 5)) for d in (0.0, 0.01, 0.03)]
    log(f"calibration done ({time.time() - t0:.0f} s)")
    out["pairing"] = [pairing(cv, rho, 150 if quick else 400) for cv in ((0.02,) if quick else cvs)
                      for rho in ((0.0, 0.5) if quick else (0.0, 0.5, 0.8))]
    log(f"pairing done ({time.time() - t0:.0f} s)")
    out["advisor"] = run_advisor(quick)
    out["seconds"] = time.time() - t0
    log(f"advisor done ({out['seconds']:.0f} s)")
    return out


def pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def table(title: str, columns: list[str], rows: list[list]) -> list[str]:
    return (["", f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def markdown(r: dict) -> str:
    name = lambda n: "until-confident" if n == "uc" else str(n)  # noqa: E731
    lines = table("False verdicts on identical arms (any metric, any arm)",
                  ["CV", "trials per arm", "arms vs baseline", "metrics", "sims", "any false verdict", "headline only",
                   "mean trials"],
                  [[pct(a["cv"]), name(a["trials"]), a["arms"], a["metrics"], a["sims"], pct(a["false"]),
                    pct(a["false_headline"]), f"{a['mean_trials']:.1f}"] for a in r["aa"]])
    lines += table("Headline 5% different, every other metric identical: false verdicts among the others",
                   ["CV", "trials per arm", "arms vs baseline", "metrics", "sims", "gate open", "any false verdict"],
                   [[pct(o["cv"]), name(o["trials"]), o["arms"], o["metrics"], o["sims"], pct(o["gate_open"]),
                     pct(o["false"])] for o in r["others"]])
    lines += table("Power: a true difference on the headline (one arm, one metric)",
                   ["CV", "trials per arm", "true difference", "right sign", "wrong sign", "'equivalent' (±2%)",
                    "mean trials"],
                   [[pct(p["cv"]), name(p["trials"]), pct(p["diff"]), pct(p["right"]), pct(p["wrong"]),
                     pct(p["equivalent"]), f"{p['mean_trials']:.1f}"] for p in r["power"]])
    lines += table("Coverage of the 95% interval (fixed counts)",
                   ["CV", "trials per arm", "true difference", "analysis", "coverage"],
                   [[pct(c["cv"]), c["trials"], pct(c["diff"]), "paired" if c["paired"] else "unpaired",
                     pct(c["coverage"])] for c in r["coverage"]])
    lines += table("Trials to settle: a fresh run at the suggested count",
                   ["CV", "first run", "true difference", "inconclusive", "re-run", "suggested (median)",
                    "re-runs settled"],
                   [[pct(c["cv"]), c["first"], pct(c["diff"]), c["inconclusive"], c["rerun"],
                     f"{c['median_suggested']:.0f}", pct(c["settled"])] for c in r["calibration"]])
    lines += table("The pairing: trials per arm to call a true 2% difference with 80% power",
                   ["CV", "share of variance common to a round", "paired", "unpaired"],
                   [[pct(p["cv"]), f"{p['rho']:g}", p["paired"] or "> 80", p["unpaired"] or "> 80"]
                    for p in r["pairing"]])
    lines += advisor_table(r["advisor"])
    lines += ["", f"({r['seconds']:.0f} s on this CPU)"]
    return "\n".join(lines[1:])


def advisor_table(rows: list[dict]) -> list[str]:
    return table("advise-mps: repeats added until the MPS verdict settles (3 planned, cap 8, margin ±5%)",
                 ["CV per group", "share common to a repeat", "true MPS / sliced", "sims", "false verdict",
                  "right sign", "'no difference'", "unsettled at the cap", "mean repeats"],
                 [[pct(a["cv"]), f"{a['rho']:g}", f"{1 + a['diff']:.2f}", a["sims"], pct(a["false"]),
                   "-" if a["diff"] == 0 else pct(a["right"]), pct(a["no_difference"]), pct(a["capped"]),
                   f"{a['mean_repeats']:.1f}"] for a in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the smaller version the tests run")
    ap.add_argument("--advisor", action="store_true", help="only advise-mps's table (issue 37)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.advisor:
        t0 = time.time()
        rows = run_advisor(args.quick)
        paths = 40_000 if args.quick else 400_000
        print("\n".join(advisor_table(rows)[1:] + [
            "", f"The looks themselves, {paths:,} A/A runs of the paired t: false verdicts "
            f"{pct(advisor_levels(paths))} ({time.time() - t0:.0f} s on this CPU)"]))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        return 0
    result = run(args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
