"""A checkup of an environment (what `gpuvs doctor` shows): rows of check, status and detail, where a
failed row's detail says what to do about it. Environments add their own rows (Environment.doctor);
`probe_checks` reads what `python -m gpuvs.trial.inside --probe` reported from inside."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuvs.spec import RunSpec, device_kind

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Check:
    check: str
    status: str  # ok | warn | FAIL
    detail: str


@dataclass
class Report:
    rows: list[Check] = field(default_factory=list)

    def add(self, check: str, status: str, detail: str) -> None:
        self.rows.append(Check(check, status, detail))

    @property
    def problems(self) -> list[Check]:
        return [r for r in self.rows if r.status == FAIL]


@dataclass
class ProbeRun:
    """What a started `python -m gpuvs.trial.inside --probe` gave: its JSON (None if it gave none), the error
    events seen, its exit status, and whether it ran past the time allowed."""

    probe: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    code: int | None = None
    timed_out: bool = False


def read_probe(launched, timeout: float) -> ProbeRun:
    """Read a launched probe to its end (or `timeout` seconds), then stop whatever is left of it."""
    import json
    import time

    out = ProbeRun()
    try:
        for line in launched.read(time.monotonic() + timeout):
            if line.startswith("{") and '"python"' in line:
                out.probe = json.loads(line)
            elif line.startswith("{") and '"error"' in line:
                out.errors.append(str(json.loads(line).get("message", line)))
        out.code = launched.wait(timeout=30)
    except TimeoutError:
        out.timed_out = True
    finally:
        launched.stop()
    return out


def probe_checks(probe: dict[str, Any], spec: RunSpec, report: Report) -> None:
    """Rows from a probe taken inside the environment: Python modules, the GPU, limits as seen inside."""
    mods = probe.get("modules") or {}
    errors = probe.get("module_errors") or {}
    report.add("numpy", OK if mods.get("numpy") else FAIL,
               mods.get("numpy") or f"missing (gpuvs's worker needs it): {errors.get('numpy', '')}")
    broken = set(probe.get("modules_broken") or [])
    for name in ("torch", "torchvision"):
        if name in broken:  # installed, but it cannot be loaded: every workload that needs it would fail
            report.add(name, FAIL, f"installed but cannot be loaded ({errors.get(name, '')}); "
                       + _fix(name, mods.get("torch")))
            continue
        report.add(name, OK if mods.get(name) else WARN,
                   mods.get(name) or f"missing: the cnn and startup workloads need it ({errors.get(name, '')})")
    report.add("nvidia-ml-py", OK if mods.get("pynvml") else WARN,
               mods.get("pynvml") or "missing: no GPU telemetry or NVML fingerprint")
    gpu = probe.get("gpu") or {}
    cuda = device_kind(spec.device) == "cuda"
    if not cuda:
        report.add("GPU inside", OK, f"not asked (device {spec.device}); device nodes seen: "
                   f"{', '.join(gpu.get('nodes') or []) or 'none'}")
    elif gpu.get("ok"):
        detail = f"{gpu.get('count')} GPU(s): {', '.join(gpu.get('names') or [])}"
        if "torch_cuda" in gpu:
            detail += f"; torch.cuda.is_available() = {gpu['torch_cuda']}"
        report.add("GPU inside", OK if gpu.get("torch_cuda", True) else FAIL, detail)
        if gpu.get("nvidia_smi"):
            report.add("nvidia-smi inside", OK, gpu["nvidia_smi"].splitlines()[0])
    else:
        report.add("GPU inside", FAIL, gpu.get("problem", "not visible"))
    limits = probe.get("limits") or {}
    rl = probe.get("rlimits") or {}
    report.add("limits inside", OK,
               f"cgroup {limits.get('cgroup')}, CPU limit {limits.get('cpu_limit') or 'none'}, memory limit "
               f"{str(limits['memory_limit_mib']) + ' MiB' if limits.get('memory_limit_mib') else 'none'}, /dev/shm "
               f"{limits.get('shm_mib')} MiB, ulimits " + ", ".join(f"{k} {_lim(v)}" for k, v in rl.items()))
    shm = limits.get("shm_mib")
    if shm is not None and shm < SHM_MIN_MIB:
        report.add("/dev/shm", WARN, f"{shm} MiB, under {SHM_MIN_MIB // 1024} GiB: PyTorch's DataLoader workers and "
                   "NCCL keep their buffers there and outgrow it (a bus error, 'No space left on device'); give it "
                   "more: --shm-size 1g (docker/podman --shm-size, a pod's emptyDir with medium: Memory at /dev/shm)")
    machine_checks(probe.get("machine"), report, cuda)
    opts = spec.env.options
    if opts.get("cpus") and limits.get("cpu_limit") != float(opts["cpus"]):
        report.add("--cpus honoured", FAIL, f"asked {opts['cpus']}, inside sees {limits.get('cpu_limit')}")
    if opts.get("shm_size") and not limits.get("shm_mib"):
        report.add("--shm-size honoured", FAIL, "inside sees no /dev/shm")


SHM_MIN_MIB = 1024  # below 1 GiB a DataLoader with workers or NCCL within one node runs out (docs/containers.md)


def _fix(name: str, torch_version: str | None) -> str:
    """The one line that mends a torch or torchvision that cannot be loaded."""
    if name == "torchvision" and torch_version:
        major, _, rest = torch_version.partition(".")
        minor = rest.split(".")[0]
        if major == "2" and minor.isdigit():  # torchvision 0.(15 + N) is the release built for torch 2.N
            return (f"a torchvision built for another torch: pip install 'torchvision=={0}.{15 + int(minor)}.*' "
                    f"(the release matching torch {major}.{minor}), from the same index as torch")
        return ("a torchvision built for another torch: pip install the torchvision release matching torch "
                f"{torch_version}")
    return "reinstall it: pip install --force-reinstall torch (and the torchvision matching it)"


def machine_checks(machine: dict[str, Any] | None, report: Report, cuda: bool) -> None:
    """What will disturb a measurement here (read only, as `pyperf system show` reads): the load against the
    usable CPUs, CPU pressure, the CPU frequency governor, other processes on the GPUs."""
    from gpuvs.probes import contention

    if not machine:
        return
    load, usable, avg10 = machine.get("load"), machine.get("cpus_usable"), machine.get("cpu_pressure_avg10")
    if load is not None:
        busy = contention.busy(load, usable, None, None)
        cpus = f"{usable:g} usable CPU{'s' if usable != 1 else ''}" if usable else "CPUs unknown"
        report.add("machine load", WARN if busy else OK,
                   f"1-minute load {load:.1f} on {cpus}: other work competes with a trial; wait for it to end, or "
                   "run where the load is lower" if busy else f"1-minute load {load:.1f} on {cpus}")
    if avg10 is not None:
        high = avg10 > contention.PRESSURE_LIMIT
        report.add("CPU pressure", WARN if high else OK,
                   f"some task waited for a CPU {100 * avg10:.0f}% of the last 10 s (PSI)"
                   + (f", above {100 * contention.PRESSURE_LIMIT:g}%: a trial now would be contended" if high else ""))
    governors = machine.get("governors") or []
    if governors:
        steady = governors == ["performance"]
        report.add("CPU governor", OK if steady else WARN, ", ".join(governors) + (
            "" if steady else ": the CPU clock follows the load, so CPU-bound parts of a trial vary with it; for "
            "steady figures: sudo cpupower frequency-set -g performance"))
    else:
        report.add("CPU governor", OK, "not readable here (no cpufreq: a VM or container decides the clock)")
    procs = machine.get("gpu_processes")
    if cuda and procs is not None:
        if procs:
            shown = ", ".join(f"pid {p['pid']} ({p.get('name') or 'not visible from here'}) on GPU {p.get('gpu')}"
                              + (f", {p['mem_mib']:,} MiB" if p.get("mem_mib") is not None else "") for p in procs[:5])
            more = f" and {len(procs) - 5} more" if len(procs) > 5 else ""
            report.add("other GPU processes", WARN, f"{shown}{more}: a trial beside them measures the sharing; "
                       "wait for them to end, or use another GPU")
        else:
            report.add("other GPU processes", OK, "none")


def _lim(pair) -> str:
    soft, hard = pair
    return f"{'unlimited' if soft is None else soft}:{'unlimited' if hard is None else hard}"
