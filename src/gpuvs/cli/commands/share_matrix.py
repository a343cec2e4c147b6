"""gpuvs share-matrix FILE: pairs of jobs x an input-size sweep x MPS off/on, each pair measured alone
and together in shared windows; one execution-time table (the published MPS study's matrix). The pairs
file and the runs are gpuvs.sharing.matrix's; this module parses and renders."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gpuvs.cli import common, options
from gpuvs.cli.command import Args, Command, Group, Positional
from gpuvs.params import Param
from gpuvs.store.records import ExperimentMeta
from gpuvs.report import terminal
from gpuvs.report.sharing import matrix_table
from gpuvs.trial.runner import Runner, validate_spec
from gpuvs.safetext import safe_text
from gpuvs.sharing import matrix
from gpuvs.sharing.group import Coordinator, check_shareable
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store


SHARE_MATRIX_OPTIONS = (
    Param("device", str, None, "overrides the file's device"),
    options.STORE,
    Param("duration", float, None, "overrides the file's window seconds"),
)


def share_matrix(args: Args) -> None:
    file, device, store, duration = args.positionals[0], args["device"], args["store"], args["duration"]
    console = Console(markup=False, highlight=False)
    data = matrix.load(file)
    dev = common.resolve_device(device or data.get("device"), EnvSpec(), console)
    window = float(duration or data.get("duration", 8))
    (key, values), = (data.get("sweep") or {"": [None]}).items()
    base = RunSpec(workload="selftest", device=dev, timeout_s=float(data.get("timeout_s", 1800)))
    cases = []
    for a_text, b_text in data["pairs"]:
        for v in values:
            extra = f" --{key.replace('_', '-')} {v}" if key else ""
            a, b = common.job_spec(a_text + extra, base), common.job_spec(b_text + extra, base)
            for s in (a, b):
                check_shareable(s)
                validate_spec(s)
            cases.append(matrix.Case(a_text, b_text, v, a, b))
    modes = matrix.mps_modes(data.get("mps", "both")) if dev.startswith("cuda") else [False]
    exp_id = common.experiment_id()
    for case in cases:
        case.a.experiment_id = case.b.experiment_id = exp_id
    with Store(store) as st:
        st.create_experiment(exp_id, data.get("name") or Path(file).stem, "share-matrix", ExperimentMeta(file=data))
        coord = Coordinator(Runner(st), window, say=lambda s: console.print("  " + safe_text(s)))
        rows = matrix.measure(coord, cases, modes, key, heading=lambda text: terminal.heading(console, text))
    console.print(matrix_table(data.get('name', Path(file).stem), window, key, rows))
    console.print(f"stored as experiment {exp_id} in {store}", style="dim")


COMMAND = Command(
    "share-matrix", "Pairs x sizes x MPS off/on: each job alone, then both in one window; execution time per run.",
    share_matrix,
    groups=(Group("share-matrix options", SHARE_MATRIX_OPTIONS, "share-matrix"),),
    positionals=(Positional("file", "a pairs file, e.g. experiments/sharing/mps-kernel-pairs.yaml"),),
)
