"""gpuvs fleet WORKLOAD [options]: the same workload on every GPU node of a cluster (one pod per trial,
pinned to its node), each node compared with the fleet; which nodes are slower, by how much, how sure.
gpuvs fleet history [NODE] [options]: each node against its own past, from the stored fleet runs.

    gpuvs fleet spin --device cpu --image IMAGE [--nodes a,b,c] [--node-label KEY[=VALUE]] [--all-nodes]
                [--trials 4 --max-trials 12] [--parallel N] [--reference NODE] [--margin 0.05]
                [--label [--condition] [--taint [--taint-effect E] [--taint-max-share 0.1]] [--dry-run]]
                [--format term|md|html|json|csv -o FILE] [pod options]

    gpuvs fleet collective --pairs --device cpu --image IMAGE [--partners 4] [--second-pass 2] [--trials 4]
                [--parallel N] [--nodes a,b,c] [--label [--dry-run]] [--format term|md|html|json -o FILE] [pod options]

    gpuvs fleet history [NODE] [--workload W] [--format term|md|html|json -o FILE] [--label [--condition] [--dry-run]]

Exit status: 0 when the fleet ran (whatever the verdicts), 1 when a node ran no trial, 2 on bad input."""

from __future__ import annotations

import dataclasses
import shlex
import sys

from rich.console import Console

from gpuvs import environments
from gpuvs.cli import common, options
from gpuvs.cli.options import STORE
from gpuvs.cli.command import Args, Command, Group, Positional
from gpuvs.errors import RunFailed, UsageError
from gpuvs.fleet import labels, pairs
from gpuvs.fleet import run as fleet_run
from gpuvs.fleet.run import DEFAULT_TRIALS, MIN_TRIALS, node_kinds
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


def _nodes_arg(items: list[str] | None) -> list[str] | None:
    names = [n.strip() for item in items or [] for n in str(item).split(",") if n.strip()]
    return names or None


def fleet(args: Args) -> None:
    o = args.group("fleet")
    # a report in another format on stdout: progress goes to stderr
    console = Console(markup=False, highlight=False, stderr=o["format"] != "term" and not o["output"])
    prep = common.prepare(args, console)
    run = prep.run
    opts = fleet_run.FleetOptions(
        nodes=_nodes_arg(o["nodes"]), node_labels=o["node_label"], all_nodes=o["all_nodes"], reference=o["reference"],
        parallel=o["parallel"], trials=run["trials"], max_trials=o["max_trials"], margin=o["margin"],
        confidence=o["confidence"], label=o["label"], dry_run=o["dry_run"], name=run["name"],
        condition=o["condition"], taint=o["taint"], taint_effect=o["taint_effect"],
        taint_max_share=o["taint_max_share"], per_gpu=o["per_gpu"],
        order_seed=run["order_seed"], timeout_s=run["timeout"], command="gpuvs fleet " + shlex.join(args.argv))
    if o["pairs"]:
        return _pairs(args, o, prep, opts, console)
    for flag in ("partners", "second_pass"):
        if flag in args.given:
            raise UsageError(f"--{flag.replace('_', '-')} applies with --pairs")
    fleet_run.check(prep.base, opts)
    common.check_output(o["output"], "--output")

    def on_start(s: fleet_run.FleetStart) -> None:
        for e in s.excluded:
            console.print(safe_text(f"node {e.node}: left out, {e.reason}"), style="yellow")
        console.print(f"fleet of {len(s.nodes)} node(s): {s.workload} x {s.plan.trials} trial(s) each "
                      f"(up to {s.plan.max_trials} where unsettled), {s.parallel} at once", style="dim")

    def on_end(r: TrialResult) -> None:
        console.print(terminal.trial_line(r), style=None if r.ok else "red", highlight=False)

    def on_log(line: str) -> None:
        print(safe_text(f"gpuvs fleet: {line}"), file=sys.stderr, flush=True)

    result = fleet_run.run_fleet(prep.base, run["store"], opts, fleet_run.FleetHooks(on_start, on_end, on_log))
    text = report.render(o["format"], result)
    if o["output"]:
        common.write_output(o["output"], text, "--output")
        report.terminal(console, result)
        console.print(f"wrote {o['output']}", style="dim")
    elif o["format"] == "term":
        report.terminal(console, result)
    else:
        sys.stdout.write(text)
    console.print(f"experiment {result.id} in {run['store']} (gpuvs report {result.id} --format html -o fleet.html)",
                  style="dim")
    failed = [r for r in result.rows if r.verdict == "failed"]
    if failed:
        raise RunFailed(f"{len(failed)} node(s) ran no trial: " + "; ".join(f"{r.node}: {r.reason}" for r in failed))


def _pairs(args: Args, o, prep, opts: fleet_run.FleetOptions, console: Console) -> None:
    """gpuvs fleet collective --pairs: the pair fleet (fleet/pair_run.py), its report (report/pair_fleet.py)."""
    from gpuvs.fleet import pair_run
    from gpuvs.report import pair_fleet

    if o["format"] not in pair_fleet.FORMATS:
        raise UsageError(f"--format {o['format']}: a pair fleet is reported as {', '.join(pair_fleet.FORMATS)}")
    common.check_output(o["output"], "--output")

    def on_start(s: fleet_run.FleetStart) -> None:
        for e in s.excluded:
            console.print(safe_text(f"node {e.node}: left out, {e.reason}"), style="yellow")
        console.print(f"pair fleet of {len(s.nodes)} node(s): {s.workload}, {opts.trials} trial(s) per pair, "
                      f"{s.parallel} pair(s) at once", style="dim")

    def on_end(r: TrialResult) -> None:
        console.print(terminal.trial_line(r), style=None if r.ok else "red", highlight=False)

    plan = pairs.PairPlan(partners=o["partners"], second=o["second_pass"])
    result = pair_run.run_pair_fleet(prep.base, prep.run["store"], opts, plan,
                                     fleet_run.FleetHooks(on_start, on_end))
    text = pair_fleet.render(o["format"], result)
    if o["output"]:
        common.write_output(o["output"], text, "--output")
        console.print(pair_fleet.text(result), end="")
        console.print(f"wrote {o['output']}", style="dim")
    elif o["format"] == "term":
        console.print(text, end="")
    else:
        sys.stdout.write(text)
    console.print(f"experiment {result.id} in {prep.run['store']} (gpuvs report {result.id})", style="dim")
    if result.failed:
        raise RunFailed(f"{len(result.failed)} pair(s) ran no trial: "
                        + "; ".join(f"{k}: {v}" for k, v in sorted(result.failed.items())))


def _fleet_run_options() -> tuple:
    """The run options, with the fleet's own default of --trials (help tells the truth)."""
    return tuple(dataclasses.replace(p, default=DEFAULT_TRIALS, help=f"trials per node, each in its own pod "
                                     f"(at least {MIN_TRIALS})") if p.name == "trials" else p
                 for p in options.RUN_OPTIONS)


HISTORY_FORMATS = ("term", "md", "html", "json")
HISTORY_OPTIONS = (
    Param("workload", str, None, "only this workload (default: every workload with stored fleet runs)"),
    Param("window", int, 10, "earlier runs the latest run is compared with (drift)", min=3, max=1000),
    Param("margin", float, 0.05, "equivalence margin of a node against its own past (0.05: ±5%)", min=0.0, max=0.5),
    Param("confidence", float, 0.95, "1 - the false-alarm rate for the whole fleet, per check", min=0.5, max=0.999),
    Param("format", str, "term", "report format", choices=HISTORY_FORMATS),
    Param("output", str, None, "write the report here (else standard output)", aliases=("o",)),
    Param("label", bool, False, "write gpuvs.io/drift (the verdict: slower, equivalent, ...; docs/vocabulary.md) and "
          "gpuvs.io/drift-ratio on the nodes of the latest run (needs one workload)"),
    Param("condition", bool, False, "with --label: the NodeCondition GpuvsPerformance=True DriftingSlower on a node "
          "drifting slower (cleared when it no longer is), with an Event (needs gpuvs deploy --condition's rights)"),
    Param("dry_run", bool, False, "with --label: show the labels, write nothing"),
    Param("kubeconfig", str, None, "with --label: kubeconfig file (default: KUBECONFIG, ~/.kube/config, else "
          "in-cluster)"),
    Param("context", str, None, "with --label: kubeconfig context"),
    STORE,
)


def history(args: Args) -> None:
    """Each node's history across the stored fleet runs, its drift verdict and change points."""
    from gpuvs.fleet import stored
    from gpuvs.report import history as report_history

    o, node = args.options, (args.positionals[0] if args.positionals else None)
    if o["dry_run"] and not o["label"]:
        raise UsageError("--dry-run applies with --label (it shows the labels instead of writing them)")
    if o["condition"] and not o["label"]:
        raise UsageError("--condition applies with --label (the node's drift is written as labels first)")
    common.check_output(o["output"], "--output")
    with common.open_store(o["store"]) as st:
        found = stored.read(st, workload=o["workload"], window=o["window"], margin=o["margin"],
                            confidence=o["confidence"])
        if not found.workloads:
            every = sorted({res.workload for _, res in stored.fleet_runs(st)[0]})
            if every:
                raise UsageError(f"--workload {o['workload']}: no stored fleet run of it in {o['store']} (workloads: "
                                 f"{', '.join(every)})")
            raise UsageError(f"no stored gpuvs fleet run in {o['store']} (run gpuvs fleet WORKLOAD --store "
                             f"{o['store']} first)")
    if node is not None and node not in found.nodes():
        raise UsageError(f"no node {node!r} in the stored fleet runs of {o['store']} (nodes: "
                         f"{', '.join(found.nodes())})")
    if o["label"] and len(found.workloads) > 1:
        raise UsageError("--label writes one workload's drift: give --workload (stored: "
                         f"{', '.join(w.workload for w in found.workloads)})")
    core = None
    if o["label"] and not o["dry_run"]:  # a cluster that cannot be reached says so before anything is shown
        from gpuvs.kube import client

        core = client.connect(o["kubeconfig"], o["context"]).core
    console = Console(markup=False, highlight=False, stderr=o["format"] != "term" and not o["output"])
    if o["format"] == "html":
        from gpuvs.report import status

        text = status.render_history(found, node)
    else:
        text = report_history.render(o["format"], found, node)
    if o["output"]:
        common.write_output(o["output"], text, "--output")
        report_history.terminal(console, found, node)
        console.print(f"wrote {o['output']}", style="dim")
    elif o["format"] == "term":
        report_history.terminal(console, found, node)
    else:
        sys.stdout.write(text)
    if o["label"]:
        w = found.workloads[0]
        changes = labels.plan_drift([n for n in w.nodes if node is None or n.node == node], workload=w.workload)
        if core is None:
            outcome = [(c.node, "dry run: not written") for c in changes]
        else:
            outcome = [(n, err or "written") for n, err in labels.apply(core, changes)]
        status = dict(outcome)
        for c in changes:
            console.print(safe_text(f"label {c.node}: {c.labels} ({status[c.node]})"))
        if o["condition"]:
            from gpuvs.fleet import signals

            measured = [n for n in w.nodes if node is None or n.node == node]
            for sig in signals.act_drift(core, measured, workload=w.workload, dry_run=core is None):
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
