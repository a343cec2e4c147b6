"""The MPS settings people set per client, as arms of a sharing study.

The share of the SMs a client may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), and its pinned device memory limit.
The client reads both when it connects, so each worker gets them in its own environment."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuvs.errors import UsageError

SIZE = re.compile(r"^\d+(\.\d+)?[MG]$")


@dataclass
class ShareArm:
    """One way of running the jobs together: time-sliced, or MPS with per-worker client settings."""

    label: str
    mps: bool
    client_env: list[dict[str, str]] = field(default_factory=list)  # per worker; empty: none


def _split(text: str, workers: int, what: str, example: str) -> list[str]:
    parts = text.split(":")
    if len(parts) == 1:
        return parts * workers
    if len(parts) != workers:
        raise UsageError(f"{what}: {text!r} names {len(parts)} clients but the run has {workers} jobs; "
                         f"give one value for all or one per job, e.g. {example}")
    return parts


def thread_arms(text: str | None, workers: int) -> list[ShareArm]:
    arms = []
    for item in [x.strip() for x in (text or "").split(",") if x.strip()]:
        values = _split(item, workers, "--mps-threads", "50 or 30:70")
        if not all(v.isdigit() and 1 <= int(v) <= 100 for v in values):
            raise UsageError(f"--mps-threads: {item!r}: each value is a whole percentage from 1 to 100, e.g. 50 or 30:70")
        arms.append(ShareArm(f"MPS, threads {item}%", True,
                             [{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": v} for v in values]))
    return arms


def memory_arm(text: str | None, workers: int, device_ordinal: int) -> list[ShareArm]:
    if not text:
        return []
    values = _split(text.strip(), workers, "--mps-mem-limit", "4G or 2G:40G")
    if not all(SIZE.match(v) for v in values):
        raise UsageError(f"--mps-mem-limit: {text!r}: each value is a size in M or G, e.g. 512M or 4G (or 2G:40G)")
    return [ShareArm(f"MPS, memory limit {text}", True,
                     [{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device_ordinal}={v}"} for v in values])]


def device_ordinal(device: str) -> int:
    """The CUDA ordinal a client sees for gpuvs's --device (cuda -> 0, cuda:N -> N)."""
    return int(device.split(":", 1)[1]) if ":" in device else 0


def arms(mps_choice: str, threads: str | None, mem_limit: str | None, workers: int, device: str) -> list[ShareArm]:
    """Time-sliced and/or plain MPS (--mps), then one MPS arm per thread setting and one for the memory limit."""
    out = []
    if mps_choice in ("off", "both"):
        out.append(ShareArm("time-sliced", False))
    if mps_choice in ("on", "both"):
        out.append(ShareArm("MPS", True))
    extra = thread_arms(threads, workers) + memory_arm(mem_limit, workers, device_ordinal(device))
    if extra and not device.startswith("cuda"):
        raise UsageError("--mps-threads and --mps-mem-limit are MPS settings: they need a GPU run (--device cuda)")
    return out + extra
