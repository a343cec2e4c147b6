"""What a job wrote never reaches the terminal raw (safetext.py): a hostile command run for real through `gpuvs run`.

Its trial line, its error, `results show` and `gpuvs report` in every format show its control characters escaped.
The store keeps the bytes as the job wrote them; markdown's `- command:` span reads back as the command."""

from __future__ import annotations

import html
import json
import re
import sqlite3
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from conftest import gpuvs_env
from gpuvs.safetext import clip, safe_text

EVIL = r"""
import sys
sys.stdout.write("\x1b]0;PWNED-TITLE\x07")           # the window's title
sys.stdout.write("\x1b[2J")                          # clear the screen
sys.stdout.write("\x1b]52;c;ZXZpbA==\x07")           # OSC 52: write the clipboard
sys.stdout.write("nul:\x00:del:\x7f:c1:\x9b31m [red]x[/red] [/] end\n")
sys.stdout.flush()
sys.stderr.buffer.write(b"bad utf-8: \xff\xfe [bold]b[/bold] \x1b[31mred\n")
sys.exit(3)
"""
RAW = (b"\x1b", b"\x00", b"\x07", b"\x7f", "\x9b".encode())  # ESC, NUL, BEL, DEL, CSI (C1) as UTF-8


def gpuvs(*args, cwd) -> subprocess.CompletedProcess:
    """`python -m gpuvs ARGS` for real, its output as bytes: what a terminal would be sent."""
    return subprocess.run([sys.executable, "-m", "gpuvs", *map(str, args)], capture_output=True, cwd=cwd,
                          env=gpuvs_env(), timeout=300)


def assert_no_raw_controls(data: bytes, where: str) -> None:
    for raw in RAW:
        assert raw not in data, f"{where}: raw {raw!r} in {data[:2000]!r}"


def test_safe_text_writes_controls_as_visible_escapes():
    assert safe_text("a\x1b]0;t\x07b\x00c\x7fd\x9be") == "a\\x1b]0;t\\x07b\\x00c\\x7fd\\x9be"
    assert safe_text("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert safe_text("one\ntwo\tthree\r", lines=True) == "one\ntwo\tthree\\r"  # a log keeps its lines
    assert safe_text(b"ok \xff\xfe \xe2\x82\xac") == "ok \\xff\\xfe €"  # undecodable bytes shown as bytes
    assert safe_text("lone \ud800 surrogate \udcff") == "lone \\ud800 surrogate \\xff"
    assert safe_text("abc\u202edcba \u2028") == "abc\\u202edcba \\u2028"  # a bidi override, a line separator
    assert safe_text("C:\\path [red]x[/red] é 中文 ✓") == "C:\\path [red]x[/red] é 中文 ✓"  # the rest as it was
    assert safe_text(42) == "42"


@settings(deadline=None)  # two shared cores: a slow example is no failure
@given(st.text())
def test_safe_text_leaves_nothing_a_terminal_acts_on_and_is_idempotent(text):
    shown = safe_text(text, lines=True)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]", shown)
    assert safe_text(shown, lines=True) == shown
    shown.encode("utf-8")  # printable on any UTF-8 terminal: no lone surrogate left


def test_clip_keeps_whole_words_and_marks_a_cut():
    assert clip("status 3 [red]x[/red] end", 100) == "status 3 [red]x[/red] end"
    assert clip("status 3 [red]x[/red] end", 16) == "status 3 …"  # never "[red]x[/r"
    assert clip("1.234567 ms", 6) == "1.2345 …"  # one word longer than the limit alone is cut, and marked
    assert clip("a" * 10, 10) == "a" * 10


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory):
    """The failing command, run once for real: (folder, store, experiment id, `gpuvs run`'s result)."""
    folder = tmp_path_factory.mktemp("evil")
    (folder / "evil.py").write_text(EVIL)
    store = folder / "gpuvs.db"
    r = gpuvs("run", "command", "--device", "cpu", "--store", store, "--", sys.executable, "evil.py", cwd=folder)
    assert r.returncode == 1, r.stderr.decode(errors="replace")
    ident = re.search(rb"stored as experiment (\S+)", r.stdout).group(1).decode()
    return folder, store, ident, r


def test_a_failing_jobs_escape_sequences_reach_no_terminal(evil_run):
    folder, store, ident, r = evil_run
    assert_no_raw_controls(r.stdout, "gpuvs run's output")
    assert_no_raw_controls(r.stderr, "gpuvs run's error line")
    flat = b" ".join(r.stdout.split())
    assert rb"stdout: \x1b]0;PWNED-TITLE\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07nul:\x00:del:\x7f:c1:\x9b31m" in flat
    assert b"[red]x[/red] [/] end" in flat  # rich markup shown as written, never applied
    # the failing run's one line: its first 160 characters, the job's stdout or stderr first (pipes race)
    assert re.search(rb"last lines: std(out|err): (\\x1b\]0;PWNED-TITLE|bad utf-8: .*\\x1b\[31mred)", r.stderr), r.stderr
    assert b"FAILED: the command exited with status 3" in r.stdout  # the trial line
    assert "stderr: bad utf-8: \\xff\\xfe [bold]b[/bold] \\x1b[31mred".encode() in b" ".join(r.stdout.split())

    # the store keeps what the job wrote: escaping is for showing only
    with sqlite3.connect(store) as db:
        kept = dict(db.execute("select stream, text from outputs"))
    assert kept["stdout"].startswith("\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07nul:\x00:del:\x7f:c1:\x9b31m")
    assert "\x1b[31mred" in kept["stderr"]

    log = gpuvs("results", "show", ident, "--log", "--store", store, cwd=folder)
    assert log.returncode == 0, log.stderr
    assert_no_raw_controls(log.stdout, "results show --log")
    assert (rb"--- stdout (" in log.stdout and
            rb"\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07nul:\x00:del:\x7f:c1:\x9b31m [red]x[/red] [/] end"
            b"\n" in log.stdout)
    assert "bad utf-8: \\xff\\xfe [bold]b[/bold] \\x1b[31mred\n".encode() in log.stdout  # stored as its escapes

    shown = gpuvs("results", "show", ident, "--store", store, cwd=folder)
    assert shown.returncode == 0, shown.stderr
    assert_no_raw_controls(shown.stdout, "results show")
    assert rb"\x1b" in shown.stdout  # its error column: the first 120 characters, escaped


@pytest.mark.parametrize("fmt", ["term", "md", "html"])
def test_the_report_shows_a_jobs_controls_escaped_even_from_a_store_that_kept_them_raw(evil_run, fmt):
    folder, store, ident, _ = evil_run
    # an error stored raw, as an older gpuvs, an engine's or a pod's message would have kept it
    raw_store = folder / f"raw-{fmt}.db"
    with sqlite3.connect(store) as src, sqlite3.connect(raw_store) as dst:
        src.backup(dst)
        dst.execute("update trials set error = ?", ("pod said \x1b]0;TITLE\x07\x1b[2J\x00 [red]x[/red]",))
    for path, escaped in ((store, rb"\x1b]0;PWNED-TITLE\x07\x1b[2J"), (raw_store, rb"pod said \x1b]0;TITLE\x07")):
        r = gpuvs("report", ident, "--format", fmt, "--store", path, cwd=folder)
        assert r.returncode == 0, r.stderr
        assert_no_raw_controls(r.stdout, f"report --format {fmt}")
        text = b"".join(r.stdout.split())
        if fmt == "md":
            escaped = escaped.replace(b"\\", b"\\\\")  # a markdown cell doubles a backslash, to read as one
        assert b"".join(escaped.split()) in text, r.stdout
        assert b"[red]x[/red]" in text
    for path in (store, raw_store):  # results show says the same of the raw one
        r = gpuvs("results", "show", ident, "--store", path, cwd=folder)
        assert_no_raw_controls(r.stdout, "results show")
        r = gpuvs("results", "show", ident, "--log", "--store", path, cwd=folder)
        assert_no_raw_controls(r.stdout, "results show --log")


def code_of(markdown: str) -> list[str]:
    """The text of every inline code span, as a CommonMark parser reads it."""
    rendered = MarkdownIt("commonmark").render(markdown)
    return [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", rendered, re.S)]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="`ab \\*_|<>\x1b\n", max_size=30).filter(lambda t: t.strip(" ")))
def test_a_code_span_reads_back_as_its_text(text):
    from gpuvs.report.markdown import code_span

    assert code_of(f"- command: {code_span(text)}\n") == [safe_text(text)]


def test_the_markdown_reports_command_line_keeps_backticks_in_its_code_span(tmp_path):
    script = "print('`date` and ``two`` ` ')"
    r = gpuvs("compare", "command", "--device", "cpu", "--trials", "1", "--arm", "a:env_var=ARM=a", "--arm",
              "b:env_var=ARM=b", "--", sys.executable, "-c", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ident = re.search(rb"experiment (\S+) \(gpuvs report", r.stdout).group(1).decode()
    md = gpuvs("report", ident, "--format", "md", cwd=tmp_path)
    assert md.returncode == 0, md.stderr
    (line,) = [ln for ln in md.stdout.decode().splitlines() if ln.startswith("- command: ")]
    as_json = json.loads(gpuvs("report", ident, "--format", "json", cwd=tmp_path).stdout)
    command = as_json["meta"]["command"]  # as stored: `gpuvs compare` and its argv, shell-quoted
    assert "`date`" in command and "``two``" in command
    assert code_of(line) == [command]


def test_csv_exports_show_a_jobs_controls_escaped_and_json_keeps_them(tmp_path):
    """`report --format csv` and `results export --format csv` print a job's text escaped (its error, the unit it
    declared on a JSON line); the JSON export keeps the text as stored (JSON writes controls as \\u escapes)."""
    script = ("import json, sys\n"
              "print(json.dumps({'gpuvs': 'rate', 'value': 5, 'better': 'higher', 'unit': 'r/s\\x1b[2J\\x00'}))\n"
              "sys.stdout.write('dying \\x1b]0;TITLE\\x07 nul:\\x00\\n')\n"
              "sys.exit(3)\n")
    (tmp_path / "job.py").write_text(script)
    store = tmp_path / "s.db"
    r = gpuvs("run", "command", "--device", "cpu", "--store", store, "--retries", "0", "--parser", "jsonl", "--",
              sys.executable, "job.py", cwd=tmp_path)
    assert r.returncode == 1, r.stderr.decode(errors="replace")
    ident = re.search(rb"stored as experiment (\S+)", r.stdout).group(1).decode()
    with sqlite3.connect(store) as db:  # an error stored raw, as an engine's or a pod's message would be kept
        db.execute("update trials set error = error || ?", (" pod said \x1b]0;TITLE\x07\x00",))
    for args in (["report", ident, "--format", "csv"], ["results", "export", "--format", "csv"]):
        out = gpuvs(*args, "--store", store, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert_no_raw_controls(out.stdout, " ".join(args))
        assert rb"r/s\x1b[2J\x00" in out.stdout and rb"pod said \x1b]0;TITLE\x07\x00" in out.stdout, out.stdout
    out = gpuvs("results", "export", "--format", "json", "--store", store, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert_no_raw_controls(out.stdout, "results export --format json")  # JSON escapes them itself
    text = json.dumps(json.loads(out.stdout))  # read back: the text as stored, written again
    assert '"r/s\\u001b[2J\\u0000"' in text and "pod said \\u001b]0;TITLE\\u0007\\u0000" in text, text[:3000]
