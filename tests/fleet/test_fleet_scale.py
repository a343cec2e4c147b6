"""What the 1,000-node projection of a fleet's cost rests on (docs/fleet.md, "Cost at scale"), as the API server counts.

One package ConfigMap per run, and gpuvs's requests per trial, never growing with the nodes or the namespace's pods.
gpuvs's requests are told from the cluster's own by content type: the Python client reads JSON, the components protobuf.
benchmarks/fleet_scale.py measures the same on a 16-node cluster of its own, with the audit log."""

from __future__ import annotations

import collections
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest
from cluster import cluster  # noqa: F401  (the session fixture)

from conftest import ROOT, missing_part, run_cli

IMAGE = "localhost/gpuvs-python:test"
SPIN = ["--device", "cpu", "--steps", "3", "--ops", "200000", "--warmup-steps", "1"]
LINE = re.compile(r'^apiserver_request_total\{(.*)\} (\S+)$')
OURS = ("application/json", "text/plain")  # the Python client's responses; the components ask for protobuf
# the design's bound (src/gpuvs/environments/pod/podrun.py, src/gpuvs/kube/watch.py): a trial creates, watches,
# follows the log of, reads back and deletes its pod (a handful of requests, a few more when a watch or the log
# stream is opened again); while the pod lives nothing is polled (before the shared node watch: 2.0 a second)
PER_TRIAL, PER_TRIAL_SECOND, PER_RUN = 12, 0.2, 20


def requests(api) -> collections.Counter:
    """apiserver_request_total by (verb, resource[/subresource], dry run), for the clients that read JSON."""
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, _request_timeout=30)
    resp.read()
    assert resp.status == 200, resp.status
    body = resp.data.decode()
    out: collections.Counter = collections.Counter()
    for line in body.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("contentType") not in OURS or not labels.get("resource"):
            continue
        if labels["verb"] == "WATCH" and labels["resource"] == "configmaps":
            continue  # the kubelets' watches of the ConfigMaps their pods mount read as JSON too; gpuvs never watches one
        what = labels["resource"] + ("/" + labels["subresource"] if labels.get("subresource") else "")
        out[(labels["verb"], what, bool(labels.get("dry_run")))] += int(float(m.group(2)))
    return out


@pytest.mark.cluster
def test_a_fleet_run_makes_one_package_configmap_and_a_bounded_number_of_requests_per_trial(cluster, tmp_path):  # noqa: F811
    if len(cluster.nodes) < 3:
        missing_part(f"the fleet tests need the test cluster with 3 nodes; the running one has {len(cluster.nodes)}")
    cluster.wait_ready()
    nodes = cluster.nodes[:3]
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    before = requests(api)
    r = run_cli("fleet", "spin", *SPIN, "--image", IMAGE, "--image-pull-policy", "Never", "--kubeconfig",
                str(cluster.kubeconfig), "--nodes", ",".join(nodes), "--trials", "4", "--max-trials", "4",
                "--parallel", "3", "--margin", "0.5", "--store", str(tmp_path / "gpuvs.db"), timeout=300, cwd=tmp_path)
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]
    time.sleep(2)  # a watch is counted when it ends
    delta = requests(api) - before
    with sqlite3.connect(tmp_path / "gpuvs.db") as db:
        lives = [ended - started for started, ended in db.execute("SELECT started, ended FROM trials")]
    trials = len(lives)
    assert trials == 4 * len(nodes), r.stdout[-2000:]

    def n(verb, what, dry=False):
        return delta[(verb, what, dry)]

    # the package: one ConfigMap for the whole run (created once, its mark taken off once, deleted once)
    assert n("POST", "configmaps") == 1, delta
    assert n("DELETE", "configmaps") == 1, delta
    assert n("PATCH", "configmaps") <= 2, delta
    # one pod per trial, one dry run per node
    assert n("POST", "pods") == trials, delta
    assert n("DELETE", "pods") == trials, delta
    assert n("POST", "pods", True) == len(nodes), delta
    assert n("GET", "pods/log") <= 3 * trials, delta
    total = sum(delta.values())
    bound = PER_RUN + PER_TRIAL * trials + PER_TRIAL_SECOND * sum(lives)
    assert total <= bound, (total, bound, sorted(delta.items()))
    # and the bound is not empty: the pods were watched, their nodes too
    assert n("WATCH", "nodes") >= 1 and n("WATCH", "pods") >= trials, delta


@pytest.mark.parametrize(("env", "args", "said"), [
    ({"GPUVS_CLUSTER_DIR": "/tmp/gpuvs-cluster"}, [], "not the shared test cluster's"),
    ({"GPUVS_CLUSTER_PORT_OFFSET": "0"}, [], "not the shared test cluster's"),
    ({}, ["--sizes", "4,x"], "--sizes '4,x'"),
    ({}, ["--trials", "3"], "--trials 4 or more"),
])
def test_the_scale_benchmark_refuses_the_shared_cluster_and_bad_input_before_anything_starts(env, args, said):
    """It brings its cluster up and down: it must never be pointed at the shared test cluster."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fleet_scale.py"), *args], capture_output=True,
                       text=True, timeout=60, env={**os.environ, **env})
    assert r.returncode == 2, r.stdout + r.stderr
    assert said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == "" and time.monotonic() - t0 < 30
