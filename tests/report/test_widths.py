"""Nothing gpuvs prints is cut, at any width: no '…', what rich ends a cut cell with.

Every stored-results command of the golden store, and the help of every command and workload.
Each is rendered at 60 and 80 columns, as a pipe or a CI log has, and at 200; a table that cannot fit stacks."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import golden
from conftest import SRC, gpuvs_env

from gpuvs import workloads
from gpuvs.cli import commands
from gpuvs.report.fit import Table


def helps() -> list[list[str]]:
    out = [["--help"]]
    for cmd in commands.all_commands():
        out.append([cmd.name, "--help"])
        out += [[cmd.name, sub.name, "--help"] for sub in cmd.subcommands]
    out += [["run", name, "--help"] for name in workloads.names()]
    return out


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_no_stored_result_is_cut(tmp_path, columns):
    out = tmp_path / "outputs"
    r = subprocess.run([sys.executable, str(golden.HERE / "golden.py"), "render", str(golden.STORE), str(out),
                        str(columns)], capture_output=True, text=True, timeout=600, env=gpuvs_env(PYTHONPATH=str(SRC)))
    assert r.returncode == 0, r.stderr[-3000:]
    files = sorted(out.iterdir())
    assert len(files) > 100
    cut = [f"{p.name}: {line}" for p in files for line in p.read_text().splitlines() if "…" in line]
    assert not cut, "\n".join(cut[:20])
    # what the terminal shows fits the page (stdout; an error is one line on stderr, however long)
    for p in files:
        if p.suffix in (".html", ".json", ".csv", ".md", ".show-json"):
            continue
        stdout = p.read_text().split("[stdout]\n", 1)[1].rsplit("\n[stderr]\n", 1)[0]
        wide = [line for line in stdout.splitlines() if len(line) > columns]
        assert not wide, (p.name, wide[:3])


@pytest.mark.parametrize("columns", [60, 80])
def test_no_help_is_cut(columns):
    env = gpuvs_env(PYTHONPATH=str(SRC), COLUMNS=str(columns))
    script = ("import sys\nfrom gpuvs.cli import main\n"
              "for argv in " + repr(helps()) + ":\n"
              "    print('$', *argv)\n"
              "    try:\n        main(argv)\n    except SystemExit:\n        pass\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("$ ") >= len(helps()) and "NAME:key=value[,key=value...]" in r.stdout
    cut = [line for line in r.stdout.splitlines() if "…" in line]
    assert not cut, "\n".join(cut[:20])
    wide = [line for line in r.stdout.splitlines() if len(line) > columns and not line.startswith("$ ")]
    assert not wide, wide[:5]


def test_a_table_too_wide_for_the_page_stacks_a_record_per_row():
    t = Table(title="Verdict")
    for col in ("metric", "arm", "verdict", "tested as"):
        t.add_column(col, no_wrap=True)
    t.add_row("images/sec", "container", "24.6% slower than the host", "headline; paired, 3 rounds")
    console = Console(width=40, file=io.StringIO(), record=True)
    console.print(t)
    text = console.export_text()
    assert "verdict: 24.6% slower than the host" in text and "tested as: headline; paired, 3 rounds" in text
    assert "…" not in text
    wide = Console(width=200, file=io.StringIO(), record=True)
    wide.print(t)
    assert "┃ metric" in wide.export_text()  # a table where it fits


# The width sweep (issue 45): every table gpuvs prints, made in this process from the golden store's real
# results (the stored NVML readings, stored fleet runs), at every width from 40 to 200. Each atom of each cell (a word, a
# number, an interval: fit.atoms) must appear whole on one line of what is printed.

BOX = {chr(c) for c in range(0x2500, 0x2580)}


def _store_tables(tmp: Path) -> list[tuple[str, object]]:
    import shutil

    from gpuvs.analysis import comparison
    from gpuvs.fleet.result import FleetResult
    from gpuvs.report import fleet as fleet_report
    from gpuvs.report import machine, results, tables, terminal, validation
    from gpuvs.validate import validate_run
    from gpuvs.store.db import Store

    path = tmp / "golden.db"
    shutil.copy(golden.STORE, path)
    out: list[tuple[str, object]] = []
    with Store(str(path)) as st:
        found = st.experiments()
        out.append(("results list", results.experiments_table(str(path), found)))
        for e in found:
            trials = st.trials(e.id, with_samples=False, with_telemetry=True)
            out.append((f"results-show {e.name}", results.trials_table(e.id, trials)))
            if trials and trials[0].fingerprint.get("gpus") is not None:  # gpuvs info's table, as a worker saw it
                out.append((f"info {e.name}", machine.fingerprint_table(trials[0].fingerprint)))
            if e.kind == validate_run.KIND:
                out.append((f"report {e.name}", terminal.rich_table(validation.table(e))))
                continue
            if e.meta.fleet:
                res = FleetResult.from_dict(e.meta.fleet)
                out += [(f"report {e.name} {t.key}", terminal.rich_table(t)) for t in fleet_report.tables(res)]
                continue
            ran = {"arms": terminal.arm_table(trials), "startup": terminal.startup_table(trials),
                   "metrics": terminal.metrics_table(trials), "series": terminal.series_table(trials)}
            out += [(f"run {e.name} {k}", t) for k, t in ran.items() if t is not None]
            a = comparison.from_store(st, e.id, with_steps=False)
            out += [(f"report {e.name} {t.key}", terminal.rich_table(t)) for t in tables.all_tables(a)]
    return out


def _other_tables() -> list[tuple[str, object]]:
    import json

    from gpuvs.store.records import TelemetryRecord
    from gpuvs.report import terminal, workload_list
    from gpuvs.trial.runner import TrialResult
    from gpuvs.spec import RunSpec

    readings = [json.loads(line) for line in (golden.HERE / "data" / "telemetry_h100_gemm.jsonl").open()]
    results = [TrialResult(spec=RunSpec(workload="gemm", device="cuda", arm=arm), status="ok",
                           telemetry=[TelemetryRecord.from_event(e) for e in tel])
               for arm, tel in (("a", readings), ("b", readings[:2]))]
    import tempfile

    from fleet_store import sliding_fleet
    from gpuvs.cli import help as cli_help
    from gpuvs.fleet.assess import stored_history as stored
    from gpuvs.report import history as report_history
    from gpuvs.store.db import Store

    compare = next(c for c in commands.all_commands() if c.name == "compare")
    history = []  # gpuvs fleet history: each node against its own past, from stored fleet runs (fleet_store.py)
    with tempfile.TemporaryDirectory(prefix="gpuvs-widths-") as work:
        sliding_fleet(Path(work) / "fleet.db", runs=6, slide_from=3, slide=0.03, failed_last="node-5")
        with Store(str(Path(work) / "fleet.db")) as st:
            h = stored.read(st)
    for w, nodes in report_history.filtered(h, None):
        history.append(("history nodes", terminal.rich_table(report_history.nodes_table(w), no_wrap={0}, fold=True)))
        history += [("history runs", terminal.rich_table(report_history.runs_table(w, n), no_wrap={0}, fold=True))
                    for n in nodes]
    return [("telemetry", terminal.telemetry_table(results)),
            ("workloads", workload_list.workloads_table(workloads.all_workloads())),
            ("help commands", cli_help.commands_table(commands.all_commands())),
            ("help cnn-train", cli_help.param_table(workloads.get("cnn-train")))] + \
        [(f"help compare {g.key}", cli_help.options_table(g.title, g.params)) for g in compare.groups] + history


def _lines(text: str) -> str:
    """The printed lines, box-drawing characters as spaces and runs of spaces as one, each line padded by a
    space: ' ATOM ' is in it exactly when ATOM is whole on one line."""
    return "\n".join(" " + " ".join("".join(" " if ch in BOX else ch for ch in line).split()) + " "
                     for line in text.splitlines())


def _texts(t) -> list[str]:
    out = [str(t.title or ""), str(t.caption or "")]
    for c in t.columns:
        out += ([str(c.header)] if t.show_header else []) + [str(x) for x in c.cells]
    return out


def _widths(t) -> list[int]:
    """The widths from 40 to 200 at which `t` may print differently: each one from its narrowest table layout to
    its widest (wider ones print the widest again), and below that, stacked, up to its longest record line
    (wider ones print the same lines)."""
    from rich.measure import Measurement

    wide = Console(width=1000, file=io.StringIO())
    m = Measurement.get(wide, wide.options, t)
    longest = max(len(x) for x in [str(t.title or ""), str(t.caption or "")] +
                  [f"{c.header}: {x}" for c in t.columns for x in c.cells])
    out = {w for w in range(40, 201) if m.minimum <= w <= m.maximum or (w < m.minimum and w <= longest)}
    return sorted(out | {min(200, m.maximum), max(40, min(200, m.minimum - 1, longest))})


@pytest.fixture(scope="module")
def every_table(tmp_path_factory):
    """Each table renderer's tables: of each kind (the command and table), the two with the most atoms."""
    from gpuvs.report.fit import atoms

    kinds: dict[tuple[str, str], list] = {}
    for name, t in _store_tables(tmp_path_factory.mktemp("widths")) + _other_tables():
        assert t is not None, name
        kind = (name.split(" ")[0], name.split(" ")[-1] if name.startswith(("report", "help", "run ")) else "")
        kinds.setdefault(kind, []).append((len({a for text in _texts(t) for a in atoms(text)}), name, t))
    found = [(name, t) for group in kinds.values() for _, name, t in sorted(group, key=lambda x: -x[0])[:2]]
    assert len(found) > 30
    return found


def test_no_number_interval_or_word_is_split_at_any_width(every_table):
    from gpuvs.report.fit import atoms

    broken = []
    for name, t in every_table:
        want = sorted({a for text in _texts(t) for a in atoms(text)}, key=len, reverse=True)
        for width in _widths(t):
            console = Console(width=width, file=io.StringIO(), markup=False, highlight=False, emoji=False)
            console.print(t)
            shown = _lines(console.file.getvalue())
            # a header's word stacked reads 'header: value'
            broken += [f"{width} cols, {name}: {a!r}" for a in want
                       if len(a) <= width and f" {a} " not in shown and f" {a}: " not in shown]
    assert not broken, "\n".join(broken[:30])


def test_a_table_too_wide_spreads_its_columns_over_tables_that_each_name_the_row(every_table):
    """results list at 80 columns stacked 7 lines per experiment; now two tables, each led by the id."""
    t = dict(every_table)["results list"]
    console = Console(width=80, file=io.StringIO(), markup=False, highlight=False)
    console.print(t)
    text = console.file.getvalue()
    heads = [line for line in text.splitlines() if line.startswith("┃ id ")]
    assert len(heads) == 2 and "name" in heads[0] and "created" in heads[1], text
    ids = [str(c) for c in t.columns[0].cells]
    assert all(text.count(f"│ {i} │") == 2 for i in ids) and "id: " not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert text.count("experiments in ") == 1  # the title once, over both


def test_an_interval_written_with_spaces_stays_on_one_line():
    """sharing's 'mean [low, high]' and a negative range 'a to b' wrap before or after, never inside."""
    from gpuvs.report import sharing
    from gpuvs.report.fit import atoms
    from gpuvs.sharing import share_stats as sharestats

    fig = sharing.figure_text(sharestats.figure([4705.2, 3920.1, 4100.0]))
    assert atoms(fig)[1:] == [fig.split(" ", 1)[1]]  # '[3,...,  5,...]' is one atom
    t = Table(title="sharing")
    t.add_column("what")
    t.add_column("aggregate")
    t.add_row("two workers on one GPU, one repeat each", fig + " and -1.25 to 3.50 apart")
    for width in range(24, 80):
        console = Console(width=width, file=io.StringIO(), markup=False, highlight=False)
        console.print(t)
        shown = _lines(console.file.getvalue())
        assert f" {atoms(fig)[1]} " in shown and " -1.25 to 3.50 " in shown, (width, console.file.getvalue())
