"""gpuvs report EXPERIMENT [--format term|md|html|json|csv] [-o FILE] [--store PATH]."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from gpuvs import comparison
from gpuvs.cli import app
from gpuvs.cli.results import STORE_OPT, open_store
from gpuvs.errors import UsageError
from gpuvs.records import TrialRecord
from gpuvs.report import html, markdown, terminal, validation
from gpuvs.store import trials_csv

FORMATS = {"term": "term", "terminal": "term", "md": "md", "markdown": "md", "html": "html", "json": "json",
           "csv": "csv"}


def render(fmt: str, analysis: comparison.Analysis, trials: list[TrialRecord], width: int = 140) -> str:
    if fmt == "md":
        return markdown.render(analysis)
    if fmt == "html":
        return html.render(analysis)
    if fmt == "json":
        return json.dumps(analysis.to_dict(), indent=2, default=str) + "\n"
    if fmt == "csv":
        return trials_csv(trials)
    console = Console(record=True, width=width, markup=False, highlight=False, file=io.StringIO())
    terminal.comparison(console, analysis)
    return console.export_text()


def experiment_of(st, ident: str) -> str:
    """An experiment id from an experiment id or prefix, or a trial's run id."""
    try:
        return st.experiment(ident).id
    except UsageError:
        runs = {t.experiment_id for t in st.trials() if t.run_id == ident}
        if len(runs) == 1:
            return runs.pop()
        raise


@app.command()
def report(ident: str = typer.Argument(..., help="an experiment id (a unique prefix will do) or a trial's run id"),
           fmt_name: str = typer.Option("term", "--format", help="term, md, html, json or csv"),
           output: str = typer.Option(None, "-o", "--output", help="write here instead of standard output"),
           store: str = STORE_OPT) -> None:
    """A stored experiment's report: verdicts, derived tables, per-trial figures, fingerprints (and
    charts, in html)."""
    fmt = FORMATS.get(fmt_name.lower())
    if fmt is None:
        raise UsageError(f"--format: {fmt_name!r} is not allowed; expected one of term, md, html, json, csv")
    if output and not Path(output).resolve().parent.is_dir():
        raise UsageError(f"-o {output}: folder {Path(output).parent} does not exist")
    with open_store(store) as st:
        exp_id = experiment_of(st, ident)
        exp = st.experiment(exp_id)
        if exp.kind == validation.KIND:
            return _write(validation.render(fmt, exp), output, exp_id)
        if exp.meta.fleet:  # a gpuvs fleet run: its own report (one row per node)
            from gpuvs.fleet.result import FleetResult
            from gpuvs.report import fleet as fleet_report

            return _write(fleet_report.render(fmt, FleetResult.from_dict(exp.meta.fleet)), output, exp_id)
        analysis = comparison.from_store(st, exp_id, with_steps=fmt == "html")
        trials = st.trials(exp_id) if fmt == "csv" else []
    if fmt == "term" and not output:
        terminal.comparison(Console(markup=False, highlight=False), analysis)
        print(f"experiment {exp_id}", file=sys.stderr)
        return
    _write(render(fmt, analysis, trials), output, exp_id)


def _write(text: str, output: str | None, exp_id: str) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
        print(f"experiment {exp_id}: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
