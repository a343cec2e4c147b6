"""gpuvs validate --image IMAGE [cluster options]: the cluster test suite, stored as an experiment of kind `validate`.

It is reported like any other experiment. --disruptive adds the availability suite, with the user's restart commands.
The options are in the command's help and in docs/kubernetes.md."""

from __future__ import annotations

import sys

from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.errors import RunFailed
from gpuvs.params import Param
from gpuvs.report import validation

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
    Param("pod_security", str, "restricted", "the pods' security context: restricted (the restricted Pod Security "
          "Standard: runAsNonRoot, no privilege escalation, every capability dropped, RuntimeDefault seccomp; the "
          "image's user must be a non-root uid) or baseline (the same but as the image's own user, root included)",
          choices=("baseline", "restricted")),
    Param("store", str, "gpuvs.db", "SQLite file that keeps the results"),
    Param("name", str, None, "a name for this run in the store"),
)


def validate(args: Args) -> None:
    from gpuvs.validate.validate_run import ValidateHooks, run_validate, settings

    s = settings(image=args["image"], pull=args["image_pull_policy"], resource=args["resource"], node=args["node"],
                 timeout=args["timeout"], disruptive=args["disruptive"],
                 restart_plugin_cmd=args["restart_plugin_cmd"], restart_kubelet_cmd=args["restart_kubelet_cmd"],
                 stop_apiserver_cmd=args["stop_apiserver_cmd"], start_apiserver_cmd=args["start_apiserver_cmd"],
                 outage_s=args["apiserver_outage"], command_timeout=args["command_timeout"],
                 exclusive=args["exclusive"], max_gpu_pods=args["max_gpu_pods"], job_workload=args["job_workload"],
                 job_params=args["job_param"] or [], pod_security=args["pod_security"])

    def on_start(start) -> None:
        print(f"gpuvs validate: {start.host} ({start.source}), namespace {start.namespace}, "
              f"experiment {start.experiment_id}", file=sys.stderr)

    def on_row(row) -> None:
        print(validation.row_line(row), file=sys.stderr, flush=True)

    store = args["store"]
    result = run_validate(s, store, kubeconfig=args["kubeconfig"], context=args["context"],
                          namespace=args["namespace"], priority_class=args["priority_class"], name=args["name"],
                          hooks=ValidateHooks(on_start, on_row))
    sys.stdout.write(validation.terminal(result.stored))
    failed = result.failed
    if failed:
        raise RunFailed(f"{len(failed)} check(s) failed, first: {failed[0].check}: {failed[0].detail} "
                        f"(stored as experiment {result.experiment_id} in {store})")


COMMAND = Command(
    "validate", "Validate a GPU cluster: GPU nodes, a GPU pod's life, the GPU inside, several GPU pods at once and "
    "what they share, over-requests, CPU pods, a CPU service beside a GPU job; with --disruptive, what a running GPU job and the node's GPUs do through plugin, kubelet and API-server failures.",
    validate,
    groups=(Group("validate options", VALIDATE_OPTIONS, "validate"),),
)
