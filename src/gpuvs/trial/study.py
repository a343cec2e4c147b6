"""A study run to its verdict, as a library call: run_trials runs arms x trials, run_comparison runs a Study.

run_comparison stops by compare's rule (--until-confident) and returns the stored experiment's Analysis.
What happens on the way is told through Hooks, every one optional; nothing here prints."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Literal

from gpuvs.analysis import comparison
from gpuvs.analysis.comparison import Analysis
from gpuvs.store.records import LookSchedule
from gpuvs.errors import UsageError
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store
from gpuvs.trial.experiment import Study
from gpuvs.trial.runner import EventHook, Experiment, Runner, TrialResult, validate_experiment, validate_spec


@dataclass
class Look:
    """One look of the stopping rule, after the trials planned so far: what it decided.
    settled: every arm's headline verdict is reached; empty: `arm` has no successful trial (no verdict can
    come); capped: not settled at the cap (max_trials); more: `add` trials per arm follow."""

    decision: Literal["settled", "empty", "capped", "more"]
    per_arm: int  # trials per arm so far
    max_trials: int
    add: int = 0
    arm: str | None = None


@dataclass
class Ran:
    """An experiment's trials as they ran, and where the wall time went (Runner.timing)."""

    experiment: Experiment
    results: list[TrialResult]
    planned: int  # trials per arm planned when the first started (the stopping rule may have added more)
    timing: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[TrialResult]:
        return [r for r in self.results if not r.ok]


@dataclass
class Hooks:
    """What a caller hears while trials run; every one optional.
    on_event: each event of a trial as it arrives (the step log); on_trial_start(spec, i, n) and
    on_trial_end(result): around each trial; on_look: each decision of the stopping rule; on_ran: the
    trials done and stored, before the analysis is read back; running: a context held while the trials run,
    entered once they are checked and the store is open (the command line's progress bar)."""

    on_event: EventHook | None = None
    on_trial_start: Callable[[RunSpec, int, int], None] | None = None
    on_trial_end: Callable[[TrialResult], None] | None = None
    on_look: Callable[[Look], None] | None = None
    on_ran: Callable[[Ran], None] | None = None
    running: Callable[[], ContextManager[Any]] | None = None


def run_trials(exp: Experiment, store: str | Path, hooks: Hooks | None = None, *, timeout_s: float | None = None,
               retries: int = 0, more: Callable[[list[TrialResult]], int] | None = None) -> Ran:
    """Every arm x trial of `exp`, checked before the store is opened, each trial kept as it ends.
    `more`: see Runner.run_experiment."""
    hooks = hooks or Hooks()
    validate_experiment(exp)
    planned = exp.trials
    with Store(store) as st, (hooks.running() if hooks.running else contextlib.nullcontext()):
        runner = Runner(st, on_event=hooks.on_event, timeout_s=timeout_s, retries=retries,
                        on_trial_start=hooks.on_trial_start, on_trial_end=hooks.on_trial_end)
        results = runner.run_experiment(exp, more=more)
    return Ran(exp, results, planned, runner.timing)


def check_arms(exp: Experiment) -> None:
    """Refuse before anything starts, naming the arm."""
    for arm in exp.arms:
        try:
            validate_spec(exp.spec_for(arm, 0))
        except UsageError as exc:
            raise UsageError(f"arm {arm.name}: {exc}") from None


def stopping_rule(study: Study, on_look: Callable[[Look], None] | None = None) -> Callable[[list[TrialResult]], int]:
    """The Runner's `more` hook of --until-confident: add a pair of trials per arm (A B | B A) until every arm's
    headline verdict is settled, or the cap is hit."""
    exp = study.experiment
    cap = study.max_trials or exp.trials

    def more(results: list[TrialResult]) -> int:
        a = comparison.from_results(exp, results, study.margin, study.confidence)
        per_arm = exp.trials
        empty = [arm.name for arm in a.arms if arm.n_ok == 0]
        if empty:
            look = Look("empty", per_arm, cap, arm=empty[0])
        elif a.settled():
            look = Look("settled", per_arm, cap)
        elif per_arm >= cap:
            look = Look("capped", per_arm, cap)
        else:
            look = Look("more", per_arm, cap, add=min(2, cap - per_arm))
        if on_look:
            on_look(look)
        return look.add

    return more


def run_comparison(study: Study, store: str | Path, hooks: Hooks | None = None, *,
                   timeout_s: float | None = None) -> Analysis:
    """Run a comparison to its verdict: the arms checked, the trials run (with the stopping rule where the study
    asks for it, its looks planned first so that it can spend alpha over them), and the stored experiment's
    analysis returned. A failed trial is kept and counted in the analysis, not raised."""
    hooks = hooks or Hooks()
    exp = study.experiment
    check_arms(exp)
    more = None
    if study.until_confident:
        exp.trials = max(exp.trials, 2)
        exp.meta.sequential = LookSchedule(first=exp.trials, cap=max(study.max_trials or exp.trials, exp.trials), step=2)
        more = stopping_rule(study, hooks.on_look)
    ran = run_trials(exp, store, hooks, timeout_s=timeout_s, retries=study.retries, more=more)
    if hooks.on_ran:
        hooks.on_ran(ran)
    with Store(store) as st:
        return comparison.from_store(st, exp.id, with_steps=False)
