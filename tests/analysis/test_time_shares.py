"""Where an experiment's wall time went (timeshare.py): each trial's launch-to-exit time in parts.

The experiment's parts add up to its wall time, in the run and compare summaries and in --format json."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gpuvs.analysis import timeshare
from gpuvs.store.records import SeriesSummary
from gpuvs.analysis.timeshare import PARTS


def test_a_trial_in_parts():
    startup = {"launch_to_exit_s": 20.0, "launch_to_timed_s": 15.0, "warmup_s": 6.0, "fork_s": 0.05}
    t = timeshare.trial_time(startup, {"main": SeriesSummary(total_seconds=4.0), "other": SeriesSummary(total_seconds=99.0)})
    assert (t.measured_s, t.fork_s, t.warm_up_s) == (4.0, 0.05, 6.0)  # the headline series (first) only
    assert t.start_up_s == pytest.approx(15.0 - 6.0 - 0.05)
    assert t.teardown_s == pytest.approx(20.0 - 15.0 - 4.0)
    assert t.measured_s + t.fork_s + t.warm_up_s + t.start_up_s + t.teardown_s == pytest.approx(t.wall_s)
    # no launch-to-timed: the workload's end less the timed steps marks their start
    t = timeshare.trial_time({"launch_to_exit_s": 10.0, "launch_to_done_s": 9.0}, {"main": SeriesSummary(total_seconds=5.0)})
    assert (t.start_up_s, t.teardown_s) == (pytest.approx(4.0), pytest.approx(1.0))
    assert timeshare.trial_time({"launch_to_timed_s": 1.0}, {}) is None  # never exited as far as gpuvs knows


def test_the_parts_add_up_to_the_wall_time():
    trials = [timeshare.trial_time({"launch_to_exit_s": 10.0, "launch_to_timed_s": 4.0, "warmup_s": 2.0,
                                    "fork_s": 0.1}, {"main": SeriesSummary(total_seconds=5.0)}) for _ in range(4)]
    ts = timeshare.shares(50.0, trials + [None], {"zygote_wait_s": 6.0, "zygote_starts_s": [6.0]})
    assert ts.trials == 4 and ts.wall_s == 50.0
    assert ts.seconds["measured"] == 20.0 and ts.seconds["warm_up"] == 8.0
    assert ts.seconds["start_up"] == pytest.approx(4 * 1.9 + 6.0)  # the zygote's start is the experiment's
    assert ts.seconds["other"] == pytest.approx(50.0 - 40.0 - 6.0)
    assert sum(ts.seconds.values()) == pytest.approx(50.0) and sum(ts.shares.values()) == pytest.approx(1.0)
    assert ts.per_trial["start_up"] == pytest.approx(1.9) and ts.per_trial["wall"] == 10.0
    # clocks read apart: never a negative part, the wall time grows to what was accounted
    assert timeshare.shares(30.0, trials).seconds["other"] == 0.0


def test_the_ranks_start_is_named_inside_start_up():
    ranks = {"ranks_s": 3.0, "ranks_process_s": 0.5, "ranks_import_s": 2.0, "ranks_group_s": 0.5}
    base = {"launch_to_exit_s": 10.0, "launch_to_timed_s": 5.0, "warmup_s": 1.0}
    trials = [timeshare.trial_time({**base, **ranks}, {"main": SeriesSummary(total_seconds=4.0)},
                                   {"ranks_started_by": how}) for how in ("spawn", "fork", "fork")]
    plain = timeshare.trial_time(base, {"main": SeriesSummary(total_seconds=4.0)})
    ts = timeshare.shares(40.0, trials + [plain])
    assert ts.seconds["start_up"] == pytest.approx(4 * 4.0)  # a part of start-up, not a part of its own
    assert ts.ranks == {"trials": 3, "started_by": {"fork": 2, "spawn": 1},
                        "per_trial": {**ranks, "start_up_s": pytest.approx(4.0)}}
    assert ts.to_dict()["ranks"]["trials"] == 3
    assert "ranks" not in timeshare.shares(40.0, [plain]).to_dict()  # the JSON of other experiments is as it was
    from gpuvs.report.tables import time_shares_table

    assert time_shares_table(ts).note.endswith(
        "; across ranks in 3 trial(s), start-up 4.00 s per trial of which the ranks' start 3.00 s (processes 0.50, "
        "imports 2.00, process group 0.50); ranks forked 2, spawned 1")


def test_run_and_compare_say_where_the_time_went(cli, tmp_path):
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "5", "--trials", "2", "--quiet",
            "--arm", "a:step_seconds=0.02", "--arm", "b:step_seconds=0.03")
    assert r.returncode == 0, r.stderr
    assert "Where the time went" in r.stdout and "measured (timed steps)" in r.stdout
    exp_id = r.stdout.split("experiment ")[-1].split()[0]
    j = cli("report", exp_id, "--format", "json")
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    time_ = data["time"]
    assert set(time_) == {"wall_s", "seconds", "shares", "trials", "per_trial", "zygote_starts_s"}
    assert list(time_["seconds"]) == list(PARTS) and time_["trials"] == 4
    assert sum(time_["seconds"].values()) == pytest.approx(time_["wall_s"])
    assert sum(time_["shares"].values()) == pytest.approx(1.0)
    con = sqlite3.connect(tmp_path / "gpuvs.db")
    totals = [json.loads(s)["main"]["total_seconds"] for (s,) in con.execute("SELECT summary FROM trials")]
    assert time_["seconds"]["measured"] == pytest.approx(sum(totals))  # the timed steps' own seconds
    assert 0.2 * 5 * 4 * 0.02 < time_["seconds"]["measured"] < time_["wall_s"]
    assert len(time_["zygote_starts_s"]) == 1 and time_["seconds"]["fork"] > 0  # forked, from one zygote
    meta = json.loads(con.execute("SELECT meta FROM experiments").fetchone()[0])
    assert meta["timing"]["fresh"] == "fork" and meta["timing"]["wall_s"] == pytest.approx(time_["wall_s"])
    # the rest of the JSON is as it was: the keys of an analysis before this change, and time
    assert set(data) == {"id", "name", "kind", "workload", "created", "meta", "margin", "confidence", "metrics",
                         "arms", "verdicts", "speedup", "scaling", "flags", "failures", "trials", "time",
                         "disturbances"}
    r = cli("run", "selftest", "--device", "cpu", "--steps", "3", "--fresh", "exec")
    assert r.returncode == 0 and "Where the time went" in r.stdout
    assert "zygote" not in r.stdout.split("Where the time went")[1]  # exec: no zygote start to count
