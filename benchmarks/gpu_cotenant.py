"""A co-tenant outside Kubernetes for the GPU cluster kit (benchmarks/gpu_cluster.sh): large matrix products in a loop
on one GPU, so that the pods that GPU's node runs share its multiprocessors with it. It only computes: it never
changes clocks, power limits, compute mode or MIG.

    CUDA_VISIBLE_DEVICES=GPU-<uuid> python benchmarks/gpu_cotenant.py [--size 8192] [--seconds 600]

Prints one line `cotenant running gpu=NAME uuid=UUID` once its first products are done (the kit waits for it), then
`cotenant rate=X TFLOP/s` every few seconds, and `cotenant stopped after S s, N products` when SIGTERM/SIGINT or
--seconds (a backstop, should whoever started it be killed outright) ends it. --device cpu runs the same loop on the
CPU (to test the script on a machine without a GPU)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192, help="N of the N x N x N products")
    ap.add_argument("--seconds", type=float, default=600.0, help="stop by itself after this long")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--every", type=float, default=5.0, help="seconds between rate lines")
    args = ap.parse_args(argv)
    if args.size < 1 or args.seconds <= 0 or args.every <= 0:
        print("cotenant: --size, --seconds and --every must be above 0", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: done.set())
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("cotenant: no CUDA device visible (CUDA_VISIBLE_DEVICES names the GPU)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    a = torch.randn(args.size, args.size, device=args.device, dtype=dtype)
    b = torch.randn(args.size, args.size, device=args.device, dtype=dtype)
    c = torch.empty_like(a)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    flop = 2.0 * args.size ** 3
    torch.matmul(a, b, out=c)
    sync()
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        uuid = str(getattr(props, "uuid", "")) or "?"
        uuid = uuid if uuid.startswith("GPU-") or uuid == "?" else f"GPU-{uuid}"
        print(f"cotenant running gpu={props.name} uuid={uuid}", flush=True)
    else:
        print("cotenant running gpu=cpu uuid=-", flush=True)
    t0 = last = time.monotonic()
    total = since = 0
    while not done.is_set() and time.monotonic() - t0 < args.seconds:
        for _ in range(8):  # a batch of products between looks at the clock: the GPU never runs dry
            torch.matmul(a, b, out=c)
        sync()
        total += 8
        since += 8
        now = time.monotonic()
        if now - last >= args.every:
            print(f"cotenant rate={since * flop / (now - last) / 1e12:.1f} TFLOP/s", flush=True)
            last, since = now, 0
    print(f"cotenant stopped after {time.monotonic() - t0:.1f} s, {total} products", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
