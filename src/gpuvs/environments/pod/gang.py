"""One trial across nodes (--num-nodes N): N pods, one per node, started together, as one worker stream.

The rendezvous is torch.distributed's store in the first pod, at its pod IP: no Service, no cluster DNS.
A required pod anti-affinity keeps the pods on distinct nodes; the scheduler still weighs everything else.
A pod that fails fails the trial, every pod is deleted, and only the first pod's lines are the trial's (docs/pod.md)."""

from __future__ import annotations

import copy
import threading
import time
import zlib
from typing import Any

from gpuvs import events
from gpuvs.environments.environment import WorkerStream
from gpuvs.environments.pod.podrun import PodLaunched, Waits
from gpuvs.kube.client import Cluster

NODE_RANK = "gpuvs.io/node-rank"
SETTLE_S = 30.0  # after the first pod ends, how long the others may take to end (their ranks finish together)
PEER_GRACE_S = 5.0  # a rank 0 error waits this long for another pod's: a peer that died is the cause, rank 0's
# "Connection reset by peer" its echo


def store_port(run_id: str) -> int:
    """The store's port: fixed for a run (every pod is told it), spread by run id where pods share the node's
    network (--host-network)."""
    return 20000 + zlib.crc32(run_id.encode()) % 10000


def bodies(body: dict[str, Any], nodes: int, run_id_label: str) -> list[dict[str, Any]]:
    """The N pods of one trial from the one pod's manifest: names -n0..-n{N-1}, each's node rank, the store's port,
    and the anti-affinity that puts each on a node of its own (beside a node affinity --gang-nodes set; plain data: tested without a cluster)."""
    run_id = body["metadata"]["labels"][run_id_label]
    out = []
    for i in range(nodes):
        b = copy.deepcopy(body)
        b["metadata"]["name"] = f"{body['metadata']['name']}-n{i}"
        b["metadata"]["labels"][NODE_RANK] = str(i)
        env = b["spec"]["containers"][0]["env"]
        extra = {"GPUVS_NUM_NODES": str(nodes), "GPUVS_NODE_RANK": str(i), "GPUVS_MASTER_PORT": str(store_port(run_id))}
        if i == 0:
            extra["GPUVS_MASTER_ADDR"] = "127.0.0.1"  # rank 0 holds the store; the others get this pod's IP
        env[-1:-1] = [{"name": k, "value": v} for k, v in extra.items()]  # GPUVS_SPEC stays last
        b["spec"].setdefault("affinity", {})["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {run_id_label: run_id}}, "topologyKey": "kubernetes.io/hostname"}]}
        out.append(b)
    return out


class GangLaunched(WorkerStream):
    """N pods as one worker: the first pod's protocol lines, a failure of any pod, every pod deleted at the end."""

    def __init__(self, cluster: Cluster, pods: list[dict[str, Any]], waits: Waits, memory_limit: str | None = None,
                 launched_at: float | None = None):
        super().__init__()
        self.cluster, self.waits, self.memory_limit = cluster, waits, memory_limit
        self.launched_at = launched_at
        self._bodies = pods
        self._lock = threading.Lock()
        self._stopping = False
        self._failure: dict[str, Any] | None = None  # the first error event of a pod other than the first
        self._first_failed = False  # the first pod's own error line was handed on
        self._done = threading.Event()
        self._other_failed = threading.Event()
        self.pods: list[PodLaunched] = [PodLaunched(cluster, pods[0], waits, memory_limit, launched_at)]
        self.stderr_tail = self.pods[0].stderr_tail
        self._readers: list[threading.Thread] = []
        for target in (self._forward, self._start_others):
            threading.Thread(target=target, daemon=True).start()

    @property
    def names(self) -> list[str]:
        return [b["metadata"]["name"] for b in self._bodies]

    # -- the other pods --------------------------------------------------------------------------

    def _first_ip(self) -> str | None:
        first = self.pods[0]
        deadline = time.monotonic() + self.waits.schedule + self.waits.start
        while not self._stopping and first.running() and time.monotonic() < deadline:
            pod = first.pod
            ip = pod.status.pod_ip if pod is not None and pod.status else None
            if ip:
                return ip
            time.sleep(0.2)
        return None  # the first pod's own stream says why (unschedulable, not started, stopped)

    def _start_others(self) -> None:
        ip = self._first_ip()
        if ip is None:
            return
        for body in self._bodies[1:]:
            env = body["spec"]["containers"][0]["env"]
            env.insert(len(env) - 1, {"name": "GPUVS_MASTER_ADDR", "value": ip})
            with self._lock:
                if self._stopping or self._failure is not None:
                    return
                try:
                    pod = PodLaunched(self.cluster, body, self.waits, self.memory_limit, self.launched_at)
                except Exception as exc:  # the cluster refused it: the trial's reason
                    self._fail(events.error("unavailable", str(exc)))
                    return
                self.pods.append(pod)
            reader = threading.Thread(target=self._watch_other, args=(pod,), daemon=True)
            self._readers.append(reader)
            reader.start()

    def _watch_other(self, pod: PodLaunched) -> None:
        """A pod other than the first: its lines are not the trial's, but its error (or a failed exit) is."""
        for line in pod.read(None):
            event = events.decode(line)
            if event is not None and event.get("type") == "error" and event.get("kind") != "interrupted":
                message = str(event.get("message") or "")
                if pod.name not in message:
                    message = f"pod {pod.name}: {message}"
                self._fail({**event, "message": message})
        try:
            code = pod.wait(5)
        except TimeoutError:
            code = 0
        if code not in (0, None) and not self._stopping:
            self._fail(events.error("crash", f"pod {pod.name}: its worker exited with status {code}"))

    def _fail(self, event: dict[str, Any]) -> None:
        """The first failure of a pod other than the first fails the trial: every pod is stopped."""
        with self._lock:
            if self._failure is not None or self._stopping:
                return
            self._failure = event
        self._other_failed.set()
        self._end_pods(lambda p: p.kill(2))

    # -- the first pod: the trial's lines ----------------------------------------------------------

    def _forward(self) -> None:
        try:
            for line in self.pods[0].read(None):
                event = events.decode(line)
                if event is not None and event.get("type") == "error":
                    # the cluster's own reason about the first pod names it, and stands; a rank's error waits a
                    # moment for another pod's, which is then the trial's (the rank's is its echo)
                    own = f"pod {self.pods[0].name}" in str(event.get("message") or "")
                    if not own and len(self._bodies) > 1 and self._other_failed.wait(PEER_GRACE_S):
                        continue
                    self._first_failed = True
                self.put(line)
            deadline = time.monotonic() + SETTLE_S
            while self._failure is None and not self._stopping and time.monotonic() < deadline and any(
                    p.running() for p in self.pods[1:]):
                time.sleep(0.2)
            for reader in list(self._readers):
                reader.join(max(0.0, deadline - time.monotonic()))
            if self._failure is not None and not self._first_failed:
                self.put(events.encode(self._failure) + "\n")
        finally:
            self.put(None)
            self._done.set()

    # -- the process-like interface --------------------------------------------------------------

    def _end_pods(self, how) -> None:
        with self._lock:
            self._stopping = self._stopping or self._failure is None
            pods = list(self.pods)
        threads = [threading.Thread(target=how, args=(p,), daemon=True) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError
        if self._failure is not None and not self._first_failed:
            return 1
        try:
            return self.pods[0].wait(5)
        except TimeoutError:
            return -1

    def kill(self, grace_s: float = 3.0) -> None:
        if self._killed:
            return
        self._killed = True
        self._end_pods(lambda p: p.kill(grace_s))
        self._done.wait(10)

    def close(self) -> None:
        if self._killed:
            return
        self._killed = True
        self._end_pods(lambda p: p.close())
