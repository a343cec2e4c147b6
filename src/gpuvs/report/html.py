"""The HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched).

The verdict table, each arm's ratio against the margin band, trials in run order, start-up, steps and telemetry.
Every name a user supplied goes through the template's autoescaping.
Every text shown has its control characters escaped (safetext.py), the page's own markup excepted."""

from __future__ import annotations

from pathlib import Path

import jinja2

from gpuvs import __version__
from gpuvs.analysis.comparison import Analysis
from gpuvs.report import charts, tables
from gpuvs.safetext import safe_text

TEMPLATES = Path(__file__).resolve().parent / "templates"


def shown(value: object) -> object:
    """Every {{ expression }}'s value before autoescaping: text with its control characters escaped; the
    templates' own markup (a macro's output: Markup, which has __html__) and numbers as they are."""
    if isinstance(value, str) and not hasattr(value, "__html__"):
        return safe_text(value)
    return value


def environment() -> jinja2.Environment:
    """The templates, with every user-supplied name autoescaped and every text's control characters escaped."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              finalize=shown)


def render(a: Analysis) -> str:
    env = environment()
    units = tables.units_of(a)  # one unit per metric, in the tables and the charts alike
    ratios = [c for c in (charts.ratio_chart(a, m.name) for m in a.metrics) if c]
    bars = [] if ratios else [c for c in (charts.bar_chart(a, m.name, units) for m in a.metrics) if c]  # one arm
    return env.get_template("report.html.j2").render(
        a=a, version=__version__, answer=tables.headline_sentence(a), header=tables.header_lines(a),
        disturbances=tables.disturbance_lines(a),
        tables=tables.all_tables(a, units), ratios=ratios, bars=bars, legend=charts.legend(a),
        trials=charts.trials_chart(a, units), startup=charts.startup_chart(a), steps=charts.step_chart(a, units),
        telemetry=charts.telemetry_charts(a))
