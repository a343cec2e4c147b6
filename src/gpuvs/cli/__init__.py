"""The gpuvs command line: thin; it parses, calls the library and renders.
Each module of this package adds its commands to `app`."""

from __future__ import annotations

import signal
import sys

import typer

from gpuvs.errors import GpuvsError, Stopped

app = typer.Typer(help="gpuvs: how your GPU jobs really perform, compared with numbers you can trust.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
results_app = typer.Typer(help="Stored results: list, show, export.", no_args_is_help=True)
app.add_typer(results_app, name="results")


def _load_commands() -> None:
    """Every module of this package registers its commands when imported."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_load_commands()


def _click_error(exc: BaseException) -> str | None:
    """The class name of a click-style exception, whichever click raised it: typer up to 0.2x raised
    click's own, later typer releases raise those of a copy vendored as typer._click (and no longer
    install click). Matching by name and shape keeps one-line errors under both."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("click", "typer"):
            return type(exc).__name__
    return None


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and a non-zero exit, never a traceback."""
    # Ctrl-C must interrupt even where the parent started us with SIGINT ignored (background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGTERM (Kubernetes, Slurm, `timeout`) and SIGHUP (the terminal went away) do what Ctrl-C does.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        code = app(args=argv, standalone_mode=False)
        if code == 130:  # click turns Ctrl-C into a return value here
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
    except GpuvsError as exc:
        print(f"gpuvs: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _interrupted(130)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as exc:
        name = _click_error(exc)
        if name is None:
            raise
        if name == "NoArgsIsHelpError":
            sys.exit(0)
        if name == "Abort":
            _interrupted(130)
        if name == "Exit":
            sys.exit(getattr(exc, "exit_code", 0))
        if hasattr(exc, "format_message"):  # ClickException: UsageError, BadParameter, NoSuchOption...
            print(f"gpuvs: error: {exc.format_message()}", file=sys.stderr)
            sys.exit(getattr(exc, "exit_code", 2) or 2)
        raise
    sys.exit(0)


_STOPPED: list[Stopped] = []


def _stop(signum: int, frame) -> None:
    """The first SIGTERM/SIGHUP stops the run like Ctrl-C; later ones are ignored so that clean-up
    (workers, containers, pods, MPS daemons) is not cut short halfway."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _noted)  # a Python handler, not SIG_IGN: processes started now must not inherit it
    _STOPPED.append(Stopped(signum))
    raise _STOPPED[-1]


def _noted(signum: int, frame) -> None:
    pass


def _interrupted(code: int) -> None:
    # click turns a KeyboardInterrupt (ours included) into Abort or a return value: what stopped us is kept aside
    if _STOPPED:
        print(f"gpuvs: stopped by {_STOPPED[0].signame}; finished trials are kept in the store", file=sys.stderr)
        sys.exit(_STOPPED[0].exit_code)
    print("gpuvs: interrupted; finished trials are kept in the store", file=sys.stderr)
    sys.exit(code)
