"""NER and text classification for real on the CPU: the generated corpus, and training that learns.

Model files saved atomically and refused with their path when broken; the four workloads from the command line."""

import json
import sqlite3

import pytest

from conftest import pid_alive
from gpuvs import workloads
from gpuvs.nlp import corpus, data
from gpuvs.spec import RunSpec
from gpuvs.workloads.workload import RunContext

torch = pytest.importorskip("torch", reason="the NLP workloads need torch (installed by .ci/run)")

TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--lr", "0.01", "--threads", "1", "--device", "cpu"]


@pytest.fixture
def one_thread():
    """Train in this process with one thread (steady on a busy 2-core machine), then put it back."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_corpus_is_deterministic_scalable_and_well_formed():
    a, b = corpus.generate("ner", 300, seed=4), corpus.generate("ner", 300, seed=4)
    assert [s.tokens for s in a.train] == [s.tokens for s in b.train]
    assert [s.tokens for s in corpus.generate("ner", 300, seed=5).train] != [s.tokens for s in a.train]
    assert (len(a.train), len(a.eval)) == (270, 30)
    big = corpus.generate("tc", 20000, seed=0)
    assert len(big.train) + len(big.eval) == 20000 and set(s.label for s in big.train) == set(corpus.TOPICS)
    for s in a.train + a.eval:
        assert len(s.tokens) == len(s.tags) and data.check_tags(s.tags) is None
        assert data.tokenize(s.text) == s.tokens  # what a client sends tokenises back to the tagged tokens
    types = {t[2:] for s in a.train for t in s.tags if t != "O"}
    assert types == set(corpus.ENTITY_TYPES)


def test_spans_and_entity_f1():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    assert data.spans(gold[0]) == {(0, 2, "PER"), (3, 4, "LOC")}
    assert data.entity_f1(gold, gold) == 1.0
    assert data.entity_f1(gold, [["B-PER", "O", "O", "B-LOC"]]) == pytest.approx(0.5)  # one of two spans right
    assert data.entity_f1(gold, [["O"] * 4]) == 0.0
    assert data.check_tags(["O", "B-X", "I-X", "X-PER"]) == "X-PER"


def run_inline(name, **params):
    w = workloads.get(name)
    spec = RunSpec(workload=name, device="cpu", params=params)
    return list(w.run(RunContext(spec=spec, params=w.validate(params, "cpu"))))


def metrics(evs):
    return {e["name"]: e["value"] for e in evs if e["type"] == "metric"}


@pytest.mark.parametrize("name, model", [("tc-train", "transformer"), ("ner-train", "transformer"),
                                         ("ner-train", "bilstm")])
def test_short_training_learns_far_above_chance(name, model, one_thread):
    evs = run_inline(name, model=model, sentences=1500, epochs=2, d_model=64, layers=1, heads=2, lr=0.003,
                     threads=1, display_every=10)
    m = metrics(evs)
    if name == "tc-train":
        # six topics: chance is 1/6, always saying the commonest topic scores about 0.2
        assert m["baseline_accuracy"] < 0.3 and m["accuracy"] > 0.5
    else:
        # about 2/3 of tokens are O: a tagger that says O everywhere gets that and no entity
        assert m["accuracy"] > m["baseline_accuracy"] + 0.15 and m["entity_f1"] > 0.4
    assert m["final_loss"] < 1.5 and m["examples_per_sec"] > 0 and m["tokens_per_sec"] > m["examples_per_sec"]
    train = [e for e in evs if e["type"] == "sample" and e["series"] == "train"]
    tokens = [e for e in evs if e["type"] == "sample" and e["series"] == "tokens"]
    assert len(train) == len(tokens) == 86 - 5  # ceil(1350 / 32) * 2 steps, 5 warm-up steps left out
    assert 2700 - 5 * 32 <= sum(e["items"] for e in train) < 2700  # 1350 examples twice, less the warm-up
    assert train[0]["step"] == 6 and all(e["value"] == pytest.approx(e["items"] / e["seconds"]) for e in train)
    assert m["elapsed_s"] >= m["timed_s"] == pytest.approx(sum(e["seconds"] for e in train))
    startup = {e["name"] for e in evs if e["type"] == "startup"}
    assert {"corpus_s", "model_build_s", "first_step_s", "warmup_s"} <= startup


def test_predict_without_a_model_file_trains_one_untimed(one_thread):
    evs = run_inline("tc-predict", sentences=600, train_epochs=2, d_model=32, layers=1, heads=2, lr=0.003,
                     threads=1, requests=12, request_size=5, warmup_requests=2)
    startup = [e["name"] for e in evs if e["type"] == "startup"]
    assert startup.index("train_s") < startup.index("model_load_s") < startup.index("first_request_s")
    samples = [e for e in evs if e["type"] == "sample" and e["series"] == "predict"]
    assert len(samples) == 12 and all(e["items"] == 5 for e in samples)
    m = metrics(evs)
    assert 0 < m["latency_p50_ms"] <= m["latency_p90_ms"] <= m["latency_p99_ms"] <= m["latency_max_ms"]
    assert m["timed_s"] == pytest.approx(sum(e["seconds"] for e in samples))
    assert m["requests_per_sec"] == pytest.approx(12 / m["timed_s"])


def test_model_files_round_trip_and_broken_ones_name_their_path(tmp_path, one_thread):
    from gpuvs.nlp import checkpoint, train
    from gpuvs.nlp.predict import Predictor

    c = corpus.generate("ner", 200, 0)
    trainer = train.Trainer(train.TrainConfig(task="ner", d_model=16, layers=1, heads=2, epochs=1),
                            corpus.as_examples("ner", c.train), "cpu", labels=c.labels)
    list(trainer.run())
    path = checkpoint.save(trainer.bundle(), tmp_path / "m.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]  # no temporary file left behind
    texts = [s.text for s in c.eval[:5]]
    before = Predictor(trainer.bundle(), "cpu").predict(texts)
    assert Predictor(checkpoint.load(path), "cpu").predict(texts) == before
    (tmp_path / "junk.pt").write_bytes(b"not a model at all")
    (tmp_path / "half.pt").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    for name, reason in [("junk.pt", "not a readable model file"), ("half.pt", "not a readable model file"),
                         ("other.pt", "not a gpuvs NLP model"), ("missing.pt", "no such file")]:
        with pytest.raises(checkpoint.ModelLoadError) as err:
            checkpoint.load(tmp_path / name)
        assert str(err.value).startswith(f"cannot load model {tmp_path / name}: {reason}")


def _db(tmp_path):
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    db.row_factory = sqlite3.Row
    return db


def assert_workers_gone(db):
    """Every worker these trials ran (its pid is in its fingerprint) has exited."""
    pids = [json.loads(fp)["pid"] for (fp,) in db.execute("SELECT fingerprint FROM trials") if fp]
    assert pids and not any(pid_alive(p) for p in pids)


def test_train_save_then_predict_from_the_command_line(cli, tmp_path):
    r = cli("run", "ner-train", "--sentences", "1000", "--epochs", "2", "--save-model", tmp_path / "ner.pt",
            "--display-every", "5", *TINY)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "Mode:         training" in r.stdout and "total examples/sec" in r.stdout
    assert "accuracy" in r.stdout and "entity F1" in r.stdout and f"saved the model to {tmp_path / 'ner.pt'}" in r.stdout
    db = _db(tmp_path)
    row = db.execute("SELECT metrics, startup, summary FROM trials").fetchone()
    m = json.loads(row["metrics"])
    assert {"elapsed_s", "examples_per_sec", "tokens_per_sec", "final_loss", "accuracy", "entity_f1",
            "baseline_accuracy"} <= set(m)
    assert list(json.loads(row["summary"])) == ["train", "tokens"]  # examples/sec is the headline

    r = cli("run", "ner-predict", "--model-path", tmp_path / "ner.pt", "--requests", "20", "--request-size", "4",
            *TINY)
    assert r.returncode == 0, r.stderr + r.stdout
    rows = db.execute("SELECT metrics, startup, config FROM trials WHERE workload='ner-predict'").fetchall()
    assert len(rows) == 1
    for row in rows:
        startup, m = json.loads(row["startup"]), json.loads(row["metrics"])
        assert "train_s" not in startup and startup["model_load_s"] > 0 and startup["first_request_s"] > 0
        assert json.loads(row["config"])["model_file"] == str(tmp_path / "ner.pt")
        assert m["accuracy"]["value"] > m["baseline_accuracy"]["value"]  # the saved model, not a fresh one
    assert "latency p50" in r.stdout
    assert_workers_gone(db)


def test_a_model_file_that_does_not_load_fails_the_trial_naming_the_file(tmp_path):
    from gpuvs.errors import WorkloadError

    (tmp_path / "bad.pt").write_bytes(b"\x00garbage")
    with pytest.raises(WorkloadError) as err:  # the worker turns this into a failed trial with this message
        run_inline("tc-predict", model_path=str(tmp_path / "bad.pt"), threads=1)
    assert err.value.kind == "input" and err.value.message.startswith(f"cannot load model {tmp_path / 'bad.pt'}: ")


@pytest.mark.parametrize("args, message", [
    (["run", "tc-train", "--heads", "3"], "--heads 3 must divide --d-model 256"),
    (["run", "ner-train", "--model", "bilstm", "--d-model", "33"], "--d-model 33 must be even"),
    (["run", "ner-train", "--model", "gru"], "--model: 'gru' is not allowed; expected one of transformer, bilstm"),
    (["run", "tc-train", "--sentences", "100", "--warmup-steps", "50"], "--warmup-steps 50 leaves no timed step"),
    (["run", "tc-train", "--save-model", "/no/such/folder/m.pt"], "folder /no/such/folder does not exist"),
    (["run", "ner-predict", "--model-path", "/no/such.pt"], "--model-path '/no/such.pt' is not a file"),
    (["run", "tc-predict", "--requests", "0"], "--requests: '0' is not allowed"),
])
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    r = cli(*args, "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpuvs: error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert not (tmp_path / "gpuvs.db").exists()


def test_shipped_experiment_files_are_the_four_rows_and_every_arm_validates():
    import yaml

    from conftest import ROOT

    rows = {}
    for path in sorted((ROOT / "experiments").glob("nlp-gpu-vs-cpu-*.yaml")):
        exp = yaml.safe_load(path.read_text())
        assert set(exp) <= {"name", "workload", "params", "device", "env", "trials", "margin", "arms", "timeout_s"}
        assert exp["name"] == path.stem and exp["trials"] >= 3
        assert [(a["name"], a["device"]) for a in exp["arms"]] == [("gpu", "cuda"), ("cpu", "cpu")]
        w = workloads.get(exp["workload"])
        for arm in exp["arms"]:  # every size is given, so both arms do the same work (no CPU-sized defaults)
            assert w.validate(exp["params"], arm["device"]) == w.validate(exp["params"], "cuda")
        rows[exp["workload"]] = exp
    assert set(rows) == {"ner-train", "tc-train", "ner-predict", "tc-predict"}
