"""What a workload is: a name, typed parameters with limits, and a generator of events."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from gpuvs.errors import UsageError
from gpuvs.params import Param, did_you_mean
from gpuvs.spec import RunSpec

BETTER = ("higher", "lower", "neither")


@dataclass(frozen=True)
class MetricDecl:
    """What a workload says about one of its figures (a sample series or a scalar metric): which way
    is better and the word for each direction, so that nothing is guessed from a unit.

    pattern: the name, or a glob over names built at run time ("*/us_per_gemm", "latency_p*_ms").
    up / down: the verdict's word when an arm's figure is above / below the baseline's ("faster" and
    "slower" for a rate, "slower" and "faster" for a time, "worse"/"better", "more"/"less",
    "higher"/"lower"). headline: this figure carries the workload's verdict. tested: False for a
    figure only shown (a count, a size, a check), never given a verdict."""

    pattern: str
    better: str
    up: str
    down: str
    headline: bool = False
    tested: bool = True

    def __post_init__(self) -> None:
        if self.better not in BETTER:
            raise ValueError(f"metric {self.pattern}: better must be one of {BETTER}, not {self.better!r}")

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    @property
    def higher_is_better(self) -> bool | None:
        return {"higher": True, "lower": False}.get(self.better)


def recorded(name: str, summary: Any) -> MetricDecl | None:
    """The declaration a trial's summary of a figure carries with it (`"declared": {"better", "up", "down",
    "headline"}`: a stats.SeriesSummary's `declared`, or the summary event's key), for a figure the job itself
    declared while it ran (the command workload's JSON lines): known only from what was stored, never guessed. None
    where the summary carries none."""
    d = summary.get("declared") if isinstance(summary, dict) else getattr(summary, "declared", None)
    if not isinstance(d, dict) or d.get("better") not in BETTER or not d.get("up") or not d.get("down"):
        return None
    return MetricDecl(name, d["better"], str(d["up"]), str(d["down"]), bool(d.get("headline")),
                      bool(d.get("tested", True)))


def rate(pattern: str, headline: bool = False) -> MetricDecl:
    """Work per unit of time: higher is faster."""
    return MetricDecl(pattern, "higher", "faster", "slower", headline)


def duration(pattern: str, headline: bool = False) -> MetricDecl:
    """A time: higher is slower."""
    return MetricDecl(pattern, "lower", "slower", "faster", headline)


def score(pattern: str, better: str = "higher") -> MetricDecl:
    """A quality figure (accuracy, loss): better or worse."""
    return MetricDecl(pattern, better, "better" if better == "higher" else "worse",
                      "worse" if better == "higher" else "better")


def amount(pattern: str, better: str = "lower", tested: bool = True) -> MetricDecl:
    """A quantity (memory footprint, failed requests): more or less."""
    return MetricDecl(pattern, better, "more", "less", tested=tested)


def level(pattern: str, better: str = "neither", tested: bool = True) -> MetricDecl:
    """A level (% of peak, a ratio): higher or lower."""
    return MetricDecl(pattern, better, "higher", "lower", tested=tested)


@dataclass
class RunContext:
    """What a workload gets: the spec, its checked parameters, and its place in a multi-process run."""

    spec: RunSpec
    params: dict[str, Any]
    rank: int = 0
    world_size: int = 1
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.spec.device

    def start_window(self) -> None:
        """Call right before the timed part. Under a start barrier (gpuvs share), report ready, wait
        for every other worker, and open a measurement window of the agreed length (none: open until
        the coordinator writes the barrier's stop file, as a capacity sweep does)."""
        self._window_end = None
        self._stop_dir = None
        barrier = self.spec.barrier
        if not barrier or self.rank != 0:
            return
        import time

        from gpuvs.workloads import barrier as b

        b.arrive(barrier["dir"], barrier["name"])
        start = b.wait_go(barrier["dir"], barrier.get("wait_s", 1800.0))
        self._stop_dir, self._stop_checked = barrier["dir"], 0.0
        if barrier.get("window_s"):
            self._window_end = time.perf_counter() + (start + barrier["window_s"] - time.time())

    def window_open(self) -> bool:
        """False once the agreed window is over or the coordinator said stop (always True without a
        barrier). The stop file is looked at no more than every 50 ms."""
        import time

        now = time.perf_counter()
        end = getattr(self, "_window_end", None)
        if end is not None and now >= end:
            return False
        folder = getattr(self, "_stop_dir", None)
        if folder is not None and now - self._stop_checked >= 0.05:
            self._stop_checked = now
            from gpuvs.workloads import barrier as b

            if b.stopped(folder):
                self._window_end = now
                return False
        return True


class Workload:
    """Subclass, set the class attributes, implement run(). Never print: yield events."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    unit: ClassVar[str] = "items/sec"
    multi_gpu: ClassVar[bool] = False
    # False where the headline is already a figure per device that does not grow with their number (a
    # collective's bus bandwidth): a comparison across --num-gpus then shows no scaling efficiency.
    scales_with_devices: ClassVar[bool] = True
    # True where run() calls ctx.start_window() before its timed part and stops when
    # ctx.window_open() turns False: such a workload can share a GPU in a measured window.
    windowed: ClassVar[bool] = False
    window_param: ClassVar[str] = "steps"  # the count a shared window replaces (set very high under share)
    # Python modules the worker needs inside the environment (checked by environments/doctor).
    requires: ClassVar[tuple[str, ...]] = ()
    # False where the workload measures its own process's start-up (`startup`): --fresh auto then starts
    # every trial as a new process (exec), never as a fork of a zygote that already paid the imports.
    fork_by_default: ClassVar[bool] = True
    # Every figure the workload yields (series and scalar metrics), in order: the first pattern that
    # matches a name declares it. Exactly one headline.
    metrics: ClassVar[tuple[MetricDecl, ...]] = ()
    # Defaults that replace the GPU-sized ones when the device is the CPU (so a default run ends
    # in minutes there); a value the user gives always wins.
    cpu_defaults: ClassVar[dict[str, Any]] = {}
    # What the CPU-sized defaults make of the job, in a few words for the CPU note ('' to say nothing).
    cpu_note: ClassVar[str] = ""
    # The parameter that holds a command line given after `--` (`gpuvs run command -- ARGV...`), or None.
    argv_param: ClassVar[str | None] = None
    # Parameters an arm may not change: they say which figures a trial gives and how they are declared, and
    # arms are compared figure by figure.
    fixed_params: ClassVar[tuple[str, ...]] = ()

    def declarations(self, params: dict[str, Any] | None = None) -> tuple[MetricDecl, ...]:
        """Every figure a run with these parameters yields, declared: `metrics`, unless the parameters name the
        figures (the command workload's --metric and --parser)."""
        return self.metrics

    def declared(self, name: str, params: dict[str, Any] | None = None) -> MetricDecl | None:
        """The declaration of a figure (of a run with these parameters), or None when it is not declared."""
        return next((d for d in self.declarations(params) if d.matches(name)), None)

    def summarize(self, samples: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """One trial's sample events summarised per series, each with its declared direction
        (store.summary.summarize_samples), as the summary event carries them (SeriesSummary.to_dict)."""
        from gpuvs.store.summary import summarize_samples
        from gpuvs.store.records import SampleRecord

        records = [SampleRecord.from_event(e) for e in samples]
        summary = summarize_samples(records, lambda name: self.declared(name, params))
        return {name: s.to_dict() for name, s in summary.items()}

    def check_in(self, spec: RunSpec, environment: Any) -> None:
        """Checks that need to know where a trial runs (an executable on the host's PATH), before anything
        starts; raise UsageError."""

    def launch(self, spec: RunSpec, environment: Any) -> Any:
        """Start one trial: gpuvs's worker in the environment (a WorkerStream). A workload may start otherwise:
        the command workload's bare mode runs the job itself as the environment's process."""
        return environment.launch(spec)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.named(name):
                return p
        known = [n for p in self.params for n in (p.name, *p.aliases) if len(n) > 1]
        raise UsageError(f"{self.name} has no parameter {name!r}{did_you_mean(name, known)}; it takes: "
                         f"{self.param_list()}")

    def param_list(self) -> str:
        return ", ".join(p.option for p in self.params) or "(none)"

    def defaults(self, device: str | None = None) -> dict[str, Any]:
        values = {p.name: p.default for p in self.params}
        if device is not None and device.split(":")[0] == "cpu":
            values.update(self.cpu_defaults)
        return values

    def validate(self, raw: dict[str, Any], device: str | None = None) -> dict[str, Any]:
        """Fill defaults (the CPU's where device is cpu), coerce types, refuse unknown names; then
        cross-field checks."""
        values = self.defaults(device)
        for key, value in raw.items():
            param = self.param(key.replace("-", "_"))
            values[param.name] = param.coerce(value)
        self.check(values)
        return values

    def check(self, params: dict[str, Any]) -> None:
        """Cross-parameter checks; raise UsageError."""

    def check_spec(self, spec: RunSpec, params: dict[str, Any]) -> None:
        """Checks of the parameters against the rest of the run (its device count, ...); raise UsageError."""

    def imports(self, params: dict[str, Any]) -> tuple[str, ...]:
        """The modules a zygote imports once for this workload's trials (launch.py, zygote.py)."""
        return tuple(self.requires)

    def headline_series(self, params: dict[str, Any]) -> str | None:
        """Of the series the headline declaration matches (a glob such as "*" may match several), the one a
        person would quote for a run with these parameters: it leads the trial's summary, so it is the one
        reports show first and verdicts are taken on. None: the first series measured."""
        return None

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        raise NotImplementedError
