"""gpuvs serve: the NLP gRPC service (Train, Predict, Load, ListModels, Metrics, and the standard
health service) in the foreground, until SIGTERM or Ctrl-C, which stop it cleanly (calls in flight
get --grace seconds, then are cancelled). gpuvs serve-metrics: a running server's Metrics."""

from __future__ import annotations

import json
import signal
import threading
import time

import typer

from gpuvs.cli import app
from gpuvs.errors import UsageError
from gpuvs.serve import config as cfg


@app.command()
def serve(port: int = typer.Option(50051, "--port", help="TCP port (0: any free port; the one taken is printed)"),
          host: str = typer.Option("127.0.0.1", "--host", help="address to listen on; anything but loopback needs "
                                   "--tls-cert/--tls-key and --token-file, or --insecure"),
          device: str = typer.Option(None, "--device", help="cuda, cuda:N or cpu (default: cuda when a GPU is present)"),
          models_dir: str = typer.Option("gpuvs-models", "--models-dir", help="folder of the saved models"),
          max_message_mb: float = typer.Option(4.0, "--max-message-mb", help="largest request accepted, in MiB"),
          max_text_chars: int = typer.Option(2000, "--max-text-chars", help="longest text accepted, in characters"),
          max_in_flight: int = typer.Option(cfg.MAX_IN_FLIGHT, "--max-in-flight",
                                            help="Train/Predict/Load calls that run at once"),
          max_queue: int = typer.Option(cfg.MAX_QUEUE, "--max-queue", help="calls that wait for a slot; "
                                        "past both, RESOURCE_EXHAUSTED with a retry hint"),
          queue_timeout: float = typer.Option(cfg.QUEUE_TIMEOUT_S, "--queue-timeout",
                                              help="seconds a call may wait in the queue"),
          max_trains: int = typer.Option(cfg.MAX_TRAINS, "--max-trains",
                                         help="Trains that run at once on the device; one more is refused"),
          max_train_flops: float = typer.Option(1e15, "--max-train-flops", help="compute budget of one Train "
                                                "(6 x parameters x tokens x epochs), checked before it starts"),
          max_model_params: int = typer.Option(100_000_000, "--max-model-params",
                                               help="largest model a Train may build (embeddings not counted)"),
          model_cache_mb: float = typer.Option(cfg.MODEL_CACHE_MB, "--model-cache-mb", help="memory for loaded "
                                               "models; the least recently used are unloaded past it"),
          tls_cert: str = typer.Option("", "--tls-cert", help="the server's certificate (PEM): serve over TLS"),
          tls_key: str = typer.Option("", "--tls-key", help="its private key (PEM)"),
          token_file: str = typer.Option("", "--token-file", help="file holding the token every call must send "
                                         "(authorization: Bearer TOKEN)"),
          insecure: bool = typer.Option(False, "--insecure", help="allow plain text without a token off loopback"),
          threads: int = typer.Option(0, "--threads", help="CPU threads torch uses (0: its default)"),
          grace: float = typer.Option(5.0, "--grace", help="seconds calls in flight get to finish on SIGTERM")) -> None:
    """Serve NER and text-classification training and prediction over gRPC (gpuvs/serve/nlp.proto)."""
    from gpuvs import fingerprint
    from gpuvs.spec import check_device_syntax

    if not 0 < max_message_mb <= 2047:
        raise UsageError(f"--max-message-mb {max_message_mb:g} is out of range (above 0, at most 2047)")
    if max_text_chars < 1 or grace < 0:
        raise UsageError("--max-text-chars must be at least 1, --grace at least 0")
    if device:
        check_device_syntax(device)
    try:
        from gpuvs.serve.security import Security
        from gpuvs.serve.server import NlpServer
        from gpuvs.serve.validate import Limits
    except ImportError as exc:
        raise UsageError(f"gpuvs serve needs grpcio, grpcio-health-checking and protobuf ({exc}): "
                         "pip install grpcio grpcio-health-checking protobuf") from None
    limits = Limits(max_message_bytes=int(max_message_mb * (1 << 20)), max_text_chars=max_text_chars,
                    max_train_flops=max_train_flops, max_model_params=max_model_params)
    config = cfg.ServeConfig(host, port, device or "cpu", models_dir, limits, max_in_flight, max_queue, queue_timeout,
                             max_trains, model_cache_mb, threads, Security(tls_cert, tls_key, token_file, insecure))
    config.check()
    gpus = 0 if device == "cpu" else fingerprint.gpu_count()
    config.device = device or ("cuda" if gpus else "cpu")
    if config.device.startswith("cuda"):
        index = int(config.device.partition(":")[2] or 0)
        if index >= gpus:
            raise UsageError(f"device {config.device} asked for, but this machine has "
                             + (f"only {gpus} GPU(s)" if gpus else "no usable NVIDIA GPU (use --device cpu)"))
    server = NlpServer(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        try:
            bound = server.start()
        except OSError as exc:
            raise UsageError(str(exc)) from None
        how = "TLS" if tls_cert else "plain text"
        print(f"gpuvs serve: listening on {host}:{bound} (device {config.device}, models in {server.models_dir}; "
              f"{how}{', token required' if token_file else ''}; {max_in_flight} in flight, {max_queue} queued; "
              f"ready in {server.ready_s:.2f} s)", flush=True)
        while not stop.wait(0.2):
            pass
        reason = "SIGTERM"
    except KeyboardInterrupt:
        reason = "Ctrl-C"
    print(f"gpuvs serve: {reason}: stopping (calls in flight get {grace:g} s)", flush=True)
    t0 = time.perf_counter()
    server.stop(grace)
    print(f"gpuvs serve: stopped in {time.perf_counter() - t0:.2f} s", flush=True)


@app.command("serve-metrics")
def serve_metrics(target: str = typer.Option(..., "--target", help="HOST:PORT of a running gpuvs serve"),
                  tls: bool = typer.Option(False, "--tls", help="connect over TLS (trusting the system's CAs)"),
                  tls_ca: str = typer.Option("", "--tls-ca", help="CA certificate (PEM) to trust: connect over TLS"),
                  server_name: str = typer.Option("", "--server-name", help="name the server's certificate must "
                                                  "carry, when not the target's host"),
                  token_file: str = typer.Option("", "--token-file", help="file holding the server's token"),
                  as_json: bool = typer.Option(False, "--json", help="the whole MetricsResponse as JSON"),
                  timeout: float = typer.Option(10.0, "--timeout", help="seconds to wait for the server")) -> None:
    """A running server's figures: calls in flight and queued, refusals, latency percentiles, models loaded."""
    import grpc
    from google.protobuf import json_format

    from gpuvs.serve import client
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
