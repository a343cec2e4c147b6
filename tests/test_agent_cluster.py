"""gpuvs agent in the project's real test cluster (RBAC on), as it is deployed: gpuvs's image built by
scripts/build-image and loaded into the nodes, `gpuvs deploy`, the agent running with its ServiceAccount.

One node is slowed (a CPU quota, removed after), one runs a pod of someone else's that requested its GPUs. After
the agent's first scheduled run the busy node was skipped (the scheduler would not place the agent's hold pod),
the slowed node carries gpuvs.io/perf=slow, no node carries gpuvs.io/testing, and a real Prometheus server
(Debian's, started here) scraping the agent has the slowed node's ratio below 1 (asked through its HTTP API).
Then a run asked for through POST /runs is cut short by deleting the agent's pod: no trial, probe or hold pod and
no gpuvs.io/testing label is left, and the agent's next pod lists that run as interrupted.

The test cluster's API server listens on 127.0.0.1 only and has no kube-proxy, so a pod cannot reach it through
the `kubernetes` Service: the test's overlay (a merge patch of the Deployment) gives the agent's pod the host's
network and the API server's address. Everything else is deploy/ as shipped. Everything made is removed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from cluster import cluster  # noqa: F401  (the session fixture)

import gpuvs
from conftest import ROOT, missing_part, run_cli

pytestmark = pytest.mark.cluster
NS = "gpuvs-system"
IMAGE = f"localhost/gpuvs:{gpuvs.__version__}"
BUSY_IMAGE = "localhost/gpuvs-python:test"
PV = f"gpuvs-agent-test-{os.getpid()}"
STORE_DIR = Path(f"/tmp/{PV}")
SPIN = "spin:steps=6,ops=1500000,warmup-steps=1"  # about 1.3 s a trial on a node at full speed
AGENT = "app.kubernetes.io/name=gpuvs,app.kubernetes.io/component=agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn, timeout: float, what: str, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(step)


def http(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def runs(port: int) -> list[dict]:
    code, body = http(port, "/runs")
    return json.loads(body) if code == 200 else []


def labelled_testing(core) -> list[str]:
    return [n.metadata.name for n in core.list_node(label_selector="gpuvs.io/testing").items]


def gpuvs_pods(core) -> list[str]:
    return [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="gpuvs=1").items]


def clear_perf_labels(core, nodes) -> None:
    for n in nodes:
        core.patch_node(n, {"metadata": {"labels": {"gpuvs.io/perf": None, "gpuvs.io/perf-ratio": None,
                                                    "gpuvs.io/testing": None},
                            "annotations": {"gpuvs.io/perf-details": None}}})


def remove_all(cluster, core) -> None:  # noqa: F811
    from kubernetes.client.exceptions import ApiException

    r = run_cli("deploy", "--delete", "--kubeconfig", cluster.kubeconfig, timeout=120)
    assert r.returncode == 0, r.stderr
    for call in (lambda: core.delete_persistent_volume(PV), lambda: core.delete_namespaced_pod("busy", "default",
                                                                                                grace_period_seconds=0)):
        try:
            call()
        except ApiException as exc:
            assert exc.status == 404, exc

    def gone():
        try:
            core.read_namespace(NS)
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_for(gone, 180, f"namespace {NS} gone")
    shutil.rmtree(STORE_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def image():
    for tool, what in (("podman", "podman builds gpuvs's image"), ("debootstrap", "debootstrap makes its base")):
        if shutil.which(tool) is None:
            missing_part(f"{what}: `{tool}` is not on PATH (see .ci/apt/image.txt)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts/build-image"), "--load"], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return IMAGE


def prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        missing_part("Prometheus is not installed (apt-get install prometheus: .ci/apt/agent.txt)")
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: gpuvs-agent\n"
        f"  static_configs:\n  - targets: ['{target}']\n")
    p = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                          f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                         stderr=open(tmp / "prometheus.log", "w"))
    return p, port


def promql(port: int, query: str) -> list[dict]:
    from urllib.parse import quote

    code, body = http(port, f"/api/v1/query?query={quote(query)}")
    if code != 200:
        return []
    data = json.loads(body)
    return data["data"]["result"] if data.get("status") == "success" else []


@pytest.mark.timeout(1200)  # a cold image build (new dependencies) takes minutes before the test itself
def test_the_agent_labels_the_slow_node_prometheus_sees_it_and_a_killed_agent_leaves_nothing(image, cluster):  # noqa: F811
    from kubernetes.client.exceptions import ApiException

    if len(cluster.nodes) < 3:
        missing_part(f"the agent's test needs the test cluster with 3 nodes; it has {len(cluster.nodes)}")
    cluster.wait_ready()
    core = cluster.core()
    home, slow, busy = cluster.nodes[:3]
    port = free_port()
    remove_all(cluster, core)
    clear_perf_labels(core, cluster.nodes)
    tmp = Path(tempfile.mkdtemp(prefix="gpuvs-agent-test-"))
    prom = None
    t0 = time.monotonic()
    try:
        args = ["--every", "1h", "--first-after", "10s", "--workload", SPIN, "--margin", "0.3", "--trials", "4",
                "--max-trials", "8", "--parallel", "2", "--hold-timeout", "15", "--listen", f":{port}"]
        r = run_cli("deploy", "--image", image, "--kubeconfig", cluster.kubeconfig,
                    *[f"--agent-arg={a}" for a in args], timeout=120)
        assert r.returncode == 0, r.stderr
        assert "Deployment/gpuvs-agent created" in r.stdout and "PriorityClass/gpuvs-trial created" in r.stdout
        again = run_cli("deploy", "--image", image, "--kubeconfig", cluster.kubeconfig,
                        *[f"--agent-arg={a}" for a in args], timeout=120)  # applied again: each one patched
        assert again.returncode == 0 and again.stdout.count(" configured") == r.stdout.count(" created") == 10, \
            again.stdout + again.stderr
        # the test cluster's overlay: the host's network, and the API server where it listens
        from kubernetes import client

        apps = client.AppsV1Api(core.api_client)
        import yaml
        from urllib.parse import urlsplit

        api = urlsplit(yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]["server"])
        c = "/spec/template/spec/containers/0"
        apps.patch_namespaced_deployment("gpuvs-agent", NS, [
            {"op": "add", "path": "/spec/template/spec/hostNetwork", "value": True},
            {"op": "add", "path": "/spec/template/spec/dnsPolicy", "value": "ClusterFirstWithHostNet"},
            {"op": "replace", "path": f"{c}/ports/0/containerPort", "value": port},
            {"op": "add", "path": f"{c}/env/-", "value": {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname}},
            {"op": "add", "path": f"{c}/env/-", "value": {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)}}])
        # someone else's pod holding every GPU of `busy`
        core.create_namespaced_pod("default", {
            "metadata": {"name": "busy"}, "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"kubernetes.io/hostname": busy},
                "containers": [{"name": "c", "image": BUSY_IMAGE, "imagePullPolicy": "Never",
                                "command": ["sh", "-c", "sleep 600"],
                                "resources": {"limits": {"nvidia.com/gpu": str(cluster.gpus)}}}]}})
        wait_for(lambda: core.read_namespaced_pod("busy", "default").status.phase == "Running", 60, "busy running")
        cluster.script("slow", slow, "25")
        STORE_DIR.mkdir(mode=0o755, exist_ok=True)
        core.create_persistent_volume({
            "metadata": {"name": PV}, "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "local": {"path": str(STORE_DIR)},
                "claimRef": {"namespace": NS, "name": "gpuvs-store"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [home]}]}]}}}})
        wait_for(lambda: http(port, "/readyz")[0] == 200, 120, "the agent ready")
        first = wait_for(lambda: next((x for x in runs(port) if x["status"] not in ("queued", "running")), None),
                         300, "the first scheduled run to end", step=2)
        print(f"\nfirst run ended {time.monotonic() - t0:.0f} s into the test: {first['status']} {first['reason']}")
        assert first["trigger"] == "schedule" and first["status"] == "ok", first
        assert first["tested"] == [home, slow], first
        assert busy in first["skipped"] and "requested by other pods" in first["skipped"][busy], first
        assert first["checks"] and first["checks"]["functional: GPU pod: exec works"] == "pass", first["checks"]
        labels = core.read_node(slow).metadata.labels
        assert labels["gpuvs.io/perf"] == "slow" and float(labels["gpuvs.io/perf-ratio"]) < 1, labels
        assert core.read_node(home).metadata.labels["gpuvs.io/perf"] == "ok"
        assert "gpuvs.io/perf" not in (core.read_node(busy).metadata.labels or {})  # skipped: not labelled
        assert labelled_testing(core) == [] and gpuvs_pods(core) == []
        cluster.script("slow", slow, "0")
        # a real Prometheus scraping the agent
        prom, prom_port = prometheus(tmp, f"127.0.0.1:{port}")
        got = wait_for(lambda: promql(prom_port, f'gpuvs_node_perf_ratio{{node="{slow}",workload="spin"}}'), 60,
                       "the slowed node's ratio in Prometheus")
        assert float(got[0]["value"][1]) < 1, got
        assert float(promql(prom_port, f'gpuvs_node_perf_verdict{{node="{slow}",verdict="slower"}}')[0]["value"][1]) == 1
        assert float(promql(prom_port, 'gpuvs_validate_check_ok{check="functional: GPU pod: exec works"}')
                     [0]["value"][1]) == 1
        assert float(promql(prom_port, 'gpuvs_runs_total{trigger="schedule",status="ok"}')[0]["value"][1]) == 1
        # a run on demand, cut short by deleting the agent's pod
        code, body = http(port, "/runs", "POST")
        assert code == 202, body
        second = json.loads(body)["id"]
        assert http(port, "/runs", "POST")[0] == 409  # one run at a time
        wait_for(lambda: labelled_testing(core) and gpuvs_pods(core), 120, "the second run testing nodes with pods")
        pod = core.list_namespaced_pod(NS, label_selector=AGENT).items[0].metadata.name
        core.delete_namespaced_pod(pod, NS)

        def old_gone():
            try:
                core.read_namespaced_pod(pod, NS)
                return False
            except ApiException as exc:
                return exc.status == 404

        # the old agent cleaned up before it went (the ReplicaSet's next agent starts no run for 10 s)
        wait_for(old_gone, 90, "the deleted agent's pod gone", step=0.2)
        assert labelled_testing(core) == [] and gpuvs_pods(core) == []

        def back():
            found = [x for x in runs(port) if x["id"] == second]
            return found[0] if found and found[0]["status"] not in ("queued", "running") else None

        cut = wait_for(back, 180, "the agent back, with the second run ended", step=1)
        assert cut["status"] == "interrupted", cut
        new = [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=AGENT).items]
        assert pod not in new and len(new) == 1
        print(f"run {second} interrupted and cleaned up; {time.monotonic() - t0:.0f} s in all")
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        cluster.script("slow", slow, "0")
        try:
            remove_all(cluster, core)
        finally:
            clear_perf_labels(core, cluster.nodes)
            shutil.rmtree(tmp, ignore_errors=True)
        try:
            core.read_namespaced_pod("busy", "default")
            raise AssertionError("pod busy left behind")
        except ApiException as exc:
            assert exc.status == 404


def test_a_trial_preempted_by_a_real_job_is_a_failed_trial_with_that_reason(cluster, tmp_path):  # noqa: F811
    """The pod environment at a PriorityClass like gpuvs-trial (below 0, preempting nobody): a trial holding a node's
    GPUs, then a pod of the default priority asking for them. The scheduler preempts the trial; the trial fails
    with kind `preempted` and the scheduler's message naming the job, what it measured before is kept, and no pod
    of it is left."""
    import threading

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpuvs import environments
    from gpuvs.kube import package
    from gpuvs.runner import Runner
    from gpuvs.spec import EnvSpec, RunSpec
    from gpuvs.store import Store

    cluster.wait_ready()
    core = cluster.core()
    sched = client.SchedulingV1Api(core.api_client)
    pc, node, job = "gpuvs-test-preemptible", cluster.nodes[-1], "gpuvs-test-real-job"
    sched.create_priority_class({"metadata": {"name": pc}, "value": -100, "preemptionPolicy": "Never",
                                 "description": "gpuvs's preemption test"})
    got = {}
    try:
        spec = RunSpec(workload="selftest", device="cuda", num_gpus=cluster.gpus, timeout_s=300,
                       params={"steps": 2000, "step_seconds": 0.1},
                       env=EnvSpec("pod", {"image": BUSY_IMAGE, "image_pull_policy": "Never", "namespace": "default",
                                           "kubeconfig": str(cluster.kubeconfig), "node": node,
                                           "priority_class": pc}))
        environments.get(spec.env).check(spec)

        def trial():
            with Store(tmp_path / "gpuvs.db") as st:
                got["result"] = Runner(st).run_trial(spec)

        t = threading.Thread(target=trial)
        t.start()
        wait_for(lambda: [p for p in core.list_namespaced_pod("default", label_selector=f"gpuvs.run_id={spec.run_id}")
                          .items if p.status.phase == "Running"], 120, "the trial running")
        time.sleep(2)  # a few steps measured
        core.create_namespaced_pod("default", {
            "metadata": {"name": job}, "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": BUSY_IMAGE, "imagePullPolicy": "Never",
                                "command": ["sh", "-c", "sleep 300"],
                                "resources": {"limits": {"nvidia.com/gpu": str(cluster.gpus)}}}]}})
        t.join(180)
        assert not t.is_alive(), "the trial did not end after its pod was preempted"
        r = got["result"]
        assert r.status == "failed" and r.error_kind == "preempted", (r.status, r.error_kind, r.error)
        assert "preempted by the scheduler" in r.error and job in r.error, r.error
        assert r.samples  # what it measured before is kept
        wait_for(lambda: core.read_namespaced_pod(job, "default").status.phase == "Running", 60, "the job running")
        assert core.list_namespaced_pod("default", label_selector=f"gpuvs.run_id={spec.run_id}").items == []
    finally:
        package.release()
        for call in (lambda: core.delete_namespaced_pod(job, "default", grace_period_seconds=0),
                     lambda: sched.delete_priority_class(pc)):
            try:
                call()
            except ApiException as exc:
                assert exc.status == 404
        wait_for(lambda: not core.list_namespaced_pod("default", field_selector=f"metadata.name={job}").items, 60,
                 "the job gone")


class Forwarder:
    """A TCP forwarder on 127.0.0.1 to the API server: started late, it makes the API server unreachable for a
    while and then reachable again (the agent's kubeconfig names the forwarder)."""

    def __init__(self, port: int, target: tuple[str, int]):
        self.port, self.target = port, target
        self.sock: socket.socket | None = None
        self.conns: list[socket.socket] = []

    def start(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                a, _ = self.sock.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            self.conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        for c in self.conns:
            c.close()


def test_the_api_server_away_for_a_while_then_back_the_agent_backs_off_and_recovers(cluster, tmp_path):  # noqa: F811
    """The agent run by hand (outside the cluster) against the real API server behind a forwarder that is not there
    at first: runs fail with growing back-off, /metrics says the API is unreachable; once the forwarder is up the
    next try reaches the cluster, the fleet runs on every node, its figures are fresh, the failed runs are kept."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib.parse import urlsplit

    cluster.wait_ready()
    core = cluster.core()
    sched = client.SchedulingV1Api(core.api_client)
    kc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    api = urlsplit(kc["clusters"][0]["cluster"]["server"])
    fwd = Forwarder(free_port(), (api.hostname, api.port))
    kc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{fwd.port}"  # the certificate names 127.0.0.1
    proxied = tmp_path / "kubeconfig"
    proxied.write_text(yaml.safe_dump(kc))
    try:
        sched.create_priority_class({"metadata": {"name": "gpuvs-trial"}, "value": -100, "preemptionPolicy": "Never",
                                     "description": "gpuvs's agent test"})
    except ApiException as exc:
        assert exc.status == 409
    port = free_port()
    from conftest import gpuvs_env

    log = tmp_path / "agent.log"
    agent = subprocess.Popen([sys.executable, "-m", "gpuvs", "agent", "--kubeconfig", str(proxied), "--namespace",
                              "default", "--image", BUSY_IMAGE, "--image-pull-policy", "Never", "--validate", "false",
                              "--workload", "spin:steps=3,ops=300000,warmup-steps=1", "--trials", "4",
                              "--max-trials", "4", "--parallel", "3", "--every", "1h", "--first-after", "0",
                              "--store", str(tmp_path / "gpuvs.db"), "--listen", f"127.0.0.1:{port}"],
                             stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=gpuvs_env(), cwd=tmp_path)
    try:
        failed = wait_for(lambda: [r for r in runs(port) if r["status"] == "failed"][1:], 60, "two failed runs")
        assert all("could not be reached" in r["reason"] for r in failed)
        from prometheus_client.parser import text_string_to_metric_families

        def metric(name: str, **labels) -> float | None:
            text = http(port, "/metrics")[1].decode()
            return next((s.value for f in text_string_to_metric_families(text) for s in f.samples
                         if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())), None)

        assert metric("gpuvs_api_reachable") == 0
        fwd.start()  # the API server is back
        ok = wait_for(lambda: next((r for r in runs(port) if r["status"] == "ok"), None), 180, "a run that reached it",
                      step=1)
        assert ok["tested"] == sorted(cluster.nodes[:3]) and ok["fleets"][0]["experiment"], ok
        assert metric("gpuvs_api_reachable") == 1
        for node in cluster.nodes[:3]:
            assert metric("gpuvs_node_perf_ratio", node=node) > 0
            assert metric("gpuvs_node_perf_stale", node=node) == 0
        assert metric("gpuvs_runs_total", status="failed", trigger="schedule") >= 2
        waits = [int(x.split("next scheduled run in ")[1].split(" s")[0]) for x in log.read_text().splitlines()
                 if "next scheduled run in" in x]
        assert waits[0] <= 5 < waits[1] <= 10 and waits[-1] > 3000, waits  # backed off, then back to --every
        assert labelled_testing(core) == []
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            assert agent.wait(60) == 0, log.read_text()[-2000:]
        finally:
            if agent.poll() is None:
                agent.kill()
            fwd.stop()
            clear_perf_labels(core, cluster.nodes)
            try:
                sched.delete_priority_class("gpuvs-trial")
            except ApiException as exc:
                assert exc.status == 404
    assert [p.metadata.name for p in core.list_namespaced_pod("default", label_selector="gpuvs=1").items] == []
