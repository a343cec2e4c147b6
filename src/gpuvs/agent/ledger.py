"""The agent's runs, kept in the store's SQLite file (table agent_runs): a row per run, written as it goes.

So the runs and the experiments they made survive a restart.
A run found `running` at start was cut short (the agent's pod killed outright): it is marked `interrupted`.
A store that cannot be written raises LedgerError in one line; the agent keeps running and says so."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from gpuvs.store.db import volume_state

SCHEMA = """CREATE TABLE IF NOT EXISTS agent_runs (
  id TEXT PRIMARY KEY, trigger TEXT NOT NULL, status TEXT NOT NULL, queued_at REAL, started_at REAL,
  finished_at REAL, record TEXT NOT NULL)"""
STATUSES = ("queued", "running", "ok", "no-verdict", "failed", "interrupted")  # no-verdict: no node judged


class LedgerError(Exception):
    """The store cannot be opened or written: one line, with the path."""


def volume(path: Path) -> str:
    """What is wrong with the store's volume, if it is plain: read-only, or no space left."""
    state = volume_state(path.parent if not path.is_dir() else path)
    return {"read-only": " (its volume is mounted read-only)", "full": " (its volume is full: no space left)"}.get(state, "")


@dataclass
class FleetOutcome:
    """One workload's fleet in a run: its experiment, how it ended, its failed trials by reason."""

    workload: str
    experiment: str | None = None
    status: str = "ok"  # ok | no-verdict (a result that judged no node) | failed (no result) | not run
    error: str = ""
    failed_trials: dict[str, int] = field(default_factory=dict)  # error kind -> trials (preempted, crash, ...)


@dataclass
class RunRecord:
    id: str
    trigger: str  # schedule | api
    status: str = "queued"
    queued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    reason: str = ""  # why it failed or was interrupted
    reached: bool = False  # it reached the cluster's API
    tested: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it was not tested
    gone: list[str] = field(default_factory=list)  # nodes with results that are no longer in the cluster
    validate: str | None = None  # the validate experiment's id
    checks: dict[str, str] = field(default_factory=dict)  # "suite: check" -> pass | shared | FAIL | not run
    fleets: list[FleetOutcome] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        known = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in data.items() if k in known and k != "fleets"})
        out.fleets = [FleetOutcome(**{k: v for k, v in f.items() if k in {x.name for x in fields(FleetOutcome)}})
                      for f in data.get("fleets") or []]
        return out


class Ledger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(SCHEMA)
                db.commit()
            except sqlite3.Error as exc:
                raise LedgerError(f"the store {self.path} cannot be written: {exc}{volume(self.path)}") from None
            self._db = db
        return self._db

    def open(self) -> list[RunRecord]:
        """Open (or create) the table; the runs left `running` or `queued` by an agent that did not end them are
        marked interrupted. Those runs."""
        with self._writing(why_volume=True) as db:  # a real write: a read-only or full volume says so now
            db.execute("CREATE TABLE IF NOT EXISTS agent_probe (at REAL)")
            db.execute("INSERT INTO agent_probe VALUES (?)", (time.time(),))
            db.execute("DELETE FROM agent_probe")
        cut = []
        for r in self.runs(limit=1000):
            if r.status in ("running", "queued"):
                r.status, r.reason = "interrupted", "the agent stopped before the run ended (its pod was killed)"
                self.save(r)
                cut.append(r)
        return cut

    def save(self, run: RunRecord) -> None:
        with self._writing() as db:
            db.execute("INSERT OR REPLACE INTO agent_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (run.id, run.trigger, run.status, run.queued_at, run.started_at, run.finished_at,
                        json.dumps(run.to_dict(), sort_keys=True)))

    @contextlib.contextmanager
    def _writing(self, why_volume: bool = False) -> Iterator[sqlite3.Connection]:
        """One write, committed, under the lock; a failed one rolled back and raised as LedgerError (with what
        the volume says of itself where why_volume)."""
        with self._lock:
            try:
                db = self._conn()
                yield db
                db.commit()
            except sqlite3.Error as exc:
                try:
                    self._db and self._db.rollback()
                except sqlite3.Error:
                    pass
                hint = volume(self.path) if why_volume else ""
                raise LedgerError(f"the store {self.path} cannot be written: {exc}{hint}") from None

    def _reader(self) -> sqlite3.Connection:
        """The connection to read with: the usual one, else (a store on a read-only or full volume) a read-only
        one, so that the runs already kept are still shown."""
        try:
            return self._conn()
        except LedgerError:
            if not self.path.exists():
                raise
            try:
                db = sqlite3.connect(f"file:{self.path.resolve()}?mode=ro&immutable=1", uri=True,
                                     check_same_thread=False)
                db.execute("SELECT COUNT(*) FROM agent_runs").fetchone()
                return db
            except sqlite3.Error as exc:
                raise LedgerError(f"the store {self.path} cannot be read: {exc}") from None

    def runs(self, limit: int = 50) -> list[RunRecord]:
        """The latest runs first."""
        with self._lock:
            try:
                rows = self._reader().execute("SELECT record FROM agent_runs ORDER BY queued_at DESC LIMIT ?",
                                            (limit,)).fetchall()
            except sqlite3.Error as exc:
                raise LedgerError(f"the store {self.path} cannot be read: {exc}") from None
        return [RunRecord.from_dict(json.loads(r[0])) for r in rows]

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            try:
                row = self._reader().execute("SELECT record FROM agent_runs WHERE id = ?", (run_id,)).fetchone()
            except sqlite3.Error as exc:
                raise LedgerError(f"the store {self.path} cannot be read: {exc}") from None
        return RunRecord.from_dict(json.loads(row[0])) if row else None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
