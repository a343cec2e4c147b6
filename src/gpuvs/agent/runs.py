"""One run of the agent: find the nodes free to test, mark them, run validate and a fleet per workload, unmark them.

validate and fleet are the library's run_validate and run_fleet, each in a child process (child.py).
So a child that fails or hangs cannot take the agent with it; what they found comes back as typed values."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvs.agent import child, idle
from gpuvs.agent.child import Child, Emit, Outcome
from gpuvs.agent.config import AgentConfig, WorkloadSpec
from gpuvs.agent.ledger import FleetOutcome, RunRecord
from gpuvs.agent.state import State
from gpuvs.errors import GpuvsError, UsageError
from gpuvs.fleet.result import FleetResult
from gpuvs.safetext import safe_text
from gpuvs.spec import RunSpec

STOP_GRACE_S = 45.0  # a child's own clean-up after SIGTERM (the pod deletions), before SIGKILL
NO_VERDICT = "no-verdict"  # a run (or fleet) whose results judged no node: not a success


# the fleet options the agent sets itself (its --condition, --taint, ...): a workload cannot give them
AGENT_OWN = ("nodes", "label", "dry_run", "condition", "taint", "taint_effect", "taint_max_share")


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
class Context:
    config: AgentConfig
    state: State
    image: Callable[[], str]  # the trial image (the agent's own unless --image)
    stopping: threading.Event
    child: Child = field(default_factory=Child)


def _call(ctx: Context, target: Callable[..., Any], kwargs: dict[str, Any], on_event: Emit | None = None
          ) -> Outcome:
    """target in a child process (child.call), stopped with SIGTERM when the agent stops or --run-timeout passes."""
    if ctx.stopping.is_set():
        raise Interrupted("the agent is stopping")
    c = ctx.config
    out = child.call(target, kwargs, holder=ctx.child, timeout_s=c.run_timeout_s, grace_s=STOP_GRACE_S,
                     on_event=on_event)
    if out.exit_code in (-signal.SIGTERM, 128 + signal.SIGTERM) and ctx.stopping.is_set():
        raise Interrupted("the agent is stopping")
    if out.timed_out:
        out.error = f"stopped after {c.run_timeout_s:g} s (--run-timeout)"
    return out


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:500] if lines else ""


def has_gpus(nodes: list[Any], resource: str) -> bool:
    """Whether any node advertises the GPU resource (allocatable): the fleet then runs on GPU nodes, and the
    default workload is the GPU check."""
    return any(n.gpus(resource) > 0 for n in nodes)


def execute(ctx: Context, run: RunRecord, save: Callable[[RunRecord], None]) -> None:
    """Run `run` to its end: its status, reason and findings are set on it (and saved as they change)."""
    from gpuvs.environments.pod import parse_options
    from gpuvs.fleet.cluster import sweep as fleet_kube
    from gpuvs.fleet.execute import fleet_run
    from gpuvs.fleet.execute.node_choice import NodeChoice
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
        gpu_nodes = has_gpus(found, c.gpu_resource)
        image = ctx.image()
        # the fleet's own rule, on the pods the fleets will start, chosen once: they run on these nodes as chosen
        pod = parse_options(pod_options(c, image, cluster.namespace))
        chosen, excluded = fleet_run.choose(found, fleet_run.FleetOptions(all_nodes=not gpu_nodes), pod)
        run.skipped = {e.node: e.reason for e in excluded}
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
            _validate(ctx, run, cluster.namespace, image, free[0], core=cluster.core)
            save(run)
        if len(free) < 2:
            state.not_renewed()
            run.status = "failed"
            run.reason = (f"a fleet needs at least 2 nodes free to test, found {len(free)}"
                          + (f" ({'; '.join(f'{k}: {v}' for k, v in sorted(run.skipped.items()))})"
                             if run.skipped else ""))
            return
        state.workloads_now = {w.name for w in c.workloads_for(gpu_nodes)}  # the status page counts these only
        held = set(free)
        choice = NodeChoice(found, [n for n in chosen if n.name in held])
        for w in c.workloads_for(gpu_nodes):
            run.fleets.append(_fleet(ctx, run, cluster.namespace, image, choice, w))
            save(run)
        run.status, run.reason = run_status(run.fleets)
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


def run_status(fleets: list[FleetOutcome]) -> tuple[str, str]:
    """A run's status and reason from its fleets: failed where one gave no result, no-verdict where one's result
    judged no node (every trial failed: GPU not visible, ...), else ok. Only ok is a success."""
    failed = [f for f in fleets if f.status == "failed"]
    bad = failed or [f for f in fleets if f.status != "ok"]
    status = "failed" if failed else NO_VERDICT if bad else "ok"
    return status, "; ".join(f"{f.workload}: {f.error}" for f in bad)


def no_verdict(rows: list[Any]) -> str:
    """Why a fleet's rows judge no node ("" when one was judged): no node measured against its peers."""
    if any(r.verdict not in ("reference", "excluded", "failed") for r in rows):
        return ""
    failed = [r for r in rows if r.verdict == "failed"]
    why = "; ".join(f"{r.node}: {_last_line(r.reason) or 'failed'}" for r in failed[:3])
    return (f"no verdict: {len(failed)} of {len(rows)} node(s) failed every trial" + (f" ({why})" if why else "")
            if failed else f"no verdict: fewer than 2 of {len(rows)} node(s) measured")


def validate_in_child(emit: Emit, settings: dict[str, Any], store: str, **kw: Any) -> Any:
    """In the child: run_validate, its experiment id emitted as soon as it exists."""
    from gpuvs.validate.validate_run import ValidateHooks, run_validate
    from gpuvs.validate.validate_run import settings as checked

    return run_validate(checked(**settings), store, hooks=ValidateHooks(on_start=lambda s: emit(s.experiment_id)),
                        **kw)


def fleet_in_child(emit: Emit, base: RunSpec, store: str, options: Any, choice: Any = None) -> FleetResult:
    """In the child: run_fleet, on the nodes the agent chose (`choice`)."""
    from gpuvs.fleet.execute.fleet_run import run_fleet

    return run_fleet(base, store, options, choice=choice)


def pair_fleet_in_child(emit: Emit, base: RunSpec, store: str, options: Any, plan: Any, choice: Any = None) -> Any:
    """In the child: run_pair_fleet (`gpuvs fleet collective --pairs`), its PairFleetResult."""
    from gpuvs.fleet.execute.pair_run import run_pair_fleet

    return run_pair_fleet(base, store, options, plan, choice=choice)


def _validate(ctx: Context, run: RunRecord, namespace: str, image: str, node: str, core: Any = None) -> None:
    c = ctx.config
    settings = dict(image=image, pull=c.pull_policy, resource=c.gpu_resource, node=node,
                    pod_security=c.pod_security)  # the rest: the defaults
    out = _call(ctx, validate_in_child, dict(settings=settings, store=c.store, kubeconfig=c.kubeconfig,
                                             context=c.context, namespace=namespace, priority_class=c.priority_class,
                                             name=f"agent {run.id} validate"))
    # the id as soon as the run had one: a run stopped halfway has its rows so far in the store
    run.validate = out.value.experiment_id if out.value is not None else (out.events[0] if out.events else None)
    if run.validate:
        from gpuvs.store.db import Store

        with Store(c.store) as st:
            rows = st.experiment(run.validate).meta.checks or []
        run.checks = {f"{r['suite']}: {r['check']}": r["status"] for r in rows}
        ctx.state.validate(run.checks, time.time())
    code = out.exit_code or (1 if out.value is not None and out.value.failed else 0)
    failed = out.value.failed if out.value is not None else []
    why = out.error or (f"{len(failed)} check(s) failed, first: {failed[0].check}: {failed[0].detail}" if failed
                        else "")
    log(f"run {run.id}: validate on {node} exited {code}" + (f": {_last_line(why)}" if code else ""))
    if c.condition and failed and core is not None:
        from gpuvs.fleet.cluster import signals

        sig = signals.validate_failed(core, node, failed[0].check, failed[0].detail)
        log(f"run {run.id}: event {sig.detail} on {node}: {sig.status}")


def pod_options(c: AgentConfig, image: str, namespace: str | None) -> dict[str, Any]:
    """The pod options of every fleet the agent runs (its config's; a workload's own come on top): the nodes are
    chosen for these pods, and the fleets start them."""
    return {"image": image, "image_pull_policy": c.pull_policy, "priority_class": c.priority_class,
            "pod_security": c.pod_security, "package": c.package, "python": c.python, "gpu_resource": c.gpu_resource,
            "namespace": namespace, "kubeconfig": c.kubeconfig, "context": c.context}


def fleet_request(c: AgentConfig, run: RunRecord, namespace: str, image: str, nodes: list[str], w: WorkloadSpec
                  ) -> tuple[RunSpec, Any]:
    """The fleet of workload `w` on `nodes`, as the library takes it: (the base spec, FleetOptions). w's options
    are `gpuvs fleet`'s without their dashes: fleet options, trials, order_seed, device, num_gpus, timeout,
    telemetry_interval, pod options, the workload's parameters; others are the agent's own (one line if given)."""
    from gpuvs import environments, workloads
    from gpuvs.fleet.execute import pair_plan as pairs
    from gpuvs.fleet.execute import fleet_run
    from gpuvs.trial.overrides import SPEC_PARAMS, spec_field

    workload = workloads.get(w.name)
    plan = w.pair_plan()  # a pair fleet: no --condition, --taint or --max-trials (pair_run.check)
    own = {k.replace("-", "_") for k, _ in w.options}
    max_trials = c.max_trials if plan is None else None
    condition, taint = c.condition and plan is None, c.taint and plan is None
    pair_keys = {p.name for p in pairs.PARAMS}
    given: list[tuple[str, Any]] = [  # what the agent sets, then the workload's own options, as gpuvs fleet's
        ("image", image), ("image_pull_policy", c.pull_policy), ("nodes", ",".join(nodes)), ("label", True),
        ("priority_class", c.priority_class), ("pod_security", c.pod_security), ("package", c.package),
        ("python", c.python), ("gpu_resource", c.gpu_resource), ("margin", str(c.margin)), ("parallel", c.parallel),
        ("store", c.store), ("name", f"agent {run.id} {w}"), ("namespace", namespace), ("kubeconfig", c.kubeconfig),
        ("context", c.context), ("device", None if "device" in own else c.device),
        ("trials", None if "trials" in own else c.trials),
        ("max_trials", None if "max_trials" in own else max_trials), ("condition", condition), ("taint", taint),
        *([("taint_effect", c.taint_effect), ("taint_max_share", f"{c.taint_max_share:g}")] if taint else []),
        *[(k, v) for k, v in w.options if k.replace("-", "_") not in pair_keys],
        *([("pairs", True), ("partners", plan.partners), ("second_pass", plan.second)] if plan else [])]
    values: dict[str, Any] = dict(nodes=list(nodes), label=True, margin=c.margin, parallel=c.parallel,
                                  trials=c.trials, max_trials=max_trials, name=f"agent {run.id} {w}", timeout=3600.0,
                                  condition=condition, taint=taint, taint_effect=c.taint_effect,
                                  taint_max_share=c.taint_max_share,
                                  command=fleet_run.recorded_command([w.name, *fleet_run.option_words(given)]))
    kind = fleet_run.node_kinds()[0]  # the kind that places a worker on a named node (the pod), as gpuvs fleet's
    env: dict[str, Any] = {"env": kind, **pod_options(c, image, namespace)}
    spec: dict[str, Any] = {"device": c.device, "num_gpus": 1, "timeout_s": 3600.0, "telemetry_interval_s": 0.1}
    params: dict[str, Any] = {}
    fleet_keys = {p.name for p in fleet_run.PARAMS if p.name not in AGENT_OWN} | set(fleet_run.RUN_KEYS)
    multiple = {p.name for p in fleet_run.PARAMS if p.multiple}
    pod = {p.name: p for p in environments.kind(kind).params}
    names = {p.name for p in workload.params}
    for key, value in w.options:
        k = key.replace("-", "_")
        if k in pair_keys:
            continue  # the plan's (w.pair_plan)
        if k in fleet_keys:  # checked with the agent's own values by FleetOptions.from_values
            values[k] = [*(values.get(k) or []), value] if k in multiple else value
        elif spec_key := spec_field(k):
            spec[spec_key] = SPEC_PARAMS[spec_key].coerce(value)
        elif k in pod:
            env[k] = env.get(k, []) + [value] if pod[k].multiple else value
        elif k in names:
            params[k] = value
        else:
            raise UsageError(f"--workload {w}: {key} is not an option of gpuvs fleet {w.name} that the agent passes "
                             f"on (fleet, run and pod options and {w.name}'s parameters; the agent sets the rest)")
    values["timeout"] = spec["timeout_s"]
    o = fleet_run.FleetOptions.from_values(values)
    base = RunSpec(workload=w.name, params=workload.validate(params, spec["device"]), device=spec["device"],
                   num_gpus=spec["num_gpus"], env=environments.env_spec(env), timeout_s=spec["timeout_s"],
                   telemetry_interval_s=spec["telemetry_interval_s"], fresh=spec.get("fresh", "auto"))
    return base, o


def _fleet(ctx: Context, run: RunRecord, namespace: str, image: str, choice: Any, w: WorkloadSpec
           ) -> FleetOutcome:
    """Workload `w`'s fleet on the nodes chosen and held (choice: a NodeChoice), in a child."""
    c = ctx.config
    outcome = FleetOutcome(w.name)
    nodes = [n.name for n in choice.chosen]
    try:
        base, options = fleet_request(c, run, namespace, image, nodes, w)
    except UsageError as exc:
        out = Outcome(error=str(exc), exit_code=exc.exit_code)
    else:
        plan = w.pair_plan()
        if plan is not None:
            return _pair_fleet(ctx, run, outcome, nodes, w, _call(ctx, pair_fleet_in_child, dict(
                base=base, store=c.store, options=options, plan=plan, choice=choice)))
        out = _call(ctx, fleet_in_child, dict(base=base, store=c.store, options=options, choice=choice))
    result: FleetResult | None = out.value
    if result is not None:
        outcome.experiment = result.id
        ctx.state.fleet(result, w.name, time.time())
        for sig in result.signals:
            if sig.status not in ("written", "created", "tainted", "untainted", "kept (already tainted)"):
                log(f"run {run.id}: {sig.what} {sig.detail} on {sig.node}: {sig.status}")
        if c.taint:
            ctx.state.circuit(w.name, result.circuit_open)
        _failed_trials(c.store, result.id, outcome)
    else:
        ctx.state.not_renewed(w.name)
    failed = [r for r in result.rows if r.verdict == "failed"] if result is not None else []
    code = out.exit_code or (1 if failed else 0)
    why = out.error or ("; ".join(f"{r.node}: {r.reason}" for r in failed) if failed else "")
    if result is None:
        outcome.status, outcome.error = "failed", _last_line(why) or f"gpuvs fleet exited {code}"
    elif no_verdict(result.rows):
        outcome.status, outcome.error = NO_VERDICT, no_verdict(result.rows)
    log(f"run {run.id}: fleet {w} on {len(nodes)} node(s) exited {code}"
        + (f": {_last_line(why)}" if code else "")
        + ("; " + ", ".join(f"{r.node} {r.verdict} {r.speed:.3f}" for r in result.measured() if r.speed is not None)
           if result else ""))
    return outcome


def _failed_trials(store: str, experiment: str, outcome: FleetOutcome) -> None:
    """The experiment's trials that did not end ok, counted by reason (preempted, crash, ...)."""
    from gpuvs.store.db import Store

    with Store(store) as st:
        for t in st.trials(experiment):
            if t.status != "ok":
                reason = t.error_kind or t.status
                outcome.failed_trials[reason] = outcome.failed_trials.get(reason, 0) + 1


def _pair_fleet(ctx: Context, run: RunRecord, outcome: FleetOutcome, nodes: list[str], w: WorkloadSpec,
                out: Outcome) -> FleetOutcome:
    """A pair fleet's end (pairs=true): its verdicts into the state (gpuvs_node_link_*, gpuvs_link_*), its labels
    written by the run itself (gpuvs.io/links, as `gpuvs fleet --pairs --label`), its failed trials counted. A
    pair with no figure is in the log, as a node that ran no trial is; the run fails only where no result came."""
    c = ctx.config
    result = out.value
    if c.condition or c.taint:
        log(f"run {run.id}: fleet {w}: --condition and --taint apply to node fleets, not to pairs (gpuvs.io/links "
            "is written)")
    if result is not None:
        outcome.experiment = result.id
        ctx.state.pair_fleet(result, w.name, time.time())
        _failed_trials(c.store, result.id, outcome)
        if not any(v.speed is not None for v in result.outcome.nodes):
            outcome.status = NO_VERDICT
            outcome.error = f"no verdict: no node's links judged ({len(result.failed)} pair(s) gave no figure)"
        for lab in result.labels:
            if lab["status"] != "written":
                log(f"run {run.id}: labels {lab['labels']} on {lab['node']}: {lab['status']}")
    else:
        ctx.state.not_renewed(w.name)
        outcome.status = "failed"
        outcome.error = _last_line(out.error or "") or f"gpuvs fleet --pairs exited {out.exit_code}"
    code = out.exit_code or (1 if result is not None and result.failed else 0)
    why = out.error or ("; ".join(f"{k}: {v}" for k, v in sorted(result.failed.items())) if result else "")
    log(f"run {run.id}: pair fleet {w} on {len(nodes)} node(s) exited {code}"
        + (f": {_last_line(why)}" if code else "")
        + (f"; {result.outcome.summary()}" if result is not None else ""))
    return outcome
