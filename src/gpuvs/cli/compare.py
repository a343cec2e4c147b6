"""gpuvs compare: arms of one workload, trials interleaved (A B B A ...), and a verdict per metric.

    gpuvs compare WORKLOAD [options] --arm NAME:key=value[,key=value...] --arm ... [--trials N]
                  [--margin 0.02] [--until-confident --max-trials N] [--confidence 0.95]
    gpuvs compare --file experiments/X.yaml [--trials N] [--store PATH] [--quiet] [other options]
    gpuvs compare --stored BEFORE[:ARM] AFTER[:ARM] [--margin 0.02] [--confidence 0.95] [--store PATH]

Exit status: 0 when every trial ran (whatever the verdict), 1 when a trial failed, 2 on bad input."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import typer
from rich.console import Console

from gpuvs import comparison, experiment, workloads
from gpuvs.cli import app
from gpuvs.cli import options as opt
from gpuvs.cli.info import options_table, param_table
from gpuvs.cli.run import PASS_THROUGH, execute, finish, prepare
from gpuvs.errors import UsageError
from gpuvs.experiment import STUDY_PARAMS, Study
from gpuvs.params import Param
from gpuvs.records import ExperimentMeta
from gpuvs.report import terminal
from gpuvs.runner import Experiment, TrialResult, validate_spec
from gpuvs.sequential import Plan
from gpuvs.store import Store

COMPARE_OPTIONS = (
    Param("arm", str, None, "an arm: NAME:key=value[,key=value...] (two or more; the first is the baseline)",
          multiple=True),
    Param("file", str, None, "an experiment file (YAML) that names the workload and the arms"),
) + tuple(p for p in STUDY_PARAMS if p.name in ("margin", "confidence", "until_confident", "max_trials"))

# RUN_OPTIONS that an experiment file also knows (under its own key name).
FILE_KEYS = {"device": "device", "num_gpus": "num_gpus", "trials": "trials", "timeout": "timeout_s",
             "retries": "retries", "telemetry_interval": "telemetry_interval_s", "order_seed": "order_seed", "name": "name"}
SUMMARY_TABLES = ("verdicts", "speedup", "scaling", "per_trial", "failures")


def _on_command_line(args: list[str], name: str) -> bool:
    option = "--" + name.replace("_", "-")
    return any(a == option or a.startswith(option + "=") for a in args)


def _file_arg(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--file":
            if i + 1 >= len(args):
                raise UsageError("--file needs a value: an experiment file (YAML)")
            return args[i + 1]
        if a.startswith("--file="):
            return a.split("=", 1)[1]
    return None


def _given(values: dict, group, keep: bool = False) -> list[tuple[Param, Any]]:
    """(Param, raw value) of the options of `group` given on the command line, taken out of the
    values options.parse returned (keyed by Param, or by name) unless `keep`."""
    out = []
    for p in group:
        for key in (p, p.name):
            if key in values:
                out.append((p, values[key] if keep else values.pop(key)))
                break
    return out


def compare_help(workload) -> None:
    console = Console(markup=False, highlight=False)
    console.print("usage: gpuvs compare WORKLOAD [options] --arm NAME:key=value[,key=value...] --arm ...\n"
                  "       gpuvs compare --file experiments/X.yaml [options that replace the file's]\n"
                  "       gpuvs compare --stored BEFORE[:ARM] AFTER[:ARM] [--margin M] [--confidence C] [--store PATH]\n"
                  "An arm's keys: device, num_gpus, timeout_s, env, environment options, or workload parameters.")
    if workload is None:
        console.print(f"workloads: {', '.join(workloads.names())}")
    else:
        console.print(param_table(workload))
    for title, group in [("compare options", _as_compare_uses(COMPARE_OPTIONS)),
                         ("run options", _as_compare_uses(opt.RUN_OPTIONS)), *opt.env_groups()]:
        console.print(options_table(title, group))


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


def study_from_args(args: list[str], console: Console) -> tuple[Study, dict[str, Any]]:
    """`WORKLOAD [options] --arm ...` -> (study, run options)."""
    # prepare() refuses stray positional arguments and keeps this command's own options in `rest`
    prep = prepare(args, "gpuvs compare", console, extra_groups=(COMPARE_OPTIONS,), help_fn=compare_help)
    cmp = opt.take(prep.rest, COMPARE_OPTIONS)
    raw = [experiment.parse_arm(text) for text in cmp["arm"] or []]
    if len(raw) < 2:
        raise UsageError(f"gpuvs compare needs two or more --arm NAME:key=value[,key=value...], got {len(raw)}")
    arms = experiment.build_arms(prep.workload, prep.base,
                                 [(name, o, f"--arm #{i + 1}", {}) for i, (name, o) in enumerate(raw)])
    run = prep.run
    trials = run["trials"] if _on_command_line(args, "trials") else experiment.DEFAULT_TRIALS
    until, max_trials = cmp["until_confident"], cmp["max_trials"]
    if max_trials is not None and not until:
        raise UsageError("--max-trials applies with --until-confident")
    if until and max_trials is None:
        max_trials = max(experiment.DEFAULT_MAX_TRIALS, trials)
    name = run["name"] or f"{prep.workload.name}: " + " vs ".join(a.name for a in arms)
    exp = Experiment(name=name, base=prep.base, arms=arms, trials=trials, seed=run["order_seed"], kind="compare",
                     meta=ExperimentMeta(margin=cmp["margin"], confidence=cmp["confidence"]))
    return Study(exp, margin=cmp["margin"], confidence=cmp["confidence"], until_confident=until,
                 max_trials=max_trials, retries=run["retries"]), run


def study_from_file(path: str, args: list[str]) -> tuple[Study, dict[str, Any]]:
    """`--file X.yaml [options]` -> (study, run options); options given replace the file's values."""
    doc = experiment.read_file(path)
    try:
        workload = workloads.get(str(doc.get("workload")))
    except UsageError:
        experiment.load(path)  # raises the located message
        raise
    groups = (opt.RUN_OPTIONS, opt.ENV_OPTIONS, COMPARE_OPTIONS, workload.params)
    _, values = opt.parse(args, groups, positional=0, what="gpuvs compare --file")
    given = {p.name: v for p, v in _given(values, COMPARE_OPTIONS + opt.ENV_OPTIONS)}
    if given.pop("arm", None):
        raise UsageError("--arm cannot be combined with --file: the file lists the arms")
    given.pop("file", None)
    cli: dict[str, Any] = {"params": {p.name: v for p, v in _given(values, workload.params)}}
    for p in COMPARE_OPTIONS + opt.ENV_OPTIONS:
        if p.name in given:
            cli[p.name] = p.coerce(given[p.name])
    for p, v in _given(values, opt.RUN_OPTIONS, keep=True):
        if p.name in FILE_KEYS:
            cli[FILE_KEYS[p.name]] = p.coerce(v)
    run = opt.take(values, opt.RUN_OPTIONS)
    return experiment.load(path, cli), run


def until_confident(study: Study, console: Console):
    """The Runner's `more` hook: add a pair of trials per arm (A B | B A) until every arm's headline
    verdict is settled, or the cap is hit."""
    exp = study.experiment

    def more(results: list[TrialResult]) -> int:
        a = comparison.from_results(exp, results, study.margin, study.confidence)
        per_arm = exp.trials
        empty = [arm.name for arm in a.arms if arm.n_ok == 0]
        if empty:
            console.print(f"until-confident: stopping; arm {empty[0]} has no successful trial", style="yellow")
            return 0
        if a.settled():
            console.print(f"until-confident: settled after {per_arm} trials per arm", style="green")
            return 0
        if per_arm >= study.max_trials:
            console.print(f"until-confident: not settled after {per_arm} trials per arm (--max-trials "
                          f"{study.max_trials})", style="yellow")
            return 0
        add = min(2, study.max_trials - per_arm)
        console.print(f"until-confident: not settled after {per_arm} trials per arm; adding {add} per arm",
                      style="dim")
        return add

    return more


STORED_OPTIONS = (
    Param("stored", str, None, "two stored experiments, before and after: --stored A[:ARM] B[:ARM] (no trials run)",
          multiple=True),
    Param("store", str, "gpuvs.db", "SQLite file that keeps the results"),
) + tuple(p for p in STUDY_PARAMS if p.name in ("margin", "confidence"))


def stored_args(args: list[str]) -> list[str]:
    """`--stored A B` takes two values: as `--stored A --stored B` for the option parser."""
    out, i = [], 0
    while i < len(args):
        if args[i] == "--stored":
            values = []
            while i + 1 < len(args) and not args[i + 1].startswith("--") and len(values) < 2:
                values.append(args[i + 1])
                i += 1
            out += [x for v in values for x in ("--stored", v)] or ["--stored"]
        else:
            out.append(args[i])
        i += 1
    return out


def compare_stored(args: list[str], console: Console) -> None:
    """gpuvs compare --stored A B: the verdicts of two stored experiments, marked as not interleaved."""
    from gpuvs.cli.results import open_store

    _, values = opt.parse(stored_args(args), (STORED_OPTIONS,), positional=0, what="gpuvs compare --stored")
    got = opt.take(values, STORED_OPTIONS)
    refs = got["stored"] or []
    if len(refs) != 2:
        raise UsageError(f"--stored needs two experiments, before and after (EXPERIMENT[:ARM]), got {len(refs)}")
    with open_store(got["store"]) as st:
        analysis = comparison.from_stored(st, refs[0], refs[1], got["margin"], got["confidence"])
    terminal.comparison(console, analysis, keys=("verdicts", "arms", "per_trial", "failures", "fingerprints"))


@app.command(context_settings=PASS_THROUGH, add_help_option=False)
def compare(ctx: typer.Context) -> None:
    """Compare arms: gpuvs compare WORKLOAD --arm A:key=value --arm B:key=value [--trials N] | --file X.yaml
    | --stored A B"""
    console = Console(markup=False, highlight=False)
    args = list(ctx.args)
    if any(a == "--stored" or a.startswith("--stored=") for a in args):
        compare_stored(args, console)
        return
    path = _file_arg(args)
    if path is not None and not any(a in ("--help", "-h") for a in args):
        study, run = study_from_file(path, args)
    else:
        study, run = study_from_args(args, console)
    exp = study.experiment
    for arm in exp.arms:  # refuse before anything starts, naming the arm
        try:
            validate_spec(exp.spec_for(arm, 0))
        except UsageError as exc:
            raise UsageError(f"arm {arm.name}: {exc}") from None
    exp.meta.command = "gpuvs compare " + shlex.join(args)
    if study.until_confident and exp.trials < 2:
        exp.trials = 2
    if study.until_confident:  # the looks are planned now, so that the stopping rule can spend alpha over them
        exp.meta.sequential = Plan(first=exp.trials, cap=max(study.max_trials, exp.trials), step=2)
    more = until_confident(study, console) if study.until_confident else None
    results = execute(exp, run["store"], console, run["quiet"], run["timeout"], study.retries, progress=True,
                      more=more)
    with Store(run["store"]) as st:
        analysis = comparison.from_store(st, exp.id, with_steps=False)
    terminal.comparison(console, analysis, keys=SUMMARY_TABLES)
    console.print(f"experiment {exp.id} (gpuvs report {exp.id} --format html -o report.html)", highlight=False)
    finish(results)
