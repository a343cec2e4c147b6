"""Environments by kind. Each module registers its kinds in KINDS; lookups are lazy so that
optional launchers cost nothing until used."""

from __future__ import annotations

import importlib

from gpuvs.environments.base import Environment, Launched
from gpuvs.errors import UsageError
from gpuvs.spec import EnvSpec

__all__ = ["Environment", "Launched", "get", "KINDS"]

# kind -> "module:Class"
KINDS: dict[str, str] = {
    "host": "gpuvs.environments.host:HostEnvironment",
    "container": "gpuvs.environments.container:ContainerEnvironment",
}


def get(env: EnvSpec) -> Environment:
    try:
        target = KINDS[env.kind]
    except KeyError:
        raise UsageError(f"unknown environment {env.kind!r}; known: {', '.join(sorted(KINDS))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)(env.options)
