"""The one wait loop of every engine (`wait_until`) and what it is made of: the NOTHING a poll
returns while it waits, a clock that stands still while a job is paused (`JobClock`) and a
`Deadline` on it. Below every engine module (child.py, groups.py, the engines, the lock): it
imports nothing of engines/.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from ..cancel import CancelToken, PauseControl

# How often a wait looks at the cancel token, the pause and its deadline.
POLL_SECONDS = 0.05

T = TypeVar("T")


class Nothing:
    """What `poll` returns when what it waits for has not come yet."""

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING = Nothing()


class JobClock:
    """Monotonic seconds that stand still while `pause` is paused (plain monotonic without one)."""

    def __init__(self, pause: PauseControl | None = None) -> None:
        self.pause = pause

    def now(self) -> float:
        paused = self.pause.paused_seconds() if self.pause is not None else 0.0
        return time.monotonic() - paused


class Deadline:
    """`seconds` on a JobClock from now (None: never), restartable (a stall watchdog restarts on
    every sign of life). `seconds` may be a function, read at each check (an engine's
    `stall_timeout` may be changed while a job runs)."""

    def __init__(self, seconds: float | None | Callable[[], float | None], clock: JobClock | None = None) -> None:
        self._seconds = seconds
        self.clock = clock if clock is not None else JobClock()
        self.started = self.clock.now()

    def restart(self) -> None:
        self.started = self.clock.now()

    @property
    def seconds(self) -> float | None:
        return self._seconds() if callable(self._seconds) else self._seconds

    def expired(self) -> bool:
        seconds = self.seconds
        return seconds is not None and self.clock.now() - self.started > seconds


def wait_until(poll: Callable[[float], "T | Nothing"], *, cancel: CancelToken | None = None,
               on_cancel: Callable[[], BaseException] | None = None, deadline: Deadline | None = None,
               on_expired: Callable[[], T] | None = None, on_idle: Callable[[], None] | None = None,
               interval: float = POLL_SECONDS) -> T:
    """The one wait loop: until `poll(timeout)` (which may block up to `timeout` seconds) returns
    something other than NOTHING, and return that. Before each poll a cancel raises
    `on_cancel()`; after a poll that brought nothing `on_idle()` runs, then a passed `deadline`
    returns `on_expired()` (which usually raises). The cancel is looked at only before a poll, so
    something taken by `poll` (the lock) is always handed back to the caller."""
    while True:
        if cancel is not None and cancel.cancelled:
            assert on_cancel is not None, "a cancellable wait says what a cancel raises"
            raise on_cancel()
        value = poll(interval)
        if not isinstance(value, Nothing):
            return value
        if on_idle is not None:
            on_idle()
        if deadline is not None and deadline.expired():
            assert on_expired is not None, "a wait with a deadline says what happens when it passes"
            return on_expired()


__all__ = ["NOTHING", "POLL_SECONDS", "Deadline", "JobClock", "Nothing", "wait_until"]
