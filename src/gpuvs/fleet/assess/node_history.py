"""Each node's history across stored fleet runs: a HistoryPoint per node and run, a NodeHistory per node.

drift.py and changepoint.py work on these, and so can the CLI, the agent and a status page.
Nothing here reads the store or renders anything."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import special

from gpuvs.fleet.assess import node_verdicts as verdicts
from gpuvs.fleet.result import FleetResult


@dataclass(frozen=True)
class HistoryPoint:
    """One node in one fleet run. level: its own figure on the log scale, signed so that higher is
    faster (log figure, or -log figure where lower is better), with level_se from the run's trials.
    speed = exp(log_speed): its speed against the fleet band of its peers in that run, as `gpuvs fleet`
    compared them (below 1: slower, whatever the unit), with the run's own interval (not simultaneous
    over nodes; `confidence`)."""

    run_id: str
    time: float  # unix seconds (the store's `created`)
    workload: str
    node: str
    figure: float  # the node's mean figure in that run, in the workload's unit
    unit: str
    level: float
    level_se: float  # the trials' relative standard deviation / sqrt(n_trials)
    log_speed: float
    se: float  # standard error of log_speed within the run (Welch's, from the trials)
    df: float
    n_trials: int
    reference: tuple[str, ...]  # the peers it was compared with (their trials pooled)
    verdict: str = ""  # that run's fleet verdict for the node (slower, equivalent, ...), where known
    confidence: float = 0.95

    @property
    def speed(self) -> float:
        return math.exp(self.log_speed)

    @property
    def interval(self) -> tuple[float, float]:
        if not self.se > 0:
            return self.speed, self.speed
        q = t_quantile(1 - (1 - self.confidence) / 2, self.df)
        return math.exp(self.log_speed - q * self.se), math.exp(self.log_speed + q * self.se)

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {**asdict(self), "reference": list(self.reference), "speed": self.speed, "speed_low": low,
                "speed_high": high}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HistoryPoint:
        names = cls.__dataclass_fields__
        d = {k: v for k, v in data.items() if k in names}
        d["reference"] = tuple(d.get("reference") or ())
        return cls(**d)


@dataclass(frozen=True)
class NodeHistory:
    """One node's points for one workload, oldest first (by time, then run id)."""

    node: str
    workload: str
    points: tuple[HistoryPoint, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return len(self.points)

    @property
    def latest(self) -> HistoryPoint | None:
        return self.points[-1] if self.points else None

    @property
    def log_speeds(self) -> list[float]:
        return [p.log_speed for p in self.points]

    @property
    def levels(self) -> list[float]:
        return [p.level for p in self.points]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "workload": self.workload, "points": [p.to_dict() for p in self.points]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeHistory:
        return cls(data["node"], data["workload"], tuple(HistoryPoint.from_dict(p) for p in data["points"]))


def t_quantile(p: float, df: float) -> float:
    return float(special.ndtri(p)) if math.isinf(df) else float(special.stdtrit(df, p))


def points_from_run(run_id: str, time: float, workload: str, values: Mapping[str, Sequence[float]], *,
                    higher_is_better: bool, margin: float, unit: str = "",
                    fleet_verdicts: Mapping[str, str] | None = None, reference: str | None = None,
                    confidence: float = 0.95) -> list[HistoryPoint]:
    """The points of one fleet run from its successful trials' figures ({node: [figure per trial]}, as
    the store keeps them): each node's level (log mean figure, signed) with its standard error, and
    its speed against the fleet band of its peers exactly as `gpuvs fleet` compared them
    (verdicts.band_speeds). `fleet_verdicts`: that run's verdict per node, where known. A node with
    fewer than 2 trials, or with no peer to compare with, has no point in that run."""
    speeds = verdicts.band_speeds(values, higher_is_better=higher_is_better, margin=margin, reference=reference)
    said = fleet_verdicts or {}
    sign = 1.0 if higher_is_better else -1.0
    out = []
    for node, b in speeds.items():
        trials = np.asarray(values[node], float)
        level_se = float(trials.std(ddof=1) / b.mean / math.sqrt(trials.size))
        out.append(HistoryPoint(run_id, float(time), workload, node, b.mean, unit, sign * math.log(b.mean), level_se,
                                b.log_speed, b.se, b.df, b.n, b.reference, said.get(node, ""), confidence))
    return out


def points_from_fleet(result: FleetResult, time: float) -> list[HistoryPoint]:
    """The points of one stored fleet run from its own rows (FleetResult, as `gpuvs fleet` keeps it with
    the experiment; `time`: the experiment's `created`): each compared node's log speed against its
    reference, with its standard error and df, as the run computed them (the same figures points_from_run
    makes again from the run's trials). Rows without them (the reference node, failed or excluded nodes,
    results stored before rows kept them) have no point; for those runs, points_from_run on the stored
    trials gives them."""
    sign = 1.0 if result.higher_is_better else -1.0
    return [HistoryPoint(result.id, float(time), result.workload, r.node, r.mean, result.unit,
                         sign * math.log(r.mean), r.level_se, r.log_speed, r.se, r.df, r.n_ok, tuple(r.reference),
                         r.verdict, result.confidence)
            for r in result.rows if r.log_speed is not None and r.mean and r.level_se is not None]


def histories(points: Iterable[HistoryPoint]) -> list[NodeHistory]:
    """Points of many runs, gathered per (workload, node) and ordered in time (then by run id); sorted by
    workload and node. A node listed twice in one run keeps the last point given."""
    by: dict[tuple[str, str], dict[str, HistoryPoint]] = {}
    for p in points:
        by.setdefault((p.workload, p.node), {})[p.run_id] = p
    return [NodeHistory(node, workload, tuple(sorted(runs.values(), key=lambda p: (p.time, p.run_id))))
            for (workload, node), runs in sorted(by.items())]
