"""What several commands share (not a command).

A RunSpec from parsed options, the device resolved, an experiment run with its step log, failures as the exit status.
Also a job given as text (`--with "WORKLOAD --p v"`), the store opened for reading, and -o FILE written whole or not."""

from __future__ import annotations

import copy
import errno
import os
import shlex
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from rich.console import Console

from gpuvs import environments, workloads
from gpuvs.analysis import timeshare
from gpuvs.cli import options, parser
from gpuvs.cli.declaration import Args
from gpuvs.errors import RunFailed, UsageError
from gpuvs.safetext import clip
from gpuvs.report import tables, terminal
from gpuvs.report.numbers import Units
from gpuvs.trial import experiment
from gpuvs.trial.overrides import spec_field
from gpuvs.trial.runner import Experiment, TrialResult
from gpuvs.trial.study import Hooks, Ran, run_trials
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store, open_existing


@dataclass
class Prepared:
    workload: workloads.Workload
    base: RunSpec
    run: dict[str, Any]  # the run options, checked (defaults filled)
    note: str = ""  # the CPU note, said once the run starts (cpu_note)


def resolve_device(device: str | None, env: EnvSpec | str, console: Console) -> str:
    """The device asked for, else the environment's (experiment.default_device: cuda where it has a GPU to give,
    else cpu, with a note)."""
    if device:
        return device
    env = env if isinstance(env, EnvSpec) else EnvSpec(kind=env)
    device = experiment.default_device(env)
    if device == "cpu":
        console.print(f"note: no NVIDIA GPU found {environments.get(env).gpus_where}; running on the CPU (--device "
                      "cpu). CPU figures from a shared machine are not GPU performance claims.", style="yellow",
                      highlight=False)
    return device


def run_doc(args: Args) -> dict[str, Any]:
    """The command line's workload, its parameters, run and environment options as the mapping an experiment
    file holds (experiment.study and experiment.spec read it): what was not given has the option's default."""
    run = args.group("run")
    env = options.env_spec(args.group("env"))  # the environment options the kind takes, checked
    doc: dict[str, Any] = {"workload": args.workload.name, "params": dict(args.params)}
    doc.update({spec_field(name): value for name, value in run.items() if spec_field(name) and value is not None})
    doc["env"] = env.kind
    doc.update(env.options)
    return doc


def device_default(console: Console) -> Callable[[EnvSpec], str]:
    """experiment's device default, saying so where it is the CPU."""
    return lambda env: resolve_device(None, env, console)


def cpu_note(workload: workloads.Workload, given: Mapping[str, Any], device: str) -> str:
    """The line that says which CPU-sized defaults a run on the CPU took ('' where none). It is said once the
    first trial starts (say_note), never before a refusal it has nothing to do with."""
    cpu_filled = {k: v for k, v in workload.cpu_defaults.items() if k not in given}
    if device != "cpu" or not cpu_filled:
        return ""
    why = f"{workload.cpu_note}; " if workload.cpu_note else ""
    return ("note: CPU-sized defaults: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in cpu_filled.items())
            + f" ({why}give them to override)")


def say_note(console: Console, note: str) -> None:
    if note:
        console.print(note, style="yellow", highlight=False)


def prepare(args: Args, console: Console) -> Prepared:
    """The checked base RunSpec of a command that runs a workload (`WORKLOAD [options]`): its run and
    environment options, the device resolved, the workload's parameters checked for that device; built by
    the loader of experiment files (experiment.spec) from the mapping the command line makes (run_doc)."""
    assert args.workload is not None, f"{args.command.name} takes no workload"
    workload, base = experiment.spec(run_doc(args), device_default(console))
    return Prepared(workload, base, args.group("run"), cpu_note(workload, args.params, base.device))


def trial_hooks(console: Console, quiet: bool, progress: bool = False, up_to: int | None = None,
                note: str = "", units: Units | None = None) -> Hooks:
    """The command line's hooks of a run of trials: the step log, a rule and a line per trial, and (progress)
    a progress bar over the trials (`up_to`: the trials there may be in all, where more may be added); `note`
    (the CPU note) is said as the first trial starts; `units`: the run's one unit per metric, which its first
    trial line chooses and the tables after keep."""
    log = terminal.StepLog(console, quiet=quiet)
    bar = terminal.TrialProgress(console, up_to) if progress else None
    unsaid = [note]

    def on_start(spec: RunSpec, i: int, n: int) -> None:
        say_note(console, unsaid.pop() if unsaid else "")
        log.start_trial()
        if bar:
            bar.start(spec, i, n)
        terminal.heading(console, f"trial {i + 1}/{n}: arm {spec.arm}, {spec.workload} on {spec.device} "
                                  f"({environments.label(spec.env)})")

    def on_end(result: TrialResult) -> None:
        if not quiet:
            terminal.total_block(console, result)
        console.print(terminal.trial_line(result, units), style=None if result.ok else "red", highlight=False)
        if bar:
            bar.done()

    return Hooks(on_event=log, on_trial_start=on_start, on_trial_end=on_end, running=(lambda: bar) if bar else None)


def render_ran(console: Console, ran: Ran, store_path: str, units: Units | None = None) -> None:
    """The tables of a run of trials as they ran (per arm, startup, metrics, series, telemetry, time shares),
    each metric in the one unit of `units` (the run's, chosen by its trial lines and kept)."""
    results = ran.results
    units = terminal.results_units(results, units)
    total = len(ran.experiment.arms) * ran.planned
    if total > 1 or any(len(r.summary) > 1 for r in results):
        console.print(terminal.arm_table(results, arms=[a.name for a in ran.experiment.arms], units=units))
    for table in (terminal.startup_table(results, [a.name for a in ran.experiment.arms]),
                  terminal.metrics_table(results, units)):
        if table is not None and total > 1:
            console.print(table)
    for table in (terminal.series_table(results, units), terminal.telemetry_table(results)):
        if table is not None:
            console.print(table)
    shares = timeshare.from_records(results,
                                    ran.timing.get("wall_s"), ran.timing)
    if shares is not None:
        console.print(terminal.rich_table(tables.time_shares_table(shares)))
    console.print(f"stored as experiment {ran.experiment.id} in {store_path}", style="dim", highlight=False)


def execute(exp: Experiment, store_path: str, console: Console, quiet: bool,
            timeout_s: float | None = None, retries: int = 0, note: str = "") -> list[TrialResult]:
    """Run an experiment with the step log and per-trial lines, then its tables (gpuvs run)."""
    units = Units()  # one unit per metric in the trial lines and the tables alike
    ran = run_trials(exp, store_path, trial_hooks(console, quiet, note=note, units=units), timeout_s=timeout_s,
                     retries=retries)
    render_ran(console, ran, store_path, units)
    return ran.results


def finish(results: list[TrialResult]) -> None:
    """Exit status 1 (RunFailed) when a trial failed; the others are kept in the store."""
    failed = [r for r in results if not r.ok]
    if failed:
        raise RunFailed(f"{len(failed):,} of {len(results):,} trial(s) failed (the others are kept); "
                        f"first: {clip(failed[0].error.splitlines()[0], 160) if failed[0].error else failed[0].status}")


def job_spec(text: str, base: RunSpec) -> RunSpec:
    """'WORKLOAD --p v ...' -> a spec like base (device, env) for that workload."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--with: {exc}") from None
    if not args:
        raise UsageError("--with wants a workload, e.g. --with \"cnn-infer --model vgg16\"")
    w = workloads.get(args[0])
    _, values = parser.split(args[1:], (w.params,), positional=0, what=f"--with {w.name}")
    spec = copy.deepcopy(base)
    spec.workload, spec.params = w.name, w.validate({p.name: v for p, v in values.items()}, base.device)
    return spec


def open_store(path: str) -> Store:
    """An existing store, or one line when there is none (store.db.open_existing: the library reads stores so too)."""
    return open_existing(path)


def check_output(output: str | None, option: str = "-o") -> None:
    """Refuse an -o that cannot be a file before any work is done: a folder, or a file in a folder that does not
    exist."""
    if not output:
        return
    path = Path(output)
    if path.is_dir():
        raise UsageError(f"{option} {output}: is a folder; name a file in it, e.g. {option} {path / 'NAME'}")
    if not path.resolve().parent.is_dir():
        raise UsageError(f"{option} {output}: folder {path.parent} does not exist")


def write_output(output: str, text: str, option: str = "-o") -> None:
    """`text` as the file `output`, whole or not at all: written to a temporary file beside it, synced, then
    renamed over it, so that a full disk leaves no partial or empty file (and an earlier file as it was). A target
    that is not a regular file (/dev/stdout, a FIFO) cannot be renamed over: it is written in place. Every
    failure is one line."""
    check_output(output, option)
    path, data = Path(output), text.encode("utf-8")
    if path.is_symlink():  # the file it leads to is replaced, as writing through it would, not the link itself
        path = path.resolve()
    try:
        special = path.exists() and not stat.S_ISREG(path.stat().st_mode)
    except OSError:
        special = False
    if special:
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise UsageError(f"{option} {output}: cannot write it ({exc.strerror}); it is not a regular file (it is "
                             "written in place, not replaced): name another file") from None
        return
    kept = "the file as it was is kept" if path.exists() else "no file was left there"
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"{option} {output}: cannot write it: its folder {path.parent} takes no new file "
                         f"({exc.strerror}); name a file where you can write") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~umask)  # mkstemp's 0600 is not
        os.replace(tmp, path)                                                                # what open() would give
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        full = ": free some space, or name a file on another disk" if exc.errno == errno.ENOSPC else ""
        raise UsageError(f"{option} {output}: cannot write it ({exc.strerror}); {kept}{full}") from None
