"""What a job printed, on its way from the threads that read its pipes to the one that parses it.

A queue that never makes a reader wait, so the job never waits on its pipe for gpuvs.
Past MEMORY bytes, chunks go to an unnamed temporary file; only where none can be made does a reader wait (`waited_s`).
Standard library only: the command workload's wrapper uses it inside the user's image."""

from __future__ import annotations

import collections
import os
import queue
import tempfile
import threading
import time
from typing import Any

MEMORY = 16 * 1024 * 1024  # bytes held in memory, at most; the rest is spilled to a temporary file
PIECE = 1024 * 1024  # bytes taken at once from the spilled part (and the most that small chunks are joined into)
READ_MAX = 4 * 1024 * 1024  # the most read from a pipe at once
PIPE_SIZE = 1024 * 1024  # the capacity asked of a job's pipe (Linux's default ceiling for anyone: pipe-max-size)


class SpillQueue:
    """Items (key, bytes or None, arrival time), and None, in the order put. Bytes of one key that wait behind
    others of the same key are joined (the first one's arrival time stands): a consumer that fell behind catches up
    in large pieces."""

    def __init__(self, memory: int = MEMORY, folder: str | None = None):
        self.memory = memory
        self.folder = folder
        self.held = 0  # bytes in memory
        self.spilled = 0  # bytes ever written to the file
        self.waited_s = 0.0  # time a reader waited for room (only where no file could be made)
        self._items: collections.deque[list[Any]] = collections.deque()
        self._cond = threading.Condition()
        self._file: Any = None
        self._no_file = False
        self._end = 0  # the file's length

    def put(self, item: tuple[str, bytes | None, float] | None) -> None:
        with self._cond:
            if item is None or item[1] is None:
                self._items.append([None] if item is None else list(item))
            else:
                self._put_bytes(*item)
            self._cond.notify_all()

    def _put_bytes(self, key: str, data: bytes, at: float) -> None:
        last = self._items[-1] if self._items else None
        if self.held + len(data) > self.memory and self._spill_file() is not None:
            offset = self._end
            self._file.seek(offset)
            self._file.write(data)
            self._end += len(data)
            self.spilled += len(data)
            if last is not None and last[0] == key and isinstance(last[1], tuple) and sum(last[1]) == offset:
                last[1] = (last[1][0], last[1][1] + len(data))
            else:
                self._items.append([key, (offset, len(data)), at])
            return
        if self.held + len(data) > self.memory and self.held:  # no file: wait for room, and count the wait
            start = time.monotonic()
            while self.held + len(data) > self.memory and self.held:
                self._cond.wait()
            self.waited_s += time.monotonic() - start
            last = self._items[-1] if self._items else None
        self.held += len(data)
        if last is not None and last[0] == key and isinstance(last[1], bytearray) and len(last[1]) + len(data) <= PIECE:
            last[1] += data
        else:
            self._items.append([key, bytearray(data), at])

    def _spill_file(self):
        if self._file is None and not self._no_file:
            try:
                self._file = tempfile.TemporaryFile(dir=self.folder, prefix="gpuvs-output-")
            except OSError:
                self._no_file = True
        return self._file

    def get(self, timeout: float | None = None) -> tuple[str, bytes | None, float] | None:
        """The next item, waiting up to `timeout` seconds (None: for ever); queue.Empty if none came."""
        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            item = self._items[0]
            if item[0] is None:
                self._items.popleft()
                return None
            data = item[1]
            if isinstance(data, tuple):
                offset, length = data
                take = min(length, PIECE)
                if take < length:
                    item[1] = (offset + take, length - take)
                else:
                    self._items.popleft()
                self._file.seek(offset)
                chunk = self._file.read(take)
                if not any(isinstance(i[1], tuple) for i in self._items):
                    self._file.seek(0)  # nothing left in the file: it starts again from its beginning
                    self._file.truncate()
                    self._end = 0
                return item[0], chunk, item[2]
            self._items.popleft()
            if data is not None:
                self.held -= len(data)
                self._cond.notify_all()
                data = bytes(data)
            return item[0], data, item[2]

    def close(self) -> None:
        with self._cond:
            if self._file is not None:
                self._file.close()
                self._file = None


def widen(fd: int) -> int:
    """Ask the pipe behind `fd` for PIPE_SIZE bytes (a writer waits only once it is full); its capacity now."""
    import fcntl

    try:
        return fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        try:
            return fcntl.fcntl(fd, getattr(fcntl, "F_GETPIPE_SZ", 1032))
        except OSError:
            return 0


def waiting(fd: int) -> int:
    """Bytes waiting in the pipe behind `fd` (0 where it cannot be told)."""
    import array
    import fcntl
    import termios

    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    except OSError:
        return 0
    return buf[0]


class Pump:
    """A thread that reads one pipe to its end into a SpillQueue as (key, chunk, arrival time), then (key, None,
    time), or calls `on_end` instead. Each read takes what the pipe holds (at least 64 KiB, at most READ_MAX). A
    read that finds the pipe full counts the time since the previous read as time the writer may have waited
    (`full_s`, an upper bound). `on_data`, if given, sees each chunk (in this thread)."""

    def __init__(self, key: str, fd: int, out: SpillQueue, on_data=None, on_end=None):
        self.key, self.fd, self.out = key, fd, out
        self.on_data, self.on_end = on_data, on_end
        self.capacity = widen(fd)
        self.full = 0  # reads that found the pipe full
        self.full_s = 0.0
        self.thread = threading.Thread(target=self._run, name=f"gpuvs-pipe-{key}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            ready = waiting(self.fd)
            if self.capacity and ready >= self.capacity:
                self.full += 1
                self.full_s += time.monotonic() - last
            try:
                data = os.read(self.fd, min(max(ready, 64 * 1024), READ_MAX))
            except OSError:  # closed under it: the job was stopped and its pipes closed
                data = b""
            last = time.monotonic()
            if not data:
                if self.on_end is not None:
                    self.on_end()
                else:
                    self.out.put((self.key, None, time.time()))
                return
            self.out.put((self.key, data, time.time()))
            if self.on_data is not None:
                self.on_data(data)


def blocked(pumps, out: SpillQueue) -> tuple[int, float]:
    """(reads that found a pipe full, the time a writer may have waited on its pipe: an upper bound)."""
    return sum(p.full for p in pumps), sum(p.full_s for p in pumps) + out.waited_s
