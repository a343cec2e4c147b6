"""Bare mode in a pod: the command is the pod's own container process (an image with no Python).

The pod is watched as a worker's is (podrun.py), but its log is the job's output, stdout and stderr merged.
Its wall time is the kubelet's record of the container, in whole seconds, said with the figure."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpuvs import events
from gpuvs.environments.rawjob import RawJob
from gpuvs.kube.client import Cluster
from gpuvs.environments.pod.podrun import PodLaunched, Waits, _container_status


def bare_manifest(body: dict[str, Any], argv: list[str], workdir: str | None) -> dict[str, Any]:
    """A worker's pod (environments/pod.manifest, without gpuvs's package) turned into the command's own: its argv
    as the container's command (never through a shell), its working directory, and only the user's variables."""
    container = body["spec"]["containers"][0]
    container["command"] = list(argv)
    if workdir:
        container["workingDir"] = workdir
    container["env"] = [e for e in container["env"] if not e["name"].startswith("GPUVS_")]
    return body


class _BarePod(PodLaunched):
    """A pod whose log lines are the job's output: each is handed to the job, never read as an event."""

    def __init__(self, job: "PodJob", *args: Any, **kwargs: Any):
        self.job = job
        super().__init__(*args, **kwargs)

    def _line(self, text: str) -> None:
        self._count += 1
        self._mark("pod_first_line_s")
        self.job.output.put(("stdout", (text + "\n").encode(), time.time()))


class PodJob(RawJob):
    streams = ("stdout",)  # a pod's log is one stream
    unmeasured = ("the command is the pod's own process (no Python needed in the image): no fingerprint taken "
                  "inside, no NVML telemetry during the run, no start-up breakdown inside the job; stdout and stderr "
                  "come merged in the pod's log; its wall time is the kubelet's record of the container, in whole "
                  "seconds")

    def __init__(self, cluster: Cluster, body: dict[str, Any], waits: Waits, memory_limit: str | None,
                 launched_at: float):
        super().__init__()
        self.launched_at = launched_at
        self._events: list[dict[str, Any]] = []
        self._failure: tuple[str, str] | None = None
        self._ended = threading.Event()
        self.pod = _BarePod(self, cluster, body, waits, memory_limit=memory_limit, launched_at=launched_at)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        """The pod's own events (start-up stages, its failure) until it is done; then the output has ended."""
        while True:
            line = self.pod.lines.get()
            if line is None:
                break
            event = events.decode(line)
            if event is None:
                continue
            if event["type"] == "error":
                self._failure = (event.get("kind") or "crash", event.get("message") or "")
            elif event["type"] == "startup" and event.get("name") != "launch_to_exit_s":
                self._events.append(event)
        self._ended.set()
        self.output.put(None)

    def running(self) -> bool:
        return self.pod.running()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            self.pod.wait(timeout)
        except TimeoutError:
            return None
        self._ended.wait(10)
        return self.pod._code if self._failure is None or self.pod._code not in (None, -1) else None

    def _terminated(self) -> Any:
        pod = self.pod._fresh()
        cs = _container_status(pod) if pod is not None else None
        return cs.state.terminated if cs is not None and cs.state else None

    def timings(self) -> dict[str, Any]:
        term = self._terminated()
        if term is None or term.started_at is None or term.finished_at is None:
            return {"wall_s": None, "clock": "the kubelet's record of the container (not available)",
                    "resolution_s": None, "startup": {}}
        return {"wall_s": (term.finished_at - term.started_at).total_seconds(), "resolution_s": 1.0,
                "clock": "the kubelet's record of the container: state.terminated.startedAt to finishedAt",
                "startup": {}}

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def facts(self) -> dict[str, Any]:
        pod = self.pod.pod
        cs = _container_status(pod) if pod is not None else None
        fp: dict[str, Any] = {"taken_by": "gpuvs, from the pod's status and its node (bare: nothing run inside)",
                              "in_pod": True, "container_image": self.pod.image}
        if pod is not None and pod.spec.node_name:
            fp["node_name"] = pod.spec.node_name
            try:
                info = self.pod.cluster.core.read_node(pod.spec.node_name, _request_timeout=10).status.node_info
                fp.update(kernel=info.kernel_version, kubelet=info.kubelet_version,
                          container_runtime=info.container_runtime_version)
            except Exception:  # the node's details are a courtesy: the API away for a moment loses only them
                pass
        if cs is not None and cs.image_id:
            fp["image_id"] = cs.image_id
        return fp

    def failure(self, code: int | None) -> tuple[str, str] | None:
        return self._failure

    def kill(self) -> None:
        self.pod.kill()

    def close(self) -> None:
        self.pod.close()
