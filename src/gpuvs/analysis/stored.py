"""`gpuvs compare --stored A B`: two stored experiments, or two arms of one, compared as two arms (A the baseline).

It reads the references (EXPERIMENT or EXPERIMENT:ARM) and refuses two sides that measured nothing in common.
Each side is shown by a short name, its arm's or its id's random tail, so the verdict reads as words."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from gpuvs.analysis.comparison import Analysis, analyse
from gpuvs.errors import UsageError
from gpuvs.store.records import ArmMeta, ExperimentMeta, ExperimentRecord, TrialRecord, latest_attempts

WALL_TIME = "wall_time_s"  # the command workload's own figure, which every command trial has


@dataclass
class Side:
    ref: str  # as given
    experiment: ExperimentRecord
    arm: str
    records: list[TrialRecord]
    name: str = ""  # the short name it is shown by

    @property
    def full(self) -> str:
        return f"{self.experiment.id}:{self.arm}"

    def figures(self) -> list[str]:
        """The figures its successful trials recorded (series, then scalar metrics), in their order."""
        names: dict[str, None] = {}
        for r in self.records:
            if r.ok:
                names.update((n, None) for n, s in r.summary.items() if s.value is not None)
                names.update((n, None) for n, m in r.metrics.items() if m.value is not None)
        return list(names)


def pick(store, before: str, after: str) -> list[Side]:
    """The two sides, each reference read against the store (an experiment's id or its start, and its arm,
    which may be left out where the experiment has one); one line for what does not fit."""
    sides = []
    for ref in (before, after):
        ident, _, arm = ref.partition(":")
        exp = store.experiment(ident)
        records = latest_attempts(store.trials(exp.id))
        names = list(dict.fromkeys(r.arm for r in records))
        if not arm:
            if len(names) != 1:
                raise UsageError(f"--stored {ref}: experiment {exp.id} has arms {', '.join(names) or '(none)'}; "
                                 f"name one as {ident}:ARM")
            arm = names[0]
        if arm not in names:
            raise UsageError(f"--stored {ref}: experiment {exp.id} has no arm {arm!r}; its arms: {', '.join(names)}")
        sides.append(Side(ref, exp, arm, [r for r in records if r.arm == arm]))
    workloads = {_workload(s) for s in sides}
    if len(workloads) > 1:
        raise UsageError(f"--stored: the two experiments ran different workloads ({', '.join(map(str, workloads))})")
    if sides[0].full == sides[1].full:
        raise UsageError("--stored needs two different experiments or arms")
    for side, name in zip(sides, names_of(sides)):
        side.name = name
    return sides


def _workload(side: Side) -> str | None:
    return side.experiment.meta.workload or (side.records[0].spec.workload
                                             if side.records and side.records[0].spec else None)


def names_of(sides: list[Side]) -> list[str]:
    """Short names, different from each other: the arms' where they tell the two apart (and say something),
    else the experiments' id tails, else the whole references."""
    a, b = sides
    same_experiment = a.experiment.id == b.experiment.id
    if a.arm != b.arm and (same_experiment or "default" not in (a.arm, b.arm)):
        return [a.arm, b.arm]
    tails = [s.experiment.id.rsplit("-", 1)[-1] for s in sides]
    if tails[0] != tails[1]:
        return tails if a.arm == b.arm else [f"{t}:{s.arm}" for t, s in zip(tails, sides)]
    return [a.full, b.full]


def refuse_unshared(sides: list[Side]) -> None:
    """One line when the two sides measured nothing in common: no figure at all, or (a command's) no figure of
    the job's own, gpuvs's wall time aside (two different commands, most likely)."""
    a, b = sides
    fa, fb = a.figures(), b.figures()
    if not fa or not fb:  # a side with no successful trial: the analysis says so, row by row
        return
    shared = [f for f in fa if f in fb]
    own_a, own_b = [f for f in fa if f != WALL_TIME], [f for f in fb if f != WALL_TIME]
    if not shared:
        why = "they share none"
    elif own_a and own_b and not set(own_a) & set(own_b):
        why = f"they share no figure of the job's own, only gpuvs's {WALL_TIME} (two different commands?)"
    else:
        return
    raise UsageError(f"--stored: {a.name} ({a.full}) recorded {', '.join(fa)} and {b.name} ({b.full}) recorded "
                     f"{', '.join(fb)}: {why}, so there is nothing to compare them on; compare runs that read the "
                     f"same figures")


def compare(sides: list[Side], margin: float, confidence: float) -> Analysis:
    """The two sides as one analysis, each side's trials under its short name. Two arms of one interleaved
    experiment ran in the same rounds: they are paired by round, as that experiment's own report pairs them
    (its looks and A/A kept). Two experiments are not interleaved: the report says that drift between them
    cannot be told apart from the change."""
    refuse_unshared(sides)
    a, b = sides
    merged = []
    for side in sides:
        merged += [dataclasses.replace(r, arm=side.name) for r in side.records]
    exp, rounds = a.experiment, same_rounds(sides)
    header = ExperimentRecord(f"{a.full} vs {b.full}", f"stored: {b.name} against {a.name}", "compare-stored",
                              time.time(),
                              ExperimentMeta(margin=margin, confidence=confidence, workload=_workload(a) or _workload(b),
                                             interleaved=rounds, arms=[ArmMeta(a.name), ArmMeta(b.name)],
                                             sequential=exp.meta.sequential if rounds else None,
                                             aa=exp.meta.is_aa(exp.kind) if rounds else None))
    analysis = analyse(header, merged)
    head = next((m.name for m in analysis.metrics if m.headline), None)
    fa, fb = a.figures(), b.figures()
    if head and fa and fb and (head not in fa or head not in fb):
        has, lacks = (a, b) if head in fa else (b, a)
        raise UsageError(f"--stored: the headline {head} is {has.name}'s only: {lacks.name} ({lacks.full}) recorded "
                         f"{', '.join(lacks.figures())}, so the verdict would have nothing to stand on; compare runs "
                         f"that read the same figures")
    return analysis


def same_rounds(sides: list[Side]) -> bool:
    """Whether the two sides are arms of one experiment whose trials ran in interleaved rounds (A B | B A)."""
    a, b = sides
    return a.experiment.id == b.experiment.id and a.experiment.meta.is_interleaved(a.experiment.kind)


def pairs(sides: list[Side]) -> str:
    """Which short name is which experiment and arm: one line under the report, which says where the two
    arms ran in the same interleaved rounds."""
    line = "; ".join(f"{s.name}: experiment {s.experiment.id}, arm {s.arm}" + (" (the baseline)" if i == 0 else "")
                     for i, s in enumerate(sides) if s.name)
    if same_rounds(sides):
        line += "; both arms ran in the same interleaved rounds: paired by round"
    return line
