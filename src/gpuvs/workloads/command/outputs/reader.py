"""One job's output read by all its parsers at once: lines in, readings out as they appear.

At the end, a plain answer to "did every figure we need appear?": the trial's failure reason if not."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from gpuvs.errors import UsageError
from gpuvs.workloads.command.outputs.parsing import STREAMS, WALL_TIME, Line, Metric, OutputError, Parser, Reading, wall_time
from gpuvs.safetext import clip, safe_text

_GPUVS = object()  # the owner of wall time: gpuvs itself, not a parser
MAX_PROBLEMS = 10


@dataclass(frozen=True)
class Missing:
    """A metric that had to appear and did not: its name and how it was to be read (the regex, for --metric)."""

    name: str
    where: str

    def __str__(self) -> str:
        return f"metric {self.name} ({self.where}) never appeared"


class Reader:
    """Feeds every line of one job's output to each of its parsers and keeps what the wrapper needs afterwards:
    how often each metric was read, its last reading, the last lines, and the problems met.

    headline: the metric carrying the verdict; None: the first parser's headline (make_reader gives the
    only --step-metric one), else wall time (measured by
    the wrapper: WALL_TIME). A metric name declared twice (two parsers, two --metric) is refused.
    Errors in the output (OutputError from a parser) are kept, not raised, so that nothing read is lost:
    failure() gives the trial's reason once the job has ended (or at once, for a wrapper that stops early)."""

    def __init__(self, parsers: Sequence[Parser], headline: str | None = None, keep_lines: int = 20):
        self.parsers = list(parsers)
        given = [p.name for p in self.parsers]
        if twice := sorted({n for n in given if given.count(n) > 1}):
            raise UsageError(f"parser {twice[0]} is given twice: one of each reads the whole output")
        self._owner: dict[str, Any] = {WALL_TIME.name: _GPUVS}
        for p in self.parsers:
            for m in p.metrics:
                if m.name in self._owner:
                    raise UsageError(f"metric {m.name} is declared twice ({_label(self._owner[m.name])} and "
                                     f"{_label(p)}): give one another name")
                self._owner[m.name] = p
        if headline is None:
            headline = next((p.headline for p in self.parsers if p.headline), WALL_TIME.name)
        elif headline not in self._owner and not any(p.declares_at_run_time for p in self.parsers):
            raise UsageError(f"headline {headline!r} is not a metric read from this job; known: "
                             f"{', '.join(self._owner)}")
        self.headline = headline
        self.counts: dict[str, int] = {}
        self.last: dict[str, Reading] = {}
        self.problems: list[str] = []
        self.problem_kind = "crash"  # input: the user's own declaration failed (a regex past its time budget)
        self._tail: deque[Line] = deque(maxlen=keep_lines)
        self._lines = dict.fromkeys(STREAMS, 0)
        self.cuts: list[str] = []  # lines the wrapper cut before the parsers read them (the first few, in words)

    def lines(self, stream: str) -> int:
        """Lines of `stream` read so far."""
        return self._lines.get(stream, 0)

    def cut(self, words: str) -> None:
        """The wrapper cut a line before its parsers read it whole (said if a metric never appears)."""
        if len(self.cuts) < 3:
            self.cuts.append(words)

    @property
    def metrics(self) -> list[Metric]:
        """Wall time, then every parser's metrics (a JSON-lines parser's grow as the job names them)."""
        return [WALL_TIME] + [m for p in self.parsers for m in p.metrics]

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)

    @property
    def info(self) -> dict[str, dict[str, Any]]:
        """What each parser read that is not a metric (versions, settings, counts), by parser name."""
        return {p.name: p.info for p in self.parsers if p.info}

    def feed(self, text: str | bytes, stream: str = "stdout") -> list[Reading]:
        """One line of the job's output (its line end may be left on). A line that a progress bar rewrote with
        carriage returns is read as each of its versions."""
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, not {stream!r}")
        if isinstance(text, bytes):
            text = text.decode("utf-8", "backslashreplace")
        self._lines[stream] += 1
        out: list[Reading] = []
        for part in text.rstrip("\r\n").split("\r"):
            line = Line(part, stream, self._lines[stream])
            self._tail.append(line)
            for p in self.parsers:
                out += self._take(p, lambda: p.feed(line))
        return out

    def finish(self) -> list[Reading]:
        """The job has exited: what each parser reads then (files the job wrote, tables it kept)."""
        out: list[Reading] = []
        for p in self.parsers:
            out += self._take(p, p.finish)
        return out

    def wall_time(self, seconds: float) -> Reading:
        """The wrapper's own measurement of launch to exit, kept like any reading."""
        reading = wall_time(seconds)
        self._count(reading)
        return reading

    def _take(self, parser: Parser, read) -> list[Reading]:
        try:
            readings = read()
        except OutputError as exc:
            self._problem(exc.message, exc.kind)
            return []
        kept = []
        for r in readings:
            owner = self._owner.setdefault(r.name, parser)
            if owner is not parser:
                self._problem(f"{_label(parser)} read metric {r.name} ({r.source}), which {_label(owner)} declares")
                continue
            self._count(r)
            kept.append(r)
        return kept

    def _count(self, reading: Reading) -> None:
        self.counts[reading.name] = self.counts.get(reading.name, 0) + 1
        self.last[reading.name] = reading

    def _problem(self, message: str, kind: str = "crash") -> None:
        if not self.problems:
            self.problem_kind = kind  # the first problem's, which names the trial's failure
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)

    def tail(self, n: int = 5) -> list[Line]:
        return list(self._tail)[-n:] if n > 0 else []

    def missing(self) -> list[Missing]:
        """The metrics that had to appear and never did: each parser's required ones and the headline (wall time
        excepted: the wrapper measures it)."""
        out: list[Missing] = []
        for p in self.parsers:
            out += [Missing(name, where) for name, where in p.expects() if name not in self.counts]
        if (self.headline != WALL_TIME.name and self.headline not in self.counts
                and all(m.name != self.headline for m in out)):
            m = self.metric(self.headline)
            out.append(Missing(self.headline, m.where if m else "the headline"))
        return out

    def failure(self, lines: int = 5) -> str | None:
        """Why the trial fails on its output, in one line, or None: the first problem met (a figure that is not a
        number, a malformed JSON metric line, a file not written), else the metrics that never appeared with
        the job's last lines. Its text from the job is shown with control characters escaped (safetext.py)."""
        if self.problems:
            more = len(self.problems) - 1
            return safe_text(self.problems[0]) + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")
        missing = self.missing()
        if not missing:
            return None
        shown = (" | ".join(f"{ln.stream}: {safe_text(clip(' '.join(ln.text.split()), 200))}" for ln in self.tail(lines))
                 or "(the job printed nothing)")
        cuts = "".join(f"; {c}" for c in self.cuts)
        return safe_text("; ".join(map(str, missing))) + cuts + f"; last lines: {shown}"


def _label(owner: Any) -> str:
    return "gpuvs (launch to exit)" if owner is _GPUVS else owner.label
