"""Prediction with a Bundle: texts -> tokens -> one padded batch (or a few) on the device -> labels."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from gpuvs.probes import precision
from gpuvs.nlp import data
from gpuvs.nlp.models import Bundle

CHUNK = 512  # texts per forward pass


class Predictor:
    def __init__(self, bundle: Bundle, device: str | torch.device, precision: str = "fp32"):
        self.bundle = bundle
        self.device = torch.device(device)
        self.precision = precision
        self.max_len = int(bundle.config["max_len"])
        bundle.model.to(self.device).eval()

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """NER: {"tokens", "tags"} per text (tokens past the model's max_len are cut); TC: {"label", "score"}."""
        return self.predict_tokens([data.tokenize(t) for t in texts])

    def predict_tokens(self, token_lists: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for start in range(0, len(token_lists), CHUNK):
            out.extend(self._forward([list(t)[:self.max_len] for t in token_lists[start:start + CHUNK]]))
        return out

    def _forward(self, toks: list[list[str]]) -> list[dict[str, Any]]:
        if not toks:
            return []
        vocab, labels = self.bundle.vocab, self.bundle.labels
        width = data.padded_width(max(len(t) for t in toks), self.max_len)
        ids = torch.zeros(len(toks), width, dtype=torch.long)
        for row, t in enumerate(toks):
            if t:
                ids[row, :len(t)] = torch.tensor(vocab.encode(t))
        lengths = torch.tensor([max(1, len(t)) for t in toks])
        with torch.inference_mode(), precision.autocast(self.precision, self.device):
            logits = self.bundle.model(ids.to(self.device, non_blocking=True), lengths).float()
            if self.bundle.task == "tc":
                probs = logits.softmax(-1)
                score, best = probs.max(-1)
                score, best = score.cpu().tolist(), best.cpu().tolist()
                return [{"label": labels[b], "score": s} for b, s in zip(best, score)]
            best = logits.argmax(-1).cpu().tolist()
        return [{"tokens": t, "tags": [labels[i] for i in row[:len(t)]]} for t, row in zip(toks, best)]
