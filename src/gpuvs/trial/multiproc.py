"""Data-parallel runs: one process per GPU (NCCL) or per CPU rank (gloo). Rank 0's events reach
the worker's protocol stream through a queue; every rank's failure does too. Ranks are stopped
on every exit path."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
from typing import Any, Callable

from gpuvs.errors import WorkloadError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(spec_json: str, params: dict[str, Any], rank: int, world: int, port: int, q) -> None:
    from gpuvs import workloads
    from gpuvs.spec import RunSpec
    from gpuvs.probes.failures import classify
    from gpuvs.workloads.base import RunContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    spec = RunSpec.from_json(spec_json)
    try:
        import torch.distributed as dist

        cuda = spec.device.startswith("cuda")
        if cuda:
            import torch

            torch.cuda.set_device(rank)
            spec.device = f"cuda:{rank}"
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        try:
            workload = workloads.get(spec.workload)
            for event in workload.run(RunContext(spec=spec, params=params, rank=rank, world_size=world)):
                if rank == 0 and event.get("type") != "telemetry":
                    q.put(event)
        finally:
            dist.destroy_process_group()
        q.put({"type": "_done", "rank": rank})
    except BaseException as exc:
        kind, message = classify(exc, spec)
        q.put({"type": "_failed", "rank": rank, "kind": kind, "message": f"rank {rank}: {message}"})


def run_ranks(spec, params: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    world = spec.num_gpus
    procs = [ctx.Process(target=_rank_main, args=(spec.to_json(), params, r, world, port, q), name=f"gpuvs-rank{r}")
             for r in range(world)]
    for p in procs:
        p.start()
    done: set[int] = set()
    try:
        while len(done) < world:
            try:
                event = q.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise WorkloadError("crash", f"{dead[0].name} exited with status {dead[0].exitcode}")
                continue
            if event["type"] == "_done":
                done.add(event["rank"])
            elif event["type"] == "_failed":
                raise WorkloadError(event["kind"], event["message"])
            else:
                emit(event)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
