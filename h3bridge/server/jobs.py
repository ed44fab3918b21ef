"""The server's durable job queue: one SQLite database (WAL) and one folder per job, both in the
server's data directory, so a server killed at any moment and restarted loses no accepted job.

A job is accepted when its row is committed (after its uploads are all on disk, before the HTTP
answer); until then its folder is scratch that `recover` removes. The row keeps the request as
its wire body (wire/videos.py: the same mapping the HTTP body went through) and the uploads by their
names inside the job's folder, so a restarted server rebuilds exactly the request it accepted.

Layout of the data directory:
    jobs.sqlite3          the queue (WAL: readers never block the worker)
    serve.lock            held by the one server whose queue this is, for its life
    jobs/<id>/inputs/     the uploads, named by position (never by the client's file name)
    jobs/<id>/video.mp4   the clip, published by the engine only when complete
"""
from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from filelock import FileLock, Timeout

from ..engines.scratch import remove_dead_scratch
from ..errors import DataDirectoryInUse, QueueFullError
from ..wire.videos import ErrorCode, JobStatus, UploadedFile, VideoError, VideoJob, request_from_wire

DATABASE_NAME = "jobs.sqlite3"
OWNER_LOCK_NAME = "serve.lock"
JOBS_FOLDER = "jobs"
INPUTS_FOLDER = "inputs"
VIDEO_NAME = "video.mp4"
ID_PREFIX = "video_"
# A job the server was running when it stopped is run again this many times in all, then failed.
MAX_ATTEMPTS = 2
# `serve --max-queued`'s default: jobs waiting behind the running one. A storyboard of a 2-minute
# film is 8-10 shots, and `story --parallel N` submits N at once, so one client on one server never
# meets this bound; what it bounds is a runaway client filling the data directory with uploads.
# A fleet behind a load balancer wants 1 (h3bridge fleet says so): a full server answers 429 and
# the balancer sends the job to a server that can start it sooner.
DEFAULT_MAX_QUEUED = 16
# ... and a fleet's front's (`serve --server URL ...`, fleet/front.py): a studio's batch, spread over
# its servers as each comes free (issue 32: at least 100 accepted across the fleet).
FRONT_MAX_QUEUED = 100
# Retry-After of a full queue's 429, seconds. LiteLLM's router cools the deployment down for
# exactly this long (router_rust/core.py retry_after_seconds) and retries the create on another
# one; but a cooled-down deployment also answers its own jobs' status and content polls with 429
# ("all deployments in cooldown") until it is over, so the shortest whole second: a full server
# costs one cheap refusal per second at most, and a poll is turned away for at most a second.
QUEUE_FULL_RETRY_AFTER = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    status       TEXT NOT NULL,
    progress     INTEGER NOT NULL DEFAULT 0,
    phase        TEXT,
    model        TEXT NOT NULL,
    fields       TEXT NOT NULL,   -- the wire body's fields, JSON (wire.request_to_wire)
    uploads      TEXT NOT NULL,   -- [[field, name in inputs/, client's file name], ...], JSON
    shape        TEXT NOT NULL,   -- wire.clip_shape, JSON
    attempts     INTEGER NOT NULL DEFAULT 0,
    error        TEXT,            -- wire.VideoError, JSON
    completed_at INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, seq);
-- A submission's Idempotency-Key and the job it made: the same key submitted again (a client killed
-- before it wrote the job's id down) gets that job back instead of paying for a second one.
CREATE TABLE IF NOT EXISTS idempotency (
    key    TEXT PRIMARY KEY,
    job_id TEXT NOT NULL
);
-- A fleet's front (fleet/front.py): the server a job was handed to and that server's id for it, so
-- after the front's restart the job is followed there again instead of rendered a second time.
CREATE TABLE IF NOT EXISTS placements (
    job_id     TEXT PRIMARY KEY,
    server     TEXT NOT NULL,
    server_job TEXT NOT NULL
);
"""
# The longest Idempotency-Key taken (the IETF draft sets none; Stripe's is 255).
IDEMPOTENCY_KEY_MAX = 255


def idempotency_key_problem(key: str) -> str | None:
    """Why `key` cannot be an Idempotency-Key (None: it can): 1 to 255 visible ASCII characters."""
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        return f"is {len(key)} characters long; it must have 1 to {IDEMPOTENCY_KEY_MAX}"
    if not all(" " < character <= "~" for character in key):
        return "holds a character that is not visible ASCII (a space, a control character or non-ASCII)"
    return None


def new_job_id() -> str:
    return f"{ID_PREFIX}{uuid.uuid4().hex}"


def is_job_id(text: str) -> bool:
    """Only ids this server makes name a folder: `video_` + 32 hex digits."""
    rest = text[len(ID_PREFIX):]
    return text.startswith(ID_PREFIX) and len(rest) == 32 and all(c in "0123456789abcdef" for c in rest)


# A job the worker holds: running, or running and paused (its engine stopped where it was).
RUNNING = (JobStatus.IN_PROGRESS, JobStatus.PAUSED)


@dataclass(frozen=True)
class StoredJob:
    id: str
    created_at: int
    status: JobStatus
    progress: int
    phase: str | None
    model: str
    fields: dict[str, object]
    uploads: tuple[tuple[str, str, str | None], ...]
    shape: dict[str, object]
    attempts: int
    error: VideoError | None
    completed_at: int | None

    def video_job(self) -> VideoJob:
        return VideoJob(id=self.id, created_at=self.created_at, completed_at=self.completed_at,
                        model=self.model, status=self.status, progress=self.progress, error=self.error,
                        phase=self.phase if self.status in RUNNING else None, **self.shape)


class JobStore:
    """The queue. Thread-safe (one connection behind a lock; HTTP handlers and the worker share it)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        (self.data_dir / JOBS_FOLDER).mkdir(parents=True, exist_ok=True)
        # One server per queue: a second one's `recover` would take the first's running job for
        # an interrupted one and run it again, and both would take queued jobs. An OS lock, so a
        # killed server's ends with it.
        self._owner = FileLock(str(self.data_dir / OWNER_LOCK_NAME), thread_local=False)
        try:
            self._owner.acquire(timeout=0)
        except Timeout:
            raise DataDirectoryInUse(f"another h3bridge serve is using the data directory {self.data_dir}",
                                     hint="stop that server, or give this one its own --data-dir") from None
        try:
            self._guard = threading.Lock()
            self._db = sqlite3.connect(self.data_dir / DATABASE_NAME, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")     # an accepted job survives a power cut too
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(_SCHEMA)
        except BaseException:
            self._owner.release()
            raise

    def close(self) -> None:
        with self._guard:
            self._db.close()
        self._owner.release()

    # ------------------------------------------------------------------ folders

    def job_dir(self, job_id: str) -> Path:
        if not is_job_id(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        return self.data_dir / JOBS_FOLDER / job_id

    def inputs_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / INPUTS_FOLDER

    def video_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / VIDEO_NAME

    def uploads_of(self, job: StoredJob) -> list[UploadedFile]:
        inputs = self.inputs_dir(job.id)
        return [UploadedFile(field, inputs / name, filename) for field, name, filename in job.uploads]

    def request_of(self, job: StoredJob):
        """The GenerationRequest the job was accepted with (validated again by the engine)."""
        pairs = [(name, item) for name, value in job.fields.items()
                 for item in (value if isinstance(value, list) else [value])]
        request, _ = request_from_wire(pairs, self.uploads_of(job))
        return request

    # ------------------------------------------------------------------ the queue

    def add(self, job_id: str, *, model: str, fields: dict[str, object], uploads: Sequence[UploadedFile],
            shape: dict[str, object], max_queued: int | None = None, idempotency_key: str | None = None) -> StoredJob:
        """Accept a job: its uploads are already in its inputs folder. Committed when this returns.
        With `max_queued`, raises QueueFullError instead when that many jobs already wait (counted
        and inserted under one lock, so concurrent submissions cannot both take the last place).
        With `idempotency_key`, a job already accepted under that key (and not failed) is returned
        instead, and nothing is added: the caller removes `job_id`'s folder when the id differs."""
        inputs = self.inputs_dir(job_id)
        stored = [[u.field, u.path.relative_to(inputs).as_posix(), u.filename] for u in uploads]
        with self._guard:
            earlier = self._job_for_key(idempotency_key) if idempotency_key is not None else None
            if earlier is not None:
                return earlier
            if max_queued is not None:
                self._raise_if_full(max_queued)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO jobs (id, created_at, status, model, fields, uploads, shape) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (job_id, int(time.time()), JobStatus.QUEUED.value, model, json.dumps(fields), json.dumps(stored),
                     json.dumps(shape)))
                if idempotency_key is not None:
                    self._db.execute("INSERT OR REPLACE INTO idempotency (key, job_id) VALUES (?, ?)",
                                     (idempotency_key, job_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        job = self.get(job_id)
        assert job is not None
        return job

    def job_for_key(self, idempotency_key: str) -> StoredJob | None:
        """The job accepted under `idempotency_key`, unless it is gone or failed (then the key is free)."""
        with self._guard:
            return self._job_for_key(idempotency_key)

    def _job_for_key(self, idempotency_key: str) -> StoredJob | None:
        row = self._db.execute("SELECT jobs.* FROM idempotency JOIN jobs ON jobs.id = idempotency.job_id "
                               "WHERE idempotency.key = ?", (idempotency_key,)).fetchone()
        if row is None:
            return None
        job = _job(row)
        return None if job.status is JobStatus.FAILED else job

    def check_room(self, max_queued: int) -> None:
        """QueueFullError if `max_queued` jobs wait already behind the running one (a cheap early
        answer, before uploads are read; `add` checks again)."""
        with self._guard:
            self._raise_if_full(max_queued)

    def _raise_if_full(self, max_queued: int) -> None:
        # Unfinished jobs less the one the worker runs (or is about to take): counting only the
        # `queued` rows would make the bound depend on whether the worker has picked up the job
        # submitted a moment ago, and a burst of submissions would see a server hold one job fewer.
        unfinished = self._db.execute("SELECT COUNT(*) FROM jobs WHERE status IN (?, ?, ?)",
                                      (JobStatus.QUEUED.value, *(status.value for status in RUNNING))).fetchone()[0]
        waiting = max(unfinished - 1, 0)
        if unfinished > max_queued:
            raise QueueFullError(f"this server's queue is full: {waiting} jobs wait (its --max-queued is {max_queued})",
                                 retry_after=QUEUE_FULL_RETRY_AFTER,
                                 hint=f"submit it again in {QUEUE_FULL_RETRY_AFTER} s, or to another server")

    def get(self, job_id: str) -> StoredJob | None:
        with self._guard:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def list(self, *, after: str | None = None, limit: int = 20, newest_first: bool = True) -> tuple[list[StoredJob], bool]:
        """A page of jobs (and whether more follow), in creation order."""
        order = "DESC" if newest_first else "ASC"
        with self._guard:
            start = None
            if after is not None:
                found = self._db.execute("SELECT seq FROM jobs WHERE id = ?", (after,)).fetchone()
                if found is None:
                    return [], False
                start = found["seq"]
            where = "" if start is None else ("WHERE seq < ?" if newest_first else "WHERE seq > ?")
            rows = self._db.execute(f"SELECT * FROM jobs {where} ORDER BY seq {order} LIMIT ?",
                                    ((start,) if start is not None else ()) + (limit + 1,)).fetchall()
        return [_job(row) for row in rows[:limit]], len(rows) > limit

    def next_queued(self) -> StoredJob | None:
        with self._guard:
            row = self._db.execute("SELECT * FROM jobs WHERE status = ? ORDER BY seq LIMIT 1",
                                   (JobStatus.QUEUED.value,)).fetchone()
        return None if row is None else _job(row)

    def queued_placed(self, limit: int = 1000) -> list[tuple[StoredJob, str | None, str | None]]:
        """The oldest queued jobs, each with the fleet server it was handed to and that server's id
        for it (None, None: never handed to one)."""
        with self._guard:
            rows = self._db.execute("SELECT jobs.*, placements.server AS placed_on, placements.server_job AS "
                                    "server_job FROM jobs LEFT JOIN placements ON placements.job_id = jobs.id "
                                    "WHERE jobs.status = ? ORDER BY jobs.seq LIMIT ?",
                                    (JobStatus.QUEUED.value, limit)).fetchall()
        return [(_job(row), row["placed_on"], row["server_job"]) for row in rows]

    def place(self, job_id: str, server: str, server_job: str) -> None:
        """Record that fleet server `server` accepted the job as `server_job` (fleet/front.py)."""
        with self._guard:
            self._db.execute("INSERT OR REPLACE INTO placements (job_id, server, server_job) VALUES (?, ?, ?)",
                             (job_id, server, server_job))

    def placement(self, job_id: str) -> tuple[str, str] | None:
        """(server, that server's job id) the job was handed to, if it was."""
        with self._guard:
            row = self._db.execute("SELECT server, server_job FROM placements WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else (row["server"], row["server_job"])

    def unplace(self, job_id: str) -> None:
        """Forget where the job was handed (a deleted job's placement, once the front has deleted it
        there: kept until then, as `remove` leaves it)."""
        with self._guard:
            self._db.execute("DELETE FROM placements WHERE job_id = ?", (job_id,))

    def count(self, status: JobStatus) -> int:
        with self._guard:
            return self._db.execute("SELECT COUNT(*) FROM jobs WHERE status = ?", (status.value,)).fetchone()[0]

    def start(self, job_id: str) -> bool:
        """Queued -> in progress, counting the attempt, before the engine starts; False if the job
        is gone (deleted) or no longer queued."""
        with self._guard:
            cursor = self._db.execute(
                "UPDATE jobs SET status = ?, progress = 0, phase = NULL, attempts = attempts + 1 "
                "WHERE id = ? AND status = ?", (JobStatus.IN_PROGRESS.value, job_id, JobStatus.QUEUED.value))
        return cursor.rowcount == 1

    def report(self, job_id: str, progress: int, phase: str | None) -> None:
        with self._guard:
            self._db.execute("UPDATE jobs SET progress = ?, phase = ? WHERE id = ? AND status = ?",
                             (progress, phase, job_id, JobStatus.IN_PROGRESS.value))

    def set_paused(self, job_id: str, paused: bool) -> bool:
        """Running <-> paused (the worker has stopped or continued its engine); False if the job is
        not in the state it leaves (finished meanwhile, deleted, or already so)."""
        before, after = (JobStatus.IN_PROGRESS, JobStatus.PAUSED) if paused else (JobStatus.PAUSED, JobStatus.IN_PROGRESS)
        with self._guard:
            cursor = self._db.execute("UPDATE jobs SET status = ? WHERE id = ? AND status = ?",
                                      (after.value, job_id, before.value))
        return cursor.rowcount == 1

    def complete(self, job_id: str) -> None:
        with self._guard:
            self._db.execute("UPDATE jobs SET status = ?, progress = 100, phase = NULL, completed_at = ? "
                             "WHERE id = ?", (JobStatus.COMPLETED.value, int(time.time()), job_id))

    def fail(self, job_id: str, error: VideoError) -> None:
        with self._guard:
            self._db.execute("UPDATE jobs SET status = ?, phase = NULL, error = ?, completed_at = ? WHERE id = ?",
                             (JobStatus.FAILED.value, error.model_dump_json(), int(time.time()), job_id))

    def requeue(self, job_id: str) -> None:
        """Back in the queue (the server is stopping with the job unfinished: it runs after the restart)."""
        with self._guard:
            self._db.execute("UPDATE jobs SET status = ?, progress = 0, phase = NULL, attempts = MAX(attempts - 1, 0) "
                             "WHERE id = ? AND status IN (?, ?)",
                             (JobStatus.QUEUED.value, job_id, *(status.value for status in RUNNING)))

    def remove(self, job_id: str) -> bool:
        """Forget the job (committed first, so a crash before its folder is gone leaves only scratch
        that `recover` removes); False if there was none."""
        with self._guard:
            cursor = self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            self._db.execute("DELETE FROM idempotency WHERE job_id = ?", (job_id,))
        return cursor.rowcount == 1

    def remove_files(self, job_id: str) -> None:
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    # ------------------------------------------------------------------ after a restart

    def recover(self) -> list[str]:
        """Put the queue back in order after a stop or a crash; call with the engine lock held (so
        an engine the dead server left running has been stopped and cannot publish any more).

        * a job that was running: completed if its clip was published (the engine publishes only
          complete clips), else queued to run again, or failed with the reason after MAX_ATTEMPTS;
        * job folders without a row (a submission or a deletion the crash cut short) are removed.
        Returns what was done, one line per job, for the log."""
        notes: list[str] = []
        with self._guard:
            running = [_job(row) for row in self._db.execute("SELECT * FROM jobs WHERE status IN (?, ?)",
                                                             tuple(status.value for status in RUNNING))]
            known = {row[0] for row in self._db.execute("SELECT id FROM jobs")}
        for job in running:
            if self.video_path(job.id).is_file():
                self.complete(job.id)
                notes.append(f"{job.id}: its clip was published before the server stopped: completed")
            elif job.attempts < MAX_ATTEMPTS:
                with self._guard:
                    self._db.execute("UPDATE jobs SET status = ?, progress = 0, phase = NULL WHERE id = ?",
                                     (JobStatus.QUEUED.value, job.id))
                notes.append(f"{job.id}: interrupted by the server's stop: queued to run again")
            else:
                self.fail(job.id, interrupted_error(job.attempts))
                notes.append(f"{job.id}: interrupted {job.attempts} times: failed")
        for folder in (self.data_dir / JOBS_FOLDER).iterdir():
            if folder.name not in known:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                remove_dead_scratch(folder)     # a disk probe the dead server made there
        return notes

    def ids(self) -> Iterator[str]:
        with self._guard:
            rows = self._db.execute("SELECT id FROM jobs ORDER BY seq").fetchall()
        return iter([row[0] for row in rows])


def interrupted_error(attempts: int) -> VideoError:
    return VideoError(code=ErrorCode.INTERRUPTED.value, type="server_error",
                      message=f"the server stopped while this job ran, {attempts} times; it is not run again",
                      hint="submit it again; if the server keeps stopping on it, see the server's log")


def _job(row: sqlite3.Row) -> StoredJob:
    return StoredJob(id=row["id"], created_at=row["created_at"], status=JobStatus(row["status"]),
                     progress=row["progress"], phase=row["phase"], model=row["model"],
                     fields=json.loads(row["fields"]),
                     uploads=tuple((f, n, c) for f, n, c in json.loads(row["uploads"])),
                     shape=json.loads(row["shape"]), attempts=row["attempts"],
                     error=None if row["error"] is None else VideoError.model_validate_json(row["error"]),
                     completed_at=row["completed_at"])
