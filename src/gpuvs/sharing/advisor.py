"""The study of `gpuvs advise-mps`: each job alone, then each pair time-sliced and under MPS, in fresh groups.

The prediction (advice.py) from the solo windows is set against the measured verdict (stats.py).
With a cap above the planned repeats, repeats are added only for the pairs not yet settled.
Each window is calibrated from the job's first solo window (windows.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gpuvs.sharing import windows
from gpuvs.sharing import share_stats as stats
from gpuvs.sharing.advice import Advice, predict
from gpuvs.sharing.group import Coordinator, Group, normalized_sum
from gpuvs.sharing.share_stats import LookSchedule
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
    plan: LookSchedule | None = None  # the looks of a measurement that adds repeats until it settles
    margin: float = 0.05
    window: windows.Window | None = None  # the pair's calibrated window (None: the coordinator's, uncalibrated)
    solo_windows: dict[str, windows.Window] = field(default_factory=dict)  # "A alone", "B alone": each job's

    def verdict(self) -> stats.MpsVerdict | None:
        """The measured MPS verdict over the repeats so far (None before any MPS group)."""
        if not self.work["A+B, MPS"]:
            return None
        return stats.mps_verdict(self.work["A+B"], self.work["A+B, MPS"], self.margin, self.plan)

    def settled(self) -> bool:
        """Measured enough: its verdict settled at a look of its plan, or the cap reached (without a plan:
        the repeats planned, which the caller counts)."""
        if self.plan is None:
            return False
        n = len(self.work["A+B, MPS"])
        if n >= self.plan.cap:
            return True
        v = self.verdict() if n >= self.plan.first else None
        return v is not None and v.settled


def job_steps(job: str, group: Group) -> windows.StepTimes | None:
    """A job's step times from its solo group (its first series); None where the group failed."""
    trial = group.trials[0] if group.ok and group.trials else None
    if trial is None or not trial.samples:
        return None
    series = trial.samples[0].series
    return windows.step_times(job, [s.seconds for s in trial.samples if s.series == series])


def measure(coord: Coordinator, specs: dict[str, RunSpec], pairs: list[PairRuns], repeats: int, cuda: bool,
            save: Callable[[], None] = lambda: None, predict_only: bool = False,
            heading: Callable[[str], None] = lambda s: None, max_window_s: float | None = None,
            say: Callable[[str], None] = lambda s: None) -> None:
    """Each job alone once per repeat (NVML and GPM over its window), then each pair time-sliced and
    under MPS; fresh process groups every time. Solo runs of a job are shared by every pair that has it.
    Past `repeats`, a pair with a plan (PairRuns.plan) gets one more repeat at a time until it settles
    or reaches its cap; only the jobs of such pairs run alone then. `save` is called whenever a part is
    measured, so that what was measured survives a stop. max_window_s: the cap of a calibrated window
    (windows.py; the floor is the coordinator's window); None or at the floor: every window the floor."""
    single = len(pairs) == 1
    sequential = cuda and not predict_only
    floor = coord.window_s
    calibrating = max_window_s is not None and max_window_s > floor
    steps: dict[str, windows.StepTimes | None] = {}
    solo_window: dict[str, windows.Window] = {}
    cap = max([repeats] + [pr.plan.cap for pr in pairs if pr.plan and sequential])
    for rep in range(cap):
        todo = pairs if rep < repeats else [pr for pr in pairs if sequential and pr.plan and not pr.settled()]
        if not todo:
            return
        jobs = [t for t in specs if any(t in (pr.a, pr.b) for pr in todo)]
        heading(f"repeat {rep + 1} of {repeats}: each job alone (telemetry, GPM), then the pairs" if rep < repeats
                else f"repeat {rep + 1} (at most {cap}), added: {len(todo)} pair(s) not yet settled")
        solo: dict[str, Group] = {}
        for i, text in enumerate(jobs):
            label = ("A alone" if i == 0 else "B alone") if single else f"alone: {text}"
            win = solo_window.get(text)
            g = coord.group([specs[text]], label, False, gpm_window=True, window_s=win.seconds if win else None)
            if calibrating and win is None and g.ok:
                steps[text] = job_steps(text, g)
                win = solo_window[text] = windows.choose([steps[text]], floor, max_window_s)
                say(f"{label}: {win.reason}" + ("; measured alone again at it" if win.seconds > floor else ""))
                if win.seconds > floor:
                    save()
                    g = coord.group([specs[text]], label, False, gpm_window=True, window_s=win.seconds)
            solo[text] = g
        for pr in todo:
            pr.runs["A alone"].append(solo[pr.a])
            pr.runs["B alone"].append(solo[pr.b])
            pr.solo_windows.update({k: solo_window[t] for k, t in (("A alone", pr.a), ("B alone", pr.b))
                                    if t in solo_window})
        save()
        for n, pr in [] if predict_only else [(pairs.index(pr), pr) for pr in todo]:
            if calibrating and pr.window is None and pr.a in steps and pr.b in steps:
                pr.window = windows.choose([steps[pr.a], steps[pr.b]], floor, max_window_s, windows.PAIR_SLOWDOWN)
                say(f"{'A+B' if single else f'pair {n + 1}'}: {pr.window.reason}")
            alone = [solo[pr.a].value(0), solo[pr.b].value(0)]
            for label, mps in (("A+B", False), ("A+B, MPS", True)):
                if mps and not cuda:
                    continue
                arm = label if single else f"pair {n + 1}: {label}"
                pr.runs[label].append(coord.group([specs[pr.a], specs[pr.b]], arm, mps,
                                                  window_s=pr.window.seconds if pr.window else None))
                pr.work[label].append(normalized_sum(pr.runs[label][-1], alone))
            save()


def verdicts(pr: PairRuns, total: float | None, margin: float) -> tuple[list, Advice, stats.MpsVerdict | None]:
    """(each job's solo figures, the prediction from them, the measured MPS verdict or None)."""
    solo = [solo_figures(pr.runs["A alone"]), solo_figures(pr.runs["B alone"])]
    advice = predict(solo, total, margin)
    return solo, advice, pr.verdict()


def unsettled_why(verdict: stats.MpsVerdict | None) -> str | None:
    """Why a sequential measurement ended at its cap without a verdict, in one line: the pair's noise
    between repeats and about how many repeats would settle it; None where it settled or had no plan."""
    if verdict is None or verdict.plan is None or verdict.settled:
        return None
    n = verdict.comparison.have or 0
    cv = verdict.cv
    need = verdict.comparison.trials_needed
    noise = f"the work ratio varies by {100 * cv:.1f}% (CV) between repeats" if cv is not None else \
        "too few complete repeats to read its noise"
    more = f"about {need} repeats would settle it" if need else "no count within reach would settle it"
    return f"not settled within the cap of {verdict.plan.cap} repeats ({n} measured): {noise}; {more} (--max-repeats)"
