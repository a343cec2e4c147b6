"""Long-lived watches, kept as client-go's reflectors keep theirs: opened again from the last resourceVersion.

After an error or 410 Gone a watch starts from scratch, every object ADDED, so no state is missed.
`Follow` is one such watch on a thread. `nodes(cluster)` is the one node watch a process shares among all its pods.
It also says when the API server last answered, to tell a silent API from a quiet pod."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpuvs.kube.client import Cluster, client_module

NODE_WATCH_S = 20  # the shared node watch is opened again this often: the API server is heard from at least this often
POD_WATCH_S = 300  # a pod's own watches (the pod, its events) last this long before they are opened again


class Follow:
    """One watch on its own thread until stop(): handle(event type, object) for every event but bookmarks,
    answered() whenever the API server answers (an event, a watch opened, a watch it ended on its own timeout)."""

    def __init__(self, lister: Callable[..., Any], args: tuple, handle: Callable[[str, Any], None],
                 answered: Callable[[], None], timeout_s: int, give_up: Callable[[int], bool] | None = None,
                 **selectors: str):
        self.lister, self.args, self.handle, self.answered = lister, args, handle, answered
        self.timeout_s, self.selectors = timeout_s, selectors
        self.give_up = give_up or (lambda status: False)
        self.opened = 0  # watch requests made (tests count them against the API server's own counters)
        self._stopped = threading.Event()
        self._watch: Any = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self, wait_s: float = 2.0) -> None:
        """End the watch now: its open request is shut (the client's Watch.stop shuts the socket)."""
        self._stopped.set()
        if threading.current_thread() is self.thread:
            return
        deadline = time.monotonic() + wait_s
        while self.thread.is_alive() and time.monotonic() < deadline:
            with self._lock:
                w = self._watch
            if w is not None:
                w.stop()  # again while it runs: a stop before its response arrived found no socket to shut
            self.thread.join(0.1)

    def _run(self) -> None:
        k8s = client_module()
        ApiException = k8s.client.exceptions.ApiException
        version = None
        while not self._stopped.is_set():
            w = k8s.watch.Watch()
            with self._lock:
                self._watch = w
            kwargs: dict[str, Any] = {**self.selectors, "timeout_seconds": self.timeout_s,
                                      "allow_watch_bookmarks": True, "_request_timeout": self.timeout_s + 15}
            if version:
                kwargs["resource_version"] = version
            try:
                self.opened += 1
                for ev in w.stream(self.lister, *self.args, **kwargs):
                    self.answered()
                    version = w.resource_version or version  # bookmarks move it too
                    if ev["type"] != "BOOKMARK":
                        self.handle(ev["type"], ev["object"])
                    if self._stopped.is_set():
                        break
                else:
                    if not self._stopped.is_set():
                        self.answered()  # a quiet watch the server ended on its own timeout: the API answers
            except ApiException as exc:  # 410 Gone (the version expired): from scratch; forbidden: stop
                version = None
                if self.give_up(exc.status or 0):
                    self._stopped.set()
                self._stopped.wait(0.5)
            except Exception:  # the API away, the socket shut by stop()
                version = None
                self._stopped.wait(0.5)


class Nodes:
    """Every node's Ready condition as the shared node watch last saw it, and when the API server last answered."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.answered_at = time.monotonic()
        self.users = 0
        self._ready: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.follow = Follow(cluster.core.list_node, (), self._on_node, self._answered, NODE_WATCH_S,
                             give_up=lambda status: status in (401, 403))  # may not watch nodes: as it could not read one

    def _answered(self) -> None:
        self.answered_at = time.monotonic()

    def _on_node(self, kind: str, node: Any) -> None:
        name = node.metadata.name
        with self._lock:
            if kind == "DELETED":
                self._ready.pop(name, None)
                return
            ready = None
            for c in (node.status and node.status.conditions) or []:
                if c.type == "Ready":
                    ready = c
            self._ready[name] = ready

    def ready(self, name: str) -> Any:
        """The node's Ready condition (status, reason, message), or None while it is not known."""
        with self._lock:
            return self._ready.get(name)


_SHARED: dict[int, Nodes] = {}
_LOCK = threading.Lock()


def nodes(cluster: Cluster) -> Nodes:
    """The process's node watch on this cluster, started on first use; give it back with release()."""
    with _LOCK:
        shared = _SHARED.get(id(cluster))
        if shared is None or shared.follow.stopped():
            shared = _SHARED[id(cluster)] = Nodes(cluster)
        shared.users += 1
        return shared


def release(shared: Nodes) -> None:
    """One pod less uses the node watch; the last one ends it (the next pod starts it again)."""
    with _LOCK:
        shared.users -= 1
        if shared.users > 0:
            return
        if _SHARED.get(id(shared.cluster)) is shared:
            del _SHARED[id(shared.cluster)]
    shared.follow.stop()
