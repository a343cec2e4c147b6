"""stress-ng's `--metrics-brief` (or `--metrics`) table, one row per stressor, printed on stderr at the end.

ARG: the stressor whose row is read (cpu, vm...); without one, the run must have one stressor only.
Bogo operations of different stressors are not one unit, so a table of several fails the trial, naming them.
bogo_ops_per_sec (the headline) is over real time, bogo_ops_per_sec_cpu over user + system time."""

from __future__ import annotations

import re

from gpuvs.workloads.command.outputs import register
from gpuvs.workloads.command.outputs.parsing import Line, Metric, OutputError, Parser, Reading, number

NUM = r"\d+(?:\.\d+)?"
ROW = re.compile(rf"^(?:stress-ng:\s+\w+:\s+\[\d+\]\s+)?([A-Za-z][\w-]*)\s+(\d+)\s+({NUM})\s+({NUM})\s+({NUM})\s+"
                 rf"({NUM})\s+({NUM})(?:\s|$)")


@register
class StressNg(Parser):
    name = "stress-ng"
    summary = "stress-ng --metrics-brief: bogo ops/s of one stressor (over real time and over CPU time)"
    arg = "STRESSOR: the row to read (default: the only one)"

    def __init__(self, arg=None, job=None):
        super().__init__(arg, job)
        self.stressor = arg
        row = f"the {arg!r} row" if arg else "the stressor's row"
        self.metrics = (
            Metric("bogo_ops_per_sec", "higher", "bogo ops/s", read_from=f"bogo ops/s (real time) in {row} "
                   "of stress-ng's --metrics-brief table", kind="rate"),
            Metric("bogo_ops_per_sec_cpu", "higher", "bogo ops/s", read_from=f"bogo ops/s (usr+sys time) in {row} "
                   "of stress-ng's --metrics-brief table", kind="rate"),
        )
        self.headline = "bogo_ops_per_sec"
        self.info["rows"] = {}
        self._lines: dict[str, Line] = {}

    def feed(self, line: Line) -> list[Reading]:
        m = ROW.match(line.text)
        if m is None:
            return []
        what = f"stress-ng ({line.source})"
        name = m.group(1)
        ops, real, usr, sys_, rate, rate_cpu = (number(m.group(i), what) for i in range(2, 8))
        self.info["rows"][name] = {"bogo_ops": int(ops), "real_time_s": real, "usr_time_s": usr, "sys_time_s": sys_,
                                   "bogo_ops_per_sec": rate, "bogo_ops_per_sec_cpu": rate_cpu}
        self._lines[name] = line
        return self._readings(name) if name == self.stressor else []

    def finish(self) -> list[Reading]:
        rows = self.info["rows"]
        if self.stressor is not None or not rows:
            return []
        if len(rows) > 1:
            raise OutputError(f"stress-ng ran {len(rows)} stressors ({', '.join(rows)}): name the one to compare, "
                              f"e.g. stress-ng:{next(iter(rows))}")
        return self._readings(next(iter(rows)))

    def _readings(self, name: str) -> list[Reading]:
        row, line = self.info["rows"][name], self._lines[name]
        self.info.update(stressor=name, **{k: row[k] for k in ("bogo_ops", "real_time_s", "usr_time_s", "sys_time_s")})
        return [self.reading("bogo_ops_per_sec", row["bogo_ops_per_sec"], line),
                self.reading("bogo_ops_per_sec_cpu", row["bogo_ops_per_sec_cpu"], line)]
