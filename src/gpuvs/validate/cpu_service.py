"""A CPU service beside a GPU job: does starting an HTTP pod on the node disturb the job's rate?

The client reaches the service pod by its IP: a Service's cluster IP needs kube-proxy, which not every cluster runs.
The windows are cut by the job's log, not by clocks, which may differ between this machine and the node.
The pods run python3 from the image; without one the row is `not run` (docs/kubernetes.md)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from gpuvs.kube.client import client_module
from gpuvs.validate.probe import cannot_start, container, reason, until
from gpuvs.validate.suite import CheckFailed, Suite, checked

SUITE = "functional"
CHECK = "CPU service beside a GPU job"
PORT = 8080
BEFORE_S = 4.0  # the job's rate before the service: samples over this long, from its first one
HOLD_S = 3.0  # the client keeps asking this long after the first answer

SERVICE = r"""
import http.server, os, sys
token = sys.argv[1]
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("gpuvs-service " + token + " on " + os.environ.get("HOSTNAME", "?") + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, fmt, *args):
        print("gpuvs-service request from", self.client_address[0], flush=True)
server = http.server.ThreadingHTTPServer(("", int(sys.argv[2])), Page)
print("gpuvs-service listening", flush=True)
server.serve_forever()
"""

CLIENT = r"""
import sys, time, urllib.request
url, token, hold, limit = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
t0 = time.time()
first, answered, failed, last = None, 0, 0, ""
while time.time() - t0 < limit and (first is None or time.time() - first < hold):
    t = time.time()
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode(errors="replace")
        ok = token in body
        answered += ok
        failed += not ok
        first = first or (time.time() if ok else None)
        print("gpuvs-client answer ok=%d ms=%.1f after_s=%.2f body=%s" % (ok, (time.time() - t) * 1000,
              time.time() - t0, body.strip()[:160]), flush=True)
    except Exception as exc:
        failed += 1
        last = "%s: %s" % (type(exc).__name__, exc)
    time.sleep(0.25)
print("gpuvs-client done answered=%d failed=%d last_error=%s" % (answered, failed, last[:300]), flush=True)
"""


def job_events(log: str) -> list[dict[str, Any]]:
    """The worker's protocol events in its pod's log (other lines, stderr's, are skipped)."""
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "type" in event:
                out.append(event)
    return out


def samples(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples of the first series the job reported (its headline, for a one-series workload)."""
    got = [e for e in events if e["type"] == "sample"]
    return [e for e in got if e.get("series") == got[0].get("series")] if got else []


def rate(window: list[dict[str, Any]]) -> float | None:
    """Total items over total time where the samples carry them (gpuvs's rate), else the mean of their values."""
    if not window:
        return None
    if all(e.get("items") is not None and e.get("seconds") for e in window):
        return sum(e["items"] for e in window) / sum(e["seconds"] for e in window)
    return sum(e["value"] for e in window) / len(window)


def job_body(suite: Suite, name: str, node: str) -> dict[str, Any]:
    """The GPU job's pod: gpuvs's pod environment's manifest (the worker, its package ConfigMap, the security
    context of every trial pod), asking 1 GPU on the node, with this run's deadline."""
    from gpuvs import workloads
    from gpuvs.environments.pod import PodEnvironment, PodSettings, manifest
    from gpuvs.spec import EnvSpec, RunSpec

    s, pods = suite.settings, suite.pods
    w = workloads.get(s.job_workload)
    device = job_device(s.job_workload)
    params = {w.window_param: long_run(w), **s.job_params}
    spec = RunSpec(workload=s.job_workload, params=params, device=device, env=EnvSpec(PodEnvironment.kind, {}),
                   timeout_s=float(pods.deadline_s), telemetry_interval_s=0.0, arm="validate")
    body = manifest(spec, PodSettings(image=s.image, pull_policy=s.pull, gpu_resource=s.resource, node=node,
                                      pod_security=s.pod_security))
    body["metadata"]["name"] = name
    body["spec"]["activeDeadlineSeconds"] = pods.deadline_s
    c = body["spec"]["containers"][0]
    c.setdefault("resources", {}).setdefault("limits", {})[s.resource] = "1"
    for env in c["env"]:
        if env["name"] == "GPUVS_POD_GPUS":
            env["value"] = "1"
    return body


def job_device(workload: str) -> str:
    """cuda for a workload that needs torch (a GPU workload), else cpu (spin: the CPU test cluster's)."""
    from gpuvs import workloads

    return "cuda" if "torch" in workloads.get(workload).requires else "cpu"


def long_run(w) -> int:
    """The workload's step count (its window parameter) set so high that the job runs until it is deleted."""
    p = next(p for p in w.params if p.named(w.window_param))
    return int(p.max) if p.max else 10**6


def run(suite: Suite, node: str, python: str | None) -> None:
    if python == "":
        suite.skip(SUITE, CHECK, f"the image {suite.settings.image} has no python3, which gpuvs's worker (the GPU "
                                 f"job) and the HTTP service need: give an --image with Python 3.10+")
        return
    suite.check(SUITE, CHECK, lambda: beside(suite, node, python or "python3"))


def beside(suite: Suite, node: str, python: str) -> tuple[str, dict]:
    from gpuvs.kube import package

    s, pods, t = suite.settings, suite.pods, suite.settings.timeout
    job, svc, client = pods.name("job"), pods.name("service"), pods.name("client")
    token = uuid.uuid4().hex[:12]

    def log(name: str) -> str:
        try:
            return pods.log(name)
        except client_module().client.exceptions.ApiException:  # not started yet (ContainerCreating)
            return ""

    def events() -> list[dict[str, Any]]:
        got = job_events(log(job))
        errors = [e for e in got if e["type"] == "error"]
        checked(not errors, f"the GPU job's worker failed: {errors[0].get('message') if errors else ''}")
        return got

    def job_state() -> str:
        pod = pods.get(job)
        if pod is not None and pod.status.phase in ("Failed", "Succeeded"):
            tail = " | ".join(log(job).strip().splitlines()[-3:])[:400]
            raise CheckFailed(f"the GPU job ended ({reason(pod)}){': ' + tail if tail else ''}")
        return reason(pod)

    suite.package_used = True
    package.ensure(suite.cluster, pods.deadline_s)
    pods.submit(job_body(suite, job, node))
    try:
        until(f"the GPU job {job} to run on {node}", lambda: pods.running(job), t, last=lambda: reason(pods.get(job)))
        until(f"the GPU job's first sample ({s.job_workload})", lambda: job_state() and samples(events()), t,
              last=job_state)
        cid0, restarts0 = container(pods.get(job))
        time.sleep(BEFORE_S)
        job_state()
        before = samples(events())
        # the service, then a client on the same node asking for its page through the service pod's IP
        t0 = time.monotonic()
        pods.create("service", 0, node, command=[python, "-c", SERVICE, token, str(PORT)])
        pod = until(f"the service {svc} to run with a pod IP", lambda: (p := pods.running(svc)) and p.status.pod_ip
                    and p, t, last=lambda: reason(pods.get(svc)))
        ip = pod.status.pod_ip
        url = f"http://{ip}:{PORT}/"
        pods.create("client", 0, node, command=[python, "-c", CLIENT, url, token, str(HOLD_S), str(t)])
        def answers() -> dict[str, Any] | None:
            checked(not cannot_start(pods.get(client)), f"the client pod cannot start: {reason(pods.get(client))}")
            return _done(log(client))

        done = until(f"the client {client}'s answers from {url}", answers, t + 10,
                     last=lambda: reason(pods.get(client)) + " | service: " + reason(pods.get(svc)))
        answered_s = time.monotonic() - t0
        job_state()
        during = samples(events())[len(before):]
        job_pod = pods.get(job)
        cid, restarts = container(job_pod)
    finally:
        for name in (client, svc, job):
            pods.delete(name)
    until("the job, service and client pods to be gone", lambda: not {p.metadata.name for p in pods.mine()}
          & {job, svc, client}, t)
    checked(done["answered"] > 0, f"the service at {url} (pod {svc} on {node}) never answered the client pod "
                                  f"{client}: {done['failed']} failed request(s), last: {done['last_error'] or '-'}")
    r0, r1 = rate(before), rate(during)
    unit = before[0].get("unit", "") if before else ""
    change = (r1 / r0 - 1) * 100 if r0 and r1 is not None else None
    survived = cid == cid0 and restarts == restarts0 and job_pod is not None and job_pod.status.phase == "Running"
    oks = sorted(a["ms"] for a in done["answers"] if a["ok"])
    first = min(a["after_s"] for a in done["answers"] if a["ok"])
    obs = {"node": node, "service_ip": ip, "port": PORT, "answered": done["answered"], "failed": done["failed"],
           "first_answer_s": round(first, 2), "median_ms": oks[len(oks) // 2],
           "service_to_last_answer_s": round(answered_s, 2),
           "workload": s.job_workload, "device": job_device(s.job_workload), "unit": unit,
           "rate_before": r0, "rate_during": r1, "samples_before": len(before), "samples_during": len(during),
           "change_pct": round(change, 1) if change is not None else None, "job_same_container": cid == cid0,
           "job_restarts": restarts - restarts0}
    job_said = (f"GPU job ({s.job_workload} on {obs['device']}, 1 {s.resource}): {_fmt(r0)} {unit} before "
                f"({len(before)} samples) → {_fmt(r1)} during ({len(during)} samples"
                + (f", {change:+.1f}%" if change is not None else "") + ")")
    checked(survived, f"the GPU job did NOT keep running beside the service ({reason(job_pod)}; restarts "
                      f"+{restarts - restarts0}, {'same' if cid == cid0 else 'new'} container); {job_said}")
    checked(len(during) > 0, f"the GPU job reported no sample while the service started and answered; {job_said}")
    tried = done["answered"] + done["failed"]
    return (f"service pod on {node} answered {done['answered']} of {tried} request(s) from pod {pods.short(client)} "
            f"through {ip}:{PORT} (median {obs['median_ms']:.0f} ms; {answered_s:.1f} s from the service's create to "
            f"the last answer); {job_said}; the job kept running (same container, no restart)", obs)


def _done(log: str) -> dict[str, Any] | None:
    """The client's answers once it is done (None until then)."""
    answers, done = [], None
    for line in log.splitlines():
        if line.startswith("gpuvs-client answer "):
            f = dict(kv.split("=", 1) for kv in line[len("gpuvs-client answer "):].split(" ")[:3])
            answers.append({"ok": f["ok"] == "1", "ms": float(f["ms"]), "after_s": float(f["after_s"])})
        elif line.startswith("gpuvs-client done "):
            rest = line[len("gpuvs-client done "):]
            head, _, last = rest.partition(" last_error=")
            f = dict(kv.split("=", 1) for kv in head.split(" "))
            done = {"answered": int(f["answered"]), "failed": int(f["failed"]), "last_error": last}
    if done is None:
        return None
    return {**done, "answers": answers}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
