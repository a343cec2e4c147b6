"""Does the adaptive warm-up (workloads/_warmup.py) bias the figures? A simulation (fixed seeds, CPU only).

    PYTHONPATH=src python benchmarks/warmup_bias.py [--seeds N] [--aa-sims N] [--json FILE]
Each simulated step series gives a trial's figure twice: after the adaptive warm-up, and after 50 fixed steps.
Tables: the bias per shape of transient (target within +/-0.5%), and the A/A error rate by gpuvs's statistics."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from gpuvs.analysis import family
from gpuvs.workloads._warmup import WarmupPlan

STEP = 0.064  # seconds a step once steady (ResNet-50 bf16 NHWC batch 256 on an H100: about 4,000 images/s)
TIMED = 30  # the A/A's --steps
LONG = 50  # the long fixed warm-up
PLAN = WarmupPlan()


def shape(name: str, rng, n: int) -> np.ndarray:
    """Step seconds: the first step's first, then a transient on STEP with 0.3% noise (3% for noisy)."""
    i = np.arange(n, dtype=float)
    noise = 1 + rng.standard_normal(n) * (0.03 if name == "noisy flat" else 0.003)
    if name == "autotune (slow to step 3)":
        level = np.where(i == 1, 5.0, np.where(i == 2, 3.0, 1.0))
    elif name == "clock ramp (30 steps)":
        level = 1 + 0.3 * np.clip(1 - i / 30, 0, None)
    elif name == "exponential settle (10%, tau 8)":
        level = 1 + 0.10 * np.exp(-i / 8)
    elif name == "exponential settle (3%, tau 20)":
        level = 1 + 0.03 * np.exp(-i / 20)
    elif name == "noisy flat":
        level = np.ones(n)
    else:
        raise ValueError(name)
    times = STEP * level * noise
    times[0] = 4.0  # the first step: cuDNN's autotuning
    return times


SHAPES = ("autotune (slow to step 3)", "clock ramp (30 steps)", "exponential settle (10%, tau 8)",
          "exponential settle (3%, tau 20)", "noisy flat")
# Beyond the rule's reach: a settle so slow and small (0.1% a step at first, under 0.3% noise) that 2 x WINDOW
# steps cannot tell it from noise; it biases the figure as the old fixed 10 steps did, and only a warm-up
# longer than its time constant removes it.
SLOW = ("exponential settle (3%, tau 20)",)


def adaptive_stop(times) -> int:
    elapsed = 0.0
    for k in range(1, len(times) + 1):
        elapsed += float(times[k - 1])
        if PLAN.stop(k, times[:k], elapsed):
            return k
    return len(times)


OLD = 10  # the fixed warm-up of before (cnn-train's --warmup-steps default until issue 36)


def figures(times) -> tuple[float, float, int, float]:
    """(adaptive, fixed-50) figures in steps per second, the adaptive warm-up's steps, and the figure after the
    old fixed 10 steps."""
    lst = [float(t) for t in times]
    k = adaptive_stop(lst)
    return (TIMED / sum(lst[k:k + TIMED]), TIMED / sum(lst[LONG:LONG + TIMED]), k,
            TIMED / sum(lst[OLD:OLD + TIMED]))


def bias(name: str, seeds: int) -> dict:
    rng = np.random.default_rng(sum(map(ord, name)))  # a fixed seed per shape
    steady = 1 / STEP
    ad, fx, ks, old = [], [], [], []
    for _ in range(seeds):
        a, f, k, o = figures(shape(name, rng, 200))
        ad.append(a / steady - 1)
        fx.append(f / steady - 1)
        old.append(o / steady - 1)
        ks.append(k)
    ad_, fx_ = np.array(ad), np.array(fx)
    diff = ad_ - fx_
    return {"shape": name, "seeds": seeds, "slow": name in SLOW, "adaptive": float(ad_.mean()), "fixed": float(fx_.mean()),
            "old_fixed": float(np.mean(old)),
            "adaptive_minus_fixed": float(diff.mean()), "se": float(diff.std(ddof=1) / math.sqrt(seeds)),
            "steps_median": float(np.median(ks)), "steps_max": int(max(ks)),
            "seconds_against_old": float(np.mean([(k - OLD) * STEP for k in ks]))}


class _Fig:
    name, headline, unit, better, up, down, tested = "rate", True, "steps/s", "higher", "faster", "slower", True


def aa(sims: int, trials: int = 5, cv: float = 0.01, seed: int = 11) -> dict:
    rng = np.random.default_rng(seed)
    sd = math.sqrt(math.log(1 + cv * cv))
    bad = {"adaptive": 0, "fixed": 0}
    for _ in range(sims):
        values = {"adaptive": [{"rate": {}}, {"rate": {}}], "fixed": [{"rate": {}}, {"rate": {}}]}
        for arm in range(2):
            for t in range(trials):
                level = math.exp(rng.standard_normal() * sd - sd * sd / 2)
                name = SHAPES[int(rng.integers(len(SHAPES)))]
                a, f, _, _ = figures(shape(name, rng, 100) / level)
                values["adaptive"][arm]["rate"][t] = a
                values["fixed"][arm]["rate"][t] = f
        for kind in bad:
            rows = family.compare_all([_Fig()], values[kind], ["a0", "a1"], margin=0.02, confidence=0.95, paired=True)
            bad[kind] += any(r.different for r in rows)
    return {"sims": sims, "trials": trials, "cv": cv, "false_adaptive": bad["adaptive"] / sims,
            "false_fixed": bad["fixed"] / sims}


def run(seeds: int = 2000, aa_sims: int = 1000) -> dict:
    return {"bias": [bias(name, seeds) for name in SHAPES], "aa": aa(aa_sims)}


def markdown(r: dict) -> str:
    out = ["| transient | seeds | adaptive vs steady | fixed 50 vs steady | adaptive − fixed 50 (± 2 se) | "
           f"fixed {OLD} (before) vs steady | adaptive steps: median, max | seconds a trial against fixed {OLD} |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for b in r["bias"]:
        out.append(f"| {b['shape']}{' (slow: beyond the rule)' if b['slow'] else ''} | {b['seeds']} | {100 * b['adaptive']:+.3f}% | {100 * b['fixed']:+.3f}% | "
                   f"{100 * b['adaptive_minus_fixed']:+.3f}% ± {200 * b['se']:.3f}% | {100 * b['old_fixed']:+.3f}% | "
                   f"{b['steps_median']:g}, {b['steps_max']} | {b['seconds_against_old']:+.2f} |")
    a = r["aa"]
    out += ["", f"A/A, {a['sims']} experiments of {a['trials']} trials per arm (trial CV {100 * a['cv']:g}%, a transient "
            f"drawn per trial), any false verdict: adaptive {100 * a['false_adaptive']:.1f}%, fixed 50 "
            f"{100 * a['false_fixed']:.1f}%"]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2000)
    ap.add_argument("--aa-sims", type=int, default=1000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    t0 = time.time()
    r = run(args.seeds, args.aa_sims)
    print(markdown(r))
    print(f"\n({time.time() - t0:.0f} s)", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
