"""Cancelling and pausing a job from any thread (a Ctrl-C handler, ComfyUI's interrupt poll, an HTTP call)."""
from __future__ import annotations

import threading
import time
from typing import Callable


class CancelToken:
    """Set once; engines poll `cancelled` or wait on it, and may also poll `check`.

    `check` lets a host plug in its own cancel signal (ComfyUI's
    `throw_exception_if_processing_interrupted`), evaluated from the engine's
    supervising thread.
    """

    def __init__(self, check: Callable[[], bool] | None = None) -> None:
        self._event = threading.Event()
        self._check = check

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        if not self._event.is_set() and self._check is not None and self._check():
            self._event.set()
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds; True as soon as cancelled."""
        return self._event.wait(timeout) or self.cancelled


class PauseControl:
    """Pause and resume a running job from any thread (Ctrl-Z, `POST .../pause`, a ComfyUI button).

    It sits beside a `CancelToken`: the caller keeps it and calls `pause()` / `resume()`; the
    engine running the job registers a listener (`on_change`) that stops or continues the engine's
    process group, so memory stays resident and nothing else changes. Paused time is measured
    here once (`paused_seconds`, `active_seconds`) so that stall watchdogs, timeouts, the ETA and
    the job history can all leave it out the same way.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resumed = threading.Event()
        self._resumed.set()
        self._paused_since: float | None = None
        self._paused_total = 0.0
        self._listeners: list[Callable[[bool], None]] = []

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def pause(self) -> bool:
        """Pause; False if already paused. Listeners hear `True` before this returns."""
        with self._lock:
            if self._paused_since is not None:
                return False
            self._paused_since = time.monotonic()
            self._resumed.clear()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(True)
        return True

    def resume(self) -> bool:
        """Resume; False if not paused. Listeners hear `False` before this returns."""
        with self._lock:
            if self._paused_since is None:
                return False
            self._paused_total += time.monotonic() - self._paused_since
            self._paused_since = None
            listeners = list(self._listeners)
        for listener in listeners:
            listener(False)
        self._resumed.set()
        return True

    def on_change(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Call `listener(paused)` on every pause and resume (and at once if paused now); returns
        a function that removes it. The engine registers while its job runs."""
        with self._lock:
            self._listeners.append(listener)
            paused_now = self._paused_since is not None
        if paused_now:
            listener(True)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return remove

    def paused_seconds(self) -> float:
        """Seconds spent paused so far (the current pause included)."""
        with self._lock:
            current = 0.0 if self._paused_since is None else time.monotonic() - self._paused_since
            return self._paused_total + current

    def active_seconds(self, since: float) -> float:
        """Seconds since the monotonic time `since` that were not paused. Only exact when `since`
        is not earlier than this control's first pause that matters, which holds for a control
        made per job."""
        return max(0.0, time.monotonic() - since - self.paused_seconds())

    def wait_until_resumed(self, timeout: float | None = None) -> bool:
        """Block while paused (up to `timeout`); True once running."""
        return self._resumed.wait(timeout)
