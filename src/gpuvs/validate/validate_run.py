"""A validate run as one library call, what `gpuvs validate` and the agent call.

The settings checked, the cluster reached, the suites run, every row stored as it is known (kind `validate`).
Everything started is deleted whatever happens; the rows are returned as a ValidateResult.
What happens on the way is told through ValidateHooks; nothing here prints."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from gpuvs.errors import UsageError
from gpuvs.store.db import Store
from gpuvs.store.ids import new_id
from gpuvs.store.records import ExperimentMeta, ExperimentRecord
from gpuvs.validate.suite import FAIL, PASS, Row, Settings

KIND = "validate"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
COMMANDS = ("restart_plugin_cmd", "restart_kubelet_cmd", "stop_apiserver_cmd", "start_apiserver_cmd")


def settings(**kw: Any) -> Settings:
    """Settings from `gpuvs validate`'s values (Settings' fields, job_params as KEY=VALUE texts; those left out
    take Settings' defaults), checked against each other: one line on what is wrong, named by the option."""
    kw = {**{f.name: f.default for f in fields(Settings) if f.default is not MISSING}, "job_params": [], **kw}
    given = [c for c in COMMANDS if kw.get(c)]
    if kw["pull"] not in PULL_POLICIES:
        raise UsageError(f"--image-pull-policy {kw['pull']!r}: allowed {', '.join(PULL_POLICIES)}")
    if given and not kw["disruptive"]:
        raise UsageError(f"--{given[0].replace('_', '-')} restarts a cluster part: add --disruptive (and --node)")
    if kw["disruptive"] and not kw["node"]:
        raise UsageError("--disruptive needs --node NAME: the node whose device plugin and kubelet are restarted")
    if kw["disruptive"] and not given:
        raise UsageError("--disruptive needs at least one of --restart-plugin-cmd, --restart-kubelet-cmd, "
                         "--stop-apiserver-cmd with --start-apiserver-cmd")
    if bool(kw["stop_apiserver_cmd"]) != bool(kw["start_apiserver_cmd"]):
        raise UsageError("--stop-apiserver-cmd and --start-apiserver-cmd go together (gpuvs starts what it stopped)")
    for c in given:
        try:
            if not shlex.split(kw[c]):
                raise ValueError("empty")
        except ValueError as exc:
            raise UsageError(f"--{c.replace('_', '-')} {kw[c]!r}: not a command line ({exc})") from None
    if kw["timeout"] <= 0 or kw["command_timeout"] <= 0 or kw["outage_s"] < 0:
        raise UsageError("--timeout and --command-timeout must be above 0, --apiserver-outage 0 or more (seconds)")
    if kw["max_gpu_pods"] < 1:
        raise UsageError(f"--max-gpu-pods {kw['max_gpu_pods']}: must be 1 or more")
    from gpuvs import workloads
    from gpuvs.spec import parse_kv
    from gpuvs.validate.cpu_service import job_device, long_run

    try:
        w = workloads.get(kw["job_workload"])  # an unknown name: one line with the known ones
        kw["job_params"] = parse_kv(kw["job_params"])
        w.validate({w.window_param: long_run(w), **kw["job_params"]}, job_device(kw["job_workload"]))
    except UsageError as exc:
        raise UsageError(f"--job-workload {kw['job_workload']} / --job-param: {exc}") from None
    return Settings(**kw)


@dataclass
class ValidateStart:
    """The run has begun: its experiment in the store, and the cluster it reached."""

    experiment_id: str
    host: str
    source: str
    namespace: str


@dataclass
class ValidateResult:
    """What a validate run found: one row per check (the clean-up row last), as stored with the experiment."""

    experiment_id: str
    host: str
    source: str
    namespace: str
    rows: list[Row] = field(default_factory=list)
    stored: ExperimentRecord | None = None  # the experiment as read back from the store (its report's source)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == FAIL]


@dataclass
class ValidateHooks:
    """What a caller hears while the suite runs; every one optional."""

    on_start: Callable[[ValidateStart], None] | None = None
    on_row: Callable[[Row], None] | None = None


def run_validate(s: Settings, store: str | Path, *, kubeconfig: str | None = None, context: str | None = None,
                 namespace: str | None = None, priority_class: str | None = None, name: str | None = None,
                 hooks: ValidateHooks | None = None) -> ValidateResult:
    """Run the suite with settings `s` (see settings()) against the cluster of kubeconfig/context, in `namespace`.
    A failed check is a row, not an exception; a cluster, namespace, node or store that cannot be used is a
    GpuvsError before anything starts; an interruption stops the run with its rows kept and its pods deleted."""
    from gpuvs.kube.client import check_namespace, connect, node_info
    from gpuvs.validate import availability, functional
    from gpuvs.validate.probe import Pods
    from gpuvs.validate.suite import Suite

    hooks = hooks or ValidateHooks()
    cluster = connect(kubeconfig, context, namespace)
    check_namespace(cluster)
    if s.node:
        node_info(cluster, s.node)
    st = Store(store)  # a store that cannot be written says so before anything starts
    run = uuid.uuid4().hex[:8]
    exp_id = new_id(run[:6])  # its pods' names carry the run's token
    meta = ExperimentMeta(host=cluster.host, source=cluster.source, namespace=cluster.namespace, settings=s.__dict__,
                          checks=[], finished=False)
    label = name or f"validate {cluster.host}"

    def record(row: Row) -> None:
        meta.checks.append(row.to_dict())
        st.set_meta(exp_id, meta)
        if hooks.on_row:
            hooks.on_row(row)

    pods = Pods(cluster, run, s.image, s.pull, s.resource, deadline_s=int(max(600, s.timeout * 20)),
                priority_class=priority_class, pod_security=s.pod_security)
    suite = Suite(cluster, s, pods, record)
    with st:
        st.create_experiment(exp_id, label, KIND, meta)
        if hooks.on_start:
            hooks.on_start(ValidateStart(exp_id, cluster.host, cluster.source, cluster.namespace))
        try:
            functional.run(suite)
            if s.disruptive:
                availability.run(suite)
            meta.finished = True
        except KeyboardInterrupt as exc:
            meta.stopped = str(exc) or "interrupted"
            raise
        finally:
            problems = suite.clean_up()
            suite.add(_cleanup_row(problems))
        stored = st.experiment(exp_id)  # read back: what is reported is what the store holds
    return ValidateResult(exp_id, cluster.host, cluster.source, cluster.namespace, list(suite.rows), stored)


def _cleanup_row(problems: list[str]) -> Row:
    return Row("clean-up", "nothing left behind", FAIL if problems else PASS,
               "; ".join(problems) if problems else "no pod of this run is left; every restore command ran")
