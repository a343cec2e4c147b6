"""An Environment starts a worker somewhere and streams its protocol lines back. It owns clean-up:
nothing it started outlives the run, on success, failure, timeout or Ctrl-C."""

from __future__ import annotations

import collections
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

import gpuvs
from gpuvs import spawn
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.spec import RunSpec

if TYPE_CHECKING:
    from gpuvs.probes import checkup


def package_root() -> str:
    """The directory that holds the gpuvs package: put it on PYTHONPATH and `python -m gpuvs.trial.worker` works."""
    return str(Path(gpuvs.__file__).resolve().parent.parent)


LINES_QUEUED = 10_000  # protocol lines a worker may be ahead of the runner before its pipe waits (back-pressure)


class WorkerStream:
    """A started worker as the runner sees it, wherever it runs: its protocol lines (through a bounded queue, so
    reads can time out and a fast worker waits for the runner instead of growing gpuvs's memory), the tail of its
    other output, whether it still runs, its exit status, and a kill that leaves nothing it started behind."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self.lines: queue.Queue[str | None] = queue.Queue(maxsize=LINES_QUEUED)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=60)
        self._killed = False
        self._abandoned = False  # the runner is done with this stream: nothing waits to be read any more

    def put(self, line: str | None) -> None:
        """Queue a protocol line (None: the end) for the runner, waiting while the queue is full: the reader of the
        worker's pipe then stops reading, and the worker waits to write. A stream the runner has left drops it."""
        while True:
            try:
                self.lines.put(line, timeout=0.5)
                return
            except queue.Full:
                if self._abandoned or self._killed:
                    return

    def read(self, deadline: float | None) -> Iterator[str]:
        """Protocol lines until EOF; raises TimeoutError once the deadline (time.monotonic) passes."""
        while True:
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError from None
            if line is None:
                return
            yield line

    def running(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        raise NotImplementedError

    def kill(self, grace_s: float = 3.0) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """kill() while the worker runs, else close(): what the runner does after every trial."""
        self._abandoned = True
        if self.running():
            self.kill()
        else:
            self.close()


class Launched(WorkerStream):
    """A worker process (on the host, or an engine's client process): a kill takes every process of its
    group with it."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None,
                 on_kill: Callable[[], None] | None = None, cwd: str | None = None):
        super().__init__()
        self.argv = argv
        self.on_kill = on_kill
        self.proc = spawn.group_popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, cwd=cwd, text=True, bufsize=1)
        try:  # interrupted before the caller holds this object: nobody else could stop the group
            self._threads = [threading.Thread(target=self._pump_out, daemon=True),
                             threading.Thread(target=self._pump_err, daemon=True)]
            for t in self._threads:
                t.start()
        except BaseException:
            spawn.kill_group(self.proc.pid)
            raise

    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.put(line)
            self.observe(line)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # output closed, process alive: the runner's wait reports it
            code = None
        if code is not None:
            for line in self.after_exit(code):
                self.put(line)
        self.put(None)

    def observe(self, line: str) -> None:
        """Called with every line of the worker's standard output (launchers may watch for events)."""

    def after_exit(self, code: int) -> list[str]:
        """Protocol lines added once the process has exited: the total wall time of the trial's process,
        launch to exit (what a user waits for a short job, start-up and teardown included)."""
        from gpuvs import events

        return [events.encode(events.startup("launch_to_exit_s", time.time() - self.started_at)) + "\n"]

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip("\n"))

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=2)
        return code

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after a grace period, then the launcher's own
        clean-up (a container's removal, say). Safe to call more than once."""
        if self._killed:
            return
        self._killed = True
        try:
            spawn.end_group(self.proc, grace_s)
        finally:
            if self.on_kill:
                self.on_kill()

    def close(self) -> None:
        """After a normal exit: make sure no process of the group is left."""
        spawn.kill_group(self.proc.pid)
        if self.on_kill:
            self.on_kill()


class Environment:
    """One kind of environment. A subclass declares, as class attributes, everything the rest of gpuvs
    needs to know about its kind (the registry in environments/__init__.py reads them), and implements
    check (before anything starts), launch (one worker) and doctor (what `gpuvs doctor` shows)."""

    kind: ClassVar[str]  # the --env value
    summary: ClassVar[str] = ""  # one line for help
    noun: ClassVar[str] = ""  # how messages name where the worker runs: "the host", "a container"
    rank: ClassVar[int] = 50  # order in help and listings
    # The options this kind takes (typed, with defaults, limits and help), on the command line, in
    # an arm or at an experiment file's top level. Kinds may share an option name when it means the
    # same thing (--image, --memory): the type and `multiple` must then agree.
    params: ClassVar[tuple[Param, ...]] = ()
    # Option keys gpuvs itself sets on an EnvSpec (not user options), e.g. the MPS pipe folder.
    internal_keys: ClassVar[tuple[str, ...]] = ()
    # True where the worker runs on this machine, so this machine's GPUs are the ones it gets.
    local: ClassVar[bool] = True
    # Fingerprint fields this kind adds, shown side by side in comparisons: (dotted key, label).
    fingerprint_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
    # Option -> fingerprint fields a difference in which that option explains (not flagged when an
    # arm varies the option). "*" means every key field (the worker may run on another machine).
    explains: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Where a trial's GPUs are looked for, in the note printed when none is found ("here").
    gpus_where: ClassVar[str] = "here"
    # True where start_bare() runs a command as the environment's own process (the command workload's --bare).
    runs_bare: ClassVar[bool] = False
    # How trials can start here (launch.py): "exec" (a fresh worker per trial) always; "fork" (a fresh child
    # of a zygote that paid the imports once) where the kind can hold a zygote (start_zygote), and whether
    # --fresh auto picks it. `fork_refusal` says why a kind cannot (one line, for --fresh fork).
    forks: ClassVar[bool] = False
    forks_by_default: ClassVar[bool] = False
    fork_refusal: ClassVar[str] = "it cannot hold a zygote"

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})
        self._settings: Any = None

    @property
    def settings(self) -> Any:
        """This kind's typed settings, made once from its options (parse_settings), each option given its declared
        default (the Param's) where it was not given: a default is stated once, in the Param."""
        if self._settings is None:
            given = {k: v for k, v in self.options.items() if v is not None}
            self._settings = self.parse_settings({**{p.name: p.default for p in self.params}, **given})
        return self._settings

    @classmethod
    def parse_settings(cls, options: dict[str, Any]) -> Any:
        """The kind's typed settings from its options (every declared one present, with its default); refuses
        bad values with a UsageError. A kind with settings of its own overrides this (a dataclass of them)."""
        return options

    @classmethod
    def label(cls, options: dict[str, Any]) -> str:
        """A short name of this environment with these options, for progress lines and tables."""
        return cls.kind

    def gpu_count(self) -> int | None:
        """GPUs a worker could get here (None: cannot tell now; check() will say why)."""
        from gpuvs.probes import fingerprint

        return fingerprint.gpu_count()

    def check(self, spec: RunSpec) -> None:
        """Refuse a spec this environment cannot run, before anything starts (raise GpuvsError)."""

    def launch(self, spec: RunSpec) -> WorkerStream:
        raise NotImplementedError

    def start_bare(self, spec: RunSpec, argv: list[str], workdir: str | None) -> Any:
        """Bare mode (the command workload on an image without Python): the command as this environment's own
        process, without gpuvs's worker; a RawJob (environments/rawjob.py). Kinds that cannot, refuse."""
        raise UsageError(f"--bare: {self.noun or self.kind} cannot run a command bare")

    def workdir_note(self, workdir: str | None) -> str | None:
        """A warning where a command without --workdir starts elsewhere than in gpuvs's working directory (where a
        host arm starts it) and relative paths differ; None where it starts there (or was given one)."""
        return None

    def missing_executable(self, spec: RunSpec, name: str, workdir: str | None) -> str | None:
        """Why the command's executable cannot be found where the worker runs, in one line; None where it is
        found, or where that cannot be told before the trial (inside an image)."""
        return None

    def start_zygote(self, spec: RunSpec, args: list[str], folder: str) -> Launched:
        """Start `python -m gpuvs.trial.zygote ARGS` here, for the trials of specs like this one (forks): with the
        environment a worker of this spec would get, and `folder` (where the zygote's control socket is)
        reachable at the same path. Its clean-up is the returned process's kill()."""
        raise NotImplementedError

    def doctor(self, spec: RunSpec, report: "checkup.Report", timeout: float) -> dict[str, Any] | None:
        """Add this environment's checks to the report; return what a probe inside reported
        (`python -m gpuvs.trial.inside --probe`), or None when no probe ran."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.kind


def check_local_gpus(spec: RunSpec) -> None:
    """For workers that run on this machine: refuse a cuda device this machine does not have."""
    from gpuvs.probes import fingerprint
    from gpuvs.spec import device_kind

    if device_kind(spec.device) != "cuda":
        return
    count = fingerprint.gpu_count()
    if count == 0:
        raise UsageError(f"device {spec.device} asked for, but this machine has no usable NVIDIA GPU "
                         "(use --device cpu)")
    _, _, index = spec.device.partition(":")
    if index and int(index) >= count:
        raise UsageError(f"device {spec.device} asked for, but only {count} GPU(s) are present (0..{count - 1})")
    if spec.num_gpus > count:
        raise UsageError(f"--num-gpus {spec.num_gpus} asked for, but only {count} GPU(s) are present")
