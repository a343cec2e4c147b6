"""One command job (the `command` workload's trial): its output read as it arrives, turned into protocol events.

One Session serves both ways a job runs, wrapped (run(), below) and bare (bare.py); each reading is a sample.
Wrapped, the pipes are read to their end in bounded memory (_Pipes) and each stream's text is capped (OUTPUT_CAP).
Standard library only (with outputs/, probes.program, events and contain): it runs inside the user's image."""

from __future__ import annotations

import math
import os
import queue
import random
import select
import shlex
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from gpuvs import contain, events, pipequeue
from gpuvs.workloads.command import outputs
from gpuvs.probes import program
from gpuvs.errors import WorkloadError
from gpuvs.workloads.command.outputs import Metric, Reading, budget
from gpuvs.safetext import clip, safe_text

HEAD = 16 * 1024  # bytes of a stream kept from its start
TAIL = 48 * 1024  # and from its end
OUTPUT_CAP = HEAD + TAIL  # at most this much of each stream is stored
AFTER_EXIT_S = 2.0  # after the job's exit, a pipe still open with nothing arriving this long is held by another
# process (one it left in the background): reading stops there and the trial fails
MAX_LINE = 1024 * 1024  # bytes of one line its parsers read (the rest of a longer line is stored, not parsed)
KEEP_FIRST = 10_000  # samples of a series stored as they come; of the rest, a uniform draw of RESERVOIR (and the
RESERVOIR = 10_000  # last one): the summary's count, mean, +/-, min and max are over every sample all the same
STOP_GRACE_S = 1.0  # a job being stopped gets this long after SIGTERM before SIGKILL
MAD_SCALE = 1.4826


@dataclass
class Settings:
    """The command workload's parameters, checked: what to run and how its output is read."""

    argv: list[str]
    parsers: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    step_metrics: list[str] = field(default_factory=list)
    headline: str | None = None
    workdir: str | None = None
    bare: bool = False

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Settings":
        return cls(argv=list(params.get("argv") or []), parsers=list(params.get("parser") or []),
                   metrics=list(params.get("metric") or []), step_metrics=list(params.get("step_metric") or []),
                   headline=params.get("headline") or None, workdir=params.get("workdir") or None,
                   bare=bool(params.get("bare")))

    def reader(self) -> outputs.Reader:
        """A fresh reader of this job's output (raises UsageError for anything that cannot be read)."""
        return outputs.make_reader(self.parsers, self.metrics, self.step_metrics, self.headline,
                                   outputs.Job(tuple(self.argv), self.workdir))

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


class Capture:
    """One stream's text as the store keeps it: its first HEAD and last TAIL bytes, the rest counted."""

    def __init__(self, stream: str, head: int = HEAD, tail: int = TAIL):
        self.stream, self.head_cap, self.tail_cap = stream, head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.lines = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.lines += data.count(b"\n")
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[:len(self.tail) - self.tail_cap]

    def event(self) -> dict[str, Any]:
        cut = self.total - len(self.head) - len(self.tail)
        text = self.head.decode("utf-8", "backslashreplace")
        if cut:
            text += f"\n[... gpuvs kept the first {len(self.head)} and the last {len(self.tail)} bytes of " \
                    f"{self.total}: {cut} bytes cut here ...]\n"
        text += self.tail.decode("utf-8", "backslashreplace")
        return events.output(self.stream, text, self.total, self.lines, cut)


def decl_words(metric: Metric) -> tuple[str, str]:
    """A verdict's words for a figure above / below the baseline's, from its declared kind."""
    if metric.kind == "rate":
        return "faster", "slower"
    if metric.kind == "time":
        return "slower", "faster"
    return ("better", "worse") if metric.better == "higher" else ("worse", "better")


def steps_only(metric: Metric) -> bool:
    """A figure whose trial value summarises its steps (mean, +/-, jitter); every other one's is its last."""
    return metric.per_step and not metric.cumulative


class Series:
    """One series' samples as the store keeps them, in bounded space: the first KEEP_FIRST sent on as they come,
    then a uniform reservoir of RESERVOIR of the rest (Algorithm R, seeded: the same output keeps the same samples),
    sent with the last one at the end. Its count, exact sum (math.fsum's partials), variance (Welford's), minimum
    and maximum are over every sample."""

    def __init__(self, name: str):
        self.name = name
        self.n = 0  # samples
        self._k = 0  # of them with a value
        self._partials: list[float] = []  # the exact running sum (Shewchuk's algorithm, as math.fsum)
        self._mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.reservoir: list[tuple[int, dict[str, Any]]] = []
        self.last: tuple[int, dict[str, Any]] | None = None
        self._random = random.Random(name)

    def add(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The event to send on now, or None (held for the end, or not kept)."""
        value = event.get("value")
        index = self.n
        self.n += 1
        if value is not None:
            self._count(float(value))
        self.last = (index, event)
        if index < KEEP_FIRST:
            return event
        seen = index - KEEP_FIRST  # of the rest, this one's place
        if seen < RESERVOIR:
            self.reservoir.append((index, event))
        else:
            j = self._random.randrange(seen + 1)
            if j < RESERVOIR:
                self.reservoir[j] = (index, event)
        return None

    def _count(self, value: float) -> None:
        self._k += 1
        self.min, self.max = min(self.min, value), max(self.max, value)
        delta = value - self._mean
        self._mean += delta / self._k
        self._m2 += delta * (value - self._mean)
        partials, i, x = self._partials, 0, value
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]

    def held(self) -> list[dict[str, Any]]:
        """The samples held for the end, in the order they came: the reservoir's, and the last one."""
        kept = dict(self.reservoir)
        if self.last is not None and self.last[0] >= KEEP_FIRST:
            kept[self.last[0]] = self.last[1]
        return [kept[i] for i in sorted(kept)]

    @property
    def kept(self) -> int:
        return min(self.n, KEEP_FIRST) + len(self.held())

    def figures(self) -> dict[str, float]:
        """n, mean, +/- (standard error), min and max over every sample."""
        out: dict[str, float] = {"n": self._k}
        if self._k:
            mean = math.fsum(self._partials) / self._k
            sd = math.sqrt(max(self._m2, 0.0) / (self._k - 1)) if self._k > 1 else 0.0
            out.update(mean=mean, pm=sd / math.sqrt(self._k), min=self.min, max=self.max)
        return out

    def words(self) -> str:
        return (f"{self.name}: kept {self.kept:,} of {self.n:,} samples (the first {KEEP_FIRST:,}, then "
                f"{len(self.reservoir):,} drawn uniformly from the rest, and the last)")


class Session:
    """A job's output in, protocol events out. `streams`: the streams the job's output arrives on (a pod's log is
    one stream, stdout). Times are seconds on the caller's clock; `launched` is when gpuvs launched the trial."""

    def __init__(self, settings: Settings, launched: float, streams: tuple[str, ...] = ("stdout", "stderr")):
        self.settings = settings
        self.reader = settings.reader()
        self.launched = launched
        self.captures = {s: Capture(s) for s in streams}
        self.marks: dict[str, float] = {}
        self._printed: dict[str, int] = {}
        self._cutting: dict[str, list[int]] = {}  # stream -> [number, bytes so far] of a line cut at MAX_LINE
        self.series: dict[str, Series] = {}  # each series' samples, kept in bounded space

    # -- as the job runs --------------------------------------------------------------------------------------------

    def config(self, mode: str, **more: Any) -> dict[str, Any]:
        s = self.settings
        return events.config(command=s.text, mode=mode, workdir=s.workdir or "(the environment's own)",
                             parsers=", ".join(s.parsers) or "-", headline=self.reader.headline,
                             output_kept=f"first {HEAD // 1024} KiB and last {TAIL // 1024} KiB of each stream",
                             **more)

    def mark(self, name: str, at: float) -> list[dict[str, Any]]:
        """A start-up stage, once: seconds from the trial's launch."""
        if name in self.marks:
            return []
        self.marks[name] = at - self.launched
        return [events.startup(name, self.marks[name])]

    def keep(self, stream: str, data: bytes) -> None:
        """Output stored (within the cap) but not parsed: the rest of an over-long line, a stopped job's last words."""
        self.captures.setdefault(stream, Capture(stream)).add(data)

    def pieces(self, stream: str, pieces: Iterator[tuple[bytes, bool]], at: float) -> list[dict[str, Any]]:
        """What a _Splitter made of a chunk: each line parsed, and the rest of a line past MAX_LINE kept and
        counted (a line cut there is named if a metric never appeared)."""
        out: list[dict[str, Any]] = []
        for piece, parse in pieces:
            if parse:
                out += self.line(stream, piece, at)
                continue
            self.keep(stream, piece)
            cut = self._cutting.setdefault(stream, [self.reader.lines(stream), MAX_LINE])
            cut[1] += len(piece)
            if piece.endswith(b"\n"):
                self._cut_ended(stream)
        return out

    def _cut_ended(self, stream: str) -> None:
        number, size = self._cutting.pop(stream)
        self.reader.cut(f"line {number} of {stream} was {size / 2**20:.1f} MiB, cut at {MAX_LINE // 2**20} MiB: "
                        "a metric past the cut is not read")

    def line(self, stream: str, data: bytes, at: float) -> list[dict[str, Any]]:
        """One line of output (its newline may be on it), arrived at `at`."""
        self.keep(stream, data)
        out = self.mark("first_output_s", at)
        readings = self.reader.feed(data, stream)
        if readings:
            out += self.mark("first_result_s", at)
        return out + self.samples(readings)

    def samples(self, readings: list[Reading]) -> list[dict[str, Any]]:
        """The sample events to send now (Series: a long series' later samples are held for the end, or dropped)."""
        out = []
        for reading in readings:
            series = self.series.get(reading.name)
            if series is None:
                series = self.series[reading.name] = Series(reading.name)
            event = series.add(self.sample(reading))
            if event is not None:
                out.append(event)
        return out

    def sample(self, reading: Reading) -> dict[str, Any]:
        metric = self.reader.metric(reading.name)
        if reading.step is not None and metric is not None and steps_only(metric):
            return events.sample(reading.step, reading.value, reading.unit, series=reading.name, source=reading.source,
                                 display=True)
        self._printed[reading.name] = self._printed.get(reading.name, 0) + 1  # the n-th printing of the figure
        step = reading.step if reading.step is not None else self._printed[reading.name]
        return events.sample(step, reading.value, reading.unit, series=reading.name, source=reading.source,
                             **reading.extra)

    # -- once it has ended ------------------------------------------------------------------------------------------

    def ended(self, code: int | None, wall_s: float | None, signalled: str | None = None, unread: str | None = None
              ) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
        """The job has exited with status `code` (None: unknown) after `wall_s` seconds (None: not measured);
        `unread`: why its output could not be read to its end (None: it was). (What its parsers read at the end,
        its wall time and its output as events; the trial's failure as (kind, message), or None.)"""
        for stream in list(self._cutting):
            self._cut_ended(stream)
        out = self.samples(self.reader.finish())
        if wall_s is not None:
            out += self.samples([self.reader.wall_time(wall_s)])
        out += self.held()
        if self.reader.info:
            out.append(events.config(parser_info=self.reader.info))
        out += self.output_events()
        return out, self.failure(code, signalled, unread)

    def held(self) -> list[dict[str, Any]]:
        """The samples held for the end (Series), and what was kept of each series cut, said in the config."""
        out = [e for series in self.series.values() for e in series.held()]
        cut = [series.words() for series in self.series.values() if series.kept < series.n]
        if cut:
            out.append(events.config(samples_kept="; ".join(cut)))
        return out

    def output_events(self) -> list[dict[str, Any]]:
        return [c.event() for c in self.captures.values() if c.total or c.stream == "stdout"]

    def last_lines(self, n: int = 5) -> str:
        """The job's last lines on one line, each its first 200 characters (whole words), control characters escaped (safetext.py)."""
        shown = " | ".join(f"{ln.stream}: {safe_text(clip(' '.join(ln.text.split()), 200))}" for ln in self.reader.tail(n))
        return shown or "(the command printed nothing)"

    def failure(self, code: int | None, signalled: str | None = None, unread: str | None = None
                ) -> tuple[str, str] | None:
        if signalled:
            return "crash", f"the command was killed by {signalled}; last lines: {self.last_lines()}"
        if code is not None and code != 0:
            return "crash", f"the command exited with status {code}; last lines: {self.last_lines()}"
        if unread:
            return "crash", unread
        why = self.reader.failure()
        return (self.reader.problem_kind, why) if why else None

    def metrics(self) -> list[Metric]:
        return self.reader.metrics


def signal_name(code: int) -> str:
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return name + (" (the kernel's out-of-memory killer sends it: see `dmesg`)" if -code == signal.SIGKILL else "")


# -- the trial's figures ------------------------------------------------------------------------------------------

def _percentile(sorted_values: list[float], q: float) -> float:
    """numpy's default (linear) percentile of sorted values."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def steps_summary(values: list[float]) -> dict[str, float]:
    """stats.summarize_series of figures that are not items over time: the mean, +/- (the standard error: sample
    standard deviation / sqrt(n)), jitter (1.4826 x the median absolute deviation), median, range, percentiles."""
    arr = sorted(values)  # in plain Python: the worker may run in an image whose Python has no numpy
    median = statistics.median(arr)
    pm = statistics.stdev(arr) / math.sqrt(len(arr)) if len(arr) > 1 else 0.0
    mean = statistics.fmean(arr)
    return {"value": mean, "mean": mean, "pm": pm, "jitter": MAD_SCALE * statistics.median(abs(v - median) for v in arr),
            "median": median, "min": arr[0], "max": arr[-1], "p50": _percentile(arr, 50), "p90": _percentile(arr, 90),
            "p99": _percentile(arr, 99)}


def summarize(samples: list[dict[str, Any]], metrics: list[Metric], headline: str | None,
              series: dict[str, Series] | None = None) -> dict[str, dict[str, Any]]:
    """{figure: its trial summary}, the headline first. Each summary carries its declaration ("declared": better,
    the verdict's words, headline), so that a figure the job declared while it ran (JSON lines) is compared with
    its own words, never guessed ones. `series`: the session's, where a series kept fewer samples than it had:
    its n, mean, +/-, min and max are then over all of them ("kept": how many are stored), its median, jitter
    and percentiles over those kept."""
    by_name = {m.name: m for m in metrics}
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        if s.get("value") is not None:
            groups.setdefault(s.get("series", "main"), []).append(s)
    out: dict[str, dict[str, Any]] = {}
    for name, group in groups.items():
        metric = by_name.get(name)
        values = [float(s["value"]) for s in group]
        summary: dict[str, Any] = {"n": len(values), "unit": group[0].get("unit", "")}
        if metric is not None:
            up, down = decl_words(metric)
            summary.update(better=metric.better, higher_is_better=metric.higher_is_better,
                           declared={"better": metric.better, "up": up, "down": down, "headline": name == headline,
                                     "kind": metric.kind})
        if metric is None or steps_only(metric):
            summary.update(steps_summary(values), figure="steps")
        else:
            last = group[-1]
            extra = last.get("extra") or {}
            summary.update(value=values[-1], pm=extra.get("pm"), jitter=extra.get("jitter"), figure="last printed")
        whole = (series or {}).get(name)
        if whole is not None and whole.kept < whole.n:
            figures = whole.figures()
            if summary["figure"] == "steps":
                summary.update(figures, value=figures["mean"])
            summary.update(n=figures["n"], kept=len(values))
        out[name] = summary
    if headline in out:
        out = {headline: out[headline], **{k: v for k, v in out.items() if k != headline}}
    return out


# -- wrapped: the worker runs the job as its child ----------------------------------------------------------------------

def job_environment() -> dict[str, str]:
    """The worker's environment for the job, without what gpuvs set for itself: the run spec, the parent watch,
    and gpuvs's own package on PYTHONPATH (the job's Python must not find gpuvs's packages first). Output is
    unbuffered (PYTHONUNBUFFERED=1, unless --env-var says otherwise), so that a Python job's figures arrive as printed."""
    import gpuvs

    env = dict(os.environ)
    for key in ("GPUVS_SPEC", "GPUVS_PARENT_PID"):
        env.pop(key, None)
    ours = os.path.dirname(os.path.dirname(os.path.abspath(gpuvs.__file__)))
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != ours]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class _Splitter:
    """One pipe's bytes into lines as they arrive, holding at most MAX_LINE bytes of a line not yet ended: a longer
    line reaches the parsers as its first MAX_LINE bytes (with its \\r-rewritten versions up to there), and the store
    keeps it all (within the cap)."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.skipping = False  # past MAX_LINE of the current line: its rest is stored, not parsed

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bool]]:
        """(bytes, parse it) in order; every byte given comes out once."""
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end + 1]
            start += len(piece)
            if self.skipping:
                yield piece, False
                if end >= 0:
                    self.skipping = False
                continue
            room = MAX_LINE - len(self.pending)
            if len(piece) > room:
                self.pending += piece[:room]
                yield bytes(self.pending), True
                yield piece[room:], False
                self.pending.clear()
                self.skipping = end < 0
                continue
            if end < 0:
                self.pending += piece
                continue
            if self.pending:
                piece, self.pending = bytes(self.pending) + piece, bytearray()
            yield piece, True

    def end(self) -> Iterator[tuple[bytes, bool]]:
        """The last line, which had no line end."""
        if self.pending:
            yield bytes(self.pending), True
            self.pending.clear()


class _Pipes:
    """The job's stdout and stderr, each read by a thread as it comes (pipequeue.Pump: what the pipe holds at once)
    into a queue that this thread takes to the parsers. The queue never makes a reader wait: past 16 MiB in memory
    it spills to a temporary file (pipequeue.py), so the job runs at full speed whatever it prints, and nothing is
    dropped. A read that found a pipe full counts as time the job may have waited on it (blocked())."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.queue = pipequeue.SpillQueue()
        self.open = {"stdout", "stderr"}
        self.splitters = {s: _Splitter() for s in self.open}
        self.exited_at: float | None = None  # perf_counter at the job's exit, taken by a thread that waits for it
        self.pumps = [pipequeue.Pump(s, getattr(proc, s).fileno(), self.queue) for s in ("stdout", "stderr")]
        self._waiter = threading.Thread(target=self._wait, name="gpuvs-job-wait", daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited_at = time.perf_counter()
        self.queue.put(("exit", None, time.time()))

    def blocked(self) -> tuple[int, float]:
        """(reads that found a pipe full, the time the job may have waited on its pipes: an upper bound)."""
        return pipequeue.blocked(self.pumps, self.queue)

    def read(self, timeout: float | None) -> tuple[str, bytes | None, float] | None:
        """What arrived next within `timeout`: (stream, bytes, arrival time), with None for a stream that reached
        its end (the job's exit is ("exit", None, ...)); None: nothing arrived."""
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        assert item is not None
        if item[1] is None:
            self.open.discard(item[0])
        return item

    def pending(self) -> bool:
        """Whether a pipe still open has something to read now (data, or its end)."""
        pipes = [getattr(self.proc, s) for s in self.open]
        try:
            return bool(pipes) and bool(select.select(pipes, [], [], 0)[0])
        except (ValueError, OSError):
            return False

    def close(self) -> None:
        """Once both pipes reached their end (a pipe another process still holds is left to the process's exit:
        its reader is blocked on it)."""
        if not self.open:
            for stream in ("stdout", "stderr"):
                getattr(self.proc, stream).close()
            self.queue.close()


def run(session: Session) -> Iterator[dict[str, Any]]:
    """Run the job as this process's child and yield events as its output arrives; raise WorkloadError with its
    fate when it fails. The job runs under a keeper (contain.py) that ends its whole tree, daemons included, at
    its exit, when the worker stops it (a timeout, Ctrl-C, SIGTERM: the worker is interrupted) and when the worker
    is gone (killed with its group after gpuvs was). Its output is read to the end of both pipes (EOF), every line
    through the parsers; if a process outside the job's tree still holds a pipe open AFTER_EXIT_S after the job's
    exit with nothing more arriving, the trial fails saying so (a partial read is never a result)."""
    settings = session.settings
    yield session.config("wrapped: gpuvs's worker runs the command as its child")
    env = job_environment()
    try:
        proc = contain.popen(settings.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=settings.workdir,
                             env=env)
    except FileNotFoundError:
        where = "the working directory" if settings.workdir and not os.path.isdir(settings.workdir) else "PATH"
        what = (f"the working directory {settings.workdir} does not exist here" if where != "PATH" else
                f"the command's executable {settings.argv[0]!r} is not here (PATH={os.environ.get('PATH', '')})")
        raise WorkloadError("unavailable", what) from None
    except PermissionError as exc:
        raise WorkloadError("unavailable", f"the command's executable {settings.argv[0]!r} cannot be run here: "
                                           f"{exc.strerror}") from None
    t0 = time.perf_counter()
    yield events.config(containment=proc.containment)
    yield from session.mark("job_start_s", time.time())
    pipes = _Pipes(proc)
    held: list[str] = []
    try:
        with budget.watching():  # a --metric regex past its time on a line is stopped (outputs/budget.py)
            held = yield from _read(session, pipes)
        code = proc.wait()
    except GeneratorExit:  # the worker stopped reading (it was interrupted between two events): stop the job
        _stop(proc)
        pipes.close()
        raise
    except BaseException:  # interrupted (the worker's SIGTERM, Ctrl-C): stop the job, keep what it printed
        _stop(proc)
        _drain(session, pipes)
        pipes.close()
        yield from session.output_events()
        raise
    wall_s = (pipes.exited_at or time.perf_counter()) - t0
    proc.close()  # what the job left running has ended (contain.py)
    pipes.close()
    wall_s = proc.wall_s if proc.wall_s is not None else wall_s  # the keeper's clock: the fork to reaping the job
    code = proc.returncode if proc.returncode is not None else code
    # what it ran, read here where it ran, once it has ended (its --version never inside the measurement)
    yield events.config(program=program.describe(settings.argv, os.path.abspath(settings.workdir or os.getcwd()), env))
    flag = pipe_waits(*pipes.blocked(), wall_s)
    if flag:
        yield flag
    done, failure = session.ended(code, wall_s, signal_name(code) if code < 0 else None,
                                  unread=unread_text(held, wall_s) if held else None)
    yield from done
    if failure is not None:
        raise WorkloadError(*failure)


def pipe_waits(full: int, waited_s: float, wall_s: float | None) -> dict[str, Any] | None:
    """A trial whose job found its output pipe full: the config event that flags it (its wall time may hold up to
    that much of gpuvs's reading; an upper bound, so the trial is flagged, not failed), else None."""
    if not full:
        return None
    of = f" of its {wall_s:.3g} s" if wall_s is not None else ""
    said = (f"gpuvs found the command's output pipe full {full} time{'s' * (full > 1)}: the command may have "
            f"waited up to {waited_s:.3g} s{of} on it (its wall time may hold that much of gpuvs's reading)")
    return events.config(output_pipe_full=said)


def unread_text(held: list[str], wall_s: float | None) -> str:
    """The trial's failure when its output could not be read to its end: `held`, the streams still open."""
    after = f" after {wall_s:.3g} s" if wall_s is not None else ""
    held = sorted(held, key=lambda s: (s != "stdout", s))
    return (f"gpuvs could not read the command's output to its end: the command exited{after}, but its "
            f"{' and '.join(held)} stayed open and silent {AFTER_EXIT_S:g} s later (a process outside its tree "
            "holds it: what the command left behind was ended at its exit); its figures may miss lines, so the trial is not kept as a "
            "result")


def _read(session: Session, pipes: _Pipes):
    """Every line of both pipes through the session, as events, until both reach their end; the streams still
    open if the job exited and they stayed open and silent for AFTER_EXIT_S (something else holds them)."""
    quiet_since = None  # monotonic time since when nothing arrived, after the job's exit
    while pipes.open:
        item = pipes.read(0.2 if pipes.exited_at is not None else None)
        if item is None:
            if pipes.pending():  # data (or its end) waits in a pipe: its reader is behind, not blocked
                quiet_since = None
                continue
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= AFTER_EXIT_S:
                return sorted(pipes.open)
            continue
        quiet_since = None
        stream, data, at = item
        if stream == "exit":
            continue
        splitter = pipes.splitters[stream]
        yield from session.pieces(stream, splitter.feed(data) if data is not None else splitter.end(), at)
    return []


def _stop(proc: contain.Contained) -> None:
    proc.stop(STOP_GRACE_S)  # SIGTERM to the job's whole tree, SIGKILL to what is left after the grace


def _drain(session: Session, pipes: _Pipes, wait_s: float = 0.5) -> None:
    """What the pipes still hold after the job was stopped (its output kept, not parsed: the trial failed)."""
    deadline = time.monotonic() + wait_s
    while pipes.open and time.monotonic() < deadline:
        item = pipes.read(0.05)
        if item is not None and item[1] is not None:
            session.keep(item[0], item[1])
