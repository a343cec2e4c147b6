"""gpuvs validate --image IMAGE [--kubeconfig F] [--context C] [--namespace N] [--node NAME]
[--disruptive --restart-plugin-cmd CMD --restart-kubelet-cmd CMD --stop-apiserver-cmd CMD --start-apiserver-cmd CMD]:
the cluster test suite, stored as an experiment (kind `validate`) and reported like any other."""

from __future__ import annotations

import sys
import time
import uuid
from typing import Optional

import typer

from gpuvs.cli import app
from gpuvs.errors import RunFailed, UsageError
from gpuvs.records import ExperimentMeta
from gpuvs.report import validation
from gpuvs.store import Store

PULL_POLICIES = ("Always", "IfNotPresent", "Never")


def _settings(**kw):
    from gpuvs.validate.suite import Settings

    commands = ("restart_plugin_cmd", "restart_kubelet_cmd", "stop_apiserver_cmd", "start_apiserver_cmd")
    given = [c for c in commands if kw[c]]
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
    import shlex

    for c in given:
        try:
            if not shlex.split(kw[c]):
                raise ValueError("empty")
        except ValueError as exc:
            raise UsageError(f"--{c.replace('_', '-')} {kw[c]!r}: not a command line ({exc})") from None
    if kw["timeout"] <= 0 or kw["command_timeout"] <= 0 or kw["outage_s"] < 0:
        raise UsageError("--timeout and --command-timeout must be above 0, --apiserver-outage 0 or more (seconds)")
    return Settings(**kw)


@app.command()
def validate(image: str = typer.Option(..., "--image", help="image of the probe pods (needs /bin/sh; nvidia-smi "
                                                            "is used where it has it)"),
             kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", help="default: KUBECONFIG, ~/.kube/config "
                                                      "or the in-cluster service account"),
             context: Optional[str] = typer.Option(None, "--context"),
             namespace: Optional[str] = typer.Option(None, "--namespace", help="default: the context's, else default"),
             pull: str = typer.Option("IfNotPresent", "--image-pull-policy", help="Always, IfNotPresent or Never"),
             resource: str = typer.Option("nvidia.com/gpu", "--resource", help="the GPU resource name"),
             node: Optional[str] = typer.Option(None, "--node", help="run the pods on this node (needed by "
                                                "--disruptive)"),
             timeout: float = typer.Option(120.0, "--timeout", help="seconds each check may take"),
             disruptive: bool = typer.Option(False, "--disruptive", help="also the availability suite: restarts "
                                             "cluster parts through the commands below"),
             restart_plugin_cmd: Optional[str] = typer.Option(None, "--restart-plugin-cmd",
                                                              help="restarts the node's device plugin"),
             restart_kubelet_cmd: Optional[str] = typer.Option(None, "--restart-kubelet-cmd",
                                                               help="restarts the node's kubelet"),
             stop_apiserver_cmd: Optional[str] = typer.Option(None, "--stop-apiserver-cmd"),
             start_apiserver_cmd: Optional[str] = typer.Option(None, "--start-apiserver-cmd"),
             outage_s: float = typer.Option(10.0, "--apiserver-outage", help="seconds the API server stays down"),
             command_timeout: float = typer.Option(120.0, "--command-timeout", help="seconds each command may take"),
             store: str = typer.Option("gpuvs.db", "--store", help="SQLite file that keeps the results"),
             name: Optional[str] = typer.Option(None, "--name", help="a name for this run in the store")) -> None:
    """Validate a GPU cluster: GPU nodes, a GPU pod's life, the GPU inside, over-requests, CPU pods; with
    --disruptive, what a running GPU job and the node's GPUs do through plugin, kubelet and API-server failures."""
    from gpuvs.kube.client import check_namespace, connect, node_info
    from gpuvs.validate import availability, functional
    from gpuvs.validate.probe import Pods
    from gpuvs.validate.suite import Suite

    s = _settings(image=image, pull=pull, resource=resource, node=node, timeout=timeout, disruptive=disruptive,
                  restart_plugin_cmd=restart_plugin_cmd, restart_kubelet_cmd=restart_kubelet_cmd,
                  stop_apiserver_cmd=stop_apiserver_cmd, start_apiserver_cmd=start_apiserver_cmd, outage_s=outage_s,
                  command_timeout=command_timeout)
    cluster = connect(kubeconfig, context, namespace)
    check_namespace(cluster)
    if node:
        node_info(cluster, node)
    st = Store(store)  # a store that cannot be written says so before anything starts
    run = uuid.uuid4().hex[:8]
    exp_id = time.strftime("%Y%m%d-%H%M%S-") + run[:6]
    meta = ExperimentMeta(host=cluster.host, source=cluster.source, namespace=cluster.namespace, settings=s.__dict__,
                          checks=[], finished=False)
    label = name or f"validate {cluster.host}"

    def record(row) -> None:
        meta.checks.append(row.to_dict())
        st.set_meta(exp_id, meta)
        mark = {"pass": "ok  ", "FAIL": "FAIL", "not run": "--  "}.get(row.status, row.status)
        print(f"  {mark} {row.suite}: {row.check}: {row.detail}", file=sys.stderr, flush=True)

    pods = Pods(cluster, run, image, pull, resource, deadline_s=int(max(600, timeout * 20)))
    suite = Suite(cluster, s, pods, record)
    with st:
        st.create_experiment(exp_id, label, validation.KIND, meta)
        print(f"gpuvs validate: {cluster.host} ({cluster.source}), namespace {cluster.namespace}, "
              f"experiment {exp_id}", file=sys.stderr)
        try:
            functional.run(suite)
            if disruptive:
                availability.run(suite)
            meta.finished = True
        except KeyboardInterrupt as exc:
            meta.stopped = str(exc) or "interrupted"
            raise
        finally:
            problems = suite.clean_up()
            suite.add(_cleanup_row(problems))
        sys.stdout.write(validation.terminal(st.experiment(exp_id)))
    failed = [r for r in suite.rows if r.status == "FAIL"]
    if failed:
        raise RunFailed(f"{len(failed)} check(s) failed, first: {failed[0].check}: {failed[0].detail} "
                        f"(stored as experiment {exp_id} in {store})")


def _cleanup_row(problems: list[str]):
    from gpuvs.validate.suite import FAIL, PASS, Row

    return Row("clean-up", "nothing left behind", FAIL if problems else PASS,
               "; ".join(problems) if problems else "no pod of this run is left; every restore command ran")
