"""A fleet's front: `h3bridge serve --server URL ...` accepts jobs into the durable queue every
`h3bridge serve` already has (server/jobs.py: SQLite, survives a restart) and runs each one on
whichever of its servers is free first, one worker per server, each driving its server with
RemoteEngine (so every retry, limit and message is that engine's and that server's own).

Clients see one OpenAI Videos API URL: the front's own routes (server/app.py), its job ids, its
event stream and its copy of each clip (downloaded from the server that rendered it). A job
waiting for a server is `queued` on the front; the servers hold at most the one job each worker
runs (plus what other clients send them directly).

What happens when things go wrong (docs/fleet.md says the same):
* a server that is down (its /health does not answer) takes no job; its worker looks again every
  second and starts taking jobs the moment it answers;
* a server that refuses a job before accepting it (unreachable, or full with other clients'
  jobs: 429) gives it back: the job is queued again in its place, for any server;
* a server that goes away while it holds a job (killed, unplugged): that job FAILS on the front
  with the reason and is not run elsewhere, so no job is ever rendered twice; the front deletes
  it on that server when the server is back (its own restart would otherwise run it again);
* the front stopped or killed, and restarted: every accepted job is still in its queue; the
  servers go on rendering what they were handed (stopping the front cancels nothing); a job that
  was running is queued again (server/jobs.py recover) and followed on the server it was handed
  to (the queue's `placements`), or, when that server is down or out of the fleet, run on another
  and deleted on the first when it is back. A job is sent with the front's job id as its
  Idempotency-Key, so one sent again (the front killed between the server's answer and the
  placement's commit) gets that server's job back;
* `--servers-file FILE`: the servers are re-read when the file changes, so a server added while
  jobs wait starts taking them, and a server taken out finishes its job and takes no more.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Sequence

import httpx

from ..errors import RemoteError, RemoteUnreachableError, RequestError
from ..engines.remote import JobAdoption, RemoteEngine, normalise_base_url
from ..safeio.paths import FileTooLargeError, NotRegularFileError, not_regular, read_text_capped, too_large
from ..server.jobs import FRONT_MAX_QUEUED, JobStore  # noqa: F401  (serve's default here)
from ..server.progress_feed import ProgressHub
from ..server.worker import NOT_READY_WAIT, NotTaken, Worker
from ..wire.videos import API_KEY_ENV, HEALTH_PATH
from .config import FleetServer, ServerKind, check_server

_log = logging.getLogger("h3bridge.serve")

HEALTH_TIMEOUT = 5.0         # seconds a server's /health may take before it counts as down
WATCH_SECONDS = 1.0          # how often --servers-file is looked at
MAX_SERVERS_FILE_BYTES = 1 << 20


def check_server_url(url: str, flag: str) -> str:
    """A server's base URL as the front keys it (`http://host:port`), refused in fleet's words."""
    check_server(FleetServer(url, ServerKind.H3BRIDGE, None), flag)
    return normalise_base_url(url)


def read_servers_file(path: Path) -> list[str]:
    """One server URL a line; blank lines and `#` comments are skipped."""
    try:
        text = read_text_capped(path, MAX_SERVERS_FILE_BYTES, not_regular, too_large)
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        if isinstance(error, (NotRegularFileError, FileTooLargeError)):
            reason = str(error)
        raise RequestError(f"--servers-file {path}: cannot read it ({reason})", field="--servers-file",
                           hint="give a text file with one server URL a line, e.g. http://mac1.local:8765") from None
    urls: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                url = check_server_url(line, "--server")
            except RequestError as error:
                raise RequestError(f"--servers-file {path} line {number}: {error.message.removeprefix('--server ')}",
                                   field="--servers-file",
                                   hint="write one server's base URL a line, e.g. http://mac1.local:8765") from None
            if url not in urls:
                urls.append(url)
    return urls


class ServerWorker(Worker):
    """Runs the front's queue on one server, one job at a time, through RemoteEngine."""

    def __init__(self, store: JobStore, url: str, events: ProgressHub, api_key: str | None,
                 fleet: "FleetWorkers | None" = None) -> None:
        # full_server_wait=0: a server full of other clients' jobs gives the job back at once
        # (NotTaken), so another server can take it instead of this worker sitting on it.
        engine = RemoteEngine(url, api_key=api_key, full_server_wait=0.0)
        super().__init__(store, engine, events=events, name=f"h3bridge-fleet {engine.base_url}")
        self.url = engine.base_url
        self._api_key = api_key
        self._up: bool | None = None
        self._rest_until = 0.0                 # after a job given back: no new one before this (monotonic)
        self._abandoned: list[str] = []       # this server's jobs the front gave up on when it went away
        self._fleet = fleet

    @property
    def down(self) -> bool:
        """Known to be down (False while not yet asked: its worker asks at once)."""
        return self._up is False

    def abandon(self, server_job: str) -> None:
        """This server's job `server_job` is rendered elsewhere now: delete it here once the server is back."""
        if server_job not in self._abandoned:
            self._abandoned.append(server_job)

    def next_job(self):
        """The oldest queued job that is not this server's to lose: a job handed to another server
        before the front's restart waits for that server, unless it is down or out of the fleet
        (then it runs here, and is deleted there when that server is back)."""
        for job, placed_on, server_job in self.store.queued_placed():
            if placed_on is None or placed_on == self.url:
                return job
            other = self._fleet.worker(placed_on) if self._fleet is not None else None
            if other is None or other.down:
                if other is not None and server_job is not None:
                    other.abandon(server_job)
                return job
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more jobs. The running one is not cancelled: its server renders it to the end, and
        this worker downloads it if the front still runs (taken out of the fleet), or the front's
        restart follows it there again."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()

    def ready(self) -> bool:
        if time.monotonic() < self._rest_until:    # it just gave a job back: not straight at it again
            return False
        try:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            up = httpx.get(self.url + HEALTH_PATH, headers=headers, timeout=HEALTH_TIMEOUT).status_code == 200
            reason = "" if up else "its /health did not answer 200"
        except httpx.HTTPError as error:
            up, reason = False, str(error) or type(error).__name__
        if up != self._up:
            if up:
                _log.warning("h3bridge serve: fleet server %s is up: it takes jobs", self.url)
            else:
                _log.warning("h3bridge serve: fleet server %s is down (%s): it takes no job until it answers",
                             self.url, reason)
            self._up = up
        if up and self._abandoned:
            # Back after going away mid-job: its own restart queued that job again; the front has
            # failed it already, so it must not render there a second time.
            for job_id in list(self._abandoned):
                if self.engine.delete_job(job_id):
                    self._abandoned.remove(job_id)
        return up

    def run_engine(self, job_id: str, request, output, *, on_progress, cancel, pause, **previews) -> None:
        placed = self.store.placement(job_id)
        # handed to this server before the front's restart: followed there, not rendered again
        earlier = placed[1] if placed is not None and placed[0] == self.url else None
        accepted: list[str] = [earlier] if earlier else []

        def submitted(server_job: str) -> None:
            self.store.place(job_id, self.url, server_job)      # before it is followed
            accepted[:] = [server_job]

        try:
            # The front's job id is also the Idempotency-Key: sent again (the front killed between
            # the server's answer and the placement's commit), the server hands that job back.
            self.engine.generate(request, output, overwrite=False, want_frames=False, want_audio=False,
                                 on_progress=on_progress, cancel=cancel, pause=pause,
                                 adoption=JobAdoption(key=job_id, job_id=earlier, on_submitted=submitted), **previews)
        except RemoteUnreachableError as error:
            self._up = False
            if not accepted:
                self._rest_until = time.monotonic() + NOT_READY_WAIT
                raise NotTaken(error.message) from error
            self._abandoned.append(accepted[0])
            raise RemoteUnreachableError(
                f"the fleet's server {self.url} went away while it held this job ({error.message}); the job is "
                "not run on another server, so that no clip is rendered twice", url=self.url,
                hint="submit it again: a server that is up will take it") from None
        except RemoteError as error:
            if not accepted and error.status == 429:      # full with other clients' jobs
                self._rest_until = time.monotonic() + NOT_READY_WAIT
                raise NotTaken(error.message) from error
            raise


class FleetWorkers:
    """One ServerWorker per server over one queue and one progress hub: what server/app.py's
    create_app drives as its worker (start, notify, cancel, events, stop)."""

    def __init__(self, store: JobStore, servers: Sequence[str] = (), *, servers_file: Path | None = None,
                 key_env: str = API_KEY_ENV) -> None:
        self.store = store
        self.events = ProgressHub()
        self.servers_file = servers_file
        self._fixed = list(servers)
        self._key_env = key_env
        self._workers: dict[str, ServerWorker] = {}
        self._retired: list[ServerWorker] = []     # taken out of the fleet, maybe finishing a job
        self._guard = threading.Lock()
        self._stopping = threading.Event()
        self._file_stamp: tuple[int, int] | None = None
        self._watcher = threading.Thread(target=self._watch, name="h3bridge-fleet-servers-file", daemon=True)

    def worker(self, url: str) -> ServerWorker | None:
        with self._guard:
            return self._workers.get(url)

    def servers(self) -> list[str]:
        with self._guard:
            return list(self._workers)

    def start(self) -> None:
        self._apply(self._wanted())
        if self.servers_file is not None:
            self._watcher.start()

    def notify(self) -> None:
        with self._guard:
            workers = list(self._workers.values())
        for worker in workers:
            worker.notify()

    def cancel(self, job_id: str, timeout: float = 30.0) -> bool:
        """Stop the job where it runs; a deleted job that waits on the front after its restart, handed
        to a server before, is deleted on that server too."""
        with self._guard:
            workers = list(self._workers.values()) + self._retired
        running = any(worker.cancel(job_id, timeout) for worker in workers)
        placed = self.store.placement(job_id)
        if placed is not None:
            owner = self.worker(placed[0])
            if not running and owner is not None and not owner.engine.delete_job(placed[1]):
                owner.abandon(placed[1])       # deleted there once it answers again
            self.store.unplace(job_id)
        return running

    def set_paused(self, job_id: str, paused: bool) -> bool:
        """Pause or resume the job on the server that runs it (RemoteEngine passes it on there:
        POST .../pause, .../resume); True if a server runs it."""
        with self._guard:
            workers = list(self._workers.values()) + self._retired
        return any(worker.set_paused(job_id, paused) for worker in workers)

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        with self._guard:
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.stop(timeout)

    # ------------------------------------------------------------------ the servers

    def _wanted(self) -> list[str]:
        wanted = list(self._fixed)
        if self.servers_file is not None:
            try:
                stat = os.stat(self.servers_file)
                self._file_stamp = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                self._file_stamp = None
            wanted += [url for url in read_servers_file(self.servers_file) if url not in wanted]
        return wanted

    def _apply(self, wanted: list[str]) -> None:
        api_key = os.environ.get(self._key_env) or None
        with self._guard:
            if self._stopping.is_set():
                return
            added = [url for url in wanted if url not in self._workers]
            gone = [self._workers.pop(url) for url in list(self._workers) if url not in wanted]
            self._retired = [worker for worker in self._retired if worker._thread.is_alive()] + gone
            for url in added:
                self._workers[url] = ServerWorker(self.store, url, self.events, api_key, self)
                self._workers[url].start()
        for url in added:
            _log.warning("h3bridge serve: fleet server %s added", url)
        for worker in gone:
            _log.warning("h3bridge serve: fleet server %s taken out; it finishes the job it runs", worker.url)
            worker.stop()

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_SECONDS):
            assert self.servers_file is not None
            try:
                stat = os.stat(self.servers_file)
                stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                stamp = None
            if stamp == self._file_stamp:
                continue
            try:
                self._apply(self._wanted())
            except RequestError as error:      # a half-written or wrong file: keep the servers we have
                _log.warning("h3bridge serve: %s (%s); the fleet's servers stay as they were", error.message,
                             error.hint)
