"""gpuvs doctor --env KIND [environment options] [--device cuda|cpu]: can a worker run there, with the GPU visible?

The environment runs its own checks first: a container engine and image, or a cluster's API, permissions and GPU nodes.
Then one real worker probe reports what it sees inside, and the command says exactly what is missing."""

from __future__ import annotations

from rich.console import Console

from gpuvs import environments
from gpuvs.probes import checkup
from gpuvs.cli import common, options
from gpuvs.cli.declaration import Args, Command, Group
from gpuvs.errors import EnvironmentUnavailable
from gpuvs.params import Param
from gpuvs.report import machine
from gpuvs.spec import RunSpec, check_device_syntax

DOCTOR_OPTIONS = (
    Param("device", str, None, "cuda, cuda:N or cpu (default: cuda when the environment has a GPU)"),
    Param("timeout", float, 300.0, "seconds the check may take", min=1.0),
)


def doctor(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    env = options.env_spec(args.group("env"))
    own = args.group("doctor")
    device = common.resolve_device(own["device"], env, console)
    check_device_syntax(device)
    report = checkup.Report()
    spec = RunSpec(workload="selftest", device=device, env=env)
    probe = environments.get(env).doctor(spec, report, own["timeout"])
    if probe is not None:
        checkup.probe_checks(probe, spec, report)
    console.print(machine.checkup_table(report, f"gpuvs doctor: {environments.label(env)}, device {device}"))
    if report.problems:
        first = report.problems[0]
        more = f" (and {len(report.problems) - 1} more above)" if len(report.problems) > 1 else ""
        raise EnvironmentUnavailable(f"{first.check}: {first.detail}{more}")
    warned = [r.check for r in report.rows if r.status == checkup.WARN]
    if warned:  # nothing stops a run, but what is named would weaken or disturb it
        console.print(f"all checks passed; {len(warned)} warning(s) above: {', '.join(warned)}", style="yellow")
    else:
        console.print("all checks passed", style="green")


COMMAND = Command(
    "doctor", "Check an environment: can a worker run there, with the GPU visible? Says exactly what is missing.",
    doctor,
    groups=(Group("doctor options", DOCTOR_OPTIONS, "doctor"), *options.env_groups()),
    usage="--env " + "|".join(environments.names()) + " [environment options] [--device cuda|cpu]",
)
