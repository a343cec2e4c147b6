"""A child in a process group of its own (its own session), never orphaned by an interruption while it starts.

A Ctrl-C during Popen's wait for exec would leave the child running, in a session the terminal's signals miss.
group_popen ends the child's whole group when that happens, then lets the exception go on."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


class _GroupPopen(subprocess.Popen):
    def _execute_child(self, *args: Any, **kwargs: Any) -> None:
        try:
            super()._execute_child(*args, **kwargs)
        except BaseException:
            if getattr(self, "_child_created", False):
                kill_group(self.pid)
            raise


def signal_group(pgid: int, sig: int) -> None:
    """sig to every process of the group; a group already gone (or no longer ours) is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(pgid: int) -> None:
    signal_group(pgid, signal.SIGKILL)


def end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the group that proc leads, SIGKILL to what is left after grace_s, then proc reaped."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid)
    proc.wait(timeout=10)


def group_popen(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(argv, start_new_session=True, **kwargs): the child leads a new process group."""
    return _GroupPopen(argv, start_new_session=True, **kwargs)
