"""A GPU's health over one trial, read through NVML before, during and after it (GpuHealth).

PCIe link, clocks, throttle reasons, power limit, temperature, ECC, row remapping, XIDs and other processes.
A field NVML does not support here, or that cannot be told, is None: never guessed.
HealthReader reads, driven by telemetry.Sampler's thread; from_telemetry() reads it back, merge() folds trials."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

PROCESS_POLL_S = 0.5  # how often the processes on the GPU and their utilisation are read


@dataclass
class GpuHealth:
    gpu: int | None = None  # the NVML index
    uuid: str | None = None
    # the PCIe link: the best generation and width it reached during the trial (a link may step down while idle),
    # the most the GPU and its slot support together (GetMaxPcieLink*), the most the GPU supports alone
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_gen_gpu_max: int | None = None
    sm_clock_mean_mhz: float | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mean_mhz: float | None = None
    mem_clock_max_mhz: int | None = None
    readings: int = 0  # NVML readings the means and shares are over
    throttle: dict[str, float] = field(default_factory=dict)  # clock-event reason -> share of readings showing it
    power_limit_w: float | None = None
    power_default_w: float | None = None
    temp_max_c: float | None = None
    temp_slowdown_c: int | None = None
    ecc_uncorrected: int | None = None  # volatile (since the driver loaded), after the trial
    ecc_uncorrected_before: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    xid: list[int] | None = None  # XID critical errors during the trial; None: events not supported here
    processes: int | None = None  # distinct compute processes seen on the GPU (the worker's own included)
    other_pids: list[int] | None = None  # None: which process is the worker's own cannot be told here
    other_util_pct: float | None = None  # mean SM utilisation of the other processes over the polls
    other_mem_mib: float | None = None  # the most GPU memory they held
    polls: int = 0  # process polls other_util_pct is over

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuHealth:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def from_telemetry(readings: Iterable[Any]) -> list[GpuHealth]:
    """The GpuHealth records among a trial's telemetry (TelemetryRecord or its to_dict()), in GPU order;
    none in stores of earlier versions and in CPU trials."""
    out = []
    for r in readings:
        data = r.to_dict() if hasattr(r, "to_dict") else r
        if isinstance(data.get("health"), Mapping):
            out.append(GpuHealth.from_dict(data["health"]))
    return sorted(out, key=lambda h: (h.gpu is None, h.gpu or 0))


def without_health(readings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The telemetry readings proper (what summaries and charts are made of)."""
    return [r for r in readings if "health" not in r]


def _first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _agg(fn, values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return fn(known) if known else None


def _weighted(pairs: list[tuple[float | None, int]]) -> float | None:
    known = [(v, n) for v, n in pairs if v is not None and n > 0]
    total = sum(n for _, n in known)
    return sum(v * n for v, n in known) / total if total else None


def merge(records: list[GpuHealth]) -> GpuHealth:
    """One GPU's health over several trials: the worst link any trial reached, means and shares weighted by their
    readings, the lowest power limit, the highest temperature and counters, every XID and other process."""
    if len(records) == 1:
        return records[0]
    n = sum(r.readings for r in records)
    throttle: dict[str, float] = {}
    if n:
        for name in sorted({k for r in records for k in r.throttle}):
            throttle[name] = sum(r.throttle.get(name, 0.0) * r.readings for r in records) / n
    pids = [r.other_pids for r in records if r.other_pids is not None]
    xids = [r.xid for r in records if r.xid is not None]
    return GpuHealth(
        gpu=_first(r.gpu for r in records), uuid=_first(r.uuid for r in records),
        pcie_gen=_agg(min, (r.pcie_gen for r in records)), pcie_width=_agg(min, (r.pcie_width for r in records)),
        pcie_gen_max=_first(r.pcie_gen_max for r in records), pcie_width_max=_first(r.pcie_width_max for r in records),
        pcie_gen_gpu_max=_first(r.pcie_gen_gpu_max for r in records),
        sm_clock_mean_mhz=_weighted([(r.sm_clock_mean_mhz, r.readings) for r in records]),
        sm_clock_max_mhz=_first(r.sm_clock_max_mhz for r in records),
        mem_clock_mean_mhz=_weighted([(r.mem_clock_mean_mhz, r.readings) for r in records]),
        mem_clock_max_mhz=_first(r.mem_clock_max_mhz for r in records),
        readings=n, throttle=throttle,
        power_limit_w=_agg(min, (r.power_limit_w for r in records)),
        power_default_w=_first(r.power_default_w for r in records),
        temp_max_c=_agg(max, (r.temp_max_c for r in records)),
        temp_slowdown_c=_first(r.temp_slowdown_c for r in records),
        ecc_uncorrected=_agg(max, (r.ecc_uncorrected for r in records)),
        ecc_uncorrected_before=_agg(min, (r.ecc_uncorrected_before for r in records)),
        remapped_correctable=_agg(max, (r.remapped_correctable for r in records)),
        remapped_uncorrectable=_agg(max, (r.remapped_uncorrectable for r in records)),
        remap_pending=_agg(any, (r.remap_pending for r in records)),
        remap_failed=_agg(any, (r.remap_failed for r in records)),
        xid=sorted({x for xs in xids for x in xs}) if xids else None,
        processes=_agg(max, (r.processes for r in records)),
        other_pids=sorted({p for ps in pids for p in ps}) if pids else None,
        other_util_pct=_weighted([(r.other_util_pct, r.polls) for r in records]),
        other_mem_mib=_agg(max, (r.other_mem_mib for r in records)),
        polls=sum(r.polls for r in records))


# -- reading it through NVML (only on a GPU) ---------------------------------------------------------

def descends_from(pid: int, ancestor: int) -> bool | None:
    """Whether pid is ancestor or one of its descendants, as this process's /proc shows it; None where pid is not
    in it (another pid namespace: a container's or a pod's)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None if seen == 0 else False
        seen += 1
    return pid == ancestor


class HealthReader:
    """One GPU's readings over one trial. Every NVML call that fails (not supported, no permission) leaves its
    field None; the XID event set is polled without blocking."""

    def __init__(self, nvml, index: int, handle, own_pid: int | None = None):
        self.n, self.index, self.handle = nvml, index, handle
        self.own_pid = own_pid if own_pid is not None else os.getpid()
        self.h = GpuHealth(gpu=index)
        self._sm: list[float] = []
        self._mem: list[float] = []
        self._temps: list[float] = []
        self._throttle: dict[str, int] = {}
        self._events = None
        self._last_poll = 0.0
        self._last_stamp = 0
        self._pids: set[int] = set()
        self._own_seen = False
        self._unknown = False  # a pid not in this process's /proc: which one is ours cannot be told
        self._others: dict[int, float] = {}  # pid -> most memory held (MiB)
        self._other_util: list[float] = []

    def _call(self, name: str, *args):
        try:
            return getattr(self.n, name)(self.handle, *args)
        except Exception:
            return None

    def before(self) -> None:
        n, h = self.n, self.h
        uuid = self._call("nvmlDeviceGetUUID")
        h.uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        h.pcie_gen_max = self._call("nvmlDeviceGetMaxPcieLinkGeneration")
        h.pcie_width_max = self._call("nvmlDeviceGetMaxPcieLinkWidth")
        h.pcie_gen_gpu_max = self._call("nvmlDeviceGetGpuMaxPcieLinkGeneration")
        h.sm_clock_max_mhz = self._call("nvmlDeviceGetMaxClockInfo", n.NVML_CLOCK_SM)
        h.mem_clock_max_mhz = self._call("nvmlDeviceGetMaxClockInfo", n.NVML_CLOCK_MEM)
        default = self._call("nvmlDeviceGetPowerManagementDefaultLimit")
        h.power_default_w = default / 1000.0 if default is not None else None
        h.temp_slowdown_c = self._call("nvmlDeviceGetTemperatureThreshold", n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        h.ecc_uncorrected_before = self._ecc()
        try:
            events = n.nvmlEventSetCreate()
            try:
                n.nvmlDeviceRegisterEvents(self.handle, n.nvmlEventTypeXidCriticalError, events)
            except Exception:
                n.nvmlEventSetFree(events)
                raise
            self._events, h.xid = events, []
        except Exception:  # not supported (a vGPU, MIG, an old driver): xid stays None
            self._events = None
        self.poll(force=True)

    def _ecc(self) -> int | None:
        n = self.n
        return self._call("nvmlDeviceGetTotalEccErrors", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)

    def tick(self, reading: Mapping[str, Any]) -> None:
        """One of the sampler's readings (clocks, temperature, throttle reasons), plus the link and, every
        PROCESS_POLL_S, the processes; any XID that arrived."""
        self.h.readings += 1
        for key, into in (("sm_clock_mhz", self._sm), ("mem_clock_mhz", self._mem), ("temp_c", self._temps)):
            if reading.get(key) is not None:
                into.append(float(reading[key]))
        for name in reading.get("throttle") or []:  # telemetry.Sampler.read's names of its throttle mask
            self._throttle[name] = self._throttle.get(name, 0) + 1
        gen, width = self._call("nvmlDeviceGetCurrPcieLinkGeneration"), self._call("nvmlDeviceGetCurrPcieLinkWidth")
        if gen is not None:
            self.h.pcie_gen = max(gen, self.h.pcie_gen or 0)
        if width is not None:
            self.h.pcie_width = max(width, self.h.pcie_width or 0)
        self._xids()
        self.poll()

    def _xids(self) -> None:
        if self._events is None:
            return
        while True:
            try:
                data = self.n.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # a timeout: nothing waiting
                return
            if int(data.eventType) & self.n.nvmlEventTypeXidCriticalError:
                self.h.xid = sorted(set(self.h.xid or []) | {int(data.eventData)})

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_poll < PROCESS_POLL_S:
            return
        self._last_poll = now
        procs = self._call("nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return
        first = self.h.polls == 0 and self._last_stamp == 0
        others: set[int] = set()
        for p in procs:
            pid = int(p.pid)
            self._pids.add(pid)
            ours = descends_from(pid, self.own_pid)
            if ours:
                self._own_seen = True
            elif ours is None:
                self._unknown = True
            else:
                others.add(pid)
            if not ours:
                mem = getattr(p, "usedGpuMemory", None)
                mib = mem / (1 << 20) if isinstance(mem, int) and mem < (1 << 62) else 0.0
                self._others[pid] = max(self._others.get(pid, 0.0), mib)
        try:
            samples = self.n.nvmlDeviceGetProcessUtilization(self.handle, self._last_stamp)
        except self.n.NVMLError_NotSupported:
            self._other_util = []
            self.h.polls = -1  # not supported: other_util_pct stays None
            return
        except Exception:  # NotFound: no process used the GPU since the last poll
            samples = []
        if self.h.polls < 0:
            return
        self._last_stamp = max([self._last_stamp] + [int(s.timeStamp) for s in samples])
        if first:  # the first read returns what the driver buffered before the trial: only its timestamp counts
            return
        per_pid: dict[int, list[float]] = {}
        for s in samples:
            per_pid.setdefault(int(s.pid), []).append(float(s.smUtil))
        other = 0.0
        for pid, values in per_pid.items():
            ours = descends_from(pid, self.own_pid)
            if ours is None and pid not in others:
                self._unknown = True
            if not ours:
                other += sum(values) / len(values)
        self._other_util.append(min(100.0, other))
        self.h.polls += 1

    def after(self) -> GpuHealth:
        n, h = self.n, self.h
        self.tick({})
        h.readings -= 1  # the closing tick reads the link, processes and XIDs only
        limit = self._call("nvmlDeviceGetPowerManagementLimit")
        h.power_limit_w = limit / 1000.0 if limit is not None else None
        h.ecc_uncorrected = self._ecc()
        rows = self._call("nvmlDeviceGetRemappedRows")
        if rows is not None:
            h.remapped_correctable, h.remapped_uncorrectable = int(rows[0]), int(rows[1])
            h.remap_pending, h.remap_failed = bool(rows[2]), bool(rows[3])
        h.sm_clock_mean_mhz = sum(self._sm) / len(self._sm) if self._sm else None
        h.mem_clock_mean_mhz = sum(self._mem) / len(self._mem) if self._mem else None
        h.temp_max_c = max(self._temps) if self._temps else None
        h.throttle = {k: self._throttle[k] / h.readings for k in sorted(self._throttle)} if h.readings else {}
        h.processes = len(self._pids)
        if self._unknown and not self._own_seen:  # the GPU's processes are in another pid namespace
            h.other_pids = h.other_util_pct = h.other_mem_mib = None
        else:
            h.other_pids = sorted(self._others)
            h.other_mem_mib = max(self._others.values()) if self._others else None
            h.other_util_pct = (sum(self._other_util) / len(self._other_util)
                                if self._other_util and h.polls > 0 else None)
        h.polls = max(h.polls, 0)
        if self._events is not None:
            try:
                n.nvmlEventSetFree(self._events)
            except Exception:
                pass
            self._events = None
        return h
