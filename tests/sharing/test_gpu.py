"""GPU paths, run on a machine with an NVIDIA GPU: python -m pytest -m gpu tests/sharing/test_gpu.py.

CI has none; there the other files test the CPU paths of the same code."""

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import CHILDREN_LEFT, cell, gpuvs_env, gpuvs_processes
from gpuvs.probes import fingerprint
from gpuvs.sharing import mps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(fingerprint.gpu_count() == 0, reason="needs an NVIDIA GPU (CPU paths: other files)")]

SMALL = ["--model", "resnet18", "--batch-size", "32", "--image-size", "64", "--precision", "bf16"]


def test_cnn_train_on_the_gpu_stores_fingerprint_and_telemetry(cli, tmp_path):
    r = cli("run", "cnn-train", *SMALL, "--steps", "40", "--device", "cuda", "--telemetry-interval", "0.05")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    fp = json.loads(db.execute("SELECT fingerprint FROM trials").fetchone()[0])
    assert fp["gpu_name"] and fp["gpus"][0]["uuid"].startswith("GPU-") and fp["cuda_available"]
    readings = db.execute("SELECT data FROM telemetry").fetchall()
    assert readings and "power_w" in json.loads(readings[0][0])
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 40


def test_cudnn_heuristics_skips_the_autotuning_that_benchmark_does_in_each_trials_first_step(cli, tmp_path):
    """--cudnn reaches the worker: with benchmark, cuDNN times its candidate algorithms in the first step (seconds
    on ResNet-50); with heuristics it does not. Heuristics runs first and last, so a cold machine's first-call
    costs cannot make benchmark's first step the longer one by themselves."""
    job = ["--model", "resnet50", "--batch-size", "64", "--precision", "bf16", "--data-format", "NHWC",
           "--steps", "5", "--warmup-steps", "2", "--device", "cuda"]
    for cudnn in ("heuristics", "benchmark", "heuristics"):
        r = cli("run", "cnn-train", *job, "--cudnn", cudnn)
        assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = [(json.loads(c)["cudnn"], json.loads(s)["first_step_s"])
            for c, s in db.execute("SELECT config, startup FROM trials ORDER BY rowid")]
    assert [c for c, _ in rows] == ["heuristics", "benchmark", "heuristics"]
    first = {c: [f for k, f in rows if k == c] for c in ("heuristics", "benchmark")}
    assert max(first["heuristics"]) < first["benchmark"][0] - 0.5, rows


def test_gpu_out_of_memory_is_a_failed_trial(cli, tmp_path):
    r = cli("run", "cnn-train", "--model", "vgg16", "--batch-size", "16384", "--steps", "1", "--device", "cuda")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    err = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT error FROM trials").fetchone()[0]
    assert err.startswith("out of GPU memory at batch size 16384") and "GiB" in err


@pytest.mark.skipif(mps.find_binary() is None, reason="needs nvidia-cuda-mps-control")
def test_mps_daemon_serves_clients_and_is_gone_afterwards(cli, tmp_path):
    assert mps.mps_processes() == []
    r = cli("share", "cnn-train", *SMALL, "--device", "cuda", "--workers", "2", "--mps", "on", "--duration", "3",
            "--repeats", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    row = cell(r.stdout, "2")  # two workers, both clients of the daemon gpuvs started
    assert row["arm"] == "MPS" and row["MPS clients"] == "2" and "[" in row["vs alone"], row
    assert mps.mps_processes() == [] and gpuvs_processes() == []


@pytest.mark.skipif(mps.find_binary() is None, reason="needs nvidia-cuda-mps-control")
def test_ctrl_c_during_an_mps_run_stops_workers_and_daemon(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "share", "cnn-train", *SMALL, "--device", "cuda",
                             "--workers", "2", "--mps", "on", "--duration", "60"], cwd=tmp_path, env=gpuvs_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not mps.mps_processes():
        time.sleep(0.2)
    time.sleep(8)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    time.sleep(1)
    assert mps.mps_processes() == [] and gpuvs_processes() == []


ZOMBIES = r"""
import ctypes, os, sys
from gpuvs.sharing import mps
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: what gpuvs is as PID 1 of a container or pod
with mps.MpsDaemon() as daemon:
    assert daemon.servers() is not None
""" + CHILDREN_LEFT


@pytest.mark.skipif(mps.find_binary() is None, reason="needs nvidia-cuda-mps-control")
def test_an_mps_daemon_leaves_no_zombie_when_gpuvs_is_its_reaper():
    r = subprocess.run([sys.executable, "-c", ZOMBIES], capture_output=True, text=True, timeout=120, env=gpuvs_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert mps.mps_processes() == []


def test_gpm_reads_how_much_of_the_gpu_a_job_fills_or_says_why_not():
    from gpuvs.sharing import gpm

    window, why = gpm.start(0)
    if window is None:  # a GPU before Hopper: the reason is a plain sentence, and the advisor falls back
        assert "GPM" in why
        return
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < 1.0:
        a @ a
    torch.cuda.synchronize()
    got = window.stop()
    assert got is not None and set(got) == {"sm_active", "sm_occupancy", "tensor_active", "dram_active"}
    assert got["sm_active"] > 50 and got["tensor_active"] > 10, got


@pytest.mark.skipif(mps.find_binary() is None, reason="needs nvidia-cuda-mps-control")
def test_mps_knob_arms_run_and_leave_nothing(cli, tmp_path):
    r = cli("share", "cnn-infer", *SMALL, "--device", "cuda", "--with", "cnn-train " + " ".join(SMALL),
            "--mps", "both", "--mps-threads", "100:30", "--mps-mem-limit", "4G:8G", "--repeats", "1", "--duration", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    for arm in ("A+B, time-sliced", "A+B, MPS", "A+B, MPS, threads 100:30%", "A+B, MPS, memory limit 4G:8G"):
        assert arm in r.stdout
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status FROM trials").fetchall()
    assert len(rows) == 2 + 4 * 2 and all(s == "ok" for s, in rows)  # A alone, B alone, each arm's pair
    assert mps.mps_processes() == [] and gpuvs_processes() == []


@pytest.mark.skipif(mps.find_binary() is None, reason="needs nvidia-cuda-mps-control")
def test_a_client_over_its_mps_memory_limit_fails_the_capacity_sweep_with_the_cause(cli, tmp_path):
    r = cli("share", "--capacity", "kernels", "--app", "hotspot3D", "--scale", "small", "--check", "false",
            "--hold-mb", "2000", "--device", "cuda", "--mps", "on", "--mps-mem-limit", "1G", "--max-workers", "2",
            "--duration", "1")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "largest count that ran: 0; first failure at instance 1: out of GPU memory holding --hold-mb 2000" in r.stdout
    assert mps.mps_processes() == [] and gpuvs_processes() == []


@pytest.mark.skipif(fingerprint.gpu_count() < 2, reason="needs 2 GPUs: a UUID that is not NVML's index 0")
def test_a_gpu_named_by_uuid_in_cuda_visible_devices_is_found_by_its_nvml_index(monkeypatch):
    """Device plugins hand a pod its GPU as CUDA_VISIBLE_DEVICES=GPU-<uuid>: telemetry and the GEMM's checks must
    read that GPU, not NVML's first one."""
    from gpuvs.probes import telemetry

    gpus = fingerprint.nvml_info()["gpus"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus[-1]["uuid"])
    assert telemetry.visible_gpu_indices("cuda", 1) == [gpus[-1]["index"]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{gpus[-1]['uuid']},{gpus[0]['uuid']}")
    assert telemetry.visible_gpu_indices("cuda", 2) == [gpus[-1]["index"], gpus[0]["index"]]
