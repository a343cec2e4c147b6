"""`--engine docker` for real: the docker client (on PATH here, with no daemon of its own) talking to a
Docker-API engine, podman's own API service, which the tests start on a private socket; the image is
a real one built from this machine's Python and numpy (tests/images.py). What runs is gpuvs's docker
code path end to end: the docker command line, image inspection, labels, limits, removal."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest

from conftest import gpuvs_env, gpuvs_processes
from gpuvs.environments import engine as engines
from images import import_image, podman, python_rootfs

pytestmark = pytest.mark.skipif(not (shutil.which("docker") and shutil.which("podman")),
                                reason="needs the docker client and podman (its API service) on PATH")


class Service:
    """podman's Docker-compatible API service on a private socket."""

    def __init__(self, sock):
        self.host = f"unix://{sock}"
        argv = engines.detect("podman").argv("system", "service", "--time=0", self.host)
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)

    def stop(self):
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = Service(tmp_path_factory.mktemp("api") / "docker.sock")
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            r = docker(svc.host, "version", "--format", "{{.Server.Version}}")
            if r.returncode == 0:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"podman's API service did not answer on {svc.host}: {r.stderr}")
        yield svc
    finally:
        svc.stop()
    assert svc.proc.poll() is not None


@pytest.fixture(scope="module")
def docker_host(service):
    return service.host


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    folder = tmp_path_factory.mktemp("image")
    tag = f"localhost/gpuvs-test-python:{uuid.uuid4().hex[:8]}"
    import_image(python_rootfs(folder / "root"), tag, folder / "image.tar")
    yield tag
    podman("rmi", "-f", tag)


def docker(host, *args):
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DOCKER_HOST": host})


def gpuvs_containers(host):
    r = docker(host, "ps", "-a", "--filter", "label=gpuvs", "--format", "{{.Names}}")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_docker_runs_a_workload_in_an_image_with_limits_seen_inside(docker_host, image, tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    evil = f"x'; touch {box}/semi $(touch {box}/dollar)"
    r = subprocess.run([sys.executable, "-m", "gpuvs", "run", "selftest", "--env", "container", "--engine", "docker",
                        "--image", image, "--device", "cpu", "--steps", "3", "--text", evil, "--cpus", "1",
                        "--memory", "256m", "--shm-size", "96m", "--mount", f"{box}:{box}"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=gpuvs_env(DOCKER_HOST=docker_host))
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(box.iterdir()) == []  # the text reached the workload as data: nothing ran
    row = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT fingerprint, spec, status FROM trials").fetchone()
    fp, spec = json.loads(row[0]), json.loads(row[1])
    assert row[2] == "ok" and spec["env"]["options"]["engine"] == "docker" and spec["params"]["text"] == evil
    assert fp["in_container"] and fp["pid"] == 1 and fp["container_image"] == image
    assert fp["limits"]["cpu_limit"] == 1.0 and fp["limits"]["memory_limit_mib"] == 256
    assert fp["limits"]["shm_mib"] == 96
    assert gpuvs_containers(docker_host) == []


def test_ctrl_c_of_a_docker_run_leaves_no_container_and_no_process(service, docker_host, image, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--env", "container", "--engine",
                             "docker", "--image", image, "--steps", "300", "--step-seconds", "0.2", "--trials", "2",
                             "--quiet", "--device", "cpu"], cwd=tmp_path, env=gpuvs_env(DOCKER_HOST=docker_host),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not gpuvs_containers(docker_host):
        time.sleep(0.2)
    assert gpuvs_containers(docker_host), "the container never started"
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert "interrupted; finished trials are kept" in err and "Traceback" not in err
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status FROM trials").fetchall()
    assert rows == [("interrupted",)]
    assert gpuvs_containers(docker_host) == []
    time.sleep(0.5)
    assert [p for p in gpuvs_processes() if p != service.proc.pid] == []  # the API service stays


def test_doctor_with_docker_names_the_engine_and_what_it_detected(docker_host, image, tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpuvs", "doctor", "--env", "container", "--engine", "docker",
                        "--image", image, "--device", "cpu"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=gpuvs_env(DOCKER_HOST=docker_host, COLUMNS="250"))
    flat = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "engine │ ok │ docker" in flat and "all checks passed" in flat and "numpy │ ok" in flat
    if not engines.has_capability(engines.CAP_SYS_RESOURCE, "CapBnd"):
        assert "--ulimit nofile=" in flat  # the rlimit quirk, detected for a local docker daemon too
