"""Stored fleet runs read back into each node's history per workload, with its drift verdict and change points.

What `gpuvs fleet history`, the status page and the agent show (docs/history.md).
Every node a run named is kept, slow and drifting nodes first; nothing here renders anything."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuvs.fleet.assess import changepoint
from gpuvs.fleet.assess import drift
from gpuvs.fleet.assess import node_history as history
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.store.records import ExperimentRecord, latest_attempts

if TYPE_CHECKING:
    from gpuvs.store.db import Store

KIND = "fleet"

# The marks a node can carry, in the order of concern; a node's attention is its first mark's place.
MARKS = ("slow", "drifting slower", "failed", "changed", "drifting faster", "inconclusive", "slow within the margin",
         "ok")
LOOK = MARKS[:5]  # marks that make a node one to look at


@dataclass(frozen=True)
class RunRow:
    """What one stored fleet run said of one node (a failed or excluded node too)."""

    run_id: str
    time: float
    node: str
    verdict: str  # slower | faster | equivalent | inconclusive | reference | failed | excluded
    speed: float | None = None  # against the fleet band, below 1 slower
    speed_low: float | None = None
    speed_high: float | None = None
    mean: float | None = None
    n_ok: int = 0
    reason: str = ""

    @classmethod
    def of(cls, run_id: str, time: float, r: NodeRow) -> RunRow:
        return cls(run_id, time, r.node, r.verdict, r.speed, r.speed_low, r.speed_high, r.mean, r.n_ok, r.reason)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class RunInfo:
    """One stored fleet run of a workload."""

    run_id: str
    time: float
    nodes: int  # nodes measured
    slower: tuple[str, ...]  # nodes that run called slower than the fleet
    margin: float = 0.05  # that run's equivalence margin against the fleet band
    command: str = ""
    from_trials: bool = False  # its points were made again from the stored trials (rows without log speed)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "time": self.time, "nodes": self.nodes, "slower": list(self.slower),
                "margin": self.margin, "command": self.command, "from_trials": self.from_trials}


@dataclass
class NodeStanding:
    """One node for one workload: its history (a point per run where it was compared), what every run
    said of it, its drift verdict at the latest run and its change points."""

    node: str
    workload: str
    history: history.NodeHistory
    runs: list[RunRow]  # oldest first
    drift: drift.DriftVerdict | None
    changes: changepoint.NodeChanges | None
    latest_run_id: str | None = None  # the workload's latest run (the node may be missing from it)

    @property
    def latest(self) -> RunRow | None:
        """What the workload's latest run said of the node (None: not in that run)."""
        return next((r for r in self.runs if r.run_id == self.latest_run_id), None)

    @property
    def change(self) -> changepoint.ChangePoint | None:
        """The most recent change point: "since when?"."""
        return self.changes.latest if self.changes else None

    @property
    def marks(self) -> tuple[str, ...]:
        """Why a person should look at it, most pressing first (see MARKS); ("ok",) when nothing."""
        now = self.latest
        d = self.drift.verdict if self.drift else ""
        out = []
        if now is not None and now.verdict == "slower":
            out.append("slow")
        if d == "slower":
            out.append("drifting slower")
        if now is None or now.verdict == "failed":
            out.append("failed")
        if self.changes and self.changes.change_points:
            out.append("changed")
        if d == "faster":
            out.append("drifting faster")
        if now is not None and now.verdict == "inconclusive":
            out.append("inconclusive")
        if now is not None and now.verdict == "slower-within-margin":
            out.append("slow within the margin")
        return tuple(out) or ("ok",)

    @property
    def needs_look(self) -> bool:
        """Slow against the fleet, drifting from its own past, failed (or missing) in the latest run, or changed."""
        return any(m in LOOK for m in self.marks)

    @property
    def attention(self) -> int:
        """0 for the most pressing (slow against the fleet), up to len(MARKS) - 1 for a node that is fine."""
        return MARKS.index(self.marks[0])

    def sort_key(self) -> tuple[Any, ...]:
        ratio = self.drift.ratio if self.drift and self.drift.ratio is not None else math.inf
        speed = self.latest.speed if self.latest and self.latest.speed is not None else math.inf
        return self.attention, min(ratio, speed), self.node

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "workload": self.workload, "marks": list(self.marks),
                "needs_look": self.needs_look, "latest": self.latest.to_dict() if self.latest else None,
                "drift": self.drift.to_dict() if self.drift else None,
                "change": self.change.to_dict() if self.change else None,
                "change_points": [c.to_dict() for c in self.changes.change_points] if self.changes else [],
                "changes_reason": self.changes.reason if self.changes else "",
                "runs": [r.to_dict() for r in self.runs], "points": [p.to_dict() for p in self.history.points]}


@dataclass
class WorkloadStanding:
    """One workload's stored fleet runs: every node's standing, slow and drifting first."""

    workload: str
    unit: str
    higher_is_better: bool
    runs: list[RunInfo]  # oldest first
    drift: drift.DriftResult
    changes: changepoint.ChangeResult
    nodes: list[NodeStanding]

    @property
    def latest(self) -> RunInfo | None:
        return self.runs[-1] if self.runs else None

    def node(self, name: str) -> NodeStanding | None:
        return next((n for n in self.nodes if n.node == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = self.drift
        return {"workload": self.workload, "unit": self.unit, "higher_is_better": self.higher_is_better,
                "runs": [r.to_dict() for r in self.runs],
                "drift": {"confidence": d.confidence, "margin": d.margin, "window": d.window,
                          "min_history": d.min_history, "tested": d.tested, "method": d.method,
                          "interval_confidence": d.interval_confidence,
                          "spread": None if d.spread is None else {"sd": d.spread.sd, "df": d.spread.df,
                                                                   "within_sd": d.spread.within_sd,
                                                                   "between_sd": d.spread.between_sd}},
                "changes": {"confidence": self.changes.confidence, "min_segment": self.changes.min_segment,
                            "tested": self.changes.tested, "method": self.changes.method},
                "nodes": [n.to_dict() for n in self.nodes]}


@dataclass
class FleetHistory:
    """Everything read from one store: a WorkloadStanding per workload (sorted by name), and the fleet
    runs that could not be read, with why."""

    store: str
    workloads: list[WorkloadStanding]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def workload(self, name: str) -> WorkloadStanding | None:
        return next((w for w in self.workloads if w.workload == name), None)

    def nodes(self) -> list[str]:
        return sorted({n.node for w in self.workloads for n in w.nodes})

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "workloads": [w.to_dict() for w in self.workloads],
                "skipped": [{"run_id": i, "reason": r} for i, r in self.skipped]}


def fleet_runs(st: Store) -> tuple[list[tuple[ExperimentRecord, FleetResult]], list[tuple[str, str]]]:
    """Every stored fleet run with its result, oldest first; and those whose result cannot be read."""
    runs, skipped = [], []
    for listing in st.experiments():
        if listing.kind != KIND:
            continue
        exp = st.experiment(listing.id)
        if not exp.meta.fleet:
            skipped.append((exp.id, "no result kept (the run stopped before its verdicts)"))
            continue
        try:
            runs.append((exp, FleetResult.from_dict(exp.meta.fleet)))
        except (KeyError, TypeError, ValueError) as exc:
            skipped.append((exp.id, f"its result cannot be read ({type(exc).__name__}: {exc})"))
    return runs, skipped


def points_of(st: Store, exp: ExperimentRecord, result: FleetResult) -> tuple[list[history.HistoryPoint], bool]:
    """A run's points: from its rows, or (rows stored before they kept their log speed) from its trials.
    Second: whether the trials were used."""
    pts = history.points_from_fleet(result, exp.created)
    compared = [r for r in result.rows if r.speed is not None and r.verdict != "reference"]
    if pts or not compared:
        return pts, False
    values: dict[str, list[float]] = {}
    for t in latest_attempts(st.trials(exp.id, status="ok")):
        main = t.primary()
        if main is not None and main.value is not None:
            values.setdefault(t.arm, []).append(float(main.value))
    reference = next((r.node for r in result.rows if r.verdict == "reference"), None)
    said = {r.node: r.verdict for r in result.rows}
    return history.points_from_run(result.id, exp.created, result.workload, values,
                                   higher_is_better=result.higher_is_better, margin=result.margin, unit=result.unit,
                                   fleet_verdicts=said, reference=reference if reference in values else None,
                                   confidence=result.confidence), True


def read(st: Store, *, workload: str | None = None, window: int = drift.WINDOW, min_history: int = drift.MIN_HISTORY,
         margin: float = 0.05, confidence: float = 0.95) -> FleetHistory:
    """Each node's history per workload from the store's fleet runs, with drift verdicts (the latest run
    against the last `window` earlier ones, within ±`margin`) and change points, at `confidence` for the
    whole fleet per check. `workload`: that one only."""
    runs, skipped = fleet_runs(st)
    by_workload: dict[str, list[tuple[ExperimentRecord, FleetResult]]] = {}
    for exp, res in runs:  # a --per-gpu run's rows are GPUs, not nodes: not a point of a node's history
        if (workload is None or res.workload == workload) and not res.per_gpu:
            by_workload.setdefault(res.workload, []).append((exp, res))
    out = []
    for name in sorted(by_workload):
        out.append(_standing(st, name, by_workload[name], window=window, min_history=min_history, margin=margin,
                             confidence=confidence))
    return FleetHistory(str(st.path), out, skipped)


def _standing(st: Store, name: str, runs: list[tuple[ExperimentRecord, FleetResult]], *, window: int,
              min_history: int, margin: float, confidence: float) -> WorkloadStanding:
    runs = sorted(runs, key=lambda er: (er[0].created, er[0].id))
    points: list[history.HistoryPoint] = []
    rows: dict[str, list[RunRow]] = {}
    infos = []
    for exp, res in runs:
        pts, from_trials = points_of(st, exp, res)
        points += pts
        for r in res.rows:
            rows.setdefault(r.node, []).append(RunRow.of(res.id, exp.created, r))
        infos.append(RunInfo(res.id, exp.created, len(res.measured()),
                             tuple(r.node for r in res.rows if r.verdict == "slower"), res.margin, res.command,
                             from_trials))
    hists = history.histories(points)
    latest = infos[-1].run_id if infos else None
    d = drift.assess(hists, window=window, min_history=min_history, margin=margin, confidence=confidence,
                     latest=latest)
    c = changepoint.detect(hists, confidence=confidence)
    last = runs[-1][1]
    by_node = {h.node: h for h in hists}
    nodes = [NodeStanding(node, name, by_node.get(node, history.NodeHistory(node, name)), rows[node],
                          d.verdict(node), c.node(node), latest) for node in sorted(rows)]
    nodes.sort(key=NodeStanding.sort_key)
    return WorkloadStanding(name, last.unit, last.higher_is_better, infos, d, c, nodes)
