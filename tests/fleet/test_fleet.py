"""gpuvs fleet without a cluster: node choice, the trial schedule, and each node against the fleet.

Error control across nodes, simulated with the project's own adaptive run and verdicts.
Fingerprints against the majority, labels and the five report formats. The cluster runs: test_fleet_cluster.py."""

import csv
import io
import json
import math
import random

import pytest

from gpuvs.fleet.execute import adaptive
from gpuvs.fleet.assess import fingerprint_diff as fingerprints
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.execute import node_choice as nodes
from gpuvs.fleet.execute import trial_order as schedule
from gpuvs.fleet.simulate import simulate_nodes as simulate
from gpuvs.fleet.assess import node_verdicts as verdicts
from gpuvs.fleet.result import FleetResult, NodeLabels, NodeRow
from gpuvs.fleet.assess.rows import sort_rows
from gpuvs.store.records import ExperimentMeta
from gpuvs.report import fleet as report


def node(name, **kw):
    kw.setdefault("allocatable", {"nvidia.com/gpu": "2"})
    return nodes.NodeInfo(name, **kw)


# -- node choice ---------------------------------------------------------------------------------

def test_default_fleet_is_the_gpu_nodes_and_blocked_ones_are_rows_with_reasons():
    img = {"img:1"}
    cluster = [node("a", images=img), node("b", images=img), node("cpu-only", allocatable={"cpu": "8"}),
               node("down", ready=False, ready_reason="NodeStatusUnknown, Kubelet stopped posting node status."),
               node("cordoned", unschedulable=True),
               node("tainted", taints=[{"key": "gpu-broken", "value": "yes", "effect": "NoSchedule"}]),
               node("noimage", images={"other:1"})]
    ok, out = nodes.select(cluster, image="img:1", pull_never=True)
    assert [n.name for n in ok] == ["a", "b"]
    reasons = {e.node: e.reason for e in out}
    assert "cpu-only" not in reasons  # not a GPU node: not part of the default fleet, not a row
    assert reasons["down"].startswith("not ready: NodeStatusUnknown")
    assert reasons["cordoned"].startswith("unschedulable")
    assert "gpu-broken=yes:NoSchedule" in reasons["tainted"]
    assert reasons["noimage"] == "image img:1 is not on the node (imagePullPolicy Never)"


def test_image_check_only_with_pull_never_and_matches_tags():
    a = node("a", images={"localhost/gpuvs-python:test", "k8s.gcr.io/pause:3.2"})
    ok, out = nodes.select([a, node("b", images={"busybox"})], image="localhost/gpuvs-python:test", pull_never=True)
    assert [n.name for n in ok] == ["a"] and out[0].node == "b"
    ok, out = nodes.select([a, node("b")], image="localhost/gpuvs-python:test", pull_never=False)
    assert [n.name for n in ok] == ["a", "b"] and not out


def test_named_nodes_labels_and_tolerations():
    cluster = [node("a", labels={"pool": "x"}), node("b", labels={"pool": "y"}), node("c", allocatable={}),
               node("t", taints=[{"key": "k", "value": "", "effect": "NoExecute"}])]
    ok, out = nodes.select(cluster, names=["a", "b", "c", "zz"], labels=["pool"])
    assert [n.name for n in ok] == ["a", "b"]
    assert {e.node: e.reason for e in out} == {"c": "does not carry the labels asked for (pool)",
                                               "zz": "no such node in the cluster"}
    ok, _ = nodes.select(cluster, labels=["pool=y"])
    assert [n.name for n in ok] == ["b"]
    ok, _ = nodes.select(cluster, need_gpus=False, names=["c"])
    assert [n.name for n in ok] == ["c"]
    ok, out = nodes.select(cluster, names=["t"], tolerations=[{"key": "k", "operator": "Exists"}])
    assert [n.name for n in ok] == ["t"] and not out


# -- schedule ------------------------------------------------------------------------------------

def test_order_interleaves_nodes_and_reverses_alternate_rounds():
    items = [(n, t) for n in "abcd" for t in range(4)]
    got = schedule.order(items, random.Random(3))
    assert sorted(got) == sorted(items)
    rounds = [got[i:i + 4] for i in range(0, 16, 4)]
    for r, rnd in enumerate(rounds):
        assert sorted(n for n, _ in rnd) == list("abcd") and {t for _, t in rnd} == {r}
    assert [n for n, _ in rounds[1]] == [n for n, _ in reversed(rounds[0])]
    firsts = {tuple(n for n, _ in schedule.order(items, random.Random(s))[:4]) for s in range(20)}
    assert len(firsts) > 5  # shuffled, not one fixed order


def test_slots_never_two_on_one_node_and_at_most_parallel():
    items = schedule.order([(n, t) for n in "abc" for t in range(5)] + [("d", 0)], random.Random(1))
    slots = schedule.Slots(items, parallel=2)
    rng = random.Random(2)
    in_flight: list = []
    seen = []
    while not slots.finished:
        started = slots.take()
        in_flight += started
        assert len(in_flight) <= 2
        assert len({n for n, _ in in_flight}) == len(in_flight)
        done = in_flight.pop(rng.randrange(len(in_flight)))
        slots.done(done)
        seen.append(done)
    assert sorted(seen) == sorted(items)
    with pytest.raises(ValueError):
        schedule.Slots(items, parallel=0)


# -- each node against the fleet -----------------------------------------------------------------

def test_reference_is_the_band_around_the_median_of_the_others():
    means = {"a": 100.0, "b": 101.0, "c": 99.0, "d": 60.0, "e": 100.5}
    assert verdicts.reference_for("d", means, margin=0.05) == ["a", "b", "c", "e"]
    assert verdicts.reference_for("a", means, margin=0.05) == ["b", "c", "e"]  # d is outside the band
    # three nodes, one slow: a healthy node is compared with the other healthy node only
    three = {"a": 100.0, "b": 99.0, "s": 50.0}
    assert verdicts.reference_for("a", three, margin=0.05) == ["b"]
    assert verdicts.reference_for("s", three, margin=0.05) == ["a", "b"]
    assert verdicts.reference_for("a", three, named="s") == ["s"]
    assert verdicts.reference_for("a", {"a": 1.0}) == []


def test_holm_steps_down_and_adjusts():
    rejected, adj = verdicts.holm({"a": 0.001, "b": 0.02, "c": 0.04}, 0.05)
    assert rejected == {"a", "b", "c"}  # 0.001 <= 0.05/3, 0.02 <= 0.05/2, 0.04 <= 0.05/1
    assert adj == pytest.approx({"a": 0.003, "b": 0.04, "c": 0.04})
    rejected, _ = verdicts.holm({"a": 0.001, "b": 0.03, "c": 0.04}, 0.05)
    assert rejected == {"a"}  # 0.03 > 0.05/2: stop, c is not tested


def test_holm_stops_at_the_first_acceptance():
    rejected, _ = verdicts.holm({"a": 0.03, "b": 0.001}, 0.05)
    assert rejected == {"a", "b"}  # b first: 0.001 <= 0.025, then a: 0.03 <= 0.05
    rejected, _ = verdicts.holm({"a": 0.03, "b": 0.03}, 0.05)
    assert rejected == set()  # 0.03 > 0.025: stop


def fleet_values(speeds, n, cv=0.01, seed=0):
    rng = random.Random(seed)
    return {k: [100 * s * (1 + cv * rng.gauss(0, 1)) for _ in range(n)] for k, s in speeds.items()}


def test_assess_names_the_slow_node_with_its_ratio_and_the_others_equivalent():
    values = fleet_values({"a": 1.0, "b": 1.0, "c": 1.0, "s": 0.6}, 6)
    control = verdicts.ErrorControl(0.95, looks=1)
    found = {v.node: v for v in verdicts.assess(values, higher_is_better=True, margin=0.05, control=control)}
    assert found["s"].verdict == "slower" and found["s"].speed == pytest.approx(0.6, abs=0.02)
    assert found["s"].ci_low < found["s"].speed < found["s"].ci_high < 0.7
    assert all(found[n].verdict == "equivalent" for n in "abc")
    assert control.nodes == 4 and control.interval_confidence == pytest.approx(1 - 0.05 / 4)


def test_assess_for_times_lower_is_better():
    values = fleet_values({"a": 1.0, "b": 1.0, "slow": 1.5}, 5)  # seconds: the slow node takes longer
    found = {v.node: v for v in verdicts.assess(values, higher_is_better=False, margin=0.05,
                                                control=verdicts.ErrorControl(0.95, looks=1))}
    assert found["slow"].verdict == "slower" and found["slow"].speed == pytest.approx(1 / 1.5, abs=0.03)


def test_assess_with_a_named_reference_and_too_few_trials():
    values = fleet_values({"ref": 1.0, "a": 1.0, "b": 0.5}, 4)
    values["c"] = [100.0]
    found = {v.node: v for v in verdicts.assess(values, higher_is_better=True, margin=0.05, reference="ref",
                                                control=verdicts.ErrorControl(0.95, looks=2))}
    assert found["ref"].verdict == "reference"
    assert found["a"].reference == ["ref"] and found["b"].verdict == "slower"
    assert found["c"].verdict == "inconclusive" and "2+" in found["c"].reason


def test_adaptive_adds_trials_only_where_unsettled():
    calls = []
    cv = {"a": 0.005, "b": 0.005, "c": 0.005, "d": 0.005, "near": 0.06}  # near: too noisy to settle at once
    rng = random.Random(5)

    def execute(items):
        calls.append(sorted(items))
        out = {}
        for n, _ in items:
            out.setdefault(n, []).append(100 * (1 + cv[n] * rng.gauss(0, 1)))
        return out

    plan = adaptive.AdaptiveTrials(trials=4, max_trials=12, step=4)
    outcome = adaptive.run(list(cv), execute, plan, higher_is_better=True, margin=0.05, confidence=0.95, seed=1)
    assert plan.looks == 3 and outcome.control.looks == 3
    assert {n for n, _ in calls[0]} == set(cv) and len(calls[0]) == 20
    assert len(calls) > 1 and "near" in {n for n, _ in calls[1]}
    assert {n for n, _ in calls[1]} == {"near"}  # settled nodes got no more
    assert all(k <= 12 for k in outcome.attempted.values())
    # trial numbers continue per node
    assert sorted(t for n, t in calls[1] if n == "near") == [4, 5, 6, 7]


def test_a_node_whose_trials_all_fail_gets_no_more():
    def execute(items):
        out = {}
        for n, _ in items:
            if n != "dead":
                out.setdefault(n, []).append(100.0 + random.random())
        return out

    outcome = adaptive.run(["a", "b", "dead"], execute, adaptive.AdaptiveTrials(2, 6, 2), higher_is_better=True,
                           margin=0.0, confidence=0.95)
    assert outcome.dead == ["dead"] and outcome.attempted["dead"] == 2
    alone = adaptive.run(["a", "dead"], execute, adaptive.AdaptiveTrials(4, 12, 4), higher_is_better=True, margin=0.05,
                         confidence=0.95)
    assert alone.attempted == {"a": 4, "dead": 4}  # no peer left: no more trials for a either


def test_false_alarm_rate_of_healthy_fleets_is_within_alpha():
    """The project's own adaptive run + verdicts on simulated healthy fleets: how often is ANY node
    called slower or faster? The docs promise at most 1 - confidence (5%) for the default plan."""
    plan = adaptive.AdaptiveTrials(trials=4, max_trials=12, step=4)
    runs = 300
    for n_nodes, seed in ((3, 11), (10, 12)):
        rates = simulate.simulate(n_nodes, runs, cv=0.03, plan=plan, margin=0.05, seed=seed)
        # 5% of 300 is 15; the binomial 99% upper bound for a true 5% is about 25: 20 leaves room
        assert rates.any_false <= 20, rates
    slow = simulate.simulate(3, 200, cv=0.03, plan=plan, slow={1: 0.8}, seed=13)
    assert slow.power >= 0.95 and slow.false_slower <= 12, slow


# -- fingerprints and labels ---------------------------------------------------------------------

def test_majority_differences_name_the_fields():
    fps = {n: fingerprints.combined({"gpu_name": "H100", "driver": "580", "gpus": [{"memory_mib": 81559}]},
                                    {"kernel": "6.8", "os_image": "ubuntu"}) for n in "abcd"}
    fps["c"]["driver"] = "550"
    fps["d"]["node"]["kernel"] = "5.15"
    diff = fingerprints.majority_differences(fps)
    assert diff["c"] == {"NVIDIA driver": ("550", "580")}
    assert diff["d"] == {"kernel": ("5.15", "6.8")}
    assert diff["a"] == diff["b"] == {}
    two = fingerprints.majority_differences({"a": {"driver": "1"}, "b": {"driver": "2"}})
    assert two == {"a": {}, "b": {}}  # no majority: nobody is flagged
    assert fingerprints.get({"gpus": [{"x": 1}]}, "gpus.0.x") == 1
    assert fingerprints.get({"gpus": []}, "gpus.0.x") is None


def result_fixture():
    rows = [NodeRow("n1", "equivalent", n_ok=4, n_trials=4, mean=1.2e7, speed=1.01, ratio=1.01, speed_low=0.98,
                    speed_high=1.04, reference=["n2"], fingerprint={"gpu_name": "X", "node": {"kernel": "6"}}),
            NodeRow("n2", "equivalent", n_ok=4, n_trials=4, mean=1.19e7, speed=0.99, ratio=0.99, speed_low=0.96,
                    speed_high=1.02, reference=["n1"], fingerprint={"gpu_name": "X", "node": {"kernel": "6"}}),
            NodeRow("slow<1>", "slower", n_ok=4, n_trials=4, mean=6e6, speed=0.5, ratio=0.5, speed_low=0.47,
                    speed_high=0.53, reference=["n1", "n2"], differs={"kernel": ["5", "6"]},
                    fingerprint={"gpu_name": "X", "node": {"kernel": "5"}}),
            NodeRow("gone", "excluded", reason="not ready: KubeletNotReady"),
            NodeRow("broken", "failed", reason="pod never started", n_trials=1)]
    control = verdicts.ErrorControl(0.95, looks=3, nodes=3)
    return FleetResult("exp-1", "spin", "ops/sec", True, 0.05, 0.95, adaptive.AdaptiveTrials(4, 12, 4), control, 1,
                       sort_rows(rows), command="gpuvs fleet spin",
                       labels=[NodeLabels("slow<1>", {labels.PERF: "slow"}, {}, "dry run: not written")])


def test_label_plan_values_and_details():
    res = result_fixture()
    changes = {c.node: c for c in labels.plan(res.rows, experiment_id="exp-1", workload="spin")}
    assert set(changes) == {"n1", "n2", "slow<1>"}  # excluded and failed nodes are left alone
    assert changes["slow<1>"].labels == {labels.PERF: "slower", labels.RATIO: "0.500"}
    assert changes["n1"].labels[labels.PERF] == "equivalent"
    details = json.loads(changes["slow<1>"].annotations[labels.DETAILS])
    assert details["experiment"] == "exp-1" and details["interval"] == [0.47, 0.53]
    assert set(changes["n1"].patch()["metadata"]) == {"labels", "annotations"}  # nothing else: no taint, no cordon


def test_labels_are_written_or_planned_through_one_call():
    """labels.write: what the fleet, the pair fleet and the drift each do with their planned changes."""
    changes = labels.plan(result_fixture().rows, experiment_id="exp-1", workload="spin")
    assert labels.write(None, changes, dry_run=True) == {c.node: "dry run: not written" for c in changes}
    patched = []

    class Core:
        def patch_node(self, name, body):
            patched.append((name, body))
            if name == "n2":
                raise RuntimeError("nodes n2 is forbidden")

    assert labels.write(Core(), changes) == {"n1": "written", "n2": "nodes n2 is forbidden", "slow<1>": "written"}
    assert patched == [(c.node, c.patch()) for c in changes]


def test_every_pod_of_a_run_is_swept_and_the_package_released_however_it_ends(monkeypatch):
    """fleet.run.swept, the end of both the node fleet and the pair fleet (their runs: the cluster tests)."""
    from gpuvs.fleet.cluster import sweep as kube
    from gpuvs.fleet.execute import fleet_run
    from gpuvs.kube import package

    done = []
    monkeypatch.setattr(kube, "sweep", lambda cluster, exp_id: done.append(("sweep", cluster, exp_id)) or 0)
    monkeypatch.setattr(package, "release", lambda: done.append(("release",)) or [])
    with fleet_run.swept("cluster", "e1"):
        done.append(("trials",))
    with pytest.raises(KeyboardInterrupt):
        with fleet_run.swept("cluster", "e2"):
            raise KeyboardInterrupt
    assert done == [("trials",), ("sweep", "cluster", "e1"), ("release",), ("sweep", "cluster", "e2"), ("release",)]


# -- reports -------------------------------------------------------------------------------------

def test_rows_sorted_slowest_first_and_every_format_says_the_same():
    res = result_fixture()
    assert [r.node for r in res.rows] == ["slow<1>", "n2", "n1", "broken", "gone"]
    term = report.render("term", res, width=220)
    assert "1 of 3 measured node(s) slower than the fleet: slow<1> at 0.500× the fleet" in term
    assert "not ready: KubeletNotReady" in term and "kernel (5 vs 6)" in term
    md = report.render("md", res)
    assert "| slow&lt;1&gt; | slower (50.0%) | 0.500 | 0.470–0.530 |" in md.replace("**", "")
    html = report.render("html", res)
    assert "slow&lt;1&gt;" in html and "<svg" in html and "slow<1>" not in html
    assert html.count("<svg") == 3  # one band per measured node
    rows = list(csv.DictReader(io.StringIO(report.render("csv", res))))
    assert [r["node"] for r in rows] == ["slow<1>", "n2", "n1", "broken", "gone"]
    assert rows[0]["verdict"] == "slower" and float(rows[0]["speed"]) == 0.5
    data = json.loads(report.render("json", res))
    assert data["plan"] == {"trials": 4, "max_trials": 12, "step": 4}
    assert data["control"]["per_look"] == pytest.approx(0.05 / 3) and data["control"]["nodes"] == 3
    assert data["labels"][0]["status"] == "dry run: not written" and "log_speed" not in data["rows"][0]
    back = FleetResult.from_dict(data)
    assert back == res
    assert "slow&lt;1&gt;: {'gpuvs.io/perf': 'slow'} (dry run: not written)" in report.render("md", res)


# -- the run itself, with real workers (host processes stand in for nodes' pods) -------------------

def test_fleet_run_with_real_workers_stores_every_trial_and_a_failing_node_is_a_row(tmp_path, cli):
    from gpuvs.fleet.execute import fleet_run
    from gpuvs.trial.runner import Arm, Runner
    from gpuvs.spec import RunSpec
    from gpuvs.store.db import Store

    base = RunSpec(workload="selftest", params={"steps": 3, "step_seconds": 0.01}, device="cpu")
    names = ["n1", "n2", "n3", "bad"]
    exp = fleet_run.fleet_experiment("fleet test", base, names, ExperimentMeta(command="test"), seed=4)
    # host workers take no node option; one "node" crashes at once
    exp.arms = [Arm(arm.name, {"fail_at_step": 1} if arm.name == "bad" else {}) for arm in exp.arms]
    starts: list = []
    with Store(tmp_path / "g.db") as st:
        result, ex = fleet_run.run(Runner(st, timeout_s=60), exp, [nodes.NodeInfo(n) for n in names],
                                   [nodes.Excluded("gone", "not ready: x")], plan=adaptive.AdaptiveTrials(4, 4, 4), parallel=3,
                                   margin=0.5, confidence=0.95, reference=None, unit="steps/sec",
                                   on_end=lambda r: starts.append(r.spec.arm))
        stored = st.trials(exp.id)
        st.update_meta(exp.id, fleet=result.to_dict())
    rows = {r.node: r for r in result.rows}
    assert rows["bad"].verdict == "failed" and "selftest failed at step 1" in rows["bad"].reason
    assert rows["bad"].n_trials == 1  # no more trials after its first failure
    assert rows["gone"].verdict == "excluded" and rows["gone"].reason == "not ready: x"
    assert all(rows[n].n_ok == 4 for n in ("n1", "n2", "n3"))
    assert all(rows[n].verdict in ("equivalent", "inconclusive") for n in ("n1", "n2", "n3"))
    assert len(stored) == 13 and {t.arm for t in stored} == set(names)
    assert 2 <= ex.max_in_flight <= 3
    for n in names:  # never two trials of one node at once
        spans = sorted((t.started, t.ended) for t in stored if t.arm == n)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert [r.node for r in result.rows][-2:] == ["bad", "gone"]
    # each compared node's log speed with its se and df, as a node's history needs them: the same point the
    # stored trials give again (history.points_from_run, as docs/history.md did it before rows kept them)
    from gpuvs.fleet.assess import node_history as history

    values = {n: [t.summary["main"].value for t in stored if t.arm == n and t.ok] for n in ("n1", "n2", "n3")}
    again = history.points_from_run(exp.id, 5.0, "selftest", values, higher_is_better=True, margin=0.5,
                                    unit="steps/sec", fleet_verdicts={n: rows[n].verdict for n in values})
    kept = history.points_from_fleet(result, 5.0)
    assert len(kept) == 3 and [p.node for p in sorted(kept, key=lambda p: p.node)] == ["n1", "n2", "n3"]
    for p in again:
        (q,) = [k for k in kept if k.node == p.node]
        assert (q.log_speed, q.se, q.df, q.figure, q.level, q.level_se) == pytest.approx(
            (p.log_speed, p.se, p.df, p.figure, p.level, p.level_se))
        assert (q.reference, q.n_trials, q.verdict, q.unit) == (p.reference, p.n_trials, p.verdict, p.unit)
        assert rows[p.node].log_speed == pytest.approx(math.log(rows[p.node].speed))
    # stored like any experiment: gpuvs report renders the fleet again, in any format
    r = cli("report", exp.id[:12], "--format", "csv", "--store", str(tmp_path / "g.db"))
    assert r.returncode == 0, r.stderr
    assert [row["node"] for row in csv.DictReader(io.StringIO(r.stdout))] == [x.node for x in result.rows]
    # CPU workers read no GPU health: no row has any, and no report says anything about causes (not "unknown")
    assert all(not t.telemetry for t in st_trials(tmp_path / "g.db", exp.id))
    assert all(not x.health and not x.why for x in result.rows)
    shown = cli("report", exp.id[:12], "--format", "json", "--store", str(tmp_path / "g.db"))
    assert all("health" not in row and "why" not in row for row in json.loads(shown.stdout)["rows"])
    term = cli("report", exp.id[:12], "--store", str(tmp_path / "g.db")).stdout
    assert "why" not in term and "NVML" not in term and "unknown" not in term


def st_trials(path, experiment_id):
    from gpuvs.store.db import Store

    with Store(path) as st:
        return st.trials(experiment_id, with_samples=True)


def test_bad_fleet_input_is_one_line_and_exit_2(cli):
    cases = [(["--format", "xml"], "--format: 'xml' is not allowed"),
             (["--trials", "3", "--image", "x"], "at least 4 trials per node"),
             (["--env", "host"], "--env host is not allowed"),
             (["--image", "x", "--node", "n1"], "use --nodes a,b,c"),
             (["--image", "x", "--dry-run"], "--dry-run applies with --label"),
             (["--image", "x", "--trials", "5", "--max-trials", "4"], "--max-trials 4 is below --trials 5"),
             (["--image", "x", "--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig: no such file")]
    for extra, message in cases:
        r = cli("fleet", "spin", "--device", "cpu", *extra)
        assert r.returncode == 2, (extra, r.stderr)
        assert r.stderr.strip().splitlines() == [r.stderr.strip()] and message in r.stderr, (extra, r.stderr)
        assert "Traceback" not in r.stderr


def test_fleet_help_shows_the_options_of_the_kind_it_runs_in(cli):
    """A fleet runs in pods (the kind that takes --node): its help shows the pod options, not the container's
    (whose summary, "a podman or docker container", once matched a search for "pod")."""
    r = cli("fleet", "--help-all")
    assert r.returncode == 0, r.stderr
    assert "--env pod options" in r.stdout and "--env container options" not in r.stdout
    r = cli("fleet", "--help")  # the short help names the pod kind's options by their count
    assert r.returncode == 0 and "Options of each --env kind: pod (" in r.stdout and "container (" not in r.stdout


def test_spin_reports_operations_per_second(cli, tmp_path):
    from gpuvs.store.db import Store

    r = cli("run", "spin", "--device", "cpu", "--steps", "3", "--ops", "20000", "--warmup-steps", "1",
            "--store", str(tmp_path / "s.db"), "--quiet")
    assert r.returncode == 0, r.stderr
    with Store(tmp_path / "s.db") as st:
        (trial,) = st.trials()
        samples = st.samples(trial.id)
    main = trial.summary["main"]
    assert main.unit == "ops/sec" and main.higher_is_better and main.n == 3
    assert main.total_items == 60000 and main.value == pytest.approx(60000 / main.total_seconds)
    assert [s.step for s in samples] == [1, 2, 3] and "warmup_s" in trial.startup


def test_the_recorded_command_is_derived_in_one_place():
    """recorded_command quotes the words as a shell reads them back; option_words spells the agent's options
    as the command line's (dashes, a true flag alone, None and False left out)."""
    from gpuvs.fleet.execute.fleet_run import option_words, recorded_command

    assert recorded_command(["spin", "--name", "a b"]) == "gpuvs fleet spin --name 'a b'"
    words = option_words([("nodes", "n1,n2"), ("label", True), ("dry_run", False), ("context", None),
                          ("order_seed", 3), ("node_label", "a=b"), ("node_label", "c")])
    assert words == ["--nodes", "n1,n2", "--label", "--order-seed", "3", "--node-label", "a=b", "--node-label", "c"]


def test_fleet_options_from_values_is_the_one_map_of_options():
    """FleetOptions.from_values: the command line's option names, each checked by its Param; --nodes split at
    commas, node_label and timeout to their fields, None the default, an unknown name one line."""
    from gpuvs.errors import UsageError
    from gpuvs.fleet.execute.fleet_run import FleetOptions

    o = FleetOptions.from_values({"nodes": ["a,b", "c"], "node_label": ["k=v"], "trials": "6", "timeout": "30",
                                  "max_trials": None, "label": "true", "name": "x", "command": "gpuvs fleet spin"})
    assert (o.nodes, o.node_labels, o.trials, o.timeout_s, o.max_trials, o.label) == (
        ["a", "b", "c"], ["k=v"], 6, 30.0, None, True)
    assert (o.name, o.command, o.margin) == ("x", "gpuvs fleet spin", 0.05)
    with pytest.raises(UsageError, match=r"^unknown option --margn for gpuvs fleet \(did you mean '--margin'\?\); it takes "):
        FleetOptions.from_values({"margn": 0.1})
    with pytest.raises(UsageError, match="--parallel"):
        FleetOptions.from_values({"parallel": 0})
