"""The command workload in a pod of the real test cluster: sysbench host vs container vs pod, each with a verdict.

Bare mode in a pod runs an image with no Python, built here and imported into each node's containerd.
The wrapped command runs in the cluster's Python image; a timeout and SIGTERM leave no pod behind.
Run it alone under the shared lock: `flock /tmp/gpuvs-cluster.lock python -m pytest tests/workloads/test_command_cluster.py`."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from cluster import STATE, cluster  # noqa: F401  (the session fixture)
from conftest import gpuvs_env, gpuvs_processes, require
from images import binaries_rootfs, import_image, podman
from gpuvs.analysis import stats

pytestmark = pytest.mark.cluster

SYSBENCH = ["sysbench", "cpu", "--time=1", "run"]
PYTHON_IMAGE = "localhost/gpuvs-python:test"  # scripts/test-cluster's (this interpreter, numpy, busybox)
NS = f"gpuvs-cmdtest-{os.getpid()}"


def ctr(node: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "-a", str(STATE / node / "containerd.sock"), "-n", "k8s.io", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def kube(cluster, tmp_path_factory):
    """This session's namespace, and an image with sysbench and no Python on every node (imported, not pulled)."""
    require("sysbench", "sysbench (apt-get install sysbench: .ci/apt/command.txt)")
    require("podman", "podman (.ci/apt/containers.txt)")
    require("ctr", "ctr (containerd: .ci/apt/cluster.txt)")
    folder = tmp_path_factory.mktemp("image")
    tag = import_image(binaries_rootfs(folder / "root", ("sysbench",)),
                       f"localhost/gpuvs-cmd-nopython:{uuid.uuid4().hex[:8]}", folder / "image.tar")
    archive = folder / "image-docker.tar"
    r = podman("save", "--format", "docker-archive", "-o", str(archive), tag)
    assert r.returncode == 0, r.stderr
    for node in cluster.nodes:
        r = ctr(node, "images", "import", str(archive))
        assert r.returncode == 0, r.stderr
    api = cluster.core()
    api.create_namespace({"metadata": {"name": NS}})
    for _ in range(150):  # pods need the namespace's default service account
        if api.list_namespaced_service_account(NS).items:
            break
        time.sleep(0.2)
    try:
        yield cluster, tag
    finally:
        api.delete_namespace(NS)
        for node in cluster.nodes:
            ctr(node, "images", "rm", tag)
        podman("rmi", "-f", tag)


def pods(cluster) -> list[str]:
    return [p.metadata.name for p in cluster.core().list_namespaced_pod(NS, label_selector="gpuvs=1").items]


@pytest.fixture(autouse=True)
def nothing_left_behind(kube):
    yield
    assert pods(kube[0]) == [] and gpuvs_processes() == []


def pod_arm(cluster, image: str, bare: bool = True) -> str:
    return (f"env=pod,image={image},image_pull_policy=Never,kubeconfig={cluster.kubeconfig},namespace={NS}"
            + (",bare=true" if bare else ""))


@pytest.mark.quiet  # its podman container would be the other worker's engine tests' "left behind"
def test_one_real_benchmark_on_the_host_in_a_container_and_in_a_pod_with_a_verdict_each(cli, kube):
    cluster, image = kube
    r = cli("compare", "command", "--device", "cpu", "--trials", "2", "--parser", "sysbench", "--arm", "host:",
            "--arm", f"container:env=container,engine=podman,image={image},bare=true",
            "--arm", f"pod:{pod_arm(cluster, image)}", "--", *SYSBENCH)
    assert r.returncode == 0, r.stderr
    ident = [ln for ln in r.stdout.splitlines() if ln.startswith("experiment ")][-1].split()[1]
    data = json.loads(cli("report", ident, "--format", "json").stdout)
    verdicts = {v["arm"]: v for v in data["verdicts"] if v["metric"] == "events_per_sec"}
    assert set(verdicts) == {"container", "pod"}
    for v in verdicts.values():
        assert v["baseline"] == "host" and v["verdict"] in stats.SETTLED
        assert v["ratio"] > 0 and v["ci_low"] <= v["ratio"] <= v["ci_high"]
    arms = {a["name"]: a for a in data["arms"]}
    assert all(a["n_ok"] == 2 for a in arms.values())
    pod_fp = arms["pod"]["fingerprint"]
    assert pod_fp["in_pod"] and pod_fp["node_name"] in cluster.nodes and pod_fp["image_id"].startswith("sha256:")
    assert pod_fp["taken_by"].startswith("gpuvs, from the pod's status")
    t = [x for x in data["trials"] if x["arm"] == "pod"][0]
    r = cli("results", "show", str(t["id"]), "--log")
    assert "events per second:" in r.stdout and "--- stdout" in r.stdout and "--- stderr" not in r.stdout  # one log


def test_a_wrapped_command_in_a_pod_streams_its_figures(cli, tmp_path, kube):
    cluster, _ = kube
    script = "import json\nfor i in range(1, 4): print(json.dumps({'gpuvs': 'loss', 'value': 1 / i, 'step': i, " \
             "'better': 'lower'}))"
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--parser", "jsonl:loss", "--env", "pod",
            "--image", PYTHON_IMAGE, "--image-pull-policy", "Never", "--kubeconfig", str(cluster.kubeconfig),
            "--namespace", NS, "--", "python3", "-c", script)
    assert r.returncode == 0, r.stderr
    import sqlite3

    row = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT summary, fingerprint, config FROM trials").fetchone()
    summary, fp, config = json.loads(row[0]), json.loads(row[1]), json.loads(row[2])
    assert summary["loss"]["n"] == 3 and abs(summary["loss"]["value"] - (1 + 1 / 2 + 1 / 3) / 3) < 1e-9
    assert fp["in_pod"] and fp["node_name"] in cluster.nodes and fp["taken_by"] != ""  # taken inside, by the worker
    # what it ran, resolved in the pod on the image's PATH (docs/command.md, "What ran")
    ran = config["program"]
    assert ran["argv0"] == "python3" and os.path.basename(ran["executable"]["path"]) == "python3", ran
    assert len(ran["executable"]["sha256"]) == 64 and ran["executable"]["size"] > 0
    assert ran["version"] == f"Python {fp['python']}" and ran["workdir"].startswith("/")


def test_an_executable_missing_in_a_pods_image_is_the_trials_reason(cli, tmp_path, kube):
    cluster, image = kube
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--env", "pod", "--image", image, "--bare",
            "--image-pull-policy", "Never", "--kubeconfig", str(cluster.kubeconfig), "--namespace", NS,
            "--", "gpuvs-no-such-program")
    assert r.returncode != 0
    import sqlite3

    (error,) = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT error FROM trials").fetchone()
    assert "could not start" in error and "gpuvs-no-such-program" in error, error


@pytest.mark.parametrize("how", ["timeout", "sigterm"])
def test_a_timeout_or_sigterm_leaves_no_pod(tmp_path, kube, how):
    cluster, image = kube
    argv = [sys.executable, "-m", "gpuvs", "run", "command", "--device", "cpu", "--trials", "1", "--env", "pod",
            "--image", image, "--bare", "--image-pull-policy", "Never", "--kubeconfig", str(cluster.kubeconfig),
            "--namespace", NS, *(["--timeout", "8"] if how == "timeout" else []),
            "--", "sysbench", "cpu", "--time=300", "run"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if how == "sigterm":
        deadline = time.monotonic() + 90
        while not any(p.status.phase == "Running" for p in cluster.core().list_namespaced_pod(NS).items):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    if how == "timeout":
        assert "timed out after 8 s" in err, err
    assert pods(cluster) == []


def test_a_bare_pods_last_line_without_a_newline_is_its_figure(cli, tmp_path, kube):
    """A bare pod whose last output has no trailing newline: that line is the job's last figure, never an earlier
    one (it is left over in the followed stream when the log ends, and read from the whole log)."""
    cluster, _ = kube
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--env", "pod", "--image", PYTHON_IMAGE, "--bare",
            "--image-pull-policy", "Never", "--kubeconfig", str(cluster.kubeconfig), "--namespace", NS,
            "--metric", "rate=rate ([0-9]+),higher", "--", "sh", "-c",
            "echo 'progress rate 1'; sleep 1; echo 'progress rate 2'; sleep 1; printf 'final rate 300'")
    assert r.returncode == 0, r.stderr
    import sqlite3

    status, summary = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, summary FROM trials").fetchone()
    assert status == "ok" and json.loads(summary)["rate"]["value"] == 300, summary
