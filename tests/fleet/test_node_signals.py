"""What the cluster's tools act on, without a cluster: the one vocabulary and the condition's reasons.

The condition's transition time, the taint plan and its circuit breaker, and the options refused in one line.
A dry run writes nothing: it is given no API at all. Against the real cluster: tests/fleet/test_node_signals_cluster.py."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import run_cli
from gpuvs.fleet import vocabulary
from gpuvs.fleet.cluster import signals
from gpuvs.fleet.cluster import taints
from gpuvs.fleet.execute.node_choice import NodeInfo
from gpuvs.fleet.result import FleetResult, NodeRow, NodeSignal
from gpuvs.kube import nodestatus


def test_one_vocabulary_and_the_conditions_reasons():
    assert vocabulary.WORDS == ("slower", "slower-within-margin", "equivalent", "faster-within-margin", "faster",
                                "inconclusive", "reference")
    # the labels written before are read as what they meant
    assert [vocabulary.word(v) for v in ("ok", "slow", "slow-within-margin", "fast-within-margin", "bogus", None)] \
        == ["equivalent", "slower", "slower-within-margin", "faster-within-margin", "inconclusive", "inconclusive"]
    got = {w: vocabulary.condition(w) for w in vocabulary.WORDS}
    assert got == {"slower": ("True", "SlowerThanPeers"), "slower-within-margin": ("False", "SlowerWithinMargin"),
                   "equivalent": ("False", "Ok"), "faster-within-margin": ("False", "Ok"), "faster": ("False", "Ok"),
                   "inconclusive": ("Unknown", "Inconclusive"), "reference": ("False", "Ok")}
    assert vocabulary.condition("slower", against="past") == ("True", "DriftingSlower")
    from gpuvs.agent.metrics import VERDICTS

    assert set(VERDICTS) == set(vocabulary.WORDS)  # the metrics' verdict label says the same words


def test_the_transition_time_is_kept_while_status_and_reason_stay():
    first = nodestatus.condition("True", "SlowerThanPeers", "m", None, now=1000.0)
    assert first["lastTransitionTime"] == first["lastHeartbeatTime"] == "1970-01-01T00:16:40Z"
    before = {"status": "True", "reason": "SlowerThanPeers", "lastTransitionTime": first["lastTransitionTime"]}
    again = nodestatus.condition("True", "SlowerThanPeers", "m2", before, now=2000.0)
    assert again["lastTransitionTime"] == "1970-01-01T00:16:40Z" and again["lastHeartbeatTime"] == "1970-01-01T00:33:20Z"
    flipped = nodestatus.condition("False", "Ok", "m3", before, now=3000.0)
    assert flipped["lastTransitionTime"] == flipped["lastHeartbeatTime"] == "1970-01-01T00:50:00Z"
    assert flipped["type"] == "GpuvsPerformance" and len(nodestatus.condition("True", "X", "y" * 5000, None)["message"]) == 1024


def test_the_taint_plan_untaints_first_then_taints_the_slowest_up_to_the_breakers_limit():
    assert [taints.limit_of(s, n) for s, n in ((0.1, 3), (0.1, 30), (0.1, 35), (0.5, 10), (1.0, 4), (0.1, 0))] \
        == [1, 3, 3, 5, 4, 0]
    v = [("a", "slower"), ("b", "slower"), ("c", "equivalent"), ("d", "inconclusive"), ("e", "slower-within-margin")]
    # c and e read well: untainted (and count no more); d is inconclusive: kept as it is
    p = taints.plan(v, tainted={"c", "d", "e"}, gpu_nodes=20, share=0.1)
    assert [(c.node, c.action) for c in p.changes] == [("c", "untaint"), ("e", "untaint"), ("a", "taint"),
                                                       ("b", "refused")]
    assert p.limit == 2 and p.tainted == 2 and p.circuit_open
    assert "circuit breaker open: 2 of 20 GPU node(s) carry gpuvs.io/slow, at most 2" in p.changes[-1].detail
    p = taints.plan(v, tainted={"a"}, gpu_nodes=20, share=0.1)
    assert [(c.node, c.action) for c in p.changes] == [("a", "keep"), ("b", "taint")] and not p.circuit_open


def rows() -> list[NodeRow]:
    return [NodeRow("n1", "equivalent", n_ok=4, n_trials=4, speed=1.01, speed_low=0.9, speed_high=1.1),
            NodeRow("n2", "slower", n_ok=4, n_trials=4, speed=0.25, speed_low=0.2, speed_high=0.3,
                    fingerprint={"gpu_name": "NVIDIA H100"}, differs={"NVIDIA driver": ["535", "550"]}),
            NodeRow("n3", "failed", reason="no trial")]


def test_a_dry_run_says_what_it_would_do_and_writes_nothing():
    """No API is given (None): anything written would fail. The breaker counts the taint already on n9."""
    nodes = [NodeInfo("n1"), NodeInfo("n2"), NodeInfo("n3"),
             NodeInfo("n9", taints=[{"key": "gpuvs.io/slow", "value": "true", "effect": "NoSchedule"}])]
    lines = []
    out, breaker = signals.act(None, rows(), experiment_id="e1", workload="spin", gpu_nodes=nodes, log=lines.append,
                               o=signals.SignalOptions(condition=True, taint=True, dry_run=True))
    assert [(s.node, s.what, s.detail, s.status) for s in out] == [
        ("n1", "condition", "GpuvsPerformance=False Ok", "dry run: not written"),
        ("n2", "condition", "GpuvsPerformance=True SlowerThanPeers", "dry run: not written"),
        ("n2", "taint", "gpuvs.io/slow=true:NoSchedule", "refused: circuit breaker open: 1 of 4 GPU node(s) carry "
                                                         "gpuvs.io/slow, at most 1 (--taint-max-share 0.1)")]
    assert breaker and lines == [f"node n2: not tainted: {out[-1].status[len('refused: '):]}"]
    out, breaker = signals.act(None, rows(), experiment_id="e1", workload="spin", gpu_nodes=nodes[:3],
                               o=signals.SignalOptions(taint=True, taint_effect="PreferNoSchedule", dry_run=True))
    assert [(s.node, s.detail, s.status) for s in out] == [("n2", "gpuvs.io/slow=true:PreferNoSchedule",
                                                            "dry run: not written")] and not breaker
    msg = signals.message(rows()[1], "spin", "e1")
    assert msg == ("slower: 0.250x its peers [0.200-0.300]; GPU NVIDIA H100; differs from the majority: NVIDIA "
                   "driver 535 (most: 550); workload spin, gpuvs run e1")
    row = dataclasses.replace(rows()[1], why=["GPU 0: PCIe Gen3 x16 where its peers run Gen5 x16"])
    assert signals.message(row, "spin", "e1") == (
        "slower: 0.250x its peers [0.200-0.300]; GPU NVIDIA H100; differs from the majority: NVIDIA driver 535 "
        "(most: 550); why: GPU 0: PCIe Gen3 x16 where its peers run Gen5 x16; workload spin, gpuvs run e1")


def test_the_signals_are_kept_with_the_fleets_result_and_a_result_stored_before_reads():
    res = FleetResult("e1", "spin", "ops/sec", True, 0.05, 0.95, taints_plan(), control(), 1, rows(),
                      signals=[NodeSignal("n2", "taint", "gpuvs.io/slow=true:NoSchedule", "tainted")],
                      circuit_open=True)
    back = FleetResult.from_dict(res.to_dict())
    assert back.signals == res.signals and back.circuit_open
    old = res.to_dict()
    del old["signals"], old["circuit_open"]
    assert FleetResult.from_dict(old).signals == [] and not FleetResult.from_dict(old).circuit_open


def taints_plan():
    from gpuvs.fleet.execute import adaptive

    return adaptive.AdaptiveTrials(4, 12, 4)


def control():
    from gpuvs.fleet.assess import node_verdicts as verdicts

    return verdicts.ErrorControl(0.95, looks=1, nodes=2)


@pytest.mark.parametrize("args, says", [
    (["--condition"], "--condition applies with --label"),
    (["--taint"], "--taint applies with --label"),
    (["--label", "--taint", "--taint-effect", "NoExecute"], "--taint-effect"),
    (["--label", "--taint", "--taint-max-share", "0"], "--taint-max-share"),
])
def test_fleet_refuses_bad_signal_options_with_one_line(args, says, tmp_path):
    r = run_cli("fleet", "spin", "--device", "cpu", "--image", "x", "--kubeconfig", str(tmp_path / "none"),
                *args, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_agent_refuses_a_taint_share_of_zero_with_one_line(tmp_path):
    r = run_cli("agent", "--taint", "--taint-max-share", "0", "--store", str(tmp_path / "a.db"), cwd=tmp_path)
    assert r.returncode == 2 and "--taint-max-share" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_deploy_condition_adds_node_status_and_the_agents_flag_and_nothing_else():
    import yaml

    from gpuvs.agent import deploy

    base = deploy.manifests()
    more = deploy.manifests(condition=True)
    added = [m for m in more if m["metadata"]["name"] not in {b["metadata"]["name"] for b in base}]
    assert [(m["kind"], m["metadata"]["name"]) for m in added] == [
        ("ClusterRole", "gpuvs-agent-node-status"), ("ClusterRoleBinding", "gpuvs-agent-node-status"),
        ("Role", "gpuvs-agent-node-events"), ("RoleBinding", "gpuvs-agent-node-events")]
    assert added[0]["rules"] == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert added[2]["metadata"]["namespace"] == "default"
    assert added[2]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]}]
    for binding in (added[1], added[3]):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuvs-agent", "namespace": "gpuvs-system"}]
    agent = next(m for m in more if m["kind"] == "Deployment")
    assert agent["spec"]["template"]["spec"]["containers"][0]["args"].count("--condition") == 1
    assert "--condition" not in next(m for m in base if m["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0].get("args", [])
    # the base is unchanged (the rest of deploy/'s tests hold it), and the component is deploy/node-status's files
    from conftest import ROOT

    folder = ROOT / "deploy" / "node-status"
    order = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    assert added == [yaml.safe_load((folder / n).read_text()) for n in order]


def test_every_pod_gpuvs_starts_tolerates_its_taint_and_carries_the_trial_pods_labels():
    """Trial, validate probe and the agent's hold pods: a node tainted gpuvs.io/slow is tested again, and each pod
    carries app.kubernetes.io/{name,component,managed-by,version} and a gpuvs.io/ key of its run (the old
    selectors kept, the clean-ups still find them)."""
    import gpuvs
    from gpuvs.agent import idle
    from gpuvs.environments.pod import parse_options
    from gpuvs.validate.probe import LABEL, Pods

    slow = {"key": "gpuvs.io/slow", "operator": "Exists"}
    assert slow in parse_options({"image": "img"}).tolerations
    own = parse_options({"image": "img", "toleration": ["gpuvs.io/slow=true:NoSchedule"]}).tolerations
    assert own == [{"key": "gpuvs.io/slow", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    probe = Pods(None, "run1", "img", "Never", "nvidia.com/gpu", 60).body("p", 1, node="n1")
    hold = idle.hold_manifest(idle.Hold("n1", 2, "h"), run_id="r1", image="img", python="python3",
                              resource="nvidia.com/gpu", priority_class="gpuvs-trial", pull_policy="Never",
                              restricted=False)
    conventions = {"app.kubernetes.io/name": "gpuvs", "app.kubernetes.io/managed-by": "gpuvs",
                   "app.kubernetes.io/version": gpuvs.__version__, "gpuvs": "1"}
    assert probe["metadata"]["labels"] == {**conventions, "app.kubernetes.io/component": "validate",
                                           "gpuvs.io/validate-run": "run1", LABEL: "run1"}
    assert hold["metadata"]["labels"] == {**conventions, "app.kubernetes.io/component": "hold",
                                          "gpuvs.io/agent-run": "r1", idle.HOLD_LABEL: "1", "gpuvs.agent-run": "r1"}
    assert probe["spec"]["tolerations"] == [slow] and hold["spec"]["tolerations"] == [slow]
