"""command: any program as a workload, `gpuvs run command -- ARGV...`, executed as given, never through a shell.

Its figures are read from its own output (outputs/); the default headline is its wall time, launch to exit.
Wrapped (the default), gpuvs's worker starts it as its child (job.py).
Bare (--bare), it is the environment's own process, read from outside (bare.py). docs/command.md is the reference."""

from __future__ import annotations

import shlex
from typing import Any, Iterator

from gpuvs.workloads.command import outputs
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.spec import RunSpec
from gpuvs.workloads import register
from gpuvs.workloads.workload import MetricDecl, RunContext, Workload, duration, rate, score


class ArgvParam(Param):
    """The command line: a list as given (after `--`, or a YAML list); a single string (an --arm value such as
    command=sysbench cpu run) is split into words as a shell would split them, and never run through one."""

    def coerce(self, raw: Any) -> Any:
        if raw is None:
            return None
        if isinstance(raw, str):
            try:
                raw = shlex.split(raw)
            except ValueError as exc:
                raise UsageError(f"{self.option}: {raw!r} cannot be split into words: {exc}") from None
        if not isinstance(raw, (list, tuple)):
            raise UsageError(f"{self.option}: expected the command's words, got {raw!r}")
        return [str(word) for word in raw]


def _decl(metric: outputs.Metric, headline: bool) -> MetricDecl:
    if metric.kind == "rate":
        return rate(metric.name, headline)
    if metric.kind == "time":
        return duration(metric.name, headline)
    d = score(metric.name, metric.better)
    return MetricDecl(d.pattern, d.better, d.up, d.down, headline)


@register
class Command(Workload):
    name = "command"
    summary = "your own program, given after --: its wall time, and figures read from its output (--metric, --parser)"
    unit = "s"
    metrics = (duration(outputs.WALL_TIME.name, headline=True),)
    argv_param = "argv"
    fixed_params = ("metric", "step_metric", "parser", "headline")
    # the job is a fresh process of its own in every trial; a zygote would save only gpuvs's worker's imports, and
    # bare mode has no worker to fork (--fresh fork is refused there)
    fork_by_default = False
    params = (
        ArgvParam("argv", str, None, "the command and its arguments, given after -- (in an experiment file: "
                  "command: [WORD, ...]); run as given, never through a shell", multiple=True),
        Param("metric", str, None, "a figure it prints once: NAME=REGEX,higher|lower|rate|time[,UNIT] (the first "
              "group of REGEX; rate and time are higher and lower, with faster/slower verdicts)", multiple=True),
        Param("step_metric", str, None, "a figure it prints every step, same syntax: the trial's figure is their "
              "mean, with +/- and jitter", multiple=True),
        Param("parser", str, None, "a ready parser of its output, NAME[:ARG]: " + ", ".join(outputs.names()),
              multiple=True),
        Param("headline", str, None, "the figure that carries the verdict (default: the first parser's headline, "
              "else your only --step-metric, else wall_time_s)"),
        Param("workdir", str, None, "its working directory where it runs (default: the environment's own; files "
              "come in with --mount, or with the image)"),
        Param("bare", bool, False, "run it as the container's or pod's own process, without gpuvs's worker (an "
              "image with no Python): its output read from outside, its times from the engine's or the cluster's "
              "lifecycle events; no fingerprint, telemetry or start-up breakdown inside"),
    )

    def __init__(self) -> None:
        self._session = None  # the job.Session of the trial this worker ran (its JSON-lines metrics)

    def settings(self, params: dict[str, Any]):
        from gpuvs.workloads.command import job

        return job.Settings.from_params(params)

    def check(self, params: dict[str, Any]) -> None:
        argv = params.get("argv") or []
        if not argv:
            raise UsageError("the command is empty: give it after -- (gpuvs run command [options] -- PROGRAM ARGS...) "
                             "or as command: [PROGRAM, ARGS...] in an experiment file")
        if not argv[0]:
            raise UsageError("the command's first word (the program) is empty")
        settings = self.settings(params)
        reader = settings.reader()  # every --metric, --parser and --headline problem, now
        if settings.bare:
            for p in reader.parsers:
                if p.reads_files:
                    raise UsageError(f"parser {p.name} reads a file the command writes, which gpuvs cannot read "
                                     "in bare mode (it is not inside): drop --bare (an image with Python), or read "
                                     "the tool's printed output")

    def check_spec(self, spec: RunSpec, params: dict[str, Any]) -> None:
        if params.get("bare") and spec.fresh == "fork":
            raise UsageError("--bare runs the command as the environment's own process, with no worker to fork from "
                             "a zygote: drop --fresh fork (or --bare)")

    def declarations(self, params: dict[str, Any] | None = None) -> tuple[MetricDecl, ...]:
        if not params or not params.get("argv"):
            return self.metrics
        try:
            reader = self.settings(params).reader()
        except UsageError:
            return self.metrics
        return tuple(_decl(m, m.name == reader.headline) for m in reader.metrics)

    def headline_series(self, params: dict[str, Any]) -> str | None:
        try:
            return self.settings(params).reader().headline
        except UsageError:
            return outputs.WALL_TIME.name

    def summarize(self, samples: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, dict[str, Any]]:
        from gpuvs.workloads.command import job

        if self._session is not None:
            return job.summarize(samples, self._session.metrics(), self._session.reader.headline,
                                 self._session.series)
        reader = self.settings(params).reader()
        return job.summarize(samples, reader.metrics, reader.headline)

    def check_in(self, spec: RunSpec, environment: Any) -> None:
        settings = self.settings(spec.params)
        if settings.bare and not getattr(environment, "runs_bare", False):
            raise UsageError(f"--bare: {environment.noun or environment.kind} cannot run a command bare")
        why = environment.missing_executable(spec, settings.argv[0], settings.workdir)
        if why:
            raise UsageError(why)

    def launch(self, spec: RunSpec, environment: Any) -> Any:
        from gpuvs import events
        from gpuvs.workloads.command import bare

        settings = self.settings(spec.params)
        stream = bare.start(spec, environment, settings) if settings.bare else environment.launch(spec)
        note = environment.workdir_note(settings.workdir)
        if note:  # said in the run's output (the trial records its working directory: its `program` item)
            stream.put(events.encode(events.log(note)) + "\n")
        return stream

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        import time

        from gpuvs.workloads.command import job

        settings = self.settings(ctx.params)
        self._session = job.Session(settings, ctx.spec.launched_at or time.time())
        yield from job.run(self._session)
