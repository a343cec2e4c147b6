"""The SQLite store: trials kept with their events, a crash losing only the trial in flight, a bad store one line."""

import json
import sqlite3

import pytest

from gpuvs import events
from gpuvs.errors import UsageError
from gpuvs.store.records import ExperimentMeta, MetricValue, SampleRecord, TelemetryRecord
from gpuvs.spec import RunSpec
from gpuvs.store.records import SeriesSummary
from gpuvs.store.db import Store
from gpuvs.store.ids import new_id


def _spec(**kw):
    return RunSpec(workload="selftest", device="cpu", experiment_id="e1", **kw)


def test_trial_is_committed_with_its_events_and_exports(store_path):
    with Store(store_path) as st:
        st.create_experiment("e1", "demo", "run", ExperimentMeta(workload="selftest", seed=3, extra={"k": 1}))
        tid = st.begin_trial(_spec(trial=0))
        for i in range(3):
            st.add_event(tid, events.sample(i + 1, 10.0 + i, "steps/sec", seconds=0.1, items=1))
        st.add_event(tid, {"type": "telemetry", "t": 0.5, "gpu": 0, "power_w": 100.0})
        st.finish_trial(tid, "ok", summary={"main": SeriesSummary(n=3, unit="steps/sec", value=11.0)},
                        metrics={"loss": MetricValue(0.5)}, startup={"import_s": 1.0})
    with Store(store_path) as st:
        t = st.trial(tid)
        assert t.status == "ok" and t.ok and t.summary["main"].value == 11.0 and t.primary().n == 3
        assert t.metrics == {"loss": MetricValue(0.5, "")} and t.startup == {"import_s": 1.0}
        assert t.spec == _spec(trial=0, run_id=t.run_id) and t.workload == "selftest" and t.attempt == 0
        assert [s.value for s in st.samples(tid)] == [10.0, 11.0, 12.0]
        assert st.samples(tid)[0] == SampleRecord(tid, "main", 1, 10.0, "steps/sec", 0.1, 1, {})
        assert st.telemetry(tid) == [TelemetryRecord(0.5, 0, {"power_w": 100.0})]
        exp = st.experiment("e1")
        assert (exp.meta.workload, exp.meta.seed, exp.meta.extra, exp.meta.margin) == ("selftest", 3, {"k": 1}, None)
        assert exp.meta.judged() == (0.02, 0.95)  # what a run that stored no margin was judged by
        data = json.loads(st.export("json"))
        assert data["trials"][0]["samples"][2]["step"] == 3
        assert data["trials"][0]["telemetry"] == [{"t": 0.5, "gpu": 0, "power_w": 100.0}]
        assert data["trials"][0]["summary"] == {"main": {"n": 3, "unit": "steps/sec", "better": None,
                                                         "higher_is_better": None, "value": 11.0}}
        assert data["trials"][0]["metrics"] == {"loss": {"value": 0.5, "unit": ""}}
        assert data["experiments"][0]["meta"] == {"workload": "selftest", "seed": 3, "k": 1}
        assert list(data["trials"][0]["spec"]) == sorted(data["trials"][0]["spec"])  # as stored: keys sorted
        csv_text = st.export("csv")
        assert "11.0" in csv_text.splitlines()[1] and csv_text.startswith("trial_id,")
        with pytest.raises(UsageError, match="json or csv"):
            st.export("xml")


def test_a_crash_loses_only_the_trial_in_flight(store_path):
    st = Store(store_path)
    st.create_experiment("e1", "demo", "run", ExperimentMeta())
    done = st.begin_trial(_spec(trial=0))
    st.add_event(done, events.sample(1, 1.0, "x/sec"))
    st.finish_trial(done, "ok")
    inflight = st.begin_trial(_spec(trial=1))
    st.add_event(inflight, events.sample(1, 2.0, "x/sec"))
    # the process dies here: no finish_trial; simulate a dead owner
    import socket
    st.db.execute("UPDATE trials SET owner=? WHERE id=?", (f"{socket.gethostname()}:999999999", inflight))
    del st
    with Store(store_path) as st2:
        assert st2.trial(done).status == "ok" and len(st2.samples(done)) == 1
        assert st2.trial(inflight).status == "interrupted"
        assert st2.samples(inflight) == []


def test_bad_store_paths_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        Store(tmp_path / "no" / "such" / "x.db")
    bad = tmp_path / "not.db"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(UsageError, match=r"not\.db is not a gpuvs store \(file is not a database\): name another"):
        Store(bad)


def test_schema_is_plain_sqlite(store_path):
    Store(store_path).close()
    names = {r[0] for r in sqlite3.connect(store_path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"experiments", "trials", "samples", "telemetry"} <= names


def _filled_store(path, trials=40, samples=200):
    """A store of many pages: trials with samples, one experiment per ten trials."""
    with Store(path) as st:
        for t in range(trials):
            exp = f"e{t // 10}"
            st.create_experiment(exp, "demo", "run", ExperimentMeta(description="x" * 200))
            tid = st.begin_trial(RunSpec(workload="selftest", device="cpu", experiment_id=exp, trial=t))
            for i in range(samples):
                st.add_event(tid, events.sample(i + 1, 10.0 + i, "steps/sec", seconds=0.1, items=1))
            st.finish_trial(tid, "ok", summary={"main": SeriesSummary(n=1, unit="steps/sec", value=11.0)})
    sqlite3.connect(path).execute("PRAGMA wal_checkpoint(TRUNCATE)")


def test_a_store_damaged_in_the_middle_is_one_line_with_what_to_do(tmp_path, cli):
    import random

    path = tmp_path / "gpuvs.db"
    _filled_store(path)
    # a trial left 'running' by a dead gpuvs: the open reaps it, which used to end in a traceback
    import socket
    db = sqlite3.connect(path)
    db.execute("UPDATE trials SET status='running', owner=? WHERE id=3", (f"{socket.gethostname()}:999999999",))
    db.commit()
    db.close()
    data = bytearray(path.read_bytes())
    page = 4096
    pages = len(data) // page
    assert pages > 20
    rng = random.Random(7)
    for p in rng.sample(range(2, pages), pages // 3):  # random pages in the middle, never the header
        data[p * page:(p + 1) * page] = rng.randbytes(page)
    path.write_bytes(bytes(data))
    outcomes = []
    for args in (["results", "list"], ["results", "show", "e0"], ["results", "show", "e3"], ["report", "e2"],
                 ["results", "export", "--format", "csv"]):
        r = cli(*args)
        assert "Traceback" not in r.stderr + r.stdout, (args, r.stderr)
        if r.returncode != 0:
            lines = [line for line in r.stderr.splitlines() if line.strip()]
            assert r.returncode == 2 and len(lines) == 1, (args, r.stderr)
            assert lines[0].startswith(f"gpuvs: error: store gpuvs.db is damaged (") and ".recover" in lines[0], lines
        outcomes.append(r.returncode)
    assert 2 in outcomes  # the damage was seen, not read past


def test_a_store_on_a_read_only_mount_can_be_listed_shown_and_reported(tmp_path):
    import shutil
    import subprocess

    from conftest import run_cli

    folder = tmp_path / "ro"
    folder.mkdir()
    r = run_cli("run", "selftest", "--steps", "3", "--quiet", cwd=folder)
    assert r.returncode == 0, r.stderr
    exp_id = next(line.split()[3] for line in r.stdout.splitlines() if line.startswith("stored as experiment"))
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to make a read-only mount")
    import os
    import sys

    script = (f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && "
              f"touch {folder}/probe 2>/dev/null && exit 99; cd {folder} && "
              f"{sys.executable} -m gpuvs results list && {sys.executable} -m gpuvs results show {exp_id} && "
              f"{sys.executable} -m gpuvs report {exp_id} --format md && "
              f"{sys.executable} -m gpuvs run selftest --steps 2 --quiet; echo run-status=$?")
    from conftest import gpuvs_env

    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=180,
                       env=gpuvs_env())
    assert r.returncode == 0, r.stderr
    assert exp_id in r.stdout and "| arm" in r.stdout and "total steps/sec" not in r.stderr
    # a run needs a writable store: one line that says so, not a traceback
    assert "run-status=2" in r.stdout and "Traceback" not in r.stderr
    assert "cannot be written" in r.stderr or "read-only" in r.stderr.lower(), r.stderr
    assert os.listdir(folder) == ["gpuvs.db"]  # nothing was written beside it


def test_an_ambiguous_id_prefix_names_the_experiments_it_matches(store_path):
    with Store(store_path) as st:
        for i in ("20261123-1", "20261123-2", "20261124-1"):
            st.create_experiment(i, "demo", "run", ExperimentMeta())
        assert st.experiment("20261124").id == "20261124-1"
        with pytest.raises(UsageError, match=r"'2026112' is the start of 3 experiments .*: 20261123-1, 20261123-2, "
                                             r"20261124-1; give more of the id"):
            st.experiment("2026112")
        with pytest.raises(UsageError, match="no experiment '2027'"):
            st.experiment("2027")


def test_an_experiments_name_finds_it_wherever_an_id_does_and_a_shared_name_names_them(cli):
    ids = {}
    for name in ("ctrlc", "twice", "twice"):
        r = cli("run", "selftest", "--steps", "2", "--trials", "2", "--name", name, "--quiet")
        assert r.returncode == 0, r.stderr
        ids.setdefault(name, []).append(next(ln.split()[3] for ln in r.stdout.splitlines()
                                             if ln.startswith("stored as experiment")))
    r = cli("results", "show", "ctrlc")
    assert r.returncode == 0 and f"trials of {ids['ctrlc'][0]}" in r.stdout and r.stdout.count("│ ok ") == 2, r.stderr
    r = cli("report", "ctrlc", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == ids["ctrlc"][0], r.stderr
    r = cli("compare", "--stored", "ctrlc", ids["twice"][0])
    assert r.returncode == 0 and f"experiment {ids['ctrlc'][0]}, arm default (the baseline)" in r.stdout, r.stderr
    r = cli("compare", "--stored", "ctrlc", "twice")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"'twice' is the name of 2 experiments in gpuvs.db: {', '.join(ids['twice'])}; give the id" in r.stderr
    r = cli("results", "show", "nosuch")
    assert r.returncode == 2 and "no experiment 'nosuch' (as an id, its start or a name)" in r.stderr, r.stderr


def test_experiment_ids_are_never_cut_however_narrow_the_terminal(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "2", "--quiet")
    exp_id = next(line.split()[3] for line in r.stdout.splitlines() if line.startswith("stored as experiment"))
    for width in ("30", "50", "80"):
        r = cli("results", "list", COLUMNS=width)
        assert r.returncode == 0 and exp_id in r.stdout, (width, r.stdout)


def test_meta_reads_back_key_for_key_and_keeps_what_it_does_not_know(store_path):
    """A meta as an earlier (or later) version stored it: to_dict gives back the same JSON, key for key and in
    order; what this version knows is typed (the plan of --until-confident, the arms, the base spec)."""
    stored = {"command": "gpuvs fleet spin", "margin": 0.05, "confidence": 0.95, "workload": "spin",
              "base": RunSpec(workload="spin", device="cpu").to_dict(), "seed": None,
              "arms": [{"name": "n1", "overrides": {"node": "n1"}}], "sequential": {"first": 3, "cap": 9, "step": 2},
              "from_the_future": [1, 2]}
    with Store(store_path) as st:
        st.db.execute("INSERT INTO experiments VALUES (?,?,?,?,?)", ("old", "x", "fleet", 1.0, json.dumps(stored)))
        meta = st.experiment("old").meta
        assert meta.to_dict() == stored and list(meta.to_dict()) == list(stored)
        assert meta.base.device == "cpu" and meta.arms[0].overrides == {"node": "n1"} and meta.seed is None
        assert (meta.sequential.first, meta.sequential.cap, meta.sequential.step) == (3, 9, 2)
        assert meta.extra == {"from_the_future": [1, 2]} and not meta.is_interleaved("fleet")
        st.update_meta("old", fleet={"id": "old"})  # set, not replaced: the rest stays as it was
        again = st.experiment("old").meta.to_dict()
        assert list(again) == list(stored) + ["fleet"] and again["fleet"] == {"id": "old"}
    # a new one is written in the fields' order, with only what was set
    assert list(ExperimentMeta(confidence=0.9, margin=0.1, command="c", trials=3).to_dict()) == \
        ["margin", "confidence", "command", "trials"]


def test_a_summary_stored_before_better_was_declared_keeps_its_direction():
    old = {"n": 2, "unit": "ms", "higher_is_better": False, "value": 1.5, "mean": 1.5}
    s = SeriesSummary.from_dict(old)
    assert s.better is None and s.higher_is_better is False and s.value == 1.5
    assert SeriesSummary.from_dict({"n": 1, "unit": "x", "better": "lower"}).higher_is_better is False


def _in_mount_namespace(script: str, timeout: float = 300):
    """Run `sh -c script` in a mount namespace of its own: a tmpfs mounted there is gone with it, whatever
    happens to the test (nothing to unmount, nothing seen outside)."""
    import shutil
    import subprocess

    from conftest import gpuvs_env, missing_part

    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0 or shutil.which("mount") is None:
        missing_part("a mount namespace of its own (unshare -m, as root) is needed to make a full or read-only volume")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, timeout=timeout, env=gpuvs_env())


def test_a_full_disk_says_so_stops_the_run_and_keeps_the_trials_before(tmp_path):
    """A full disk was 'damaged ... .recover', and a trial whose writes failed was only marked failed: the next
    one started. Now: one line that says the disk is full, no trial after it, exit 1, the trials before kept whole."""
    import json
    import sys

    from conftest import gpuvs_processes

    vol = tmp_path / "vol"
    vol.mkdir()
    # a 1 MiB volume: a trial of 2,000 samples (written once a second while it runs) is a few hundred KiB of WAL
    r = _in_mount_namespace(
        f"mount -t tmpfs -o size=1m tmpfs {vol} && cd {vol} && "
        f"{sys.executable} -m gpuvs run selftest --device cpu --steps 2000 --step-seconds 0.0005 --trials 8 --quiet; "
        f"echo rc=$?; df -k . | tail -1; echo ===; {sys.executable} -m gpuvs results export --format json")
    out, _, export = r.stdout.partition("===\n")
    assert "rc=1" in out, (out[-3000:], r.stderr[-3000:])
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]  # the export said nothing on stderr
    assert errors[0].startswith("gpuvs: error: store gpuvs.db cannot be written: the disk is full (database or disk "
                                "is full); what it holds is kept"), errors
    assert "damaged" not in errors[0] and ".recover" not in errors[0]
    stopped = int(errors[0].split("The run stopped at trial ")[1].split()[0])
    assert f"The run stopped at trial {stopped} of 8; the {stopped - 1} trial(s) before it are kept in gpuvs.db" \
        in errors[0] and stopped >= 2, errors
    assert f"trial {stopped + 1}/8" not in out  # the next trial never started
    # read back from the full disk itself, as a user would
    trials = json.loads(export)["trials"]
    kept = trials[:stopped - 1]
    assert [(t["trial"], t["status"]) for t in kept] == [(i, "ok") for i in range(stopped - 1)], trials
    assert all(len(t["samples"]) == 2000 for t in kept)  # every sample of every kept trial
    assert len(trials) <= stopped, trials  # at most the row of the trial that stopped, never one after it
    assert gpuvs_processes() == []


def test_a_read_only_folder_and_a_folder_as_store_each_say_what_is_wrong(tmp_path, cli):
    import sys

    vol = tmp_path / "vol"
    vol.mkdir()
    # as root, chmod stops nothing: a tmpfs mounted read-only does
    r = _in_mount_namespace(f"mount -t tmpfs -o size=1m,ro tmpfs {vol} && cd {vol} && "
                            f"{sys.executable} -m gpuvs run selftest --device cpu --steps 2 --quiet; echo rc=$?; ls -A")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "rc=2" in r.stdout and r.stdout.strip().endswith("rc=2"), r.stdout  # nothing written there either
    assert lines == ["gpuvs: error: cannot create store gpuvs.db: its folder is on a read-only file system (unable to "
                     "open database file); run where you can write, or name a writable place with --store"], r.stderr
    (tmp_path / "results.db").mkdir()
    for args in (["run", "selftest", "--device", "cpu", "--steps", "2", "--quiet", "--store", "results.db"],
                 ["results", "list", "--store", "results.db"]):
        r = cli(*args)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and lines == ["gpuvs: error: store results.db is a folder, not a file: name a file "
                                               "with --store, e.g. --store results.db/gpuvs.db"], (args, r.stderr)
    assert list((tmp_path / "results.db").iterdir()) == []


def test_a_store_on_a_full_disk_is_still_read_and_a_run_there_says_the_disk_is_full(tmp_path):
    """Opening a store to write (a trial left running by a dead gpuvs is marked interrupted on open) fails on a
    full disk ('disk I/O error' from SQLite, 'damaged ... .recover' before): results are read as they stand."""
    import socket
    import sys

    vol = tmp_path / "vol"
    vol.mkdir()
    orphan = ("import sqlite3; db = sqlite3.connect('gpuvs.db'); db.execute('UPDATE trials SET status=?, owner=?', "
              f"('running', '{socket.gethostname()}:999999999')); db.commit(); db.close()")
    r = _in_mount_namespace(
        f"mount -t tmpfs -o size=1m tmpfs {vol} && cd {vol} && "
        f"{sys.executable} -m gpuvs run selftest --device cpu --steps 5 --quiet >/dev/null && "
        f"{sys.executable} -c \"{orphan}\" && (dd if=/dev/zero of=filler bs=4k 2>/dev/null; true) && "
        f"df -k . | tail -1 && echo === && {sys.executable} -m gpuvs results list && echo list=$? && "
        f"{sys.executable} -m gpuvs run selftest --device cpu --steps 5 --quiet; echo run=$?")
    assert " 100% " in r.stdout.partition("===")[0], r.stdout  # full to the last block
    assert "list=0" in r.stdout and "│ selftest │ run  │ selftest │ 0/1" in r.stdout, (r.stdout, r.stderr)
    assert "run=2" in r.stdout, r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == ["gpuvs: error: store gpuvs.db cannot be written: the disk is full (disk I/O error); what it "
                     "holds is kept: free some space, or run with --store on another disk"], r.stderr


def test_ids_sort_by_the_second_they_were_made_and_end_in_their_tail(monkeypatch):
    """The one id maker (experiments, validate runs, the agent's runs): local time or UTC, then a random tail."""
    import re
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+05:30: local time and UTC differ in the hour and the minute
    time.tzset()
    try:
        stamp = "%Y%m%d-%H%M%S-"
        before, local, utc, after = time.time(), new_id(), new_id(chars=4, utc=True), time.time()
        assert time.strftime(stamp, time.localtime(before)) <= local[:16] <= time.strftime(stamp, time.localtime(after))
        assert time.strftime(stamp, time.gmtime(before)) <= utc[:16] <= time.strftime(stamp, time.gmtime(after))
        assert local[:16] != utc[:16]
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", local) and re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", utc)
        assert re.fullmatch(r"\d{8}-\d{6}-stand1", new_id("stand1"))
        assert len({new_id() for _ in range(20)}) > 15  # random tails
    finally:
        monkeypatch.undo()
        time.tzset()
