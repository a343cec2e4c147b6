"""CNN workloads on the CPU for real: every model, precision and data format, and real image folders.

Data-parallel training with gloo, inference latency, and running out of memory."""

import json
import math
import sqlite3

import pytest

from conftest import gpuvs_processes
from gpuvs import workloads
from gpuvs.spec import RunSpec
from gpuvs.workloads.workload import RunContext

torch = pytest.importorskip("torch", reason="the CNN workloads need torch (installed by .ci/run)")


def run_inline(name, **params):
    w = workloads.get(name)
    spec = RunSpec(workload=name, device="cpu", params=params)
    checked = w.validate(params, "cpu")
    return list(w.run(RunContext(spec=spec, params=checked)))


@pytest.mark.parametrize("model, size", [("resnet50", 32), ("resnet101", 32), ("resnet152", 32), ("vgg16", 32),
                                         ("inception3", 75), ("alexnet", 63), ("googlenet", 32),
                                         ("mobilenet_v2", 32)])
def test_every_model_trains_one_timed_step(model, size):
    evs = run_inline("cnn-train", model=model, batch_size=2, image_size=size, steps=1, warmup_steps=1,
                     num_classes=10)
    samples = [e for e in evs if e["type"] == "sample"]
    assert len(samples) == 1 and samples[0]["items"] == 2 and samples[0]["value"] > 0
    assert samples[0]["value"] == pytest.approx(2 / samples[0]["seconds"])
    assert math.isfinite(samples[0]["extra"]["loss"]) and samples[0]["extra"]["loss"] >= 0  # 0.0 once: resnet101
    cfg = next(e for e in evs if e["type"] == "config")["items"]
    assert cfg["model"] == model and cfg["mode"] == "training" and cfg["image_size"] == size
    startup = {e["name"] for e in evs if e["type"] == "startup"}
    assert {"model_build_s", "first_step_s", "warmup_s"} <= startup


@pytest.mark.parametrize("name, precision, fmt", [("cnn-train", "bf16", "NHWC"), ("cnn-train", "fp16", "NCHW"),
                                                 ("cnn-train", "tf32", "NHWC"), ("cnn-train", "fp32", "NCHW"),
                                                 ("cnn-infer", "bf16", "NHWC")])
def test_precisions_and_formats_are_applied_on_cpu(name, precision, fmt):
    """What --precision and --data-format change, seen in the model's first convolution on every step: the
    dtype it computes in (autocast), the memory format of its input batch and of its weights; and TF32
    allowed for tf32 only."""
    first_conv = []

    def watch(module, args, output):
        if isinstance(module, torch.nn.Conv2d) and args[0].shape[1] == 3:  # the stem: its input is the batch
            first_conv.append((output.dtype, args[0].is_contiguous(memory_format=torch.channels_last),
                               module.weight.is_contiguous(memory_format=torch.channels_last)))

    hook = torch.nn.modules.module.register_module_forward_hook(watch)
    try:
        evs = run_inline(name, model="resnet18", batch_size=2, image_size=32, steps=3, warmup_steps=1,
                         display_every=3, precision=precision, data_format=fmt, num_classes=10,
                         **({"optimizer": "momentum"} if name == "cnn-train" else {}))
    finally:
        hook.remove()
    assert len([e for e in evs if e["type"] == "sample"]) == 3
    if name == "cnn-train":
        losses = [e["extra"]["loss"] for e in evs if e["type"] == "sample" and "loss" in e["extra"]]
        assert len(losses) == 1 and losses[0] == losses[0]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    channels_last = fmt == "NHWC"
    assert len(first_conv) >= 3 and set(first_conv) == {(dtype, channels_last, channels_last)}, first_conv
    assert torch.backends.cuda.matmul.allow_tf32 == torch.backends.cudnn.allow_tf32 == (precision == "tf32")
    cfg = next(e for e in evs if e["type"] == "config")["items"]
    assert (cfg["precision"], cfg["data_format"]) == (precision, fmt)


@pytest.mark.parametrize("cudnn", ["benchmark", "heuristics"])
def test_cudnn_says_whether_algorithms_are_timed_and_a_bad_choice_is_refused(cudnn):
    import torch

    from gpuvs.errors import UsageError
    w = workloads.get("cnn-train")
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = cudnn != "benchmark"  # the opposite, so that the call must set it
        w.set_precision("fp32", w.validate({"cudnn": cudnn}, "cpu")["cudnn"])
        assert torch.backends.cudnn.benchmark is (cudnn == "benchmark")
        torch.backends.cudnn.benchmark = cudnn != "benchmark"  # again the opposite: the run itself must set it
        evs = run_inline("cnn-train", model="resnet18", batch_size=2, image_size=32, steps=2, warmup_steps=1,
                         display_every=2, num_classes=4, cudnn=cudnn)
        assert torch.backends.cudnn.benchmark is (cudnn == "benchmark")
    finally:
        torch.backends.cudnn.benchmark = before
    cfg = next(e for e in evs if e["type"] == "config")["items"]
    assert "cudnn" not in cfg  # a CPU run: cuDNN plays no part, and the record does not pretend it did
    with pytest.raises(UsageError, match="heuristics"):
        w.validate({"cudnn": "fastest"}, "cpu")


def test_training_actually_learns_the_fixed_batch():
    evs = run_inline("cnn-train", model="resnet18", batch_size=4, image_size=32, steps=30, warmup_steps=1,
                     display_every=10, num_classes=4, optimizer="momentum", lr=0.05)
    losses = [e["extra"]["loss"] for e in evs if e["type"] == "sample" and "loss" in e["extra"]]
    # an untrained 4-class model's loss is about ln 4 = 1.39; after 30 steps on one batch it is far lower
    assert losses[-1] < 0.5 * 1.386


def test_inference_reports_latency_percentiles(cli, tmp_path):
    r = cli("run", "cnn-infer", "--model", "mobilenet_v2", "--batch-size", "2", "--image-size", "32",
            "--steps", "6", "--warmup-steps", "1", "--display-every", "3")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    metrics = json.loads(db.execute("SELECT metrics FROM trials").fetchone()[0])
    assert {"latency_p50_ms", "latency_p90_ms", "latency_p99_ms"} <= set(metrics)
    assert 0 < metrics["latency_p50_ms"]["value"] <= metrics["latency_p99_ms"]["value"]
    assert "Mode:         inference" in r.stdout


def test_real_image_folder_with_dataloader_workers(cli, tmp_path):
    from PIL import Image
    import numpy as np

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(tmp_path / "data" / cls / f"{i}.png")
    r = cli("run", "cnn-train", "--model", "resnet18", "--batch-size", "4", "--image-size", "32", "--steps", "5",
            "--warmup-steps", "1", "--data-dir", tmp_path / "data", "--workers", "2", "--num-classes", "2")
    assert r.returncode == 0, r.stderr
    assert f"Dataset:      {tmp_path / 'data'}" in r.stdout and "total images/sec" in r.stdout
    assert gpuvs_processes() == []


def test_empty_image_folder_is_refused_plainly(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("run", "cnn-train", "--model", "resnet18", "--image-size", "32", "--data-dir", tmp_path / "empty")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "empty" in r.stdout


def test_data_parallel_on_cpu_with_gloo_reports_global_throughput(cli, tmp_path):
    r = cli("run", "cnn-train", "--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--steps", "4",
            "--warmup-steps", "1", "--display-every", "2", "--device", "cpu", "--num-gpus", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "Batch size:   4 global" in r.stdout and "Num devices:  2 x cpu" in r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    items = [row[0] for row in db.execute("SELECT items FROM samples")]
    assert items == [4.0] * 4
    assert gpuvs_processes() == []


def test_out_of_memory_is_a_failed_trial_with_a_plain_message(cli, tmp_path):
    # 120 GB of images under an 8 GiB address-space cap: the allocation fails at once on any machine (with
    # overcommit on and no cap, the kernel's OOM killer would end the worker instead: a different fault)
    r = cli("run", "cnn-train", "--model", "resnet18", "--batch-size", "200000", "--trials", "2", "--quiet",
            address_space=8 << 30)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, error_kind, error FROM trials").fetchall()
    assert len(rows) == 2
    for status, kind, error in rows:
        assert status == "failed" and kind == "oom" and error.startswith("out of host memory at batch size 200000")
