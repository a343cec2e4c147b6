"""gpuvs validate against the real test cluster: the functional suite and the availability suite.

The availability suite restarts the device plugin and kubelet, and stops the API server, through scripts/test-cluster.
Failures carry the cluster's reason, nothing is left behind (even on SIGTERM mid-outage), and bad input is one line.
The stored experiment's reports too; several GPU pods, sharing and the CPU service: test_validate_gpus.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cluster import cluster  # noqa: F401
from conftest import gpuvs_env, run_cli

IMAGE = "localhost/gpuvs-python:test"


def validate(c, store, *args, timeout=600):
    return run_cli("validate", "--kubeconfig", c.kubeconfig, "--image", IMAGE, "--image-pull-policy", "Never",
                   "--pod-security", "baseline", "--store", store, *args, timeout=timeout)  # IMAGE runs as root


def stored(store):
    r = run_cli("results", "list", "--store", store)
    assert r.returncode == 0, r.stderr
    from gpuvs.store.db import Store

    with Store(store) as st:
        exp = [e for e in st.experiments() if e.kind == "validate"][-1]
        return st.experiment(exp.id)


def rows(exp) -> dict[str, dict]:
    return {r["check"]: r for r in exp.meta.checks}


def answers(c) -> bool:
    try:
        c.core().list_node(_request_timeout=5)
        return True
    except Exception:
        return False


def leftovers(c) -> list[str]:
    return [p.metadata.name for p in c.core().list_namespaced_pod("default", label_selector="gpuvs-validate").items]


@pytest.mark.cluster
def test_functional_suite_passes_and_reports(cluster, tmp_path):
    store = tmp_path / "v.db"
    r = validate(cluster, store, "--timeout", "60")
    assert r.returncode == 0, r.stdout + r.stderr
    exp = stored(store)
    got = rows(exp)
    assert exp.meta.finished is True
    assert all(x["status"] == "pass" for x in got.values()), got
    assert got["GPU nodes found and allocatable"]["observed"]["allocatable"] == {n: cluster.gpus for n in cluster.nodes}
    # the fake plugin's Allocate answer reached the container: one device node and the ID it was given
    vis = got["GPU pod: GPU visible inside"]["observed"]
    (node,) = vis["device_nodes"]
    assert node == "/dev/nvidia" + vis["nvidia_visible_devices"].removeprefix("fake-gpu-")
    assert vis["nvidia_smi"] is None  # the test image has no nvidia-smi, and the row says so
    assert "Insufficient nvidia.com/gpu" in got["over-request stays Pending"]["detail"]
    assert got["over-request stays Pending"]["observed"]["asked"] == cluster.gpus + 1
    assert got["CPU-only pod gets no GPU"]["observed"]["device_nodes"] == []
    # several GPU pods at once on the node advertising the most (the first by name): one each, no two the same
    node = cluster.nodes[0]
    together = got["several GPU pods: all running at once"]["observed"]
    assert (together["node"], together["pods"], together["advertised"]) == (node, cluster.gpus, cluster.gpus)
    ids = got["several GPU pods: one GPU each"]["observed"]["ids"]
    assert sorted(i for v in ids.values() for i in v) == [f"fake-gpu-{i}" for i in range(cluster.gpus)]
    assert got["all-GPUs pod sees every GPU"]["observed"]["distinct"] == cluster.gpus
    share = got["GPU sharing"]["observed"]
    assert (share["physical"], share["factor"], share["shared"]) == (cluster.gpus, 1, {})
    # the CPU service answered another pod beside the GPU job, whose rate before and during is shown
    svc = got["CPU service beside a GPU job"]["observed"]
    assert svc["node"] == node and svc["answered"] >= 1 and svc["service_ip"].startswith("10.244.")
    assert (svc["workload"], svc["device"], svc["unit"]) == ("spin", "cpu", "ops/sec")
    assert svc["samples_before"] >= 3 and svc["samples_during"] >= 1 and svc["job_restarts"] == 0
    assert svc["rate_before"] > 0 and svc["rate_during"] > 0
    assert svc["change_pct"] == pytest.approx((svc["rate_during"] / svc["rate_before"] - 1) * 100, abs=0.06)
    assert "ops/sec before" in got["CPU service beside a GPU job"]["detail"]
    assert got["nothing left behind"]["status"] == "pass" and leftovers(cluster) == []
    assert not cluster.core().list_namespaced_config_map("default", label_selector="gpuvs.package").items
    for check in ("GPU pod: scheduled", "GPU pod: running", "GPU pod: deleted and gone"):
        assert 0 < got[check]["seconds"] < 60
    # reported like any experiment
    md = run_cli("report", exp.id, "--store", store, "--format", "md")
    assert md.returncode == 0 and "| functional | GPU pod: exec works | pass |" in md.stdout
    js = json.loads(run_cli("report", exp.id, "--store", store, "--format", "json").stdout)
    assert js["verdict"].startswith("passed:") and len(js["checks"]) == len(got)
    assert js["figures"]["recovery_s"]["better"] == "lower"
    html = run_cli("report", exp.id, "--store", store, "--format", "html").stdout
    assert "<table" in html and "over-request stays Pending" in html
    term = run_cli("report", exp.id, "--store", store).stdout
    assert "CPU-only pod gets no GPU" in term


@pytest.mark.cluster
def test_a_pod_that_cannot_start_fails_with_the_reason_and_is_cleaned_up(cluster, tmp_path):
    store = tmp_path / "v.db"
    r = run_cli("validate", "--kubeconfig", cluster.kubeconfig, "--image", "localhost/no-such-image:1",
                "--image-pull-policy", "Never", "--store", store, "--timeout", "8")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("gpuvs: error: ")
    got = rows(stored(store))
    assert got["GPU pod: scheduled"]["status"] == "pass"
    assert got["GPU pod: running"]["status"] == "FAIL" and "ErrImageNeverPull" in got["GPU pod: running"]["detail"]
    assert got["GPU pod: exec works"]["status"] == "not run"
    assert got["over-request stays Pending"]["status"] == "pass"  # needs no image
    assert got["several GPU pods: all running at once"]["status"] == "FAIL"
    assert "ErrImageNeverPull" in got["several GPU pods: all running at once"]["detail"]
    assert got["several GPU pods: deleted and gone"]["status"] == "pass"
    assert got["GPU pod: deleted and gone"]["status"] == "pass"
    assert got["nothing left behind"]["status"] == "pass" and leftovers(cluster) == []


@pytest.mark.cluster
@pytest.mark.slow
def test_availability_suite_through_the_test_cluster_script(cluster, tmp_path):
    store = tmp_path / "v.db"
    node = cluster.nodes[0]
    r = validate(cluster, store, "--timeout", "90", "--disruptive", "--node", node,
                 "--restart-plugin-cmd", cluster.command("plugin", "restart", node),
                 "--restart-kubelet-cmd", cluster.command("kubelet", "restart", node),
                 "--stop-apiserver-cmd", cluster.command("apiserver", "stop"),
                 "--start-apiserver-cmd", cluster.command("apiserver", "start"), "--apiserver-outage", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(stored(store))
    for check in ("device plugin restart", "kubelet restart", "API server outage"):
        row = got[check]
        assert row["status"] == "pass", row
        obs = row["observed"]
        assert obs["job_restarts"] == 0 and obs["job_same_container"] and obs["job_phase"] == "Running"
        assert obs["longest_beat_gap_s"] <= 3 and obs["beats_since"] > 0
        assert obs["allocatable_before"] == obs["allocatable_after"] == cluster.gpus
        assert 0 < row["recovery_s"] < 90
        assert obs["new_gpu_pod"].startswith("new GPU pod ran")
    # back after a kubelet restart means the new kubelet has reported, not its predecessor's Ready still showing
    kubelet = got["kubelet restart"]["observed"]
    assert 0 < kubelet["kubelet_reported_s"] <= got["kubelet restart"]["recovery_s"], kubelet
    assert "kubelet_reported_s" not in got["device plugin restart"]["observed"]
    # the outage was real: the API server did not answer while it was stopped, for about the time asked
    assert got["API server outage"]["observed"]["api_silent_s"] >= 3
    assert got["API server outage"]["recovery_s"] >= 5
    assert got["nothing left behind"]["status"] == "pass" and leftovers(cluster) == []
    cluster.wait_ready(90)  # every node back in service (the restarted kubelet's taint lifted)


@pytest.mark.cluster
@pytest.mark.slow
def test_sigterm_during_an_api_server_outage_restarts_it_and_cleans_up(cluster, tmp_path):
    store = tmp_path / "v.db"
    node = cluster.nodes[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuvs", "validate", "--kubeconfig", str(cluster.kubeconfig), "--image", IMAGE,
         "--image-pull-policy", "Never", "--pod-security", "baseline", "--store", str(store), "--timeout", "60",
         "--disruptive", "--node", node,
         "--stop-apiserver-cmd", cluster.command("apiserver", "stop"),
         "--start-apiserver-cmd", cluster.command("apiserver", "start"), "--apiserver-outage", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gpuvs_env())
    try:
        deadline = time.monotonic() + 120
        while answers(cluster):
            assert time.monotonic() < deadline and proc.poll() is None, "the API server was never stopped"
            time.sleep(0.5)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
        api_back = answers(cluster)  # before anything of this test could start it
    finally:
        if proc.poll() is None:
            proc.kill()
        if not answers(cluster):
            cluster.script("apiserver", "start")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert api_back, "gpuvs did not start the API server it had stopped"
    # its nodes post their status again within a few seconds; nothing of the run is left
    deadline = time.monotonic() + 60
    while cluster.script("status", check=False).returncode != 0:
        assert time.monotonic() < deadline, cluster.script("status", check=False).stdout
        time.sleep(1)
    assert leftovers(cluster) == []
    exp = stored(store)
    assert exp.meta.finished is False and "SIGTERM" in exp.meta.stopped
    assert rows(exp)["nothing left behind"]["status"] == "pass"


@pytest.mark.cluster
@pytest.mark.parametrize("args, says", [
    (("--namespace", "no-such-ns"), "no such namespace"),
    (("--node", "no-such-node"), "no such node"),
    (("--disruptive", "--node", "gpuvs-node-1"), "needs at least one of"),
    (("--restart-kubelet-cmd", "true"), "add --disruptive"),
    (("--disruptive", "--node", "gpuvs-node-1", "--stop-apiserver-cmd", "true"), "go together"),
    (("--image-pull-policy", "Sometimes"), "allowed Always, IfNotPresent, Never"),
])
def test_bad_input_is_one_line_exit_2(cluster, tmp_path, args, says):
    r = validate(cluster, tmp_path / "v.db", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and says in r.stderr
    assert not (tmp_path / "v.db").exists()  # nothing started, nothing stored


def test_no_cluster_and_bad_kubeconfig_are_one_line_exit_2(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "x",
                              "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:9"}}],
                              "users": [{"name": "x", "user": {"token": "t"}}],
                              "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    for args, says in (((), "no cluster reachable"), (("--context", "nope"), "nope")):
        r = run_cli("validate", "--kubeconfig", kc, "--image", IMAGE, "--store", tmp_path / "v.db", *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    r = run_cli("validate", "--kubeconfig", tmp_path / "missing", "--image", IMAGE)
    assert r.returncode == 2 and "no such file" in r.stderr
    r = run_cli("validate", "--kubeconfig", kc)
    assert r.returncode == 2 and "--image" in r.stderr
    assert os.listdir(tmp_path) == ["kc"]


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_probe_and_job_pods_meet_the_pod_security_standard_asked(level):
    """Every pod validate starts (the shell probe, the service and client pods, the GPU job built as a trial pod)
    meets --pod-security's Pod Security Standard (tests/pss.py: the rules Pod Security admission enforces on
    1.23+; the test cluster's 1.20 has no such admission). baseline adds only what restricted asks beyond the
    image's user: the one rule left is runAsNonRoot."""
    from types import SimpleNamespace

    from pss import violations

    from gpuvs.validate.probe import Pods
    from gpuvs.validate.cpu_service import job_body
    from gpuvs.validate.suite import Settings

    pods = Pods(None, "r1", IMAGE, "Never", "nvidia.com/gpu", deadline_s=600, pod_security=level)
    settings = Settings(image=IMAGE, pull="Never", pod_security=level)
    specs = {"probe": pods.body(pods.name("gpu"), 1, "n1")["spec"],
             "service": pods.body(pods.name("service"), 0, "n1", command=["python3", "-c", "pass"])["spec"],
             "job": job_body(SimpleNamespace(settings=settings, pods=pods), pods.name("job"), "n1")["spec"]}
    for what, spec in specs.items():
        assert violations(spec, level) == [], what
        c = spec["containers"][0]
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], what
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, what
        if level == "baseline":  # the image's own user (root in most GPU images): everything else restricted asks
            assert violations(spec, "restricted") == [f"{c['name']}: runAsNonRoot is not true"], what
        else:
            assert spec["securityContext"]["runAsNonRoot"] is True, what


@pytest.mark.cluster
def test_restricted_by_default_a_root_image_is_refused_with_the_way_out(cluster, tmp_path):
    """Without --pod-security the probe pods are held to restricted (runAsNonRoot): the kubelet refuses the test
    image, whose user is root, and the failed check says to give --pod-security baseline. Before, validate's
    --pod-security was never passed on: every probe pod ran as baseline, whatever was asked."""
    r = run_cli("validate", "--kubeconfig", cluster.kubeconfig, "--image", IMAGE, "--image-pull-policy", "Never",
                "--store", tmp_path / "v.db", "--timeout", "30")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "runAsNonRoot" in r.stderr and "(the image's user is root: give --pod-security baseline)" in r.stderr, \
        r.stderr
    assert leftovers(cluster) == []


def test_validate_refuses_an_unknown_pod_security_in_one_line(tmp_path):
    r = run_cli("validate", "--image", IMAGE, "--pod-security", "privileged", "--store", tmp_path / "v.db")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "baseline, restricted" in r.stderr, r.stderr
    assert not (tmp_path / "v.db").exists()
