"""gpuvs info: this environment's fingerprint."""

from __future__ import annotations

import json

from rich.console import Console

from gpuvs.probes import fingerprint
from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.params import Param
from gpuvs.report import machine


def info(args: Args) -> None:
    fp = fingerprint.take()
    if args["json"]:
        print(json.dumps(fp, indent=2, default=str))
        return
    console = Console(markup=False, highlight=False)
    console.print(machine.fingerprint_table(fp))


COMMAND = Command(
    "info", "Print this environment's fingerprint: GPUs, driver, CUDA, frameworks, CPU, memory, cgroup limits.", info,
    groups=(Group("info options", (Param("json", bool, False, "print the fingerprint as JSON"),), "info"),),
)
