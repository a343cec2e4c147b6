"""What competed with a trial (issue 45, items 3 and 4): its load, CPU pressure, usable CPUs and GPU processes.

Every format names them per arm beside the verdict; a contended run warns, and --strict gives no verdict.
An A/A run that differed says it is the setup's doing.
One real contended run (CPU burners beside a short compare); the rest on stores with known figures."""

from __future__ import annotations

import html
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from conftest import SRC, TEST_TAG, missing_part, run_cli, wait_for

BUSY = "machine busy during arm"
AA = "an A/A run differed: this setup is noisy or drifting; the figures below are not a finding"


def _exp_id(out: str) -> str:
    return next(line.split()[3] for line in out.splitlines() if line.startswith("stored as experiment"))


def _quiet_record(**over) -> dict:
    rec = {"seconds": 2.0, "load_start": 0.4, "load_end": 0.6, "cpus_usable": 2.0, "cpus_online": 2,
           "cpu_pressure": 0.03, "cpu_pressure_avg10": 0.02, "steal": 0.0, "gpu_checked": False, "gpu_processes": []}
    rec.update(over)
    return rec


def _set(store, where: str, record: dict | None = None, value: float | None = None) -> None:
    """Set stored trials' contention record and headline figure (real SQLite, the store's own columns)."""
    db = sqlite3.connect(store)
    if record is not None:
        db.execute(f"UPDATE trials SET contention=? WHERE {where}", (json.dumps(record),))
    if value is not None:
        for tid, summary in db.execute(f"SELECT id, summary FROM trials WHERE {where}").fetchall():
            data = json.loads(summary)
            head = next(iter(data))
            data[head].update(value=value, pm=value * 1e-4)
            db.execute("UPDATE trials SET summary=? WHERE id=?", (json.dumps(data), tid))
    db.commit()
    db.close()


def _compare(store, *extra, trials=3):
    r = run_cli("compare", "spin", "--steps", "3", "--ops", "100000", "--trials", str(trials), "--store", store,
                "--device", "cpu", "--quiet", *extra)
    return r


@pytest.fixture(scope="module")
def aa_store(tmp_path_factory):
    """A real A/A compare of spin (three rounds), stored."""
    store = tmp_path_factory.mktemp("aa") / "gpuvs.db"
    r = _compare(store, "--aa")
    assert r.returncode == 0, r.stderr
    return store, _exp_id(r.stdout)


def _reports(store, exp):
    """The report in every format: the terminal's words joined by single spaces (a sentence wraps at the width), the
    HTML's entities read back (its text as a browser shows it)."""
    out = {}
    for fmt in ("terminal", "markdown", "html"):
        r = run_cli("report", exp, "--store", store, "--format", fmt, COLUMNS="160")
        assert r.returncode == 0, r.stderr
        # the terminal's lines as one (a sentence wraps at the width)
        out[fmt] = html.unescape(r.stdout) if fmt == "html" else " ".join(r.stdout.split()) if fmt == "terminal" \
            else r.stdout
    return out


def test_every_trial_stores_what_competed_with_it(aa_store):
    store, exp = aa_store
    db = sqlite3.connect(store)
    rows = [json.loads(c) for c, in db.execute("SELECT contention FROM trials WHERE experiment_id=?", (exp,))]
    assert len(rows) == 6
    for rec in rows:
        assert rec["cpus_usable"] == float(len(os.sched_getaffinity(0)))
        assert rec["load_start"] is not None and rec["load_end"] is not None and rec["seconds"] > 0
        if os.path.exists("/proc/pressure/cpu"):
            assert 0.0 <= rec["cpu_pressure"] <= 1.0
        assert rec["gpu_checked"] is False and rec["gpu_processes"] == []  # a CPU run reads no GPU


def test_a_quiet_record_shows_no_warning_and_a_busy_one_warns_in_every_format(aa_store, tmp_path):
    store, exp = aa_store
    copy = tmp_path / "gpuvs.db"
    shutil.copy(store, copy)
    _set(copy, "1=1", _quiet_record())
    quiet = _reports(copy, exp)
    for fmt, text in quiet.items():
        assert "warning:" not in text and 'class="warning"' not in text and BUSY not in text, fmt
        assert "arm a: not contended (load 0.6 on 2 usable CPUs, CPU pressure 3%)" in text, fmt
    # arm b's second round: load 5.1 on 2 CPUs and 43% pressure; the other trials stay quiet
    _set(copy, "arm='b' AND trial=1", _quiet_record(load_end=5.1, cpu_pressure=0.43))
    busy = _reports(copy, exp)
    line = "machine busy during arm b: load 5.1 on 2 usable CPUs, CPU pressure 43% (1 of 3 trials contended)"
    assert f"warning: {line}" in busy["terminal"]
    assert f"- ⚠ warning: {line}" in busy["markdown"]
    assert f'<li class="warning">warning: {line}</li>' in busy["html"]
    for text in busy.values():
        assert "arm a: not contended" in text and "CPU pressure (PSI some) above 20%" in text
    # another process on the GPU in 2 of 3 trials of arm b
    gpu = _quiet_record(gpu_checked=True, gpu_processes=[{"pid": 1234, "name": "python", "gpu": 0, "mem_mib": 2048,
                                                           "visible": True}])
    _set(copy, "arm='b' AND trial IN (0, 2)", gpu)
    _set(copy, "arm='b' AND trial=1", _quiet_record(gpu_checked=True))
    text = _reports(copy, exp)["terminal"]
    assert "warning: another process on the GPU during arm b: pid 1234 (python) during 2 of 3 trials" in text
    assert BUSY not in text


def test_strict_refuses_a_contended_stored_comparison(aa_store, tmp_path):
    store, exp = aa_store
    copy = tmp_path / "gpuvs.db"
    shutil.copy(store, copy)
    _set(copy, "1=1", _quiet_record())
    r = run_cli("compare", "--stored", f"{exp}:a", f"{exp}:b", "--store", copy, "--strict")
    assert r.returncode == 0, r.stderr
    _set(copy, "arm='a' AND trial=0", _quiet_record(load_start=3.0))
    r = run_cli("compare", "--stored", f"{exp}:a", f"{exp}:b", "--store", copy, "--strict")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no verdict (--strict): the machine was contended during the trials (machine busy during arm" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_aa_difference_is_the_setups_in_every_format(aa_store, tmp_path):
    store, exp = aa_store
    copy = tmp_path / "gpuvs.db"
    shutil.copy(store, copy)
    _set(copy, "1=1", _quiet_record())
    _set(copy, "arm='a'", value=100.0)
    for trial, value in enumerate((117.0, 118.0, 119.0)):
        _set(copy, f"arm='b' AND trial={trial}", value=value)
    quiet = _reports(copy, exp)
    for fmt, text in quiet.items():
        assert AA in text, fmt
        assert "b's ops/sec 18.0% above a's" in text, fmt
        assert "b is 18.0% faster" not in text, fmt
        assert "no disturbance was recorded" in text, fmt
    assert ' v-faster"' not in quiet["html"] and ' v-aa">faster' in quiet["html"]
    assert "faster (A/A: the setup's, not a finding)" in quiet["markdown"]
    # a disturbance recorded during arm b is named in the A/A sentence
    _set(copy, "arm='b'", _quiet_record(load_end=4.2, cpu_pressure=0.6))
    for fmt, text in _reports(copy, exp).items():
        assert (f"{AA}; disturbances recorded: machine busy during arm b (load 4.2 on 2 usable CPUs, CPU pressure "
                "60%)") in text, fmt


def test_the_same_difference_between_arms_that_differ_is_a_finding(tmp_path):
    """The test above can fail: arms that differ on purpose keep their verdict's words and colour."""
    store = tmp_path / "gpuvs.db"
    r = _compare(store, "--arm", "x:warmup_steps=1", "--arm", "y:warmup_steps=2")
    assert r.returncode == 0, r.stderr
    exp = _exp_id(r.stdout)
    _set(store, "arm='x'", _quiet_record(), value=100.0)
    for trial, value in enumerate((117.0, 118.0, 119.0)):
        _set(store, f"arm='y' AND trial={trial}", _quiet_record(), value=value)
    out = _reports(store, exp)
    for fmt, text in out.items():
        assert AA not in text and "y is 18.0% faster than x" in text, fmt
    assert ' v-faster">faster' in out["html"]


def test_an_old_store_gains_the_column_and_reads_without_a_record(tmp_path):
    """A store written before trials recorded contention: opened writable it gets the column (its rows keep none);
    opened read-only it is read as it is."""
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript("""
        CREATE TABLE experiments (id TEXT PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL, created REAL NOT NULL,
          meta TEXT NOT NULL);
        CREATE TABLE trials (id INTEGER PRIMARY KEY AUTOINCREMENT, experiment_id TEXT NOT NULL REFERENCES
          experiments(id), run_id TEXT NOT NULL, arm TEXT NOT NULL, trial INTEGER NOT NULL, attempt INTEGER NOT NULL
          DEFAULT 0, workload TEXT NOT NULL, status TEXT NOT NULL, error TEXT, error_kind TEXT, spec TEXT NOT NULL,
          fingerprint TEXT, config TEXT, startup TEXT, metrics TEXT, summary TEXT, started REAL NOT NULL, ended REAL,
          exit_code INTEGER, owner TEXT);
        INSERT INTO experiments VALUES ('old', 'old', 'run', 1.0, '{}');
        INSERT INTO trials (experiment_id, run_id, arm, trial, workload, status, spec, started, summary)
          VALUES ('old', 'r1', 'main', 0, 'spin', 'ok', '{"workload": "spin"}', 1.0, '{}');
    """)
    db.commit()
    db.close()
    os.chmod(tmp_path / "old.db", 0o444)
    sys.path.insert(0, str(SRC))
    from gpuvs.store.db import Store

    with Store(tmp_path / "old.db", readonly=True) as st:
        assert [t.contention for t in st.trials("old")] == [None]
    os.chmod(tmp_path / "old.db", 0o644)
    with Store(tmp_path / "old.db") as st:
        assert [t.contention for t in st.trials("old")] == [None]
        assert "contention" not in st.trials("old")[0].to_dict()  # its JSON as before
    cols = [r[1] for r in sqlite3.connect(tmp_path / "old.db").execute("PRAGMA table_info(trials)")]
    assert cols[-1] == "contention"


def test_the_rule():
    sys.path.insert(0, str(SRC))
    from gpuvs.probes import contention

    assert contention.busy(2.0, 2.0, 0.20, 0.05) == []
    assert contention.busy(2.01, 2.0, 0.2, 0.0) == ["load"]
    assert contention.busy(0.1, 2.0, 0.21, None) == ["cpu pressure"]
    assert contention.busy(None, None, None, 0.06) == ["steal"]
    assert contention.busy(0.1, 2.0, 0.0, 0.0, gpu_others=1) == ["gpu process"]


def _burners(n: int) -> list[subprocess.Popen]:
    env = dict(os.environ, GPUVS_TEST_TAG=TEST_TAG)
    # niced: a task waits for a CPU all the time (the load and the pressure are real), yet the trials still run
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], env=env, preexec_fn=lambda: os.nice(19))
            for _ in range(n)]


def _contended_now(usable: int) -> bool:
    text = open("/proc/pressure/cpu").read() if os.path.exists("/proc/pressure/cpu") else ""
    some = next((line for line in text.splitlines() if line.startswith("some ")), "")
    avg10 = float(some.split("avg10=")[1].split()[0]) / 100 if "avg10=" in some else 0.0
    return avg10 > 0.5 or os.getloadavg()[0] > usable


def test_a_real_contended_machine_warns_and_strict_refuses(tmp_path):
    """CPU burners, more than the usable CPUs, beside a short A/A compare under --strict: no verdict (one line, exit
    1), every trial kept; its report warns in the terminal and the markdown."""
    if not os.path.exists("/proc/pressure/cpu") and not hasattr(os, "getloadavg"):
        missing_part("neither PSI (/proc/pressure/cpu) nor a load average is readable here")
    usable = len(os.sched_getaffinity(0))
    store = tmp_path / "gpuvs.db"
    burners = _burners(2 * usable + 1)
    try:
        wait_for(lambda: _contended_now(usable), 90, "the burners to make the machine contended")
        s = _compare(store, "--aa", "--strict", trials=2)
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
    assert s.returncode == 1 and "Traceback" not in s.stderr, s.stderr
    assert "no verdict (--strict): the machine was contended during the trials" in s.stderr
    assert "every trial is stored as experiment" in s.stderr and "Verdict" not in s.stdout
    exp = _exp_id(s.stdout)
    db = sqlite3.connect(store)
    assert db.execute("SELECT COUNT(*) FROM trials WHERE status='ok'").fetchone()[0] == 4  # kept
    recs = [json.loads(c) for c, in db.execute("SELECT contention FROM trials")]
    assert all(r["load_end"] > usable or (r["cpu_pressure"] or 0) > 0.2 for r in recs), recs
    out = _reports(store, exp)
    assert "warning: machine busy during arm a" in out["terminal"] and "warning: machine busy during arm b" in \
        out["terminal"]
    assert "- ⚠ warning: machine busy during arm" in out["markdown"]


class _Nvml:
    """NVML's process list as the driver gives it (this machine has no GPU): pids with the memory they hold."""

    class Proc:
        def __init__(self, pid):
            self.pid, self.usedGpuMemory = pid, 3 << 30

    def __init__(self, pids):
        self.pids = pids

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [self.Proc(p) for p in self.pids]


def test_the_trials_own_processes_are_not_others_on_the_gpu():
    """The worker, the processes under it (ranks, a command's job) are its own; another real process (pid 1) is
    another's; a pid hidden by a PID namespace counts only where it was there before the trial."""
    sys.path.insert(0, str(SRC))
    from gpuvs.probes import contention

    child = subprocess.Popen(["sleep", "30"])
    try:
        hidden = 4_000_000  # above pid_max: no process has it here
        nvml = _Nvml([os.getpid(), child.pid, 1, hidden])
        first = contention.gpu_processes(nvml, [(0, None)], os.getpid())
        assert sorted(first) == [1, hidden]
        assert first[1]["visible"] and first[1]["name"] and first[1]["mem_mib"] == 3072 and first[1]["gpu"] == 0
        assert first[hidden] == {"pid": hidden, "name": None, "gpu": 0, "visible": False, "mem_mib": 3072}
        assert sorted(contention.gpu_processes(nvml, [(0, None)], os.getpid(), before=set())) == [1]
        assert sorted(contention.gpu_processes(nvml, [(0, None)], os.getpid(), before={hidden})) == [1, hidden]
        assert contention.gpu_processes(_Nvml([child.pid]), [(0, None)], child.pid) == {}
    finally:
        child.kill()
        child.wait()


def test_clock_changes_under_load_come_from_the_trials_telemetry(aa_store, tmp_path):
    """Real NVML readings of an H100 under a GEMM (tests/data/telemetry_h100_gemm.jsonl): the SM clock under load
    (idle readings left out) and the thermal slowdown; stored with one trial of arm b, a note beside the verdict and
    a disturbance the A/A sentence names, in every format."""
    sys.path.insert(0, str(SRC))
    from gpuvs.probes import contention

    readings = [json.loads(line) for line in (SRC.parent / "tests/data/telemetry_h100_gemm.jsonl").open()]
    seen = contention.clocks(readings)
    assert seen == {"sm_clock_loaded": [1590.0, 1980.0], "slowdowns": ["sw_thermal"]}
    assert contention.clocks([r for r in readings if not r["util_gpu"]])["sm_clock_loaded"] is None
    store, exp = aa_store
    copy = tmp_path / "gpuvs.db"
    shutil.copy(store, copy)
    _set(copy, "1=1", _quiet_record(gpu_checked=True))
    _set(copy, "arm='b' AND trial=1", _quiet_record(gpu_checked=True, **seen))
    _set(copy, "arm='a'", value=100.0)
    for trial, value in enumerate((117.0, 118.0, 119.0)):
        _set(copy, f"arm='b' AND trial={trial}", value=value)
    for fmt, text in _reports(copy, exp).items():
        assert "GPU clocks during arm b: SM clock 1,590–1,980 MHz under load; sw_thermal in 1 of 3 trials" in text, fmt
        assert "disturbances recorded: GPU clocks changed during arm b" in text, fmt
        assert "arm b: not contended" in text and "no other process on the GPU" in text, fmt
        assert "GPU clocks during arm a" not in text, fmt
