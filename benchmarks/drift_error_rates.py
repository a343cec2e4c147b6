"""Drift verdicts' and change points' error rates, measured on gpuvs's own code on simulated fleet histories.

    PYTHONPATH=src python benchmarks/drift_error_rates.py [--fleets 1000] > /tmp/drift-rates.md
One node steps or slides by 3, 5 or 10%, or none does. It counts false alarms on the stable nodes, and power.
Every rate has a Wilson interval. Pure CPU; no figure here is a performance claim."""

from __future__ import annotations

import argparse
import math
import time

from gpuvs.fleet.simulate.simulate_nodes.simulate_drift import Change, Noise, simulate

SIZES = (3, 8, 32, 100)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pct(k: int, n: int) -> str:
    if not n:
        return "-"
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}–{100 * hi:.1f}]"


def fleets_for(nodes: int, fleets: int) -> int:
    """3 nodes (the test cluster's size, where the rates sit nearest their bounds): twice --fleets; 8: as
    many; 32: half; 100: a fifth (a fleet of 100 costs about 30 of 3)."""
    return {3: 2 * fleets, 8: fleets, 32: fleets // 2}.get(nodes, fleets // 5)


def scenarios(runs: int) -> dict[str, Change | None]:
    """One node changes (node-1); the false alarms are counted on the other nodes of the same fleet."""
    last, mid = runs - 1, runs // 2
    out: dict[str, Change | None] = {"stable": None}
    for size in (-0.03, -0.05, -0.10):
        out[f"step {100 * size:g}% at the latest run"] = Change(size, last)
    for size in (-0.03, -0.05, -0.10):
        out[f"slide {100 * size:g}% over the last 4 runs"] = Change(size, runs - 4, 4)
    for size in (-0.03, -0.05, -0.10):
        out[f"step {100 * size:g}% at run {mid + 1}"] = Change(size, mid)
    out[f"step -5% at run {runs - 3} (4 runs since)"] = Change(-0.05, runs - 4)
    return out


def drift_rows(names: list[str]) -> list[str]:
    return [n for n in names if n == "stable" or "latest" in n or "slide" in n]


def change_rows(names: list[str]) -> list[str]:
    return [n for n in names if "latest" not in n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleets", type=int, default=1000, help="simulated fleets per row for 8 nodes (3 nodes: twice "
                    "that; 32: half; 100: a fifth)")
    ap.add_argument("--runs", type=int, default=16, help="runs in each node's history")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    base = Noise()
    t0 = time.time()
    got = {}
    names = list(scenarios(args.runs))
    for nodes in sizes:
        for i, (name, change) in enumerate(scenarios(args.runs).items()):
            n = fleets_for(nodes, args.fleets)
            got[nodes, name] = simulate(nodes, n, args.runs, noise=base, change=change, seed=1000 * nodes + i)
    print(f"{args.runs} runs per node history; each trial {100 * base.cv:g}% CV, {min(base.trials)} trials per node "
          f"and run; each node's own run-to-run movement {100 * base.between:g}% (sd, log scale); the whole fleet "
          f"drifts {100 * base.fleet_trend:+g}% over the history and moves ±{100 * base.fleet_shock:g}% (sd) per run. "
          f"Confidence 0.95, margin ±5%, drift window 10 earlier runs (the run-to-run spread from up to 30: here "
          f"{args.runs - 1}). One node (node-1) changes, or none; the false "
          f"alarms are counted on the other nodes of the same fleet. Simulated fleets per row: "
          f"{', '.join(f'{fleets_for(n, args.fleets)} of {n} nodes' for n in sizes)}.\n")
    print("### The drift verdict: the latest run against the node's own earlier runs\n")
    print("| nodes | the changed node | false drift alarm (any other node called slower/faster) | "
          "changed node called slower | other nodes called equivalent to their past |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for nodes in sizes:
        for name in drift_rows(names):
            r = got[nodes, name]
            print(f"| {nodes} | {'none' if name == 'stable' else name} | {pct(r.false_drift, r.fleets)} | "
                  f"{'-' if name == 'stable' else pct(r.drift_found, r.fleets)} | "
                  f"{100 * r.stable_equivalent / r.stable_nodes:.0f}% |")
    print("\n### Change points: where in its history a node changed\n")
    print("| nodes | the changed node | false change point (any other node) | change point found on the changed node "
          "| found within ±1 run of the change | its step's interval holds the true step (of those) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for nodes in sizes:
        for name in change_rows(names):
            r = got[nodes, name]
            stable = name == "stable"
            print(f"| {nodes} | {'none' if stable else name} | {pct(r.false_change, r.fleets)} | "
                  f"{'-' if stable else pct(r.change_found, r.fleets)} | "
                  f"{'-' if stable else pct(r.located, r.fleets)} | "
                  f"{'-' if stable else pct(r.step_covered, r.located)} |")
    print("\n### Other noise: does the false-alarm rate hold?\n")
    print("| nodes | noise | the changed node | false drift alarm | changed node called slower | false change point | "
          "change point found |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    variants = {"run-to-run movement 2%": Noise(between=0.02),
                "no run-to-run movement, 3% CV": Noise(cv=0.03, between=0.0),
                "4, 8 or 12 trials per run (as adaptive runs)": Noise(trials=(4, 8, 12)),
                "one node moves 2x as much as its peers": Noise(noisy=2.0),
                "one node moves 3x as much as its peers": Noise(noisy=3.0)}
    for j, (label, noise) in enumerate(variants.items()):
        noisy = "as much as" in label
        for nodes in (sizes if noisy else [s for s in sizes if s in (8, 32)] or sizes[:1]):
            for name, change in (("none", None), ("step -5% at the latest run", Change(-0.05, args.runs - 1))):
                if change is not None and noisy and nodes != 8:
                    continue  # the noisy node is the last one; node-1 changes
                n = fleets_for(nodes, args.fleets)
                r = simulate(nodes, n, args.runs, noise=noise, change=change, seed=7000 + 100 * j + nodes)
                print(f"| {nodes} | {label} | {name} | {pct(r.false_drift, n)} | "
                      f"{'-' if change is None else pct(r.drift_found, n)} | {pct(r.false_change, n)} | "
                      f"{'-' if change is None else pct(r.change_found, n)} |", flush=True)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
