"""gpuvs agent in the project's real test cluster (RBAC on), deployed as a user deploys it, from gpuvs's own image.

One node is slowed and one busy: the agent's run skips the busy node and labels the slowed one slower.
A real Prometheus scraping the agent sees the slowed node's ratio below 1.
A run cut short by deleting the agent's pod leaves nothing behind, and is listed as interrupted afterwards."""

from __future__ import annotations

import functools
import json
import shutil
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
import conftest
from conftest import ROOT, missing_part, run_cli, stop_process

pytestmark = pytest.mark.cluster
NS = "gpuvs-system"
IMAGE = f"localhost/gpuvs:{gpuvs.__version__}"
BUSY_IMAGE = "localhost/gpuvs-python:test"
PV = "gpuvs-agent-store"  # overlays/test-cluster's volume, in the folder scripts/test-cluster up makes
OVERLAY = ROOT / "overlays" / "test-cluster"
PORT = 18080  # the overlay's
SPIN = "spin:steps=6,ops=1500000,warmup-steps=1"  # about 1.3 s a trial on a node at full speed
AGENT = "app.kubernetes.io/name=gpuvs,app.kubernetes.io/component=agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


wait_for = functools.partial(conftest.wait_for, step=0.5)  # the cluster's API is asked at most twice a second


def http(port: int, path: str, method: str = "GET", token: str | None = None) -> tuple[int, bytes]:
    return http_headers(port, path, method, token)[:2]


def http_headers(port: int, path: str, method: str = "GET", token: str | None = None
                 ) -> tuple[int, bytes, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)
    except OSError:
        return 0, b"", {}


def post_run(port: int, token: str) -> tuple[int, bytes]:
    """POST /runs with the token, again after Retry-After while --min-interval has not passed since the last run."""
    for _ in range(10):
        code, body, headers = http_headers(port, "/runs", "POST", token)
        if code != 429:
            return code, body
        time.sleep(int(headers["Retry-After"]))
    return code, body


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

    def gone(read):
        try:
            read()
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_for(lambda: gone(lambda: core.read_namespace(NS)), 180, f"namespace {NS} gone")
    wait_for(lambda: gone(lambda: core.read_persistent_volume(PV)), 60, f"volume {PV} gone")
    from cluster import STATE

    shutil.rmtree(STATE / "agent-store", ignore_errors=True)  # the next agent starts with an empty store
    (STATE / "agent-store").mkdir(mode=0o755)


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


@pytest.mark.quiet  # its verdict reads timing (tests/quiet.py)
@pytest.mark.timeout(1200)  # a cold image build (new dependencies) takes minutes before the test itself
def test_the_agent_labels_the_slow_node_prometheus_sees_it_and_a_killed_agent_leaves_nothing(image, cluster):  # noqa: F811
    from kubernetes.client.exceptions import ApiException

    if len(cluster.nodes) < 3:
        missing_part(f"the agent's test needs the test cluster with 3 nodes; it has {len(cluster.nodes)}")
    cluster.wait_ready()
    core = cluster.core()
    home, slow, busy = cluster.nodes[:3]
    port = PORT
    remove_all(cluster, core)
    clear_perf_labels(core, cluster.nodes)
    tmp = Path(tempfile.mkdtemp(prefix="gpuvs-agent-test-"))
    prom = None
    t0 = time.monotonic()
    try:
        args = ["--every", "1h", "--first-after", "10s", "--workload", SPIN, "--margin", "0.3", "--trials", "4",
                "--max-trials", "8", "--parallel", "2", "--hold-timeout", "15"]
        r = run_cli("deploy", "--overlay", OVERLAY, "--image", image, "--kubeconfig", cluster.kubeconfig,
                    *[f"--agent-arg={a}" for a in args[:3] + ["1h"] + args[4:]], timeout=120)  # no run yet
        assert r.returncode == 0, r.stderr
        assert "Deployment/gpuvs-agent created" in r.stdout and "PriorityClass/gpuvs-trial created" in r.stdout
        # applied again with other arguments and no --overlay: each object patched, the overlay kept
        again = run_cli("deploy", "--image", image, "--kubeconfig", cluster.kubeconfig,
                        *[f"--agent-arg={a}" for a in args + ["--min-interval", "10s"]], timeout=120)
        assert again.returncode == 0 and again.stdout.count(" configured") == r.stdout.count(" created") - 1 == 12, \
            again.stdout + again.stderr
        assert f"overlay {OVERLAY} kept from the last deploy" in again.stdout, again.stdout
        # the API token: a Secret made once by the first deploy, kept by the second
        assert "Secret/gpuvs-agent-token created" in r.stdout and "Secret/gpuvs-agent-token kept" in again.stdout
        import base64

        token = base64.b64decode(core.read_namespaced_secret("gpuvs-agent-token", NS).data["token"]).decode()
        assert len(token) >= 32
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
        wait_for(lambda: http(port, "/readyz")[0] == 200, 120, "the agent ready")
        first = wait_for(lambda: next((x for x in runs(port) if x["status"] not in ("queued", "running")), None),
                         300, "the first scheduled run to end", step=2)
        print(f"\nfirst run ended {time.monotonic() - t0:.0f} s into the test: {first['status']} {first['reason']}")
        assert first["trigger"] == "schedule" and first["status"] == "ok", first
        assert first["tested"] == [home, slow], first
        assert busy in first["skipped"] and "requested by other pods" in first["skipped"][busy], first
        assert first["checks"] and first["checks"]["functional: GPU pod: exec works"] == "pass", first["checks"]
        labels = core.read_node(slow).metadata.labels
        assert labels["gpuvs.io/perf"] == "slower" and float(labels["gpuvs.io/perf-ratio"]) < 1, labels
        # against the slowed node (its only peer) the healthy one reads faster: any word but slower (the one
        # vocabulary, docs/vocabulary.md; `ok` before it)
        assert core.read_node(home).metadata.labels["gpuvs.io/perf"] in ("equivalent", "faster-within-margin", "faster")
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
        # a run on demand (with the token of the Secret the pod mounts), cut short by deleting the agent's pod
        assert http(port, "/runs", "POST")[0] == 401 and http(port, "/runs", "POST", token + "x")[0] == 401
        code, body = post_run(port, token)
        assert code == 202, body
        second = json.loads(body)["id"]
        assert http(port, "/runs", "POST", token)[0] == 409  # one run at a time
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


@pytest.mark.timeout(900)
def test_deploy_delete_mid_run_stops_the_agent_first_and_leaves_no_node_marked(image, cluster):  # noqa: F811
    """`gpuvs deploy --delete` while the agent's run tests nodes: it deletes the Deployment first and waits for the
    agent's pod to go (the agent, stopping, ends its validate child and takes gpuvs.io/testing off with its
    ServiceAccount's rights still in place), then the rest. No node carries gpuvs.io/testing when it returns,
    nor a while later (before: it returned in 2.5 s and every tested node kept the label for good). The probe
    pods the agent's validate started run under the restricted Pod Security Standard (the agent passes its
    --pod-security on). Then a mark an agent could not remove (put on by hand) is taken off by --delete itself."""
    from pss import violations

    if len(cluster.nodes) < 2:
        missing_part(f"this test needs the test cluster with 2 nodes or more; it has {len(cluster.nodes)}")
    cluster.wait_ready()
    core = cluster.core()
    remove_all(cluster, core)
    clear_perf_labels(core, cluster.nodes)
    try:
        args = ["--every", "1h", "--first-after", "1s", "--workload", SPIN, "--trials", "4", "--hold-timeout", "15"]
        r = run_cli("deploy", "--overlay", OVERLAY, "--image", image, "--kubeconfig", cluster.kubeconfig,
                    *[f"--agent-arg={a}" for a in args], timeout=120)
        assert r.returncode == 0, r.stderr

        def probe_running():
            pods = core.list_namespaced_pod(NS, label_selector="gpuvs-validate").items
            return next((p for p in pods if p.status.phase == "Running"), None)

        probe = wait_for(probe_running, 240, "a probe pod of the agent's validate running", step=0.5)
        spec = core.api_client.sanitize_for_serialization(probe.spec)
        assert violations(spec, "restricted") == [], spec
        marked = labelled_testing(core)
        assert marked, "the run in flight has marked its nodes"
        t0 = time.monotonic()
        r = run_cli("deploy", "--delete", "--kubeconfig", cluster.kubeconfig, timeout=180)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        assert labelled_testing(core) == [], (marked, f"{took:.1f} s", r.stdout)
        lines = r.stdout.splitlines()
        assert lines[0] == "Deployment/gpuvs-agent deleted", r.stdout
        assert any(x.startswith("Pod/gpuvs-agent-") and "gone after" in x for x in lines[1:3]), r.stdout
        assert lines[-1] == "Namespace/gpuvs-system deleted" and "ClusterRoleBinding/gpuvs-agent deleted" in lines
        assert "left by the agent" not in r.stdout, r.stdout  # the agent took its own marks off
        print(f"\ndeploy --delete mid-run on {marked}: {took:.1f} s; {r.stdout}")
        time.sleep(15)
        assert labelled_testing(core) == []
        # a mark the agent could not remove (killed at the end of its grace period): --delete takes it off
        core.patch_node(cluster.nodes[1], {"metadata": {"labels": {"gpuvs.io/testing": "true"}}})
        r = run_cli("deploy", "--delete", "--kubeconfig", cluster.kubeconfig, timeout=180)
        assert r.returncode == 0, r.stderr
        assert f"Node/{cluster.nodes[1]} gpuvs.io/testing removed (left by the agent)" in r.stdout, r.stdout
        assert labelled_testing(core) == []
    finally:
        try:
            remove_all(cluster, core)
        finally:
            clear_perf_labels(core, cluster.nodes)


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
    from gpuvs.trial.runner import Runner
    from gpuvs.spec import EnvSpec, RunSpec
    from gpuvs.store.db import Store

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
        mine = f"gpuvs.io/run-id={spec.run_id}"
        wait_for(lambda: [p for p in core.list_namespaced_pod("default", label_selector=mine).items
                          if p.status.phase == "Running"], 120, "the trial running")
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
        assert core.list_namespaced_pod("default", label_selector=f"gpuvs.io/run-id={spec.run_id}").items == []
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


@pytest.mark.quiet  # its verdict reads timing (tests/quiet.py)
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
                              "default", "--image", BUSY_IMAGE, "--image-pull-policy", "Never", "--pod-security",
                              "baseline", "--validate", "false",
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
        def waits() -> list[int]:
            return [int(x.split("next scheduled run in ")[1].split(" s")[0]) for x in log.read_text().splitlines()
                    if "next scheduled run in" in x]

        # the run is recorded before the agent logs its next wait: the line after it comes a moment later
        wait_for(lambda: waits() and waits()[-1] > 3000, 20, "the wait of --every logged after the run that reached it")
        waits = waits()
        assert waits[0] <= 5 < waits[1] <= 10 and waits[-1] > 3000, waits  # backed off, then back to --every
        assert labelled_testing(core) == []
    finally:
        try:
            assert stop_process(agent, 60) == 0, log.read_text()[-2000:]
        finally:
            fwd.stop()
            clear_perf_labels(core, cluster.nodes)
            try:
                sched.delete_priority_class("gpuvs-trial")
            except ApiException as exc:
                assert exc.status == 404
    assert [p.metadata.name for p in core.list_namespaced_pod("default", label_selector="gpuvs=1").items] == []


# CPU quotas (percent of one CPU; 0: none) on one node at the agent's successive runs. The 2-core machine's speed
# moves by up to 2x within seconds, and the three nodes share its two cores with other work: a node's runs move by
# 10-20% against its peers, so the slide is made of steps large enough to stand out of that. The first run is not
# slowed (the node must read as not slower than its peers): a first step of 90% was meant to hardly slow a node that
# gets less than a whole CPU anyway, but on CI's machine it read 0.758, `slower` at a margin of 0.3. How much a quota
# slows a node depends on the machine's load: on CI's quiet machine 30% and 12% read 0.371 and 0.137 against the
# peers, on a machine busy with other work 20% and 12% read 0.739 and 0.285. So the steps are 12% and 6%.
SLIDE = (0, 12, 6)
DRIFT_SPIN = "spin:steps=4,ops=600000,warmup-steps=1"
# Earlier fleet runs made by `gpuvs fleet` (a drift verdict needs 3): 5, since with 3 a change point at a slowed run
# was missed in 1 of 4 runs here (the slide's two large steps give the slowed node a run-to-run spread of its own,
# with few degrees of freedom). Simulated with tests/fleet_store.py's runs (margin 0.3, 18% run-to-run movement per
# node, a 5% trial cv) after the 5 seeds: every assertion below on drift and change points held in 200 of 200
# fleets at levels 1, 0.14 and 0.07 (the quiet machine), 190 of 200 at 1, 0.285 and 0.15 (a busy one), and only 34
# of 100 at 1, 0.74 and 0.285 (20% and 12% on the busy machine: one run that clearly stepped is too few).
SEED_RUNS = 5


# Five seeding fleets and three agent runs (each waiting out --min-interval): about 4 minutes on an idle machine;
# pytest's 300 s was its whole budget and a busy machine ran past it (conftest stretches this with the load).
@pytest.mark.quiet  # its verdict reads timing (tests/quiet.py)
@pytest.mark.timeout(900)
def test_a_node_slowed_more_at_each_agent_run_is_reported_drifting_and_a_stable_node_is_not(cluster, tmp_path):  # noqa: F811
    """The agent run by hand against the test cluster, its store seeded with real `gpuvs fleet` runs of the three
    nodes (none slowed); then the agent's runs (POST /runs), the first with nothing slowed and one node slowed
    more before each later one. At the first run the node is not called slower than its peers; after the last one
    the agent's /metrics has its drift ratio below 1 and verdict slower (fresh), the stable nodes' drift not slower
    or faster, and `gpuvs fleet history --format json` on the agent's store reads the slowed node drifting slower
    with its change point at one of the slowed runs, the stable nodes not drifting. The quota is removed and the
    labels cleared, whatever happens."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from prometheus_client.parser import text_string_to_metric_families

    from conftest import gpuvs_env

    if len(cluster.nodes) < 3:
        missing_part(f"the drift test needs the test cluster with 3 nodes; it has {len(cluster.nodes)}")
    cluster.wait_ready()
    core = cluster.core()
    nodes = sorted(cluster.nodes[:3])
    slow, stable = nodes[1], [nodes[0], nodes[2]]
    sched = client.SchedulingV1Api(core.api_client)
    made_class = False
    try:
        sched.create_priority_class({"metadata": {"name": "gpuvs-trial"}, "value": -100,
                                     "preemptionPolicy": "Never", "description": "gpuvs's agent test"})
        made_class = True
    except ApiException as exc:
        assert exc.status == 409
    store = tmp_path / "gpuvs.db"
    name, _, opts = DRIFT_SPIN.partition(":")
    spin_args = [a for kv in opts.split(",") for a in ("--" + kv.split("=")[0], kv.split("=")[1])]
    port = free_port()
    log = tmp_path / "agent.log"
    agent = None
    t0 = time.monotonic()
    try:
        for _ in range(SEED_RUNS):
            r = run_cli("fleet", name, *spin_args, "--device", "cpu", "--image", BUSY_IMAGE, "--image-pull-policy",
                        "Never", "--kubeconfig", str(cluster.kubeconfig), "--nodes", ",".join(nodes), "--trials", "4",
                        "--max-trials", "4", "--parallel", "3", "--margin", "0.3", "--store", str(store),
                        timeout=300, cwd=tmp_path)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        seeded = time.monotonic() - t0
        tokens = tmp_path / "token"
        tokens.write_text("drift-test-token")
        agent = subprocess.Popen([sys.executable, "-m", "gpuvs", "agent", "--kubeconfig", str(cluster.kubeconfig),
                                  "--namespace", "default", "--image", BUSY_IMAGE, "--image-pull-policy", "Never",
                                  "--pod-security", "baseline",
                                  "--validate", "false", "--workload", DRIFT_SPIN, "--trials", "4", "--max-trials",
                                  "4", "--parallel", "3", "--margin", "0.3", "--every", "1h", "--first-after", "1h",
                                  "--store", str(store), "--listen", f"127.0.0.1:{port}", "--token-file",
                                  str(tokens), "--min-interval", "10s"],
                                 stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=gpuvs_env(), cwd=tmp_path)
        wait_for(lambda: http(port, "/readyz")[0] == 200, 60, "the agent ready")

        def metrics() -> dict[tuple[str, tuple], float]:
            text = http(port, "/metrics")[1].decode()
            return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
                    for s in f.samples}

        slid = []  # (quota, the run's fleet experiment, the slowed node's verdict against its peers)
        for pct in SLIDE:
            cluster.script("slow", slow, str(pct))
            code, body = post_run(port, "drift-test-token")
            assert code == 202, body
            run_id = json.loads(body)["id"]
            done = wait_for(lambda: next((x for x in runs(port) if x["id"] == run_id
                                          and x["status"] not in ("queued", "running")), None), 180,
                            f"agent run {run_id} to end", step=1)
            assert done["status"] == "ok" and done["tested"] == nodes, done
            exp = done["fleets"][0]["experiment"]
            said = next((dict(k[1])["verdict"] for k, v in metrics().items()
                         if k[0] == "gpuvs_node_perf_verdict" and v == 1 and dict(k[1])["node"] == slow), None)
            ratio = metrics()[("gpuvs_node_perf_ratio", (("node", slow), ("workload", "spin")))]
            slid.append((pct, exp, said, round(ratio, 3)))
        cluster.script("slow", slow, "0")
        m = metrics()
        print(f"\nseeded {SEED_RUNS} runs in {seeded:.0f} s; slowed {slow} at {SLIDE}% of one CPU: {slid}; "
              f"{time.monotonic() - t0:.0f} s in all")
        assert slid[0][2] != "slower", slid  # at first not slower than its peers (within the margin may be)

        def drift(node: str, what: str = "gpuvs_node_drift_ratio", **labels) -> float:
            return m[(what, tuple(sorted({"node": node, "workload": "spin", **labels}.items())))]

        print({n: (round(drift(n), 3), [v for v in ("slower", "faster", "equivalent", "inconclusive")
                                         if drift(n, "gpuvs_node_drift_verdict", verdict=v) == 1])
               for n in nodes})
        assert drift(slow) < 1 and drift(slow, "gpuvs_node_drift_interval_ratio", bound="high") < 1
        assert drift(slow, "gpuvs_node_drift_verdict", verdict="slower") == 1
        assert drift(slow, "gpuvs_node_drift_stale") == 0
        for n in stable:
            assert drift(n, "gpuvs_node_drift_verdict", verdict="slower") == 0
            assert drift(n, "gpuvs_node_drift_verdict", verdict="faster") == 0
            assert drift(n, "gpuvs_node_drift_stale") == 0
        h = run_cli("fleet", "history", "--store", str(store), "--format", "json", cwd=tmp_path)
        assert h.returncode == 0, h.stderr
        standing = {n["node"]: n for n in json.loads(h.stdout)["workloads"][0]["nodes"]}
        assert list(standing)[0] == slow
        assert standing[slow]["drift"]["verdict"] == "slower"
        assert standing[slow]["drift"]["ratio"] == pytest.approx(drift(slow), rel=1e-9)
        assert standing[slow]["change"] and standing[slow]["change"]["run_id"] in [x[1] for x in slid[1:]], \
            standing[slow]["change_points"]
        for n in stable:  # not drifting (a false change point on a stable node is held at 5% a check: shown)
            assert standing[n]["drift"]["verdict"] not in ("slower", "faster"), standing[n]["drift"]
        print(f"{slow}: {standing[slow]['drift']['ratio']:.3f} of its past, {standing[slow]['since_when']}; "
              f"stable nodes' change points: {[len(standing[n]['change_points']) for n in stable]}")
    finally:
        cluster.script("slow", slow, "0")
        if agent is not None:
            assert stop_process(agent, 60) == 0, log.read_text()[-2000:]
        clear_perf_labels(core, cluster.nodes)
        if made_class:
            sched.delete_priority_class("gpuvs-trial")
    assert [p.metadata.name for p in core.list_namespaced_pod("default", label_selector="gpuvs=1").items] == []
    assert labelled_testing(core) == []
