"""gpuvs doctor --env pod: the API, the namespace and gpuvs's permissions there, and the nodes with GPUs.

Then one real pod runs `python -m gpuvs.trial.inside --probe`: Python, the framework, the GPU as seen inside.
Every failed row says what to do."""

from __future__ import annotations

import time
from typing import Any

from gpuvs.probes import checkup
from gpuvs.errors import GpuvsError
from gpuvs.spec import RunSpec, gpus_asked

PERMISSIONS = (("create", "pods", None), ("get", "pods", None), ("delete", "pods", None), ("get", "pods", "log"),
               ("create", "configmaps", None), ("patch", "configmaps", None), ("delete", "configmaps", None))


def doctor(env, spec: RunSpec, report, timeout: float) -> dict[str, Any] | None:
    from gpuvs.kube import client

    try:
        s = env.settings
        cluster = env.cluster()
    except GpuvsError as exc:
        report.add("cluster API", "FAIL", f"{exc} (check the kubeconfig, --context, and that the API server runs)")
        return None
    report.add("cluster API", "ok", f"{cluster.host} ({cluster.source})")
    try:
        client.check_namespace(cluster)
        report.add("namespace", "ok", cluster.namespace)
    except GpuvsError as exc:
        report.add("namespace", "FAIL", f"{exc}; give --namespace NAME of an existing namespace")
        return None
    needed = [(v, r, sub) for v, r, sub in PERMISSIONS if r == "pods" or s.package == "configmap"]
    denied = []
    for verb, resource, sub in needed:
        if client.can_i(cluster, verb, resource, sub) is False:
            denied.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    if denied:
        report.add("permissions", "FAIL", f"not allowed in {cluster.namespace}: {', '.join(denied)}; ask for a Role "
                   "with these verbs bound to your user or service account")
        return None
    report.add("permissions", "ok", "create/get/delete pods, read pod logs" +
               (", create/patch/delete configmaps" if s.package == "configmap" else ""))
    nodes = client.list_nodes(cluster)
    with_gpus = {n.metadata.name: client.allocatable(n, s.gpu_resource) for n in nodes}
    with_gpus = {k: v for k, v in with_gpus.items() if v}
    gpus = gpus_asked(spec)
    if not nodes:
        report.add("GPU nodes", "warn", "cannot list nodes (no permission); the probe pod below will show the GPU")
    elif not with_gpus:
        report.add("GPU nodes", "FAIL" if gpus else "ok",
                   f"no node has allocatable {s.gpu_resource}" + (
                       ": install the vendor's device plugin, or give --gpu-resource NAME, or --device cpu"
                       if gpus else ""))
    else:
        report.add("GPU nodes", "ok", ", ".join(f"{k}: {v}" for k, v in sorted(with_gpus.items())))
    try:
        env.check(spec)
    except GpuvsError as exc:
        report.add("pod accepted", "FAIL", str(exc))
        return None
    report.add("pod accepted", "ok", "a server-side dry run of the pod passed")
    t0 = time.monotonic()
    launched = env.start(spec, entry=("-m", "gpuvs.trial.inside", "--probe"))
    run = checkup.read_probe(launched, timeout)
    probe = run.probe
    if run.timed_out:
        report.add("start a pod", "FAIL", f"no answer within {timeout:g} s")
        return None
    if probe is None:
        tail = " | ".join(list(launched.stderr_tail)[-4:])
        detail = "; ".join(run.errors) or tail or "the pod said nothing"
        if "python" in detail.lower() and "not found" in detail.lower():
            detail += f" (the image needs {s.python}: give --python PATH or another --image)"
        report.add("start a pod", "FAIL", detail)
        return None
    node = (probe.get("container") or {}).get("node_name")
    stages = ", ".join(f"{k.removeprefix('pod_').removesuffix('_s')} {v:.2f} s" for k, v in launched.marks.items()
                       if k.startswith("pod_"))
    report.add("start a pod", "ok", f"{time.monotonic() - t0:.2f} s on node {node}, {s.python} = Python "
               f"{probe['python']} ({stages})")
    return probe
