"""One unit per metric in every table and format of one report, on the real output of a real run.

Names never contradict their unit, and a paired ratio names its statistic (issue 45, items 2 and 5)."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser

import pytest

from gpuvs.analysis.family import MetricVerdict
from gpuvs.report import numbers, tables

# Each trial prints a per-step latency (ms) around 0.9 (arm a) or 1.1 (arm b), so that the figures of one metric
# straddle 1 ms; a latency_p95_ms below 1 ms and a step_time below 1 s. A counter varies the rounds' ratios.
JOB = """import json, pathlib, sys
p = pathlib.Path(sys.argv[2])
n = int(p.read_text()) if p.exists() else 0
p.write_text(str(n + 1))
f = (1.0, 1.3, 0.8)[n % 3]
base = float(sys.argv[1])
for step in range(3):
    print(json.dumps({"gpuvs": "latency", "value": base * f + 0.01 * step, "unit": "ms", "better": "lower",
                      "step": step + 1}))
print(json.dumps({"gpuvs": "latency_p95_ms", "value": 0.678 * f, "unit": "ms", "better": "lower"}))
print(json.dumps({"gpuvs": "step_time", "value": 0.5 * f, "unit": "s", "better": "lower"}))
"""
METRICS = {"latency", "latency_p95_ms", "step_time", "wall_time_s"}
OWN = {"latency_p95_ms": "ms", "wall_time_s": "s"}  # names that carry their unit


def _md_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    out, title = [], ""
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("### "):
            title, lines = lines[0][4:], lines[1:]
        rows = [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines if ln.startswith("| ")]
        rows = [r for r in rows if not all(set(c) <= set("-: ") for c in r)]
        if rows:
            out.append((title, rows[0], rows[1:]))
    return out


def _term_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The rich tables of a terminal output laid out wide enough that no cell wraps."""
    out, title, lines = [], "", text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("┏"):
            title = lines[i - 1].strip() if i and not lines[i - 1].startswith(("└", "│")) else ""
            out.append((title, [], []))
        elif line.startswith("┃"):
            out[-1][1].extend(c.strip() for c in line.strip("┃").split("┃"))
        elif line.startswith("│") and out:
            out[-1][2].append([c.strip() for c in line.strip().strip("│").split("│")])
    return out


class _Html(HTMLParser):
    """The HTML report's tables (with the h2 before each) and its charts' axis labels."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self.charts: list[tuple[str, str]] = []  # (aria-label, y label)
        self.h2, self._text, self._in, self._chart, self._ylabel = "", "", None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("h2", "th", "td"):
            self._in, self._text = tag, ""
        elif tag == "table":
            self.tables.append((self.h2, [], []))
        elif tag == "tr" and self.tables:
            self.tables[-1][2].append([])
        elif tag == "svg":
            self._chart = a.get("aria-label", "")
        elif tag == "text" and "rotate(-90" in (a.get("transform") or ""):
            self._ylabel, self._text = True, ""

    def handle_data(self, data):
        self._text += data

    def handle_endtag(self, tag):
        if tag == "h2" and self._in == "h2":
            self.h2 = self._text.strip()
        elif tag == "th":
            self.tables[-1][1].append(self._text.strip())
        elif tag == "td":
            self.tables[-1][2][-1].append(self._text.strip())
        elif tag == "text" and self._ylabel:
            self.charts.append((self._chart, self._text.strip()))
            self._ylabel = False
        if tag in ("h2", "th", "td"):
            self._in = None


def _units_seen(found: list[tuple[str, list[str], list[list[str]]]]) -> list[tuple[str, str, str]]:
    """(where, metric, unit) for every place a table names a metric's unit: a 'metric (unit)' cell, a metric or
    series column beside a unit column, a per-trial title 'Per trial: NAME (UNIT)' and its 'ARM UNIT' columns."""
    seen = []
    for title, cols, rows in found:
        m = re.fullmatch(r"Per trial: (\S+) \((.+)\)", title)
        if m:
            seen.append((title, m.group(1), m.group(2)))
            seen += [(title, m.group(1), c.split(" ", 1)[1]) for c in cols[1:]]
        name = "metric" if "metric" in cols else "series" if "series" in cols else None
        if name is None:
            continue
        for row in (r for r in rows if len(r) == len(cols)):
            cell = row[cols.index(name)]
            if "unit" in cols:
                seen.append((title, cell, row[cols.index("unit")]))
            elif re.fullmatch(r"\S+ \(.+\)", cell):
                metric, unit = cell.split(" ", 1)
                seen.append((title, metric, unit[1:-1]))
    return seen


def _one_unit_each(seen: list[tuple[str, str, str]], what: str) -> dict[str, str]:
    units: dict[str, set[str]] = {}
    for _, metric, unit in seen:
        units.setdefault(metric, set()).add(unit)
    assert all(len(u) == 1 for u in units.values()), (what, units, seen)
    chosen = {metric: u.pop() for metric, u in units.items()}
    for metric, own in OWN.items():  # a name that carries a unit is shown in it, never under µs, ms or s beside it
        assert chosen.get(metric, own) == own, (what, metric, chosen)
    return chosen


def _ratio_cells(found) -> list[tuple[str, str]]:
    """(ratio cell, tested-as cell) of each verdict row."""
    out = []
    for title, cols, rows in found:
        if title.startswith("Verdict") and "ratio" in cols:
            out += [(r[cols.index("ratio")], r[cols.index("tested as")]) for r in rows if len(r) == len(cols)]
    return out


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """A real compare of two arms, interleaved (so paired), and its report in every format."""
    from conftest import run_cli

    work = tmp_path_factory.mktemp("units")
    (work / "job.py").write_text(JOB)
    job = f"{sys.executable} {work / 'job.py'}"
    live = run_cli("compare", "command", "--trials", "3", "--quiet", "--store", "u.db", "--parser", "jsonl",
                   "--headline", "latency", "--arm", f"a:argv={job} 0.9 {work / 'n'}",
                   "--arm", f"b:argv={job} 1.1 {work / 'n'}", "--", *job.split(), "1", str(work / "n"),
                   cwd=work, COLUMNS="260")
    assert live.returncode == 0, live.stderr[-3000:]
    ident = live.stdout.rsplit("stored as experiment ", 1)[1].split()[0]
    out = {"live": live.stdout}
    for fmt in ("term", "md", "html", "json"):
        r = run_cli("report", ident, "--store", "u.db", "--format", fmt, cwd=work, COLUMNS="260")
        assert r.returncode == 0, r.stderr[-3000:]
        out[fmt] = r.stdout
    for args in (["results", "show", ident], ["results", "show", ident, "--json"]):
        r = run_cli(*args, "--store", "u.db", cwd=work, COLUMNS="260")
        assert r.returncode == 0, r.stderr[-3000:]
        out["show-json" if "--json" in args else "show"] = r.stdout
    return out


def test_one_metric_has_one_unit_in_every_table_and_format_of_a_report(ran):
    html = _Html()
    html.feed(ran["html"])
    found = {"term": _term_tables(ran["term"]), "md": _md_tables(ran["md"]), "html": html.tables}
    seen = {fmt: _units_seen(t) for fmt, t in found.items()}
    for fmt, t in found.items():
        assert {m for _, m, _ in seen[fmt]} == METRICS, (fmt, seen[fmt])  # every metric was found, in each format
        assert {title.split(":")[0] for title, _, _ in t} >= {"Verdict", "Per trial"}, fmt
    # the HTML's charts: the headline's figure per trial and per step, in the tables' unit
    charts = [(label.split(" ")[0], unit) for label, unit in html.charts if label.startswith("latency ")]
    assert len(charts) == 2, html.charts
    # results show: the headline's figure per trial, beside its unit
    show = _term_tables(ran["show"])[0]
    primary = next(iter(json.loads(ran["show-json"])[0]["summary"]))
    shown = [(show[0], primary, row[show[1].index("unit")]) for row in show[2]]
    everywhere = [x for v in seen.values() for x in v] + [("html chart", m, u) for m, u in charts] + shown
    report = _one_unit_each(everywhere, "one report: term, md, html, results show")
    assert report == {"latency": "ms", "latency_p95_ms": "ms", "step_time": "ms", "wall_time_s": "s"}


def test_a_live_run_keeps_the_unit_its_first_trial_line_chose(ran):
    """The live terminal is one report too: its trial lines, the trials' tables and the verdicts' tables."""
    lines = re.findall(r"^trial \d+ \[\w+\] \([^)]*\): [\d,.]+ (\S+) \+/-", ran["live"], re.M)
    assert len(lines) == 6, ran["live"]
    seen = _units_seen(_term_tables(ran["live"])) + [("trial line", "latency", u) for u in lines]
    chosen = _one_unit_each(seen, "live terminal")
    assert set(chosen) == METRICS and chosen["latency"] == lines[0]


def test_the_paired_ratio_names_its_statistic_and_the_ratio_of_the_means(ran):
    rows = json.loads(ran["json"])["verdicts"]
    assert rows and all(v["method"] == "paired" for v in rows)
    html = _Html()
    html.feed(ran["html"])
    for fmt, found in (("term", _term_tables(ran["term"])), ("md", _md_tables(ran["md"])), ("html", html.tables),
                       ("live", _term_tables(ran["live"]))):
        cells = _ratio_cells(found)
        assert len(cells) == len(rows), (fmt, cells)
        for (cell, how), v in zip(cells, rows):
            assert cell.startswith(f"{v['ratio']:.3f}× (geometric mean of {v['n_pairs']} rounds"), (fmt, cell)
            assert "paired, 3 rounds" in how
            of_means = f"{v['mean_b'] / v['mean_a']:.3f}×"
            assert (f"; of the means {of_means})" in cell) == (of_means != f"{v['ratio']:.3f}×"), (fmt, cell, v)
    assert any("of the means" in cell for cell, _ in _ratio_cells(_md_tables(ran["md"])))  # the case seen


def test_the_ratio_cell_of_the_issue():
    """`a mean: 678.0, arm mean: 622.0, ratio: 0.980×` (paired): the row says which ratio it is."""
    v = MetricVerdict(5, 5, 0.02, 0.95, "lower", ("faster", "slower"), 0.05, 0.05, metric="latency_p95_ms", unit="ms",
                      arm="b", baseline="a")
    v.mean_a, v.mean_b, v.ratio, v.method, v.n_pairs = 678.0, 622.0, 0.980, "paired", 5
    assert tables.ratio_cell(v) == "0.980× (geometric mean of 5 rounds; of the means 0.917×)"
    v.ratio = 0.9174
    assert tables.ratio_cell(v) == "0.917× (geometric mean of 5 rounds)"
    v.method, v.ratio = "unpaired", 622.0 / 678.0
    assert tables.ratio_cell(v) == "0.917×"  # the ratio of the means beside them: nothing to explain


def test_a_name_with_a_unit_is_shown_in_it_and_the_choice_is_made_once():
    assert numbers.choose_unit("wall_time_s", "s", [0.5631]) == (1.0, "s")  # was 'wall_time_s (ms) 563.1'
    assert numbers.choose_unit("latency_avg_ms", "ms", [0.416]) == (1.0, "ms")  # was 'latency_avg_ms (µs) 416.0'
    assert numbers.choose_unit("fetch_ms", "s", [0.5]) == (1e3, "ms")  # a declared unit of its kind is converted
    assert numbers.choose_unit("gemm/time_us", "us", [3.0]) == (1.0, "us")
    assert numbers.choose_unit("step_time", "s", [0.5, 0.9]) == (1e3, "ms")  # no unit in the name: scaled
    assert numbers.choose_unit("events_per_sec", "events/sec", [0.5]) == (1.0, "events/sec")  # a rate
    assert numbers.name_unit("bogo_ops_per_sec") is None and numbers.name_unit("peak_mib") == "MiB"
    units = numbers.Units()
    assert units.of("step_time", "s", [0.5]) == (1e3, "ms")
    assert units.of("step_time", "s", [1.5, 2.0]) == (1e3, "ms")  # kept: one unit for the whole report
    assert units.scaled("step_time", "s", [1.5, None]) == ([1500.0, None], "ms")
    assert units.of("main", "ops/sec") == (1.0, "ops/sec") and units.of("main", "steps/sec") == (1.0, "steps/sec")
