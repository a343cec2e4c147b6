"""The test suite's quiet turns (tests/quiet.py): a quiet test starts only once the other worker is between tests.

That worker then starts nothing until the quiet test is over."""

from __future__ import annotations

import threading
import time

from quiet import Turns


def test_a_quiet_test_waits_for_the_other_worker_and_the_other_waits_for_it(tmp_path):
    timed, other = Turns(tmp_path, "gw0", 2), Turns(tmp_path, "gw1", 2)
    took = []

    def quiet_test():
        t0 = time.monotonic()
        timed.take()
        took.append(time.monotonic() - t0)

    asker = threading.Thread(target=quiet_test)
    asker.start()
    time.sleep(0.6)  # the other worker is in the middle of a test: no ack yet
    assert asker.is_alive() and not took
    paused = threading.Thread(target=other.wait_turn)
    paused.start()  # its next test's start: it says it waits, and does
    asker.join(5)
    assert took and took[0] >= 0.5
    time.sleep(0.5)
    assert paused.is_alive()  # still waiting while the quiet test runs
    timed.give_back()
    paused.join(5)
    assert not paused.is_alive()


def test_a_finished_worker_is_not_waited_for(tmp_path):
    Turns(tmp_path, "gw1", 2).finished()
    t0 = time.monotonic()
    Turns(tmp_path, "gw0", 2).take()
    assert time.monotonic() - t0 < 1
