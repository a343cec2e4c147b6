"""`gpuvs fleet history` as one library call. run_fleet_history reads a store's fleet runs into each node's
standing and drift (stored.read). When asked, it writes one workload's drift on its nodes as labels and
conditions (labels.py, signals.py). A HistoryRequest says what is asked, HistoryHooks tell what happens on the
way; nothing here prints or renders."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from gpuvs.errors import UsageError
from gpuvs.fleet.assess import drift
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.cluster import signals
from gpuvs.fleet.assess import stored_history as stored
from gpuvs.fleet.result import NodeLabels, NodeSignal
from gpuvs.params import Param, refuse_unknown, shown
from gpuvs.store.db import open_existing

READ = (  # how the stored runs are read and judged
    Param("workload", str, None, "only this workload (default: every workload with stored fleet runs)"),
    Param("window", int, drift.WINDOW, "earlier runs the latest run is compared with (drift)", min=3, max=1000),
    Param("margin", float, 0.05, "equivalence margin of a node against its own past (0.05: ±5%)", min=0.0, max=0.5),
    Param("confidence", float, 0.95, "1 - the false-alarm rate for the whole fleet, per check", min=0.5, max=0.999),
)
WRITE = (  # whether the drift is written on the nodes, and on which cluster
    Param("label", bool, False, "write gpuvs.io/drift (the verdict: slower, equivalent, ...; docs/vocabulary.md) and "
          "gpuvs.io/drift-ratio on the nodes of the latest run (needs one workload)"),
    Param("condition", bool, False, "with --label: the NodeCondition GpuvsPerformance=True DriftingSlower on a node "
          "drifting slower (cleared when it no longer is), with an Event (needs gpuvs deploy --condition's rights)"),
    Param("dry_run", bool, False, "with --label: show the labels, write nothing"),
    Param("kubeconfig", str, None, "with --label: kubeconfig file (default: KUBECONFIG, ~/.kube/config, else "
          "in-cluster)"),
    Param("context", str, None, "with --label: kubeconfig context"),
)
PARAMS = READ + WRITE  # the request's options; the command line adds the report's format and file, and --store


@dataclass(frozen=True)
class HistoryRequest:
    """What `gpuvs fleet history` is asked. Each value is checked by its Param when the request is made, then
    against the others. A request that exists can run."""

    node: str | None = None  # only this node (its drift is still judged against the whole fleet)
    workload: str | None = None
    window: int = drift.WINDOW
    margin: float = 0.05
    confidence: float = 0.95
    label: bool = False
    condition: bool = False
    dry_run: bool = False
    kubeconfig: str | None = None
    context: str | None = None

    def __post_init__(self) -> None:
        for p in PARAMS:  # a library caller's "10" or None reads as the command line's 10 or the default
            value = p.coerce(getattr(self, p.name))
            object.__setattr__(self, p.name, p.default if value is None else value)
        if self.node is not None and not isinstance(self.node, str):
            raise UsageError(f"node: {shown(self.node)} is not allowed; expected a node's name")
        if self.dry_run and not self.label:
            raise UsageError("--dry-run applies with --label (it shows the labels instead of writing them)")
        if self.condition and not self.label:
            raise UsageError("--condition applies with --label (the node's drift is written as labels first)")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> HistoryRequest:
        """From a plain mapping of option names and `node` (the command line's values, an agent's settings). A
        name left out takes its default; an unknown one is one line."""
        refuse_unknown(values, [f.name for f in dataclasses.fields(cls)], "gpuvs fleet history")
        return cls(**values)


@dataclass
class HistoryHooks:
    """What a caller hears; every one optional. on_read: the store read and every check passed (the cluster
    reached where labels are written), before anything is written. on_labels: the labels, as written or
    planned, before the conditions."""

    on_read: Callable[[stored.FleetHistory], None] | None = None
    on_labels: Callable[[list[NodeLabels]], None] | None = None


@dataclass
class HistoryResult:
    """What `gpuvs fleet history` found (every workload's standing) and, with --label, what it wrote."""

    history: stored.FleetHistory
    node: str | None = None
    labels: list[NodeLabels] = field(default_factory=list)
    signals: list[NodeSignal] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"history": self.history.to_dict(), "node": self.node,
                "labels": [dataclasses.asdict(x) for x in self.labels],
                "signals": [dataclasses.asdict(x) for x in self.signals]}


def run_fleet_history(request: HistoryRequest, store: str | Path, hooks: HistoryHooks | None = None
                      ) -> HistoryResult:
    """Read `store`'s fleet runs as `request` asks; with `label`, write the drift of the one workload's nodes
    measured in its latest run. A store without the runs, node or workload asked for is a UsageError, raised
    before anything is written. So is a cluster that cannot be reached."""
    hooks = hooks or HistoryHooks()
    r = request
    with open_existing(store) as st:
        found = stored.read(st, workload=r.workload, window=r.window, margin=r.margin, confidence=r.confidence)
        if not found.workloads:
            every = sorted({res.workload for _, res in stored.fleet_runs(st)[0]})
            if every:
                raise UsageError(f"--workload {r.workload}: no stored fleet run of it in {store} (workloads: "
                                 f"{', '.join(every)})")
            raise UsageError(f"no stored gpuvs fleet run in {store} (run gpuvs fleet WORKLOAD --store {store} first)")
    if r.node is not None and r.node not in found.nodes():
        raise UsageError(f"no node {r.node!r} in the stored fleet runs of {store} (nodes: {', '.join(found.nodes())})")
    if r.label and len(found.workloads) > 1:
        raise UsageError("--label writes one workload's drift: give --workload (stored: "
                         f"{', '.join(w.workload for w in found.workloads)})")
    core = None
    if r.label and not r.dry_run:  # a cluster that cannot be reached says so before anything is shown
        from gpuvs.kube import client

        core = client.connect(r.kubeconfig, r.context).core
    if hooks.on_read:
        hooks.on_read(found)
    result = HistoryResult(found, r.node)
    if not r.label:
        return result
    w = found.workloads[0]
    measured = [n for n in w.nodes if r.node is None or n.node == r.node]
    changes = labels.plan_drift(measured, workload=w.workload)
    status = labels.write(core, changes, dry_run=core is None)
    result.labels = [NodeLabels(c.node, c.labels, c.annotations, status[c.node]) for c in changes]
    if hooks.on_labels:
        hooks.on_labels(result.labels)
    if r.condition:
        result.signals = signals.act_drift(core, measured, workload=w.workload, dry_run=core is None)
    return result
