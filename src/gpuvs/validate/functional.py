"""The functional suite: does GPU scheduling work on this cluster? Each row is one check.

A GPU pod's life is followed step by step; a step after a failed one is `not run`, and the pod is deleted anyway.
Then several GPU pods at once and what they share (several.py), an over-request, a CPU-only pod, a CPU service."""

from __future__ import annotations

import time
from typing import Any

from gpuvs.kube.client import allocatable, list_nodes
from gpuvs.validate import several
from gpuvs.validate import cpu_service as service
from gpuvs.validate.probe import EXEC_WORD, Seen, reason, until
from gpuvs.validate.suite import FAIL, CheckFailed, Suite, checked

SUITE = "functional"


def gpu_nodes(suite: Suite) -> dict[str, int]:
    """Nodes with allocatable GPUs (the named node only, with --node)."""
    res = suite.settings.resource
    found = {n.metadata.name: allocatable(n, res) for n in list_nodes(suite.cluster)}
    if suite.settings.node:
        found = {k: v for k, v in found.items() if k == suite.settings.node}
    return {k: v for k, v in found.items() if v > 0}


def run(suite: Suite) -> None:
    s = suite.settings
    state: dict[str, Any] = {}

    def nodes() -> tuple[str, dict]:
        found = gpu_nodes(suite)
        state["nodes"] = found
        where = f"node {s.node}" if s.node else "any node"
        checked(bool(found), f"no {where} has allocatable {s.resource}: is the device plugin running there?")
        return (f"{len(found)} node(s) with allocatable {s.resource}: "
                + ", ".join(f"{k} ({v})" for k, v in sorted(found.items())), {"allocatable": found})

    if suite.check(SUITE, "GPU nodes found and allocatable", nodes).status == FAIL:
        for name in ("GPU pod", *several.ROWS, "over-request stays Pending", "CPU-only pod gets no GPU",
                     service.CHECK):
            suite.skip(SUITE, name, "no GPU node to run it on")
        return
    seen = gpu_pod(suite)
    several.run(suite, state["nodes"])
    over_request(suite, state["nodes"])
    cpu_pod(suite, next(iter(sorted(state["nodes"]))))
    service.run(suite, s.node or several.target_node(state["nodes"]), seen.python if seen else None)


def gpu_pod(suite: Suite) -> Seen | None:
    """create → scheduled → running → logs read → GPU visible → exec → deleted and gone. What the probe saw,
    when its log was read."""
    s, pods, t = suite.settings, suite.pods, suite.settings.timeout
    name = pods.name("gpu")
    state: dict[str, Any] = {}
    t0 = time.monotonic()

    def create() -> str:
        pods.create("gpu", 1, s.node)
        pod = until(f"pod {name} to be scheduled", lambda: pods.scheduled(name), t,
                    last=lambda: reason(pods.get(name)))
        state["node"] = pod.spec.node_name
        return f"on {pod.spec.node_name} {time.monotonic() - t0:.2f} s after create", {"node": pod.spec.node_name}

    def running() -> str:
        until(f"pod {name} to run", lambda: pods.running(name), t, last=lambda: reason(pods.get(name)))
        return f"running {time.monotonic() - t0:.2f} s after create"

    def logs() -> str:
        seen = until(f"the probe's `ready` line in {name}'s log", lambda: pods.seen(name), t)
        state["seen"] = seen
        return f"log read, {len(seen.beats)} beat(s) so far, {time.monotonic() - t0:.2f} s after create"

    def visible() -> tuple[str, dict]:
        seen: Seen = state["seen"]
        ids, source = seen.gpu_ids()
        obs = {"device_nodes": seen.nodes, "nvidia_visible_devices": seen.visible, "gpu_names": seen.names,
               "nvidia_smi": seen.smi, "gpu_ids": ids, "id_source": source}
        checked(seen.count == 1, f"asked 1 {s.resource}, the container sees {seen.count}: {seen.describe()}")
        return f"{seen.describe()}; GPU {', '.join(ids) or '?'} (read from: {source})", obs

    def exec_() -> str:
        out = pods.exec(name, ["sh", "-c", f"echo {EXEC_WORD}"])
        checked(EXEC_WORD in out, f"exec ran but printed {out.strip()[:200]!r}, not {EXEC_WORD!r}")
        return "sh -c 'echo ...' in the container answered"

    steps = [("scheduled", create), ("running", running), ("logs read", logs), ("GPU visible inside", visible),
             ("exec works", exec_)]
    failed = None
    for label, body in steps:
        if failed:
            suite.skip(SUITE, f"GPU pod: {label}", f"after `{failed}` failed")
            continue
        if suite.check(SUITE, f"GPU pod: {label}", body).status == FAIL:
            failed = label
    suite.check(SUITE, "GPU pod: deleted and gone", lambda: deleted(suite, name))
    return state.get("seen")


def deleted(suite: Suite, name: str) -> str:
    t0 = time.monotonic()
    suite.pods.delete(name)
    until(f"pod {name} to be gone", lambda: suite.pods.get(name) is None, suite.settings.timeout,
          last=lambda: reason(suite.pods.get(name)))
    return f"gone {time.monotonic() - t0:.2f} s after the delete"


def over_request(suite: Suite, nodes: dict[str, int]) -> None:
    s, pods = suite.settings, suite.pods
    want = max(nodes.values()) + 1
    name = pods.name("over")

    def body() -> tuple[str, dict]:
        pods.create("over", want, s.node)
        try:
            def unschedulable():
                pod = pods.get(name)
                checked(pod is not None and not pod.spec.node_name,
                        f"a pod asking {want} {s.resource} (more than any node has) was scheduled on "
                        f"{pod.spec.node_name if pod else '?'}")
                return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"
                             and c.status == "False" and c.reason == "Unschedulable"), None)

            cond = until(f"the scheduler to mark {name} Unschedulable", unschedulable, s.timeout,
                         last=lambda: reason(pods.get(name)))
            checked(f"Insufficient {s.resource}" in (cond.message or ""),
                    f"Pending, but the scheduler's reason does not name {s.resource}: {cond.message}")
            pod = pods.get(name)
            checked(pod.status.phase == "Pending", f"phase {pod.status.phase}, expected Pending")
            detail = f"asked {want}: Pending, scheduler says: {cond.message}"
        finally:
            deleted(suite, name)
        return detail + "; deleted and gone", {"asked": want, "message": cond.message}

    suite.check(SUITE, "over-request stays Pending", body)


def cpu_pod(suite: Suite, node: str) -> None:
    s, pods = suite.settings, suite.pods
    name = pods.name("cpu")

    def body() -> tuple[str, dict]:
        pods.create("cpu", 0, node)
        try:
            seen = until(f"the probe's `ready` line in {name}'s log", lambda: pods.seen(name), s.timeout,
                         last=lambda: reason(pods.get(name)))
        finally:
            deleted(suite, name)
        leaked = seen.count or seen.visible not in ("", "void", "none")
        if leaked:
            raise CheckFailed(f"a pod without a {s.resource} request on {node} sees GPUs: {seen.describe()}")
        return f"on {node}: {seen.describe()}", {"node": node, "device_nodes": seen.nodes,
                                                 "nvidia_visible_devices": seen.visible}

    suite.check(SUITE, "CPU-only pod gets no GPU", body)
