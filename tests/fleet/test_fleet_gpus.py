"""`gpuvs fleet --per-gpu` without a cluster (fleet/execute/pergpu.py), with the fleet's error control.

Each GPU is held against every GPU of its model across the fleet, one row per GPU naming node, index and id.
The node's labels (gpuvs.io/slow-gpus) and the agent's per-GPU metrics. The real run: test_fleet_cluster.py."""

from __future__ import annotations

import types

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuvs.agent import metrics
from gpuvs.agent.state import State
from gpuvs.errors import UsageError
from gpuvs.fleet.execute import adaptive
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.execute import pergpu
from gpuvs.fleet.execute import fleet_run
from gpuvs.fleet.execute.node_choice import NodeInfo
from gpuvs.fleet.result import FleetResult
from gpuvs.probes.gpu_health import GpuHealth
from gpuvs.report import fleet as fleet_report
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.records import ExperimentMeta

PLAN = adaptive.AdaptiveTrials(trials=4, max_trials=12, step=4)  # gpuvs fleet's default plan


def fleet_of(levels: dict[str, float], rng: np.random.Generator, cv: float = 0.02, models=None):
    """An execute for pergpu.run_gpus: each node round gives one figure per GPU of the node ({node/ID: level})."""
    models = models if models is not None else {}

    def execute(items):
        got: dict[str, list[float]] = {}
        for node, _ in items:
            for u, level in levels.items():
                if pergpu.split(u)[0] == node:
                    got.setdefault(u, []).append(100.0 * level * (1.0 + cv * rng.standard_normal()))
        return got
    return execute, models


def nodes_of(levels) -> list[str]:
    return sorted({pergpu.split(u)[0] for u in levels})


def healthy(nodes: int, gpus: int) -> dict[str, float]:
    return {pergpu.unit(f"node-{n}", f"GPU-{n}{g}"): 1.0 for n in range(1, nodes + 1) for g in range(gpus)}


def test_one_slow_gpu_among_six_is_named_and_no_other():
    levels = healthy(3, 2)
    levels["node-2/GPU-21"] = 0.8
    execute, models = fleet_of(levels, np.random.default_rng(1))
    out = pergpu.run_gpus(nodes_of(levels), execute, models, PLAN, higher_is_better=True, margin=0.05,
                          confidence=0.95, seed=3)
    said = {v.node: v.verdict for v in out.verdicts}
    assert said.pop("node-2/GPU-21") == "slower", said
    assert set(said.values()) == {"equivalent"}, said  # its sibling on node-2 too
    slow = next(v for v in out.verdicts if v.node == "node-2/GPU-21")
    assert 0.75 < slow.speed < 0.85 and "node-2/GPU-21" not in slow.reference and len(slow.reference) == 5
    assert out.control.nodes == 6 and out.control.looks == PLAN.looks


def test_the_error_rate_over_healthy_gpus_is_held_for_the_whole_fleet():
    """100 fleets of 3 nodes x 2 GPUs and of 4 x 8, all healthy: a run with any false call (slower or faster,
    within the margin or beyond) in at most 5% of them, plus the binomial noise of 100 runs."""
    rng = np.random.default_rng(33)
    for nodes, gpus in ((3, 2), (4, 8)):
        levels = healthy(nodes, gpus)
        false = 0
        for seed in range(100):
            execute, models = fleet_of(levels, rng)
            out = pergpu.run_gpus(nodes_of(levels), execute, models, PLAN, higher_is_better=True, margin=0.05,
                                  confidence=0.95, seed=seed)
            false += any(v.verdict not in ("equivalent", "inconclusive") for v in out.verdicts)
        assert false <= 10, (nodes, gpus, false)  # 5% of 100 is 5; 10 is its binomial 98% bound


def test_each_model_is_its_own_family_with_alpha_split_between_them():
    levels = {**healthy(2, 2), "node-3/GPU-30": 1.0, "node-3/GPU-31": 1.0, "node-4/GPU-40": 1.0}
    models = {u: ("H100" if pergpu.split(u)[0] in ("node-1", "node-2") else "A100") for u in levels}
    levels["node-1/GPU-11"] = 0.7
    execute, _ = fleet_of(levels, np.random.default_rng(5))
    out = pergpu.run_gpus(nodes_of(levels), execute, models, PLAN, higher_is_better=True, margin=0.05,
                          confidence=0.95, seed=1)
    by = {v.node: v for v in out.verdicts}
    assert by["node-1/GPU-11"].verdict == "slower"
    assert set(by["node-1/GPU-11"].reference) <= {"node-1/GPU-10", "node-2/GPU-20", "node-2/GPU-21"}
    assert set(by["node-3/GPU-30"].reference) <= {"node-3/GPU-31", "node-4/GPU-40"}  # A100s against A100s only
    assert "2 models" in out.control.method and out.control.nodes == 7


@pytest.mark.parametrize("fp, want", [
    ({"nvidia_visible_devices": "GPU-abc", "cuda_visible_devices": None}, "GPU-abc"),
    ({"nvidia_visible_devices": None, "cuda_visible_devices": "fake-gpu-1"}, "fake-gpu-1"),
    ({"nvidia_visible_devices": "all", "gpus": [{"uuid": "GPU-nvml"}]}, "GPU-nvml"),
    ({}, None),
])
def test_a_pod_learns_its_gpu_from_what_the_device_plugin_put_in_its_environment(fp, want):
    assert pergpu.gpu_id(fp) == want


def stored_run(levels: dict[str, float], health: dict[str, GpuHealth] | None = None) -> FleetResult:
    """A per-GPU run built by pergpu.build from stand-in trial results, as fleet_store builds node runs."""
    rng = np.random.default_rng(7)
    base = RunSpec(workload="spin", device="cuda", env=EnvSpec("pod", {"image": "img"}))
    exp = fleet_run.fleet_experiment("fleet spin", base, nodes_of(levels), ExperimentMeta(command="gpuvs fleet"), 1)
    ex = types.SimpleNamespace(results=[], unit_of={}, models={}, failed_nodes={}, gpus={})
    arms = {a.name: a for a in exp.arms}

    def execute(items):
        got: dict[str, list[float]] = {}
        for node, rnd in items:
            for k, u in enumerate(u for u in sorted(levels) if pergpu.split(u)[0] == node):
                spec = exp.spec_for(arms[node], rnd * 2 + k)
                gid = pergpu.split(u)[1]
                tel = [{"health": health[u].to_dict()}] if health and u in health else []
                ex.results.append(types.SimpleNamespace(spec=spec, ok=True, telemetry=tel, summary={}, fingerprint={
                    "cuda_visible_devices": gid, "gpus": []}))
                ex.unit_of[spec.run_id] = u
                got.setdefault(u, []).append(100.0 * levels[u] * (1 + 0.02 * rng.standard_normal()))
        return got

    out = pergpu.run_gpus(nodes_of(levels), execute, {}, PLAN, higher_is_better=True, margin=0.05, confidence=0.95,
                          seed=2)
    return pergpu.build(exp, [NodeInfo(n) for n in nodes_of(levels)], [], out, ex, plan=PLAN, margin=0.05,
                        confidence=0.95, unit_name="ops/s", higher=True)


SIX = {f"gpuvs-node-{n}/fake-gpu-{g}": 1.0 for n in (1, 2, 3) for g in (0, 1)}


def test_rows_name_node_index_and_id_slowest_first_with_the_why_of_the_slow_gpu():
    levels = dict(SIX, **{"gpuvs-node-3/fake-gpu-1": 0.6})
    peer = GpuHealth(gpu=0, pcie_gen=5, pcie_width=16, readings=10)
    health = {u: peer for u in levels}
    health["gpuvs-node-3/fake-gpu-1"] = GpuHealth(gpu=0, pcie_gen=3, pcie_width=16, readings=10)
    res = stored_run(levels, health)
    first = res.rows[0]
    assert (first.node, first.gpu, first.uuid, first.verdict) == ("gpuvs-node-3", 1, "fake-gpu-1", "slower")
    assert any("Gen3" in w and "Gen5" in w for w in first.why), first.why
    assert [r.verdict for r in res.rows[1:]] == ["equivalent"] * 5 and not any(r.why for r in res.rows[1:])
    assert sorted((r.node, r.gpu, r.uuid) for r in res.rows) == sorted(
        (u.split("/")[0], int(u[-1]), u.split("/")[1]) for u in levels)
    back = FleetResult.from_dict(res.to_dict())  # what the store keeps, read back
    assert back.per_gpu and [(r.node, r.gpu, r.uuid) for r in back.rows] == [(r.node, r.gpu, r.uuid) for r in res.rows]

    text = fleet_report.render("term", res, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "gpuvs-node-3 GPU 1" in text and "fake-gpu-1" in text
    said = fleet_report.summary_line(res)
    assert said.startswith("1 of 6 measured GPU(s) slower than the fleet: gpuvs-node-3 GPU 1 (fake-gpu-1) at 0."), said
    assert fleet_report.render("csv", res).splitlines()[0].startswith("experiment_id,node,gpu,uuid,verdict")


def test_labels_say_how_many_of_a_nodes_gpus_are_slower():
    res = stored_run(dict(SIX, **{"gpuvs-node-3/fake-gpu-1": 0.6}))
    changes = {c.node: c.labels for c in labels.plan(res.rows, experiment_id=res.id, workload="spin")}
    assert changes["gpuvs-node-3"][labels.SLOW_GPUS] == "1" and changes["gpuvs-node-3"][labels.PERF] == "slower"
    assert float(changes["gpuvs-node-3"][labels.RATIO]) < 0.7
    for node in ("gpuvs-node-1", "gpuvs-node-2"):
        assert changes[node][labels.SLOW_GPUS] == "0" and changes[node][labels.PERF] == "equivalent"


def test_the_agent_shows_each_gpu_its_verdict_and_the_nodes_count_of_slow_gpus():
    res = stored_run(dict(SIX, **{"gpuvs-node-3/fake-gpu-1": 0.6}))
    state = State(stale_after_s=600)
    state.fleet(res, "spin", 1_800_000_000.0)
    assert not state.figures  # the rows are GPUs: no node figure is made of them
    got = {}
    text = metrics.exposition(metrics.registry(state)).decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            got.setdefault(s.name, []).append((s.labels, s.value))
    ratios = {(d["node"], d["gpu"], d["uuid"]): v for d, v in got["gpuvs_gpu_perf_ratio"]}
    assert len(ratios) == 6 and ratios[("gpuvs-node-3", "1", "fake-gpu-1")] < 0.7
    slower = [d for d, v in got["gpuvs_gpu_perf_verdict"] if d["verdict"] == "slower" and v == 1.0]
    assert [(d["node"], d["gpu"], d["uuid"], d["workload"]) for d in slower] == [("gpuvs-node-3", "1", "fake-gpu-1",
                                                                                 "spin")]
    assert {d["node"]: v for d, v in got["gpuvs_node_slow_gpus"]} == {"gpuvs-node-1": 0, "gpuvs-node-2": 0,
                                                                      "gpuvs-node-3": 1}


@pytest.mark.parametrize("device, extra, says", [
    ("cpu", {}, "--per-gpu measures each GPU in a pod of its own: it needs --device cuda"),
    ("cuda", {"reference": "n1"}, "--reference is not supported with --per-gpu"),
    ("cuda", {"label": True, "condition": True}, "--condition is not supported with --per-gpu"),
])
def test_per_gpu_refuses_what_it_cannot_do_in_one_line(device, extra, says):
    base = RunSpec(workload="spin", device=device, env=EnvSpec("pod", {"image": "img"}))
    with pytest.raises(UsageError) as exc:
        fleet_run.check(base, fleet_run.FleetOptions(per_gpu=True, **extra))
    assert str(exc.value).startswith(says) and "\n" not in str(exc.value)


def test_the_agent_runs_a_fleet_per_gpu_when_its_workload_says_so():
    from gpuvs.agent.config import AgentConfig, WorkloadSpec
    from gpuvs.agent.ledger import RunRecord
    from gpuvs.agent.runs import fleet_request

    c = AgentConfig(store="a.db", kubeconfig="/k", device="cuda")
    base, o = fleet_request(c, RunRecord("r1", "api"), "ns", "img:1", ["n1", "n2"],
                            WorkloadSpec.parse("gpu-check:per-gpu=true"))
    assert o.per_gpu and base.device == "cuda" and base.num_gpus == 1
    fleet_run.check(base, o)  # what run_fleet checks first: the agent's per-GPU fleet is one it can run
    assert o.command.endswith("--per-gpu true")  # the command line it stands for


def test_a_per_gpu_run_is_no_point_of_a_nodes_history(tmp_path):
    """Its rows are GPUs (two per node here): read as node rows they would be two points of one node in one run."""
    import dataclasses

    from fleet_store import T0, store_fleet_run
    from gpuvs.fleet.assess import stored_history as stored
    from gpuvs.store.db import Store

    res = stored_run(dict(SIX))
    with Store(tmp_path / "g.db") as st:
        store_fleet_run(st, {"gpuvs-node-1": 1.0, "gpuvs-node-2": 1.0, "gpuvs-node-3": 1.0}, created=T0,
                        rng=np.random.default_rng(1))
        meta = ExperimentMeta(command="gpuvs fleet spin --per-gpu", margin=0.05, confidence=0.95)
        st.create_experiment(res.id, "fleet spin", "fleet", dataclasses.replace(meta, trials=None), created=T0 + 60)
        st.update_meta(res.id, fleet=res.to_dict())
        history = stored.read(st)
    (spin,) = history.workloads
    assert len(spin.runs) == 1 and spin.runs[0].run_id != res.id  # the node run only
