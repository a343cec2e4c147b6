"""GPU check of issue 45 item 3: an A/A `gpuvs compare cnn-train` on a GPU a co-tenant joins from round two.

    OUT=DIR [TRIALS=6] [BUSY=0.3] [GPU=0] [ARGS="--steps 50"] PYTHONPATH=src python benchmarks/contention_gpu.py
It prints what gpuvs showed of the contention and each trial's figure, and writes $OUT/contention_gpu.md.
DEVICE=cpu runs spin beside a CPU co-tenant: a check of the script, not a measurement."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def finished(store: Path) -> int:
    """Trials of the store that have ended (0 while it does not exist yet)."""
    if not store.exists():
        return 0
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT COUNT(*) FROM trials WHERE status != 'running'").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:  # the tables are not there yet
        return 0


def main() -> int:
    out = Path(os.environ.get("OUT") or "contention_gpu")
    out.mkdir(parents=True, exist_ok=True)
    device = os.environ.get("DEVICE", "cuda")
    trials, busy, gpu = int(os.environ.get("TRIALS", "6")), os.environ.get("BUSY", "0.3"), os.environ.get("GPU", "0")
    store = out / "contention_gpu.db"
    if store.exists():
        store.unlink()
    env = dict(os.environ, PYTHONPATH=str(HERE / "src"), CUDA_VISIBLE_DEVICES=gpu, COLUMNS="160")
    workload = ["cnn-train"] if device == "cuda" else ["spin", "--steps", "20"]
    cmd = [sys.executable, "-m", "gpuvs", "compare", *workload, "--aa", "--trials", str(trials), "--device", device,
           "--store", str(store), "--quiet", *shlex.split(os.environ.get("ARGS", ""))]
    print("$", shlex.join(cmd), flush=True)
    t0 = time.monotonic()
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    cotenant = None
    try:
        while job.poll() is None and finished(store) < 2:  # the first round (one trial per arm) runs alone
            time.sleep(0.2)
        if job.poll() is None:
            cotenant = subprocess.Popen([sys.executable, str(HERE / "benchmarks" / "gpu_cotenant.py"), "--busy", busy,
                                         "--seconds", "1800", "--device", device, "--size", "8192" if device ==
                                         "cuda" else "512"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env=env)
            print(f"co-tenant pid {cotenant.pid} started after {time.monotonic() - t0:.1f} s (--busy {busy})",
                  flush=True)
        shown, _ = job.communicate()
    finally:
        if cotenant is not None:
            cotenant.send_signal(signal.SIGTERM)
            tail = cotenant.communicate(timeout=60)[0]
            print("co-tenant:", " | ".join(tail.strip().splitlines()[-3:]), flush=True)
    print(f"--- what gpuvs showed (exit status {job.returncode}, {time.monotonic() - t0:.0f} s) ---")
    print(shown)
    exp = next((line.split()[3] for line in shown.splitlines() if line.startswith("stored as experiment")), None)
    md = subprocess.run([sys.executable, "-m", "gpuvs", "report", exp, "--store", str(store), "--format", "markdown"],
                        capture_output=True, text=True, env=env).stdout if exp else ""
    db = sqlite3.connect(store)
    rows = db.execute("SELECT arm, trial, summary, contention FROM trials ORDER BY id").fetchall()
    lines = ["| arm | trial | figure | other GPU processes | load | CPU pressure |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    for arm, trial, summary, cont in rows:
        head = next(iter(json.loads(summary or "{}").values()), {})
        c = json.loads(cont or "null") or {}
        procs = ", ".join(f"pid {p['pid']} ({p.get('name')})" for p in c.get("gpu_processes") or []) or "none"
        pressure = "-" if c.get("cpu_pressure") is None else f"{100 * c['cpu_pressure']:.0f}%"
        lines.append(f"| {arm} | {trial + 1} | {head.get('value', 0):,.1f} {head.get('unit', '')} | {procs} | "
                     f"{c.get('load_end', '-')} | {pressure} |")
    table = "\n".join(lines)
    print(table)
    (out / "contention_gpu.md").write_text(f"# contention_gpu ({device}, co-tenant --busy {busy} from round 2)\n\n"
                                           f"```\n{shown}\n```\n\n{table}\n\n{md}")
    print(f"wrote {out / 'contention_gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
