"""nlp-serve: the gpuvs serve gRPC server as a workload, so that it runs wherever workers run (on the
host, in a container with its port published) and its own view is stored like any trial's: calls
served per second in each window, and the server-side time of each call.

It serves for --seconds (0: until stopped; the trial then ends as interrupted), then stops as
gpuvs serve does on SIGTERM: calls in flight get --grace seconds, the rest are cancelled."""

from __future__ import annotations

import queue
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.workloads import register
from gpuvs.workloads.base import Param, RunContext, Workload


@register
class NlpServe(Workload):
    name = "nlp-serve"
    summary = "the NLP gRPC server as a workload: calls served per second, server-side call times"
    unit = "calls/sec"
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
    )

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import numpy as np

        from gpuvs.errors import WorkloadError
        from gpuvs.serve.server import NlpServer
        from gpuvs.serve.validate import Limits

        p = ctx.params
        calls: queue.Queue = queue.Queue()
        server = NlpServer(p["host"], p["port"], ctx.device, p["models_dir"],
                           Limits(max_message_bytes=int(p["max_message_mb"] * (1 << 20))),
                           on_request=lambda *row: calls.put(row), threads=p["threads"])
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
                                    items=len(rows), texts=sum(r[2] for r in rows if r[0] == "Predict"))
                edge = now
        finally:
            server.stop(p["grace"])
        by_method: dict[str, list[float]] = {}
        for method, sec, _, code in served:
            by_method.setdefault(method, []).append(sec)
            if code != "OK":
                by_method.setdefault("refused", []).append(sec)
        for method, secs in sorted(by_method.items()):
            yield events.metric(f"{method.lower()}_calls", len(secs))
        if "Predict" in by_method:
            ms = np.asarray(by_method["Predict"]) * 1000.0
            for q in (50, 99):
                yield events.metric(f"predict_server_p{q}_ms", float(np.percentile(ms, q)), "ms")
