"""The models: a small transformer encoder (or a BiLSTM) with a token-classification (NER) or text-classification head.

The text-classification head is mean-pooled.
Bundle is a model with everything needed to use it: vocabulary, labels, configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpuvs.nlp.data import Vocab

ARCHS = ("transformer", "bilstm")
TASKS = ("ner", "tc")


class NlpModel(nn.Module):
    def __init__(self, task: str, arch: str, vocab_size: int, num_labels: int, d_model: int, layers: int,
                 heads: int, max_len: int, dropout: float = 0.1):
        super().__init__()
        if task not in TASKS or arch not in ARCHS:
            raise ValueError(f"unknown task {task!r} or architecture {arch!r}")
        self.task, self.arch, self.max_len = task, arch, max_len
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=0)
        if arch == "transformer":
            self.pos = nn.Embedding(max_len, d_model)
            layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout, batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
        else:
            self.lstm = nn.LSTM(d_model, d_model // 2, layers, batch_first=True, bidirectional=True,
                                dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d_model, num_labels)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids [B, T] (0 = padding), lengths [B] on the CPU -> logits [B, T, labels] (NER) or [B, labels]."""
        mask = ids != 0
        x = self.embed(ids)
        if self.arch == "transformer":
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
            x = self.norm(self.encoder(x, src_key_padding_mask=~mask))
        else:
            from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.lstm(packed)
            x, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        x = self.drop(x)
        if self.task == "tc":
            m = mask.unsqueeze(-1).to(x.dtype)
            x = (x * m).sum(1) / m.sum(1).clamp(min=1)
        return self.head(x)


@dataclass
class Bundle:
    """A trained model and what it takes to use it; what a model file holds."""

    task: str
    config: dict[str, Any]  # arch, d_model, layers, heads, max_len
    vocab: Vocab
    labels: list[str]
    model: NlpModel
    metrics: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def build_model(task: str, config: dict[str, Any], vocab_size: int, num_labels: int) -> NlpModel:
        return NlpModel(task, config["arch"], vocab_size, num_labels, config["d_model"], config["layers"],
                        config["heads"], config["max_len"], config.get("dropout", 0.1))
