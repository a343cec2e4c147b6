"""Alerting and scraping as users install them (docs/deploy.md, "Alerts and dashboards").

Prometheus's own `promtool` tests the rule file on series that mimic a slow node, a healthy fleet, a stale agent.
The PrometheusRule, the ServiceMonitor and the Grafana dashboard match it and the agent's Service.
Every metric name they use is one the agent's real /metrics exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from cluster import k8s_build  # noqa: F401  (a session fixture)
from conftest import ROOT, missing_part, require
from agent.test_agent_pairs import result as pair_result
from gpuvs.agent.ledger import FleetOutcome, RunRecord
from gpuvs.agent.metrics import exposition, registry
from gpuvs.agent.state import DriftFigure, State
from gpuvs.fleet.execute.adaptive import AdaptiveTrials
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.fleet.assess.node_verdicts import ErrorControl

RULES = ROOT / "deploy/prometheus/gpuvs-rules.yaml"
MONITORING = ROOT / "deploy/monitoring"
DASHBOARD = ROOT / "deploy/grafana/gpuvs-dashboard.json"
TARGET = {"job": "gpuvs-agent", "instance": "10.0.0.5:8080"}  # what a scrape adds to every series
NODES = ("gpu-1", "gpu-2", "gpu-3")
VERDICTS = ("slower", "faster", "equivalent", "inconclusive", "reference")
ALERTS = ("GpuvsNodeSlow", "GpuvsNodeDrifting", "GpuvsNodeLinksSlow", "GpuvsValidateFailing", "GpuvsNoVerdict",
          "GpuvsFiguresStale", "GpuvsAgentDown",
          "GpuvsClusterUnreachable", "GpuvsStoreFailing")
EXEC, SHARING = "functional: GPU pod: exec works", "functional: GPU sharing"


def promtool() -> str:
    return require("promtool", "Prometheus's promtool (Debian's prometheus package, .ci/apt/agent.txt)")


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def series(name: str, values: str, **labels: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in {**TARGET, **labels}.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def fleet(ratios: dict[str, float], verdicts: dict[str, str], n: int, stale: set[str] = frozenset(),
          gone: set[str] = frozenset(), drift: dict[str, tuple[float, str]] | None = None) -> list[dict]:
    """What the agent exports for one workload's fleet, constant over n+1 one-minute samples."""
    out = []
    for node in ratios:
        key = {"node": node, "workload": "gemm"}
        out.append(series("gpuvs_node_perf_ratio", f"{ratios[node]}x{n}", **key))
        out += [series("gpuvs_node_perf_verdict", f"{int(v == verdicts[node])}x{n}", **key, verdict=v)
                for v in VERDICTS]
        out.append(series("gpuvs_node_perf_stale", f"{int(node in stale)}x{n}", **key))
        out.append(series("gpuvs_node_gone", f"{int(node in gone)}x{n}", node=node))
        if drift and node in drift:
            ratio, verdict = drift[node]
            out.append(series("gpuvs_node_drift_ratio", f"{ratio}x{n}", **key))
            out += [series("gpuvs_node_drift_verdict", f"{int(v == verdict)}x{n}", **key, verdict=v)
                    for v in VERDICTS[:4]]
            out.append(series("gpuvs_node_drift_stale", f"{int(node in stale)}x{n}", **key))
    return out


def links(verdicts: dict[str, tuple[float, str]], n: int, stale: set[str] = frozenset()) -> list[dict]:
    """What the agent exports of a pair fleet's nodes (gpuvs_node_link_*), constant over n+1 samples."""
    out = []
    for node, (ratio, verdict) in verdicts.items():
        key = {"node": node, "workload": "collective"}
        out.append(series("gpuvs_node_link_ratio", f"{ratio}x{n}", **key))
        out += [series("gpuvs_node_link_verdict", f"{int(v == verdict)}x{n}", **key, verdict=v) for v in VERDICTS[:4]]
        out.append(series("gpuvs_node_link_stale", f"{int(node in stale)}x{n}", **key))
    return out


def agent(n: int, api: int = 1, store: int = 1, checks: dict[str, tuple[int, int]] | None = None,
          last: str | None = "ok") -> list[dict]:
    """The agent's own series: up, the API server and the store, validate checks as (ok, stale), the last run's
    status (None: none)."""
    from gpuvs.agent.metrics import RUN_STATUSES

    out = [series("up", f"1x{n}"), series("gpuvs_api_reachable", f"{api}x{n}"),
           series("gpuvs_store_ok", f"{store}x{n}")]
    out += [series("gpuvs_last_run_status", f"{int(s == last)}x{n}", status=s) for s in RUN_STATUSES if last]
    for check, (ok, stale) in (checks or {EXEC: (1, 0), SHARING: (1, 0)}).items():
        out.append(series("gpuvs_validate_check_ok", f"{ok}x{n}", check=check))
        out.append(series("gpuvs_validate_check_stale", f"{stale}x{n}", check=check))
    return out


def annotations(alert: str, labels: dict[str, str], value: float | None = None) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for these labels and value (humanizePercentage of 0.62
    is 62%): the rule file's own text, so that the test asserts which alerts fire with which labels and value."""
    rule = next(r for g in rule_groups() for r in g["rules"] if r.get("alert") == alert)
    out = {}
    for k, text in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        if value is not None:
            text = text.replace("{{ $value | humanizePercentage }}", f"{value * 100:.4g}%")
        assert "{{" not in text, text
        out[k] = text
    return out


def firing(alert: str, value: float | None = None, **labels: str) -> dict:
    rule = next(r for g in rule_groups() for r in g["rules"] if r.get("alert") == alert)
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations(alert, labels, value)}


def expect(at: str, fired: dict[str, list[dict]]) -> list[dict]:
    """Every alert at `at`: the ones named fire exactly so, every other one is silent."""
    return [{"eval_time": at, "alertname": a, "exp_alerts": fired.get(a, [])} for a in ALERTS]


def scenarios() -> list[dict]:
    def node(name: str) -> dict[str, str]:
        return {**TARGET, "node": name, "workload": "gemm"}

    slow = {"interval": "1m", "name": "a slow node (and a drifting one, a failing check) in a fresh fleet",
            "input_series": fleet({"gpu-1": 1.0, "gpu-2": 0.62, "gpu-3": 1.01},
                                  {"gpu-1": "equivalent", "gpu-2": "slower", "gpu-3": "reference"}, 60,
                                  drift={"gpu-1": (0.7, "slower"), "gpu-2": (0.98, "equivalent"),
                                         "gpu-3": (1.0, "equivalent")})
            + agent(60, checks={EXEC: (0, 0), SHARING: (0, 1)})
            + links({"gpu-1": (1.0, "equivalent"), "gpu-2": (0.98, "equivalent"), "gpu-3": (0.6, "slower")}, 60),
            "alert_rule_test": expect("3m", {})  # pending: `for: 5m` rides out a scrape or two
            + expect("30m", {"GpuvsNodeSlow": [firing("GpuvsNodeSlow", 0.62, **node("gpu-2"))],
                             "GpuvsNodeLinksSlow": [firing("GpuvsNodeLinksSlow", 0.6,
                                                           **{**node("gpu-3"), "workload": "collective"})],
                             "GpuvsNodeDrifting": [firing("GpuvsNodeDrifting", 0.7, **node("gpu-1"))],
                             "GpuvsValidateFailing": [firing("GpuvsValidateFailing", check=EXEC, **TARGET)]})}
    healthy = {"interval": "1m", "name": "a healthy fleet",
               "input_series": fleet({"gpu-1": 0.98, "gpu-2": 1.0, "gpu-3": 1.02},
                                     {"gpu-1": "equivalent", "gpu-2": "reference", "gpu-3": "equivalent"}, 120,
                                     drift={n: (1.0, "equivalent") for n in NODES}) + agent(120)
               + links({n: (1.0, "equivalent") for n in NODES}, 120),
               "alert_rule_test": expect("30m", {}) + expect("2h", {})}
    # the agent is up but measures nothing: the API server away, every figure stale (gpu-3 gone from the cluster);
    # gpu-2's old `slower` stays silent, being stale, and so does the check that failed long ago
    stale = {"interval": "1m", "name": "a stale agent",
             "input_series": fleet({"gpu-1": 1.0, "gpu-2": 0.6, "gpu-3": 1.0},
                                   {"gpu-1": "equivalent", "gpu-2": "slower", "gpu-3": "reference"}, 120,
                                   stale=set(NODES), gone={"gpu-3"}, drift={"gpu-2": (0.5, "slower")})
             + agent(120, api=0, checks={EXEC: (0, 1)}) + links({"gpu-2": (0.5, "slower")}, 120, stale={"gpu-2"}),
             "alert_rule_test": expect("20m", {})
             + expect("90m", {"GpuvsFiguresStale": [firing("GpuvsFiguresStale", **node("gpu-1")),
                                                    firing("GpuvsFiguresStale", **node("gpu-2"))],
                              "GpuvsClusterUnreachable": [firing("GpuvsClusterUnreachable", **TARGET)]})}
    # the agent's scrape fails (up 0), then its target is gone altogether (no `up` at all)
    down = {"interval": "1m", "name": "the agent down",
            "input_series": [series("up", "1x10 0x30")] + agent(40)[1:],
            "alert_rule_test": expect("15m", {})
            + expect("25m", {"GpuvsAgentDown": [firing("GpuvsAgentDown", **TARGET)]})}
    gone = {"interval": "1m", "name": "the agent's target gone", "input_series": [series("gpuvs_store_ok", "0x30")],
            "alert_rule_test": [{"eval_time": "5m", "alertname": "GpuvsAgentDown", "exp_alerts": []},
                                {"eval_time": "15m", "alertname": "GpuvsAgentDown",
                                 "exp_alerts": [firing("GpuvsAgentDown", job="gpuvs-agent")]},
                                {"eval_time": "15m", "alertname": "GpuvsStoreFailing",
                                 "exp_alerts": [firing("GpuvsStoreFailing", **TARGET)]}]}
    # every trial failed on every node (the GPU check where no GPU is visible): the run judged no node; the
    # figures of an earlier run are still fresh, so only this alert says it. The next ok run silences it
    blind = {"interval": "1m", "name": "a run with no verdict, then an ok one",
             "input_series": fleet({n: 1.0 for n in NODES}, {n: "equivalent" for n in NODES}, 60)
             + agent(60, last=None) + [series("gpuvs_last_run_status", "0x30 1x30", status="ok"),
                                 series("gpuvs_last_run_status", "1x30 0x30", status="no-verdict")]
             + [series("gpuvs_last_run_status", "0x60", status=s) for s in ("failed", "interrupted")],
             "alert_rule_test": expect("3m", {})
             + expect("20m", {"GpuvsNoVerdict": [firing("GpuvsNoVerdict", status="no-verdict", **TARGET)]})
             + expect("45m", {})}
    return [slow, healthy, stale, down, gone, blind]


def run_promtool_tests(tmp_path, tests: list[dict]) -> subprocess.CompletedProcess:
    shutil.copy(RULES, tmp_path / RULES.name)
    path = tmp_path / "gpuvs-rules.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [RULES.name], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


# -- the rules, by promtool -----------------------------------------------------------------------------------

def test_promtool_checks_the_plain_rule_file():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in r.stdout
    assert [r["alert"] for g in rule_groups() for r in g["rules"]] == list(ALERTS)


def test_promtool_slow_node_fires_healthy_fleet_does_not_stale_agent_fires(tmp_path):
    r = run_promtool_tests(tmp_path, scenarios())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_fails_an_expectation_the_rules_do_not_meet(tmp_path):
    """The harness can fail: a healthy fleet said to have a slow node, and a slow node said to be silent."""
    slow, healthy = scenarios()[:2]
    healthy["alert_rule_test"] = [{"eval_time": "30m", "alertname": "GpuvsNodeSlow",
                                   "exp_alerts": [firing("GpuvsNodeSlow", 0.98, **TARGET, node="gpu-1",
                                                         workload="gemm")]}]
    slow["alert_rule_test"] = [{"eval_time": "30m", "alertname": "GpuvsNodeSlow", "exp_alerts": []}]
    for case in (healthy, slow):
        r = run_promtool_tests(tmp_path, [case])
        assert r.returncode != 0 and "GpuvsNodeSlow" in r.stdout + r.stderr, r.stdout + r.stderr


# -- what users install: the component, the plain file, the dashboard --------------------------------------------

def component() -> dict[str, dict]:
    k = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1alpha1" and k["kind"] == "Component"
    out = {}
    for name in k["resources"]:
        (doc,) = [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]
        out[doc["kind"]] = doc
    return out


def test_the_prometheusrule_carries_exactly_the_plain_files_groups():
    rule = component()["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == rule_groups(), \
        "deploy/monitoring/prometheusrule.yaml's spec.groups differ from deploy/prometheus/gpuvs-rules.yaml"


def test_the_servicemonitor_scrapes_the_agents_service_and_keeps_its_node_label():
    import gpuvs

    objs = component()
    assert sorted(objs) == ["PrometheusRule", "ServiceMonitor"]
    service = yaml.safe_load((ROOT / "deploy/service.yaml").read_text())
    sm = objs["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    for obj in objs.values():
        meta = obj["metadata"]
        assert meta["namespace"] == service["metadata"]["namespace"]
        assert meta["labels"]["app.kubernetes.io/version"] == gpuvs.__version__
        assert meta["labels"]["app.kubernetes.io/name"] == "gpuvs"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    # GpuvsAgentDown asks for the job the operator names after the Service
    assert 'job="' + service["metadata"]["name"] + '"' in next(
        r["expr"] for g in rule_groups() for r in g["rules"] if r["alert"] == "GpuvsAgentDown")


def kubectls() -> dict[str, str]:
    """{minor version: path} of kubectl 1.20 (the test cluster's) and of a current kubectl on PATH."""
    from cluster import BIN

    out = {}
    for path in (BIN / "kubectl", shutil.which("kubectl")):
        if path and Path(path).exists():
            r = subprocess.run([str(path), "version", "--client", "-o", "json"], capture_output=True, text=True,
                               timeout=60)
            if r.returncode == 0:
                out[json.loads(r.stdout)["clientVersion"]["minor"].rstrip("+")] = str(path)
    return out


def test_an_overlay_with_the_component_builds_deploy_and_the_monitoring_objects(tmp_path, k8s_build):
    """A user's overlay (outside deploy/, as kustomize wants) of deploy/ with the component: a current kubectl
    (1.21 or later) builds it into deploy/'s objects and these two; kubectl 1.20's kustomize (v2.0.3) refuses it
    with one line, as docs/deploy.md says. A current kubectl cannot be installed on CI's machine
    (tests/agent/test_deploy.py): that part runs where one is on PATH."""
    found = kubectls()
    if "20" not in found:
        missing_part("kubectl 1.20 is not in the test cluster's bin: run scripts/test-cluster build")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = "../" * len(overlay.parts[1:]) + str(ROOT.relative_to("/"))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/deploy"], "components": [f"{rel}/deploy/monitoring"]}))
    for minor, kubectl in sorted(found.items()):
        r = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
        if minor == "20":
            assert r.returncode != 0 and 'unknown field "components"' in r.stderr, r.stdout[-500:] + r.stderr
            continue
        assert r.returncode == 0, r.stderr
        got = [d for d in yaml.safe_load_all(r.stdout) if d]
        base = yaml.safe_load((ROOT / "deploy/kustomization.yaml").read_text())["resources"]
        assert len(got) == len(base) + 2
        kinds = [x["kind"] for x in got]
        assert [d for d in got if d["kind"] in ("ServiceMonitor", "PrometheusRule")] == \
            sorted(component().values(), key=lambda d: kinds.index(d["kind"]))


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]] + \
        [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]


def test_promtool_parses_every_query_of_the_dashboard(tmp_path):
    """Each panel's query, Grafana's variables given values, is valid PromQL: promtool checks them as recording
    rules (label_values() is Grafana's, not PromQL: its selector is checked)."""
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        expr = expr.replace("$__range", "1d").replace("$job", "gpuvs-agent").replace("$workload", ".*")
        expr = re.sub(r"^label_values\((.*), \w+\)$", r"\1", expr)
        rules.append({"record": f"gpuvs:dashboard_{i}", "expr": expr})
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(rules) > 15


# -- the names, against the agent's real /metrics ----------------------------------------------------------------

def exposition_text() -> str:
    """The agent's /metrics (its collector, rendered by prometheus-client as the agent serves it) with every family
    present: a fleet, a pair fleet, a drift, checks, a run with failed and skipped, a node gone, one under test."""
    now = time.time()
    state = State(stale_after_s=100)
    rows = [NodeRow(n, "slower" if s < 0.9 else "equivalent", n_ok=4, n_trials=4, speed=s, speed_low=s * 0.9,
                    speed_high=s * 1.1) for n, s in (("gpu-1", 1.0), ("gpu-2", 0.6))]
    state.fleet(FleetResult("e1", "gemm", "TFLOP/s", True, 0.05, 0.95, AdaptiveTrials(4, 12, 4), ErrorControl(0.95, 3, 2),
                            1, rows), "gemm", now)
    state.drift = {("gpu-2", "gemm"): DriftFigure("gpu-2", "gemm", "slower", 0.7, 0.6, 0.8, "e1", now)}
    state.validate({EXEC: "pass"}, now)
    state.pair_fleet(pair_result(["gpu-1", "gpu-2", "gpu-3"], slow="gpu-2"), "collective", now)
    state.ended(RunRecord("r1", "schedule", "ok", skipped={"gpu-3": "busy"},
                          fleets=[FleetOutcome("gemm", "e1", failed_trials={"preempted": 1})]), now)
    state.nodes_now({"gpu-1"})
    state.testing = {"gpu-1"}
    state.running = RunRecord("r2", "api", "running")
    return exposition(registry(state)).decode()


def real_exposition() -> set[str]:
    """The sample names of the agent's /metrics."""
    names = set()
    for fam in text_string_to_metric_families(exposition_text()):
        names |= {s.name for s in fam.samples}
    return names


def names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (gpuvs's, the process collector's, python_info; `up` is
    Prometheus's own)."""
    return set(re.findall(r"\b((?:gpuvs|process|python)_[a-z_]+)\b(?!\()", expr))


def test_every_metric_of_the_rules_and_the_dashboard_is_in_the_agents_metrics():
    have = real_exposition()
    used = {n for g in rule_groups() for r in g["rules"] for n in names_in(r["expr"])}
    shown = {n for e in dashboard_exprs() for n in names_in(e)}
    assert used and shown
    assert sorted(used - have) == [] and sorted(shown - have) == []
    # the dashboard shows each of the agent's own metrics (a new one is a new panel, or a decision not to)
    assert sorted(n for n in have if n.startswith("gpuvs_") and n not in shown) == []


def test_every_gpuvs_metric_is_in_the_docs_table():
    docs = (ROOT / "docs/deploy-metrics.md").read_text()
    missing = sorted(n for n in real_exposition() if n.startswith("gpuvs_") and f"`{n}`" not in docs)
    assert missing == []


def test_promtool_lints_the_agents_metrics_clean():
    """`promtool check metrics`, Prometheus's own lint of an exposition (counters end in _total, base units, no
    abbreviated units, help text present), finds nothing in the agent's /metrics."""
    r = subprocess.run([promtool(), "check", "metrics"], input=exposition_text(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
