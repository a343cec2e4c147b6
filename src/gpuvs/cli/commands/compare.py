"""gpuvs compare: arms of one workload, trials interleaved (A B B A ...), and a verdict per metric.

The arms come from --arm options, an experiment file (--file), or two stored experiments (--stored BEFORE AFTER).
Exit status: 0 when every trial ran, whatever the verdict; 2 on bad input. It is 1 when a trial failed, or when
--strict gave no verdict (the arms ran different programs unasked, or the machine was contended)."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from rich.console import Console

from gpuvs import workloads
from gpuvs.analysis import comparison, stored
from gpuvs.probes import contention
from gpuvs.trial import experiment
from gpuvs.cli import common, options
from gpuvs.cli.declaration import Args, Command, Form, Group, Positional
from gpuvs.errors import NoVerdict, UsageError
from gpuvs.trial.experiment import STUDY_PARAMS, Study
from gpuvs.trial.overrides import normalise_key
from gpuvs.params import Param
from gpuvs.report import terminal
from gpuvs.report.numbers import Units
from gpuvs.safetext import safe_text
from gpuvs.trial.study import Look, Ran, run_comparison

COMPARE_OPTIONS = (
    Param("arm", str, None, "an arm: NAME:key=value[,key=value...] (two or more; the first is the baseline)",
          multiple=True),
    Param("file", str, None, "an experiment file (YAML) that names the workload and the arms"),
    Param("stored", str, None, "two stored experiments (each an id, its start or its --name), before and after: "
          "--stored A[:ARM] B[:ARM] (no trials run)", multiple=True),
    Param("strict", bool, False, "no verdict where arms that did not ask to differ in the program ran different "
          "programs (another executable or version, another script), or where the machine was contended during the "
          f"trials (a load above the usable CPUs, CPU pressure above {100 * contention.PRESSURE_LIMIT:g}%, another process "
          "on the GPU): one line, exit "
          "status 1; the trials stay stored"),
) + tuple(p for p in STUDY_PARAMS if p.name in ("margin", "confidence", "until_confident", "max_trials", "aa"))

# after the trials' own tables (common.render_ran, where the time went among them: shown once)
SUMMARY_TABLES = ("verdicts", "speedup", "scaling", "per_trial", "failures")


def _file_arg(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--file":
            if i + 1 >= len(args):
                raise UsageError("--file needs a value: an experiment file (YAML)")
            return args[i + 1]
        if a.startswith("--file="):
            return a.split("=", 1)[1]
    return None


def _as_compare_uses(group) -> tuple[Param, ...]:
    """The defaults compare really uses, where they are not the run options' own: help tells the truth."""
    out = []
    for p in group:
        if p.name == "trials":
            p = dataclasses.replace(p, default=experiment.DEFAULT_TRIALS, help="trials per arm, each in a fresh "
                                    f"worker process ({experiment.DEFAULT_TRIALS} unless given)")
        elif p.name == "max_trials":
            p = dataclasses.replace(p, help=f"{p.help} (default: the larger of {experiment.DEFAULT_MAX_TRIALS} "
                                            "and --trials)")
        out.append(p)
    return tuple(out)


def study_from_args(args: Args, console: Console) -> tuple[Study, dict[str, Any]]:
    """`WORKLOAD [options] --arm ...` -> (study, run options): the mapping an experiment file would hold, loaded."""
    cmp, run = args.group("compare"), args.group("run")
    raw = [experiment.parse_arm(text) for text in cmp["arm"] or []]
    if len(raw) < 2 and not (cmp["aa"] and not raw):
        raise UsageError(f"gpuvs compare needs two or more --arm NAME:key=value[,key=value...], got {len(raw)}; "
                         "to compare a setup with itself (an A/A run), --aa alone")
    doc = common.run_doc(args)
    doc.update({k: run[k] for k in ("trials", "order_seed", "name", "retries")})  # trials: compare's default
    doc.update({k: cmp[k] for k in ("margin", "confidence", "until_confident", "max_trials", "aa")})
    for i, (name, overrides) in enumerate(raw):
        if "name" in overrides:
            raise UsageError(f"--arm #{i + 1}: arm {name!r}: its name is what comes before ':', not a key")
    if raw:  # --aa alone: the loader makes its two arms
        doc["arms"] = [{"name": name, **overrides} for name, overrides in raw]
    study = experiment.study(doc, device_default=common.device_default(console))
    return study, run


def file_workload(argv: list[str]) -> workloads.Workload:
    """The workload an experiment file names (`--file X.yaml`): its parameters are options of the command."""
    path = _file_arg(argv)
    doc = experiment.read_file(path)
    try:
        return workloads.get(experiment.workload_name(doc))
    except UsageError:
        experiment.load(path)  # raises the located message
        raise


def study_from_file(args: Args, console: Console) -> tuple[Study, dict[str, Any]]:
    """`--file X.yaml [options]` -> (study, run options); options given replace the file's values."""
    if "arm" in args.given:
        raise UsageError("--arm cannot be combined with --file: the file lists the arms")
    cli: dict[str, Any] = {"params": dict(args.params)}
    for name in list(args.group("compare")) + list(args.group("env")):
        if name in args.given and name not in ("arm", "file", "stored"):
            cli[name] = args[name]
    for name in args.group("run"):  # those an experiment file also knows, under its key's name
        key = normalise_key(name)
        if name in args.given and key in experiment.TOP_KEYS:
            cli[key] = args[name]
    return experiment.load(_file_arg(args.argv), cli, common.device_default(console)), args.group("run")


def look_hook(console: Console):
    """The stopping rule's looks as lines (--until-confident)."""

    def on_look(look: Look) -> None:
        text, style = terminal.look_line(look)
        console.print(text, style=style)

    return on_look


def compare_stored(args: Args, console: Console) -> None:
    """gpuvs compare --stored A B: the verdicts of two stored experiments, marked as not interleaved (two arms
    of one interleaved experiment are paired by round, as its own report pairs them)."""
    refs = args["stored"] or []
    if len(refs) != 2:
        raise UsageError(f"--stored needs two experiments, before and after (EXPERIMENT[:ARM]), got {len(refs)}")
    with common.open_store(args["store"]) as st:
        sides = stored.pick(st, refs[0], refs[1])
        analysis = stored.compare(sides, args["margin"], args["confidence"])
    refuse_if_strict(args, analysis)
    terminal.comparison(console, analysis, keys=("verdicts", "arms", "per_trial", "failures", "fingerprints"))
    console.print(safe_text(stored.pairs(sides)), style="dim", highlight=False, markup=False)


def refuse_if_strict(args: Args, analysis: comparison.Analysis, stored: str = "") -> None:
    """--strict: no verdict where arms that did not ask to differ in the program ran different programs, or where
    the trials were contended (analysis/disturbance.py)."""
    ran = analysis.programs
    if args["strict"] and ran is not None and ran.unasked:
        raise NoVerdict(ran.refusal() + stored)
    if args["strict"] and analysis.contended:
        said = "; ".join(text for d in analysis.contended for level, text in d.lines() if level == "warning")
        raise NoVerdict(f"no verdict (--strict): the machine was contended during the trials ({said}); run on a "
                        f"quiet machine (gpuvs doctor says what would disturb a measurement), or compare without "
                        f"--strict to see the verdict with this warning{stored}")


def run(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    if args.form is STORED:
        compare_stored(args, console)
        return
    if args.form is FILE:
        study, run = study_from_file(args, console)
    else:
        study, run = study_from_args(args, console)
    exp = study.experiment
    exp.meta.command = "gpuvs compare " + shlex.join(args.argv)
    up_to = study.max_trials * len(exp.arms) if study.until_confident and study.max_trials else None
    note = "" if args.form is FILE else common.cpu_note(args.workload, args.params, exp.base.device)
    units = Units()  # one unit per metric in the trial lines, the trials' tables and the verdicts' alike
    hooks = common.trial_hooks(console, run["quiet"], progress=True, up_to=up_to, note=note, units=units)
    ran: list[Ran] = []

    def on_ran(r: Ran) -> None:  # the trials' own tables, before the verdicts
        ran.append(r)
        common.render_ran(console, r, run["store"], units)

    hooks.on_look, hooks.on_ran = look_hook(console), on_ran
    analysis = run_comparison(study, run["store"], hooks, timeout_s=run["timeout"])
    refuse_if_strict(args, analysis, f"; every trial is stored as experiment {analysis.id} (gpuvs results show "
                                     f"{analysis.id})")
    terminal.comparison(console, analysis, keys=SUMMARY_TABLES, units=units)
    console.print(f"experiment {analysis.id} (gpuvs report {analysis.id} --format html -o report.html)",
                  highlight=False)
    common.finish(ran[0].results)


STORED = Form("stored", "--stored BEFORE[:ARM] AFTER[:ARM] [--margin M] [--confidence C] [--strict] [--store PATH]",
              options=("stored", "store", "margin", "confidence", "strict"), runs={"stored": 2})
FILE = Form("file", "--file experiments/X.yaml [options that replace the file's]", workload=file_workload)

COMMAND = Command(
    "compare", "Compare arms of one workload, trials interleaved (A B B A ...), with a verdict per metric.", run,
    groups=(Group("compare options", _as_compare_uses(COMPARE_OPTIONS), "compare"),
            options.run_group(_as_compare_uses(options.TRIAL_OPTIONS)), *options.env_groups()),
    positionals=(Positional("workload", workload=True),),
    usage="WORKLOAD [options] --arm NAME:key=value[,key=value...] --arm ...",
    notes="An arm's keys: device, num_gpus, timeout_s, env, environment options, or workload parameters. "
          "--aa without --arm: an A/A run, two arms (a, b) that run alike.",
    forms=(STORED, FILE),  # --stored first: it wins over --file
    help_when_bare=True,
)
