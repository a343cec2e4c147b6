"""The server's models: one file per name in the models folder (written atomically by
nlp/checkpoint.py), the loaded ones in memory, and the names being trained right now (a second
Train of the same name is refused while the first runs, so two trainings never race on one file)."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc

from gpuvs.serve.validate import Refused


@dataclass
class Loaded:
    predictor: object  # gpuvs.nlp.predict.Predictor
    path: Path
    seconds: float


class ModelStore:
    def __init__(self, folder: str | Path, device: str):
        self.folder = Path(folder)
        self.device = device
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._loaded: dict[str, Loaded] = {}
        self._training: set[str] = set()

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.pt"

    def saved(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.pt"))

    def info(self) -> list[dict]:
        with self._lock:
            names = sorted(set(self.saved()) | set(self._loaded) | self._training)
            return [{"name": n, "path": str(self.path(n)), "loaded": n in self._loaded, "training": n in self._training,
                     "task": getattr(self._loaded[n].predictor, "bundle").task if n in self._loaded else ""}
                    for n in names]

    @contextlib.contextmanager
    def training(self, name: str) -> Iterator[None]:
        with self._lock:
            if name in self._training:
                raise Refused(grpc.StatusCode.ABORTED, f"model {name!r} is being trained by another request; "
                                                       "try again when it has finished")
            self._training.add(name)
        try:
            yield
        finally:
            with self._lock:
                self._training.discard(name)

    def get(self, name: str, reload: bool = False) -> tuple[Loaded, bool]:
        """The loaded model (loading it first if need be, or again from its file with reload) and
        whether it was loaded already."""
        with self._lock:
            if name in self._loaded and not reload:
                return self._loaded[name], True
        with self._load_lock:
            with self._lock:
                if name in self._loaded and not reload:
                    return self._loaded[name], True
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
            with self._lock:
                self._loaded[name] = loaded
            return loaded, False

    def _refuse_missing(self, name: str, training: bool) -> None:
        if training:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"model {name!r} is being trained and has no saved version yet")
        with self._lock:
            others = sorted(set(self.saved()) | set(self._loaded))
            busy = bool(self._training)
        if not others:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "no model exists yet" + (
                " (one is being trained)" if busy else ": train one first (Train)"))
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no model named {name!r}; the models are {', '.join(others)}")

    def put(self, name: str, bundle) -> Path:
        """Save a trained model (atomically) and serve it from now on."""
        from gpuvs.nlp import checkpoint
        from gpuvs.nlp.predict import Predictor

        path = checkpoint.save(bundle, self.path(name))
        with self._lock:
            self._loaded[name] = Loaded(Predictor(bundle, self.device), path, 0.0)
        return path


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
