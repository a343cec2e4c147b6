"""GPU paths, run on a machine with an NVIDIA GPU (CI has none: there the CPU paths of the same code
are tested by the other files). Run: python -m pytest -m gpu tests/test_gpu.py"""

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import gpuvs_env, gpuvs_processes
from gpuvs import fingerprint, mps

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


def test_gpu_out_of_memory_is_a_failed_trial(cli, tmp_path):
    r = cli("run", "cnn-train", "--model", "vgg16", "--batch-size", "16384", "--steps", "1", "--device", "cuda")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    err = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT error FROM trials").fetchone()[0]
    assert err.startswith("out of GPU memory at batch size 16384") and "GiB" in err


@pytest.mark.skipif(mps.find_binary() is None, reason="needs nvidia-cuda-mps-control")
def test_mps_daemon_serves_clients_and_is_gone_afterwards(cli, tmp_path):
    assert mps.mps_processes() == []
    r = cli("share", "cnn-train", *SMALL, "--device", "cuda", "--workers", "2", "--mps", "on", "--duration", "3")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "│ 2 │ on" in r.stdout.replace("       ", " ") or " on " in r.stdout
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
