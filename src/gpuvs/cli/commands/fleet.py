"""gpuvs fleet WORKLOAD: the same workload on every GPU node of a cluster, each node compared with the fleet.

`gpuvs fleet collective --pairs` measures pairs of nodes, and `gpuvs fleet history [NODE]` each node's past.
The options are in the command's help and in docs/fleet.md.
Exit status: 0 when the fleet ran (whatever the verdicts), 1 when a node ran no trial, 2 on bad input."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

from rich.console import Console

from gpuvs import environments
from gpuvs.cli import common, options
from gpuvs.cli.options import STORE
from gpuvs.cli.declaration import Args, Command, Group, Positional
from gpuvs.errors import RunFailed, UsageError
from gpuvs.fleet.execute import history_run as fleet_history
from gpuvs.fleet.execute import pair_plan as pairs
from gpuvs.fleet.execute import fleet_run
from gpuvs.fleet.execute.fleet_run import DEFAULT_TRIALS, MIN_TRIALS, node_kinds
from gpuvs.params import Param
from gpuvs.report import fleet as report
from gpuvs.report import terminal
from gpuvs.trial.runner import TrialResult
from gpuvs.safetext import safe_text

PAIR_OPTIONS = pairs.PARAMS  # --pairs, --partners, --second-pass: the agent takes them too
FLEET_OPTIONS = fleet_run.PARAMS + PAIR_OPTIONS + (
    Param("format", str, "term", "report format", choices=report.FORMATS),
    Param("output", str, None, "write the report here (else standard output)"),
)


def fleet(args: Args) -> None:
    o = args.group("fleet")
    # a report in another format on stdout: progress goes to stderr
    console = Console(markup=False, highlight=False, stderr=o["format"] != "term" and not o["output"])
    prep = common.prepare(args, console)
    run = prep.run
    opts = fleet_run.FleetOptions.from_values({
        **{p.name: o[p.name] for p in fleet_run.PARAMS},
        **{k: run[k] for k in ("trials", "name", "order_seed", "timeout")},
        "command": fleet_run.recorded_command(args.argv)})
    if o["pairs"]:
        return _pairs(args, o, prep, opts, console)
    for flag in ("partners", "second_pass"):
        if flag in args.given:
            raise UsageError(f"--{flag.replace('_', '-')} applies with --pairs")
    fleet_run.check(prep.base, opts)
    common.check_output(o["output"], "--output")
    hooks = _hooks(console, prep.note, lambda s: f"fleet of {len(s.nodes)} node(s): {s.workload} x {s.plan.trials} "
                   f"trial(s) each (up to {s.plan.max_trials} where unsettled), {s.parallel} at once")
    result = fleet_run.run_fleet(prep.base, run["store"], opts, hooks)
    _show(console, o["format"], o["output"], report.render(o["format"], result),
          lambda: report.terminal(console, result))
    console.print(f"experiment {result.id} in {run['store']} (gpuvs report {result.id} --format html -o fleet.html)",
                  style="dim")
    failed = [r for r in result.rows if r.verdict == "failed"]
    if failed:
        raise RunFailed(f"{len(failed)} node(s) ran no trial: " + "; ".join(f"{r.node}: {r.reason}" for r in failed))


def _pairs(args: Args, o, prep, opts: fleet_run.FleetOptions, console: Console) -> None:
    """gpuvs fleet collective --pairs: the pair fleet (fleet/execute/pair_run.py), its report (report/pair_fleet.py)."""
    from gpuvs.fleet.execute import pair_run
    from gpuvs.report import pair_fleet

    if o["format"] not in pair_fleet.FORMATS:
        raise UsageError(f"--format {o['format']}: a pair fleet is reported as {', '.join(pair_fleet.FORMATS)}")
    common.check_output(o["output"], "--output")
    hooks = _hooks(console, prep.note, lambda s: f"pair fleet of {len(s.nodes)} node(s): {s.workload}, {opts.trials} "
                   f"trial(s) per pair, {s.parallel} pair(s) at once")
    plan = pairs.PairPlan(partners=o["partners"], second=o["second_pass"])
    result = pair_run.run_pair_fleet(prep.base, prep.run["store"], opts, plan, hooks)
    _show(console, o["format"], o["output"], pair_fleet.render(o["format"], result),
          lambda: console.print(pair_fleet.text(result), end=""))
    console.print(f"experiment {result.id} in {prep.run['store']} (gpuvs report {result.id})", style="dim")
    if result.failed:
        raise RunFailed(f"{len(result.failed)} pair(s) ran no trial: "
                        + "; ".join(f"{k}: {v}" for k, v in sorted(result.failed.items())))


def _hooks(console: Console, note: str, started: Callable[[fleet_run.FleetStart], str]) -> fleet_run.FleetHooks:
    """What the node fleet and the pair fleet say while they run; `started`: the line on what is about to run."""

    def on_start(s: fleet_run.FleetStart) -> None:
        common.say_note(console, note)
        for e in s.excluded:
            console.print(safe_text(f"node {e.node}: left out, {e.reason}"), style="yellow")
        console.print(started(s), style="dim")

    def on_end(r: TrialResult) -> None:
        console.print(terminal.trial_line(r), style=None if r.ok else "red", highlight=False)

    def on_log(line: str) -> None:
        print(safe_text(f"gpuvs fleet: {line}"), file=sys.stderr, flush=True)

    return fleet_run.FleetHooks(on_start, on_end, on_log)


def _show(console: Console, fmt: str, output: str | None, text: str, show: Callable[[], None]) -> None:
    """A report: written to --output and shown in the terminal, shown (term), or on standard output as `text`."""
    if output:
        common.write_output(output, text, "--output")
        show()
        console.print(f"wrote {output}", style="dim")
    elif fmt == "term":
        show()
    else:
        sys.stdout.write(text)


def _fleet_run_options() -> tuple:
    """The run options, with the fleet's own default of --trials (help tells the truth)."""
    return tuple(dataclasses.replace(p, default=DEFAULT_TRIALS, help=f"trials per node, each in its own pod "
                                     f"(at least {MIN_TRIALS})") if p.name == "trials" else p
                 for p in options.RUN_OPTIONS)


HISTORY_FORMATS = ("term", "md", "html", "json")
HISTORY_OPTIONS = (
    *fleet_history.READ,  # the report's format and file between the reading and the writing, as help shows them
    Param("format", str, "term", "report format", choices=HISTORY_FORMATS),
    Param("output", str, None, "write the report here (else standard output)", aliases=("o",)),
    *fleet_history.WRITE,
    STORE,
)


def history(args: Args) -> None:
    """Each node's history across the stored fleet runs, its drift verdict and change points."""
    from gpuvs.report import history as report_history

    o = args.options
    node = args.positionals[0] if args.positionals else None
    request = fleet_history.HistoryRequest.from_values({**{p.name: o[p.name] for p in fleet_history.PARAMS},
                                                        "node": node})
    common.check_output(o["output"], "--output")
    console = Console(markup=False, highlight=False, stderr=o["format"] != "term" and not o["output"])

    def on_read(found) -> None:
        if o["format"] == "html":
            from gpuvs.report import status

            text = status.render_history(found, request.node)
        else:
            text = report_history.render(o["format"], found, request.node)
        _show(console, o["format"], o["output"], text, lambda: report_history.terminal(console, found, request.node))

    def on_labels(written) -> None:
        for lab in written:
            console.print(safe_text(f"label {lab.node}: {lab.labels} ({lab.status})"))

    result = fleet_history.run_fleet_history(request, o["store"], fleet_history.HistoryHooks(on_read, on_labels))
    for sig in result.signals:
        console.print(safe_text(f"{sig.what} {sig.node}: {sig.detail} ({sig.status})"))


HISTORY = Command(
    "history", "Each node against its own past: its speed at each stored fleet run, its drift verdict and change "
    "points, slow and drifting nodes first.", history,
    groups=(Group("history options", HISTORY_OPTIONS, "history"),),
    positionals=(Positional("node", "only this node (its drift is still judged against the whole fleet)",
                            required=False),),
    notes="Reads the store's gpuvs fleet runs; runs nothing. See docs/history.md.",
)

COMMAND = Command(
    "fleet", "Find the slow nodes: the same workload in a pod on every GPU node, each node compared with the fleet.",
    fleet,
    # the fleet's options first: its --label (node labels) wins over the pod option of that name
    groups=(Group("fleet options", FLEET_OPTIONS, "fleet"), options.run_group(_fleet_run_options()),
            *options.env_groups(node_kinds(), env=dataclasses.replace(environments.env_param(),
                                                                      default=node_kinds()[0]))),
    positionals=(Positional("workload", workload=True),),
    usage="WORKLOAD --image IMAGE [fleet options] [workload options] [pod options]",
    notes="Runs WORKLOAD in a pod on every GPU node, compares each node with the fleet. See docs/fleet.md.",
    subcommands=(HISTORY,),
)
