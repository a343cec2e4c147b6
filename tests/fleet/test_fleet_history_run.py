"""`gpuvs fleet history` as a library call, without a cluster. A HistoryRequest is made from plain values; a bad
one is one UsageError line. run_fleet_history reads a store of simulated fleet runs (tests/fleet_store.py), and
writes drift labels in a dry run and through a fake API. On the real cluster: test_fleet_history.py."""

from __future__ import annotations

import types

import pytest

from fleet_store import sliding_fleet
from gpuvs.errors import UsageError
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.cluster import signals
from gpuvs.fleet.assess import stored_history as stored
from gpuvs.fleet.execute.history_run import HistoryHooks, HistoryRequest, HistoryResult, run_fleet_history
from gpuvs.store.db import Store


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    """Two workloads: spin (10 runs, node-2 sliding from run 5, node-5 failing in the last) and membw (4 runs)."""
    path = tmp_path_factory.mktemp("history-run") / "fleet.db"
    sliding_fleet(path, runs=10, slide_from=5, slide=0.03, failed_last="node-5")
    sliding_fleet(path, runs=4, slide=0.0, seed=11, workload="membw")
    return path


class Refused(Exception):
    status = 403
    body = '{"message": "nodes \\"node-3\\" is forbidden"}'


class Missing(Exception):
    status = 404


class FakeCore:
    """The CoreV1Api calls the drift's labels and condition make, each kept in `calls`; node-3 refuses its label."""

    def __init__(self, calls: list):
        self.calls = calls

    def patch_node(self, name, body, **kw):
        self.calls.append(("patch_node", name))
        if name == "node-3":
            raise Refused()

    def read_node(self, name, **kw):
        self.calls.append(("read_node", name))
        return types.SimpleNamespace(status=types.SimpleNamespace(conditions=[]))

    def patch_node_status(self, name, body, **kw):
        self.calls.append(("patch_node_status", name, body["status"]["conditions"][0]["reason"]))

    def read_namespaced_event(self, name, namespace, **kw):
        raise Missing()  # no such event yet: it is created

    def create_namespaced_event(self, namespace, body, **kw):
        self.calls.append(("create_event", body["involvedObject"]["name"], body["reason"]))


# -- the request ---------------------------------------------------------------------------------------------

def test_a_request_from_plain_values_takes_defaults_and_checks_each_value():
    assert HistoryRequest.from_values({}) == HistoryRequest(workload=None, window=10, margin=0.05, confidence=0.95)
    # what a settings file or an agent gives: texts, read as the command line reads them
    r = HistoryRequest.from_values({"node": "node-2", "workload": "spin", "window": "12", "margin": "0.1",
                                    "label": "true", "dry_run": "yes", "condition": True, "kubeconfig": None})
    assert (r.node, r.workload, r.window, r.margin, r.label, r.dry_run, r.condition, r.kubeconfig) == (
        "node-2", "spin", 12, 0.1, True, True, True, None)
    assert isinstance(r.window, int) and isinstance(r.margin, float)
    with pytest.raises(AttributeError):
        r.window = 3  # frozen: a request that was checked stays as it was checked


@pytest.mark.parametrize("values, line", [
    ({"dry_run": True}, "--dry-run applies with --label (it shows the labels instead of writing them)"),
    ({"condition": True}, "--condition applies with --label (the node's drift is written as labels first)"),
    ({"window": 2}, "--window: 2 is not allowed; expected an integer from 3 to 1000"),
    ({"margin": "wide"}, "--margin: 'wide' is not allowed; expected a number from 0 to 0.5"),
    ({"confidence": float("nan")}, "--confidence: nan is not allowed; expected a number from 0.5 to 0.999 "
                                   "(NaN and infinities are not allowed)"),
    ({"label": "maybe"}, "--label: 'maybe' is not allowed; expected true or false"),
    ({"node": 3}, "node: 3 is not allowed; expected a node's name"),
    ({"windw": 5}, "unknown option --windw for gpuvs fleet history (did you mean '--window'?); it takes --node, "
                   "--workload, --window, --margin, --confidence, --label, --condition, --dry-run, --kubeconfig, "
                   "--context"),
])
def test_a_bad_value_is_one_usage_error_line(values, line):
    with pytest.raises(UsageError) as caught:
        HistoryRequest.from_values(values)
    assert str(caught.value) == line


# -- the run -------------------------------------------------------------------------------------------------

def test_the_run_reads_the_store_as_stored_read_does_and_prints_nothing(fleet_store, capfd):
    heard = []
    got = run_fleet_history(HistoryRequest(), fleet_store, HistoryHooks(on_read=heard.append))
    with Store(fleet_store) as st:
        want = stored.read(st)
    assert isinstance(got, HistoryResult) and got.history.to_dict() == want.to_dict()
    assert heard == [got.history] and got.labels == [] and got.signals == [] and got.node is None
    assert [w.workload for w in got.history.workloads] == ["membw", "spin"]
    spin = got.history.workload("spin")
    assert spin.nodes[0].node == "node-2" and spin.nodes[0].drift.verdict == "slower"
    one = run_fleet_history(HistoryRequest(node="node-3", workload="spin", window=5), str(fleet_store))
    assert one.node == "node-3" and [w.workload for w in one.history.workloads] == ["spin"]
    assert one.history.workload("spin").drift.window == 5
    assert set(got.to_dict()) == {"history", "node", "labels", "signals"}
    assert capfd.readouterr() == ("", "")


def test_a_dry_run_plans_the_drift_labels_and_the_condition_and_writes_nothing(fleet_store, monkeypatch):
    def no_cluster(*a, **kw):
        raise AssertionError("a dry run reaches no cluster")

    monkeypatch.setattr("gpuvs.kube.client.connect", no_cluster)
    heard = []
    req = HistoryRequest(workload="spin", label=True, condition=True, dry_run=True)
    got = run_fleet_history(req, fleet_store, HistoryHooks(on_read=lambda h: heard.append("read"),
                                                           on_labels=lambda x: heard.append(("labels", len(x)))))
    spin = got.history.workload("spin")
    planned = labels.plan_drift(spin.nodes, workload="spin")
    assert [(x.node, x.labels, x.status) for x in got.labels] == [(c.node, c.labels, signals.DRY) for c in planned]
    assert {x.node for x in got.labels} == {"node-1", "node-2", "node-3", "node-4"}  # node-5 missed the latest run
    assert [(s.node, s.detail, s.status) for s in got.signals] == [
        ("node-2", "GpuvsPerformance=True DriftingSlower", signals.DRY)]
    assert heard == ["read", ("labels", 4)]
    only = run_fleet_history(HistoryRequest(node="node-2", workload="spin", label=True, dry_run=True), fleet_store)
    assert [x.node for x in only.labels] == ["node-2"] and only.signals == []


def test_labels_and_the_condition_are_written_through_the_api_after_the_store_is_read(fleet_store, monkeypatch):
    calls: list = []

    def connect(kubeconfig=None, context=None, namespace=None, timeout=10.0):
        calls.append(("connect", kubeconfig, context))
        return types.SimpleNamespace(core=FakeCore(calls))

    monkeypatch.setattr("gpuvs.kube.client.connect", connect)
    req = HistoryRequest.from_values({"workload": "spin", "label": True, "condition": True,
                                      "kubeconfig": "/k/config", "context": "lab"})
    got = run_fleet_history(req, fleet_store, HistoryHooks(on_read=lambda h: calls.append(("read",)),
                                                           on_labels=lambda x: calls.append(("labels",))))
    status = {x.node: x.status for x in got.labels}
    assert status == {"node-1": "written", "node-2": "written", "node-3": 'nodes "node-3" is forbidden',
                      "node-4": "written"}
    assert calls[:2] == [("connect", "/k/config", "lab"), ("read",)]  # reached before anything is shown
    assert calls.index(("labels",)) == 2 + len(got.labels)  # every label patched, then heard, then the condition
    assert ("patch_node_status", "node-2", "DriftingSlower") in calls
    assert ("create_event", "node-2", "DriftingSlower") in calls
    assert [(s.node, s.what, s.status) for s in got.signals] == [("node-2", "condition", "written"),
                                                                  ("node-2", "event", "created")]


@pytest.mark.parametrize("req, says", [
    (HistoryRequest(node="node-9"), "no node 'node-9' in the stored fleet runs of {store} (nodes: node-1, node-2, "
                                    "node-3, node-4, node-5)"),
    (HistoryRequest(workload="gemm"), "--workload gemm: no stored fleet run of it in {store} (workloads: membw, "
                                      "spin)"),
    (HistoryRequest(label=True, dry_run=True), "--label writes one workload's drift: give --workload (stored: membw, "
                                               "spin)"),
    (HistoryRequest(workload="spin", label=True, kubeconfig="/no/such/kubeconfig"),
     "--kubeconfig /no/such/kubeconfig: no such file"),
])
def test_what_cannot_be_done_is_one_line_before_anything_is_heard(fleet_store, req, says):
    heard = []
    with pytest.raises(UsageError) as caught:
        run_fleet_history(req, fleet_store, HistoryHooks(on_read=heard.append, on_labels=heard.append))
    assert str(caught.value) == says.format(store=fleet_store) and heard == []


def test_a_store_without_fleet_runs_is_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"^no store at .*none\.db \(run something first, or pass --store PATH\)$"):
        run_fleet_history(HistoryRequest(), tmp_path / "none.db")
    with Store(tmp_path / "empty.db"):
        pass
    empty = tmp_path / "empty.db"
    with pytest.raises(UsageError) as caught:
        run_fleet_history(HistoryRequest(), empty)
    assert str(caught.value) == f"no stored gpuvs fleet run in {empty} (run gpuvs fleet WORKLOAD --store {empty} first)"
