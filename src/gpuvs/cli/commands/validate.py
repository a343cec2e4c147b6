"""gpuvs validate --image IMAGE [--kubeconfig F] [--context C] [--namespace N] [--node NAME] [--exclusive]
[--max-gpu-pods N] [--pod-security baseline|restricted] [--job-workload NAME --job-param KEY=VALUE] [--disruptive --restart-plugin-cmd CMD --restart-kubelet-cmd CMD --stop-apiserver-cmd CMD --start-apiserver-cmd CMD]:
the cluster test suite, stored as an experiment (kind `validate`) and reported like any other."""

from __future__ import annotations

import sys
import time
import uuid

from gpuvs.cli.command import Args, Command, Group
from gpuvs.errors import RunFailed, UsageError
from gpuvs.store.records import ExperimentMeta
from gpuvs.params import Param
from gpuvs.report import validation
from gpuvs.safetext import safe_text
from gpuvs.store.db import Store

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
    if kw["max_gpu_pods"] < 1:
        raise UsageError(f"--max-gpu-pods {kw['max_gpu_pods']}: must be 1 or more")
    from gpuvs import workloads
    from gpuvs.spec import parse_kv
    from gpuvs.validate.service import job_device, long_run

    try:
        w = workloads.get(kw["job_workload"])  # an unknown name: one line with the known ones
        kw["job_params"] = parse_kv(kw["job_params"])
        w.validate({w.window_param: long_run(w), **kw["job_params"]}, job_device(kw["job_workload"]))
    except UsageError as exc:
        raise UsageError(f"--job-workload {kw['job_workload']} / --job-param: {exc}") from None
    return Settings(**kw)


VALIDATE_OPTIONS = (
    Param("image", str, None, "image of the probe pods (needs /bin/sh; nvidia-smi is used where it has it)",
          required=True),
    Param("kubeconfig", str, None, "default: KUBECONFIG, ~/.kube/config or the in-cluster service account"),
    Param("context", str, None, "kubeconfig context"),
    Param("namespace", str, None, "default: the context's, else default"),
    Param("image_pull_policy", str, "IfNotPresent", "Always, IfNotPresent or Never"),
    Param("resource", str, "nvidia.com/gpu", "the GPU resource name"),
    Param("node", str, None, "run the pods on this node (needed by --disruptive)"),
    Param("timeout", float, 120.0, "seconds each check may take"),
    Param("disruptive", bool, False, "also the availability suite: restarts cluster parts through the commands below"),
    Param("restart_plugin_cmd", str, None, "restarts the node's device plugin"),
    Param("restart_kubelet_cmd", str, None, "restarts the node's kubelet"),
    Param("stop_apiserver_cmd", str, None, "stops the API server (with --start-apiserver-cmd)"),
    Param("start_apiserver_cmd", str, None, "starts the API server again"),
    Param("apiserver_outage", float, 10.0, "seconds the API server stays down"),
    Param("command_timeout", float, 120.0, "seconds each command may take"),
    Param("exclusive", bool, False, "GPUs must not be shared: a node that advertises more GPUs than it has (replicas) "
          "fails instead of being reported as shared"),
    Param("max_gpu_pods", int, 8, "the most one-GPU pods run at once on a node"),
    Param("job_workload", str, "spin", "what the GPU job beside the CPU service runs (a gpuvs workload; e.g. gemm "
          "with torch in the image)"),
    Param("job_param", str, None, "KEY=VALUE for the job's workload (repeat)", multiple=True),
    Param("priority_class", str, None, "priorityClassName of the probe pods (gpuvs agent: gpuvs-trial, which any "
          "real job preempts)"),
    Param("pod_security", str, "baseline", "the pods' security context: baseline (the image's own user; no privilege "
          "escalation, every capability dropped, RuntimeDefault seccomp) or restricted (also runAsNonRoot: the "
          "restricted Pod Security Standard; the image's user must be a non-root uid)",
          choices=("baseline", "restricted")),
    Param("store", str, "gpuvs.db", "SQLite file that keeps the results"),
    Param("name", str, None, "a name for this run in the store"),
)


def validate(args: Args) -> None:
    image, kubeconfig, context, namespace = args["image"], args["kubeconfig"], args["context"], args["namespace"]
    pull, resource, node, timeout = args["image_pull_policy"], args["resource"], args["node"], args["timeout"]
    disruptive, outage_s, command_timeout = args["disruptive"], args["apiserver_outage"], args["command_timeout"]
    restart_plugin_cmd, restart_kubelet_cmd = args["restart_plugin_cmd"], args["restart_kubelet_cmd"]
    stop_apiserver_cmd, start_apiserver_cmd = args["stop_apiserver_cmd"], args["start_apiserver_cmd"]
    exclusive, max_gpu_pods = args["exclusive"], args["max_gpu_pods"]
    job_workload, job_params = args["job_workload"], args["job_param"]
    store, name = args["store"], args["name"]
    from gpuvs.kube.client import check_namespace, connect, node_info
    from gpuvs.validate import availability, functional
    from gpuvs.validate.probe import Pods
    from gpuvs.validate.suite import Suite

    s = _settings(image=image, pull=pull, resource=resource, node=node, timeout=timeout, disruptive=disruptive,
                  restart_plugin_cmd=restart_plugin_cmd, restart_kubelet_cmd=restart_kubelet_cmd,
                  stop_apiserver_cmd=stop_apiserver_cmd, start_apiserver_cmd=start_apiserver_cmd, outage_s=outage_s,
                  command_timeout=command_timeout, exclusive=exclusive, max_gpu_pods=max_gpu_pods,
                  job_workload=job_workload, job_params=job_params or [], pod_security=args["pod_security"])
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
        mark = {"pass": "ok  ", "FAIL": "FAIL", "not run": "--  ", "shared": "SHRD"}.get(row.status, row.status)
        print(f"  {mark} {row.suite}: {row.check}: {safe_text(row.detail)}", file=sys.stderr, flush=True)

    pods = Pods(cluster, run, image, pull, resource, deadline_s=int(max(600, timeout * 20)),
                priority_class=args["priority_class"], pod_security=s.pod_security)
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


COMMAND = Command(
    "validate", "Validate a GPU cluster: GPU nodes, a GPU pod's life, the GPU inside, several GPU pods at once and "
    "what they share, over-requests, CPU pods, a CPU service beside a GPU job; with --disruptive, what a running GPU job and the node's GPUs do through plugin, kubelet and API-server failures.",
    validate,
    groups=(Group("validate options", VALIDATE_OPTIONS, "validate"),),
)
