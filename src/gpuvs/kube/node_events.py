"""Events on a Node (core/v1 Event, involvedObject the Node), as `kubectl describe node` shows them.

Rate-limited per node and reason: one Event object per (node, reason); a repeat within EVERY_S is not written.
Later, a repeat bumps that object's count and lastTimestamp, as the kubelet's own event correlator does.
A Node's Events live in `default`, the only namespace they are taken in (rights: `gpuvs deploy --condition`)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

NAMESPACE = "default"
EVERY_S = 600.0  # at most one event per node and reason per 10 minutes
COMPONENT = "gpuvs"
CONTROLLER = "gpuvs.io/agent"


@dataclass
class Posted:
    node: str
    reason: str
    outcome: str  # created | bumped (count N) | rate-limited | dry run | an error, one line


def name(node: str, reason: str) -> str:
    return f"{node}.gpuvs-{reason.lower()}"[:253]


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        import calendar

        return float(calendar.timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S")))
    return value.timestamp()


def post(core: Any, node: str, reason: str, message: str, *, warning: bool, now: float | None = None,
         every_s: float = EVERY_S) -> Posted:
    """One event on the node (see the module's doc for the rate limit); never raises: an error is the outcome."""
    from gpuvs.kube.client import api_message

    now = time.time() if now is None else now
    ev_name = name(node, reason)
    try:
        try:
            old = core.read_namespaced_event(ev_name, NAMESPACE, _request_timeout=15)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
            old = None
        if old is not None:
            last = _epoch(old.last_timestamp)
            if last is not None and now - last < every_s:
                return Posted(node, reason, f"rate-limited (the same event {now - last:.0f} s ago)")
            count = (old.count or 1) + 1
            core.patch_namespaced_event(ev_name, NAMESPACE, {"count": count, "lastTimestamp": _stamp(now),
                                                             "message": message[:1024]}, _request_timeout=15)
            return Posted(node, reason, f"bumped (count {count})")
        # uid: the node's name, as the kubelet writes its own: `kubectl describe node` looks up that uid (1.20 only
        # that one; later releases the node's real uid too)
        body = {"metadata": {"name": ev_name, "namespace": NAMESPACE},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
                "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT}, "reportingComponent": CONTROLLER,
                "reportingInstance": socket.gethostname()[:128], "count": 1,
                "firstTimestamp": _stamp(now), "lastTimestamp": _stamp(now)}
        core.create_namespaced_event(NAMESPACE, body, _request_timeout=15)
        return Posted(node, reason, "created")
    except Exception as exc:
        why = api_message(exc)
        if getattr(exc, "status", None) == 403:
            why = (f"events in {NAMESPACE} are not granted to this account (deploy with `gpuvs deploy --condition`, "
                   f"deploy/node-status): {why}")
        return Posted(node, reason, why)
