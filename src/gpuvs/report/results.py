"""gpuvs results' tables: the experiments in a store, and the trials of one."""

from __future__ import annotations

import time

from gpuvs.report.fit import Table

from gpuvs.report.numbers import Units, fmt, spread
from gpuvs.report.terminal import safe_cells
from gpuvs.safetext import safe_text
from gpuvs.store.records import ExperimentRecord, SeriesSummary, TrialRecord


def experiments_table(store, found: list[ExperimentRecord]) -> Table:
    t = Table(title=f"experiments in {store}", title_justify="left")
    # an id is what people copy into the next command: never cut, whatever the terminal's width
    t.add_column("id", no_wrap=True, min_width=max([len(e.id) for e in found] + [2]))
    for col in ("name", "kind", "workload", "trials ok", "created"):
        t.add_column(col, overflow="fold")
    for e in found:
        t.add_row(*safe_cells(e.id, e.name, e.kind, e.workload or "-"), f"{e.n_ok or 0}/{e.n_trials}",
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created)))
    return t


def spreads(main: SeriesSummary, k: float = 1.0) -> tuple[str, str]:
    """A trial's +/- and jitter (k: per declared unit, in the unit shown); numbers.NO_SPREAD for a single figure
    (a job's own last printed figure keeps the spread it printed)."""
    n = None if main.figure == "last printed" else main.n
    return tuple(spread(None if x is None else x * k, n) for x in (main.pm, main.jitter))


def trials_table(ident: str, trials: list[TrialRecord]) -> Table:
    """The trials `ident` named, titled with what they are: the experiment's whole id (not the prefix typed),
    or the one trial and its experiment."""
    experiments = sorted({t.experiment_id for t in trials})
    if len(trials) == 1 and ident == str(trials[0].id):
        title = f"trial {ident} of {trials[0].experiment_id}"
    else:
        title = f"trials of {', '.join(experiments) or ident}"
    table = Table(title=safe_text(title), title_justify="left")
    for col in ("trial id", "arm", "#", "status", "device", "env", "value", "+/-", "jitter", "unit",
                "first step s", "GPU", "error"):
        table.add_column(col)
    units = Units()  # one unit per series, chosen from the successful trials' figures, as the reports choose
    shown: dict[str, list[float | None]] = {}
    for t in trials:
        if t.summary and t.ok:
            shown.setdefault(next(iter(t.summary)), []).append(t.primary().value)
    for t in trials:
        main, series = t.primary() or SeriesSummary(), next(iter(t.summary), "")
        k, unit = units.of(series, main.unit, shown.get(series, []))
        value = None if main.value is None else main.value * k
        table.add_row(*safe_cells(t.id, t.arm, t.trial + 1, t.status, t.spec.device if t.spec else "-",
                                  t.spec.env.kind if t.spec else "-", fmt(value), *spreads(main, k), unit,
                                  fmt(t.startup.get("first_step_s"), 3),
                                  t.fingerprint.get("gpu_name") or "cpu", t.error or ""))
    return table
