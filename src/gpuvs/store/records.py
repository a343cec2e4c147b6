"""What the store keeps, as typed records: experiments, their trials, samples, NVML readings, a command's output.

JSON is made and read here and nowhere after the store: to_dict() is what the store's columns carry.
Reading is tolerant of stores written by earlier versions: a missing key gets the default they meant."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

from gpuvs.spec import EnvSpec, RunSpec

def known_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of `data` that are fields of the dataclass `cls` (a stored record read back: a key an
    earlier version did not write keeps the field's default; one a later version added is left out)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}



_DIRECTION = {"higher": True, "lower": False}


@dataclass
class SeriesSummary:
    """One series of one trial. value: the trial's figure (total items over total time where every step
    is timed, else the mean of the step values); better: the workload's declaration (higher, lower,
    neither; None: undeclared), never read from the unit. The figures are there once a step had a value
    (n > 0); total_seconds and total_items where every step was timed."""

    n: int = 0
    unit: str | None = ""
    better: str | None = None
    higher_is_better: bool | None = None
    value: float | None = None
    total_seconds: float | None = None
    total_items: float | None = None
    mean: float | None = None
    pm: float | None = None
    jitter: float | None = None
    median: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    figure: str | None = None  # how the trial's figure was made, where a workload says (command: steps, last printed)
    declared: dict[str, Any] | None = None  # a figure's declaration made while the job ran (the command workload)
    kept: int | None = None  # samples stored, where fewer than n were (the command workload's long series)

    def to_dict(self) -> dict[str, Any]:
        """The summary's JSON: n, unit, better and higher_is_better always, each figure where there is one."""
        out: dict[str, Any] = {"n": self.n, "unit": self.unit, "better": self.better,
                               "higher_is_better": self.higher_is_better}
        for f in fields(self)[4:]:
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeriesSummary:
        """A stored summary. One written before `better` existed has better None (undeclared: its unit was
        never a declaration) and keeps its higher_is_better."""
        out = cls(**known_fields(cls, data))
        if "higher_is_better" not in data:
            out.higher_is_better = _DIRECTION.get(out.better or "")
        return out

    @property
    def mean_of_steps(self) -> bool:
        """Whether the trial's figure is the mean of its step values (each request's latency), not items
        over time: a table then names the statistic."""
        return self.n > 0 and self.total_seconds is None and self.figure is None



@dataclass(frozen=True)
class LookSchedule:
    """The looks of one --until-confident run: first (planned trials per arm), step, cap."""

    first: int
    cap: int
    step: int = 2

    def looks(self) -> list[int]:
        n = [min(self.first, self.cap)]
        while n[-1] < self.cap:
            n.append(min(n[-1] + self.step, self.cap))
        return n

    def look(self, rounds: int) -> int:
        """Index of the look at which `rounds` trials per arm have run (the last look at or below)."""
        return max(0, sum(1 for n in self.looks() if n <= rounds) - 1)


DEFAULT_MARGIN = 0.02  # the equivalence margin of a comparison that stored none (gpuvs run stores none)
DEFAULT_CONFIDENCE = 0.95


def _loads(text: str | None, empty: Any) -> Any:
    return json.loads(text) if text else empty


def spec_from_dict(data: Mapping[str, Any] | None) -> RunSpec | None:
    """A stored run spec: its known fields (a field an earlier version did not store keeps RunSpec's
    default; one this version does not know is left out)."""
    if not data:
        return None
    names = {f.name for f in fields(RunSpec)}
    known = {k: v for k, v in data.items() if k in names}
    env = known.pop("env", None) or {}
    spec = RunSpec(**known)
    spec.env = env if isinstance(env, EnvSpec) else EnvSpec(**{k: v for k, v in env.items() if k in ("kind", "options")})
    return spec


def spec_json(spec: RunSpec | None) -> dict[str, Any] | None:
    """A run spec as the store keeps it (RunSpec.to_json: keys sorted)."""
    return None if spec is None else json.loads(spec.to_json())


# -- a trial's parts --------------------------------------------------------------------------------

@dataclass
class MetricValue:
    """A scalar result of a trial (final loss, p99 latency...): the worker's metric event."""

    value: float | None
    unit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricValue:
        return cls(data.get("value"), data.get("unit", ""))


@dataclass(frozen=True)
class FileFacts:
    """A file a command ran (its executable, an interpreter's script), as read where it ran: its path there, where
    a link led (`real`), its size and sha256; `unread` says why the content could not be read."""

    path: str
    real: str | None = None
    size: int | None = None
    sha256: str | None = None
    unread: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FileFacts | None:
        return cls(**known_fields(cls, data)) if isinstance(data, Mapping) and data.get("path") else None

    def short(self) -> str:
        """Its path and the start of its hash: `/usr/bin/python3 (sha256 a83c0370d915)`."""
        return self.path + (f" (sha256 {self.sha256[:12]})" if self.sha256 else "")


@dataclass(frozen=True)
class ProgramRecord:
    """What a command trial ran (probes/program.py, the configuration item `program`): argv[0] as
    given, the executable it resolved to there, its --version's first line, an interpreter's script, the working
    directory it started in; `unresolved` says why the executable is not known. Trials of earlier versions (and of
    other workloads) have none: TrialRecord.program is None."""

    argv0: str
    workdir: str | None = None
    executable: FileFacts | None = None
    version: str | None = None
    script: FileFacts | None = None
    unresolved: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ProgramRecord | None:
        if not isinstance(data, Mapping) or "argv0" not in data:
            return None
        known = known_fields(cls, data)
        known["executable"] = FileFacts.from_dict(data.get("executable"))
        known["script"] = FileFacts.from_dict(data.get("script"))
        return cls(**known)

    @property
    def known(self) -> bool:
        return self.executable is not None

    def same_as(self, other: ProgramRecord) -> bool:
        """The same program: the same executable (its content; its path where the content was not read), the same
        version where both said one (a pyenv shim is one script for every version), the same script."""
        a, b = self.executable, other.executable
        if a is None or b is None:
            return a is b
        if (a.sha256 or a.real or a.path) != (b.sha256 or b.real or b.path):
            return False
        if self.version and other.version and self.version != other.version:
            return False
        scripts = [(s.sha256 or s.path) if s else None for s in (self.script, other.script)]
        return scripts[0] == scripts[1]

    def describe(self, with_script: bool = True) -> str:
        """`/usr/bin/python3 → /usr/bin/python3.11 (Python 3.11.2, sha256 a83c0370d915), script /code/train.py
        (sha256 9feb65406a11)`."""
        exe = self.executable
        if exe is None:
            return f"{self.argv0} (not known: {self.unresolved or 'not recorded'})"
        said = ", ".join(x for x in (self.version, f"sha256 {exe.sha256[:12]}" if exe.sha256 else None) if x)
        text = exe.path + (f" → {exe.real}" if exe.real else "") + (f" ({said})" if said else "")
        return text + (f", script {self.script.short()}" if self.script and with_script else "")


@dataclass
class SampleRecord:
    """One step's figure of one series (the worker's sample event; trial_id once stored)."""

    trial_id: int | None
    series: str
    step: int
    value: float | None
    unit: str | None
    seconds: float | None = None
    items: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what else the workload sent (loss, display...)

    @classmethod
    def from_event(cls, event: Mapping[str, Any], trial_id: int | None = None) -> SampleRecord:
        """A worker's sample event (events.sample)."""
        e = {"series": "main", "value": None, "unit": None, "seconds": None, "items": None, **event}
        return cls(trial_id, e["series"], e["step"], e["value"], e["unit"], e["seconds"], e["items"],
                   dict(e.get("extra") or {}))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TelemetryRecord:
    """One NVML reading of one GPU during a trial: t (seconds since its sampler started), the GPU's index,
    and the readings themselves as NVML gave them (telemetry.READINGS, throttle reasons): data from the
    device, kept as it came."""

    t: float
    gpu: int | None
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> TelemetryRecord:
        return cls(event.get("t", 0.0), event.get("gpu"),
                   {k: v for k, v in event.items() if k not in ("type", "t", "gpu")})

    def to_dict(self) -> dict[str, Any]:
        """The reading as one flat mapping (what telemetry.summarize and the charts read)."""
        return {"t": self.t, "gpu": self.gpu, **self.data}


@dataclass(frozen=True)
class GpuProcess:
    """Another compute process seen on a trial's GPU (NVML): its pid, its command name where the worker could see
    it (None inside a PID namespace that hides it), the GPU's index and the memory it held."""

    pid: int
    name: str | None = None
    gpu: int | None = None
    mem_mib: int | None = None
    visible: bool = True

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name or 'not visible from inside'})"


@dataclass
class ContentionRecord:
    """What competed with one trial (probes/contention.py, the worker's contention event): the 1-minute load at
    its start and end, the CPUs it could use (affinity, cgroup quota) and those online, the share of its time in
    which some task waited for a CPU (PSI some; None without PSI), the share of CPU time stolen (None outside
    /proc/stat), the other compute processes on its GPUs (gpu_checked: NVML was read), and what its telemetry
    showed of the SM clock under load. Trials of earlier versions have none: TrialRecord.contention is None."""

    seconds: float | None = None
    load_start: float | None = None
    load_end: float | None = None
    cpus_usable: float | None = None
    cpus_online: int | None = None
    cpu_pressure: float | None = None
    cpu_pressure_avg10: float | None = None
    steal: float | None = None
    gpu_checked: bool = False
    gpu_processes: list[GpuProcess] = field(default_factory=list)
    sm_clock_loaded: list[float] | None = None  # lowest and highest SM clock under load (its NVML telemetry), MHz
    slowdowns: list[str] = field(default_factory=list)  # thermal or hardware slowdowns its telemetry showed

    @property
    def load(self) -> float | None:
        """The higher of the loads at the trial's start and end."""
        loads = [x for x in (self.load_start, self.load_end) if x is not None]
        return max(loads) if loads else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ContentionRecord | None:
        if not isinstance(data, Mapping):
            return None
        known = known_fields(cls, data)
        known["gpu_processes"] = [GpuProcess(**known_fields(GpuProcess, p)) for p in data.get("gpu_processes") or []
                                  if isinstance(p, Mapping) and "pid" in p]
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class OutputRecord:
    """One stream of a command trial's own output, as kept (job.Capture): its text (the first and last bytes of
    it, with a marked cut), its size in bytes and lines, and how many bytes were cut."""

    trial_id: int | None
    stream: str
    text: str
    bytes: int | None = None
    lines: int | None = None
    cut: int | None = None

    @classmethod
    def from_event(cls, event: Mapping[str, Any], trial_id: int | None = None) -> OutputRecord:
        """A worker's output event (events.output)."""
        return cls(trial_id, event["stream"], event.get("text") or "", event.get("bytes"), event.get("lines"),
                   event.get("cut"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summaries_from_dict(data: Mapping[str, Any] | None) -> dict[str, SeriesSummary]:
    return {name: SeriesSummary.from_dict(s) for name, s in (data or {}).items()}


def metrics_from_dict(data: Mapping[str, Any] | None) -> dict[str, MetricValue]:
    return {name: MetricValue.from_dict(m) for name, m in (data or {}).items()}


def json_value(value: Any) -> Any:
    """A value of a record as JSON data: records by their to_dict, mappings and lists item by item."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


# -- a trial ----------------------------------------------------------------------------------------

@dataclass
class TrialRecord:
    """One attempt of one trial, as stored: where it ran (spec, fingerprint), what it was set to (config),
    what it measured (startup seconds, scalar metrics, a summary per series), how it ended. samples and
    telemetry are there where they were read with it (Store.trials(..., with_samples=...)). A trial while it
    runs is one too: runner.TrialResult, this record filled event by event."""

    id: int | None
    experiment_id: str
    run_id: str
    arm: str
    trial: int
    attempt: int = 0
    workload: str = ""
    status: str = "running"
    error: str | None = None
    error_kind: str | None = None
    spec: RunSpec | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)  # gathered by the worker (fingerprint.py)
    config: dict[str, Any] = field(default_factory=dict)  # the workload's configuration items
    startup: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    summary: dict[str, SeriesSummary] = field(default_factory=dict)  # per series, the headline first
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    owner: str | None = None  # host:pid of the gpuvs that ran it
    samples: list[SampleRecord] | None = None
    telemetry: list[TelemetryRecord] | None = None
    contention: ContentionRecord | None = None  # what competed with it; None for trials of earlier versions

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def program(self) -> ProgramRecord | None:
        """What a command trial ran (its configuration item `program`); None for other trials and earlier stores."""
        return ProgramRecord.from_dict(self.config.get("program"))

    def primary(self) -> SeriesSummary | None:
        """The first series' summary (the headline figure)."""
        return next(iter(self.summary.values()), None)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TrialRecord:
        """A row of the trials table (its JSON columns as the text the store keeps)."""
        return cls(id=row["id"], experiment_id=row["experiment_id"], run_id=row["run_id"], arm=row["arm"],
                   trial=row["trial"], attempt=row["attempt"], workload=row["workload"], status=row["status"],
                   error=row["error"], error_kind=row["error_kind"], spec=spec_from_dict(_loads(row["spec"], None)),
                   fingerprint=_loads(row["fingerprint"], {}), config=_loads(row["config"], {}),
                   startup=_loads(row["startup"], {}), metrics=metrics_from_dict(_loads(row["metrics"], {})),
                   summary=summaries_from_dict(_loads(row["summary"], {})), started=row["started"],
                   ended=row["ended"], exit_code=row["exit_code"], owner=row["owner"],
                   contention=ContentionRecord.from_dict(_loads(row["contention"], None))
                   if "contention" in row.keys() else None)

    def to_dict(self) -> dict[str, Any]:
        """The trial as `results export` and `results show --json` write it: the table's columns (the run
        spec with its keys sorted, as stored), then samples and telemetry where they were read."""
        out: dict[str, Any] = {}
        for f in fields(TrialRecord):  # a trial still running (runner.TrialResult) writes the same keys
            value = getattr(self, f.name)
            if f.name == "spec":
                out["spec"] = spec_json(value)
            elif f.name in ("samples", "telemetry", "contention"):  # where there is one: earlier JSON unchanged
                if f.name == "contention" and value is not None:
                    out[f.name] = value.to_dict()
                elif value is not None:
                    out[f.name] = [v.to_dict() for v in value]
            else:
                out[f.name] = json_value(value)
        return out


# -- an experiment ----------------------------------------------------------------------------------

@dataclass
class ArmMeta:
    """An arm as stored with its experiment: its name and what it overrides of the base (RunSpec fields,
    env, environment options, workload parameters: values as given)."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "overrides": {k: (v.__dict__ if isinstance(v, EnvSpec) else v)
                                                 for k, v in self.overrides.items()}}


@dataclass
class ExperimentMeta:
    """What an experiment stores besides its trials: how it is judged, what was run, what each kind keeps.

    Every field is None where the experiment did not store it. `order` keeps a stored meta's key order, so that
    to_dict() writes back the JSON that was read; a new meta is written in the fields' order, skipping None.
    A field left out means what it meant in every version: see judged(), is_interleaved() and `sequential`."""

    # how a comparison is judged; left out: compare's defaults, 0.02 and 0.95 (judged())
    margin: float | None = None
    confidence: float | None = None
    # where it came from
    file: str | dict[str, Any] | None = None  # compare --file: its path; share-matrix: the pairs file itself
    description: str | None = None
    command: str | None = None
    sequential: LookSchedule | None = None  # --until-confident: the looks planned (first, cap, step); left out: a fixed count
    # what was run (the runner's experiments: run, compare, fleet)
    workload: str | None = None
    # stated only where trials were not interleaved (compare --stored); left out, a compare's were, other kinds'
    # were not (is_interleaved())
    interleaved: bool | None = None
    aa: bool | None = None  # an A/A run (compare --aa): stated where it was one
    trials: int | None = None  # trials per arm planned
    seed: int | None = None  # of the trial order
    arms: list[ArmMeta] | None = None
    base: RunSpec | None = None
    # what each kind keeps of its own (as the kind wrote it: options and results of that command)
    fleet: dict[str, Any] | None = None  # gpuvs fleet: its FleetResult (fleet.result.FleetResult.from_dict)
    pair_fleet: dict[str, Any] | None = None  # gpuvs fleet --pairs: its PairFleetResult (fleet.pair_run)
    share: dict[str, Any] | None = None  # gpuvs share: its options
    pairs: list[Any] | None = None  # advise-mps: the pairs of jobs
    options: dict[str, Any] | None = None  # advise-mps: its options
    host: str | None = None  # gpuvs validate: the cluster, its settings, a row per check (validate.suite.Row)
    source: str | None = None
    namespace: str | None = None
    settings: dict[str, Any] | None = None
    checks: list[dict[str, Any]] | None = None
    finished: bool | None = None
    stopped: str | None = None
    # the runner's own: the experiment's wall time and its zygotes' starts (timeshare.py)
    timing: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as stored
    order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def judged(self) -> tuple[float, float]:
        """(margin, confidence) of the verdicts: as stored, else 0.02 and 0.95."""
        return (float(DEFAULT_MARGIN if self.margin is None else self.margin),
                float(DEFAULT_CONFIDENCE if self.confidence is None else self.confidence))

    def is_interleaved(self, kind: str) -> bool:
        """Whether the trials ran in interleaved rounds (A B | B A): as stated, else for a compare."""
        return self.interleaved if self.interleaved is not None else kind == "compare"

    def is_aa(self, kind: str) -> bool:
        """An A/A run: as stated, else (a store from before it was stated) a compare run here whose arms override
        nothing, which only --aa allows."""
        if self.aa is not None:
            return bool(self.aa)
        return (kind == "compare" and self.seed is not None and len(self.arms or []) >= 2
                and all(not a.overrides for a in self.arms or []))

    def arm_names(self) -> list[str]:
        return [a.name for a in self.arms or []]

    def overrides(self) -> dict[str, dict[str, Any]]:
        return {a.name: a.overrides for a in self.arms or []}

    def to_dict(self) -> dict[str, Any]:
        names = [f.name for f in fields(self) if f.name not in ("extra", "order")]
        keys = list(self.order) + [n for n in names if n not in self.order and getattr(self, n) is not None]
        keys += [k for k in self.extra if k not in keys]
        out: dict[str, Any] = {}
        for k in keys:
            if k not in names:
                out[k] = self.extra.get(k)
            elif k == "base":
                out[k] = None if self.base is None else self.base.to_dict()
            elif k == "sequential":
                out[k] = None if self.sequential is None else dataclasses.asdict(self.sequential)
            else:
                out[k] = json_value(getattr(self, k))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentMeta:
        names = {f.name for f in fields(cls)} - {"extra", "order"}
        meta = cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names}, order=tuple(data))
        if isinstance(data.get("sequential"), Mapping):
            seq = data["sequential"]
            meta.sequential = LookSchedule(int(seq["first"]), int(seq["cap"]), int(seq.get("step", 2)))
        if data.get("arms") is not None:
            meta.arms = [ArmMeta(a["name"], dict(a.get("overrides") or {})) for a in data["arms"]]
        if isinstance(data.get("base"), Mapping):
            meta.base = spec_from_dict(data["base"])
        return meta


@dataclass
class ExperimentRecord:
    """One experiment: its id, name, kind (run, compare, fleet, share, advise-mps, share-matrix, validate,
    trial), when it was created (unix seconds) and its meta."""

    id: str
    name: str
    kind: str
    created: float
    meta: ExperimentMeta = field(default_factory=ExperimentMeta)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ExperimentRecord:
        return cls(row["id"], row["name"], row["kind"], row["created"], ExperimentMeta.from_dict(json.loads(row["meta"])))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "created": self.created,
                "meta": self.meta.to_dict()}


@dataclass
class ExperimentListing(ExperimentRecord):
    """An experiment as `results list` shows it: with its trial counts and its (first) workload."""

    n_trials: int = 0
    n_ok: int | None = None  # None: no trial at all
    workload: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ExperimentListing:
        exp = ExperimentRecord.from_row(row)
        return cls(exp.id, exp.name, exp.kind, exp.created, exp.meta, row["n_trials"], row["n_ok"], row["workload"])

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "n_trials": self.n_trials, "n_ok": self.n_ok, "workload": self.workload}


def latest_attempts(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """One record per (arm, trial): its last attempt (retries keep earlier ones in the store)."""
    latest: dict[tuple[str, int], TrialRecord] = {}
    for rec in records:
        key = (rec.arm, rec.trial)
        if key not in latest or (rec.attempt or 0) >= (latest[key].attempt or 0):
            latest[key] = rec
    return list(latest.values())
