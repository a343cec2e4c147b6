"""Which nodes the agent may test, and the marks it leaves while it does.

A node is tested only when the scheduler places a hold pod asking for all its GPUs, below every real job.
While under test a node carries gpuvs.io/testing=true, removed on every exit path.
At start, marks and gpuvs pods left by a run cut short are cleaned up (sweep)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

from gpuvs.kube import SLOW_TOLERATION, app_labels
from gpuvs.kube.client import Cluster, api_message, client_module

TESTING = "gpuvs.io/testing"
HOLD_LABEL = "gpuvs.hold"
POLL_S = 0.5


@dataclass
class Hold:
    node: str
    gpus: int
    pod: str


def hold_name(run_id: str, node: str) -> str:
    return f"gpuvs-hold-{run_id[:8]}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"


def hold_manifest(hold: Hold, *, run_id: str, image: str, python: str, resource: str, priority_class: str,
                  pull_policy: str | None, restricted: bool) -> dict[str, Any]:
    """A pod asking for every GPU of one node at the trials' priority; it only has to be placed, not to run."""
    container: dict[str, Any] = {
        "name": "hold", "image": image, "command": [python, "-c", "import time; time.sleep(600)"],
        "resources": {"limits": {resource: str(hold.gpus)}},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}}
    if pull_policy:
        container["imagePullPolicy"] = pull_policy
    security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if restricted:
        security["runAsNonRoot"] = True
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": hold.pod, "labels": {**app_labels("hold", agent_run=run_id), HOLD_LABEL: "1",
                                                      "gpuvs.agent-run": run_id}},
            "spec": {"restartPolicy": "Never", "activeDeadlineSeconds": 300, "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "priorityClassName": priority_class, "nodeSelector": {"kubernetes.io/hostname": hold.node},
                     "tolerations": [dict(SLOW_TOLERATION)],  # a node gpuvs tainted slow is tested again
                     "securityContext": security, "containers": [container]}}


def free_nodes(cluster: Cluster, gpus: dict[str, int], *, run_id: str, image: str, python: str, resource: str,
               priority_class: str, pull_policy: str | None, restricted: bool, timeout_s: float,
               stop: Callable[[], bool] = lambda: False) -> tuple[list[str], dict[str, str]]:
    """(the nodes whose GPUs the scheduler gave to a hold pod, {busy node: the scheduler's reason}). Every hold
    pod is deleted and gone before this returns, whatever happens."""
    free = [n for n, g in gpus.items() if g <= 0]
    busy: dict[str, str] = {}
    holds = [Hold(n, g, hold_name(run_id, n)) for n, g in sorted(gpus.items()) if g > 0]
    created: list[Hold] = []
    try:
        for h in holds:
            body = hold_manifest(h, run_id=run_id, image=image, python=python, resource=resource,
                                 priority_class=priority_class, pull_policy=pull_policy, restricted=restricted)
            try:
                cluster.core.create_namespaced_pod(cluster.namespace, body, _request_timeout=15)
                created.append(h)
            except Exception as exc:
                busy[h.node] = f"the hold pod was refused: {api_message(exc)}"
        deadline = time.monotonic() + timeout_s
        waiting = list(created)
        while waiting and time.monotonic() < deadline and not stop():
            for h in list(waiting):
                try:
                    pod = cluster.core.read_namespaced_pod(h.pod, cluster.namespace, _request_timeout=10)
                except Exception:
                    continue
                if pod.spec.node_name:
                    free.append(h.node)
                    waiting.remove(h)
                    continue
                cond = next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"
                             and c.status == "False" and c.reason == "Unschedulable"), None)
                if cond is not None:
                    busy[h.node] = (f"its {h.gpus} {resource} are requested by other pods (the scheduler: "
                                    f"{cond.message})")
                    waiting.remove(h)
            if waiting:
                time.sleep(POLL_S)
        for h in waiting:
            busy[h.node] = f"the scheduler did not place a pod asking its {h.gpus} {resource} within {timeout_s:g} s"
    finally:
        delete_pods(cluster, [h.pod for h in created])
    return sorted(free), busy


def delete_pods(cluster: Cluster, names: list[str], timeout_s: float = 60.0) -> list[str]:
    """Delete these pods (grace 0) and wait until they are gone; the names still there after timeout_s."""
    ApiException = client_module().client.exceptions.ApiException
    for name in names:
        try:
            cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0, _request_timeout=15)
        except Exception:
            pass
    left = list(names)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        for name in list(left):
            try:
                cluster.core.read_namespaced_pod(name, cluster.namespace, _request_timeout=10)
            except ApiException as exc:
                if exc.status == 404:
                    left.remove(name)
            except Exception:
                pass
        if left:
            time.sleep(POLL_S)
    return left


def mark(cluster: Cluster, node: str) -> None:
    cluster.core.patch_node(node, {"metadata": {"labels": {TESTING: "true"}}}, _request_timeout=15)


def unmark(cluster: Cluster, node: str, attempts: int = 5) -> str | None:
    """Remove gpuvs.io/testing (a node gone meanwhile is fine); None, or why it could not be removed."""
    why = None
    for i in range(attempts):
        try:
            cluster.core.patch_node(node, {"metadata": {"labels": {TESTING: None}}}, _request_timeout=15)
            return None
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            why = api_message(exc)
            time.sleep(min(2.0 * 2 ** i, 10.0))
    return why


def sweep(cluster: Cluster) -> tuple[list[str], list[str]]:
    """At start: (nodes whose gpuvs.io/testing was removed, gpuvs pods deleted from the agent's namespace)."""
    nodes = [n.metadata.name for n in cluster.core.list_node(label_selector=TESTING, _request_timeout=15).items]
    for n in nodes:
        unmark(cluster, n)
    pods = [p.metadata.name for p in cluster.core.list_namespaced_pod(cluster.namespace, label_selector="gpuvs=1",
                                                                      _request_timeout=15).items]
    delete_pods(cluster, pods)
    return nodes, pods
