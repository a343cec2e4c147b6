"""The NLP gRPC service and its server.

Handlers parse the raw request bytes themselves, so a malformed request gets INVALID_ARGUMENT.
No exception reaches gRPC: a refusal is its status code, anything unexpected INTERNAL, and the server serves on.
Load limits are admission.py's, who may call security.py's; stop(grace) lets calls in flight finish for `grace` s."""

from __future__ import annotations

import functools
import sys
import threading
import time
import traceback
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gpuvs.serve import call_stats as metrics_mod
from gpuvs.serve import nlp_pb2 as pb
from gpuvs.serve import request_checks as validate
from gpuvs.serve.admission import Admission
from gpuvs.serve.settings import ServeConfig
from gpuvs.serve.model_files import ModelStore
from gpuvs.serve.request_checks import Limits, Refused

SERVICE = pb.DESCRIPTOR.services_by_name["Nlp"]
TASK_ENUM = {"ner": pb.NER, "tc": pb.TC}

# on_request(method, seconds, items, status code name): for the nlp-serve workload's figures
RequestHook = Callable[[str, float, int, str], None]
GATED = ("Train", "Predict", "Load")  # the calls that take a slot


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} gpuvs serve: {message}", file=sys.stderr, flush=True)


class NlpService:
    def __init__(self, store: ModelStore, limits: Limits, stopping: threading.Event, admission: Admission,
                 on_request: RequestHook | None = None):
        self.store, self.limits, self.stopping, self.admission = store, limits, stopping, admission
        self.on_request = on_request
        self.calls = metrics_mod.CallLog()
        self.started = time.monotonic()
        self.budget_refusals = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _report(self, method: str, t0: float, items: int, code: str, admitted: bool) -> None:
        seconds = time.perf_counter() - t0
        if admitted:
            self.calls.record(method, seconds, code == "OK")
        if self.on_request:
            self.on_request(method, seconds, items, code)

    def _calls(self, method: str, raw: bytes, fn, context: grpc.ServicerContext, admitted: list[bool]):
        """fn's messages, inside a slot when the method takes one (admitted[0] says whether it got in)."""
        if method not in GATED:
            admitted[0] = True
            yield from fn(context)
            return
        if method == "Train":  # refused at once, not after a wait in the queue
            self.store.check_trains(validate.model_name(validate.parse(pb.TrainRequest, raw).model))
        with self.admission.slot(context):
            admitted[0] = True
            yield from fn(context)

    def _stream(self, method: str, fn):
        """A handler around fn(raw, context), which yields (message, items); every outcome reported,
        every failure a status (a refusal's own, or INTERNAL with the reason: the server serves on)."""
        @functools.wraps(fn)
        def handler(raw: bytes, context: grpc.ServicerContext):
            t0 = time.perf_counter()
            items = 0
            admitted = [False]
            try:
                for message, n in self._calls(method, raw, lambda ctx: fn(raw, ctx), context, admitted):
                    items += n
                    yield message
            except GeneratorExit:  # gRPC stopped reading a stream: its client went away
                self._report(method, t0, items, "CANCELLED", admitted[0])
                self._gave_up(context)
                raise
            except Refused as exc:
                self._report(method, t0, items, exc.code.name, admitted[0])
                if admitted[0]:
                    self._gave_up(context)
                if exc.trailers:
                    context.set_trailing_metadata(exc.trailers)
                context.abort(exc.code, exc.message)
            except Exception as exc:  # never a crashed server: the reason goes back to the caller
                traceback.print_exc(file=sys.stderr)
                self._report(method, t0, items, "INTERNAL", admitted[0])
                context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            self._report(method, t0, items, "OK", True)
        return handler

    def _gave_up(self, context: grpc.ServicerContext) -> None:
        """Count a call that ran and whose client cancelled it or whose deadline passed."""
        if context.is_active():
            return
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            self.admission.deadline_exceeded += 1
        else:
            self.admission.cancelled += 1

    def _unary(self, method: str, fn):
        stream = self._stream(method, lambda raw, context: iter([fn(raw, context)]))

        @functools.wraps(fn)
        def handler(raw: bytes, context: grpc.ServicerContext):
            (response,) = list(stream(raw, context))  # run to the end: the slot is freed, the call reported
            return response
        return handler

    def handler(self) -> grpc.GenericRpcHandler:
        ser = {"Train": pb.TrainProgress, "Predict": pb.PredictResponse, "Load": pb.LoadResponse,
               "ListModels": pb.ListModelsResponse, "Metrics": pb.MetricsResponse}
        methods = {
            "Train": grpc.unary_stream_rpc_method_handler(self._stream("Train", self.train),
                                                          response_serializer=ser["Train"].SerializeToString),
        }
        for name, fn in (("Predict", self.predict), ("Load", self.load), ("ListModels", self.list_models),
                         ("Metrics", self.metrics_call)):
            methods[name] = grpc.unary_unary_rpc_method_handler(self._unary(name, fn),
                                                                response_serializer=ser[name].SerializeToString)
        assert set(methods) == {m.name for m in SERVICE.methods}, "nlp.proto and the handlers differ"
        return grpc.method_handlers_generic_handler(SERVICE.full_name, methods)

    # -- the calls -----------------------------------------------------------------------------

    def train(self, raw: bytes, context) -> Iterator[tuple[pb.TrainProgress, int]]:
        try:
            job = validate.train_request(validate.parse(pb.TrainRequest, raw), self.limits)
        except Refused as exc:
            if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # over the compute budget
                self.budget_refusals += 1
            raise
        with self.store.training(job.name) as progress:
            yield from self._train(job, context, progress)

    def _train(self, job: validate.TrainJob, context, progress) -> Iterator[tuple[pb.TrainProgress, int]]:
        import torch

        from gpuvs.nlp import train

        cfg = train.TrainConfig(task=job.task, **job.options)
        device = self.store.device
        _log(f"training {job.name} ({job.task}, {cfg.arch} d{cfg.d_model} x{cfg.layers}, {len(job.train)} examples, "
             f"{cfg.epochs} epochs) on {device}")
        t0 = time.perf_counter()
        try:
            trainer = train.Trainer(cfg, job.train, device, labels=job.labels)
            total = progress.total = trainer.total_steps
            examples = tokens = 0
            timed = 0.0

            def stop() -> bool:  # asked before every step
                progress.step += 1
                return self.stopping.is_set() or not context.is_active()
            for kind, value in trainer.run(warmup_steps=0, display_every=job.progress_every, should_stop=stop):
                if kind != "steps":
                    continue
                sec = sum(s.seconds for s in value)
                n_ex, n_tok = sum(s.examples for s in value), sum(s.tokens for s in value)
                examples, tokens, timed = examples + n_ex, tokens + n_tok, timed + sec
                last = value[-1]
                yield pb.TrainProgress(epoch=last.epoch, step=last.step, total_steps=total, loss=last.loss,
                                       examples_per_sec=n_ex / sec, tokens_per_sec=n_tok / sec,
                                       elapsed_s=time.perf_counter() - t0, device=device), 0
            scores = trainer.evaluate(job.eval)
            if self.stopping.is_set() or not context.is_active():
                raise train.Cancelled
            path = self.store.put(job.name, trainer.bundle())
        except train.Cancelled:
            _log(f"training {job.name} stopped before the end; nothing was saved")
            raise Refused(grpc.StatusCode.CANCELLED if not self.stopping.is_set() else grpc.StatusCode.UNAVAILABLE,
                          f"training of {job.name} was stopped (server shutting down or call cancelled); "
                          "the saved model, if any, is unchanged") from None
        except torch.cuda.OutOfMemoryError as exc:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"out of GPU memory training {job.name}: "
                                                               f"{str(exc).splitlines()[0][:160]}") from None
        elapsed = time.perf_counter() - t0
        _log(f"trained {job.name} in {elapsed:.2f} s: accuracy {scores['accuracy']:.3f}; saved to {path}")
        yield pb.TrainProgress(epoch=cfg.epochs, step=total, total_steps=total, done=True, elapsed_s=elapsed,
                               examples_per_sec=examples / timed if timed else 0.0,
                               tokens_per_sec=tokens / timed if timed else 0.0, accuracy=scores["accuracy"],
                               entity_f1=scores.get("entity_f1", 0.0), model_path=str(path), device=device), examples

    def predict(self, raw: bytes, context) -> tuple[pb.PredictResponse, int]:
        name, texts = validate.predict_request(validate.parse(pb.PredictRequest, raw), self.limits)
        loaded, already = self.store.get(name)
        predictor: Any = loaded.predictor
        validate.texts_fit(texts, predictor.max_len, self.limits)
        if not context.is_active():  # cancelled, or its deadline passed, while the model loaded
            raise Refused(grpc.StatusCode.CANCELLED, "the call ended before its prediction started")
        t0 = time.perf_counter()
        out = predictor.predict(texts)
        response = pb.PredictResponse(server_seconds=time.perf_counter() - t0,
                                      load_seconds=0.0 if already else loaded.seconds)
        for o in out:
            response.predictions.add(label=o.get("label", ""), score=o.get("score", 0.0), tokens=o.get("tokens", []),
                                     tags=o.get("tags", []))
        return response, len(texts)

    def load(self, raw: bytes, context) -> tuple[pb.LoadResponse, int]:
        req = validate.parse(pb.LoadRequest, raw)
        loaded, already = self.store.get(validate.model_name(req.model), reload=req.reload)
        if not already:
            _log(f"loaded {req.model} from {loaded.path} in {loaded.seconds:.3f} s")
        task = TASK_ENUM[loaded.predictor.bundle.task]  # type: ignore[attr-defined]
        return pb.LoadResponse(seconds=loaded.seconds, already_loaded=already, path=str(loaded.path), task=task), 0

    def list_models(self, raw: bytes, context) -> tuple[pb.ListModelsResponse, int]:
        validate.parse(pb.ListModelsRequest, raw)
        response = pb.ListModelsResponse()
        for m in self.store.info():
            response.models.add(name=m["name"], path=m["path"], loaded=m["loaded"], training=m["training"],
                                task=TASK_ENUM.get(m["task"], pb.TASK_UNSPECIFIED))
        return response, 0

    def metrics_call(self, raw: bytes, context) -> tuple[pb.MetricsResponse, int]:
        validate.parse(pb.MetricsRequest, raw)
        return metrics_mod.to_proto(self.snapshot(), pb), 0

    def snapshot(self) -> metrics_mod.ServerMetrics:
        a, store = self.admission, self.store
        models, total = store.usage()
        return metrics_mod.ServerMetrics(
            device=store.device, uptime_s=time.monotonic() - self.started, in_flight=a.in_flight, queued=a.queued,
            max_in_flight=a.max_in_flight, max_queue=a.max_queue, peak_in_flight=a.peak_in_flight,
            peak_queued=a.peak_queued, refused=a.refused, refused_train=store.refused_trains + self.budget_refusals,
            cancelled=a.cancelled, deadline_exceeded=a.deadline_exceeded, unauthenticated=self.calls.unauthenticated,
            trains_running=store.trains_running(), calls=self.calls.stats(), models=models, models_bytes=total,
            model_cache_bytes=store.cache_bytes, evictions=store.evictions, rss_bytes=metrics_mod.rss_bytes(),
            gpu_allocated_bytes=metrics_mod.gpu_allocated_bytes(store.device))


class NlpServer:
    """The service on config.host:config.port (port 0: a free one), with its own thread pool: one
    thread per slot and queue place, and config.SPARE_THREADS more. gRPC itself refuses calls past
    HARD_LIMIT x that many at once (RESOURCE_EXHAUSTED, without a hint), so nothing grows unbounded
    even when a flood outruns the admission code."""

    HARD_LIMIT = 4

    def __init__(self, config: ServeConfig, on_request: RequestHook | None = None):
        self.config = config
        self.host, self.requested_port, self.device = config.host, config.port, config.device
        self.threads = config.threads
        self.models_dir = Path(config.models_dir)
        self.limits = config.limits
        self.stopping = threading.Event()
        self.store = ModelStore(self.models_dir, self.device, config.cache_bytes, config.max_trains)
        self.admission = Admission(config.max_in_flight, config.max_queue, config.queue_timeout_s)
        self.service = NlpService(self.store, self.limits, self.stopping, self.admission, on_request)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.port: int | None = None
        self.ready_s = 0.0
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None

    def _unauthenticated(self) -> None:
        self.service.calls.unauthenticated += 1

    def warm_up(self) -> float:
        """Import torch and start the device before taking calls, so the first call does not pay for it."""
        t0 = time.perf_counter()
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.device.startswith("cuda"):
            torch.zeros(1, device=self.device)
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def start(self) -> int:
        """Bind the port (OSError if it cannot), warm up (self.ready_s), then take calls."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        pool = self.config.threads_in_pool
        credentials = self.config.security.credentials()
        interceptors = self.config.security.interceptors(self._unauthenticated)
        self._executor = futures.ThreadPoolExecutor(max_workers=pool, thread_name_prefix="gpuvs-serve")
        size = self.limits.max_message_bytes
        self._server = grpc.server(self._executor, interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size),
            ("grpc.so_reuseport", 0)], maximum_concurrent_rpcs=self.HARD_LIMIT * pool)
        self._server.add_generic_rpc_handlers((self.service.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        for name in ("", SERVICE.full_name):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        address = f"{self.host}:{self.requested_port}"
        try:
            port = (self._server.add_secure_port(address, credentials) if credentials is not None
                    else self._server.add_insecure_port(address))
        except RuntimeError as exc:
            port, reason = 0, str(exc)
        else:
            reason = "the address is in use or not valid here"
        if not port:
            self._executor.shutdown(wait=False)
            self._server = None
            raise OSError(f"cannot listen on {address}: {reason}")
        self.port = port
        self.ready_s = self.warm_up()
        self._server.start()
        return port

    def stop(self, grace: float = 5.0) -> None:
        """No new calls; calls in flight get `grace` seconds, then are cancelled; returns once every
        handler thread has ended (a second Ctrl-C while waiting cuts the grace period short)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self.health.enter_graceful_shutdown()
        try:
            server.stop(grace).wait()
        finally:
            self.stopping.set()  # anything still running is past the grace period: stop it
            server.stop(0).wait()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
