"""gpuvs serve-metrics: a running gpuvs serve's Metrics."""

from __future__ import annotations

import json

from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.errors import UsageError
from gpuvs.params import Param


SERVE_METRICS_OPTIONS = (
    Param("target", str, None, "HOST:PORT of a running gpuvs serve", required=True),
    Param("tls", bool, False, "connect over TLS (trusting the system's CAs)"),
    Param("tls_ca", str, "", "CA certificate (PEM) to trust: connect over TLS"),
    Param("server_name", str, "", "name the server's certificate must carry, when not the target's host"),
    Param("token_file", str, "", "file holding the server's token"),
    Param("json", bool, False, "the whole MetricsResponse as JSON"),
    Param("timeout", float, 10.0, "seconds to wait for the server"),
)


def serve_metrics(args: Args) -> None:
    o = args.options
    target, tls, tls_ca, server_name = o["target"], o["tls"], o["tls_ca"], o["server_name"]
    token_file, as_json, timeout = o["token_file"], o["json"], o["timeout"]
    import grpc
    from google.protobuf import json_format

    from gpuvs.serve import channel as client
    from gpuvs.serve import nlp_pb2 as pb

    client.check_target(target)
    access = client.Access(tls, tls_ca, server_name, token_file)
    try:
        channel, stub = client.connect(target, timeout, access=access)
    except ConnectionError as exc:
        raise UsageError(str(exc)) from None
    try:
        m = stub.Metrics(pb.MetricsRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        raise UsageError(f"{target}: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    if as_json:
        try:
            data = json_format.MessageToDict(m, always_print_fields_with_no_presence=True)
        except TypeError:  # protobuf < 5.26
            data = json_format.MessageToDict(m, including_default_value_fields=True)
        print(json.dumps(data, indent=2))
        return
    print(f"{target} ({m.device}, up {m.uptime_s:.0f} s): {m.in_flight} in flight of {m.max_in_flight}, "
          f"{m.queued} queued of {m.max_queue} (peaks {m.peak_in_flight}, {m.peak_queued}); refused {m.refused}, "
          f"Trains refused {m.refused_train}, cancelled {m.cancelled}, deadline passed {m.deadline_exceeded}, "
          f"unauthenticated {m.unauthenticated}")
    for c in m.calls:
        print(f"  {c.method}: {c.ok} ok, {c.failed} failed; p50 {c.p50_ms:.2f} ms, p90 {c.p90_ms:.2f} ms, "
              f"p99 {c.p99_ms:.2f} ms (last {c.window})")
    print(f"  models loaded: {len(m.models)}, {m.models_bytes / 2**20:.1f} MiB of {m.model_cache_bytes / 2**20:.0f} "
          f"MiB ({m.evictions} unloaded to make room): " + ", ".join(f"{x.name} {x.bytes / 2**20:.1f} MiB"
                                                                    for x in m.models))
    print(f"  process: {m.rss_bytes / 2**20:.0f} MiB resident, {m.gpu_allocated_bytes / 2**20:.0f} MiB on the GPU; "
          f"{m.trains_running} Train(s) running")


COMMAND = Command(
    "serve-metrics", "A running server's figures: calls in flight and queued, refusals, latency percentiles, models "
    "loaded.", serve_metrics,
    groups=(Group("serve-metrics options", SERVE_METRICS_OPTIONS, "serve-metrics"),),
)
