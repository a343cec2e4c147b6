"""gpuvs share: K workers on one GPU in one measured window (MPS off, on or both), mixed pairs,
and the capacity search."""

from __future__ import annotations

import copy
import shlex
import time
import uuid

import typer
from rich.console import Console
from rich.table import Table

from gpuvs import workloads
from gpuvs.cli import app
from gpuvs.cli import options as opt
from gpuvs.cli.run import PASS_THROUGH, Prepared, prepare, run_help
from gpuvs.errors import RunFailed, UsageError
from gpuvs.report.terminal import fmt
from gpuvs.runner import Runner, validate_spec
from gpuvs.sharing import Coordinator, Group, check_shareable, gpu_memory_total_mib, normalized_sum
from gpuvs.spec import RunSpec
from gpuvs.store import Store
from gpuvs.workloads.base import Param

SHARE_OPTIONS = (
    Param("workers", str, "1,2", "worker counts to measure, e.g. 1,2,4"),
    Param("mps", str, "off", "run with the MPS daemon off, on, or both", choices=("off", "on", "both")),
    Param("duration", float, 20.0, "seconds of the shared measurement window", min=0.5, max=86400),
    Param("with", str, None, "a second job to pair with, quoted: \"WORKLOAD --param value ...\""),
    Param("capacity", bool, False, "add workers one at a time until one fails"),
    Param("max_workers", int, 32, "upper bound of the capacity search", min=1, max=512),
    Param("ready_timeout", float, 900.0, "seconds a worker may take to warm up before the window", min=1),
)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 or c > 512 for c in counts):
        raise UsageError(f"--workers wants counts from 1 to 512 separated by commas, e.g. 1,2,4; got {text!r}")
    return counts


def job_spec(text: str, base: RunSpec) -> RunSpec:
    """'WORKLOAD --p v ...' -> a spec like base (device, env) for that workload."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--with: {exc}") from None
    if not args:
        raise UsageError("--with wants a workload, e.g. --with \"cnn-infer --model vgg16\"")
    w = workloads.get(args[0])
    _, values = opt.parse(args[1:], (w.params,), positional=0, what=f"--with {w.name}")
    spec = copy.deepcopy(base)
    spec.workload, spec.params = w.name, w.validate(opt.raw(values, w.params), base.device)
    return spec


def mps_modes(choice: str) -> list[bool]:
    return {"off": [False], "on": [True], "both": [False, True]}[choice]


def share_help(workload) -> None:
    run_help(workload)
    from gpuvs.cli.info import options_table

    Console().print(options_table("share options", SHARE_OPTIONS))


@app.command(context_settings=PASS_THROUGH, add_help_option=False)
def share(ctx: typer.Context) -> None:
    """Run K workers on one GPU in one shared window: gpuvs share WORKLOAD [options] --workers 1,2,4 --mps both"""
    console = Console(markup=False, highlight=False)
    prep = prepare(list(ctx.args), "gpuvs share", console, extra_groups=(SHARE_OPTIONS,), help_fn=share_help)
    so = opt.take(prep.rest, SHARE_OPTIONS)
    base = prep.base
    check_shareable(base)
    validate_spec(base)
    counts = parse_counts(so["workers"])
    other = job_spec(so["with"], base) if so["with"] else None
    if other is not None:
        check_shareable(other)
        validate_spec(other)
    if base.device == "cpu" and so["mps"] != "off":
        raise UsageError("--mps applies to GPU runs (--device cuda)")
    exp_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    base.experiment_id = exp_id
    if other is not None:
        other.experiment_id = exp_id
    run = prep.run
    with Store(run["store"]) as store:
        store.create_experiment(exp_id, run["name"] or f"share {base.workload}", "share",
                                {"base": base.to_dict(), "share": so})
        runner = Runner(store, timeout_s=run["timeout"] + so["duration"] + so["ready_timeout"],
                        on_trial_end=lambda r: console.print("  " + _trial_line(r), style=None if r.ok else "red"))
        coord = Coordinator(runner, so["duration"], so["ready_timeout"], say=lambda s: console.print("  " + s))
        total = gpu_memory_total_mib(base.device)
        if so["capacity"]:
            capacity(console, coord, base, so, total)
        elif other is not None:
            pairs(console, coord, base, other, so, total)
        else:
            scaling(console, coord, base, counts, so, total)
    console.print(f"stored as experiment {exp_id} in {run['store']}", style="dim")


def _trial_line(r) -> str:
    m = r.primary()
    if not r.ok:
        return f"{r.spec.arm}: worker {r.spec.trial}: {r.status}: {r.error}"
    return f"{r.spec.arm}: worker {r.spec.trial}: {fmt(m.get('value'))} {m.get('unit', '')} over {m.get('n')} steps"


def _mem(group: Group, total: float | None) -> str:
    if group.memory_used_mib is None:
        return "-"
    pct = f" ({100 * group.memory_used_mib / total:.0f}%)" if total else ""
    return f"{group.memory_used_mib:.0f}{pct}"


def scaling(console, coord: Coordinator, base: RunSpec, counts: list[int], so, total) -> None:
    alone: Group | None = None
    rows = []
    for mps in mps_modes(so["mps"]):
        for k in ([1] if 1 not in counts else []) + counts:
            label = f"{k} worker{'s' if k > 1 else ''}{', MPS' if mps else ''}"
            console.rule(label, style="dim")
            g = coord.group([base] * k, label, mps)
            if k == 1 and not mps and alone is None:
                alone = g
            rows.append((k, g))
    t = Table(title=f"{base.workload} sharing one GPU ({so['duration']:g} s window)", title_justify="left")
    for col in ("workers", "MPS", "per worker (mean)", "min … max", "aggregate", "vs alone", "fairness",
                "GPU memory MiB", "MPS clients"):
        t.add_column(col, justify="left" if col in ("MPS",) else "right")
    unit = ""
    for k, g in rows:
        v = g.values()
        unit = unit or g.unit()
        vs = g.aggregate / alone.aggregate if g.ok and alone is not None and alone.ok and alone.aggregate else None
        t.add_row(str(k), "on" if g.mps else "off", fmt(sum(v) / len(v)) if g.ok and v else "failed",
                  f"{fmt(min(v))} … {fmt(max(v))}" if g.ok else "-", fmt(g.aggregate), fmt(vs, 3),
                  fmt(g.fairness, 3), _mem(g, total), "-" if g.clients_attached is None else str(g.clients_attached))
    t.caption = f"unit: {unit}; fairness = slowest worker / fastest worker; vs alone = aggregate / one worker alone"
    console.print(t)
    _raise_if_failed([g for _, g in rows])


def pairs(console, coord: Coordinator, a: RunSpec, b: RunSpec, so, total) -> Group:
    console.rule(f"{a.workload} alone", style="dim")
    ga = coord.group([a], "A alone", False)
    console.rule(f"{b.workload} alone", style="dim")
    gb = coord.group([b], "B alone", False)
    alone = [ga.value(0), gb.value(0)]
    rows = [("A alone", ga), ("B alone", gb)]
    for mps in mps_modes(so["mps"]):
        label = f"A+B{', MPS' if mps else ''}"
        console.rule(label, style="dim")
        rows.append((label, coord.group([a, b], label, mps)))
    t = Table(title=f"interference: A = {a.workload}, B = {b.workload}", title_justify="left")
    for col in ("run", "A", "B", "A slowdown", "B slowdown", "work vs time-slicing", "GPU memory MiB"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for label, g in rows:
        if label.startswith("A+B"):
            va, vb = g.value(0), g.value(1)
            sa = alone[0] / va if va and alone[0] else None
            sb = alone[1] / vb if vb and alone[1] else None
            t.add_row(label, fmt(va), fmt(vb), fmt(sa, 2), fmt(sb, 2), fmt(normalized_sum(g, alone), 3), _mem(g, total))
        else:
            t.add_row(label, fmt(g.value(0)) if label[0] == "A" else "-", fmt(g.value(0)) if label[0] == "B" else "-",
                      "-", "-", "-", _mem(g, total))
    t.caption = ("slowdown = alone / together; work vs time-slicing = sum of together/alone over both jobs "
                 "(1.0 = what taking turns gives; above 1, sharing did more work)")
    console.print(t)
    _raise_if_failed([g for _, g in rows])
    return rows


def capacity(console, coord: Coordinator, base: RunSpec, so, total) -> None:
    console.rule(f"capacity search: {base.workload}, up to {so['max_workers']} workers", style="dim")
    group, failed = coord.capacity(base, so["max_workers"], mps=so["mps"] == "on")
    ran = len([t for t in group.trials if t.ok])
    t = Table(title="capacity", show_header=False, title_justify="left")
    t.add_column("what")
    t.add_column("value")
    t.add_row("largest count that ran", str(ran))
    t.add_row("GPU memory used then", _mem(group, total) + (f" of {total:.0f} MiB" if total else ""))
    t.add_row("stopped because", f"worker {ran + 1} failed: {failed.result.error}" if failed is not None
              else f"the cap of {so['max_workers']} workers was reached")
    t.add_row("aggregate", fmt(group.aggregate))
    t.add_row("fairness", fmt(group.fairness, 3))
    console.print(t)


def _raise_if_failed(groups: list[Group]) -> None:
    bad = [g for g in groups if not g.ok]
    if bad:
        raise RunFailed(f"{len(bad)} of {len(groups)} group(s) had a failed worker; first: "
                        f"{bad[0].failure or next((t.error for t in bad[0].trials if not t.ok), 'failed')}")
