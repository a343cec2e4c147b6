"""gpuvs report EXPERIMENT [--format term|md|html|json|csv] [-o FILE] [--store PATH]; gpuvs report status
[-o FILE] [--store PATH]: the status page (report/status.py)."""

from __future__ import annotations

import io
import json
import sys

from rich.console import Console

from gpuvs.analysis import comparison
from gpuvs.cli.declaration import Args, Command, Group, Positional
from gpuvs.cli.common import check_output, open_store, write_output
from gpuvs.cli.options import STORE
from gpuvs.errors import UsageError
from gpuvs.store.records import TrialRecord
from gpuvs.params import Param
from gpuvs.report import html, markdown, terminal, validation
from gpuvs.store.db import trials_csv
from gpuvs.validate import validate_run

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
    """An experiment id from an experiment id, prefix or name, or a trial's run id."""
    try:
        return st.experiment(ident).id
    except UsageError:
        runs = {t.experiment_id for t in st.trials() if t.run_id == ident}
        if len(runs) == 1:
            return runs.pop()
        raise


def report(args: Args) -> None:
    ident, fmt_name, output, store = args.positionals[0], args["format"], args["output"], args["store"]
    fmt = FORMATS.get(fmt_name.lower())
    if fmt is None:
        raise UsageError(f"--format: {fmt_name!r} is not allowed; expected one of term, md, html, json, csv")
    check_output(output)
    with open_store(store) as st:
        exp_id = experiment_of(st, ident)
        exp = st.experiment(exp_id)
        page = {} if output or fmt != "term" else {"width": Console().width}  # on the terminal: its width
        if exp.kind == validate_run.KIND:
            return _write(validation.render(fmt, exp, **page), output, exp_id)
        if exp.meta.pair_fleet:  # a gpuvs fleet --pairs run: its node and pair verdicts
            from gpuvs.fleet.execute.pair_run import PairFleetResult
            from gpuvs.report import pair_fleet

            if fmt_name.lower() == "csv":
                raise UsageError("--format csv: a pair fleet run is reported as term, md, html or json")
            return _write(pair_fleet.render(fmt_name.lower(), PairFleetResult.from_dict(exp.meta.pair_fleet),
                                            **({"width": page["width"]} if page else {})), output, exp_id)
        if exp.meta.fleet:  # a gpuvs fleet run: its own report (one row per node)
            from gpuvs.fleet.result import FleetResult
            from gpuvs.report import fleet as fleet_report

            return _write(fleet_report.render(fmt, FleetResult.from_dict(exp.meta.fleet), **page), output, exp_id)
        analysis = comparison.from_store(st, exp_id, with_steps=fmt == "html")
        trials = st.trials(exp_id) if fmt == "csv" else []
    if fmt == "term" and not output:
        terminal.comparison(Console(markup=False, highlight=False), analysis)
        print(f"experiment {exp_id}", file=sys.stderr)
        return
    _write(render(fmt, analysis, trials), output, exp_id)


def _write(text: str, output: str | None, exp_id: str) -> None:
    if output:
        write_output(output, text)
        print(f"experiment {exp_id}: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def status(args: Args) -> None:
    """The status page of everything the store holds (fleet histories, validate runs)."""
    from gpuvs.report.status import render_status_page

    output = args["output"]
    check_output(output)
    with open_store(args["store"]) as st:
        page = render_status_page(st, window=args["window"], margin=args["margin"], confidence=args["confidence"])
    if output:
        write_output(output, page)
        print(f"status page of {args['store']}: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(page)


STATUS = Command(
    "status", "One self-contained HTML page: slow and drifting nodes first, the fleet's latest verdicts, the latest "
    "validate results, each node's speed over time with its intervals and change points.", status,
    groups=(Group("status options", (Param("output", str, None, "write the page here instead of standard output",
                                           aliases=("o",)),
                                     Param("window", int, 10, "earlier runs a node's latest run is compared with",
                                           min=3, max=1000),
                                     Param("margin", float, 0.05, "equivalence margin of a node against its own past",
                                           min=0.0, max=0.5),
                                     Param("confidence", float, 0.95, "1 - the false-alarm rate for the whole fleet, "
                                           "per check", min=0.5, max=0.999), STORE), "status"),),
    notes="Reads the store; runs nothing. The in-cluster agent serves the same page. See docs/history.md.",
)

COMMAND = Command(
    "report", "A stored experiment's report: verdicts, derived tables, per-trial figures, fingerprints (and charts, "
    "in html).", report,
    groups=(Group("report options", (Param("format", str, "term", "term, md, html, json or csv"),
                                     Param("output", str, None, "write here instead of standard output",
                                           aliases=("o",)), STORE), "report"),),
    positionals=(Positional("ident", "an experiment id (a unique prefix will do), its --name or a trial's run id"),),
    subcommands=(STATUS,),
)
