"""What compare says about a command job, on real runs on the host, wrapped and bare (docs/command.md).

Where the time went: the job's run and gpuvs's start-up and teardown around it, the table printed once.
No fingerprint warning for a field a bare trial could not record, and the only --step-metric as the headline.
`compare --stored` of two stored runs: short names, and a refusal of two that share no figure."""

from __future__ import annotations

import json
import re
import sqlite3
import sys

import pytest

from gpuvs.analysis import timeshare
from gpuvs.store.records import SeriesSummary
from gpuvs.probes import fingerprint
from gpuvs.workloads.command import outputs

# a job that spends nearly all of its run in its own loop: 4 steps of 0.3 s, each printing its rate
LOOP = ("import time\nfor i in range(4):\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.3: pass\n"
        "    print(f'step {i}: {1 / (time.perf_counter() - t):.4f} it/s', flush=True)\nprint('score: 0.9')\n")
RATE = r"rate=step \d+: ([0-9.]+) it/s,rate"
SCORE = r"score=score: ([0-9.]+),higher"


def report(cli, ident: str) -> dict:
    r = cli("report", ident, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def stored_id(stdout: str) -> str:
    return [ln for ln in stdout.splitlines() if ln.startswith("stored as experiment ")][-1].split()[3]


def test_compare_of_a_command_wrapped_and_bare_says_where_its_time_went(cli, tmp_path):
    r = cli("compare", "command", "--device", "cpu", "--trials", "3", "--quiet", "--step-metric", RATE,
            "--arm", "wrapped:env=host", "--arm", "bare:env=host,bare=true", "--", sys.executable, "-c", LOOP)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Where the time went") == 1, r.stdout  # once, with the trials' own tables
    ident = stored_id(r.stdout)
    time_ = report(cli, ident)["time"]
    assert time_["trials"] == 6  # the bare trials too: each has its launch to exit
    seconds, shares = time_["seconds"], time_["shares"]
    assert sum(seconds.values()) == pytest.approx(time_["wall_s"])
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = [(json.loads(s), json.loads(u)) for s, u in db.execute("SELECT summary, startup FROM trials")]
    walls = [s["wall_time_s"]["value"] for s, _ in rows]
    assert seconds["job"] == pytest.approx(sum(walls))  # the job's run: its wall time, every trial's
    assert shares["job"] > 0.5, time_  # a job that spends its run in its own loop: most of the wall time is its
    assert seconds["measured"] == 0.0  # gpuvs never times a command's steps: its whole run is the job's part
    assert shares["other"] < 0.25 and seconds["start_up"] > 0 and seconds["teardown"] >= 0
    for summary, startup in rows:  # bare or wrapped: launch to exit, and the job's start in between
        assert 0 < startup["job_start_s"] < startup["launch_to_exit_s"]
        assert summary["wall_time_s"]["value"] < startup["launch_to_exit_s"]
    table = r.stdout.split("Where the time went")[1].split("stored as experiment")[0]
    assert "the job's run (its wall time)" in table and "6 trial(s)" in table
    assert "measured (timed steps)" not in table and "warm-up" not in table  # a command job has neither
    # the only --step-metric carries the verdict, not wall time
    data = report(cli, ident)
    assert data["verdicts"][0]["metric"] == "rate" and data["metrics"][0]["name"] == "rate"
    assert data["metrics"][0]["headline"]
    assert re.search(r" on rate[ ,]", " ".join(r.stdout.split())), r.stdout  # the verdict sentence names it
    # the bare arm's fingerprint lacks the worker's torch and CUDA: not a difference nobody asked for
    assert "which this comparison did not vary" not in r.stdout, r.stdout
    assert "arm bare ran bare" in " ".join(r.stdout.split())  # what bare could not measure is still said


def test_a_bare_run_counts_its_trials():
    """Bare trials have a launch to exit and a job's start (here from a bare trial's records as stored)."""
    startup = {"job_start_s": 0.05, "launch_to_exit_s": 1.2}
    t = timeshare.trial_time(startup, {"wall_time_s": SeriesSummary(value=1.0)})
    assert (t.job_s, t.start_up_s, t.teardown_s, t.measured_s) == (1.0, 0.05, pytest.approx(0.15), 0.0)
    # a bare container's start is the engine's; without any start, what is not the job's run is start-up
    t = timeshare.trial_time({"container_started_s": 0.3, "launch_to_exit_s": 1.5}, {"wall_time_s": SeriesSummary(value=1.0)})
    assert (t.start_up_s, t.teardown_s) == (0.3, pytest.approx(0.2))
    t = timeshare.trial_time({"launch_to_exit_s": 1.5}, {"wall_time_s": SeriesSummary(value=1.0)})
    assert (t.start_up_s, t.teardown_s) == (0.5, 0.0)
    ts = timeshare.shares(4.0, [t, t])
    assert ts.trials == 2 and ts.seconds["job"] == 2.0 and ts.parts() == ["job", "start_up", "teardown", "other"]
    # an experiment without command jobs keeps its parts (and its JSON) as they were
    step = timeshare.trial_time({"launch_to_exit_s": 2.0}, {"main": SeriesSummary(total_seconds=1.0)})
    assert "job" not in timeshare.shares(3.0, [step]).seconds
    assert timeshare.shares(3.0, [step]).parts() == list(timeshare.PARTS)


def test_a_field_one_fingerprint_did_not_record_is_not_a_difference():
    inside = {"cpu_model": "AMD EPYC", "torch": "2.5", "gpu_name": None, "software": {"cuda": "12.4"}}
    outside = {"taken_by": "gpuvs, from outside the container", "software": {"cuda": "12.8"}}
    assert fingerprint.differences(inside, outside) == {"software.cuda": ("12.4", "12.8")}
    assert fingerprint.differences(inside, {**outside, "cpu_model": "Intel Xeon"})["cpu_model"] == ("AMD EPYC", "Intel Xeon")
    # a field recorded as None (looked, found none: no GPU here) is recorded: against a GPU it differs
    assert fingerprint.differences(inside, {**outside, "gpu_name": "H100"})["gpu_name"] == (None, "H100")
    # what an image changed may be a library one of them lacks: asked for, it is there
    assert fingerprint.differences({"software": {}}, outside, ("software.cuda",), recorded_only=False) == {
        "software.cuda": (None, "12.8")}


@pytest.mark.parametrize("metrics, steps, headline", [
    ([], [RATE], "rate"),  # the only --step-metric
    ([SCORE], [RATE], "rate"),  # a --metric beside it does not change that
    ([SCORE], [], "wall_time_s"),  # a figure printed once alone: wall time, as before
    ([], [RATE, r"loss=loss ([0-9.]+),lower"], "wall_time_s"),  # two step metrics: name one with --headline
])
def test_the_headline_of_your_own_metrics(metrics, steps, headline):
    assert outputs.make_reader((), metrics, steps).headline == headline
    assert outputs.make_reader(("tf_cnn_benchmarks",), metrics, steps).headline == "total_images_per_sec"  # a parser's
    assert outputs.make_reader((), metrics, steps, headline="wall_time_s").headline == "wall_time_s"  # named


def test_compare_stored_names_arms_shortly_and_refuses_two_runs_that_share_no_figure(cli):
    def run(*args):
        r = cli("run", "command", "--device", "cpu", "--trials", "2", "--quiet", *args)
        assert r.returncode == 0, r.stderr
        return stored_id(r.stdout)

    scored = run("--metric", SCORE, "--", sys.executable, "-c", LOOP)
    paced = run("--step-metric", RATE, "--", sys.executable, "-c", "print('step 1: 5.0 it/s')")
    paced2 = run("--step-metric", RATE, "--", sys.executable, "-c", LOOP)
    r = cli("compare", "--stored", scored, paced)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    (line,) = r.stderr.strip().splitlines()  # one line: what each recorded, and that they share none
    assert f"({scored}:default) recorded wall_time_s, score" in line and f"({paced}:default) recorded rate, wall_time_s" in line
    assert "they share no figure of the job's own" in line and "Traceback" not in r.stderr
    r = cli("compare", "--stored", paced, paced2)
    assert r.returncode == 0, r.stderr
    a, b = paced.rsplit("-", 1)[1], paced2.rsplit("-", 1)[1]  # each run by its id's tail
    verdict, pairs = " ".join(r.stdout.split()).split(f"{a}: experiment ")
    # whatever the verdict (a loaded machine can leave 2 trials a side inconclusive), the sentence names the runs by
    # their ids' tails
    assert verdict.startswith((f"{b} is ", f"{a} and {b}:", f"can't tell yet whether {b} differs from {a} ",
                               f"{b} against {a} ")), verdict
    assert " on rate" in verdict.split(" Verdict:")[0], verdict
    assert paced not in verdict and paced2 not in verdict  # in the tables too: the whole ids only in the last line
    assert pairs == f"{paced}, arm default (the baseline); {b}: experiment {paced2}, arm default"
