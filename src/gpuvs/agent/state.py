"""What the agent's metrics show, kept in memory and rebuilt from the store at start.

The latest figure per node and workload, each node's drift, validate's checks, the runs and the nodes gone.
A figure not renewed by the last run, or older than --stale-after, is stale: still shown, and marked.
Nothing is dropped: a node gone from the cluster keeps its last figures, marked gone (docs/deploy.md)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuvs.agent.ledger import RunRecord
from gpuvs.fleet.result import FleetResult
from gpuvs.fleet.assess.stored_history import FleetHistory

if TYPE_CHECKING:
    from gpuvs.fleet.execute.pair_run import PairFleetResult

PASS_STATUSES = ("pass", "shared")  # validate's row statuses that count as ok (shared: a finding, not a failure)


@dataclass
class NodeFigure:
    node: str
    workload: str
    ratio: float | None
    verdict: str
    low: float | None
    high: float | None
    measured_at: float  # when the run that measured it ended
    experiment: str
    renewed: bool = True  # the latest run that ran this workload renewed it


@dataclass
class GpuFigure:
    """One GPU's figure against the fleet's GPUs of its model, from a --per-gpu fleet (fleet/execute/pergpu.py)."""

    node: str
    gpu: int
    uuid: str
    workload: str
    ratio: float | None
    verdict: str
    measured_at: float
    experiment: str


@dataclass
class DriftFigure:
    """A node's latest run against its own earlier runs of a workload (stored.read's DriftVerdict)."""

    node: str
    workload: str
    verdict: str  # slower | faster | equivalent | inconclusive (than its own past)
    ratio: float | None  # below 1: slower than its past; None: too few earlier runs, ...
    low: float | None
    high: float | None
    run_id: str  # the fleet run judged (the workload's latest stored run)
    measured_at: float  # when that run was made


class LinkFigure(NodeFigure):
    """A node's links against the fleet's in the last pair fleet that judged it (PairNodeVerdict); renewed: the
    latest pair fleet of this workload judged the node. The fields of a node's figure."""


@dataclass
class PairFigure:
    """One pair's figure against the fleet's in the workload's last pair fleet (PairVerdict)."""

    a: str
    b: str
    workload: str
    ratio: float | None
    verdict: str
    low: float | None
    high: float | None
    cause: str  # a pair called slower: its member(s) called slower, or "link"
    measured_at: float
    experiment: str


@dataclass
class CheckState:
    check: str
    ok: bool
    status: str
    at: float
    renewed: bool = True


@dataclass
class State:
    stale_after_s: float
    figures: dict[tuple[str, str], NodeFigure] = field(default_factory=dict)
    # (node, gpu, uuid, workload) -> the GPU's figure in the workload's latest --per-gpu fleet that measured its node
    gpu_figures: dict[tuple[str, int, str, str], GpuFigure] = field(default_factory=dict)
    checks: dict[str, CheckState] = field(default_factory=dict)
    links: dict[tuple[str, str], LinkFigure] = field(default_factory=dict)  # (node, workload): from pair fleets
    pair_links: dict[tuple[str, str, str], PairFigure] = field(default_factory=dict)  # (a, b, workload)
    drift: dict[tuple[str, str], DriftFigure] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    cluster_nodes: set[str] | None = None  # the cluster's nodes at the last run that reached it (None: not known)
    workloads_now: set[str] | None = None  # the workloads the agent runs now (None: not known before a run)
    skipped: dict[str, str] = field(default_factory=dict)  # the last run's skipped nodes and why
    testing: set[str] = field(default_factory=set)
    runs: Counter = field(default_factory=Counter)  # (trigger, status) -> runs ended
    failed_trials: Counter = field(default_factory=Counter)  # (workload, reason) -> trials
    last_run_at: float | None = None  # when the last run ended, whatever its outcome
    last_success_at: float | None = None  # when the last ok run ended (every fleet judged its nodes)
    last_status: str | None = None  # the last ended run's status (ok, no-verdict, failed, interrupted)
    running: RunRecord | None = None
    api_ok: bool | None = None  # None: not asked yet
    api_error: str = ""
    store_ok: bool = True
    store_error: str = ""
    store_errors: int = 0
    started_at: float = field(default_factory=time.time)
    page_renders: int = 0  # the status page rendered (it is kept between runs)
    circuit_open: dict[str, bool] = field(default_factory=dict)  # workload -> the taint breaker stopped its last run
    lock: threading.RLock = field(default_factory=threading.RLock)

    def store_failed(self, message: str) -> None:
        with self.lock:
            self.store_ok, self.store_error = False, message
            self.store_errors += 1

    def store_worked(self) -> None:
        with self.lock:
            self.store_ok, self.store_error = True, ""

    def page_rendered(self) -> None:
        with self.lock:
            self.page_renders += 1

    def api(self, ok: bool, error: str = "") -> None:
        with self.lock:
            self.api_ok, self.api_error = ok, error

    def fleet(self, result: FleetResult, workload: str, at: float) -> None:
        """A fleet's rows: each measured node's figure is renewed; the others of this workload are not. A --per-gpu
        fleet's rows are GPUs: each measured node's GPU figures of the workload are replaced by this run's."""
        with self.lock:
            if result.per_gpu:
                rows = result.gpu_rows()
                nodes = {r.node for r in rows}
                for key in [k for k in self.gpu_figures if k[0] in nodes and k[3] == workload]:
                    del self.gpu_figures[key]
                for r in rows:
                    self.gpu_figures[(r.node, r.gpu, r.uuid or "", workload)] = GpuFigure(
                        r.node, r.gpu, r.uuid or "", workload, r.speed, r.verdict, at, result.id)
                return
            measured = set()
            for row in result.measured():
                self.figures[(row.node, workload)] = NodeFigure(row.node, workload, row.speed, row.verdict,
                                                                row.speed_low, row.speed_high, at, result.id)
                measured.add(row.node)
            for (node, w), fig in self.figures.items():
                if w == workload and node not in measured:
                    fig.renewed = False

    def pair_fleet(self, result: PairFleetResult, workload: str, at: float) -> None:
        """A pair fleet's verdicts: each judged node's links figure is renewed, the others of this workload are not;
        the workload's pairs are this run's."""
        with self.lock:
            judged = set()
            for v in result.outcome.nodes:
                if v.speed is None:
                    continue
                self.links[(v.node, workload)] = LinkFigure(v.node, workload, v.speed, v.verdict, v.ci_low, v.ci_high,
                                                            at, result.id)
                judged.add(v.node)
            for (node, w), fig in self.links.items():
                if w == workload and node not in judged:
                    fig.renewed = False
            for key in [k for k in self.pair_links if k[2] == workload]:
                del self.pair_links[key]
            for v in result.outcome.pairs:
                a, b = v.pair
                self.pair_links[(a, b, workload)] = PairFigure(a, b, workload, v.speed, v.verdict, v.ci_low, v.ci_high,
                                                               v.cause, at, result.id)

    def drift_from(self, history: FleetHistory) -> None:
        """Each node's drift verdict at its workload's latest stored run. A node not measured in that run keeps
        the drift it had (stale: not from the run of its latest figure)."""
        with self.lock:
            for w in history.workloads:
                latest = w.latest.run_id if w.latest else None
                for n in w.nodes:
                    v = n.drift
                    measured = any(p.run_id == latest for p in n.history.points)
                    if v is None or v.run_id is None or not measured:
                        continue
                    self.drift[(n.node, w.workload)] = DriftFigure(
                        n.node, w.workload, v.verdict, v.ratio, v.ci_low, v.ci_high, v.run_id,
                        v.time if v.time is not None else w.latest.time)

    def circuit(self, workload: str, is_open: bool) -> None:
        with self.lock:
            self.circuit_open[workload] = is_open

    def not_renewed(self, workload: str | None = None) -> None:
        """A run that measured nothing (of this workload, or of any): every figure it would have renewed."""
        with self.lock:
            for (node, w), fig in [*self.figures.items(), *self.links.items()]:
                if workload is None or w == workload:
                    fig.renewed = False
            if workload is None:
                for c in self.checks.values():
                    c.renewed = False

    def validate(self, checks: dict[str, str], at: float) -> None:
        with self.lock:
            for c in self.checks.values():
                c.renewed = False
            for name, status in checks.items():
                self.checks[name] = CheckState(name, status in PASS_STATUSES, status, at)

    def nodes_now(self, names: set[str]) -> None:
        """The cluster's nodes now: a node with figures that is not among them is gone (and back if it returns)."""
        with self.lock:
            self.gone = self.known_nodes() - names
            self.cluster_nodes = set(names)

    def known_nodes(self) -> set[str]:
        """The nodes with a figure against the fleet or of their links."""
        with self.lock:
            return {node for node, _ in self.figures} | {node for node, _ in self.links}

    def ended(self, run: RunRecord, at: float) -> None:
        with self.lock:
            self.runs[(run.trigger, run.status)] += 1
            self.last_run_at, self.last_status = at, run.status
            if run.status == "ok":  # only ok: a run whose fleets judged no node is no success
                self.last_success_at = at
            self.skipped = dict(run.skipped)
            for f in run.fleets:
                for reason, n in f.failed_trials.items():
                    self.failed_trials[(f.workload, reason)] += n
            self.running = None

    def current(self, workload: str) -> bool:
        """Whether the agent runs the workload now (unknown before its first run: every one). A retired
        workload's figures stay here and in the store; /metrics and the status page's count leave them out."""
        with self.lock:
            return self.workloads_now is None or workload in self.workloads_now

    def stale(self, fig: NodeFigure | CheckState | DriftFigure, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        if isinstance(fig, DriftFigure):
            perf = self.figures.get((fig.node, fig.workload))
            return perf is None or perf.experiment != fig.run_id or self.stale(perf, now)
        at = fig.measured_at if isinstance(fig, NodeFigure) else fig.at  # a LinkFigure is a NodeFigure
        gone = isinstance(fig, NodeFigure) and fig.node in self.gone
        return gone or not fig.renewed or now - at > self.stale_after_s
