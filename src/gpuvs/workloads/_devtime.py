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
