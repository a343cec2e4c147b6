"""gpuvs results list | show | export."""

from __future__ import annotations

import json
import sys

from rich.console import Console

from gpuvs.cli.declaration import Args, Command, Group, Positional
from gpuvs.cli.common import check_output, open_store, write_output
from gpuvs.cli.options import STORE
from gpuvs.errors import UsageError
from gpuvs.store.records import TrialRecord
from gpuvs.params import Param
from gpuvs.report import results
from gpuvs.safetext import safe_text
from gpuvs.store.db import Store

OUTPUT = Param("output", str, None, "write here instead of standard output", aliases=("o",))


def list_results(args: Args) -> None:
    store = args["store"]
    with open_store(store) as st:
        found = st.experiments()
        Console(markup=False, highlight=False).print(results.experiments_table(store, found))


def show(args: Args) -> None:
    ident, as_json = args.positionals[0], args["json"]
    with open_store(args["store"]) as st:
        trials = _trials_of(st, ident)
        if args["log"]:
            _show_logs(st, trials)
            return
        if as_json:
            for t in trials:
                t.samples = st.samples(t.id)
            print(json.dumps([t.to_dict() for t in trials], indent=2, default=str))
            return
        console = Console(markup=False, highlight=False)
        console.print(results.trials_table(ident, trials))


def _show_logs(st: Store, trials: list[TrialRecord]) -> None:
    """Each trial's stored stdout and stderr (a command's), with what was cut and the cap. The store keeps what the
    job wrote; it is shown with its control characters escaped (newlines and tabs kept: safetext.py), so that no
    escape sequence a job printed reaches the terminal."""
    from gpuvs.workloads.command.job import HEAD, TAIL

    out = sys.stdout
    out.write(f"gpuvs keeps the first {HEAD // 1024} KiB and the last {TAIL // 1024} KiB of each stream of a command's "
              f"output; what lies between is cut, and said where it was cut.\n")
    for t in trials:
        head = f"trial {t.id} [{t.arm}] #{t.trial + 1}: {t.status}"
        if t.error:
            head += f" ({t.error})"
        out.write(f"\n=== {safe_text(head, lines=True)}\n")
        if (t.config or {}).get("samples_kept"):  # a long series stores some of its samples (job.Series)
            out.write(f"samples: {safe_text(t.config['samples_kept'])}\n")
        rows = st.outputs(t.id)
        if not rows:
            out.write("(no output stored: only the command workload keeps its job's output)\n")
        for row in rows:
            cut = f", {row.cut:,} bytes cut" if row.cut else ""
            out.write(f"--- {safe_text(row.stream)} ({row.bytes:,} bytes, {row.lines:,} lines{cut})\n")
            text = safe_text(row.text, lines=True)
            out.write(text if text.endswith("\n") or not text else text + "\n")


def _trials_of(st: Store, ident: str) -> list[TrialRecord]:
    """A trial number, else an experiment id, a unique prefix of one or its name (ids start with digits too)."""
    if ident.isdigit():
        try:
            return [st.trial(int(ident))]
        except UsageError:
            pass
    return st.trials(st.experiment(ident).id)


def export(args: Args) -> None:
    fmt_name, experiment, output = args["format"], args["experiment"], args["output"]
    check_output(output)
    with open_store(args["store"]) as st:
        exp_id = st.experiment(experiment).id if experiment else None
        text = st.export(fmt_name, exp_id)
    if output:
        write_output(output, text)
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


COMMAND = Command(
    "results", "Stored results: list, show, export.",
    subcommands=(
        Command("list", "One line per experiment: id, when, workload, trials ok of all.", list_results,
                groups=(Group("options", (STORE,), "results"),)),
        Command("show", "Every trial of an experiment (or one trial): status, figures, start-up, error, where it ran.",
                show, groups=(Group("options", (STORE, Param("json", bool, False, "every trial as JSON, samples "
                                                             "included"),
                                                Param("log", bool, False, "each trial's stored stdout and stderr (a "
                                                      "command's: its first 16 KiB and last 48 KiB of each)")),
                                    "results"),),
                positionals=(Positional("ident", "an experiment id (a unique prefix will do), its --name or a trial number"),)),
        Command("export", "Everything stored (spec, fingerprint, samples, summary, status, error) as JSON, or a CSV "
                "per trial.", export,
                groups=(Group("options", (Param("format", str, "json", "json or csv"),
                                          Param("experiment", str, None, "only this experiment"), OUTPUT, STORE),
                              "results"),)),
    ),
)
