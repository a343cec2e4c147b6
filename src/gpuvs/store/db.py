"""SQLite store: one file, WAL, every trial's events kept as they arrive.

Samples are written in batches by gpuvs, never the worker, so the cost stays out of the measured loop.
A gpuvs killed outright loses at most the last second of its trial in flight: the next open marks it interrupted.
Every SQLite error is one line saying what is wrong and what to do; rows are typed records (store/records.py)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import socket
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterable

from gpuvs.errors import UsageError
from gpuvs.store.records import (
    ExperimentListing,
    ExperimentMeta,
    ExperimentRecord,
    OutputRecord,
    SampleRecord,
    TelemetryRecord,
    TrialRecord,
    json_value,
)
from gpuvs.safetext import safe_row

SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL, created REAL NOT NULL, meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  experiment_id TEXT NOT NULL REFERENCES experiments(id),
  run_id TEXT NOT NULL, arm TEXT NOT NULL, trial INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
  workload TEXT NOT NULL, status TEXT NOT NULL, error TEXT, error_kind TEXT,
  spec TEXT NOT NULL, fingerprint TEXT, config TEXT, startup TEXT, metrics TEXT, summary TEXT,
  started REAL NOT NULL, ended REAL, exit_code INTEGER, owner TEXT, contention TEXT
);
CREATE TABLE IF NOT EXISTS samples (
  trial_id INTEGER NOT NULL REFERENCES trials(id), series TEXT NOT NULL, step INTEGER NOT NULL,
  value REAL, unit TEXT, seconds REAL, items REAL, extra TEXT
);
CREATE TABLE IF NOT EXISTS telemetry (
  trial_id INTEGER NOT NULL REFERENCES trials(id), t REAL NOT NULL, gpu INTEGER, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outputs (
  trial_id INTEGER NOT NULL REFERENCES trials(id), stream TEXT NOT NULL, text TEXT NOT NULL, bytes INTEGER,
  lines INTEGER, cut INTEGER
);
CREATE INDEX IF NOT EXISTS samples_trial ON samples(trial_id);
CREATE INDEX IF NOT EXISTS outputs_trial ON outputs(trial_id);
CREATE INDEX IF NOT EXISTS telemetry_trial ON telemetry(trial_id);
CREATE INDEX IF NOT EXISTS trials_experiment ON trials(experiment_id);
"""

STATUSES = ("running", "ok", "failed", "interrupted")
FLUSH_INTERVAL_S = 1.0  # a trial in flight's samples are written this often: a SIGKILL loses at most this much
JSON_COLUMNS = ("spec", "fingerprint", "config", "startup", "metrics", "summary", "contention")
# Columns added to a table after stores were first written: (table, column, type). Opening a writable store adds
# those it lacks; a read-only one is read without them (records.py reads a missing column as None).
ADDED_COLUMNS = (("trials", "contention", "TEXT"),)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(owner: str | None) -> bool:
    if not owner:
        return False
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname():
        return True  # cannot tell; leave it
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


class StoreError(UsageError):
    """The store's file cannot be used as it is. reason: folder, busy, full, read-only, cannot-open, not-a-store,
    damaged or other: what a caller may act on (a store on a full disk can still be read)."""

    def __init__(self, message: str, reason: str = "other"):
        super().__init__(message)
        self.reason = reason


class _Checked:
    """The connection, with every SQLite error turned into one line: the path, the cause, what to do."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        self._db, self._path = db, path

    def execute(self, sql: str, args: Any = ()) -> _CheckedCursor:
        try:
            return _CheckedCursor(self._db.execute(sql, args), self._path)
        except sqlite3.DatabaseError as exc:
            raise _store_error(self._path, exc) from None

    def executescript(self, sql: str) -> None:
        try:
            self._db.executescript(sql)
        except sqlite3.DatabaseError as exc:
            raise _store_error(self._path, exc) from None

    def close(self) -> None:
        self._db.close()

    def backup(self, target: sqlite3.Connection) -> None:
        self._db.backup(target)


class _CheckedCursor:
    """A cursor whose rows are read with the same care: a damaged page met while fetching is one line too."""

    def __init__(self, cur: sqlite3.Cursor, path: Path):
        self._cur, self._path = cur, path

    @property
    def lastrowid(self) -> int | None:
        return self._cur.lastrowid

    def fetchone(self) -> sqlite3.Row | None:
        try:
            return self._cur.fetchone()
        except sqlite3.DatabaseError as exc:
            raise _store_error(self._path, exc) from None

    def fetchall(self) -> list[sqlite3.Row]:
        try:
            return self._cur.fetchall()
        except sqlite3.DatabaseError as exc:
            raise _store_error(self._path, exc) from None

    def __iter__(self):
        return iter(self.fetchall())


def _store_error(path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """One line for a SQLite error: what is wrong, by SQLite's own code (the file is a folder, the disk is full,
    the file or its folder is read-only, another writer holds it, not a database), and what to do. Only a file
    SQLite finds corrupt is "damaged", with the way to recover what it holds."""
    cause = str(exc)
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # the primary code of an extended one
    if path.is_dir():
        return StoreError(f"store {path} is a folder, not a file: name a file with --store, e.g. --store "
                          f"{path / 'gpuvs.db'}", "folder")
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in cause or "busy" in cause:
        return StoreError(f"store {path} is busy ({cause}): another gpuvs is writing it; wait for it, or use "
                          "--store with another file", "busy")
    space = volume_state(path.parent)
    if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and space == "full"):
        return StoreError(f"store {path} cannot be written: the disk is full ({cause}); what it holds is kept: "
                          "free some space, or run with --store on another disk", "full")
    if code == sqlite3.SQLITE_READONLY or "readonly" in cause or "read-only" in cause or (
            code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_PERM) and space == "read-only"):
        where = "its folder is on a read-only file system" if space == "read-only" else "it is read-only"
        if not path.exists():
            return StoreError(f"cannot create store {path}: {where} ({cause}); run where you can write, or name "
                              "a writable place with --store", "read-only")
        return StoreError(f"store {path} cannot be written: {where} ({cause}); results can be listed, shown and "
                          "reported from it, but a run needs --store on a writable folder", "read-only")
    if code == sqlite3.SQLITE_CANTOPEN:
        verb = "open" if path.exists() else "create"
        return StoreError(f"cannot {verb} store {path} ({cause}): check that its folder can be written and the file "
                          "read, or name another with --store", "cannot-open")
    if code == sqlite3.SQLITE_NOTADB or "not a database" in cause:
        return StoreError(f"{path} is not a gpuvs store ({cause}): name another file with --store", "not-a-store")
    if code == sqlite3.SQLITE_CORRUPT or "malformed" in cause:
        return StoreError(f"store {path} is damaged ({cause}): keep a copy of it, then recover what can be read "
                          f"with `sqlite3 {path} .recover | sqlite3 recovered.db`, or run with --store NEW.db", "damaged")
    return StoreError(f"store {path} cannot be used ({cause}); what it holds is kept: run with --store NEW.db")


def _file_id(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file a path names now; None where it names nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _open_path_of(file_id: tuple[int, int] | None) -> Path | None:
    """Where a file this process holds open is now, by its (st_dev, st_ino): the name /proc/self/fd gives it, while
    that name still leads to it; None where it was deleted, or this system has no /proc."""
    if file_id is None:
        return None
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
            if (st.st_dev, st.st_ino) != file_id:
                continue
            name = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
        if _file_id(name) == file_id:  # a deleted file reads "NAME (deleted)", which names nothing or another
            return name
    return None


def volume_state(folder: Path) -> str:
    """What the file system of a folder says of itself: "read-only", "full" or "" (the store's and the agent's
    ledger's messages name it)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    if st.f_flag & os.ST_RDONLY:
        return "read-only"
    if st.f_bavail == 0:
        return "full"
    return ""


def _read_only(path: Path) -> sqlite3.Connection:
    """A connection that never writes: a live reader (mode=ro: it sees what a writer such as the agent's run
    adds meanwhile) where SQLite can use the WAL index beside the file; on a read-only mount, where no WAL
    index can be made and nobody writes the file meanwhile, the file as it stands (immutable)."""
    uri = f"file:{path.resolve()}?mode=ro"
    raw = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        raw.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return raw
    except sqlite3.OperationalError:
        raw.close()
        return sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None)


class Store:
    def __init__(self, path: str | os.PathLike = "gpuvs.db", flush_interval_s: float = FLUSH_INTERVAL_S,
                 readonly: bool | None = None):
        """readonly: None (read-only where the file or its folder cannot be written), or True: read only, e.g. a
        store on a full volume that the agent still reads its earlier results from."""
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            raise UsageError(f"cannot create store {self.path}: folder {self.path.parent} does not exist")
        self.readonly = self.path.exists() and (bool(readonly) or not (os.access(self.path, os.W_OK) and
                                                                       os.access(self.path.parent or ".", os.W_OK)))
        try:
            if self.readonly:
                raw = _read_only(self.path)
            else:
                raw = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            raw.row_factory = sqlite3.Row
        except sqlite3.DatabaseError as exc:
            raise _store_error(self.path, exc) from None
        self.db = _Checked(raw, self.path)
        self._opened: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._written: dict[str, set[int]] = {}  # experiment id -> its trials this Store wrote: what must read back
        if not self.readonly:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(SCHEMA)
            self._migrate()
            self._opened = _file_id(self.path)
        else:
            self.db.execute("SELECT COUNT(*) FROM experiments").fetchone()  # a damaged file says so now
        self.flush_interval_s = flush_interval_s
        self.write_seconds = 0.0  # time gpuvs spent writing events (reported by the storing-cost test)
        self._pending: dict[int, list[SampleRecord | TelemetryRecord]] = {}
        self._flushed_at: dict[int, float] = {}
        if not self.readonly:
            self._reap_orphans()

    def _migrate(self) -> None:
        """Add the columns a store written by an earlier version lacks (ADDED_COLUMNS); its rows keep NULL there."""
        for table, column, kind in ADDED_COLUMNS:
            have = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})").fetchall()}
            if column not in have:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def close(self, check: bool = True) -> None:
        """Checkpoint what this Store wrote into the main file, close, and (check) make sure that it is where it
        was said to be: the path still names the file opened (its device and inode), and every experiment written
        reads back from it with its trials. Otherwise StoreError (reason "moved"), one line saying where the data is:
        the file's new name, a copy saved beside the path when the file was deleted or replaced, or lost."""
        problem = None
        check = check and str(self.path) != ":memory:"  # SQLite's in-memory store has no file to find again
        if not self.readonly:
            moved = check and bool(self._written) and _file_id(self.path) != self._opened
            try:  # TRUNCATE where moved: the WAL left at the old name must hold nothing another file could take
                self.db.execute(f"PRAGMA wal_checkpoint({'TRUNCATE' if moved else 'PASSIVE'})").fetchone()
            except StoreError:
                pass  # a full disk: the WAL keeps it, and SQLite's own close tries again
            if moved and check:
                problem = self._where_now()
        self.db.close()
        if problem:
            message, kept_in = problem
            missing = self._missing(kept_in) if kept_in else []
            if missing:
                message += f"; but {'; '.join(missing)} does not read back from {kept_in}"
            raise StoreError(message, "moved")
        if check and self._written and not self.readonly:
            missing = self._missing(self.path)
            if missing:
                raise StoreError(f"store {self.path} does not read back what this run wrote: {'; '.join(missing)} "
                                 "missing (was the file replaced as the run ended?); what is missing is lost", "moved")

    def _where_now(self) -> tuple[str, Path | None]:
        """The line for a store whose path no longer names the file this Store opened: where its data is now.
        Still open, the file is found among this process's descriptors (Linux's /proc/self/fd names its new
        path); a file deleted, or moved where that cannot tell, is copied out through this connection."""
        exps = ", ".join(sorted(self._written))
        now = "now names another file" if self.path.exists() else "no longer exists"
        moved_to = _open_path_of(self._opened)
        if moved_to is not None and moved_to != self.path.resolve():
            return (f"store {self.path} was moved to {moved_to} while this run wrote it: experiment {exps} is kept "
                    f"there, not in {self.path} (which {now}); read it with --store {moved_to}", moved_to)
        rescue = self.path.with_name(f"{self.path.name}.rescued-{int(time.time())}.db")
        try:
            with contextlib.closing(sqlite3.connect(str(rescue))) as out:
                self.db.backup(out)
        except (sqlite3.Error, OSError) as exc:
            return (f"store {self.path} was deleted or replaced while this run wrote it ({self.path} {now}), and "
                    f"experiment {exps} could not be saved elsewhere ({exc}): it is lost", None)
        return (f"store {self.path} was deleted or replaced while this run wrote it ({self.path} {now}): experiment "
                f"{exps} was saved to {rescue}; read it with --store {rescue}", rescue)

    def _missing(self, path: Path) -> list[str]:
        """What this Store wrote that a new connection does not read from `path`: experiments, trials. The connection
        may write (mode=rw, never creating the file), so that as the last one it removes the WAL files it made, as a
        read-only one cannot."""
        missing = []
        try:
            uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=rw"
            with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
                for exp, trials in self._written.items():
                    if db.execute("SELECT 1 FROM experiments WHERE id=?", (exp,)).fetchone() is None:
                        missing.append(f"experiment {exp}")
                        continue
                    found = db.execute("SELECT COUNT(*) FROM trials WHERE experiment_id=?", (exp,)).fetchone()[0]
                    if found < len(trials):
                        missing.append(f"{len(trials) - found} of experiment {exp}'s {len(trials)} trial(s)")
        except sqlite3.Error as exc:
            missing.append(f"anything ({exc})")
        return missing

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(check=exc_type is None)  # an error on its way out is not replaced by this one

    def _reap_orphans(self) -> None:
        """Trials left 'running' by a gpuvs process that no longer exists were interrupted; what they had
        measured (the samples written while they ran) is kept and summarised."""
        from gpuvs.store.summary import summarize_samples

        rows = self.db.execute("SELECT id, owner, summary FROM trials WHERE status='running'").fetchall()
        for row in rows:
            if _pid_alive(row["owner"]):
                continue
            samples = self.samples(row["id"])
            summary = row["summary"] or _json(summarize_samples(samples))
            self.db.execute("UPDATE trials SET status='interrupted', error=COALESCE(error, "
                            "'gpuvs stopped while this trial ran'), summary=? WHERE id=?",
                            (summary if samples else row["summary"], row["id"]))

    # -- writing ---------------------------------------------------------------------------------

    def create_experiment(self, experiment_id: str, name: str, kind: str, meta: ExperimentMeta,
                          created: float | None = None) -> None:
        """`created`: unix seconds (default now); a run imported from elsewhere keeps the time it was made."""
        self.db.execute("INSERT OR IGNORE INTO experiments (id, name, kind, created, meta) VALUES (?,?,?,?,?)",
                        (experiment_id, name, kind, time.time() if created is None else float(created), _json(meta)))
        self._written.setdefault(experiment_id, set())

    def set_meta(self, experiment_id: str, meta: ExperimentMeta) -> None:
        """Replace an experiment's meta in one committed write (runs that are not trials, such as
        `gpuvs validate`, keep each result there as soon as it is known)."""
        self.db.execute("UPDATE experiments SET meta=? WHERE id=?", (_json(meta), experiment_id))

    def update_meta(self, experiment_id: str, **items: Any) -> None:
        """Set fields of an experiment's meta (a fleet run keeps its verdicts there)."""
        self.set_meta(experiment_id, dataclasses.replace(self.experiment(experiment_id).meta, **items))

    def begin_trial(self, spec, attempt: int = 0) -> int:
        if not spec.experiment_id:
            spec.experiment_id = f"trial-{spec.run_id}"
        self.create_experiment(spec.experiment_id, spec.workload, "trial", ExperimentMeta())  # no-op if it exists
        cur = self.db.execute(
            "INSERT INTO trials (experiment_id, run_id, arm, trial, attempt, workload, status, spec, started, owner)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)",
            (spec.experiment_id, spec.run_id, spec.arm, spec.trial, attempt, spec.workload, "running",
             spec.to_json(), time.time(), _owner()))
        trial_id = int(cur.lastrowid)
        self._written.setdefault(spec.experiment_id, set()).add(trial_id)
        self._pending[trial_id] = []
        return trial_id

    def add_event(self, trial_id: int, event: dict[str, Any]) -> None:
        """One event of the worker protocol: a sample, a telemetry reading or a command's output waits for the
        next write."""
        if event["type"] == "sample":
            self._pending.setdefault(trial_id, []).append(SampleRecord.from_event(event, trial_id))
        elif event["type"] == "telemetry":
            self._pending.setdefault(trial_id, []).append(TelemetryRecord.from_event(event))
        elif event["type"] == "output":
            self._pending.setdefault(trial_id, []).append(OutputRecord.from_event(event, trial_id))

    def due(self, trial_id: int) -> bool:
        """Events of this trial have waited FLUSH_INTERVAL_S or more since its last write."""
        if not self._pending.get(trial_id):
            return False
        last = self._flushed_at.setdefault(trial_id, time.monotonic())
        return time.monotonic() - last >= self.flush_interval_s

    def flush(self, trial_id: int, **json_fields: Any) -> None:
        """Write the trial's waiting events (and its fingerprint, start-up... so far) in one transaction,
        the trial still 'running'."""
        self._flushed_at[trial_id] = time.monotonic()
        self._transaction(trial_id, [], [], json_fields)

    def _write_events(self, trial_id: int) -> None:
        for rec in self._pending.pop(trial_id, []):
            if isinstance(rec, SampleRecord):
                self.db.execute("INSERT INTO samples VALUES (?,?,?,?,?,?,?,?)",
                                (trial_id, rec.series, rec.step, rec.value, rec.unit, rec.seconds, rec.items,
                                 json.dumps(rec.extra)))
            elif isinstance(rec, OutputRecord):  # a command's output on one stream, capped: the last one sent stands
                self.db.execute("DELETE FROM outputs WHERE trial_id=? AND stream=?", (trial_id, rec.stream))
                self.db.execute("INSERT INTO outputs VALUES (?,?,?,?,?,?)",
                                (trial_id, rec.stream, rec.text, rec.bytes, rec.lines, rec.cut))
            else:
                self.db.execute("INSERT INTO telemetry VALUES (?,?,?,?)", (trial_id, rec.t, rec.gpu, json.dumps(rec.data)))

    def finish_trial(self, trial_id: int, status: str, *, error: str | None = None, error_kind: str | None = None,
                     exit_code: int | None = None, **json_fields: Any) -> None:
        assert status in STATUSES
        self._transaction(trial_id, ["status=?", "error=?", "error_kind=?", "exit_code=?", "ended=?"],
                          [status, error, error_kind, exit_code, time.time()], json_fields)
        self._flushed_at.pop(trial_id, None)

    def _transaction(self, trial_id: int, sets: list[str], args: list[Any], json_fields: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        sets, args = list(sets), list(args)
        for col, value in json_fields.items():
            if col not in JSON_COLUMNS:
                raise ValueError(col)
            sets.append(f"{col}=?")
            args.append(_json(value))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self._write_events(trial_id)
            if sets:
                self.db.execute(f"UPDATE trials SET {', '.join(sets)} WHERE id=?", (*args, trial_id))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        self.write_seconds += time.perf_counter() - t0

    # -- reading ---------------------------------------------------------------------------------

    def trials(self, experiment_id: str | None = None, status: str | None = None,
               with_samples: bool = False, with_telemetry: bool = False) -> list[TrialRecord]:
        q, args = "SELECT * FROM trials WHERE 1=1", []
        if experiment_id:
            q += " AND experiment_id=?"
            args.append(experiment_id)
        if status:
            q += " AND status=?"
            args.append(status)
        out = [TrialRecord.from_row(r) for r in self.db.execute(q + " ORDER BY id", args)]
        for t in out:
            if with_samples:
                t.samples = self.samples(t.id)
            if with_telemetry:
                t.telemetry = self.telemetry(t.id)
        return out

    def trial(self, trial_id: int) -> TrialRecord:
        row = self.db.execute("SELECT * FROM trials WHERE id=?", (trial_id,)).fetchone()
        if row is None:
            raise UsageError(f"no trial {trial_id} in {self.path}")
        return TrialRecord.from_row(row)

    def experiments(self) -> list[ExperimentListing]:
        rows = self.db.execute(
            "SELECT e.*, COUNT(t.id) AS n_trials, SUM(t.status='ok') AS n_ok, MIN(t.workload) AS workload "
            "FROM experiments e LEFT JOIN trials t ON t.experiment_id=e.id GROUP BY e.id ORDER BY e.created")
        return [ExperimentListing.from_row(r) for r in rows]

    def experiment(self, experiment_id: str) -> ExperimentRecord:
        """An experiment by its id, else by its name (--name) or the start of its id: one line where none or
        several match."""
        row = self.db.execute("SELECT * FROM experiments WHERE id=?", (experiment_id,)).fetchone()
        if row is None:
            named = self.db.execute("SELECT * FROM experiments WHERE name=? ORDER BY created",
                                    (experiment_id,)).fetchall()
            starts = self.db.execute("SELECT * FROM experiments WHERE substr(id, 1, ?) = ? ORDER BY created",
                                     (len(experiment_id), experiment_id)).fetchall()
            matches = list({m["id"]: m for m in [*named, *starts]}.values())
            if not matches:
                raise UsageError(f"no experiment {experiment_id!r} (as an id, its start or a name) in {self.path} "
                                 f"(see: gpuvs results list)")
            if len(matches) > 1:
                shown = ", ".join(m["id"] for m in matches[:10]) + (f" and {len(matches) - 10} more"
                                                                    if len(matches) > 10 else "")
                what = ("is the name of" if not starts else "is the start of" if not named
                        else "is the name or the start of the id of")
                raise UsageError(f"{experiment_id!r} {what} {len(matches):,} experiments in {self.path}: "
                                 f"{shown}; give {'more of the id' if not named else 'the id'}")
            row = matches[0]
        return ExperimentRecord.from_row(row)

    def samples(self, trial_id: int) -> list[SampleRecord]:
        rows = self.db.execute("SELECT * FROM samples WHERE trial_id=? ORDER BY rowid", (trial_id,))
        return [SampleRecord(r["trial_id"], r["series"], r["step"], r["value"], r["unit"], r["seconds"], r["items"],
                             json.loads(r["extra"] or "{}")) for r in rows]

    def outputs(self, trial_id: int) -> list[OutputRecord]:
        """A command trial's own output, one record per stream (stdout first)."""
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE name='outputs'").fetchone() is None:
            return []  # a read-only store written before outputs were kept
        rows = self.db.execute("SELECT * FROM outputs WHERE trial_id=? ORDER BY stream DESC", (trial_id,))
        return [OutputRecord(r["trial_id"], r["stream"], r["text"], r["bytes"], r["lines"], r["cut"]) for r in rows]

    def telemetry(self, trial_id: int) -> list[TelemetryRecord]:
        rows = self.db.execute("SELECT * FROM telemetry WHERE trial_id=? ORDER BY rowid", (trial_id,))
        return [TelemetryRecord(r["t"], r["gpu"], json.loads(r["data"])) for r in rows]

    # -- export ----------------------------------------------------------------------------------

    def export(self, fmt: str, experiment_id: str | None = None, with_samples: bool = True) -> str:
        if fmt == "json":
            trials = self.trials(experiment_id, with_samples=with_samples, with_telemetry=with_samples)
            return json.dumps({"store": str(self.path), "experiments": [e.to_dict() for e in self.experiments()],
                               "trials": [t.to_dict() for t in trials]}, indent=2, default=str)
        if fmt == "csv":
            return trials_csv(self.trials(experiment_id))
        raise UsageError(f"unknown export format {fmt!r}; use json or csv")


def open_existing(path: str | os.PathLike) -> Store:
    """An existing store (reading results); one line when there is none. On a full disk, where opening it to
    write fails, it is read as it stands: what it holds is shown."""
    if not Path(path).exists():
        raise UsageError(f"no store at {path} (run something first, or pass --store PATH)")
    try:
        return Store(path)
    except StoreError as exc:
        if exc.reason != "full":
            raise
        return Store(path, readonly=True)


def _json(value: Any) -> str:
    """A column's JSON text: records by their to_dict."""
    return json.dumps(json_value(value), default=str)


def trials_csv(trials: Iterable[TrialRecord]) -> str:
    """One row per trial and series: the columns people put in spreadsheets; `trial` counts from 1, as every
    report does (trial 1 is the first)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["trial_id", "experiment_id", "arm", "trial", "workload", "status", "device", "env", "series",
                "value", "unit", "pm", "jitter", "n", "gpu", "error"])
    for t in trials:
        device = t.spec.device if t.spec else None
        env = t.spec.env.kind if t.spec else ""
        for series, s in list(t.summary.items()) or [("", None)]:
            figures = [s.value, s.unit, s.pm, s.jitter, s.n] if s else [None] * 5
            w.writerow(safe_row([t.id, t.experiment_id, t.arm, t.trial + 1, t.workload, t.status, device, env, series,
                                 *figures, t.fingerprint.get("gpu_name"), t.error or ""]))
    return buf.getvalue()
