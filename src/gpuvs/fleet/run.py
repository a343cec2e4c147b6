"""A fleet run: trials on the chosen nodes (one pod per trial, pinned to its node) through the
runner's LiveTrial, so every event is stored as it arrives like any experiment; concurrency up to
`parallel`, never two trials on one node; adaptive.run decides how many; the result is a FleetResult
(one row per node, the excluded ones included) that every report renders and the store keeps.

run_fleet is the whole of it as one library call (what `gpuvs fleet` and the agent call): the options
checked, the nodes chosen and each checked by the pod environment, the trials run, every pod of the run swept,
the labels written (or planned, dry run), the result stored with the experiment and returned. What happens on
the way is told through FleetHooks; nothing here prints."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpuvs import environments, workloads
from gpuvs.errors import UsageError, interruption
from gpuvs.fleet import adaptive, causes, fingerprints, kube, labels, nodes as fleet_nodes, pergpu, signals, taints
from gpuvs.fleet.nodes import Excluded, NodeInfo
from gpuvs.fleet.result import FleetResult, NodeLabels, NodeRow  # noqa: F401  (the run's result, re-exported)
from gpuvs.fleet.rows import fill_row, host_to_device, node_health, sort_rows  # noqa: F401  (sort_rows: re-exported)
from gpuvs.fleet.schedule import Item, Slots
from gpuvs.params import Param
from gpuvs.probes import gpu_health
from gpuvs.probes.gpu_health import GpuHealth
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store
from gpuvs.store.records import ExperimentMeta
from gpuvs.kube import package
from gpuvs.trial.runner import Arm, Experiment, LiveTrial, Runner, TrialResult, validate_spec
from gpuvs.store.db import StoreError

POLL_S = 0.05


class Executor:
    """Runs batches of (node, trial) items for adaptive.run; keeps every TrialResult."""

    def __init__(self, runner: Runner, exp: Experiment, parallel: int,
                 on_end: Callable[[TrialResult], None] | None = None):
        self.runner, self.exp, self.parallel, self.on_end = runner, exp, parallel, on_end
        self.arms = {a.name: a for a in exp.arms}
        self.results: list[TrialResult] = []
        self.failed_nodes: dict[str, str] = {}  # node -> why it ran nothing
        self.max_in_flight = 0
        self.value_of: Callable[[TrialResult], float | None] = lambda r: r.primary().value if r.primary() else None

    def __call__(self, items: list[Item]) -> dict[str, list[float]]:
        slots = Slots([it for it in items if it[0] not in self.failed_nodes], self.parallel)
        live: dict[Item, LiveTrial] = {}
        got: dict[str, list[float]] = {}
        try:
            while not slots.finished:
                for item in slots.take():
                    live[item] = self._start(item)
                self.max_in_flight = max(self.max_in_flight, len(live))
                for item, lv in list(live.items()):
                    if not self._poll(lv):
                        continue
                    del live[item]
                    slots.done(item)
                    self._ended(item, lv.result, slots, got)
                if live:
                    time.sleep(POLL_S)
        except KeyboardInterrupt as exc:
            for lv in live.values():
                lv.fail("interrupted", interruption(exc), status="interrupted")
                lv.finish()
            raise
        except StoreError as exc:  # a write refused (disk full, read-only): every trial in flight stops, none starts
            for lv in live.values():
                lv.fail("store", str(exc))
                lv.finish()
            raise
        return got

    def _start(self, item: Item) -> LiveTrial:
        node, trial = item
        lv = LiveTrial(self.runner, self.exp.spec_for(self.arms[node], trial))
        try:
            lv.start()
        except KeyboardInterrupt as exc:  # stopped while the pod was being created: the trial is kept, the
            lv.fail("interrupted", interruption(exc), status="interrupted")  # pod killed (and swept at the end)
            lv.finish()
            raise
        except StoreError:  # the store refused a write: the run stops (its trials so far are kept)
            raise
        except Exception as exc:  # the launcher refused (API error, ...)
            lv.fail(getattr(exc, "kind", "unavailable"), str(exc) or type(exc).__name__)
        return lv

    def _poll(self, lv: LiveTrial) -> bool:
        if lv.done:
            lv.finish()
            return True
        try:
            if not lv.pump(block=False):
                return False
        except TimeoutError:
            lv.fail("timeout", f"timed out after {lv.timeout:g} s; the worker was stopped")
        except (KeyboardInterrupt, StoreError):
            raise
        except Exception as exc:
            lv.fail(getattr(exc, "kind", "crash"), str(exc) or type(exc).__name__)
        lv.finish()
        if self.runner.store_failed is not None:  # its final write was refused
            raise self.runner.store_failed
        return True

    def _ended(self, item: Item, result: TrialResult, slots: Slots, got: dict[str, list[float]]) -> None:
        self.results.append(result)
        if self.on_end:
            self.on_end(result)
        node = item[0]
        value = self.value_of(result) if result.ok else None
        if value is not None:
            got.setdefault(node, []).append(float(value))
            return
        if not any(r.ok for r in self.results if r.spec.arm == node):
            # nothing ran there yet: the node cannot run the pod; stop sending it trials
            self.failed_nodes[node] = (result.error or result.status).splitlines()[0][:300]
            slots.drop(node)


def headline_higher(workload: str) -> bool:
    """Which way is better for the workload's headline, as the workload declares it (never from a unit)."""
    decl = next((d for d in workloads.get(workload).metrics if d.headline), None)
    if decl is None or decl.better == "neither":
        raise UsageError(f"workload {workload} declares no headline figure with a direction; gpuvs fleet "
                         "needs one to say which node is slower")
    return decl.better == "higher"


def fleet_experiment(name: str, base, nodes: list[str], meta: ExperimentMeta, seed: int | None) -> Experiment:
    """One arm per node, pinned to it through the pod environment's `node` option."""
    return Experiment(name=name, base=base, arms=[Arm(n, {"node": n}) for n in nodes], trials=0, seed=seed,
                      kind="fleet", meta=meta)


def run(runner: Runner, exp: Experiment, nodes: list[NodeInfo], excluded: list[Excluded], *, plan: adaptive.Plan,
        parallel: int, margin: float, confidence: float, reference: str | None, unit: str,
        on_end: Callable[[TrialResult], None] | None = None) -> tuple[FleetResult, Executor]:
    """Create the experiment in the store, run the fleet, and keep the result with it."""
    t0 = time.monotonic()
    higher = headline_higher(exp.base.workload)
    if exp.seed is None:  # drawn once and stored, as every experiment's trial order seed: the order can be re-made
        exp.seed = random.SystemRandom().randrange(2**31)
    runner.store.create_experiment(exp.id, exp.name, exp.kind, dataclasses.replace(exp.stored_meta(), trials=None))
    ex = Executor(runner, exp, parallel, on_end)
    outcome = adaptive.run([n.name for n in nodes], ex, plan, higher_is_better=higher, margin=margin,
                           confidence=confidence, reference=reference, seed=exp.seed)
    result = build(exp, nodes, excluded, outcome, ex, plan=plan, margin=margin, confidence=confidence, unit=unit)
    result.seconds = time.monotonic() - t0
    return result, ex


def build(exp: Experiment, nodes: list[NodeInfo], excluded: list[Excluded], outcome: adaptive.Outcome,
          ex: Executor, *, plan: adaptive.Plan, margin: float, confidence: float, unit: str) -> FleetResult:
    fps: dict[str, dict[str, Any]] = {}  # the fingerprints gathered by the workers, with the kubelet's
    for node in nodes:
        worker = next((r.fingerprint for r in ex.results if r.spec.arm == node.name and r.ok and r.fingerprint), None)
        fps[node.name] = fingerprints.combined(worker, node.system)
    differs = fingerprints.majority_differences(fps)
    verdict_of = {v.node: v for v in outcome.verdicts}
    higher = headline_higher(exp.base.workload)
    rows = []
    for node in nodes:
        n = node.name
        tried = [r for r in ex.results if r.spec.arm == n]
        row = NodeRow(n, "inconclusive", n_ok=sum(r.ok for r in tried), n_trials=len(tried), fingerprint=fps[n],
                      differs={k: list(v) for k, v in differs.get(n, {}).items()})
        v = verdict_of.get(n)
        if n in ex.failed_nodes and not row.n_ok:
            row.verdict, row.reason = "failed", ex.failed_nodes[n]
        elif v is not None:
            fill_row(row, v, higher, outcome.values.get(n, []))
        row.health = node_health([r for r in tried if r.ok])
        rows.append(row)
    h2d = {n: v for n in verdict_of if (v := host_to_device([r for r in ex.results if r.spec.arm == n and r.ok]))}
    why = causes.for_nodes({r.node: r.verdict for r in rows}, {r.node: r.health for r in rows}, h2d)
    for row in rows:
        row.why = why.get(row.node, [])
    rows += [NodeRow(e.node, "excluded", reason=e.reason) for e in excluded]
    return FleetResult(id=exp.id, workload=exp.base.workload, unit=unit, higher_is_better=higher, margin=margin,
                       confidence=confidence, plan=plan, control=outcome.control, looks_used=outcome.looks_used,
                       rows=sort_rows(rows), command=exp.meta.command or "")


# -- the whole run, as one call -------------------------------------------------------------------

DEFAULT_TRIALS = 4
MIN_TRIALS = 4  # BENCHMARKS.md: 3 trials per node let the fleet's false-alarm rate reach 12%
PARAMS = (  # the fleet's options: `gpuvs fleet`'s, but for its report's format and file
    Param("nodes", str, None, "only these nodes (comma-separated; may be repeated)", multiple=True),
    Param("node_label", str, None, "only nodes with this label, KEY or KEY=VALUE (may be repeated)", multiple=True),
    Param("all_nodes", bool, False, "nodes without allocatable GPUs too (default: only nodes with --gpu-resource)"),
    Param("reference", str, None, "compare every node with this node (default: the fleet band of the others)"),
    Param("parallel", int, 1, "trials at once across nodes (never two on one node)", min=1, max=1000),
    Param("max_trials", int, None, "trials per node at most, for unsettled nodes (default: 3 x --trials)",
          min=2, max=10000),
    Param("margin", float, 0.05, "equivalence margin of a node against the fleet (0.05: ±5%)", min=0.0, max=0.5),
    Param("confidence", float, 0.95, "1 - the false-call rate for the whole fleet", min=0.5, max=0.999),
    Param("label", bool, False, "write gpuvs.io/perf (the verdict: slower, equivalent, ...; docs/vocabulary.md) and "
          "gpuvs.io/perf-ratio on the nodes (with --pairs: gpuvs.io/links and gpuvs.io/links-ratio)"),
    Param("condition", bool, False, "with --label: keep the NodeCondition GpuvsPerformance current and post Events on "
          "the nodes whose verdict changed (needs nodes/status: gpuvs deploy --condition)"),
    Param("taint", bool, False, "with --label: taint the nodes found slower gpuvs.io/slow=true:EFFECT, untaint them "
          "when they read well again, never more than --taint-max-share of the GPU nodes"),
    Param("taint_effect", str, "NoSchedule", "with --taint: the taint's effect", choices=taints.EFFECTS),
    Param("taint_max_share", float, taints.DEFAULT_SHARE, "with --taint: the circuit breaker, the most of the GPU "
          "nodes tainted at once (at least 1 node)", min=0.001, max=1.0),
    Param("dry_run", bool, False, "with --label: show the labels (condition, events, taints), write nothing"),
    Param("per_gpu", bool, False, "every GPU of every node against every GPU of its model (one pod per GPU, a "
          "node's GPUs at once; docs/fleet.md): one row per GPU, and gpuvs.io/slow-gpus with --label"),
)


def node_kinds() -> list[str]:
    """The environment kinds that place a worker on a named node of a cluster (those that take `node`):
    a fleet runs in the first of them unless told otherwise."""
    return environments.takers("node")


@dataclass
class FleetOptions:
    """How a fleet is run (`gpuvs fleet`'s fleet options, and the run options it takes)."""

    nodes: list[str] | None = None  # only these nodes
    node_labels: list[str] | None = None  # only nodes with these labels, KEY or KEY=VALUE
    all_nodes: bool = False  # nodes without allocatable GPUs too
    reference: str | None = None  # compare every node with this one (default: the fleet band of the others)
    parallel: int = 1
    trials: int = DEFAULT_TRIALS
    max_trials: int | None = None  # default: 3 x trials
    margin: float = 0.05
    confidence: float = 0.95
    label: bool = False  # write the gpuvs.io/perf labels
    condition: bool = False  # with label: the NodeCondition and Events (fleet/signals.py)
    taint: bool = False  # with label: gpuvs.io/slow on the slower nodes, with the circuit breaker
    taint_effect: str = "NoSchedule"
    taint_max_share: float = taints.DEFAULT_SHARE
    dry_run: bool = False  # with label: plan them, write nothing
    per_gpu: bool = False  # one row per GPU: each GPU against the fleet's GPUs of its model (fleet/pergpu.py)
    name: str | None = None
    order_seed: int | None = None
    timeout_s: float | None = None  # seconds a trial may take
    command: str = ""  # the command line it was asked with, kept with the experiment


@dataclass
class FleetStart:
    """The fleet about to run: its experiment, the nodes that take part, those left out and why, the plan."""

    experiment_id: str
    nodes: list[str]
    excluded: list[Excluded]
    plan: adaptive.Plan
    parallel: int
    workload: str


@dataclass
class FleetHooks:
    """What a caller hears while a fleet runs; every one optional."""

    on_start: Callable[[FleetStart], None] | None = None
    on_trial_end: Callable[[TrialResult], None] | None = None
    log: Callable[[str], None] | None = None  # a line on what was not done on a node (a refusal, the breaker)


def check(base: RunSpec, o: FleetOptions) -> adaptive.Plan:
    """The options against each other and the base spec: the trial plan, or one line on what is wrong."""
    if base.env.kind not in node_kinds():
        raise UsageError(f"gpuvs fleet runs pods on the cluster's nodes: --env {base.env.kind} is not allowed "
                         f"(leave --env out, or give --env {' or --env '.join(node_kinds())})")
    if base.env.options.get("node"):
        raise UsageError("--node pins one node; a fleet runs on many: use --nodes a,b,c")
    if o.dry_run and not o.label:
        raise UsageError("--dry-run applies with --label (it shows the labels instead of writing them)")
    for flag, on in (("--condition", o.condition), ("--taint", o.taint)):
        if on and not o.label:
            raise UsageError(f"{flag} applies with --label (the node's verdict is written as labels first)")
    if o.taint_effect not in taints.EFFECTS:
        raise UsageError(f"--taint-effect {o.taint_effect}: expected one of {', '.join(taints.EFFECTS)}")
    if not 0 < o.taint_max_share <= 1:
        raise UsageError(f"--taint-max-share {o.taint_max_share:g}: expected a share above 0 and at most 1 "
                         "(leave --taint out to taint nothing)")
    if o.per_gpu:
        if base.device != "cuda" or base.num_gpus != 1:
            raise UsageError(f"--per-gpu measures each GPU in a pod of its own: it needs --device cuda and one GPU "
                             f"per pod (got --device {base.device}, --num-gpus {base.num_gpus})")
        for flag, on in (("--all-nodes", o.all_nodes), ("--reference", o.reference), ("--condition", o.condition),
                         ("--taint", o.taint)):
            if on:
                raise UsageError(f"{flag} is not supported with --per-gpu (a GPU is held against the GPUs of its "
                                 "model; the node's label gpuvs.io/slow-gpus says how many are slower)")
    return plan_of(o)


def plan_of(o: FleetOptions) -> adaptive.Plan:
    if o.trials < MIN_TRIALS:
        raise UsageError(f"--trials {o.trials}: a fleet needs at least {MIN_TRIALS} trials per node (with fewer, the "
                         "false-alarm rate across many nodes exceeds 1 - confidence; see docs/fleet.md)")
    max_trials = o.max_trials if o.max_trials is not None else 3 * o.trials
    if max_trials < o.trials:
        raise UsageError(f"--max-trials {max_trials} is below --trials {o.trials}")
    return adaptive.Plan(trials=o.trials, max_trials=max_trials, step=o.trials)


def select_nodes(base: RunSpec, o: FleetOptions):
    """The cluster of the pod options, the pod settings, every node found, and the nodes chosen by --nodes,
    --node-label, GPUs, image and taints with those left out and why: what the node fleet and the pair fleet
    start from."""
    from gpuvs.environments.pod import parse_options
    from gpuvs.kube import client

    pod = base.env.options
    settings = parse_options(pod)
    cluster = client.connect(pod.get("kubeconfig"), pod.get("context"), pod.get("namespace"))
    found = kube.nodes(cluster)
    chosen, excluded = fleet_nodes.select(found, names=o.nodes, labels=o.node_labels,
                                          gpu_resource=settings.gpu_resource, need_gpus=not o.all_nodes,
                                          image=settings.image, pull_never=settings.pull_policy == "Never",
                                          tolerations=settings.tolerations)
    return cluster, settings, found, chosen, excluded


def run_fleet(base: RunSpec, store: str | Path, o: FleetOptions, hooks: FleetHooks | None = None) -> FleetResult:
    """Run `base` (its workload's parameters checked, its device resolved) on the fleet's nodes; the result,
    labels included, is stored with the experiment (meta `fleet`) and returned. A node that ran no trial is a
    row with verdict `failed`, not an exception; bad options and a fleet of fewer than 2 usable nodes are
    UsageErrors, raised before anything starts."""
    hooks = hooks or FleetHooks()
    plan = check(base, o)
    cluster, settings, found, chosen, excluded = select_nodes(base, o)
    if o.reference and o.reference not in {n.name for n in chosen}:
        raise UsageError(f"--reference {o.reference}: not one of the fleet's nodes that can run the pod "
                         f"({', '.join(n.name for n in chosen) or 'none'})")
    exp = fleet_experiment(o.name or f"fleet {base.workload}", base, [n.name for n in chosen],
                           ExperimentMeta(command=o.command, margin=o.margin, confidence=o.confidence), o.order_seed)
    usable = []
    for node, arm in zip(chosen, exp.arms):  # the pod environment's own checks, per node: a refusal is a row
        try:
            validate_spec(exp.spec_for(arm, 0))
            usable.append(node)
        except UsageError as exc:
            excluded.append(Excluded(node.name, str(exc)))
    if len(usable) < 2:
        why = "; ".join(f"{e.node}: {e.reason}" for e in excluded) or "no node matched"
        raise UsageError(f"a fleet needs at least 2 nodes that can run the pod, found {len(usable)} ({why})")
    if len(usable) < len(chosen):
        exp = fleet_experiment(exp.name, base, [n.name for n in usable], exp.meta, o.order_seed)
    if hooks.on_start:
        hooks.on_start(FleetStart(exp.id, [n.name for n in usable], list(excluded), plan, o.parallel,
                                  base.workload))
    with Store(store) as st:
        try:
            if o.per_gpu:  # one pod per GPU of a node at once (fleet/pergpu.py), each started as a node's trial
                runner = Runner(st, timeout_s=o.timeout_s)
                gpus = {n.name: n.gpus(settings.gpu_resource) for n in usable}
                one = Executor(runner, exp, o.parallel, hooks.on_trial_end)
                result = pergpu.run(runner, exp, usable, excluded, gpus, one, plan=plan,
                                    higher=headline_higher(base.workload), margin=o.margin, confidence=o.confidence,
                                    unit_name=workloads.get(base.workload).unit)
            else:
                result, _ = run(Runner(st, timeout_s=o.timeout_s), exp, usable, excluded, plan=plan,
                                parallel=o.parallel, margin=o.margin, confidence=o.confidence,
                                reference=o.reference, unit=workloads.get(base.workload).unit,
                                on_end=hooks.on_trial_end)
        finally:
            kube.sweep(cluster, exp.id)
            package.release()  # the run's mark on gpuvs's package ConfigMap: the last user deletes it (the agent's
            # child and the command line release at exit too; a caller in a long-lived process, at the end of the run)
        if o.label:
            changes = labels.plan(result.rows, experiment_id=exp.id, workload=base.workload)
            outcome = ([(c.node, "dry run: not written") for c in changes] if o.dry_run
                       else [(n, err or "written") for n, err in labels.apply(cluster.core, changes)])
            status = dict(outcome)
            result.labels = [NodeLabels(c.node, c.labels, c.annotations, status[c.node]) for c in changes]
            if o.condition or o.taint:
                result.signals, result.circuit_open = signals.act(
                    cluster.core, result.rows, experiment_id=exp.id, workload=base.workload,
                    o=signals.SignalOptions(o.condition, o.taint, o.taint_effect, o.taint_max_share, o.dry_run),
                    gpu_nodes=[n for n in found if n.gpus(settings.gpu_resource) > 0] or found, log=hooks.log)
        st.update_meta(exp.id, fleet=result.to_dict())
    return result
