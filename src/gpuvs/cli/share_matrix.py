"""gpuvs share-matrix FILE: pairs of jobs x an input-size sweep x MPS off/on, each pair measured alone
and together in shared windows; one execution-time table (the published MPS study's matrix)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from gpuvs.cli import app
from gpuvs.cli.run import resolve_device
from gpuvs.cli.share import job_spec, mps_modes
from gpuvs.errors import UsageError
from gpuvs.report.terminal import fmt
from gpuvs.runner import Runner, validate_spec
from gpuvs.sharing.group import Coordinator, check_shareable, normalized_sum
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store import Store

KEYS = {"name", "device", "duration", "mps", "pairs", "sweep", "timeout_s"}


def load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping with keys {', '.join(sorted(KEYS))}")
    unknown = set(data) - KEYS
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(KEYS))}")
    pairs = data.get("pairs")
    if not isinstance(pairs, list) or not pairs or not all(isinstance(x, list) and len(x) == 2 for x in pairs):
        raise UsageError(f"{path}: 'pairs' must be a list of [JOB_A, JOB_B] pairs of quoted jobs")
    sweep = data.get("sweep") or {}
    if not isinstance(sweep, dict) or len(sweep) > 1 or not all(isinstance(v, list) and v for v in sweep.values()):
        raise UsageError(f"{path}: 'sweep' must be one parameter with a list of values, e.g. sweep: {{scale: [small, full]}}")
    if data.get("mps", "both") not in ("off", "on", "both"):
        raise UsageError(f"{path}: 'mps' must be off, on or both")
    return data


@app.command("share-matrix")
def share_matrix(file: str = typer.Argument(..., help="a pairs file, e.g. experiments/sharing/mps-kernel-pairs.yaml"),
                 device: str = typer.Option(None, "--device", help="overrides the file's device"),
                 store: str = typer.Option("gpuvs.db", "--store"),
                 duration: float = typer.Option(None, "--duration", help="overrides the file's window seconds")) -> None:
    """Pairs x sizes x MPS off/on: each job alone, then both in one window; execution time per run."""
    console = Console(markup=False, highlight=False)
    data = load(file)
    dev = resolve_device(device or data.get("device"), EnvSpec(), console)
    window = float(duration or data.get("duration", 8))
    (key, values), = (data.get("sweep") or {"": [None]}).items()
    base = RunSpec(workload="selftest", device=dev, timeout_s=float(data.get("timeout_s", 1800)))
    cases = []
    for a_text, b_text in data["pairs"]:
        for v in values:
            extra = f" --{key.replace('_', '-')} {v}" if key else ""
            a, b = job_spec(a_text + extra, base), job_spec(b_text + extra, base)
            for s in (a, b):
                check_shareable(s)
                validate_spec(s)
            cases.append((a_text, b_text, v, a, b))
    modes = mps_modes(data.get("mps", "both")) if dev.startswith("cuda") else [False]
    exp_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    rows = []
    with Store(store) as st:
        st.create_experiment(exp_id, data.get("name") or Path(file).stem, "share-matrix", {"file": data})
        coord = Coordinator(Runner(st), window, say=lambda s: console.print("  " + s))
        for a_text, b_text, v, a, b in cases:
            a.experiment_id = b.experiment_id = exp_id
            console.rule(f"{a_text} + {b_text}" + (f", {key} {v}" if key else ""), style="dim")
            ga, gb = coord.group([a], "A alone", False), coord.group([b], "B alone", False)
            alone = [ga.value(0), gb.value(0)]
            together = {m: coord.group([a, b], "A+B, MPS" if m else "A+B", m) for m in modes}
            rows.append((a_text, b_text, v, alone, together, ga.unit()))
    t = Table(title=f"{data.get('name', Path(file).stem)}: time per run, alone and together ({window:g} s windows)",
              title_justify="left")
    for col in ["A", "B", key or "-", "A alone", "B alone", "A+B: A", "A+B: B", "MPS: A", "MPS: B",
                "work time-sliced", "work MPS"]:
        t.add_column(col, justify="left" if col in ("A", "B") else "right")

    def per_run(rate: float | None, unit: str) -> str:
        return fmt(1000.0 / rate, 3) if rate else "-"

    for a_text, b_text, v, alone, together, unit in rows:
        sliced, mps = together.get(False), together.get(True)
        t.add_row(a_text, b_text, str(v), per_run(alone[0], unit), per_run(alone[1], unit),
                  per_run(sliced.value(0), unit) if sliced else "-", per_run(sliced.value(1), unit) if sliced else "-",
                  per_run(mps.value(0), unit) if mps else "-", per_run(mps.value(1), unit) if mps else "-",
                  fmt(normalized_sum(sliced, alone), 3) if sliced else "-",
                  fmt(normalized_sum(mps, alone), 3) if mps else "-")
    t.caption = ("times in ms per run of each job (1000 / runs per second, from the shared window); work = sum over "
                 "both jobs of together/alone: 1.0 is what taking turns gives, above 1 sharing did more work")
    console.print(t)
    console.print(f"stored as experiment {exp_id} in {store}", style="dim")
