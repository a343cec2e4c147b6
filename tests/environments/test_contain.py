"""Nothing a command's trial starts outlives it (src/gpuvs/contain.py, docs/command.md "Stopping"), for real.

A job starts a daemon in a session of its own (`setsid sh -c 'exec sleep M' &`, M unique, so it can be found).
The daemon is gone after each ending: the job's own, --timeout, SIGTERM and SIGKILL to gpuvs.
Wrapped and bare on the host; with the trial's own cgroup (v2, v1) and with the subreaper alone (GPUVS_CGROUP=off)."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import SRC, gpuvs_env, gpuvs_processes, missing_part, wait_for
from gpuvs import contain

MODES = ["v2", "v1", "off"]


def marked(marker: str) -> list[int]:
    """The sleeps of this test (their argv is exactly sleep MARKER), daemon and job alike."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if open(f"/proc/{d}/cmdline", "rb").read() == f"sleep\0{marker}\0".encode():
                    out.append(int(d))
            except OSError:
                pass
    return out


def trial_folders(version: str) -> list[str]:
    try:
        parent = contain._own_folder(version)
    except OSError:
        return []
    return [n for n in os.listdir(parent) if n.startswith(contain.PREFIX)]


@pytest.fixture
def marker():
    """A unique sleep duration; whatever is left of it when the test ends (failed or not) is killed here."""
    m = f"{3001 + time.time() % 1000:.6f}"
    yield m
    for pid in marked(m):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    wait_for(lambda: not gpuvs_processes(), 15, "end of every process this test started")


def cgroups(mode: str) -> dict[str, str]:
    """The environment for a mode, and the test skipped (failed under CI=true) where this machine cannot make
    that cgroup: not root, or no such hierarchy."""
    if mode != "off":
        try:
            folder = contain._own_folder(mode)
        except OSError as exc:
            missing_part(f"cgroup {mode} is needed: {exc}")
        if not os.access(folder, os.W_OK):
            missing_part(f"cgroup {mode} is needed: {folder} is not writable by this user")
    return {contain.ENV: mode}


def job(marker: str, then: str) -> list[str]:
    return ["sh", "-c", f"setsid sh -c 'exec sleep {marker}' & {then}"]


def containment(tmp_path) -> str:
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = [json.loads(r[0]) for r in db.execute("SELECT config FROM trials ORDER BY id")]
    assert rows
    return rows[-1]["containment"]


def expected(mode: str) -> str:
    return "subreaper (no cgroup: GPUVS_CGROUP=off)" if mode == "off" else f"cgroup {mode} "


@pytest.mark.parametrize("bare", [False, True], ids=["wrapped", "bare"])
@pytest.mark.parametrize("mode", MODES)
def test_a_daemon_the_job_left_ends_with_the_job(tmp_path, marker, bare, mode):
    env = cgroups(mode)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpuvs", "run", "command", "--device", "cpu", "--trials", "1",
                        *(["--bare"] if bare else []), "--", *job(marker, "echo started")],
                       cwd=tmp_path, env=gpuvs_env(**env), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert marked(marker) == []  # at once: gpuvs ended the trial only once the daemon had ended
    assert containment(tmp_path).startswith(expected(mode))
    if mode != "off":
        assert trial_folders(mode) == []
    # the daemon held the job's output open: its end is the output's, not a 2 s wait after the job's exit
    assert took < 30, took


@pytest.mark.parametrize("bare", [False, True], ids=["wrapped", "bare"])
@pytest.mark.parametrize("mode", MODES)
def test_a_timeout_ends_the_daemon_too(tmp_path, marker, bare, mode):
    env = cgroups(mode)
    r = subprocess.run([sys.executable, "-m", "gpuvs", "run", "command", "--device", "cpu", "--trials", "1",
                        "--timeout", "4", *(["--bare"] if bare else []), "--", *job(marker, f"exec sleep {marker}")],
                       cwd=tmp_path, env=gpuvs_env(**env), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "timed out after 4 s" in r.stderr, r.stderr
    assert marked(marker) == []
    if mode != "off":
        assert trial_folders(mode) == []


@pytest.mark.parametrize("bare", [False, True], ids=["wrapped", "bare"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_to_gpuvs_ends_the_daemon_too(tmp_path, marker, bare, mode, sig):
    env = cgroups(mode)
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "command", "--device", "cpu", "--trials", "1",
                             *(["--bare"] if bare else []), "--", *job(marker, f"exec sleep {marker}")],
                            cwd=tmp_path, env=gpuvs_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: len(marked(marker)) == 2 or proc.poll() is not None, 60, "the job and its daemon", 0.05)
        assert len(marked(marker)) == 2, proc.communicate()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    if sig == signal.SIGTERM:
        assert marked(marker) == [], err  # at once: gpuvs ends after the tree
    else:  # nothing of gpuvs runs after a SIGKILL: the keeper notices its owner is gone
        wait_for(lambda: not marked(marker), 10, "end of the job and its daemon after gpuvs was killed", 0.05)
    if mode != "off":
        wait_for(lambda: not trial_folders(mode), 10, "removal of the trial's cgroup", 0.05)


@pytest.mark.parametrize("mode", ["v2", "v1"])
def test_the_cgroup_of_a_keeper_killed_outright_is_ended_by_the_next_one(marker, mode):
    """The one case no keeper sees: the keeper itself SIGKILLed. With a cgroup, the next keeper made in the same place
    ends what is left in it and removes it."""
    env = cgroups(mode)
    os.environ[contain.ENV] = env[contain.ENV]
    try:
        first = contain.popen(job(marker, f"exec sleep {marker}"))
        wait_for(lambda: len(marked(marker)) == 2, 30, "the job and its daemon", 0.05)
        assert first.containment.startswith(f"cgroup {mode} ")
        first.keeper.kill()
        first.keeper.wait()
        time.sleep(0.3)
        assert marked(marker)  # nobody saw it (the owner killed the job's group): the daemon lives on, in the cgroup
        second = contain.popen(["true"])
        assert second.wait(30) == 0
        second.close()
        assert marked(marker) == []
        assert trial_folders(mode) == []
    finally:
        os.environ.pop(contain.ENV, None)


def test_a_job_that_cannot_start_raises_what_popen_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        contain.popen(["gpuvs-no-such-program"])
    with pytest.raises(FileNotFoundError):
        contain.popen(["true"], cwd=str(tmp_path / "missing"))
    (tmp_path / "x.sh").write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        contain.popen([str(tmp_path / "x.sh")])


def test_the_jobs_status_and_output_come_through_the_keeper():
    proc = contain.popen(["sh", "-c", "echo out; echo err >&2; exit 3"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert proc.stdout.read() == b"out\n" and proc.stderr.read() == b"err\n"
    assert proc.wait(30) == 3
    proc.close()
    proc = contain.popen(["sh", "-c", "kill -SEGV $$"])
    assert proc.wait(30) == -signal.SIGSEGV
    proc.close()


def test_an_unprivileged_user_gets_the_subreaper_alone(marker):
    """gpuvs run by a user who may make no cgroup (GPUVS_CGROUP left at auto): the keeper says why it has none, and
    its subreaper still ends the daemon at the job's exit. Run as `nobody` by this machine's own Python 3 (the
    keeper needs the standard library only)."""
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if os.geteuid() != 0 or not setpriv or not os.access(python, os.X_OK):
        missing_part("root, setpriv (util-linux) and /usr/bin/python3 are needed to run the keeper as nobody")
    code = ("import sys; from gpuvs import contain; p = contain.popen(sys.argv[1:]); p.wait(30); p.close(); "
            "print(p.containment); print(p.left)")
    env = {k: v for k, v in os.environ.items() if k != contain.ENV}
    r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code,
                        *job(marker, "echo started")], capture_output=True, text=True, timeout=60, cwd="/",
                       env={**env, "PYTHONPATH": str(SRC), "HOME": "/"})
    assert r.returncode == 0, r.stderr
    held, left = r.stdout.splitlines()[-2:]
    assert held.startswith("subreaper (no cgroup: ") and "Permission denied" in held, held
    assert left == "1"  # the daemon was left running by the job, and ended by the keeper
    assert marked(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_the_wall_time_is_the_jobs_own_not_the_keepers(mode):
    """The wall time runs from the keeper's fork of the job to reaping it: not the keeper's own start, nor the job's
    move into its cgroup (10-20 ms a move here: made before the clock starts), nor a wait for the keeper's next look
    (its loop wakes at SIGCHLD, even for a job that ends before the loop runs)."""
    env = cgroups(mode)
    os.environ[contain.ENV] = env[contain.ENV]
    try:
        walls = []
        for _ in range(8):
            proc = contain.popen(["true"])
            assert proc.wait(30) == 0
            proc.close()
            assert proc.containment.startswith(expected(mode))
            walls.append(proc.wall_s)
    finally:
        os.environ.pop(contain.ENV, None)
    assert min(walls) < 0.008 and max(walls) < 0.25, walls  # `true`: about 2 ms on the shared 2-core machine
