"""Bare mode: a command run as the environment's own process, its output read from outside.

It is turned into the same protocol events a worker sends (job.Session), so the trial is like any other.
What gpuvs cannot measure from outside is said (`unmeasured`, `taken_by`), not filled in."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpuvs import events
from gpuvs.workloads.command import job
from gpuvs.environments.environment import WorkerStream
from gpuvs.spec import RunSpec


class BareStream(WorkerStream):
    """A RawJob as the runner sees a worker: protocol lines (config, fingerprint, start-up, a sample per reading,
    output, summary, error), an exit status (0 for a trial that succeeded), kill and close."""

    def __init__(self, spec: RunSpec, raw: Any, settings: job.Settings):
        super().__init__()
        self.raw = raw
        self.spec = spec
        self.session = job.Session(settings, spec.launched_at or raw.launched_at, raw.streams)
        self.samples: list[dict[str, Any]] = []
        self._code: int | None = None
        self._failed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _emit(self, event: dict[str, Any]) -> None:
        if event["type"] == "sample":
            self.samples.append(event)
        self.put(events.encode(event) + "\n")

    def _follow(self) -> None:
        raw, session = self.raw, self.session
        failure = None
        try:
            self._emit(session.config("bare: the command is the environment's own process; gpuvs reads its output "
                                      "from outside", unmeasured=raw.unmeasured))
            splitters: dict[str, job._Splitter] = {}
            while True:
                item = raw.output.get()
                if item is None:
                    break
                stream, data, at = item
                splitter = splitters.setdefault(stream, job._Splitter())
                for event in session.pieces(stream, splitter.feed(data), at):
                    self._emit(event)
            for stream, splitter in splitters.items():
                for event in session.pieces(stream, splitter.end(), time.time()):
                    self._emit(event)
            code = raw.wait(timeout=60)
            self._emit({"type": "fingerprint", "data": raw.facts()})  # once it ran: a pod's node is known then
            ran = raw.program(session.settings.argv)  # what it ran, read where it can be from outside
            if ran is not None:
                self._emit(events.config(program=ran))
            timing = raw.timings()
            for name, seconds in timing.get("startup", {}).items():
                self._emit(events.startup(name, seconds))
            # the trial's end as gpuvs sees it (the job's exit, its state and fingerprint read), as a worker's exit
            self._emit(events.startup("launch_to_exit_s", time.time() - session.launched))
            for event in raw.events():
                self._emit(event)
            if timing.get("resolution_s") is not None:
                self._emit(events.config(wall_time_clock=timing["clock"], wall_time_resolution_s=timing["resolution_s"]))
            held = getattr(raw, "held", [])
            flag = job.pipe_waits(*raw.blocked(), timing.get("wall_s"))
            if flag:
                self._emit(flag)
            done, failure = session.ended(code, timing.get("wall_s"),
                                          job.signal_name(code) if code is not None and code < 0 else None,
                                          unread=job.unread_text(held, timing.get("wall_s")) if held else None)
            failure = raw.failure(code) or failure  # the environment's own reason first (image, executable, OOM)
            for event in done:
                self._emit(event)
            self._code = code
        except Exception as exc:  # a client failure gpuvs did not foresee: still one line, still cleaned up
            failure = ("unavailable", f"bare mode: {type(exc).__name__}: {exc}")
            for event in session.output_events():
                self._emit(event)
        finally:
            self._emit({"type": "summary", "data": job.summarize(self.samples, session.metrics(),
                                                                 session.reader.headline, session.series)})
            if failure is not None:
                self._emit(events.error(*failure))
            self._failed = failure is not None
            self.put(None)
            self._done.set()

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError
        if self._failed:
            return self._code if self._code not in (None, 0) else 1
        return 0

    def kill(self, grace_s: float = 3.0) -> None:
        if self._killed:
            return
        self._killed = True
        self.raw.kill()
        self._done.wait(10)

    def close(self) -> None:
        if self._killed:
            return
        self._killed = True
        self.raw.close()


def start(spec: RunSpec, environment: Any, settings: job.Settings) -> BareStream:
    spec.launched_at = time.time()
    raw = environment.start_bare(spec, settings.argv, settings.workdir)
    return BareStream(spec, raw, settings)
