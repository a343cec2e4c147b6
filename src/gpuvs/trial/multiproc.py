"""Data-parallel runs: one process per GPU (NCCL) or per CPU rank (gloo), forked from the worker where safe.

Rank 0's events and every rank's failure reach the worker's protocol stream through a queue.
Ranks are stopped on every exit path. How they start, across nodes too, and what is stored: docs/trials.md."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import time
from typing import Any, Callable, Iterable

from gpuvs import events
from gpuvs.errors import WorkloadError

MODE_ENV = "GPUVS_RANKS"  # "spawn": the ranks start as before issue 36 (for before/after figures); else fork where safe
MODES = ("fork", "spawn")
THREADS_ENV = "OMP_NUM_THREADS"


def rank_threads(ranks: int) -> tuple[int, str]:
    """Each CPU rank's torch intra-op threads and what decided them: OMP_NUM_THREADS where the user set it (a
    whole number from 1), else the cores this process may use // the `ranks` on this host, at least 1."""
    given = os.environ.get(THREADS_ENV, "").strip()
    if given.isdigit() and int(given) >= 1:
        return int(given), f"{THREADS_ENV}={given}"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // ranks), f"{cores} cores // {ranks} ranks"


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


def _as_new_process(close_fds: Iterable[int]) -> None:
    """A forked rank starts as a spawned one would: default signal handling (the worker's SIGTERM handler
    is not its own), random state drawn anew (numpy's and torch's CPU generator would be the worker's copies;
    Python's random reseeds itself at fork), none of the worker's own descriptors (its protocol stream)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()


def _rank_main(spec_json: str, params: dict[str, Any], rank: int, world: int, port: int, q,
               forked: bool = False, close_fds: tuple[int, ...] = (), local: int | None = None,
               addr: str = "127.0.0.1", threads: int | None = None) -> None:
    entered = time.time()
    preloaded = "torch" in sys.modules  # forked from a worker that imported it, or a fresh interpreter
    if forked:
        _as_new_process(close_fds)
    import importlib

    from gpuvs import workloads
    from gpuvs.spec import RunSpec
    from gpuvs.probes.failures import classify
    from gpuvs.workloads.workload import RunContext

    local = rank if local is None else local
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(local))
    spec = RunSpec.from_json(spec_json)
    try:
        workload = workloads.get(spec.workload)
        t0 = time.perf_counter()
        for module in sorted(workload.imports(params), key=lambda m: m != "torch"):  # as the worker imports them
            importlib.import_module(module)
        import torch.distributed as dist

        import_s = time.perf_counter() - t0
        imported = time.time()
        cuda = spec.device.startswith("cuda")
        import torch

        if cuda:
            torch.cuda.set_device(local)
            spec.device = f"cuda:{local}"
        elif threads:
            torch.set_num_threads(threads)
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        q.put({"type": "_started", "rank": rank, "entered": entered, "imported": imported, "grouped": time.time(),
               "import_s": import_s, "preloaded": preloaded, "threads": torch.get_num_threads()})
        try:
            for event in workload.run(RunContext(spec=spec, params=params, rank=rank, world_size=world)):
                if rank == 0 and event.get("type") != "telemetry":
                    q.put(event)
        finally:
            dist.destroy_process_group()
        q.put({"type": "_done", "rank": rank})
    except BaseException as exc:
        kind, message = classify(exc, spec)
        q.put({"type": "_failed", "rank": rank, "kind": kind, "message": f"rank {rank}: {message}"})


def fork_problem(asked: str | None = None) -> str | None:
    """Why the ranks must be spawned rather than forked from this process now, or None. `asked`: GPUVS_RANKS."""
    if asked == "spawn":
        return f"{MODE_ENV}=spawn asks for it"
    if "fork" not in mp.get_all_start_methods():
        return "this platform cannot fork"
    from gpuvs.trial import forksafe

    problem = forksafe.fork_problem("the worker")
    if problem and problem.startswith("the worker runs"):
        # pools that shut themselves down at fork (numpy's OpenBLAS) do so at an empty fork, as in the zygote
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        problem = forksafe.fork_problem("the worker")
    return problem


class Ranks:
    """This host's (or pod's) ranks of one trial: started (forked where safe) here, read by wait(), ended by
    stop(). `per` ranks here, of a world of `per` x the trial's nodes."""

    def __init__(self, spec, params: dict[str, Any], close_fds: tuple[int, ...] = ()):
        nodes, node_rank, addr, port = across_nodes()
        self.per = spec.num_gpus
        self.world = self.per * nodes
        first = node_rank * self.per  # this node's first global rank
        self.started_at = time.time()
        asked = os.environ.get(MODE_ENV) or None
        self.reason = fork_problem(asked)
        self.mode = "spawn" if self.reason else "fork"
        ctx = mp.get_context(self.mode)
        self.q = ctx.Queue()
        port = port or _free_port()
        forked = self.mode == "fork"
        self.threads, self.threads_by = (None, None) if spec.device.startswith("cuda") else rank_threads(self.per)
        self.procs = [ctx.Process(target=_rank_main, name=f"gpuvs-rank{first + r}",
                                  args=(spec.to_json(), params, first + r, self.world, port, self.q, forked,
                                        tuple(close_fds) if forked else (), r, addr or "127.0.0.1", self.threads))
                      for r in range(self.per)]
        self.started: dict[int, dict[str, Any]] = {}
        self.reported = False
        try:
            for p in self.procs:
                p.start()
        except BaseException:
            self.stop()
            raise

    def report(self, emit: Callable[[dict[str, Any]], None]) -> None:
        """How the ranks started (config items) and, once every rank had its process group, the ranks' start (the
        last rank running its code, having its imports, having its group, each from the ranks' start), as start-up
        items; once, after the workload's own events (the step log shows a trial's first config event as its
        header), or on the way out of a failed trial."""
        if self.reported:
            return
        self.reported = True
        items: dict[str, Any] = {"ranks_started_by": self.mode}
        if self.reason:
            items["ranks_spawn_reason"] = self.reason
        s = self.started.values()
        if len(self.started) == self.per:
            items.update(ranks_preloaded=all(r["preloaded"] for r in s),
                         rank_import_s=[round(self.started[r]["import_s"], 4) for r in sorted(self.started)])
            if self.threads:
                items.update(rank_threads=[self.started[r]["threads"] for r in sorted(self.started)],
                             rank_threads_by=self.threads_by)
        emit(events.config(**items))
        if len(self.started) < self.per:
            return
        ran, imported, grouped = (max(r[k] for r in s) for k in ("entered", "imported", "grouped"))
        for name, seconds in (("ranks_s", grouped - self.started_at), ("ranks_process_s", ran - self.started_at),
                              ("ranks_import_s", imported - ran), ("ranks_group_s", grouped - imported)):
            emit(events.startup(name, seconds))

    def wait(self, emit: Callable[[dict[str, Any]], None]) -> None:
        done: set[int] = set()
        while len(done) < self.per:
            try:
                event = self.q.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise WorkloadError("crash", f"{dead[0].name} exited with status {dead[0].exitcode}")
                continue
            if event["type"] == "_started":
                self.started[event["rank"]] = event
            elif event["type"] == "_done":
                done.add(event["rank"])
            elif event["type"] == "_failed":
                raise WorkloadError(event["kind"], event["message"])
            else:
                emit(event)
        self.report(emit)

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            if p._popen is None:  # never started
                continue
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()

