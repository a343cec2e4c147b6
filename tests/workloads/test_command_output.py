"""A command's output read to its end, and the time a --metric regex may take (docs/command.md, "Output").

Real gpuvs runs of real programs on the host, wrapped and bare, beside real processes that keep the CPU busy."""

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import gpuvs_processes

LINES = 300_000
# a job that prints as fast as Python can: LINES progress lines, then its final figure
LOSSY = ("import sys\nw = sys.stdout.write\nn = int(sys.argv[1])\nfor i in range(1, n + 1):\n"
         "    w(f'progress rate {i}\\n')\nw(f'final rate {n}\\n')\n")


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert gpuvs_processes() == []


@pytest.fixture
def burners():
    """Two processes that keep two cores busy while the test runs (this machine's two, and more)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def stored(tmp_path):
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    trials = db.execute("SELECT id, status, error, error_kind, summary FROM trials ORDER BY id").fetchall()
    out = []
    for tid, status, error, kind, summary in trials:
        samples = dict(db.execute("SELECT series, COUNT(*) FROM samples WHERE trial_id = ? GROUP BY series", (tid,)))
        outputs = {s: (b, n) for s, b, n in db.execute("SELECT stream, bytes, lines FROM outputs WHERE trial_id = ?",
                                                        (tid,))}
        out.append({"status": status, "error": error, "kind": kind, "samples": samples, "outputs": outputs,
                    "summary": json.loads(summary) if summary else {}})
    return out


@pytest.mark.parametrize("bare, lines", [(False, LINES), (True, 50_000)])
def test_every_line_of_a_fast_writer_reaches_the_parsers_on_a_loaded_machine(cli, tmp_path, burners, bare, lines):
    (tmp_path / "lossy.py").write_text(LOSSY)
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--metric", "rate=rate ([0-9]+),higher",
            *(["--bare"] if bare else []), "--", sys.executable, "lossy.py", str(lines), timeout=600)
    assert r.returncode == 0, r.stderr
    [t] = stored(tmp_path)
    assert t["status"] == "ok", t["error"]
    assert t["summary"]["rate"]["value"] == lines  # the final figure, not a progress line's
    assert t["summary"]["rate"]["n"] == lines + 1  # every line's reading reached the summary
    assert t["samples"]["rate"] in (20_000, 20_001)  # the first 10,000, 10,000 drawn from the rest, and the last
    size = sum(len(f"progress rate {i}\n") for i in range(1, lines + 1)) + len(f"final rate {lines}\n")
    assert t["outputs"]["stdout"] == (size, lines + 1)  # every byte and line counted


@pytest.mark.parametrize("bare", [False, True])
def test_an_output_held_open_by_a_process_left_behind_fails_the_trial_saying_so(cli, tmp_path, bare):
    """What the command leaves in the background is ended at its exit (its keeper, contain.py), so its output
    reaches its end at once and the trial stands; a process outside its tree that holds its stdout (here one that
    opens the job's /proc/PID/fd/1) keeps the pipe open: gpuvs waits 2 s of silence, not the holder's minute, and
    the trial fails saying so (a partial read is never a result)."""
    t0 = time.monotonic()
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--metric", "rate=rate ([0-9]+),higher",
            *(["--bare"] if bare else []), "--", "sh", "-c", "echo rate 5; sleep 60 &")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30  # the left child was ended, not waited for
    [t] = stored(tmp_path)
    assert t["status"] == "ok" and t["summary"]["rate"]["value"] == 5
    pidfile = tmp_path / "job.pid"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import os, pathlib, time
p = pathlib.Path({str(pidfile)!r})
while not p.exists() or not p.read_text().strip():
    time.sleep(0.02)
fd = os.open(f"/proc/{{p.read_text().strip()}}/fd/1", os.O_WRONLY)
time.sleep(60)
"""])
    try:
        t0 = time.monotonic()
        r = cli("run", "command", "--device", "cpu", "--trials", "1", "--metric", "rate=rate ([0-9]+),higher",
                *(["--bare"] if bare else []), "--", "sh", "-c", f"echo rate 5; echo $$ > {pidfile}; sleep 2")
        assert r.returncode != 0
        assert time.monotonic() - t0 < 30  # the bounded wait, not the holder's minute
        t = stored(tmp_path)[-1]
        assert t["status"] == "failed"
        assert t["error"].startswith("gpuvs could not read the command's output to its end: the command exited after ")
        assert "its stdout stayed open and silent 2 s later" in t["error"]
    finally:
        holder.kill()
        holder.wait()


def test_a_nested_quantifier_is_refused_before_anything_starts(cli, tmp_path):
    t0 = time.monotonic()
    r = cli("run", "command", "--device", "cpu", "--metric", "x=(a+)+b,higher", "--", "echo", "a" * 40)
    assert r.returncode == 2
    assert time.monotonic() - t0 < 15
    assert r.stderr.strip().splitlines() == [
        "gpuvs: error: --metric 'x=(a+)+b,higher': the regex '(a+)+b' repeats a repeat (a nested quantifier such as "
        "(a+)+), which can match the same text in many ways: on a line that almost matches, Python's re tries every "
        "way, for hours; repeat one thing, e.g. '([0-9]+)' rather than '([0-9]+)+' (expected "
        "NAME=REGEX,higher|lower|rate|time[,UNIT])"]
    assert not (tmp_path / "gpuvs.db").exists() or stored(tmp_path) == []


@pytest.mark.parametrize("bare", [False, True])
def test_a_regex_that_backtracks_is_stopped_within_its_budget_and_named(cli, tmp_path, bare):
    """(a|a)*b has no nested quantifier, but on a line of 40 a's Python's re would try 2**40 ways: the match is
    stopped after 1 s of CPU (wrapped: interrupted) and the trial fails naming the regex, as bad input (no retry),
    not the command. Bare, gpuvs reads the job in a thread of its own and matches with the `regex` module, which
    does not try the 2**40 ways and stops a match at its time budget: the figure is simply not found there."""
    line = "a" * 40
    t0 = time.monotonic()
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--timeout", "60", "--retries", "2",
            "--metric", "x=(a|a)*b(1),higher", *(["--bare"] if bare else []), "--", "echo", line)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 30  # not hours
    t = stored(tmp_path)[-1]  # bare, a missing metric is retried (--retries 2); the budget's failure is not
    assert t["status"] == "failed"
    if not bare:
        assert len(stored(tmp_path)) == 1 and t["kind"] == "input"
        assert t["error"].startswith("metric x: its regex '(a|a)*b(1)' took over 1 s of CPU on stdout line 1 "
                                     f"({len(line)} characters) and was stopped: it backtracks")
    else:  # no line matched: the metric is missing, named
        assert "metric x" in t["error"] and "(a|a)*b(1)" in t["error"]


@pytest.mark.parametrize("parser, text, printed", [
    (["--metric", r"rate=rate (\S+),higher"], "final rate nan", "'nan'"),
    (["--metric", r"rate=rate (\S+),higher"], "final rate -inf", "'-inf'"),
    (["--parser", "jsonl"], '{"gpuvs": "rate", "value": NaN}', "NaN"),
    (["--parser", "jsonl"], '{"gpuvs": "rate", "value": 1e400}', "1e400"),
])
def test_a_figure_that_is_not_a_finite_number_fails_the_trial_naming_it(cli, tmp_path, parser, text, printed):
    """The job's last figure is nan (or an infinity): never replaced by an earlier line's figure, the trial fails
    saying which metric printed what."""
    first = '{"gpuvs": "rate", "value": 5, "better": "higher"}' if "jsonl" in parser else "progress rate 5"
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--retries", "0", *parser, "--",
            "printf", "%s\\n%s\\n", first, text)
    assert r.returncode != 0
    [t] = stored(tmp_path)
    assert t["status"] == "failed", t  # a failed trial: its figures never count (what was read is kept)
    assert "not a finite number" in t["error"] and printed in t["error"] and "rate" in t["error"], t["error"]


# a job that writes one short line per system call, as fast as it can (issue 44: gpuvs's reader made it wait)
CHATTY = "import os, sys\nfor i in range(int(sys.argv[1])):\n    os.write(1, b'value: %d\\n' % i)\n"


def through_cat(argv: list[str], repeats: int = 3) -> float:
    """The median wall time of `argv | cat > /dev/null`, launch to the pipeline's end."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        job = subprocess.Popen(argv, stdout=subprocess.PIPE)
        cat = subprocess.Popen(["cat"], stdin=job.stdout, stdout=subprocess.DEVNULL)
        job.stdout.close()
        job.wait()
        cat.wait()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def trial_row(tmp_path, *columns):
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    row = db.execute(f"SELECT {', '.join(columns)} FROM trials ORDER BY id DESC").fetchone()
    return [json.loads(v) if c in ("summary", "config", "startup") and v else v for c, v in zip(columns, row)]


@pytest.mark.parametrize("bare", [False, True])
def test_a_chatty_job_runs_under_gpuvs_as_fast_as_through_cat(cli, tmp_path, bare):
    """300,000 writes of one short line each: gpuvs reads the pipe into a queue that spills to a file rather than
    make the job wait, so the job's wall time is what it is through `| cat` (issue 44: 3.1 s against 0.5 s)."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    argv = [sys.executable, str(tmp_path / "chatty.py"), "300000"]
    cat_s = through_cat(argv)
    r = cli("run", "command", "--device", "cpu", "--trials", "1", *(["--bare"] if bare else []), "--", *argv)
    assert r.returncode == 0, r.stderr
    status, summary, config = trial_row(tmp_path, "status", "summary", "config")
    assert status == "ok"
    wall_s = summary["wall_time_s"]["value"]
    assert wall_s < 1.5 * cat_s + 0.25, (wall_s, cat_s, config.get("output_pipe_full"))
    assert sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT lines FROM outputs WHERE stream = 'stdout'"
                                                          ).fetchone() == (300000,)


@pytest.mark.parametrize("bare, lines", [(False, 200_000), (True, 30_000)])
def test_a_long_series_is_stored_in_bounded_space_and_summarised_over_all_its_values(cli, tmp_path, bare, lines):
    """Every matched line is a sample, but a series stores its first 10,000 and 10,000 drawn from the rest (and
    its last); its count, mean and +/- are over every value, and the trial says what was kept."""
    values = [(i * 7919) % 1000 / 10 for i in range(lines)]
    (tmp_path / "steps.txt").write_text("".join(f"step loss: {v}\n" for v in values))
    t0 = time.monotonic()
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--step-metric", r"loss=loss: ([0-9.]+),lower",
            *(["--bare"] if bare else []), "--", "cat", "steps.txt")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    [t] = stored(tmp_path)
    assert t["status"] == "ok", t["error"]
    loss = t["summary"]["loss"]
    assert loss["n"] == lines and loss["kept"] == t["samples"]["loss"]
    assert loss["kept"] in (20_000, 20_001)  # the last one is kept, if the draw did not take it already
    assert loss["mean"] == pytest.approx(sum(values) / lines, rel=1e-12)
    assert loss["value"] == loss["mean"] and loss["min"] == min(values) and loss["max"] == max(values)
    sd = (sum((v - loss["mean"]) ** 2 for v in values) / (lines - 1)) ** 0.5
    assert loss["pm"] == pytest.approx(sd / lines ** 0.5, rel=1e-9)
    [config] = trial_row(tmp_path, "config")
    assert config["samples_kept"] == (f"loss: kept {loss['kept']:,} of {lines:,} samples (the first 10,000, then 10,000 drawn "
                                      "uniformly from the rest, and the last)")
    [(experiment,)] = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT id FROM experiments").fetchall()
    shown = cli("results", "show", experiment, "--log")
    assert f"samples: {config['samples_kept']}" in shown.stdout, shown.stdout[:2000]
    assert (tmp_path / "gpuvs.db").stat().st_size < 8 * 2**20
    assert took < 60  # the store's rows and the terminal's step lines are bounded too (issue 44: 12.7 s at 200k)


@pytest.mark.parametrize("bare", [False, True])
def test_bytes_that_are_not_utf8_are_kept_and_shown_as_escapes(cli, tmp_path, bare):
    """b'\\xff\\xfe' is stored as the escapes \\xff\\xfe (what the docs promise), never as U+FFFD, and shown so."""
    r = cli("run", "command", "--device", "cpu", "--trials", "1", *(["--bare"] if bare else []), "--",
            sys.executable, "-c", "import os; os.write(1, b'a\\xff\\xfeb\\n')")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    [(text,)] = db.execute("SELECT text FROM outputs WHERE stream = 'stdout'").fetchall()
    assert text == "a\\xff\\xfeb\n"
    [(experiment,)] = db.execute("SELECT id FROM experiments").fetchall()
    shown = cli("results", "show", experiment, "--log")
    assert shown.returncode == 0, shown.stderr
    assert "a\\xff\\xfeb" in shown.stdout and "\ufffd" not in shown.stdout


def test_a_regex_slow_on_every_line_is_stopped_by_the_trials_budget_and_named(cli, tmp_path):
    """(a|a)*b(1) takes about 0.06 s on a line of 19 a's: under the line's 1 s, but 200 lines would take 12 s and
    the trial's timeout would blame the command. A regex's total time on a trial is bounded (2 s, or 1 ms a line):
    the trial fails at once naming the regex, as bad input."""
    (tmp_path / "a.txt").write_text(("a" * 19 + "\n") * 200)
    t0 = time.monotonic()
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--timeout", "8", "--retries", "0",
            "--metric", "x=(a|a)*b(1),higher", "--", "cat", "a.txt")
    assert r.returncode != 0
    assert time.monotonic() - t0 < 30
    [t] = stored(tmp_path)
    assert t["status"] == "failed" and t["kind"] == "input", t
    assert "timed out" not in t["error"]
    assert t["error"].startswith("metric x: its regex '(a|a)*b(1)' took "), t["error"]
    assert "a trial's matching gets 2 s, or 1 ms a line) and was stopped: it backtracks" in t["error"]


@pytest.mark.parametrize("bare", [False, True])
def test_a_metric_missing_past_a_line_cut_at_1_mib_says_the_line_was_cut(cli, tmp_path, bare):
    """A line over 1 MiB reaches the parsers as its first MiB: a figure past the cut is never read, and the trial's
    failure says so rather than only that the metric never appeared."""
    (tmp_path / "long.py").write_text("import sys\nsys.stdout.write('start\\nnoise\\n' + 'x' * (2 * 2**20 + 100000) "
                                      "+ ' value: 5\\n')\n")
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--retries", "0", "--metric",
            r"v=value: ([0-9]+),higher", *(["--bare"] if bare else []), "--", sys.executable, "long.py")
    assert r.returncode != 0
    [t] = stored(tmp_path)
    assert t["status"] == "failed"
    assert t["error"].startswith("metric v (regex 'value: ([0-9]+)') never appeared; line 3 of stdout was 2.1 MiB, "
                                 "cut at 1 MiB: a metric past the cut is not read; last lines: "), t["error"]
