"""The fleet's error rates, measured on gpuvs's own code: adaptive.run and verdicts.assess on simulated fleets.

    PYTHONPATH=src python benchmarks/fleet_error_rates.py [--runs 2000] [--cv 0.03] > /tmp/fleet-rates.md
False alarm: a run in which any healthy node is called slower or faster (promised at most 5%). Power: the slowed node.
Every rate has a Wilson interval. Pure CPU; no figure here is a performance claim."""

from __future__ import annotations

import argparse
import math
import time

from gpuvs.fleet.execute import adaptive
from gpuvs.fleet.simulate import simulate_nodes as simulate


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pct(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}–{100 * hi:.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--cv", type=float, default=0.03)
    args = ap.parse_args()
    plans = [("4, up to 12 (default)", adaptive.AdaptiveTrials(4, 12, 4)), ("3, up to 9", adaptive.AdaptiveTrials(3, 9, 3)),
             ("5, no more", adaptive.AdaptiveTrials(5, 5, 5)), ("3, no more", adaptive.AdaptiveTrials(3, 3, 3))]
    print(f"cv {args.cv:g} per trial, margin ±5%, confidence 0.95; {args.runs} simulated fleets per row "
          "(32-node rows: a quarter of that)\n")
    print("| trials per node | nodes | slowed | false alarm (any healthy node called slower/faster) | "
          "slowed node found | trials per node (mean) | healthy nodes left inconclusive |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    t0 = time.time()
    for name, plan in plans:
        for nodes, slow in ((3, None), (8, None), (32, None), (3, {0: 0.8}), (8, {0: 0.9})):
            runs = args.runs if nodes < 32 else args.runs // 4
            r = simulate.simulate(nodes, runs, cv=args.cv, slow=slow, plan=plan, seed=nodes * 7 + len(name))
            healthy = nodes - len(slow or {})
            print(f"| {name} | {nodes} | {'one at ' + str(list(slow.values())[0]) if slow else 'none'} | "
                  f"{pct(r.any_false, runs)} | {pct(r.slow_found, runs) if slow else '-'} | {r.mean_trials:.1f} | "
                  f"{100 * r.inconclusive_nodes / (runs * healthy):.1f}% |", flush=True)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
