"""CNN training and inference on synthetic ImageNet-shaped data or a real ImageFolder, in PyTorch.

The benchmark tf_cnn_benchmarks users know, with the same step log semantics.
The timed phase is workloads/_timed.py's, the warm-up workloads/_warmup.py's."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.probes import precision
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.params import Param
from gpuvs.workloads import _timed, _warmup, register
from gpuvs.workloads.workload import RunContext, Workload, duration, rate

# For the GPU proof of the timed phase only (benchmarks/time_to_verdict.py): "blocking" restores the reading
# of step events before issue 25 (a synchronise after the warm-up and at every display step), so that the
# dip it caused can be shown beside its absence.
READ_ENV = "GPUVS_TIMED_READ"

# the warm-up of a run across several devices, where every rank must run the same steps (no adaptive warm-up)
MULTI_DEVICE_WARMUP = 10

# name -> (torchvision constructor, default image size, smallest image size it accepts, extra kwargs)
MODELS: dict[str, tuple[str, int, int, dict[str, Any]]] = {
    "resnet18": ("resnet18", 224, 32, {}),
    "resnet50": ("resnet50", 224, 32, {}),
    "resnet101": ("resnet101", 224, 32, {}),
    "resnet152": ("resnet152", 224, 32, {}),
    "vgg11": ("vgg11", 224, 32, {}),
    "vgg16": ("vgg16", 224, 32, {}),
    "inception3": ("inception_v3", 299, 75, {"aux_logits": False, "init_weights": False}),
    "alexnet": ("alexnet", 224, 63, {}),
    "googlenet": ("googlenet", 224, 32, {"aux_logits": False, "init_weights": False}),
    "mobilenet_v2": ("mobilenet_v2", 224, 32, {}),
}
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# How cuDNN picks each convolution's algorithm. "benchmark" times the candidates at the first steps of every
# trial's fresh process (tf_cnn_benchmarks' way; the cost is start-up, in the first step); "heuristics" is
# PyTorch's own default (torch.backends.cudnn.benchmark = False): cuDNN's heuristics choose, nothing is timed,
# and every trial gets the same algorithms. Which is faster depends on the job (docs/trials.md, "cuDNN's algorithms").
CUDNN = ("benchmark", "heuristics")

COMMON = (
    Param("model", str, "resnet50", "torchvision model", choices=tuple(MODELS)),
    Param("batch_size", int, 64, "images per device per step", min=1, max=1 << 20),
    Param("precision", str, "fp32", "fp32 (strict), tf32, fp16 or bf16 (autocast; fp16 with a grad scaler)",
          choices=PRECISIONS),
    Param("data_format", str, "NCHW", "NCHW or NHWC (channels_last)", choices=("NCHW", "NHWC")),
    Param("cudnn", str, "benchmark", "how cuDNN picks convolution algorithms: benchmark (timed in each trial's "
          "first step, counted as start-up) or heuristics (PyTorch's default: nothing timed)", choices=CUDNN),
    Param("warmup_steps", int, 0, "steps run before timing, excluded from throughput (0: adaptive, until the "
          "steps are steady)", min=0, max=100000),
    Param("steps", int, 100, "timed steps", min=1, max=10_000_000),
    Param("display_every", int, 10, "log a line every N steps", min=1, max=1_000_000),
    Param("image_size", int, 0, "input height and width (0: the model's own, 224 or 299)", min=0, max=2048),
    Param("num_classes", int, 1000, "output classes", min=2, max=1_000_000),
    Param("data_dir", str, "", "ImageFolder data set (class folders of images); empty: synthetic data"),
    Param("workers", int, 4, "DataLoader worker processes (with --data-dir); also --data-workers", min=0, max=256,
          aliases=("data_workers",)),
    Param("seed", int, 0, "random seed of weights and synthetic data", min=0),
) + _timed.PARAMS + _warmup.PARAMS


class _CnnBase(Workload):
    unit = "images/sec"
    metrics = (rate("main", headline=True), duration("latency_*_ms"))
    # 96x96 images (every model's smallest is below it): ResNet-50 at 224x224 took over two minutes on a busy
    # 2-core machine, at 96x96 a whole `gpuvs run cnn-train` took 13 s to 33 s there (load 0 to 1.5), far
    # longer at a load of 5 to 11: the note says which machine its time is for
    cpu_defaults = {"batch_size": 8, "steps": 20, "warmup_steps": 2, "display_every": 5, "image_size": 96}
    cpu_note = "96x96 images, not 224x224: a run takes under a minute on an idle 2-core CPU, longer on a busy one"
    multi_gpu = True
    windowed = True
    requires = ("torch", "torchvision")
    training = True

    def check(self, params: dict[str, Any]) -> None:
        _, default_size, min_size, _ = MODELS[params["model"]]
        size = params["image_size"] or default_size
        if size < min_size:
            raise UsageError(f"--image-size {size} is too small for {params['model']}: it needs at least {min_size}")
        params["image_size"] = size
        if params["data_dir"] and not os.path.isdir(params["data_dir"]):
            raise UsageError(f"--data-dir {params['data_dir']!r} is not a folder")
        _timed.check(params)

    def check_spec(self, spec, params: dict[str, Any]) -> None:
        from gpuvs.spec import ranks_asked

        if ranks_asked(spec) > 1 and _timed.PhaseLength.from_params(params).adaptive:
            raise UsageError("--target-se and --seconds stop one device's timed phase; with "
                             f"{ranks_asked(spec)} ranks (--num-gpus, --num-nodes) every rank must run the same "
                             "steps: give --steps N")

    # -- pieces ------------------------------------------------------------------------------

    def build(self, ctx: RunContext):
        import torch
        import torchvision

        p = ctx.params
        fn, _, _, kwargs = MODELS[p["model"]]
        torch.manual_seed(p["seed"])
        device = torch.device(ctx.device)
        # built where it runs: on a GPU the weights are made and initialised there, not on the host
        # and then copied (about a second of ResNet-50's start-up, none of it measured)
        with device:
            model = getattr(torchvision.models, fn)(weights=None, num_classes=p["num_classes"], **kwargs)
        model = model.to(device)
        if p["data_format"] == "NHWC":
            model = model.to(memory_format=torch.channels_last)
        return model, device

    @staticmethod
    def set_precision(precision_name: str, cudnn: str = "benchmark") -> None:
        """TF32 as --precision says (gpuvs.probes.precision), and cuDNN's algorithms chosen as --cudnn says:
        timed (benchmark) or by cuDNN's heuristics."""
        import torch

        precision.allow_tf32(precision_name)
        torch.backends.cudnn.benchmark = cudnn == "benchmark"

    def batches(self, ctx: RunContext, device) -> Iterator[tuple[Any, Any]]:
        """Endless (images, labels) on the device: one fixed synthetic batch, or a real DataLoader."""
        import torch

        p = ctx.params
        fmt = torch.channels_last if p["data_format"] == "NHWC" else torch.contiguous_format
        size = p["image_size"]
        if not p["data_dir"]:
            g = torch.Generator(device="cpu").manual_seed(p["seed"] + ctx.rank)
            x = torch.randn(p["batch_size"], 3, size, size, generator=g).to(device).contiguous(memory_format=fmt)
            y = torch.randint(0, p["num_classes"], (p["batch_size"],), generator=g).to(device)
            while True:
                yield x, y
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler
        from torchvision import datasets, transforms

        tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(),
                                 transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        dataset = datasets.ImageFolder(p["data_dir"], transform=tf)
        if len(dataset) == 0:
            raise WorkloadError("input", f"--data-dir {p['data_dir']} holds no images")
        sampler = DistributedSampler(dataset) if ctx.world_size > 1 else None
        loader = DataLoader(dataset, batch_size=p["batch_size"], shuffle=sampler is None, sampler=sampler,
                            num_workers=p["workers"], pin_memory=device.type == "cuda", drop_last=False,
                            persistent_workers=p["workers"] > 0)
        epoch = 0
        while True:
            if sampler is not None:
                sampler.set_epoch(epoch)
            for x, y in loader:
                yield (x.to(device, non_blocking=True).contiguous(memory_format=fmt),
                       (y % p["num_classes"]).to(device, non_blocking=True))
            epoch += 1

    def config_event(self, ctx: RunContext, plan: _timed.PhaseLength | None = None) -> dict[str, Any]:
        p = ctx.params
        spec = ctx.spec
        devices = ctx.world_size
        warm = self.warmup_plan(ctx)
        items = dict(model=p["model"], dataset=p["data_dir"] or "synthetic (imagenet-shaped)",
                     mode="training" if self.training else "inference",
                     batch_size_global=p["batch_size"] * devices, batch_size_per_device=p["batch_size"],
                     devices=f"{devices} x {spec.device.split(':')[0]}", data_format=p["data_format"],
                     precision=p["precision"], image_size=p["image_size"], warmup_steps=warm.steps or warm.describe(),
                     steps=plan.describe() if plan is not None and plan.adaptive else p["steps"])
        if self.training:
            items["optimizer"] = p["optimizer"]
        if ctx.device.startswith("cuda"):  # cuDNN plays no part on a CPU
            items["cudnn"] = p["cudnn"]
        return events.config(**items)

    @staticmethod
    def warmup_plan(ctx: RunContext) -> _warmup.WarmupPlan:
        plan = _warmup.WarmupPlan.from_params(ctx.params)
        if plan.adaptive and ctx.world_size > 1:
            return _warmup.WarmupPlan(steps=MULTI_DEVICE_WARMUP)
        return plan

    # -- the loop ----------------------------------------------------------------------------

    def make_step(self, ctx: RunContext, model, device):
        raise NotImplementedError

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import torch

        p = ctx.params
        plan = _timed.PhaseLength.from_params(p, windowed=bool(ctx.spec.barrier))
        yield self.config_event(ctx, plan)
        self.set_precision(p["precision"], p["cudnn"])
        try:
            t0 = time.perf_counter()
            model, device = self.build(ctx)
            if ctx.world_size > 1 and self.training:
                from torch.nn.parallel import DistributedDataParallel as DDP

                model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            yield events.startup("model_build_s", time.perf_counter() - t0)
            cuda = device.type == "cuda"
            sync = torch.cuda.synchronize if cuda else (lambda: None)
            t0 = time.perf_counter()
            data = self.batches(ctx, device)
            step = self.make_step(ctx, model, device)
            yield events.startup("data_setup_s", time.perf_counter() - t0)

            t0 = time.perf_counter()
            out = step(next(data))
            sync()
            first = time.perf_counter() - t0
            yield events.startup("first_step_s", first)
            # the barrier of gpuvs share, and the proof's "before", keep the reading of before issue 25
            if cuda and not ctx.spec.barrier and os.environ.get(READ_ENV) != "blocking":
                yield from self.timed_on_device(ctx, plan, step, data, out, first)
                return
            warm, times = _warmup.on_host(self.warmup_plan(ctx), lambda: step(next(data)), first, sync)
            if warm.stopped != "fixed":
                yield events.config(**_warmup.config_items(warm, times))
            yield events.startup("warmup_s", warm.seconds)
            if ctx.spec.launched_at:
                yield events.startup("launch_to_timed_s", time.time() - ctx.spec.launched_at)
            if cuda:
                yield from self.timed(ctx, step, data, cuda)
                return
            ctx.start_window()
            phase = _timed.TimedPhase(plan, lambda: step(next(data)), items=p["batch_size"] * ctx.world_size,
                                      unit=self.unit, display=p["display_every"], window_open=ctx.window_open)
            yield from phase.run()
            yield from self.final_metrics(phase.durations)
        except torch.cuda.OutOfMemoryError as exc:
            total = torch.cuda.get_device_properties(device).total_memory / 2**30 if torch.cuda.is_available() else 0
            raise WorkloadError("oom", f"out of GPU memory at batch size {p['batch_size']} ({p['model']}, "
                                f"{p['precision']}, image {p['image_size']}); the GPU has {total:.1f} GiB: "
                                f"{str(exc).splitlines()[0][:160]}") from None

    def timed_on_device(self, ctx: RunContext, plan: _timed.PhaseLength, step, data, out, first: float
                        ) -> Iterator[dict[str, Any]]:
        """Warm-up and timed steps with no synchronise between them: the device's clock marks the warm-up's
        start (right after the first step's synchronise, so at about the host's time h0) and the timed
        phase's start, which is queued behind the warm-up's steps; both are read after the phase."""
        import torch

        p = ctx.params
        dev = _timed.CudaDevice(torch)
        h0 = time.time()
        warm_start = dev.mark()
        launched, stopped, last, warm_times = _warmup.on_device(self.warmup_plan(ctx), lambda: step(next(data)),
                                                                first, dev, warm_start)
        out = out if last is None else last
        dev.prepare(out)
        ctx.start_window()
        phase = _timed.TimedPhase(plan, lambda: step(next(data)), items=p["batch_size"] * ctx.world_size,
                                  unit=self.unit, display=p["display_every"], window_open=ctx.window_open, device=dev)
        yield from phase.run()
        warm = phase.start_mark.seconds_since(warm_start)  # read after the phase's synchronise
        if stopped != "fixed":
            decision = _warmup.WarmupDecision(launched, first + warm, stopped)
            yield events.config(**_warmup.config_items(decision, warm_times()))
        yield events.startup("warmup_s", first + warm)
        if ctx.spec.launched_at:
            yield events.startup("launch_to_timed_s", h0 + warm - ctx.spec.launched_at)
        yield from self.final_metrics(phase.durations)

    def timed(self, ctx: RunContext, step, data, cuda: bool) -> Iterator[dict[str, Any]]:
        """The timed steps on a GPU as before issue 25 (under gpuvs share's barrier, and for the proof's
        "before"): samples are emitted at display steps, where the host waits for the GPU (a synchronise,
        and the loss read back). Under a start barrier the loop ends when the shared window closes (--steps
        is then an upper bound)."""
        import torch

        p = ctx.params
        items = p["batch_size"] * ctx.world_size
        display = p["display_every"]
        durations: list[float] = []
        ctx.start_window()
        marks = []  # CUDA events of the current display chunk: its start, then one per step
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[0].record()
        last = time.perf_counter()
        reported = 0
        for i in range(1, p["steps"] + 1):
            out = step(next(data))
            if cuda:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()
            else:
                now = time.perf_counter()
                durations.append(now - last)
                last = now
            closing = not ctx.window_open()
            if i % display == 0 or i == p["steps"] or closing:
                if cuda:
                    marks[-1].synchronize()
                    durations.extend(a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:]))
                    marks = marks[-1:]
                loss = float(out) if out is not None else None
                for j in range(reported + 1, i + 1):
                    sec = durations[j - 1]
                    extra = {"loss": loss} if (j == i and loss is not None) else {}
                    yield events.sample(j, items / sec, self.unit, seconds=sec, items=items, **extra)
                reported = i
            if closing:
                break
        yield from self.final_metrics(durations)

    def final_metrics(self, durations: list[float]) -> Iterator[dict[str, Any]]:
        return iter(())


@register
class CnnTrain(_CnnBase):
    name = "cnn-train"
    summary = "CNN training throughput (images/sec), tf_cnn_benchmarks style"
    params = COMMON + (
        Param("optimizer", str, "sgd", "sgd or momentum (0.9)", choices=("sgd", "momentum")),
        Param("lr", float, 0.01, "learning rate", min=0.0, max=10.0),
    )

    def make_step(self, ctx: RunContext, model, device):
        import torch

        p = ctx.params
        opt = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=0.9 if p["optimizer"] == "momentum" else 0.0)
        loss_fn = torch.nn.CrossEntropyLoss()
        scaler = precision.grad_scaler(p["precision"], device)
        model.train()
        autocast = precision.autocast(p["precision"], device)

        def step(batch):
            x, y = batch
            opt.zero_grad(set_to_none=True)
            with autocast:
                loss = loss_fn(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            return loss.detach()

        return step


@register
class CnnInfer(_CnnBase):
    name = "cnn-infer"
    summary = "CNN inference throughput (images/sec) and per-batch latency percentiles"
    params = COMMON
    training = False

    def make_step(self, ctx: RunContext, model, device):
        import torch

        model.eval()
        autocast = precision.autocast(ctx.params["precision"], device)

        def step(batch):
            x, _ = batch
            with torch.inference_mode(), autocast:
                model(x)
            return None

        return step

    def final_metrics(self, durations: list[float]) -> Iterator[dict[str, Any]]:
        import numpy as np

        ms = np.asarray(durations) * 1000.0
        for q in (50, 90, 99):
            yield events.metric(f"latency_p{q}_ms", float(np.percentile(ms, q)), "ms")
        yield events.metric("latency_mean_ms", float(ms.mean()), "ms")
