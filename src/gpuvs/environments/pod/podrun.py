"""One worker in one pod: create it, watch it start, follow its log, and delete it.

The pod's log is the protocol stream: a broken stream is opened again and read to its end, so no line is lost.
Every way a pod can fail becomes one plain line with the cluster's own reason.
Watches of its own and the shared node watch (kube/watch.py) follow it; start-up stages are timed (docs/pod.md)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuvs import events
from gpuvs.environments.environment import WorkerStream
from gpuvs.errors import EnvironmentUnavailable
from gpuvs.kube import watch
from gpuvs.kube.client import Cluster, api_message, client_module

CONTAINER = "worker"
IMAGE_FAILURES = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "ImageInspectError",
                  "RegistryUnavailable")
CONFIG_FAILURES = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
API_SILENCE_MIN_S = 30.0  # the API server may be silent this long (or --node-lost-timeout, if longer)
START_FAILURES = ("StartError", "ContainerCannotRun")
STAGES = ("pod_created_s", "pod_scheduled_s", "pod_image_ready_s", "pod_started_s", "pod_first_line_s",
          "pod_first_result_s")


@dataclass
class Waits:
    """The bounded waits of one pod (seconds)."""

    schedule: float = 30.0  # unschedulable this long: a failed trial with the scheduler's message
    start: float = 300.0  # scheduled but no container running this long (image pull included): failed
    node_lost: float = 60.0  # the pod's node not Ready this long while the pod runs: failed
    delete: float = 60.0  # waiting for a deleted pod to be gone


class Fault(Exception):
    """A pod that cannot run or finish: (error kind, message with the cluster's reason)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def _container_status(pod: Any) -> Any:
    for cs in (pod.status and pod.status.container_statuses) or []:
        if cs.name == CONTAINER:
            return cs
    return None


def _condition(pod: Any, kind: str) -> Any:
    for c in (pod.status and pod.status.conditions) or []:
        if c.type == kind:
            return c
    return None


class PodLaunched(WorkerStream):
    """A worker running in a pod, with the same interface as a process (lines, wait, kill, close)."""

    def __init__(self, cluster: Cluster, body: dict[str, Any], waits: Waits, memory_limit: str | None = None,
                 launched_at: float | None = None):
        super().__init__()
        self.cluster = cluster
        self.name = body["metadata"]["name"]
        self.namespace = cluster.namespace
        self.image = body["spec"]["containers"][0]["image"]
        self.waits = waits
        self.memory_limit = memory_limit
        self.started_at = launched_at or time.time()
        self.marks: dict[str, float] = {}
        self.pod: Any = None
        self.gone = False  # a DELETED watch event was seen
        self.events_seen: list[tuple[str, str]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._deleting = False
        self._done = threading.Event()
        self._count = 0  # protocol lines handed on
        self._partial = b""  # what the followed log held after its last newline when the stream ended
        self._saw_error = False
        self._log_response: Any = None
        self._code: int | None = None
        self._api_ok_at = time.monotonic()  # the last answer from the API server about this pod
        self._create(body)
        self._nodes = watch.nodes(cluster)  # its node's Ready condition, from the process's one node watch
        selector = f"metadata.name={self.name}"
        self._pod_watch = watch.Follow(cluster.core.list_namespaced_pod, (self.namespace,), self._on_pod,
                                       self._answered, watch.POD_WATCH_S, field_selector=selector)
        self._event_watch = watch.Follow(cluster.core.list_namespaced_event, (self.namespace,), self._on_event,
                                         self._answered, watch.POD_WATCH_S,
                                         field_selector=f"involvedObject.name={self.name}")
        self._threads = [threading.Thread(target=self._supervise, daemon=True)]
        for t in self._threads:
            t.start()

    # -- creation and deletion -------------------------------------------------------------------

    def _create(self, body: dict[str, Any]) -> None:
        ApiException = client_module().client.exceptions.ApiException
        try:
            self.cluster.core.create_namespaced_pod(self.namespace, body, _request_timeout=30)
        except ApiException as exc:
            raise EnvironmentUnavailable(f"the cluster refused pod {self.name}: {api_message(exc)}") from None
        except Exception as exc:
            raise EnvironmentUnavailable(f"pod {self.name} could not be created: {exc}") from None
        self._mark("pod_created_s")

    def delete(self, grace_s: int = 2) -> None:
        """Delete the pod and wait until it is gone; a pod whose node is lost (it never confirms) is removed
        with grace period 0. Safe to call more than once. (The package ConfigMap is the run's: kube/package.py.)"""
        self._deleting = True
        self._stop.set()
        self._close_log()
        self._event_watch.stop()
        try:
            self._delete(grace_s)
        finally:
            self._pod_watch.stop()

    def _delete(self, grace_s: int) -> None:
        """Delete until gone: the pod's watch says so (a DELETED event); a read every 2 s in case it lags."""
        ApiException = client_module().client.exceptions.ApiException
        deadline = time.monotonic() + self.waits.delete
        grace = grace_s
        while time.monotonic() < deadline:
            try:
                self.cluster.core.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=grace,
                                                        _request_timeout=10)
            except ApiException as exc:
                if exc.status == 404:
                    break
            except Exception:  # API away for a moment: try again
                pass
            end = min(deadline, time.monotonic() + (grace_s + 10 if grace else 5))
            while time.monotonic() < end:
                with self._cond:
                    if self._cond.wait_for(lambda: self.gone, timeout=min(2.0, max(0.0, end - time.monotonic()))):
                        return
                try:
                    self.cluster.core.read_namespaced_pod(self.name, self.namespace, _request_timeout=5)
                except ApiException as exc:
                    if exc.status == 404:
                        return
                except Exception:
                    pass
            grace = 0  # the kubelet did not confirm in time (node lost, kubelet stopped): remove the object

    # -- the process-like interface --------------------------------------------------------------

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError
        return -1 if self._code is None else self._code

    def kill(self, grace_s: float = 3.0) -> None:
        if self._killed:
            return
        self._killed = True
        self.delete(int(grace_s))
        self._done.wait(10)

    def close(self) -> None:
        if self._killed:
            return
        self._killed = True
        self.delete(0)

    # -- observation -----------------------------------------------------------------------------

    def _mark(self, stage: str) -> None:
        self.marks.setdefault(stage, time.time() - self.started_at)

    def _answered(self) -> None:
        self._api_ok_at = time.monotonic()

    def _on_pod(self, kind: str, pod: Any) -> None:
        with self._cond:
            if kind == "DELETED":
                self.gone = True
            else:
                self.pod = pod
                if (_condition(pod, "PodScheduled") or _Nothing).status == "True":
                    self._mark("pod_scheduled_s")
                cs = _container_status(pod)
                if cs is not None and cs.state and (cs.state.running or cs.state.terminated):
                    self._mark("pod_image_ready_s")
                    self._mark("pod_started_s")
            self._cond.notify_all()

    def _on_event(self, kind: str, event: Any) -> None:
        with self._cond:
            if kind != "DELETED":
                self.events_seen.append((event.reason or "", event.message or ""))
                if event.reason == "Pulled":
                    self._mark("pod_image_ready_s")
                elif event.reason == "Scheduled":
                    self._mark("pod_scheduled_s")
            self._cond.notify_all()

    def _fresh(self) -> Any:
        """The pod now (a read, for the moments where the watch may lag)."""
        try:
            pod = self.cluster.core.read_namespaced_pod(self.name, self.namespace, _request_timeout=10)
            self._api_ok_at = time.monotonic()
            return pod
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                self._api_ok_at = time.monotonic()
                self.gone = True
            return self.pod

    # -- the trial -------------------------------------------------------------------------------

    def _supervise(self) -> None:
        fault: Fault | None = None
        try:
            self._wait_started()
            self._follow()
            self._finish()
        except Fault as exc:
            fault = exc
        except Exception as exc:  # a client failure gpuvs did not foresee: still one line, still cleaned up
            fault = Fault("unavailable", f"pod {self.name}: {type(exc).__name__}: {exc}")
        finally:
            if fault is not None and not self._deleting and not self._saw_error:
                self._emit(events.error(fault.kind, fault.message))
            for stage in STAGES:
                if stage in self.marks:
                    self._emit(events.startup(stage, self.marks[stage]))
            if self._code is not None:
                self._emit(events.startup("launch_to_exit_s", self.marks.get("exit", time.time() - self.started_at)))
            if fault is not None and self._code is None:
                self._code = -1
            self.put(None)
            self._done.set()
            watch.release(self._nodes)

    def _emit(self, event: dict[str, Any]) -> None:
        self.put(events.encode(event) + "\n")

    def _outside_faults(self, pod: Any) -> None:
        """Faults at any moment: deleted by someone else, evicted or failed by the kubelet."""
        if self._deleting:
            raise Fault("interrupted", "stopped")
        silence = max(self.waits.node_lost, API_SILENCE_MIN_S)
        away = time.monotonic() - max(self._api_ok_at, self._nodes.answered_at)
        if away > silence:  # the watches heard nothing for long: a quiet pod, or an API away? one read tells
            pod = self._fresh() or pod
            away = time.monotonic() - max(self._api_ok_at, self._nodes.answered_at)
        if away > silence:
            raise Fault("crash", f"the API server at {self.cluster.host} has not answered for {away:.0f} s: pod "
                                 f"{self.name}'s state is unknown")
        if self.gone or (pod is not None and pod.metadata.deletion_timestamp):
            preempted = self._preempted()
            if preempted is not None:  # a real job took the node: a failed trial with that reason, never a slow one
                raise Fault("preempted", f"pod {self.name} was preempted by the scheduler: {preempted}")
            raise Fault("crash", f"pod {self.name} was deleted from outside gpuvs before the worker finished")
        if pod is not None and pod.status and pod.status.phase == "Failed" and pod.status.reason:
            cs = _container_status(pod)
            ran = cs is not None and cs.state and cs.state.terminated
            if pod.status.reason == "DeadlineExceeded":
                raise Fault("timeout", f"pod {self.name} passed its activeDeadlineSeconds and was stopped by the "
                                       "cluster")
            if pod.status.reason == "Evicted":
                raise Fault("crash", f"pod {self.name} was evicted from node {pod.spec.node_name}: "
                                     f"{pod.status.message or ''}".rstrip(": "))
            if not ran:
                raise Fault("unavailable", f"node {pod.spec.node_name} refused pod {self.name}: {pod.status.reason}: "
                                           f"{pod.status.message or ''}".rstrip(": "))

    def _preempted(self) -> str | None:
        """The scheduler's Preempted event for this pod (its message names the pod that took its place), else
        None. Read once more from the API when the watch has not brought it yet: the pod's deletion and the
        event arrive on two watches."""
        for reason_, message in list(self.events_seen):
            if reason_ == "Preempted":
                return message or "Preempted"
        try:
            found = self.cluster.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name="
                                                            f"{self.name}", _request_timeout=10).items
        except Exception:
            return None
        return next(((e.message or "Preempted") for e in found if e.reason == "Preempted"), None)

    def _wait_started(self) -> None:
        t0 = time.monotonic()
        unschedulable_since = None
        while True:
            with self._cond:
                self._cond.wait(0.5)
                pod = self.pod
                seen = list(self.events_seen)
            self._outside_faults(pod)
            now = time.monotonic()
            if pod is None:
                if now - t0 > self.waits.start:
                    raise Fault("unavailable", f"pod {self.name} was not seen within {self.waits.start:g} s")
                continue
            cs = _container_status(pod)
            if cs is not None and cs.state and (cs.state.running or cs.state.terminated):
                return
            sched = _condition(pod, "PodScheduled")
            if sched is not None and sched.status == "False" and sched.reason == "Unschedulable":
                unschedulable_since = unschedulable_since or now
                if now - unschedulable_since >= self.waits.schedule:
                    raise Fault("unavailable", f"pod {self.name} could not be scheduled within {self.waits.schedule:g} "
                                               f"s: {sched.message}")
                continue
            unschedulable_since = None
            waiting = cs.state.waiting if cs is not None and cs.state else None
            if waiting is not None and waiting.reason in IMAGE_FAILURES:
                raise Fault("unavailable", f"image {self.image} cannot be used on node {pod.spec.node_name}: "
                                           f"{waiting.reason}: {waiting.message or ''}".rstrip(": "))
            if waiting is not None and waiting.reason in CONFIG_FAILURES:
                hint = ""
                if "runAsNonRoot" in (waiting.message or ""):  # --pod-security restricted on a root image
                    hint = " (give --run-as-user UID of a non-root user, or --pod-security baseline)"
                raise Fault("unavailable", f"the container of pod {self.name} could not be created: "
                                           f"{waiting.reason}: {_runtime_message(waiting.message)}".rstrip(": ") + hint)
            if now - t0 > self.waits.start:
                state = waiting.reason if waiting is not None else (pod.status.phase if pod.status else "unknown")
                last = "; ".join(f"{r}: {m}" for r, m in seen[-3:]) or "no events"
                raise Fault("unavailable", f"pod {self.name} did not start within {self.waits.start:g} s (state "
                                           f"{state}; last events: {last})")

    def _follow(self) -> None:
        """Follow the log while the container runs; open it again when the stream breaks."""
        monitor = threading.Thread(target=self._monitor, daemon=True)
        self._fault: Fault | None = None
        monitor.start()
        while True:
            broke = False
            try:
                self._stream_once()
            except Exception:  # the stream broke: the pod says whether to read on
                broke = True
            if self._fault is not None:
                raise self._fault
            pod = self._fresh()
            self._outside_faults(pod)
            cs = _container_status(pod) if pod is not None else None
            if cs is not None and cs.state and cs.state.terminated:
                # the container ended while the stream was broken, or its last line had no newline (left over in
                # the stream): what it wrote last is read whole, and a log that cannot be read fails the trial
                if broke or self._partial:
                    self._read_rest()
                return
            self._stop.wait(0.5)

    def _read_rest(self) -> None:
        """The finished container's log read once more, whole, for the lines after those already taken; a log that
        cannot be read fails the trial (a partial read is never a result)."""
        try:
            text = self.cluster.core.read_namespaced_pod_log(self.name, self.namespace, container=CONTAINER,
                                                             _request_timeout=120)
        except Exception as exc:
            raise Fault("crash", f"pod {self.name}: gpuvs could not read its log to the end ({type(exc).__name__}: "
                                 f"{exc}); the trial's figures would not be its own") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for seen, raw in enumerate(lines, 1):
            if seen > self._count:
                self._line(raw)

    def _stream_once(self) -> None:
        resp = self.cluster.core.read_namespaced_pod_log(self.name, self.namespace, container=CONTAINER, follow=True,
                                                          _preload_content=False, _request_timeout=120)
        self._log_response = resp
        seen = 0
        buf = b""
        self._partial = b""
        try:
            # what has arrived, as it arrives (stream(64 KiB) would wait for 64 KiB); urllib3 1.x has no read1
            chunks = iter(lambda: resp.read1(64 * 1024), b"") if hasattr(resp, "read1") else resp.stream(1)
            for chunk in chunks:
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    seen += 1
                    if seen > self._count:
                        self._line(raw.decode(errors="replace"))
        finally:
            self._partial = buf  # a last line without its newline: handed on from the whole log (_read_rest)
            self._log_response = None
            resp.release_conn()

    def _close_log(self) -> None:
        resp = self._log_response
        if resp is not None:
            try:
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
            except Exception:
                pass

    def _line(self, text: str) -> None:
        self._count += 1
        self._mark("pod_first_line_s")
        event = events.decode(text)
        self.put(text + "\n")  # the runner reads events only; a probe's JSON line passes too
        if event is None:
            self.stderr_tail.append(text)
            return
        if event["type"] == "sample":
            self._mark("pod_first_result_s")
        elif event["type"] == "error":  # the worker's own reason, unless it only says it was stopped from outside
            self._saw_error = event.get("kind") != "interrupted"

    def _monitor(self) -> None:
        """While the log is followed: a node that stops being Ready for too long, a pod deleted or evicted."""
        not_ready_since = None
        while self._fault is None and not self._stop.wait(1.0):
            pod = self.pod
            try:
                self._outside_faults(pod)
            except Fault as exc:
                if exc.kind != "interrupted":
                    self._fault = exc
                self._close_log()
                return
            cs = _container_status(pod) if pod is not None else None
            if cs is not None and cs.state and cs.state.terminated:
                return
            node = pod.spec.node_name if pod is not None else None
            if not node:
                continue
            ready = self._nodes.ready(node)  # None while unknown, or when the API is away: not the node's fault
            if ready is not None and ready.status != "True":
                not_ready_since = not_ready_since or time.monotonic()
                if time.monotonic() - not_ready_since >= self.waits.node_lost:
                    self._fault = Fault("crash", f"node {node} was lost while pod {self.name} ran (Ready="
                                                 f"{ready.status}: {ready.message or ready.reason})")
                    self._close_log()
                    return
            else:
                not_ready_since = None

    def _finish(self) -> None:
        """The container has ended: the rest of its log, its exit status, and why it ended."""
        deadline = time.monotonic() + 30
        pod = self._fresh()
        while True:
            self._outside_faults(pod) if not _terminated(pod) else None
            if _terminated(pod) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
            pod = self._fresh()
        self.marks.setdefault("exit", time.time() - self.started_at)
        try:
            text = self.cluster.core.read_namespaced_pod_log(self.name, self.namespace, container=CONTAINER,
                                                              _request_timeout=30)
        except Exception:
            text = ""
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for raw in lines[self._count:]:
            self._line(raw)
        term = _terminated(pod)
        if term is None:
            raise Fault("crash", f"pod {self.name}: its log ended but the container was not seen to end")
        self._code = term.exit_code
        if term.exit_code != 0 and (self.gone or pod.metadata.deletion_timestamp) and not self._deleting:
            self._outside_faults(pod)  # it ended because someone deleted it: that is the reason, not the SIGTERM
        if term.reason in START_FAILURES and not self._count:
            raise Fault("unavailable", f"the container of pod {self.name} could not start: {term.reason}: "
                                       f"{_runtime_message(term.message)}")
        if term.reason == "OOMKilled" and not self._saw_error:
            limit = f" of {self.memory_limit} (--memory)" if self.memory_limit else ""
            raise Fault("oom", f"the worker was OOMKilled in pod {self.name}: it went over the container's memory "
                               f"limit{limit}")
        if pod.status and pod.status.reason == "Evicted":
            self._outside_faults(pod)


def _runtime_message(message: str | None) -> str:
    """The runtime's own reason out of a long containerd/runc message ("... error during container init: X")."""
    text = (message or "").strip()
    for marker in ("error during container init: ", "OCI runtime create failed: "):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    return text.removesuffix(": unknown")[:400]


def _terminated(pod: Any) -> Any:
    cs = _container_status(pod) if pod is not None else None
    return cs.state.terminated if cs is not None and cs.state else None


class _Nothing:
    status = None

