"""Peak memory of gpuvs's worker while it reads a command's output of SIZE_MB megabytes (target: under 100 MB).

    .venv/bin/python benchmarks/command_output_rss.py [SIZE_MB]     (default 200; a temporary store)
The figure is the worker's VmHWM, read every 50 ms; a --metric is searched in every line.
It also checks the trial is ok, with the true final figure and every line counted."""

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = """import sys
line = ("x" * 80 + " progress {:012d}\\n")
w = sys.stdout.write
n = int(sys.argv[1])
for i in range(n):
    w(line.format(i))
w(f"final rate {n}\\n")
"""


def peak_kib(pid: int) -> int:
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmHWM:"):
                return int(row.split()[1])
    except OSError:
        pass
    return 0


def workers() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"gpuvs.trial.worker" in argv:
                out.append(int(entry.name))
    return out


def main() -> int:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    lines = size_mb * 1_000_000 // 100
    gpuvs = str(Path(sys.executable).with_name("gpuvs"))
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "writer.py").write_text(WRITER)
        argv = [gpuvs, "run", "command", "--device", "cpu", "--trials", "1", "--store", f"{folder}/gpuvs.db",
                "--metric", "rate=final rate ([0-9]+),higher", "--", sys.executable, "writer.py", str(lines)]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peaks: dict[int, int] = {}
        while proc.poll() is None:
            for pid in workers():
                peaks[pid] = max(peaks.get(pid, 0), peak_kib(pid))
            time.sleep(0.05)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            print(proc.stderr.read(), file=sys.stderr)
            return 1
        db = sqlite3.connect(f"{folder}/gpuvs.db")
        status, summary = db.execute("SELECT status, summary FROM trials").fetchone()
        nbytes, nlines = db.execute("SELECT bytes, lines FROM outputs WHERE stream = 'stdout'").fetchone()
        rate = json.loads(summary)["rate"]["value"]
    peak = max(peaks.values(), default=0) / 1024
    print(f"output: {nbytes / 1e6:.1f} MB in {nlines} lines (expected {lines + 1}); trial {status}, rate {rate:g} "
          f"(expected {lines}); gpuvs run took {wall:.1f} s")
    print(f"worker peak RSS: {peak:.1f} MiB (target: under 100 MiB)")
    ok = status == "ok" and rate == lines and nlines == lines + 1 and 0 < peak < 100
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
