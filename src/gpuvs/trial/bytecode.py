"""Where the compiled bytecode of a trial process's imports is kept (GPUVS_PYCACHE, docs/trials.md).

Where Python keeps none beside the sources, every trial would compile torch's modules again: 5-10 s each.
The worker and the zygote then keep it in $XDG_CACHE_HOME/gpuvs/pycache, Python's sys.pycache_prefix.
Nothing here imports the modules it asks about."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable

ENV = "GPUVS_PYCACHE"


def folder() -> str:
    """The cache folder: GPUVS_PYCACHE=DIR, else $XDG_CACHE_HOME/gpuvs/pycache, else ~/.cache/gpuvs/pycache."""
    value = os.environ.get(ENV, "")
    if value and value != "off":
        return os.path.abspath(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpuvs", "pycache")


def kept_beside(module: str) -> bool | None:
    """Whether Python finds, or will keep, a package's bytecode beside its source; None where there is
    no Python source to compile (not installed, a namespace package, an extension module)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    cached = importlib.util.cache_from_source(origin)
    if os.path.exists(cached):
        return True
    if sys.dont_write_bytecode:
        return False
    where = os.path.dirname(cached)
    return os.access(where if os.path.isdir(where) else os.path.dirname(where), os.W_OK)


def keep(modules: Iterable[str]) -> str:
    """Before this process imports `modules`: cache their bytecode in gpuvs's folder where Python would
    keep none beside them. Returns where the bytecode is kept, in words (for the run's record)."""
    setting = os.environ.get(ENV, "")
    if setting == "off":
        return f"as Python is told ({ENV}=off)"
    if sys.pycache_prefix:
        return f"in {sys.pycache_prefix} (PYTHONPYCACHEPREFIX)"
    found = [kept_beside(m) for m in modules]
    if False not in found:
        return "beside the sources"
    path = folder()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"nowhere: {path} cannot be made ({exc.strerror or exc})"
    if not os.access(path, os.W_OK):
        return f"nowhere: {path} is not writable"
    sys.pycache_prefix = path
    sys.dont_write_bytecode = False
    return f"in {path}"
