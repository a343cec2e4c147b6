"""The pair fleet in the agent and its report (issue 35, item 3).

The terminal report wraps at the width without losing a word.
The agent's metrics of the last pair fleet come from a real stored result, read as at start, and pass promtool.
The agent's request of a pair fleet (--workload collective:pairs=true,...) and its refusals."""

from __future__ import annotations

import random

import pytest
from cluster import cluster  # noqa: F401  (the session fixture)
from environments.test_pod import kube, namespace  # noqa: F401  (this session's namespace, emptied per test)

from gpuvs.fleet.assess import pair_verdicts
from gpuvs.fleet.execute import pair_plan as pairs
from gpuvs.fleet.execute.pair_run import PairFleetResult, arm_name
from gpuvs.report import pair_fleet

LONG = [f"gpu-node-{c}-rack-{i:02d}.example.internal" for i, c in enumerate("abcde")]


def result(names=LONG, slow: str | None = LONG[2], link: tuple[str, str] | None = None, seed: int = 3,
           rid: str = "e1pairs") -> PairFleetResult:
    """A pair fleet of every pair of `names`, 4 trials each (bus bandwidth about 10 GB/s, 1% noise), `slow` at
    0.6x and the `link` pair at 0.7x: judged as pair_run judges it."""
    rng = random.Random(seed)
    every = [pairs.pair(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    values = {}
    for p in every:
        f = 10.0 * (0.6 if slow in p else 1.0) * (0.7 if link and set(p) == set(link) else 1.0)
        values[p] = [f * rng.gauss(1, 0.01) for _ in range(4)]
    outcome = pair_verdicts.judge(names, values, margin=0.05, confidence=0.95, looks=2)
    return PairFleetResult(id=rid, workload="collective", unit="GB/s", margin=0.05, confidence=0.95, partners=4,
                           second=2, trials=4, parallel=2, nodes=list(names), first=every,
                           suspects=[slow] if slow else [], second_pairs=[],
                           failed={arm_name((names[0], "gpu-node-z-rack-99.example.internal")):
                                   "the pod could not be placed on gpu-node-z-rack-99.example.internal within its "
                                   "start timeout of 120 s (Unschedulable)"},
                           values={arm_name(p): v for p, v in values.items()}, outcome=outcome, seconds=412.0,
                           pod_starts=80, command="gpuvs fleet collective --pairs")


@pytest.mark.parametrize("width", [80, 60])
def test_the_terminal_report_wraps_at_the_width_and_loses_no_word(width):
    res = result()
    wide = pair_fleet.text(res, width=1000)
    summary = res.outcome.summary()
    assert len(summary) > 80 and LONG[2] in summary  # the case: the sentence alone passes 80 columns
    assert any(len(x) > 80 for x in wide.splitlines())
    out = pair_fleet.text(res, width=width)
    assert max(len(x) for x in out.splitlines()) <= width, out
    assert out.split() == wide.split()  # every word, in order: only the breaks moved
    assert out.count("\n") > wide.count("\n")


# -- the metrics of the last pair fleet, from a real store ------------------------------------------------------

def stored_agent(tmp_path, res: PairFleetResult, at: float, older: PairFleetResult | None = None):
    """An agent over a store that holds `res` as pair_run stores it (the experiment's meta `pair_fleet`) and the
    ledger's run that made it (and before it `older`): its state read back as at its start."""
    from gpuvs.agent.config import AgentConfig
    from gpuvs.agent.ledger import FleetOutcome, Ledger, RunRecord
    from gpuvs.agent.service import Agent
    from gpuvs.store.db import Store
    from gpuvs.store.records import ExperimentMeta

    store = tmp_path / "gpuvs.db"
    ledger = Ledger(store)
    for i, r in enumerate([x for x in (older, res) if x is not None]):
        with Store(store) as st:
            st.create_experiment(r.id, "agent pairs", "fleet", ExperimentMeta(command=r.command))
            st.update_meta(r.id, pair_fleet=r.to_dict())
        t = at - 3600 * (1 - i) if older else at
        ledger.save(RunRecord(f"20261127-00000{i}-aaaa", "schedule", "ok", queued_at=t, started_at=t, finished_at=t,
                              reached=True, tested=list(r.nodes), fleets=[FleetOutcome("collective", r.id)]))
    ledger.close()
    agent = Agent(AgentConfig(store=str(store), every_s=6 * 3600))
    agent._restore()
    return agent


def scrape(agent) -> str:
    from gpuvs.agent.metrics import exposition

    return exposition(agent.registry).decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_agents_metrics_carry_the_stored_pair_fleets_node_and_pair_verdicts(tmp_path):
    import time

    names = ["node-1", "node-2", "node-3", "node-4", "node-5"]
    res = result(names, slow="node-3", link=("node-1", "node-5"), seed=5)
    at = time.time() - 60
    m = samples(scrape(stored_agent(tmp_path, res, at)))
    for v in res.outcome.nodes:
        key = (("node", v.node), ("workload", "collective"))
        assert m[("gpuvs_node_link_ratio", key)] == pytest.approx(v.speed)
        for end, value in (("low", v.ci_low), ("high", v.ci_high)):
            assert m[("gpuvs_node_link_interval_ratio", tuple(sorted(key + (("bound", end),))))] == pytest.approx(value)
        assert m[("gpuvs_node_link_stale", key)] == 0.0
        assert m[("gpuvs_node_link_last_success_timestamp_seconds", key)] == pytest.approx(at)
        verdicts = {dict(k[1])["verdict"]: val for k, val in m.items()
                    if k[0] == "gpuvs_node_link_verdict" and dict(k[1])["node"] == v.node}
        assert verdicts[v.verdict] == 1.0 and sum(verdicts.values()) == 1.0
    slow = {dict(k[1])["node"] for k, val in m.items() if k[0] == "gpuvs_node_link_verdict" and val == 1.0
            and dict(k[1])["verdict"] == "slower"}
    assert slow == {"node-3"}  # the slow node, and not the link's two ends
    n3 = (("node", "node-3"), ("workload", "collective"))
    assert m[("gpuvs_node_link_ratio", n3)] == pytest.approx(0.6, abs=0.05)
    assert len(res.outcome.pairs) == 10
    for v in res.outcome.pairs:
        key = (("node_a", v.pair[0]), ("node_b", v.pair[1]), ("workload", "collective"))
        assert m[("gpuvs_link_ratio", key)] == pytest.approx(v.speed)
        assert m[("gpuvs_link_verdict", tuple(sorted(key + (("cause", v.cause), ("verdict", v.verdict)))))] == 1.0
    link = (("node_a", "node-1"), ("node_b", "node-5"), ("workload", "collective"))
    assert m[("gpuvs_link_verdict", tuple(sorted(link + (("cause", "link"), ("verdict", "slower")))))] == 1.0
    assert m[("gpuvs_link_ratio", link)] == pytest.approx(0.7, abs=0.05)
    assert m[("gpuvs_node_gone", (("node", "node-3"),))] == 0.0  # a node known from its links only


def test_a_node_the_last_pair_fleet_did_not_judge_keeps_its_links_figure_stale(tmp_path):
    import time

    older = result(["node-1", "node-2", "node-3", "node-4"], slow="node-4", rid="e0older")
    newer = result(["node-1", "node-2", "node-3"], slow=None, rid="e1newer")
    m = samples(scrape(stored_agent(tmp_path, newer, time.time() - 60, older=older)))
    n4 = (("node", "node-4"), ("workload", "collective"))
    assert m[("gpuvs_node_link_stale", n4)] == 1.0 and m[("gpuvs_node_link_ratio", n4)] < 0.7
    assert m[("gpuvs_node_link_stale", (("node", "node-1"), ("workload", "collective")))] == 0.0
    pairs_now = {dict(k[1])["node_a"] + "+" + dict(k[1])["node_b"] for k in m if k[0] == "gpuvs_link_ratio"}
    assert pairs_now == {"node-1+node-2", "node-1+node-3", "node-2+node-3"}  # the last run's pairs only


def test_promtool_lints_the_metrics_of_a_pair_fleet_clean(tmp_path):
    import subprocess
    import time

    from agent.test_alerting import promtool

    text = scrape(stored_agent(tmp_path, result(), time.time()))
    assert "gpuvs_node_link_ratio{" in text and "gpuvs_link_verdict{" in text
    r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


# -- the agent's pair fleet: --workload collective:pairs=true,... ------------------------------------------------

def test_a_pairs_workload_becomes_the_pair_fleet_the_library_runs():
    """pairs=true, partners=, second-pass= as a PairPlan; the collective's parameters and the run options as for a
    node fleet; no --condition, --taint or --max-trials (the pair fleet refuses them: the agent's own are left
    out); the options pass pair_run's own check; the command line it stands for is `gpuvs fleet ... --pairs`."""
    from gpuvs.agent.config import AgentConfig, WorkloadSpec
    from gpuvs.agent.ledger import RunRecord
    from gpuvs.agent.runs import fleet_request
    from gpuvs.fleet.execute import pair_run

    c = AgentConfig(store="a.db", trials=4, max_trials=8, condition=True, taint=True)
    w = WorkloadSpec.parse("collective:pairs=true,partners=3,second-pass=1,min-bytes=256K,max-bytes=256K,trials=3")
    plan = w.pair_plan()
    assert (plan.partners, plan.second) == (3, 1)
    base, o = fleet_request(c, RunRecord("r1", "schedule"), "ns", "img:1", ["n1", "n2", "n3"], w)
    assert base.workload == "collective" and base.env.kind == "pod" and base.device == "cpu"
    assert int(base.params["min_bytes"]) == int(base.params["max_bytes"]) == 256 * 1024
    assert (o.trials, o.max_trials, o.condition, o.taint, o.label) == (3, None, False, False, True)
    pair_run.check(base, o)  # what `gpuvs fleet --pairs` would refuse, it does not
    assert o.command.startswith("gpuvs fleet collective --image img:1 ")
    assert o.command.endswith("--pairs --partners 3 --second-pass 1") and "--condition" not in o.command
    assert "--max-trials" not in o.command and "--taint" not in o.command
    # a node fleet of the same workload keeps the agent's own options, and has no plan
    w2 = WorkloadSpec.parse("collective:min-bytes=256K")
    assert w2.pair_plan() is None
    _, o2 = fleet_request(c, RunRecord("r2", "schedule"), "ns", "img", ["n1", "n2"], w2)
    assert (o2.max_trials, o2.condition, o2.taint) == (8, True, True) and "--pairs" not in o2.command


@pytest.mark.parametrize("text, said", [
    ("spin:pairs=true", "pairs=true measures the link between two nodes: workload spin is not allowed (use "
                        "collective)"),
    ("collective:partners=5", "partners applies with pairs=true"),
    ("collective:pairs=true,partners=2", "--partners: '2' is not allowed; expected an integer from 3 to 100"),
    ("collective:pairs=maybe", "--pairs: 'maybe' is not allowed; expected true or false"),
])
def test_a_bad_pairs_workload_is_one_line_at_start(tmp_path, text, said):
    from conftest import run_cli

    r = run_cli("agent", "--workload", text, "--store", str(tmp_path / "a.db"), cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1, r.stderr


# -- on the real test cluster: one agent run of a pair fleet ----------------------------------------------------

@pytest.mark.cluster
def test_the_agent_runs_its_pair_fleet_labels_the_nodes_and_exports_the_verdicts(kube, tmp_path):
    """`gpuvs agent --workload collective:pairs=true,...` by hand against the test cluster (3 nodes: every pair),
    one run asked for with POST /runs: it ends ok, tested every node, its fleet's experiment is the pair fleet's;
    /metrics has each node's links figure (fresh) and each pair's, equal to the stored result; each node carries
    gpuvs.io/links with the verdict the metrics give; nothing is left (pods, gpuvs.io/testing). Labels and the
    priority class are removed whatever happens."""
    import json
    import subprocess
    import sys
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from conftest import gpuvs_env, stop_process, wait_for
    from agent.test_agent_cluster import free_port, http, labelled_testing, post_run, runs
    from fleet.test_fleet_pairs_cluster import three
    from environments.test_pod import IMAGE, NS
    from environments.test_pod_nodes import left, torch_mounts
    from gpuvs.fleet.vocabulary import word
    from gpuvs.store.db import Store

    nodes = sorted(three(kube))
    core = kube.core()
    sched = client.SchedulingV1Api(core.api_client)
    made_class = False
    try:
        sched.create_priority_class({"metadata": {"name": "gpuvs-trial"}, "value": -100,
                                     "preemptionPolicy": "Never", "description": "gpuvs's agent test"})
        made_class = True
    except ApiException as exc:
        assert exc.status == 409
    mounts = torch_mounts()
    pod_opts = [f"{k.removeprefix('--')}={v}" for k, v in zip(mounts[::2], mounts[1::2])]
    spec = ",".join(["collective:pairs=true", "partners=3", "second-pass=0", "trials=2", "min-bytes=256K",
                     "max-bytes=256K", "warmup=2", "iters=10", "repeats=3", *pod_opts])
    store, port, log = tmp_path / "gpuvs.db", free_port(), tmp_path / "agent.log"
    (tmp_path / "token").write_text("pairs-test-token")
    agent = None
    t0 = time.monotonic()
    try:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpuvs", "agent", "--kubeconfig", str(kube.kubeconfig), "--namespace", NS,
             "--image", IMAGE, "--image-pull-policy", "Never", "--pod-security", "baseline", "--validate", "false",
             "--workload", spec,
             "--parallel", "3", "--margin", "0.3", "--every", "1h", "--first-after", "1h", "--store", str(store),
             "--listen", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "token"), "--min-interval", "10s"],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=gpuvs_env(), cwd=tmp_path)
        wait_for(lambda: http(port, "/readyz")[0] == 200, 60, "the agent ready")
        code, body = post_run(port, "pairs-test-token")
        assert code == 202, body
        run_id = json.loads(body)["id"]
        done = wait_for(lambda: next((x for x in runs(port) if x["id"] == run_id
                                      and x["status"] not in ("queued", "running")), None), 300,
                        f"agent run {run_id} to end", step=1)
        assert done["status"] == "ok" and done["tested"] == nodes, (done, log.read_text()[-3000:])
        exp = done["fleets"][0]["experiment"]
        text = http(port, "/metrics")[1].decode()
        m = samples(text)
        with Store(store) as st:
            res = PairFleetResult.from_dict(st.experiment(exp).meta.pair_fleet)
        assert sorted(res.nodes) == nodes and len(res.first) == 3 and res.pod_starts == 12
        assert res.command.endswith("--pairs --partners 3 --second-pass 0")
        got = {n: (core.read_node(n).metadata.labels or {}).get("gpuvs.io/links") for n in nodes}
        for v in res.outcome.nodes:
            key = (("node", v.node), ("workload", "collective"))
            assert m[("gpuvs_node_link_ratio", key)] == pytest.approx(v.speed)
            assert m[("gpuvs_node_link_stale", key)] == 0.0
            assert m[("gpuvs_node_link_verdict", tuple(sorted(key + (("verdict", v.verdict),))))] == 1.0
            assert got[v.node] == word(v.verdict), (got, v.verdict)
        assert len([k for k in m if k[0] == "gpuvs_link_ratio"]) == 3
        assert f"run {run_id}: pair fleet collective:pairs=true" in log.read_text()
        print(f"\nagent pair fleet: {res.outcome.summary()}; {res.pod_starts} pod starts, "
              f"{time.monotonic() - t0:.0f} s in all")
    finally:
        if agent is not None:
            assert stop_process(agent, 60) == 0, log.read_text()[-2000:]
        for n in nodes:
            core.patch_node(n, {"metadata": {"labels": {"gpuvs.io/links": None, "gpuvs.io/links-ratio": None},
                                             "annotations": {"gpuvs.io/links-details": None}}})
        if made_class:
            sched.delete_priority_class("gpuvs-trial")
    assert left(kube) == [] and labelled_testing(core) == []
