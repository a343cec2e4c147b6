"""`gpuvs fleet --per-gpu`: every GPU of every node against every GPU of the same model across the fleet.

A node's round is one pod per GPU, all at once; each GPU is `node/ID`, ID the device plugin's.
Each model is its own family at alpha / k; docs/fleet.md ("Per GPU") says why."""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Mapping

from gpuvs.fleet.execute import adaptive
from gpuvs.fleet.assess import causes
from gpuvs.fleet.assess import fingerprint_diff as fingerprints
from gpuvs.fleet.execute import trial_order as schedule
from gpuvs.fleet.assess import node_verdicts as verdicts
from gpuvs.fleet.execute.node_choice import Excluded, NodeInfo
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.fleet.assess.rows import fill_row, host_to_device, node_health, sort_rows
from gpuvs.fleet.execute.trial_order import Item, Slots
from gpuvs.trial.runner import Flight, LiveTrial, TrialResult

SEP = "/"


def unit(node: str, gpu_id: str) -> str:
    return f"{node}{SEP}{gpu_id}"


def split(u: str) -> tuple[str, str]:
    node, _, gpu_id = u.partition(SEP)
    return node, gpu_id


def gpu_id(fingerprint: Mapping[str, Any] | None) -> str | None:
    """The id of the one GPU a trial's pod was handed: what the device plugin put in its environment, else
    the UUID NVML reads; None where the pod saw no GPU."""
    fp = fingerprint or {}
    for key in ("nvidia_visible_devices", "cuda_visible_devices"):
        ids = [p.strip() for p in str(fp.get(key) or "").split(",") if p.strip()]
        if ids and ids[0] not in ("all", "none", "void"):
            return ids[0]
    gpus = fp.get("gpus") or []
    return gpus[0].get("uuid") if gpus else None


def gpu_model(fingerprint: Mapping[str, Any] | None) -> str | None:
    gpus = (fingerprint or {}).get("gpus") or []
    return gpus[0].get("name") if gpus else None


def _bus_id(fingerprint: Mapping[str, Any] | None) -> str | None:
    gpus = (fingerprint or {}).get("gpus") or []
    return gpus[0].get("pci_bus_id") if gpus else None


def judge(values: Mapping[str, list[float]], models: Mapping[str, str | None], *, higher_is_better: bool,
          margin: float, control: verdicts.ErrorControl) -> list[verdicts.NodeVerdict]:
    """Each GPU against the GPUs of its model, alpha split evenly over the models (one family each)."""
    groups: dict[str | None, dict[str, list[float]]] = {}
    for u, vals in values.items():
        groups.setdefault(models.get(u), {})[u] = vals
    if len(groups) <= 1:
        return verdicts.assess(values, higher_is_better=higher_is_better, margin=margin, control=control)
    out: list[verdicts.NodeVerdict] = []
    share = 1.0 - control.alpha / len(groups)
    for _, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        out += verdicts.assess(group, higher_is_better=higher_is_better, margin=margin,
                               control=verdicts.ErrorControl(confidence=share, looks=control.looks))
    control.nodes = len(values)
    control.method = (f"holm over each model's GPUs at alpha/{len(groups)}/looks per look ({len(groups)} models); "
                      "Bonferroni intervals")
    return out


# execute(items in order) -> {unit: [figure of each successful trial]}
Execute = Callable[[list[Item]], dict[str, list[float]]]


def run_gpus(nodes: list[str], execute: Execute, models: Mapping[str, str | None], plan: adaptive.AdaptiveTrials, *,
             higher_is_better: bool, margin: float, confidence: float, seed: int | None = None) -> adaptive.Outcome:
    """adaptive.run with GPUs as the units and node rounds as the items: an unsettled GPU (or a GPU of its
    reference with fewer trials) gets its node `step` more rounds, up to `max_trials`."""
    rng = random.Random(seed)
    values: dict[str, list[float]] = {}
    rounds = {n: 0 for n in nodes}
    control = verdicts.ErrorControl(confidence=confidence, looks=plan.looks)
    batch = {n: plan.trials for n in nodes}
    found: list[verdicts.NodeVerdict] = []
    look = 0
    while batch:
        items = [(n, rounds[n] + i) for n, k in batch.items() for i in range(k)]
        for n, k in batch.items():
            rounds[n] += k
        for u, vals in execute(schedule.order(items, rng)).items():
            values.setdefault(u, []).extend(vals)
        look += 1
        found = judge(values, models, higher_is_better=higher_is_better, margin=margin, control=control)
        if look >= plan.looks:
            break
        attempted = {u: rounds[split(u)[0]] for u in values}
        batch = {}
        for u, k in adaptive.extra_trials(found, attempted, plan, set()).items():
            batch[split(u)[0]] = max(batch.get(split(u)[0], 0), k)
    dead = sorted(n for n in nodes if not any(split(u)[0] == n for u in values))
    return adaptive.Outcome(values, {u: rounds[split(u)[0]] for u in values}, found, control, look, dead)


class GpuExecutor:
    """Runs node rounds for run_gpus: each round one pod per GPU of the node (gpus[node]), all at once."""

    def __init__(self, one: Any, gpus: Mapping[str, int]):
        self._one = one  # fleet.run.Executor: its start and poll of one trial, its parallel and on_end
        self.gpus, self.parallel, self.on_end = dict(gpus), one.parallel, one.on_end
        self.results: list[TrialResult] = []
        self.unit_of: dict[str, str] = {}  # run_id -> unit
        self.models: dict[str, str | None] = {}
        self.failed_nodes: dict[str, str] = {}
        self.max_in_flight = 0

    def __call__(self, items: list[Item]) -> dict[str, list[float]]:
        slots = Slots([it for it in items if it[0] not in self.failed_nodes], self.parallel)
        live: dict[Item, list[LiveTrial]] = {}
        got: dict[str, list[float]] = {}
        with Flight(self._one.runner) as flight:  # any way out: every pod of a round started is stopped and kept
            while not slots.finished:
                for node, rnd in slots.take():
                    g = live.setdefault((node, rnd), [])
                    for k in range(self.gpus[node]):
                        g.append(self._one.start(flight, (node, rnd * self.gpus[node] + k)))
                self.max_in_flight = max(self.max_in_flight, sum(len(v) for v in live.values()))
                for item, lvs in list(live.items()):
                    for lv in list(lvs):
                        if flight.poll(lv):
                            lvs.remove(lv)
                            self._ended(item[0], lv.result, got)
                    if not lvs:
                        del live[item]
                        slots.done(item)
                        if not any(r.ok for r in self.results if r.spec.arm == item[0]):
                            first = next(r for r in self.results if r.spec.arm == item[0])
                            self.failed_nodes[item[0]] = (first.error or first.status).splitlines()[0][:300]
                            slots.drop(item[0])
                if live:
                    time.sleep(0.05)
        return got

    def _ended(self, node: str, result: TrialResult, got: dict[str, list[float]]) -> None:
        self.results.append(result)
        if self.on_end:
            self.on_end(result)
        primary = result.primary() if result.ok else None
        gid = gpu_id(result.fingerprint) if result.ok else None
        if primary is None or primary.value is None:
            return
        if gid is None:  # a pod that was handed no GPU cannot be one GPU's figure
            self.failed_nodes.setdefault(node, "a pod saw no GPU id (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES)")
            return
        u = unit(node, gid)
        self.unit_of[result.spec.run_id] = u
        self.models[u] = gpu_model(result.fingerprint)
        got.setdefault(u, []).append(float(primary.value))


def indices(results: list[Any], unit_of: Mapping[str, str]) -> dict[str, int]:
    """Each unit's GPU index on its node: PCI bus order where the fingerprints carry it, else the ids' order."""
    key: dict[str, tuple] = {}
    for r in results:
        u = unit_of.get(r.spec.run_id)
        if u is not None and u not in key:
            gid = split(u)[1]
            digits = "".join(c for c in gid if c.isdigit())
            key[u] = (_bus_id(r.fingerprint) or "", len(digits), digits, gid)
    out: dict[str, int] = {}
    for node in {split(u)[0] for u in key}:
        for i, u in enumerate(sorted((u for u in key if split(u)[0] == node), key=lambda u: key[u])):
            out[u] = i
    return out


def build(exp: Any, nodes: list[NodeInfo], excluded: list[Excluded], outcome: adaptive.Outcome, ex: Any, *,
          plan: adaptive.AdaptiveTrials, margin: float, confidence: float, unit_name: str, higher: bool) -> FleetResult:
    """One row per GPU (node, index, id), slowest first; a node none of whose pods ran is one `failed` row."""
    index = indices(ex.results, ex.unit_of)
    trials_of: dict[str, list[Any]] = {}
    for r in ex.results:
        if (u := ex.unit_of.get(r.spec.run_id)) is not None:
            trials_of.setdefault(u, []).append(r)
    fps = {u: fingerprints.combined(next((r.fingerprint for r in ts if r.fingerprint), None),
                                    next((n.system for n in nodes if n.name == split(u)[0]), {}))
           for u, ts in trials_of.items()}
    differs = fingerprints.majority_differences(fps)
    verdict_of = {v.node: v for v in outcome.verdicts}
    rows: list[NodeRow] = []
    for u, ts in trials_of.items():
        node, gid = split(u)
        row = NodeRow(node, "inconclusive", n_ok=len(ts), n_trials=len(ts), fingerprint=fps[u],
                      differs={k: list(v) for k, v in differs.get(u, {}).items()}, gpu=index.get(u), uuid=gid)
        if (v := verdict_of.get(u)) is not None:
            fill_row(row, v, higher, outcome.values.get(u, []))
        row.health = node_health(ts)
        rows.append(row)
    for node in nodes:  # a node none of whose pods ran: one row, with the cluster's reason
        if node.name in ex.failed_nodes and not any(r.node == node.name for r in rows):
            bad = [r for r in ex.results if r.spec.arm == node.name]
            rows.append(NodeRow(node.name, "failed", reason=ex.failed_nodes[node.name], n_trials=len(bad)))
    key = {id(r): unit(r.node, r.uuid) for r in rows if r.uuid}
    h2d = {key[id(r)]: v for r in rows if id(r) in key and (v := host_to_device(trials_of[key[id(r)]]))}
    why = causes.for_nodes({key[id(r)]: r.verdict for r in rows if id(r) in key},
                           {key[id(r)]: r.health for r in rows if id(r) in key}, h2d)
    for r in rows:
        r.why = why.get(key.get(id(r), ""), [])
    rows += [NodeRow(e.node, "excluded", reason=e.reason) for e in excluded]
    return FleetResult(id=exp.id, workload=exp.base.workload, unit=unit_name, higher_is_better=higher, margin=margin,
                       confidence=confidence, plan=plan, control=outcome.control, looks_used=outcome.looks_used,
                       rows=sort_rows(rows), command=exp.meta.command or "", per_gpu=True)



def run(runner: Any, exp: Any, nodes: list[NodeInfo], excluded: list[Excluded], gpus: Mapping[str, int], one: Any,
        *, plan: adaptive.AdaptiveTrials, higher: bool, margin: float, confidence: float, unit_name: str) -> FleetResult:
    """fleet.run.run, per GPU: the experiment created in the store, the rounds run (each pod started and read by
    `one`, fleet.run's Executor of single trials), the result built."""
    import dataclasses

    t0 = time.monotonic()
    exp.fix_seed()
    runner.store.create_experiment(exp.id, exp.name, exp.kind, dataclasses.replace(exp.stored_meta(), trials=None))
    ex = GpuExecutor(one, gpus)
    outcome = run_gpus([n.name for n in nodes], ex, ex.models, plan, higher_is_better=higher, margin=margin,
                       confidence=confidence, seed=exp.seed)
    result = build(exp, nodes, excluded, outcome, ex, plan=plan, margin=margin, confidence=confidence,
                   unit_name=unit_name, higher=higher)
    result.seconds = time.monotonic() - t0
    return result
