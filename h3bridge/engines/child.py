"""One child job: the one place that knows how to wait cancellably with a deadline, how to watch
an engine child for a stall, how to pause its process group, and what a child that died means.

Every engine waits on something: the one-shot engine on h3's stderr and exit, the warm session on
its event queue, the library engine on its worker's messages, and all of them on the machine-wide
lock (lock.py) and on their own previous job (warm.py). Each of those waits is `wait_until`: one
loop that looks at the cancel token, asks `poll` for what it waits on (blocking at most a poll
interval), and gives up when a `Deadline` passes. A deadline runs on a `JobClock`, which stands
still while the job is paused (`PauseControl`), so a stall watchdog or a load timeout never fires
during a pause.

`ChildJob` is one job on an engine child (h3, the interactive h3, the library worker):
- its process group is stopped (SIGSTOP) while the caller's `PauseControl` is paused and continued
  (SIGCONT) on resume, at any phase (loading, encoding, denoising, FFmpeg): nothing else changes,
  memory stays resident, and the clip is the one an unpaused run makes;
- the caller hears a `ProgressEvent` with phase `PAUSED_PHASE` when the pause takes effect, and the
  last real event again on resume, from the thread running the job (the `Engine` contract);
- its stall watchdog restarts on every sign of life and counts only unpaused seconds;
- a cancel continues the group first (a stopped process cannot act on SIGTERM or answer a cancel)
  and the group is always continued when the job lets go of it (a warm child must not stay stopped).
`child_gone` turns the exit of a child that should still run into one typed error for every engine.
"""
from __future__ import annotations

import signal
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from ..cancel import CancelToken, PauseControl
from ..errors import EngineCrashedError
from ..progress import PAUSED_PHASE, ProgressCallback, ProgressEvent
from .groups import signal_group, signal_name

from .waiting import NOTHING, POLL_SECONDS, Deadline, JobClock, Nothing, T, wait_until  # noqa: F401 (engines import them from here)


class ChildJob:
    """One job on an engine child's process group (see the module docstring).

    The engine calls `attach(pgid)` once the child runs (again for a child started mid-job),
    `progressed(event)` for every ProgressEvent it reports and `alive()` for any other sign of
    life, waits with `wait`, and leaves through `detach()` (or the `attached` context manager)."""

    def __init__(self, *, cancel: CancelToken | None, pause: PauseControl | None,
                 stall_timeout: float | None | Callable[[], float | None], on_progress: ProgressCallback | None) -> None:
        self.cancel = cancel
        self.pause = pause
        self.clock = JobClock(pause)
        self.started = self.clock.now()
        self.stall = Deadline(stall_timeout, self.clock)
        self.on_progress = on_progress
        self.last_event: ProgressEvent | None = None
        self._pgid: int | None = None
        self._stopped = False
        self._group_lock = threading.Lock()
        self._remove_listener: Callable[[], None] | None = None
        self._reported_paused = False

    @property
    def stall_timeout(self) -> float | None:
        return self.stall.seconds

    # ------------------------------------------------------------------ the process group

    def attach(self, pgid: int) -> None:
        """Pause and resume the group `pgid` with the job's PauseControl from now on."""
        with self._group_lock:
            if self._pgid == pgid:
                return
        self.detach()
        with self._group_lock:
            self._pgid = pgid
        if self.pause is not None:
            self._remove_listener = self.pause.on_change(self._pause_changed)

    def detach(self) -> None:
        """Stop following the PauseControl and continue the group if the job stopped it."""
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        self._continue_group()
        with self._group_lock:
            self._pgid = None

    @contextmanager
    def attached(self, pgid: int) -> Iterator["ChildJob"]:
        self.attach(pgid)
        try:
            yield self
        finally:
            self.detach()

    def _pause_changed(self, paused: bool) -> None:
        # PauseControl's listener, on the thread that paused or resumed.
        with self._group_lock:
            if self._pgid is None:
                return
            if paused and not self._stopped:
                signal_group(self._pgid, signal.SIGSTOP)
                self._stopped = True
            elif not paused and self._stopped:
                signal_group(self._pgid, signal.SIGCONT)
                self._stopped = False

    def _continue_group(self) -> None:
        with self._group_lock:
            if self._pgid is not None and self._stopped:
                signal_group(self._pgid, signal.SIGCONT)
            self._stopped = False

    def let_go(self) -> None:
        """Before the job's own cancel or kill: continue the group and stop following the pause,
        so a stopped child can act on SIGTERM or answer a cancel."""
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        self._continue_group()

    # ------------------------------------------------------------------ progress and stalls

    def now(self) -> float:
        """The job's clock (paused time left out): what progress trackers and timings use."""
        return self.clock.now()

    def alive(self) -> None:
        """The child showed a sign of life: the stall watchdog starts again."""
        self.stall.restart()

    def progressed(self, event: ProgressEvent | None) -> None:
        """The child reported `event` (already passed to on_progress by the engine)."""
        self.stall.restart()
        if event is not None:
            self.last_event = event

    def report_pause(self) -> None:
        """From the job's thread: tell the caller when the pause took effect or ended."""
        paused = self.pause is not None and self.pause.paused and self._pgid is not None
        if paused == self._reported_paused:
            return
        self._reported_paused = paused
        if self.on_progress is None:
            return
        last = self.last_event
        elapsed = self.clock.now() - self.started
        if paused:
            self.on_progress(ProgressEvent(
                phase=PAUSED_PHASE, done=last.done if last else 0, total=last.total if last else 0,
                fraction=last.fraction if last else 0.0, elapsed=elapsed, eta=None,
                detail=f"paused during {last.phase}" if last else "paused before the first progress report"))
        elif last is not None:
            self.on_progress(replace(last, elapsed=elapsed))

    # ------------------------------------------------------------------ waiting

    def wait(self, poll: Callable[[float], "T | Nothing"], *, on_cancel: Callable[[], BaseException],
             on_stall: Callable[[], BaseException], interval: float = POLL_SECONDS) -> T:
        """`wait_until` for this job: its cancel token (the group is continued first), its stall
        watchdog (paused time left out), and the paused/resumed events."""
        def cancelled() -> BaseException:
            self.let_go()
            return on_cancel()

        def stalled() -> T:
            self.let_go()
            raise on_stall()

        def polled(timeout: float) -> "T | Nothing":
            self.report_pause()
            return poll(timeout)

        return wait_until(polled, cancel=self.cancel, on_cancel=cancelled, deadline=self.stall,
                          on_expired=stalled, on_idle=self.report_pause, interval=interval)

    def stall_words(self) -> str:
        return f"{self.stall.seconds:g} s"


@dataclass(frozen=True)
class ChildExit:
    """How a child that should still run ended: its exit status (negative: the signal), None when
    it could not be reaped in time."""

    status: int | None

    @property
    def signal(self) -> int | None:
        """The signal that ended it, or None."""
        return -self.status if self.status is not None and self.status < 0 else None


def reap(popen: subprocess.Popen, timeout: float = 5.0) -> ChildExit:
    try:
        return ChildExit(popen.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        return ChildExit(None)


def child_gone(what: str, ended: ChildExit, *, where: str, engine_message: str | None, stderr: str,
               command: Sequence[str], hint: str | None) -> EngineCrashedError:
    """The one error for an engine child (h3, the interactive h3, the library worker) that died
    while it had a job: EngineCrashedError, naming the signal or the exit status, where it was,
    and the engine's last words."""
    status = ended.status
    if status is not None and status < 0:
        text = f"{what} died from {signal_name(-status)} {where}" + (
            f", after h3 said: {engine_message}" if engine_message else "")
    else:
        text = f"{what} exited unexpectedly (status {status}) {where}" + (
            f": {engine_message}" if engine_message else "")
    return EngineCrashedError(text, engine_message=engine_message, exit_code=status, stderr=stderr,
                              command=command, hint=hint)


__all__ = ["NOTHING", "Nothing", "POLL_SECONDS", "ChildExit", "ChildJob", "Deadline", "JobClock", "child_gone", "reap",
           "wait_until"]
