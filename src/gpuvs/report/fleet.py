"""A fleet run's report in every format: one row per node, slowest first, the fingerprints, the error control.

The rows are built once (rows()); each format only lays them out.
Every text has its control characters escaped (safetext.py): a reason may carry a pod's or a job's words."""

from __future__ import annotations

import csv
import html as html_lib
import io
import json
from typing import Any

from gpuvs.fleet.assess import fingerprint_diff as fingerprints
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.report import markdown
from gpuvs.report.tables import Table, interval
from gpuvs.safetext import safe_row, safe_text

COLUMNS = ["node", "verdict", "speed vs fleet", "interval", "trials ok", "mean", "compared with", "notes"]
FORMATS = ("term", "md", "html", "json", "csv")


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _mean(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} {unit}" if abs(v) >= 1000 else f"{v:.4g} {unit}"


def verdict_text(r: NodeRow, margin: float) -> str:
    if r.verdict == "equivalent":
        return f"equivalent (±{100 * margin:g}%)"
    if r.verdict in ("slower", "faster") and r.speed is not None:
        return f"{r.verdict} ({100 * abs(1 - r.speed):.1f}%)"
    if r.verdict.endswith("-within-margin") and r.speed is not None:
        word = r.verdict.removesuffix("-within-margin")
        return f"{100 * abs(1 - r.speed):.1f}% {word}, within the ±{100 * margin:g}% allowed"
    return r.verdict


def notes(r: NodeRow) -> str:
    parts = []
    if r.reason and r.verdict not in ("slower", "faster", "equivalent", "slower-within-margin",
                                      "faster-within-margin"):
        parts.append(r.reason)
    if r.why:  # a slow node's NVML readings against its peers' (fleet/assess/causes.py)
        parts.append("why: " + "; ".join(r.why))
    if r.differs:
        parts.append("differs from the majority in " + ", ".join(f"{k} ({v[0]} vs {v[1]})"
                                                                 for k, v in r.differs.items()))
    return "; ".join(parts)


def name(r: NodeRow) -> str:
    """A row's name: its node, or with --per-gpu its node and GPU index."""
    return r.node if r.gpu is None else f"{r.node} GPU {r.gpu}"


def reference_text(r: NodeRow) -> str:
    if not r.reference:
        return "-"
    if r.gpu is not None:  # GPUs node/ID: the fleet's GPUs of its model
        return ", ".join(r.reference) if len(r.reference) <= 2 else f"{len(r.reference)} GPUs (fleet band)"
    return ", ".join(r.reference) if len(r.reference) <= 3 else f"{len(r.reference)} nodes (fleet band)"


def node_table(res: FleetResult) -> Table:
    rows = [[name(r), verdict_text(r, res.margin), _fmt(r.speed), interval(r.speed_low, r.speed_high),
             f"{r.n_ok}/{r.n_trials}" if r.n_trials else "-", _mean(r.mean, res.unit),
             reference_text(r), notes(r)] for r in res.rows]
    marked = {i for i, r in enumerate(res.rows) if r.verdict in ("slower", "failed") or r.differs}
    if res.per_gpu:  # one row per GPU: its id (the device plugin's; a UUID with NVIDIA's) beside its node and index
        for cells, r in zip(rows, res.rows):
            cells.insert(1, r.uuid or "-")
        return Table("fleet", f"GPUs against the fleet's GPUs of their model: {res.workload}, {res.unit} "
                     f"({'higher' if res.higher_is_better else 'lower'} is better), slowest first",
                     ["node / GPU", "id", *COLUMNS[1:]], rows, note=control_note(res), right={3, 4, 5, 6},
                     marked=marked)
    return Table("fleet", f"Nodes against the fleet: {res.workload}, {res.unit} "
                 f"({'higher' if res.higher_is_better else 'lower'} is better), slowest first", COLUMNS, rows,
                 note=control_note(res), right={2, 3, 4, 5}, marked=marked)


def control_note(res: FleetResult) -> str:
    c = res.control
    if res.per_gpu:
        return (f"speed vs fleet: the GPU's figure over its reference's (the fleet's other GPUs of its model within "
                f"±{100 * res.margin:g}% of their median, pooled), below 1 is slower. Error rate held at "
                f"{100 * c.alpha:g}% for the whole fleet: Holm over {c.nodes} GPU(s) at each of at most {c.looks} "
                f"look(s) ({100 * c.per_look:.3g}% per look, split over GPU models); intervals are simultaneous "
                f"({100 * c.interval_confidence:.3g}%). Rounds: {res.plan.trials} per node (one pod per GPU, a "
                f"node's GPUs at once), up to {res.plan.max_trials} where unsettled; {res.looks_used} look(s) used.")
    return (f"speed vs fleet: the node's figure over its reference's (the other nodes within ±{100 * res.margin:g}% "
            f"of their median, pooled), below 1 is slower. Error rate held at {100 * c.alpha:g}% for the whole "
            f"fleet: Holm over {c.nodes} node(s) at each of at most {c.looks} look(s) "
            f"({100 * c.per_look:.3g}% per look); intervals are simultaneous "
            f"({100 * c.interval_confidence:.3g}%). Trials: {res.plan.trials} per node, up to "
            f"{res.plan.max_trials} where unsettled; {res.looks_used} look(s) used.")


def fingerprint_table(res: FleetResult) -> Table | None:
    measured = [r for r in res.rows if r.fingerprint]
    if len(measured) < 2:
        return None
    fps = {name(r): r.fingerprint for r in measured}
    rows = [[label] + ["-" if v is None else str(v) for v in values] for label, values, _ in fingerprints.rows(fps)]
    marked = {i for i, (_, _, differs) in enumerate(fingerprints.rows(fps)) if differs}
    return Table("fingerprints", "Fingerprints per GPU" if res.per_gpu else "Fingerprints per node",
                 ["field"] + list(fps), rows, marked=marked)


def tables(res: FleetResult) -> list[Table]:
    return [t for t in (node_table(res), fingerprint_table(res)) if t is not None]


def summary_line(res: FleetResult) -> str:
    slow = [r for r in res.rows if r.verdict == "slower"]
    measured = res.measured()
    small = [r for r in res.rows if r.verdict == "slower-within-margin" and r.speed is not None]
    within = ("; slower but within the ±" + f"{100 * res.margin:g}% allowed: "
              + ", ".join(f"{name(r)} at {r.speed:.3f}× the fleet [{interval(r.speed_low, r.speed_high)}]"
                          for r in small)) if small else ""
    what = "GPU(s)" if res.per_gpu else "node(s)"
    if slow:
        named = ", ".join(f"{name(r)}{f' ({r.uuid})' if r.uuid else ''} at {r.speed:.3f}× the fleet" for r in slow)
        return f"{len(slow)} of {len(measured)} measured {what} slower than the fleet: {named}{within}"
    if res.per_gpu:
        return f"no GPU of {len(measured)} measured is slower than the fleet beyond the margin{within}"
    return f"no node of {len(measured)} measured is slower than the fleet beyond the margin{within}"


def render_markdown(res: FleetResult) -> str:
    out = [f"## gpuvs fleet {markdown.cell(res.workload)} ({res.id})", "", f"**{markdown.cell(summary_line(res))}**"]
    if res.command:
        out += ["", f"- command: {markdown.code_span(res.command)}"]
    for t in tables(res):
        out += ["", markdown.table(t)]
    if res.labels:
        out += ["", "### Node labels", ""] + [f"- {markdown.cell(lab.node)}: {markdown.cell(lab.labels)} "
                                              f"({markdown.cell(lab.status)})" for lab in res.labels]
    if res.signals:
        out += ["", "### Node condition, events and taints", ""] + [
            f"- {markdown.cell(s.node)}: {s.what} {markdown.cell(s.detail)} ({markdown.cell(s.status)})"
            for s in res.signals]
    return "\n".join(out) + "\n"


def render_json(res: FleetResult) -> str:
    return json.dumps(res.to_dict(), indent=2, default=str) + "\n"


def render_csv(res: FleetResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    gpu = ["gpu", "uuid"] if res.per_gpu else []  # --per-gpu: the GPU's index on its node and its id
    w.writerow(["experiment_id", "node", *gpu, "verdict", "speed", "speed_low", "speed_high", "ratio", "mean", "unit",
                "n_ok", "n_trials", "p_adjusted", "reference", "differs", "reason"])
    for r in res.rows:
        w.writerow(safe_row([res.id, r.node, *([r.gpu, r.uuid] if res.per_gpu else []), r.verdict, r.speed,
                             r.speed_low, r.speed_high, r.ratio, r.mean, res.unit,
                             r.n_ok, r.n_trials, r.p_adjusted, " ".join(r.reference),
                             "; ".join(f"{k}={v[0]}" for k, v in r.differs.items()), r.reason]))
    return buf.getvalue()


_COLOURS = {"slower": "#c0392b", "faster": "#2471a3", "equivalent": "#1e8449", "inconclusive": "#b9770e",
            "slower-within-margin": "#d68910", "faster-within-margin": "#5dade2",
            "reference": "#555555"}


def band_svg(res: FleetResult, width: int = 360, height: int = 18) -> dict[str, str]:
    """{node: inline SVG}: the node's speed and interval against the fleet band (1 ± margin)."""
    measured = [r for r in res.rows if r.speed is not None]
    lows = [r.speed_low or r.speed for r in measured] + [1 - res.margin]
    highs = [r.speed_high or r.speed for r in measured] + [1 + res.margin]
    lo, hi = min(lows), max(highs)
    pad = 0.05 * (hi - lo or 1)
    lo, hi = lo - pad, hi + pad

    def x(v: float) -> float:
        return round((v - lo) / (hi - lo) * width, 1)

    out = {}
    for r in measured:
        colour = _COLOURS.get(r.verdict, "#555555")
        parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
                 f'aria-label="{html_lib.escape(safe_text(name(r)))}: {r.speed:.3f}">',
                 f'<rect x="{x(1 - res.margin)}" y="0" width="{x(1 + res.margin) - x(1 - res.margin)}" '
                 f'height="{height}" fill="#d5f5e3"/>',
                 f'<line x1="{x(1.0)}" x2="{x(1.0)}" y1="0" y2="{height}" stroke="#7f8c8d" stroke-dasharray="2,2"/>']
        if r.speed_low is not None and r.speed_high is not None:
            parts.append(f'<line x1="{x(r.speed_low)}" x2="{x(r.speed_high)}" y1="{height / 2}" y2="{height / 2}" '
                         f'stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<circle cx="{x(r.speed)}" cy="{height / 2}" r="4" fill="{colour}"/></svg>')
        out[name(r)] = "".join(parts)
    return out


def render_html(res: FleetResult) -> str:
    def esc(text: object) -> str:
        return html_lib.escape(safe_text(text))

    bands = band_svg(res)
    t = node_table(res)
    head = "".join(f"<th>{esc(c)}</th>" for c in t.columns[:4]) + "<th>against the fleet band</th>" + "".join(
        f"<th>{esc(c)}</th>" for c in t.columns[4:])
    body = []
    for i, (r, cells) in enumerate(zip(res.rows, t.rows)):
        cls = f' class="{esc(r.verdict)}"'
        tds = "".join(f"<td>{esc(c)}</td>" for c in cells[:4]) + f"<td>{bands.get(name(r), '')}</td>" + "".join(
            f"<td>{esc(c)}</td>" for c in cells[4:])
        body.append(f"<tr{cls}>{tds}</tr>")
    fp = fingerprint_table(res)
    fp_html = ""
    if fp:
        fp_html = ("<h2>Fingerprints per node</h2><table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in fp.columns)
                   + "</tr>" + "".join(f"<tr{' class=differs' if i in fp.marked else ''}>"
                                       + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                                       for i, row in enumerate(fp.rows)) + "</table>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:3px 8px;text-align:left;vertical-align:middle}tr.slower td,tr.failed td{background:#fdedec}"
             "tr.differs td{background:#fef9e7}.note{color:#555;max-width:70em}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>gpuvs fleet {esc(res.id)}</title>"
            f"<style>{style}</style></head><body><h1>gpuvs fleet: {esc(res.workload)}</h1>"
            f"<p><strong>{esc(summary_line(res))}</strong></p>"
            + (f"<p><code>{esc(res.command)}</code></p>" if res.command else "")
            + f"<table><tr>{head}</tr>{''.join(body)}</table>"
            f"<p class=\"note\">{esc(t.note)} The green band is the fleet's ±{100 * res.margin:g}%; the dashed line "
            f"is the fleet (1.0); each line is a node's interval.</p>{fp_html}"
            f"<p class=\"note\">experiment {esc(res.id)}</p></body></html>\n")


def render(fmt: str, res: FleetResult, width: int = 160) -> str:
    if fmt == "md":
        return render_markdown(res)
    if fmt == "html":
        return render_html(res)
    if fmt == "json":
        return render_json(res)
    if fmt == "csv":
        return render_csv(res)
    from rich.console import Console

    console = Console(record=True, width=width, markup=False, highlight=False, file=io.StringIO())
    terminal(console, res)
    return console.export_text()


def terminal(console: Any, res: FleetResult) -> None:
    from gpuvs.report.terminal import rich_table

    console.print(safe_text(summary_line(res)), style="bold")
    for t in tables(res):
        console.print(rich_table(t))
    for lab in res.labels:
        console.print(safe_text(f"label {lab.node}: {lab.labels} ({lab.status})"))
    for sig in res.signals:
        console.print(safe_text(f"{sig.what} {sig.node}: {sig.detail} ({sig.status})"))
