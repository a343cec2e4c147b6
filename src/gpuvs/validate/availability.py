"""The availability suite (opt-in: --disruptive --node NAME): a GPU job runs while a cluster part is restarted.

Each part is restarted by a command the user gave; a part without a command is `not run` (gpuvs never guesses).
Each row says what happened to the job (still running, same container, no gap in its beats) and to the node.
It also says how long until the node was back as before, with a new GPU pod running on it (recovery_s)."""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuvs.kube.client import client_module
from gpuvs.validate.probe import Timeout, container, node_state, reason, until
from gpuvs.validate.suite import PASS, CheckFailed, Suite, checked, run_command

SUITE = "availability"
MAX_GAP_S = 3  # beats come every 0.5 s; a longer silence means the job stalled


def api_answers(suite: Suite) -> bool:
    try:
        client_module().client.VersionApi(suite.cluster.api).get_code(_request_timeout=2)
        return True
    except Exception:  # noqa: BLE001 - not answering is what is being observed
        return False


class Watch:
    """Polls the node while the cluster recovers: Ready and allocatable GPUs over time."""

    def __init__(self, suite: Suite, node: str):
        self.suite, self.node = suite, node
        self.samples: list[tuple[float, bool | None, int | None]] = []  # (t, ready, gpus); None: API silent
        self.reports: list[tuple[float, Any]] = []  # (t, when the kubelet last reported Ready), API answering
        self.t0 = time.monotonic()

    def poll(self) -> tuple[bool | None, int | None]:
        t = time.monotonic() - self.t0
        try:
            n = node_state(self.suite.cluster, self.node, self.suite.settings.resource)
        except Exception:  # noqa: BLE001 - the API server may be the part that is down
            self.samples.append((t, None, None))
            return None, None
        self.samples.append((t, n.ready, n.gpus))
        self.reports.append((t, n.reported))
        return n.ready, n.gpus

    def reported_after(self, before: Any) -> float | None:
        """Seconds until the node's Ready condition was first seen reported after `before` (None: not yet)."""
        return next((t for t, r in self.reports if r is not None and r > before), None)

    def lowest(self) -> int | None:
        seen = [g for _, _, g in self.samples if g is not None]
        return min(seen) if seen else None

    def not_ready_s(self) -> float:
        """Seconds the node was seen NotReady (between polls)."""
        out, prev = 0.0, None
        for t, ready, _ in self.samples:
            if prev is not None and prev[1] is False:
                out += t - prev[0]
            prev = (t, ready)
        return out

    def api_silent_s(self) -> float:
        silent = [t for t, ready, _ in self.samples if ready is None]
        return (max(silent) - min(silent)) if silent else 0.0


def run(suite: Suite) -> None:
    s = suite.settings
    node = s.node
    parts: list[tuple[str, Callable[[Suite, Watch], None] | None, str]] = [
        ("device plugin restart", _command_step("restart device plugin", s.restart_plugin_cmd),
         "--restart-plugin-cmd"),
        ("kubelet restart", _command_step("restart kubelet", s.restart_kubelet_cmd), "--restart-kubelet-cmd"),
        ("API server outage", _outage if s.stop_apiserver_cmd and s.start_apiserver_cmd else None,
         "--stop-apiserver-cmd and --start-apiserver-cmd"),
    ]
    job = suite.pods.name("job")

    def start_job() -> str:
        suite.pods.create("job", 1, node)
        until(f"the GPU job {job} to run on {node}", lambda: suite.pods.running(job), s.timeout,
              last=lambda: reason(suite.pods.get(job)))
        until(f"the job's first beat in its log", lambda: suite.pods.seen(job, lambda x: bool(x.beats)), s.timeout)
        return f"GPU job {job} running on {node}"

    if suite.check(SUITE, "GPU job started for the disruptions", start_job).status != PASS:
        for label, _, _ in parts:
            suite.skip(SUITE, label, "the GPU job did not start")
        return
    for label, step, option in parts:
        if step is None:
            suite.skip(SUITE, label, f"no {option} given")
            continue
        suite.check(SUITE, label, lambda step=step, label=label: disruption(suite, job, label, step))


def _command_step(what: str, command: str | None) -> Callable[[Suite, Watch], None] | None:
    if not command:
        return None

    def step(suite: Suite, watch: Watch) -> None:
        run_command(what, command, suite.settings.command_timeout)
        watch.poll()
    return step


def _outage(suite: Suite, watch: Watch) -> None:
    """Stop the API server, see it unreachable, keep it down for --apiserver-outage seconds, start it."""
    s = suite.settings
    suite.restore.append(("start API server", s.start_apiserver_cmd))  # runs at clean-up if we stop halfway
    run_command("stop API server", s.stop_apiserver_cmd, s.command_timeout)
    t_stop = time.monotonic()
    until("the API server to stop answering (did --stop-apiserver-cmd stop it?)",
          lambda: not api_answers(suite), min(s.timeout, 30))
    while time.monotonic() - t_stop < s.outage_s:
        watch.poll()
        time.sleep(0.5)
    suite.restore.pop()
    run_command("start API server", s.start_apiserver_cmd, s.command_timeout)


def disruption(suite: Suite, job: str, label: str, step: Callable[[Suite, Watch], None]) -> tuple[str, dict]:
    s, pods = suite.settings, suite.pods
    node = s.node
    before = node_state(suite.cluster, node, s.resource)
    ready0, gpus0 = before.ready, before.gpus
    # after a kubelet restart the node still reads Ready from the old kubelet until the new one reports:
    # back means a report newer than this one
    report0 = before.reported if label == "kubelet restart" else None
    cid0, restarts0 = container(pods.get(job))
    wall0 = time.time()
    watch = Watch(suite, node)
    step(suite, watch)

    def heard() -> bool:  # from the restarted kubelet (nothing to hear after other disruptions)
        return report0 is None or watch.reported_after(report0) is not None

    def back() -> bool:
        ready, gpus = watch.poll()
        return heard() and bool(ready) and gpus == gpus0

    def last() -> str:
        _, ready, gpus = watch.samples[-1]
        return f"ready={ready}, {s.resource}={gpus}" + ("" if heard() else ", no report from the new kubelet yet")
    until(f"{node} Ready with {gpus0} allocatable {s.resource} again"
          + (" (reported by the restarted kubelet)" if report0 is not None else ""), back, s.timeout, step=0.25,
          last=last)
    reported = watch.reported_after(report0) if report0 is not None else None
    new_pod = _new_gpu_pod(suite, label, gpus0)
    recovery = time.monotonic() - watch.t0
    # the job: same container, not restarted, beating all along
    pod = pods.get(job)
    cid, restarts = container(pod)
    seen = until(f"{job}'s log", lambda: pods.seen(job, lambda x: True), s.timeout)
    beats = [b for b in seen.beats if b >= int(wall0) - 2]
    gap = max((b - a for a, b in zip(beats, beats[1:])), default=None)
    observed: dict[str, Any] = {
        "job_phase": pod.status.phase if pod else "gone", "job_restarts": restarts - restarts0,
        "job_same_container": cid == cid0, "longest_beat_gap_s": gap, "beats_since": len(beats),
        "node_ready_before": ready0, "node_not_ready_s": round(watch.not_ready_s(), 2),
        "api_silent_s": round(watch.api_silent_s(), 2), "allocatable_before": gpus0,
        "allocatable_lowest": watch.lowest(), "allocatable_after": gpus0, "new_gpu_pod": new_pod,
        "recovery_s": round(recovery, 3)}
    if reported is not None:
        observed["kubelet_reported_s"] = round(reported, 2)
    survived = pod is not None and pod.status.phase == "Running" and cid == cid0 and restarts == restarts0
    detail = (f"job {'kept running' if survived else 'did NOT survive'} ({reason(pod)}; restarts "
              f"+{restarts - restarts0}, {'same' if cid == cid0 else 'new'} container, longest gap between beats "
              f"{gap} s); node NotReady for {observed['node_not_ready_s']} s; {s.resource} {gpus0} → lowest "
              f"{watch.lowest()} → {gpus0}; {new_pod}; back as before in {recovery:.1f} s"
              + (f" (the new kubelet's first report after {reported:.1f} s)" if reported is not None else ""))
    checked(survived, detail)
    checked(gap is not None and gap <= MAX_GAP_S and beats and beats[-1] >= int(wall0) + int(recovery) - 2,
            f"the job stalled: {detail}")
    return detail, observed


def _new_gpu_pod(suite: Suite, label: str, gpus: int) -> str:
    """A new GPU pod on the node runs (retried while the node turns it away): the GPU resource works again."""
    s, pods = suite.settings, suite.pods
    if gpus < 2:
        return "no free GPU beside the job's for a new pod (the node has 1)"
    what = "after-" + "-".join(label.split()[:2]).lower()
    name = pods.name(what)
    turned_away: list[str] = []
    deadline = time.monotonic() + s.timeout

    def outcome() -> tuple[str, str] | None:
        pod = pods.get(name)
        if pod is not None and pod.status.phase == "Failed":
            return "turned away", reason(pod)
        return ("ran", "") if pods.seen(name) else None

    while True:
        pods.create(what, 1, s.node)
        try:
            got, why = until(f"a new GPU pod on {s.node} to report its GPU", outcome,
                             max(0.0, deadline - time.monotonic()), last=lambda: reason(pods.get(name)))
        except Timeout as exc:
            raise CheckFailed(f"no new GPU pod ran on {s.node} after the {label}: {exc}") from None
        finally:
            pods.delete(name)
            until(f"pod {name} to be gone", lambda: pods.get(name) is None, s.timeout)
        if got == "ran":
            break
        turned_away.append(why)
        time.sleep(0.5)
    return "new GPU pod ran" + (f" after {len(turned_away)} turned away ({turned_away[0]})" if turned_away else "")
