"""Where an experiment's wall time went, as seconds and as shares of that wall time.

Per trial: measured, fork, warm-up, start-up and teardown, from the launch to the exit gpuvs sees.
A command job is timed as a whole: its run, the start-up before it and the teardown after it.
Per experiment, other is the runner's own time; the parts add up to the wall time (docs/trials.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from gpuvs.events import TIMED_S

if TYPE_CHECKING:
    from gpuvs.store.records import ExperimentRecord, TrialRecord
    from gpuvs.store.records import SeriesSummary

PARTS = ("measured", "start_up", "warm_up", "fork", "teardown", "other")
JOB = "job"  # a command job's run: a part of its own, where an experiment has such trials (between measured and start-up)
LABELS = {"measured": "measured (timed steps)", JOB: "the job's run (its wall time)", "start_up": "start-up",
          "warm_up": "warm-up", "fork": "fork", "teardown": "teardown", "other": "other (the runner's own)"}
WALL_TIME = "wall_time_s"  # the command workload's own series (workloads/command/outputs/parsing.py: WALL_TIME)
RANK_PARTS = ("ranks_s", "ranks_process_s", "ranks_import_s", "ranks_group_s")  # trial/multiproc.py: the ranks' start
JOB_STARTS = ("job_start_s", "container_started_s", "pod_started_s")  # a command job's start, first known wins


@dataclass
class TrialTime:
    wall_s: float  # launch to exit
    measured_s: float
    fork_s: float
    warm_up_s: float
    start_up_s: float
    teardown_s: float
    job_s: float | None = None  # a command job's run (its wall time); None: not a command job
    warm_up_steps: int | None = None  # an adaptive warm-up's steps (config warmup_steps with warmup_stop); else None
    warm_up_stop: str | None = None  # why it stopped: 'steady' or 'cap' (workloads/_warmup.py)
    shape_warm_ups: list[tuple[int, str]] | None = None  # per shape (gemm, membw): (blocks, why it stopped); else None
    ranks: dict[str, float] | None = None  # across ranks: RANK_PARTS -> seconds, inside start-up; else None
    ranks_started_by: str | None = None  # 'fork' or 'spawn' (trial/multiproc.py); None: not stored


@dataclass
class TimeShares:
    wall_s: float  # the experiment's
    seconds: dict[str, float]  # part -> seconds (PARTS)
    shares: dict[str, float]  # part -> share of wall_s
    trials: int  # trials with a launch-to-exit time
    per_trial: dict[str, float]  # part -> mean seconds per such trial (other: none)
    zygote_starts_s: list[float] = field(default_factory=list)
    warm_ups: list[tuple[int, str]] = field(default_factory=list)  # each adaptive warm-up: (steps, why it stopped)
    shape_warm_ups: list[tuple[int, str]] = field(default_factory=list)  # each shape's (gemm, membw): (blocks, why)
    ranks: dict[str, Any] | None = None  # trials across ranks: {trials, started_by: {how: n}, per_trial: {part: s}}

    def to_dict(self) -> dict[str, Any]:
        """As --format json writes it: warm_ups only where a trial warmed up adaptively (the keys of before)."""
        out = asdict(self)
        for key in ("warm_ups", "shape_warm_ups"):  # only where a trial warmed up adaptively (the keys of before)
            out.pop(key)
            if getattr(self, key):
                out[key] = [{"steps": n, "stopped": why} for n, why in getattr(self, key)]
        if out["ranks"] is None:  # only where trials ran across ranks (the keys of before)
            out.pop("ranks")
        return out

    def parts(self) -> list[str]:
        """The parts to show, in order: a command job's run where there is one; beside it, the timed steps,
        warm-up and fork only where a trial had them (a command job has none of the first two, and forks only
        under --fresh fork)."""
        return [p for p in (PARTS[:1] + (JOB,) + PARTS[1:]) if p in self.seconds
                and (p not in ("measured", "warm_up", "fork") or self.seconds[p] or JOB not in self.seconds)]


def trial_time(startup: Mapping[str, float], summary: Mapping[str, SeriesSummary],
               config: Mapping[str, Any] | None = None) -> TrialTime | None:
    """One trial's launch-to-exit time in parts (None when it has no launch-to-exit time). `summary` is
    the trial's, headline series first (as the worker orders it); `config` its config items, where an
    adaptive warm-up says what it decided (stores of earlier versions have none: a fixed warm-up)."""
    wall = startup.get("launch_to_exit_s")
    if wall is None:
        return None
    wall = float(wall)
    fork = float(startup.get("fork_s") or 0.0)
    job = summary.get(WALL_TIME) if summary else None
    if job is not None and job.value is not None:  # a command job: gpuvs timed its whole run, not its steps
        run = float(job.value)
        around = max(0.0, wall - run)  # gpuvs's own time around the job
        marked = next((float(startup[k]) for k in JOB_STARTS if startup.get(k) is not None), None)
        start = min(max(0.0, marked), around) if marked is not None else around
        fork = min(fork, start)
        return TrialTime(wall, 0.0, fork, 0.0, start - fork, around - start, job_s=run)
    head = next(iter(summary.values()), None) if summary else None
    measured = float(head.total_seconds or 0.0) if head is not None else 0.0
    # a workload that times several series in turn says all its timed blocks' seconds itself (events.TIMED_S)
    if startup.get(TIMED_S) is not None:
        measured = float(startup[TIMED_S])
    warm = float(startup.get("warmup_s") or 0.0)
    if startup.get("launch_to_timed_s") is not None:  # T0, launch to the first timed step; else worked back
        timed_at = float(startup["launch_to_timed_s"])
    elif startup.get("launch_to_done_s") is not None:
        timed_at = float(startup["launch_to_done_s"]) - measured
    else:
        timed_at = wall - measured
    start = max(0.0, timed_at - warm - fork)
    teardown = max(0.0, wall - timed_at - measured)
    config = config or {}
    stop = config.get("warmup_stop")
    steps = config.get("warmup_steps")
    adaptive = isinstance(stop, str) and isinstance(steps, int)
    ranks = {k: float(startup[k]) for k in RANK_PARTS if startup.get(k) is not None}
    how = config.get("ranks_started_by")
    shapes = config.get("warmup_shapes")  # workloads/_warmup.py SHAPES_ITEM
    per_shape = [(int(d["steps"]), str(d["stop"])) for d in shapes.values() if isinstance(d, dict)
                 and isinstance(d.get("steps"), int) and isinstance(d.get("stop"), str)] \
        if isinstance(shapes, dict) else []
    return TrialTime(wall, measured, fork, warm, start, teardown, warm_up_steps=steps if adaptive else None,
                     warm_up_stop=stop if adaptive else None, ranks=ranks if "ranks_s" in ranks else None,
                     ranks_started_by=how if isinstance(how, str) else None, shape_warm_ups=per_shape or None)


def shares(wall_s: float | None, trials: Iterable[TrialTime | None], timing: Mapping[str, Any] | None = None
           ) -> TimeShares | None:
    """The experiment's parts. `timing` is what the runner recorded (zygote_wait_s, zygote_starts_s)."""
    timing = timing or {}
    known = [t for t in trials if t is not None]
    if not wall_s or wall_s <= 0:
        return None
    waited = float(timing.get("zygote_wait_s") or 0.0)
    sec = {"measured": sum(t.measured_s for t in known), "start_up": sum(t.start_up_s for t in known) + waited,
           "warm_up": sum(t.warm_up_s for t in known), "fork": sum(t.fork_s for t in known),
           "teardown": sum(t.teardown_s for t in known)}
    jobs = [t.job_s for t in known if t.job_s is not None]
    if jobs:  # a key of its own only where there are command jobs (the JSON of other experiments is as it was)
        sec[JOB] = sum(jobs)
    accounted = sum(sec.values())
    wall = max(float(wall_s), accounted)  # clocks read apart may disagree by a few ms: never a negative part
    sec["other"] = wall - accounted
    n = len(known)
    per = {"measured": sec["measured"] / n, "start_up": (sec["start_up"] - waited) / n, "warm_up": sec["warm_up"] / n,
           "fork": sec["fork"] / n, "teardown": sec["teardown"] / n,
           "wall": sum(t.wall_s for t in known) / n} if n else {}
    if jobs and n:
        per[JOB] = sec[JOB] / n
    return TimeShares(wall_s=wall, seconds=sec, shares={k: v / wall for k, v in sec.items()}, trials=n, per_trial=per,
                      zygote_starts_s=[float(x) for x in timing.get("zygote_starts_s") or []],
                      warm_ups=[(t.warm_up_steps, t.warm_up_stop) for t in known
                                if t.warm_up_steps is not None and t.warm_up_stop is not None],
                      shape_warm_ups=[w for t in known for w in t.shape_warm_ups or ()],
                      ranks=_ranks(known))


def _ranks(known: list[TrialTime]) -> dict[str, Any] | None:
    """The ranks' start of the trials that ran across ranks: how many, how their ranks started, the mean
    seconds of each of its parts per such trial (each inside that trial's start-up); None where there were none."""
    across = [t for t in known if t.ranks]
    if not across:
        return None
    how: dict[str, int] = {}
    for t in across:
        how[t.ranks_started_by or "unknown"] = how.get(t.ranks_started_by or "unknown", 0) + 1
    per = {k: sum(t.ranks.get(k, 0.0) for t in across) / len(across) for k in RANK_PARTS}
    per["start_up_s"] = sum(t.start_up_s for t in across) / len(across)
    return {"trials": len(across), "started_by": dict(sorted(how.items())), "per_trial": per}


def from_records(records: Iterable[Any], wall_s: float | None, timing: Mapping[str, Any] | None = None
                 ) -> TimeShares | None:
    """From trials that have a `startup` and a `summary` (the store's TrialRecord, the runner's
    TrialResult)."""
    return shares(wall_s, [trial_time(r.startup or {}, r.summary or {}, r.config)
                           for r in records], timing)


def wall_of(experiment: ExperimentRecord, records: list[TrialRecord]) -> float | None:
    """An experiment's wall time: as the runner recorded it, else its creation to its last trial's end."""
    timing = experiment.meta.timing or {}
    if timing.get("wall_s"):
        return float(timing["wall_s"])
    ends = [r.ended for r in records if r.ended]
    return max(ends) - experiment.created if ends and experiment.created else None
