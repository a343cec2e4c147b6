"""gpuvs serve: the NLP gRPC service in the foreground, until SIGTERM or Ctrl-C stops it cleanly.

It serves Train, Predict, Load, ListModels, Metrics and the standard health service.
At the stop, calls in flight get --grace seconds, then are cancelled."""

from __future__ import annotations

import signal
import threading
import time

from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.serve import settings as cfg

SERVE_OPTIONS = (
    Param("port", int, 50051, "TCP port (0: any free port; the one taken is printed)"),
    Param("host", str, "127.0.0.1", "address to listen on; anything but loopback needs --tls-cert/--tls-key and "
          "--token-file, or --insecure"),
    Param("device", str, None, "cuda, cuda:N or cpu (default: cuda when a GPU is present)"),
    Param("models_dir", str, "gpuvs-models", "folder of the saved models"),
    Param("max_message_mb", float, 4.0, "largest request accepted, in MiB"),
    Param("max_text_chars", int, 2000, "longest text accepted, in characters"),
    Param("max_in_flight", int, cfg.MAX_IN_FLIGHT, "Train/Predict/Load calls that run at once"),
    Param("max_queue", int, cfg.MAX_QUEUE, "calls that wait for a slot; past both, RESOURCE_EXHAUSTED with a retry "
          "hint"),
    Param("queue_timeout", float, cfg.QUEUE_TIMEOUT_S, "seconds a call may wait in the queue"),
    Param("max_trains", int, cfg.MAX_TRAINS, "Trains that run at once on the device; one more is refused"),
    Param("max_train_flops", float, 1e15, "compute budget of one Train (6 x parameters x tokens x epochs), checked "
          "before it starts"),
    Param("max_model_params", int, 100_000_000, "largest model a Train may build (embeddings not counted)"),
    Param("model_cache_mb", float, cfg.MODEL_CACHE_MB, "memory for loaded models; the least recently used are "
          "unloaded past it"),
    Param("tls_cert", str, "", "the server's certificate (PEM): serve over TLS"),
    Param("tls_key", str, "", "its private key (PEM)"),
    Param("token_file", str, "", "file holding the token every call must send (authorization: Bearer TOKEN)"),
    Param("insecure", bool, False, "allow plain text without a token off loopback"),
    Param("threads", int, 0, "CPU threads torch uses (0: its default)"),
    Param("grace", float, 5.0, "seconds calls in flight get to finish on SIGTERM"),
)


def serve(args: Args) -> None:
    o = args.options
    port, host, device, models_dir = o["port"], o["host"], o["device"], o["models_dir"]
    max_message_mb, max_text_chars, max_in_flight = o["max_message_mb"], o["max_text_chars"], o["max_in_flight"]
    max_queue, queue_timeout, max_trains = o["max_queue"], o["queue_timeout"], o["max_trains"]
    max_train_flops, max_model_params, model_cache_mb = o["max_train_flops"], o["max_model_params"], o["model_cache_mb"]
    tls_cert, tls_key, token_file, insecure = o["tls_cert"], o["tls_key"], o["token_file"], o["insecure"]
    threads, grace = o["threads"], o["grace"]
    from gpuvs.probes import fingerprint
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
        from gpuvs.serve.request_checks import Limits
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


COMMAND = Command(
    "serve", "Serve NER and text-classification training and prediction over gRPC (gpuvs/serve/nlp.proto).", serve,
    groups=(Group("serve options", SERVE_OPTIONS, "serve"),),
)
