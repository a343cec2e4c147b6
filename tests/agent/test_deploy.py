"""deploy/ (docs/deploy.md): the manifests parse, use only APIs of Kubernetes 1.20 and current releases, run restricted.

On the real test cluster they are applied through the Python client and with `kubectl apply -k`.
The ServiceAccount's token is allowed what the agent needs and refused the rest; gpuvs's image runs as its pod.
Everything the tests create, cluster-scoped objects included, is removed on success and failure."""

from __future__ import annotations

import base64
import functools
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
from cluster import BIN, cluster, k8s_build  # noqa: F401  (the session fixture)
from pss import violations

import gpuvs
import conftest
from conftest import ROOT, missing_part

DEPLOY = ROOT / "deploy"
NS = "gpuvs-system"
SA = "gpuvs-agent"
IMAGE_TAG = f"localhost/gpuvs:{gpuvs.__version__}"
TEST_IMAGE = "localhost/gpuvs-python:test"  # scripts/test-cluster's, with busybox's sh: for the RBAC probes
LOWEST = "gpuvs-test-lowest"  # a PriorityClass below the trial pods', made and removed by the preemption test
PV = f"gpuvs-deploy-test-{os.getpid()}"
STORE_DIR = Path(f"/tmp/{PV}")
CONVENTION = ("app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/component",
              "app.kubernetes.io/version")
# (apiVersion, kind) served by Kubernetes 1.20 and by current releases alike (all GA, none deprecated)
STABLE = {("v1", "Namespace"), ("v1", "ServiceAccount"), ("v1", "Service"), ("v1", "PersistentVolumeClaim"),
          ("apps/v1", "Deployment"), ("rbac.authorization.k8s.io/v1", "ClusterRole"),
          ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ("rbac.authorization.k8s.io/v1", "Role"),
          ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("scheduling.k8s.io/v1", "PriorityClass"),
          ("networking.k8s.io/v1", "NetworkPolicy")}


def kustomization() -> dict:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def manifests() -> list[dict]:
    """Every object of deploy/, in the kustomization's order."""
    out = []
    for name in kustomization()["resources"]:
        docs = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
        assert len(docs) == 1, f"{name}: one object per file"
        out.append(docs[0])
    return out


def by_kind(kind: str) -> dict:
    return next(m for m in manifests() if m["kind"] == kind)


# -- the manifests, no cluster needed --------------------------------------------------------------------------

def test_the_kustomization_lists_every_manifest_and_each_parses():
    k = kustomization()
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    files = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(k["resources"]) == files and len(set(k["resources"])) == len(files)
    kinds = [m["kind"] for m in manifests()]
    assert sorted(kinds) == sorted(["Namespace", "PriorityClass", "ServiceAccount", "ClusterRole",
                                    "ClusterRoleBinding", "Role", "RoleBinding", "PersistentVolumeClaim",
                                    "Deployment", "Service", "NetworkPolicy"])
    assert kinds[0] == "Namespace"  # created one by one in this order, the namespace comes first
    assert set(k) == {"apiVersion", "kind", "resources"}  # nothing kubectl 1.20's kustomize (v2.0.3) may not know


def test_only_apis_of_1_20_and_current_releases_with_fields_the_current_api_knows():
    """Every (apiVersion, kind) is GA on 1.20 and today; and every field exists in the current API: the current
    client's models (kubernetes 37 for Kubernetes 1.33-era APIs) drop unknown fields, so a round trip that loses
    nothing shows each one is known. (The 1.20 server validates them too when kubectl applies them, below.)"""
    from kubernetes import client

    api = client.ApiClient()
    for m in manifests():
        assert (m["apiVersion"], m["kind"]) in STABLE, f"{m['kind']} {m['apiVersion']}"
        # the client's own deserializer (its public deserialize() takes a response, differently across versions)
        back = api.sanitize_for_serialization(api._ApiClient__deserialize(m, "V1" + m["kind"]))
        assert back == m, f"{m['kind']}: fields lost in the current API's model: {m} != {back}"


def test_labels_follow_the_conventions_and_the_version_is_gpuvss():
    for m in manifests():
        labels = m["metadata"]["labels"]
        assert all(labels.get(k) for k in CONVENTION), (m["kind"], labels)
        assert labels["app.kubernetes.io/name"] == labels["app.kubernetes.io/part-of"] == "gpuvs"
        assert labels["app.kubernetes.io/version"] == gpuvs.__version__
        if m["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"):
            assert m["metadata"]["namespace"] == NS, m["kind"]
    d = by_kind("Deployment")
    selector = d["spec"]["selector"]["matchLabels"]
    assert "app.kubernetes.io/version" not in selector  # immutable: an upgrade must not need a new Deployment
    assert selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    assert by_kind("Service")["spec"]["selector"] == selector
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == IMAGE_TAG and c["command"] == ["gpuvs", "agent"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert by_kind("Service")["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]


def test_the_agents_pod_meets_the_restricted_pod_security_standard():
    spec = by_kind("Deployment")["spec"]["template"]["spec"]
    assert violations(spec, "restricted") == []
    sc, c = spec["securityContext"], spec["containers"][0]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001 and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert volumes[mounts["/var/lib/gpuvs"]]["persistentVolumeClaim"]["claimName"] == by_kind(
        "PersistentVolumeClaim")["metadata"]["name"]
    # the check itself can fail: each rule broken once is caught
    for broken, rule in ((lambda s: s["securityContext"].update(runAsUser=0), "runAsUser 0"),
                         (lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
                          "allowPrivilegeEscalation"),
                         (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(drop=[]), "ALL"),
                         (lambda s: s["securityContext"].pop("seccompProfile"), "seccompProfile"),
                         (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath")):
        s = yaml.safe_load(yaml.safe_dump(spec))
        broken(s)
        assert any(rule in v for v in violations(s, "restricted")), rule


def test_validate_and_the_agent_default_to_the_restricted_level_the_deployment_passes():
    """`gpuvs agent` and `gpuvs validate` without --pod-security hold their pods to the restricted standard, as
    deploy/'s Deployment asks (before: baseline); the agent's fleet pods and hold pods and its validate follow it.
    baseline stays for an image whose user is root."""
    from gpuvs.agent import idle
    from gpuvs.agent.config import AgentConfig
    from gpuvs.agent.ledger import RunRecord
    from gpuvs.agent.runs import fleet_request
    from gpuvs.cli.commands import agent as agent_cmd
    from gpuvs.cli.commands import validate as validate_cmd
    from gpuvs.cli.parser import parse
    from gpuvs.environments import pod
    from gpuvs.agent.config import WorkloadSpec

    assert parse(agent_cmd.COMMAND, [], "gpuvs agent")["pod_security"] == "restricted"
    assert parse(validate_cmd.COMMAND, ["--image", "i"], "gpuvs validate")["pod_security"] == "restricted"
    assert parse(agent_cmd.COMMAND, ["--pod-security", "baseline"], "gpuvs agent")["pod_security"] == "baseline"
    args = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--pod-security") + 1] == AgentConfig().pod_security == "restricted"
    base, o = fleet_request(AgentConfig(store="a.db"), RunRecord("r1", "api"), "ns", IMAGE_TAG, ["n1", "n2"],
                            WorkloadSpec.parse("spin"))
    assert "--pod-security restricted" in o.command
    trial = pod.manifest(base, pod.parse_options(base.env.options))
    assert trial["spec"]["securityContext"]["runAsNonRoot"] is True and violations(trial["spec"], "restricted") == []
    hold = idle.hold_manifest(idle.Hold("n1", 2, "h"), run_id="r1", image=IMAGE_TAG, python="python3",
                              resource="nvidia.com/gpu", priority_class="gpuvs-trial", pull_policy="Never",
                              restricted=AgentConfig().pod_security == "restricted")
    assert violations(hold["spec"], "restricted") == []


def test_rbac_is_least_privilege_as_written():
    assert by_kind("ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                                "verbs": ["get", "list", "watch", "patch"]}]
    rules = {r["resources"][0]: set(r["verbs"]) for r in by_kind("Role")["rules"]}
    assert all(r["apiGroups"] == [""] and len(r["resources"]) == 1 for r in by_kind("Role")["rules"])
    assert rules == {"pods": {"create", "delete", "get", "list", "watch"}, "pods/log": {"get"},
                     "pods/exec": {"create", "get"}, "configmaps": {"create", "patch", "delete"},
                     "events": {"list", "watch"}}
    for binding in (by_kind("ClusterRoleBinding"), by_kind("RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    pc = by_kind("PriorityClass")
    assert pc["value"] < 0 and not pc.get("globalDefault") and pc["preemptionPolicy"] == "Never"


def test_the_network_policy_admits_only_the_agents_http_port_from_labelled_namespaces():
    np, d = by_kind("NetworkPolicy"), by_kind("Deployment")
    spec = np["spec"]
    assert spec["podSelector"] == {"matchLabels": d["spec"]["selector"]["matchLabels"]}  # the agent's pod, no other
    assert spec["policyTypes"] == ["Ingress"]  # its way out (the API server) is not restricted
    assert spec["ingress"] == [{"from": [{"namespaceSelector": {"matchLabels": {"gpuvs.io/agent-access": "true"}}}],
                                "ports": [{"protocol": "TCP", "port": "http"}]}]
    port = d["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert port["name"] == "http" and port["containerPort"] == 8080 and port["protocol"] == "TCP"
    assert by_kind("Service")["spec"]["ports"][0]["targetPort"] == "http"


NODE_GUARD = DEPLOY / "node-guard"
AGENT_USER = f"system:serviceaccount:{NS}:{SA}"


def node_guard() -> dict[str, dict]:
    k = yaml.safe_load((NODE_GUARD / "kustomization.yaml").read_text())
    assert set(k) == {"apiVersion", "kind", "resources"}
    return {m["kind"]: m for name in k["resources"] for m in yaml.safe_load_all((NODE_GUARD / name).read_text())}


def guard(policy: dict, user: str, old: dict, new: dict) -> list[str] | None:
    """The policy's CEL, evaluated by cel-python as the API server (1.30+) would for an UPDATE of node `old` to
    `new` by `user`: None when the user is not judged (matchConditions), else the messages of the validations
    that fail ([]: admitted)."""
    import celpy

    env = celpy.Environment()
    act = {"request": celpy.json_to_cel({"userInfo": {"username": user}, "operation": "UPDATE"}),
           "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}

    def true(expr: str) -> bool:
        got = env.program(env.compile(expr)).evaluate(act)
        assert isinstance(got, celpy.celtypes.BoolType), f"{expr}: {got!r}"
        return bool(got)

    if not all(true(c["expression"]) for c in policy["spec"]["matchConditions"]):
        return None
    return [v["message"] for v in policy["spec"]["validations"] if not true(v["expression"])]


def test_the_node_guard_lets_the_agent_change_only_gpuvs_labels_and_annotations():
    """deploy/node-guard (opt-in; Kubernetes 1.30+, which the 1.20 test cluster is not): its structure, and each
    CEL expression evaluated (cel-python) on the node changes the agent makes, which pass, and on the ones RBAC's
    `patch` would let through, which are refused. Other users are not judged."""
    objs = node_guard()
    assert set(objs) == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    policy, binding = objs["ValidatingAdmissionPolicy"], objs["ValidatingAdmissionPolicyBinding"]
    assert {m["apiVersion"] for m in objs.values()} == {"admissionregistration.k8s.io/v1"}
    for m in objs.values():
        assert m["metadata"]["labels"]["app.kubernetes.io/version"] == gpuvs.__version__
        assert "namespace" not in m["metadata"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"] == {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                           "operations": ["UPDATE"], "resources": ["nodes"]}]}
    assert [c["expression"] for c in spec["matchConditions"]] == [f"request.userInfo.username == '{AGENT_USER}'"]
    assert by_kind("ClusterRoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    assert all(v["expression"] and v["message"] and v["reason"] == "Forbidden" for v in spec["validations"])

    node = {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "gpuvs.io/perf": "ok"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": "10.244.1.0/24"}}

    def changed(fn) -> dict:
        n = yaml.safe_load(yaml.safe_dump(node))
        fn(n)
        return n

    allowed = {
        "gpuvs.io/testing added": lambda n: n["metadata"]["labels"].update({"gpuvs.io/testing": "true"}),
        "gpuvs.io/perf changed": lambda n: n["metadata"]["labels"].update({"gpuvs.io/perf": "slow"}),
        "gpuvs.io/perf removed": lambda n: n["metadata"]["labels"].pop("gpuvs.io/perf"),
        "gpuvs.io/perf-details annotated": lambda n: n["metadata"]["annotations"].update({"gpuvs.io/perf-details": "{}"}),
        "no change": lambda n: None,
        "gpuvs.io/slow tainted": lambda n: n["spec"].update(
            {"taints": [{"key": "gpuvs.io/slow", "value": "true", "effect": "NoSchedule"}]}),
        # the most one patch of gpuvs's adds: --per-gpu's three labels and the details (fleet/cluster/node_labels.py)
        "a --per-gpu verdict": lambda n: (n["metadata"]["labels"].update(
            {"gpuvs.io/perf": "slower", "gpuvs.io/perf-ratio": "0.5", "gpuvs.io/slow-gpus": "1"}),
            n["metadata"]["annotations"].update({"gpuvs.io/perf-details": "{}"})),
    }
    for what, fn in allowed.items():
        assert guard(policy, AGENT_USER, node, changed(fn)) == [], what
    no_labels = {"metadata": {"name": "n1"}, "spec": {}}
    marked = {"metadata": {"name": "n1", "labels": {"gpuvs.io/testing": "true"}}, "spec": {}}
    assert guard(policy, AGENT_USER, no_labels, marked) == []  # a node without labels before
    assert guard(policy, AGENT_USER, marked, no_labels) == []
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    slow = {"key": "gpuvs.io/slow", "value": "true", "effect": "PreferNoSchedule"}
    tainted = changed(lambda n: n["spec"].update({"taints": [other, slow]}))
    untainted = changed(lambda n: n["spec"].update({"taints": [other]}))
    assert guard(policy, AGENT_USER, tainted, untainted) == []  # its own taint off, the other kept
    assert guard(policy, AGENT_USER, untainted, tainted) == []
    # a NoExecute gpuvs.io/slow someone else put there is not the agent's change: its label patches pass
    evicting = changed(lambda n: n["spec"].update({"taints": [{**slow, "effect": "NoExecute"}]}))
    relabelled = yaml.safe_load(yaml.safe_dump(evicting))
    relabelled["metadata"]["labels"]["gpuvs.io/perf"] = "slower"
    assert guard(policy, AGENT_USER, evicting, relabelled) == []
    # the effect raised from PreferNoSchedule to NoExecute is refused
    assert any("NoExecute" in m for m in guard(policy, AGENT_USER, tainted, changed(lambda n: n["spec"].update(
        {"taints": [other, {**slow, "effect": "NoExecute"}]}))))
    removed = guard(policy, AGENT_USER, tainted, changed(lambda n: n["spec"].update({"taints": [slow]})))
    assert len(removed) == 1 and "spec" in removed[0], removed  # another's taint removed
    refused = {
        "another label added": (lambda n: n["metadata"]["labels"].update({"node-role.kubernetes.io/gpu": ""}), "labels"),
        "another label changed": (lambda n: n["metadata"]["labels"].update({"kubernetes.io/hostname": "x"}), "labels"),
        "another label removed": (lambda n: n["metadata"]["labels"].pop("kubernetes.io/hostname"), "labels"),
        "a look-alike prefix": (lambda n: n["metadata"]["labels"].update({"gpuvs.io.evil/x": "1"}), "labels"),
        "another annotation": (lambda n: n["metadata"]["annotations"].update({"x": "1"}), "annotations"),
        "annotation removed": (lambda n: n["metadata"]["annotations"].clear(), "annotations"),
        "cordoned": (lambda n: n["spec"].update({"unschedulable": True}), "spec"),
        "tainted": (lambda n: n["spec"].update({"taints": [{"key": "k", "effect": "NoSchedule"}]}), "spec"),
        "a look-alike taint": (lambda n: n["spec"].update({"taints": [{"key": "gpuvs.io/slower", "effect": "NoSchedule"}]}),
                               "spec"),
        "gpuvs.io/slow NoExecute": (lambda n: n["spec"].update(
            {"taints": [{"key": "gpuvs.io/slow", "value": "true", "effect": "NoExecute"}]}), "NoExecute"),
        "5 gpuvs.io/ labels added": (lambda n: n["metadata"]["labels"].update(
            {f"gpuvs.io/x{i}": "1" for i in range(5)}), "at most 4"),
        "3 labels and 2 annotations added": (lambda n: (n["metadata"]["labels"].update(
            {f"gpuvs.io/x{i}": "1" for i in range(3)}), n["metadata"]["annotations"].update(
            {f"gpuvs.io/y{i}": "1" for i in range(2)})), "at most 4"),
        "a finalizer": (lambda n: n["metadata"].update({"finalizers": ["x/y"]}), "finalizers"),
        "an owner": (lambda n: n["metadata"].update({"ownerReferences": [{"kind": "X", "name": "y"}]}), "owner"),
    }
    for what, (fn, says) in refused.items():
        got = guard(policy, AGENT_USER, node, changed(fn))
        assert got is not None and len(got) == 1 and says in got[0], (what, got)
    # anyone else is not judged: an admin cordons a node, which the agent may not
    cordoned = changed(lambda n: n["spec"].update(unschedulable=True))
    assert guard(policy, "kubernetes-admin", node, cordoned) is None
    assert len(guard(policy, AGENT_USER, node, cordoned)) == 1


def kubectls() -> list[tuple[str, str]]:
    """(path, version) of kubectl 1.20 (scripts/test-cluster build unpacks it) and of a current kubectl on PATH."""
    out = []
    for path in (BIN / "kubectl", shutil.which("kubectl")):
        if path and Path(path).exists():
            r = subprocess.run([str(path), "version", "--client", "-o", "json"], capture_output=True, text=True)
            if r.returncode == 0:
                v = json.loads(r.stdout)["clientVersion"]
                out.append((str(path), f"{v['major']}.{v['minor'].rstrip('+')}"))
    return out


def test_kubectl_kustomize_reads_it_on_1_20_and_on_a_current_kubectl(k8s_build):
    """kubectl 1.20's kustomize (v2.0.3) and a current one read deploy/ into exactly the manifests. kubectl 1.20 is
    the test cluster's (missing: fails under CI). A current kubectl cannot be installed on CI's machine (no
    registry there has one): its part runs where one is on PATH, and the current API's fields are checked above
    through the current client's models in any case."""
    found = dict((v, p) for p, v in kubectls())
    if "1.20" not in found:
        missing_part(f"kubectl 1.20 is not in {BIN}: run scripts/test-cluster build (it unpacks Debian's)")
    want = sorted((json.dumps(m, sort_keys=True) for m in manifests()))
    for v, path in sorted(found.items()):
        r = subprocess.run([path, "kustomize", str(DEPLOY)], capture_output=True, text=True)
        assert r.returncode == 0, f"kubectl {v}: {r.stderr}"
        got = sorted(json.dumps(d, sort_keys=True) for d in yaml.safe_load_all(r.stdout) if d)
        assert got == want, f"kubectl {v} kustomize changed the objects"


OVERLAY = ROOT / "overlays" / "test-cluster"
OVERLAY_PV = "gpuvs-agent-store"
OVERLAY_PORT = 18080


def dry_run(*args: str, cwd=None) -> list[dict]:
    """`gpuvs deploy --dry-run ARGS`'s objects, without the annotation that remembers an overlay."""
    from conftest import run_cli

    r = run_cli("deploy", "--dry-run", *args, cwd=cwd)
    assert r.returncode == 0, r.stderr
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    for d in objs:
        notes = d["metadata"].get("annotations") or {}
        notes.pop("gpuvs.io/overlay", None)
        if "annotations" in d["metadata"] and not notes:
            del d["metadata"]["annotations"]
    return objs


def test_the_test_clusters_overlay_is_read_alike_by_gpuvs_and_by_kubectl_kustomize(k8s_build):
    """overlays/test-cluster, as `gpuvs deploy --overlay` builds it, is what kubectl 1.20's kustomize (and a
    current one where installed) builds: deploy/ with a local volume for the store's claim on the first node, in
    the folder scripts/test-cluster up makes, and the agent's pod on the host's network with the API server's
    address, listening on the port its probes use."""
    from cluster import STATE

    ours = dry_run("--overlay", str(OVERLAY))
    assert len(ours) == len(manifests()) + 1
    pv = next(m for m in ours if m["kind"] == "PersistentVolume")
    assert pv["metadata"]["name"] == OVERLAY_PV and pv["spec"]["local"]["path"] == str(STATE / "agent-store")
    assert pv["spec"]["claimRef"] == {"namespace": NS, "name": by_kind("PersistentVolumeClaim")["metadata"]["name"]}
    spec = next(m for m in ours if m["kind"] == "Deployment")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    assert c["ports"][0] == {"name": "http", "containerPort": OVERLAY_PORT, "protocol": "TCP"}
    assert c["args"][-2:] == ["--listen", f":{OVERLAY_PORT}"] and c["livenessProbe"]["httpGet"]["port"] == "http"
    assert violations(spec, "restricted") == ["hostNetwork: true"]  # what the overlay costs, on the test cluster
    found = dict((v, p) for p, v in kubectls())
    want = sorted(json.dumps(m, sort_keys=True) for m in ours)
    for v, path in sorted(found.items()):
        r = subprocess.run([path, "kustomize", str(OVERLAY)], capture_output=True, text=True)
        assert r.returncode == 0, f"kubectl {v}: {r.stderr}"
        got = sorted(json.dumps(d, sort_keys=True) for d in yaml.safe_load_all(r.stdout) if d)
        assert got == want, f"kubectl {v} kustomize built another overlay"
    if "1.20" not in found:
        missing_part(f"kubectl 1.20 is not in {BIN}: run scripts/test-cluster build (it unpacks Debian's)")


def test_an_overlay_gpuvs_cannot_read_alike_is_one_line(tmp_path):
    """A field gpuvs deploy does not read, a base that is not deploy/, a patch naming no object or not applying:
    one line each, exit 2, nothing printed."""
    from conftest import run_cli

    def overlay(name: str, kustomization: dict, patch: list | None = None) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        if patch is not None:
            (d / "p.yaml").write_text(yaml.safe_dump(patch))
        return d

    base = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "bases": [str(DEPLOY)]}
    agent = {"group": "apps", "version": "v1", "kind": "Deployment", "name": "gpuvs-agent", "namespace": NS}
    cases = {
        overlay("prefix", {**base, "namePrefix": "x-"}): "namePrefix not read by gpuvs deploy",
        overlay("other", {**base, "bases": [str(NODE_GUARD)]}): "is not gpuvs's deploy/",
        overlay("nobase", {"resources": []}): "its base must be deploy/",
        overlay("target", {**base, "patchesJson6902": [{"target": {**agent, "name": "x"}, "path": "p.yaml"}]},
                [{"op": "add", "path": "/spec/x", "value": 1}]): "its patch of Deployment/x names no object",
        overlay("apply", {**base, "patchesJson6902": [{"target": agent, "path": "p.yaml"}]},
                [{"op": "replace", "path": "/spec/nothing/here", "value": 1}]): "its patch of Deployment/gpuvs-agent "
                                                                                 "does not apply",
        tmp_path / "missing": "no such folder",
    }
    for path, says in cases.items():
        r = run_cli("deploy", "--dry-run", "--overlay", path)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and says in r.stderr, \
            (path.name, r.stderr)
    # the same patch applied: what kustomize would do
    ok = overlay("ok", {**base, "patchesJson6902": [{"target": agent, "path": "p.yaml"}]},
                 [{"op": "add", "path": "/spec/template/spec/hostNetwork", "value": True},
                  {"op": "test", "path": "/spec/replicas", "value": 1}])
    (d,) = [m for m in dry_run("--overlay", str(ok)) if m["kind"] == "Deployment"]
    assert d["spec"]["template"]["spec"]["hostNetwork"] is True


# -- on the test cluster -----------------------------------------------------------------------------------------

def api_client(cluster, token: str | None = None):  # noqa: F811
    """An ApiClient on the test cluster: the admin's, or a bearer token's."""
    from kubernetes import client, config

    if token is None:
        return config.new_client_from_config(config_file=str(cluster.kubeconfig))
    admin = client.Configuration()
    config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=admin)
    cfg = client.Configuration(host=admin.host)
    cfg.ssl_ca_cert = admin.ssl_ca_cert
    # the key's name differs across client versions ("authorization", later "BearerToken"): both, and no refresh
    cfg.api_key = {"authorization": f"Bearer {token}", "BearerToken": f"Bearer {token}"}
    return client.ApiClient(cfg)


def resource(dyn, m: dict):
    return dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])


def gone(fn) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        fn()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def remove_everything(cluster) -> None:  # noqa: F811
    """Delete what deploy/ and these tests make, cluster-scoped objects included, and wait until it is gone."""
    from kubernetes.dynamic import DynamicClient

    shutil.rmtree(STORE_DIR, ignore_errors=True)  # first: whatever the API says below
    dyn = DynamicClient(api_client(cluster))
    targets = [m for m in manifests() if "namespace" not in m["metadata"]]  # the namespace takes the rest with it
    targets += [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": LOWEST}},
                {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": OVERLAY_PV}},
                {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": PV}}]
    deadline = time.monotonic() + 240
    for m in targets:
        r = resource(dyn, m)
        gone(lambda: r.delete(name=m["metadata"]["name"]))
    while time.monotonic() < deadline:
        left = [m["metadata"]["name"] for m in targets
                if not gone(lambda m=m: resource(dyn, m).get(name=m["metadata"]["name"]))]
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"still there after 240 s: {left}"


@pytest.fixture(scope="module")
def clean(cluster):  # noqa: F811
    """The cluster without anything of deploy/ before, and after, the module's tests (on failure too)."""
    remove_everything(cluster)
    try:
        yield cluster
    finally:
        remove_everything(cluster)


def read_back(cluster) -> dict[str, dict]:  # noqa: F811
    """Each manifest's object as the API now has it (kind/name -> object)."""
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api_client(cluster))
    out = {}
    for m in manifests():
        md = m["metadata"]
        out[f"{m['kind']}/{md['name']}"] = resource(dyn, m).get(name=md["name"], namespace=md.get("namespace")).to_dict()
    return out


def assert_deployed(cluster) -> None:  # noqa: F811
    objs = read_back(cluster)
    assert len(objs) == len(manifests())
    for m in manifests():
        got = objs[f"{m['kind']}/{m['metadata']['name']}"]
        assert m["metadata"]["labels"].items() <= got["metadata"]["labels"].items()
    assert objs["ClusterRole/gpuvs-agent"]["rules"] == by_kind("ClusterRole")["rules"]
    pc = objs["PriorityClass/gpuvs-trial"]
    assert pc["value"] == -100 and pc["preemptionPolicy"] == "Never"
    tmpl = objs["Deployment/gpuvs-agent"]["spec"]["template"]["spec"]
    assert tmpl["securityContext"] == by_kind("Deployment")["spec"]["template"]["spec"]["securityContext"]


@pytest.mark.cluster
def test_the_python_client_creates_every_object(clean):
    from kubernetes import utils

    api = api_client(clean)
    for m in manifests():
        utils.create_from_dict(api, m)
    assert_deployed(clean)
    remove_everything(clean)


NODE_STATUS_RBAC = (("ClusterRole", "gpuvs-agent-node-status", None),
                    ("ClusterRoleBinding", "gpuvs-agent-node-status", None),
                    ("Role", "gpuvs-agent-node-events", "default"), ("RoleBinding", "gpuvs-agent-node-events", "default"))


def write_gpuvs_marks(cluster) -> None:  # noqa: F811
    """What a deployed agent leaves on nodes, written by gpuvs's own writers: a slower node's labels, details,
    taint and True condition on the first node, drift labels and gpuvs.io/testing on the second."""
    from gpuvs.agent import idle
    from gpuvs.fleet.cluster import node_labels as labels
    from gpuvs.fleet.cluster import taints
    from gpuvs.kube import nodestatus
    from gpuvs.kube.client import connect

    gpuvs_cluster = connect(str(cluster.kubeconfig))
    core = gpuvs_cluster.core
    slow, other = cluster.nodes[:2]
    assert labels.apply(core, [
        labels.LabelChange(slow, {labels.PERF: "slower", labels.RATIO: "0.512"}, {labels.DETAILS: '{"speed": 0.512}'}),
        labels.LabelChange(other, {labels.DRIFT: "equivalent", labels.DRIFT_RATIO: "0.990"},
                           {labels.DRIFT_DETAILS: "{}"})]) == [(slow, None), (other, None)]
    assert taints.set_taint(core, slow, "NoSchedule") is None
    assert nodestatus.write(core, slow, "True", "SlowerThanPeers", "slower: 0.512x its peers").error is None
    idle.mark(gpuvs_cluster, other)


def gpuvs_marks(cluster) -> dict[str, list[str]]:  # noqa: F811
    """Every node's gpuvs.io/ labels and annotations, gpuvs.io/slow taint and GpuvsPerformance condition."""
    from kubernetes import client

    out = {}
    for n in client.CoreV1Api(api_client(cluster)).list_node().items:
        keys = [f"label {k}" for k in n.metadata.labels or {} if k.startswith("gpuvs.io/")]
        keys += [f"annotation {k}" for k in n.metadata.annotations or {} if k.startswith("gpuvs.io/")]
        keys += [f"taint {t.key}:{t.effect}" for t in n.spec.taints or [] if t.key == "gpuvs.io/slow"]
        keys += [f"condition {c.type} {c.status} {c.reason}" for c in n.status.conditions or []
                 if c.type == "GpuvsPerformance"]
        assert any(c.type == "Ready" for c in n.status.conditions)  # the kubelet's conditions are never touched
        out[n.metadata.name] = sorted(keys)
    return out


@pytest.mark.cluster
def test_deploy_delete_takes_off_every_label_annotation_taint_and_condition_gpuvs_wrote(clean):
    """`gpuvs deploy --condition`, then the marks a deployed agent leaves (labels, details, the taint, the True
    condition, gpuvs.io/testing) put on two nodes by gpuvs's own writers. `--delete --keep-labels` takes off
    the taint, the condition and gpuvs.io/testing and says which labels it kept; `--delete` then takes off the
    rest, and removes deploy/node-status's RBAC too. Before: every mark but gpuvs.io/testing stayed."""
    from kubernetes.dynamic import DynamicClient

    from conftest import run_cli

    kc = str(clean.kubeconfig)
    slow, other = clean.nodes[:2]
    clear_marks(clean)  # an earlier test's fleet may have labelled the nodes (its results, kept on purpose)
    try:
        r = run_cli("deploy", "--condition", "--kubeconfig", kc, timeout=120)
        assert r.returncode == 0, r.stderr
        write_gpuvs_marks(clean)
        before = gpuvs_marks(clean)
        assert before[slow] == ["annotation gpuvs.io/perf-details", "condition GpuvsPerformance True SlowerThanPeers",
                                "label gpuvs.io/perf", "label gpuvs.io/perf-ratio", "taint gpuvs.io/slow:NoSchedule"]
        assert before[other] == ["annotation gpuvs.io/drift-details", "label gpuvs.io/drift",
                                 "label gpuvs.io/drift-ratio", "label gpuvs.io/testing"]
        r = run_cli("deploy", "--delete", "--keep-labels", "--kubeconfig", kc, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert f"Node/{slow} gpuvs.io/perf, gpuvs.io/perf-ratio, gpuvs.io/perf-details kept (--keep-labels)" in lines
        assert f"Node/{slow} taint gpuvs.io/slow removed" in lines and \
            f"Node/{slow} condition GpuvsPerformance removed" in lines, r.stdout
        assert f"Node/{other} gpuvs.io/testing removed (left by the agent)" in lines, r.stdout
        after = gpuvs_marks(clean)
        assert after[slow] == ["annotation gpuvs.io/perf-details", "label gpuvs.io/perf", "label gpuvs.io/perf-ratio"]
        assert after[other] == ["annotation gpuvs.io/drift-details", "label gpuvs.io/drift",
                                "label gpuvs.io/drift-ratio"]
        dyn = DynamicClient(api_client(clean))
        for kind, name, ns in NODE_STATUS_RBAC:
            r_ = dyn.resources.get(api_version="rbac.authorization.k8s.io/v1", kind=kind)
            assert gone(lambda: r_.get(name=name, namespace=ns)), f"{kind}/{name} left"
        r = run_cli("deploy", "--delete", "--kubeconfig", kc, timeout=180)  # nothing deployed now: the nodes alone
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"Node/{other} gpuvs.io/drift, gpuvs.io/drift-ratio, gpuvs.io/drift-details removed" in r.stdout
        assert all(keys == [] for keys in gpuvs_marks(clean).values()), gpuvs_marks(clean)
        assert "kept" not in r.stdout, r.stdout
    finally:
        undeploy(clean)


def undeploy(clean) -> None:
    """Whatever a test left of gpuvs on the cluster: the nodes' marks, the node-status RBAC, deploy/'s objects."""
    from kubernetes.dynamic import DynamicClient

    clear_marks(clean)
    dyn = DynamicClient(api_client(clean))
    for kind, name, ns in NODE_STATUS_RBAC:
        gone(lambda: dyn.resources.get(api_version="rbac.authorization.k8s.io/v1", kind=kind).delete(
            name=name, namespace=ns))
    remove_everything(clean)


def uninstall_block() -> list[str]:
    """docs/deploy-uninstall.md's kubectl uninstall sequence, one command a line."""
    text = (ROOT / "docs" / "deploy-uninstall.md").read_text()
    block = text[text.index("```bash\n", text.index("## Remove it with kubectl")) + 8:]
    return [line for line in block[:block.index("```")].splitlines() if line.strip()]


@pytest.mark.cluster
def test_the_documented_kubectl_uninstall_leaves_no_mark_and_no_node_status_rbac(clean):
    """docs/deploy-uninstall.md's kubectl sequence, run line by line with kubectl 1.20 after `gpuvs deploy --condition`
    and the marks an agent leaves: no gpuvs.io/ label or annotation, taint or condition is left, and neither is
    deploy/node-status's RBAC (before: its ClusterRole, ClusterRoleBinding, Role and RoleBinding stayed, with
    every mark but gpuvs.io/testing). kubectl 1.20 cannot patch a node's status (--subresource is 1.24's): that
    line's patch is sent through the client, as kubectl 1.24 would send it."""
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    from conftest import run_cli

    kubectl = BIN / "kubectl"
    if not kubectl.exists():
        missing_part(f"kubectl 1.20 is not in {BIN}: run scripts/test-cluster build (it unpacks Debian's)")
    lines = uninstall_block()
    assert any("node-status" in line for line in lines) and lines[-1].startswith("kubectl delete -k deploy/ ")
    env = dict(os.environ, KUBECONFIG=str(clean.kubeconfig), PATH=f"{BIN}:{os.environ['PATH']}")
    core = client.CoreV1Api(api_client(clean))
    try:
        r = run_cli("deploy", "--condition", "--kubeconfig", clean.kubeconfig, timeout=120)
        assert r.returncode == 0, r.stderr
        write_gpuvs_marks(clean)
        assert any(gpuvs_marks(clean).values())
        for line in lines:
            if "--subresource=status" in line:
                body = json.loads(line.split(" -p '")[1].split("'")[0])
                for n in core.list_node().items:
                    core.patch_node_status(n.metadata.name, body)
                continue
            r = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
            # kubectl taint untaints each node that has the taint and exits 1 naming each that had not (docs say so)
            untainted = line.startswith("kubectl taint") and set(r.stderr.splitlines()) == {
                'taint "gpuvs.io/slow" not found'}
            assert r.returncode == 0 or untainted, (line, r.stdout, r.stderr)
        assert all(keys == [] for keys in gpuvs_marks(clean).values()), gpuvs_marks(clean)
        dyn = DynamicClient(api_client(clean))
        for kind, name, ns in NODE_STATUS_RBAC:
            res = dyn.resources.get(api_version="rbac.authorization.k8s.io/v1", kind=kind)
            assert gone(lambda: res.get(name=name, namespace=ns)), f"{kind}/{name} left"
    finally:
        undeploy(clean)


def agent_http(path: str) -> tuple[int, dict]:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{OVERLAY_PORT}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except OSError:
        return 0, {}


def rolled_out(apps, generation_before: int | None = None):
    """The agent's Deployment once its one pod of the current template is ready (a newer generation than the one
    given)."""
    d = apps.read_namespaced_deployment("gpuvs-agent", NS)
    st = d.status
    if generation_before is not None and d.metadata.generation <= generation_before:
        return None
    done = (st.observed_generation == d.metadata.generation and st.updated_replicas == 1 and st.ready_replicas == 1
            and (st.replicas or 0) == 1)
    return d if done else None


REACH_API = ("from kubernetes import client, config; config.load_incluster_config(); "
             "print('reached', client.VersionApi().get_code().git_version)")


def agent_reaches_the_api(core) -> str:
    """What the agent's own pod gets from the API server through its in-cluster configuration (its ServiceAccount,
    KUBERNETES_SERVICE_HOST/_PORT), asked inside its container."""
    from kubernetes.stream import stream

    selector = ",".join(f"{k}={v}" for k, v in by_kind("Deployment")["spec"]["selector"]["matchLabels"].items())
    pods = [p for p in core.list_namespaced_pod(NS, label_selector=selector).items
            if p.metadata.deletion_timestamp is None and p.status.phase == "Running"]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return stream(core.connect_get_namespaced_pod_exec, pods[0].metadata.name, NS, command=["python3", "-c", REACH_API],
                  stdout=True, stderr=True, stdin=False, tty=False)


@pytest.mark.cluster
def test_deploy_with_the_test_cluster_overlay_runs_the_agent_and_new_arguments_keep_the_overlay(image, clean):
    """docs/deploy.md's deploy on the test cluster, as a user runs it: `gpuvs deploy --overlay overlays/test-cluster`.
    The store's claim binds the overlay's local volume and the agent, ready, has reached the API server (before:
    the claim stayed Pending, then the agent could not reach the API). `gpuvs deploy` again with new agent
    arguments and no --overlay keeps the overlay's patches (before: the merge patch of the Deployment replaced its
    container, and the port, the API server's address and --listen were gone). `--overlay none` drops them and
    deletes the overlay's volume."""
    from kubernetes import client

    from cluster import STATE
    from conftest import run_cli

    kc = str(clean.kubeconfig)
    store = STATE / "agent-store"
    shutil.rmtree(store, ignore_errors=True)  # an earlier agent's store: this one starts with none
    store.mkdir(mode=0o755)
    apps = client.AppsV1Api(api_client(clean))
    core = client.CoreV1Api(api_client(clean))
    try:
        r = run_cli("deploy", "--overlay", OVERLAY, "--image", image, "--kubeconfig", kc, timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert f"PersistentVolume/{OVERLAY_PV} created" in r.stdout and "Deployment/gpuvs-agent created" in r.stdout
        wait_for(lambda: core.read_namespaced_persistent_volume_claim("gpuvs-store", NS).status.phase == "Bound", 60,
                 "the store's claim bound to the overlay's volume")
        first = wait_for(lambda: rolled_out(apps), 120, "the agent ready").metadata.generation
        ready = wait_for(lambda: (got := agent_http("/readyz"))[0] == 200 and got[1], 60, "the agent's /readyz")
        assert ready["store_ok"] is True, ready  # its store on the overlay's volume, on the port it names
        assert "reached v1.20" in agent_reaches_the_api(core)
        r = run_cli("deploy", "--image", image, "--kubeconfig", kc, "--agent-arg=--every", "--agent-arg=2h",
                    timeout=120)
        assert r.returncode == 0, r.stderr
        assert "overlay " + str(OVERLAY) + " kept from the last deploy (--overlay none drops it)" in r.stdout, r.stdout
        d = wait_for(lambda: rolled_out(apps, first), 120, "the agent with its new arguments ready")
        spec = d.spec.template.spec
        c = spec.containers[0]
        assert spec.host_network is True and c.ports[0].container_port == OVERLAY_PORT
        assert {e.name: e.value for e in c.env}["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
        assert c.args[-4:] == ["--listen", f":{OVERLAY_PORT}", "--every", "2h"], c.args
        assert agent_http("/readyz")[0] == 200 and "reached v1.20" in agent_reaches_the_api(core)
        r = run_cli("deploy", "--image", image, "--kubeconfig", kc, "--overlay", "none", timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"PersistentVolume/{OVERLAY_PV} deleted" in r.stdout and "kept from the last" not in r.stdout
        d = apps.read_namespaced_deployment("gpuvs-agent", NS)
        assert not d.spec.template.spec.host_network and "gpuvs.io/overlay" not in (d.metadata.annotations or {})
        assert d.spec.template.spec.containers[0].ports[0].container_port == 8080
    finally:
        run_cli("deploy", "--delete", "--kubeconfig", kc, timeout=180)
        remove_everything(clean)
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir(mode=0o755)


def clear_marks(cluster) -> None:  # noqa: F811
    """The nodes without gpuvs's marks, whatever a failed test left (through the admin's client, not gpuvs's)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client(cluster))
    for n in core.list_node().items:
        keys = {"labels": {k: None for k in n.metadata.labels or {} if k.startswith("gpuvs.io/")},
                "annotations": {k: None for k in n.metadata.annotations or {} if k.startswith("gpuvs.io/")}}
        core.patch_node(n.metadata.name, {"metadata": keys})
        if any(t.key == "gpuvs.io/slow" for t in n.spec.taints or []):
            core.patch_node(n.metadata.name, {"spec": {"taints": [
                t for t in core.api_client.sanitize_for_serialization(n.spec.taints) if t["key"] != "gpuvs.io/slow"]}})
        if any(c.type == "GpuvsPerformance" for c in n.status.conditions or []):
            core.patch_node_status(n.metadata.name, {"status": {"conditions": [
                {"type": "GpuvsPerformance", "$patch": "delete"}]}})


@pytest.fixture(scope="module")
def deployed(clean):
    """deploy/ applied with `kubectl apply -k` (kubectl 1.20, the cluster's own), for the rest of the module."""
    kubectl = BIN / "kubectl"
    if not kubectl.exists():
        missing_part(f"kubectl 1.20 is not in {BIN}: run scripts/test-cluster build (it unpacks Debian's)")
    env = dict(os.environ, KUBECONFIG=str(clean.kubeconfig))
    r = subprocess.run([str(kubectl), "apply", "-k", str(DEPLOY)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r" created$", r.stdout, re.M)) == len(manifests()), r.stdout
    again = subprocess.run([str(kubectl), "apply", "-k", str(DEPLOY)], capture_output=True, text=True, env=env,
                           timeout=120)
    assert again.returncode == 0 and len(re.findall(r" unchanged$", again.stdout, re.M)) == len(manifests()), \
        again.stdout + again.stderr
    wait_for(lambda: service_account_token(clean), 60, "the ServiceAccount's token")
    return clean


wait_for = functools.partial(conftest.wait_for, step=0.3)


@pytest.mark.cluster
def test_kubectl_apply_k_creates_every_object_and_again_changes_nothing(deployed):
    assert_deployed(deployed)


def service_account_token(cluster) -> str | None:  # noqa: F811
    """The agent ServiceAccount's token, read as admin: the secret the token controller makes for it (1.20 and
    before 1.24), else one from the TokenRequest API (1.24 and later make no secret)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client(cluster))
    sa = core.read_namespaced_service_account(SA, NS)
    for ref in sa.secrets or []:
        secret = core.read_namespaced_secret(ref.name, NS)
        if secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token"):
            return base64.b64decode(secret.data["token"]).decode()
    if int(client.VersionApi(api_client(cluster)).get_code().minor.rstrip("+")) >= 24:
        req = core.create_namespaced_service_account_token(SA, NS, {"spec": {"expirationSeconds": 600}})
        return req.status.token
    return None


def status_of(call) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        return exc.status
    return 200


def probe_pod(name: str, command: str, container: dict | None = None, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"gpuvs-deploy-test": "1"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False, **spec,
                     "containers": [{"name": "c", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command],
                                     "securityContext": {"allowPrivilegeEscalation": False}, **(container or {})}]}}


@pytest.mark.cluster
def test_the_service_account_may_do_what_the_agent_needs_and_nothing_else(deployed):
    """With the ServiceAccount's own token, for real: every verb the agent needs works; everything outside its
    role is refused with 403 (the refused writes are server-side dry runs: were RBAC wrong, nothing would change)."""
    from kubernetes import client, watch
    from kubernetes.stream import stream

    sa = api_client(deployed, service_account_token(deployed))
    core = client.CoreV1Api(sa)
    admin = client.CoreV1Api(api_client(deployed))
    node = deployed.nodes[0]
    # allowed: nodes, cluster-wide
    assert {n.metadata.name for n in core.list_node().items} >= set(deployed.nodes)
    events = list(watch.Watch().stream(core.list_node, timeout_seconds=1))
    assert {e["object"].metadata.name for e in events} >= set(deployed.nodes)
    core.patch_node(node, {"metadata": {"labels": {"gpuvs.io/deploy-test": "1"}}})
    try:
        assert core.read_node(node).metadata.labels["gpuvs.io/deploy-test"] == "1"
    finally:
        core.patch_node(node, {"metadata": {"labels": {"gpuvs.io/deploy-test": None}}})
    assert "gpuvs.io/deploy-test" not in (admin.read_node(node).metadata.labels or {})
    # allowed: pods, their logs and exec, configmaps and events, in gpuvs-system
    core.create_namespaced_pod(NS, probe_pod("gpuvs-rbac-probe", "echo hello-from-the-agent; sleep 60"))
    try:
        wait_for(lambda: core.read_namespaced_pod("gpuvs-rbac-probe", NS).status.phase == "Running", 60, "probe running")
        wait_for(lambda: "hello-from-the-agent" in core.read_namespaced_pod_log("gpuvs-rbac-probe", NS), 30, "its log")
        out = stream(core.connect_get_namespaced_pod_exec, "gpuvs-rbac-probe", NS, command=["echo", "exec-ok"],
                     stdout=True, stderr=True, stdin=False, tty=False)
        assert "exec-ok" in out
        assert [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="gpuvs-deploy-test=1").items] \
            == ["gpuvs-rbac-probe"]
        assert list(watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=1))
        assert core.list_namespaced_event(NS).items is not None
    finally:
        core.delete_namespaced_pod("gpuvs-rbac-probe", NS, grace_period_seconds=0)
    cm = {"metadata": {"name": "gpuvs-rbac-probe", "labels": {"gpuvs-deploy-test": "1"}}, "data": {"a": "1"}}
    core.create_namespaced_config_map(NS, cm)
    core.patch_namespaced_config_map("gpuvs-rbac-probe", NS, {"metadata": {"annotations": {"x": "y"}}})
    core.delete_namespaced_config_map("gpuvs-rbac-probe", NS)
    # refused: secrets (its own namespace's and kube-system's), a ConfigMap read whole or listed (a list answers
    # with every ConfigMap's contents), nodes deleted or replaced,
    # pods elsewhere or cluster-wide, namespaces, its own role
    rbac = client.RbacAuthorizationV1Api(sa)
    refused = {
        "list secrets in gpuvs-system": lambda: core.list_namespaced_secret(NS),
        "read a secret in kube-system": lambda: core.read_namespaced_secret("any", "kube-system"),
        "read a ConfigMap whole": lambda: core.read_namespaced_config_map("any", NS),
        "list ConfigMaps (their contents)": lambda: core.list_namespaced_config_map(NS),
        "list ConfigMaps by label": lambda: core.list_namespaced_config_map(NS, label_selector="gpuvs=1"),
        "delete a node": lambda: core.delete_node(node, dry_run="All"),
        "replace a node": lambda: core.replace_node(node, admin.read_node(node), dry_run="All"),
        "create a pod in default": lambda: core.create_namespaced_pod("default", probe_pod("x", "true"), dry_run="All"),
        "list pods cluster-wide": lambda: core.list_pod_for_all_namespaces(),
        "list pods in kube-system": lambda: core.list_namespaced_pod("kube-system"),
        "create a namespace": lambda: core.create_namespace({"metadata": {"name": "x"}}, dry_run="All"),
        "widen its own role": lambda: rbac.patch_namespaced_role("gpuvs-agent", NS, {"rules": []}, dry_run="All"),
        "patch a pod": lambda: core.patch_namespaced_pod("any", NS, {"metadata": {"labels": {"a": "b"}}}),
    }
    got = {what: status_of(call) for what, call in refused.items()}
    assert got == {what: 403 for what in refused}


def wait_gone(core, name: str, timeout: float = 60) -> None:
    wait_for(lambda: gone(lambda: core.read_namespaced_pod(name, NS)), timeout, f"{name} gone")


@pytest.mark.cluster
def test_trial_pods_are_preempted_by_a_real_job_and_preempt_nobody(deployed):
    """The PriorityClass on the real scheduler: a trial pod holding a node's GPUs is preempted by a pod of the
    default priority asking for them; a trial pod never preempts, not even a pod of a lower priority: it waits."""
    from kubernetes import client

    api = api_client(deployed)
    core = client.CoreV1Api(api)
    node, gpus = deployed.nodes[-1], deployed.gpus
    deployed.wait_ready()

    def gpu_pod(name: str, **spec):
        return probe_pod(name, "sleep 300", nodeSelector={"kubernetes.io/hostname": node},
                         container={"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}, **spec)

    names = ["gpuvs-trial-a", "real-job", "lowest", "gpuvs-trial-b"]
    try:
        core.create_namespaced_pod(NS, gpu_pod("gpuvs-trial-a", priorityClassName="gpuvs-trial"))
        wait_for(lambda: core.read_namespaced_pod("gpuvs-trial-a", NS).status.phase == "Running", 60, "trial running")
        core.create_namespaced_pod(NS, gpu_pod("real-job"))
        wait_for(lambda: core.read_namespaced_pod("real-job", NS).status.phase == "Running", 90, "the real job running")
        reasons = {(e.reason, e.message) for e in core.list_namespaced_event(
            NS, field_selector="involvedObject.name=gpuvs-trial-a").items}
        assert any(r == "Preempted" and "real-job" in (m or "") for r, m in reasons), reasons
        wait_gone(core, "gpuvs-trial-a")
        assert core.read_namespaced_pod("real-job", NS).spec.priority == 0
        core.delete_namespaced_pod("real-job", NS, grace_period_seconds=0)
        wait_gone(core, "real-job")
        # below the trial pods: the trial pod must wait, not evict it
        client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": LOWEST}, "value": -1000, "description": "gpuvs's deploy test"})
        core.create_namespaced_pod(NS, gpu_pod("lowest", priorityClassName=LOWEST))
        wait_for(lambda: core.read_namespaced_pod("lowest", NS).status.phase == "Running", 60, "lowest running")
        core.create_namespaced_pod(NS, gpu_pod("gpuvs-trial-b", priorityClassName="gpuvs-trial"))
        cond = wait_for(lambda: next((c for c in core.read_namespaced_pod("gpuvs-trial-b", NS).status.conditions or []
                                      if c.type == "PodScheduled" and c.reason == "Unschedulable"), None), 30,
                        "the trial pod unschedulable")
        assert "nvidia.com/gpu" in cond.message
        time.sleep(8)  # a preempting scheduler would have evicted `lowest` by now (the real job's took seconds)
        low = core.read_namespaced_pod("lowest", NS)
        assert low.status.phase == "Running" and low.metadata.deletion_timestamp is None
        assert core.read_namespaced_pod("gpuvs-trial-b", NS).status.phase == "Pending"
        assert core.read_namespaced_pod("gpuvs-trial-b", NS).status.nominated_node_name is None
    finally:
        for name in names:
            gone(lambda name=name: core.delete_namespaced_pod(name, NS, grace_period_seconds=0))
        for name in names:
            wait_gone(core, name)
        gone(lambda: client.SchedulingV1Api(api).delete_priority_class(LOWEST))


# -- gpuvs's own image -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def image(clean):
    """localhost/gpuvs:VERSION built by scripts/build-image and loaded into every node (warm: seconds)."""
    for tool, what in (("podman", "podman builds gpuvs's image"), ("debootstrap", "debootstrap makes its base")):
        if shutil.which(tool) is None:
            missing_part(f"{what}: `{tool}` is not on PATH (see .ci/apt/image.txt)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts/build-image"), "--load"], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return IMAGE_TAG


def store_volume(cluster) -> None:  # noqa: F811
    """A local PersistentVolume on the first node for the store's claim (the test cluster has no provisioner): a
    root-owned folder, which only fsGroup makes writable for the agent's uid."""
    from kubernetes import client

    STORE_DIR.mkdir(mode=0o755, exist_ok=True)
    client.CoreV1Api(api_client(cluster)).create_persistent_volume({
        "metadata": {"name": PV, "labels": {"gpuvs-deploy-test": "1"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "local": {"path": str(STORE_DIR)},
                 "claimRef": {"namespace": NS, "name": by_kind("PersistentVolumeClaim")["metadata"]["name"]},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [cluster.nodes[0]]}]}]}}}})


CHECK = r"""
import json, os, subprocess, sys
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
def writable(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return "ok"
    except OSError as exc:
        return exc.strerror
out["write /usr"] = writable("/usr/gpuvs-probe")
out["write /"] = writable("/gpuvs-probe")
out["write /tmp"] = writable("/tmp/gpuvs-probe")
out["write store"] = writable("/var/lib/gpuvs/gpuvs-probe")
for name, argv in {"help": ["gpuvs", "--help"], "validate": ["gpuvs", "validate", "--help"],
                   "fleet": ["gpuvs", "fleet", "--help"], "info": ["gpuvs", "info"],
                   "run": ["gpuvs", "run", "selftest", "--device", "cpu", "--steps", "2",
                           "--store", "/var/lib/gpuvs/check.db"]}.items():
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    out[name] = [r.returncode, (r.stdout + r.stderr)[:300], (r.stdout + r.stderr)[-300:]]
out["store rows"] = __import__("sqlite3").connect("/var/lib/gpuvs/check.db").execute(
    "SELECT COUNT(*) FROM trials WHERE status = 'ok'").fetchone()[0]
os.unlink("/var/lib/gpuvs/check.db")
try:
    import torch
    out["torch"] = torch.__version__
except ImportError:
    out["torch"] = None
print("CHECK " + json.dumps(out), flush=True)
"""


@pytest.mark.cluster
def test_the_image_runs_gpuvs_as_the_deployments_pod_under_the_restricted_context(image, deployed):
    """The Deployment's own pod starts from the loaded image (the kubelet verifies runAsNonRoot against uid 10001)
    with the store's claim bound; a pod made from the same template runs gpuvs's commands: uid 10001, read-only
    root file system, /tmp and the store writable (fsGroup), no PyTorch, and a real run stored on the volume."""
    from kubernetes import client

    core = client.CoreV1Api(api_client(deployed))
    store_volume(deployed)
    wait_for(lambda: core.read_namespaced_persistent_volume_claim("gpuvs-store", NS).status.phase == "Bound", 60,
             "the store's claim bound")
    selector = ",".join(f"{k}={v}" for k, v in by_kind("Deployment")["spec"]["selector"]["matchLabels"].items())

    def agent_started():
        for p in core.list_namespaced_pod(NS, label_selector=selector).items:
            for cs in p.status.container_statuses or []:
                st, last = cs.state, cs.last_state
                if st.running or st.terminated or (last and last.terminated):
                    return p
                if st.waiting and st.waiting.reason in ("CreateContainerConfigError", "ErrImageNeverPull",
                                                        "ErrImagePull", "ImagePullBackOff"):
                    raise AssertionError(f"the agent's pod cannot start: {st.waiting.reason}: {st.waiting.message}")
        return None

    agent = wait_for(agent_started, 120, "the Deployment's pod started")
    assert agent.spec.security_context.run_as_user == 10001 and agent.spec.node_name == deployed.nodes[0]
    template = yaml.safe_load(yaml.safe_dump(by_kind("Deployment")["spec"]["template"]))
    spec = template["spec"]
    spec["restartPolicy"] = "Never"
    spec["nodeName"] = deployed.nodes[0]
    c = spec["containers"][0]
    c.update(command=["python3", "-c", CHECK], args=[])
    c["resources"]["limits"]["memory"] = "1Gi"
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpuvs-image-check", "labels": {"gpuvs-deploy-test": "1"}},
            "spec": spec}
    assert violations(spec, "restricted") == []
    core.create_namespaced_pod(NS, body)
    try:
        pod = wait_for(lambda: (p := core.read_namespaced_pod("gpuvs-image-check", NS)).status.phase in
                       ("Succeeded", "Failed") and p, 300, "the image check to end", step=1)
        log = core.read_namespaced_pod_log("gpuvs-image-check", NS)
        assert pod.status.phase == "Succeeded", log[-3000:]
        sc = pod.spec.containers[0].security_context
        assert sc.read_only_root_filesystem and sc.allow_privilege_escalation is False and sc.capabilities.drop == ["ALL"]
        assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
        out = json.loads(next(line for line in log.splitlines() if line.startswith("CHECK "))[6:])
    finally:
        gone(lambda: core.delete_namespaced_pod("gpuvs-image-check", NS, grace_period_seconds=0))
    assert out["uid"] == 10001 and out["gid"] == 10001 and 10001 in out["groups"], out
    assert out["write /usr"] == out["write /"] == "Read-only file system", out
    assert out["write /tmp"] == "ok" and out["write store"] == "ok", out
    for name in ("help", "validate", "fleet", "info", "run"):
        assert out[name][0] == 0, (name, out[name])
    assert "usage: gpuvs COMMAND [options]" in out["help"][1], out["help"]
    assert "gpuvs fleet" in out["fleet"][1] and "validate" in out["validate"][1], out
    assert gpuvs.__version__ in out["info"][2], out["info"]
    assert out["store rows"] == 1 and out["torch"] is None, out


@pytest.mark.cluster
def test_the_image_carries_the_open_container_initiatives_labels(image):
    """`podman image inspect`: the OCI annotation keys (title, version = the package's, licenses = pyproject's,
    base.name, and in a git checkout the commit as revision and its time as created)."""
    import tomllib

    r = subprocess.run(["podman", "image", "inspect", "--format", "{{json .Labels}}", image], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    labels = {k.removeprefix("org.opencontainers.image."): v for k, v in json.loads(r.stdout).items()
              if k.startswith("org.opencontainers.image.")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert labels["title"] == "gpuvs" and labels["version"] == gpuvs.__version__
    assert labels["licenses"] == project["license"]["text"] and labels["description"]
    assert labels["base.name"].startswith("localhost/gpuvs-base:")
    head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%H"], capture_output=True, text=True)
    if head.returncode == 0:
        assert labels["revision"] == head.stdout.strip() and re.match(r"^\d{4}-\d\d-\d\dT", labels["created"])
