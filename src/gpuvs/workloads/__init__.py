"""Workload registry. Every module in this package registers its workloads with @register
when imported; modules must not import heavy frameworks (torch, cupy) at module level, so that
discovering the registry stays cheap and the core runs without them."""

from __future__ import annotations

from gpuvs.errors import UsageError
from gpuvs.registry import Registry
from gpuvs.workloads.base import RunContext, Workload

__all__ = ["RunContext", "Workload", "register", "get", "names", "all_workloads"]

_workloads: Registry[type[Workload]] = Registry(__name__, __path__, "workload", lambda cls: cls.name, skip=("base",))
register = _workloads.register


def names() -> list[str]:
    return sorted(_workloads.discover())


def all_workloads() -> list[Workload]:
    return [get(n) for n in names()]


def get(name: str) -> Workload:
    try:
        return _workloads.discover()[name]()
    except KeyError:
        raise UsageError(f"unknown workload {name!r}; known workloads: {', '.join(names())}") from None
