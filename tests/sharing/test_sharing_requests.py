"""The sharing commands' requests (gpuvs.sharing.share_run): built from plain mappings and checked in the CLI's order.

They are refused in the command line's own line; run_share as a library call prints nothing."""

import pytest

from gpuvs import workloads
from gpuvs.cli.common import job_spec
from gpuvs.errors import RunFailed, UsageError
from gpuvs.sharing.share_run import (SHARE_PARAMS, AdviseRequest, MatrixRequest, ShareRequest, SharingHooks,
                               run_share)
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store
from gpuvs.store.records import LookSchedule


def base(workload="selftest", device="cpu", **params):
    w = workloads.get(workload)
    return RunSpec(workload=w.name, params=w.validate(params, device), device=device)


def refusal(build) -> str:
    with pytest.raises(UsageError) as info:
        build()
    line = str(info.value)
    assert "\n" not in line
    return line


# -- share ----------------------------------------------------------------------------------------

def test_share_request_takes_the_defaults_and_coerces_plain_values():
    r = ShareRequest.from_values(base(), {}, parse_job=job_spec)
    assert r.options == {p.name: p.default for p in SHARE_PARAMS} and list(r.options) == [p.name for p in SHARE_PARAMS]
    assert r.counts == [1, 2] and r.other is None and [a.label for a in r.arms] == ["time-sliced"]
    assert r.name is None and r.timeout_s == 3600.0
    # values as a file or a request body gives them: words and numbers as text
    r = ShareRequest.from_values(base(), {"workers": "1,4", "repeats": "2", "capacity": "no", "margin": "0.1",
                                          "duration": 5}, parse_job=job_spec, name="n", timeout_s=60)
    assert (r.counts, r.options["repeats"], r.options["capacity"], r.options["margin"]) == ([1, 4], 2, False, 0.1)
    assert r.options["duration"] == 5.0 and (r.name, r.timeout_s) == ("n", 60)


def test_share_request_pairs_with_a_job_given_as_text():
    r = ShareRequest.from_values(base(), {"with": "selftest --step-seconds 0.02"}, parse_job=job_spec)
    assert r.other.workload == "selftest" and r.other.params["step_seconds"] == 0.02 and r.other.device == "cpu"
    assert r.options["with"] == "selftest --step-seconds 0.02"  # stored as given


@pytest.mark.parametrize("values, line", [
    ({"workers": "0"}, "--workers wants counts from 1 to 512 separated by commas, e.g. 1,2,4; got '0'"),
    ({"workers": "a,b"}, "--workers wants counts from 1 to 512 separated by commas, e.g. 1,2,4; got 'a,b'"),
    ({"mps": "on"}, "--mps applies to GPU runs (--device cuda)"),
    ({"mps": "sometimes"}, "--mps: 'sometimes' is not allowed; expected one of off, on, both"),
    ({"repeats": 0}, "--repeats: 0 is not allowed; expected an integer from 1 to 1000"),
    ({"duration": "soon"}, "--duration: 'soon' is not allowed; expected a number from 0.5 to 86400"),
    ({"also_host": True}, "--also-host goes with --capacity and --env container (it adds the same sweep on the host)"),
    ({"also_host": True, "capacity": True},
     "--also-host goes with --capacity and --env container (it adds the same sweep on the host)"),
    ({"with": "selftest --bogus 1"}, "unknown option --bogus for --with selftest; --with selftest --help lists its "
     "options"),
    ({"mps_threads": "50"}, "--mps-threads and --mps-mem-limit are MPS settings: they need a GPU"),
    ({"wokers": "2"}, "unknown option --wokers for gpuvs share (did you mean '--workers'?)"),
    ({"colour": "red"}, "unknown option --colour for gpuvs share"),
    # the command line's order: the counts are refused before the job paired with, that before --mps
    ({"workers": "0", "with": "nosuch", "mps": "on"}, "--workers wants counts from 1 to 512"),
    ({"with": "selftest --bogus 1", "mps": "on"}, "unknown option --bogus for --with selftest"),
])
def test_share_request_refuses_in_one_line(values, line):
    assert refusal(lambda: ShareRequest.from_values(base(), values, parse_job=job_spec)).startswith(line)


def test_share_request_refuses_a_job_that_cannot_share_a_window():
    unshared = next(w.name for w in workloads.all_workloads() if not w.windowed)
    line = refusal(lambda: ShareRequest.from_values(RunSpec(workload=unshared, device="cpu"), {}, parse_job=job_spec))
    assert line.startswith(f"{unshared} cannot share a measured window yet; workloads that can: ")
    line = refusal(lambda: ShareRequest.from_values(base(), {"with": unshared}, parse_job=job_spec))
    assert line.startswith(f"{unshared} cannot share a measured window yet")


def test_run_share_is_a_library_call_that_prints_nothing(tmp_path, capfd):
    request = ShareRequest.from_values(base(step_seconds=0.02), {"workers": "1", "duration": 0.5, "repeats": 1},
                                       parse_job=job_spec, name="lib", timeout_s=120)
    heard: list = []
    result = run_share(request, tmp_path / "s.db", SharingHooks(
        on_start=lambda exp_id: heard.append(("start", exp_id)), heading=lambda t: heard.append(("heading", t)),
        on_trial_end=lambda r: heard.append(("trial", r.spec.arm, r.ok))))
    assert capfd.readouterr() == ("", "")
    assert heard == [("start", result.experiment_id), ("heading", "1 worker"), ("trial", "1 worker", True)]
    assert result.scaling is not None and result.pairs is None and result.capacity is None
    assert result.base.experiment_id == result.experiment_id and request.base.experiment_id == ""  # a copy ran
    result.raise_if_failed()
    with Store(tmp_path / "s.db") as st:
        exp = st.experiment(result.experiment_id)
        assert (exp.name, exp.kind, exp.meta.share) == ("lib", "share", request.options)
        assert [t.arm for t in st.trials(exp.id)] == ["1 worker"]
    failing = ShareRequest.from_values(base(fail_at_start=True), {"workers": "1", "duration": 0.5, "repeats": 1},
                                       parse_job=job_spec, timeout_s=120)
    result = run_share(failing, tmp_path / "s.db")  # a failed worker is in the result, raised only when asked
    with pytest.raises(RunFailed, match="1 of 1 group"):
        result.raise_if_failed()


# -- advise-mps -----------------------------------------------------------------------------------

def test_advise_request_from_two_jobs():
    asked: list = []
    r = AdviseRequest.from_values({"duration": "2"}, jobs=["selftest", "selftest --step-seconds 0.02"],
                                  parse_job=job_spec, device_default=lambda env: asked.append(env) or "cpu")
    assert r.texts == [("selftest", "selftest --step-seconds 0.02")] and list(r.specs) == list(r.texts[0])
    assert r.device == "cpu" and asked == [EnvSpec()] and r.specs["selftest"].env == EnvSpec()
    assert r.max_window_s == 8.0 and r.options["duration"] == 2.0  # 4 x --duration
    assert r.plan == LookSchedule(first=3, cap=8, step=1)  # --repeats 3, --max-repeats 8
    r = AdviseRequest.from_values({"repeats": 2, "max_repeats": 2, "duration": 1, "max_duration": 3},
                                  jobs=["selftest"] * 2, parse_job=job_spec, device="cpu", env={"env": "host"},
                                  timeout_s=10)
    assert r.plan is None and r.max_window_s == 3.0 and list(r.specs) == ["selftest"]
    assert r.specs["selftest"].timeout_s == 10


def test_advise_request_from_a_pairs_file(tmp_path):
    f = tmp_path / "pairs.yaml"
    f.write_text('pairs:\n  - ["selftest", "selftest --step-seconds 0.03"]\n  - ["selftest", "selftest --noise"]\n')
    r = AdviseRequest.from_values({"pairs": str(f)}, parse_job=job_spec, device="cpu")
    assert r.texts == [("selftest", "selftest --step-seconds 0.03"), ("selftest", "selftest --noise")]
    assert list(r.specs) == ["selftest", "selftest --step-seconds 0.03", "selftest --noise"]  # each job once


@pytest.mark.parametrize("values, jobs, line, chosen", [
    ({}, ["selftest"], 'advise-mps wants two quoted jobs, e.g. gpuvs advise-mps "kernels --app srad" '
     '"kernels --app hotspot", or --pairs FILE', False),
    ({"pairs": "x.yaml"}, ["selftest", "selftest"], "advise-mps takes either two quoted jobs or --pairs FILE, not both",
     False),
    ({"pairs": "/nonexistent.yaml"}, [], "/nonexistent.yaml: no such file", False),
    ({"max_repeats": 0}, ["selftest", "selftest"], "--max-repeats: 0 is not allowed; expected an integer from 1 to "
     "1000", False),
    ({"predict_only": "perhaps"}, ["selftest", "selftest"], "--predict-only: 'perhaps' is not allowed; expected true "
     "or false", False),
    ({"max_durations": 3}, ["selftest", "selftest"], "unknown option --max-durations for gpuvs advise-mps (did you "
     "mean '--max-duration'?)", False),
    ({}, ["selftest", "nosuch --x 1"], "unknown workload 'nosuch'", True),
    ({"duration": 2, "max_duration": 1}, ["selftest", "selftest"],
     "--max-duration 1 is shorter than --duration 2: the longest calibrated window must be at least the shortest",
     True),
])
def test_advise_request_refuses_in_one_line(values, jobs, line, chosen):
    asked: list = []
    got = refusal(lambda: AdviseRequest.from_values(values, jobs=jobs, parse_job=job_spec,
                                                    device_default=lambda env: asked.append(env) or "cpu"))
    assert got.startswith(line)
    # the options and the jobs asked for are refused before the device is chosen, as the command line's CPU note
    # comes after them; the jobs themselves are read for that device
    assert asked == ([EnvSpec()] if chosen else [])


def test_advise_pairs_file_takes_no_sweep(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text('pairs: [["selftest", "selftest"]]\nsweep: {step_seconds: [0.01]}\n')
    line = refusal(lambda: AdviseRequest.from_values({"pairs": str(f)}, parse_job=job_spec, device="cpu"))
    assert line == f"{f}: advise-mps --pairs reads only 'pairs' (no 'sweep')"


# -- share-matrix ---------------------------------------------------------------------------------

def test_matrix_request_from_a_pairs_file(tmp_path):
    f = tmp_path / "tiny.yaml"
    f.write_text('duration: 0.5\npairs:\n  - ["selftest", "selftest --noise"]\nsweep:\n  step_seconds: [0.01, 0.03]\n')
    r = MatrixRequest.from_values(str(f), {"device": "cpu"}, parse_job=job_spec)
    assert (r.device, r.window_s, r.key, r.modes, r.title) == ("cpu", 0.5, "step_seconds", [False], "tiny")
    assert [(c.a_text, c.b_text, c.value) for c in r.cases] == [("selftest", "selftest --noise", 0.01),
                                                              ("selftest", "selftest --noise", 0.03)]
    assert r.cases[1].b.params["step_seconds"] == 0.03 and r.cases[1].b.params["noise"] is True
    r = MatrixRequest.from_values(str(f), {"duration": "2"}, parse_job=job_spec, device_default=lambda env: "cpu")
    assert r.window_s == 2.0 and r.data["duration"] == 0.5  # the file is stored as it was read
    f.write_text('name: named\npairs: [["selftest", "selftest"]]\n')
    r = MatrixRequest.from_values(str(f), parse_job=job_spec, device_default=lambda env: "cpu")
    assert (r.key, [c.value for c in r.cases], r.window_s, r.title) == ("", [None], 8.0, "named")
    f.write_text('duration:\ntimeout_s: null\npairs: [["selftest", "selftest"]]\n')  # empty: the defaults
    r = MatrixRequest.from_values(str(f), parse_job=job_spec, device_default=lambda env: "cpu")
    assert (r.window_s, r.cases[0].a.timeout_s) == (8.0, 1800.0)


@pytest.mark.parametrize("text, values, line", [
    ('pairs: [["selftest", "selftest"]]\n', {"durations": 1}, "unknown option --durations for gpuvs share-matrix "
     "(did you mean '--duration'?)"),
    ('pairs: [["selftest", "selftest"]]\n', {"duration": "long"}, "--duration: 'long' is not allowed; expected a "
     "number"),
    ("pairs: []\n", {}, "{f}:1: 'pairs' must be a list of [JOB_A, JOB_B] pairs of quoted jobs"),
    ('pairs: [["selftest", "selftest --bogus 1"]]\n', {}, "unknown option --bogus for --with selftest"),
])
def test_matrix_request_refuses_in_one_line(tmp_path, text, values, line):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    got = refusal(lambda: MatrixRequest.from_values(str(f), {"device": "cpu", **values}, parse_job=job_spec))
    assert got.startswith(line.format(f=f))


def test_matrix_request_refuses_a_missing_file():
    assert refusal(lambda: MatrixRequest.from_values("/nonexistent.yaml", parse_job=job_spec)) == \
        "/nonexistent.yaml: no such file"
