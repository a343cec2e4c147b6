"""Workload registry: every module in this package registers its workloads with @register when imported.

Modules must not import heavy frameworks (torch, cupy) at module level.
So discovering the registry stays cheap, and the core runs without them."""

from __future__ import annotations

from gpuvs.errors import UsageError
from gpuvs.registry import Registry
from gpuvs.workloads.workload import RunContext, Workload

__all__ = ["RunContext", "Workload", "register", "get", "names", "all_workloads"]

_workloads: Registry[type[Workload]] = Registry(__name__, __path__, "workload", lambda cls: cls.name, skip=("workload", "barrier"))
register = _workloads.register


def names() -> list[str]:
    return sorted(_workloads.discover())


def all_workloads() -> list[Workload]:
    return [get(n) for n in names()]


def get(name: str) -> Workload:
    """The workload by name. One whose module has its name (`command`) is imported alone, without discovering the
    others: the command workload's worker runs in the user's image, where the other modules' imports (numpy for
    the kernel suite) may not be."""
    cls = _workloads.classes.get(name) or _alone(name)
    if cls is not None:
        return cls()
    try:
        return _workloads.discover()[name]()
    except KeyError:
        raise UsageError(f"unknown workload {name!r}; known workloads: {', '.join(names())}") from None


def _alone(name: str) -> type[Workload] | None:
    import importlib
    import importlib.util

    module = name.replace("-", "_")
    if not module.isidentifier() or module in _workloads.skip or module.startswith("_"):
        return None
    if importlib.util.find_spec(f"{__name__}.{module}") is None:
        return None
    importlib.import_module(f"{__name__}.{module}")
    return _workloads.classes.get(name)
