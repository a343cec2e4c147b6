"""Metrics read from a job's own output: what the `command` workload measures besides wall time.

base.py holds the records and the Parser interface, patterns.py --metric and --step-metric, reader.py one job's output.
Each ready parser is one module registered by name (`--parser NAME[:ARG]`): a Parser subclass with @register.
Standard library only (the worker wraps a command inside the user's image). docs/command.md is the reference."""

from __future__ import annotations

from typing import Iterable

from gpuvs.errors import UsageError
from gpuvs.registry import Registry
from gpuvs.workloads.command.outputs.parsing import WALL_TIME, Job, Line, Metric, OutputError, Parser, Reading, wall_time

__all__ = ["Job", "Line", "Metric", "Missing", "OutputError", "Parser", "PatternParser", "Reader", "Reading",
           "WALL_TIME", "create", "get", "names", "make_reader", "parse_metric_spec", "register", "wall_time"]

_parsers: Registry[type[Parser]] = Registry(__name__, __path__, "parser", lambda cls: cls.name,
                                            skip=("parsing", "budget", "patterns", "reader"))
register = _parsers.register


def names() -> list[str]:
    return sorted(_parsers.discover())


def get(name: str) -> type[Parser]:
    """A ready parser's class by name, or one UsageError line listing the known ones."""
    try:
        return _parsers.discover()[name]
    except KeyError:
        raise UsageError(f"unknown parser {name!r}; known parsers: {', '.join(names())}") from None


def create(spec: str, job: Job | None = None) -> Parser:
    """A parser from the user's `NAME` or `NAME:ARG` (hyperfine:out.json, sysbench:cpu, stress-ng:vm)."""
    name, colon, arg = spec.strip().partition(":")
    cls = get(name)
    if colon and not arg:
        raise UsageError(f"parser {spec!r}: nothing after ':'; {name} takes {cls.arg or 'no argument'}")
    return cls(arg if colon else None, job or Job())


def make_reader(parsers: Iterable[str] = (), metrics: Iterable[str] = (), step_metrics: Iterable[str] = (),
                headline: str | None = None, job: Job | None = None) -> "Reader":
    """Everything the user said about a job's output (--parser, --metric, --step-metric, the headline) as one
    Reader: every UsageError is raised here, before anything starts. The headline, unless named: the first
    parser's; else the only --step-metric, when one is declared (the job's pace, step by step; a --metric beside
    it, a figure printed once such as a final score, does not change that); else wall time."""
    job = job or Job()
    made = [create(spec, job) for spec in parsers]
    metrics, step_metrics = list(metrics), list(step_metrics)
    if metrics or step_metrics:
        patterns = PatternParser.from_specs(metrics, step_metrics)
        if len(step_metrics) == 1:
            patterns.headline = next(m.name for m in patterns.metrics if m.per_step)
        made.append(patterns)
    return Reader(made, headline=headline)


from gpuvs.workloads.command.outputs.patterns import PatternParser, parse_metric_spec  # noqa: E402  (they import register's module)
from gpuvs.workloads.command.outputs.reader import Missing, Reader  # noqa: E402
