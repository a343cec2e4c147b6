"""One experiment's results as the objects every report renders (Analysis).

Per-arm summaries, each arm's verdicts against the first arm, derived tables, fingerprints and failures.
Built from the store (`from_store`), or from the runner's TrialResults while it runs (`from_results`).
Every part is a dataclass; to_dict() is `gpuvs report --format json`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpuvs import environments, events
from gpuvs.analysis import disturbance, family, programs
from gpuvs.probes import fingerprint
from gpuvs.analysis import stats
from gpuvs.analysis import timeshare
from gpuvs.errors import UsageError
from gpuvs.analysis.family import MetricVerdict
from gpuvs.store.records import (
    ArmMeta,
    ExperimentMeta,
    ExperimentRecord,
    SeriesSummary,
    TelemetryRecord,
    TrialRecord,
    json_value,
    latest_attempts,
)
from gpuvs.spec import EnvSpec, device_kind, ranks_asked
from gpuvs.analysis.timeshare import TimeShares

TIMER_RESOLUTION_S = 1e-6  # the coarser of perf_counter's and CUDA events' (0.5 us) resolution, rounded up

# Fingerprint fields shown side by side: (key, label); dotted keys read nested dicts. The environment
# kinds add their own (environments.fingerprint_fields) before the node, Python and gpuvs rows.
CORE_FIELDS = (
    ("gpu_name", "GPU"), ("gpu_count", "GPUs"), ("driver", "NVIDIA driver"), ("cuda_driver", "CUDA (driver)"),
    ("cuda", "CUDA (torch)"), ("cudnn", "cuDNN"), ("torch", "torch"), ("torchvision", "torchvision"),
    ("cpu_model", "CPU"), ("cpu_usable", "CPUs usable"), ("memory_mib", "memory MiB"),
    ("limits.cpu_limit", "CPU limit"), ("limits.memory_limit_mib", "memory limit MiB"), ("limits.shm_mib", "/dev/shm MiB"),
    ("software.cuda", "CUDA toolkit (files)"), ("software.cudnn", "cuDNN (files)"),
    ("software.libraries", "CUDA libraries (files)"), ("software.driver_libs", "driver libraries (libcuda)"),
    ("software.frameworks", "frameworks (installed)"), ("software.os", "OS (image)"),
    ("software.env_versions", "image *_VERSION variables"), ("taken_by", "fingerprint taken by"),
)
TAIL_FIELDS = (("node_name", "node"), ("python", "python"), ("gpuvs", "gpuvs"))
# Software fields beyond the key ones that an image-against-image comparison names when they differ.
IMAGE_EXTRA = ("software.libraries", "software.driver_libs", "software.os", "software.env_versions")


def fingerprint_fields() -> tuple[tuple[str, str], ...]:
    return CORE_FIELDS + tuple(f for f in environments.fingerprint_fields() if f not in TAIL_FIELDS) + TAIL_FIELDS


@dataclass
class Metric:
    name: str
    unit: str | None
    better: str | None  # the workload's declaration: higher, lower, neither; None: undeclared
    up: str  # the verdict's word for a figure above the baseline's, and below it
    down: str
    headline: bool
    tested: bool  # declared and given a verdict (else descriptive)
    source: str  # "series" (a sample series' per-trial figure) or "metric" (a scalar result)

    @property
    def higher_is_better(self) -> bool:
        return self.better != "lower"


@dataclass
class ArmResult:
    name: str
    overrides: dict[str, Any]
    device: str
    num_gpus: int
    env: str
    n_ok: int
    n_total: int
    values: dict[str, dict[int, float]] = field(default_factory=dict)  # metric -> {trial: figure}
    summaries: dict[str, stats.TrialsSummary] = field(default_factory=dict)  # metric -> across its trials
    trial_summaries: dict[str, list[SeriesSummary]] = field(default_factory=dict)  # series -> per trial
    startup: dict[str, float] = field(default_factory=dict)  # mean seconds over ok trials
    fingerprint: dict[str, Any] = field(default_factory=dict)  # of its first successful trial

    def to_dict(self) -> dict[str, Any]:
        return {f.name: json_value(getattr(self, f.name)) for f in fields(self)}


@dataclass
class Speedup:
    """A GPU arm against a CPU arm: CPU time / GPU time for the same work, with its interval."""

    cpu_arm: str
    gpu_arm: str
    cpu_mean: float | None
    gpu_mean: float | None
    unit: str | None
    speedup: float
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass
class Scaling:
    """An arm's throughput against the arm with the fewest GPUs, over the ideal N/N0."""

    arm: str
    num_gpus: int
    mean: float
    unit: str | None
    speedup: float
    ideal: float
    efficiency: float
    eff_low: float | None = None
    eff_high: float | None = None
    baseline: str = ""


@dataclass
class Failure:
    """A trial that did not finish (its last attempt)."""

    arm: str
    trial: int
    status: str
    error: str


@dataclass
class TrialFigure:
    """One trial as the reports show it: its headline figure, and (read with_steps) the headline's
    per-step figures and the NVML readings."""

    id: int | None
    arm: str
    trial: int
    status: str
    value: float | None
    steps: list[tuple[int, float]] = field(default_factory=list)
    telemetry: list[TelemetryRecord] = field(default_factory=list)

    def to_dict(self, with_steps: bool = False) -> dict[str, Any]:
        out = {"id": self.id, "arm": self.arm, "trial": self.trial, "status": self.status, "value": self.value}
        if with_steps:
            out.update(steps=[list(s) for s in self.steps], telemetry=[t.to_dict() for t in self.telemetry])
        return out


@dataclass
class Analysis:
    id: str
    name: str
    kind: str
    workload: str
    created: float
    meta: ExperimentMeta
    margin: float
    confidence: float
    metrics: list[Metric]
    arms: list[ArmResult]
    verdicts: list[MetricVerdict]
    speedup: list[Speedup]
    scaling: list[Scaling]
    flags: list[str]
    failures: list[Failure]
    trials: list[TrialFigure]
    time: TimeShares | None = None  # where the wall time went (timeshare.py); None where it is not known
    programs: programs.ProgramCheck | None = None  # what a command's arms ran (programs.py); None: not recorded
    disturbances: list[disturbance.ArmDisturbance] = field(default_factory=list)  # per arm; [] where not recorded
    aa: bool = False  # an A/A run (compare --aa): any difference is the setup's, not a finding

    @property
    def contended(self) -> list[disturbance.ArmDisturbance]:
        """The arms whose trials were contended (probes/contention.py's rule)."""
        return [d for d in self.disturbances if d.busy]

    def aa_differed(self) -> bool:
        """An A/A run whose headline shows a difference (outside the margin or within it)."""
        return self.aa and any(stats.within_margin(v.verdict) or v.verdict in v.words for v in self.headline_verdicts())

    @property
    def headline(self) -> Metric | None:
        return next((m for m in self.metrics if m.headline), None)

    @property
    def baseline(self) -> ArmResult | None:
        return self.arms[0] if self.arms else None

    def headline_verdicts(self) -> list[MetricVerdict]:
        return [v for v in self.verdicts if self.headline and v.metric == self.headline.name]

    def settled(self) -> bool:
        """Every arm's headline verdict is something other than inconclusive."""
        vs = self.headline_verdicts()
        return bool(vs) and all(v.verdict != "inconclusive" for v in vs)

    def to_dict(self, with_steps: bool = False) -> dict[str, Any]:
        """The analysis as `gpuvs report --format json` writes it."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "trials":
                out["trials"] = [t.to_dict(with_steps) for t in value]
            elif f.name in ("metrics", "speedup", "scaling", "failures"):
                out[f.name] = [asdict(x) for x in value]
            elif f.name == "time":
                out["time"] = None if value is None else value.to_dict()
            elif f.name == "programs":  # only where the arms recorded what they ran (a command's, this version on)
                if value is not None:
                    out["programs"] = value.to_dict()
            elif f.name in ("disturbances", "aa"):  # only where recorded, and for an A/A run
                if value:
                    out[f.name] = json_value(value)
            else:
                out[f.name] = json_value(value)
        return out


def _get(fp: dict[str, Any], key: str) -> Any:
    """A fingerprint's field (the worker's data, as gathered); dotted keys read nested mappings."""
    for part in key.split("."):
        if not isinstance(fp, dict):
            return None
        fp = fp.get(part)
    return fp


# -- building -------------------------------------------------------------------------------------

def from_store(store, experiment_id: str, with_steps: bool = True) -> Analysis:
    exp = store.experiment(experiment_id)
    return analyse(exp, store.trials(exp.id, with_samples=with_steps, with_telemetry=with_steps))


def from_results(exp, results, margin: float, confidence: float) -> Analysis:
    """An experiment still running (runner.Experiment and its TrialResults so far: TrialRecords)."""
    meta = dataclasses.replace(exp.meta, margin=margin, confidence=confidence, workload=exp.base.workload,
                               arms=[ArmMeta(a.name, dict(a.overrides)) for a in exp.arms])
    return analyse(ExperimentRecord(exp.id, exp.name, exp.kind, time.time(), meta), list(results))


def analyse(exp: ExperimentRecord, records: list[TrialRecord]) -> Analysis:
    meta = exp.meta
    margin, confidence = meta.judged()
    attempts = list(records)  # every attempt took wall time, retried ones too
    records = sorted(latest_attempts(records), key=lambda r: (r.trial, r.id or 0))
    arm_order = meta.arm_names()
    for rec in records:
        if rec.arm not in arm_order:
            arm_order.append(rec.arm)
    overrides = meta.overrides()
    workload = meta.workload or ((records[0].spec.workload if records[0].spec else "") if records else "")
    metrics = _metrics(records, arm_order, workload)
    arms = [_arm(name, overrides.get(name, {}), [r for r in records if r.arm == name], metrics)
            for name in arm_order]
    arms = [a for a in arms if a.n_total or a.name in overrides]
    verdicts = verdict_rows(meta, arms, metrics, margin, confidence, records, exp.kind)
    failures = [Failure(r.arm, r.trial, r.status, r.error or "") for r in records if r.status != "ok"]
    head = next((m for m in metrics if m.headline), None)
    trials = []
    for r in records:
        series = r.summary.get(head.name) if head and head.source == "series" else None
        trials.append(TrialFigure(r.id, r.arm, r.trial, r.status, series.value if series else None,
                                  [(s.step, s.value) for s in r.samples or []
                                   if head and s.series == head.name and s.value is not None],
                                  list(r.telemetry or [])))
    ran = programs.check([a.name for a in arms], records, varied_keys(arms))
    return Analysis(id=exp.id, name=exp.name, kind=exp.kind, workload=workload, created=exp.created or 0.0,
                    meta=meta, margin=margin, confidence=confidence, metrics=metrics, arms=arms, verdicts=verdicts,
                    speedup=_speedup(arms, head, confidence),
                    scaling=_scaling(arms, head, confidence) if _scales(workload) else [],
                    flags=(ran.lines() if ran else []) + _flags(arms, records), failures=failures, trials=trials,
                    time=timeshare.from_records(attempts, timeshare.wall_of(exp, attempts), meta.timing),
                    programs=ran, disturbances=disturbance.per_arm([a.name for a in arms], records),
                    aa=meta.is_aa(exp.kind))


def _declarations(workload: str, params: dict[str, Any] | None = None):
    """The workload's declaration of each figure of a run with these parameters (the command workload's figures
    are named by its parameters); a figure the job declared while it ran carries its declaration in its summary."""
    from gpuvs import workloads
    from gpuvs.workloads.workload import recorded

    try:
        w = workloads.get(workload)
    except UsageError:  # a store written by a workload this gpuvs does not know
        return lambda name, summary=None: recorded(name, summary or {})
    return lambda name, summary=None: w.declared(name, params) or recorded(name, summary or {})


def _scales(workload: str) -> bool:
    """Whether the workload's headline grows with its devices (Workload.scales_with_devices); True for a store
    written by a workload this gpuvs does not know, as before."""
    from gpuvs import workloads

    try:
        return workloads.get(workload).scales_with_devices
    except UsageError:
        return True


def _metric(name: str, unit: str | None, source: str, decl) -> Metric:
    if decl is None:
        return Metric(name, unit, None, "higher", "lower", False, False, source)
    return Metric(name, unit, decl.better, decl.up, decl.down, decl.headline, decl.tested, source)


def _metrics(records: list[TrialRecord], arm_order: list[str], workload: str) -> list[Metric]:
    """Sample series (in the baseline arm's order), then scalar metrics, each with its workload's
    declaration; the headline (the first series or metric declared as one) first."""
    ok = sorted((r for r in records if r.ok),
                key=lambda r: arm_order.index(r.arm) if r.arm in arm_order else len(arm_order))
    # arms share how figures are read (Workload.fixed_params): the first trial's parameters declare them
    first = (ok or records or [None])[0]
    declared = _declarations(workload, first.spec.params if first is not None and first.spec else None)
    series: dict[str, Metric] = {}
    scalars: dict[str, Metric] = {}
    for rec in ok:
        for name, s in rec.summary.items():
            if name not in series and s.value is not None:
                series[name] = _metric(name, s.unit, "series", declared(name, s))
        for name, m in rec.metrics.items():
            if name not in scalars and name not in series and m.value is not None:
                scalars[name] = _metric(name, m.unit, "metric", declared(name))
    ordered = list(series.values()) + list(scalars.values())
    head = next((m for m in ordered if m.headline), None)
    for m in ordered:
        m.headline = m is head
    return ([head] if head else []) + [m for m in ordered if m is not head]


def _floor(arm: ArmResult, metric: Metric) -> float:
    """Relative standard deviation no trial figure of this arm can be known better than: the
    per-step spread of its own steps (its +/- over its figure) and the timer's resolution over its
    timed seconds, root mean square over the arm's trials."""
    terms = []
    for summary in arm.trial_summaries.get(metric.name, []):
        value = summary.value
        if not value:
            continue
        rel = (summary.pm or 0.0) / abs(value)
        if summary.total_seconds:
            rel = (rel * rel + (TIMER_RESOLUTION_S / summary.total_seconds) ** 2) ** 0.5
        terms.append(rel * rel)
    return (sum(terms) / len(terms)) ** 0.5 if terms else 0.0


def verdict_rows(meta: ExperimentMeta, arms: list[ArmResult], metrics: list[Metric], margin: float,
                 confidence: float, records: list[TrialRecord], kind: str) -> list[MetricVerdict]:
    """Every arm against the first on every metric, with the family's corrections (family.py):
    paired by round where the trials were interleaved, unpaired otherwise."""
    if len(arms) < 2:
        return []
    return family.compare_all(metrics, [a.values for a in arms], [a.name for a in arms], margin=margin,
                              confidence=confidence, paired=meta.is_interleaved(kind),
                              floors=[{m.name: _floor(a, m) for m in metrics} for a in arms],
                              plan=meta.sequential, rounds=1 + max((r.trial for r in records), default=-1))


def _arm(name: str, overrides: dict[str, Any], recs: list[TrialRecord], metrics: list[Metric]) -> ArmResult:
    spec = recs[0].spec if recs else None
    ok = [r for r in recs if r.ok]
    arm = ArmResult(name=name, overrides=overrides, device=spec.device if spec else "-",
                    num_gpus=ranks_asked(spec) if spec else 1, env=environments.label(spec.env if spec else EnvSpec()),
                    n_ok=len(ok), n_total=len(recs))
    for metric in metrics:
        values: dict[int, float] = {}
        for r in ok:
            if metric.source == "series":
                summary = r.summary.get(metric.name)
                v = summary.value if summary else None
                if v is not None:
                    arm.trial_summaries.setdefault(metric.name, []).append(summary)
            else:
                m = r.metrics.get(metric.name)
                v = m.value if m else None
            if v is not None:
                values[r.trial] = float(v)
        arm.values[metric.name] = values
        arm.summaries[metric.name] = stats.summarize_trials(list(values.values()))
    startup: dict[str, list[float]] = {}
    for r in ok:
        for k, v in events.milestones(r.startup).items():
            startup.setdefault(k, []).append(float(v))
    arm.startup = {k: sum(v) / len(v) for k, v in startup.items()}
    arm.fingerprint = next((r.fingerprint for r in ok if r.fingerprint), next((r.fingerprint for r in recs), {}))
    return arm


def _speedup(arms: list[ArmResult], head: Metric | None, confidence: float) -> list[Speedup]:
    """GPU arm against CPU arm: CPU time / GPU time for the same work (for a rate: GPU rate / CPU rate)."""
    if head is None:
        return []
    cpus = [a for a in arms if device_kind(a.device) == "cpu" and a.values.get(head.name)]
    gpus = [a for a in arms if device_kind(a.device) == "cuda" and a.values.get(head.name)]
    rows = []
    for c in cpus:
        for g in gpus:
            cv, gv = list(c.values[head.name].values()), list(g.values[head.name].values())
            num, den = (cv, gv) if not head.higher_is_better else (gv, cv)
            row = Speedup(c.name, g.name, c.summaries[head.name].mean, g.summaries[head.name].mean, head.unit,
                          sum(num) / len(num) / (sum(den) / len(den)))
            if len(cv) > 1 and len(gv) > 1:
                _, row.ci_low, row.ci_high = stats.ratio_interval(den, num, confidence)
            rows.append(row)
    return rows


def _scaling(arms: list[ArmResult], head: Metric | None, confidence: float) -> list[Scaling]:
    """Scaling efficiency = N-GPU throughput / (N/N0 x N0-GPU throughput), against the arm with the
    fewest GPUs; only for rates (higher is better) and where arms differ in num_gpus (the trial's ranks: --num-gpus
    times the pod environment's --num-nodes)."""
    if head is None or not head.higher_is_better:
        return []
    with_values = [a for a in arms if a.values.get(head.name)]
    if len({a.num_gpus for a in with_values}) < 2:
        return []
    base = min(with_values, key=lambda a: a.num_gpus)
    bv = list(base.values[head.name].values())
    bmean = sum(bv) / len(bv)
    rows = []
    for a in sorted(with_values, key=lambda a: a.num_gpus):
        av = list(a.values[head.name].values())
        mean = sum(av) / len(av)
        speedup = mean / bmean
        ideal = a.num_gpus / base.num_gpus
        row = Scaling(a.name, a.num_gpus, mean, head.unit, speedup, ideal, speedup / ideal, baseline=base.name)
        if a is not base and len(av) > 1 and len(bv) > 1:
            _, low, high = stats.ratio_interval(bv, av, confidence)
            row.eff_low, row.eff_high = low / ideal, high / ideal
        rows.append(row)
    return rows


def varied_keys(arms: list[ArmResult]) -> set[str]:
    """What the arms vary: the keys they override, and "device" wherever their devices differ (arms
    compared from the store carry no overrides)."""
    keys = {k for a in arms for k in a.overrides}
    if len({a.device for a in arms}) > 1:
        keys.add("device")
    return keys


def _flags(arms: list[ArmResult], records: list[TrialRecord]) -> list[str]:
    """Key fingerprint fields that differ where the user did not ask them to; what an arm run bare could not
    measure; what an image against another changed."""
    flags = []
    kinds = {r.spec.env.kind if r.spec else environments.DEFAULT for r in records}
    varied = varied_keys(arms)
    explained = environments.explained(varied, kinds)
    if "device" in varied:  # the GPU a run sees follows from its device: a CPU arm in a pod sees none
        explained |= set(fingerprint.DEVICE_FIELDS)
    for arm in arms:
        unmeasured = next((r.config["unmeasured"] for r in records if r.arm == arm.name and r.ok
                           and isinstance(r.config.get("unmeasured"), str)), None)
        if unmeasured:  # a command run bare: what gpuvs could not measure inside, said beside the verdict
            flags.append(f"arm {arm.name} ran bare, so {unmeasured}")
        fps = [r.fingerprint for r in records if r.arm == arm.name and r.ok and r.fingerprint]
        for other in fps[1:]:
            diff = fingerprint.differences(fps[0], other)
            if diff:
                flags.append(f"arm {arm.name}: its trials ran with different " + ", ".join(
                    f"{k} ({a} vs {b})" for k, (a, b) in diff.items()))
                break
    base = arms[0] if arms else None
    for arm in arms[1:]:
        if not base.fingerprint or not arm.fingerprint:
            continue
        # what an image changed may be a library one image lacks; a difference nobody asked for is one both recorded
        every = fingerprint.differences(base.fingerprint, arm.fingerprint, fingerprint.KEY_FIELDS + IMAGE_EXTRA,
                                        recorded_only=False)
        diff = {k: v for k, v in every.items() if k not in explained and k not in IMAGE_EXTRA
                and fingerprint.recorded(base.fingerprint, k) and fingerprint.recorded(arm.fingerprint, k)}
        software = {k: v for k, v in every.items() if k in fingerprint.SOFTWARE_FIELDS + IMAGE_EXTRA}
        if software and varied == {"image"}:  # image against image: what the new image changed, read in each
            flags.append(f"arm {arm.name}'s image differs from arm {base.name}'s in " + ", ".join(
                f"{k} ({b} vs {a})" for k, (b, a) in software.items()) + ": what changed with the image")
        if diff:
            flags.append(f"arm {arm.name} differs from arm {base.name} in " + ", ".join(
                f"{k} ({b} vs {a})" for k, (b, a) in diff.items()) + ", which this comparison did not vary")
    return flags


def fingerprint_rows(arms: list[ArmResult]) -> list[tuple[str, list[Any], bool]]:
    """(label, value per arm, differs) for the fields any arm has."""
    rows = []
    for key, label in fingerprint_fields():
        values = [_get(a.fingerprint, key) for a in arms]
        if all(v is None for v in values):
            continue
        rows.append((label, values, len({repr(v) for v in values}) > 1))
    return rows

