"""`gpuvs serve` under load and on a network, for real: server processes and real gRPC clients.

A burst gets only OK and RESOURCE_EXHAUSTED while health answers; cancelled and expired calls free their slot.
Train's limits, the model cache, the token, and TLS off loopback are checked too.
A soak of mixed Predict and Load at the limit keeps the server's memory flat."""

import os
import subprocess
import threading
import time
from concurrent import futures

import pytest

from conftest import pid_alive, require

grpc = pytest.importorskip("grpc")
pytest.importorskip("torch", reason="the NLP service needs torch (installed by .ci/run)")

from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from gpuvs.serve import nlp_pb2 as pb  # noqa: E402
from gpuvs.serve import channel as client  # noqa: E402
from serve.test_serve import TINY, Served, code_of, train  # noqa: E402

TEXT = "the striker scored in the final match and the crowd cheered"


def stopped(s: Served) -> None:
    try:
        code, out = s.stop()
        assert code == 0 and "stopped in" in out
        assert not pid_alive(s.proc.pid)
    finally:
        s.kill()


def metrics(s: Served) -> pb.MetricsResponse:
    return s.stub.Metrics(pb.MetricsRequest(), timeout=5)


def settled(s: Served, ok, within_s: float = 2.0) -> pb.MetricsResponse:
    """The server's Metrics once ok(metrics) holds (or the last ones, after within_s)."""
    t0 = time.monotonic()
    while not ok(m := metrics(s)) and time.monotonic() - t0 < within_s:
        time.sleep(0.02)
    return m


def health(channel, timeout=1.0) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout).status


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_a_burst_gets_only_ok_and_resource_exhausted_and_health_answers_throughout(tmp_path):
    s = Served(tmp_path, "--max-in-flight", "2", "--max-queue", "2")
    try:
        train(s.stub, "m")
        big = pb.PredictRequest(model="m", texts=[TEXT] * 1000)  # tens of ms each on one CPU thread
        assert health(s.channel) == health_pb2.HealthCheckResponse.SERVING
        checks: list = []
        done = threading.Event()

        def probe():  # a health check every 20 ms during the burst, each with a 1 s deadline
            chan, _ = client.connect(s.target, own_connection=True)
            while not done.is_set():
                t0 = time.monotonic()
                try:
                    checks.append((health(chan), time.monotonic() - t0))
                except grpc.RpcError as exc:
                    checks.append((exc.code(), time.monotonic() - t0))
                time.sleep(0.02)
            chan.close()

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(0.2)
        channels = [client.connect(s.target, own_connection=True) for _ in range(8)]
        calls = [channels[i % 8][1].Predict.future(big, timeout=60) for i in range(40)]  # 10x the limit
        outcomes = []
        for call in calls:
            try:
                call.result()
                outcomes.append(("OK", ""))
            except grpc.RpcError as exc:
                hint = dict(exc.trailing_metadata() or ()).get("retry-after-ms", "")
                outcomes.append((exc.code().name, hint, exc.details()))
        done.set()
        prober.join(timeout=30)
        for chan, _ in channels:
            chan.close()
        codes = {o[0] for o in outcomes}
        assert codes == {"OK", "RESOURCE_EXHAUSTED"}, outcomes  # nothing else, and no call hung
        refused = [o for o in outcomes if o[0] == "RESOURCE_EXHAUSTED"]
        assert all(int(o[1]) > 0 and "server busy" in o[2] and "retry after about" in o[2] for o in refused)
        assert sum(o[0] == "OK" for o in outcomes) >= 4  # the slots and the queue were served
        assert len(checks) >= 5 and all(c == health_pb2.HealthCheckResponse.SERVING for c, _ in checks), checks
        assert max(sec for _, sec in checks) < 1.0
        m = metrics(s)
        assert m.refused == len(refused) and m.in_flight == 0 and m.queued == 0
        assert m.peak_in_flight == 2 and 1 <= m.peak_queued <= 2 and (m.max_in_flight, m.max_queue) == (2, 2)
        predict = next(c for c in m.calls if c.method == "Predict")
        assert predict.ok == 40 - len(refused) and 0 < predict.p50_ms <= predict.p90_ms <= predict.p99_ms
        # the CLI shows the same figures
        from conftest import run_cli

        r = run_cli("serve-metrics", "--target", s.target)
        assert r.returncode == 0 and f"refused {m.refused}" in r.stdout and "Predict: " in r.stdout, r.stderr
    finally:
        stopped(s)


def test_a_cancelled_call_frees_its_slot_and_stops_its_training(tmp_path):
    s = Served(tmp_path, "--max-in-flight", "1", "--max-queue", "1", "--max-train-flops", "1e13")
    try:
        train(s.stub, "m")
        long = s.stub.Train(pb.TrainRequest(model="long", task=pb.TC, generated_sentences=3000, options=pb.TrainOptions(
            d_model=32, layers=1, heads=2, epochs=500, progress_every=1)))
        assert not next(long).done  # it holds the only slot now
        # a second Train while one runs is refused at once (--max-trains 1), whatever its name
        got, details = code_of(lambda: train(s.stub, "other"))
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-trains 1" in details, details
        # a queued Predict whose deadline passes leaves the queue; one more than the queue is refused
        waiting = s.stub.Predict.future(pb.PredictRequest(model="m", texts=[TEXT]), timeout=0.5)
        time.sleep(0.1)
        got, details = code_of(lambda: s.stub.Predict(pb.PredictRequest(model="m", texts=[TEXT]), timeout=5))
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and "1 calls in flight and 1 queued" in details, details
        with pytest.raises(grpc.RpcError) as err:
            waiting.result()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        m = settled(s, lambda m: m.queued == 0)  # the server sees it within its 50 ms look at the queue
        assert (m.in_flight, m.queued, m.trains_running) == (1, 0, 1) and m.deadline_exceeded == 1
        long.cancel()
        t0 = time.monotonic()
        while True:  # the slot is free again within a step or two of the training
            try:
                r = s.stub.Predict(pb.PredictRequest(model="m", texts=[TEXT]), timeout=5)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - t0 < 10
                time.sleep(0.05)
        assert r.predictions[0].label
        m = settled(s, lambda m: m.cancelled == 1)
        assert (m.in_flight, m.queued, m.trains_running) == (0, 0, 0) and m.cancelled == 1
        assert not (tmp_path / "long.pt").exists()  # the training stopped and saved nothing
        assert not any(x.training for x in s.stub.ListModels(pb.ListModelsRequest()).models)
    finally:
        stopped(s)


def test_an_over_budget_train_is_refused_before_it_starts_on_an_insecure_server_off_loopback(tmp_path):
    # --insecure: plain text and no token on 0.0.0.0 (every interface), reached here through 127.0.0.1
    s = Served(tmp_path, "--host", "0.0.0.0", "--insecure", "--max-train-flops", "1e13")
    try:
        assert health(s.channel) == health_pb2.HealthCheckResponse.SERVING and metrics(s).max_in_flight == 8
        for options, sentences, message in [
            (pb.TrainOptions(d_model=4096, layers=48, heads=4), 1000,
             "has 9,663,676,416 parameters, over the server's limit of 100,000,000 (--max-model-params)"),
            (pb.TrainOptions(epochs=1000), 200_000, "over the server's budget of 1e+13 (--max-train-flops)"),
        ]:
            t0 = time.monotonic()
            got, details = code_of(lambda: train(s.stub, "huge", generated_sentences=sentences, options=options))
            took = time.monotonic() - t0
            assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and message in details, details
            assert took < 3 and not (tmp_path / "huge.pt").exists()  # nothing was generated, built or trained
        m = metrics(s)
        assert m.refused_train == 2 and m.trains_running == 0 and not any(c.method == "Train" and c.ok for c in m.calls)
        assert train(s.stub, "small")[-1].done  # a Train within budget runs
    finally:
        stopped(s)


def test_the_model_cache_unloads_the_least_recently_used_and_predict_reloads_it(tmp_path):
    # d_model 32 models are about 86 KB, d_model 64 about 270 KB: two small ones fit in 0.2 MiB, three do not
    s = Served(tmp_path, "--model-cache-mb", "0.2")
    try:
        for name in ("a", "b", "c"):
            train(s.stub, name)
        m = metrics(s)
        assert [x.name for x in m.models] == ["b", "c"] and m.evictions == 1  # a, the oldest, was unloaded
        assert m.models_bytes == sum(x.bytes for x in m.models) <= m.model_cache_bytes == int(0.2 * 2**20)
        r = s.stub.Predict(pb.PredictRequest(model="a", texts=[TEXT]))  # loaded again from its file
        assert r.load_seconds > 0 and r.predictions[0].label
        assert [x.name for x in metrics(s).models] == ["c", "a"]  # b was the least recently used now
        s.stub.Predict(pb.PredictRequest(model="c", texts=[TEXT]))
        r = s.stub.Predict(pb.PredictRequest(model="c", texts=[TEXT]))
        assert r.load_seconds == 0
        assert [x.name for x in metrics(s).models] == ["a", "c"]
        big = train(s.stub, "big", options=pb.TrainOptions(d_model=64, layers=1, heads=2, epochs=1))
        assert big[-1].done  # saved, but larger than the whole cache: not kept loaded
        got, details = code_of(lambda: s.stub.Load(pb.LoadRequest(model="big")))
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and "more than the whole model cache of 0.2 MiB" in details
        assert [x.name for x in metrics(s).models] == ["a", "c"]  # nothing unloaded for a model that cannot fit
    finally:
        stopped(s)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    openssl = require("openssl", "making the TLS test certificates")
    d = tmp_path_factory.mktemp("tls")

    def run(*args):
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=gpuvs test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.pem", "-days", "2", "-extfile", "san.ext")
    (d / "token").write_text("s3cret-token-for-tests\n")
    (d / "wrong").write_text("not-the-token\n")
    return d


def test_tls_and_token_on_every_interface(tmp_path, tls_files, cli):
    d = tls_files
    access = client.Access(tls_ca=str(d / "ca.pem"), token_file=str(d / "token"))
    s = Served(tmp_path / "models", "--host", "0.0.0.0", "--tls-cert", d / "server.pem", "--tls-key", d / "server.key",
               "--token-file", d / "token", access=access)
    try:
        train(s.stub, "load-tc")
        assert s.stub.Predict(pb.PredictRequest(model="load-tc", texts=[TEXT])).predictions
        assert health(s.channel) == health_pb2.HealthCheckResponse.SERVING
        for who in (client.Access(tls_ca=str(d / "ca.pem")), client.Access(tls_ca=str(d / "ca.pem"),
                                                                           token_file=str(d / "wrong"))):
            chan, stub = client.connect(s.target, access=who)  # TLS is fine; the token is missing or wrong
            for call in (lambda: stub.Predict(pb.PredictRequest(model="load-tc", texts=[TEXT])),
                         lambda: list(stub.Train(pb.TrainRequest(model="x", task=pb.TC, generated_sentences=100))),
                         lambda: stub.Metrics(pb.MetricsRequest()), lambda: health(chan)):
                got, details = code_of(call)
                assert got == grpc.StatusCode.UNAUTHENTICATED and "missing or wrong token" in details
            chan.close()
        with pytest.raises(ConnectionError):  # plain text to a TLS server: nothing answers
            client.connect(s.target, timeout_s=2)
        assert metrics(s).unauthenticated == 8
        r = cli("run", "serve-load", "--target", s.target, "--tls-ca", d / "ca.pem", "--token-file", d / "token",
                "--clients", "2", "--requests", "10", "--train", "never", "--device", "cpu", "--quiet")
        assert r.returncode == 0 and "10 requests in" in r.stdout, r.stdout + r.stderr
        r = cli("serve-metrics", "--target", s.target, "--tls-ca", d / "ca.pem", "--token-file", d / "token", "--json")
        assert r.returncode == 0 and '"unauthenticated": "8"' in r.stdout, r.stdout + r.stderr
        r = cli("serve-metrics", "--target", s.target, "--tls-ca", d / "ca.pem")
        assert r.returncode == 2 and "UNAUTHENTICATED" in r.stderr and len(r.stderr.splitlines()) == 1
    finally:
        stopped(s)


@pytest.mark.parametrize("args, message", [
    (["--host", "0.0.0.0"], "listening on 0.0.0.0 (not loopback) needs TLS and a token"),
    (["--host", "0.0.0.0", "--token-file", "t"], "needs TLS and a token"),
    (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
    (["--insecure", "--token-file", "t"], "--insecure means plain text and no token"),
    (["--max-in-flight", "0"], "--max-in-flight 0 is out of range"),
    (["--model-cache-mb", "0"], "--model-cache-mb 0 is out of range"),
    (["--host", "0.0.0.0", "--tls-cert", "missing.pem", "--tls-key", "k", "--token-file", "t"],
     "cannot read the token file t"),
])
def test_unsafe_or_bad_settings_are_one_line_exit_2(cli, args, message):
    r = cli("serve", "--port", "0", "--device", "cpu", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr, r.stderr


SOAK_S = float(os.environ.get("GPUVS_SOAK_S", "45"))


def test_a_soak_of_predict_and_load_at_the_limit_keeps_memory_flat(tmp_path):
    """Clients at the in-flight + queue limit, for SOAK_S seconds (GPUVS_SOAK_S; docs/nlp.md has a longer run):
    Predicts on three models and Loads with reload, through a cache that holds two of them, so models are
    unloaded and loaded all the time. The server's resident memory after a warm-up third stays flat."""
    s = Served(tmp_path, "--max-in-flight", "2", "--max-queue", "2", "--model-cache-mb", "0.2")
    try:
        for name in ("a", "b", "c"):
            train(s.stub, name)
        stop = threading.Event()
        codes: dict[str, int] = {}
        lock = threading.Lock()

        def client_loop(i):
            chan, stub = client.connect(s.target, own_connection=True)
            n = 0
            while not stop.is_set():
                n += 1
                name = "abc"[(i + n) % 3]
                try:
                    if n % 5 == 0:
                        stub.Load(pb.LoadRequest(model=name, reload=True), timeout=30)
                    else:
                        stub.Predict(pb.PredictRequest(model=name, texts=[TEXT] * 64), timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1
            chan.close()

        pool = futures.ThreadPoolExecutor(4)
        jobs = [pool.submit(client_loop, i) for i in range(4)]  # 4 clients: 2 in flight + 2 queued
        samples = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < SOAK_S:
            time.sleep(1.0)
            samples.append((time.monotonic() - t0, rss_kib(s.proc.pid)))
        stop.set()
        for j in jobs:
            j.result(timeout=60)
        pool.shutdown()
        m = metrics(s)
        warm = [kib for t, kib in samples if t >= SOAK_S / 3]
        growth_mib = (max(warm[len(warm) // 2:]) - warm[0]) / 1024
        print(f"\nsoak {SOAK_S:.0f} s: {sum(codes.values())} calls {codes}; RSS after warm-up {warm[0] / 1024:.1f} MiB, "
              f"max in the last half {max(warm[len(warm) // 2:]) / 1024:.1f} MiB (growth {growth_mib:+.1f} MiB); "
              f"evictions {m.evictions}; peaks {m.peak_in_flight} in flight, {m.peak_queued} queued")
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"} and codes.get("OK", 0) > 100, codes
        assert m.evictions > 20 and m.peak_in_flight == 2 and m.in_flight == 0
        assert growth_mib < 16, samples  # flat: no growth with the number of calls, loads and unloads
    finally:
        stopped(s)
