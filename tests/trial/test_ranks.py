"""A trial across several ranks (cnn-train over gloo on the CPU, 2 ranks), forked from the worker (issue 36).

They are spawned where a fork would not be clean, or GPUVS_RANKS=spawn asks, with the reason stored.
The figures are the same either way, and no rank outlives its trial (a rank killed, gpuvs stopped)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conftest import SRC, gpuvs_env, gpuvs_processes, wait_for

JOB = ("cnn-train", "--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--warmup-steps", "1",
       "--device", "cpu", "--num-gpus", "2")


def test_ranks_are_forked_with_the_imports_and_spawned_when_asked(cli, tmp_path):
    r = cli("compare", *JOB, "--steps", "4", "--display-every", "2", "--trials", "1", "--arm", "forked:seed=1",
            "--arm", "spawned:env_var=GPUVS_RANKS=spawn")
    assert r.returncode == 0, r.stderr + r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = {arm: (json.loads(config), json.loads(startup), tid) for arm, config, startup, tid
            in db.execute("SELECT arm, config, startup, id FROM trials WHERE status = 'ok'")}
    assert set(rows) == {"forked", "spawned"}
    fork_cfg, spawn_cfg = rows["forked"][0], rows["spawned"][0]
    said = " ".join(r.stdout.split())  # the step log and the breakdown's note, wrapped to the terminal
    # the mechanism: forked ranks found torch in sys.modules when their code started and imported nothing more
    assert fork_cfg["ranks_started_by"] == "fork" and "ranks_spawn_reason" not in fork_cfg
    assert fork_cfg["ranks_preloaded"] is True and max(fork_cfg["rank_import_s"]) < 0.5
    assert said.count("ranks spawned, not forked") == 1
    # the old path when asked: a fresh interpreter per rank, the reason stored and logged
    assert spawn_cfg["ranks_started_by"] == "spawn" and spawn_cfg["ranks_preloaded"] is False
    assert spawn_cfg["ranks_spawn_reason"] == "GPUVS_RANKS=spawn asks for it"
    assert "ranks spawned, not forked: GPUVS_RANKS=spawn asks for it" in said
    assert min(spawn_cfg["rank_import_s"]) > max(fork_cfg["rank_import_s"])  # torch (and torchvision) imported again
    for _, up, _ in rows.values():  # the ranks' start, stored per trial, inside the trial's start-up
        parts = up["ranks_process_s"] + up["ranks_import_s"] + up["ranks_group_s"]
        assert abs(parts - up["ranks_s"]) < 1e-6 and min(up["ranks_process_s"], up["ranks_import_s"], up["ranks_group_s"]) >= 0
        assert up["ranks_s"] < up["launch_to_timed_s"] - up["warmup_s"]
    # the same figures either way: 2 ranks x batch 2 per step, every step, a positive rate
    for arm, (_, _, tid) in rows.items():
        rows_ = db.execute("SELECT items, value FROM samples WHERE trial_id = ?", (tid,)).fetchall()
        assert [i for i, _ in rows_] == [4.0] * 4 and all(v > 0 for _, v in rows_), arm
    assert "across ranks in 2 trial(s)" in said and "ranks forked 1, spawned 1" in said
    assert gpuvs_processes() == []


def test_cpu_ranks_share_the_cores_unless_omp_num_threads_says(cli, tmp_path, monkeypatch):
    """Each CPU rank runs torch with the cores // the ranks (at least 1), not every core's threads each (which
    oversubscribes them: torchrun sets OMP_NUM_THREADS=1 per rank); OMP_NUM_THREADS, where the user set it, wins.
    Both are stored with the trial, as each rank's torch reports its threads."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    r = cli("compare", *JOB, "--steps", "2", "--display-every", "2", "--trials", "1", "--arm", "shared:seed=1",
            "--arm", "given:env_var=OMP_NUM_THREADS=2")
    assert r.returncode == 0, r.stderr + r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    cfg = {arm: json.loads(config) for arm, config in db.execute("SELECT arm, config FROM trials WHERE status = 'ok'")}
    cores = len(os.sched_getaffinity(0))
    want = max(1, cores // 2)
    assert cfg["shared"]["rank_threads"] == [want, want], cfg["shared"]
    assert cfg["shared"]["rank_threads_by"] == f"{cores} cores // 2 ranks"
    assert cfg["given"]["rank_threads"] == [2, 2] and cfg["given"]["rank_threads_by"] == "OMP_NUM_THREADS=2"
    assert gpuvs_processes() == []


def test_a_worker_with_another_thread_spawns_its_ranks_and_says_why():
    code = ("import threading, time\n"
            "from gpuvs.trial import multiproc\n"
            "print(multiproc.fork_problem())\n"
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
            "print(multiproc.fork_problem())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(gpuvs_env(), PYTHONPATH=str(SRC)))
    first, second = r.stdout.splitlines()
    assert first == "None", r.stderr
    assert second.startswith("the worker runs 2 threads (") and "could inherit locks" in second


def _ranks_of(tag_pids: list[int]) -> list[int]:
    """The ranks: processes of this test whose parent is a trial's worker (a process named gpuvs-trial)."""
    out = []
    for pid in tag_pids:
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{ppid}/comm").read_text().strip() == "gpuvs-trial" and \
                    Path(f"/proc/{ppid}/cmdline").read_bytes() == Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return out


def _start(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuvs", "run", *JOB, "--steps", "2000", "--quiet"], cwd=tmp_path,
                            env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _measuring(tmp_path: Path) -> bool:
    db = tmp_path / "gpuvs.db"
    try:
        return db.exists() and sqlite3.connect(db).execute("SELECT COUNT(*) FROM samples").fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False


def test_no_rank_outlives_its_trial_when_a_rank_dies_or_gpuvs_is_stopped(tmp_path):
    # a rank killed outright: the trial fails with the dead rank's exit named, or the other rank's broken connection
    # to it (whichever the worker hears first), and the other rank and the worker end
    proc = _start(tmp_path)
    ranks = wait_for(lambda: len(_ranks_of(gpuvs_processes())) == 2 and _measuring(tmp_path) and
                     _ranks_of(gpuvs_processes()), 120, "two forked ranks measuring")
    os.kill(max(ranks), signal.SIGKILL)  # rank 1 (forked after rank 0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err
    row = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, error FROM trials").fetchone()
    assert row[0] == "failed" and (row[1].startswith("rank 0: ") or "gpuvs-rank1 exited with status -9" in row[1]), row
    wait_for(lambda: gpuvs_processes() == [], 15, "the end of the worker and the other rank")
    # gpuvs stopped (SIGTERM, as Kubernetes or a timeout stops it) while the ranks measure: every rank ends
    again = tmp_path / "again"  # a store of its own
    again.mkdir()
    proc = _start(again)
    wait_for(lambda: len(_ranks_of(gpuvs_processes())) == 2 and _measuring(again), 120, "two ranks measuring")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "stopped by SIGTERM" in err, err
    wait_for(lambda: gpuvs_processes() == [], 15, "the end of the worker and both ranks")


def test_a_pod_of_a_trial_across_nodes_starts_no_cuda_before_its_ranks(monkeypatch):
    """On four H200s a pod of `--num-nodes N --num-gpus 1` spawned its rank: the worker had started CUDA's context
    in a thread (start_device, for single-process runs), and the fork check saw the driver's thread. A pod whose
    ranks span nodes starts no context before its ranks; a plain one-GPU trial still starts it early."""
    import threading

    from gpuvs import workloads
    from gpuvs.spec import RunSpec
    from gpuvs.trial import worker

    started: list[str] = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name))
    spec = RunSpec(workload="collective", device="cuda", num_gpus=1)
    monkeypatch.setenv("GPUVS_NUM_NODES", "2")
    worker.start_device(spec, workloads.get("collective"))
    assert started == []
    monkeypatch.delenv("GPUVS_NUM_NODES")
    worker.start_device(spec, workloads.get("collective"))
    assert started == ["gpuvs-cuda-init"]
