"""GPU proof of the foundation: gpuvs cnn-train against a plain PyTorch loop, alternating, in one
command; then the figures tf_cnn_benchmarks users quote. Writes one markdown file.

usage: PYTHONPATH=src python benchmarks/foundation.py OUT_DIR [--quick]"""

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
QUICK = "--quick" in sys.argv
OUT.mkdir(parents=True, exist_ok=True)
DB = OUT / "foundation.db"
PY = sys.executable
lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def gpuvs(*args: str, timeout: int = 600) -> tuple[int, str]:
    cmd = [PY, "-m", "gpuvs", "run", *args, "--store", str(DB), "--quiet"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    print(f"  [{time.time() - t0:.0f}s] gpuvs run {' '.join(args)} -> {p.returncode}", flush=True)
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:], flush=True)
    return p.returncode, p.stdout


def last_trials(n: int) -> list[dict]:
    db = sqlite3.connect(DB)
    rows = db.execute("SELECT status, summary, startup, error FROM trials ORDER BY id DESC LIMIT ?", (n,)).fetchall()
    return [{"status": s, "summary": json.loads(m or "{}"), "startup": json.loads(u or "{}"), "error": e}
            for s, m, u, e in reversed(rows)]


def plain(model: str, bs: int, precision: str, fmt: str, steps: int, infer: bool = False) -> float:
    args = [PY, "benchmarks/plain_loop.py", model, str(bs), precision, fmt, str(steps), "10"] + (["infer"] if infer else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode:
        print(p.stderr[-2000:], flush=True)
        return float("nan")
    return json.loads(p.stdout.strip().splitlines()[-1])["images_per_sec"]


def main() -> None:
    steps = 20 if QUICK else 100
    trials = 1 if QUICK else 3
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    say("## Foundation: gpuvs cnn-train against a plain PyTorch loop")
    say()
    say(f"GPU: {gpu}; torch {__import__('torch').__version__}; measured {time.strftime('%Y-%m-%d')}.")
    say()
    common = ["--model", "resnet50", "--batch-size", "256", "--precision", "bf16", "--data-format", "NHWC",
              "--steps", str(steps), "--warmup-steps", "10", "--device", "cuda"]
    say("Alternating, one process each, plain loop first in every pair:")
    say()
    say("```")
    say(f"python benchmarks/plain_loop.py resnet50 256 bf16 NHWC {steps} 10")
    say("gpuvs run cnn-train " + " ".join(common))
    say("```")
    say()
    ref, ours = [], []
    for i in range(trials):
        ref.append(plain("resnet50", 256, "bf16", "NHWC", steps))
        code, _ = gpuvs("cnn-train", *common)
        t = last_trials(1)[0]
        ours.append(t["summary"].get("main", {}).get("value", float("nan")) if t["status"] == "ok" else float("nan"))
    say("| pair | plain loop images/sec | gpuvs images/sec | gpuvs / plain |")
    say("| --- | ---: | ---: | ---: |")
    for i, (a, b) in enumerate(zip(ref, ours)):
        say(f"| {i + 1} | {a:.1f} | {b:.1f} | {b / a:.4f} |")
    ratio = statistics.mean(ours) / statistics.mean(ref)
    say(f"| mean | {statistics.mean(ref):.1f} | {statistics.mean(ours):.1f} | **{ratio:.4f}** |")
    say()
    say(f"gpuvs reaches {100 * ratio:.2f}% of the plain loop (requirement: at least 99%).")
    say()
    say("## Figures tf_cnn_benchmarks users quote (gpuvs cnn-train, 1 trial each)")
    say()
    say("| model | batch | precision | format | images/sec | +/- | jitter | first step s | plain loop | gpuvs / plain |")
    say("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    cases = [("resnet50", "resnet50", 64, "fp32", "NCHW"), ("vgg16", "vgg16", 64, "fp32", "NCHW"),
             ("inception3", "inception_v3", 64, "fp32", "NCHW"), ("alexnet", "alexnet", 512, "fp32", "NCHW"),
             ("resnet50", "resnet50", 64, "tf32", "NHWC")]
    for name, tv_name, bs, prec, fmt in cases:
        code, _ = gpuvs("cnn-train", "--model", name, "--batch-size", str(bs), "--precision", prec,
                        "--data-format", fmt, "--steps", str(steps // 2), "--device", "cuda")
        t = last_trials(1)[0]
        base = plain(tv_name, bs, prec, fmt, steps // 2)
        m = t["summary"].get("main", {})
        if t["status"] == "ok":
            say(f"| {name} | {bs} | {prec} | {fmt} | {m['value']:.1f} | {m['pm']:.1f} | {m['jitter']:.1f} | "
                f"{t['startup'].get('first_step_s', float('nan')):.2f} | {base:.1f} | {m['value'] / base:.3f} |")
        else:
            say(f"| {name} | {bs} | {prec} | {fmt} | failed: {t['error']} | | | | {base:.1f} | |")
    say()
    say("Command per row: `gpuvs run cnn-train --model M --batch-size B --precision P --data-format F "
        f"--steps {steps // 2} --device cuda`; plain loop: `python benchmarks/plain_loop.py M B P F {steps // 2} 10`.")
    say()
    say("## Inference")
    say()
    code, _ = gpuvs("cnn-infer", "--model", "resnet50", "--batch-size", "256", "--precision", "bf16",
                    "--data-format", "NHWC", "--steps", str(steps), "--device", "cuda")
    t = last_trials(1)[0]
    base = plain("resnet50", 256, "bf16", "NHWC", steps, infer=True)
    m = t["summary"].get("main", {})
    db = sqlite3.connect(DB)
    metrics = json.loads(db.execute("SELECT metrics FROM trials ORDER BY id DESC LIMIT 1").fetchone()[0] or "{}")
    if t["status"] == "ok":
        say(f"`gpuvs run cnn-infer --model resnet50 --batch-size 256 --precision bf16 --data-format NHWC --steps {steps}`:"
            f" {m['value']:.1f} images/sec (plain inference loop {base:.1f}, ratio {m['value'] / base:.3f}); "
            f"per-batch latency p50 {metrics['latency_p50_ms']['value']:.2f} ms, "
            f"p99 {metrics['latency_p99_ms']['value']:.2f} ms.")
    else:
        say(f"cnn-infer failed: {t['error']}")
    say()
    say("## Out of memory")
    say()
    code, out = gpuvs("cnn-train", "--model", "vgg16", "--batch-size", "8192", "--device", "cuda", "--steps", "2")
    t = last_trials(1)[0]
    say(f"`gpuvs run cnn-train --model vgg16 --batch-size 8192 --device cuda`: exit {code}, trial {t['status']}: {t['error']}")
    (OUT / "foundation.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
