"""The opt-in taint gpuvs.io/slow on the nodes a fleet found slower, and off again when a node reads well.

A circuit breaker (NVSentinel's idea) keeps at most LIMIT of the GPU nodes tainted at once.
The spec's taints list is patched at the resourceVersion it was read at, other taints kept."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpuvs.kube import SLOW_TAINT

EFFECTS = ("NoSchedule", "PreferNoSchedule")
DEFAULT_SHARE = 0.1
WELL = ("equivalent", "faster", "faster-within-margin", "slower-within-margin", "reference")


@dataclass
class TaintChange:
    node: str
    action: str  # taint | untaint | keep | refused
    detail: str = ""


@dataclass
class TaintPlan:
    changes: list[TaintChange] = field(default_factory=list)
    gpu_nodes: int = 0
    limit: int = 0
    tainted: int = 0  # after the plan
    circuit_open: bool = False


def limit_of(share: float, gpu_nodes: int) -> int:
    # at least 1, so that a small fleet can still set one node apart
    return max(1, math.floor(share * gpu_nodes + 1e-9)) if gpu_nodes > 0 else 0


def plan(verdicts: list[tuple[str, str]], *, tainted: set[str], gpu_nodes: int, share: float) -> TaintPlan:
    """verdicts: (node, verdict) slowest first; tainted: every node that carries gpuvs.io/slow now."""
    limit = limit_of(share, gpu_nodes)
    out = TaintPlan(gpu_nodes=gpu_nodes, limit=limit)
    now = set(tainted)
    for node, verdict in verdicts:
        if verdict in WELL and node in now:
            out.changes.append(TaintChange(node, "untaint", f"reads {verdict}"))
            now.discard(node)
    for node, verdict in verdicts:
        if verdict != "slower":
            continue
        if node in now:
            out.changes.append(TaintChange(node, "keep", "already tainted"))
        elif len(now) < limit:
            out.changes.append(TaintChange(node, "taint", "slower than its peers"))
            now.add(node)
        else:
            out.circuit_open = True
            out.changes.append(TaintChange(node, "refused", (
                f"circuit breaker open: {len(now)} of {gpu_nodes} GPU node(s) carry {SLOW_TAINT}, at most {limit} "
                f"(--taint-max-share {share:g})")))
    out.tainted = len(now)
    return out


def taints_of(node_obj: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
            for t in (node_obj.spec.taints or [])]


def set_taint(core: Any, node: str, effect: str | None, attempts: int = 3) -> str | None:
    """Put gpuvs.io/slow=true:EFFECT on the node (effect None: take it off), other taints kept; None or why not."""
    from gpuvs.kube.client import api_message

    why = None
    for _ in range(attempts):
        try:
            obj = core.read_node(node, _request_timeout=15)
            keep = [t for t in taints_of(obj) if t["key"] != SLOW_TAINT]
            new = keep + ([{"key": SLOW_TAINT, "value": "true", "effect": effect}] if effect else [])
            if new == taints_of(obj):
                return None
            core.patch_node(node, {"metadata": {"resourceVersion": obj.metadata.resource_version},
                                   "spec": {"taints": new}}, _request_timeout=15)
            return None
        except Exception as exc:
            why = api_message(exc)
            if getattr(exc, "status", None) != 409:  # 409: changed since read; read it again
                return why
    return why
