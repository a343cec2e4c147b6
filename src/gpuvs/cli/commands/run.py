"""gpuvs run WORKLOAD [options]: K trials of one workload, each in a fresh worker, with a step log."""

from __future__ import annotations

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.declaration import Args, Command, Positional
from gpuvs.trial.runner import Arm, Experiment

WORKLOAD = Positional("workload", "the workload to run (gpuvs workloads lists them)", workload=True)


def run(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    prep = common.prepare(args, console)
    run_opts = prep.run
    exp = Experiment(name=run_opts["name"] or prep.workload.name, base=prep.base, arms=[Arm("default")],
                     trials=run_opts["trials"], seed=run_opts["order_seed"], kind="run")
    results = common.execute(exp, run_opts["store"], console, run_opts["quiet"], run_opts["timeout"],
                             run_opts["retries"], prep.note)
    common.finish(results)


COMMAND = Command(
    "run", "Run a workload: K trials, each in a fresh worker, with a step log and a summary.", run,
    groups=(options.run_group(options.TRIAL_OPTIONS), *options.env_groups()),
    positionals=(WORKLOAD,),
    usage="WORKLOAD [workload options] [run options] [environment options]",
    help_when_bare=True,
)
