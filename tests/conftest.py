import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def gpuvs_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


def run_cli(*args, timeout=600, cwd=None, **env):
    """Run `python -m gpuvs ARGS` for real; returns CompletedProcess with text output."""
    return subprocess.run([sys.executable, "-m", "gpuvs", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=gpuvs_env(**env))


@pytest.fixture
def cli(tmp_path):
    def _run(*args, **kw):
        kw.setdefault("cwd", tmp_path)
        return run_cli(*args, **kw)
    return _run


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "gpuvs.db"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def gpuvs_processes() -> list[int]:
    """PIDs of live gpuvs worker processes on this machine."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"gpuvs.worker" in cmd and pid_alive(int(d.name)):
                out.append(int(d.name))
    return out
