"""The NodeCondition, Events and the gpuvs.io/slow taint on the real test cluster, RBAC on, as the agent's account.

Without deploy/node-status the account is refused nodes/status; with it, three agent runs with one node slowed.
The slowed node gets the condition and an Event, then the taint once the circuit breaker allows it, then is untainted.
A real Prometheus fires GpuvsNodeSlow from the agent's /metrics. Everything made is removed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cluster import BIN, cluster  # noqa: F401  (the session fixture)
from agent.test_agent_cluster import BUSY_IMAGE, free_port, http, post_run, promql, runs, wait_for

from conftest import ROOT, gpuvs_env, missing_part, stop_process

pytestmark = pytest.mark.cluster
TAG = f"gpuvs-signals-{os.getpid()}"
NS = TAG
SA = "agent"
SPIN = "spin:steps=6,ops=1500000,warmup-steps=1"  # about 1.3 s a trial at full speed
SLOW = "gpuvs.io/slow"


def objects(node_status: bool) -> list[dict]:
    """deploy/'s ClusterRole and Role (and deploy/node-status's) under this test's names, bound to its account."""
    def load(path: str) -> dict:
        return yaml.safe_load((ROOT / "deploy" / path).read_text())

    subject = [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    out = []
    pairs = [("clusterrole.yaml", "ClusterRoleBinding", None), ("role.yaml", "RoleBinding", NS)]
    if node_status:
        pairs = [("node-status/clusterrole.yaml", "ClusterRoleBinding", None),
                 ("node-status/role.yaml", "RoleBinding", "default")]
    for path, binding, ns in pairs:
        role = load(path)
        name = f"{TAG}-{role['metadata']['name']}"
        meta = {"name": name, **({"namespace": ns} if ns else {})}
        out.append({"apiVersion": role["apiVersion"], "kind": role["kind"], "metadata": meta, "rules": role["rules"]})
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding, "metadata": dict(meta),
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": name},
                    "subjects": subject})
    return out


def apply(api, objs: list[dict], delete: bool = False) -> None:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api)
    for m in objs:
        r = dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])
        try:
            if delete:
                r.delete(name=m["metadata"]["name"], namespace=m["metadata"].get("namespace"))
            else:
                r.create(body=m, namespace=m["metadata"].get("namespace"))
        except ApiException as exc:
            assert exc.status in ((404,) if delete else (409,)), exc


def sa_kubeconfig(cluster, core, path: Path) -> Path:  # noqa: F811
    import base64

    def token():
        sa = core.read_namespaced_service_account(SA, NS)
        for ref in sa.secrets or []:
            s = core.read_namespaced_secret(ref.name, NS)
            if s.type == "kubernetes.io/service-account-token" and (s.data or {}).get("token"):
                return base64.b64decode(s.data["token"]).decode()
        return None

    admin = json.loads(Path(cluster.kubeconfig).read_text()) if Path(cluster.kubeconfig).read_text().lstrip(
        ).startswith("{") else yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sa", "clusters": admin["clusters"],
           "users": [{"name": "sa", "user": {"token": wait_for(token, 60, "the account's token")}}],
           "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "sa",
                                                   "namespace": NS}}]}
    path.write_text(yaml.safe_dump(cfg))
    return path


def condition(core, node: str) -> dict | None:
    for c in core.read_node(node).status.conditions or []:
        if c.type == "GpuvsPerformance":
            return {"status": c.status, "reason": c.reason, "message": c.message,
                    "transition": c.last_transition_time, "heartbeat": c.last_heartbeat_time}
    return None


def gpuvs_events(core, node: str) -> dict[str, object]:
    return {e.reason: e for e in core.list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}").items
        if e.source and e.source.component == "gpuvs"}


def slow_taint(core, node: str) -> list[str]:
    return [f"{t.key}={t.value}:{t.effect}" for t in core.read_node(node).spec.taints or [] if t.key == SLOW]


def set_slow_taint(core, node: str, on: bool) -> None:
    from gpuvs.fleet.cluster import taints

    assert taints.set_taint(core, node, "PreferNoSchedule" if on else None) is None


def clean_nodes(core, nodes: list[str]) -> None:
    """gpuvs.io/slow, the condition, gpuvs's events and labels off every node, whatever the test left."""
    from kubernetes.client.exceptions import ApiException

    for n in nodes:
        set_slow_taint(core, n, False)
        core.patch_node_status(n, {"status": {"conditions": [{"type": "GpuvsPerformance", "$patch": "delete"}]}})
        core.patch_node(n, {"metadata": {"labels": {"gpuvs.io/perf": None, "gpuvs.io/perf-ratio": None},
                                         "annotations": {"gpuvs.io/perf-details": None}}})
        for e in gpuvs_events(core, n).values():
            try:
                core.delete_namespaced_event(e.metadata.name, "default")
            except ApiException as exc:
                assert exc.status == 404


def prometheus_with_rules(tmp: Path, target: str) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        missing_part("Prometheus is not installed (apt-get install prometheus: .ci/apt/agent.txt)")
    rules = (ROOT / "deploy/prometheus/gpuvs-rules.yaml").read_text()
    (tmp / "rules.yaml").write_text(re.sub(r"for: \w+", "for: 1s", rules))  # the test's copy: no 5 min wait
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n- {tmp / 'rules.yaml'}\n"
        f"scrape_configs:\n- job_name: gpuvs-agent\n  static_configs:\n  - targets: ['{target}']\n")
    p = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                          f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                         stderr=open(tmp / "prometheus.log", "w"))
    return p, port


def metric(port: int, name: str, **labels) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for f in text_string_to_metric_families(http(port, "/metrics")[1].decode()):
        for s in f.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return s.value
    return None


@pytest.mark.quiet  # its verdict reads timing (tests/quiet.py)
@pytest.mark.timeout(600)
def test_condition_events_and_taint_with_its_breaker_as_the_agents_own_account(cluster, tmp_path):  # noqa: F811
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    if len(cluster.nodes) < 3:
        missing_part(f"the test needs the test cluster with 3 nodes; it has {len(cluster.nodes)}")
    cluster.wait_ready()
    core = cluster.core()
    home, slow, busy = cluster.nodes[:3]
    sched = client.SchedulingV1Api(core.api_client)
    made_class, agent, prom = False, None, None
    log = tmp_path / "agent.log"
    t0 = time.monotonic()
    clean_nodes(core, cluster.nodes)
    try:
        try:
            sched.create_priority_class({"metadata": {"name": "gpuvs-trial"}, "value": -100,
                                         "preemptionPolicy": "Never", "description": "gpuvs's agent test"})
            made_class = True
        except ApiException as exc:
            assert exc.status == 409
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_service_account(NS, {"metadata": {"name": SA}})
        apply(core.api_client, objects(node_status=False))
        kubeconfig = sa_kubeconfig(cluster, core, tmp_path / "sa.kubeconfig")
        from kubernetes import config

        as_sa = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        body = {"status": {"conditions": [{"type": "GpuvsPerformance", "status": "Unknown", "reason": "Probe"}]}}
        with pytest.raises(ApiException) as refused:
            as_sa.patch_node_status(home, body)
        assert refused.value.status == 403
        kubectl = [str(BIN / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "auth", "can-i", "patch",
                   "nodes", "--subresource=status", f"--as=system:serviceaccount:{NS}:{SA}"]  # (nodes/status: a name)
        assert subprocess.run(kubectl, capture_output=True, text=True, timeout=30).stdout.strip() == "no"
        from gpuvs.kube import nodestatus

        said = nodestatus.write(as_sa, home, "Unknown", "Inconclusive", "probe")
        assert said.error == nodestatus.NOT_GRANTED  # one line, no exception
        apply(core.api_client, objects(node_status=True))
        wait_for(lambda: subprocess.run(kubectl, capture_output=True, text=True, timeout=30).stdout.strip() == "yes",
                 30, "nodes/status granted")
        # someone else's pod holds every GPU of `busy`, which carries gpuvs.io/slow from before
        core.create_namespaced_pod(NS, {"metadata": {"name": "busy"}, "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "nodeSelector": {"kubernetes.io/hostname": busy},
            "containers": [{"name": "c", "image": BUSY_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "600"],
                            "resources": {"limits": {"nvidia.com/gpu": str(cluster.gpus)}}}]}})
        wait_for(lambda: core.read_namespaced_pod("busy", NS).status.phase == "Running", 60, "busy running")
        set_slow_taint(core, busy, True)
        cluster.script("slow", slow, "40")
        port = free_port()
        (tmp_path / "token").write_text("signals-test-token")
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpuvs", "agent", "--kubeconfig", str(kubeconfig), "--namespace", NS, "--image",
             BUSY_IMAGE, "--image-pull-policy", "Never", "--pod-security", "baseline", "--validate", "false",
             "--workload", SPIN, "--trials", "4",
             "--max-trials", "12", "--parallel", "2", "--margin", "0.3", "--every", "1h", "--first-after", "1h",
             "--hold-timeout", "4", "--store", str(tmp_path / "gpuvs.db"), "--listen", f"127.0.0.1:{port}",
             "--token-file", str(tmp_path / "token"), "--min-interval", "10s", "--condition", "--taint",
             # PreferNoSchedule: nothing of anyone else's stops being scheduled meanwhile
             "--taint-effect", "PreferNoSchedule", "--taint-max-share", "0.1"],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=gpuvs_env(), cwd=tmp_path)
        wait_for(lambda: http(port, "/readyz")[0] == 200, 60, "the agent ready")
        prom, prom_port = prometheus_with_rules(tmp_path, f"127.0.0.1:{port}")

        def agent_run() -> dict:
            code, body = post_run(port, "signals-test-token")
            assert code == 202, body
            run_id = json.loads(body)["id"]
            done = wait_for(lambda: next((x for x in runs(port) if x["id"] == run_id
                                          and x["status"] not in ("queued", "running")), None), 240,
                            f"agent run {run_id} to end", step=1)
            assert done["status"] == "ok" and done["tested"] == sorted([home, slow]), (done, log.read_text()[-2000:])
            return done

        # 1: condition and Event; the breaker open (busy's taint is 1 of 3 GPU nodes, the most at 0.1)
        agent_run()
        c1 = condition(core, slow)
        assert c1["status"] == "True" and c1["reason"] == "SlowerThanPeers", c1
        assert re.match(r"slower: 0\.\d{3}x its peers \[0\.\d{3}-0\.\d{3}\]; workload spin, gpuvs run ", c1["message"])
        assert condition(core, home)["reason"] == "Ok" and condition(core, busy) is None
        kinds = {c.type for c in core.read_node(slow).status.conditions}
        assert {"Ready", "MemoryPressure", "GpuvsPerformance"} <= kinds  # the kubelet's conditions kept
        ev = gpuvs_events(core, slow)
        assert set(ev) == {"SlowerThanPeers"} and ev["SlowerThanPeers"].type == "Warning", ev
        assert ev["SlowerThanPeers"].reporting_component == "gpuvs.io/agent" and ev["SlowerThanPeers"].count == 1
        assert gpuvs_events(core, home) == {}  # Ok from the first verdict: nothing to say
        described = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "describe", "node",
                                    slow], capture_output=True, text=True, timeout=30).stdout
        assert re.search(r"GpuvsPerformance\s+True .*SlowerThanPeers", described), described
        assert re.search(r"Warning\s+SlowerThanPeers\s+.*gpuvs\s+slower: 0\.", described), described
        assert slow_taint(core, slow) == [] and slow_taint(core, busy) == [f"{SLOW}=true:PreferNoSchedule"]
        assert (f"taint {SLOW}=true:PreferNoSchedule on {slow}: refused: circuit breaker open: 1 of 3 GPU node(s) carry "
                f"{SLOW}, at most 1 (--taint-max-share 0.1)") in log.read_text()
        assert metric(port, "gpuvs_taint_circuit_open", workload="spin") == 1
        firing = wait_for(lambda: promql(prom_port, f'ALERTS{{alertname="GpuvsNodeSlow",alertstate="firing",'
                                                    f'node="{slow}"}}'), 60, "GpuvsNodeSlow firing in Prometheus")
        assert firing[0]["metric"]["workload"] == "spin"
        # 2: the busy node's taint gone: the slowed node is tainted; same reason: the transition kept, no new Event
        set_slow_taint(core, busy, False)
        agent_run()
        c2 = condition(core, slow)
        assert c2["reason"] == "SlowerThanPeers" and c2["transition"] == c1["transition"]
        assert c2["heartbeat"] > c1["heartbeat"]
        assert slow_taint(core, slow) == [f"{SLOW}=true:PreferNoSchedule"]
        assert metric(port, "gpuvs_taint_circuit_open", workload="spin") == 0
        assert gpuvs_events(core, slow)["SlowerThanPeers"].count == 1
        # 3: the node reads well again: untainted, its condition flips, a Normal Event says so
        cluster.script("slow", slow, "0")
        agent_run()
        c3 = condition(core, slow)
        assert c3["status"] == "False" and c3["reason"] == "Ok" and c3["transition"] > c1["transition"], c3
        assert slow_taint(core, slow) == []
        ev = gpuvs_events(core, slow)
        assert set(ev) == {"SlowerThanPeers", "Ok"} and ev["Ok"].type == "Normal"
        print(f"\n3 agent runs as the account of {NS}, {time.monotonic() - t0:.0f} s in all; {slow}: {c1['message']}")
    finally:
        cluster.script("slow", slow, "0")
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        if agent is not None:
            assert stop_process(agent, 60) == 0, log.read_text()[-2000:]
        clean_nodes(core, cluster.nodes)
        apply(core.api_client, objects(True) + objects(False), delete=True)
        try:
            core.delete_namespace(NS, grace_period_seconds=0)
        except ApiException as exc:
            assert exc.status == 404
        if made_class:
            sched.delete_priority_class("gpuvs-trial")
