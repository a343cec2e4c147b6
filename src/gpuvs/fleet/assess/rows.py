"""A fleet's rows from what its trials gave: figures from the verdict, each GPU's health, the host-to-device bandwidth.

They are sorted slowest first.
Shared by the node fleet (fleet/execute/fleet_run.py) and the per-GPU one (fleet/execute/pergpu.py)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpuvs.fleet.result import NodeRow
from gpuvs.probes import gpu_health
from gpuvs.probes.gpu_health import GpuHealth


def fill_row(row: NodeRow, v, higher: bool, figures: list[float]) -> None:
    """A row's figures from its verdict (a node's, or a GPU's with --per-gpu)."""
    row.verdict, row.reason, row.mean, row.reference = v.verdict, v.reason, v.mean, list(v.reference)
    row.ratio, row.ci_low, row.ci_high, row.speed = v.ratio, v.ci_low, v.ci_high, v.speed
    if v.ci_low is not None and v.ci_high is not None:
        row.speed_low, row.speed_high = ((v.ci_low, v.ci_high) if higher else (1 / v.ci_high, 1 / v.ci_low))
    row.p_adjusted = v.p_equivalent_adj if v.verdict == "equivalent" else v.p_different_adj  # within-margin: the difference's
    if v.log_ratio is not None:  # log(speed): the sign of a rate's log ratio, the other way for a time
        row.log_speed, row.se, row.df = (v.log_ratio if higher else -v.log_ratio), v.se, v.df
    if len(figures) >= 2 and v.mean:
        row.level_se = statistics.stdev(figures) / v.mean / math.sqrt(len(figures))
    if v.verdict == "reference":
        row.speed = row.ratio = 1.0


def node_health(trials: list[Any]) -> list[GpuHealth]:
    """Each GPU's health over a node's trials (what their telemetry carries), merged trial over trial."""
    by_gpu: dict[Any, list[GpuHealth]] = {}
    for r in trials:
        # the history tests' stand-in results (tests/fleet_store.py) have no telemetry
        for h in gpu_health.from_telemetry(getattr(r, "telemetry", None) or []):
            by_gpu.setdefault(h.gpu, []).append(h)
    return [gpu_health.merge(by_gpu[g]) for g in sorted(by_gpu, key=lambda g: (g is None, g or 0))]


def host_to_device(trials: list[Any]) -> float | None:
    """The mean host-to-device bandwidth of a node's trials where the workload measures it (gpu-check's and
    membw's h2d series, GB/s), else None."""
    values = []
    for r in trials:
        summary = getattr(r, "summary", None) or {}  # the history tests' stand-in results have none
        s = next((s for name, s in summary.items() if name.startswith("h2d") and s.unit == "GB/s"), None)
        if s is not None and s.value is not None:
            values.append(s.value)
    return sum(values) / len(values) if values else None


def sort_rows(rows: list[NodeRow]) -> list[NodeRow]:
    """Slowest first; nodes without a figure (failed, excluded) last."""
    return sorted(rows, key=lambda r: (r.speed is None, r.speed if r.speed is not None else 0.0, r.node))
