"""Which nodes take part in a fleet run, and why the others cannot.

Plain data: kube.py reads NodeInfo from the Kubernetes API, and the choice here needs no cluster.
A node that matches but cannot run the pod is a row with its reason, never a crash."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuvs.errors import UsageError


@dataclass
class NodeInfo:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    ready: bool = True
    ready_reason: str = ""  # the Ready condition's reason and message when not ready
    unschedulable: bool = False
    taints: list[dict[str, str]] = field(default_factory=list)  # {key, value, effect}
    allocatable: dict[str, str] = field(default_factory=dict)
    images: set[str] = field(default_factory=set)  # image names the kubelet reports on the node
    system: dict[str, Any] = field(default_factory=dict)  # nodeInfo: kernel, OS image, kubelet, runtime

    def gpus(self, resource: str) -> int:
        try:
            return int(str(self.allocatable.get(resource, "0")))
        except ValueError:
            return 0


@dataclass
class Excluded:
    node: str
    reason: str


@dataclass
class NodeChoice:
    """Nodes a caller has listed and chosen already (the agent, which holds them idle first): a fleet given one runs
    on `chosen` without listing or choosing again, so both see the same nodes."""

    found: list[NodeInfo]  # every node listed
    chosen: list[NodeInfo]
    excluded: list[Excluded] = field(default_factory=list)


def parse_label(item: str) -> tuple[str, str | None]:
    key, eq, value = str(item).partition("=")
    if not key.strip():
        raise UsageError(f"--node-label wants KEY or KEY=VALUE, got {item!r}")
    return key.strip(), (value.strip() if eq else None)


def _tolerated(taint: dict[str, str], tolerations: list[dict[str, str]]) -> bool:
    for t in tolerations:
        if t.get("key") != taint.get("key"):
            continue
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint.get("value"):
            return True
    return False


def blocker(node: NodeInfo, *, image: str | None = None, pull_never: bool = False,
            tolerations: list[dict[str, str]] | None = None) -> str | None:
    """Why a pod pinned to this node cannot run there now, or None."""
    if not node.ready:
        return "not ready" + (f": {node.ready_reason}" if node.ready_reason else "")
    if node.unschedulable:
        return "unschedulable (cordoned: spec.unschedulable)"
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations or []):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"tainted {taint.get('key')}{value}:{taint.get('effect')} (add --toleration to run there)"
    if image and pull_never and not _has_image(node, image):
        return f"image {image} is not on the node (imagePullPolicy Never)"
    return None


def _has_image(node: NodeInfo, image: str) -> bool:
    def norm(name: str) -> str:
        return name if ":" in name.rsplit("/", 1)[-1] or "@" in name else name + ":latest"

    want = norm(image)
    return any(norm(n) == want or norm(n).endswith("/" + want) for n in node.images)


def select(nodes: list[NodeInfo], *, names: list[str] | None = None, labels: list[str] | None = None,
           gpu_resource: str = "nvidia.com/gpu", need_gpus: bool = True, image: str | None = None,
           pull_never: bool = False, tolerations: list[dict[str, str]] | None = None
           ) -> tuple[list[NodeInfo], list[Excluded]]:
    """(the nodes that take part, in name order; the matching nodes that cannot, with reasons)."""
    by_name = {n.name: n for n in nodes}
    wanted = [parse_label(item) for item in labels or []]
    excluded: list[Excluded] = []
    if names:
        picked = []
        for name in dict.fromkeys(names):
            if name not in by_name:
                excluded.append(Excluded(name, "no such node in the cluster"))
            else:
                picked.append(by_name[name])
    else:
        picked = list(nodes)
    matched = []
    for node in picked:
        if any(k not in node.labels or (v is not None and node.labels[k] != v) for k, v in wanted):
            if names:
                excluded.append(Excluded(node.name, "does not carry the labels asked for ("
                                         + ", ".join(k if v is None else f"{k}={v}" for k, v in wanted) + ")"))
            continue
        if need_gpus and node.gpus(gpu_resource) < 1:
            if names:
                excluded.append(Excluded(node.name, f"no allocatable {gpu_resource}"))
            continue
        matched.append(node)
    ok = []
    for node in sorted(matched, key=lambda n: n.name):
        why = blocker(node, image=image, pull_never=pull_never, tolerations=tolerations)
        if why:
            excluded.append(Excluded(node.name, why))
        else:
            ok.append(node)
    return ok, sorted(excluded, key=lambda e: e.node)


def from_api(obj: Any) -> NodeInfo:
    """NodeInfo from a kubernetes.client V1Node."""
    meta, spec, status = obj.metadata, obj.spec, obj.status
    ready, why = False, "no Ready condition reported"
    for c in (status.conditions or []) if status else []:
        if c.type == "Ready":
            ready = c.status == "True"
            why = "" if ready else ", ".join(x for x in (c.reason, c.message) if x) or f"Ready={c.status}"
    images = set()
    for img in (status.images or []) if status else []:
        images |= set(img.names or [])
    info = status.node_info if status else None
    system = {} if info is None else {
        "kernel": info.kernel_version, "os_image": info.os_image, "kubelet": info.kubelet_version,
        "container_runtime": info.container_runtime_version, "architecture": info.architecture}
    return NodeInfo(name=meta.name, labels=dict(meta.labels or {}), ready=ready, ready_reason=why,
                    unschedulable=bool(spec and spec.unschedulable),
                    taints=[{"key": t.key, "value": t.value or "", "effect": t.effect} for t in (spec.taints or [])]
                    if spec else [],
                    allocatable=dict(status.allocatable or {}) if status else {}, images=images, system=system)
