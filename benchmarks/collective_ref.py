"""Reference for benchmarks/collective_gpu.py: the plainest torch.distributed all-reduce loop, no gpuvs.

    python3 benchmarks/collective_ref.py N SIZE[,SIZE...] [cpu] [warmup=5] [iters=20] [repeats=5]
Each sample is a barrier and ITERS operations to the device's completion, the slowest rank's time.
busbw = S / t x 2(n-1)/n (nccl-tests' doc/PERFORMANCE.md); it prints one JSON line, {size: busbw GB/s}."""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, n, port, sizes, cpu, warmup, iters, repeats, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if not cpu:
        torch.cuda.set_device(rank)
    dev = torch.device("cpu" if cpu else f"cuda:{rank}")
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    dist.init_process_group("gloo" if cpu else "nccl", rank=rank, world_size=n)
    out = {}
    for size in sizes:
        x = torch.zeros(size // 4, device=dev)
        for _ in range(warmup):
            dist.all_reduce(x)
        total = 0.0
        for _ in range(repeats):
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            sync()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            total += t.item()
        out[size] = size / 1e9 / (total / (repeats * iters)) * 2 * (n - 1) / n
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    n, sizes = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
    opts = dict(a.split("=") for a in sys.argv[3:] if "=" in a)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, nprocs=n, args=(n, port, sizes, "cpu" in sys.argv[3:], int(opts.get("warmup", 5)),
                                        int(opts.get("iters", 20)), int(opts.get("repeats", 5)), q))
    print(json.dumps(q.get()))
