"""GPU proof of sharing: gpuvs share for ResNet-50 bf16 bs128 (workers 1, 2, 4; MPS off and on),
a capacity search, and advise-mps on pairs. Writes one markdown file with the commands.

usage: PYTHONPATH=src python benchmarks/sharing.py OUT_DIR [part ...]   parts: share capacity advise matrix"""

import subprocess
import sys
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
PARTS = sys.argv[2:] or ["share", "capacity", "advise", "matrix"]
OUT.mkdir(parents=True, exist_ok=True)
DB = OUT / "sharing.db"
MD = OUT / "sharing.md"
R50 = "--model resnet50 --batch-size 128 --precision bf16 --data-format NHWC"
PAIRS = [
    ("kernels --app pathfinder --check false", "kernels --app hotspot --check false"),
    ("cnn-infer --model resnet18 --batch-size 8 --image-size 64", "cnn-infer --model mobilenet_v2 --batch-size 8 --image-size 64"),
]


def gpuvs(args: list[str], timeout: int = 900) -> str:
    cmd = [sys.executable, "-m", "gpuvs", *args, "--store", str(DB)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**__import__("os").environ,
                                                                                 "COLUMNS": "160"})
    print(f"[{time.time() - t0:.0f}s] exit {p.returncode}: gpuvs {' '.join(args)}", flush=True)
    text = p.stdout + (f"\n(exit {p.returncode}) {p.stderr.strip()[-600:]}" if p.returncode else "")
    print(text[-4000:], flush=True)
    return text


def section(title: str, args: list[str], shown: str) -> None:
    out = gpuvs(args)
    tables = [line for line in out.splitlines() if not line.startswith(("  ", "─", "note:"))]
    with MD.open("a") as fh:
        fh.write(f"### {title}\n\n`{shown}`\n\n```\n" + "\n".join(tables).strip() + "\n```\n\n")


def main() -> None:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    MD.write_text(f"GPU: {gpu}; measured {time.strftime('%Y-%m-%d')}.\n\n")
    if "share" in PARTS:
        args = ["share", "cnn-train", *R50.split(), "--device", "cuda", "--workers", "1,2,4", "--mps", "both",
                "--duration", "12"]
        section("ResNet-50 bf16 bs 128 training, 1/2/4 workers, MPS off and on", args, "gpuvs " + " ".join(args))
    if "capacity" in PARTS:
        args = ["share", "--capacity", "cnn-train", "--model", "resnet50", "--batch-size", "256", "--precision",
                "bf16", "--device", "cuda", "--max-workers", "8", "--duration", "3"]
        section("Capacity search", args, "gpuvs " + " ".join(args))
    if "advise" in PARTS:
        for a, b in PAIRS:
            args = ["advise-mps", a, b, "--device", "cuda", "--duration", "8"]
            section(f"advise-mps: {a} + {b}", args, f'gpuvs advise-mps "{a}" "{b}" --device cuda --duration 8')
    if "matrix" in PARTS:
        args = ["share-matrix", "experiments/sharing/mps-kernel-pairs.yaml", "--device", "cuda", "--duration", "4"]
        section("MPS kernel-pair matrix", args, "gpuvs " + " ".join(args))
    print(MD.read_text())


if __name__ == "__main__":
    main()
