"""scripts/test-cluster on the real cluster: nodes Ready with the fake GPUs allocatable.

The device-plugin fixture over the kubelet's real API: gone with the plugin, back after it and a kubelet restart.
The CPU quota of `slow`, one-line refusals, and `down` leaving nothing behind (last: it restarts the cluster)."""

from __future__ import annotations

import fcntl
import subprocess
import time
from pathlib import Path

import pytest

from cluster import LOCK, STATE, cluster, other_users  # noqa: F401
from conftest import missing_part

pytestmark = pytest.mark.cluster


def gpus(c, node: str, after=None) -> tuple[bool, int]:
    """(Ready, allocatable GPUs) of a node; with `after` (an earlier reading of the Ready condition's
    lastHeartbeatTime), Ready counts only when a kubelet reported it since (a restarted kubelet's node still
    shows its predecessor's Ready until the new one reports)."""
    n = c.core().read_node(node)
    ready = any(x.type == "Ready" and x.status == "True" and (after is None or x.last_heartbeat_time > after)
                for x in n.status.conditions)
    return ready, int(n.status.allocatable.get("nvidia.com/gpu", "0"))


def reported(c, node: str):
    """When the node's kubelet last reported its Ready condition."""
    return next(x.last_heartbeat_time for x in c.core().read_node(node).status.conditions if x.type == "Ready")


def wait_for(what, fn, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_status_and_nodes(cluster):
    r = cluster.script("status")
    assert r.stdout.startswith("up:") and f"{len(cluster.nodes)} nodes x {cluster.gpus} GPUs" in r.stdout
    names = {n.metadata.name for n in cluster.core().list_node().items}
    assert set(cluster.nodes) <= names
    for node in cluster.nodes:
        assert gpus(cluster, node) == (True, cluster.gpus)


def test_plugin_stop_and_start_change_allocatable(cluster):
    node = cluster.nodes[-1]
    try:
        cluster.script("plugin", "stop", node)
        wait_for("allocatable 0 without the plugin", lambda: gpus(cluster, node)[1] == 0)
        assert cluster.script("status", check=False).returncode == 1  # not as it should be: says so
    finally:
        cluster.script("plugin", "start", node)
    wait_for("allocatable back", lambda: gpus(cluster, node) == (True, cluster.gpus))


def test_plugin_registers_again_after_kubelet_restart(cluster):
    node = cluster.nodes[-1]
    log = STATE / "logs" / f"{node}-plugin.log"
    before = log.read_text().count("registered ")
    report0 = reported(cluster, node)
    cluster.script("kubelet", "restart", node)
    wait_for("the plugin to register again", lambda: log.read_text().count("registered ") > before)
    wait_for("the new kubelet to report Ready with the GPUs",
             lambda: gpus(cluster, node, report0) == (True, cluster.gpus), 90)
    # in service again: the controller lifts the not-ready taint the restart may have caused
    cluster.wait_ready(90)


def test_slow_sets_and_removes_a_cpu_quota(cluster):
    node = cluster.nodes[-1]
    quota = next(p for p in (Path("/sys/fs/cgroup/cpu") / node / "cpu.cfs_quota_us",
                             Path("/sys/fs/cgroup/cpu,cpuacct") / node / "cpu.cfs_quota_us") if p.exists())
    try:
        cluster.script("slow", node, "30")
        assert quota.read_text().strip() == "30000"
    finally:
        cluster.script("slow", node, "0")
    assert quota.read_text().strip() == "-1"


@pytest.mark.parametrize("args", [("kubelet", "restart", "gpuvs-node-99"), ("slow", "nonode", "10"),
                                  ("plugin", "stop", "gpuvs-node-x")])
def test_unknown_node_is_one_line(cluster, args):
    r = cluster.script(*args, check=False)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "unknown node" in r.stderr and "Traceback" not in r.stderr


def test_up_again_with_the_same_shape_is_a_no_op(cluster):
    cluster.wait_ready(120)  # a healthy cluster: an unhealthy one is restarted by `up`, by design
    r = cluster.script("up", "--nodes", str(len(cluster.nodes)), "--gpus", str(cluster.gpus))
    assert "already up" in r.stdout


BINARIES = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd",
            "containerd-shim-runc-v2"}


def _ours() -> list[str]:
    """The cluster's processes still running: its binaries, or the plugin fixture, naming its state folder."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if str(STATE) in " ".join(argv) and (Path(argv[0]).name in BINARIES or
                                                any(a.endswith("gpu_device_plugin/plugin.py") for a in argv)):
                out.append(f"{proc.name}: {' '.join(argv)[:120]}")
    return out


@pytest.mark.slow
def test_down_leaves_nothing_behind_and_up_comes_back(cluster):
    """Last in this module: the cluster is stopped and started again (same shape, same credentials)."""
    if other_users():
        missing_part(f"other test sessions (pids {other_users()}) use the cluster: not stopping it under them")
    core = cluster.core()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpuvs-test-down", "labels": {"gpuvs": "1"}},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": "localhost/gpuvs-python:test", "imagePullPolicy": "Never",
                                    "command": ["sleep", "600"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    core.create_namespaced_pod("default", pod)
    wait_for("the pod to run", lambda: core.read_namespaced_pod("gpuvs-test-down", "default").status.phase
             == "Running")
    nodes, shape = cluster.nodes, (str(len(cluster.nodes)), str(cluster.gpus))
    held = {"GPUVS_CLUSTER_LOCK_HELD": "1"}
    with open(LOCK, "w") as lock:  # no other cluster command (another test session's `up`) between down and up
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster.script("down", env=held)
        assert _ours() == []
        assert cluster.script("status", check=False).returncode == 1
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "gpuvs-br" not in links
        assert not any((Path("/sys/fs/cgroup") / h / n).exists() for h in ("cpu", "memory", "pids") for n in nodes)
        assert "gpuvs test cluster" not in Path("/etc/hosts").read_text()
        assert not any(STATE.glob("gpuvs-node-*"))
        cluster.script("up", "--nodes", shape[0], "--gpus", shape[1], timeout=600, env=held)
    # a client made before the restart still works (same CA and tokens), and the old pod is gone with etcd's data
    assert {n.metadata.name for n in core.list_node().items} >= set(nodes)
    assert not core.list_namespaced_pod("default", label_selector="gpuvs=1").items
