"""A start barrier between processes, or containers that mount the same folder, so all measure the same window.

Each worker writes `ready-NAME` once warmed up and waits for `go`.
Once every worker is ready, the coordinator writes `go` with a start time slightly in the future."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuvs.errors import WorkloadError

GO = "go"
STOP = "stop"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def arrive(folder: str, name: str) -> None:
    _atomic_write(Path(folder) / f"ready-{name}", f"{time.time()}\n{os.getpid()}\n")


def wait_go(folder: str, timeout_s: float = 1800.0, poll_s: float = 0.002) -> float:
    """Block until the coordinator says go; then sleep until the agreed start. Returns the start time."""
    go = Path(folder) / GO
    deadline = time.monotonic() + timeout_s
    while not go.exists():
        if time.monotonic() > deadline:
            raise WorkloadError("crash", f"no start signal within {timeout_s:g} s at the barrier in {folder}")
        time.sleep(poll_s)
    start_at = float(go.read_text().split()[0])
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    return start_at


def ready(folder: str) -> list[str]:
    return sorted(p.name.removeprefix("ready-") for p in Path(folder).glob("ready-*"))


def release(folder: str, delay_s: float = 0.25) -> float:
    start_at = time.time() + delay_s
    _atomic_write(Path(folder) / GO, f"{start_at}\n")
    return start_at


def stop(folder: str) -> None:
    """Ask every worker of an open-ended window (a capacity sweep) to end its timed part now."""
    _atomic_write(Path(folder) / STOP, f"{time.time()}\n")


def stopped(folder: str) -> bool:
    return (Path(folder) / STOP).exists()
