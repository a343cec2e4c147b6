"""What a fleet run found, as typed records: a NodeRow per node, excluded ones included, in a FleetResult.

The FleetResult also holds the plan, how the error rate was held, and the labels written. Every report renders it.
The store keeps its to_dict() in the experiment's meta (`fleet`), and from_dict() reads it back."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from gpuvs.fleet.execute.adaptive import AdaptiveTrials
from gpuvs.fleet.assess.node_verdicts import ErrorControl
from gpuvs.probes.gpu_health import GpuHealth
from gpuvs.store.records import known_fields


@dataclass
class NodeRow:
    node: str
    verdict: str  # slower | faster | equivalent | inconclusive | reference | failed | excluded
    reason: str = ""
    n_ok: int = 0
    n_trials: int = 0
    mean: float | None = None
    speed: float | None = None  # relative to the fleet; below 1 is slower, whatever the unit
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    speed_low: float | None = None
    speed_high: float | None = None
    # log(speed) against the node's reference with its standard error and (Welch) df, as one run's point of
    # the node's history needs it (history.points_from_fleet); None where the node was not compared, and in
    # results stored before they were kept
    log_speed: float | None = None
    se: float | None = None
    df: float | None = None
    level_se: float | None = None  # the trials' relative standard deviation / sqrt(n): the se of log(mean)
    p_adjusted: float | None = None  # of the verdict that was reached (different or equivalent)
    reference: list[str] = field(default_factory=list)
    differs: dict[str, list[Any]] = field(default_factory=dict)  # label -> [its value, the majority's]
    fingerprint: dict[str, Any] = field(default_factory=dict)  # the worker's, plus the kubelet's under `node`
    # each GPU's NVML health over the node's trials (probes/gpu_health.py), and for a slow or slower-within-margin
    # node what of it differs from its peers (fleet/assess/causes.py); both empty on a CPU and in earlier results
    health: list[GpuHealth] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    # with --per-gpu (fleet/execute/pergpu.py) the row is one GPU of `node`: its index on the node and the id its pod was
    # handed (the device plugin's: a GPU UUID with NVIDIA's); None in a node's row and in earlier results
    gpu: int | None = None
    uuid: str | None = None

    _SINCE = ("log_speed", "se", "df", "level_se", "gpu", "uuid")  # kept since the typed model: written where known
    _WHERE_READ = ("health", "why")  # written where there are any

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if (f.name not in self._SINCE or getattr(self, f.name) is not None)
               and (f.name not in self._WHERE_READ or getattr(self, f.name))}
        if "health" in out:
            out["health"] = [h.to_dict() for h in self.health]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeRow:
        known = known_fields(cls, data)
        known["health"] = [GpuHealth.from_dict(h) for h in data.get("health") or []]
        return cls(**known)


@dataclass
class NodeLabels:
    """The gpuvs.io labels and annotation planned for one node, and what became of them (written, a dry run,
    or the API's refusal)."""

    node: str
    labels: dict[str, str]
    annotations: dict[str, str]
    status: str


@dataclass
class NodeSignal:
    """One thing done (or planned) on one node for the cluster's tools (fleet/cluster/signals.py): what (condition, event,
    taint), its detail, and what became of it."""

    node: str
    what: str  # condition | event | taint
    detail: str
    status: str  # written | created | bumped (count N) | rate-limited ... | dry run: not written | refused: ... | error


@dataclass
class FleetResult:
    id: str
    workload: str
    unit: str
    higher_is_better: bool
    margin: float
    confidence: float
    plan: AdaptiveTrials
    control: ErrorControl
    looks_used: int
    rows: list[NodeRow]
    command: str = ""
    labels: list[NodeLabels] = field(default_factory=list)  # planned/written label changes
    signals: list[NodeSignal] = field(default_factory=list)  # condition, events, taints (opt-in)
    circuit_open: bool = False  # the taint's circuit breaker left a slower node untainted
    seconds: float = 0.0
    per_gpu: bool = False  # one row per GPU (--per-gpu), not per node

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "plan":
                value = dataclasses.asdict(value)
            elif f.name == "control":
                value = value.to_dict()
            elif f.name == "rows":
                value = [r.to_dict() for r in value]
            elif f.name in ("signals", "circuit_open", "per_gpu") and not value:
                continue  # kept where something was asked for (--condition, --taint): older results read alike
            elif f.name in ("labels", "signals"):
                value = [dataclasses.asdict(lab) for lab in value]
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FleetResult:
        known = known_fields(cls, data)
        known["plan"] = AdaptiveTrials(**known_fields(AdaptiveTrials, data["plan"]))
        known["control"] = ErrorControl(**known_fields(ErrorControl, data["control"]))
        known["rows"] = [NodeRow.from_dict(r) for r in data.get("rows") or []]
        known["labels"] = [NodeLabels(**known_fields(NodeLabels, lab)) for lab in data.get("labels") or []]
        known["signals"] = [NodeSignal(**known_fields(NodeSignal, s)) for s in data.get("signals") or []]
        return cls(**known)

    def gpu_rows(self) -> list[NodeRow]:
        """The measured rows of single GPUs (--per-gpu); [] in a fleet of node rows."""
        return [r for r in self.measured() if r.gpu is not None]

    def measured(self) -> list[NodeRow]:
        return [r for r in self.rows if r.verdict not in ("excluded", "failed")]
