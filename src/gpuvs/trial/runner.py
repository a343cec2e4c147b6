"""Experiment execution: arms x trials as RunSpecs, ordered interleaved and shuffled (A B B A ...).

Each runs in a fresh worker with a timeout, and every event is stored as it arrives."""

from __future__ import annotations

import copy
import dataclasses
import queue
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvs import environments, events, workloads
from gpuvs.probes import contention
from gpuvs.trial import launch
from gpuvs.errors import RunFailed, UsageError, interruption
from gpuvs.trial.launch import exit_text
from gpuvs.store.records import (
    ArmMeta,
    ContentionRecord,
    ExperimentMeta,
    MetricValue,
    SampleRecord,
    TelemetryRecord,
    TrialRecord,
    summaries_from_dict,
)
from gpuvs.spec import RunSpec, check_device_syntax, new_run_id, nodes_asked
from gpuvs.trial.overrides import Overrides
from gpuvs.store.db import Store, StoreError
from gpuvs.store.ids import new_id


@dataclass
class TrialResult(TrialRecord):
    """A trial while it runs: the TrialRecord the store will hold (its identity from the spec, `id` once the
    store has begun it), filled event by event (apply), with what only the run itself sees (the worker's log
    lines, its output events, the wall time, whether its summary arrived). Everything after the runner
    (comparison, reports, timeshare) reads it as the TrialRecord it is."""

    id: int | None = None
    experiment_id: str = ""
    run_id: str = ""
    arm: str = ""
    trial: int = 0
    samples: list[SampleRecord] = field(default_factory=list)
    telemetry: list[TelemetryRecord] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # stream -> the job's output, capped
    wall_s: float = 0.0
    reported: bool = False  # the worker's last event of a finished run (its summary) arrived
    samples_sent: int | None = None  # how many sample events the worker says it sent (its summary), where it says

    def __post_init__(self) -> None:
        spec = self.spec
        if spec is not None:
            self.experiment_id, self.run_id, self.arm = spec.experiment_id, spec.run_id, spec.arm
            self.trial, self.workload = spec.trial, spec.workload

    def apply(self, event: dict[str, Any]) -> None:
        """One event of the worker protocol (events.py) into the result's records."""
        kind = event["type"]
        if kind == "sample":
            self.samples.append(SampleRecord.from_event(event, self.id))
        elif kind == "telemetry":
            self.telemetry.append(TelemetryRecord.from_event(event))
        elif kind == "fingerprint":
            self.fingerprint = event["data"]
        elif kind == "config":
            self.config.update(event["items"])
        elif kind == "startup":
            self.startup[event["name"]] = event["seconds"]
        elif kind == "metric":
            self.metrics[event["name"]] = MetricValue.from_dict(event)
        elif kind == "summary":
            self.summary = summaries_from_dict(event["data"])
            self.reported = True
            self.samples_sent = event.get("samples")
        elif kind == "error":
            self.error_kind, self.error = event.get("kind"), event.get("message")
        elif kind == "log":
            self.logs.append(event["message"])
        elif kind == "contention":
            self.contention = ContentionRecord.from_dict(event.get("data"))
        elif kind == "output":
            self.outputs[event["stream"]] = {k: v for k, v in event.items() if k not in ("type", "stream")}


@dataclass
class Arm:
    """One arm: its name and what it changes of the base (sorted: overrides.Overrides; a plain mapping given
    here is sorted as it comes, its values as given)."""

    name: str
    overrides: Overrides = field(default_factory=Overrides)

    def __post_init__(self) -> None:
        if not isinstance(self.overrides, Overrides):
            self.overrides = Overrides.sort(self.overrides)


def draw_seed() -> int:
    """A trial order's seed where none was given: from the system's randomness, below 2**31."""
    return random.SystemRandom().randrange(2**31)


@dataclass
class Experiment:
    """A matrix of arms x trials over one base spec."""

    name: str
    base: RunSpec
    arms: list[Arm]
    trials: int = 1
    seed: int | None = None
    kind: str = "run"
    id: str = field(default_factory=new_id)
    meta: ExperimentMeta = field(default_factory=ExperimentMeta)  # stored with it (margin, command, ...)
    checked: bool = field(default=False, repr=False, compare=False)  # validate_experiment has passed it

    def fix_seed(self) -> int:
        """The trial order's seed: drawn once where none was given, then kept and stored, so the order can be re-made."""
        if self.seed is None:
            self.seed = draw_seed()
        return self.seed

    def stored_meta(self) -> ExperimentMeta:
        """The meta the store keeps: this one, with the workload, planned trials, order seed, arms and base."""
        return dataclasses.replace(self.meta, workload=self.base.workload, trials=self.trials, seed=self.seed,
                                   arms=[ArmMeta(a.name, dict(a.overrides)) for a in self.arms], base=self.base)

    def spec_for(self, arm: Arm, trial: int) -> RunSpec:
        spec = arm.overrides.apply(self.base)
        spec.arm, spec.trial, spec.experiment_id = arm.name, trial, self.id
        spec.run_id = new_run_id()
        return spec

    def order(self, start: int = 0) -> list[RunSpec]:
        """Rounds of all arms; each pair of rounds is a shuffled order then its reverse (A B | B A),
        so that every arm runs as often early as late and drift cancels. `start` skips the rounds
        already run (trials added later continue the same sequence); a missing seed is drawn once
        and kept, so that the sequence is the same on every call and can be stored."""
        rng = random.Random(self.fix_seed())
        specs: list[RunSpec] = []
        perm: list[Arm] = []
        for t in range(self.trials):
            if t % 2 == 0:
                perm = list(self.arms)
                rng.shuffle(perm)
                round_arms = perm
            else:
                round_arms = list(reversed(perm))
            if t >= start:
                specs.extend(self.spec_for(arm, t) for arm in round_arms)
        return specs


def validate_spec(spec: RunSpec) -> dict[str, Any]:
    """Everything that can be refused before a process starts. Returns the checked parameters."""
    workload = workloads.get(spec.workload)
    params = workload.validate(spec.params, spec.device)
    check_device_syntax(spec.device)
    if spec.num_gpus < 1:
        raise UsageError(f"--num-gpus must be at least 1, got {spec.num_gpus}")
    if spec.num_gpus > 1 and not workload.multi_gpu:
        raise UsageError(f"{workload.name} runs on one device; --num-gpus {spec.num_gpus} is not supported for it")
    if nodes_asked(spec) > 1 and not workload.multi_gpu:
        raise UsageError(f"--num-nodes {nodes_asked(spec)}: {workload.name} runs in one process; across nodes run a "
                         "workload of one process per device: "
                         + ", ".join(w.name for w in workloads.all_workloads() if w.multi_gpu))
    workload.check_spec(spec, params)
    if spec.timeout_s is not None and spec.timeout_s <= 0:
        raise UsageError(f"--timeout must be positive, got {spec.timeout_s}")
    launch.check(spec)
    environment = environments.get(spec.env)
    environment.check(spec)
    workload.check_in(spec, environment)
    return params


def resolve_fresh(exp: Experiment) -> None:
    """--fresh auto becomes one mode for every arm of the experiment (launch.resolve); an arm that set
    `fresh` itself keeps it."""
    if exp.base.fresh != "auto" and all(a.overrides.get("fresh", "auto") != "auto" for a in exp.arms):
        return
    specs = [exp.spec_for(arm, 0) for arm in exp.arms]
    mode = launch.resolve(specs)
    if exp.base.fresh == "auto":
        exp.base.fresh = mode
    for arm in exp.arms:
        if arm.overrides.get("fresh") == "auto":
            arm.overrides = arm.overrides.replace_field("fresh", mode)


def validate_experiment(exp: Experiment) -> None:
    """The one check of an experiment, per arm (validate_spec), before anything starts or is written: the
    command line calls it before it opens the store, the runner before it runs; an experiment is checked
    once (exp.checked). Where there are several arms, a refusal names its arm."""
    if exp.checked:
        return
    for arm in exp.arms:
        try:
            validate_spec(exp.spec_for(arm, 0))
        except UsageError as exc:
            if len(exp.arms) < 2:
                raise
            raise UsageError(f"arm {arm.name}: {exc}") from None
    exp.checked = True


EventHook = Callable[[TrialResult, dict[str, Any]], None]


class Runner:
    def __init__(self, store: Store, on_event: EventHook | None = None, timeout_s: float | None = None,
                 retries: int = 0, on_trial_start: Callable[[RunSpec, int, int], None] | None = None,
                 on_trial_end: Callable[[TrialResult], None] | None = None):
        self.store = store
        self.on_event = on_event
        self.timeout_s = timeout_s
        self.retries = retries
        self.on_trial_start = on_trial_start
        self.on_trial_end = on_trial_end
        self.launcher = launch.Launcher()  # fresh exec, or forks of zygotes it owns
        # the first write the store refused: no trial starts after it (a run that goes on stores nothing)
        self.store_failed: StoreError | None = None
        self.timing: dict[str, Any] = {}  # the last experiment's wall time and zygote starts (timeshare.py)

    def store_refused(self, exc: StoreError) -> StoreError:
        """Note a write the store refused; the first one is what stops the run."""
        if self.store_failed is None:
            self.store_failed = exc
        return self.store_failed

    def close(self) -> None:
        """End every zygote (run_experiment does it itself; run_trial leaves them for the next trial)."""
        self.launcher.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run_experiment(self, exp: Experiment, more: Callable[[list[TrialResult]], int] | None = None
                       ) -> list[TrialResult]:
        """Run every arm x trial in order. `more`, if given, is asked after the planned trials (and
        after each addition) how many trials per arm to add; 0 stops (see --until-confident)."""
        t_start = time.monotonic()
        resolve_fresh(exp)
        specs = exp.order()
        validate_experiment(exp)
        self.store.create_experiment(exp.id, exp.name, exp.kind, exp.stored_meta())
        results: list[TrialResult] = []
        done = 0
        launcher = self.launcher
        try:
            launcher.prepare(exp.spec_for(arm, 0) for arm in exp.arms)  # every zygote starts now, at once
            while specs:
                total = done + len(specs)
                for spec in specs:
                    if self.on_trial_start:
                        self.on_trial_start(spec, done, total)
                    try:
                        results.append(self.run_with_retries(spec))
                    except StoreError as exc:  # stop here: what was stored before is kept
                        kept = sum(1 for r in results if r.id is not None)
                        raise RunFailed(f"{exc}. The run stopped at trial {done + 1} of {total}; the {kept} "
                                        f"trial(s) before it are kept in {self.store.path}") from None
                    done += 1
                extra = more(results) if more else 0
                specs = []
                if extra > 0:
                    exp.trials += extra
                    specs = exp.order(start=exp.trials - extra)
        finally:
            launcher.close()
            self.timing = {"wall_s": time.monotonic() - t_start, "fresh": exp.base.fresh, **launcher.timing()}
            try:
                self.store.update_meta(exp.id, timing=self.timing)
            except Exception:  # a store that cannot be written now: the trials are already kept
                pass
        return results

    def run_with_retries(self, spec: RunSpec) -> TrialResult:
        attempt = 0
        while True:
            result = self.run_trial(spec, attempt)
            if result.ok or result.error_kind in ("oom", "input", "unavailable", "preempted") or attempt >= self.retries:
                return result
            attempt += 1
            spec = copy.deepcopy(spec)
            spec.run_id = new_run_id()

    def run_trial(self, spec: RunSpec, attempt: int = 0) -> TrialResult:
        return Flight(self).run_one(spec, attempt)


class Flight:
    """The one trial loop: trials in flight, each a LiveTrial, started, read and stopped the same way for every
    study. What to start when (order, parallelism, placement, groups, windows) is the caller's policy."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.live: list[LiveTrial] = []

    def __enter__(self) -> Flight:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        """On any way out: a trial still running is stopped (Ctrl-C, a refused store write, an error) and every
        trial is committed, so that none outlives the loop and none is lost."""
        if exc is not None:
            self.stop(exc)
        for lv in self.live:
            lv.finish()

    def launch(self, spec: RunSpec, attempt: int = 0) -> LiveTrial:
        """Start a trial; a launcher's refusal is the trial's failure and is raised (a group that cannot start
        one worker starts none)."""
        lv = LiveTrial(self.runner, spec, attempt)
        self.live.append(lv)
        try:
            lv.start()
        except (KeyboardInterrupt, StoreError):  # the run stops; stop() keeps the trial
            raise
        except Exception as exc:
            lv.fail_by(exc, "unavailable")
            raise
        return lv

    def start(self, spec: RunSpec, attempt: int = 0) -> LiveTrial:
        """Start a trial; a launcher's refusal (API error, engine missing) is that trial's failure alone."""
        try:
            return self.launch(spec, attempt)
        except (KeyboardInterrupt, StoreError):
            raise
        except Exception:
            return self.live[-1]

    def poll(self, lv: LiveTrial) -> bool:
        """Read what the trial said since; True once it ended and is committed (a timeout or a crash is its
        failure). A store refusal or Ctrl-C is raised, for the caller's `with` to stop the rest."""
        if lv.done:
            lv.finish()
            return True
        try:
            if not lv.pump(block=False):
                return False
        except TimeoutError:
            lv.timed_out()
        except (KeyboardInterrupt, StoreError):
            raise
        except Exception as exc:
            lv.fail_by(exc, "crash")
        lv.finish()
        if self.runner.store_failed is not None:  # its final write was refused
            raise self.runner.store_failed
        return True

    def pump(self, lives: list[LiveTrial]) -> None:
        """Read every running trial of `lives` without blocking; one past its deadline is stopped and committed."""
        for lv in lives:
            if lv.done:
                continue
            try:
                lv.pump(block=False)
            except TimeoutError:
                lv.timed_out()
                lv.finish()

    def stop(self, exc: BaseException) -> None:
        """Every trial still running fails with the reason the loop stopped: Ctrl-C or SIGTERM, a store refusal."""
        for lv in self.live:
            if lv.done:
                continue
            if isinstance(exc, StoreError):
                lv.fail("store", str(exc))
            else:
                lv.fail("interrupted", interruption(exc) if isinstance(exc, KeyboardInterrupt) else
                        str(exc) or type(exc).__name__, status="interrupted")

    def run_one(self, spec: RunSpec, attempt: int = 0) -> TrialResult:
        """One trial start to end, blocking: what `gpuvs run` and `compare` do for each trial."""
        lv = LiveTrial(self.runner, spec, attempt)
        self.live.append(lv)
        try:
            lv.start()
            lv.pump(block=True)
        except KeyboardInterrupt as exc:
            lv.fail("interrupted", interruption(exc), status="interrupted")
            raise
        except TimeoutError:
            lv.timed_out()
        except StoreError as exc:  # a write refused (disk full, read-only): the trial stops, and the run after it
            lv.fail("store", str(self.runner.store_refused(exc)))
        except Exception as exc:  # a launcher that failed to start (engine missing, ...)
            lv.fail_by(exc, "unavailable")
        finally:
            lv.finish()
        if self.runner.store_failed is not None:
            raise self.runner.store_failed
        return lv.result


class LiveTrial:
    """One trial in flight: its worker, its result so far, its row in the store. Several can be in
    flight at once (sharing/group.py polls them without blocking)."""

    def __init__(self, runner: Runner, spec: RunSpec, attempt: int = 0):
        self.runner = runner
        self.result = TrialResult(spec=spec, attempt=attempt)
        self.attempt = attempt
        self.timeout = spec.timeout_s or runner.timeout_s
        self.launched = None
        self.done = False
        self.ended = False  # the worker's output has been read to its end
        self._finished = False
        self.t0 = time.monotonic()

    @property
    def deadline(self) -> float | None:
        return None if self.timeout is None else self.t0 + self.timeout

    def start(self) -> None:
        """Its row in the store, then its worker. Raises StoreError, starting nothing, where the store refused a
        write before (this run stores nothing more) or refuses this trial's row."""
        spec = self.result.spec
        launcher = self.runner.launcher
        if self.runner.store_failed is not None:
            raise self.runner.store_failed
        try:
            self.result.id = self.runner.store.begin_trial(spec, self.attempt)
        except StoreError as exc:
            raise self.runner.store_refused(exc) from None
        launcher.ready(spec, self.timeout)  # a zygote's start (once per arm) is the experiment's, not the trial's
        self.t0 = time.monotonic()
        self.launched = launcher.launch(spec)

    def handle(self, line: str) -> None:
        event = events.decode(line)
        if event is None:
            return
        self.result.apply(event)
        self.runner.store.add_event(self.result.id, event)
        self.checkpoint()
        if self.runner.on_event:
            self.runner.on_event(self.result, event)

    def checkpoint(self) -> None:
        """Write what the trial has measured so far, about once a second (store.FLUSH_INTERVAL_S), so that
        even a gpuvs killed outright keeps it."""
        store, r = self.runner.store, self.result
        if r.id is not None and store.due(r.id):
            try:
                store.flush(r.id, fingerprint=r.fingerprint, config=r.config, startup=r.startup,
                            metrics=r.metrics)
            except StoreError as exc:
                raise self.runner.store_refused(exc) from None

    def pump(self, block: bool) -> bool:
        """Handle the worker's lines: all of them (block) or those waiting now. True once the
        worker's output has ended (its status is then settled). Raises TimeoutError past the deadline."""
        assert self.launched is not None
        if block:
            while True:
                wait = 1.0 if self.deadline is None else min(1.0, self.deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError
                try:
                    line = self.launched.lines.get(timeout=wait)
                except queue.Empty:
                    self.checkpoint()  # a quiet worker's last samples reach the store too
                    continue
                if line is None:
                    self.ended = True
                    break
                self.handle(line)
        else:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise TimeoutError
            while True:
                try:
                    line = self.launched.lines.get_nowait()
                except queue.Empty:
                    return False
                if line is None:
                    self.ended = True
                    break
                self.handle(line)
        self.settle()
        return True

    def settle(self) -> None:
        r = self.result
        r.exit_code = self.launched.wait(timeout=30)
        self.done = True
        if r.exit_code == 0 and not r.error and r.reported and r.samples_sent is not None \
                and len(r.samples) < r.samples_sent:  # a partial read is a failed trial, never ok
            r.status, r.error_kind = "failed", "crash"
            r.error = (f"gpuvs received {len(r.samples)} of the {r.samples_sent} samples the worker sent: its output "
                       "was cut on the way (a pod's log rotated or broken off, say), so the trial's figures are not its own")
        elif r.exit_code == 0 and not r.error and r.reported:
            r.status = "ok"
        else:
            r.status = "failed"
            if not r.error:
                tail = "\n".join(list(self.launched.stderr_tail)[-8:])
                r.error_kind = "crash"
                r.error = (exit_text(r.exit_code) if r.exit_code != 0 else
                           "the worker ended (status 0) without reporting its results") + (f": {tail}" if tail else "")

    def timed_out(self) -> None:
        self.fail("timeout", f"timed out after {self.timeout:g} s; the worker was stopped")

    def fail(self, kind: str, message: str, status: str = "failed") -> None:
        r = self.result
        r.status, r.error_kind, r.error = status, kind, message
        self.done = True

    def fail_by(self, exc: BaseException, kind: str) -> None:
        """Failed by an exception: its own kind where it has one (a launcher's refusal), else `kind`."""
        self.fail(getattr(exc, "kind", kind), str(exc) or type(exc).__name__)

    def late_output(self, wait_s: float = 2.0) -> None:
        """A stopped trial (timeout, Ctrl-C) still keeps what its job printed: the `output` events its worker
        sent while being stopped are stored; nothing else it said then changes the trial's fate."""
        if self.ended:  # the worker's output was read to its end: nothing is left
            return
        deadline = time.monotonic() + wait_s
        while True:
            try:
                line = self.launched.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if line is None:
                return
            event = events.decode(line)
            if event is not None and event["type"] == "output" and self.result.id is not None:
                self.result.apply(event)
                self.runner.store.add_event(self.result.id, event)

    def finish(self) -> None:
        """Stop whatever is left of the worker and commit the trial (once)."""
        if self._finished:
            return
        self._finished = True
        r = self.result
        launched = self.launched
        if launched is not None:
            launched.stop()
            self.late_output()
        r.wall_s = time.monotonic() - self.t0
        if not r.summary and r.samples:
            summary = workloads.get(r.spec.workload).summarize([s.to_dict() for s in r.samples], r.spec.params)
            r.summary = summaries_from_dict(summary)
        if r.contention is not None and r.telemetry:  # the clocks under load, from its own NVML readings
            r.contention = dataclasses.replace(r.contention, **contention.clocks([t.to_dict() for t in r.telemetry]))
        if r.id is not None:
            try:
                self.runner.store.finish_trial(r.id, r.status, error=r.error, error_kind=r.error_kind,
                                               exit_code=r.exit_code, fingerprint=r.fingerprint, config=r.config,
                                               startup=r.startup, metrics=r.metrics, summary=r.summary,
                                               contention=r.contention)
            except StoreError as exc:  # never raised here: every worker of a group is still to be stopped;
                first = self.runner.store_refused(exc)  # whoever starts the next trial raises it
                if r.error_kind != "store":
                    r.status, r.error_kind, r.error = "failed", "store", f"not kept: {first}"
        if self.runner.on_trial_end:
            self.runner.on_trial_end(r)
