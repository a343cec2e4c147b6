"""A store moved, deleted or replaced while a real `gpuvs run` writes it: the run never says "stored" falsely.

It fails (exit 2) with one line saying where the data is: the file's new name, or a copy saved beside the path.
The next run at the old path takes nothing from what was left there.
A store that closes normally leaves no WAL files."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import gpuvs_env, wait_for
from gpuvs.store.db import Store
from gpuvs.store.records import ExperimentMeta

RUN = ["run", "command", "--device", "cpu", "--trials", "3", "--store", "rep.db", "--", "sleep", "0.5"]


def start(folder: Path, argv=RUN) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuvs", *argv], cwd=folder, env=gpuvs_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def trials_in(path: Path) -> list[tuple[str, str]]:
    """(experiment, status) of every trial, read from the file as it stands (no WAL beside it is made or used)."""
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return db.execute("SELECT experiment_id, status FROM trials ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # the file exists before its tables (the poll reads "not yet")
        return []
    finally:
        db.close()


def first_trial_started(path: Path) -> bool:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        return db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] >= 1
    except sqlite3.Error:
        return False
    finally:
        db.close()


def run_and(folder: Path, act) -> tuple[subprocess.CompletedProcess, str]:
    """The run, `act` done to rep.db once its first trial has begun (two more to come); its one error line."""
    proc = start(folder)
    wait_for(lambda: first_trial_started(folder / "rep.db"), 60, "first trial in rep.db", step=0.05)
    act()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, out + err
    assert "stored as experiment" not in out + err and "Traceback" not in err, out + err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("gpuvs: error:")]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), line


def test_a_store_moved_mid_run_fails_and_names_its_new_place(tmp_path):
    _, line = run_and(tmp_path, lambda: os.rename(tmp_path / "rep.db", tmp_path / "rep-old.db"))
    exp = re.search(r"experiment (\S+) is kept there", line).group(1)
    assert line == (f"gpuvs: error: store rep.db was moved to {tmp_path}/rep-old.db while this run wrote it: "
                    f"experiment {exp} is kept there, not in rep.db (which no longer exists); read it with --store "
                    f"{tmp_path}/rep-old.db")
    assert trials_in(tmp_path / "rep-old.db") == [(exp, "ok")] * 3  # in the main file itself, not in a WAL
    after = start(tmp_path, RUN[:5] + ["1"] + RUN[6:])  # the next run at the old path
    out, err = after.communicate(timeout=120)
    assert after.returncode == 0 and "stored as experiment" in out, out + err
    assert trials_in(tmp_path / "rep-old.db") == [(exp, "ok")] * 3
    assert [e for e, _ in trials_in(tmp_path / "rep.db")] != [exp]


def test_a_store_deleted_mid_run_is_saved_beside_its_path(tmp_path):
    _, line = run_and(tmp_path, lambda: os.unlink(tmp_path / "rep.db"))
    m = re.fullmatch(r"gpuvs: error: store rep.db was deleted or replaced while this run wrote it \(rep.db no longer "
                     r"exists\): experiment (\S+) was saved to (rep.db.rescued-\d+.db); read it with --store \2", line)
    assert m, line
    assert trials_in(tmp_path / m.group(2)) == [(m.group(1), "ok")] * 3


def test_a_store_replaced_mid_run_is_saved_and_the_new_file_left_alone(tmp_path):
    with Store(tmp_path / "other.db") as other:
        other.create_experiment("theirs", "theirs", "run", ExperimentMeta())

    _, line = run_and(tmp_path, lambda: os.replace(tmp_path / "other.db", tmp_path / "rep.db"))
    m = re.search(r"\(rep.db now names another file\): experiment (\S+) was saved to (rep.db.rescued-\d+.db)", line)
    assert m, line
    assert trials_in(tmp_path / m.group(2)) == [(m.group(1), "ok")] * 3
    db = sqlite3.connect(tmp_path / "rep.db")
    assert db.execute("SELECT id FROM experiments").fetchall() == [("theirs",)] and trials_in(tmp_path / "rep.db") == []


def test_a_store_that_closes_normally_leaves_its_data_in_the_file_alone(tmp_path):
    with Store(tmp_path / "s.db") as st:
        st.create_experiment("e1", "e1", "run", ExperimentMeta())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]
    db = sqlite3.connect(f"file:{tmp_path / 's.db'}?mode=ro&immutable=1", uri=True)
    assert db.execute("SELECT id FROM experiments").fetchall() == [("e1",)]
