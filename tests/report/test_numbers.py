"""Figures are written by significant figures, never rounded to nothing (the issue's cases, as they read)."""

from __future__ import annotations

import re

from gpuvs.report import numbers, tables


def test_small_figures_keep_their_significant_digits_and_big_ones_their_integer_digits():
    assert [numbers.fmt(x) for x in (0.192, 0.235, 0.0123)] == ["0.192", "0.235", "0.0123"]  # not 0.2, 0.2, 0.0
    assert numbers.fmt(1048576.0) == "1,048,576"  # not 1.04858e+06
    assert numbers.fmt(3.46e6) == "3,460,000" and numbers.fmt(78861.6) == "78,861.6"
    assert numbers.fmt(1204.51) == "1,204.5" and numbers.fmt(None) == "-" and numbers.fmt(float("nan")) == "-"


def test_figures_side_by_side_get_the_digits_that_tell_them_apart():
    assert numbers.fmt_all([0.19231, 0.19249]) == ["0.1923", "0.1925"]  # both 0.192 alone
    assert numbers.fmt_all([244.61, 114.94]) == ["244.6", "114.9"]


def test_seconds_below_one_are_scaled_to_ms_or_us():
    assert numbers.scale_unit([0.192, 0.235], "s") == (1e3, "ms")
    assert numbers.fmt_unit(0.000123, "s") == "123.0 µs"
    assert numbers.scale_unit([1.5, 0.2], "s") == (1.0, "s") and numbers.scale_unit([0.2], "images/sec")[1] == "images/sec"


def test_an_interval_of_a_positive_quantity_is_clipped_at_zero_and_marked():
    assert tables.interval(0.192, 0.235, 1) == "0.192–0.235"  # not 0.2–0.2
    assert tables.interval(-1.0, 5.2, 1, positive=True) == "0†–5.20"
    assert tables.interval(-1.0, 5.2, 1) == "-1.00 to 5.20"  # a quantity that may be negative keeps its sign


def test_small_things_read_right(tmp_path):
    """'Warm-up steps: 2' (a space after the longest label); CSV trials count from 1 as the reports do;
    `results show PREFIX` titles its table with the whole experiment id; the baseline's row comes first
    whatever order the trials ran in."""
    import io
    import subprocess
    import sys

    from rich.console import Console

    import golden
    from conftest import SRC, gpuvs_env
    from gpuvs.report import terminal

    console = Console(width=100, file=io.StringIO(), record=True)
    terminal.StepLog(console).config_block({"model": "resnet50", "warmup_steps": 2, "steps": 10})
    text = console.export_text()
    assert "Warm-up steps: 2" in text and "Timed steps:  10" in text

    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(golden.HERE / "golden.py"), "render", str(golden.STORE), str(out)],
                       capture_output=True, text=True, timeout=600, env=gpuvs_env(PYTHONPATH=str(SRC)))
    assert r.returncode == 0, r.stderr[-2000:]
    ids = golden.experiments(golden.STORE)
    csv_rows = (out / "compare-2arms.export.csv").read_text().split("[stdout]\n")[1].splitlines()[1:]
    assert sorted({row.split(",")[3] for row in csv_rows if row.count(",") > 10}) == ["1", "2", "3"]
    show = (out / "trial-by-number.show").read_text()
    assert f"trial 1 of {ids['golden-run-spin']}" in show

    class Spec:
        def __init__(self, arm):
            self.arm, self.trial = arm, 0

    class Result:
        def __init__(self, arm):
            self.spec, self.ok, self.summary = Spec(arm), False, {}

    table = terminal.arm_table([Result("b"), Result("a")], arms=["a", "b"])
    assert list(table.columns[0].cells) == ["a", "b"]


def test_a_limit_reads_as_people_type_it():
    from gpuvs.params import Param

    assert Param("x", int, 1, min=1, max=1048576).describe_allowed() == "an integer from 1 to 1,048,576"
    assert Param("x", int, 1, min=1, max=4096).describe_allowed() == "an integer from 1 to 4096"
    assert Param("x", float, 0.1, min=0, max=0.5).describe_allowed() == "a number from 0 to 0.5"


def test_the_progress_counts_the_trials_left_and_says_up_to_while_more_may_come():
    """No '0/None' before the first trial; the time left is the mean finished trial times the trials left (less
    what the running one has taken), not the rate of the last seconds; --until-confident says 'up to N'."""
    import io

    from rich.console import Console

    from gpuvs.report import terminal

    now = [100.0]

    class Spec:
        arm = "a"

    bar = terminal.TrialProgress(Console(file=io.StringIO(), width=120), up_to=20)
    bar._clock = lambda: now[0]
    task = bar.progress.tasks[0]
    assert not task.visible and bar.count_text(0, None) == "0" and bar.left_text(0, None) == "ETA -"
    bar.start(Spec(), 0, 6)
    assert task.visible and bar.count_text(0, 6) == "0/6 (up to 20)" and bar.left_text(0, 6) == "ETA -"
    for i in range(2):  # two trials of 30 s each
        now[0] += 30
        bar.done()
        bar.start(Spec(), i + 1, 6)
    now[0] += 10  # the third has run 10 s
    assert bar.left_text(2, 6) == "ETA 1:50 to 8:50"  # 4 x 30 s - 10 s; up to 18 more trials
    plain = terminal.TrialProgress(Console(file=io.StringIO()))
    plain._clock = lambda: now[0]
    plain.start(Spec(), 0, 4)
    now[0] += 90
    plain.done()
    assert plain.count_text(1, 4) == "1/4" and plain.left_text(1, 4) == "ETA 4:30"
    now[0] += 3600
    assert plain.left_text(1, 4) == "ETA 0:00"  # a trial that overruns does not make the time left negative
    assert terminal._clock_text(3723) == "1:02:03"


# -- the step log and the trial line (issue 45 item 6), on real runs of `gpuvs run command` ---------------

def _step_lines(text: str) -> list[str]:
    """The step lines, 'STEP UNIT: FIGURES' (the console expands the tab after the step)."""
    return [" ".join(line.split(None, 1)) for line in text.splitlines() if re.match(r"\d+\s+s: ", line)]


def test_the_step_log_gives_the_digits_that_tell_its_steps_apart(cli):
    r = cli("run", "command", "--step-metric", r"lat=took (\S+) s,time,s", "--store", "s.db", "--",
            "sh", "-c", "echo took 0.104 s; echo took 0.107 s; echo took 0.1041 s")
    assert r.returncode == 0, r.stderr[-2000:]
    # means so far 0.104, 0.1055, 0.10503: never '0.1 +/- 0.0'; the third needs a 4th figure to differ
    assert _step_lines(r.stdout) == ["1 s: 0.104 +/- n/a (jitter = n/a)",
                                     "2 s: 0.105 +/- 0.0015 (jitter = 0.0022)",
                                     "3 s: 0.1050 +/- 0.00098 (jitter = 0.00015)"]
    assert "trial 1 [default] (host, cpu): 105.0 ms +/- 0.984 (jitter = 0.148)" in r.stdout


def test_a_single_figure_reads_no_spread_the_same_way_in_every_parser(cli):
    """A figure printed once (--metric) had '+/- -', a step figure printed once (--step-metric) '+/- 0.0'."""
    shown = []
    for flag in ("--metric", "--step-metric"):
        r = cli("run", "command", flag, r"lat=took (\S+) s,time,s", "--store", "s.db", "--", "echo", "took 0.104 s")
        assert r.returncode == 0, r.stderr[-2000:]
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("trial 1 ["))
        shown.append(line)
        assert line.endswith(f"+/- {numbers.NO_SPREAD} (jitter = {numbers.NO_SPREAD})"), line
    assert _step_lines(r.stdout) == ["1 s: 0.104 +/- n/a (jitter = n/a)"]
    table = cli("results", "show", "--store", "s.db", r.stdout.rsplit("stored as experiment ", 1)[1].split()[0])
    row = next(ln for ln in table.stdout.splitlines() if " ok " in ln)
    assert [c.strip() for c in row.split("│")][8:10] == ["n/a", "n/a"], row  # the +/- and jitter columns


def test_log_figures_have_three_significant_figures_and_no_separators():
    assert [numbers.plain(x) for x in (0.104, 0.6, 129.24, 4705.23, 123456.7)] == \
        ["0.104", "0.600", "129.2", "4705.2", "123457"]
    assert numbers.plain_apart(0.10503, 0.1055) == "0.1050" and numbers.plain_apart(0.105, None) == "0.105"
    assert numbers.spread(0.0, 1) == numbers.spread(None, 5) == "n/a" and numbers.spread(0.0, 2) == "0.0"
