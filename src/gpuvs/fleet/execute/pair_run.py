"""`gpuvs fleet collective --pairs`: the pair fleet (pairs.py's plan, pair_verdicts.py's verdicts) on a cluster.

Each pair is an arm `a+b`, its trials across the two nodes (environments/pod/gang.py), stored as they arrive.
Every pod of the run is swept at the end, however it ended; docs/fleet.md says the rest."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvs import environments, workloads
from gpuvs.errors import UsageError
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.assess import pair_verdicts
from gpuvs.fleet.execute import pair_plan as pairs
from gpuvs.fleet.assess.pair_verdicts import Pair, PairControl, PairNodeVerdict, PairOutcome, PairVerdict
from gpuvs.fleet.execute.node_choice import NodeChoice
from gpuvs.fleet.execute.fleet_run import Executor, FleetHooks, FleetOptions, FleetStart, headline_higher, select_nodes, swept
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store
from gpuvs.store.records import ExperimentMeta
from gpuvs.trial.runner import Arm, Experiment, Runner, draw_seed, validate_spec


def arm_name(p: Pair) -> str:
    return f"{p[0]}+{p[1]}"


@dataclass
class PairFleetResult:
    """What `gpuvs fleet --pairs` ran and found: the plan's pairs, each pair's figures, the verdicts."""

    id: str
    workload: str
    unit: str
    margin: float
    confidence: float
    partners: int
    second: int
    trials: int
    parallel: int
    nodes: list[str]
    first: list[Pair]
    suspects: list[str]
    second_pairs: list[Pair]
    failed: dict[str, str]  # arm a+b -> why it gave no figure
    values: dict[str, list[float]]  # arm a+b -> the figure of each trial
    outcome: PairOutcome
    seconds: float = 0.0
    pod_starts: int = 0  # pods created (2 per pair trial started)
    command: str = ""
    excluded: list[dict[str, str]] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)  # with --label: node, labels, status

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "outcome"}
        out["first"] = [list(p) for p in self.first]
        out["second_pairs"] = [list(p) for p in self.second_pairs]
        oc = self.outcome
        out["summary"] = oc.summary()
        out["level"] = oc.level
        out["control"] = oc.control.to_dict()
        out["node_verdicts"] = [dataclasses.asdict(v) for v in oc.nodes]
        out["pair_verdicts"] = [{**dataclasses.asdict(v), "pair": list(v.pair)} for v in oc.pairs]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PairFleetResult:
        names = {f.name for f in dataclasses.fields(cls)} - {"outcome"}
        kw = {k: v for k, v in d.items() if k in names}
        kw["first"] = [tuple(p) for p in d.get("first") or []]
        kw["second_pairs"] = [tuple(p) for p in d.get("second_pairs") or []]
        c = d.get("control") or {}
        control = PairControl(c.get("confidence", 0.95), c.get("looks", 2), c.get("nodes", 0), c.get("pairs", 0),
                              c.get("correction", True))
        nodes = [PairNodeVerdict(**v) for v in d.get("node_verdicts") or []]
        prs = [PairVerdict(**{**v, "pair": tuple(v["pair"])}) for v in d.get("pair_verdicts") or []]
        return cls(**kw, outcome=PairOutcome(nodes, prs, control, d.get("level")))


def check(base: RunSpec, o: FleetOptions) -> None:
    """What --pairs does not apply to, one line each."""
    spanning = environments.takers("num_nodes")  # the kinds that run one trial across nodes
    if base.env.kind not in spanning:
        raise UsageError(f"--pairs runs each pair as one trial across two nodes: --env {base.env.kind} is not "
                         f"allowed (leave --env out, or give --env {' or '.join(spanning)})")
    why = pairs.workload_refused(base.workload)
    if why:
        raise UsageError(f"--pairs {why}")
    env = base.env.options
    if env.get("num_nodes") not in (None, 1) or env.get("gang_nodes") or env.get("node"):
        raise UsageError("--pairs places each pair's two pods itself: leave --num-nodes, --gang-nodes and --node out")
    for flag, on in (("--per-gpu", o.per_gpu), ("--reference", o.reference), ("--condition", o.condition),
                     ("--taint", o.taint), ("--max-trials", o.max_trials is not None)):
        if on:
            raise UsageError(f"{flag} is not supported with --pairs (each pair runs --trials trials; a node is "
                             "judged against the fleet from its pairs; --label writes gpuvs.io/links)")
    if o.dry_run and not o.label:
        raise UsageError("--dry-run applies with --label (it shows the labels instead of writing them)")
    if o.trials < 2:
        raise UsageError(f"--trials {o.trials}: a pair needs at least 2 trials for its spread")


def run_pair_fleet(base: RunSpec, store: str | Path, o: FleetOptions, plan: pairs.PairPlan,
                   hooks: FleetHooks | None = None, choice: NodeChoice | None = None) -> PairFleetResult:
    hooks = hooks or FleetHooks()
    check(base, o)
    if plan.partners < 3:
        raise UsageError(f"--partners {plan.partners}: at least 3 (with 2, a slow link and a slow node look alike)")
    if plan.second < 0:
        raise UsageError(f"--second-pass {plan.second}: 0 or more good partners per suspect")
    cluster, _, _, chosen, excluded = select_nodes(base, o, choice)
    names = [n.name for n in chosen]
    if len(names) < 3:
        why = "; ".join(f"{e.node}: {e.reason}" for e in excluded) or "no other node matched"
        raise UsageError(f"--pairs needs at least 3 nodes that can run the pod (with 2, which node is slow cannot be "
                         f"told), found {len(names)} ({why})")
    every = [pairs.pair(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    seed = o.order_seed if o.order_seed is not None else draw_seed()
    exp = Experiment(name=o.name or f"fleet --pairs {base.workload}", base=base,
                     arms=[Arm(arm_name(p), {"num_nodes": 2, "gang_nodes": list(p)}) for p in every], trials=0,
                     seed=seed, kind="fleet", meta=ExperimentMeta(command=o.command, margin=o.margin,
                                                                   confidence=o.confidence))
    validate_spec(exp.spec_for(exp.arms[0], 0))  # the pod environment's own checks, once: a refusal is one line
    first = pairs.first_pass(names, plan.partners, seed)
    if hooks.on_start:
        hooks.on_start(FleetStart(exp.id, names, list(excluded), None, o.parallel, base.workload))
    t0 = time.monotonic()
    values: dict[Pair, list[float]] = {}
    with Store(store) as st:
        runner = Runner(st, timeout_s=o.timeout_s)
        st.create_experiment(exp.id, exp.name, exp.kind, dataclasses.replace(exp.stored_meta(), trials=o.trials))
        ex = Executor(runner, exp, o.parallel, hooks.on_trial_end)
        higher = headline_higher(base.workload)

        def measure(batch: list[Pair]) -> None:
            for rnd in pairs.rounds(batch):
                for i in range(0, len(rnd), o.parallel):
                    chunk = rnd[i:i + o.parallel]
                    ex.parallel = len(chunk)  # one trial per pair at once; the chunk's pairs share no node
                    got = ex([(arm_name(p), t) for t in range(o.trials) for p in chunk])
                    for p in chunk:
                        if got.get(arm_name(p)):
                            values[p] = [v if higher else 1.0 / v for v in got[arm_name(p)]]

        with swept(cluster, exp.id):
            measure(first)
            early = pair_verdicts.judge(names, values, margin=o.margin, confidence=o.confidence, looks=2)
            suspects = pairs.suspects_of(early.pairs)
            tried = first + [p for p in every if arm_name(p) in ex.failed_nodes]
            second = pairs.second_pass(names, tried, suspects, plan.second, seed)
            measure(second)
            final = pair_verdicts.judge(names, values, margin=o.margin, confidence=o.confidence,
                                        looks=2) if second else early
        result = PairFleetResult(
            id=exp.id, workload=base.workload, unit=workloads.get(base.workload).unit, margin=o.margin,
            confidence=o.confidence, partners=min(plan.partners, len(names) - 1), second=plan.second,
            trials=o.trials, parallel=o.parallel, nodes=names, first=first, suspects=sorted(suspects),
            second_pairs=second, failed=dict(ex.failed_nodes), values={arm_name(p): v for p, v in values.items()},
            outcome=final, seconds=time.monotonic() - t0, pod_starts=2 * len(ex.results), command=o.command,
            excluded=[{"node": e.node, "reason": e.reason} for e in excluded])
        if o.label:
            changes = labels.plan_links(final.nodes, experiment_id=exp.id, workload=base.workload)
            status = labels.write(cluster.core, changes, o.dry_run)
            result.labels = [{"node": c.node, "labels": c.labels, "status": status[c.node]} for c in changes]
        st.update_meta(exp.id, pair_fleet=result.to_dict())
    return result
