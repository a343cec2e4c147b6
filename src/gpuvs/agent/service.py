"""The agent: the loop that starts runs when due or asked for, one at a time; the HTTP server; the signals.

SIGTERM and SIGINT stop a run in flight: its child cleans up its pods, it is kept as interrupted, and the agent exits 0.
At start it marks the runs a killed agent left `running` as interrupted and reads earlier figures back."""

from __future__ import annotations

import os
import signal
import threading
import time

from gpuvs.agent import idle, metrics
from gpuvs.agent.auth import TokenFile
from gpuvs.agent.config import AgentConfig
from gpuvs.agent.httpd import Asked, Server
from gpuvs.agent.ledger import Ledger, LedgerError, RunRecord
from gpuvs.agent.public import Scrubber
from gpuvs.agent.runs import Context, execute, log
from gpuvs.agent.schedule import Schedule
from gpuvs.agent.state import State
from gpuvs.errors import GpuvsError, UsageError
from gpuvs.store.ids import new_id

OWN_POD = "GPUVS_AGENT_POD"  # the agent's own pod's name (the Deployment sets it from the downward API)
MEMORY_RUNS = 500  # the runs of this process kept in memory too (GET /runs while the store cannot be read)


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.state = State(config.stale_after())
        if config.workloads:
            self.state.workloads_now = {w.name for w in config.workloads}
        self.registry = metrics.registry(self.state)
        self.ledger = Ledger(config.store)
        self.schedule = Schedule(config.every_s, config.first_after_s, config.backoff_max_s)
        self.stopping = threading.Event()
        self.started = threading.Event()
        self.wake = threading.Event()
        self.ctx = Context(config, self.state, self.trial_image, self.stopping)
        self.pending: RunRecord | None = None
        self.current: RunRecord | None = None
        self.memory: dict[str, RunRecord] = {}  # the runs of this process, when the store cannot keep them
        self.lock = threading.Lock()
        self.swept = False
        self._image: str | None = config.image
        self.loop_thread = threading.Thread(target=self._loop, name="gpuvs-agent-loop", daemon=True)
        self.server: Server | None = None
        self.token = TokenFile(config.token_file)
        self.public = Scrubber(config.kubeconfig)
        self.generation = 0  # bumped by every save of a run: the cached status page is rendered again
        self._page: tuple[int, str] | None = None
        self._page_lock = threading.Lock()

    # -- the store -------------------------------------------------------------------------------

    def save(self, run: RunRecord) -> None:
        self.generation += 1
        self.memory[run.id] = run
        while len(self.memory) > MEMORY_RUNS:  # the oldest first (a dict keeps insertion order)
            del self.memory[next(iter(self.memory))]
        try:
            self.ledger.save(run)
            self.state.store_worked()
        except LedgerError as exc:
            if self.state.store_ok:
                log(f"ERROR {exc}; results are kept in memory until it can be written (see /metrics: gpuvs_store_ok)")
            self.state.store_failed(str(exc))

    def runs(self, limit: int = 50) -> list[RunRecord]:
        try:
            stored = {r.id: r for r in self.ledger.runs(limit)}
        except LedgerError:
            stored = {}
        with self.lock:
            live = [r for r in (self.current, self.pending) if r is not None]
        merged = {**stored, **{r.id: r for r in self.memory.values()}, **{r.id: r for r in live}}
        return sorted(merged.values(), key=lambda r: r.queued_at, reverse=True)[:limit]

    def run(self, run_id: str) -> RunRecord | None:
        return next((r for r in self.runs(500) if r.id == run_id), None) or self._stored(run_id)

    def _stored(self, run_id: str) -> RunRecord | None:
        try:
            return self.ledger.get(run_id)
        except LedgerError:
            return None

    def _restore(self) -> None:
        """The runs cut short by a killed agent are marked interrupted; earlier figures come back from the store."""
        from gpuvs.fleet.execute.pair_run import PairFleetResult
        from gpuvs.fleet.result import FleetResult
        from gpuvs.store.db import Store

        try:
            for r in self.ledger.open():
                log(f"run {r.id} was cut short by the agent's end: marked interrupted")
            self.state.store_worked()
        except LedgerError as exc:
            log(f"ERROR {exc}; the agent runs on and keeps its results in memory (see /metrics: gpuvs_store_ok)")
            self.state.store_failed(str(exc))
        try:
            past = list(reversed(self.ledger.runs(200)))  # read-only where it cannot be written: nothing is lost
        except LedgerError:
            return
        try:
            try:
                st = Store(self.config.store)
            except GpuvsError:  # a full or read-only volume: what it holds is still read
                st = Store(self.config.store, readonly=True)
            with st:
                for r in past:
                    at = r.finished_at or r.queued_at
                    for f in r.fleets:
                        if f.experiment:
                            meta = st.experiment(f.experiment).meta
                            if meta.fleet:
                                self.state.fleet(FleetResult.from_dict(meta.fleet), f.workload, at)
                            elif meta.pair_fleet:
                                self.state.pair_fleet(PairFleetResult.from_dict(meta.pair_fleet), f.workload, at)
                    if r.checks:
                        self.state.validate(r.checks, at)
                    if r.reached and (r.tested or r.skipped):  # the cluster's nodes then: tested and skipped
                        self.state.cluster_nodes = set(r.tested) | set(r.skipped)
                    if r.fleets and not self.config.workloads:  # the default by node: what the last run ran
                        self.state.workloads_now = {f.workload for f in r.fleets}
                    if r.status in metrics.RUN_STATUSES:
                        self.state.last_run_at, self.state.last_status = at, r.status
                    if r.status == "ok":
                        self.state.last_success_at = at
        except (GpuvsError, OSError) as exc:
            log(f"ERROR the results of earlier runs could not be read back from {self.config.store}: {exc}")

    def _read_drift(self) -> None:
        """Each node's drift against its own past, from the store's fleet runs (at start and when a run ended with
        fleets), read as `gpuvs fleet history` reads it (its defaults: the last 10 runs, ±5%, 0.95)."""
        from gpuvs.fleet.assess import stored_history as stored
        from gpuvs.store.db import Store

        try:
            with Store(self.config.store, readonly=True) as st:
                self.state.drift_from(stored.read(st))
        except Exception as exc:  # never the agent's end: the metrics keep the last drift read
            log(f"ERROR the drift could not be read from {self.config.store} (the last one is kept): {exc}")

    def status_page(self) -> str:
        """The status page (docs/history.md) of the agent's store, read without writing it; rendered once and kept
        until a run's record changes (queued, started, its validate or a fleet done, ended). Concurrent requests
        wait for the one render."""
        from gpuvs.report.status import render_status_page
        from gpuvs.store.db import Store

        with self._page_lock:
            generation = self.generation  # read first: a save during the render makes the next request render
            if self._page is not None and self._page[0] == generation:
                return self._page[1]
            if not os.path.exists(self.config.store):
                raise GpuvsError(f"no store at {self.config.store} yet")
            with self.state.lock:  # "Needs a look" counts the cluster's nodes now and the workloads run now only
                nodes = set(self.state.cluster_nodes) if self.state.cluster_nodes is not None else None
                workloads = set(self.state.workloads_now) if self.state.workloads_now is not None else None
            with Store(self.config.store, readonly=True) as st:
                page = render_status_page(st, nodes=nodes, workloads=workloads)
            self.state.page_rendered()
            self._page = (generation, page)
            return page

    # -- the trial image -------------------------------------------------------------------------

    def trial_image(self) -> str:
        """--image, else the agent's own image, read from its own pod (pods get in its namespace)."""
        if self._image:
            return self._image
        from gpuvs.kube import client

        name = os.environ.get(OWN_POD)
        if not name:
            raise UsageError("--image IMAGE is needed when the agent does not run in its pod (GPUVS_AGENT_POD unset)")
        c = self.config
        cluster = client.connect(c.kubeconfig, c.context, c.namespace)
        pod = cluster.core.read_namespaced_pod(name, cluster.namespace, _request_timeout=15)
        self._image = pod.spec.containers[0].image
        return self._image

    # -- runs ------------------------------------------------------------------------------------

    def request_run(self, trigger: str) -> Asked:
        """The run queued; or the run already queued or running; or, for a run asked for through the API
        (trigger "api"), how long until --min-interval has passed since the last run ended (whoever asks: the
        token says who may, not how often)."""
        with self.lock:
            busy = self.pending or self.current
            if busy is not None:
                return Asked(busy, False)
            if trigger == "api":
                with self.state.lock:
                    last = self.state.last_run_at
                gap = self.config.min_interval_s
                wait = 0.0 if last is None else min(gap, last + gap - time.time())
                if wait > 0:
                    return Asked(None, False, wait)
            run = RunRecord(id=new_id(chars=4, utc=True),
                            trigger=trigger, queued_at=time.time())
            self.pending = run
        self.save(run)
        self.wake.set()
        return Asked(run, True)

    def _sweep(self) -> None:
        from gpuvs.kube import client

        c = self.config
        try:
            cluster = client.connect(c.kubeconfig, c.context, c.namespace)
            nodes, pods = idle.sweep(cluster)
        except Exception as exc:
            client.forget()
            self.state.api(False, str(exc))
            log(f"the cluster could not be reached for the start-up clean-up (tried again before the next run): {exc}")
            return
        self.swept = True
        self.state.api(True)
        if nodes or pods:
            log(f"start-up clean-up: {idle.TESTING} removed from {', '.join(nodes) or 'no node'}; "
                f"pods deleted: {', '.join(pods) or 'none'}")

    def _one(self, run: RunRecord) -> None:
        with self.lock:
            self.current, self.pending = run, None
        self.state.running = run
        log(f"run {run.id} ({run.trigger}) starts")
        try:
            execute(self.ctx, run, self.save)
        except GpuvsError as exc:  # the trial image could not be found, ...
            run.status, run.reason, run.finished_at = "failed", str(exc), time.time()
        if self.stopping.is_set() and run.status == "running":
            run.status, run.reason = "interrupted", "the agent is stopping"
        self.save(run)
        if run.fleets:
            self._read_drift()
        self.state.ended(run, run.finished_at or time.time())
        with self.lock:
            self.current = None
        nxt = self.schedule.ran(run.started_at or time.time(), run.reached)
        log(f"run {run.id} {run.status}" + (f": {run.reason}" if run.reason else "")
            + f"; next scheduled run in {max(0, nxt - time.time()):.0f} s")

    def _loop(self) -> None:
        while not self.stopping.is_set():
            if self.pending is None and self.schedule.due(time.time()):
                self.request_run("schedule")
            if self.pending is not None and not self.stopping.is_set():
                if not self.swept:  # what a killed agent left behind goes before anything new starts
                    self._sweep()
                self._one(self.pending)
                continue
            self.wake.wait(min(5.0, max(0.05, self.schedule.wait_s(time.time()))))
            self.wake.clear()

    def alive(self) -> bool:
        return self.loop_thread.is_alive() or not self.started.is_set()

    # -- life ------------------------------------------------------------------------------------

    def stop(self, why: str = "stopping") -> None:
        if not self.stopping.is_set():
            log(f"{why}: the run in flight (if any) is stopped and cleaned up")
        self.stopping.set()
        self.ctx.child.stop()
        self.wake.set()

    def serve(self) -> int:
        c = self.config
        try:
            self.server = Server(self, c.host, c.port, c.http_timeout_s)
        except OSError as exc:
            raise UsageError(f"--listen {c.host}:{c.port}: {exc.strerror or exc}") from None
        self._restore()
        self._read_drift()
        self.schedule.start(time.time())
        self.server.start()
        log(f"listening on {c.host}:{self.server.port}; store {c.store}; every {c.every_s:g} s, first run in "
            f"{c.first_after_s:g} s; workloads {c.describe_workloads()}")
        if self.token.read() is None:
            log("POST /runs is refused: " + (f"{c.token_file} holds no token (yet)" if c.token_file else
                                             "no --token-file") + "; scheduled runs go on")
        handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            handlers[sig] = signal.signal(sig, lambda s, f: self.stop(f"got {signal.Signals(s).name}"))
        try:
            self.loop_thread.start()
            self.started.set()
            while self.loop_thread.is_alive():
                self.loop_thread.join(0.5)
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)
            self.server.stop()
            self.ledger.close()
        log("stopped")
        return 0
