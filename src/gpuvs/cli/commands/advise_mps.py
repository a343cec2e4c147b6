"""gpuvs advise-mps "A ..." "B ...": should two jobs share the GPU under MPS or by time-slicing?

It predicts from short solo runs, then checks the prediction with a short measured run.
The run is gpuvs.sharing.share_run's; this module parses and renders."""

from __future__ import annotations

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.declaration import Args, Command, Positional
from gpuvs.cli.declaration import Group as Options
from gpuvs.report import sharing, terminal
from gpuvs.report.sharing import ratio_text
from gpuvs.safetext import safe_text
from gpuvs.sharing.advisor import PairRuns, unsettled_why, verdicts
from gpuvs.sharing.share_run import ADVISE_PARAMS, AdviseRequest, SharingHooks, run_advise_mps


def advise_mps(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    run = args.group("run")
    request = AdviseRequest.from_values(args.group("advise-mps"), jobs=args.positionals, parse_job=common.job_spec,
                                        env=args.group("env"), device=run["device"],
                                        device_default=common.device_default(console), name=run["name"],
                                        timeout_s=run["timeout"])
    hooks = SharingHooks(heading=lambda text: terminal.heading(console, text),
                         say=lambda s: console.print("  " + safe_text(s)))
    result = run_advise_mps(request, run["store"], hooks)
    pairs, total, margin = result.pairs, result.memory_total_mib, result.margin
    if len(pairs) == 1:
        _one_pair(console, pairs[0], total, margin)
    else:
        table, hit_rate = sharing.advise_pairs_table(pairs, total, margin)
        console.print(table)
        console.print(hit_rate, style="bold")
        for n, pr in enumerate(pairs, 1):
            if pr.window is not None:
                console.print(f"pair {n}: {safe_text(pr.window.reason)}")
            why = unsettled_why(pr.verdict())
            if why:
                console.print(f"{safe_text(pr.a)} + {safe_text(pr.b)}: {why}")
    console.print(f"stored as experiment {result.experiment_id} in {run['store']}", style="dim")


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


COMMAND = Command(
    "advise-mps", "Should jobs A and B share the GPU under MPS or by time-slicing? A prediction from short solo "
    "runs, checked by a short measured run.", advise_mps,
    groups=(Options("advise-mps options", ADVISE_PARAMS, "advise-mps"), options.run_group(), *options.env_groups()),
    positionals=(Positional("job_a", "the first job, quoted: \"WORKLOAD [--param value ...]\"", required=False),
                 Positional("job_b", "the second job, quoted", required=False)),
    usage='"WORKLOAD_A [--param value ...]" "WORKLOAD_B [...]" [options]\n'
          "--pairs FILE [options]   (a list of pairs: predicted against measured)",
)
