"""What a command declares: its options (Params, in titled groups), positionals, other forms, sub-commands, function.

Every command of gpuvs is one of these, in one module of gpuvs.cli.commands.
The parser (parser.py) and the help renderer (help.py) read nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from gpuvs.params import Param

if TYPE_CHECKING:
    from gpuvs.workloads import Workload


class Group(NamedTuple):
    """A titled group of options, one table in the help. `key` names the group for the command that
    reads it (args.group("run")): the same Params may be shown under several titles."""

    title: str
    params: tuple[Param, ...]
    key: str = ""


@dataclass(frozen=True)
class Positional:
    name: str  # upper-cased in the usage line and in messages ("missing argument IDENT for gpuvs report")
    help: str = ""
    required: bool = True
    workload: bool = False  # names a workload: its parameters are options of the command from there on


@dataclass(frozen=True)
class Form:
    """Another way of calling a command, chosen by an option on the command line (gpuvs compare
    --stored A B, gpuvs compare --file X.yaml)."""

    marker: str  # the option (a Param name) whose presence selects this form
    usage: str  # after "gpuvs NAME "
    options: tuple[str, ...] | None = None  # the command's options this form takes (None: all of them)
    positionals: tuple[Positional, ...] = ()
    # where the workload comes from when not a positional (e.g. a file the options name): argv -> Workload
    workload: Callable[[list[str]], "Workload"] | None = None
    runs: dict[str, int] = field(default_factory=dict)  # options that take up to N values in a row (--stored A B)


@dataclass(frozen=True)
class Command:
    name: str  # as typed: "share-matrix"; its module is gpuvs.cli.commands.share_matrix
    summary: str  # one line, in `gpuvs --help`
    run: Callable[["Args"], int | None] | None = None  # None for a command made of sub-commands
    groups: tuple[Group, ...] = ()
    positionals: tuple[Positional, ...] = ()
    usage: str = ""  # after "gpuvs NAME ", a line per way of calling it; default: the positionals and "[options]"
    notes: str = ""  # printed under the usage line in the help
    forms: tuple[Form, ...] = ()
    subcommands: tuple["Command", ...] = ()
    help_when_bare: bool = False  # no arguments at all: show the help (exit 0) rather than run

    def params(self, form: Form | None = None) -> tuple[Param, ...]:
        """The options, in declared order, one per name (the first group that declares a name owns it)."""
        seen: dict[str, Param] = {}
        for g in self.groups:
            for p in g.params:
                seen.setdefault(p.name, p)
        if form is not None and form.options is not None:
            return tuple(seen[n] for n in form.options)
        return tuple(seen.values())

    def owner(self, name: str) -> Group | None:
        """The group that owns an option name (the first that declares it)."""
        return next((g for g in self.groups if any(p.name == name for p in g.params)), None)

    def usage_lines(self) -> list[str]:
        first = self.usage or " ".join([p.name.upper() if p.required else f"[{p.name.upper()}]"
                                        for p in self.positionals] + (["[options]"] if self.groups else []))
        return first.split("\n") + [f.usage for f in self.forms]

    def subcommand(self, name: str) -> "Command | None":
        return next((c for c in self.subcommands if c.name == name), None)


@dataclass
class Args:
    """A command line, parsed and checked: what a command's run function receives."""

    command: Command
    argv: list[str]  # as given after the command's name
    positionals: list[str]
    options: dict[str, Any]  # every option the command (form) takes, by name: checked value or default
    given: frozenset[str]  # names of the options given on the command line
    workload: "Workload | None" = None
    params: dict[str, Any] = field(default_factory=dict)  # the workload's parameters given, unchecked
    form: Form | None = None

    def __getitem__(self, name: str) -> Any:
        return self.options[name]

    def group(self, key: str) -> dict[str, Any]:
        """Values of the options owned by the command's groups with this key (defaults filled)."""
        out: dict[str, Any] = {}
        for name, value in self.options.items():
            owner = self.command.owner(name)
            if owner is not None and owner.key == key:
                out[name] = value
        return out
