"""spawn.group_popen: a child in a process group of its own is ended if an interruption comes during Popen's wait.

That wait is for its exec's outcome: the moment a Ctrl-C under load orphaned a host job's whole tree."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from gpuvs import spawn


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_an_interruption_while_popen_waits_for_exec_ends_the_childs_group(monkeypatch):
    real_read, seen = os.read, {}

    def interrupted_read(fd, n):
        if n == 50000 and "pid" not in seen:  # Popen's read of its exec pipe: the child exists by now
            seen["pid"] = True
            raise KeyboardInterrupt
        return real_read(fd, n)

    created = []
    real_exec = spawn._GroupPopen._execute_child

    def remember(self, *a, **k):
        try:
            real_exec(self, *a, **k)
        finally:
            created.append(self.pid)

    monkeypatch.setattr(spawn._GroupPopen, "_execute_child", remember)
    monkeypatch.setattr(os, "read", interrupted_read)
    with pytest.raises(KeyboardInterrupt):
        spawn.group_popen(["sh", "-c", "sleep 300 & sleep 300"], stdout=subprocess.DEVNULL)
    monkeypatch.setattr(os, "read", real_read)
    (pid,) = created
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_normal_start_leads_its_own_group():
    p = spawn.group_popen(["sleep", "30"])
    try:
        assert os.getpgid(p.pid) == p.pid != os.getpgid(0)
    finally:
        spawn.kill_group(p.pid)
        p.wait(5)
    assert p.returncode == -9
