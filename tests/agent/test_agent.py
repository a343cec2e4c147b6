"""gpuvs agent without a cluster (tests/agent/test_agent_cluster.py runs it in one).

Its schedule and back-off, its figures and their staleness, its /metrics read back by prometheus-client's parser.
The faults made real here: the API server unreachable, and a store on a read-only or a full volume.
Also: the manifests travel in gpuvs's wheel, `gpuvs deploy --dry-run` prints deploy/, kubectl finds the plugin."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from cluster import k8s_build  # noqa: F401  (a session fixture)
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, SRC, gpuvs_env, missing_part, run_cli, stop_process, wait_for
from gpuvs.agent.config import WorkloadSpec
from gpuvs.agent.ledger import FleetOutcome, Ledger, RunRecord
from gpuvs.agent.metrics import exposition, registry
from gpuvs.agent.schedule import Schedule
from gpuvs.agent.state import State
from gpuvs.fleet.execute.adaptive import AdaptiveTrials
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.fleet.assess.node_verdicts import ErrorControl
from gpuvs.store.records import ExperimentMeta
from gpuvs.store.db import Store

DEAD_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://127.0.0.1:PORT"}
  name: dead
contexts:
- context: {cluster: dead, user: u}
  name: dead
current-context: dead
users:
- name: u
  user: {token: x}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_result(exp_id: str, speeds: dict[str, float]) -> FleetResult:
    rows = [NodeRow(node, "slower" if s < 0.9 else "equivalent", n_ok=4, n_trials=4, speed=s, speed_low=s * 0.9,
                    speed_high=s * 1.1) for node, s in speeds.items()]
    return FleetResult(exp_id, "spin", "ops/s", True, 0.05, 0.95, AdaptiveTrials(4, 12, 4), ErrorControl(0.95, 3, len(rows)),
                       1, rows)


def kept_run(store: Path, speeds: dict[str, float], at: float) -> str:
    """A run of an earlier agent in the store: a fleet experiment and the ledger's row."""
    exp_id = "20260101-000000-abcdef"
    with Store(store) as st:
        st.create_experiment(exp_id, "agent fleet", "fleet", ExperimentMeta(fleet=fleet_result(exp_id, speeds)
                                                                            .to_dict()))
    ledger = Ledger(store)
    ledger.save(RunRecord("20260101-000000-aaaa", "schedule", "ok", queued_at=at, started_at=at, finished_at=at,
                          reached=True, tested=sorted(speeds), fleets=[FleetOutcome("spin", exp_id)]))
    ledger.close()
    return exp_id


def metrics_of(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(port: int, path: str, method: str = "GET", token: str | None = None) -> tuple[int, str]:
    return request(port, path, method, token)[:2]


def request(port: int, path: str, method: str = "GET", token: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers); token: sent as `Authorization: Bearer TOKEN`."""
    headers = dict(headers or {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)
    except OSError:
        return 0, "", {}


def token_file(tmp: Path) -> tuple[Path, str]:
    import secrets

    path, token = tmp / "token", secrets.token_hex(16)
    path.write_text(token + "\n")  # as `kubectl create secret --from-file` would keep a trailing newline
    return path, token


class AgentProcess:
    """`gpuvs agent` for real, as a process of its own (optionally wrapped, e.g. in a mount namespace)."""

    def __init__(self, tmp: Path, *args: str, wrap: list[str] | None = None):
        self.port = free_port()
        self.log = tmp / "agent.log"
        argv = [sys.executable, "-m", "gpuvs", "agent", "--listen", f"127.0.0.1:{self.port}", *args]
        self.proc = subprocess.Popen([*(wrap or []), *argv], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"), env=gpuvs_env(), cwd=tmp)
        wait_for(lambda: get(self.port, "/healthz")[0] == 200 or self.proc.poll() is not None, 60, "the agent up")
        assert self.proc.poll() is None, self.log.read_text()
        # its "listening" line can reach the log after /healthz answers: a test that counts new lines starts past it
        wait_for(lambda: "listening on" in self.log.read_text(), 30, "the agent's listening line")

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def metrics(self) -> dict:
        code, body = get(self.port, "/metrics")
        assert code == 200
        return metrics_of(body)

    def stop(self) -> int | None:
        return stop_process(self.proc, 30)


# -- pieces --------------------------------------------------------------------------------------------------

def test_the_schedule_runs_every_period_and_backs_off_while_the_cluster_is_away():
    s = Schedule(every_s=600, first_after_s=30, backoff_max_s=60)
    s.start(1000)
    assert not s.due(1029) and s.due(1030)
    # unreachable: 5, 10, 20, 40, then at most 60 s after each try, never later than the period
    nexts = [s.ran(t, reached=False) - t for t in (1030, 1040, 1060, 1100, 1200, 1300)]
    assert nexts == [5, 10, 20, 40, 60, 60]
    assert s.ran(2000, reached=True) == 2600 and s.failures == 0
    assert s.ran(2600, reached=False) == 2605  # the back-off starts again from 5 s
    short = Schedule(every_s=15, first_after_s=0, backoff_max_s=300)
    short.start(0)
    for _ in range(5):
        short.ran(0, reached=False)
    assert short.next_at == 15  # never later than --every


def test_figures_stale_when_not_renewed_gone_nodes_kept_and_the_exposition_parses():
    state = State(stale_after_s=100)
    now = time.time()
    state.fleet(fleet_result("e1", {"a": 0.5, "b": 1.0, "c": 1.02}), "spin", now)
    state.validate({"functional: GPU pod: exec works": "pass", "functional: GPU sharing": "shared",
                    "functional: over-request stays Pending": "FAIL"}, now)
    state.ended(RunRecord("r1", "schedule", "ok", fleets=[FleetOutcome("spin", "e1", failed_trials={"preempted": 2})]),
                now)
    m = metrics_of(exposition(registry(state)).decode())
    assert m[("gpuvs_node_perf_ratio", (("node", "a"), ("workload", "spin")))] == 0.5
    for end, value in (("low", 0.45), ("high", 0.55)):  # the interval's ends: one name, a bound label
        assert m[("gpuvs_node_perf_interval_ratio", (("bound", end), ("node", "a"), ("workload", "spin")))] == \
            pytest.approx(value)
    import gpuvs

    assert m[("gpuvs_build_info", (("version", gpuvs.__version__),))] == 1
    assert m[("process_cpu_seconds_total", ())] > 0 and m[("process_resident_memory_bytes", ())] > 1e6
    assert m[("gpuvs_node_perf_verdict", (("node", "a"), ("verdict", "slower"), ("workload", "spin")))] == 1
    assert m[("gpuvs_node_perf_verdict", (("node", "a"), ("verdict", "equivalent"), ("workload", "spin")))] == 0
    assert m[("gpuvs_node_perf_stale", (("node", "a"), ("workload", "spin")))] == 0
    assert m[("gpuvs_validate_check_ok", (("check", "functional: GPU sharing"),))] == 1  # a finding, not a failure
    assert m[("gpuvs_validate_check_ok", (("check", "functional: over-request stays Pending"),))] == 0
    assert m[("gpuvs_runs_total", (("status", "ok"), ("trigger", "schedule")))] == 1
    assert m[("gpuvs_trials_failed_total", (("reason", "preempted"), ("workload", "spin")))] == 2
    assert m[("gpuvs_last_run_timestamp_seconds", ())] == pytest.approx(now)
    # node b deleted from the cluster; the next fleet measured a and c only: b kept, marked gone and stale
    state.nodes_now({"a", "c"})
    state.fleet(fleet_result("e2", {"a": 0.6, "c": 1.0}), "spin", now + 10)
    m = metrics_of(exposition(registry(state)).decode())
    assert m[("gpuvs_node_perf_ratio", (("node", "b"), ("workload", "spin")))] == 1.0
    assert m[("gpuvs_node_gone", (("node", "b"),))] == 1 and m[("gpuvs_node_gone", (("node", "a"),))] == 0
    assert m[("gpuvs_node_perf_stale", (("node", "b"), ("workload", "spin")))] == 1
    assert m[("gpuvs_node_perf_stale", (("node", "a"), ("workload", "spin")))] == 0
    assert m[("gpuvs_node_perf_ratio", (("node", "a"), ("workload", "spin")))] == 0.6
    # a run that could not measure anything, and age: every figure stale, none dropped
    state.not_renewed()
    m = metrics_of(exposition(registry(state)).decode())
    assert all(m[("gpuvs_node_perf_stale", (("node", n), ("workload", "spin")))] == 1 for n in "abc")
    assert m[("gpuvs_validate_check_stale", (("check", "functional: GPU sharing"),))] == 1
    fresh = State(stale_after_s=100)
    fresh.fleet(fleet_result("e3", {"a": 1.0}), "spin", now - 101)
    assert metrics_of(exposition(registry(fresh)).decode())[
        ("gpuvs_node_perf_stale", (("node", "a"), ("workload", "spin")))] == 1


def test_workload_specs_and_bad_input_are_one_line_and_exit_2(tmp_path):
    assert WorkloadSpec.parse("spin:steps=10,ops=3000000").argv() == ["--steps", "10", "--ops", "3000000"]
    assert str(WorkloadSpec.parse("spin:steps=10")) == "spin:steps=10"
    for args, words in ((["--workload", "nope"], "--workload 'nope'"), (["--workload", "spin:steps"], "KEY=VALUE"),
                        (["--every", "5"], "at least 10 s"), (["--every", "soon"], "a duration"),
                        (["--listen", "x:y"], "HOST:PORT"), (["--store", "/nonexistent/dir/g.db"], "does not exist"),
                        (["--trials", "3"], "--trials")):
        r = run_cli("agent", *args, cwd=tmp_path, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("option, value", [("min-interval", "1" * 400), ("every", "9" * 400 + "d"),
                                           ("first-after", "99999999999999999999h"), ("stale-after", "400d")])
def test_a_duration_that_is_not_finite_or_past_a_year_is_one_line_and_exit_2(tmp_path, option, value):
    """400 digits were read as inf: --min-interval so set made every POST /runs a 500 (math.ceil(inf))."""
    r = run_cli("agent", f"--{option}", value, "--listen", f"127.0.0.1:{free_port()}", cwd=tmp_path, timeout=20)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"--{option}" in lines[0] and "at most 365d (a year)" in lines[0] and len(lines[0]) < 300, lines[0]


# -- faults, for real -----------------------------------------------------------------------------------------

def test_api_server_unreachable_backs_off_metrics_say_stale_and_nothing_is_lost(tmp_path):
    store = tmp_path / "gpuvs.db"
    kept_run(store, {"node-a": 0.5, "node-b": 1.0}, time.time() - 30)
    dead = tmp_path / "kubeconfig"
    dead.write_text(DEAD_KUBECONFIG.replace("PORT", str(free_port())))
    tokens, token = token_file(tmp_path)
    agent = AgentProcess(tmp_path, "--kubeconfig", str(dead), "--image", "x", "--store", str(store),
                         "--every", "1h", "--first-after", "0", "--token-file", str(tokens))
    try:
        # the figures of the earlier run are back at once, fresh
        m = agent.metrics()
        assert m[("gpuvs_node_perf_ratio", (("node", "node-a"), ("workload", "spin")))] == 0.5
        # runs fail (unreachable), one after another with growing back-off, well before --every
        wait_for(lambda: agent.metrics().get(("gpuvs_runs_total", (("status", "failed"), ("trigger", "schedule"))),
                                             0) >= 3, 60, "three failed runs")
        log = agent.log.read_text()
        waits = [int(x.split("next scheduled run in ")[1].split(" s")[0]) for x in log.splitlines()
                 if "next scheduled run in" in x]
        assert waits[:3] == sorted(waits[:3]) and waits[0] <= 5 < waits[2] <= 20, log
        assert "the cluster could not be reached: no cluster reachable at https://127.0.0.1:" in log
        m = agent.metrics()
        assert m[("gpuvs_api_reachable", ())] == 0
        assert m[("gpuvs_node_perf_stale", (("node", "node-a"), ("workload", "spin")))] == 1  # marked stale...
        assert m[("gpuvs_node_perf_ratio", (("node", "node-a"), ("workload", "spin")))] == 0.5  # ...and kept
        assert ("gpuvs_last_success_timestamp_seconds", ()) in m
        code, body = get(agent.port, "/readyz")
        assert code == 200 and json.loads(body)["api_reachable"] is False
        # the HTTP API: one run at a time, runs listed and read, unknown routes refused
        code, body = get(agent.port, "/runs", "POST", token)
        assert code in (202, 409, 429), body
        listed = json.loads(get(agent.port, "/runs")[1])
        assert listed[-1]["id"] == "20260101-000000-aaaa" and listed[-1]["status"] == "ok"
        assert any(r["status"] == "failed" and "could not be reached" in r["reason"] for r in listed)
        assert json.loads(get(agent.port, f"/runs/{listed[-1]['id']}")[1])["fleets"][0]["workload"] == "spin"
        assert get(agent.port, "/runs/nope")[0] == 404 and get(agent.port, "/nothing")[0] == 404
        assert get(agent.port, "/metrics", "POST")[0] == 405
    finally:
        assert agent.stop() == 0
    assert "stopped" in agent.log.read_text().splitlines()[-1]
    # nothing lost: the earlier run and every failed one are in the store
    kept = Ledger(store).runs(100)
    assert kept[-1].status == "ok" and sum(r.status == "failed" for r in kept) >= 3
    with Store(store) as st:
        assert st.experiment("20260101-000000-abcdef").meta.fleet["rows"][0]["speed"] == 0.5


def mount_namespace_or_skip() -> None:
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if r.returncode != 0 or shutil.which("mount") is None:
        missing_part(f"a mount namespace of its own (unshare -m) is needed to make a read-only or full volume: "
                     f"{r.stderr.decode().strip()}")


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_store_on_a_read_only_or_full_volume_is_a_clear_error_not_a_crash_loop(tmp_path, fault):
    mount_namespace_or_skip()
    vol = tmp_path / "vol"
    vol.mkdir()
    seed = tmp_path / "seed.db"
    kept_run(seed, {"node-a": 0.7, "node-b": 1.0}, time.time() - 30)
    dead = tmp_path / "kubeconfig"
    dead.write_text(DEAD_KUBECONFIG.replace("PORT", str(free_port())))
    # the volume: a 2 MiB tmpfs with the store on it, then made read-only, or filled to the last byte
    then = (f"mount -o remount,ro {vol}" if fault == "read-only" else
            f"dd if=/dev/zero of={vol}/filler bs=4k 2>/dev/null; true")
    script = (f"mount -t tmpfs -o size=2m tmpfs {vol} && cp {seed} {vol}/gpuvs.db && {then} && "
              f'exec "$@"')
    agent = AgentProcess(tmp_path, "--kubeconfig", str(dead), "--image", "x", "--store", str(vol / "gpuvs.db"),
                         "--every", "1h", "--first-after", "0",
                         wrap=["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"])
    try:
        wait_for(lambda: agent.metrics().get(("gpuvs_store_ok", ())) == 0, 30, "gpuvs_store_ok 0")
        m = agent.metrics()
        assert m[("gpuvs_node_perf_ratio", (("node", "node-a"), ("workload", "spin")))] == 0.7  # still shown
        assert get(agent.port, "/healthz")[0] == 200  # alive: no restart that would hide the error
        code, body = get(agent.port, "/readyz")
        ready = json.loads(body)
        assert code == 200 and ready["store_ok"] is False and "cannot be written" in ready["store_error"]
        why = "mounted read-only" if fault == "read-only" else "full"
        assert why in ready["store_error"], ready
        errors = [x for x in agent.log.read_text().splitlines() if "ERROR" in x]
        assert errors and f"the store {vol / 'gpuvs.db'} cannot be written" in errors[0], errors
        # runs still go on (and fail on the unreachable cluster); listed from memory; still up after them
        wait_for(lambda: agent.metrics().get(("gpuvs_runs_total", (("status", "failed"), ("trigger", "schedule"))),
                                             0) >= 2, 60, "two runs despite the store")
        assert agent.metrics()[("gpuvs_store_errors_total", ())] >= 2
        listed = json.loads(get(agent.port, "/runs")[1])
        assert listed[-1]["status"] == "ok" and sum(r["status"] == "failed" for r in listed) >= 2
        assert agent.proc.poll() is None
    finally:
        assert agent.stop() == 0


# -- deploy and the plugin ------------------------------------------------------------------------------------

def deploy_manifests() -> list[dict]:
    order = yaml.safe_load((ROOT / "deploy/kustomization.yaml").read_text())["resources"]
    return [yaml.safe_load((ROOT / "deploy" / name).read_text()) for name in order]


def test_deploy_dry_run_prints_exactly_deploy_and_the_image_option_changes_only_the_image(tmp_path):
    r = run_cli("deploy", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(yaml.safe_load_all(r.stdout)) == deploy_manifests()
    r = run_cli("deploy", "--dry-run", "--image", "registry.example/gpuvs:9", "--agent-arg=--every",
                "--agent-arg=1h", cwd=tmp_path)
    got, want = list(yaml.safe_load_all(r.stdout)), deploy_manifests()
    c = next(m for m in got if m["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example/gpuvs:9" and c["args"][-2:] == ["--every", "1h"]
    assert [m for m in got if m["kind"] != "Deployment"] == [m for m in want if m["kind"] != "Deployment"]
    r = run_cli("deploy", "--dry-run", "--delete", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_deploy_with_listen_moves_the_container_port_the_probes_and_the_scrape_to_that_port(tmp_path):
    """--agent-arg=--listen :9090: the probes (named port http), the Service's targetPort and the NetworkPolicy
    (the same name) reach 9090, as the scrape annotation says; a host other than all addresses is one line."""
    for listen in (["--agent-arg=--listen", "--agent-arg=:9090"], ["--agent-arg=--listen=9090"]):
        r = run_cli("deploy", "--dry-run", *listen, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        got = {m["kind"]: m for m in yaml.safe_load_all(r.stdout)}
        c = got["Deployment"]["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"http": 9090}
        for probe in ("livenessProbe", "readinessProbe"):
            port = c[probe]["httpGet"]["port"]
            assert ports.get(port, port) == 9090, (probe, port)
        svc = got["Service"]
        assert ports[svc["spec"]["ports"][0]["targetPort"]] == 9090
        assert svc["metadata"]["annotations"]["prometheus.io/port"] == "9090"
        assert ports[got["NetworkPolicy"]["spec"]["ingress"][0]["ports"][0]["port"]] == 9090
    for bad, why in (("--agent-arg=--listen=127.0.0.1:9090", "the probes and the Service reach the pod's own IP"),
                     ("--agent-arg=--listen=:x", "expected HOST:PORT, :PORT or PORT"),
                     ("--agent-arg=--listen=:70000", "expected 1-65535")):
        r = run_cli("deploy", "--dry-run", bad, cwd=tmp_path)
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stdout == ""


def test_the_deployment_probes_the_agent_and_names_its_own_pod():
    d = next(m for m in deploy_manifests() if m["kind"] == "Deployment")
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUVS_AGENT_POD"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    from gpuvs.agent.service import OWN_POD
    from gpuvs.agent.httpd import ROUTES

    assert OWN_POD == "GPUVS_AGENT_POD" and ("GET", "/healthz") in ROUTES and ("GET", "/readyz") in ROUTES


def test_the_wheel_carries_the_manifests_and_declares_the_kubectl_plugin(tmp_path):
    """The manifests come with the installed package (gpuvs deploy needs no checkout): built into a wheel from a
    copy of the tree, as scripts/build-image does, they are deploy/'s files byte for byte."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(SRC, src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path / "out"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = zipfile.ZipFile(next((tmp_path / "out").glob("gpuvs-*.whl")))
    names = wheel.namelist()
    for path in sorted((ROOT / "deploy").glob("*.yaml")):
        assert wheel.read(f"gpuvs/manifests/{path.name}") == path.read_bytes()
    eps = next(n for n in names if n.endswith("entry_points.txt"))
    text = wheel.read(eps).decode()
    assert "kubectl-gpuvs = gpuvs.cli:main" in text and "gpuvs = gpuvs.cli:main" in text


def test_kubectl_finds_and_runs_kubectl_gpuvs(tmp_path, k8s_build):
    from cluster import BIN

    kubectl = BIN / "kubectl"
    if not kubectl.exists():
        missing_part(f"kubectl 1.20 is not in {BIN}: run scripts/test-cluster build (it unpacks Debian's)")
    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kubectl-gpuvs"]
    module, func = target.split(":")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "kubectl-gpuvs"  # what pip writes for a console script
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    script.chmod(0o755)
    env = gpuvs_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    listed = subprocess.run([str(kubectl), "plugin", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert str(script) in listed.stdout, listed.stdout + listed.stderr
    r = subprocess.run([str(kubectl), "gpuvs", "deploy", "--dry-run"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert list(yaml.safe_load_all(r.stdout)) == deploy_manifests()
    bad = subprocess.run([str(kubectl), "gpuvs", "agent", "--every", "soon"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert bad.returncode == 2 and "a duration" in bad.stderr


# -- each node against its own past: the drift in /metrics, the status page at / ----------------------------

def test_the_agent_serves_the_status_page_and_the_drift_of_its_store(tmp_path):
    """A real agent over a store of stored fleet runs (tests/fleet_store.py: node-2 slides 3% further at each of
    the last runs), the last of them an agent run's: GET / is the status page with the drifting node first, and
    /metrics has each node's drift as stored.read computes it, fresh; an empty store gives a page, not an error."""
    from fleet_store import sliding_fleet
    from gpuvs.fleet.assess import stored_history as stored

    store = tmp_path / "gpuvs.db"
    ids = sliding_fleet(store, runs=10, slide_from=5, slide=0.03, failed_last="node-5")
    at = time.time() - 30
    ledger = Ledger(store)  # the latest fleet run is one of the agent's (the others made by hand: all the same)
    ledger.save(RunRecord("20261127-000000-aaaa", "schedule", "ok", queued_at=at, started_at=at, finished_at=at,
                          reached=True, tested=["node-1", "node-2", "node-3", "node-4", "node-5"],
                          fleets=[FleetOutcome("spin", ids[-1])]))
    ledger.close()
    with Store(store) as st:
        want = stored.read(st).workload("spin")
    assert want.nodes[0].node == "node-2" and want.nodes[0].drift.verdict == "slower"
    dead = tmp_path / "kubeconfig"
    dead.write_text(DEAD_KUBECONFIG.replace("PORT", str(free_port())))
    agent = AgentProcess(tmp_path, "--kubeconfig", str(dead), "--image", "x", "--store", str(store),
                         "--every", "1h", "--first-after", "1h")
    try:
        for path in ("/", "/status", "/status/"):
            req = urllib.request.urlopen(f"http://127.0.0.1:{agent.port}{path}", timeout=30)
            assert req.status == 200 and req.headers["Content-Type"] == "text/html; charset=utf-8"
            page = req.read().decode()
            assert page.startswith("<!DOCTYPE html>") and "Needs a look: 2 node(s)" in page
            cards = [page.index(f'data-node="{n}"') for n in ("node-2", "node-1", "node-3", "node-4")]
            assert cards[0] == min(cards), path  # the drifting node first
        assert get(agent.port, "/nothing")[0] == 404 and get(agent.port, "/", "POST")[0] == 405
        code, body = get(agent.port, "/metrics")
        m = metrics_of(body)
        for n in want.nodes:
            key = (("node", n.node), ("workload", "spin"))
            if n.node == "node-5":  # failed in the latest run: no drift of it
                assert ("gpuvs_node_drift_ratio", key) not in m
                continue
            v = n.drift
            assert m[("gpuvs_node_drift_ratio", key)] == pytest.approx(v.ratio, rel=1e-12)
            for end, want_end in (("low", v.ci_low), ("high", v.ci_high)):
                bound = tuple(sorted(key + (("bound", end),)))
                assert m[("gpuvs_node_drift_interval_ratio", bound)] == pytest.approx(want_end, rel=1e-12)
            said = ("gpuvs_node_drift_verdict", (("node", n.node), ("verdict", v.verdict), ("workload", "spin")))
            assert m[said] == 1
            assert sum(m[("gpuvs_node_drift_verdict", (("node", n.node), ("verdict", x), ("workload", "spin")))]
                       for x in ("slower", "faster", "equivalent", "inconclusive")) == 1
            assert m[("gpuvs_node_drift_stale", key)] == 0  # from the agent's own latest run
            assert m[("gpuvs_node_drift_run_timestamp_seconds", key)] == pytest.approx(want.latest.time)
        assert m[("gpuvs_node_drift_ratio", (("node", "node-2"), ("workload", "spin")))] < 0.95
        assert all(m[("gpuvs_node_drift_verdict", (("node", n), ("verdict", "slower"), ("workload", "spin")))] == 0
                   for n in ("node-1", "node-3", "node-4"))
        assert ("gpuvs_node_drift_ratio", (("node", "node-1"), ("workload", "membw"))) not in m
    finally:
        assert agent.stop() == 0
    # the page and the drift only read the store: a run's rows, experiments and trials are as they were
    with Store(store) as st:
        assert [e.id for e in st.experiments() if e.kind == "fleet"] == ids

    empty = tmp_path / "empty"
    empty.mkdir()
    agent = AgentProcess(empty, "--kubeconfig", str(dead), "--image", "x", "--store", str(empty / "gpuvs.db"),
                         "--every", "1h", "--first-after", "1h")
    try:
        code, page = get(agent.port, "/")
        assert code == 200 and "No stored gpuvs fleet run." in page and "<svg" not in page
        assert not any(k[0].startswith("gpuvs_node_drift") for k in agent.metrics())
    finally:
        assert agent.stop() == 0


def test_the_status_page_counts_the_clusters_nodes_now_and_the_workloads_run_now(tmp_path):
    """A store from a 3-node cluster that ran gpu-check (every node failed: no GPU), then spin (node-2 drifting;
    node-9, since deleted, failed in the last run). The agent's page counts 1 node, node-2: gpu-check's results
    and node-9 are named as not counted, still shown below; /metrics has no gpu-check figure. Without the
    cluster's view (`gpuvs report status`) each node counts once: 4, not the 5 rows."""
    import re

    import numpy as np
    from fleet_store import DAY, T0, sliding_fleet, store_fleet_run

    from gpuvs.report.status import render_status_page

    store = tmp_path / "gpuvs.db"
    rng = np.random.default_rng(1)
    with Store(store) as st:
        gpu = [store_fleet_run(st, {"node-1": 1.0, "node-2": 1.0, "node-3": 0.7}, created=T0 - 3 * DAY, rng=rng,
                               workload="gpu-check"),
               store_fleet_run(st, {}, created=T0 - 2 * DAY, rng=rng, workload="gpu-check",
                               failed=("node-1", "node-2", "node-3"))]
    ids = sliding_fleet(store, runs=8, slide_from=4, slide=0.04, names=["node-1", "node-2", "node-3"],
                        failed_last="node-9")
    at = time.time() - 30
    ledger = Ledger(store)  # the agent's runs: gpu-check twice, then spin (the cluster's nodes, the workload now)
    for i, (workload, exp_id) in enumerate([("gpu-check", gpu[0]), ("gpu-check", gpu[1]), ("spin", ids[-1])]):
        ledger.save(RunRecord(f"20261127-00000{i}-aaaa", "schedule", "ok", queued_at=at + i, started_at=at + i,
                              finished_at=at + i, reached=True, tested=["node-1", "node-2"],
                              skipped={"node-3": "busy"}, fleets=[FleetOutcome(workload, exp_id)]))
    ledger.close()

    def looks(page: str) -> list[tuple[str, str]]:
        return re.findall(r'<li class="attention-node" data-node="([^"]+)"><b>[^<]+</b> \(([^;]+);', page)

    with Store(store) as st:
        whole = render_status_page(st, now=0)
        scoped = render_status_page(st, now=0, nodes={"node-1", "node-2", "node-3"}, workloads={"spin"})
    assert "Needs a look: 4 node(s)" in whole and len(looks(whole)) == 5 and 'id="not-counted"' not in whole
    assert looks(scoped) == [("node-2", "spin")] and "Needs a look: 1 node(s)" in scoped
    agent = dead_agent(tmp_path, store=store)
    try:
        code, page = get(agent.port, "/")
        m = agent.metrics()
    finally:
        assert agent.stop() == 0
    assert code == 200 and "Needs a look: 1 node(s)" in page and looks(page) == [("node-2", "spin")]
    # /metrics: the retired gpu-check's figures (node-3 was slower) are left out; spin's are there
    assert [k for k in m if ("workload", "gpu-check") in k[1]] == []
    assert m[("gpuvs_node_perf_verdict", (("node", "node-2"), ("verdict", "slower"), ("workload", "spin")))] == 1
    assert ('<p class="note" id="not-counted">Not counted: the results of gpu-check, which the agent no longer runs '
            '(it runs spin); node(s) node-9, not in the cluster now.</p>') in page
    assert 'id="workload-gpu-check"' in page and "The agent no longer runs gpu-check" in page  # still shown


def test_a_drift_not_renewed_by_the_latest_run_is_kept_and_stale():
    """The drift follows the node's figure: a node missing from the workload's latest run keeps its last drift,
    marked stale, as its figure is; a run that reached nothing marks every drift stale."""
    from gpuvs.agent.state import DriftFigure

    state = State(stale_after_s=1000)
    now = time.time()
    state.fleet(fleet_result("e1", {"a": 0.9, "b": 1.0}), "spin", now)
    state.drift = {("a", "spin"): DriftFigure("a", "spin", "slower", 0.9, 0.85, 0.95, "e1", now),
                   ("b", "spin"): DriftFigure("b", "spin", "equivalent", 1.0, 0.97, 1.03, "e0", now - 10)}
    m = metrics_of(exposition(registry(state)).decode())
    assert m[("gpuvs_node_drift_stale", (("node", "a"), ("workload", "spin")))] == 0
    assert m[("gpuvs_node_drift_stale", (("node", "b"), ("workload", "spin")))] == 1  # not of its figure's run
    assert m[("gpuvs_node_drift_verdict", (("node", "a"), ("verdict", "slower"), ("workload", "spin")))] == 1
    state.not_renewed()
    m = metrics_of(exposition(registry(state)).decode())
    assert m[("gpuvs_node_drift_stale", (("node", "a"), ("workload", "spin")))] == 1
    assert m[("gpuvs_node_drift_ratio", (("node", "a"), ("workload", "spin")))] == 0.9  # kept


# -- the HTTP API: who may start runs, how often, what the reads say, the server's limits --------------------

def dead_agent(tmp: Path, *args: str, store: Path | None = None) -> AgentProcess:
    """An agent whose cluster is a port where nothing answers (its runs fail at once), no run scheduled."""
    dead = tmp / "kubeconfig-of-the-dead-cluster"
    dead.write_text(DEAD_KUBECONFIG.replace("PORT", str(free_port())))
    return AgentProcess(tmp, "--kubeconfig", str(dead), "--image", "x", "--store", str(store or tmp / "gpuvs.db"),
                        "--every", "1h", "--first-after", "1h", *args)


def api_runs(agent: AgentProcess) -> list[dict]:
    return [r for r in json.loads(get(agent.port, "/runs")[1]) if r["trigger"] == "api"]


def new_log(agent: AgentProcess, since: int) -> list[str]:
    return agent.log.read_text().splitlines()[since:]


def test_post_runs_needs_the_agents_bearer_token(tmp_path):
    tokens, token = token_file(tmp_path)
    agent = dead_agent(tmp_path, "--token-file", str(tokens))
    try:
        mark = len(agent.log.read_text().splitlines())
        code, body, headers = request(agent.port, "/runs", "POST")
        assert code == 401 and headers["WWW-Authenticate"] == 'Bearer realm="gpuvs-agent"', body
        code, body, headers = request(agent.port, "/runs", "POST", token + "x")
        assert code == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"], body
        assert request(agent.port, "/runs", "POST", token[:-1])[0] == 401
        assert request(agent.port, "/runs", "POST", headers={"Authorization": f"Basic {token}"})[0] == 401
        assert request(agent.port, "/runs", "POST", headers={"Authorization": "Bearer"})[0] == 401
        assert api_runs(agent) == []  # none of them started anything
        refused = new_log(agent, mark)
        assert len(refused) == 5 and all("POST /runs: 401" in x for x in refused), refused
        assert not any(token in x for x in agent.log.read_text().splitlines())  # the token is never logged
        code, body = get(agent.port, "/runs", "POST", token)
        assert code == 202 and json.loads(body)["trigger"] == "api", body
        # the Secret rotated (the kubelet rewrites the mounted file): the old token is refused at once
        tokens.write_text("another-token")
        assert get(agent.port, "/runs", "POST", token)[0] == 401
        tokens.unlink()  # no token at all: POST is off for everyone
        code, body = get(agent.port, "/runs", "POST", token)
        assert code == 403 and "no token" in body
        assert len(api_runs(agent)) == 1
    finally:
        assert agent.stop() == 0
    # an agent started without --token-file says so at start and refuses every POST
    (tmp_path / "bare").mkdir()
    bare = dead_agent(tmp_path / "bare")
    try:
        assert get(bare.port, "/runs", "POST", token)[0] == 403
        assert "POST /runs is refused: no --token-file" in bare.log.read_text()
    finally:
        assert bare.stop() == 0


def test_a_flood_of_authenticated_posts_starts_one_run_within_the_minimum_interval(tmp_path):
    """60 POSTs with the right token from 6 clients at once, for longer than the run they start takes: one run
    (202), the others 409 (one in flight) or 429 (--min-interval since it ended, with Retry-After); once the
    interval has passed, a POST starts a run again."""
    import concurrent.futures

    tokens, token = token_file(tmp_path)
    agent = dead_agent(tmp_path, "--token-file", str(tokens), "--min-interval", "10s")
    try:
        t0 = time.monotonic()

        def client(_):
            out = []
            for _ in range(10):
                out.append(request(agent.port, "/runs", "POST", token))
                time.sleep(0.3)
            return out

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = [a for batch in pool.map(client, range(6)) for a in batch]
        codes = sorted(a[0] for a in answers)
        assert codes.count(202) == 1 and set(codes) <= {202, 409, 429}, codes
        wait_for(lambda: api_runs(agent) and api_runs(agent)[0]["status"] == "failed", 30, "the run ended")
        code, body, headers = request(agent.port, "/runs", "POST", token)
        assert code == 429 and 1 <= int(headers["Retry-After"]) <= 10, (code, body)
        assert json.loads(body)["retry_after_s"] == int(headers["Retry-After"])
        assert len(api_runs(agent)) == 1, api_runs(agent)
        # the scheduled runs of the back-off (5, 10, 20 s after each failed one) are runs too: a POST waits
        # --min-interval after whichever ended last, as its Retry-After says
        deadline = time.monotonic() + 60
        while code == 429:
            assert time.monotonic() < deadline, "no run accepted within 60 s"
            time.sleep(int(headers["Retry-After"]))
            code, body, headers = request(agent.port, "/runs", "POST", token)
        assert code == 202, body
        accepted = json.loads(body)["queued_at"]
        every = json.loads(get(agent.port, "/runs?limit=500")[1])
        last_end = max(r["finished_at"] for r in every if r["finished_at"] and r["finished_at"] < accepted)
        assert accepted - last_end >= 10, (accepted, last_end)
        assert len(api_runs(agent)) == 2
        print(f"\n{len(answers)} POSTs in {time.monotonic() - t0:.1f} s: {codes.count(409)} x 409, "
              f"{codes.count(429)} x 429")
    finally:
        assert agent.stop() == 0


def test_idle_half_sent_connections_are_closed_at_the_timeout_and_threads_stay_bounded(tmp_path):
    """80 connections that send part of a request and wait (slowloris): at most 32 are served at once (the rest
    get 503 at once), every one is closed within --http-timeout (default 10 s), the threads go back to what they
    were, none of them starts a run (one sent the right token and a short body), the agent answers throughout."""
    tokens, token = token_file(tmp_path)
    agent = dead_agent(tmp_path, "--token-file", str(tokens))
    socks = []
    try:
        for path in ("/runs", "/metrics", "/readyz"):
            get(agent.port, path)
        idle_threads = 0
        for _ in range(10):  # what the agent runs when nobody is connected (a thread or two start at the first use)
            idle_threads = max(idle_threads, agent.threads())
            time.sleep(0.1)
        mark = len(agent.log.read_text().splitlines())
        t0 = time.monotonic()
        parts = (b"GET /runs HTTP/1.0\r\nHost: x", b"GET /ru",
                 b"POST /runs HTTP/1.0\r\nAuthorization: Bearer " + token.encode() + b"\r\nContent-Length: 100\r\n"
                 b"\r\nonly part of it", b"POST /runs HTTP/1.0\r\nContent-Length: -1\r\n")
        for i in range(80):
            s = socket.create_connection(("127.0.0.1", agent.port), timeout=20)
            s.sendall(parts[i % len(parts)])
            socks.append(s)
        peak = 0
        while time.monotonic() - t0 < 3:
            peak = max(peak, agent.threads())
            time.sleep(0.05)
        assert peak <= idle_threads + 32, (idle_threads, peak)
        assert get(agent.port, "/healthz")[0] in (200, 503)  # answered at once, even full
        closed_at, refused = [], 0
        for s in socks:
            answer = b""
            while chunk := s.recv(4096):  # until the agent closes it (a socket timeout here fails the test)
                answer += chunk
            closed_at.append(time.monotonic() - t0)
            assert answer == b"" or answer.startswith(b"HTTP/1.0 503"), answer[:200]
            refused += answer.startswith(b"HTTP/1.0 503")
        print(f"\nthreads {idle_threads} idle, {peak} at most; {refused} refused with 503; the last connection "
              f"closed after {max(closed_at):.1f} s")
        assert refused >= 80 - 32
        assert max(closed_at) < 10 + 3, closed_at
        wait_for(lambda: agent.threads() <= idle_threads, 5, "the threads back to idle")
        assert get(agent.port, "/healthz")[0] == 200
        assert api_runs(agent) == []  # the half-sent POST with the token started nothing
        lines = new_log(agent, mark)
        assert not any("Traceback" in x for x in lines)
        cut = [x for x in lines if "no whole request within 10 s: closed" in x]
        assert len(cut) == 80 - refused, lines  # one line for each connection cut, none for the rest
        assert 1 <= sum("refused with 503" in x for x in lines) <= 2, lines  # at most one line per 10 s
    finally:
        for s in socks:
            s.close()
        assert agent.stop() == 0


def test_health_is_answered_while_every_connection_slot_is_held_by_idle_sockets(tmp_path):
    """32 sockets that connect and send nothing hold every slot, 50 more wait: GET /healthz and /readyz still
    answer 200 (the kubelet's probes must not fail, or anyone who can connect restarts the agent), GET /runs 503."""
    from gpuvs.agent.httpd import MAX_CONNECTIONS

    agent = dead_agent(tmp_path)
    socks = []
    try:
        for _ in range(MAX_CONNECTIONS):
            socks.append(socket.create_connection(("127.0.0.1", agent.port), timeout=20))
        wait_for(lambda: get(agent.port, "/runs")[0] == 503, 5, "every slot held")
        for _ in range(50):  # more idle ones, waiting in the overflow beside the probes: none holds them up
            socks.append(socket.create_connection(("127.0.0.1", agent.port), timeout=20))
        for path in ("/healthz", "/readyz", "/healthz/"):
            code, body = get(agent.port, path)
            assert code == 200, (path, code, body)
        assert get(agent.port, "/healthz")[1] == "ok\n"
        assert json.loads(get(agent.port, "/readyz")[1])["ready"] is True
        code, body = get(agent.port, "/runs")
        assert code == 503 and "connections at once" in body, (code, body)
        assert get(agent.port, "/metrics")[0] == 503
    finally:
        for s in socks:
            s.close()
        assert agent.stop() == 0
    assert "Traceback" not in agent.log.read_text()


def test_bad_content_length_is_400_with_one_log_line_and_a_client_closing_early_writes_nothing(tmp_path):
    """Content-Length `abc`, `-1`, ` 1e3` and one over 64 KiB: 400 (413) at once, one log line each, no run even
    with the right token. Then 60 clients that ask for the status page (a store of 10 fleet runs: a large answer)
    or send half a request and reset the connection at once (the agent's read or write of it fails): no
    traceback, no line, the agent serves on."""
    from fleet_store import sliding_fleet

    store = tmp_path / "gpuvs.db"
    sliding_fleet(store, runs=10, slide_from=5, slide=0.03)
    tokens, token = token_file(tmp_path)
    agent = dead_agent(tmp_path, "--token-file", str(tokens), store=store)
    try:
        mark = len(agent.log.read_text().splitlines())
        for value, status in (("abc", 400), ("-1", 400), (" 1e3", 400), ("99999999999", 400), ("70000", 413)):
            s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
            s.sendall(f"POST /runs HTTP/1.0\r\nAuthorization: Bearer {token}\r\nContent-Length: {value}\r\n\r\n"
                      .encode())
            answer = b""
            while chunk := s.recv(4096):  # answered and closed at once, not held until the timeout
                answer += chunk
            s.close()
            assert answer.startswith(f"HTTP/1.0 {status} ".encode()), (value, answer[:300])
            assert b"Content-Length" in answer.split(b"\r\n\r\n", 1)[1], answer
        lines = new_log(agent, mark)
        assert len(lines) == 5 and all("POST /runs: 40" in x or "POST /runs: 413" in x for x in lines), lines
        assert "Content-Length 'abc': expected a whole number of bytes" in lines[0]
        assert api_runs(agent) == []
        mark = len(agent.log.read_text().splitlines())
        linger = struct.pack("ii", 1, 0)  # close() sends a reset, not a FIN
        for i in range(60):
            s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" if i % 2 == 0 else b"GET /metr")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            s.close()
        code, page = get(agent.port, "/")
        assert code == 200 and "<!DOCTYPE html>" in page
        time.sleep(1)
        assert get(agent.port, "/healthz")[0] == 200
        lines = new_log(agent, mark)
        assert not any("Traceback" in x or "Error" in x for x in lines), lines[:20]
        assert lines == [], lines[:20]
    finally:
        assert agent.stop() == 0


def test_the_reads_say_nothing_of_the_clusters_address_or_the_kubeconfigs_path(tmp_path):
    """After a run that could not reach the cluster (its reason names both, in the log), GET /runs, /runs/ID,
    /readyz, /metrics, / and an unknown route name neither."""
    tokens, token = token_file(tmp_path)
    agent = dead_agent(tmp_path, "--token-file", str(tokens))
    kubeconfig = str(tmp_path / "kubeconfig-of-the-dead-cluster")
    api_port = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1]
    try:
        code, body = get(agent.port, "/runs", "POST", token)
        assert code == 202, body
        run_id = json.loads(body)["id"]
        wait_for(lambda: api_runs(agent)[0]["status"] == "failed", 30, "the run failed")
        log = agent.log.read_text()
        assert kubeconfig in log and f"127.0.0.1:{api_port}" in log  # the operator's log keeps them
        reads = {path: get(agent.port, path) for path in ("/runs", f"/runs/{run_id}", "/readyz", "/metrics", "/",
                                                          "/nothing")}
        assert json.loads(reads["/runs"][1])[0]["reason"].startswith("the cluster could not be reached: no "
                                                                      "cluster reachable at <address>")
        assert "no cluster reachable at <address>" in json.loads(reads["/readyz"][1])["api_error"]
        for path, (code, body) in reads.items():
            assert code in (200, 404), (path, code)
            for secret in (kubeconfig, "kubeconfig-of-the-dead-cluster", "127.0.0.1", api_port, token):
                assert secret not in body, (path, secret, body[:2000])
    finally:
        assert agent.stop() == 0


def test_the_status_page_is_rendered_once_between_runs(tmp_path):
    """8 clients reloading / 10 times each: one render (gpuvs_status_page_renders_total), the same page each
    time; a run's records (queued, running, ended) make the next request render it again, once."""
    import concurrent.futures

    from fleet_store import sliding_fleet

    store = tmp_path / "gpuvs.db"
    sliding_fleet(store, runs=10, slide_from=5, slide=0.03)
    tokens, token = token_file(tmp_path)
    agent = dead_agent(tmp_path, "--token-file", str(tokens), store=store)
    try:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(lambda _: get(agent.port, "/"), range(80)))
        took = time.monotonic() - t0
        assert all(code == 200 for code, _ in pages) and len({p for _, p in pages}) == 1
        assert agent.metrics()[("gpuvs_status_page_renders_total", ())] == 1
        print(f"\n80 pages of {len(pages[0][1]) // 1000} kB in {took:.2f} s")
        assert get(agent.port, "/runs", "POST", token)[0] == 202
        wait_for(lambda: api_runs(agent)[0]["status"] == "failed", 30, "the run ended")
        for _ in range(5):
            assert get(agent.port, "/status")[0] == 200
        assert agent.metrics()[("gpuvs_status_page_renders_total", ())] == 2
    finally:
        assert agent.stop() == 0


def test_gpuvs_deploy_adds_a_random_token_secret_before_the_deployment_and_the_deployment_mounts_it():
    from gpuvs.agent import deploy

    objs = deploy.manifests()
    a, b = deploy.with_token(objs), deploy.with_token(objs)
    kinds = [m["kind"] for m in a]
    assert kinds.index("Secret") == kinds.index("Deployment") - 1 and len(a) == len(objs) + 1
    secret = a[kinds.index("Secret")]
    assert secret["metadata"]["name"] == deploy.TOKEN_SECRET and secret["metadata"]["namespace"] == "gpuvs-system"
    assert len(secret["stringData"]["token"]) >= 40  # 32 random bytes
    assert secret["stringData"]["token"] != b[kinds.index("Secret")]["stringData"]["token"]
    spec = next(m for m in objs if m["kind"] == "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == deploy.TOKEN_SECRET)
    assert volume["secret"]["optional"] is True and volume["secret"]["defaultMode"] == 0o440
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    args = spec["containers"][0]["args"]
    assert mount["readOnly"] and args[args.index("--token-file") + 1] == f"{mount['mountPath']}/token"


def _agent_context(tmp_path, **config):
    import threading

    from gpuvs.agent.config import AgentConfig
    from gpuvs.agent.runs import Context

    c = AgentConfig(store=str(tmp_path / "agent.db"), **config)
    return Context(c, State(stale_after_s=60.0), lambda: "img", threading.Event())


def test_the_agent_takes_the_validate_experiment_from_the_call_not_from_its_messages(tmp_path, monkeypatch):
    """validate runs in a child process as a library call: the experiment id is the returned ValidateResult's (a
    line on stderr that looks like gpuvs validate's and names another experiment changes nothing); its checks are
    read from the store under that id."""
    import agent_stand_ins

    from gpuvs.agent import runs

    monkeypatch.setattr(runs, "validate_in_child", agent_stand_ins.validate_returns)
    ctx = _agent_context(tmp_path)
    run = RunRecord("r1", "api")
    runs._validate(ctx, run, "default", "img", "node-1")
    with Store(ctx.config.store) as st:
        (exp,) = st.experiments()
    assert run.validate == exp.id != agent_stand_ins.DECOY and exp.name == "agent r1 validate"
    assert run.checks == {"functional: GPU nodes": "pass", "functional: CPU pod": "FAIL"}


def test_a_hung_validate_is_stopped_at_the_run_timeout_cleans_up_and_its_experiment_is_known(tmp_path, monkeypatch):
    """A call that hangs after its experiment exists: SIGTERM at --run-timeout, its own clean-up runs, and the id it
    emitted at the start is the run's (the agent does not wait for a return value that never comes)."""
    import agent_stand_ins

    from gpuvs.agent import runs

    monkeypatch.setattr(runs, "validate_in_child", agent_stand_ins.validate_hangs)
    ctx = _agent_context(tmp_path, run_timeout_s=3.0)
    run = RunRecord("r2", "api")
    t0 = time.monotonic()
    runs._validate(ctx, run, "default", "img", "node-1")
    took = time.monotonic() - t0
    with Store(ctx.config.store) as st:
        (exp,) = st.experiments()
    assert run.validate == exp.id and run.checks["functional: CPU pod"] == "FAIL"
    assert (tmp_path / "agent.cleaned").read_text() == "yes"  # its finally ran: stopped by SIGTERM, not killed
    assert 3.0 <= took < 3.0 + runs.STOP_GRACE_S and ctx.child.proc is None


def test_a_fleet_in_which_every_trial_failed_is_no_verdict_not_a_success(tmp_path, monkeypatch, capsys):
    """Every node's every trial failed (GPU not visible): the fleet and the run are no-verdict, not ok; /runs says
    so, gpuvs_runs_total counts it under no-verdict, gpuvs_last_success_timestamp_seconds does not appear (nor
    advance, after an ok run), gpuvs_last_run_status says no-verdict; an agent started again reads it back so."""
    import agent_stand_ins

    from gpuvs.agent import runs
    from gpuvs.agent.config import AgentConfig
    from gpuvs.agent.httpd import Server
    from gpuvs.agent.service import Agent

    monkeypatch.setattr(runs, "fleet_in_child", agent_stand_ins.fleet_all_failed)
    config = AgentConfig(store=str(tmp_path / "agent.db"), image="img")
    agent = Agent(config)
    ctx = runs.Context(config, agent.state, lambda: "img", agent.stopping)
    run = RunRecord("r6", "schedule", queued_at=time.time())
    from gpuvs.fleet.execute.node_choice import NodeChoice, NodeInfo

    nodes = [NodeInfo(n) for n in ("n1", "n2", "n3")]
    fleet = runs._fleet(ctx, run, "ns", "img", NodeChoice(nodes, nodes), WorkloadSpec.parse("spin"))
    assert fleet.status == "no-verdict" and fleet.experiment
    assert fleet.error.startswith("no verdict: 3 of 3 node(s) failed every trial (n1: every trial failed: GPU not "
                                  "visible;"), fleet.error
    assert "fleet spin on 3 node(s) exited 1: n1: every trial failed: GPU not visible" in capsys.readouterr().err
    run.fleets.append(fleet)
    run.status, run.reason = runs.run_status(run.fleets)
    assert (run.status, run.reason) == ("no-verdict", f"spin: {fleet.error}")
    run.finished_at = time.time()
    agent.save(run)
    agent.state.ended(run, run.finished_at)
    server = Server(agent, "127.0.0.1", 0)
    server.start()
    agent.started.set()
    try:
        (shown,) = json.loads(get(server.port, "/runs")[1])
        assert (shown["status"], shown["fleets"][0]["status"]) == ("no-verdict", "no-verdict")
        m = metrics_of(get(server.port, "/metrics")[1])
        assert m[("gpuvs_runs_total", (("status", "no-verdict"), ("trigger", "schedule")))] == 1
        assert ("gpuvs_runs_total", (("status", "ok"), ("trigger", "schedule"))) not in m
        assert ("gpuvs_last_success_timestamp_seconds", ()) not in m
        assert {k[1][0][1]: v for k, v in m.items() if k[0] == "gpuvs_last_run_status"} == {
            "ok": 0, "no-verdict": 1, "failed": 0, "interrupted": 0}
        # an ok run, then one more without a verdict: the last success stays at the ok run's end
        good = RunRecord("r7", "schedule", "ok", queued_at=time.time(), finished_at=time.time() - 5,
                         fleets=[FleetOutcome("spin", "e7")])
        agent.state.ended(good, good.finished_at)
        again = RunRecord("r8", "schedule", "no-verdict", queued_at=time.time(), finished_at=time.time(),
                          fleets=[fleet])
        agent.state.ended(again, again.finished_at)
        m = metrics_of(get(server.port, "/metrics")[1])
        assert m[("gpuvs_last_success_timestamp_seconds", ())] == pytest.approx(good.finished_at)
        assert m[("gpuvs_runs_total", (("status", "no-verdict"), ("trigger", "schedule")))] == 2
        assert m[("gpuvs_last_run_status", (("status", "no-verdict"),))] == 1
    finally:
        server.stop()
        agent.ledger.close()
    later = Agent(config)  # started again: the ledger's last run is read back as no success
    later._restore()
    assert (later.state.last_status, later.state.last_success_at) == ("no-verdict", None)
    later.ledger.close()
    # a failed fleet (no result) outweighs one without a verdict; an ok one does not hide it
    assert runs.run_status([FleetOutcome("a", status="no-verdict", error="x"), FleetOutcome("b", status="failed",
                                                                                              error="y")]) == (
        "failed", "b: y")
    assert runs.run_status([FleetOutcome("a"), FleetOutcome("b", status="no-verdict", error="z")]) == (
        "no-verdict", "b: z")
    assert runs.run_status([FleetOutcome("a")]) == ("ok", "")


def test_a_workload_spec_becomes_the_fleet_the_library_runs():
    """--workload NAME:KEY=VALUE,... as typed values for run_fleet: workload parameters coerced and checked, run and
    fleet options set, pod options in the pod's EnvSpec, the command line it stands for kept; a key the agent
    cannot pass on is one line."""
    from gpuvs.agent.config import AgentConfig
    from gpuvs.agent.runs import fleet_request
    from gpuvs.errors import UsageError

    c = AgentConfig(store="a.db", kubeconfig="/k", trials=4, max_trials=8)
    w = WorkloadSpec.parse("spin:steps=3,ops=1000,trials=6,reference=n2,cpus=1.5,toleration=a=b:NoSchedule")
    base, o = fleet_request(c, RunRecord("r3", "api"), "ns", "img:1", ["n1", "n2"], w)
    assert base.workload == "spin" and base.params["steps"] == 3 and base.params["ops"] == 1000
    assert base.device == "cpu" and base.env.kind == "pod"
    assert base.env.options["image"] == "img:1" and base.env.options["namespace"] == "ns"
    assert base.env.options["cpus"] == 1.5 and base.env.options["kubeconfig"] == "/k"
    assert (o.nodes, o.trials, o.max_trials, o.reference, o.label) == (["n1", "n2"], 6, 8, "n2", True)
    assert o.name == "agent r3 spin:steps=3,ops=1000,trials=6,reference=n2,cpus=1.5,toleration=a=b:NoSchedule"
    assert o.command.startswith("gpuvs fleet spin --image img:1 ") and "--nodes n1,n2 --label" in o.command
    with pytest.raises(UsageError, match="stepz is not an option of gpuvs fleet spin"):
        fleet_request(c, RunRecord("r4", "api"), "ns", "img", ["n1", "n2"], WorkloadSpec.parse("spin:stepz=3"))
    with pytest.raises(UsageError, match="--steps: '0' is not allowed"):
        fleet_request(c, RunRecord("r5", "api"), "ns", "img", ["n1", "n2"], WorkloadSpec.parse("spin:steps=0"))
