"""One command job (the `command` workload's trial): its output read as it arrives and turned into gpuvs's protocol
events, wherever it runs. The same Session serves both ways a job runs:

- wrapped: gpuvs's worker runs in the environment and starts the job as its child (run(), below): the job's
  stdout and stderr are pipes the worker reads, its wall time is the worker's clock from the job's start to its
  exit, and everything else the worker does (fingerprint, NVML telemetry, start-up breakdown) comes with it;
- bare (bare.py): the job is the environment's own process (the container's, the pod's, or a child of gpuvs on
  the host) and gpuvs reads its output from the engine or the cluster, outside.

Each reading is a sample, streamed as it appears: a figure printed every step is a sample per step; a figure
printed once is a sample each time it is printed (the last one stands for the trial), and so is a cumulative
figure (tf_cnn_benchmarks' running images/sec, with its +/- and jitter). The trial's wall time (`wall_time_s`) is a
sample too. summarize() gives the trial's figure of each: the mean, +/- and jitter of a per-step figure (the
definitions of stats.summarize_series for figures that are not items over time, in plain Python: the worker may run
in an image whose Python has no numpy), the last printing otherwise.

Each stream's text is kept for the store, capped at OUTPUT_CAP bytes (its first HEAD and last TAIL bytes, and how
much was cut between them) and shown by `gpuvs results show ID --log`.

Standard library only (with gpuvs.outputs, gpuvs.events and gpuvs.contain): it runs inside the user's image."""

from __future__ import annotations

import math
import os
import queue
import shlex
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from gpuvs import contain, events, outputs
from gpuvs.errors import WorkloadError
from gpuvs.outputs import WALL_TIME, Metric, Reading

HEAD = 16 * 1024  # bytes of a stream kept from its start
TAIL = 48 * 1024  # and from its end
OUTPUT_CAP = HEAD + TAIL  # at most this much of each stream is stored
AFTER_EXIT_S = 2.0  # output read after the job's own exit (a child it left may still hold the pipe open)
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
        text = self.head.decode("utf-8", "replace")
        if cut:
            text += f"\n[... gpuvs kept the first {len(self.head)} and the last {len(self.tail)} bytes of " \
                    f"{self.total}: {cut} bytes cut here ...]\n"
        text += self.tail.decode("utf-8", "replace")
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

    def line(self, stream: str, data: bytes, at: float) -> list[dict[str, Any]]:
        """One line of output (its newline may be on it), arrived at `at`."""
        self.captures.setdefault(stream, Capture(stream)).add(data)
        out = self.mark("first_output_s", at)
        readings = self.reader.feed(data, stream)
        if readings:
            out += self.mark("first_result_s", at)
        return out + [self.sample(r) for r in readings]

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

    def ended(self, code: int | None, wall_s: float | None, signalled: str | None = None
              ) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
        """The job has exited with status `code` (None: unknown) after `wall_s` seconds (None: not measured):
        (what its parsers read at the end, its wall time and its output as events; the trial's failure as (kind,
        message), or None)."""
        out = [self.sample(r) for r in self.reader.finish()]
        if wall_s is not None:
            out.append(self.sample(self.reader.wall_time(wall_s)))
        if self.reader.info:
            out.append(events.config(parser_info=self.reader.info))
        out += self.output_events()
        return out, self.failure(code, signalled)

    def output_events(self) -> list[dict[str, Any]]:
        return [c.event() for c in self.captures.values() if c.total or c.stream == "stdout"]

    def last_lines(self, n: int = 5) -> str:
        shown = " | ".join(f"{ln.stream}: {' '.join(ln.text.split())[:200]}" for ln in self.reader.tail(n))
        return shown or "(the command printed nothing)"

    def failure(self, code: int | None, signalled: str | None = None) -> tuple[str, str] | None:
        if signalled:
            return "crash", f"the command was killed by {signalled}; last lines: {self.last_lines()}"
        if code is not None and code != 0:
            return "crash", f"the command exited with status {code}; last lines: {self.last_lines()}"
        why = self.reader.failure()
        return ("crash", why) if why else None

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
    arr = sorted(values)
    median = statistics.median(arr)
    pm = statistics.stdev(arr) / math.sqrt(len(arr)) if len(arr) > 1 else 0.0
    mean = statistics.fmean(arr)
    return {"value": mean, "mean": mean, "pm": pm, "jitter": MAD_SCALE * statistics.median(abs(v - median) for v in arr),
            "median": median, "min": arr[0], "max": arr[-1], "p50": _percentile(arr, 50), "p90": _percentile(arr, 90),
            "p99": _percentile(arr, 99)}


def summarize(samples: list[dict[str, Any]], metrics: list[Metric], headline: str | None) -> dict[str, dict[str, Any]]:
    """{figure: its trial summary}, the headline first. Each summary carries its declaration ("declared": better,
    the verdict's words, headline), so that a figure the job declared while it ran (JSON lines) is compared with
    its own words, never guessed ones."""
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


def _pump(stream: str, pipe, lines: queue.Queue) -> None:
    for raw in iter(pipe.readline, b""):
        lines.put((stream, raw, time.time()))
    lines.put((stream, None, time.time()))


def run(session: Session) -> Iterator[dict[str, Any]]:
    """Run the job as this process's child and yield events as its output arrives; raise WorkloadError with its
    fate when it fails. The job runs under a keeper (contain.py) that ends its whole tree, daemons included, at
    its exit, when the worker stops it (a timeout, Ctrl-C, SIGTERM: the worker is interrupted) and when the worker
    is gone (killed with its group after gpuvs was)."""
    settings = session.settings
    yield session.config("wrapped: gpuvs's worker runs the command as its child")
    try:
        proc = contain.popen(settings.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=settings.workdir,
                             env=job_environment())
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
    lines: queue.Queue = queue.Queue()
    pumps = [threading.Thread(target=_pump, args=(s, getattr(proc, s), lines), daemon=True)
             for s in ("stdout", "stderr")]
    for t in pumps:
        t.start()
    wall_s = None
    try:
        open_streams, exited_at = 2, None
        while open_streams:
            if exited_at is None and proc.poll() is not None:
                wall_s, exited_at = time.perf_counter() - t0, time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > AFTER_EXIT_S:
                break  # a child the job left holds its output open: what it printed so far is read
            try:
                stream, raw, at = lines.get(timeout=0.05 if exited_at is None else 0.2)
            except queue.Empty:
                continue
            if raw is None:
                open_streams -= 1
                continue
            yield from session.line(stream, raw, at)
        if wall_s is None:
            code = proc.wait()
            wall_s = time.perf_counter() - t0
    except GeneratorExit:  # the worker stopped reading (it was interrupted between two events): stop the job
        _stop(proc)
        raise
    except BaseException:  # interrupted (the worker's SIGTERM, Ctrl-C): stop the job, keep what it printed
        _stop(proc)
        _drain(session, lines)
        yield from session.output_events()
        raise
    proc.close()  # what the job left running has ended (contain.py)
    wall_s = proc.wall_s if proc.wall_s is not None else wall_s  # the keeper's clock: the fork to reaping the job
    code = proc.returncode
    done, failure = session.ended(code, wall_s, signal_name(code) if code < 0 else None)
    yield from done
    if failure is not None:
        raise WorkloadError(*failure)


def _stop(proc: contain.Contained) -> None:
    proc.stop(STOP_GRACE_S)  # SIGTERM to the job's whole tree, SIGKILL to what is left after the grace


def _drain(session: Session, lines: queue.Queue, wait_s: float = 0.5) -> None:
    """What the pipes still hold after the job was stopped (its lines, not its readings: the trial failed)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            stream, raw, at = lines.get(timeout=0.05)
        except queue.Empty:
            continue
        if raw is not None:
            session.captures.setdefault(stream, Capture(stream)).add(raw)
