"""The one command-line parser: `--name value`, `--name=value`, flags, `-o` aliases, repeats, `--` before positionals.

Every command goes through parse(): its options and a workload's parameters are parsed together.
So an unknown option is refused with the known ones listed, and every value is checked by its Param first.
Bad input is a UsageError: one line, exit 2."""

from __future__ import annotations

import shlex
from typing import Any, Sequence

from gpuvs import workloads
from gpuvs.cli.declaration import Args, Command, Form
from gpuvs.errors import UsageError
from gpuvs.params import Param, did_you_mean

HELP = ("--help", "-h")
HELP_ALL = "--help-all"  # every option of every environment kind, with its allowed values
_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def find(groups: Sequence[Sequence[Param]], option: str) -> Param | None:
    """The Param an option names (`--batch-size`, `-o`): the first group that knows the name wins."""
    short = not option.startswith("--")
    name = option.lstrip("-").replace("-", "_")
    for group in groups:
        for p in group:
            if short:
                if len(name) == 1 and name in p.aliases:
                    return p
            elif name == p.name or (name in p.aliases and len(name) > 1):
                return p
    return None


class UnknownOption(UsageError):
    """An option no group knows (`option`, as written before any '=')."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def split(args: list[str], groups: Sequence[Sequence[Param]], positional: int = 1, what: str = "this command",
          runs: dict[str, int] | None = None) -> tuple[list[str], dict[Param, Any]]:
    """Split args into positionals (at most `positional`) and raw option values keyed by the Param
    that owns them. Values are checked later, by that Param. `runs`: options that take up to N values
    in a row (`--stored A B`), each kept as if the option had been given once per value."""
    positionals: list[str] = []
    values: dict[Param, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            positionals.extend(args[i + 1:])
            break
        if tok.startswith("--") and len(tok) > 2 or _short(tok):
            opt, eq, val = tok.partition("=") if tok.startswith("--") else (tok, "", "")
            p = find(groups, opt)
            if p is None and _short(tok):
                raise UsageError(f"unknown option {tok} for {what} (options are spelled --name value)")
            if p is None:
                raise UnknownOption(opt, unknown_option(opt, what, groups))
            n = (runs or {}).get(p.name, 0)
            if n and not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                while n and i + 1 < len(args) and not args[i + 1].startswith("--"):
                    i, n = i + 1, n - 1
                    values.setdefault(p, []).append(args[i])
            else:
                i = _store(values, p, args, i, opt, eq, val)
        elif tok.startswith("-") and len(tok) > 1 and not _is_number(tok):
            raise UsageError(f"unknown option {tok} for {what} (options are spelled --name value)")
        else:
            positionals.append(tok)
        i += 1
    if len(positionals) > positional:
        raise UsageError(f"unexpected argument {positionals[positional]!r} for {what}")
    return positionals, values


FEW = 8  # a command with at most this many options lists them all in the refusal of an unknown one


def unknown_option(opt: str, what: str, groups: Sequence[Sequence[Param]]) -> str:
    """The refusal of an option no group knows: the closest few names, and the options themselves where they are
    few; else where to find them (a list of 60 names on one line helps no one)."""
    options = list(dict.fromkeys(q.option for g in groups for q in g))
    if not options:
        return f"unknown option {opt} for {what}, which takes none"
    spelt = [n.replace("_", "-") for g in groups for q in g for n in (q.name, *q.aliases) if len(n) > 1]
    hint = did_you_mean(opt[2:], spelt, n=3, prefix="--")  # names compared without their --, shown with it
    listed = f"options: {', '.join(options)}" if len(options) <= FEW else f"{what} --help lists its options"
    return f"unknown option {opt} for {what}{hint}; {listed}"


def _short(tok: str) -> bool:
    return len(tok) == 2 and tok[0] == "-" and tok[1].isalpha()


def _store(values: dict[Param, Any], p: Param, args: list[str], i: int, opt: str, eq: str, val: str) -> int:
    """Record the value of option `p` found at args[i] (its value inline, next, or a flag's); the index
    of the last token it used."""
    if p.type is bool and not eq:
        # a flag; a following true/false word is its value (--check false)
        if i + 1 < len(args) and args[i + 1].lower() in _BOOL_WORDS:
            i += 1
            val = args[i]
        else:
            val = "true"
    elif not eq:
        if i + 1 >= len(args):
            raise UsageError(f"{opt} needs a value: {p.describe_allowed()}")
        i += 1
        val = args[i]
    if p.multiple:
        values.setdefault(p, []).append(val)
    else:
        values[p] = val
    return i


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def workload_position(args: list[str], params: Sequence[Param]) -> int | None:
    """Index of the workload name: the first word that is neither an option nor an option's value."""
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":  # what follows is not gpuvs's (a command's own words)
            return None
        if not tok.startswith("-"):
            return i
        p = find((params,), tok.partition("=")[0])
        if p is not None and p.type is not bool and "=" not in tok:
            i += 1
        i += 1
    return None


def _after_dashes(exc: UsageError, rest: list[str], words: list[str], groups: Sequence[Sequence[Param]],
                  prefix: str, positional: int) -> UsageError:
    """A command line given without `--` (or partly before it) to a workload that takes one (`gpuvs run command
    python3 x.py --foo`): the refusal says to put the command after --, with the user's own words where they show
    where it starts (the first word no option takes; `words`: those already after --), one line."""
    at = workload_position(rest, [p for g in groups for p in g])
    for _ in range(positional):  # the command's own positionals (none for run and compare) are gpuvs's words
        at = None if at is None else next((j for j in range(at + 1, len(rest)) if not rest[j].startswith("-")), None)
    unknown = isinstance(exc, UnknownOption)
    if at is not None and (unknown or str(exc).startswith("unexpected argument")):
        what = f"unknown option {exc.option}" if unknown else f"unexpected argument {rest[at]!r}"
        return UsageError(f"{what} for {prefix}: put the command after --, e.g. "
                          f"{' '.join([prefix, *map(shlex.quote, rest[:at])])} -- {shlex.join(rest[at:] + words)}")
    if unknown and "did you mean" not in str(exc):
        head, _, listed = str(exc).partition("; ")
        return UsageError(f"{head}; if it is the command's own, put the command after --: {prefix} [options] -- "
                          f"PROGRAM {exc.option} ...; {listed}")
    if str(exc).startswith("unexpected argument"):
        return UsageError(f"{exc}: the command's own words go after --, e.g. {prefix} [options] -- PROGRAM ARGS...")
    return exc


def form_of(cmd: Command, argv: list[str]) -> Form | None:
    """The form a command line selects: the first whose marker option it gives, else None (the command's own)."""
    for form in cmd.forms:
        option = "--" + form.marker.replace("_", "-")
        if any(a == option or a.startswith(option + "=") for a in argv):
            return form
    return None


class HelpWanted(Exception):
    """--help, -h, or no arguments where that shows the help: render it for this command (and workload)."""

    def __init__(self, command: Command, path: str, workload=None, full: bool = False):
        super().__init__(path)
        self.command, self.path, self.workload, self.full = command, path, workload, full


def parse(cmd: Command, argv: list[str], path: str) -> Args:
    """Parse and check a command line (the words after `path`, e.g. "gpuvs results show").
    Raises HelpWanted when the help is asked for, UsageError on bad input."""
    if not argv and cmd.help_when_bare:
        raise HelpWanted(cmd, path)
    mine = argv[:argv.index("--")] if "--" in argv else argv
    full = HELP_ALL in mine
    wants_help = full or any(a in HELP for a in mine)
    form = form_of(cmd, argv)
    static = cmd.params(form)
    specs = form.positionals if form is not None else cmd.positionals
    rest = list(argv)
    workload = None
    what = f"{path} --{form.marker.replace('_', '-')}" if form is not None else path
    if form is not None and form.workload is not None:
        if wants_help:
            raise HelpWanted(cmd, path, full=full)
        workload = form.workload(argv)
    elif specs and specs[0].workload:
        at = workload_position(argv, static)
        if at is None:
            if wants_help:
                raise HelpWanted(cmd, path, full=full)
            raise UsageError(f"{path} needs a workload; known workloads: {', '.join(workloads.names())}")
        workload = workloads.get(argv[at])
        if wants_help:
            raise HelpWanted(cmd, path, workload, full=full)
        rest = argv[:at] + argv[at + 1:]
        specs = specs[1:]
        what = f"{path} {workload.name}"
    elif wants_help:
        raise HelpWanted(cmd, path, full=full)
    groups: list[Sequence[Param]] = [static] + ([workload.params] if workload is not None else [])
    words = None  # a command line given after `--` to a workload that takes one (gpuvs run command -- ARGV...)
    if workload is not None and workload.argv_param and "--" in rest:
        at = rest.index("--")
        rest, words = rest[:at], rest[at + 1:]
    try:
        positionals, values = split(rest, groups, positional=len(specs), what=what,
                                    runs=form.runs if form is not None else None)
    except UsageError as exc:
        if workload is not None and workload.argv_param:
            raise _after_dashes(exc, rest, words or [], groups, path if form is not None else what,
                                len(specs)) from None
        raise
    required = [s for s in specs if s.required]
    if len(positionals) < len(required):  # lowercase and no full stop, as every other error
        missing = required[len(positionals)]
        raise UsageError(f"missing argument {missing.name.upper()} for {what}"
                         + (f": {missing.help}" if missing.help else ""))
    for p in static:
        if p.required and p not in values:
            raise UsageError(f"missing option {p.option} for {what}" + (f": {p.help}" if p.help else ""))
    options = {p.name: p.coerce(values[p]) if p in values else p.default for p in static}
    given = frozenset(p.name for p in static if p in values)
    params = {p.name: values[p] for p in workload.params if p in values} if workload is not None else {}
    if words is not None:
        params[workload.argv_param] = words
    return Args(cmd, list(argv), positionals, options, given, workload, params, form)
