"""A fleet run: trials on the chosen nodes, one pod per trial pinned to its node, stored as they arrive.

run_fleet is the whole of it as one library call, what `gpuvs fleet` and the agent call.
What happens on the way is told through FleetHooks; nothing here prints."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from gpuvs import environments, workloads
from gpuvs.errors import UsageError
from gpuvs.fleet.execute import adaptive
from gpuvs.fleet.assess import causes
from gpuvs.fleet.assess import fingerprint_diff as fingerprints
from gpuvs.fleet.cluster import sweep as kube
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.execute import node_choice as fleet_nodes
from gpuvs.fleet.execute import pergpu
from gpuvs.fleet.cluster import signals
from gpuvs.fleet.cluster import taints
from gpuvs.fleet.execute.node_choice import Excluded, NodeChoice, NodeInfo
from gpuvs.fleet.result import FleetResult, NodeLabels, NodeRow
from gpuvs.fleet.assess.rows import fill_row, host_to_device, node_health, sort_rows
from gpuvs.fleet.execute.trial_order import Item, Slots
from gpuvs.params import Param, refuse_unknown
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store
from gpuvs.store.records import ExperimentMeta
from gpuvs.kube import package
from gpuvs.trial.runner import Arm, Experiment, Flight, LiveTrial, Runner, TrialResult, validate_spec

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
        with Flight(self.runner) as flight:  # Ctrl-C or a refused store write: every trial in flight is stopped
            while not slots.finished:
                for item in slots.take():
                    live[item] = self.start(flight, item)
                self.max_in_flight = max(self.max_in_flight, len(live))
                for item, lv in list(live.items()):
                    if not flight.poll(lv):
                        continue
                    del live[item]
                    slots.done(item)
                    self._ended(item, lv.result, slots, got)
                if live:
                    time.sleep(POLL_S)
        return got

    def start(self, flight: Flight, item: Item) -> LiveTrial:
        """The item's trial, pinned to its node: a pod the API refused is that trial's failure."""
        node, trial = item
        return flight.start(self.exp.spec_for(self.arms[node], trial))

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


def run(runner: Runner, exp: Experiment, nodes: list[NodeInfo], excluded: list[Excluded], *, plan: adaptive.AdaptiveTrials,
        parallel: int, margin: float, confidence: float, reference: str | None, unit: str,
        on_end: Callable[[TrialResult], None] | None = None) -> tuple[FleetResult, Executor]:
    """Create the experiment in the store, run the fleet, and keep the result with it."""
    t0 = time.monotonic()
    higher = headline_higher(exp.base.workload)
    exp.fix_seed()
    runner.store.create_experiment(exp.id, exp.name, exp.kind, dataclasses.replace(exp.stored_meta(), trials=None))
    ex = Executor(runner, exp, parallel, on_end)
    outcome = adaptive.run([n.name for n in nodes], ex, plan, higher_is_better=higher, margin=margin,
                           confidence=confidence, reference=reference, seed=exp.seed)
    result = build(exp, nodes, excluded, outcome, ex, plan=plan, margin=margin, confidence=confidence, unit=unit)
    result.seconds = time.monotonic() - t0
    return result, ex


def build(exp: Experiment, nodes: list[NodeInfo], excluded: list[Excluded], outcome: adaptive.Outcome,
          ex: Executor, *, plan: adaptive.AdaptiveTrials, margin: float, confidence: float, unit: str) -> FleetResult:
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


RUN_KEYS = ("trials", "order_seed")  # the run options FleetOptions takes, checked as the study checks them


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
    condition: bool = False  # with label: the NodeCondition and Events (fleet/cluster/signals.py)
    taint: bool = False  # with label: gpuvs.io/slow on the slower nodes, with the circuit breaker
    taint_effect: str = "NoSchedule"
    taint_max_share: float = taints.DEFAULT_SHARE
    dry_run: bool = False  # with label: plan them, write nothing
    per_gpu: bool = False  # one row per GPU: each GPU against the fleet's GPUs of its model (fleet/execute/pergpu.py)
    name: str | None = None
    order_seed: int | None = None
    timeout_s: float | None = None  # seconds a trial may take
    command: str = ""  # the command line it was asked with, kept with the experiment

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> FleetOptions:
        """From a plain mapping of `gpuvs fleet`'s option names: PARAMS, and the run options trials, order_seed,
        name, timeout, with command. Each value is checked by its Param, --nodes split at commas. A name left out
        or None takes its default; an unknown one is one line. The command line and the agent both build here."""
        from gpuvs.trial.overrides import SPEC_PARAMS
        from gpuvs.trial.experiment import STUDY_PARAMS

        checks = {**{p.name: p for p in PARAMS}, **{p.name: p for p in STUDY_PARAMS if p.name in RUN_KEYS},
                  "timeout": SPEC_PARAMS["timeout_s"]}
        refuse_unknown(values, [*checks, "name", "command"], "gpuvs fleet")
        o = cls()
        for key, value in values.items():
            if value is None:
                continue
            v = checks[key].coerce(value) if key in checks else str(value)
            if key == "nodes":
                v = [n.strip() for item in v for n in item.split(",") if n.strip()] or None
            setattr(o, {"node_label": "node_labels", "timeout": "timeout_s"}.get(key, key), v)
        return o


def recorded_command(words: Sequence[str]) -> str:
    """The command line a fleet's experiment keeps: `gpuvs fleet` and its words, quoted so that a shell reads
    them back as they were given. The command line passes its own words, the agent those of option_words."""
    return "gpuvs fleet " + shlex.join(words)


def option_words(items: Iterable[tuple[str, Any]]) -> list[str]:
    """(option name, value) pairs as `gpuvs fleet`'s words, in their order: `--key value`, a true flag alone;
    None and False are left out, as an option not given."""
    words: list[str] = []
    for key, value in items:
        if value is None or value is False:
            continue
        words += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return words


@dataclass
class FleetStart:
    """The fleet about to run: its experiment, the nodes that take part, those left out and why, the plan."""

    experiment_id: str
    nodes: list[str]
    excluded: list[Excluded]
    plan: adaptive.AdaptiveTrials
    parallel: int
    workload: str


@dataclass
class FleetHooks:
    """What a caller hears while a fleet runs; every one optional."""

    on_start: Callable[[FleetStart], None] | None = None
    on_trial_end: Callable[[TrialResult], None] | None = None
    log: Callable[[str], None] | None = None  # a line on what was not done on a node (a refusal, the breaker)


def check(base: RunSpec, o: FleetOptions) -> adaptive.AdaptiveTrials:
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


def plan_of(o: FleetOptions) -> adaptive.AdaptiveTrials:
    if o.trials < MIN_TRIALS:
        raise UsageError(f"--trials {o.trials}: a fleet needs at least {MIN_TRIALS} trials per node (with fewer, the "
                         "false-alarm rate across many nodes exceeds 1 - confidence; see docs/fleet.md)")
    max_trials = o.max_trials if o.max_trials is not None else 3 * o.trials
    if max_trials < o.trials:
        raise UsageError(f"--max-trials {max_trials} is below --trials {o.trials}")
    return adaptive.AdaptiveTrials(trials=o.trials, max_trials=max_trials, step=o.trials)


def select_nodes(base: RunSpec, o: FleetOptions, choice: NodeChoice | None = None):
    """The cluster of the pod options, the pod settings, every node found, and the nodes chosen by --nodes,
    --node-label, GPUs, image and taints with those left out and why: what the node fleet and the pair fleet
    start from. A caller's `choice` (the agent's) is taken as it is: the nodes are not listed or chosen again."""
    from gpuvs.environments.pod import parse_options
    from gpuvs.kube import client

    pod = base.env.options
    settings = parse_options(pod)
    cluster = client.connect(pod.get("kubeconfig"), pod.get("context"), pod.get("namespace"))
    if choice is not None:
        return cluster, settings, list(choice.found), list(choice.chosen), list(choice.excluded)
    found = kube.nodes(cluster)
    chosen, excluded = choose(found, o, settings)
    return cluster, settings, found, chosen, excluded


def choose(found: list[NodeInfo], o: FleetOptions, settings: Any) -> tuple[list[NodeInfo], list[Excluded]]:
    """The fleet's choice among `found`, by its options and the pod settings (parse_options): one rule for the
    command line and the agent."""
    return fleet_nodes.select(found, names=o.nodes, labels=o.node_labels, gpu_resource=settings.gpu_resource,
                              need_gpus=not o.all_nodes, image=settings.image,
                              pull_never=settings.pull_policy == "Never", tolerations=settings.tolerations)


@contextlib.contextmanager
def swept(cluster: Any, experiment_id: str) -> Iterator[None]:
    """However the trials end, every pod of the run is deleted and its mark on the package ConfigMap released.
    The last user deletes that ConfigMap. The agent's child and the command line release at exit too; a
    long-lived caller needs it after each run. The node fleet and the pair fleet both end here."""
    try:
        yield
    finally:
        kube.sweep(cluster, experiment_id)
        package.release()


def run_fleet(base: RunSpec, store: str | Path, o: FleetOptions, hooks: FleetHooks | None = None,
              choice: NodeChoice | None = None) -> FleetResult:
    """Run `base` (its workload's parameters checked, its device resolved) on the fleet's nodes; the result,
    labels included, is stored with the experiment (meta `fleet`) and returned. A node that ran no trial is a
    row with verdict `failed`, not an exception; bad options and a fleet of fewer than 2 usable nodes are
    UsageErrors, raised before anything starts. `choice`: nodes the caller chose already (select_nodes)."""
    hooks = hooks or FleetHooks()
    plan = check(base, o)
    cluster, settings, found, chosen, excluded = select_nodes(base, o, choice)
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
        with swept(cluster, exp.id):
            if o.per_gpu:  # one pod per GPU of a node at once (fleet/execute/pergpu.py), each started as a node's trial
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
        if o.label:
            changes = labels.plan(result.rows, experiment_id=exp.id, workload=base.workload)
            status = labels.write(cluster.core, changes, o.dry_run)
            result.labels = [NodeLabels(c.node, c.labels, c.annotations, status[c.node]) for c in changes]
            if o.condition or o.taint:
                result.signals, result.circuit_open = signals.act(
                    cluster.core, result.rows, experiment_id=exp.id, workload=base.workload,
                    o=signals.SignalOptions(o.condition, o.taint, o.taint_effect, o.taint_max_share, o.dry_run),
                    gpu_nodes=[n for n in found if n.gpus(settings.gpu_resource) > 0] or found, log=hooks.log)
        st.update_meta(exp.id, fleet=result.to_dict())
    return result
