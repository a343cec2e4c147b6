"""GPU proof of issue 14: an A/A of the host arm of experiments/host-vs-container.yaml, before and after.

    python benchmarks/until_confident.py BEFORE_DIR OUT_DIR [--limit-before S] [--limit-after S] [--cpu]
Before: a checkout from before the change runs 3 trials, and its old stopping rule is replayed on them.
After: this checkout's `gpuvs compare --until-confident`. Both give their per-trial overhead and time to a verdict."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PARAMS = ["cnn-train", "--model", "resnet50", "--batch-size", "256", "--precision", "bf16", "--data-format", "NHWC",
          "--warmup-steps", "10", "--steps", "30", "--device", "cuda", "--quiet"]
STARTUP = ("launch_to_worker_s", "import_s", "model_build_s", "data_setup_s", "first_step_s", "warmup_s",
           "launch_to_timed_s")


if "--cpu" in sys.argv:  # a check of this script on a machine without a GPU, at toy sizes
    PARAMS = ["cnn-train", "--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--warmup-steps", "1",
              "--steps", "3", "--device", "cpu", "--quiet"]


def gpuvs(src: Path, args: list[str], limit: float) -> tuple[float, int, str]:
    env = dict(os.environ, PYTHONPATH=str(src))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=src.parent)
    try:
        out, err = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:  # SIGTERM: gpuvs stores the trials it finished and stops its worker
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        code, err = 124, f"time limit {limit:g} s\n{err}"
    return time.monotonic() - t0, code, out[-3000:] + err[-2000:]


def trials(db: Path) -> list[dict]:
    """The finished trials in a store ([] when the run ended before it stored any)."""
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    if not con.execute("SELECT 1 FROM sqlite_master WHERE name='trials'").fetchone():
        return []
    con.row_factory = sqlite3.Row
    out = []
    for r in con.execute("SELECT * FROM trials WHERE status='ok' ORDER BY id"):
        summary = json.loads(r["summary"] or "{}").get("main", {})
        out.append({"arm": r["arm"], "trial": r["trial"], "wall": r["ended"] - r["started"],
                    "timed": summary.get("total_seconds", 0.0), "value": summary.get("value"),
                    "startup": json.loads(r["startup"] or "{}")})
    return out


def old_rule_stop(before_src: Path, rows: list[dict], first: int = 3, margin: float = 0.01) -> int | None:
    """The look (trials per arm) at which the old rule (no correction) would have stopped."""
    spec = importlib.util.spec_from_file_location("before_stats", before_src / "gpuvs" / "stats.py")
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    arms = sorted({r["arm"] for r in rows})
    n = first
    while True:
        a = [r["value"] for r in rows if r["arm"] == arms[0] and r["trial"] < n]
        b = [r["value"] for r in rows if r["arm"] == arms[1] and r["trial"] < n]
        if len(a) < n or len(b) < n:
            return None
        if old.compare_arms(a, b, margin=margin)["verdict"] != "inconclusive":
            return n
        n += 2


def main() -> int:
    before, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    def opt(name, default):
        return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default

    limit_before, limit_after = opt("--limit-before", 70.0), opt("--limit-after", 160.0)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    wall_b, code_b, text_b = gpuvs(before / "src", ["run", *PARAMS, "--trials", "3", "--store", str(out / "before.db")],
                                   limit_before)
    cmd = ["compare", *PARAMS, "--margin", "0.01", "--arm", "a:seed=1", "--arm", "b:seed=2", "--until-confident",
           "--order-seed", "7", "--store", str(out / "after.db")]
    wall_a, code_a, text_a = gpuvs(HERE / "src", cmd, limit_after)
    tb, ta = trials(out / "before.db"), trials(out / "after.db")
    (out / "logs.txt").write_text(f"before exit {code_b}\n{text_b}\n\nafter exit {code_a}\n{text_a}\n")

    def per_trial(rows):
        walls = [r["wall"] for r in rows]
        over = [r["wall"] - r["timed"] for r in rows]
        parts = {k: statistics.median(r["startup"][k] for r in rows if k in r["startup"])
                 for k in STARTUP if any(k in r["startup"] for r in rows)}
        return statistics.median(walls), statistics.median(over), parts, walls

    lines.append("| | trials | per-trial wall s (median) | per-trial overhead s (wall - timed steps, median) | "
                 + " | ".join(k.removesuffix("_s") for k in STARTUP) + " |")
    lines.append("| --- " * (4 + len(STARTUP)) + "|")
    res = {}
    for label, rows in (("before", tb), ("after", ta)):
        if not rows:
            lines.append(f"| {label} | 0 | - | - |" + " - |" * len(STARTUP))
            continue
        w, o, parts, walls = per_trial(rows)
        res[label] = (w, o)
        lines.append(f"| {label} | {len(rows)} | {w:.2f} | {o:.2f} | "
                     + " | ".join(f"{parts[k]:.2f}" if k in parts else "-" for k in STARTUP) + " |")
        lines.append(f"|   (every trial's wall s) | | {', '.join(f'{x:.1f}' for x in walls)} | | " + " |" * len(STARTUP))
    stop_old = old_rule_stop(before / "src", ta) if ta else None
    n_after = 1 + max((r["trial"] for r in ta), default=-1)
    lines.append("")
    ended = (f"no verdict by its {limit_after:g} s limit" if code_a == 124 else f"{wall_a:.1f} s to the verdict")
    lines.append(f"after: `gpuvs {' '.join(cmd)}`: exit {code_a}, {ended}, {n_after} trials per arm at most "
                 f"(new rule: alpha spending over the looks)")
    if stop_old:
        cost = (f"; at before's {res['before'][0]:.2f} s per trial that is {2 * stop_old * res['before'][0]:.1f} s "
                f"of trials (plus gpuvs's own start)" if "before" in res else "")
        lines.append(f"before: the old rule would have stopped these trials after {stop_old} per arm{cost}")
    elif ta:
        lines.append("before: the old rule did not stop at any look these trials allow (3, 5, ... per arm)")
    lines.append(f"before: `gpuvs run {' '.join(PARAMS)} --trials 3`: exit {code_b}, {wall_b:.1f} s")
    for t in ta:
        lines.append(f"- after trial {t['trial'] + 1} [{t['arm']}]: {t['value']:.1f} images/sec, wall {t['wall']:.2f} s")
    for t in tb:
        lines.append(f"- before trial {t['trial'] + 1}: {t['value']:.1f} images/sec, wall {t['wall']:.2f} s")
    text = "\n".join(lines)
    (out / "until_confident.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
