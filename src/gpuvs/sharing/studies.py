"""The studies of `gpuvs share`: K workers under each arm (scaling), two jobs alone and together
(pairs, interference) and instances added until one fails (capacity). Each repeats its groups in
fresh processes and returns what it measured; the command line renders it. `heading` is told what is
about to run (the command line draws it as a rule)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from gpuvs.errors import RunFailed
from gpuvs.sharing.group import CapacityRun, Coordinator, Group, normalized_sum
from gpuvs.sharing.knobs import ShareArm
from gpuvs.spec import EnvSpec, RunSpec

Heading = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


def repeat_label(label: str, rep: int, repeats: int) -> str:
    return label + (f" (repeat {rep + 1} of {repeats})" if repeats > 1 else "")


@dataclass
class Scaling:
    """Each worker count under each arm, over the repeats; the base is one worker under the first arm."""

    arms: list[ShareArm]
    runs: dict[tuple[str, int], list[Group]] = field(default_factory=dict)  # (arm label, count) -> groups

    @property
    def base_runs(self) -> list[Group]:
        return self.runs[(self.arms[0].label, 1)]

    def groups(self) -> list[Group]:
        return [g for groups in self.runs.values() for g in groups]


def scaling(coord: Coordinator, base: RunSpec, counts: list[int], arms: list[ShareArm], repeats: int,
            heading: Heading = _quiet) -> Scaling:
    """Each count under each arm, repeated in fresh process groups; the first repeat's order is repeated.
    One worker alone is always measured (the base of 'vs alone')."""
    ks = ([1] if 1 not in counts else []) + counts
    out = Scaling(arms)
    for rep in range(repeats):
        for arm in arms:
            for k in ks:
                label = f"{k} worker{'s' if k > 1 else ''}{'' if arm.label == 'time-sliced' else ', ' + arm.label}"
                heading(repeat_label(label, rep, repeats))
                env = arm.client_env * k if arm.client_env else None
                out.runs.setdefault((arm.label, k), []).append(coord.group([base] * k, label, arm.mps, env))
    return out


@dataclass
class Interference:
    """Jobs A and B alone, then together under each arm, over the repeats. Work = sum over both jobs of
    together/alone, alone from the same repeat."""

    arms: list[ShareArm]
    alone: dict[str, list[Group]] = field(default_factory=lambda: {"A alone": [], "B alone": []})
    together: dict[str, list[Group]] = field(default_factory=dict)  # arm label -> groups
    work: dict[str, list[float | None]] = field(default_factory=dict)  # arm label -> work per repeat

    def groups(self) -> list[Group]:
        return [g for gs in (*self.alone.values(), *self.together.values()) for g in gs]


def pairs(coord: Coordinator, a: RunSpec, b: RunSpec, arms: list[ShareArm], repeats: int,
          heading: Heading = _quiet) -> Interference:
    """A alone, B alone, then A+B under each arm; all repeated in fresh process groups."""
    out = Interference(arms, together={arm.label: [] for arm in arms}, work={arm.label: [] for arm in arms})
    for rep in range(repeats):
        for label, spec in (("A alone", a), ("B alone", b)):
            heading(repeat_label(f"{label}: {spec.workload}", rep, repeats))
            out.alone[label].append(coord.group([spec], label, False))
        base = [out.alone["A alone"][-1].value(0), out.alone["B alone"][-1].value(0)]
        for arm in arms:
            heading(repeat_label(f"A+B, {arm.label}", rep, repeats))
            g = coord.group([a, b], f"A+B, {arm.label}", arm.mps, arm.client_env or None)
            out.together[arm.label].append(g)
            out.work[arm.label].append(normalized_sum(g, base))
    return out


@dataclass
class CapacitySweep:
    """One capacity sweep: its unit (container or process), its arm and what it measured."""

    unit: str
    arm: ShareArm
    run: CapacityRun


def capacity(coord: Coordinator, base: RunSpec, arms: list[ShareArm], max_workers: int, also_host: bool = False,
             heading: Heading = _quiet) -> list[CapacitySweep]:
    """The co-location study: instances added one at a time, for each arm (and on the host too with
    also_host: the same sweep with plain processes)."""
    units = [("container" if base.env.kind != "host" else "process", base)]
    if also_host:
        units.append(("process", dataclasses.replace(base, env=EnvSpec())))
    sweeps = []
    for unit, spec in units:
        for arm in arms:
            label = f"capacity, {unit}, {arm.label}"
            heading(f"{label}: {spec.workload}, up to {max_workers}")
            sweeps.append(CapacitySweep(unit, arm, coord.capacity(spec, max_workers, arm.mps, label,
                                                                  arm.client_env[0] if arm.client_env else None)))
    return sweeps


def raise_if_failed(groups: list[Group]) -> None:
    """A study with a failed worker ends with RunFailed (after its table): one line naming the first cause."""
    bad = [g for g in groups if not g.ok]
    if bad:
        raise RunFailed(f"{len(bad)} of {len(groups)} group(s) had a failed worker; first: "
                        f"{bad[0].failure or next((t.error for t in bad[0].trials if not t.ok), 'failed')}")
