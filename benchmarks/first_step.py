"""Where a fresh trial's first training step goes on a GPU: one parent imports torch, a forked child per case.

    python3 benchmarks/first_step.py [--preload] CASE...     CASE: JOB[:KEY=VALUE,...], JOB aa or def
    e.g. python3 benchmarks/first_step.py aa aa aa:bench=off aa:prof=1 def def:limit=1
Keys bench, limit, prof, nvml, initthread: JOBS in this file; --preload loads cuDNN first. A JSON line a case."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import threading
import time

T0 = time.perf_counter()
import torch  # noqa: E402
import torchvision  # noqa: E402

IMPORT_S = time.perf_counter() - T0
# JOB aa: ResNet-50 bf16 NHWC batch 256, issue 25's A/A; def: cnn-train's defaults, fp32 NCHW batch 64. Keys:
#   bench=on|off|split  cuDNN benchmark mode (split: a first step with heuristics, then benchmark on)
#   limit=N             torch.backends.cudnn.benchmark_limit (PyTorch's default is 10)
#   prof=1              torch.profiler over the first step: GPU kernel seconds and the top CPU entries
#   nvml=1              a thread reading NVML every 0.1 s, as gpuvs's telemetry does
#   initthread=1        the CUDA context made in a background thread, as gpuvs's worker does
# --preload: the parent loads cuDNN's libraries (dlopen, no CUDA call) before it forks.
# Each child times its first step (forward, backward, optimiser), the next 9, then 30 (or 60) for the rate.
JOBS = {"aa": dict(bs=256, prec="bf16", fmt="NHWC"), "def": dict(bs=64, prec="fp32", fmt="NCHW")}


def preload() -> tuple[float, list[str]]:
    import nvidia.cudnn

    t = time.perf_counter()
    loaded = []
    for path in sorted(glob.glob(os.path.join(list(nvidia.cudnn.__path__)[0], "lib", "lib*.so*"))):
        ctypes.CDLL(path)
        loaded.append(os.path.basename(path))
    return time.perf_counter() - t, loaded


def nvml_reader(stop: threading.Event) -> None:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)

    def loop() -> None:
        while not stop.is_set():
            pynvml.nvmlDeviceGetUtilizationRates(h)
            pynvml.nvmlDeviceGetMemoryInfo(h)
            pynvml.nvmlDeviceGetPowerUsage(h)
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            stop.wait(0.1)

    threading.Thread(target=loop, daemon=True).start()


def sync_time(fn) -> float:
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def case(cfg: dict) -> dict:
    out = dict(cfg)
    stop = threading.Event()
    if cfg.get("nvml"):
        nvml_reader(stop)
    if cfg.get("initthread"):
        threading.Thread(target=torch.cuda.init, daemon=True).start()
    torch.backends.cudnn.benchmark = cfg.get("bench", "on") != "off"
    if "limit" in cfg:
        torch.backends.cudnn.benchmark_limit = int(cfg["limit"])
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out["ctx_s"] = sync_time(lambda: torch.zeros(1, device="cuda"))
    out["cudnn"] = torch.backends.cudnn.version()
    fmt = torch.channels_last if cfg["fmt"] == "NHWC" else torch.contiguous_format
    t = time.perf_counter()
    with torch.device("cuda"):
        model = torchvision.models.resnet50(weights=None)
    model = model.to(memory_format=fmt)
    torch.cuda.synchronize()
    out["build_s"] = time.perf_counter() - t
    x = torch.randn(cfg["bs"], 3, 224, 224, device="cuda").contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (cfg["bs"],), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dtype = torch.bfloat16 if cfg["prec"] == "bf16" else None
    state: dict = {}

    def forward() -> None:
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            state["loss"] = torch.nn.functional.cross_entropy(model(x), y)

    def optimise() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step() -> None:
        forward()
        state["loss"].backward()
        optimise()

    if cfg.get("bench") == "split":
        torch.backends.cudnn.benchmark = False
        out["heuristic_step_s"] = sync_time(step)
        torch.backends.cudnn.benchmark = True
    c0 = time.process_time()
    if cfg.get("prof"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out["first_s"] = sync_time(step)
        averages = prof.key_averages()
        out["gpu_kernel_s"] = sum(getattr(e, "self_device_time_total", 0) for e in averages) / 1e6
        top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
        out["top_cpu"] = [(e.key[:60], e.count, round(e.self_cpu_time_total / 1e6, 3)) for e in top]
    else:
        out["first_fwd_s"] = sync_time(forward)
        out["first_bwd_s"] = sync_time(lambda: state["loss"].backward())
        out["first_opt_s"] = sync_time(optimise)
        out["first_s"] = out["first_fwd_s"] + out["first_bwd_s"] + out["first_opt_s"]
    out["first_cpu_s"] = time.process_time() - c0
    out["next9_s"] = sync_time(lambda: [step() for _ in range(9)])
    n = 30 if cfg["bs"] >= 256 else 60
    out["rate"] = cfg["bs"] * n / sync_time(lambda: [step() for _ in range(n)])
    stop.set()
    return out


def run_forked(cfg: dict) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = case(cfg)
        except BaseException as exc:  # noqa: BLE001 - the case's failure is its line
            res = {**cfg, "error": repr(exc)}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def parse(text: str) -> dict:
    job, _, opts = text.partition(":")
    if job not in JOBS:
        raise SystemExit(f"first_step.py: {job!r}: JOB is aa or def")
    cfg: dict = {"case": text, **JOBS[job]}
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition("=")
        cfg[key] = value
    return cfg


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    head: dict = {"import_s": IMPORT_S, "torch": torch.__version__}  # nothing that starts CUDA before a fork
    if argv[0] == "--preload":
        argv = argv[1:]
        head["preload_s"], head["preloaded"] = preload()
    print(json.dumps(head), flush=True)
    for text in argv:
        print(json.dumps(run_forked(parse(text))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
