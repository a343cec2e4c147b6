"""gpuvs share: K workers on one GPU in one measured window (MPS off, on or both), mixed pairs,
and the capacity search. The studies are gpuvs.sharing.studies'; this module parses and renders."""

from __future__ import annotations

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.command import Args, Command, Positional
from gpuvs.cli.command import Group as Options
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.store.records import ExperimentMeta
from gpuvs.report import sharing, terminal
from gpuvs.report.numbers import fmt
from gpuvs.trial.runner import Runner, validate_spec
from gpuvs.safetext import safe_text
from gpuvs.sharing import knobs, studies
from gpuvs.sharing.group import Coordinator, check_shareable, gpu_memory_total_mib
from gpuvs.analysis.stats import SeriesSummary
from gpuvs.store.db import Store

SHARE_OPTIONS = (
    Param("workers", str, "1,2", "worker counts to measure, e.g. 1,2,4"),
    Param("mps", str, "off", "run with the MPS daemon off, on, or both", choices=("off", "on", "both")),
    Param("duration", float, 20.0, "seconds of the shared measurement window", min=0.5, max=86400),
    Param("with", str, None, "a second job to pair with, quoted: \"WORKLOAD --param value ...\""),
    Param("capacity", bool, False, "add instances one at a time, each measured count a window, until one fails"),
    Param("max_workers", int, 32, "upper bound of the capacity search", min=1, max=512),
    Param("also_host", bool, False, "with --capacity and --env container: the same sweep with plain processes"),
    Param("ready_timeout", float, 900.0, "seconds a worker may take to warm up before the window", min=1),
    Param("repeats", int, 3, "fresh process groups per configuration (intervals and verdicts need 2 or more)",
          min=1, max=1000),
    Param("margin", float, 0.05, "ratio difference under which two arms count as equivalent", min=0, max=0.9),
    Param("mps_threads", str, None, "MPS arms with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per client: a comma list of "
          "P (every worker) or PA:PB (--with pairs), e.g. 50,30:70"),
    Param("mps_mem_limit", str, None, "an MPS arm with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per client: SIZE (every "
          "worker) or SIZE_A:SIZE_B, e.g. 4G or 2G:40G"),
)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 or c > 512 for c in counts):
        raise UsageError(f"--workers wants counts from 1 to 512 separated by commas, e.g. 1,2,4; got {text!r}")
    return counts


def share(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    prep = common.prepare(args, console)
    so = args.group("share")
    base = prep.base
    check_shareable(base)
    validate_spec(base)
    counts = parse_counts(so["workers"])
    other = common.job_spec(so["with"], base) if so["with"] else None
    if other is not None:
        check_shareable(other)
        validate_spec(other)
    if base.device == "cpu" and so["mps"] != "off":
        raise UsageError("--mps applies to GPU runs (--device cuda)")
    if so["also_host"] and (not so["capacity"] or base.env.kind == "host"):
        raise UsageError("--also-host goes with --capacity and --env container (it adds the same sweep on the host)")
    arms = knobs.arms(so["mps"], so["mps_threads"], so["mps_mem_limit"], 2 if other is not None else 1,
                      base.device)
    exp_id = common.experiment_id()
    base.experiment_id = exp_id
    if other is not None:
        other.experiment_id = exp_id
    run = prep.run
    with Store(run["store"]) as store:
        store.create_experiment(exp_id, run["name"] or f"share {base.workload}", "share",
                                ExperimentMeta(base=base, share=so))
        runner = Runner(store, timeout_s=run["timeout"] + so["duration"] + so["ready_timeout"],
                        on_trial_end=lambda r: console.print("  " + _trial_line(r), style=None if r.ok else "red"))
        coord = Coordinator(runner, so["duration"], so["ready_timeout"], say=lambda s: console.print("  " + safe_text(s)))
        total = gpu_memory_total_mib(base.device)

        def heading(text: str) -> None:
            terminal.heading(console, text)

        if so["capacity"]:
            sweeps = studies.capacity(coord, base, arms, so["max_workers"], so["also_host"], heading)
            console.print(sharing.capacity_table(base, so, sweeps, total))
            for line in sharing.capacity_lines(so, sweeps):
                console.print(line)
        elif other is not None:
            found = studies.pairs(coord, base, other, arms, so["repeats"], heading)
            console.print(sharing.pairs_table(base, other, so, found, total))
            studies.raise_if_failed(found.groups())
        else:
            found = studies.scaling(coord, base, counts, arms, so["repeats"], heading)
            console.print(sharing.scaling_table(base, so, found, total))
            studies.raise_if_failed(found.groups())
    console.print(f"stored as experiment {exp_id} in {run['store']}", style="dim")


def _trial_line(r) -> str:
    m = r.primary() or SeriesSummary(n=None)
    if not r.ok:
        return safe_text(f"{r.spec.arm}: worker {r.spec.trial}: {r.status}: {r.error}", lines=True)
    return f"{r.spec.arm}: worker {r.spec.trial}: {fmt(m.value)} {m.unit} over {m.n} steps"


COMMAND = Command(
    "share", "Run K workers on one GPU in one shared window (MPS off, on or both), pairs of jobs, or the capacity "
    "search.", share,
    # the command's own options come before the workload's, so they win where names clash (gpuvs share
    # --workers is the number of jobs; the CNN's DataLoader workers are --data-workers there)
    groups=(options.run_group(), *options.env_groups(), Options("share options", SHARE_OPTIONS, "share")),
    positionals=(Positional("workload", workload=True),),
    usage="WORKLOAD [workload options] [run options] [environment options] [share options]",
    help_when_bare=True,
)
