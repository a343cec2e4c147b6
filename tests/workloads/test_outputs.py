"""gpuvs.workloads.command.outputs: metric declarations (a direction always stated) and --metric texts.

The parsers' registry, and the reader that says which metrics never appeared, on real output.
Each ready parser has its own test file (test_outputs_<parser>.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, gpuvs_env, require
from gpuvs.workloads.command import outputs
from gpuvs.errors import UsageError
from gpuvs.workloads.command.outputs import WALL_TIME, Metric, parse_metric_spec
from job_output import run_and_read

TF_LOG = ROOT / "tests" / "fixtures" / "tf_cnn_benchmarks" / "host-1gpu-resnet50-bs64-t4.log"
SYNTAX = "(expected NAME=REGEX,higher|lower|rate|time[,UNIT])"
# a command line each ready parser accepts without an argument
JOBS = {"hyperfine": ("hyperfine", "--export-json", "x.json", "true"), "sysbench": ("sysbench", "cpu", "run")}


def read_tf_log(reader):
    text = TF_LOG.read_text(encoding="utf-8").splitlines()
    readings = [r for line in text for r in reader.feed(line)]
    return text, readings + reader.finish()


# -- declarations ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("better", ["", None, "neither", "faster", "Higher"])
def test_a_metric_without_a_direction_is_refused(better):
    with pytest.raises(UsageError, match=r"^metric loss: its direction must be higher or lower, not .*never guesses"):
        Metric("loss", better)


def test_only_a_per_step_figure_is_cumulative_and_wall_time_is_declared_once():
    with pytest.raises(UsageError, match="only a per-step figure can be cumulative"):
        Metric("rate", "higher", cumulative=True)
    w = WALL_TIME
    assert (w.name, w.better, w.unit, w.per_step) == ("wall_time_s", "lower", "s", False)
    assert outputs.wall_time(2.5) == outputs.Reading("wall_time_s", 2.5, "s", None, "gpuvs", "launch to exit")


@pytest.mark.parametrize("text, per_step, expected", [
    ("loss=loss: ([0-9.]+),lower", False, ("loss", "lower", "", "loss: ([0-9.]+)")),
    ("rate=\\d{1,3}, ([0-9.]+) img/s,HIGHER,images/s", False,
     ("rate", "higher", "images/s", "\\d{1,3}, ([0-9.]+) img/s")),
    ("a,lower=x=(\\d+),lower", False, None),  # a name cannot hold a comma
    ("t = took (\\d+) ms,lower, ms ", True, ("t", "lower", "ms", " took (\\d+) ms")),
    ("x=(?P<step>\\d+): (?P<value>\\S+),lower", True, ("x", "lower", "", "(?P<step>\\d+): (?P<value>\\S+)")),
])
def test_metric_specs(text, per_step, expected):
    if expected is None:
        with pytest.raises(UsageError):
            parse_metric_spec(text, per_step)
        return
    m = parse_metric_spec(text, per_step)
    assert (m.name, m.better, m.unit, m.pattern) == expected and m.per_step is per_step and m.required
    assert m.kind == "score"  # higher or lower: a verdict says better or worse


@pytest.mark.parametrize("word, better", [("rate", "higher"), ("time", "lower"), ("Time", "lower")])
def test_a_rate_or_a_time_is_declared_by_its_word_and_implies_the_direction(word, better):
    m = parse_metric_spec(f"x=took ([0-9.]+),{word},ms", True)
    assert (m.better, m.kind, m.unit, m.pattern) == (better, word.lower(), "ms", "took ([0-9.]+)")


@pytest.mark.parametrize("kwargs, message", [
    (dict(better="lower", kind="rate"), "metric x: a rate is higher-is-better, not lower"),
    (dict(better="higher", kind="time"), "metric x: a time is lower-is-better, not higher"),
    (dict(better="higher", kind="speed"), "metric x: its kind must be one of rate, time, score, not 'speed'"),
])
def test_a_kind_that_contradicts_the_direction_is_refused(kwargs, message):
    with pytest.raises(UsageError) as err:
        Metric("x", **kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("text, per_step, why", [
    ("=x (\\d+),higher", False, "the name is empty"),
    ("loss", False, "no '=' between the name and the regex"),
    ("my loss=x (\\d+),lower", False, "'my loss' is not a metric name: use letters, digits, _ . - / "
                                      "(starting with a letter or _)"),
    ("loss=x (\\d+,lower", False, "the regex 'x (\\\\d+' does not compile: missing ), unterminated subpattern at "
                                  "position 2"),
    ("loss=x \\d+,lower", False, "the regex 'x \\\\d+' has no group for the figure: put it in parentheses, e.g. "
                                 "'loss: ([0-9.]+)'"),
    ("s=(?P<step>\\d+) x,lower", True, "has no group for the figure"),
    ("loss=x (\\d+)", False, "no direction: end it with ,higher or ,lower, or ,rate or ,time (which way is better "
                             "is never guessed)"),
    ("loss=x (\\d{1,3})", False, "no direction"),
    ("loss=x (\\d+),faster", False, "unknown direction 'faster': say higher or lower, or rate or time"),
    ("loss=x (\\d+),better,ms", False, "unknown direction 'better': say higher or lower, or rate or time"),
    ("loss=,lower", False, "the regex is empty"),
])
def test_bad_metric_specs_are_one_line_each(text, per_step, why):
    option = "--step-metric" if per_step else "--metric"
    with pytest.raises(UsageError) as err:
        parse_metric_spec(text, per_step)
    message = str(err.value)
    assert message.startswith(f"{option} {text!r}: ") and message.endswith(SYNTAX) and why in message
    assert "\n" not in message and err.value.exit_code == 2


# -- --metric and --step-metric on real output ---------------------------------------------------------------------

def test_user_metrics_on_a_real_tf_cnn_benchmarks_log():
    reader = outputs.make_reader(
        ["tf_cnn_benchmarks"],
        metrics=[r"rate=^\d+\timages/sec: ([0-9.]+),higher,images/sec"],
        step_metrics=[r"loss=\t([0-9.]+)$,lower", r"step_rate=^(?P<step>\d+)\timages/sec: (?P<value>[0-9.]+),higher"])
    text, readings = read_tf_log(reader)
    table = [ln for ln in text if "\timages/sec:" in ln]
    printed = [float(ln.split()[2]) for ln in table]
    # a figure printed once, printed eleven times: every printing is a reading, the last one stands
    rate = [r for r in readings if r.name == "rate"]
    assert [r.value for r in rate] == printed and reader.last["rate"].value == printed[-1] and rate[0].step is None
    # per step: numbered in the order printed, or by the regex's step group
    loss = [r for r in readings if r.name == "loss"]
    assert [(r.step, r.value) for r in loss] == [(i, float(ln.split("\t")[-1])) for i, ln in enumerate(table, 1)]
    steps = [r for r in readings if r.name == "step_rate"]
    assert [(r.step, r.value) for r in steps] == [(int(ln.split("\t")[0]), v) for ln, v in zip(table, printed)]
    assert reader.headline == "total_images_per_sec" and reader.failure() is None
    assert [m.name for m in reader.metrics] == ["wall_time_s", "total_images_per_sec", "images_per_sec", "total_loss",
                                                "rate", "loss", "step_rate"]


def test_a_metric_that_never_appeared_names_its_regex_and_the_last_lines():
    reader = outputs.make_reader(metrics=[r"eps=events per second: ([0-9.]+),higher"])
    text, readings = read_tf_log(reader)
    assert readings == [] and reader.headline == "wall_time_s"
    assert reader.missing() == [outputs.Missing("eps", "regex 'events per second: ([0-9.]+)'")]
    last = [" ".join(ln.split()) for ln in text[-5:]]
    assert reader.failure() == ("metric eps (regex 'events per second: ([0-9.]+)') never appeared; last lines: "
                                + " | ".join(f"stdout: {ln}" for ln in last))
    assert reader.failure(lines=0).endswith("last lines: (the job printed nothing)")


def test_a_match_that_is_not_a_number_fails_naming_the_line():
    reader = outputs.make_reader(metrics=[r"model=Model:\s+(\S+),higher"])
    read_tf_log(reader)
    lines = TF_LOG.read_text(encoding="utf-8").splitlines()
    number = next(i for i, ln in enumerate(lines, 1) if ln.startswith("Model:"))
    assert reader.failure() == (f"metric model (regex 'Model:\\\\s+(\\\\S+)') on stdout line {number}: 'resnet50' is "
                                "not a number")


def test_user_metric_and_sysbench_parser_agree_on_real_sysbench_output():
    argv = (require("sysbench", "this test runs sysbench (Debian package sysbench)"), "cpu", "--time=1", "run")
    reader = outputs.make_reader(["sysbench"], metrics=[r"eps=events per second:\s+([0-9.]+),higher,events/s"],
                                 job=outputs.Job(argv))
    run = run_and_read(reader, argv)
    assert run.returncode == 0 and reader.failure() is None
    assert run.one("eps").value == run.one("events_per_sec").value and run.one("eps").source == run.one(
        "events_per_sec").source


def test_a_progress_bar_rewritten_with_carriage_returns_is_read_at_every_version():
    script = "for s in range(1, 4):\n    print(f'\\rstep {s} loss {1 / s:.3f}', end='', flush=True)\nprint()\n"
    reader = outputs.make_reader(step_metrics=[r"loss=step (?P<step>\d+) loss ([0-9.]+),lower"])
    run = run_and_read(reader, [sys.executable, "-c", script])
    assert run.returncode == 0 and len(run.lines["stdout"]) == 1
    assert [(r.step, r.value, r.source) for r in run.readings] == [
        (1, 1.0, "stdout line 1"), (2, 0.5, "stdout line 1"), (3, 0.333, "stdout line 1")]


# -- the reader ----------------------------------------------------------------------------------------------------

def test_an_unknown_parser_is_one_line_listing_the_known_ones():
    with pytest.raises(UsageError) as err:
        outputs.make_reader(["tf-cnn"])
    assert str(err.value) == f"unknown parser 'tf-cnn'; known parsers: {', '.join(outputs.names())}"
    assert {"tf_cnn_benchmarks", "hyperfine", "sysbench", "stress-ng", "jsonl"} <= set(outputs.names())


@pytest.mark.parametrize("kwargs, message", [
    (dict(parsers=["tf_cnn_benchmarks"], metrics=[r"total_images_per_sec=total: (\S+),higher"]),
     "metric total_images_per_sec is declared twice (parser tf_cnn_benchmarks and --metric/--step-metric): "
     "give one another name"),
    (dict(metrics=[r"x=a (\d),higher"], step_metrics=[r"x=b (\d),higher"]),
     "metric x is declared twice (--metric/--step-metric and --metric/--step-metric): give one another name"),
    (dict(metrics=[r"wall_time_s=took (\S+),lower"]),
     "metric wall_time_s is declared twice (gpuvs (launch to exit) and --metric/--step-metric): give one another name"),
    (dict(parsers=["sysbench:cpu"], headline="mib_per_sec"),
     "headline 'mib_per_sec' is not a metric read from this job; known: wall_time_s, events_per_sec, latency_avg_ms, "
     "latency_p95_ms"),
    (dict(parsers=["jsonl", "jsonl:loss"]), "parser jsonl is given twice: one of each reads the whole output"),
    (dict(parsers=["tf_cnn_benchmarks:resnet50"]), "parser tf_cnn_benchmarks takes no argument "
                                                   "(given tf_cnn_benchmarks:resnet50)"),
])
def test_what_cannot_be_read_is_refused_before_the_job_starts(kwargs, message):
    with pytest.raises(UsageError) as err:
        outputs.make_reader(**kwargs)
    assert str(err.value) == message


def test_headline_and_wall_time():
    only_user = outputs.make_reader(metrics=[r"x=x (\d+),higher"])
    assert only_user.headline == "wall_time_s" and only_user.metric("wall_time_s") is WALL_TIME
    named = outputs.make_reader(["tf_cnn_benchmarks"], metrics=[r"x=x (\d+),higher"], headline="x")
    assert named.headline == "x"
    reading = named.wall_time(3.25)
    assert named.last["wall_time_s"] is reading and named.counts["wall_time_s"] == 1
    assert [m.name for m in named.missing()] == ["total_images_per_sec", "x"]
    with pytest.raises(ValueError, match="stream must be one of"):
        named.feed("x 1", "stdin")


# -- the registry: one module per parser ---------------------------------------------------------------------------

def test_every_parser_module_registers_one_parser_that_declares_its_headline():
    package = ROOT / "src" / "gpuvs" / "workloads" / "command" / "outputs"
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")} - {"parsing", "budget", "patterns", "reader"}
    assert {n.replace("-", "_") for n in outputs.names()} == modules
    for name in outputs.names():
        cls = outputs.get(name)
        assert cls.summary and cls.__module__ == f"gpuvs.workloads.command.outputs.{name.replace('-', '_')}"
        parser = outputs.create(name, outputs.Job(JOBS.get(name, ())))
        names = [m.name for m in parser.metrics]
        assert len(names) == len(set(names)) and WALL_TIME.name not in names
        if cls.declares_at_run_time:
            assert parser.metrics == () and parser.headline is None
        else:
            assert parser.headline in names and parser.metric(parser.headline).required
            assert all(m.read_from for m in parser.metrics)


WORKER_SIDE = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "gpuvs":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
from gpuvs.workloads.command import outputs
jobs = %r
made = [outputs.create(name, outputs.Job(jobs.get(name, ()))) for name in outputs.names()]
reader = outputs.Reader(made + [outputs.PatternParser.from_specs(["x=x (\\d+),higher"])])
reader.feed("total images/sec: 1.5")
reader.feed("x 7", "stderr")
print(len(made), reader.last["total_images_per_sec"].value, reader.last["x"].value)
""" % (JOBS,)


def test_the_parsers_need_nothing_but_the_standard_library():
    """The wrapper reads a command's output inside the user's image, which may hold nothing but Python."""
    r = subprocess.run([sys.executable, "-c", WORKER_SIDE], capture_output=True, text=True, timeout=60,
                       env=gpuvs_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(len(outputs.names())), "1.5", "7.0"]


# -- docs and CI ---------------------------------------------------------------------------------------------------

def test_docs_name_every_parser_and_metric():
    doc = (ROOT / "docs" / "command.md").read_text()
    for name in outputs.names():
        assert f"`{name}`" in doc, name
        for m in outputs.create(name, outputs.Job(JOBS.get(name, ()))).metrics:
            assert f"`{m.name}`" in doc, (name, m.name)
    for word in ("NAME=REGEX,higher|lower|rate|time[,UNIT]", "--step-metric", '"gpuvs"', WALL_TIME.name):
        assert word in doc


def test_ci_installs_the_tools_these_tests_run():
    listed = set(re.sub(r"#.*", "", (ROOT / ".ci" / "apt" / "command.txt").read_text()).split())
    assert {"hyperfine", "sysbench", "stress-ng"} <= listed
    used = {m for p in Path(__file__).parent.glob("test_outputs*.py") for m in re.findall(r'require\("([\w-]+)"',
                                                                                          p.read_text())}
    assert used <= listed and used
