"""gpuvs share: K workers on one GPU in one measured window (MPS off, on or both), mixed pairs,
and the capacity search. The run is gpuvs.sharing.share_run's; this module parses and renders."""

from __future__ import annotations

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.declaration import Args, Command, Positional
from gpuvs.cli.declaration import Group as Options
from gpuvs.report import sharing, terminal
from gpuvs.report.numbers import fmt
from gpuvs.safetext import safe_text
from gpuvs.sharing.share_run import SHARE_PARAMS, ShareRequest, SharingHooks, run_share
from gpuvs.store.records import SeriesSummary


def share(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    prep = common.prepare(args, console)
    run = prep.run
    request = ShareRequest.from_values(prep.base, args.group("share"), parse_job=common.job_spec, name=run["name"],
                                       timeout_s=run["timeout"])
    hooks = SharingHooks(
        on_start=lambda _: common.say_note(console, prep.note),
        heading=lambda text: terminal.heading(console, text),
        say=lambda s: console.print("  " + safe_text(s)),
        on_trial_end=lambda r: console.print("  " + _trial_line(r), style=None if r.ok else "red"))
    result = run_share(request, run["store"], hooks)
    so, total = result.options, result.memory_total_mib
    if result.capacity is not None:
        console.print(sharing.capacity_table(result.base, so, result.capacity, total))
        for line in sharing.capacity_lines(so, result.capacity):
            console.print(line)
    elif result.pairs is not None:
        console.print(sharing.pairs_table(result.base, result.other, so, result.pairs, total))
    else:
        console.print(sharing.scaling_table(result.base, so, result.scaling, total))
    result.raise_if_failed()
    console.print(f"stored as experiment {result.experiment_id} in {run['store']}", style="dim")


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
    groups=(options.run_group(), *options.env_groups(), Options("share options", SHARE_PARAMS, "share")),
    positionals=(Positional("workload", workload=True),),
    usage="WORKLOAD [workload options] [run options] [environment options] [share options]",
    help_when_bare=True,
)
