"""`--engine docker` for real, against a real Docker daemon and podman's Docker-compatible API, with the docker client.

The daemon is Debian's docker.io, its dockerd started by the tests on a private socket and data folder.
The image is built from this machine's Python and numpy (tests/images.py).
gpuvs's docker path runs end to end: the command line, image inspection, labels, limits, removal."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
import uuid

import pytest

from conftest import gpuvs_env, gpuvs_processes, require
from gpuvs.environments import engine as engines
from images import import_image, podman, python_rootfs


class Service:
    """A Docker-API engine on a private socket, started and stopped by the tests (its whole process group)."""

    def __init__(self, kind, folder):
        self.kind = kind
        sock = folder / "docker.sock"
        self.host = f"unix://{sock}"
        if kind == "dockerd":
            argv = ["dockerd", "--host", self.host, "--data-root", str(folder / "data"), "--exec-root",
                    str(folder / "exec"), "--pidfile", str(folder / "dockerd.pid"), "--iptables=false",
                    "--ip6tables=false", "--bridge=none", "--storage-driver=vfs",
                    "--exec-opt", "native.cgroupdriver=cgroupfs"]
        else:
            argv = engines.detect("podman").argv("system", "service", "--time=0", self.host)
        self.log = open(folder / "service.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self):
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


@pytest.fixture(scope="module", params=["dockerd", "podman-api"])
def service(request, tmp_path_factory):
    require("docker", "the docker client (Debian's docker.io)")
    require("dockerd" if request.param == "dockerd" else "podman", "a Docker-API engine")
    folder = tmp_path_factory.mktemp(request.param)
    svc = Service(request.param, folder)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            r = docker(svc.host, "version", "--format", "{{.Server.Version}}")
            if r.returncode == 0:
                break
            if svc.proc.poll() is not None:
                break
            time.sleep(0.3)
        else:
            r = None
        if r is None or r.returncode != 0:
            pytest.fail(f"{request.param} did not answer on {svc.host}: "
                        f"{(folder / 'service.log').read_text()[-2000:]}")
        yield svc
    finally:
        svc.stop()
    assert svc.proc.poll() is not None


@pytest.fixture(scope="module")
def docker_host(service):
    return service.host


@pytest.fixture(scope="module")
def image(service, tmp_path_factory):
    folder = tmp_path_factory.mktemp("image")
    tag = f"localhost/gpuvs-test-python:{uuid.uuid4().hex[:8]}"
    root = python_rootfs(folder / "root")
    if service.kind == "dockerd":  # its own image store: `docker import` the same root filesystem
        tar_path = folder / "image.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(root, arcname=".")
        r = docker(service.host, "import", "--change", "ENV PATH=/usr/bin:/bin", str(tar_path), tag)
        assert r.returncode == 0, r.stderr
        yield tag
        docker(service.host, "rmi", "-f", tag)
    else:
        import_image(root, tag, folder / "image.tar")
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
    left = [p for p in gpuvs_processes() if not _descends_from(p, service.proc.pid)]
    assert left == [], [open(f"/proc/{p}/cmdline").read() for p in left]  # the engine (and its containerd) stays


def _descends_from(pid, root):
    while pid > 1:
        if pid == root:
            return True
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def test_doctor_with_docker_names_the_engine_and_what_it_detected(docker_host, image, tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpuvs", "doctor", "--env", "container", "--engine", "docker",
                        "--image", image, "--device", "cpu"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=gpuvs_env(DOCKER_HOST=docker_host, COLUMNS="250"))
    flat = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "engine │ ok │ docker" in flat and "all checks passed" in flat and "numpy │ ok" in flat
    if not engines.has_capability(engines.CAP_SYS_RESOURCE, "CapBnd"):
        assert "--ulimit nofile=" in flat  # the rlimit quirk, detected for a local docker daemon too


def test_bare_mode_with_docker_reads_the_output_the_engines_times_and_the_images_files(docker_host, image, tmp_path):
    """The command as the container's own process (--bare) through the docker client: its output relayed by the
    client, its wall time from the engine's State.StartedAt/FinishedAt, the image's files copied out of a created,
    never started container (the docker path of environments/image_files.py), the container removed after."""
    script = "import time; time.sleep(0.5); print('speed: 42.5 items/s', flush=True)"
    r = subprocess.run([sys.executable, "-m", "gpuvs", "run", "command", "--env", "container", "--engine", "docker",
                        "--image", image, "--device", "cpu", "--trials", "1", "--bare",
                        "--metric", r"speed=speed: ([0-9.]+),rate,items/s", "--headline", "speed", "--",
                        "python3", "-c", script],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=gpuvs_env(DOCKER_HOST=docker_host))
    assert r.returncode == 0, r.stdout + r.stderr
    row = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT summary, config, fingerprint FROM trials").fetchone()
    summary, config, fp = (json.loads(x) for x in row)
    assert list(summary)[0] == "speed" and summary["speed"]["value"] == 42.5
    assert 0.5 <= summary["wall_time_s"]["value"] < 10  # the engine's record of the container's start and exit
    assert config["wall_time_clock"].startswith("docker's record of the container")
    assert fp["taken_by"].startswith("gpuvs, from outside the container") and fp["engine"] == "docker"
    assert fp["image_id"] and "not listed" in fp["software"]["note"]  # files copied out one by one
    assert gpuvs_containers(docker_host) == []
