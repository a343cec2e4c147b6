"""What went wrong in a worker, from the exception it raised: a kind (input, oom, unavailable,
crash...) and one line that says what to do. Used by the worker and by each rank of a multi-GPU run."""

from __future__ import annotations

import os
import re
import shutil
import sys

from gpuvs.errors import GpuvsError, WorkloadError
from gpuvs.spec import RunSpec


def _oom_message(exc: BaseException, spec: RunSpec) -> str:
    total = ""
    try:
        import torch

        if torch.cuda.is_available():
            total = f"; the GPU has {torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB"
    except Exception:
        pass
    bs = spec.params.get("batch_size")
    at = f" at batch size {bs}" if bs is not None else ""
    return f"out of GPU memory{at}{total}: {str(exc).splitlines()[0][:200]}"


def classify(exc: BaseException, spec: RunSpec) -> tuple[str, str]:
    if isinstance(exc, WorkloadError):
        return exc.kind, exc.message
    if isinstance(exc, GpuvsError):
        return "input", str(exc)
    name = type(exc).__name__
    text = str(exc)
    if SHM_FULL.search(text):
        return "oom", _shm_message(text, spec)
    if "Original Traceback" in text:  # re-raised from a child (DataLoader worker): its last line is the cause
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        where, cause = lines[0].removeprefix("Caught ").rstrip("."), lines[-1]
        kind = "oom" if "out of memory" in cause.lower() or "can't allocate memory" in cause else "crash"
        return kind, f"{name} ({where}): {cause}"
    if name == "OutOfMemoryError" or ("out of memory" in text.lower() and "cuda" in text.lower()):
        return "oom", _oom_message(exc, spec)
    if "can't allocate memory" in text or isinstance(exc, MemoryError):
        bs = spec.params.get("batch_size")
        return "oom", (f"out of host memory" + (f" at batch size {bs}" if bs is not None else "")
                       + f" on {spec.device}: {text.splitlines()[0][:200] if text else name}")
    if isinstance(exc, ImportError):
        return "unavailable", f"{exc} (python {sys.version.split()[0]} at {sys.executable})"
    return "crash", f"{name}: {text}".strip()


# how PyTorch says that /dev/shm is full: a batch that a DataLoader worker cannot put in shared memory, or
# the worker killed by SIGBUS when a page of it cannot be backed
SHM_FULL = re.compile(r"unable to allocate shared memory|out of shared memory|"
                      r"</torch_[^>]*>: No space left on device|killed by signal: Bus error", re.IGNORECASE)


def _shm_message(text: str, spec: RunSpec) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines) if SHM_FULL.search(ln)), lines[-1])
    try:
        shm = f"{shutil.disk_usage('/dev/shm').total / 2**20:.0f} MiB"
    except OSError:
        shm = "size unknown"
    workers = spec.params.get("workers")
    fix = ("raise --shm-size (1g or more)" if os.environ.get("GPUVS_CONTAINER_IMAGE") else
           "free or enlarge /dev/shm")
    return (f"out of shared memory (/dev/shm: {shm}) in the DataLoader workers"
            + (f" ({workers} workers, batch size {spec.params.get('batch_size')})" if workers else "")
            + f": {fix} or lower --workers or --batch-size; {cause}")
