"""The server's models: one file per name in the models folder, the loaded ones in memory, those being trained.

Loaded models are a cache with a memory budget (`cache_bytes`): the least recently used are unloaded first.
A second Train of a name is refused while the first runs (ABORTED), so two trainings never race on one file.
At most `max_trains` run at once; one more is refused, not queued, since a queued call would wait minutes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import grpc

from gpuvs.serve.admission import busy
from gpuvs.serve.request_checks import Refused


@dataclass
class Loaded:
    predictor: object  # gpuvs.nlp.predict.Predictor
    path: Path
    seconds: float
    bytes: int = 0
    used: float = field(default_factory=time.monotonic)


@dataclass
class Training:
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    total: int = 0

    def left_s(self) -> float:
        """Seconds this training has left at its pace so far (a guess before its first steps)."""
        elapsed = time.monotonic() - self.started
        return elapsed * (self.total - self.step) / self.step if self.step else max(5.0, elapsed)


def model_bytes(predictor) -> int:
    model = predictor.bundle.model
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


class ModelStore:
    def __init__(self, folder: str | Path, device: str, cache_bytes: int = 1 << 30, max_trains: int = 1):
        self.folder = Path(folder)
        self.device = device
        self.cache_bytes, self.max_trains = cache_bytes, max_trains
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._training: dict[str, Training] = {}
        self.evictions = 0
        self.refused_trains = 0

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.pt"

    def saved(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.pt"))

    def info(self) -> list[dict]:
        with self._lock:
            names = sorted(set(self.saved()) | set(self._loaded) | set(self._training))
            return [{"name": n, "path": str(self.path(n)), "loaded": n in self._loaded, "training": n in self._training,
                     "task": getattr(self._loaded[n].predictor, "bundle").task if n in self._loaded else ""}
                    for n in names]

    def check_trains(self, name: str) -> None:
        """Refuse a Train at once (before it queues for a slot) when its name is being trained or
        max_trains run already; training() checks again, for good, when it starts."""
        with self._lock:
            self._check_trains(name)

    def _check_trains(self, name: str) -> None:
        if name in self._training:
            raise Refused(grpc.StatusCode.ABORTED, f"model {name!r} is being trained by another request; "
                                                   "try again when it has finished")
        if len(self._training) >= self.max_trains:
            self.refused_trains += 1
            running = ", ".join(f"{n} (step {t.step} of {t.total})" for n, t in self._training.items())
            raise busy(f"{len(self._training)} Train(s) already running on {self.device}, the limit "
                       f"(--max-trains {self.max_trains}): {running}", min(t.left_s() for t in self._training.values()))

    @contextlib.contextmanager
    def training(self, name: str) -> Iterator[Training]:
        with self._lock:
            self._check_trains(name)
            progress = self._training[name] = Training()
        try:
            yield progress
        finally:
            with self._lock:
                del self._training[name]

    def usage(self) -> tuple[list[tuple[str, int, float]], int]:
        """(name, bytes, idle seconds) of each loaded model, least recently used first, and their sum."""
        now = time.monotonic()
        with self._lock:
            rows = [(n, m.bytes, now - m.used) for n, m in self._loaded.items()]
        return rows, sum(r[1] for r in rows)

    def trains_running(self) -> int:
        with self._lock:
            return len(self._training)

    def _keep(self, name: str, loaded: Loaded) -> bool:
        """Put a model in the cache (self._lock held), unloading the least recently used ones until it
        fits; False (and nothing unloaded) when it alone is larger than the whole budget."""
        self._loaded.pop(name, None)
        if loaded.bytes > self.cache_bytes:
            return False
        while self._loaded and sum(m.bytes for m in self._loaded.values()) + loaded.bytes > self.cache_bytes:
            self._loaded.popitem(last=False)
            self.evictions += 1
        self._loaded[name] = loaded
        return True

    def _hit(self, name: str, reload: bool) -> Loaded | None:
        """The cached model, marked used now (self._lock held)."""
        if name in self._loaded and not reload:
            self._loaded.move_to_end(name)
            self._loaded[name].used = time.monotonic()
            return self._loaded[name]
        return None

    def get(self, name: str, reload: bool = False) -> tuple[Loaded, bool]:
        """The loaded model (loading it first if need be, or again from its file with reload) and
        whether it was loaded already."""
        with self._lock:
            if (hit := self._hit(name, reload)) is not None:
                return hit, True
        with self._load_lock:
            with self._lock:
                if (hit := self._hit(name, reload)) is not None:
                    return hit, True
                training = name in self._training
            path = self.path(name)
            if not path.exists():
                self._refuse_missing(name, training)
            from gpuvs.nlp import checkpoint
            from gpuvs.nlp.predict import Predictor

            t0 = time.perf_counter()
            try:
                bundle = checkpoint.load(path, self.device)
            except checkpoint.ModelLoadError as exc:
                raise Refused(grpc.StatusCode.DATA_LOSS, str(exc)) from None
            loaded = Loaded(Predictor(bundle, self.device), path, 0.0)
            _sync(self.device)
            loaded.seconds = time.perf_counter() - t0
            loaded.bytes = model_bytes(loaded.predictor)
            with self._lock:
                if not self._keep(name, loaded):
                    raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"model {name!r} needs {loaded.bytes / 2**20:.1f} MiB, more than the whole model "
                                  f"cache of {self.cache_bytes / 2**20:.1f} MiB (--model-cache-mb)")
            return loaded, False

    def _refuse_missing(self, name: str, training: bool) -> None:
        if training:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"model {name!r} is being trained and has no saved version yet")
        with self._lock:
            others = sorted(set(self.saved()) | set(self._loaded))
            busy_ = bool(self._training)
        if not others:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "no model exists yet" + (
                " (one is being trained)" if busy_ else ": train one first (Train)"))
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no model named {name!r}; the models are {', '.join(others)}")

    def put(self, name: str, bundle) -> Path:
        """Save a trained model (atomically) and serve it from now on (kept loaded if it fits the cache)."""
        from gpuvs.nlp import checkpoint
        from gpuvs.nlp.predict import Predictor

        path = checkpoint.save(bundle, self.path(name))
        loaded = Loaded(Predictor(bundle, self.device), path, 0.0)
        loaded.bytes = model_bytes(loaded.predictor)
        with self._lock:
            self._keep(name, loaded)
        return path


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
