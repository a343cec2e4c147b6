"""Trials forked from a zygote (--fresh fork), for real: the zygote, its children, the runner and the store.

Each trial is a new process with state of its own; the zygote never starts a thread pool or CUDA before a fork.
It refuses to fork once one runs, and everything it started ends on every exit path.
The imports are paid once, and --fresh auto picks one mechanism for every arm."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import gpuvs_env, gpuvs_processes, missing_part, pid_alive
from gpuvs.trial import launch
from gpuvs.errors import UsageError
from gpuvs.trial.runner import Arm, Experiment, Runner, validate_spec
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store

def _spec(fresh="fork", **params):
    return RunSpec(workload="selftest", device="cpu", params=params, fresh=fresh)


def _states(results):
    return [json.loads(line.split(" ", 1)[1]) for r in results for line in r.logs if line.startswith("state ")]


def _zygotes():
    """Live zygote processes of this test session (their children, forked, share the command line but are
    named gpuvs-trial)."""
    return [p for p in gpuvs_processes() if b"gpuvs.trial.zygote" in Path(f"/proc/{p}/cmdline").read_bytes()
            and Path(f"/proc/{p}/comm").read_text().strip() != "gpuvs-trial"]


def _wait_gone(pids, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


# -- independence -----------------------------------------------------------------------------------

def test_forked_trials_are_new_processes_with_state_of_their_own(store_path):
    """Three forked trials and two exec'd ones of a workload that imports numpy and torch: every trial is
    its own process, a module-level counter set in one is not seen in the next, random state is drawn anew
    (Python, numpy, torch) as a new process draws it, the zygote's control socket
    is not inherited, and at every fork the zygote was single-threaded with CUDA untouched. (torch seeds its
    CPU generator from the OS at import, as numpy does: a fork would copy the zygote's.)"""
    params = {"steps": 2, "state": True, "imports": "numpy,torch"}
    with Store(store_path) as st:
        runner = Runner(st)
        forked = runner.run_experiment(Experiment("f", _spec("fork", **params), [Arm("a")], trials=3, seed=1))
        forks = list(runner.launcher.forks)
        execd = Runner(st).run_experiment(Experiment("e", _spec("exec", **params), [Arm("a")], trials=2, seed=1))
        stored = [json.loads(s) for (s,) in sqlite3.connect(store_path).execute("SELECT spec FROM trials ORDER BY id")]
    assert [r.status for r in forked + execd] == ["ok"] * 5
    f, e = _states(forked), _states(execd)
    assert len(f) == 3 and len(e) == 2
    zygote_pids = {s["ppid"] for s in f}
    assert len(zygote_pids) == 1 and os.getpid() not in zygote_pids  # children of one zygote, not of gpuvs
    assert [s["pid"] for s in f] == [fk["pid"] for fk in forks] == [r.fingerprint["pid"] for r in forked]
    assert len({s["pid"] for s in f + e} | zygote_pids) == 6  # five trials, five processes, and the zygote
    assert [s["runs"] for s in f + e] == [1] * 5  # the module-level counter started afresh in every trial
    for key in ("py_random", "np_random", "torch_seed"):
        assert len({s[key] for s in f + e}) == 5, key  # a fork does not hand on the zygote's random state
    assert {s["torch_cuda_initialized"] for s in f + e} == {False}
    assert {s["sockets"] for s in f + e} == {0}  # the zygote's control socket stayed in the zygote
    assert [fk["threads"] for fk in forks] == [1, 1, 1]
    (ready,) = runner.timing["zygotes"]  # what the zygote said once it had imported everything
    assert len(ready["threads"]) == 1 and ready["problem"] is None and not ready["cuda"].startswith("initialised")
    assert all(not fk["cuda"].startswith("initialised") for fk in forks)
    assert [s["fresh"] for s in stored] == ["fork"] * 3 + ["exec"] * 2
    assert gpuvs_processes() == []


def test_the_zygote_refuses_to_fork_once_a_thread_pool_runs(store_path, tmp_path):
    """A module that runs a torch operation at import starts torch's intra-op pool in the zygote: the fork
    is refused with the reason, the trial fails plainly, and nothing is left."""
    (tmp_path / "poison.py").write_text("import torch\n(torch.ones(512, 512) @ torch.ones(512, 512)).sum()\n")
    env = {"env_var": [f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}:{Path(__file__).parents[2] / 'src'}"
                       f":{tmp_path}"]}
    spec = RunSpec(workload="selftest", device="cpu", params={"steps": 2, "imports": "poison"}, fresh="fork",
                   env=EnvSpec("host", env))
    with Store(store_path) as st:
        res = Runner(st).run_experiment(Experiment("p", spec, [Arm("a")], trials=1, seed=0))
    (r,) = res
    if os.cpu_count() == 1:
        pytest.skip("one CPU: torch's pool has no thread to start")
    assert r.status == "failed" and r.error_kind == "crash"
    assert "the zygote did not fork the trial: the zygote runs" in r.error and "threads" in r.error
    assert gpuvs_processes() == []


def test_fork_saves_the_imports_of_every_trial(store_path):
    """cnn-train on the CPU (torch and torchvision), exec against fork, two trials each: the start-up of a
    trial (launch to the first timed step, less the first and warm-up steps) without the imports, which the
    zygote paid once. Medians, since this machine is shared."""
    params = {"model": "resnet18", "batch_size": 2, "image_size": 32, "warmup_steps": 1, "steps": 2}
    got = {}
    with Store(store_path) as st:
        for fresh in ("exec", "fork"):
            runner = Runner(st)
            spec = RunSpec(workload="cnn-train", device="cpu", params=params, fresh=fresh)
            res = runner.run_experiment(Experiment(fresh, spec, [Arm("a")], trials=2, seed=0))
            assert [r.status for r in res] == ["ok", "ok"], [r.error for r in res]
            got[fresh] = ([r.startup["launch_to_timed_s"] - r.startup["warmup_s"] for r in res],
                          [r.startup["launch_to_worker_s"] for r in res], [r.startup["import_s"] for r in res],
                          runner.timing)
    (s_exec, w_exec, i_exec, _), (s_fork, w_fork, i_fork, timing) = got["exec"], got["fork"]
    print(f"start-up s (launch to timed, less first and warm-up steps): exec {s_exec}, fork {s_fork}; launch to "
          f"worker s: exec {w_exec}, fork {w_fork}; import s: exec {i_exec}, fork {i_fork}; zygote start s "
          f"{timing['zygote_starts_s']}")
    assert max(i_fork) < 0.05 < min(i_exec)  # the framework was imported already
    assert max(w_fork) < 0.5  # a fork, not an interpreter's start
    median = lambda xs: sorted(xs)[len(xs) // 2]
    assert median(s_exec) - median(s_fork) > 0.5 * median(i_exec)  # the imports, saved in every trial
    assert len(timing["zygote_starts_s"]) == 1 and timing["zygote_starts_s"][0] > 0.5 * min(i_exec)


# -- clean-up ---------------------------------------------------------------------------------------

def test_success_failure_and_timeout_leave_nothing(store_path):
    with Store(store_path) as st:
        with Runner(st, timeout_s=4) as runner:
            ok = runner.run_trial(_spec(steps=2, children=1))
            crash = runner.run_trial(_spec(steps=5, fail_at_step=2, children=1))
            slow = runner.run_trial(_spec(steps=1000, step_seconds=0.5, children=2))
            zygote = _zygotes()
            assert len(zygote) == 1  # one zygote served all three
        assert len(st.samples(slow.id)) >= 1  # what the timed-out trial measured is kept
    assert ok.ok and crash.error == "selftest failed at step 2 as asked" and crash.exit_code == 1
    assert slow.status == "failed" and slow.error_kind == "timeout" and "timed out after 4 s" in slow.error
    kids = [int(p) for r in (ok, crash, slow) for line in r.logs if line.startswith("children")
            for p in line.split()[1:]]
    assert len(kids) == 4
    assert _wait_gone(kids + zygote + [r.fingerprint["pid"] for r in (ok, crash, slow)]) == []
    assert gpuvs_processes() == []


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stopped_run_ends_the_zygote_and_its_children(tmp_path, sig, status):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--steps", "40", "--step-seconds",
                             "0.25", "--trials", "3", "--children", "1", "--fresh", "fork", "--device", "cpu"],
                            cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "gpuvs.db"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if db.exists() and sqlite3.connect(db).execute("SELECT COUNT(*) FROM samples").fetchone()[0] >= 3:
                break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.2)
    assert len(_zygotes()) == 1
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert "finished trials are kept" in err and "Traceback" not in err
    rows = sqlite3.connect(db).execute("SELECT status FROM trials").fetchall()
    assert rows == [("interrupted",)]
    time.sleep(0.5)
    assert gpuvs_processes() == []  # the zygote, the trial's child and its own child


def test_gpuvs_killed_outright_takes_the_zygote_and_its_children_with_it(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--steps", "100", "--step-seconds",
                             "0.2", "--children", "1", "--fresh", "fork", "--device", "cpu", "--quiet"],
                            cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (_zygotes() and len(gpuvs_processes()) >= 4):  # gpuvs, zygote, trial, child
        time.sleep(0.2)
    left = gpuvs_processes()
    assert len(left) >= 4, left
    socket_folders = {Path(a).parent for p in _zygotes() for a in Path(f"/proc/{p}/cmdline").read_bytes()
                      .decode().split("\0") if a.endswith("/s")}
    proc.kill()
    proc.communicate(timeout=30)
    assert _wait_gone(left, 5.0) == []  # the zygote sees its channel close, and ends every child's group
    assert len(socket_folders) == 1 and not any(f.exists() for f in socket_folders)  # removed once connected


def test_a_killed_zygote_fails_its_trial_plainly_and_the_next_trial_gets_a_new_one(store_path):
    seen: dict[str, int] = {}

    def kill_zygote(result, event):
        if event["type"] == "sample" and event["step"] == 3 and result.spec.trial == 0 and "zygote" not in seen:
            (z,) = _zygotes()
            seen["zygote"] = z
            os.kill(z, signal.SIGKILL)

    with Store(store_path) as st:
        res = Runner(st, on_event=kill_zygote, timeout_s=60).run_experiment(
            Experiment("z", _spec(steps=30, step_seconds=0.1, children=1), [Arm("a")], trials=2, seed=0))
    first, second = res
    assert first.status == "failed" and first.error_kind == "crash"
    assert first.error.startswith("the zygote ended while this trial ran (zygote was killed by SIGKILL")
    assert second.ok
    kids = [int(p) for line in first.logs if line.startswith("children") for p in line.split()[1:]]
    assert _wait_gone(kids + [first.fingerprint["pid"], seen["zygote"]]) == []
    assert gpuvs_processes() == []


# -- which mechanism --------------------------------------------------------------------------------

def test_auto_is_one_mechanism_for_every_arm():
    host = _spec("auto")
    box = RunSpec(workload="selftest", device="cpu", env=EnvSpec("container", {"rootfs": "/:O"}))
    pod = RunSpec(workload="selftest", device="cpu", env=EnvSpec("pod", {"image": "x"}))
    assert launch.resolve([host, host]) == "fork"
    assert launch.resolve([host, box]) == "exec"  # a container forks only when asked: both arms exec
    assert launch.resolve([host, pod]) == "exec"
    assert launch.resolve([RunSpec(workload="startup", device="cpu")]) == "exec"  # it measures the launch itself
    exp = Experiment("x", host, [Arm("a"), Arm("b", {"fresh": "exec"}), Arm("c", {"fresh": "auto"})], trials=1)
    from gpuvs.trial.runner import resolve_fresh

    resolve_fresh(exp)
    assert [exp.spec_for(a, 0).fresh for a in exp.arms] == ["fork", "exec", "fork"]


def test_a_pod_cannot_fork_and_says_so_before_anything_starts(cli):
    with pytest.raises(UsageError, match="--fresh fork: a pod cannot hold a zygote"):
        validate_spec(RunSpec(workload="selftest", device="cpu", env=EnvSpec("pod", {"image": "x"}), fresh="fork"))
    r = cli("run", "selftest", "--env", "pod", "--image", "x", "--device", "cpu", "--fresh", "fork")
    assert r.returncode == 2 and "--fresh fork: a pod cannot hold a zygote" in r.stderr and "Traceback" not in r.stderr
    r = cli("run", "selftest", "--device", "cpu", "--fresh", "vfork")
    assert r.returncode == 2 and "--fresh: 'vfork' is not allowed; expected one of auto, exec, fork" in r.stderr


def test_compare_defaults_to_fork_on_the_host_and_an_arm_may_choose(cli, tmp_path):
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "2", "--trials", "2", "--quiet",
            "--arm", "e:fresh=exec", "--arm", "f:step_seconds=0.01")
    assert r.returncode == 0, r.stderr
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, spec FROM trials").fetchall()
    assert sorted({(arm, json.loads(spec)["fresh"]) for arm, spec in rows}) == [("e", "exec"), ("f", "fork")]
    assert "Where the time went" in r.stdout and "fork" in r.stdout


# -- a container holding the zygote -----------------------------------------------------------------

def _containers(experiment: str) -> list[str]:
    r = subprocess.run(["podman", "ps", "-a", "--filter", f"label=gpuvs.experiment={experiment}", "--format",
                        "{{.Names}}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_a_container_holds_the_zygote_for_the_arm_and_is_removed(store_path):
    import shutil

    if shutil.which("podman") is None:
        missing_part("podman is needed for a container that holds a zygote")
    spec = RunSpec(workload="selftest", device="cpu", params={"steps": 3, "state": True, "children": 1},
                   env=EnvSpec("container", {"rootfs": "/:O", "engine": "podman"}), fresh="fork", timeout_s=60)
    during: list[list[str]] = []
    exp = Experiment("c", spec, [Arm("a")], trials=3, seed=0)

    def watch(result, event):
        if event["type"] == "sample" and event["step"] == 1:
            during.append(_containers(exp.id))

    with Store(store_path) as st:
        res = Runner(st, on_event=watch).run_experiment(exp)
    assert [r.status for r in res] == ["ok"] * 3, [r.error for r in res]
    states = _states(res)
    assert len({s["pid"] for s in states}) == 3 and {s["runs"] for s in states} == {1}
    assert len({s["ppid"] for s in states}) == 1  # one zygote, inside the container
    assert all(r.fingerprint.get("in_container") for r in res)
    assert len(during) == 3 and all(len(d) == 1 for d in during) and len({d[0] for d in during}) == 1
    assert _containers(exp.id) == []


def test_a_zygote_that_cannot_start_is_a_stored_failed_trial_each_time(store_path, tmp_path):
    # a gpuvs that fails to import shadows the real one (PYTHONPATH comes before site-packages, where an
    # installed gpuvs is found whatever PYTHONPATH says)
    (tmp_path / "broken" / "gpuvs").mkdir(parents=True)
    (tmp_path / "broken" / "gpuvs" / "__init__.py").write_text('raise ImportError("a gpuvs broken on purpose")\n')
    spec = RunSpec(workload="selftest", device="cpu", params={"steps": 2}, fresh="fork",
                   env=EnvSpec("host", {"env_var": [f"PYTHONPATH={tmp_path / 'broken'}"]}))
    with Store(store_path) as st:
        res = Runner(st).run_experiment(Experiment("x", spec, [Arm("a")], trials=2, seed=0))
        rows = st.trials()
    assert [r.status for r in res] == ["failed", "failed"] and {r.error_kind for r in res} == {"unavailable"}
    assert res[0].error.startswith("the zygote ended before it was ready: zygote exited with status 1")
    assert "a gpuvs broken on purpose" in res[0].error
    assert [(row.status, row.error) for row in rows] == [("failed", r.error) for r in res]
    assert gpuvs_processes() == []
