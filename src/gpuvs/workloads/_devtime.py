"""Timing blocks of device work: CUDA events on a GPU (the host never waits inside the timed loop),
a host clock on the CPU. Shared by the hardware workloads (gemm, membw, kernels)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable


def is_cuda(device: str) -> bool:
    return device.split(":", 1)[0] == "cuda"


def sync(torch, cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def timed_blocks(torch, cuda: bool, step: Callable[[], object], inner: int, blocks: int) -> list[float]:
    """Run `step` inner x blocks times; seconds of each block. On a GPU, one event between blocks,
    read once at the end."""
    if cuda:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(blocks + 1)]
        marks[0].record()
        for b in range(blocks):
            for _ in range(inner):
                step()
            marks[b + 1].record()
        marks[-1].synchronize()
        return [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(blocks)]
    out = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        out.append(time.perf_counter() - t0)
    return out


def window_blocks(torch, cuda: bool, step: Callable[[], object], inner: int, window_open: Callable[[], bool],
                  max_blocks: int) -> list[float]:
    """Blocks of `step` x inner until a shared window closes (gpuvs share): each block is synchronised
    before the host looks at the window, so that the device never runs past it."""
    out: list[float] = []
    prev = None
    if cuda:
        prev = torch.cuda.Event(enable_timing=True)
        prev.record()
    while len(out) < max_blocks and window_open():
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        if cuda:
            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
            mark.synchronize()
            out.append(prev.elapsed_time(mark) / 1e3)
            prev = mark
        else:
            out.append(time.perf_counter() - t0)
    return out


def inner_count(torch, cuda: bool, step: Callable[[], object], target_s: float, max_inner: int = 4096) -> int:
    """How many steps make a block of about target_s (one step at least). As pyperf calibrates its loops, the
    count doubles until the median of three blocks takes a quarter of the target, so that a step of
    microseconds is timed over many steps, not alone (one step's time is mostly timer, launch and first-touch
    noise), and one slow block (a lazy first call, a preempted thread) does not decide it."""
    n = 1
    while True:
        block = statistics.median(timed_blocks(torch, cuda, step, n, 3))
        if block >= target_s / 4 or n >= max_inner:
            break
        n = min(2 * n, max_inner)
    return max(1, min(max_inner, math.ceil(target_s / max(block / n, 1e-9))))


def warm_and_time(torch, cuda: bool, step: Callable[[], object], p: dict, ctx=None):
    """One shape of a block-timed workload (gemm, membw): its warm-up (workloads/_warmup.per_shape: a fixed
    --warmup count, or blocks until steady, with the block's calibration), then its timed blocks, in the shared
    window where the run has a barrier. Returns the blocks' seconds, the steps per block, the warm-up's seconds
    and what an adaptive warm-up decided (None: a fixed count)."""
    from gpuvs.workloads import _warmup

    t0 = time.perf_counter()
    inner, warm = _warmup.per_shape(_warmup.WarmupPlan.from_params(p, "warmup"), step,
                                    lambda: inner_count(torch, cuda, step, p["block_ms"] / 1000.0),
                                    lambda: sync(torch, cuda))
    warm_s = time.perf_counter() - t0
    if ctx is not None and ctx.spec.barrier:
        ctx.start_window()
        return window_blocks(torch, cuda, step, inner, ctx.window_open, p["repeats"]), inner, warm_s, warm
    return timed_blocks(torch, cuda, step, inner, p["repeats"]), inner, warm_s, warm
