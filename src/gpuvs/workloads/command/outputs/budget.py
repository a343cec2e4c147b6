"""The time one regex may spend on one line of a job's output, and on all of it.

`--metric` regexes are the user's, and Python's `re` backtracks: `(a|a)*b` on 40 characters would take hours.
In the main thread a SIGALRM interrupts a match past MATCH_CPU_S of CPU; elsewhere the `regex` module's timeout does.
over_trial() bounds a regex's total time on a trial's output; docs/command.md has the figures."""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

MATCH_CPU_S = 1.0  # CPU seconds one regex may spend on one line
TRIAL_CPU_S = 2.0  # CPU seconds one regex may spend on a trial's whole output, or LINE_CPU_S a line if more: a regex
LINE_CPU_S = 0.001  # slower than that is stopped, so that a trial's time goes to its command, not to gpuvs's matching
TICK_S = 0.1  # how often a running match is checked, while watching()

_deadline: float | None = None  # the current match's end of budget, on time.thread_time()'s clock


class Overtime(Exception):
    """A match ran past its budget."""


def _tick(signum, frame) -> None:
    if _deadline is not None and time.thread_time() > _deadline:
        raise Overtime


@contextmanager
def watching() -> Iterator[None]:
    """While the body runs, a match past its budget is interrupted (main thread only; elsewhere nothing changes).
    The previous SIGALRM handler and timer come back afterwards; children started inside do not inherit the timer
    (fork(2) clears interval timers)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    old = signal.signal(signal.SIGALRM, _tick)
    signal.setitimer(signal.ITIMER_REAL, TICK_S, TICK_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_BOUNDED: dict[tuple[str, int], object] = {}  # (pattern, flags) -> the same pattern compiled by `regex`, or None


def _bounded(compiled):
    """The pattern compiled by the `regex` module (whose matches stop at a timeout), or None where it cannot be."""
    key = (compiled.pattern, compiled.flags)
    if key not in _BOUNDED:
        try:
            import regex as bounded

            flags = (compiled.flags & 0x7E) | (bounded.ASCII if compiled.flags & 256 else 0)  # re.A is 256 there
            _BOUNDED[key] = bounded.compile(compiled.pattern, flags | bounded.VERSION0)
        except Exception:  # not installed, or a pattern it reads otherwise: re, measured after the match
            _BOUNDED[key] = None
    return _BOUNDED[key]


def search(regex, text: str, budget_s: float = MATCH_CPU_S):
    """regex.search(text) within its budget: the match (or None), or Overtime."""
    global _deadline
    if threading.current_thread() is not threading.main_thread():
        bounded = _bounded(regex)
        if bounded is not None:
            try:
                return bounded.search(text, timeout=budget_s, concurrent=True)
            except TimeoutError:
                raise Overtime from None
    start = time.thread_time()
    _deadline = start + budget_s
    try:
        match = regex.search(text)
    finally:
        _deadline = None
    if time.thread_time() - start > budget_s:
        raise Overtime
    return match


def over_trial(spent_s: float, lines: int) -> bool:
    """Whether a regex that spent `spent_s` CPU seconds on `lines` lines is past its budget for the trial."""
    return spent_s > max(TRIAL_CPU_S, LINE_CPU_S * lines)
