"""The collective workload on the CPU: real gloo process groups of 2 and 3 ranks.

nccl-tests' bandwidths recomputed from the stored times, and bad parameters refused in one line.
Then `gpuvs compare` of 2 against 3 ranks."""

import json
import multiprocessing as mp
import os
import queue
import socket
import sqlite3

import pytest

from gpuvs import workloads
from gpuvs.errors import UsageError
from gpuvs.spec import RunSpec
from gpuvs.workloads.collective import OPS, Shape, wrong_elements
from gpuvs.analysis import stats

# nccl-tests' doc/PERFORMANCE.md: busbw = algbw x this, n ranks
FACTOR = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
          "reduce-scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "send-recv": lambda n: 1.0}
PARAMS = {"min_bytes": "64", "max_bytes": "1K", "factor": 4, "warmup": 1, "iters": 2, "repeats": 2}


def _ranks(rank: int, n: int, port: int, q) -> None:
    """One rank: every op through the workload's own run() in a real gloo group, then (2 ranks) an all-gather
    whose output rank 1 spoils after every operation; rank 0's events, or each rank's error, go back through q."""
    import torch
    import torch.distributed as dist

    from gpuvs.errors import WorkloadError
    from gpuvs.workloads.workload import RunContext
    from gpuvs.workloads.collective import Collective

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n)
    spoilt = Collective()
    plain = spoilt.operation

    def operation(dist_, shape, rank_, src, dst):
        op = plain(dist_, shape, rank_, src, dst)
        return (lambda: (op(), dst[-1].add_(1))) if rank_ == 1 else op

    spoilt.operation = operation
    for op, w in [(op, Collective()) for op in OPS] + ([("all-gather", spoilt)] if n == 2 else []):
        params = w.validate({**PARAMS, "op": op}, "cpu")
        spec = RunSpec(workload="collective", params=params, device="cpu", num_gpus=n)
        try:
            evs = list(w.run(RunContext(spec=spec, params=params, rank=rank, world_size=n)))
            if rank == 0:
                q.put((op, evs))
        except WorkloadError as exc:
            q.put(("error", rank, str(exc)))
    dist.destroy_process_group()


def run_group(n: int) -> list:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_ranks, args=(r, n, port, q)) for r in range(n)]
    for p in procs:
        p.start()
    out = []
    try:
        while len(out) < len(OPS) + (2 if n == 2 else 0):
            out.append(q.get(timeout=120))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_every_op_on_gloo_ranks_with_nccl_tests_bandwidths(n):
    out = run_group(n)
    results = dict(e for e in out if e[0] != "error")
    assert set(results) == set(OPS)  # every op's result passed its check on every rank
    if n == 2:
        wrong_result_fails_every_rank([e for e in out if e[0] == "error"])
    for op, evs in results.items():
        samples = [e for e in evs if e["type"] == "sample"]
        metrics = {e["name"]: e["value"] for e in evs if e["type"] == "metric"}
        series = list(dict.fromkeys(s["series"] for s in samples))
        sizes = [64, 256, 1024]
        want = [Shape.of(op, size, n, 4).nbytes for size in sizes]
        assert series == [f"{b} B" for b in reversed(want)]  # the largest size leads: the headline
        for s in samples:
            nbytes = int(s["series"].split()[0])
            per_op = s["seconds"] / PARAMS["iters"]
            algbw = nbytes / 1e9 / per_op
            assert s["extra"]["algbw"] == pytest.approx(algbw, rel=1e-9)
            assert s["value"] == pytest.approx(algbw * FACTOR[op](n), rel=1e-9)  # busbw from the stored time
        # "where the time went" counts every size's timed repeats as measured, not the headline size's alone
        (timed,) = [e["seconds"] for e in evs if e["type"] == "startup" and e["name"] == "timed_s"]
        assert timed == pytest.approx(sum(s["seconds"] for s in samples), rel=1e-9) and timed > 0
        per_size = [s for s in samples if s["series"] == series[-1]]
        assert len(per_size) == PARAMS["repeats"]
        mean_us = sum(s["seconds"] for s in per_size) / (PARAMS["repeats"] * PARAMS["iters"]) * 1e6
        assert metrics["latency_us"] == pytest.approx(mean_us) == metrics[f"{series[-1]}/time_us"]
        log = "\n".join(e["message"] for e in evs if e["type"] == "log")
        assert "busbw" in log and all(len(line) <= 80 for line in log.splitlines())
    if n == 3:  # nccl-tests' size convention: per-rank count floor(count / n), aligned to 16 bytes, times n
        assert Shape.of("all-gather", 1024, 3, 4).nbytes == 1008 and Shape.of("reduce-scatter", 64, 3, 4).count == 4
        assert f"1008 B/count" in {e["name"] for e in results["all-gather"] if e["type"] == "metric"}


def wrong_result_fails_every_rank(errors: list) -> None:
    """The spoilt all-gather: every rank stops with one clear line (none is left waiting for the others)."""
    assert sorted(e[1] for e in errors) == [0, 1] and {e[0] for e in errors} == {"error"}  # no rank left waiting
    text = {e[1]: e[2] for e in errors}
    assert text[1] == ("all-gather gave wrong values at 64 bytes: 1 wrong element(s) over 2 ranks; rank 1 element "
                       "15 is 3, expected 2 (rank r filled r + 1)")
    assert text[0].endswith("1 wrong element(s) over 2 ranks; none on rank 0 (rank r filled r + 1)")


def test_wrong_elements_are_counted_against_known_values():
    import torch

    ok = torch.tensor([1.0, 1.0, 2.0, 2.0])
    assert wrong_elements("all-gather", ok, 0, 2) == (0, "")
    assert wrong_elements("all-reduce", torch.full((4,), 6.0), 2, 3) == (0, "")
    assert wrong_elements("send-recv", torch.full((4,), 3.0), 0, 3) == (0, "")  # rank 0 hears from rank 2
    assert wrong_elements("all-reduce", torch.tensor([3.0, 3.0, 2.0]), 0, 2)[0] == 1


def test_bad_params_are_refused_in_one_line(cli):
    w = workloads.get("collective")
    for raw, words in [({"min_bytes": "1X"}, "--min-bytes '1X' is not a size"),
                       ({"max_bytes": "32G"}, "--max-bytes '32G' is out of range: from 1 byte to 16G"),
                       ({"min_bytes": "1M", "max_bytes": "4K"}, "--max-bytes 4096 is below --min-bytes 1048576"),
                       ({"min_bytes": "2", "precision": "fp32"}, "less than one float32 element"),
                       ({"op": "all-to-all"}, "all-to-all"), ({"factor": 1}, "factor")]:
        with pytest.raises(UsageError, match=words.replace("(", r"\(")):
            w.validate(raw, "cpu")
    assert w.validate({"min_bytes": "64k", "max_bytes": "1M", "dtype": "bf16"}, "cpu")["min_bytes"] == "65536"
    r = cli("run", "collective", "--device", "cpu")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "all-reduce is a collective: it needs at least 2 ranks; give --num-gpus N" in r.stderr
    r = cli("run", "collective", "--device", "cpu", "--num-gpus", "2", "--max-bytes", "lots")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a size" in r.stderr, r.stderr


def test_compare_two_against_three_ranks_names_a_verdict(cli, tmp_path):
    r = cli("compare", "collective", "--device", "cpu", "--min-bytes", "16K", "--max-bytes", "16K", "--iters", "3",
            "--repeats", "2", "--arm", "two:num_gpus=2", "--arm", "three:num_gpus=3", "--trials", "2", "--quiet",
            "--order-seed", "1", COLUMNS="80")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Verdict: each arm against two" in r.stdout
    assert "Scaling" not in r.stdout  # bus bandwidth is per rank already: no N-GPU scaling efficiency
    # the per-size table (nccl-tests' size, count, time, algbw, busbw), wrapped to the terminal's 80 columns
    assert "Per series" in r.stdout and "time us" in r.stdout and "algbw" in r.stdout and "16384 B" in r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    ident = [ln for ln in r.stdout.splitlines() if ln.startswith("experiment ")][-1].split()[1]
    assert "Scaling" not in cli("report", ident).stdout
    data = json.loads(cli("report", ident, "--format", "json").stdout)
    head = [v for v in data["verdicts"] if v["metric"] == "16384 B"]
    assert len(head) == 1 and head[0]["arm"] == "three" and head[0]["baseline"] == "two" and head[0]["unit"] == "GB/s"
    assert head[0]["verdict"] in stats.SETTLED
    assert head[0]["ci_low"] <= head[0]["ratio"] <= head[0]["ci_high"]
    assert {v["metric"] for v in data["verdicts"]} >= {"16384 B", "latency_us"}
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, status FROM trials").fetchall()
    assert sorted(rows) == [("three", "ok")] * 2 + [("two", "ok")] * 2
