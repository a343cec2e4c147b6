"""startup: how long a short job takes from launch to its first result, apart from steady-state throughput.

Each trial is one launch: from the moment the launcher started it (spec.launched_at) to a synchronised first result.
Jobs: kernel (one tiny kernel, read back) and model (a small torchvision model's first forward pass)."""

from __future__ import annotations

import time
from typing import Any, Iterator

from gpuvs import events
from gpuvs.errors import WorkloadError
from gpuvs.params import Param
from gpuvs.workloads import register
from gpuvs.workloads.workload import RunContext, Workload, duration

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "alexnet")


@register
class Startup(Workload):
    name = "startup"
    summary = "launch to first GPU result, and total wall time, of a short job (one launch per trial)"
    unit = "s"
    metrics = (duration("first_result_s", headline=True), duration("*_s"))
    requires = ("torch",)
    fork_by_default = False  # what it measures is the launch itself: a fresh process per trial
    params = (
        Param("job", str, "kernel", "kernel: one tiny kernel; model: build a small model, one forward pass",
              choices=("kernel", "model")),
        Param("model", str, "resnet18", "torchvision model of the model job", choices=MODELS),
        Param("batch_size", int, 1, "images in the model job's forward pass", min=1, max=4096),
        Param("image_size", int, 224, "image height and width of the model job", min=32, max=1024),
    )

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import torch

        p = ctx.params
        launched = ctx.spec.launched_at
        yield events.config(job=p["job"], device=ctx.device,
                            **({"model": p["model"], "batch_size": p["batch_size"], "image_size": p["image_size"]}
                               if p["job"] == "model" else {}))
        t_ready = time.time()  # python up, gpuvs and the framework imported, fingerprint taken
        device = torch.device(ctx.device)
        cuda = device.type == "cuda"
        if cuda:
            if not torch.cuda.is_available():
                raise WorkloadError("unavailable", f"device {ctx.device} asked for, but torch sees no GPU "
                                    f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
            if device.index is not None:  # "cuda" alone is the current device already
                torch.cuda.set_device(device)
            torch.cuda.init()
            torch.empty(1, device=device)  # the context exists once memory can be allocated
            torch.cuda.synchronize(device)
        t_device = time.time()
        if p["job"] == "kernel":
            value = (torch.ones(1, device=device) + 1).sum().item()  # .item() waits for the device
            if value != 2.0:
                raise WorkloadError("crash", f"the kernel returned {value}, not 2.0")
        else:
            try:
                import torchvision
            except ImportError as exc:
                raise WorkloadError("unavailable", f"the model job needs torchvision ({exc})") from None
            model = getattr(torchvision.models, p["model"])(weights=None).to(device).eval()
            x = torch.randn(p["batch_size"], 3, p["image_size"], p["image_size"], device=device)
            with torch.inference_mode():
                value = float(model(x).float().sum().item())
        t_result = time.time()
        base = launched if launched else t_ready
        # lower is better for every series (unit s); the first one is the headline
        yield events.sample(1, t_result - base, "s", series="first_result_s")
        yield events.sample(1, t_ready - base, "s", series="ready_s")
        yield events.sample(1, t_device - t_ready, "s", series="device_init_s")
        yield events.sample(1, t_result - t_device, "s", series="first_op_s")
        if not launched:
            yield events.log("no launch time in the spec: first_result_s counts from the framework being ready")
