"""The only code that runs inside an environment: `python -m gpuvs.trial.worker`.

It reads one RunSpec (--spec-file PATH, or GPUVS_SPEC), runs one workload and writes events.py's JSON lines.
Anything else that prints goes to standard error, so the protocol stream stays clean in every environment."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, TypeVar

T_START = time.time()
FORKED = False  # True in a child of the zygote (zygote.py), which sets T_START to the moment it was forked

from gpuvs import events  # noqa: E402
from gpuvs.trial import bytecode  # noqa: E402
from gpuvs.errors import EXIT_CODES, WorkloadError  # noqa: E402
from gpuvs.probes.failures import classify  # noqa: E402
from gpuvs.spec import RunSpec  # noqa: E402

Emit = Callable[[dict[str, Any]], None]
T = TypeVar("T")


def _protocol_stream():
    """Keep fd 1 for the protocol; send everything else that writes to fd 1 to stderr."""
    global PROTOCOL_FD
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    PROTOCOL_FD = proto.fileno()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


_WATCH: list = []  # the running parent watch: (its thread, the event that stops it)
PROTOCOL_FD: int | None = None  # the protocol stream's descriptor (not for the ranks a worker forks)


def watch_parent() -> None:
    """On the host, a worker leads its own process group (gpuvs starts it in a new session). If gpuvs
    itself is killed outright (SIGKILL, the OOM killer), nobody would stop the group: a thread that wakes
    twice a second notices the parent is gone and ends the group, children included."""
    parent = os.environ.get("GPUVS_PARENT_PID")
    if not parent or not parent.isdigit() or os.getpgrp() != os.getpid() or os.getppid() != int(parent):
        return  # not a host worker started by this gpuvs (a container's, a rank of --num-gpus)
    _start_watch(int(parent))


def _start_watch(parent: int) -> None:
    import threading

    stop = threading.Event()

    def watch() -> None:
        while os.getppid() == parent:
            if stop.wait(0.5):
                return
        os.killpg(os.getpgrp(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="gpuvs-parent-watch", daemon=True)
    _WATCH[:] = [thread, stop]
    thread.start()


@contextlib.contextmanager
def watch_paused():
    """The parent watch stopped while the worker forks its ranks (a fork must find it single-threaded:
    multiproc.py), then started again; it checks the parent at once, so a gpuvs that died meanwhile is seen."""
    if not _WATCH or not _WATCH[0].is_alive():
        yield
        return
    thread, stop = _WATCH
    stop.set()
    thread.join()
    try:
        yield
    finally:
        _start_watch(int(os.environ["GPUVS_PARENT_PID"]))


def end_group_if_orphaned() -> None:
    """The worker is ending because gpuvs is gone (its protocol pipe broke before the watch woke): its
    children go with it."""
    parent = os.environ.get("GPUVS_PARENT_PID")
    if parent and parent.isdigit() and os.getpgrp() == os.getpid() and os.getppid() != int(parent):
        os.killpg(os.getpgrp(), signal.SIGKILL)


def read_spec(argv: list[str]) -> RunSpec:
    if "--spec-file" in argv:
        path = argv[argv.index("--spec-file") + 1]
        with open(path) as fh:
            return RunSpec.from_json(fh.read())
    text = os.environ.get("GPUVS_SPEC")
    if not text:
        raise WorkloadError("input", "no run spec: pass --spec-file PATH or set GPUVS_SPEC")
    return RunSpec.from_json(text)


def import_requirements(workload, emit: Emit, spec: RunSpec | None = None) -> None:
    t0 = time.perf_counter()
    order = sorted(workload.requires, key=lambda m: m != "torch")  # torch first: the context starts early
    for module in order:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise WorkloadError("unavailable", f"workload {workload.name} needs the Python module {module!r}, "
                                f"which this environment lacks ({exc}); python {sys.version.split()[0]} "
                                f"at {sys.executable}") from None
        if module == "torch" and spec is not None:
            start_device(spec, workload)
    if workload.requires:
        emit(events.startup("import_s", time.perf_counter() - t0))


def start_device(spec: RunSpec, workload) -> None:
    """Create the CUDA context in a background thread while the worker imports the rest, takes its
    fingerprint and builds the model on the host: none of that is measured, and the context (about
    a second) no longer waits its turn. torch's lazy initialisation is guarded by a lock, so the
    first CUDA call of the workload simply waits for it. Single-process CUDA runs only: a worker whose ranks are
    forked from it (several GPUs, or a pod of a trial across nodes, even with one GPU of its own) must reach
    the fork with CUDA not started."""
    from gpuvs.trial import multiproc

    if "torch" not in workload.requires or not spec.device.startswith("cuda") or spec.num_gpus > 1:
        return
    if multiproc.across_nodes()[0] > 1:
        return
    import threading

    def init() -> None:
        try:
            import torch

            torch.cuda.init()
        except Exception:  # the workload's own first CUDA call reports what is wrong
            pass

    threading.Thread(target=init, name="gpuvs-cuda-init", daemon=True).start()


def run_events(spec: RunSpec, emit: Emit) -> None:
    """Run one spec, emitting every event. Raises on failure (classified by the caller)."""
    from gpuvs import workloads
    from gpuvs.probes import fingerprint
    from gpuvs.probes import contention, telemetry
    from gpuvs.trial import multiproc

    # what competes with the trial, read before it starts its own GPU work (pids seen now are others'); a worker
    # that forks ranks opens nothing of NVML before the fork
    forks = spec.num_gpus > 1 or multiproc.across_nodes()[0] > 1
    # a worker of a group (spec.barrier: gpuvs share) shares its GPU on purpose: its siblings are no co-tenants
    watch = contention.Watch(spec.device, None if spec.barrier else
                             lambda: telemetry.visible_gpu_indices(spec.device, spec.num_gpus), open_now=not forks)
    if spec.launched_at:
        emit(events.startup("launch_to_worker_s", T_START - spec.launched_at))
        if FORKED:  # the fork request to the child running: what a forked trial pays to start
            emit(events.startup("fork_s", T_START - spec.launched_at))
    workload = workloads.get(spec.workload)
    params = workload.validate(spec.params, spec.device)
    if not FORKED:  # a zygote's child has its imports already
        bytecode.keep(workload.imports(params))
    import_requirements(workload, emit, spec)
    from gpuvs.trial import multiproc

    ranks = None
    if (spec.num_gpus > 1 or multiproc.across_nodes()[0] > 1) and workload.multi_gpu:
        # the ranks first, forked from this worker while it is single-threaded and CUDA-free: the fingerprint
        # asks torch whether CUDA is available (that starts the driver) and telemetry starts a thread
        with watch_paused():
            ranks = multiproc.Ranks(spec, params, close_fds=(PROTOCOL_FD,) if PROTOCOL_FD is not None else ())
    sampler = None
    try:
        if ranks is not None and ranks.reason:
            emit(events.log(f"ranks spawned, not forked: {ranks.reason}"))
        emit({"type": "fingerprint", "data": fingerprint.take(import_torch="torch" in workload.requires)})
        samples: list[dict[str, Any]] = []  # the sample events, summarised by the workload (the command
        # workload's summary is plain Python: its worker may run in an image whose Python has no numpy)

        def collect(event: dict[str, Any]) -> None:
            if event["type"] == "sample":
                samples.append(event)
            emit(event)

        sampler = telemetry.start_for(spec, emit, watch)
        if ranks is not None:
            ranks.wait(collect)
        else:
            from gpuvs.workloads.workload import RunContext

            for event in workload.run(RunContext(spec=spec, params=params)):
                collect(event)
    finally:
        if sampler is not None:
            sampler.stop()
        try:  # also for a trial that failed: what competed with it may be why
            emit({"type": "contention", "data": watch.finish()})
        except OSError:  # the protocol stream is gone (gpuvs ended)
            pass
        if ranks is not None:
            ranks.stop()
            try:
                ranks.report(emit)  # where the trial failed: how its ranks started is kept all the same
            except OSError:  # the protocol stream is gone (gpuvs ended): the failure itself is what counts
                pass
    if spec.launched_at:  # the workload is done: what follows until exit is teardown (timeshare.py)
        emit(events.startup("launch_to_done_s", time.time() - spec.launched_at))
    # `samples`: how many sample events this worker sent, so that the runner can tell a whole read from a cut one
    emit({"type": "summary", "data": headline_first(workload.summarize(samples, params),
                                                    workload.headline_series(params)), "samples": len(samples)})


def headline_first(summary: dict[str, T], headline: str | None) -> dict[str, T]:
    """The summary with the workload's headline series first (the order reports and verdicts read)."""
    if headline in summary:
        return {headline: summary[headline], **{k: v for k, v in summary.items() if k != headline}}
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    proto = _protocol_stream()

    def emit(event: dict[str, Any]) -> None:
        proto.write(events.encode(event) + "\n")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    watch_parent()
    spec = None
    try:
        spec = read_spec(argv)
        run_events(spec, emit)
        return 0
    except KeyboardInterrupt:
        emit(events.error("interrupted", "worker interrupted"))
        return 130
    except BaseException as exc:  # every failure becomes one error event and a status
        kind, message = classify(exc, spec) if spec else ("input", str(exc))
        if kind == "crash":
            traceback.print_exc(file=sys.stderr)
        emit(events.error(kind, message))
        return EXIT_CODES.get(kind, 1)
    finally:
        end_group_if_orphaned()
        proto.flush()


def exit_now(code: int) -> None:
    """End without tearing the interpreter down (module clean-up, the framework's exit hooks): every
    event is written and flushed by then, and the next trial waits for this process to be gone.
    The operating system frees the process's memory and the driver its GPU context as for any exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
