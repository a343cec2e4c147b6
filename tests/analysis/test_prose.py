"""Small words of the reports people read (issue 45, item 8), on real output.

A label's colon is followed by a space, and no empty parentheses stand where a unit is missing.
Counts in prose have thousands separators, and errors start lowercase as every other does."""

from __future__ import annotations

import io
import shutil

import golden
from rich.console import Console

from gpuvs.analysis import comparison
from gpuvs.report import tables, terminal
from gpuvs.store.db import Store


def _golden_analysis(tmp_path, name: str):
    shutil.copy(golden.STORE, tmp_path / "golden.db")
    with Store(tmp_path / "golden.db") as st:
        return comparison.from_store(st, golden.experiments(tmp_path / "golden.db")[name])


def test_every_header_label_is_followed_by_a_space_however_long(tmp_path):
    a = _golden_analysis(tmp_path, "golden-compare-nlp")
    console = Console(record=True, width=300, file=io.StringIO(), markup=False, highlight=False)
    terminal.comparison(console, a)
    text = console.export_text()
    labels = [label for label, _ in tables.header_lines(a)]
    assert "trial order seed (--order-seed)" in labels and max(map(len, labels)) >= 18
    for label in labels:
        line = next(ln for ln in text.splitlines() if ln.startswith(label + ":"))
        assert line[len(label) + 1] == " ", line
    assert "trial order seed (--order-seed): 18" in text


def _verdict(a, b):
    from gpuvs.analysis import stats
    from gpuvs.analysis.family import MetricVerdict

    return MetricVerdict.of(stats.compare_arms(a, b), metric="main", unit="images/sec", arm="b", baseline="a",
                            headline=True)


class _Arms:
    def __init__(self, a, b):
        from gpuvs.analysis import stats

        self.arms = [type("Arm", (), {"name": n, "summaries": {"main": stats.summarize_trials(v)}})()
                     for n, v in (("a", a), ("b", b))]


def test_counts_in_prose_carry_thousands_separators_as_the_tables_do():
    import numpy as np

    from gpuvs.trial.study import Look

    a = list(1000 * (1 + 0.3 * np.random.default_rng(1).standard_normal(20)))
    b = list(1003 * (1 + 0.3 * np.random.default_rng(101).standard_normal(20)))
    v = _verdict(a, b)
    assert v.verdict == "inconclusive" and v.trials_needed >= 1000, v.trials_needed
    assert tables.to_settle(v) == f"{v.trials_needed:,} per arm ({v.more_trials:,} more)"
    assert f"about {v.trials_needed:,} trials per arm would settle ±2%" in tables.verdict_sentence(v, _Arms(a, b))
    many = [1000 * (1 + 0.01 * x) for x in np.random.default_rng(7).standard_normal(1200)]
    same = _verdict(many, list(reversed(many)))
    assert tables.verdict_sentence(same, _Arms(many, many)).endswith("apart, 1,200 trials each)")
    assert terminal.look_line(Look("settled", 1200, 2000))[0] == "until-confident: settled after 1,200 trials per arm"
    assert terminal.look_line(Look("more", 1200, 2000, add=1000))[0].endswith("adding 1,000 per arm")


def test_a_figure_without_a_unit_is_never_shown_with_empty_parentheses(cli):
    import re

    r = cli("compare", "command", "--device", "cpu", "--trials", "2", "--step-metric", r"rate=value: (\d+),rate",
            "--arm", "a:env_var=X=1", "--arm", "b:env_var=X=2", "--quiet", "--", "sh", "-c",
            "echo value: $((3+X)); echo value: $((4+X))", COLUMNS="200")
    assert r.returncode == 0, r.stderr
    ident = re.search(r"experiment (\S+) \(gpuvs report", r.stdout).group(1)
    assert re.search(r"Per trial: rate *\n", r.stdout), r.stdout
    assert "()" not in r.stdout
    for fmt in ("term", "md", "html"):
        out = cli("report", ident, "--format", fmt, COLUMNS="200").stdout
        assert "Per trial: rate" in out and "()" not in out and "rate ()" not in out, fmt
