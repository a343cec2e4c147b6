"""What competed with each arm's trials, from their contention records.

The highest load and CPU pressure, the usable CPUs, other GPU processes, and the SM clock under load.
`busy` applies the rule of probes/contention.py; `lines` says it per arm, beside the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuvs.probes import contention
from gpuvs.store.records import TrialRecord

CLOCK_DROP = 0.10  # an SM clock under load that varied more than this (its lowest below 90% of its highest)


@dataclass
class ArmDisturbance:
    """One arm's trials (their last attempts): how many there were and how many carried a contention record, the
    highest load, CPU pressure and steal, the fewest usable CPUs, the trials NVML was read in, every other GPU
    process with the trials it was seen in, the contended trials and why, and the SM clock under load."""

    arm: str
    trials: int = 0
    recorded: int = 0
    load: float | None = None
    cpus_usable: float | None = None
    cpu_pressure: float | None = None
    steal: float | None = None
    gpu_checked: int = 0
    gpu_others: list[tuple[str, int]] = field(default_factory=list)
    contended: int = 0
    reasons: list[str] = field(default_factory=list)
    sm_clock: tuple[float, float] | None = None  # lowest and highest MHz under load
    slowdowns: list[tuple[str, int]] = field(default_factory=list)  # throttle reason, trials it was seen in

    @property
    def busy(self) -> bool:
        return bool(self.reasons)

    @property
    def clocks_changed(self) -> bool:
        return bool(self.slowdowns) or (self.sm_clock is not None and self.sm_clock[0] < (1 - CLOCK_DROP)
                                        * self.sm_clock[1])

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "trials": self.trials, "recorded": self.recorded, "load": self.load,
                "cpus_usable": self.cpus_usable, "cpu_pressure": self.cpu_pressure, "steal": self.steal,
                "gpu_checked": self.gpu_checked, "gpu_others": [list(p) for p in self.gpu_others],
                "contended": self.contended, "reasons": self.reasons,
                "sm_clock": list(self.sm_clock) if self.sm_clock else None,
                "slowdowns": [list(s) for s in self.slowdowns], "busy": self.busy}

    def seen(self) -> list[str]:
        """The disturbances seen, in a few words each (the A/A sentence names them)."""
        out = []
        cpu = [r for r in self.reasons if r != "gpu process"]
        if cpu:
            out.append(f"machine busy during arm {self.arm} ({self._cpu_text()})")
        if self.gpu_others:
            out.append(f"another process on the GPU during arm {self.arm} ({self._gpu_text()})")
        if self.clocks_changed:
            out.append(f"GPU clocks changed during arm {self.arm} ({self._clock_text()})")
        return out

    def lines(self) -> list[tuple[str, str]]:
        """(level, text): 'warning' where the arm was contended, else 'note'."""
        if not self.recorded:
            return [("note", f"arm {self.arm}: what competed with its trials was not recorded (trials of an earlier "
                             "gpuvs, or a command run bare)")]
        out = []
        cpu = [r for r in self.reasons if r != "gpu process"]
        if cpu:
            out.append(("warning", f"machine busy during arm {self.arm}: {self._cpu_text()} ({self.contended} of "
                                   f"{self.trials} trials contended)"))
        if self.gpu_others:
            out.append(("warning", f"another process on the GPU during arm {self.arm}: {self._gpu_text()}"))
        if self.clocks_changed:
            out.append(("note", f"GPU clocks during arm {self.arm}: {self._clock_text()}"))
        if not self.busy:
            gpu = ("" if not self.gpu_checked else ", no other process on the GPU")
            out.append(("note", f"arm {self.arm}: not contended ({self._cpu_text()}{gpu})"))
        return out

    def _cpu_text(self) -> str:
        parts = []
        if self.load is not None:
            cpus = f" on {self.cpus_usable:g} usable CPU{'s' if self.cpus_usable != 1 else ''}" \
                if self.cpus_usable else ""
            parts.append(f"load {self.load:.1f}{cpus}")
        if self.cpu_pressure is not None:
            parts.append(f"CPU pressure {100 * self.cpu_pressure:.0f}%")
        if self.steal and self.steal >= 0.01:  # below 1%: nothing a reader acts on
            parts.append(f"steal {100 * self.steal:.1f}%")
        return ", ".join(parts) or "no load or pressure readable"

    def _gpu_text(self) -> str:
        return ", ".join(f"{who} during {n} of {self.trials} trials" for who, n in self.gpu_others)

    def _clock_text(self) -> str:
        parts = []
        if self.sm_clock is not None:
            parts.append(f"SM clock {self.sm_clock[0]:,.0f}–{self.sm_clock[1]:,.0f} MHz under load")
        parts += [f"{name} in {n} of {self.trials} trials" for name, n in self.slowdowns]
        return "; ".join(parts)


def arm_disturbance(arm: str, records: list[TrialRecord]) -> ArmDisturbance:
    """One arm's disturbance from its trials' records (their last attempts)."""
    out = ArmDisturbance(arm, trials=len(records))
    others: dict[str, set[int]] = {}
    reasons: set[str] = set()
    clocks: list[float] = []
    slow: dict[str, set[int]] = {}

    def top(values):
        values = [v for v in values if v is not None]
        return max(values) if values else None

    recs = [r.contention for r in records if r.contention is not None]
    out.recorded = len(recs)
    out.load = top(c.load for c in recs)
    usable = [c.cpus_usable for c in recs if c.cpus_usable]
    out.cpus_usable = min(usable) if usable else None
    out.cpu_pressure = top(c.cpu_pressure for c in recs)
    out.steal = top(c.steal for c in recs)
    for r in records:
        c = r.contention
        if c is not None:
            out.gpu_checked += int(c.gpu_checked)
            why = contention.busy(c.load, c.cpus_usable, c.cpu_pressure, c.steal, len(c.gpu_processes))
            reasons.update(why)
            out.contended += int(bool(why))
            for p in c.gpu_processes:
                others.setdefault(p.describe(), set()).add(r.trial)
            if c.sm_clock_loaded:
                clocks.extend(c.sm_clock_loaded)
            for name in c.slowdowns:
                slow.setdefault(name, set()).add(r.trial)
    out.reasons = [w for w in ("load", "cpu pressure", "steal", "gpu process") if w in reasons]
    out.gpu_others = sorted(((who, len(ts)) for who, ts in others.items()), key=lambda x: (-x[1], x[0]))
    out.sm_clock = (min(clocks), max(clocks)) if clocks else None
    out.slowdowns = sorted((name, len(ts)) for name, ts in slow.items())
    return out


def per_arm(arms: list[str], records: list[TrialRecord]) -> list[ArmDisturbance]:
    """Every arm's, in the arms' order; none where no trial of any arm recorded what competed with it (a store
    written before gpuvs recorded it)."""
    if not any(r.contention is not None for r in records):
        return []
    return [arm_disturbance(name, [r for r in records if r.arm == name]) for name in arms]
