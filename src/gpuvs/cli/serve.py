"""gpuvs serve: the NLP gRPC service (Train, Predict, Load, ListModels) in the foreground, until
SIGTERM or Ctrl-C, which stop it cleanly (calls in flight get --grace seconds, then are cancelled)."""

from __future__ import annotations

import signal
import threading
import time

import typer

from gpuvs.cli import app
from gpuvs.errors import UsageError


@app.command()
def serve(port: int = typer.Option(50051, "--port", help="TCP port (0: any free port; the one taken is printed)"),
          host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
          device: str = typer.Option(None, "--device", help="cuda, cuda:N or cpu (default: cuda when a GPU is present)"),
          models_dir: str = typer.Option("gpuvs-models", "--models-dir", help="folder of the saved models"),
          max_message_mb: float = typer.Option(4.0, "--max-message-mb", help="largest request accepted, in MiB"),
          max_text_chars: int = typer.Option(2000, "--max-text-chars", help="longest text accepted, in characters"),
          workers: int = typer.Option(8, "--workers", help="calls served at once"),
          threads: int = typer.Option(0, "--threads", help="CPU threads torch uses (0: its default)"),
          grace: float = typer.Option(5.0, "--grace", help="seconds calls in flight get to finish on SIGTERM")) -> None:
    """Serve NER and text-classification training and prediction over gRPC (gpuvs/serve/nlp.proto)."""
    from gpuvs import fingerprint
    from gpuvs.spec import check_device_syntax

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a TCP port (0 to 65535)")
    if not 0 < max_message_mb <= 2047:
        raise UsageError(f"--max-message-mb {max_message_mb:g} is out of range (above 0, at most 2047)")
    if max_text_chars < 1 or workers < 1 or grace < 0 or threads < 0:
        raise UsageError("--max-text-chars and --workers must be at least 1, --grace and --threads at least 0")
    if device:
        check_device_syntax(device)
    gpus = 0 if device == "cpu" else fingerprint.gpu_count()
    device = device or ("cuda" if gpus else "cpu")
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if index >= gpus:
            raise UsageError(f"device {device} asked for, but this machine has "
                             + (f"only {gpus} GPU(s)" if gpus else "no usable NVIDIA GPU (use --device cpu)"))
    try:
        from gpuvs.serve.server import NlpServer
        from gpuvs.serve.validate import Limits
    except ImportError as exc:
        raise UsageError(f"gpuvs serve needs grpcio and protobuf ({exc}): pip install grpcio protobuf") from None

    limits = Limits(max_message_bytes=int(max_message_mb * (1 << 20)), max_text_chars=max_text_chars)
    server = NlpServer(host, port, device, models_dir, limits, workers, threads=threads)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        try:
            bound = server.start()
        except OSError as exc:
            raise UsageError(str(exc)) from None
        print(f"gpuvs serve: listening on {host}:{bound} (device {device}, models in {server.models_dir}; "
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
