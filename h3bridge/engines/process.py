"""Supervision of an engine child process and everything it spawns.

One reusable piece for the one-shot engine and the long-lived session: the child
runs in its own session/process group (so Ctrl-C in the terminal does not reach it
and FFmpeg grandchildren die with it), arguments are a list (never a shell), stderr
is read by a background thread and handed over as text pieces split on `\\r` and
`\\n` (h3 redraws progress with `\\r`), and stopping is SIGTERM to the whole group,
then SIGKILL after a short grace period.
"""
from __future__ import annotations

import atexit
import codecs
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping, Sequence

from .groups import (TERMINATE_GRACE_SECONDS, group_alive, live_group_members, signal_group,  # noqa: F401
                     signal_name, terminate_group)      # (engines and tests import them from here too)
from .priority import lower_to_background

# SIGTERM first so h3/FFmpeg can exit on their own; SIGKILL after this many seconds.
# Kept short so a cancel always completes well within a second.


@dataclass(frozen=True)
class StderrPiece:
    """A piece of the child's stderr between `\\r`/`\\n` delimiters.

    `complete` is False for the unterminated tail of the latest read (h3 leaves its
    progress line unterminated until the next redraw); the same text may arrive again
    later as a complete piece.
    """

    text: str
    complete: bool


# Every EngineProcess (one-shot or warm session) from its start until it is stopped: a host that
# goes away (a SIGTERM'd ComfyUI, interpreter exit) stops their groups, which live in their own
# sessions and would otherwise keep the model in memory. Reentrant: a signal handler runs on the
# main thread, possibly while that thread is inside a registry update.
_live_engines: "set[EngineProcess]" = set()
_live_engines_lock = threading.RLock()


def stop_live_engines(grace: float = TERMINATE_GRACE_SECONDS) -> None:
    """Stop the process group of every engine this process started and has not stopped yet
    (one-shot and warm-session alike): SIGTERM, SIGKILL after `grace`. Safe from a signal handler
    (it does not reap: the thread running the job does) and at interpreter exit."""
    with _live_engines_lock:
        engines = list(_live_engines)
        _live_engines.clear()
    for engine in engines:
        terminate_group(engine.pgid, grace)


# After the sessions' graceful close (session.py registers later, so runs first): whatever is left.
atexit.register(stop_live_engines)


class EngineProcess:
    """A child process in its own process group, with its stderr streamed to `pieces`."""

    def __init__(self, argv: Sequence[str], *, cwd: Path | str | None = None,
                 env: Mapping[str, str] | None = None, stdin: int | IO[bytes] | None = subprocess.DEVNULL,
                 stdout: int | IO[bytes] | None = subprocess.DEVNULL, background: bool = False) -> None:
        """`background`: lowered to background priority right after the spawn (priority.py), so what
        it spawns (FFmpeg) inherits it."""
        self.argv = [str(a) for a in argv]
        self.pieces: queue.Queue[StderrPiece | None] = queue.Queue()   # None marks stderr EOF
        self._chunks: list[str] = []
        self._chunks_lock = threading.Lock()
        self._stderr_closed = threading.Event()
        self.popen = subprocess.Popen(
            self.argv, cwd=None if cwd is None else str(cwd), env=None if env is None else dict(env),
            stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        # start_new_session makes the child a session and group leader: pgid == pid.
        self.pgid = self.popen.pid
        if background:
            lower_to_background(self.pid)
        with _live_engines_lock:
            _live_engines.add(self)
        self.started = time.monotonic()
        self._reader = threading.Thread(target=self._read_stderr, name=f"h3-stderr-{self.pid}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stderr_text(self) -> str:
        """Everything the child wrote to stderr so far."""
        with self._chunks_lock:
            return "".join(self._chunks)

    def poll(self) -> int | None:
        return self.popen.poll()

    def group_alive(self) -> bool:
        """True while any process of the child's group still runs (zombies do not count)."""
        return group_alive(self.pgid)

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        fd = self.popen.stderr.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        try:
            while True:
                data = os.read(fd, 65536)
                text = decoder.decode(data, final=not data)
                if text:
                    with self._chunks_lock:
                        self._chunks.append(text)
                    pending += text
                    start = 0
                    for index, char in enumerate(pending):
                        if char in "\r\n":
                            if index > start:
                                self.pieces.put(StderrPiece(pending[start:index], True))
                            start = index + 1
                    pending = pending[start:]
                    if pending and data:
                        self.pieces.put(StderrPiece(pending, False))
                if not data:
                    break
            if pending:
                self.pieces.put(StderrPiece(pending, True))
        except OSError:
            pass
        finally:
            self._stderr_closed.set()
            self.pieces.put(None)

    def next_piece(self, timeout: float) -> StderrPiece | None:
        """The next stderr piece, or None after `timeout` seconds / at EOF.

        Once stderr is closed, waits on the process instead, so a caller polling for
        the exit notices it at once rather than a poll interval later.
        """
        try:
            return self.pieces.get_nowait()
        except queue.Empty:
            pass
        if self._stderr_closed.is_set():
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            return None
        try:
            return self.pieces.get(timeout=timeout)
        except queue.Empty:
            return None

    def wait_reader(self, timeout: float = 2.0) -> None:
        """Wait until stderr hit EOF (all group members closed it)."""
        self._reader.join(timeout)

    def signal_group(self, signum: int) -> None:
        signal_group(self.pgid, signum)

    def stop(self, grace: float = TERMINATE_GRACE_SECONDS) -> int | None:
        """Terminate the whole group: SIGTERM, then SIGKILL after `grace` seconds; reap the child.

        Idempotent; also sweeps up grandchildren (FFmpeg) when the leader already exited.
        Returns the child's exit status.
        """
        if self.popen.poll() is None or self.group_alive():
            terminate_group(self.pgid, grace)
        try:
            status = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            status = None
        with _live_engines_lock:
            _live_engines.discard(self)
        self.wait_reader(1.0)
        if self.popen.stderr is not None and not self._reader.is_alive():
            self.popen.stderr.close()
        return status

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EngineChild:
    """Base of a warm engine's child (the session's h3, the library's worker): one EngineProcess
    in `engine`, its pid, and whether it still runs (what WarmEngine asks of `_child()`)."""

    engine: EngineProcess

    @property
    def pid(self) -> int:
        return self.engine.pid

    def alive(self) -> bool:
        return self.engine.poll() is None

    # How long `quit` lets the child exit on its own before its group is stopped.
    quit_grace: float = 2.0

    def quit(self) -> None:
        """Say goodbye, close its stdin (its cue to free everything and exit); stop the group if
        it lingers."""
        try:
            self._say_goodbye()
            stdin = self.engine.popen.stdin
            if stdin is not None:
                stdin.close()
            self.engine.popen.wait(timeout=self.quit_grace)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def _say_goodbye(self) -> None:
        """What the child is told before its stdin closes: nothing, unless a subclass says so."""

    def kill(self) -> None:
        """Stop the whole process group and close our ends of its streams."""
        raise NotImplementedError


