r"""Names and parameters as the reports show them, from one real `gpuvs compare command` run.

A zero-width character in an arm's name is a visible escape in every format (`base` and `base\u200b` read apart).
A name that starts as a spreadsheet formula is neutralised in both CSVs (OWASP's rule: a leading quote).
The markdown report's `parameters:` line reads back, through a CommonMark parser, as the regex was written."""

from __future__ import annotations

import csv
import html
import io
import re
import subprocess
import sys

import pytest
from markdown_it import MarkdownIt

from conftest import gpuvs_env
from gpuvs.safetext import safe_text

ZW = "base\u200b"
FORMULAS = ("@SUM(A1)", "+1+cmd|'/C/calc'!A0", "-2+3")  # a name cannot hold "=" (parse_arm)
INVISIBLE = ("\u200b", "\u200d", "\u2060", "\ufeff", "\u202e", "\u2066", "\u00ad", "\U000e0041")


def gpuvs(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuvs", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=gpuvs_env(), timeout=300)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One trial of each arm; the job prints a figure the regex (\\d+) reads."""
    folder = tmp_path_factory.mktemp("names")
    arms = [f"--arm=base:env_var=ARM=0", f"--arm={ZW}:env_var=ARM=1",
            *[f"--arm={name}:env_var=ARM={i + 2}" for i, name in enumerate(FORMULAS)]]
    r = gpuvs("compare", "command", "--device", "cpu", "--trials", "1", "--metric", r"v=value: (\d+),higher", *arms,
              "--", "sh", "-c", "echo value: 3", cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    ident = re.search(r"experiment (\S+) \(gpuvs report", r.stdout).group(1)
    return folder, ident, r


def test_zero_width_and_bidi_characters_are_escaped():
    assert [safe_text(f"a{ch}b") for ch in INVISIBLE] == [f"a{ch.encode('unicode_escape').decode()}b"
                                                          for ch in INVISIBLE]
    assert safe_text("\u00ad\U000e0041") == "\\xad\\U000e0041"
    assert safe_text("café 中文 ✓ e\u0301") == "café 中文 ✓ e\u0301"  # letters and combining marks stay


def test_an_arm_named_with_a_zero_width_space_reads_apart_in_every_format(ran):
    folder, ident, r = ran
    assert ZW not in r.stdout + r.stderr and "base\\u200b" in r.stdout
    for fmt in ("term", "md", "html", "json", "csv"):
        out = gpuvs("report", ident, "--format", fmt, cwd=folder)
        assert out.returncode == 0, out.stderr
        assert "\u200b" not in out.stdout, fmt
        want = "base\\\\u200b" if fmt == "md" else "base\\u200b"  # markdown doubles a backslash; JSON's own escape
        assert want in out.stdout, (fmt, out.stdout[:3000])
    both = gpuvs("compare", "--stored", f"{ident}:base", f"{ident}:{ZW}", cwd=folder)
    assert both.returncode == 0 and "\u200b" not in both.stdout + both.stderr, both.stdout + both.stderr
    assert f"experiment {ident}, arm base\\u200b" in both.stdout, both.stdout
    md = gpuvs("report", ident, "--format", "md", cwd=folder).stdout
    shown = html.unescape(re.sub(r"<[^>]+>", "", MarkdownIt("commonmark").render(md)))
    assert "whether base\\u200b differs from base on wall_time_s" in shown, shown[:2000]


def test_the_markdown_parameters_line_reads_back_as_the_regex_was_written(ran):
    folder, ident, _ = ran
    md = gpuvs("report", ident, "--format", "md", cwd=folder).stdout
    items = re.findall(r"<li>(.*?)</li>", MarkdownIt("commonmark").render(md), re.S)
    (params,) = [html.unescape(i) for i in items if i.startswith("parameters:")]
    assert r"metric=['v=value: (\d+),higher']" in params, params
    assert "argv=[sh, -c, 'echo value: 3']" in params, params
    term = gpuvs("report", ident, cwd=folder).stdout
    assert r"(\d+)" in term and r"(\\d+)" not in term


@pytest.mark.parametrize("command", [["results", "export", "--format", "csv"],
                                     ["report", "{ident}", "--format", "csv"]])
def test_csv_cells_that_start_as_a_formula_get_a_leading_quote(ran, command):
    folder, ident, _ = ran
    r = gpuvs(*[c.format(ident=ident) for c in command], cwd=folder)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    arms = {row["arm"] for row in rows}
    assert arms == {"base", "base\\u200b", *("'" + name for name in FORMULAS)}, arms
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "@", "\t", "\r")), row
            assert not value.startswith("-") or re.fullmatch(r"-[\d.]+(e[+-]?\d+)?", value), row
    assert {row["value"] for row in rows if row["series"] == "v"} == {"3.0"}  # numbers stay numbers


def test_a_number_written_as_text_is_not_quoted():
    from gpuvs.safetext import csv_cell

    assert [csv_cell(t) for t in ("-1.5", "+3e2", "-.5", "1", "-", "-x", "@", "=A1", "\tx", "a=b")] == [
        "-1.5", "+3e2", "-.5", "1", "'-", "'-x", "'@", "'=A1", "'\tx", "a=b"]
