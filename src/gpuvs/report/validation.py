"""The report of a `gpuvs validate` run: a verdict line, where it ran, and one row per check.

In terminal text, markdown, self-contained HTML, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

from gpuvs.store.records import ExperimentRecord
from gpuvs.report import markdown, tables
from gpuvs.report.numbers import fmt
from gpuvs.safetext import safe_row, safe_text
from gpuvs.validate.suite import FAIL, FIGURES, NOT_RUN, PASS, SHARED, Row, Settings

MARKS = {PASS: "ok  ", FAIL: "FAIL", NOT_RUN: "--  ", SHARED: "SHRD"}


def row_line(row: Row) -> str:
    """One check's row as the run goes (gpuvs validate's progress on stderr)."""
    return f"  {MARKS.get(row.status, row.status)} {row.suite}: {row.check}: {safe_text(row.detail)}"


def rows_of(exp: ExperimentRecord) -> list[Row]:
    return [Row.from_dict(r) for r in exp.meta.checks or []]


def settings_of(exp: ExperimentRecord) -> Settings:
    """The run's settings as stored (gpuvs validate writes them all; one missing keeps Settings' default)."""
    stored = dict(exp.meta.settings or {})
    return Settings(**{"image": None, **{k: v for k, v in stored.items() if k in Settings.__dataclass_fields__}})


def verdict(exp: ExperimentRecord) -> str:
    rows = rows_of(exp)
    n = {s: sum(r.status == s for r in rows) for s in (PASS, SHARED, FAIL, NOT_RUN)}
    state = "" if exp.meta.finished else f" — {exp.meta.stopped or 'did not finish'}"
    word = "FAILED" if n[FAIL] or not exp.meta.finished else "passed"
    shared = f", {n[SHARED]} shared (GPUs shared between pods: a finding)" if n[SHARED] else ""
    return f"{word}: {n[PASS]} passed{shared}, {n[FAIL]} failed, {n[NOT_RUN]} not run{state}"


def header(exp: ExperimentRecord) -> list[tuple[str, str]]:
    m, s = exp.meta, settings_of(exp)
    out = [("cluster", f"{m.host} ({m.source})"), ("namespace", m.namespace or ""),
           ("image", f"{s.image} (imagePullPolicy {s.pull})"), ("GPU resource", s.resource),
           ("node", s.node or "any"), ("suites", "functional" + (", availability" if s.disruptive else "")),
           ("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(exp.created))), ("experiment", exp.id)]
    return [(k, str(v)) for k, v in out]


def table(exp: ExperimentRecord) -> tables.Table:
    rows = [[r.suite, r.check, r.status, fmt(r.seconds, 2), fmt(r.recovery_s, 2), r.detail] for r in rows_of(exp)]
    note = ("; ".join(f"{k}: {unit}, {better} is better" for k, (unit, better) in FIGURES.items())
            + ". seconds: how long the check took; recovery_s: from the disruption's command until the node was "
              "Ready with its GPUs allocatable again and a new GPU pod ran there. shared: pods share physical GPUs "
              "(the node advertises more than it has): a finding, a failure under --exclusive.")
    return tables.Table("checks", "checks", ["suite", "check", "status", "seconds", "recovery s", "detail"], rows,
                        note=note, right={3, 4},
                        marked={i for i, r in enumerate(rows_of(exp)) if r.status == FAIL})


def to_dict(exp: ExperimentRecord) -> dict[str, Any]:
    return {"id": exp.id, "name": exp.name, "kind": exp.kind, "created": exp.created, "verdict": verdict(exp),
            **{k: v for k, v in exp.meta.to_dict().items() if k != "checks"},
            "checks": [r.to_dict() for r in rows_of(exp)], "figures": {k: {"unit": u, "better": b}
                                                                   for k, (u, b) in FIGURES.items()}}


def render(fmt_name: str, exp: ExperimentRecord, width: int = 160) -> str:
    if fmt_name == "json":
        return json.dumps(to_dict(exp), indent=2, default=str) + "\n"
    if fmt_name == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["experiment_id", "suite", "check", "status", "seconds", "recovery_s", "detail"])
        for r in rows_of(exp):
            w.writerow(safe_row([exp.id, r.suite, r.check, r.status, r.seconds, r.recovery_s, r.detail]))
        return buf.getvalue()
    if fmt_name == "md":
        lines = [f"## {markdown.cell(exp.name)}", "", f"**{markdown.cell(verdict(exp))}**", ""]
        lines += [f"- {markdown.cell(k)}: {markdown.cell(v)}" for k, v in header(exp)]
        return "\n".join(lines + ["", markdown.table(table(exp))]) + "\n"
    if fmt_name == "html":
        from gpuvs.report.html import environment

        return environment().get_template("validation.html.j2").render(
            exp=exp, verdict=verdict(exp), header=header(exp), t=table(exp))
    return terminal(exp, width)


def terminal(exp: ExperimentRecord, width: int = 160) -> str:
    from rich.console import Console
    from gpuvs.report.fit import Table

    from gpuvs.report.terminal import safe_cells
    from gpuvs.safetext import safe_text

    console = Console(record=True, width=width, markup=False, highlight=False, file=io.StringIO())
    t = table(exp)
    rt = Table(title=safe_text(f"{exp.name}: {verdict(exp)}"), title_justify="left", caption=safe_text(t.note),
               caption_justify="left")
    for i, c in enumerate(t.columns):
        rt.add_column(c, justify="right" if i in t.right else "left", overflow="fold")
    for i, row in enumerate(t.rows):  # a check's detail may carry a probe pod's own words
        rt.add_row(*safe_cells(*row), style="red" if i in t.marked else None)
    console.print(rt)
    for k, v in header(exp):
        console.print(safe_text(f"  {k}: {v}"))
    return console.export_text()
