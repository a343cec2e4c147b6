"""The ready experiment files that reproduce the studies with their original tools (experiments/command-*.yaml).

Each loads as documented, and the way it reads figures is tested on the tool's output.
The tools need a GPU and are not installed here: the parser reads four real T4 logs instead.
DeepBench's row is formatted as gemm_bench.cu formats it (its std::setw widths)."""

import re
from pathlib import Path

import pytest

from conftest import ROOT
from gpuvs.trial import experiment
from gpuvs.workloads.command import job

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tf_cnn_benchmarks"


def load(name: str, **cli):
    return experiment.load(ROOT / "experiments" / f"{name}.yaml", {"image": "img:1", **cli},
                           device_default=lambda env: "cpu")


def read(study, text: str) -> dict[str, float]:
    """Every figure the file's settings read from `text`, the last printing of each (job.Session's rule)."""
    session = job.Session(job.Settings.from_params(study.experiment.base.params), 0.0)
    found: dict[str, float] = {}
    for line in text.splitlines(keepends=True):
        for event in session.line("stdout", line.encode(), 1.0):
            if event["type"] == "sample":
                found[event["series"]] = event["value"]
    done, failure = session.ended(0, 1.0)
    for event in done:
        if event["type"] == "sample":
            found[event["series"]] = event["value"]
    return found, failure


@pytest.mark.parametrize("log", sorted(FIXTURES.glob("*.log")), ids=lambda p: p.stem)
def test_tf_cnn_benchmarks_file_reads_the_real_logs(log):
    study = load("command-tf-cnn-benchmarks")
    exp = study.experiment
    assert exp.base.workload == "command" and exp.base.params["argv"][:2] == ["python3", "tf_cnn_benchmarks.py"]
    assert [a.name for a in exp.arms] == ["host", "container", "pod"]
    assert exp.base.params["workdir"] == "/opt/benchmarks/scripts/tf_cnn_benchmarks"
    text = log.read_text()
    figures, failure = read(study, text)
    total = float(re.search(r"total images/sec: ([0-9.]+)", text).group(1))
    assert failure is None and figures["total_images_per_sec"] == total
    last = re.findall(r"images/sec: ([0-9.]+) \+/-", text)[-1]
    assert figures["images_per_sec"] == float(last)


def test_rodinia_file_times_the_binary_host_against_a_bare_container():
    study = load("command-rodinia-host-vs-container")
    exp = study.experiment
    assert exp.base.params["argv"] == ["./lud_cuda", "-s", "8192"]
    assert {a.name: a.overrides for a in exp.arms} == {"host": {"env": "host"},
                                                       "container": {"env": "container", "bare": True}}
    settings = job.Settings.from_params(exp.base.params)
    assert settings.reader().headline == "wall_time_s"  # no parser: launch to exit, lower is faster
    figures, failure = read(study, "Matrix size 8192\nTime consumed(ms): 1234.5\n")
    assert failure is None and figures == {"wall_time_s": 1.0}


def test_gemm_file_reads_deepbench_rows_across_two_images():
    study = load("command-gemm-across-images")
    exp = study.experiment
    assert exp.base.env.kind == "container" and exp.base.params["bare"] is True
    assert {a.name: set(a.overrides) for a in exp.arms} == {"v1": {"image"}, "v2": {"image"}}

    def row(m, n, k, us):  # gemm_bench.cu: setw(7) m n k a_t b_t, setw(13) precision, setw(20) time
        return f"{m:>7}{n:>7}{k:>7}{0:>7}{0:>7}{'float':>13}{us:>20}\n"

    header = ("                Running training benchmark \n                         Times\n" + "-" * 88 + "\n"
              "    m       n      k      a_t     b_t      precision        time (usec) \n")
    text = header + row(5124, 9124, 1760, 4321) + row(7680, 48000, 2560, 37412) + row(7680, 64, 2560, 99)
    figures, failure = read(study, text)
    assert failure is None and figures["gemm_7680x48000x2560_us"] == 37412
    figures, failure = read(study, header + row(5124, 9124, 1760, 4321))
    assert failure is not None and "gemm_7680x48000x2560_us" in failure[1] and "never appeared" in failure[1]
