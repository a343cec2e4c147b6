"""gpuvs doctor --env container [environment options] [--device cuda|cpu]: can a worker run there, with
the GPU visible? Starts one real container (or, for --env host, one process) that reports what it
sees, and says exactly what is missing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpuvs import environments
from gpuvs.cli import app
from gpuvs.cli import options as opt
from gpuvs.cli.run import PASS_THROUGH, resolve_device
from gpuvs.errors import EnvironmentUnavailable, GpuvsError
from gpuvs.spec import RunSpec, check_device_syntax, device_kind
from gpuvs.workloads.base import Param

DOCTOR_OPTIONS = (
    Param("device", str, None, "cuda, cuda:N or cpu (default: cuda when this host has a GPU)"),
    Param("timeout", float, 300.0, "seconds the check may take", min=1.0),
)


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, check: str, status: str, detail: str) -> None:
        self.rows.append((check, status, detail))

    @property
    def problems(self) -> list[tuple[str, str, str]]:
        return [r for r in self.rows if r[1] == "FAIL"]

    def table(self, title: str) -> Table:
        t = Table(title=title, title_justify="left")
        for col in ("check", "status", "detail"):
            t.add_column(col, overflow="fold")
        for check, status, detail in self.rows:
            t.add_row(check, status, detail, style={"FAIL": "red", "warn": "yellow"}.get(status))
        return t


@app.command(context_settings=PASS_THROUGH, add_help_option=False)
def doctor(ctx: typer.Context) -> None:
    """Check an environment: gpuvs doctor --env container --image IMAGE | --rootfs DIR [--device cuda] [options]."""
    console = Console(markup=False, highlight=False)
    args = list(ctx.args)
    if "--help" in args or "-h" in args:
        from gpuvs.cli.info import options_table

        console.print("usage: gpuvs doctor --env container (--image IMAGE | --rootfs DIR[:O]) [options]")
        console.print(options_table("doctor options", DOCTOR_OPTIONS))
        console.print(options_table("environment options", opt.ENV_OPTIONS))
        raise typer.Exit(0)
    _, values = opt.parse(args, (opt.ENV_OPTIONS, DOCTOR_OPTIONS), positional=0, what="gpuvs doctor")
    env = opt.env_spec(opt.take(values, opt.ENV_OPTIONS))
    own = opt.take(values, DOCTOR_OPTIONS)
    device = resolve_device(own["device"], env.kind, console)
    check_device_syntax(device)
    report = Report()
    spec = RunSpec(workload="selftest", device=device, env=env)
    if env.kind == "container":
        probe = container_checks(spec, report, own["timeout"])
    else:
        probe = host_probe(report, own["timeout"])
    if probe is not None:
        inside_checks(probe, spec, report)
    console.print(report.table(f"gpuvs doctor: {env.label()}, device {device}"))
    if report.problems:
        check, _, detail = report.problems[0]
        more = f" (and {len(report.problems) - 1} more above)" if len(report.problems) > 1 else ""
        raise EnvironmentUnavailable(f"{check}: {detail}{more}")
    console.print("all checks passed", style="green")


def container_checks(spec: RunSpec, report: Report, timeout: float) -> dict[str, Any] | None:
    from gpuvs.environments.container import ContainerEnvironment

    env = environments.get(spec.env)
    assert isinstance(env, ContainerEnvironment)
    try:
        s = env.settings
        eng = env.engine()
    except GpuvsError as exc:
        report.add("engine", "FAIL", str(exc))
        return None
    report.add("engine", "ok", f"{eng.name} {eng.version} at {eng.path}")
    report.add("engine settings", "ok", " ".join(eng.global_args) or "(none)")
    for note in eng.notes:
        report.add("detected", "ok", note)
    try:
        env.check(spec)
        report.add("image" if s.image else "rootfs", "ok", s.image or s.rootfs or "")
    except GpuvsError as exc:
        report.add("image / GPU access", "FAIL", str(exc))
        return None
    plan = env.gpu_plan(spec, eng)
    report.add("GPU access", "ok", plan.mode + ("" if not plan.notes else ": " + "; ".join(plan.notes)))
    launched = env.start(spec, entry=("-m", "gpuvs.inside", "--probe"))
    t0 = time.monotonic()
    probe = None
    try:
        for line in launched.read(t0 + timeout):
            if line.startswith("{") and '"python"' in line:
                probe = json.loads(line)
        code = launched.wait(timeout=30)
    except TimeoutError:
        report.add("start a container", "FAIL", f"no answer within {timeout:g} s")
        return None
    finally:
        if launched.proc.poll() is None:
            launched.kill()
        else:
            launched.close()
    if probe is None:
        found = env.explain(code, list(launched.stderr_tail))
        detail = found[1] if found else f"exit status {code}: " + " | ".join(list(launched.stderr_tail)[-4:])
        report.add("start a container", "FAIL", detail)
        return None
    report.add("start a container", "ok", f"{time.monotonic() - t0:.2f} s, {env.python()} = Python {probe['python']}")
    return probe


def host_probe(report: Report, timeout: float) -> dict[str, Any] | None:
    from gpuvs.environments.host import worker_env

    spec = RunSpec(workload="selftest")
    try:
        r = subprocess.run([sys.executable, "-m", "gpuvs.inside", "--probe"], capture_output=True, text=True,
                           timeout=timeout, env=worker_env(spec))
        probe = json.loads(r.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        report.add("start a process", "FAIL", f"{sys.executable} -m gpuvs.inside --probe: {exc}")
        return None
    report.add("start a process", "ok", f"Python {probe['python']} at {probe['executable']}")
    return probe


def inside_checks(probe: dict[str, Any], spec: RunSpec, report: Report) -> None:
    mods = probe.get("modules") or {}
    errors = probe.get("module_errors") or {}
    report.add("numpy", "ok" if mods.get("numpy") else "FAIL",
               mods.get("numpy") or f"missing (gpuvs's worker needs it): {errors.get('numpy', '')}")
    for name in ("torch", "torchvision"):
        report.add(name, "ok" if mods.get(name) else "warn",
                   mods.get(name) or f"missing: the cnn and startup workloads need it ({errors.get(name, '')})")
    report.add("nvidia-ml-py", "ok" if mods.get("pynvml") else "warn",
               mods.get("pynvml") or "missing: no GPU telemetry or NVML fingerprint")
    gpu = probe.get("gpu") or {}
    cuda = device_kind(spec.device) == "cuda"
    if not cuda:
        report.add("GPU inside", "ok", f"not asked (device {spec.device}); device nodes seen: "
                   f"{', '.join(gpu.get('nodes') or []) or 'none'}")
    elif gpu.get("ok"):
        detail = f"{gpu.get('count')} GPU(s): {', '.join(gpu.get('names') or [])}"
        if "torch_cuda" in gpu:
            detail += f"; torch.cuda.is_available() = {gpu['torch_cuda']}"
        report.add("GPU inside", "ok" if gpu.get("torch_cuda", True) else "FAIL", detail)
        if gpu.get("nvidia_smi"):
            report.add("nvidia-smi inside", "ok", gpu["nvidia_smi"].splitlines()[0])
    else:
        report.add("GPU inside", "FAIL", gpu.get("problem", "not visible"))
    limits = probe.get("limits") or {}
    rl = probe.get("rlimits") or {}
    report.add("limits inside", "ok",
               f"cgroup {limits.get('cgroup')}, CPU limit {limits.get('cpu_limit') or 'none'}, memory limit "
               f"{str(limits['memory_limit_mib']) + ' MiB' if limits.get('memory_limit_mib') else 'none'}, /dev/shm "
               f"{limits.get('shm_mib')} MiB, ulimits " + ", ".join(f"{k} {_lim(v)}" for k, v in rl.items()))
    opts = spec.env.options
    if opts.get("cpus") and limits.get("cpu_limit") != float(opts["cpus"]):
        report.add("--cpus honoured", "FAIL", f"asked {opts['cpus']}, inside sees {limits.get('cpu_limit')}")
    if opts.get("shm_size") and not limits.get("shm_mib"):
        report.add("--shm-size honoured", "FAIL", "inside sees no /dev/shm")


def _lim(pair) -> str:
    soft, hard = pair
    return f"{'unlimited' if soft is None else soft}:{'unlimited' if hard is None else hard}"
