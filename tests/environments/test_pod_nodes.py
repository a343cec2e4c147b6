"""--env pod --num-nodes N: one trial as N pods, one per node.

The pods' manifests and the option's refusals, then real trials on the test cluster (gloo on its CPUs).
The test image has no torch: the host's torch and the libraries it loads are mounted read-only (hostPath)."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest
from cluster import cluster  # noqa: F401  (the session fixture)
from environments.test_pod import NS, kube, namespace, pod_args  # noqa: F401  (this session's namespace, emptied per test)

from gpuvs.environments import pod
from gpuvs.environments.pod import gang
from gpuvs.errors import UsageError
from gpuvs import environments
from gpuvs.spec import EnvSpec, RunSpec, ranks_asked
from gpuvs.trial import multiproc

TINY = ("--min-bytes", "64", "--max-bytes", "1K", "--factor", "4", "--warmup", "1", "--iters", "2")


def _spec(**options) -> RunSpec:
    return RunSpec(workload="collective", device="cpu", num_gpus=2, run_id="abc123def456",
                   env=EnvSpec("pod", {"image": "img", **options}))


# -- without a cluster -------------------------------------------------------------------------------------------

def test_each_pod_has_its_node_rank_the_store_and_a_node_of_its_own():
    spec = _spec(num_nodes=3)
    s = pod.parse_options(spec.env.options)
    bodies = gang.bodies(pod.manifest(spec, s), s.num_nodes, pod.RUN_ID)
    assert [b["metadata"]["name"] for b in bodies] == [f"gpuvs-abc123def456-n{i}" for i in range(3)]
    port = str(gang.store_port("abc123def456"))
    for i, b in enumerate(bodies):
        env = {e["name"]: e.get("value") for e in b["spec"]["containers"][0]["env"]}
        assert (env["GPUVS_NUM_NODES"], env["GPUVS_NODE_RANK"], env["GPUVS_MASTER_PORT"]) == ("3", str(i), port)
        assert b["spec"]["containers"][0]["env"][-1]["name"] == "GPUVS_SPEC"  # the launch time is written there
        assert b["metadata"]["labels"][gang.NODE_RANK] == str(i)
        assert b["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
            {"labelSelector": {"matchLabels": {pod.RUN_ID: "abc123def456"}}, "topologyKey": "kubernetes.io/hostname"}]
    assert {e["name"]: e.get("value") for e in bodies[0]["spec"]["containers"][0]["env"]}["GPUVS_MASTER_ADDR"] == \
        "127.0.0.1"  # the others get the first pod's IP once it has one
    assert ranks_asked(spec) == 6 and ranks_asked(_spec()) == 2
    # spec.nodes_asked reads --num-nodes wherever it is: only a kind that spans nodes takes it, so no other
    # kind's spec carries it (refused in one line; an experiment file's options are filtered by kind)
    with pytest.raises(UsageError, match="--num-nodes applies to --env pod, not to the host"):
        environments.check_options("host", {"num_nodes": 3})
    assert environments.options_for("host", {"num_nodes": 3}) == {}


@pytest.mark.parametrize("options, words", [
    ({"num_nodes": 2, "node": "gpuvs-node-1"}, "--num-nodes 2 places one pod on each of 2 nodes"),
    ({"num_nodes": 2, "node": "n", "bypass_scheduler": True}, "cannot be given with --node or --bypass-scheduler"),
])
def test_num_nodes_with_one_node_is_refused(options, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        pod.parse_options({"image": "img", **options})


def test_the_ranks_of_a_pod_are_numbered_across_nodes(monkeypatch):
    assert multiproc.across_nodes() == (1, 0, None, None)
    monkeypatch.setenv("GPUVS_NUM_NODES", "3")
    monkeypatch.setenv("GPUVS_NODE_RANK", "2")
    monkeypatch.setenv("GPUVS_MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("GPUVS_MASTER_PORT", "23456")
    assert multiproc.across_nodes() == (3, 2, "10.1.2.3", 23456)


def test_a_collective_of_one_rank_per_pod_needs_two_nodes(cli):
    r = cli("run", "collective", "--device", "cpu", "--env", "pod", "--image", "img", "--num-nodes", "1")
    assert r.returncode == 2 and "needs at least 2 ranks" in r.stderr and "--num-nodes" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_workload_of_one_process_across_nodes_is_refused(cli):
    r = cli("run", "selftest", "--device", "cpu", "--env", "pod", "--image", "img", "--num-nodes", "2")
    assert r.returncode == 2 and "--num-nodes 2: selftest runs in one process" in r.stderr, r.stderr
    assert "collective" in r.stderr and "cnn-train" in r.stderr and "Traceback" not in r.stderr


# -- on the project's test cluster ------------------------------------------------------------------------------

def torch_mounts() -> list[str]:
    """--mount and --env-var options that give the test image this machine's torch, read-only: the real folder of
    torch's site-packages, and the folders of the shared libraries it loads (after the interpreter's own LIBDIR, so
    that a libpython of the system's does not shadow the interpreter's)."""
    try:
        import torch
    except ImportError:
        from conftest import missing_part

        missing_part("torch is not installed in this interpreter")
    site = str(Path(torch.__file__).resolve().parent.parent)
    libs: set[str] = set()
    for so in Path(torch.__file__).resolve().parent.glob("_C*.so"):
        out = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        libs |= {os.path.dirname(os.path.realpath(p)) for p in re.findall(r"=> (/\S+) \(0x", out)}
    libs = sorted(d for d in libs if not d.startswith(site))
    args = ["--mount", f"{site}:{site}:ro", "--env-var", f"PYTHONPATH={site}"]
    for i, d in enumerate(libs):
        args += ["--mount", f"{d}:/host-lib/{i}:ro"]
    pylib = sysconfig.get_config_var("LIBDIR") or ""
    path = ":".join([pylib] + [f"/host-lib/{i}" for i in range(len(libs))])
    return args + ["--env-var", f"LD_LIBRARY_PATH={path}"]


class Placement:
    """Every pod of the namespace's gpuvs runs seen while it lives: its node and phase, by name."""

    def __init__(self, api):
        self.api, self.seen, self.phase = api, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.wait(0.3):
            for p in self.api.list_namespaced_pod(NS, label_selector=pod.RUN_ID).items:
                if p.spec.node_name:
                    self.seen[p.metadata.name] = p.spec.node_name
                self.phase[p.metadata.name] = p.status.phase

    def stop(self):
        self._stop.set()
        self._thread.join()


def gpuvs_cli(tmp_path, *args) -> subprocess.Popen:
    from conftest import gpuvs_env

    return subprocess.Popen([sys.executable, "-m", "gpuvs", *args], cwd=tmp_path, env=gpuvs_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def left(kube) -> list[str]:
    """The pods and Services of gpuvs's runs still in the namespace."""
    api = kube.core()
    return ([p.metadata.name for p in api.list_namespaced_pod(NS, label_selector=pod.RUN_ID).items]
            + [s.metadata.name for s in api.list_namespaced_service(NS, label_selector="gpuvs=1").items])


@pytest.mark.cluster
def test_two_nodes_run_one_collective_on_distinct_nodes(kube, tmp_path):
    seen = Placement(kube.core())
    proc = gpuvs_cli(tmp_path, "run", "collective", "--device", "cpu", *TINY, "--repeats", "2", "--trials", "1",
                     "--num-nodes", "2", *pod_args(kube), *torch_mounts())
    out, err = proc.communicate(timeout=240)
    seen.stop()
    assert proc.returncode == 0, err + out
    assert re.search(r"Ranks:\s+2\b", out) and "Backend:      gloo" in out, out
    names = sorted(seen.seen)
    assert len(names) == 2 and names[0].endswith("-n0") and names[1].endswith("-n1"), seen.seen
    assert len(set(seen.seen.values())) == 2, f"both pods on one node: {seen.seen}"
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    # rank 0's figures only: 3 sizes x 2 repeats, not once more per pod
    assert db.execute("SELECT status FROM trials").fetchall() == [("ok",)]
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (6,)
    assert left(kube) == []


@pytest.mark.cluster
def test_one_against_three_nodes_of_cnn_train_compared(kube, tmp_path):
    seen = Placement(kube.core())
    proc = gpuvs_cli(tmp_path, "compare", "cnn-train", "--model", "resnet18", "--batch-size", "2", "--image-size",
                     "32", "--steps", "3", "--warmup-steps", "1", "--device", "cpu", "--trials", "2", "--quiet",
                     *pod_args(kube), *torch_mounts(), "--arm", "one:num_nodes=1", "--arm", "three:num_nodes=3")
    out, err = proc.communicate(timeout=400)
    seen.stop()
    assert proc.returncode == 0, err + out
    flat = " ".join(out.split())
    # the scaling row: 3 ranks against 1, ideal 3x, an efficiency with its interval
    assert re.search(r"│ three\s+│\s+3 │\s+[0-9.]+ │\s+[0-9.]+× │\s+3× │\s+[0-9.]+% │\s+[0-9.]+%–[0-9.]+% │", out), out
    assert "Verdict: each arm against one" in flat
    by_run: dict[str, set[str]] = {}
    for name, node in seen.seen.items():
        if re.search(r"-n[0-9]$", name):
            by_run.setdefault(name.rsplit("-", 1)[0], set()).add(node)
    assert len(by_run) == 2 and all(len(nodes) == 3 for nodes in by_run.values()), seen.seen  # 3 distinct nodes
    assert left(kube) == []


@pytest.mark.cluster
def test_a_gang_that_cannot_be_placed_fails_within_its_schedule_timeout(kube, tmp_path):
    nodes = len(kube.nodes)
    t0 = time.monotonic()
    proc = gpuvs_cli(tmp_path, "run", "collective", "--device", "cpu", *TINY, "--trials", "1", "--num-nodes",
                     str(nodes + 1), "--schedule-timeout", "4", *pod_args(kube), *torch_mounts())
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1, err + out
    last = err.strip().splitlines()[-1]
    assert re.search(rf"pod gpuvs-[0-9a-f]+-n{nodes} could not be scheduled within 4 s: .*anti-affinity", last), err
    assert "Traceback" not in err and took < 60, (took, err)
    assert left(kube) == []


def long_collective(kube, tmp_path):
    """A 2-node collective of 5,000 repeats a size: long enough to stop or break in its middle."""
    return gpuvs_cli(tmp_path, "run", "collective", "--device", "cpu", *TINY, "--repeats", "5000", "--trials", "1",
                     "--num-nodes", "2", "--quiet", *pod_args(kube), *torch_mounts())


@pytest.mark.cluster
def test_sigterm_mid_collective_leaves_no_pod(kube, tmp_path):
    api = kube.core()
    proc = long_collective(kube, tmp_path)
    try:
        deadline = time.monotonic() + 150
        timing = False
        while time.monotonic() < deadline and not timing and proc.poll() is None:
            time.sleep(0.5)
            first = [p for p in api.list_namespaced_pod(NS, label_selector=pod.RUN_ID).items
                     if p.metadata.name.endswith("-n0") and p.status.phase == "Running"]
            if first:  # the config event comes once every rank has met: the sweep (10,000 operations a size) follows
                log = api.read_namespaced_pod_log(first[0].metadata.name, NS, container="worker")
                timing = re.search(r'"type":\s*"config"', log) is not None
        assert timing, "the ranks never met"
        time.sleep(1)
    except BaseException:
        proc.terminate()
        proc.communicate(timeout=90)
        raise
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert left(kube) == []
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, error FROM trials").fetchall()
    assert rows == [("interrupted", "gpuvs was stopped by SIGTERM")]


@pytest.mark.cluster
def test_a_pod_other_than_the_first_failing_fails_the_trial_with_its_line(kube, tmp_path):
    api = kube.core()
    proc = long_collective(kube, tmp_path)
    try:
        deadline = time.monotonic() + 150
        second = None
        while time.monotonic() < deadline and second is None and proc.poll() is None:
            time.sleep(0.5)
            pods = {p.metadata.name: p for p in api.list_namespaced_pod(NS, label_selector=pod.RUN_ID).items}
            first = next((p for n, p in pods.items() if n.endswith("-n0") and p.status.phase == "Running"), None)
            if first is not None and re.search(r'"type":\s*"config"', api.read_namespaced_pod_log(
                    first.metadata.name, NS, container="worker")):
                second = next(n for n in pods if n.endswith("-n1"))
        assert second, "the ranks never met"
        api.delete_namespaced_pod(second, NS, grace_period_seconds=1)  # as a node's failure or an eviction would
        out, err = proc.communicate(timeout=120)
    except BaseException:
        proc.terminate()
        proc.communicate(timeout=90)
        raise
    assert proc.returncode == 1, err + out
    assert f"pod {second} was deleted from outside gpuvs before the worker finished" in err.strip().splitlines()[-1], err
    assert "Traceback" not in err
    assert left(kube) == []
