"""The gpuvs command line: thin; it parses, calls the library and renders.
Each module of this package adds its commands to `app`."""

from __future__ import annotations

import signal
import sys

import click
import typer

from gpuvs.errors import GpuvsError

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


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and a non-zero exit, never a traceback."""
    # Ctrl-C must interrupt even where the parent started us with SIGINT ignored (background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = app(args=argv, standalone_mode=False)
        if code == 130:  # click turns Ctrl-C into a return value here
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
    except GpuvsError as exc:
        print(f"gpuvs: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError:
        sys.exit(0)
    except click.ClickException as exc:
        print(f"gpuvs: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        print("gpuvs: interrupted; finished trials are kept in the store", file=sys.stderr)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(1)
    sys.exit(0)
