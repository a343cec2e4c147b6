"""The analysis behind every report, on synthetic trial records (no processes): verdict rows per
metric, derived tables (speed-up, scaling efficiency, per trial), fingerprint flags."""

import numpy as np
import pytest

from gpuvs.analysis import comparison
from gpuvs.store.records import ArmMeta, ExperimentMeta, ExperimentRecord, MetricValue, TrialRecord
from gpuvs.report import markdown, tables
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.records import SeriesSummary


def record(arm, trial, value, *, device="cpu", num_gpus=1, unit="images/sec", fp=None, status="ok", attempt=0,
           metrics=None, env=None):
    ok = status == "ok"
    return TrialRecord(None, "exp-1", f"{arm}-{trial}-{attempt}", arm, trial, attempt=attempt, workload="cnn-train",
                       status=status, error=None if ok else "boom",
                       spec=RunSpec("cnn-train", device=device, num_gpus=num_gpus, env=env or EnvSpec()),
                       summary={"main": SeriesSummary(1, unit, value=value)} if ok else {},
                       metrics={k: MetricValue(v, u) for k, (v, u) in (metrics or {}).items()},
                       startup={"first_step_s": 1.0}, fingerprint=fp or {"driver": "580", "torch": "2.11"})


def header(arms, name="study", margin=0.02, workload="cnn-train"):
    return ExperimentRecord("exp-1", name, "compare", 0.0, ExperimentMeta(
        margin=margin, confidence=0.95, workload=workload, arms=[ArmMeta(a, o) for a, o in arms]))


def test_gpu_vs_cpu_speedup_and_per_trial_table():
    recs = [record("cpu", t, v) for t, v in enumerate([20.0, 21.0, 19.0])]
    recs += [record("gpu", t, v, device="cuda") for t, v in enumerate([1000.0, 1010.0, 990.0])]
    a = comparison.analyse(header([("cpu", {"device": "cpu"}), ("gpu", {"device": "cuda"})]), recs)
    (row,) = a.speedup
    assert row.speedup == pytest.approx(50.0) and row.cpu_arm == "cpu" and row.gpu_arm == "gpu"
    assert row.ci_low < 50.0 < row.ci_high
    (v,) = a.verdicts
    # interleaved rounds: the ratio is the geometric mean of the per-round ratios (the paired analysis)
    per_round = np.array([1000.0, 1010.0, 990.0]) / np.array([20.0, 21.0, 19.0])
    assert v.method == "paired" and v.n_pairs == 3
    assert v.verdict == "faster" and v.ratio == pytest.approx(np.exp(np.log(per_round).mean()))
    assert v.baseline == "cpu"
    t = tables.per_trial_table(a)
    assert t.columns == ["test case", "cpu images/sec", "gpu images/sec"]
    assert t.rows[0] == ["study #1", "20.0", "1,000.0"] and len(t.rows) == 3
    assert tables.speedup_table(a).rows[0][5] == "50.00×"
    assert a.flags == []


def test_speedup_for_times_is_cpu_time_over_gpu_time():
    # the kernels workload declares its series (kernel ms) lower-is-better
    recs = [record("cpu", t, v, unit="ms") for t, v in enumerate([400.0, 410.0])]
    recs += [record("gpu", t, v, device="cuda:0", unit="ms") for t, v in enumerate([10.0, 10.2])]
    a = comparison.analyse(header([("cpu", {}), ("gpu", {})], workload="kernels"), recs)
    assert a.speedup[0].speedup == pytest.approx(405.0 / 10.1)
    assert a.verdicts[0].verdict == "faster"  # fewer ms is faster


def test_scaling_efficiency_against_the_fewest_gpus():
    recs = []
    for n, values in ((1, [1000.0, 1002.0, 998.0]), (2, [1900.0, 1904.0, 1896.0]), (4, [3600.0, 3610.0, 3590.0])):
        recs += [record(f"{n}gpu", t, v, device="cuda", num_gpus=n) for t, v in enumerate(values)]
    a = comparison.analyse(header([("1gpu", {"num_gpus": 1}), ("2gpu", {"num_gpus": 2}), ("4gpu", {"num_gpus": 4})]),
                           recs)
    eff = {r.arm: r for r in a.scaling}
    assert eff["1gpu"].efficiency == pytest.approx(1.0)
    assert eff["2gpu"].efficiency == pytest.approx(1900.0 / 2000.0)
    assert eff["4gpu"].efficiency == pytest.approx(3600.0 / 4000.0) and eff["4gpu"].speedup == pytest.approx(3.6)
    assert eff["4gpu"].eff_low < 0.9 < eff["4gpu"].eff_high
    assert tables.scaling_table(a).rows[2][5] == "90.0%"
    assert [v.arm for v in a.verdicts] == ["2gpu", "4gpu"]


def test_every_series_and_metric_gets_a_row_the_headline_first_the_others_behind_its_gate():
    m = lambda v: {"latency_p99_ms": (v, "ms")}  # noqa: E731
    recs = [record("a", t, 100.0 + t + 0.01 * t * t, metrics=m(10.0 + t / 10)) for t in range(3)]
    recs += [record("b", t, 100.0 + t, metrics=m(12.0 + t / 10)) for t in range(3)]
    a = comparison.analyse(header([("a", {}), ("b", {"x": 1})]), recs)
    assert [m.name for m in a.metrics] == ["main", "latency_p99_ms"] and a.headline.name == "main"
    by = {v.metric: v for v in a.verdicts}
    # the headline is equivalent: no difference established, so the other metrics are only shown
    assert by["main"].verdict == "equivalent" and by["latency_p99_ms"].verdict == "descriptive"
    assert "descriptive" in tables.verdict_table(a).rows[1][7]
    assert a.settled()
    # the headline differs: latency is tested (Holm) and, declared a time by cnn-infer/cnn-train, is 'slower'
    recs = [record("a", t, 100.0 + t, metrics=m(10.0 + t / 10)) for t in range(3)]
    recs += [record("b", t, 90.0 + t, metrics=m(12.0 + t / 10)) for t in range(3)]
    by = {v.metric: v for v in comparison.analyse(header([("a", {}), ("b", {"x": 1})]), recs).verdicts}
    assert by["main"].verdict == "slower" and by["latency_p99_ms"].verdict == "slower"
    assert by["latency_p99_ms"].family.startswith("other metrics: Holm")


def test_fingerprint_differences_nobody_asked_for_are_flagged():
    fp_a = {"driver": "580", "torch": "2.11", "gpu_name": "H100"}
    fp_b = {"driver": "575", "torch": "2.9", "gpu_name": "H100"}
    recs = [record("host", t, 100.0, fp=fp_a) for t in range(2)] + [record("ctr", t, 100.0, fp=fp_b) for t in range(2)]
    # the arms vary the container image: a torch difference is expected, a driver difference is not
    a = comparison.analyse(header([("host", {}), ("ctr", {"env": "container", "image": "x"})]), recs)
    assert len(a.flags) == 1 and "driver (580 vs 575)" in a.flags[0] and "torch" not in a.flags[0]
    rows = {label: (values, differs) for label, values, differs in comparison.fingerprint_rows(a.arms)}
    assert rows["NVIDIA driver"] == (["580", "575"], True) and rows["GPU"] == (["H100", "H100"], False)
    # the same difference when only a parameter varies: both flagged
    a = comparison.analyse(header([("host", {}), ("ctr", {"batch_size": 64})]), recs)
    assert "driver" in a.flags[0] and "torch" in a.flags[0]
    # trials of one arm that ran on different machines
    recs = [record("a", 0, 100.0, fp=fp_a), record("a", 1, 100.0, fp=fp_b), record("b", 0, 100.0, fp=fp_a),
            record("b", 1, 100.0, fp=fp_a)]
    a = comparison.analyse(header([("a", {}), ("b", {"x": 1})]), recs)
    assert any(f.startswith("arm a: its trials ran with different") for f in a.flags)


def test_arms_that_vary_the_device_are_not_flagged_for_the_gpu_it_brings():
    """A GPU pod against a CPU pod: the CPU pod has no GPU, so GPU name, driver and GPU count differ because
    the device was varied; a difference in anything else (torch) is still flagged."""
    gpu = {"driver": "580", "torch": "2.11", "gpu_name": "H100", "gpu_count": 1, "cpu_model": "Xeon"}
    cpu = {"driver": None, "torch": "2.11", "gpu_name": None, "gpu_count": 0, "cpu_model": "Xeon"}
    pod = EnvSpec("pod", {"image": "x"})
    recs = [record("gpu", t, 1000.0, device="cuda", fp=gpu, env=pod) for t in range(2)]
    recs += [record("cpu", t, 20.0, fp=cpu, env=pod) for t in range(2)]
    for overrides in ({"device": "cuda"}, {}):  # from --arm device=... or two stored experiments: no overrides
        a = comparison.analyse(header([("gpu", overrides), ("cpu", {"device": "cpu"} if overrides else {})]), recs)
        assert a.flags == [], a.flags
    a = comparison.analyse(header([("gpu", {}), ("cpu", {"device": "cpu"})]),
                           recs[:2] + [record("cpu", t, 20.0, fp={**cpu, "torch": "2.9"}, env=pod) for t in range(2)])
    assert a.flags == ["arm cpu differs from arm gpu in torch (2.11 vs 2.9), which this comparison did not vary"]
    # the same GPU difference where the device did not vary is flagged, as before
    same = [record("a", t, 100.0, device="cuda", fp=gpu, env=pod) for t in range(2)]
    same += [record("b", t, 100.0, device="cuda", fp=cpu, env=pod) for t in range(2)]
    a = comparison.analyse(header([("a", {}), ("b", {"batch_size": 64})]), same)
    assert len(a.flags) == 1 and all(f in a.flags[0] for f in ("gpu_name", "driver", "gpu_count"))


def test_retries_count_once_and_failures_are_listed():
    recs = [record("a", 0, 100.0), record("a", 1, 0.0, status="failed"), record("a", 1, 101.0, attempt=1),
            record("b", 0, 100.0), record("b", 1, 0.0, status="failed")]
    a = comparison.analyse(header([("a", {}), ("b", {"x": 1})]), recs)
    arm_a, arm_b = a.arms
    assert (arm_a.n_ok, arm_a.n_total, arm_b.n_ok, arm_b.n_total) == (2, 2, 1, 2)
    assert a.failures == [comparison.Failure("b", 1, "failed", "boom")]
    assert [t.value for t in a.trials if t.arm == "a"] == [100.0, 101.0]  # the retry's figure, once
    assert a.verdicts[0].verdict == "inconclusive"
    assert tables.per_trial_table(a).rows[1] == ["study #2", "101.0", "failed"]


def test_markdown_escapes_what_users_name():
    recs = [record("a|b", t, 100.0 + t) for t in range(2)] + [record("<script>alert(1)</script>", t, 110.0 + t)
                                                             for t in range(2)]
    a = comparison.analyse(header([("a|b", {}), ("<script>alert(1)</script>", {"x": 1})], name="x | <b>y</b>"), recs)
    md = markdown.render(a)
    assert "<script>" not in md and "<b>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "| a\\|b |" in md
    for line in md.splitlines():
        if line.startswith("| ") and "---" not in line:
            assert line.count(" | ") - line.count("\\| ") >= 1
