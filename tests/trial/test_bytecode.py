"""Where a trial process keeps the bytecode of its imports (gpuvs.trial.bytecode), for real.

New Python processes import a package with no bytecode beside it, under PYTHONDONTWRITEBYTECODE as images set it.
Then the zygote and the exec'd worker of real trials."""

from __future__ import annotations

import importlib._bootstrap_external as external
import os
import subprocess
import sys
from pathlib import Path

from conftest import gpuvs_processes
from gpuvs.trial.runner import Arm, Experiment, Runner
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROBE = "from gpuvs.trial import bytecode; print(bytecode.keep(['slowpkg'])); import slowpkg; print(slowpkg.X)"


def _package(root: Path) -> Path:
    pkg = root / "pkgs" / "slowpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 'compiled from the source'\n")
    return pkg / "__init__.py"


def _python(root: Path, **env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX",
                                                             "GPUVS_PYCACHE")}
    base.update(PYTHONPATH=f"{root / 'pkgs'}{os.pathsep}{SRC}", **env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=base, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _cached(cache: Path) -> list[Path]:
    """The package's bytecode in the cache folder (which also holds what else the process imported after
    the switch: Python then reads every module's bytecode from that folder alone)."""
    return sorted(cache.rglob("slowpkg/__init__*.pyc")) if cache.exists() else []


def test_bytecode_python_would_compile_again_every_time_is_kept_in_gpuvss_folder(tmp_path):
    source = _package(tmp_path)
    cache = tmp_path / "cache"
    said = _python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GPUVS_PYCACHE=str(cache))
    assert said == [f"in {cache}", "compiled from the source"]
    (pyc,) = _cached(cache)
    assert str(source.parent).lstrip("/") in str(pyc)  # Python's mirror of the source's path
    assert not (source.parent / "__pycache__").exists()  # the sources stay as they were
    # the next process reads it: plant bytecode that says so, valid for the unchanged source
    st = source.stat()
    code = compile("X = 'read from the cache'\n", str(source), "exec")
    pyc.write_bytes(external._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))
    assert _python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GPUVS_PYCACHE=str(cache))[1] == "read from the cache"


def test_where_python_keeps_bytecode_itself_nothing_changes(tmp_path):
    source = _package(tmp_path)
    cache = tmp_path / "cache"
    assert _python(tmp_path, GPUVS_PYCACHE=str(cache)) == ["beside the sources", "compiled from the source"]
    assert list((source.parent / "__pycache__").glob("__init__*.pyc")) and not cache.exists()
    # and where the bytecode is there already, though Python may not write any
    assert _python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GPUVS_PYCACHE=str(cache))[0] == "beside the sources"
    assert not cache.exists()


def test_off_leaves_python_as_it_is_told_and_an_unusable_folder_is_said(tmp_path):
    source = _package(tmp_path)
    said = _python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GPUVS_PYCACHE="off",
                   XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert said == ["as Python is told (GPUVS_PYCACHE=off)", "compiled from the source"]
    assert not (tmp_path / "xdg").exists() and not (source.parent / "__pycache__").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    said = _python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GPUVS_PYCACHE=str(blocker / "cache"))
    assert said[0].startswith(f"nowhere: {blocker / 'cache'} cannot be made") and said[1] == "compiled from the source"
    # the default folder is under XDG_CACHE_HOME
    assert _python(tmp_path, PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(tmp_path / "xdg"))[0] == \
        f"in {tmp_path / 'xdg' / 'gpuvs' / 'pycache'}"


def test_the_zygote_and_an_execd_worker_keep_the_bytecode_of_their_imports(store_path, tmp_path):
    """Real trials of a workload importing the package: the zygote says where it kept the bytecode (stored with
    the experiment's timing), and both the zygote and an exec'd worker wrote it to gpuvs's folder."""
    _package(tmp_path)
    for fresh in ("fork", "exec"):
        cache = tmp_path / f"cache-{fresh}"
        env = {"env_var": [f"PYTHONPATH={tmp_path / 'pkgs'}{os.pathsep}{SRC}", "PYTHONDONTWRITEBYTECODE=1",
                           f"GPUVS_PYCACHE={cache}"]}
        spec = RunSpec(workload="selftest", device="cpu", params={"steps": 2, "imports": "slowpkg"}, fresh=fresh,
                       env=EnvSpec("host", env))
        with Store(store_path) as st:
            runner = Runner(st)
            res = runner.run_experiment(Experiment(fresh, spec, [Arm("a")], trials=2, seed=0))
        assert [r.status for r in res] == ["ok", "ok"], [r.error for r in res]
        if fresh == "fork":
            (ready,) = runner.timing["zygotes"]
            assert ready["bytecode"] == f"in {cache}"
        assert len(_cached(cache)) == 1, fresh
    assert gpuvs_processes() == []
