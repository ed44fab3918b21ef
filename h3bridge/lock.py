"""The machine-wide engine lock: at most one MiniMax-H3 engine holds the model in memory.

h3 maps tens of GiB of weights and plans its working set for the whole machine
(h3_host.c memory planning), so two engines at once would page each other to
death. Every engine (one-shot run or warm session) holds this lock while its
process is alive; everyone else waits, reporting ``progress.WAITING_PHASE``
through ``on_wait`` and staying cancellable.

The lock is a filelock (an OS file lock, so it is released by the kernel if the
holder dies). The file lives in the user's cache directory; set
``H3BRIDGE_LOCK_PATH`` to put it elsewhere (tests do, to stay isolated). A holder
that dies does not take its engine with it (h3 notices only at its next write), so
each holder records its engine in ``<lock>.engine`` and the next holder stops an
engine still running there, with the temporary files it was writing.

Within one process the file lock still excludes: two holders in the same
process block each other exactly as two processes do (each `EngineLock` opens
its own descriptor). So that a process cannot deadlock on its own idle warm
session, holders may register a *yield hook* (`register_yield_hook`): when
someone in this process has to wait, the hooks run first and an idle session
shuts down (releasing the lock) instead of making its own process wait for
its idle timer. A busy holder sees `has_in_process_waiters()` after its job and
yields then.

Across processes, every waiter touches its `<lock>.wanted.<ticket>.<pid>.<n>` marker on each
poll (and removes it when done). Waiters are served in ticket order (first come, first served;
a marker not touched for WANTED_FRESHNESS seconds is a dead waiter and loses its place); a long-lived
holder (a warm session) checks `others_waiting()` while idle and after each job
and steps aside, so a one-shot run in a terminal does not sit behind another
program's idle session until that session's idle timeout.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from filelock import FileLock, Timeout

from .cancel import CancelToken
from .engine_process import terminate_group
from .errors import EngineError, GenerationCancelled
from .userdirs import platform_cache_dir

LOCK_PATH_ENV = "H3BRIDGE_LOCK_PATH"
LOCK_FILE_NAME = "engine.lock"
# Short polls keep "waiting for the engine" reports fresh and cancellation prompt.
DEFAULT_POLL_INTERVAL = 0.1
# A waiter re-announces itself every poll; an announcement older than this is a waiter that
# got the lock or gave up.
WANTED_FRESHNESS = 1.0

# Beside the lock: the engine its holder runs (EngineLock.record_engine).
ENGINE_RECORD_SUFFIX = ".engine"

_log = logging.getLogger("h3bridge")

WaitCallback = Callable[[float], None]
YieldHook = Callable[[], None]


def default_lock_path() -> Path:
    """`$H3BRIDGE_LOCK_PATH`, else `engine.lock` in the platform's h3bridge cache directory
    (userdirs.platform_cache_dir: H3BRIDGE_CACHE_DIR does not move it)."""
    override = os.environ.get(LOCK_PATH_ENV)
    if override:
        return Path(override).expanduser()
    return platform_cache_dir() / LOCK_FILE_NAME


# --- in-process cooperation -------------------------------------------------------------------

_registry_guard = threading.Lock()
_yield_hooks: dict[int, YieldHook] = {}
_next_hook_id = 0
_in_process_waiters = 0


def register_yield_hook(hook: YieldHook) -> int:
    """Run `hook` whenever another holder in this process has to wait; returns an id to unregister.

    The hook is called from the waiting thread. It should release the lock if its
    holder is idle (e.g. shut an idle session down) and return quickly otherwise.
    """
    global _next_hook_id
    with _registry_guard:
        _next_hook_id += 1
        _yield_hooks[_next_hook_id] = hook
        return _next_hook_id


def unregister_yield_hook(hook_id: int) -> None:
    with _registry_guard:
        _yield_hooks.pop(hook_id, None)


def has_in_process_waiters() -> bool:
    """True while some thread of this process is waiting for the engine lock."""
    with _registry_guard:
        return _in_process_waiters > 0


def _run_yield_hooks() -> None:
    with _registry_guard:
        hooks = list(_yield_hooks.values())
    for hook in hooks:
        hook()


# --- the lock ----------------------------------------------------------------------------------

class EngineLock:
    """One claim on the machine's engine. Acquire/release may happen on different threads.

    Not reentrant: a second `EngineLock` in the same process waits like any other holder.
    """

    def __init__(self, path: Path | None = None, *, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.path = Path(path) if path is not None else default_lock_path()
        self.poll_interval = poll_interval
        self.waited = 0.0   # seconds the last acquire spent waiting
        self._ticket = 0    # set by each acquire: when this claim began to wait
        # thread_local=False: a session acquires on its job thread and may release on its
        # idle-timer thread; filelock's default per-thread counter would ignore that release.
        self._file_lock = FileLock(str(self.path), thread_local=False)

    @property
    def is_held(self) -> bool:
        return self._file_lock.is_locked

    def acquire(self, *, cancel: CancelToken | None = None, on_wait: WaitCallback | None = None) -> None:
        """Block until this process owns the engine. Raises GenerationCancelled if cancelled first.

        `on_wait(seconds_waited)` is called once per poll while someone else holds the lock,
        starting right after the first failed attempt (so callers can show WAITING_PHASE).
        Once the lock is ours, an engine its last holder left running is stopped (see
        `record_engine`), so two engines never share the machine.
        """
        self._take(cancel=cancel, on_wait=on_wait)
        try:
            stop_orphaned_engine(self._record_path)
        except BaseException:
            self.release()
            raise

    # The kernel frees the lock when its holder dies, but not the holder's engine: h3 has no
    # signal handlers and only notices its host is gone at its next write to the closed stderr
    # pipe (SIGPIPE), which a long tiled VAE decode or a hung engine may never make. So each
    # holder records the engine it starts beside the lock, and the next holder stops it.

    @property
    def _record_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}{ENGINE_RECORD_SUFFIX}")

    def record_engine(self, pid: int, *, leftovers: Sequence[Path | str] = ()) -> None:
        """Note, while holding the lock, the engine just started (it leads its own process group)
        and the files it may leave half-written, for the next holder should this process die.
        A leftover is a path (a folder goes with its contents), a glob pattern, or `DIR/` (that
        folder only if it is empty); they are removed in order (see `remove_leftovers`)."""
        import psutil
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return            # already gone: nothing to leave behind
        record = EngineRecord(pid=pid, started=started, leftovers=tuple(str(path) for path in leftovers))
        write_engine_record(self._record_path, record)

    def clear_engine(self) -> None:
        """The recorded engine is gone (reaped by us): forget it."""
        try:
            self._record_path.unlink()
        except OSError:
            pass

    def _take(self, *, cancel: CancelToken | None, on_wait: WaitCallback | None) -> None:
        global _in_process_waiters
        if self.is_held:
            raise RuntimeError("EngineLock.acquire called twice without release")
        started = time.monotonic()
        self.waited = 0.0
        # First come, first served: the OS lock is not fair (whoever polls first after a release
        # wins), so waiters queue by this ticket and only the oldest live waiter tries the lock.
        self._ticket = time.time_ns()
        if cancel is not None and cancel.cancelled:
            raise GenerationCancelled("cancelled before the engine started")
        if not self._others_ahead() and self._try_acquire(timeout=0):
            return
        with _registry_guard:
            _in_process_waiters += 1
        try:
            # Someone holds it. If that someone is an idle holder in this very process, ask it
            # to step aside now rather than wait for its idle timer.
            _run_yield_hooks()
            while True:
                self.waited = time.monotonic() - started
                if on_wait is not None:
                    on_wait(self.waited)
                if cancel is not None and cancel.cancelled:
                    raise GenerationCancelled("cancelled while waiting for the engine")
                self._announce_waiting()
                if self._others_ahead():
                    time.sleep(self.poll_interval)      # an older waiter goes first
                elif self._try_acquire(timeout=self.poll_interval):
                    self.waited = time.monotonic() - started
                    return
        finally:
            self._withdraw()
            with _registry_guard:
                _in_process_waiters -= 1

    @property
    def _wanted_marker(self) -> Path:
        """This waiter's announcement, `<lock>.wanted.<ticket>.<pid>.<n>`: touched on every poll
        while it waits, removed once it got the lock or gave up. The ticket (when it began to
        wait, zero-padded so names sort by it) is its place in the queue."""
        return self.path.with_name(f"{self.path.name}.wanted.{self._ticket:020d}.{os.getpid()}.{id(self)}")

    def _fresh_markers(self, freshness: float) -> list[Path]:
        """Announcements of live waiters (touched within `freshness` seconds), this one excluded.
        An older announcement belongs to a waiter that died: it is ignored."""
        now = time.time()
        try:
            markers = list(self.path.parent.glob(f"{self.path.name}.wanted.*"))
        except OSError:
            return []
        mine = self._wanted_marker.name
        fresh: list[Path] = []
        for marker in markers:
            try:
                if marker.name != mine and now - marker.stat().st_mtime < freshness:
                    fresh.append(marker)
            except OSError:
                continue
        return fresh

    def _others_ahead(self) -> bool:
        """True while a live waiter (in any process) queued before this one."""
        mine = self._wanted_marker.name
        return any(marker.name < mine for marker in self._fresh_markers(WANTED_FRESHNESS))

    def _announce_waiting(self) -> None:
        try:
            self._wanted_marker.touch()
        except OSError:
            pass      # best effort: without it, holders simply keep the lock until they are done

    def _withdraw(self) -> None:
        try:
            self._wanted_marker.unlink()
        except OSError:
            pass

    def others_waiting(self, freshness: float = WANTED_FRESHNESS) -> bool:
        """True when a waiter in another process announced itself within `freshness` seconds.

        Waiters in this process are not counted: they are served by the yield hooks.
        A marker older than that belongs to a waiter that died; it is ignored.
        """
        return any(marker.name.split(".")[-2] != str(os.getpid()) for marker in self._fresh_markers(freshness))

    def _try_acquire(self, *, timeout: float) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Short poll inside filelock; our loop does the reporting and cancellation.
            self._file_lock.acquire(timeout=timeout, poll_interval=min(0.02, self.poll_interval))
        except Timeout:
            return False
        except OSError as error:     # the cache folder is read-only, or a file sits where a folder should
            raise EngineError(f"cannot use the engine lock file {self.path}: {error.strerror or error}",
                              hint=f"set {LOCK_PATH_ENV} to a file in a writable folder") from None
        return True

    def release(self) -> None:
        """Give the engine back. Safe to call when not held."""
        if self._file_lock.is_locked:
            self._file_lock.release(force=True)


@dataclass(frozen=True)
class EngineRecord:
    """The engine a lock holder started, kept in `<lock>.engine` while it runs."""

    pid: int                    # leads its own process group (start_new_session)
    started: float              # its psutil create_time: tells a reused pid apart
    leftovers: tuple[str, ...]  # our temporary files and folders it writes into (remove_leftovers)


def write_engine_record(path: Path, record: EngineRecord) -> None:
    """Write the record under a temporary name and rename it into place."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(asdict(record)))
        os.replace(temporary, path)
    except OSError:
        remove_leftovers([str(temporary)])    # best effort: without it, an orphan lives until its next write


def remove_leftovers(entries: Sequence[str]) -> None:
    """Remove, in order, what an engine leaves behind: `DIR/` only if empty, a path whose file
    name is a glob pattern the files it matches in that (literal) folder, any other path
    outright (a folder with its contents: our own temporary one). Folder names are never
    patterns, so a user's `out [1]/` is taken as written. Best effort: what cannot go stays."""
    for entry in entries:
        folder, name = os.path.split(entry)
        pattern = name and glob.has_magic(name)
        targets = glob.glob(os.path.join(glob.escape(folder), name)) if pattern else [entry]
        for target in targets:
            try:
                if entry.endswith(os.sep):
                    os.rmdir(target)
                elif os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    os.unlink(target)
            except OSError:
                pass


def read_engine_record(path: Path) -> EngineRecord | None:
    try:
        data = json.loads(path.read_text())
        return EngineRecord(pid=int(data["pid"]), started=float(data["started"]),
                            leftovers=tuple(str(item) for item in data["leftovers"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_orphaned_engine(record_path: Path) -> bool:
    """Called by a new holder of the lock: if the engine recorded by a previous holder (which
    died without clearing it) still runs, stop its process group and remove the temporary
    files it was writing. True if an engine was stopped."""
    import psutil
    record = read_engine_record(record_path)
    stopped = False
    if record is not None:
        try:
            alive = abs(psutil.Process(record.pid).create_time() - record.started) < 0.05
        except psutil.Error:
            alive = False
        if alive:
            _log.warning("h3bridge: stopping engine process %d, left running by a program that exited "
                         "while it held the engine", record.pid)
            terminate_group(record.pid)
            stopped = True
        remove_leftovers(record.leftovers)
    remove_leftovers([str(record_path)])
    return stopped


@contextmanager
def engine_lock(*, cancel: CancelToken | None = None, on_wait: WaitCallback | None = None,
                path: Path | None = None, poll_interval: float = DEFAULT_POLL_INTERVAL) -> Iterator[EngineLock]:
    """Hold the machine-wide engine lock for the `with` block.

    While another holder has it, `on_wait(seconds_waited)` is called every `poll_interval`
    (report ``progress.WAITING_PHASE``) and `cancel` is checked (raises GenerationCancelled).
    Yields the `EngineLock`; its `waited` says how long the wait was.
    """
    lock = EngineLock(path, poll_interval=poll_interval)
    lock.acquire(cancel=cancel, on_wait=on_wait)
    try:
        yield lock
    finally:
        lock.release()
