"""The gRPC NLP service for real: `gpuvs serve` processes on 127.0.0.1 and real gRPC clients.

Every refusal's status code, two clients training one name at once, and SIGTERM with calls in flight.
The load driver and the server as a workload. Every server process is shown gone afterwards."""

import json
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import gpuvs_env, pid_alive

grpc = pytest.importorskip("grpc")
pytest.importorskip("torch", reason="the NLP service needs torch (installed by .ci/run)")

from gpuvs.serve import nlp_pb2 as pb  # noqa: E402
from gpuvs.serve import channel as client  # noqa: E402

TINY = pb.TrainOptions(d_model=32, layers=1, heads=2, epochs=3, lr=0.01, progress_every=5)


class Served:
    """A `gpuvs serve` process; its port is read from the line it prints once it listens."""

    def __init__(self, models, *args, access=None):
        self.models = models
        self.log = open(models.parent / f"{models.name}-serve.err", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "serve", "--port", "0", "--device", "cpu",
                                      "--threads", "1", "--models-dir", str(models), *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=gpuvs_env())
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()
        first = self.lines.get(timeout=120)
        assert "listening on " in first, first + open(self.log.name).read()
        self.port = int(first.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
        self.target = f"127.0.0.1:{self.port}"
        self.access = access or client.Access()
        self.channel, self.stub = client.connect(self.target, access=self.access)

    def stop(self, timeout=60, sig=signal.SIGTERM):
        self.channel.close()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        out = []
        while not self.lines.empty():
            out.append(self.lines.get())
        return code, "".join(out)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("models"), "--max-message-mb", "1", "--grace", "2")
    yield s
    try:
        code, out = s.stop(sig=signal.SIGINT)  # Ctrl-C stops it as cleanly as SIGTERM (tested below)
        assert code == 0 and "Ctrl-C: stopping" in out and "stopped in" in out
        assert not pid_alive(s.proc.pid)
    finally:
        s.kill()


def train(stub, name, task=pb.TC, **kw):
    kw.setdefault("options", TINY)
    if "examples" not in kw:
        kw.setdefault("generated_sentences", 600)
    return list(stub.Train(pb.TrainRequest(model=name, task=task, **kw)))


def code_of(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_generated_code_is_up_to_date():
    pytest.importorskip("grpc_tools", reason="checking the generated code needs grpcio-tools")
    from gpuvs.serve import codegen

    assert codegen.stale() == [], "run: python -m gpuvs.serve.codegen"
    assert codegen._same_definitions()  # what stale() relies on where another grpcio-tools is installed
    assert "ValidateProtobufRuntimeVersion" not in (codegen.HERE / "nlp_pb2.py").read_text()
    assert "GRPC_GENERATED_VERSION" not in (codegen.HERE / "nlp_pb2_grpc.py").read_text()


def test_train_streams_progress_then_predict_both_tasks(server):
    # before any model exists: FAILED_PRECONDITION, not a crash
    assert code_of(lambda: server.stub.Predict(pb.PredictRequest(model="tc", texts=["hi"])))[0] == \
        grpc.StatusCode.FAILED_PRECONDITION
    progress = train(server.stub, "tc", generated_sentences=1000)
    steps = [p.step for p in progress if not p.done]
    assert steps == sorted(steps) and len(steps) >= 3 and progress[-1].done  # streamed while training
    final = progress[-1]
    assert final.accuracy > 0.5 and final.model_path == str(server.models / "tc.pt") and final.device == "cpu"
    assert (server.models / "tc.pt").is_file() and final.examples_per_sec > 0 and final.tokens_per_sec > 0
    r = server.stub.Predict(pb.PredictRequest(model="tc", texts=["the striker scored in the final match",
                                                                 "shares and profit rose in the market"]))
    assert [p.label for p in r.predictions] == ["sports", "business"] and r.server_seconds > 0
    assert all(0 < p.score <= 1 for p in r.predictions)

    ner = train(server.stub, "ner", task=pb.NER, examples=[
        pb.Example(tokens=["Anna", "Smith", "flew", "to", "Oslo", "."], tags=["B-PER", "I-PER", "O", "O", "B-LOC", "O"]),
        pb.Example(tokens=["Acme", "Corp", "hired", "Omar", "."], tags=["B-ORG", "I-ORG", "O", "B-PER", "O"])] * 20)
    assert ner[-1].done and ner[-1].accuracy > 0.9  # 40 examples of two sentences: learnt by heart
    r = server.stub.Predict(pb.PredictRequest(model="ner", texts=["Anna Smith flew to Oslo ."]))
    assert list(r.predictions[0].tokens) == ["Anna", "Smith", "flew", "to", "Oslo", "."]
    assert list(r.predictions[0].tags) == ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]
    names = {m.name: m for m in server.stub.ListModels(pb.ListModelsRequest()).models}
    assert names["tc"].task == pb.TC and names["ner"].task == pb.NER and names["tc"].loaded
    assert server.stub.Load(pb.LoadRequest(model="ner")).already_loaded
    again = server.stub.Load(pb.LoadRequest(model="ner", reload=True))
    assert not again.already_loaded and again.seconds > 0 and again.path == str(server.models / "ner.pt")


def _raw(server, method):
    return server.channel.unary_unary(f"/gpuvs.nlp.v1.Nlp/{method}")


@pytest.mark.parametrize("call, code, message", [
    (lambda s: train(s.stub, "x"  , examples=[], generated_sentences=0), "INVALID_ARGUMENT", "empty data set"),
    (lambda s: train(s.stub, "x", labels=["a", "b"], examples=[pb.Example(text="hello there", label="c")]),
     "INVALID_ARGUMENT", "example 0: unknown label 'c'; the labels are a, b"),
    (lambda s: train(s.stub, "x", task=pb.NER, labels=["PER"], examples=[pb.Example(tokens=["Oslo"], tags=["B-LOC"])]),
     "INVALID_ARGUMENT", "example 0: unknown label 'B-LOC'; the entity types are PER"),
    (lambda s: train(s.stub, "x", task=pb.NER, examples=[pb.Example(tokens=["a", "b"], tags=["O"])]),
     "INVALID_ARGUMENT", "example 0 has 2 tokens and 1 tags"),
    (lambda s: train(s.stub, "x", examples=[pb.Example(text="word " * 100, label="a")]),
     "INVALID_ARGUMENT", "example 0 has 100 tokens, over the limit of 64"),
    (lambda s: train(s.stub, "../etc/passwd"), "INVALID_ARGUMENT", "model name '../etc/passwd' is not allowed"),
    (lambda s: train(s.stub, "x", task=7), "INVALID_ARGUMENT", "task 7 is not one of NER (1), TC (2)"),
    (lambda s: train(s.stub, "x", options=pb.TrainOptions(d_model=30, heads=4)), "INVALID_ARGUMENT",
     "options.heads 4 must divide options.d_model 30"),
    (lambda s: s.stub.Predict(pb.PredictRequest(model="tc", texts=["x" * 3000])), "INVALID_ARGUMENT",
     "text 0 is 3000 characters long, over the limit of 2000"),
    (lambda s: s.stub.Predict(pb.PredictRequest(model="tc", texts=["one two " * 40])), "INVALID_ARGUMENT",
     "text 0 has 80 tokens, over the model's limit of 64"),
    (lambda s: s.stub.Predict(pb.PredictRequest(model="tc", texts=[])), "INVALID_ARGUMENT", "no texts"),
    # wrong field types: texts (a list of strings) sent as a number; bytes that are no message at all
    (lambda s: _raw(s, "Predict")(b"\x0a\x02tc\x10\x05"), "INVALID_ARGUMENT",
     "PredictRequest.texts (field 2) has the wrong type"),
    (lambda s: _raw(s, "Train")(b"\x0a\x01x\x1a\x05\x0a\x01a\x10\x07"), "INVALID_ARGUMENT",
     "TrainRequest.examples[0].label (field 2) has the wrong type"),
    (lambda s: _raw(s, "Train")(b"\xff\xff\xff\xff"), "INVALID_ARGUMENT", "the request is not a valid TrainRequest"),
    (lambda s: s.stub.Predict(pb.PredictRequest(model="nosuch", texts=["hi"])), "NOT_FOUND",
     "no model named 'nosuch'; the models are"),
    # 2 MiB against a 1 MiB limit: refused by gRPC's size limit before the server reads it
    (lambda s: s.stub.Predict(pb.PredictRequest(model="tc", texts=["word " * 400] * 1100)), "RESOURCE_EXHAUSTED",
     "larger than max"),
])
def test_bad_requests_get_a_status_and_the_server_serves_on(server, call, code, message):
    if not (server.models / "tc.pt").exists():
        train(server.stub, "tc")
    got, details = code_of(lambda: call(server))
    assert got.name == code and message in details, details
    r = server.stub.Predict(pb.PredictRequest(model="tc", texts=["rain and wind"]))  # still serving
    assert len(r.predictions) == 1 and server.proc.poll() is None


def test_a_saved_model_that_fails_to_load_is_reported_with_its_path(server):
    (server.models / "broken.pt").write_bytes(b"\x00\x01 not a model")
    got, details = code_of(lambda: server.stub.Predict(pb.PredictRequest(model="broken", texts=["hi"])))
    assert got == grpc.StatusCode.DATA_LOSS
    assert details.startswith(f"cannot load model {server.models / 'broken.pt'}: not a readable model file")
    got, details = code_of(lambda: server.stub.Load(pb.LoadRequest(model="broken")))
    assert got == grpc.StatusCode.DATA_LOSS and str(server.models / "broken.pt") in details


def test_concurrent_training_of_one_name_is_refused_and_never_corrupts_the_model(server):
    from gpuvs.nlp import checkpoint

    first = train(server.stub, "dup")
    saved = (server.models / "dup.pt").read_bytes()
    long = pb.TrainOptions(d_model=32, layers=1, heads=2, epochs=200, progress_every=1)
    # client A: a long training of "dup"; client B, on its own connection, asks for "dup" while it runs
    chan_b, stub_b = client.connect(server.target, own_connection=True)
    stream = server.stub.Train(pb.TrainRequest(model="dup", task=pb.TC, generated_sentences=600, options=long))
    assert not next(stream).done  # A is training now
    got, details = code_of(lambda: list(stub_b.Train(pb.TrainRequest(model="dup", task=pb.TC,
                                                                      generated_sentences=600, options=TINY))))
    assert got == grpc.StatusCode.ABORTED and "is being trained by another request" in details
    assert stub_b.Predict(pb.PredictRequest(model="dup", texts=["rain"])).predictions  # the old model serves on
    stream.cancel()  # A gives up half way: nothing is saved
    with pytest.raises(grpc.RpcError):
        list(stream)
    for _ in range(100):  # the server notices the cancel at its next step
        if not any(m.training for m in server.stub.ListModels(pb.ListModelsRequest()).models):
            break
        time.sleep(0.1)
    assert (server.models / "dup.pt").read_bytes() == saved and not list(server.models.glob(".*.tmp"))
    assert checkpoint.load(server.models / "dup.pt").task == "tc"
    assert train(stub_b, "dup")[-1].done  # and the name is free again
    chan_b.close()
    assert first[-1].done


def test_sigterm_finishes_short_calls_cancels_long_ones_and_exits(tmp_path):
    s = Served(tmp_path, "--grace", "6", "--max-in-flight", "4", "--max-trains", "2")
    try:
        long = s.stub.Train(pb.TrainRequest(model="long", task=pb.TC, generated_sentences=3000, options=pb.TrainOptions(
            d_model=32, layers=1, heads=2, epochs=500, progress_every=1)))
        assert not next(long).done
        short: list = []
        chan, stub = client.connect(s.target, own_connection=True)
        t = threading.Thread(target=lambda: short.extend(train(stub, "short", generated_sentences=300)))
        t.start()
        for _ in range(300):  # until the short training is in flight too (or already done)
            training = {m.name for m in s.stub.ListModels(pb.ListModelsRequest()).models if m.training}
            if short or "short" in training:
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        code, out = s.stop(timeout=60)
        took = time.monotonic() - t0
        t.join(timeout=30)
        assert code == 0 and "SIGTERM: stopping" in out and "stopped in" in out
        assert short and short[-1].done and (tmp_path / "short.pt").is_file()  # finished within the grace period
        with pytest.raises(grpc.RpcError) as err:
            list(long)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert not (tmp_path / "long.pt").exists() and not list(tmp_path.glob(".*.tmp"))  # nothing half-saved
        assert took < 45 and not pid_alive(s.proc.pid)
        with pytest.raises(ConnectionError):
            client.connect(s.target, timeout_s=1)
        chan.close()
    finally:
        s.kill()


def test_serve_load_reports_throughput_and_latency(server, cli, tmp_path):
    r = cli("run", "serve-load", "--target", server.target, "--clients", "3", "--requests", "30", "--request-size",
            "4", "--model", "load-tc", "--train-sentences", "300", "--train-d-model", "32", "--train-layers", "1",
            "--window", "0.2", "--device", "cpu", COLUMNS="200")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "30 requests in" in r.stdout and "from 3 clients" in r.stdout
    # the training is said before it starts, with an estimate from its first steps, then its time
    said, estimate, trained = (r.stdout.index(x) for x in (
        "training load-tc on the server first (it is not on the server): 300 generated sentences, 1 epoch(s), "
        "before 30 timed requests", "training load-tc: step 5 of ", "trained load-tc on the server"))
    assert said < estimate < trained and re.search(r"step 5 of \d+ after [\d.]+ s, about \d+ s in all", r.stdout)
    # each trial's latency is the mean over its requests: the summary names the statistic
    assert re.search(r"│ default │ latency \(mean\) +│ +1/1 │", r.stdout), r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    (trial_id, metrics, startup, fp), = db.execute("SELECT id, metrics, startup, fingerprint FROM trials")
    m = {k: v["value"] for k, v in json.loads(metrics).items()}
    assert m["failed_requests"] == 0 and 0 < m["latency_p50_ms"] <= m["latency_p90_ms"] <= m["latency_p99_ms"]
    assert m["requests_per_sec"] == pytest.approx(30 / m["elapsed_s"])
    assert m["texts_per_sec"] == pytest.approx(4 * m["requests_per_sec"])
    rows = db.execute("SELECT series, items, seconds FROM samples WHERE trial_id=?", (trial_id,)).fetchall()
    assert sum(i for s, i, _ in rows if s == "throughput") == 30  # every request counted once, in its window
    assert sum(sec for s, _, sec in rows if s == "throughput") == pytest.approx(m["elapsed_s"], rel=0.05)
    assert len([1 for s, _, _ in rows if s == "latency"]) == 30
    startup = json.loads(startup)
    assert {"train_s", "model_load_s", "first_request_s"} <= set(startup)  # trained first: it was missing
    assert startup["model_load_s"] > 0  # read from its file again, and timed by the server
    assert not pid_alive(json.loads(fp)["pid"])
    r = cli("report", db.execute("SELECT experiment_id FROM trials").fetchone()[0], "--format", "md")
    assert "| default | latency (mean) | cpu | host | 1/1 |" in r.stdout and "| default | throughput | cpu" in r.stdout


def test_serve_load_against_nothing_fails_plainly(cli, tmp_path):
    r = cli("run", "serve-load", "--target", "127.0.0.1:9", "--connect-timeout", "1", "--device", "cpu", "--quiet")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "nothing answers at 127.0.0.1:9" in r.stdout


def test_the_server_as_a_workload(tmp_path):
    from gpuvs.trial.runner import Runner
    from gpuvs.spec import RunSpec
    from gpuvs.store.db import Store

    port: queue.Queue = queue.Queue()
    done: list = []

    def on_event(result, event):
        if event["type"] == "log" and event["message"].startswith("listening on"):
            port.put(event["message"].rsplit(":", 1)[1])

    spec = RunSpec(workload="nlp-serve", device="cpu", params={"port": 0, "seconds": 12, "window": 0.5, "threads": 1,
                                                               "models_dir": str(tmp_path / "models")})
    def run():  # the runner in a thread of its own (with its own SQLite connection), the test as the client
        with Store(tmp_path / "gpuvs.db") as store:
            done.append(Runner(store, on_event=on_event, timeout_s=120).run_trial(spec))

    t = threading.Thread(target=run)
    t.start()
    target = f"127.0.0.1:{port.get(timeout=120)}"
    chan, stub = client.connect(target)
    train(stub, "w", generated_sentences=300)
    for _ in range(3):
        stub.Predict(pb.PredictRequest(model="w", texts=["rain", "snow"]))
    chan.close()
    t.join(timeout=120)
    res = done[0]
    assert res.ok, res.error
    assert res.metrics["train_calls"].value == 1 and res.metrics["predict_calls"].value == 3
    m = {k: v.value for k, v in res.metrics.items()}  # the server's own Metrics, stored with the trial
    assert m["peak_in_flight"] == 1 and m["refused"] == 0 and m["unauthenticated"] == 0 and m["models_loaded"] == 1
    assert 0 < m["models_mib"] < 1 and m["rss_mib"] > 50 and 0 < m["predict_p50_ms"] <= m["predict_p99_ms"]
    served = [s for s in res.samples if s.series == "served"]
    assert sum(s.items for s in served) == 4 and sum(s.extra["texts"] for s in served) == 6
    assert all(s.extra["in_flight"] == 0 and s.extra["queued"] == 0 for s in served[-2:])
    assert (tmp_path / "models" / "w.pt").is_file() and not pid_alive(res.fingerprint["pid"])


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port 70000 is not a TCP port"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--max-message-mb", "0"], "--max-message-mb 0 is out of range"),
])
def test_serve_bad_input_is_one_line_exit_2(cli, args, message):
    r = cli("serve", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("gpuvs: error:") and message in r.stderr and len(r.stderr.splitlines()) == 1


def test_serve_on_a_port_in_use_is_refused(cli):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        r = cli("serve", "--port", port, "--device", "cpu")
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
