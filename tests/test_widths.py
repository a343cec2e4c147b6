"""Nothing gpuvs prints is cut, at any width: every stored-results command of the golden store (results list,
show, export; report in every format; compare --stored) and the help of every command and workload, rendered
at 60 and 80 columns (COLUMNS, as a pipe or a CI log has) and at 200, hold no '…' (what rich ends a cut cell
with; gpuvs writes ranges with '–' or 'to'); a table that cannot fit stacks, a record per row."""

from __future__ import annotations

import io
import os
import subprocess
import sys

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
