"""The hyperfine parser on the file a real hyperfine wrote (Debian package hyperfine; .ci/apt/command.txt)."""

from __future__ import annotations

import statistics

import pytest

from conftest import require
from gpuvs.workloads.command import outputs
from gpuvs.errors import UsageError
from job_output import run_and_read

SLEEP_S = 0.02


@pytest.fixture
def hyperfine():
    return require("hyperfine", "the hyperfine parser's test runs hyperfine (Debian package hyperfine)")


def test_real_hyperfine_export(hyperfine, tmp_path):
    argv = (hyperfine, "-N", "--runs", "5", "--warmup", "1", "--export-json", "out.json", f"sleep {SLEEP_S}")
    reader = outputs.make_reader(["hyperfine"], job=outputs.Job(argv, str(tmp_path)))  # the file found in argv,
    run = run_and_read(reader, argv, cwd=tmp_path)                                        # relative to the workdir
    assert run.returncode == 0, run.lines
    assert reader.failure() is None and reader.headline == "mean_s"
    times = [r.value for r in run.named("time_s")]
    assert [r.step for r in run.named("time_s")] == [1, 2, 3, 4, 5] and reader.info["hyperfine"]["runs"] == 5
    # hyperfine's own figures agree with its own per-run times, and each run took at least the sleep
    assert run.one("mean_s").value == pytest.approx(statistics.mean(times), rel=1e-9)
    assert run.one("median_s").value == pytest.approx(statistics.median(times), rel=1e-9)
    assert run.one("min_s").value == min(times) and reader.info["hyperfine"]["max_s"] == max(times)
    assert run.one("mean_s").extra["stddev"] == pytest.approx(statistics.stdev(times), rel=1e-9)
    assert min(times) >= SLEEP_S
    assert run.one("mean_s").source == f"file {tmp_path / 'out.json'}" and run.one("mean_s").unit == "s"
    assert reader.info["hyperfine"]["command"] == f"sleep {SLEEP_S}"
    assert reader.info["hyperfine"]["exit_codes"] == [0] * 5


def test_the_file_named_in_the_parser_and_one_never_written(hyperfine, tmp_path):
    argv = (hyperfine, "-N", "--runs", "2", "--export-json", str(tmp_path / "a.json"), "true")
    named = outputs.make_reader([f"hyperfine:{tmp_path / 'a.json'}"], job=outputs.Job(("sh", "-c", " ".join(argv))))
    run = run_and_read(named, argv)
    assert run.returncode == 0 and named.failure() is None and len(run.named("time_s")) == 2
    elsewhere = outputs.make_reader(["hyperfine:b.json"], job=outputs.Job(argv, str(tmp_path)))
    run = run_and_read(elsewhere, argv)
    assert run.readings == []
    failure = elsewhere.failure()
    assert failure == f"hyperfine wrote no --export-json file at {tmp_path / 'b.json'}"


def test_several_commands_fail_rather_than_mix(hyperfine, tmp_path):
    argv = (hyperfine, "-N", "--runs", "2", "--export-json", "two.json", "true", "sleep 0")
    reader = outputs.make_reader(["hyperfine"], job=outputs.Job(argv, str(tmp_path)))
    run = run_and_read(reader, argv, cwd=tmp_path)
    assert run.returncode == 0 and run.readings == []
    assert "holds 2 results ('true', 'sleep 0')" in reader.failure()


def test_a_command_without_export_json_is_refused_before_it_starts():
    with pytest.raises(UsageError, match=r"add --export-json FILE to it, or name the file: hyperfine:FILE$"):
        outputs.make_reader(["hyperfine"], job=outputs.Job(("hyperfine", "true")))
    with pytest.raises(UsageError, match="nothing after ':'"):
        outputs.make_reader(["hyperfine:"], job=outputs.Job(("hyperfine", "true")))
    found = outputs.create("hyperfine", outputs.Job(("hyperfine", "--export-json=x.json", "true")))
    assert found.file == "x.json" and found.reads_files
