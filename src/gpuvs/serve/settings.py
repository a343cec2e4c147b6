"""Everything `gpuvs serve` (and the nlp-serve workload) is started with, its defaults, and the
checks that refuse a bad setting before anything listens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuvs.errors import UsageError

if TYPE_CHECKING:  # both import grpc; the defaults below are read by workload discovery, which must not
    from gpuvs.serve.security import Security
    from gpuvs.serve.request_checks import Limits

MAX_IN_FLIGHT = 8       # Train/Predict/Load calls that run at once
MAX_QUEUE = 16          # more that wait for a slot; past both: RESOURCE_EXHAUSTED at once
QUEUE_TIMEOUT_S = 10.0  # the longest a call waits in the queue
MAX_TRAINS = 1          # Trains that run at once on the device; one more is refused
MODEL_CACHE_MB = 1024.0 # loaded models' parameters and buffers; least recently used unloaded past it
SPARE_THREADS = 8       # threads beyond the slots and the queue: health, Metrics, ListModels, refusals


def _default(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(f"gpuvs.serve.{module}"), name)()


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    device: str = "cpu"
    models_dir: str = "gpuvs-models"
    limits: Limits = field(default_factory=lambda: _default("validate", "Limits"))
    max_in_flight: int = MAX_IN_FLIGHT
    max_queue: int = MAX_QUEUE
    queue_timeout_s: float = QUEUE_TIMEOUT_S
    max_trains: int = MAX_TRAINS
    model_cache_mb: float = MODEL_CACHE_MB
    threads: int = 0
    security: Security = field(default_factory=lambda: _default("security", "Security"))

    def check(self) -> ServeConfig:
        """UsageError (one line: what, and what is allowed) for a setting out of range."""
        checks = [
            (0 <= self.port <= 65535, f"--port {self.port} is not a TCP port (0 to 65535)"),
            (1 <= self.max_in_flight <= 1024, f"--max-in-flight {self.max_in_flight} is out of range (1 to 1024)"),
            (0 <= self.max_queue <= 4096, f"--max-queue {self.max_queue} is out of range (0 to 4096)"),
            (0 < self.queue_timeout_s <= 3600, f"--queue-timeout {self.queue_timeout_s:g} is out of range (above 0, at most 3600 s)"),
            (1 <= self.max_trains <= 64, f"--max-trains {self.max_trains} is out of range (1 to 64)"),
            (0 < self.model_cache_mb <= 1 << 20, f"--model-cache-mb {self.model_cache_mb:g} is out of range (above 0, at most 1048576)"),
            (self.limits.max_train_flops > 0, f"--max-train-flops {self.limits.max_train_flops:g} must be above 0"),
            (self.limits.max_model_params >= 1, f"--max-model-params {self.limits.max_model_params} must be at least 1"),
            (self.threads >= 0, f"--threads {self.threads} must be at least 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        self.security.check(self.host)
        return self

    @property
    def cache_bytes(self) -> int:
        return int(self.model_cache_mb * (1 << 20))

    @property
    def threads_in_pool(self) -> int:
        return self.max_in_flight + self.max_queue + SPARE_THREADS
