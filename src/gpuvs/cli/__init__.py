"""The gpuvs command line: thin; it parses, calls the library and renders.

Every command is a module of gpuvs.cli.commands declaring its options as Params (command.py).
One parser (parser.py) and one help renderer (help.py) serve them all; common.py and options.py hold shared helpers.
main() finds the command by name, parses and runs it, and turns what went wrong into one line and an exit status."""

from __future__ import annotations

import signal
import sys

from gpuvs.cli import commands, help, parser
from gpuvs.cli.declaration import Command
from gpuvs.errors import GpuvsError, Stopped, UsageError
from gpuvs.params import did_you_mean
from gpuvs.safetext import safe_text

GPUVS = Command("gpuvs", "gpuvs: how your GPU jobs really perform, compared with numbers you can trust.")


def dispatch(argv: list[str]) -> int | None:
    """Find the command (and sub-command) named by argv, parse the rest, run it. A command that runs
    itself and has sub-commands too (`gpuvs fleet WORKLOAD`, `gpuvs fleet history`) takes the first word
    as a sub-command where it names one, else runs itself with the rest."""
    path, cmd, rest = "gpuvs", None, list(argv)
    while cmd is None or cmd.subcommands:
        if cmd is not None and cmd.run is not None and not (rest and cmd.subcommand(rest[0])):
            break
        if not rest or rest[0] in (*parser.HELP, parser.HELP_ALL):
            if cmd is None:
                help.group_help(GPUVS, path, commands=commands.all_commands())
            else:
                help.group_help(cmd, path)
            return 0
        word = rest[0]
        if word.startswith("-"):
            known = commands.names() if cmd is None else [c.name for c in cmd.subcommands]
            raise UsageError(f"unknown option {word.partition('=')[0]} for {path}; give a command first: "
                             + ", ".join(known))
        found = commands.get(word) if cmd is None else cmd.subcommand(word)
        if found is None:
            known = commands.names() if cmd is None else [c.name for c in cmd.subcommands]
            raise UsageError(f"no such command {word!r}{did_you_mean(word, known)}")
        cmd, path, rest = found, f"{path} {word}", rest[1:]
    try:
        args = parser.parse(cmd, rest, path)
    except parser.HelpWanted as wanted:
        help.command_help(wanted.command, wanted.path, wanted.workload, full=wanted.full)
        return 0
    assert cmd.run is not None, f"{path} has neither sub-commands nor a run function"
    return cmd.run(args)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and a non-zero exit, never a traceback."""
    # Ctrl-C must interrupt even where the parent started us with SIGINT ignored (background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGTERM (Kubernetes, Slurm, `timeout`) and SIGHUP (the terminal went away) do what Ctrl-C does.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        code = dispatch(sys.argv[1:] if argv is None else list(argv))
        if isinstance(code, int) and code:
            sys.exit(code)
    except GpuvsError as exc:
        print(f"gpuvs: error: {safe_text(exc, lines=True)}", file=sys.stderr)  # may quote a job's output
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _interrupted(130)
    except BrokenPipeError:
        sys.exit(1)
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
    # what stopped us is kept aside: a clean-up path may have turned our Stopped into a plain KeyboardInterrupt
    if _STOPPED:
        print(f"gpuvs: stopped by {_STOPPED[0].signame}; finished trials are kept in the store", file=sys.stderr)
        sys.exit(_STOPPED[0].exit_code)
    print("gpuvs: interrupted; finished trials are kept in the store", file=sys.stderr)
    sys.exit(code)
