"""The user's own metrics: `--metric NAME=REGEX,higher|lower|rate|time[,UNIT]` and `--step-metric`.

They become declarations before anything starts, and the parser here reads them.
The direction is required, never guessed; the figure is the regex's first group, or its group named `value`.
A regex that backtracks is refused (backtracking()), and its time is bounded (budget.py); docs/command.md."""

from __future__ import annotations

import re
import time
from typing import Iterable

from gpuvs.errors import UsageError
from gpuvs.workloads.command.outputs import budget
from gpuvs.workloads.command.outputs.parsing import (DIRECTIONS, KIND_DIRECTION, Line, Metric, OutputError, Parser, Reading, check_name,
                                number)

try:  # Python 3.11+
    from re import _parser as _sre
except ImportError:  # Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

_BACKTRACKS = ("it backtracks (alternatives or repeats that match the same text, e.g. (a|a)*); simplify the regex. "
               "The command's output was read to its end without it")
SYNTAX = "NAME=REGEX,higher|lower|rate|time[,UNIT]"
WORDS = DIRECTIONS + tuple(KIND_DIRECTION)  # what may follow the regex: a direction, or a kind that implies one
_WORD = re.compile(r"[A-Za-z]+")


def parse_metric_spec(text: str, per_step: bool = False) -> Metric:
    """The declaration a --metric (per_step=False) or --step-metric (True) text stands for, or one UsageError line
    saying what is wrong and what is allowed."""
    option = "--step-metric" if per_step else "--metric"

    def bad(why: str) -> UsageError:
        return UsageError(f"{option} {text!r}: {why} (expected {SYNTAX})")

    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq:
        raise bad("no '=' between the name and the regex")
    if not name:
        raise bad("the name is empty")
    try:
        check_name(name)
    except UsageError:
        why = f"{name!r} is not a metric name: use letters, digits, _ . - / (starting with a letter or _)"
        raise bad(why) from None
    parts = rest.rsplit(",", 2)
    unit = ""
    if len(parts) >= 2 and parts[-1].strip().lower() in WORDS:
        regex, word = ",".join(parts[:-1]), parts[-1].strip().lower()
    elif len(parts) == 3 and parts[-2].strip().lower() in WORDS:
        regex, word, unit = parts[0], parts[-2].strip().lower(), parts[-1].strip()
    else:
        words = [p.strip() for p in parts[1:] if _WORD.fullmatch(p.strip())]
        if words:
            raise bad(f"unknown direction {words[0]!r}: say higher or lower, or rate or time (which way is better "
                      "is never guessed)")
        raise bad("no direction: end it with ,higher or ,lower, or ,rate or ,time (which way is better is never "
                  "guessed)")
    better, kind = (KIND_DIRECTION[word], word) if word in KIND_DIRECTION else (word, "score")
    if not regex:
        raise bad("the regex is empty")
    try:
        compiled = re.compile(regex)
    except re.error as exc:
        raise bad(f"the regex {regex!r} does not compile: {exc}") from None
    if backtracking(regex):
        raise bad(f"the regex {regex!r} repeats a repeat (a nested quantifier such as (a+)+), which can match the "
                  "same text in many ways: on a line that almost matches, Python's re tries every way, for hours; "
                  "repeat one thing, e.g. '([0-9]+)' rather than '([0-9]+)+'")
    if value_group(compiled) is None:
        raise bad(f"the regex {regex!r} has no group for the figure: put it in parentheses, e.g. 'loss: ([0-9.]+)'")
    return Metric(name, better, unit, per_step=per_step, pattern=regex, kind=kind)


def backtracking(regex: str) -> bool:
    """Whether `regex` backtracks catastrophically: it holds a repeat (`+`, `*`, `{n,}`, `{n,m}`) whose body
    is a variable repeat with nothing else required beside it (`(a+)+`, `(a*)*`, `(\\w+\\s?)+`), so that a run of
    text splits between the iterations in exponentially many ways. `(?: \\w+)*` is fine (each iteration starts
    with a space); possessive repeats and atomic groups never backtrack."""
    try:
        parsed = _sre.parse(regex)
    except Exception:  # re.compile said why already
        return False
    return _nested(parsed.data, parsed.state)


_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT)


def _nested(items, state) -> bool:
    for op, av in items:
        subs = []
        if op in _REPEATS:
            lo, hi, body = av
            if hi > 1 and _ambiguous(body, state):
                return True
            subs = [body]
        elif op is _sre.SUBPATTERN:
            subs = [av[-1]]
        elif op is _sre.BRANCH:
            subs = list(av[1])
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            subs = [av[1]]
        elif op is _sre.GROUPREF_EXISTS:
            subs = [s for s in av[1:] if s is not None]
        elif op in (getattr(_sre, "POSSESSIVE_REPEAT", None), getattr(_sre, "ATOMIC_GROUP", None)):
            subs = [av[-1]]
        for sub in subs:
            if _nested(sub, state):
                return True
    return False


def _flat(items) -> list:
    """A sequence with its plain groups opened: ((a)(b+)) is a, b+."""
    out = []
    for op, av in items:
        if op is _sre.SUBPATTERN:
            out += _flat(av[-1])
        else:
            out.append((op, av))
    return out


def _ambiguous(body, state) -> bool:
    seq = _flat(body)
    for i, (op, av) in enumerate(seq):
        if op in _REPEATS and av[1] > 1 and av[1] != av[0]:
            rest = seq[:i] + seq[i + 1:]
            if all(_sre.SubPattern(state, [item]).getwidth()[0] == 0 for item in rest):
                return True
    return False


def value_group(regex: re.Pattern[str]) -> int | str | None:
    """The group holding the figure: the one named `value`, else the first that is not named `step`."""
    if "value" in regex.groupindex:
        return "value"
    step = regex.groupindex.get("step")
    return next((g for g in range(1, regex.groups + 1) if g != step), None)


class PatternParser(Parser):
    """Reads the user's --metric and --step-metric declarations (not in the registry: made from their texts)."""

    name = "metric"
    summary = "--metric / --step-metric: the first group of the user's regex"
    label = "--metric/--step-metric"  # type: ignore[assignment]

    def __init__(self, metrics: Iterable[Metric]):
        super().__init__()
        self.metrics = tuple(metrics)
        self._regex = {}
        for m in self.metrics:
            if m.pattern is None:
                raise UsageError(f"metric {m.name}: a --metric declaration needs its regex")
            regex = re.compile(m.pattern)
            self._regex[m.name] = (regex, value_group(regex), regex.groupindex.get("step"))
        self._count: dict[str, int] = {}
        self._overtime: set[str] = set()  # metrics whose regex ran past its budget: not searched again
        self._spent: dict[str, float] = {}  # CPU seconds each regex spent so far, on how many lines
        self._searched: dict[str, int] = {}

    @classmethod
    def from_specs(cls, metrics: Iterable[str] = (), step_metrics: Iterable[str] = ()) -> "PatternParser":
        return cls([parse_metric_spec(t) for t in metrics]
                   + [parse_metric_spec(t, per_step=True) for t in step_metrics])

    def feed(self, line: Line) -> list[Reading]:
        out = []
        for m in self.metrics:
            if m.name in self._overtime:
                continue
            regex, group, step_group = self._regex[m.name]
            start = time.thread_time()
            try:
                match = budget.search(regex, line.text)
            except budget.Overtime:
                self._overtime.add(m.name)
                raise OutputError(f"metric {m.name}: its regex {m.pattern!r} took over {budget.MATCH_CPU_S:g} s of CPU "
                                  f"on {line.source} ({len(line.text)} characters) and was stopped: {_BACKTRACKS}",
                                  kind="input") from None
            spent = self._spent[m.name] = self._spent.get(m.name, 0.0) + time.thread_time() - start
            searched = self._searched[m.name] = self._searched.get(m.name, 0) + 1
            if budget.over_trial(spent, searched):
                self._overtime.add(m.name)
                raise OutputError(f"metric {m.name}: its regex {m.pattern!r} took {spent:.3g} s of CPU on {searched} "
                                  f"line{'s' * (searched > 1)} of output ({spent / searched:.2g} s a line, up to "
                                  f"{line.source}; a trial's matching gets {budget.TRIAL_CPU_S:g} s, or "
                                  f"{budget.LINE_CPU_S * 1000:g} ms a line) and was stopped: {_BACKTRACKS}",
                                  kind="input")
            if match is None or match.group(group) is None:  # no match, or an optional group that took no part
                continue
            value = number(match.group(group), f"metric {m.name} ({m.where}) on {line.source}")
            step = None
            if m.per_step:
                self._count[m.name] = self._count.get(m.name, 0) + 1
                raw_step = match.group(step_group) if step_group is not None else None
                step = (int(number(raw_step, f"the step of metric {m.name} on {line.source}"))
                        if raw_step is not None else self._count[m.name])
            out.append(self.reading(m.name, value, line, step))
        return out
