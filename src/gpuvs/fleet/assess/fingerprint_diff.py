"""Fingerprints per node side by side, and the fields where a node differs from the majority.

A node with another driver, GPU model, kernel or node image is flagged even when its speed is not.
A slow node's row names the fields where it differs."""

from __future__ import annotations

from collections import Counter
from typing import Any

# (key, label): keys of the worker's fingerprint (dotted for nested values, a number for a list
# index), and node.* for what the kubelet reports about its node.
FIELDS = (
    ("gpu_name", "GPU"), ("gpu_count", "GPUs"), ("gpus.0.memory_mib", "GPU memory MiB"),
    ("gpus.0.compute_capability", "compute capability"), ("gpus.0.power_limit_w", "power limit W"),
    ("gpus.0.max_sm_clock_mhz", "max SM clock MHz"), ("gpus.0.pcie_gen", "PCIe gen"),
    ("gpus.0.pcie_width", "PCIe width"), ("driver", "NVIDIA driver"),
    ("cuda_driver", "CUDA (driver)"), ("cuda", "CUDA (torch)"), ("torch", "torch"),
    ("cpu_model", "CPU"), ("cpu_usable", "CPUs usable"), ("memory_mib", "memory MiB"),
    ("limits.cpu_limit", "CPU limit"), ("python", "python"), ("gpuvs", "gpuvs"),
    ("node.os_image", "node image"), ("node.kernel", "kernel"), ("node.kubelet", "kubelet"),
    ("node.container_runtime", "container runtime"), ("node.architecture", "architecture"),
)


def get(fp: Any, key: str) -> Any:
    for part in key.split("."):
        if isinstance(fp, dict):
            fp = fp.get(part)
        elif isinstance(fp, list) and part.isdigit() and int(part) < len(fp):
            fp = fp[int(part)]
        else:
            return None
    return fp


def combined(worker: dict[str, Any] | None, system: dict[str, Any] | None) -> dict[str, Any]:
    """A node's fingerprint: what its worker saw, plus the kubelet's node info under `node`."""
    return {**(worker or {}), "node": dict(system or {})}


def majority_differences(fps: dict[str, dict[str, Any]]) -> dict[str, dict[str, tuple[Any, Any]]]:
    """{node: {label: (its value, the majority's value)}} for fields where more than half of the nodes
    that report the field agree and this node does not."""
    out: dict[str, dict[str, tuple[Any, Any]]] = {n: {} for n in fps}
    for key, label in FIELDS:
        values = {n: get(fp, key) for n, fp in fps.items()}
        present = {n: v for n, v in values.items() if v is not None}
        if len(present) < 2:
            continue
        common, count = Counter(repr(v) for v in present.values()).most_common(1)[0]
        if count * 2 <= len(present):
            continue
        majority = next(v for v in present.values() if repr(v) == common)
        for n, v in present.items():
            if repr(v) != common:
                out[n][label] = (v, majority)
    return out


def rows(fps: dict[str, dict[str, Any]]) -> list[tuple[str, list[Any], bool]]:
    """(label, value per node in the order of fps, differs) for the fields any node reports."""
    out = []
    for key, label in FIELDS:
        values = [get(fp, key) for fp in fps.values()]
        if all(v is None for v in values):
            continue
        out.append((label, values, len({repr(v) for v in values}) > 1))
    return out
