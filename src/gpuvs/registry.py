"""One registry of plug-in classes, found by importing every module of a package.

Workloads (by name) and environments (by kind) both use it, so a new workload or engine is one new module."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    def __init__(self, package: str, path: Iterable[str], noun: str, key: Callable[[T], str],
                 skip: tuple[str, ...] = (), after: Callable[[], object] | None = None):
        self.package, self.path, self.noun, self.key = package, list(path), noun, key
        self.skip, self.after = skip, after
        self.classes: dict[str, T] = {}
        self._discovered = False

    def register(self, cls: T) -> T:
        """The decorator: refuse two classes under one key (a copied module left behind, say)."""
        key = self.key(cls)
        if key in self.classes and self.classes[key] is not cls:
            raise RuntimeError(f"{self.noun} {key!r} registered twice")
        self.classes[key] = cls
        return cls

    def discover(self) -> dict[str, T]:
        """Every class, once each module of the package has been imported (they register themselves)."""
        if not self._discovered:
            self._discovered = True
            for info in pkgutil.iter_modules(self.path):
                if info.name not in self.skip and not info.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{info.name}")
            if self.after is not None:
                self.after()
        return self.classes
