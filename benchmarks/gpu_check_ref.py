"""gpu-check against references on the same GPU (issue 33, item 1).

    PYTHONPATH=src python3 benchmarks/gpu_check_ref.py [--steps 10] [--json OUT.json]
gpu-check runs in a process without PyTorch, which reports the libraries and GPU modules it loaded.
Then torch's references for each figure, timed alike; a table gives each ratio, its tolerance and the datasheet peak."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHECK = r"""
import json, sys, time
from gpuvs import workloads
from gpuvs.spec import RunSpec
from gpuvs.workloads.workload import RunContext
params = json.loads(sys.argv[1])
w = workloads.get("gpu-check")
spec = RunSpec(workload="gpu-check", params=params, device="cuda")
t0 = time.perf_counter()
evs = list(w.run(RunContext(spec=spec, params=w.validate(spec.params, "cuda"))))
wall = time.perf_counter() - t0
figures = {}
for name, s in w.summarize([e for e in evs if e["type"] == "sample"], params).items():
    figures[name] = {"value": s["value"], "pm": s["pm"], "unit": s["unit"], "n": s["n"]}
from gpuvs.workloads.gpu_check import gpu_code_loaded
driver, other, mods = gpu_code_loaded()
gpu_libs = driver + other
config = next(e for e in evs if e["type"] == "config")["items"]
print("GPUCHECK " + json.dumps({"figures": figures, "config": config, "gpu_libs": gpu_libs, "gpu_modules": mods,
                                "logs": [e["message"] for e in evs if e["type"] == "log"], "wall_s": wall,
                                "startup": {e["name"]: e["seconds"] for e in evs if e["type"] == "startup"}}))
"""

REFERENCE = r"""
import json, sys, torch
steps, copy_mib, transfer_mib = (int(x) for x in sys.argv[1:4])
dev = "cuda"

def timed(fn, inner, blocks, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(blocks + 1)]
    marks[0].record()
    for b in range(blocks):
        for _ in range(inner):
            fn()
        marks[b + 1].record()
    marks[-1].synchronize()
    secs = [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(blocks)]
    return inner * blocks, sum(secs)

out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
n = 8192
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
c = torch.empty(n, n, device=dev)
k, s = timed(lambda: torch.matmul(a, b, out=c), 2, steps)
out["fp32_matmul_tflops"] = 2 * n ** 3 * k / s / 1e12
a16, b16 = a.half(), b.half()
c16 = torch.empty(n, n, device=dev, dtype=torch.half)
k, s = timed(lambda: torch.matmul(a16, b16, out=c16), 10, steps)
out["fp16_matmul_tflops"] = 2 * n ** 3 * k / s / 1e12
del a, b, c, a16, b16, c16
size = copy_mib << 20
src = torch.randint(0, 256, (size,), dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
k, s = timed(lambda: dst.copy_(src), 100, steps)
out["d2d_copy_gbps"] = 2 * size * k / s / 1e9
assert torch.equal(dst, src)
size = transfer_mib << 20
host = torch.randint(0, 256, (size,), dtype=torch.uint8).pin_memory()
dev_buf = torch.empty(size, dtype=torch.uint8, device=dev)
k, s = timed(lambda: dev_buf.copy_(host, non_blocking=True), 16, steps)
out["h2d_pinned_gbps"] = size * k / s / 1e9
back = torch.empty(size, dtype=torch.uint8).pin_memory()
k, s = timed(lambda: back.copy_(dev_buf, non_blocking=True), 16, steps)
out["d2h_pinned_gbps"] = size * k / s / 1e9
torch.cuda.synchronize()
assert torch.equal(back, host)
k, s = timed(lambda: torch.cuda._sleep(0), 2000, steps, warm=200)
out["launch_us"] = s / k * 1e6
props = torch.cuda.get_device_properties(0)
out["sms"] = props.multi_processor_count
print("REFERENCE " + json.dumps(out))
"""

# figure -> (reference key, tolerance: the ratio gpu-check / reference must be at least this, or None to show only)
ROWS = [("fp32_fma", "fp32_matmul_tflops", None), ("fp16_mma", "fp16_matmul_tflops", None),
        ("d2d_copy", "d2d_copy_gbps", 0.85), ("h2d_pinned", "h2d_pinned_gbps", 0.85),
        ("d2h_pinned", "d2h_pinned_gbps", 0.85), ("launch", "launch_us", None)]


def tagged(text: str, tag: str) -> dict:
    return json.loads(next(line for line in text.splitlines() if line.startswith(tag + " "))[len(tag) + 1:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--copy-mib", type=int, default=256)
    ap.add_argument("--transfer-mib", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    params = {"steps": args.steps, "copy_mib": args.copy_mib, "transfer_mib": args.transfer_mib}
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps(params)], capture_output=True, text=True, env=env)
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode:
        print(f"gpu-check process failed ({r.returncode})")
        return 1
    check = tagged(r.stdout, "GPUCHECK")
    r = subprocess.run([sys.executable, "-c", REFERENCE, str(args.steps), str(args.copy_mib), str(args.transfer_mib)],
                       capture_output=True, text=True, env=env)
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode:
        print(f"reference process failed ({r.returncode})")
        return 1
    ref = tagged(r.stdout, "REFERENCE")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from gpuvs.probes import peaks

    cfg = check["config"]
    peak = peaks.lookup(cfg["device_name"]) or peaks.Peaks("")
    datasheet = {"fp32_fma": peak.tflops_for("fp32"), "fp16_mma": peak.tflops_for("fp16"),
                 "d2d_copy": peak.memory_gbps}
    print(f"GPU: {cfg['device_name']} (cc {cfg['compute_capability']}, {cfg['multiprocessors']} SMs), CUDA driver "
          f"{cfg['cuda_driver']}; references: torch {ref['torch']}")
    print(f"gpu-check process: GPU libraries mapped: {check['gpu_libs']}; GPU modules imported: "
          f"{check['gpu_modules'] or 'none'}; wall {check['wall_s']:.1f} s; start-up {check['startup']}")
    print()
    print("| figure | gpu-check | reference (torch) | gpu-check / reference | tolerance | datasheet | gpu-check / "
          "datasheet |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for name, key, tol in ROWS:
        f = check["figures"].get(name)
        if f is None:
            print(f"| {name} | skipped | {ref[key]:.4g} | | | | |")
            continue
        ratio = f["value"] / ref[key]
        within = "" if tol is None else ("ok" if ratio >= tol else "NOT MET")
        ok &= within != "NOT MET"
        ds = datasheet.get(name)
        print(f"| {name} | {f['value']:.4g} ± {f['pm']:.2g} {f['unit']} | {ref[key]:.4g} | {ratio:.3f} | "
              f"{'>= %.2f %s' % (tol, within) if tol else 'shown'} | {ds or ''} | "
              f"{'%.3f' % (f['value'] / ds) if ds else ''} |")
    fma, ds = check["figures"]["fp32_fma"]["value"], datasheet["fp32_fma"]
    if ds:
        met = fma / ds >= 0.85
        ok &= met
        print(f"\nfp32_fma / datasheet fp32 peak = {fma / ds:.3f} (tolerance >= 0.85: {'ok' if met else 'NOT MET'})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"check": check, "reference": ref}, fh, indent=1)
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
