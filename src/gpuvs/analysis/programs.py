"""Whether the arms of a command comparison ran the same program (store/records.ProgramRecord, read where it ran).

Two arms that ran "python3 train.py" may have run two Pythons, so the report says so beside the verdict.
`compare --strict` refuses a verdict then; where the arms asked to differ, what differs is named instead.
Reads typed records, runs nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuvs.store.records import ProgramRecord, TrialRecord

# What an arm may vary to ask for another program, where the arms run in the same kind of environment: an image
# against another is a new program by design; env (host against container) never is.
PROGRAM_KEYS = ("image", "rootfs", "env_var")


@dataclass
class ArmProgram:
    """What one arm ran: its command line, the program of its first successful trial, and the others its own
    trials ran (a file changed between them)."""

    arm: str
    command: str | None
    program: ProgramRecord
    others: list[ProgramRecord] = field(default_factory=list)


@dataclass
class ProgramCheck:
    """The arms' programs side by side. `differ`: arms (after the first, the baseline) whose program is not the
    baseline's, and arms whose own trials ran different ones; `asked`: why that was asked for (empty: it was not);
    `workdirs`: arms that started elsewhere than the baseline, where the working directory was not varied."""

    arms: list[ArmProgram]
    differ: list[str]
    asked: str
    workdirs: list[str]

    @property
    def unasked(self) -> bool:
        """Arms that did not ask to differ in the program ran different programs: no verdict under --strict."""
        return bool(self.differ) and not self.asked

    def _named(self, names: list[str]) -> str:
        """`host ran /venv/bin/python3 (Python 3.11.7, sha256 ab12..), ctr ran ...`: the baseline and the arms
        named; the script too where the scripts differ."""
        base = self.arms[0]
        shown = [base] + [a for a in self.arms if a.arm in names and a is not base]
        ran = [(a.arm, p) for a in shown for p in [a.program, *a.others]]
        scripts = len({p.script.sha256 or p.script.path if p.script else None for _, p in ran}) > 1
        return ", ".join(f"{name} {'ran' if i == 0 or ran[i - 1][0] != name else 'also ran'} "
                         f"{p.describe(with_script=scripts)}" for i, (name, p) in enumerate(ran))

    def said(self) -> list[tuple[str, str]]:
        """What the report says beside the verdict, as (level, text): a warning where nobody asked for it, a note
        naming what differs where the arms asked to."""
        out = []
        if self.differ and self.asked:
            out.append(("note", f"arms ran different programs, as asked ({self.asked}): {self._named(self.differ)}"))
        elif self.differ:
            out.append(("warning", f"arms ran different programs: {self._named(self.differ)}; the verdict compares "
                                   "the programs as much as where they ran (name one executable: a full path, or "
                                   "the same PATH)"))
        if self.workdirs:
            base = self.arms[0]
            where = ", ".join(f"{a.arm} in {a.program.workdir}" for a in self.arms
                              if a is base or a.arm in self.workdirs)
            out.append(("warning", f"arms started in different working directories: {where}; relative paths in the "
                                   "command name different files (give --workdir)"))
        return out

    def lines(self) -> list[str]:
        return [text for _, text in self.said()]

    def refusal(self) -> str:
        """compare --strict's one line."""
        return (f"no verdict (--strict): arms ran different programs: {self._named(self.differ)}; give them one "
                "executable (a full path, or the same PATH), or compare without --strict to see the verdict with "
                "this warning")

    def to_dict(self) -> dict[str, Any]:
        return {"arms": [{"arm": a.arm, "command": a.command, "program": asdict(a.program),
                          "others": [asdict(o) for o in a.others]} for a in self.arms],
                "differ": list(self.differ), "asked": self.asked, "unasked": self.unasked,
                "workdirs": list(self.workdirs)}


def check(arm_names: list[str], records: list[TrialRecord], varied: set[str]) -> ProgramCheck | None:
    """The programs of the arms' successful trials (the baseline first); None where fewer than two arms recorded
    one (other workloads, stores of earlier versions, a bare pod: nothing to tell)."""
    arms: list[ArmProgram] = []
    for name in arm_names:
        ran = [(r, r.program) for r in records if r.arm == name and r.ok]
        ran = [(r, p) for r, p in ran if p is not None and p.known]
        if not ran:
            continue
        first = ran[0][1]
        others: list[ProgramRecord] = []
        for _, p in ran[1:]:
            if not any(p.same_as(seen) for seen in [first, *others]):
                others.append(p)
        arms.append(ArmProgram(name, ran[0][0].config.get("command"), first, others))
    if len(arms) < 2:
        return None
    base = arms[0]
    differ = [a.arm for a in arms if a.others or (a is not base and not a.program.same_as(base.program))]
    commands = {a.command for a in arms}
    if len(commands) > 1:
        asked = "their command lines differ"
    elif "env" not in varied and varied & set(PROGRAM_KEYS):
        asked = "they differ in " + ", ".join(k for k in PROGRAM_KEYS if k in varied)
    else:
        asked = ""
    workdirs = [] if "workdir" in varied else [a.arm for a in arms[1:] if a.program.workdir != base.program.workdir]
    return ProgramCheck(arms, differ, asked, workdirs)
