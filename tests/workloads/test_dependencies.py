"""Every module src/ imports is the standard library, gpuvs itself, or a distribution pyproject.toml declares.

A package that a dependency happens to pull in is not a declaration.
typer stopped installing click, and an undeclared `import click` broke the quick start."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}


def imported_top_level(root: Path) -> dict[str, list[str]]:
    """{top-level module: [file:line, ...]} for absolute imports in root's Python files."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_every_import_of_src_is_declared():
    own = {p.name for p in (ROOT / "src").iterdir() if p.is_dir() or p.suffix == ".py"}
    providers = md.packages_distributions()
    deps = declared()
    missing = []
    for module, where in sorted(imported_top_level(ROOT / "src").items()):
        if module in sys.stdlib_module_names or module in own or module == "__future__":
            continue
        dists = {_norm(d) for d in providers.get(module, [])}
        if not dists:
            missing.append(f"{module} (imported at {where[0]}) is not installed by any distribution here")
        elif not dists & deps:
            missing.append(f"{module} (imported at {where[0]}) comes from {', '.join(sorted(dists))}, "
                           "which pyproject.toml does not declare")
    assert not missing, "\n".join(missing)


def test_the_check_catches_an_undeclared_import(tmp_path, monkeypatch):
    """The scan sees imports in nested modules, from-imports and function bodies."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from click.core import Command\n    import yaml.nodes\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = imported_top_level(tmp_path / "pkg")
    assert set(found) == {"click", "yaml"}
    assert found["click"] == ["pkg/a.py:2"]


WORKER_SIDE = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in {"gpuvs", "numpy"}:
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
import gpuvs.trial.worker
from gpuvs.workloads import get, names
for name in names():
    workload = get(name)
    workload.headline_series(workload.defaults("cpu"))
print(len(names()))
"""


def test_the_worker_side_imports_nothing_but_numpy():
    """A containerised or pod worker runs in the user's image, which holds Python and numpy and maybe nothing else:
    loading the worker and discovering every workload (their defaults and headlines) must not import grpc, torch,
    yaml... (serve's config once pulled grpc into every worker through the nlp-serve workload's defaults)."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", WORKER_SIDE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) >= 10
