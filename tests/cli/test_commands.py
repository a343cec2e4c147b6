"""Every command, read from the command registry, so that a new command module is covered with no change here.

Its --help lists every option and form it declares.
Bad input is one line on stderr and exit 2, with nothing on stdout, no store written and no process started.
gpuvs runs in this process, through main() as `python -m gpuvs` does (tests/cli/test_cli.py runs it as a process)."""

from __future__ import annotations

import re
import signal

import pytest

from conftest import gpuvs_processes
from gpuvs import workloads
from gpuvs.cli import commands, main
from gpuvs.cli.declaration import Command


def every_command() -> list[tuple[str, Command]]:
    out = []
    for cmd in commands.all_commands():
        out.append((f"gpuvs {cmd.name}", cmd))
        out += [(f"gpuvs {cmd.name} {sub.name}", sub) for sub in cmd.subcommands]
    return out


COMMANDS = every_command()
LEAVES = [(path, cmd) for path, cmd in COMMANDS if cmd.run is not None]  # those that run (gpuvs fleet as well)
GROUPS = [(path, cmd) for path, cmd in COMMANDS if cmd.run is None]  # made of sub-commands only (gpuvs results)
SAMPLE_WORKLOAD = "selftest"


def words(path: str) -> list[str]:
    return path.split()[1:]


def positionals(cmd: Command) -> list[str]:
    """Values for a command's required positionals: enough to reach its options."""
    return [SAMPLE_WORKLOAD if p.workload else "x" for p in cmd.positionals if p.required]


def required(cmd: Command) -> list[str]:
    """Its required options, given."""
    return [f"{p.option}=x" for p in cmd.params() if p.required]


def what(path: str, cmd: Command) -> str:
    """How messages name the command: with its workload, where it takes one."""
    return f"{path} {SAMPLE_WORKLOAD}" if any(p.workload for p in cmd.positionals) else path


def all_params(cmd: Command):
    return cmd.params()


@pytest.fixture
def gpuvs(monkeypatch, tmp_path, capsys):
    """gpuvs ARGS in this process: (exit status, stdout, stderr). Wide output, so that no option is wrapped."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def run(*args: str) -> tuple[int, str, str]:
        code = None
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
        finally:
            for s, handler in saved.items():  # main() installs its own; pytest's come back
                signal.signal(s, handler)
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    assert not (tmp_path / "gpuvs.db").exists(), "bad input or --help wrote a store"


def lists_option(out: str, option: str) -> bool:
    """The help has a row for this option (its first column): a table's (--help-all) or the short list's."""
    return re.search(rf"^(│ |  ){re.escape(option)}[ ,]", out, re.M) is not None


def kind_options(cmd: Command) -> set[str]:
    """The options only an environment kind's group declares: the short help names their count, not them."""
    own = {p.option for g in cmd.groups if not g.title.startswith("--env ") for p in g.params}
    return {p.option for g in cmd.groups if g.title.startswith("--env ") for p in g.params} - own


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_command_explains_itself(gpuvs, path, cmd):
    for flag in ("--help", "-h", "--help-all"):
        code, out, err = gpuvs(*words(path), *positionals(cmd), flag)
        assert (code, err) == (0, ""), err
        assert out.startswith(f"usage: {path} ") and cmd.summary in out
        for sub in cmd.subcommands:
            assert re.search(rf"^│ {sub.name} +│ {re.escape(sub.summary[:40])}", out, re.M), sub.name
        left_out = kind_options(cmd) if flag != "--help-all" else set()
        missing = [p.option for p in all_params(cmd) if p.option not in left_out and not lists_option(out, p.option)]
        assert missing == [], f"{path} {flag} does not list {missing}"
        assert not [o for o in left_out if lists_option(out, o)], f"{path} {flag} lists an environment kind's options"
        for g in cmd.groups:
            if left_out and g.title.startswith("--env "):
                assert f"{g.title.split()[1]} ({len(g.params)})" in out and f"{path} --help-all lists them" in out
        for p in cmd.params():
            if any(len(a) == 1 for a in p.aliases) and p.option not in left_out:
                assert re.search(rf"^(│ |  ){p.option}, -{p.aliases[0]} ", out, re.M)
        for form in cmd.forms:
            assert f"{path} {form.usage}" in out
        for p in cmd.positionals:
            if p.help and not p.workload:
                assert re.search(rf"^│ {p.name.upper()} +│ {re.escape(p.help[:40])}", out, re.M)


@pytest.mark.parametrize("path, cmd", [(p, c) for p, c in LEAVES if any(x.workload for x in c.positionals)],
                         ids=[p for p, c in LEAVES if any(x.workload for x in c.positionals)])
def test_a_workload_commands_help_lists_the_workloads_or_one_workloads_parameters(gpuvs, path, cmd):
    code, out, _ = gpuvs(*words(path), "--help")
    assert code == 0 and "workloads: " + ", ".join(workloads.names()) in out
    code, out, _ = gpuvs(*words(path), SAMPLE_WORKLOAD, "--help")
    w = workloads.get(SAMPLE_WORKLOAD)
    assert code == 0 and f"{w.name}: {w.summary}" in out
    assert [p.option for p in w.params if not lists_option(out, p.option)] == []


def bad(gpuvs, args: list[str], message: str) -> str | None:
    """None when `gpuvs ARGS` is refused as bad input should be (one line that starts lowercase and ends without a
    full stop, as every error does), else what went wrong."""
    code, out, err = gpuvs(*args)
    lines = [line for line in err.splitlines() if line.strip()]
    if (code != 2 or out or len(lines) != 1 or not lines[0].startswith("gpuvs: error: ") or message not in lines[0]
            or lines[0][len("gpuvs: error: "):][:1].isupper() or lines[0].endswith(".")):  # the house style
        return f"gpuvs {' '.join(args)}: exit {code}, stdout {out[:200]!r}, stderr {err[:400]!r} (wanted {message!r})"
    return None


@pytest.mark.parametrize("path, cmd", LEAVES, ids=[p for p, _ in LEAVES])
def test_bad_input_to_every_command_is_one_line_and_exit_2(gpuvs, path, cmd):
    base = words(path) + positionals(cmd) + required(cmd)
    cases = [(base + ["--no-such-option"], f"unknown option --no-such-option for {what(path, cmd)}"),
             (base + ["-Z"], f"unknown option -Z for {what(path, cmd)}")]
    extra = len(cmd.positionals) - len(positionals(cmd)) + 1
    cases.append((base + ["extra"] * extra, f"unexpected argument 'extra' for {what(path, cmd)}"))
    for p in cmd.params():
        if p.type is not bool:
            cases.append((base + [p.option], f"{p.option} needs a value"))
        if p.type in (int, float) or p.choices or p.type is bool:
            cases.append((base + [f"{p.option}=not-a-value"], f"{p.option}: 'not-a-value' is not allowed; expected "))
    markers = {f.marker for f in cmd.forms}
    first = next((p for p in cmd.params() if p.name not in markers), None)
    for i, p in enumerate(cmd.positionals):
        if p.workload:  # options but no workload
            cases.append((words(path) + [f"{first.option}=1"] if first else words(path),
                          f"{path} needs a workload; known workloads: {', '.join(workloads.names())}"))
        elif p.required:
            cases.append((words(path) + positionals(cmd)[:i], f"missing argument {p.name.upper()} for {what(path, cmd)}"))
    for p in cmd.params():
        if p.required:
            cases.append((words(path) + positionals(cmd), f"missing option {p.option} for {what(path, cmd)}"))
    failures = [f for f in (bad(gpuvs, args, message) for args, message in cases) if f]
    assert failures == []
    assert len(cases) >= 3 and gpuvs_processes() == []


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "no such command 'nosuch'"),
    (["--nosuch"], "unknown option --nosuch for gpuvs; give a command first: " + ", ".join(commands.names())),
] + [([path.split()[1], "nosuch"], "no such command 'nosuch'") for path, cmd in GROUPS]
  + [([path.split()[1], "--nosuch"], f"unknown option --nosuch for {path}; give a command first: "
      + ", ".join(s.name for s in cmd.subcommands)) for path, cmd in GROUPS])
def test_an_unknown_command_is_one_line_and_exit_2(gpuvs, args, message):
    assert bad(gpuvs, args, message) is None


def test_gpuvs_and_a_command_group_alone_show_their_help(gpuvs):
    code, out, _ = gpuvs()
    assert code == 0 and out.startswith("usage: gpuvs COMMAND")
    assert [c.name for c in commands.all_commands()] == commands.names() and len(commands.names()) >= 14
    for cmd in commands.all_commands():
        assert re.search(rf"^│ {cmd.name} +│ {re.escape(cmd.summary[:40])}", out, re.M), cmd.name
    for path, cmd in GROUPS:
        code, out, _ = gpuvs(*words(path))
        assert code == 0 and out.startswith(f"usage: {path} COMMAND")


def test_a_command_that_runs_and_has_sub_commands_takes_a_sub_commands_name_first(gpuvs):
    """gpuvs fleet WORKLOAD and gpuvs fleet history, gpuvs report ID and gpuvs report status: a first word that
    names a sub-command goes there, anything else to the command itself; no workload is named like a
    sub-command of a command that takes a workload (it could not be reached)."""
    both = [(path, cmd) for path, cmd in COMMANDS if cmd.run is not None and cmd.subcommands]
    assert {path for path, _ in both} >= {"gpuvs fleet", "gpuvs report"}
    for path, cmd in both:
        for sub in cmd.subcommands:
            if any(p.workload for p in cmd.positionals):
                assert sub.name not in workloads.names()
            assert bad(gpuvs, words(path) + [sub.name, "--nosuch"], f"unknown option --nosuch for {path} {sub.name}") is None
        assert bad(gpuvs, words(path) + positionals(cmd) + ["--nosuch"],
                   f"unknown option --nosuch for {what(path, cmd)}") is None
        code, out, _ = gpuvs(*words(path), *positionals(cmd), "--help")
        assert code == 0 and all(f"usage: {path} " in out and f"{path} {sub.name} " in out for sub in cmd.subcommands)


@pytest.mark.parametrize("words_, most", [(["run"], 40), (["compare"], 70), (["results", "list"], 12)])
def test_the_help_a_user_reads_first_fits_a_screen(gpuvs, monkeypatch, words_, most):
    """At 80 columns: run --help was 303 lines, compare 362, most of them every environment kind's options."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = gpuvs(*words_, "--help")
    assert code == 0 and len(out.splitlines()) <= most, out
    code, full, _ = gpuvs(*words_, "--help-all")
    assert code == 0 and len(full.splitlines()) >= len(out.splitlines())
    if words_ == ["run"]:
        assert "--image-pull-policy" in full and "--image-pull-policy" not in out and len(full.splitlines()) > 200


def test_the_checks_above_can_fail(gpuvs):
    """A help that leaves an option out, and bad input that is not refused, are seen."""
    code, out, _ = gpuvs("report", "--help")
    assert code == 0 and lists_option(out, "--format") and not lists_option(out, "--form")
    assert bad(gpuvs, ["workloads"], "x") is not None  # runs fine: exit 0
    assert bad(gpuvs, ["report", "x", "--format", "md"], "unknown option") is not None  # another error (no store)
