"""/metrics: the agent's state in Prometheus's exposition format (prometheus-client), by Prometheus's conventions.

Base units with the unit last (_seconds, _ratio), _total for counters, labels for what varies, gpuvs_build_info.
One collector reads the state at each scrape, beside prometheus-client's process and Python collectors.
docs/deploy.md has the table; a new metric is one more `yield` here."""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client import PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.exposition import generate_latest

from gpuvs import __version__
from gpuvs.agent.state import State
from gpuvs.analysis.stats import SETTLED

VERDICTS = (*SETTLED, "reference")
DRIFT_VERDICTS = SETTLED  # against the node's own past
LINK_VERDICTS = DRIFT_VERDICTS  # a node's links, a pair: against the fleet's (pair_verdicts: no reference)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RUN_STATUSES = ("ok", "no-verdict", "failed", "interrupted")  # how a run ends (ledger.STATUSES)


def add_figure(key: list[str], fig, ratio: GaugeMetricFamily, bound: GaugeMetricFamily,
               verdict: GaugeMetricFamily, verdicts: tuple[str, ...], extra: tuple[str, ...] = ()) -> None:
    """One figure's rows: its ratio, its interval's ends (bound: low, high) and a 1/0 row per verdict (with the
    `extra` label values after the verdict's, as a pair's cause)."""
    if fig.ratio is not None:
        ratio.add_metric(key, fig.ratio)
    for end, value in (("low", fig.low), ("high", fig.high)):
        if value is not None:
            bound.add_metric(key + [end], value)
    for v in verdicts:
        verdict.add_metric(key + [v, *extra], 1.0 if fig.verdict == v else 0.0)


class AgentCollector(Collector):
    def __init__(self, state: State):
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s, now = self.state, time.time()
        with s.lock:
            ratio = GaugeMetricFamily("gpuvs_node_perf_ratio", "The node's speed against its peers in the last "
                                      "fleet that measured it (below 1: slower)", labels=["node", "workload"])
            bound = GaugeMetricFamily("gpuvs_node_perf_interval_ratio", "The ends of gpuvs_node_perf_ratio's "
                                      "confidence interval (bound: low, high)", labels=["node", "workload", "bound"])
            verdict = GaugeMetricFamily("gpuvs_node_perf_verdict", "1 for the node's verdict against the fleet, 0 "
                                        "for the others", labels=["node", "workload", "verdict"])
            stale = GaugeMetricFamily("gpuvs_node_perf_stale", "1 when the figure was not renewed by the last run "
                                      "(node skipped, failed or gone; cluster unreachable) or is older than "
                                      "--stale-after", labels=["node", "workload"])
            success = GaugeMetricFamily("gpuvs_node_perf_last_success_timestamp_seconds", "When the figure was "
                                        "measured (Unix time)", labels=["node", "workload"])
            for fig in sorted(s.figures.values(), key=lambda f: (f.node, f.workload)):
                if not s.current(fig.workload):  # a workload the agent no longer runs: kept in the store only
                    continue
                key = [fig.node, fig.workload]
                add_figure(key, fig, ratio, bound, verdict, VERDICTS)
                stale.add_metric(key, 1.0 if s.stale(fig, now) else 0.0)
                success.add_metric(key, fig.measured_at)
            yield from (ratio, bound, verdict, stale, success)

            gpu_key = ["node", "gpu", "uuid", "workload"]  # --per-gpu fleets (fleet/execute/pergpu.py)
            g_ratio = GaugeMetricFamily("gpuvs_gpu_perf_ratio", "The GPU's speed against the fleet's GPUs of its "
                                        "model in the last per-GPU fleet that measured its node (below 1: slower)",
                                        labels=gpu_key)
            g_verdict = GaugeMetricFamily("gpuvs_gpu_perf_verdict", "1 for the GPU's verdict against the fleet's "
                                          "GPUs of its model, 0 for the others", labels=gpu_key + ["verdict"])
            g_slow = GaugeMetricFamily("gpuvs_node_slow_gpus", "How many of the node's GPUs the last per-GPU fleet "
                                       "found slower (the label gpuvs.io/slow-gpus)", labels=["node", "workload"])
            slow: dict[tuple[str, str], int] = {}
            for g in sorted(s.gpu_figures.values(), key=lambda g: (g.node, g.gpu, g.workload)):
                if not s.current(g.workload):
                    continue
                key = [g.node, str(g.gpu), g.uuid, g.workload]
                if g.ratio is not None:
                    g_ratio.add_metric(key, g.ratio)
                for v in VERDICTS:
                    g_verdict.add_metric(key + [v], 1.0 if g.verdict == v else 0.0)
                slow[(g.node, g.workload)] = slow.get((g.node, g.workload), 0) + (g.verdict == "slower")
            for (node, workload), n in sorted(slow.items()):
                g_slow.add_metric([node, workload], float(n))
            yield from (g_ratio, g_verdict, g_slow)

            labels = ["node", "workload"]
            d_ratio = GaugeMetricFamily("gpuvs_node_drift_ratio", "The node's latest run against its own earlier "
                                        "runs, each against its peers (below 1: slower than its past); not "
                                        "interleaved", labels=labels)
            d_bound = GaugeMetricFamily("gpuvs_node_drift_interval_ratio", "The ends of gpuvs_node_drift_ratio's "
                                        "interval, simultaneous over the fleet's nodes (bound: low, high)",
                                        labels=labels + ["bound"])
            d_verdict = GaugeMetricFamily("gpuvs_node_drift_verdict", "1 for the node's verdict against its own "
                                          "past, 0 for the others", labels=labels + ["verdict"])
            d_stale = GaugeMetricFamily("gpuvs_node_drift_stale", "1 when the drift is not from the run of the "
                                        "node's current, fresh figure (gpuvs_node_perf_stale, or the node missing "
                                        "from the workload's latest run)", labels=labels)
            d_at = GaugeMetricFamily("gpuvs_node_drift_run_timestamp_seconds", "When the run the drift judges was "
                                     "made (Unix time)", labels=labels)
            for fig in sorted(s.drift.values(), key=lambda f: (f.node, f.workload)):
                if not s.current(fig.workload):
                    continue
                key = [fig.node, fig.workload]
                add_figure(key, fig, d_ratio, d_bound, d_verdict, DRIFT_VERDICTS)
                d_stale.add_metric(key, 1.0 if s.stale(fig, now) else 0.0)
                d_at.add_metric(key, fig.measured_at)
            yield from (d_ratio, d_bound, d_verdict, d_stale, d_at)

            yield from self.links(s, now)

            gone = GaugeMetricFamily("gpuvs_node_gone", "1 for a node with results that is no longer in the "
                                     "cluster (its figures are kept, stale)", labels=["node"])
            for node in sorted(s.known_nodes()):
                gone.add_metric([node], 1.0 if node in s.gone else 0.0)
            yield gone
            skipped = GaugeMetricFamily("gpuvs_node_skipped", "1 for a node the last run did not test (its GPUs "
                                        "were requested by other pods, not ready, cordoned, ...)", labels=["node"])
            for node in sorted(s.skipped):
                skipped.add_metric([node], 1.0)
            yield skipped
            testing = GaugeMetricFamily("gpuvs_node_testing", "1 while the node is under test (gpuvs.io/testing)",
                                        labels=["node"])
            for node in sorted(s.testing):
                testing.add_metric([node], 1.0)
            yield testing
            breaker = GaugeMetricFamily("gpuvs_taint_circuit_open", "1 when the last fleet of the workload left a "
                                        "slower node untainted because --taint-max-share of the GPU nodes already "
                                        "carry gpuvs.io/slow (agent --taint only)", labels=["workload"])
            for workload, is_open in sorted((w, o) for w, o in s.circuit_open.items() if s.current(w)):
                breaker.add_metric([workload], 1.0 if is_open else 0.0)
            yield breaker

            check = GaugeMetricFamily("gpuvs_validate_check_ok", "1 when the functional validate check passed in "
                                      "the last run that ran it", labels=["check"])
            check_stale = GaugeMetricFamily("gpuvs_validate_check_stale", "1 when the last run did not renew the "
                                            "check, or it is older than --stale-after", labels=["check"])
            for c in sorted(s.checks.values(), key=lambda c: c.check):
                check.add_metric([c.check], 1.0 if c.ok else 0.0)
                check_stale.add_metric([c.check], 1.0 if s.stale(c, now) else 0.0)
            yield check
            yield check_stale

            if s.last_run_at is not None:
                yield GaugeMetricFamily("gpuvs_last_run_timestamp_seconds", "When the last run ended, whatever its "
                                        "outcome (Unix time)", value=s.last_run_at)
            if s.last_success_at is not None:
                yield GaugeMetricFamily("gpuvs_last_success_timestamp_seconds", "When the last ok run ended: every "
                                        "fleet judged its nodes (Unix time)", value=s.last_success_at)
            if s.last_status is not None:
                last = GaugeMetricFamily("gpuvs_last_run_status", "1 for the last ended run's status, 0 for the "
                                         "others (no-verdict: its fleets judged no node)", labels=["status"])
                for status in RUN_STATUSES:
                    last.add_metric([status], 1.0 if s.last_status == status else 0.0)
                yield last
            yield GaugeMetricFamily("gpuvs_run_in_progress", "1 while a run is going on",
                                    value=1.0 if s.running is not None else 0.0)
            runs = CounterMetricFamily("gpuvs_runs", "Runs ended, by trigger and outcome", labels=["trigger",
                                                                                                     "status"])
            for (trigger, status), n in sorted(s.runs.items()):
                runs.add_metric([trigger, status], n)
            yield runs
            failed = CounterMetricFamily("gpuvs_trials_failed", "Fleet trials that failed, by workload and reason "
                                         "(preempted: a real job took the node)", labels=["workload", "reason"])
            for (workload, reason), n in sorted(s.failed_trials.items()):
                failed.add_metric([workload, reason], n)
            yield failed
            yield GaugeMetricFamily("gpuvs_api_reachable", "1 when the last attempt reached the cluster's API "
                                    "server, 0 when it did not", value=1.0 if s.api_ok else 0.0)
            yield GaugeMetricFamily("gpuvs_store_ok", "1 when the store could be written the last time it was, 0 "
                                    "when not (see the log)", value=1.0 if s.store_ok else 0.0)
            yield CounterMetricFamily("gpuvs_store_errors", "Writes to the store that failed", value=s.store_errors)
            yield GaugeMetricFamily("gpuvs_agent_start_timestamp_seconds", "When the agent started (Unix time)",
                                    value=s.started_at)
            yield CounterMetricFamily("gpuvs_status_page_renders", "Times the status page was rendered (it is "
                                      "kept until a run's record changes)", value=s.page_renders)
        info = GaugeMetricFamily("gpuvs_build_info", "Always 1: gpuvs's version as a label (join on it)",
                                 labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info


    @staticmethod
    def links(s: State, now: float) -> Iterator[Metric]:
        """The last pair fleet's verdicts (`--workload collective:pairs=true`): each node's links, each pair."""
        labels = ["node", "workload"]
        ratio = GaugeMetricFamily("gpuvs_node_link_ratio", "The node's links against the fleet's in the last pair "
                                  "fleet that judged it: its pairs' figure, less its partners' (below 1: slower)",
                                  labels=labels)
        bound = GaugeMetricFamily("gpuvs_node_link_interval_ratio", "The ends of gpuvs_node_link_ratio's interval, "
                                  "simultaneous over the run's nodes and pairs (bound: low, high)",
                                  labels=labels + ["bound"])
        verdict = GaugeMetricFamily("gpuvs_node_link_verdict", "1 for the verdict on the node's links against the "
                                    "fleet's, 0 for the others (the label gpuvs.io/links)", labels=labels + ["verdict"])
        stale = GaugeMetricFamily("gpuvs_node_link_stale", "1 when the last pair fleet of the workload did not "
                                  "judge the node (skipped, failed, gone) or the figure is older than --stale-after",
                                  labels=labels)
        success = GaugeMetricFamily("gpuvs_node_link_last_success_timestamp_seconds", "When the node's links were "
                                    "judged (Unix time)", labels=labels)
        for fig in sorted(s.links.values(), key=lambda f: (f.node, f.workload)):
            if not s.current(fig.workload):
                continue
            key = [fig.node, fig.workload]
            add_figure(key, fig, ratio, bound, verdict, LINK_VERDICTS)
            stale.add_metric(key, 1.0 if s.stale(fig, now) else 0.0)
            success.add_metric(key, fig.measured_at)
        yield from (ratio, bound, verdict, stale, success)
        pair = ["node_a", "node_b", "workload"]
        p_ratio = GaugeMetricFamily("gpuvs_link_ratio", "The pair's figure against the fleet's in the workload's "
                                    "last pair fleet (below 1: slower)", labels=pair)
        p_bound = GaugeMetricFamily("gpuvs_link_interval_ratio", "The ends of gpuvs_link_ratio's interval "
                                    "(bound: low, high)", labels=pair + ["bound"])
        p_verdict = GaugeMetricFamily("gpuvs_link_verdict", "1 for the pair's verdict against the fleet's, 0 for the "
                                      "others; cause: what a slower pair is blamed on (the link, its slower "
                                      "member(s)), empty otherwise", labels=pair + ["verdict", "cause"])
        for fig in sorted(s.pair_links.values(), key=lambda f: (f.workload, f.a, f.b)):
            if not s.current(fig.workload):
                continue
            key = [fig.a, fig.b, fig.workload]
            add_figure(key, fig, p_ratio, p_bound, p_verdict, LINK_VERDICTS, (fig.cause,))
        yield from (p_ratio, p_bound, p_verdict)


def registry(state: State) -> CollectorRegistry:
    """The agent's collector, and prometheus-client's own process and Python ones (process_cpu_seconds_total,
    process_resident_memory_bytes, process_open_fds, ..., python_info), which its default registry has and a
    registry of our own does not."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(state))
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
