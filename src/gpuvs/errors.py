"""Errors that the CLI turns into one clear line and an exit status."""


class GpuvsError(Exception):
    """A problem the user can fix; shown as one line. exit_code 2 = bad input, nothing started."""

    exit_code = 2


class UsageError(GpuvsError):
    """Bad input: unknown workload, parameter, value, device. Nothing was started."""


class EnvironmentUnavailable(GpuvsError):
    """The environment asked for cannot run here (engine missing, GPU not visible...)."""


class RunFailed(GpuvsError):
    """Something was measured, but at least one trial failed."""

    exit_code = 1


class NoVerdict(GpuvsError):
    """Everything measured is stored, but no verdict is given (compare --strict: arms ran different programs)."""

    exit_code = 1


class Stopped(KeyboardInterrupt):
    """gpuvs was told to stop from outside (SIGTERM from Kubernetes, Slurm or `timeout`; SIGHUP when its
    terminal went away). A KeyboardInterrupt, so that every clean-up path of Ctrl-C runs for it too."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signame}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def interruption(exc: BaseException) -> str:
    """What stopped a run, for the trial's stored error."""
    return f"gpuvs was stopped by {exc.signame}" if isinstance(exc, Stopped) else "interrupted by the user"


class WorkloadError(Exception):
    """Raised inside a worker for a failure with a plain explanation.
    kind: oom | input | unavailable | crash (see events.py)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


# Worker exit statuses, by error kind.
EXIT_CODES = {"input": 2, "oom": 3, "unavailable": 4, "crash": 1}
