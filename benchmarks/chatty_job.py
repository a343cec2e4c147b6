"""A job printing LINES short lines, one write each (issue 44), timed to /dev/null, through `| cat` and by gpuvs.

Usage: python benchmarks/chatty_job.py [LINES] [REPEATS].
Under `gpuvs run command` it runs wrapped and bare, REPEATS times each; it prints medians and their ratios to cat."""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = "import os, sys\nfor i in range(int(sys.argv[1])):\n    os.write(1, b'value: %d\\n' % i)\n"
SRC = Path(__file__).resolve().parent.parent / "src"


def pipeline(argv: list[str], through_cat: bool) -> float:
    t0 = time.perf_counter()
    if through_cat:
        job = subprocess.Popen(argv, stdout=subprocess.PIPE)
        cat = subprocess.Popen(["cat"], stdin=job.stdout, stdout=subprocess.DEVNULL)
        job.stdout.close()
        job.wait()
        cat.wait()
    else:
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def under_gpuvs(argv: list[str], folder: Path, bare: bool) -> float:
    store = folder / "chatty.db"
    for p in folder.glob("chatty.db*"):
        p.unlink()
    env = dict(os.environ, PYTHONPATH=str(SRC))
    subprocess.run([sys.executable, "-m", "gpuvs", "run", "command", "--device", "cpu", "--trials", "1", "--store",
                    str(store), "--quiet", *(["--bare"] if bare else []), "--", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status, summary = sqlite3.connect(store).execute("SELECT status, summary FROM trials").fetchone()
    assert status == "ok", status
    return json.loads(summary)["wall_time_s"]["value"]


def main() -> None:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "job.py").write_text(JOB)
        argv = [sys.executable, str(folder / "job.py"), str(lines)]
        ways = {"> /dev/null": lambda: pipeline(argv, False), "| cat": lambda: pipeline(argv, True),
                "gpuvs run command (wrapped)": lambda: under_gpuvs(argv, folder, False),
                "gpuvs run command --bare": lambda: under_gpuvs(argv, folder, True)}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(repeats):  # interleaved, so that a change in the machine's load falls on every way alike
            for name, way in ways.items():
                times[name].append(way())
    cat = statistics.median(times["| cat"])
    print(f"{lines:,} lines, {repeats} repeats each; wall time in seconds")
    print("| way | median | min | max | ratio to `| cat` |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        print(f"| `{name}` | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} | "
              f"{statistics.median(ts) / cat:.2f} |")


if __name__ == "__main__":
    main()
