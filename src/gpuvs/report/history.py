"""Each node against its own past, as text: the sentences, the tables, and `gpuvs fleet history`'s report.

A sentence reads "node-7: 6.1% slower than its last 9 checks (0.939× [0.91–0.97]), not interleaved".
The tables list the nodes, slow and drifting first, and each node's figure and verdict at each run.
They are built once here, for the terminal, markdown and JSON; the HTML page (report/status.py) lays out the same."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from gpuvs.fleet.assess.changepoint import ChangePoint
from gpuvs.fleet.assess.drift import DriftVerdict
from gpuvs.fleet.assess.node_history import HistoryPoint
from gpuvs.fleet.assess.stored_history import FleetHistory, NodeStanding, RunRow, WorkloadStanding
from gpuvs.report import markdown
from gpuvs.report.numbers import fmt
from gpuvs.report.tables import Table, interval



def when(t: float | None, zone: bool = True) -> str:
    """A stored run's time, in UTC (the same on every machine that reads the store)."""
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M" + (" UTC" if zone else ""), time.gmtime(t))


def pct(ratio: float) -> str:
    return f"{100 * abs(1 - ratio):.1f}%"


def drift_text(v: DriftVerdict | None, margin: float) -> str:
    """The drift verdict without the node's name: "6.1% slower than its last 9 checks (0.939× [0.910–0.970]),
    not interleaved"."""
    if v is None:
        return "no drift verdict: not in the runs compared"
    checks = f"its last {v.checks} check{'s' if v.checks != 1 else ''}"
    figure = f"{v.ratio:.3f}× [{interval(v.ci_low, v.ci_high)}]" if v.ratio is not None else ""
    if v.verdict in ("slower", "faster"):
        return f"{pct(v.ratio)} {v.verdict} than {checks} ({figure}), not interleaved"
    if v.verdict == "equivalent":
        return f"equivalent to {checks} within ±{100 * margin:g}% ({figure}), not interleaved"
    if v.verdict.endswith("-within-margin"):
        return (f"{pct(v.ratio)} {v.verdict.removesuffix('-within-margin')} than {checks} ({figure}), within the "
                f"±{100 * margin:g}% allowed, not interleaved")
    if figure:
        return f"inconclusive against {checks} ({figure}): {v.reason}"
    return f"no drift verdict: {v.reason}"


def drift_sentence(n: NodeStanding, margin: float) -> str:
    return f"{n.node}: {drift_text(n.drift, margin)}"


def change_text(c: ChangePoint | None) -> str:
    """ "since when?": "since run X on 2026-11-20 09:00 UTC: 5.2% slower (0.948× [0.93–0.97]; last before: Y)"."""
    if c is None:
        return "-"
    word = "slower" if c.step < 1 else "faster"
    return (f"since run {c.run_id} on {when(c.time)}: {pct(c.step)} {word} ({c.step:.3f}× "
            f"[{interval(c.ci_low, c.ci_high)}]; last run before: {c.previous_run_id})")


def no_change_text(n: NodeStanding) -> str:
    if n.changes is None:
        return "-"
    if n.changes.reason:
        return f"not tested: {n.changes.reason}"
    return "no change found"


def fleet_now(n: NodeStanding) -> str:
    r = n.latest
    if r is None:
        return "not in the latest run"
    if r.speed is None:
        return r.verdict + (f": {r.reason}" if r.reason else "")
    return f"{r.verdict} {r.speed:.3f}× [{interval(r.speed_low, r.speed_high)}]"


def run_interval(r: RunRow | None, p: HistoryPoint | None) -> tuple[float | None, float | None]:
    """A run's interval of the node's speed as `gpuvs fleet` reported it in that run (simultaneous over its
    nodes); the point's own (95%, that node alone) where the run's row kept none."""
    if r is not None and r.speed_low is not None and r.speed_high is not None:
        return r.speed_low, r.speed_high
    return p.interval if p is not None else (None, None)


def nodes_table(w: WorkloadStanding, only: str | None = None) -> Table:
    """The nodes of one workload, slow and drifting first."""
    rows, marked = [], set()
    shown = [n for n in w.nodes if only is None or n.node == only]
    for i, n in enumerate(shown):
        rows.append([n.node, ", ".join(n.marks), fleet_now(n), drift_text(n.drift, w.drift.margin),
                     change_text(n.change) if n.change else no_change_text(n), str(len(n.history))])
        if n.needs_look:
            marked.add(i)
    d = w.drift
    note = (f"now vs fleet: the latest run's speed against the fleet band, its interval and verdict. Against its past: "
            f"the latest run against the node's last {d.window} earlier runs (at least {d.min_history}), each run's "
            "speed against the mean of its peers in that run, so that a change of the whole fleet cancels; the runs "
            "compared were taken at different times (not interleaved). Intervals "
            f"{100 * d.interval_confidence:.3g}% (simultaneous); false alarms held at {100 * (1 - d.confidence):g}% "
            "for the whole fleet per check (docs/history.md). Since when: the latest change point (the first run at "
            "the new level).")
    return Table(f"nodes-{w.workload}", f"{w.workload}: each node now and against its own past ({len(w.runs)} run(s), "
                 f"latest {w.latest.run_id if w.latest else '-'} on {when(w.latest.time if w.latest else None)})",
                 ["node", "marks", "now vs fleet", "against its own past", "since when", "runs"], rows, note=note,
                 right={5}, marked=marked)


def runs_table(w: WorkloadStanding, n: NodeStanding) -> Table:
    """One node's figure, interval and verdict at each stored run (failed and excluded runs too)."""
    points = {p.run_id: p for p in n.history.points}
    cuts = {c.run_id for c in (n.changes.change_points if n.changes else [])}
    rows, marked = [], set()
    for i, r in enumerate(n.runs):
        p = points.get(r.run_id)
        figure = fmt(r.mean if r.mean is not None else (p.figure if p else None))
        low, high = run_interval(r, p)
        speed = r.speed if r.speed is not None else (p.speed if p else None)
        rows.append([r.run_id, when(r.time, zone=False), f"{figure} {w.unit}" if figure != "-" else "-",
                     "-" if speed is None else f"{speed:.3f}×", interval(low, high), r.verdict,
                     str(r.n_ok), ("change point: first run at the new level" if r.run_id in cuts else "")
                     + (r.reason if r.verdict in ("failed", "excluded") else "")])
        if r.run_id in cuts or r.verdict in ("slower", "failed"):
            marked.add(i)
    return Table(f"runs-{w.workload}-{n.node}", f"{n.node} ({w.workload}): each run",
                 ["run", "date (UTC)", "figure", "speed vs fleet", "interval", "fleet verdict", "trials ok", "notes"],
                 rows, note="speed vs fleet: the node's figure over the fleet band's in that run, with the interval "
                 "that run reported (simultaneous over its nodes)", right={2, 3, 4, 6},
                 marked=marked)


def summary(w: WorkloadStanding) -> str:
    """One line: the nodes that need a look, or that none does."""
    bad = [n for n in w.nodes if n.needs_look]
    if not bad:
        return (f"{w.workload}: no node of {len(w.nodes)} is slow, drifting or changed "
                f"({len(w.runs)} stored run(s))")
    parts = []
    for n in bad:
        if n.drift and n.drift.verdict in ("slower", "faster"):
            parts.append(drift_sentence(n, w.drift.margin))
        elif n.change:
            parts.append(f"{n.node}: changed {change_text(n.change)}")
        else:
            parts.append(f"{n.node}: {fleet_now(n)}")
    return f"{w.workload}: {len(bad)} of {len(w.nodes)} node(s) need a look — " + "; ".join(parts)


def filtered(h: FleetHistory, node: str | None) -> list[tuple[WorkloadStanding, list[NodeStanding]]]:
    """The workloads (those with a node to look at first, then by name) and their nodes (`node`: that one)."""
    shown = [(w, [n for n in w.nodes if node is None or n.node == node]) for w in h.workloads
             if node is None or w.node(node) is not None]
    return sorted(shown, key=lambda wn: (not any(n.needs_look for n in wn[1]), wn[0].workload))


def to_dict(h: FleetHistory, node: str | None = None) -> dict[str, Any]:
    out = h.to_dict()
    if node is not None:
        out["node"] = node
        out["workloads"] = [{**w.to_dict(), "nodes": [n.to_dict() for n in ns]} for w, ns in filtered(h, node)]
    for wd in out["workloads"]:
        w = h.workload(wd["workload"])
        wd["summary"] = summary(w)
        for nd in wd["nodes"]:
            n = w.node(nd["node"])
            nd["drift_sentence"] = drift_sentence(n, w.drift.margin)
            nd["since_when"] = change_text(n.change) if n.change else no_change_text(n)
    return out


def render_json(h: FleetHistory, node: str | None = None) -> str:
    return json.dumps(to_dict(h, node), indent=2, default=str) + "\n"


def render_markdown(h: FleetHistory, node: str | None = None) -> str:
    out = [f"## gpuvs fleet history{' ' + markdown.cell(node) if node else ''} ({markdown.cell(h.store)})"]
    for w, ns in filtered(h, node):
        out += ["", f"**{markdown.cell(summary(w))}**", "", markdown.table(nodes_table(w, node))]
        for n in ns:
            out += ["", markdown.table(runs_table(w, n))]
    for run_id, why in h.skipped:
        out += ["", f"- run {markdown.cell(run_id)} left out: {markdown.cell(why)}"]
    return "\n".join(out) + "\n"


def terminal(console: Any, h: FleetHistory, node: str | None = None) -> None:
    from gpuvs.report.terminal import rich_table
    from gpuvs.safetext import safe_text

    for w, ns in filtered(h, node):
        console.print(safe_text(summary(w)), style="bold")
        console.print(rich_table(nodes_table(w, node), no_wrap={0}, fold=True))
        for n in ns:
            console.print(rich_table(runs_table(w, n), no_wrap={0}, fold=True))
    for run_id, why in h.skipped:
        console.print(safe_text(f"run {run_id} left out: {why}"), style="yellow")


def render(fmt_name: str, h: FleetHistory, node: str | None = None, width: int = 160) -> str:
    if fmt_name == "md":
        return render_markdown(h, node)
    if fmt_name == "json":
        return render_json(h, node)
    from rich.console import Console

    console = Console(record=True, width=width, markup=False, highlight=False, file=io.StringIO())
    terminal(console, h, node)
    return console.export_text()
