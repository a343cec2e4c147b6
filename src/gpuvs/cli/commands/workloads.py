"""gpuvs workloads [NAME]: the workloads, or one workload's parameters."""

from __future__ import annotations

from rich.console import Console

from gpuvs import workloads
from gpuvs.cli.declaration import Args, Command, Positional
from gpuvs.cli.help import param_table
from gpuvs.report import workload_list


def list_workloads(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    if args.positionals:
        console.print(param_table(workloads.get(args.positionals[0])))
        return
    console.print(workload_list.workloads_table(workloads.all_workloads()))


COMMAND = Command(
    "workloads", "List the workloads, or one workload's parameters with their defaults and limits.", list_workloads,
    positionals=(Positional("name", "show one workload's parameters", required=False),),
)
