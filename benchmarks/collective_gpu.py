r"""GPU proof of issue 35, item 2: gpuvs's `collective` all-reduce across 2 and 4 GPUs against a plain NCCL loop.

    OUT=DIR [SIZES=8,128M,4] [ITERS=20] [REPEATS=5] [WARMUP=5] [TOTAL_S=220] \
        PYTHONPATH=src python3 benchmarks/collective_gpu.py [--device cpu]      (the reference: collective_ref.py)
Writes OUT/collective_gpu.md (busbw of each and their ratio), .db and .log. --device cpu: gloo, a dry run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "src"))
from gpuvs.workloads.collective import parse_size, sweep  # noqa: E402

CPU = "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu"
OUT = Path(os.environ.get("OUT") or "out")
OUT.mkdir(parents=True, exist_ok=True)
DB, MD, LOG = OUT / "collective_gpu.db", OUT / "collective_gpu.md", OUT / "collective_gpu.log"
LOW, HIGH, FACTOR = os.environ.get("SIZES", "1K,64K,4" if CPU else "8,128M,4").split(",")
ITERS, REPEATS, WARMUP = (os.environ.get(k, d) for k, d in (("ITERS", "20"), ("REPEATS", "5"), ("WARMUP", "5")))
END = time.monotonic() + float(os.environ.get("TOTAL_S", "220"))
ENV = dict(os.environ, PYTHONPATH=str(HERE / "src"), PYTHONUNBUFFERED="1", COLUMNS="100")


def sh(cmd: list[str]) -> str:
    left = END - time.monotonic()
    with LOG.open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        if left < 10:
            log.write("skipped: out of time\n")
            return ""
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=HERE, timeout=left)
        except subprocess.TimeoutExpired:
            log.write(f"stopped after {left:.0f} s\n")
            return ""
        log.write(r.stdout + r.stderr + f"[exit {r.returncode}]\n")
    return r.stdout if r.returncode == 0 else ""


def gpus() -> int:
    if CPU:
        return 4
    import torch

    return torch.cuda.device_count()


def main() -> int:
    sizes = sweep(parse_size("min_bytes", LOW), parse_size("max_bytes", HIGH), int(FACTOR))
    have = gpus()
    counts = [n for n in (2, 4) if n <= have]
    if not counts:
        print(f"collective_gpu: {have} GPU(s): 2 at least are needed", file=sys.stderr)
        return 2
    rows, t0 = [], time.monotonic()
    for n in counts:
        out = sh([sys.executable, "-m", "gpuvs", "run", "collective", "--device", "cpu" if CPU else "cuda",
                  "--num-gpus", str(n), "--op", "all-reduce", "--min-bytes", LOW, "--max-bytes", HIGH, "--factor",
                  FACTOR, "--warmup", WARMUP, "--iters", ITERS, "--repeats", REPEATS, "--store", str(DB),
                  "--name", f"all-reduce x{n}", "--quiet"])
        ident = next((ln.split()[3] for ln in out.splitlines() if ln.startswith("stored as experiment")), None)
        ours = {}
        if ident:
            data = json.loads(sh([sys.executable, "-m", "gpuvs", "report", ident, "--store", str(DB), "--format",
                                  "json"]) or "{}")
            for series, values in (data.get("arms") or [{}])[0].get("values", {}).items():
                if series.endswith(" B") and values:
                    ours[int(series.split()[0])] = sum(values.values()) / len(values)
        ref = reference(n, sizes)
        for size in sizes:
            a, b = ours.get(size), ref.get(size)
            rows.append((n, size, a, b, a / b if a and b else None))
    write(rows, have, time.monotonic() - t0)
    return 0 if all(r[4] is not None for r in rows) else 1


def reference(n: int, sizes: list[int]) -> dict[int, float]:
    out = sh([sys.executable, str(HERE / "benchmarks" / "collective_ref.py"), str(n), ",".join(map(str, sizes)),
              *(["cpu"] if CPU else []), f"warmup={WARMUP}", f"iters={ITERS}", f"repeats={REPEATS}"])
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return {int(k): v for k, v in json.loads(lines[-1]).items()} if lines else {}


def write(rows, have: int, wall: float) -> None:
    def num(x):
        return "-" if x is None else f"{x:.3g}"

    device = "CPU (gloo)" if CPU else f"{have} GPU(s) (NCCL)"
    lines = [f"# collective all-reduce: gpuvs against a plain torch.distributed loop, {device}", "",
             f"float32, sizes {LOW} to {HIGH} x{FACTOR}, {WARMUP} warm-up, {REPEATS} samples of {ITERS} operations "
             f"per size, the slowest rank's time; busbw = S/t x 2(n-1)/n (nccl-tests). Wall time {wall:.0f} s.", "",
             "| ranks | size (B) | gpuvs busbw (GB/s) | reference busbw (GB/s) | ratio |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {n} | {size} | {num(a)} | {num(b)} | {num(r)} |" for n, size, a, b, r in rows]
    MD.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
