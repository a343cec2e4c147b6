"""gpuvs advise-mps "A ..." "B ...": predict from short solo runs whether two jobs should share the
GPU under MPS or by time-slicing, then check the prediction with a short measured run. The study is
gpuvs.sharing.advisor's; this module parses and renders."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.command import Args, Command, Positional
from gpuvs.cli.command import Group as Options
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.store.records import ExperimentMeta
from gpuvs.report import sharing, terminal
from gpuvs.report.sharing import ratio_text
from gpuvs.trial.runner import Runner, validate_spec
from gpuvs.safetext import safe_text
from gpuvs.sharing import matrix
from gpuvs.sharing.advisor import PairRuns, measure, unsettled_why, verdicts
from gpuvs.sharing.stats import repeats_plan
from gpuvs.sharing.group import Coordinator, check_shareable, gpu_memory_total_mib
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store

MAX_DURATION_TIMES = 4  # the default cap of a calibrated window, in --duration

ADVISE_OPTIONS = (
    Param("duration", float, 10.0, "seconds of each measured window at least (each job's first solo window; windows "
          "are calibrated from it up to --max-duration)", min=0.5, max=3600),
    Param("max_duration", float, None, "longest calibrated window: a job or pair with too few or too uneven steps for "
          f"its rate's error to be within 1% in --duration gets a longer window, up to this (default: "
          f"{MAX_DURATION_TIMES} x --duration; at --duration: every window --duration)", min=0.5, max=36000),
    Param("margin", float, 0.05, "work ratio (MPS / time-sliced) within which both count as equal", min=0, max=0.9),
    Param("repeats", int, 3, "fresh process groups per run (the verdict needs 2 or more)", min=1, max=1000),
    Param("max_repeats", int, 8, "add repeats, one at a time and only for pairs not yet settled, until the measured "
          "verdict settles or this cap (compare --until-confident's sequential rule); at or below --repeats: a fixed "
          "count", min=1, max=1000),
    Param("json", str, None, "also write the prediction and the measured verdict to this JSON file (rewritten "
          "after every repeat)"),
    Param("predict_only", bool, False, "run each job alone and predict; measure no pair"),
    Param("pairs", str, None, "a YAML file with pairs: [[JOB_A, JOB_B], ...]: each job alone once per repeat, "
          "every pair together; one predicted-against-measured table with the hit rate"),
)


def advise_mps(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    jobs = args.positionals
    ao = args.group("advise-mps")
    if ao["pairs"]:
        if jobs:
            raise UsageError("advise-mps takes either two quoted jobs or --pairs FILE, not both")
        data = matrix.load(ao["pairs"])
        if data.get("sweep"):
            raise UsageError(f"{ao['pairs']}: advise-mps --pairs reads only 'pairs' (no 'sweep')")
        texts = [(str(x), str(y)) for x, y in data["pairs"]]
    elif len(jobs) != 2:
        raise UsageError('advise-mps wants two quoted jobs, e.g. gpuvs advise-mps "kernels --app srad" '
                         '"kernels --app hotspot", or --pairs FILE')
    else:
        texts = [(jobs[0], jobs[1])]
    run = args.group("run")
    env = options.env_spec(args.group("env"))
    device = common.resolve_device(run["device"], env, console)
    base = RunSpec(workload="selftest", device=device, env=env, timeout_s=run["timeout"])
    specs: dict[str, RunSpec] = {}
    for text in [t for pair in texts for t in pair]:
        if text not in specs:
            specs[text] = common.job_spec(text, base)
            check_shareable(specs[text])
            validate_spec(specs[text])
    max_window = ao["max_duration"] if ao["max_duration"] is not None else MAX_DURATION_TIMES * ao["duration"]
    if max_window < ao["duration"]:
        raise UsageError(f"--max-duration {ao['max_duration']:g} is shorter than --duration {ao['duration']:g}: "
                         "the longest calibrated window must be at least the shortest")
    plan = repeats_plan(ao["repeats"], ao["max_repeats"])
    pairs = [PairRuns(x, y, plan=plan, margin=ao["margin"]) for x, y in texts]
    exp_id = common.experiment_id()
    for s in specs.values():
        s.experiment_id = exp_id
    total = gpu_memory_total_mib(device)
    with Store(run["store"]) as store:
        store.create_experiment(exp_id, run["name"] or f"advise-mps {len(pairs)} pair(s)", "advise-mps",
                                ExperimentMeta(pairs=texts, options=ao))
        runner = Runner(store, timeout_s=run["timeout"] + max_window)
        coord = Coordinator(runner, ao["duration"], say=lambda s: console.print("  " + safe_text(s)))
        save = (lambda: _write_json(ao["json"], pairs, total, ao["margin"])) if ao["json"] else (lambda: None)
        measure(coord, specs, pairs, ao["repeats"], device.startswith("cuda"), save, ao["predict_only"],
                heading=lambda text: terminal.heading(console, text), max_window_s=max_window,
                say=lambda s: console.print("  " + safe_text(s)))
    if len(pairs) == 1:
        _one_pair(console, pairs[0], total, ao["margin"])
    else:
        table, hit_rate = sharing.advise_pairs_table(pairs, total, ao["margin"])
        console.print(table)
        console.print(hit_rate, style="bold")
        for n, pr in enumerate(pairs, 1):
            if pr.window is not None:
                console.print(f"pair {n}: {safe_text(pr.window.reason)}")
            why = unsettled_why(pr.verdict())
            if why:
                console.print(f"{safe_text(pr.a)} + {safe_text(pr.b)}: {why}")
    console.print(f"stored as experiment {exp_id} in {run['store']}", style="dim")


def _one_pair(console, pr: PairRuns, total, margin: float) -> None:
    solo, advice, verdict = verdicts(pr, total, margin)
    console.print(sharing.advise_table((pr.a, pr.b), pr.runs, pr.work, total))
    for label, win in [*pr.solo_windows.items(), *([("A+B", pr.window)] if pr.window else [])]:
        console.print(f"{label}: {safe_text(win.reason)}")
    note = next((g.gpm_note for g in pr.runs["A alone"] + pr.runs["B alone"] if g.gpm_note), "")
    console.print(f"prediction: {advice.prediction} (from {advice.source}{': ' + note if note else ''})", style="bold")
    for reason in advice.reasons:
        console.print(f"  - {reason}")
    if verdict is None or verdict.ratio is None:
        console.print("measured: no verdict (MPS needs a GPU, or a run failed)")
        return
    settled = verdict.words != "inconclusive"
    why = unsettled_why(verdict)
    console.print(f"measured: {verdict.words} (work with MPS / time-sliced {ratio_text(verdict)}, "
                  f"{verdict.comparison.have or verdict.comparison.n_b} repeats); "
                  + (f"prediction {'confirmed' if verdict.words == advice.prediction else 'NOT confirmed'}"
                     if settled else why or f"no verdict yet: about {verdict.more_trials or 'many'} more repeat(s) "
                     "would settle it"), style="bold")


def _write_json(path: str, pairs: list[PairRuns], total, margin: float) -> None:
    out = []
    for pr in pairs:
        solo, advice, verdict = verdicts(pr, total, margin)
        ok = verdict is not None and verdict.ratio is not None
        out.append({"a": pr.a, "b": pr.b, "predicted": advice.prediction, "source": advice.source,
                    "predicted_ratio": advice.ratio, "reasons": advice.reasons,
                    "measured": verdict.words if ok else None, "measured_ratio": verdict.ratio if ok else None,
                    "measured_ci": [verdict.ci_low, verdict.ci_high] if ok else None,
                    "repeats": len(pr.work["A+B, MPS"]) or len(pr.work["A+B"]),
                    "unsettled_why": unsettled_why(verdict) if ok else None,
                    "window": pr.window.to_dict() if pr.window else None,
                    "solo_windows": {k: w.to_dict() for k, w in pr.solo_windows.items()},
                    "work": pr.work, "solo": [{"telemetry": t, "gpm": g, "memory_mib": m} for t, g, m in solo]})
    try:
        Path(path).write_text(json.dumps(out if len(out) > 1 else out[0], indent=1) + "\n")
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot write it: {exc.strerror}") from None


COMMAND = Command(
    "advise-mps", "Should jobs A and B share the GPU under MPS or by time-slicing? A prediction from short solo "
    "runs, checked by a short measured run.", advise_mps,
    groups=(Options("advise-mps options", ADVISE_OPTIONS, "advise-mps"), options.run_group(), *options.env_groups()),
    positionals=(Positional("job_a", "the first job, quoted: \"WORKLOAD [--param value ...]\"", required=False),
                 Positional("job_b", "the second job, quoted", required=False)),
    usage='"WORKLOAD_A [--param value ...]" "WORKLOAD_B [...]" [options]\n'
          "--pairs FILE [options]   (a list of pairs: predicted against measured)",
)
