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
    for name in ("torch", "torchvision"):
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
    opts = spec.env.options
    if opts.get("cpus") and limits.get("cpu_limit") != float(opts["cpus"]):
        report.add("--cpus honoured", FAIL, f"asked {opts['cpus']}, inside sees {limits.get('cpu_limit')}")
    if opts.get("shm_size") and not limits.get("shm_mib"):
        report.add("--shm-size honoured", FAIL, "inside sees no /dev/shm")


def _lim(pair) -> str:
    soft, hard = pair
    return f"{'unlimited' if soft is None else soft}:{'unlimited' if hard is None else hard}"
