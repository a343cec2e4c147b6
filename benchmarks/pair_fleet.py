"""Do the pair fleet's verdicts keep their promise? Simulated fleets through gpuvs.fleet.execute.pair_plan.run_pairs (issue 35).

    PYTHONPATH=src python benchmarks/pair_fleet.py [--quick] [--json FILE]
Per row: the rate of runs with any false call, and how often the slow node or link is found (fixed seeds, CPU only).
Figures are drawn as fleet/simulate/simulate_pairs.py draws them; then the cost table (gpuvs.fleet.execute.pair_cost)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpuvs.fleet.execute import pair_cost
from gpuvs.fleet.simulate import simulate_pairs as pair_simulate

ROWS = [
    # (label, nodes, kwargs)
    ("healthy", 4, {}), ("healthy", 8, {}), ("healthy", 16, {}), ("healthy", 32, {}),
    ("healthy, 1% noise", 16, {"cv": 0.01}), ("healthy, 3 partners", 16, {"partners": 3}),
    ("one node at 0.62x", 8, {"slow": {5: 0.62}}), ("one node at 0.62x", 16, {"slow": {5: 0.62}}),
    ("one node at 0.90x", 16, {"slow": {5: 0.90}}), ("one node at 0.95x", 16, {"slow": {5: 0.95}}),
    ("one link at 0.60x", 8, {"links": 1, "link_speed": 0.6}),
    ("one link at 0.60x", 16, {"links": 1, "link_speed": 0.6}),
    ("one link at 0.85x", 16, {"links": 1, "link_speed": 0.85}),
    ("healthy, no correction", 8, {"correction": False}), ("healthy, no correction", 16, {"correction": False}),
]


def run(quick: bool = False, log=print) -> list[dict]:
    out = []
    for k, (label, n, kw) in enumerate(ROWS):
        kw = dict(kw)
        partners = kw.pop("partners", 4)
        runs = 200 if quick else (1000 if n <= 16 else 500)
        t0 = time.time()
        r = pair_simulate.simulate(n, runs, plan=pair_simulate.pairs.PairPlan(partners=partners), seed=1000 + k, **kw)
        row = {"case": label, "nodes": n, "partners": min(partners, n - 1), "runs": runs,
               "any_false": r.false_rate, "false_node": r.false_node / runs, "false_pair": r.false_pair / runs,
               "found": r.power if ("slow" in kw or "links" in kw) else None,
               "pair_trials": r.pair_trials, "second_pass_pairs": r.second_pass_pairs}
        out.append(row)
        log(f"{label} n={n}: {row} ({time.time() - t0:.1f} s)", file=sys.stderr)
    return out


def pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def markdown(rows: list[dict]) -> str:
    lines = ["| case | nodes | partners | runs | any false call | a healthy node | a healthy pair | found "
             "| pair trials | second-pass pairs |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['nodes']} | {r['partners']} | {r['runs']} | {pct(r['any_false'])} | "
                     f"{pct(r['false_node'])} | {pct(r['false_pair'])} | {pct(r['found'])} | {r['pair_trials']:.0f} | "
                     f"{r['second_pass_pairs']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 runs a row")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    rows = run(a.quick, log=print)
    print(markdown(rows))
    print()
    print(pair_cost.table())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
