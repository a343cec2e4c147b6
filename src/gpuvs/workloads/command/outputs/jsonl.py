"""JSON lines, for scripts that can print them: a line that is a JSON object with a "gpuvs" key is one reading.

For example {"gpuvs": "loss", "value": 0.31, "better": "lower", "step": 10}; docs/command.md has the rules.
A metric is declared by its first line; a "gpuvs" line that breaks the rules fails the trial.
ARG names the metrics that must appear (comma-separated), so that a run without them fails."""

from __future__ import annotations

import json
import math

from gpuvs.errors import UsageError
from gpuvs.workloads.command.outputs import register
from gpuvs.workloads.command.outputs.parsing import DIRECTIONS, KIND_DIRECTION, KINDS, Line, Metric, OutputError, Parser, Reading, check_name

KEY = "gpuvs"


@register
class JsonLines(Parser):
    name = "jsonl"
    summary = ('JSON lines the job prints: {"gpuvs": NAME, "value": N, "better": "higher"|"lower", "unit", "kind", '
               '"step"}')
    arg = "NAMES: metrics that must appear, comma-separated"
    declares_at_run_time = True

    def __init__(self, arg=None, job=None):
        super().__init__(arg, job)
        self.expected: tuple[str, ...] = ()
        if arg is not None:
            names = tuple(n.strip() for n in arg.split(","))
            for n in names:
                try:
                    check_name(n)
                except UsageError as exc:
                    raise UsageError(f"parser jsonl:{arg}: {exc}") from None
            self.expected = names

    def expects(self) -> list[tuple[str, str]]:
        return [(n, f'a JSON line {{"{KEY}": "{n}", ...}}') for n in self.expected]

    def feed(self, line: Line) -> list[Reading]:
        text = line.text.strip()
        if not (text.startswith("{") and f'"{KEY}"' in text):
            return []
        try:
            obj = json.loads(text)
        except ValueError:
            return []  # not JSON after all: plain text that happens to look like it
        if not isinstance(obj, dict) or KEY not in obj:
            return []

        def bad(why: str) -> OutputError:
            return OutputError(f"JSON metric line ({line.source}): {why}: {text[:200]}")

        name = obj[KEY]
        if not isinstance(name, str):
            raise bad(f'"{KEY}" must be the metric\'s name, a string')
        try:
            check_name(name)
        except UsageError as exc:
            raise bad(str(exc)) from None
        value = obj.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad('"value" must be a number')
        try:
            value = float(value)
        except OverflowError:  # an integer too long for a float
            value = math.inf
        if not math.isfinite(value):  # NaN, Infinity, 1e400: never a figure (an earlier line's would stand in)
            raise bad('the command printed a "value" that is not a finite number')
        step = obj.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise bad('"step" must be a whole number >= 0')
        better, unit, kind = obj.get("better"), obj.get("unit", ""), obj.get("kind")
        if not isinstance(unit, str):
            raise bad('"unit" must be a string')
        known = self.metric(name)
        if known is None:
            if better is None:
                raise bad(f'the first line of metric {name} must say "better": "higher" or "lower" (never guessed)')
            if better not in DIRECTIONS:
                raise bad(f'"better" must be "higher" or "lower", not {better!r}')
            if kind is not None and kind not in KINDS:
                raise bad(f'"kind" must be one of {", ".join(map(repr, KINDS))}, not {kind!r}')
            if kind in KIND_DIRECTION and KIND_DIRECTION[kind] != better:
                raise bad(f'a "{kind}" is "better": "{KIND_DIRECTION[kind]}", not "{better}"')
            known = Metric(name, better, unit, per_step=step is not None, required=name in self.expected,
                           read_from=f'JSON lines {{"{KEY}": "{name}", ...}}', kind=kind or "score")
            self.metrics += (known,)
        elif better is not None and better != known.better:
            raise bad(f'metric {name} was declared "better": "{known.better}" on its first line')
        elif "unit" in obj and unit != known.unit:
            raise bad(f'metric {name} was declared with unit {known.unit!r} on its first line')
        elif kind is not None and kind != known.kind:
            raise bad(f'metric {name} was declared "kind": "{known.kind}" on its first line')
        elif (step is not None) != known.per_step:
            raise bad(f"metric {name} was first printed {'with' if known.per_step else 'without'} a step")
        return [self.reading(name, value, line, step)]
