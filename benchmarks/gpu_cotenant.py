"""A co-tenant outside Kubernetes for the GPU cluster kit: large matrix products in a loop on one GPU.

    CUDA_VISIBLE_DEVICES=GPU-<uuid> python benchmarks/gpu_cotenant.py [--size 8192] [--seconds 600] [--busy 0.05]
It only computes: it never changes clocks, power limits, compute mode or MIG. The kit waits for its `running` line.
--busy SHARE runs products for SHARE of every --period and sleeps the rest; its rate lines say the share measured."""

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
    ap.add_argument("--busy", type=float, default=1.0, help="share of each period spent computing (0 < SHARE <= 1)")
    ap.add_argument("--period", type=float, default=0.1, help="seconds of one busy-then-idle cycle (with --busy)")
    args = ap.parse_args(argv)
    if args.size < 1 or args.seconds <= 0 or args.every <= 0 or args.period <= 0:
        print("cotenant: --size, --seconds, --every and --period must be above 0", file=sys.stderr)
        return 2
    if not 0 < args.busy <= 1:
        print(f"cotenant: --busy {args.busy}: a share of the time, above 0 and at most 1", file=sys.stderr)
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
    busy_s = 0.0  # time inside products since the last rate line
    batch = 8 if args.busy >= 1 else 1  # a light co-tenant looks at the clock after every product
    while not done.is_set() and time.monotonic() - t0 < args.seconds:
        cycle = time.monotonic()
        while True:  # busy for its share of the period (the whole of it at --busy 1)
            for _ in range(batch):  # a batch of products between looks at the clock: the GPU never runs dry
                torch.matmul(a, b, out=c)
            sync()
            total += batch
            since += batch
            if args.busy >= 1 or time.monotonic() - cycle >= args.busy * args.period or done.is_set():
                break
        now = time.monotonic()
        busy_s += now - cycle
        if args.busy < 1:
            done.wait(max(0.0, cycle + args.period - now))
            now = time.monotonic()
        if now - last >= args.every:
            print(f"cotenant rate={since * flop / (now - last) / 1e12:.3g} TFLOP/s busy={busy_s / (now - last):.3f}",
                  flush=True)
            last, since, busy_s = now, 0, 0.0
    print(f"cotenant stopped after {time.monotonic() - t0:.1f} s, {total} products", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
