"""gpuvs workloads [NAME]: the workloads, or one workload's parameters."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gpuvs import workloads
from gpuvs.cli.command import Args, Command, Positional
from gpuvs.cli.help import param_table


def list_workloads(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    if args.positionals:
        console.print(param_table(workloads.get(args.positionals[0])))
        return
    t = Table(title="workloads", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("what it measures")
    t.add_column("multi-GPU")
    for w in workloads.all_workloads():
        t.add_row(w.name, w.summary, "yes" if w.multi_gpu else "-")
    console.print(t)


COMMAND = Command(
    "workloads", "List the workloads, or one workload's parameters with their defaults and limits.", list_workloads,
    positionals=(Positional("name", "show one workload's parameters", required=False),),
)
