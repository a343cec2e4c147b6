"""Issue 36 across several GPUs: a trial's start-up with its ranks spawned (before) and forked from the worker (after).

    OUT=DIR [DEVICE=cuda|cpu] [GPUS=2] [TRIALS=3] [LIMIT_S=280] PYTHONPATH=src python benchmarks/ranks_startup.py
Each mode is one A/A `gpuvs compare cnn-train` across GPUS ranks, the ranks' start forced by GPUVS_RANKS.
Writes OUT/ranks_startup.md (each mode's breakdown), .json and .log. DEVICE=cpu checks the script, measures nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT") or "/tmp/gpuvs-ranks-startup")
DEVICE = os.environ.get("DEVICE", "cuda")
GPUS = os.environ.get("GPUS", "2")
TRIALS = os.environ.get("TRIALS", "3")
LIMIT_S = float(os.environ.get("LIMIT_S") or 280)  # per mode: two fit a 10-minute call
if DEVICE == "cuda":
    JOB = ["--model", "resnet50", "--batch-size", "256", "--precision", "bf16", "--data-format", "NHWC",
           "--warmup-steps", "10", "--steps", "30"]
else:
    JOB = ["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--warmup-steps", "2", "--steps", "6"]
MODES = ("spawn", "fork")


def run(mode: str, db: Path, log) -> dict:
    cmd = [sys.executable, "-m", "gpuvs", "compare", "cnn-train", *JOB, "--device", DEVICE, "--num-gpus", GPUS,
           "--margin", "0.01", "--arm", "a:seed=1", "--arm", "b:seed=2", "--trials", TRIALS, "--order-seed", "7",
           "--store", str(db), "--name", f"ranks {mode}", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(HERE / "src"), GPUVS_RANKS=mode, PYTHONUNBUFFERED="1")
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=LIMIT_S)
        out, err, code = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:  # subprocess.run kills gpuvs; its trials end with it
        out, err, code = exc.stdout or "", exc.stderr or "", "timed out"
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    wall = time.monotonic() - t
    log.write(f"=== GPUVS_RANKS={mode} ({wall:.1f} s, exit {code})\n$ {' '.join(cmd)}\n{out[-20000:]}\n{err[-4000:]}\n")
    try:
        with sqlite3.connect(db) as con:
            (ident,) = con.execute("SELECT id FROM experiments WHERE name = ? ORDER BY created DESC",
                                   (f"ranks {mode}",)).fetchone()
        rep = subprocess.run([sys.executable, "-m", "gpuvs", "report", ident, "--store", str(db), "--format", "json"],
                             capture_output=True, text=True, env=env, cwd=HERE, timeout=120)
        data = json.loads(rep.stdout)
    except (TypeError, ValueError, sqlite3.Error, subprocess.TimeoutExpired):
        return {"mode": mode, "code": code, "wall": wall}
    return {"mode": mode, "code": code, "wall": wall, "time": data.get("time") or {}, "verdict": _verdict(data)}


def _verdict(data: dict) -> str:
    """The headline's verdict: 'equivalent, b/a 1.001 [0.996-1.005]; a 1234, b 1236 images/sec'."""
    for v in data.get("verdicts") or []:
        if v.get("headline"):
            return (f"{v['verdict']}, b/a {v['ratio']:.3f} [{v['ci_low']:.3f}–{v['ci_high']:.3f}]; a {v['mean_a']:.4g}, "
                    f"b {v['mean_b']:.4g} {v['unit']}")
    return "-"


def table(results: list[dict]) -> str:
    head = ("| ranks | trials | wall (s) | start-up /trial (s) | ranks' start /trial (s): processes, imports, "
            "process group | warm-up /trial (s) | timed /trial (s) | start-up share | warm-up share | timed share | "
            "verdict (headline) |")
    rows = [head, "|" + " --- |" * 11]
    for r in results:
        t = r.get("time") or {}
        if not t:
            rows.append(f"| {r['mode']} | failed ({r['code']}) | {r['wall']:.1f} |" + " - |" * 8)
            continue
        per, sh, ranks = t["per_trial"], t["shares"], (t.get("ranks") or {}).get("per_trial") or {}
        how = ", ".join(f"{k} {n}" for k, n in ((t.get("ranks") or {}).get("started_by") or {}).items())
        parts = (f"{ranks['ranks_s']:.2f}: {ranks['ranks_process_s']:.2f}, {ranks['ranks_import_s']:.2f}, "
                 f"{ranks['ranks_group_s']:.2f} ({how})") if ranks else "-"
        rows.append(f"| {r['mode']} | {t['trials']} | {t['wall_s']:.1f} | {per['start_up']:.2f} | {parts} | "
                    f"{per['warm_up']:.2f} | {per['measured']:.2f} | {100 * sh['start_up']:.1f}% | "
                    f"{100 * sh['warm_up']:.1f}% | {100 * sh['measured']:.1f}% | {r.get('verdict', '-')} |")
    return "\n".join(rows)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    db = OUT / "ranks_startup.db"
    db.unlink(missing_ok=True)
    results = []
    with (OUT / "ranks_startup.log").open("w") as log:
        for mode in MODES:
            print(f"GPUVS_RANKS={mode} ...", flush=True)
            results.append(run(mode, db, log))
            print(f"  exit {results[-1]['code']} after {results[-1]['wall']:.1f} s", flush=True)
    gpu = "the CPU (gloo): a check of the script, not a measurement"
    if DEVICE == "cuda":
        q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        gpu = ", ".join(sorted(set(q.stdout.split("\n")) - {""})) or "unknown GPU"
    text = (f"# A trial across {GPUS} ranks: spawned against forked ranks ({gpu})\n\n"
            f"`gpuvs compare cnn-train {' '.join(JOB)} --num-gpus {GPUS} --arm a:seed=1 --arm b:seed=2 --trials "
            f"{TRIALS}`, once with `GPUVS_RANKS=spawn` (before issue 36), once with `GPUVS_RANKS=fork` (after).\n\n"
            f"{table(results)}\n")
    (OUT / "ranks_startup.md").write_text(text)
    (OUT / "ranks_startup.json").write_text(json.dumps(results, indent=1, default=str))
    print(text)
    return 0 if all(r["code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
