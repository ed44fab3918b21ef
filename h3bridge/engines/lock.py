"""The machine-wide engine lock: at most one MiniMax-H3 engine holds the model in memory.

h3 maps tens of GiB of weights and plans its working set for the whole machine
(h3_host.c memory planning), so two engines at once would page each other to
death. Every engine (one-shot run or warm session) holds this lock while its
process is alive; everyone else waits, reporting ``progress.WAITING_PHASE``
through ``on_wait`` and staying cancellable.

The lock is a filelock (an OS file lock, so it is released by the kernel if the
holder dies). One machine has one pool of unified memory, so the lock is one per machine, not
per account or HOME: it lives in `userdirs.machine_dir()` (`/Users/Shared/h3bridge` on macOS,
`/var/tmp/h3bridge` elsewhere; `H3BRIDGE_MACHINE_DIR` moves that folder), shared by every account.
That folder is shared, so it is made like /tmp: created mode 1777 (sticky: a file in it can be
removed or renamed only by its owner), checked with lstat (a symlink or a file planted in its
place is refused, as is a folder another account owns that is not open to all); the lock file
is opened O_NOFOLLOW, never truncated, must be a regular file, and is made mode 0666 by whoever
creates it, so every account can lock it and none but its creator can replace it. Set
``H3BRIDGE_LOCK_PATH`` to use a lock file of your own instead (tests do, to stay isolated);
programs with different lock paths do not exclude each other.

A holder that dies does not take its engine with it (h3 notices only at its next write), so
each holder records its engine in its account's own folder beside the lock,
``<lock>.records.<uid>/engine``, and the next holder deals with an engine still running there.
That folder is made by its account, mode 0755, and checked (lstat: a real folder, its owner, no
one else may write in it) before every engine starts: in the sticky shared folder no other account
can then write, replace or remove a record, and a name another account took first is an
EngineError naming it, never a record silently not written. A record is still only evidence:
h3bridge stops a recorded engine only when the record file is its own user's (a regular file, not
a symlink) and the process is its own user's, leads its own process group and started at the
recorded time; it removes only recorded leftovers that are h3bridge's own scratch (scratch.py `own_leftover`:
the one-shot engine's `h3bridge-*` temporary folder, its `.h3bridge-<hex>.partial.mp4` staging
files, the warm session's `/tmp/h3-XXXXXX` folder and the `video-NNNN.mp4` clips in it), each owned
by this user. Anything else is left alone with a logged warning. A live engine recorded by another
account is not ours to stop, and only its owner's next job can stop it, which needs the lock: so a
job that finds one gives the lock back and waits outside the queue (reported like any other wait,
cancellable, the engine named in a logged warning), then queues again with its first ticket. Had
it kept the lock, the owner's job would wait for it while it waited for the owner's engine.

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

Who holds the lock, as a waiter says it, is holder.py; the scratch names and their clean-up are
scratch.py.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from filelock import FileLock, Timeout

from ..cancel import CancelToken
from .child import NOTHING, Nothing, wait_until
from .process import terminate_group
from ..errors import EngineError, GenerationCancelled, H3BridgeError
from ..userdirs import machine_dir
from ..safeio.outputs import write_output
from .scratch import account_uid, new_session_dir, own_leftover, remove_leftovers, session_dir_leftovers

LOCK_PATH_ENV = "H3BRIDGE_LOCK_PATH"
LOCK_FILE_NAME = "engine.lock"
# Short polls keep "waiting for the engine" reports fresh and cancellation prompt.
DEFAULT_POLL_INTERVAL = 0.1
# A waiter re-announces itself every poll; an announcement older than this is a waiter that
# got the lock or gave up.
WANTED_FRESHNESS = 1.0

# Beside the lock, one folder per account, `<lock>.records.<uid>/`, holds the `engine` its holder
# runs (EngineLock.record_engine); only that account can write in it (prepare_record_folder).
RECORD_FOLDER_INFIX = ".records."
RECORD_FILE_NAME = "engine"
# A record is a few hundred bytes; anything much larger is not one of ours.
_RECORD_LIMIT = 1 << 20

_log = logging.getLogger("h3bridge")

WaitCallback = Callable[[float], None]
YieldHook = Callable[[], None]


def default_lock_path() -> Path:
    """`$H3BRIDGE_LOCK_PATH`, else `engine.lock` in the folder every account on this machine
    shares (userdirs.machine_dir: neither HOME nor H3BRIDGE_CACHE_DIR moves it)."""
    override = os.environ.get(LOCK_PATH_ENV)
    if override:
        return Path(override).expanduser()
    return machine_dir() / LOCK_FILE_NAME


def _user_name(uid: int) -> str:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _lock_file_error(path: Path, problem: str, hint: str | None = None) -> EngineError:
    return EngineError(f"cannot use the engine lock file {path}: {problem}",
                       hint=hint or f"set {LOCK_PATH_ENV} to a file in a writable folder")


def prepare_shared_folder(folder: Path) -> None:
    """Make `folder` (userdirs.machine_dir) usable by every account, safely: created mode 1777,
    and refused if what is there is a symlink, not a folder, or another account's folder that
    is not open to all. A folder another account made the same way (the first h3bridge user on
    the machine owns it) is fine: nothing in it is trusted without checking its owner."""
    try:
        os.mkdir(folder, 0o700)            # private until it is set up, then opened to all
        os.chmod(folder, 0o1777)
    except FileExistsError:
        pass
    except OSError as error:
        raise EngineError(f"cannot create the shared engine folder {folder}: {error.strerror or error}",
                          hint=f"create it with `mkdir -m 1777 {folder}`, or set {LOCK_PATH_ENV} "
                               "to a lock file of your own") from None
    try:
        info = os.lstat(folder)
    except OSError as error:
        raise EngineError(f"cannot use the shared engine folder {folder}: {error.strerror or error}",
                          hint=f"set {LOCK_PATH_ENV} to a lock file of your own") from None
    if not stat.S_ISDIR(info.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise EngineError(f"the shared engine folder {folder} is {what}; h3bridge will not use it",
                          hint=f"remove it (h3bridge makes the folder itself), or set {LOCK_PATH_ENV} "
                               "to a lock file of your own")
    mode = stat.S_IMODE(info.st_mode)
    if mode == 0o1777:
        return
    if info.st_uid == account_uid():
        try:
            os.chmod(folder, 0o1777)        # ours: an older h3bridge or a umask made it narrower
        except OSError:
            pass
        return
    raise EngineError(f"the shared engine folder {folder} belongs to {_user_name(info.st_uid)} and is not "
                      f"open to every account (mode {mode:o}, not 1777)",
                      hint=f"ask its owner or an administrator to run `chmod 1777 {folder}`, or set "
                           f"{LOCK_PATH_ENV} to a lock file of your own")


def _check_lock_file(path: Path, *, shared: bool) -> None:
    """Open (creating) the lock file without following a symlink and without truncating it, and
    check it is a regular file; in the shared folder make a new one lockable by every account."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as error:
        if os.path.islink(path):
            raise _lock_file_error(path, "it is a symbolic link; h3bridge will not follow it",
                                   f"remove {path}, or set {LOCK_PATH_ENV} to a lock file of your own") from None
        if isinstance(error, PermissionError) and shared and os.path.lexists(path):
            owner = _user_name(os.lstat(path).st_uid)
            raise _lock_file_error(path, f"it belongs to {owner} and this account may not lock it",
                                   f"ask {owner} or an administrator to run `chmod 666 {path}`") from None
        raise _lock_file_error(path, error.strerror or str(error)) from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise _lock_file_error(path, "it is not a regular file",
                                   f"remove {path}, or set {LOCK_PATH_ENV} to a lock file of your own")
        if shared and info.st_uid == account_uid() and stat.S_IMODE(info.st_mode) != 0o666:
            os.fchmod(descriptor, 0o666)     # the umask narrowed it: other accounts must lock it too
    finally:
        os.close(descriptor)


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


def _cancelled_while_waiting() -> GenerationCancelled:
    return GenerationCancelled("cancelled while waiting for the engine")


# --- the lock ----------------------------------------------------------------------------------

class EngineLock:
    """One claim on the machine's engine. Acquire/release may happen on different threads.

    Not reentrant: a second `EngineLock` in the same process waits like any other holder.
    """

    def __init__(self, path: Path | None = None, *, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        # The machine-wide default lives in a folder every account shares (prepare_shared_folder).
        self.shared = path is None and not os.environ.get(LOCK_PATH_ENV)
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
        Once the lock is ours, an engine its last holder of this account left running is stopped
        (see `record_engine`), so two engines never share the machine; while one another account
        left running still runs, the lock is given back and waited for again (`_settle`).
        """
        if self.is_held:
            raise RuntimeError("EngineLock.acquire called twice without release")
        if cancel is not None and cancel.cancelled:
            raise GenerationCancelled("cancelled before the engine started")
        started = time.monotonic()
        self.waited = 0.0
        # First come, first served: the OS lock is not fair (whoever polls first after a release
        # wins), so waiters queue by this ticket and only the oldest live waiter tries the lock.
        # The ticket is kept across `_settle`'s waits, so a job that stood aside keeps its place.
        self._ticket = time.time_ns()
        while True:
            self._take(started=started, cancel=cancel, on_wait=on_wait)
            try:
                if self._settle(started=started, cancel=cancel, on_wait=on_wait):
                    return
            except BaseException:
                self.release()
                raise

    # The kernel frees the lock when its holder dies, but not the holder's engine: h3 has no
    # signal handlers and only notices its host is gone at its next write to the closed stderr
    # pipe (SIGPIPE), which a long tiled VAE decode or a hung engine may never make. So each
    # holder records the engine it starts beside the lock, and the next holder stops it.

    @property
    def _record_folder(self) -> Path:
        """This account's record folder, `<lock>.records.<uid>`: made by this account, mode 0755,
        so in the shared (sticky) folder no other account can write, replace or remove what is in
        it (`prepare_record_folder`); every account can read it, to wait for what it names."""
        return self.path.with_name(f"{self.path.name}{RECORD_FOLDER_INFIX}{account_uid()}")

    @property
    def _record_path(self) -> Path:
        """This account's record of its running engine (`EngineRecord`), in its record folder."""
        return self._record_folder / RECORD_FILE_NAME

    def _settle(self, *, started: float, cancel: CancelToken | None, on_wait: WaitCallback | None) -> bool:
        """With the lock just taken: make sure this account's record folder is its own (an error
        now, before any engine starts, rather than an engine nobody could find if this process
        died), stop an engine a dead holder of this account left running (`stop_orphaned_engine`),
        and see whether another account's still runs. True when the machine is free.

        Another account's engine holds the machine's memory but is not ours to stop: only its
        owner's next job can, and that job needs the lock. So the lock is given back (and this
        waiter leaves the queue) while that engine runs, reporting and cancellable; False once it
        is gone, for the caller to queue again with its ticket. Holding the lock while waiting
        for it would deadlock the two accounts (each waiting for the other)."""
        prepare_record_folder(self._record_folder)
        stop_orphaned_engine(self._record_path)
        foreign = self._foreign_engines()
        if not foreign:
            return True
        self.release()
        announced: set[tuple[int, float]] = set()

        def poll(timeout: float) -> bool | Nothing:
            nonlocal foreign
            for user, record in foreign:
                if (record.pid, record.started) not in announced:
                    announced.add((record.pid, record.started))
                    _log.warning("h3bridge: waiting for the engine of user %s (process %d), left running "
                                 "by a program of theirs that exited; it is theirs to stop", user, record.pid)
            self.waited = time.monotonic() - started
            if on_wait is not None:
                on_wait(self.waited)
            if cancel is not None and cancel.cancelled:
                return NOTHING       # the wait raises the cancel
            time.sleep(timeout)
            foreign = self._foreign_engines()
            return False if not foreign else NOTHING

        return wait_until(poll, cancel=cancel, on_cancel=_cancelled_while_waiting, interval=self.poll_interval)

    def _foreign_engines(self) -> list[tuple[str, "EngineRecord"]]:
        """(user name, record) of each live engine another account recorded beside the lock."""
        return [engine for engine in map(_foreign_engine, self._other_records()) if engine is not None]

    def _other_records(self) -> list[Path]:
        """The records of the other accounts' record folders beside the lock (real folders only)."""
        mine = self._record_folder.name
        try:
            found = sorted(self.path.parent.glob(f"{glob.escape(self.path.name)}{RECORD_FOLDER_INFIX}*"))
        except OSError:
            return []
        records = []
        for folder in found:
            try:
                if folder.name != mine and stat.S_ISDIR(os.lstat(folder).st_mode):
                    records.append(folder / RECORD_FILE_NAME)
            except OSError:
                continue
        return records

    def record_engine(self, pid: int, *, leftovers: Sequence[Path | str] = (),
                      session_dirs_before: Iterable[str] | None = None) -> None:
        """Note, while holding the lock, the engine just started (it leads its own process group)
        and the files it may leave half-written, for the next holder should this process die.
        A leftover is a path (a folder goes with its contents), a glob pattern, or `DIR/` (that
        folder only if it is empty); they are removed in order (see `remove_leftovers`).
        `session_dirs_before`: for an interactive h3, this user's session folders before it
        started (see EngineRecord). Raises EngineError when the record cannot be written: the caller stops its engine, since
        an engine nobody could find after a crash might run beside the next one."""
        import psutil
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return            # already gone: nothing to leave behind
        record = EngineRecord(pid=pid, started=started, leftovers=tuple(str(path) for path in leftovers),
                              session_dirs_before=None if session_dirs_before is None
                              else tuple(sorted(session_dirs_before)))
        write_engine_record(self._record_path, record)

    def clear_engine(self) -> None:
        """The recorded engine is gone (reaped by us): forget it."""
        _remove_own_record(self._record_path)

    def _take(self, *, started: float, cancel: CancelToken | None, on_wait: WaitCallback | None) -> None:
        """Take the OS lock in ticket order (see `acquire`), reporting and cancellable."""
        global _in_process_waiters
        if not self._others_ahead() and self._try_acquire(timeout=0):
            return
        with _registry_guard:
            _in_process_waiters += 1
        try:
            # Someone holds it. If that someone is an idle holder in this very process, ask it
            # to step aside now rather than wait for its idle timer.
            _run_yield_hooks()

            def report() -> None:
                self.waited = time.monotonic() - started
                if on_wait is not None:
                    on_wait(self.waited)

            def poll(timeout: float) -> bool | Nothing:
                self._announce_waiting()
                if self._others_ahead():
                    time.sleep(timeout)      # an older waiter goes first
                elif self._try_acquire(timeout=timeout):
                    self.waited = time.monotonic() - started
                    return True
                report()
                return NOTHING

            report()
            wait_until(poll, cancel=cancel, on_cancel=_cancelled_while_waiting, interval=self.poll_interval)
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
            # O_NOFOLLOW: in the shared folder a name could have been planted as a symlink.
            descriptor = os.open(self._wanted_marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                                 0o644)
            try:
                os.utime(descriptor)
            finally:
                os.close(descriptor)
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
            if self.shared:
                prepare_shared_folder(self.path.parent)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            _check_lock_file(self.path, shared=self.shared)
            # Short poll inside filelock; our loop does the reporting and cancellation.
            self._file_lock.acquire(timeout=timeout, poll_interval=min(0.02, self.poll_interval))
        except Timeout:
            return False
        except OSError as error:     # the folder is read-only, or a file sits where a folder should
            raise _lock_file_error(self.path, error.strerror or str(error)) from None
        return True

    def release(self) -> None:
        """Give the engine back. Safe to call when not held."""
        if self._file_lock.is_locked:
            self._file_lock.release(force=True)


@dataclass(frozen=True)
class EngineRecord:
    """The engine a lock holder started, kept in `<lock>.records.<uid>/engine` while it runs."""

    pid: int                    # leads its own process group (start_new_session)
    started: float              # its psutil create_time: tells a reused pid apart
    leftovers: tuple[str, ...]  # our temporary files and folders it writes into (remove_leftovers)
    # An interactive h3 (the warm session): this user's session folders that existed before it
    # started. It makes its own (mkdtemp /tmp/h3-XXXXXX) before saying where; should this process
    # die before it has heard where, the next holder takes the one folder that appeared since.
    session_dirs_before: tuple[str, ...] | None = None


def _record_folder_error(folder: Path, problem: str, hint: str | None = None) -> EngineError:
    return EngineError(f"cannot keep this account's engine record in {folder}: {problem}",
                       hint=hint or f"set {LOCK_PATH_ENV} to a lock file in a folder of your own")


def prepare_record_folder(folder: Path) -> None:
    """Make `folder` (`<lock>.records.<uid>`) this account's own: created mode 0755 if missing,
    and checked with lstat to be a real folder that this account owns and no one else may write
    to. In the shared (sticky) folder another account could have made that name first, as a
    file, a symlink or a folder of theirs: that is an EngineError naming it and the fix, never
    a record silently not written (its engine would then be found by no one after a crash)."""
    try:
        os.mkdir(folder, 0o700)            # private until its mode is set, whatever the umask
        os.chmod(folder, 0o755)            # others read it: they wait for the engine it names
    except FileExistsError:
        pass
    except OSError as error:
        raise _record_folder_error(folder, error.strerror or str(error)) from None
    try:
        info = os.lstat(folder)
    except OSError as error:
        raise _record_folder_error(folder, error.strerror or str(error)) from None
    if info.st_uid != account_uid() or not stat.S_ISDIR(info.st_mode):
        what = ("a symbolic link" if stat.S_ISLNK(info.st_mode) else
                "a folder" if stat.S_ISDIR(info.st_mode) else "a file")
        owner = _user_name(info.st_uid)
        raise _record_folder_error(
            folder, f"that name is taken by {what} belonging to {owner}, not to this account",
            f"ask {owner} or an administrator to remove {folder} (`rm -r {folder}`); until then, "
            f"set {LOCK_PATH_ENV} to a lock file of your own")
    if stat.S_IMODE(info.st_mode) & 0o022:
        try:
            os.chmod(folder, 0o755)        # ours, but others could write in it: not any more
        except OSError as error:
            raise _record_folder_error(folder, error.strerror or str(error)) from None


def write_engine_record(path: Path, record: EngineRecord) -> None:
    """Write the record in this account's record folder (made and checked by prepare_record_folder)
    through safeio.outputs (staged, fsynced, renamed over the previous record, never over anything
    but a regular file). Raises EngineError naming the file when it cannot be written (a full or
    read-only disk, a record folder another account took)."""
    prepare_record_folder(path.parent)
    try:
        write_output(path, json.dumps(asdict(record)), overwrite=True, field="engine record", make_parents=False)
    except (OSError, H3BridgeError) as error:
        reason = error.message if isinstance(error, H3BridgeError) else error.strerror or str(error)
        raise EngineError(f"cannot write the engine record {path}: {reason}",
                          hint=f"make room on the disk holding {path.parent} (or make it writable), or set "
                               f"{LOCK_PATH_ENV} to a lock file in a writable folder of your own") from None


def _remove_own_record(path: Path) -> None:
    """Remove `path` if it is this user's file (or a symlink planted in its place: unlinking a
    symlink never touches its target); another account's file is theirs."""
    try:
        info = os.lstat(path)
        if info.st_uid == account_uid() or stat.S_ISLNK(info.st_mode):
            os.unlink(path)
    except OSError:
        pass


def read_engine_record(path: Path) -> tuple[int, EngineRecord] | None:
    """(owner uid, record) from the record file at `path`, or None when there is none or it is not
    a record: a symlink, not a regular file, too large, or not our JSON. Never follows a symlink."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            data = json.loads(handle.read(_RECORD_LIMIT))
        before = data.get("session_dirs_before")
        record = EngineRecord(pid=int(data["pid"]), started=float(data["started"]),
                              leftovers=tuple(str(item) for item in data["leftovers"]),
                              session_dirs_before=None if before is None else tuple(str(item) for item in before))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info.st_uid, record


def recorded_process(record: EngineRecord, uid: int):
    """The psutil.Process the record describes, if it still runs as `uid`, leads its own process
    group (an engine does: start_new_session) and started when recorded; else None."""
    import psutil
    if record.pid <= 1:
        return None
    try:
        process = psutil.Process(record.pid)
        if abs(process.create_time() - record.started) >= 0.05 or process.uids().real != uid:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:      # it ended; only its parent's wait is missing
            return None
        if os.getpgid(record.pid) != record.pid:
            return None
        return process
    except (psutil.Error, OSError):
        return None


def _foreign_engine(record_path: Path) -> tuple[str, EngineRecord] | None:
    """(user name, record) for another account's engine recorded at `record_path` that still runs."""
    loaded = read_engine_record(record_path)
    if loaded is None:
        return None
    owner, record = loaded
    if owner == account_uid() or recorded_process(record, owner) is None:
        return None
    return _user_name(owner), record


def stop_orphaned_engine(record_path: Path) -> bool:
    """Called by a new holder of the lock with this user's record: if the engine a previous holder
    of this user recorded (it died without clearing it) still runs, stop its process group and
    remove the temporary files it was writing. A record that is not this user's own file, a pid
    that is not this user's engine started at the recorded time, and a leftover that is not
    h3bridge's own scratch (`own_leftover`) are ignored with a warning. True if an engine was stopped."""
    loaded = read_engine_record(record_path)
    stopped = False
    if loaded is not None:
        owner, record = loaded
        if owner != account_uid():
            _log.warning("h3bridge: ignoring the engine record %s: it belongs to %s, not to this user",
                         record_path, _user_name(owner))
            return False
        if recorded_process(record, owner) is not None:
            _log.warning("h3bridge: stopping engine process %d, left running by a program that exited "
                         "while it held the engine", record.pid)
            terminate_group(record.pid)
            stopped = True
        trusted = []
        for entry in record.leftovers:
            if own_leftover(entry):
                trusted.append(entry)
            elif os.path.lexists(entry.rstrip(os.sep) or entry) or glob.has_magic(os.path.basename(entry)):
                _log.warning("h3bridge: not removing %s named in the engine record %s: it is not one of "
                             "h3bridge's own temporary files", entry, record_path)
        remove_leftovers(trusted)
        if record.session_dirs_before is not None:
            remove_leftovers(_unannounced_session_dir(record))
    _remove_own_record(record_path)
    return stopped


def _unannounced_session_dir(record: EngineRecord) -> list[str]:
    """What to remove of a dead interactive h3's session folder when it died before anyone heard
    where it was (a host SIGKILLed with its engine, between h3's mkdtemp and `Outputs: DIR`)."""
    folder = new_session_dir(record.session_dirs_before or (), made_after=record.started - 1.0)
    return session_dir_leftovers(folder) if folder is not None else []


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
