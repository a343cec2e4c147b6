"""The runner against real worker processes (the selftest workload needs no framework)."""

import contextlib
import os
import signal
import sys
import time
from collections import Counter

import pytest

from conftest import gpuvs_processes, pid_alive
from gpuvs.errors import UsageError
from gpuvs.trial.runner import Arm, Experiment, Runner, draw_seed, validate_spec
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store


def _spec(**params):
    return RunSpec(workload="selftest", device="cpu", params=params)


def test_order_is_balanced_interleaved_and_shuffled():
    exp = Experiment("x", _spec(), [Arm("A"), Arm("B"), Arm("C")], trials=6, seed=3)
    order = [s.arm for s in exp.order()]
    assert Counter(order) == {"A": 6, "B": 6, "C": 6}
    rounds = [order[i:i + 3] for i in range(0, 18, 3)]
    for first, second in zip(rounds[::2], rounds[1::2]):
        assert second == first[::-1]  # A B C | C B A
    firsts = {r[0] for r in rounds[::2]}
    seeds = {tuple(s.arm for s in Experiment("x", _spec(), [Arm("A"), Arm("B"), Arm("C")], 6, seed=k).order())
             for k in range(10)}
    assert len(seeds) > 1 and firsts  # different seeds give different orders


def test_a_missing_order_seed_is_drawn_once_and_kept(monkeypatch):
    """Every experiment kind draws its order seed through draw_seed (fleet, per-GPU and pair fleets included)."""
    drawn = iter([11, 22])
    monkeypatch.setattr("gpuvs.trial.runner.draw_seed", lambda: next(drawn))
    exp = Experiment("x", _spec(), [Arm("A"), Arm("B")], trials=4)
    first = [s.arm for s in exp.order()]
    assert exp.seed == 11 and exp.fix_seed() == 11
    assert [s.arm for s in exp.order()] == first == [s.arm for s in Experiment("x", _spec(), [Arm("A"), Arm("B")], 4,
                                                                                 seed=11).order()]
    assert Experiment("y", _spec(), [Arm("A")], seed=5).fix_seed() == 5  # a given seed is not redrawn
    monkeypatch.undo()
    seeds = {draw_seed() for _ in range(50)}
    assert all(isinstance(s, int) and 0 <= s < 2**31 for s in seeds) and len(seeds) > 40


def test_arm_overrides_reach_params_and_spec_fields():
    exp = Experiment("x", _spec(steps=2), [Arm("a", {"device": "cpu", "steps": 3, "num-gpus": 2})], trials=1)
    spec = exp.order()[0]
    assert spec.params == {"steps": 3} and spec.num_gpus == 2 and spec.arm == "a" and spec.experiment_id == exp.id


def test_trials_store_every_sample_and_summary(store_path):
    with Store(store_path) as st:
        seen = []
        res = Runner(st, on_event=lambda r, e: seen.append(e["type"])).run_experiment(
            Experiment("x", _spec(steps=4, noise=True), [Arm("a")], trials=2, seed=1))
        assert [r.status for r in res] == ["ok", "ok"]
        assert seen.count("sample") == 8  # stray JSON-looking prints on stdout were not taken as samples
        for r in res:
            assert r.summary["main"].n == 4 and r.fingerprint["pid"] != os.getpid()
            assert len(st.samples(r.id)) == 4 and st.trial(r.id).status == "ok"
            assert st.samples(r.id) == r.samples  # what the runner saw is what the store keeps
            assert st.trial(r.id).summary == r.summary
        assert res[0].fingerprint["pid"] != res[1].fingerprint["pid"]  # each trial its own process


def test_timeout_stops_the_worker_and_its_children(store_path):
    with Store(store_path) as st:
        res = Runner(st, timeout_s=4).run_trial(_spec(steps=1000, step_seconds=0.5, children=2))
        assert res.status == "failed" and res.error_kind == "timeout" and "timed out after 4 s" in res.error
        kids = [int(p) for line in res.logs if line.startswith("children") for p in line.split()[1:]]
        assert len(kids) == 2
        time.sleep(0.5)
        assert not any(pid_alive(p) for p in kids + [res.fingerprint["pid"]])
        assert st.trial(res.id).status == "failed"
        assert 1 <= len(st.samples(res.id)) < 1000  # what was measured before the timeout is kept


def test_a_killed_worker_is_a_failed_trial_and_the_next_trial_runs(store_path):
    def kill_on_second_sample(result, event):
        if event["type"] == "sample" and event["step"] == 2 and result.spec.trial == 0:
            os.kill(result.fingerprint["pid"], signal.SIGKILL)

    with Store(store_path) as st:
        res = Runner(st, on_event=kill_on_second_sample, timeout_s=60).run_experiment(
            Experiment("x", _spec(steps=20, step_seconds=0.1), [Arm("a")], trials=2, seed=0))
        assert [r.status for r in res] == ["failed", "ok"]
        assert "worker was killed by SIGKILL (the kernel's out-of-memory killer sends it" in res[0].error
        assert not pid_alive(res[0].fingerprint["pid"])
    assert gpuvs_processes() == []


def test_crash_and_abrupt_exit_are_reported_plainly(store_path):
    with Store(store_path) as st:
        r1 = Runner(st).run_trial(_spec(steps=5, fail_at_step=2))
        r2 = Runner(st).run_trial(_spec(steps=5, exit_at_step=3))
    assert r1.status == "failed" and r1.error == "selftest failed at step 2 as asked" and r1.exit_code == 1
    assert r2.status == "failed" and "exited with status 17" in r2.error and len(r2.samples) == 2


def test_a_worker_that_ends_with_status_0_but_no_results_is_a_failed_trial(store_path):
    # what an engine that loses the exit status looks like: the worker stops early, yet the status is 0
    with Store(store_path) as st:
        r = Runner(st).run_trial(_spec(steps=5, exit_at_step=3, exit_status=0))
        row = st.trials()[0]
    assert r.status == "failed" and r.exit_code == 0 and len(r.samples) == 2
    assert r.error.startswith("the worker ended (status 0) without reporting its results")
    assert row.status == "failed" and row.error == r.error


def test_retries_run_a_crashed_trial_again(store_path):
    with Store(store_path) as st:
        res = Runner(st, retries=2).run_with_retries(_spec(steps=3, exit_at_step=1))
        rows = st.trials()
    assert res.status == "failed" and [r.attempt for r in rows] == [0, 1, 2]


PROCESS_EVENTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec")
_WATCH: list[list] = []  # while a test watches: its list of the process starts Python's audit hooks saw


def _audit(event: str, args) -> None:
    if _WATCH and event in PROCESS_EVENTS:
        _WATCH[-1].append((event, args))


sys.addaudithook(_audit)  # hooks cannot be removed: this one records only while _WATCH holds a list


@contextlib.contextmanager
def process_starts():
    """Every process this interpreter starts in the block (subprocess, fork, spawn, exec, system), as
    Python's audit events report it: one that started and ended in the block is seen too."""
    seen: list = []
    _WATCH.append(seen)
    try:
        yield seen
    finally:
        _WATCH.remove(seen)


def test_validation_happens_before_anything_starts(store_path):
    # the GPU check may import torch, whose import looks up libraries with `ldconfig -p` (ctypes): that is
    # the framework loading, not a start of gpuvs's, so it happens before the watch
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
    with process_starts() as started:
        with pytest.raises(UsageError, match="no usable NVIDIA GPU|only"):
            validate_spec(RunSpec(workload="cnn-train", device="cuda"))
        with pytest.raises(UsageError, match="unknown device"):
            validate_spec(RunSpec(workload="selftest", device="gpu"))
        with pytest.raises(UsageError, match="runs on one device"):
            validate_spec(RunSpec(workload="selftest", device="cpu", num_gpus=2))
        with pytest.raises(UsageError, match="--steps"):
            validate_spec(_spec(steps=0))
        validate_spec(_spec(steps=1))  # a valid spec: checked, still nothing started
    assert started == []
    # the same watch sees a trial's worker start (so the empty list above means something)
    with process_starts() as started, Store(store_path) as st:
        assert Runner(st).run_with_retries(_spec(steps=1)).ok
    assert [e for e, _ in started].count("subprocess.Popen") >= 1
    assert gpuvs_processes() == []


def test_samples_reach_the_store_while_the_trial_runs_at_a_small_cost(store_path):
    """Storing happens in gpuvs, never in the worker's measured loop; batched about once a second, its cost
    is a small share of the trial's wall time even at a thousand samples a second."""
    import sqlite3

    seen_while_running = []

    def on_event(result, event):
        if event["type"] == "sample" and event["step"] % 200 == 0:
            seen_while_running.append(sqlite3.connect(store_path).execute(
                "SELECT COUNT(*) FROM samples").fetchone()[0])

    with Store(store_path) as st:
        r = Runner(st, on_event=on_event).run_trial(_spec(steps=3000, step_seconds=0.001))
        assert r.ok, r.error
        share = st.write_seconds / r.wall_s
        stored = st.samples(r.id)
    print(f"store writes: {st.write_seconds * 1000:.1f} ms of a {r.wall_s:.2f} s trial ({100 * share:.2f}%), "
          f"{len(stored)} samples")
    assert len(stored) == 3000
    assert max(seen_while_running) >= 1000  # batches were committed before the trial ended
    assert share < 0.02


def test_a_worker_whose_samples_were_cut_on_the_way_is_a_failed_trial(store_path, monkeypatch):
    """A partial read is a failed trial, never ok: the worker's summary says how many samples it sent, and a runner
    that received fewer (a pod's log rotated or broken off) fails the trial saying so. Here a real worker's output
    passes through a real filter that drops every seventh sample line on its way to the runner."""
    from gpuvs.environments import host
    from gpuvs.environments import environment as base

    def lossy(self, spec):
        spec.launched_at = time.time()
        argv = ["sh", "-c", 'exec "$0" "$@" | awk \'/"type": *"sample"/ && ++n % 7 == 0 {next} {print; fflush()}\'',
                sys.executable, "-m", "gpuvs.trial.worker"]
        return base.Launched(argv, env=host.worker_env(spec))

    monkeypatch.setattr(host.HostEnvironment, "launch", lossy)
    with Store(store_path) as st:
        r = Runner(st).run_trial(RunSpec(workload="selftest", device="cpu", params={"steps": 20}, fresh="exec"))
        row = st.trials()[0]
    assert r.samples_sent and len(r.samples) < r.samples_sent
    assert r.status == "failed" and row.status == "failed"
    assert r.error.startswith(f"gpuvs received {len(r.samples)} of the {r.samples_sent} samples the worker sent")


@pytest.mark.parametrize("stop, kind, status", [(KeyboardInterrupt(), "interrupted", "interrupted"),
                                                (RuntimeError("the API went away"), "interrupted", "interrupted")])
def test_a_flight_stopped_any_way_stops_and_keeps_every_trial_in_it(store_path, stop, kind, status):
    """trial.runner.Flight, the one trial loop: two trials in flight and one that ended; the loop leaves by an
    exception; the running two are stopped with the reason, the ended one keeps its figures, all three stored."""
    from gpuvs.trial.runner import Flight

    with Store(store_path) as st:
        runner = Runner(st)
        with pytest.raises(type(stop)):
            with Flight(runner) as flight:
                quick = flight.start(_spec(steps=2, step_seconds=0.01))
                slow = [flight.start(_spec(steps=1000, step_seconds=0.5)) for _ in range(2)]
                deadline = time.monotonic() + 60
                while not flight.poll(quick) and time.monotonic() < deadline:
                    time.sleep(0.02)
                while not all(s.result.samples for s in slow) and time.monotonic() < deadline:
                    flight.pump(slow)
                    time.sleep(0.02)
                raise stop
        assert quick.result.status == "ok" and len(st.samples(quick.result.id)) == 2
        for lv in slow:
            r = lv.result
            assert (r.status, r.error_kind) == (status, kind) and st.trial(r.id).status == status, r.error
            assert not pid_alive(r.fingerprint["pid"]) and 1 <= len(st.samples(r.id)) < 1000
        assert "the API went away" in slow[0].result.error or isinstance(stop, KeyboardInterrupt)
        assert gpuvs_processes() == []


def test_a_launcher_refusal_is_the_trials_failure_in_a_flight_and_raised_by_launch(store_path, monkeypatch):
    from gpuvs.trial.runner import Flight

    with Store(store_path) as st:
        runner = Runner(st)

        def refuse(spec):
            raise RuntimeError("engine missing")

        monkeypatch.setattr(runner.launcher, "launch", refuse)
        with Flight(runner) as flight:
            lv = flight.start(_spec())
            assert (lv.result.status, lv.result.error_kind, lv.result.error) == ("failed", "unavailable", "engine missing")
            with pytest.raises(RuntimeError, match="engine missing"):
                flight.launch(_spec())
        assert [st.trial(x.result.id).status for x in flight.live] == ["failed", "failed"]
