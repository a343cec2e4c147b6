"""The commands: one module per command, named after it (`gpuvs share-matrix` is share_matrix.py),
each declaring `COMMAND = Command(...)` (gpuvs.cli.declaration). A command is found by its name, so
running one imports that module alone; the help of gpuvs imports them all. A new command is one new
module here, nothing else. Command modules never import one another: what several share lives in
gpuvs.cli.common and gpuvs.cli.options."""

from __future__ import annotations

import importlib
import pkgutil

from gpuvs.cli.declaration import Command


def module_name(command: str) -> str:
    return command.replace("-", "_")


def names() -> list[str]:
    """Every command's name, sorted (from the module names: nothing is imported)."""
    return sorted(info.name.replace("_", "-") for info in pkgutil.iter_modules(__path__)
                  if not info.name.startswith("_"))


def get(name: str) -> Command | None:
    """The command called `name`, or None when there is none."""
    if name != name.strip() or name.startswith(("_", "-")) or "_" in name or name not in names():
        return None
    module = importlib.import_module(f"{__name__}.{module_name(name)}")
    cmd = getattr(module, "COMMAND", None)
    if not isinstance(cmd, Command) or cmd.name != name:
        raise RuntimeError(f"{module.__name__} must declare COMMAND = Command({name!r}, ...)")
    return cmd


def all_commands() -> list[Command]:
    return [c for c in (get(n) for n in names()) if c is not None]
