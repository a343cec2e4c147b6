"""docs/extending.md, done: a workload, an environment kind and a command are one module each.

The modules are read from the page's code blocks and written into a copy of src/gpuvs, which differs in nothing else.
The real command line, run from the copy, picks all three up: help, checks, a trial of the new workload, stored."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, gpuvs_processes

PAGE = ROOT / "docs" / "extending.md"
MODULES = ["src/gpuvs/cli/commands/kinds.py", "src/gpuvs/environments/nice.py", "src/gpuvs/workloads/hashing.py"]


def examples() -> dict[str, str]:
    """The modules the page shows, by path: code blocks whose first line is `# src/gpuvs/...`."""
    out = {}
    for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S):
        first, _, code = block.partition("\n")
        if first.startswith("# src/gpuvs/"):
            out[first[2:].strip()] = code
    return out


def differences(a: Path, b: Path, here: str = "") -> list[str]:
    """What differs between two trees (bytecode caches aside): 'added X', 'removed X', 'changed X'."""
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = [f"removed {here}{n}" for n in cmp.left_only] + [f"added {here}{n}" for n in cmp.right_only]
    out += [f"changed {here}{n}" for n in cmp.diff_files]
    for sub in cmp.common_dirs:
        out += differences(a / sub, b / sub, f"{here}{sub}/")
    return out


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    """A copy of src/gpuvs with the page's three modules added."""
    root = tmp_path_factory.mktemp("house")
    shutil.copytree(ROOT / "src" / "gpuvs", root / "src" / "gpuvs", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, code in examples().items():
        assert not (root / rel).exists(), f"{rel} exists already: the page must add a new module"
        (root / rel).write_text(code)
    return root


@pytest.fixture
def gpuvs(house, tmp_path):
    """`python -m gpuvs ARGS` with the copy (and only the copy) on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=str(house / "src"), COLUMNS="200")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpuvs", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)

    return run


def test_each_takes_one_new_module_and_nothing_else(house):
    assert sorted(examples()) == MODULES
    assert sorted(differences(ROOT / "src" / "gpuvs", house / "src" / "gpuvs")) == \
        sorted("added " + m.removeprefix("src/gpuvs/") for m in MODULES)


def test_the_command_is_dispatched_checked_and_explained(gpuvs):
    r = gpuvs("--help")
    assert r.returncode == 0 and re.search(r"^│ kinds +│ List the environment kinds", r.stdout, re.M)
    r = gpuvs("kinds", "--help-all")
    assert r.returncode == 0 and r.stdout.startswith("usage: gpuvs kinds [options]")
    assert re.search(r"^│ --json +│ False +│ true or false +│ print them as JSON", r.stdout, re.M)
    r = gpuvs("kinds", "--json")
    assert r.returncode == 0 and list(json.loads(r.stdout)) == ["host", "nice", "container", "pod"]
    r = gpuvs("kinds")
    assert r.returncode == 0 and "nice: a child process of gpuvs at a lower CPU priority" in r.stdout.splitlines()
    for args, message in [(["kinds", "--json=maybe"], "--json: 'maybe' is not allowed; expected true or false"),
                          (["kinds", "extra"], "unexpected argument 'extra' for gpuvs kinds")]:
        r = gpuvs(*args)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"gpuvs: error: {message}\n")


def test_the_workload_and_the_kind_are_parsed_checked_and_explained(gpuvs):
    r = gpuvs("workloads")
    assert r.returncode == 0 and re.search(r"^│ hashing +│ SHA-256 of an in-memory buffer", r.stdout, re.M)
    r = gpuvs("run", "hashing", "--help-all")
    assert r.returncode == 0 and re.search(r"^│ --size-mb +│ 16 +│ an integer from 1 to 4096", r.stdout, re.M)
    r = gpuvs("doctor", "--help-all")
    assert r.returncode == 0 and "--env nice options (a child process of gpuvs at a lower CPU priority)" in r.stdout
    assert re.search(r"^│ --niceness +│ 10 +│ an integer from 1 to 19", r.stdout, re.M)
    for args, message in [
        (["run", "hashing", "--size-mb", "0"], "--size-mb: '0' is not allowed; expected an integer from 1 to 4096"),
        (["run", "hashing", "--env", "nice", "--niceness", "40"], "--niceness: '40' is not allowed; "
                                                                  "expected an integer from 1 to 19"),
        (["run", "hashing", "--niceness", "5"], "--niceness applies to --env nice, not to the host"),
    ]:
        r = gpuvs(*args)
        assert (r.returncode, r.stderr) == (2, f"gpuvs: error: {message}\n")


def test_a_trial_of_the_new_workload_runs_in_the_new_kind(gpuvs, tmp_path):
    r = gpuvs("run", "hashing", "--env", "nice", "--niceness", "15", "--device", "cpu", "--steps", "3",
              "--size-mb", "1", "--trials", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("total MB/sec:") == 2 and "(nice:15)" in r.stdout
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, spec FROM trials").fetchall()
    specs = [json.loads(spec) for _, spec in rows]
    assert [s for s, _ in rows] == ["ok", "ok"] and {s["workload"] for s in specs} == {"hashing"}
    assert all(s["env"] == {"kind": "nice", "options": {"niceness": 15}} for s in specs)
    samples = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT value FROM samples").fetchall()
    assert len(samples) == 6 and all(v > 0 for (v,) in samples)
    assert gpuvs_processes() == []
