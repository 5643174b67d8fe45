"""SQLite run store: runs, ramp levels, per-request records, telemetry samples, server log.

One file (default :func:`app.paths.runs_db_path`), stdlib :mod:`sqlite3` in WAL mode with
``synchronous=NORMAL``. Writes are buffered in memory and committed by a background
flusher on a fixed cadence of ``flush_interval`` seconds (default
:data:`FLUSH_INTERVAL_S` = 0.25 s, measured from the start of one commit to the next), so
an app killed even by SIGKILL loses at most the rows handed to the store in the last
:data:`LOSS_BOUND_S` = 0.5 s (one interval plus the commit; issue 15, item 8); reads flush
first, so a reader always sees its own writes. Level rows and run updates are written at
once.

Runs left ``running`` by a writer that is gone (killed): each run records the process
that writes it (``runs.writer``, :func:`app.helper_process.process_marker`: pid and start
time); when a store is opened, a ``running`` run whose writer no longer runs — or that
names none (a store of an older version) — becomes ``interrupted``, with what it stored
kept (:meth:`RunStore.mark_interrupted`).

Times: ``t`` columns are seconds on the session clock (:class:`app.clock.SessionClock`,
``clock.now()``); ``runs.created`` is Unix wall time and ``runs.clock_wall0`` maps the
session clock to wall time (``wall = clock_wall0 + t``).

Layout versions: ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`); an older file is
migrated step by step at open (:data:`MIGRATIONS`), a newer one is refused untouched.

Thread-safe: one connection shared under a lock (``check_same_thread=False``).

A store that cannot be written (issue 15 item 10: a full disk, a read-only home, no
permission) never ends in a traceback and never drops what it was given:

- opening: a file that cannot be opened for writing is opened read-only (or, when it
  does not exist and cannot be created, an empty store is used in memory);
  :attr:`RunStore.read_only` says why, naming the path and the cause;
- buffered rows (requests, samples, log lines) stay in memory while a commit fails and
  are committed by a later flush once the disk takes them again; :attr:`RunStore.write_problem`
  holds the last failure, ``None`` after a commit succeeds;
- a write that cannot be done now (a run, a level, a summary) raises
  :class:`StoreWriteError` naming the path and the cause (:func:`storage_cause`), which
  the run recorder (app.run.record) keeps and retries;
- reads still work while writes fail; :meth:`RunStore.close` never raises for a full
  disk (what it could not write is logged with its count).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from app.helper_process import marker_alive, process_marker
from app.metrics import store_columns
from app.paths import runs_db_path

#: seconds between the background commits of buffered rows (start to start)
FLUSH_INTERVAL_S = 0.25
#: the most recent seconds of buffered rows an app killed by SIGKILL can lose: one commit
#: interval and the commit itself (issue 15, item 8: "at most one commit interval, ≤ 0.5 s")
LOSS_BOUND_S = 0.5
#: the status a run gets when its writer is gone without closing it
INTERRUPTED = "interrupted"

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- schema versions
# ``PRAGMA user_version`` holds the layout version. ``MIGRATIONS[v]`` brings a database
# from version v to v+1; :class:`RunStore` runs the missing ones in order, in one
# transaction, and writes the new version after them. A migration is frozen once
# released (a later layout change is a new migration appended to the list) and is
# safe to run on a database that already has some of its changes (IF NOT EXISTS,
# column checks), so a half-upgraded file from a pre-versioned build still migrates.
#
# v0: an empty file, or a store from before user_version was written (the v1 tables,
#     possibly missing columns that were added later).
# v1: the tables below.
# v2: runs.writer — the process marker of the app writing a run (issue 15, item 8) — and
#     the tunes table (issue 18).
# v3: the launches table (issue 19).
# v4: requests.turn — a multi-turn request's turn of its conversation (issue 32).

#: v1 tables: name → (column definitions, table constraints). Frozen: do not edit for v2+.
_V1_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "runs": ((
        "id INTEGER PRIMARY KEY AUTOINCREMENT",
        "created REAL NOT NULL",
        "name TEXT NOT NULL DEFAULT ''",
        "engine TEXT NOT NULL DEFAULT ''",
        "config TEXT",
        "spec TEXT",
        "plan TEXT",
        "capacity TEXT",
        "summary TEXT",
        "status TEXT NOT NULL DEFAULT 'running'",
        "clock_wall0 REAL",
        "finished REAL",
    ), ()),
    "levels": ((
        "run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE",
        "idx INTEGER NOT NULL",
        "level REAL NOT NULL",
        "mode TEXT NOT NULL DEFAULT 'concurrency'",
        "t_start REAL", "t_end REAL",
        "n_measured INTEGER",
        "output_tps REAL", "total_tps REAL", "rps REAL", "goodput_rps REAL",
        "ttft_p50 REAL", "ttft_p99 REAL", "tpot_p50 REAL", "tpot_p99 REAL",
        "itl_p50 REAL", "itl_p99 REAL", "e2e_p50 REAL", "e2e_p99 REAL",
        "failure_rate REAL",
        "stats TEXT NOT NULL",
    ), ("PRIMARY KEY (run_id, idx)",)),
    "requests": ((
        "run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE",
        "level_idx INTEGER NOT NULL",
        "level REAL NOT NULL",
        "t_start REAL NOT NULL",
        "ttft REAL",
        "e2e REAL",
        "prompt_tokens INTEGER",
        "output_tokens INTEGER",
        "tokens_source TEXT",
        "status TEXT NOT NULL",
        "error TEXT",
        "chunk_offsets BLOB",
    ), ()),
    "server_log": ((
        "run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE",
        "t REAL NOT NULL",
        "stream TEXT NOT NULL",
        "line TEXT NOT NULL",
    ), ()),
    "samples": ((
        "run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE",
        "t REAL NOT NULL",
        "source TEXT NOT NULL",
        "name TEXT NOT NULL",
        "value REAL",
    ), ()),
}
_V1_INDEXES = (
    "CREATE INDEX IF NOT EXISTS requests_run ON requests(run_id, level_idx)",
    "CREATE INDEX IF NOT EXISTS server_log_run ON server_log(run_id, t)",
    "CREATE INDEX IF NOT EXISTS samples_run ON samples(run_id, source, name, t)",
)


class StoreVersionError(sqlite3.DatabaseError):
    """The run database cannot be used by this version (newer layout, or a migration failed)."""


class StoreWriteError(sqlite3.OperationalError):
    """The run store cannot be written now: ``path`` and ``cause`` (in words, from
    :func:`storage_cause`); ``str()`` names both."""

    def __init__(self, path: Path | str, cause: str) -> None:
        self.path, self.cause = Path(path), cause
        super().__init__(f"cannot write the run store {path}: {cause}")


#: OS error numbers that mean "this storage cannot take the write", in words
_OS_CAUSES = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
              errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
              errno.EPERM: "permission denied", errno.EIO: "a disk I/O error"}
#: SQLite result codes (``sqlite_errorname``, by prefix) and messages that mean the same
_SQLITE_CAUSES = (("SQLITE_FULL", "database or disk is full", "no space left on the device"),
                  ("SQLITE_READONLY", "readonly database", "the file cannot be written (read-only)"),
                  ("SQLITE_CANTOPEN", "unable to open database file", "the file cannot be opened or created there"),
                  ("SQLITE_IOERR", "disk i/o error", "a disk I/O error"),
                  ("SQLITE_PERM", "access permission denied", "permission denied"))


def storage_cause(path: Path | str, exc: BaseException) -> str | None:
    """Why ``exc`` (raised writing or opening the store at ``path``) is a storage
    problem, in words — the file system's own state first (read-only, no space left, no
    write permission on the folder), then the error's — or None when it is not one (a
    bug, a locked database: those are raised as they are)."""
    what = None
    if isinstance(exc, StoreWriteError):
        return exc.cause
    if isinstance(exc, OSError) and exc.errno in _OS_CAUSES:
        what = _OS_CAUSES[exc.errno]
    elif isinstance(exc, sqlite3.Error):
        name = (getattr(exc, "sqlite_errorname", "") or "").upper()
        text = str(exc).lower()
        for code, words, cause in _SQLITE_CAUSES:
            if name.startswith(code) or words in text:
                what = cause
                break
    if what is None:
        return None
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
        if st.f_flag & os.ST_RDONLY:
            return f"the file system is read-only ({what})" if "read-only" not in what else what
        free = st.f_bavail * st.f_frsize
        if free < 1 << 20 and "space" not in what:
            return f"no space left on the device ({free // 1024} KiB free; {what})"
        if "space" in what:
            return f"{what} ({free // 1024} KiB free)"
    except OSError:
        pass
    if not os.access(folder, os.W_OK) and "permission" not in what:
        return f"no permission to write in {folder} ({what})"
    return what


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    """v0 → v1: create the v1 tables and indexes; in a pre-versioned store, add the
    columns its tables lack (those that ``ALTER TABLE ADD COLUMN`` can add: not part of
    a key, nullable or with a default). Any other gap means the file is not a run store."""
    for table, (cols, constraints) in _V1_TABLES.items():
        have = _columns(db, table)
        if not have:
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(cols + constraints)})")
            continue
        for col in cols:
            name, decl = col.split(" ", 1)
            if name in have:
                continue
            u = decl.upper()
            if "PRIMARY KEY" in u or ("NOT NULL" in u and "DEFAULT" not in u):
                raise StoreVersionError(
                    f"table {table!r} has no column {name!r} and it cannot be added: this is not a vLLM Dyno "
                    "run store layout")
            db.execute(f"ALTER TABLE {table} ADD COLUMN {col}")
    for sql in _V1_INDEXES:
        db.execute(sql)


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """v1 → v2: ``runs.writer`` (``<pid>:<start ticks>`` of the process writing the run,
    issue 15) and the ``tunes`` table — one row per tune (issue 18): its spec, its state
    (candidates, measurements, fitted factors, launches: enough to resume), status
    (``running``, ``interrupted``, ``done``) and writer; the runs of its launches are
    ordinary runs, named in its state by id."""
    if "writer" not in _columns(db, "runs"):
        db.execute("ALTER TABLE runs ADD COLUMN writer TEXT")
    db.execute("CREATE TABLE IF NOT EXISTS tunes (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, "
               "name TEXT NOT NULL DEFAULT '', status TEXT NOT NULL DEFAULT 'running', spec TEXT, state TEXT, "
               "updated REAL, writer TEXT)")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """v2 → v3: the ``launches`` table (issue 19, item 3) — one row per launch that
    became ready: the configuration's key (:func:`app.run.launch_timing.launch_key`),
    the engine, the seconds to ready and each phase's start (JSON ``{phase: s}``), so
    the next launch of the same configuration can say how long it has left."""
    db.execute("CREATE TABLE IF NOT EXISTS launches (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, "
               "key TEXT NOT NULL, engine TEXT NOT NULL DEFAULT '', ready_s REAL NOT NULL, phases TEXT)")
    db.execute("CREATE INDEX IF NOT EXISTS launches_key ON launches(key, id)")


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    """v3 → v4: ``requests.turn`` — the turn of the request's conversation in a multi-turn
    ramp (1, 2, …; 0: not a conversation's turn; NULL: a request stored before v4, its
    turn not recorded)."""
    if "turn" not in _columns(db, "requests"):
        db.execute("ALTER TABLE requests ADD COLUMN turn INTEGER")


def _missing_level_columns(db: sqlite3.Connection) -> list[str]:
    """The ``levels`` columns the metric vocabulary declares (:func:`app.metrics.store_columns`) that the
    table lacks, as ``name TYPE`` (a table not yet made lacks none: it is made whole)."""
    have = _columns(db, "levels")
    return [] if not have else [f"{m.name} {m.sql}" for m in store_columns() if m.name not in have]


def _add_level_columns(db: sqlite3.Connection) -> None:
    """Add the declared ``levels`` columns the table lacks (a figure declared after the file was made, e.g.
    ``ttft_p90``): nullable, NULL for the levels stored before (their figures stay in ``stats``). Not a
    layout version: an older vLLM Dyno reads and writes the file as before."""
    for col in _missing_level_columns(db):
        db.execute(f"ALTER TABLE levels ADD COLUMN {col}")


#: ``MIGRATIONS[v]`` upgrades a store from version v to v+1 (called inside a transaction)
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1, _migrate_1_to_2, _migrate_2_to_3,
                                                          _migrate_3_to_4]
#: the layout version this app writes (``PRAGMA user_version``)
SCHEMA_VERSION = len(MIGRATIONS)


def _user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _newer_error(path: Path, found: int, known: int) -> StoreVersionError:
    return StoreVersionError(
        f"{path} is a run store of a newer vLLM Dyno (layout version {found}; this version reads up to "
        f"{known}). Upgrade vLLM Dyno to open it, or set VLLM_DYNO_HOME to use another data directory; "
        "the file was not modified")


def migrate(db: sqlite3.Connection, path: Path) -> tuple[int, int]:
    """Bring the open database to the current version; returns (old, new) version.

    ``db`` is in autocommit mode (``isolation_level=None``). The steps run in one
    ``BEGIN IMMEDIATE`` transaction (the version is read again under its lock, so two
    processes opening a fresh file migrate it once) and ``user_version`` is written after
    them; on any error everything is rolled back and :class:`StoreVersionError` names
    the file. A newer version than :data:`MIGRATIONS` knows raises without writing.
    """
    target = len(MIGRATIONS)
    v = _user_version(db)
    if v > target:
        raise _newer_error(path, v, target)
    if v == target and not _missing_level_columns(db):
        return v, v
    db.execute("BEGIN IMMEDIATE")
    old = v
    try:
        old = _user_version(db)  # again, under the write lock
        if old > target:
            raise _newer_error(path, old, target)
        for step in MIGRATIONS[old:]:
            step(db)
        _add_level_columns(db)
        if old != target:
            db.execute(f"PRAGMA user_version={int(target)}")
        db.execute("COMMIT")
    except BaseException as e:
        db.execute("ROLLBACK")
        if not isinstance(e, Exception) or str(path) in str(e):
            raise
        raise StoreVersionError(
            f"{path}: migrating the run store from layout version {old} to {target} failed ({e}); the file was "
            "not modified. Fix: upgrade vLLM Dyno, or move the file aside (a new one is started) and report "
            "the error") from e
    return old, target


_RUN_JSON = ("config", "spec", "plan", "capacity", "summary")
_REQ_COLS = ("run_id", "level_idx", "level", "t_start", "ttft", "e2e", "prompt_tokens", "output_tokens",
             "tokens_source", "status", "error", "chunk_offsets", "turn")


def _dumps(v: Any) -> str | None:
    if v is None:
        return None
    if hasattr(v, "model_dump"):
        v = v.model_dump(mode="json")
    return json.dumps(v, default=str)


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


class RunStore:
    """The run database.

    ``path``: SQLite file (created with its parent directory); default
    :func:`app.paths.runs_db_path`. ``flush_interval``: seconds between background
    commits of buffered writes (start to start). Use as a context manager or call
    :meth:`close`. Opening marks the runs whose writer is gone ``interrupted``
    (:meth:`mark_interrupted`; ``interrupted_runs``: their ids).
    Raises :class:`sqlite3.DatabaseError` when ``path`` is not an SQLite database, and
    :class:`StoreVersionError` (a subclass) when it comes from a newer vLLM Dyno (left
    untouched) or cannot be migrated. An older store is migrated at open (see
    :data:`MIGRATIONS`); ``migrated_from`` is the layout version it had.

    A store that cannot be written (see the module docstring) opens read-only:
    ``read_only`` is then the reason (path and cause), None otherwise; ``write_problem``
    is the last failed commit's reason (None once one succeeds).
    """

    def __init__(self, path: str | Path | None = None, *, flush_interval: float = FLUSH_INTERVAL_S) -> None:
        if path is None:
            path = runs_db_path()
        self.path = Path(path)
        self._lock = threading.RLock()
        self.read_only: str | None = None
        self.write_problem: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._open_rw()
        except (OSError, sqlite3.OperationalError) as e:
            cause = storage_cause(self.path, e)
            if cause is None:
                raise
            db = self._open_ro(cause)
        self._db = db
        # pending writes: table -> list of row tuples
        self._pending: dict[str, list[tuple]] = {"samples": [], "server_log": [], "requests": []}
        self._closed = threading.Event()
        self._flush_interval = flush_interval
        self._marker = process_marker()
        self.interrupted_runs: list[int] = [] if self.read_only else self.mark_interrupted()
        self._flusher = threading.Thread(target=self._flush_loop, name="runstore-flush", daemon=True)
        self._flusher.start()

    def _open_rw(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=5000")
            # checked before anything is written: a newer store is left exactly as it is
            v = _user_version(db)
            if v > len(MIGRATIONS):
                raise _newer_error(self.path, v, len(MIGRATIONS))
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            self.migrated_from, _ = migrate(db, self.path)
        except BaseException:
            db.close()
            raise
        return db

    def _open_ro(self, cause: str) -> sqlite3.Connection:
        """The store for reading only: the file read-only (``mode=ro``; ``immutable=1``
        where its WAL index cannot be created beside it), else an empty store in memory
        (there is no file and none can be made). Sets :attr:`read_only`."""
        self._ro_cause = cause
        self.read_only = f"the run store {self.path} cannot be written: {cause}"
        log.warning("%s; runs can be read but not recorded", self.read_only)
        self.migrated_from = None
        if self.path.is_file():
            uri = self.path.resolve().as_uri()
            for query in ("mode=ro", "mode=ro&immutable=1"):
                try:
                    db = sqlite3.connect(f"{uri}?{query}", uri=True, check_same_thread=False, isolation_level=None)
                except sqlite3.Error:
                    continue
                try:
                    v = _user_version(db)
                    if v > len(MIGRATIONS):
                        db.close()
                        raise _newer_error(self.path, v, len(MIGRATIONS))
                    db.execute("SELECT count(*) FROM runs").fetchone()
                    self.migrated_from = v
                    return db
                except StoreVersionError:
                    raise
                except sqlite3.Error:
                    db.close()
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        migrate(db, self.path)
        return db

    # ---- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Flush pending writes, stop the flusher and close the connection (idempotent).
        Rows that cannot be written now (a full disk) are counted in a warning, not raised."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._flusher.join(timeout=5)
        with self._lock:
            try:
                self._flush_locked()
            except StoreWriteError as e:
                log.warning("%s: %s not saved", e, ", ".join(f"{len(rows)} {t} rows" for t, rows in
                                                             self._pending.items() if rows))
            self._db.close()
            self._db = None

    @property
    def pending_rows(self) -> int:
        """Buffered rows not committed yet (requests, samples, log lines)."""
        with self._lock:
            return sum(len(rows) for rows in self._pending.values())

    def _flush_loop(self) -> None:
        # a fixed cadence (start to start): a slow commit does not stretch what a kill can lose
        nxt = time.monotonic() + self._flush_interval
        while not self._closed.wait(max(0.0, nxt - time.monotonic())):
            nxt = max(nxt + self._flush_interval, time.monotonic())
            try:
                self.flush()
            except StoreWriteError:  # kept in memory, retried next tick (write_problem says why)
                pass
            except sqlite3.Error:  # pragma: no cover - a locked database: retried next tick
                pass

    def flush(self) -> None:
        """Commit every buffered write now. Raises :class:`StoreWriteError` when the
        store cannot take them (they stay buffered)."""
        with self._lock:
            if self._db is not None:
                self._flush_locked()

    def _flush_locked(self) -> None:
        """Commit the buffered rows; a storage failure leaves them buffered and raises
        :class:`StoreWriteError` (sets :attr:`write_problem`)."""
        if not any(self._pending.values()):
            return
        if self.read_only:
            raise StoreWriteError(self.path, self._ro_cause)
        try:
            self._commit_pending()
        except (sqlite3.OperationalError, OSError) as e:
            cause = storage_cause(self.path, e)
            if cause is None:
                raise
            self.write_problem = cause
            raise StoreWriteError(self.path, cause) from e
        self.write_problem = None

    def _commit_pending(self) -> None:
        sql = {
            "samples": "INSERT INTO samples(run_id, t, source, name, value) VALUES (?,?,?,?,?)",
            "server_log": "INSERT INTO server_log(run_id, t, stream, line) VALUES (?,?,?,?)",
            "requests": f"INSERT INTO requests({','.join(_REQ_COLS)}) VALUES ({','.join('?' * len(_REQ_COLS))})",
        }
        if not any(self._pending.values()):
            return
        self._db.execute("BEGIN")
        try:
            for table, rows in self._pending.items():
                if rows:
                    self._db.executemany(sql[table], rows)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite has rolled back itself after SQLITE_FULL
                self._db.execute("ROLLBACK")
            raise
        for rows in self._pending.values():
            rows.clear()

    def _exec(self, sql: str, args: Sequence = ()) -> sqlite3.Cursor:
        """A read: the buffered rows are committed first when they can be (so a reader
        sees its own writes); while they cannot, the read still answers."""
        with self._lock:
            if self._db is None:
                raise RuntimeError(f"RunStore({self.path}) is closed")
            try:
                self._flush_locked()
            except StoreWriteError:
                pass
            return self._db.execute(sql, args)

    def _write(self, sql: str, args: Sequence = ()) -> sqlite3.Cursor:
        """A write (after the buffered rows). Raises :class:`StoreWriteError` naming the
        path and the cause when the store cannot take it (nothing is changed then)."""
        with self._lock:
            if self._db is None:
                raise RuntimeError(f"RunStore({self.path}) is closed")
            self._flush_locked()
            if self.read_only:
                raise StoreWriteError(self.path, self._ro_cause)
            try:
                cur = self._db.execute(sql, args)
            except (sqlite3.OperationalError, OSError) as e:
                cause = storage_cause(self.path, e)
                if cause is None:
                    raise
                self.write_problem = cause
                raise StoreWriteError(self.path, cause) from e
            self.write_problem = None
            return cur

    # ---- tunes -----------------------------------------------------------------------
    def create_tune(self, name: str, spec: Any, state: Any = None) -> int:
        """Insert a tune (status ``running``) and return its id; ``spec``/``state`` JSON."""
        now = time.time()
        cur = self._write("INSERT INTO tunes(created, name, status, spec, state, updated, writer) "
                         "VALUES (?,?,?,?,?,?,?)", (now, name, "running", _dumps(spec), _dumps(state), now, self._marker))
        return int(cur.lastrowid)

    def save_tune(self, tune_id: int, *, status: str | None = None, state: Any = None) -> None:
        """Store a tune's ``state`` and/or ``status`` (committed at once: a resume needs it)."""
        sets, vals = ["updated=?", "writer=?"], [time.time(), self._marker]  # a resume takes it over
        if status is not None:
            sets.append("status=?")
            vals.append(status)
        if state is not None:
            sets.append("state=?")
            vals.append(_dumps(state))
        self._write(f"UPDATE tunes SET {', '.join(sets)} WHERE id=?", (*vals, tune_id))
        self.flush()

    def get_tune(self, tune_id: int) -> dict[str, Any] | None:
        """One tune (id, created, name, status, spec, state, updated; JSON decoded) or None."""
        cur = self._exec("SELECT * FROM tunes WHERE id=?", (tune_id,))
        row = cur.fetchone()
        if row is None:
            return None
        d = dict(zip([c[0] for c in cur.description], row))
        d["spec"], d["state"] = _loads(d["spec"]), _loads(d["state"])
        d.pop("writer", None)
        return d

    def list_tunes(self) -> list[dict[str, Any]]:
        """All tunes, newest first (id, created, name, status, updated)."""
        cur = self._exec("SELECT id, created, name, status, updated FROM tunes ORDER BY id DESC")
        names = [c[0] for c in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    # ---- launches --------------------------------------------------------------------
    def add_launch(self, key: str, engine: str, ready_s: float, phases: dict[str, float]) -> None:
        """A launch of the configuration ``key`` became ready after ``ready_s`` s;
        ``phases``: phase → its start, seconds after the launch began."""
        self._write("INSERT INTO launches(created, key, engine, ready_s, phases) VALUES (?,?,?,?,?)",
                    (time.time(), key, engine, float(ready_s), _dumps(phases)))

    def launches(self, key: str, limit: int = 5) -> list[dict[str, Any]]:
        """The last ``limit`` ready launches of ``key``, newest first: ``created``,
        ``engine``, ``ready_s``, ``phases`` (decoded)."""
        cur = self._exec("SELECT created, engine, ready_s, phases FROM launches WHERE key=? ORDER BY id DESC LIMIT ?",
                         (key, int(limit)))
        return [{"created": c, "engine": e, "ready_s": r, "phases": _loads(ph) or {}} for c, e, r, ph in cur.fetchall()]

    # ---- runs ------------------------------------------------------------------------
    def mark_interrupted(self) -> list[int]:
        """Mark every ``running`` run whose writer is gone ``interrupted`` (the writer's
        marker names a process that no longer runs, or no writer is recorded); its rows
        are kept, ``finished`` is set to its last stored activity and a summary without
        one says what happened. Returns their ids. Called at open."""
        rows = self._exec("SELECT id, writer, summary FROM runs WHERE status='running'").fetchall()
        gone = [(rid, summary) for rid, writer, summary in rows if not writer or not marker_alive(writer)[0]]
        for rid, summary in gone:
            last = self._exec(
                "SELECT MAX(t) FROM (SELECT MAX(t_start + COALESCE(e2e, 0)) AS t FROM requests WHERE run_id=? "
                "UNION ALL SELECT MAX(t) FROM samples WHERE run_id=? UNION ALL SELECT MAX(t) FROM server_log "
                "WHERE run_id=?)", (rid, rid, rid)).fetchone()[0]
            fields: dict[str, Any] = {"status": INTERRUPTED}
            wall0 = self._exec("SELECT clock_wall0 FROM runs WHERE id=?", (rid,)).fetchone()[0]
            if last is not None and wall0 is not None:
                fields["finished"] = wall0 + last
            if summary is None:
                fields["summary"] = {"status": INTERRUPTED, "stop_reason": (
                    "interrupted: the vLLM Dyno that recorded this run ended without closing it (killed, or the "
                    "machine stopped); what it had stored is kept")}
            cols = ", ".join(f"{k}=?" for k in fields)
            vals = [_dumps(v) if k in _RUN_JSON else v for k, v in fields.items()]
            self._write(f"UPDATE runs SET {cols} WHERE id=? AND status='running'", (*vals, rid))
        tunes = self._exec("SELECT id, writer FROM tunes WHERE status='running'").fetchall()
        for tid, writer in tunes:  # a tune killed with its app resumes like one stopped with Ctrl-C
            if not writer or not marker_alive(writer)[0]:
                self._write("UPDATE tunes SET status=? WHERE id=? AND status='running'", (INTERRUPTED, tid))
        return [rid for rid, _ in gone]

    def create_run(self, name: str = "", engine: str = "", *, config: Any = None, spec: Any = None,
                   plan: Any = None, capacity: Any = None, status: str = "running",
                   clock_wall0: float | None = None, created: float | None = None) -> int:
        """Insert a run and return its id. JSON fields take dicts or pydantic models.

        ``clock_wall0``: Unix time of the session clock's zero (pass ``clock.wall0``) so
        stored ``t`` values map to wall time. The run's writer is this process.
        """
        cur = self._write(
            "INSERT INTO runs(created, name, engine, config, spec, plan, capacity, status, clock_wall0, writer)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)",
            (time.time() if created is None else created, name, engine, _dumps(config), _dumps(spec),
             _dumps(plan), _dumps(capacity), status, clock_wall0, self._marker))
        return int(cur.lastrowid)

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set run columns (``name``, ``engine``, ``status`` or any JSON field)."""
        allowed = {"name", "engine", "status", "clock_wall0", "finished", *_RUN_JSON}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"update_run: unknown run field(s) {sorted(bad)}; allowed: {sorted(allowed)}")
        if not fields:
            return
        cols = ", ".join(f"{k}=?" for k in fields)
        vals = [_dumps(v) if k in _RUN_JSON else v for k, v in fields.items()]
        self._write(f"UPDATE runs SET {cols} WHERE id=?", (*vals, run_id))

    def finish_run(self, run_id: int, status: str = "done", *, summary: Any = None, capacity: Any = None) -> None:
        """Mark a run finished (``done``, ``failed``, ``aborted`` …) and store its summary."""
        fields: dict[str, Any] = {"status": status, "finished": time.time()}
        if summary is not None:
            fields["summary"] = summary
        if capacity is not None:
            fields["capacity"] = capacity
        self.update_run(run_id, **fields)

    def _run_row(self, row: sqlite3.Row | tuple, names: list[str]) -> dict[str, Any]:
        d = dict(zip(names, row))
        for k in _RUN_JSON:
            if k in d:
                d[k] = _loads(d[k])
        return d

    def list_runs(self) -> list[dict[str, Any]]:
        """All runs, newest first: dicts with id, created, name, engine, status, finished, summary."""
        cur = self._exec("SELECT id, created, name, engine, status, finished, summary FROM runs ORDER BY id DESC")
        names = [c[0] for c in cur.description]
        return [self._run_row(r, names) for r in cur.fetchall()]

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        """One run as a dict (JSON fields decoded), or None when there is no such id."""
        cur = self._exec("SELECT * FROM runs WHERE id=?", (run_id,))
        row = cur.fetchone()
        if row is None:
            return None
        d = self._run_row(row, [c[0] for c in cur.description])
        d.pop("writer", None)  # the store's own bookkeeping (pid and start time), not the run's
        return d

    def delete_run(self, run_id: int) -> bool:
        """Delete a run and all its rows; returns False when there was no such run."""
        with self._lock:
            self._write("BEGIN")
            try:
                for t in ("levels", "requests", "server_log", "samples"):
                    self._write(f"DELETE FROM {t} WHERE run_id=?", (run_id,))
                n = self._write("DELETE FROM runs WHERE id=?", (run_id,)).rowcount
                self._write("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return n > 0

    # ---- samples & log ---------------------------------------------------------------
    def add_samples(self, run_id: int, rows: Iterable[tuple[float, str, str, float | None]]) -> None:
        """Buffer telemetry samples ``(t, source, name, value)``; t in session-clock seconds."""
        new = [(run_id, float(t), s, n, None if v is None else float(v)) for t, s, n, v in rows]
        with self._lock:
            self._pending["samples"].extend(new)

    def samples(self, run_id: int, source: str | None = None, name: str | None = None
                ) -> list[tuple[float, str, str, float | None]]:
        """Samples of a run in time order, optionally filtered: list of (t, source, name, value)."""
        sql, args = "SELECT t, source, name, value FROM samples WHERE run_id=?", [run_id]
        if source is not None:
            sql += " AND source=?"
            args.append(source)
        if name is not None:
            sql += " AND name=?"
            args.append(name)
        return [tuple(r) for r in self._exec(sql + " ORDER BY t", args).fetchall()]

    def add_log_lines(self, run_id: int, rows: Iterable[tuple[float, str, str]]) -> None:
        """Buffer server log lines ``(t, stream, line)``; stream e.g. 'stdout'/'stderr'."""
        new = [(run_id, float(t), s, line) for t, s, line in rows]
        with self._lock:
            self._pending["server_log"].extend(new)

    def log_lines(self, run_id: int) -> list[tuple[float, str, str]]:
        """Server log of a run in time order: list of (t, stream, line)."""
        return [tuple(r) for r in self._exec(
            "SELECT t, stream, line FROM server_log WHERE run_id=? ORDER BY t, rowid", (run_id,)).fetchall()]

    # ---- ramp results ----------------------------------------------------------------
    def add_requests(self, run_id: int, records: Iterable[Any]) -> None:
        """Buffer per-request records.

        Each record is a mapping or an object with attributes ``level_idx, level, t_start,
        ttft, e2e, prompt_tokens, output_tokens, tokens_source, status, error``,
        ``chunk_offsets`` (float32 seconds after ``t_start``, one per streamed chunk; stored
        as raw little-endian float32 bytes) and ``turn`` (a multi-turn ramp's turn of the
        conversation, 1, 2, …; 0 or absent: not a conversation's turn) —
        :class:`app.loadgen.records.RequestRecord`.
        """
        new = []
        for r in records:
            get = r.get if isinstance(r, Mapping) else (lambda k, _r=r: getattr(_r, k, None))
            offs = get("chunk_offsets")
            blob = None if offs is None else np.asarray(offs, dtype="<f4").tobytes()
            new.append((run_id, get("level_idx"), get("level"), get("t_start"), get("ttft"), get("e2e"),
                        get("prompt_tokens"), get("output_tokens"), get("tokens_source"), get("status"),
                        get("error"), blob, int(get("turn") or 0)))
        with self._lock:
            self._pending["requests"].extend(new)

    def requests(self, run_id: int, level_idx: int | None = None) -> list[dict[str, Any]]:
        """Request records of a run (dicts; ``chunk_offsets`` as a float32 numpy array;
        ``turn`` None for a request stored before the store kept it, layout v4)."""
        sql, args = f"SELECT {','.join(_REQ_COLS[1:])} FROM requests WHERE run_id=?", [run_id]
        if level_idx is not None:
            sql += " AND level_idx=?"
            args.append(level_idx)
        out = []
        for row in self._exec(sql + " ORDER BY t_start", args).fetchall():
            d = dict(zip(_REQ_COLS[1:], row))
            b = d["chunk_offsets"]
            d["chunk_offsets"] = np.frombuffer(b, dtype="<f4").copy() if b is not None else np.zeros(0, "<f4")
            out.append(d)
        return out

    def add_level(self, run_id: int, stats: Any) -> None:
        """Store (or replace) one level's StepStats (a mapping or a pydantic model with
        ``idx``, ``level``, ``mode``, ``t_start``, ``t_end``, ``n_measured`` and the figures)."""
        d = stats.model_dump(mode="json") if hasattr(stats, "model_dump") else dict(stats)
        figures = store_columns()  # app.metrics: idx, level, mode, t_start, t_end, the figures
        cols = ("run_id", *(m.name for m in figures), "stats")
        vals = (run_id, *(m.value(d) for m in figures), json.dumps(d, default=str))
        self._write(f"INSERT OR REPLACE INTO levels({','.join(cols)}) VALUES ({','.join('?' * len(cols))})", vals)

    def levels(self, run_id: int) -> list[dict[str, Any]]:
        """The StepStats of a run in level order, as the dicts given to :meth:`add_level`."""
        rows = self._exec("SELECT stats FROM levels WHERE run_id=? ORDER BY idx", (run_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]
