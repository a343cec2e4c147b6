"""The status page: one self-contained HTML page a person reads at a glance, the nodes that need a look first.

render_status_page(store) is what `gpuvs report status` writes and the agent serves.
render_history(history) is `gpuvs fleet history --format html`, the same page without validate.
Chart geometry is computed here (numbers only); the template draws it and escapes every name."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from gpuvs import __version__
from gpuvs.fleet.assess import stored_history as stored
from gpuvs.fleet.assess.stored_history import FleetHistory, NodeStanding, WorkloadStanding
from gpuvs.report import history as text
from gpuvs.report import validation
from gpuvs.report.charts import nice_ticks, tick_label
from gpuvs.validate.validate_run import KIND as VALIDATE_KIND

if TYPE_CHECKING:
    from gpuvs.store.db import Store

CHART_W, CHART_H = 600, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 30
VALIDATE_SHOWN = 5  # latest validate runs listed (the latest with every check)
COLOURS = {"slower": "#c0392b", "faster": "#2471a3", "equivalent": "#1e8449", "inconclusive": "#b9770e",
           "slower-within-margin": "#d68910", "faster-within-margin": "#5dade2",
           "reference": "#555555", "failed": "#c0392b", "excluded": "#999999"}


def _y_range(w: WorkloadStanding, margin: float) -> tuple[float, float]:
    """One scale for every node of a workload, so that their charts compare at a glance."""
    lows, highs = [1 - margin], [1 + margin]
    for n in w.nodes:
        rows = {r.run_id: r for r in n.runs}
        for p in n.history.points:
            low, high = text.run_interval(rows.get(p.run_id), p)
            lows.append(min(low, p.speed))
            highs.append(max(high, p.speed))
    lo, hi = min(lows), max(highs)
    pad = 0.06 * (hi - lo or 0.1)
    ticks = nice_ticks(lo - pad, hi + pad, 4)
    return ticks[0], ticks[-1]


def chart(w: WorkloadStanding, n: NodeStanding) -> dict[str, Any]:
    """One node's speed against the fleet band at each run of the workload (x: the run's place, so every
    node of a workload is on the same axis), each run's interval as that run reported it, the band 1 ± margin, change points as
    a line before the first run at the new level, and each segment's level between them."""
    runs = [r.run_id for r in w.runs]
    at = {r: i for i, r in enumerate(runs)}
    margin = w.latest.margin if w.latest else 0.05
    y0, y1 = _y_range(w, margin)
    span = max(1, len(runs) - 1)

    def x(i: float) -> float:
        return round(LEFT + 8 + i / span * (CHART_W - LEFT - RIGHT - 16), 1)

    def y(v: float) -> float:
        v = min(max(v, y0), y1)
        return round(CHART_H - BOTTOM - (v - y0) / (y1 - y0) * (CHART_H - TOP - BOTTOM), 1)

    verdict_at = {r.run_id: r for r in n.runs}
    points = []
    for p in n.history.points:
        r = verdict_at.get(p.run_id)
        low, high = text.run_interval(r, p)
        verdict = r.verdict if r else p.verdict
        points.append({"x": x(at[p.run_id]), "y": y(p.speed), "low": y(low), "high": y(high),
                       "colour": COLOURS.get(verdict, "#555555"), "latest": p.run_id == w.latest.run_id,
                       "title": f"{p.run_id} {text.when(p.time)}: {p.speed:.3f}× [{low:.3f}–{high:.3f}] {verdict}"})
    failed = [{"x": x(at[r.run_id]), "title": f"{r.run_id} {text.when(r.time)}: {r.verdict} {r.reason}"}
              for r in n.runs if r.verdict in ("failed", "excluded") and r.run_id in at]
    cuts = n.changes.change_points if n.changes else []
    changes = [{"x": round((x(at[c.previous_run_id]) + x(at[c.run_id])) / 2, 1),
                "label": f"{time.strftime('%m-%d', time.gmtime(c.time))} {c.step:.3f}×",
                "title": text.change_text(c)} for c in cuts if c.run_id in at and c.previous_run_id in at]
    levels = []  # each segment's level (geometric mean of its speeds) between change points
    idx = [at[p.run_id] for p in n.history.points]
    bounds = [0] + [next((k for k, p in enumerate(n.history.points) if p.run_id == c.run_id), 0) for c in cuts]
    bounds.append(len(idx))
    if cuts:
        for a, b in zip(bounds, bounds[1:]):
            if b > a:
                level = math.exp(sum(math.log(p.speed) for p in n.history.points[a:b]) / (b - a))
                levels.append({"x1": x(idx[a]) - 4, "x2": x(idx[b - 1]) + 4, "y": y(level)})
    step = max(1, math.ceil(len(runs) / 7))
    xticks = [{"x": x(i), "label": time.strftime("%m-%d", time.gmtime(w.runs[i].time))}
              for i in range(0, len(runs), step)]
    yticks = [{"y": y(v), "label": tick_label(v)} for v in nice_ticks(y0, y1, 6) if y0 <= v <= y1]
    return {"width": CHART_W, "height": CHART_H, "left": LEFT, "right": CHART_W - RIGHT, "top": TOP,
            "bottom": CHART_H - BOTTOM, "band_top": y(1 + margin), "band_bottom": y(1 - margin), "one": y(1.0),
            "points": points, "failed": failed, "changes": changes, "levels": levels, "xticks": xticks,
            "yticks": yticks, "title": f"{n.node}: speed against the fleet band at each run ({w.workload})"}


def card(w: WorkloadStanding, n: NodeStanding) -> dict[str, Any]:
    concern = n.needs_look
    return {"node": n.node, "marks": n.marks, "concern": concern, "now": text.fleet_now(n),
            "drift": text.drift_text(n.drift, w.drift.margin),
            "drift_verdict": n.drift.verdict if n.drift else "",
            "since": text.change_text(n.change) if n.change else text.no_change_text(n),
            "runs": len(n.history), "chart": chart(w, n)}


def workload_view(w: WorkloadStanding, node: str | None = None) -> dict[str, Any]:
    nodes = [n for n in w.nodes if node is None or n.node == node]
    return {"name": w.workload, "unit": w.unit, "summary": text.summary(w), "table": text.nodes_table(w, node),
            "cards": [card(w, n) for n in nodes], "runs": len(w.runs),
            "latest": w.latest.run_id if w.latest else "-", "latest_when": text.when(w.latest.time if w.latest else None),
            "margin": w.latest.margin if w.latest else 0.05, "window": w.drift.window,
            "interval": f"{100 * w.drift.interval_confidence:.3g}%"}


def attention(h: FleetHistory, nodes: set[str] | None = None, workloads: set[str] | None = None
              ) -> list[dict[str, str]]:
    """Every node that needs a look, across workloads, most pressing first; where given, only the `nodes` in the
    cluster now and the `workloads` run now (a retired workload's last results, a deleted node's, do not count)."""
    out = []
    for w in h.workloads:
        if workloads is not None and w.workload not in workloads:
            continue
        for n in w.nodes:
            if n.needs_look and (nodes is None or n.node in nodes):
                out.append((n.sort_key(), {"node": n.node, "workload": w.workload, "marks": ", ".join(n.marks),
                                           "drift": text.drift_text(n.drift, w.drift.margin),
                                           "now": text.fleet_now(n),
                                           "since": text.change_text(n.change) if n.change else ""}))
    return [d for _, d in sorted(out, key=lambda kd: kd[0])]


def validate_views(st: Store) -> list[dict[str, Any]]:
    """The latest validate runs, newest first: the verdict line and where it ran; every check of the newest."""
    found = [e for e in st.experiments() if e.kind == VALIDATE_KIND][-VALIDATE_SHOWN:][::-1]
    out = []
    for i, listing in enumerate(found):
        exp = st.experiment(listing.id)
        verdict = validation.verdict(exp)
        out.append({"id": exp.id, "name": exp.name, "when": text.when(exp.created), "verdict": verdict,
                    "failed": verdict.startswith("FAILED"), "header": validation.header(exp),
                    "table": validation.table(exp) if i == 0 else None})
    return out


def not_counted(h: FleetHistory, nodes: set[str] | None, workloads: set[str] | None) -> str:
    """What the attention box leaves out, as one sentence ("" when nothing)."""
    parts = []
    old = sorted(w.workload for w in h.workloads if workloads is not None and w.workload not in workloads)
    if old:
        parts.append(f"the results of {', '.join(old)}, which the agent no longer runs (it runs "
                     f"{', '.join(sorted(workloads or [])) or 'none'})")
    gone = sorted({n for n in h.nodes() if nodes is not None and n not in nodes})
    if gone:
        parts.append(f"node(s) {', '.join(gone)}, not in the cluster now")
    return ("Not counted: " + "; ".join(parts) + ".") if parts else ""


def _page(h: FleetHistory, *, title: str, node: str | None, validate: list[dict[str, Any]] | None,
          now: float | None, nodes: set[str] | None = None, workloads: set[str] | None = None) -> str:
    from gpuvs.report.html import environment

    views = [workload_view(w, node) for w, _ in text.filtered(h, node)]
    for v in views:
        v["retired"] = workloads is not None and v["name"] not in workloads
    look = [a for a in attention(h, nodes, workloads) if node is None or a["node"] == node]
    return environment().get_template("status.html.j2").render(
        title=title, store=h.store, generated=text.when(time.time() if now is None else now), version=__version__,
        attention=look, attention_nodes=len({a["node"] for a in look}), not_counted=not_counted(h, nodes, workloads),
        workloads=views, validate=validate, skipped=h.skipped, node=node)


def render_history(h: FleetHistory, node: str | None = None, now: float | None = None) -> str:
    """`gpuvs fleet history --format html`: the nodes' histories, without the validate part."""
    return _page(h, title="gpuvs fleet history" + (f": {node}" if node else ""), node=node, validate=None, now=now)


def render_status_page(st: Store, *, window: int | None = None, margin: float = 0.05, confidence: float = 0.95,
                       now: float | None = None, nodes: set[str] | None = None,
                       workloads: set[str] | None = None) -> str:
    """The status page of everything the store holds: fleet runs and validate runs. `nodes` (the cluster's now)
    and `workloads` (those run now), where given, bound what "Needs a look" counts; the rest is still shown."""
    kw = {} if window is None else {"window": window}
    h = stored.read(st, margin=margin, confidence=confidence, **kw)
    return _page(h, title="gpuvs status", node=None, validate=validate_views(st), now=now, nodes=nodes,
                 workloads=workloads)
