"""What a person watches while loading the server, as one snapshot: a ServerMetrics.

Per-call counts and latency percentiles, over the last WINDOW admitted calls of each method, queue wait included.
The admission figures, the model cache (models, memory, evictions), and the process's memory and torch's.
The Metrics RPC sends it as a MetricsResponse; the nlp-serve workload stores it with its results."""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field

WINDOW = 1000


@dataclass
class MethodStats:
    method: str
    ok: int
    failed: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    window: int


@dataclass
class ServerMetrics:
    device: str
    uptime_s: float
    in_flight: int
    queued: int
    max_in_flight: int
    max_queue: int
    peak_in_flight: int
    peak_queued: int
    refused: int
    refused_train: int
    cancelled: int
    deadline_exceeded: int
    unauthenticated: int
    trains_running: int
    calls: list[MethodStats] = field(default_factory=list)
    models: list[tuple[str, int, float]] = field(default_factory=list)  # name, bytes, idle seconds
    models_bytes: int = 0
    model_cache_bytes: int = 0
    evictions: int = 0
    rss_bytes: int = 0
    gpu_allocated_bytes: int = 0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


class CallLog:
    """Counts and recent latencies per method; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ok: dict[str, int] = {}
        self._failed: dict[str, int] = {}
        self._recent: dict[str, deque[float]] = {}
        self.unauthenticated = 0

    def record(self, method: str, seconds: float, ok: bool) -> None:
        with self._lock:
            counts = self._ok if ok else self._failed
            counts[method] = counts.get(method, 0) + 1
            self._recent.setdefault(method, deque(maxlen=WINDOW)).append(seconds * 1000.0)

    def stats(self) -> list[MethodStats]:
        with self._lock:
            methods = sorted(set(self._ok) | set(self._failed))
            recent = {m: sorted(self._recent.get(m, ())) for m in methods}
            return [MethodStats(m, self._ok.get(m, 0), self._failed.get(m, 0), percentile(recent[m], 50),
                                percentile(recent[m], 90), percentile(recent[m], 99), len(recent[m]))
                    for m in methods]


def rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def gpu_allocated_bytes(device: str) -> int:
    if not device.startswith("cuda"):
        return 0
    import torch

    return int(torch.cuda.memory_allocated(device))


def to_proto(m: ServerMetrics, pb):
    r = pb.MetricsResponse(in_flight=m.in_flight, queued=m.queued, max_in_flight=m.max_in_flight,
                           max_queue=m.max_queue, refused=m.refused, refused_train=m.refused_train,
                           cancelled=m.cancelled, deadline_exceeded=m.deadline_exceeded,
                           unauthenticated=m.unauthenticated, peak_in_flight=m.peak_in_flight,
                           peak_queued=m.peak_queued, models_bytes=m.models_bytes,
                           model_cache_bytes=m.model_cache_bytes, evictions=m.evictions, rss_bytes=m.rss_bytes,
                           gpu_allocated_bytes=m.gpu_allocated_bytes, uptime_s=m.uptime_s,
                           trains_running=m.trains_running, device=m.device)
    for c in m.calls:
        r.calls.add(method=c.method, ok=c.ok, failed=c.failed, p50_ms=c.p50_ms, p90_ms=c.p90_ms, p99_ms=c.p99_ms,
                    window=c.window)
    for name, size, idle in m.models:
        r.models.add(name=name, bytes=size, idle_s=idle)
    return r
