"""What competes with a trial on its machine: load, CPU pressure (PSI) or steal, usable CPUs, other GPU processes.

The worker reads them at the trial's start and end (GPU processes at every tick) and sends a `contention` event.
`busy` is the rule that calls a trial contended; `now` is what `gpuvs doctor` reads of the machine.
Standard library only (pynvml where there)."""

from __future__ import annotations

import os
import time
from typing import Any

from gpuvs.probes.gpu_health import descends_from

# The rule (docs/trials.md says it too): contended where the 1-minute load is above the usable CPUs, where some
# runnable task waited for a CPU during more than PRESSURE_LIMIT of the trial's time (PSI "some"), where the
# hypervisor took more than STEAL_LIMIT of the CPU time, or where another process computed on the trial's GPU.
PRESSURE_LIMIT = 0.20
STEAL_LIMIT = 0.05
GPU_EVERY_S = 1.0  # how often the other GPU processes are read while telemetry runs (a few µs of NVML each)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def load1() -> float | None:
    text = _read("/proc/loadavg")
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def pressure() -> tuple[float | None, int | None]:
    """The system's CPU pressure: (some avg10 as a share, some total in µs); (None, None) without PSI."""
    text = _read("/proc/pressure/cpu")
    for line in (text or "").splitlines():
        if line.startswith("some "):
            fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
            try:
                return float(fields["avg10"]) / 100, int(fields["total"])
            except (KeyError, ValueError):
                break
    return None, None


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat."""
    text = _read("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    try:
        values = [int(v) for v in text.splitlines()[0].split()[1:]]
    except ValueError:
        return None
    # guest and guest_nice are already counted in user and nice
    return (values[7] if len(values) > 7 else 0), sum(values[:8])


def usable_cpus(root: str = "/sys/fs/cgroup") -> tuple[float | None, int | None]:
    """(the CPUs this process may use: its affinity, lowered to a cgroup v2 CPU quota where one is set, the CPUs
    online)."""
    try:
        usable: float | None = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        usable = float(os.cpu_count() or 0) or None
    quota, _, period = (_read(f"{root}/cpu.max") or "max").strip().partition(" ")
    if quota != "max" and usable is not None:
        try:
            usable = min(usable, round(int(quota) / int(period or 100000), 2))
        except ValueError:
            pass
    return usable, os.cpu_count()


def busy(load: float | None, usable: float | None, cpu_pressure: float | None, steal: float | None,
         gpu_others: int = 0) -> list[str]:
    """What makes a trial (or the machine now) contended, by the rule above: 'load', 'cpu pressure', 'steal',
    'gpu process'; none where it was not."""
    out = []
    if load is not None and usable and load > usable:
        out.append("load")
    if cpu_pressure is not None and cpu_pressure > PRESSURE_LIMIT:
        out.append("cpu pressure")
    if steal is not None and steal > STEAL_LIMIT:
        out.append("steal")
    if gpu_others:
        out.append("gpu process")
    return out


def rule_text() -> str:
    return (f"contended: a 1-minute load above the usable CPUs, CPU pressure (PSI some) above "
            f"{100 * PRESSURE_LIMIT:g}% of the trial's time, steal above {100 * STEAL_LIMIT:g}%, or another process "
            "on the trial's GPU")


LOADED_UTIL = 50  # a telemetry reading counts as under load from this GPU utilisation (%) on
SLOWDOWNS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def clocks(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """From a trial's NVML readings (telemetry events): the lowest and highest SM clock under load (MHz; None without
    such a reading) and the slowdown reasons seen (thermal, hardware, power brake; a power cap under load is none)."""
    from gpuvs.probes import telemetry

    loaded = [float(r["sm_clock_mhz"]) for r in readings
              if "health" not in r and (r.get("util_gpu") or 0) >= LOADED_UTIL and r.get("sm_clock_mhz")]
    seen = sorted({name for r in readings if "health" not in r for name in telemetry.reasons(r) if name in SLOWDOWNS})
    return {"sm_clock_loaded": [min(loaded), max(loaded)] if loaded else None, "slowdowns": seen}


def _stat(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of a process, where /proc shows it."""
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    try:
        return name, int(text[text.rindex(")") + 2:].split()[1])
    except (IndexError, ValueError):
        return None


def is_own(pid: int, root: int) -> bool:
    """Whether `pid` is `root` or runs under it (its ranks, the job a command workload started)."""
    return descends_from(pid, root) is True


def gpu_processes(nvml, handles: list[tuple[int, Any]], root: int, before: set[int] | None = None
                  ) -> dict[int, dict[str, Any]]:
    """The compute processes on these GPUs that are not `root`'s own: pid -> {pid, name, gpu, mem_mib, visible}.
    A pid this process cannot see (a PID namespace) counts only where it was there before the trial (`before`
    None: it is that reading): the trial's own processes are among the unseen ones."""
    out: dict[int, dict[str, Any]] = {}
    for index, handle in handles:
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:  # not supported, a GPU lost: nothing known
            continue
        for p in procs:
            pid = int(p.pid)
            stat = _stat(pid)
            if stat is None and before is not None and pid not in before:
                continue
            if stat is not None and is_own(pid, root):
                continue
            mem = getattr(p, "usedGpuMemory", None)
            out[pid] = {"pid": pid, "name": stat[0] if stat else None, "gpu": index, "visible": stat is not None,
                        "mem_mib": int(mem) // (1 << 20) if isinstance(mem, int) and mem >= 0 else None}
    return out


class Watch:
    """One trial's readings: at its start (`Watch(spec)`), at telemetry ticks (gpu_tick), at its end (finish)."""

    def __init__(self, device: str, gpu_indices=None, open_now: bool = True):
        """open_now: read the GPU's processes now (before the trial's own CUDA work, so that a pid hidden by a PID
        namespace seen now is another's); False where the worker forks ranks later and must reach the fork with
        nothing of NVML open: the GPU is then read at telemetry ticks and at the end. gpu_indices: the NVML indices
        of the trial's GPUs, or a function that gives them (called when NVML is opened)."""
        self.t0 = time.monotonic()
        self.root = os.getpid()
        self.load_start = load1()
        self.pressure0 = pressure()[1]
        self.times0 = cpu_times()
        self.usable, self.online = usable_cpus()
        self.others: dict[int, dict[str, Any]] = {}
        self.gpu_checked = False
        self.before: set[int] | None = None
        self._last_tick = 0.0
        self._nvml = None
        self._handles: list[tuple[int, Any]] = []
        self._indices = gpu_indices if device.startswith("cuda") and gpu_indices else None
        if open_now and self._indices:
            self._open()
            if self._nvml is not None:
                first = gpu_processes(self._nvml, self._handles, self.root)
                self.before = set(first)
                self.others.update(first)

    def _open(self) -> None:
        try:
            import pynvml

            if callable(self._indices):
                self._indices = list(self._indices())
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in self._indices if i < count]
            self._nvml = pynvml
            self.gpu_checked = True
        except Exception:  # no NVML here: the record says the GPU was not checked
            self._nvml = None

    def gpu_tick(self, nvml=None, handles=None) -> None:
        """Read the other GPU processes, at most every GPU_EVERY_S (the telemetry sampler calls it each tick)."""
        now = time.monotonic()
        if now - self._last_tick < GPU_EVERY_S or not (self._nvml or nvml):
            return
        self._last_tick = now
        self.gpu_checked = True
        self.others.update(gpu_processes(nvml or self._nvml, handles or self._handles, self.root,
                                         set() if self.before is None else self.before))

    def finish(self) -> dict[str, Any]:
        """The trial's record (store.records.ContentionRecord's keys)."""
        if self._nvml is None and self._indices:
            self._open()
        if self._nvml is not None:
            self._last_tick = 0.0
            self.gpu_tick()
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
        seconds = time.monotonic() - self.t0
        total1 = pressure()
        share = None
        if self.pressure0 is not None and total1[1] is not None and seconds > 0:
            share = round(min(1.0, max(0.0, (total1[1] - self.pressure0) / 1e6 / seconds)), 4)
        steal = None
        times1 = cpu_times()
        if self.times0 and times1 and times1[1] > self.times0[1]:
            steal = round((times1[0] - self.times0[0]) / (times1[1] - self.times0[1]), 4)
        return {"seconds": round(seconds, 3), "load_start": self.load_start, "load_end": load1(),
                "cpus_usable": self.usable, "cpus_online": self.online, "cpu_pressure": share,
                "cpu_pressure_avg10": total1[0], "steal": steal, "gpu_checked": self.gpu_checked,
                "gpu_processes": sorted(self.others.values(), key=lambda p: p["pid"])}


def now(gpu_indices: list[int] | None = None) -> dict[str, Any]:
    """The machine as it is now, for `gpuvs doctor`: load, CPU pressure (avg10), usable CPUs, the CPU frequency
    governor where readable, and every compute process on the GPUs (none is this one's)."""
    usable, online = usable_cpus()
    governors = sorted({(g or "").strip() for g in (_read(f"/sys/devices/system/cpu/cpu{i}/cpufreq/scaling_governor")
                                                     for i in range(online or 0)) if g})
    out: dict[str, Any] = {"load": load1(), "cpu_pressure_avg10": pressure()[0], "cpus_usable": usable,
                           "cpus_online": online, "governors": governors, "gpu_processes": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return out
    try:
        count = pynvml.nvmlDeviceGetCount()
        indices = range(count) if gpu_indices is None else [i for i in gpu_indices if i < count]
        handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        out["gpu_processes"] = sorted(gpu_processes(pynvml, handles, os.getpid()).values(), key=lambda p: p["pid"])
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out
