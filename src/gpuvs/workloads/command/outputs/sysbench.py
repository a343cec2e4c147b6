"""sysbench's report (1.0.x), for its cpu and memory tests.

ARG: the test (cpu or memory); without one, the test named in the command's argv. Each line is read as it appears.
Headlines: events_per_sec (cpu) and mib_per_sec (memory); the rest are in docs/command.md.
Neither total_events nor total_time_s is a metric: which one to compare depends on how the run was bounded."""

from __future__ import annotations

import re

from gpuvs.errors import UsageError
from gpuvs.workloads.command.outputs import register
from gpuvs.workloads.command.outputs.parsing import Line, Metric, Parser, Reading, number

TESTS = ("cpu", "memory")
NUM = r"\d+(?:\.\d+)?"
INFO = (
    ("version", re.compile(r"^sysbench (\S+)")),
    ("threads", re.compile(r"^Number of threads:\s*(\d+)")),
    ("block_size", re.compile(r"^\s*block size:\s*(\S+)")),
    ("total_time_s", re.compile(rf"^\s*total time:\s*({NUM})s\s*$")),
    ("total_events", re.compile(r"^\s*total number of events:\s*(\d+)\s*$")),
    ("latency_sum_ms", re.compile(rf"^\s*sum:\s*({NUM})\s*$")),
)
LATENCY = re.compile(rf"^\s*(avg|95th percentile):\s*({NUM})\s*$")
CPU_RATE = re.compile(rf"^\s*events per second:\s*({NUM})\s*$")
OPS = re.compile(rf"^Total operations:\s*(\d+)\s*\(\s*({NUM}) per second\)")
MIB = re.compile(rf"^({NUM}) MiB transferred \(({NUM}) MiB/sec\)")


def test_in(argv: tuple[str, ...]) -> str | None:
    """The test a sysbench command line runs: `--test=NAME`, or its first word that is not an option."""
    if not argv or not argv[0].rsplit("/", 1)[-1].startswith("sysbench"):
        return None
    for word in argv[1:]:
        if word.startswith("--test="):
            return word.split("=", 1)[1]
    return next((w for w in argv[1:] if not w.startswith("-")), None)


@register
class Sysbench(Parser):
    name = "sysbench"
    summary = "sysbench cpu (events per second, latency) and memory (MiB/sec, operations per second)"
    arg = "TEST: cpu or memory (default: the test in the command)"

    def __init__(self, arg=None, job=None):
        super().__init__(arg, job)
        test = arg or test_in(self.job.argv)
        if test is None:
            raise UsageError("parser sysbench cannot tell the test from the command; name it: sysbench:cpu or "
                             "sysbench:memory")
        if test not in TESTS:
            raise UsageError(f"parser sysbench reads the tests {', '.join(TESTS)}, not {test!r}")
        self.test = test
        self.info["test"] = test
        if test == "cpu":
            self.metrics = (
                Metric("events_per_sec", "higher", "events/s", read_from="sysbench's 'events per second:' line",
                       kind="rate"),
                Metric("latency_avg_ms", "lower", "ms", read_from="sysbench's 'Latency (ms)' avg line",
                       kind="time"),
                Metric("latency_p95_ms", "lower", "ms", required=False,
                       read_from="sysbench's 'Latency (ms)' 95th percentile line", kind="time"),
            )
            self.headline = "events_per_sec"
        else:
            self.metrics = (
                Metric("mib_per_sec", "higher", "MiB/s", read_from="sysbench's 'MiB transferred (X MiB/sec)' line",
                       kind="rate"),
                Metric("ops_per_sec", "higher", "ops/s", read_from="sysbench's 'Total operations: N (X per second)'",
                       kind="rate"),
            )
            self.headline = "mib_per_sec"
        self._in_latency = False

    def feed(self, line: Line) -> list[Reading]:
        text = line.text
        what = f"sysbench ({line.source})"
        for key, regex in INFO:
            if (m := regex.match(text)) is not None:
                value = m.group(1)
                self.info[key] = (value if key in ("version", "block_size")
                                  else int(value) if key in ("threads", "total_events") else number(value, what))
                return []
        if text.startswith("Latency (ms):"):
            self._in_latency = True
            return []
        if self.test == "cpu":
            if (m := CPU_RATE.match(text)) is not None:
                return [self.reading("events_per_sec", number(m.group(1), what), line)]
            if self._in_latency and (m := LATENCY.match(text)) is not None:
                name = "latency_avg_ms" if m.group(1) == "avg" else "latency_p95_ms"
                return [self.reading(name, number(m.group(2), what), line)]
            return []
        if (m := OPS.match(text)) is not None:
            self.info["total_operations"] = int(m.group(1))
            return [self.reading("ops_per_sec", number(m.group(2), what), line)]
        if (m := MIB.match(text)) is not None:
            self.info["mib_transferred"] = number(m.group(1), what)
            return [self.reading("mib_per_sec", number(m.group(2), what), line)]
        return []
