"""Data-parallel runs: one process per GPU (NCCL) or per CPU rank (gloo). Rank 0's events reach
the worker's protocol stream through a queue; every rank's failure does too. Ranks are stopped
on every exit path.

One host: the rendezvous is on 127.0.0.1 at a free port. A trial across nodes (the pod environment's
--num-nodes, environments/pod/gang.py) sets GPUVS_NUM_NODES, GPUVS_NODE_RANK, GPUVS_MASTER_ADDR and
GPUVS_MASTER_PORT in each pod: this pod's ranks are NODE_RANK x --num-gpus + 0..--num-gpus-1 of a world of
NUM_NODES x --num-gpus, and global rank 0 (in the first pod) holds the store the others meet at."""

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


def across_nodes() -> tuple[int, int, str | None, int | None]:
    """(nodes, this node's rank, the first pod's address, the store's port) from the pod's environment; (1, 0, None,
    None) on one host."""
    nodes = int(os.environ.get("GPUVS_NUM_NODES") or 1)
    port = os.environ.get("GPUVS_MASTER_PORT")
    return (nodes, int(os.environ.get("GPUVS_NODE_RANK") or 0), os.environ.get("GPUVS_MASTER_ADDR") or None,
            int(port) if port else None)


def _rank_main(spec_json: str, params: dict[str, Any], rank: int, world: int, port: int, q,
               local: int | None = None, addr: str = "127.0.0.1") -> None:
    from gpuvs import workloads
    from gpuvs.spec import RunSpec
    from gpuvs.probes.failures import classify
    from gpuvs.workloads.base import RunContext

    local = rank if local is None else local
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(local))
    spec = RunSpec.from_json(spec_json)
    try:
        import torch.distributed as dist

        cuda = spec.device.startswith("cuda")
        if cuda:
            import torch

            torch.cuda.set_device(local)
            spec.device = f"cuda:{local}"
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
    nodes, node_rank, addr, port = across_nodes()
    port = port or _free_port()
    per = spec.num_gpus
    world = per * nodes
    first = node_rank * per  # this node's first global rank
    procs = [ctx.Process(target=_rank_main, args=(spec.to_json(), params, first + r, world, port, q, r,
                                                  addr or "127.0.0.1"), name=f"gpuvs-rank{first + r}")
             for r in range(per)]
    for p in procs:
        p.start()
    done: set[int] = set()
    try:
        while len(done) < per:
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
