"""The tf_cnn_benchmarks parser on real logs: tf_cnn_benchmarks' own and gpuvs's step log.

Its own are Tesla T4 logs (tests/fixtures/tf_cnn_benchmarks/, whose README states each log's total).
gpuvs's step log is printed by a real `gpuvs run cnn-train` here, and checked against what that run stored."""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from pathlib import Path

import pytest

from gpuvs.workloads.command import outputs

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tf_cnn_benchmarks"
LOGS = sorted(FIXTURES.glob("*.log"))


def readme_totals() -> dict[str, float]:
    """The README's table: file -> total images/sec, as the fixtures' source states it."""
    rows = re.findall(r"^\| (\S+\.log) \| ([\d.]+) \|$", (FIXTURES / "README.md").read_text(), re.M)
    return {name: float(total) for name, total in rows}


def read_log(text: str):
    reader = outputs.make_reader(["tf_cnn_benchmarks"])
    readings = [r for line in text.splitlines() for r in reader.feed(line)]
    return reader, readings + reader.finish()


def test_the_fixtures_are_the_four_logs_of_the_readme():
    assert sorted(readme_totals()) == [p.name for p in LOGS] and len(LOGS) == 4


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_real_tf_cnn_benchmarks_log(log):
    text = log.read_text(encoding="utf-8")
    reader, readings = read_log(text)
    assert reader.headline == "total_images_per_sec" and reader.failure() is None
    total = [r for r in readings if r.name == "total_images_per_sec"]
    assert [r.value for r in total] == [readme_totals()[log.name]]
    assert total[0].text == f"total images/sec: {readme_totals()[log.name]:.2f}" and total[0].step is None
    # the step table: one running figure and one loss per printed step, the steps as printed (1, 10, ..., 100)
    table = [ln for ln in text.splitlines() if "images/sec:" in ln and not ln.startswith("total")]
    running = [r for r in readings if r.name == "images_per_sec"]
    losses = [r for r in readings if r.name == "total_loss"]
    steps = [int(ln.split("\t")[0]) for ln in table]
    assert steps == [1] + list(range(10, 101, 10)) and steps[-1] == int(reader.info["tf_cnn_benchmarks"]["num_batches"])
    assert [r.step for r in running] == steps and [r.step for r in losses] == steps
    assert [r.value for r in losses] == [float(ln.split("\t")[-1]) for ln in table]
    assert [(r.value, r.extra["pm"], r.extra["jitter"]) for r in running] == [
        tuple(float(x) for x in re.findall(r"[\d.]+", ln.split("\t")[1])) for ln in table]
    # a running figure is the rate over every step so far: the last one stands for the run, within a fraction of
    # a percent of the total (its clock also covers the work between the steps)
    assert reader.last["images_per_sec"] is running[-1]
    assert running[-1].value == pytest.approx(total[0].value, rel=0.002)
    meta = reader.info["tf_cnn_benchmarks"]
    per_device = 64
    gpus = 2 if "2gpu" in log.name else 1
    assert meta["model"] == "resnet50" and meta["batch_size"] == f"{per_device * gpus} global"
    assert meta["devices"].count("/gpu:") == gpus


def test_a_log_that_stopped_before_its_total_fails_naming_the_line():
    lines = LOGS[0].read_text(encoding="utf-8").splitlines()
    reader, _ = read_log("\n".join(lines[:25]))
    failure = reader.failure()
    assert failure.startswith("metric total_images_per_sec (the closing 'total images/sec: N' line) never appeared")
    assert " ".join(lines[24].split()) in failure


def cnn_args(workload):
    return ("run", workload, "--device", "cpu", "--model", "resnet18", "--batch-size", "2", "--image-size", "32",
            "--steps", "6", "--warmup-steps", "1", "--display-every", "3", "--num-classes", "10")


@pytest.mark.slow
def test_gpuvs_step_log_reads_as_tf_cnn_benchmarks(cli, tmp_path):
    """gpuvs's own step log (its terminal prints the tabs as spaces) read by the same parser, every figure checked
    against the samples and summary the same run stored."""
    pytest.importorskip("torch", reason="cnn-train needs torch (installed by .ci/run)")
    r = cli(*cnn_args("cnn-train"))
    assert r.returncode == 0, r.stderr
    reader, readings = read_log(r.stdout)
    assert reader.failure() is None
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    summary = json.loads(db.execute("SELECT summary FROM trials").fetchone()[0])["main"]
    samples = db.execute("SELECT step, items, seconds, extra FROM samples ORDER BY step").fetchall()
    assert [s[0] for s in samples] == [1, 2, 3, 4, 5, 6]
    assert reader.last["total_images_per_sec"].value == pytest.approx(summary["value"], abs=0.0051)
    running = [x for x in readings if x.name == "images_per_sec"]
    assert [x.step for x in running] == [3, 6]
    for reading in running:  # over the steps so far: total items / total time, +/- and jitter of per-step rates
        upto = [s for s in samples if s[0] <= reading.step]
        speeds = [items / secs for _, items, secs, _ in upto]
        assert reading.value == pytest.approx(sum(s[1] for s in upto) / sum(s[2] for s in upto), abs=0.051)
        assert reading.extra["pm"] == pytest.approx(statistics.pstdev(speeds) / len(speeds) ** 0.5, abs=0.051)
        med = statistics.median(speeds)
        assert reading.extra["jitter"] == pytest.approx(1.4826 * statistics.median(abs(v - med) for v in speeds),
                                                        abs=0.051)
    assert running[-1].extra["pm"] == pytest.approx(summary["pm"], abs=0.051)
    losses = {x.step: x.value for x in readings if x.name == "total_loss"}
    stored = {s[0]: json.loads(s[3])["loss"] for s in samples if "loss" in json.loads(s[3])}
    assert sorted(losses) == sorted(stored) == [3, 6]
    assert all(losses[k] == pytest.approx(stored[k], abs=0.00051) for k in stored)
    meta = reader.info["tf_cnn_benchmarks"]
    assert meta["model"] == "resnet18" and meta["batch_size"] == "2 global" and meta["timed_steps"] == "6"


@pytest.mark.slow
def test_an_inference_log_without_loss_still_has_its_headline(cli, tmp_path):
    """total_loss and the step lines are optional: gpuvs's cnn-infer prints only its total, which is enough."""
    pytest.importorskip("torch", reason="cnn-infer needs torch (installed by .ci/run)")
    r = cli(*cnn_args("cnn-infer"))
    assert r.returncode == 0, r.stderr
    reader, readings = read_log(r.stdout)
    summary = json.loads(sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT summary FROM trials").fetchone()[0])
    assert reader.failure() is None and set(reader.counts) == {"total_images_per_sec"}
    assert readings[0].value == pytest.approx(summary["main"]["value"], abs=0.0051)
