"""Cancellation that any thread (a Ctrl-C handler, ComfyUI's interrupt poll) can trigger."""
from __future__ import annotations

import threading
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
