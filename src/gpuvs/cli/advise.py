"""gpuvs advise-mps "A ..." "B ...": predict from short solo runs whether two jobs should share the
GPU under MPS or by time-slicing, then check the prediction with a short measured run."""

from __future__ import annotations

import time
import uuid

import typer
from rich.console import Console
from rich.table import Table

from gpuvs.cli import app
from gpuvs.cli import options as opt
from gpuvs.cli.run import PASS_THROUGH, resolve_device
from gpuvs.cli.share import _mem, job_spec
from gpuvs.errors import UsageError
from gpuvs.report.terminal import fmt
from gpuvs.runner import Runner, validate_spec
from gpuvs.sharing import Coordinator, check_shareable, gpu_memory_total_mib, normalized_sum, predict_mps
from gpuvs.spec import RunSpec
from gpuvs.store import Store
from gpuvs.workloads.base import Param

ADVISE_OPTIONS = (
    Param("duration", float, 10.0, "seconds of each measured window", min=0.5, max=3600),
    Param("margin", float, 0.02, "work difference under which MPS and time-slicing count as equal", min=0, max=1),
)


@app.command("advise-mps", context_settings=PASS_THROUGH, add_help_option=False)
def advise_mps(ctx: typer.Context) -> None:
    """Should jobs A and B share the GPU under MPS? gpuvs advise-mps "WORKLOAD_A --p v" "WORKLOAD_B --p v" [options]"""
    console = Console(markup=False, highlight=False)
    groups = (opt.RUN_OPTIONS, opt.ENV_OPTIONS, ADVISE_OPTIONS)
    if "--help" in ctx.args or "-h" in ctx.args:
        from gpuvs.cli.info import options_table

        console.print('usage: gpuvs advise-mps "WORKLOAD_A [--param value ...]" "WORKLOAD_B [...]" [options]')
        for title, group in (("advise-mps options", ADVISE_OPTIONS), ("run options", opt.RUN_OPTIONS),
                             ("environment options", opt.ENV_OPTIONS)):
            console.print(options_table(title, group))
        raise typer.Exit(0)
    jobs, values = opt.parse(list(ctx.args), groups, positional=2, what="gpuvs advise-mps")
    if len(jobs) != 2:
        raise UsageError('advise-mps wants two quoted jobs, e.g. gpuvs advise-mps "kernels --app srad" '
                         '"kernels --app hotspot"')
    run = opt.take(values, opt.RUN_OPTIONS)
    env = opt.env_spec(opt.take(values, opt.ENV_OPTIONS))
    ao = opt.take(values, ADVISE_OPTIONS)
    device = resolve_device(run["device"], env.kind, console)
    base = RunSpec(workload="selftest", device=device, env=env, timeout_s=run["timeout"])
    a, b = job_spec(jobs[0], base), job_spec(jobs[1], base)
    for s in (a, b):
        check_shareable(s)
        validate_spec(s)
    exp_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    a.experiment_id = b.experiment_id = exp_id
    total = gpu_memory_total_mib(device)
    with Store(run["store"]) as store:
        store.create_experiment(exp_id, run["name"] or f"advise-mps {a.workload} + {b.workload}", "advise-mps",
                                {"a": a.to_dict(), "b": b.to_dict(), "options": ao})
        runner = Runner(store, timeout_s=run["timeout"] + ao["duration"])
        coord = Coordinator(runner, ao["duration"], say=lambda s: console.print("  " + s))
        console.rule("solo runs (telemetry)", style="dim")
        solo_a, solo_b = coord.group([a], "A alone", False), coord.group([b], "B alone", False)
        advice = predict_mps(solo_a, solo_b, total)
        console.print(f"prediction: {advice.prediction}", style="bold")
        for reason in advice.reasons:
            console.print(f"  - {reason}")
        alone = [solo_a.value(0), solo_b.value(0)]
        console.rule("measured: both at once, time-slicing then MPS", style="dim")
        sliced = coord.group([a, b], "A+B", False)
        shared = coord.group([a, b], "A+B, MPS", True) if device.startswith("cuda") else None
    t = Table(title=f"advise-mps: A = {jobs[0]}, B = {jobs[1]}", title_justify="left")
    for col in ("run", "A", "B", "work vs time-slicing", "GPU busy %", "GPU memory MiB"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for label, g in (("A alone", solo_a), ("B alone", solo_b), ("A+B", sliced), ("A+B, MPS", shared)):
        if g is None:
            continue
        two = label.startswith("A+B")
        t.add_row(label, fmt(g.value(0) if label != "B alone" else None),
                  fmt(g.value(1) if two else (g.value(0) if label == "B alone" else None)),
                  fmt(normalized_sum(g, alone), 3) if two else "-", fmt(g.telemetry.get("util_gpu_mean")),
                  _mem(g, total))
    console.print(t)
    ws, wm = normalized_sum(sliced, alone), normalized_sum(shared, alone) if shared else None
    if ws is None or wm is None:
        console.print("measured: no verdict (MPS needs a GPU, or a run failed)")
        return
    measured = ("mps helps" if wm > ws * (1 + ao["margin"]) else "mps hurts" if wm < ws * (1 - ao["margin"])
                else "no difference")
    agree = measured == advice.prediction
    console.print(f"measured: {measured} (work {wm:.3f} with MPS vs {ws:.3f} time-sliced); prediction "
                  f"{'confirmed' if agree else 'NOT confirmed'}", style="bold")
    console.print(f"stored as experiment {exp_id} in {run['store']}", style="dim")
