"""Several GPU pods at once on one node, one pod asking for every GPU of the node, and what the pods share.

The node is `--node`, else the GPU node that advertises the most GPUs (the first by name among equals).
The sharing factor is the GPUs advertised over the distinct GPUs the pods saw.
Above 1 is `shared`, a finding, not a failure, but FAIL under --exclusive (docs/kubernetes.md)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from gpuvs.validate.probe import EXEC_WORD, Seen, cannot_start, reason, until
from gpuvs.validate.suite import FAIL, NOT_RUN, PASS, SHARED, CheckFailed, Outcome, Suite, checked

SUITE = "functional"
SET = "several GPU pods"
ALL = "all-GPUs pod sees every GPU"
SHARING = "GPU sharing"
ROWS = (SET, ALL, SHARING)
SETTLE_S = 5.0  # every pod not running marked unschedulable, nothing changing this long: they stay Pending


def target_node(nodes: dict[str, int]) -> str:
    """The node advertising the most GPUs (the first by name among equals)."""
    return sorted(nodes.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def unschedulable(pod: Any) -> bool:
    return pod is not None and not pod.spec.node_name and any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or [])


def held_elsewhere(suite: Suite, node: str) -> list[str]:
    """Other pods on the node that hold its GPUs (namespace/name (count)); all namespaces where gpuvs may list
    them, else its own."""
    res, core = suite.settings.resource, suite.cluster.core
    selector = f"spec.nodeName={node}"
    try:
        items = core.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=10).items
    except Exception:  # noqa: BLE001 - may not list other namespaces: its own says what it can
        try:
            items = core.list_namespaced_pod(suite.cluster.namespace, field_selector=selector,
                                             _request_timeout=10).items
        except Exception:  # noqa: BLE001
            return []
    mine = suite.pods.name("")
    out = []
    for p in items:
        if p.metadata.name.startswith(mine) or p.status.phase in ("Succeeded", "Failed"):
            continue
        n = sum(int((c.resources.limits or {}).get(res, 0)) for c in p.spec.containers if c.resources)
        if n:
            out.append(f"{p.metadata.namespace}/{p.metadata.name} ({n})")
    return out


def wait_together(suite: Suite, names: list[str], node: str, advertised: int) -> float:
    """Until every pod runs at the same time; CheckFailed with the reason when one ended, or when the ones
    not running stay unschedulable (SETTLE_S unchanged) or the timeout passes. Returns seconds waited."""
    s, pods = suite.settings, suite.pods
    t0 = time.monotonic()
    deadline = t0 + s.timeout
    last_change, last_key = t0, None
    while True:
        state = {p.metadata.name: p for p in pods.mine()}
        ended = [n for n in names if n in state and state[n].status.phase in ("Failed", "Succeeded")]
        if ended:
            raise CheckFailed("; ".join(f"{pods.short(n)} ended before all ran: {reason(state[n])}" for n in ended))
        stuck = [n for n in names if cannot_start(state.get(n))]
        if stuck:
            raise CheckFailed("; ".join(f"{pods.short(n)} cannot start: {reason(state[n])}" for n in stuck))
        running = [n for n in names if n in state and state[n].status.phase == "Running"]
        if len(running) == len(names):
            return time.monotonic() - t0
        waiting = [n for n in names if n not in running]
        key = (tuple(running), all(unschedulable(state.get(n)) for n in waiting))
        now = time.monotonic()
        if key != last_key:
            last_change, last_key = now, key
        if (key[1] and now - last_change >= SETTLE_S) or now >= deadline:
            others = held_elsewhere(suite, node)
            why = "; ".join(f"{suite.pods.short(n)}: {reason(state.get(n))}" for n in waiting)
            raise CheckFailed(
                f"{len(running)} of {len(names)} one-GPU pods running at once on {node}, which advertises "
                f"{advertised} {s.resource}; still Pending "
                + (f"(unschedulable for {SETTLE_S:g} s)" if key[1] else f"after {s.timeout:g} s") + f": {why}"
                + (f"; {s.resource} held on {node} by other pods: {', '.join(others)}" if others else ""))
        time.sleep(0.25)


def describe_ids(suite: Suite, seen: dict[str, Seen]) -> str:
    return ", ".join(f"{suite.pods.short(n)} {','.join(x.gpu_ids()[0]) or '-'}" for n, x in seen.items())


def run(suite: Suite, nodes: dict[str, int]) -> dict[str, Seen]:
    """The three parts on one node; returns what each pod saw (pod name -> Seen)."""
    s = suite.settings
    node = s.node or target_node(nodes)
    advertised = nodes[node]
    seen: dict[str, Seen] = {}
    set_ran = several(suite, node, advertised, seen)
    all_seen = all_gpus(suite, node, advertised, seen)
    suite.check(SUITE, SHARING, lambda: sharing(suite, node, advertised, seen, set_ran, all_seen))
    return seen


def several(suite: Suite, node: str, advertised: int, seen: dict[str, Seen]) -> bool:
    """create all → all running at once → logs read → one GPU each → exec works → deleted and gone.
    True when every pod's GPUs were read."""
    s, pods = suite.settings, suite.pods
    count = min(advertised, s.max_gpu_pods)
    names = [pods.name(f"set-{i}") for i in range(count)]
    if advertised == 1:
        cap = (f"{node} advertises 1 {s.resource}: 1 pod, the cap of a one-GPU node (several pods at once cannot "
               "be shown here)")
    elif count < advertised:
        cap = f"{node} advertises {advertised} {s.resource}: {count} pods, the cap (--max-gpu-pods {s.max_gpu_pods})"
    else:
        cap = f"{node} advertises {advertised} {s.resource}: {count} pods (cap {s.max_gpu_pods})"
    obs = {"node": node, "advertised": advertised, "pods": count, "cap": s.max_gpu_pods}

    def together() -> tuple[str, dict]:
        for i in range(count):
            pods.create(f"set-{i}", 1, node)
        took = wait_together(suite, names, node, advertised)
        return f"{cap}; all running together {took:.2f} s after the creates", obs

    def logs() -> str:
        for n in names:
            seen[n] = until(f"the probe's `ready` line in {n}'s log", lambda n=n: pods.seen(n), s.timeout,
                            last=lambda n=n: reason(pods.get(n)))
        return f"{count} log(s) read, each with the probe's lines"

    def one_each() -> tuple[str, dict]:
        wrong = [f"{suite.pods.short(n)} sees {x.count}: {x.describe()}" for n, x in seen.items() if x.count != 1]
        checked(not wrong, f"asked 1 {s.resource} each; " + "; ".join(wrong))
        sources = sorted({x.gpu_ids()[1] for x in seen.values()})
        distinct = len({i for x in seen.values() for i in x.gpu_ids()[0]})
        return (f"each of {count} pod(s) sees 1 GPU ({distinct} distinct, read from: {', '.join(sources)}): "
                f"{describe_ids(suite, seen)}",
                {"ids": {suite.pods.short(n): x.gpu_ids()[0] for n, x in seen.items()}, "source": sources})

    def exec_all() -> str:
        for n in names:
            out = pods.exec(n, ["sh", "-c", f"echo {EXEC_WORD}"])
            checked(EXEC_WORD in out, f"exec into {pods.short(n)} printed {out.strip()[:200]!r}, not {EXEC_WORD!r}")
        return f"sh -c 'echo ...' answered in each of the {count} pod(s)"

    steps = [("all running at once", together), ("logs read", logs), ("one GPU each", one_each),
             ("exec works", exec_all)]
    failed = None
    for label, body in steps:
        if failed:
            suite.skip(SUITE, f"{SET}: {label}", f"after `{failed}` failed")
            continue
        if suite.check(SUITE, f"{SET}: {label}", body).status == FAIL:
            failed = label
    suite.check(SUITE, f"{SET}: deleted and gone", lambda: gone(suite, names))
    return len(seen) == count


def gone(suite: Suite, names: list[str]) -> str:
    t0 = time.monotonic()
    for n in names:
        suite.pods.delete(n)
    until(f"{len(names)} pod(s) to be gone", lambda: not {p.metadata.name for p in suite.pods.mine()} & set(names),
          suite.settings.timeout, last=lambda: ", ".join(sorted({p.metadata.name for p in suite.pods.mine()}
                                                               & set(names))))
    return f"{len(names)} pod(s) deleted and gone {time.monotonic() - t0:.2f} s after the deletes"


def report_ready(suite: Suite, what: str, gpus: int, node: str) -> Seen:
    """A pod asking `gpus` GPUs on `node` until its probe reports; a pod the node turned away (the kubelet's
    UnexpectedAdmissionError while it still frees the devices of pods just deleted) is deleted and tried again;
    one left unschedulable SETTLE_S fails with the scheduler's reason."""
    s, pods = suite.settings, suite.pods
    name = pods.name(what)
    deadline = time.monotonic() + s.timeout
    turned_away: list[str] = []
    while True:
        pods.create(what, gpus, node)
        pending_since = None

        def outcome() -> tuple[str, Any] | None:
            nonlocal pending_since
            pod = pods.get(name)
            if pod is not None and pod.status.phase == "Failed":
                return "turned away", reason(pod)
            if cannot_start(pod):
                raise CheckFailed(f"pod {name} cannot start: {reason(pod)}")
            if unschedulable(pod):
                pending_since = pending_since or time.monotonic()
                if time.monotonic() - pending_since >= SETTLE_S:
                    others = held_elsewhere(suite, node)
                    raise CheckFailed(f"a pod asking {gpus} {s.resource} on {node} stays Pending: {reason(pod)}"
                                      + (f"; held by other pods: {', '.join(others)}" if others else ""))
            else:
                pending_since = None
            got = pods.seen(name)
            return ("ran", got) if got else None

        try:
            got, what_seen = until(f"the probe's `ready` line in {name}'s log", outcome,
                                   max(0.0, deadline - time.monotonic()), last=lambda: reason(pods.get(name)))
        finally:
            pods.delete(name)
            until(f"pod {name} to be gone", lambda: pods.get(name) is None, s.timeout)
        if got == "ran":
            return what_seen
        turned_away.append(what_seen)
        checked(time.monotonic() < deadline, f"the node turned the pod away {len(turned_away)} time(s): "
                                             f"{turned_away[-1]}")
        time.sleep(0.5)


def all_gpus(suite: Suite, node: str, advertised: int, seen: dict[str, Seen]) -> Seen | None:
    s = suite.settings
    name = suite.pods.name("all-gpus")
    got: dict[str, Seen] = {}

    def body() -> Outcome:
        x = report_ready(suite, "all-gpus", advertised, node)
        got["seen"] = seen[name] = x
        ids, source = x.gpu_ids()
        distinct = len(set(ids))
        obs = {"node": node, "asked": advertised, "sees": x.count, "ids": ids, "source": source,
               "distinct": distinct}
        checked(distinct > 0, f"asked {advertised} {s.resource}, sees no GPU it can name: {x.describe()}")
        checked(x.count <= advertised and distinct <= advertised,
                f"asked {advertised} {s.resource}, sees more ({x.count} GPUs, {distinct} distinct IDs from {source}): "
                f"{x.describe()}")
        said = f"asked {advertised}, sees {x.count} GPU(s), {distinct} distinct ({source}: {', '.join(ids)})"
        if distinct == advertised:
            return Outcome(f"{said}; deleted and gone", obs)
        why = f"{said}: {advertised} advertised {s.resource} are {distinct} GPU(s) (see {SHARING})"
        checked(not s.exclusive, f"--exclusive: {why}")
        return Outcome(f"{why}; deleted and gone", obs, SHARED)

    suite.check(SUITE, ALL, body)
    return got.get("seen")


def sharing(suite: Suite, node: str, advertised: int, seen: dict[str, Seen], set_ran: bool,
            all_seen: Seen | None) -> Outcome:
    s = suite.settings
    set_pods = {n: x for n, x in seen.items() if n != suite.pods.name("all-gpus")}
    ids = {suite.pods.short(n): x.gpu_ids()[0] for n, x in seen.items()}
    sources = sorted({x.gpu_ids()[1] for x in seen.values()})
    if not seen:
        return Outcome("no pod's GPUs were read (see the rows above)", {}, NOT_RUN)
    checked(any(ids.values()), "cannot tell the GPUs apart: nothing inside the pods names them (no nvidia-smi, "
                               "no IDs in NVIDIA_VISIBLE_DEVICES, no /dev/nvidia<N>)")
    by_gpu: dict[str, list[str]] = defaultdict(list)
    for n, x in set_pods.items():
        for i in x.gpu_ids()[0]:
            by_gpu[i].append(suite.pods.short(n))
    same = {i: p for i, p in by_gpu.items() if len(p) > 1}
    physical = len({i for v in ids.values() for i in v})
    # the count is complete only where the all-GPUs pod was seen, or as many one-GPU pods as advertised
    complete = all_seen is not None or (set_ran and len(set_pods) == advertised)
    obs: dict[str, Any] = {"node": node, "advertised": advertised, "physical": physical if complete else None,
                           "factor": round(advertised / physical, 3) if complete and physical else None,
                           "source": sources, "shared": same, "ids": ids}
    together = "; pods that saw the same GPU: " + "; ".join(f"{i}: {', '.join(p)}" for i, p in same.items()) \
        if same else ""
    how = f"distinct GPU IDs seen in {len(ids)} pod(s), read from {', '.join(sources)}"
    if complete and advertised > physical:
        factor = advertised / physical
        detail = (f"{node} advertises {advertised} {s.resource} but has {physical} physical GPU(s) ({how}): each "
                  f"GPU advertised {factor:g} times (a device plugin's replicas: time-slicing or MPS){together}")
        checked(not s.exclusive, f"--exclusive: {detail}")
        return Outcome(detail, obs, SHARED)
    if same and complete:
        raise CheckFailed(f"pods were given the same GPU although {node} has as many GPUs as it advertises "
                          f"({physical}; {how}){together}")
    if same:
        detail = (f"pods were given the same GPU (the node's physical count is unknown: the all-GPUs pod did not "
                  f"report; {how}){together}")
        checked(not s.exclusive, f"--exclusive: {detail}")
        return Outcome(detail, obs, SHARED)
    if not complete:
        return Outcome(f"no two pods saw the same GPU, but the physical count needs the all-GPUs pod, which did "
                       f"not report ({how})", obs, NOT_RUN)
    return Outcome(f"{node}: {advertised} {s.resource} advertised, {physical} physical GPU(s) ({how}): no two pods "
                   f"saw the same GPU", obs, PASS)
