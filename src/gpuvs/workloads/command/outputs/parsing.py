"""The records and the parser interface of gpuvs.workloads.command.outputs.

What a metric is (its direction declared, never guessed), what one reading is, and what a parser does.
Standard library only: the command's wrapper imports this in the user's image, which may hold nothing but Python."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpuvs.errors import UsageError, WorkloadError

DIRECTIONS = ("higher", "lower")
# What a figure is, for the verdict's words: a rate (work per time: higher is better, "faster"/"slower"), a time
# (lower is better, "slower"/"faster"), or a score (anything else: "better"/"worse"). Declared, never guessed.
KINDS = ("rate", "time", "score")
KIND_DIRECTION = {"rate": "higher", "time": "lower"}
STREAMS = ("stdout", "stderr")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
NAME_RULE = "a letter or _, then letters, digits, _ . - /"


def check_name(name: str, what: str = "metric") -> str:
    """A metric's name as given, or one UsageError line saying what a name may hold."""
    if not name:
        raise UsageError(f"{what}: the name is empty; a name is {NAME_RULE}")
    if not NAME.fullmatch(name):
        raise UsageError(f"{what}: {name!r} is not a metric name; a name is {NAME_RULE}")
    return name


@dataclass(frozen=True)
class Metric:
    """One figure a job's output gives, declared before the job runs."""

    name: str
    better: str  # "higher" or "lower", always stated (a metric without a direction is refused)
    unit: str = ""
    # False: a figure printed once (printed again, the last one stands for the trial); True: printed every step,
    # the trial's figure summarised over the steps (mean, +/-, jitter)
    per_step: bool = False
    # a per-step figure that already summarises every step so far (tf_cnn_benchmarks' `images/sec: X +/- Y
    # (jitter = Z)` lines): the last one printed stands for the trial; never average them
    cumulative: bool = False
    required: bool = True  # the trial fails if it never appears (False for a figure only some runs print)
    pattern: str | None = None  # the user's regex (--metric / --step-metric)
    read_from: str = ""  # how a ready parser finds it, in words
    description: str = ""
    # rate, time or score (KINDS): a verdict's words, faster/slower for a rate or a time, better/worse for a score;
    # a rate is always higher-is-better and a time lower-is-better
    kind: str = "score"

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.better not in DIRECTIONS:
            raise UsageError(f"metric {self.name}: its direction must be higher or lower, not {self.better!r} "
                             "(gpuvs never guesses which way is better)")
        if self.cumulative and not self.per_step:
            raise UsageError(f"metric {self.name}: only a per-step figure can be cumulative")
        if self.kind not in KINDS:
            raise UsageError(f"metric {self.name}: its kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if KIND_DIRECTION.get(self.kind, self.better) != self.better:
            raise UsageError(f"metric {self.name}: a {self.kind} is {KIND_DIRECTION[self.kind]}-is-better, "
                             f"not {self.better}")

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    @property
    def where(self) -> str:
        """How it is read, for messages: "regex 'loss: (\\S+)'" or the ready parser's words."""
        return f"regex {self.pattern!r}" if self.pattern is not None else self.read_from


# The default headline of a command: measured by the wrapper from launch to exit, not parsed from the output.
WALL_TIME = Metric("wall_time_s", "lower", "s", read_from="measured by gpuvs from launch to exit",
                   description="wall time from the command's launch to its exit", kind="time")


@dataclass(frozen=True)
class Line:
    """One line of a job's output as it arrived: its text (no line end), its stream and its number there (1-based)."""

    text: str
    stream: str = "stdout"
    number: int = 0

    @property
    def source(self) -> str:
        return f"{self.stream} line {self.number}"


@dataclass(frozen=True)
class Reading:
    """One value of one metric, as the job printed or wrote it.

    step: the step it belongs to (per-step figures), None for a figure printed once. source: where it came
    from ("stdout line 12", "file out.json"); text: that line (or the part of the file) as read. extra:
    figures printed beside it that are not metrics of their own (tf_cnn_benchmarks' +/- and jitter)."""

    name: str
    value: float
    unit: str
    step: int | None
    source: str
    text: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def wall_time(seconds: float) -> Reading:
    """The wrapper's own reading of the default headline."""
    return Reading(WALL_TIME.name, float(seconds), WALL_TIME.unit, None, "gpuvs", "launch to exit")


class OutputError(WorkloadError):
    """The job's output is not what its parsers read: a figure that is not a number, a malformed JSON metric line,
    a file the job should have written and did not. The trial fails with this message."""

    def __init__(self, message: str, kind: str = "crash"):
        super().__init__(kind, message)


def number(text: str, what: str) -> float:
    """A printed figure as a finite float (Python's float syntax: 12, 1.5e-3), or OutputError naming `what`: nan and
    the infinities are refused, so a job's last figure is never replaced by an earlier one (the summary skips none)."""
    try:
        value = float(text)
    except ValueError:
        raise OutputError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise OutputError(f"{what}: the command printed {text!r}, not a finite number")
    return value


@dataclass(frozen=True)
class Job:
    """What a parser may know of the job before it runs: its argv (a ready parser finds its file or test there
    when not told) and its working directory (where relative files it wrote are found; None: the current one)."""

    argv: tuple[str, ...] = ()
    workdir: str | None = None

    def path(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() or self.workdir is None else Path(self.workdir) / p


class Parser:
    """Reads one job's output. Made before the job starts (bad arguments are a UsageError then), fed every line as
    it arrives (feed: readings as soon as they appear, so that a wrapper streams them while the job runs), and
    told when the job has exited (finish: readings from files it wrote, or from what feed kept)."""

    name: ClassVar[str]  # the registry key, what --parser names
    summary: ClassVar[str]  # one line
    arg: ClassVar[str | None] = None  # what NAME:ARG means; None: the parser takes no argument
    # needs the job's files after it exits: not there where gpuvs sees only the job's output, as in bare mode
    reads_files: ClassVar[bool] = False
    declares_at_run_time: ClassVar[bool] = False  # metrics named by the output itself (JSON lines)

    def __init__(self, arg: str | None = None, job: Job | None = None):
        if arg is not None and self.arg is None:
            raise UsageError(f"parser {self.name} takes no argument (given {self.name}:{arg})")
        self.job = job or Job()
        self.metrics: tuple[Metric, ...] = ()  # declared before the run
        self.headline: str | None = None  # the metric carrying the verdict; None leaves it to wall time
        self.info: dict[str, Any] = {}  # facts read that are not metrics: version, settings, counts

    @property
    def label(self) -> str:
        """The parser in messages."""
        return f"parser {self.name}"

    def feed(self, line: Line) -> list[Reading]:
        return []

    def finish(self) -> list[Reading]:
        return []

    def expects(self) -> list[tuple[str, str]]:
        """(name, how it is read) of each metric that must appear, or the trial fails."""
        return [(m.name, m.where) for m in self.metrics if m.required]

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)

    def reading(self, name: str, value: float, at: Line | str, step: int | None = None, **extra: float) -> Reading:
        """A reading of one of this parser's declared metrics, from a line (or a source named in words: a file)."""
        m = self.metric(name)
        if m is None:
            raise RuntimeError(f"parser {self.name} read {name}, which it does not declare")
        source, text = (at.source, at.text) if isinstance(at, Line) else (at, "")
        return Reading(name, value, m.unit, step, source, text, dict(extra))
