"""Back-pressure: at most `max_in_flight` calls run at once, and up to `max_queue` more wait for a slot.

A call that finds both full is refused at once with RESOURCE_EXHAUSTED and a retry hint (docs/nlp.md).
A queued call whose client cancels, or whose deadline passes, leaves the queue at once.
The health service and Metrics never pass through here: they answer while the server is loaded."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from typing import Iterator

import grpc

from gpuvs.serve.request_checks import Refused

RETRY_METADATA = "retry-after-ms"
MAX_HINT_S = 600.0  # a hint is capped: a long training's remaining time is not worth waiting out blind
_POLL_S = 0.05  # how often a queued call looks at its client (cancelled? deadline?)


def busy(message: str, retry_after_s: float) -> Refused:
    """RESOURCE_EXHAUSTED with a retry hint a client can act on."""
    ms = max(1, int(min(retry_after_s, MAX_HINT_S) * 1000))
    return Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{message}; retry after about {ms} ms",
                   trailers=((RETRY_METADATA, str(ms)),))


class Admission:
    def __init__(self, max_in_flight: int, max_queue: int, queue_timeout_s: float):
        if max_in_flight < 1 or max_queue < 0 or queue_timeout_s <= 0:
            raise ValueError("max_in_flight >= 1, max_queue >= 0, queue_timeout_s > 0")
        self.max_in_flight, self.max_queue, self.queue_timeout_s = max_in_flight, max_queue, queue_timeout_s
        self._cond = threading.Condition()
        self._waiting: deque[object] = deque()
        self._granted: set[object] = set()  # calls handed a slot, not yet out of their wait
        self.in_flight = 0
        self.peak_in_flight = self.peak_queued = 0
        self.refused = self.cancelled = self.deadline_exceeded = 0
        self._held_s: deque[float] = deque(maxlen=256)  # how long recent calls held their slot

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def retry_after_s(self) -> float:
        """About when a slot frees up: the median time a call holds one, times the calls ahead per slot."""
        held = statistics.median(self._held_s) if self._held_s else 0.1
        ahead = (self.queued + 1) / self.max_in_flight
        return min(30.0, max(0.01, held * ahead))

    def _refuse(self, why: str) -> Refused:
        self.refused += 1
        return busy(f"server busy: {why} (limits: {self.max_in_flight} in flight, {self.max_queue} queued)",
                    self.retry_after_s())

    @contextlib.contextmanager
    def slot(self, context: grpc.ServicerContext) -> Iterator[float]:
        """Hold a slot for the body of the with-statement; yields the seconds spent queued. A slot
        that frees up goes straight to the first call in the queue, so a newcomer never jumps it."""
        t0 = time.monotonic()
        with self._cond:
            if self.in_flight >= self.max_in_flight or self._waiting:
                if len(self._waiting) >= self.max_queue:
                    raise self._refuse(f"{self.in_flight} calls in flight and {len(self._waiting)} queued")
                self._wait(context, t0)  # returns holding a slot handed over by a call that ended
            else:
                self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        waited = time.monotonic() - t0
        try:
            yield waited
        finally:
            with self._cond:
                self._held_s.append(time.monotonic() - t0 - waited)
                if self._waiting:
                    self._granted.add(self._waiting.popleft())  # in_flight stays: the slot changes hands
                    self._cond.notify_all()
                else:
                    self.in_flight -= 1

    def _wait(self, context: grpc.ServicerContext, t0: float) -> None:
        """In the queue (self._cond held) until a slot is handed to this call."""
        me = object()
        self._waiting.append(me)
        self.peak_queued = max(self.peak_queued, len(self._waiting))
        while me not in self._granted:
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                self.deadline_exceeded += 1
                self._waiting.remove(me)
                raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed while it was queued")
            if not context.is_active():
                self.cancelled += 1
                self._waiting.remove(me)
                raise Refused(grpc.StatusCode.CANCELLED, "the call was cancelled while it was queued")
            if time.monotonic() - t0 >= self.queue_timeout_s:
                self._waiting.remove(me)
                raise self._refuse(f"queued for {self.queue_timeout_s:g} s without a free slot")
            self._cond.wait(_POLL_S if remaining is None else max(0.001, min(_POLL_S, remaining)))
        self._granted.discard(me)
