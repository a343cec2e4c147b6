"""Quiet turns for tests whose verdicts read timing, or that make what the other worker's tests count as left behind.

A test marked `quiet` runs on the cluster's worker (pyproject's two workers; conftest.py wires it in).
Before it starts, the other worker finishes its current test and waits, so the two cores are the timed test's alone.
Without xdist this does nothing."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

WAIT_S = 900.0  # the other worker's longest test, on a loaded machine, with room; then the test runs anyway


class Turns:
    """Files in one folder per test run: `quiet` (a quiet test wants the machine), `ack-gwN` (worker gwN is
    waiting between tests), `done-gwN` (worker gwN has no test left)."""

    def __init__(self, folder: Path, me: str, workers: int):
        self.folder, self.me = folder, me
        self.others = [f"gw{i}" for i in range(workers) if f"gw{i}" != me]
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        return self.folder / name

    def take(self) -> None:
        """Ask for the machine and wait until every other worker is between tests or finished."""
        for w in self.others:
            self._path(f"ack-{w}").unlink(missing_ok=True)
        self._path("quiet").touch()
        deadline = time.monotonic() + WAIT_S
        while not all(self._path(f"ack-{w}").exists() or self._path(f"done-{w}").exists() for w in self.others):
            if time.monotonic() > deadline:
                warnings.warn(f"quiet test: the other worker did not pause within {WAIT_S:.0f} s", stacklevel=1)
                return
            time.sleep(0.2)

    def give_back(self) -> None:
        self._path("quiet").unlink(missing_ok=True)
        for w in self.others:
            self._path(f"ack-{w}").unlink(missing_ok=True)

    def wait_turn(self) -> None:
        """Between tests: while a quiet test runs, say so (ack) and wait. An ack is written only here, inside
        the wait, so a quiet test that sees one knows this worker runs nothing."""
        while self._path("quiet").exists():
            self._path(f"ack-{self.me}").touch()
            time.sleep(0.2)

    def finished(self) -> None:
        self._path(f"done-{self.me}").touch()


def turns(config) -> Turns | None:
    """This worker's Turns under xdist, or None (one process: nothing runs beside a test)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput:
        return None
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuvs-quiet-{workerinput['testrunuid']}"
    return Turns(folder, workerinput["workerid"], int(workerinput["workercount"]))
