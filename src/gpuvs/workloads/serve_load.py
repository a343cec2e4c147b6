"""serve-load: drive a gpuvs serve target with concurrent gRPC clients and measure what a caller sees.

The model is trained if missing (--train auto), loaded and warmed up before the timed requests.
Each client has its own channel and sends one request at a time; --requests is the total over all clients.
A request refused as busy is sent again after the retry hint; its latency includes the waits."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.errors import WorkloadError
from gpuvs.params import Param
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, amount, duration, rate


TRAIN_PROGRESS_EVERY = 5  # steps before the training's first progress message, which gives its estimate


@register
class ServeLoad(Workload):
    name = "serve-load"
    summary = "load on a gpuvs serve target: requests/sec, latency percentiles (gRPC clients)"
    unit = "requests/sec"
    metrics = (rate("throughput", headline=True), duration("latency"), duration("*_s"), rate("*_per_sec"),
               duration("*_ms"), amount("failed_requests"),
               amount("refused_responses"))
    requires = ("grpc", "google.protobuf")
    params = (
        Param("target", str, "", "HOST:PORT of a running gpuvs serve"),
        Param("task", str, "tc", "tc or ner", choices=("tc", "ner")),
        Param("model", str, "", "model name on the server (default: load-TASK)"),
        Param("clients", int, 4, "concurrent clients, each with its own connection", min=1, max=4096),
        Param("requests", int, 200, "timed requests, over all clients", min=1, max=100_000_000),
        Param("request_size", int, 8, "texts per request", min=1, max=65536),
        Param("warmup_requests", int, 10, "requests before timing (the first is reported apart)", min=1,
              max=1_000_000),
        Param("train", str, "auto", "train the model on the server first: auto (if missing), always, never",
              choices=("auto", "always", "never")),
        Param("train_sentences", int, 2000, "generated corpus for that training, and the texts sent", min=20,
              max=200_000),
        Param("train_epochs", int, 1, "epochs of that training", min=1, max=1000),
        Param("train_d_model", int, 0, "hidden size of that model (0: the server's default)", min=0, max=4096),
        Param("train_layers", int, 0, "layers of that model (0: the server's default)", min=0, max=48),
        Param("window", float, 0.5, "seconds per throughput sample", min=0.01, max=3600.0),
        Param("connect_timeout", float, 10.0, "seconds to wait for the server to answer", min=0.1, max=3600.0),
        Param("seed", int, 0, "seed of the texts sent", min=0),
        Param("retries", int, 20, "times a request refused as busy is sent again (after the server's hint)", min=0,
              max=1000),
        Param("tls", bool, False, "connect over TLS, trusting the system's CAs"),
        Param("tls_ca", str, "", "CA certificate (PEM) to trust: connect over TLS"),
        Param("server_name", str, "", "name the server's certificate must carry, when not the target's host"),
        Param("token_file", str, "", "file holding the server's token"),
    )

    def check(self, params: dict[str, Any]) -> None:
        from gpuvs.errors import UsageError

        if not params["target"]:
            raise UsageError("serve-load needs --target HOST:PORT (a running gpuvs serve)")
        from gpuvs.serve.channel import check_target

        check_target(params["target"])
        params["model"] = params["model"] or f"load-{params['task']}"
        from gpuvs.serve.request_checks import NAME

        if not NAME.fullmatch(params["model"]):
            raise UsageError(f"--model {params['model']!r}: letters, digits, '_', '.' or '-' (at most 64)")
        from gpuvs.serve.channel import Access
        from gpuvs.serve.security import read_secret

        Access(token_file=params["token_file"]).token()  # readable, one line: else one clear line now
        if params["tls_ca"]:
            read_secret(params["tls_ca"], "CA certificate")

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import grpc
        import numpy as np

        from gpuvs.nlp import corpus
        from gpuvs.serve import channel as client
        from gpuvs.serve import nlp_pb2 as pb

        p = ctx.params
        access = client.Access(p["tls"], p["tls_ca"], p["server_name"], p["token_file"])
        try:
            channel, stub = client.connect(p["target"], p["connect_timeout"], access=access)
        except ConnectionError as exc:
            raise WorkloadError("unavailable", str(exc)) from None
        yield events.config(mode="load", target=p["target"], task=p["task"], model=p["model"], clients=p["clients"],
                            requests=p["requests"], request_size=p["request_size"],
                            warmup_requests=p["warmup_requests"])
        try:
            names = {m.name for m in stub.ListModels(pb.ListModelsRequest()).models}
            if p["train"] == "always" or (p["train"] == "auto" and p["model"] not in names):
                why = "--train always" if p["train"] == "always" else "it is not on the server"
                yield events.log(f"training {p['model']} on the server first ({why}): {p['train_sentences']:,} "
                                 f"generated sentences, {p['train_epochs']:,} epoch(s), before {p['requests']:,} timed "
                                 f"requests; how long it takes is estimated from its first steps")
                yield from self._train(stub, pb, p)
            t0 = time.perf_counter()
            loaded = stub.Load(pb.LoadRequest(model=p["model"], reload=True))  # from its file, timed
            yield events.startup("load_call_s", time.perf_counter() - t0)
            yield events.startup("model_load_s", loaded.seconds)
            yield events.log(f"model {p['model']} ({pb.Task.Name(loaded.task)}) at {loaded.path}: "
                             f"the server took {loaded.seconds:.3f} s to load it")
        except grpc.RpcError as exc:
            raise WorkloadError("unavailable" if exc.code() == grpc.StatusCode.UNAVAILABLE else "input",
                                f"{p['target']}: {exc.code().name}: {exc.details()}") from None

        data = corpus.generate(p["task"], p["train_sentences"], p["seed"] + 1)
        texts = [s.text for s in data.eval + data.train]
        size = p["request_size"]

        def request(i: int) -> Any:
            return pb.PredictRequest(model=p["model"], texts=[texts[(i * size + j) % len(texts)] for j in range(size)])

        t0 = time.perf_counter()
        stub.Predict(request(0))
        yield events.startup("first_request_s", time.perf_counter() - t0)
        for i in range(1, p["warmup_requests"]):
            stub.Predict(request(i))
        yield events.startup("warmup_s", time.perf_counter() - t0)
        channel.close()

        load = _Load(p["target"], p["clients"], p["requests"], request, p["connect_timeout"], access, p["retries"])
        yield from load.run(p["window"])
        done = [r for r in load.results if r[2] == "OK"]
        if not done:
            raise WorkloadError("crash", f"every request failed; first: {load.results[0][3]}")
        lat = np.asarray([r[1] for r in done]) * 1000.0
        server = np.asarray([r[4] for r in done]) * 1000.0
        for i, ms in enumerate(lat, 1):
            yield events.sample(i, ms, "ms", series="latency")
        elapsed = max(r[0] for r in load.results) - load.start
        yield events.metric("elapsed_s", elapsed, "s")
        yield events.metric("requests_per_sec", len(done) / elapsed, "requests/sec")
        yield events.metric("texts_per_sec", len(done) * size / elapsed, "texts/sec")
        for q in (50, 90, 99):
            yield events.metric(f"latency_p{q}_ms", float(np.percentile(lat, q)), "ms")
        yield events.metric("latency_mean_ms", float(lat.mean()), "ms")
        yield events.metric("latency_max_ms", float(lat.max()), "ms")
        yield events.metric("server_p50_ms", float(np.percentile(server, 50)), "ms")
        failed = len(load.results) - len(done)
        yield events.metric("failed_requests", failed)
        yield events.metric("refused_responses", load.refusals)
        yield events.log(f"{len(done):,} requests in {elapsed:.2f} s from {p['clients']:,} clients: "
                         f"{len(done) / elapsed:.1f} requests/sec, latency p50 {np.percentile(lat, 50):.2f} ms, "
                         f"p99 {np.percentile(lat, 99):.2f} ms; {load.refusals} busy refusals retried"
                         + (f"; {failed} failed, first: "
                         f"{next(r[3] for r in load.results if r[2] != 'OK')}" if failed else ""))

    def _train(self, stub, pb, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        t0 = time.perf_counter()
        task = pb.NER if p["task"] == "ner" else pb.TC
        last = None
        for last in stub.Train(pb.TrainRequest(model=p["model"], task=task, generated_sentences=p["train_sentences"],
                                               options=pb.TrainOptions(epochs=p["train_epochs"], seed=p["seed"],
                                                                       d_model=p["train_d_model"],
                                                                       layers=p["train_layers"],
                                                                       progress_every=TRAIN_PROGRESS_EVERY))):
            if last.step == TRAIN_PROGRESS_EVERY and not last.done and last.total_steps > last.step:
                yield events.log(f"training {p['model']}: step {last.step:,} of {last.total_steps:,} after "
                                 f"{last.elapsed_s:.1f} s, about {last.elapsed_s * last.total_steps / last.step:.0f} s "
                                 f"in all")
        yield events.startup("train_s", time.perf_counter() - t0)
        if last is not None:
            yield events.log(f"trained {p['model']} on the server ({last.device}) in {last.elapsed_s:.2f} s: "
                             f"accuracy {last.accuracy:.3f}, {last.examples_per_sec:.0f} examples/sec")


class _Load:
    """`clients` threads, each with its own channel, taking request numbers from one counter.
    results: (t_end, latency_s, status name, details, server_seconds) per request."""

    def __init__(self, target: str, clients: int, requests: int, make, connect_timeout: float, access, retries: int):
        self.target, self.clients, self.requests, self.make = target, clients, requests, make
        self.connect_timeout, self.access, self.retries = connect_timeout, access, retries
        self.refusals = 0
        self.results: list[tuple[float, float, str, str, float]] = []
        self._next = self._finished = 0
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        self.start = 0.0

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= self.requests:
                return None
            self._next += 1
            return self._next

    def _client(self, channel, stub, go: threading.Event) -> None:
        import grpc

        go.wait()
        try:
            while (i := self._take()) is not None:
                req = self.make(i + 1000)
                t0 = time.perf_counter()
                for attempt in range(self.retries + 1):
                    try:
                        resp = stub.Predict(req)
                        row = (time.perf_counter(), time.perf_counter() - t0, "OK", "", resp.server_seconds)
                        break
                    except grpc.RpcError as exc:
                        row = (time.perf_counter(), time.perf_counter() - t0, exc.code().name, exc.details() or "", 0.0)
                        wait = retry_after_s(exc)
                        if wait is None or attempt == self.retries:
                            break
                        with self._lock:
                            self.refusals += 1
                        time.sleep(wait)
                with self._lock:
                    self.results.append(row)
        finally:
            with self._lock:
                self._finished += 1
                if self._finished == self.clients:
                    self._all_done.set()
            channel.close()

    def run(self, window: float) -> Iterator[dict[str, Any]]:
        """Start the clients together; yield one throughput sample per window until all are done
        (the last window ends with the last reply, so the windows add up to the elapsed time)."""
        from gpuvs.serve import channel as client

        go = threading.Event()
        threads = []
        for _ in range(self.clients):
            channel, stub = client.connect(self.target, self.connect_timeout, own_connection=True, access=self.access)
            threads.append(threading.Thread(target=self._client, args=(channel, stub, go), daemon=True))
        for t in threads:
            t.start()
        self.start = edge = time.perf_counter()
        go.set()
        seen = step = 0
        while True:
            finished = self._all_done.wait(max(0.0, edge + window - time.perf_counter()))
            with self._lock:
                count = sum(1 for r in self.results[seen:] if r[2] == "OK")
                seen = len(self.results)
                now = max([edge] + [r[0] for r in self.results]) if finished else time.perf_counter()
            if now > edge:
                step += 1
                yield events.sample(step, count / (now - edge), "requests/sec", series="throughput",
                                    seconds=now - edge, items=count, display=True)
            edge = now
            if finished:
                break
        for t in threads:
            t.join()


def retry_after_s(exc) -> float | None:
    """Seconds to wait before sending again, from a busy refusal's hint (RESOURCE_EXHAUSTED with the
    trailing metadata retry-after-ms); None for any other failure (not retried)."""
    import grpc

    from gpuvs.serve.admission import RETRY_METADATA

    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_METADATA:
            try:
                return min(30.0, max(0.0, int(value) / 1000.0))
            except ValueError:
                return None
    return None
