"""Chart geometry for the HTML report: numbers only (positions, ticks, colours). The template draws
them as inline SVG and escapes every label, so a chart needs no script, no network and no library."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from gpuvs import events
from gpuvs.analysis.comparison import Analysis
from gpuvs.analysis.stats import TrialsSummary
from gpuvs.report.numbers import Units, fmt

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
TELEMETRY_FIELDS = (("util_gpu", "GPU utilisation", "%"), ("mem_used_mib", "GPU memory used", "MiB"),
                    ("power_w", "power", "W"), ("sm_clock_mhz", "SM clock", "MHz"), ("temp_c", "temperature", "°C"))
W, H = 720, 300
LEFT, RIGHT, TOP, BOTTOM = 78, 20, 18, 56


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        high = low + 1.0
    raw = (high - low) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    k = math.floor(low / step + 1e-9)
    ticks = [round(k * step, 12)]
    while ticks[-1] < high - step * 1e-9:  # the last tick is at or above high: every point fits
        k += 1
        ticks.append(round(k * step, 12))
    return ticks


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-2:
        return f"{v:.2g}"
    return f"{v:,.6g}"


class _Frame:
    """Maps data to pixels inside the plot area of a width x height chart."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, width: int = W, height: int = H):
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)
        self.width, self.height = width, height

    def x(self, v: float) -> float:
        return round(LEFT + (v - self.x0) / (self.x1 - self.x0) * (self.width - LEFT - RIGHT), 1)

    def y(self, v: float) -> float:
        return round(self.height - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM), 1)


def _axes(frame: _Frame, xticks: Sequence[float] | None, yticks: Sequence[float]) -> dict[str, Any]:
    w, h = frame.width, frame.height
    return {"width": w, "height": h, "left": LEFT, "right": w - RIGHT, "top": TOP, "bottom": h - BOTTOM,
            "yticks": [{"y": frame.y(v), "label": tick_label(v)} for v in yticks],
            "xticks": [{"x": frame.x(v), "label": tick_label(v)} for v in (xticks or [])]}


def _scaled(s: TrialsSummary, k: float) -> TrialsSummary:
    """An arm's summary with its figures in another unit (k per declared unit); the CV is the same."""
    def x(v: float | None) -> float | None:
        return None if v is None else v * k

    return dataclasses.replace(s, values=[v * k for v in s.values], mean=x(s.mean), ci_low=x(s.ci_low),
                               ci_high=x(s.ci_high), std=x(s.std), min=x(s.min), max=x(s.max))


def bar_chart(a: Analysis, metric: str, units: Units) -> dict[str, Any] | None:
    """One bar per arm (mean of per-trial figures) with its confidence-interval whisker and the
    trials as dots, in the metric's unit of this report (tables.units_of)."""
    arms = [(i, arm, arm.summaries.get(metric)) for i, arm in enumerate(a.arms)]
    arms = [(i, arm, s) for i, arm, s in arms if s is not None and s.n]
    if not arms:
        return None
    k, unit = units.of(metric, next(m.unit for m in a.metrics if m.name == metric))
    arms = [(i, arm, _scaled(s, k)) for i, arm, s in arms]
    top = max(max(s.ci_high if s.ci_high == s.ci_high and s.ci_high is not None else s.mean, s.max)
              for _, _, s in arms)
    yticks = nice_ticks(0.0, top * 1.08)
    frame = _Frame(0, 1, 0, yticks[-1])
    band = (W - LEFT - RIGHT) / len(arms)
    bars = []
    for k, (i, arm, s) in enumerate(arms):
        x = LEFT + k * band + band * 0.2
        width = band * 0.6
        bar = {"x": round(x, 1), "width": round(width, 1), "y": frame.y(s.mean),
               "height": round(frame.y(0) - frame.y(s.mean), 1), "colour": colour(i), "name": arm.name,
               "cx": round(x + width / 2, 1), "label": fmt(s.mean), "whisker": None,
               "dots": [frame.y(v) for v in s.values]}
        low, high = s.ci_low, s.ci_high
        if low is not None and high is not None and low == low and high == high:
            bar["whisker"] = {"y1": frame.y(max(low, 0.0)), "y2": frame.y(high)}
        bars.append(bar)
    return {**_axes(frame, None, yticks), "bars": bars, "title": f"{metric}: mean per arm, "
            f"{100 * a.confidence:g}% CI whiskers, trials as dots", "ylabel": unit, "xlabel": ""}


def line_chart(title: str, ylabel: str, xlabel: str, lines: list[dict[str, Any]], width: int = W,
               height: int = H, zero: bool = True) -> dict[str, Any] | None:
    """lines: [{'name', 'colour', 'points': [(x, y)]}] -> polylines in one frame; zero: the y axis starts at
    0 (else it is fitted to the figures)."""
    pts = [p for line in lines for p in line["points"]]
    if not pts:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if zero:
        yticks = nice_ticks(min(0.0, min(ys)), max(ys) * 1.05 if max(ys) > 0 else 1.0)
    else:
        pad = (max(ys) - min(ys)) * 0.08 or abs(max(ys)) * 0.01 or 1.0
        yticks = nice_ticks(min(ys) - pad, max(ys) + pad)
    xticks = nice_ticks(min(xs), max(xs), 6)
    frame = _Frame(xticks[0], xticks[-1], yticks[0], yticks[-1], width, height)
    out_lines = []
    for line in lines:
        if not line["points"]:
            continue
        points = " ".join(f"{frame.x(x)},{frame.y(y)}" for x, y in line["points"])
        out_lines.append({"points": points, "colour": line["colour"], "name": line["name"],
                          "single": len(line["points"]) == 1,
                          "cx": frame.x(line["points"][0][0]), "cy": frame.y(line["points"][0][1])})
    return {**_axes(frame, xticks, yticks), "lines": out_lines, "title": title, "ylabel": ylabel, "xlabel": xlabel}


def legend(a: Analysis) -> list[dict[str, str]]:
    return [{"colour": colour(i), "name": arm.name} for i, arm in enumerate(a.arms)]


def step_chart(a: Analysis, units: Units) -> dict[str, Any] | None:
    """Per-step figure of the headline series for every trial, coloured by arm."""
    head = a.headline
    if head is None:
        return None
    k, unit = units.of(head.name, head.unit)
    index = {arm.name: i for i, arm in enumerate(a.arms)}
    lines = [{"name": f"{t.arm} trial {t.trial + 1}", "colour": colour(index.get(t.arm, 0)),
              "points": [(float(s), float(v) * k) for s, v in t.steps]} for t in a.trials if t.steps]
    return line_chart(f"{head.name} per step, every trial", unit, "step", lines)


def telemetry_charts(a: Analysis) -> list[dict[str, Any]]:
    """One chart per NVML reading that any trial recorded: the value over seconds since the trial's
    sampler started, one line per trial and GPU."""
    index = {arm.name: i for i, arm in enumerate(a.arms)}
    charts = []
    for key, label, unit in TELEMETRY_FIELDS:
        lines = []
        for t in a.trials:
            by_gpu: dict[Any, list[tuple[float, float]]] = {}
            for row in t.telemetry:
                v = row.data.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and row.t is not None:
                    by_gpu.setdefault(row.gpu, []).append((float(row.t), float(v)))
            for gpu, pts in by_gpu.items():
                lines.append({"name": f"{t.arm} trial {t.trial + 1} GPU {gpu}",
                              "colour": colour(index.get(t.arm, 0)), "points": pts})
        chart = line_chart(f"{label} over time", unit, "seconds", lines, width=520, height=230)
        if chart:
            charts.append(chart)
    return charts


RATIO_ROW = 34  # pixels per arm in a ratio chart


def ratio_chart(a: Analysis, metric: str) -> dict[str, Any] | None:
    """What the verdict is about, per metric: each arm's ratio to the baseline as a point with its interval
    (at the level its verdict was made), a line at 1 and the ±margin band shaded, so a 1% question is drawn
    at the scale of 1% (never bars from zero). The figures are written beside the axis, not on the whiskers."""
    rows = [v for v in a.verdicts if v.metric == metric and v.ratio is not None]
    if not rows:
        return None
    lo_m, hi_m = 1 - a.margin, 1 + a.margin
    ends = [x for v in rows for x in (v.ratio, v.ci_low, v.ci_high) if x is not None and math.isfinite(x)]
    low, high = min(ends + [lo_m]), max(ends + [hi_m])
    pad = (high - low) * 0.06 or 0.01
    xticks = nice_ticks(max(low - pad, 0.0), high + pad, 6)
    height = TOP + BOTTOM + RATIO_ROW * len(rows)
    left, right_text = 150, 230  # arm names on the left; the figures in words on the right
    width = W + right_text
    frame = _Frame(xticks[0], xticks[-1], 0, 1, width - right_text + (LEFT - left), height)
    shift = left - LEFT

    def x(v: float) -> float:
        return round(frame.x(v) + shift, 1)

    index = {arm.name: i for i, arm in enumerate(a.arms)}
    out = []
    for k, v in enumerate(rows):
        y = TOP + RATIO_ROW * k + RATIO_ROW / 2
        shown = v.ci_low is not None and v.ci_high is not None
        out.append({"name": v.arm, "y": round(y, 1), "x": x(v.ratio), "colour": colour(index.get(v.arm, 0)),
                    "x1": x(max(v.ci_low, xticks[0])) if shown else None,
                    "x2": x(min(v.ci_high, xticks[-1])) if shown else None,
                    "text": f"{v.ratio:.3f}× [{fmt(v.ci_low, 3)}–{fmt(v.ci_high, 3)}] {v.verdict}" if shown
                    else f"{v.ratio:.3f}× {v.verdict}"})
    bottom = height - BOTTOM
    paired = " (paired: the geometric mean of the per-round ratios)" if any(v.method == "paired" for v in rows) else ""
    return {"width": width, "height": height, "left": left, "right": x(xticks[-1]), "top": TOP, "bottom": bottom,
            "text_x": x(xticks[-1]) + 10, "one": x(1.0), "band": {"x": x(lo_m), "width": round(x(hi_m) - x(lo_m), 1)},
            "xticks": [{"x": x(t), "label": f"{t:g}"} for t in xticks], "rows": out,
            "title": f"{metric}: each arm / {a.arms[0].name} with its interval{paired}; shaded: the "
                     f"±{100 * a.margin:g}% margin; the line: no difference",
            "xlabel": f"ratio to {a.arms[0].name}"}


def trials_chart(a: Analysis, units: Units) -> dict[str, Any] | None:
    """The headline's figure of every trial in the order the trials ran, one line of points per arm, on an
    axis fitted to the figures (not from zero): drift over the run shows as a slope."""
    head = a.headline
    done = sorted((t for t in a.trials if t.value is not None), key=lambda t: (t.id is None, t.id or 0))
    if head is None or len(done) < 2:
        return None
    order = {id(t): n + 1 for n, t in enumerate(done)}
    index = {arm.name: i for i, arm in enumerate(a.arms)}
    k, unit = units.of(head.name, head.unit)
    lines = [{"name": arm.name, "colour": colour(i),
              "points": [(float(order[id(t)]), float(t.value) * k) for t in done if t.arm == arm.name]}
             for arm, i in ((arm, index[arm.name]) for arm in a.arms)]
    chart = line_chart(f"{head.name} of every trial, in the order they ran", unit, "trial (run order)",
                       lines, zero=False)
    if chart:
        chart["dots"] = [{"cx": p.split(",")[0], "cy": p.split(",")[1], "colour": line["colour"]}
                         for line in chart["lines"] for p in line["points"].split()]
    return chart


def startup_chart(a: Analysis) -> dict[str, Any] | None:
    """Start-up as a chart: per arm, each milestone's mean seconds from launch as a bar, one row per arm and
    milestone, the milestones in the order they happen, so where start-up goes is seen side by side."""
    keys = events.in_time_order(arm.startup for arm in a.arms)  # a timeline: the milestones as they happen
    if not keys:
        return None
    top = max(v for arm in a.arms for v in arm.startup.values())
    xticks = nice_ticks(0.0, top * 1.05 or 1.0, 6)
    rows, k = [], 0
    bar_h = 12
    for key in keys:
        for i, arm in enumerate(a.arms):
            if key in arm.startup:
                rows.append({"label": f"{key.removesuffix('_s')} · {arm.name}", "colour": colour(i),
                             "value": fmt(arm.startup[key], 3), "seconds": arm.startup[key], "k": k})
                k += 1
    height = TOP + BOTTOM + (bar_h + 6) * len(rows)
    left = 230
    frame = _Frame(xticks[0], xticks[-1], 0, 1, W + LEFT - left, height)  # the axis ends at W - RIGHT
    shift = left - LEFT
    for r in rows:
        r["y"] = TOP + r.pop("k") * (bar_h + 6)
        r["x"] = left
        r["width"] = round(frame.x(r.pop("seconds")) + shift - left, 1)
        r["h"] = bar_h
    return {"width": W + 90, "height": height, "left": left, "right": round(frame.x(xticks[-1]) + shift, 1),
            "top": TOP, "bottom": height - BOTTOM, "rows": rows,
            "xticks": [{"x": round(frame.x(t) + shift, 1), "label": tick_label(t)} for t in xticks],
            "title": "Start-up: mean seconds from launch to each milestone, per arm (never part of throughput)",
            "xlabel": "seconds from launch"}
