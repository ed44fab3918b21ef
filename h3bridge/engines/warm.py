"""The lifecycle every warm engine shares: the model stays loaded between jobs, so the engine holds
the machine-wide engine lock (lock.py) for as long as its child lives, and gives it back

* after `idle_timeout` seconds without a job (a background timer; memory goes back),
* when another job needs the engine (a one-shot run, another warm engine, in this process or
  another): at once when idle, right after its current job when busy. In this process the lock's
  yield hook makes that immediate, which keeps a process from deadlocking on its own warm engine;
  a waiter in another process is noticed within IDLE_POLL seconds through the lock's "wanted"
  marker. (Two hosts that both keep warm engines therefore take turns, each reloading the model.)
* on `close()`, and when the host exits (atexit): a job still running in another thread (a
  ComfyUI worker) is not waited for; its engine is stopped so the host can exit and no orphan
  keeps the model in memory.

A subclass runs the child and says how to stop it (`_stop_engine`, `_kill_engine_now`); jobs run
one at a time under `_job()`, and the lock is taken with `_take_engine_lock()` when the child
starts. The warm CLI session (session.py) and, later, the library worker are such engines.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..cancel import CancelToken
from ..errors import GenerationCancelled
from ..progress import ProgressCallback
from .lock import EngineLock, has_in_process_waiters, register_yield_hook, unregister_yield_hook
from .holder import waiting_reporter
from .child import NOTHING, Nothing, wait_until

DEFAULT_IDLE_TIMEOUT = 300.0
# How often an idle engine checks its idle timeout and for waiters in other processes.
IDLE_POLL = 0.5
# At host exit: how long to wait for a job running in another thread before stopping its engine.
EXIT_JOB_WAIT = 0.5

_live_warm_engines: "weakref.WeakSet[WarmEngine]" = weakref.WeakSet()


@atexit.register
def _close_live_warm_engines() -> None:
    for engine in list(_live_warm_engines):
        engine._close_at_exit()


class WarmEngine:
    """Base class of engines that keep the model loaded between jobs (see the module docstring)."""

    #: the idle timer thread's name, for debugging a host's threads
    idle_thread_name = "h3-warm-idle"

    def __init__(self, *, idle_timeout: float = DEFAULT_IDLE_TIMEOUT, lock_path: Path | None = None,
                 background: bool = False) -> None:
        self.idle_timeout = idle_timeout
        self._background = background
        self._lock = EngineLock(lock_path)
        self._guard = threading.Lock()          # one job (or start/stop) at a time
        self._hook_id: int | None = None
        self._idle_timer: threading.Timer | None = None
        self._last_used = time.monotonic()
        _live_warm_engines.add(self)

    @property
    def lock_path(self) -> Path:
        """The engine lock this engine takes (its one-shot fallback takes the same one)."""
        return self._lock.path

    # ------------------------------------------------------------------ for subclasses

    def _child(self) -> Any:
        """The warm child (the session's h3, the library's worker: anything with `pid` and
        `alive()`), or None when there is none."""
        raise NotImplementedError

    def _engine_running(self) -> bool:
        """True while the warm child exists (alive or not yet stopped)."""
        return self._child() is not None

    @property
    def pid(self) -> int | None:
        """The running child's pid (it leads its own process group), or None."""
        child = self._child()
        return child.pid if child is not None and child.alive() else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def background(self) -> bool:
        """Whether the child runs at background priority (engines/priority.py)."""
        return self._background

    @background.setter
    def background(self, on: bool) -> None:
        """Children started from now on run at background priority (`on`) or at normal priority;
        turning it on lowers the running child too (a warm engine started at normal priority). A
        lowered child stays so until it is restarted (a priority cannot be raised back)."""
        self._background = bool(on)
        pid = self.pid
        if on and pid is not None:
            from .priority import lower_group
            lower_group(pid)

    def _stop_engine(self, *, graceful: bool) -> None:
        """Stop the child (politely if `graceful` and it still answers) and forget its state.
        Called with the guard held (or by the owner), before the lock is given back."""
        raise NotImplementedError

    def _kill_engine_now(self) -> None:
        """At host exit, while a job still runs in another thread: stop the child at once (that
        job then sees it end and raises) and remove its temporary files."""
        raise NotImplementedError

    # ------------------------------------------------------------------ public surface

    def __enter__(self) -> "WarmEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the child (gracefully), release the engine lock. The engine stays usable."""
        self._shutdown_when_free(wait=None)

    # ------------------------------------------------------------------ jobs

    @contextmanager
    def _job(self, *, on_progress: ProgressCallback | None, cancel: CancelToken | None) -> Iterator[None]:
        """One job: wait (reported, cancellable) for this engine's previous job, keep the idle timer
        off while it runs, and afterwards step aside if someone waits for the engine, else re-arm
        the idle timer."""
        self._acquire_guard(on_progress, cancel)
        try:
            self._cancel_idle_timer()
            try:
                yield
            finally:
                self._last_used = time.monotonic()
                if self._engine_running() and (has_in_process_waiters() or self._lock.others_waiting()):
                    self._shutdown(graceful=True)
                self._arm_idle_timer()
        finally:
            self._guard.release()

    def _acquire_guard(self, on_progress: ProgressCallback | None, cancel: CancelToken | None) -> None:
        """Wait for this engine's previous job (another thread's) to end: reported as
        WAITING_PHASE and cancellable, like waiting for the machine-wide lock."""
        report = waiting_reporter(on_progress, self._lock.path)
        started = time.monotonic()

        def poll(timeout: float) -> bool | Nothing:
            return True if self._guard.acquire(timeout=timeout) else NOTHING

        wait_until(poll, cancel=cancel, on_cancel=lambda: GenerationCancelled("cancelled while waiting for the engine"),
                   on_idle=None if report is None else lambda: report(time.monotonic() - started), interval=0.1)

    def _take_engine_lock(self, *, on_progress: ProgressCallback | None, cancel: CancelToken | None) -> None:
        """Before the child starts: the machine-wide lock (waiting reported and cancellable), and
        the yield hook that lets another job in this process ask an idle engine to step aside."""
        self._lock.acquire(cancel=cancel, on_wait=waiting_reporter(on_progress, self._lock.path))
        self._hook_id = register_yield_hook(self._yield_if_idle)

    def _shutdown(self, *, graceful: bool) -> None:
        """Stop the child (if any) and give the engine lock back. Caller holds the guard or owns the engine."""
        if self._hook_id is not None:
            unregister_yield_hook(self._hook_id)
            self._hook_id = None
        running = self._engine_running()
        self._stop_engine(graceful=graceful)
        if running:
            self._lock.clear_engine()
        self._lock.release()

    def _shutdown_when_free(self, *, wait: float | None) -> bool:
        """Once no job runs (waiting for a running one at most `wait` seconds; None: as long as
        it takes), stop the child gracefully and release the lock. False if a job still runs."""
        if not self._guard.acquire(timeout=-1 if wait is None else wait):
            return False
        try:
            self._cancel_idle_timer()
            self._shutdown(graceful=True)
        finally:
            self._guard.release()
        return True

    def _close_at_exit(self) -> None:
        """atexit: like close(), but never waits long for a job running in another thread; its
        engine is killed instead. The kernel frees the engine lock with us."""
        if not self._shutdown_when_free(wait=EXIT_JOB_WAIT):
            self._kill_engine_now()

    # ------------------------------------------------------------------ idle and stepping aside

    def _yield_if_idle(self) -> None:
        """Lock yield hook: another job in this process waits for the engine."""
        self._shutdown_when_free(wait=0)
        # Busy: the job sees has_in_process_waiters() when it ends (_job) and steps aside then.

    def _arm_idle_timer(self) -> None:
        """While idle, check every IDLE_POLL seconds: idle timeout reached, or someone in another
        process waiting for the engine (lock.py `others_waiting`) -> shut down."""
        self._cancel_idle_timer()
        if not self._engine_running():
            return
        timer = threading.Timer(min(self.idle_timeout, IDLE_POLL), self._idle_tick)
        timer.daemon = True
        timer.name = self.idle_thread_name
        self._idle_timer = timer
        timer.start()

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_tick(self) -> None:
        if not self._guard.acquire(blocking=False):
            return          # a job is running (or starting); it re-arms the timer when it ends
        try:
            if not self._engine_running():
                return
            idle_for = time.monotonic() - self._last_used
            if idle_for >= self.idle_timeout * 0.99 or self._lock.others_waiting():
                self._shutdown(graceful=True)
            else:
                self._arm_idle_timer()
        finally:
            self._guard.release()


__all__ = ["WarmEngine", "DEFAULT_IDLE_TIMEOUT", "IDLE_POLL", "EXIT_JOB_WAIT"]
