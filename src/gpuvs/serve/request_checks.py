"""Every check a request gets before any model work starts. A bad request is a Refused with a gRPC
status code and a message that says what is wrong, never an exception that reaches gRPC."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpuvs.nlp import corpus, data
from gpuvs.serve import nlp_pb2 as pb

TASKS = {pb.NER: "ner", pb.TC: "tc"}
ARCHS = ("transformer", "bilstm")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.code, self.message, self.trailers = code, message, trailers


def invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass
class Limits:
    max_message_bytes: int = 4 << 20  # gRPC refuses larger requests before they reach a handler
    max_text_chars: int = 2000
    max_texts: int = 4096             # texts in one Predict
    max_generated: int = 200_000      # generated_sentences in one Train
    max_epochs: int = 1000
    max_len: int = 512                # the largest options.max_len
    # the compute budget of one Train, checked before anything starts (see train_cost)
    max_train_flops: float = 1e15
    max_model_params: int = 100_000_000


@dataclass
class TrainJob:
    name: str
    task: str
    train: list = field(default_factory=list)  # (tokens, tags) or (tokens, label)
    eval: list = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    progress_every: int = 20


def parse(cls, raw: bytes):
    """A message from the wire; bytes that are not one, or that carry a known field with the wrong
    type, are INVALID_ARGUMENT (protobuf itself would keep the wrong-typed field aside, unknown)."""
    from google.protobuf.message import DecodeError

    try:
        msg = cls.FromString(raw)
    except DecodeError as exc:
        raise invalid(f"the request is not a valid {cls.DESCRIPTOR.name} ({exc})") from None
    _check_types(msg, cls.DESCRIPTOR.name)
    return msg


def _unknown(msg) -> list[tuple[int, int]]:
    try:
        from google.protobuf import unknown_fields

        return [(f.field_number, f.wire_type) for f in unknown_fields.UnknownFieldSet(msg)]
    except ImportError:  # protobuf < 4.24
        return [(f.field_number, f.wire_type) for f in msg.UnknownFields()]


def _check_types(msg, where: str) -> None:
    fields = msg.DESCRIPTOR.fields_by_number
    for number, wire in _unknown(msg):
        if number in fields:
            f = fields[number]
            raise invalid(f"{where}.{f.name} (field {number}) has the wrong type (wire type {wire}); "
                          f"expected {_type_name(f)}")
    for f, value in msg.ListFields():
        if f.message_type is not None:
            items = value if _repeated(f) else [value]
            for i, item in enumerate(items):
                _check_types(item, f"{where}.{f.name}" + (f"[{i}]" if _repeated(f) else ""))


def _repeated(f) -> bool:
    try:
        return f.is_repeated
    except AttributeError:  # protobuf < 5.27
        return f.label == f.LABEL_REPEATED


def _type_name(f) -> str:
    names = {f.TYPE_STRING: "a string", f.TYPE_UINT32: "an unsigned integer", f.TYPE_FLOAT: "a number",
             f.TYPE_BOOL: "a boolean", f.TYPE_ENUM: "an enum value", f.TYPE_MESSAGE: "a message"}
    word = names.get(f.type, "another type")
    return f"a list of {word.split(' ', 1)[1]}s" if _repeated(f) else word


def model_name(name: str) -> str:
    if not NAME.fullmatch(name or ""):
        raise invalid(f"model name {name!r} is not allowed: 1 to 64 letters, digits, '_', '.' or '-', "
                      "starting with a letter or digit")
    return name


def _option(value, default, name: str, low: float, high: float):
    if value == 0:
        return default
    if not (low <= value <= high) or (isinstance(value, float) and not math.isfinite(value)):
        raise invalid(f"options.{name} {value!r} is out of range: {low:g} to {high:g}")
    return value


def train_options(o: pb.TrainOptions, limits: Limits) -> dict[str, Any]:
    arch = o.arch or "transformer"
    if arch not in ARCHS:
        raise invalid(f"options.arch {o.arch!r} is not one of {', '.join(ARCHS)}")
    opts = dict(arch=arch, epochs=_option(o.epochs, 2, "epochs", 1, limits.max_epochs),
                batch_size=_option(o.batch_size, 32, "batch_size", 1, 65536),
                d_model=_option(o.d_model, 256, "d_model", 8, 4096), layers=_option(o.layers, 4, "layers", 1, 48),
                heads=_option(o.heads, 4, "heads", 1, 64), lr=_option(o.lr, 1e-3, "lr", 1e-8, 10.0),
                seed=o.seed, max_len=_option(o.max_len, 64, "max_len", 1, limits.max_len),
                progress_every=_option(o.progress_every, 20, "progress_every", 1, 1_000_000))
    if arch == "transformer" and opts["d_model"] % opts["heads"]:
        raise invalid(f"options.heads {opts['heads']} must divide options.d_model {opts['d_model']}")
    if arch == "bilstm" and opts["d_model"] % 2:
        raise invalid(f"options.d_model {opts['d_model']} must be even for the bilstm")
    return opts


def train_request(req: pb.TrainRequest, limits: Limits) -> TrainJob:
    name = model_name(req.model)
    if req.task not in TASKS:
        raise invalid(f"task {req.task} is not one of NER (1), TC (2)")
    task = TASKS[req.task]
    opts = train_options(req.options, limits)
    job = TrainJob(name, task, options=opts, progress_every=opts.pop("progress_every"))
    if req.examples and req.generated_sentences:
        raise invalid("send examples or generated_sentences, not both")
    if not req.examples and not req.generated_sentences:
        raise invalid("empty data set: send examples, or generated_sentences > 0 for the built-in corpus")
    if req.generated_sentences:
        if req.labels:
            raise invalid("labels go with examples; the generated corpus has its own")
        if not 20 <= req.generated_sentences <= limits.max_generated:
            raise invalid(f"generated_sentences {req.generated_sentences} is out of range: 20 to {limits.max_generated}")
        sample = corpus.as_examples(task, corpus.generate(task, 100, opts["seed"]).train)
        per_sentence = sum(min(len(ex[0]), opts["max_len"]) for ex in sample) / len(sample)
        check_budget(opts, 0.9 * req.generated_sentences * per_sentence, limits)  # 90% is trained on
        gen = corpus.generate(task, req.generated_sentences, opts["seed"])
        job.train, job.eval = corpus.as_examples(task, gen.train), corpus.as_examples(task, gen.eval)
        job.labels = gen.labels
        return job
    declared = _declared_labels(list(req.labels), task)
    examples = [(_ner_example if task == "ner" else _tc_example)(i, ex, declared, opts["max_len"], limits)
                for i, ex in enumerate(req.examples)]
    if task == "ner":
        types = declared if declared is not None else sorted({g[2:] for ex in examples for g in ex[1] if g != "O"})
        job.labels = data.tag_set(types)
    else:
        job.labels = declared if declared is not None else sorted({ex[1] for ex in examples})
    # hold out every tenth example (seeded) for the accuracy figures; with fewer than 20, score the training set
    order = list(range(len(examples)))
    random.Random(opts["seed"]).shuffle(order)
    held = set(order[:len(examples) // 10]) if len(examples) >= 20 else set()
    job.train = [ex for i, ex in enumerate(examples) if i not in held]
    job.eval = [ex for i, ex in enumerate(examples) if i in held] or job.train
    check_budget(opts, sum(len(ex[0]) for ex in job.train), limits)
    return job


def model_params(opts: dict[str, Any]) -> int:
    """Parameters of the model's layers, embeddings left out (they grow with the vocabulary, and a
    lookup costs no multiply-adds): 12 d² a transformer layer (attention 4 d², feed-forward 8 d²),
    6 d² a BiLSTM layer (two directions of 4 gates, hidden d/2, input d)."""
    d, layers = opts["d_model"], opts["layers"]
    return layers * d * d * (12 if opts["arch"] == "transformer" else 6)


def train_cost(opts: dict[str, Any], tokens: float) -> float:
    """Training FLOPs, the usual estimate: 6 x parameters x tokens seen (forward 2, backward 4)."""
    return 6.0 * model_params(opts) * tokens * opts["epochs"]


def check_budget(opts: dict[str, Any], tokens: float, limits: Limits) -> None:
    """Refuse a Train over the compute budget before any model is built (RESOURCE_EXHAUSTED, the limit in it)."""
    params = model_params(opts)
    shape = f"{opts['arch']} d_model {opts['d_model']} x {opts['layers']} layers"
    if params > limits.max_model_params:
        raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"the model ({shape}) has {params:,} parameters, over the server's limit of "
                      f"{limits.max_model_params:,} (--max-model-params)")
    flops = train_cost(opts, tokens)
    if flops > limits.max_train_flops:
        raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"this training would cost about {flops:.3g} FLOPs (6 x {params:,} parameters x "
                      f"{tokens:,.0f} tokens x {opts['epochs']} epochs), over the server's budget of "
                      f"{limits.max_train_flops:.3g} (--max-train-flops); use a smaller model, fewer examples "
                      "or fewer epochs")


def _declared_labels(labels: list[str], task: str) -> list[str] | None:
    if not labels:
        return None
    if len(set(labels)) != len(labels) or any(not label for label in labels):
        raise invalid("labels must be distinct and not empty")
    if task == "ner":
        bad = [t for t in labels if not _TYPE.fullmatch(t)]
        if bad:
            raise invalid(f"NER labels are entity types such as PER or LOC; {bad[0]!r} is not one")
    return labels


def _tc_example(i: int, ex: pb.Example, declared, max_len: int, limits: Limits):
    if ex.tokens or ex.tags:
        raise invalid(f"example {i}: tokens and tags are for NER; a TC example has text and label")
    tokens = _text(f"example {i}", ex.text, max_len, limits, "the limit of {} (options.max_len)")
    if not ex.label:
        raise invalid(f"example {i} has no label")
    if declared is not None and ex.label not in declared:
        raise invalid(f"example {i}: unknown label {ex.label!r}; the labels are {', '.join(declared)}")
    return tokens, ex.label


def _ner_example(i: int, ex: pb.Example, declared, max_len: int, limits: Limits):
    if ex.label:
        raise invalid(f"example {i}: label is for TC; an NER example has tokens and one tag per token")
    tokens, tags = list(ex.tokens), list(ex.tags)
    if not tokens:
        raise invalid(f"example {i} has no tokens")
    if len(tags) != len(tokens):
        raise invalid(f"example {i} has {len(tokens)} tokens and {len(tags)} tags; it needs one tag per token")
    if len(tokens) > max_len:
        raise invalid(f"example {i} has {len(tokens)} tokens, over the limit of {max_len} (options.max_len)")
    if any(not t or t.split() != [t] or len(t) > limits.max_text_chars for t in tokens):
        raise invalid(f"example {i}: a token is empty, holds white space or is too long")
    bad = data.check_tags(tags)
    if bad is not None:
        raise invalid(f"example {i}: tag {bad!r} is not O, B-TYPE or I-TYPE")
    if declared is not None:
        for tag in tags:
            if tag != "O" and tag[2:] not in declared:
                raise invalid(f"example {i}: unknown label {tag!r}; the entity types are {', '.join(declared)}")
    return tokens, tags


def _text(where: str, text: str, max_len: int | None, limits: Limits,
          limit: str = "the model's limit of {}") -> list[str]:
    if len(text) > limits.max_text_chars:
        raise invalid(f"{where} is {len(text)} characters long, over the limit of {limits.max_text_chars}")
    tokens = data.tokenize(text)
    if not tokens:
        raise invalid(f"{where} is empty (no words)")
    if max_len is not None and len(tokens) > max_len:
        raise invalid(f"{where} has {len(tokens)} tokens, over " + limit.format(max_len))
    return tokens


def predict_request(req: pb.PredictRequest, limits: Limits) -> tuple[str, list[str]]:
    name = model_name(req.model)
    if not req.texts:
        raise invalid("no texts to predict")
    if len(req.texts) > limits.max_texts:
        raise invalid(f"{len(req.texts)} texts in one request, over the limit of {limits.max_texts}")
    for i, text in enumerate(req.texts):
        _text(f"text {i}", text, None, limits)
    return name, list(req.texts)


def texts_fit(texts: list[str], max_len: int, limits: Limits) -> None:
    """Once the model is known: no text longer than it takes."""
    for i, text in enumerate(texts):
        _text(f"text {i}", text, max_len, limits)
