"""Model files: one torch file per model (tensors, vocabulary, labels, configuration), loaded with weights_only=True.

So no code runs on load. Saving writes a temporary file in the same folder and renames it over the old one.
A reader then sees the old model or the new one, never half of one, whatever happens during the save."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import torch

from gpuvs.nlp.data import Vocab
from gpuvs.nlp.models import Bundle

FORMAT = "gpuvs-nlp/1"


class ModelLoadError(Exception):
    """A model file that cannot be used; the message names the file."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"cannot load model {path}: {reason}")


def save(bundle: Bundle, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "task": bundle.task, "config": dict(bundle.config), "vocab": list(bundle.vocab.itos),
               "labels": list(bundle.labels), "metrics": {k: float(v) for k, v in bundle.metrics.items()},
               "state_dict": {k: v.detach().to("cpu") for k, v in bundle.model.state_dict().items()}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(path: str | os.PathLike, device: str | torch.device = "cpu") -> Bundle:
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(path, "no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: pickle, zip and torch errors alike
        raise ModelLoadError(path, f"not a readable model file ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ModelLoadError(path, f"not a gpuvs NLP model (expected format {FORMAT})")
    try:
        vocab = Vocab(payload["vocab"])
        labels = list(payload["labels"])
        model = Bundle.build_model(payload["task"], payload["config"], len(vocab), len(labels))
        model.load_state_dict(payload["state_dict"])
    except Exception as exc:
        raise ModelLoadError(path, f"the file does not match its model ({type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0][:160]})") from None
    model.to(device).eval()
    return Bundle(payload["task"], dict(payload["config"]), vocab, labels, model, dict(payload.get("metrics", {})))
