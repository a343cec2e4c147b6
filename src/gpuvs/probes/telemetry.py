"""NVML sampler: a background thread reading the worker's GPUs each tick, one telemetry event per GPU per tick.

It reads utilisation, memory, power, clocks, temperature and throttle reasons.
With `health` it also reads each GPU's health (gpu_health.py), sent as one event per GPU when it stops.
Where NVML is absent it says so once and does nothing."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from gpuvs import events

Emit = Callable[[dict[str, Any]], None]

# NVML clocks-event (throttle) reason bits worth naming; idle and application-clock settings are not throttling.
THROTTLE_BITS = {
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal",
    0x0000000000000040: "hw_thermal",
    0x0000000000000080: "hw_power_brake",
    0x0000000000000100: "display_clocks",
}


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def visible_gpu_indices(device: str, num_gpus: int) -> list[int]:
    """NVML indices of the GPUs a spec uses, honouring CUDA_VISIBLE_DEVICES where it holds indices or GPU UUIDs
    (what device plugins hand a pod)."""
    _, _, idx = device.partition(":")
    logical = list(range(int(idx), int(idx) + 1)) if idx else list(range(max(1, num_gpus)))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        parts = [p.strip() for p in visible.split(",") if p.strip()]
        if all(p.isdigit() for p in parts):
            return [int(parts[i]) for i in logical if i < len(parts)]
        if parts and all(p.startswith("GPU-") for p in parts):
            by_uuid = {g["uuid"]: g["index"] for g in _nvml_gpus()}
            if all(p in by_uuid for p in parts):
                return [by_uuid[parts[i]] for i in logical if i < len(parts)]
    return logical


def _nvml_gpus() -> list[dict[str, Any]]:
    from gpuvs.probes import fingerprint

    return fingerprint.nvml_info().get("gpus") or []


class Sampler:
    def __init__(self, indices: list[int], interval_s: float, emit: Emit, health: bool = False, watch=None):
        import pynvml

        from gpuvs.probes import gpu_health

        self.nvml = pynvml
        self.interval_s = max(0.01, interval_s)
        self.emit = emit
        self.watch = watch  # contention.Watch: other processes on these GPUs, read at the same ticks
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices if i < count]
        # renamed in NVML 12.5 (clocks "event" reasons); older bindings only have the throttle name
        self._reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        self.health = {i: gpu_health.HealthReader(pynvml, i, h) for i, h in self.handles} if health else {}
        for reader in self.health.values():
            reader.before()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuvs-telemetry", daemon=True)
        self.t0 = time.perf_counter()

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def read(self, index: int, handle) -> dict[str, Any]:
        """One reading of one GPU; a probe that fails (not supported, lost GPU) reads None."""
        n = self.nvml
        out: dict[str, Any] = {"type": "telemetry", "t": round(time.perf_counter() - self.t0, 4), "gpu": index}
        probes = {
            "util": lambda: n.nvmlDeviceGetUtilizationRates(handle),
            "mem_used_mib": lambda: n.nvmlDeviceGetMemoryInfo(handle).used // (1 << 20),
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM),
            "temp_c": lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU),
            "throttle_mask": lambda: int(self._reasons(handle)),
        }
        for key, probe in probes.items():
            try:
                out[key] = probe()
            except Exception:
                out[key] = None
        util = out.pop("util")
        out["util_gpu"], out["util_mem"] = (util.gpu, util.memory) if util is not None else (None, None)
        out["throttle"] = throttle_names(out["throttle_mask"]) if out["throttle_mask"] is not None else None
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            for index, handle in self.handles:
                reading = self.read(index, handle)
                if index in self.health:
                    self.health[index].tick(reading)
                self.emit(reading)
            if self.watch is not None:
                self.watch.gpu_tick(self.nvml, self.handles)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for index, reader in self.health.items():
            try:
                health = reader.after().to_dict()
            except Exception as exc:  # a GPU lost on the way: its telemetry is kept, its health not
                self.emit(events.log(f"GPU {index} health not read: {exc or type(exc).__name__}"))
                continue
            self.emit({"type": "telemetry", "t": round(time.perf_counter() - self.t0, 4), "gpu": index,
                       "health": health})
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


def start_for(spec, emit: Emit, watch=None) -> Sampler | None:
    """Start sampling the spec's GPUs, or return None (CPU run, telemetry off, or no NVML: said once); `watch`
    (contention.Watch) reads the other GPU processes at its ticks."""
    if not spec.device.startswith("cuda") or not spec.telemetry_interval_s or spec.telemetry_interval_s <= 0:
        return None
    try:
        sampler = Sampler(visible_gpu_indices(spec.device, spec.num_gpus), spec.telemetry_interval_s, emit,
                          health=True, watch=watch)
    except Exception as exc:
        emit(events.log(f"telemetry off: NVML is not available here ({exc or type(exc).__name__})"))
        return None
    return sampler.start()


READINGS = ("util_gpu", "util_mem", "mem_used_mib", "power_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c")


def reasons(reading: dict[str, Any]) -> list[str]:
    """Throttle reasons of one reading: decoded from the raw NVML mask where it was kept, else the names."""
    mask = reading.get("throttle_mask")
    return throttle_names(int(mask)) if mask is not None else list(reading.get("throttle") or [])


def summarize(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and max of each reading (min too for the SM clock), the time covered, every throttle reason
    seen and the fraction of readings that showed it. Takes telemetry events or Store.telemetry() rows (a
    GPU's health among them is no reading: left out)."""
    readings = [r for r in readings if "health" not in r]
    out: dict[str, Any] = {"n": len(readings)}
    times = [r["t"] for r in readings if r.get("t") is not None]
    out["duration_s"] = (max(times) - min(times)) if times else 0.0
    for key in READINGS:
        values = [r[key] for r in readings if r.get(key) is not None]
        if values:
            out[f"{key}_mean"] = sum(values) / len(values)
            out[f"{key}_max"] = max(values)
            if key == "sm_clock_mhz":
                out[f"{key}_min"] = min(values)
    counts: dict[str, int] = {}
    for r in readings:
        for name in reasons(r):
            counts[name] = counts.get(name, 0) + 1
    out["throttle_seen"] = sorted(counts)
    out["throttle_fraction"] = {name: counts[name] / len(readings) for name in sorted(counts)}
    return out


def summarize_by_gpu(readings: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """summarize() per GPU index, in index order."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in readings:
        if "health" not in r:
            groups.setdefault(int(r.get("gpu") or 0), []).append(r)
    return {gpu: summarize(groups[gpu]) for gpu in sorted(groups)}
