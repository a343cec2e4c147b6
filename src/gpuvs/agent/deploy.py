"""deploy/'s manifests as the installed package carries them, applied to a cluster through the official client.

Each object is created, or merge-patched where it exists, in the kustomization's order (`kubectl apply -k`).
--delete stops the agent first and takes gpuvs's labels, taint and condition off the nodes (docs/deploy.md).
The API token's Secret is no manifest: it is made once with a random token, never patched."""

from __future__ import annotations

import copy
import secrets
import time
from importlib import resources
from typing import Any

import yaml

from gpuvs.errors import UsageError
from gpuvs.kube.client import Cluster, api_message, client_module

AGENT = ("Deployment", "gpuvs-agent")
TOKEN_SECRET = "gpuvs-agent-token"  # key `token`; the Deployment mounts it (deploy/deployment.yaml)
STOP_MARGIN_S = 30.0  # beyond the agent pod's terminationGracePeriodSeconds, for the kubelet to report it gone


NODE_STATUS = "node-status"  # the opt-in component of --condition: nodes/status patch, Node events in default


def _read(folder: str = "") -> list[dict[str, Any]]:
    root = resources.files("gpuvs") / "manifests"
    if folder:
        root = root / folder
    try:
        order = yaml.safe_load((root / "kustomization.yaml").read_text())["resources"]
        return [yaml.safe_load((root / name).read_text()) for name in order]
    except (OSError, KeyError, TypeError) as exc:
        raise UsageError(f"gpuvs's manifests are missing from the installed package ({root}): {exc}") from None


def manifests(image: str | None = None, agent_args: list[str] | None = None, condition: bool = False,
              overlay: Any = None) -> list[dict[str, Any]]:
    """Every object of deploy/, in the kustomization's order; with an overlay (agent/overlay.py), its objects
    before the Deployment and its patches applied, remembered in the Deployment's annotation gpuvs.io/overlay;
    then the agent's image and extra arguments if given. With condition, deploy/node-status's objects too,
    before the Deployment, and the agent's --condition."""
    out = _read()
    if overlay is not None:
        from gpuvs.agent import overlay as overlays

        out = overlays.apply(out, overlay, AGENT)
        agent = next(m for m in out if (m["kind"], m["metadata"]["name"]) == AGENT)
        agent["metadata"].setdefault("annotations", {})[overlays.ANNOTATION] = overlay.to_json()
    if condition:
        i = next(i for i, m in enumerate(out) if (m["kind"], m["metadata"]["name"]) == AGENT)
        out[i:i] = _read(NODE_STATUS)
        agent_args = [*(agent_args or []), *([] if "--condition" in (agent_args or []) else ["--condition"])]
    port = listen_port(agent_args or [])
    for m in out:
        if (m["kind"], m["metadata"]["name"]) == AGENT:
            c = m["spec"]["template"]["spec"]["containers"][0]
            if image:
                c["image"] = image
            if agent_args:
                c["args"] = [*c.get("args", []), *agent_args]
            if port is not None:  # the probes and the Service's targetPort name this port: they follow it
                next(p for p in c["ports"] if p["name"] == "http")["containerPort"] = port
        elif m["kind"] == "Service" and port is not None and "prometheus.io/port" in m["metadata"].get(
                "annotations", {}):
            m["metadata"]["annotations"]["prometheus.io/port"] = str(port)  # a scrape goes to the pod's port
    return copy.deepcopy(out)


def listen_port(agent_args: list[str]) -> int | None:
    """The port of the last --listen among the agent's arguments (None: none given, the manifests' 8080). A host
    other than all addresses is refused: the kubelet's probes and the Service come to the pod's own IP."""
    from gpuvs.agent.config import listen

    given = None
    for i, a in enumerate(agent_args):
        if a == "--listen":
            if i + 1 >= len(agent_args):
                raise UsageError("--agent-arg --listen: give its value too (--agent-arg=--listen --agent-arg=:9090)")
            given = agent_args[i + 1]
        elif a.startswith("--listen="):
            given = a.partition("=")[2]
    if given is None:
        return None
    host, port = listen(given)
    if not 0 < port < 65536:
        raise UsageError(f"--agent-arg --listen {given!r}: port {port}: expected 1-65535")
    if host not in ("0.0.0.0", "::", "[::]", ""):
        raise UsageError(f"--agent-arg --listen {given!r}: the probes and the Service reach the pod's own IP, not "
                         f"{host}; give :PORT (all addresses)")
    return port


def with_token(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects with the Secret of the agent's API token (a new random one) just before the Deployment."""
    agent = next(m for m in objs if (m["kind"], m["metadata"]["name"]) == AGENT)
    meta = agent["metadata"]
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": TOKEN_SECRET, "namespace": meta["namespace"], "labels": dict(meta["labels"])},
              "stringData": {"token": secrets.token_urlsafe(32)}}
    i = objs.index(agent)
    return [*objs[:i], secret, *objs[i:]]


def render(objs: list[dict[str, Any]]) -> str:
    """The objects as one YAML stream (`kubectl apply -f -` takes it)."""
    return yaml.safe_dump_all(objs, sort_keys=False, default_flow_style=False)


def _resource(dyn: Any, m: dict[str, Any]) -> Any:
    return dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])


def apply(cluster: Cluster, objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Create each object, or merge-patch it where it exists (a Secret is kept as it is: its token is not
    replaced); [(kind/name, created | configured | kept)]. The first refusal stops with one line (what, the
    API's words)."""
    k8s = client_module()
    dyn = k8s.dynamic.DynamicClient(cluster.api)
    done = []
    for m in objs:
        what = f"{m['kind']}/{m['metadata']['name']}"
        ns = m["metadata"].get("namespace")
        try:
            r = _resource(dyn, m)
            try:
                r.create(body=m, namespace=ns)
                done.append((what, "created"))
            except k8s.client.exceptions.ApiException as exc:
                if exc.status != 409:
                    raise
                if m["kind"] == "Secret":
                    done.append((what, "kept"))
                    continue
                if (m["kind"], m["metadata"]["name"]) == AGENT:
                    _replace(r, m, ns)
                else:
                    r.patch(body=m, name=m["metadata"]["name"], namespace=ns,
                            content_type="application/merge-patch+json")
                done.append((what, "configured"))
        except k8s.client.exceptions.ApiException as exc:
            raise UsageError(f"{what} could not be applied on {cluster.host}: {api_message(exc)}") from None
    return done


def _replace(r: Any, m: dict[str, Any], ns: str | None, attempts: int = 3) -> None:
    """The agent's Deployment made exactly the manifest (a merge patch would keep what an overlay no longer adds,
    hostNetwork say): replaced at the resourceVersion read, read again on a conflict."""
    k8s = client_module()
    for i in range(attempts):
        live = r.get(name=m["metadata"]["name"], namespace=ns)
        body = copy.deepcopy(m)
        body["metadata"]["resourceVersion"] = live.metadata.resourceVersion
        try:
            r.replace(body=body, name=m["metadata"]["name"], namespace=ns)
            return
        except k8s.client.exceptions.ApiException as exc:
            if exc.status != 409 or i == attempts - 1:
                raise


def remembered(cluster: Cluster) -> Any:
    """The overlay the agent's Deployment was last deployed with (its annotation gpuvs.io/overlay), or None."""
    from gpuvs.agent import overlay as overlays

    k8s = client_module()
    ns = next(m for m in _read() if (m["kind"], m["metadata"]["name"]) == AGENT)["metadata"]["namespace"]
    try:
        d = k8s.client.AppsV1Api(cluster.api).read_namespaced_deployment(AGENT[1], ns, _request_timeout=15)
    except k8s.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise UsageError(f"Deployment/{AGENT[1]} could not be read on {cluster.host}: {api_message(exc)}") from None
    text = (d.metadata.annotations or {}).get(overlays.ANNOTATION)
    return overlays.Overlay.from_json(text) if text else None


def _delete_one(dyn: Any, cluster: Cluster, m: dict[str, Any]) -> tuple[str, str]:
    k8s = client_module()
    what = f"{m['kind']}/{m['metadata']['name']}"
    try:
        _resource(dyn, m).delete(name=m["metadata"]["name"], namespace=m["metadata"].get("namespace"))
        return what, "deleted"
    except k8s.client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise UsageError(f"{what} could not be deleted on {cluster.host}: {api_message(exc)}") from None
        return what, "absent"


def _agent_stopped(cluster: Cluster, agent: dict[str, Any], poll_s: float) -> list[tuple[str, str]]:
    """Wait until no pod of the agent's Deployment is left (each has stopped: its clean-up done, or killed at the
    end of its grace period); [(Pod/name, gone after N s | still terminating after N s)]."""
    ns = agent["metadata"]["namespace"]
    selector = ",".join(f"{k}={v}" for k, v in agent["spec"]["selector"]["matchLabels"].items())
    timeout = float(agent["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)) + STOP_MARGIN_S
    t0 = time.monotonic()
    seen: set[str] = set()
    while True:
        try:
            left = {p.metadata.name for p in cluster.core.list_namespaced_pod(ns, label_selector=selector,
                                                                             _request_timeout=15).items}
        except client_module().client.exceptions.ApiException as exc:
            raise UsageError(f"the agent's pods in {ns} could not be listed on {cluster.host}: {api_message(exc)}"
                             ) from None
        seen |= left
        waited = time.monotonic() - t0
        if not left or waited >= timeout:
            return [(f"Pod/{name}", f"still terminating after {waited:.0f} s" if name in left else
                     f"gone after {waited:.1f} s (the agent stopped)") for name in sorted(seen)]
        time.sleep(poll_s)


def _unmark_nodes(cluster: Cluster) -> list[tuple[str, str]]:
    """Take gpuvs.io/testing off every node that still carries it, as the caller: only an agent that could not
    finish its clean-up leaves one, and none will ever remove it once the agent's rights are gone."""
    from gpuvs.agent import idle

    try:
        nodes = [n.metadata.name for n in cluster.core.list_node(label_selector=idle.TESTING,
                                                                  _request_timeout=15).items]
    except client_module().client.exceptions.ApiException as exc:
        return [(f"label {idle.TESTING}", f"not checked on the nodes: {api_message(exc)}")]
    out = []
    for node in nodes:
        why = idle.unmark(cluster, node, attempts=1)
        out.append((f"Node/{node}", f"{idle.TESTING} could not be removed: {why}" if why else
                    f"{idle.TESTING} removed (left by the agent)"))
    return out


PREFIX = "gpuvs.io/"  # gpuvs's domain: every node label and annotation gpuvs writes (fleet/cluster/node_labels.py, agent/idle.py)
NOT_REMOVED = "could not be removed"


def _clear_nodes(cluster: Cluster, keep_labels: bool = False) -> list[tuple[str, str]]:
    """Take off every node what gpuvs wrote there, as the caller: the gpuvs.io/ labels and annotations (the
    verdicts kept with keep_labels), the taint gpuvs.io/slow and the condition GpuvsPerformance (a patch of
    nodes/status). Nothing else reads or removes them once gpuvs is gone, and a stale True condition is what
    remediation tools act on. [(Node/name, what was removed, kept, or could not be removed and why)]."""
    from gpuvs.fleet.cluster import taints
    from gpuvs.kube import SLOW_TAINT, nodestatus
    from gpuvs.agent.idle import TESTING

    try:
        nodes = cluster.core.list_node(_request_timeout=15).items
    except client_module().client.exceptions.ApiException as exc:
        return [("nodes", f"not cleared of gpuvs's labels, taint and condition: {api_message(exc)}")]
    out = []
    for n in nodes:
        name, meta = n.metadata.name, n.metadata
        labels = sorted(k for k in (meta.labels or {}) if k.startswith(PREFIX) and k != TESTING)
        notes = sorted(k for k in (meta.annotations or {}) if k.startswith(PREFIX))
        if keep_labels and (labels or notes):
            out.append((f"Node/{name}", f"{', '.join(labels + notes)} kept (--keep-labels)"))
        elif labels or notes:
            body = {"metadata": {"labels": {k: None for k in labels}, "annotations": {k: None for k in notes}}}
            try:
                cluster.core.patch_node(name, body, _request_timeout=15)
                out.append((f"Node/{name}", f"{', '.join(labels + notes)} removed"))
            except client_module().client.exceptions.ApiException as exc:
                out.append((f"Node/{name}", f"{', '.join(labels + notes)} {NOT_REMOVED}: {api_message(exc)}"))
        if any(t.key == SLOW_TAINT for t in (n.spec.taints or [])):
            why = taints.set_taint(cluster.core, name, None)
            out.append((f"Node/{name}", f"taint {SLOW_TAINT} {f'{NOT_REMOVED}: {why}' if why else 'removed'}"))
        if nodestatus.current(n) is not None:
            why = nodestatus.remove(cluster.core, name)
            out.append((f"Node/{name}", f"condition {nodestatus.CONDITION} "
                                        f"{f'{NOT_REMOVED}: {why}' if why else 'removed'}"))
    return out


def delete(cluster: Cluster, objs: list[dict[str, Any]], poll_s: float = 0.5, keep_labels: bool = False,
           clear_nodes: bool = True) -> list[tuple[str, str]]:
    """Delete the agent's Deployment and wait for its pods to go, take off any gpuvs.io/testing left on a node
    and then everything else gpuvs wrote on the nodes (_clear_nodes), then delete every other object (namespaced
    ones go with the namespace), last first; [(what, how)]. Give it manifests(condition=True) to remove
    deploy/node-status's objects too (absent ones are said so)."""
    k8s = client_module()
    dyn = k8s.dynamic.DynamicClient(cluster.api)
    agent = next((m for m in objs if (m["kind"], m["metadata"]["name"]) == AGENT), None)
    done = []
    if agent is not None:
        done.append(_delete_one(dyn, cluster, agent))
        done += _agent_stopped(cluster, agent, poll_s)
        done += _unmark_nodes(cluster)
    done += _clear_nodes(cluster, keep_labels) if clear_nodes else []
    for m in reversed(objs):
        if m is not agent:
            done.append(_delete_one(dyn, cluster, m))
    return done
