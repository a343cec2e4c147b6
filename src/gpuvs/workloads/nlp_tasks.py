"""NER and text classification: ner-train, tc-train, ner-predict, tc-predict (docs/nlp.md).

A small transformer encoder (or a BiLSTM) trained on the generated corpus (gpuvs/nlp/corpus.py; no network).
Training reports accuracy beside that of always saying the most common label, so a broken model shows.
Prediction loads a model file (timed apart), then times each request end to end."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.probes import precision
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.params import Param
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, amount, duration, rate, score

ARCHS = ("transformer", "bilstm")

MODEL_PARAMS = (
    Param("model", str, "transformer", "encoder: transformer or bilstm", choices=ARCHS),
    Param("sentences", int, 5000, "size of the generated corpus (10% held out for evaluation)", min=20,
          max=10_000_000),
    Param("d_model", int, 256, "hidden size", min=8, max=8192),
    Param("layers", int, 4, "encoder layers", min=1, max=64),
    Param("heads", int, 4, "attention heads (transformer; must divide --d-model)", min=1, max=128),
    Param("max_len", int, 64, "longest input in tokens (longer texts are cut)", min=8, max=8192),
    Param("batch_size", int, 32, "training examples per step", min=1, max=1 << 20),
    Param("lr", float, 1e-3, "AdamW learning rate", min=0.0, max=10.0),
    Param("precision", str, "fp32", "fp32 (strict), tf32, or bf16 (autocast)", choices=("fp32", "tf32", "bf16")),
    Param("threads", int, 0, "CPU threads for torch (0: every usable core)", min=0, max=4096),
    Param("seed", int, 0, "seed of the corpus, the weights and the order", min=0),
)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _NlpBase(Workload):
    # after each kind's headline series: tokens/sec, the scores and times both kinds end with
    common_metrics = (rate("tokens"), duration("*_s"), rate("*_per_sec"), score("final_loss", "lower"),
                      score("accuracy"), score("entity_f1"), amount("baseline_accuracy", "neither", tested=False),
                      duration("latency_*_ms"))
    task: str = "tc"
    requires = ("torch",)

    def check(self, params: dict[str, Any]) -> None:
        if params["model"] == "transformer" and params["d_model"] % params["heads"]:
            raise UsageError(f"--heads {params['heads']} must divide --d-model {params['d_model']}")
        if params["model"] == "bilstm" and params["d_model"] % 2:
            raise UsageError(f"--d-model {params['d_model']} must be even for the bilstm (two directions)")

    def setup(self, ctx: RunContext):
        import torch

        threads = ctx.params["threads"] or usable_cores()
        torch.set_num_threads(threads)
        precision.allow_tf32(ctx.params["precision"])
        return torch.device(ctx.device), threads

    def train_config(self, p: dict[str, Any], epochs: int):
        from gpuvs.nlp.train import TrainConfig

        return TrainConfig(task=self.task, arch=p["model"], d_model=p["d_model"], layers=p["layers"],
                           heads=p["heads"], max_len=p["max_len"], epochs=epochs, batch_size=p["batch_size"],
                           lr=p["lr"], seed=p["seed"], precision=p["precision"])

    def config_items(self, p: dict[str, Any], device, threads: int, **more) -> dict[str, Any]:
        items = dict(task="named-entity recognition (BIO tags)" if self.task == "ner" else "text classification",
                     model=describe_model(p), dataset=f"generated, {p['sentences']} sentences (seed {p['seed']})",
                     device=str(device), precision=p["precision"], cpu_threads=threads)
        items.update(more)
        return items


class _TrainBase(_NlpBase):
    unit = "examples/sec"
    metrics = (rate("train", headline=True), *_NlpBase.common_metrics)
    cpu_defaults = {"epochs": 1, "sentences": 2000}
    params = MODEL_PARAMS + (
        Param("epochs", int, 2, "passes over the training sentences", min=1, max=100000),
        Param("warmup_steps", int, 5, "first steps, excluded from the throughput figures", min=0, max=100000),
        Param("display_every", int, 20, "log a line every N steps", min=1, max=1_000_000),
        Param("save_model", str, "", "save the trained model to this file (for *-predict --model-path or serve)"),
    )

    def check(self, params: dict[str, Any]) -> None:
        super().check(params)
        from gpuvs.nlp.corpus import steps_for

        steps = steps_for(params["sentences"], params["batch_size"], params["epochs"])
        if steps <= params["warmup_steps"]:
            raise UsageError(f"--warmup-steps {params['warmup_steps']} leaves no timed step: this run has {steps} "
                             "steps (more --sentences or --epochs, or a smaller --batch-size)")
        folder = os.path.dirname(os.path.abspath(params["save_model"])) if params["save_model"] else ""
        if folder and not os.path.isdir(folder):
            raise UsageError(f"--save-model {params['save_model']!r}: folder {folder} does not exist")

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        from gpuvs.nlp import checkpoint, corpus, train

        p = ctx.params
        device, threads = self.setup(ctx)
        t0 = time.perf_counter()
        data = corpus.generate(self.task, p["sentences"], p["seed"])
        train_set, eval_set = corpus.as_examples(self.task, data.train), corpus.as_examples(self.task, data.eval)
        yield events.startup("corpus_s", time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer = train.Trainer(self.train_config(p, p["epochs"]), train_set, device, labels=data.labels)
        yield events.startup("model_build_s", time.perf_counter() - t0)
        d = trainer.describe()
        warmup = min(p["warmup_steps"], d["total_steps"] - 1)
        yield events.config(**self.config_items(p, device, threads, mode="training", parameters=d["parameters"],
                                                vocabulary=d["vocab"], labels=d["labels"],
                                                train_set=d["train_examples"], eval_set=len(eval_set),
                                                batch_size=p["batch_size"], epochs=p["epochs"],
                                                warmup_steps=warmup, steps=d["total_steps"] - warmup))
        t_train = time.perf_counter()
        timed_s = examples = tokens = 0.0
        last_loss = float("nan")
        try:
            for kind, value in trainer.run(p["warmup_steps"], p["display_every"]):
                if kind != "steps":
                    yield events.startup(f"{kind}_s", value)
                    if kind == "warmup" and ctx.spec.launched_at:
                        yield events.startup("launch_to_timed_s", time.time() - ctx.spec.launched_at)
                    continue
                for s in value:
                    extra = {"loss": s.loss} if s.loss is not None else {}
                    yield events.sample(s.step, s.examples / s.seconds, "examples/sec", series="train",
                                        seconds=s.seconds, items=s.examples, tokens=s.tokens, epoch=s.epoch, **extra)
                    yield events.sample(s.step, s.tokens / s.seconds, "tokens/sec", series="tokens",
                                        seconds=s.seconds, items=s.tokens)
                    timed_s, examples, tokens = timed_s + s.seconds, examples + s.examples, tokens + s.tokens
                last_loss = value[-1].loss
        except Exception as exc:
            _raise_oom(exc, p)
            raise
        elapsed = time.perf_counter() - t_train
        t0 = time.perf_counter()
        scores = trainer.evaluate(eval_set)
        yield events.metric("elapsed_s", elapsed, "s")
        yield events.metric("timed_s", timed_s, "s")
        yield events.metric("examples_per_sec", examples / timed_s if timed_s else float("nan"), "examples/sec")
        yield events.metric("tokens_per_sec", tokens / timed_s if timed_s else float("nan"), "tokens/sec")
        yield events.metric("final_loss", last_loss)
        for name, value in scores.items():
            yield events.metric(name, value)
        yield events.metric("eval_s", time.perf_counter() - t0, "s")
        yield events.log(score_line(scores, f"final loss {last_loss:.3f}, trained in {elapsed:.2f} s"))
        if p["save_model"]:
            path = checkpoint.save(trainer.bundle(), p["save_model"])
            yield events.log(f"saved the model to {path}")


class _PredictBase(_NlpBase):
    unit = "examples/sec"
    metrics = (rate("predict", headline=True), *_NlpBase.common_metrics)
    cpu_defaults = {"sentences": 2000, "requests": 100}
    params = MODEL_PARAMS + (
        Param("model_path", str, "", "a model file (from *-train --save-model, or a gpuvs serve --models-dir); "
                                     "empty: train one first, untimed"),
        Param("train_epochs", int, 1, "epochs of the untimed training when no --model-path is given", min=1,
              max=100000),
        Param("requests", int, 200, "timed requests", min=1, max=100_000_000),
        Param("request_size", int, 8, "texts per request", min=1, max=1 << 20),
        Param("warmup_requests", int, 10, "requests before timing (the first is reported apart)", min=1,
              max=1_000_000),
        Param("display_every", int, 50, "log a line every N requests", min=1, max=1_000_000),
    )

    def check(self, params: dict[str, Any]) -> None:
        super().check(params)
        if params["model_path"] and not os.path.isfile(params["model_path"]):
            raise UsageError(f"--model-path {params['model_path']!r} is not a file")

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import numpy as np
        import torch

        from gpuvs.nlp import checkpoint, corpus, train
        from gpuvs.nlp.predict import Predictor

        p = ctx.params
        device, threads = self.setup(ctx)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        data = corpus.generate(self.task, p["sentences"], p["seed"])
        pool = corpus.as_examples(self.task, data.eval + data.train)
        yield events.startup("corpus_s", time.perf_counter() - t0)
        with tempfile.TemporaryDirectory(prefix="gpuvs-nlp-") as tmp:
            path = p["model_path"]
            if not path:
                t0 = time.perf_counter()
                trainer = train.Trainer(self.train_config(p, p["train_epochs"]),
                                        corpus.as_examples(self.task, data.train), device, labels=data.labels)
                for _ in trainer.run():
                    pass
                path = str(checkpoint.save(trainer.bundle(), os.path.join(tmp, f"{self.task}.pt")))
                del trainer
                yield events.startup("train_s", time.perf_counter() - t0)
            t0 = time.perf_counter()
            try:
                bundle = checkpoint.load(path, device)
            except checkpoint.ModelLoadError as exc:
                raise WorkloadError("input", str(exc)) from None
            sync()
            yield events.startup("model_load_s", time.perf_counter() - t0)
        if bundle.task != self.task:
            raise WorkloadError("input", f"model {p['model_path']} is a {bundle.task} model; use {bundle.task}-predict")
        predictor = Predictor(bundle, device, p["precision"])
        cfg = bundle.config
        yield events.config(**self.config_items(p, device, threads, mode="prediction",
                                                model=describe_model({**cfg, "model": cfg["arch"]}),
                                                model_file=p["model_path"] or "(trained for this run)",
                                                request_size=p["request_size"], requests=p["requests"],
                                                warmup_requests=p["warmup_requests"]))

        cursor = 0

        def next_request() -> list:
            nonlocal cursor
            batch = [pool[(cursor + i) % len(pool)] for i in range(p["request_size"])]
            cursor += p["request_size"]
            return batch

        def text_of(ex) -> str:
            return " ".join(ex[0])

        t0 = time.perf_counter()
        predictor.predict([text_of(ex) for ex in next_request()])
        yield events.startup("first_request_s", time.perf_counter() - t0)
        for _ in range(p["warmup_requests"] - 1):
            predictor.predict([text_of(ex) for ex in next_request()])
        yield events.startup("warmup_s", time.perf_counter() - t0)
        if ctx.spec.launched_at:
            yield events.startup("launch_to_timed_s", time.time() - ctx.spec.launched_at)

        latencies, gold, pred = [], [], []
        for i in range(1, p["requests"] + 1):
            batch = next_request()
            texts = [text_of(ex) for ex in batch]
            t0 = time.perf_counter()
            out = predictor.predict(texts)
            sec = time.perf_counter() - t0
            latencies.append(sec)
            n_tokens = sum(len(ex[0][:predictor.max_len]) for ex in batch)
            yield events.sample(i, len(texts) / sec, "examples/sec", series="predict", seconds=sec, items=len(texts),
                                latency_ms=sec * 1000, display=i % p["display_every"] == 0)
            yield events.sample(i, n_tokens / sec, "tokens/sec", series="tokens", seconds=sec, items=n_tokens)
            gold.extend(ex[1] for ex in batch)
            pred.extend(out)
        ms = np.asarray(latencies) * 1000.0
        for q in (50, 90, 99):
            yield events.metric(f"latency_p{q}_ms", float(np.percentile(ms, q)), "ms")
        yield events.metric("latency_mean_ms", float(ms.mean()), "ms")
        yield events.metric("latency_max_ms", float(ms.max()), "ms")
        total = float(sum(latencies))
        yield events.metric("timed_s", total, "s")
        yield events.metric("requests_per_sec", len(latencies) / total, "requests/sec")
        yield events.metric("examples_per_sec", len(gold) / total, "examples/sec")
        scores = train.score(self.task, gold, pred, predictor.max_len)
        for name, value in scores.items():
            yield events.metric(name, value)
        yield events.log(score_line(scores, f"latency p50 {np.percentile(ms, 50):.2f} ms, p99 "
                                            f"{np.percentile(ms, 99):.2f} ms"))


def describe_model(p: dict[str, Any]) -> str:
    heads = f" h{p['heads']}" if p["model"] == "transformer" else ""
    return f"{p['model']} d{p['d_model']} x{p['layers']}{heads}"


def score_line(scores: dict[str, float], more: str) -> str:
    """One line a person reads: is the model any good, and the figures that go with it."""
    text = f"accuracy {scores['accuracy']:.3f} (always the commonest label: {scores['baseline_accuracy']:.3f})"
    if "entity_f1" in scores:
        text += f", entity F1 {scores['entity_f1']:.3f}"
    return f"{text}; {more}"


def _raise_oom(exc: BaseException, p: dict[str, Any]) -> None:
    if type(exc).__name__ == "OutOfMemoryError":
        raise WorkloadError("oom", f"out of GPU memory at batch size {p['batch_size']} (d_model {p['d_model']}, "
                                   f"{p['layers']} layers): {str(exc).splitlines()[0][:160]}") from None


@register
class NerTrain(_TrainBase):
    name = "ner-train"
    summary = "NER training (BIO token tagging): examples/sec, tokens/sec, loss, accuracy, entity F1"
    task = "ner"


@register
class TcTrain(_TrainBase):
    name = "tc-train"
    summary = "text-classification training: examples/sec, tokens/sec, loss, accuracy"
    task = "tc"


@register
class NerPredict(_PredictBase):
    name = "ner-predict"
    summary = "NER prediction: per-request latency percentiles and throughput; model load timed apart"
    task = "ner"


@register
class TcPredict(_PredictBase):
    name = "tc-predict"
    summary = "text-classification prediction: per-request latency percentiles and throughput; model load apart"
    task = "tc"
