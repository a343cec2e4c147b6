"""The stress-ng parser on real stress-ng runs (Debian package stress-ng; .ci/apt/command.txt)."""

from __future__ import annotations

import pytest

from conftest import require
from gpuvs.workloads.command import outputs
from job_output import run_and_read


@pytest.fixture
def stress_ng():
    return require("stress-ng", "the stress-ng parser's test runs stress-ng (Debian package stress-ng)")


def test_real_stress_ng_metrics_brief(stress_ng):
    argv = (stress_ng, "--cpu", "1", "--timeout", "2s", "--metrics-brief")
    reader = outputs.make_reader(["stress-ng"], job=outputs.Job(argv))
    run = run_and_read(reader, argv)
    assert run.returncode == 0, run.lines
    assert reader.failure() is None and reader.headline == "bogo_ops_per_sec"
    info = reader.info["stress-ng"]
    rate, rate_cpu = run.one("bogo_ops_per_sec"), run.one("bogo_ops_per_sec_cpu")
    assert info["stressor"] == "cpu" and rate.source.startswith("stderr line ") and rate.text.split()[3] == "cpu"
    # the rates are the bogo ops it printed over the times it printed (those rounded to 0.01 s), and the stressor
    # ran for the timeout asked
    assert info["real_time_s"] == pytest.approx(2.0, abs=0.5)
    assert rate.value == pytest.approx(info["bogo_ops"] / info["real_time_s"], rel=0.005 / info["real_time_s"] + 1e-3)
    cpu_s = info["usr_time_s"] + info["sys_time_s"]
    assert rate_cpu.value == pytest.approx(info["bogo_ops"] / cpu_s, rel=0.01 / cpu_s + 1e-3)


def test_several_stressors_need_one_named(stress_ng):
    argv = (stress_ng, "--cpu", "1", "--vm", "1", "--vm-bytes", "16M", "--timeout", "1s", "--metrics-brief")
    unnamed = outputs.make_reader(["stress-ng"])
    run = run_and_read(unnamed, argv)
    assert run.returncode == 0 and run.readings == []
    assert unnamed.failure() == "stress-ng ran 2 stressors (cpu, vm): name the one to compare, e.g. stress-ng:cpu"
    named = outputs.make_reader(["stress-ng:vm"])
    run = run_and_read(named, argv)
    rows = named.info["stress-ng"]["rows"]
    assert named.failure() is None and sorted(rows) == ["cpu", "vm"]
    assert run.one("bogo_ops_per_sec").value == rows["vm"]["bogo_ops_per_sec"] != rows["cpu"]["bogo_ops_per_sec"]
    assert run.one("bogo_ops_per_sec").text.split()[3] == "vm"


def test_a_stressor_that_did_not_run_is_named_missing(stress_ng):
    argv = (stress_ng, "--cpu", "1", "--timeout", "1s", "--metrics-brief")
    reader = outputs.make_reader(["stress-ng:vm"])
    run_and_read(reader, argv)
    failure = reader.failure()
    assert failure.startswith("metric bogo_ops_per_sec (bogo ops/s (real time) in the 'vm' row of stress-ng's "
                              "--metrics-brief table) never appeared; metric bogo_ops_per_sec_cpu (bogo ops/s "
                              "(usr+sys time) in the 'vm' row of stress-ng's --metrics-brief table) never appeared; "
                              "last lines: ")
    assert failure.endswith("successful run completed in " + failure.rsplit(" ", 1)[1]) and "\n" not in failure
