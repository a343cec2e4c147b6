"""The library's calls without the command line, what gpuvs's commands and its agent call.

run_comparison runs a study to its verdict and returns the Analysis, telling each look through typed hooks.
It prints nothing; bad input to run_comparison and run_fleet is one UsageError before anything starts.
Real worker processes, a real SQLite store. run_fleet on the real test cluster: test_fleet_cluster.py."""

from __future__ import annotations

import pytest

from gpuvs import workloads
from gpuvs.analysis.comparison import Analysis
from gpuvs.errors import UsageError
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store
from gpuvs.store.records import ExperimentMeta
from gpuvs.trial import experiment
from gpuvs.trial.runner import Experiment
from gpuvs.trial.study import Hooks, run_comparison


def study(arms: list[tuple[str, dict]], trials: int = 1, **kw) -> experiment.Study:
    w = workloads.get("selftest")
    base = RunSpec(workload="selftest", params=w.validate({"steps": 4}, "cpu"), device="cpu")
    built = experiment.build_arms(w, base, [(name, o, f"arm {name}", {}) for name, o in arms])
    exp = Experiment(name="library", base=base, arms=built, trials=trials, seed=5, kind="compare",
                     meta=ExperimentMeta(margin=0.02, confidence=0.95))
    return experiment.Study(exp, margin=0.02, confidence=0.95, **kw)


def test_run_comparison_returns_the_analysis_and_each_look_of_the_stopping_rule(tmp_path, capfd):
    # 20x apart: settled at the first look or soon after however loaded the machine is
    s = study([("fast", {"step_seconds": "0.005"}), ("slow", {"step_seconds": "0.1"})], until_confident=True,
              max_trials=8)
    looks, ended, ran = [], [], []
    a = run_comparison(s, tmp_path / "g.db", Hooks(on_look=looks.append, on_trial_end=ended.append,
                                                   on_ran=ran.append), timeout_s=120)
    assert isinstance(a, Analysis) and a.id == s.experiment.id and a.kind == "compare"
    (v,) = a.headline_verdicts()
    assert (v.arm, v.baseline, v.verdict) == ("slow", "fast", "slower") and v.ratio < 0.2
    assert looks[0].per_arm == 2  # one trial asked for: the rule needs two per arm to look
    assert looks[-1].decision == "settled" and all(x.decision == "more" and x.add == 2 for x in looks[:-1])
    per_arm = looks[-1].per_arm
    assert len(ended) == len(ran[0].results) == 2 * per_arm and ran[0].planned == 2 and not ran[0].failed
    assert {arm.name: arm.n_ok for arm in a.arms} == {"fast": per_arm, "slow": per_arm}
    with Store(tmp_path / "g.db") as st:
        seq = st.experiment(a.id).meta.sequential
    assert (seq.first, seq.cap, seq.step) == (2, 8, 2)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the library prints nothing: the caller renders what the hooks tell


def test_run_comparison_keeps_a_failed_trial_in_the_analysis_and_stops_on_an_empty_arm(tmp_path):
    s = study([("ok", {}), ("broken", {"fail_at_step": "2"})], until_confident=True, max_trials=6)
    looks = []
    a = run_comparison(s, tmp_path / "g.db", Hooks(on_look=looks.append), timeout_s=120)
    assert [(x.decision, x.arm) for x in looks] == [("empty", "broken")]
    assert {arm.name: arm.n_ok for arm in a.arms} == {"ok": 2, "broken": 0}
    assert len(a.failures) == 2 and "selftest failed at step 2" in a.failures[0].error


def test_bad_input_is_a_usage_error_before_anything_starts(tmp_path):
    s = study([("a", {}), ("b", {"device": "cuda:99"})])
    with pytest.raises(UsageError, match="^arm b: "):
        run_comparison(s, tmp_path / "g.db")
    from gpuvs.fleet.execute.fleet_run import FleetOptions, run_fleet

    host = RunSpec(workload="spin", params={}, device="cpu")
    with pytest.raises(UsageError, match="--env host is not allowed"):
        run_fleet(host, tmp_path / "g.db", FleetOptions())
    pod = RunSpec(workload="spin", params={}, device="cpu", env=EnvSpec("pod", {"image": "x"}))
    with pytest.raises(UsageError, match="--trials 3: a fleet needs at least 4 trials per node"):
        run_fleet(pod, tmp_path / "g.db", FleetOptions(trials=3))
    with pytest.raises(UsageError, match="--dry-run applies with --label"):
        run_fleet(pod, tmp_path / "g.db", FleetOptions(dry_run=True))
    assert not (tmp_path / "g.db").exists()
