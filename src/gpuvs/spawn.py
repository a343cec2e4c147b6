"""A child in a process group of its own (its own session), never orphaned by an interruption while it starts.

subprocess.Popen forks and execs the child, then waits on a pipe for exec's outcome; a Ctrl-C or SIGTERM turned
into an exception during that wait (or before the caller holds the Popen object) would leave the child running
with nobody to stop it, in a session of its own where the terminal's signals do not reach it. group_popen ends
the child's whole group when that happens, then lets the exception go on."""

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


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def group_popen(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(argv, start_new_session=True, **kwargs): the child leads a new process group."""
    return _GroupPopen(argv, start_new_session=True, **kwargs)
