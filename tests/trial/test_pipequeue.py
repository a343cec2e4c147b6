"""gpuvs.pipequeue: a job's output read from real pipes by real processes, never making the writer wait.

Past the memory bound it spills to a file, and is read back in order.
A pipe found full is counted, and so is a wait where no file can be made."""

import os
import subprocess
import sys
import time

from gpuvs import pipequeue

WRITER = ("import os, sys\nn = int(sys.argv[1])\nfor i in range(n):\n    os.write(1, b'%08d\\n' % i)\n")


def _drain(q: pipequeue.SpillQueue) -> bytes:
    out = bytearray()
    while True:
        item = q.get(timeout=30)
        if item[1] is None:
            return bytes(out)
        out += item[1]


def test_a_writer_never_waits_for_a_slow_reader_and_every_byte_comes_back_in_order():
    """2 MiB of small writes against a queue of 256 KiB whose consumer does not read until the writer has exited:
    the writer ends at once (nothing waits on the pipe), the rest was spilled, and every line comes back in order."""
    n = 200_000
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(n)], stdout=subprocess.PIPE)
    q = pipequeue.SpillQueue(memory=256 * 1024)
    pump = pipequeue.Pump("stdout", proc.stdout.fileno(), q)
    assert proc.wait(timeout=60) == 0  # while nothing was taken from the queue
    pump.thread.join(timeout=30)
    assert q.spilled > 1024 * 1024 and q.held <= 256 * 1024
    data = _drain(q)
    assert data == b"".join(b"%08d\n" % i for i in range(n))
    assert q.waited_s == 0.0
    q.close()


def test_where_no_file_can_be_made_the_reader_waits_and_the_wait_is_counted(tmp_path):
    q = pipequeue.SpillQueue(memory=64 * 1024, folder=str(tmp_path / "missing"))
    r, w = os.pipe()
    pump = pipequeue.Pump("stdout", r, q)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, "50000"], stdout=w)
    os.close(w)
    time.sleep(0.5)  # the consumer is late: the queue's 64 KiB are full and the pump waits for room
    data = _drain(q)
    assert writer.wait(timeout=60) == 0
    pump.thread.join(timeout=30)
    assert len(data) == 50000 * 9 and q.spilled == 0
    assert q.waited_s > 0.1
    os.close(r)


def test_a_read_that_finds_the_pipe_full_is_counted():
    r, w = os.pipe()
    capacity = pipequeue.widen(r)
    assert capacity >= 64 * 1024
    os.set_blocking(w, False)
    written = 0
    try:
        while True:
            written += os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    assert pipequeue.waiting(r) == capacity == written
    q = pipequeue.SpillQueue()
    pump = pipequeue.Pump("stdout", r, q)
    os.close(w)
    assert len(_drain(q)) == written
    pump.thread.join(timeout=30)
    assert pump.full == 1 and pump.full_s >= 0.0
    assert pipequeue.blocked([pump], q)[0] == 1
    os.close(r)
