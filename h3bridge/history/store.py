"""The job history file: one SQLite database (WAL) per user, in h3bridge's cache directory.

`history.sqlite` in `userdirs.cache_dir()`; `$H3BRIDGE_HISTORY_PATH` names another file (tests
point it at a temporary one), and an empty value turns the history off. Every h3bridge process
of the user (the CLI, a ComfyUI, `h3bridge serve`) writes to the same file: WAL lets readers
go on while one writes, the busy timeout makes a writer wait for another's transaction (each
is one short statement or two) instead of failing, and each operation opens its own
connection, so threads and processes never share one. Processes making the file take turns
under `history.sqlite.lock` beside it (`_create_schema` says why).

Anything wrong with the file (not a database, another program's database, a newer schema,
a folder in its place, a lock held for longer than the busy timeout) is a `HistoryUnavailable`
naming the file, the problem and the fix. Nothing here ever rewrites or deletes a file that is
not an h3bridge job history.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from filelock import FileLock, Timeout

from ..errors import H3BridgeError
from ..userdirs import cache_dir
from .job import Device

HISTORY_PATH_ENV = "H3BRIDGE_HISTORY_PATH"
HISTORY_FILE_NAME = "history.sqlite"
SCHEMA_VERSION = 1
# How long a write waits for another process's transaction. Ours take milliseconds; a file held
# longer than this is locked by something else, and the job goes on without its record.
BUSY_TIMEOUT_SECONDS = 5.0

# The history keeps the newest this many jobs (about 1.5 KB each): the ETA and `stats` need
# dozens per shape, and a server that runs for years must not grow the file without end.
KEEP_JOBS = 20_000

RUNNING, COMPLETED, FAILED, CANCELLED = "running", "completed", "failed", "cancelled"
# A `running` row whose process is gone: the host was killed (or lost power) mid-job.
INTERRUPTED = "interrupted"
OUTCOMES = (RUNNING, COMPLETED, FAILED, CANCELLED)

_SCHEMA = f"""
CREATE TABLE jobs (
    id              INTEGER PRIMARY KEY,
    started_at      REAL NOT NULL,          -- Unix time
    finished_at     REAL,
    engine          TEXT NOT NULL,          -- "one-shot", "session", ...
    engine_path     TEXT,
    device          TEXT NOT NULL,
    memory_bytes    INTEGER,
    shape           TEXT NOT NULL,          -- job.shape_key
    request         TEXT NOT NULL,          -- JSON, job.request_record
    output          TEXT,
    outcome         TEXT NOT NULL CHECK (outcome IN ({", ".join(repr(o) for o in OUTCOMES)})),
    error_type      TEXT,
    message         TEXT,
    engine_message  TEXT,
    total_seconds   REAL,                   -- the whole generate call, waiting included
    waited_seconds  REAL,                   -- waiting for the machine-wide engine lock
    program         TEXT,
    pid             INTEGER,
    pid_started     REAL                    -- the process's start time: a reused pid is not it
);
CREATE TABLE job_phases (
    job_id   INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    phase    TEXT NOT NULL,
    seconds  REAL NOT NULL,
    PRIMARY KEY (job_id, position)
);
CREATE INDEX jobs_by_shape ON jobs (device, shape, outcome, started_at);
CREATE INDEX jobs_by_start ON jobs (started_at);
"""


class HistoryUnavailable(H3BridgeError):
    """The history file cannot be read or written; a render goes on without it."""


def history_path() -> Path | None:
    """`$H3BRIDGE_HISTORY_PATH` if set (empty: no history, None), else the cache directory's file."""
    override = os.environ.get(HISTORY_PATH_ENV)
    if override is not None:
        return Path(override).expanduser() if override.strip() else None
    return cache_dir() / HISTORY_FILE_NAME


@dataclass
class JobRow:
    """One job as the history holds it."""

    id: int
    started_at: float
    finished_at: float | None
    engine: str
    engine_path: str | None
    device: Device
    shape: str
    request: dict[str, Any]
    output: str | None
    outcome: str
    error_type: str | None
    message: str | None
    engine_message: str | None
    total_seconds: float | None
    waited_seconds: float | None
    program: str | None
    pid: int | None
    pid_started: float | None
    phases: dict[str, float] = field(default_factory=dict)   # seconds per phase, in the order run

    def status(self) -> str:
        """The outcome, except that a `running` job whose process is gone is `interrupted`."""
        if self.outcome != RUNNING or self.pid is None:
            return self.outcome
        import psutil
        try:
            process = psutil.Process(self.pid)
            alive = self.pid_started is None or abs(process.create_time() - self.pid_started) < 1.0
        except psutil.Error:
            alive = False
        return RUNNING if alive else INTERRUPTED

    def as_json(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["status"] = self.status()
        values["device"] = self.device.name
        values["memory_bytes"] = self.device.memory_bytes
        return values


@dataclass(frozen=True)
class NewJob:
    """What is known when a job starts."""

    engine: str
    device: Device
    shape: str
    request: dict[str, Any]
    engine_path: str | None = None
    output: str | None = None
    program: str | None = None
    pid: int | None = None
    pid_started: float | None = None
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class JobEnd:
    """What is known when it ends."""

    outcome: str
    phases: dict[str, float]
    total_seconds: float
    waited_seconds: float = 0.0
    error_type: str | None = None
    message: str | None = None
    engine_message: str | None = None
    finished_at: float = field(default_factory=time.time)


class HistoryStore:
    """The history file at `path` (default `history_path()`)."""

    def __init__(self, path: Path | str | None = None, *, busy_timeout: float | None = None,
                 keep_jobs: int = KEEP_JOBS) -> None:
        self.path = Path(path) if path is not None else history_path()
        self.busy_timeout = BUSY_TIMEOUT_SECONDS if busy_timeout is None else busy_timeout
        self.keep_jobs = keep_jobs

    @property
    def enabled(self) -> bool:
        return self.path is not None

    # ------------------------------------------------------------------ connections

    @contextmanager
    def _connect(self, *, create: bool) -> Iterator[sqlite3.Connection | None]:
        """A connection to a checked history file (created when `create` and missing); None
        when reading a file that holds no history yet (another process is just creating it)."""
        if self.path is None:
            raise HistoryUnavailable("the job history is turned off", hint=f"unset {HISTORY_PATH_ENV}")
        path = self.path
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(path, timeout=self.busy_timeout, isolation_level=None)
        except (OSError, sqlite3.Error) as error:
            raise self._unavailable(error) from None
        try:
            try:
                connection.execute("PRAGMA foreign_keys = ON")
                ready = self._check_schema(connection, create=create)
            except sqlite3.Error as error:
                raise self._unavailable(error) from None
            yield connection if ready else None
        finally:
            connection.close()

    def _check_schema(self, connection: sqlite3.Connection, *, create: bool) -> bool:
        """True when the file holds our tables (made now if `create` and it is empty)."""
        # The version and the tables are read in one transaction: read apart, another process
        # creating the file in between made a fresh history look like another program's.
        connection.execute("BEGIN")
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        finally:
            connection.execute("COMMIT")
        if version == SCHEMA_VERSION:
            return True
        if version > SCHEMA_VERSION:
            raise HistoryUnavailable(f"the job history {self.path} was written by a newer h3bridge "
                                     f"(schema {version}, this one reads {SCHEMA_VERSION})",
                                     hint=f"upgrade h3bridge, or set {HISTORY_PATH_ENV} to another file")
        if version != 0 or tables:
            raise HistoryUnavailable(f"{self.path} is not an h3bridge job history (it holds other tables: "
                                     f"{', '.join(tables) or 'none'})",
                                     hint=f"move that file away, or set {HISTORY_PATH_ENV} to another file")
        if not create:
            return False
        self._create_schema(connection)
        return True

    def _create_schema(self, connection: sqlite3.Connection) -> None:
        """Make an empty database ours: WAL first (it cannot change inside a transaction; it stays
        set in the file), then the tables, in one transaction that re-checks.

        Processes creating the file take turns under a file lock beside it. Until the switch the
        file is in rollback mode, where two of them upgrading their locks at once deadlock, and
        SQLite answers one with "database is locked" however long the busy timeout: four processes
        starting on a missing history lost a job in a third of the tries (CI saw it with two)."""
        try:
            with FileLock(f"{self.path}.lock", timeout=self.busy_timeout):
                connection.execute("PRAGMA journal_mode = WAL")
                connection.execute("BEGIN IMMEDIATE")
                try:
                    if connection.execute("PRAGMA user_version").fetchone()[0] == 0:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                connection.execute(statement)
                        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    connection.execute("COMMIT")
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
        except Timeout:
            raise HistoryUnavailable(f"the job history {self.path} is being created by another program that has "
                                     f"not finished (waited {self.busy_timeout:g} s for {self.path}.lock)",
                                     hint="close the program holding it") from None
        except OSError as error:        # the lock file cannot be made (a read-only folder)
            raise self._unavailable(error) from None

    def _unavailable(self, error: BaseException) -> HistoryUnavailable:
        text = str(error) or type(error).__name__
        if self.path is not None and self.path.is_dir():
            return HistoryUnavailable(f"the job history {self.path} is a folder, not a file",
                                      hint=f"move that folder away, or set {HISTORY_PATH_ENV} to a file")
        if "locked" in text or "busy" in text:
            return HistoryUnavailable(f"the job history {self.path} is locked by another program "
                                      f"(waited {self.busy_timeout:g} s)",
                                      hint="close the program holding it (a `sqlite3` shell in a transaction?)")
        if "not a database" in text or "malformed" in text:
            return HistoryUnavailable(f"the job history {self.path} is damaged ({text})",
                                      hint=f"move that file away (a new one is started), or set {HISTORY_PATH_ENV}")
        return HistoryUnavailable(f"cannot use the job history {self.path}: {text}",
                                  hint=f"check that folder's permissions, or set {HISTORY_PATH_ENV} to another file")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect(create=True) as connection:
            assert connection is not None       # create=True makes the tables
            try:
                connection.execute("BEGIN IMMEDIATE")
                try:
                    yield connection
                    connection.execute("COMMIT")
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
            except sqlite3.Error as error:
                raise self._unavailable(error) from None

    # ------------------------------------------------------------------ writing

    def start_job(self, job: NewJob) -> int:
        """Insert a `running` row; its id."""
        with self._write() as connection:
            cursor = connection.execute(
                "INSERT INTO jobs (started_at, engine, engine_path, device, memory_bytes, shape, request, output,"
                " outcome, program, pid, pid_started) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job.started_at, job.engine, job.engine_path, job.device.name, job.device.memory_bytes, job.shape,
                 json.dumps(job.request), job.output, RUNNING, job.program, job.pid, job.pid_started))
            self._drop_oldest(connection)
            return int(cursor.lastrowid)

    def finish_job(self, job_id: int, end: JobEnd) -> None:
        """Its outcome, timings and message, and its phases."""
        with self._write() as connection:
            connection.execute(
                "UPDATE jobs SET finished_at = ?, outcome = ?, error_type = ?, message = ?, engine_message = ?,"
                " total_seconds = ?, waited_seconds = ? WHERE id = ?",
                (end.finished_at, end.outcome, end.error_type, end.message, end.engine_message, end.total_seconds,
                 end.waited_seconds, job_id))
            self._insert_phases(connection, job_id, end.phases)

    def forget_job(self, job_id: int) -> None:
        """Remove a job that never ran (refused before the engine started)."""
        with self._write() as connection:
            connection.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def add_job(self, job: NewJob, end: JobEnd) -> int:
        """A whole finished job in one transaction (imports, tests)."""
        with self._write() as connection:
            cursor = connection.execute(
                "INSERT INTO jobs (started_at, finished_at, engine, engine_path, device, memory_bytes, shape, request,"
                " output, outcome, error_type, message, engine_message, total_seconds, waited_seconds, program, pid,"
                " pid_started) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job.started_at, end.finished_at, job.engine, job.engine_path, job.device.name,
                 job.device.memory_bytes, job.shape, json.dumps(job.request), job.output, end.outcome, end.error_type,
                 end.message, end.engine_message, end.total_seconds, end.waited_seconds, job.program, job.pid,
                 job.pid_started))
            job_id = int(cursor.lastrowid)
            self._insert_phases(connection, job_id, end.phases)
            self._drop_oldest(connection)
            return job_id

    def _drop_oldest(self, connection: sqlite3.Connection) -> None:
        """Keep the newest `keep_jobs` jobs (their phases go with them: ON DELETE CASCADE)."""
        connection.execute("DELETE FROM jobs WHERE id <= (SELECT id FROM jobs ORDER BY id DESC LIMIT 1 OFFSET ?)",
                           (self.keep_jobs,))

    @staticmethod
    def _insert_phases(connection: sqlite3.Connection, job_id: int, phases: dict[str, float]) -> None:
        connection.executemany("INSERT INTO job_phases (job_id, position, phase, seconds) VALUES (?, ?, ?, ?)",
                               [(job_id, position, phase, float(seconds))
                                for position, (phase, seconds) in enumerate(phases.items())])

    # ------------------------------------------------------------------ reading

    def recent_jobs(self, limit: int = 20) -> list[JobRow]:
        """The `limit` most recently started jobs, newest first (none before the first job)."""
        if self.path is not None and not self.path.exists():
            return []
        with self._connect(create=False) as connection:
            if connection is None:
                return []
            return self._rows(connection, "SELECT * FROM jobs ORDER BY started_at DESC, id DESC LIMIT ?", (limit,))

    def completed_jobs(self, *, device: Device | None = None, shape: str | None = None,
                       engine: str | None = None, engine_path: str | None = None,
                       limit: int | None = None) -> list[JobRow]:
        """Completed jobs, newest first, optionally of one device (name and memory), shape, engine,
        engine program (its path)."""
        where, values = ["outcome = ?"], [COMPLETED]
        if device is not None:
            where.append("device = ? AND memory_bytes IS ?")
            values += [device.name, device.memory_bytes]
        if shape is not None:
            where.append("shape = ?")
            values.append(shape)
        if engine is not None:
            where.append("engine = ?")
            values.append(engine)
        if engine_path is not None:
            where.append("engine_path = ?")
            values.append(engine_path)
        if self.path is not None and not self.path.exists():
            return []
        query = f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY started_at DESC, id DESC"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        with self._connect(create=False) as connection:
            if connection is None:
                return []
            return self._rows(connection, query, values)

    def _rows(self, connection: sqlite3.Connection, query: str, values: Sequence[Any]) -> list[JobRow]:
        try:
            connection.row_factory = sqlite3.Row
            rows = connection.execute(query, values).fetchall()
            phases: dict[int, dict[str, float]] = {row["id"]: {} for row in rows}
            if rows:
                marks = ", ".join("?" for _ in rows)
                for phase in connection.execute(f"SELECT job_id, phase, seconds FROM job_phases WHERE job_id IN ({marks})"
                                                " ORDER BY job_id, position", list(phases)):
                    phases[phase["job_id"]][phase["phase"]] = phase["seconds"]
        except sqlite3.Error as error:
            raise self._unavailable(error) from None
        return [JobRow(id=row["id"], started_at=row["started_at"], finished_at=row["finished_at"], engine=row["engine"],
                       engine_path=row["engine_path"], device=Device(row["device"], row["memory_bytes"]),
                       shape=row["shape"], request=_json(row["request"]), output=row["output"],
                       outcome=row["outcome"], error_type=row["error_type"], message=row["message"],
                       engine_message=row["engine_message"], total_seconds=row["total_seconds"],
                       waited_seconds=row["waited_seconds"], program=row["program"], pid=row["pid"],
                       pid_started=row["pid_started"], phases=phases[row["id"]])
                for row in rows]


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["HistoryStore", "HistoryUnavailable", "JobRow", "NewJob", "JobEnd", "history_path", "HISTORY_PATH_ENV",
           "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "INTERRUPTED", "SCHEMA_VERSION"]
