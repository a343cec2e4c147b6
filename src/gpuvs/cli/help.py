"""The one help renderer: a command's usage lines, then one table per option group (option, default,
allowed values, meaning), from what the command declares (command.py). A command never prints its
own help."""

from __future__ import annotations

import textwrap
from typing import Sequence

from rich.console import Console
from gpuvs.report.fit import Table

from gpuvs import workloads
from gpuvs.cli.declaration import Command
from gpuvs.params import Param


def options_table(title: str, params: Sequence[Param], full: bool = True) -> Table:
    """Option, default, allowed values and meaning of a group of Params; short (`full` False): option and meaning,
    with the default, in two columns that fit a terminal without stacking."""
    t = Table(title=title, title_justify="left") if full else Table(
        title=title, title_justify="left", box=None, show_header=False, pad_edge=False, padding=(0, 1))
    t.add_column("option", no_wrap=True)  # an option's name is never cut: it is what the user types
    for col in ("default", "allowed", "meaning") if full else ("meaning",):
        t.add_column(col)
    for p in params:
        shorts = [f"-{a}" for a in p.aliases if len(a) == 1]
        default = "required" if p.required else "-" if p.default in (None, "") else str(p.default)
        if full:
            t.add_row(", ".join([p.option] + shorts), default, p.describe_allowed(), p.help)
        else:
            plain = default == "-" or p.type is bool and default == "False"  # a flag is off unless given
            t.add_row("  " + ", ".join([p.option] + shorts), p.help + ("" if plain else f" (default: {default})"))
    return t


def usage(prefix: str, line: str, width: int) -> str:
    """A usage line wrapped at the page's width between its words, never inside one (an option's syntax is
    what the user types), the rest indented under the command's arguments."""
    indent = " " * min(len(prefix), width // 2)
    return "\n".join(textwrap.wrap(prefix + line, max(width, 20), subsequent_indent=indent,
                                   break_long_words=False, break_on_hyphens=False))


def param_table(w: workloads.Workload, full: bool = True) -> Table:
    """A workload's parameters: every column (gpuvs workloads NAME, --help-all), or option and meaning."""
    return options_table(f"{w.name}: {w.summary}", w.params, full)


def console() -> Console:
    return Console(markup=False, highlight=False)


def command_help(cmd: Command, path: str, workload: workloads.Workload | None = None,
                 out: Console | None = None, full: bool = False) -> None:
    """A command's help: usage (one line per form), what it does, its workload's parameters where it
    takes a workload, its arguments, its option groups. Short unless `full` (--help-all): option and meaning
    only, and each environment kind's options as one line that names how many there are."""
    out = out or console()
    if cmd.subcommands and cmd.run is None:
        return group_help(cmd, path, out)
    lines = cmd.usage_lines() + [f"{sub.name} {sub.usage_lines()[0]}" for sub in cmd.subcommands]
    out.print("\n".join(usage(("usage: " if i == 0 else "       ") + f"{path} ", line, out.width)
                        for i, line in enumerate(lines)))
    out.print(cmd.summary)
    if cmd.notes:
        out.print(cmd.notes)
    if any(p.workload for p in cmd.positionals):
        if workload is None:
            out.print(f"workloads: {', '.join(workloads.names())}  (gpuvs workloads NAME shows one's options)")
        else:
            out.print(param_table(workload, full))
    shown = [p for p in cmd.positionals if p.help and not p.workload]
    if shown:
        t = Table(title="arguments", title_justify="left")
        for col in ("argument", "meaning"):
            t.add_column(col)
        for p in shown:
            t.add_row(p.name.upper(), p.help + ("" if p.required else " (optional)"))
        out.print(t)
    owned: dict[str, str] = {}  # option name -> key of the group that owns it (the first to declare it)
    kinds: list[str] = []  # the environment kinds whose options the short help leaves out
    for g in cmd.groups:
        taken = [f"{p.option} is the {owned[p.name]}'s here" for p in g.params
                 if owned.get(p.name, g.key) != g.key]
        if not full and g.key == "env" and g.title.startswith("--env "):
            kinds.append(f"{g.title.split(' ')[1]} ({len(g.params)})")
        else:
            out.print(options_table(g.title + (f" ({'; '.join(taken)})" if taken else ""), g.params, full))
        for p in g.params:
            owned.setdefault(p.name, g.key)
    if kinds:
        out.print(usage("", f"Options of each --env kind: {', '.join(kinds)}; {path} --help-all lists them, "
                        "and every option's allowed values.", out.width))
    elif not full:
        out.print(usage("", f"{path} --help-all lists every option's allowed values.", out.width))
    if cmd.subcommands:
        out.print(commands_table(cmd.subcommands, f"sub-commands ({path} COMMAND --help lists one's options)"))


def group_help(cmd: Command, path: str, out: Console | None = None, commands: Sequence[Command] | None = None) -> None:
    """The help of a command made of sub-commands (and of gpuvs itself): one line per command."""
    out = out or console()
    out.print(f"usage: {path} COMMAND [options]   ({path} COMMAND --help lists a command's options)")
    out.print(cmd.summary)
    out.print(commands_table(commands if commands is not None else cmd.subcommands))


def commands_table(cmds: Sequence[Command], title: str = "commands") -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("command", "what it does"):
        t.add_column(col)
    for sub in cmds:
        t.add_row(sub.name, sub.summary)
    return t
