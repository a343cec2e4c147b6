"""The command line, run as a user runs it: real processes, real SQLite files."""

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import gpuvs_env, gpuvs_processes


@pytest.mark.parametrize("args, message", [
    (["run", "nosuch"], "unknown workload 'nosuch'; known workloads: "),
    (["run", "cnn-train", "--model", "resnet9"], "--model: 'resnet9' is not allowed; expected one of resnet18, "),
    (["run", "cnn-train", "--batch-size", "0"], "--batch-size: '0' is not allowed; expected an integer from 1"),
    (["run", "cnn-train", "--batch-size", "-4"], "--batch-size: '-4' is not allowed"),
    (["run", "cnn-train", "--colour", "red"], "unknown option --colour for gpuvs run cnn-train; options: "),
    (["run", "cnn-train", "--precision", "fp64"], "expected one of fp32, tf32, fp16, bf16"),
    (["run", "cnn-train", "--device", "cuda"], "device cuda asked for, but this machine has no usable NVIDIA GPU"),
    (["run", "cnn-train", "--device", "cuda", "--num-gpus", "4"], "no usable NVIDIA GPU"),
    (["run", "cnn-train", "--device", "tpu"], "unknown device 'tpu': use cuda, cuda:N or cpu"),
    (["run", "cnn-train", "--data-dir", "/no/such/dir"], "--data-dir '/no/such/dir' is not a folder"),
    (["run", "selftest", "--num-gpus", "2", "--device", "cpu"], "selftest runs on one device"),
    (["run", "cnn-train", "--image", "x"], "--image applies to --env container, not to the host"),
    (["results", "show", "nope"], "no store at gpuvs.db"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_started(cli, tmp_path, args, message):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpuvs: error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert not (tmp_path / "gpuvs.db").exists() or args[0] == "results"
    assert gpuvs_processes() == []


def test_help_lists_a_workloads_options(cli):
    r = cli("run", "cnn-train", "--help")
    assert r.returncode == 0 and "--batch-size" in r.stdout and "--data-format" in r.stdout and "--trials" in r.stdout
    r = cli("workloads")
    assert r.returncode == 0 and "cnn-train" in r.stdout and "selftest" in r.stdout


def test_info_works_without_a_gpu(cli):
    r = cli("info", "--json")
    fp = json.loads(r.stdout)
    assert r.returncode == 0 and fp["cpu_count"] >= 1 and "limits" in fp and "torch" in fp
    r = cli("info")
    assert r.returncode == 0 and "CPU" in r.stdout and "cgroup" in r.stdout


def test_run_trials_then_results_list_show_export(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "4", "--trials", "2", "--name", "smoke")
    assert r.returncode == 0, r.stderr
    assert "no NVIDIA GPU found here; running on the CPU" in r.stdout
    assert r.stdout.count("total steps/sec:") == 2 and "Summary across trials" in r.stdout
    r = cli("results", "list")
    assert r.returncode == 0 and "smoke" in r.stdout and "2/2" in r.stdout
    exp_id = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT id FROM experiments").fetchone()[0]
    r = cli("results", "show", exp_id[:12])
    assert r.returncode == 0 and r.stdout.count(" ok ") >= 2
    r = cli("results", "export", "--format", "json", "-o", "all.json")
    data = json.loads((tmp_path / "all.json").read_text())
    assert len(data["trials"]) == 2 and len(data["trials"][0]["samples"]) == 4
    r = cli("results", "export", "--format", "csv")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 3


def test_failed_trials_make_a_nonzero_exit_after_the_others_ran(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "3", "--trials", "2", "--fail-at-step", "2")
    assert r.returncode == 1 and "2 of 2 trial(s) failed" in r.stderr and "Traceback" not in r.stderr
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, error FROM trials").fetchall()
    assert rows == [("failed", "selftest failed at step 2 as asked")] * 2


def test_timeout_option(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "100", "--step-seconds", "1", "--timeout", "3", "--quiet")
    assert r.returncode == 1 and "timed out after 3 s" in r.stdout
    assert gpuvs_processes() == []


def test_ctrl_c_keeps_finished_trials_and_marks_the_one_in_flight(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--steps", "6", "--step-seconds",
                             "0.5", "--trials", "3", "--children", "1"], cwd=tmp_path, env=gpuvs_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # wait for the second trial to be in flight
    deadline = time.time() + 120
    db = tmp_path / "gpuvs.db"
    while time.time() < deadline:
        if db.exists():
            try:
                rows = sqlite3.connect(db).execute("SELECT status FROM trials").fetchall()
            except sqlite3.OperationalError:
                rows = []
            if len(rows) == 2:
                break
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; finished trials are kept" in err and "Traceback" not in err
    rows = sqlite3.connect(db).execute("SELECT trial, status FROM trials ORDER BY id").fetchall()
    assert rows == [(0, "ok"), (1, "interrupted")]
    samples = sqlite3.connect(db).execute("SELECT COUNT(*) FROM samples s JOIN trials t ON t.id=s.trial_id "
                                          "WHERE t.trial=0").fetchone()[0]
    assert samples == 6
    time.sleep(0.5)
    assert gpuvs_processes() == []
    # children of the interrupted worker are gone too
    assert subprocess.run(["pgrep", "-f", "while True: time.sleep"], capture_output=True).stdout == b""


@pytest.mark.parametrize("args", [["run", "--help"], ["run", "cnn-train", "--help"], ["compare", "--help"],
                                  ["share", "--help"], ["doctor", "--help"], ["advise-mps", "--help"],
                                  ["share-matrix", "--help"], ["report", "--help"], ["serve", "--help"]])
def test_every_command_explains_itself(cli, args):
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "option" in r.stdout.lower()
