"""The validation pods and what is done to them, every wait with a deadline.

One shell probe serves every GPU check: it prints what the container sees of the GPU, then beats until deleted.
Which GPU a pod was given is read from inside it (`Seen.gpu_ids`).
Every pod runs under the trial pods' security context (--pod-security)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvs.kube.client import Cluster, client_module
from gpuvs.kube.client import allocatable as alloc
from gpuvs.environments.pod.podrun import CONFIG_FAILURES, IMAGE_FAILURES

LABEL = "gpuvs-validate"
EXEC_WORD = "gpuvs-exec-ok"  # what `exec` echoes in the checks that exec into a pod
PREFIX = "gpuvs-probe "
UUID = re.compile(r"\(UUID: ([^)\s]+)\)")
SCRIPT = r"""
echo "gpuvs-probe visible=${NVIDIA_VISIBLE_DEVICES:-}"
for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && echo "gpuvs-probe node=$d"; done
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>&1 | while read -r l; do echo "gpuvs-probe smi=$l"; done
else
  echo "gpuvs-probe smi-missing"
fi
echo "gpuvs-probe python=$(command -v python3 || true)"
echo "gpuvs-probe ready"
while :; do echo "gpuvs-probe beat=$(date +%s)"; sleep 0.5; done
"""


def container_security() -> dict[str, Any]:
    """Every probe pod's container, as every trial pod's (environments/pod.py): never privileged, no privilege
    escalation, every capability dropped (the service check listens above 1024: no NET_BIND_SERVICE needed)."""
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def security_context(pod_security: str) -> dict[str, Any]:
    """The probe pods' pod-level securityContext: the runtime's default seccomp profile; under `restricted` also
    runAsNonRoot (the restricted Pod Security Standard: the kubelet refuses an image whose user is root)."""
    out: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if pod_security == "restricted":
        out["runAsNonRoot"] = True
    return out


class Timeout(Exception):
    """A wait ran past its deadline; the message says what was awaited and what was last seen."""


def until(what: str, fn: Callable[[], Any], timeout: float, step: float = 0.25,
          last: Callable[[], str] | None = None) -> Any:
    """fn()'s first true value, polled every `step` seconds; Timeout after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() >= deadline:
            seen = f" (last seen: {last()})" if last else ""
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(step)


@dataclass
class Seen:
    """What the probe printed about the GPU."""

    visible: str = ""
    nodes: list[str] = field(default_factory=list)
    smi: list[str] | None = None  # None: no nvidia-smi in the image
    beats: list[int] = field(default_factory=list)
    ready: bool = False
    python: str | None = None  # the image's python3 ("" where it has none; None: not reported)

    @property
    def names(self) -> list[str]:
        return [m.group(1).strip() for m in (re.match(r"GPU \d+: (.*?)(?: \(UUID.*)?$", s) for s in self.smi or [])
                if m]

    @property
    def count(self) -> int:
        """GPUs the container sees: nvidia-smi's list where there is one, else the device nodes."""
        return len(self.names) if self.smi is not None and self.names else len(self.nodes)

    def gpu_ids(self) -> tuple[list[str], str]:
        """Which GPUs the container was given, and where that was read (the first source that names them):
        - `nvml`: the UUIDs `nvidia-smi -L` (NVML) lists; a MIG device's own UUID where it lists MIG devices;
        - `device plugin`: the IDs in NVIDIA_VISIBLE_DEVICES, as the device plugin handed them in (a replica
          suffix `::<n>` dropped: replicas of one GPU are that GPU; `all`, `none`, `void` name no GPU);
        - `device nodes`: the /dev/nvidia<N> nodes (their numbers are the host's);
        - `none`: nothing names a GPU."""
        uuids = [m.group(1) for line in self.smi or [] for m in [UUID.search(line)] if m]
        mig = [u for u in uuids if u.startswith("MIG-")]
        if mig or uuids:
            return (mig or uuids), "nvml"
        visible = [v.strip().split("::", 1)[0] for v in self.visible.split(",")]
        visible = [v for v in visible if v and v.lower() not in ("all", "none", "void")]
        if visible:
            return list(dict.fromkeys(visible)), "device plugin"
        if self.nodes:
            return list(self.nodes), "device nodes"
        return [], "none"

    def describe(self) -> str:
        smi = ("no nvidia-smi in the image" if self.smi is None else
               f"nvidia-smi: {', '.join(self.names) or ' / '.join(self.smi) or 'no GPU listed'}")
        return (f"{len(self.nodes)} device node(s) ({', '.join(self.nodes) or 'none'}); "
                f"NVIDIA_VISIBLE_DEVICES={self.visible or '(unset)'}; {smi}")


def parse(log: str) -> Seen:
    seen = Seen()
    for line in log.splitlines():
        if not line.startswith(PREFIX):
            continue
        key, _, value = line[len(PREFIX):].partition("=")
        if key == "visible":
            seen.visible = value
        elif key == "node":
            seen.nodes.append(value)
        elif key == "smi":
            seen.smi = (seen.smi or []) + [value]
        elif key == "smi-missing":
            seen.smi = None
        elif key == "python":
            seen.python = value
        elif key == "ready":
            seen.ready = True
        elif key == "beat" and value.isdigit():
            seen.beats.append(int(value))
    return seen


@dataclass
class Pods:
    """Creates, watches and deletes the pods of one validation run (all labelled gpuvs-validate=<run>)."""

    cluster: Cluster
    run: str
    image: str
    pull: str
    resource: str
    deadline_s: int  # activeDeadlineSeconds: the server-side backstop of every pod
    request_timeout: float = 10.0
    priority_class: str | None = None  # gpuvs agent: gpuvs-trial, so that a real job preempts a probe
    pod_security: str = "baseline"  # or restricted: also runAsNonRoot (the image's user must be a non-root uid)

    def body(self, name: str, gpus: int, node: str | None = None, command: list[str] | None = None
             ) -> dict[str, Any]:
        """A pod of this run: the shell probe (or `command`), asking `gpus` GPUs, on `node` if named."""
        limits = {self.resource: str(gpus)} if gpus else {}
        spec: dict[str, Any] = {
            "restartPolicy": "Never", "activeDeadlineSeconds": self.deadline_s, "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": security_context(self.pod_security),
            "containers": [{"name": "probe", "image": self.image, "imagePullPolicy": self.pull,
                            "command": command or ["sh", "-c", SCRIPT], "resources": {"limits": limits},
                            "securityContext": container_security()}]}
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
            spec["tolerations"] = [{"key": "gpuvs.io/slow", "operator": "Exists"}]  # kube.SLOW_TOLERATION
        if self.priority_class:
            spec["priorityClassName"] = self.priority_class
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": self.labels()}, "spec": spec}

    def labels(self) -> dict[str, str]:
        """A probe pod's labels: the trial pods' conventions (component validate, gpuvs.io/validate-run) and
        gpuvs-validate=RUN, the selector of this run's clean-up."""
        from gpuvs.kube import app_labels

        return {**app_labels("validate", validate_run=self.run), LABEL: self.run}

    def name(self, what: str) -> str:
        return f"gpuvs-validate-{self.run}-{what}"

    def short(self, name: str) -> str:
        """A pod's name without the run's prefix (set-0, all-gpus, service), for details."""
        return name.removeprefix(self.name(""))

    def create(self, what: str, gpus: int, node: str | None = None, command: list[str] | None = None) -> str:
        return self.submit(self.body(self.name(what), gpus, node, command))

    def submit(self, body: dict[str, Any]) -> str:
        """Create a pod built elsewhere (gpuvs's worker), as one of this run's: its labels make sure the clean-up
        finds it."""
        body["metadata"].setdefault("labels", {}).update({"gpuvs": "1", LABEL: self.run, "gpuvs.io/validate-run": self.run})
        self.cluster.core.create_namespaced_pod(self.cluster.namespace, body, _request_timeout=self.request_timeout)
        return body["metadata"]["name"]

    def get(self, name: str) -> Any | None:
        try:
            return self.cluster.core.read_namespaced_pod(name, self.cluster.namespace,
                                                         _request_timeout=self.request_timeout)
        except client_module().client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def log(self, name: str) -> str:
        # the client hands an empty log back as None
        return self.cluster.core.read_namespaced_pod_log(name, self.cluster.namespace,
                                                         _request_timeout=self.request_timeout) or ""

    def exec(self, name: str, command: list[str]) -> str:
        """The command's output. The client's websocket call turns every exception raised while it runs, Ctrl-C and
        SIGTERM's stop included, into ApiException(status 0): the socket is read here instead, so that a stop goes
        through, and a stop that came while it connected is raised again as the interruption it was."""
        from kubernetes.stream import stream

        try:
            ws = stream(self.cluster.core.connect_get_namespaced_pod_exec, name, self.cluster.namespace,
                        command=command, stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
        except client_module().client.exceptions.ApiException as exc:
            if exc.status == 0 and (not exc.reason or str(exc.reason).startswith("stopped by ")):
                raise KeyboardInterrupt(exc.reason or "") from None
            raise
        try:
            ws.run_forever(timeout=self.request_timeout)
            return ws.read_all()
        finally:
            ws.close()

    def delete(self, name: str) -> None:
        try:
            self.cluster.core.delete_namespaced_pod(name, self.cluster.namespace, grace_period_seconds=0,
                                                    _request_timeout=self.request_timeout)
        except client_module().client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise

    def mine(self) -> list[Any]:
        """Every pod of this run, as the API server has them now (one request)."""
        return list(self.cluster.core.list_namespaced_pod(self.cluster.namespace, label_selector=f"{LABEL}={self.run}",
                                                          _request_timeout=self.request_timeout).items)

    def leftovers(self) -> list[str]:
        return [p.metadata.name for p in self.mine()]

    def delete_all(self, timeout: float) -> list[str]:
        """Delete every pod of this run and wait until they are gone; names still there at the deadline."""
        deadline = time.monotonic() + timeout
        left: list[str] = []
        while time.monotonic() < deadline:
            try:
                left = self.leftovers()
                for name in left:
                    self.delete(name)
            except Exception:  # noqa: BLE001 - the API may be coming back; try again until the deadline
                left = left or ["(API not answering)"]
                time.sleep(0.5)
                continue
            if not left:
                return []
            time.sleep(0.25)
        return left

    # -- states -------------------------------------------------------------------------------------

    def scheduled(self, name: str) -> Any:
        pod = self.get(name)
        return pod if pod and pod.spec.node_name else None

    def running(self, name: str) -> Any:
        pod = self.get(name)
        if pod and pod.status.phase in ("Failed", "Succeeded"):
            raise Timeout(f"pod {name} ended ({pod.status.phase}: {reason(pod)}) before it was seen running")
        if cannot_start(pod):
            raise Timeout(f"pod {name} cannot start: {reason(pod)}")
        return pod if pod and pod.status.phase == "Running" else None

    def seen(self, name: str, what: Callable[[Seen], bool] = lambda s: s.ready) -> Seen | None:
        try:
            s = parse(self.log(name))
        except client_module().client.exceptions.ApiException:
            return None
        return s if what(s) else None


def reason(pod: Any) -> str:
    """The pod's state in the cluster's own words: conditions' messages, containers' waiting/terminated reasons."""
    if pod is None:
        return "gone"
    parts = [pod.status.phase or "?"]
    if pod.status.reason or pod.status.message:  # e.g. UnexpectedAdmissionError, Evicted, DeadlineExceeded
        parts[0] += f" {pod.status.reason or ''}: {pod.status.message or ''}".rstrip(": ")
    for c in pod.status.conditions or []:
        if c.status != "True" and (c.reason or c.message):
            parts.append(f"{c.type}={c.status} {c.reason or ''}: {c.message or ''}".strip())
    for cs in pod.status.container_statuses or []:
        st = cs.state
        if st and st.waiting:
            parts.append(f"waiting {st.waiting.reason}: {st.waiting.message or ''}".strip())
            if "runAsNonRoot" in (st.waiting.message or ""):  # restricted (the default) on an image run as root
                parts[-1] += " (the image's user is root: give --pod-security baseline)"
        if st and st.terminated:
            parts.append(f"terminated {st.terminated.reason} (exit {st.terminated.exit_code})")
    return "; ".join(parts)


def cannot_start(pod: Any) -> bool:
    """A container waits for a reason that does not pass by waiting (the image cannot be pulled or used, the
    container cannot be created), as the pod environment judges it (kube/podrun.py)."""
    for cs in (pod.status.container_statuses or []) if pod else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in IMAGE_FAILURES + CONFIG_FAILURES:
            return True
    return False


def container(pod: Any) -> tuple[str | None, int]:
    """(container ID, restart count) of the probe container."""
    for cs in (pod.status.container_statuses or []) if pod else []:
        return cs.container_id, cs.restart_count or 0
    return None, 0


@dataclass(frozen=True)
class NodeState:
    """One reading of a node as the API server has it."""
    ready: bool          # the Ready condition holds
    gpus: int            # allocatable GPUs (the resource asked for)
    reported: Any        # when its kubelet last reported the Ready condition (lastHeartbeatTime; None if never)


def node_state(cluster: Cluster, node: str, resource: str) -> NodeState:
    """The node read once. A kubelet reports its Ready condition when it starts, so a `reported` newer than
    one read before a restart means the new kubelet has spoken: until then the node still shows its
    predecessor's Ready. Compare it with an earlier reading of the same field, never with this machine's
    clock (the node's may differ)."""
    n = cluster.core.read_node(node, _request_timeout=5)
    ready = next((c for c in n.status.conditions or [] if c.type == "Ready"), None)
    return NodeState(ready is not None and ready.status == "True", alloc(n, resource),
                     ready.last_heartbeat_time if ready is not None else None)
