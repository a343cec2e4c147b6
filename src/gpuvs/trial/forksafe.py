"""What makes a fork safe: one thread, and CUDA not initialised. Standard library only.

The zygote asks before every trial's fork (zygote.py), a worker before it forks the ranks of a run (multiproc.py)."""

from __future__ import annotations

import ctypes
import os
import sys

CUDA_ERROR_NOT_INITIALIZED = 3


def threads() -> list[str]:
    """The names of this process's threads (the kernel's view: native pools count, not only Python's)."""
    names = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:
            continue
    return names


def cuda_state() -> str:
    """'initialised (...)', 'not initialised', or 'absent' (no CUDA driver here and torch's flag not set)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "initialised (torch)"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "absent"
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    return "not initialised" if rc == CUDA_ERROR_NOT_INITIALIZED else f"initialised (the driver answers {rc})"


def fork_problem(who: str = "the zygote") -> str | None:
    """Why a fork now would not give a clean child, or None (`who`: this process, as the reason names it; the
    worker asks this before it forks the ranks of a run across several GPUs: multiproc.py)."""
    names = threads()
    if len(names) != 1:
        return (f"{who} runs {len(names)} threads ({', '.join(names)}), not 1: a thread pool or the CUDA "
                "driver started in it, and a child forked now could inherit locks held by threads it does not have")
    state = cuda_state()
    if state.startswith("initialised"):
        return f"CUDA is {state} in {who}: a forked child could not use the GPU"
    return None
