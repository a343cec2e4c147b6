"""Workload registry. Every module in this package registers its workloads with @register
when imported; modules must not import heavy frameworks (torch, cupy) at module level, so that
discovering the registry stays cheap and the core runs without them."""

from __future__ import annotations

import importlib
import pkgutil

from gpuvs.errors import UsageError
from gpuvs.workloads.base import Param, RunContext, Workload

__all__ = ["Param", "RunContext", "Workload", "register", "get", "names", "all_workloads"]

_REGISTRY: dict[str, type[Workload]] = {}
_discovered = False


def register(cls: type[Workload]) -> type[Workload]:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise RuntimeError(f"workload {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def all_workloads() -> list[Workload]:
    return [get(n) for n in names()]


def get(name: str) -> Workload:
    _discover()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise UsageError(f"unknown workload {name!r}; known workloads: {', '.join(names())}") from None
