"""The Rodinia-style apps on the CPU for real: every app agrees with its NumPy reference.

A wrong result is caught for every output, and the suite runs and tabulates through the CLI."""

import json
import sqlite3

import numpy as np
import pytest

from gpuvs.analysis import timeshare
from gpuvs.store.records import SeriesSummary

from conftest import pid_alive
from threads import one_thread  # noqa: F401  (a fixture)
from gpuvs.errors import UsageError, WorkloadError
from gpuvs.workloads.kernels import APPS, ORDER, Kernels, app_names, execute

torch = pytest.importorskip("torch", reason="the kernels workload needs torch (installed by .ci/run)")


@pytest.fixture(scope="module")
def tiny_runs():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = {}
    for name in ORDER:
        app = APPS[name]
        size = app.sizes["tiny"]
        host = app.inputs(size, np.random.default_rng(3))
        runs[name] = (host, execute(torch, app, host, size, "cpu"), app.reference(host, size))
    torch.set_num_threads(before)
    return runs


def test_at_least_six_apps_and_app_names():
    assert len(APPS) >= 6 and set(ORDER) == set(APPS)
    assert app_names("all") == list(ORDER)
    assert app_names(["NW,hotspot3d", "nw"]) == ["hotspot3D", "nw"]  # suite order, any case, no duplicates
    with pytest.raises(UsageError, match="--app 'linpack' is not allowed; expected all or one of hotspot, "):
        app_names("nw,linpack")
    side, layers = APPS["hotspot3D"].sizes["full"], APPS["hotspot3D"].layers
    assert 95e6 < 3 * 4 * side * side * layers < 105e6  # temp in, temp out, power: about 98 MB by default


@pytest.mark.parametrize("name", ORDER)
def test_every_app_agrees_with_its_numpy_reference(tiny_runs, name):
    host, run, ref = tiny_runs[name]
    result = APPS[name].compare(run.outputs, ref)
    assert result.ok, result.detail
    assert run.wall_s >= run.kernel_s > 0 and run.footprint_bytes is None  # no device memory on a CPU
    assert run.data_bytes == sum(v.nbytes for v in host.values()) + sum(v.nbytes for v in run.outputs.values())


@pytest.mark.parametrize("name", ORDER)
def test_a_wrong_result_is_caught_for_every_output(tiny_runs, name):
    _, run, ref = tiny_runs[name]
    app = APPS[name]
    for key in ref:
        bad = {k: np.array(v, copy=True) for k, v in run.outputs.items()}
        flat = bad[key].reshape(-1)
        i = flat.size // 2
        flat[i] = flat[i] + 1 + abs(flat[i]) * 0.05 if flat.dtype.kind == "f" else (flat[i] + 1) % max(
            2, int(flat.max()) + 2)
        result = app.compare(bad, ref)
        assert not result.ok, f"{name}.{key}: {result.detail}"
    with pytest.raises(WorkloadError, match=f"{name} .*disagrees with its NumPy reference"):
        host, run, _ = tiny_runs[name]
        bad_run = type(run)(run.wall_s, run.kernel_s, None, run.data_bytes,
                            {k: (v + 1 if v.dtype.kind != "b" else ~v) for k, v in run.outputs.items()})
        Kernels.verify(torch, np, app, app.sizes["tiny"], host, bad_run, "cpu", 3)


def test_a_check_larger_than_the_check_size_runs_a_smaller_instance(one_thread):
    app = APPS["hotspot3D"]
    size = app.check_size + 16
    message = Kernels.verify(torch, np, app, size, None, None, "cpu", 0)
    assert message.startswith(f"check: hotspot3D size {app.check_size} agrees with NumPy")


def test_the_suite_runs_and_tabulates_through_the_cli(cli, tmp_path):
    r = cli("run", "kernels", "--app", "pathfinder,hotspot,nw", "--scale", "tiny", "--repeats", "2",
            OMP_NUM_THREADS="1")
    assert r.returncode == 0, r.stderr
    for name, size in (("hotspot", 32), ("pathfinder", 500), ("nw", 48)):
        assert f"check: {name} size {size} agrees with NumPy" in r.stdout
    assert "Per series" in r.stdout and "wall ms" in r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    every = db.execute("SELECT series, step, value, unit, extra FROM samples").fetchall()
    rows = [(s, v, u, ex) for s, _, v, u, ex in every if s != "all apps"]
    assert [row[0] for row in rows] == ["hotspot"] * 2 + ["pathfinder"] * 2 + ["nw"] * 2  # suite order
    for step in (1, 2):  # the headline: the suite's kernel time, every app's added, repeat by repeat
        (total,) = [v for s, st, v, *_ in every if s == "all apps" and st == step]
        assert total == pytest.approx(sum(v for s, st, v, *_ in every if s != "all apps" and st == step))
    assert all(row[2] == "ms" and json.loads(row[3])["wall_ms"] >= row[1] > 0 for row in rows)
    trial = db.execute("SELECT metrics, summary, startup FROM trials").fetchone()
    metrics, summary, startup = (json.loads(x) for x in trial)
    assert list(summary) == ["all apps", "hotspot", "pathfinder", "nw"]
    assert summary["all apps"]["unit"] == "ms" and summary["nw"]["higher_is_better"] is False
    wall = [json.loads(row[3])["wall_ms"] for row in rows if row[0] == "nw"]
    assert metrics["nw/wall_ms"]["value"] == pytest.approx(sum(wall) / 2)
    assert metrics["pathfinder/data_mb"]["value"] == pytest.approx((100 * 500 * 4 + 500 * 4) / 1e6)
    assert {"hotspot_first_run_s", "nw_first_run_s"} <= set(startup)
    # "where the time went" counts every app's timed runs (host clock) as measured; the first runs and checks
    # are start-up. Before, the suite's headline has no seconds of its own and the trial read as all start-up.
    timed = sum(json.loads(row[3])["wall_ms"] for row in rows) / 1e3
    assert startup["timed_s"] == pytest.approx(timed, rel=1e-9) and timed > 0
    parts = timeshare.trial_time(startup, {k: SeriesSummary(total_seconds=v.get("total_seconds")) for k, v in
                                           summary.items()})
    assert parts.measured_s == pytest.approx(timed, rel=1e-9) and parts.start_up_s > 0
    worker = json.loads(db.execute("SELECT fingerprint FROM trials").fetchone()[0])["pid"]
    assert not pid_alive(worker)  # the trial's worker is gone (others' tests may run workers of their own)
