"""What the cluster's own tools act on, from a fleet's verdicts, each opt-in: a NodeCondition, Events, a taint.

The condition's reason comes from the verdict (docs/vocabulary.md); an Event is posted when it changes.
--dry-run says what would be done and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuvs.fleet.cluster import taints as fleet_taints
from gpuvs.fleet import vocabulary
from gpuvs.fleet.result import NodeRow, NodeSignal
from gpuvs.kube import SLOW_TAINT, nodestatus
from gpuvs.kube import node_events as events

DRY = "dry run: not written"


@dataclass
class SignalOptions:
    condition: bool = False
    taint: bool = False
    taint_effect: str = "NoSchedule"
    taint_max_share: float = fleet_taints.DEFAULT_SHARE
    dry_run: bool = False


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.3f}"


def message(row: NodeRow, workload: str, experiment_id: str) -> str:
    """The condition's message: the ratio, its interval, the GPU, the cause where known, the run."""
    parts = [f"{row.verdict}: {_num(row.speed)}x its peers [{_num(row.speed_low)}-{_num(row.speed_high)}]"
             if row.speed is not None else f"{row.verdict}: {row.reason or 'no figure'}"]
    gpu = (row.fingerprint or {}).get("gpu_name")
    if gpu:
        parts.append(f"GPU {gpu}")
    if row.differs:
        parts.append("differs from the majority: " + ", ".join(f"{k} {v[0]} (most: {v[1]})"
                                                                for k, v in sorted(row.differs.items())))
    if row.why:  # NVML's readings that differ from its peers' (fleet/assess/causes.py), where any were read
        parts.append("why: " + "; ".join(row.why))
    parts.append(f"workload {workload}, gpuvs run {experiment_id}")
    return "; ".join(parts)


def act(core: Any, rows: list[NodeRow], *, experiment_id: str, workload: str, o: SignalOptions,
        gpu_nodes: list[Any], log: Any = None) -> tuple[list[NodeSignal], bool]:
    """Condition and events (o.condition), taints (o.taint) for the measured rows; ([NodeSignal], circuit open).
    gpu_nodes: every GPU node of the cluster (fleet.nodes.NodeInfo: name, taints), the breaker's whole."""
    out: list[NodeSignal] = []
    measured = [r for r in rows if r.verdict not in ("excluded", "failed")]
    say = log or (lambda line: None)
    if o.condition:
        for r in measured:
            status, reason = vocabulary.condition(r.verdict, against="peers")
            text = message(r, workload, experiment_id)
            detail = f"{nodestatus.CONDITION}={status} {reason}"
            if o.dry_run:
                out.append(NodeSignal(r.node, "condition", detail, DRY))
                continue
            w = nodestatus.write(core, r.node, status, reason, text)
            out.append(NodeSignal(r.node, "condition", detail, w.error or "written"))
            if w.error:
                say(f"node {r.node}: condition not written: {w.error}")
            if w.error and w.error == nodestatus.NOT_GRANTED:
                previous = None  # unknown: post the event as for a first verdict
            else:
                previous = w.previous
            if previous != reason and (previous is not None or reason != "Ok"):
                p = events.post(core, r.node, reason, text, warning=status == "True")
                out.append(NodeSignal(r.node, "event", f"{'Warning' if status == 'True' else 'Normal'} {reason}",
                                      p.outcome))
    circuit_open = False
    if o.taint:
        tainted = {n.name for n in gpu_nodes if any(t.get("key") == SLOW_TAINT for t in n.taints)}
        ordered = sorted(measured, key=lambda r: (r.speed is None, r.speed or 0.0))
        p = fleet_taints.plan([(r.node, r.verdict) for r in ordered], tainted=tainted, gpu_nodes=len(gpu_nodes),
                              share=o.taint_max_share)
        circuit_open = p.circuit_open
        spec = f"{SLOW_TAINT}=true:{o.taint_effect}"
        for c in p.changes:
            if c.action == "keep":
                out.append(NodeSignal(c.node, "taint", spec, "kept (already tainted)"))
            elif c.action == "refused":
                say(f"node {c.node}: not tainted: {c.detail}")
                out.append(NodeSignal(c.node, "taint", spec, f"refused: {c.detail}"))
            elif o.dry_run:
                out.append(NodeSignal(c.node, "taint", ("" if c.action == "taint" else "remove ") + spec, DRY))
            else:
                why = fleet_taints.set_taint(core, c.node, o.taint_effect if c.action == "taint" else None)
                out.append(NodeSignal(c.node, "taint", ("" if c.action == "taint" else "remove ") + spec,
                                      why or ("tainted" if c.action == "taint" else "untainted")))
                if why:
                    say(f"node {c.node}: {c.action} failed: {why}")
    return out, circuit_open


def validate_failed(core: Any, node: str, check: str, detail: str, dry_run: bool = False) -> NodeSignal:
    """An event on the node a validate run found failing (its first failed check)."""
    text = f"gpuvs validate: {check} failed: {detail}"[:1024]
    if dry_run:
        return NodeSignal(node, "event", "Warning ValidateFailed", DRY)
    p = events.post(core, node, "ValidateFailed", text, warning=True)
    return NodeSignal(node, "event", "Warning ValidateFailed", p.outcome)


def act_drift(core: Any, standings: list[Any], *, workload: str, dry_run: bool = False) -> list[NodeSignal]:
    """`gpuvs fleet history --label --condition`: the condition from each node's drift (stored.NodeStanding) where
    it says DriftingSlower, or where the node's condition says DriftingSlower and its drift no longer does (then
    what the drift says now). A node's condition from its peers (SlowerThanPeers, Ok, ...) is left to the fleet
    runs that write it: the drift never clears a verdict against the peers. An Event as for act()."""
    out: list[NodeSignal] = []
    for n in standings:
        v = n.drift
        if v is None or v.run_id is None:
            continue
        status, reason = vocabulary.condition(v.verdict, against="past")
        detail = f"{nodestatus.CONDITION}={status} {reason}"
        if dry_run:
            if reason == "DriftingSlower":
                out.append(NodeSignal(n.node, "condition", detail, DRY))
            continue
        try:
            before = nodestatus.current(core.read_node(n.node, _request_timeout=15))
        except Exception as exc:
            from gpuvs.kube.client import api_message

            out.append(NodeSignal(n.node, "condition", detail, f"node {n.node} could not be read: {api_message(exc)}"))
            continue
        if reason != "DriftingSlower" and (before is None or before["reason"] != "DriftingSlower"):
            continue
        text = (f"{v.verdict} than its own past: {_num(v.ratio)}x [{_num(v.ci_low)}-{_num(v.ci_high)}]; workload "
                f"{workload}, gpuvs run {v.run_id}")
        w = nodestatus.write(core, n.node, status, reason, text)
        out.append(NodeSignal(n.node, "condition", detail, w.error or "written"))
        if not w.error and w.changed:
            p = events.post(core, n.node, reason, text, warning=status == "True")
            out.append(NodeSignal(n.node, "event", f"{'Warning' if status == 'True' else 'Normal'} {reason}",
                                  p.outcome))
    return out
