"""The pairs file (of `gpuvs share-matrix` and `gpuvs advise-mps --pairs`) and the matrix's runs.

Pairs of jobs x an input-size sweep x MPS off/on, each pair measured alone and together in shared windows.
That is the published MPS study's matrix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpuvs.errors import UsageError
from gpuvs.trial.experiment import load_yaml
from gpuvs.params import Param, did_you_mean
from gpuvs.sharing.group import Coordinator, Group
from gpuvs.spec import RunSpec

KEYS = {"name", "device", "duration", "mps", "pairs", "sweep", "timeout_s"}
# the file's numbers, checked as options are (NaN passes every comparison: `timeout_s: .nan` was no timeout)
NUMBERS = (Param("duration", float, 8.0, "seconds of each shared window", min=0.1, max=86400.0),
           Param("timeout_s", float, 1800.0, "seconds a run may take", min=0.001))


def load(path: str) -> dict:
    """A pairs file, checked: every fault is one UsageError naming the file and what is allowed."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    data = load_yaml(p, "pairs file")  # the experiment file's bounded loader: aliases counted, FILE:LINE refusals
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping with keys {', '.join(sorted(KEYS))}")
    unknown = set(data) - KEYS
    if unknown:
        first = sorted(map(str, unknown))[0]
        where = f"{path}:{data.lines[first]}" if first in getattr(data, "lines", {}) else path
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}{did_you_mean(first, KEYS)}; "
                         f"allowed: {', '.join(sorted(KEYS))}")
    pairs = data.get("pairs")
    where = f"{path}:{data.lines['pairs']}" if "pairs" in data else path
    if not isinstance(pairs, list) or not pairs:
        raise UsageError(f"{where}: 'pairs' must be a list of [JOB_A, JOB_B] pairs of quoted jobs")
    for pair, line in zip(pairs, pairs.lines):
        if not isinstance(pair, list) or len(pair) != 2:
            raise UsageError(f"{path}:{line}: 'pairs' must be a list of [JOB_A, JOB_B] pairs of quoted jobs")
        for job, job_line in zip(pair, pair.lines):
            if not isinstance(job, str):
                raise UsageError(f"{path}:{job_line}: a job is a quoted string such as \"selftest --noise\", not "
                                 f"{_kind(job)}")
    sweep = data.get("sweep") or {}
    if not isinstance(sweep, dict) or len(sweep) > 1 or not all(isinstance(v, list) and v for v in sweep.values()):
        raise UsageError(f"{path}: 'sweep' must be one parameter with a list of values, e.g. sweep: {{scale: [small, full]}}")
    if data.get("mps", "both") not in ("off", "on", "both"):
        raise UsageError(f"{path}: 'mps' must be off, on or both")
    for p in NUMBERS:
        if data.get(p.name) is not None:
            try:
                data[p.name] = p.coerce(data[p.name])
            except UsageError as exc:  # '--timeout-s: nan is not ...' -> 'timeout_s: nan is not ...'
                raise UsageError(f"{path}: {p.name}:{str(exc).partition(':')[2]}") from None
    return data


def _kind(value: Any) -> str:
    return ("a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict)
            else "nothing" if value is None else f"{value!r}")


def mps_modes(choice: str) -> list[bool]:
    return {"off": [False], "on": [True], "both": [False, True]}[choice]


@dataclass
class Case:
    """One cell of the matrix: a pair of jobs at one value of the sweep."""

    a_text: str
    b_text: str
    value: Any
    a: RunSpec
    b: RunSpec


@dataclass
class Row:
    case: Case
    alone: list[float | None]  # A's and B's rate alone
    together: dict[bool, Group]  # MPS on? -> the pair's group
    unit: str


def measure(coord: Coordinator, cases: list[Case], modes: list[bool], key: str,
            heading: Callable[[str], None] = lambda s: None) -> list[Row]:
    """Each case: A alone, B alone, then both together under each MPS mode."""
    rows = []
    for case in cases:
        heading(f"{case.a_text} + {case.b_text}" + (f", {key} {case.value}" if key else ""))
        ga, gb = coord.group([case.a], "A alone", False), coord.group([case.b], "B alone", False)
        together = {m: coord.group([case.a, case.b], "A+B, MPS" if m else "A+B", m) for m in modes}
        rows.append(Row(case, [ga.value(0), gb.value(0)], together, ga.unit()))
    return rows
