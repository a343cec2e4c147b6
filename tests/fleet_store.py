"""Stored `gpuvs fleet` runs without a cluster, written through the real store API as `gpuvs fleet` writes them.

An experiment of kind fleet has an arm per node, every trial with its samples, and the FleetResult in its meta.
That result is made by the fleet's own adaptive run and fleet.run.build from the trials' figures.
Each trial's figure is drawn as 100 x fleet x level x (1 + cv z)."""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np

from gpuvs import events
from gpuvs.fleet.execute import adaptive
from gpuvs.fleet.execute import fleet_run
from gpuvs.fleet.execute.node_choice import NodeInfo
from gpuvs.store.records import ExperimentMeta, SampleRecord
from gpuvs.store.summary import summarize_samples
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store

DAY = 86_400.0
T0 = 1_795_000_000.0  # 2026-11-18 (UTC): the first run
UNIT = "ops/s"


def store_fleet_run(st: Store, levels: dict[str, float], *, created: float, rng: np.random.Generator,
                    fleet: float = 1.0, trials: int = 4, cv: float = 0.02, workload: str = "spin",
                    margin: float = 0.05, confidence: float = 0.95, failed: tuple[str, ...] = ()) -> str:
    """One fleet run of `levels` ({node: its speed}) stored at time `created`; its experiment id. A node in
    `failed` runs no trial that succeeds (its trials are stored as failed, as a pod that cannot start)."""
    nodes = list(levels) + list(failed)
    base = RunSpec(workload=workload, device="cpu", params={"steps": 3},
                   env=EnvSpec("pod", {"image": "localhost/gpuvs-python:test"}))
    exp = fleet_run.fleet_experiment(f"fleet {workload}", base, nodes,
                                     ExperimentMeta(command=f"gpuvs fleet {workload} --device cpu", margin=margin,
                                                    confidence=confidence), seed=int(rng.integers(1 << 30)))
    st.create_experiment(exp.id, exp.name, exp.kind, dataclasses.replace(exp.stored_meta(), trials=None),
                         created=created)
    arms = {a.name: a for a in exp.arms}
    dead: dict[str, str] = {}
    ended = []  # what fleet.run.build reads of each finished trial (the runner's TrialResult: spec, ok, fingerprint)

    def execute(items):
        got: dict[str, list[float]] = {}
        for node, trial in items:
            spec = exp.spec_for(arms[node], trial)
            tid = st.begin_trial(spec)
            if node in failed:
                dead[node] = "pod could not start: ImagePullBackOff"
                st.finish_trial(tid, "failed", error=dead[node], error_kind="unavailable")
                ended.append(types.SimpleNamespace(spec=spec, ok=False, fingerprint={}))
                continue
            value = 100.0 * fleet * levels[node] * (1.0 + cv * rng.standard_normal())
            samples = [events.sample(step, value, UNIT, seconds=1.0 / value, items=1.0) for step in range(1, 4)]
            for s in samples:
                st.add_event(tid, s)
            summary = summarize_samples([SampleRecord.from_event(s) for s in samples])
            fingerprint = {"cpu_model": "test", "cpu_count": 2}
            st.finish_trial(tid, "ok", fingerprint=fingerprint, summary=summary)
            ended.append(types.SimpleNamespace(spec=spec, ok=True, fingerprint=fingerprint))
            got.setdefault(node, []).append(next(iter(summary.values())).value)
        return got

    plan = adaptive.AdaptiveTrials(trials=trials, max_trials=trials, step=trials)
    outcome = adaptive.run(nodes, execute, plan, higher_is_better=True, margin=margin, confidence=confidence,
                           seed=exp.seed)
    ex = types.SimpleNamespace(results=ended, failed_nodes=dead)
    result = fleet_run.build(exp, [NodeInfo(n) for n in nodes], [], outcome, ex, plan=plan, margin=margin,
                             confidence=confidence, unit=UNIT)
    st.update_meta(exp.id, fleet=result.to_dict())
    return exp.id


def sliding_fleet(path, *, runs: int = 10, slide_from: int = 5, slide: float = 0.03, nodes: int = 4,
                  seed: int = 7, workload: str = "spin", between: float = 0.005, failed_last: str | None = None,
                  names: list[str] | None = None) -> list[str]:
    """`runs` daily fleet runs of `nodes` nodes (node-1, node-2, ... or `names`): the second slides `slide`
    slower at each run from run `slide_from` (0-based) on; the whole fleet drifts (-4% over the history,
    ±1% per run) and every node moves `between` from run to run. `failed_last`: a node added to the last
    run, which fails there. The runs' experiment ids, oldest first."""
    rng = np.random.default_rng(seed)
    names = list(names) if names else [f"node-{i + 1}" for i in range(nodes)]
    ids = []
    with Store(path) as st:
        for t in range(runs):
            levels = {n: math.exp(between * rng.standard_normal()) for n in names}
            levels[names[1]] *= (1 - slide) ** max(0, t - slide_from + 1)
            fleet = math.exp(-0.04 * t / max(1, runs - 1) + 0.01 * rng.standard_normal())
            extra = (failed_last,) if failed_last and t == runs - 1 else ()
            ids.append(store_fleet_run(st, levels, created=T0 + t * DAY, rng=rng, fleet=fleet, workload=workload,
                                       failed=extra))
    return ids
