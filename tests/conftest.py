import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

# Every process the tests start (directly or not) inherits this tag in its environment, so a test can
# find anything left running by this test session alone, even while other suites share the machine.
TEST_TAG = uuid.uuid4().hex
os.environ["GPUVS_TEST_TAG"] = TEST_TAG


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
    """PIDs of live processes started (directly or not) by this test session."""
    marker = f"GPUVS_TEST_TAG={TEST_TAG}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if marker in env.split(b"\0") and pid_alive(int(d.name)):
                out.append(int(d.name))
    return out
