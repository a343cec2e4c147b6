"""`gpuvs share`, `advise-mps` and `share-matrix` as library calls. Each request is checked by its
from_values, from a plain mapping of the command's options, and refused in the command line's own line.
run_share, run_advise_mps and run_share_matrix store the experiment that the request describes and
return what was measured, for the caller to render. What happens on the way is told through
SharingHooks; nothing here prints."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpuvs import environments
from gpuvs.errors import UsageError
from gpuvs.params import Param, refuse_unknown
from gpuvs.sharing import knobs, matrix, studies
from gpuvs.sharing.advisor import PairRuns, measure, unsettled_why, verdicts
from gpuvs.sharing.group import Coordinator, check_shareable, gpu_memory_total_mib
from gpuvs.sharing.knobs import ShareArm
from gpuvs.sharing.share_stats import repeats_plan
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store
from gpuvs.store.ids import new_id
from gpuvs.store.records import ExperimentMeta, LookSchedule
from gpuvs.trial.experiment import default_device
from gpuvs.trial.runner import Runner, TrialResult, validate_spec

# 'WORKLOAD --p v ...' -> a spec like the base. The command line's parser reads a job's options
# (gpuvs.cli.common.job_spec); it is passed in because this package may not import the command line.
JobParser = Callable[[str, RunSpec], RunSpec]
DeviceDefault = Callable[[EnvSpec], str]  # the device where none is asked for, given the environment
TIMEOUT_S = 3600.0  # a trial's seconds where none is given (the run options' --timeout)
MAX_DURATION_TIMES = 4  # the default cap of a calibrated window, in --duration


def _nothing(text: str) -> None:
    pass


@dataclass
class SharingHooks:
    """What a caller hears while a sharing study runs; every one optional."""

    on_start: Callable[[str], None] | None = None  # the experiment's id, once the store is open, before it is written
    heading: Callable[[str], None] | None = None  # what is about to run (the command line draws it as a rule)
    say: Callable[[str], None] | None = None  # a line of the coordinator or the advisor (a window chosen, a failure)
    on_trial_end: Callable[[TrialResult], None] | None = None  # each worker, as it ends


def checked(params: Sequence[Param], values: Mapping[str, Any], what: str) -> dict[str, Any]:
    """Every option of `params`, in their order. A value given is checked as the command line checks it, refused
    in the same line; the others take their defaults. A name that is none of them is refused."""
    refuse_unknown(values, [p.name for p in params], what)
    return {p.name: p.coerce(values[p.name]) if p.name in values else p.default for p in params}


def _job(parse_job: JobParser, text: str, base: RunSpec) -> RunSpec:
    """A job given as text, refused before anything starts where it cannot share a window or run there."""
    spec = parse_job(text, base)
    check_shareable(spec)
    validate_spec(spec)
    return spec


def _with_id(spec: RunSpec, exp_id: str) -> RunSpec:
    # a copy, so that a request can be run again as a new experiment
    return dataclasses.replace(spec, experiment_id=exp_id)


# -- gpuvs share ----------------------------------------------------------------------------------

SHARE_PARAMS = (
    Param("workers", str, "1,2", "worker counts to measure, e.g. 1,2,4"),
    Param("mps", str, "off", "run with the MPS daemon off, on, or both", choices=("off", "on", "both")),
    Param("duration", float, 20.0, "seconds of the shared measurement window", min=0.5, max=86400),
    Param("with", str, None, "a second job to pair with, quoted: \"WORKLOAD --param value ...\""),
    Param("capacity", bool, False, "add instances one at a time, each measured count a window, until one fails"),
    Param("max_workers", int, 32, "upper bound of the capacity search", min=1, max=512),
    Param("also_host", bool, False, "with --capacity and --env container: the same sweep with plain processes"),
    Param("ready_timeout", float, 900.0, "seconds a worker may take to warm up before the window", min=1),
    Param("repeats", int, 3, "fresh process groups per configuration (intervals and verdicts need 2 or more)",
          min=1, max=1000),
    Param("margin", float, 0.05, "ratio difference under which two arms count as equivalent", min=0, max=0.9),
    Param("mps_threads", str, None, "MPS arms with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per client: a comma list of "
          "P (every worker) or PA:PB (--with pairs), e.g. 50,30:70"),
    Param("mps_mem_limit", str, None, "an MPS arm with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per client: SIZE (every "
          "worker) or SIZE_A:SIZE_B, e.g. 4G or 2G:40G"),
)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 or c > 512 for c in counts):
        raise UsageError(f"--workers wants counts from 1 to 512 separated by commas, e.g. 1,2,4; got {text!r}")
    return counts


@dataclass
class ShareRequest:
    """What `gpuvs share` runs, checked. `options` are SHARE_PARAMS' values, stored with the experiment and read
    by its tables. The counts, the job paired with and the arms are what they decide."""

    base: RunSpec
    options: dict[str, Any]
    counts: list[int]
    other: RunSpec | None
    arms: list[ShareArm]
    name: str | None = None
    timeout_s: float = TIMEOUT_S

    @classmethod
    def from_values(cls, base: RunSpec, values: Mapping[str, Any], *, parse_job: JobParser,
                    name: str | None = None, timeout_s: float = TIMEOUT_S) -> ShareRequest:
        """`base`: the job, its parameters checked and its device resolved; `values`: options by name (SHARE_PARAMS,
        defaults for those left out). Refused in one UsageError, checked in the order the command line always did."""
        so = checked(SHARE_PARAMS, values, "gpuvs share")
        check_shareable(base)
        validate_spec(base)
        counts = parse_counts(so["workers"])
        other = _job(parse_job, so["with"], base) if so["with"] else None
        if base.device == "cpu" and so["mps"] != "off":
            raise UsageError("--mps applies to GPU runs (--device cuda)")
        if so["also_host"] and (not so["capacity"] or base.env.kind == "host"):
            raise UsageError("--also-host goes with --capacity and --env container (it adds the same sweep on the "
                             "host)")
        arms = knobs.arms(so["mps"], so["mps_threads"], so["mps_mem_limit"], 2 if other is not None else 1,
                          base.device)
        return cls(base, so, counts, other, arms, name, timeout_s)


@dataclass
class ShareResult:
    """What `gpuvs share` measured: one study, the capacity sweeps, the pairs or the scaling (the others None).
    The jobs are as they ran, with the experiment's id."""

    experiment_id: str
    base: RunSpec
    other: RunSpec | None
    options: dict[str, Any]
    memory_total_mib: float | None
    scaling: studies.Scaling | None = None
    pairs: studies.Interference | None = None
    capacity: list[studies.CapacitySweep] | None = None

    def raise_if_failed(self) -> None:
        """RunFailed where a group of the pairs or the scaling had a failed worker. A capacity sweep is not
        checked: it ends at its first failure by design."""
        found = self.pairs if self.pairs is not None else self.scaling
        if found is not None:
            studies.raise_if_failed(found.groups())


def run_share(request: ShareRequest, store: str | Path, hooks: SharingHooks | None = None) -> ShareResult:
    """The request's study, each group in fresh processes, every worker stored as a trial of one experiment
    (kind `share`). A failed worker is kept in the result (raise_if_failed), not raised."""
    hooks = hooks or SharingHooks()
    so, heading = request.options, hooks.heading or _nothing
    exp_id = new_id()
    base = _with_id(request.base, exp_id)
    other = _with_id(request.other, exp_id) if request.other is not None else None
    with Store(store) as st:
        if hooks.on_start:
            hooks.on_start(exp_id)
        st.create_experiment(exp_id, request.name or f"share {base.workload}", "share",
                             ExperimentMeta(base=base, share=so))
        # a worker's time covers its warm-up and the window as well as its own run
        runner = Runner(st, timeout_s=request.timeout_s + so["duration"] + so["ready_timeout"],
                        on_trial_end=hooks.on_trial_end)
        coord = Coordinator(runner, so["duration"], so["ready_timeout"], say=hooks.say or _nothing)
        result = ShareResult(exp_id, base, other, so, gpu_memory_total_mib(base.device))
        if so["capacity"]:
            result.capacity = studies.capacity(coord, base, request.arms, so["max_workers"], so["also_host"], heading)
        elif other is not None:
            result.pairs = studies.pairs(coord, base, other, request.arms, so["repeats"], heading)
        else:
            result.scaling = studies.scaling(coord, base, request.counts, request.arms, so["repeats"], heading)
    return result


# -- gpuvs advise-mps -----------------------------------------------------------------------------

ADVISE_PARAMS = (
    Param("duration", float, 10.0, "seconds of each measured window at least (each job's first solo window; windows "
          "are calibrated from it up to --max-duration)", min=0.5, max=3600),
    Param("max_duration", float, None, "longest calibrated window: a job or pair with too few or too uneven steps for "
          f"its rate's error to be within 1% in --duration gets a longer window, up to this (default: "
          f"{MAX_DURATION_TIMES} x --duration; at --duration: every window --duration)", min=0.5, max=36000),
    Param("margin", float, 0.05, "work ratio (MPS / time-sliced) within which both count as equal", min=0, max=0.9),
    Param("repeats", int, 3, "fresh process groups per run (the verdict needs 2 or more)", min=1, max=1000),
    Param("max_repeats", int, 8, "add repeats, one at a time and only for pairs not yet settled, until the measured "
          "verdict settles or this cap (compare --until-confident's sequential rule); at or below --repeats: a fixed "
          "count", min=1, max=1000),
    Param("json", str, None, "also write the prediction and the measured verdict to this JSON file (rewritten "
          "after every repeat)"),
    Param("predict_only", bool, False, "run each job alone and predict; measure no pair"),
    Param("pairs", str, None, "a YAML file with pairs: [[JOB_A, JOB_B], ...]: each job alone once per repeat, "
          "every pair together; one predicted-against-measured table with the hit rate"),
)


@dataclass
class AdviseRequest:
    """What `gpuvs advise-mps` runs, checked: the pairs of jobs as given and one spec per distinct job.
    `options` are ADVISE_PARAMS' values, stored with the experiment; the longest window and the plan follow."""

    texts: list[tuple[str, str]]
    specs: dict[str, RunSpec]
    options: dict[str, Any]
    device: str
    max_window_s: float
    plan: LookSchedule | None
    name: str | None = None
    timeout_s: float = TIMEOUT_S

    @classmethod
    def from_values(cls, values: Mapping[str, Any], *, jobs: Sequence[str] = (), parse_job: JobParser,
                    env: Mapping[str, Any] | EnvSpec | None = None, device: str | None = None,
                    device_default: DeviceDefault = default_device, name: str | None = None,
                    timeout_s: float = TIMEOUT_S) -> AdviseRequest:
        """`values`: options by name (ADVISE_PARAMS); `jobs`: two job texts, or none with the option `pairs`;
        `env`: the environment or its options' values. Refused in one UsageError, in the command line's order."""
        ao = checked(ADVISE_PARAMS, values, "gpuvs advise-mps")
        jobs = list(jobs)
        if ao["pairs"]:
            if jobs:
                raise UsageError("advise-mps takes either two quoted jobs or --pairs FILE, not both")
            data = matrix.load(ao["pairs"])
            if data.get("sweep"):
                raise UsageError(f"{ao['pairs']}: advise-mps --pairs reads only 'pairs' (no 'sweep')")
            texts = [(str(x), str(y)) for x, y in data["pairs"]]
        elif len(jobs) != 2:
            raise UsageError('advise-mps wants two quoted jobs, e.g. gpuvs advise-mps "kernels --app srad" '
                             '"kernels --app hotspot", or --pairs FILE')
        else:
            texts = [(jobs[0], jobs[1])]
        env = env if isinstance(env, EnvSpec) else environments.env_spec(dict(env or {}))
        device = device or device_default(env)
        base = RunSpec(workload="selftest", device=device, env=env, timeout_s=timeout_s)
        specs: dict[str, RunSpec] = {}
        for text in [t for pair in texts for t in pair]:
            if text not in specs:
                specs[text] = _job(parse_job, text, base)
        max_window = ao["max_duration"] if ao["max_duration"] is not None else MAX_DURATION_TIMES * ao["duration"]
        if max_window < ao["duration"]:
            raise UsageError(f"--max-duration {ao['max_duration']:g} is shorter than --duration {ao['duration']:g}: "
                             "the longest calibrated window must be at least the shortest")
        return cls(texts, specs, ao, device, max_window, repeats_plan(ao["repeats"], ao["max_repeats"]), name,
                   timeout_s)


@dataclass
class AdviseResult:
    """What `gpuvs advise-mps` measured: each pair's runs (verdicts() reads the prediction and the verdict)."""

    experiment_id: str
    pairs: list[PairRuns]
    memory_total_mib: float | None
    margin: float


def advice_json(pairs: list[PairRuns], total: float | None, margin: float) -> Any:
    """The prediction and the measured verdict of each pair, as --json writes them (one pair: its object alone)."""
    out = []
    for pr in pairs:
        solo, advice, verdict = verdicts(pr, total, margin)
        ok = verdict is not None and verdict.ratio is not None
        out.append({"a": pr.a, "b": pr.b, "predicted": advice.prediction, "source": advice.source,
                    "predicted_ratio": advice.ratio, "reasons": advice.reasons,
                    "measured": verdict.words if ok else None, "measured_ratio": verdict.ratio if ok else None,
                    "measured_ci": [verdict.ci_low, verdict.ci_high] if ok else None,
                    "repeats": len(pr.work["A+B, MPS"]) or len(pr.work["A+B"]),
                    "unsettled_why": unsettled_why(verdict) if ok else None,
                    "window": pr.window.to_dict() if pr.window else None,
                    "solo_windows": {k: w.to_dict() for k, w in pr.solo_windows.items()},
                    "work": pr.work, "solo": [{"telemetry": t, "gpm": g, "memory_mib": m} for t, g, m in solo]})
    return out if len(out) > 1 else out[0]


def _write_json(path: str, pairs: list[PairRuns], total: float | None, margin: float) -> None:
    try:
        Path(path).write_text(json.dumps(advice_json(pairs, total, margin), indent=1) + "\n")
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot write it: {exc.strerror}") from None


def run_advise_mps(request: AdviseRequest, store: str | Path, hooks: SharingHooks | None = None) -> AdviseResult:
    """Each job alone, then each pair together, every worker a trial of one experiment (kind `advise-mps`). The
    option `json` is rewritten whenever a part is measured, so that what was measured survives a stop."""
    hooks = hooks or SharingHooks()
    ao, say = request.options, hooks.say or _nothing
    pairs = [PairRuns(x, y, plan=request.plan, margin=ao["margin"]) for x, y in request.texts]
    exp_id = new_id()
    specs = {text: _with_id(spec, exp_id) for text, spec in request.specs.items()}
    total = gpu_memory_total_mib(request.device)
    with Store(store) as st:
        if hooks.on_start:
            hooks.on_start(exp_id)
        st.create_experiment(exp_id, request.name or f"advise-mps {len(pairs)} pair(s)", "advise-mps",
                             ExperimentMeta(pairs=request.texts, options=ao))
        # a calibrated window may be as long as the longest, beside the worker's own run
        runner = Runner(st, timeout_s=request.timeout_s + request.max_window_s, on_trial_end=hooks.on_trial_end)
        coord = Coordinator(runner, ao["duration"], say=say)
        save = (lambda: _write_json(ao["json"], pairs, total, ao["margin"])) if ao["json"] else (lambda: None)
        measure(coord, specs, pairs, ao["repeats"], request.device.startswith("cuda"), save, ao["predict_only"],
                heading=hooks.heading or _nothing, max_window_s=request.max_window_s, say=say)
    return AdviseResult(exp_id, pairs, total, ao["margin"])


# -- gpuvs share-matrix ---------------------------------------------------------------------------

MATRIX_PARAMS = (
    Param("device", str, None, "overrides the file's device"),
    Param("duration", float, None, "overrides the file's window seconds"),
)


@dataclass
class MatrixRequest:
    """What `gpuvs share-matrix` runs, checked: the pairs file as read (stored with the experiment) and its window.
    Then the swept parameter ('' for none), a case per pair and value, and the MPS modes."""

    file: str
    data: dict[str, Any]
    device: str
    window_s: float
    key: str
    cases: list[matrix.Case]
    modes: list[bool]

    @property
    def title(self) -> str:
        """The name its table is shown under: the file's `name`, else the file's stem."""
        return self.data.get("name", Path(self.file).stem)

    @classmethod
    def from_values(cls, file: str, values: Mapping[str, Any] | None = None, *, parse_job: JobParser,
                    device_default: DeviceDefault = default_device) -> MatrixRequest:
        """`file`: the pairs file; `values`: MATRIX_PARAMS' overrides of it by name. Refused in one UsageError
        naming the file where it is at fault, in the command line's order."""
        mo = checked(MATRIX_PARAMS, values or {}, "gpuvs share-matrix")
        data = matrix.load(file)
        device = mo["device"] or data.get("device") or device_default(EnvSpec())
        # a key written empty (`duration:`) is its default, as an option not given is
        window = float(next(v for v in (mo["duration"], data.get("duration"), 8.0) if v is not None))
        (key, swept), = (data.get("sweep") or {"": [None]}).items()
        base = RunSpec(workload="selftest", device=device, timeout_s=float(data.get("timeout_s") or 1800))
        cases = []
        for a_text, b_text in data["pairs"]:
            for v in swept:
                extra = f" --{key.replace('_', '-')} {v}" if key else ""
                a, b = parse_job(a_text + extra, base), parse_job(b_text + extra, base)
                for s in (a, b):
                    check_shareable(s)
                    validate_spec(s)
                cases.append(matrix.Case(a_text, b_text, v, a, b))
        modes = matrix.mps_modes(data.get("mps", "both")) if device.startswith("cuda") else [False]
        return cls(str(file), data, device, window, key, cases, modes)


@dataclass
class MatrixResult:
    """What `gpuvs share-matrix` measured: a row per case (matrix.Row)."""

    experiment_id: str
    title: str
    window_s: float
    key: str
    rows: list[matrix.Row]


def run_share_matrix(request: MatrixRequest, store: str | Path, hooks: SharingHooks | None = None) -> MatrixResult:
    """Each case: A alone, B alone, then both under each MPS mode, every worker a trial of one experiment (kind
    `share-matrix`)."""
    hooks = hooks or SharingHooks()
    exp_id = new_id()
    cases = [dataclasses.replace(c, a=_with_id(c.a, exp_id), b=_with_id(c.b, exp_id)) for c in request.cases]
    with Store(store) as st:
        if hooks.on_start:
            hooks.on_start(exp_id)
        st.create_experiment(exp_id, request.data.get("name") or Path(request.file).stem, "share-matrix",
                             ExperimentMeta(file=request.data))
        coord = Coordinator(Runner(st, on_trial_end=hooks.on_trial_end), request.window_s, say=hooks.say or _nothing)
        rows = matrix.measure(coord, cases, request.modes, request.key, heading=hooks.heading or _nothing)
    return MatrixResult(exp_id, request.title, request.window_s, request.key, rows)
