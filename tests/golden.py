"""Golden outputs of every command that renders stored results, on the committed store tests/data/golden/golden.db.

`python tests/golden.py render STORE OUT` runs every command on a copy of STORE, one file each in OUT.
Each runs in this process through gpuvs.cli.main, output captured as bytes: an interpreter each would take minutes.
What would differ between machines is fixed, never masked (ENV, STORE_NAME, PYTHONHASHSEED): every byte is compared."""

from __future__ import annotations

import io
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "golden"
STORE = GOLDEN / "golden.db"
OUTPUTS = GOLDEN / "outputs"
STORE_NAME = "golden.db"  # in the working folder: `results export --format json` prints the store's path
# fixed, not masked: rich lays tables out to COLUMNS, and reports print the stored creation times in local time (TZ)
ENV = {"COLUMNS": "160", "TZ": "UTC", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
REPORT_FORMATS = ("term", "md", "html", "json", "csv")


def experiments(store: Path) -> dict[str, str]:
    """{name: id} of the store's experiments (every one made by make_golden.py has its own name)."""
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return {name: ident for ident, name in db.execute("SELECT id, name FROM experiments ORDER BY created")}
    finally:
        db.close()


def _first(store: Path, sql: str, *args) -> str:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return str(db.execute(sql, args).fetchone()[0])
    finally:
        db.close()


def commands(store: Path) -> list[tuple[str, list[str]]]:
    """(file name, argv) of every command whose output is kept: for each experiment, results show (and
    --json), results export (json, csv), report in every format; the whole store's list and exports; a
    trial by number, a report by a trial's run id, an ambiguous id prefix; stored-vs-stored comparisons."""
    ids = experiments(store)
    # the whole store: its list and its CSV (its JSON is every experiment's below, in one file)
    out: list[tuple[str, list[str]]] = [("results-list", ["results", "list"]),
                                        ("results-export-all.csv", ["results", "export", "--format", "csv"])]
    for name, ident in ids.items():
        slug = name.removeprefix("golden-")
        out += [(f"{slug}.show", ["results", "show", ident]),
                (f"{slug}.show-json", ["results", "show", ident, "--json"]),
                (f"{slug}.export.json", ["results", "export", "--format", "json", "--experiment", ident]),
                (f"{slug}.export.csv", ["results", "export", "--format", "csv", "--experiment", ident])]
        out += [(f"{slug}.report.{fmt}", ["report", ident, "--format", fmt]) for fmt in REPORT_FORMATS]
    run_spin = ids["golden-run-spin"]
    out += [
        ("trial-by-number.show", ["results", "show",
                                  _first(store, "SELECT MIN(id) FROM trials WHERE experiment_id=?", run_spin)]),
        ("report-by-run-id", ["report", _first(store, "SELECT run_id FROM trials WHERE experiment_id=? ORDER BY id",
                                               run_spin)]),
        ("ambiguous-prefix.show", ["results", "show", run_spin[:4]]),
        ("unknown-experiment.report", ["report", "no-such-experiment"]),
    ]
    two, until, failing = ids["golden-compare-2arms"], ids["golden-compare-until"], ids["golden-compare-failing-arm"]
    stored = [
        ("stored-run-vs-run", [run_spin, ids["golden-run-spin-b"]]),
        ("stored-arm-vs-arm", [f"{two}:fast", f"{two}:slow"]),
        ("stored-across-experiments", [f"{until}:a", f"{two}:fast"]),
        ("stored-arm-without-success", [f"{failing}:ok", f"{failing}:broken"]),
        ("stored-needs-an-arm", [two, run_spin]),
        ("stored-other-workloads", [run_spin, f"{two}:fast"]),
    ]
    if "golden-fleet" in ids:
        fleet = ids["golden-fleet"]
        nodes = _first(store, "SELECT GROUP_CONCAT(arm, ' ') FROM (SELECT DISTINCT arm FROM trials "
                              "WHERE experiment_id=? ORDER BY arm)", fleet).split()
        stored.append(("stored-fleet-node-vs-node", [f"{fleet}:{nodes[0]}", f"{fleet}:{nodes[1]}"]))
    out += [(name, ["compare", "--stored", *refs]) for name, refs in stored]
    out.append(("stored-margin-confidence", ["compare", "--stored", f"{two}:fast", f"{two}:slow", "--margin", "0.1",
                                             "--confidence", "0.9"]))
    return [(name, argv + ["--store", STORE_NAME]) for name, argv in out]


def _capture(argv: list[str]) -> tuple[int, bytes, bytes]:
    """gpuvs ARGV in this process: (exit status, standard output, standard error)."""
    from gpuvs.cli import main

    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2)]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout, sys.stderr = saved
    return code, streams[0].buffer.getvalue(), streams[1].buffer.getvalue()


def render(store: Path, out: Path, columns: int = 160) -> list[str]:
    """Every command on a copy of `store` (opening a store may write to it), one file each in `out`; at
    `columns` (the golden outputs: 160; tests/report/test_widths.py renders them at 60 and 80 too)."""
    os.environ.update(ENV, COLUMNS=str(columns))
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        os.environ.pop(name, None)
    time.tzset()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="gpuvs-golden-") as work:
        shutil.copy(store, Path(work) / STORE_NAME)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            for name, argv in commands(Path(work) / STORE_NAME):
                code, stdout, stderr = _capture(argv)
                text = (f"$ gpuvs {' '.join(argv)}\n[exit status {code}]\n[stdout]\n".encode() + stdout
                        + b"\n[stderr]\n" + stderr)
                (out / name).write_bytes(text)
                written.append(name)
        finally:
            os.chdir(cwd)
    return written


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] != "render":
        sys.exit("usage: python tests/golden.py render STORE OUT [COLUMNS]")
    # `compare --stored` names two different workloads in the order of a set: string hashing is fixed too, and
    # only at the interpreter's start, so start again with it
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    names = render(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), *map(int, sys.argv[4:]))
    print(f"{len(names)} outputs in {sys.argv[3]}")
