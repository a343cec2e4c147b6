"""gpuvs share / advise-mps on the CPU for real (the selftest and CNN workloads), the start barrier,
and the MPS daemon's guards. The MPS lifecycle itself needs a GPU: tests/sharing/test_gpu.py."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import cell, gpuvs_processes, require
from gpuvs.errors import EnvironmentUnavailable
from gpuvs.report.sharing import figure_text, ratio_text
from gpuvs.trial.runner import Runner
from gpuvs.sharing import knobs, mps
from gpuvs.workloads import barrier
from gpuvs.sharing import share_stats as sharestats
from gpuvs.sharing.advice import mps_gain, predict
from gpuvs.sharing.group import Coordinator, Group, normalized_sum, worker_spec
from gpuvs.store.records import SampleRecord
from gpuvs.spec import RunSpec
from gpuvs.store.records import SeriesSummary
from gpuvs.store.db import Store


def test_workers_measure_the_same_window(store_path):
    spec = RunSpec(workload="selftest", device="cpu", params={"step_seconds": 0.02})
    with Store(store_path) as st:
        g = Coordinator(Runner(st, timeout_s=120), window_s=1.5).group([spec] * 3, "3 workers", False)
    assert g.ok and len(g.trials) == 3
    for t in g.trials:
        n = t.primary().n
        # 1.5 s of 20 ms steps: about 75 steps each, never the 10 million asked for
        assert 40 <= n <= 80, n
        assert t.primary().total_seconds == pytest.approx(1.5, abs=0.25)
    assert g.fairness > 0.8 and g.aggregate == pytest.approx(sum(g.values()))
    assert gpuvs_processes() == []


def zombie_children() -> list[int]:
    """Children of this process that ended and were never waited for."""
    me, out = str(os.getpid()), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] == "Z":
                out.append(int(d))
    return out


def test_a_worker_failing_before_the_start_stops_its_group(store_path):
    # the good worker waits at the barrier (a long window) while the other fails in its warm-up: the group
    # must stop the waiting one rather than measure it alone or leave it behind
    good = RunSpec(workload="selftest", device="cpu", params={"step_seconds": 0.01})
    bad = RunSpec(workload="selftest", device="cpu", params={"fail_at_start": True})
    with Store(store_path) as st:
        g = Coordinator(Runner(st, timeout_s=120), window_s=60).group([good, bad], "mixed", False)
        rows = [(r.status, r.error) for r in st.trials()]
    assert not g.ok and "worker 1 failed before the start" in g.failure and "--fail-at-start" in g.failure
    assert rows[0] == ("failed", "stopped: another worker of its group failed before the start")
    assert rows[1][0] == "failed" and "failed before its timed part as asked" in rows[1][1]
    assert gpuvs_processes() == [] and zombie_children() == []


def test_share_cli_scaling_table(cli, tmp_path):
    r = cli("share", "selftest", "--step-seconds", "0.02", "--workers", "1,2", "--duration", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    assert "sharing one GPU (1 s window, 2 repeat(s))" in r.stdout and "fairness" in r.stdout
    # two sleeping workers do twice the steps of one: vs alone ~2.0, an interval, and compare's verdict
    vs = cell(r.stdout, "2")["vs alone"]
    # (on a loaded 2-core machine the interval of two repeats can be wide: the verdict is then inconclusive)
    assert vs.split()[-1] in ("faster", "inconclusive") and 1.6 < float(vs.split("[")[0]) < 2.5 and "[" in vs, vs
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status FROM trials").fetchall()
    assert rows == [("1 worker", "ok"), ("2 workers", "ok"), ("2 workers", "ok")] * 2


def test_share_cli_pairs_with_intervals(cli, tmp_path):
    r = cli("share", "selftest", "--step-seconds", "0.05", "--with", "selftest --step-seconds 0.02",
            "--duration", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    assert "interference: A = selftest, B = selftest (2 repeat(s))" in r.stdout
    # alone: 1 / 0.05 s = ~20 steps/s for A; together on 2 CPU cores sleeps do not interfere: work ~2.0
    row = cell(r.stdout, "A+B, time-sliced")
    assert 1.8 < float(row["work"].split("[")[0]) < 2.1, row
    # selftest samples carry each step's seconds: A's latency is its 50 ms sleep, alone and together
    for run in ("A alone", "A+B, time-sliced"):
        p50, p99 = (float(cell(r.stdout, run)[k].split("[")[0]) for k in ("A p50 ms", "A p99 ms"))
        assert 50 <= p50 < 56 and p50 <= p99 < 150, (run, p50, p99)
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status FROM trials").fetchall()
    assert rows == [("A alone", "ok"), ("B alone", "ok"), ("A+B, time-sliced", "ok"), ("A+B, time-sliced", "ok")] * 2
    assert gpuvs_processes() == []


def test_share_cli_capacity_counts_until_the_first_failure(cli, tmp_path):
    r = cli("share", "--capacity", "selftest", "--step-seconds", "0.02", "--max-workers", "3", "--duration", "0.5")
    assert r.returncode == 0, r.stderr
    assert "largest count that ran: 3; no failure up to the cap of 3" in r.stdout
    r = cli("share", "--capacity", "selftest", "--step-seconds", "0.02", "--room", "2", "--max-workers", "5",
            "--duration", "0.5")
    assert r.returncode == 0, r.stderr
    assert "largest count that ran: 2; first failure at instance 3: out of room: 2 selftest workers" in r.stdout
    # the instances that ran were told to stop and ended normally, each stored with its samples
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute(
        "SELECT status FROM trials ORDER BY id").fetchall()[3:]
    assert [s for s, in rows] == ["ok", "ok", "failed"]
    r = cli("share", "--capacity", "selftest", "--fail-at-start", "--max-workers", "3", "--duration", "0.5")
    assert r.returncode == 0 and "largest count that ran: 0; first failure at instance 1" in r.stdout
    assert gpuvs_processes() == []


def test_capacity_sweep_measures_every_count_in_its_own_window(store_path):
    spec = RunSpec(workload="selftest", device="cpu", params={"step_seconds": 0.02})
    with Store(store_path) as st:
        run = Coordinator(Runner(st, timeout_s=120), window_s=1.0).capacity(spec, 3)
    assert [s.count for s in run.steps] == [1, 2, 3] and run.failed_at is None
    for st_ in run.steps:
        # each running instance is measured in the window: about 50 steps/s each (20 ms sleeps)
        assert len(st_.rates) == st_.count and all(35 < x < 52 for x in st_.rates), st_.rates
        assert st_.aggregate == pytest.approx(sum(st_.rates))
    assert [t.status for t in run.trials] == ["ok"] * 3
    # instance 1 ran through all three windows, so it did more steps than instance 3
    assert run.trials[0].primary().n > run.trials[2].primary().n
    assert gpuvs_processes() == [] and zombie_children() == []


@pytest.mark.parametrize("args, message", [
    (["share", "selftest", "--workers", "0"], "--workers wants counts from 1 to 512"),
    (["share", "selftest", "--workers", "a,b"], "--workers wants counts"),
    (["share", "selftest", "--mps", "on"], "--mps applies to GPU runs"),
    (["share", "selftest", "--mps", "sometimes"], "--mps: 'sometimes' is not allowed; expected one of off, on, both"),
    (["share", "selftest", "--with", "nosuch"], "unknown workload 'nosuch'"),
    (["share", "selftest", "--with", "selftest --bogus 1"], "unknown option --bogus for --with selftest"),
    (["advise-mps", "selftest"], "advise-mps wants two quoted jobs"),
    (["share", "selftest", "--mps-threads", "50"], "--mps-threads and --mps-mem-limit are MPS settings: they need a GPU"),
    (["share", "selftest", "--mps-threads", "0"], "--mps-threads: '0': each value is a whole"),
    (["share", "selftest", "--with", "selftest", "--mps-threads", "1:2:3"],
     "--mps-threads: '1:2:3' names 3 clients but the run has 2 jobs"),
    (["share", "selftest", "--mps-mem-limit", "lots"], "--mps-mem-limit: 'lots': each value is"),
    (["share", "selftest", "--also-host"], "--also-host goes with --capacity and --env container"),
    (["share", "selftest", "--repeats", "0"], "--repeats"),
    (["advise-mps", "--pairs", "/nonexistent.yaml"], "/nonexistent.yaml: no such file"),
    (["advise-mps", "selftest", "selftest", "--pairs", "x.yaml"], "either two quoted jobs or --pairs FILE, not both"),
    (["advise-mps", "selftest", "selftest", "--duration", "2", "--max-duration", "1"],
     "--max-duration 1 is shorter than --duration 2: the longest calibrated window must be at least the shortest"),
])
def test_share_bad_input(cli, args, message):
    r = cli(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.quiet  # its figures read timing (tests/quiet.py)
def test_advise_mps_runs_solo_then_together_on_cpu(cli, tmp_path):
    # windows calibrated (sharing/windows.py): A's 50 ms steps give 20 in the 1 s --duration, fewer than the 50
    # wanted, so A is measured alone again at 2.5 s and the pair gets the window A needs taking turns (5 s), capped
    # by --max-duration 3; B's 10 ms steps give 100 in 1 s and keep it
    r = cli("advise-mps", "selftest --step-seconds 0.05", "selftest --step-seconds 0.01", "--duration", "1",
            "--max-duration", "3", "--repeats", "2", "--max-repeats", "5", "--json", tmp_path / "advice.json")
    assert r.returncode == 0, r.stderr
    assert "prediction: no difference (from none)" in r.stdout and "no GPU telemetry" in r.stdout
    assert "A alone" in r.stdout and "A+B" in r.stdout and "measured: no verdict (MPS needs a GPU" in r.stdout
    out = " ".join(r.stdout.split())
    assert "A alone: window 2.5" in out and "1 s would hold 20 steps (at least 50 wanted)" in out, out
    assert "A+B: window 3 s, capped by --max-duration (it needs 5" in out and "B alone: window 1 s (--duration)" in out
    data = json.loads((tmp_path / "advice.json").read_text())
    assert data["predicted"] == "no difference" and data["measured"] is None and len(data["solo"]) == 2
    assert data["window"]["seconds"] == 3.0 and data["window"]["deciding"] == "selftest --step-seconds 0.05"
    assert 2.4 < data["solo_windows"]["A alone"]["seconds"] < 2.9 and data["solo_windows"]["B alone"]["seconds"] == 1.0
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = db.execute("SELECT arm, spec, (SELECT count(*) FROM samples WHERE trial_id = trials.id) FROM trials "
                      "ORDER BY id").fetchall()
    # A's short window is stored (its calibration); later repeats measure it at its own window straight away
    assert [a for a, _, _ in rows] == ["A alone", "A alone", "B alone", "A+B", "A+B", "A alone", "B alone", "A+B", "A+B"]
    windows = [json.loads(spec)["barrier"]["window_s"] for _, spec, _ in rows]
    assert windows[0] == 1.0 and windows[2] == windows[6] == 1.0 and windows[3:5] == windows[7:9] == [3.0, 3.0]
    assert windows[1] == windows[5] == data["solo_windows"]["A alone"]["seconds"]
    steps = [n for _, _, n in rows]
    assert steps[0] <= 21 and steps[1] >= 45 and steps[5] >= 45 and steps[3] >= 55, steps  # A: 50 ms steps


def _solo(busy, gpm=None, mem=1000.0, mem_util=20.0):
    return ({"util_gpu_mean": busy, "util_mem_mean": mem_util}, gpm, mem)


def _gpm(occ, tensor, dram):
    return {"sm_active": 90.0, "sm_occupancy": occ, "tensor_active": tensor, "dram_active": dram}


def test_mps_prediction_from_gpm():
    # both busy in time (GPM SM activity 90% each, read inside the window): they contend; MPS is credited with
    # 1 + RAMP x min(1, 1.80) + BOTH_DRAM x min(35%, 15%) = 1 + 0.0946 + 0.0575 x 0.15, whatever the fills
    # (occupancy 30% + 10% is no room for a second job)
    a = predict([_solo(91, _gpm(30, 25, 35)), _solo(79, _gpm(10, 5, 15))], 80000, 0.05)
    assert a.prediction == "mps helps" and a.source == "gpm"
    assert a.ratio == pytest.approx(1.1032, abs=1e-4) == mps_gain(1.8, 0.15)
    assert a.work_sliced == pytest.approx(2 / 1.80 * 0.91) and a.work_mps == pytest.approx(1.1155, abs=1e-4)
    assert "busy time alone (GPM SM activity): 90% and 90%" in a.reasons[0]
    assert "sm_occupancy 30% + 10%" in a.reasons[1] and "busy together 180%" in a.reasons[2]
    assert "both streaming memory 15%" in a.reasons[2]
    # both fill the memory system: the largest gain the rule gives, 1.152 (two 1 GiB copies measured 1.11,
    # two 256 MiB copies 1.12)
    full = {**_gpm(40, 0, 100), "sm_active": 99.0}
    assert predict([_solo(99, full), _solo(99, full)], 80000, 0.05).ratio == pytest.approx(1.1521, abs=1e-4)
    # a margin wider than the gain: no difference
    assert predict([_solo(99, full), _solo(99, full)], 80000, 0.16).prediction == "no difference"
    # busy 40% and 50%: taking turns does not interleave their gaps, MPS gains 1 + 0.0946 x 0.9 + 0.0575 x 0.1;
    # work with MPS is capped at both at full speed (2), so time-slicing is what falls short
    a = predict([_solo(40, {**_gpm(20, 0, 10), "sm_active": 40.0}), _solo(50, {**_gpm(20, 0, 10), "sm_active": 50.0})],
                80000, 0.05)
    assert a.prediction == "mps helps" and a.ratio == pytest.approx(1.0909, abs=1e-4)
    assert a.work_mps == 2.0 and a.work_sliced == pytest.approx(2 / 1.0909, abs=1e-3)
    assert any("gaps do not interleave" in r for r in a.reasons)
    # two jobs each busy 4% of the time: next to nothing to overlap, no difference (1.008)
    tiny = {**_gpm(2, 0, 1), "sm_active": 4.0}
    a = predict([_solo(10, tiny), _solo(10, tiny)], 80000, 0.05)
    assert a.prediction == "no difference" and a.ratio == pytest.approx(1.0081, abs=1e-4) and a.work_mps == 2.0
    assert predict([_solo(50, mem=50000), _solo(50, mem=40000)], 80000, 0.05).prediction == "will not fit"


def test_mps_prediction_without_gpm_says_so():
    a = predict([_solo(91, None), _solo(79, _gpm(10, 5, 15))], 80000, 0.05)
    assert a.source == "nvml-utilisation" and a.prediction == "mps helps" and a.ratio == pytest.approx(1 / 0.91)
    assert "no GPM here" in " ".join(a.reasons)
    assert predict([_solo(30, None), _solo(40, None)], 80000, 0.05).prediction == "no difference"
    assert predict([({}, None, None), ({}, None, None)], None, 0.05).source == "none"


def test_sharing_figures_and_mps_verdict_words():
    f = sharestats.figure([10.0, 12.0, None, 11.0])
    assert f.mean == pytest.approx(11.0) and f.low < 11.0 < f.high and figure_text(f) == \
        f"11.0 [{f.low:.2f}, {f.high:.1f}]"  # three significant figures: 8.52, 13.5
    assert figure_text(sharestats.figure([5.0])) == "5.00" and figure_text(sharestats.figure([])) == "-"
    sliced = [1.00, 1.01, 0.99, 1.00]
    helps = sharestats.mps_verdict(sliced, [1.30, 1.28, 1.31, 1.29], 0.05)
    assert helps.words == "mps helps" and helps.verdict == "faster" and helps.ratio == pytest.approx(1.295, rel=0.01)
    assert ratio_text(helps) == f"{helps.ratio:.3f} [{helps.ci_low:.3f}, {helps.ci_high:.3f}] faster"
    assert sharestats.mps_verdict(sliced, [0.80, 0.82, 0.79, 0.81], 0.05).words == "mps hurts"
    assert sharestats.mps_verdict(sliced, [1.00, 1.01, 0.99, 1.005], 0.05).words == "no difference"
    assert sharestats.mps_verdict(sliced, [0.7, 1.4], 0.05).words == "inconclusive"
    lat = sharestats.latency_ms([SampleRecord(None, "main", i, 1.0, "x", seconds=s / 1000)
                                 for i, s in enumerate([1.0] * 98 + [5.0, 9.0])])
    assert lat.p50 == pytest.approx(1.0) and lat.p99 > 5.0 and lat.n == 100


def test_mps_knob_arms():
    arms = knobs.arms("both", "50,30:70", "2G:40G", 2, "cuda:1")
    assert [a.label for a in arms] == ["time-sliced", "MPS", "MPS, threads 50%", "MPS, threads 30:70%",
                                       "MPS, memory limit 2G:40G"]
    assert arms[2].client_env == [{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}] * 2
    assert arms[3].client_env == [{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}]
    assert arms[4].client_env[1] == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=40G"} and all(a.mps for a in arms[1:])
    spec = worker_spec(RunSpec(workload="selftest", device="cuda"), "/tmp/x", "w0", 1.0, "l", 0,
                       type("D", (), {"client_env": lambda self: {"CUDA_MPS_PIPE_DIRECTORY": "/p"}, "pipe_dir": "/p"})(),
                       arms[3].client_env[1])
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70" in spec.env.options["env_var"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/p" in spec.env.options["env_var"]


def test_normalized_sum():
    from gpuvs.trial.runner import TrialResult

    g = Group("A+B", False)
    for v in (50.0, 30.0):
        t = TrialResult(spec=RunSpec(workload="selftest"), status="ok")
        t.summary = {"main": SeriesSummary(1, "steps/sec", value=v)}
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


@pytest.mark.parametrize("signame, status", [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stop_during_a_shared_window_stops_every_worker(tmp_path, signame, status):
    from conftest import gpuvs_env
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "share", "selftest", "--workers", "2", "--duration", "60",
                             "--children", "1"], cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and "1 worker" not in (proc.stdout.readline() or ""):
        pass
    time.sleep(3)
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status, error FROM trials").fetchall()
    assert rows == [("1 worker", "interrupted", "interrupted by the user" if signame == "SIGINT" else
                     f"gpuvs was stopped by {signame}")]
    time.sleep(0.5)
    assert gpuvs_processes() == []


def test_share_workers_is_the_job_count_and_data_workers_reaches_the_cnn():
    from rich.console import Console
    from gpuvs.cli import commands, common, parser

    def prepared(command, *argv):
        args = parser.parse(commands.get(command), list(argv), f"gpuvs {command}")
        return args, common.prepare(args, Console(file=open(os.devnull, "w")))

    args, prep = prepared("share", "cnn-train", "--workers", "1,2,4", "--data-workers", "3", "--device", "cpu")
    assert args.group("share")["workers"] == "1,2,4" and prep.base.params["workers"] == 3
    _, prep = prepared("run", "cnn-train", "--workers", "2", "--device", "cpu")
    assert prep.base.params["workers"] == 2


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is installed by .ci/run")
def test_containers_share_one_window(cli, tmp_path):
    r = cli("share", "selftest", "--step-seconds", "0.02", "--env", "container", "--rootfs", "/:O", "--workers", "2",
            "--duration", "1", "--repeats", "1")
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
    ('pairs: [["selftest", "selftest"]]\ncolour: red\n', "bad.yaml:2: unknown key(s) colour; allowed: "),
    ('pairs: [["selftest", "selftest"]]\ndurration: 3\n', "bad.yaml:2: unknown key(s) durration (did you mean "
     "'duration'?); allowed: "),
    ('pairs: [["selftest", "selftest"]]\nsweep: {a: [1], b: [2]}\n', "'sweep' must be one parameter"),
    ('pairs: [["selftest", "nosuch"]]\n', "unknown workload 'nosuch'"),
    ("pairs: [\n", "not valid YAML"),
    ('pairs: [["selftest", "selftest"]]\ntimeout_s: .nan\n', "bad.yaml: timeout_s: nan is not allowed; expected a number "
     ">= 0.001 (NaN and infinities are not allowed)"),
    ('pairs: [["selftest", "selftest"]]\nduration: .inf\n', "bad.yaml: duration: inf is not allowed"),
    # the experiment file's loader: a job given as a list, a bad pair and an alias bomb say FILE:LINE in one line
    ('name: x\npairs:\n  - [[a], "selftest"]\n', 'bad.yaml:3: a job is a quoted string such as "selftest --noise", '
     "not a list"),
    ('pairs:\n  - ["selftest", "selftest"]\n  - "selftest"\n', "bad.yaml:3: 'pairs' must be a list of [JOB_A, "
     "JOB_B] pairs"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\npairs: [[*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]]\n",
     "bad.yaml:4: the file holds more than 10000 values, aliases (*NAME) counted at every use; a pairs file takes at "
     "most 10000"),
])
def test_share_matrix_bad_files(cli, tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    r = cli("share-matrix", f, "--device", "cpu")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_capacity_with_containers_as_the_unit_and_processes_beside(cli, tmp_path):
    require("podman", "the containers capacity sweep runs podman")
    r = cli("share", "--capacity", "selftest", "--step-seconds", "0.02", "--room", "2", "--max-workers", "4",
            "--duration", "0.5", "--env", "container", "--rootfs", "/:O", "--also-host")
    assert r.returncode == 0, r.stderr
    for unit in ("containers", "processes"):
        assert f"{unit}, time-sliced: largest count that ran: 2; first failure at instance 3: out of room" in r.stdout
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status, fingerprint FROM trials ORDER BY id").fetchall()
    assert [(a, s) for a, s, _ in rows] == [("capacity, container, time-sliced", s) for s in ("ok", "ok", "failed")] + \
        [("capacity, process, time-sliced", s) for s in ("ok", "ok", "failed")]
    assert all('"container_image": "rootfs:/:O"' in fp for _, s, fp in rows[:2])
    assert all('"container_image"' not in fp for _, s, fp in rows[3:5])  # plain processes on this machine
    left = subprocess.run(["podman", "ps", "-a", "--filter", "label=gpuvs", "-q"], capture_output=True, text=True)
    assert left.stdout.strip() == "" and gpuvs_processes() == []


@pytest.mark.parametrize("signame, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_during_a_capacity_sweep_leaves_nothing(tmp_path, signame, status):
    from conftest import gpuvs_env
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "share", "--capacity", "selftest", "--children", "1",
                             "--max-workers", "50", "--duration", "2"], cwd=tmp_path, env=gpuvs_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and "2 instances" not in (proc.stdout.readline() or ""):
        pass
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    # read through gpuvs's store: a stop that lands between a trial's row and its launch leaves that row
    # 'running' with a dead owner, which the store marks interrupted when it is next opened
    with Store(tmp_path / "gpuvs.db") as st:
        rows = [r.status for r in st.trials()]
    assert len(rows) >= 2 and all(s == "interrupted" for s in rows), rows
    time.sleep(0.5)
    assert gpuvs_processes() == []


def test_a_worker_dying_during_a_capacity_window_ends_the_sweep(store_path):
    # instance 2 dies abruptly at its 30th step, inside the window measured with two running
    spec = RunSpec(workload="selftest", device="cpu", params={"step_seconds": 0.02, "exit_at_step": 30})
    with Store(store_path) as st:
        run = Coordinator(Runner(st, timeout_s=120), window_s=2.0).capacity(spec, 5)
    assert run.failed_at in (1, 2) and "ended while" in run.failure and "status 17" in run.failure
    assert gpuvs_processes() == [] and zombie_children() == []


def test_advise_mps_pairs_file_runs_each_job_alone_once_per_repeat(cli, tmp_path):
    f = tmp_path / "pairs.yaml"
    f.write_text('pairs:\n  - ["selftest --step-seconds 0.02", "selftest --step-seconds 0.03"]\n'
                 '  - ["selftest --step-seconds 0.02", "selftest --step-seconds 0.04"]\n')
    # --max-duration at --duration: every window 0.5 s, uncalibrated
    r = cli("advise-mps", "--pairs", f, "--repeats", "1", "--duration", "0.5", "--max-duration", "0.5",
            "--json", tmp_path / "a.json")
    assert r.returncode == 0, r.stderr
    assert "predicted against measured, 2 pairs" in r.stdout and "hit rate: 0/0" in r.stdout
    arms = [a for a, in sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm FROM trials ORDER BY id")]
    # the shared job runs alone once, not once per pair; each pair runs together (no MPS on the CPU)
    assert arms == ["alone: selftest --step-seconds 0.02", "alone: selftest --step-seconds 0.03",
                    "alone: selftest --step-seconds 0.04", "pair 1: A+B", "pair 1: A+B", "pair 2: A+B", "pair 2: A+B"]
    data = json.loads((tmp_path / "a.json").read_text())
    assert [d["b"] for d in data] == ["selftest --step-seconds 0.03", "selftest --step-seconds 0.04"]
    # two sleeping jobs barely slow each other: work near 2 (wide bounds: 0.5 s windows on a loaded machine)
    assert all(len(d["work"]["A+B"]) == 1 and 1.3 < d["work"]["A+B"][0] < 2.7 for d in data), data
    r = cli("advise-mps", "--pairs", f, "--repeats", "1", "--duration", "0.5", "--max-duration", "0.5",
            "--predict-only", "--store", "p.db")
    assert r.returncode == 0, r.stderr
    assert len(sqlite3.connect(tmp_path / "p.db").execute("SELECT arm FROM trials").fetchall()) == 3


def test_gemm_and_membw_share_a_window_one_shape_or_copy_each(store_path):
    gemm = RunSpec(workload="gemm", device="cpu", params={"shape": ["64x64x64"], "check": False, "block_ms": 5.0})
    copy = RunSpec(workload="membw", device="cpu", params={"kind": ["d2d"], "size": ["1MiB"], "block_ms": 5.0})
    with Store(store_path) as st:
        coord = Coordinator(Runner(st, timeout_s=120), window_s=1.0)
        g = coord.group([gemm, copy], "gemm+membw", False)
        assert g.ok, [t.error for t in g.trials]
        # the window, not a count of blocks (--repeats), ended each: blocks of 5 ms when the CPU is free, but two
        # jobs' thread pools on this machine's few cores can stretch one a hundredfold, so the test asks what holds
        # whatever their length: about the window's worth of blocks, and none started after the window closed
        for t in g.trials:
            secs = [x.seconds for x in t.samples]
            assert len(secs) == t.primary().n and sum(secs) == pytest.approx(t.primary().total_seconds)
            assert sum(secs) >= 0.65 and sum(secs[:-1]) <= 1.1, secs
        whole_set = RunSpec(workload="gemm", device="cpu", params={"set": "square"})
        bad = coord.group([whole_set], "set", False)
    assert not bad.ok and "one GEMM shape per job: give --shape MxNxK" in bad.failure
