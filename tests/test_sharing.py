"""gpuvs share / advise-mps on the CPU for real (the selftest and CNN workloads), the start barrier,
and the MPS daemon's guards. The MPS lifecycle itself needs a GPU: tests/test_gpu.py."""

import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import gpuvs_processes
from gpuvs import barrier, mps
from gpuvs.errors import EnvironmentUnavailable
from gpuvs.runner import Runner
from gpuvs.sharing import Coordinator, Group, normalized_sum, predict_mps
from gpuvs.spec import RunSpec
from gpuvs.store import Store


def test_workers_measure_the_same_window(store_path):
    spec = RunSpec(workload="selftest", device="cpu", params={"step_seconds": 0.02})
    with Store(store_path) as st:
        g = Coordinator(Runner(st, timeout_s=120), window_s=1.5).group([spec] * 3, "3 workers", False)
    assert g.ok and len(g.trials) == 3
    for t in g.trials:
        n = t.primary()["n"]
        # 1.5 s of 20 ms steps: about 75 steps each, never the 10 million asked for
        assert 40 <= n <= 80, n
        assert t.primary()["total_seconds"] == pytest.approx(1.5, abs=0.25)
    assert g.fairness > 0.8 and g.aggregate == pytest.approx(sum(g.values()))
    assert gpuvs_processes() == []


def test_a_worker_failing_before_the_start_stops_its_group(store_path):
    good = RunSpec(workload="selftest", device="cpu", params={"step_seconds": 0.01})
    bad = RunSpec(workload="cnn-train", device="cpu", params={"model": "resnet18", "batch_size": 200000})
    with Store(store_path) as st:
        g = Coordinator(Runner(st, timeout_s=120), window_s=1).group([good, bad], "mixed", False)
        statuses = [r["status"] for r in st.trials()]
    assert not g.ok and "failed before the start" in g.failure and "out of host memory" in g.failure
    assert statuses == ["failed", "failed"]
    assert gpuvs_processes() == []


def test_share_cli_scaling_table(cli, tmp_path):
    r = cli("share", "selftest", "--step-seconds", "0.02", "--workers", "1,2", "--duration", "1")
    assert r.returncode == 0, r.stderr
    assert "sharing one GPU (1 s window)" in r.stdout and "fairness" in r.stdout
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status FROM trials").fetchall()
    assert rows == [("1 worker", "ok"), ("2 workers", "ok"), ("2 workers", "ok")]


def test_share_cli_pairs_and_capacity(cli, tmp_path):
    r = cli("share", "selftest", "--step-seconds", "0.05", "--with", "selftest --step-seconds 0.02",
            "--duration", "1")
    assert r.returncode == 0, r.stderr
    assert "interference: A = selftest, B = selftest" in r.stdout and "A slowdown" in r.stdout
    r = cli("share", "--capacity", "selftest", "--max-workers", "3", "--duration", "0.5")
    assert r.returncode == 0, r.stderr
    assert "largest count that ran │ 3" in r.stdout and "the cap of 3 workers was reached" in r.stdout
    r = cli("share", "--capacity", "cnn-train", "--model", "resnet18", "--batch-size", "200000",
            "--max-workers", "3", "--duration", "0.5")
    assert r.returncode == 0 and "largest count that ran │ 0" in r.stdout and "out of host memory" in r.stdout
    assert gpuvs_processes() == []


@pytest.mark.parametrize("args, message", [
    (["share", "selftest", "--workers", "0"], "--workers wants counts from 1 to 512"),
    (["share", "selftest", "--workers", "a,b"], "--workers wants counts"),
    (["share", "selftest", "--mps", "on"], "--mps applies to GPU runs"),
    (["share", "selftest", "--mps", "sometimes"], "--mps: 'sometimes' is not allowed; expected one of off, on, both"),
    (["share", "selftest", "--with", "nosuch"], "unknown workload 'nosuch'"),
    (["share", "selftest", "--with", "selftest --bogus 1"], "unknown option --bogus for --with selftest"),
    (["advise-mps", "selftest"], "advise-mps wants two quoted jobs"),
])
def test_share_bad_input(cli, args, message):
    r = cli(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_advise_mps_runs_solo_then_together_on_cpu(cli):
    r = cli("advise-mps", "selftest --step-seconds 0.05", "selftest --step-seconds 0.02", "--duration", "1")
    assert r.returncode == 0, r.stderr
    assert "prediction: no difference" in r.stdout and "no GPU telemetry" in r.stdout
    assert "A alone" in r.stdout and "A+B" in r.stdout


def _group(util, mem_util, mem_mib):
    g = Group("x", False)
    g.telemetry = {"util_gpu_mean": util, "util_mem_mean": mem_util}
    g.memory_used_mib = mem_mib
    return g


def test_mps_prediction_rules():
    assert predict_mps(_group(40, 10, 1000), _group(50, 20, 1000), 80000).prediction == "mps helps"
    assert predict_mps(_group(98, 70, 1000), _group(97, 60, 1000), 80000).prediction == "mps hurts"
    assert predict_mps(_group(98, 20, 1000), _group(99, 30, 1000), 80000).prediction == "no difference"
    assert predict_mps(_group(50, 10, 50000), _group(50, 10, 40000), 80000).prediction == "will not fit"


def test_normalized_sum():
    from gpuvs.runner import TrialResult

    g = Group("A+B", False)
    for v in (50.0, 30.0):
        t = TrialResult(spec=RunSpec(workload="selftest"), status="ok")
        t.summary = {"main": {"value": v}}
        g.trials.append(t)
    assert normalized_sum(g, [100.0, 60.0]) == pytest.approx(1.0)
    assert normalized_sum(g, [100.0, None]) is None


def test_barrier_releases_every_waiter(tmp_path):
    barrier.arrive(str(tmp_path), "a")
    barrier.arrive(str(tmp_path), "b")
    assert barrier.ready(str(tmp_path)) == ["a", "b"]
    start = barrier.release(str(tmp_path), delay_s=0.2)
    t = barrier.wait_go(str(tmp_path), timeout_s=5)
    assert t == pytest.approx(start) and time.time() >= start


def test_mps_missing_binary_is_a_plain_error(monkeypatch):
    monkeypatch.setattr(mps, "find_binary", lambda: None)
    with pytest.raises(EnvironmentUnavailable, match="nvidia-cuda-mps-control is not installed"):
        mps.MpsDaemon()


def test_mps_refuses_when_another_daemon_runs(tmp_path):
    # a real process named like the MPS control daemon
    fake = tmp_path / "nvidia-cuda-mps-control"
    shutil.copy(shutil.which("sleep"), fake)
    proc = subprocess.Popen([str(fake), "30"])
    try:
        time.sleep(0.2)
        assert proc.pid in mps.mps_processes()
        daemon = mps.MpsDaemon(binary=str(fake))
        with pytest.raises(EnvironmentUnavailable, match=f"another MPS daemon is already running here \\(pid {proc.pid}\\)"):
            daemon.start()
        assert daemon.root is None  # nothing was created
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_during_a_shared_window_stops_every_worker(tmp_path):
    from conftest import gpuvs_env
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "share", "selftest", "--workers", "2", "--duration", "60",
                             "--children", "1"], cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and "1 worker" not in (proc.stdout.readline() or ""):
        pass
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status FROM trials").fetchall()
    assert rows == [("1 worker", "interrupted")]
    time.sleep(0.5)
    assert gpuvs_processes() == []


def test_share_workers_is_the_job_count_and_data_workers_reaches_the_cnn():
    from rich.console import Console
    from gpuvs.cli.run import prepare
    from gpuvs.cli.share import SHARE_OPTIONS

    prep = prepare(["cnn-train", "--workers", "1,2,4", "--data-workers", "3", "--device", "cpu"], "gpuvs share",
                   Console(file=open(os.devnull, "w")), extra_groups=(SHARE_OPTIONS,))
    from gpuvs.cli import options as opt

    assert opt.take(prep.rest, SHARE_OPTIONS)["workers"] == "1,2,4" and prep.base.params["workers"] == 3
    prep = prepare(["cnn-train", "--workers", "2", "--device", "cpu"], "gpuvs run", Console(file=open(os.devnull, "w")))
    assert prep.base.params["workers"] == 2


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is installed by .ci/run")
def test_containers_share_one_window(cli, tmp_path):
    r = cli("share", "selftest", "--step-seconds", "0.02", "--env", "container", "--rootfs", "/:O", "--workers", "2",
            "--duration", "1")
    assert r.returncode == 0, r.stderr
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status, fingerprint FROM trials").fetchall()
    assert [(a, s) for a, s, _ in rows] == [("1 worker", "ok"), ("2 workers", "ok"), ("2 workers", "ok")]
    assert all('"in_container": true' in fp for _, _, fp in rows)
    left = subprocess.run(["podman", "ps", "-a", "--filter", "label=gpuvs", "-q"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_share_matrix_runs_pairs_over_a_sweep(cli, tmp_path):
    f = tmp_path / "pairs.yaml"
    f.write_text('name: tiny\nduration: 0.5\nmps: both\npairs:\n  - ["selftest", "selftest --noise"]\n'
                 'sweep:\n  step_seconds: [0.01, 0.03]\n')
    r = cli("share-matrix", f, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "tiny: time per run, alone and together" in r.stdout and "0.03" in r.stdout
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status, spec FROM trials").fetchall()
    # two sizes x (A alone, B alone, A+B with two workers); MPS is left out on the CPU
    assert [a for a, _, _ in rows] == ["A alone", "B alone", "A+B", "A+B"] * 2
    assert all(s == "ok" for _, s, _ in rows) and '"step_seconds": 0.03' in rows[-1][2]


@pytest.mark.parametrize("text, message", [
    ("pairs: []\n", "'pairs' must be a list of [JOB_A, JOB_B] pairs"),
    ('pairs: [["selftest", "selftest"]]\ncolour: red\n', "unknown key(s) colour"),
    ('pairs: [["selftest", "selftest"]]\nsweep: {a: [1], b: [2]}\n', "'sweep' must be one parameter"),
    ('pairs: [["selftest", "nosuch"]]\n', "unknown workload 'nosuch'"),
    ("pairs: [\n", "not valid YAML"),
])
def test_share_matrix_bad_files(cli, tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    r = cli("share-matrix", f, "--device", "cpu")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
