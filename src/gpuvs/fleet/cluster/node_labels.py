"""Node labels from a fleet's verdicts, written only when asked (--label), shown with --dry-run.

gpuvs.io/perf, gpuvs.io/drift and gpuvs.io/links hold the verdict in docs/vocabulary.md's words.
Each has a -ratio label and a -details annotation (JSON); --per-gpu adds gpuvs.io/slow-gpus.
gpuvs never cordons a node; conditions, Events and the taint are fleet/cluster/signals.py's (docs/fleet.md)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from gpuvs.fleet.result import NodeRow
from gpuvs.fleet.cluster.signals import DRY
from gpuvs.fleet.vocabulary import word

PERF = "gpuvs.io/perf"
RATIO = "gpuvs.io/perf-ratio"
DETAILS = "gpuvs.io/perf-details"
SLOW_GPUS = "gpuvs.io/slow-gpus"
WORST_FIRST = ("slower", "slower-within-margin", "inconclusive", "equivalent", "faster-within-margin", "faster",
               "reference")


@dataclass
class LabelChange:
    node: str
    labels: dict[str, str]
    annotations: dict[str, str]

    def patch(self) -> dict[str, Any]:
        """A merge patch of the node's metadata (labels and annotations only)."""
        return {"metadata": {"labels": self.labels, "annotations": self.annotations}}


def plan(rows: list[NodeRow], *, experiment_id: str, workload: str) -> list[LabelChange]:
    """The labels of the measured nodes (excluded and failed nodes are left as they are)."""
    if any(r.gpu is not None for r in rows):
        return plan_gpus(rows, experiment_id=experiment_id, workload=workload)
    out = []
    for r in rows:
        if r.verdict in ("excluded", "failed"):
            continue
        labels = {PERF: word(r.verdict)}
        if r.speed is not None:
            labels[RATIO] = f"{r.speed:.3f}"
        details = {"experiment": experiment_id, "workload": workload, "verdict": r.verdict, "speed": r.speed,
                   "interval": [r.speed_low, r.speed_high], "reference": r.reference, "trials": r.n_ok,
                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out.append(LabelChange(r.node, labels, {DETAILS: json.dumps(details, sort_keys=True)}))
    return out


LINKS = "gpuvs.io/links"
LINKS_RATIO = "gpuvs.io/links-ratio"
LINKS_DETAILS = "gpuvs.io/links-details"


def plan_links(nodes: list[Any], *, experiment_id: str, workload: str) -> list[LabelChange]:
    """A pair fleet's labels: each judged node's verdict (pair_verdicts.PairNodeVerdict) and speed; a node
    with no verdict (fewer than 2 measured pairs) is left as it is."""
    out = []
    for v in nodes:
        if v.speed is None:
            continue
        details = {"experiment": experiment_id, "workload": workload, "verdict": v.verdict, "speed": v.speed,
                   "interval": [v.ci_low, v.ci_high], "partners": v.partners,
                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out.append(LabelChange(v.node, {LINKS: word(v.verdict), LINKS_RATIO: f"{v.speed:.3f}"},
                               {LINKS_DETAILS: json.dumps(details, sort_keys=True)}))
    return out


def plan_gpus(rows: list[NodeRow], *, experiment_id: str, workload: str) -> list[LabelChange]:
    """A --per-gpu fleet's labels, one change per node of its GPU rows: gpuvs.io/slow-gpus=<count of slower
    GPUs>, gpuvs.io/perf its worst GPU's word, gpuvs.io/perf-ratio its slowest GPU's speed."""
    by_node: dict[str, list[NodeRow]] = {}
    for r in rows:
        if r.gpu is not None and r.verdict not in ("excluded", "failed"):
            by_node.setdefault(r.node, []).append(r)
    out = []
    for node, gpus in by_node.items():
        gpus.sort(key=lambda r: r.gpu)
        worst = min((word(r.verdict) for r in gpus), key=WORST_FIRST.index)
        labels = {PERF: worst, SLOW_GPUS: str(sum(r.verdict == "slower" for r in gpus))}
        speeds = [r.speed for r in gpus if r.speed is not None]
        if speeds:
            labels[RATIO] = f"{min(speeds):.3f}"
        details = {"experiment": experiment_id, "workload": workload, "verdict": worst,
                   "gpus": [{"gpu": r.gpu, "uuid": r.uuid, "verdict": r.verdict, "speed": r.speed,
                             "interval": [r.speed_low, r.speed_high], "trials": r.n_ok} for r in gpus],
                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out.append(LabelChange(node, labels, {DETAILS: json.dumps(details, sort_keys=True)}))
    return out


DRIFT = "gpuvs.io/drift"
DRIFT_RATIO = "gpuvs.io/drift-ratio"
DRIFT_DETAILS = "gpuvs.io/drift-details"


def plan_drift(standings: list[Any], *, workload: str) -> list[LabelChange]:
    """The drift labels of the nodes measured in the workload's latest run (stored.NodeStanding each):
    gpuvs.io/drift in the one vocabulary (equivalent: within the margin of its past),
    gpuvs.io/drift-ratio (latest run / its past, against its peers) and an annotation with the runs
    compared, the interval and the latest change point. Nodes not measured in the latest run are left as
    they are."""
    out = []
    for n in standings:
        v = n.drift
        if v is None or v.run_id is None:
            continue
        labels = {DRIFT: word(v.verdict)}
        if v.ratio is not None:
            labels[DRIFT_RATIO] = f"{v.ratio:.3f}"
        c = n.change
        details = {"workload": workload, "run": v.run_id, "verdict": v.verdict, "ratio": v.ratio,
                   "interval": [v.ci_low, v.ci_high], "checks": v.checks, "reference": v.reference,
                   "reason": v.reason, "interleaved": False,
                   "since": None if c is None else {"run": c.run_id, "time": time.strftime(
                       "%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.time)), "step": c.step},
                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out.append(LabelChange(n.node, labels, {DRIFT_DETAILS: json.dumps(details, sort_keys=True)}))
    return out


def apply(core: Any, changes: list[LabelChange]) -> list[tuple[str, str | None]]:
    """Patch each node (CoreV1Api); [(node, error or None)]. One node's refusal does not stop the others."""
    from gpuvs.kube.client import api_message

    done = []
    for c in changes:
        try:
            core.patch_node(c.node, c.patch())
            done.append((c.node, None))
        except Exception as exc:  # ApiException: forbidden, node gone
            done.append((c.node, api_message(exc)))
    return done


def write(core: Any, changes: list[LabelChange], dry_run: bool = False) -> dict[str, str]:
    """What became of each node's change: written, the API's refusal, or a dry run's note (nothing is sent).
    The fleet, the pair fleet and the drift each label through this one call."""
    if dry_run:
        return {c.node: DRY for c in changes}
    return {n: err or "written" for n, err in apply(core, changes)}


def read(core: Any, nodes: list[str]) -> dict[str, dict[str, str]]:
    """The gpuvs.io labels each node carries now."""
    out = {}
    for name in nodes:
        labels = core.read_node(name).metadata.labels or {}
        out[name] = {k: v for k, v in labels.items() if k.startswith("gpuvs.io/")}
    return out
