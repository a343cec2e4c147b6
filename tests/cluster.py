"""The real Kubernetes test cluster for the tests (scripts/test-cluster; docs/kubernetes.md), as the fixture `cluster`.

Import it (`from cluster import cluster  # noqa: F401`); a test then reads cluster.kubeconfig and cluster.nodes.
A running cluster is reused and left running; else the fixture brings one up and takes it down at the end.
Binaries not built: the test fails under CI=true and is skipped elsewhere, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, missing_part

SCRIPT = ROOT / "scripts" / "test-cluster"
STATE = Path(os.environ.get("GPUVS_CLUSTER_DIR", "/tmp/gpuvs-cluster"))
BIN = Path(os.environ.get("GPUVS_K8S_CACHE", "/var/cache/gpuvs-k8s")) / "bin"


@dataclass
class Cluster:
    kubeconfig: Path
    nodes: list[str]
    gpus: int

    def script(self, *args: str, timeout: float = 300, check: bool = True, env: dict | None = None
               ) -> subprocess.CompletedProcess:
        """scripts/test-cluster ARGS with this interpreter (the plugin fixture needs its grpcio)."""
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                           env=None if env is None else {**os.environ, **env})
        if check:
            assert r.returncode == 0, f"test-cluster {' '.join(args)}: {r.stdout}{r.stderr}"
        return r

    def command(self, *args: str) -> str:
        """The script's command line as one string, for gpuvs validate's --...-cmd options."""
        import shlex

        return shlex.join([sys.executable, str(SCRIPT), *args])

    def wait_ready(self, timeout: float = 120) -> None:
        """Until `scripts/test-cluster status` reads healthy: every node Ready with no not-ready taint left and its
        GPUs allocatable (a test before may have restarted a kubelet: the node lifecycle controller lifts its taint
        seconds after the node reads Ready again)."""
        import time

        deadline = time.monotonic() + timeout
        while (r := _status()).returncode != 0:
            assert time.monotonic() < deadline, f"the cluster is not back in service after {timeout:.0f} s: {r.stdout}"
            time.sleep(0.5)

    def core(self):
        """A CoreV1Api on the admin kubeconfig (the official client, as gpuvs uses it)."""
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))


def _status() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)


USERS = STATE / "users"  # each test session notes its pid here while it runs: the last one takes the cluster down
LOCK = STATE.parent / f".{STATE.name}.lock"  # scripts/test-cluster's: one cluster command at a time


def _started(pid: int) -> str:
    """The process's start time (a reused pid has another)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def other_users() -> list[int]:
    """Other live test sessions using the cluster."""
    out = []
    for f in USERS.glob("*") if USERS.exists() else []:
        pid = int(f.name) if f.name.isdigit() else None
        if pid and pid != os.getpid() and _started(pid) and _started(pid) == f.read_text().strip():
            out.append(pid)
    return out


PENDING = os.environ.get("GPUVS_CLUSTER_PENDING")  # .ci/run's background set-up writes "ready" or "failed" here


def background_setup_ended() -> None:
    """Wait, failing nothing, until .ci/run's background set-up has said how it ended. conftest calls it before a
    cluster test's timer starts: a cold Kubernetes build (15 minutes on a slow 2-core machine) is not a test's time."""
    from conftest import load_factor

    status, spent, last = Path(PENDING), 0.0, time.monotonic()
    while not (status.exists() and status.read_text().strip()) and spent < 3600:
        time.sleep(2)
        now = time.monotonic()
        spent, last = spent + (now - last) / load_factor(), now


def _wait_for_background_setup() -> None:
    """.ci/run builds Kubernetes, starts the cluster and loads gpuvs's image in the background while the tests that
    need none of it run (conftest runs the cluster tests last): wait for it to end (budget in idle-machine seconds,
    as conftest.wait_for counts them), and fail with its log's end if it failed."""
    from conftest import wait_for

    status = Path(PENDING)
    said = wait_for(lambda: status.exists() and status.read_text().strip(), 3600, "end of the cluster's set-up", step=2)
    if not said.startswith("ready"):
        log = Path(PENDING + ".log")
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        pytest.fail(f"the test cluster's background set-up failed ({said}): {tail}", pytrace=False)


@pytest.fixture(scope="session")
def k8s_build() -> Path:
    """The folder of scripts/test-cluster build's binaries (kubectl 1.20 among them), for a test that needs them but
    not the cluster: under .ci/run, once its background set-up has ended (conftest runs such tests last too)."""
    if PENDING:
        _wait_for_background_setup()
    return BIN


@pytest.fixture(scope="session")
def cluster():
    started = False
    if PENDING:
        _wait_for_background_setup()
    if _status().returncode != 0:
        missing = [b for b in ("kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager")
                   if not (BIN / b).exists()]
        if missing:
            missing_part(f"the Kubernetes test cluster is not built ({', '.join(missing)} missing in {BIN}): "
                         f"run scripts/test-cluster build")
        r = subprocess.run([sys.executable, str(SCRIPT), "up"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"scripts/test-cluster up failed: {r.stdout[-2000:]}{r.stderr[-2000:]}", pytrace=False)
        started = True
    shape = json.loads((STATE / "shape.json").read_text())
    USERS.mkdir(parents=True, exist_ok=True)
    mine = USERS / str(os.getpid())
    mine.write_text(_started(os.getpid()))
    try:
        yield Cluster(STATE / "kubeconfig", [f"gpuvs-node-{i}" for i in range(1, shape["nodes"] + 1)], shape["gpus"])
    finally:
        mine.unlink(missing_ok=True)
    if started and os.environ.get("GPUVS_CLUSTER_KEEP") != "1" and not other_users():
        subprocess.run([sys.executable, str(SCRIPT), "down"], capture_output=True, text=True, timeout=300)
