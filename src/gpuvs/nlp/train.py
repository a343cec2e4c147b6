"""Training shared by the ner-train / tc-train workloads and the gRPC Train call.

Examples to batches on the device, a Trainer (AdamW, cross-entropy), and a timed step loop that keeps warm-up out.
Then held-out evaluation: accuracy, entity F1, and the majority-label baseline."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from gpuvs.probes import precision
from gpuvs.nlp import data
from gpuvs.nlp.models import Bundle

# One example: (tokens, tags) for NER, (tokens, label) for TC.
Example = tuple[list[str], Any]


class Cancelled(Exception):
    """Training was stopped from outside (a cancelled call, a server shutting down)."""


@dataclass
class TrainConfig:
    task: str
    arch: str = "transformer"
    d_model: int = 256
    layers: int = 4
    heads: int = 4
    max_len: int = 64
    epochs: int = 2
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    precision: str = "fp32"
    dropout: float = 0.1

    def model_config(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("arch", "d_model", "layers", "heads", "max_len", "dropout")}


@dataclass
class Batch:
    ids: torch.Tensor       # [B, T] on the device
    lengths: torch.Tensor   # [B] on the CPU (the BiLSTM packs with it)
    target: torch.Tensor    # [B, T] (NER, -100 = padding) or [B] (TC), on the device
    examples: int
    tokens: int


@dataclass
class StepStat:
    step: int
    epoch: int
    seconds: float
    examples: int
    tokens: int
    loss: float | None = None


def make_batches(task: str, examples: Sequence[Example], vocab: data.Vocab, label_index: dict[str, int],
                 batch_size: int, max_len: int, device: torch.device, seed: int = 0) -> list[Batch]:
    """Shuffled once, cut into batches, padded to each batch's longest example, moved to the device."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start:start + batch_size]]
        toks = [ex[0][:max_len] for ex in chunk]
        width = data.padded_width(max(len(t) for t in toks), max_len)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        if task == "ner":
            target = torch.full((len(chunk), width), -100, dtype=torch.long)
        else:
            target = torch.tensor([label_index[ex[1]] for ex in chunk], dtype=torch.long)
        for row, (t, ex) in enumerate(zip(toks, chunk)):
            if t:
                ids[row, :len(t)] = torch.tensor(vocab.encode(t))
            if task == "ner":
                target[row, :len(t)] = torch.tensor([label_index[g] for g in ex[1][:len(t)]])
        lengths = torch.tensor([max(1, len(t)) for t in toks])
        batches.append(Batch(ids.to(device), lengths, target.to(device), len(chunk), sum(len(t) for t in toks)))
    return batches


class StepTimer:
    """Per-step durations: CUDA events recorded after each step and read in groups (the loop never
    waits on the host between steps), or a host clock on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._marks: list[Any] = []

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self) -> None:
        self._marks = [self._now()]

    def mark(self) -> None:
        self._marks.append(self._now())

    def collect(self) -> list[float]:
        """Durations of the steps marked since the last collect (waits for the last one)."""
        marks, self._marks = self._marks, self._marks[-1:]
        if self.cuda:
            marks[-1].synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:])]
        return [b - a for a, b in zip(marks, marks[1:])]


class Trainer:
    def __init__(self, cfg: TrainConfig, train: Sequence[Example], device: str | torch.device,
                 labels: Sequence[str] | None = None):
        self.cfg = cfg
        self.device = torch.device(device)
        torch.manual_seed(cfg.seed)
        self.vocab = data.Vocab.build(ex[0] for ex in train)
        if labels is None:
            seen = {g for ex in train for g in (ex[1] if cfg.task == "ner" else [ex[1]])}
            labels = sorted(seen - {"O"}) if cfg.task == "ner" else sorted(seen)
            labels = (["O"] + labels) if cfg.task == "ner" else labels
        self.labels = list(labels)
        self.label_index = {name: i for i, name in enumerate(self.labels)}
        self.model = Bundle.build_model(cfg.task, cfg.model_config(), len(self.vocab), len(self.labels)).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
        self.batches = make_batches(cfg.task, train, self.vocab, self.label_index, cfg.batch_size, cfg.max_len,
                                    self.device, cfg.seed)
        self.examples = len(train)
        self.metrics: dict[str, float] = {}

    @property
    def steps_per_epoch(self) -> int:
        return len(self.batches)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.cfg.epochs

    def schedule(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, batch) for every step: the batches in a new order each epoch."""
        rng = random.Random(self.cfg.seed + 1)
        for epoch in range(1, self.cfg.epochs + 1):
            order = list(range(len(self.batches)))
            rng.shuffle(order)
            for i in order:
                yield epoch, self.batches[i]

    def step(self, batch: Batch) -> torch.Tensor:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with precision.autocast(self.cfg.precision, self.device):
            logits = self.model(batch.ids, batch.lengths)
            loss = self.loss_fn(logits.reshape(-1, logits.shape[-1]).float(), batch.target.reshape(-1))
        loss.backward()
        self.opt.step()
        return loss.detach()

    def run(self, warmup_steps: int = 0, display_every: int = 20,
            should_stop: Callable[[], bool] = lambda: False) -> Iterator[tuple[str, Any]]:
        """Train every step. Yields ('first_step', s), ('warmup', s) (first step included), then
        ('steps', [StepStat]) every display_every timed steps; the last StepStat of a group carries
        the loss. Raises Cancelled when should_stop() says so (checked every step)."""
        cuda = self.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        plan = self.schedule()
        warmup_steps = min(warmup_steps, self.total_steps - 1)
        t0 = time.perf_counter()
        for i in range(warmup_steps):
            if should_stop():
                raise Cancelled
            self.step(next(plan)[1])
            if i == 0:
                sync()
                yield "first_step", time.perf_counter() - t0
        if warmup_steps:
            sync()
            yield "warmup", time.perf_counter() - t0
        timer = StepTimer(cuda)
        timer.start()
        group: list[tuple[int, int, Batch]] = []
        step = warmup_steps
        loss = None
        for epoch, batch in plan:
            if should_stop():
                raise Cancelled
            loss = self.step(batch)
            timer.mark()
            step += 1
            group.append((step, epoch, batch))
            if len(group) == display_every or step == self.total_steps:
                stats = [StepStat(s, e, sec, b.examples, b.tokens)
                         for (s, e, b), sec in zip(group, timer.collect())]
                stats[-1].loss = float(loss)
                group = []
                yield "steps", stats

    def evaluate(self, examples: Sequence[Example]) -> dict[str, float]:
        """Held-out accuracy (token accuracy for NER), entity F1 (NER), loss, and the accuracy of
        always saying the most common label (what a broken model scores)."""
        from gpuvs.nlp.predict import Predictor

        predictor = Predictor(self.bundle(), self.device, self.cfg.precision)
        out = predictor.predict_tokens([ex[0] for ex in examples])
        self.metrics = score(self.cfg.task, [ex[1] for ex in examples], out, self.cfg.max_len)
        return self.metrics

    def bundle(self) -> Bundle:
        return Bundle(self.cfg.task, self.cfg.model_config(), self.vocab, self.labels, self.model, dict(self.metrics))

    def describe(self) -> dict[str, Any]:
        params = sum(p.numel() for p in self.model.parameters())
        return {**asdict(self.cfg), "parameters": params, "vocab": len(self.vocab), "labels": len(self.labels),
                "train_examples": self.examples, "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps}


def score(task: str, gold: Sequence[Any], pred: Sequence[dict[str, Any]], max_len: int) -> dict[str, float]:
    """accuracy (token accuracy for NER), entity_f1 (NER), and baseline_accuracy: what always saying
    the most common label scores."""
    if task == "tc":
        return {"accuracy": sum(g == o["label"] for g, o in zip(gold, pred)) / max(1, len(gold)),
                "baseline_accuracy": data.majority_share(gold)}
    gold = [list(g)[:max_len] for g in gold]
    pairs = [(a, b) for g, o in zip(gold, pred) for a, b in zip(g, o["tags"])]
    return {"accuracy": sum(a == b for a, b in pairs) / max(1, len(pairs)),
            "entity_f1": data.entity_f1(gold, [o["tags"] for o in pred]),
            "baseline_accuracy": data.majority_share(a for a, _ in pairs)}
