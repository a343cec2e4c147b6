"""gpuvs results list | show | export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gpuvs.cli import results_app
from gpuvs.errors import UsageError
from gpuvs.records import TrialRecord
from gpuvs.report.numbers import fmt
from gpuvs.stats import SeriesSummary
from gpuvs.store import Store

STORE_OPT = typer.Option("gpuvs.db", "--store", help="SQLite file that keeps the results")


def open_store(path: str) -> Store:
    if not Path(path).exists():
        raise UsageError(f"no store at {path} (run something first, or pass --store PATH)")
    return Store(path)


@results_app.command("list")
def list_results(store: str = STORE_OPT) -> None:
    """One line per experiment: id, when, workload, trials ok of all."""
    with open_store(store) as st:
        import time

        found = st.experiments()
        t = Table(title=f"experiments in {store}", title_justify="left")
        # an id is what people copy into the next command: never cut, whatever the terminal's width
        t.add_column("id", no_wrap=True, min_width=max([len(e.id) for e in found] + [2]))
        for col in ("name", "kind", "workload", "trials ok", "created"):
            t.add_column(col, overflow="fold")
        for e in found:
            t.add_row(e.id, e.name, e.kind, e.workload or "-", f"{e.n_ok or 0}/{e.n_trials}",
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created)))
        Console(markup=False, highlight=False).print(t)


@results_app.command("show")
def show(ident: str = typer.Argument(..., help="an experiment id (a unique prefix will do) or a trial number"),
         store: str = STORE_OPT, as_json: bool = typer.Option(False, "--json")) -> None:
    """Every trial of an experiment (or one trial): status, figures, start-up, error, where it ran."""
    with open_store(store) as st:
        trials = _trials_of(st, ident)
        if as_json:
            for t in trials:
                t.samples = st.samples(t.id)
            print(json.dumps([t.to_dict() for t in trials], indent=2, default=str))
            return
        console = Console(markup=False, highlight=False)
        table = Table(title=f"trials of {ident}", title_justify="left")
        for col in ("trial id", "arm", "#", "status", "device", "env", "value", "+/-", "jitter", "unit",
                    "first step s", "GPU", "error"):
            table.add_column(col)
        for t in trials:
            main = t.primary() or SeriesSummary()
            table.add_row(str(t.id), t.arm, str(t.trial + 1), t.status, t.spec.device if t.spec else "-",
                          t.spec.env.kind if t.spec else "-", fmt(main.value), fmt(main.pm), fmt(main.jitter),
                          main.unit, fmt(t.startup.get("first_step_s"), 3), t.fingerprint.get("gpu_name") or "cpu",
                          (t.error or "")[:120])
        console.print(table)


def _trials_of(st: Store, ident: str) -> list[TrialRecord]:
    """A trial number, else an experiment id or a unique prefix of one (ids start with digits too)."""
    if ident.isdigit():
        try:
            return [st.trial(int(ident))]
        except UsageError:
            pass
    return st.trials(st.experiment(ident).id)


@results_app.command("export")
def export(fmt_name: str = typer.Option("json", "--format", help="json or csv"),
           experiment: str = typer.Option(None, "--experiment", help="only this experiment"),
           output: str = typer.Option(None, "-o", "--output", help="write here instead of standard output"),
           store: str = STORE_OPT) -> None:
    """Everything stored (spec, fingerprint, samples, summary, status, error) as JSON, or a CSV per trial."""
    with open_store(store) as st:
        exp_id = st.experiment(experiment).id if experiment else None
        text = st.export(fmt_name, exp_id)
    if output:
        Path(output).write_text(text)
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
