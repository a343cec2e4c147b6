"""gpuvs agent: gpuvs inside the cluster, one replica (deploy/, docs/deploy.md), on a schedule and on demand.

It runs validate and a fleet per workload on the nodes nobody else has requested, labels them and serves /metrics.
Exit status: 0 when stopped by SIGTERM or Ctrl-C (after cleaning up the run in flight), 2 on bad input."""

from __future__ import annotations

from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.params import Param

AGENT_OPTIONS = (
    Param("every", str, "6h", "how often a run starts (90s, 15m, 6h, 1d)"),
    Param("first_after", str, "5m", "when the first scheduled run starts after the agent does (0: at once)"),
    Param("workload", str, None, "a workload to run as a fleet, NAME[:KEY=VALUE,...] with fleet options as KEY "
          "(e.g. spin:steps=10,ops=3000000; collective:pairs=true for the pair fleet, which node or link is slow; "
          "may be repeated; default: gpu-check on the GPU where the nodes advertise GPUs, spin on the CPU where none "
          "do)", multiple=True),
    Param("device", str, "cpu", "the workloads' device unless a --workload names its own (cpu, cuda)"),
    Param("validate", bool, True, "run the functional validate suite on a free node in each run "
          "(--validate false: fleets only)"),
    Param("listen", str, ":8080", "HOST:PORT of the HTTP server (/metrics, /healthz, /readyz, /runs)"),
    Param("store", str, "gpuvs.db", "SQLite file that keeps every result (on a PersistentVolume in the cluster)"),
    Param("token_file", str, None, "file holding the bearer token POST /runs needs, read at each POST (in the "
          "cluster: the Secret gpuvs-agent-token; none or empty: POST /runs is refused)"),
    Param("min_interval", str, "2m", "a run asked for with POST /runs starts at least this long after the last run "
          "ended, whoever asks (at least 10s)"),
    Param("http_timeout", float, 10.0, "seconds one HTTP connection may take from accept to close (a request not "
          "sent whole by then is dropped)", min=1.0, max=300.0),
)
CLUSTER_OPTIONS = (
    Param("image", str, None, "image of the trial and probe pods (default: the agent's own image, read from its pod)"),
    Param("image_pull_policy", str, "IfNotPresent", "imagePullPolicy of those pods",
          choices=("Always", "IfNotPresent", "Never")),
    Param("kubeconfig", str, None, "default: KUBECONFIG, ~/.kube/config or the in-cluster service account"),
    Param("context", str, None, "kubeconfig context"),
    Param("namespace", str, None, "where the pods run (default: the agent's own, else the context's)"),
    Param("gpu_resource", str, "nvidia.com/gpu", "the GPU resource name"),
    Param("priority_class", str, "gpuvs-trial", "priorityClassName of every pod the agent starts (real jobs "
          "preempt them; deploy/priorityclass.yaml)"),
    Param("pod_security", str, "restricted", "the trial, hold and probe pods' security context: restricted (the "
          "agent's own image runs as uid 10001) or baseline (for an --image whose user is root)",
          choices=("baseline", "restricted")),
    Param("package", str, "configmap", "how gpuvs reaches the trial pods (configmap or image)",
          choices=("configmap", "image")),
    Param("python", str, "python3", "the Python of the trial image"),
    Param("hold_timeout", float, 20.0, "seconds the scheduler has to place a pod asking for a node's GPUs; "
          "not placed: the node is busy and skipped", min=1.0, max=3600.0),
    Param("run_timeout", float, 3600.0, "seconds one validate or fleet may take", min=10.0),
)
FLEET_OPTIONS = (
    Param("trials", int, 4, "trials per node (at least 4)", min=4, max=1000),
    Param("max_trials", int, None, "trials per node at most (default: 3 x --trials)", min=4, max=10000),
    Param("margin", float, 0.05, "equivalence margin of a node against the fleet", min=0.0, max=0.5),
    Param("parallel", int, 4, "trials at once across nodes", min=1, max=1000),
    Param("stale_after", str, None, "a figure not renewed for this long is marked stale (default: twice --every)"),
    Param("condition", bool, False, "keep the NodeCondition GpuvsPerformance current and post Events on the nodes "
          "(a verdict that changed, a validate failure); needs `gpuvs deploy --condition`"),
    Param("taint", bool, False, "taint the nodes found slower gpuvs.io/slow=true:EFFECT and untaint them when they "
          "read well again, never more than --taint-max-share of the GPU nodes"),
    Param("taint_effect", str, "NoSchedule", "with --taint: the taint's effect",
          choices=("NoSchedule", "PreferNoSchedule")),
    Param("taint_max_share", float, 0.1, "with --taint: the most of the GPU nodes tainted at once (at least 1 node)",
          min=0.001, max=1.0),
)


def agent(args: Args) -> int:
    from gpuvs.agent.config import AgentConfig, WorkloadSpec, duration, listen
    from gpuvs.agent.service import Agent

    host, port = listen(args["listen"])
    specs = [WorkloadSpec.parse(w) for w in args["workload"] or []]  # none: the default by node (workloads_for)
    config = AgentConfig(
        store=args["store"], host=host, port=port, every_s=duration("every", args["every"]),
        first_after_s=duration("first-after", args["first_after"]), workloads=specs, device=args["device"],
        image=args["image"], pull_policy=args["image_pull_policy"], kubeconfig=args["kubeconfig"],
        context=args["context"], namespace=args["namespace"], gpu_resource=args["gpu_resource"],
        priority_class=args["priority_class"], pod_security=args["pod_security"], package=args["package"],
        python=args["python"], trials=args["trials"], max_trials=args["max_trials"], margin=args["margin"],
        parallel=args["parallel"], validate=args["validate"], hold_timeout_s=args["hold_timeout"],
        run_timeout_s=args["run_timeout"], token_file=args["token_file"],
        min_interval_s=duration("min-interval", args["min_interval"]), http_timeout_s=args["http_timeout"],
        stale_after_s=duration("stale-after", args["stale_after"]) if args["stale_after"] else None,
        condition=args["condition"], taint=args["taint"], taint_effect=args["taint_effect"],
        taint_max_share=args["taint_max_share"])
    config.check()
    from pathlib import Path

    folder = Path(config.store).resolve().parent
    if not folder.is_dir():
        from gpuvs.errors import UsageError

        raise UsageError(f"--store {config.store}: folder {folder} does not exist")
    return Agent(config).serve()


COMMAND = Command(
    "agent", "Run gpuvs inside the cluster: validate and fleet on a schedule and on demand on the nodes nobody is "
    "using, node labels, Prometheus metrics.", agent,
    groups=(Group("agent options", AGENT_OPTIONS, "agent"), Group("cluster and pod options", CLUSTER_OPTIONS,
                                                                  "cluster"),
            Group("fleet options", FLEET_OPTIONS, "fleet")),
    notes="One replica, deployed by `gpuvs deploy` (deploy/). HTTP: GET /healthz /readyz /metrics /runs /runs/ID, "
          "POST /runs (Authorization: Bearer TOKEN of --token-file). See docs/deploy.md.",
)
