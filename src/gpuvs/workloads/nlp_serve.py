"""nlp-serve: the gpuvs serve gRPC server as a workload, so that it runs wherever workers run.

Its own view is stored like any trial's: calls served per window, and at the end the server's Metrics.
It serves for --seconds (0: until stopped), then stops as gpuvs serve does on SIGTERM."""

from __future__ import annotations

import queue
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.params import Param
from gpuvs.serve import settings as cfg
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, amount, duration, rate


@register
class NlpServe(Workload):
    name = "nlp-serve"
    summary = "the NLP gRPC server as a workload: calls served per second, server-side call times"
    unit = "calls/sec"
    metrics = (rate("served", headline=True), amount("*_calls", "neither", tested=False), duration("*_ms"),
               amount("refused*"), amount("cancelled"), amount("deadline_exceeded"), amount("evictions"),
               amount("unauthenticated", "neither", tested=False), amount("peak_*", "neither", tested=False),
               amount("models_loaded", "neither", tested=False), amount("*_mib"))
    requires = ("torch", "grpc", "google.protobuf")
    params = (
        Param("port", int, 50051, "TCP port (0: any free one; the one taken is logged)", min=0, max=65535),
        Param("host", str, "127.0.0.1", "address to listen on (0.0.0.0 in a container whose port is published)"),
        Param("seconds", float, 60.0, "how long to serve (0: until stopped)", min=0.0, max=7 * 86400.0),
        Param("models_dir", str, "gpuvs-models", "folder of the saved models"),
        Param("max_message_mb", float, 4.0, "largest request accepted, in MiB", min=0.001, max=2047.0),
        Param("grace", float, 5.0, "seconds calls in flight get to finish when it stops", min=0.0, max=3600.0),
        Param("window", float, 1.0, "seconds per sample", min=0.01, max=3600.0),
        Param("threads", int, 0, "CPU threads torch uses (0: its default)", min=0, max=4096),
        Param("max_in_flight", int, cfg.MAX_IN_FLIGHT, "Train/Predict/Load calls that run at once", min=1, max=1024),
        Param("max_queue", int, cfg.MAX_QUEUE, "calls that wait for a slot", min=0, max=4096),
        Param("queue_timeout", float, cfg.QUEUE_TIMEOUT_S, "seconds a call may wait in the queue", min=0.001,
              max=3600.0),
        Param("max_trains", int, cfg.MAX_TRAINS, "Trains that run at once; one more is refused", min=1, max=64),
        Param("model_cache_mb", float, cfg.MODEL_CACHE_MB, "memory for loaded models (LRU past it)", min=0.001,
              max=float(1 << 20)),
        Param("tls_cert", str, "", "the server's certificate (PEM): serve over TLS"),
        Param("tls_key", str, "", "its private key (PEM)"),
        Param("token_file", str, "", "file holding the token every call must send"),
        Param("insecure", bool, False, "allow plain text without a token off loopback"),
    )

    def check(self, params: dict[str, Any]) -> None:
        self._config(params, "cpu").check()

    @staticmethod
    def _config(p: dict[str, Any], device: str) -> cfg.ServeConfig:
        from gpuvs.serve.security import Security
        from gpuvs.serve.request_checks import Limits

        return cfg.ServeConfig(p["host"], p["port"], device, p["models_dir"],
                               Limits(max_message_bytes=int(p["max_message_mb"] * (1 << 20))), p["max_in_flight"],
                               p["max_queue"], p["queue_timeout"], p["max_trains"], p["model_cache_mb"], p["threads"],
                               Security(p["tls_cert"], p["tls_key"], p["token_file"], p["insecure"]))

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import numpy as np

        from gpuvs.errors import WorkloadError
        from gpuvs.serve.server import NlpServer

        p = ctx.params
        calls: queue.Queue = queue.Queue()
        server = NlpServer(self._config(p, ctx.device), on_request=lambda *row: calls.put(row))
        try:
            port = server.start()
        except OSError as exc:
            raise WorkloadError("input", str(exc)) from None
        yield events.startup("warm_up_s", server.ready_s)
        served: list[tuple[str, float, int, str]] = []
        try:
            yield events.config(mode="serving", listen=f"{p['host']}:{port}", device=ctx.device,
                                models_dir=str(server.models_dir), seconds=p["seconds"] or "until stopped")
            yield events.log(f"listening on {p['host']}:{port}")
            start = edge = time.perf_counter()
            end = start + p["seconds"] if p["seconds"] else float("inf")
            step = 0
            while edge < end:
                time.sleep(max(0.0, min(edge + p["window"], end) - time.perf_counter()))
                now = time.perf_counter()
                rows = []
                while not calls.empty():
                    rows.append(calls.get_nowait())
                served.extend(rows)
                step += 1
                yield events.sample(step, len(rows) / (now - edge), "calls/sec", series="served", seconds=now - edge,
                                    items=len(rows), texts=sum(r[2] for r in rows if r[0] == "Predict"),
                                    in_flight=server.admission.in_flight, queued=server.admission.queued)
                edge = now
        finally:
            server.stop(p["grace"])
            final = server.service.snapshot()
        by_method: dict[str, list[float]] = {}
        for method, sec, _, code in served:
            by_method.setdefault(method, []).append(sec)
            if code != "OK":
                by_method.setdefault("failed", []).append(sec)
        for method, secs in sorted(by_method.items()):
            yield events.metric(f"{method.lower()}_calls", len(secs))
        if "Predict" in by_method:
            ms = np.asarray(by_method["Predict"]) * 1000.0
            for q in (50, 99):
                yield events.metric(f"predict_server_p{q}_ms", float(np.percentile(ms, q)), "ms")
        yield from server_metrics(final)


def server_metrics(m) -> Iterator[dict[str, Any]]:
    """A ServerMetrics snapshot as metrics (and one log line)."""
    for name in ("refused", "refused_train", "cancelled", "deadline_exceeded", "unauthenticated", "peak_in_flight",
                 "peak_queued", "evictions"):
        yield events.metric(name, getattr(m, name))
    for c in m.calls:
        for q in ("p50", "p90", "p99"):
            yield events.metric(f"{c.method.lower()}_{q}_ms", getattr(c, f"{q}_ms"), "ms")
    yield events.metric("models_loaded", len(m.models))
    yield events.metric("models_mib", m.models_bytes / 2**20, "MiB")
    yield events.metric("rss_mib", m.rss_bytes / 2**20, "MiB")
    yield events.log(f"server: peaks {m.peak_in_flight} in flight, {m.peak_queued} queued; refused {m.refused}; "
                     f"{len(m.models)} model(s) loaded, {m.models_bytes / 2**20:.1f} MiB; resident "
                     f"{m.rss_bytes / 2**20:.0f} MiB")
