"""Predicted against measured, from stored runs of `advise-mps --predict-only --json` and of `advise-mps` pairs.

    PYTHONPATH=src python benchmarks/advise_table.py PREDICT.json MARGIN SOURCE [SOURCE ...]   (a .db or a --json)
    PYTHONPATH=src python benchmarks/advise_table.py --export MEASURED.json SOURCE [SOURCE ...]
One repeat gives a point ratio, no interval; the current rule beside each stored prediction re-scores, it is no test."""

from __future__ import annotations

import json
import sqlite3
import sys

from gpuvs.sharing.advice import predict
from gpuvs.sharing.share_stats import as_rate
from gpuvs.store.records import SeriesSummary


def rate(summary: str | None) -> float | None:
    data = json.loads(summary or "{}")
    return as_rate(SeriesSummary.from_dict(next(iter(data.values()))))[0] if data else None


def measured(dbs: list[str]) -> dict[tuple[str, str], list[float | None]]:
    """(job A, job B) -> [work time-sliced, work MPS] (each the point figure of one repeat: the last stored)."""
    out: dict[tuple[str, str], list[float | None]] = {}
    for db in dbs:
        if db.endswith(".json"):  # advise-mps --json (one pair or a list), or this script's --export
            data = json.load(open(db))
            for one in data if isinstance(data, list) else [data]:
                if one["work"]["A+B"] and one["work"]["A+B, MPS"]:
                    out[(one["a"], one["b"])] = [one["work"]["A+B"][-1], one["work"]["A+B, MPS"][-1]]
            continue
        con = sqlite3.connect(db)
        exps = {e: json.loads(m) for e, m in con.execute("SELECT id, meta FROM experiments")}
        for exp, meta in exps.items():
            if "pairs" not in meta:
                continue
            pairs = meta["pairs"]
            alone: dict[str, float | None] = {}
            together: dict[tuple[int, bool], dict[int, float | None]] = {}
            for arm, trial, summary in con.execute("SELECT arm, trial, summary FROM trials WHERE experiment_id = ? "
                                                   "AND status = 'ok' ORDER BY id", (exp,)):
                if arm.startswith("alone: "):
                    alone[arm[7:]] = rate(summary)
                elif arm in ("A alone", "B alone"):
                    alone[pairs[0][0 if arm[0] == "A" else 1]] = rate(summary)
                else:
                    n = int(arm.split(":")[0][5:]) - 1 if arm.startswith("pair ") else 0
                    together.setdefault((n, "MPS" in arm), {})[trial] = rate(summary)
            for (n, mps), got in together.items():
                a, b = pairs[n]
                if len(got) == 2 and alone.get(a) and alone.get(b):
                    out.setdefault((a, b), [None, None])[int(mps)] = got[0] / alone[a] + got[1] / alone[b]
    return out


def verdict(r: float, margin: float) -> str:
    return "mps helps" if r > 1 + margin else "mps hurts" if r < 1 - margin else "no difference"


def main() -> None:
    if sys.argv[1] == "--export":  # --export OUT.json SOURCE...: the measured work, without the stores
        got = measured(sys.argv[3:])
        json.dump([{"a": a, "b": b, "work": {"A+B": [w[0]], "A+B, MPS": [w[1]]}} for (a, b), w in got.items()],
                  open(sys.argv[2], "w"), indent=1)
        return
    predict_path, margin, sources = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    predictions = json.load(open(predict_path))
    predictions = predictions if isinstance(predictions, list) else [predictions]
    work = measured(sources)
    print("| A | B | GPM alone: SM activity / occupancy / tensor / DRAM % | measured work sliced → MPS | "
          "measured MPS / sliced | measured | predicted then | hit | current rule | hit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    score = {"then": 0, "now": 0}
    n = 0
    for p in predictions:
        w = work.get((p["a"], p["b"]))
        solo = [(s["telemetry"], s["gpm"], s["memory_mib"]) for s in p["solo"]]
        now = predict(solo, None, margin)
        fills = " · ".join("/".join(f"{(s['gpm'] or {}).get(k, float('nan')):.0f}" for k in
                                    ("sm_active", "sm_occupancy", "tensor_active", "dram_active")) for s in p["solo"])
        then = f"{p['predicted']} ({p['predicted_ratio']:.2f})" if p["predicted_ratio"] else p["predicted"]
        cur = f"{now.prediction} ({now.ratio:.2f})" if now.ratio else now.prediction
        if w and None not in w:
            r = w[1] / w[0]
            words = verdict(r, margin)
            n += 1
            hit_then, hit_now = words == p["predicted"], words == now.prediction
            score["then"] += hit_then
            score["now"] += hit_now
            print(f"| {p['a']} | {p['b']} | {fills} | {w[0]:.2f} → {w[1]:.2f} | {r:.2f} | {words} | {then} | "
                  f"{'yes' if hit_then else 'NO'} | {cur} | {'yes' if hit_now else 'NO'} |")
        else:
            print(f"| {p['a']} | {p['b']} | {fills} | - | - | not measured | {then} | - | {cur} | - |")
    print(f"\nhit rate as predicted then: {score['then']} of {n}; current rule on the same solo figures: "
          f"{score['now']} of {n} (point ratios of one repeat; verdict margin ±{100 * margin:g}%)")


if __name__ == "__main__":
    main()
