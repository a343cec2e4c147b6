"""gpuvs run WORKLOAD [options]: K trials of one workload, each in a fresh worker, with a step log."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import typer
from rich.console import Console

from gpuvs import environments, workloads
from gpuvs.cli import app
from gpuvs.cli import options as opt
from gpuvs.cli.info import options_table, param_table
from gpuvs.errors import RunFailed, UsageError
from gpuvs.report import terminal
from gpuvs.runner import Arm, Experiment, Runner, TrialResult, validate_experiment
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store import Store

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@dataclass
class Prepared:
    workload: workloads.Workload
    base: RunSpec
    run: dict[str, Any]
    rest: dict[Any, Any]  # raw values of the command's own option groups, by Param (see options.take)
    positionals: list[str]


def resolve_device(device: str | None, env: EnvSpec | str, console: Console) -> str:
    """The device asked for, else cuda where the environment has a GPU to give, else cpu (with a note)."""
    if device:
        return device
    env = env if isinstance(env, EnvSpec) else EnvSpec(kind=env)
    environment = environments.get(env)
    if environment.gpu_count() == 0:
        console.print(f"note: no NVIDIA GPU found {environment.gpus_where}; running on the CPU (--device cpu). "
                      "CPU figures from a shared machine are not GPU performance claims.", style="yellow",
                      highlight=False)
        return "cpu"
    return "cuda"


def prepare(args: list[str], what: str, console: Console, extra_groups: tuple = (), positional: int = 1,
            help_fn=None) -> Prepared:
    """Parse `WORKLOAD [options]` into a checked base RunSpec and the run options."""
    at = _workload_position(args, (opt.RUN_OPTIONS, opt.ENV_OPTIONS) + tuple(extra_groups))
    if at is None:
        if "--help" in args or "-h" in args or not args:
            if help_fn:
                help_fn(None)
            raise typer.Exit(0)
        raise UsageError(f"{what} needs a workload; known workloads: {', '.join(workloads.names())}")
    workload = workloads.get(args[at])
    if "--help" in args or "-h" in args:
        if help_fn:
            help_fn(workload)
        raise typer.Exit(0)
    # a command's own options come before the workload's, so they win where names clash
    # (gpuvs share --workers is the number of jobs; the CNN's DataLoader workers are --data-workers there)
    groups = (opt.RUN_OPTIONS, opt.ENV_OPTIONS) + tuple(extra_groups) + (workload.params,)
    positionals, values = opt.parse(args[:at] + args[at + 1:], groups, positional=positional - 1,
                                    what=f"{what} {workload.name}")
    run = opt.take(values, opt.RUN_OPTIONS)
    env = opt.env_spec(opt.take(values, opt.ENV_OPTIONS))
    own = {p: values.pop(p) for g in extra_groups for p in g if p in values}
    given = opt.raw(values, workload.params)
    device = resolve_device(run["device"], env, console)
    params = workload.validate(given, device)  # refuse bad values now, with the option's name
    cpu_filled = {k: v for k, v in workload.cpu_defaults.items() if k not in given}
    if device == "cpu" and cpu_filled:
        console.print("note: CPU-sized defaults: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                              cpu_filled.items()) + " (give them to override)",
                      style="yellow")
    base = RunSpec(workload=workload.name, params=params, device=device, num_gpus=run["num_gpus"], env=env,
                   telemetry_interval_s=run["telemetry_interval"], timeout_s=run["timeout"])
    return Prepared(workload, base, run, own, positionals)


def _workload_position(args: list[str], groups) -> int | None:
    """Index of the workload name: the first word that is neither an option nor an option's value."""
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-"):
            return i
        p = opt.find(groups, tok.partition("=")[0])
        if p is not None and p.type is not bool and "=" not in tok:
            i += 1
        i += 1
    return None


def run_help(workload) -> None:
    console = Console(markup=False, highlight=False)
    console.print("usage: gpuvs run WORKLOAD [workload options] [run options] [environment options]")
    if workload is None:
        console.print(f"workloads: {', '.join(workloads.names())}  (gpuvs workloads NAME shows one's options)")
    else:
        console.print(param_table(workload))
    console.print(options_table("run options", opt.RUN_OPTIONS))
    for title, group in opt.env_groups():
        console.print(options_table(title, group))


def execute(exp: Experiment, store_path: str, console: Console, quiet: bool,
            timeout_s: float | None = None, retries: int = 0, progress: bool = False,
            more: Callable[[list[TrialResult]], int] | None = None) -> list[TrialResult]:
    """Run an experiment with the step log and per-trial lines; the shared path of run and compare.
    progress: a progress bar over the trials; more: see Runner.run_experiment (--until-confident)."""
    log = terminal.StepLog(console, quiet=quiet)
    total = len(exp.arms) * exp.trials
    bar = terminal.TrialProgress(console) if progress else None

    def on_start(spec: RunSpec, i: int, n: int) -> None:
        log.start_trial()
        if bar:
            bar.start(spec, i, n)
        console.rule(f"trial {i + 1}/{n}: arm {spec.arm}, {spec.workload} on {spec.device} ({environments.label(spec.env)})",
                     style="dim")

    def on_end(result: TrialResult) -> None:
        if not quiet:
            terminal.total_block(console, result)
        console.print(terminal.trial_line(result), style=None if result.ok else "red", highlight=False)
        if bar:
            bar.done()

    validate_experiment(exp)
    with Store(store_path) as store, (bar or contextlib.nullcontext()):
        runner = Runner(store, on_event=log, timeout_s=timeout_s, retries=retries, on_trial_start=on_start,
                        on_trial_end=on_end)
        results = runner.run_experiment(exp, more=more)
    if total > 1 or any(len(r.summary) > 1 for r in results):
        console.print(terminal.arm_table(results))
    for table in (terminal.startup_table(results), terminal.metrics_table(results)):
        if table is not None and total > 1:
            console.print(table)
    for table in (terminal.series_table(results), terminal.telemetry_table(results)):
        if table is not None:
            console.print(table)
    console.print(f"stored as experiment {exp.id} in {store_path}", style="dim", highlight=False)
    return results


def finish(results: list[TrialResult]) -> None:
    failed = [r for r in results if not r.ok]
    if failed:
        raise RunFailed(f"{len(failed)} of {len(results)} trial(s) failed (the others are kept); "
                        f"first: {failed[0].error.splitlines()[0][:160] if failed[0].error else failed[0].status}")


@app.command(context_settings=PASS_THROUGH, add_help_option=False)
def run(ctx: typer.Context) -> None:
    """Run a workload: gpuvs run WORKLOAD [--option value ...]  (gpuvs run WORKLOAD --help lists options)."""
    console = Console(markup=False, highlight=False)
    prep = prepare(list(ctx.args), "gpuvs run", console, help_fn=run_help)
    if prep.positionals:
        raise UsageError(f"unexpected argument {prep.positionals[0]!r}")
    run_opts = prep.run
    exp = Experiment(name=run_opts["name"] or prep.workload.name, base=prep.base, arms=[Arm("default")],
                     trials=run_opts["trials"], seed=run_opts["order_seed"], kind="run")
    results = execute(exp, run_opts["store"], console, run_opts["quiet"], run_opts["timeout"], run_opts["retries"])
    finish(results)
