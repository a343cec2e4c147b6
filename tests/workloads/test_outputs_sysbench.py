"""The sysbench parser on real sysbench runs (Debian package sysbench; .ci/apt/command.txt): cpu and memory."""

from __future__ import annotations

import pytest

from conftest import require
from gpuvs.workloads.command import outputs
from gpuvs.errors import UsageError
from job_output import run_and_read


@pytest.fixture
def sysbench():
    return require("sysbench", "the sysbench parser's test runs sysbench (Debian package sysbench)")


@pytest.mark.quiet  # its figures read timing (tests/quiet.py)
def test_real_sysbench_cpu(sysbench):
    argv = (sysbench, "cpu", "--time=1", "--threads=1", "run")
    reader = outputs.make_reader(["sysbench"], job=outputs.Job(argv))  # the test found in argv
    run = run_and_read(reader, argv)
    assert run.returncode == 0, run.lines
    assert reader.failure() is None and reader.headline == "events_per_sec"
    info = reader.info["sysbench"]
    assert info["test"] == "cpu" and info["threads"] == 1 and info["version"].startswith("1.")
    rate = run.one("events_per_sec")
    assert rate.unit == "events/s" and rate.text.strip().startswith("events per second:")
    # events per second over the run's time is the count of events it printed (sysbench times the threads a hair
    # apart from the total), and the mean latency is the latency sum over the events
    assert rate.value * info["total_time_s"] == pytest.approx(info["total_events"], rel=0.01)
    assert run.one("latency_avg_ms").value == pytest.approx(info["latency_sum_ms"] / info["total_events"], abs=0.006)
    assert run.one("latency_p95_ms").value > 0


def test_real_sysbench_memory(sysbench):
    argv = (sysbench, "memory", "--time=1", "--threads=1", "--memory-block-size=4K", "run")
    reader = outputs.make_reader(["sysbench:memory"])  # the test named, not looked for
    run = run_and_read(reader, argv)
    assert run.returncode == 0, run.lines
    assert reader.failure() is None and reader.headline == "mib_per_sec"
    info = reader.info["sysbench"]
    assert info["block_size"] == "4KiB"
    ops, mib = run.one("ops_per_sec"), run.one("mib_per_sec")
    assert info["mib_transferred"] == pytest.approx(info["total_operations"] * 4 / 1024, abs=0.006)
    assert mib.value == pytest.approx(ops.value * 4 / 1024, rel=1e-4, abs=0.006)
    assert ops.value * info["total_time_s"] == pytest.approx(info["total_operations"], rel=0.01)
    assert info["total_events"] == info["total_operations"]


def test_the_test_must_be_known():
    with pytest.raises(UsageError, match=r"^parser sysbench reads the tests cpu, memory, not 'fileio'$"):
        outputs.create("sysbench", outputs.Job(("sysbench", "fileio", "run")))
    with pytest.raises(UsageError, match="cannot tell the test from the command; name it: sysbench:cpu"):
        outputs.create("sysbench", outputs.Job(("sh", "-c", "sysbench cpu run")))
    assert outputs.create("sysbench", outputs.Job(("/usr/bin/sysbench", "--test=memory", "run"))).test == "memory"
