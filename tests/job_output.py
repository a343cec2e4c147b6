"""Run a real program and read its output as the command workload's wrapper will.

Both streams are read line by line as they arrive, each line fed at once to a command.outputs Reader.
Then finish() is called once the program has exited."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from gpuvs.workloads.command.outputs import Reader, Reading


@dataclass
class Run:
    returncode: int
    readings: list[Reading] = field(default_factory=list)  # in the order they appeared, finish()'s last
    lines: dict[str, list[str]] = field(default_factory=lambda: {"stdout": [], "stderr": []})

    def named(self, name: str) -> list[Reading]:
        return [r for r in self.readings if r.name == name]

    def one(self, name: str) -> Reading:
        found = self.named(name)
        assert len(found) == 1, f"{name}: {len(found)} readings, expected 1: {found}"
        return found[0]


def run_and_read(reader: Reader, argv: Sequence[str], cwd: Path | None = None, timeout: float = 60) -> Run:
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
    lines: queue.Queue = queue.Queue()

    def pump(stream: str, pipe) -> None:
        for raw in iter(pipe.readline, b""):
            lines.put((stream, raw))
        lines.put((stream, None))

    threads = [threading.Thread(target=pump, args=(s, getattr(proc, s)), daemon=True) for s in ("stdout", "stderr")]
    for t in threads:
        t.start()
    run = Run(returncode=-1)
    open_streams, deadline = 2, time.monotonic() + timeout
    try:
        while open_streams:
            stream, raw = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if raw is None:
                open_streams -= 1
                continue
            run.lines[stream].append(raw.decode("utf-8", "replace").rstrip("\n"))
            run.readings += reader.feed(raw, stream)
        run.returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run.readings += reader.finish()
    return run
