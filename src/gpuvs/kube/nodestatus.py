"""gpuvs's own NodeCondition, GpuvsPerformance, in a node's status.conditions.

A strategic merge patch of nodes/status keyed on the condition's type, so the kubelet's conditions are never touched.
True when the problem is present (the node is slower), False when it reads well, Unknown when the run could not tell.
Without the opt-in rights (`gpuvs deploy --condition`) the API's 403 comes back as one line, never an exception."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

CONDITION = "GpuvsPerformance"
NOT_GRANTED = ("nodes/status is not granted to this account (deploy with `gpuvs deploy --condition`, "
               "deploy/node-status); the labels are written without the condition")


@dataclass
class Written:
    """What became of one node's condition: the previous reason (None: it had none), and the error if any."""

    node: str
    reason: str
    previous: str | None
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.previous != self.reason


def stamp(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def current(node_obj: Any) -> dict[str, Any] | None:
    """gpuvs's condition as the node carries it now (a dict with status, reason, lastTransitionTime), or None."""
    for c in (getattr(node_obj.status, "conditions", None) or []) if node_obj is not None else []:
        if c.type == CONDITION:
            lt = c.last_transition_time
            return {"status": c.status, "reason": c.reason, "message": c.message,
                    "lastTransitionTime": lt if isinstance(lt, str) or lt is None else lt.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return None


def condition(status: str, reason: str, message: str, before: dict[str, Any] | None, now: float | None = None
              ) -> dict[str, Any]:
    """The condition to write: lastTransitionTime is the one before when status and reason did not change."""
    t = stamp(now)
    same = before is not None and before["status"] == status and before["reason"] == reason
    return {"type": CONDITION, "status": status, "reason": reason, "message": message[:1024],
            "lastHeartbeatTime": t, "lastTransitionTime": before["lastTransitionTime"] if same and
            before.get("lastTransitionTime") else t}


def write(core: Any, node: str, status: str, reason: str, message: str, now: float | None = None) -> Written:
    """Read the node's condition, then patch nodes/status with the new one (strategic merge on status.conditions:
    the kubelet's conditions stay). A refusal or a node gone is the Written's error, one line."""
    from gpuvs.kube.client import api_message

    try:
        before = current(core.read_node(node, _request_timeout=15))
    except Exception as exc:
        return Written(node, reason, None, f"node {node} could not be read: {api_message(exc)}")
    body = {"status": {"conditions": [condition(status, reason, message, before, now)]}}
    try:
        core.patch_node_status(node, body, _request_timeout=15)
    except Exception as exc:
        why = NOT_GRANTED if getattr(exc, "status", None) == 403 else api_message(exc)
        return Written(node, reason, before["reason"] if before else None, why)
    return Written(node, reason, before["reason"] if before else None)


def remove(core: Any, node: str) -> str | None:
    """Take gpuvs's condition out of the node's status (a strategic merge patch deleting the list item of its
    type; the kubelet's conditions stay). None, or why not in one line (a node gone meanwhile is fine)."""
    from gpuvs.kube.client import api_message

    body = {"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}}
    try:
        core.patch_node_status(node, body, _request_timeout=15)
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        why = api_message(exc)
        return f"{why} (it needs patch on nodes/status)" if getattr(exc, "status", None) == 403 else why
    return None
