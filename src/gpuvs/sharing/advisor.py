"""The study of `gpuvs advise-mps`: each job alone (NVML and GPM over its window), then each pair
time-sliced and under MPS, in fresh process groups every repeat; the prediction (advice.py) from the
solo windows against the measured verdict (stats.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gpuvs.sharing import stats
from gpuvs.sharing.advice import Advice, predict
from gpuvs.sharing.group import Coordinator, Group, normalized_sum
from gpuvs.spec import RunSpec

RUNS = ("A alone", "B alone", "A+B", "A+B, MPS")


def mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def solo_figures(groups: list[Group]) -> tuple[dict, dict | None, float | None]:
    """A job's solo windows averaged over repeats: (NVML telemetry means, GPM percentages, memory MiB)."""
    tel = {k: mean(g.telemetry.get(k) for g in groups) for k in ("util_gpu_mean", "util_mem_mean")}
    gpms = [g.gpm for g in groups if g.gpm]
    gpm_mean = {k: mean(x.get(k) for x in gpms) for k in gpms[0]} if gpms else None
    return {k: v for k, v in tel.items() if v is not None}, gpm_mean, mean(g.memory_used_mib for g in groups)


@dataclass
class PairRuns:
    """One pair's groups over the repeats: A alone, B alone (shared with other pairs that hold the same
    job), both time-sliced and both under MPS; work per repeat."""

    a: str
    b: str
    runs: dict[str, list[Group]] = field(default_factory=lambda: {r: [] for r in RUNS})
    work: dict[str, list[float | None]] = field(default_factory=lambda: {"A+B": [], "A+B, MPS": []})


def measure(coord: Coordinator, specs: dict[str, RunSpec], pairs: list[PairRuns], repeats: int, cuda: bool,
            save: Callable[[], None] = lambda: None, predict_only: bool = False,
            heading: Callable[[str], None] = lambda s: None) -> None:
    """Each job alone once per repeat (NVML and GPM over its window), then each pair time-sliced and
    under MPS; fresh process groups every time. Solo runs of a job are shared by every pair that has it.
    `save` is called whenever a part is measured, so that what was measured survives a stop."""
    single = len(pairs) == 1
    for rep in range(repeats):
        heading(f"repeat {rep + 1} of {repeats}: each job alone (telemetry, GPM), then the pairs")
        solo: dict[str, Group] = {}
        for i, text in enumerate(specs):
            label = ("A alone" if i == 0 else "B alone") if single else f"alone: {text}"
            solo[text] = coord.group([specs[text]], label, False, gpm_window=True)
        for pr in pairs:
            pr.runs["A alone"].append(solo[pr.a])
            pr.runs["B alone"].append(solo[pr.b])
        save()
        for n, pr in enumerate([] if predict_only else pairs):
            alone = [solo[pr.a].value(0), solo[pr.b].value(0)]
            for label, mps in (("A+B", False), ("A+B, MPS", True)):
                if mps and not cuda:
                    continue
                arm = label if single else f"pair {n + 1}: {label}"
                pr.runs[label].append(coord.group([specs[pr.a], specs[pr.b]], arm, mps))
                pr.work[label].append(normalized_sum(pr.runs[label][-1], alone))
            save()


def verdicts(pr: PairRuns, total: float | None, margin: float) -> tuple[list, Advice, stats.MpsVerdict | None]:
    """(each job's solo figures, the prediction from them, the measured MPS verdict or None)."""
    solo = [solo_figures(pr.runs["A alone"]), solo_figures(pr.runs["B alone"])]
    advice = predict(solo, total, margin)
    verdict = stats.mps_verdict(pr.work["A+B"], pr.work["A+B, MPS"], margin) if pr.work["A+B, MPS"] else None
    return solo, advice, verdict
