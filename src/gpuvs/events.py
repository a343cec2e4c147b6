"""The worker protocol: one JSON object per line, each with a "type" (TYPES; the fields of each are below)."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

# type         fields                                what it is
# config       {"items": {...}}                      the run's configuration block
# fingerprint  {"data": {...}}                       where it ran (probes/fingerprint.py)
# startup      {"name", "seconds"}                   a first-call cost, never mixed into throughput
# sample       {"series", "step", "value", "unit", "seconds", "items", "extra"}
# metric       {"name", "value", "unit"}             a scalar result (final loss, p99 latency...)
# telemetry    {"t", "gpu", ...}                     one NVML reading
# summary      {"data": {series: {...}},             the worker's own summary of its samples, and how many sample
#               "samples": N}                        events it sent (a runner that got fewer fails the trial)
# error        {"kind", "message"}                   kind: oom | input | unavailable | crash
# log          {"message"}                           free text shown to the user
# contention   {"data": {...}}                       what competed with the trial (probes/contention.py), at its end
# output       {"stream", "text", "bytes", "lines", "cut"}   a command's own output on one stream, capped (its first
#                                                    and last bytes; `cut` bytes left out between them)
TYPES = ("config", "fingerprint", "startup", "sample", "metric", "telemetry", "summary", "error", "log", "output",
         "contention")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def sample(step: int, value: float, unit: str, *, series: str = "main", seconds: float | None = None,
           items: float | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "sample", "series": series, "step": int(step), "value": _clean(float(value)), "unit": unit,
            "seconds": seconds, "items": items, "extra": {k: _clean(v) for k, v in extra.items()}}


# a startup item that is not a start-up milestone: the seconds of every timed block of a workload that times
# several series one after another (gemm's shapes, membw's sizes, collective's sizes, gpu-check's figures,
# kernels' apps), where the headline series alone is not all that was measured; "where the time went" counts it
# as measured (analysis/timeshare.py)
TIMED_S = "timed_s"


def milestones(startup: Mapping[str, float]) -> dict[str, float]:
    """A trial's start-up items as start-up is shown (the start-up tables and chart): all but TIMED_S, which is
    measured time."""
    return {k: v for k, v in startup.items() if k != TIMED_S}


def in_time_order(startups: Iterable[Mapping[str, float]]) -> list[str]:
    """The start-up items of several arms (or trials) in the order they happen: by their mean seconds over
    those that have them, earliest first (a tie by name), as a timeline is read; never alphabetically."""
    seen: dict[str, list[float]] = {}
    for startup in startups:
        for k, v in startup.items():
            seen.setdefault(k, []).append(float(v))
    return sorted(seen, key=lambda k: (sum(seen[k]) / len(seen[k]), k))


def startup(name: str, seconds: float) -> dict[str, Any]:
    return {"type": "startup", "name": name, "seconds": float(seconds)}


def metric(name: str, value: float, unit: str = "") -> dict[str, Any]:
    return {"type": "metric", "name": name, "value": _clean(float(value)), "unit": unit}


def config(**items: Any) -> dict[str, Any]:
    return {"type": "config", "items": items}


def log(message: str) -> dict[str, Any]:
    return {"type": "log", "message": message}


def error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "kind": kind, "message": message}


def output(stream: str, text: str, total_bytes: int, lines: int, cut: int) -> dict[str, Any]:
    return {"type": "output", "stream": stream, "text": text, "bytes": int(total_bytes), "lines": int(lines),
            "cut": int(cut)}


def encode(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), default=str)


def decode(line: str) -> dict[str, Any] | None:
    """A protocol line, or None for anything else (a stray print from a library)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("type") not in TYPES:
        return None
    return event
