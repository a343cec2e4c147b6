"""Tokenisation, vocabularies, label sets, batch widths and metrics: plain Python, no framework, so
that the gRPC server can check requests without touching a model."""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

PAD, UNK = "<pad>", "<unk>"
_TOKEN = re.compile(r"\w+(?:[-'.]\w+)*|[^\w\s]", re.UNICODE)
_TAG = re.compile(r"^(O|[BI]-[A-Za-z][A-Za-z0-9_]*)$")


def tokenize(text: str) -> list[str]:
    """Words (with inner - ' .), numbers and single punctuation marks."""
    return _TOKEN.findall(text)


class Vocab:
    """Token <-> id; id 0 is padding, 1 the unknown token."""

    def __init__(self, tokens: Sequence[str]):
        self.itos = list(tokens)
        if self.itos[:2] != [PAD, UNK]:
            raise ValueError("a vocabulary starts with <pad>, <unk>")
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_count: int = 1) -> Vocab:
        counts = Counter(t for s in sentences for t in s)
        words = sorted((t for t, c in counts.items() if c >= min_count and t not in (PAD, UNK)),
                       key=lambda t: (-counts[t], t))
        return cls([PAD, UNK] + words)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.stoi.get(t, 1) for t in tokens]


def padded_width(longest: int, max_len: int) -> int:
    """Pad to a multiple of 8 (at most max_len): few distinct shapes, so kernels chosen for a shape
    on its first use are reused rather than chosen again batch after batch (training and prediction)."""
    return max(1, min(max_len, -(-longest // 8) * 8))


def check_tags(tags: Iterable[str]) -> str | None:
    """The first tag that is not O, B-TYPE or I-TYPE, else None."""
    for tag in tags:
        if not _TAG.match(tag):
            return tag
    return None


def tag_set(entity_types: Iterable[str]) -> list[str]:
    return ["O"] + [f"{p}-{t}" for t in entity_types for p in ("B", "I")]


def spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """Entity spans (start, end, type) from BIO tags; an I- without its B- starts a span (conlleval)."""
    out: set[tuple[int, int, str]] = set()
    start, kind = None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, typ = tag.partition("-")
        if start is not None and (prefix != "I" or typ != kind):
            out.add((start, i, kind))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, typ
    return out


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Span-level F1 over sentences (exact type and boundaries)."""
    tp = fp = fn = 0
    for g, p in zip(gold, pred):
        gs, ps = spans(g), spans(p)
        tp += len(gs & ps)
        fp += len(ps - gs)
        fn += len(gs - ps)
    if tp == 0:
        return 0.0
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall)


def majority_share(labels: Iterable[str]) -> float:
    """Share of the most common label: the accuracy of a model that always says it."""
    counts = Counter(labels)
    total = sum(counts.values())
    return max(counts.values()) / total if total else 0.0
