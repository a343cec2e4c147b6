"""gpuvs share-matrix FILE: pairs of jobs x an input-size sweep x MPS off/on, in one execution-time table.

Each pair is measured alone and together in shared windows, as in the published MPS study's matrix.
The pairs file is gpuvs.sharing.matrix's, the run gpuvs.sharing.share_run's; this module parses and renders."""

from __future__ import annotations

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.declaration import Args, Command, Group, Positional
from gpuvs.report import terminal
from gpuvs.report.sharing import matrix_table
from gpuvs.safetext import safe_text
from gpuvs.sharing.share_run import MATRIX_PARAMS, MatrixRequest, SharingHooks, run_share_matrix

DEVICE, DURATION = MATRIX_PARAMS
SHARE_MATRIX_OPTIONS = (DEVICE, options.STORE, DURATION)  # the order help has always shown


def share_matrix(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    request = MatrixRequest.from_values(args.positionals[0], {"device": args["device"], "duration": args["duration"]},
                                        parse_job=common.job_spec, device_default=common.device_default(console))
    hooks = SharingHooks(heading=lambda text: terminal.heading(console, text),
                         say=lambda s: console.print("  " + safe_text(s)))
    result = run_share_matrix(request, args["store"], hooks)
    console.print(matrix_table(result.title, result.window_s, result.key, result.rows))
    console.print(f"stored as experiment {result.experiment_id} in {args['store']}", style="dim")


COMMAND = Command(
    "share-matrix", "Pairs x sizes x MPS off/on: each job alone, then both in one window; execution time per run.",
    share_matrix,
    groups=(Group("share-matrix options", SHARE_MATRIX_OPTIONS, "share-matrix"),),
    positionals=(Positional("file", "a pairs file, e.g. experiments/sharing/mps-kernel-pairs.yaml"),),
)
