"""One run of the agent: reach the cluster, find the nodes free to test (idle.py), mark them gpuvs.io/testing,
run the functional validate suite on one of them and a fleet per workload on all of them (labels written as by
`gpuvs fleet --label`), then remove the marks, whatever happened.

validate and fleet run as gpuvs's own commands in child processes, each with the agent's store: the same code,
options and clean-up as by hand (each deletes its pods and releases gpuvs's package ConfigMap when it ends,
SIGTERM included), and a child that fails cannot take the agent with it. What they found is read back as typed
records (the fleet's FleetResult from its JSON report, the validate rows and the trials from the store)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuvs.agent import idle
from gpuvs.agent.config import AgentConfig, WorkloadSpec
from gpuvs.agent.ledger import FleetOutcome, RunRecord
from gpuvs.agent.state import State
from gpuvs.errors import GpuvsError
from gpuvs.fleet.result import FleetResult
from gpuvs.safetext import safe_text

STOP_GRACE_S = 45.0  # a child's own clean-up after SIGTERM (the pod deletions), before SIGKILL


class Interrupted(Exception):
    """The agent is stopping (SIGTERM): the run ends here, cleaned up, marked interrupted."""


_LOG_LOCK = threading.Lock()


def log(message: str) -> None:
    """One line on stderr, a child's words in it shown with control characters escaped. Whole lines only: the HTTP
    server's threads log at once (print writes the text and the newline apart, so two threads' lines could run
    together)."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} gpuvs agent: {safe_text(message)}\n"
    with _LOG_LOCK:
        sys.stderr.write(line)
        sys.stderr.flush()


@dataclass
class Child:
    """The child process in flight, so that a stop can end it (SIGTERM: it cleans up after itself)."""

    proc: subprocess.Popen | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self) -> None:
        with self.lock:
            p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)


@dataclass
class Context:
    config: AgentConfig
    state: State
    image: Callable[[], str]  # the trial image (the agent's own unless --image)
    stopping: threading.Event
    child: Child = field(default_factory=Child)


def _gpuvs(ctx: Context, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    """gpuvs ARGV as a child process: (exit status, stdout, stderr). Stopped with SIGTERM when the agent stops."""
    if ctx.stopping.is_set():
        raise Interrupted("the agent is stopping")
    p = subprocess.Popen([sys.executable, "-m", "gpuvs", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    with ctx.child.lock:
        ctx.child.proc = p
    try:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            err += f"\ngpuvs agent: stopped after {timeout_s:g} s (--run-timeout)"
        if p.returncode in (-signal.SIGTERM, 143) and ctx.stopping.is_set():
            raise Interrupted("the agent is stopping")
        return p.returncode, out, err
    finally:
        if p.poll() is None:  # an exception above (the agent stopping): the child cleans up, then goes
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        with ctx.child.lock:
            ctx.child.proc = None


def _cluster_args(c: AgentConfig, namespace: str) -> list[str]:
    out = ["--namespace", namespace]
    if c.kubeconfig:
        out += ["--kubeconfig", c.kubeconfig]
    if c.context:
        out += ["--context", c.context]
    return out


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:500] if lines else ""


def execute(ctx: Context, run: RunRecord, save: Callable[[RunRecord], None]) -> None:
    """Run `run` to its end: its status, reason and findings are set on it (and saved as they change)."""
    from gpuvs.fleet import kube as fleet_kube
    from gpuvs.fleet import nodes as fleet_nodes
    from gpuvs.kube import client

    c, state = ctx.config, ctx.state
    run.status, run.started_at = "running", time.time()
    save(run)
    marked: list[str] = []
    cluster = None
    try:
        try:
            cluster = client.connect(c.kubeconfig, c.context, c.namespace)
            found = fleet_kube.nodes(cluster)
        except GpuvsError as exc:
            client.forget()  # the next try connects afresh
            state.api(False, str(exc))
            state.not_renewed()
            run.status, run.reason = "failed", f"the cluster could not be reached: {exc}"
            return
        state.api(True)
        run.reached = True
        state.nodes_now({n.name for n in found})
        run.gone = sorted(state.gone)
        has_gpus = any(n.gpus(c.gpu_resource) > 0 for n in found)
        chosen, excluded = fleet_nodes.select(found, gpu_resource=c.gpu_resource, need_gpus=has_gpus,
                                              tolerations=[])
        run.skipped = {e.node: e.reason for e in excluded}
        image = ctx.image()
        gpus = {n.name: n.gpus(c.gpu_resource) for n in chosen}
        free, busy = idle.free_nodes(cluster, gpus, run_id=run.id, image=image, python=c.python,
                                     resource=c.gpu_resource, priority_class=c.priority_class,
                                     pull_policy=c.pull_policy, restricted=c.pod_security == "restricted",
                                     timeout_s=c.hold_timeout_s, stop=ctx.stopping.is_set)
        if ctx.stopping.is_set():
            raise Interrupted("the agent is stopping")
        run.skipped.update(busy)
        for node, why in sorted(run.skipped.items()):
            log(f"run {run.id}: node {node} skipped: {why}")
        for node in free:
            idle.mark(cluster, node)
            marked.append(node)
        state.testing = set(marked)
        run.tested = list(free)
        save(run)
        log(f"run {run.id}: testing {', '.join(free) or 'no node'}")
        if c.validate and free:
            _validate(ctx, run, cluster.namespace, image, free[0])
            save(run)
        if len(free) < 2:
            state.not_renewed()
            run.status = "failed"
            run.reason = (f"a fleet needs at least 2 nodes free to test, found {len(free)}"
                          + (f" ({'; '.join(f'{k}: {v}' for k, v in sorted(run.skipped.items()))})"
                             if run.skipped else ""))
            return
        for w in c.workloads:
            run.fleets.append(_fleet(ctx, run, cluster.namespace, image, free, w))
            save(run)
        bad = [f for f in run.fleets if f.status != "ok"]
        run.status = "failed" if bad else "ok"
        run.reason = "; ".join(f"{f.workload}: {f.error}" for f in bad)
    except Interrupted as exc:
        run.status, run.reason = "interrupted", str(exc)
    except Exception as exc:  # an API error mid-run: the run fails, the agent goes on
        from gpuvs.kube.client import api_message

        run.status, run.reason = "failed", f"{type(exc).__name__}: {api_message(exc)}"
    finally:
        problems = []
        if marked and cluster is not None:
            for node in marked:
                why = idle.unmark(cluster, node)
                if why:
                    problems.append(f"{idle.TESTING} left on {node}: {why}")
        state.testing = set()
        if problems:
            run.reason = "; ".join([x for x in (run.reason, *problems) if x])
        run.finished_at = time.time()


def _validate(ctx: Context, run: RunRecord, namespace: str, image: str, node: str) -> None:
    c = ctx.config
    argv = ["validate", "--image", image, "--image-pull-policy", c.pull_policy, "--node", node, "--resource",
            c.gpu_resource, "--priority-class", c.priority_class, "--pod-security", c.pod_security, "--store", c.store,
            "--name",
            f"agent {run.id} validate", *_cluster_args(c, namespace)]
    code, out, err = _gpuvs(ctx, argv, c.run_timeout_s)
    first = next((x for x in err.splitlines() if x.startswith("gpuvs validate:")), "")  # "... experiment ID"
    m = re.search(r"experiment (\S+)\s*$", first)
    run.validate = m.group(1) if m else None
    if run.validate:
        from gpuvs.store.db import Store

        with Store(c.store) as st:
            rows = st.experiment(run.validate).meta.checks or []
        run.checks = {f"{r['suite']}: {r['check']}": r["status"] for r in rows}
        ctx.state.validate(run.checks, time.time())
    log(f"run {run.id}: validate on {node} exited {code}" + (f": {_last_line(err)}" if code else ""))


def _fleet(ctx: Context, run: RunRecord, namespace: str, image: str, nodes: list[str], w: WorkloadSpec
           ) -> FleetOutcome:
    c = ctx.config
    outcome = FleetOutcome(w.name)
    with tempfile.TemporaryDirectory(prefix="gpuvs-agent-") as tmp:
        report = Path(tmp) / "fleet.json"
        own = {k for k, _ in w.options}
        argv = ["fleet", w.name, "--image", image, "--image-pull-policy", c.pull_policy, "--nodes", ",".join(nodes),
                "--label", "--priority-class", c.priority_class, "--pod-security", c.pod_security, "--package",
                c.package, "--python", c.python, "--gpu-resource", c.gpu_resource, "--margin", str(c.margin),
                "--parallel", str(c.parallel), "--store", c.store, "--name", f"agent {run.id} {w}",
                "--format", "json", "--output", str(report), *_cluster_args(c, namespace)]
        argv += [] if "device" in own else ["--device", c.device]
        argv += [] if "trials" in own else ["--trials", str(c.trials)]
        if c.max_trials is not None and "max-trials" not in own:
            argv += ["--max-trials", str(c.max_trials)]
        argv += w.argv()
        code, out, err = _gpuvs(ctx, argv, c.run_timeout_s)
        result = FleetResult.from_dict(json.loads(report.read_text())) if report.exists() else None
    if result is not None:
        outcome.experiment = result.id
        ctx.state.fleet(result, w.name, time.time())
        from gpuvs.store.db import Store

        with Store(c.store) as st:
            for t in st.trials(result.id):
                if t.status != "ok":
                    reason = t.error_kind or t.status
                    outcome.failed_trials[reason] = outcome.failed_trials.get(reason, 0) + 1
    else:
        ctx.state.not_renewed(w.name)
    if code == 2 or result is None:
        outcome.status, outcome.error = "failed", _last_line(err) or f"gpuvs fleet exited {code}"
    log(f"run {run.id}: fleet {w} on {len(nodes)} node(s) exited {code}"
        + (f": {_last_line(err)}" if code else "")
        + (f"; " + ", ".join(f"{r.node} {r.verdict} {r.speed:.3f}" for r in result.measured() if r.speed is not None)
           if result else ""))
    return outcome
