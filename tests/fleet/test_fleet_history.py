"""Each node against its own past, from a real SQLite store of fleet runs (tests/fleet_store.py).

The library read (fleet/assess/stored_history.py), `gpuvs fleet history` in every format, its bad input and drift labels in a dry run.
The status page is opened in real headless Chromium: its DOM checked and a screenshot taken.
The fleet: 10 daily runs of 4 nodes and one that fails; node-2 slides from the 6th run on, while the fleet drifts 4%."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import cluster  # noqa: F401  (the session fixture, for the one cluster test)
from conftest import missing_part
from fleet_store import DAY, T0, sliding_fleet
from gpuvs.fleet.assess import node_history as history
from gpuvs.fleet.cluster import node_labels as labels
from gpuvs.fleet.assess import stored_history as stored
from gpuvs.store.records import ExperimentMeta
from gpuvs.report import history as report_history
from gpuvs.report.status import render_status_page
from gpuvs.store.db import Store

SLIDE_FROM = 5
STABLE = ("node-1", "node-3", "node-4")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "fleet.db"
    ids = sliding_fleet(path, runs=10, slide_from=SLIDE_FROM, slide=0.03, failed_last="node-5")
    sliding_fleet(path, runs=4, slide=0.0, seed=11, workload="membw")  # another workload, stable, fewer runs
    with Store(path) as st:  # a gpuvs validate run beside them, stored as gpuvs validate stores one
        rows = [{"suite": "functional", "check": "GPU nodes found and allocatable", "status": "pass", "detail": "4 nodes",
                 "seconds": 0.4}, {"suite": "functional", "check": "GPU pod: GPU visible inside", "status": "FAIL",
                                   "detail": "no /dev/nvidia* in the pod on node-5", "seconds": 31.0}]
        st.create_experiment("20261127-120000-abc123", "validate test-cluster", "validate",
                             ExperimentMeta(host="https://127.0.0.1:6443", source="kubeconfig", namespace="default",
                                            settings={"image": "localhost/gpuvs-python:test"}, checks=rows,
                                            finished=True), created=T0 + 9.5 * DAY)
    return path, ids


def gpuvs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpuvs", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


def read(path) -> stored.FleetHistory:
    with Store(path) as st:
        return stored.read(st)


# -- the library ---------------------------------------------------------------------------------------

def test_the_store_reads_into_each_nodes_history_with_drift_and_change_points(fleet_store):
    path, ids = fleet_store
    h = read(path)
    assert [x.workload for x in h.workloads] == ["membw", "spin"]
    w = h.workload("spin")
    assert (w.workload, w.unit, [r.run_id for r in w.runs]) == ("spin", "ops/s", ids)
    assert [r.time for r in w.runs] == [T0 + t * DAY for t in range(10)]
    first = w.nodes[0]
    assert first.node == "node-2" and first.marks[:2] == ("slow", "drifting slower") and first.needs_look
    assert len(first.history) == 10 and [p.run_id for p in first.history.points] == ids
    v = first.drift
    assert v.verdict == "slower" and v.interleaved is False and v.run_id == ids[-1] and v.baseline == ids[:-1]
    assert v.ratio < 0.95 and v.ci_high < 1.0
    c = first.change
    assert c is not None and c.run_id in ids[SLIDE_FROM:SLIDE_FROM + 2] and c.step < 0.95
    assert c.time == T0 + ids.index(c.run_id) * DAY and c.previous_run_id == ids[ids.index(c.run_id) - 1]
    for name in STABLE:
        n = w.node(name)
        assert n.drift.verdict not in ("slower", "faster") and not n.changes.change_points
        assert not n.needs_look and len(n.history) == 10
    failed = w.node("node-5")  # in the last run only, where it failed: a row, no point
    assert failed.marks == ("failed",) and failed.latest.verdict == "failed" and len(failed.history) == 0
    assert failed.latest.reason.startswith("pod could not start")
    assert [n.node for n in w.nodes[:2]] == ["node-2", "node-5"]  # slow and drifting first, then failed
    assert json.loads(json.dumps(h.to_dict()))["workloads"][1]["nodes"][0]["drift"]["verdict"] == "slower"
    other = h.workload("membw")  # four runs of a stable fleet: nobody to look at, and too few runs to say much
    assert len(other.runs) == 4 and not any(n.needs_look for n in other.nodes)
    assert all(len(n.history) == 4 and n.drift.verdict not in ("slower", "faster") for n in other.nodes)


def test_a_run_stored_before_rows_kept_their_log_speed_is_read_from_its_trials(fleet_store, tmp_path):
    """The same points come from the run's stored trials (history.points_from_run) as from its rows."""
    path, ids = fleet_store
    old = tmp_path / "old.db"
    shutil.copy(path, old)
    with Store(old) as st:
        exp = st.experiment(ids[3])
        fleet = dict(exp.meta.fleet)
        fleet["rows"] = [{k: v for k, v in r.items() if k not in ("log_speed", "se", "df", "level_se")}
                         for r in fleet["rows"]]
        st.set_meta(exp.id, dataclasses.replace(exp.meta, fleet=fleet))
    before, after = read(path).workload("spin"), read(old).workload("spin")
    assert [r.from_trials for r in after.runs] == [i == 3 for i in range(10)]
    for name in ("node-1", "node-2"):
        p_new = next(p for p in before.node(name).history.points if p.run_id == ids[3])
        p_old = next(p for p in after.node(name).history.points if p.run_id == ids[3])
        assert p_old.log_speed == pytest.approx(p_new.log_speed, rel=1e-9)
        assert p_old.se == pytest.approx(p_new.se, rel=1e-9) and p_old.level == pytest.approx(p_new.level)
    assert after.node("node-2").drift.ratio == pytest.approx(before.node("node-2").drift.ratio, rel=1e-9)


def test_points_come_from_the_stored_rows(fleet_store):
    path, ids = fleet_store
    with Store(path) as st:
        exp = st.experiment(ids[-1])
        from gpuvs.fleet.result import FleetResult

        res = FleetResult.from_dict(exp.meta.fleet)
        pts, from_trials = stored.points_of(st, exp, res)
    assert not from_trials and {p.node for p in pts} == {"node-1", "node-2", "node-3", "node-4"}
    assert pts == history.points_from_fleet(res, exp.created)
    row = next(r for r in res.rows if r.node == "node-2")
    assert next(p for p in pts if p.node == "node-2").speed == pytest.approx(row.speed)


# -- gpuvs fleet history ---------------------------------------------------------------------------------

def test_fleet_history_in_the_terminal(fleet_store):
    path, ids = fleet_store
    w = read(path).workload("spin")
    v, c = w.node("node-2").drift, w.node("node-2").change
    r = gpuvs("fleet", "history", "--store", str(path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    sentence = f"node-2: {100 * (1 - v.ratio):.1f}% slower than its last 9 checks ({v.ratio:.3f}×"
    assert sentence in out and "not interleaved" in out
    assert f"since run {c.run_id} on " in out and f"{100 * (1 - c.step):.1f}% slower" in out
    assert out.index("spin: each node now") < out.index("membw: each node now")  # the workload with a node to look at first
    table = out[out.index("spin: each node now and against its own past"):out.index("membw: each node now")]
    order = [table.index(f"│ {n} ") for n in ("node-2", "node-5", "node-1", "node-3", "node-4")]
    assert order[0] < order[1] < min(order[2:])  # slow and drifting first
    assert out.count("slower than its last") == 2  # the summary and node-2's row: no stable node
    for run_id in ids:  # each node's figure, interval and verdict at each run
        assert out.count(run_id) >= 4


def test_fleet_history_markdown_json_and_one_node(fleet_store):
    path, ids = fleet_store
    w = read(path).workload("spin")
    change = w.node("node-2").change
    md = gpuvs("fleet", "history", "--store", str(path), "--format", "md")
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("## gpuvs fleet history") and "**spin: 2 of 5 node(s) need a look — node-2: " in md.stdout
    spin = md.stdout[md.stdout.index("### spin: each node"):md.stdout.index("### membw: each node")]
    lines = [line for line in spin.splitlines() if line.startswith("| **node-") or line.startswith("| node-")]
    assert lines[0].startswith("| **node-2**") and "slower than its last 9 checks" in lines[0]
    assert f"since run {change.run_id}" in lines[0]
    assert not any("slower than its last" in line for line in lines[2:5])

    js = gpuvs("fleet", "history", "--store", str(path), "--format", "json")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    assert [x["workload"] for x in data["workloads"]] == ["membw", "spin"]
    nodes = data["workloads"][1]["nodes"]
    assert [n["node"] for n in nodes][:2] == ["node-2", "node-5"]
    assert nodes[0]["drift"]["verdict"] == "slower" and nodes[0]["drift"]["interleaved"] is False
    assert nodes[0]["drift"]["ratio"] == pytest.approx(w.node("node-2").drift.ratio)
    assert nodes[0]["change"]["run_id"] == change.run_id and nodes[0]["since_when"].startswith("since run ")
    assert [p["run_id"] for p in nodes[0]["points"]] == ids and all("speed_low" in p for p in nodes[0]["points"])
    stable = {n["node"]: n for n in nodes if n["node"] in STABLE}
    assert all(n["drift"]["verdict"] not in ("slower", "faster") and n["change_points"] == [] and not n["needs_look"]
               for n in stable.values())

    one = gpuvs("fleet", "history", "node-3", "--store", str(path), "--format", "json", "--workload", "spin")
    assert one.returncode == 0, one.stderr
    only = json.loads(one.stdout)
    assert only["node"] == "node-3" and [n["node"] for n in only["workloads"][0]["nodes"]] == ["node-3"]
    assert only["workloads"][0]["nodes"][0]["drift"]["reference"]  # judged against its peers all the same

    page = gpuvs("fleet", "history", "--store", str(path), "--format", "html")
    assert page.returncode == 0 and page.stdout.index('data-node="node-2"') < page.stdout.index('data-node="node-1"')
    assert 'id="validate"' not in page.stdout  # the history alone; the status page has the validate runs


@pytest.mark.parametrize("args, message", [
    (["node-9"], "no node 'node-9' in the stored fleet runs of"),
    (["--workload", "gemm"], "--workload gemm: no stored fleet run of it in"),
    (["--dry-run"], "--dry-run applies with --label"),
    (["--window", "2"], "--window: "),
    (["--format", "pdf"], "--format: 'pdf' is not allowed"),
    (["--output", "/no/such/dir/h.md"], "folder /no/such/dir does not exist"),
    (["--label", "--workload", "spin", "--kubeconfig", "/no/such/kubeconfig"], "/no/such/kubeconfig"),
])
def test_fleet_history_bad_input_is_one_line_and_exit_2(fleet_store, args, message):
    path, _ = fleet_store
    r = gpuvs("fleet", "history", "--store", str(path), *args)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert (r.returncode, r.stdout, len(lines)) == (2, "", 1), r.stderr
    assert lines[0].startswith("gpuvs: error: ") and message in lines[0]


def test_fleet_history_of_a_store_without_fleet_runs(tmp_path):
    r = gpuvs("fleet", "history", "--store", str(tmp_path / "none.db"))
    assert (r.returncode, r.stdout) == (2, "") and "no store at" in r.stderr and r.stderr.count("\n") == 1
    with Store(tmp_path / "empty.db"):
        pass
    r = gpuvs("fleet", "history", "--store", str(tmp_path / "empty.db"))
    assert (r.returncode, r.stdout) == (2, "") and "no stored gpuvs fleet run in" in r.stderr
    assert r.stderr.count("\n") == 1


def test_drift_labels_in_a_dry_run(fleet_store):
    path, _ = fleet_store
    w = read(path).workload("spin")
    planned = {c.node: c for c in labels.plan_drift(w.nodes, workload="spin")}
    assert set(planned) == {"node-1", "node-2", "node-3", "node-4"}  # node-5 was not measured in the latest run
    assert planned["node-2"].labels == {labels.DRIFT: "slower", labels.DRIFT_RATIO: f"{w.node('node-2').drift.ratio:.3f}"}
    details = json.loads(planned["node-2"].annotations[labels.DRIFT_DETAILS])
    assert details["since"]["run"] == w.node("node-2").change.run_id and details["interleaved"] is False
    assert all(planned[n].labels[labels.DRIFT] in ("equivalent", "inconclusive") for n in STABLE)
    from gpuvs.fleet.cluster import signals

    # --condition: only the node drifting slower gets GpuvsPerformance (DriftingSlower); no API given, none asked
    said = signals.act_drift(None, w.nodes, workload="spin", dry_run=True)
    assert [(x.node, x.detail, x.status) for x in said] == [("node-2", "GpuvsPerformance=True DriftingSlower",
                                                             "dry run: not written")]
    r = gpuvs("fleet", "history", "--store", str(path), "--condition")
    assert r.returncode == 2 and "--condition applies with --label" in r.stderr and r.stderr.count("\n") == 1
    r = gpuvs("fleet", "history", "--store", str(path), "--label", "--dry-run")
    assert r.returncode == 2 and "--label writes one workload's drift: give --workload (stored: membw, spin)" in r.stderr
    r = gpuvs("fleet", "history", "--store", str(path), "--label", "--dry-run", "--workload", "spin",
              "--kubeconfig", "/no/such/kubeconfig")
    assert r.returncode == 0, r.stderr
    assert (f"label node-2: {{'gpuvs.io/drift': 'slower', 'gpuvs.io/drift-ratio': "
            f"'{w.node('node-2').drift.ratio:.3f}'}} (dry run: not written)") in r.stdout
    assert "label node-5" not in r.stdout


# -- the status page -------------------------------------------------------------------------------------

def test_status_page_in_chromium(fleet_store, tmp_path):
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        missing_part("headless Chromium is needed to open the page (apt-get install chromium; .ci/apt/compare.txt)")
    from report_browser import chromium_dom, chromium_screenshot, pixels_of

    path, ids = fleet_store
    w = read(path).workload("spin")
    change = w.node("node-2").change
    page_file = tmp_path / "status.html"
    r = gpuvs("report", "status", "--store", str(path), "-o", str(page_file))
    assert r.returncode == 0 and r.stdout == "" and f"wrote {page_file}" in r.stderr, r.stderr
    page = page_file.read_text()
    with Store(path) as st:
        assert render_status_page(st, now=0) == render_status_page(st, now=0)  # the function the agent serves
    for bad in ('src="http', "src='http", 'href="http', "href='http", "<script", "<link", "@import", "url("):
        assert bad not in page.lower()  # nothing is fetched: inline CSS and SVG only

    whole = chromium_dom(page_file, tmp_path)
    assert "<script" not in whole and "http://" not in whole.replace("http://www.w3.org", "")
    assert whole.index('id="workload-spin"') < whole.index('id="workload-membw"') < whole.index('id="validate"')
    dom = whole[:whole.index('id="workload-membw"')]  # the attention box and the spin workload's part
    cards = [dom.index(f'class="card{" concern" if n in ("node-2", "node-5") else ""}" data-node="{n}"')
             for n in ("node-2", "node-5", "node-1", "node-3", "node-4")]
    assert cards[0] < cards[1] < min(cards[2:])  # the drifting node first, marked
    first_attention = dom[dom.index('id="attention"'):]
    assert first_attention.index('data-node="node-2"') < first_attention.index('data-node="node-5"')
    assert "Needs a look: 2 node(s)" in dom
    node2 = dom[cards[0]:cards[1]]
    assert node2.count('class="change-point"') == len(w.node("node-2").changes.change_points) >= 1
    assert f"since run {change.run_id}" in node2 and "slower than its last 9 checks" in node2
    assert node2.count('<g class="run">') == 10 and node2.count("<circle") == 10
    for n in ("node-1", "node-3", "node-4"):
        card = dom[dom.index(f'data-node="{n}"', min(cards[2:]) - 100):]
        card = card[:card.index("</svg>")]
        assert 'class="change-point"' not in card and card.count('<g class="run">') == 10
    assert whole.count('class="failed-run"') == 1  # node-5 failed in the last run
    assert whole.count('class="card concern"') == 2  # membw's nodes are fine
    assert "FAILED: 1 passed, 1 failed, 0 not run" in whole and "no /dev/nvidia* in the pod on node-5" in whole

    png = chromium_screenshot(page_file, tmp_path, size="1366,2200")
    keep = os.environ.get("GPUVS_SCREENSHOTS")
    if keep:
        shutil.copy(png, Path(keep) / "status-page.png")
    assert pixels_of(png, (192, 57, 43), tolerance=10) > 2000  # the slow and drifting node's red marks stand out
    assert pixels_of(png, (227, 244, 232), tolerance=3) > 20000  # every chart's fleet band is drawn


def test_status_page_of_a_store_without_runs(tmp_path):
    """The agent serves the page before its first run: it says so, and is still a page."""
    with Store(tmp_path / "empty.db") as st:
        page = render_status_page(st, now=0)
    assert "No stored gpuvs fleet run." in page and "No stored gpuvs validate run." in page
    assert page.startswith("<!DOCTYPE html>") and "generated 1970-01-01 00:00 UTC" in page and "<svg" not in page
    r = gpuvs("report", "status", "--store", str(tmp_path / "empty.db"))
    assert r.returncode == 0 and "No stored gpuvs fleet run." in r.stdout
    r = gpuvs("report", "status", "--store", str(tmp_path / "none.db"))
    assert (r.returncode, r.stdout) == (2, "") and "no store at" in r.stderr and r.stderr.count("\n") == 1


# -- drift labels on the real test cluster -------------------------------------------------------------------

@pytest.mark.cluster
def test_drift_labels_are_written_on_the_test_clusters_nodes_and_read_back(cluster, tmp_path):  # noqa: F811
    """A store of fleet runs of the cluster's own three nodes (the second one sliding): `--label` writes
    gpuvs.io/drift on each node, read back through the API, and nothing else; the labels are removed at the end
    (and were none before)."""
    from gpuvs.kube import client

    nodes = cluster.nodes[:3]
    if len(nodes) < 3:
        missing_part(f"the test needs the test cluster with 3 nodes; the running one has {len(cluster.nodes)}")
    core = client.connect(str(cluster.kubeconfig)).core
    keys = (labels.DRIFT, labels.DRIFT_RATIO)

    def drift_labels():
        return {n: {k: v for k, v in (core.read_node(n).metadata.labels or {}).items() if k in keys} for n in nodes}

    def clear():
        for n in nodes:
            core.patch_node(n, {"metadata": {"labels": {k: None for k in keys},
                                             "annotations": {labels.DRIFT_DETAILS: None}}})
            core.patch_node_status(n, {"status": {"conditions": [{"type": "GpuvsPerformance", "$patch": "delete"}]}})
            for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={n}").items:
                if e.source.component == "gpuvs":
                    core.delete_namespaced_event(e.metadata.name, "default")

    path = tmp_path / "cluster-fleet.db"
    sliding_fleet(path, runs=10, slide_from=SLIDE_FROM, slide=0.04, names=nodes)
    w = read(path).workload("spin")
    assert w.nodes[0].node == nodes[1] and w.nodes[0].drift.verdict == "slower"
    clear()
    try:
        dry = gpuvs("fleet", "history", "--store", str(path), "--label", "--dry-run", "--kubeconfig",
                    str(cluster.kubeconfig))
        assert dry.returncode == 0 and dry.stdout.count("(dry run: not written)") == 3, dry.stderr
        assert drift_labels() == {n: {} for n in nodes}
        r = gpuvs("fleet", "history", "--store", str(path), "--label", "--condition", "--kubeconfig",
                  str(cluster.kubeconfig))
        assert r.returncode == 0 and r.stdout.count("(written)") == 4, r.stdout + r.stderr  # 3 labels, 1 condition
        conds = {n: [c for c in core.read_node(n).status.conditions if c.type == "GpuvsPerformance"] for n in nodes}
        assert [(c.status, c.reason) for c in conds[nodes[1]]] == [("True", "DriftingSlower")]
        assert conds[nodes[1]][0].message.startswith("slower than its own past: 0.")
        assert conds[nodes[0]] == conds[nodes[2]] == []  # not drifting: the drift writes no condition
        events = [e for e in core.list_namespaced_event("default", field_selector="involvedObject.kind=Node,"
                                                        f"involvedObject.name={nodes[1]}").items
                  if e.reason == "DriftingSlower" and e.source.component == "gpuvs"]
        assert len(events) == 1 and events[0].type == "Warning"
        got = drift_labels()
        ratio = w.node(nodes[1]).drift.ratio
        assert got[nodes[1]] == {labels.DRIFT: "slower", labels.DRIFT_RATIO: f"{ratio:.3f}"}
        assert all(got[n][labels.DRIFT] in ("equivalent", "inconclusive") for n in (nodes[0], nodes[2]))
        details = json.loads(core.read_node(nodes[1]).metadata.annotations[labels.DRIFT_DETAILS])
        assert details["since"]["run"] == w.node(nodes[1]).change.run_id and details["workload"] == "spin"
    finally:
        clear()
    assert drift_labels() == {n: {} for n in nodes}
